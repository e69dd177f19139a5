//! The footer line of "key what" hints each screen ends with.

use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};

use crate::keys::{Bindable, KeyMap};
use crate::theme::Theme;

/// A footer of "key what" pairs, with the keys as the table binds them (rebinding shows).
pub fn key_hints<A: Bindable>(keys: &KeyMap<A>, items: &[(A, &str)], theme: &Theme) -> Line<'static> {
    let key = Style::default().fg(theme.ui.accent).add_modifier(Modifier::BOLD);
    let what = Style::default().fg(theme.ui.dim);
    Line::from(
        items
            .iter()
            // An action a user's key file left without a key has no hint to give.
            .filter_map(|(a, w)| Some([Span::styled(keys.key_of(*a)?.label(), key), Span::styled(format!(" {w}  "), what)]))
            .flatten()
            .collect::<Vec<_>>(),
    )
}
