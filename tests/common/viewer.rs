//! `vramscope view` screens drawn to a buffer, as text.

use vramscope::keys::KeyMap;
use vramscope::screens::viewer::keys::ViewerKey;
use vramscope::screens::viewer::data::ViewerData;
use vramscope::screens::viewer::ui::{handle, settle, ViewerUi};
use vramscope::draw::draw_to_buffer;
use vramscope::screens::viewer::render::{inspector_overflow, plot_columns, render_viewer};
use vramscope::theme::Theme;

pub fn text(buf: &ratatui::buffer::Buffer) -> String {
    (0..buf.area.height)
        .map(|y| (0..buf.area.width).map(|x| buf[(x, y)].symbol().to_string()).collect::<String>().trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The viewer at 160×40 after `keys_pressed`, each one's analyses landed.
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
        // As a user sees it once "computing…" is gone.
        settle(data, &mut ui);
        ui.columns = plot_columns(width, ui.inspector);
    }
    draw_to_buffer(width, height, |f| render_viewer(f, data, &ui, &keys, theme))
}
