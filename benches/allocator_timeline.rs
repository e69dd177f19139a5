//! Throughput of the allocator model and the timeline on trace-shaped streams.
//! Run: `cargo bench --bench allocator_timeline`

mod common;

use std::hint::black_box;
use std::time::Instant;

use vramscope_core::allocator::{AllocatorConfig, CachingAllocatorModel};
use vramscope_core::snapshot::model::Action;
use vramscope_core::snapshot::timeline::TimelineBuilder;

/// xorshift64: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Request sizes shaped like a transformer step: mostly small tensors, some activations
/// of a few MiB, a few large buffers.
fn request(r: &mut Rng) -> u64 {
    match r.next() % 100 {
        0..=59 => 4 + r.next() % (64 << 10),
        60..=89 => (1 << 20) + r.next() % (8 << 20),
        _ => (10 << 20) + r.next() % (80 << 20),
    }
}

/// (is_alloc, key, size): allocations mostly freed in LIFO order (activations), with a
/// bounded live set.
fn stream(n: usize) -> Vec<(bool, u64, u64)> {
    let mut r = Rng(0x2545f4914f6cdd1d);
    let mut live: Vec<u64> = Vec::new();
    let mut out = Vec::with_capacity(n);
    let mut key = 0;
    while out.len() < n {
        let grow = live.len() < 64 || (live.len() < 4000 && r.next().is_multiple_of(2));
        if grow {
            key += 1;
            live.push(key);
            out.push((true, key, request(&mut r)));
        } else {
            let i = if r.next().is_multiple_of(4) {
                (r.next() as usize) % live.len()
            } else {
                live.len() - 1
            };
            out.push((false, live.swap_remove(i), 0));
        }
    }
    out
}

fn bench_allocator() {
    let ops = stream(1_000_000);
    let mut best = f64::MAX;
    for _ in 0..3 {
        let mut m = CachingAllocatorModel::new(AllocatorConfig::default());
        let mut out = Vec::with_capacity(8);
        let t = Instant::now();
        for &(alloc, key, size) in &ops {
            out.clear();
            if alloc {
                m.malloc(key, size, 0, 0, &mut out);
            } else {
                m.free(key, &mut out);
            }
        }
        black_box(m.stats());
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "allocator model: {} malloc+free ops in {:.1} ms (best of 3) = {:.2} M ops/s",
        ops.len(),
        best * 1e3,
        ops.len() as f64 / best / 1e6
    );
}

fn bench_timeline() {
    let ops = stream(1_000_000);
    let t = Instant::now();
    let mut b = TimelineBuilder::new(vec!["unknown".into()]);
    for &(alloc, key, size) in &ops {
        if alloc {
            b.feed(Action::Alloc, key, size, 0, 0);
        } else {
            b.feed(Action::FreeRequested, key, 0, 0, 0);
            b.feed(Action::FreeCompleted, key, 0, 0, 0);
        }
    }
    let tl = b.finish();
    let build = t.elapsed().as_secs_f64();
    println!(
        "timeline build: {} actions in {:.1} ms ({:.1} ns/action)",
        tl.total_events,
        build * 1e3,
        build * 1e9 / tl.total_events as f64
    );
    let n = tl.total_events;
    for &(label, from, to) in &[
        ("full range", 0, n),
        ("1% window", n / 2, n / 2 + n / 100),
        ("zoomed past 1/bucket", n / 2, n / 2 + 100),
    ] {
        let reps = 1000;
        let t = Instant::now();
        for k in 0..reps {
            black_box(tl.series(from + k % 7, to, 240));
        }
        println!(
            "series({label}, 240 buckets): {:.1} µs/call",
            t.elapsed().as_secs_f64() * 1e6 / reps as f64
        );
    }
    let t = Instant::now();
    let view = tl.detail(15_000);
    println!("detail(15000): {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let reps = 20;
    let t = Instant::now();
    for k in 0..reps {
        black_box(tl.stacks(&view, k, n, 240));
    }
    println!(
        "stacks(full range, 240 buckets, 15000 drawn): {:.2} ms/call",
        t.elapsed().as_secs_f64() * 1e3 / reps as f64
    );
    let t = Instant::now();
    for k in 0..reps {
        black_box(tl.category_series(k, n, 240));
    }
    println!(
        "category_series(full range, 240 buckets): {:.1} µs/call",
        t.elapsed().as_secs_f64() * 1e6 / reps as f64
    );
}

/// A wrapped trace ring: the stream above with a quarter of its allocations fallen out
/// of the ring, so their frees are of blocks older than the trace, all along it. Such a
/// free once touched every earlier total (quadratic); the build must stay linear: 4x
/// the actions at most 5x the time.
///
/// Both sizes are timed on memory the process already holds. Otherwise the smaller build
/// reuses what the benches before it freed while the larger one faults in fresh pages,
/// and the ratio (7.5-8x) says where the memory came from, not how the build grows. Where
/// every size faulted in its own memory (sizes from 250 k to 8 M requests in turn, one
/// process, 2026-11-27), a request cost 50-61 ns at every size.
fn bench_timeline_ring() {
    // Freed memory stays with the process (glibc would unmap the large blocks, and trim
    // the heap's top), and the larger build runs first to grow it.
    // SAFETY: mallopt only tunes glibc's allocator; no allocation is under way.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
    let build = |n: usize| {
        let ops = stream(n);
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        let fell_out: std::collections::HashSet<u64> = ops.iter().filter(|o| o.0 && r.next().is_multiple_of(4)).map(|o| o.1).collect();
        let ring: Vec<(Action, u64, u64)> = ops
            .iter()
            .filter(|o| !(o.0 && fell_out.contains(&o.1)))
            .flat_map(|&(alloc, key, size)| match alloc {
                true => vec![(Action::Alloc, key, size)],
                false => vec![(Action::FreeRequested, key, 1 << 20), (Action::FreeCompleted, key, 1 << 20)],
            })
            .collect();
        // CPU time, best of 5: the figure a machine shared with other work disturbs least.
        let best = (0..5)
            .map(|_| {
                common::timed(|| {
                    let mut b = TimelineBuilder::new(vec!["unknown".into()]);
                    for &(action, key, size) in &ring {
                        b.feed(action, key, size, 0, 0);
                    }
                    black_box(b.finish());
                })
                .1
            })
            .fold(f64::INFINITY, f64::min);
        (best, fell_out.len())
    };
    let (large, _) = build(4_000_000);
    let (small, older) = build(1_000_000);
    let verdict = if large / small <= 5.0 { "ok" } else { "OVER" };
    println!(
        "timeline build, wrapped ring ({older} frees of older blocks in 1 M requests), CPU: 1 M requests {:.1} ms, 4 M {:.1} ms = {:.2}x (at most 5x): {verdict}",
        small * 1e3,
        large * 1e3,
        large / small
    );
}

fn main() {
    bench_allocator();
    bench_timeline();
    bench_timeline_ring();
}
