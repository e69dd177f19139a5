//! The made-up blocks a trace or memory timeline becomes: addresses for allocations the file
//! does not place, and one-block segments for what is alive at its end.

use crate::snapshot::model::{Block, BlockState, Segment, SegmentType, StackId};

/// Where addresses are made up for a trace without them: above any real one.
pub const SYNTHETIC_BASE: u64 = 0x7e00_0000_0000_0000;

/// The next made-up address for a block of `size`.
pub fn made_up(next: &mut u64, size: u64) -> u64 {
    let a = *next;
    *next += size.next_multiple_of(512);
    a
}

/// A segment holding one allocation of `size` at `address` (a file without segments).
pub fn one_block_segment(device: i64, address: u64, size: u64, frames: StackId) -> Segment {
    Segment {
        device,
        address,
        total_size: size,
        allocated_size: size,
        active_size: size,
        requested_size: size,
        stream: 0,
        segment_type: SegmentType::Large,
        segment_pool_id: (0, 0),
        is_expandable: false,
        frames,
        blocks: vec![Block { address, size, requested_size: size, state: BlockState::ActiveAllocated, frames }],
    }
}
