//! Starting producers: vramscope's training engine (its own process, the only one that
//! loads libtorch) for `run` and `sweep`. The Python hook's jobs start in `app::py`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use serde::{Deserialize, Serialize};

use crate::step_config::{AutocastPolicy, DeviceChoice, StepConfig};

use super::job::{JobSource, Output};

/// What the engine process runs: handed to it as JSON on its command line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineOptions {
    pub config: StepConfig,
    pub device: DeviceChoice,
    /// Stop after this many steps (None = until told).
    pub steps: Option<u64>,
    pub seed: i64,
    /// Recording on (off only for overhead benchmarks).
    pub capture: bool,
    /// Event batches a viewer's queue holds before new ones are dropped (and counted).
    pub queue_batches: usize,
    pub snapshot_at: Vec<u64>,
    pub snapshot_dir: PathBuf,
    pub start_paused: bool,
    /// Fault injection for testing leak detection: each step's forward pass allocates this
    /// many bytes (scope `fault_injection.leak`) and keeps them for the rest of the run, the
    /// "tensor kept per step" bug. 0 (the default) injects nothing.
    pub leak_bytes_per_step: u64,
    /// The caching-allocator settings of the modelled GPU on CPU (PYTORCH_CUDA_ALLOC_CONF's
    /// form); on CUDA, PyTorch reads the variable itself.
    pub alloc_conf: String,
    /// `vramscope selftest`: the evidence file the engine writes at the end of the run (its
    /// raw events, its allocator's figures; on CUDA PyTorch's own snapshot and NVML's
    /// readings beside it). None for every other run.
    #[serde(default)]
    pub selftest: Option<PathBuf>,
    /// The selftest's forced out-of-memory: this step's forward pass asks for more memory
    /// than any device has.
    #[serde(default)]
    pub force_oom_at_step: Option<u64>,
    /// Snapshots' traces begin at this step's first phase (a sweep's measured steps, not
    /// the model's initialisation or warm-up); memory live before it is there from the start,
    /// as memory_viz shows a trace that begins mid-run.
    #[serde(default)]
    pub snapshot_trace_from_step: Option<u64>,
    /// Whose bf16 autocast policy a CPU run follows (a CUDA device runs CUDA's).
    #[serde(default)]
    pub autocast_policy: AutocastPolicy,
}

impl EngineOptions {
    pub fn new(config: StepConfig) -> Self {
        EngineOptions {
            config,
            device: DeviceChoice::Auto,
            steps: None,
            seed: 0,
            capture: true,
            queue_batches: 256,
            snapshot_at: Vec::new(),
            snapshot_dir: PathBuf::from("snapshots"),
            start_paused: false,
            leak_bytes_per_step: 0,
            alloc_conf: String::new(),
            selftest: None,
            force_oom_at_step: None,
            snapshot_trace_from_step: None,
            autocast_policy: AutocastPolicy::default(),
        }
    }
}

/// The engine binary: `VRAMSCOPE_ENGINE`, else beside this executable (or one directory up,
/// where cargo puts binaries for the tests in `deps/`).
pub fn engine_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("VRAMSCOPE_ENGINE") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    [dir.join("vramscope-engine"), dir.join("../vramscope-engine")]
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "the built-in model's training engine (vramscope-engine) is not beside {}: a source checkout builds it \
                 (scripts/run does); installed by pip, watch your own job with `vramscope py train.py`",
                exe.display()
            )
        })
}

/// A job name no other session of this user has: the viewer's pid, a counter, and what runs.
pub fn job_name(what: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let what: String = what.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '_' { c } else { '_' }).collect();
    format!("{}-{}-{what}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// Starts the engine on `opts`; it trains once this side has attached.
pub fn launch_engine(opts: &EngineOptions, output: Output) -> anyhow::Result<JobSource> {
    let mut cmd = Command::new(engine_binary()?);
    cmd.arg("--options").arg(serde_json::to_string(opts)?);
    // vramscope's own engine lives and dies with the vramscope that started it.
    cmd.env("VRAMSCOPE_PARENT_DEATH", "1");
    JobSource::launch(cmd, &job_name(&opts.config.model_name), "the training engine", output)
}
