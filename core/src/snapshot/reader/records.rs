//! Dicts into the snapshot's records (trace entry, block, segment, frame, annotation), key
//! by key, and lists of them whatever form they were read in.


use super::error::ReadError;
use super::keys::{action_of, classify, Key, Kind};
use super::value::{untype, ListData, Pool, Value};
use super::vm::Vm;
use crate::snapshot::model::{
    Action, Annotation, AnnotationStage, Block, BlockState, FrameId, Segment, SegmentType, StackId, Text, TraceEntry,
};

/// The record names errors and skip counts use.
pub(super) const ENTRY: &str = "trace entry";
const BLOCK: &str = "block";
const SEGMENT: &str = "segment";
const FRAME: &str = "frame";
const ANNOTATION: &str = "annotation";

/// A block's address before its segment places it (PyTorch 2.0 wrote none).
const UNPLACED: u64 = u64::MAX;

/// "keys [a, b, c]" of a dict, for messages about a dict that is not the record expected.
pub(super) fn key_list(pairs: &[Value<'_>]) -> String {
    const SHOWN: usize = 8;
    let keys: Vec<String> = pairs
        .iter()
        .step_by(2)
        .map(|k| match k {
            Value::Str(s) => s.to_string(),
            other => format!("<{}>", other.kind()),
        })
        .collect();
    let more = keys.len().saturating_sub(SHOWN);
    let mut s = keys.into_iter().take(SHOWN).collect::<Vec<_>>().join(", ");
    if more > 0 {
        s += &format!(", and {more} more");
    }
    format!("keys [{s}]")
}

impl<'a> Vm<'a> {
    pub(super) fn convert(&mut self, kind: Kind, pairs: &mut [Value<'a>]) -> Result<Value<'a>, ReadError> {
        match kind {
            Kind::Frame => self.frame_from(pairs).map(Value::Frame),
            Kind::Entry => Ok(match self.entry_from(pairs)? {
                Some(e) => Value::Entry(Box::new(e)),
                None => Value::Skipped,
            }),
            Kind::Block => self.block_from(pairs).map(|b| Value::Block(Box::new(b))),
            Kind::Segment => self
                .segment_from(pairs)
                .map(|s| Value::Segment(Box::new(s))),
            Kind::Annotation => self
                .annotation_from(pairs)
                .map(|a| Value::Annotation(Box::new(a))),
        }
    }

    pub(super) fn frame_from(&mut self, pairs: &mut [Value<'a>]) -> Result<FrameId, ReadError> {
        let (mut name, mut filename, mut line) = (None, None, None);
        let mut fx: Vec<(String, String)> = Vec::new();
        for kv in pairs.chunks_exact_mut(2) {
            let Value::Str(k) = kv[0] else { continue };
            match self.keys.get(k) {
                Key::Name => name = Some(self.str_field(FRAME, k, &kv[1])?),
                Key::Filename => filename = Some(self.str_field(FRAME, k, &kv[1])?),
                Key::Line => line = Some(self.i64_field(FRAME, k, &kv[1])?),
                _ => match &kv[1] {
                    // FX debug keys (`augment_with_fx_traces`) are text.
                    Value::Str(v) if k.starts_with("fx_") => fx.push((k.to_owned(), v.to_string())),
                    _ => self.skip_key(FRAME, k),
                },
            }
        }
        let (Some(name), Some(filename), Some(line)) = (name, filename, line) else {
            return Err(self.schema(FRAME, "needs `name`, `filename` and `line`".into()));
        };
        let id = self.intern_frame(name, filename, line)?;
        // FX keys follow from the file and line, so a frame seen again has the same ones.
        if !fx.is_empty() {
            self.frame_fx.entry(id).or_insert(fx);
        }
        Ok(id)
    }

    /// A `frames` value as an interned stack.
    pub(super) fn stack_field(&mut self, what: &str, v: &mut Value<'a>) -> Result<StackId, ReadError> {
        match std::mem::take(v) {
            Value::Stack(id) => Ok(id),
            Value::None => self.intern_stack(Vec::new()),
            Value::List(ListData::Frames(ids)) => self.intern_stack(ids),
            Value::List(ListData::Values(seq)) => {
                let mut ids = Vec::with_capacity(seq.items.len());
                for item in seq.items {
                    ids.push(self.frame_item(what, item)?);
                }
                self.intern_stack(ids)
            }
            Value::Shared(h) => {
                let slot = std::mem::replace(&mut self.arena[h as usize], Value::Taken);
                let mut inner = match slot {
                    Value::Taken => {
                        return Err(self.schema(what, "`frames` refers to itself".into()))
                    }
                    Value::Shared(_) => {
                        return Err(self.schema(what, "`frames` is a nested reference".into()))
                    }
                    other => other,
                };
                let r = self.stack_field(what, &mut inner);
                // Keep the converted stack so each later BINGET of this list is free.
                let settled = match r {
                    Ok(id) => Value::Stack(id),
                    Err(_) => inner,
                };
                self.settle(h, settled);
                r
            }
            other => Err(self.schema(
                what,
                format!("`frames` is {}, expected a list", other.kind()),
            )),
        }
    }

    pub(super) fn frame_item(&mut self, what: &str, item: Value<'a>) -> Result<FrameId, ReadError> {
        match item {
            Value::Frame(f) => Ok(f),
            Value::Dict(mut seq) => self.frame_from(&mut seq.items),
            Value::Shared(h) => {
                match std::mem::replace(&mut self.arena[h as usize], Value::Taken) {
                    Value::Dict(mut seq) => {
                        let id = self.frame_from(&mut seq.items)?;
                        self.settle(h, Value::Frame(id));
                        Ok(id)
                    }
                    Value::Frame(f) => {
                        self.arena[h as usize] = Value::Frame(f);
                        Ok(f)
                    }
                    other => Err(self.schema(
                        what,
                        format!("a frame is {}, expected a dict", other.kind()),
                    )),
                }
            }
            other => Err(self.schema(
                what,
                format!("a frame is {}, expected a dict", other.kind()),
            )),
        }
    }

    pub(super) fn str_field(&self, what: &str, key: &str, v: &Value<'a>) -> Result<&'a str, ReadError> {
        match v {
            Value::Str(s) => Ok(s),
            other => Err(self.schema(
                what,
                format!("`{key}` is {}, expected a string", other.kind()),
            )),
        }
    }

    /// A string or None, as text shared by every entry with the same.
    fn opt_text(&mut self, what: &str, key: &str, v: &Value<'a>) -> Result<Option<Text>, ReadError> {
        match v {
            Value::None => Ok(None),
            v => self.str_field(what, key, v).map(|s| Some(self.texts.get(s))),
        }
    }

    pub(super) fn i64_field(&self, what: &str, key: &str, v: &Value<'a>) -> Result<i64, ReadError> {
        match v {
            Value::Int(i) => Ok(*i),
            Value::Bool(b) => Ok(*b as i64),
            Value::UInt(u) => Err(self.schema(
                what,
                format!("`{key}` = {u} does not fit a signed 64-bit integer"),
            )),
            other => Err(self.schema(
                what,
                format!("`{key}` is {}, expected an integer", other.kind()),
            )),
        }
    }

    pub(super) fn u64_field(&self, what: &str, key: &str, v: &Value<'a>) -> Result<u64, ReadError> {
        match v {
            Value::Int(i) if *i >= 0 => Ok(*i as u64),
            Value::UInt(u) => Ok(*u),
            Value::Int(i) => Err(self.schema(what, format!("`{key}` is negative ({i})"))),
            other => Err(self.schema(
                what,
                format!("`{key}` is {}, expected an integer", other.kind()),
            )),
        }
    }

    pub(super) fn bool_field(&self, what: &str, key: &str, v: &Value<'a>) -> Result<bool, ReadError> {
        match v {
            Value::Bool(b) => Ok(*b),
            Value::Int(i @ (0 | 1)) => Ok(*i == 1),
            other => Err(self.schema(
                what,
                format!("`{key}` is {}, expected a bool", other.kind()),
            )),
        }
    }

    pub(super) fn required<T>(&self, what: &str, key: &str, v: Option<T>) -> Result<T, ReadError> {
        v.ok_or_else(|| self.schema(what, format!("no `{key}`")))
    }

    /// A pair of integers (`segment_pool_id`, `pool_id`): a tuple, or a list as
    /// synthetic files write it.
    pub(super) fn int_pair(&self, what: &str, key: &str, v: &Value<'a>) -> Result<(i64, i64), ReadError> {
        let v = match v {
            Value::Shared(h) => &self.arena[*h as usize],
            v => v,
        };
        match v {
            Value::Tuple(s) | Value::List(ListData::Values(s)) if s.items.len() == 2 => Ok((
                self.i64_field(what, key, &s.items[0])?,
                self.i64_field(what, key, &s.items[1])?,
            )),
            other => Err(self.schema(
                what,
                format!("`{key}` is {}, expected a pair of integers", other.kind()),
            )),
        }
    }

    /// A trace entry, or `None` (counted) when its action is one this reader does not
    /// know. `addr` may be missing only where it means nothing (`snapshot`; an `oom`
    /// carries `device_free` instead), and `size` only on `snapshot`.
    pub(super) fn entry_from(&mut self, pairs: &mut [Value<'a>]) -> Result<Option<(TraceEntry, Pool)>, ReadError> {
        let (mut action, mut addr, mut size, mut stream, mut time_us, mut frames) =
            (None, None, None, 0, 0, None);
        let (mut category, mut compile_context, mut user_metadata, mut pool) = (None, None, None, None);
        for kv in pairs.chunks_exact_mut(2) {
            let Value::Str(k) = kv[0] else { continue };
            let v = &mut kv[1];
            match self.keys.get(k) {
                Key::Action => {
                    let s = self.str_field(ENTRY, k, v)?;
                    match action_of(s) {
                        Some(a) => action = Some(a),
                        None => {
                            *self.skipped_actions.entry(s).or_default() += 1;
                            return Ok(None);
                        }
                    }
                }
                Key::Addr | Key::DeviceFree => addr = Some(self.u64_field(ENTRY, k, v)?),
                Key::Size => size = Some(self.u64_field(ENTRY, k, v)?),
                Key::Stream => stream = self.i64_field(ENTRY, k, v)?,
                Key::TimeUs => time_us = self.i64_field(ENTRY, k, v)?,
                Key::Frames => frames = Some(self.stack_field(ENTRY, v)?),
                Key::Category => category = self.opt_text(ENTRY, k, v)?,
                Key::CompileContext => compile_context = self.opt_text(ENTRY, k, v)?,
                Key::UserMetadata => user_metadata = self.opt_text(ENTRY, k, v)?,
                Key::PoolId => pool = Some(self.int_pair(ENTRY, k, v)?),
                _ => self.skip_key(ENTRY, k),
            }
        }
        let action = self.required(ENTRY, "action", action)?;
        let frames = match frames {
            Some(f) => f,
            None => self.intern_stack(Vec::new())?,
        };
        let addr = match action {
            Action::Snapshot | Action::Oom => addr.unwrap_or(0),
            _ => self.required(ENTRY, "addr", addr)?,
        };
        let size = match action {
            Action::Snapshot => size.unwrap_or(0),
            _ => self.required(ENTRY, "size", size)?,
        };
        let entry = TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us,
            frames,
            category,
            compile_context,
            user_metadata,
        };
        Ok(Some((entry, pool)))
    }

    /// A block. PyTorch 2.0 wrote no `address` (its segment places it) and kept the
    /// frames and requested size in `history` (the first record is the live one, as
    /// memory_viz reads it).
    pub(super) fn block_from(&mut self, pairs: &mut [Value<'a>]) -> Result<Block, ReadError> {
        let (mut address, mut size, mut requested, mut state, mut frames) =
            (None, None, None, None, None);
        let (mut forward, mut history) = (None, None);
        for kv in pairs.chunks_exact_mut(2) {
            let Value::Str(k) = kv[0] else { continue };
            let v = &mut kv[1];
            match self.keys.get(k) {
                Key::Address => address = Some(self.u64_field(BLOCK, k, v)?),
                Key::Size => size = Some(self.u64_field(BLOCK, k, v)?),
                Key::RequestedSize => requested = Some(self.u64_field(BLOCK, k, v)?),
                Key::State => {
                    let s = self.str_field(BLOCK, k, v)?;
                    state = Some(
                        BlockState::parse(s)
                            .ok_or_else(|| self.schema(BLOCK, format!("unknown state `{s}`")))?,
                    );
                }
                Key::Frames => frames = Some(self.stack_field(BLOCK, v)?),
                Key::ForwardFrames => forward = Some(self.stack_field(BLOCK, v)?),
                Key::History => history = Some(self.history(std::mem::take(v))?),
                _ => self.skip_key(BLOCK, k),
            }
        }
        let size = self.required(BLOCK, "size", size)?;
        let (history_frames, history_size) = history.unwrap_or((None, None));
        let frames = match frames.or(history_frames) {
            Some(f) => f,
            None => self.intern_stack(Vec::new())?,
        };
        // Forward frames are kept by block address (PyTorch writes both, or neither).
        match (forward, address) {
            (Some(f), Some(a)) => self.forward_frames.push((a, f)),
            (Some(_), None) => self.skip_key(BLOCK, "forward_frames"),
            _ => {}
        }
        let address = address.unwrap_or(UNPLACED);
        Ok(Block {
            address,
            size,
            requested_size: requested.or(history_size).unwrap_or(size),
            state: self.required(BLOCK, "state", state)?,
            frames,
        })
    }

    /// A PyTorch 2.0 block's `history`: the frames and `real_size` of its first record.
    fn history(&mut self, v: Value<'a>) -> Result<(Option<StackId>, Option<u64>), ReadError> {
        const W: &str = "block history";
        let items = match self.resolve(v) {
            Value::List(ListData::Values(seq)) => seq.items,
            Value::List(list) => untype(list),
            other => return Err(self.schema(W, format!("`history` is {}, expected a list", other.kind()))),
        };
        let Some(first) = items.into_iter().next() else { return Ok((None, None)) };
        let Value::Dict(mut seq) = self.resolve(first) else {
            return Err(self.schema(W, "a `history` record is not a dict".into()));
        };
        let (mut frames, mut real_size) = (None, None);
        for kv in seq.items.chunks_exact_mut(2) {
            let Value::Str(k) = kv[0] else { continue };
            match self.keys.get(k) {
                Key::Frames => frames = Some(self.stack_field(W, &mut kv[1])?),
                Key::RealSize => real_size = Some(self.u64_field(W, k, &kv[1])?),
                Key::Addr => {}
                _ => self.skip_key(W, k),
            }
        }
        Ok((frames, real_size))
    }

    pub(super) fn segment_from(&mut self, pairs: &mut [Value<'a>]) -> Result<Segment, ReadError> {
        let mut seg = Segment {
            device: 0,
            address: 0,
            total_size: 0,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: 0,
            segment_type: SegmentType::Large,
            segment_pool_id: (0, 0),
            is_expandable: false,
            frames: 0,
            blocks: Vec::new(),
        };
        let (mut address, mut total, mut frames) = (None, None, None);
        for kv in pairs.chunks_exact_mut(2) {
            let Value::Str(k) = kv[0] else { continue };
            let v = &mut kv[1];
            match self.keys.get(k) {
                Key::Device => seg.device = self.i64_field(SEGMENT, k, v)?,
                Key::Address => address = Some(self.u64_field(SEGMENT, k, v)?),
                Key::TotalSize => total = Some(self.u64_field(SEGMENT, k, v)?),
                Key::AllocatedSize => seg.allocated_size = self.u64_field(SEGMENT, k, v)?,
                Key::ActiveSize => seg.active_size = self.u64_field(SEGMENT, k, v)?,
                Key::RequestedSize => seg.requested_size = self.u64_field(SEGMENT, k, v)?,
                Key::Stream => seg.stream = self.i64_field(SEGMENT, k, v)?,
                Key::SegmentType => {
                    seg.segment_type = match self.str_field(SEGMENT, k, v)? {
                        "large" => SegmentType::Large,
                        "small" => SegmentType::Small,
                        s => return Err(self.schema(SEGMENT, format!("unknown segment_type `{s}`"))),
                    }
                }
                Key::SegmentPoolId => seg.segment_pool_id = self.int_pair(SEGMENT, k, v)?,
                Key::IsExpandable => seg.is_expandable = self.bool_field(SEGMENT, k, v)?,
                Key::Frames => frames = Some(self.stack_field(SEGMENT, v)?),
                Key::Blocks => seg.blocks = self.records(k, std::mem::take(v))?,
                _ => self.skip_key(SEGMENT, k),
            }
        }
        seg.address = self.required(SEGMENT, "address", address)?;
        seg.total_size = self.required(SEGMENT, "total_size", total)?;
        seg.frames = match frames {
            Some(f) => f,
            None => self.intern_stack(Vec::new())?,
        };
        // Blocks lie back to back from the segment's address (how memory_viz places them).
        let mut at = seg.address;
        for b in &mut seg.blocks {
            if b.address == UNPLACED {
                b.address = at;
            }
            at = at.wrapping_add(b.size);
        }
        Ok(seg)
    }

    pub(super) fn annotation_from(&mut self, pairs: &mut [Value<'a>]) -> Result<Annotation, ReadError> {
        let (mut name, mut stage, mut device, mut time_us) = (None, None, 0, None);
        for kv in pairs.chunks_exact_mut(2) {
            let Value::Str(k) = kv[0] else { continue };
            let v = &kv[1];
            match self.keys.get(k) {
                Key::Name => name = Some(self.str_field(ANNOTATION, k, v)?.to_owned()),
                Key::Stage => {
                    stage = Some(match self.str_field(ANNOTATION, k, v)? {
                        "START" => AnnotationStage::Start,
                        "END" => AnnotationStage::End,
                        s => return Err(self.schema(ANNOTATION, format!("unknown stage `{s}`"))),
                    })
                }
                Key::Device => device = self.i64_field(ANNOTATION, k, v)?,
                Key::TimeUs => time_us = Some(self.i64_field(ANNOTATION, k, v)?),
                _ => self.skip_key(ANNOTATION, k),
            }
        }
        Ok(Annotation {
            name: self.required(ANNOTATION, "name", name)?,
            stage: self.required(ANNOTATION, "stage", stage)?,
            device,
            time_us: self.required(ANNOTATION, "time_us", time_us)?,
        })
    }

    /// The items of a list value, generic (a typed list is turned back into values).
    pub(super) fn list_items(&mut self, key: &str, v: Value<'a>) -> Result<Vec<Value<'a>>, ReadError> {
        match self.resolve(v) {
            Value::List(ListData::Values(seq)) => Ok(seq.items),
            Value::List(list) => Ok(untype(list)),
            other => Err(self.schema("snapshot", format!("`{key}` is {}, expected a list", other.kind()))),
        }
    }

    /// An element of `key` that is not the record expected, described.
    pub(super) fn not_a(&self, key: &str, index: usize, item: &Value<'a>, record: &str, needs: &str) -> ReadError {
        let what = match item {
            Value::Dict(seq) => format!("a dict with {}", key_list(&seq.items)),
            other => other.kind().to_string(),
        };
        self.schema("snapshot", format!("element {index} of `{key}` is {what}, not a {record} (a {record} has {needs})"))
    }

    /// A list of records of one kind, whatever representation it ended up in.
    pub(super) fn records<T: Record<'a>>(&mut self, key: &str, v: Value<'a>) -> Result<Vec<T>, ReadError> {
        let items = match self.resolve(v) {
            Value::List(list) => match T::take_typed(list) {
                Ok(done) => return Ok(done),
                Err(list) => self.list_items(key, Value::List(list))?,
            },
            other => {
                return Err(self.schema(
                    "snapshot",
                    format!("`{key}` is {}, expected a list", other.kind()),
                ))
            }
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            let item = self.resolve(item);
            match &item {
                Value::Dict(seq) if classify(&seq.items, &self.keys) == Some(T::KIND) => {}
                Value::Dict(_) => return Err(self.not_a(key, i, &item, T::NAME, T::NEEDS)),
                _ => {}
            }
            let shown = self.not_a(key, i, &item, T::NAME, T::NEEDS);
            match T::from_value(self, item) {
                Some(r) => out.push(r?),
                None => return Err(shown),
            }
        }
        Ok(out)
    }
}

/// A record type a snapshot list holds.
pub(super) trait Record<'a>: Sized {
    const KIND: Kind;
    /// For messages: the record's name and the keys that make a dict one.
    const NAME: &'static str;
    const NEEDS: &'static str;
    /// The list's elements when it is already stored as this type.
    fn take_typed(list: ListData<'a>) -> Result<Vec<Self>, ListData<'a>>;
    /// One element; `None` when it is not this kind of record.
    fn from_value(vm: &mut Vm<'a>, v: Value<'a>) -> Option<Result<Self, ReadError>>;
}

/// Implements `Record` for a typed record: its `ListData` variant, `Value` variant,
/// `Kind`, conversion from dict pairs, and what a dict needs to be one.
macro_rules! record {
    ($t:ty, $list:ident, $val:ident, $kind:ident, $from:ident, $name:expr, $needs:expr) => {
        impl<'a> Record<'a> for $t {
            const KIND: Kind = Kind::$kind;
            const NAME: &'static str = $name;
            const NEEDS: &'static str = $needs;
            fn take_typed(list: ListData<'a>) -> Result<Vec<Self>, ListData<'a>> {
                match list {
                    ListData::$list(v) => Ok(v),
                    ListData::Values(s) if s.items.is_empty() => Ok(Vec::new()),
                    other => Err(other),
                }
            }
            fn from_value(vm: &mut Vm<'a>, v: Value<'a>) -> Option<Result<Self, ReadError>> {
                match v {
                    Value::$val(x) => Some(Ok(*x)),
                    Value::Dict(mut s) if classify(&s.items, &vm.keys) == Some(Kind::$kind) => {
                        Some(vm.$from(&mut s.items))
                    }
                    _ => None,
                }
            }
        }
    };
}

record!(Block, Blocks, Block, Block, block_from, BLOCK, "`size` and `state`");
record!(Segment, Segments, Segment, Segment, segment_from, SEGMENT, "`blocks` or `segment_type`");
record!(Annotation, Annotations, Annotation, Annotation, annotation_from, ANNOTATION, "`stage`");
