//! `vramscope view`: header, the four views (timeline, largest, segments, categories), the
//! allocation inspector, the out-of-memory and what-if reports, and the key hints. One
//! pure function per panel.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table, Wrap};
use ratatui::Frame;

use super::data::{ViewerData, DETAIL_STEPS};
use super::keys::ViewerKey;
use super::loading::Loading;
use super::ui::{Panel, Tab, ViewerUi};
use crate::keys::KeyMap;
use crate::draw::text::{bar, fit};
use vramscope_core::format::{bytes, duration};
use vramscope_core::report::breakdown::has_categories;
use vramscope_core::report::frames::{frame_label, top_frame_label, ShownFrame};
use vramscope_core::report::snapshot_summary::{allocation_info, event_time};
use vramscope_core::report::whatif::{oom_outcome, self_check_sentence, setting_label};
use vramscope_core::snapshot::timeline::{DetailView, Timeline};
use vramscope_core::snapshot::model::TraceForm;
use vramscope_core::snapshot::ReadPass;

use crate::chrome;
use crate::chrome::footer::key_hints;
use crate::chrome::help::render_help;

/// Below this size the viewer shows a message instead of a cramped layout.
const MIN_WIDTH: u16 = 60;
const MIN_HEIGHT: u16 = 18;
use crate::theme::Theme;

const INSPECTOR_WIDTH: u16 = 48;
const AXIS_WIDTH: u16 = 9;

/// Columns of the timeline plot at a terminal width (the loop moves the cursor by them).
pub fn plot_columns(width: u16, inspector: bool) -> usize {
    let side = if inspector { INSPECTOR_WIDTH } else { 0 };
    width.saturating_sub(side + 2 + AXIS_WIDTH).max(1) as usize
}

pub fn render_viewer(f: &mut Frame, data: &ViewerData, ui: &ViewerUi, keys: &KeyMap<ViewerKey>, theme: &Theme) {
    let Some(area) = chrome::screen(f, (MIN_WIDTH, MIN_HEIGHT), theme) else { return };
    // A warning or note about the file takes a header line each (two at most).
    let [header, body, footer] = Layout::vertical([Constraint::Length(header_height(data)), Constraint::Min(8), Constraint::Length(1)]).areas(area);
    render_header(f, header, data, ui, theme);
    let (main, side) = if ui.inspector {
        let [m, s] = Layout::horizontal([Constraint::Min(30), Constraint::Length(INSPECTOR_WIDTH)]).areas(body);
        (m, Some(s))
    } else {
        (body, None)
    };
    match ui.tab {
        Tab::Timeline => render_timeline(f, main, data, ui, keys, theme),
        Tab::Largest => render_largest(f, main, data, ui, theme),
        Tab::Segments if data.snap.profiled.is_some() => render_operators(f, main, data, theme),
        Tab::Segments => render_segments(f, main, data, theme),
        Tab::Categories => render_categories(f, main, data, theme),
    }
    if let Some(side) = side {
        render_inspector(f, side, data, ui, keys, theme);
    }
    match ui.panel {
        Some(Panel::Oom) => render_oom_panel(f, body, data, keys, theme),
        Some(Panel::WhatIf) => render_whatif_panel(f, body, data, keys, theme),
        None => {}
    }
    render_footer(f, footer, data, ui, keys, theme);
    if ui.help {
        render_help(f, area, keys, theme);
    }
}

pub fn render_header(f: &mut Frame, area: Rect, data: &ViewerData, ui: &ViewerUi, theme: &Theme) {
    let dim = Style::default().fg(theme.ui.dim);
    let val = Style::default().fg(theme.ui.text).add_modifier(Modifier::BOLD);
    let sep = || Span::styled(" · ", dim);
    let s = &data.snap;
    let mut line1 = Line::from(vec![
        Span::styled("vramscope view ", Style::default().fg(theme.ui.title).add_modifier(Modifier::BOLD)),
        Span::styled(data.name.clone(), val),
        sep(),
        Span::styled(format!("{} of {}", s.device_name(data.device), s.device_count()), val),
        sep(),
        // A torch.profiler trace has no segments: what it covers is what to know.
        Span::styled(
            match &s.profiled {
                Some(p) if p.form == TraceForm::MemoryTimeline => format!("memory timeline, category totals, {} changes", s.trace_entry_count()),
                Some(p) if p.form == TraceForm::MemoryTimelineRaw => format!("memory timeline, {} tensor events", s.trace_entry_count()),
                Some(p) => format!(
                    "torch.profiler trace, profiled window only ({} step{}), {} memory events",
                    p.steps.len(),
                    if p.steps.len() == 1 { "" } else { "s" },
                    s.trace_entry_count()
                ),
                None => format!("{} segments, {} blocks, {} trace entries", s.segments.len(), s.block_count(), s.trace_entry_count()),
            },
            dim,
        ),
    ]);
    if let Some(&(_, action)) = data.ooms().first() {
        line1.spans.extend([sep(), Span::styled(format!("OUT OF MEMORY at action {action}"), Style::default().fg(theme.ui.error).add_modifier(Modifier::BOLD))]);
    }
    let mut tabs: Vec<Span> = Vec::new();
    for t in Tab::ALL {
        let style = if t == ui.tab { Style::default().fg(theme.ui.background).bg(theme.ui.accent).add_modifier(Modifier::BOLD) } else { dim };
        // A trace has no segments: its third view is its operators.
        let title = if t == Tab::Segments && data.snap.profiled.is_some() { "operators" } else { t.title() };
        tabs.push(Span::styled(format!(" {title} "), style));
        tabs.push(Span::raw(" "));
    }
    tabs.extend([
        Span::styled("peak active ", dim),
        Span::styled(bytes(data.tl.peak_bytes), Style::default().fg(theme.chart.peak).add_modifier(Modifier::BOLD)),
        sep(),
        Span::styled("peak reserved ", dim),
        match s.profiled.as_ref().map(|p| p.peak_reserved(data.device)) {
            Some(None) => Span::styled("not in the file", dim),
            Some(Some(r)) => Span::styled(bytes(r), val),
            None => Span::styled(bytes(data.reserved().0), val),
        },
    ]);
    let mut lines = vec![line1, Line::from(tabs)];
    for note in data.notes() {
        let colour = if note.starts_with("warning") { theme.ui.warning } else { theme.ui.dim };
        lines.push(Line::from(Span::styled(fit(note, area.width as usize), Style::default().fg(colour))));
    }
    f.render_widget(Paragraph::new(lines), area);
}

/// Y-axis scale: a round number of bytes at or above `max`.
fn nice_ceiling(max: u64) -> u64 {
    let max = max.max(1024);
    let mut unit = 1u64 << 10;
    while unit * 10 < max {
        unit *= 2;
    }
    max.div_ceil(unit) * unit
}

const EIGHTHS: [char; 8] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇'];

/// Seconds since the first trace entry, for labels.
fn rel_seconds(data: &ViewerData, event: usize) -> Option<f64> {
    let t0 = data.snap.trace(data.device).first()?.time_us;
    event_time(&data.snap, &data.tl, data.device, event).map(|t| (t - t0) as f64 / 1e6)
}

pub fn render_timeline(f: &mut Frame, area: Rect, data: &ViewerData, ui: &ViewerUi, keys: &KeyMap<ViewerKey>, theme: &Theme) {
    let tl = &data.tl;
    let toggle = keys.label_of(ViewerKey::ColourBy);
    let (colouring, why) = match (ui.by_category, has_categories(tl)) {
        (true, _) => ("by category", format!(" ({toggle}: by allocation)")),
        (false, true) => ("by allocation", format!(" ({toggle}: by category)")),
        (false, false) => ("by allocation", " (no categories in the file)".to_string()),
    };
    let window = format!(
        "actions {}–{} of {} · detail {}% ({} of {} drawn, rest summarized)",
        ui.from,
        ui.to,
        tl.total_events,
        DETAIL_STEPS[data.detail_step],
        data.drawn(),
        tl.allocations.len()
    );
    let mut title = format!(" active memory timeline · {colouring}{why} · {window} ");
    // On a narrow box the colouring loses its explanation before the window is cut.
    if title.chars().count() + 2 > area.width as usize {
        title = format!(" active memory timeline · {colouring} · {window} ");
    }
    let Some(plot) = plot_frame(f, area, title, theme) else { return };
    let (ribbon_y, status_y) = (plot.y + plot.height, plot.y + plot.height + 1);
    let dim = Style::default().fg(theme.ui.dim);
    if tl.total_events == 0 {
        let s = &data.snap;
        let mut msg = format!("no alloc/free actions and no active blocks on {}", s.device_name(data.device));
        // A snapshot of a run on another GPU has empty lists before its own.
        let other = (0..s.device_count()).find(|d| *d != data.device && !s.trace(*d).is_empty());
        if let Some(d) = other {
            let name = s.device_name(d);
            let name = name[..1].to_uppercase() + &name[1..];
            msg += &format!(". {name} has {} trace entries: {} shows the next device.", s.trace(d).len(), keys.label_of(ViewerKey::NextDevice));
        }
        f.render_widget(Paragraph::new(msg).style(dim).wrap(Wrap { trim: true }), plot);
        return;
    }
    let cols = plot.width as usize;
    let span = ui.to - ui.from;
    let cursor_x = ((ui.cursor.saturating_sub(ui.from)) * cols / span.max(1)).min(cols - 1);
    let selected = ui.selected(data);
    let view = PlotView { from: ui.from, to: ui.to, cursor_x: Some(cursor_x), selected, by_category: ui.by_category };
    draw_plot(f.buffer_mut(), plot, tl, &data.detail, view, theme);
    let buf = f.buffer_mut();
    // Annotation markers on the ribbon (START ▶, END ◀), the cursor under them.
    for m in data.marks() {
        if let Some(e) = m.event.filter(|e| (ui.from..ui.to).contains(e)) {
            let x = plot.x + ((e - ui.from) * cols / span) as u16;
            buf[(x, ribbon_y)].set_char(if m.stage == "START" { '▶' } else { '◀' }).set_fg(theme.ui.accent);
        }
    }
    // Out-of-memory failures (!), before the action that follows them.
    for &(_, e) in data.ooms() {
        if (ui.from..ui.to).contains(&e) {
            let x = plot.x + ((e - ui.from) * cols / span) as u16;
            buf[(x, ribbon_y)].set_char('!').set_fg(theme.ui.error);
        }
    }
    buf[(plot.x + cursor_x as u16, ribbon_y)].set_char('▲').set_fg(theme.ui.text);
    // Status: the cursor's action, time, total, open annotations and the selected band.
    let total = tl.totals_at(ui.cursor);
    let when = rel_seconds(data, ui.cursor).map(|s| format!(" · t+{s:.3} s")).unwrap_or_default();
    let mut open: Vec<&str> = Vec::new();
    for m in data.marks().iter().filter(|m| m.event.is_some_and(|e| e <= ui.cursor)) {
        if m.stage == "START" {
            open.push(&m.name);
        } else if let Some(i) = open.iter().rposition(|n| *n == m.name) {
            open.remove(i);
        }
    }
    let phase = if open.is_empty() { String::new() } else { format!(" · in {}", open.join(" > ")) };
    let sel = selected.map(|id| {
        let a = &tl.allocations[id as usize];
        format!(" · selected {} at 0x{:x}", bytes(a.size), a.addr)
    });
    let oom = if data.ooms().iter().any(|&(_, e)| e == ui.cursor) { " · out of memory just before" } else { "" };
    let status = format!("action {}{when} · active {}{phase}{oom}{}", ui.cursor, bytes(total), sel.unwrap_or_default());
    let status = fit(&status, plot.width as usize);
    buf.set_string(plot.x, status_y, &status, Style::default().fg(theme.ui.text));
    if ui.by_category {
        draw_legend(buf, plot, status_y, status.chars().count(), tl, theme);
    }
}

/// The colour of each of the timeline's category names.
fn category_colours(tl: &Timeline, theme: &Theme) -> Vec<Color> {
    tl.categories.iter().enumerate().map(|(i, n)| theme.category_named(n, i)).collect()
}

/// "█ name" for each category on the timeline, right-aligned on row `y` after the
/// status's `used` columns when it fits there.
fn draw_legend(buf: &mut Buffer, plot: Rect, y: u16, used: usize, tl: &Timeline, theme: &Theme) {
    let colours = category_colours(tl, theme);
    let mut spans = Vec::new();
    for (name, colour) in tl.categories.iter().zip(colours) {
        spans.push(Span::styled(" █ ", Style::default().fg(colour)));
        spans.push(Span::styled(name.replace('_', " "), Style::default().fg(theme.ui.dim)));
    }
    let line = Line::from(spans);
    let width = line.width();
    if used + 2 + width <= plot.width as usize {
        buf.set_line(plot.x + plot.width - width as u16, y, &line, width as u16);
    }
}

/// The timeline's box titled `title`: the plot area inside it, leaving the axis on the
/// left and two rows below (ribbon, status); `None` when too small to draw in.
fn plot_frame(f: &mut Frame, area: Rect, title: String, theme: &Theme) -> Option<Rect> {
    let block = Block::default().borders(Borders::ALL).border_style(Style::default().fg(theme.ui.border)).title(Span::styled(title, Style::default().fg(theme.ui.title)));
    let inner = block.inner(area);
    f.render_widget(block, area);
    (inner.width > AXIS_WIDTH + 4 && inner.height >= 5).then(|| Rect { x: inner.x + AXIS_WIDTH, y: inner.y, width: inner.width - AXIS_WIDTH, height: inner.height - 2 })
}

/// Which actions a plot shows, where its cursor line is and which allocation it highlights.
struct PlotView {
    from: usize,
    to: usize,
    cursor_x: Option<usize>,
    selected: Option<u32>,
    /// Bands in their category's colour, else each allocation in one of the palette's.
    by_category: bool,
}

/// The stacked bands of the view's actions in `plot` (one column per bucket, peak of
/// each), the y axis in the `AXIS_WIDTH` columns left of it, and the peak label.
fn draw_plot(buf: &mut Buffer, plot: Rect, tl: &Timeline, detail: &DetailView, view: PlotView, theme: &Theme) {
    let dim = Style::default().fg(theme.ui.dim);
    let axis_x = plot.x - AXIS_WIDTH;
    let cols = plot.width as usize;
    let PlotView { from, to, cursor_x, selected, by_category } = view;
    let by_category = by_category.then(|| category_colours(tl, theme));
    let stacks = tl.stacks(detail, from, to, cols);
    let top = stacks.iter().map(|c| c.summarized.1).max().unwrap_or(0);
    let ymax = nice_ceiling(top + top / 20);
    let rows = plot.height as u64;
    for row in [0, plot.height / 2] {
        let v = ymax * (plot.height - row) as u64 / plot.height as u64;
        buf.set_string(axis_x, plot.y + row, format!("{:>8}", bytes(v)), dim);
    }
    buf.set_string(axis_x, plot.y + plot.height - 1, format!("{:>8}", "0"), dim);
    let span = to - from;
    for (x, col) in stacks.iter().enumerate() {
        let cx = plot.x + x as u16;
        // Heights in eighths of a cell; a cell takes the colour of the band at its middle.
        let eighths = |b: u64| (b as u128 * rows as u128 * 8 / ymax as u128) as u64;
        let tops: Vec<u64> = col.bands.iter().map(|b| eighths(b.y1)).collect();
        let colour = |pos: u64| -> Color {
            let k = tops.partition_point(|&t| t <= pos);
            match col.bands.get(k) {
                Some(b) if Some(b.alloc) == selected && Some(x) == cursor_x => theme.chart.peak,
                Some(b) if Some(b.alloc) == selected => theme.ui.accent,
                Some(b) => match &by_category {
                    Some(colours) => colours[tl.allocations[b.alloc as usize].category as usize],
                    None => theme.categories[b.alloc as usize % theme.categories.len()],
                },
                None => theme.ui.dim,
            }
        };
        let h = eighths(col.summarized.1);
        for r in 0..rows {
            let y = plot.y + plot.height - 1 - r as u16;
            let cell = &mut buf[(cx, y)];
            let lo = r * 8;
            if h >= lo + 8 {
                cell.set_char('█').set_fg(colour(lo + 4));
            } else if h > lo {
                cell.set_char(EIGHTHS[(h - lo) as usize]).set_fg(colour(lo + (h - lo) / 2));
            } else if Some(x) == cursor_x {
                cell.set_char('│').set_fg(theme.ui.border);
            }
        }
    }
    if (from..to).contains(&tl.peak_index) {
        let x = ((tl.peak_index - from) * cols / span) as u16;
        let label = format!("▼ active peak {}", bytes(tl.peak_bytes));
        let y = plot.y + plot.height.saturating_sub(1 + (tl.peak_bytes as u128 * rows as u128 / ymax as u128) as u16).min(plot.height - 1);
        let lx = (plot.x + x).min(plot.x + plot.width.saturating_sub(label.chars().count() as u16));
        buf.set_string(lx, y.saturating_sub(1).max(plot.y), label, Style::default().fg(theme.chart.peak).add_modifier(Modifier::BOLD));
    }
}

fn lifetime(start: Option<usize>, end: Option<usize>) -> String {
    match (start, end) {
        (None, None) => "whole trace".into(),
        (Some(x), None) => format!("{x}–end"),
        (None, Some(y)) => format!("start–{y}"),
        (Some(x), Some(y)) => format!("{x}–{y}"),
    }
}

/// A view whose analysis is still on its worker: its box and what it waits for.
fn render_waiting(f: &mut Frame, area: Rect, title: &str, waiting: &str, theme: &Theme) {
    let block = Block::default().borders(Borders::ALL).border_style(Style::default().fg(theme.ui.border)).title(Span::styled(format!(" {title} "), Style::default().fg(theme.ui.title)));
    f.render_widget(Paragraph::new(waiting.to_string()).style(Style::default().fg(theme.ui.dim)).block(block), area);
}

pub fn render_largest(f: &mut Frame, area: Rect, data: &ViewerData, ui: &ViewerUi, theme: &Theme) {
    if data.largest().ready().is_none() {
        return render_waiting(f, area, "largest allocations", data.largest().waiting_text(), theme);
    }
    let tl = &data.tl;
    let visible = area.height.saturating_sub(3) as usize;
    let first = ui.row.saturating_sub(visible.saturating_sub(1));
    // A category column when the file names categories (else every row would say unknown).
    let colours = has_categories(tl).then(|| category_colours(tl, theme));
    let rows: Vec<Row> = ui
        .rows
        .iter()
        .enumerate()
        .skip(first)
        .take(visible)
        .map(|(i, &id)| {
            let a = &tl.allocations[id as usize];
            let style = if i == ui.row { Style::default().bg(theme.ui.selection).add_modifier(Modifier::BOLD) } else { Style::default() };
            let start = (!a.alive_at_start).then_some(a.start);
            let mut cells = vec![Cell::from(format!("{}", i + 1)), Cell::from(bytes(a.size))];
            if let Some(colours) = &colours {
                let c = a.category as usize;
                cells.push(Cell::from(Line::from(vec![Span::styled("█ ", Style::default().fg(colours[c])), Span::raw(tl.categories[c].replace('_', " "))])));
            }
            cells.extend([
                Cell::from(format!("0x{:x}", a.addr)),
                Cell::from(lifetime(start, a.end)),
                Cell::from(top_frame_label(&data.snap, a.stack).unwrap_or_else(|| "(no frames)".into())),
            ]);
            Row::new(cells).style(style)
        })
        .collect();
    let filter = match (&ui.typing, ui.filter.as_str()) {
        (Some(t), _) => format!(" · search: {t}▏"),
        (None, "") => String::new(),
        (None, f) => format!(" · matching '{f}'"),
    };
    let title = format!(" largest allocations · {} of {} · by {}{filter} ", ui.rows.len(), tl.allocations.len(), ui.sort.name());
    let mut widths = vec![Constraint::Length(7), Constraint::Length(10)];
    let mut header = vec!["#", "requested"];
    if colours.is_some() {
        widths.push(Constraint::Length(17));
        header.push("category");
    }
    widths.extend([Constraint::Length(16), Constraint::Length(15), Constraint::Min(20)]);
    header.extend(["address", "alive (actions)", "top frame"]);
    let table = Table::new(rows, widths)
        .header(Row::new(header).style(Style::default().fg(theme.ui.dim).add_modifier(Modifier::BOLD)))
        .block(Block::default().borders(Borders::ALL).border_style(Style::default().fg(theme.ui.border)).title(Span::styled(title, Style::default().fg(theme.ui.title))));
    f.render_widget(table, area);
}

/// A torch.profiler trace's memory by operator, as the TensorBoard plugin's memory view
/// lists it: what each operator allocated and freed by itself and with what it calls, and
/// what it holds at the peak; largest own increase first.
pub fn render_operators(f: &mut Frame, area: Rect, data: &ViewerData, theme: &Theme) {
    let title = format!(" operators · {} on {} ", data.operators.len(), data.snap.device_name(data.device));
    let block = Block::default().borders(Borders::ALL).border_style(Style::default().fg(theme.ui.border)).title(Span::styled(title, Style::default().fg(theme.ui.title)));
    let signed = |b: i64| if b < 0 { format!("-{}", bytes(b.unsigned_abs())) } else { bytes(b as u64) };
    let rows: Vec<Row> = data
        .operators
        .iter()
        .take(area.height.saturating_sub(3) as usize)
        .map(|r| {
            Row::new(vec![
                Cell::from(signed(r.self_increase_bytes)),
                Cell::from(bytes(r.self_allocated_bytes)),
                Cell::from(r.self_allocations.to_string()),
                Cell::from(signed(r.increase_bytes)),
                Cell::from(bytes(r.allocated_bytes)),
                Cell::from(bytes(r.at_peak_bytes)),
                Cell::from(r.name.clone()),
            ])
        })
        .collect();
    if data.snap.profiled.as_ref().is_some_and(|p| p.form.is_timeline()) {
        let say = "a memory timeline keeps no operators: the trace of the same run (export_chrome_trace, tensorboard_trace_handler) has them";
        f.render_widget(Paragraph::new(say).wrap(Wrap { trim: true }).block(block).style(Style::default().fg(theme.ui.dim)), area);
        return;
    }
    let header = Row::new(["self +", "self alloc", "allocs", "with calls +", "with calls", "at peak", "operator"]).style(Style::default().fg(theme.ui.dim).add_modifier(Modifier::BOLD));
    let widths = [Constraint::Length(10), Constraint::Length(11), Constraint::Length(7), Constraint::Length(13), Constraint::Length(11), Constraint::Length(10), Constraint::Min(10)];
    f.render_widget(Table::new(rows, widths).header(header).block(block).style(Style::default().fg(theme.ui.text)), area);
}

pub fn render_segments(f: &mut Frame, area: Rect, data: &ViewerData, theme: &Theme) {
    let (segs, t) = data.segments();
    let dim = Style::default().fg(theme.ui.dim);
    let val = Style::default().fg(theme.ui.text).add_modifier(Modifier::BOLD);
    let block = Block::default().borders(Borders::ALL).border_style(Style::default().fg(theme.ui.border)).title(Span::styled(format!(" segments · {} on {} ", t.segments, data.snap.device_name(data.device)), Style::default().fg(theme.ui.title)));
    let inner = block.inner(area);
    f.render_widget(block, area);
    let [head, table] = Layout::vertical([Constraint::Length(3), Constraint::Min(1)]).areas(inner);
    let kv = |k: &str, v: String| vec![Span::styled(format!("{k} "), dim), Span::styled(v, val), Span::raw("   ")];
    let lines = vec![
        Line::from([kv("reserved", bytes(t.reserved)), kv("allocated", bytes(t.allocated)), kv("requested", bytes(t.requested))].concat()),
        Line::from([kv("fragmentation", format!("{:.1}%", t.fragmentation * 100.0)), kv("inactive (cached)", bytes(t.inactive)), kv("largest free block", bytes(t.largest_free_block))].concat()),
    ];
    f.render_widget(Paragraph::new(lines), head);
    let width = (table.width as usize).saturating_sub(78).clamp(8, 40);
    let rows: Vec<Row> = segs
        .iter()
        .take(table.height.saturating_sub(1) as usize)
        .map(|s| {
            let (used, free) = bar(if s.reserved == 0 { 0.0 } else { s.allocated as f64 / s.reserved as f64 }, width);
            Row::new(vec![
                Cell::from(format!("0x{:x}", s.address)),
                Cell::from(s.segment_type),
                Cell::from(bytes(s.reserved)),
                Cell::from(bytes(s.allocated)),
                Cell::from(bytes(s.requested)),
                Cell::from(bytes(s.inactive)),
                Cell::from(bytes(s.largest_free_block)),
                Cell::from(Line::from(vec![Span::styled(used, Style::default().fg(theme.chart.gauge_fill)), Span::styled(free, Style::default().fg(theme.chart.gauge_empty))])),
            ])
        })
        .collect();
    let widths = [Constraint::Length(16), Constraint::Length(6), Constraint::Length(9), Constraint::Length(9), Constraint::Length(9), Constraint::Length(9), Constraint::Length(10), Constraint::Min(8)];
    let header = Row::new(vec!["address", "pool", "reserved", "allocated", "requested", "inactive", "largest free", "allocated / reserved"]).style(dim.add_modifier(Modifier::BOLD));
    f.render_widget(Table::new(rows, widths).header(header), table);
}

pub fn render_categories(f: &mut Frame, area: Rect, data: &ViewerData, theme: &Theme) {
    let Some(b) = data.breakdown().ready() else {
        return render_waiting(f, area, "bytes at the peak", data.breakdown().waiting_text(), theme);
    };
    let what = if b.by == "category" { "category" } else { "top frame (the file names no categories)" };
    let block = Block::default().borders(Borders::ALL).border_style(Style::default().fg(theme.ui.border)).title(Span::styled(format!(" bytes at the peak (action {}) by {what} ", b.at_event), Style::default().fg(theme.ui.title)));
    let inner = block.inner(area);
    f.render_widget(block, area);
    let total: u64 = b.groups.iter().map(|g| g.bytes).sum();
    let bar_w = (inner.width as usize / 3).max(8);
    let label_w = (inner.width as usize).saturating_sub(bar_w + 30).max(10);
    let lines: Vec<Line> = b
        .groups
        .iter()
        .take(inner.height as usize)
        .enumerate()
        .map(|(i, g)| {
            let (fill, rest) = bar(g.bytes as f64 / total.max(1) as f64, bar_w);
            Line::from(vec![
                Span::styled(format!("{:>10} ", bytes(g.bytes)), Style::default().fg(theme.ui.text).add_modifier(Modifier::BOLD)),
                Span::styled(format!("{:>5.1}% ", g.bytes as f64 * 100.0 / total.max(1) as f64), Style::default().fg(theme.ui.dim)),
                Span::styled(fill, Style::default().fg(theme.categories[i % theme.categories.len()])),
                Span::styled(rest, Style::default().fg(theme.chart.gauge_empty)),
                Span::raw(format!(" {:>6} ", g.allocations)),
                Span::raw(fit(&g.name, label_w)),
            ])
        })
        .collect();
    f.render_widget(Paragraph::new(lines), inner);
}

/// Rows of the header above the views: two, and a line per note (two at most).
fn header_height(data: &ViewerData) -> u16 {
    2 + data.notes().len().min(2) as u16
}

/// How many rows the inspector's text runs past its box on a `size` screen.
pub fn inspector_overflow(data: &ViewerData, ui: &ViewerUi, keys: &KeyMap<ViewerKey>, theme: &Theme, size: ratatui::layout::Size) -> usize {
    if !ui.inspector {
        return 0;
    }
    let rows = size.height.saturating_sub(header_height(data) + 1 + 2) as usize;
    let text = Paragraph::new(inspector_lines(data, ui, keys, theme)).wrap(Wrap { trim: false });
    text.line_count(INSPECTOR_WIDTH - 2).saturating_sub(rows)
}

pub fn render_inspector(f: &mut Frame, area: Rect, data: &ViewerData, ui: &ViewerUi, keys: &KeyMap<ViewerKey>, theme: &Theme) {
    let text = Paragraph::new(inspector_lines(data, ui, keys, theme)).wrap(Wrap { trim: false });
    let inner_w = area.width.saturating_sub(2);
    let (total, rows) = (text.line_count(inner_w), area.height.saturating_sub(2) as usize);
    let scroll = ui.inspector_scroll.min(total.saturating_sub(rows));
    // Taller than its box: the title says which rows show and how to see the rest.
    let title = if total > rows {
        let (up, down) = (keys.label_of(ViewerKey::InspectorUp), keys.label_of(ViewerKey::InspectorDown));
        format!(" allocation {}–{}/{total} ({up}/{down}) ", scroll + 1, (scroll + rows).min(total))
    } else {
        " allocation ".to_string()
    };
    let block = Block::default().borders(Borders::ALL).border_style(Style::default().fg(theme.ui.accent)).title(Span::styled(title, Style::default().fg(theme.ui.title)));
    f.render_widget(text.scroll((scroll as u16, 0)).block(block), area);
}

/// What the inspector says about the selected allocation: its figures, then its frames,
/// Python first with the native ones folded into a line unless all are asked for.
fn inspector_lines(data: &ViewerData, ui: &ViewerUi, keys: &KeyMap<ViewerKey>, theme: &Theme) -> Vec<Line<'static>> {
    let dim = Style::default().fg(theme.ui.dim);
    let val = Style::default().fg(theme.ui.text).add_modifier(Modifier::BOLD);
    let Some(id) = ui.selected(data) else {
        return vec![Line::from(Span::styled("nothing selected: move the cursor onto a band, or pick a row", dim))];
    };
    let a = allocation_info(&data.snap, &data.tl, data.device, id, ui.all_frames);
    let kv = |k: &str, v: String| Line::from(vec![Span::styled(format!("{k:<11}"), dim), Span::styled(v, val)]);
    let secs = |e: Option<usize>| e.and_then(|e| rel_seconds(data, e));
    let all = keys.label_of(ViewerKey::AllFrames);
    let time = match (secs(a.start_event), secs(a.end_event)) {
        (Some(s), Some(e)) => format!("t+{s:.3}–{e:.3} s ({})", duration(e - s)),
        (Some(s), None) => format!("t+{s:.3} s – end"),
        (None, Some(e)) => format!("start – t+{e:.3} s"),
        (None, None) => "whole trace".into(),
    };
    let mut lines = vec![
        kv("size", bytes(a.size)),
        kv("requested", format!("{} ({} B)", bytes(a.requested_size), a.requested_size)),
        kv("address", format!("0x{:x}", a.address)),
        kv("alive", format!("actions {}", lifetime(a.start_event, a.end_event))),
        kv("time", time),
        kv("at peak", if a.alive_at_peak { "alive".into() } else { "not alive".into() }),
    ];
    if let Some(c) = &a.category {
        lines.push(kv("category", c.clone()));
    }
    if let Some((x, y)) = a.pool {
        lines.push(kv("pool", format!("({x}, {y})")));
    }
    if let Some(c) = &a.compile_context {
        lines.push(kv("compiled", c.clone()));
    }
    if let Some(m) = &a.user_metadata {
        lines.push(kv("metadata", m.clone()));
    }
    let how = if ui.all_frames { "all" } else { "collapsed" };
    lines.push(Line::from(Span::styled(format!("frames ({how}; {all} toggles):"), dim)));
    push_frames(&mut lines, &a.frames, !ui.all_frames, &all, dim);
    if a.frames.is_empty() {
        lines.push(Line::from(Span::styled("  (none recorded)", dim)));
    }
    if !a.forward_frames.is_empty() {
        lines.push(Line::from(Span::styled("made in backward for the forward op at:", dim)));
        push_frames(&mut lines, &a.forward_frames, !ui.all_frames, &all, dim);
    }
    lines
}

/// Frames as inspector lines, each FX node (generated code) on the line below its frame.
/// `fold`: the Python frames, then one line counting the native ones (shown as they are
/// when there is no Python frame); `all` is the key that unfolds them.
fn push_frames(lines: &mut Vec<Line<'static>>, frames: &[ShownFrame], fold: bool, all: &str, dim: Style) {
    let python = frames.iter().filter(|f| f.is_python()).count();
    let fold = fold && python > 0;
    for fr in frames.iter().filter(|f| !fold || f.is_python()) {
        let rep = if fr.repeats > 1 { format!(" ×{}", fr.repeats) } else { String::new() };
        lines.push(Line::from(Span::raw(format!("  {}{rep}", frame_label(&fr.name, &fr.filename, fr.line)))));
        if let Some(fx) = &fr.fx {
            lines.push(Line::from(Span::styled(format!("    fx {fx}"), dim)));
        }
    }
    let native = frames.len() - python;
    if fold && native > 0 {
        let s = if native == 1 { "" } else { "s" };
        lines.push(Line::from(Span::styled(format!("  +{native} native frame{s} ({all} shows them)"), dim)));
    }
}

pub fn render_footer(f: &mut Frame, area: Rect, data: &ViewerData, ui: &ViewerUi, keys: &KeyMap<ViewerKey>, theme: &Theme) {
    if ui.typing.is_some() {
        f.render_widget(Paragraph::new("type a frame name, file or address · enter applies · esc cancels").style(Style::default().fg(theme.ui.accent)), area);
        return;
    }
    let mut items = vec![
        (ViewerKey::Help, "help"),
        (ViewerKey::NextTab, "view"),
        (ViewerKey::DetailLess, "detail-"),
        (ViewerKey::DetailMore, "detail+"),
        (ViewerKey::ZoomIn, "zoom"),
        (ViewerKey::Inspect, "inspect"),
        (ViewerKey::Search, "search"),
        (ViewerKey::JumpToPeak, "peak"),
    ];
    if !data.ooms().is_empty() {
        items.push((ViewerKey::OomReport, "why OOM"));
    }
    items.extend([(ViewerKey::WhatIf, "what-if"), (ViewerKey::Quit, "quit")]);
    f.render_widget(Paragraph::new(key_hints(keys, &items, theme)), area);
}

/// Why the device ran out of memory: the request, what was free, reserved against
/// allocated then, the verdict, and what was alive by call site and category.
pub fn render_oom_panel(f: &mut Frame, area: Rect, data: &ViewerData, keys: &KeyMap<ViewerKey>, theme: &Theme) {
    let close = keys.label_of(ViewerKey::OomReport);
    let title = format!(" out of memory · device {} ({close} closes) ", data.device);
    let dim = Style::default().fg(theme.ui.dim);
    let val = Style::default().fg(theme.ui.text).add_modifier(Modifier::BOLD);
    let kv = |k: &str, v: String| Line::from(vec![Span::styled(format!("{k:<22}"), dim), Span::styled(v, val)]);
    let whatif = keys.label_of(ViewerKey::WhatIf);
    let Some(reports) = data.oom_reports().ready() else {
        let inner = chrome::overlay::panel(f, area, (80, 3), title, theme);
        f.render_widget(Paragraph::new(format!("replaying the trace up to the OOM: {}", data.oom_reports().waiting_text())).style(dim), inner);
        return;
    };
    if reports.is_empty() {
        let inner = chrome::overlay::panel(f, area, (80, 5), title, theme);
        let msg = format!("device {}'s trace has no out-of-memory entry. {whatif}: how other allocator settings would have fared.", data.device);
        f.render_widget(Paragraph::new(msg).style(dim).wrap(Wrap { trim: true }), inner);
        return;
    }
    let mut lines = Vec::new();
    for r in reports {
        lines.extend([
            kv("requested", format!("{} at trace entry {}, before action {}", bytes(r.requested_bytes), r.entry, r.action)),
            kv("free on the device", bytes(r.device_free_bytes)),
            kv("reserved", bytes(r.reserved_bytes)),
            kv("allocated", bytes(r.allocated_bytes)),
            kv("reserved, unallocated", format!("{} (largest free block {})", bytes(r.cached_free_bytes), bytes(r.largest_free_block_bytes))),
            Line::from(vec![Span::styled(format!("{:<22}", "why"), dim), Span::styled(r.verdict(), Style::default().fg(theme.ui.error).add_modifier(Modifier::BOLD))]),
        ]);
        if !r.modelled_exactly {
            lines.push(Line::from(Span::styled("  (allocated and the largest free block are the allocator model's reconstruction)", dim)));
        }
        for b in std::iter::once(&r.by_top_frame).chain(&r.by_category) {
            lines.push(Line::from(Span::styled(format!("alive then, by {}:", b.by.replace('_', " ")), dim)));
            for g in b.groups.iter().take(6) {
                lines.push(Line::from(format!("  {:>10}  {:>5} allocs  {}", bytes(g.bytes), g.allocations, g.name)));
            }
        }
    }
    lines.push(Line::from(Span::styled(format!("{whatif}: would other allocator settings have fit the request?"), Style::default().fg(theme.ui.accent))));
    // Room for the verdict to wrap.
    let inner = chrome::overlay::panel(f, area, (120, lines.len() as u16 + 4), title, theme);
    f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), inner);
}

/// The trace replayed under other allocator settings: a row per setting, the recorded
/// one first with its self-check.
pub fn render_whatif_panel(f: &mut Frame, area: Rect, data: &ViewerData, keys: &KeyMap<ViewerKey>, theme: &Theme) {
    let close = keys.label_of(ViewerKey::WhatIf);
    let title = format!(" what if · device {}: the trace under other allocator settings ({close} closes) ", data.device);
    let dim = Style::default().fg(theme.ui.dim);
    if data.tl.total_events == 0 {
        let inner = chrome::overlay::panel(f, area, (80, 3), title, theme);
        f.render_widget(Paragraph::new(format!("device {} has no alloc/free actions to replay", data.device)).style(dim), inner);
        return;
    }
    let Some(w) = data.whatif().ready() else {
        let inner = chrome::overlay::panel(f, area, (80, 3), title, theme);
        f.render_widget(Paragraph::new(format!("replaying the trace under each setting: {}", data.whatif().waiting_text())).style(dim), inner);
        return;
    };
    let inner = chrome::overlay::panel(f, area, (156, w.rows.len() as u16 + 7), title, theme);
    let [head, table, foot] = Layout::vertical([Constraint::Length(1), Constraint::Length(w.rows.len() as u16 + 1), Constraint::Min(1)]).areas(inner);
    let about = match &w.oom {
        Some(o) => format!(
            "OOM at trace entry {}: {} requested, {} free on the device; each row has the {} the allocator had then",
            o.entry,
            bytes(o.requested_bytes),
            bytes(o.device_free_bytes),
            bytes(o.capacity_bytes)
        ),
        None => "each row replays the trace from the state it began in; the device never ran out".into(),
    };
    f.render_widget(Paragraph::new(about).style(dim), head);
    let with_oom = w.oom.is_some();
    let mut header = vec!["settings"];
    if with_oom {
        header.push("OOM request");
    }
    header.extend(["peak reserved", "peak active", "frag@peak", "largest free"]);
    if with_oom {
        header.push("largest free@OOM");
    }
    header.push("segments");
    let rows: Vec<Row> = w
        .rows
        .iter()
        .map(|r| {
            let mut cells = vec![setting_label(r)];
            if let Some(o) = &w.oom {
                cells.push(oom_outcome(r, o));
            }
            cells.extend([
                bytes(r.peak_reserved_bytes),
                bytes(r.peak_active_bytes),
                format!("{:.1}%", r.fragmentation_at_peak * 100.0),
                bytes(r.largest_free_block_bytes),
            ]);
            if with_oom {
                cells.push(r.largest_free_block_at_oom_bytes.map_or_else(|| "–".to_string(), bytes));
            }
            cells.push(r.segments_created.to_string());
            let style = if r.recorded { Style::default().add_modifier(Modifier::BOLD) } else { Style::default() };
            Row::new(cells).style(style)
        })
        .collect();
    let label = w.rows.iter().map(|r| setting_label(r).chars().count()).max().unwrap_or(8) as u16;
    let mut widths = vec![Constraint::Length(label.min(48))];
    if with_oom {
        widths.push(Constraint::Length(27));
    }
    widths.extend([Constraint::Length(13), Constraint::Length(11), Constraint::Length(9), Constraint::Length(12)]);
    if with_oom {
        widths.push(Constraint::Length(16));
    }
    widths.push(Constraint::Length(8));
    f.render_widget(Table::new(rows, widths).header(Row::new(header).style(dim.add_modifier(Modifier::BOLD))), table);
    if let Some(s) = self_check_sentence(w) {
        let ok = w.rows[0].self_check.as_ref().is_some_and(|c| c.matches_recording);
        let style = if ok { dim } else { Style::default().fg(theme.ui.error) };
        f.render_widget(Paragraph::new(s).style(style).wrap(Wrap { trim: true }), foot);
    }
}

/// `vramscope view` while a large file is read: progress, the segment totals once read,
/// and the timeline of the trace decoded so far.
pub fn render_loading(f: &mut Frame, l: &Loading, keys: &KeyMap<ViewerKey>, theme: &Theme) {
    let Some(area) = chrome::screen(f, (MIN_WIDTH, MIN_HEIGHT), theme) else { return };
    let dim = Style::default().fg(theme.ui.dim);
    let val = Style::default().fg(theme.ui.text).add_modifier(Modifier::BOLD);
    let sep = || Span::styled(" · ", dim);
    let [header, body, footer] = Layout::vertical([Constraint::Length(2), Constraint::Min(8), Constraint::Length(1)]).areas(area);
    let pct = l.fraction() * 100.0;
    let (fill, rest) = bar(l.fraction(), 24);
    let what = match l.pass {
        ReadPass::Check => "checking opcodes",
        ReadPass::Decode => "decoding",
    };
    let line1 = Line::from(vec![
        Span::styled("vramscope view ", Style::default().fg(theme.ui.title).add_modifier(Modifier::BOLD)),
        Span::styled(l.name.clone(), val),
        sep(),
        Span::styled(l.device.map_or_else(|| "device not known yet".into(), |d| format!("device {d}")), val),
        sep(),
        Span::styled(format!("loading {pct:.0}% "), Style::default().fg(theme.ui.accent).add_modifier(Modifier::BOLD)),
        Span::styled(fill, Style::default().fg(theme.chart.gauge_fill)),
        Span::styled(rest, Style::default().fg(theme.chart.gauge_empty)),
        Span::styled(format!(" {what}, {} of {}", bytes(l.done as u64), bytes(l.total as u64)), dim),
    ]);
    let mut line2 = vec![Span::styled(format!("{} trace entries so far", l.entries), dim)];
    if let Some(t) = &l.segments {
        line2.extend([
            sep(),
            Span::styled(format!("{} segments, reserved ", t.segments), dim),
            Span::styled(bytes(t.reserved), val),
            Span::styled(", fragmentation ", dim),
            Span::styled(format!("{:.1}%", t.fragmentation * 100.0), val),
        ]);
    }
    if let Some(tl) = l.timeline().filter(|tl| tl.total_events > 0) {
        line2.extend([sep(), Span::styled("peak active so far ", dim), Span::styled(bytes(tl.peak_bytes), Style::default().fg(theme.chart.peak).add_modifier(Modifier::BOLD))]);
    }
    f.render_widget(Paragraph::new(vec![line1, Line::from(line2)]), header);
    let events = l.timeline().map_or(0, |tl| tl.total_events);
    let title = format!(" active memory timeline · {events} actions read so far · blocks alive throughout are added when loaded ");
    if let Some(plot) = plot_frame(f, body, title, theme) {
        match l.timeline().filter(|tl| tl.total_events > 0) {
            Some(tl) => {
                let view = PlotView { from: 0, to: tl.total_events, cursor_x: None, selected: None, by_category: has_categories(tl) };
                draw_plot(f.buffer_mut(), plot, tl, &l.detail, view, theme)
            }
            None => f.render_widget(Paragraph::new(format!("{what}…")).style(dim), plot),
        }
        let note = "the other views, the inspector and search open once the file is loaded";
        f.buffer_mut().set_string(plot.x, plot.y + plot.height + 1, fit(note, plot.width as usize), dim);
    }
    f.render_widget(Paragraph::new(key_hints(keys, &[(ViewerKey::NextTheme, "theme"), (ViewerKey::Quit, "quit")], theme)), footer);
}
