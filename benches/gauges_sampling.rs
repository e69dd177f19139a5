//! Cost of the gauge thread: CPU time the sampler thread uses per wall second, at the
//! default interval, read from /proc/self/task/<tid>/{schedstat,stat} for that thread only.
//! `cargo bench --bench gauges_sampling [-- SECONDS]` (default 10 s).

use std::fs;
use std::time::{Duration, Instant};

use vramscope_core::source::gauges::host::{clock_ticks_per_sec, parse_task_ticks};
use vramscope_core::source::gauges::sampler::THREAD_NAME;
use vramscope_core::source::gauges::{spawn_gauges, GaugeConfig, GaugeReader, HostReader};

fn sampler_tid() -> u32 {
    fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|tid| {
            fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
                .is_ok_and(|c| c.trim_end() == THREAD_NAME)
        })
        .expect("the sampler thread is running")
}

/// (ns on CPU from schedstat, utime+stime ticks from stat) of one thread.
fn thread_cpu(tid: u32) -> (u64, u64) {
    let sched = fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).expect("schedstat");
    let ns = sched
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .expect("schedstat ns");
    let stat = fs::read_to_string(format!("/proc/self/task/{tid}/stat")).expect("stat");
    (ns, parse_task_ticks(&stat).expect("stat ticks"))
}

fn main() {
    let secs: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10);
    let cfg = GaugeConfig::default();
    let interval = cfg.interval;

    // Cost of one host sample in isolation, for reference.
    let mut reader = HostReader::open(vramscope_core::source::gauges::Watched::default()).expect("host gauges");
    let n = 2000;
    let t = Instant::now();
    for _ in 0..n {
        reader.sample().expect("host sample");
    }
    let per_sample = t.elapsed() / n;

    let (tx, rx) = crossbeam_channel::bounded(64);
    let handle = spawn_gauges(cfg, tx);
    let first = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("first batch");
    let status = first.status.expect("source status");
    let tid = sampler_tid();
    let (ns0, ticks0) = thread_cpu(tid);
    let t0 = Instant::now();
    let mut samples = 0usize;
    while t0.elapsed() < Duration::from_secs(secs) {
        if let Ok(b) = rx.recv_timeout(Duration::from_millis(500)) {
            samples += b.samples.len();
        }
    }
    let (ns1, ticks1) = thread_cpu(tid);
    let wall = t0.elapsed().as_secs_f64();
    drop(handle);

    let sched_pct = 100.0 * (ns1 - ns0) as f64 / 1e9 / wall;
    let stat_pct = 100.0 * (ticks1 - ticks0) as f64 / clock_ticks_per_sec() as f64 / wall;
    println!(
        "source: {} ({})",
        status.kind.as_str(),
        status.reason.as_deref().unwrap_or("-")
    );
    println!(
        "interval {} ms, {wall:.1} s wall, {samples} samples received",
        interval.as_millis()
    );
    println!(
        "one host sample alone: {:.1} µs",
        per_sample.as_secs_f64() * 1e6
    );
    println!("sampler thread CPU (schedstat): {sched_pct:.3}% of one core");
    println!("sampler thread CPU (stat ticks): {stat_pct:.3}% of one core");
}
