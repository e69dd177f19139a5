//! Turns the shim's raw events into the device-shaped stream every consumer reads, and
//! keeps the exact accounting that must survive dropped batches: live bytes per category,
//! allocated/reserved with per-phase peaks, and the trace ring that snapshots are cut from.
//!
//! On CPU, libtorch's CPU allocator requests go through the caching-allocator model, so the
//! stream carries modelled device addresses and segment events, as a GPU would show.
//! On CUDA the caching allocator's own trace passes through.

use std::collections::{HashMap, VecDeque};

use crate::allocator::{AllocatorConfig, CachingAllocatorModel, ModelOp};
use crate::event::{Action, Batch, Category, MemEvent, Phase, PhaseMark, Retag};
use crate::snapshot::model::StackId;

use super::raw::{RawEvent, RAW_ALLOC, RAW_FREE, RAW_OOM};

/// Where events come from, which decides how they are translated.
pub enum Backend {
    /// libtorch CPU allocator requests, modelled as the CUDA caching allocator.
    Modelled(Box<CachingAllocatorModel>),
    /// The CUDA caching allocator's own trace; counters come from the allocator.
    Cuda { device: u8 },
}

#[derive(Clone, Copy, Debug)]
struct Live {
    addr: u64,
    size: u64,
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
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub peak_active: u64,
}

/// Trace entries kept for snapshots, as PyTorch's `_record_memory_history` default.
pub const RING_ENTRIES: usize = 1_000_000;

pub struct Tracker {
    backend: Backend,
    /// Keyed by the raw address (CPU pointer, or device address on CUDA).
    live: HashMap<u64, Live>,
    next_seq: u64,
    pub category_bytes: [u64; 8],
    pub active_bytes: u64,
    /// Device counters as of the last event (modelled on CPU, set from the allocator on CUDA).
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    step_stats: StepStats,
    pending: Batch,
    ring: VecDeque<MemEvent>,
    ring_cap: usize,
    marks: VecDeque<PhaseMark>,
    ops: Vec<ModelOp>,
    /// Stack id per (scope, phase), from the caller's frame table; 0 = empty stack.
    pub stack_of: HashMap<(u32, Phase), StackId>,
}

impl Tracker {
    pub fn new(backend: Backend, ring_cap: usize) -> Tracker {
        Tracker {
            backend,
            live: HashMap::new(),
            next_seq: 0,
            category_bytes: [0; 8],
            active_bytes: 0,
            allocated_bytes: 0,
            reserved_bytes: 0,
            step_stats: StepStats::default(),
            pending: Batch::default(),
            ring: VecDeque::new(),
            ring_cap,
            marks: VecDeque::new(),
            ops: Vec::new(),
            stack_of: HashMap::new(),
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
                    Some(Action::SegmentAlloc) => {
                        self.reserved_bytes += e.size;
                        self.emit(e, Action::SegmentAlloc, e.addr, e.size, Category::Unknown)
                    }
                    Some(Action::SegmentFree) => {
                        self.reserved_bytes = self.reserved_bytes.saturating_sub(e.size);
                        self.emit(e, Action::SegmentFree, e.addr, e.size, Category::Unknown)
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
        s.peak_allocated = s.peak_allocated.max(self.allocated_bytes);
        s.peak_reserved = s.peak_reserved.max(self.reserved_bytes);
        s.peak_active = s.peak_active.max(self.active_bytes);
    }

    fn on_alloc(&mut self, e: &RawEvent, key: u64, addr: u64, size: u64) {
        let phase = Phase::from_u8(e.phase);
        let category = Category::provisional(phase);
        let seq = self.next_seq;
        self.live.insert(
            key,
            Live { addr, size, category, tagged: false, step: e.step, phase, scope: e.scope, t_ns: e.t_ns, stream: e.stream, seq },
        );
        self.category_bytes[category as usize] += size;
        self.active_bytes += size;
        if let Backend::Cuda { .. } = self.backend {
            // Until the allocator's counters are read at the phase end, requested bytes are
            // the best live figure for "allocated".
            self.allocated_bytes = self.allocated_bytes.max(self.active_bytes);
        }
        self.emit(e, Action::Alloc, addr, size, category);
    }

    fn on_free(&mut self, e: &RawEvent, key: u64, complete: bool) {
        let Some(mut l) = self.live.remove(&key) else { return };
        let phase = Phase::from_u8(e.phase);
        // Made and dropped inside one phase of one step: scratch, whatever it was presumed.
        if !l.tagged && l.step == e.step && l.phase == phase && l.category != Category::Temporary {
            self.recategorize(&mut l, Category::Temporary, 0);
        }
        self.category_bytes[l.category as usize] -= l.size;
        self.active_bytes -= l.size;
        self.emit(e, Action::FreeRequested, l.addr, l.size, l.category);
        if complete {
            self.emit(e, Action::FreeCompleted, l.addr, l.size, l.category);
        }
    }

    /// Moves a live allocation to `to` (and names it `scope`, unless 0).
    fn recategorize(&mut self, l: &mut Live, to: Category, scope: u32) {
        let renamed = scope != 0 && scope != l.scope;
        if l.category == to && !renamed {
            return;
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
        self.pending.retags.push(Retag { addr: l.addr, category: to, scope: if renamed { scope } else { 0 } });
    }

    /// The loop names what the allocation at raw address `key` holds, and, with a scope,
    /// what it is called (a parameter's name).
    pub fn tag(&mut self, key: u64, category: Category, scope: u32) {
        if let Some(mut l) = self.live.get(&key).copied() {
            l.tagged = true;
            self.recategorize(&mut l, category, scope);
            self.live.insert(key, l);
        }
    }

    /// What a viewer that attaches now needs to agree with the live totals: an alloc event
    /// for every live allocation, in the order they were made.
    pub fn live_events(&self) -> Vec<MemEvent> {
        let mut live: Vec<&Live> = self.live.values().collect();
        live.sort_by_key(|l| l.seq);
        let device = self.device();
        live.iter()
            .map(|l| MemEvent {
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
            })
            .collect()
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

    /// CUDA: replaces the running estimates with the allocator's own counters.
    pub fn set_device_counters(&mut self, allocated: u64, reserved: u64, phase: Phase) {
        self.allocated_bytes = allocated;
        self.reserved_bytes = reserved;
        self.note_peaks(phase);
    }

    /// CUDA: the allocator's peak since its last reset, attributed to `phase`.
    pub fn note_phase_peak(&mut self, phase: Phase, peak_allocated: u64, peak_reserved: u64) {
        let s = &mut self.step_stats;
        let p = &mut s.phase_peak_allocated[phase as usize];
        *p = (*p).max(peak_allocated);
        s.peak_allocated = s.peak_allocated.max(peak_allocated);
        s.peak_reserved = s.peak_reserved.max(peak_reserved);
    }

    pub fn take_batch(&mut self, scopes: Vec<(u32, String)>) -> Batch {
        let mut b = std::mem::take(&mut self.pending);
        b.scopes = scopes;
        b
    }

    pub fn take_step_stats(&mut self) -> StepStats {
        // The next step starts from what is live now.
        let fresh = StepStats {
            peak_allocated: self.allocated_bytes,
            peak_reserved: self.reserved_bytes,
            peak_active: self.active_bytes,
            ..StepStats::default()
        };
        std::mem::replace(&mut self.step_stats, fresh)
    }

    pub fn trace(&self) -> impl Iterator<Item = &MemEvent> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(action: u8, addr: u64, size: u64, step: u32, phase: Phase, device: u8) -> RawEvent {
        RawEvent { t_ns: 0, addr, size, stream: 0, step, scope: 0, action, phase: phase as u8, device, ..Default::default() }
    }

    const MIB: u64 = 1 << 20;

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
        assert_eq!(b.retags, vec![Retag { addr: b.events[0].addr, category: Category::Temporary, scope: 0 }]);
        assert_eq!((t.active_bytes, t.allocated_bytes, t.reserved_bytes), (0, 0, 2 * MIB), "the segment stays cached");
        // The ring holds the same stream for snapshots, with the corrected category.
        let ring: Vec<(Action, Category)> = t.trace().map(|e| (e.action, e.category)).collect();
        assert_eq!(ring[1], (Action::Alloc, Category::Temporary));
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
        let live: Vec<(u64, u32, Category)> = t.live_events().iter().map(|e| (e.size, e.scope, e.category)).collect();
        assert_eq!(live, [(4 * MIB, 5, Category::Parameter), (3 * MIB, 0, Category::Activation)]);
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
        // The allocator's own counters replace the running estimate at phase ends.
        t.note_phase_peak(Phase::Forward, 6 * MIB, 20 * MIB);
        t.set_device_counters(0, 0, Phase::Other);
        assert_eq!(t.take_step_stats().phase_peak_allocated[Phase::Forward as usize], 6 * MIB);
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
