//! Turns the shim's raw events into the device-shaped stream every consumer reads, and
//! keeps the exact accounting that must survive dropped batches: live bytes per category,
//! allocated/reserved with per-phase peaks, and the trace ring that snapshots are cut from.
//!
//! On CPU, libtorch's CPU allocator requests go through the caching-allocator model, so the
//! stream carries modelled device addresses and segment events, as a GPU would show.
//! On CUDA the caching allocator's own trace passes through.

use std::collections::{BTreeMap, VecDeque};

use rustc_hash::{FxHashMap, FxHashSet};

use crate::allocator::config::round_size;
use crate::allocator::{AllocatorConfig, CachingAllocatorModel, ModelOp};
use crate::event::{Action, Batch, Category, MemEvent, Phase, PhaseMark, Retag};
use crate::snapshot::model::StackId;

use super::raw::{RawEvent, RAW_ALLOC, RAW_FREE, RAW_OOM};

/// Where events come from, which decides how they are translated.
pub enum Backend {
    /// libtorch CPU allocator requests, modelled as the CUDA caching allocator.
    Modelled(Box<CachingAllocatorModel>),
    /// The CUDA caching allocator's own trace, of the device the job allocates on; the
    /// allocator's counters are read (never reset) at phase boundaries.
    Cuda { device: u8 },
}

#[derive(Clone, Copy, Debug)]
struct Live {
    addr: u64,
    size: u64,
    /// The block the allocator handed out (CUDA: the request rounded as PyTorch rounds it).
    block: u64,
    category: Category,
    /// Set when the loop named the category; provisional ones may still change at free.
    tagged: bool,
    step: u32,
    phase: Phase,
    scope: u32,
    t_ns: u64,
    stream: i64,
    /// Stream sequence number of the alloc event (to fix its category in the trace ring).
    seq: u64,
}

/// Exact figures since the last `take_step_stats`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepStats {
    pub phase_peak_allocated: [u64; 5],
    /// Requested bytes, as memory_viz's active timeline stacks them.
    pub phase_peak_active: [u64; 5],
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub peak_active: u64,
    /// The most active bytes each category held.
    pub category_peaks: [u64; 8],
    /// Active bytes × ns, from the step's first event to its last (`span`).
    active_byte_ns: u128,
    span: Option<(u64, u64)>,
}

impl StepStats {
    /// `active` bytes were held from the last event until `t_ns`.
    fn hold(&mut self, active: u64, t_ns: u64) {
        match &mut self.span {
            None => self.span = Some((t_ns, t_ns)),
            Some((_, last)) => {
                let t = t_ns.max(*last);
                self.active_byte_ns += u128::from(active) * u128::from(t - *last);
                *last = t;
            }
        }
    }

    /// Active bytes averaged over the step's time (its peak where no time passed): what a
    /// job holds on average, beside what it peaks at.
    pub fn mean_active(&self) -> u64 {
        match self.span {
            Some((first, last)) if last > first => (self.active_byte_ns / u128::from(last - first)) as u64,
            _ => self.peak_active,
        }
    }
}

/// Trace entries kept for snapshots, as PyTorch's `_record_memory_history` default.
pub const RING_ENTRIES: usize = 1_000_000;

pub struct Tracker {
    backend: Backend,
    /// Keyed by the raw address (CPU pointer, or device address on CUDA).
    /// Keyed by address: Fx, not SipHash, since every event looks one up (issue 35).
    live: FxHashMap<u64, Live>,
    next_seq: u64,
    pub category_bytes: [u64; 8],
    pub active_bytes: u64,
    /// Device counters as of the last event (modelled on CPU, set from the allocator on CUDA).
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    step_stats: StepStats,
    pending: Batch,
    /// Addresses `pending` holds retags for.
    retagged: FxHashSet<u64>,
    ring: VecDeque<MemEvent>,
    ring_cap: usize,
    marks: VecDeque<PhaseMark>,
    ops: Vec<ModelOp>,
    /// Stack id per (scope, phase), from the caller's frame table; 0 = empty stack.
    pub stack_of: FxHashMap<(u32, Phase), StackId>,
    /// CUDA: device memory mapped by segment events seen (start → size), so a viewer that
    /// attaches later learns what is reserved.
    segments: BTreeMap<u64, u64>,
    /// CUDA: reserved bytes the allocator counted that no segment event seen explains
    /// (segments made before the tracker attached).
    unseen_reserved: u64,
    /// The rounding PyTorch applies to a request (CUDA's allocated bytes between readings).
    divisions: [u64; crate::allocator::config::ROUNDUP_INTERVALS],
}

impl Tracker {
    pub fn new(backend: Backend, ring_cap: usize) -> Tracker {
        Tracker {
            backend,
            live: FxHashMap::default(),
            next_seq: 0,
            category_bytes: [0; 8],
            active_bytes: 0,
            allocated_bytes: 0,
            reserved_bytes: 0,
            step_stats: StepStats::default(),
            pending: Batch::default(),
            retagged: FxHashSet::default(),
            ring: VecDeque::new(),
            ring_cap,
            marks: VecDeque::new(),
            ops: Vec::new(),
            stack_of: FxHashMap::default(),
            segments: BTreeMap::new(),
            unseen_reserved: 0,
            divisions: AllocatorConfig::default().division_table(),
        }
    }

    /// CPU requests modelled as a GPU whose caching allocator runs with `config`.
    pub fn modelled(config: AllocatorConfig) -> Tracker {
        Tracker::new(Backend::Modelled(Box::new(CachingAllocatorModel::new(config))), RING_ENTRIES)
    }

    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Processes raw events in order.
    pub fn ingest(&mut self, raw: &[RawEvent]) {
        for e in raw {
            self.step_stats.hold(self.active_bytes, e.t_ns);
            let phase = Phase::from_u8(e.phase);
            if e.action == RAW_OOM && matches!(self.backend, Backend::Modelled(_)) {
                // A failed CPU allocation: what a CUDA OOM entry says, with the modelled
                // device's free bytes unknown.
                self.emit(e, Action::Oom, 0, e.size, Category::Unknown);
                continue;
            }
            match &mut self.backend {
                Backend::Modelled(model) => {
                    let mut ops = std::mem::take(&mut self.ops);
                    ops.clear();
                    let ok = match e.action {
                        RAW_ALLOC => {
                            let stack = self.stack_of.get(&(e.scope, phase)).copied().unwrap_or(0);
                            model.malloc(e.addr, e.size, 0, stack, &mut ops);
                            true
                        }
                        RAW_FREE => model.free(e.addr, &mut ops),
                        _ => false,
                    };
                    if ok {
                        let stats = model.stats();
                        self.allocated_bytes = stats.allocated_bytes;
                        self.reserved_bytes = stats.reserved_bytes;
                        for op in &ops {
                            match *op {
                                ModelOp::SegmentAlloc { addr, size } => {
                                    self.emit(e, Action::SegmentAlloc, addr, size, Category::Unknown)
                                }
                                ModelOp::SegmentFree { addr, size } => {
                                    self.emit(e, Action::SegmentFree, addr, size, Category::Unknown)
                                }
                                ModelOp::SegmentMap { addr, size } => {
                                    self.emit(e, Action::SegmentMap, addr, size, Category::Unknown)
                                }
                                ModelOp::SegmentUnmap { addr, size } => {
                                    self.emit(e, Action::SegmentUnmap, addr, size, Category::Unknown)
                                }
                                ModelOp::Alloc { addr, size, .. } => self.on_alloc(e, e.addr, addr, size),
                                ModelOp::Free { .. } => self.on_free(e, e.addr, true),
                            }
                        }
                    }
                    self.ops = ops;
                }
                Backend::Cuda { .. } => match Action::from_u8(e.action) {
                    Some(Action::Alloc) => self.on_alloc(e, e.addr, e.addr, e.size),
                    Some(Action::FreeRequested) => self.on_free(e, e.addr, false),
                    Some(Action::FreeCompleted) => {
                        self.emit(e, Action::FreeCompleted, e.addr, e.size, Category::Unknown)
                    }
                    // Expandable segments map and unmap pages of one address range: each
                    // changes reserved memory as a whole segment's alloc and free do.
                    Some(a @ (Action::SegmentAlloc | Action::SegmentMap)) => {
                        self.reserved_bytes += e.size;
                        map_range(&mut self.segments, e.addr, e.size);
                        self.emit(e, a, e.addr, e.size, Category::Unknown)
                    }
                    Some(a @ (Action::SegmentFree | Action::SegmentUnmap)) => {
                        self.reserved_bytes = self.reserved_bytes.saturating_sub(e.size);
                        unmap_range(&mut self.segments, e.addr, e.size);
                        self.emit(e, a, e.addr, e.size, Category::Unknown)
                    }
                    Some(a) => self.emit(e, a, e.addr, e.size, Category::Unknown),
                    None => {}
                },
            }
            self.note_peaks(phase);
        }
    }

    fn note_peaks(&mut self, phase: Phase) {
        let s = &mut self.step_stats;
        let p = &mut s.phase_peak_allocated[phase as usize];
        *p = (*p).max(self.allocated_bytes);
        let a = &mut s.phase_peak_active[phase as usize];
        *a = (*a).max(self.active_bytes);
        s.peak_allocated = s.peak_allocated.max(self.allocated_bytes);
        s.peak_reserved = s.peak_reserved.max(self.reserved_bytes);
        s.peak_active = s.peak_active.max(self.active_bytes);
        for (peak, now) in s.category_peaks.iter_mut().zip(self.category_bytes) {
            *peak = (*peak).max(now);
        }
    }

    fn on_alloc(&mut self, e: &RawEvent, key: u64, addr: u64, size: u64) {
        let phase = Phase::from_u8(e.phase);
        let category = Category::provisional(phase);
        let seq = self.next_seq;
        let block = round_size(size, &self.divisions);
        self.live.insert(
            key,
            Live { addr, size, block, category, tagged: false, step: e.step, phase, scope: e.scope, t_ns: e.t_ns, stream: e.stream, seq },
        );
        self.category_bytes[category as usize] += size;
        self.active_bytes += size;
        if let Backend::Cuda { .. } = self.backend {
            // The trace carries requests, not blocks: between readings of the allocator's
            // own counter, allocated moves by the block PyTorch rounds the request to.
            self.allocated_bytes += block;
        }
        self.emit(e, Action::Alloc, addr, size, category);
    }

    fn on_free(&mut self, e: &RawEvent, key: u64, complete: bool) {
        let Some(mut l) = self.live.remove(&key) else { return };
        let phase = Phase::from_u8(e.phase);
        // Made and dropped inside one phase of one step: scratch, whatever it was presumed.
        // Its free event says so: a retag, which viewers apply after the batch, is for
        // allocations that live on.
        if !l.tagged && l.step == e.step && l.phase == phase {
            self.relabel(&mut l, Category::Temporary, 0);
        }
        if !self.retagged.is_empty() && self.retagged.remove(&l.addr) {
            // Moved in the batch not yet shipped, and gone before it ships: a viewer applies
            // a batch's retags after its events, so this one would land on whatever holds
            // the address next. Its span keeps the category the viewer saw it made with.
            self.pending.retags.retain(|r| r.addr != l.addr);
        }
        self.category_bytes[l.category as usize] -= l.size;
        self.active_bytes -= l.size;
        if let Backend::Cuda { .. } = self.backend {
            self.allocated_bytes = self.allocated_bytes.saturating_sub(l.block);
        }
        self.emit(e, Action::FreeRequested, l.addr, l.size, l.category);
        if complete {
            self.emit(e, Action::FreeCompleted, l.addr, l.size, l.category);
        }
    }

    /// Moves a live allocation to `to` (and names it `scope`, unless 0) in the totals, the
    /// trace ring and the batch not yet shipped. Returns whether viewers need a retag: its
    /// alloc event has shipped with what it was before.
    fn relabel(&mut self, l: &mut Live, to: Category, scope: u32) -> bool {
        let renamed = scope != 0 && scope != l.scope;
        if l.category == to && !renamed {
            return false;
        }
        self.category_bytes[l.category as usize] -= l.size;
        self.category_bytes[to as usize] += l.size;
        l.category = to;
        if renamed {
            l.scope = scope;
        }
        let first = self.next_seq - self.ring.len() as u64;
        if let Some(ev) = l.seq.checked_sub(first).and_then(|i| self.ring.get_mut(i as usize)) {
            ev.category = to;
            ev.scope = l.scope;
        }
        // Made in the batch not yet shipped: its own event says so, and no retag can
        // land on a later allocation at the same address.
        let unshipped = if self.pending.events.is_empty() { None } else { l.seq.checked_sub(self.pending.first_seq) };
        if let Some(ev) = unshipped.and_then(|i| self.pending.events.get_mut(i as usize)) {
            ev.category = to;
            ev.scope = l.scope;
            return false;
        }
        true
    }

    /// The loop names what the allocation at raw address `key` holds, and, with a scope,
    /// what it is called (a parameter's name).
    pub fn tag(&mut self, key: u64, category: Category, scope: u32) {
        if let Some(mut l) = self.live.get(&key).copied() {
            l.tagged = true;
            let renamed = scope != 0 && scope != l.scope;
            if self.relabel(&mut l, category, scope) {
                self.retagged.insert(l.addr);
                self.pending.retags.push(Retag { addr: l.addr, category, scope: if renamed { scope } else { 0 } });
            }
            self.live.insert(key, l);
        }
    }

    /// Step `step` ended. What an earlier step made, the loop never named, and is still held
    /// was presumed an activation or a temporary while it lived, but neither outlives the
    /// step after its own: it is kept across steps (cuBLAS's workspaces, one per thread's
    /// handle, made in the first step's forward and backward; a cache the job grows). One
    /// step's grace, since a script's variable holds the last step's logits into the next.
    pub fn settle_kept(&mut self, step: u64) {
        let kept: Vec<u64> = self
            .live
            .iter()
            .filter(|(_, l)| !l.tagged && u64::from(l.step) < step && matches!(l.category, Category::Activation | Category::Temporary))
            .map(|(key, _)| *key)
            .collect();
        for key in kept {
            self.tag(key, Category::Unknown, 0);
        }
    }

    /// What a viewer that attaches now needs to agree with the live totals: a segment
    /// event for the memory reserved now (segments made before it attached count), then
    /// an alloc event for every live allocation, in the order they were made.
    pub fn live_events(&self, t_ns: u64) -> Vec<MemEvent> {
        let mut live: Vec<&Live> = self.live.values().collect();
        live.sort_by_key(|l| l.seq);
        let device = self.device();
        // Mapped pages of an expandable segment are said as the maps they were.
        let segment = |addr: u64, size: u64, expandable: bool| MemEvent {
            t_ns,
            addr,
            size,
            stream: 0,
            step: 0,
            scope: 0,
            action: if expandable { Action::SegmentMap } else { Action::SegmentAlloc },
            phase: Phase::Other,
            device,
            category: Category::Unknown,
        };
        let mut out: Vec<MemEvent> = match &self.backend {
            Backend::Modelled(model) => {
                model.segments(i64::from(device)).iter().map(|s| segment(s.address, s.total_size, s.is_expandable)).collect()
            }
            // Ranges the trace mapped; whole segments and expandable pages alike add to
            // reserved memory.
            Backend::Cuda { .. } => {
                let mut v: Vec<MemEvent> = self.segments.iter().map(|(a, s)| segment(*a, *s, false)).collect();
                // Reserved before the tracker attached: known by size only, said as one
                // segment at address 0 so the viewer's reserved equals the allocator's.
                if self.unseen_reserved > 0 {
                    v.insert(0, segment(0, self.unseen_reserved, false));
                }
                v
            }
        };
        out.extend(live.iter().map(|l| MemEvent {
                t_ns: l.t_ns,
                addr: l.addr,
                size: l.size,
                stream: l.stream,
                step: l.step,
                scope: l.scope,
                action: Action::Alloc,
                phase: l.phase,
                device,
                category: l.category,
            }));
        out
    }

    /// The device events are reported on.
    pub fn device(&self) -> u8 {
        match self.backend {
            Backend::Modelled(_) => 0,
            Backend::Cuda { device } => device,
        }
    }

    fn emit(&mut self, e: &RawEvent, action: Action, addr: u64, size: u64, category: Category) {
        let ev = MemEvent {
            t_ns: e.t_ns,
            addr,
            size,
            stream: e.stream,
            step: e.step,
            scope: e.scope,
            action,
            phase: Phase::from_u8(e.phase),
            device: self.device(),
            category,
        };
        self.next_seq += 1;
        if self.pending.events.is_empty() {
            self.pending.first_seq = self.next_seq - 1;
        }
        self.pending.events.push(ev);
        if self.ring.len() == self.ring_cap {
            self.ring.pop_front();
        }
        self.ring.push_back(ev);
    }

    /// Records a phase boundary at the current stream position.
    pub fn mark(&mut self, t_ns: u64, step: u32, phase: Phase) {
        let m = PhaseMark { seq: self.next_seq, t_ns, step, phase };
        self.pending.marks.push(m);
        if self.marks.len() == self.ring_cap {
            self.marks.pop_front();
        }
        self.marks.push_back(m);
    }

    /// CUDA: the allocator's current counters (read, never reset: they are the job's own
    /// `torch.cuda.memory_allocated()` figures) replace the running figures; peaks stay
    /// those of the events seen.
    pub fn set_device_counters(&mut self, allocated: u64, reserved: u64, phase: Phase) {
        self.allocated_bytes = allocated;
        self.reserved_bytes = reserved;
        let seen: u64 = self.segments.values().sum();
        self.unseen_reserved = reserved.saturating_sub(seen);
        self.note_peaks(phase);
    }

    /// CUDA: follows `device` (the one the job allocates on).
    pub fn set_cuda_device(&mut self, device: u8) {
        if let Backend::Cuda { device: d } = &mut self.backend {
            *d = device;
        }
    }

    /// The job initialised CUDA: what was modelled from its CPU tensors is freed (their
    /// memory was never the device's), and from now on the allocator's trace is followed.
    /// The stream goes on without a gap, so viewers' totals stay consistent.
    pub fn switch_to_cuda(&mut self, t_ns: u64, device: u8) {
        let Backend::Modelled(_) = self.backend else { return };
        let mut live: Vec<(u64, u64, u32, u32)> = self.live.iter().map(|(k, l)| (l.seq, *k, l.step, l.scope)).collect();
        live.sort_unstable();
        let frees: Vec<RawEvent> = live
            .into_iter()
            .map(|(_, key, step, scope)| RawEvent { t_ns, addr: key, step, scope, action: RAW_FREE, ..RawEvent::default() })
            .collect();
        self.ingest(&frees);
        let mut ops = Vec::new();
        if let Backend::Modelled(model) = &mut self.backend {
            model.empty_cache(&mut ops);
        }
        let at = RawEvent { t_ns, ..RawEvent::default() };
        for op in ops {
            match op {
                ModelOp::SegmentFree { addr, size } => self.emit(&at, Action::SegmentFree, addr, size, Category::Unknown),
                ModelOp::SegmentUnmap { addr, size } => self.emit(&at, Action::SegmentUnmap, addr, size, Category::Unknown),
                _ => {}
            }
        }
        self.backend = Backend::Cuda { device };
        (self.allocated_bytes, self.reserved_bytes) = (0, 0);
    }

    /// Events wait to be sent.
    pub fn has_pending_events(&self) -> bool {
        !self.pending.events.is_empty()
    }

    pub fn take_batch(&mut self, scopes: Vec<(u32, String)>) -> Batch {
        let mut b = std::mem::take(&mut self.pending);
        self.retagged.clear();
        b.scopes = scopes;
        b
    }

    pub fn take_step_stats(&mut self) -> StepStats {
        // The next step starts from what is live now.
        let fresh = StepStats {
            peak_allocated: self.allocated_bytes,
            peak_reserved: self.reserved_bytes,
            peak_active: self.active_bytes,
            category_peaks: self.category_bytes,
            ..StepStats::default()
        };
        std::mem::replace(&mut self.step_stats, fresh)
    }

    pub fn trace(&self) -> impl ExactSizeIterator<Item = &MemEvent> {
        self.ring.iter()
    }

    pub fn marks(&self) -> impl Iterator<Item = &PhaseMark> {
        self.marks.iter()
    }

    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    /// Sum of live requested bytes recomputed from scratch (for consistency checks).
    pub fn live_bytes_recount(&self) -> u64 {
        self.live.values().map(|l| l.size).sum()
    }

    pub fn model(&self) -> Option<&CachingAllocatorModel> {
        match &self.backend {
            Backend::Modelled(m) => Some(m),
            Backend::Cuda { .. } => None,
        }
    }
}

/// Adds [addr, addr + size) to the mapped ranges (start → size).
fn map_range(ranges: &mut BTreeMap<u64, u64>, addr: u64, size: u64) {
    if size > 0 {
        ranges.insert(addr, size);
    }
}

/// Removes [addr, addr + size) from the mapped ranges, cutting any it overlaps (an unmap
/// may cover part of one map, or several).
fn unmap_range(ranges: &mut BTreeMap<u64, u64>, addr: u64, size: u64) {
    let end = addr.saturating_add(size);
    let first = ranges.range(..addr).next_back().filter(|(a, s)| *a + *s > addr).map(|(a, _)| *a).unwrap_or(addr);
    let hit: Vec<(u64, u64)> = ranges.range(first..end).map(|(a, s)| (*a, *s)).collect();
    for (a, s) in hit {
        ranges.remove(&a);
        if a < addr {
            ranges.insert(a, addr - a);
        }
        if a + s > end {
            ranges.insert(end, a + s - end);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(action: u8, addr: u64, size: u64, step: u32, phase: Phase, device: u8) -> RawEvent {
        RawEvent { t_ns: 0, addr, size, stream: 0, step, scope: 0, action, phase: phase as u8, device, ..Default::default() }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn what_outlives_the_step_after_its_own_is_kept_not_an_activation() {
        let dev = 0;
        let mut t = Tracker::new(Backend::Cuda { device: dev }, 64);
        // Step 0: a workspace made in forward and one in backward, both held for good; the
        // step's logits, which the script holds until the next forward replaces them.
        t.ingest(&[
            raw(Action::Alloc as u8, 0x100, 32 * MIB, 0, Phase::Forward, dev),
            raw(Action::Alloc as u8, 0x200, MIB, 0, Phase::Forward, dev),
            raw(Action::Alloc as u8, 0x300, 32 * MIB, 0, Phase::Backward, dev),
        ]);
        t.settle_kept(0);
        assert_eq!(t.category_bytes[Category::Activation as usize], 33 * MIB, "the step's own allocations keep their presumed names");
        let _ = t.take_batch(Vec::new());
        // Step 1 frees the old logits in its forward; at its end the workspaces are kept.
        t.ingest(&[raw(Action::FreeRequested as u8, 0x200, 0, 1, Phase::Forward, dev), raw(Action::Alloc as u8, 0x400, MIB, 1, Phase::Forward, dev)]);
        t.settle_kept(1);
        assert_eq!(t.category_bytes[Category::Unknown as usize], 64 * MIB);
        assert_eq!(t.category_bytes[Category::Activation as usize], MIB, "step 1's logits");
        assert_eq!(t.category_bytes[Category::Temporary as usize], 0);
        // Viewers that saw them made are told (their alloc events shipped with step 0).
        let retags: Vec<(u64, Category)> = t.take_batch(Vec::new()).retags.iter().map(|r| (r.addr, r.category)).collect();
        assert_eq!(retags.len(), 2);
        assert!(retags.iter().all(|(a, c)| (*a == 0x100 || *a == 0x300) && *c == Category::Unknown), "{retags:?}");
        // And snapshots cut later say so.
        assert!(t.trace().filter(|e| e.size == 32 * MIB).all(|e| e.category == Category::Unknown));
        // Once kept, they stay kept: step 2, which frees step 1's logits, has nothing to move.
        t.ingest(&[raw(Action::FreeRequested as u8, 0x400, 0, 2, Phase::Forward, dev)]);
        t.settle_kept(2);
        assert!(t.take_batch(Vec::new()).retags.is_empty());
    }

    #[test]
    fn cpu_requests_become_a_caching_allocator_stream() {
        let mut t = Tracker::modelled(AllocatorConfig::default());
        t.ingest(&[raw(RAW_ALLOC, 0x1000, 1000, 0, Phase::Forward, crate::producer::raw::CPU_DEVICE)]);
        let b = t.take_batch(Vec::new());
        let actions: Vec<Action> = b.events.iter().map(|e| e.action).collect();
        assert_eq!(actions, [Action::SegmentAlloc, Action::Alloc]);
        assert_eq!(b.events[0].size, 2 * MIB, "a small request opens a 2 MiB small-pool segment");
        assert_eq!(b.events[1].size, 1000, "alloc events carry the request, as PyTorch's do");
        assert_eq!(t.allocated_bytes, 1024, "allocated counts the rounded block");
        assert_eq!((t.reserved_bytes, t.active_bytes), (2 * MIB, 1000));
        // Freed in the phase it was made: scratch, whatever it was presumed to be.
        t.ingest(&[raw(RAW_FREE, 0x1000, 0, 0, Phase::Forward, crate::producer::raw::CPU_DEVICE)]);
        let b = t.take_batch(Vec::new());
        let actions: Vec<Action> = b.events.iter().map(|e| e.action).collect();
        assert_eq!(actions, [Action::FreeRequested, Action::FreeCompleted]);
        assert_eq!(b.events[0].category, Category::Temporary);
        // Gone before its batch ships: no retag, which a viewer would apply after the
        // batch's events, to whatever then holds the address.
        assert!(b.retags.is_empty());
        assert_eq!((t.active_bytes, t.allocated_bytes, t.reserved_bytes), (0, 0, 2 * MIB), "the segment stays cached");
        // The ring holds the same stream for snapshots, with the corrected category.
        let ring: Vec<(Action, Category)> = t.trace().map(|e| (e.action, e.category)).collect();
        assert_eq!(ring[1], (Action::Alloc, Category::Temporary));
        // Made and freed before its batch ships, its address reused at once: the scratch
        // allocation's own event says temporary, and the newcomer keeps its category.
        t.ingest(&[
            raw(RAW_ALLOC, 0x2000, 4096, 1, Phase::Forward, crate::producer::raw::CPU_DEVICE),
            raw(RAW_FREE, 0x2000, 0, 1, Phase::Forward, crate::producer::raw::CPU_DEVICE),
            raw(RAW_ALLOC, 0x2000, 4096, 1, Phase::Forward, crate::producer::raw::CPU_DEVICE),
        ]);
        let b = t.take_batch(Vec::new());
        let allocs: Vec<(u64, Category)> = b.events.iter().filter(|e| e.action == Action::Alloc).map(|e| (e.addr, e.category)).collect();
        assert_eq!(allocs.len(), 2);
        assert_eq!(allocs[0].0, allocs[1].0, "the model hands the same block out again");
        assert_eq!((allocs[0].1, allocs[1].1), (Category::Temporary, Category::provisional(Phase::Forward)));
        assert!(b.retags.is_empty());
    }

    #[test]
    fn tags_name_categories_and_survivors_keep_theirs() {
        let mut t = Tracker::modelled(AllocatorConfig::default());
        let cpu = crate::producer::raw::CPU_DEVICE;
        t.ingest(&[
            raw(RAW_ALLOC, 0x10, 4 * MIB, 0, Phase::Other, cpu),
            raw(RAW_ALLOC, 0x20, 3 * MIB, 0, Phase::Forward, cpu),
        ]);
        t.tag(0x10, Category::Parameter, 5);
        assert_eq!(t.category_bytes[Category::Parameter as usize], 4 * MIB);
        // A viewer attaching now gets both, oldest first, the parameter under its name.
        let live: Vec<(Action, u64, u32, Category)> = t.live_events(9).iter().map(|e| (e.action, e.size, e.scope, e.category)).collect();
        assert_eq!(
            live,
            [
                (Action::SegmentAlloc, 20 * MIB, 0, Category::Unknown),
                (Action::Alloc, 4 * MIB, 5, Category::Parameter),
                (Action::Alloc, 3 * MIB, 0, Category::Activation)
            ],
            "the segment holding both comes first, so the viewer's reserved is the model's"
        );
        let named = t.trace().find(|e| e.action == Action::Alloc && e.size == 4 * MIB).unwrap();
        assert_eq!((named.scope, named.category), (5, Category::Parameter), "snapshots cut later name it too");
        assert_eq!(t.category_bytes[Category::Activation as usize], 3 * MIB);
        // An activation freed in backward stays an activation.
        t.ingest(&[raw(RAW_FREE, 0x20, 0, 0, Phase::Backward, cpu)]);
        let frees: Vec<Category> = t.take_batch(Vec::new()).events.iter().filter(|e| e.action == Action::FreeRequested).map(|e| e.category).collect();
        assert_eq!(frees, [Category::Activation]);
        assert_eq!(t.live_bytes_recount(), 4 * MIB);
        let stats = t.take_step_stats();
        assert_eq!(stats.phase_peak_allocated[Phase::Forward as usize], 7 * MIB);
        assert_eq!(stats.peak_active, 7 * MIB);
    }

    #[test]
    fn cuda_trace_passes_through_with_reserved_from_segment_events() {
        let mut t = Tracker::new(Backend::Cuda { device: 0 }, 16);
        t.ingest(&[
            raw(Action::SegmentAlloc as u8, 0xa000, 20 * MIB, 0, Phase::Forward, 0),
            raw(Action::Alloc as u8, 0xa000, 5 * MIB, 0, Phase::Forward, 0),
            raw(Action::FreeRequested as u8, 0xa000, 5 * MIB, 0, Phase::Backward, 0),
            raw(Action::FreeCompleted as u8, 0xa000, 5 * MIB, 0, Phase::Backward, 0),
            raw(Action::Oom as u8, 1 << 30, 80 << 30, 0, Phase::Backward, 0),
            raw(Action::SegmentFree as u8, 0xa000, 20 * MIB, 0, Phase::Other, 0),
        ]);
        let b = t.take_batch(Vec::new());
        let actions: Vec<Action> = b.events.iter().map(|e| e.action).collect();
        assert_eq!(
            actions,
            [Action::SegmentAlloc, Action::Alloc, Action::FreeRequested, Action::FreeCompleted, Action::Oom, Action::SegmentFree]
        );
        assert_eq!(b.events[1].addr, 0xa000, "real device addresses are kept");
        assert_eq!(b.events[4].size, 80 << 30, "an oom entry carries the requested size");
        assert_eq!(t.reserved_bytes, 0);
        let s = t.take_step_stats();
        assert_eq!(s.peak_reserved, 20 * MIB);
        assert_eq!(s.peak_active, 5 * MIB);
        assert_eq!(s.phase_peak_allocated[Phase::Forward as usize], 5 * MIB, "the peak is the events' own");
    }

    #[test]
    fn a_step_averages_its_active_bytes_over_time_and_keeps_each_categorys_peak() {
        let mut t = Tracker::modelled(AllocatorConfig::default());
        let cpu = crate::producer::raw::CPU_DEVICE;
        let at = |t_ns, action, addr, size, phase| RawEvent { t_ns, ..raw(action, addr, size, 0, phase, cpu) };
        // 1 MiB for 100 ns, 2 MiB for 100 ns, 1 MiB for 200 ns: 1.25 MiB on average.
        t.ingest(&[
            at(1000, RAW_ALLOC, 0x10, MIB, Phase::Other),
            at(1100, RAW_ALLOC, 0x20, MIB, Phase::Forward),
            at(1200, RAW_FREE, 0x10, 0, Phase::Forward),
            at(1400, RAW_FREE, 0x20, 0, Phase::Forward),
        ]);
        let s = t.take_step_stats();
        assert_eq!(s.peak_active, 2 * MIB);
        assert_eq!(s.mean_active(), MIB + MIB / 4);
        assert_eq!(s.category_peaks[Category::Activation as usize], MIB, "the forward's allocation, presumed an activation while it lived");
        assert_eq!(s.category_peaks.iter().sum::<u64>(), 2 * MIB);
        // A step with no time between its events averages to its peak.
        assert_eq!(t.take_step_stats().mean_active(), 0);
    }

    #[test]
    fn cuda_allocated_moves_by_rounded_blocks_between_counter_readings() {
        let mut t = Tracker::new(Backend::Cuda { device: 0 }, 16);
        // What the allocator held before the tracker attached, read at a boundary.
        t.set_device_counters(8 * MIB, 40 * MIB, Phase::Other);
        t.ingest(&[
            raw(Action::Alloc as u8, 0xa000, 1000, 0, Phase::Forward, 0),
            raw(Action::Alloc as u8, 0xb000, 3 * MIB + 1, 0, Phase::Forward, 0),
        ]);
        // 1000 B is a 1024 B block; 3 MiB + 1 B rounds to the next 512 B.
        assert_eq!(t.allocated_bytes, 8 * MIB + 1024 + 3 * MIB + 512);
        t.ingest(&[raw(Action::FreeRequested as u8, 0xa000, 1000, 0, Phase::Backward, 0)]);
        assert_eq!(t.allocated_bytes, 8 * MIB + 3 * MIB + 512);
        let s = t.take_step_stats();
        assert_eq!(s.phase_peak_allocated[Phase::Forward as usize], 8 * MIB + 1024 + 3 * MIB + 512);
        // A reading corrects the running figure; it is the allocator's, never reset.
        t.set_device_counters(11 * MIB, 40 * MIB, Phase::Backward);
        assert_eq!((t.allocated_bytes, t.reserved_bytes), (11 * MIB, 40 * MIB));
    }

    #[test]
    fn expandable_segments_map_and_unmap_reserved_memory() {
        let mut t = Tracker::new(Backend::Cuda { device: 0 }, 64);
        let base = 0x7f00_0000_0000;
        t.ingest(&[
            raw(Action::SegmentMap as u8, base, 20 * MIB, 0, Phase::Forward, 0),
            raw(Action::SegmentMap as u8, base + 20 * MIB, 2 * MIB, 0, Phase::Forward, 0),
        ]);
        assert_eq!(t.reserved_bytes, 22 * MIB);
        assert_eq!(t.take_step_stats().peak_reserved, 22 * MIB);
        // An unmap across both mappings leaves the first 4 MiB mapped.
        t.ingest(&[raw(Action::SegmentUnmap as u8, base + 4 * MIB, 18 * MIB, 0, Phase::Other, 0)]);
        assert_eq!(t.reserved_bytes, 4 * MIB);
        let segs: Vec<(u64, u64)> = t.live_events(0).iter().map(|e| (e.addr, e.size)).collect();
        assert_eq!(segs, [(base, 4 * MIB)], "a viewer attaching now learns what is still mapped");
    }

    #[test]
    fn a_late_viewer_learns_reserved_memory_the_trace_never_showed() {
        let mut t = Tracker::new(Backend::Cuda { device: 0 }, 64);
        t.ingest(&[
            raw(Action::SegmentAlloc as u8, 0xa000_0000, 20 * MIB, 0, Phase::Forward, 0),
            raw(Action::Alloc as u8, 0xa000_0000, 5 * MIB, 0, Phase::Forward, 0),
        ]);
        // The allocator reserves 60 MiB: 40 MiB of it from before the tracker attached.
        t.set_device_counters(30 * MIB, 60 * MIB, Phase::Forward);
        let evs = t.live_events(7);
        let reserved: u64 = evs.iter().filter(|e| e.action == Action::SegmentAlloc).map(|e| e.size).sum();
        assert_eq!(reserved, 60 * MIB);
        assert_eq!((evs[0].addr, evs[0].size), (0, 40 * MIB));
        assert_eq!(evs.last().map(|e| (e.action, e.size)), Some((Action::Alloc, 5 * MIB)));
    }

    #[test]
    fn switching_to_cuda_lets_the_modelled_cpu_memory_go() {
        let mut t = Tracker::modelled(AllocatorConfig::default());
        let cpu = crate::producer::raw::CPU_DEVICE;
        t.ingest(&[raw(RAW_ALLOC, 0x10, 4 * MIB, 0, Phase::Other, cpu), raw(RAW_ALLOC, 0x20, 1000, 0, Phase::Other, cpu)]);
        let _ = t.take_batch(Vec::new());
        let seq = t.next_seq();
        t.switch_to_cuda(5, 0);
        let b = t.take_batch(Vec::new());
        assert_eq!(b.first_seq, seq, "the stream goes on without a gap");
        let freed: u64 = b.events.iter().filter(|e| e.action == Action::FreeRequested).map(|e| e.size).sum();
        let released: u64 = b.events.iter().filter(|e| e.action == Action::SegmentFree).map(|e| e.size).sum();
        assert_eq!(freed, 4 * MIB + 1000);
        assert_eq!(released, 20 * MIB + 2 * MIB, "both segments go back");
        assert_eq!((t.active_bytes, t.allocated_bytes, t.reserved_bytes, t.live_count()), (0, 0, 0, 0));
        assert!(matches!(t.backend(), Backend::Cuda { .. }));
        // From here the allocator's trace passes through.
        t.ingest(&[raw(Action::Alloc as u8, 0xd000, 512, 0, Phase::Forward, 0)]);
        assert_eq!(t.live_events(0).len(), 1);
    }

    #[test]
    fn the_trace_ring_keeps_the_newest_events() {
        let mut t = Tracker::new(Backend::Cuda { device: 0 }, 4);
        let evs: Vec<RawEvent> = (0..10).map(|i| raw(Action::Alloc as u8, 0x100 + i, 512, 0, Phase::Forward, 0)).collect();
        t.ingest(&evs);
        let addrs: Vec<u64> = t.trace().map(|e| e.addr).collect();
        assert_eq!(addrs, [0x106, 0x107, 0x108, 0x109]);
        assert_eq!(t.next_seq(), 10);
    }
}
