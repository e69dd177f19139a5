//! The allocator model against real snapshots: replay each trace from the state before
//! it and compare segment creations and releases, block addresses, out-of-memory failures
//! and the final block layout.

mod common;

use vramscope_core::allocator::{replay_snapshot, AllocatorConfig, ReplayReport};

fn replay(name: &str, device: usize) -> ReplayReport {
    let s = common::load(name);
    let cfg = s
        .allocator_settings
        .as_ref()
        .map(AllocatorConfig::from_settings)
        .unwrap_or_default();
    let (_, rep) = replay_snapshot(&s, device, &cfg);
    eprintln!("{name} device {device}: {rep}");
    rep
}

#[test]
fn kkaitlyn_trace_is_reproduced_exactly() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let rep = replay(common::KKAITLYN, 0);
    assert_eq!(rep.segment_allocs.recorded, 289);
    assert!(rep.exact(), "{rep}");
}

#[test]
fn magma27_trace_is_reproduced_exactly() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let rep = replay(common::MAGMA27, 0);
    assert!(rep.allocs.recorded > 1000);
    assert!(rep.exact(), "{rep}");
}

/// `expandable_segments:True` on three GPUs: every page mapping and unmapping, every
/// block address, the out-of-memory failure on device 1 and the final blocks.
#[test]
fn expandable_segments_trace_is_reproduced_exactly_on_every_device() {
    if common::skip_without_real_snapshots() {
        return;
    }
    // (device, allocs, segment_map, segment_unmap, oom) in the recording.
    for (device, allocs, maps, unmaps, ooms) in [(0, 2434, 175, 0, 0), (1, 199, 40, 6, 1), (2, 392, 78, 0, 0)] {
        let rep = replay(common::CONSTRUCTOR_SUN, device);
        assert_eq!(
            (rep.allocs.recorded, rep.segment_maps.recorded, rep.segment_unmaps.recorded, rep.ooms.recorded),
            (allocs, maps, unmaps, ooms)
        );
        assert!(rep.final_blocks.recorded > 0);
        assert!(rep.exact(), "device {device}: {rep}");
    }
}
