//! The footer line of "key what" hints each screen ends with.

use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};

use crate::chrome::fields::{fit_line, Field, Keep};
use crate::keys::{Bindable, KeyMap};
use crate::theme::Theme;

/// A footer of "key what" pairs within `width`, with the keys as the table binds them
/// (rebinding shows); on a narrow screen hints give way whole, from the right, the first
/// and quit last.
pub fn key_hints<A: Bindable>(keys: &KeyMap<A>, items: &[(A, &str)], theme: &Theme, width: u16) -> Line<'static> {
    let key = Style::default().fg(theme.ui.accent).add_modifier(Modifier::BOLD);
    let what = Style::default().fg(theme.ui.dim);
    let hints = items
        .iter()
        // An action a user's key file left without a key has no hint to give.
        .enumerate()
        .filter_map(|(i, (a, w))| {
            // The first hint (help) and the way out stay longest.
            let keep = if i == 0 || *a == A::QUIT { Keep::High } else { Keep::Mid };
            Some(Field::new(keep, vec![Span::styled(keys.key_of(*a)?.label(), key), Span::styled(format!(" {w}"), what)]))
        })
        .collect();
    fit_line(hints, width as usize, Span::raw("  "))
}
