//! Helpers shared by the benchmarks: data generated with Python, memory readings, and the
//! CPU training configuration the overhead benches run.
#![allow(dead_code)]

pub mod stream;

use std::path::PathBuf;
use std::process::Command;

use vramscope_core::step_config::{Attention, DeviceChoice, Mode, Precision, Preset, StepConfig};
use vramscope_core::source::launch::EngineOptions;

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
        optimizer: Default::default(),
        checkpointing: Default::default(),
    };
    let mut o = EngineOptions::new(cfg);
    o.device = DeviceChoice::Cpu;
    o.steps = Some(steps + 1);
    o
}

/// A file cargo built beside the `vramscope` binary, wherever CARGO_TARGET_DIR puts it:
/// a bench runs from `<target>/release/deps/`.
pub fn built(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the bench's own path");
    exe.parent().and_then(|deps| deps.parent()).expect("<target>/release").join(name)
}

/// `<target dir>/bench-data`: generated inputs, kept between runs.
pub fn bench_data() -> PathBuf {
    let dir = built("").parent().expect("the target folder").join("bench-data");
    std::fs::create_dir_all(&dir).expect("create the bench-data folder");
    dir
}

/// The real snapshots' folder, or `None` after the line saying the bench skipped for want
/// of them (a plain clone has none).
pub fn real_snapshots() -> Option<PathBuf> {
    let dir = vramscope_core::fixtures::real_snapshots_dir(&root());
    if dir.is_none() {
        println!("{}", vramscope_core::fixtures::skipped("this bench"));
    }
    dir
}

/// The real snapshot `name` (with `.pickle`), as `real_snapshots`.
pub fn real_snapshot(name: &str) -> Option<PathBuf> {
    Some(real_snapshots()?.join(name))
}

/// The workspace's root (the engine's benches include this file from engine/).
pub fn root() -> PathBuf {
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors().find(|d| d.join("Cargo.lock").exists()).unwrap_or(here).to_path_buf()
}

pub fn python() -> PathBuf {
    root().join(".venv/bin/python")
}

/// `<target dir>/bench-data/<name>`, written once by running `generator` with Python as
/// `generator <path> <arg>`.
pub fn generated(name: &str, generator: &str, arg: &str) -> PathBuf {
    let path = bench_data().join(name);
    if !path.exists() {
        eprintln!("generating {} with Python (minutes)...", path.display());
        let st = Command::new(python()).args(["-c", generator]).arg(&path).arg(arg).status().expect("run python");
        assert!(st.success(), "generator failed");
    }
    path
}

/// CPU seconds of this process, all its threads' (a read's decoders and the timeline's
/// helper do part of the work): on a machine shared with other work, less disturbed than
/// wall time.
pub fn cpu_seconds() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// (wall, CPU) seconds of `f`.
pub fn timed(f: impl FnOnce()) -> (f64, f64) {
    let (t, c) = (std::time::Instant::now(), cpu_seconds());
    f();
    (t.elapsed().as_secs_f64(), cpu_seconds() - c)
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

/// The dense job of issue 35 (tests/py/dense_mlp.py: an MLP trained with 4 micro-batches
/// of [32, 256] per AdamW step, 552 allocator events a step), as recorded by
/// `vramscope py --headless --record recordings/dense-mlp.vsrec tests/py/dense_mlp.py
/// --steps 400`: the batches of modelled events its hook sent.
pub fn recorded_batches() -> Vec<vramscope_core::event::Batch> {
    use vramscope_core::record::reader::Recording;
    use vramscope_core::stream::Incoming;
    let rec = Recording::open(&root().join("recordings/dense-mlp.vsrec")).expect("recordings/dense-mlp.vsrec opens");
    let mut batches = Vec::new();
    for i in 0..rec.chunk_count() {
        for (_, _, item) in rec.items(i).expect("the recording decodes") {
            if let Incoming::Batch(b) = item {
                batches.push(b);
            }
        }
    }
    batches
}

/// The recorded dense job's requests and frees, with their steps, phases, scopes and
/// times, turned back into what the shim records (a request's key is the address it was
/// given).
pub fn recorded_requests() -> Vec<vramscope_core::producer::raw::RawEvent> {
    use vramscope_core::event::Action;
    use vramscope_core::producer::raw::{RawEvent, CPU_DEVICE, RAW_ALLOC, RAW_FREE};
    let events = recorded_batches().into_iter().flat_map(|b| b.events);
    events
        .filter_map(|e| {
            let action = match e.action {
                Action::Alloc => RAW_ALLOC,
                Action::FreeRequested => RAW_FREE,
                _ => return None,
            };
            let (step, scope) = (e.step, e.scope);
            Some(RawEvent { t_ns: e.t_ns, addr: e.addr, size: e.size, stream: 0, step, scope, action, phase: e.phase as u8, device: CPU_DEVICE, ..RawEvent::default() })
        })
        .collect()
}

/// `n` CPU allocation requests and frees shaped like a training step's (many small,
/// some up to 16 MiB, a few thousand live), as the shim records them.
pub fn training_requests(n: usize) -> Vec<vramscope_core::producer::raw::RawEvent> {
    use vramscope_core::producer::raw::{RawEvent, CPU_DEVICE, RAW_ALLOC, RAW_FREE};
    let mut raw = Vec::with_capacity(n);
    let mut live: Vec<u64> = Vec::new();
    let mut x = 0x2545F4914F6CDD1Du64;
    for i in 0..n as u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let free = !live.is_empty() && (x % 100 < 48 || live.len() > 4000);
        let mut e = RawEvent::default();
        if free {
            e.action = RAW_FREE;
            e.addr = live.swap_remove((x >> 16) as usize % live.len());
        } else {
            e.action = RAW_ALLOC;
            e.addr = 0x1000_0000 + i * 64;
            e.size = if x.is_multiple_of(10) { 1 + (x >> 20) % (16 << 20) } else { 1 + (x >> 20) % 65536 };
            live.push(e.addr);
        }
        e.device = CPU_DEVICE;
        raw.push(e);
    }
    raw
}
