//! The training loop on its own thread. It owns libtorch: builds the model, runs steps,
//! applies control messages at step boundaries, drains the capture shim at every phase
//! boundary, and sends batches (droppable, bounded) and reports (never dropped) out.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{bounded, unbounded, Receiver, Sender, TrySendError};
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::capture::snapshot::{FrameTables, SnapshotCut};
use crate::capture::tracker::{Backend, Tracker};
use crate::capture::{self, RawEvent, CPU_DEVICE};
use crate::event::{Batch, Category, Phase};
use crate::snapshot::writer::save_snapshot_atomic;

use super::config::{Attention, DeviceChoice, Mode, Precision, StepConfig};
use super::model::TransformerLm;
use super::optim::AdamW;
use super::scope::Scopes;

/// Changes the consumer asks for; knob changes apply at the next step boundary.
#[derive(Clone, Debug, PartialEq)]
pub enum Control {
    Precision(Precision),
    Ctx(i64),
    Batch(i64),
    Mode(Mode),
    Attention(Attention),
    Pause,
    Resume,
    /// Run one step while paused.
    StepOnce,
    /// Write a snapshot at the next step boundary.
    Snapshot,
    Stop,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineInfo {
    pub device: String,
    pub cuda: bool,
    pub parameters: i64,
    pub config: StepConfig,
    /// Said once on screen, e.g. why the CPU is used.
    pub note: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepReport {
    pub step: u64,
    pub mode: Mode,
    pub precision: Precision,
    pub attention: Attention,
    pub ctx: i64,
    pub batch: i64,
    /// Peak of the allocator's allocated bytes (block sizes) during the step.
    pub peak_allocated_bytes: u64,
    /// Reserved (segment) bytes at the end of the step.
    pub reserved_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Peak of requested live bytes (what memory_viz's active timeline stacks).
    pub peak_active_bytes: u64,
    pub phase_peak_bytes: BTreeMap<String, u64>,
    /// Live requested bytes per category at the end of the step.
    pub category_bytes: BTreeMap<String, u64>,
    pub live_bytes: u64,
    pub step_time_s: f64,
    pub tokens_per_s: f64,
    pub loss: f64,
    pub dropped_batches: u64,
    pub dropped_events: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KnobChange {
    /// First step that runs with the new value.
    pub step: u64,
    pub knob: String,
    pub from: String,
    pub to: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OomReport {
    pub step: u64,
    pub phase: Phase,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Report {
    Started(EngineInfo),
    Knob(KnobChange),
    Step(StepReport),
    SnapshotSaved { step: u64, path: PathBuf },
    SnapshotFailed { step: u64, error: String },
    Oom(OomReport),
    Paused(bool),
    /// A step failed for a reason other than OOM; the loop pauses.
    Error(String),
    Finished,
}

#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub config: StepConfig,
    pub device: DeviceChoice,
    /// Stop after this many steps (None = until told).
    pub steps: Option<u64>,
    pub seed: i64,
    /// Recording on (off only for overhead benchmarks).
    pub capture: bool,
    pub batch_capacity: usize,
    pub snapshot_at: Vec<u64>,
    pub snapshot_dir: PathBuf,
    pub start_paused: bool,
    /// Fault injection for testing leak detection: each step's forward pass allocates this
    /// many bytes (scope `fault_injection.leak`) and keeps them for the rest of the run —
    /// the "tensor kept per step" bug. 0 (the default) injects nothing.
    pub leak_bytes_per_step: u64,
}

impl EngineOptions {
    pub fn new(config: StepConfig) -> Self {
        EngineOptions {
            config,
            device: DeviceChoice::Auto,
            steps: None,
            seed: 0,
            capture: true,
            batch_capacity: 256,
            snapshot_at: Vec::new(),
            snapshot_dir: PathBuf::from("snapshots"),
            start_paused: false,
            leak_bytes_per_step: 0,
        }
    }
}

pub struct Engine {
    pub control: Sender<Control>,
    pub batches: Receiver<Batch>,
    pub reports: Receiver<Report>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The capture hooks libtorch's process-wide allocators, so one engine runs per process at a
/// time: a second `spawn` waits until the first has shut down.
static ENGINE_BUSY: Mutex<bool> = Mutex::new(false);
static ENGINE_FREE: Condvar = Condvar::new();

fn acquire_engine_slot() {
    let mut busy = ENGINE_BUSY.lock().unwrap_or_else(|e| e.into_inner());
    while *busy {
        busy = ENGINE_FREE.wait(busy).unwrap_or_else(|e| e.into_inner());
    }
    *busy = true;
}

fn release_engine_slot() {
    *ENGINE_BUSY.lock().unwrap_or_else(|e| e.into_inner()) = false;
    ENGINE_FREE.notify_one();
}

impl Engine {
    pub fn spawn(opts: EngineOptions) -> anyhow::Result<Engine> {
        let device = resolve_device(opts.device)?;
        acquire_engine_slot();
        let (ctl_tx, ctl_rx) = unbounded();
        let (batch_tx, batch_rx) = bounded(opts.batch_capacity.max(1));
        let (rep_tx, rep_rx) = unbounded();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name(ENGINE_THREAD.into())
            .spawn(move || {
                // Steps catch their own failures; this catches a bug anywhere else, so the
                // consumer always hears why the engine ended.
                let outcome = catch_unwind(AssertUnwindSafe(|| {
                    match Worker::new(opts, device, batch_tx, rep_tx.clone(), stop2) {
                        Ok(mut worker) => worker.run(ctl_rx),
                        Err(e) => {
                            let _ = rep_tx.send(Report::Error(format!("{e:#}")));
                        }
                    }
                }));
                if let Err(p) = outcome {
                    let _ = rep_tx.send(Report::Error(format!("the training engine failed: {}", panic_message(&p))));
                }
                let _ = rep_tx.send(Report::Finished);
            });
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                release_engine_slot();
                return Err(e.into());
            }
        };
        Ok(Engine { control: ctl_tx, batches: batch_rx, reports: rep_rx, stop, thread: Some(thread) })
    }

    /// Asks the loop to stop at the next phase boundary and waits for it (a snapshot being
    /// written finishes first).
    pub fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.control.send(Control::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
            release_engine_slot();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Makes the current panic hook skip panics on the engine thread: the engine catches those
/// (a CUDA OOM surfaces as a tch panic) and reports them, and a hook that prints or restores
/// the terminal would wreck the live screen. Call after any other hook is installed.
pub fn install_panic_filter() {
    let inner = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name() != Some(ENGINE_THREAD) {
            inner(info);
        }
    }));
}

const ENGINE_THREAD: &str = "vramscope-engine";

/// Unwinds out of a step when a stop was asked for, so quitting never waits for the step.
struct StopRequested;

pub fn resolve_device(choice: DeviceChoice) -> anyhow::Result<Device> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Cuda(n) => {
            let count = if tch::Cuda::is_available() { tch::Cuda::device_count() } else { 0 };
            check_cuda_ordinal(n, count)?;
            Ok(Device::Cuda(n as usize))
        }
        DeviceChoice::Auto => Ok(Device::cuda_if_available()),
    }
}

/// That CUDA device `n` is one of the `count` this process sees.
fn check_cuda_ordinal(n: u8, count: i64) -> anyhow::Result<()> {
    match count {
        0 => anyhow::bail!("--device cuda:{n}: no CUDA device is available here (allowed: {})", DeviceChoice::NAMES),
        c if i64::from(n) >= c => anyhow::bail!("--device cuda:{n}: this machine has {c} CUDA device(s), cuda:0 to cuda:{}", c - 1),
        _ => Ok(()),
    }
}

struct Worker {
    opts: EngineOptions,
    cfg: StepConfig,
    device: Device,
    /// The CUDA ordinal trained on (its allocator's events and counters are the ones kept).
    cuda_device: u8,
    model: TransformerLm,
    optim: AdamW,
    scopes: Scopes,
    frames: FrameTables,
    tracker: Tracker,
    raw: Vec<RawEvent>,
    batch_tx: Sender<Batch>,
    rep_tx: Sender<Report>,
    stop: Arc<AtomicBool>,
    step: u64,
    /// The phase under way (an OOM report names it).
    phase: Phase,
    paused: bool,
    snapshot_requested: bool,
    dropped_batches: u64,
    dropped_events: u64,
    epoch_us_at_zero: i64,
    writers: Vec<JoinHandle<()>>,
    /// What `leak_bytes_per_step` kept.
    leaked: Vec<Tensor>,
}

impl Worker {
    fn new(
        opts: EngineOptions,
        device: Device,
        batch_tx: Sender<Batch>,
        rep_tx: Sender<Report>,
        stop: Arc<AtomicBool>,
    ) -> anyhow::Result<Worker> {
        // Before any tensor exists, so every free is seen.
        capture::install_cpu_allocator()?;
        capture::set_capture_enabled(opts.capture);
        // Frees of an earlier engine's tensors in this process are not ours.
        capture::drain_into(&mut Vec::new());
        let cuda = device.is_cuda();
        let cuda_device = match device {
            Device::Cuda(n) => n as u8,
            _ => 0,
        };
        let tracker = if cuda {
            capture::cuda_attach(0)?;
            Tracker::new(Backend::Cuda { device: cuda_device }, 1_000_000)
        } else {
            Tracker::modelled()
        };
        let epoch_us_at_zero = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0)
            - (capture::now_ns() / 1000) as i64;
        tch::manual_seed(opts.seed);
        let scopes = Scopes::default();
        let cfg = opts.config.clone();
        capture::set_tags(0, Phase::Other);
        let model = TransformerLm::new(cfg.dims, device, &scopes);
        let mut w = Worker {
            optim: AdamW::new(1e-3, 0.9, 0.999, 1e-8, 0.01),
            cfg,
            device,
            cuda_device,
            model,
            scopes,
            frames: FrameTables::default(),
            tracker,
            raw: Vec::with_capacity(1 << 14),
            batch_tx,
            rep_tx,
            stop,
            step: 0,
            phase: Phase::Other,
            paused: opts.start_paused,
            snapshot_requested: false,
            dropped_batches: 0,
            dropped_events: 0,
            epoch_us_at_zero,
            writers: Vec::new(),
            leaked: Vec::new(),
            opts,
        };
        w.refresh_stacks();
        w.drain();
        let params: Vec<u64> = w.model.parameters().iter().map(|t| t.data_ptr() as u64).collect();
        for p in params {
            w.tracker.tag(p, Category::Parameter);
        }
        w.flush();
        let note = (!cuda).then(|| {
            if capture::cuda_compiled() {
                "no CUDA device found: training on CPU, GPU memory modelled from CPU allocations".to_string()
            } else {
                "this build has no CUDA support: training on CPU, GPU memory modelled".to_string()
            }
        });
        let _ = w.rep_tx.send(Report::Started(EngineInfo {
            device: if cuda { format!("cuda:{}", w.cuda_device) } else { "cpu".into() },
            cuda,
            parameters: w.model.parameter_count(),
            config: w.cfg.clone(),
            note,
        }));
        if w.paused {
            let _ = w.rep_tx.send(Report::Paused(true));
        }
        Ok(w)
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

    fn run(&mut self, ctl: Receiver<Control>) {
        loop {
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            // Controls apply here, between steps.
            let mut run_once = false;
            loop {
                let msg = if self.paused && !run_once {
                    match ctl.recv() {
                        Ok(m) => Some(m),
                        Err(_) => return self.finish(),
                    }
                } else {
                    ctl.try_recv().ok()
                };
                let Some(msg) = msg else { break };
                match msg {
                    Control::Stop => return self.finish(),
                    Control::StepOnce => run_once = true,
                    other => self.apply(other),
                }
                if self.stop.load(Ordering::SeqCst) {
                    return self.finish();
                }
            }
            if self.opts.steps.is_some_and(|n| self.step >= n) {
                break;
            }
            self.run_step();
            if self.opts.snapshot_at.contains(&self.step) || std::mem::take(&mut self.snapshot_requested)
            {
                self.snapshot();
            }
            self.step += 1;
        }
        self.finish()
    }

    fn finish(&mut self) {
        // A snapshot asked for before the stop is still written.
        if std::mem::take(&mut self.snapshot_requested) {
            self.snapshot();
        }
        self.flush();
        for w in self.writers.drain(..) {
            let _ = w.join();
        }
    }

    fn apply(&mut self, c: Control) {
        let next = self.step;
        let knob = |knob: &str, from: String, to: String| {
            if from != to {
                let _ = self.rep_tx.send(Report::Knob(KnobChange {
                    step: next,
                    knob: knob.into(),
                    from,
                    to,
                }));
            }
        };
        match c {
            Control::Precision(p) => {
                knob("precision", self.cfg.precision.to_string(), p.to_string());
                self.cfg.precision = p;
            }
            Control::Ctx(v) => {
                let v = v.clamp(1, super::config::MAX_CTX);
                knob("ctx", self.cfg.ctx.to_string(), v.to_string());
                self.cfg.ctx = v;
            }
            Control::Batch(v) => {
                let v = v.clamp(1, super::config::MAX_BATCH);
                knob("batch", self.cfg.batch.to_string(), v.to_string());
                self.cfg.batch = v;
            }
            Control::Mode(m) => {
                knob("mode", self.cfg.mode.to_string(), m.to_string());
                self.cfg.mode = m;
            }
            Control::Attention(a) => {
                knob("attention", self.cfg.attention.to_string(), a.to_string());
                self.cfg.attention = a;
            }
            Control::Pause => {
                if !self.paused {
                    self.paused = true;
                    let _ = self.rep_tx.send(Report::Paused(true));
                }
            }
            Control::Resume => {
                if self.paused {
                    self.paused = false;
                    let _ = self.rep_tx.send(Report::Paused(false));
                }
            }
            Control::Snapshot => self.snapshot_requested = true,
            Control::StepOnce | Control::Stop => {}
        }
    }

    /// A phase boundary inside a step: where a requested stop ends the step early.
    fn enter_phase(&mut self, phase: Phase) {
        if self.stop.load(Ordering::SeqCst) {
            std::panic::resume_unwind(Box::new(StopRequested));
        }
        self.set_phase(phase);
    }

    fn set_phase(&mut self, phase: Phase) {
        self.drain();
        if self.device.is_cuda() {
            self.read_cuda_counters(phase);
        }
        capture::set_tags(self.step as u32, phase);
        self.phase = phase;
        self.tracker.mark(capture::now_ns(), self.step as u32, phase);
        self.flush();
    }

    /// CUDA: the allocator's peak since the last phase boundary belongs to the phase that
    /// just ended; then start a fresh peak window.
    fn read_cuda_counters(&mut self, ended: Phase) {
        if let Ok(s) = capture::cuda_stats(self.cuda_device as usize) {
            self.tracker.note_phase_peak(ended, s.allocated_peak, s.reserved_peak);
            self.tracker.set_device_counters(s.allocated, s.reserved, ended);
            let _ = capture::cuda_reset_peaks(self.cuda_device as usize);
        }
    }

    fn drain(&mut self) {
        self.raw.clear();
        capture::drain_into(&mut self.raw);
        if self.device.is_cuda() {
            // CPU-side tensors (scalars, RNG state) are not device memory, and other GPUs'
            // allocators are not the one training.
            let ours = self.cuda_device;
            self.raw.retain(|e| e.device != CPU_DEVICE && e.device == ours);
        }
        let raw = std::mem::take(&mut self.raw);
        self.tracker.ingest(&raw);
        self.raw = raw;
    }

    /// Sends what is pending without ever waiting for the consumer.
    fn flush(&mut self) {
        let scopes = self.scopes.take_unsent();
        let batch = self.tracker.take_batch(scopes);
        if batch.events.is_empty() && batch.marks.is_empty() && batch.retags.is_empty() && batch.scopes.is_empty() {
            return;
        }
        let n = batch.events.len() as u64;
        match self.batch_tx.try_send(batch) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped_batches += 1;
                self.dropped_events += n;
            }
            // Nobody listens (headless JSON without a store): nothing to count.
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    fn run_step(&mut self) {
        let cfg = self.cfg.clone();
        let started = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| self.step_inner(&cfg)));
        let elapsed = started.elapsed().as_secs_f64();
        match outcome {
            Ok(loss) => {
                self.set_phase(Phase::Other);
                self.report_step(&cfg, elapsed, loss);
            }
            Err(panic) if panic.is::<StopRequested>() => {
                capture::set_tags(self.step as u32, Phase::Other);
                self.model.clear_grads();
            }
            Err(panic) => {
                let msg = panic_message(&panic);
                let phase = self.phase;
                capture::set_tags(self.step as u32, Phase::Other);
                // Whatever the failed step held was dropped during unwinding.
                if self.device.is_cuda() {
                    let _ = capture::cuda_empty_cache();
                }
                self.model.clear_grads();
                self.set_phase(Phase::Other);
                let report = if is_oom(&msg) {
                    Report::Oom(OomReport { step: self.step, phase, message: first_line(&msg) })
                } else {
                    Report::Error(format!("step {} failed: {}", self.step, first_line(&msg)))
                };
                let _ = self.rep_tx.send(report);
                self.paused = true;
                let _ = self.rep_tx.send(Report::Paused(true));
            }
        }
    }

    fn step_inner(&mut self, cfg: &StepConfig) -> f64 {
        self.enter_phase(Phase::Other);
        self.model.prepare(cfg.ctx, &self.scopes);
        self.refresh_stacks();
        let shape = [cfg.batch, cfg.ctx];
        let tokens = Tensor::randint(cfg.dims.vocab, shape, (Kind::Int64, self.device));
        let targets = Tensor::randint(cfg.dims.vocab, shape, (Kind::Int64, self.device));
        self.drain();
        for t in [&tokens, &targets] {
            self.tracker.tag(t.data_ptr() as u64, Category::Input);
        }
        let cuda = self.device.is_cuda();
        let bf16 = cfg.precision == Precision::Bf16;

        self.enter_phase(Phase::Forward);
        if self.opts.leak_bytes_per_step > 0 {
            let _s = self.scopes.enter(self.scopes.intern("fault_injection.leak"));
            let n = self.opts.leak_bytes_per_step.div_ceil(4) as i64;
            self.leaked.push(Tensor::zeros([n], (Kind::Float, self.device)));
        }
        let forward = |model: &TransformerLm, scopes: &Scopes| {
            if bf16 {
                capture::autocast(cuda, true).expect("enable autocast");
            }
            let logits = model.forward(&tokens, cfg.attention, scopes);
            let loss = logits
                .view([-1, cfg.dims.vocab])
                .cross_entropy_for_logits(&targets.view([-1]));
            if bf16 {
                capture::autocast(cuda, false).expect("disable autocast");
            }
            loss
        };
        let loss = match cfg.mode {
            Mode::Forward => tch::no_grad(|| forward(&self.model, &self.scopes)),
            Mode::Train => forward(&self.model, &self.scopes),
        };
        let loss_value = loss.double_value(&[]);
        if cfg.mode == Mode::Train {
            self.enter_phase(Phase::Backward);
            loss.backward();
            self.drain();
            let grads: Vec<u64> = self
                .model
                .parameters()
                .iter()
                .map(|p| p.grad())
                .filter(|g| g.defined())
                .map(|g| g.data_ptr() as u64)
                .collect();
            for g in grads {
                self.tracker.tag(g, Category::Gradient);
            }

            self.enter_phase(Phase::Optimizer);
            tch::no_grad(|| self.optim.step(&self.model.parameters()));
            self.drain();
            for s in self.optim.state_ptrs() {
                self.tracker.tag(s, Category::OptimizerState);
            }

            self.enter_phase(Phase::ZeroGrad);
            self.model.clear_grads();
        }
        self.enter_phase(Phase::Other);
        drop(loss);
        drop(tokens);
        drop(targets);
        loss_value
    }

    fn report_step(&mut self, cfg: &StepConfig, elapsed: f64, loss: f64) {
        let stats = self.tracker.take_step_stats();
        let phase_peak_bytes = Phase::ALL
            .iter()
            .filter(|p| **p != Phase::Other)
            .filter(|p| cfg.mode == Mode::Train || **p == Phase::Forward)
            .map(|p| (p.as_str().to_string(), stats.phase_peak_allocated[*p as usize]))
            .collect();
        let category_bytes = Category::ALL
            .iter()
            .map(|c| (c.as_str().to_string(), self.tracker.category_bytes[*c as usize]))
            .filter(|(_, b)| *b > 0)
            .collect();
        let r = StepReport {
            step: self.step,
            mode: cfg.mode,
            precision: cfg.precision,
            attention: cfg.attention,
            ctx: cfg.ctx,
            batch: cfg.batch,
            peak_allocated_bytes: stats.peak_allocated,
            reserved_bytes: self.tracker.reserved_bytes,
            peak_reserved_bytes: stats.peak_reserved,
            peak_active_bytes: stats.peak_active,
            phase_peak_bytes,
            category_bytes,
            live_bytes: self.tracker.active_bytes,
            step_time_s: elapsed,
            tokens_per_s: cfg.tokens() as f64 / elapsed.max(1e-9),
            loss,
            dropped_batches: self.dropped_batches,
            dropped_events: self.dropped_events,
        };
        let _ = self.rep_tx.send(Report::Step(r));
    }

    /// Cuts the snapshot here (copies, and PyTorch's own snapshot on CUDA) and converts and
    /// writes it on another thread, so the loop never waits on decoding or the disk.
    fn snapshot(&mut self) {
        self.drain();
        let base = if self.device.is_cuda() {
            match capture::cuda_snapshot_pickle() {
                Ok(b) => Some(b),
                Err(e) => {
                    let _ = self.rep_tx.send(Report::SnapshotFailed { step: self.step, error: e.to_string() });
                    return;
                }
            }
        } else {
            None
        };
        let cut = SnapshotCut::take(&self.tracker, &self.frames, base, self.epoch_us_at_zero);
        let c = &self.cfg;
        let name = format!(
            "{}_ctx{}_{}_{}_step{}.pickle",
            c.model_name, c.ctx, c.precision, c.mode, self.step
        );
        let dir = self.opts.snapshot_dir.clone();
        let step = self.step;
        let tx = self.rep_tx.clone();
        let h = std::thread::Builder::new().name("vramscope-snapshot".into()).spawn(move || {
            let path = crate::snapshot::writer::unique_path(&dir, &name);
            let r = match cut.into_snapshot().map_err(|e| format!("PyTorch's snapshot: {e}")) {
                Ok(snap) => match save_snapshot_atomic(&snap, &path) {
                    Ok(p) => Report::SnapshotSaved { step, path: p },
                    Err(e) => Report::SnapshotFailed { step, error: e.to_string() },
                },
                Err(error) => Report::SnapshotFailed { step, error },
            };
            let _ = tx.send(r);
        });
        match h {
            Ok(h) => self.writers.push(h),
            Err(e) => {
                let _ = self.rep_tx.send(Report::SnapshotFailed { step, error: e.to_string() });
            }
        }
        self.writers.retain(|h| !h.is_finished());
    }
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else {
        "unknown panic".into()
    }
}

/// CUDA's caching allocator says "out of memory"; libtorch's CPU allocator says it "can't
/// allocate memory". Both mean the step asked for more than the device has.
fn is_oom(msg: &str) -> bool {
    let m = msg.to_ascii_lowercase();
    m.contains("out of memory") || m.contains("outofmemory") || m.contains("can't allocate memory")
}

fn first_line(msg: &str) -> String {
    msg.lines().find(|l| !l.trim().is_empty()).unwrap_or(msg).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_messages_are_recognised() {
        assert!(is_oom("Torch(\"CUDA out of memory. Tried to allocate 20.00 GiB\")"));
        assert!(is_oom("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1099511627776 bytes"));
        assert!(!is_oom("shape mismatch"));
        assert_eq!(first_line("\n  CUDA out of memory.\nmore"), "CUDA out of memory.");
    }

    #[test]
    fn a_cuda_ordinal_must_be_one_this_process_sees() {
        assert!(check_cuda_ordinal(3, 8).is_ok());
        let e = check_cuda_ordinal(2, 2).unwrap_err().to_string();
        assert_eq!(e, "--device cuda:2: this machine has 2 CUDA device(s), cuda:0 to cuda:1");
        let e = check_cuda_ordinal(0, 0).unwrap_err().to_string();
        assert!(e.contains("no CUDA device") && e.contains("cuda:N"), "{e}");
    }
}
