//! What a terminal colour looks like: its RGB (the basic 16 as xterm's default palette
//! draws them, since the terminal's own palette is unknown), WCAG relative luminance and
//! contrast ratio, and the nearest entry of the 256- and 16-colour palettes.

use ratatui::style::Color;

/// xterm's default palette for the 16 basic colours, in ANSI order: the reference a
/// theme's contrast is checked against (terminals may redefine them).
const XTERM16: [(u8, u8, u8); 16] = [
    (0, 0, 0),
    (205, 0, 0),
    (0, 205, 0),
    (205, 205, 0),
    (0, 0, 238),
    (205, 0, 205),
    (0, 205, 205),
    (229, 229, 229),
    (127, 127, 127),
    (255, 0, 0),
    (0, 255, 0),
    (255, 255, 0),
    (92, 92, 255),
    (255, 0, 255),
    (0, 255, 255),
    (255, 255, 255),
];

/// The basic colours in ANSI order (index = ANSI number).
pub const BASIC: [Color; 16] = [
    Color::Black,
    Color::Red,
    Color::Green,
    Color::Yellow,
    Color::Blue,
    Color::Magenta,
    Color::Cyan,
    Color::Gray,
    Color::DarkGray,
    Color::LightRed,
    Color::LightGreen,
    Color::LightYellow,
    Color::LightBlue,
    Color::LightMagenta,
    Color::LightCyan,
    Color::White,
];

/// Channel levels of the xterm 6×6×6 colour cube (indices 16..=231).
const CUBE: [u8; 6] = [0, 95, 135, 175, 215, 255];

/// The colour's RGB as a terminal draws it; None for `Reset` (the terminal's own colour).
pub fn rgb(c: Color) -> Option<(u8, u8, u8)> {
    Some(match c {
        Color::Rgb(r, g, b) => (r, g, b),
        Color::Indexed(i) => indexed_rgb(i),
        Color::Reset => return None,
        basic => XTERM16[BASIC.iter().position(|b| *b == basic)?],
    })
}

fn indexed_rgb(i: u8) -> (u8, u8, u8) {
    match i {
        0..=15 => XTERM16[i as usize],
        16..=231 => {
            let n = (i - 16) as usize;
            (CUBE[n / 36], CUBE[n / 6 % 6], CUBE[n % 6])
        }
        _ => {
            let g = 8 + 10 * (i - 232);
            (g, g, g)
        }
    }
}

/// WCAG relative luminance, from linearised sRGB.
pub fn luminance((r, g, b): (u8, u8, u8)) -> f64 {
    let lin = |v: u8| {
        let v = f64::from(v) / 255.0;
        if v <= 0.04045 {
            v / 12.92
        } else {
            ((v + 0.055) / 1.055).powf(2.4)
        }
    };
    0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)
}

/// WCAG contrast ratio of two colours (1 to 21); None when either is the terminal's own.
pub fn contrast(a: Color, b: Color) -> Option<f64> {
    let (la, lb) = (luminance(rgb(a)?), luminance(rgb(b)?));
    Some((la.max(lb) + 0.05) / (la.min(lb) + 0.05))
}

/// How far apart two colours look, weighted by channel ("redmean"): 0 for the same colour,
/// about 765 for black and white.
pub fn distance(a: (u8, u8, u8), b: (u8, u8, u8)) -> f64 {
    let rm = (f64::from(a.0) + f64::from(b.0)) / 2.0;
    let d = |x: u8, y: u8| (f64::from(x) - f64::from(y)).powi(2);
    ((2.0 + rm / 256.0) * d(a.0, b.0) + 4.0 * d(a.1, b.1) + (2.0 + (255.0 - rm) / 256.0) * d(a.2, b.2)).sqrt()
}

/// The xterm-256 index closest to an RGB colour, from the colour cube (16..=231) and the
/// grey ramp (232..=255). The first 16 are left out: terminals redefine them.
pub fn nearest_xterm256(r: u8, g: u8, b: u8) -> u8 {
    let level = |v: u8| -> usize {
        CUBE.iter()
            .enumerate()
            .min_by_key(|(_, c)| (i32::from(**c) - i32::from(v)).abs())
            .map(|(i, _)| i)
            .expect("cube has levels")
    };
    let dist = |(r2, g2, b2): (u8, u8, u8)| -> i32 {
        let d = |a: u8, b: u8| (i32::from(a) - i32::from(b)).pow(2);
        d(r, r2) + d(g, g2) + d(b, b2)
    };
    let (ri, gi, bi) = (level(r), level(g), level(b));
    let cube_idx = 16 + 36 * ri + 6 * gi + bi;
    let cube_dist = dist((CUBE[ri], CUBE[gi], CUBE[bi]));
    // Grey ramp: 8, 18, ..., 238.
    let avg = (u32::from(r) + u32::from(g) + u32::from(b)) / 3;
    let gi = ((avg.saturating_sub(3)) / 10).min(23) as u8;
    let grey = 8 + 10 * gi;
    let grey_dist = dist((grey, grey, grey));
    if grey_dist < cube_dist {
        232 + gi
    } else {
        cube_idx as u8
    }
}

/// The basic colour that looks closest (by the reference palette).
pub fn nearest_basic(c: (u8, u8, u8)) -> Color {
    let i = (0..16).min_by(|&a, &b| distance(c, XTERM16[a]).total_cmp(&distance(c, XTERM16[b]))).expect("16 colours");
    BASIC[i]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xterm256_mapping() {
        assert_eq!(nearest_xterm256(0, 0, 0), 16);
        assert_eq!(nearest_xterm256(255, 255, 255), 231);
        assert_eq!(nearest_xterm256(255, 0, 0), 196);
        assert_eq!(nearest_xterm256(0x87, 0xaf, 0xd7), 110);
        // Greys go to the ramp, which is finer than the cube's diagonal.
        assert_eq!(nearest_xterm256(128, 128, 128), 244);
        assert_eq!(nearest_xterm256(0x30, 0x30, 0x30), 236);
        // darkgreen: cube (0, 95, 0) = 22.
        assert_eq!(nearest_xterm256(0, 100, 0), 22);
        for i in 16..=255u8 {
            let (r, g, b) = indexed_rgb(i);
            assert_eq!(indexed_rgb(nearest_xterm256(r, g, b)), (r, g, b), "index {i} maps back to its own colour");
        }
    }

    #[test]
    fn contrast_follows_wcag() {
        let c = |a, b| contrast(a, b).unwrap();
        assert!((c(Color::Rgb(0, 0, 0), Color::Rgb(255, 255, 255)) - 21.0).abs() < 1e-9);
        assert_eq!(c(Color::Rgb(9, 9, 9), Color::Rgb(9, 9, 9)), 1.0);
        // The figures: gradient #0000cd and parameter #006400 on #101418.
        let bg = Color::Rgb(0x10, 0x14, 0x18);
        assert!((c(Color::Rgb(0, 0, 0xcd), bg) - 1.66).abs() < 0.01);
        assert!((c(Color::Rgb(0, 0x64, 0), bg) - 2.49).abs() < 0.01);
        assert_eq!(contrast(Color::Reset, bg), None);
        assert_eq!(rgb(Color::Indexed(235)), Some((38, 38, 38)));
        assert_eq!(rgb(Color::LightBlue), rgb(Color::Indexed(12)));
    }

    #[test]
    fn nearest_basic_colours() {
        assert_eq!(nearest_basic((10, 10, 10)), Color::Black);
        assert_eq!(nearest_basic((0, 160, 0)), Color::Green);
        assert_eq!(nearest_basic((250, 250, 250)), Color::White);
        assert_eq!(distance((1, 2, 3), (1, 2, 3)), 0.0);
    }
}
