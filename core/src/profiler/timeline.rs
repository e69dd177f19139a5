//! The JSON `torch.profiler.profile.export_memory_timeline` writes for one device (read from
//! `torch/profiler/_memory_profiler.py`):
//! - `.json` / `.json.gz`: `[times, sizes]`: each time (µs) with the bytes then of each of
//!   torch.profiler's categories, a row of 9 (a zero, then the categories in
//!   `_CATEGORY_TO_INDEX`'s order, which is `Category`'s);
//! - `.raw.json.gz`: `[[time, action, bytes, category], ...]`, one per tensor event: time in
//!   ns (-1 for a tensor alive before the profile), action 1 to 4 (PREEXISTING, CREATE,
//!   INCREMENT_VERSION, DESTROY), bytes negative where memory goes, category 0 to 7.
//!
//! Either is read as a snapshot of the one device whose entries carry their categories.
//! Neither keeps a tensor's identity: a raw event that frees is paired with the latest live
//! tensor of its size and category, and in the `[times, sizes]` form each block is a rise
//! in one category's total (a fall takes the latest rises back).

use std::collections::HashMap;
use std::fmt;

use serde::de::{Deserialize, Deserializer, SeqAccess, Visitor};

use super::blocks::{made_up, one_block_segment, SYNTHETIC_BASE};
use crate::event::Category;
use crate::snapshot::model::{Action, Frame, ProfiledWindow, Snapshot, StackId, StackInterner, TraceEntry, TraceForm};

/// A memory timeline as exported.
#[derive(Clone, Debug, PartialEq)]
pub enum MemoryTimeline {
    /// Times (µs) and each one's bytes by category.
    Totals { times: Vec<i64>, sizes: Vec<[i64; 8]> },
    Raw(Vec<TensorEvent>),
}

/// One event of the raw form.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorEvent {
    /// ns; -1 before the profile.
    pub time_ns: i64,
    pub action: TensorAction,
    pub bytes: i64,
    pub category: Category,
}

/// `torch.profiler._memory_profiler.Action`, by its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorAction {
    Preexisting = 1,
    Create = 2,
    IncrementVersion = 3,
    Destroy = 4,
}

/// One element of the file's top-level list: a list of numbers, or a list of such lists.
#[derive(Debug)]
pub enum Item {
    Numbers(Vec<i64>),
    Rows(Vec<Vec<i64>>),
}

/// An integer as Python's json writes it (times in ns pass 2^53, so not through f64).
struct Int(i64);

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Int, D::Error> {
        d.deserialize_any(NumberOrRowVisitor).and_then(|v| match v {
            NumberOrRow::Number(n) => Ok(Int(n)),
            NumberOrRow::Row(_) => Err(serde::de::Error::custom("a memory timeline nests lists deeper than [times, sizes]")),
        })
    }
}

enum NumberOrRow {
    Number(i64),
    Row(Vec<i64>),
}

struct NumberOrRowVisitor;

impl<'de> Visitor<'de> for NumberOrRowVisitor {
    type Value = NumberOrRow;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a number or a list of numbers")
    }
    fn visit_i64<E>(self, v: i64) -> Result<NumberOrRow, E> {
        Ok(NumberOrRow::Number(v))
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<NumberOrRow, E> {
        i64::try_from(v).map(NumberOrRow::Number).map_err(|_| E::custom(format!("{v} is out of range")))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<NumberOrRow, E> {
        if v.is_finite() && v.abs() < 9.2e18 {
            Ok(NumberOrRow::Number(v as i64))
        } else {
            Err(E::custom(format!("{v} is not a byte count or time")))
        }
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<NumberOrRow, A::Error> {
        let mut row = Vec::new();
        while let Some(Int(n)) = seq.next_element()? {
            row.push(n);
        }
        Ok(NumberOrRow::Row(row))
    }
}

/// Reads one element of the top-level list (the caller has seen it is a list).
pub struct ItemVisitor;

impl<'de> Visitor<'de> for ItemVisitor {
    type Value = Item;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a memory timeline's list")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Item, A::Error> {
        let (mut numbers, mut rows) = (Vec::new(), Vec::new());
        while let Some(x) = seq.next_element::<NumberOrRow>()? {
            match x {
                NumberOrRow::Number(n) if rows.is_empty() => numbers.push(n),
                NumberOrRow::Row(r) if numbers.is_empty() => rows.push(r),
                _ => return Err(serde::de::Error::custom("a memory timeline's list mixes numbers and lists")),
            }
        }
        Ok(if rows.is_empty() { Item::Numbers(numbers) } else { Item::Rows(rows) })
    }
}

impl<'de> Deserialize<'de> for NumberOrRow {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<NumberOrRow, D::Error> {
        d.deserialize_any(NumberOrRowVisitor)
    }
}

impl<'de> Deserialize<'de> for Item {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Item, D::Error> {
        d.deserialize_seq(ItemVisitor)
    }
}

const SHAPE: &str = "not a memory timeline: export_memory_timeline writes [times, sizes] (.json) or [[time, action, bytes, category], ...] (.raw.json.gz)";

impl MemoryTimeline {
    /// The timeline the top-level list's elements make, or what is wrong with them.
    pub fn from_items(items: Vec<Item>) -> Result<MemoryTimeline, String> {
        // `[[], []]` is an empty totals form; two raw events are two lists of 4 numbers.
        let totals_form = matches!(items.as_slice(), [Item::Numbers(_), Item::Rows(_)]) || matches!(items.as_slice(), [Item::Numbers(_), Item::Numbers(r)] if r.is_empty());
        if totals_form {
            let mut it = items.into_iter();
            let (Some(Item::Numbers(times)), Some(rows)) = (it.next(), it.next()) else { unreachable!("checked above") };
            let rows = match rows {
                Item::Rows(r) => r,
                Item::Numbers(_) => Vec::new(),
            };
            if rows.len() != times.len() {
                return Err(format!("the memory timeline has {} times but {} rows of sizes", times.len(), rows.len()));
            }
            let sizes = rows
                .iter()
                .map(|r| match r.as_slice() {
                    [_, rest @ ..] if rest.len() == 8 => Ok(std::array::from_fn(|c| rest[c])),
                    _ => Err(format!("a memory timeline row has {} numbers, not 9 (a zero, then torch.profiler's 8 categories)", r.len())),
                })
                .collect::<Result<_, _>>()?;
            return Ok(MemoryTimeline::Totals { times, sizes });
        }
        let mut events = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            let Item::Numbers(n) = item else { return Err(SHAPE.into()) };
            let [time_ns, action, bytes, category] = n[..] else { return Err(SHAPE.into()) };
            let action = match action {
                1 => TensorAction::Preexisting,
                2 => TensorAction::Create,
                3 => TensorAction::IncrementVersion,
                4 => TensorAction::Destroy,
                _ => return Err(format!("event {i}: action {action} is not one of torch.profiler's (1 to 4)")),
            };
            let Some(&category) = usize::try_from(category).ok().and_then(|c| Category::ALL.get(c)) else {
                return Err(format!("event {i}: category {category} is not one of torch.profiler's (0 to 7)"));
            };
            events.push(TensorEvent { time_ns, action, bytes, category });
        }
        Ok(MemoryTimeline::Raw(events))
    }
}

/// The blocks of one device as they are made: live ones by size and category, latest last.
struct Log {
    entries: Vec<TraceEntry>,
    live: HashMap<(u64, Category), Vec<u64>>,
    /// The totals form: each category's live rises (sizes), latest last.
    rises: [Vec<u64>; 8],
    next: u64,
    stacks: [StackId; 8],
}

impl Log {
    fn push(&mut self, action: Action, addr: u64, size: u64, category: Category, time_us: i64) {
        self.entries.push(TraceEntry {
            time_us,
            frames: self.stacks[category as usize],
            category: Some(category.as_str().into()),
            ..TraceEntry::new(action, addr, size)
        });
    }

    fn alloc(&mut self, size: u64, category: Category, time_us: i64, addr: Option<u64>) -> u64 {
        let addr = addr.unwrap_or_else(|| made_up(&mut self.next, size));
        self.live.entry((size, category)).or_default().push(addr);
        self.push(Action::Alloc, addr, size, category, time_us);
        addr
    }

    /// Frees the latest live block of `size` and `category`; with none, one alive before the
    /// timeline began.
    fn free(&mut self, size: u64, category: Category, time_us: i64) -> u64 {
        let addr = self.live.get_mut(&(size, category)).and_then(Vec::pop).unwrap_or_else(|| made_up(&mut self.next, size));
        self.push(Action::FreeCompleted, addr, size, category, time_us);
        addr
    }

    /// Takes `bytes` off a category's total: its latest rises go, the last one in part.
    fn fall(&mut self, mut bytes: u64, category: Category, time_us: i64) {
        while bytes > 0 {
            let Some(size) = self.rises[category as usize].pop() else {
                self.free(bytes, category, time_us);
                return;
            };
            // The category's latest rise is also the latest live block of its size.
            let addr = self.free(size, category, time_us);
            if size > bytes {
                self.rise(size - bytes, category, time_us, Some(addr));
            }
            bytes = bytes.saturating_sub(size);
        }
    }

    fn rise(&mut self, bytes: u64, category: Category, time_us: i64, addr: Option<u64>) {
        self.alloc(bytes, category, time_us, addr);
        self.rises[category as usize].push(bytes);
    }
}

/// The snapshot of a memory timeline: one device (the file does not say which), each entry
/// with its category. `Err` names what is wrong.
pub fn to_snapshot(timeline: &MemoryTimeline) -> Result<Snapshot, String> {
    let mut snap = Snapshot::default();
    let mut interner = StackInterner::default();
    interner.stack(&mut snap, Vec::new());
    // The file keeps no frames: a block's one frame is its category, the same in both forms
    // so that `diff` matches them.
    let stacks = Category::ALL.map(|c| {
        let f = interner.frame(&mut snap, Frame { name: c.as_str().to_string(), filename: String::new(), line: 0 });
        interner.stack(&mut snap, vec![f])
    });
    let mut log = Log { entries: Vec::new(), live: HashMap::new(), rises: Default::default(), next: SYNTHETIC_BASE, stacks };
    let form = match timeline {
        MemoryTimeline::Totals { times, sizes } => {
            let mut before = [0i64; 8];
            for (&t, row) in times.iter().zip(sizes) {
                // Falls before rises: no moment between two rows holds more than either.
                for c in Category::ALL.into_iter().filter(|&c| row[c as usize] < before[c as usize]) {
                    log.fall(before[c as usize].abs_diff(row[c as usize]), c, t);
                }
                for c in Category::ALL.into_iter().filter(|&c| row[c as usize] > before[c as usize]) {
                    log.rise(before[c as usize].abs_diff(row[c as usize]), c, t, None);
                }
                before = *row;
            }
            TraceForm::MemoryTimeline
        }
        MemoryTimeline::Raw(events) => {
            let first = events.iter().map(|e| e.time_ns).filter(|&t| t >= 0).min().unwrap_or(0);
            // INCREMENT_VERSION writes the old version's fall, then the new one's rise.
            let mut old_version: Option<(u64, Category)> = None;
            for (i, e) in events.iter().enumerate() {
                let t = (if e.time_ns < 0 { first } else { e.time_ns }) / 1000;
                let size = e.bytes.unsigned_abs();
                match (e.action, e.bytes.signum()) {
                    (_, 0) => {}
                    (TensorAction::Preexisting | TensorAction::Create, 1) => {
                        log.alloc(size, e.category, t, None);
                    }
                    (TensorAction::Destroy, -1) => {
                        log.free(size, e.category, t);
                    }
                    (TensorAction::IncrementVersion, -1) => old_version = Some((size, e.category)),
                    (TensorAction::IncrementVersion, 1) => match old_version.take() {
                        // The tensor stays; only a change of category shows.
                        Some((s, c)) if s == size && c == e.category => {}
                        Some((s, c)) if s == size => {
                            let addr = log.free(s, c, t);
                            log.alloc(size, e.category, t, Some(addr));
                        }
                        _ => return Err(format!("event {i}: a new version of a tensor with no old version just before it")),
                    },
                    (action, _) => return Err(format!("event {i}: {action:?} with {} bytes", e.bytes)),
                }
            }
            TraceForm::MemoryTimelineRaw
        }
    };
    if log.entries.is_empty() {
        return Err("the memory timeline holds no memory: profile with `profile_memory=True, record_shapes=True, with_stack=True`".into());
    }
    let mut live: Vec<(u64, u64)> = log.live.iter().flat_map(|((size, _), addrs)| addrs.iter().map(|&a| (a, *size))).collect();
    live.sort_unstable();
    let stack_of: HashMap<u64, StackId> = log.entries.iter().filter(|e| e.action == Action::Alloc).map(|e| (e.addr, e.frames)).collect();
    snap.segments = live.into_iter().map(|(a, s)| one_block_segment(0, a, s, stack_of[&a])).collect();
    snap.device_traces = vec![log.entries];
    snap.profiled = Some(ProfiledWindow { totals: true, form, ..ProfiledWindow::default() });
    Ok(snap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::timeline::Timeline;

    fn read(json: &str) -> Result<MemoryTimeline, String> {
        let items: Vec<Item> = serde_json::from_str(json).map_err(|e| e.to_string())?;
        MemoryTimeline::from_items(items)
    }

    #[test]
    fn the_totals_form_gives_each_categorys_total_at_every_time() {
        // params 100 from the start; an activation of 50 that becomes 30; a gradient of 70
        // appearing as the activation goes (the peak is 170, never 220).
        let t = read("[[5, 6, 7, 8], [[0, 100, 0, 0, 0, 0, 0, 0, 0], [0, 100, 0, 0, 0, 50, 0, 0, 0], [0, 100, 0, 0, 0, 30, 0, 0, 0], [0, 100, 0, 0, 0, 0, 70, 0, 0]]]").unwrap();
        let s = to_snapshot(&t).unwrap();
        let tl = Timeline::from_snapshot(&s, 0);
        assert_eq!(tl.peak_bytes, 170);
        let p = s.profiled.as_ref().unwrap();
        assert_eq!(p.form, TraceForm::MemoryTimeline);
        // At the end: parameters 100 and gradients 70 are alive.
        let mut alive: Vec<u64> = s.segments.iter().map(|g| g.total_size).collect();
        alive.sort();
        assert_eq!(alive, [70, 100]);
        // The fall from 50 to 30 takes the 50 back and leaves 30.
        let cats: Vec<_> = s.device_traces[0].iter().map(|e| (e.action, e.size, e.category.as_deref().unwrap())).collect();
        assert_eq!(
            cats,
            [
                (Action::Alloc, 100, "parameter"),
                (Action::Alloc, 50, "activation"),
                (Action::FreeCompleted, 50, "activation"),
                (Action::Alloc, 30, "activation"),
                (Action::FreeCompleted, 30, "activation"),
                (Action::Alloc, 70, "gradient"),
            ]
        );
    }

    #[test]
    fn the_raw_form_pairs_frees_with_tensors_and_follows_a_change_of_category() {
        let t = read("[[-1, 1, 64, 0], [2000, 2, 32, 4], [3000, 3, -32, 4], [3000, 3, 32, 5], [4000, 3, -64, 0], [4000, 3, 64, 0], [5000, 4, -32, 5]]").unwrap();
        let s = to_snapshot(&t).unwrap();
        let e = &s.device_traces[0];
        let seen: Vec<_> = e.iter().map(|e| (e.action, e.size, e.category.as_deref().unwrap(), e.time_us)).collect();
        assert_eq!(
            seen,
            [
                (Action::Alloc, 64, "parameter", 2),
                (Action::Alloc, 32, "activation", 2),
                (Action::FreeCompleted, 32, "activation", 3),
                (Action::Alloc, 32, "gradient", 3),
                (Action::FreeCompleted, 32, "gradient", 5),
            ]
        );
        assert_eq!(e[2].addr, e[1].addr, "the same tensor");
        assert_eq!(e[4].addr, e[3].addr);
        assert_eq!(s.segments.len(), 1, "the parameter lives on");
        assert_eq!(Timeline::from_snapshot(&s, 0).peak_bytes, 96);
    }

    #[test]
    fn what_is_not_a_memory_timeline_is_said() {
        assert!(read("[[1, 2], [[0, 1]]]").unwrap_err().contains("2 times but 1 rows"));
        assert!(read("[[1], [[0, 1, 2]]]").unwrap_err().contains("not 9"));
        assert!(read("[[1, 9, 64, 0]]").unwrap_err().contains("action 9"));
        assert!(read("[[1, 2, 64, 8]]").unwrap_err().contains("category 8"));
        assert_eq!(read("[[1, 2, 3]]").unwrap_err(), SHAPE);
        assert!(read("[[1, [2]]]").unwrap_err().contains("mixes"));
        let none = to_snapshot(&read("[[], []]").unwrap()).unwrap_err();
        assert!(none.contains("profile_memory=True"), "{none}");
        assert!(to_snapshot(&read("[[1, 4, -64, 0]]").unwrap()).is_ok(), "a tensor older than the timeline may go");
        assert!(to_snapshot(&read("[[1, 2, -64, 0]]").unwrap()).unwrap_err().contains("Create with -64 bytes"));
    }
}
