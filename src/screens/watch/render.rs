//! The `watch` screen: every device with its memory, load and processes, and history
//! graphs of the selected one; or, without NVML, the host's memory and CPU.

use std::cmp::Reverse;

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Sparkline, Wrap};
use ratatui::Frame;

use crate::draw::text::{bar, fit};
use vramscope_core::format::bytes;
use super::state::{ProcessSort, WatchState};
use crate::chrome;
use crate::theme::Theme;
use vramscope_core::source::gauges::{DeviceSample, HostSample, Metric, SourceKind};

/// Below this size the screen shows a message instead of a cramped layout.
pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 15;

pub fn render_watch(frame: &mut Frame, state: &WatchState, theme: &Theme) {
    let Some(area) = chrome::screen(frame, (MIN_WIDTH, MIN_HEIGHT), theme) else { return };
    let status_line = status_line(state, theme);
    // A long reason (the loader's message) wraps rather than being cut off.
    let status_h = (status_line.width() as u16)
        .div_ceil(area.width)
        .clamp(1, 3);
    let [title, body, status] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(status_h),
    ])
    .areas(area);
    render_title(frame, title, state, theme);
    frame.render_widget(
        Paragraph::new(status_line).wrap(Wrap { trim: false }),
        status,
    );
    let kind = state.history.status().map(|s| s.kind);
    match state.history.latest().map(|s| s.host()) {
        Some(Some(host)) => render_host(frame, body, state, host, theme),
        Some(None) => render_devices_view(frame, body, state, theme),
        None => {
            let msg = match kind {
                Some(SourceKind::None) => "No gauge source works here; see the line below.",
                _ => "Waiting for the first sample…",
            };
            frame.render_widget(
                Paragraph::new(msg).style(Style::new().fg(theme.ui.dim)),
                body,
            );
        }
    }
    if state.help {
        crate::chrome::help::render_help_rows(frame, area, state.keys(), theme);
    }
}

fn render_title(frame: &mut Frame, area: Rect, state: &WatchState, theme: &Theme) {
    // Only the keys that do something here: no sort without processes, no selection of one GPU.
    let mut keys = vec!["q quit".to_string()];
    if state.can_sort() {
        keys.push(format!("s sort: {}", state.sort.as_str()));
    }
    if state.can_select() {
        keys.push("↑↓ select".into());
    }
    keys.push("? help ".into());
    let keys = keys.join(" · ");
    let left = " vramscope watch";
    let pad = (area.width as usize).saturating_sub(left.chars().count() + keys.chars().count());
    let line = Line::from(vec![
        Span::styled(
            left,
            Style::new().fg(theme.ui.title).add_modifier(Modifier::BOLD),
        ),
        Span::raw(" ".repeat(pad)),
        Span::styled(keys, Style::new().fg(theme.ui.dim)),
    ]);
    frame.render_widget(Paragraph::new(line), area);
}

/// Which source is active, and why NVML is not: said here, once, not as a repeated error.
fn status_line(state: &WatchState, theme: &Theme) -> Line<'static> {
    let h = &state.history;
    let span_s = match (h.samples().next(), h.latest()) {
        (Some(a), Some(b)) => (b.t_ns - a.t_ns) as f64 / 1e9,
        _ => 0.0,
    };
    let mut spans = Vec::new();
    match h.status() {
        Some(st) => {
            let style = match (st.kind, &st.reason) {
                (SourceKind::Nvml, _) => Style::new().fg(theme.ui.dim),
                (SourceKind::Host, _) => Style::new().fg(theme.ui.warning),
                (SourceKind::None, _) => Style::new().fg(theme.ui.error),
            };
            spans.push(Span::styled(
                format!(" source: {}", st.kind.as_str()),
                style,
            ));
            if let Some(reason) = &st.reason {
                spans.push(Span::styled(format!(" · {reason}"), style));
            }
        }
        None => spans.push(Span::styled(
            " source: starting",
            Style::new().fg(theme.ui.dim),
        )),
    }
    spans.push(Span::styled(
        format!(
            " · every {} ms · {:.0} s of history",
            state.interval.as_millis(),
            span_s
        ),
        Style::new().fg(theme.ui.dim),
    ));
    if h.missed() > 0 {
        spans.push(Span::styled(
            format!(" · {} samples missed", h.missed()),
            Style::new().fg(theme.ui.warning),
        ));
    }
    Line::from(spans)
}

fn block<'a>(title: String, theme: &Theme) -> Block<'a> {
    Block::new()
        .borders(Borders::ALL)
        .border_style(Style::new().fg(theme.ui.border))
        .title(Span::styled(
            format!(" {title} "),
            Style::new().fg(theme.ui.title),
        ))
}

/// Rows each of `graphs` history graphs gets from `available` rows (borders included).
fn graph_rows(available: u16, graphs: u16, max: u16) -> u16 {
    (available.saturating_sub(2) / graphs).clamp(1, max)
}

fn render_devices_view(frame: &mut Frame, area: Rect, state: &WatchState, theme: &Theme) {
    let devices = state.history.latest_devices();
    let dev_h = devices.len() as u16 + 3;
    // Processes keep room for all their rows (and at least 2); graphs get what is left.
    let procs: usize = devices.iter().map(|d| d.processes.len()).sum();
    let proc_h = (procs.max(2) as u16).saturating_add(3);
    let rows = graph_rows(area.height.saturating_sub(dev_h + proc_h), 4, 4);
    let [dev_area, hist_area, proc_area] = Layout::vertical([
        Constraint::Length(dev_h),
        Constraint::Length(2 + 4 * rows),
        Constraint::Min(3),
    ])
    .areas(area);

    let plural = if devices.len() == 1 { "" } else { "s" };
    let b = block(format!("{} GPU{plural}", devices.len()), theme);
    let inner = b.inner(dev_area);
    frame.render_widget(b, dev_area);
    let cols = DeviceColumns::fit(inner.width as usize);
    let mut lines = vec![cols.header(theme)];
    let selected = state.history.selected_device();
    lines.extend(
        devices
            .iter()
            .map(|d| cols.row(d, d.index == selected, theme)),
    );
    frame.render_widget(Paragraph::new(lines), inner);

    if let Some(d) = state.history.latest_device(selected) {
        render_device_history(frame, hist_area, state, d, rows, theme);
    }
    render_processes(frame, proc_area, state, devices, theme);
}

/// Column widths of the device table; optional columns go first on narrow screens.
struct DeviceColumns {
    name: usize,
    bar: usize,
    power: bool,
    clock: bool,
}

const MEM_TEXT: usize = 20;
const UTIL_W: usize = 6;
const POWER_W: usize = 11;
const TEMP_W: usize = 6;
const CLOCK_W: usize = 10;

impl DeviceColumns {
    fn fit(width: usize) -> DeviceColumns {
        let clock = width >= 92;
        let power = width >= 74;
        let fixed = 5
            + 1
            + MEM_TEXT
            + UTIL_W
            + if power { POWER_W + TEMP_W } else { 0 }
            + if clock { CLOCK_W } else { 0 };
        let flexible = width.saturating_sub(fixed);
        let name = (flexible / 2).min(22);
        DeviceColumns {
            name,
            bar: flexible - name,
            power,
            clock,
        }
    }

    fn header(&self, theme: &Theme) -> Line<'static> {
        let mut s = format!(
            "{:<5}{:<w$} {:<b$}{:>MEM_TEXT$}{:>UTIL_W$}",
            "  #",
            "NAME",
            "MEMORY",
            "USED / TOTAL",
            "UTIL",
            w = self.name,
            b = self.bar
        );
        if self.power {
            s += &format!("{:>POWER_W$}{:>TEMP_W$}", "POWER", "TEMP");
        }
        if self.clock {
            s += &format!("{:>CLOCK_W$}", "SM CLK");
        }
        Line::styled(
            s,
            Style::new().fg(theme.ui.dim).add_modifier(Modifier::BOLD),
        )
    }

    fn row(&self, d: &DeviceSample, selected: bool, theme: &Theme) -> Line<'static> {
        let frac = d.mem_used as f64 / d.mem_total.max(1) as f64;
        let (filled, empty) = bar(frac, self.bar);
        let na = || "n/a".to_string();
        let mut spans = vec![
            Span::styled(
                format!("{}{:>3} ", if selected { "▶" } else { " " }, d.index),
                Style::new().fg(theme.ui.accent),
            ),
            // The vendor prefix is the same on every row; the graph title keeps it.
            Span::raw(format!(
                "{:<w$} ",
                fit(d.name.trim_start_matches("NVIDIA "), self.name),
                w = self.name
            )),
            Span::styled(filled, Style::new().fg(theme.chart.gauge_fill)),
            Span::styled(empty, Style::new().fg(theme.chart.gauge_empty)),
            Span::raw(format!(
                "{:>MEM_TEXT$}",
                format!("{} / {}", bytes(d.mem_used), bytes(d.mem_total))
            )),
            Span::raw(format!(
                "{:>UTIL_W$}",
                d.gpu_util.map_or_else(na, |u| format!("{u}%"))
            )),
        ];
        if self.power {
            let power = match (d.power_mw, d.power_limit_mw) {
                (Some(p), Some(l)) => format!("{}/{} W", p / 1000, l / 1000),
                (Some(p), None) => format!("{} W", p / 1000),
                _ => na(),
            };
            let temp_style = match d.temp_c {
                Some(t) if t >= 85 => Style::new().fg(theme.ui.error),
                Some(t) if t >= 75 => Style::new().fg(theme.ui.warning),
                _ => Style::new(),
            };
            spans.push(Span::raw(format!("{power:>POWER_W$}")));
            spans.push(Span::styled(
                format!(
                    "{:>TEMP_W$}",
                    d.temp_c.map_or_else(na, |t| format!("{t}°C"))
                ),
                temp_style,
            ));
        }
        if self.clock {
            spans.push(Span::raw(format!(
                "{:>CLOCK_W$}",
                d.sm_clock_mhz.map_or_else(na, |c| format!("{c} MHz"))
            )));
        }
        let line = Line::from(spans);
        if selected {
            line.style(Style::new().bg(theme.ui.selection))
        } else {
            line
        }
    }
}

/// One labelled sparkline per row group: label, graph, latest value.
struct Graph {
    label: &'static str,
    metric: Metric,
    /// Value that fills the graph; the series' own peak when `None`.
    max: Option<f64>,
    /// Units per graph step (bytes → MiB keeps the u64 bars meaningful).
    scale: f64,
    value: String,
    /// What a full-height bar is, said beside the value ("of 79.5 GiB").
    top: String,
}

fn render_graphs(
    frame: &mut Frame,
    area: Rect,
    state: &WatchState,
    graphs: &[Graph],
    rows: u16,
    title: String,
    theme: &Theme,
) {
    let b = block(title, theme);
    let inner = b.inner(area);
    frame.render_widget(b, area);
    let areas = Layout::vertical(graphs.iter().map(|_| Constraint::Length(rows))).split(inner);
    for (g, a) in graphs.iter().zip(areas.iter()) {
        // With room, each graph has its own line for label and value, above its data, so no
        // graph's data sits beside the next one's label.
        let (label, graph, value) = if a.height >= 3 {
            let [head, graph] = Layout::vertical([Constraint::Length(1), Constraint::Min(1)]).areas(*a);
            let [label, value] = Layout::horizontal([Constraint::Length(8), Constraint::Min(1)]).areas(head);
            let graph = Rect { x: graph.x + 1, width: graph.width.saturating_sub(2), height: graph.height - 1, ..graph };
            (label, graph, value)
        } else {
            let [label, graph, value] = Layout::horizontal([
                Constraint::Length(8),
                Constraint::Min(1),
                Constraint::Length(26),
            ])
            .areas(*a);
            (label, graph, value)
        };
        let series = state.history.series(g.metric);
        let keep = series.len().saturating_sub(graph.width as usize);
        let data: Vec<u64> = series[keep..]
            .iter()
            .map(|(_, v)| (v / g.scale).round() as u64)
            .collect();
        let max = g
            .max
            .map(|m| (m / g.scale).round() as u64)
            .unwrap_or_else(|| data.iter().copied().max().unwrap_or(0))
            .max(1);
        frame.render_widget(
            Paragraph::new(format!(" {}", g.label)).style(Style::new().fg(theme.ui.dim)),
            label,
        );
        frame.render_widget(
            Sparkline::default()
                .data(&data)
                .max(max)
                .style(Style::new().fg(theme.chart.device_used)),
            graph,
        );
        let value_line = if a.height >= 3 {
            Line::from(vec![Span::raw(format!(" {}", g.value)), Span::styled(format!("  · graph top {}", g.top), Style::new().fg(theme.ui.dim))])
        } else {
            Line::raw(format!(" {}", g.value))
        };
        frame.render_widget(Paragraph::new(value_line), value);
    }
}

fn history_title(state: &WatchState, what: &str) -> String {
    format!("{what} · last {} samples", state.history.len())
}

fn render_device_history(
    frame: &mut Frame,
    area: Rect,
    state: &WatchState,
    d: &DeviceSample,
    rows: u16,
    theme: &Theme,
) {
    const MIB: f64 = 1048576.0;
    let i = d.index;
    let opt = |v: Option<String>| v.unwrap_or_else(|| "n/a".into());
    let peak = state.history.peak(Metric::DeviceMemUsed(i)).unwrap_or(0.0) as u64;
    let graphs = [
        Graph {
            label: "memory",
            metric: Metric::DeviceMemUsed(i),
            max: Some(d.mem_total as f64),
            scale: MIB,
            value: format!("{} (peak {})", bytes(d.mem_used), bytes(peak)),
            top: bytes(d.mem_total),
        },
        Graph {
            label: "util",
            metric: Metric::DeviceUtil(i),
            max: Some(100.0),
            scale: 1.0,
            value: opt(d.gpu_util.map(|u| format!("{u}%"))),
            top: "100%".into(),
        },
        Graph {
            label: "power",
            metric: Metric::DevicePower(i),
            max: d.power_limit_mw.map(|l| l as f64 / 1000.0),
            scale: 1.0,
            value: opt(d.power_mw.map(|p| format!("{:.0} W", p as f64 / 1000.0))),
            top: d.power_limit_mw.map_or_else(|| "its peak".into(), |l| format!("{} W", l / 1000)),
        },
        Graph {
            label: "temp",
            metric: Metric::DeviceTemp(i),
            max: Some(100.0),
            scale: 1.0,
            value: opt(d.temp_c.map(|t| format!("{t}°C"))),
            top: "100°C".into(),
        },
    ];
    let title = history_title(state, &format!("GPU {i} · {}", d.name));
    render_graphs(frame, area, state, &graphs, rows, title, theme);
}

fn render_processes(
    frame: &mut Frame,
    area: Rect,
    state: &WatchState,
    devices: &[DeviceSample],
    theme: &Theme,
) {
    let mut procs: Vec<_> = devices
        .iter()
        .flat_map(|d| d.processes.iter().map(move |p| (d.index, p)))
        .collect();
    match state.sort {
        ProcessSort::Memory => procs.sort_by_key(|(d, p)| (Reverse(p.used_bytes), *d, p.pid)),
        ProcessSort::Util => procs.sort_by_key(|(d, p)| (Reverse(p.sm_util), *d, p.pid)),
        ProcessSort::Pid => procs.sort_by_key(|(d, p)| (p.pid, *d)),
    }
    let b = block(
        format!("Processes ({}, by {})", procs.len(), state.sort.as_str()),
        theme,
    );
    let inner = b.inner(area);
    frame.render_widget(b, area);
    let name_w = (inner.width as usize)
        .saturating_sub(4 + 9 + 12 + 6 + 2)
        .min(40);
    let mut lines = vec![Line::styled(
        format!(
            "{:>4} {:>8} {:<name_w$}{:>12}{:>6}",
            "GPU", "PID", " NAME", "MEMORY", "SM%"
        ),
        Style::new().fg(theme.ui.dim).add_modifier(Modifier::BOLD),
    )];
    let room = (inner.height as usize).saturating_sub(1);
    let shown = if procs.len() > room {
        room.saturating_sub(1)
    } else {
        procs.len()
    };
    for (d, p) in &procs[..shown] {
        let name = match (&p.name, p.is_self) {
            (Some(n), true) => format!("{n} (this)"),
            (Some(n), false) => n.clone(),
            (None, true) => "(this)".into(),
            (None, false) => "?".into(),
        };
        let style = if p.is_self {
            Style::new().fg(theme.ui.accent)
        } else {
            Style::new()
        };
        lines.push(Line::styled(
            format!(
                "{d:>4} {:>8}  {:<w$}{:>12}{:>6}",
                p.pid,
                fit(&name, name_w.saturating_sub(1)),
                p.used_bytes.map_or_else(|| "n/a".into(), bytes),
                p.sm_util.map_or_else(|| "-".into(), |u| format!("{u}%")),
                w = name_w.saturating_sub(1)
            ),
            style,
        ));
    }
    if shown < procs.len() {
        lines.push(Line::styled(
            format!("  … {} more", procs.len() - shown),
            Style::new().fg(theme.ui.dim),
        ));
    }
    if procs.is_empty() {
        lines.push(Line::styled(
            "  no processes on any GPU",
            Style::new().fg(theme.ui.dim),
        ));
    }
    frame.render_widget(Paragraph::new(lines), inner);
}

fn render_host(frame: &mut Frame, area: Rect, state: &WatchState, h: &HostSample, theme: &Theme) {
    const MIB: f64 = 1048576.0;
    let rows = graph_rows(area.height.saturating_sub(5), 3, u16::MAX);
    let [now_area, hist_area] =
        Layout::vertical([Constraint::Length(5), Constraint::Length(2 + 3 * rows)]).areas(area);

    let b = block("Host (no GPU gauges)".into(), theme);
    let inner = b.inner(now_area);
    frame.render_widget(b, now_area);
    let bar_w = (inner.width as usize).saturating_sub(10 + 32).max(4);
    let gauge = |label: &str, frac: f64, text: String| {
        let (filled, empty) = bar(frac, bar_w);
        Line::from(vec![
            Span::styled(format!(" {label:<9}"), Style::new().fg(theme.ui.dim)),
            Span::styled(filled, Style::new().fg(theme.chart.gauge_fill)),
            Span::styled(empty, Style::new().fg(theme.chart.gauge_empty)),
            Span::raw(format!(" {text}")),
        ])
    };
    let cpu = h.cpu_percent.unwrap_or(0.0);
    let lines = vec![
        gauge(
            "memory",
            h.mem_used as f64 / h.mem_total.max(1) as f64,
            format!("{} / {}", bytes(h.mem_used), bytes(h.mem_total)),
        ),
        gauge(
            "cpu",
            f64::from(cpu) / 100.0,
            format!("{cpu:.1}% of {} cores", h.cpu_count),
        ),
        Line::from(vec![
            Span::styled(format!(" {:<9}", "this"), Style::new().fg(theme.ui.dim)),
            Span::styled(
                format!(
                    "RSS {} · CPU {:.1}% of one core",
                    bytes(h.rss_bytes),
                    h.self_cpu_percent.unwrap_or(0.0)
                ),
                Style::new().fg(theme.ui.accent),
            ),
        ]),
    ];
    frame.render_widget(Paragraph::new(lines), inner);

    let graphs = [
        Graph {
            label: "memory",
            metric: Metric::HostMemUsed,
            max: Some(h.mem_total as f64),
            scale: MIB,
            value: bytes(h.mem_used),
            top: bytes(h.mem_total),
        },
        Graph {
            label: "cpu",
            metric: Metric::HostCpu,
            max: Some(100.0),
            scale: 1.0,
            value: format!("{cpu:.1}%"),
            top: "100%".into(),
        },
        Graph {
            label: "rss",
            metric: Metric::HostRss,
            max: None,
            scale: MIB,
            value: bytes(h.rss_bytes),
            top: "its peak".into(),
        },
    ];
    render_graphs(
        frame,
        hist_area,
        state,
        &graphs,
        rows,
        history_title(state, "Host"),
        theme,
    );
}
