//! Replaying a snapshot's trace through the model: the state before the trace's first
//! entry, feeding the trace to a model, and how closely the model reproduces what the
//! real allocator did.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use serde::Serialize;

use super::config::{
    round_size, AllocatorConfig, LARGE_BUFFER, MIN_BLOCK_SIZE, SMALL_BUFFER, SMALL_SIZE,
};
use super::model::{CachingAllocatorModel, ModelOp};
use crate::snapshot::model::{
    Action, Block, BlockState, Segment, SegmentType, Snapshot, StackId, TraceEntry,
};

/// Disjoint address ranges `start → end`, merged where they touch.
#[derive(Default)]
struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    /// Ranges starting at or before `b` that reach `a` or beyond (touching counts).
    fn touching(&self, a: u64, b: u64) -> Vec<(u64, u64)> {
        self.0
            .range(..=b)
            .rev()
            .take_while(|(_, &e)| e >= a)
            .map(|(&s, &e)| (s, e))
            .collect()
    }

    fn add(&mut self, a: u64, b: u64) {
        let (mut a, mut b) = (a, b);
        for (s, e) in self.touching(a, b) {
            self.0.remove(&s);
            a = a.min(s);
            b = b.max(e);
        }
        self.0.insert(a, b);
    }

    fn remove(&mut self, a: u64, b: u64) {
        for (s, e) in self
            .touching(a, b)
            .into_iter()
            .filter(|&(s, e)| s < b && e > a)
        {
            self.0.remove(&s);
            if s < a {
                self.0.insert(s, a);
            }
            if e > b {
                self.0.insert(b, e);
            }
        }
    }
}

/// Reserved bytes before `device`'s first trace entry: its final segments rewound
/// through the trace's segment events.
pub fn reserved_before_trace(s: &Snapshot, device: usize) -> u64 {
    let last: i128 = s
        .segments
        .iter()
        .filter(|seg| seg.device == device as i64)
        .map(|seg| seg.total_size as i128)
        .sum();
    let trace: &[_] = s.device_traces.get(device).map_or(&[], Vec::as_slice);
    (last - trace.iter().map(reserved_change).sum::<i128>()).max(0) as u64
}

/// How a trace entry changes reserved bytes.
pub fn reserved_change(e: &TraceEntry) -> i128 {
    e.action.reserved_sign() as i128 * e.size as i128
}

/// The device's memory the allocator could have had: at the trace's first `oom`, what
/// was reserved plus what the device still had free. None without an `oom` entry.
pub fn oom_capacity(s: &Snapshot, device: usize) -> Option<u64> {
    let trace: &[_] = s.device_traces.get(device).map_or(&[], Vec::as_slice);
    let at = trace.iter().position(|e| e.action == Action::Oom)?;
    let reserved = reserved_before_trace(s, device) as i128
        + trace[..at].iter().map(reserved_change).sum::<i128>();
    Some(reserved.max(0) as u64 + trace[at].addr)
}

/// Segments and blocks alive before the first trace entry of `device`.
///
/// Segments created in the trace did not exist yet; segments freed in the trace without
/// being created there did. Expandable segments' mapped memory is the final mapped
/// ranges with the trace's maps taken out and its unmaps put back. The blocks alive at
/// the start are the active blocks of the final state whose address the trace never
/// allocates, plus those the trace frees without allocating; every gap between them was
/// one free block (the allocator merges free neighbours at once). A block freed without
/// its allocation in the trace ends where the trace first allocates above it while it is
/// alive (an allocation from the free block after it starts exactly there). Without that
/// evidence it has its rounded request size, extended over a following gap the allocator
/// would not have split off (≤ 1 MiB in the large pool without expandable segments); it
/// may really be up to 1 MiB longer, which no later event can show once it merges with
/// that gap.
pub fn state_before_trace(s: &Snapshot, device: usize, cfg: &AllocatorConfig) -> Vec<Segment> {
    let trace: &[_] = s.device_traces.get(device).map_or(&[], Vec::as_slice);
    let divisions = cfg.division_table();
    let finals: Vec<&Segment> = s
        .segments
        .iter()
        .filter(|seg| seg.device == device as i64)
        .collect();
    let mut created = HashSet::new();
    let mut freed_first: Vec<Segment> = Vec::new();
    let mut open: HashSet<u64> = HashSet::new();
    let mut allocated_in_trace = HashSet::new();
    // (address, requested size, frames, trace position) of blocks freed before any
    // allocation in the trace.
    let mut alive_unallocated: Vec<(u64, u64, StackId, usize)> = Vec::new();
    // (address, trace position) of every alloc.
    let mut allocs: Vec<(u64, usize)> = Vec::new();
    let empty = |address: u64,
                 total_size: u64,
                 stream: i64,
                 small: bool,
                 expandable: bool,
                 frames: StackId| Segment {
        device: device as i64,
        address,
        total_size,
        allocated_size: 0,
        active_size: 0,
        requested_size: 0,
        stream,
        segment_type: if small {
            SegmentType::Small
        } else {
            SegmentType::Large
        },
        segment_pool_id: (0, 0),
        is_expandable: expandable,
        frames,
        blocks: Vec::new(),
    };
    for (pos, e) in trace.iter().enumerate() {
        match e.action {
            Action::SegmentAlloc => {
                created.insert(e.addr);
            }
            Action::SegmentFree if !created.contains(&e.addr) => {
                created.insert(e.addr);
                freed_first.push(empty(
                    e.addr,
                    e.size,
                    e.stream,
                    e.size == SMALL_BUFFER,
                    false,
                    e.frames,
                ));
            }
            Action::Alloc => {
                open.insert(e.addr);
                allocated_in_trace.insert(e.addr);
                allocs.push((e.addr, pos));
            }
            Action::FreeCompleted if !open.remove(&e.addr) => {
                alive_unallocated.push((e.addr, e.size, e.frames, pos));
            }
            _ => {}
        }
    }
    let mut mapped = Ranges::default();
    for seg in finals.iter().filter(|seg| seg.is_expandable) {
        mapped.add(seg.address, seg.address + seg.total_size);
    }
    let mut unmapped_first: Vec<&TraceEntry> = Vec::new();
    for e in trace.iter().rev() {
        match e.action {
            Action::SegmentMap => mapped.remove(e.addr, e.addr + e.size),
            Action::SegmentUnmap => {
                mapped.add(e.addr, e.addr + e.size);
                unmapped_first.push(e);
            }
            _ => {}
        }
    }
    let mut out: Vec<Segment> = finals
        .iter()
        .filter(|seg| !seg.is_expandable && !created.contains(&seg.address))
        .map(|seg| Segment {
            blocks: Vec::new(),
            ..(*seg).clone()
        })
        .chain(freed_first)
        .collect();
    for (&a, &b) in &mapped.0 {
        // Stream and pool from the final segment there, else from the unmap that shows it.
        let within = |start: u64, size: u64| (start..start + size).contains(&a);
        let seg = match finals
            .iter()
            .find(|f| f.is_expandable && within(f.address, f.total_size))
        {
            Some(f) => empty(
                a,
                b - a,
                f.stream,
                f.segment_type == SegmentType::Small,
                true,
                f.frames,
            ),
            None => {
                let u = unmapped_first.iter().find(|u| within(u.addr, u.size));
                let (stream, size) = u.map_or((0, b - a), |u| (u.stream, u.size));
                empty(a, b - a, stream, size % LARGE_BUFFER != 0, true, 0)
            }
        };
        out.push(seg);
    }
    out.sort_by_key(|seg| seg.address);
    // Blocks alive at the start with a known size: the final ones never allocated here.
    let mut known: Vec<&Block> = finals
        .iter()
        .flat_map(|seg| &seg.blocks)
        .filter(|b| b.state.is_active() && !allocated_in_trace.contains(&b.address))
        .collect();
    known.sort_by_key(|b| b.address);
    alive_unallocated.sort_by_key(|a| a.0);
    allocs.sort_unstable();
    for seg in &mut out {
        let end = seg.address + seg.total_size;
        let tight = seg.segment_type == SegmentType::Small || cfg.expandable_segments;
        let in_seg = |addr: u64| (seg.address..end).contains(&addr);
        // (address, size or None when it must be inferred, requested, frames, free position)
        let lo = known.partition_point(|b| b.address < seg.address);
        let mut alive: Vec<(u64, Option<u64>, u64, StackId, usize)> = known[lo..]
            .iter()
            .take_while(|b| in_seg(b.address))
            .map(|b| (b.address, Some(b.size), b.requested_size, b.frames, 0))
            .collect();
        let lo = alive_unallocated.partition_point(|a| a.0 < seg.address);
        let hi = alive_unallocated.partition_point(|a| a.0 < end);
        alive.extend(
            alive_unallocated[lo..hi]
                .iter()
                .map(|&(a, r, f, p)| (a, None, r, f, p)),
        );
        alive.sort_by_key(|a| a.0);
        let mut blocks = Vec::new();
        let mut cursor = seg.address;
        for (i, &(addr, size, requested, frames, freed_at)) in alive.iter().enumerate() {
            if addr > cursor {
                blocks.push(free_block(cursor, addr - cursor));
            }
            let bound = alive.get(i + 1).map_or(end, |n| n.0);
            let size = size.unwrap_or_else(|| {
                let first_above = allocs[allocs.partition_point(|a| a.0 <= addr)..]
                    .iter()
                    .take_while(|a| a.0 < bound)
                    .find(|a| a.1 < freed_at);
                if let Some(&(above, _)) = first_above {
                    return above - addr;
                }
                let rounded = round_size(requested, &divisions).min(bound - addr);
                let gap = bound - addr - rounded;
                let keeps_gap = if tight {
                    gap < MIN_BLOCK_SIZE
                } else {
                    gap <= SMALL_SIZE
                };
                if keeps_gap {
                    rounded + gap
                } else {
                    rounded
                }
            });
            blocks.push(Block {
                address: addr,
                size,
                requested_size: requested,
                state: BlockState::ActiveAllocated,
                frames,
            });
            cursor = addr + size;
        }
        if cursor < end {
            blocks.push(free_block(cursor, end - cursor));
        }
        seg.allocated_size = blocks
            .iter()
            .filter(|b| b.state.is_active())
            .map(|b| b.size)
            .sum();
        seg.active_size = seg.allocated_size;
        seg.requested_size = blocks
            .iter()
            .filter(|b| b.state.is_active())
            .map(|b| b.requested_size)
            .sum();
        seg.blocks = blocks;
    }
    out
}

fn free_block(address: u64, size: u64) -> Block {
    Block {
        address,
        size,
        requested_size: 0,
        state: BlockState::Inactive,
        frames: 0,
    }
}

/// The key an `oom` entry's request is allocated under while it is looked at.
const OOM_KEY: u64 = u64::MAX;

/// Feeds `trace` to `model` in order: allocs and frees by address; at each run of
/// segment_free / segment_unmap entries an empty_cache (the program's, or an OOM retry's:
/// the state after is the same); an `oom` entry's request, which the program never got,
/// so it is freed again once `step` has seen it. With `recorded_addresses` the segments
/// the model creates for a request take the addresses the trace gave them.
///
/// After each entry `step(model, position, ops, ok)` sees what the model did (`ok` is
/// false when a request found no memory); returning false stops the replay.
pub fn feed_trace(
    model: &mut CachingAllocatorModel,
    trace: &[TraceEntry],
    recorded_addresses: bool,
    mut step: impl FnMut(&CachingAllocatorModel, usize, &[ModelOp], bool) -> bool,
) {
    let mut ops = Vec::new();
    let mut prev_action = None;
    for (pos, e) in trace.iter().enumerate() {
        ops.clear();
        let mut ok = true;
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap if recorded_addresses => {
                model.queue_segment_address(e.addr);
            }
            Action::SegmentFree | Action::SegmentUnmap
                if !matches!(
                    prev_action,
                    Some(Action::SegmentFree | Action::SegmentUnmap)
                ) =>
            {
                model.empty_cache(&mut ops);
            }
            Action::Alloc => {
                ok = model.malloc(e.addr, e.size, e.stream, e.frames, &mut ops);
                // A segment the trace made for this request but the model did not need
                // would be taken by a later request: drop it.
                model.clear_queued_segment_addresses();
            }
            Action::Oom => {
                ok = model.malloc(OOM_KEY, e.size, e.stream, e.frames, &mut ops);
                model.clear_queued_segment_addresses();
            }
            Action::FreeCompleted => {
                model.free(e.addr, &mut ops);
            }
            _ => {}
        }
        prev_action = Some(e.action);
        let go_on = step(model, pos, &ops, ok);
        if e.action == Action::Oom && ok {
            model.free(OOM_KEY, &mut ops);
        }
        if !go_on {
            break;
        }
    }
}

/// How many recorded entries of one kind the model reproduced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    pub recorded: usize,
    pub matched: usize,
    /// Made by the model but not in the recording.
    pub extra: usize,
}

impl Tally {
    pub fn exact(&self) -> bool {
        self.matched == self.recorded && self.extra == 0
    }
}

/// How well the model reproduced a recorded trace.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ReplayReport {
    /// Segment events the model made with the same address and size for the same
    /// request (segment_alloc, segment_map) or the same release (segment_free, unmap).
    pub segment_allocs: Tally,
    pub segment_frees: Tally,
    pub segment_maps: Tally,
    pub segment_unmaps: Tally,
    /// `alloc` entries that got the recorded address.
    pub allocs: Tally,
    /// `oom` entries where the model ran out of memory too.
    pub ooms: Tally,
    /// Blocks of the snapshot's final `segments` the model ends with at the same address,
    /// size and active/inactive state.
    pub final_blocks: Tally,
}

impl ReplayReport {
    fn segment_tally(&mut self, a: Action) -> &mut Tally {
        match a {
            Action::SegmentAlloc => &mut self.segment_allocs,
            Action::SegmentFree => &mut self.segment_frees,
            Action::SegmentMap => &mut self.segment_maps,
            _ => &mut self.segment_unmaps,
        }
    }

    fn kinds(&self) -> [(&'static str, &Tally); 7] {
        [
            ("segment_alloc", &self.segment_allocs),
            ("segment_free", &self.segment_frees),
            ("segment_map", &self.segment_maps),
            ("segment_unmap", &self.segment_unmaps),
            ("alloc addresses", &self.allocs),
            ("oom", &self.ooms),
            ("final blocks", &self.final_blocks),
        ]
    }

    /// Every recorded event and block reproduced, nothing extra.
    pub fn exact(&self) -> bool {
        self.kinds().iter().all(|(_, t)| t.exact())
    }
}

impl fmt::Display for ReplayReport {
    /// "segment_map 175/175, alloc addresses 2434/2434, final blocks 544/544": the kinds
    /// the trace has, with extras when the model made any.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let parts: Vec<String> = self
            .kinds()
            .iter()
            .filter(|(_, t)| t.recorded > 0 || t.extra > 0)
            .map(|(name, t)| {
                let extra = if t.extra > 0 {
                    format!(" (+{} extra)", t.extra)
                } else {
                    String::new()
                };
                format!("{name} {}/{}{extra}", t.matched, t.recorded)
            })
            .collect();
        f.write_str(&parts.join(", "))
    }
}

/// The segment event a model op is, as a trace records it.
fn segment_event(op: &ModelOp) -> Option<(Action, u64, u64)> {
    match *op {
        ModelOp::SegmentAlloc { addr, size } => Some((Action::SegmentAlloc, addr, size)),
        ModelOp::SegmentFree { addr, size } => Some((Action::SegmentFree, addr, size)),
        ModelOp::SegmentMap { addr, size } => Some((Action::SegmentMap, addr, size)),
        ModelOp::SegmentUnmap { addr, size } => Some((Action::SegmentUnmap, addr, size)),
        _ => None,
    }
}

/// Replays `device`'s trace from `state_before_trace`, with segment addresses taken from
/// the trace and, when the trace has an `oom`, the device's capacity from it
/// (`oom_capacity`); compares each step and the final state with the recording.
pub fn replay_snapshot(
    s: &Snapshot,
    device: usize,
    cfg: &AllocatorConfig,
) -> (CachingAllocatorModel, ReplayReport) {
    let mut model =
        CachingAllocatorModel::from_segments(cfg.clone(), &state_before_trace(s, device, cfg));
    model.set_capacity(oom_capacity(s, device));
    let mut rep = ReplayReport::default();
    let trace: &[_] = s.device_traces.get(device).map_or(&[], Vec::as_slice);
    // Recorded segment events made for the next request, not yet matched; what the
    // model released in the current release run, not yet matched.
    let mut expected: Vec<(Action, u64, u64)> = Vec::new();
    let mut released: Vec<(Action, u64, u64)> = Vec::new();
    let mut in_release_run = false;
    feed_trace(&mut model, trace, true, |_, pos, ops, ok| {
        let e = &trace[pos];
        let made = ops.iter().filter_map(segment_event);
        let releases = matches!(e.action, Action::SegmentFree | Action::SegmentUnmap);
        if releases && !in_release_run {
            for (a, _, _) in released.drain(..) {
                rep.segment_tally(a).extra += 1;
            }
            released.extend(made.clone());
        }
        in_release_run = releases;
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => {
                rep.segment_tally(e.action).recorded += 1;
                expected.push((e.action, e.addr, e.size));
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                let t = rep.segment_tally(e.action);
                t.recorded += 1;
                if let Some(i) = released
                    .iter()
                    .position(|&r| r == (e.action, e.addr, e.size))
                {
                    released.swap_remove(i);
                    t.matched += 1;
                }
            }
            Action::Alloc | Action::Oom => {
                for ev in made {
                    match expected.iter().position(|&x| x == ev) {
                        Some(i) => {
                            expected.swap_remove(i);
                            rep.segment_tally(ev.0).matched += 1;
                        }
                        None => rep.segment_tally(ev.0).extra += 1,
                    }
                }
                expected.clear();
                if e.action == Action::Alloc {
                    rep.allocs.recorded += 1;
                    if ops
                        .iter()
                        .any(|op| matches!(*op, ModelOp::Alloc { addr, .. } if addr == e.addr))
                    {
                        rep.allocs.matched += 1;
                    }
                } else {
                    rep.ooms.recorded += 1;
                    if ok {
                        rep.ooms.extra += 1;
                    } else {
                        rep.ooms.matched += 1;
                    }
                }
            }
            _ => {}
        }
        true
    });
    for (a, _, _) in released {
        rep.segment_tally(a).extra += 1;
    }
    let mut model_blocks: HashMap<u64, (u64, bool)> = HashMap::new();
    for seg in model.segments(device as i64) {
        for b in seg.blocks {
            model_blocks.insert(b.address, (b.size, b.state.is_active()));
        }
    }
    for seg in s.segments.iter().filter(|seg| seg.device == device as i64) {
        for b in &seg.blocks {
            rep.final_blocks.recorded += 1;
            if model_blocks.get(&b.address) == Some(&(b.size, b.state.is_active())) {
                rep.final_blocks.matched += 1;
            }
        }
    }
    rep.final_blocks.extra = model_blocks.len().saturating_sub(rep.final_blocks.matched);
    (model, rep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::model::TraceEntry;

    fn record(ops: &[ModelOp], trace: &mut Vec<TraceEntry>) {
        for op in ops {
            let (action, addr, size) = match *op {
                ModelOp::Free { addr, size, .. } => {
                    trace.push(TraceEntry::new(Action::FreeRequested, addr, size));
                    (Action::FreeCompleted, addr, size)
                }
                ModelOp::Alloc { addr, size, .. } => (Action::Alloc, addr, size),
                other => segment_event(&other).expect("a segment event"),
            };
            trace.push(TraceEntry::new(action, addr, size));
        }
    }

    fn layout(segs: &[Segment]) -> Vec<(u64, u64, bool)> {
        segs.iter()
            .flat_map(|s| {
                s.blocks
                    .iter()
                    .map(|b| (b.address, b.size, b.state.is_active()))
            })
            .collect()
    }

    /// Runs a model on random requests, snapshots it after 2000 of them, records the
    /// rest as a trace the way PyTorch writes one (an empty_cache in it; `oom` entries
    /// when the capacity runs out) and returns the snapshot at the end with the state at
    /// the cut.
    fn recorded_run(conf: &str, capacity: Option<u64>) -> (Snapshot, Vec<Segment>) {
        let mut m = CachingAllocatorModel::new(AllocatorConfig::parse_conf(conf).unwrap());
        m.set_capacity(capacity);
        let mut x: u64 = 0x1234_5678_9abc_def1;
        let mut live: Vec<u64> = Vec::new();
        let mut ops = Vec::new();
        let mut trace = Vec::new();
        let mut before = Vec::new();
        for k in 0..4000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if k == 2000 {
                before = m.segments(0);
                trace.clear();
            }
            ops.clear();
            if k == 3000 {
                m.empty_cache(&mut ops);
            } else if live.len() < 8 || !x.is_multiple_of(3) {
                let size = match x % 10 {
                    0..=5 => 1 + (x >> 8) % 200_000,
                    6..=8 => (1 << 20) + (x >> 8) % (6 << 20),
                    _ => (10 << 20) + (x >> 8) % (30 << 20),
                };
                if m.malloc(k, size, 0, 0, &mut ops) {
                    live.push(k);
                } else {
                    record(&ops, &mut trace);
                    ops.clear();
                    let free = capacity.unwrap() - m.stats().reserved_bytes;
                    trace.push(TraceEntry::new(Action::Oom, free, m.block_size(size)));
                }
            } else {
                let key = live.swap_remove((x >> 20) as usize % live.len());
                m.free(key, &mut ops);
            }
            record(&ops, &mut trace);
        }
        // The trace keys allocations by address.
        let snap = Snapshot {
            segments: m.segments(0),
            device_traces: vec![trace],
            ..Default::default()
        };
        (snap, before)
    }

    fn count(snap: &Snapshot, a: Action) -> usize {
        snap.device_traces[0]
            .iter()
            .filter(|e| e.action == a)
            .count()
    }

    /// The state before the trace is recovered and the replay reproduces the recording.
    /// (Not every run is recoverable: a large block that kept up to 1 MiB unsplit and
    /// merged before anything showed its end is ambiguous; over 39 seeds 4 replays
    /// diverged for that reason.)
    #[test]
    fn recovers_the_state_before_a_recorded_trace() {
        let (snap, before) = recorded_run("", None);
        let cfg = AllocatorConfig::default();
        assert!(count(&snap, Action::SegmentFree) > 0);
        // This run has a block freed without its alloc whose end only the evidence rule
        // finds (the rounded size alone is 811.5 KiB short).
        assert_eq!(layout(&state_before_trace(&snap, 0, &cfg)), layout(&before));
        let (_, rep) = replay_snapshot(&snap, 0, &cfg);
        assert!(rep.exact(), "{rep}");
        assert!(
            rep.segment_allocs.recorded > 0 && rep.segment_frees.recorded > 0,
            "{rep}"
        );
    }

    /// The same with expandable segments on a device that runs out: pages mapped and
    /// unmapped, requests that fail, the mapped ranges before the trace recovered.
    #[test]
    fn reproduces_expandable_segments_and_ooms() {
        let conf = "expandable_segments:True";
        let (snap, before) = recorded_run(conf, Some(4 << 30));
        let cfg = AllocatorConfig::parse_conf(conf).unwrap();
        for a in [Action::SegmentMap, Action::SegmentUnmap, Action::Oom] {
            assert!(count(&snap, a) > 0, "the run has {a:?} entries");
        }
        assert_eq!(count(&snap, Action::SegmentAlloc), 0);
        assert!(before.iter().all(|s| s.is_expandable));
        assert_eq!(layout(&state_before_trace(&snap, 0, &cfg)), layout(&before));
        assert_eq!(
            oom_capacity(&snap, 0),
            Some(4 << 30),
            "reserved then plus the device's free bytes"
        );
        let (_, rep) = replay_snapshot(&snap, 0, &cfg);
        assert!(rep.exact(), "{rep}");
        assert_eq!(rep.ooms.matched, count(&snap, Action::Oom));
    }

    #[test]
    fn address_ranges_merge_and_split() {
        let mut r = Ranges::default();
        r.add(10, 20);
        r.add(20, 30);
        r.add(40, 50);
        assert_eq!(
            r.0.iter().map(|(&a, &b)| (a, b)).collect::<Vec<_>>(),
            vec![(10, 30), (40, 50)]
        );
        r.remove(15, 45);
        assert_eq!(
            r.0.iter().map(|(&a, &b)| (a, b)).collect::<Vec<_>>(),
            vec![(10, 15), (45, 50)]
        );
        r.add(0, 100);
        assert_eq!(r.0.len(), 1);
    }
}
