//! The model's state: segments split into blocks (linked in address order), the
//! per-(stream, pool) free lists ordered by (size, address), live allocations and the
//! counters, with the bookkeeping that keeps them consistent as blocks link, merge and
//! move between pools. What a request does with them is in `caching` and `expandable`.

use std::collections::{BTreeSet, VecDeque};

use rustc_hash::FxHashMap;

use super::ops::AllocatorStats;
use crate::allocator::config::{AllocatorConfig, ROUNDUP_INTERVALS, ROUND_LARGE};
use crate::snapshot::model::{Block, StackId};

/// Modelled addresses start here, segment after segment, each rounded to 2 MiB.
pub const MODEL_BASE_ADDR: u64 = 0x7f00_0000_0000;
pub(super) const NIL: u32 = u32::MAX;

#[derive(Clone, Debug)]
pub(super) struct Node {
    pub(super) addr: u64,
    pub(super) size: u64,
    pub(super) requested: u64,
    pub(super) segment: u32,
    pub(super) prev: u32,
    pub(super) next: u32,
    pub(super) frames: StackId,
    pub(super) allocated: bool,
    /// Backed by memory. Only blocks of expandable segments are ever unmapped: they cover
    /// whole pages of the reserved range that hold nothing.
    pub(super) mapped: bool,
}

impl Node {
    /// A free block of `segment`, not yet linked.
    pub(super) fn free(addr: u64, size: u64, segment: u32, frames: StackId, mapped: bool) -> Node {
        Node {
            addr,
            size,
            requested: 0,
            segment,
            prev: NIL,
            next: NIL,
            frames,
            allocated: false,
            mapped,
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct Seg {
    /// The cudaMalloc'd range, or an expandable segment's whole reserved range.
    pub(super) addr: u64,
    pub(super) size: u64,
    pub(super) stream: i64,
    pub(super) pool: u32,
    pub(super) head: u32,
    pub(super) frames: StackId,
    pub(super) live: bool,
    /// Page size when this is an expandable segment.
    pub(super) page: Option<u64>,
}

#[derive(Clone, Debug)]
pub(super) struct Pool {
    pub(super) stream: i64,
    pub(super) small: bool,
    /// Mapped free blocks: (size, address, node).
    pub(super) free: BTreeSet<(u64, u64, u32)>,
    /// Unmapped ranges of this pool's expandable segments: (address, node).
    pub(super) unmapped: BTreeSet<(u64, u32)>,
}

#[derive(Clone, Debug)]
pub struct CachingAllocatorModel {
    pub(super) cfg: AllocatorConfig,
    pub(super) divisions: [u64; ROUNDUP_INTERVALS],
    pub(super) max_split: u64,
    pub(super) nodes: Vec<Node>,
    pub(super) spare_nodes: Vec<u32>,
    pub(super) segs: Vec<Seg>,
    pub(super) pools: Vec<Pool>,
    pub(super) live: FxHashMap<u64, u32>,
    pub(super) next_addr: u64,
    pub(super) queued_addrs: VecDeque<u64>,
    pub(super) empty_stack: StackId,
    pub(super) stats: AllocatorStats,
    pub(super) capacity: Option<u64>,
}

impl CachingAllocatorModel {
    /// A model with no memory yet and no capacity limit.
    pub fn new(cfg: AllocatorConfig) -> Self {
        CachingAllocatorModel {
            divisions: cfg.division_table(),
            max_split: cfg.max_split_size.unwrap_or(u64::MAX),
            cfg,
            nodes: Vec::new(),
            spare_nodes: Vec::new(),
            segs: Vec::new(),
            pools: Vec::new(),
            live: FxHashMap::default(),
            next_addr: MODEL_BASE_ADDR,
            queued_addrs: VecDeque::new(),
            empty_stack: 0,
            stats: AllocatorStats::default(),
            capacity: None,
        }
    }

    pub fn config(&self) -> &AllocatorConfig {
        &self.cfg
    }

    /// Bytes the allocator can get from the device, reserved memory included (the
    /// device's memory less what others hold). A request that needs more fails, after
    /// the cached memory is released and the allocation retried, as a CUDA OOM does.
    /// `None` (the default): never runs out.
    pub fn set_capacity(&mut self, bytes: Option<u64>) {
        self.capacity = bytes;
    }

    pub fn capacity(&self) -> Option<u64> {
        self.capacity
    }

    /// The stack id reported for inactive blocks by `segments` (the caller's empty stack).
    pub fn set_empty_stack(&mut self, id: StackId) {
        self.empty_stack = id;
    }

    /// Replaying a recording: the next segments the model creates (cudaMalloc'd, or an
    /// expandable segment's reserved range) take these addresses in order, so modelled
    /// addresses equal the recorded ones.
    pub fn queue_segment_address(&mut self, addr: u64) {
        self.queued_addrs.push_back(addr);
    }

    /// Drops queued addresses the model did not use.
    pub fn clear_queued_segment_addresses(&mut self) {
        self.queued_addrs.clear();
    }

    pub fn stats(&self) -> AllocatorStats {
        self.stats
    }

    pub fn reset_peaks(&mut self) {
        let s = &mut self.stats;
        s.peak_allocated_bytes = s.allocated_bytes;
        s.peak_reserved_bytes = s.reserved_bytes;
        s.peak_active_bytes = s.active_bytes;
    }

    /// Share of reserved memory not holding allocations: `1 - allocated / reserved`
    /// (0 when nothing is reserved).
    pub fn fragmentation(&self) -> f64 {
        if self.stats.reserved_bytes == 0 {
            0.0
        } else {
            1.0 - self.stats.allocated_bytes as f64 / self.stats.reserved_bytes as f64
        }
    }

    /// Largest cached free block, the biggest request served without new memory.
    pub fn largest_free_block(&self) -> u64 {
        self.pools
            .iter()
            .filter_map(|p| p.free.last().map(|e| e.0))
            .max()
            .unwrap_or(0)
    }

    pub(super) fn fits(&self, bytes: u64) -> bool {
        self.capacity
            .is_none_or(|c| self.stats.reserved_bytes + bytes <= c)
    }

    pub(super) fn grow_reserved(&mut self, bytes: u64) {
        let s = &mut self.stats;
        s.reserved_bytes += bytes;
        s.device_allocs += 1;
        s.peak_reserved_bytes = s.peak_reserved_bytes.max(s.reserved_bytes);
    }

    pub(super) fn bump_next_addr(&mut self, end: u64) {
        self.next_addr = self.next_addr.max(end.div_ceil(ROUND_LARGE) * ROUND_LARGE);
    }

    pub(super) fn push_seg(&mut self, s: Seg) -> u32 {
        self.segs.push(s);
        (self.segs.len() - 1) as u32
    }

    /// A node for a snapshot block of segment `seg`, not yet linked.
    pub(super) fn block_node(&self, seg: u32, b: &Block) -> Node {
        Node {
            addr: b.address,
            size: b.size,
            requested: b.requested_size,
            segment: seg,
            prev: NIL,
            next: NIL,
            frames: b.frames,
            allocated: b.state.is_active(),
            mapped: true,
        }
    }

    /// Links `nodes` (address order) as segment `seg`'s blocks; active ones become live
    /// allocations keyed by their address, the others go to their pool.
    pub(super) fn link_chain(&mut self, seg: u32, nodes: Vec<Node>) {
        let mut prev = NIL;
        for n in nodes {
            let idx = self.new_node(Node { prev, ..n });
            if prev == NIL {
                self.segs[seg as usize].head = idx;
            } else {
                self.nodes[prev as usize].next = idx;
            }
            prev = idx;
        }
        let mut cur = self.segs[seg as usize].head;
        while cur != NIL {
            let n = &self.nodes[cur as usize];
            let next = n.next;
            if n.allocated {
                let (addr, size, req) = (n.addr, n.size, n.requested);
                self.live.insert(addr, cur);
                self.count_alloc(size, req);
            } else {
                self.pool_insert(cur);
            }
            cur = next;
        }
    }

    /// Folds `other` into `idx` when it is a free neighbour in the same state (mapped or
    /// not), taking it out of its pool. Returns whether it did.
    pub(super) fn try_merge(&mut self, idx: u32, other: u32) -> bool {
        if other == NIL {
            return false;
        }
        let o = self.nodes[other as usize].clone();
        if o.allocated || o.mapped != self.nodes[idx as usize].mapped {
            return false;
        }
        self.pool_remove(other);
        let n = &mut self.nodes[idx as usize];
        n.size += o.size;
        if o.next == idx {
            // `other` precedes `idx`: the merged block starts at its address.
            n.addr = o.addr;
            n.prev = o.prev;
            if o.prev == NIL {
                self.segs[o.segment as usize].head = idx;
            } else {
                self.nodes[o.prev as usize].next = idx;
            }
        } else {
            n.next = o.next;
            if o.next != NIL {
                self.nodes[o.next as usize].prev = idx;
            }
        }
        self.spare_nodes.push(other);
        true
    }

    pub(super) fn is_split(&self, idx: u32) -> bool {
        let n = &self.nodes[idx as usize];
        n.prev != NIL || n.next != NIL
    }

    pub(super) fn is_expandable(&self, idx: u32) -> bool {
        self.segs[self.nodes[idx as usize].segment as usize]
            .page
            .is_some()
    }

    /// Puts a free block into its pool: the free list when mapped, else the unmapped set.
    pub(super) fn pool_insert(&mut self, idx: u32) {
        let n = &self.nodes[idx as usize];
        let (size, addr, mapped) = (n.size, n.addr, n.mapped);
        let pool = self.segs[n.segment as usize].pool as usize;
        if !mapped {
            self.pools[pool].unmapped.insert((addr, idx));
            return;
        }
        if self.is_split(idx) && !self.is_expandable(idx) {
            self.stats.inactive_split_bytes += size;
        }
        self.pools[pool].free.insert((size, addr, idx));
    }

    pub(super) fn pool_remove(&mut self, idx: u32) {
        let n = &self.nodes[idx as usize];
        let (size, addr, mapped) = (n.size, n.addr, n.mapped);
        let pool = self.segs[n.segment as usize].pool as usize;
        if !mapped {
            self.pools[pool].unmapped.remove(&(addr, idx));
            return;
        }
        if self.is_split(idx) && !self.is_expandable(idx) {
            self.stats.inactive_split_bytes -= size;
        }
        self.pools[pool].free.remove(&(size, addr, idx));
    }

    pub(super) fn pool_index(&mut self, stream: i64, small: bool) -> u32 {
        if let Some(i) = self
            .pools
            .iter()
            .position(|p| p.stream == stream && p.small == small)
        {
            return i as u32;
        }
        self.pools.push(Pool {
            stream,
            small,
            free: BTreeSet::new(),
            unmapped: BTreeSet::new(),
        });
        (self.pools.len() - 1) as u32
    }

    pub(super) fn new_node(&mut self, n: Node) -> u32 {
        match self.spare_nodes.pop() {
            Some(i) => {
                self.nodes[i as usize] = n;
                i
            }
            None => {
                self.nodes.push(n);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    pub(super) fn count_alloc(&mut self, block_size: u64, requested: u64) {
        let s = &mut self.stats;
        s.allocated_bytes += block_size;
        s.active_bytes += block_size;
        s.requested_bytes += requested;
        s.blocks += 1;
        s.peak_allocated_bytes = s.peak_allocated_bytes.max(s.allocated_bytes);
        s.peak_active_bytes = s.peak_active_bytes.max(s.active_bytes);
    }
}
