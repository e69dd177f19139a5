//! In-memory form of a PyTorch memory snapshot (`torch.cuda.memory._snapshot()`).
//!
//! Frames are interned: a snapshot repeats the same stack thousands of times, so entries
//! hold a `StackId` into `Snapshot::stacks`, and stacks hold `FrameId`s into
//! `Snapshot::frames`. Reader, writer, timeline and allocator model all share this form.

use serde::{Deserialize, Serialize};

pub type FrameId = u32;
pub type StackId = u32;

/// One Python/C++ frame as PyTorch records it (`{name, filename, line}`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frame {
    pub name: String,
    pub filename: String,
    pub line: i64,
}

/// Trace actions, in the order of c10's `TraceEntry::Action`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum Action {
    Alloc = 0,
    FreeRequested = 1,
    FreeCompleted = 2,
    SegmentAlloc = 3,
    SegmentFree = 4,
    SegmentMap = 5,
    SegmentUnmap = 6,
    Snapshot = 7,
    Oom = 8,
}

impl Action {
    pub const ALL: [Action; 9] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Snapshot,
        Action::Oom,
    ];

    /// The string PyTorch writes in the `action` key.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::Oom => "oom",
        }
    }

    pub fn parse(s: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str() == s)
    }

    pub fn from_u8(v: u8) -> Option<Action> {
        Action::ALL.get(v as usize).copied()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BlockState {
    ActiveAllocated,
    ActivePendingFree,
    Inactive,
}

impl BlockState {
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
    pub fn parse(s: &str) -> Option<BlockState> {
        match s {
            "active_allocated" => Some(BlockState::ActiveAllocated),
            "active_pending_free" => Some(BlockState::ActivePendingFree),
            "inactive" => Some(BlockState::Inactive),
            _ => None,
        }
    }
    pub fn is_active(self) -> bool {
        !matches!(self, BlockState::Inactive)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SegmentType {
    Small,
    Large,
}

impl SegmentType {
    pub fn as_str(self) -> &'static str {
        match self {
            SegmentType::Small => "small",
            SegmentType::Large => "large",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: BlockState,
    pub frames: StackId,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub stream: i64,
    pub segment_type: SegmentType,
    pub segment_pool_id: (i64, i64),
    pub is_expandable: bool,
    pub frames: StackId,
    pub blocks: Vec<Block>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceEntry {
    pub action: Action,
    /// `addr`, or `device_free` for an `oom` entry.
    pub addr: u64,
    pub size: u64,
    pub stream: i64,
    pub time_us: i64,
    pub frames: StackId,
    /// torch.profiler-style category name when the writer recorded one.
    pub category: Option<String>,
    pub compile_context: Option<String>,
    pub user_metadata: Option<String>,
}

impl TraceEntry {
    /// An entry with no stream, time, frames (stack 0) or annotations.
    pub fn new(action: Action, addr: u64, size: u64) -> Self {
        TraceEntry {
            action,
            addr,
            size,
            stream: 0,
            time_us: 0,
            frames: 0,
            category: None,
            compile_context: None,
            user_metadata: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AnnotationStage {
    Start,
    End,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Annotation {
    pub name: String,
    pub stage: AnnotationStage,
    pub device: i64,
    pub time_us: i64,
}

/// A scalar value kept as-is from `allocator_settings`, so unknown keys survive a round trip.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum SettingValue {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    /// Nested dict (e.g. `roundup_power2_divisions`), key order preserved.
    Dict(Vec<(String, SettingValue)>),
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocatorSettings {
    /// Key order preserved as read.
    pub entries: Vec<(String, SettingValue)>,
}

impl AllocatorSettings {
    pub fn get(&self, key: &str) -> Option<&SettingValue> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub segments: Vec<Segment>,
    /// One list per device, index = device ordinal.
    pub device_traces: Vec<Vec<TraceEntry>>,
    pub allocator_settings: Option<AllocatorSettings>,
    pub external_annotations: Vec<Annotation>,
    pub frames: Vec<Frame>,
    pub stacks: Vec<Vec<FrameId>>,
}

impl Snapshot {
    /// Frames of a stack, innermost first (PyTorch's order).
    pub fn stack(&self, id: StackId) -> impl Iterator<Item = &Frame> {
        self.stacks
            .get(id as usize)
            .into_iter()
            .flatten()
            .map(move |f| &self.frames[*f as usize])
    }

    pub fn block_count(&self) -> usize {
        self.segments.iter().map(|s| s.blocks.len()).sum()
    }

    pub fn trace_entry_count(&self) -> usize {
        self.device_traces.iter().map(Vec::len).sum()
    }

    /// The device to show when none is asked for: the first whose trace has entries (a
    /// snapshot of a run on cuda:3, or of DDP rank 3, has empty lists before its own), else 0.
    pub fn first_traced_device(&self) -> usize {
        self.device_traces.iter().position(|t| !t.is_empty()).unwrap_or(0)
    }
}

/// Interns frames and stacks while building a `Snapshot` (reader, live capture).
#[derive(Default)]
pub struct StackInterner {
    frame_ids: std::collections::HashMap<Frame, FrameId>,
    stack_ids: std::collections::HashMap<Vec<FrameId>, StackId>,
}

impl StackInterner {
    /// Start from an existing snapshot's tables so new stacks share them.
    pub fn from_snapshot(s: &Snapshot) -> Self {
        let mut me = Self::default();
        for (i, f) in s.frames.iter().enumerate() {
            me.frame_ids.insert(f.clone(), i as FrameId);
        }
        for (i, st) in s.stacks.iter().enumerate() {
            me.stack_ids.insert(st.clone(), i as StackId);
        }
        me
    }

    pub fn frame(&mut self, snap: &mut Snapshot, f: Frame) -> FrameId {
        if let Some(id) = self.frame_ids.get(&f) {
            return *id;
        }
        let id = snap.frames.len() as FrameId;
        snap.frames.push(f.clone());
        self.frame_ids.insert(f, id);
        id
    }

    pub fn stack(&mut self, snap: &mut Snapshot, frames: Vec<FrameId>) -> StackId {
        if let Some(id) = self.stack_ids.get(&frames) {
            return *id;
        }
        let id = snap.stacks.len() as StackId;
        snap.stacks.push(frames.clone());
        self.stack_ids.insert(frames, id);
        id
    }
}
