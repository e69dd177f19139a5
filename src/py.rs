//! `vramscope py` (run a user's PyTorch script or command with the hook and watch it) and
//! `vramscope attach` (watch a job that already runs). Both read the same stream as `run`;
//! only the producer differs.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;


use vramscope_core::channel::{token, Endpoint};
use crate::metrics::Metrics;
use vramscope_core::record::writer::Recorder;
use vramscope_core::source::job::{list_jobs, JobSource, Output};
use vramscope_core::source::launch::job_name;
use vramscope_core::store::ranks::Ranks;
use vramscope_core::step_config::AutocastPolicy;

use crate::headless::headless;
use crate::job_env::{self, HookSettings};
use crate::screens::live::run::{watch, JobKind, Screen, HISTORY_CAP};

#[derive(clap::Args, Clone)]
#[command(after_help = "Examples:\n  vramscope py train.py --lr 3e-4\n  vramscope py -- torchrun --nproc-per-node 2 train.py\n  vramscope py --headless --json train.py")]
pub struct PyArgs {
    /// Python for a script (default: the active virtualenv's, else vramscope's project
    /// .venv, else python3).
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// Print per-step lines (the job's own output passes through) instead of the screen.
    #[arg(long)]
    pub headless: bool,
    /// With --headless: one JSON object per step, with its rank.
    #[arg(long, requires = "headless")]
    pub json: bool,
    /// With --headless: fail if memory live at step end keeps growing, or a step spikes.
    #[arg(long, requires = "headless")]
    pub check_growth: bool,
    /// Where the job's snapshots go (its `s` key, OOMs).
    #[arg(long, default_value = "snapshots")]
    pub snapshot_dir: PathBuf,
    /// Record everything the screen (or --headless) is fed into this new file.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Which device the hook watches: auto (the default: the CUDA device the job allocates
    /// on once it initialises CUDA, else its CPU tensors, modelled as a GPU), cpu (model the
    /// CPU tensors whatever the job does), or cuda:N (only that CUDA device).
    #[arg(long, value_parser = parse_device)]
    pub device: Option<String>,
    /// Start the job's model forward (and its loss) under bf16 or fp16 autocast, or not; `p`
    /// switches between steps. A script that runs its own autocast, or declares a
    /// `precision` knob, chooses for itself.
    #[arg(long, value_parser = ["fp32", "bf16", "fp16"])]
    pub precision: Option<String>,
    /// PYTORCH_CUDA_ALLOC_CONF for the job (on CPU, the modelled GPU's settings).
    #[arg(long, value_name = "CONF")]
    pub alloc_conf: Option<String>,
    /// bf16 on CPU: cuda (the job's CPU autocast regions allocate as CUDA autocast would,
    /// for the modelled GPU) or cpu (CPU autocast's own lists). CUDA jobs run CUDA's.
    #[arg(long, value_name = "POLICY", default_value = "cuda", value_parser = |s: &str| s.parse::<AutocastPolicy>())]
    pub autocast_policy: AutocastPolicy,
    /// Serve the job's figures to Prometheus at ADDR/metrics (PORT alone: loopback).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// A script and its arguments (SCRIPT.py ARGS...), or after `--` any command
    /// (`-- torchrun --nproc-per-node 2 train.py`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true, value_name = "SCRIPT|COMMAND")]
    pub command: Vec<OsString>,
}

#[derive(clap::Args, Clone)]
pub struct AttachArgs {
    /// A job's name (or a unique prefix), a socket path, or HOST:PORT for a job listening on
    /// TCP. Without it: the only job running, or the list of them.
    #[arg(conflicts_with = "pid")]
    pub addr: Option<String>,
    /// A Python job started without vramscope (plain `python train.py`): vramscope gets its
    /// hook in (gdb, or sys.remote_exec on Python 3.14), and it comes out again when you
    /// leave.
    #[arg(long)]
    pub pid: Option<u32>,
    /// With --headless: stop watching after this many steps (the job runs on).
    #[arg(long, requires = "headless")]
    pub steps: Option<u64>,
    /// With --pid: where the job's snapshots go (its `s` key, OOMs).
    #[arg(long, default_value = "snapshots", requires = "pid")]
    pub snapshot_dir: PathBuf,
    /// The token a TCP job printed.
    #[arg(long, conflicts_with = "token_file")]
    pub token: Option<String>,
    /// A file holding the token (readable by its owner only).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Print per-step lines instead of the screen.
    #[arg(long)]
    pub headless: bool,
    /// With --headless: one JSON object per step.
    #[arg(long, requires = "headless")]
    pub json: bool,
    /// Record everything the screen (or --headless) is fed into this new file.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Serve the job's figures to Prometheus at ADDR/metrics (PORT alone: loopback).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
}

fn parse_device(s: &str) -> Result<String, String> {
    let cuda = s.strip_prefix("cuda:").is_some_and(|n| n.parse::<u8>().is_ok());
    if matches!(s, "auto" | "cpu") || cuda {
        Ok(s.to_string())
    } else {
        Err("expected auto, cpu or cuda:N".into())
    }
}

/// `vramscope py`.
pub fn run_py(a: PyArgs, screen: Option<Screen>) -> anyhow::Result<std::process::ExitCode> {
    let first = a.command[0].to_string_lossy().into_owned();
    let python = job_env::python(a.python.as_deref());
    let script = first.ends_with(".py");
    let mut cmd = if script {
        anyhow::ensure!(Path::new(&first).is_file(), "{first}: no such script");
        let mut c = Command::new(&python);
        c.args(&a.command);
        c
    } else {
        let mut c = Command::new(&a.command[0]);
        c.args(&a.command[1..]);
        c
    };
    job_env::hook_env(&mut cmd, &python, &HookSettings { snapshot_dir: &a.snapshot_dir, device: a.device.as_deref(), alloc_conf: a.alloc_conf.as_deref(), autocast_policy: a.autocast_policy })?;
    if let Some(p) = &a.precision {
        cmd.env("VRAMSCOPE_PRECISION", p);
    }
    let what = Path::new(&first).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or(first.clone());
    let job = job_name(&what);
    let recorder = a.record.as_deref().map(Recorder::create).transpose()?;
    // Bound before the job starts, so a taken port is said before anything runs.
    let metrics = a.metrics.as_deref().map(Metrics::serve).transpose()?;
    if a.headless {
        let source = JobSource::launch(cmd, &job, "the job", if a.json { Output::InheritToStderr } else { Output::Inherit })?;
        return headless(&source, recorder, metrics.as_ref(), a.json, a.check_growth, None);
    }
    // Its own process group: `q` stops the whole job (torchrun and its workers), and a
    // viewer's death or hangup leaves it running.
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    let log = vramscope_core::channel::dir::socket_dir()?.join(format!("{job}.log"));
    let source = JobSource::launch(cmd, &job, "the job", Output::File(log))?;
    let screen = screen.expect("a screen when not headless");
    // A job that failed on its own passes its status on, as it would have run without us.
    match watch(source, JobKind::Started, recorder, metrics.as_ref(), &screen, Ranks::new(HISTORY_CAP))? {
        Some(s) if !s.success() => Ok(vramscope_core::source::job::exit_code_of(s)),
        _ => Ok(std::process::ExitCode::SUCCESS),
    }
}

/// The job `addr` names, as (rank, endpoint) pairs and a name.
fn resolve(addr: Option<&str>) -> anyhow::Result<(String, Vec<(u32, Endpoint)>)> {
    if let Some(a) = addr {
        if let Ok(sock) = a.parse::<std::net::SocketAddr>() {
            return Ok((a.to_string(), vec![(0, Endpoint::Tcp(sock))]));
        }
        let p = Path::new(a);
        if p.extension().is_some_and(|e| e == "sock") {
            let rank = p.file_name().and_then(|n| n.to_str()).and_then(vramscope_core::channel::dir::parse_socket_name).map_or(0, |(_, r)| r);
            return Ok((a.to_string(), vec![(rank, Endpoint::Unix(p.to_path_buf()))]));
        }
    }
    let jobs = list_jobs()?;
    let dir = vramscope_core::channel::dir::socket_dir()?;
    let matching: Vec<_> = jobs.into_iter().filter(|(name, _)| addr.is_none_or(|a| name.starts_with(a))).collect();
    match matching.len() {
        1 => Ok(matching.into_iter().next().expect("one")),
        0 => match addr {
            Some(a) => anyhow::bail!("no running job named {a} in {}", dir.display()),
            None => anyhow::bail!("no running job to attach to in {} (start one with `vramscope py` or `python -m vramscope_hook`)", dir.display()),
        },
        _ => {
            let list: Vec<String> = matching.iter().map(|(n, r)| format!("{n} ({} rank{})", r.len(), if r.len() == 1 { "" } else { "s" })).collect();
            anyhow::bail!("several jobs are running; name one: {}", list.join(", "))
        }
    }
}

/// `vramscope attach`.
pub fn run_attach(a: AttachArgs, screen: Option<Screen>) -> anyhow::Result<std::process::ExitCode> {
    let by_pid = a.pid.map(|pid| crate::attach_pid::attach(pid, &a.snapshot_dir)).transpose()?;
    let (name, endpoints) = match &by_pid {
        // The hook said it started; its server's socket follows within moments.
        Some(job) => {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
            loop {
                match resolve(Some(job)) {
                    Err(_) if std::time::Instant::now() < deadline => std::thread::sleep(std::time::Duration::from_millis(100)),
                    found => break found?,
                }
            }
        }
        None => resolve(a.addr.as_deref())?,
    };
    let token = match (&a.token, &a.token_file) {
        (Some(t), _) => Some(t.clone()),
        (None, Some(f)) => Some(token::read_token_file(f)?),
        (None, None) => None,
    };
    let metrics = a.metrics.as_deref().map(Metrics::serve).transpose()?;
    let source = JobSource::attach(name, &endpoints, token.as_deref())?;
    let recorder = a.record.as_deref().map(Recorder::create).transpose()?;
    if a.headless {
        return headless(&source, recorder, metrics.as_ref(), a.json, false, a.steps);
    }
    watch(source, JobKind::Attached, recorder, metrics.as_ref(), &screen.expect("a screen when not headless"), Ranks::new(HISTORY_CAP))?;
    Ok(std::process::ExitCode::SUCCESS)
}
