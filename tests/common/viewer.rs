//! `vramscope view` screens drawn to a buffer, as text.

use vramscope::app::keys::{KeyMap, ViewerKey};
use vramscope::app::snapshot_viewer::{handle, ViewerData, ViewerUi};
use vramscope::render::draw_to_buffer;
use vramscope::render::snapshot_viewer::{inspector_overflow, plot_columns, render_viewer};
use vramscope::render::theme::Theme;

pub fn text(buf: &ratatui::buffer::Buffer) -> String {
    (0..buf.area.height)
        .map(|y| (0..buf.area.width).map(|x| buf[(x, y)].symbol().to_string()).collect::<String>().trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The viewer at 160×40 after `keys_pressed`.
pub fn screen(data: &mut ViewerData, keys_pressed: &[ViewerKey]) -> String {
    text(&screen_buffer(data, keys_pressed, &Theme::load("dark").unwrap(), 160, 40))
}

/// The viewer's buffer at `width`×`height` in `theme` after `keys_pressed`.
pub fn screen_buffer(data: &mut ViewerData, keys_pressed: &[ViewerKey], theme: &Theme, width: u16, height: u16) -> ratatui::buffer::Buffer {
    let keys = KeyMap::<ViewerKey>::default();
    let mut ui = ViewerUi::new(data);
    ui.columns = plot_columns(width, false);
    for a in keys_pressed {
        // As the loop does before each frame it draws.
        ui.inspector_overflow = inspector_overflow(data, &ui, &keys, theme, ratatui::layout::Size::new(width, height));
        handle(*a, data, &mut ui, 1);
        ui.columns = plot_columns(width, ui.inspector);
    }
    draw_to_buffer(width, height, |f| render_viewer(f, data, &ui, &keys, theme))
}
