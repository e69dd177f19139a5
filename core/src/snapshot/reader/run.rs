//! The main pass: runs the opcodes on the machine, building lists and dicts; a dict that
//! completes as a known record becomes that record at once.

use super::cursor::{check_proto, Op};
use super::error::{malformed, ReadError};
use super::fast_entry::FastScratch;
use super::hooks::{Hooks, ReadPass, TICK};
use super::keys::classify;
use super::op;
use super::prescan::memo_ref;
use super::value::{check_depth, seq_from, untype, EntryList, ListData, Seq, Value};
use super::vm::Vm;
use crate::snapshot::model::{Segment, TraceEntry};

/// How a run of the opcodes ended.
pub(super) enum Ran<'a> {
    /// At STOP, with the pickle's value.
    Done(Value<'a>),
    /// At the place it was told to stop.
    Stopped,
    /// A thread's work did not fit (`parallel`): the read must start again in order.
    Refit,
}

impl<'a> Vm<'a> {
    /// Runs the opcodes until STOP, or until the opcode at `stop`, where the pass that
    /// called it takes over (`parallel`).
    pub(super) fn run_to(&mut self, hooks: &mut Hooks<'_>, stop: usize) -> Result<Ran<'a>, ReadError> {
        let mut next_tick = self.cur.pos + TICK;
        // One test per opcode for both: a tick, or the place to stop.
        let mut next_check = next_tick.min(stop);
        // The fast path's buffers, reused from one trace entry to the next.
        let mut fast = FastScratch::remembering();
        loop {
            if self.cur.pos >= next_check {
                if self.cur.pos >= stop {
                    return Ok(Ran::Stopped);
                }
                let (segments, traces) = self.peek();
                hooks.tick(ReadPass::Decode, self.cur.data, (self.cur.pos, self.cur.pos), segments, traces);
                next_tick = self.cur.pos + TICK;
                next_check = next_tick.min(stop);
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
                    match self.fast_entry(&mut fast) {
                        // Into its trace's list: the rest of the trace may go to threads.
                        Some(true) if self.cur.pos >= self.parallel_from => {
                            if self.parallel_trace(hooks)?.is_err() {
                                return Ok(Ran::Refit);
                            }
                            next_check = next_check.min(self.cur.pos);
                            continue;
                        }
                        Some(_) => continue,
                        None => {}
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
                    return self.pop().map(Ran::Done);
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
                Op::Put(idx) => {
                    fast.forget();
                    self.put(idx)?
                }
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

    /// Fast path for the bulk of a snapshot, a stack written as `MARK BINGET... APPENDS`
    /// of already-seen frame dicts: collect frame ids straight from the bytes into the
    /// list, skipping the value stack. Anything else stops the run; what was collected
    /// is then pushed as ordinary values and decoding goes on as usual.
    pub(super) fn frame_run(&mut self) -> Result<(), ReadError> {
        let mut ids = std::mem::take(&mut self.frame_scratch);
        let data = self.cur.data;
        self.cur.pos = self.view().frame_refs(data, self.cur.pos, &mut ids);
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
