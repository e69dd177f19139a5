//! The event history behind the live timeline: one compact entry per allocator event (plus
//! category moves), with per-block aggregates so a window of any width is summarised into
//! screen columns in O(columns × block + blocks), not O(events).

use crate::event::{Action, Category, Phase};

/// Entries per aggregate block.
const BLOCK: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Entry {
    pub t_ns: u64,
    /// Signed change of live bytes in `category` (0 for segment events).
    pub delta: i64,
    /// Signed change of reserved bytes.
    pub reserved_delta: i64,
    pub category: Category,
    /// None for a category move (retag), which is not an allocator event.
    pub action: Option<Action>,
    pub phase: Phase,
    pub step: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct State {
    cats: [u64; 8],
    reserved: u64,
}

impl State {
    fn apply(&mut self, e: &Entry) {
        let c = &mut self.cats[e.category as usize];
        *c = c.saturating_add_signed(e.delta);
        self.reserved = self.reserved.saturating_add_signed(e.reserved_delta);
    }
    fn total(&self) -> u64 {
        self.cats.iter().sum()
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct BlockAgg {
    /// State before the block's first entry.
    start: State,
    /// State at the block's highest total, and that total.
    at_max: State,
    max_total: u64,
    max_reserved: u64,
}

/// One screen column: the stacked categories at the column's peak.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Column {
    pub cats: [u64; 8],
    pub total: u64,
    pub reserved: u64,
}

pub struct History {
    entries: Vec<Entry>,
    /// Index (since the session started) of `entries[0]`; advances when old entries go.
    base: u64,
    blocks: Vec<BlockAgg>,
    now: State,
    cap: usize,
}

impl History {
    /// Keeps about `cap` entries (at least a few blocks); older ones are discarded in blocks.
    pub fn new(cap: usize) -> History {
        History {
            entries: Vec::new(),
            base: 0,
            blocks: Vec::new(),
            now: State::default(),
            cap: cap.max(BLOCK * 4),
        }
    }

    /// How many entries it keeps about.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    pub fn push(&mut self, e: Entry) {
        if self.entries.len().is_multiple_of(BLOCK) {
            if self.entries.len() >= self.cap {
                self.trim();
            }
            self.blocks.push(BlockAgg { start: self.now, ..BlockAgg::default() });
        }
        let first_in_block = self.entries.len().is_multiple_of(BLOCK);
        self.now.apply(&e);
        self.entries.push(e);
        let b = self.blocks.last_mut().expect("a block was opened above");
        let total = self.now.total();
        if first_in_block || total > b.max_total {
            b.max_total = total;
            b.at_max = self.now;
        }
        b.max_reserved = if first_in_block { self.now.reserved } else { b.max_reserved.max(self.now.reserved) };
    }

    /// Drops the oldest quarter, in whole blocks.
    fn trim(&mut self) {
        let drop_blocks = (self.blocks.len() / 4).max(1);
        self.blocks.drain(..drop_blocks);
        self.entries.drain(..drop_blocks * BLOCK);
        self.base += (drop_blocks * BLOCK) as u64;
    }

    /// First index still held.
    pub fn start(&self) -> u64 {
        self.base
    }

    /// One past the last index.
    pub fn end(&self) -> u64 {
        self.base + self.entries.len() as u64
    }

    pub fn get(&self, index: u64) -> Option<&Entry> {
        index.checked_sub(self.base).and_then(|i| self.entries.get(i as usize))
    }

    /// The first index held whose time is at or after `t_ns` (`end()` when none is).
    pub fn index_at_time(&self, t_ns: u64) -> u64 {
        self.base + self.entries.partition_point(|e| e.t_ns < t_ns) as u64
    }

    pub fn category_bytes(&self) -> [u64; 8] {
        self.now.cats
    }

    pub fn reserved(&self) -> u64 {
        self.now.reserved
    }

    pub fn live_total(&self) -> u64 {
        self.now.total()
    }

    /// Summarises [from, to) into `columns` equal columns (each the peak of its span).
    pub fn columns(&self, from: u64, to: u64, columns: usize) -> Vec<Column> {
        let span = to.saturating_sub(from);
        let bounds: Vec<u64> = (0..=columns as u64).map(|c| from + span * c / columns.max(1) as u64).collect();
        self.columns_at(&bounds)
    }

    /// Summarises each span [bounds[c], bounds[c + 1]) (non-decreasing bounds) into a
    /// column, the peak of its span.
    pub fn columns_at(&self, bounds: &[u64]) -> Vec<Column> {
        let columns = bounds.len().saturating_sub(1);
        let mut out = vec![Column::default(); columns];
        let (Some(&first), Some(&last)) = (bounds.first(), bounds.last()) else { return out };
        let from = first.max(self.base);
        let to = last.min(self.end());
        if columns == 0 || from >= to {
            return out;
        }
        let mut idx = (from - self.base) as usize;
        // State before `idx`: replay from its block's start.
        let mut state = self.blocks[idx / BLOCK].start;
        for e in &self.entries[idx - idx % BLOCK..idx] {
            state.apply(e);
        }
        for (c, col) in out.iter_mut().enumerate() {
            let end = (bounds[c + 1].clamp(from, to) - self.base) as usize;
            let mut best: Option<Column> = None;
            let mut offer = |cats: &[u64; 8], total: u64, reserved: u64| match &mut best {
                Some(b) => {
                    if total > b.total {
                        b.cats = *cats;
                        b.total = total;
                    }
                    b.reserved = b.reserved.max(reserved);
                }
                None => best = Some(Column { cats: *cats, total, reserved }),
            };
            while idx < end {
                if idx.is_multiple_of(BLOCK) && idx + BLOCK <= end {
                    let b = &self.blocks[idx / BLOCK];
                    offer(&b.at_max.cats, b.max_total, b.max_reserved);
                    idx += BLOCK;
                    state = self.blocks.get(idx / BLOCK).map(|b| b.start).unwrap_or(self.now);
                } else {
                    state.apply(&self.entries[idx]);
                    offer(&state.cats, state.total(), state.reserved);
                    idx += 1;
                }
            }
            // A column narrower than one entry shows the state it sits in.
            *col = best.unwrap_or(Column { cats: state.cats, total: state.total(), reserved: state.reserved });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(cat: Category, n: i64) -> Entry {
        Entry {
            t_ns: 0,
            delta: n,
            reserved_delta: 0,
            category: cat,
            action: Some(if n >= 0 { Action::Alloc } else { Action::FreeRequested }),
            phase: Phase::Forward,
            step: 0,
        }
    }

    /// Brute force: the state after each entry, peak per column.
    fn naive(entries: &[Entry], columns: usize) -> Vec<u64> {
        let mut s = State::default();
        let totals: Vec<u64> = entries.iter().map(|e| { s.apply(e); s.total() }).collect();
        (0..columns)
            .map(|c| {
                let a = totals.len() * c / columns;
                let b = totals.len() * (c + 1) / columns;
                totals[a..b].iter().copied().max().unwrap_or(0)
            })
            .collect()
    }

    #[test]
    fn columns_match_a_brute_force_peak_at_every_zoom() {
        let mut h = History::new(1 << 20);
        let mut entries = Vec::new();
        let mut live: Vec<(Category, i64)> = Vec::new();
        let mut x: u64 = 12345;
        for i in 0..10_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let e = if live.is_empty() || !(x >> 33).is_multiple_of(3) {
                let cat = Category::from_u8(((x >> 20) % 8) as u8);
                let n = ((x >> 40) % 10_000 + 1) as i64 + i;
                live.push((cat, n));
                alloc(cat, n)
            } else {
                let (cat, n) = live.swap_remove(((x >> 12) as usize) % live.len());
                alloc(cat, -n)
            };
            entries.push(e);
            h.push(e);
        }
        for columns in [1, 7, 80, 200, 3333, 10_000] {
            let got: Vec<u64> = h.columns(0, h.end(), columns).iter().map(|c| c.total).collect();
            assert_eq!(got, naive(&entries, columns), "columns={columns}");
        }
        // A window that starts mid-block.
        let got = h.columns(1000, 2000, 10);
        let want = naive(&entries[..2000], 20);
        assert_eq!(got.iter().map(|c| c.total).collect::<Vec<_>>(), want[10..].to_vec());
        // Uneven spans (a time axis): each column is the peak of its own span.
        let bounds = [0u64, 10, 10, 700, 3000, 10_000];
        let mut s = State::default();
        let totals: Vec<u64> = entries.iter().map(|e| { s.apply(e); s.total() }).collect();
        let got: Vec<u64> = h.columns_at(&bounds).iter().map(|c| c.total).collect();
        assert_eq!(got[0], totals[..10].iter().copied().max().unwrap());
        assert_eq!(got[1], totals[9], "an empty span shows the state it sits in");
        assert_eq!(got[2], totals[10..700].iter().copied().max().unwrap());
        assert_eq!(got[4], totals[3000..].iter().copied().max().unwrap());
    }

    #[test]
    fn index_at_time_finds_the_first_entry_at_or_after() {
        let mut h = History::new(1 << 12);
        for t in [0, 10, 10, 20, 35] {
            h.push(Entry { t_ns: t, ..alloc(Category::Activation, 1) });
        }
        assert_eq!([0, 5, 10, 11, 35, 99].map(|t| h.index_at_time(t)), [0, 1, 1, 3, 4, 5]);
    }

    #[test]
    fn trimming_keeps_recent_state_exact() {
        let mut h = History::new(BLOCK * 4);
        for _ in 0..BLOCK * 20 {
            h.push(alloc(Category::Activation, 10));
        }
        assert!(h.start() > 0, "old entries were discarded");
        assert_eq!(h.live_total(), (BLOCK * 20 * 10) as u64);
        let cols = h.columns(h.start(), h.end(), 1);
        assert_eq!(cols[0].total, h.live_total());
    }
}
