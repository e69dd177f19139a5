//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod tmux;
pub mod viewer;

use std::path::PathBuf;
use std::time::Duration;

use vramscope::event::Batch;
use vramscope::snapshot::model::Snapshot;
use vramscope::train::config::{Attention, DeviceChoice, Mode, Precision, Preset, StepConfig};
use vramscope::train::engine::{Engine, EngineOptions, Report, StepReport};

/// The tiny preset at a CPU-friendly shape.
pub fn tiny(ctx: i64, batch: i64, mode: Mode, precision: Precision, attention: Attention) -> StepConfig {
    StepConfig {
        model_name: "tiny".into(),
        dims: Preset::Tiny.dims(),
        ctx,
        batch,
        precision,
        mode,
        attention,
    }
}

pub fn options(cfg: StepConfig, steps: u64) -> EngineOptions {
    let mut o = EngineOptions::new(cfg);
    o.device = DeviceChoice::Cpu;
    o.steps = Some(steps);
    o.batch_capacity = 1 << 16;
    o
}

pub struct Run {
    pub batches: Vec<Batch>,
    pub reports: Vec<Report>,
}

impl Run {
    pub fn steps(&self) -> Vec<&StepReport> {
        self.reports
            .iter()
            .filter_map(|r| if let Report::Step(s) = r { Some(s) } else { None })
            .collect()
    }
}

/// Runs the engine until it finishes, keeping every batch and report.
pub fn run(opts: EngineOptions) -> Run {
    let engine = Engine::spawn(opts).expect("engine starts");
    collect(engine)
}

pub fn collect(mut engine: Engine) -> Run {
    let mut out = Run { batches: Vec::new(), reports: Vec::new() };
    loop {
        while let Ok(b) = engine.batches.try_recv() {
            out.batches.push(b);
        }
        match engine.reports.recv_timeout(Duration::from_millis(5)) {
            Ok(Report::Finished) => break,
            Ok(r) => {
                if let Report::Error(e) = &r {
                    panic!("engine error: {e}");
                }
                out.reports.push(r)
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(e) => panic!("engine went away: {e}"),
        }
    }
    engine.shutdown();
    while let Ok(b) = engine.batches.try_recv() {
        out.batches.push(b);
    }
    out
}

/// The built `vramscope` binary, ready for arguments.
pub fn vramscope() -> assert_cmd::Command {
    assert_cmd::Command::cargo_bin("vramscope").expect("binary built")
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixture(name: &str) -> PathBuf {
    repo_root().join("../shared/fixtures/snapshots").join(name)
}

pub fn python() -> PathBuf {
    repo_root().join(".venv/bin/python")
}

pub const KKAITLYN: &str = "kkaitlyn111_cs336-a2-systems_memory_ctx128_forward";
pub const MAGMA27: &str = "MAGMA27_assignment2-systems_memory_snapshot";
pub const SNAPVIEWER: &str = "SnapViewer_assets_memory";
/// `expandable_segments:True`, three traced devices, an `oom` on device 1.
pub const CONSTRUCTOR_SUN: &str = "Constructor-Sun_code_location_memory_snapshot";
pub const ALL: [&str; 3] = [KKAITLYN, MAGMA27, SNAPVIEWER];

pub fn fixture_path(name: &str) -> PathBuf {
    fixture(&format!("{name}.pickle"))
}

pub fn load(name: &str) -> Snapshot {
    vramscope::snapshot::read_snapshot_file(&fixture_path(name)).unwrap()
}

/// Runs `script` with the project venv's Python on `file` and parses the JSON it prints:
/// the independent computations the tests hold our figures to.
pub fn python_json<T: serde::de::DeserializeOwned>(script: &str, file: &std::path::Path) -> T {
    let out = std::process::Command::new(python()).arg("-c").arg(script).arg(file).output().expect("run the venv's python");
    assert!(out.status.success(), "python failed on {}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("python prints JSON")
}

/// A fixture's trace repeated `copies` times (later copies later in time, and with
/// categories from the second copy on), written to `path`: a real snapshot's shape, as
/// long as a test needs it.
pub fn long_snapshot_file(name: &str, copies: usize, path: &std::path::Path) -> Snapshot {
    let mut snap = load(name);
    let trace = snap.device_traces[0].clone();
    let span = trace.last().map_or(0, |e| e.time_us) - trace.first().map_or(0, |e| e.time_us) + 1;
    for k in 1..copies as i64 {
        snap.device_traces[0].extend(trace.iter().enumerate().map(|(i, e)| {
            let mut e = e.clone();
            e.time_us += k * span;
            e.category = Some(["activation", "parameter", "temporary"][i % 3].into());
            e
        }));
    }
    vramscope::snapshot::save_snapshot_atomic(&snap, path).expect("write the long snapshot");
    snap
}
