//! The allocator model against real snapshots: replay each trace from the state before
//! it and compare segment creations, block addresses and the final block layout.

mod common;

use vramscope::allocator::{replay_snapshot, AllocatorConfig};

fn replay(name: &str) -> vramscope::allocator::ReplayReport {
    let s = common::load(name);
    let cfg = s
        .allocator_settings
        .as_ref()
        .map(AllocatorConfig::from_settings)
        .unwrap_or_default();
    let (_, rep) = replay_snapshot(&s, 0, &cfg);
    eprintln!(
        "{name}: segment_alloc {}/{} ({:.1}%, {} extra), alloc addresses {}/{} ({:.1}%), final blocks {}/{} ({:.1}%)",
        rep.segment_allocs_matched,
        rep.segment_allocs,
        rep.segment_alloc_pct(),
        rep.segment_allocs_extra,
        rep.allocs_matched,
        rep.allocs,
        rep.alloc_pct(),
        rep.final_blocks_matched,
        rep.final_blocks,
        rep.final_block_pct()
    );
    rep
}

#[test]
fn kkaitlyn_trace_is_reproduced_exactly() {
    let rep = replay(common::KKAITLYN);
    assert_eq!(rep.segment_allocs, 289);
    assert_eq!(rep.segment_allocs_matched, 289);
    assert_eq!(rep.segment_allocs_extra, 0);
    assert_eq!(rep.allocs_matched, rep.allocs);
    assert_eq!(rep.final_blocks_matched, rep.final_blocks);
}

#[test]
fn magma27_trace_is_reproduced_exactly() {
    let rep = replay(common::MAGMA27);
    assert_eq!(rep.segment_allocs_extra, 0);
    assert_eq!(rep.allocs_matched, rep.allocs);
    assert_eq!(rep.final_blocks_matched, rep.final_blocks);
}
