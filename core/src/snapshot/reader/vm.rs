//! The pickle machine's state: the value stack, marks, the memo and the arena of shared
//! containers, and the tables records are interned into (frames, stacks, texts), with
//! the operations on them that the main pass, the records and the fast path share.


use super::cursor::Cursor;
use super::error::{malformed, ReadError};
use super::intern::{FastMap, StackTable, TextTable, NO_FRAME};
use super::keys::{action_of, key_of, Key, KeyCache};
use super::prescan::{memo_get_check, memo_put, memo_ref, Checkpoint, MemoRefs, Scan, SlotCache};
use super::value::{ListData, Memo, Value};
use crate::snapshot::model::{Action, Frame, FrameId, StackId};

pub(super) struct Vm<'a> {
    pub(super) cur: Cursor<'a>,
    pub(super) stack: Vec<Value<'a>>,
    pub(super) marks: Vec<usize>,
    pub(super) refs: MemoRefs,
    pub(super) memo: Vec<Memo<'a>>,
    /// The frame each memo slot holds (`NO_FRAME` if none): a compact copy of `memo` for
    /// the hottest lookup, BINGETs of frames, kept by `set_memo`.
    pub(super) memo_frames: Vec<FrameId>,
    /// The dict key each memo slot's string is (`Key::Other` if none), kept by
    /// `set_memo`: an entry's keys are nearly all read back, and matched with one load.
    pub(super) memo_keys: Vec<Key>,
    /// The action each memo slot's string names, if any, kept by `set_memo`: an entry's
    /// action is nearly always read back, and taken with one load, not compared as text.
    pub(super) memo_actions: Vec<Option<Action>>,
    pub(super) memo_len: u32,
    pub(super) arena: Vec<Value<'a>>,
    /// The memo slot of each arena entry, to store converted frames/stacks there too.
    pub(super) arena_memo: Vec<usize>,
    pub(super) frames: Vec<Frame>,
    pub(super) frame_ids: FastMap<(&'a str, &'a str, i64), FrameId>,
    /// Entries' texts (`compile_context`, `user_metadata`), one shared copy of each.
    pub(super) texts: TextTable<'a>,
    pub(super) stacks: StackTable,
    pub(super) scratch: Vec<Value<'a>>,
    pub(super) frame_scratch: Vec<FrameId>,
    pub(super) keys: KeyCache,
    /// Keys no record uses, by (record, key), and entries of unknown actions, counted.
    pub(super) skipped_keys: FastMap<(&'static str, &'a str), u64>,
    pub(super) skipped_actions: FastMap<&'a str, u64>,
    /// `Details` as read: frames' FX keys, blocks' forward frames.
    pub(super) frame_fx: FastMap<FrameId, Vec<(String, String)>>,
    pub(super) forward_frames: Vec<(u64, StackId)>,
    /// Offset of the opcode being run, for error messages.
    pub(super) at: usize,
    /// The pre-scan's checkpoints, where threads can start decoding a trace.
    pub(super) checkpoints: Vec<Checkpoint>,
    /// Threads that decode a trace's entries (1: the main pass alone), and the bytes each
    /// takes at a time (`parallel`).
    pub(super) threads: usize,
    pub(super) chunk_bytes: usize,
    /// A trace entry that goes straight into its list from here on may start decoding
    /// the rest of the trace on `threads` threads.
    pub(super) parallel_from: usize,
    /// Stretches of traces that threads decoded.
    pub(super) stretches: u32,
    /// The main pass's own cache of memo slots (each thread has its own).
    pub(super) slot_cache: SlotCache,
}

impl<'a> Vm<'a> {
    pub(super) fn new(data: &'a [u8], Scan { refs, checkpoints }: Scan) -> Self {
        let memo = vec![Memo::None; refs.count()];
        let memo_frames = vec![NO_FRAME; refs.count()];
        let memo_keys = vec![Key::Other; refs.count()];
        let memo_actions = vec![None; refs.count()];
        Vm {
            cur: Cursor { data, pos: 0 },
            stack: Vec::with_capacity(4096),
            marks: Vec::with_capacity(64),
            refs,
            memo,
            memo_frames,
            memo_keys,
            memo_actions,
            memo_len: 0,
            arena: Vec::new(),
            arena_memo: Vec::new(),
            frames: Vec::new(),
            frame_ids: FastMap::default(),
            texts: TextTable::default(),
            stacks: StackTable::default(),
            scratch: Vec::new(),
            frame_scratch: Vec::new(),
            keys: KeyCache::new(),
            skipped_keys: FastMap::default(),
            skipped_actions: FastMap::default(),
            frame_fx: FastMap::default(),
            forward_frames: Vec::new(),
            at: 0,
            checkpoints,
            threads: 1,
            chunk_bytes: usize::MAX,
            parallel_from: usize::MAX,
            stretches: 0,
            slot_cache: SlotCache::default(),
        }
    }

    /// The memo as the main pass has it, for the trace-entry fast path.
    pub(super) fn view(&self) -> MemoView<'_, 'a> {
        MemoView {
            refs: &self.refs,
            memo: &self.memo,
            memo_keys: &self.memo_keys,
            memo_actions: &self.memo_actions,
            memo_frames: &self.memo_frames,
            arena: &self.arena,
            base: self.memo_len,
            local: None,
            slots: &self.slot_cache,
        }
    }

    pub(super) fn schema(&self, what: &str, detail: String) -> ReadError {
        ReadError::Schema {
            detail: format!("{what} completed at byte {}: {detail}", self.at),
        }
    }

    pub(super) fn pop(&mut self) -> Result<Value<'a>, ReadError> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return Err(malformed(
                self.at,
                "a value is needed but the stack top is a MARK",
            ));
        }
        self.stack
            .pop()
            .ok_or_else(|| malformed(self.at, "a value is needed but the stack is empty"))
    }

    pub(super) fn pop_mark(&mut self) -> Result<usize, ReadError> {
        self.marks
            .pop()
            .ok_or_else(|| malformed(self.at, "an opcode that needs a MARK found none"))
    }

    /// The memo slot BINGET `idx` reads. Checked apart from `memo_value`: a value returned
    /// inside a `Result` goes through memory and stalls on store forwarding every BINGET.
    #[inline(always)]
    pub(super) fn memo_slot(&self, idx: u32) -> Result<usize, ReadError> {
        memo_get_check(self.memo_len, idx, self.at)?;
        self.slot_cache
            .slot(&self.refs, idx)
            .ok_or_else(|| malformed(self.at, "memo slot was not seen by the pre-scan"))
    }

    #[inline(always)]
    pub(super) fn memo_value(&self, slot: usize) -> Value<'a> {
        memo_value(self.memo[slot], &self.arena)
    }

    pub(super) fn set_memo(&mut self, slot: usize, m: Memo<'a>) {
        self.memo[slot] = m;
        self.memo_frames[slot] = match m {
            Memo::Frame(f) => f,
            _ => NO_FRAME,
        };
        (self.memo_keys[slot], self.memo_actions[slot]) = match m {
            Memo::Str(s) => (key_of(s), action_of(s)),
            _ => (Key::Other, None),
        };
    }

    pub(super) fn put(&mut self, idx: u32) -> Result<(), ReadError> {
        memo_put(&mut self.memo_len, idx, self.at)?;
        let Some(slot) = self.refs.slot(idx) else {
            return Ok(()); // never read back: nothing to keep
        };
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(malformed(self.at, "memoize with no value on the stack"));
        }
        let Some(top) = self.stack.last_mut() else {
            return Err(malformed(self.at, "memoize with no value on the stack"));
        };
        let v = match top.cheap_copy() {
            Some(v) => v,
            None => {
                // A container read back later is shared: both the stack and the memo
                // refer to one arena slot, so later SETITEMS/APPENDS reach both.
                let h = u32::try_from(self.arena.len())
                    .map_err(|_| malformed(self.at, "too many shared containers"))?;
                self.arena.push(std::mem::replace(top, Value::Shared(h)));
                self.arena_memo.push(slot);
                Memo::Shared(h)
            }
        };
        self.set_memo(slot, v);
        Ok(())
    }

    /// Put a shared container back in its arena slot; once it is a frame or a stack,
    /// its memo slot holds the id itself, saving BINGET a lookup.
    pub(super) fn settle(&mut self, h: u32, v: Value<'a>) {
        if let Value::Frame(_) | Value::Stack(_) = v {
            if let Some(copy) = v.cheap_copy() {
                self.set_memo(self.arena_memo[h as usize], copy);
            }
        }
        self.arena[h as usize] = v;
    }

    /// A shared container taken out of the arena (using it twice is refused: copying
    /// could multiply memory), anything else as is.
    pub(super) fn resolve(&mut self, v: Value<'a>) -> Value<'a> {
        match v {
            Value::Shared(h) => match &self.arena[h as usize] {
                Value::Frame(f) => Value::Frame(*f),
                Value::Stack(s) => Value::Stack(*s),
                _ => std::mem::replace(&mut self.arena[h as usize], Value::Taken),
            },
            v => v,
        }
    }

    /// The list the innermost MARK's APPENDS would extend, when nothing was pushed since
    /// that MARK and the list `holds` its kind of element or is still empty (owned on the
    /// stack or shared in the arena). Elements put there straight away end up where the
    /// APPENDS would put them.
    pub(super) fn list_below_mark(&mut self, holds: fn(&ListData<'a>) -> bool) -> Option<&mut ListData<'a>> {
        let mark = *self.marks.last()?;
        let floor = self.marks.len().checked_sub(2).map_or(0, |i| self.marks[i]);
        if mark <= floor || self.stack.len() != mark {
            return None;
        }
        let slot = match self.stack[mark - 1] {
            Value::Shared(h) => &mut self.arena[h as usize],
            _ => &mut self.stack[mark - 1],
        };
        match slot {
            Value::List(list) => match list {
                ListData::Values(s) if s.items.is_empty() => Some(list),
                list if holds(list) => Some(list),
                _ => None,
            },
            _ => None,
        }
    }

    /// Counts a key no record of this kind uses.
    pub(super) fn skip_key(&mut self, record: &'static str, key: &'a str) {
        *self.skipped_keys.entry((record, key)).or_default() += 1;
    }

    pub(super) fn intern_frame(
        &mut self,
        name: &'a str,
        filename: &'a str,
        line: i64,
    ) -> Result<FrameId, ReadError> {
        if let Some(&id) = self.frame_ids.get(&(name, filename, line)) {
            return Ok(id);
        }
        let id = FrameId::try_from(self.frames.len())
            .ok()
            .filter(|&id| id != NO_FRAME)
            .ok_or_else(|| malformed(self.at, "too many frames"))?;
        self.frames.push(Frame {
            name: name.to_owned(),
            filename: filename.to_owned(),
            line,
        });
        self.frame_ids.insert((name, filename, line), id);
        Ok(id)
    }

    pub(super) fn intern_stack(&mut self, mut ids: Vec<FrameId>) -> Result<StackId, ReadError> {
        self.stacks
            .intern(&mut ids)
            .ok_or_else(|| malformed(self.at, "too many stacks"))
    }
}

/// A memo slot's value as BINGET pushes it: converted shared records by value, saving a
/// lookup later.
#[inline(always)]
pub(super) fn memo_value<'a>(m: Memo<'a>, arena: &[Value<'a>]) -> Value<'a> {
    match m {
        Memo::Shared(h) => match &arena[h as usize] {
            Value::Frame(f) => Value::Frame(*f),
            Value::Stack(s) => Value::Stack(*s),
            _ => Value::Shared(h),
        },
        m => m.value(),
    }
}

/// The memo as the trace-entry fast path reads it, shared between threads: what the main
/// pass had defined (below `base`) and, on a thread decoding a stretch of a trace, what
/// that thread's own entries defined since (`local`, by memo slot). Anything else below
/// the entry is another thread's.
pub(super) struct MemoView<'v, 'a> {
    pub(super) refs: &'v MemoRefs,
    pub(super) memo: &'v [Memo<'a>],
    pub(super) memo_keys: &'v [Key],
    pub(super) memo_actions: &'v [Option<Action>],
    pub(super) memo_frames: &'v [FrameId],
    pub(super) arena: &'v [Value<'a>],
    pub(super) base: u32,
    pub(super) local: Option<&'v FastMap<usize, Memo<'a>>>,
    /// The reading thread's own cache of memo slots (`SlotCache`).
    pub(super) slots: &'v SlotCache,
}

impl<'a> MemoView<'_, 'a> {
    /// Memo index `idx`'s slot, if it is read back.
    #[inline(always)]
    pub(super) fn slot(&self, idx: u32) -> Option<usize> {
        self.slots.slot(self.refs, idx)
    }

    /// The frame memo index `idx` holds, from the main pass's memo; anything else
    /// (including an index out of range) is `None`.
    #[inline]
    pub(super) fn memo_frame(&self, idx: u32) -> Option<FrameId> {
        if idx >= self.base {
            return None;
        }
        let f = *self.memo_frames.get(self.slot(idx)?)?;
        (f != NO_FRAME).then_some(f)
    }

    /// A frame dict seen before, read back at `at`: its id and the BINGET's length.
    #[inline]
    pub(super) fn frame_at(&self, data: &[u8], at: usize) -> Option<(FrameId, usize)> {
        let (idx, len) = memo_ref(data.get(at..)?)?;
        Some((self.memo_frame(idx)?, len))
    }

    /// The frames read back by the BINGETs from `at` on, onto `ids`; where they end.
    pub(super) fn frame_refs(&self, data: &[u8], mut at: usize, ids: &mut Vec<FrameId>) -> usize {
        while let Some((f, len)) = self.frame_at(data, at) {
            ids.push(f);
            at += len;
        }
        at
    }
}
