//! Pure drawing functions, one per screen or panel, and the theme they share.

pub mod axis;
pub mod colour;
pub mod export;
pub mod live;
pub mod snapshot_viewer;
pub mod text;
pub mod theme;
pub mod watch;

/// Draws into a buffer outside a terminal (snapshot tests, render benchmarks).
pub fn draw_to_buffer(width: u16, height: u16, draw: impl FnOnce(&mut ratatui::Frame)) -> ratatui::buffer::Buffer {
    let mut term = ratatui::Terminal::new(ratatui::backend::TestBackend::new(width, height)).expect("test backend");
    term.draw(draw).expect("draw");
    term.backend().buffer().clone()
}
