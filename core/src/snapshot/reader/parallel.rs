//! A trace's entries decoded on several threads (issue 29). The pre-scan left a checkpoint
//! at each FRAME: where its opcodes begin, the memo entries defined before it and the
//! MARKs open. From one, a thread finds the trace's next entry and reads entries with the
//! fast path, against the main pass's memo as it was when the round began and against
//! what its own entries defined since. Another thread's stack or text is noted and looked
//! up once that thread's work is in; an entry the fast path cannot read is stepped over and
//! left to the main pass.
//!
//! The main pass takes the threads' work in file order, reading the entries left to it
//! itself, so its state is at every entry boundary what reading in order makes it; the
//! result is the same on any number of threads. Where a thread's work does not fit (which
//! a well-formed snapshot never causes), the read starts again in order on one thread.

use super::cursor::Cursor;
use super::error::ReadError;
use super::fast_entry::{Elsewhere, FastEntry, FastScratch, Tables};
use super::hooks::{Hooks, ReadPass};
use super::intern::{FastMap, StackTable, TextTable};
use super::keys::KeyCache;
use super::op;
use super::prescan::{mark_change, Checkpoint, SlotCache};
use super::run::Ran;
use super::value::{EntryList, ListData, Memo, Value};
use super::vm::{MemoView, Vm};
use crate::snapshot::model::{FrameId, StackId, Text, TraceEntry};

/// Frame and stack ids a thread made itself carry this bit until the main pass interns
/// them; the main pass's own stay below it.
const LOCAL: u32 = 1 << 31;

/// An entry longer than this is not stepped over by a thread: the main pass reads on
/// from it.
const LONGEST_ENTRY: usize = 1 << 20;

/// Where a thread's decoding does not fit the main pass: the read starts again in order.
pub(super) struct Refit;

/// The frames, stacks, texts and memo entries a thread's entries made.
#[derive(Default)]
struct Local<'a> {
    frames: Vec<(&'a str, &'a str, i64)>,
    frame_ids: FastMap<(&'a str, &'a str, i64), FrameId>,
    stacks: StackTable,
    texts: TextTable<'a>,
    /// By memo slot, what later entries of this thread read back.
    memo: FastMap<usize, Memo<'a>>,
    /// (entries read before, memo slot, value): the memo puts, for the main pass.
    puts: Vec<(u32, usize, Memo<'a>)>,
    read: u32,
}

impl<'a> Tables<'a> for Local<'a> {
    fn frame(&mut self, name: &'a str, filename: &'a str, line: i64) -> Option<FrameId> {
        if let Some(&id) = self.frame_ids.get(&(name, filename, line)) {
            return Some(id);
        }
        let id = u32::try_from(self.frames.len()).ok().filter(|&i| i < LOCAL - 1)? | LOCAL;
        self.frames.push((name, filename, line));
        self.frame_ids.insert((name, filename, line), id);
        Some(id)
    }
    fn stack(&mut self, ids: &mut Vec<FrameId>) -> Option<StackId> {
        self.stacks.intern(ids).filter(|&s| s < LOCAL).map(|s| s | LOCAL)
    }
    fn text(&mut self, s: &'a str) -> Text {
        self.texts.get(s)
    }
    fn put(&mut self, slot: usize, m: Memo<'a>) {
        self.memo.insert(slot, m);
        self.puts.push((self.read, slot, m));
    }
}

/// An entry a thread stepped over, for the main pass: its bytes and the memo's length
/// before it, after `at` entries the thread read.
struct Left {
    at: u32,
    start: usize,
    end: usize,
    memo: u32,
}

/// How a thread's stretch ends, and the memo's length there.
#[derive(Clone, Copy)]
enum End {
    /// At the first entry at or after the next stretch's checkpoint, where that begins.
    Next(usize, u32),
    /// The trace's list ends: the last batch's APPENDS is just before `pos`.
    ListEnds(usize, u32),
    /// At an entry, or what follows one, that it could neither read nor step over: the
    /// main pass reads on from there alone.
    Stuck(usize, u32),
}

/// One thread's work on one stretch of a trace.
struct Stretch<'a> {
    /// Its first entry and the memo's length there; `None` when it found none before the
    /// next stretch's checkpoint.
    start: Option<(usize, u32)>,
    /// As the trace's list keeps them, so the main pass moves them over in one pass.
    entries: EntryList,
    /// By entry index, what another thread read.
    elsewhere: Vec<(u32, Elsewhere)>,
    left: Vec<Left>,
    local: Local<'a>,
    end: End,
}

/// Where one stretch starts: at an entry the main pass has reached, or at a checkpoint.
#[derive(Clone, Copy)]
enum From {
    Entry(usize, u32),
    Checkpoint(Checkpoint),
}

/// What every thread of a round reads: the input, the main pass's memo, the depth of
/// the trace's entries.
struct Round<'v, 'a> {
    data: &'a [u8],
    view: MemoView<'v, 'a>,
    depth: i64,
}

impl<'a> Round<'_, 'a> {
    /// The opcode at `pos` and where the next begins, with how it changes the memo's
    /// length and the MARKs open; `None` at an opcode a thread does not step over.
    fn step(&self, pos: usize) -> Option<(usize, u32, i64)> {
        let mut cur = Cursor { data: self.data, pos };
        let (_, o) = cur.next().ok()?;
        let puts = match o {
            super::cursor::Op::Memoize => 1,
            super::cursor::Op::Put(_) | super::cursor::Op::Stop => return None,
            _ => 0,
        };
        Some((cur.pos, puts, mark_change(&o)))
    }

    /// The first entry of the trace at or after checkpoint `c`, before `limit`.
    fn first_entry(&self, c: Checkpoint, limit: usize) -> Option<(usize, u32)> {
        let (mut pos, mut memo, mut depth) = (c.pos, c.memo, c.depth);
        while pos < limit {
            if depth == self.depth && self.data.get(pos) == Some(&op::EMPTY_DICT) {
                return Some((pos, memo));
            }
            let (next, puts, change) = self.step(pos)?;
            (pos, memo, depth) = (next, memo.checked_add(puts)?, depth + change);
            if depth < self.depth - 1 {
                return None; // out of the trace's list
            }
        }
        None
    }

    /// Past the entry at `start`: where it ends and the memo's length there.
    fn step_over(&self, start: usize, mut memo: u32) -> Option<(usize, u32)> {
        let (mut pos, mut depth) = (start, self.depth);
        loop {
            let (next, puts, change) = self.step(pos)?;
            (pos, memo, depth) = (next, memo.checked_add(puts)?, depth + change);
            if pos - start > LONGEST_ENTRY || depth < self.depth {
                return None;
            }
            if depth == self.depth && matches!(self.data.get(pos), Some(&(op::EMPTY_DICT | op::APPENDS))) {
                return Some((pos, memo));
            }
        }
    }

    /// Reads the entries from `from` until the first at or after `until`.
    fn stretch(&self, from: From, until: usize) -> Stretch<'a> {
        let start = match from {
            From::Entry(pos, memo) => Some((pos, memo)),
            From::Checkpoint(c) => self.first_entry(c, until),
        };
        let mut s = Stretch { start, entries: EntryList::default(), elsewhere: Vec::new(), left: Vec::new(), local: Local::default(), end: End::Stuck(0, 0) };
        let Some((mut pos, mut memo)) = start else { return s };
        // Room for the stretch's entries at once, at 64 bytes of the file each (PyTorch's
        // take 70 or more; the last stretch's end is the file's, hence the cap): a list
        // grown by doubling copies what it holds at each step, and a smaller one still
        // grows so.
        s.entries = EntryList::with_capacity(until.min(self.data.len()).saturating_sub(pos).min(8 << 20) / 64);
        let keys = KeyCache::new();
        let slots = SlotCache::default();
        let mut scratch = FastScratch::remembering();
        let mut ids = Vec::new();
        s.end = loop {
            match self.data.get(pos) {
                Some(&op::EMPTY_DICT) if pos >= until => break End::Next(pos, memo),
                Some(&op::EMPTY_DICT) => {
                    scratch.reset();
                    ids.clear();
                    let view = MemoView { local: Some(&s.local.memo), slots: &slots, ..self.view };
                    let mut p = FastEntry { view: &view, keys: &keys, data: self.data, pos, entry_memo: memo, memo_len: memo, scratch };
                    let read = p.entry(&mut ids);
                    let (end, end_memo) = (p.pos, p.memo_len);
                    scratch = p.scratch;
                    match read.and_then(|r| r.finish(&scratch, &mut ids, &mut s.local)) {
                        Some((entry, pool, elsewhere)) => {
                            if elsewhere.any() {
                                s.elsewhere.push((s.entries.len() as u32, elsewhere));
                            }
                            s.entries.push(entry, pool);
                            s.local.read += 1;
                            (pos, memo) = (end, end_memo);
                        }
                        None => match self.step_over(pos, memo) {
                            Some((end, end_memo)) => {
                                s.left.push(Left { at: s.entries.len() as u32, start: pos, end, memo });
                                (pos, memo) = (end, end_memo);
                            }
                            None => break End::Stuck(pos, memo),
                        },
                    }
                }
                Some(&op::FRAME) if self.data.len() - pos > 8 => pos += 9,
                // A batch of the list ends; another may follow.
                Some(&op::APPENDS) => {
                    let mut next = pos + 1;
                    while self.data.get(next) == Some(&op::FRAME) && self.data.len() - next > 8 {
                        next += 9;
                    }
                    if self.data.get(next) != Some(&op::MARK) {
                        break End::ListEnds(pos + 1, memo);
                    }
                    pos = next + 1;
                }
                _ => break End::Stuck(pos, memo),
            }
        };
        s
    }
}

/// What taking a stretch left: where the next begins, or the main pass reads on alone.
enum Taken {
    Next(usize, u32),
    Alone,
}

impl<'a> Vm<'a> {
    /// Decodes the rest of the trace whose list the last entry went into, on `threads`
    /// threads, a round of stretches of about `chunk_bytes` each at a time. Returns with
    /// the main pass where reading in order would be at the list's end, or where a thread
    /// stopped; `Err(Refit)` when a thread's work did not fit.
    pub(super) fn parallel_trace(&mut self, hooks: &mut Hooks<'_>) -> Result<Result<(), Refit>, ReadError> {
        self.parallel_from = usize::MAX; // the entries left to the main pass stay on it
        if self.frames.len() >= LOCAL as usize || self.stacks.stacks.len() >= LOCAL as usize {
            return Ok(Ok(())); // the main pass's ids would read as a thread's own
        }
        let depth = self.marks.len() as i64;
        let (mut pos, mut memo) = (self.cur.pos, self.memo_len);
        // Entries the threads read and those they left to the main pass.
        let (mut read, mut left) = (0usize, 0usize);
        'rounds: loop {
            // Each stretch from a checkpoint about `chunk_bytes` after the last one's start.
            let after = |pos: usize| self.checkpoints.get(self.checkpoints.partition_point(|c| c.pos < pos.saturating_add(self.chunk_bytes))).copied();
            let mut froms = vec![From::Entry(pos, memo)];
            let mut ends = Vec::with_capacity(self.threads);
            let mut last = pos;
            while let Some(c) = after(last) {
                ends.push(c.pos);
                if froms.len() == self.threads {
                    break;
                }
                froms.push(From::Checkpoint(c));
                last = c.pos;
            }
            if ends.len() < froms.len() {
                ends.push(usize::MAX); // the last stretch reads to the list's end
            }
            // Where this round's entries will lie in the trace's list, a part for each thread
            // to fault in once its stretch is read (the list does not move meanwhile): the
            // main pass, moving the entries over alone, faulted in each fresh page of it, most
            // of the command's faults on a large file (issue 29).
            let pages = self.list_room(ends.last().map_or(pos, |&e| e.min(self.cur.data.len())).saturating_sub(pos));
            let part = |k: usize| {
                let n = pages.len() / froms.len();
                pages.start + k * n..pages.start + (k + 1) * n
            };
            let stretches = {
                let round = Round { data: self.cur.data, view: self.view(), depth };
                let round = &round;
                std::thread::scope(|scope| {
                    // The threads' parts first, the main pass's last.
                    let others: Vec<_> = froms
                        .iter()
                        .zip(&ends)
                        .skip(1)
                        .enumerate()
                        .map(|(k, (&from, &end))| {
                            let pages = part(k);
                            scope.spawn(move || {
                                let s = round.stretch(from, end);
                                crate::snapshot::pages::fault_in(pages);
                                s
                            })
                        })
                        .collect();
                    let first = round.stretch(froms[0], ends[0]);
                    crate::snapshot::pages::fault_in(part(froms.len() - 1));
                    std::iter::once(first).chain(others.into_iter().map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))).collect::<Vec<_>>()
                })
            };
            for s in stretches {
                (read, left) = (read + s.entries.len(), left + s.left.len());
                match self.take_stretch(s, hooks)? {
                    Ok(Taken::Next(p, m)) => (pos, memo) = (p, m),
                    Ok(Taken::Alone) => break 'rounds,
                    Err(r) => return Ok(Err(r)),
                }
            }
            let (segments, traces) = self.peek();
            hooks.tick(ReadPass::Decode, self.cur.data, (self.cur.pos, self.cur.pos), segments, traces);
            // Entries the fast path cannot read go through the main pass whatever the
            // threads do: there the threads only add work.
            if left > read {
                break;
            }
        }
        // A later trace (another device's) may use the threads again, unless they did
        // little for this one.
        if read >= 1000 && left <= read {
            self.parallel_from = self.cur.pos.saturating_add(self.chunk_bytes);
        }
        Ok(Ok(()))
    }

    /// The addresses of the trace's list's room for the entries of `bytes` more of the file
    /// (64 bytes of it an entry, as for a stretch), made first where the list lacks it;
    /// empty where it cannot be made.
    fn list_room(&mut self, bytes: usize) -> std::ops::Range<usize> {
        let Some(ListData::Entries(list)) = self.list_below_mark(|l| matches!(l, ListData::Entries(_))) else { return 0..0 };
        let room = list.room(bytes / 64);
        let start = room.as_ptr() as usize;
        start..start + std::mem::size_of_val(room)
    }

    /// Takes one thread's stretch into the trace's list, reading the entries it left.
    fn take_stretch(&mut self, s: Stretch<'a>, hooks: &mut Hooks<'_>) -> Result<Result<Taken, Refit>, ReadError> {
        let here = (self.cur.pos, self.memo_len);
        let Some(start) = s.start else {
            return Ok(Ok(Taken::Next(here.0, here.1))); // no entry of its own
        };
        // Nothing of it is taken yet: the main pass can read on alone from here.
        if start != here {
            return Ok(Ok(Taken::Alone));
        }
        self.stretches += 1;
        let Ok(frames) = s.local.frames.iter().map(|&(n, f, l)| self.intern_frame(n, f, l)).collect::<Result<Vec<FrameId>, _>>() else {
            return Ok(Ok(Taken::Alone));
        };
        let mut stacks = Vec::with_capacity(s.local.stacks.stacks.len());
        for st in &s.local.stacks.stacks {
            let Some(mut ids) = st.iter().map(|&f| own(f, &frames)).collect::<Option<Vec<FrameId>>>() else { return Ok(Ok(Taken::Alone)) };
            let Some(id) = self.stacks.intern(&mut ids) else { return Ok(Ok(Taken::Alone)) };
            stacks.push(id);
        }
        // In file order, each run of the thread's entries and the entry it stepped over
        // next. That one's memo puts and the lookups of what other threads read need the
        // memo as reading in order has it there; the thread's own entries need nothing.
        let (mut puts, mut elsewhere) = (s.local.puts.iter().peekable(), s.elsewhere.iter().peekable());
        let total = s.entries.len();
        let EntryList { entries, pools } = s.entries;
        let mut entries = entries.into_iter();
        let unknown = std::cell::Cell::new(false); // a stack id the thread never made
        let with_stack = |mut e: TraceEntry| {
            match own(e.frames, &stacks) {
                Some(stack) => e.frames = stack,
                None => unknown.set(true),
            }
            e
        };
        let mut from = 0;
        for l in s.left.iter().map(Some).chain([None]) {
            let to = l.map_or(total, |l| l.at as usize);
            // Moved over in one pass, each entry's stack filled in on the way, up to each
            // entry that needs what another thread read (from the memo as it is there).
            let mut at = from;
            while at < to {
                let next = elsewhere.peek().map_or(to, |e| (e.0 as usize).min(to));
                if next > at {
                    let Some(ListData::Entries(list)) = self.list_below_mark(|l| matches!(l, ListData::Entries(_))) else { return Ok(Err(Refit)) };
                    list.extend_from(entries.by_ref().take(next - at).map(with_stack), &pools, at);
                    at = next;
                    continue;
                }
                let (Some((i, e)), Some(entry)) = (elsewhere.next(), entries.next()) else { return Ok(Err(Refit)) };
                let mut entry = with_stack(entry);
                if *i as usize != at || self.fill_elsewhere(&mut entry, e).is_none() {
                    return Ok(Err(Refit));
                }
                let Some(ListData::Entries(list)) = self.list_below_mark(|l| matches!(l, ListData::Entries(_))) else { return Ok(Err(Refit)) };
                list.extend_from(std::iter::once(entry), &pools, at);
                at += 1;
            }
            if unknown.get() {
                return Ok(Err(Refit));
            }
            from = to;
            for &(_, slot, m) in std::iter::from_fn(|| puts.next_if(|p| (p.0 as usize) < to)) {
                if self.put_local(slot, m, &frames, &stacks).is_none() {
                    return Ok(Err(Refit));
                }
            }
            if let Some(l) = l {
                if let Err(r) = self.take_left(l, hooks)? {
                    return Ok(Err(r));
                }
            }
        }
        let ((pos, memo), taken) = match s.end {
            End::Next(pos, memo) => ((pos, memo), Taken::Next(pos, memo)),
            End::ListEnds(pos, memo) => {
                self.marks.pop(); // the last batch's APPENDS
                ((pos, memo), Taken::Alone)
            }
            End::Stuck(pos, memo) => ((pos, memo), Taken::Alone),
        };
        (self.cur.pos, self.memo_len) = (pos, memo);
        Ok(Ok(taken))
    }

    /// One memo put of a thread's entry, its frame or stack interned.
    fn put_local(&mut self, slot: usize, m: Memo<'a>, frames: &[FrameId], stacks: &[StackId]) -> Option<()> {
        let m = match m {
            Memo::Frame(f) => Memo::Frame(own(f, frames)?),
            Memo::Stack(s) => Memo::Stack(own(s, stacks)?),
            m => m,
        };
        self.set_memo(slot, m);
        Some(())
    }

    /// What another thread read, now in the memo: the entry's stack and texts.
    fn fill_elsewhere(&mut self, entry: &mut TraceEntry, e: &Elsewhere) -> Option<()> {
        if let Some(idx) = e.frames {
            let Value::Stack(s) = self.memo_value(self.refs.slot(idx)?) else { return None };
            entry.frames = s;
        }
        let fields = [&mut entry.category, &mut entry.compile_context, &mut entry.user_metadata];
        for (field, idx) in fields.into_iter().zip(e.texts) {
            if let Some(idx) = idx {
                let Memo::Str(s) = self.memo[self.refs.slot(idx)?] else { return None };
                *field = Some(self.texts.get(s));
            }
        }
        Some(())
    }

    /// An entry a thread stepped over, read here in order and put into the list.
    fn take_left(&mut self, l: &Left, hooks: &mut Hooks<'_>) -> Result<Result<(), Refit>, ReadError> {
        // The entries the thread read before it defined the memo up to here.
        self.memo_len = l.memo;
        self.cur.pos = l.start;
        let marks = self.marks.len();
        match self.run_to(hooks, l.end)? {
            Ran::Stopped if self.cur.pos == l.end && self.marks.len() == marks => {}
            _ => return Ok(Err(Refit)),
        }
        // What the generic path left above the batch's MARK goes where APPENDS puts it.
        let floor = self.marks.last().copied().unwrap_or(0);
        for v in self.stack.split_off(floor) {
            match v {
                Value::Entry(b) => {
                    let (entry, pool) = *b;
                    if !self.push_entry(entry, pool) {
                        return Ok(Err(Refit));
                    }
                }
                Value::Skipped => {}
                _ => return Ok(Err(Refit)),
            }
        }
        Ok(Ok(()))
    }
}

/// A thread's own id (`LOCAL`) as the main pass interned it (`map`), or the main pass's.
fn own(id: u32, map: &[u32]) -> Option<u32> {
    if id & LOCAL != 0 {
        map.get((id & !LOCAL) as usize).copied()
    } else {
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_beyond_what_the_machine_lends_is_what_there_is() {
        let mut list = EntryList::default();
        list.push(TraceEntry::new(crate::snapshot::model::Action::Alloc, 1, 2), None);
        let spare = list.room(usize::MAX / 64).len();
        assert!(spare < usize::MAX / 64 && spare == list.entries.capacity() - 1);
    }
}
