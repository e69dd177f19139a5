//! What a request does: size rounding, best fit from the stream's pool with the
//! max_split_size rules, splitting, merge of free neighbours on free, new segments and,
//! when the device's capacity is set, the out-of-memory path (free cached memory, retry,
//! fail); `empty_cache`.

use super::ops::ModelOp;
use super::state::{CachingAllocatorModel, Node, Seg, NIL};
use crate::allocator::config::{round_size, segment_size, MIN_BLOCK_SIZE, SMALL_SIZE};
use crate::snapshot::model::StackId;

impl CachingAllocatorModel {
    /// Rounded block size for a request under this configuration.
    pub fn block_size(&self, size: u64) -> u64 {
        round_size(size, &self.divisions)
    }

    /// `key` identifies the allocation for its free (a CPU pointer, or a trace address).
    /// A key that is still live is freed first: its free was lost. Returns false when the
    /// device is out of memory (only with a capacity set); nothing is allocated then, but
    /// `out` holds what the attempt did (segments released or mapped).
    pub fn malloc(
        &mut self,
        key: u64,
        size: u64,
        stream: i64,
        frames: StackId,
        out: &mut Vec<ModelOp>,
    ) -> bool {
        if self.live.contains_key(&key) {
            self.free(key, out);
        }
        let rounded = round_size(size, &self.divisions);
        let small = rounded <= SMALL_SIZE;
        let pool = self.pool_index(stream, small);
        // PyTorch's order: a cached block; new memory; new memory after releasing
        // oversize cached blocks; new memory after releasing everything cached.
        let found = match self.best_fit(pool, rounded) {
            Some(idx) => {
                self.pool_remove(idx);
                Some(idx)
            }
            None => self
                .alloc_block(pool, rounded, frames, out)
                .or_else(|| {
                    self.release_available_cached_blocks(pool, rounded, out)
                        .then(|| self.alloc_block(pool, rounded, frames, out))
                        .flatten()
                })
                .or_else(|| {
                    self.empty_cache(out);
                    self.alloc_block(pool, rounded, frames, out)
                }),
        };
        let Some(idx) = found else {
            self.stats.ooms += 1;
            return false;
        };
        let remaining = self.nodes[idx as usize].size - rounded;
        let split = if small || self.cfg.expandable_segments {
            remaining >= MIN_BLOCK_SIZE
        } else {
            rounded < self.max_split && remaining > SMALL_SIZE
        };
        if split {
            let n = &self.nodes[idx as usize];
            let rest = Node {
                prev: idx,
                next: n.next,
                ..Node::free(n.addr + rounded, remaining, n.segment, self.empty_stack, true)
            };
            let r = self.new_node(rest);
            let old_next = self.nodes[idx as usize].next;
            if old_next != NIL {
                self.nodes[old_next as usize].prev = r;
            }
            let n = &mut self.nodes[idx as usize];
            n.next = r;
            n.size = rounded;
            self.pool_insert(r);
        }
        let n = &mut self.nodes[idx as usize];
        n.allocated = true;
        n.requested = size;
        n.frames = frames;
        let (addr, block_size) = (n.addr, n.size);
        self.live.insert(key, idx);
        self.count_alloc(block_size, size);
        out.push(ModelOp::Alloc {
            addr,
            size,
            block_size,
        });
        true
    }

    /// Unknown keys are ignored (returns false).
    pub fn free(&mut self, key: u64, out: &mut Vec<ModelOp>) -> bool {
        let Some(idx) = self.live.remove(&key) else {
            return false;
        };
        let n = &mut self.nodes[idx as usize];
        n.allocated = false;
        let (addr, size, block_size) = (n.addr, n.requested, n.size);
        n.requested = 0;
        n.frames = self.empty_stack;
        let s = &mut self.stats;
        s.allocated_bytes -= block_size;
        s.active_bytes -= block_size;
        s.requested_bytes -= size;
        s.blocks -= 1;
        out.push(ModelOp::Free {
            addr,
            size,
            block_size,
        });
        let (prev, next) = (self.nodes[idx as usize].prev, self.nodes[idx as usize].next);
        self.try_merge(idx, prev);
        self.try_merge(idx, next);
        self.pool_insert(idx);
        true
    }

    /// Releases cached memory, like `torch.cuda.empty_cache()`: every cudaMalloc'd
    /// segment that is entirely free, and every whole free page of expandable segments.
    /// Large pools first, then small; within a pool smallest block first (PyTorch's order).
    pub fn empty_cache(&mut self, out: &mut Vec<ModelOp>) {
        let mut pools: Vec<u32> = (0..self.pools.len() as u32).collect();
        pools.sort_by_key(|&p| (self.pools[p as usize].small, self.pools[p as usize].stream));
        for p in pools {
            let free: Vec<u32> = self.pools[p as usize].free.iter().map(|e| e.2).collect();
            let mut to_unmap = Vec::new();
            for idx in free {
                if self.segs[self.nodes[idx as usize].segment as usize]
                    .page
                    .is_some()
                {
                    to_unmap.push(idx);
                } else if !self.is_split(idx) {
                    self.release_segment(idx, out);
                }
            }
            for idx in to_unmap {
                self.unmap_block(idx, out);
            }
        }
    }

    /// PyTorch's `get_free_block`: the smallest cached block that fits, with the
    /// max_split_size rules; among expandable blocks the one that can grow least.
    fn best_fit(&self, pool: u32, rounded: u64) -> Option<u32> {
        let mut fits = self.pools[pool as usize].free.range((rounded, 0, 0)..);
        let mut best = *fits.next()?;
        if self.is_expandable(best.2) {
            if self.cfg.expandable_segments {
                // Best fit by the size a block can grow to, not the size it has.
                for next in fits {
                    if !self.is_expandable(best.2)
                        || self.expandable_size(next.2) >= self.expandable_size(best.2)
                    {
                        break;
                    }
                    best = *next;
                }
            } else {
                // Expandable segments were turned off: only fixed segments serve.
                best = *fits.find(|e| !self.is_expandable(e.2))?;
            }
        }
        let size = best.0;
        // Oversize blocks serve only oversize requests, and only ones close to their size.
        if rounded < self.max_split && size >= self.max_split {
            return None;
        }
        if rounded >= self.max_split && size >= rounded + self.cfg.max_non_split_rounding_size {
            return None;
        }
        Some(best.2)
    }

    /// New memory for a request: an expandable segment's pages, or a cudaMalloc'd
    /// segment. None when the device has no room.
    fn alloc_block(
        &mut self,
        pool: u32,
        rounded: u64,
        frames: StackId,
        out: &mut Vec<ModelOp>,
    ) -> Option<u32> {
        if self.cfg.expandable_segments {
            return self.try_allocate_expandable_block(pool, rounded, frames, out);
        }
        let size = segment_size(rounded);
        self.fits(size)
            .then(|| self.new_segment(pool, size, frames, out))
    }

    /// With max_split_size set, frees oversize cached segments for a request that found
    /// no memory: the smallest one large enough, else the largest ones until enough.
    fn release_available_cached_blocks(
        &mut self,
        pool: u32,
        rounded: u64,
        out: &mut Vec<ModelOp>,
    ) -> bool {
        if self.max_split == u64::MAX {
            return false;
        }
        let want = rounded.max(self.max_split);
        // Oversize blocks are never split, so each is a whole segment; pages of
        // expandable segments are released by `empty_cache` instead.
        let releasable = |m: &Self, idx: u32| !m.is_expandable(idx) && !m.is_split(idx);
        let free = &self.pools[pool as usize].free;
        if let Some(&(_, _, idx)) = free.range((want, 0, 0)..).find(|e| releasable(self, e.2)) {
            self.release_segment(idx, out);
            return true;
        }
        let oversize: Vec<(u64, u32)> = free
            .iter()
            .rev()
            .take_while(|e| e.0 >= self.max_split)
            .filter(|e| releasable(self, e.2))
            .map(|e| (e.0, e.2))
            .collect();
        let mut released = 0;
        for (size, idx) in oversize {
            if released >= want {
                break;
            }
            released += size;
            self.release_segment(idx, out);
        }
        released >= want
    }

    fn new_segment(
        &mut self,
        pool: u32,
        size: u64,
        frames: StackId,
        out: &mut Vec<ModelOp>,
    ) -> u32 {
        let addr = self.queued_addrs.pop_front().unwrap_or(self.next_addr);
        self.bump_next_addr(addr + size);
        let seg = self.segs.len() as u32;
        let idx = self.new_node(Node::free(addr, size, seg, frames, true));
        self.push_seg(Seg {
            addr,
            size,
            stream: self.pools[pool as usize].stream,
            pool,
            head: idx,
            frames,
            live: true,
            page: None,
        });
        self.grow_reserved(size);
        self.stats.segments += 1;
        out.push(ModelOp::SegmentAlloc { addr, size });
        idx
    }

    /// cudaFree of a fixed segment that is one free block.
    fn release_segment(&mut self, idx: u32, out: &mut Vec<ModelOp>) {
        self.pool_remove(idx);
        let seg = self.nodes[idx as usize].segment as usize;
        let s = &mut self.segs[seg];
        s.live = false;
        let (addr, size) = (s.addr, s.size);
        self.stats.reserved_bytes -= size;
        self.stats.segments -= 1;
        self.stats.device_frees += 1;
        out.push(ModelOp::SegmentFree { addr, size });
        self.spare_nodes.push(idx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::model::state::MODEL_BASE_ADDR;
    use crate::allocator::model::testing::{alloc, block_sizes, free, model, MIB};
    use crate::snapshot::model::SegmentType;

    #[test]
    fn small_requests_share_a_2mib_segment() {
        let mut m = model("");
        let b = MODEL_BASE_ADDR;
        assert_eq!(
            alloc(&mut m, 1, 1000, 0),
            vec![
                ModelOp::SegmentAlloc {
                    addr: b,
                    size: 2 * MIB
                },
                ModelOp::Alloc {
                    addr: b,
                    size: 1000,
                    block_size: 1024
                }
            ]
        );
        assert_eq!(
            alloc(&mut m, 2, 100, 0),
            vec![ModelOp::Alloc {
                addr: b + 1024,
                size: 100,
                block_size: 512
            }]
        );
        assert_eq!(
            block_sizes(&m),
            vec![vec![(1024, true), (512, true), (2 * MIB - 1536, false)]]
        );
        let st = m.stats();
        assert_eq!(
            (st.allocated_bytes, st.requested_bytes, st.reserved_bytes),
            (1536, 1100, 2 * MIB)
        );
        assert_eq!(st.inactive_split_bytes, 2 * MIB - 1536);
    }

    #[test]
    fn just_over_1mib_goes_to_a_20mib_large_segment_and_splits() {
        let mut m = model("");
        let ops = alloc(&mut m, 1, MIB + 1, 0);
        assert_eq!(
            ops[0],
            ModelOp::SegmentAlloc {
                addr: MODEL_BASE_ADDR,
                size: 20 * MIB
            }
        );
        assert_eq!(
            ops[1],
            ModelOp::Alloc {
                addr: MODEL_BASE_ADDR,
                size: MIB + 1,
                block_size: MIB + 512
            }
        );
        assert_eq!(m.segments(0)[0].segment_type, SegmentType::Large);
        // A small request never uses the large pool's free remainder.
        let ops = alloc(&mut m, 2, 4096, 0);
        assert!(matches!(ops[0], ModelOp::SegmentAlloc { size, .. } if size == 2 * MIB));
    }

    #[test]
    fn large_remainder_of_1mib_or_less_is_not_split() {
        let mut m = model("");
        alloc(&mut m, 1, 19 * MIB + MIB / 2, 0);
        assert_eq!(block_sizes(&m), vec![vec![(20 * MIB, true)]]);
        let mut m = model("");
        alloc(&mut m, 1, 19 * MIB, 0);
        assert_eq!(
            block_sizes(&m),
            vec![vec![(20 * MIB, true)]],
            "exactly 1 MiB left: no split"
        );
        let mut m = model("");
        alloc(&mut m, 1, 5 * MIB, 0);
        assert_eq!(
            block_sizes(&m),
            vec![vec![(5 * MIB, true), (15 * MIB, false)]]
        );
    }

    #[test]
    fn freed_neighbours_merge_and_empty_cache_releases_whole_segments() {
        let mut m = model("");
        for k in 1..=3 {
            alloc(&mut m, k, 4 * MIB, 0);
        }
        assert_eq!(
            free(&mut m, 2),
            vec![ModelOp::Free {
                addr: MODEL_BASE_ADDR + 4 * MIB,
                size: 4 * MIB,
                block_size: 4 * MIB
            }]
        );
        free(&mut m, 1);
        assert_eq!(
            block_sizes(&m),
            vec![vec![(8 * MIB, false), (4 * MIB, true), (8 * MIB, false)]]
        );
        let mut ops = Vec::new();
        m.empty_cache(&mut ops);
        assert!(ops.is_empty(), "a segment with a live block stays");
        free(&mut m, 3);
        assert_eq!(block_sizes(&m), vec![vec![(20 * MIB, false)]]);
        assert_eq!(m.stats().inactive_split_bytes, 0);
        m.empty_cache(&mut ops);
        assert_eq!(
            ops,
            vec![ModelOp::SegmentFree {
                addr: MODEL_BASE_ADDR,
                size: 20 * MIB
            }]
        );
        let st = m.stats();
        assert_eq!(
            (
                st.reserved_bytes,
                st.segments,
                st.peak_reserved_bytes,
                st.peak_allocated_bytes
            ),
            (0, 0, 20 * MIB, 12 * MIB)
        );
        assert!(!m.free(3, &mut ops), "unknown keys are ignored");
    }

    #[test]
    fn best_fit_takes_the_smallest_block_that_fits() {
        let mut m = model("");
        // Segment: [4][a 2][6][b 2][rest 6]
        for (k, s) in [(1, 4), (2, 2), (3, 6), (4, 2)] {
            alloc(&mut m, k, s * MIB, 0);
        }
        free(&mut m, 1);
        free(&mut m, 3);
        let ops = alloc(&mut m, 5, 3 * MIB, 0);
        assert_eq!(
            ops,
            vec![ModelOp::Alloc {
                addr: MODEL_BASE_ADDR,
                size: 3 * MIB,
                block_size: 4 * MIB
            }]
        );
        let ops = alloc(&mut m, 6, 5 * MIB, 0);
        assert_eq!(
            ops,
            vec![ModelOp::Alloc {
                addr: MODEL_BASE_ADDR + 6 * MIB,
                size: 5 * MIB,
                block_size: 6 * MIB
            }]
        );
    }

    #[test]
    fn max_split_size_keeps_oversize_blocks_whole() {
        let mut m = model("max_split_size_mb:40");
        alloc(&mut m, 1, 100 * MIB, 0);
        free(&mut m, 1);
        // Under max_split_size: the oversize block is not used.
        let ops = alloc(&mut m, 2, 10 * MIB, 0);
        assert!(matches!(ops[0], ModelOp::SegmentAlloc { size, .. } if size == 10 * MIB));
        // Oversize but more than 20 MiB smaller than the block: not used either.
        let ops = alloc(&mut m, 3, 70 * MIB, 0);
        assert!(matches!(ops[0], ModelOp::SegmentAlloc { size, .. } if size == 70 * MIB));
        // Oversize and within 20 MiB: takes the whole block, unsplit.
        let ops = alloc(&mut m, 4, 90 * MIB, 0);
        assert_eq!(
            ops,
            vec![ModelOp::Alloc {
                addr: MODEL_BASE_ADDR,
                size: 90 * MIB,
                block_size: 100 * MIB
            }]
        );
    }

    #[test]
    fn streams_have_their_own_pools() {
        let mut m = model("");
        alloc(&mut m, 1, 4096, 0);
        let ops = alloc(&mut m, 2, 4096, 1);
        assert!(
            matches!(ops[0], ModelOp::SegmentAlloc { addr, .. } if addr == MODEL_BASE_ADDR + 2 * MIB)
        );
        let segs = m.segments(3);
        assert_eq!(
            segs.iter()
                .map(|s| (s.stream, s.device))
                .collect::<Vec<_>>(),
            vec![(0, 3), (1, 3)]
        );
    }

    #[test]
    fn a_full_device_releases_cached_segments_retries_and_then_fails() {
        let mut m = model("");
        m.set_capacity(Some(64 * MIB));
        let b = MODEL_BASE_ADDR;
        alloc(&mut m, 1, 40 * MIB, 0);
        alloc(&mut m, 2, 12 * MIB, 0);
        free(&mut m, 1);
        // 52 MiB reserved, 50 more needed: the cached 40 MiB segment is released first.
        assert_eq!(
            alloc(&mut m, 3, 50 * MIB, 0),
            vec![
                ModelOp::SegmentFree {
                    addr: b,
                    size: 40 * MIB
                },
                ModelOp::SegmentAlloc {
                    addr: b + 52 * MIB,
                    size: 50 * MIB
                },
                ModelOp::Alloc {
                    addr: b + 52 * MIB,
                    size: 50 * MIB,
                    block_size: 50 * MIB
                }
            ]
        );
        let mut ops = Vec::new();
        assert!(
            !m.malloc(4, 10 * MIB, 0, 0, &mut ops),
            "62 of 64 MiB reserved, all of it in use"
        );
        assert!(ops.is_empty());
        let st = m.stats();
        assert_eq!(
            (
                st.ooms,
                st.reserved_bytes,
                st.device_allocs,
                st.device_frees
            ),
            (1, 62 * MIB, 3, 1)
        );
        assert!(m.free(3, &mut ops));
        assert!(
            m.malloc(4, 10 * MIB, 0, 0, &mut ops),
            "fits once a block is free"
        );
    }
}
