//! The first pass: validate every opcode and find the memo slots read back later.

use super::cursor::{check_proto, Cursor, Op};
use super::op;
use super::{Hooks, ReadError, ReadPass, TICK};

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

/// First pass: validate every opcode and its length, and find the memo slots read back.
pub(super) fn prescan(data: &[u8], hooks: &mut Hooks<'_>) -> Result<MemoRefs, ReadError> {
    // The position lives in a local, not in a Cursor whose address escapes: kept in a
    // register, not stored and reloaded around every opcode.
    let mut pos = 0;
    let mut words: Vec<u64> = Vec::new();
    let mut len = 0u32;
    let mut next_tick = TICK;
    loop {
        if pos >= next_tick {
            hooks.tick(ReadPass::Check, data, pos, None, Vec::new());
            next_tick = pos + TICK;
        }
        // The opcodes that make up nearly all of a snapshot, skipped without decoding
        // when complete; anything else (or a truncated one) takes the full decoder.
        if let Some((idx, n)) = memo_ref(&data[pos..]) {
            mark_get(&mut words, len, idx, pos)?;
            pos += n;
            continue;
        }
        match &data[pos..] {
            [op::MEMOIZE, ..] => {
                let idx = len;
                memo_put(&mut len, idx, pos)?;
                pos += 1;
                continue;
            }
            [op::MARK
            | op::EMPTY_DICT
            | op::EMPTY_LIST
            | op::SETITEMS
            | op::APPENDS
            | op::NONE
            | op::NEWTRUE
            | op::NEWFALSE, ..] => {
                pos += 1;
                continue;
            }
            [op::BININT1, _, ..] => {
                pos += 2;
                continue;
            }
            [op::SHORT_BINUNICODE, n, rest @ ..] if rest.len() >= *n as usize => {
                pos += 2 + *n as usize;
                continue;
            }
            _ => {}
        }
        let mut cur = Cursor { data, pos };
        let (at, o) = cur.next()?;
        pos = cur.pos;
        match o {
            Op::Stop => break,
            Op::Proto(v) => check_proto(v, at)?,
            Op::Memoize => {
                let idx = len;
                memo_put(&mut len, idx, at)?
            }
            Op::Put(idx) => memo_put(&mut len, idx, at)?,
            Op::Get(idx) => mark_get(&mut words, len, idx, at)?,
            _ => {}
        }
    }
    let mut ranks = Vec::with_capacity(words.len());
    let mut acc = 0u32;
    for w in &words {
        ranks.push(acc);
        acc += w.count_ones();
    }
    Ok(MemoRefs { words, ranks })
}

/// A complete BINGET or LONG_BINGET at the start of `bytes`: its memo index and length.
#[inline]
pub(super) fn memo_ref(bytes: &[u8]) -> Option<(u32, usize)> {
    match bytes {
        [op::BINGET, i, ..] => Some((*i as u32, 2)),
        [op::LONG_BINGET, a, b, c, d, ..] => Some((u32::from_le_bytes([*a, *b, *c, *d]), 5)),
        _ => None,
    }
}

/// Record that memo slot `idx` is read back (checked against the `len` slots defined).
#[inline]
pub(super) fn mark_get(words: &mut Vec<u64>, len: u32, idx: u32, at: usize) -> Result<(), ReadError> {
    memo_get_check(len, idx, at)?;
    let w = (idx / 64) as usize;
    if words.len() <= w {
        words.resize(w + 1, 0);
    }
    words[w] |= 1 << (idx % 64);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memo_slots_rank_only_referenced_indices() {
        // BINGET of memo 0 and 70 only: two slots, in index order.
        let mut p = vec![op::PROTO, 4];
        for _ in 0..71 {
            p.extend([op::NONE, op::MEMOIZE, op::POP]);
        }
        p.extend([op::BINGET, 70, op::BINGET, 0, op::POP, op::STOP]);
        let hooks = &mut Hooks { release: &mut |_| {}, observe: &mut |_| {} };
        let refs = prescan(&p, hooks).unwrap();
        assert_eq!(refs.count(), 2);
        assert_eq!(
            (refs.slot(0), refs.slot(70), refs.slot(1), refs.slot(5000)),
            (Some(0), Some(1), None, None)
        );
    }
}
