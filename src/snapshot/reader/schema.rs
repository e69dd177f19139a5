//! The mapping of pickled values onto the snapshot schema: which dict is which record,
//! each record's keys, the top-level dict, and the final renumbering of frames and stacks.

use super::model::{
    Action, AllocatorSettings, Annotation, AnnotationStage, Block, BlockState, Frame, FrameId,
    Segment, SegmentType, SettingValue, Snapshot, StackId, TraceEntry,
};
use super::intern::NO_FRAME;
use super::vm::{check_depth, malformed, untype, ListData, Value, Vm};
use super::ReadError;

/// The dict keys the reader knows. Matching a key once to this enum costs one string
/// comparison instead of one per candidate, which matters at millions of dicts.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum Key {
    Action,
    Addr,
    DeviceFree,
    Size,
    Stream,
    TimeUs,
    Frames,
    Category,
    CompileContext,
    UserMetadata,
    Address,
    RequestedSize,
    State,
    Device,
    TotalSize,
    AllocatedSize,
    ActiveSize,
    SegmentType,
    SegmentPoolId,
    IsExpandable,
    Blocks,
    Name,
    Filename,
    Line,
    Stage,
    Other,
}

impl Key {
    pub(super) fn name(self) -> &'static str {
        match self {
            Key::Action => "action",
            Key::Addr => "addr",
            Key::DeviceFree => "device_free",
            Key::Size => "size",
            Key::Stream => "stream",
            Key::TimeUs => "time_us",
            Key::Frames => "frames",
            Key::Category => "category",
            Key::CompileContext => "compile_context",
            Key::UserMetadata => "user_metadata",
            Key::Address => "address",
            Key::RequestedSize => "requested_size",
            Key::State => "state",
            Key::Device => "device",
            Key::TotalSize => "total_size",
            Key::AllocatedSize => "allocated_size",
            Key::ActiveSize => "active_size",
            Key::SegmentType => "segment_type",
            Key::SegmentPoolId => "segment_pool_id",
            Key::IsExpandable => "is_expandable",
            Key::Blocks => "blocks",
            Key::Name => "name",
            Key::Filename => "filename",
            Key::Line => "line",
            Key::Stage => "stage",
            Key::Other => "",
        }
    }
}

pub(super) fn key_of(k: &str) -> Key {
    let b = k.as_bytes();
    let Some(&first) = b.first() else {
        return Key::Other;
    };
    let cand = match (b.len(), first) {
        (4, b'a') => Key::Addr,
        (4, b'l') => Key::Line,
        (4, b'n') => Key::Name,
        (4, b's') => Key::Size,
        (5, b's') => match b[3] {
            b't' => Key::State,
            b'g' => Key::Stage,
            _ => return Key::Other,
        },
        (6, b'a') => Key::Action,
        (6, b'b') => Key::Blocks,
        (6, b'd') => Key::Device,
        (6, b'f') => Key::Frames,
        (6, b's') => Key::Stream,
        (7, b'a') => Key::Address,
        (7, b't') => Key::TimeUs,
        (8, b'c') => Key::Category,
        (8, b'f') => Key::Filename,
        (10, b't') => Key::TotalSize,
        (11, b'a') => Key::ActiveSize,
        (11, b'd') => Key::DeviceFree,
        (12, b's') => Key::SegmentType,
        (13, b'i') => Key::IsExpandable,
        (13, b'u') => Key::UserMetadata,
        (14, b'a') => Key::AllocatedSize,
        (14, b'r') => Key::RequestedSize,
        (15, b'c') => Key::CompileContext,
        (15, b's') => Key::SegmentPoolId,
        _ => return Key::Other,
    };
    if cand.name() == k {
        cand
    } else {
        Key::Other
    }
}

/// Keys are nearly always memoized strings, so one key arrives again and again at the
/// same address in the input; remembering recent addresses skips the comparison.
pub(super) struct KeyCache {
    pub(super) slots: [std::cell::Cell<(usize, usize, Key)>; 64],
}

impl KeyCache {
    pub(super) fn new() -> Self {
        KeyCache {
            slots: std::array::from_fn(|_| std::cell::Cell::new((0, 0, Key::Other))),
        }
    }

    /// Only valid for strings of one input buffer: same address and length, same bytes.
    pub(super) fn get(&self, k: &str) -> Key {
        let addr = k.as_ptr() as usize;
        let slot = &self.slots[(addr >> 1) % 64];
        let (a, len, key) = slot.get();
        if a == addr && len == k.len() {
            return key;
        }
        let key = key_of(k);
        slot.set((addr, k.len(), key));
        key
    }
}

pub(super) fn action_of(s: &str) -> Option<Action> {
    Some(match s {
        "alloc" => Action::Alloc,
        "free_requested" => Action::FreeRequested,
        "free_completed" => Action::FreeCompleted,
        "segment_alloc" => Action::SegmentAlloc,
        "segment_free" => Action::SegmentFree,
        "segment_map" => Action::SegmentMap,
        "segment_unmap" => Action::SegmentUnmap,
        "snapshot" => Action::Snapshot,
        "oom" => Action::Oom,
        _ => return None,
    })
}

/// The kind of record a dict is, judged by its keys.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum Kind {
    Entry,
    Block,
    Segment,
    Annotation,
    Frame,
}

pub(super) fn classify(pairs: &[Value<'_>], keys: &KeyCache) -> Option<Kind> {
    let (mut filename, mut line, mut name, mut state, mut size, mut address) =
        (false, false, false, false, false, false);
    for k in pairs.iter().step_by(2) {
        let Value::Str(k) = k else { continue };
        match keys.get(k) {
            Key::Action => return Some(Kind::Entry),
            Key::Stage => return Some(Kind::Annotation),
            Key::Blocks | Key::SegmentType => return Some(Kind::Segment),
            Key::Filename => filename = true,
            Key::Line => line = true,
            Key::Name => name = true,
            Key::State => state = true,
            Key::Size => size = true,
            Key::Address => address = true,
            _ => {}
        }
    }
    if filename && line && name {
        Some(Kind::Frame)
    } else if state && size && address {
        Some(Kind::Block)
    } else {
        None
    }
}

impl<'a> Vm<'a> {
    pub(super) fn convert(&mut self, kind: Kind, pairs: &mut [Value<'a>]) -> Result<Value<'a>, ReadError> {
        match kind {
            Kind::Frame => self.frame_from(pairs).map(Value::Frame),
            Kind::Entry => self.entry_from(pairs).map(|e| Value::Entry(Box::new(e))),
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
        for kv in pairs.chunks_exact_mut(2) {
            let Value::Str(k) = kv[0] else { continue };
            match self.keys.get(k) {
                Key::Name => name = Some(self.str_field("frame", k, &kv[1])?),
                Key::Filename => filename = Some(self.str_field("frame", k, &kv[1])?),
                Key::Line => line = Some(self.i64_field("frame", k, &kv[1])?),
                _ => {}
            }
        }
        let (Some(name), Some(filename), Some(line)) = (name, filename, line) else {
            return Err(self.schema("frame", "needs `name`, `filename` and `line`".into()));
        };
        self.intern_frame(name, filename, line)
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

    pub(super) fn opt_string(
        &self,
        what: &str,
        key: &str,
        v: &Value<'a>,
    ) -> Result<Option<String>, ReadError> {
        match v {
            Value::None => Ok(None),
            v => self.str_field(what, key, v).map(|s| Some(s.to_owned())),
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

    pub(super) fn entry_from(&mut self, pairs: &mut [Value<'a>]) -> Result<TraceEntry, ReadError> {
        const W: &str = "trace entry";
        let (mut action, mut addr, mut size, mut stream, mut time_us, mut frames) =
            (None, None, None, 0, 0, None);
        let (mut category, mut compile_context, mut user_metadata) = (None, None, None);
        for kv in pairs.chunks_exact_mut(2) {
            let Value::Str(k) = kv[0] else { continue };
            let v = &mut kv[1];
            match self.keys.get(k) {
                Key::Action => {
                    let s = self.str_field(W, k, v)?;
                    action = Some(
                        action_of(s)
                            .ok_or_else(|| self.schema(W, format!("unknown action `{s}`")))?,
                    );
                }
                Key::Addr | Key::DeviceFree => addr = Some(self.u64_field(W, k, v)?),
                Key::Size => size = Some(self.u64_field(W, k, v)?),
                Key::Stream => stream = self.i64_field(W, k, v)?,
                Key::TimeUs => time_us = self.i64_field(W, k, v)?,
                Key::Frames => frames = Some(self.stack_field(W, v)?),
                Key::Category => category = self.opt_string(W, k, v)?,
                Key::CompileContext => compile_context = self.opt_string(W, k, v)?,
                Key::UserMetadata => user_metadata = self.opt_string(W, k, v)?,
                _ => {}
            }
        }
        let frames = match frames {
            Some(f) => f,
            None => self.intern_stack(Vec::new())?,
        };
        Ok(TraceEntry {
            action: self.required(W, "action", action)?,
            addr: self.required(W, "addr", addr)?,
            size: self.required(W, "size", size)?,
            stream,
            time_us,
            frames,
            category,
            compile_context,
            user_metadata,
        })
    }

    pub(super) fn block_from(&mut self, pairs: &mut [Value<'a>]) -> Result<Block, ReadError> {
        const W: &str = "block";
        let (mut address, mut size, mut requested, mut state, mut frames) =
            (None, None, None, None, None);
        for kv in pairs.chunks_exact_mut(2) {
            let Value::Str(k) = kv[0] else { continue };
            let v = &mut kv[1];
            match self.keys.get(k) {
                Key::Address => address = Some(self.u64_field(W, k, v)?),
                Key::Size => size = Some(self.u64_field(W, k, v)?),
                Key::RequestedSize => requested = Some(self.u64_field(W, k, v)?),
                Key::State => {
                    let s = self.str_field(W, k, v)?;
                    state = Some(
                        BlockState::parse(s)
                            .ok_or_else(|| self.schema(W, format!("unknown state `{s}`")))?,
                    );
                }
                Key::Frames => frames = Some(self.stack_field(W, v)?),
                _ => {}
            }
        }
        let size = self.required(W, "size", size)?;
        let frames = match frames {
            Some(f) => f,
            None => self.intern_stack(Vec::new())?,
        };
        Ok(Block {
            address: self.required(W, "address", address)?,
            size,
            requested_size: requested.unwrap_or(size),
            state: self.required(W, "state", state)?,
            frames,
        })
    }

    pub(super) fn segment_from(&mut self, pairs: &mut [Value<'a>]) -> Result<Segment, ReadError> {
        const W: &str = "segment";
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
        let (mut address, mut total, mut seg_type, mut frames) = (None, None, None, None);
        for kv in pairs.chunks_exact_mut(2) {
            let Value::Str(k) = kv[0] else { continue };
            let v = &mut kv[1];
            match self.keys.get(k) {
                Key::Device => seg.device = self.i64_field(W, k, v)?,
                Key::Address => address = Some(self.u64_field(W, k, v)?),
                Key::TotalSize => total = Some(self.u64_field(W, k, v)?),
                Key::AllocatedSize => seg.allocated_size = self.u64_field(W, k, v)?,
                Key::ActiveSize => seg.active_size = self.u64_field(W, k, v)?,
                Key::RequestedSize => seg.requested_size = self.u64_field(W, k, v)?,
                Key::Stream => seg.stream = self.i64_field(W, k, v)?,
                Key::SegmentType => {
                    seg_type = Some(match self.str_field(W, k, v)? {
                        "large" => SegmentType::Large,
                        "small" => SegmentType::Small,
                        s => return Err(self.schema(W, format!("unknown segment_type `{s}`"))),
                    })
                }
                Key::SegmentPoolId => seg.segment_pool_id = self.pool_id(v)?,
                Key::IsExpandable => seg.is_expandable = self.bool_field(W, k, v)?,
                Key::Frames => frames = Some(self.stack_field(W, v)?),
                Key::Blocks => seg.blocks = self.records(k, std::mem::take(v))?,
                _ => {}
            }
        }
        seg.address = self.required(W, "address", address)?;
        seg.total_size = self.required(W, "total_size", total)?;
        seg.segment_type = self.required(W, "segment_type", seg_type)?;
        seg.frames = match frames {
            Some(f) => f,
            None => self.intern_stack(Vec::new())?,
        };
        Ok(seg)
    }

    pub(super) fn pool_id(&self, v: &Value<'a>) -> Result<(i64, i64), ReadError> {
        const W: &str = "segment";
        let v = match v {
            Value::Shared(h) => &self.arena[*h as usize],
            v => v,
        };
        match v {
            Value::Tuple(s) | Value::List(ListData::Values(s)) if s.items.len() == 2 => Ok((
                self.i64_field(W, "segment_pool_id", &s.items[0])?,
                self.i64_field(W, "segment_pool_id", &s.items[1])?,
            )),
            other => Err(self.schema(
                W,
                format!(
                    "`segment_pool_id` is {}, expected a pair of integers",
                    other.kind()
                ),
            )),
        }
    }

    pub(super) fn annotation_from(&mut self, pairs: &mut [Value<'a>]) -> Result<Annotation, ReadError> {
        const W: &str = "annotation";
        let (mut name, mut stage, mut device, mut time_us) = (None, None, 0, None);
        for kv in pairs.chunks_exact_mut(2) {
            let Value::Str(k) = kv[0] else { continue };
            let v = &kv[1];
            match self.keys.get(k) {
                Key::Name => name = Some(self.str_field(W, k, v)?.to_owned()),
                Key::Stage => {
                    stage = Some(match self.str_field(W, k, v)? {
                        "START" => AnnotationStage::Start,
                        "END" => AnnotationStage::End,
                        s => return Err(self.schema(W, format!("unknown stage `{s}`"))),
                    })
                }
                Key::Device => device = self.i64_field(W, k, v)?,
                Key::TimeUs => time_us = Some(self.i64_field(W, k, v)?),
                _ => {}
            }
        }
        Ok(Annotation {
            name: self.required(W, "name", name)?,
            stage: self.required(W, "stage", stage)?,
            device,
            time_us: self.required(W, "time_us", time_us)?,
        })
    }

    /// A list of records of one kind, whatever representation it ended up in.
    pub(super) fn records<T: Record<'a>>(&mut self, key: &str, v: Value<'a>) -> Result<Vec<T>, ReadError> {
        let items = match self.resolve(v) {
            Value::List(list) => match T::take_typed(list) {
                Ok(done) => return Ok(done),
                Err(ListData::Values(seq)) => seq.items,
                Err(other) => untype(other),
            },
            other => {
                return Err(self.schema(
                    "snapshot",
                    format!("`{key}` is {}, expected a list", other.kind()),
                ))
            }
        };
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let item = self.resolve(item);
            let kind = item.kind();
            match T::from_value(self, item) {
                Some(r) => out.push(r?),
                None => {
                    return Err(self.schema("snapshot", format!("an element of `{key}` is {kind}")))
                }
            }
        }
        Ok(out)
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

    pub(super) fn into_snapshot(mut self, top: Value<'a>) -> Result<Snapshot, ReadError> {
        let Value::Dict(mut seq) = self.resolve(top) else {
            return Err(ReadError::Schema {
                detail: "top-level value is not a dict".into(),
            });
        };
        let mut snap = Snapshot::default();
        let mut have_segments = false;
        for kv in seq.items.chunks_exact_mut(2) {
            let Value::Str(k) = kv[0] else { continue };
            let v = std::mem::take(&mut kv[1]);
            match k {
                "segments" => {
                    snap.segments = self.records(k, v)?;
                    have_segments = true;
                }
                "device_traces" => {
                    let per_device: Vec<Value<'a>> = self.records(k, v)?;
                    snap.device_traces = Vec::with_capacity(per_device.len());
                    for dev in per_device {
                        snap.device_traces
                            .push(self.records("device_traces[i]", dev)?);
                    }
                }
                "external_annotations" => snap.external_annotations = self.records(k, v)?,
                "allocator_settings" => {
                    snap.allocator_settings = match self.setting_value(v, 0)? {
                        Some(SettingValue::None) => None,
                        Some(SettingValue::Dict(entries)) => Some(AllocatorSettings { entries }),
                        _ => {
                            return Err(ReadError::Schema {
                                detail: "`allocator_settings` is not a dict".into(),
                            })
                        }
                    }
                }
                _ => {}
            }
        }
        if !have_segments {
            return Err(ReadError::Schema {
                detail: "top-level dict has no `segments`".into(),
            });
        }
        snap.frames = self.frames;
        snap.stacks = self.stacks.stacks;
        Ok(snap)
    }

    /// A settings value; `None` for shapes `SettingValue` cannot hold (ignored like
    /// unknown keys elsewhere).
    pub(super) fn setting_value(
        &mut self,
        v: Value<'a>,
        depth: u32,
    ) -> Result<Option<SettingValue>, ReadError> {
        check_depth(depth, self.at)?;
        Ok(Some(match self.resolve(v) {
            Value::None => SettingValue::None,
            Value::Bool(b) => SettingValue::Bool(b),
            Value::Int(i) => SettingValue::Int(i),
            Value::Float(f) => SettingValue::Float(f),
            Value::Str(s) => SettingValue::Str(s.to_owned()),
            Value::Dict(seq) => {
                let mut entries: Vec<(String, SettingValue)> = Vec::new();
                let mut it = seq.items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    let Value::Str(k) = k else { continue };
                    if let Some(v) = self.setting_value(v, depth + 1)? {
                        match entries.iter_mut().find(|(e, _)| e == k) {
                            Some(slot) => slot.1 = v,
                            None => entries.push((k.to_owned(), v)),
                        }
                    }
                }
                SettingValue::Dict(entries)
            }
            _ => return Ok(None),
        }))
    }
}


/// A record type a snapshot list holds.
pub(super) trait Record<'a>: Sized {
    /// The list's elements when it is already stored as this type.
    fn take_typed(list: ListData<'a>) -> Result<Vec<Self>, ListData<'a>>;
    /// One element; `None` when it is not this kind of record.
    fn from_value(vm: &mut Vm<'a>, v: Value<'a>) -> Option<Result<Self, ReadError>>;
}

/// Implements `Record` for a typed record: its `ListData` variant, `Value` variant,
/// `Kind` and conversion from dict pairs.
macro_rules! record {
    ($t:ty, $list:ident, $val:ident, $kind:ident, $from:ident) => {
        impl<'a> Record<'a> for $t {
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

record!(TraceEntry, Entries, Entry, Entry, entry_from);
record!(Block, Blocks, Block, Block, block_from);
record!(Segment, Segments, Segment, Segment, segment_from);
record!(
    Annotation,
    Annotations,
    Annotation,
    Annotation,
    annotation_from
);

/// Generic elements (the per-device lists of `device_traces`).
impl<'a> Record<'a> for Value<'a> {
    fn take_typed(list: ListData<'a>) -> Result<Vec<Self>, ListData<'a>> {
        Err(list)
    }
    fn from_value(_vm: &mut Vm<'a>, v: Value<'a>) -> Option<Result<Self, ReadError>> {
        Some(Ok(v))
    }
}

/// Renumber stacks and frames in traversal order (segments with their blocks, then
/// traces), dropping unused ones. The result depends only on the data, not on the order
/// records happened to complete in the file, so `read(write(s)) == s` holds.
pub(super) fn canonicalize_tables(snap: &mut Snapshot) {
    const UNSEEN: u32 = u32::MAX;
    let mut stack_map = vec![UNSEEN; snap.stacks.len()];
    let mut order: Vec<StackId> = Vec::new();
    let mut visit = |id: &mut StackId| {
        let slot = &mut stack_map[*id as usize];
        if *slot == UNSEEN {
            *slot = order.len() as StackId;
            order.push(*id);
        }
        *id = *slot;
    };
    for seg in &mut snap.segments {
        visit(&mut seg.frames);
        for b in &mut seg.blocks {
            visit(&mut b.frames);
        }
    }
    for e in snap.device_traces.iter_mut().flatten() {
        visit(&mut e.frames);
    }
    let mut old_stacks = std::mem::take(&mut snap.stacks);
    let mut old_frames = std::mem::take(&mut snap.frames);
    let mut frame_map = vec![UNSEEN; old_frames.len()];
    for old in order {
        let mut st = std::mem::take(&mut old_stacks[old as usize]);
        for f in &mut st {
            let slot = &mut frame_map[*f as usize];
            if *slot == UNSEEN {
                *slot = snap.frames.len() as FrameId;
                let of = &mut old_frames[*f as usize];
                snap.frames.push(Frame {
                    name: std::mem::take(&mut of.name),
                    filename: std::mem::take(&mut of.filename),
                    line: of.line,
                });
            }
            *f = *slot;
        }
        snap.stacks.push(st);
    }
}
