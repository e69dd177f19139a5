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
#[macro_export]
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
        impl $crate::keys::Bindable for $enum {
            const ALL: &'static [$enum] = $enum::ALL;
            const QUIT: $enum = $enum::$quit;
            fn name(self) -> &'static str { $enum::name(self) }
            fn help(self) -> &'static str { $enum::help(self) }
            fn default_key(self) -> &'static str { match self { $($enum::$var => $key),+ } }
        }
    };
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

/// A screen's key table: no key bound twice; an action whose default key a user's file
/// gave to another action has none.
#[derive(Clone, Debug)]
pub struct KeyMap<A: Bindable> {
    by_key: HashMap<Key, A>,
    by_action: Vec<(A, Option<Key>)>,
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
            .map(|a| (*a, Some(Key::parse(a.default_key()).expect("default keys parse"))))
            .collect();
        Self::build(pairs).expect("default keys are unique")
    }
}

impl<A: Bindable> KeyMap<A> {
    fn build(by_action: Vec<(A, Option<Key>)>) -> Result<Self, KeyError> {
        let mut by_key: HashMap<Key, A> = HashMap::new();
        for (a, k) in by_action.iter().filter_map(|(a, k)| Some((a, (*k)?))) {
            if let Some(prev) = by_key.insert(k, *a) {
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
    /// The file wins: a default that used a key the file binds is let go, so a file written
    /// before a newer default took its key still loads. Only two of the file's own
    /// bindings on one key are an error.
    pub fn from_toml(text: &str) -> Result<Self, KeyError> {
        let file: KeyFile = toml::from_str(text).map_err(|e| KeyError::Toml(e.message().to_string()))?;
        let mut overrides: Vec<_> = file.keys.into_iter().collect();
        overrides.sort();
        let mut users: Vec<(A, Key)> = Vec::new();
        for (name, key) in overrides {
            let action = A::ALL.iter().find(|a| a.name() == name).ok_or_else(|| {
                KeyError::UnknownAction(name.clone(), A::ALL.iter().map(|a| a.name()).collect::<Vec<_>>().join(", "))
            })?;
            let k = Key::parse(&key).ok_or(KeyError::BadKey { action: name.clone(), key })?;
            users.push((*action, k));
        }
        Self::build(users.iter().map(|(a, k)| (*a, Some(*k))).collect())?;
        let pairs = Self::default()
            .by_action
            .into_iter()
            .map(|(a, default)| match users.iter().find(|u| u.0 == a) {
                Some((_, k)) => (a, Some(*k)),
                None => (a, default.filter(|d| !users.iter().any(|u| u.1 == *d))),
            })
            .collect();
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

    pub fn key_of(&self, a: A) -> Option<Key> {
        self.by_action.iter().find(|p| p.0 == a).and_then(|p| p.1)
    }

    /// How screens name `a`'s key ("unbound" when a user's file took its key).
    pub fn label_of(&self, a: A) -> String {
        self.key_of(a).map_or_else(|| "unbound".into(), |k| k.label())
    }

    /// (key label, description) for the help overlay, in table order.
    pub fn help_rows(&self) -> Vec<(String, &'static str)> {
        self.help_rows_with(|a| Some(a.help()))
    }

    /// The help rows `help` gives a text for, in table order.
    pub fn help_rows_with(&self, help: impl Fn(A) -> Option<&'static str>) -> Vec<(String, &'static str)> {
        self.by_action.iter().filter_map(|(a, _)| Some((self.label_of(*a), help(*a)?))).collect()
    }
}

/// A key pressed with no modifier, for the screens' key-table tests.
#[cfg(test)]
pub fn press(c: KeyCode) -> KeyEvent {
    KeyEvent::new(c, KeyModifiers::NONE)
}
