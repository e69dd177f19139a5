//! The fast path for the bulk of a snapshot: trace entry dicts read straight from the
//! bytes, frames included, whether shared through the memo (as PyTorch writes them) or
//! written out in each entry (a snapshot rewritten by a script).

use super::cursor::{long_value, Op};
use super::intern::NO_FRAME;
use super::keys::{action_of, Key};
use super::op;
use super::prescan::memo_ref;
use super::value::{EntryList, ListData, Memo, Pool, Value};
use super::vm::Vm;
use crate::snapshot::model::{FrameId, StackId, TraceEntry};

/// A trace entry's `frames` as `FastEntry` reads them: the frame ids collected, or a
/// stack already interned (a list read back by BINGET).
pub(super) enum FastFrames {
    Ids,
    Stack(StackId),
}

/// A frame dict written out in the entry: interned once the entry has been read.
#[derive(Clone, Copy)]
pub(super) struct NewFrame<'a> {
    /// Its place in the frame ids (a `NO_FRAME` placeholder until interned).
    at: usize,
    name: &'a str,
    filename: &'a str,
    line: i64,
    /// The memo slot it fills when read back later.
    slot: Option<usize>,
}

/// What `FastEntry` keeps aside until the entry is known to be read: the memo puts it
/// makes and the frames written out in it. Reused across entries.
#[derive(Default)]
pub(super) struct FastScratch<'a> {
    ids: Vec<FrameId>,
    /// Strings memoized within the entry and read back later: (memo slot, text).
    puts: Vec<(usize, &'a str)>,
    new_frames: Vec<NewFrame<'a>>,
}

/// Reads one trace entry dict straight from the bytes for `Vm::fast_entry`, changing
/// nothing in the VM: the memo puts it would make are kept aside (`scratch`,
/// `memo_len`). Every method returns `None` on anything it does not know.
pub(super) struct FastEntry<'v, 'a> {
    pub(super) vm: &'v Vm<'a>,
    pub(super) data: &'a [u8],
    pub(super) pos: usize,
    pub(super) memo_len: u32,
    pub(super) scratch: FastScratch<'a>,
}

impl<'a> FastEntry<'_, 'a> {
    pub(super) fn byte(&self) -> Option<u8> {
        self.data.get(self.pos).copied()
    }

    pub(super) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let b = self.data.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(b)
    }

    pub(super) fn fixed<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    /// A MEMOIZE here, if any; the memo slot it fills when that is read back later.
    pub(super) fn memoize(&mut self) -> Option<Option<usize>> {
        if self.byte() != Some(op::MEMOIZE) {
            return Some(None);
        }
        let idx = self.memo_len;
        self.memo_len = idx.checked_add(1)?;
        self.pos += 1;
        Some(self.vm.refs.slot(idx))
    }

    /// A dict key read back here (BINGET of a string memoized before the entry) that
    /// the reader knows.
    #[inline]
    fn known_key(&mut self) -> Option<Key> {
        let (idx, len) = memo_ref(&self.data[self.pos..])?;
        if idx >= self.vm.memo_len {
            return None;
        }
        let key = *self.vm.memo_keys.get(self.vm.refs.slot(idx)?)?;
        if key == Key::Other {
            return None;
        }
        self.pos += len;
        Some(key)
    }

    /// A BINGET here of a slot memoized within this entry: the memo slot.
    fn own_memo_ref(&self) -> Option<(usize, usize)> {
        let (idx, len) = memo_ref(&self.data[self.pos..])?;
        if idx < self.vm.memo_len || idx >= self.memo_len {
            return None;
        }
        Some((self.vm.refs.slot(idx)?, len))
    }

    pub(super) fn string(&mut self) -> Option<&'a str> {
        let text = match self.byte()? {
            op::SHORT_BINUNICODE => {
                self.pos += 1;
                let [n] = self.fixed()?;
                self.take(n as usize)?
            }
            op::BINUNICODE => {
                self.pos += 1;
                let n = u32::from_le_bytes(self.fixed()?);
                self.take(usize::try_from(n).ok()?)?
            }
            op::BINGET | op::LONG_BINGET => {
                let (idx, len) = memo_ref(&self.data[self.pos..])?;
                let s = if idx < self.vm.memo_len {
                    match self.vm.memo[self.vm.refs.slot(idx)?] {
                        Memo::Str(s) => s,
                        _ => return None,
                    }
                } else {
                    let (slot, _) = self.own_memo_ref()?;
                    self.scratch.puts.iter().find(|p| p.0 == slot)?.1
                };
                self.pos += len;
                return Some(s);
            }
            _ => return None,
        };
        let s = std::str::from_utf8(text).ok()?;
        if let Some(slot) = self.memoize()? {
            self.scratch.puts.push((slot, s));
        }
        Some(s)
    }

    /// A string or None.
    pub(super) fn opt_str(&mut self) -> Option<Option<&'a str>> {
        if self.byte()? == op::NONE {
            self.pos += 1;
            return Some(None);
        }
        Some(Some(self.string()?))
    }

    /// An integer or bool, as `Op` holds it.
    pub(super) fn int(&mut self) -> Option<Op<'static>> {
        let op = self.byte()?;
        self.pos += 1;
        Some(match op {
            op::BININT1 => Op::Int(self.fixed::<1>()?[0] as i64),
            op::BININT2 => Op::Int(u16::from_le_bytes(self.fixed()?) as i64),
            op::BININT => Op::Int(i32::from_le_bytes(self.fixed()?) as i64),
            op::LONG1 => {
                let [n] = self.fixed()?;
                long_value(self.take(n as usize)?)?
            }
            op::NEWTRUE => Op::Bool(true),
            op::NEWFALSE => Op::Bool(false),
            _ => return None,
        })
    }

    /// As `Vm::u64_field` takes it.
    pub(super) fn unsigned(&mut self) -> Option<u64> {
        match self.int()? {
            Op::Int(i) => u64::try_from(i).ok(),
            Op::UInt(u) => Some(u),
            _ => None,
        }
    }

    /// As `Vm::i64_field` takes it.
    pub(super) fn signed(&mut self) -> Option<i64> {
        match self.int()? {
            Op::Int(i) => Some(i),
            Op::Bool(b) => Some(b as i64),
            _ => None,
        }
    }

    /// `pool_id`, as `Vm::int_pair` takes it: two integers and TUPLE2 (memoized, never
    /// read back), or such a tuple read back.
    fn pool(&mut self) -> Option<(i64, i64)> {
        if let Some((idx, len)) = memo_ref(&self.data[self.pos..]) {
            if idx >= self.vm.memo_len {
                return None;
            }
            let Memo::Shared(h) = self.vm.memo[self.vm.refs.slot(idx)?] else { return None };
            let Value::Tuple(t) = &self.vm.arena[h as usize] else { return None };
            let [Value::Int(a), Value::Int(b)] = t.items.as_slice() else { return None };
            self.pos += len;
            return Some((*a, *b));
        }
        let pair = (self.signed()?, self.signed()?);
        if self.byte()? != op::TUPLE2 {
            return None;
        }
        self.pos += 1;
        match self.memoize()? {
            Some(_) => None, // read back later: a shared tuple, for the generic path
            None => Some(pair),
        }
    }

    /// A frame dict written out here, `EMPTY_DICT [MEMOIZE] MARK key value ... SETITEMS`
    /// with `name`, `filename` and `line` (in any order) and nothing else.
    fn new_frame(&mut self, ids: &mut Vec<FrameId>) -> Option<()> {
        if self.byte()? != op::EMPTY_DICT {
            return None;
        }
        self.pos += 1;
        let slot = self.memoize()?;
        if self.byte()? != op::MARK {
            return None;
        }
        self.pos += 1;
        let (mut name, mut filename, mut line) = (None, None, None);
        while self.byte()? != op::SETITEMS {
            let key = self.string()?;
            match self.vm.keys.get(key) {
                Key::Name => name = Some(self.string()?),
                Key::Filename => filename = Some(self.string()?),
                Key::Line => line = Some(self.signed()?),
                _ => return None,
            }
        }
        self.pos += 1;
        let frame = NewFrame { at: ids.len(), name: name?, filename: filename?, line: line?, slot };
        self.scratch.new_frames.push(frame);
        ids.push(NO_FRAME);
        Some(())
    }

    /// One frame of a list here: a frame dict seen before (BINGET), one written out here,
    /// or one written out earlier in this entry and read back. `None`, having read
    /// nothing, when there is no frame here.
    fn frame(&mut self, ids: &mut Vec<FrameId>) -> Option<()> {
        if let Some((f, len)) = self.vm.frame_at(self.pos) {
            ids.push(f);
            self.pos += len;
            return Some(());
        }
        if self.byte()? == op::EMPTY_DICT {
            return self.new_frame(ids);
        }
        let (slot, len) = self.own_memo_ref()?;
        let seen = *self.scratch.new_frames.iter().find(|f| f.slot == Some(slot))?;
        self.scratch.new_frames.push(NewFrame { at: ids.len(), slot: None, ..seen });
        ids.push(NO_FRAME);
        self.pos += len;
        Some(())
    }

    /// `frames`: None, a stack read back, or a new list of frames (as Python writes it:
    /// empty, one frame and APPEND, `MARK frame... APPENDS` batches).
    pub(super) fn frames(&mut self, ids: &mut Vec<FrameId>) -> Option<FastFrames> {
        ids.clear();
        match self.byte()? {
            op::NONE => {
                self.pos += 1;
                return Some(FastFrames::Ids);
            }
            op::BINGET | op::LONG_BINGET => {
                let (idx, len) = memo_ref(&self.data[self.pos..])?;
                if idx >= self.vm.memo_len {
                    return None;
                }
                let Value::Stack(s) = self.vm.memo_value(self.vm.refs.slot(idx)?) else {
                    return None;
                };
                self.pos += len;
                return Some(FastFrames::Stack(s));
            }
            op::EMPTY_LIST => self.pos += 1,
            _ => return None,
        }
        if self.memoize()?.is_some() {
            return None; // a list read back later is shared
        }
        loop {
            if self.byte()? == op::MARK {
                self.pos += 1;
                let before = ids.len();
                loop {
                    // Frames seen before run without a call per frame.
                    self.pos = self.vm.frame_refs(self.pos, ids);
                    if self.byte()? == op::APPENDS {
                        break;
                    }
                    self.frame(ids)?;
                }
                if ids.len() == before {
                    return None;
                }
                self.pos += 1;
                continue;
            }
            let at = self.pos;
            match self.frame(ids) {
                Some(()) if self.byte() == Some(op::APPEND) => self.pos += 1,
                None if self.pos == at => return Some(FastFrames::Ids), // the list has ended
                _ => return None,
            }
        }
    }

    /// `EMPTY_DICT [MEMOIZE] MARK key value ... SETITEMS` of entry keys only, as
    /// `Vm::entry_from` reads them (the last of a repeated key wins); `frames` and the
    /// shared texts are left for the caller.
    pub(super) fn entry(&mut self, ids: &mut Vec<FrameId>) -> Option<FastRead<'a>> {
        if self.byte()? != op::EMPTY_DICT {
            return None;
        }
        self.pos += 1;
        if self.memoize()?.is_some() || self.byte()? != op::MARK {
            return None; // a dict read back later is shared; one pair is a SETITEM
        }
        self.pos += 1;
        let (mut action, mut addr, mut size, mut stream, mut time_us) = (None, None, None, 0, 0);
        let mut frames = FastFrames::Ids;
        let (mut category, mut compile_context, mut user_metadata, mut pool) = (None, None, None, None);
        while self.byte()? != op::SETITEMS {
            let key = match self.known_key() {
                Some(k) => k,
                None => self.vm.keys.get(self.string()?),
            };
            match key {
                Key::Action => action = Some(action_of(self.string()?)?),
                Key::Addr | Key::DeviceFree => addr = Some(self.unsigned()?),
                Key::Size => size = Some(self.unsigned()?),
                Key::Stream => stream = self.signed()?,
                Key::TimeUs => time_us = self.signed()?,
                Key::Frames => frames = self.frames(ids)?,
                Key::Category => category = self.opt_str()?,
                Key::CompileContext => compile_context = self.opt_str()?,
                Key::UserMetadata => user_metadata = self.opt_str()?,
                Key::PoolId => pool = Some(self.pool()?),
                _ => return None,
            }
        }
        self.pos += 1;
        let entry = TraceEntry {
            action: action?,
            addr: addr?,
            size: size?,
            stream,
            time_us,
            frames: 0,
            category: None,
            compile_context: None,
            user_metadata: None,
        };
        Some(FastRead { entry, frames, pool, category, compile_context, user_metadata })
    }
}

/// A trace entry `FastEntry` read, before its stack and texts are interned.
pub(super) struct FastRead<'a> {
    entry: TraceEntry,
    frames: FastFrames,
    pool: Pool,
    category: Option<&'a str>,
    compile_context: Option<&'a str>,
    user_metadata: Option<&'a str>,
}

impl<'a> Vm<'a> {
    /// Fast path for the bulk of a snapshot, a trace entry at `EMPTY_DICT`: read straight
    /// from the bytes into the `Value::Entry` the generic path would build at its
    /// SETITEMS, with the same memo puts. Anything unusual (a key or value form it does
    /// not know, a dict or list read back later, a FRAME opcode inside) leaves the VM as
    /// it was and returns false, for the generic path to decode.
    pub(super) fn fast_entry(&mut self, fast: &mut FastScratch<'a>) -> bool {
        let mut scratch = std::mem::take(fast);
        let mut ids = std::mem::take(&mut scratch.ids);
        scratch.puts.clear();
        scratch.new_frames.clear();
        let mut p = FastEntry { vm: self, data: self.cur.data, pos: self.cur.pos, memo_len: self.memo_len, scratch };
        let read = p.entry(&mut ids);
        let (pos, memo_len, mut scratch) = (p.pos, p.memo_len, p.scratch);
        let done = read.is_some_and(|FastRead { mut entry, frames, pool, category, compile_context, user_metadata }| {
            let stack = match frames {
                FastFrames::Stack(s) => Some(s),
                FastFrames::Ids if self.intern_new_frames(&scratch.new_frames, &mut ids) => self.stacks.intern(&mut ids),
                FastFrames::Ids => None,
            };
            let Some(s) = stack else { return false };
            entry.frames = s;
            entry.category = category.map(|t| self.shared_text(t));
            entry.compile_context = compile_context.map(|t| self.shared_text(t));
            entry.user_metadata = user_metadata.map(|t| self.shared_text(t));
            for &(slot, text) in &scratch.puts {
                self.set_memo(slot, Memo::Str(text));
            }
            self.memo_len = memo_len;
            self.cur.pos = pos;
            // Inside a trace's `MARK ... APPENDS` batch the entry goes straight into the
            // list: no box, no second move.
            match self.list_below_mark(|l| matches!(l, ListData::Entries(_))) {
                Some(list) => {
                    if !matches!(list, ListData::Entries(_)) {
                        *list = ListData::Entries(EntryList::with_capacity(1000));
                    }
                    if let ListData::Entries(entries) = list {
                        entries.push(entry, pool);
                    }
                }
                None => self.stack.push(Value::Entry(Box::new((entry, pool)))),
            }
            true
        });
        ids.clear();
        scratch.ids = ids;
        *fast = scratch;
        done
    }

    /// Interns the frames an entry wrote out, into their places in `ids` and their memo
    /// slots; false when the frame table is full (the generic path then says so).
    fn intern_new_frames(&mut self, new: &[NewFrame<'a>], ids: &mut [FrameId]) -> bool {
        for f in new {
            let Ok(id) = self.intern_frame(f.name, f.filename, f.line) else { return false };
            ids[f.at] = id;
            if let Some(slot) = f.slot {
                self.set_memo(slot, Memo::Frame(id));
            }
        }
        true
    }
}
