//! Snapshot reading and `vramscope view --summary` against Python's C `pickle.load` of the
//! same file, measured side by side, on each shape a real snapshot comes in:
//!
//! - shared: a real CS336 training snapshot's trace (MAGMA27's fixture) repeated, each
//!   entry's frames list shared with the others of its traceback, as PyTorch writes them;
//! - unshared: the same with every entry's frames written out in full (a snapshot
//!   rewritten by a script);
//! - ring: the shared trace with a tenth of its allocations fallen out of the ring, so
//!   frees of blocks allocated before the trace come all along it;
//! - five: every entry with a stack of five frame dicts written out in full (issue 29's
//!   largest case), at 1.3N and 5.2N entries, about 330 MB at the default N.
//!
//! Each shape at N and 4N entries (the growth check: 4x the entries costs at most 4.5x the
//! time, on the CPU time of the summary, which a machine shared with other work
//! disturbs less than wall time), and on the ring, each command's own work after the
//! read: the timeline and summary, replay's conversion, diff and export. Beside each read,
//! the floor for any reader of the format: one pass that walks and checks the opcodes on
//! one thread, decoding nothing (`walk`), and our read and summary as multiples of it.
//! The files are generated once with Python under target/bench-data/.
//!
//! Run: `cargo bench --bench snapshot_read` (`-- N` for another N; default 375000).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use vramscope_core::record::trace::trace_items;
use vramscope::export::{render_svg, ExportOptions};
use vramscope_core::report::snapshot_summary::summarize;
use vramscope_core::snapshot::{read_snapshot_file, walk_opcodes};
use vramscope_core::snapshot::timeline::Timeline;

const ENTRIES: usize = 375_000;

/// `snapshot_shapes.py FIXTURE OUT SHAPE ENTRIES` (also run by `scripts/gpu-read-check`).
const GENERATOR: &str = include_str!("snapshot_shapes.py");

/// Seconds for one `pickle.load`, measured inside Python (interpreter start excluded):
/// `pickle_load.py FILE gc|nogc`.
const PY_LOAD: &str = include_str!("pickle_load.py");

fn best_of(n: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..n).map(|_| f()).fold(f64::INFINITY, f64::min)
}

const MAGMA27: &str = "MAGMA27_assignment2-systems_memory_snapshot.pickle";

fn file(shape: &str, entries: usize) -> PathBuf {
    let dir = common::bench_data();
    let path = dir.join(format!("magma27-{shape}-{entries}.pickle"));
    if !path.exists() {
        eprintln!("generating {} with Python...", path.display());
        let st = Command::new(common::python()).args(["-c", GENERATOR]).arg(common::real_snapshot(MAGMA27).expect("checked at the start")).arg(&path).arg(shape).arg(entries.to_string()).status().expect("run python");
        assert!(st.success(), "generator failed");
    }
    path
}

/// What `vramscope view --summary --json` does, in this process: (wall, CPU) seconds.
fn summary(path: &Path) -> (f64, f64) {
    common::timed(|| {
        let snap = read_snapshot_file(path).expect("read");
        let device = snap.default_device();
        let tl = Timeline::from_snapshot(&snap, device);
        let s = summarize(&snap, &tl, device, 10);
        serde_json::to_writer(std::io::sink(), &s).expect("json");
        std::mem::forget((snap, tl));
    })
}

/// Each command's own CPU seconds on a read snapshot: the timeline and summary,
/// replay's conversion of the trace, diff against itself, and export's SVG.
fn commands(path: &Path) -> [(&'static str, f64); 4] {
    let snap = read_snapshot_file(path).expect("read");
    let device = snap.default_device();
    let best = |f: &dyn Fn()| (0..3).map(|_| common::timed(f).1).fold(f64::INFINITY, f64::min);
    let summary = best(&|| {
        let tl = Timeline::from_snapshot(&snap, device);
        std::hint::black_box(summarize(&snap, &tl, device, 10));
    });
    let tl = Timeline::from_snapshot(&snap, device);
    let replay = best(&|| drop(std::hint::black_box(trace_items(&snap, 0))));
    let diff = best(&|| drop(std::hint::black_box(vramscope_core::report::diff::diff((&snap, &tl, device), (&snap, &tl, device), 10))));
    let o = ExportOptions { device, ..ExportOptions::default() };
    let export = best(&|| drop(std::hint::black_box(render_svg(&snap, &o).expect("svg"))));
    [("timeline + summary", summary), ("replay conversion", replay), ("diff", diff), ("export svg", export)]
}

/// The command itself, process start included.
fn summary_command(path: &Path) -> f64 {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope")).args(["view", "--summary", "--json"]).arg(path).output().expect("vramscope");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    t.elapsed().as_secs_f64()
}

fn python_load(path: &Path, mode: &str) -> f64 {
    let out = Command::new(common::python()).args(["-c", PY_LOAD]).arg(path).arg(mode).output().expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("python timing")
}

/// Child mode: read once; report the process's RSS before and its peak after. The bench
/// binary links libtorch, whose libraries alone are a few hundred MB of RSS before any
/// reading, so the reader's own peak is the difference.
fn child(path: &Path) {
    let before = common::status_kib("VmRSS");
    let snap = read_snapshot_file(path).expect("read");
    println!("{before} {} {}", common::status_kib("VmHWM"), snap.trace_entry_count());
}

struct Row {
    walk: f64,
    read: f64,
    summary: f64,
    summary_cpu: f64,
    command: f64,
    py_gc: f64,
    py_nogc: f64,
}

fn measure(path: &Path) -> Row {
    let bytes = std::fs::read(path).expect("data file");
    let walk = best_of(3, || {
        let t = Instant::now();
        walk_opcodes(&bytes).expect("a valid pickle");
        t.elapsed().as_secs_f64()
    });
    drop(bytes);
    let read = best_of(3, || {
        let t = Instant::now();
        let snap = read_snapshot_file(path).expect("our reader");
        assert!(snap.trace_entry_count() > 0);
        t.elapsed().as_secs_f64()
    });
    let runs: Vec<(f64, f64)> = (0..3).map(|_| summary(path)).collect();
    Row {
        walk,
        read,
        summary: runs.iter().map(|r| r.0).fold(f64::INFINITY, f64::min),
        summary_cpu: runs.iter().map(|r| r.1).fold(f64::INFINITY, f64::min),
        command: best_of(3, || summary_command(path)),
        py_gc: best_of(2, || python_load(path, "gc")),
        py_nogc: best_of(2, || python_load(path, "nogc")),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child-read") {
        return child(Path::new(&args[i + 1]));
    }
    if common::real_snapshot(MAGMA27).is_none() {
        return;
    }
    let n = args.iter().skip(1).find_map(|a| a.parse().ok()).unwrap_or(ENTRIES);
    println!("snapshot_read: MAGMA27's trace repeated; ours best of 3, Python's pickle.load best of 2, all in this run");
    println!(
        "{:<9} {:>9} {:>7} {:>7} {:>8} {:>9} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "shape", "entries", "MB", "walk s", "read s", "summary s", "cpu s", "command s", "py gc s", "py nogc s", "read/walk", "vs gc", "vs nogc", "cmd vs gc"
    );
    let mut growth = Vec::new();
    let mut largest = Vec::new();
    for shape in ["shared", "unshared", "ring", "five"] {
        let sizes = if shape == "five" { [n * 13 / 10, n * 52 / 10] } else { [n, 4 * n] };
        let mut summaries = Vec::new();
        for entries in sizes {
            let path = file(shape, entries);
            let mb = std::fs::metadata(&path).expect("data file").len() as f64 / 1e6;
            let r = measure(&path);
            println!(
                "{shape:<9} {entries:>9} {mb:>7.1} {:>7.3} {:>8.3} {:>9.3} {:>8.3} {:>9.3} {:>9.3} {:>9.3} {:>8.2}x {:>8.2}x {:>8.2}x {:>8.2}x",
                r.walk,
                r.read,
                r.summary,
                r.summary_cpu,
                r.command,
                r.py_gc,
                r.py_nogc,
                r.read / r.walk,
                r.py_gc / r.summary,
                r.py_nogc / r.summary,
                r.py_gc / r.command
            );
            summaries.push(r.summary_cpu);
        }
        growth.push((shape, summaries[1] / summaries[0]));
        largest.push(file(shape, sizes[1]));
    }
    println!("(walk: one pass that walks and checks the opcodes on one thread, decoding nothing, the floor for any reader (issue 29 aims read/walk <= 2x); vs gc / vs nogc: Python's pickle.load with the garbage collector on (the default) / off, over our in-process summary (issue 29 asks 10x / 3x); cmd vs gc: over the whole `vramscope view --summary --json` command (10x))");

    // serde-pickle stops with an error on snapshots (it refuses memo references to
    // shared containers); its time until then is still reported.
    let bytes = std::fs::read(file("shared", n)).expect("read");
    let t = Instant::now();
    let result = serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new()).map(drop);
    let secs = t.elapsed().as_secs_f64();
    match result {
        Ok(()) => println!("serde-pickle value_from_slice, shared {n}: {secs:.3} s"),
        Err(e) => println!("serde-pickle value_from_slice, shared {n}: failed after {secs:.3} s: {e}"),
    }
    for (shape, g) in growth {
        let verdict = if g <= 4.5 { "ok" } else { "OVER" };
        println!("growth {shape}: 4x the entries took {g:.2}x the summary's CPU time (at most 4.5x): {verdict}");
    }
    let (small, large) = (commands(&file("ring", n)), commands(&file("ring", 4 * n)));
    println!("ring, each command's CPU time after the read ({n} and {} entries):", 4 * n);
    for ((what, a), (_, b)) in small.iter().zip(&large) {
        let verdict = if b / a <= 5.0 { "ok" } else { "OVER" };
        println!("  {what:<20} {a:>8.3} s {b:>8.3} s  {:>5.2}x (at most 5x): {verdict}", b / a);
    }

    for path in largest {
        let size = std::fs::metadata(&path).expect("data file").len() as f64;
        let out = Command::new(std::env::current_exe().expect("exe")).arg("--child-read").arg(&path).output().expect("child");
        let kib: Vec<f64> = String::from_utf8_lossy(&out.stdout).split_whitespace().take(2).map(|s| s.parse().expect("child RSS")).collect();
        let (before, peak) = (kib[0] * 1024.0, kib[1] * 1024.0);
        println!(
            "our peak RSS reading {}: {:.1} MB = {:.2}x the file size (at most 1.5x; process peak {:.1} MB, {:.1} MB before reading)",
            path.file_name().unwrap().to_string_lossy(),
            (peak - before) / 1e6,
            (peak - before) / size,
            peak / 1e6,
            before / 1e6
        );
    }
}
