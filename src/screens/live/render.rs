//! The live screen: header, active-memory timeline, side panel, largest live allocations,
//! event log. One pure render function per panel, given the store, the view and the theme.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table, Wrap};
use ratatui::Frame;

use vramscope_core::event::{Category, Phase};
use vramscope_core::source::gauges::history::Metric;
use vramscope_core::source::gauges::sample::SourceKind;
use crate::draw::axis::ByteAxis;
use vramscope_core::format::seconds;
use crate::chrome::fields::{fit_line, Field, Keep};
use crate::draw::text::fit;
use vramscope_core::format::bytes;
use vramscope_core::store::ranks::RankSummary;
use vramscope_core::store::{Column, LiveAlloc, LogKind, LogLine, Store};
use super::keys::LiveKey;
use super::view::View;
use crate::chrome;
use crate::chrome::footer::key_hints;
use crate::chrome::help::render_help_rows;
use crate::chrome::overlay::overlay;
use crate::keys::KeyMap;

use crate::theme::Theme;

pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 18;

/// Categories from the bottom of the stack up: what lives longest sits lowest.
const STACK_ORDER: [Category; 8] = [
    Category::Parameter,
    Category::OptimizerState,
    Category::Gradient,
    Category::Input,
    Category::Activation,
    Category::AutogradDetail,
    Category::Temporary,
    Category::Unknown,
];

/// The screen of `store` (the rank shown), with the other ranks summed up in `ranks`.
pub fn render_live(f: &mut Frame, store: &Store, ranks: &RankSummary, view: &View, keys: &KeyMap<LiveKey>, theme: &Theme) {
    let Some(area) = chrome::screen(f, (MIN_WIDTH, MIN_HEIGHT), theme) else { return };
    let side_w = if area.width >= 120 { 34 } else { 26 };
    let table_h = if area.height >= 40 { 12 } else { 6 };
    let [header, middle, table, log] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Min(8),
        Constraint::Length(table_h),
        Constraint::Length(2),
    ])
    .areas(area);
    let [timeline, side] = Layout::horizontal([Constraint::Min(30), Constraint::Length(side_w)]).areas(middle);
    render_header(f, header, store, ranks, theme);
    render_timeline(f, timeline, store, view, theme);
    render_side(f, side, store, view, theme);
    render_table(f, table, store, view, theme);
    render_log(f, log, store, view, keys, theme);
    if view.inspect {
        render_inspector(f, area, store, view, theme);
    }
    if let Some(up) = view.log {
        render_event_log(f, area, store, up, theme);
    }
    if view.help {
        let replay = is_replay(store);
        render_help_rows(f, area, keys.help_rows_with(|a| a.offered(replay).then(|| a.help_for(replay))), theme);
    }
}

/// A replay (it has a title) rather than a running job: its keys differ.
fn is_replay(store: &Store) -> bool {
    store.title.is_some()
}

/// What the job is and runs with, as header fields: vramscope's model and its knobs, or a
/// user's script, the knobs it declared, and the allocator settings.
fn job_fields(info: &vramscope_core::stream::EngineInfo, val: Style, title: Style) -> Vec<Field> {
    let params = format!("{:.1}M params", info.parameters as f64 / 1e6);
    // bf16 says whose autocast op lists it follows: a modelled GPU can follow either.
    let precision = |keep, prefix: &str, p: &str| {
        let short = format!("{prefix}{p}");
        match p.parse::<vramscope_core::step_config::Precision>() {
            Ok(parsed) => Field::text(keep, format!("{prefix}{}", parsed.label(info.autocast)), val).or_text_losing(Keep::Low, short),
            Err(_) => Field::text(keep, short, val),
        }
    };
    let name = info.config.as_ref().map_or(&info.name, |c| &c.model_name);
    let mut fields = vec![Field::new(Keep::Must, vec![Span::styled("vramscope ", title), Span::styled(format!("{name} ({params})"), val)])
        .or_losing(Keep::Least, vec![Span::styled(format!("{name} ({params})"), val)])
        .or_losing(Keep::Low, vec![Span::styled(name.clone(), val)])];
    match &info.config {
        Some(c) => {
            fields.push(precision(Keep::High, "", c.precision.as_str()));
            fields.push(Field::text(Keep::High, format!("ctx {}", c.ctx), val));
            fields.push(Field::text(Keep::High, format!("batch {}", c.batch), val));
            fields.push(Field::text(Keep::Mid, c.mode.to_string(), val));
            fields.push(Field::text(Keep::Low, c.attention.to_string(), val));
            fields.push(Field::text(Keep::Least, format!("{} AdamW", c.optimizer), val));
            if c.checkpointing != vramscope_core::step_config::Checkpointing::None {
                fields.push(Field::text(Keep::Low, c.checkpointing.label(), val));
            }
        }
        None => fields.extend(info.knobs.iter().map(|k| match k.name.as_str() {
            "precision" => precision(Keep::High, "precision ", &k.value),
            _ => Field::text(Keep::Mid, format!("{} {}", k.name, k.value), val),
        })),
    }
    if !info.alloc_conf.is_empty() {
        fields.push(Field::text(Keep::Least, info.alloc_conf.clone(), val));
    }
    fields
}

pub fn render_header(f: &mut Frame, area: Rect, store: &Store, ranks: &RankSummary, theme: &Theme) {
    let dim = Style::default().fg(theme.ui.dim);
    let val = Style::default().fg(theme.ui.text).add_modifier(Modifier::BOLD);
    let accent = Style::default().fg(theme.ui.accent).add_modifier(Modifier::BOLD);
    let width = area.width as usize;
    let devices = (ranks.devices.len() > 1).then(|| {
        Field::text(Keep::High, format!("device {} of {} ({})", ranks.device_shown + 1, ranks.devices.len(), ranks.devices.join(" ")), accent)
            .or_text_losing(Keep::Low, format!("device {} of {}", ranks.device_shown + 1, ranks.devices.len()))
    });
    let Some(info) = &store.info else {
        let what = store.title.as_deref().unwrap_or("starting the job…");
        let fields = [Some(Field::text(Keep::Must, format!("vramscope · {what}"), dim)), devices].into_iter().flatten().collect();
        f.render_widget(Paragraph::new(fit_line(fields, width, Span::styled(" · ", dim))), area);
        return;
    };
    let device = match info.cuda {
        true => Field::text(Keep::Must, info.device.clone(), val),
        false => Field::text(Keep::Must, format!("{} (GPU modelled)", info.device), val)
            .or_losing(Keep::Least, vec![Span::styled(format!("{} (modelled)", info.device), val)])
            .or_losing(Keep::Mid, vec![Span::styled(info.device.clone(), val)]),
    };
    let mut line1 = job_fields(info, val, Style::default().fg(theme.ui.title).add_modifier(Modifier::BOLD));
    line1.insert(1, device);
    line1.extend(devices);
    if ranks.count > 1 {
        line1.push(Field::text(Keep::Must, format!("rank {} of {}", ranks.shown, ranks.count), accent));
        let peaks: Vec<String> = ranks.peaks.iter().map(|p| format!("r{} {}", p.rank, bytes(p.peak))).collect();
        line1.push(Field::text(Keep::Least, format!("peaks {}", peaks.join(" ")), val));
        if let Some(skew) = ranks.skew {
            line1.push(Field::text(Keep::Mid, format!("skew {skew:.2}×"), if skew > 1.1 { Style::default().fg(theme.ui.warning) } else { val }));
        }
    }
    let last = store.last_step();
    let mut line2 = Vec::new();
    // Recording stays in sight, first on the line, for as long as it lasts.
    if let Some(p) = &ranks.recording {
        let rec = Style::default().fg(theme.ui.error).add_modifier(Modifier::BOLD);
        line2.push(Field::text(Keep::Must, format!("● REC {}", p.display()), rec).or_text_losing(Keep::Low, "● REC"));
    }
    line2.push(Field::text(Keep::Must, format!("step {}", store.step_now()), val));
    line2.push(Field::new(Keep::High, vec![Span::styled("phase ", dim), phase_span(store.current_phase(), theme)]).or_losing(Keep::Least, vec![phase_span(store.current_phase(), theme)]));
    if let Some(s) = last {
        line2.push(Field::text(Keep::Mid, format!("{:.2} s/step", s.step_time_s), val));
        line2.push(Field::text(Keep::Low, s.throughput(), val));
    }
    let dropped = last.map(|s| s.dropped_events).unwrap_or(0) + store.lost_events;
    if dropped > 0 {
        // The step reports' figures stay exact; what the events draw (the timeline, the
        // table) misses what was lost.
        let warn = Style::default().fg(theme.ui.warning);
        line2.push(
            Field::text(Keep::High, format!("capture dropping: {dropped} events lost (figures at step end exact; timeline and table incomplete)"), warn)
                .or_text_losing(Keep::Low, format!("capture dropping: {dropped} events lost"))
                .or_text_losing(Keep::Mid, format!("{dropped} events lost")),
        );
    } else {
        line2.push(Field::text(Keep::Least, "capture ok", dim));
    }
    if let Some(t) = &store.title {
        line2.push(Field::text(Keep::Mid, t.clone(), Style::default().fg(theme.ui.accent)));
    }
    let state = if store.oom.is_some() {
        Some(Field::text(Keep::Must, "OUT OF MEMORY", Style::default().fg(theme.ui.error).add_modifier(Modifier::BOLD)).or_text_losing(Keep::Low, "OOM"))
    } else if store.paused {
        Some(Field::text(Keep::Must, "PAUSED", Style::default().fg(theme.ui.warning).add_modifier(Modifier::BOLD)))
    } else if let Some((how, false)) = &store.exited {
        Some(Field::text(Keep::Must, format!("CRASHED ({how})"), Style::default().fg(theme.ui.error).add_modifier(Modifier::BOLD)).or_text_losing(Keep::Mid, "CRASHED"))
    } else if store.finished {
        Some(Field::text(Keep::High, "finished", dim))
    } else {
        None
    };
    line2.extend(state);
    let sep = || Span::styled(" · ", dim);
    f.render_widget(Paragraph::new(vec![fit_line(line1, width, sep()), fit_line(line2, width, sep())]), area);
}

/// A phase's name on its own shade, as the phase row draws it.
fn phase_span(p: Phase, theme: &Theme) -> Span<'static> {
    match theme.phase(p) {
        Some(bg) => Span::styled(format!(" {} ", p.as_str()), Style::default().fg(theme.text_on(bg)).bg(bg).add_modifier(Modifier::BOLD)),
        None => Span::styled(p.as_str(), Style::default().fg(theme.ui.text).add_modifier(Modifier::BOLD)),
    }
}

const EIGHTHS: [char; 8] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇'];
/// Width of the y labels ("0.75 GiB") and the space after them.
const AXIS_W: u16 = 9;

/// How a band fills its cells: solid, or shaded (neighbouring allocations alternate, so each
/// band stays distinct in its category's colour), or the summed small allocations.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fill {
    Solid,
    Shaded,
    Summed,
}

impl Fill {
    fn glyph(self) -> char {
        match self {
            Fill::Solid => '█',
            Fill::Shaded => '▓',
            Fill::Summed => '░',
        }
    }
}

/// Column boundaries over [from, to): equal numbers of events, or equal spans of time.
fn column_bounds(store: &Store, from: u64, to: u64, width: usize, time_axis: bool) -> Vec<u64> {
    let n = width.max(1) as u64;
    let span = to - from;
    let t = |i: u64| store.history.get(i).map(|e| e.t_ns);
    match (time_axis, t(from), t(to.saturating_sub(1))) {
        (true, Some(t0), Some(t1)) if t1 > t0 => (0..=n)
            .map(|k| match k {
                0 => from,
                k if k == n => to,
                k => store.history.index_at_time(t0 + (t1 - t0) * k / n).clamp(from, to),
            })
            .collect(),
        _ => (0..=n).map(|k| from + span * k / n).collect(),
    }
}

/// The column (0-based) holding history index `i`.
fn column_of(bounds: &[u64], i: u64) -> u16 {
    let k = bounds.partition_point(|b| *b <= i).saturating_sub(1);
    k.min(bounds.len().saturating_sub(2)) as u16
}

pub fn render_timeline(f: &mut Frame, area: Rect, store: &Store, view: &View, theme: &Theme) {
    let (from, to) = view.range(store.history.start(), store.history.end());
    let mode = if view.by_category { "by category" } else { "by allocation" };
    let state = if view.frozen {
        "frozen (still ingesting)"
    } else if view.following() {
        "live"
    } else {
        "panned (end: live)"
    };
    let t = |i: u64| store.history.get(i).map_or(0, |e| e.t_ns);
    let x_range = if view.time_axis {
        format!("{}–{}", seconds(t(from)), seconds(t(to.saturating_sub(1))))
    } else {
        format!("events {from}–{to}")
    };
    let title = format!(" active memory · {mode} · {x_range} · {state} ");
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(Style::default().fg(theme.ui.border))
        .title(Span::styled(title, Style::default().fg(theme.ui.title)));
    let inner = block.inner(area);
    f.render_widget(block, area);
    if inner.width < AXIS_W + 4 || inner.height < 5 {
        return;
    }
    // The plot, then the phase row and the step axis under it.
    let plot = Rect { x: inner.x + AXIS_W, y: inner.y, width: inner.width - AXIS_W, height: inner.height - 2 };
    let ribbon_y = plot.y + plot.height;
    let axis_y = ribbon_y + 1;
    let bounds = column_bounds(store, from, to, plot.width as usize, view.time_axis);
    let cols = store.history.columns_at(&bounds);
    let phases: Vec<Phase> = bounds.windows(2).map(|w| store.dominant_phase(w[0], w[1])).collect();
    // The device's own reading (NVML) at each column's time: what nvidia-smi would say.
    let device_series = device_used_series(store);
    let device: Vec<Option<u64>> = bounds
        .windows(2)
        .map(|w| {
            let t = store.history.get(w[1].saturating_sub(1).max(w[0]))?.t_ns;
            let k = device_series.partition_point(|(st, _)| *st <= t);
            k.checked_sub(1).map(|k| device_series[k].1 as u64)
        })
        .collect();
    let top = cols.iter().map(|c| c.total.max(c.reserved)).chain(device.iter().flatten().copied()).max().unwrap_or(0);
    let rows = u64::from(plot.height);
    // One row spare above the highest column, for the peak label.
    let axis = ByteAxis::fit(top + top / rows.max(1), rows);
    let steps = store.step_starts(from, to);
    let mut step_col = vec![false; cols.len()];
    for (i, _) in &steps {
        step_col[column_of(&bounds, *i) as usize] = true;
    }
    let buf = f.buffer_mut();
    let dim = Style::default().fg(theme.ui.dim);
    for (row, label) in axis.ticks(rows) {
        buf.set_string(inner.x, plot.y + plot.height - 1 - row as u16, format!("{label:>8}"), dim);
    }
    let bands_by_column = (!view.by_category).then(|| allocation_bands(store, &bounds, &cols, &axis, theme));
    for (x, col) in cols.iter().enumerate() {
        let cx = plot.x + x as u16;
        let shade = theme.plot_shade(phases[x]);
        let mut bounds_by_cat = [(0u64, Category::Unknown); 8];
        let mut acc = 0u64;
        for (i, c) in STACK_ORDER.iter().enumerate() {
            acc += col.cats[*c as usize];
            bounds_by_cat[i] = (axis.eighths(acc), *c);
        }
        let h = axis.eighths(col.total);
        let reserved_row = axis.eighths(col.reserved) / 8;
        let device_row = device[x].map(|d| axis.eighths(d) / 8);
        let bands: &[(u64, Color, Fill)] = bands_by_column.as_ref().map(|b| b[x].as_slice()).unwrap_or(&[]);
        let at = |pos: u64| -> (Color, Fill) {
            if view.by_category {
                let c = bounds_by_cat.iter().find(|(b, _)| *b > pos).map(|(_, c)| *c).unwrap_or(Category::Unknown);
                (theme.category(c), Fill::Solid)
            } else {
                bands.iter().find(|(b, _, _)| *b > pos).map(|(_, c, g)| (*c, *g)).unwrap_or((theme.chart.small_allocations, Fill::Summed))
            }
        };
        for r in 0..rows {
            let y = plot.y + plot.height - 1 - r as u16;
            let cell = &mut buf[(cx, y)];
            let lo = r * 8;
            if h >= lo + 8 {
                let (c, fill) = at(lo + 4);
                cell.set_char(fill.glyph()).set_fg(c).set_bg(shade);
            } else if h > lo {
                cell.set_char(EIGHTHS[(h - lo) as usize]).set_fg(at(lo + (h - lo) / 2).0).set_bg(shade);
            } else if device_row == Some(r) {
                cell.set_char('┄').set_fg(theme.chart.device_used).set_bg(shade);
            } else if r == reserved_row && col.reserved > 0 {
                cell.set_char('─').set_fg(theme.chart.reserved).set_bg(shade);
            } else if step_col[x] {
                cell.set_char('┊').set_fg(theme.ui.dim).set_bg(shade);
            } else {
                cell.set_char(' ').set_bg(shade);
            }
        }
        // The phase row: each phase on its own colour, lettered where it begins.
        let p = phases[x];
        let ribbon = theme.phase(p).unwrap_or(theme.ui.background);
        let ch = match p {
            Phase::Other => ' ',
            _ if x > 0 && phases[x - 1] == p => '·',
            Phase::Forward => 'F',
            Phase::Backward => 'B',
            Phase::Optimizer => 'O',
            Phase::ZeroGrad => 'Z',
        };
        buf[(cx, ribbon_y)].set_char(ch).set_fg(theme.text_on(ribbon)).set_bg(ribbon);
    }
    render_step_axis(buf, inner.x, plot, axis_y, &steps, &bounds, store, view.time_axis, theme);
    render_markers_and_peak(buf, plot, store, from, to, &bounds, &cols, &axis, theme);
}

/// The row under the phase row: each step's number where it begins ("step" at the left),
/// and in time mode the second it began at, where there is room.
#[allow(clippy::too_many_arguments)]
fn render_step_axis(buf: &mut ratatui::buffer::Buffer, left: u16, plot: Rect, y: u16, steps: &[(u64, u32)], bounds: &[u64], store: &Store, time_axis: bool, theme: &Theme) {
    let dim = Style::default().fg(theme.ui.dim);
    buf.set_string(left, y, format!("{:>8}", "step"), dim);
    let xs: Vec<u16> = steps.iter().map(|(i, _)| column_of(bounds, *i)).collect();
    let mut free_from = 0u16;
    for (k, (i, step)) in steps.iter().enumerate() {
        let x = xs[k];
        // A label ends before the next step's column (the last one, before the edge).
        let limit = xs.get(k + 1).map_or(plot.width + 1, |n| *n);
        let fits = |t: &String| x + (t.chars().count() as u16) < limit.min(plot.width + 1);
        let long = if time_axis { format!("{step} · {}", seconds(store.history.get(*i).map_or(0, |e| e.t_ns))) } else { format!("{step}") };
        let Some(text) = [long, format!("{step}")].into_iter().find(fits) else { continue };
        if x < free_from {
            continue;
        }
        buf.set_string(plot.x + x, y, &text, Style::default().fg(theme.ui.text).add_modifier(Modifier::BOLD));
        free_from = x + text.chars().count() as u16 + 1;
    }
}

/// Markers on the top row, tagged as the log tags them ("K3 ctx→512"), and the peak: the
/// session's when it is in view (the figure the side panel gives), else the window's.
#[allow(clippy::too_many_arguments)]
fn render_markers_and_peak(buf: &mut ratatui::buffer::Buffer, plot: Rect, store: &Store, from: u64, to: u64, bounds: &[u64], cols: &[Column], axis: &ByteAxis, theme: &Theme) {
    let marks: Vec<(u16, String, String, Color)> = store
        .markers
        .iter()
        // A marker at the newest index (said after the last event) belongs at the right edge.
        .filter(|m| (from..=to).contains(&m.at))
        .map(|m| {
            let color = if matches!(m.marker, vramscope_core::store::Marker::Oom(_)) { theme.ui.error } else { theme.ui.accent };
            (column_of(bounds, m.at), m.tag(), m.marker.label(), color)
        })
        .collect();
    let right = plot.width;
    // Tags never overlap: each starts after the one before, and from the right edge back
    // they shift left to stay on screen.
    let width = |tag: &String| tag.chars().count() as u16;
    let mut xs: Vec<u16> = Vec::with_capacity(marks.len());
    for k in 0..marks.len() {
        let after = k.checked_sub(1).map_or(0, |p| xs[p] + width(&marks[p].1) + 1);
        xs.push(marks[k].0.max(after));
    }
    let mut limit = right;
    for k in (0..marks.len()).rev() {
        xs[k] = xs[k].min(limit.saturating_sub(width(&marks[k].1)));
        limit = xs[k].saturating_sub(1);
    }
    // Each tag gets its label after it, or before it where only the left has room.
    let mut free = 0u16;
    for (k, (_, tag, label, color)) in marks.iter().enumerate() {
        let x = xs[k];
        let next = xs.get(k + 1).copied().unwrap_or(right + 1);
        let after = format!("{tag} {label}");
        let (start, text) = if x + width(&after) < next {
            (x, after)
        } else if let Some(start) = x.checked_sub(width(label) + 1).filter(|s| *s >= free) {
            (start, format!("{label} {tag}"))
        } else {
            (x, tag.clone())
        };
        buf.set_string(plot.x + start, plot.y, fit(&text, (right - start) as usize), Style::default().fg(*color).add_modifier(Modifier::BOLD));
        free = start + width(&text) + 1;
    }
    // The peak: where the highest column is, labelled one row above it.
    let session = store.peak.1;
    let (x, total, label) = if store.peak.0 > 0 && (from..to).contains(&session) {
        let x = column_of(bounds, session);
        (x, cols.get(x as usize).map_or(store.peak.0, |c| c.total), format!("active peak {}", bytes(store.session_peak())))
    } else {
        match cols.iter().enumerate().max_by_key(|(i, c)| (c.total, std::cmp::Reverse(*i))) {
            Some((x, c)) if c.total > 0 => (x as u16, c.total, format!("window active peak {}", bytes(c.total))),
            _ => return,
        }
    };
    let rows = plot.height;
    let row = (axis.eighths(total).div_ceil(8) as u16).min(rows - 1);
    let y = plot.y + rows - 1 - row;
    let style = Style::default().fg(theme.chart.peak).add_modifier(Modifier::BOLD);
    let w = label.chars().count() as u16 + 2;
    // "▼ label" to the right of the peak, or "label ▼" to its left where it would not fit.
    let (lx, text) = if x + w <= right { (x, format!("▼ {label}")) } else { (x.saturating_sub(w - 1), format!("{label} ▼")) };
    buf.set_string(plot.x + lx, y, fit(&text, (right - lx) as usize), style);
    // Marker tags stay readable over the label.
    if y == plot.y {
        for (k, (_, tag, _, color)) in marks.iter().enumerate() {
            buf.set_string(plot.x + xs[k], plot.y, tag, Style::default().fg(*color).add_modifier(Modifier::BOLD));
        }
    }
}

pub fn render_side(f: &mut Frame, area: Rect, store: &Store, view: &View, theme: &Theme) {
    let block = Block::default().borders(Borders::ALL).border_style(Style::default().fg(theme.ui.border)).title(Span::styled(" memory · active bytes ", Style::default().fg(theme.ui.title)));
    let inner = block.inner(area);
    f.render_widget(block, area);
    let dim = Style::default().fg(theme.ui.dim);
    let val = Style::default().fg(theme.ui.text).add_modifier(Modifier::BOLD);
    let kv = |k: &str, v: String| Line::from(vec![Span::styled(format!("{k:<13}"), dim), Span::styled(v, val)]);
    // Every figure here but reserved is active memory (what live allocations asked for,
    // memory_viz's measure); the block's title says so, and reserved says its own name.
    let swatch = |glyph: &str, c: Color| Span::styled(format!("{glyph} "), Style::default().fg(c));
    let (active, cats, live) = store.active_figures();
    let mut lines = vec![
        // Live while every event arrives; else the job's exact figure at its last step end.
        kv(if live { "active" } else { "at step end" }, bytes(active)),
        Line::from(vec![swatch("─", theme.chart.reserved), Span::styled(format!("{:<11}", "reserved"), dim), Span::styled(bytes(store.history.reserved()), val)]),
        kv("peak (step)", store.last_step_peak().map(bytes).unwrap_or_else(|| "–".into())),
        kv("peak (all)", bytes(store.session_peak())),
    ];
    // Swatch, label, a space, and room for "1023 MiB". Every category keeps its row, so the
    // legend does not jump as one empties.
    let label_w = (inner.width as usize).saturating_sub(2 + 1 + 8).min(16);
    for c in STACK_ORDER.iter().rev() {
        // A narrow panel takes the two long names in fewer letters rather than cut words.
        let name = match c.as_str().replace('_', " ") {
            n if n.chars().count() <= label_w => n,
            _ if *c == Category::AutogradDetail => "autograd".into(),
            _ if *c == Category::OptimizerState => "optim. state".into(),
            n => n,
        };
        lines.push(Line::from(vec![
            swatch("█", theme.category(*c)),
            Span::styled(format!("{name:<label_w$.label_w$} "), dim),
            Span::styled(bytes(cats[*c as usize]), val),
        ]));
    }
    if !view.by_category {
        lines.push(Line::from(vec![Span::styled("█▓", Style::default().fg(theme.ui.text)), Span::styled(" one per allocation", dim)]));
        lines.push(Line::from(vec![swatch("░", theme.chart.small_allocations), Span::styled("small ones, summed", dim)]));
    }
    lines.push(Line::from(""));
    lines.extend(gauge_lines(store, theme));
    f.render_widget(Paragraph::new(lines), inner);
}

/// Per column, the allocation bands stacked in allocation order as memory_viz draws them:
/// (upper bound in eighths of a row, colour, fill). Each band takes its category's colour,
/// neighbours alternate solid and shaded; allocations too small to fill an eighth of a row
/// form one summed band on top, as memory_viz summarizes what it does not draw.
fn allocation_bands(store: &Store, bounds: &[u64], cols: &[Column], axis: &ByteAxis, theme: &Theme) -> Vec<Vec<(u64, Color, Fill)>> {
    let (from, to) = (bounds[0], bounds[bounds.len() - 1]);
    let min_size = (axis.step / (axis.rows_per_tick * 8)).max(1);
    let big: Vec<_> = store.spans_in(from, to, min_size).copied().collect();
    let mut by_end: Vec<usize> = (0..big.len()).collect();
    by_end.sort_by_key(|&i| big[i].end.unwrap_or(u64::MAX));
    let (mut next_start, mut next_end) = (0, 0);
    let mut active = std::collections::BTreeSet::new();
    // Sweep the columns left to right, adding allocations as they start and dropping them as
    // they end, so each column costs only what is alive in it.
    cols.iter()
        .enumerate()
        .map(|(x, col)| {
            let mid = bounds[x] + (bounds[x + 1] - bounds[x]) / 2;
            while next_start < big.len() && big[next_start].start <= mid {
                active.insert(next_start);
                next_start += 1;
            }
            while next_end < by_end.len() && big[by_end[next_end]].end.is_some_and(|e| e <= mid) {
                active.remove(&by_end[next_end]);
                next_end += 1;
            }
            let mut acc = 0u64;
            let mut bands: Vec<(u64, Color, Fill)> = active
                .iter()
                .map(|&i| {
                    acc += big[i].size;
                    let fill = if i % 2 == 0 { Fill::Solid } else { Fill::Shaded };
                    (axis.eighths(acc), theme.category(big[i].category), fill)
                })
                .collect();
            if col.total > acc {
                bands.push((axis.eighths(col.total), theme.chart.small_allocations, Fill::Summed));
            }
            bands
        })
        .collect()
}

/// (capture-clock ns, bytes used) of the engine's device, when NVML is the source.
fn device_used_series(store: &Store) -> Vec<(u64, f64)> {
    let nvml = store.gauges.status().is_some_and(|s| s.kind == SourceKind::Nvml);
    if !nvml {
        return Vec::new();
    }
    store.gauges.series(Metric::DeviceMemUsed(store.gauges.selected_device()))
}

/// The device's readings (NVML), or the host's when NVML is not there.
fn gauge_lines<'a>(store: &Store, theme: &Theme) -> Vec<Line<'a>> {
    let dim = Style::default().fg(theme.ui.dim);
    let val = Style::default().fg(theme.ui.text).add_modifier(Modifier::BOLD);
    let kv = |k: &str, v: String| Line::from(vec![Span::styled(format!("{k:<13}"), dim), Span::styled(v, val)]);
    let opt = |v: Option<u32>, unit: &str| v.map(|v| format!("{v}{unit}")).unwrap_or_else(|| "–".into());
    if let Some(d) = store.gauges.latest_device(store.gauges.selected_device()) {
        let mut out = vec![
            Line::from(vec![Span::styled("┄ ", Style::default().fg(theme.chart.device_used)), Span::styled(format!("GPU {} {}", d.index, d.name), dim)]),
            kv("device used", format!("{} / {}", bytes(d.mem_used), bytes(d.mem_total))),
        ];
        // What the device holds that PyTorch's allocator does not: CUDA context, cuBLAS
        // workspaces, other processes.
        let gap = d.mem_used.saturating_sub(store.history.reserved());
        out.push(kv("non-PyTorch", bytes(gap)));
        out.push(kv("util / temp", format!("{} / {}", opt(d.gpu_util, "%"), opt(d.temp_c, "°C"))));
        let power = match (d.power_mw, d.power_limit_mw) {
            (Some(p), Some(l)) => format!("{} / {} W", p / 1000, l / 1000),
            (Some(p), None) => format!("{} W", p / 1000),
            _ => "–".into(),
        };
        out.push(kv("power", power));
        return out;
    }
    match store.gauges.latest_host() {
        Some(h) => vec![
            Line::from(Span::styled("host (no NVML)", dim)),
            // No resident bytes: the job's processes are gone (or not yet known).
            kv("process RSS", match h.rss_bytes {
                0 if store.finished || store.exited.is_some() => "– (the job exited)".into(),
                0 => "–".into(),
                b => bytes(b),
            }),
            kv("system mem", format!("{} / {}", bytes(h.mem_used), bytes(h.mem_total))),
            kv("cpu", h.cpu_percent.map(|c| format!("{c:.0}% of {}", h.cpu_count)).unwrap_or_else(|| "–".into())),
        ],
        None => vec![Line::from(Span::styled("device gauges: waiting", dim))],
    }
}

/// What an allocation is, in the model's words: a parameter's or optimizer state's name
/// ("layers.0.attn.q_proj.weight", "exp_avg of …", "grad of …"), or the module it was made
/// in. The flag says there is no name, only a description.
fn allocation_name(store: &Store, a: &LiveAlloc) -> (String, bool) {
    match store.scope_name(a.scope) {
        "" if a.category == Category::Input => ("input batch".into(), true),
        // A snapshot trace names no modules at all: say so rather than guess.
        "" if store.scopes.len() <= 1 => ("no module recorded".into(), true),
        "" => ("outside any module".into(), true),
        s => (s.to_string(), false),
    }
}

/// The rows the table shows: the largest first, scrolled so the selected one is in sight.
/// Also the selected row's index among them.
fn table_rows<'a>(store: &'a Store, view: &View, n: usize) -> (Vec<&'a LiveAlloc>, Option<usize>) {
    let Some(addr) = view.selected.filter(|_| view.table_focus) else { return (store.largest_live(n), None) };
    let top = store.largest_live(n);
    if let Some(i) = top.iter().position(|a| a.addr == addr) {
        return (top, Some(i));
    }
    let all = store.live_by_size();
    // Still live: scrolled to it. Freed: the row it held.
    let row = all.iter().position(|a| a.addr == addr).unwrap_or(view.selected_row).min(all.len().saturating_sub(1));
    let first = (row + 1).saturating_sub(n);
    let rows: Vec<&LiveAlloc> = all.into_iter().skip(first).take(n).collect();
    let sel = (!rows.is_empty()).then_some(row - first);
    (rows, sel)
}

pub fn render_table(f: &mut Frame, area: Rect, store: &Store, view: &View, theme: &Theme) {
    let n = area.height.saturating_sub(3) as usize;
    let now_step = store.step_now() as u32;
    let (rows, selected) = table_rows(store, view, n);
    let rows: Vec<Row> = rows
        .into_iter()
        .enumerate()
        .map(|(i, a)| {
            let style = if selected == Some(i) { Style::default().bg(theme.ui.selection).add_modifier(Modifier::BOLD) } else { Style::default() };
            let (name, described) = allocation_name(store, a);
            let name_style = if described { Style::default().fg(theme.ui.dim) } else { Style::default().fg(theme.ui.text) };
            Row::new(vec![
                Cell::from(bytes(a.size)),
                Cell::from(Line::from(vec![Span::styled("█ ", Style::default().fg(theme.category(a.category))), Span::raw(a.category.as_str().replace('_', " "))])),
                Cell::from(a.phase.as_str()),
                Cell::from(Span::styled(name, name_style)),
                Cell::from(format!("{}", now_step.saturating_sub(a.step))),
            ])
            .style(style)
        })
        .collect();
    let focus = if view.table_focus { " · ↑↓ select · enter inspect" } else { "" };
    let incomplete = if store.events_complete() { "" } else { " · incomplete: events were lost" };
    let title = format!(" largest live allocations ({} live){incomplete}{focus} ", store.live_count());
    let table = Table::new(rows, [Constraint::Length(10), Constraint::Length(18), Constraint::Length(10), Constraint::Min(14), Constraint::Length(5)])
        .header(Row::new(vec!["size", "category", "phase", "what", "age"]).style(Style::default().fg(theme.ui.dim).add_modifier(Modifier::BOLD)))
        .style(Style::default().fg(theme.ui.text))
        .block(Block::default().borders(Borders::ALL).border_style(Style::default().fg(if view.table_focus { theme.ui.accent } else { theme.ui.border })).title(Span::styled(title, Style::default().fg(theme.ui.title))));
    f.render_widget(table, area);
}

/// A log line: its marker tag, if any, then the text in its kind's colour.
fn log_spans(l: &LogLine, theme: &Theme) -> Vec<Span<'static>> {
    let color = match l.kind {
        LogKind::Info => theme.ui.text,
        LogKind::Warn => theme.ui.warning,
        LogKind::Error => theme.ui.error,
    };
    let mut spans = Vec::new();
    if let Some(tag) = &l.tag {
        let c = if l.kind == LogKind::Error { theme.ui.error } else { theme.ui.accent };
        spans.push(Span::styled(format!("{tag} "), Style::default().fg(c).add_modifier(Modifier::BOLD)));
    }
    spans.push(Span::styled(l.text.clone(), Style::default().fg(color)));
    spans
}

pub fn render_log(f: &mut Frame, area: Rect, store: &Store, view: &View, keys: &KeyMap<LiveKey>, theme: &Theme) {
    let line = match view.held_log.as_ref().map(|(l, _)| l).or(store.log.back()) {
        Some(l) => {
            let mut spans = log_spans(l, theme);
            if store.log.len() > 1 {
                let more = format!("  ({} the whole log)", keys.label_of(LiveKey::EventLog));
                let used: usize = spans.iter().map(|s| s.content.chars().count()).sum();
                if used + more.chars().count() <= area.width as usize {
                    spans.push(Span::styled(more, Style::default().fg(theme.ui.dim)));
                }
            }
            Line::from(spans)
        }
        // The log holds what happened to the session (knob changes, snapshots, errors), not
        // allocator events: say so when there is none yet.
        None => Line::from(Span::styled("nothing logged yet", Style::default().fg(theme.ui.dim))),
    };
    // A replay cannot turn the knobs: its footer names its own keys.
    let items: &[(LiveKey, &str)] = if is_replay(store) {
        &[
            (LiveKey::Help, "help"),
            (LiveKey::TogglePause, "pause"),
            (LiveKey::SpeedUp, "faster"),
            (LiveKey::SpeedDown, "slower"),
            (LiveKey::NextStep, "next step"),
            (LiveKey::PrevStep, "previous step"),
            (LiveKey::Quit, "quit"),
        ]
    } else {
        &[
            (LiveKey::Help, "help"),
            (LiveKey::TogglePrecision, "precision"),
            (LiveKey::CtxDouble, "ctx×2"),
            (LiveKey::CtxHalve, "ctx÷2"),
            (LiveKey::ToggleMode, "mode"),
            (LiveKey::Snapshot, "snapshot"),
            (LiveKey::TogglePause, "pause"),
            (LiveKey::Quit, "quit"),
        ]
    };
    let hints = key_hints(keys, items, theme, area.width);
    f.render_widget(Paragraph::new(vec![line, hints]), area);
}


/// The selected allocation: what it is, how big, when and where it was made.
pub fn render_inspector(f: &mut Frame, area: Rect, store: &Store, view: &View, theme: &Theme) {
    let dim = Style::default().fg(theme.ui.dim);
    let val = Style::default().fg(theme.ui.text).add_modifier(Modifier::BOLD);
    let kv = |k: &str, v: String| Line::from(vec![Span::styled(format!(" {k:<10}"), dim), Span::styled(v, val)]);
    let lines = match view.selected.and_then(|a| store.live_alloc(a)) {
        Some(a) => {
            let (name, _) = allocation_name(store, a);
            let made = store.made_at(a);
            let when = made.and_then(|i| store.history.get(i)).map(|e| format!(" · {} into the run", seconds(e.t_ns))).unwrap_or_default();
            let event = made.map(|i| format!(" (event {i})")).unwrap_or_default();
            let live = store.history.live_total().max(1);
            vec![
                kv("what", name),
                kv("size", format!("{} ({} bytes)", bytes(a.size), a.size)),
                Line::from(vec![Span::styled(format!(" {:<10}", "category"), dim), Span::styled("█ ", Style::default().fg(theme.category(a.category))), Span::styled(a.category.as_str().replace('_', " "), val)]),
                kv("made", format!("step {}, {}{when}{event}", a.step, a.phase.as_str())),
                kv("age", format!("{} steps", store.step_now().saturating_sub(u64::from(a.step)))),
                kv("address", format!("{:#x}", a.addr)),
                kv("share", format!("{:.1}% of the {} allocated now", a.size as f64 * 100.0 / live as f64, bytes(live))),
            ]
        }
        None => vec![Line::from(Span::styled(" freed since it was selected: ↑↓ selects another", dim))],
    };
    let w = lines.iter().map(|l| l.width()).max().unwrap_or(0) as u16 + 3;
    let (r, block) = overlay(f, area, w.max(44), lines.len() as u16 + 2, " allocation (enter closes) ".into(), theme);
    f.render_widget(Paragraph::new(lines).block(block), r);
}

/// Every line the log holds, newest at the bottom, scrolled `up` lines back.
pub fn render_event_log(f: &mut Frame, area: Rect, store: &Store, up: usize, theme: &Theme) {
    let total = store.log.len();
    // As tall as its lines, up to two thirds of the screen.
    let w = area.width.saturating_sub(4);
    let inner_w = usize::from(w.saturating_sub(2)).max(1);
    let line = |l: &LogLine| {
        let mut spans = vec![Span::styled(format!(" step {:<5} ", l.step), Style::default().fg(theme.ui.dim))];
        spans.extend(log_spans(l, theme));
        Line::from(spans)
    };
    // Long lines wrap: the newest lines that fit, each as many rows as it wraps to.
    let most = usize::from((area.height * 2 / 3).max(6).saturating_sub(2));
    let end = total.saturating_sub(up);
    let mut lines: Vec<Line> = Vec::new();
    let mut used = 0;
    for l in store.log.range(..end).rev() {
        let l = line(l);
        let rows = l.width().div_ceil(inner_w).max(1);
        if used + rows > most && !lines.is_empty() {
            break;
        }
        used += rows;
        lines.insert(0, l);
    }
    let shown = if up > 0 { format!(", {up} newer below") } else { String::new() };
    let title = format!(" event log: {total} lines{shown} · ↑↓ scroll · l or esc closes ");
    let (r, block) = overlay(f, area, w, used.max(1) as u16 + 2, title, theme);
    let para = if lines.is_empty() { Paragraph::new(Span::styled(" nothing logged yet", Style::default().fg(theme.ui.dim))) } else { Paragraph::new(lines) };
    f.render_widget(para.wrap(Wrap { trim: false }).block(block), r);
}
