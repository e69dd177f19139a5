//! Capture overhead: step time of the `small` preset on CPU with capture on vs off,
//! interleaved in one run so machine noise hits both alike. Target ≤ 1.02×.
//!
//!   cargo bench --bench capture_overhead -- [rounds] [ctx] [batch]

#[path = "../../benches/common/mod.rs"]
mod common;

use vramscope_core::producer::session::Capture;
use vramscope_core::source::job::Output;
use vramscope_core::source::launch::launch_engine;
use vramscope_core::step_config::Preset;
use vramscope_core::stream::{Incoming, Report};
use vramscope_engine::capture;

/// CPU seconds `who` (this process, or its children that have ended) has used.
fn cpu_s(who: i32) -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid rusage out-pointer.
    unsafe { libc::getrusage(who, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn process_cpu_s() -> f64 {
    cpu_s(libc::RUSAGE_SELF)
}

/// CPU seconds of /proc/<pid>/stat's utime + stime (a running child's own threads).
fn child_cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat; after the ")" they are 12th and 13th.
    (ticks(11) + ticks(12)) / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// (median wall seconds per step, CPU seconds per step) over `steps` steps after one
/// warm-up step of the engine process, consumed as `run --headless` does. CPU time is
/// steadier than wall time on a shared machine.
fn measure(capture: bool, ctx: i64, batch: i64, steps: u64) -> (f64, f64) {
    let mut o = common::cpu_train(Preset::Small, ctx, batch, steps);
    o.capture = capture;
    let source = launch_engine(&o, Output::Capture).expect("the engine starts");
    let pid = source.child_pid().expect("a child");
    let mut times = Vec::new();
    let mut cpu_after_warmup = None;
    let mut cpu_at_end = 0.0;
    while let Some((_, item)) = source.next() {
        match item {
            Incoming::Report(Report::Step(s)) if s.step == 0 => cpu_after_warmup = Some(child_cpu_s(pid)),
            Incoming::Report(Report::Step(s)) => {
                times.push(s.step_time_s);
                cpu_at_end = child_cpu_s(pid);
            }
            Incoming::Report(Report::Error(e)) => panic!("{e}"),
            _ => {}
        }
    }
    times.sort_by(f64::total_cmp);
    let cpu = (cpu_at_end - cpu_after_warmup.expect("a warm-up step")) / times.len() as f64;
    (times[times.len() / 2], cpu)
}

/// CPU cost of the capture's own work per raw event on the training thread: the tracker
/// (allocator model, categories, trace ring) over a training-shaped CPU request stream.
/// The shim's side (a mutex and a push per allocation) is included by recording through it.
fn per_event_cost_ns() -> f64 {
    use vramscope_core::producer::tracker::Tracker;
    let n = 1_000_000usize;
    // Allocate and free real CPU tensors through the recording allocator would mix in
    // libtorch's own cost; instead feed the tracker the shape of a step directly.
    let raw = common::training_requests(n);
    let mut tracker = Tracker::modelled(vramscope_core::allocator::AllocatorConfig::default());
    let t = process_cpu_s();
    for chunk in raw.chunks(8192) {
        tracker.ingest(chunk);
        std::hint::black_box(tracker.take_batch(Vec::new()));
    }
    let tracker_s = process_cpu_s() - t;
    // The shim's part: allocate and free small CPU tensors through libtorch with recording
    // on and off, interleaved; the difference per event is what recording adds.
    capture::install_cpu_allocator().expect("shim installs");
    let mut out = Vec::with_capacity(1 << 16);
    let mut loop_s = |on: bool| {
        capture::set_capture_enabled(on);
        let t = process_cpu_s();
        for _ in 0..50 {
            for _ in 0..2000 {
                drop(std::hint::black_box(tch::Tensor::empty([16], (tch::Kind::Float, tch::Device::Cpu))));
            }
            out.clear();
            capture::Shim.drain(&mut out);
        }
        process_cpu_s() - t
    };
    let (mut on, mut off) = (0.0, 0.0);
    for _ in 0..5 {
        on += loop_s(true);
        off += loop_s(false);
    }
    // 5 rounds × 50 × 2000 tensors, each an alloc and a free.
    let shim_s = ((on - off) / (5.0 * 50.0 * 2000.0 * 2.0)).max(0.0) * n as f64;
    (tracker_s + shim_s) / n as f64 * 1e9
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let rounds: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(4);
    let ctx: i64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(128);
    let batch: i64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let per_event = per_event_cost_ns();
    println!("capture work per raw event on the training thread (shim record + tracker): {per_event:.0} ns CPU");
    if rounds == 0 {
        return;
    }
    println!("capture overhead: small preset, CPU, ctx {ctx}, batch {batch}, {rounds} interleaved rounds of 3 steps each");
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        // Alternate which goes first so warm caches favour neither.
        let order = if r % 2 == 0 { [true, false] } else { [false, true] };
        for capture in order {
            let (wall, cpu) = measure(capture, ctx, batch, 3);
            println!("  round {r}: capture {:<3} {wall:.3} s/step wall, {cpu:.3} CPU-s/step", if capture { "on" } else { "off" });
            if capture { on.push((wall, cpu)) } else { off.push((wall, cpu)) }
        }
    }
    let mean = |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| v.iter().map(f).sum::<f64>() / v.len() as f64;
    let (wall_on, wall_off) = (mean(&on, |p| p.0), mean(&off, |p| p.0));
    let (cpu_on, cpu_off) = (mean(&on, |p| p.1), mean(&off, |p| p.1));
    println!("capture on  {wall_on:.3} s/step wall, {cpu_on:.3} CPU-s/step");
    println!("capture off {wall_off:.3} s/step wall, {cpu_off:.3} CPU-s/step");
    println!("ratio on/off: wall {:.4}×, CPU {:.4}× (target ≤ 1.02×)", wall_on / wall_off, cpu_on / cpu_off);
}
