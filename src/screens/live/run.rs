//! The screen loop shared by every live source and by replay: one select loop over
//! terminal input, the source's items (tagged by rank), signals and a frame tick. The
//! stores and the view live here; where the items come from, and what the source-owned
//! keys do, is the `Controls` the caller passes.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use crossterm::event::{Event, EventStream, KeyEventKind};
use futures::StreamExt;
use tokio::sync::mpsc;

use crate::metrics::Metrics;
use vramscope_core::record::writer::Recorder;
use super::render::render_live;
use crate::theme::Theme;
use vramscope_core::source::feed::bridge;
use vramscope_core::source::gauges::sampler::{spawn_gauges, GaugeConfig};
use vramscope_core::source::gauges::Watched;
use vramscope_core::source::job::{Fed, JobSource, Output};
use vramscope_core::source::launch::EngineOptions;
use vramscope_core::step_config::{MAX_BATCH, MAX_CTX};
use vramscope_core::store::ranks::Ranks;
use vramscope_core::store::LogKind;
use vramscope_core::stream::{monotonic_ns, Control, Incoming, Report};

use super::keys::LiveKey;
use crate::keys::KeyMap;
use crate::terminal::TerminalSession;
use super::view::View;

/// Redraws at most this often (and only when something changed), to stay light over SSH.
const FRAME: Duration = Duration::from_millis(50);
const GAUGE_INTERVAL: Duration = Duration::from_millis(250);
pub const HISTORY_CAP: usize = 4 << 20;
/// How long a stopped engine may take to finish (a snapshot being written completes).
const ENGINE_STOP_WAIT: Duration = Duration::from_secs(60);

/// What the screen looks like and which keys drive it, whatever feeds it.
pub struct Screen {
    pub keys: KeyMap<LiveKey>,
    pub themes: Vec<Theme>,
}

pub struct LiveOptions {
    pub engine: EngineOptions,
    pub screen: Screen,
    /// Record the session from the start into this new file.
    pub record: Option<PathBuf>,
    /// Serve the figures to Prometheus here.
    pub metrics: Option<Metrics>,
}

/// The source's side of the screen: keys the view does not own (knobs and pause for a job,
/// pace and seek for a replay), and a look at every item before the store gets it.
pub trait Controls {
    /// Handles `a`; true when the screen should close.
    fn key(&mut self, a: LiveKey, ranks: &mut Ranks) -> bool;
    fn seen(&mut self, _rank: u32, _item: &Incoming, _ranks: &mut Ranks) {}
    /// Called on every frame tick.
    fn tick(&mut self, _ranks: &mut Ranks) {}
}

/// The gauge thread, stamping samples on the monotonic clock the jobs share and reading
/// the processes of `job` as the job's.
pub fn start_gauges(job: Watched) -> (vramscope_core::source::gauges::sampler::GaugeHandle, crossbeam_channel::Receiver<vramscope_core::source::gauges::sample::GaugeBatch>) {
    let (tx, rx) = crossbeam_channel::bounded(64);
    let origin = Instant::now() - Duration::from_nanos(monotonic_ns());
    (spawn_gauges(GaugeConfig { interval: GAUGE_INTERVAL, origin, job }, tx), rx)
}

/// `vramscope` / `vramscope run`: starts the engine process and watches it.
pub fn run(opts: LiveOptions) -> anyhow::Result<()> {
    let recorder = opts.record.as_deref().map(Recorder::create).transpose()?;
    let source = crate::builtin::launch_builtin(&opts.engine, Output::Capture).context("starting the built-in model")?;
    watch(source, JobKind::Engine, recorder, opts.metrics.as_ref(), &opts.screen, Ranks::new(HISTORY_CAP)).map(drop)
}

/// How a job came to be watched, which decides what quitting does to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobKind {
    /// vramscope's own engine: quitting stops it.
    Engine,
    /// A user's job this vramscope started: quitting stops it, detaching leaves it running.
    Started,
    /// A job attached to: quitting leaves it running.
    Attached,
}

/// Watches a job on the screen until the user quits; then stops it or lets it run on, as
/// its kind says.
/// Returns how a job vramscope started ended on its own, before the user quit (a job the
/// user's quit stopped, or one left running, has nothing to pass on).
pub fn watch(source: JobSource, kind: JobKind, recorder: Option<Recorder>, metrics: Option<&Metrics>, screen: &Screen, ranks: Ranks) -> anyhow::Result<Option<std::process::ExitStatus>> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let job = Watched::default();
    let (gauges, gauge_rx) = start_gauges(job.clone());
    let incoming = bridge(source.receiver().clone(), Some(gauge_rx));
    let mut ranks = ranks;
    ranks.recording = recorder.as_ref().map(|r| r.path().to_path_buf());
    let mut controls = JobControls { source: &source, kind, recorder, detached: false, said_knobs: false, job, metrics, published: 0, paused: false };
    let result = {
        let mut session = TerminalSession::enter()?;
        let r = rt.block_on(event_loop(&mut session, incoming, &mut controls, screen, ranks));
        // An SSH drop is not a decision to stop the user's job: it runs on, attachable.
        controls.detached |= session.hung_up();
        r
    };
    drop(gauges);
    // The terminal is restored: now end the job as its kind says.
    let detached = controls.detached;
    if let Some(line) = controls.stop_recording()? {
        eprintln!("vramscope: {line}");
    }
    let mut ended = None;
    // A paused job left running would wait for a viewer forever, and one being stopped
    // cannot take the signal until it runs again: resume it either way.
    let resumed = controls.paused && kind != JobKind::Engine;
    if resumed {
        source.send(&Control::Resume);
    }
    let was_paused = if resumed { " (it was paused: resumed)" } else { "" };
    match kind {
        JobKind::Engine => {
            source.send(&Control::Stop);
            if source.wait_child(ENGINE_STOP_WAIT).is_none() {
                source.stop_child(Duration::from_secs(5));
            }
        }
        JobKind::Started if detached => {
            source.detach();
            eprintln!("vramscope: the job runs on{was_paused}; attach again with: vramscope attach {}", source.name);
        }
        JobKind::Started => {
            ended = source.wait_child(Duration::ZERO);
            if ended.is_none() {
                eprintln!("vramscope: stopping the job…");
            }
            if let Some(s) = ended.or_else(|| source.stop_child(Duration::from_secs(10))) {
                eprintln!("vramscope: the job {}", vramscope_core::source::job::describe_exit(s));
            }
        }
        JobKind::Attached => eprintln!("vramscope: detached; the job runs on{was_paused}"),
    }
    if let Some(out) = &source.output {
        eprintln!("vramscope: the job's output is in {}", out.display());
    }
    result.map(|()| ended)
}

pub async fn event_loop(
    session: &mut TerminalSession,
    mut incoming: mpsc::Receiver<Fed>,
    controls: &mut dyn Controls,
    screen: &Screen,
    mut ranks: Ranks,
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
                        if handle(a, &mut ranks, &mut view, controls, &screen.themes) {
                            return Ok(());
                        }
                    } else {
                        // Any other key (esc) closes an overlay.
                        view.close_overlay();
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
                Some((rank, item)) => {
                    controls.seen(rank, &item, &mut ranks);
                    if matches!(item, Incoming::Restart) {
                        view = View { theme: view.theme, ..View::default() };
                    }
                    ranks.ingest(rank, item);
                }
            },
            _ = tick.tick() => {
                if session.stop_requested() {
                    return Ok(());
                }
                controls.tick(&mut ranks);
                let version = ranks.version();
                let shown = ranks.shown();
                view.hold_marked_line(shown, std::time::Instant::now());
                view.fit_steps(shown.newest_steps_start(super::view::FIT_STEPS), shown.history.end());
                if drawn.as_ref().is_none_or(|(v, w)| *v != version || *w != view) {
                    let theme = &screen.themes[view.theme % screen.themes.len()];
                    let summary = ranks.summary();
                    session.terminal.draw(|f| render_live(f, ranks.shown(), &summary, &view, &screen.keys, theme))?;
                    drawn = Some((version, view.clone()));
                }
            }
        }
    }
}

/// What a key does: view changes stay here, the rest goes to the source's controls. True
/// when the screen should close.
pub fn handle(a: LiveKey, ranks: &mut Ranks, view: &mut View, controls: &mut dyn Controls, themes: &[Theme]) -> bool {
    let store = ranks.shown();
    let (start, end) = (store.history.start(), store.history.end());
    let table_order = || store.live_by_size().iter().map(|l| l.addr).collect::<Vec<u64>>();
    match a {
        LiveKey::FreezeView => view.toggle_freeze(end),
        LiveKey::PanLeft => view.pan(true, start, end),
        LiveKey::PanRight => view.pan(false, start, end),
        LiveKey::GoLive => view.go_live(),
        LiveKey::ZoomIn => view.zoom_in(),
        LiveKey::ZoomOut => view.zoom_out(start, end),
        LiveKey::ToggleAxis => view.time_axis = !view.time_axis,
        LiveKey::ToggleBands => view.by_category = !view.by_category,
        LiveKey::FocusTable => view.table_focus = !view.table_focus,
        LiveKey::SelectUp | LiveKey::SelectDown => {
            let down = a == LiveKey::SelectDown;
            if view.log.is_some() {
                view.scroll_log(if down { -1 } else { 1 }, store.log.len());
            } else {
                view.table_focus = true;
                view.move_selection(&table_order(), if down { 1 } else { -1 });
            }
        }
        LiveKey::Inspect => {
            if !view.inspect && view.selected.is_none() {
                view.move_selection(&table_order(), 0);
            }
            view.inspect = !view.inspect && view.selected.is_some();
            view.table_focus |= view.inspect;
        }
        LiveKey::EventLog => view.log = if view.log.is_some() { None } else { Some(0) },
        LiveKey::NextTheme => {
            view.theme = (view.theme + 1) % themes.len().max(1);
            if let Some(t) = themes.get(view.theme) {
                ranks.shown_mut().log_line(LogKind::Info, format!("theme: {} (t for the next)", t.label()));
            }
        }
        LiveKey::NextRank => ranks.next_rank(),
        LiveKey::NextDevice => ranks.next_device(),
        LiveKey::Help => view.help = !view.help,
        _ => {
            if controls.key(a, ranks) {
                return true;
            }
        }
    }
    ranks.shown_mut().version += 1;
    false
}

/// A running job's controls: knob keys change the knobs the job declared (vramscope's
/// engine declares its step config's), applied by every rank at its next step boundary;
/// pause, step and snapshot go to every rank; the record key records what the screen is fed.
pub struct JobControls<'a> {
    pub source: &'a JobSource,
    pub kind: JobKind,
    pub recorder: Option<Recorder>,
    /// The user asked to leave the job running.
    pub detached: bool,
    /// "This job declares no such knob" was said.
    said_knobs: bool,
    /// The job's processes, for the gauges, as each rank says who it is.
    job: Watched,
    metrics: Option<&'a Metrics>,
    /// The stores' version last published to the metrics endpoint.
    published: u64,
    /// The job last said it was paused.
    paused: bool,
}

impl JobControls<'_> {
    fn start_recording(&mut self, ranks: &mut Ranks) {
        let path = PathBuf::from(format!("vramscope-{}.vsrec", vramscope_core::format::local_timestamp()));
        let started = match Recorder::create(&path) {
            Ok(mut r) => {
                // Started mid-session: what each rank's screen already knows comes first (who
                // it is, every name, every live allocation), so the replay agrees with it.
                let now = monotonic_ns();
                let mut ok = Ok(());
                for (rank, store) in ranks.iter() {
                    for item in store.resync_items() {
                        ok = ok.and_then(|()| r.record(now, rank, &item));
                    }
                }
                ok.map(|()| r)
            }
            Err(e) => Err(e),
        };
        match started {
            Ok(r) => {
                ranks.shown_mut().log_line(LogKind::Info, format!("recording to {} (r stops)", path.display()));
                ranks.recording = Some(path);
                self.recorder = Some(r);
            }
            Err(e) => ranks.shown_mut().log_line(LogKind::Error, format!("cannot record: {e}")),
        }
    }

    /// Closes the recording, if any, saying where it went.
    pub fn stop_recording(&mut self) -> anyhow::Result<Option<String>> {
        let Some(r) = self.recorder.take() else { return Ok(None) };
        let s = r.finish()?;
        Ok(Some(format!("recording saved: {} ({} events, {} bytes)", s.path.display(), s.events, s.bytes)))
    }

    /// The value knob `name` goes to under key `a`, from its value now.
    fn knob_value(a: LiveKey, now: &str) -> Option<String> {
        let int = || now.parse::<i64>().ok();
        Some(match a {
            LiveKey::TogglePrecision => now.parse::<vramscope_core::step_config::Precision>().ok()?.next().to_string(),
            LiveKey::ToggleMode => now.parse::<vramscope_core::step_config::Mode>().ok()?.toggled().to_string(),
            LiveKey::ToggleAttention => now.parse::<vramscope_core::step_config::Attention>().ok()?.toggled().to_string(),
            LiveKey::NextCheckpointing => now.parse::<vramscope_core::step_config::Checkpointing>().ok()?.next().to_string(),
            LiveKey::CtxHalve => (int()? / 2).max(1).to_string(),
            LiveKey::CtxDouble => (int()? * 2).min(MAX_CTX).to_string(),
            LiveKey::BatchDown => (int()? - 1).max(1).to_string(),
            LiveKey::BatchUp => (int()? + 1).min(MAX_BATCH).to_string(),
            _ => return None,
        })
    }
}

/// The knob a knob key drives.
fn knob_of(a: LiveKey) -> Option<&'static str> {
    Some(match a {
        LiveKey::TogglePrecision => "precision",
        LiveKey::ToggleMode => "mode",
        LiveKey::ToggleAttention => "attention",
        LiveKey::NextCheckpointing => "checkpointing",
        LiveKey::CtxHalve | LiveKey::CtxDouble => "ctx",
        LiveKey::BatchDown | LiveKey::BatchUp => "batch",
        _ => return None,
    })
}

impl Controls for JobControls<'_> {
    fn key(&mut self, a: LiveKey, ranks: &mut Ranks) -> bool {
        let store = ranks.shown_mut();
        if let Some(knob) = knob_of(a) {
            let now = store.info.as_ref().and_then(|i| i.knob(knob)).map(str::to_string);
            match now.as_deref().and_then(|v| JobControls::knob_value(a, v)) {
                Some(value) => self.source.send(&Control::SetKnob { name: knob.into(), value }),
                None if !self.said_knobs => {
                    self.said_knobs = true;
                    store.log_line(
                        LogKind::Info,
                        format!("this job declares no '{knob}' knob: knob keys drive vramscope's own model, or knobs a script declares with vramscope_hook.knob()"),
                    );
                }
                None => {}
            }
            return false;
        }
        match a {
            LiveKey::Quit => return true,
            LiveKey::Detach if self.kind != JobKind::Engine => {
                self.detached = true;
                return true;
            }
            LiveKey::Detach => store.log_line(LogKind::Info, "d leaves a user's job running (py, attach); vramscope's own model ends with the screen: q".into()),
            // Nothing runs to save it at the end of: say so rather than promise it.
            LiveKey::Snapshot if store.finished => store.log_line(
                LogKind::Info,
                "the run has ended: no step is left to save a snapshot at (s saves one at the end of a running step)".into(),
            ),
            LiveKey::Snapshot => {
                self.source.send(&Control::Snapshot);
                store.log_line(LogKind::Info, "snapshot requested: saved at the end of this step".into());
            }
            LiveKey::TogglePause => self.source.send(if store.paused { &Control::Resume } else { &Control::Pause }),
            LiveKey::StepOnce => self.source.send(&Control::StepOnce),
            LiveKey::ToggleRecord => match self.stop_recording() {
                Ok(Some(line)) => {
                    ranks.recording = None;
                    ranks.shown_mut().log_line(LogKind::Info, line);
                }
                Ok(None) => self.start_recording(ranks),
                Err(e) => store.log_line(LogKind::Error, format!("recording failed: {e:#}")),
            },
            LiveKey::SpeedUp | LiveKey::SpeedDown | LiveKey::NextStep | LiveKey::PrevStep => {
                store.log_line(LogKind::Info, "live: speed and seek keys work in replay".into())
            }
            _ => {}
        }
        false
    }

    fn seen(&mut self, rank: u32, item: &Incoming, ranks: &mut Ranks) {
        match item {
            Incoming::Report(Report::Started(info)) => self.job.add(info.pid),
            Incoming::Report(Report::Paused(p)) => self.paused = *p,
            _ => {}
        }
        if let Some(r) = &mut self.recorder {
            if let Err(e) = r.record(monotonic_ns(), rank, item) {
                self.recording_failed(ranks, e);
            }
        }
    }

    fn tick(&mut self, ranks: &mut Ranks) {
        if let Some(m) = self.metrics.filter(|_| ranks.version() != self.published) {
            m.publish(crate::metrics::Figures::of_ranks(ranks));
            self.published = ranks.version();
        }
        if let Some(r) = &mut self.recorder {
            if let Err(e) = r.flush_if_due(monotonic_ns()) {
                self.recording_failed(ranks, e);
            }
        }
    }
}

impl JobControls<'_> {
    fn recording_failed(&mut self, ranks: &mut Ranks, e: impl std::fmt::Display) {
        ranks.shown_mut().log_line(LogKind::Error, format!("recording stopped: {e}"));
        ranks.recording = None;
        self.recorder = None;
    }
}

