//! Snapshot reader speed and memory against Python's C `pickle.load` and serde-pickle.
//!
//! Generates (once, cached under target/bench-data/) a snapshot-shaped pickle of about
//! 200 MB with Python: segments with blocks, ~1M trace entries whose frame dicts are
//! shared through the memo, dumped with protocol 4 like `_dump_snapshot`. Then times
//! each reader on it and measures our reader's peak RSS in a child process.
//!
//! Run: `LD_LIBRARY_PATH=$PWD/.libtorch/lib cargo bench --bench snapshot_read`

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use vramscope::snapshot::read_snapshot_file;

const ENTRIES: usize = 1_000_000;

const GENERATOR: &str = r#"
import pickle, random, sys
random.seed(7)
out, n = sys.argv[1], int(sys.argv[2])
frames = [{'name': f'layer_{i}.forward', 'filename': f'/home/user/project/pkg/module_{i % 300}.py', 'line': (i * 37) % 2000}
          for i in range(5000)]
stacks = [random.sample(frames, random.randint(20, 40)) for _ in range(20000)]
base = 0x7f0000000000
segments = []
for s in range(2000):
    addr = base + s * (32 << 20)
    blocks = [{'address': addr + b * (2 << 20), 'size': 2 << 20, 'requested_size': (2 << 20) - b,
               'state': ('active_allocated', 'inactive', 'active_pending_free')[b % 3], 'frames': list(random.choice(stacks))}
              for b in range(16)]
    segments.append({'device': 0, 'address': addr, 'total_size': 32 << 20, 'allocated_size': 16 << 20,
                     'active_size': 16 << 20, 'requested_size': 16 << 20, 'stream': 0, 'segment_type': 'large',
                     'segment_pool_id': (0, 0), 'is_expandable': False, 'frames': list(random.choice(stacks)), 'blocks': blocks})
actions = ('alloc', 'free_requested', 'free_completed')
trace = []
for i in range(n):
    trace.append({'action': actions[i % 3], 'addr': base + random.randrange(1 << 36), 'size': random.randrange(1 << 24),
                  'stream': 0, 'time_us': 1759252584402607 + i * 13, 'compile_context': '', 'user_metadata': '',
                  'frames': list(random.choice(stacks))})
settings = {'PYTORCH_CUDA_ALLOC_CONF': '', 'max_split_size': -1, 'garbage_collection_threshold': 0.0,
            'expandable_segments': False, 'roundup_power2_divisions': {str(1 << k): 0 for k in range(16)}}
snap = {'segments': segments, 'device_traces': [trace], 'allocator_settings': settings,
        'external_annotations': [{'name': 'Optimizer.step#AdamW.step', 'stage': st, 'device': 0, 'time_us': 1759252584402607 + k}
                                 for k, st in enumerate(['START', 'END'] * 500)]}
with open(out + '.tmp', 'wb') as f:
    pickle.dump(snap, f, protocol=4)
import os
os.replace(out + '.tmp', out)
"#;

/// Seconds for one `pickle.load`, measured inside Python (interpreter start excluded).
const PY_LOAD: &str = r#"
import pickle, time, sys, gc
if sys.argv[2] == 'nogc':
    gc.disable()
with open(sys.argv[1], 'rb') as f:
    t = time.perf_counter()
    pickle.load(f)
    print(time.perf_counter() - t)
"#;

fn best_of(n: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..n).map(|_| f()).fold(f64::INFINITY, f64::min)
}

/// Child mode: read once; report the process's RSS before, its peak after, and the
/// seconds the read took. The bench binary links libtorch, whose libraries alone are
/// a few hundred MB of RSS before any reading, so the reader's own peak is the difference.
fn child(path: &Path) {
    let before = common::status_kib("VmRSS");
    let t = Instant::now();
    let snap = read_snapshot_file(path).expect("read");
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{before} {} {secs} {}",
        common::status_kib("VmHWM"),
        snap.trace_entry_count()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child-read") {
        return child(Path::new(&args[i + 1]));
    }
    let path = common::generated(&format!("snapshot-{ENTRIES}.pickle"), GENERATOR, &ENTRIES.to_string());
    let size = std::fs::metadata(&path).expect("data file").len();
    let mb = size as f64 / 1e6;

    let ours = best_of(3, || {
        let t = Instant::now();
        let snap = read_snapshot_file(&path).expect("our reader");
        let s = t.elapsed().as_secs_f64();
        assert!(snap.trace_entry_count() >= ENTRIES);
        s
    });

    let py = |mode: &str| {
        best_of(2, || {
            let out = Command::new(common::python())
                .args(["-c", PY_LOAD])
                .arg(&path)
                .arg(mode)
                .output()
                .expect("python");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<f64>()
                .expect("python timing")
        })
    };
    let py_gc = py("gc");
    let py_nogc = py("nogc");

    // serde-pickle stops with an error on snapshots (it refuses memo references to
    // shared containers); its time until then is still reported.
    let bytes = std::fs::read(&path).expect("read");
    let t = Instant::now();
    let serde_result =
        serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new()).map(drop);
    let serde = t.elapsed().as_secs_f64();
    drop(bytes);

    let out = Command::new(std::env::current_exe().expect("exe"))
        .arg("--child-read")
        .arg(&path)
        .output()
        .expect("child");
    let child_out = String::from_utf8_lossy(&out.stdout);
    let kib: Vec<f64> = child_out
        .split_whitespace()
        .take(2)
        .map(|s| s.parse().expect("child RSS"))
        .collect();
    let (before, peak) = (kib[0] * 1024.0, kib[1] * 1024.0);
    let rss = peak - before;

    println!(
        "snapshot_read: {} ({mb:.1} MB, {ENTRIES} trace entries)",
        path.display()
    );
    println!(
        "{:<34} {:>9} {:>10} {:>12}",
        "reader", "seconds", "MB/s", "vs ours"
    );
    for (name, s) in [
        ("vramscope read_snapshot_file", ours),
        ("python pickle.load (gc on)", py_gc),
        ("python pickle.load (gc off)", py_nogc),
    ] {
        println!("{name:<34} {s:>9.3} {:>10.1} {:>11.2}x", mb / s, s / ours);
    }
    match serde_result {
        Ok(()) => println!(
            "{:<34} {serde:>9.3} {:>10.1} {:>11.2}x",
            "serde-pickle value_from_slice",
            mb / serde,
            serde / ours
        ),
        Err(e) => println!(
            "{:<34} failed after {serde:.3} s: {e}",
            "serde-pickle value_from_slice"
        ),
    }
    println!(
        "our peak RSS while reading: {:.1} MB = {:.2}x the file size (target <= 1.5x; process peak {:.1} MB, {:.1} MB before reading)",
        rss / 1e6,
        rss / size as f64,
        peak / 1e6,
        before / 1e6
    );
    println!(
        "speed-up vs python gc on (the default): {:.2}x (target >= 3x); vs python gc off: {:.2}x",
        py_gc / ours,
        py_nogc / ours
    );
}
