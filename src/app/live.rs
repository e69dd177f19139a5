//! The screen loop shared by live and replay: one select loop over terminal input, a
//! source's items, signals and a frame tick. The store and view live here; where the items
//! come from, and what the source-owned keys do, is the `Controls` the caller passes.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use crossbeam_channel::Sender;
use crossterm::event::{Event, EventStream, KeyEventKind};
use futures::StreamExt;
use tokio::sync::mpsc;

use crate::event::Batch;
use crate::record::writer::Recorder;
use crate::render::live::render_live;
use crate::render::theme::Theme;
use crate::source::feed::{bridge, Incoming};
use crate::source::gauges::sampler::{spawn_gauges, GaugeConfig};
use crate::store::{LogKind, Store};
use crate::train::config::{MAX_BATCH, MAX_CTX};
use crate::train::engine::{Control, Engine, EngineOptions, Report};

use super::keys::{Action, KeyMap};
use super::terminal::TerminalSession;
use super::view::View;

/// Redraws at most this often (and only when something changed), to stay light over SSH.
const FRAME: Duration = Duration::from_millis(50);
const GAUGE_INTERVAL: Duration = Duration::from_millis(250);
const HISTORY_CAP: usize = 4 << 20;

/// What the screen looks like and which keys drive it, whatever feeds it.
pub struct Screen {
    pub keys: KeyMap,
    pub themes: Vec<Theme>,
}

pub struct LiveOptions {
    pub engine: EngineOptions,
    pub screen: Screen,
    /// Record the session from the start into this new file.
    pub record: Option<PathBuf>,
}

/// The source's side of the screen: keys the view does not own (knobs and pause for the
/// engine, pace and seek for a replay), and a look at every item before the store gets it.
pub trait Controls {
    fn key(&mut self, a: Action, store: &mut Store);
    fn seen(&mut self, _item: &Incoming, _store: &mut Store) {}
    /// Called on every frame tick.
    fn tick(&mut self, _store: &mut Store) {}
}

pub fn run(opts: LiveOptions) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let recorder = opts.record.as_deref().map(Recorder::create).transpose()?;
    let mut engine = Engine::spawn(opts.engine).context("starting the training engine")?;
    let (gauge_tx, gauge_rx) = crossbeam_channel::bounded(64);
    // Gauge timestamps on the capture clock, so the device line lines up with events.
    let origin = Instant::now() - Duration::from_nanos(crate::capture::now_ns());
    let _gauges = spawn_gauges(GaugeConfig { interval: GAUGE_INTERVAL, origin }, gauge_tx);
    let incoming = bridge(&engine, gauge_rx);
    let mut controls = EngineControls { control: engine.control.clone(), recorder };
    let result = {
        let mut session = TerminalSession::enter()?;
        rt.block_on(event_loop(&mut session, incoming, &mut controls, &opts.screen, Store::new(HISTORY_CAP)))
    };
    // The terminal is restored; now let the engine finish (a pending snapshot completes).
    engine.shutdown();
    if let Some(line) = controls.stop_recording()? {
        eprintln!("vramscope: {line}");
    }
    result
}

pub async fn event_loop(
    session: &mut TerminalSession,
    mut incoming: mpsc::Receiver<Incoming>,
    controls: &mut dyn Controls,
    screen: &Screen,
    mut store: Store,
) -> anyhow::Result<()> {
    let mut view = View::default();
    let mut input = EventStream::new();
    let mut tick = tokio::time::interval(FRAME);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut drawn: Option<(u64, View)> = None;
    let mut open = true;
    loop {
        tokio::select! {
            ev = input.next() => match ev {
                Some(Ok(Event::Key(k))) if k.kind != KeyEventKind::Release => {
                    if let Some(a) = screen.keys.action(&k) {
                        if a == Action::Quit {
                            return Ok(());
                        }
                        handle(a, &mut store, &mut view, controls, screen.themes.len());
                    } else if view.help {
                        view.help = false;
                    }
                }
                Some(Ok(Event::Resize(..))) => drawn = None,
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e).context("reading the terminal"),
                None => return Ok(()),
            },
            msg = incoming.recv(), if open => match msg {
                // The source is done; the screen stays until quit.
                None => open = false,
                Some(item) => {
                controls.seen(&item, &mut store);
                match item {
                    Incoming::Batch(b) => store.ingest_batch(b),
                    Incoming::Report(r) => store.ingest_report(r),
                    Incoming::Gauges(g) => store.ingest_gauges(g),
                    Incoming::Restart => {
                        let fresh = Store::new(HISTORY_CAP);
                        let old = std::mem::replace(&mut store, fresh);
                        store.title = old.title;
                        store.log = old.log;
                        view = View { theme: view.theme, ..View::default() };
                    }
                }
                }
            },
            _ = tick.tick() => {
                if session.stop_requested() {
                    return Ok(());
                }
                controls.tick(&mut store);
                if drawn.as_ref().is_none_or(|(v, w)| *v != store.version || *w != view) {
                    let theme = &screen.themes[view.theme % screen.themes.len()];
                    session.terminal.draw(|f| render_live(f, &store, &view, &screen.keys, theme))?;
                    drawn = Some((store.version, view.clone()));
                }
            }
        }
    }
}

/// What a key does: view changes stay here, the rest goes to the source's controls.
pub fn handle(a: Action, store: &mut Store, view: &mut View, controls: &mut dyn Controls, theme_count: usize) {
    let (start, end) = (store.history.start(), store.history.end());
    match a {
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
        _ => controls.key(a, store),
    }
    store.version += 1;
}

/// A live engine's controls: knob changes go to the engine (applied at the next step
/// boundary); the record key starts and stops a recording of what the screen is fed.
pub struct EngineControls {
    pub control: Sender<Control>,
    pub recorder: Option<Recorder>,
}

impl EngineControls {
    fn start_recording(&mut self, store: &mut Store) {
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let path = PathBuf::from(format!("vramscope-{secs}.vsrec"));
        let started = match Recorder::create(&path) {
            Ok(mut r) => {
                // Started mid-session: what the screen already knows comes first, so the
                // replay shows the same model, knobs and module names.
                let now = crate::capture::now_ns();
                let info = store.info.clone().map(|i| Incoming::Report(Report::Started(i)));
                let scopes = (1..store.scopes.len()).map(|i| (i as u32, store.scopes[i].clone())).collect();
                let scopes = Incoming::Batch(Batch { first_seq: store.history.end(), scopes, ..Batch::default() });
                info.into_iter().chain([scopes]).try_for_each(|i| r.record(now, &i)).map(|()| r)
            }
            Err(e) => Err(e),
        };
        match started {
            Ok(r) => {
                store.log_line(LogKind::Info, format!("recording to {} (r stops)", path.display()));
                self.recorder = Some(r);
            }
            Err(e) => store.log_line(LogKind::Error, format!("cannot record: {e}")),
        }
    }

    /// Closes the recording, if any, saying where it went.
    pub fn stop_recording(&mut self) -> anyhow::Result<Option<String>> {
        let Some(r) = self.recorder.take() else { return Ok(None) };
        let s = r.finish()?;
        Ok(Some(format!("recording saved: {} ({} events, {} bytes)", s.path.display(), s.events, s.bytes)))
    }
}

impl Controls for EngineControls {
    fn key(&mut self, a: Action, store: &mut Store) {
        let cfg = store.info.as_ref().map(|i| i.config.clone());
        let send = |c: Control| {
            let _ = self.control.send(c);
        };
        match (a, cfg) {
            (Action::TogglePrecision, Some(c)) => send(Control::Precision(c.precision.toggled())),
            (Action::CtxHalve, Some(c)) => send(Control::Ctx((c.ctx / 2).max(1))),
            (Action::CtxDouble, Some(c)) => send(Control::Ctx((c.ctx * 2).min(MAX_CTX))),
            (Action::BatchDown, Some(c)) => send(Control::Batch((c.batch - 1).max(1))),
            (Action::BatchUp, Some(c)) => send(Control::Batch((c.batch + 1).min(MAX_BATCH))),
            (Action::ToggleMode, Some(c)) => send(Control::Mode(c.mode.toggled())),
            (Action::ToggleAttention, Some(c)) => send(Control::Attention(c.attention.toggled())),
            (Action::Snapshot, _) => {
                send(Control::Snapshot);
                store.log_line(LogKind::Info, "snapshot requested: saved at the end of this step".into());
            }
            (Action::TogglePause, _) => send(if store.paused { Control::Resume } else { Control::Pause }),
            (Action::StepOnce, _) => send(Control::StepOnce),
            (Action::ToggleRecord, _) => match self.stop_recording() {
                Ok(Some(line)) => store.log_line(LogKind::Info, line),
                Ok(None) => self.start_recording(store),
                Err(e) => store.log_line(LogKind::Error, format!("recording failed: {e:#}")),
            },
            (Action::SpeedUp | Action::SpeedDown | Action::NextStep | Action::PrevStep, _) => {
                store.log_line(LogKind::Info, "live: speed and seek keys work in replay".into())
            }
            _ => {}
        }
    }

    fn seen(&mut self, item: &Incoming, store: &mut Store) {
        if let Some(r) = &mut self.recorder {
            if let Err(e) = r.record(crate::capture::now_ns(), item) {
                store.log_line(LogKind::Error, format!("recording stopped: {e}"));
                self.recorder = None;
            }
        }
    }

    fn tick(&mut self, store: &mut Store) {
        if let Some(r) = &mut self.recorder {
            if let Err(e) = r.flush_if_due(crate::capture::now_ns()) {
                store.log_line(LogKind::Error, format!("recording stopped: {e}"));
                self.recorder = None;
            }
        }
    }
}
