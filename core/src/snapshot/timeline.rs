//! memory_viz's Active Memory Timeline, built one event at a time.
//!
//! Semantics follow MemoryViz.js: each `alloc` pairs with the next free of its address (a
//! `free_requested` directly followed by the `free_completed` of the same address is one
//! free, at the `free_requested`; a lone `free_completed` frees too; a lone
//! `free_requested` does not). A free with no alloc is a block alive at the start; active
//! blocks of the final `segments` never allocated are alive at the start too, below
//! everything. Bands stack in allocation order and a freed band's upper neighbours slide
//! down. The x axis is the index of these alloc/free actions.
//!
//! The value at action `i` is the stacked total *during* it: an allocation made at `i`
//! and one freed at `i` both count (memory_viz's `max_at_time`), so the peak is the top of
//! the plot. memory_viz's slide-down animation steps are not x positions here.
//!
//! Every event costs O(1) amortized, including the free of a block allocated before the
//! trace, which raises every total before it: each action stores its total minus the
//! bytes of such frees seen so far, and a total is that value plus all of them (a free
//! at `j` then counts exactly at the actions up to `j`). Nothing recorded is rewritten.

use std::cmp::Reverse;

use rustc_hash::FxHashMap;

use super::max_pyramid::MaxPyramid;
use super::pages::{self, Span};
use super::model::{Action, ByText, Snapshot, StackId, TraceEntry};

/// One band of the timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimelineAlloc {
    pub addr: u64,
    /// Action index of the alloc (0 and `alive_at_start` for blocks older than the trace).
    pub start: usize,
    /// Action index of the free; None = alive at the end.
    pub end: Option<usize>,
    /// Requested bytes.
    pub size: u64,
    pub stack: StackId,
    /// Index into `Timeline::categories`.
    pub category: u16,
    pub alive_at_start: bool,
}

impl TimelineAlloc {
    /// Whether the band is drawn at action `i`.
    pub fn alive_at(&self, i: usize) -> bool {
        (self.alive_at_start || self.start <= i) && self.end.is_none_or(|e| i <= e)
    }
}

/// `from_snapshot` tells the thread faulting in its lists' pages how far they are filled
/// every this many entries: fewer bytes than that thread keeps faulted in ahead.
const REPORT_EVERY: usize = 8192;

/// Per-category totals are checkpointed every this many actions.
const CHECKPOINT: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Step {
    alloc: u32,
    free: bool,
}

#[derive(Clone, Debug, Default)]
pub struct Timeline {
    pub allocations: Vec<TimelineAlloc>,
    /// Alloc/free actions on the x axis.
    pub total_events: usize,
    pub peak_bytes: u64,
    pub peak_index: usize,
    /// Category names (`TimelineAlloc::category` indexes this).
    pub categories: Vec<String>,
    /// Position of each action in the fed stream (the trace entry index for snapshots).
    pub event_positions: Vec<usize>,
    /// Position of each event that changes reserved memory (`Action::reserved_sign`) in the
    /// fed stream: reserved memory over the trace is found from these few, not a pass over
    /// every entry.
    pub segment_positions: Vec<usize>,
    steps: Vec<Step>,
    /// Stacked total during each action, less `base`, less `early`, plus the bytes of
    /// the frees of older blocks at later actions: the total is this plus `base + early`.
    totals: MaxPyramid,
    /// Bytes alive during the whole timeline (blocks older than the trace never freed).
    base: u64,
    /// Bytes of the blocks older than the trace freed so far (each alive from the start
    /// up to its free).
    early: u64,
    /// Running total of the trace's own allocations after the last action.
    current: u64,
    /// The highest `totals` value, at `peak_index`.
    peak_value: i64,
    cat_base: Vec<u64>,
    cat_early: Vec<u64>,
    cat_current: Vec<u64>,
    /// Per category before action k·CHECKPOINT: `cat_current` less the `cat_early` of
    /// then, in wrapping arithmetic; plus `cat_base` and today's `cat_early` it is the
    /// total there.
    cat_checkpoints: Vec<Vec<u64>>,
    /// Stacking order: blocks from `segments` lowest, then blocks freed without an alloc
    /// (the last freed lowest), then allocations in order.
    stack_keys: Vec<i64>,
}

/// The index of an entry's category in `names`, added at its first appearance; entries
/// without one count as "unknown" (as do blocks alive throughout the trace).
pub fn category_index(names: &mut Vec<String>, category: Option<&str>) -> u16 {
    let c = category.unwrap_or("unknown");
    match names.iter().position(|n| n == c) {
        Some(i) => i as u16,
        None => {
            names.push(c.to_string());
            (names.len() - 1) as u16
        }
    }
}

/// Feeds events into a `Timeline`; totals, series and peak are usable at any time.
#[derive(Clone, Debug, Default)]
pub struct TimelineBuilder {
    tl: Timeline,
    open: FxHashMap<u64, u32>,
    pending_free: Option<(u64, usize)>,
    fed: usize,
    /// Blocks added by `add_alive_throughout` so far (counting them per call was quadratic).
    alive_throughout: i64,
}

const SEGMENT_BLOCK_KEY: i64 = -(1 << 48);

impl TimelineBuilder {
    pub fn new(categories: Vec<String>) -> Self {
        let mut b = TimelineBuilder::default();
        b.tl.cat_base = vec![0; categories.len().max(1)];
        b.tl.cat_current = b.tl.cat_base.clone();
        b.tl.cat_early = b.tl.cat_base.clone();
        b.tl.categories = categories;
        b
    }

    /// Room for `actions` alloc/free actions at once (a trace's length bounds them): grown
    /// by doubling, these lists cost the timeline of 1.5 M entries 4 ms more (issue 29).
    /// Room reserved and never written takes no memory.
    fn reserve(&mut self, actions: usize) {
        let tl = &mut self.tl;
        tl.allocations.reserve(actions);
        tl.stack_keys.reserve(actions);
        tl.steps.reserve(actions);
        tl.event_positions.reserve(actions);
        tl.totals.reserve(actions);
    }

    /// The lists `reserve` made room in, as they stand.
    fn spans(&self) -> [Span; 5] {
        let tl = &self.tl;
        [Span::of(&tl.allocations), Span::of(&tl.stack_keys), Span::of(&tl.steps), Span::of(&tl.event_positions), tl.totals.span()]
    }

    pub fn timeline(&self) -> &Timeline {
        &self.tl
    }

    /// One trace event; actions other than alloc/free only break a free_requested /
    /// free_completed pair, as in memory_viz. `category` indexes the names given to `new`;
    /// an index past them adds names `category N`.
    #[inline]
    pub fn feed(&mut self, action: Action, addr: u64, size: u64, stack: StackId, category: u16) {
        self.ensure_category(category);
        let pos = self.fed;
        self.fed += 1;
        let pending = self.pending_free.take();
        match action {
            Action::Alloc => self.alloc(addr, size, stack, category, pos),
            Action::FreeRequested => self.pending_free = Some((addr, pos)),
            Action::FreeCompleted => {
                let at = pending.filter(|p| p.0 == addr).map_or(pos, |p| p.1);
                self.free(addr, size, stack, category, at);
            }
            _ if action.reserved_sign() != 0 => self.tl.segment_positions.push(pos),
            _ => {}
        }
    }

    /// A block alive from before the first event to after the last (the final snapshot's
    /// active blocks that the trace never allocated). Later calls stack lower.
    pub fn add_alive_throughout(&mut self, addr: u64, size: u64, stack: StackId, category: u16) {
        self.ensure_category(category);
        let tl = &mut self.tl;
        let ordinal = self.alive_throughout;
        self.alive_throughout += 1;
        tl.stack_keys.push(SEGMENT_BLOCK_KEY - ordinal);
        tl.allocations.push(TimelineAlloc {
            addr,
            start: 0,
            end: None,
            size,
            stack,
            category,
            alive_at_start: true,
        });
        tl.base += size;
        tl.cat_base[category as usize] += size;
        tl.refresh_peak();
    }

    /// Whether `addr` holds an allocation made in the fed events and not freed yet.
    pub fn is_open(&self, addr: u64) -> bool {
        self.open.contains_key(&addr)
    }

    pub fn finish(self) -> Timeline {
        self.tl
    }

    /// The timeline of a snapshot's trace once every entry of `device` is fed: the final
    /// state's active blocks the trace left unallocated are added alive throughout, and
    /// the categories take `names` (from `category_index`).
    ///
    /// A trace without alloc or free actions (none recorded, or only `snapshot` and `oom`
    /// entries) becomes one action holding the final state, as memory_viz draws it: the
    /// first active block is allocated there, above the others.
    pub fn finish_snapshot(mut self, s: &Snapshot, device: usize, mut names: Vec<String>) -> Timeline {
        let unknown = category_index(&mut names, None);
        self.ensure_category((names.len() - 1) as u16);
        let first = self.tl.allocations.len();
        for seg in s.device_segments(device) {
            for blk in &seg.blocks {
                if blk.state == super::model::BlockState::ActiveAllocated && !self.is_open(blk.address) {
                    self.add_alive_throughout(blk.address, blk.requested_size, blk.frames, unknown);
                }
            }
        }
        if self.tl.total_events == 0 && first < self.tl.allocations.len() {
            self.allocate_at_the_end(first, s.trace(device).len());
        }
        self.tl.categories = names;
        self.tl
    }

    /// Makes block `id`, alive throughout, the allocation of a new action at trace
    /// position `pos`.
    fn allocate_at_the_end(&mut self, id: usize, pos: usize) {
        let tl = &mut self.tl;
        let (size, category) = (tl.allocations[id].size, tl.allocations[id].category as usize);
        tl.base -= size;
        tl.cat_base[category] -= size;
        let i = self.begin_step(id as u32, false, pos);
        let tl = &mut self.tl;
        let a = &mut tl.allocations[id];
        (a.alive_at_start, a.start) = (false, i);
        tl.stack_keys[id] = i as i64;
        tl.current += size;
        tl.cat_current[category] += size;
        let during = tl.current;
        self.record_total(i, during);
    }

    /// For a builder fed trace entry indices in place of stacks: each allocation gets the
    /// stack of the entry it was made (or first seen freed) by.
    pub fn stacks_from_entries(&mut self, trace: &[TraceEntry]) {
        for a in &mut self.tl.allocations {
            a.stack = trace.get(a.stack as usize).map_or(0, |e| e.frames);
        }
    }

    #[inline]
    fn ensure_category(&mut self, category: u16) {
        let tl = &mut self.tl;
        let need = category as usize + 1;
        while tl.categories.len() < need {
            tl.categories
                .push(format!("category {}", tl.categories.len()));
        }
        if tl.cat_current.len() < need {
            tl.cat_current.resize(need, 0);
            tl.cat_base.resize(need, 0);
            tl.cat_early.resize(need, 0);
        }
    }

    #[inline]
    fn begin_step(&mut self, alloc: u32, free: bool, pos: usize) -> usize {
        let tl = &mut self.tl;
        let i = tl.steps.len();
        if i.is_multiple_of(CHECKPOINT) {
            let cp = tl.cat_current.iter().zip(&tl.cat_early).map(|(c, e)| c.wrapping_sub(*e)).collect();
            tl.cat_checkpoints.push(cp);
        }
        tl.steps.push(Step { alloc, free });
        tl.event_positions.push(pos);
        tl.total_events = i + 1;
        i
    }

    /// Action `i`'s stacked total (of the trace's own allocations, `during`), before any
    /// older block it frees is counted in `early`.
    #[inline]
    fn record_total(&mut self, i: usize, during: u64) {
        let tl = &mut self.tl;
        let v = during as i64 - tl.early as i64;
        tl.totals.push(v);
        if v > tl.peak_value || i == 0 {
            tl.peak_value = v;
            tl.peak_index = i;
        }
        tl.refresh_peak();
    }

    #[inline]
    fn alloc(&mut self, addr: u64, size: u64, stack: StackId, category: u16, pos: usize) {
        let id = self.tl.allocations.len() as u32;
        let i = self.begin_step(id, false, pos);
        let tl = &mut self.tl;
        tl.allocations.push(TimelineAlloc {
            addr,
            start: i,
            end: None,
            size,
            stack,
            category,
            alive_at_start: false,
        });
        tl.stack_keys.push(i as i64);
        tl.current += size;
        tl.cat_current[category as usize] += size;
        // An address allocated again without a free leaves the old band alive (memory_viz).
        self.open.insert(addr, id);
        let during = self.tl.current;
        self.record_total(i, during);
    }

    fn free(&mut self, addr: u64, size: u64, stack: StackId, category: u16, pos: usize) {
        if let Some(id) = self.open.remove(&addr) {
            let i = self.begin_step(id, true, pos);
            let tl = &mut self.tl;
            let a = &mut tl.allocations[id as usize];
            a.end = Some(i);
            let during = tl.current;
            tl.current -= a.size;
            tl.cat_current[a.category as usize] -= a.size;
            self.record_total(i, during);
            return;
        }
        // Alive since before the trace: it raises every total up to and including now.
        let id = self.tl.allocations.len() as u32;
        let i = self.begin_step(id, true, pos);
        let tl = &mut self.tl;
        tl.allocations.push(TimelineAlloc {
            addr,
            start: 0,
            end: Some(i),
            size,
            stack,
            category,
            alive_at_start: true,
        });
        tl.stack_keys.push(-(i as i64) - 1);
        let during = tl.current;
        self.record_total(i, during);
        let tl = &mut self.tl;
        tl.early += size;
        tl.cat_early[category as usize] += size;
        tl.refresh_peak();
    }
}

/// One drawn band at one x position: bytes `y0..y1` of the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Band {
    pub alloc: u32,
    pub y0: u64,
    pub y1: u64,
}

/// The stack at one x position: drawn bands bottom-up, then the summarized band on top.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackColumn {
    pub index: usize,
    pub bands: Vec<Band>,
    pub summarized: (u64, u64),
}

/// Which allocations are drawn one by one (the N largest) and an index to find those
/// alive at any x position in stacking order.
#[derive(Clone, Debug, Default)]
pub struct DetailView {
    /// Drawn allocation ids in stacking order.
    pub drawn: Vec<u32>,
    drawn_flag: Vec<bool>,
    /// Effective start of each drawn band (-1 = before the trace), ascending.
    starts: Vec<i64>,
    /// Segment tree of the latest end (u64::MAX = never freed) over `drawn`.
    max_end: Vec<u64>,
}

impl DetailView {
    pub fn is_drawn(&self, alloc: u32) -> bool {
        self.drawn_flag
            .get(alloc as usize)
            .copied()
            .unwrap_or(false)
    }

    fn collect_alive(
        &self,
        node: usize,
        lo: usize,
        hi: usize,
        limit: usize,
        i: u64,
        out: &mut Vec<u32>,
    ) {
        if lo >= limit || self.max_end[node] < i {
            return;
        }
        if hi - lo == 1 {
            out.push(self.drawn[lo]);
            return;
        }
        let mid = (lo + hi) / 2;
        self.collect_alive(2 * node, lo, mid, limit, i, out);
        self.collect_alive(2 * node + 1, mid, hi, limit, i, out);
    }
}

impl Timeline {
    /// The timeline of `device`'s trace, with the final state's unallocated active blocks
    /// alive throughout.
    pub fn from_snapshot(s: &Snapshot, device: usize) -> Timeline {
        let trace = s.trace(device);
        let mut names = Vec::new();
        let mut b = TimelineBuilder::new(Vec::new());
        b.reserve(trace.len());
        let mut by_text = ByText::default();
        // The lists' fresh pages faulted in on another core while this one fills them.
        pages::ahead(&b.spans(), 4 << 20, |progress| {
            for part in trace.chunks(REPORT_EVERY) {
                for e in part {
                    let c = by_text.get(e.category.as_deref(), |text| category_index(&mut names, text));
                    b.feed(e.action, e.addr, e.size, e.frames, c);
                }
                progress.report(&b.spans());
            }
        });
        b.finish_snapshot(s, device, names)
    }

    /// A stored `totals` value as bytes.
    #[inline]
    fn lift(&self, v: i64) -> u64 {
        (v as i128 + self.early as i128 + self.base as i128).max(0) as u64
    }

    #[inline]
    fn refresh_peak(&mut self) {
        self.peak_bytes = if self.totals.len() == 0 { self.base } else { self.lift(self.peak_value) };
    }

    /// Stacked bytes during action `index`.
    pub fn totals_at(&self, index: usize) -> u64 {
        if index < self.totals.len() {
            self.lift(self.totals.get(index))
        } else {
            self.base
        }
    }

    fn bucket(&self, from: usize, to: usize, buckets: usize, k: usize) -> (usize, usize) {
        let span = to - from;
        let a = from + span * k / buckets;
        (a, (from + span * (k + 1) / buckets).max(a + 1))
    }

    /// Highest stacked total in each of `buckets` equal slices of actions `from..to`
    /// (an action covers several buckets when zoomed in past one action per bucket).
    pub fn series(&self, from: usize, to: usize, buckets: usize) -> Vec<u64> {
        self.sample(from, to, buckets)
            .into_iter()
            .map(|(v, _)| v)
            .collect()
    }

    /// (max total, action index where it is reached) per bucket.
    fn sample(&self, from: usize, to: usize, buckets: usize) -> Vec<(u64, usize)> {
        let to = to.min(self.total_events);
        if from >= to || buckets == 0 {
            return vec![(self.base, from); buckets];
        }
        (0..buckets)
            .map(|k| {
                let (a, b) = self.bucket(from, to, buckets, k);
                match self.totals.range_max(a, b) {
                    Some((v, i)) => (self.lift(v), i),
                    None => (self.base, a),
                }
            })
            .collect()
    }

    /// Bytes per category during action `index`.
    pub fn category_totals_at(&self, index: usize) -> Vec<u64> {
        let mut t = self.cat_base.clone();
        if index >= self.total_events {
            for (x, c) in t.iter_mut().zip(&self.cat_current) {
                *x += c;
            }
            return t;
        }
        let k = index / CHECKPOINT;
        for (x, e) in t.iter_mut().zip(&self.cat_early) {
            *x += e;
        }
        for (x, c) in t.iter_mut().zip(&self.cat_checkpoints[k]) {
            *x = x.wrapping_add(*c);
        }
        for s in &self.steps[k * CHECKPOINT..index] {
            let a = &self.allocations[s.alloc as usize];
            let x = &mut t[a.category as usize];
            *x = if s.free { x.wrapping_sub(a.size) } else { x.wrapping_add(a.size) };
        }
        // During an action both what it frees (still counted) and what it allocates count.
        let s = self.steps[index];
        if !s.free {
            let a = &self.allocations[s.alloc as usize];
            t[a.category as usize] += a.size;
        }
        t
    }

    /// Per bucket, the per-category bytes at the bucket's highest point (stack them in
    /// `categories` order for a category-coloured area chart).
    pub fn category_series(&self, from: usize, to: usize, buckets: usize) -> Vec<Vec<u64>> {
        self.sample(from, to, buckets)
            .into_iter()
            .map(|(_, i)| self.category_totals_at(i))
            .collect()
    }

    /// The `top` largest allocations (ties: earlier first) as (size reversed, id) keys, in
    /// no particular order. Keys, not ids that look their size up at every comparison: of
    /// 500,000 allocations, the 10 largest took 6 ms that way and 2 ms so (issue 29). Chosen
    /// in a buffer of twice `top`, cut back to the `top` least whenever it fills: the keys
    /// of all of them at once were 8 MB and 2,000 page faults of the summary.
    fn largest_keys(&self, top: usize) -> Vec<(Reverse<u64>, u32)> {
        let room = top.saturating_mul(2).max(1024).min(self.allocations.len());
        let mut keys = Vec::with_capacity(room);
        let cut = |keys: &mut Vec<(Reverse<u64>, u32)>| {
            if keys.len() > top {
                keys.select_nth_unstable(top);
                keys.truncate(top);
            }
        };
        // Once `top` are kept, a key above the greatest of them is not among the least.
        let mut bound = None;
        for (a, id) in self.allocations.iter().zip(0..) {
            let key = (Reverse(a.size), id);
            if bound.is_some_and(|b| key > b) {
                continue;
            }
            keys.push(key);
            if keys.len() == room {
                cut(&mut keys);
                bound = keys.iter().max().copied();
            }
        }
        cut(&mut keys);
        keys
    }

    /// The ids of the `top` largest allocations, largest first (ties: earlier first).
    pub fn largest(&self, top: usize) -> Vec<u32> {
        let mut keys = self.largest_keys(top);
        keys.sort_unstable();
        keys.into_iter().map(|(_, id)| id).collect()
    }

    /// Which allocations are drawn one by one: the `max_entries` largest (ties: earlier
    /// first), the rest are summarized. memory_viz's default is 15,000.
    pub fn detail(&self, max_entries: usize) -> DetailView {
        let n = self.allocations.len();
        let mut ids: Vec<u32> = self.largest_keys(max_entries).into_iter().map(|(_, id)| id).collect();
        let mut drawn_flag = vec![false; n];
        for &i in &ids {
            drawn_flag[i as usize] = true;
        }
        ids.sort_unstable_by_key(|&i| self.stack_keys[i as usize]);
        let starts: Vec<i64> = ids
            .iter()
            .map(|&i| {
                let a = &self.allocations[i as usize];
                if a.alive_at_start {
                    -1
                } else {
                    a.start as i64
                }
            })
            .collect();
        let size = ids.len().next_power_of_two().max(1);
        let mut max_end = vec![0u64; 2 * size];
        for (p, &i) in ids.iter().enumerate() {
            max_end[size + p] = self.allocations[i as usize]
                .end
                .map_or(u64::MAX, |e| e as u64);
        }
        for node in (1..size).rev() {
            max_end[node] = max_end[2 * node].max(max_end[2 * node + 1]);
        }
        DetailView {
            drawn: ids,
            drawn_flag,
            starts,
            max_end,
        }
    }

    /// The stack at action `index`: drawn bands alive then, bottom-up with their byte
    /// ranges, and the summarized rest on top.
    pub fn stack_at(&self, view: &DetailView, index: usize) -> StackColumn {
        let limit = view.starts.partition_point(|&s| s <= index as i64);
        let mut ids = Vec::new();
        if !view.drawn.is_empty() {
            let size = view.max_end.len() / 2;
            view.collect_alive(1, 0, size, limit, index as u64, &mut ids);
        }
        // A view chosen while the timeline was still growing holds ends as they were:
        // a band freed since is not drawn.
        ids.retain(|&a| self.allocations[a as usize].alive_at(index));
        let mut y = 0;
        let bands = ids
            .into_iter()
            .map(|alloc| {
                let y0 = y;
                y += self.allocations[alloc as usize].size;
                Band { alloc, y0, y1: y }
            })
            .collect();
        StackColumn {
            index,
            bands,
            summarized: (y, self.totals_at(index).max(y)),
        }
    }

    /// One stack per bucket of actions `from..to`, taken where the bucket peaks: what a
    /// renderer draws for a visible window.
    pub fn stacks(
        &self,
        view: &DetailView,
        from: usize,
        to: usize,
        buckets: usize,
    ) -> Vec<StackColumn> {
        self.sample(from, to, buckets)
            .into_iter()
            .map(|(_, i)| self.stack_at(view, i))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::model::{Block, BlockState, Segment, SegmentType, Snapshot, TraceEntry};
    use Action::{Alloc, FreeCompleted, FreeRequested, SegmentFree};

    fn build(events: &[(Action, u64, u64)]) -> Timeline {
        let mut b = TimelineBuilder::new(vec!["unknown".into()]);
        for &(a, addr, size) in events {
            b.feed(a, addr, size, 0, 0);
        }
        b.finish()
    }

    fn totals(t: &Timeline) -> Vec<u64> {
        (0..t.total_events).map(|i| t.totals_at(i)).collect()
    }

    fn layout(c: &StackColumn) -> Vec<(u32, u64, u64)> {
        c.bands.iter().map(|b| (b.alloc, b.y0, b.y1)).collect()
    }

    #[test]
    fn free_requested_then_completed_is_one_free() {
        let t = build(&[
            (Alloc, 1, 100),
            (Alloc, 2, 50),
            (FreeRequested, 1, 100),
            (FreeCompleted, 1, 100),
            (Alloc, 3, 10),
        ]);
        assert_eq!(t.total_events, 4);
        assert_eq!(t.event_positions, vec![0, 1, 2, 4]);
        assert_eq!(totals(&t), vec![100, 150, 150, 60]);
        assert_eq!(t.allocations[0].end, Some(2));
        assert_eq!((t.peak_bytes, t.peak_index), (150, 1));
    }

    #[test]
    fn lone_free_requested_does_not_free_but_a_later_completion_does() {
        let t = build(&[
            (Alloc, 1, 100),
            (FreeRequested, 1, 100),
            (SegmentFree, 9, 4096),
            (Alloc, 2, 30),
            (FreeCompleted, 1, 100),
        ]);
        assert_eq!(totals(&t), vec![100, 130, 130]);
        assert_eq!(t.allocations[0].end, Some(2));
        assert_eq!(t.event_positions[2], 4);
    }

    #[test]
    fn free_without_alloc_is_alive_from_the_start() {
        let t = build(&[(Alloc, 1, 100), (FreeCompleted, 7, 200), (Alloc, 2, 5)]);
        let x = &t.allocations[1];
        assert!(x.alive_at_start && x.start == 0 && x.end == Some(1));
        assert_eq!(totals(&t), vec![300, 300, 105]);
        assert_eq!((t.peak_bytes, t.peak_index), (300, 0));
        // It stacks below every allocation of the trace.
        let v = t.detail(15_000);
        assert_eq!(layout(&t.stack_at(&v, 0)), vec![(1, 0, 200), (0, 200, 300)]);
        assert_eq!(t.category_totals_at(0), vec![300]);
        assert_eq!(t.category_totals_at(2), vec![105]);
    }

    #[test]
    fn freed_band_lets_upper_bands_slide_down() {
        let t = build(&[
            (Alloc, 1, 100),
            (Alloc, 2, 50),
            (Alloc, 3, 25),
            (FreeCompleted, 1, 100),
            (Alloc, 4, 1),
        ]);
        let v = t.detail(15_000);
        assert_eq!(
            layout(&t.stack_at(&v, 3)),
            vec![(0, 0, 100), (1, 100, 150), (2, 150, 175)]
        );
        assert_eq!(
            layout(&t.stack_at(&v, 4)),
            vec![(1, 0, 50), (2, 50, 75), (3, 75, 76)]
        );
    }

    #[test]
    fn only_the_largest_are_drawn_and_the_rest_is_summarized_on_top() {
        let t = build(&[
            (Alloc, 1, 25),
            (Alloc, 2, 100),
            (Alloc, 3, 50),
            (Alloc, 4, 50),
        ]);
        let v = t.detail(2);
        assert!(v.is_drawn(1) && v.is_drawn(2) && !v.is_drawn(3) && !v.is_drawn(0));
        let c = t.stack_at(&v, 3);
        assert_eq!(layout(&c), vec![(1, 0, 100), (2, 100, 150)]);
        assert_eq!(c.summarized, (150, 225));
    }

    #[test]
    fn active_blocks_of_the_final_state_sit_at_the_bottom() {
        let block = |address, size, state| Block {
            address,
            size,
            requested_size: size,
            state,
            frames: 0,
        };
        let snap = Snapshot {
            segments: vec![Segment {
                device: 0,
                address: 0x1000,
                total_size: 4096,
                allocated_size: 2048,
                active_size: 2048,
                requested_size: 2048,
                stream: 0,
                segment_type: SegmentType::Small,
                segment_pool_id: (0, 0),
                is_expandable: false,
                frames: 0,
                blocks: vec![
                    block(0x1000, 1024, BlockState::ActiveAllocated),
                    block(0x1400, 1024, BlockState::ActiveAllocated),
                    block(0x1800, 2048, BlockState::Inactive),
                ],
            }],
            device_traces: vec![vec![
                TraceEntry::new(Alloc, 0x1400, 1024),
                TraceEntry::new(Alloc, 0x1800, 512),
                TraceEntry::new(FreeCompleted, 0x1800, 512),
            ]],
            ..Default::default()
        };
        let t = Timeline::from_snapshot(&snap, 0);
        assert_eq!(t.allocations.len(), 3);
        assert!(t.allocations[2].alive_at_start && t.allocations[2].addr == 0x1000);
        assert_eq!(totals(&t), vec![2048, 2560, 2560]);
        assert_eq!(t.categories, vec!["unknown".to_string()]);
        let v = t.detail(15_000);
        assert_eq!(
            layout(&t.stack_at(&v, 1)),
            vec![(2, 0, 1024), (0, 1024, 2048), (1, 2048, 2560)]
        );
    }

    /// Entries name their category by shared copies of its text, and two copies of one
    /// text are one category: the index found by a copy's address is the name's.
    #[test]
    fn a_snapshot_s_categories_are_their_names_whichever_copy_an_entry_holds() {
        use crate::snapshot::model::Text;
        let (weights, copy, grads) = (Text::from("parameter"), Text::from("parameter"), Text::from("gradient"));
        let entry = |addr, category: Option<&Text>| TraceEntry { category: category.cloned(), ..TraceEntry::new(Alloc, addr, 100) };
        let snap = Snapshot {
            device_traces: vec![vec![entry(1, Some(&weights)), entry(2, None), entry(3, Some(&grads)), entry(4, Some(&copy)), entry(5, Some(&weights)), entry(6, None)]],
            ..Default::default()
        };
        let t = Timeline::from_snapshot(&snap, 0);
        let names: Vec<&str> = t.allocations.iter().map(|a| t.categories[a.category as usize].as_str()).collect();
        assert_eq!(names, ["parameter", "unknown", "gradient", "parameter", "parameter", "unknown"]);
        assert_eq!(t.categories, ["parameter", "unknown", "gradient"]);
    }

    #[test]
    fn a_view_chosen_before_later_frees_draws_what_is_alive_now() {
        let mut b = TimelineBuilder::new(vec!["unknown".into()]);
        b.feed(Alloc, 1, 100, 0, 0);
        b.feed(Alloc, 2, 50, 0, 0);
        let view = b.timeline().detail(15_000);
        b.feed(FreeCompleted, 1, 100, 0, 0);
        b.feed(Alloc, 3, 10, 0, 0);
        let t = b.finish();
        // Action 2 frees the first band (it still counts during its free); at 3 the
        // band allocated after the view was chosen is in the summarized part.
        assert_eq!(layout(&t.stack_at(&view, 2)), vec![(0, 0, 100), (1, 100, 150)]);
        let c = t.stack_at(&view, 3);
        assert_eq!((layout(&c), c.summarized), (vec![(1, 0, 50)], (50, 60)));
    }

    #[test]
    fn unnamed_categories_are_added_on_first_use() {
        let mut b = TimelineBuilder::new(Vec::new());
        b.feed(Alloc, 1, 10, 0, 2);
        b.feed(Alloc, 2, 5, 0, 0);
        let t = b.finish();
        assert_eq!(t.categories.len(), 3);
        assert_eq!(t.category_totals_at(1), vec![5, 0, 10]);
        assert_eq!(
            t.category_series(0, 2, 2),
            vec![vec![0, 0, 10], vec![5, 0, 10]]
        );
    }

    /// Deterministic pseudo-random trace with late frees of unknown blocks and categories.
    fn random_timeline(n: usize) -> Timeline {
        let mut b = TimelineBuilder::new(vec!["a".into(), "b".into(), "c".into()]);
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let mut live: Vec<u64> = Vec::new();
        for k in 0..n as u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let cat = (x % 3) as u16;
            if x % 5 < 3 || live.is_empty() {
                b.feed(Alloc, k + 1_000_000, 1 + x % 1000, 0, cat);
                live.push(k + 1_000_000);
            } else if x.is_multiple_of(17) {
                b.feed(FreeCompleted, k, 1 + x % 5000, 0, cat);
            } else {
                let addr = live.swap_remove((x as usize / 7) % live.len());
                b.feed(FreeRequested, addr, 0, 0, cat);
                b.feed(FreeCompleted, addr, 0, 0, cat);
            }
        }
        b.finish()
    }

    #[test]
    fn totals_series_and_categories_agree_with_a_brute_force_sweep() {
        let t = random_timeline(3000);
        let brute: Vec<u64> = (0..t.total_events)
            .map(|i| {
                t.allocations
                    .iter()
                    .filter(|a| a.alive_at(i))
                    .map(|a| a.size)
                    .sum()
            })
            .collect();
        assert_eq!(totals(&t), brute);
        let peak = *brute.iter().max().unwrap();
        assert_eq!(
            (t.peak_bytes, t.peak_index),
            (peak, brute.iter().position(|&v| v == peak).unwrap())
        );
        for &(from, to, buckets) in &[
            (0, t.total_events, 7),
            (10, 900, 100),
            (5, 9, 10),
            (100, 1100, 1000),
        ] {
            let s = t.series(from, to, buckets);
            assert_eq!(s.len(), buckets);
            for (k, v) in s.iter().enumerate() {
                let a = from + (to - from) * k / buckets;
                let b = (from + (to - from) * (k + 1) / buckets).max(a + 1);
                assert_eq!(
                    *v,
                    *brute[a..b].iter().max().unwrap(),
                    "bucket {k} of {from}..{to}"
                );
            }
        }
        for i in [0, 1, 255, 256, 257, 1000, t.total_events - 1] {
            let mut want = vec![0u64; 3];
            for a in t.allocations.iter().filter(|a| a.alive_at(i)) {
                want[a.category as usize] += a.size;
            }
            assert_eq!(t.category_totals_at(i), want, "categories at {i}");
        }
        let v = t.detail(100);
        for i in [0, 500, 2000] {
            let c = t.stack_at(&v, i);
            let want: Vec<u32> = v
                .drawn
                .iter()
                .copied()
                .filter(|&id| t.allocations[id as usize].alive_at(i))
                .collect();
            assert_eq!(c.bands.iter().map(|b| b.alloc).collect::<Vec<_>>(), want);
            assert_eq!(c.summarized.1, brute[i]);
        }
    }

    #[test]
    fn the_largest_come_first_and_of_equal_sizes_the_earlier() {
        let sizes = [30, 70, 30, 100, 70, 5, 100];
        let t = build(&sizes.iter().enumerate().map(|(i, &s)| (Alloc, i as u64 + 1, s)).collect::<Vec<_>>());
        assert_eq!(t.largest(usize::MAX), vec![3, 6, 1, 4, 0, 2, 5]);
        assert_eq!(t.largest(3), vec![3, 6, 1]);
        assert_eq!(t.largest(0), Vec::<u32>::new());
        // Drawn one by one: the same three, in stacking order.
        assert_eq!(t.detail(3).drawn, vec![1, 3, 6]);
        // More than the buffer they are chosen in, with many of each size.
        let sizes: Vec<u64> = (0..5000u64).map(|i| i * 7919 % 613).collect();
        let t = build(&sizes.iter().zip(1..).map(|(&s, a)| (Alloc, a, s)).collect::<Vec<_>>());
        let mut all: Vec<u32> = (0..5000).collect();
        all.sort_by_key(|&i| (Reverse(sizes[i as usize]), i));
        for top in [1, 10, 1023, 1024, 1025, 2047, 4999, 5000, 6000] {
            assert_eq!(t.largest(top), all[..top.min(5000)], "the {top} largest");
        }
    }
}
