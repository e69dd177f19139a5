//! What an `s` press costs the training thread with a full trace ring (1 M entries, the
//! CPU allocator model): the cut it makes (`SnapshotCut::take`, plain copies) against the
//! conversion it hands to the writer thread (`into_snapshot`), which it used to do itself.
//!
//!   cargo bench --bench snapshot_cut

mod common;

use std::time::Instant;

use vramscope_core::producer::cut::{FrameTables, SnapshotCut};
use vramscope_core::producer::tracker::Tracker;

fn main() {
    let mut tracker = Tracker::modelled(vramscope_core::allocator::AllocatorConfig::default());
    for chunk in common::training_requests(1_500_000).chunks(8192) {
        tracker.ingest(chunk);
        std::hint::black_box(tracker.take_batch(Vec::new()));
    }
    let frames = FrameTables::new(vramscope_core::snapshot::model::Frame { name: "bench".into(), filename: "benches/snapshot_cut.rs".into(), line: 0 });
    println!("trace ring: {} entries", tracker.trace().count());
    println!("run  take_ms (training thread)  convert_ms (writer thread)  take / (take + convert)");
    for run in 1..=5 {
        let t = Instant::now();
        let cut = SnapshotCut::take(&tracker, &frames, None, 0);
        let take = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        let snap = cut.into_snapshot().expect("a modelled cut converts");
        let convert = t.elapsed().as_secs_f64() * 1e3;
        assert!(snap.trace_entry_count() >= 1_000_000);
        println!("{run}  {take:.1}  {convert:.1}  {:.2}", take / (take + convert));
    }
}
