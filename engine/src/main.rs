//! vramscope's training engine: the only vramscope process that loads libtorch. It trains
//! the CS336 transformer on the options `vramscope run` or `sweep` hands it and produces
//! vramscope's event stream on an owner-only socket, exactly as the Python hook does in a
//! user's job; the screen, the store and every tool live in the light `vramscope` binary.

use vramscope_engine::worker;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;

use vramscope_core::producer::server::{Listen, Log, Server};
use vramscope_core::source::launch::EngineOptions;

#[derive(Parser)]
#[command(name = "vramscope-engine", version, about = "vramscope's training engine (started by `vramscope run` and `sweep`)")]
struct Args {
    /// The run's options, as JSON (what `vramscope run` passes).
    #[arg(long)]
    options: String,
}

/// How long a started engine waits for the vramscope that started it to attach.
const WAIT_FOR_VIEWER: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    let args = Args::parse();
    worker::quiet_step_panics();
    if std::env::var_os("VRAMSCOPE_PARENT_DEATH").is_some() {
        // Started by a vramscope: end with it, even if it is killed.
        // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) };
    }
    match serve(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vramscope-engine: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn serve(args: &Args) -> anyhow::Result<()> {
    let opts: EngineOptions = serde_json::from_str(&args.options).map_err(|e| anyhow::anyhow!("--options: {e}"))?;
    let job = std::env::var("VRAMSCOPE_JOB").unwrap_or_else(|_| format!("{}-engine", std::process::id()));
    let log: Log = Arc::new(|line: &str| eprintln!("{line}"));
    let socket_dir = std::env::var_os("VRAMSCOPE_SOCKET_DIR").map(std::path::PathBuf::from);
    let tcp = std::env::var("VRAMSCOPE_LISTEN").ok();
    let listen = Listen::for_job(socket_dir.as_deref(), tcp.as_deref(), &job, 0, 0)?;
    let server = Server::bind_job(&listen, &job, 0, opts.queue_batches, log.clone())?;
    if std::env::var_os("VRAMSCOPE_WAIT_FOR_VIEWER").is_some() {
        server.wait_for_viewer(WAIT_FOR_VIEWER);
    }
    // A viewer's stop and SIGTERM both end the step at its next phase boundary.
    let stop = server.stop_flag();
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    // The selftest's CUDA pass where that device is not: nothing to check, and the evidence
    // says why (its checks are skipped, or the flag was bad).
    if let (Some(path), vramscope_core::step_config::DeviceChoice::Cuda(n)) = (&opts.selftest, opts.device) {
        if let Some(evidence) = vramscope_engine::selftest::cuda_unavailable(n) {
            vramscope_engine::selftest::write(path, &evidence)?;
            let mut server = server;
            server.fail(evidence.unavailable.as_deref().or(evidence.bad_device.as_deref()).unwrap_or_default());
            return Ok(());
        }
    }
    match worker::setup(&opts) {
        Ok(setup) => {
            worker::Worker::new(opts, setup, server, stop, log).run();
            Ok(())
        }
        Err(e) => {
            // The viewer hears why; the exit code says it failed.
            let mut server = server;
            server.fail(&format!("{e:#}"));
            std::process::exit(2);
        }
    }
}
