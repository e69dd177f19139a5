//! Boxes drawn over a screen: help, inspectors, logs and reports.

use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::Span;
use ratatui::widgets::{Block, Borders, Clear};
use ratatui::Frame;

use crate::theme::Theme;

/// A centred box of `w`×`h` (within `area`), cleared, with a title: the help, the
/// inspector and the event log are drawn in one.
pub fn overlay<'a>(f: &mut Frame, area: Rect, w: u16, h: u16, title: String, theme: &Theme) -> (Rect, Block<'a>) {
    let (w, h) = (w.min(area.width), h.min(area.height));
    let r = Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h };
    f.render_widget(Clear, r);
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(Style::default().fg(theme.ui.accent))
        .title(Span::styled(title, Style::default().fg(theme.ui.title)))
        .style(Style::default().bg(theme.ui.background).fg(theme.ui.text));
    (r, block)
}

/// `overlay` with its border drawn: returns the inside, for a report's text.
pub fn panel(f: &mut Frame, area: Rect, (width, height): (u16, u16), title: String, theme: &Theme) -> Rect {
    let (r, block) = overlay(f, area, width, height, title, theme);
    let inner = block.inner(r);
    f.render_widget(block, r);
    inner
}
