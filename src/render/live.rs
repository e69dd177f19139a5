//! The live screen: header, active-memory timeline, side panel, largest live allocations,
//! event log. One pure render function per panel, given the store, the view and the theme.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Clear, Paragraph, Row, Table};
use ratatui::Frame;

use crate::event::{Category, Phase};
use crate::source::gauges::history::Metric;
use crate::source::gauges::sample::SourceKind;
use crate::render::format::bytes;
use crate::store::ranks::RankSummary;
use crate::store::{Column, LogKind, Marker, Store};
use crate::app::keys::{Action, Bindable, KeyMap};
use crate::app::view::View;

use super::theme::Theme;

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
pub fn render_live(f: &mut Frame, store: &Store, ranks: &RankSummary, view: &View, keys: &KeyMap, theme: &Theme) {
    let area = f.area();
    f.render_widget(Block::default().style(Style::default().bg(theme.ui.background).fg(theme.ui.text)), area);
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        render_too_small(f, area, theme);
        return;
    }
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
    render_side(f, side, store, theme);
    render_table(f, table, store, view, theme);
    render_log(f, log, store, keys, theme);
    if view.help {
        render_help(f, area, keys, theme);
    }
}

pub fn render_too_small(f: &mut Frame, area: Rect, theme: &Theme) {
    let msg = format!(
        "terminal is {}×{}; vramscope needs at least {MIN_WIDTH}×{MIN_HEIGHT}. Enlarge it, or press q to quit.",
        area.width, area.height
    );
    f.render_widget(Paragraph::new(msg).style(Style::default().fg(theme.ui.warning)).wrap(ratatui::widgets::Wrap { trim: true }), area);
}

/// What the job is and runs with: vramscope's model and its knobs, or a user's script, its
/// rank and the knobs it declared.
fn job_facts(info: &crate::stream::EngineInfo, wide: bool) -> (String, Vec<String>) {
    let params = format!("{:.1}M params", info.parameters as f64 / 1e6);
    let mut facts = Vec::new();
    let name = match &info.config {
        Some(c) => {
            facts.extend([c.precision.to_string(), format!("ctx {}", c.ctx), format!("batch {}", c.batch), c.mode.to_string(), c.attention.to_string(), format!("{} AdamW", c.optimizer)]);
            c.model_name.clone()
        }
        None => {
            facts.extend(info.knobs.iter().map(|k| format!("{} {}", k.name, k.value)));
            info.name.clone()
        }
    };
    if !info.alloc_conf.is_empty() {
        facts.push(info.alloc_conf.clone());
    }
    (if wide { format!("{name} ({params})") } else { name }, facts)
}

pub fn render_header(f: &mut Frame, area: Rect, store: &Store, ranks: &RankSummary, theme: &Theme) {
    let dim = Style::default().fg(theme.ui.dim);
    let val = Style::default().fg(theme.ui.text).add_modifier(Modifier::BOLD);
    let Some(info) = &store.info else {
        let what = store.title.as_deref().unwrap_or("starting the job…");
        f.render_widget(Paragraph::new(format!("vramscope · {what}")).style(dim), area);
        return;
    };
    let sep = || Span::styled(" · ", dim);
    // Narrow terminals get the same facts in fewer words.
    let wide = area.width >= 100;
    let device = match (info.cuda, wide) {
        (true, _) => info.device.clone(),
        (false, true) => format!("{} (GPU modelled)", info.device),
        (false, false) => format!("{} (modelled)", info.device),
    };
    let (model, facts) = job_facts(info, wide);
    let mut line1 = vec![
        Span::styled(if wide { "vramscope " } else { "" }, Style::default().fg(theme.ui.title).add_modifier(Modifier::BOLD)),
        Span::styled(model, val),
        sep(),
        Span::styled(device, val),
    ];
    for fact in facts {
        line1.extend([sep(), Span::styled(fact, val)]);
    }
    if ranks.count > 1 {
        line1.extend([sep(), Span::styled(format!("rank {} of {}", ranks.shown, ranks.count), Style::default().fg(theme.ui.accent).add_modifier(Modifier::BOLD))]);
        let peaks: Vec<String> = ranks.peaks.iter().map(|p| format!("r{} {}", p.rank, bytes(p.peak))).collect();
        line1.extend([sep(), Span::styled(format!("peaks {}", peaks.join(" ")), val)]);
        if let Some(skew) = ranks.skew {
            line1.extend([sep(), Span::styled(format!("skew {skew:.2}×"), if skew > 1.1 { Style::default().fg(theme.ui.warning) } else { val })]);
        }
    }
    let last = store.last_step();
    let mut spans = vec![
        Span::styled(format!("step {}", last.map(|s| s.step + 1).unwrap_or(0)), val),
        sep(),
        Span::styled("phase ", dim),
        Span::styled(store.current_phase().as_str(), Style::default().fg(theme.ui.accent).bg(theme.phase(store.current_phase()).unwrap_or(theme.ui.background)).add_modifier(Modifier::BOLD)),
    ];
    if let Some(s) = last {
        spans.extend([
            sep(),
            Span::styled(format!("{:.2} s/step", s.step_time_s), val),
            sep(),
            Span::styled(format!("{:.0} tok/s", s.tokens_per_s), val),
        ]);
    }
    let dropped = last.map(|s| s.dropped_events).unwrap_or(0) + store.lost_events;
    spans.push(sep());
    if dropped > 0 {
        spans.push(Span::styled(format!("capture dropping: {dropped} events lost (totals exact)"), Style::default().fg(theme.ui.warning)));
    } else {
        spans.push(Span::styled("capture ok", dim));
    }
    if let Some(t) = &store.title {
        spans.extend([sep(), Span::styled(t.clone(), Style::default().fg(theme.ui.accent))]);
    }
    if let Some(p) = &store.recording {
        spans.extend([sep(), Span::styled(format!("● REC {}", p.display()), Style::default().fg(theme.ui.error).add_modifier(Modifier::BOLD))]);
    }
    if store.oom.is_some() {
        spans.extend([sep(), Span::styled("OUT OF MEMORY", Style::default().fg(theme.ui.error).add_modifier(Modifier::BOLD))]);
    } else if store.paused {
        spans.extend([sep(), Span::styled("PAUSED", Style::default().fg(theme.ui.warning).add_modifier(Modifier::BOLD))]);
    } else if store.finished {
        spans.extend([sep(), Span::styled("finished", Style::default().fg(theme.ui.dim))]);
    }
    f.render_widget(Paragraph::new(vec![Line::from(line1), Line::from(spans)]), area);
}

/// Y-axis scale: a round number of bytes above `max`.
fn nice_ceiling(max: u64) -> u64 {
    let max = max.max(1 << 20);
    let mut unit = 1u64 << 20;
    while unit * 10 < max {
        unit *= 2;
    }
    max.div_ceil(unit) * unit
}

const EIGHTHS: [char; 8] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇'];

pub fn render_timeline(f: &mut Frame, area: Rect, store: &Store, view: &View, theme: &Theme) {
    let (from, to) = view.range(store.history.start(), store.history.end());
    let mode = if view.by_category { "by category" } else { "by allocation" };
    let state = if view.frozen {
        "frozen (still ingesting)"
    } else if view.following() {
        "live"
    } else {
        "panned"
    };
    let title = format!(" active memory · {mode} · events {from}–{to} · {state} ");
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(Style::default().fg(theme.ui.border))
        .title(Span::styled(title, Style::default().fg(theme.ui.title)));
    let inner = block.inner(area);
    f.render_widget(block, area);
    if inner.width < 12 || inner.height < 4 {
        return;
    }
    let axis_w = 9u16;
    let plot = Rect { x: inner.x + axis_w, y: inner.y, width: inner.width - axis_w, height: inner.height - 1 };
    let ribbon = Rect { x: plot.x, y: plot.y + plot.height, width: plot.width, height: 1 };
    let cols = store.history.columns(from, to, plot.width as usize);
    let span = (to - from).max(1);
    // The device's own reading (NVML) at each column's time: what nvidia-smi would say.
    let device_series = device_used_series(store);
    let device: Vec<Option<u64>> = (0..cols.len())
        .map(|x| {
            let i = (from + span * (x as u64 + 1) / cols.len() as u64).saturating_sub(1);
            let t = store.history.get(i)?.t_ns;
            let k = device_series.partition_point(|(st, _)| *st <= t);
            k.checked_sub(1).map(|k| device_series[k].1 as u64)
        })
        .collect();
    let top = cols.iter().map(|c| c.total.max(c.reserved)).chain(device.iter().flatten().copied()).max().unwrap_or(0);
    let ymax = nice_ceiling(top + top / 10);
    let buf = f.buffer_mut();
    // Axis labels at the top edge of the top and middle rows, and zero.
    for row in [0, plot.height / 2] {
        let v = ymax * (plot.height - row) as u64 / plot.height as u64;
        buf.set_string(inner.x, plot.y + row, format!("{:>8}", bytes(v)), Style::default().fg(theme.ui.dim));
    }
    buf.set_string(inner.x, plot.y + plot.height - 1, format!("{:>8}", "0"), Style::default().fg(theme.ui.dim));
    let rows = plot.height as u64;
    let bands_by_column = (!view.by_category).then(|| allocation_bands(store, from, to, &cols, ymax, rows, theme));
    for (x, col) in cols.iter().enumerate() {
        let cx = plot.x + x as u16;
        let col_start = from + span * x as u64 / cols.len() as u64;
        let phase = store.phase_at(col_start).map(|p| p.phase).unwrap_or(Phase::Other);
        let shade = theme.phase(phase).unwrap_or(theme.ui.background);
        // Heights in eighths of a cell.
        let eighths = |b: u64| (b as u128 * rows as u128 * 8 / ymax.max(1) as u128) as u64;
        let mut bounds = [(0u64, Category::Unknown); 8];
        let mut acc = 0u64;
        for (i, c) in STACK_ORDER.iter().enumerate() {
            acc += col.cats[*c as usize];
            bounds[i] = (eighths(acc), *c);
        }
        let h = eighths(col.total);
        let reserved_row = eighths(col.reserved) / 8;
        let device_row = device[x].map(|d| eighths(d) / 8);
        let bands: &[(u64, Color)] = bands_by_column.as_ref().map(|b| b[x].as_slice()).unwrap_or(&[]);
        let at = |pos: u64| {
            if view.by_category {
                theme.category(bounds.iter().find(|(b, _)| *b > pos).map(|(_, c)| *c).unwrap_or(Category::Unknown))
            } else {
                bands.iter().find(|(b, _)| *b > pos).map(|(_, c)| *c).unwrap_or(theme.ui.dim)
            }
        };
        for r in 0..rows {
            let y = plot.y + plot.height - 1 - r as u16;
            let cell = &mut buf[(cx, y)];
            let lo = r * 8;
            if h >= lo + 8 {
                cell.set_char('█').set_fg(at(lo + 4)).set_bg(shade);
            } else if h > lo {
                cell.set_char(EIGHTHS[(h - lo) as usize]).set_fg(at(lo + (h - lo) / 2)).set_bg(shade);
            } else if device_row == Some(r) {
                cell.set_char('┄').set_fg(theme.chart.device_used).set_bg(shade);
            } else if r == reserved_row && col.reserved > 0 {
                cell.set_char('─').set_fg(theme.chart.reserved).set_bg(shade);
            } else {
                cell.set_char(' ').set_bg(shade);
            }
        }
        let letter = match phase {
            Phase::Forward => 'F',
            Phase::Backward => 'B',
            Phase::Optimizer => 'O',
            Phase::ZeroGrad => 'Z',
            Phase::Other => ' ',
        };
        let prev_phase = (x > 0).then(|| store.phase_at(from + span * (x as u64 - 1) / cols.len() as u64).map(|p| p.phase)).flatten();
        let ch = if prev_phase != Some(phase) { letter } else { '·' };
        buf[(cx, ribbon.y)].set_char(if phase == Phase::Other { ' ' } else { ch }).set_fg(theme.ui.text).set_bg(shade);
    }
    // Markers where a knob changed, a snapshot was saved, or memory ran out.
    for (i, m) in store.markers.iter().filter(|(i, _)| (from..to).contains(i)) {
        let x = plot.x + ((i - from) * plot.width as u64 / span) as u16;
        let (ch, color) = match m {
            Marker::Knob(_) => ('K', theme.ui.accent),
            Marker::Snapshot(_) => ('S', theme.ui.accent),
            Marker::Oom(_) => ('!', theme.ui.error),
        };
        buf[(x.min(plot.x + plot.width - 1), plot.y)].set_char(ch).set_fg(color).set_style(Style::default().add_modifier(Modifier::BOLD));
    }
    // The session peak, if on screen, with its value.
    let (peak, peak_at) = store.peak;
    if peak > 0 && (from..to).contains(&peak_at) {
        let x = plot.x + ((peak_at - from) * plot.width as u64 / span) as u16;
        let y = plot.y + plot.height.saturating_sub(1 + (peak as u128 * rows as u128 / ymax as u128) as u16).min(plot.height - 1);
        let y = y.saturating_sub(1).max(plot.y);
        let label = format!("▼ peak {}", bytes(peak));
        let lx = x.min(plot.x + plot.width.saturating_sub(label.chars().count() as u16));
        buf.set_string(lx, y, label, Style::default().fg(theme.chart.peak).add_modifier(Modifier::BOLD));
    }
}

pub fn render_side(f: &mut Frame, area: Rect, store: &Store, theme: &Theme) {
    let block = Block::default().borders(Borders::ALL).border_style(Style::default().fg(theme.ui.border)).title(Span::styled(" memory ", Style::default().fg(theme.ui.title)));
    let inner = block.inner(area);
    f.render_widget(block, area);
    let dim = Style::default().fg(theme.ui.dim);
    let val = Style::default().fg(theme.ui.text).add_modifier(Modifier::BOLD);
    let kv = |k: &str, v: String| Line::from(vec![Span::styled(format!("{k:<13}"), dim), Span::styled(v, val)]);
    let last = store.last_step();
    let mut lines = vec![
        kv("allocated", bytes(store.history.live_total())),
        kv("reserved", bytes(store.history.reserved())),
        kv("peak (step)", last.map(|s| bytes(s.peak_allocated_bytes)).unwrap_or_else(|| "–".into())),
        kv("peak (all)", bytes(store.peak_allocated().max(store.peak.0))),
        Line::from(""),
    ];
    let cats = store.history.category_bytes();
    // Swatch, label, a space, and room for "1023 MiB".
    let label_w = (inner.width as usize).saturating_sub(2 + 1 + 8).min(16);
    for c in STACK_ORDER.iter().rev() {
        let b = cats[*c as usize];
        if b == 0 && *c != Category::Activation {
            continue;
        }
        lines.push(Line::from(vec![
            Span::styled("█ ", Style::default().fg(theme.category(*c))),
            Span::styled(format!("{:<label_w$.label_w$} ", c.as_str().replace('_', " ")), dim),
            Span::styled(bytes(b), val),
        ]));
    }
    lines.push(Line::from(vec![Span::styled("─ ", Style::default().fg(theme.chart.reserved)), Span::styled("reserved", dim)]));
    lines.push(Line::from(""));
    lines.extend(gauge_lines(store, theme));
    f.render_widget(Paragraph::new(lines), inner);
}

/// Per column, the allocation bands stacked in allocation order as memory_viz draws them
/// (upper bounds in eighths of a cell, with colours). Allocations too small to fill an eighth
/// of a cell form one summarized band on top, as memory_viz summarizes what it does not draw.
fn allocation_bands(
    store: &Store,
    from: u64,
    to: u64,
    cols: &[Column],
    ymax: u64,
    rows: u64,
    theme: &Theme,
) -> Vec<Vec<(u64, Color)>> {
    let eighths = |b: u64| (b as u128 * rows as u128 * 8 / ymax.max(1) as u128) as u64;
    let min_size = (ymax / (rows * 8).max(1)).max(1);
    let big: Vec<_> = store.spans_in(from, to, min_size).copied().collect();
    let mut by_end: Vec<usize> = (0..big.len()).collect();
    by_end.sort_by_key(|&i| big[i].end.unwrap_or(u64::MAX));
    let (mut next_start, mut next_end) = (0, 0);
    let mut active = std::collections::BTreeSet::new();
    let span = (to - from).max(1);
    // Sweep the columns left to right, adding allocations as they start and dropping them as
    // they end, so each column costs only what is alive in it.
    cols.iter()
        .enumerate()
        .map(|(x, col)| {
            let mid = from + span * (2 * x as u64 + 1) / (2 * cols.len() as u64);
            while next_start < big.len() && big[next_start].start <= mid {
                active.insert(next_start);
                next_start += 1;
            }
            while next_end < by_end.len() && big[by_end[next_end]].end.is_some_and(|e| e <= mid) {
                active.remove(&by_end[next_end]);
                next_end += 1;
            }
            let mut acc = 0u64;
            let mut bands: Vec<(u64, Color)> = active
                .iter()
                .map(|&i| {
                    acc += big[i].size;
                    // Neighbours alternate their category's colour with a neutral one so
                    // each band stays distinct.
                    let c = if i % 2 == 0 { theme.category(big[i].category) } else { theme.ui.dim };
                    (eighths(acc), c)
                })
                .collect();
            if col.total > acc {
                bands.push((eighths(col.total), theme.chart.gauge_empty));
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
            kv("process RSS", bytes(h.rss_bytes)),
            kv("system mem", format!("{} / {}", bytes(h.mem_used), bytes(h.mem_total))),
            kv("cpu", h.cpu_percent.map(|c| format!("{c:.0}% of {}", h.cpu_count)).unwrap_or_else(|| "–".into())),
        ],
        None => vec![Line::from(Span::styled("device gauges: waiting", dim))],
    }
}

pub fn render_table(f: &mut Frame, area: Rect, store: &Store, view: &View, theme: &Theme) {
    let n = area.height.saturating_sub(3) as usize;
    let now_step = store.last_step().map(|s| s.step as u32 + 1).unwrap_or(0);
    let rows: Vec<Row> = store
        .largest_live(n)
        .into_iter()
        .enumerate()
        .map(|(i, a)| {
            let style = if view.table_focus && i == view.table_selected {
                Style::default().add_modifier(Modifier::REVERSED)
            } else {
                Style::default()
            };
            Row::new(vec![
                Cell::from(bytes(a.size)),
                Cell::from(Span::styled(a.category.as_str(), Style::default().fg(theme.category(a.category)))),
                Cell::from(a.phase.as_str()),
                Cell::from(match store.scope_name(a.scope) {
                    "" => "–".to_string(),
                    s => s.to_string(),
                }),
                Cell::from(format!("{}", now_step.saturating_sub(a.step))),
            ])
            .style(style)
        })
        .collect();
    let title = format!(" largest live allocations ({} live){} ", store.live_count(), if view.table_focus { " · focused" } else { "" });
    let table = Table::new(rows, [Constraint::Length(10), Constraint::Length(16), Constraint::Length(10), Constraint::Min(14), Constraint::Length(5)])
        .header(Row::new(vec!["size", "category", "phase", "module", "age"]).style(Style::default().fg(theme.ui.dim).add_modifier(Modifier::BOLD)))
        .block(Block::default().borders(Borders::ALL).border_style(Style::default().fg(if view.table_focus { theme.ui.accent } else { theme.ui.border })).title(Span::styled(title, Style::default().fg(theme.ui.title))));
    f.render_widget(table, area);
}

pub fn render_log(f: &mut Frame, area: Rect, store: &Store, keys: &KeyMap, theme: &Theme) {
    let line = match store.log.back() {
        Some(l) => {
            let color = match l.kind {
                LogKind::Info => theme.ui.text,
                LogKind::Warn => theme.ui.warning,
                LogKind::Error => theme.ui.error,
            };
            Line::from(Span::styled(l.text.clone(), Style::default().fg(color)))
        }
        None => Line::from(Span::styled("no events yet", Style::default().fg(theme.ui.dim))),
    };
    // A replay (it has a title) cannot turn the knobs: its footer names its own keys.
    let items: &[(Action, &str)] = if store.title.is_some() {
        &[
            (Action::Help, "help"),
            (Action::TogglePause, "pause"),
            (Action::SpeedUp, "faster"),
            (Action::SpeedDown, "slower"),
            (Action::NextStep, "next step"),
            (Action::PrevStep, "previous step"),
            (Action::Quit, "quit"),
        ]
    } else {
        &[
            (Action::Help, "help"),
            (Action::TogglePrecision, "precision"),
            (Action::CtxDouble, "ctx×2"),
            (Action::CtxHalve, "ctx÷2"),
            (Action::ToggleMode, "mode"),
            (Action::Snapshot, "snapshot"),
            (Action::TogglePause, "pause"),
            (Action::Quit, "quit"),
        ]
    };
    let hints = key_hints(keys, items, theme);
    f.render_widget(Paragraph::new(vec![line, hints]), area);
}

/// A footer of "key what" pairs, with the keys as the table binds them (rebinding shows).
pub fn key_hints<A: Bindable>(keys: &KeyMap<A>, items: &[(A, &str)], theme: &Theme) -> Line<'static> {
    let key = Style::default().fg(theme.ui.accent).add_modifier(Modifier::BOLD);
    let what = Style::default().fg(theme.ui.dim);
    Line::from(
        items
            .iter()
            .flat_map(|(a, w)| [Span::styled(keys.key_of(*a).label(), key), Span::styled(format!(" {w}  "), what)])
            .collect::<Vec<_>>(),
    )
}

pub fn render_help<A: Bindable>(f: &mut Frame, area: Rect, keys: &KeyMap<A>, theme: &Theme) {
    let rows = keys.help_rows();
    let h = (rows.len() as u16 + 4).min(area.height);
    // As wide as its longest row, so no line is cut (unless the terminal is narrower).
    let widest = rows.iter().map(|(_, d)| d.chars().count()).max().unwrap_or(0) as u16;
    let w = (widest + 12 + 4).max(40).min(area.width);
    let r = Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h };
    f.render_widget(Clear, r);
    let lines: Vec<Line> = rows
        .into_iter()
        .map(|(k, d)| Line::from(vec![Span::styled(format!("{k:>10}  "), Style::default().fg(theme.ui.accent).add_modifier(Modifier::BOLD)), Span::styled(d, Style::default().fg(theme.ui.text))]))
        .collect();
    f.render_widget(
        Paragraph::new(lines).block(Block::default().borders(Borders::ALL).border_style(Style::default().fg(theme.ui.accent)).title(Span::styled(" keys (? closes) ", Style::default().fg(theme.ui.title))).style(Style::default().bg(theme.ui.background))),
        r,
    );
}
