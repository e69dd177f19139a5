//! Colours for every screen. Themes are TOML data (`themes/*.toml`, compiled in so the
//! binary works from any directory); a user file can replace them with `--theme PATH`.
//! Where the terminal lacks truecolor, RGB colours map to the nearest xterm-256 colour.

use std::path::Path;

use ratatui::style::Color;
use thiserror::Error;

use crate::event::{Category, Phase};

/// The built-in themes, by name; the first is the default.
pub const BUILTIN: [(&str, &str); 3] = [
    ("dark", include_str!("../../themes/dark.toml")),
    ("light", include_str!("../../themes/light.toml")),
    ("ansi16", include_str!("../../themes/ansi16.toml")),
];

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ThemeError {
    #[error(
        "theme '{name}' is neither a built-in theme ({builtins}) nor a readable file: {detail}"
    )]
    NotFound {
        name: String,
        builtins: String,
        detail: String,
    },
    #[error("{file}: TOML syntax error at line {line}, at {near}: {message}")]
    Syntax {
        file: String,
        line: usize,
        /// The text the parser stopped at.
        near: String,
        message: String,
    },
    #[error("{file}: unknown key '{key}'")]
    UnknownKey { file: String, key: String },
    #[error("{file}: missing key '{key}'")]
    MissingKey { file: String, key: String },
    #[error(
        "{file}: key '{key}': {value:?} is not a colour (expected \"#rrggbb\" or one of {names})"
    )]
    BadColour {
        file: String,
        key: String,
        value: String,
        names: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UiColors {
    pub background: Color,
    pub text: Color,
    pub dim: Color,
    pub border: Color,
    pub title: Color,
    pub accent: Color,
    pub warning: Color,
    pub error: Color,
    /// Background of the selected row.
    pub selection: Color,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChartColors {
    /// Reserved (segment) bytes line.
    pub reserved: Color,
    /// Device-used line from the gauges.
    pub device_used: Color,
    pub peak: Color,
    pub gauge_fill: Color,
    pub gauge_empty: Color,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Theme {
    pub ui: UiColors,
    pub chart: ChartColors,
    /// Indexed by `Category as usize`.
    pub categories: [Color; 8],
    /// Shading of training phases, indexed by `Phase as usize`; `Phase::Other` is unshaded.
    pub phases: [Option<Color>; 5],
}

impl Theme {
    pub fn category(&self, c: Category) -> Color {
        self.categories[c as usize]
    }

    pub fn phase(&self, p: Phase) -> Option<Color> {
        self.phases[p as usize]
    }

    /// A built-in theme by name, or a theme file by path.
    pub fn load(name_or_path: &str) -> Result<Theme, ThemeError> {
        if let Some((_, text)) = BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
            return Theme::parse(text, &format!("themes/{name_or_path}.toml"));
        }
        let text =
            std::fs::read_to_string(Path::new(name_or_path)).map_err(|e| ThemeError::NotFound {
                name: name_or_path.to_string(),
                builtins: BUILTIN.map(|(n, _)| n).join(", "),
                detail: e.to_string(),
            })?;
        Theme::parse(&text, name_or_path)
    }

    /// Parses theme TOML; `file` names the source in errors. Every key is required, so a
    /// theme never silently mixes in another's colours.
    pub fn parse(text: &str, file: &str) -> Result<Theme, ThemeError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| {
            let span = e.span().unwrap_or(0..0);
            let near = text
                .get(span.clone())
                .unwrap_or("")
                .lines()
                .next()
                .unwrap_or("");
            ThemeError::Syntax {
                file: file.to_string(),
                line: text[..span.start].matches('\n').count() + 1,
                near: match near {
                    "" => "end of input".into(),
                    n => format!("'{}'", n.chars().take(40).collect::<String>()),
                },
                message: e.message().trim().to_string(),
            }
        })?;
        let mut theme = Theme::black();
        let mut known: Vec<String> = Vec::new();
        for (key, slot) in theme.slots() {
            let (section, name) = key.split_once('.').expect("slot keys are section.name");
            known.push(key.clone());
            let value = table
                .get(section)
                .and_then(|s| s.get(name))
                .ok_or_else(|| ThemeError::MissingKey {
                    file: file.to_string(),
                    key: key.clone(),
                })?;
            let text = value.as_str().unwrap_or_default();
            *slot = parse_colour(text).ok_or_else(|| ThemeError::BadColour {
                file: file.to_string(),
                key: key.clone(),
                value: value.to_string().trim_matches('"').to_string(),
                names: NAMED.map(|(n, _)| n).join(", "),
            })?;
        }
        for (section, inner) in &table {
            let inner_keys: Vec<String> = match inner.as_table() {
                Some(t) => t.keys().map(|k| format!("{section}.{k}")).collect(),
                None => vec![section.clone()],
            };
            if let Some(key) = inner_keys.into_iter().find(|k| !known.contains(k)) {
                return Err(ThemeError::UnknownKey {
                    file: file.to_string(),
                    key,
                });
            }
        }
        Ok(theme)
    }

    /// Placeholder every slot overwrites while parsing.
    fn black() -> Theme {
        let c = Color::Black;
        Theme {
            ui: UiColors {
                background: c,
                text: c,
                dim: c,
                border: c,
                title: c,
                accent: c,
                warning: c,
                error: c,
                selection: c,
            },
            chart: ChartColors {
                reserved: c,
                device_used: c,
                peak: c,
                gauge_fill: c,
                gauge_empty: c,
            },
            categories: [c; 8],
            phases: [None, Some(c), Some(c), Some(c), Some(c)],
        }
    }

    /// Every colour with its `section.key` name, in file order.
    fn slots(&mut self) -> Vec<(String, &mut Color)> {
        let ui = &mut self.ui;
        let ch = &mut self.chart;
        let mut v: Vec<(String, &mut Color)> = vec![
            ("ui.background".into(), &mut ui.background),
            ("ui.text".into(), &mut ui.text),
            ("ui.dim".into(), &mut ui.dim),
            ("ui.border".into(), &mut ui.border),
            ("ui.title".into(), &mut ui.title),
            ("ui.accent".into(), &mut ui.accent),
            ("ui.warning".into(), &mut ui.warning),
            ("ui.error".into(), &mut ui.error),
            ("ui.selection".into(), &mut ui.selection),
            ("chart.reserved".into(), &mut ch.reserved),
            ("chart.device_used".into(), &mut ch.device_used),
            ("chart.peak".into(), &mut ch.peak),
            ("chart.gauge_fill".into(), &mut ch.gauge_fill),
            ("chart.gauge_empty".into(), &mut ch.gauge_empty),
        ];
        for (c, slot) in Category::ALL.iter().zip(self.categories.iter_mut()) {
            v.push((format!("category.{}", c.as_str()), slot));
        }
        for (p, slot) in Phase::ALL.iter().zip(self.phases.iter_mut()) {
            if let Some(slot) = slot {
                v.push((format!("phase.{}", p.as_str()), slot));
            }
        }
        v
    }

    /// `first` (a built-in name or a file), then the other built-ins, each as this terminal
    /// can show it: the order the `t` key cycles through.
    pub fn cycle(first: &str) -> Result<Vec<Theme>, ThemeError> {
        let support = ColorSupport::detect();
        let mut themes = vec![Theme::load(first)?.adapted(support)];
        for (name, _) in BUILTIN.iter().filter(|(n, _)| *n != first) {
            themes.push(Theme::load(name)?.adapted(support));
        }
        Ok(themes)
    }

    /// This theme as the terminal can show it.
    pub fn adapted(mut self, support: ColorSupport) -> Theme {
        if support == ColorSupport::Palette256 {
            for (_, slot) in self.slots() {
                if let Color::Rgb(r, g, b) = *slot {
                    *slot = Color::Indexed(nearest_xterm256(r, g, b));
                }
            }
        }
        self
    }
}

impl Default for Theme {
    fn default() -> Theme {
        Theme::parse(BUILTIN[0].1, "themes/dark.toml").expect("the built-in dark theme parses")
    }
}

/// The basic colours a theme may name, plus `reset` (the terminal's own colour).
const NAMED: [(&str, Color); 18] = [
    ("reset", Color::Reset),
    ("black", Color::Black),
    ("red", Color::Red),
    ("green", Color::Green),
    ("yellow", Color::Yellow),
    ("blue", Color::Blue),
    ("magenta", Color::Magenta),
    ("cyan", Color::Cyan),
    ("gray", Color::Gray),
    ("darkgray", Color::DarkGray),
    ("lightred", Color::LightRed),
    ("lightgreen", Color::LightGreen),
    ("lightyellow", Color::LightYellow),
    ("lightblue", Color::LightBlue),
    ("lightmagenta", Color::LightMagenta),
    ("lightcyan", Color::LightCyan),
    ("white", Color::White),
    ("grey", Color::Gray),
];

/// "#rrggbb" or a basic colour name (case-insensitive).
pub fn parse_colour(s: &str) -> Option<Color> {
    if let Some(hex) = s.strip_prefix('#') {
        if hex.len() != 6 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let v = u32::from_str_radix(hex, 16).ok()?;
        return Some(Color::Rgb((v >> 16) as u8, (v >> 8) as u8, v as u8));
    }
    let lower = s.to_ascii_lowercase();
    NAMED.iter().find(|(n, _)| *n == lower).map(|(_, c)| *c)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColorSupport {
    TrueColor,
    Palette256,
}

impl ColorSupport {
    /// From the value of `COLORTERM`: only `truecolor`/`24bit` promise RGB.
    pub fn from_colorterm(colorterm: Option<&str>) -> ColorSupport {
        match colorterm.map(str::to_ascii_lowercase).as_deref() {
            Some("truecolor" | "24bit") => ColorSupport::TrueColor,
            _ => ColorSupport::Palette256,
        }
    }

    pub fn detect() -> ColorSupport {
        ColorSupport::from_colorterm(std::env::var("COLORTERM").ok().as_deref())
    }
}

/// Channel levels of the xterm 6×6×6 colour cube (indices 16..=231).
const CUBE: [u8; 6] = [0, 95, 135, 175, 215, 255];

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_themes_load_and_differ() {
        let themes: Vec<Theme> = BUILTIN
            .iter()
            .map(|(n, _)| Theme::load(n).unwrap())
            .collect();
        assert_eq!(Theme::default(), themes[0]);
        assert_ne!(themes[0], themes[1]);
        // ansi16 uses only the basic colours, so it looks the same on any terminal.
        let mut ansi = themes[2].clone();
        for (key, c) in ansi.slots() {
            assert!(
                !matches!(c, Color::Rgb(..) | Color::Indexed(_)),
                "{key} is {c:?}"
            );
        }
        // Categories must be told apart.
        for t in &themes {
            let mut cats = t.categories.to_vec();
            cats.dedup();
            assert_eq!(cats.len(), 8, "{:?}", t.categories);
        }
    }

    #[test]
    fn dark_theme_follows_torch_profiler_colours() {
        let t = Theme::default();
        assert_eq!(
            t.category(Category::Parameter),
            Color::Rgb(0x00, 0x64, 0x00)
        );
        assert_eq!(
            t.category(Category::OptimizerState),
            Color::Rgb(0xda, 0xa5, 0x20)
        );
        assert_eq!(
            t.category(Category::Temporary),
            Color::Rgb(0x93, 0x70, 0xdb)
        );
        assert_ne!(
            t.category(Category::Input),
            Color::Rgb(0, 0, 0),
            "black is invisible on dark"
        );
        assert_eq!(t.phase(Phase::Other), None);
        assert!(t.phase(Phase::Backward).is_some());
    }

    fn with_line(key_line: &str, replace: &str) -> String {
        let text = BUILTIN[0].1;
        assert!(text.contains(key_line), "{key_line}");
        text.replacen(key_line, replace, 1)
    }

    #[test]
    fn bad_themes_name_file_and_key() {
        let err = |t: &str| Theme::parse(t, "my.toml").unwrap_err().to_string();
        let gradient = with_line("gradient = \"#0000cd\"", "gradient = \"navyish\"");
        let e = err(&gradient);
        assert!(
            e.starts_with("my.toml: key 'category.gradient': \"navyish\" is not a colour"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1);

        let unknown = with_line("[phase]", "[phase]\nwarmup = \"#ffffff\"");
        assert_eq!(err(&unknown), "my.toml: unknown key 'phase.warmup'");

        let duplicate = with_line("[phase]", "[phase]\nforward = \"#ffffff\"");
        let line = 1 + duplicate.lines().position(|l| l == "[phase]").unwrap() + 2;
        assert_eq!(
            err(&duplicate),
            format!("my.toml: TOML syntax error at line {line}, at 'forward': duplicate key")
        );

        let missing = with_line("gradient = \"#0000cd\"\n", "");
        assert_eq!(err(&missing), "my.toml: missing key 'category.gradient'");

        let number = with_line("forward = \"#14233a\"", "forward = 3");
        assert!(err(&number).starts_with("my.toml: key 'phase.forward': \"3\" is not a colour"));
        assert!(matches!(
            Theme::load("/nonexistent/x.toml"),
            Err(ThemeError::NotFound { .. })
        ));
    }

    #[test]
    fn colour_syntax() {
        assert_eq!(parse_colour("#FF8000"), Some(Color::Rgb(255, 128, 0)));
        assert_eq!(parse_colour("LightBlue"), Some(Color::LightBlue));
        assert_eq!(parse_colour("grey"), Some(Color::Gray));
        assert_eq!(parse_colour("#ff80"), None);
        assert_eq!(parse_colour("#gg0000"), None);
        assert_eq!(parse_colour("mediumpurple"), None);
    }

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
    }

    #[test]
    fn adapting_to_256_colours_removes_rgb_only_there() {
        let dark = Theme::default();
        assert_eq!(dark.clone().adapted(ColorSupport::TrueColor), dark);
        let mut mapped = dark.adapted(ColorSupport::Palette256);
        for (key, c) in mapped.slots() {
            assert!(!matches!(c, Color::Rgb(..)), "{key} still RGB");
        }
        assert_eq!(mapped.category(Category::Parameter), Color::Indexed(22));
        assert_eq!(
            ColorSupport::from_colorterm(Some("truecolor")),
            ColorSupport::TrueColor
        );
        assert_eq!(
            ColorSupport::from_colorterm(Some("24bit")),
            ColorSupport::TrueColor
        );
        assert_eq!(
            ColorSupport::from_colorterm(Some("yes")),
            ColorSupport::Palette256
        );
        assert_eq!(ColorSupport::from_colorterm(None), ColorSupport::Palette256);
    }
}
