//! The built-in CS336 model, wherever vramscope was installed: vramscope's own engine where
//! it was built (a source checkout), else the same model in the user's own torch through the
//! hook (a pip install carries no libtorch), so `vramscope` alone shows the course's model on
//! the user's GPU either way, with the same keys.

use std::process::Command;

use vramscope_core::source::job::{JobSource, Output};
use vramscope_core::source::launch::{engine_binary, job_name, launch_engine, EngineOptions};

use crate::job_env::{self, HookSettings};

/// Starts the built-in model on `opts`; it trains once this side has attached.
pub fn launch_builtin(opts: &EngineOptions, output: Output) -> anyhow::Result<JobSource> {
    if engine_binary().is_ok() {
        return launch_engine(opts, output);
    }
    launch_in_python(opts, output)
}

/// The built-in model as `python -m vramscope_hook.cs336`, under the hook.
pub fn launch_in_python(opts: &EngineOptions, output: Output) -> anyhow::Result<JobSource> {
    if let Some(flag) = engine_only(opts) {
        anyhow::bail!("{flag} needs vramscope's own engine, which a pip install does not carry: build vramscope from source (scripts/run)");
    }
    let python = job_env::python(None);
    let mut cmd = Command::new(&python);
    let c = &opts.config;
    let d = c.dims;
    cmd.args(["-m", "vramscope_hook.cs336"]);
    for (flag, v) in [("--vocab", d.vocab), ("--d-model", d.d_model), ("--d-ff", d.d_ff), ("--layers", d.layers), ("--heads", d.heads), ("--ctx", c.ctx), ("--batch", c.batch), ("--seed", opts.seed)] {
        cmd.arg(flag).arg(v.to_string());
    }
    cmd.args(["--precision", c.precision.as_str(), "--mode", c.mode.as_str(), "--attention", c.attention.as_str(), "--optimizer", c.optimizer.as_str()]);
    cmd.arg("--checkpointing").arg(c.checkpointing.to_string());
    // 0: until told to stop.
    cmd.arg("--steps").arg(opts.steps.unwrap_or(0).to_string());
    let device = opts.device.to_string();
    cmd.arg("--device").arg(&device);
    job_env::hook_env(&mut cmd, &python, &HookSettings { snapshot_dir: &opts.snapshot_dir, device: Some(&device), alloc_conf: Some(&opts.alloc_conf), autocast_policy: opts.autocast_policy })
        .map_err(|e| anyhow::anyhow!("the built-in model runs in your torch where vramscope's engine is not installed, and {e:#}"))?;
    // The screen and the snapshots name the model as the engine would.
    cmd.env("VRAMSCOPE_NAME", &c.model_name).env("VRAMSCOPE_QUEUE", opts.queue_batches.to_string());
    // It lives and dies with this vramscope, as the engine does, even if vramscope is killed.
    use std::os::unix::process::CommandExt;
    // SAFETY: only prctl, which is async-signal-safe, runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    JobSource::launch(cmd, &job_name(&c.model_name), "the built-in model", output)
}

/// The engine's test and sweep options that the Python model does not offer, by flag.
fn engine_only(o: &EngineOptions) -> Option<&'static str> {
    [
        (!o.snapshot_at.is_empty(), "--snapshot-at"),
        (o.leak_bytes_per_step > 0, "--inject-leak-bytes"),
        (o.selftest.is_some(), "selftest"),
        (o.force_oom_at_step.is_some(), "a forced out-of-memory"),
        (o.start_paused, "starting paused"),
        (o.snapshot_trace_from_step.is_some(), "a snapshot trace from a later step"),
    ]
    .into_iter()
    .find_map(|(used, flag)| used.then_some(flag))
}
