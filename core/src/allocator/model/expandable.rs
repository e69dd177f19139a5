//! Expandable segments (`expandable_segments:True`). Per stream and pool one address
//! range is reserved (1⅛ of the device's memory) and pages (2 MiB in the small pool,
//! 20 MiB in the large) are mapped into it as requests need them, at the lowest address
//! with room. When memory runs out, whole free pages are unmapped and the retry maps
//! them again where they are needed. A reservation's blocks are mapped (free or
//! allocated) or unmapped, in address order; a snapshot lists each run of mapped blocks
//! as one segment.

use super::ops::ModelOp;
use super::state::{CachingAllocatorModel, Node, Seg, NIL};
use crate::allocator::config::{LARGE_BUFFER, SMALL_BUFFER};
use crate::snapshot::model::{Segment, SegmentType, StackId};

/// Device memory assumed when no capacity is set. It only sizes the address range each
/// expandable segment reserves (PyTorch reserves 1⅛ of the device's memory).
pub const DEFAULT_DEVICE_MEMORY: u64 = 80 << 30;

fn page_size(small: bool) -> u64 {
    if small {
        SMALL_BUFFER
    } else {
        LARGE_BUFFER
    }
}

impl CachingAllocatorModel {
    /// Bytes of address space one expandable segment reserves.
    fn reservation_bytes(&self, page: u64) -> u64 {
        let mem = self.capacity.unwrap_or(DEFAULT_DEVICE_MEMORY);
        (mem + mem / 8).div_ceil(page) * page
    }

    /// A free block's size plus the unmapped range after it: what it can grow to in place.
    pub(super) fn expandable_size(&self, idx: u32) -> u64 {
        let n = &self.nodes[idx as usize];
        let grow = match n.next {
            NIL => 0,
            next if !self.nodes[next as usize].mapped => self.nodes[next as usize].size,
            _ => 0,
        };
        n.size + grow
    }

    /// Maps enough pages for `size` bytes at the lowest address of the pool's expandable
    /// segments that has room (a new segment if none has), and hands out the free block
    /// that then holds them, taken from the pool. None when the device has no room; pages
    /// mapped before that stay mapped, as in PyTorch.
    pub(super) fn try_allocate_expandable_block(
        &mut self,
        pool: u32,
        size: u64,
        frames: StackId,
        out: &mut Vec<ModelOp>,
    ) -> Option<u32> {
        let mut c = self.find_expandable_block(pool, size, frames);
        if !self.nodes[c as usize].mapped {
            let want = self.nodes[c as usize].size.min(size);
            if !self.map_block(c, want, out) {
                return None;
            }
        }
        while self.nodes[c as usize].size < size {
            // A free block followed by unmapped pages: map some and merge.
            let next = self.nodes[c as usize].next;
            if next == NIL || self.nodes[next as usize].mapped {
                return None;
            }
            let want = (size - self.nodes[c as usize].size).min(self.nodes[next as usize].size);
            if !self.map_block(next, want, out) {
                return None;
            }
            c = next;
        }
        self.pool_remove(c);
        Some(c)
    }

    /// The lowest-addressed unmapped range (or the free block right before it) from which
    /// free and unmapped blocks add up to `size`; a new reservation when there is none.
    fn find_expandable_block(&mut self, pool: u32, size: u64, frames: StackId) -> u32 {
        let free = |m: &Self, i: u32| i != NIL && !m.nodes[i as usize].allocated;
        let has_room = |m: &Self, mut i: u32| {
            let mut bytes = 0;
            while bytes < size && free(m, i) {
                bytes += m.nodes[i as usize].size;
                i = m.nodes[i as usize].next;
            }
            bytes >= size
        };
        for &(_, u) in &self.pools[pool as usize].unmapped {
            let prev = self.nodes[u as usize].prev;
            let start = if free(self, prev) { prev } else { u };
            if has_room(self, start) {
                return start;
            }
        }
        let page = page_size(self.pools[pool as usize].small);
        let bytes = self.reservation_bytes(page);
        let addr = self.queued_reservation_address().unwrap_or(self.next_addr);
        self.bump_next_addr(addr + bytes);
        let seg = self.segs.len() as u32;
        let idx = self.new_node(Node::free(addr, bytes, seg, self.empty_stack, false));
        self.push_seg(Seg {
            addr,
            size: bytes,
            stream: self.pools[pool as usize].stream,
            pool,
            head: idx,
            frames,
            live: true,
            page: Some(page),
        });
        self.pool_insert(idx);
        idx
    }

    /// The queued address of a new reservation, taken from the queue: the first outside
    /// every existing reservation (the others are mappings inside one), else the last
    /// (the new reservation's mapping comes last for its request). A reservation the
    /// model sized past that address really ends there: its unmapped tail is cut.
    fn queued_reservation_address(&mut self) -> Option<u64> {
        let inside = |m: &Self, a: u64| {
            m.segs
                .iter()
                .position(|s| s.live && s.page.is_some() && (s.addr..s.addr + s.size).contains(&a))
        };
        let i = match self
            .queued_addrs
            .iter()
            .position(|&a| inside(self, a).is_none())
        {
            Some(i) => i,
            None => self.queued_addrs.len().checked_sub(1)?,
        };
        let addr = self.queued_addrs.remove(i)?;
        if let Some(seg) = inside(self, addr) {
            self.cut_reservation(seg as u32, addr);
        }
        Some(addr)
    }

    /// Ends reservation `seg` at `end` when its unmapped tail starts there or before.
    fn cut_reservation(&mut self, seg: u32, end: u64) {
        let mut tail = self.segs[seg as usize].head;
        while self.nodes[tail as usize].next != NIL {
            tail = self.nodes[tail as usize].next;
        }
        let t = self.nodes[tail as usize].clone();
        if t.mapped || t.addr > end || (t.addr == end && t.prev == NIL) {
            return;
        }
        self.pool_remove(tail);
        if t.addr == end {
            self.nodes[t.prev as usize].next = NIL;
            self.spare_nodes.push(tail);
        } else {
            self.nodes[tail as usize].size = end - t.addr;
            self.pool_insert(tail);
        }
        let s = &mut self.segs[seg as usize];
        s.size = end - s.addr;
    }

    /// Maps the pages covering the first `size` bytes of unmapped block `idx` (page
    /// aligned), splits off the rest, merges with free neighbours. False when the device
    /// has no room for them (nothing changes then).
    fn map_block(&mut self, idx: u32, size: u64, out: &mut Vec<ModelOp>) -> bool {
        let n = self.nodes[idx as usize].clone();
        let page = self.segs[n.segment as usize]
            .page
            .expect("an expandable segment");
        let bytes = size.div_ceil(page) * page;
        if !self.fits(bytes) {
            return false;
        }
        self.pool_remove(idx);
        if bytes < n.size {
            let rest = self.new_node(Node {
                addr: n.addr + bytes,
                size: n.size - bytes,
                prev: idx,
                ..n.clone()
            });
            if n.next != NIL {
                self.nodes[n.next as usize].prev = rest;
            }
            self.nodes[idx as usize].next = rest;
            self.nodes[idx as usize].size = bytes;
            self.pool_insert(rest);
        }
        self.nodes[idx as usize].mapped = true;
        let prev = self.nodes[idx as usize].prev;
        self.try_merge(idx, prev);
        let next = self.nodes[idx as usize].next;
        self.try_merge(idx, next);
        self.pool_insert(idx);
        self.grow_reserved(bytes);
        out.push(ModelOp::SegmentMap {
            addr: n.addr,
            size: bytes,
        });
        true
    }

    /// Unmaps the whole pages inside free block `idx`; the partial pages at its ends stay
    /// mapped as free blocks. A reservation left with nothing mapped is released.
    pub(super) fn unmap_block(&mut self, idx: u32, out: &mut Vec<ModelOp>) {
        let n = self.nodes[idx as usize].clone();
        let s = &self.segs[n.segment as usize];
        let (base, page) = (s.addr, s.page.expect("an expandable segment"));
        let start = base + (n.addr - base).div_ceil(page) * page;
        let end = base + (n.addr + n.size - base) / page * page;
        if start >= end {
            return;
        }
        self.pool_remove(idx);
        if start > n.addr {
            let before = self.new_node(Node {
                size: start - n.addr,
                next: idx,
                ..n.clone()
            });
            match n.prev {
                NIL => self.segs[n.segment as usize].head = before,
                p => self.nodes[p as usize].next = before,
            }
            self.nodes[idx as usize].prev = before;
            self.pool_insert(before);
        }
        if end < n.addr + n.size {
            let after = self.new_node(Node {
                addr: end,
                size: n.addr + n.size - end,
                prev: idx,
                ..n.clone()
            });
            if n.next != NIL {
                self.nodes[n.next as usize].prev = after;
            }
            self.nodes[idx as usize].next = after;
            self.pool_insert(after);
        }
        let b = &mut self.nodes[idx as usize];
        b.addr = start;
        b.size = end - start;
        b.mapped = false;
        let prev = b.prev;
        self.try_merge(idx, prev);
        let next = self.nodes[idx as usize].next;
        self.try_merge(idx, next);
        self.pool_insert(idx);
        self.stats.reserved_bytes -= end - start;
        self.stats.device_frees += 1;
        out.push(ModelOp::SegmentUnmap {
            addr: start,
            size: end - start,
        });
        if !self.is_split(idx) {
            // Nothing mapped anywhere in the reservation: give the address range back.
            self.pool_remove(idx);
            self.segs[n.segment as usize].live = false;
            self.spare_nodes.push(idx);
        }
    }

    /// Loads a snapshot's expandable segments from `all` (every segment, address order):
    /// runs of them of one stream and pool, with nothing else between and gaps of whole
    /// pages, share a reservation, the gaps and the rest of the reserved range (up to the
    /// next segment) unmapped.
    pub(super) fn load_expandable(&mut self, all: &[&Segment]) {
        let mut groups: Vec<Vec<&Segment>> = Vec::new();
        let mut open = false;
        for &s in all {
            if !loads_as_expandable(s) {
                open = false;
                continue;
            }
            let page = page_size(s.segment_type == SegmentType::Small);
            let joins = open
                && groups.last().is_some_and(|g| {
                    let first = g[0];
                    first.stream == s.stream
                        && first.segment_type == s.segment_type
                        && (s.address - first.address) % page == 0
                        && s.address + s.total_size - first.address <= self.reservation_bytes(page)
                });
            if joins {
                groups.last_mut().expect("an open group").push(s);
            } else {
                groups.push(vec![s]);
            }
            open = true;
        }
        for g in groups {
            let small = g[0].segment_type == SegmentType::Small;
            let page = page_size(small);
            let base = g[0].address;
            let last = g[g.len() - 1];
            let mapped_end = last.address + last.total_size;
            let limit = all
                .iter()
                .map(|s| s.address)
                .find(|&a| a >= mapped_end)
                .unwrap_or(u64::MAX);
            let bytes = self
                .reservation_bytes(page)
                .min((limit - base) / page * page)
                .max(mapped_end - base);
            let pool = self.pool_index(g[0].stream, small);
            let seg = self.push_seg(Seg {
                addr: base,
                size: bytes,
                stream: g[0].stream,
                pool,
                head: NIL,
                frames: g[0].frames,
                live: true,
                page: Some(page),
            });
            let unmapped = |addr: u64, size: u64| Node::free(addr, size, seg, self.empty_stack, false);
            let mut nodes = Vec::new();
            let mut cursor = base;
            for s in &g {
                if s.address > cursor {
                    nodes.push(unmapped(cursor, s.address - cursor));
                }
                nodes.extend(s.blocks.iter().map(|b| self.block_node(seg, b)));
                cursor = s.address + s.total_size;
                self.stats.reserved_bytes += s.total_size;
            }
            if base + bytes > cursor {
                nodes.push(unmapped(cursor, base + bytes - cursor));
            }
            self.link_chain(seg, nodes);
            self.bump_next_addr(base + bytes);
        }
    }
}

/// Whether a snapshot segment can be an expandable segment's mapped range: marked so,
/// and whole pages (a synthetic file's odd sizes load as fixed segments).
pub(super) fn loads_as_expandable(s: &Segment) -> bool {
    s.is_expandable
        && s.total_size
            .is_multiple_of(page_size(s.segment_type == SegmentType::Small))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::config::AllocatorConfig;
    use crate::allocator::model::state::MODEL_BASE_ADDR;
    use crate::allocator::model::testing::{alloc, block_sizes, free, model, MIB};

    #[test]
    fn expandable_segments_map_pages_and_grow_in_place() {
        let mut m = model("expandable_segments:True");
        let b = MODEL_BASE_ADDR;
        assert_eq!(
            alloc(&mut m, 1, 30 * MIB, 0),
            vec![
                ModelOp::SegmentMap {
                    addr: b,
                    size: 40 * MIB
                },
                ModelOp::Alloc {
                    addr: b,
                    size: 30 * MIB,
                    block_size: 30 * MIB
                }
            ]
        );
        // 10 MiB free at the end: it grows by one 20 MiB page instead of a new segment.
        assert_eq!(
            alloc(&mut m, 2, 15 * MIB, 0),
            vec![
                ModelOp::SegmentMap {
                    addr: b + 40 * MIB,
                    size: 20 * MIB
                },
                ModelOp::Alloc {
                    addr: b + 30 * MIB,
                    size: 15 * MIB,
                    block_size: 15 * MIB
                }
            ]
        );
        // Large blocks split at 512 B, not 1 MiB, with expandable segments.
        assert_eq!(
            block_sizes(&m),
            vec![vec![(30 * MIB, true), (15 * MIB, true), (15 * MIB, false)]]
        );
        let segs = m.segments(0);
        assert!(segs[0].is_expandable);
        assert_eq!(
            (
                segs[0].total_size,
                m.stats().reserved_bytes,
                m.stats().segments
            ),
            (60 * MIB, 60 * MIB, 0)
        );
        // The small pool reserves its own range and maps 2 MiB pages.
        let ops = alloc(&mut m, 3, 1000, 0);
        assert!(
            matches!(ops[0], ModelOp::SegmentMap { addr, size } if size == 2 * MIB && addr > b + 60 * MIB)
        );
    }

    #[test]
    fn empty_cache_unmaps_whole_free_pages_and_maps_them_again_lowest_first() {
        let mut m = model("expandable_segments:True");
        let b = MODEL_BASE_ADDR;
        alloc(&mut m, 1, 30 * MIB, 0);
        alloc(&mut m, 2, 15 * MIB, 0);
        free(&mut m, 1);
        let mut ops = Vec::new();
        m.empty_cache(&mut ops);
        // [0, 30) was free: its whole page [0, 20) goes, the partial page stays mapped.
        assert_eq!(
            ops,
            vec![ModelOp::SegmentUnmap {
                addr: b,
                size: 20 * MIB
            }]
        );
        assert_eq!(m.stats().reserved_bytes, 40 * MIB);
        assert_eq!(m.segments(0)[0].address, b + 20 * MIB);
        // The lowest room that fits is the unmapped page plus the free 10 MiB after it.
        assert_eq!(
            alloc(&mut m, 4, 25 * MIB, 0),
            vec![
                ModelOp::SegmentMap {
                    addr: b,
                    size: 20 * MIB
                },
                ModelOp::Alloc {
                    addr: b,
                    size: 25 * MIB,
                    block_size: 25 * MIB
                }
            ]
        );
        assert_eq!(
            block_sizes(&m),
            vec![vec![
                (25 * MIB, true),
                (5 * MIB, false),
                (15 * MIB, true),
                (15 * MIB, false)
            ]]
        );
    }

    #[test]
    fn expandable_blocks_serve_nothing_once_the_setting_is_off() {
        let mut m = model("expandable_segments:True");
        alloc(&mut m, 1, 30 * MIB, 0);
        free(&mut m, 1);
        let mut fixed =
            CachingAllocatorModel::from_segments(AllocatorConfig::default(), &m.segments(0));
        let ops = alloc(&mut fixed, 2, 5 * MIB, 0);
        assert!(
            matches!(ops[0], ModelOp::SegmentAlloc { size, .. } if size == 20 * MIB),
            "{ops:?}"
        );
        // And the loaded segment still grows under the setting.
        let mut again = CachingAllocatorModel::from_segments(m.config().clone(), &m.segments(0));
        let ops = alloc(&mut again, 2, 50 * MIB, 0);
        assert_eq!(
            ops[0],
            ModelOp::SegmentMap {
                addr: MODEL_BASE_ADDR + 40 * MIB,
                size: 20 * MIB
            }
        );
    }
}
