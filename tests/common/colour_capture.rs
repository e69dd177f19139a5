//! Screens as text with their colours, for snapshots that catch a colour change.

use ratatui::buffer::Buffer;
use ratatui::style::Color;

/// The screen's text and, under it, its colours: each distinct (fg, bg) pair gets a letter,
/// drawn where it is used, with the legend after.
pub fn colours(buf: &Buffer) -> String {
    const SYMBOLS: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let area = buf.area;
    let mut pairs: Vec<(Color, Color)> = Vec::new();
    let mut out = String::new();
    for y in 0..area.height {
        out += &(0..area.width).map(|x| buf[(x, y)].symbol().to_string()).collect::<String>();
        out.push('\n');
    }
    for y in 0..area.height {
        for x in 0..area.width {
            let c = &buf[(x, y)];
            let i = pairs.iter().position(|p| *p == (c.fg, c.bg)).unwrap_or_else(|| {
                pairs.push((c.fg, c.bg));
                pairs.len() - 1
            });
            out.push(SYMBOLS.chars().nth(i).expect("fewer colour pairs than symbols"));
        }
        out.push('\n');
    }
    for (i, (fg, bg)) in pairs.iter().enumerate() {
        out += &format!("{} fg {fg:?} bg {bg:?}\n", SYMBOLS.chars().nth(i).unwrap());
    }
    out
}
