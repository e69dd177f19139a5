//! `vramscope export`: a snapshot's active-memory timeline as an SVG or PNG for a writeup —
//! memory_viz's stacked total, coloured by category where the snapshot records them, with
//! training phases shaded behind it, axes in GiB and a legend.

use std::io::{self, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;
use ratatui::style::Color as TermColor;
use thiserror::Error;

use vramscope_core::event::{Category, Phase};
use vramscope_core::format::bytes;
use crate::theme::Theme;
use vramscope_core::report::findings::SizeHistogram;
use vramscope_core::snapshot::model::Snapshot;
use vramscope_core::snapshot::timeline::Timeline;
use vramscope_core::snapshot::writer::{save_atomic, WriteError};

#[derive(Debug, Error)]
pub enum ExportError {
    #[error("cannot tell the image format of {0}: the name must end in .svg or .png")]
    UnknownFormat(PathBuf),
    #[error("drawing the timeline failed: {0}")]
    Draw(String),
    #[error("no TrueType font found for the labels (looked at {0}); set VRAMSCOPE_FONT to a .ttf file")]
    NoFont(String),
    #[error(transparent)]
    Write(#[from] WriteError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageFormat {
    Svg,
    Png,
}

impl ImageFormat {
    pub fn of(path: &Path) -> Result<ImageFormat, ExportError> {
        match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("svg") => Ok(ImageFormat::Svg),
            Some("png") => Ok(ImageFormat::Png),
            _ => Err(ExportError::UnknownFormat(path.to_path_buf())),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ExportOptions {
    pub width: u32,
    pub height: u32,
    pub device: usize,
    /// Caption; the peak is appended.
    pub title: String,
}

impl Default for ExportOptions {
    /// 1200 × 600: two to one, readable at a page's width.
    fn default() -> Self {
        ExportOptions { width: 1200, height: 600, device: 0, title: "Active memory timeline".into() }
    }
}

const FONT: &str = "sans-serif";
const FONT_PATHS: [&str; 7] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "/Library/Fonts/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Labels are laid out with a real font's metrics (both formats) and drawn with it (PNG):
/// the first usable system font, or VRAMSCOPE_FONT. Loaded once per process.
fn ensure_font() -> Result<(), ExportError> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let env = std::env::var("VRAMSCOPE_FONT").ok();
            for p in env.iter().map(String::as_str).chain(FONT_PATHS) {
                if let Ok(data) = std::fs::read(p) {
                    // plotters keeps fonts for the life of the process.
                    let data: &'static [u8] = Box::leak(data.into_boxed_slice());
                    if plotters::style::register_font(FONT, FontStyle::Normal, data).is_ok() {
                        return Ok(());
                    }
                }
            }
            Err(env.into_iter().chain(FONT_PATHS.map(String::from)).collect::<Vec<_>>().join(", "))
        })
        .clone()
        .map_err(ExportError::NoFont)
}

fn rgb(c: TermColor) -> RGBColor {
    match c {
        TermColor::Rgb(r, g, b) => RGBColor(r, g, b),
        TermColor::Black => BLACK,
        _ => RGBColor(128, 128, 128),
    }
}

/// A phase's stretch of the x axis (action indices).
struct Shade {
    phase: Phase,
    span: Range<f64>,
}

/// Phases from the snapshot's "forward (step N)" START/END annotations, placed on the
/// action axis through the trace's timestamps.
fn shades(snap: &Snapshot, tl: &Timeline, device: usize) -> Vec<Shade> {
    let trace = snap.trace(device);
    let action_at = |time_us: i64| {
        let entry = trace.partition_point(|e| e.time_us < time_us);
        tl.event_positions.partition_point(|p| *p < entry) as f64
    };
    snap.annotation_spans(device)
        .into_iter()
        .filter_map(|(name, a, b)| Phase::of_annotation(name).map(|(phase, _)| Shade { phase, span: action_at(a)..action_at(b) }))
        .collect()
}

/// Pixels for the legend strip.
const LEGEND_WIDTH: u32 = 190;
const GIB: f64 = (1u64 << 30) as f64;

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, snap: &Snapshot, o: &ExportOptions) -> Result<(), ExportError>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| ExportError::Draw(e.to_string());
    let theme = Theme::load("light").expect("the built-in light theme parses");
    let tl = Timeline::from_snapshot(snap, o.device);
    let total = tl.total_events.max(1);
    let buckets = total.min(o.width as usize);
    let x_of = |k: usize| (k * total) as f64 / buckets as f64;
    let peak = tl.peak_bytes as f64 / GIB;
    let y_max = (peak * 1.1).max(1e-6);

    root.fill(&WHITE).map_err(err)?;
    // The exact bytes too, as memory_viz prints them, so the figure can be matched.
    let caption = format!("{} — active peak {} ({} bytes)", o.title, bytes(tl.peak_bytes), tl.peak_bytes);
    let root = root.titled(&caption, (FONT, 22)).map_err(err)?;
    // The legend gets its own strip at the right so it never hides the data.
    let (plot, side) = root.split_horizontally(o.width.saturating_sub(LEGEND_WIDTH));
    let mut legend: Vec<(String, RGBColor)> = Vec::new();
    let mut chart = ChartBuilder::on(&plot)
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(0f64..total as f64, 0f64..y_max)
        .map_err(err)?;
    // Enough decimals that small (CPU) snapshots still get distinct ticks.
    let decimals = if y_max >= 10.0 { 0 } else if y_max >= 1.0 { 1 } else { (-(y_max.log10())).ceil() as usize + 1 };
    chart
        .configure_mesh()
        .x_desc("allocator events (allocations and frees, in order)")
        .y_desc("active memory (GiB)")
        .y_label_formatter(&|v| format!("{v:.decimals$}"))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(err)?;

    let shades = shades(snap, &tl, o.device);
    for phase in Phase::ALL {
        let Some(colour) = theme.phase(phase).map(rgb) else { continue };
        let spans: Vec<_> = shades.iter().filter(|s| s.phase == phase).collect();
        if spans.is_empty() {
            continue;
        }
        chart
            .draw_series(spans.iter().map(|s| Rectangle::new([(s.span.start, 0.0), (s.span.end, y_max)], colour.filled())))
            .map_err(err)?;
        legend.push((format!("{} (phase)", phase.as_str()), colour));
    }

    // Stack categories in torch.profiler's order (parameters at the bottom, unknown on top);
    // each area is drawn from its cumulative top, topmost first, so lower ones paint over.
    let per_bucket = tl.category_series(0, total, buckets);
    let rank = |name: &String| Category::parse(name).map_or(Category::ALL.len(), |c| c as usize);
    let mut used: Vec<usize> = (0..tl.categories.len()).filter(|ci| per_bucket.iter().any(|v| v[*ci] > 0)).collect();
    used.sort_by_key(|ci| rank(&tl.categories[*ci]));
    let mut tops: Vec<Vec<f64>> = vec![Vec::new(); tl.categories.len()];
    let mut below = vec![0.0; buckets];
    for &ci in &used {
        below = below.iter().zip(&per_bucket).map(|(b, v)| b + v[ci] as f64 / GIB).collect();
        tops[ci] = below.clone();
    }
    let mut category_legend = Vec::new();
    for &ci in used.iter().rev() {
        let name = &tl.categories[ci];
        let colour = rgb(theme.category_named(name, ci));
        // With only unknown memory (a snapshot without categories) the area is the total.
        let label = if used.len() == 1 && name == "unknown" { "active memory".to_string() } else { name.clone() };
        let colour = if used.len() == 1 { RGBColor(70, 130, 180) } else { colour };
        let points = (0..buckets).flat_map(|k| [(x_of(k), tops[ci][k]), (x_of(k + 1), tops[ci][k])]);
        chart
            .draw_series(AreaSeries::new(points, 0.0, colour.mix(0.85)).border_style(colour))
            .map_err(err)?;
        category_legend.push((label, colour));
    }
    // Categories top to bottom as stacked, then the phases.
    category_legend.append(&mut legend);
    for (i, (name, colour)) in category_legend.iter().enumerate() {
        let y = 24 + 22 * i as i32;
        side.draw(&Rectangle::new([(4, y), (18, y + 14)], colour.filled())).map_err(err)?;
        side.draw(&Rectangle::new([(4, y), (18, y + 14)], BLACK.mix(0.4))).map_err(err)?;
        side.draw(&Text::new(name.clone(), (24, y), (FONT, 14))).map_err(err)?;
    }
    root.present().map_err(err)
}

/// Something drawn into an image of either format.
trait Drawing {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), ExportError>
    where
        DB::ErrorType: 'static;
}

/// The timeline of a snapshot's device.
struct TimelineDrawing<'a>(&'a Snapshot, &'a ExportOptions);

impl Drawing for TimelineDrawing<'_> {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), ExportError>
    where
        DB::ErrorType: 'static,
    {
        draw(root, self.0, self.1)
    }
}

fn render(d: &impl Drawing, format: ImageFormat, (width, height): (u32, u32)) -> Result<Vec<u8>, ExportError> {
    ensure_font()?;
    if format == ImageFormat::Svg {
        let mut s = String::new();
        d.draw(SVGBackend::with_string(&mut s, (width, height)).into_drawing_area())?;
        return Ok(s.into_bytes());
    }
    let mut rgb = vec![0u8; width as usize * height as usize * 3];
    d.draw(BitMapBackend::with_buffer(&mut rgb, (width, height)).into_drawing_area())?;
    let mut png = Vec::new();
    image::ImageEncoder::write_image(image::codecs::png::PngEncoder::new(&mut png), &rgb, width, height, image::ColorType::Rgb8)
        .map_err(|e| ExportError::Draw(e.to_string()))?;
    Ok(png)
}

pub fn render_svg(snap: &Snapshot, o: &ExportOptions) -> Result<String, ExportError> {
    let svg = render(&TimelineDrawing(snap, o), ImageFormat::Svg, (o.width, o.height))?;
    Ok(String::from_utf8(svg).expect("plotters writes SVG as text"))
}

fn save(path: &Path, data: &[u8]) -> Result<PathBuf, ExportError> {
    Ok(save_atomic(path, |w: &mut io::BufWriter<std::fs::File>| w.write_all(data))?)
}

/// Renders to `path` (format from its extension), atomically and never over an existing file.
pub fn export(snap: &Snapshot, path: &Path, o: &ExportOptions) -> Result<PathBuf, ExportError> {
    save(path, &render(&TimelineDrawing(snap, o), ImageFormat::of(path)?, (o.width, o.height))?)
}

/// Bar charts of size histograms side by side, each with its title.
struct Histograms<'a>(&'a [(&'a str, &'a SizeHistogram)]);

impl Drawing for Histograms<'_> {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), ExportError>
    where
        DB::ErrorType: 'static,
    {
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| ExportError::Draw(e.to_string());
        root.fill(&WHITE).map_err(err)?;
        for (area, (title, h)) in root.split_evenly((1, self.0.len().max(1))).iter().zip(self.0) {
            let n = h.buckets.len().max(1) as f64;
            let y_max = h.buckets.iter().map(|b| b.1).max().unwrap_or(1) as f64 * 1.1;
            let labels: Vec<String> = h.buckets.iter().map(|b| format!("≤{}", bytes(b.0))).collect();
            let mut chart = ChartBuilder::on(area).caption(*title, (FONT, 18)).margin(12).x_label_area_size(56).y_label_area_size(56).build_cartesian_2d(0f64..n, 0f64..y_max).map_err(err)?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(h.buckets.len().clamp(1, 12))
                .x_label_formatter(&|x| labels.get(x.floor() as usize).cloned().unwrap_or_default())
                .y_desc("count")
                .y_label_formatter(&|v| format!("{v:.0}"))
                .label_style((FONT, 12))
                .axis_desc_style((FONT, 14))
                .draw()
                .map_err(err)?;
            chart
                .draw_series(h.buckets.iter().enumerate().map(|(i, b)| Rectangle::new([(i as f64 + 0.1, 0.0), (i as f64 + 0.9, b.1 as f64)], RGBColor(70, 130, 180).filled())))
                .map_err(err)?;
        }
        root.present().map_err(err)
    }
}

/// The histograms as an image at `path` (format from its extension), never over a file.
pub fn export_histograms(hists: &[(&str, &SizeHistogram)], path: &Path, size: (u32, u32)) -> Result<PathBuf, ExportError> {
    save(path, &render(&Histograms(hists), ImageFormat::of(path)?, size)?)
}
