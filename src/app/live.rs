//! The live app: one select loop over terminal input, engine batches and reports, signals
//! and a frame tick. The store and view live here; the engine thread owns libtorch.

use std::time::{Duration, Instant};

use anyhow::Context;
use crossterm::event::{Event, EventStream, KeyEventKind};
use futures::StreamExt;
use tokio::sync::mpsc;

use crate::render::live::render_live;
use crate::render::theme::Theme;
use crate::store::Store;
use crate::train::config::{MAX_BATCH, MAX_CTX};
use crate::train::engine::{Control, Engine, EngineOptions, Report};
use crate::event::Batch;
use crate::source::gauges::sample::GaugeBatch;
use crate::source::gauges::sampler::{spawn_gauges, GaugeConfig};

use super::keys::{Action, KeyMap};
use super::terminal::TerminalSession;
use super::view::View;

/// Redraws at most this often (and only when something changed), to stay light over SSH.
const FRAME: Duration = Duration::from_millis(50);
const GAUGE_INTERVAL: Duration = Duration::from_millis(250);

pub struct LiveOptions {
    pub engine: EngineOptions,
    pub keys: KeyMap,
    pub themes: Vec<Theme>,
}

enum Incoming {
    Batch(Batch),
    Report(Report),
    Gauges(GaugeBatch),
}

/// Forwards the engine's and the gauge thread's crossbeam channels into the async loop.
fn bridge(engine: &Engine, gauges: crossbeam_channel::Receiver<GaugeBatch>) -> mpsc::Receiver<Incoming> {
    let (tx, rx) = mpsc::channel(1024);
    let batches = engine.batches.clone();
    let reports = engine.reports.clone();
    std::thread::Builder::new()
        .name("vramscope-bridge".into())
        .spawn(move || loop {
            let msg = crossbeam_channel::select! {
                recv(batches) -> b => match b { Ok(b) => Incoming::Batch(b), Err(_) => break },
                recv(reports) -> r => match r { Ok(r) => Incoming::Report(r), Err(_) => break },
                recv(gauges) -> g => match g { Ok(g) => Incoming::Gauges(g), Err(_) => break },
            };
            if tx.blocking_send(msg).is_err() {
                break;
            }
        })
        .expect("spawn bridge thread");
    rx
}

pub fn run(opts: LiveOptions) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut engine = Engine::spawn(opts.engine).context("starting the training engine")?;
    let result = {
        let mut session = TerminalSession::enter()?;
        rt.block_on(event_loop(&mut session, &engine, &opts.keys, &opts.themes))
    };
    // The terminal is restored; now let the engine finish (a pending snapshot completes).
    engine.shutdown();
    result
}

async fn event_loop(session: &mut TerminalSession, engine: &Engine, keys: &KeyMap, themes: &[Theme]) -> anyhow::Result<()> {
    let mut store = Store::new(4 << 20);
    let mut view = View::default();
    let mut input = EventStream::new();
    let (gauge_tx, gauge_rx) = crossbeam_channel::bounded(64);
    // Gauge timestamps on the capture clock, so the device line lines up with events.
    let origin = Instant::now() - Duration::from_nanos(crate::capture::now_ns());
    let _gauges = spawn_gauges(GaugeConfig { interval: GAUGE_INTERVAL, origin }, gauge_tx);
    let mut incoming = bridge(engine, gauge_rx);
    let mut tick = tokio::time::interval(FRAME);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut drawn: Option<(u64, View)> = None;
    loop {
        tokio::select! {
            ev = input.next() => match ev {
                Some(Ok(Event::Key(k))) if k.kind != KeyEventKind::Release => {
                    if let Some(a) = keys.action(&k) {
                        if a == Action::Quit {
                            return Ok(());
                        }
                        handle(a, &mut store, &mut view, engine, themes.len());
                    } else if view.help {
                        view.help = false;
                    }
                }
                Some(Ok(Event::Resize(..))) => drawn = None,
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e).context("reading the terminal"),
                None => return Ok(()),
            },
            msg = incoming.recv() => match msg {
                Some(Incoming::Batch(b)) => store.ingest_batch(b),
                Some(Incoming::Report(r)) => store.ingest_report(r),
                Some(Incoming::Gauges(g)) => store.ingest_gauges(g),
                None => {}
            },
            _ = tick.tick() => {
                if session.stop_requested() {
                    return Ok(());
                }
                if drawn.as_ref().is_none_or(|(v, w)| *v != store.version || *w != view) {
                    let theme = &themes[view.theme % themes.len()];
                    session.terminal.draw(|f| render_live(f, &store, &view, keys, theme))?;
                    drawn = Some((store.version, view.clone()));
                }
            }
        }
    }
}

/// What a key does: knob changes go to the engine (applied at the next step boundary),
/// view changes stay here.
pub fn handle(a: Action, store: &mut Store, view: &mut View, engine: &Engine, theme_count: usize) {
    let cfg = store.info.as_ref().map(|i| i.config.clone());
    let (start, end) = (store.history.start(), store.history.end());
    let send = |c: Control| {
        let _ = engine.control.send(c);
    };
    match a {
        Action::TogglePrecision => {
            if let Some(c) = cfg { send(Control::Precision(c.precision.toggled())) }
        }
        Action::CtxHalve => {
            if let Some(c) = cfg { send(Control::Ctx((c.ctx / 2).max(1))) }
        }
        Action::CtxDouble => {
            if let Some(c) = cfg { send(Control::Ctx((c.ctx * 2).min(MAX_CTX))) }
        }
        Action::BatchDown => {
            if let Some(c) = cfg { send(Control::Batch((c.batch - 1).max(1))) }
        }
        Action::BatchUp => {
            if let Some(c) = cfg { send(Control::Batch((c.batch + 1).min(MAX_BATCH))) }
        }
        Action::ToggleMode => {
            if let Some(c) = cfg { send(Control::Mode(c.mode.toggled())) }
        }
        Action::ToggleAttention => {
            if let Some(c) = cfg { send(Control::Attention(c.attention.toggled())) }
        }
        Action::Snapshot => {
            send(Control::Snapshot);
            store.log_line(crate::store::LogKind::Info, "snapshot requested: saved at the end of this step".into());
        }
        Action::TogglePause => send(if store.paused { Control::Resume } else { Control::Pause }),
        Action::StepOnce => send(Control::StepOnce),
        Action::FreezeView => view.toggle_freeze(end),
        Action::PanLeft => view.pan(true, start, end),
        Action::PanRight => view.pan(false, start, end),
        Action::ZoomIn => view.zoom_in(),
        Action::ZoomOut => view.zoom_out(start, end),
        Action::ToggleBands => view.by_category = !view.by_category,
        Action::FocusTable => view.table_focus = !view.table_focus,
        Action::SelectUp => view.table_selected = view.table_selected.saturating_sub(1),
        Action::SelectDown => view.table_selected = (view.table_selected + 1).min(store.live_count().saturating_sub(1)),
        Action::NextTheme => view.theme = (view.theme + 1) % theme_count.max(1),
        Action::Help => view.help = !view.help,
        Action::Quit => {}
    }
    store.version += 1;
}
