//! The Active Memory Timeline on real snapshots against an independent Python version of
//! memory_viz's algorithm (reading the pickle directly).

mod common;

use vramscope_core::snapshot::timeline::Timeline;

fn check(name: &str) {
    let want = common::MemoryVizTimeline::of(&common::fixture_path(name), 0);
    let during = want.during.clone();
    let t = Timeline::from_snapshot(&common::load(name), 0);
    let got: Vec<u64> = (0..t.total_events).map(|i| t.totals_at(i)).collect();
    assert_eq!(got.len(), during.len(), "{name}: action count");
    assert_eq!(got, during, "{name}: totals per action");
    let peak = *during.iter().max().unwrap();
    assert_eq!(t.peak_bytes, peak, "{name}: peak");
    assert_eq!(
        t.peak_index,
        during.iter().position(|&v| v == peak).unwrap()
    );
    assert_eq!(t.allocations.len(), want.elements);
    let initial = t.allocations.iter().filter(|a| a.alive_at_start).count();
    assert_eq!(initial, want.initial);
    eprintln!(
        "{name}: {} actions, {} allocations ({initial} alive at start), peak {peak} B at action {}",
        t.total_events,
        t.allocations.len(),
        t.peak_index
    );
}

#[test]
fn kkaitlyn_timeline_matches_memory_viz() {
    if common::skip_without_real_snapshots() {
        return;
    }
    check(common::KKAITLYN);
}

#[test]
fn magma27_timeline_matches_memory_viz() {
    if common::skip_without_real_snapshots() {
        return;
    }
    check(common::MAGMA27);
}

#[test]
fn snapviewer_timeline_matches_memory_viz() {
    if common::skip_without_real_snapshots() {
        return;
    }
    check(common::SNAPVIEWER);
}
