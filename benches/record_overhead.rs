//! Recording cost: step time of the tiny preset on CPU with and without --record,
//! interleaved in one run so machine noise hits both alike (target ≤ 1 % slower), and the
//! bytes per allocator event of those recordings and of the sample recordings.
//!
//!   cargo bench --bench record_overhead -- [rounds] [steps] [ctx] [batch]

mod common;

use vramscope_core::record::player::Script;
use vramscope_core::record::writer::{RecordSummary, Recorder};
use vramscope_core::source::job::Output;
use vramscope_core::source::launch::launch_engine;
use vramscope_core::step_config::Preset;
use vramscope_core::stream::{Incoming, Report};

/// Step times after one warm-up step, consumed the way `run --headless [--record]` does.
fn session(record: Option<&std::path::Path>, steps: u64, ctx: i64, batch: i64) -> (Vec<f64>, Option<RecordSummary>) {
    let o = common::cpu_train(Preset::Tiny, ctx, batch, steps);
    let mut recorder = record.map(|p| Recorder::create(p).expect("new recording"));
    let source = launch_engine(&o, Output::Capture).expect("the engine starts");
    let step_time = |(_, i): (u32, Incoming)| match i {
        Incoming::Report(Report::Step(s)) if s.step > 0 => Some(s.step_time_s),
        _ => None,
    };
    let items = std::iter::from_fn(|| source.next());
    let times = match &mut recorder {
        Some(r) => r.tee(items).filter_map(step_time).collect(),
        None => items.filter_map(step_time).collect(),
    };
    (times, recorder.map(|r| r.finish().expect("recording closes")))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn events_in(path: &std::path::Path) -> u64 {
    let mut script = Script::open(path).expect("recording opens");
    let mut failed = None;
    let n = script.stream(&mut failed).map(|(_, i)| if let Incoming::Batch(b) = i { b.events.len() as u64 } else { 0 }).sum();
    assert!(failed.is_none());
    n
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let arg = |i: usize, d: u64| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (rounds, steps, ctx, batch) = (arg(0, 4), arg(1, 5), arg(2, 128) as i64, arg(3, 4) as i64);
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut off, mut on) = (Vec::new(), Vec::new());
    let mut recorded = Vec::new();
    for round in 0..rounds {
        // Alternate which goes first, so a trend in machine load does not favour one.
        for record in [round % 2 == 0, round % 2 == 1] {
            if record {
                let (t, s) = session(Some(&dir.path().join(format!("r{round}.vsrec"))), steps, ctx, batch);
                eprintln!("round {round} with:    {:.4} s", median(t.clone()));
                on.extend(t);
                recorded.push(s.expect("summary"));
            } else {
                let t = session(None, steps, ctx, batch).0;
                eprintln!("round {round} without: {:.4} s", median(t.clone()));
                off.extend(t);
            }
        }
    }
    let (off, on) = (median(off), median(on));
    println!("tiny, CPU, ctx {ctx}, batch {batch}: {rounds} rounds × {steps} steps, interleaved");
    println!("  median step without --record: {:.4} s", off);
    println!("  median step with --record:    {:.4} s  ({:+.2} %)", on, (on / off - 1.0) * 100.0);
    let (ev, by): (u64, u64) = recorded.iter().fold((0, 0), |a, s| (a.0 + s.events, a.1 + s.bytes));
    println!("  recorded: {ev} events in {by} bytes = {:.2} bytes/event ({} steps per recording)", by as f64 / ev as f64, steps + 1);
    // The recorder's own CPU time, free of scheduler noise: re-record the first recording.
    let mut script = Script::open(&recorded[0].path).expect("recording opens");
    let mut failed = None;
    let items: Vec<(u32, Incoming)> = script.stream(&mut failed).collect();
    let mut again = Recorder::create(&dir.path().join("again.vsrec")).expect("new recording");
    let t = std::time::Instant::now();
    for (i, (rank, item)) in items.iter().enumerate() {
        again.record(i as u64 * 10_000, *rank, item).expect("records");
    }
    let s = again.finish().expect("closes");
    let per_event = t.elapsed().as_nanos() as f64 / s.events as f64;
    let per_step_ms = per_event * s.events as f64 / (steps + 1) as f64 / 1e6;
    println!("  recorder CPU: {per_event:.0} ns/event = {per_step_ms:.2} ms per step ({:.2} % of a {off:.3} s step)", per_step_ms / 1e3 / off * 100.0);
    let samples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("recordings");
    let mut names: Vec<_> = std::fs::read_dir(&samples).expect("recordings/").flatten().map(|e| e.path()).collect();
    names.sort();
    for p in names.iter().filter(|p| p.extension().is_some_and(|e| e == "vsrec")) {
        let (n, bytes) = (events_in(p), std::fs::metadata(p).expect("size").len());
        println!("  {}: {n} events in {bytes} bytes = {:.2} bytes/event (gauge samples included)", p.file_name().unwrap().to_string_lossy(), bytes as f64 / n as f64);
    }
}
