//! The first pass: validate every opcode and find the memo slots read back later.

use super::cursor::{check_proto, Cursor, Op};
use super::op;
use super::error::ReadError;
use super::hooks::{Hooks, ReadPass, TICK};

/// Memo slots read back by BINGET, as a bitset with rank support.
pub(super) struct MemoRefs {
    pub(super) words: Vec<u64>,
    /// `ranks[i]` = number of set bits in `words[..i]`.
    pub(super) ranks: Vec<u32>,
}

impl MemoRefs {
    #[inline]
    pub(super) fn slot(&self, idx: u32) -> Option<usize> {
        let w = *self.words.get((idx / 64) as usize)?;
        let bit = 1u64 << (idx % 64);
        (w & bit != 0).then(|| {
            self.ranks[(idx / 64) as usize] as usize + (w & (bit - 1)).count_ones() as usize
        })
    }
    pub(super) fn count(&self) -> usize {
        self.ranks.last().copied().unwrap_or(0) as usize
            + self.words.last().map_or(0, |w| w.count_ones() as usize)
    }
}

/// The memo slots of the indices a thread met last, 256 of them by a hash of the index:
/// a trace's entries read back the same few keys and actions in every entry, and a slot
/// found by rank counts bits in software on baseline x86-64 (issue 29). A slot never
/// changes once the pre-scan is done. Each (index, slot) is one word, so any thread reads
/// a pair that belongs together; each thread keeps its own.
pub(super) struct SlotCache([std::sync::atomic::AtomicU64; 256]);

impl Default for SlotCache {
    fn default() -> Self {
        // (no index, no slot): an index of u32::MAX is never read back.
        SlotCache(std::array::from_fn(|_| std::sync::atomic::AtomicU64::new(u64::MAX)))
    }
}

impl SlotCache {
    #[inline(always)]
    pub(super) fn slot(&self, refs: &MemoRefs, idx: u32) -> Option<usize> {
        use std::sync::atomic::Ordering::Relaxed;
        let cell = &self.0[(idx.wrapping_mul(0x9e37_79b1) >> 24) as usize];
        let seen = cell.load(Relaxed);
        let slot = if (seen >> 32) as u32 == idx {
            seen as u32
        } else {
            let slot = refs.slot(idx).map_or(u32::MAX, |s| s as u32);
            cell.store((idx as u64) << 32 | slot as u64, Relaxed);
            slot
        };
        (slot != u32::MAX).then_some(slot as usize)
    }
}

/// Where a FRAME's opcodes begin, with what came before it: the memo entries defined and
/// the MARKs open. A thread can start decoding there without reading what came before.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Checkpoint {
    pub(super) pos: usize,
    pub(super) memo: u32,
    pub(super) depth: i64,
}

/// What the first pass found: the memo slots read back, and a checkpoint at each FRAME.
pub(super) struct Scan {
    pub(super) refs: MemoRefs,
    pub(super) checkpoints: Vec<Checkpoint>,
}

/// How an opcode changes the number of open MARKs.
pub(super) fn mark_change(o: &Op<'_>) -> i64 {
    match o {
        Op::Mark => 1,
        Op::PopMark | Op::List | Op::Dict | Op::Tuple | Op::Appends | Op::SetItems => -1,
        _ => 0,
    }
}

/// Tracks Python's `len(memo)`; a put may overwrite or append, never skip ahead.
pub(super) fn memo_put(len: &mut u32, idx: u32, at: usize) -> Result<(), ReadError> {
    if idx > *len {
        return Err(ReadError::Malformed {
            offset: at,
            detail: format!("memo index {idx} skips ahead of the {len} memo entries defined"),
        });
    }
    if idx == *len {
        *len = len.checked_add(1).ok_or_else(|| ReadError::Malformed {
            offset: at,
            detail: "too many memo entries".into(),
        })?;
    }
    Ok(())
}

pub(super) fn memo_get_check(len: u32, idx: u32, at: usize) -> Result<(), ReadError> {
    if idx >= len {
        return Err(ReadError::Malformed {
            offset: at,
            detail: format!("memo index {idx} out of range (memo has {len} entries)"),
        });
    }
    Ok(())
}

/// The memo slots read back (as bitset words) and the checkpoints.
type Found = (Vec<u64>, Vec<Checkpoint>);

/// The bytes the pre-scan reads an opcode from at once: more than the longest number it
/// skips that way (a LONG1 of 8 bytes).
const WINDOW: usize = 16;

/// Files at least this large are checked in parts at once, one a thread.
const PARALLEL_FROM: usize = 8 * TICK;
/// The fewest bytes a part is given: below that, starting a thread costs more than it saves.
const PART_BYTES: usize = 2 * TICK;

/// First pass: validate every opcode and its length, and find the memo slots read back.
///
/// A large file is checked in up to `parts` parts at once (the machine's cores), split
/// where a FRAME begins (an opcode boundary). A part after the first does not know how
/// many memo slots those before it define, so it notes the fewest it needs; anything the
/// parts cannot settle together (an error about the memo, an explicit PUT) is settled by
/// checking the whole file in order, which also finds the first error exactly.
pub(super) fn prescan(data: &[u8], parts: usize, hooks: &mut Hooks<'_>) -> Result<Scan, ReadError> {
    let parts = parts.min(data.len() / PART_BYTES);
    let mut splits: Vec<usize> = Vec::new();
    if data.len() >= PARALLEL_FROM {
        for i in 1..parts {
            match frame_start_after(data, data.len() / parts * i) {
                Some(at) if splits.last().is_none_or(|&last| at > last) => splits.push(at),
                Some(_) => {}
                None => break,
            }
        }
    }
    let found = if splits.is_empty() { None } else { check_parts(data, &splits, hooks)? };
    let (words, checkpoints) = match found {
        Some(found) => found,
        None => {
            let c = check::<true>(data, 0, usize::MAX, &mut |pos| hooks.tick(ReadPass::Check, data, (pos, pos), None, Vec::new()))?;
            (c.words, c.checkpoints)
        }
    };
    let mut ranks = Vec::with_capacity(words.len());
    let mut acc = 0u32;
    for w in &words {
        ranks.push(acc);
        acc += w.count_ones();
    }
    Ok(Scan { refs: MemoRefs { words, ranks }, checkpoints })
}

/// The whole file checked in order, as `prescan` does a small one.
pub(super) fn walk(data: &[u8]) -> Result<(), ReadError> {
    check::<true>(data, 0, usize::MAX, &mut |_| {}).map(drop)
}

/// The memo slots read back, from the parts that begin at 0 and at each of `splits`,
/// checked at once; `None` when the parts cannot settle it together.
fn check_parts(data: &[u8], splits: &[usize], hooks: &mut Hooks<'_>) -> Result<Option<Found>, ReadError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let done: Vec<AtomicUsize> = splits.iter().map(|_| AtomicUsize::new(0)).collect();
    let (first, later) = std::thread::scope(|s| {
        let release = hooks.release;
        let later: Vec<_> = splits
            .iter()
            .zip(splits.iter().skip(1).copied().chain([usize::MAX]))
            .zip(&done)
            .map(|((&from, to), done)| {
                s.spawn(move || {
                    let mut last = from;
                    check::<false>(data, from, to, &mut |pos| {
                        release(last..pos);
                        last = pos;
                        done.store(pos - from, Ordering::Relaxed);
                    })
                })
            })
            .collect();
        let mut tick = |pos: usize| {
            let others: usize = done.iter().map(|d| d.load(Ordering::Relaxed)).sum();
            hooks.tick(ReadPass::Check, data, (pos, pos + others), None, Vec::new());
        };
        let first = check::<true>(data, 0, splits[0], &mut tick);
        (first, later.into_iter().map(|t| t.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect::<Vec<_>>())
    });
    let first = first?;
    // An opcode that runs past where the next part begins (a frame it does not end in):
    // the parts did not split the file where reading in order does.
    let ends_at = |c: &Checked, at: usize| c.stopped || c.end == at;
    if !ends_at(&first, splits[0]) {
        return Ok(None);
    }
    let (mut words, mut checkpoints) = (first.words, first.checkpoints);
    // What the parts before the one taken next defined and left open.
    let (mut puts, mut depth, mut stopped) = (first.puts, first.depth, first.stopped);
    for (i, part) in later.into_iter().enumerate() {
        if stopped {
            break; // the pickle ends before this part: what follows is not read
        }
        let part = match part {
            // A PUT, or a memo slot the parts before may not define: settled in order.
            Ok(p) if p.memo_exact && p.needs <= puts && splits.get(i + 1).is_none_or(|&at| ends_at(&p, at)) => p,
            Ok(_) | Err(ReadError::Malformed { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        // More memo entries than checking in order allows: that check says so.
        let Some(total) = puts.checked_add(part.puts) else { return Ok(None) };
        if words.len() < part.words.len() {
            words.resize(part.words.len(), 0);
        }
        for (w, p) in words.iter_mut().zip(&part.words) {
            *w |= p;
        }
        // The part counted from its own start.
        checkpoints.extend(part.checkpoints.iter().map(|c| Checkpoint { pos: c.pos, memo: c.memo + puts, depth: c.depth + depth }));
        (puts, depth, stopped) = (total, depth + part.depth, part.stopped);
    }
    Ok(Some((words, checkpoints)))
}

/// The start of the first FRAME at or after `at`, found by following the frames from the
/// file's start (unframed opcodes between them, large strings, decoded one by one).
fn frame_start_after(data: &[u8], at: usize) -> Option<usize> {
    let mut pos = 2; // after PROTO
    while pos < data.len() {
        if data[pos] == op::FRAME {
            if pos >= at {
                return Some(pos);
            }
            let len = u64::from_le_bytes(data.get(pos + 1..pos + 9)?.try_into().ok()?);
            pos = pos.checked_add(9)?.checked_add(usize::try_from(len).ok()?)?;
        } else {
            let mut cur = Cursor { data, pos };
            cur.next().ok()?;
            pos = cur.pos;
        }
    }
    None
}

/// What checking a stretch of the file found.
struct Checked {
    words: Vec<u64>,
    /// MEMOIZEs in the stretch.
    puts: u32,
    /// MARKs opened in the stretch, less those closed.
    depth: i64,
    checkpoints: Vec<Checkpoint>,
    /// The fewest memo slots the stretch's BINGETs need defined before it.
    needs: u32,
    /// False when the stretch holds a PUT whose effect depends on the memo before it.
    memo_exact: bool,
    /// The stretch ends at STOP.
    stopped: bool,
    /// Where checking stopped: at STOP's end, or at the first opcode boundary at or past `to`.
    end: usize,
}

/// Validates every opcode from `from` to STOP (or to `to`), noting the memo slots read
/// back. `EXACT`: the memo is empty at `from`, so memo errors are raised where they
/// occur; otherwise the memo defined before `from` is unknown, and only noted.
fn check<const EXACT: bool>(data: &[u8], from: usize, to: usize, tick: &mut dyn FnMut(usize)) -> Result<Checked, ReadError> {
    // The position lives in a local, not in a Cursor whose address escapes: kept in a
    // register, not stored and reloaded around every opcode.
    let mut pos = from;
    let mut c = Checked { words: Vec::new(), puts: 0, depth: 0, checkpoints: Vec::new(), needs: 0, memo_exact: true, stopped: false, end: from };
    let mut next_tick = from + TICK;
    let get = |c: &mut Checked, idx: u32, at: usize| {
        if EXACT {
            memo_get_check(c.puts, idx, at)?;
        } else {
            c.needs = c.needs.max((idx + 1).saturating_sub(c.puts));
        }
        mark(&mut c.words, idx);
        Ok::<(), ReadError>(())
    };
    while pos < to {
        if pos >= next_tick {
            tick(pos);
            next_tick = pos + TICK;
        }
        // The opcodes that make up nearly all of a snapshot, skipped without decoding
        // where the file has `WINDOW` bytes more: read from one fixed array, one bounds
        // check an opcode, up to the next tick with no other test. Anything else (a long
        // string, the file's last bytes) takes the full decoder.
        let fast_end = next_tick.min(to).min((data.len() + 1).saturating_sub(WINDOW));
        let mut other = false;
        while pos < fast_end {
            let w: &[u8; WINDOW] = data[pos..pos + WINDOW].try_into().expect("a window's length");
            let n = match w[0] {
                op::BINGET => {
                    get(&mut c, w[1] as u32, pos)?;
                    2
                }
                op::LONG_BINGET => {
                    get(&mut c, u32::from_le_bytes([w[1], w[2], w[3], w[4]]), pos)?;
                    5
                }
                op::MEMOIZE => {
                    let idx = c.puts;
                    memo_put(&mut c.puts, idx, pos)?;
                    1
                }
                op::MARK => {
                    c.depth += 1;
                    1
                }
                op::SETITEMS | op::APPENDS => {
                    c.depth -= 1;
                    1
                }
                op::EMPTY_DICT | op::EMPTY_LIST | op::NONE | op::NEWTRUE | op::NEWFALSE => 1,
                op::BININT1 => 2,
                op::BININT2 => 3,
                op::BININT => 5,
                // Addresses and times: never more than 8 bytes in a snapshot (the full
                // decoder checks larger ones).
                op::LONG1 if w[1] <= 8 => 2 + w[1] as usize,
                // A frame's file name is longer than the window: its own test.
                op::SHORT_BINUNICODE if data.len() - pos >= 2 + w[1] as usize => 2 + w[1] as usize,
                _ => 0,
            };
            if n == 0 {
                other = true;
                break;
            }
            pos += n;
        }
        // Stopped at a tick or at `to`, or the window still in the file: the loop's tests.
        if !other && (pos >= next_tick || pos >= to || pos + WINDOW <= data.len()) {
            continue;
        }
        let mut cur = Cursor { data, pos };
        let (at, o) = cur.next()?;
        pos = cur.pos;
        c.depth += mark_change(&o);
        match o {
            Op::Frame => c.checkpoints.push(Checkpoint { pos, memo: c.puts, depth: c.depth }),
            Op::Stop => {
                c.stopped = true;
                break;
            }
            Op::Proto(v) => check_proto(v, at)?,
            Op::Memoize => {
                let idx = c.puts;
                memo_put(&mut c.puts, idx, at)?
            }
            Op::Put(idx) if EXACT => memo_put(&mut c.puts, idx, at)?,
            Op::Put(_) => c.memo_exact = false,
            Op::Get(idx) => get(&mut c, idx, at)?,
            _ => {}
        }
    }
    c.end = pos;
    Ok(c)
}

/// A complete BINGET or LONG_BINGET at the start of `bytes`: its memo index and length.
#[inline]
pub(super) fn memo_ref(bytes: &[u8]) -> Option<(u32, usize)> {
    // The index as one 4-byte load: bound byte by byte in a slice pattern, it was put
    // together from four (26 instructions a LONG_BINGET, a tenth of the pre-scan).
    match *bytes.first()? {
        op::BINGET => Some((*bytes.get(1)? as u32, 2)),
        op::LONG_BINGET => Some((u32::from_le_bytes(bytes.get(1..5)?.try_into().ok()?), 5)),
        _ => None,
    }
}

/// Record that memo slot `idx` is read back.
#[inline]
fn mark(words: &mut Vec<u64>, idx: u32) {
    let w = (idx / 64) as usize;
    if words.len() <= w {
        words.resize(w + 1, 0);
    }
    words[w] |= 1 << (idx % 64);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::reader::hooks::ReadProgress;

    #[test]
    fn memo_slots_rank_only_referenced_indices() {
        // BINGET of memo 0 and 70 only: two slots, in index order.
        let mut p = vec![op::PROTO, 4];
        for _ in 0..71 {
            p.extend([op::NONE, op::MEMOIZE, op::POP]);
        }
        p.extend([op::BINGET, 70, op::BINGET, 0, op::POP, op::STOP]);
        let mut observe = |_: &ReadProgress<'_>| {};
        let hooks = &mut Hooks::new(&|_| {}, &mut observe);
        let refs = prescan(&p, 2, hooks).unwrap().refs;
        assert_eq!(refs.count(), 2);
        assert_eq!(
            (refs.slot(0), refs.slot(70), refs.slot(1), refs.slot(5000)),
            (Some(0), Some(1), None, None)
        );
    }

    #[test]
    fn a_memo_read_back_is_found_only_when_complete() {
        assert_eq!(memo_ref(&[op::BINGET, 7, op::STOP]), Some((7, 2)));
        assert_eq!(memo_ref(&[op::LONG_BINGET, 0x04, 0x03, 0x02, 0x01]), Some((0x0102_0304, 5)));
        assert_eq!(memo_ref(&[op::LONG_BINGET, 0xff, 0xff, 0xff, 0xff, op::STOP]), Some((u32::MAX, 5)));
        assert_eq!(memo_ref(&[op::LONG_BINGET, 1, 2, 3]), None);
        assert_eq!(memo_ref(&[op::BINGET]), None);
        assert_eq!(memo_ref(&[]), None);
        assert_eq!(memo_ref(&[op::BINPUT, 1]), None);
    }

    /// The slot cache answers as the ranks do, for indices that share its cells and for
    /// the index its empty cells hold.
    #[test]
    fn the_slot_cache_gives_each_index_its_own_slot() {
        // Every third of 20,000 indices read back: 6,667 slots, far more than the cells.
        let mut words = vec![0u64; 20_000 / 64 + 1];
        for idx in (0..20_000u32).step_by(3) {
            mark(&mut words, idx);
        }
        let ranks = words.iter().scan(0u32, |n, w| Some(std::mem::replace(n, *n + w.count_ones()))).collect();
        let refs = MemoRefs { words, ranks };
        let cache = SlotCache::default();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..200_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let idx = match rng % 10 {
                0 => u32::MAX,
                1 => (rng >> 32) as u32, // anywhere, mostly past the bitmap
                _ => (rng >> 40) as u32 % 20_100,
            };
            assert_eq!(cache.slot(&refs, idx), refs.slot(idx), "index {idx}");
        }
        assert_eq!(cache.slot(&refs, 3 * 6_666), Some(6_666));
    }

    /// A protocol-4 pickle in 64 KB frames: memo slots 0..256 defined, then `n`
    /// batches reading them back, then STOP; each of `extra` (batch, opcodes) goes
    /// in before that batch.
    fn big(n: usize, extra: &[(usize, &[u8])]) -> Vec<u8> {
        let mut frame = vec![op::EMPTY_LIST];
        for _ in 0..256 {
            frame.extend([op::NONE, op::MEMOIZE]);
        }
        frame.push(op::MARK);
        frame.extend([op::POP; 256]);
        let mut out = vec![op::PROTO, 4];
        let mut flush = |frame: &mut Vec<u8>| {
            out.push(op::FRAME);
            out.extend((frame.len() as u64).to_le_bytes());
            out.append(frame);
        };
        for i in 0..n {
            for (_, ops) in extra.iter().filter(|e| e.0 == i) {
                frame.extend_from_slice(ops);
            }
            frame.push(op::MARK);
            for k in 0..32 {
                frame.extend([op::BINGET, ((i * 7 + k * 3) % 251) as u8]);
            }
            frame.push(op::APPENDS);
            if frame.len() >= 64 << 10 {
                flush(&mut frame);
            }
        }
        frame.push(op::STOP);
        flush(&mut frame);
        out
    }

    type Outcome = Result<Found, String>;

    fn both(data: &[u8], parts: usize) -> (Outcome, Outcome) {
        let mut observe = |_: &ReadProgress<'_>| {};
        let hooks = &mut Hooks::new(&|_| {}, &mut observe);
        let split = prescan(data, parts, hooks).map(|s| (s.refs.words, s.checkpoints)).map_err(|e| e.to_string());
        let in_order = check::<true>(data, 0, usize::MAX, &mut |_| {}).map(|c| (c.words, c.checkpoints)).map_err(|e| e.to_string());
        (split, in_order)
    }

    #[test]
    fn a_large_file_checked_in_parts_finds_what_checking_in_order_finds() {
        const N: usize = 300_000;
        let data = big(N, &[]);
        assert!(data.len() >= PARALLEL_FROM && data.len() / PART_BYTES >= 3);
        for parts in [2, 3, 8] {
            let (split, in_order) = both(&data, parts);
            assert!(split.as_ref().is_ok_and(|h| h.1.len() > 100), "a checkpoint at each FRAME");
            assert_eq!(split, in_order, "{parts} parts: each part's checkpoints count from the file's start");
            // Errors in a later part, of the memo or not, at the offset checking in order
            // reports.
            for bad in [&[op::LONG_BINGET, 44, 1, 0, 0][..], &[0xff], &[op::REDUCE]] {
                for at in [N / 2, N * 3 / 4, N - 10] {
                    let (split, in_order) = both(&big(N, &[(at, bad)]), parts);
                    assert!(split.is_err(), "{split:?}");
                    assert_eq!(split, in_order, "{parts} parts, at {at}");
                }
            }
            // A pickle that ends in an earlier part reads as if the rest were not there.
            let (split, in_order) = both(&big(N, &[(N / 4, &[op::STOP]), (N * 3 / 4, &[0xff])]), parts);
            assert!(split.is_ok());
            assert_eq!(split, in_order);
        }
    }

    /// A frame whose last opcode runs on into the next frame's header: reading in order
    /// never meets that FRAME, so the parts must not begin there.
    #[test]
    fn an_opcode_that_runs_past_its_frame_is_read_as_in_order() {
        let mut data = big(300_000, &[]);
        let at = frame_start_after(&data, data.len() / 2).unwrap();
        data[at - 1] = op::BINGET; // its index is the FRAME opcode's byte
        for parts in [2, 3, 8] {
            let (split, in_order) = both(&data, parts);
            assert!(in_order.is_err(), "the frame's length bytes are no opcodes: {in_order:?}");
            assert_eq!(split, in_order, "{parts} parts");
        }
    }
}
