//! What every screen draws around its content, the same way: the background and the
//! "terminal too small" message, the footer of key hints, the help overlay, boxes over
//! the screen.

pub mod fields;
pub mod footer;
pub mod help;
pub mod overlay;

use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::widgets::{Block, Paragraph, Wrap};
use ratatui::Frame;

use crate::theme::Theme;

/// Paints the screen's background and returns the area to draw in, or, when the terminal
/// is smaller than `min` (width, height), says so instead and returns `None`.
pub fn screen(f: &mut Frame, (min_w, min_h): (u16, u16), theme: &Theme) -> Option<Rect> {
    let area = f.area();
    f.render_widget(Block::default().style(Style::default().bg(theme.ui.background).fg(theme.ui.text)), area);
    if area.width >= min_w && area.height >= min_h {
        return Some(area);
    }
    let msg = format!(
        "vramscope needs at least {min_w}×{min_h}. Terminal too small: {}x{}; enlarge it, or press q to quit.",
        area.width, area.height
    );
    f.render_widget(Paragraph::new(msg).style(Style::default().fg(theme.ui.warning)).wrap(Wrap { trim: true }), area);
    None
}
