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
use crate::chrome::fields::{fit_line, keep_columns, Column, Field, Keep};
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
    let d = data.device;
    let entries = s.trace(d).len();
    let name = Span::styled(data.name.clone(), val);
    let mut line1 = vec![
        Field::new(Keep::Must, vec![Span::styled("vramscope view ", Style::default().fg(theme.ui.title).add_modifier(Modifier::BOLD)), name.clone()])
            .or_losing(Keep::Least, vec![name]),
        Field::text(Keep::High, format!("{} of {}", s.device_name(d), s.device_count()), val),
    ];
    // What the shown device holds (the other devices' are a key away). A torch.profiler
    // trace has no segments: what it covers is what to know.
    line1.push(match &s.profiled {
        Some(p) if p.form == TraceForm::MemoryTimeline => Field::text(Keep::Low, format!("memory timeline, category totals, {entries} changes"), dim).or_text(format!("{entries} changes")),
        Some(p) if p.form == TraceForm::MemoryTimelineRaw => Field::text(Keep::Low, format!("memory timeline, {entries} tensor events"), dim).or_text(format!("{entries} tensor events")),
        Some(p) => Field::text(Keep::Low, format!("torch.profiler trace, profiled window only ({} step{}), {entries} memory events", p.steps.len(), if p.steps.len() == 1 { "" } else { "s" }), dim)
            .or_text(format!("profiled window only, {entries} memory events")),
        None => {
            let segments = s.device_segments(d).count();
            let blocks: usize = s.device_segments(d).map(|g| g.blocks.len()).sum();
            Field::text(Keep::Low, format!("{segments} segments, {blocks} blocks, {entries} trace entries"), dim).or_text(format!("{segments} segments, {entries} entries"))
        }
    });
    if let Some(&(_, action)) = data.ooms().first() {
        let oom = Style::default().fg(theme.ui.error).add_modifier(Modifier::BOLD);
        line1.push(Field::text(Keep::Must, format!("OUT OF MEMORY at action {action}"), oom).or_text_losing(Keep::Mid, format!("OOM at action {action}")));
    }
    let mut tabs: Vec<Span> = Vec::new();
    for t in Tab::ALL {
        let style = if t == ui.tab { Style::default().fg(theme.ui.background).bg(theme.ui.accent).add_modifier(Modifier::BOLD) } else { dim };
        // A trace has no segments: its third view is its operators.
        let title = if t == Tab::Segments && data.snap.profiled.is_some() { "operators" } else { t.title() };
        tabs.push(Span::styled(format!(" {title} "), style));
        tabs.push(Span::raw(" "));
    }
    tabs.pop();
    let peak = Span::styled(bytes(data.tl.peak_bytes), Style::default().fg(theme.chart.peak).add_modifier(Modifier::BOLD));
    let reserved = match s.profiled.as_ref().map(|p| p.peak_reserved(d)) {
        Some(None) => Span::styled("not in the file", dim),
        Some(Some(r)) => Span::styled(bytes(r), val),
        None => Span::styled(bytes(data.reserved().0), val),
    };
    let line2 = vec![
        Field::new(Keep::Must, tabs),
        Field::new(Keep::High, vec![Span::styled("peak active ", dim), peak.clone()]).or_losing(Keep::Least, vec![Span::styled("active ", dim), peak]),
        Field::new(Keep::High, vec![Span::styled("peak reserved ", dim), reserved.clone()]).or_losing(Keep::Least, vec![Span::styled("reserved ", dim), reserved]),
    ];
    let width = area.width as usize;
    let mut lines = vec![fit_line(line1, width, sep()), fit_line(line2, width, Span::raw("  "))];
    for note in data.notes() {
        let colour = if note.starts_with("warning") { theme.ui.warning } else { theme.ui.dim };
        lines.push(Line::from(Span::styled(fit(note, width), Style::default().fg(colour))));
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
    let plain = Style::default();
    let title = vec![
        Field::text(Keep::Must, "active memory timeline", plain),
        Field::text(Keep::High, format!("{colouring}{why}"), plain).or_text_losing(Keep::Least, colouring),
        Field::text(Keep::Must, format!("actions {}–{} of {}", ui.from, ui.to, tl.total_events), plain),
        Field::text(Keep::Mid, format!("detail {}% ({} of {} drawn, rest summarized)", DETAIL_STEPS[data.detail_step], data.drawn(), tl.allocations.len()), plain)
            .or_text_losing(Keep::Least, format!("detail {}%", DETAIL_STEPS[data.detail_step])),
    ];
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
    // Out-of-memory failures (!), before the action that follows them; one that ends the
    // trace on the last action.
    let oom_actions: Vec<usize> = data.ooms().iter().map(|&(_, e)| e.min(tl.total_events - 1)).collect();
    for &e in &oom_actions {
        if (ui.from..ui.to).contains(&e) {
            let x = plot.x + ((e - ui.from) * cols / span) as u16;
            buf[(x, ribbon_y)].set_char('!').set_fg(theme.ui.error);
        }
    }
    // The cursor on an out-of-memory keeps the '!' in sight, marked as under the cursor.
    let under = &mut buf[(plot.x + cursor_x as u16, ribbon_y)];
    if under.symbol() == "!" {
        under.set_fg(theme.ui.background).set_bg(theme.ui.error);
    } else {
        under.set_char('▲').set_fg(theme.ui.text);
    }
    // Status: the cursor's action, time, total, open annotations and the selected band.
    let total = tl.totals_at(ui.cursor);
    let mut open: Vec<&str> = Vec::new();
    for m in data.marks().iter().filter(|m| m.event.is_some_and(|e| e <= ui.cursor)) {
        if m.stage == "START" {
            open.push(&m.name);
        } else if let Some(i) = open.iter().rposition(|n| *n == m.name) {
            open.remove(i);
        }
    }
    let text = Style::default().fg(theme.ui.text);
    let mut status = vec![Field::text(Keep::Must, format!("action {}", ui.cursor), text)];
    status.extend(rel_seconds(data, ui.cursor).map(|s| Field::text(Keep::Low, format!("t+{s:.3} s"), text)));
    status.push(Field::text(Keep::Must, format!("active {}", bytes(total)), text));
    if !open.is_empty() {
        status.push(Field::text(Keep::Mid, format!("in {}", open.join(" > ")), text).or_text(format!("in {}", open.last().expect("open annotations"))));
    }
    if oom_actions.contains(&ui.cursor) {
        status.push(Field::text(Keep::Must, "out of memory just before", Style::default().fg(theme.ui.error).add_modifier(Modifier::BOLD)).or_text("OOM before"));
    }
    if let Some(id) = selected {
        let a = &tl.allocations[id as usize];
        status.push(Field::text(Keep::High, format!("selected {} at 0x{:x}", bytes(a.size), a.addr), text).or_text(format!("selected {}", bytes(a.size))));
    }
    let status = fit_line(status, plot.width as usize, Span::styled(" · ", text));
    let used = status.width();
    buf.set_line(plot.x, status_y, &status, plot.width);
    if ui.by_category {
        draw_legend(buf, plot, status_y, used, tl, theme);
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
/// Widths of a table's shown columns: each its own, the last taking what is left.
fn table_widths<'a>(shown: impl Iterator<Item = &'a Column>) -> Vec<Constraint> {
    let mut widths: Vec<Constraint> = shown.map(|c| Constraint::Length(c.cells())).collect();
    if let Some(Constraint::Length(w)) = widths.last().copied() {
        *widths.last_mut().expect("a last column") = Constraint::Min(w);
    }
    widths
}

/// A bordered box whose title holds the fields that fit its top edge; the plot inside it.
fn plot_frame(f: &mut Frame, area: Rect, title: Vec<Field>, theme: &Theme) -> Option<Rect> {
    let style = Style::default().fg(theme.ui.title);
    let mut title = fit_line(title, (area.width as usize).saturating_sub(4), Span::styled(" · ", style)).style(style);
    title.spans.insert(0, Span::raw(" "));
    title.spans.push(Span::raw(" "));
    let block = Block::default().borders(Borders::ALL).border_style(Style::default().fg(theme.ui.border)).title(title);
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
    let mut columns = vec![Column::new("#", 5, Keep::Low), Column::new("requested", 10, Keep::Must)];
    columns.extend(colours.is_some().then(|| Column::new("category", 17, Keep::High)));
    columns.extend([Column::new("address", 14, Keep::Least), Column::new("alive (actions)", 15, Keep::Mid)]);
    let frame = Column::new("top frame", 24, Keep::Must);
    columns.push(frame);
    let kept = keep_columns(&columns, area.width.saturating_sub(2));
    let others: u16 = columns.iter().zip(&kept).filter(|(_, k)| **k).map(|(c, _)| c.cells() + 1).sum::<u16>() - (frame.cells() + 1);
    // The frame (the last column) takes the rest, cut with '…' where it must be.
    let frame_w = area.width.saturating_sub(2 + others).max(frame.cells()) as usize;
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
            let category = colours.as_ref().map(|colours| {
                let c = a.category as usize;
                Cell::from(Line::from(vec![Span::styled("█ ", Style::default().fg(colours[c])), Span::raw(tl.categories[c].replace('_', " "))]))
            });
            let mut cells = vec![Cell::from(format!("{}", i + 1)), Cell::from(bytes(a.size))];
            cells.extend(category);
            cells.extend([
                Cell::from(format!("0x{:x}", a.addr)),
                Cell::from(lifetime(start, a.end)),
                Cell::from(fit(&top_frame_label(&data.snap, a.stack).unwrap_or_else(|| "(no frames)".into()), frame_w)),
            ]);
            Row::new(cells.into_iter().zip(&kept).filter(|(_, k)| **k).map(|(c, _)| c)).style(style)
        })
        .collect();
    let filter = match (&ui.typing, ui.filter.as_str()) {
        (Some(t), _) => format!(" · search: {t}▏"),
        (None, "") => String::new(),
        (None, f) => format!(" · matching '{f}'"),
    };
    let title = format!(" largest allocations · {} of {} · by {}{filter} ", ui.rows.len(), tl.allocations.len(), ui.sort.name());
    let shown = || columns.iter().zip(&kept).filter(|(_, k)| **k).map(|(c, _)| c);
    let widths = table_widths(shown());
    let header: Vec<&str> = shown().map(|c| c.heading).collect();
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
    let kv = |keep, k: &str, v: String| Field::new(keep, vec![Span::styled(format!("{k} "), dim), Span::styled(v, val)]);
    let gap = || Span::raw("   ");
    let lines = vec![
        fit_line(vec![kv(Keep::Must, "reserved", bytes(t.reserved)), kv(Keep::High, "allocated", bytes(t.allocated)), kv(Keep::Mid, "requested", bytes(t.requested))], head.width as usize, gap()),
        fit_line(
            vec![kv(Keep::Must, "fragmentation", format!("{:.1}%", t.fragmentation * 100.0)), kv(Keep::Mid, "inactive (cached)", bytes(t.inactive)), kv(Keep::High, "largest free block", bytes(t.largest_free_block))],
            head.width as usize,
            gap(),
        ),
    ];
    f.render_widget(Paragraph::new(lines), head);
    let columns = [
        Column::new("address", 14, Keep::Mid),
        Column::new("pool", 5, Keep::Low),
        Column::new("reserved", 9, Keep::Must),
        Column::new("allocated", 9, Keep::High),
        Column::new("requested", 9, Keep::Least),
        Column::new("inactive", 9, Keep::Mid),
        Column::new("largest free", 9, Keep::Low),
        Column::new("allocated / reserved", 8, Keep::Least),
    ];
    let kept = keep_columns(&columns, table.width);
    let used: u16 = columns.iter().zip(&kept).filter(|(_, k)| **k).map(|(c, _)| c.cells() + 1).sum();
    // The bar takes what the other columns leave.
    let bar_w = (table.width.saturating_sub(used) + columns[7].cells()).clamp(8, 40) as usize;
    let rows: Vec<Row> = segs
        .iter()
        .take(table.height.saturating_sub(1) as usize)
        .map(|s| {
            let (used, free) = bar(if s.reserved == 0 { 0.0 } else { s.allocated as f64 / s.reserved as f64 }, bar_w);
            let cells = [
                Cell::from(format!("0x{:x}", s.address)),
                Cell::from(s.segment_type),
                Cell::from(bytes(s.reserved)),
                Cell::from(bytes(s.allocated)),
                Cell::from(bytes(s.requested)),
                Cell::from(bytes(s.inactive)),
                Cell::from(bytes(s.largest_free_block)),
                Cell::from(Line::from(vec![Span::styled(used, Style::default().fg(theme.chart.gauge_fill)), Span::styled(free, Style::default().fg(theme.chart.gauge_empty))])),
            ];
            Row::new(cells.into_iter().zip(&kept).filter(|(_, k)| **k).map(|(c, _)| c))
        })
        .collect();
    let widths = table_widths(columns.iter().zip(&kept).filter(|(_, k)| **k).map(|(c, _)| c));
    let header = Row::new(columns.iter().zip(&kept).filter(|(_, k)| **k).map(|(c, _)| c.heading)).style(dim.add_modifier(Modifier::BOLD));
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
    f.render_widget(Paragraph::new(key_hints(keys, &items, theme, area.width)), area);
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
                lines.push(Line::from(format!("  {}", g.row())));
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
    // Each setting's label wraps at its commas when the settings column is narrow.
    let label_w = w.rows.iter().map(|r| setting_label(r).chars().count()).max().unwrap_or(8);
    let inner_w = area.width.min(156).saturating_sub(2);
    type Cells<'a> = Box<dyn Fn(&vramscope_core::report::whatif::WhatifRow) -> String + 'a>;
    let mut columns: Vec<(Column, Cells)> = Vec::new();
    if let Some(o) = &w.oom {
        columns.push((Column::new("OOM request", 27, Keep::Must), Box::new(move |r| oom_outcome(r, o))));
    }
    columns.push((Column::new("peak reserved", 9, Keep::High), Box::new(|r| bytes(r.peak_reserved_bytes))));
    columns.push((Column::new("peak active", 9, Keep::Mid), Box::new(|r| bytes(r.peak_active_bytes))));
    columns.push((Column::new("frag@peak", 6, Keep::Low), Box::new(|r| format!("{:.1}%", r.fragmentation_at_peak * 100.0))));
    columns.push((Column::new("largest free", 9, Keep::Low), Box::new(|r| bytes(r.largest_free_block_bytes))));
    if w.oom.is_some() {
        columns.push((Column::new("largest free@OOM", 9, Keep::Mid), Box::new(|r| r.largest_free_block_at_oom_bytes.map_or_else(|| "–".to_string(), bytes))));
    }
    columns.push((Column::new("segments", 8, Keep::Least), Box::new(|r| r.segments_created.to_string())));
    // The settings column needs room for its longest option; the rest gives way for it.
    let settings = Column::new("settings", label_w.min(26) as u16, Keep::Must);
    let all: Vec<Column> = std::iter::once(settings).chain(columns.iter().map(|c| c.0)).collect();
    let kept = keep_columns(&all, inner_w);
    let columns: Vec<(Column, Cells)> = columns.into_iter().zip(&kept[1..]).filter(|(_, k)| **k).map(|(c, _)| c).collect();
    let others: u16 = columns.iter().map(|c| c.0.cells() + 1).sum();
    let settings_w = (label_w as u16).min(inner_w.saturating_sub(others).max(settings.cells())) as usize;
    let labels: Vec<String> = w.rows.iter().map(|r| wrap_at_commas(&setting_label(r), settings_w)).collect();
    let rows: Vec<Row> = w
        .rows
        .iter()
        .zip(&labels)
        .map(|(r, label)| {
            let cells = std::iter::once(label.clone()).chain(columns.iter().map(|c| (c.1)(r)));
            let style = if r.recorded { Style::default().add_modifier(Modifier::BOLD) } else { Style::default() };
            Row::new(cells).height(label.lines().count().max(1) as u16).style(style)
        })
        .collect();
    let table_h: u16 = labels.iter().map(|l| l.lines().count().max(1) as u16).sum();
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
    // Lines a text takes, wrapped at `inner_w` (a word more per line, to be safe).
    let lines_of = |t: &str| (t.chars().count() as u16).div_ceil(inner_w.saturating_sub(8).max(1));
    let check = self_check_sentence(w);
    let (head_h, foot_h) = (lines_of(&about), check.as_deref().map_or(0, lines_of));
    let inner = chrome::overlay::panel(f, area, (156, head_h + table_h + 1 + foot_h + 2), title, theme);
    let [head, table, foot] = Layout::vertical([Constraint::Length(head_h), Constraint::Length(table_h + 1), Constraint::Min(1)]).areas(inner);
    f.render_widget(Paragraph::new(about).style(dim).wrap(Wrap { trim: true }), head);
    let header = std::iter::once("settings").chain(columns.iter().map(|c| c.0.heading));
    let widths = std::iter::once(Constraint::Length(settings_w as u16)).chain(columns.iter().map(|c| Constraint::Length(c.0.cells())));
    f.render_widget(Table::new(rows, widths).header(Row::new(header).style(dim.add_modifier(Modifier::BOLD))), table);
    if let Some(s) = check {
        let ok = w.rows[0].self_check.as_ref().is_some_and(|c| c.matches_recording);
        let style = if ok { dim } else { Style::default().fg(theme.ui.error) };
        f.render_widget(Paragraph::new(s).style(style).wrap(Wrap { trim: true }), foot);
    }
}

/// `s` in lines of at most `width` characters, broken after its commas (a setting's
/// options stay whole); an option longer than the width is cut with '…'.
fn wrap_at_commas(s: &str, width: usize) -> String {
    let mut lines: Vec<String> = vec![String::new()];
    for part in s.split_inclusive(',') {
        let last = lines.last_mut().expect("a line");
        if !last.is_empty() && last.chars().count() + part.chars().count() > width {
            lines.push(String::new());
        }
        lines.last_mut().expect("a line").push_str(part);
    }
    lines.iter().map(|l| fit(l, width)).collect::<Vec<_>>().join("\n")
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
    let name = Span::styled(l.name.clone(), val);
    let progress = vec![
        Span::styled(format!("loading {pct:.0}% "), Style::default().fg(theme.ui.accent).add_modifier(Modifier::BOLD)),
        Span::styled(fill, Style::default().fg(theme.chart.gauge_fill)),
        Span::styled(rest, Style::default().fg(theme.chart.gauge_empty)),
    ];
    let line1 = vec![
        Field::new(Keep::Must, vec![Span::styled("vramscope view ", Style::default().fg(theme.ui.title).add_modifier(Modifier::BOLD)), name.clone()]).or_losing(Keep::Least, vec![name]),
        Field::text(Keep::Mid, l.device.map_or_else(|| "device not known yet".into(), |d| format!("device {d}")), val),
        Field::new(Keep::Must, [progress.clone(), vec![Span::styled(format!(" {what}, {} of {}", bytes(l.done as u64), bytes(l.total as u64)), dim)]].concat())
            .or_losing(Keep::Low, progress),
    ];
    let mut line2 = vec![Field::text(Keep::High, format!("{} trace entries so far", l.entries), dim).or_text(format!("{} entries", l.entries))];
    if let Some(t) = &l.segments {
        line2.push(Field::new(Keep::Mid, vec![Span::styled(format!("{} segments, reserved ", t.segments), dim), Span::styled(bytes(t.reserved), val)]).or(vec![Span::styled("reserved ", dim), Span::styled(bytes(t.reserved), val)]));
        line2.push(Field::new(Keep::Low, vec![Span::styled("fragmentation ", dim), Span::styled(format!("{:.1}%", t.fragmentation * 100.0), val)]));
    }
    if let Some(tl) = l.timeline().filter(|tl| tl.total_events > 0) {
        let peak = Span::styled(bytes(tl.peak_bytes), Style::default().fg(theme.chart.peak).add_modifier(Modifier::BOLD));
        line2.push(Field::new(Keep::High, vec![Span::styled("peak active so far ", dim), peak.clone()]).or_losing(Keep::Least, vec![Span::styled("peak ", dim), peak]));
    }
    let width = header.width as usize;
    f.render_widget(Paragraph::new(vec![fit_line(line1, width, sep()), fit_line(line2, width, sep())]), header);
    let events = l.timeline().map_or(0, |tl| tl.total_events);
    let plain = Style::default();
    let title = vec![
        Field::text(Keep::Must, "active memory timeline", plain),
        Field::text(Keep::High, format!("{events} actions read so far"), plain),
        Field::text(Keep::Least, "blocks alive throughout are added when loaded", plain),
    ];
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
    f.render_widget(Paragraph::new(key_hints(keys, &[(ViewerKey::NextTheme, "theme"), (ViewerKey::Quit, "quit")], theme, footer.width)), footer);
}
