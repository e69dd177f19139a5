//! The `vramscope` command: live screen by default, headless runs and tools as subcommands.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use vramscope::train::config::{
    validate_batch, validate_ctx, Attention, DeviceChoice, Mode, ModelDims, Precision, Preset,
    StepConfig, VOCAB_SIZE,
};
use vramscope::app::keys::KeyMap;
use vramscope::app::live::{LiveOptions, Screen};
use vramscope::record::player::Script;
use vramscope::record::writer::Recorder;
use vramscope::source::feed::engine_items;
use vramscope::render::theme::{ColorSupport, Theme, BUILTIN};
use vramscope::train::engine::{Engine, EngineOptions};

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
    /// Device gauges for every GPU and its processes (host gauges without NVML).
    Watch(vramscope::app::watch::WatchArgs),
    /// Play a recording (or a memory snapshot's trace) on the screen, or --headless.
    Replay(ReplayCommand),
    /// Open a PyTorch memory snapshot: timeline, largest allocations, segments, categories.
    View(vramscope::app::snapshot_viewer::ViewArgs),
    /// Compare two snapshots: peaks, categories, and the allocations that grew or shrank.
    Diff(DiffArgs),
}

#[derive(Args, Clone)]
struct ReplayCommand {
    #[command(flatten)]
    replay: vramscope::app::replay::ReplayArgs,
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
    /// Device whose traces to compare.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// How many grown and shrunk allocation groups to list.
    #[arg(long, default_value_t = 10)]
    top: usize,
}

#[derive(Args, Clone)]
struct RunArgs {
    /// Model size: tiny, small, medium, large, xl, 2.7B, 10B.
    #[arg(long, default_value = "tiny", value_parser = |s: &str| s.parse::<Preset>())]
    model: Preset,
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
    /// Context length (tokens per sequence).
    #[arg(long, default_value_t = 256, value_parser = parse_ctx)]
    ctx: i64,
    /// Sequences per batch.
    #[arg(long, default_value_t = 4, value_parser = parse_batch)]
    batch: i64,
    /// fp32 or bf16 (autocast).
    #[arg(long, default_value = "fp32", value_parser = |s: &str| s.parse::<Precision>())]
    precision: Precision,
    /// forward (no grad) or train (forward, backward, optimizer step, zero_grad).
    #[arg(long, default_value = "train", value_parser = |s: &str| s.parse::<Mode>())]
    mode: Mode,
    /// naive (materialised scores, as CS336) or fused (scaled_dot_product_attention).
    #[arg(long, default_value = "naive", value_parser = |s: &str| s.parse::<Attention>())]
    attention: Attention,
    /// auto (CUDA if present), cpu or cuda.
    #[arg(long, default_value = "auto", value_parser = |s: &str| s.parse::<DeviceChoice>())]
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
}

fn parse_ctx(s: &str) -> Result<i64, String> {
    validate_ctx(s.parse::<i64>().map_err(|_| format!("--ctx must be a whole number, got '{s}'"))?)
}

fn parse_batch(s: &str) -> Result<i64, String> {
    validate_batch(s.parse::<i64>().map_err(|_| format!("--batch must be a whole number, got '{s}'"))?)
}

impl RunArgs {
    fn step_config(&self) -> anyhow::Result<StepConfig> {
        let p = self.model.dims();
        let custom = self.d_model.is_some() || self.d_ff.is_some() || self.layers.is_some() || self.heads.is_some();
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
        Ok(StepConfig {
            model_name: if custom { "custom".into() } else { self.model.name().into() },
            dims,
            ctx: self.ctx,
            batch: self.batch,
            precision: self.precision,
            mode: self.mode,
            attention: self.attention,
        })
    }

    fn engine_options(&self, default_steps: Option<u64>) -> anyhow::Result<EngineOptions> {
        let mut o = EngineOptions::new(self.step_config()?);
        o.device = self.device;
        o.steps = self.steps.or(default_steps);
        o.seed = self.seed;
        o.snapshot_at = self.snapshot_at.clone();
        o.snapshot_dir = self.snapshot_dir.clone();
        Ok(o)
    }
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    if args.headless {
        let opts = args.engine_options(Some(3))?;
        let mut recorder = args.record.as_deref().map(Recorder::create).transpose()?;
        let mut engine = Engine::spawn(opts).context("starting the training engine")?;
        let mut out = std::io::stdout().lock();
        let items = engine_items(&engine);
        match &mut recorder {
            Some(r) => vramscope::report::headless::run(r.tee(items), args.json, &mut out)?,
            None => vramscope::report::headless::run(items, args.json, &mut out)?,
        };
        engine.shutdown();
        if let Some(r) = recorder {
            let s = r.finish()?;
            eprintln!("vramscope: recording saved: {} ({} events, {} bytes)", s.path.display(), s.events, s.bytes);
        }
        return Ok(());
    }
    anyhow::ensure!(!args.json, "--json needs --headless");
    let screen = args.screen.load()?;
    let engine = args.engine_options(None)?;
    vramscope::app::live::run(LiveOptions { engine, screen, record: args.record })
}

fn replay(args: ReplayCommand) -> anyhow::Result<()> {
    let r = args.replay;
    let script = Script::open(&r.file)?;
    if r.headless {
        return vramscope::app::replay::run_replay_headless(&script, r.json, &mut std::io::stdout().lock());
    }
    anyhow::ensure!(!r.json, "--json needs --headless");
    vramscope::app::replay::run_replay(script, r.speed, args.screen.load()?)
}

impl ScreenArgs {
    fn load(&self) -> anyhow::Result<Screen> {
        let keys = match &self.keys {
            Some(p) => {
                let text = std::fs::read_to_string(p).with_context(|| format!("reading key file {}", p.display()))?;
                KeyMap::from_toml(&text).with_context(|| p.display().to_string())?
            }
            None => KeyMap::default(),
        };
        let support = ColorSupport::detect();
        let mut themes = vec![Theme::load(&self.theme)?.adapted(support)];
        for (name, _) in BUILTIN {
            if name != self.theme {
                themes.push(Theme::load(name)?.adapted(support));
            }
        }
        Ok(Screen { keys, themes })
    }
}

fn diff(args: DiffArgs) -> anyhow::Result<()> {
    use vramscope::app::snapshot_viewer::ViewerData;
    let a = ViewerData::open(&args.a, args.device)?;
    let b = ViewerData::open(&args.b, args.device)?;
    let d = vramscope::report::diff::diff((&a.snap, &a.tl), (&b.snap, &b.tl), args.device, args.top);
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &d)?;
        std::io::Write::write_all(&mut out, b"\n")?;
    } else {
        vramscope::report::diff::write_text(&mut out, &a.name, &b.name, &d)?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    vramscope::train::engine::install_panic_filter();
    let result = match cli.command {
        Some(Command::Run(a)) => run(a),
        Some(Command::Watch(a)) => vramscope::app::watch::run_watch(a),
        Some(Command::Replay(a)) => replay(a),
        Some(Command::View(a)) => vramscope::app::snapshot_viewer::run_view(a),
        Some(Command::Diff(a)) => diff(a),
        None => run(cli.run),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vramscope: {e:#}");
            ExitCode::from(2)
        }
    }
}
