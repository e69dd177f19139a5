//! Key bindings as data: the default table lives here, a TOML file may override any action's
//! key, duplicates are rejected on load, and the help overlay is generated from the table.

use std::collections::HashMap;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use serde::Deserialize;

/// What a key table needs of its action enum; `actions!` implements it.
pub trait Bindable: Copy + Eq + std::hash::Hash + std::fmt::Debug + 'static {
    const ALL: &'static [Self];
    /// The action ctrl-c always maps to.
    const QUIT: Self;
    /// The name used in key files.
    fn name(self) -> &'static str;
    fn help(self) -> &'static str;
    fn default_key(self) -> &'static str;
}

/// One enum per screen: (variant, key-file name, default key, help text) rows.
macro_rules! actions {
    ($(#[$doc:meta])* $enum:ident, quit = $quit:ident; $($var:ident, $name:literal, $key:literal, $help:literal;)+) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $enum { $($var),+ }
        impl $enum {
            pub const ALL: &'static [$enum] = &[$($enum::$var),+];
            pub fn name(self) -> &'static str { match self { $($enum::$var => $name),+ } }
            pub fn help(self) -> &'static str { match self { $($enum::$var => $help),+ } }
        }
        impl Bindable for $enum {
            const ALL: &'static [$enum] = $enum::ALL;
            const QUIT: $enum = $enum::$quit;
            fn name(self) -> &'static str { $enum::name(self) }
            fn help(self) -> &'static str { $enum::help(self) }
            fn default_key(self) -> &'static str { match self { $($enum::$var => $key),+ } }
        }
    };
}

actions! {
    /// The live screen's actions.
    LiveKey, quit = Quit;
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
    GoLive, "go_live", "end", "back to live: follow the newest steps";
    ZoomIn, "zoom_in", "+", "zoom in";
    ZoomOut, "zoom_out", "-", "zoom out";
    ToggleAxis, "toggle_axis", "x", "x axis: events / time";
    ToggleBands, "toggle_bands", "c", "bands by category / by allocation";
    FocusTable, "focus_table", "tab", "focus the allocations table";
    SelectUp, "select_up", "up", "table: previous row (event log: scroll up)";
    SelectDown, "select_down", "down", "table: next row (event log: scroll down)";
    Inspect, "inspect", "enter", "open / close the selected allocation's inspector";
    EventLog, "event_log", "l", "open / close the event log";
    NextTheme, "next_theme", "t", "next theme";
    NextRank, "next_rank", "R", "show the next rank of a multi-rank job";
    NextDevice, "next_device", "D", "show the next GPU of a job that allocates on several";
    ToggleRecord, "toggle_record", "r", "start / stop recording the session";
    SpeedUp, "speed_up", ">", "replay: twice as fast";
    SpeedDown, "speed_down", "<", "replay: half as fast";
    NextStep, "next_step", "n", "replay: seek a step forward";
    PrevStep, "prev_step", "N", "replay: seek a step back";
    Help, "help", "?", "this help";
    Detach, "detach", "d", "quit, leaving a job vramscope py started running";
    Quit, "quit", "q", "quit (stops a job vramscope started; an attached one runs on)";
}

impl LiveKey {
    /// Whether the screen offers this key: a replay cannot turn the knobs, save or record,
    /// and only a replay has a pace to change or steps to seek.
    pub fn offered(self, replay: bool) -> bool {
        use LiveKey::*;
        match self {
            SpeedUp | SpeedDown | NextStep | PrevStep => replay,
            TogglePrecision | CtxHalve | CtxDouble | BatchDown | BatchUp | ToggleMode | ToggleAttention | Snapshot | StepOnce | ToggleRecord | Detach => !replay,
            _ => true,
        }
    }

    /// The help line, in a replay's words where they differ.
    pub fn help_for(self, replay: bool) -> &'static str {
        match self {
            LiveKey::TogglePause if replay => "pause / resume the replay",
            LiveKey::Quit if replay => "quit",
            a => a.help(),
        }
    }
}

actions! {
    /// `vramscope view`'s actions.
    ViewerKey, quit = Quit;
    NextTab, "next_tab", "tab", "next view: timeline, largest, segments, categories";
    CursorLeft, "cursor_left", "left", "timeline: cursor back (pans at the edge)";
    CursorRight, "cursor_right", "right", "timeline: cursor forward (pans at the edge)";
    SelectUp, "select_up", "up", "select the band above / the previous row";
    SelectDown, "select_down", "down", "select the band below / the next row";
    ZoomIn, "zoom_in", "+", "zoom in around the cursor";
    ZoomOut, "zoom_out", "-", "zoom out";
    DetailLess, "detail_less", "[", "detail: fewer allocations drawn one by one";
    DetailMore, "detail_more", "]", "detail: more allocations drawn one by one";
    JumpToPeak, "jump_to_peak", "p", "move the cursor to the peak";
    Inspect, "inspect", "enter", "open / close the allocation inspector";
    ColourBy, "colour_by", "c", "timeline: colour by category / by allocation";
    AllFrames, "all_frames", "f", "inspector: all frames / Python frames first";
    InspectorUp, "inspector_up", "pageup", "inspector: scroll up";
    InspectorDown, "inspector_down", "pagedown", "inspector: scroll down";
    Sort, "sort", "s", "largest list: next sort order";
    Search, "search", "/", "largest list: search frames or address";
    NextDevice, "next_device", "d", "next device";
    OomReport, "oom_report", "o", "out of memory: what was asked, free and alive then";
    WhatIf, "what_if", "w", "what if: the trace under other allocator settings";
    NextTheme, "next_theme", "t", "next theme";
    Help, "help", "?", "this help";
    Quit, "quit", "q", "quit";
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum KeyError {
    #[error("key file: {0}")]
    Toml(String),
    #[error("key file: unknown action '{0}' (allowed: {1})")]
    UnknownAction(String, String),
    #[error("key file: '{key}' cannot be parsed as a key for {action} (use a character, or one of: space, tab, enter, esc, left, right, up, down, backspace, end, home, pageup, pagedown, f1..f12)")]
    BadKey { action: String, key: String },
    #[error("key file: '{key}' is bound to both {first} and {second}")]
    Duplicate { key: String, first: String, second: String },
    #[error("reading key file {path}: {err}")]
    Read { path: std::path::PathBuf, err: String },
    #[error("{path}: {inner}")]
    InFile { path: std::path::PathBuf, inner: Box<KeyError> },
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
            "end" => KeyCode::End,
            "home" => KeyCode::Home,
            "pageup" => KeyCode::PageUp,
            "pagedown" => KeyCode::PageDown,
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
        // Terminals differ on whether shifted characters carry SHIFT; the character is
        // enough, so SHIFT is not kept.
        Key { code: e.code, ctrl: e.modifiers.contains(KeyModifiers::CONTROL) }
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
            KeyCode::End => "end".into(),
            KeyCode::Home => "home".into(),
            KeyCode::PageUp => "pageup".into(),
            KeyCode::PageDown => "pagedown".into(),
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

/// A screen's key table: every action of `A` bound to one key, no key bound twice.
#[derive(Clone, Debug)]
pub struct KeyMap<A: Bindable = LiveKey> {
    by_key: HashMap<Key, A>,
    by_action: Vec<(A, Key)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    #[serde(default)]
    keys: HashMap<String, String>,
}

impl<A: Bindable> Default for KeyMap<A> {
    fn default() -> Self {
        let pairs = A::ALL
            .iter()
            .map(|a| (*a, Key::parse(a.default_key()).expect("default keys parse")))
            .collect();
        Self::build(pairs).expect("default keys are unique")
    }
}

impl<A: Bindable> KeyMap<A> {
    fn build(by_action: Vec<(A, Key)>) -> Result<Self, KeyError> {
        let mut by_key: HashMap<Key, A> = HashMap::new();
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

    /// The key file at `path` (`--keys`), or the defaults when there is none. Errors name
    /// the file.
    pub fn load(path: Option<&std::path::Path>) -> Result<Self, KeyError> {
        let Some(p) = path else { return Ok(Self::default()) };
        let text = std::fs::read_to_string(p).map_err(|e| KeyError::Read { path: p.to_path_buf(), err: e.to_string() })?;
        Self::from_toml(&text).map_err(|e| KeyError::InFile { path: p.to_path_buf(), inner: Box::new(e) })
    }

    /// Defaults overridden by a TOML file's `[keys]` table (`toggle_precision = "P"`).
    pub fn from_toml(text: &str) -> Result<Self, KeyError> {
        let file: KeyFile = toml::from_str(text).map_err(|e| KeyError::Toml(e.message().to_string()))?;
        let mut pairs: Vec<(A, Key)> = Self::default().by_action;
        let mut overrides: Vec<_> = file.keys.into_iter().collect();
        overrides.sort();
        for (name, key) in overrides {
            let action = A::ALL.iter().find(|a| a.name() == name).ok_or_else(|| {
                KeyError::UnknownAction(name.clone(), A::ALL.iter().map(|a| a.name()).collect::<Vec<_>>().join(", "))
            })?;
            let k = Key::parse(&key).ok_or(KeyError::BadKey { action: name.clone(), key })?;
            for p in pairs.iter_mut().filter(|p| p.0 == *action) {
                p.1 = k;
            }
        }
        Self::build(pairs)
    }

    pub fn action(&self, e: &KeyEvent) -> Option<A> {
        let k = Key::from_event(e);
        // ctrl-c always quits, whatever the table says: the way out must never be rebound away.
        if k.ctrl && k.code == KeyCode::Char('c') {
            return Some(A::QUIT);
        }
        self.by_key.get(&k).copied()
    }

    pub fn key_of(&self, a: A) -> Key {
        self.by_action.iter().find(|p| p.0 == a).map(|p| p.1).expect("every action has a key")
    }

    /// (key label, description) for the help overlay, in table order.
    pub fn help_rows(&self) -> Vec<(String, &'static str)> {
        self.help_rows_with(|a| Some(a.help()))
    }

    /// The help rows `help` gives a text for, in table order.
    pub fn help_rows_with(&self, help: impl Fn(A) -> Option<&'static str>) -> Vec<(String, &'static str)> {
        self.by_action.iter().filter_map(|(a, k)| Some((k.label(), help(*a)?))).collect()
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
        let k: KeyMap = KeyMap::default();
        assert_eq!(k.action(&press(KeyCode::Char('p'))), Some(LiveKey::TogglePrecision));
        assert_eq!(k.action(&press(KeyCode::Char(']'))), Some(LiveKey::CtxDouble));
        assert_eq!(k.action(&press(KeyCode::Char(' '))), Some(LiveKey::TogglePause));
        assert_eq!(k.action(&press(KeyCode::Tab)), Some(LiveKey::FocusTable));
        assert_eq!(k.action(&KeyEvent::new(KeyCode::Char('}'), KeyModifiers::SHIFT)), Some(LiveKey::BatchUp));
        assert_eq!(k.help_rows().len(), LiveKey::ALL.len());
        assert_eq!(k.action(&press(KeyCode::End)), Some(LiveKey::GoLive));
        assert_eq!(k.action(&press(KeyCode::Enter)), Some(LiveKey::Inspect));
        assert_eq!(Key::parse("end").unwrap().label(), "end");
    }

    #[test]
    fn live_and_replay_offer_their_own_keys() {
        assert!(LiveKey::TogglePrecision.offered(false) && !LiveKey::TogglePrecision.offered(true));
        assert!(LiveKey::NextStep.offered(true) && !LiveKey::NextStep.offered(false));
        assert!(LiveKey::Help.offered(true) && LiveKey::Help.offered(false));
        assert_eq!(LiveKey::TogglePause.help_for(true), "pause / resume the replay");
        assert_eq!(LiveKey::TogglePause.help_for(false), LiveKey::TogglePause.help());
    }

    #[test]
    fn the_viewer_table_is_complete_and_unique() {
        let k: KeyMap<ViewerKey> = KeyMap::default();
        assert_eq!(k.help_rows().len(), ViewerKey::ALL.len());
        assert_eq!(k.action(&press(KeyCode::Char(']'))), Some(ViewerKey::DetailMore));
        assert_eq!(k.action(&press(KeyCode::Enter)), Some(ViewerKey::Inspect));
        assert_eq!(k.action(&KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)), Some(ViewerKey::Quit));
        let e = KeyMap::<ViewerKey>::from_toml("[keys]\nsort = \"q\"\n").unwrap_err();
        assert!(matches!(e, KeyError::Duplicate { .. }), "{e}");
    }

    #[test]
    fn a_file_overrides_and_duplicates_are_rejected() {
        let k = KeyMap::<LiveKey>::from_toml("[keys]\ntoggle_precision = \"P\"\n").unwrap();
        assert_eq!(k.action(&press(KeyCode::Char('P'))), Some(LiveKey::TogglePrecision));
        assert_eq!(k.action(&press(KeyCode::Char('p'))), None);
        let e = KeyMap::<LiveKey>::from_toml("[keys]\nsnapshot = \"q\"\n").unwrap_err();
        assert!(matches!(e, KeyError::Duplicate { .. }), "{e}");
        assert!(e.to_string().contains("'q' is bound to both"), "{e}");
        let e = KeyMap::<LiveKey>::from_toml("[keys]\nfly = \"x\"\n").unwrap_err();
        assert!(e.to_string().contains("unknown action 'fly'"));
        let e = KeyMap::<LiveKey>::from_toml("[keys]\nquit = \"xyz\"\n").unwrap_err();
        assert!(matches!(e, KeyError::BadKey { .. }));
    }

    #[test]
    fn ctrl_c_always_quits() {
        let k = KeyMap::<LiveKey>::from_toml("[keys]\nquit = \"Q\"\n").unwrap();
        assert_eq!(k.action(&KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)), Some(LiveKey::Quit));
    }
}
