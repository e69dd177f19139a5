//! Colours for every screen. Themes are TOML data (`themes/*.toml`, compiled in so the
//! binary works from any directory); a user file can replace them with `--theme PATH`.
//!
//! A theme file gives its truecolor palette, and may give what it is in 256 colours
//! (`[xterm256.*]`, xterm indices) and in the 16 basic colours (`[ansi16.*]`): palettes
//! chosen for each depth, since rounding a dark palette to the nearest xterm colour merges
//! its dark shades into one grey. Keys a depth's palette leaves out are rounded from the
//! truecolor one.

pub mod colour;

use std::path::Path;

use ratatui::style::Color;
use thiserror::Error;

use colour::{contrast, nearest_basic, nearest_xterm256, rgb, BASIC};
use vramscope_core::event::{Category, Phase};

/// The built-in themes, by name; the first is the default.
pub const BUILTIN: [(&str, &str); 3] = [
    ("dark", include_str!("../../themes/dark.toml")),
    ("light", include_str!("../../themes/light.toml")),
    ("ansi16", include_str!("../../themes/ansi16.toml")),
];

/// Set to `truecolor`, `256` or `16` to override what the terminal is taken to show.
pub const COLORS_ENV: &str = "VRAMSCOPE_COLORS";

/// Contrast a text must have against what it is drawn on (WCAG AA).
pub const TEXT_CONTRAST: f64 = 4.5;
/// Contrast a band, line or swatch must have against what it is drawn on (WCAG 1.4.11).
pub const GRAPHIC_CONTRAST: f64 = 3.0;

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
        "{file}: key '{key}': {value:?} is not a colour (expected \"#rrggbb\", an xterm index 0-255, or one of {names})"
    )]
    BadColour {
        file: String,
        key: String,
        value: String,
        names: String,
    },
    #[error("{file}: key '{key}': {value:?} is not one of the 16 basic colours ({names})")]
    NotBasic {
        file: String,
        key: String,
        value: String,
        names: String,
    },
    #[error("{COLORS_ENV}={value:?}: expected truecolor, 256 or 16")]
    BadDepth { value: String },
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
    /// The empty part of a gauge: a faint track, deliberately below graphic contrast.
    pub gauge_empty: Color,
    /// Allocations too small for a band of their own, summed into one.
    pub small_allocations: Color,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColorSupport {
    TrueColor,
    Palette256,
    Ansi16,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Theme {
    /// The built-in name or the file it came from.
    pub name: String,
    /// The colour depth this palette is for.
    pub depth: ColorSupport,
    pub ui: UiColors,
    pub chart: ChartColors,
    /// Indexed by `Category as usize`.
    pub categories: [Color; 8],
    /// Shading of training phases, indexed by `Phase as usize`; `Phase::Other` is unshaded.
    pub phases: [Option<Color>; 5],
}

/// Two colours a screen draws one on the other, and the contrast they need.
#[derive(Clone, Debug, PartialEq)]
pub struct ContrastPair {
    /// What is drawn on what, in words.
    pub what: String,
    pub fg: Color,
    pub bg: Color,
    pub min: f64,
}

impl ContrastPair {
    /// None when either colour is the terminal's own (`reset`).
    pub fn ratio(&self) -> Option<f64> {
        contrast(self.fg, self.bg)
    }
}

/// A theme as its file gives it: the truecolor palette and what it is in fewer colours.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThemeSpec {
    base: Theme,
    /// `section.key` overrides at 256 colours.
    xterm256: Vec<(String, Color)>,
    /// ... and at 16.
    ansi16: Vec<(String, Color)>,
}

impl ThemeSpec {
    /// A built-in theme by name, or a theme file by path.
    pub fn load(name_or_path: &str) -> Result<ThemeSpec, ThemeError> {
        if let Some((_, text)) = BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
            return ThemeSpec::parse(text, &format!("themes/{name_or_path}.toml"), name_or_path);
        }
        let text = std::fs::read_to_string(Path::new(name_or_path)).map_err(|e| ThemeError::NotFound {
            name: name_or_path.to_string(),
            builtins: BUILTIN.map(|(n, _)| n).join(", "),
            detail: e.to_string(),
        })?;
        ThemeSpec::parse(&text, name_or_path, name_or_path)
    }

    /// Parses theme TOML; `file` names the source in errors. Every key of the truecolor
    /// palette is required, so a theme never silently mixes in another's colours.
    pub fn parse(text: &str, file: &str, name: &str) -> Result<ThemeSpec, ThemeError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| syntax_error(text, file, &e))?;
        let mut base = Theme::black(name);
        let keys: Vec<String> = base.slots().into_iter().map(|(k, _)| k).collect();
        for (key, slot) in base.slots() {
            let value = lookup(&table, &key).ok_or_else(|| ThemeError::MissingKey { file: file.to_string(), key: key.clone() })?;
            *slot = colour_value(value, file, &key, false)?;
        }
        let mut spec = ThemeSpec { base, xterm256: Vec::new(), ansi16: Vec::new() };
        for (section, inner) in &table {
            let depth = match section.as_str() {
                "xterm256" => Some(false),
                "ansi16" => Some(true),
                _ => None,
            };
            let Some(basic_only) = depth else {
                check_known(inner, section, &keys, file)?;
                continue;
            };
            let mut overrides = Vec::new();
            for key in &keys {
                let full = format!("{section}.{key}");
                if let Some(value) = lookup(inner.as_table().unwrap_or(&toml::Table::new()), key) {
                    overrides.push((key.clone(), colour_value(value, file, &full, basic_only)?));
                }
            }
            match inner.as_table() {
                Some(t) => {
                    for (sub, v) in t {
                        check_known(v, &format!("{section}.{sub}"), &keys.iter().map(|k| format!("{section}.{k}")).collect::<Vec<_>>(), file)?;
                    }
                }
                None => return Err(ThemeError::UnknownKey { file: file.to_string(), key: section.clone() }),
            }
            if basic_only {
                spec.ansi16 = overrides;
            } else {
                spec.xterm256 = overrides;
            }
        }
        Ok(spec)
    }

    /// The palette for a terminal of `depth`: the depth's own choices, and the rest rounded
    /// to the nearest colour it has.
    pub fn at(&self, depth: ColorSupport) -> Theme {
        let mut t = self.base.clone();
        t.depth = depth;
        let overrides = match depth {
            ColorSupport::TrueColor => return t,
            ColorSupport::Palette256 => &self.xterm256,
            ColorSupport::Ansi16 => &self.ansi16,
        };
        for (key, slot) in t.slots() {
            if let Some((_, c)) = overrides.iter().find(|(k, _)| *k == key) {
                *slot = *c;
            }
            *slot = match (depth, *slot) {
                (ColorSupport::Palette256, Color::Rgb(r, g, b)) => Color::Indexed(nearest_xterm256(r, g, b)),
                (ColorSupport::Ansi16, c @ (Color::Rgb(..) | Color::Indexed(_))) => rgb(c).map_or(c, nearest_basic),
                (_, c) => c,
            };
        }
        t
    }
}

fn syntax_error(text: &str, file: &str, e: &toml::de::Error) -> ThemeError {
    let span = e.span().unwrap_or(0..0);
    let near = text.get(span.clone()).unwrap_or("").lines().next().unwrap_or("");
    ThemeError::Syntax {
        file: file.to_string(),
        line: text[..span.start].matches('\n').count() + 1,
        near: match near {
            "" => "end of input".into(),
            n => format!("'{}'", n.chars().take(40).collect::<String>()),
        },
        message: e.message().trim().to_string(),
    }
}

/// `section.name` in a table.
fn lookup<'a>(table: &'a toml::Table, key: &str) -> Option<&'a toml::Value> {
    let (section, name) = key.split_once('.').expect("slot keys are section.name");
    table.get(section).and_then(|s| s.get(name))
}

/// Every key under `section` is one of `known` (full `section.key` names).
fn check_known(inner: &toml::Value, section: &str, known: &[String], file: &str) -> Result<(), ThemeError> {
    let keys: Vec<String> = match inner.as_table() {
        Some(t) => t.keys().map(|k| format!("{section}.{k}")).collect(),
        None => vec![section.to_string()],
    };
    match keys.into_iter().find(|k| !known.contains(k)) {
        Some(key) => Err(ThemeError::UnknownKey { file: file.to_string(), key }),
        None => Ok(()),
    }
}

/// A colour value: "#rrggbb", a basic name, or an xterm index; only names when
/// `basic_only`.
fn colour_value(value: &toml::Value, file: &str, key: &str, basic_only: bool) -> Result<Color, ThemeError> {
    let shown = value.to_string().trim_matches('"').to_string();
    let parsed = match value {
        toml::Value::String(s) => parse_colour(s),
        toml::Value::Integer(i) => u8::try_from(*i).ok().map(Color::Indexed),
        _ => None,
    };
    let names = || NAMED.map(|(n, _)| n).join(", ");
    match parsed {
        Some(c) if basic_only && !(c == Color::Reset || BASIC.contains(&c)) => {
            Err(ThemeError::NotBasic { file: file.to_string(), key: key.to_string(), value: shown, names: names() })
        }
        Some(c) => Ok(c),
        None => Err(ThemeError::BadColour { file: file.to_string(), key: key.to_string(), value: shown, names: names() }),
    }
}

impl Theme {
    pub fn category(&self, c: Category) -> Color {
        self.categories[c as usize]
    }

    /// A category's colour by name: torch.profiler's by their own; others (the frame rules'
    /// attention, mlp...) in turn by their place among the names, never the grey of
    /// unknown, which `unmatched` shares.
    pub fn category_named(&self, name: &str, index: usize) -> Color {
        match Category::parse(name) {
            Some(c) => self.category(c),
            None if name == vramscope_core::report::frame_rules::UNMATCHED => self.category(Category::Unknown),
            None => self.categories[index % (self.categories.len() - 1)],
        }
    }

    pub fn phase(&self, p: Phase) -> Option<Color> {
        self.phases[p as usize]
    }

    /// A built-in theme or a theme file, in its truecolor palette.
    pub fn load(name_or_path: &str) -> Result<Theme, ThemeError> {
        Theme::load_at(name_or_path, ColorSupport::TrueColor)
    }

    /// A built-in theme or a theme file, as a terminal of `depth` shows it.
    pub fn load_at(name_or_path: &str, depth: ColorSupport) -> Result<Theme, ThemeError> {
        Ok(ThemeSpec::load(name_or_path)?.at(depth))
    }

    /// `first` (a built-in name or a file), then the other built-ins, each as this terminal
    /// can show it: the order the `t` key cycles through.
    pub fn cycle(first: &str) -> Result<Vec<Theme>, ThemeError> {
        let depth = ColorSupport::detect()?;
        let mut themes = vec![Theme::load_at(first, depth)?];
        for (name, _) in BUILTIN.iter().filter(|(n, _)| *n != first) {
            themes.push(Theme::load_at(name, depth)?);
        }
        Ok(themes)
    }

    /// "dark · 256 colours": what `t` switched to.
    pub fn label(&self) -> String {
        format!("{} · {}", self.name, self.depth.as_str())
    }

    /// Whether phases shade the whole plot behind the bands, or only the phase row: the 16
    /// basic colours have too few dark shades for bands to stand out on them.
    pub fn shades_plot(&self) -> bool {
        !self.phases.iter().flatten().all(|c| BASIC.contains(c))
    }

    /// The plot background under phase `p`.
    pub fn plot_shade(&self, p: Phase) -> Color {
        match self.phase(p) {
            Some(c) if self.shades_plot() => c,
            _ => self.ui.background,
        }
    }

    /// The text colour that reads best on `bg`: the theme's text or its background.
    pub fn text_on(&self, bg: Color) -> Color {
        let on = |c| contrast(c, bg).unwrap_or(0.0);
        if on(self.ui.background) > on(self.ui.text) {
            self.ui.background
        } else {
            self.ui.text
        }
    }

    /// Every pair of colours the screens draw one on the other, with the contrast it needs:
    /// text on its background, bands and lines on the phase shades they cross.
    pub fn contrast_pairs(&self) -> Vec<ContrastPair> {
        let mut out = Vec::new();
        let mut pair = |what: String, fg: Color, bg: Color, min: f64| out.push(ContrastPair { what, fg, bg, min });
        let ui = &self.ui;
        let bg = ui.background;
        let texts = [("ui.text", ui.text), ("ui.dim", ui.dim), ("ui.title", ui.title), ("ui.accent", ui.accent), ("ui.warning", ui.warning), ("ui.error", ui.error), ("chart.peak", self.chart.peak)];
        for (k, c) in texts {
            pair(format!("{k} text on ui.background"), c, bg, TEXT_CONTRAST);
        }
        pair("ui.text on ui.selection (selected row)".into(), ui.text, ui.selection, TEXT_CONTRAST);
        pair("chart.gauge_fill on ui.background".into(), self.chart.gauge_fill, bg, GRAPHIC_CONTRAST);
        // Bands, lines and step marks, on every shade the plot has.
        let mut grounds = vec![("ui.background".to_string(), bg)];
        if self.shades_plot() {
            grounds.extend(Phase::ALL.iter().filter_map(|p| Some((format!("phase.{}", p.as_str()), self.phase(*p)?))));
        }
        for (ground, g) in &grounds {
            for c in Category::ALL {
                pair(format!("category.{} band on {ground}", c.as_str()), self.category(c), *g, GRAPHIC_CONTRAST);
            }
            let lines = [("chart.reserved", self.chart.reserved), ("chart.device_used", self.chart.device_used), ("chart.small_allocations", self.chart.small_allocations), ("ui.dim step line", ui.dim)];
            for (k, c) in lines {
                pair(format!("{k} on {ground}"), c, *g, GRAPHIC_CONTRAST);
            }
            // Labels inside the plot: phase letters, markers, the peak.
            for (k, c) in [("ui.text", ui.text), ("ui.accent marker", ui.accent), ("ui.error marker", ui.error), ("chart.peak label", self.chart.peak)] {
                pair(format!("{k} on {ground}"), c, *g, TEXT_CONTRAST);
            }
        }
        // The phase row's letters, on each phase's own colour.
        for p in Phase::ALL {
            if let Some(s) = self.phase(p) {
                pair(format!("phase letter on phase.{}", p.as_str()), self.text_on(s), s, TEXT_CONTRAST);
            }
        }
        out
    }

    /// Placeholder every slot overwrites while parsing.
    fn black(name: &str) -> Theme {
        let c = Color::Black;
        Theme {
            name: name.to_string(),
            depth: ColorSupport::TrueColor,
            ui: UiColors { background: c, text: c, dim: c, border: c, title: c, accent: c, warning: c, error: c, selection: c },
            chart: ChartColors { reserved: c, device_used: c, peak: c, gauge_fill: c, gauge_empty: c, small_allocations: c },
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
            ("chart.small_allocations".into(), &mut ch.small_allocations),
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
}

impl Default for Theme {
    fn default() -> Theme {
        Theme::load(BUILTIN[0].0).expect("the built-in dark theme parses")
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

impl ColorSupport {
    pub const ALL: [ColorSupport; 3] = [ColorSupport::TrueColor, ColorSupport::Palette256, ColorSupport::Ansi16];

    pub fn as_str(self) -> &'static str {
        match self {
            ColorSupport::TrueColor => "truecolor",
            ColorSupport::Palette256 => "256 colours",
            ColorSupport::Ansi16 => "16 colours",
        }
    }

    /// From `VRAMSCOPE_COLORS` (wins), `COLORTERM` (only `truecolor`/`24bit` promise RGB)
    /// and `TERM`: `*256color*` gives 256, the classic terminals (`linux`, `vt100`, plain
    /// `xterm`, `screen`…) 16, anything else 256.
    pub fn from_env(forced: Option<&str>, colorterm: Option<&str>, term: Option<&str>) -> Result<ColorSupport, ThemeError> {
        if let Some(f) = forced.filter(|f| !f.is_empty()) {
            return match f.to_ascii_lowercase().as_str() {
                "truecolor" | "24bit" => Ok(ColorSupport::TrueColor),
                "256" => Ok(ColorSupport::Palette256),
                "16" => Ok(ColorSupport::Ansi16),
                _ => Err(ThemeError::BadDepth { value: f.to_string() }),
            };
        }
        if let Some("truecolor" | "24bit") = colorterm.map(str::to_ascii_lowercase).as_deref() {
            return Ok(ColorSupport::TrueColor);
        }
        let term = term.unwrap_or("").to_ascii_lowercase();
        const CLASSIC: [&str; 10] = ["linux", "vt100", "vt102", "vt220", "ansi", "cons25", "xterm", "screen", "tmux", "rxvt"];
        Ok(if term.contains("256color") {
            ColorSupport::Palette256
        } else if term.ends_with("-direct") {
            ColorSupport::TrueColor
        } else if term.contains("16color") || term.ends_with("-color") || CLASSIC.contains(&term.as_str()) {
            ColorSupport::Ansi16
        } else {
            ColorSupport::Palette256
        })
    }

    pub fn detect() -> Result<ColorSupport, ThemeError> {
        let var = |k: &str| std::env::var(k).ok();
        ColorSupport::from_env(var(COLORS_ENV).as_deref(), var("COLORTERM").as_deref(), var("TERM").as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_themes_load_and_differ() {
        let themes: Vec<Theme> = BUILTIN.iter().map(|(n, _)| Theme::load(n).unwrap()).collect();
        assert_eq!(Theme::default(), themes[0]);
        assert_ne!(themes[0], themes[1]);
        // ansi16 uses only the basic colours, so it looks the same on any terminal.
        for depth in ColorSupport::ALL {
            let mut ansi = Theme::load_at("ansi16", depth).unwrap();
            for (key, c) in ansi.slots() {
                assert!(BASIC.contains(c), "{key} is {c:?}");
            }
            assert!(!ansi.shades_plot(), "basic colours shade only the phase row");
        }
        assert!(themes[0].shades_plot());
    }

    #[test]
    fn dark_theme_keeps_torch_profiler_hues() {
        let t = Theme::default();
        // Green parameters, gold optimizer state, red activations, blue gradients: the hues
        // of torch.profiler's memory timeline, lightened to read on a dark background.
        let dominant = |c: Category| {
            let (r, g, b) = rgb(t.category(c)).unwrap();
            [(r, 'r'), (g, 'g'), (b, 'b')].iter().max().unwrap().1
        };
        assert_eq!(dominant(Category::Parameter), 'g');
        assert_eq!(dominant(Category::Activation), 'r');
        assert_eq!(dominant(Category::Gradient), 'b');
        let (r, g, b) = rgb(t.category(Category::OptimizerState)).unwrap();
        assert!(r > b && g > b, "gold");
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
        let err = |t: &str| ThemeSpec::parse(t, "my.toml", "my").unwrap_err().to_string();
        let gradient = with_line("gradient = \"#5b8cff\"", "gradient = \"navyish\"");
        let e = err(&gradient);
        assert!(e.starts_with("my.toml: key 'category.gradient': \"navyish\" is not a colour"), "{e}");
        assert_eq!(e.lines().count(), 1);

        let unknown = with_line("[phase]", "[phase]\nwarmup = \"#ffffff\"");
        assert_eq!(err(&unknown), "my.toml: unknown key 'phase.warmup'");
        let unknown = with_line("[xterm256.phase]", "[xterm256.phase]\nwarmup = 17");
        assert_eq!(err(&unknown), "my.toml: unknown key 'xterm256.phase.warmup'");

        let duplicate = with_line("[phase]", "[phase]\nforward = \"#ffffff\"");
        let line = 1 + duplicate.lines().position(|l| l == "[phase]").unwrap() + 2;
        assert_eq!(err(&duplicate), format!("my.toml: TOML syntax error at line {line}, at 'forward': duplicate key"));

        let missing = with_line("gradient = \"#5b8cff\"\n", "");
        assert_eq!(err(&missing), "my.toml: missing key 'category.gradient'");

        let number = with_line("forward = \"#14233a\"", "forward = 300");
        assert!(err(&number).starts_with("my.toml: key 'phase.forward': \"300\" is not a colour"), "{}", err(&number));
        let rgb16 = with_line("[ansi16.phase]", "[ansi16.phase]\nforward = \"#102030\"");
        let rgb16 = rgb16.replacen("forward = \"blue\"\n", "", 1);
        assert!(err(&rgb16).starts_with("my.toml: key 'ansi16.phase.forward': \"#102030\" is not one of the 16 basic colours"), "{}", err(&rgb16));
        assert!(matches!(Theme::load("/nonexistent/x.toml"), Err(ThemeError::NotFound { .. })));
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
    fn each_depth_gets_its_own_palette_and_rounds_the_rest() {
        let spec = ThemeSpec::load("dark").unwrap();
        let truecolor = spec.at(ColorSupport::TrueColor);
        assert!(matches!(truecolor.ui.background, Color::Rgb(..)));
        let mut p256 = spec.at(ColorSupport::Palette256);
        for (key, c) in p256.slots() {
            assert!(matches!(c, Color::Indexed(16..)), "{key} is {c:?} at 256 colours");
        }
        // The file's own choice, not the nearest colour (which is the grey 235 for all four).
        assert_eq!(p256.phase(Phase::Forward), Some(Color::Indexed(17)));
        assert_eq!(Color::Indexed(nearest_xterm256(0x14, 0x23, 0x3a)), Color::Indexed(235));
        let mut p16 = spec.at(ColorSupport::Ansi16);
        for (key, c) in p16.slots() {
            assert!(BASIC.contains(c), "{key} is {c:?} at 16 colours");
        }
        // A user theme with only a truecolor palette is rounded at each depth.
        let plain: String = BUILTIN[0].1.split("[xterm256.ui]").next().unwrap().to_string();
        let user = ThemeSpec::parse(&plain, "mine.toml", "mine").unwrap();
        assert_eq!(user.at(ColorSupport::Palette256).ui.background, Color::Indexed(nearest_xterm256(0x10, 0x14, 0x18)));
        assert_eq!(user.at(ColorSupport::Ansi16).ui.background, Color::Black);
        assert_eq!(user.at(ColorSupport::TrueColor).label(), "mine · truecolor");
    }

    #[test]
    fn colour_depth_from_the_environment() {
        let d = |f, c, t| ColorSupport::from_env(f, c, t).unwrap();
        assert_eq!(d(None, Some("truecolor"), Some("xterm-256color")), ColorSupport::TrueColor);
        assert_eq!(d(None, Some("24bit"), None), ColorSupport::TrueColor);
        assert_eq!(d(None, Some("yes"), Some("xterm-256color")), ColorSupport::Palette256);
        assert_eq!(d(None, None, Some("tmux-256color")), ColorSupport::Palette256);
        assert_eq!(d(None, None, Some("xterm-direct")), ColorSupport::TrueColor);
        assert_eq!(d(None, None, Some("linux")), ColorSupport::Ansi16);
        assert_eq!(d(None, None, Some("xterm")), ColorSupport::Ansi16);
        assert_eq!(d(None, None, Some("xterm-16color")), ColorSupport::Ansi16);
        assert_eq!(d(None, None, Some("alacritty")), ColorSupport::Palette256);
        assert_eq!(d(None, None, None), ColorSupport::Palette256);
        assert_eq!(d(Some("16"), Some("truecolor"), None), ColorSupport::Ansi16);
        assert_eq!(d(Some("truecolor"), None, Some("linux")), ColorSupport::TrueColor);
        let e = ColorSupport::from_env(Some("lots"), None, None).unwrap_err();
        assert_eq!(e.to_string(), "VRAMSCOPE_COLORS=\"lots\": expected truecolor, 256 or 16");
    }
}
