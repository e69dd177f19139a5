//! The caching allocator itself: segments split into blocks, per-(stream, pool) free lists
//! ordered by (size, address) for best fit, merge of free neighbours on free, and, when
//! the device's capacity is set, the out-of-memory path (free cached memory, retry, fail).
//! Expandable segments live in `expandable`.

mod expandable;

use std::collections::{BTreeSet, HashMap, VecDeque};

use super::config::{
    round_size, segment_size, AllocatorConfig, MIN_BLOCK_SIZE, ROUNDUP_INTERVALS, ROUND_LARGE,
    SMALL_SIZE,
};
use crate::snapshot::model::{Block, BlockState, Segment, SegmentType, StackId};

/// What the model did, in the order the real allocator's trace would record it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelOp {
    SegmentAlloc {
        addr: u64,
        size: u64,
    },
    SegmentFree {
        addr: u64,
        size: u64,
    },
    /// Pages mapped into an expandable segment's address range.
    SegmentMap {
        addr: u64,
        size: u64,
    },
    /// Free pages of an expandable segment handed back to the device.
    SegmentUnmap {
        addr: u64,
        size: u64,
    },
    /// `size` is the request, `block_size` what the block occupies.
    Alloc {
        addr: u64,
        size: u64,
        block_size: u64,
    },
    Free {
        addr: u64,
        size: u64,
        block_size: u64,
    },
}

/// Counters in the sense of `torch.cuda.memory_stats` (aggregated over pools).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    /// Equal to `allocated_bytes`: the model frees blocks at once (no pending stream uses).
    pub active_bytes: u64,
    pub requested_bytes: u64,
    /// Free bytes in segments that are split (cached but fragmented); expandable segments
    /// are left out, as PyTorch does.
    pub inactive_split_bytes: u64,
    /// cudaMalloc'd segments (expandable segments map pages instead and are not counted).
    pub segments: u64,
    /// Allocated blocks.
    pub blocks: u64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub peak_active_bytes: u64,
    /// cudaMalloc and page-map calls (PyTorch's `num_device_alloc`).
    pub device_allocs: u64,
    /// cudaFree and unmap calls (`num_device_free`).
    pub device_frees: u64,
    /// Requests that failed for want of device memory (`num_ooms`).
    pub ooms: u64,
}

/// Modelled addresses start here, segment after segment, each rounded to 2 MiB.
pub const MODEL_BASE_ADDR: u64 = 0x7f00_0000_0000;
/// Device memory assumed when no capacity is set. It only sizes the address range each
/// expandable segment reserves (PyTorch reserves 1⅛ of the device's memory).
pub const DEFAULT_DEVICE_MEMORY: u64 = 80 << 30;
const NIL: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct Node {
    addr: u64,
    size: u64,
    requested: u64,
    segment: u32,
    prev: u32,
    next: u32,
    frames: StackId,
    allocated: bool,
    /// Backed by memory. Only blocks of expandable segments are ever unmapped: they cover
    /// whole pages of the reserved range that hold nothing.
    mapped: bool,
}

impl Node {
    /// A free block of `segment`, not yet linked.
    fn free(addr: u64, size: u64, segment: u32, frames: StackId, mapped: bool) -> Node {
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
struct Seg {
    /// The cudaMalloc'd range, or an expandable segment's whole reserved range.
    addr: u64,
    size: u64,
    stream: i64,
    pool: u32,
    head: u32,
    frames: StackId,
    live: bool,
    /// Page size when this is an expandable segment.
    page: Option<u64>,
}

#[derive(Clone, Debug)]
struct Pool {
    stream: i64,
    small: bool,
    /// Mapped free blocks: (size, address, node).
    free: BTreeSet<(u64, u64, u32)>,
    /// Unmapped ranges of this pool's expandable segments: (address, node).
    unmapped: BTreeSet<(u64, u32)>,
}

#[derive(Clone, Debug)]
pub struct CachingAllocatorModel {
    cfg: AllocatorConfig,
    divisions: [u64; ROUNDUP_INTERVALS],
    max_split: u64,
    nodes: Vec<Node>,
    spare_nodes: Vec<u32>,
    segs: Vec<Seg>,
    pools: Vec<Pool>,
    live: HashMap<u64, u32>,
    next_addr: u64,
    queued_addrs: VecDeque<u64>,
    empty_stack: StackId,
    stats: AllocatorStats,
    capacity: Option<u64>,
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
            live: HashMap::new(),
            next_addr: MODEL_BASE_ADDR,
            queued_addrs: VecDeque::new(),
            empty_stack: 0,
            stats: AllocatorStats::default(),
            capacity: None,
        }
    }

    /// Starts from existing segments (a snapshot's state). Active blocks become live
    /// allocations keyed by their address; inactive blocks go to the free lists.
    /// Expandable segments of one stream and pool share an address reservation, with
    /// the gaps between them unmapped.
    pub fn from_segments(cfg: AllocatorConfig, segments: &[Segment]) -> Self {
        let mut m = Self::new(cfg);
        let mut sorted: Vec<&Segment> = segments.iter().collect();
        sorted.sort_by_key(|s| s.address);
        for s in sorted
            .iter()
            .filter(|s| !expandable::loads_as_expandable(s))
        {
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

    pub fn stats(&self) -> AllocatorStats {
        self.stats
    }

    pub fn reset_peaks(&mut self) {
        let s = &mut self.stats;
        s.peak_allocated_bytes = s.allocated_bytes;
        s.peak_reserved_bytes = s.reserved_bytes;
        s.peak_active_bytes = s.active_bytes;
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

    fn fits(&self, bytes: u64) -> bool {
        self.capacity
            .is_none_or(|c| self.stats.reserved_bytes + bytes <= c)
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

    fn grow_reserved(&mut self, bytes: u64) {
        let s = &mut self.stats;
        s.reserved_bytes += bytes;
        s.device_allocs += 1;
        s.peak_reserved_bytes = s.peak_reserved_bytes.max(s.reserved_bytes);
    }

    fn bump_next_addr(&mut self, end: u64) {
        self.next_addr = self.next_addr.max(end.div_ceil(ROUND_LARGE) * ROUND_LARGE);
    }

    fn push_seg(&mut self, s: Seg) -> u32 {
        self.segs.push(s);
        (self.segs.len() - 1) as u32
    }

    /// A node for a snapshot block of segment `seg`, not yet linked.
    fn block_node(&self, seg: u32, b: &Block) -> Node {
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
    fn link_chain(&mut self, seg: u32, nodes: Vec<Node>) {
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
    fn try_merge(&mut self, idx: u32, other: u32) -> bool {
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

    fn is_split(&self, idx: u32) -> bool {
        let n = &self.nodes[idx as usize];
        n.prev != NIL || n.next != NIL
    }

    fn is_expandable(&self, idx: u32) -> bool {
        self.segs[self.nodes[idx as usize].segment as usize]
            .page
            .is_some()
    }

    /// Puts a free block into its pool: the free list when mapped, else the unmapped set.
    fn pool_insert(&mut self, idx: u32) {
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

    fn pool_remove(&mut self, idx: u32) {
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

    fn pool_index(&mut self, stream: i64, small: bool) -> u32 {
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

    fn new_node(&mut self, n: Node) -> u32 {
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

    fn count_alloc(&mut self, block_size: u64, requested: u64) {
        let s = &mut self.stats;
        s.allocated_bytes += block_size;
        s.active_bytes += block_size;
        s.requested_bytes += requested;
        s.blocks += 1;
        s.peak_allocated_bytes = s.peak_allocated_bytes.max(s.allocated_bytes);
        s.peak_active_bytes = s.peak_active_bytes.max(s.active_bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn model(conf: &str) -> CachingAllocatorModel {
        CachingAllocatorModel::new(AllocatorConfig::parse_conf(conf).unwrap())
    }

    fn alloc(m: &mut CachingAllocatorModel, key: u64, size: u64, stream: i64) -> Vec<ModelOp> {
        let mut ops = Vec::new();
        m.malloc(key, size, stream, 7, &mut ops);
        ops
    }

    fn free(m: &mut CachingAllocatorModel, key: u64) -> Vec<ModelOp> {
        let mut ops = Vec::new();
        assert!(m.free(key, &mut ops));
        ops
    }

    fn block_sizes(m: &CachingAllocatorModel) -> Vec<Vec<(u64, bool)>> {
        m.segments(0)
            .iter()
            .map(|s| {
                s.blocks
                    .iter()
                    .map(|b| (b.size, b.state.is_active()))
                    .collect()
            })
            .collect()
    }

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
