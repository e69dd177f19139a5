//! The pickle machine: a value stack, marks and memo for the data-only opcodes, whose
//! dicts become typed records as soon as they are complete.

use super::cursor::{check_proto, Cursor, Op};
use super::fast_entry::FastScratch;
use super::intern::{FastMap, StackTable, NO_FRAME};
use super::model::{Annotation, Block, Frame, FrameId, Segment, StackId, TraceEntry};
use super::op;
use super::prescan::{memo_get_check, memo_put, memo_ref, MemoRefs};
use super::schema::{classify, key_of, Key, KeyCache};
use super::{Hooks, ReadError, ReadPass, TICK};

/// Deeper generic nesting is refused: real snapshots nest 6 levels, and dropping a
/// pathologically deep tree would recurse.
pub(super) const MAX_DEPTH: u32 = 100;

/// Generic container contents with the nesting depth of what it owns.
#[derive(Clone, Debug, Default)]
pub(super) struct Seq<'a> {
    pub(super) items: Vec<Value<'a>>,
    pub(super) depth: u32,
}

/// A trace entry's `pool_id`, when it has one.
pub(super) type Pool = Option<(i64, i64)>;

/// A trace's entries and where their pool changes, as `Details::pools` keeps it.
#[derive(Clone, Debug, Default)]
pub(super) struct EntryList {
    pub(super) entries: Vec<TraceEntry>,
    /// (first entry, pool) at each change, from pool (0, 0) at the start.
    pub(super) pools: Vec<(u32, (i64, i64))>,
}

impl EntryList {
    pub(super) fn with_capacity(n: usize) -> Self {
        EntryList { entries: Vec::with_capacity(n), pools: Vec::new() }
    }

    /// Appends an entry (one without `pool_id` is in pool (0, 0)).
    pub(super) fn push(&mut self, e: TraceEntry, pool: Pool) {
        let p = pool.unwrap_or((0, 0));
        if self.pools.last().map_or((0, 0), |r| r.1) != p {
            self.pools.push((self.entries.len() as u32, p));
        }
        self.entries.push(e);
    }

    fn into_values<'a>(self) -> Vec<Value<'a>> {
        let mut runs = self.pools.into_iter().peekable();
        let mut pool = None;
        let entries = self.entries.into_iter().enumerate();
        entries
            .map(|(i, e)| {
                if let Some((_, p)) = runs.next_if(|r| r.0 as usize == i) {
                    pool = Some(p);
                }
                Value::Entry(Box::new((e, pool)))
            })
            .collect()
    }
}

/// A list, stored by element type once its elements are recognised records.
#[derive(Clone, Debug)]
pub(super) enum ListData<'a> {
    Values(Seq<'a>),
    Frames(Vec<FrameId>),
    Entries(EntryList),
    Blocks(Vec<Block>),
    Segments(Vec<Segment>),
    Annotations(Vec<Annotation>),
}

#[derive(Clone, Debug, Default)]
pub(super) enum Value<'a> {
    #[default]
    None,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(&'a str),
    Bytes(&'a [u8]),
    List(ListData<'a>),
    Tuple(Seq<'a>),
    /// Flat `[k0, v0, k1, v1, ...]`; later duplicates win, as in Python.
    Dict(Seq<'a>),
    /// A memoized container that is read back later: lives in `Vm::arena`.
    Shared(u32),
    Frame(FrameId),
    Stack(StackId),
    Entry(Box<(TraceEntry, Pool)>),
    /// A trace entry left out (an action this reader does not know), counted.
    Skipped,
    Block(Box<Block>),
    Segment(Box<Segment>),
    Annotation(Box<Annotation>),
    /// An arena slot whose value is being converted (a cycle if met again).
    Taken,
}

impl<'a> Value<'a> {
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "a bool",
            Value::Int(_) | Value::UInt(_) => "an integer",
            Value::Float(_) => "a float",
            Value::Str(_) => "a string",
            Value::Bytes(_) => "bytes",
            Value::List(_) | Value::Stack(_) => "a list",
            Value::Tuple(_) => "a tuple",
            Value::Dict(_) => "a dict",
            Value::Shared(_) => "a shared container",
            Value::Frame(_) => "a frame",
            Value::Entry(_) => "a trace entry",
            Value::Skipped => "a trace entry with an unknown action",
            Value::Block(_) => "a block",
            Value::Segment(_) => "a segment",
            Value::Annotation(_) => "an annotation",
            Value::Taken => "a container already used elsewhere (shared or recursive)",
        }
    }

    pub(super) fn depth(&self) -> u32 {
        match self {
            Value::List(ListData::Values(s)) | Value::Tuple(s) | Value::Dict(s) => s.depth + 1,
            Value::List(_) => 1,
            _ => 0,
        }
    }

    /// Values a memo slot can hold by copy; containers go to the arena instead.
    pub(super) fn cheap_copy(&self) -> Option<Memo<'a>> {
        Some(match self {
            Value::None => Memo::None,
            Value::Bool(b) => Memo::Bool(*b),
            Value::Int(i) => Memo::Int(*i),
            Value::UInt(u) => Memo::UInt(*u),
            Value::Float(f) => Memo::Float(*f),
            Value::Str(s) => Memo::Str(s),
            Value::Bytes(b) => Memo::Bytes(b),
            Value::Shared(h) => Memo::Shared(*h),
            Value::Frame(f) => Memo::Frame(*f),
            Value::Stack(s) => Memo::Stack(*s),
            _ => return None,
        })
    }
}

/// What a memo slot holds: the `Value`s that copy cheaply, as a small `Copy` type so
/// the millions of BINGETs copy 24 bytes and never run `Value`'s drop or clone.
#[derive(Clone, Copy, Debug, Default)]
pub(super) enum Memo<'a> {
    #[default]
    None,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(&'a str),
    Bytes(&'a [u8]),
    Shared(u32),
    Frame(FrameId),
    Stack(StackId),
}

impl<'a> Memo<'a> {
    #[inline]
    pub(super) fn value(self) -> Value<'a> {
        match self {
            Memo::None => Value::None,
            Memo::Bool(b) => Value::Bool(b),
            Memo::Int(i) => Value::Int(i),
            Memo::UInt(u) => Value::UInt(u),
            Memo::Float(f) => Value::Float(f),
            Memo::Str(s) => Value::Str(s),
            Memo::Bytes(b) => Value::Bytes(b),
            Memo::Shared(h) => Value::Shared(h),
            Memo::Frame(f) => Value::Frame(f),
            Memo::Stack(s) => Value::Stack(s),
        }
    }
}

pub(super) fn seq_from(items: Vec<Value<'_>>, at: usize) -> Result<Seq<'_>, ReadError> {
    let depth = items.iter().map(Value::depth).max().unwrap_or(0);
    check_depth(depth, at)?;
    Ok(Seq { items, depth })
}

pub(super) fn check_depth(depth: u32, at: usize) -> Result<(), ReadError> {
    if depth > MAX_DEPTH {
        return Err(ReadError::Malformed {
            offset: at,
            detail: format!("containers nested deeper than {MAX_DEPTH} levels"),
        });
    }
    Ok(())
}

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
    pub(super) memo_len: u32,
    pub(super) arena: Vec<Value<'a>>,
    /// The memo slot of each arena entry, to store converted frames/stacks there too.
    pub(super) arena_memo: Vec<usize>,
    pub(super) frames: Vec<Frame>,
    pub(super) frame_ids: FastMap<(&'a str, &'a str, i64), FrameId>,
    /// Entries' texts (`compile_context`, `user_metadata`), one shared copy of each,
    /// and the last few met by address (the same memoized string read back).
    pub(super) texts: FastMap<&'a str, std::sync::Arc<str>>,
    pub(super) recent_texts: [Option<(usize, usize, std::sync::Arc<str>)>; 8],
    pub(super) stacks: StackTable,
    pub(super) scratch: Vec<Value<'a>>,
    pub(super) frame_scratch: Vec<FrameId>,
    pub(super) fast_scratch: FastScratch<'a>,
    pub(super) keys: KeyCache,
    /// Keys no record uses, by (record, key), and entries of unknown actions, counted.
    pub(super) skipped_keys: FastMap<(&'static str, &'a str), u64>,
    pub(super) skipped_actions: FastMap<&'a str, u64>,
    /// `Details` as read: frames' FX keys, blocks' forward frames.
    pub(super) frame_fx: FastMap<FrameId, Vec<(String, String)>>,
    pub(super) forward_frames: Vec<(u64, StackId)>,
    /// Offset of the opcode being run, for error messages.
    pub(super) at: usize,
}

pub(super) fn malformed(offset: usize, detail: impl Into<String>) -> ReadError {
    ReadError::Malformed {
        offset,
        detail: detail.into(),
    }
}

impl<'a> Vm<'a> {
    pub(super) fn new(data: &'a [u8], refs: MemoRefs) -> Self {
        let memo = vec![Memo::None; refs.count()];
        let memo_frames = vec![NO_FRAME; refs.count()];
        let memo_keys = vec![Key::Other; refs.count()];
        Vm {
            cur: Cursor { data, pos: 0 },
            stack: Vec::with_capacity(4096),
            marks: Vec::with_capacity(64),
            refs,
            memo,
            memo_frames,
            memo_keys,
            memo_len: 0,
            arena: Vec::new(),
            arena_memo: Vec::new(),
            frames: Vec::new(),
            frame_ids: FastMap::default(),
            texts: FastMap::default(),
            recent_texts: Default::default(),
            stacks: StackTable::default(),
            scratch: Vec::new(),
            frame_scratch: Vec::new(),
            fast_scratch: FastScratch::default(),
            keys: KeyCache::new(),
            skipped_keys: FastMap::default(),
            skipped_actions: FastMap::default(),
            frame_fx: FastMap::default(),
            forward_frames: Vec::new(),
            at: 0,
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

    pub(super) fn run(&mut self, hooks: &mut Hooks<'_>) -> Result<Value<'a>, ReadError> {
        let mut next_tick = TICK;
        loop {
            if self.cur.pos >= next_tick {
                let (segments, traces) = self.peek();
                hooks.tick(ReadPass::Decode, self.cur.data, (self.cur.pos, self.cur.pos), segments, traces);
                next_tick = self.cur.pos + TICK;
            }
            // The opcodes that make up nearly all of a snapshot, run straight from the
            // bytes when complete; anything else (or a truncated one) is decoded fully.
            let at = self.cur.pos;
            self.at = at;
            let rest = &self.cur.data[at..];
            // Each arm pushes in place: a value handed on through a temporary stalls on
            // store forwarding.
            match rest {
                [op::BINGET | op::LONG_BINGET, ..] => {
                    if let Some((idx, len)) = memo_ref(rest) {
                        let slot = self.memo_slot(idx)?;
                        self.stack.push(self.memo_value(slot));
                        self.cur.pos += len;
                        continue;
                    }
                }
                [op::BININT1, i, ..] => {
                    self.stack.push(Value::Int(*i as i64));
                    self.cur.pos += 2;
                    continue;
                }
                [op::EMPTY_DICT, ..] => {
                    if self.fast_entry() {
                        continue;
                    }
                    self.stack.push(Value::Dict(Seq::default()));
                    self.cur.pos += 1;
                    continue;
                }
                [op::EMPTY_LIST, ..] => {
                    self.stack.push(Value::List(ListData::Values(Seq::default())));
                    self.cur.pos += 1;
                    continue;
                }
                [op::MEMOIZE, ..] => {
                    self.cur.pos += 1;
                    self.put(self.memo_len)?;
                    continue;
                }
                _ => {}
            }
            let (at, o) = self.cur.next()?;
            self.at = at;
            match o {
                Op::Proto(v) => check_proto(v, at)?,
                Op::Frame => {}
                Op::Stop => {
                    if !self.marks.is_empty() || self.stack.len() != 1 {
                        return Err(malformed(
                            at,
                            format!(
                                "STOP with {} values and {} marks on the stack, expected one value",
                                self.stack.len(),
                                self.marks.len()
                            ),
                        ));
                    }
                    return self.pop();
                }
                Op::Mark => {
                    self.marks.push(self.stack.len());
                    self.frame_run()?;
                }
                Op::Pop => {
                    if self.marks.last() == Some(&self.stack.len()) {
                        self.marks.pop();
                    } else {
                        self.pop()?;
                    }
                }
                Op::PopMark => {
                    let m = self.pop_mark()?;
                    self.stack.truncate(m);
                }
                Op::Dup => {
                    let top = self
                        .stack
                        .last()
                        .ok_or_else(|| malformed(at, "DUP on an empty stack"))?;
                    // Copying a container could multiply memory; no snapshot writer emits DUP.
                    let v = top.cheap_copy().ok_or_else(|| {
                        malformed(at, format!("DUP of {} is not supported", top.kind()))
                    })?;
                    self.stack.push(v.value());
                }
                Op::None => self.stack.push(Value::None),
                Op::Bool(b) => self.stack.push(Value::Bool(b)),
                Op::Int(i) => self.stack.push(Value::Int(i)),
                Op::UInt(u) => self.stack.push(Value::UInt(u)),
                Op::Float(f) => self.stack.push(Value::Float(f)),
                Op::Str(name, b) => {
                    let s = std::str::from_utf8(b)
                        .map_err(|_| malformed(at, format!("{name} text is not valid UTF-8")))?;
                    self.stack.push(Value::Str(s));
                }
                Op::Bytes(b) => self.stack.push(Value::Bytes(b)),
                Op::EmptyList => self
                    .stack
                    .push(Value::List(ListData::Values(Seq::default()))),
                Op::EmptyDict => self.stack.push(Value::Dict(Seq::default())),
                Op::EmptyTuple => self.stack.push(Value::Tuple(Seq::default())),
                Op::List => {
                    let m = self.pop_mark()?;
                    let mut list = ListData::Values(Seq::default());
                    let mut items = self.stack.split_off(m);
                    self.extend_list(&mut list, &mut items)?;
                    self.stack.push(Value::List(list));
                }
                Op::Tuple => {
                    let m = self.pop_mark()?;
                    let items = self.stack.split_off(m);
                    self.stack.push(Value::Tuple(seq_from(items, at)?));
                }
                Op::TupleN(n) => {
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + n {
                        return Err(malformed(
                            at,
                            format!("TUPLE{n} needs {n} values on the stack"),
                        ));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    self.stack.push(Value::Tuple(seq_from(items, at)?));
                }
                Op::Dict => {
                    let m = self.pop_mark()?;
                    let mut d = Value::Dict(Seq::default());
                    let mut pairs = self.stack.split_off(m);
                    self.set_items(&mut d, &mut pairs)?;
                    self.stack.push(d);
                }
                // APPEND and SETITEM add the last 1 or 2 values; APPENDS and SETITEMS
                // all those above the MARK.
                Op::Append => self.add_to_container(self.last_values(1), Self::append_items)?,
                Op::SetItem => self.add_to_container(self.last_values(2), Self::set_items)?,
                Op::Appends => {
                    let m = self.pop_mark()?;
                    self.add_to_container(m, Self::append_items)?;
                }
                Op::SetItems => {
                    let m = self.pop_mark()?;
                    self.add_to_container(m, Self::set_items)?;
                }
                Op::Memoize => {
                    let idx = self.memo_len;
                    self.put(idx)?;
                }
                Op::Put(idx) => self.put(idx)?,
                Op::Get(idx) => {
                    let v = self.memo_value(self.memo_slot(idx)?);
                    self.stack.push(v);
                }
            }
        }
    }

    /// The top-level `segments` and `device_traces` decoded so far. Until its SETITEMS,
    /// the top dict's keys and values lie on the stack above its MARK: `'segments'`,
    /// the segment list, `'device_traces'`, the outer list, then the per-device lists
    /// not yet appended to it, the last one growing. Other layouts show nothing here
    /// and are still read in full.
    pub(super) fn peek(&self) -> (Option<&[Segment]>, Vec<&[TraceEntry]>) {
        fn list<'v, 'a>(arena: &'v [Value<'a>], v: &'v Value<'a>) -> Option<&'v ListData<'a>> {
            match v {
                Value::List(l) => Some(l),
                Value::Shared(h) => match &arena[*h as usize] {
                    Value::List(l) => Some(l),
                    _ => None,
                },
                _ => None,
            }
        }
        // A device's trace so far: typed once its first batch is in, empty before.
        let trace = |v| match list(&self.arena, v)? {
            ListData::Entries(e) => Some(e.entries.as_slice()),
            ListData::Values(s) if s.items.is_empty() => Some(&[][..]),
            _ => None,
        };
        let list = |v| list(&self.arena, v);
        let mut segments = None;
        let mut traces = Vec::new();
        let Some(&base) = self.marks.first() else {
            return (segments, traces);
        };
        let items = &self.stack[base.min(self.stack.len())..];
        let mut i = 0;
        while let (Some(Value::Str(key)), Some(value)) = (items.get(i), items.get(i + 1)) {
            match *key {
                "segments" => {
                    // Complete once the next key follows it.
                    if let (Some(ListData::Segments(v)), Some(Value::Str(_))) =
                        (list(value), items.get(i + 2))
                    {
                        segments = Some(v.as_slice());
                    }
                }
                "device_traces" => {
                    if let Some(ListData::Values(outer)) = list(value) {
                        traces.extend(outer.items.iter().map_while(trace));
                    }
                    traces.extend(items[i + 2..].iter().map_while(trace));
                    break;
                }
                _ => {}
            }
            i += 2;
        }
        (segments, traces)
    }

    /// The memo slot BINGET `idx` reads. Checked apart from `memo_value`: a value returned
    /// inside a `Result` goes through memory and stalls on store forwarding every BINGET.
    #[inline(always)]
    pub(super) fn memo_slot(&self, idx: u32) -> Result<usize, ReadError> {
        memo_get_check(self.memo_len, idx, self.at)?;
        self.refs
            .slot(idx)
            .ok_or_else(|| malformed(self.at, "memo slot was not seen by the pre-scan"))
    }

    #[inline(always)]
    pub(super) fn memo_value(&self, slot: usize) -> Value<'a> {
        match self.memo[slot] {
            // Converted shared records are pushed by value: no lookup later.
            Memo::Shared(h) => match &self.arena[h as usize] {
                Value::Frame(f) => Value::Frame(*f),
                Value::Stack(s) => Value::Stack(*s),
                _ => Value::Shared(h),
            },
            m => m.value(),
        }
    }

    /// The frame a memo index holds once converted; anything else (including an index
    /// out of range) is `None` and left to the generic BINGET.
    #[inline]
    pub(super) fn memo_frame(&self, idx: u32) -> Option<FrameId> {
        if idx >= self.memo_len {
            return None;
        }
        let f = *self.memo_frames.get(self.refs.slot(idx)?)?;
        (f != NO_FRAME).then_some(f)
    }

    pub(super) fn set_memo(&mut self, slot: usize, m: Memo<'a>) {
        self.memo[slot] = m;
        self.memo_frames[slot] = match m {
            Memo::Frame(f) => f,
            _ => NO_FRAME,
        };
        self.memo_keys[slot] = match m {
            Memo::Str(s) => key_of(s),
            _ => Key::Other,
        };
    }

    /// Fast path for the bulk of a snapshot, a stack written as `MARK BINGET... APPENDS`
    /// of already-seen frame dicts: collect frame ids straight from the bytes into the
    /// list, skipping the value stack. Anything else stops the run; what was collected
    /// is then pushed as ordinary values and decoding goes on as usual.
    pub(super) fn frame_run(&mut self) -> Result<(), ReadError> {
        let mut ids = std::mem::take(&mut self.frame_scratch);
        let data = self.cur.data;
        self.cur.pos = self.frame_refs(self.cur.pos, &mut ids);
        let closes = !ids.is_empty() && data.get(self.cur.pos) == Some(&op::APPENDS);
        match self.list_below_mark(|l| matches!(l, ListData::Frames(_))).filter(|_| closes) {
            Some(list) => {
                match list {
                    ListData::Frames(v) => v.extend_from_slice(&ids),
                    list => *list = ListData::Frames(ids.clone()),
                }
                self.at = self.cur.pos;
                self.cur.pos += 1;
                self.marks.pop();
            }
            None => self.stack.extend(ids.iter().map(|&f| Value::Frame(f))),
        }
        ids.clear();
        self.frame_scratch = ids;
        Ok(())
    }

    /// A frame dict seen before, read back at `at`: its id and the BINGET's length.
    #[inline]
    pub(super) fn frame_at(&self, at: usize) -> Option<(FrameId, usize)> {
        let (idx, len) = memo_ref(self.cur.data.get(at..)?)?;
        Some((self.memo_frame(idx)?, len))
    }

    /// The frames read back by the BINGETs from `at` on, onto `ids`; where they end.
    pub(super) fn frame_refs(&self, mut at: usize, ids: &mut Vec<FrameId>) -> usize {
        while let Some((f, len)) = self.frame_at(at) {
            ids.push(f);
            at += len;
        }
        at
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

    /// Where the last `n` values on the stack begin (not below the innermost MARK).
    fn last_values(&self, n: usize) -> usize {
        let floor = self.marks.last().copied().unwrap_or(0);
        self.stack.len().saturating_sub(n).max(floor)
    }

    /// Move the values from stack index `from` up into the container just below them
    /// (resolving a shared handle to its arena slot). The values pass through a reused
    /// scratch buffer: no allocation per dict or list.
    pub(super) fn add_to_container(
        &mut self,
        from: usize,
        add: fn(&mut Self, &mut Value<'a>, &mut Vec<Value<'a>>) -> Result<(), ReadError>,
    ) -> Result<(), ReadError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if from == 0 || from - 1 < floor || from > self.stack.len() {
            return Err(malformed(
                self.at,
                "no container on the stack to add items to",
            ));
        }
        let mut items = std::mem::take(&mut self.scratch);
        items.extend(self.stack.drain(from..));
        let i = from - 1;
        let (mut target, shared) = match self.stack[i] {
            Value::Shared(h) => (
                std::mem::replace(&mut self.arena[h as usize], Value::Taken),
                Some(h),
            ),
            _ => (std::mem::take(&mut self.stack[i]), None),
        };
        let r = add(self, &mut target, &mut items);
        match shared {
            Some(h) => self.settle(h, target),
            None => self.stack[i] = target,
        }
        items.clear();
        self.scratch = items;
        r
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

    pub(super) fn append_items(
        &mut self,
        target: &mut Value<'a>,
        items: &mut Vec<Value<'a>>,
    ) -> Result<(), ReadError> {
        match target {
            Value::List(list) => self.extend_list(list, items),
            other => Err(malformed(
                self.at,
                format!("APPEND(S) target is {}, expected a list", other.kind()),
            )),
        }
    }

    pub(super) fn set_items(
        &mut self,
        d: &mut Value<'a>,
        pairs: &mut Vec<Value<'a>>,
    ) -> Result<(), ReadError> {
        if !pairs.len().is_multiple_of(2) {
            return Err(malformed(
                self.at,
                "SETITEMS with an odd number of keys and values",
            ));
        }
        let Value::Dict(seq) = d else {
            return Err(malformed(
                self.at,
                format!(
                    "SETITEM(S) target is {}, expected a dict that is still being built",
                    d.kind()
                ),
            ));
        };
        if seq.items.is_empty() {
            if let Some(kind) = classify(pairs, &self.keys) {
                *d = self.convert(kind, pairs)?;
                return Ok(());
            }
        }
        let depth = pairs.iter().map(Value::depth).max().unwrap_or(0);
        seq.depth = seq.depth.max(depth);
        check_depth(seq.depth + 1, self.at)?;
        seq.items.append(pairs);
        Ok(())
    }

    /// Resolve an item entering a list: shared converted frames by value, generic
    /// record dicts converted.
    pub(super) fn list_item(&mut self, item: Value<'a>) -> Result<Value<'a>, ReadError> {
        match item {
            Value::Shared(h) => Ok(match &self.arena[h as usize] {
                Value::Frame(f) => Value::Frame(*f),
                _ => Value::Shared(h),
            }),
            Value::Dict(mut seq) => match classify(&seq.items, &self.keys) {
                Some(kind) => self.convert(kind, &mut seq.items),
                None => Ok(Value::Dict(seq)),
            },
            v => Ok(v),
        }
    }

    pub(super) fn extend_list(
        &mut self,
        list: &mut ListData<'a>,
        items: &mut Vec<Value<'a>>,
    ) -> Result<(), ReadError> {
        let n = items.len();
        for item in items.drain(..) {
            let item = self.list_item(item)?;
            if let Value::Skipped = item {
                continue;
            }
            if let ListData::Values(seq) = list {
                if seq.items.is_empty() {
                    // The first element picks the typed representation.
                    match &item {
                        Value::Frame(_) => *list = ListData::Frames(Vec::with_capacity(n)),
                        Value::Entry(_) => *list = ListData::Entries(EntryList::with_capacity(n)),
                        Value::Block(_) => *list = ListData::Blocks(Vec::with_capacity(n)),
                        Value::Segment(_) => *list = ListData::Segments(Vec::with_capacity(n)),
                        Value::Annotation(_) => {
                            *list = ListData::Annotations(Vec::with_capacity(n))
                        }
                        _ => {}
                    }
                }
            }
            match (&mut *list, item) {
                (ListData::Frames(v), Value::Frame(f)) => v.push(f),
                (ListData::Entries(v), Value::Entry(e)) => v.push(e.0, e.1),
                (ListData::Blocks(v), Value::Block(b)) => v.push(*b),
                (ListData::Segments(v), Value::Segment(s)) => v.push(*s),
                (ListData::Annotations(v), Value::Annotation(a)) => v.push(*a),
                (ListData::Values(seq), item) => {
                    seq.depth = seq.depth.max(item.depth());
                    check_depth(seq.depth + 1, self.at)?;
                    seq.items.push(item);
                }
                (typed, item) => {
                    // Mixed element kinds: fall back to generic values.
                    let mut seq = Seq {
                        items: untype(std::mem::replace(typed, ListData::Frames(Vec::new()))),
                        depth: 1,
                    };
                    seq.items.push(item);
                    seq.depth = seq.items.iter().map(Value::depth).max().unwrap_or(0);
                    *typed = ListData::Values(seq);
                }
            }
        }
        Ok(())
    }
}

/// A typed list back to generic values (only for lists mixing element kinds).
pub(super) fn untype(list: ListData<'_>) -> Vec<Value<'_>> {
    match list {
        ListData::Values(s) => s.items,
        ListData::Frames(v) => v.into_iter().map(Value::Frame).collect(),
        ListData::Entries(v) => v.into_values(),
        ListData::Blocks(v) => v.into_iter().map(|b| Value::Block(Box::new(b))).collect(),
        ListData::Segments(v) => v.into_iter().map(|s| Value::Segment(Box::new(s))).collect(),
        ListData::Annotations(v) => v
            .into_iter()
            .map(|a| Value::Annotation(Box::new(a)))
            .collect(),
    }
}
