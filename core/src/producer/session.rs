//! A producing job's session, whatever runs the training: vramscope's own engine (Rust,
//! tch) or the hook inside a user's Python job. The host tells it where steps and phases
//! begin and what allocations are; it drains the capture shim, keeps the exact accounting
//! (tracker), serves viewers (server), applies their controls between steps, and cuts
//! snapshots. Both hosts drive this one type, so the engine and the hook send one stream.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::event::{Batch, Category, Phase};
use crate::snapshot::model::Frame;
use crate::snapshot::writer::{save_snapshot_atomic, unique_path};
use crate::step_config::{Attention, AutocastPolicy, Checkpointing, Mode, Precision};
use crate::stream::{Control, EngineInfo, Incoming, Knob, KnobChange, OutOfMemory, Report, StepReport};
use crossbeam_channel::Receiver;

use super::cut::{FrameTables, SnapshotCut};
use super::raw::{CudaStats, RawEvent, CPU_DEVICE, RAW_MARK_PHASE, RAW_MARK_STEP_END, RAW_MARK_TAG};
use super::scopes::Scopes;
use super::server::{Log, Server, ServerHandle};
use super::tracker::{Backend, Tracker};

/// What the session needs of the capture shim, linked (engine) or loaded (hook).
pub trait Capture: Send {
    fn now_ns(&self) -> u64;
    /// Appends every buffered event, oldest first.
    fn drain(&self, out: &mut Vec<RawEvent>);
    fn set_tags(&self, step: u32, phase: Phase);
    /// Appends one of the host's own records (`RawEvent::mark`) after what is buffered.
    fn mark(&self, rec: &RawEvent);
    /// The allocator's counters for `device`: read only. Nothing here resets them, so the
    /// job's own `torch.cuda.max_memory_allocated()` stays what it would be without us.
    fn cuda_stats(&self, device: u8) -> Result<CudaStats, String>;
    /// PyTorch's own `_memory_snapshot_pickled()` (CUDA).
    fn cuda_snapshot(&self) -> Result<Vec<u8>, String>;
    /// Events the shim could not keep (its bounded buffer was full), since it started.
    fn dropped(&self) -> u64;
    /// CUDA device `device`'s PCI bus id, which finds its NVML readings.
    fn cuda_pci_bus_id(&self, device: u8) -> Option<String>;
}

/// Which CUDA device is a session's first: the one the job allocates on first, not the one
/// its rank suggests (per-rank CUDA_VISIBLE_DEVICES makes every rank's device 0; a model
/// may live on cuda:1). Every other device the job allocates on gets its own stream beside
/// it; CPU events are not device memory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceFollow {
    pub followed: Option<u8>,
}

impl DeviceFollow {
    /// Keeps the first device's events in `raw` (choosing it at the first device event)
    /// and moves every other device's into `others`.
    pub fn split(&mut self, raw: &mut Vec<RawEvent>, others: &mut Vec<RawEvent>) {
        raw.retain(|e| {
            if e.device == CPU_DEVICE {
                return false;
            }
            let followed = *self.followed.get_or_insert(e.device);
            if e.device != followed {
                others.push(*e);
            }
            e.device == followed
        });
    }
}

/// Trace entries kept per other device: their snapshots are PyTorch's concern (a cut holds
/// the first device's trace), so their rings hold only what accounting needs.
const OTHER_DEVICE_RING: usize = 1;

/// Steps' reports kept for a viewer that attaches later.
const RECENT_STEPS: usize = 200;
/// How often the flusher thread ships what the shim recorded, between phase boundaries.
const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// What the host says about a finished step.
#[derive(Clone, Debug)]
pub struct StepEnd {
    /// None: the host did not read it (see `StepReport::loss`).
    pub loss: Option<f64>,
    pub elapsed_s: f64,
    pub mode: Mode,
    pub precision: Precision,
    pub attention: Option<Attention>,
    /// vramscope's own model's checkpointing; None for a user's job.
    pub checkpointing: Option<Checkpointing>,
    pub ctx: i64,
    pub batch: i64,
}

pub struct Session {
    capture: Box<dyn Capture>,
    pub tracker: Tracker,
    frames: FrameTables,
    pub scopes: Arc<Scopes>,
    server: Server,
    info: EngineInfo,
    pub step: u64,
    pub phase: Phase,
    /// Phases entered during the step (its report lists their peaks).
    phases_seen: BTreeSet<Phase>,
    /// Shared with the host's in-band handle, which skips the step boundary's work while
    /// nothing is asked of it.
    paused: Arc<AtomicBool>,
    /// What the host said of each step whose in-band end is not yet processed.
    step_ends: Arc<Mutex<VecDeque<StepEnd>>>,
    recent_steps: VecDeque<StepReport>,
    epoch_us_at_zero: i64,
    writers: Vec<JoinHandle<()>>,
    /// Outcomes of snapshots being written, reported as they finish.
    pending_writes: Vec<std::sync::mpsc::Receiver<Report>>,
    snapshot_dir: PathBuf,
    raw: Vec<RawEvent>,
    log: Log,
    announce_viewers: bool,
    /// The snapshot written when an allocation failed, for the OOM report that follows.
    oom_snapshot: Option<PathBuf>,
    /// CUDA: the job's first device (the tracker's), and its every other device's tracker.
    devices: DeviceFollow,
    others: BTreeMap<u8, Tracker>,
    other_raw: Vec<RawEvent>,
    followed_raw: Vec<RawEvent>,
    /// The shim's dropped-event count last said.
    dropped_said: u64,
    snapshot_trace_from_step: Option<u64>,
}

/// What a host's own thread says during a step (a phase begins, a tensor is named, the step
/// ends) without waiting for the tracker: each goes into the shim's buffer as a record
/// among the allocator's events, in order, and the thread that drains next (the flusher,
/// every `FLUSH_EVERY`) processes it where it falls. The job's thread neither runs the
/// allocator model nor waits for the session's lock while the flusher holds it (issue 35:
/// at each boundary the job's thread once drained and modelled the events itself, 20 µs of
/// CPU and as much again waiting, ten times a step).
pub struct InBand {
    capture: Box<dyn Capture>,
    step_ends: Arc<Mutex<VecDeque<StepEnd>>>,
    server: ServerHandle,
    controls: Receiver<Control>,
    paused: Arc<AtomicBool>,
}

impl InBand {
    /// Step `step`'s phase `phase` begins; what the shim records next is stamped with it.
    pub fn phase(&self, step: u64, phase: Phase) {
        self.capture.mark(&RawEvent::mark(RAW_MARK_PHASE, step as u32, phase as u8, 0, 0));
    }

    /// The allocation at raw address `key` holds `category`, called `scope` (0: keep its own).
    pub fn tag(&self, key: u64, category: Category, scope: u32) {
        self.capture.mark(&RawEvent::mark(RAW_MARK_TAG, 0, category as u8, key, scope));
    }

    /// Step `step` ends as `end` says (its report goes out once processed).
    pub fn step_end(&self, step: u64, end: StepEnd) {
        self.phase(step, Phase::Other);
        // Queued before its record, so the record always finds it.
        self.step_ends.lock().unwrap_or_else(|e| e.into_inner()).push_back(end);
        self.capture.mark(&RawEvent::mark(RAW_MARK_STEP_END, step as u32, Phase::Other as u8, 0, 0));
    }

    /// Nothing waits at this step's boundary: no control from a viewer, and not paused.
    /// The host then goes on without the session's lock.
    pub fn nothing_between(&self) -> bool {
        self.controls.is_empty() && !self.paused.load(Ordering::Relaxed)
    }

    pub fn take_snapshot_request(&self) -> bool {
        self.server.take_snapshot_request()
    }

    pub fn viewers(&self) -> usize {
        self.server.viewers()
    }
}

pub type Shared = Arc<Mutex<Session>>;

pub fn lock(s: &Shared) -> MutexGuard<'_, Session> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// How a session starts.
pub struct SessionOptions {
    pub info: EngineInfo,
    pub backend: Backend,
    pub snapshot_dir: PathBuf,
    /// The innermost frame of every snapshot stack: where the job's loop runs.
    pub runner_frame: Frame,
    pub start_paused: bool,
    /// Say on the job's stderr when a viewer attaches (not when the job's launcher does).
    pub announce_viewers: bool,
    /// Snapshots' traces begin at this step (see `EngineOptions::snapshot_trace_from_step`).
    pub snapshot_trace_from_step: Option<u64>,
}

/// Between steps, the loop either runs the next one or stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Boundary {
    Run,
    Stop,
}

impl Session {
    pub fn new(capture: Box<dyn Capture>, scopes: Arc<Scopes>, server: Server, opts: SessionOptions, log: Log) -> Session {
        let epoch_us_at_zero = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
            - (capture.now_ns() / 1000) as i64;
        // A CUDA backend given at the start names its device (the engine's, or the one the
        // user chose); one switched to later follows the job's first device.
        let followed = match &opts.backend {
            Backend::Cuda { device } => Some(*device),
            Backend::Modelled(_) => None,
        };
        let tracker = Tracker::new(opts.backend, super::tracker::RING_ENTRIES);
        let mut info = opts.info;
        if let Some(d) = followed {
            info.pci_bus_id = capture.cuda_pci_bus_id(d);
        }
        Session {
            capture,
            tracker,
            frames: FrameTables::new(opts.runner_frame),
            scopes,
            server,
            info,
            step: 0,
            phase: Phase::Other,
            phases_seen: BTreeSet::new(),
            paused: Arc::new(AtomicBool::new(opts.start_paused)),
            step_ends: Arc::default(),
            recent_steps: VecDeque::new(),
            epoch_us_at_zero,
            writers: Vec::new(),
            pending_writes: Vec::new(),
            snapshot_dir: opts.snapshot_dir,
            raw: Vec::with_capacity(1 << 14),
            log,
            announce_viewers: opts.announce_viewers,
            oom_snapshot: None,
            devices: DeviceFollow { followed },
            others: BTreeMap::new(),
            other_raw: Vec::new(),
            followed_raw: Vec::new(),
            dropped_said: 0,
            snapshot_trace_from_step: opts.snapshot_trace_from_step,
        }
    }

    pub fn now_ns(&self) -> u64 {
        self.capture.now_ns()
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }

    /// The host's way to say phases, names and step ends from its own thread without this
    /// session's lock: they go in order among the shim's events, and whichever thread
    /// drains next (the flusher, mostly) processes them. `capture` is a second handle to
    /// this session's shim.
    pub fn in_band(&self, capture: Box<dyn Capture>) -> InBand {
        InBand { capture, step_ends: self.step_ends.clone(), server: self.server.handle(), controls: self.server.controls.clone(), paused: self.paused.clone() }
    }

    /// Says the session started (the host knows its parameter count by now).
    pub fn start(&mut self, parameters: i64) {
        self.info.parameters = parameters;
        self.refresh_stacks();
        self.drain();
        // What building the model took (initialisation's temporaries) is no step's: the
        // first step's figures start from what is live now.
        let _ = self.tracker.take_step_stats();
        self.report(Report::Started(self.info.clone()));
        if self.paused() {
            self.report(Report::Paused(true));
        }
        self.flush();
    }

    /// Gives every (scope, phase) pair its snapshot stack, for scopes interned so far.
    fn refresh_stacks(&mut self) {
        for id in 0..self.scopes.count() as u32 {
            for phase in Phase::ALL {
                if !self.tracker.stack_of.contains_key(&(id, phase)) {
                    let s = self.frames.stack_for(&self.scopes.name(id), phase);
                    self.tracker.stack_of.insert((id, phase), s);
                }
            }
        }
    }

    /// Moves what the shim recorded into the tracker, and processes the host's in-band
    /// records where they fall among the events.
    pub fn drain(&mut self) {
        let mut raw = std::mem::take(&mut self.raw);
        raw.clear();
        self.capture.drain(&mut raw);
        let mut rest = &raw[..];
        while !rest.is_empty() {
            let n = rest.iter().position(RawEvent::is_mark).unwrap_or(rest.len());
            self.ingest(&rest[..n]);
            if let Some(m) = rest.get(n) {
                self.apply_mark(m);
            }
            rest = rest.get(n + 1..).unwrap_or_default();
        }
        self.raw = raw;
        let dropped = self.capture.dropped();
        if dropped > self.dropped_said {
            self.dropped_said = dropped;
            self.report(Report::Note(format!(
                "the job's capture buffer overflowed: {dropped} allocator events lost, so totals from here on miss them"
            )));
        }
    }

    fn ingest(&mut self, events: &[RawEvent]) {
        if events.is_empty() {
            return;
        }
        let Backend::Cuda { .. } = self.tracker.backend() else {
            self.tracker.ingest(events);
            return;
        };
        let chosen = self.devices.followed.is_none();
        let (mut mine, mut other) = (std::mem::take(&mut self.followed_raw), std::mem::take(&mut self.other_raw));
        mine.clear();
        mine.extend_from_slice(events);
        other.clear();
        self.devices.split(&mut mine, &mut other);
        if let Some(d) = self.devices.followed.filter(|_| chosen) {
            self.tracker.set_cuda_device(d);
            self.info.device = format!("cuda:{d}");
            self.info.pci_bus_id = self.capture.cuda_pci_bus_id(d);
            self.report(Report::Started(self.info.clone()));
        }
        self.ingest_other_devices(&other);
        self.tracker.ingest(&mine);
        (self.followed_raw, self.other_raw) = (mine, other);
    }

    fn apply_mark(&mut self, m: &RawEvent) {
        match m.action {
            RAW_MARK_PHASE => {
                self.step = u64::from(m.step);
                self.begin_phase(m.t_ns, Phase::from_u8(m.phase));
            }
            RAW_MARK_TAG => self.tag_scope(m.addr, Category::from_u8(m.phase), m.scope),
            RAW_MARK_STEP_END => {
                let end = self.step_ends.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
                if let Some(end) = end {
                    self.step = u64::from(m.step);
                    self.close_step(&end);
                }
            }
            _ => {}
        }
    }

    /// CUDA: the device this session follows, once known.
    pub fn followed_device(&self) -> Option<u8> {
        self.devices.followed
    }

    /// Events of the job's other CUDA devices, each into its own tracker (made, and said,
    /// at the device's first event).
    fn ingest_other_devices(&mut self, events: &[RawEvent]) {
        let mut by_device: BTreeMap<u8, Vec<RawEvent>> = BTreeMap::new();
        for e in events {
            by_device.entry(e.device).or_default().push(*e);
        }
        for (d, mine) in by_device {
            if !self.others.contains_key(&d) {
                let mut t = Tracker::new(Backend::Cuda { device: d }, OTHER_DEVICE_RING);
                t.mark(mine[0].t_ns, self.step as u32, self.phase);
                self.others.insert(d, t);
                let first = self.devices.followed.unwrap_or(0);
                self.report(Report::Note(format!("the job also allocates on cuda:{d}: shown as its own device beside cuda:{first} (D switches)")));
            }
            self.others.get_mut(&d).expect("made above").ingest(&mine);
        }
    }

    /// The job initialised CUDA (the hook's case): from now on the session follows the
    /// caching allocator's trace, and what it modelled from CPU tensors is let go.
    pub fn follow_cuda(&mut self) {
        if let Backend::Cuda { .. } = self.tracker.backend() {
            return;
        }
        self.drain();
        self.tracker.switch_to_cuda(self.capture.now_ns(), 0);
        self.info.cuda = true;
        self.info.device = "cuda".into();
        self.info.autocast = Some(AutocastPolicy::Cuda);
        self.info.note = Some("the job initialised CUDA: following its caching allocator (CPU tensors before that were modelled)".into());
        self.report(Report::Started(self.info.clone()));
        self.flush();
    }

    /// Lets in viewers that attached, then sends what is pending, never waiting for one.
    pub fn flush(&mut self) {
        self.admit_viewers();
        let scopes = self.scopes.take_unsent();
        let batch = self.tracker.take_batch(scopes);
        if !(batch.events.is_empty() && batch.marks.is_empty() && batch.retags.is_empty() && batch.scopes.is_empty()) {
            self.server.broadcast(self.capture.now_ns(), &Incoming::Batch(batch));
        }
        self.flush_other_devices();
    }

    /// Other devices' batches go out once they hold events: a viewer tells a batch's device
    /// by its events, so their marks and retags wait for some.
    fn flush_other_devices(&mut self) {
        let now = self.capture.now_ns();
        for t in self.others.values_mut() {
            if t.has_pending_events() {
                self.server.broadcast(now, &Incoming::Batch(t.take_batch(Vec::new())));
            }
        }
    }

    /// A viewer that attaches mid-run first hears who this is, the steps so far, every
    /// name, and every live allocation, so its totals agree with the job's from then on.
    fn admit_viewers(&mut self) {
        let joining = self.server.take_joining();
        if joining.is_empty() {
            return;
        }
        // What is pending belongs to viewers already attached; a new one gets the state
        // after it.
        self.refresh_stacks();
        let scopes = self.scopes.take_unsent();
        let pending = self.tracker.take_batch(scopes);
        if !pending.events.is_empty() || !pending.scopes.is_empty() || !pending.retags.is_empty() || !pending.marks.is_empty() {
            self.server.broadcast(self.capture.now_ns(), &Incoming::Batch(pending));
        }
        self.flush_other_devices();
        let now = self.capture.now_ns();
        let live = self.tracker.live_events(now);
        let first_seq = self.tracker.next_seq() - live.len() as u64;
        let mut items = vec![(now, Incoming::Report(Report::Started(self.info.clone())))];
        items.extend(self.recent_steps.iter().map(|s| (now, Incoming::Report(Report::Step(s.clone())))));
        items.push((now, Incoming::Batch(Batch { first_seq, events: live, scopes: self.scopes.all(), ..Batch::default() })));
        for t in self.others.values() {
            let live = t.live_events(now);
            if !live.is_empty() {
                items.push((now, Incoming::Batch(Batch { first_seq: t.next_seq() - live.len() as u64, events: live, ..Batch::default() })));
            }
        }
        if self.paused() {
            items.push((now, Incoming::Report(Report::Paused(true))));
        }
        for c in joining {
            if self.announce_viewers {
                (self.log)(&format!("vramscope: viewer attached ({})", c.peer));
            }
            self.server.admit(c, items.clone());
        }
    }

    pub fn report(&mut self, r: Report) {
        self.server.broadcast(self.capture.now_ns(), &Incoming::Report(r));
    }

    /// A phase boundary: what was recorded belongs to the phase that ends.
    pub fn set_phase(&mut self, phase: Phase) {
        self.drain();
        self.capture.set_tags(self.step as u32, phase);
        self.begin_phase(self.capture.now_ns(), phase);
    }

    fn begin_phase(&mut self, now: u64, phase: Phase) {
        if let (Backend::Cuda { .. }, Some(device)) = (self.tracker.backend(), self.devices.followed) {
            self.read_cuda_counters(device, self.phase);
        }
        self.phase = phase;
        if phase != Phase::Other {
            self.phases_seen.insert(phase);
        }
        self.tracker.mark(now, self.step as u32, phase);
        for t in self.others.values_mut() {
            t.mark(now, self.step as u32, phase);
        }
        self.refresh_stacks();
        // No flush: the flusher ships the mark within FLUSH_EVERY. Shipping at every
        // boundary woke the viewers' writer threads many times a step, each wake-up taking
        // a core from the job (issue 35: a dense job has ten boundaries a step).
    }

    /// CUDA: the allocator's current counters correct the running figures at each
    /// boundary; the phases' peaks are the events' own.
    fn read_cuda_counters(&mut self, device: u8, ended: Phase) {
        if let Ok(s) = self.capture.cuda_stats(device) {
            self.tracker.set_device_counters(s.allocated, s.reserved, ended);
        }
        for (d, t) in self.others.iter_mut() {
            if let Ok(s) = self.capture.cuda_stats(*d) {
                t.set_device_counters(s.allocated, s.reserved, ended);
            }
        }
    }

    /// The host names what the allocation at raw address `key` holds (drain first, so the
    /// allocation is known), and optionally what it is called.
    pub fn tag(&mut self, key: u64, category: Category, name: Option<&str>) {
        let scope = name.map_or(0, |n| self.scopes.intern(n));
        self.tag_scope(key, category, scope);
    }

    /// `tag`, with the name already interned (0: none).
    pub fn tag_scope(&mut self, key: u64, category: Category, scope: u32) {
        // Device addresses are unique across devices: the tracker holding it takes it.
        self.tracker.tag(key, category, scope);
        for t in self.others.values_mut() {
            t.tag(key, category, scope);
        }
    }

    /// Closes a step: its exact figures go out as a report, one for each device.
    pub fn end_step(&mut self, end: &StepEnd) -> StepReport {
        self.set_phase(Phase::Other);
        self.close_step(end)
    }

    fn close_step(&mut self, end: &StepEnd) -> StepReport {
        // The step's events reach viewers before its report.
        self.flush();
        self.tracker.settle_kept(self.step);
        for t in self.others.values_mut() {
            t.settle_kept(self.step);
        }
        let r = self.step_report(None, end);
        let others: Vec<u8> = self.others.keys().copied().collect();
        for d in others {
            let other = self.step_report(Some(d), end);
            self.keep_step(other);
        }
        self.keep_step(r.clone());
        self.phases_seen.clear();
        self.flush();
        r
    }

    /// The step's figures on the first device (None) or another one.
    fn step_report(&mut self, device: Option<u8>, end: &StepEnd) -> StepReport {
        let t = match device {
            Some(d) => self.others.get_mut(&d).expect("a tracker for every other device"),
            None => &mut self.tracker,
        };
        let stats = t.take_step_stats();
        let by_phase = |peaks: &[u64; 5]| self.phases_seen.iter().map(|p| (p.as_str().to_string(), peaks[*p as usize])).collect();
        let phase_peak_bytes = by_phase(&stats.phase_peak_allocated);
        let phase_active_peak_bytes = by_phase(&stats.phase_peak_active);
        let by_category = |bytes: &[u64; 8]| Category::ALL.iter().map(|c| (c.as_str().to_string(), bytes[*c as usize])).filter(|(_, b)| *b > 0).collect();
        let category_bytes = by_category(&t.category_bytes);
        StepReport {
            step: self.step,
            mode: end.mode,
            precision: end.precision,
            attention: end.attention,
            checkpointing: end.checkpointing,
            ctx: end.ctx,
            batch: end.batch,
            peak_allocated_bytes: stats.peak_allocated,
            reserved_bytes: t.reserved_bytes,
            peak_reserved_bytes: stats.peak_reserved,
            peak_active_bytes: stats.peak_active,
            phase_peak_bytes,
            phase_active_peak_bytes,
            mean_active_bytes: stats.mean_active(),
            category_peak_bytes: by_category(&stats.category_peaks),
            category_bytes,
            live_bytes: t.active_bytes,
            step_time_s: end.elapsed_s,
            tokens_per_s: (end.ctx * end.batch) as f64 / end.elapsed_s.max(1e-9),
            samples_per_s: end.batch as f64 / end.elapsed_s.max(1e-9),
            loss: end.loss,
            dropped_batches: 0,
            dropped_events: 0,
            rank: self.info.rank,
            device,
        }
    }

    fn keep_step(&mut self, r: StepReport) {
        if self.recent_steps.len() == RECENT_STEPS {
            self.recent_steps.pop_front();
        }
        self.recent_steps.push_back(r.clone());
        self.report(Report::Step(r));
    }

    /// Stamps what the shim records from now on with `step` and `phase`, without marking a
    /// phase boundary (a step that was abandoned).
    pub fn capture_tags(&mut self, step: u64, phase: Phase) {
        self.capture.set_tags(step as u32, phase);
    }

    /// The snapshot an out-of-memory handler wrote, for the report of the failed step.
    pub fn set_oom_snapshot(&mut self, path: Option<PathBuf>) {
        self.oom_snapshot = path;
    }

    /// A step failed: pause, and say why (an OOM, with the snapshot written for it).
    pub fn fail_step(&mut self, message: &str, oom: bool) {
        let snapshot = self.oom_snapshot.take();
        let phase = self.phase;
        self.set_phase(Phase::Other);
        self.phases_seen.clear();
        let _ = self.tracker.take_step_stats();
        for t in self.others.values_mut() {
            let _ = t.take_step_stats();
        }
        let r = if oom {
            Report::Oom(OutOfMemory { step: self.step, phase, message: message.to_string(), snapshot })
        } else {
            Report::Error(format!("step {} failed: {message}", self.step))
        };
        self.report(r);
        self.set_paused(true);
        self.flush();
    }

    pub fn set_paused(&mut self, p: bool) {
        if self.paused() != p {
            self.paused.store(p, Ordering::Relaxed);
            self.report(Report::Paused(p));
        }
    }

    /// Takes a snapshot request a viewer made (during the step that just ended).
    pub fn take_snapshot_request(&mut self) -> bool {
        self.server.take_snapshot_request()
    }

    /// An allocation failed in a job that handles it itself (the hook's): say so, with the
    /// snapshot written for it (or why there is none), and go on.
    pub fn oom(&mut self, requested: u64, snapshot: Option<PathBuf>, note: Option<&str>) {
        let message = match note {
            Some(n) => format!("out of memory: tried to allocate {requested} bytes ({n})"),
            None => format!("out of memory: tried to allocate {requested} bytes"),
        };
        self.report_oom(message, snapshot);
    }

    /// Says an out-of-memory error in the step and phase it happened in (`message` as the
    /// job saw it, or as `oom` words it).
    pub fn report_oom(&mut self, message: String, snapshot: Option<PathBuf>) {
        self.drain();
        self.report(Report::Oom(OutOfMemory { step: self.step, phase: self.phase, message, snapshot }));
        self.flush();
    }

    /// Cuts a snapshot now (and PyTorch's own on CUDA) and writes it as `name` in the
    /// snapshot directory on another thread, so the loop never waits on the disk.
    pub fn snapshot(&mut self, name: &str) {
        let step = self.step;
        match self.cut() {
            Ok(cut) => {
                let (dir, name) = (self.snapshot_dir.clone(), name.to_string());
                let (tx, rx) = std::sync::mpsc::channel();
                let spawned = std::thread::Builder::new().name("vramscope-snapshot".into()).spawn(move || {
                    let _ = tx.send(write_cut(cut, &dir, &name, step));
                });
                match spawned {
                    Ok(h) => {
                        self.writers.push(h);
                        self.pending_writes.push(rx);
                    }
                    Err(e) => self.report(Report::SnapshotFailed { step, error: e.to_string() }),
                }
            }
            Err(error) => self.report(Report::SnapshotFailed { step, error }),
        }
        self.writers.retain(|h| !h.is_finished());
        self.collect_writes(false);
    }

    /// Cuts and writes a snapshot on this thread: an OOM's, which must be on disk before the
    /// error reaches the job's code.
    pub fn snapshot_now(&mut self, name: &str) -> Option<PathBuf> {
        let step = self.step;
        let r = match self.cut() {
            Ok(cut) => write_cut(cut, &self.snapshot_dir, name, step),
            Err(error) => Report::SnapshotFailed { step, error },
        };
        let path = match &r {
            Report::SnapshotSaved { path, .. } => Some(path.clone()),
            _ => None,
        };
        self.report(r);
        path
    }

    fn cut(&mut self) -> Result<SnapshotCut, String> {
        self.drain();
        let base = match self.tracker.backend() {
            Backend::Cuda { .. } => Some(self.capture.cuda_snapshot().map_err(|e| format!("PyTorch's snapshot: {e}"))?),
            Backend::Modelled(_) => None,
        };
        let mut cut = SnapshotCut::take(&self.tracker, &self.frames, base, self.epoch_us_at_zero);
        if let Some(step) = self.snapshot_trace_from_step {
            cut.trim_before_step(step as u32);
        }
        Ok(cut)
    }

    /// Reports the snapshots written since the last call (waiting for all with `wait`).
    fn collect_writes(&mut self, wait: bool) {
        let mut still = Vec::new();
        for rx in std::mem::take(&mut self.pending_writes) {
            let r = if wait { rx.recv().ok() } else { rx.try_recv().ok() };
            match r {
                Some(r) => self.report(r),
                None if !wait => still.push(rx),
                None => {}
            }
        }
        self.pending_writes = still;
    }

    /// Applies a knob value the host accepted: reports the change (from the next step).
    pub fn knob_changed(&mut self, name: &str, to: &str) {
        let step = self.step;
        let Some(k) = self.info.knobs.iter_mut().find(|k| k.name == name) else { return };
        if k.value == to {
            return;
        }
        let from = std::mem::replace(&mut k.value, to.to_string());
        if let Some(c) = &mut self.info.config {
            // vramscope's own model keeps its config in step with its knobs.
            // The engine applied it already: a value it refused never gets here.
            let _ = crate::step_config::apply_knob(c, name, to);
        }
        self.report(Report::Knob(KnobChange { step, knob: name.to_string(), from, to: to.to_string() }));
    }

    /// The job's parameter count, learnt once its model is known (the hook's case).
    pub fn set_parameters(&mut self, n: i64) {
        if self.info.parameters != n {
            self.info.parameters = n;
            self.report(Report::Started(self.info.clone()));
        }
    }

    /// Declares a knob (the Python hook's `knob()`); its value is the declared default.
    /// A knob and its value now. Declared again (a script taking over a knob the Python
    /// hook declared for it, as `precision`), the latest declaration's value holds.
    pub fn declare_knob(&mut self, name: &str, value: &str) {
        match self.info.knobs.iter_mut().find(|k| k.name == name) {
            Some(k) if k.value == value => return,
            Some(k) => k.value = value.to_string(),
            None => self.info.knobs.push(Knob { name: name.to_string(), value: value.to_string() }),
        }
        // Viewers learn the knob with a fresh Started (they keep their store).
        self.report(Report::Started(self.info.clone()));
    }

    /// Ends the stream: snapshots being written finish, every viewer gets the end.
    pub fn finish(&mut self) {
        self.drain();
        self.flush();
        for w in self.writers.drain(..) {
            let _ = w.join();
        }
        self.collect_writes(true);
        self.report(Report::Finished);
        self.flush();
        self.server.finish();
    }

    pub fn server(&self) -> &Server {
        &self.server
    }
}

fn write_cut(cut: SnapshotCut, dir: &std::path::Path, name: &str, step: u64) -> Report {
    let path = unique_path(dir, name);
    match cut.into_snapshot().map_err(|e| format!("PyTorch's snapshot: {e}")) {
        Ok(snap) => match save_snapshot_atomic(&snap, &path) {
            Ok(p) => Report::SnapshotSaved { step, path: p },
            Err(e) => Report::SnapshotFailed { step, error: e.to_string() },
        },
        Err(error) => Report::SnapshotFailed { step, error },
    }
}

/// Between steps: applies what viewers asked for, and waits while paused (shipping what
/// the shim records and letting viewers in all the while). `apply` sets a knob on the host
/// and returns the value now in force, or why it cannot. The lock is never held while
/// waiting, so the flusher and the host's other threads go on.
pub fn between_steps(shared: &Shared, apply: &mut dyn FnMut(&str, &str) -> Result<String, String>) -> Boundary {
    let controls = lock(shared).server.controls.clone();
    let mut run_once = false;
    loop {
        let paused = lock(shared).paused();
        let msg = if paused && !run_once {
            match controls.recv_timeout(FLUSH_EVERY) {
                Ok(m) => m,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    let mut s = lock(shared);
                    s.drain();
                    s.flush();
                    s.collect_writes(false);
                    continue;
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Boundary::Stop,
            }
        } else {
            match controls.try_recv() {
                Ok(m) => m,
                Err(_) => return Boundary::Run,
            }
        };
        let mut s = lock(shared);
        // What the step's in-band end says reaches viewers before the control's answer.
        s.drain();
        match msg {
            Control::Stop => return Boundary::Stop,
            Control::StepOnce => run_once = true,
            Control::Pause => s.set_paused(true),
            Control::Resume => s.set_paused(false),
            // Taken by the server as it arrives (see `take_snapshot_request`).
            Control::Snapshot => {}
            Control::SetKnob { name, value } => match apply(&name, &value) {
                Ok(to) => s.knob_changed(&name, &to),
                Err(why) => s.report(Report::Note(why)),
            },
        }
    }
}

/// Ships what the shim records every `FLUSH_EVERY`, so a long phase still moves the screen,
/// until stopped or dropped. It must end before the process does: at exit libtorch's
/// static destructors run, and a drain into the shim then crashes.
pub struct Flusher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    pub fn spawn(shared: &Shared) -> Flusher {
        let weak = Arc::downgrade(shared);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("vramscope-flush".into())
            .spawn(move || loop {
                std::thread::park_timeout(FLUSH_EVERY);
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Some(s) = weak.upgrade() else { return };
                let mut s = lock(&s);
                s.drain();
                s.flush();
                s.collect_writes(false);
            })
            .expect("spawn the flusher thread");
        Flusher { stop, thread: Some(thread) }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Action;

    fn ev(device: u8, addr: u64) -> RawEvent {
        RawEvent { action: Action::Alloc as u8, addr, size: 512, device, ..RawEvent::default() }
    }

    #[test]
    fn the_first_device_the_job_allocates_on_comes_first_and_others_go_beside_it() {
        // Per-rank CUDA_VISIBLE_DEVICES, or a model on cuda:1 in a rank whose LOCAL_RANK is 0:
        // the job's first device event decides, whatever the rank.
        let mut f = DeviceFollow::default();
        let (mut raw, mut others) = (vec![ev(CPU_DEVICE, 1), ev(1, 2), ev(1, 3), ev(0, 4)], Vec::new());
        f.split(&mut raw, &mut others);
        assert_eq!(f.followed, Some(1));
        assert_eq!(raw.iter().map(|e| e.addr).collect::<Vec<_>>(), [2, 3], "CPU events are not device memory");
        assert_eq!(others.iter().map(|e| (e.device, e.addr)).collect::<Vec<_>>(), [(0, 4)], "nothing is dropped");
        // A device given at the start stays first.
        let mut fixed = DeviceFollow { followed: Some(3) };
        let (mut raw, mut others) = (vec![ev(0, 1), ev(3, 2)], Vec::new());
        fixed.split(&mut raw, &mut others);
        assert_eq!((fixed.followed, raw.len(), others.len()), (Some(3), 1, 1));
    }
}
