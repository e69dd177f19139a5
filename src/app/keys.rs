//! Key bindings as data: the default table lives here, a TOML file may override any action's
//! key, duplicates are rejected on load, and the help overlay is generated from the table.

use std::collections::HashMap;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use serde::Deserialize;

macro_rules! actions {
    ($($var:ident, $name:literal, $key:literal, $help:literal;)+) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Action { $($var),+ }
        impl Action {
            pub const ALL: &'static [Action] = &[$(Action::$var),+];
            /// The name used in key files.
            pub fn name(self) -> &'static str { match self { $(Action::$var => $name),+ } }
            pub fn help(self) -> &'static str { match self { $(Action::$var => $help),+ } }
            fn default_key(self) -> &'static str { match self { $(Action::$var => $key),+ } }
        }
    };
}

actions! {
    TogglePrecision, "toggle_precision", "p", "precision fp32 / bf16 autocast";
    CtxHalve, "ctx_halve", "[", "halve context length";
    CtxDouble, "ctx_double", "]", "double context length";
    BatchDown, "batch_down", "{", "batch size - 1";
    BatchUp, "batch_up", "}", "batch size + 1";
    ToggleMode, "toggle_mode", "m", "forward-only / full step";
    ToggleAttention, "toggle_attention", "a", "attention naive / fused";
    Snapshot, "snapshot", "s", "save a memory_viz snapshot";
    TogglePause, "toggle_pause", "space", "pause / resume training";
    StepOnce, "step_once", ".", "one step while paused";
    FreezeView, "freeze_view", "f", "freeze the view (keeps ingesting)";
    PanLeft, "pan_left", "left", "pan back in time";
    PanRight, "pan_right", "right", "pan forward in time";
    ZoomIn, "zoom_in", "+", "zoom in";
    ZoomOut, "zoom_out", "-", "zoom out";
    ToggleBands, "toggle_bands", "c", "bands by category / by allocation";
    FocusTable, "focus_table", "tab", "focus the allocations table";
    SelectUp, "select_up", "up", "table: previous row";
    SelectDown, "select_down", "down", "table: next row";
    NextTheme, "next_theme", "t", "next theme";
    ToggleRecord, "toggle_record", "r", "start / stop recording the session";
    SpeedUp, "speed_up", ">", "replay: twice as fast";
    SpeedDown, "speed_down", "<", "replay: half as fast";
    NextStep, "next_step", "n", "replay: seek to the end of the next step";
    PrevStep, "prev_step", "N", "replay: seek to the end of the previous step";
    Help, "help", "?", "this help";
    Quit, "quit", "q", "quit";
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum KeyError {
    #[error("key file: {0}")]
    Toml(String),
    #[error("key file: unknown action '{0}' (allowed: {1})")]
    UnknownAction(String, String),
    #[error("key file: '{key}' cannot be parsed as a key for {action} (use a character, or one of: space, tab, enter, esc, left, right, up, down, backspace, f1..f12)")]
    BadKey { action: String, key: String },
    #[error("key file: '{key}' is bound to both {first} and {second}")]
    Duplicate { key: String, first: String, second: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub code: KeyCode,
    pub ctrl: bool,
}

impl Key {
    pub fn parse(s: &str) -> Option<Key> {
        let (ctrl, rest) = match s.strip_prefix("ctrl-").or_else(|| s.strip_prefix("ctrl+")) {
            Some(r) => (true, r),
            None => (false, s),
        };
        let code = match rest.to_ascii_lowercase().as_str() {
            "space" => KeyCode::Char(' '),
            "tab" => KeyCode::Tab,
            "enter" => KeyCode::Enter,
            "esc" => KeyCode::Esc,
            "left" => KeyCode::Left,
            "right" => KeyCode::Right,
            "up" => KeyCode::Up,
            "down" => KeyCode::Down,
            "backspace" => KeyCode::Backspace,
            f if f.len() > 1 && f.starts_with('f') && f[1..].parse::<u8>().is_ok_and(|n| (1..=12).contains(&n)) => {
                KeyCode::F(f[1..].parse().ok()?)
            }
            _ => {
                let mut chars = rest.chars();
                let c = chars.next()?;
                if chars.next().is_some() {
                    return None;
                }
                KeyCode::Char(c)
            }
        };
        Some(Key { code, ctrl })
    }

    pub fn from_event(e: &KeyEvent) -> Key {
        let code = match e.code {
            // Terminals differ on whether shifted characters carry SHIFT; the character is enough.
            KeyCode::Char(c) => KeyCode::Char(c),
            other => other,
        };
        Key { code, ctrl: e.modifiers.contains(KeyModifiers::CONTROL) }
    }

    pub fn label(&self) -> String {
        let base = match self.code {
            KeyCode::Char(' ') => "space".to_string(),
            KeyCode::Char(c) => c.to_string(),
            KeyCode::Tab => "tab".into(),
            KeyCode::Enter => "enter".into(),
            KeyCode::Esc => "esc".into(),
            KeyCode::Left => "←".into(),
            KeyCode::Right => "→".into(),
            KeyCode::Up => "↑".into(),
            KeyCode::Down => "↓".into(),
            KeyCode::Backspace => "backspace".into(),
            KeyCode::F(n) => format!("f{n}"),
            other => format!("{other:?}"),
        };
        if self.ctrl {
            format!("ctrl-{base}")
        } else {
            base
        }
    }
}

#[derive(Clone, Debug)]
pub struct KeyMap {
    by_key: HashMap<Key, Action>,
    by_action: Vec<(Action, Key)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    #[serde(default)]
    keys: HashMap<String, String>,
}

impl Default for KeyMap {
    fn default() -> Self {
        let pairs = Action::ALL
            .iter()
            .map(|a| (*a, Key::parse(a.default_key()).expect("default keys parse")))
            .collect();
        KeyMap::build(pairs).expect("default keys are unique")
    }
}

impl KeyMap {
    fn build(by_action: Vec<(Action, Key)>) -> Result<KeyMap, KeyError> {
        let mut by_key: HashMap<Key, Action> = HashMap::new();
        for (a, k) in &by_action {
            if let Some(prev) = by_key.insert(*k, *a) {
                return Err(KeyError::Duplicate {
                    key: k.label(),
                    first: prev.name().into(),
                    second: a.name().into(),
                });
            }
        }
        Ok(KeyMap { by_key, by_action })
    }

    /// Defaults overridden by a TOML file's `[keys]` table (`toggle_precision = "P"`).
    pub fn from_toml(text: &str) -> Result<KeyMap, KeyError> {
        let file: KeyFile = toml::from_str(text).map_err(|e| KeyError::Toml(e.message().to_string()))?;
        let mut pairs: Vec<(Action, Key)> = KeyMap::default().by_action;
        let mut overrides: Vec<_> = file.keys.into_iter().collect();
        overrides.sort();
        for (name, key) in overrides {
            let action = Action::ALL.iter().find(|a| a.name() == name).ok_or_else(|| {
                KeyError::UnknownAction(name.clone(), Action::ALL.iter().map(|a| a.name()).collect::<Vec<_>>().join(", "))
            })?;
            let k = Key::parse(&key).ok_or(KeyError::BadKey { action: name.clone(), key })?;
            for p in pairs.iter_mut().filter(|p| p.0 == *action) {
                p.1 = k;
            }
        }
        KeyMap::build(pairs)
    }

    pub fn action(&self, e: &KeyEvent) -> Option<Action> {
        let k = Key::from_event(e);
        // ctrl-c always quits, whatever the table says: the way out must never be rebound away.
        if k.ctrl && k.code == KeyCode::Char('c') {
            return Some(Action::Quit);
        }
        self.by_key.get(&k).copied()
    }

    pub fn key_of(&self, a: Action) -> Key {
        self.by_action.iter().find(|p| p.0 == a).map(|p| p.1).expect("every action has a key")
    }

    /// (key label, description) for the help overlay, in table order.
    pub fn help_rows(&self) -> Vec<(String, &'static str)> {
        self.by_action.iter().map(|(a, k)| (k.label(), a.help())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn press(c: KeyCode) -> KeyEvent {
        KeyEvent::new(c, KeyModifiers::NONE)
    }

    #[test]
    fn defaults_cover_every_action_from_the_issue() {
        let k = KeyMap::default();
        assert_eq!(k.action(&press(KeyCode::Char('p'))), Some(Action::TogglePrecision));
        assert_eq!(k.action(&press(KeyCode::Char(']'))), Some(Action::CtxDouble));
        assert_eq!(k.action(&press(KeyCode::Char(' '))), Some(Action::TogglePause));
        assert_eq!(k.action(&press(KeyCode::Tab)), Some(Action::FocusTable));
        assert_eq!(k.action(&KeyEvent::new(KeyCode::Char('}'), KeyModifiers::SHIFT)), Some(Action::BatchUp));
        assert_eq!(k.help_rows().len(), Action::ALL.len());
    }

    #[test]
    fn a_file_overrides_and_duplicates_are_rejected() {
        let k = KeyMap::from_toml("[keys]\ntoggle_precision = \"P\"\n").unwrap();
        assert_eq!(k.action(&press(KeyCode::Char('P'))), Some(Action::TogglePrecision));
        assert_eq!(k.action(&press(KeyCode::Char('p'))), None);
        let e = KeyMap::from_toml("[keys]\nsnapshot = \"q\"\n").unwrap_err();
        assert!(matches!(e, KeyError::Duplicate { .. }), "{e}");
        assert!(e.to_string().contains("'q' is bound to both"), "{e}");
        let e = KeyMap::from_toml("[keys]\nfly = \"x\"\n").unwrap_err();
        assert!(e.to_string().contains("unknown action 'fly'"));
        let e = KeyMap::from_toml("[keys]\nquit = \"xyz\"\n").unwrap_err();
        assert!(matches!(e, KeyError::BadKey { .. }));
    }

    #[test]
    fn ctrl_c_always_quits() {
        let k = KeyMap::from_toml("[keys]\nquit = \"x\"\n").unwrap();
        assert_eq!(k.action(&KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)), Some(Action::Quit));
    }
}
