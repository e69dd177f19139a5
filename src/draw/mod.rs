//! Drawing pieces the screens share: the byte axis of a chart, text fitted to cells.

pub mod axis;
pub mod text;

/// Draws into a buffer outside a terminal (snapshot tests, render benchmarks).
pub fn draw_to_buffer(width: u16, height: u16, draw: impl FnOnce(&mut ratatui::Frame)) -> ratatui::buffer::Buffer {
    let mut term = ratatui::Terminal::new(ratatui::backend::TestBackend::new(width, height)).expect("test backend");
    term.draw(draw).expect("draw");
    term.backend().buffer().clone()
}
