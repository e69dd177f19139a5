//! Live-screen costs with a long history: ingest rate into the store (target ≥ 20 M
//! events/s) and the time to render one 200×60 frame with 1 M events (target ≤ 5 ms).
//!
//!   cargo bench --bench screen

use std::time::Instant;

mod common;

use vramscope::draw::draw_to_buffer;
use vramscope::screens::live::render::render_live;
use vramscope::theme::Theme;
use vramscope_core::store::Store;
use vramscope::keys::KeyMap;
use vramscope::screens::live::view::View;

/// CPU time of this thread: on a shared 2-core machine, wall time mostly measures the
/// other processes; CPU time measures the work.
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec out-pointer for the calling thread's clock.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn main() {
    let n = 1_000_000;
    let batches = common::stream::training_batches(n);
    // Ingest: best of 5 runs into fresh stores, wall and CPU time.
    let (mut best_wall, mut best_cpu) = (f64::MAX, f64::MAX);
    let mut store = Store::new(4 << 20);
    for _ in 0..5 {
        let mut s = Store::new(4 << 20);
        let input = batches.clone();
        let (t, c) = (Instant::now(), thread_cpu_s());
        for b in input {
            s.ingest_batch(b);
        }
        best_cpu = best_cpu.min(thread_cpu_s() - c);
        best_wall = best_wall.min(t.elapsed().as_secs_f64());
        store = s;
    }
    println!(
        "ingest: {n} events: wall {:.1} ms = {:.1} M events/s; CPU {:.1} ms = {:.1} M events/s per core (target ≥ 20)",
        best_wall * 1e3,
        n as f64 / best_wall / 1e6,
        best_cpu * 1e3,
        n as f64 / best_cpu / 1e6
    );

    let theme = Theme::load("dark").expect("built-in theme");
    let keys = KeyMap::default();
    for (label, view) in [
        ("whole history", View { window: store.history.end(), ..View::default() }),
        ("live tail (default zoom)", View::default()),
        ("whole history, by allocation", View { window: store.history.end(), by_category: false, ..View::default() }),
    ] {
        let runs = 20;
        let (mut wall, mut cpu): (Vec<f64>, Vec<f64>) = (0..runs)
            .map(|_| {
                let (t, c) = (Instant::now(), thread_cpu_s());
                let buf = draw_to_buffer(200, 60, |f| render_live(f, &store, &Default::default(), &view, &keys, &theme));
                std::hint::black_box(buf);
                (t.elapsed().as_secs_f64(), thread_cpu_s() - c)
            })
            .unzip();
        wall.sort_by(f64::total_cmp);
        cpu.sort_by(f64::total_cmp);
        println!(
            "render 200×60, {n} events, {label}: median wall {:.2} ms, CPU {:.2} ms (target ≤ 5)",
            wall[runs / 2] * 1e3,
            cpu[runs / 2] * 1e3
        );
    }
}
