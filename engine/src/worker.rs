//! The training loop. It owns libtorch: builds the model, runs steps, and hosts the
//! producer session that turns what the shim captures into vramscope's stream: phases at
//! each boundary, names of parameters, gradients and AdamW state, knob changes and
//! snapshots between steps.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tch::{Device, Kind, Tensor};

use vramscope_core::allocator::AllocatorConfig;
use vramscope_core::event::{Category, Phase};
use vramscope_core::producer::scopes::Scopes;
use vramscope_core::producer::session::{between_steps, lock, Capture, Flusher, Boundary, Session, SessionOptions, Shared, StepEnd};
use vramscope_core::producer::server::Server;
use vramscope_core::producer::tracker::Backend;
use vramscope_core::snapshot::model::Frame;
use vramscope_core::source::launch::EngineOptions;
use vramscope_core::step_config::{AutocastPolicy, Checkpointing, DeviceChoice, Mode, Precision, StepConfig};
use vramscope_core::selftest::evidence::OomFigures;
use vramscope_core::stream::EngineInfo;

use crate::capture::{self, Shim};
use crate::selftest::{self, Recorder};
use crate::model::TransformerLm;
use crate::optim::AdamW;
use crate::scaler::GradScaler;

/// Unwinds out of a step when a stop was asked for, so quitting never waits for the step.
struct StopRequested;

thread_local! {
    /// A step is running: its panics (tch's errors, an OOM) are caught and reported.
    static IN_STEP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Keeps the panics a step catches (tch reports libtorch errors by panicking) off the
/// terminal: they reach the viewer as the step's error. Any other panic is a bug, printed.
pub fn quiet_step_panics() {
    let inner = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !IN_STEP.with(|s| s.get()) {
            inner(info);
        }
    }));
}

pub fn resolve_device(choice: DeviceChoice) -> anyhow::Result<Device> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Cuda(n) => {
            let count = if tch::Cuda::is_available() { tch::Cuda::device_count() } else { 0 };
            check_cuda_ordinal(n, count)?;
            anyhow::ensure!(capture::cuda_compiled(), "--device cuda:{n}: {NO_CUDA_CAPTURE} (or train on --device cpu)");
            Ok(Device::Cuda(n as usize))
        }
        // A GPU whose memory this build cannot follow is not used: the CPU trains, and the
        // header says why (see Worker::new).
        DeviceChoice::Auto if !capture::cuda_compiled() => Ok(Device::Cpu),
        DeviceChoice::Auto => Ok(Device::cuda_if_available()),
    }
}

/// Why a build cannot follow a GPU's memory.
const NO_CUDA_CAPTURE: &str = "this vramscope was built without the CUDA capture (no CUDA headers at build time: pip install nvidia-cuda-runtime nvidia-cuda-crt into the torch venv, or set CUDA_HOME, and rebuild)";

/// That CUDA device `n` is one of the `count` this process sees.
fn check_cuda_ordinal(n: u8, count: i64) -> anyhow::Result<()> {
    match count {
        0 => anyhow::bail!("--device cuda:{n}: no CUDA device is available here (allowed: {})", DeviceChoice::NAMES),
        c if i64::from(n) >= c => anyhow::bail!("--device cuda:{n}: this machine has {c} CUDA device(s), cuda:0 to cuda:{}", c - 1),
        _ => Ok(()),
    }
}

pub struct Worker {
    opts: EngineOptions,
    cfg: StepConfig,
    device: Device,
    model: TransformerLm,
    optim: AdamW,
    /// fp16's loss scaling, from the first fp16 training step on.
    scaler: GradScaler,
    scopes: Arc<Scopes>,
    session: Shared,
    /// A viewer asked to stop (or SIGTERM came): checked at every phase boundary.
    stop: Arc<AtomicBool>,
    /// What `leak_bytes_per_step` kept.
    leaked: Vec<Tensor>,
    /// `vramscope selftest`: the evidence being kept, and how the forced OOM went.
    selftest: Option<Recorder>,
    forced_oom: Option<OomFigures>,
}

/// What the selftest's forced OOM asks for: 64 TiB, more than any device (or a 47-bit
/// address space) holds.
const FORCED_OOM_BYTES: i64 = 1 << 46;

/// What must work before training can start: the device, the allocator settings, the
/// capture hooks. Its failures are the run's own (a bad flag), said to the viewer.
pub struct Setup {
    device: Device,
    backend: Backend,
    /// The selftest's fault, checked before training starts.
    fault: Option<selftest::Fault>,
}

pub fn setup(opts: &EngineOptions) -> anyhow::Result<Setup> {
    let device = resolve_device(opts.device)?;
    capture::set_capture_enabled(opts.capture);
    let fault = if opts.selftest.is_some() { selftest::Fault::from_env()? } else { None };
    let backend = match device {
        Device::Cuda(n) => {
            // The caching allocator's per-device allocators exist only after lazy CUDA init,
            // and trackers attached before it see nothing. The CPU wrapper stays out: CPU
            // tensors are not device memory.
            capture::cuda_init()?;
            capture::cuda_attach()?;
            // The selftest has PyTorch keep its own trace too, from the same moment.
            if opts.selftest.is_some() {
                capture::cuda_record_history(vramscope_core::producer::tracker::RING_ENTRIES as i64)?;
            }
            Backend::Cuda { device: n as u8 }
        }
        _ => {
            let alloc = AllocatorConfig::parse_conf(&opts.alloc_conf).map_err(|e| anyhow::anyhow!("--alloc-conf: {e}"))?;
            // Before any tensor exists, so every free is seen.
            capture::install_cpu_allocator()?;
            capture::cuda_autocast_policy_on_cpu(opts.autocast_policy == AutocastPolicy::Cuda);
            Backend::Modelled(Box::new(vramscope_core::allocator::CachingAllocatorModel::new(alloc)))
        }
    };
    capture::discard_pending();
    Ok(Setup { device, backend, fault })
}

impl Worker {
    /// Builds the model and the session on `server`.
    pub fn new(opts: EngineOptions, setup: Setup, server: Server, stop: Arc<AtomicBool>, log: vramscope_core::producer::server::Log) -> Worker {
        let Setup { device, backend, fault } = setup;
        let cuda = device.is_cuda();
        let note = (!cuda).then(|| {
            if capture::cuda_compiled() || !tch::Cuda::is_available() {
                "no CUDA device found: training on CPU, GPU memory modelled from CPU allocations".to_string()
            } else {
                format!("a GPU is here, but {NO_CUDA_CAPTURE}: training on CPU, GPU memory modelled")
            }
        });
        let cfg = opts.config.clone();
        let info = EngineInfo {
            device: match device {
                Device::Cuda(n) => format!("cuda:{n}"),
                _ => "cpu".into(),
            },
            cuda,
            parameters: 0,
            config: Some(cfg.clone()),
            note,
            name: cfg.model_name.clone(),
            pid: std::process::id(),
            rank: None,
            world_size: None,
            host: vramscope_core::producer::host_name(),
            knobs: cfg.knobs(),
            clock_zero_ns: capture::clock_zero_ns(),
            alloc_conf: if cuda { std::env::var("PYTORCH_CUDA_ALLOC_CONF").unwrap_or_default() } else { opts.alloc_conf.clone() },
            pci_bus_id: None,
            autocast: Some(if cuda { AutocastPolicy::Cuda } else { opts.autocast_policy }),
        };
        let scopes = Arc::new(Scopes::new(Box::new(capture::set_scope)));
        let runner = Frame { name: "vramscope-engine step".into(), filename: "engine/src/worker.rs".into(), line: 0 };
        let (capture, selftest): (Box<dyn Capture>, Option<Recorder>) = match opts.selftest {
            Some(_) => {
                let cuda = match device {
                    Device::Cuda(n) => {
                        // The CUDA context up before NVML's baseline, which counts it.
                        tch::Cuda::synchronize(n as i64);
                        Some(n as u8)
                    }
                    _ => None,
                };
                let (shim, recorder) = selftest::recording(fault, cuda);
                (Box::new(shim), Some(recorder))
            }
            None => (Box::new(Shim), None),
        };
        let session = Session::new(
            capture,
            scopes.clone(),
            server,
            SessionOptions {
                info,
                backend,
                snapshot_dir: opts.snapshot_dir.clone(),
                runner_frame: runner,
                start_paused: opts.start_paused,
                // The vramscope that started the engine is its viewer: nothing to announce.
                announce_viewers: std::env::var_os("VRAMSCOPE_WAIT_FOR_VIEWER").is_none(),
                snapshot_trace_from_step: opts.snapshot_trace_from_step,
            },
            log,
        );
        let session = Arc::new(Mutex::new(session));
        if opts.selftest.is_some() {
            // The selftest's viewer must hear every event from the first, so it is let in
            // before the model exists (others are let in with the live allocations at start).
            lock(&session).flush();
        }
        tch::manual_seed(opts.seed);
        lock(&session).capture_tags(0, Phase::Other);
        let model = TransformerLm::new(cfg.dims, cfg.ctx, device, &scopes);
        let w = Worker { optim: AdamW::new(1e-3, 0.9, 0.999, 1e-8, 0.01), scaler: GradScaler::default(), cfg, device, model, scopes, session, stop, leaked: Vec::new(), selftest, forced_oom: None, opts };
        {
            let mut s = lock(&w.session);
            s.drain();
            for (name, p) in w.model.named_parameters() {
                s.tag(p.data_ptr() as u64, Category::Parameter, Some(&name));
            }
            s.start(w.model.parameter_count());
        }
        // A failed allocation is snapshotted before its error unwinds the step.
        let oom_session = Arc::downgrade(&w.session);
        capture::set_oom_handler(Box::new(move |_device, _requested| {
            if let Some(s) = oom_session.upgrade() {
                let mut s = lock(&s);
                let name = format!("{}_step{}_oom.pickle", s.info().name, s.step);
                let path = s.snapshot_now(&name);
                s.set_oom_snapshot(path);
            }
        }));
        w
    }

    pub fn run(&mut self) {
        let flusher = Flusher::spawn(&self.session);
        loop {
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            let session = self.session.clone();
            let boundary = between_steps(&session, &mut |name, value| self.apply_knob(name, value));
            if boundary == Boundary::Stop || self.stop.load(Ordering::SeqCst) {
                break;
            }
            let step = lock(&self.session).step;
            if self.opts.steps.is_some_and(|n| step >= n) {
                break;
            }
            self.run_step();
            let wanted = lock(&self.session).take_snapshot_request();
            if self.opts.snapshot_at.contains(&step) || wanted {
                self.snapshot();
            }
            lock(&self.session).step += 1;
        }
        // A snapshot asked for before the stop is still written.
        if lock(&self.session).take_snapshot_request() {
            self.snapshot();
        }
        drop(flusher);
        if let (Some(recorder), Some(path)) = (&self.selftest, &self.opts.selftest) {
            let dir = path.parent().unwrap_or(std::path::Path::new("."));
            let evidence = recorder.gather(&mut lock(&self.session), self.forced_oom.take(), dir);
            if let Err(e) = selftest::write(path, &evidence) {
                lock(&self.session).report(vramscope_core::stream::Report::Error(format!("selftest evidence: {e:#}")));
            }
        }
        lock(&self.session).finish();
    }

    fn snapshot(&mut self) {
        let c = &self.cfg;
        let step = lock(&self.session).step;
        let name = format!("{}_ctx{}_{}_{}_{}_{}_step{step}.pickle", c.model_name, c.ctx, c.precision, c.mode, c.attention, c.optimizer);
        lock(&self.session).snapshot(&name);
    }

    /// A viewer's knob change: the value now in force, or why not.
    fn apply_knob(&mut self, name: &str, value: &str) -> Result<String, String> {
        let c = &mut self.cfg;
        vramscope_core::step_config::apply_knob(c, name, value)?;
        Ok(c.knobs().into_iter().find(|k| k.name == name).map(|k| k.value).unwrap_or_default())
    }

    /// A phase boundary inside a step: where a requested stop ends the step early.
    fn enter_phase(&mut self, phase: Phase) {
        if self.stop.load(Ordering::SeqCst) {
            std::panic::resume_unwind(Box::new(StopRequested));
        }
        lock(&self.session).set_phase(phase);
    }

    fn run_step(&mut self) {
        let cfg = self.cfg.clone();
        let started = Instant::now();
        IN_STEP.with(|s| s.set(true));
        let outcome = catch_unwind(AssertUnwindSafe(|| self.step_inner(&cfg)));
        IN_STEP.with(|s| s.set(false));
        let elapsed = started.elapsed().as_secs_f64();
        match outcome {
            Ok(loss) => {
                let end = StepEnd {
                    loss: Some(loss),
                    elapsed_s: elapsed,
                    mode: cfg.mode,
                    precision: cfg.precision,
                    attention: Some(cfg.attention),
                    checkpointing: Some(cfg.checkpointing),
                    ctx: cfg.ctx,
                    batch: cfg.batch,
                };
                lock(&self.session).end_step(&end);
            }
            Err(panic) if panic.is::<StopRequested>() => {
                lock(&self.session).capture_tags(0, Phase::Other);
                self.model.clear_grads();
            }
            Err(panic) => {
                let msg = panic_message(&panic);
                if let Some(f) = self.forced_oom.as_mut().filter(|f| f.error.is_none()) {
                    f.error = Some(first_line(&msg));
                }
                // Whatever the failed step held was dropped during unwinding.
                if self.device.is_cuda() {
                    let _ = capture::cuda_empty_cache();
                }
                self.model.clear_grads();
                lock(&self.session).fail_step(&first_line(&msg), is_oom(&msg));
            }
        }
    }

    fn step_inner(&mut self, cfg: &StepConfig) -> f64 {
        self.enter_phase(Phase::Other);
        self.model.prepare(cfg.ctx, &self.scopes);
        let shape = [cfg.batch, cfg.ctx];
        let tokens = Tensor::randint(cfg.dims.vocab, shape, (Kind::Int64, self.device));
        let targets = Tensor::randint(cfg.dims.vocab, shape, (Kind::Int64, self.device));
        {
            let mut s = lock(&self.session);
            s.drain();
            s.tag(tokens.data_ptr() as u64, Category::Input, Some("tokens"));
            s.tag(targets.data_ptr() as u64, Category::Input, Some("targets"));
        }
        let cuda = self.device.is_cuda();
        let (half, fp16) = (cfg.precision.is_autocast(), cfg.precision == Precision::Fp16);

        self.enter_phase(Phase::Forward);
        let step = lock(&self.session).step;
        if self.opts.force_oom_at_step == Some(step) {
            self.forced_oom = Some(OomFigures { step, requested: FORCED_OOM_BYTES as u64, error: None });
            let _doomed = Tensor::empty([FORCED_OOM_BYTES / 4], (Kind::Float, self.device));
        }
        if self.opts.leak_bytes_per_step > 0 {
            let _s = self.scopes.enter(self.scopes.intern("fault_injection.leak"));
            let n = self.opts.leak_bytes_per_step.div_ceil(4) as i64;
            self.leaked.push(Tensor::zeros([n], (Kind::Float, self.device)));
        }
        // As `loss = cross_entropy(model(tokens), targets)` under autocast: the logits die
        // with the expression, before the region's weight copies are released.
        let autocast = |on: bool| {
            if half {
                capture::autocast(cuda, on, fp16).expect("autocast on or off");
            }
        };
        let forward = |model: &TransformerLm, scopes: &Scopes, checkpointing: Checkpointing| {
            autocast(true);
            let (logits, checkpointed) = model.forward(&tokens, cfg.attention, checkpointing, scopes);
            let loss = crate::model::cross_entropy(&logits, &targets);
            drop(logits);
            autocast(false);
            (loss, checkpointed)
        };
        // Without grad there is nothing to checkpoint.
        let (mut loss, checkpointed) = match cfg.mode {
            Mode::Forward => tch::no_grad(|| forward(&self.model, &self.scopes, Checkpointing::None)),
            Mode::Train => forward(&self.model, &self.scopes, cfg.checkpointing),
        };
        let loss_value = loss.double_value(&[]);
        if cfg.mode == Mode::Train {
            // `scaler.scale(loss).backward()` under fp16: the scaled loss, made before
            // backward begins, dies after it.
            let scaled = fp16.then(|| self.scaler.scale(&loss, self.device));
            if let Some((scale, growth)) = self.scaler.tensors().filter(|_| fp16) {
                let mut s = lock(&self.session);
                s.drain();
                s.tag(scale.data_ptr() as u64, Category::OptimizerState, Some("GradScaler._scale"));
                s.tag(growth.data_ptr() as u64, Category::OptimizerState, Some("GradScaler._growth_tracker"));
            }
            self.enter_phase(Phase::Backward);
            // `loss.backward()`: its gradient (ones) lives until the whole backward is done,
            // checkpointed blocks included, as torch's does.
            let target = scaled.as_ref().unwrap_or(&loss);
            let ones = target.ones_like();
            capture::backward(target.shallow_clone(), ones.shallow_clone()).expect("backward");
            drop(scaled);
            // Let go of the graph, which holds the checkpointed blocks' outputs (autograd's
            // leaves), so each is freed once backward no longer needs it.
            loss = loss.detach();
            self.model.backward_checkpointed(checkpointed, cfg.attention, &self.scopes, &autocast).expect("backward through the checkpointed blocks");
            drop(ones);
            {
                let mut s = lock(&self.session);
                s.drain();
                for (name, p) in self.model.named_parameters() {
                    let g = p.grad();
                    if g.defined() {
                        s.tag(g.data_ptr() as u64, Category::Gradient, Some(&format!("grad of {name}")));
                    }
                }
            }

            self.enter_phase(Phase::Optimizer);
            if fp16 {
                // `scaler.step(optimizer)`, `scaler.update()`: the step is skipped where a
                // gradient overflowed, as PyTorch's is.
                let (optim, model) = (&mut self.optim, &self.model);
                let grads: Vec<Tensor> = model.parameters().iter().map(|p| p.grad()).filter(Tensor::defined).collect();
                let stepped = tch::no_grad(|| self.scaler.step_and_update(&grads, || optim.step(&model.parameters(), cfg.optimizer)));
                if !stepped {
                    let scale = self.scaler.tensors().map_or(0.0, |(s, _)| s.double_value(&[]));
                    let note = format!("step {step}: GradScaler skipped the optimizer step (a gradient overflowed in fp16); its scale backs off to {scale}");
                    lock(&self.session).report(vramscope_core::stream::Report::Note(note));
                }
            } else {
                tch::no_grad(|| self.optim.step(&self.model.parameters(), cfg.optimizer));
            }
            {
                let mut s = lock(&self.session);
                s.drain();
                let names: Vec<String> = self.model.named_parameters().into_iter().map(|(n, _)| n).collect();
                for (i, m, v) in self.optim.state_ptrs() {
                    let name = names.get(i).map(String::as_str).unwrap_or("?");
                    s.tag(m, Category::OptimizerState, Some(&format!("exp_avg of {name}")));
                    s.tag(v, Category::OptimizerState, Some(&format!("exp_avg_sq of {name}")));
                }
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

/// What a failed step says, in one line: libtorch's message without tch's wrapping
/// (`called Result::unwrap() on an Err value: Torch("…")`, escaped newlines), its C++
/// backtrace or its enforce prefix.
fn first_line(msg: &str) -> String {
    let msg = msg.replace("\\n", "\n");
    let line = msg.lines().find(|l| !l.trim().is_empty()).unwrap_or(&msg).trim();
    let line = line.strip_prefix("called `Result::unwrap()` on an `Err` value: ").unwrap_or(line);
    let line = line.strip_prefix("Torch(\"").unwrap_or(line);
    let line = line.strip_suffix("\")").unwrap_or(line);
    let line = match line.strip_prefix("[enforce fail at ").and_then(|r| r.split_once("] ")) {
        Some((_, rest)) => rest.strip_prefix("err == 0. ").unwrap_or(rest),
        None => line,
    };
    line.trim().to_string()
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
        let tch = r#"called `Result::unwrap()` on an `Err` value: Torch("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 274877906944 bytes. Error code 12 (Cannot allocate memory)\nframe #0: c10::ThrowEnforceNotMet(char const*, int)\n")"#;
        assert_eq!(
            first_line(tch),
            "DefaultCPUAllocator: can't allocate memory: you tried to allocate 274877906944 bytes. Error code 12 (Cannot allocate memory)"
        );
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
