//! Where the live path's time goes, stage by stage, for two streams of allocator events
//! (issue 35): the dense job's, recorded (recordings/dense-mlp.vsrec), and a synthetic one
//! with a few thousand allocations live and freed in random order, which keeps the
//! allocator model's free lists long. The stages: the shim's record call and the drain
//! (the job's allocating thread and its flusher), the tracker with the caching-allocator
//! model, the wire encoder, the socket, and on the screen's side the decoder, the store's
//! ingest and one frame's render. Every stage runs in this one process in one run, so the
//! figures compare side by side. CPU time of the thread doing the work, per allocation
//! event; the socket is wall time (two threads).
//!
//!   cargo bench -p vramscope-engine --bench live_path -- [synthetic events]

#[path = "../../benches/common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::time::Instant;

use vramscope::draw::draw_to_buffer;
use vramscope::keys::KeyMap;
use vramscope::screens::live::render::render_live;
use vramscope::screens::live::view::View;
use vramscope::theme::Theme;
use vramscope_core::event::Batch;
use vramscope_core::producer::raw::RawEvent;
use vramscope_core::producer::server::WIRE_ZSTD_LEVEL;
use vramscope_core::producer::session::Capture;
use vramscope_core::producer::tracker::Tracker;
use vramscope_core::store::Store;
use vramscope_core::stream::chunk::{header, ChunkReader, ChunkWriter};
use vramscope_core::stream::codec::Record;
use vramscope_core::stream::Incoming;
use vramscope_engine::capture;

fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec out-pointer for the calling thread's clock.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// CPU seconds `f` takes on this thread, best of `runs` (the least disturbed run).
fn best_of(runs: usize, mut f: impl FnMut()) -> f64 {
    (0..runs)
        .map(|_| {
            let t = thread_cpu_s();
            f();
            thread_cpu_s() - t
        })
        .fold(f64::MAX, f64::min)
}

/// The shim's record call and the drain, per event: small CPU tensors made and freed
/// through libtorch with recording on and off (the difference is the record call), and
/// the drain of what they recorded.
fn shim_stages() -> (f64, f64) {
    capture::install_cpu_allocator().expect("the shim installs");
    let tensors = 2000;
    let mut out: Vec<RawEvent> = Vec::with_capacity(1 << 16);
    let mut drain_s = 0.0;
    let mut drained = 0usize;
    let mut run = |on: bool, drain_s: &mut f64, drained: &mut usize| {
        capture::set_capture_enabled(on);
        let t = thread_cpu_s();
        for _ in 0..tensors {
            drop(std::hint::black_box(tch::Tensor::empty([16], (tch::Kind::Float, tch::Device::Cpu))));
        }
        let made = thread_cpu_s() - t;
        out.clear();
        let d = thread_cpu_s();
        capture::Shim.drain(&mut out);
        *drain_s += thread_cpu_s() - d;
        *drained += out.len();
        made
    };
    let (mut on, mut off) = (f64::MAX, f64::MAX);
    for _ in 0..200 {
        on = on.min(run(true, &mut drain_s, &mut drained));
        off = off.min(run(false, &mut drain_s, &mut drained));
    }
    let record = ((on - off) / (2 * tensors) as f64).max(0.0);
    (record, drain_s / drained.max(1) as f64)
}

struct Row {
    stage: &'static str,
    side: &'static str,
    seconds_per_event: f64,
}

fn main() {
    let n: usize = std::env::args().skip(1).find(|a| !a.starts_with("--")).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let (record, drain) = shim_stages();
    let shim = [
        Row { stage: "shim record call (alloc or free)", side: "job, allocating thread", seconds_per_event: record },
        Row { stage: "drain the shim's buffer", side: "job, flusher thread", seconds_per_event: drain },
    ];
    let recorded = common::recorded_requests();
    println!("The dense job's recorded stream (recordings/dense-mlp.vsrec, 400 steps):");
    stream_stages(&recorded, &shim);
    println!();
    println!("A synthetic stream with a few thousand allocations live, freed in random order:");
    stream_stages(&common::training_requests(n), &shim);
}

/// Every stage after the shim's for one stream of raw events, printed as one table.
fn stream_stages(raw: &[RawEvent], shim: &[Row]) {
    let n = raw.len();
    let mut rows: Vec<&Row> = shim.iter().collect();
    let mut owned = Vec::new();

    // The tracker and the allocator model, as the flusher runs them, 8192 events a drain,
    // in the steady state of a long job: the trace ring full and the model's pools grown
    // (each pass gives the stream addresses of its own). The flusher hands each batch to
    // the writer threads, which drop it once encoded: timed passes drop theirs, and one
    // more pass keeps its batches for the stages after.
    let mut tracker = Tracker::modelled(vramscope_core::allocator::AllocatorConfig::default());
    let mut pass = 0u64;
    let mut run_pass = |tracker: &mut Tracker, keep: Option<&mut Vec<Batch>>| {
        pass += 1;
        let moved: Vec<RawEvent> = raw.iter().map(|e| RawEvent { addr: e.addr + (pass << 40), ..*e }).collect();
        let mut kept = Vec::new();
        let t = thread_cpu_s();
        for chunk in moved.chunks(8192) {
            tracker.ingest(chunk);
            kept.push(tracker.take_batch(Vec::new()));
            if keep.is_none() {
                kept.clear();
            }
        }
        let spent = thread_cpu_s() - t;
        if let Some(k) = keep {
            *k = kept;
        }
        spent
    };
    while tracker.trace().len() < vramscope_core::producer::tracker::RING_ENTRIES {
        run_pass(&mut tracker, None);
    }
    let tracking = (0..3).map(|_| run_pass(&mut tracker, None)).fold(f64::MAX, f64::min);
    let mut batches = Vec::new();
    run_pass(&mut tracker, Some(&mut batches));
    let events: usize = batches.iter().map(|b: &Batch| b.events.len()).sum();
    owned.push(Row { stage: "tracker + caching-allocator model", side: "job, flusher thread", seconds_per_event: tracking / n as f64 });

    // The wire: a viewer's writer thread encodes (zstd level as served).
    let mut wire = Vec::new();
    let encoding = best_of(3, || {
        let mut w = ChunkWriter::new(WIRE_ZSTD_LEVEL, u64::MAX);
        wire = header().to_vec();
        for (i, b) in batches.iter().enumerate() {
            for c in w.push(i as u64, 0, &Incoming::Batch(b.clone())).expect("encodes") {
                wire.extend(c);
            }
        }
        wire.extend(w.end().into_iter().flatten());
    });
    owned.push(Row { stage: "encode (wire format, zstd 1)", side: "job, writer thread", seconds_per_event: encoding / n as f64 });

    // The socket: the bytes through a Unix stream pair, read on another thread.
    let (mut a, mut b) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
    let bytes = wire.len();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0;
        while got < bytes {
            got += b.read(&mut buf).expect("reads");
        }
    });
    let t = Instant::now();
    a.write_all(&wire).expect("writes");
    reader.join().expect("the reader");
    owned.push(Row { stage: "Unix socket, write and read (wall)", side: "both", seconds_per_event: t.elapsed().as_secs_f64() / n as f64 });

    // The screen: decode, then ingest into the store.
    let mut decoded: Vec<Batch> = Vec::new();
    let decoding = best_of(3, || {
        decoded.clear();
        let mut r = ChunkReader::new(&wire[..]).expect("the header reads");
        while let Some(records) = r.next_chunk().expect("decodes") {
            for rec in records {
                if let Record::Item { item: Incoming::Batch(b), .. } = rec {
                    decoded.push(b);
                }
            }
        }
    });
    owned.push(Row { stage: "decode", side: "screen", seconds_per_event: decoding / n as f64 });
    let mut store = Store::new(4 << 20);
    let ingest = best_of(3, || {
        store = Store::new(4 << 20);
        for b in decoded.iter().cloned() {
            store.ingest_batch(b);
        }
    });
    owned.push(Row { stage: "store ingest", side: "screen", seconds_per_event: ingest / n as f64 });

    let (theme, keys) = (Theme::load("dark").expect("built-in theme"), KeyMap::default());
    let mut frames: Vec<f64> = (0..20)
        .map(|_| {
            let t = thread_cpu_s();
            std::hint::black_box(draw_to_buffer(200, 60, |f| render_live(f, &store, &Default::default(), &View::default(), &keys, &theme)));
            thread_cpu_s() - t
        })
        .collect();
    frames.sort_by(f64::total_cmp);
    let frame = frames[frames.len() / 2];

    rows.extend(owned.iter());
    // Every stage per allocation event (an alloc or a free the shim records), so that the
    // job's stages add up to what one allocation event costs the job.
    println!("{n} allocation events ({events} stream events after the allocator model), {} bytes on the wire ({:.2} B per stream event)", wire.len(), wire.len() as f64 / events as f64);
    println!("| stage | where | ns per allocation event | allocation events/s on one core |");
    println!("|---|---|---:|---:|");
    for r in &rows {
        println!("| {} | {} | {:.1} | {:.2} M |", r.stage, r.side, r.seconds_per_event * 1e9, 1e-6 / r.seconds_per_event.max(1e-12));
    }
    let side = |s: &str| rows.iter().filter(|r| r.side.starts_with(s)).map(|r| r.seconds_per_event).sum::<f64>();
    println!("| **job, all threads** | | {:.1} | {:.2} M |", side("job") * 1e9, 1e-6 / side("job"));
    println!("| **screen, decode + ingest** | | {:.1} | {:.2} M |", side("screen") * 1e9, 1e-6 / side("screen"));
    println!("render one 200×60 frame of the live screen: {:.2} ms CPU ({:.1}% of a core at 20 frames/s)", frame * 1e3, frame * 20.0 * 100.0);
}
