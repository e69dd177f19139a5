//! The model to and from a snapshot's segment list: starting from a snapshot's segments,
//! and listing its own as a snapshot has them.

use super::expandable::loads_as_expandable;
use super::state::{CachingAllocatorModel, Seg, NIL};
use crate::allocator::config::AllocatorConfig;
use crate::snapshot::model::{Block, BlockState, Segment, SegmentType};

impl CachingAllocatorModel {
    /// Starts from existing segments (a snapshot's state). Active blocks become live
    /// allocations keyed by their address; inactive blocks go to the free lists.
    /// Expandable segments of one stream and pool share an address reservation, with
    /// the gaps between them unmapped.
    pub fn from_segments(cfg: AllocatorConfig, segments: &[Segment]) -> Self {
        let mut m = Self::new(cfg);
        let mut sorted: Vec<&Segment> = segments.iter().collect();
        sorted.sort_by_key(|s| s.address);
        for s in sorted.iter().filter(|s| !loads_as_expandable(s)) {
            let pool = m.pool_index(s.stream, s.segment_type == SegmentType::Small);
            let seg = m.push_seg(Seg {
                addr: s.address,
                size: s.total_size,
                stream: s.stream,
                pool,
                head: NIL,
                frames: s.frames,
                live: true,
                page: None,
            });
            m.stats.reserved_bytes += s.total_size;
            m.stats.segments += 1;
            let nodes = s.blocks.iter().map(|b| m.block_node(seg, b)).collect();
            m.link_chain(seg, nodes);
            m.bump_next_addr(s.address + s.total_size);
        }
        m.load_expandable(&sorted);
        m.reset_peaks();
        m
    }

    /// Segments in address order with their blocks, as a snapshot's `segments` list: one
    /// per cudaMalloc, and one per run of mapped memory in an expandable segment.
    pub fn segments(&self, device: i64) -> Vec<Segment> {
        let mut out: Vec<Segment> = Vec::with_capacity(self.stats.segments as usize);
        for s in self.segs.iter().filter(|s| s.live) {
            let mut cur = s.head;
            while cur != NIL {
                if !self.nodes[cur as usize].mapped {
                    cur = self.nodes[cur as usize].next;
                    continue;
                }
                let start = self.nodes[cur as usize].addr;
                let mut blocks = Vec::new();
                while cur != NIL && self.nodes[cur as usize].mapped {
                    let n = &self.nodes[cur as usize];
                    blocks.push(Block {
                        address: n.addr,
                        size: n.size,
                        requested_size: n.requested,
                        state: if n.allocated {
                            BlockState::ActiveAllocated
                        } else {
                            BlockState::Inactive
                        },
                        frames: n.frames,
                    });
                    cur = n.next;
                }
                let active = blocks.iter().filter(|b| b.state.is_active());
                let allocated: u64 = active.clone().map(|b| b.size).sum();
                out.push(Segment {
                    device,
                    address: start,
                    total_size: blocks.iter().map(|b| b.size).sum(),
                    allocated_size: allocated,
                    active_size: allocated,
                    requested_size: active.map(|b| b.requested_size).sum(),
                    stream: s.stream,
                    segment_type: if self.pools[s.pool as usize].small {
                        SegmentType::Small
                    } else {
                        SegmentType::Large
                    },
                    segment_pool_id: (0, 0),
                    is_expandable: s.page.is_some(),
                    // Only a segment's first mapping remembers who caused it.
                    frames: if start == s.addr {
                        s.frames
                    } else {
                        self.empty_stack
                    },
                    blocks,
                });
            }
        }
        out.sort_by_key(|s| s.address);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::model::ops::ModelOp;
    use crate::allocator::model::state::MODEL_BASE_ADDR;
    use crate::allocator::model::testing::{alloc, free, model, MIB};

    #[test]
    fn segments_report_contiguous_blocks_and_sizes() {
        let mut m = model("");
        alloc(&mut m, 1, 3 * MIB + 5, 0);
        alloc(&mut m, 2, 700, 0);
        for s in m.segments(0) {
            let mut addr = s.address;
            for b in &s.blocks {
                assert_eq!(b.address, addr);
                addr += b.size;
            }
            assert_eq!(addr, s.address + s.total_size);
            assert_eq!(
                s.allocated_size,
                s.blocks
                    .iter()
                    .filter(|b| b.state.is_active())
                    .map(|b| b.size)
                    .sum::<u64>()
            );
        }
        let st = m.stats();
        assert_eq!(st.allocated_bytes, 3 * MIB + 512 + 1024);
        assert!(
            (m.fragmentation() - (1.0 - st.allocated_bytes as f64 / (22 * MIB) as f64)).abs()
                < 1e-12
        );
        assert_eq!(m.largest_free_block(), 20 * MIB - (3 * MIB + 512));
    }

    #[test]
    fn starts_from_snapshot_segments() {
        let mut m = model("");
        alloc(&mut m, 1, 4 * MIB, 0);
        alloc(&mut m, 2, 4 * MIB, 0);
        free(&mut m, 1);
        let mut again =
            CachingAllocatorModel::from_segments(AllocatorConfig::default(), &m.segments(0));
        assert_eq!(again.stats().allocated_bytes, 4 * MIB);
        let ops = alloc(&mut again, 9, 4 * MIB, 0);
        assert_eq!(
            ops,
            vec![ModelOp::Alloc {
                addr: MODEL_BASE_ADDR,
                size: 4 * MIB,
                block_size: 4 * MIB
            }]
        );
        // Live blocks are keyed by their address.
        assert!(again.free(MODEL_BASE_ADDR + 4 * MIB, &mut Vec::new()));
        // New segments do not overlap the loaded ones.
        let ops = alloc(&mut again, 10, 30 * MIB, 0);
        assert_eq!(
            ops[0],
            ModelOp::SegmentAlloc {
                addr: MODEL_BASE_ADDR + 20 * MIB,
                size: 30 * MIB
            }
        );
    }
}
