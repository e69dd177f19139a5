//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod colour_capture;
pub mod long_run;
pub mod tmux;
pub mod viewer;

use std::path::PathBuf;

use vramscope_core::event::Batch;
use vramscope_core::snapshot::model::Snapshot;
use vramscope_core::source::job::{JobSource, Output};
use vramscope_core::source::launch::{launch_engine, EngineOptions};
use vramscope_core::step_config::{Attention, DeviceChoice, Mode, Precision, Preset, StepConfig};
use vramscope_core::stream::{Incoming, Report, StepReport};

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
        optimizer: Default::default(),
        checkpointing: Default::default(),
    }
}

/// A CPU run of `steps` steps whose viewer queue never drops, writing snapshots to a
/// scratch directory.
pub fn options(cfg: StepConfig, steps: u64) -> EngineOptions {
    let mut o = EngineOptions::new(cfg);
    o.device = DeviceChoice::Cpu;
    o.steps = Some(steps);
    o.queue_batches = 1 << 16;
    o.snapshot_dir = std::env::temp_dir().join(format!("vramscope-tests-{}", std::process::id()));
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

/// Starts the engine process, as `vramscope run` does.
pub fn start(opts: &EngineOptions) -> JobSource {
    launch_engine(opts, Output::Capture).expect("the engine starts (cargo build --release --workspace builds it)")
}

/// Runs the engine process until its stream ends, keeping every batch and report.
pub fn run(opts: EngineOptions) -> Run {
    collect(&start(&opts))
}

/// Everything a started engine sends until its stream ends. An error report fails the test.
pub fn collect(source: &JobSource) -> Run {
    let mut out = Run { batches: Vec::new(), reports: Vec::new() };
    while let Some((_, item)) = source.next() {
        match item {
            Incoming::Batch(b) => out.batches.push(b),
            Incoming::Report(Report::Error(e)) => panic!("engine error: {e}"),
            // The engine's own output lines (libtorch's warnings) are not its reports.
            Incoming::Report(Report::Note(_)) => {}
            Incoming::Report(r) => out.reports.push(r),
            _ => {}
        }
    }
    out
}

/// The built `vramscope` binary, ready for arguments.
pub fn vramscope() -> assert_cmd::Command {
    assert_cmd::Command::cargo_bin("vramscope").expect("binary built")
}

/// A file cargo built beside the `vramscope` binary (the engine, the hook's core): in
/// target/release, or wherever CARGO_TARGET_DIR puts it.
pub fn built(name: &str) -> PathBuf {
    std::path::Path::new(env!("CARGO_BIN_EXE_vramscope")).parent().expect("the binary's folder").join(name)
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixtures_dir() -> Option<PathBuf> {
    vramscope_core::fixtures::real_snapshots_dir(&repo_root())
}

/// For a test held to the real snapshots: when they are absent, says so in one line and
/// returns true (the test returns).
pub fn skip_without_real_snapshots() -> bool {
    vramscope_core::fixtures::for_test(&repo_root()).is_none()
}

pub fn fixture(name: &str) -> PathBuf {
    fixtures_dir().unwrap_or_else(|| repo_root().join("../shared/fixtures/snapshots")).join(name)
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
    vramscope_core::snapshot::read_snapshot_file(&fixture_path(name)).unwrap()
}

/// Runs `script` with the project venv's Python on `file` and parses the JSON it prints:
/// the independent computations the tests hold our figures to.
pub fn python_json<T: serde::de::DeserializeOwned>(script: &str, file: &std::path::Path) -> T {
    python_json_args(script, file, &[])
}

/// `python_json` with more arguments after the file.
pub fn python_json_args<T: serde::de::DeserializeOwned>(script: &str, file: &std::path::Path, args: &[&str]) -> T {
    let out = std::process::Command::new(python()).arg("-c").arg(script).arg(file).args(args).output().expect("run the venv's python");
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
    vramscope_core::snapshot::save_snapshot_atomic(&snap, path).expect("write the long snapshot");
    snap
}

/// memory_viz's Active Memory Timeline (MemoryViz.js `annotate_snapshot` and
/// `process_alloc_data`), written independently in Python on the pickle itself, for
/// device `sys.argv[2]`: the total during each alloc/free action, the number of
/// allocations and how many were alive at the start. Every entry stays in the trace, so
/// an action it does not know (`annotate`) keeps a request and its completion apart, as
/// there.
pub const MEMORY_VIZ_TIMELINE: &str = r#"
import json, pickle, sys
d = pickle.load(open(sys.argv[1], 'rb'))
dev = int(sys.argv[2])
if isinstance(d, list):
    d = {'segments': d, 'device_traces': []}
traces = d.get('device_traces') or []
events = []
for e in (traces[dev] if dev < len(traces) else []):
    if (e['action'] == 'free_completed' and events and events[-1]['action'] == 'free_requested'
            and events[-1]['addr'] == e['addr']):
        events[-1]['action'] = 'free'
        continue
    events.append(dict(e))
sizes, initial, actions, open_ = [], [], [], {}
for e in events:
    if e['action'] == 'alloc':
        sizes.append(e['size']); open_[e['addr']] = len(sizes) - 1; actions.append(len(sizes) - 1)
    elif e['action'] in ('free', 'free_completed'):
        if e['addr'] in open_:
            actions.append(open_.pop(e['addr']))
        else:
            sizes.append(e['size']); initial.append(len(sizes) - 1); actions.append(len(sizes) - 1)
for seg in d['segments']:
    if seg.get('device', 0) != dev:
        continue
    addr = seg['address']
    for b in seg['blocks']:
        if b['state'] == 'active_allocated' and addr not in open_:
            if 'frames' in b or 'history' not in b:
                size = b.get('requested_size', b['size'])
            else:
                size = b.get('requested_size') or b['history'][0]['real_size']
            sizes.append(size); initial.append(len(sizes) - 1)
        addr += b['size']
initial.reverse()
if not actions and initial:
    actions.append(initial.pop())
alive = set(initial)
total = sum(sizes[i] for i in initial)
during = []
for el in actions:
    if el in alive:
        during.append(total); total -= sizes[el]; alive.discard(el)
    else:
        alive.add(el); total += sizes[el]; during.append(total)
print(json.dumps({'during': during, 'elements': len(sizes), 'initial': len(initial)}))
"#;

/// What `MEMORY_VIZ_TIMELINE` prints.
#[derive(serde::Deserialize)]
pub struct MemoryVizTimeline {
    pub during: Vec<u64>,
    pub elements: usize,
    pub initial: usize,
}

impl MemoryVizTimeline {
    pub fn of(file: &std::path::Path, device: usize) -> MemoryVizTimeline {
        python_json_args(MEMORY_VIZ_TIMELINE, file, &[&device.to_string()])
    }

    pub fn peak(&self) -> u64 {
        self.during.iter().copied().max().unwrap_or(0)
    }
}

/// Applies a stream's allocs and frees to `live` (address → requested bytes).
pub fn apply_events<'e>(live: &mut std::collections::HashMap<u64, u64>, events: impl IntoIterator<Item = &'e vramscope_core::event::MemEvent>) {
    for e in events {
        match e.action {
            vramscope_core::event::Action::Alloc => {
                live.insert(e.addr, e.size);
            }
            vramscope_core::event::Action::FreeRequested => {
                live.remove(&e.addr);
            }
            _ => {}
        }
    }
}
