//! Helpers shared by the benchmarks: data generated with Python, memory readings, and the
//! CPU training configuration the overhead benches run.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

use vramscope::train::config::{Attention, DeviceChoice, Mode, Precision, Preset, StepConfig};
use vramscope::train::engine::EngineOptions;

/// Full fp32 training steps of `preset` on CPU: one warm-up step, then `steps` measured.
pub fn cpu_train(preset: Preset, ctx: i64, batch: i64, steps: u64) -> EngineOptions {
    let cfg = StepConfig {
        model_name: preset.name().into(),
        dims: preset.dims(),
        ctx,
        batch,
        precision: Precision::Fp32,
        mode: Mode::Train,
        attention: Attention::Naive,
    };
    let mut o = EngineOptions::new(cfg);
    o.device = DeviceChoice::Cpu;
    o.steps = Some(steps + 1);
    o
}

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn python() -> PathBuf {
    root().join(".venv/bin/python")
}

/// `target/bench-data/<name>`, written once by running `generator` with Python as
/// `generator <path> <arg>`.
pub fn generated(name: &str, generator: &str, arg: &str) -> PathBuf {
    let dir = root().join("target/bench-data");
    std::fs::create_dir_all(&dir).expect("create target/bench-data");
    let path = dir.join(name);
    if !path.exists() {
        eprintln!("generating {} with Python (minutes)...", path.display());
        let st = Command::new(python()).args(["-c", generator]).arg(&path).arg(arg).status().expect("run python");
        assert!(st.success(), "generator failed");
    }
    path
}

/// A `/proc/self/status` field in KiB (`VmHWM`: peak RSS, `VmRSS`: current).
pub fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
