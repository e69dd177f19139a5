//! `vramscope whatif` per setting: the replay of one device's trace through the allocator
//! model under each of the default rows' settings, on the fixture trace with the most
//! entries, and on that trace repeated 100 times (a long run's trace), side by side with
//! the recorded-settings row and the whole command's work (all rows and the self-check).
//!
//! Run: `cargo bench --bench whatif`

mod common;

use std::path::Path;
use std::time::Instant;

use vramscope_core::allocator::replay::{oom_capacity, state_before_trace};
use vramscope_core::report::whatif::{default_configs, recorded_config, replay_row, whatif};
use vramscope_core::snapshot::model::Snapshot;

const REPEATS: usize = 100;

/// Best wall time of `reps` runs of `f`, in seconds.
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

/// (file name, snapshot, device) with the most trace entries among the fixtures.
fn largest_trace(dir: &Path) -> (String, Snapshot, usize) {
    let mut best: Option<(String, Snapshot, usize)> = None;
    for entry in std::fs::read_dir(dir).expect("the real snapshots' folder") {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "pickle") {
            continue;
        }
        let snap = vramscope_core::snapshot::read_snapshot_file(&path).expect("a fixture reads");
        let device = (0..snap.device_traces.len()).max_by_key(|&d| snap.device_traces[d].len()).unwrap_or(0);
        let len = |b: &(String, Snapshot, usize)| b.1.device_traces[b.2].len();
        let cand = (path.file_name().unwrap().to_string_lossy().into_owned(), snap, device);
        if best.as_ref().is_none_or(|b| len(&cand) > len(b)) {
            best = Some(cand);
        }
    }
    best.expect("at least one fixture")
}

/// `device`'s trace repeated, each copy later in time: a long run's trace.
fn repeated(s: &Snapshot, device: usize, copies: usize) -> Snapshot {
    let mut long = s.clone();
    let trace = &s.device_traces[device];
    let span = trace.last().map_or(0, |e| e.time_us) - trace.first().map_or(0, |e| e.time_us) + 1;
    long.device_traces[device] = (0..copies as i64)
        .flat_map(|k| {
            trace.iter().map(move |e| {
                let mut e = e.clone();
                e.time_us += k * span;
                e
            })
        })
        .collect();
    long
}

fn measure(label: &str, s: &Snapshot, device: usize, reps: usize) {
    let entries = s.device_traces[device].len();
    let recorded = recorded_config(s);
    let before = state_before_trace(s, device, &recorded);
    let capacity = oom_capacity(s, device);
    println!("{label}: device {device}, {entries} trace entries (best of {reps})");
    println!("| settings | ms | ns/entry | vs recorded |");
    println!("|---|---:|---:|---:|");
    let base = best(reps, || {
        std::hint::black_box(replay_row(s, device, &before, &recorded, capacity, true));
    });
    println!("| recorded: {} | {:.2} | {:.0} | 1.00x |", recorded.conf, base * 1e3, base * 1e9 / entries as f64);
    for cfg in default_configs(&recorded) {
        let t = best(reps, || {
            std::hint::black_box(replay_row(s, device, &before, &cfg, capacity, false));
        });
        let name = if cfg.conf.is_empty() { "defaults" } else { &cfg.conf };
        println!("| {name} | {:.2} | {:.0} | {:.2}x |", t * 1e3, t * 1e9 / entries as f64, t / base);
    }
    let configs = default_configs(&recorded);
    let all = best(reps, || {
        std::hint::black_box(whatif(s, device, &configs));
    });
    println!("| whole command (all rows, self-check) | {:.2} | {:.0} | {:.2}x |", all * 1e3, all * 1e9 / entries as f64, all / base);
    println!();
}

fn main() {
    let Some(dir) = common::real_snapshots() else { return };
    let (name, snap, device) = largest_trace(&dir);
    measure(&name, &snap, device, 20);
    let long = repeated(&snap, device, REPEATS);
    measure(&format!("{name} ×{REPEATS}"), &long, device, 3);
}
