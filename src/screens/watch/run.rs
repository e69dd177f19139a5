//! `vramscope watch`: the device gauges full screen, or one sample for scripts.

use std::time::{Duration, Instant};

use anyhow::Context;
use crossbeam_channel::Receiver;
use ratatui::crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers};
use serde::Serialize;

use crate::terminal::TerminalSession;
use crate::metrics::{Figures, Metrics};
use vramscope_core::format::bytes;
use crate::theme::{ColorSupport, Theme};
use super::render::render_watch;
use super::state::WatchState;
use vramscope_core::source::gauges::{
    open_reader, spawn_gauges, GaugeBatch, Watched, GaugeConfig, GaugeHistory, GaugeSample, Gauges,
    SourceStatus,
};

#[derive(clap::Args, Clone, Debug)]
pub struct WatchArgs {
    /// Sampling interval in milliseconds.
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u64).range(10..))]
    pub interval_ms: u64,
    /// Print one sample and exit.
    #[arg(long)]
    pub once: bool,
    /// With --once: print the sample as JSON.
    #[arg(long, requires = "once")]
    pub json: bool,
    /// Theme: dark, light, ansi16, or a path to a theme TOML file.
    #[arg(long, default_value = "dark")]
    pub theme: String,
    /// Serve the readings to Prometheus at ADDR/metrics (PORT alone: loopback).
    #[arg(long, value_name = "ADDR", conflicts_with = "once")]
    pub metrics: Option<String>,
    /// With --metrics: no screen, serve until interrupted (an exporter on a node).
    #[arg(long, requires = "metrics")]
    pub headless: bool,
}

/// Screens redraw at most this often.
const FRAME: Duration = Duration::from_millis(250);
/// Samples kept for the graphs: 10 minutes at the default interval.
const HISTORY_SAMPLES: usize = 2400;

pub fn run_watch(args: WatchArgs) -> anyhow::Result<()> {
    let interval = Duration::from_millis(args.interval_ms);
    if args.once {
        return print_once(interval, args.json);
    }
    let metrics = args.metrics.as_deref().map(Metrics::serve).transpose()?;
    let (tx, rx) = crossbeam_channel::bounded(64);
    let gauges = spawn_gauges(
        GaugeConfig {
            interval,
            origin: Instant::now(),
            job: Watched::default(),
        },
        tx,
    );
    let mut state = WatchState::new(GaugeHistory::new(HISTORY_SAMPLES, 0), interval);
    let result = match &metrics {
        Some(m) if args.headless => serve_only(&mut state, &rx, m),
        _ => {
            let theme = Theme::load_at(&args.theme, ColorSupport::detect()?)?;
            screen_loop(state, &rx, &theme, metrics.as_ref())
        }
    };
    drop(gauges);
    result
}

/// Takes what the gauge thread sampled; true if anything came.
fn ingest(state: &mut WatchState, rx: &Receiver<GaugeBatch>, metrics: Option<&Metrics>) -> bool {
    let mut any = false;
    while let Ok(batch) = rx.try_recv() {
        state.history.ingest(batch);
        any = true;
    }
    if let Some(m) = metrics.filter(|_| any) {
        m.publish(Figures::of_gauges(&state.history));
    }
    any
}

/// `watch --metrics ADDR --headless`: samples and serves until SIGINT or SIGTERM.
fn serve_only(state: &mut WatchState, rx: &Receiver<GaugeBatch>, metrics: &Metrics) -> anyhow::Result<()> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        ingest(state, rx, Some(metrics));
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn screen_loop(
    mut state: WatchState,
    rx: &Receiver<GaugeBatch>,
    theme: &Theme,
    metrics: Option<&Metrics>,
) -> anyhow::Result<()> {
    let mut session = TerminalSession::enter()?;
    let mut dirty = true;
    let mut last_draw: Option<Instant> = None;
    while !session.stop_requested() {
        dirty |= ingest(&mut state, rx, metrics);
        if dirty && last_draw.is_none_or(|t| t.elapsed() >= FRAME) {
            session.terminal.draw(|f| render_watch(f, &state, theme))?;
            last_draw = Some(Instant::now());
            dirty = false;
        }
        let Some(event) = session.next_event(Duration::from_millis(50))? else { continue };
        match event {
            Event::Key(k) if k.kind == KeyEventKind::Press => match k.code {
                KeyCode::Char('q') => return Ok(()),
                KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => return Ok(()),
                KeyCode::Char('?') => state.help = !state.help,
                // Any other key closes the help; esc quits when it is not open.
                _ if state.help => state.help = false,
                KeyCode::Esc => return Ok(()),
                KeyCode::Char('s') if state.can_sort() => state.sort = state.sort.next(),
                KeyCode::Up if state.can_select() => state.move_selection(-1),
                KeyCode::Down if state.can_select() => state.move_selection(1),
                _ => continue,
            },
            Event::Resize(..) => {}
            _ => continue,
        }
        dirty = true;
    }
    Ok(())
}

/// The `--once --json` document.
#[derive(Serialize)]
struct OnceReport {
    source: SourceStatus,
    sample: GaugeSample,
}

fn print_once(interval: Duration, json: bool) -> anyhow::Result<()> {
    let origin = Instant::now();
    let (reader, source) = open_reader(&Watched::default());
    let mut reader = reader.with_context(|| {
        format!(
            "no gauge source: {}",
            source.reason.as_deref().unwrap_or("unknown")
        )
    })?;
    // CPU and per-process utilization are rates: give them one interval to measure.
    std::thread::sleep(interval);
    let gauges = reader
        .sample()
        .with_context(|| format!("reading {} gauges", source.kind.as_str()))?;
    let report = OnceReport {
        source,
        sample: GaugeSample {
            t_ns: origin.elapsed().as_nanos() as u64,
            gauges,
        },
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    match &report.source.reason {
        Some(r) => println!("source: {} ({r})", report.source.kind.as_str()),
        None => println!("source: {}", report.source.kind.as_str()),
    }
    let pct = |v: Option<u32>| v.map_or_else(|| "n/a".into(), |v| format!("{v}%"));
    match &report.sample.gauges {
        Gauges::Devices(devices) => {
            for d in devices {
                println!(
                    "GPU {} {}: {} / {} used, util {}, {} processes",
                    d.index,
                    d.name,
                    bytes(d.mem_used),
                    bytes(d.mem_total),
                    pct(d.gpu_util),
                    d.processes.len()
                );
            }
        }
        Gauges::Host(h) => println!(
            "host: memory {} / {} used, cpu {:.1}% of {} cores, this process RSS {}",
            bytes(h.mem_used),
            bytes(h.mem_total),
            h.cpu_percent.unwrap_or(0.0),
            h.cpu_count,
            bytes(h.rss_bytes)
        ),
    }
    Ok(())
}
