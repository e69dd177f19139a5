//! The `vramscope` command: live screen by default, headless runs and tools as subcommands.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use vramscope_core::step_config::{
    validate_batch, validate_ctx, Attention, AutocastPolicy, Checkpointing, DeviceChoice, Mode, ModelDims, Optimizer, Precision, Preset,
    StepConfig, VOCAB_SIZE,
};
use vramscope::keys::KeyMap;
use vramscope::screens::viewer::run::RulesArg;
use vramscope::screens::live::run::{LiveOptions, Screen};
use vramscope_core::record::player::Script;
use vramscope_core::record::writer::Recorder;
use vramscope_core::source::job::Output;
use vramscope_core::source::launch::EngineOptions;
use vramscope::theme::Theme;
use vramscope::export::{self, ExportOptions};
use vramscope_core::format::parse_bytes;
use vramscope_core::report::{estimate, fit, sweep};

#[derive(Parser)]
#[command(name = "vramscope", version, about = "Watch GPU memory move while a transformer trains")]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Train and watch memory (the default): live screen, or lines with --headless.
    Run(RunArgs),
    /// Run your own PyTorch script or command with vramscope's hook and watch it live
    /// (`vramscope py train.py`, `vramscope py -- torchrun --nproc-per-node 2 train.py`).
    Py(PyCommand),
    /// Watch a job that already runs (started with `vramscope py` or
    /// `python -m vramscope_hook`); quitting leaves it running.
    Attach(AttachCommand),
    /// Device gauges for every GPU and its processes (host gauges without NVML).
    Watch(vramscope::screens::watch::run::WatchArgs),
    /// Play a recording (or a memory snapshot's trace) on the screen, or --headless.
    Replay(ReplayCommand),
    /// Open a PyTorch memory snapshot: timeline, largest allocations, segments, categories.
    View(vramscope::screens::viewer::run::ViewArgs),
    /// Compare two snapshots: peaks, categories, and the allocations that grew or shrank.
    Diff(DiffArgs),
    /// Measure every combination of the listed models, ctx, batch, precision, mode and
    /// attention, one fresh engine each: a table of peaks (OOM cells included).
    Sweep(SweepArgs),
    /// Work out a configuration's memory without running it: parameters, gradients,
    /// AdamW state, saved activations tensor by tensor, predicted peaks.
    Estimate(EstimateArgs),
    /// Draw a snapshot's active-memory timeline as an SVG or PNG.
    Export(ExportArgs),
    /// Write a write-up of snapshots into a folder: timelines, size histograms, a text
    /// report with efficiency and findings, a Markdown page each, an index for several.
    Report(ReportArgs),
    /// Replay a snapshot's trace under other allocator settings: peaks, fragmentation,
    /// and whether the request that ran out of memory would have fit.
    Whatif(vramscope_core::report::whatif::WhatifArgs),
    /// Check the capture on this machine: a few steps recorded and compared with the
    /// allocator's own figures (and PyTorch's own recorder on CUDA). Exit 1 on a mismatch.
    Selftest(vramscope_core::selftest::run::SelftestArgs),
}

#[derive(Args, Clone)]
struct ReplayCommand {
    #[command(flatten)]
    replay: vramscope::screens::replay::ReplayArgs,
    #[command(flatten)]
    screen: ScreenArgs,
}

#[derive(Args, Clone)]
struct PyCommand {
    #[command(flatten)]
    py: vramscope::py::PyArgs,
    #[command(flatten)]
    screen: ScreenArgs,
}

#[derive(Args, Clone)]
struct AttachCommand {
    #[command(flatten)]
    attach: vramscope::py::AttachArgs,
    #[command(flatten)]
    screen: ScreenArgs,
}

#[derive(Args, Clone)]
struct ScreenArgs {
    /// Colour theme: dark, light, ansi16, or a theme file's path.
    #[arg(long, default_value = "dark")]
    theme: String,
    /// A TOML file whose [keys] table overrides key bindings.
    #[arg(long)]
    keys: Option<PathBuf>,
}

#[derive(Args, Clone)]
struct DiffArgs {
    /// The baseline snapshot.
    a: PathBuf,
    /// The snapshot compared with it.
    b: PathBuf,
    /// The report as JSON.
    #[arg(long)]
    json: bool,
    /// Device whose traces to compare (default: in each file, the first with trace
    /// entries, so two DDP ranks' snapshots compare).
    #[arg(long)]
    device: Option<usize>,
    /// How many grown and shrunk allocation groups to list.
    #[arg(long, default_value_t = 10)]
    top: usize,
    #[command(flatten)]
    rules: RulesArg,
}

/// What one step runs: model size, shape, precision, mode, attention.
#[derive(Args, Clone)]
struct ShapeArgs {
    /// Model size: tiny, small, medium, large, xl, 2.7B, 10B.
    #[arg(long, default_value = "tiny", value_parser = parse_preset)]
    model: Preset,
    #[command(flatten)]
    dims: DimsArgs,
    /// Context length (tokens per sequence).
    #[arg(long, default_value_t = 256, value_parser = parse_ctx)]
    ctx: i64,
    /// Sequences per batch.
    #[arg(long, default_value_t = 4, value_parser = parse_batch)]
    batch: i64,
    /// fp32, or autocast to bf16 or fp16 (fp16 with a GradScaler, as on GPUs without bf16).
    #[arg(long, default_value = "fp32", value_parser = parse_precision)]
    precision: Precision,
    /// forward (no grad) or train (forward, backward, optimizer step, zero_grad).
    #[arg(long, default_value = "train", value_parser = parse_mode)]
    mode: Mode,
    /// naive (the CS336 reference's: materialised scores, where-mask, three-step softmax)
    /// or fused (scaled_dot_product_attention).
    #[arg(long, default_value = "naive", value_parser = parse_attention)]
    attention: Attention,
    /// reference (the CS336 reference's AdamW: new moment tensors every step) or torch
    /// (torch.optim.AdamW: moments updated in place).
    #[arg(long, default_value = "reference", value_parser = parse_optimizer)]
    optimizer: Optimizer,
    /// Activation checkpointing: none, all (every block), or every-K (blocks 0, K, 2K…);
    /// a checkpointed block keeps only its input and recomputes its forward in backward.
    #[arg(long, default_value = "none", value_parser = parse_checkpointing)]
    checkpointing: Checkpointing,
}

#[derive(Args, Clone)]
struct RunArgs {
    #[command(flatten)]
    shape: ShapeArgs,
    /// auto (the first CUDA device if present), cpu, cuda, or cuda:N for CUDA device N.
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    device: DeviceChoice,
    /// Stop after N steps (default: run until quit; 3 with --headless).
    #[arg(long)]
    steps: Option<u64>,
    /// Random seed for weights and token batches.
    #[arg(long, default_value_t = 0)]
    seed: i64,
    /// Print per-step lines instead of the live screen.
    #[arg(long)]
    headless: bool,
    /// With --headless: one JSON object per step.
    #[arg(long)]
    json: bool,
    /// With --headless: run N steps and fail if memory live at step end keeps growing
    /// (naming the phase and module that allocated it) or a step spikes.
    #[arg(long, value_name = "N", requires = "headless", conflicts_with = "steps")]
    check_growth: Option<u64>,
    /// Fault injection for testing --check-growth: keep this many bytes per step.
    #[arg(long, hide = true, default_value_t = 0)]
    inject_leak_bytes: u64,
    /// Write a snapshot after these steps (comma-separated step numbers).
    #[arg(long, value_delimiter = ',')]
    snapshot_at: Vec<u64>,
    /// Where snapshots go.
    #[arg(long, default_value = "snapshots")]
    snapshot_dir: PathBuf,
    #[command(flatten)]
    screen: ScreenArgs,
    /// Record everything the screen (or --headless) is fed into this new file.
    #[arg(long)]
    record: Option<PathBuf>,
    #[command(flatten)]
    alloc: AllocConfArgs,
    #[command(flatten)]
    policy: PolicyArgs,
    /// Serve the run's figures to Prometheus at ADDR/metrics (PORT alone: loopback).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
}

/// Whose bf16 autocast a CPU run follows.
#[derive(Args, Clone)]
struct PolicyArgs {
    /// bf16 on CPU: cuda (the modelled GPU allocates as CUDA autocast would: exp, sum,
    /// softmax, the losses in fp32) or cpu (CPU autocast's own lists, what a CPU run
    /// measures). A CUDA device always runs CUDA's.
    #[arg(long, value_name = "POLICY", default_value = "cuda", value_parser = |s: &str| s.parse::<AutocastPolicy>())]
    autocast_policy: AutocastPolicy,
}

/// The caching-allocator settings of the GPU that CPU runs model.
#[derive(Args, Clone)]
struct AllocConfArgs {
    /// PYTORCH_CUDA_ALLOC_CONF for the modelled GPU on CPU, e.g. expandable_segments:True
    /// (default: the environment's PYTORCH_CUDA_ALLOC_CONF). On CUDA, PyTorch reads the
    /// environment variable itself.
    #[arg(long, value_name = "CONF")]
    alloc_conf: Option<String>,
}

impl AllocConfArgs {
    /// The settings in force, checked: a bad value is a one-line error naming the option.
    fn resolve(&self) -> anyhow::Result<String> {
        let (conf, from) = match &self.alloc_conf {
            Some(c) => (c.clone(), "--alloc-conf"),
            None => (std::env::var("PYTORCH_CUDA_ALLOC_CONF").unwrap_or_default(), "PYTORCH_CUDA_ALLOC_CONF"),
        };
        vramscope_core::allocator::AllocatorConfig::parse_conf(&conf).map_err(|e| anyhow::anyhow!("{from}: {e}"))?;
        Ok(conf)
    }
}

#[derive(Args)]
struct SweepArgs {
    /// Model sizes (comma-separated): tiny, small, medium, large, xl, 2.7B, 10B.
    #[arg(long, default_value = "tiny", value_delimiter = ',', value_parser = parse_preset)]
    model: Vec<Preset>,
    /// Applied to every model size.
    #[command(flatten)]
    dims: DimsArgs,
    /// Context lengths (comma-separated).
    #[arg(long, default_value = "256", value_delimiter = ',', value_parser = parse_ctx)]
    ctx: Vec<i64>,
    /// Batch sizes (comma-separated).
    #[arg(long, default_value = "4", value_delimiter = ',', value_parser = parse_batch)]
    batch: Vec<i64>,
    /// Precisions (comma-separated): fp32, bf16, fp16.
    #[arg(long, default_value = "fp32", value_delimiter = ',', value_parser = parse_precision)]
    precision: Vec<Precision>,
    /// Modes (comma-separated): forward, train.
    #[arg(long, default_value = "train", value_delimiter = ',', value_parser = parse_mode)]
    mode: Vec<Mode>,
    /// Attention kinds (comma-separated): naive, fused.
    #[arg(long, default_value = "naive", value_delimiter = ',', value_parser = parse_attention)]
    attention: Vec<Attention>,
    /// Activation checkpointing (comma-separated): none, all, every-K.
    #[arg(long, default_value = "none", value_delimiter = ',', value_parser = parse_checkpointing)]
    checkpointing: Vec<Checkpointing>,
    /// AdamW's allocation pattern for every configuration: reference or torch.
    #[arg(long, default_value = "reference", value_parser = parse_optimizer)]
    optimizer: Optimizer,
    /// Unmeasured steps before measuring each configuration.
    #[arg(long, default_value_t = 1)]
    warmup: u64,
    /// Measured steps per configuration.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    steps: u64,
    /// auto (the first CUDA device if present), cpu, cuda, or cuda:N for CUDA device N.
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    device: DeviceChoice,
    #[arg(long, default_value_t = 0)]
    seed: i64,
    /// Table format: markdown, csv or json.
    #[arg(long, default_value = "markdown", value_parser = |s: &str| s.parse::<sweep::Format>())]
    format: sweep::Format,
    /// Write a snapshot of each configuration's last step into DIR.
    #[arg(long, value_name = "DIR")]
    snapshots: Option<PathBuf>,
    /// Write each configuration's timeline as a PNG into DIR (snapshots go to --snapshots,
    /// or into DIR too).
    #[arg(long, value_name = "DIR")]
    images: Option<PathBuf>,
    /// Fit peak memory against batch and ctx (linear vs quadratic, R²; memory per token).
    #[arg(long)]
    fit: bool,
    #[command(flatten)]
    alloc: AllocConfArgs,
    #[command(flatten)]
    policy: PolicyArgs,
}

#[derive(Args)]
struct EstimateArgs {
    #[command(flatten)]
    shape: ShapeArgs,
    /// Device memory to fit in, e.g. 80GiB: says whether the configuration fits and the
    /// largest ctx and batch that would.
    #[arg(long, value_parser = parse_bytes)]
    gpu_mem: Option<u64>,
    /// The estimate as JSON.
    #[arg(long)]
    json: bool,
    /// The peaks a CPU run of the engine measures (vramscope's modelled GPU): bf16 matmuls
    /// and the loss's backward there make workspace copies a GPU does not.
    #[arg(long)]
    cpu: bool,
    #[command(flatten)]
    policy: PolicyArgs,
}

#[derive(Args)]
struct ReportArgs {
    /// Snapshots, or a directory of them (rank0…N_memory_snapshot.pickle).
    #[arg(required = true, num_args = 1..)]
    snapshots: Vec<PathBuf>,
    /// The folder to write into (made when missing; nothing in it is overwritten).
    #[arg(short, long)]
    output: PathBuf,
    /// Which device of each snapshot (default: the first one with trace entries).
    #[arg(long)]
    device: Option<usize>,
    /// How many consumers at the peak to list.
    #[arg(long, default_value_t = 30)]
    top: usize,
    #[command(flatten)]
    rules: RulesArg,
}

#[derive(Args)]
struct ExportArgs {
    /// A PyTorch memory snapshot (.pickle).
    snapshot: PathBuf,
    /// The image to write: a .svg or .png path (never overwritten).
    #[arg(short, long)]
    output: PathBuf,
    /// Image width in pixels (64 to 8192).
    #[arg(long, default_value_t = 1200, value_parser = clap::value_parser!(u32).range(64..=8192))]
    width: u32,
    /// Image height in pixels (64 to 8192).
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u32).range(64..=8192))]
    height: u32,
    /// Which device's trace to draw (default: the first one with trace entries).
    #[arg(long)]
    device: Option<usize>,
    /// Caption (the peak is appended).
    #[arg(long, default_value = "Active memory timeline")]
    title: String,
    #[command(flatten)]
    rules: RulesArg,
}

fn parse_preset(s: &str) -> Result<Preset, String> {
    s.parse()
}
fn parse_precision(s: &str) -> Result<Precision, String> {
    s.parse()
}
fn parse_mode(s: &str) -> Result<Mode, String> {
    s.parse()
}
fn parse_attention(s: &str) -> Result<Attention, String> {
    s.parse()
}
fn parse_checkpointing(s: &str) -> Result<Checkpointing, String> {
    s.parse()
}
fn parse_optimizer(s: &str) -> Result<Optimizer, String> {
    s.parse()
}
fn parse_device(s: &str) -> Result<DeviceChoice, String> {
    s.parse()
}

fn parse_ctx(s: &str) -> Result<i64, String> {
    validate_ctx(s.parse::<i64>().map_err(|_| format!("--ctx must be a whole number, got '{s}'"))?)
}

fn parse_batch(s: &str) -> Result<i64, String> {
    validate_batch(s.parse::<i64>().map_err(|_| format!("--batch must be a whole number, got '{s}'"))?)
}

/// Overrides of a preset's dimensions, for a model the CS336 table does not list.
#[derive(Args, Clone)]
struct DimsArgs {
    /// Override the preset's width.
    #[arg(long)]
    d_model: Option<i64>,
    /// Override the preset's feed-forward width.
    #[arg(long)]
    d_ff: Option<i64>,
    /// Override the preset's layer count.
    #[arg(long)]
    layers: Option<i64>,
    /// Override the preset's head count.
    #[arg(long)]
    heads: Option<i64>,
}

impl DimsArgs {
    /// `preset` with the overrides, and its name: the preset's, followed by what was
    /// overridden (`small-layers8`), as tables and snapshot file names show it.
    fn apply(&self, preset: Preset) -> anyhow::Result<(String, ModelDims)> {
        let p = preset.dims();
        let dims = ModelDims {
            d_model: self.d_model.unwrap_or(p.d_model),
            d_ff: self.d_ff.unwrap_or(p.d_ff),
            layers: self.layers.unwrap_or(p.layers),
            heads: self.heads.unwrap_or(p.heads),
            vocab: VOCAB_SIZE,
        };
        anyhow::ensure!(dims.d_model > 0 && dims.d_ff > 0 && dims.layers > 0 && dims.heads > 0,
            "--d-model, --d-ff, --layers and --heads must be positive");
        anyhow::ensure!(dims.d_model % dims.heads == 0 && (dims.d_model / dims.heads) % 2 == 0,
            "--d-model ({}) must split into --heads ({}) heads of even width (RoPE rotates pairs)", dims.d_model, dims.heads);
        let mut name = preset.name().to_string();
        for (key, v) in [("dmodel", self.d_model), ("dff", self.d_ff), ("layers", self.layers), ("heads", self.heads)] {
            if let Some(v) = v {
                name += &format!("-{key}{v}");
            }
        }
        Ok((name, dims))
    }
}

impl ShapeArgs {
    fn step_config(&self) -> anyhow::Result<StepConfig> {
        let (model_name, dims) = self.dims.apply(self.model)?;
        Ok(StepConfig {
            model_name,
            dims,
            ctx: self.ctx,
            batch: self.batch,
            precision: self.precision,
            mode: self.mode,
            attention: self.attention,
            optimizer: self.optimizer,
            checkpointing: self.checkpointing,
        })
    }
}

impl RunArgs {
    fn engine_options(&self, default_steps: Option<u64>) -> anyhow::Result<EngineOptions> {
        let mut o = EngineOptions::new(self.shape.step_config()?);
        o.device = self.device;
        o.steps = self.steps.or(default_steps);
        o.seed = self.seed;
        o.snapshot_at = self.snapshot_at.clone();
        vramscope::job_env::check_snapshot_dir(&self.snapshot_dir)?;
        o.snapshot_dir = self.snapshot_dir.clone();
        o.leak_bytes_per_step = self.inject_leak_bytes;
        o.alloc_conf = self.alloc.resolve()?;
        o.autocast_policy = self.policy.autocast_policy;
        if let Some(n) = self.check_growth {
            o.steps = Some(n);
            // The check reads every event: room enough that none is dropped.
            o.queue_batches = 1 << 16;
        }
        Ok(o)
    }
}

fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    // Bound before the engine starts, so a bad address or a taken port is said first.
    let metrics = args.metrics.as_deref().map(vramscope::metrics::Metrics::serve).transpose()?;
    if args.headless {
        let opts = args.engine_options(Some(3))?;
        if let Some(last) = opts.snapshot_at.iter().filter(|s| **s >= opts.steps.unwrap_or(u64::MAX)).max() {
            anyhow::bail!("--snapshot-at {last}: the run has steps 0 to {} (steps count from 0)", opts.steps.unwrap_or(0).saturating_sub(1));
        }
        let recorder = args.record.as_deref().map(Recorder::create).transpose()?;
        let output = if args.json { Output::InheritToStderr } else { Output::Inherit };
        let source = vramscope::builtin::launch_builtin(&opts, output).context("starting the built-in model")?;
        return vramscope::headless::headless(&source, recorder, metrics.as_ref(), args.json, args.check_growth.is_some(), None);
    }
    anyhow::ensure!(!args.json, "--json needs --headless");
    let screen = args.screen.load()?;
    let engine = args.engine_options(None)?;
    vramscope::screens::live::run::run(LiveOptions { engine, screen, record: args.record, metrics })?;
    Ok(ExitCode::SUCCESS)
}

fn sweep_cmd(a: SweepArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(!(a.fit && a.format == sweep::Format::Csv), "--fit prints a second table: use --format markdown or json");
    let models = a
        .model
        .iter()
        .map(|&p| {
            let (model_name, dims) = a.dims.apply(p)?;
            Ok(StepConfig {
                model_name,
                dims,
                ctx: a.ctx[0],
                batch: a.batch[0],
                precision: a.precision[0],
                mode: a.mode[0],
                attention: a.attention[0],
                optimizer: a.optimizer,
                checkpointing: a.checkpointing[0],
            })
        })
        .collect::<anyhow::Result<Vec<StepConfig>>>()?;
    let configs = sweep::configurations(&models, &a.ctx, &a.batch, &a.precision, &a.mode, &a.attention, &a.checkpointing);
    let opts = sweep::SweepOptions {
        device: a.device,
        warmup: a.warmup,
        steps: a.steps,
        seed: a.seed,
        snapshot_dir: a.snapshots.clone().or_else(|| a.images.clone()),
        alloc_conf: a.alloc.resolve()?,
        autocast_policy: a.policy.autocast_policy,
    };
    // Drawn only when stderr is a terminal.
    let progress = indicatif::ProgressBar::new(configs.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} configurations, {elapsed} ({eta} left) {msg}")
            .expect("the progress template parses"),
    );
    let rows = sweep::sweep(&configs, &opts, &progress);
    progress.finish_and_clear();
    if let Some(dir) = &a.images {
        for r in &rows {
            let Some(snap_path) = &r.snapshot else { continue };
            let snap = vramscope_core::snapshot::read_snapshot_file(snap_path).with_context(|| vramscope_core::input::shown(snap_path))?;
            let stem = snap_path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let c = &r.config;
            let o = ExportOptions {
                title: format!("{} ctx {} batch {} {} {} {} attention, {}", c.model_name, c.ctx, c.batch, c.precision, c.mode, c.attention, c.checkpointing.label()),
                ..ExportOptions::default()
            };
            let path = vramscope_core::snapshot::unique_path(dir, &format!("{stem}.png"));
            export::export(&snap, &path, &o)?;
        }
    }
    let fits = if a.fit { fit::fits(&rows) } else { Vec::new() };
    print!("{}", sweep::render(&rows, &fits, a.format));
    Ok(ExitCode::SUCCESS)
}

fn estimate_cmd(a: EstimateArgs) -> anyhow::Result<ExitCode> {
    let cfg = a.shape.step_config()?;
    let policy = a.policy.autocast_policy;
    anyhow::ensure!(a.cpu || policy == AutocastPolicy::Cuda, "--autocast-policy cpu is what a CPU run measures: add --cpu (a GPU runs CUDA's policy)");
    let e = estimate::estimate_on(&cfg, estimate::Target { cpu: a.cpu, autocast_policy: policy });
    let fit = a.gpu_mem.map(|b| estimate::fit_in(&cfg, b));
    if a.json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "estimate": e, "fit": fit }))?);
    } else {
        print!("{}", estimate::render(&e, fit.as_ref()));
    }
    Ok(ExitCode::SUCCESS)
}

fn export_cmd(a: ExportArgs) -> anyhow::Result<ExitCode> {
    let (snap, device) = vramscope_core::snapshot::read_device(&a.snapshot, a.device, &a.rules.load()?)?;
    let o = ExportOptions { width: a.width, height: a.height, device, title: a.title };
    let path = export::export(&snap, &a.output, &o)?;
    println!("wrote {}", path.display());
    Ok(ExitCode::SUCCESS)
}

fn report_cmd(a: ReportArgs) -> anyhow::Result<ExitCode> {
    let files = vramscope_core::report::snapshot_set::snapshot_files(&a.snapshots)?.unwrap_or_else(|| a.snapshots.clone());
    let rules = a.rules.load()?;
    let first = vramscope::writeup::write_report(&files, &a.output, &vramscope::writeup::Options { device: a.device, rules: &rules, top: a.top })?;
    println!("wrote {} (open {})", a.output.display(), first.display());
    Ok(ExitCode::SUCCESS)
}

fn replay(args: ReplayCommand) -> anyhow::Result<()> {
    let r = args.replay;
    let mut script = Script::open_at(&r.file, r.device)?;
    if r.headless {
        return vramscope::screens::replay::run_replay_headless(&mut script, r.json, &mut std::io::stdout().lock());
    }
    anyhow::ensure!(!r.json, "--json needs --headless");
    vramscope::screens::replay::run_replay(script, r.speed, args.screen.load()?)
}

impl ScreenArgs {
    fn load(&self) -> anyhow::Result<Screen> {
        Ok(Screen { keys: KeyMap::load(self.keys.as_deref())?, themes: Theme::cycle(&self.theme)? })
    }
}

fn diff(args: DiffArgs) -> anyhow::Result<()> {
    use vramscope::screens::viewer::data::ViewerData;
    let rules = args.rules.load()?;
    let a = ViewerData::open(&args.a, args.device, &rules)?;
    let b = ViewerData::open(&args.b, args.device, &rules)?;
    let d = vramscope_core::report::diff::diff((&a.snap, &a.tl, a.device), (&b.snap, &b.tl, b.device), args.top);
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &d)?;
        std::io::Write::write_all(&mut out, b"\n")?;
    } else {
        vramscope_core::report::diff::write_text(&mut out, &a.name, &b.name, &d)?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Run(a)) => run(a),
        Some(Command::Py(a)) => {
            let screen = if a.py.headless { None } else { Some(a.screen.load()) }.transpose();
            screen.and_then(|s| vramscope::py::run_py(a.py, s))
        }
        Some(Command::Attach(a)) => {
            let screen = if a.attach.headless { None } else { Some(a.screen.load()) }.transpose();
            screen.and_then(|s| vramscope::py::run_attach(a.attach, s))
        }
        Some(Command::Watch(a)) => vramscope::screens::watch::run::run_watch(a).map(|()| ExitCode::SUCCESS),
        Some(Command::Replay(a)) => replay(a).map(|()| ExitCode::SUCCESS),
        Some(Command::View(a)) => vramscope::screens::viewer::run::run_view(a).map(|()| ExitCode::SUCCESS),
        Some(Command::Diff(a)) => diff(a).map(|()| ExitCode::SUCCESS),
        Some(Command::Sweep(a)) => sweep_cmd(a),
        Some(Command::Estimate(a)) => estimate_cmd(a),
        Some(Command::Export(a)) => export_cmd(a),
        Some(Command::Report(a)) => report_cmd(a),
        Some(Command::Whatif(a)) => vramscope_core::report::whatif::run(a).map(|()| ExitCode::SUCCESS),
        Some(Command::Selftest(a)) => vramscope_core::selftest::run::run(a),
        None => run(cli.run),
    };
    match result {
        Ok(code) => code,
        // The reader went away (`vramscope … | head`): that is where output ends, not an error.
        Err(e) if e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)) => {
            ExitCode::SUCCESS
        }
        // Said already, line by line, as it happened.
        Err(e) if e.downcast_ref::<vramscope_core::report::headless::Failed>().is_some() => ExitCode::from(2),
        Err(e) => {
            eprintln!("vramscope: {e:#}");
            ExitCode::from(2)
        }
    }
}
