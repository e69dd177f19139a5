//! The fast path for the bulk of a snapshot: trace entry dicts read straight from the
//! bytes, frames included, whether shared through the memo (as PyTorch writes them) or
//! written out in each entry (a snapshot rewritten by a script).

use super::cursor::{long_value, sign_extended, Op};
use super::intern::NO_FRAME;
use super::keys::{action_of, Key, KeyCache};
use super::op;
use super::prescan::memo_ref;
use super::value::{EntryList, ListData, Memo, Pool, Value};
use super::vm::{memo_value, MemoView, Vm};
use crate::snapshot::model::{Action, FrameId, StackId, Text, TraceEntry};

/// A trace entry's `frames` as `FastEntry` reads them: the frame ids collected, a stack
/// already interned (a list read back by BINGET), or a list another thread read (its
/// memo index, looked up once that thread's work is in).
pub(super) enum FastFrames {
    Ids,
    Stack(StackId),
    Elsewhere(u32),
}

/// An integer field as `FastEntry` reads it (`Op`'s integer and bool forms).
#[derive(Clone, Copy)]
enum Num {
    Int(i64),
    UInt(u64),
    Bool(bool),
}

/// A text field as `FastEntry` reads it: the text, or a string another thread read (its
/// memo index).
#[derive(Clone, Copy)]
pub(super) enum TextAt<'a> {
    Str(&'a str),
    Elsewhere(u32),
}

/// Where a memo index read back from inside an entry was defined.
enum Defined<'a> {
    /// By the main pass, or by this thread before the entry.
    Known(Memo<'a>),
    /// By another thread, before the entry.
    Elsewhere,
    /// Within the entry: its memo slot.
    Own(usize),
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
    /// The keys and texts read back so far (`Seen`).
    seen: Option<Box<Seen<'a>>>,
}

/// The entries of a trace read their keys and their repeated texts (`compile_context`,
/// `user_metadata`) back from the same few memo indices: those met last, by a hash of
/// their index, so the next entry's is one comparison, not a slot's lookup (issue 29: a
/// seventh of the read's instructions on PyTorch's snapshots went to keys alone). Only
/// indices below the memo's length where the entry began, where only a PUT can give one
/// another value: whoever runs a PUT forgets them (`forget`).
pub(super) struct Seen<'a> {
    keys: [(u32, Key); 64],
    texts: [(u32, &'a str); 16],
}

impl Default for Seen<'_> {
    fn default() -> Self {
        // An index of u32::MAX is never read back.
        Seen { keys: [(u32::MAX, Key::Other); 64], texts: [(u32::MAX, ""); 16] }
    }
}

/// The place of memo index `idx` in a table of `2^bits`.
#[inline(always)]
fn seen_at(idx: u32, bits: u32) -> usize {
    (idx.wrapping_mul(0x9e37_79b1) >> (32 - bits)) as usize
}

impl FastScratch<'_> {
    /// Buffers that remember the keys and texts met (`Seen`).
    pub(super) fn remembering() -> Self {
        FastScratch { seen: Some(Box::default()), ..FastScratch::default() }
    }

    /// After a PUT: an index may hold another text now.
    pub(super) fn forget(&mut self) {
        if let Some(k) = &mut self.seen {
            **k = Seen::default();
        }
    }

    /// Ready for the next entry.
    pub(super) fn reset(&mut self) {
        self.puts.clear();
        self.new_frames.clear();
    }
}

/// Reads one trace entry dict straight from the bytes for `Vm::fast_entry` and for the
/// threads that decode a trace (`parallel`), changing nothing outside it: the memo puts
/// it would make are kept aside (`scratch`, `memo_len`). Every method returns `None` on
/// anything it does not know.
pub(super) struct FastEntry<'v, 'a> {
    pub(super) view: &'v MemoView<'v, 'a>,
    pub(super) keys: &'v KeyCache,
    pub(super) data: &'a [u8],
    pub(super) pos: usize,
    /// The memo's length where the entry begins, and as its puts go on.
    pub(super) entry_memo: u32,
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
        Some(self.view.refs.slot(idx))
    }

    /// Where memo index `idx`, read back inside the entry, was defined; `None` when it
    /// was not yet, or is never read back (the pre-scan would have seen it).
    #[inline(always)]
    fn defined(&self, idx: u32) -> Option<Defined<'a>> {
        let slot = self.view.slot(idx)?;
        if idx < self.view.base {
            return Some(Defined::Known(self.view.memo[slot]));
        }
        if idx >= self.memo_len {
            return None;
        }
        Some(if idx >= self.entry_memo {
            Defined::Own(slot)
        } else {
            match self.view.local.and_then(|l| l.get(&slot)) {
                Some(m) => Defined::Known(*m),
                None => Defined::Elsewhere,
            }
        })
    }

    /// A dict key read back here (BINGET of a string memoized before the entry) that
    /// the reader knows.
    #[inline(always)]
    fn known_key(&mut self) -> Option<Key> {
        let (idx, len) = memo_ref(&self.data[self.pos..])?;
        let seen = self.scratch.seen.as_mut().map(|k| &mut k.keys[seen_at(idx, 6)]);
        if let Some(&(i, key)) = seen.as_deref() {
            if i == idx {
                self.pos += len;
                return Some(key);
            }
        }
        if idx >= self.view.base {
            return None;
        }
        let key = *self.view.memo_keys.get(self.view.slot(idx)?)?;
        if key == Key::Other {
            return None;
        }
        if let Some(seen) = seen {
            *seen = (idx, key);
        }
        self.pos += len;
        Some(key)
    }

    /// `action`: a string read back that the main pass knows names one (by one load), or
    /// any string naming one.
    #[inline]
    fn action(&mut self) -> Option<Action> {
        if let Some((idx, len)) = memo_ref(&self.data[self.pos..]) {
            if idx < self.view.base {
                if let Some(a) = *self.view.memo_actions.get(self.view.slot(idx)?)? {
                    self.pos += len;
                    return Some(a);
                }
            }
        }
        action_of(self.string()?)
    }

    /// A BINGET here of a slot memoized within this entry: the memo slot.
    fn own_memo_ref(&self) -> Option<(usize, usize)> {
        let (idx, len) = memo_ref(&self.data[self.pos..])?;
        match self.defined(idx)? {
            Defined::Own(slot) => Some((slot, len)),
            _ => None,
        }
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
                let TextAt::Str(s) = self.memo_text(idx)? else { return None };
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

    /// The string memo index `idx` holds, read back here.
    #[inline(always)]
    fn memo_text(&mut self, idx: u32) -> Option<TextAt<'a>> {
        let seen = self.scratch.seen.as_mut().map(|k| &mut k.texts[seen_at(idx, 4)]);
        if let Some(&(i, s)) = seen.as_deref() {
            if i == idx {
                return Some(TextAt::Str(s));
            }
        }
        Some(match self.defined(idx)? {
            Defined::Known(Memo::Str(s)) => {
                if let Some(seen) = self.scratch.seen.as_mut().filter(|_| idx < self.view.base) {
                    seen.texts[seen_at(idx, 4)] = (idx, s);
                }
                TextAt::Str(s)
            }
            Defined::Own(slot) => TextAt::Str(self.scratch.puts.iter().find(|p| p.0 == slot)?.1),
            Defined::Elsewhere => TextAt::Elsewhere(idx),
            Defined::Known(_) => return None,
        })
    }

    /// A text field: a string (perhaps one another thread read) or None.
    fn text(&mut self) -> Option<Option<TextAt<'a>>> {
        if self.byte()? == op::NONE {
            self.pos += 1;
            return Some(None);
        }
        if let Some((idx, len)) = memo_ref(&self.data[self.pos..]) {
            let text = self.memo_text(idx)?;
            self.pos += len;
            return Some(Some(text));
        }
        Some(Some(TextAt::Str(self.string()?)))
    }

    /// An integer or bool, as `Op` holds them: returned in registers, where an `Op` went
    /// through memory at every entry's address, size, stream and time.
    #[inline(always)]
    fn int(&mut self) -> Option<Num> {
        let op = self.byte()?;
        self.pos += 1;
        Some(match op {
            op::BININT1 => Num::Int(self.fixed::<1>()?[0] as i64),
            op::BININT2 => Num::Int(u16::from_le_bytes(self.fixed()?) as i64),
            op::BININT => Num::Int(i32::from_le_bytes(self.fixed()?) as i64),
            op::LONG1 => {
                let [n] = self.fixed()?;
                // Addresses and times, up to 8 bytes: read as one word where the input has
                // 8 bytes here, the bytes past the number shifted out.
                match (n, self.data.get(self.pos..self.pos + 8)) {
                    (1..=8, Some(word)) => {
                        self.pos += n as usize;
                        Num::Int(sign_extended(word.try_into().ok()?, n as usize))
                    }
                    _ => match long_value(self.take(n as usize)?)? {
                        Op::Int(i) => Num::Int(i),
                        Op::UInt(u) => Num::UInt(u),
                        _ => return None,
                    },
                }
            }
            op::NEWTRUE => Num::Bool(true),
            op::NEWFALSE => Num::Bool(false),
            _ => return None,
        })
    }

    /// As `Vm::u64_field` takes it.
    #[inline(always)]
    pub(super) fn unsigned(&mut self) -> Option<u64> {
        match self.int()? {
            Num::Int(i) => u64::try_from(i).ok(),
            Num::UInt(u) => Some(u),
            Num::Bool(_) => None,
        }
    }

    /// As `Vm::i64_field` takes it.
    #[inline(always)]
    pub(super) fn signed(&mut self) -> Option<i64> {
        match self.int()? {
            Num::Int(i) => Some(i),
            Num::Bool(b) => Some(b as i64),
            Num::UInt(_) => None,
        }
    }

    /// `pool_id`, as `Vm::int_pair` takes it: two integers and TUPLE2 (memoized, never
    /// read back), or such a tuple read back.
    fn pool(&mut self) -> Option<(i64, i64)> {
        if let Some((idx, len)) = memo_ref(&self.data[self.pos..]) {
            if idx >= self.view.base {
                return None;
            }
            let Memo::Shared(h) = self.view.memo[self.view.slot(idx)?] else { return None };
            let Value::Tuple(t) = &self.view.arena[h as usize] else { return None };
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
            match self.keys.get(key) {
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
        if let Some((f, len)) = self.view.frame_at(self.data, self.pos) {
            ids.push(f);
            self.pos += len;
            return Some(());
        }
        if self.byte()? == op::EMPTY_DICT {
            return self.new_frame(ids);
        }
        // A frame this thread read in an earlier entry.
        if let Some((idx, len)) = memo_ref(&self.data[self.pos..]) {
            if let Defined::Known(Memo::Frame(f)) = self.defined(idx)? {
                ids.push(f);
                self.pos += len;
                return Some(());
            }
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
                let frames = match self.defined(idx)? {
                    Defined::Known(m) => match memo_value(m, self.view.arena) {
                        Value::Stack(s) => FastFrames::Stack(s),
                        _ => return None,
                    },
                    Defined::Elsewhere => FastFrames::Elsewhere(idx),
                    Defined::Own(_) => return None,
                };
                self.pos += len;
                return Some(frames);
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
                    self.pos = self.view.frame_refs(self.data, self.pos, ids);
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
    #[inline(always)]
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
                None => self.keys.get(self.string()?),
            };
            match key {
                Key::Action => action = Some(self.action()?),
                Key::Addr | Key::DeviceFree => addr = Some(self.unsigned()?),
                Key::Size => size = Some(self.unsigned()?),
                Key::Stream => stream = self.signed()?,
                Key::TimeUs => time_us = self.signed()?,
                Key::Frames => frames = self.frames(ids)?,
                Key::Category => category = self.text()?,
                Key::CompileContext => compile_context = self.text()?,
                Key::UserMetadata => user_metadata = self.text()?,
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
        Some(FastRead { entry, frames, pool, texts: [category, compile_context, user_metadata] })
    }
}

/// A trace entry `FastEntry` read, before its stack and texts are interned.
pub(super) struct FastRead<'a> {
    pub(super) entry: TraceEntry,
    pub(super) frames: FastFrames,
    pub(super) pool: Pool,
    /// `category`, `compile_context` and `user_metadata`.
    pub(super) texts: [Option<TextAt<'a>>; 3],
}

/// Where a read entry's frames, stacks and texts are interned and its memo puts kept: the
/// main pass's tables, or a thread's own (`parallel`).
pub(super) trait Tables<'a> {
    fn frame(&mut self, name: &'a str, filename: &'a str, line: i64) -> Option<FrameId>;
    fn stack(&mut self, ids: &mut Vec<FrameId>) -> Option<StackId>;
    fn text(&mut self, s: &'a str) -> Text;
    fn put(&mut self, slot: usize, m: Memo<'a>);
}

/// What of an entry another thread read: its stack's memo index and its texts'
/// (`category`, `compile_context`, `user_metadata`). The entry holds placeholders there.
#[derive(Default)]
pub(super) struct Elsewhere {
    pub(super) frames: Option<u32>,
    pub(super) texts: [Option<u32>; 3],
}

impl Elsewhere {
    pub(super) fn any(&self) -> bool {
        self.frames.is_some() || self.texts.iter().any(Option::is_some)
    }
}

impl<'a> FastRead<'a> {
    /// The entry, its frames and texts interned into `t` and its memo puts made there;
    /// `None` when a table is full (the generic path then says so).
    #[inline(always)]
    pub(super) fn finish(self, scratch: &FastScratch<'a>, ids: &mut Vec<FrameId>, t: &mut impl Tables<'a>) -> Option<(TraceEntry, Pool, Elsewhere)> {
        let FastRead { mut entry, frames, pool, texts } = self;
        let mut elsewhere = Elsewhere::default();
        entry.frames = match frames {
            FastFrames::Stack(s) => s,
            FastFrames::Elsewhere(idx) => {
                elsewhere.frames = Some(idx);
                0
            }
            FastFrames::Ids => {
                for f in &scratch.new_frames {
                    let id = t.frame(f.name, f.filename, f.line)?;
                    ids[f.at] = id;
                    if let Some(slot) = f.slot {
                        t.put(slot, Memo::Frame(id));
                    }
                }
                t.stack(ids)?
            }
        };
        let mut text = |i: usize| match texts[i] {
            Some(TextAt::Str(s)) => Some(t.text(s)),
            Some(TextAt::Elsewhere(idx)) => {
                elsewhere.texts[i] = Some(idx);
                None
            }
            None => None,
        };
        (entry.category, entry.compile_context, entry.user_metadata) = (text(0), text(1), text(2));
        for &(slot, text) in &scratch.puts {
            t.put(slot, Memo::Str(text));
        }
        Some((entry, pool, elsewhere))
    }
}

impl<'a> Tables<'a> for Vm<'a> {
    fn frame(&mut self, name: &'a str, filename: &'a str, line: i64) -> Option<FrameId> {
        self.intern_frame(name, filename, line).ok()
    }
    fn stack(&mut self, ids: &mut Vec<FrameId>) -> Option<StackId> {
        self.stacks.intern(ids)
    }
    fn text(&mut self, s: &'a str) -> Text {
        self.texts.get(s)
    }
    fn put(&mut self, slot: usize, m: Memo<'a>) {
        self.set_memo(slot, m);
    }
}

impl<'a> Vm<'a> {
    /// Fast path for the bulk of a snapshot, a trace entry at `EMPTY_DICT`: read straight
    /// from the bytes into the `Value::Entry` the generic path would build at its
    /// SETITEMS, with the same memo puts. Anything unusual (a key or value form it does
    /// not know, a dict or list read back later, a FRAME opcode inside) leaves the VM as
    /// it was and returns false, for the generic path to decode. Returns whether the entry
    /// went straight into its trace's list.
    pub(super) fn fast_entry(&mut self, fast: &mut FastScratch<'a>) -> Option<bool> {
        let mut scratch = std::mem::take(fast);
        let mut ids = std::mem::take(&mut scratch.ids);
        scratch.reset();
        let view = self.view();
        let mut p = FastEntry { view: &view, keys: &self.keys, data: self.cur.data, pos: self.cur.pos, entry_memo: self.memo_len, memo_len: self.memo_len, scratch };
        let read = p.entry(&mut ids);
        let (pos, memo_len, scratch) = (p.pos, p.memo_len, p.scratch);
        let done = read.and_then(|read| read.finish(&scratch, &mut ids, self)).map(|(entry, pool, _)| {
            self.memo_len = memo_len;
            self.cur.pos = pos;
            self.push_entry(entry, pool)
        });
        ids.clear();
        *fast = FastScratch { ids, ..scratch };
        done
    }

    /// Puts an entry where the generic path's APPENDS would: inside a trace's
    /// `MARK ... APPENDS` batch straight into the list (no box, no second move), else on
    /// the stack. Returns whether it went into the list.
    pub(super) fn push_entry(&mut self, entry: TraceEntry, pool: Pool) -> bool {
        match self.list_below_mark(|l| matches!(l, ListData::Entries(_))) {
            Some(list) => {
                if !matches!(list, ListData::Entries(_)) {
                    *list = ListData::Entries(EntryList::with_capacity(1000));
                }
                if let ListData::Entries(entries) = list {
                    entries.push(entry, pool);
                }
                true
            }
            None => {
                self.stack.push(Value::Entry(Box::new((entry, pool))));
                false
            }
        }
    }
}
