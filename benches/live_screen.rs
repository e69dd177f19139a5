//! The live screen at a job's full event rate (issue 35): a stand-in job serves the dense
//! job's recorded stream (recordings/dense-mlp.vsrec, played round and round; with
//! `--synthetic`, a made-up training-shaped one) through the job's own server (a viewer's
//! bounded queue of 256 batches, as the hook's; zstd on the wire) at a set rate, in batches
//! of 10 ms, while the real binary watches it (`vramscope attach SOCKET`) in a 200×60 tmux
//! pane. Per rate: the events the server dropped for the screen (its queue full), the
//! screen's CPU, and whether the screen's own event count reached the last event sent.
//!
//!   cargo bench --bench live_screen -- [--synthetic] [SECONDS [EVENTS_PER_S...]]

use std::time::{Duration, Instant};

use vramscope_core::channel::dir::ensure_private_dir;
use vramscope_core::producer::server::{Listen, Log, Server};
use vramscope_core::source::gauges::host::parse_task_ticks;
use vramscope_core::stream::{monotonic_ns, EngineInfo, Incoming, Report};

mod common;
#[allow(dead_code)]
#[path = "../tests/common/tmux.rs"]
mod tmux;

/// What a job's hook queues for each viewer.
const QUEUE_BATCHES: usize = 256;
const BATCH_EVERY: Duration = Duration::from_millis(10);

/// User and system CPU seconds of process `pid`, all its threads.
fn process_cpu_s(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the screen's /proc stat");
    parse_task_ticks(&stat).expect("a stat line") as f64 / 100.0
}

/// The last event index the timeline's title shows ("events A–B").
fn shown_end(screen: &str) -> Option<u64> {
    let at = screen.find("events ")?;
    let range = screen[at + 7..].split_whitespace().next()?;
    range.split('–').nth(1)?.parse().ok()
}

struct Outcome {
    rate: u64,
    sent: u64,
    dropped: u64,
    cpu_percent: f64,
    caught_up_s: Option<f64>,
}

fn run(rate: u64, seconds: f64) -> Outcome {
    let dir = tempfile::tempdir().expect("a temp dir");
    let sockets = dir.path().join("sockets");
    ensure_private_dir(&sockets).expect("the socket dir");
    let path = sockets.join("bench-r0.sock");
    let log: Log = std::sync::Arc::new(|_: &str| {});
    let server = Server::bind(&Listen::Unix(path.clone()), QUEUE_BATCHES, log).expect("the server binds");
    let screen = tmux::Session::start("vramscope-live-screen", &format!("{} attach {}", env!("CARGO_BIN_EXE_vramscope"), path.display()));
    let deadline = Instant::now() + Duration::from_secs(20);
    let viewer = loop {
        if let Some(c) = server.take_joining().pop() {
            break c;
        }
        assert!(Instant::now() < deadline, "the screen never attached:\n{}", screen.screen());
        std::thread::sleep(Duration::from_millis(20));
    };
    let info = EngineInfo { device: "cpu".into(), name: "bench".into(), pid: std::process::id(), ..EngineInfo::default() };
    server.admit(viewer, vec![(monotonic_ns(), Incoming::Report(Report::Started(info)))]);
    screen.wait_for("the screen's first frame", 20, |s| s.contains("bench"));
    let pid = screen.display("#{pane_pid}");
    // The pane runs a shell that runs vramscope: its child is the screen.
    let screen_pid = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok().and_then(|c| c.split_whitespace().next().map(str::to_string)).unwrap_or(pid);

    let mut next: Box<dyn FnMut(usize) -> vramscope_core::event::Batch> = if std::env::args().any(|a| a == "--synthetic") {
        let mut s = common::stream::TrainingStream::new();
        Box::new(move |n| s.batch(n))
    } else {
        let mut s = common::stream::RecordedStream::new();
        Box::new(move |n| s.batch(n))
    };
    let cpu0 = process_cpu_s(&screen_pid);
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        if due > sent {
            let n = (due - sent) as usize;
            server.broadcast(monotonic_ns(), &Incoming::Batch(next(n)));
            sent += n as u64;
        }
        std::thread::sleep(BATCH_EVERY);
    }
    let cpu = process_cpu_s(&screen_pid) - cpu0;
    let wall = start.elapsed().as_secs_f64();
    let dropped = server.dropped_events();
    let caught_up_s = (0..100).find_map(|_| {
        if shown_end(&screen.screen()) == Some(sent) {
            return Some(start.elapsed().as_secs_f64() - wall);
        }
        std::thread::sleep(Duration::from_millis(100));
        None
    });
    Outcome { rate, sent, dropped, cpu_percent: cpu / wall * 100.0, caught_up_s }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let seconds: f64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(10.0);
    let mut rates: Vec<u64> = args.iter().skip(1).filter_map(|s| s.parse().ok()).collect();
    if rates.is_empty() {
        rates = vec![1_000_000, 2_000_000, 4_000_000];
    }
    let stream = if std::env::args().any(|a| a == "--synthetic") { "a made-up training-shaped stream" } else { "the dense job's recorded stream" };
    println!("the live screen fed {stream} for {seconds} s per rate, batches every {} ms, a viewer's queue of {QUEUE_BATCHES} batches", BATCH_EVERY.as_millis());
    println!("| events/s offered | events sent | dropped for the screen | screen CPU (% of one core) | screen caught up |");
    println!("|---:|---:|---:|---:|---|");
    for rate in rates {
        let o = run(rate, seconds);
        let caught = o.caught_up_s.map_or("no (after 10 s)".to_string(), |s| format!("{s:.1} s after the last batch"));
        println!("| {:.1} M | {} | {} | {:.0}% | {caught} |", o.rate as f64 / 1e6, o.sent, o.dropped, o.cpu_percent);
    }
}
