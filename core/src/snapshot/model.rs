//! In-memory form of a PyTorch memory snapshot (`torch.cuda.memory._snapshot()`).
//!
//! Frames are interned: a snapshot repeats the same stack thousands of times, so entries
//! hold a `StackId` into `Snapshot::stacks`, and stacks hold `FrameId`s into
//! `Snapshot::frames`. Reader, writer, timeline and allocator model all share this form.

use std::collections::BTreeMap;
use std::sync::Arc;

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

    /// How the action changes reserved memory, as a sign on its size: a segment allocated
    /// or mapped adds, one freed or unmapped takes away, anything else leaves it.
    pub fn reserved_sign(self) -> i8 {
        match self {
            Action::SegmentAlloc | Action::SegmentMap => 1,
            Action::SegmentFree | Action::SegmentUnmap => -1,
            _ => 0,
        }
    }

    pub fn parse(s: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str() == s)
    }

    pub fn from_u8(v: u8) -> Option<Action> {
        Action::ALL.get(v as usize).copied()
    }

    /// An allocation or a free: what the Active Memory Timeline draws.
    pub fn is_alloc_or_free(self) -> bool {
        matches!(self, Action::Alloc | Action::FreeRequested | Action::FreeCompleted)
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
    /// PyTorch documents `active_awaiting_free` and writes `active_pending_free`: both
    /// are read (and the latter written, the one memory_viz knows).
    pub fn parse(s: &str) -> Option<BlockState> {
        match s {
            "active_allocated" => Some(BlockState::ActiveAllocated),
            "active_pending_free" | "active_awaiting_free" => Some(BlockState::ActivePendingFree),
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

/// Text many trace entries share, one copy for all: a thin pointer (8 bytes in an `Option`,
/// where `Arc<str>` takes 16), since a snapshot holds millions of entries with three each
/// (issue 29: peak memory).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Text(Arc<String>);

impl std::ops::Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Text {
        Text(Arc::new(s.to_owned()))
    }
}

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

/// What a function of an entry's text gives, found by the text's address: entries share
/// one copy of each text (`Text`), so nearly every entry's is found by comparing a pointer
/// or two, not its text with every name (issue 29). Holds the first 64 texts seen; past
/// them (a file with more distinct texts) each is worked out again. `None` is at the null
/// address.
pub struct ByText<T> {
    seen: Vec<(*const u8, T)>,
}

impl<T> Default for ByText<T> {
    fn default() -> Self {
        ByText { seen: Vec::new() }
    }
}

impl<T: Copy> ByText<T> {
    #[inline]
    pub fn get(&mut self, text: Option<&str>, work_out: impl FnOnce(Option<&str>) -> T) -> T {
        let at = text.map_or(std::ptr::null(), str::as_ptr);
        if let Some(&(_, v)) = self.seen.iter().find(|s| s.0 == at) {
            return v;
        }
        let v = work_out(text);
        if self.seen.len() < 64 {
            self.seen.push((at, v));
        }
        v
    }
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
    pub category: Option<Text>,
    /// Text a trace repeats over and over (PyTorch writes "N/A" and "" for most
    /// entries): one copy shared by every entry with it.
    pub compile_context: Option<Text>,
    pub user_metadata: Option<Text>,
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

/// The trace key of host memory in `Details` (CUDA traces are keyed by their ordinal).
pub const HOST_TRACE: u32 = u32::MAX;

/// Where a trace's entries change memory pool (`pool_id`, PyTorch 2.13): entries from
/// `from` on, up to the next run of the same trace, are in `pool`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRun {
    /// CUDA ordinal, or `HOST_TRACE`.
    pub trace: u32,
    pub from: u32,
    pub pool: (i64, i64),
}

/// What newer PyTorch records beside the core records. Most files have none of it, so
/// it is kept sparse here rather than in every entry, block and frame.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Details {
    /// Trace entries' `pool_id`, as runs in trace order (entries before a trace's first
    /// run, and files without the key, are in pool (0, 0)).
    pub pools: Vec<PoolRun>,
    /// Blocks' `forward_frames` (the forward op behind a tensor made in backward), by
    /// block address, ascending.
    pub forward_frames: Vec<(u64, StackId)>,
    /// FX debug keys of frames (`fx_node_op`, `fx_node_name`, `fx_node_target`,
    /// `fx_original_trace`, ...), by frame, ascending.
    pub frame_fx: Vec<(FrameId, Vec<(String, String)>)>,
}

/// What the reader left out, counted: a file from a newer PyTorch still opens, and says
/// what it did not use.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    /// Trace entries with an action this reader does not know (PyTorch main's
    /// `annotate`), by action.
    pub actions: BTreeMap<String, u64>,
    /// Keys not used, by "record.key" (`trace entry.internal_metadata`).
    pub keys: BTreeMap<String, u64>,
}

impl Skipped {
    pub fn is_empty(&self) -> bool {
        self.actions.is_empty() && self.keys.is_empty()
    }

    /// One line for a person, e.g. "skipped 3 trace entries with unknown actions
    /// (annotate ×3); unused keys: trace entry.internal_metadata ×12".
    pub fn describe(&self) -> Option<String> {
        let list = |m: &BTreeMap<String, u64>| m.iter().map(|(k, n)| format!("{k} ×{n}")).collect::<Vec<_>>().join(", ");
        let mut parts = Vec::new();
        if !self.actions.is_empty() {
            let n: u64 = self.actions.values().sum();
            parts.push(format!("skipped {n} trace entries with unknown actions ({})", list(&self.actions)));
        }
        if !self.keys.is_empty() {
            parts.push(format!("unused keys: {}", list(&self.keys)));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
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
    /// Host (pinned) memory, `host_segments` of newer PyTorch: shown as a "host" device
    /// after the CUDA ones.
    pub host_segments: Vec<Segment>,
    /// `host_traces`, as one trace.
    pub host_trace: Vec<TraceEntry>,
    pub details: Details,
    pub skipped: Skipped,
    /// Set when the file was a torch.profiler trace (`crate::profiler`).
    pub profiled: Option<ProfiledWindow>,
    /// Set when the categories were named from the frames (`report::frame_rules`).
    #[serde(default)]
    pub frame_rules: Option<RuleCoverage>,
}

/// The bytes of allocations the frame rules named a category for, and of the rest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RuleCoverage {
    pub matched_bytes: u64,
    pub unmatched_bytes: u64,
}

/// A torch.profiler trace read as a snapshot: it covers only the profiled window, and has
/// no segments (its blocks are its allocations).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProfiledWindow {
    /// The allocator's totals are stated (`Total Allocated`); without them memory is counted
    /// from the window's start.
    pub totals: bool,
    /// The `ProfilerStep#N` numbers, in order.
    pub steps: Vec<u64>,
    /// The highest `Total Reserved` stated, by device index; devices without it are absent.
    pub peak_reserved: Vec<(usize, u64)>,
    /// Read from a directory: which worker's which window it is.
    pub picked: Option<String>,
    /// The frames that are operators (`cpu_op`), ascending: the per-operator table's rows.
    pub operator_frames: Vec<FrameId>,
    pub form: TraceForm,
}

/// Which of torch.profiler's files it was.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceForm {
    /// A chrome trace (`export_chrome_trace`, `tensorboard_trace_handler`).
    #[default]
    Trace,
    /// `export_memory_timeline`'s `[times, sizes]` (`.json`, `.json.gz`): category totals.
    MemoryTimeline,
    /// `export_memory_timeline`'s `.raw.json.gz`: one event per tensor.
    MemoryTimelineRaw,
}

impl TraceForm {
    pub fn is_timeline(self) -> bool {
        self != TraceForm::Trace
    }
}

impl ProfiledWindow {
    pub fn peak_reserved(&self, device: usize) -> Option<u64> {
        self.peak_reserved.iter().find(|(d, _)| *d == device).map(|(_, b)| *b)
    }
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

    /// Blocks of all devices, the host's included.
    pub fn block_count(&self) -> usize {
        self.segments.iter().chain(&self.host_segments).map(|s| s.blocks.len()).sum()
    }

    /// Trace entries of all devices, the host's included.
    pub fn trace_entry_count(&self) -> usize {
        self.device_traces.iter().map(Vec::len).sum::<usize>() + self.host_trace.len()
    }

    /// CUDA devices the file speaks of: its traces, and the ordinals its segments name (a
    /// bare segment list has no traces).
    pub fn cuda_devices(&self) -> usize {
        let by_segments = self.segments.iter().map(|s| usize::try_from(s.device).map_or(0, |d| d + 1)).max().unwrap_or(0);
        self.device_traces.len().max(by_segments)
    }

    /// The device index of host memory (after the CUDA devices), when the file has any.
    pub fn host_device(&self) -> Option<usize> {
        (!self.host_segments.is_empty() || !self.host_trace.is_empty()).then(|| self.cuda_devices())
    }

    /// Devices to choose from: the CUDA ones, then the host; at least one.
    pub fn device_count(&self) -> usize {
        (self.cuda_devices() + usize::from(self.host_device().is_some())).max(1)
    }

    /// "host", or "device N" ("exported device" of a memory timeline, which names none).
    pub fn device_name(&self, device: usize) -> String {
        if self.profiled.as_ref().is_some_and(|p| p.form.is_timeline()) {
            "exported device".into()
        } else if self.host_device() == Some(device) {
            "host".into()
        } else {
            format!("device {device}")
        }
    }

    /// `Details` key of a device's trace.
    pub fn trace_key(&self, device: usize) -> u32 {
        if self.host_device() == Some(device) {
            HOST_TRACE
        } else {
            device as u32
        }
    }

    /// A device's trace (empty past the last).
    pub fn trace(&self, device: usize) -> &[TraceEntry] {
        if self.host_device() == Some(device) {
            return &self.host_trace;
        }
        self.device_traces.get(device).map_or(&[], Vec::as_slice)
    }

    /// A device's segments.
    pub fn device_segments(&self, device: usize) -> impl Iterator<Item = &Segment> + '_ {
        let (list, ordinal) = match self.host_device() == Some(device) {
            true => (&self.host_segments, None),
            false => (&self.segments, Some(device as i64)),
        };
        list.iter().filter(move |s| ordinal.is_none_or(|d| s.device == d))
    }

    /// The device's annotations with START paired to END by name, in the order they close:
    /// (name, start, end) in `time_us`. One never closed has no span.
    pub fn annotation_spans(&self, device: usize) -> Vec<(&str, i64, i64)> {
        let mut open: Vec<(&str, i64)> = Vec::new();
        let mut out = Vec::new();
        for a in self.external_annotations.iter().filter(|a| a.device == device as i64) {
            match a.stage {
                AnnotationStage::Start => open.push((&a.name, a.time_us)),
                AnnotationStage::End => {
                    if let Some(i) = open.iter().position(|(n, _)| *n == a.name) {
                        let (name, start) = open.remove(i);
                        out.push((name, start, a.time_us));
                    }
                }
            }
        }
        out
    }

    /// The pool (`pool_id`) of entry `index` of a device's trace; (0, 0) when unrecorded.
    pub fn entry_pool(&self, device: usize, index: usize) -> (i64, i64) {
        let key = self.trace_key(device);
        let runs = &self.details.pools;
        let end = runs.partition_point(|r| (r.trace, r.from as usize) <= (key, index));
        end.checked_sub(1).map(|i| runs[i]).filter(|r| r.trace == key).map_or((0, 0), |r| r.pool)
    }

    /// A block's `forward_frames`, when recorded.
    pub fn forward_frames(&self, block_address: u64) -> Option<StackId> {
        let v = &self.details.forward_frames;
        v.binary_search_by_key(&block_address, |x| x.0).ok().map(|i| v[i].1)
    }

    /// A frame's FX debug keys and values (empty when it has none).
    pub fn frame_fx(&self, frame: FrameId) -> &[(String, String)] {
        let v = &self.details.frame_fx;
        v.binary_search_by_key(&frame, |x| x.0).map_or(&[], |i| v[i].1.as_slice())
    }

    /// The device to show when none is asked for: the first with alloc or free actions
    /// in its trace (a run on cuda:3, or DDP rank 3, has empty lists before its own),
    /// else the first with active blocks, else the first with any trace entries, else 0.
    pub fn default_device(&self) -> usize {
        let devices = 0..self.device_count();
        let has_actions = |d: &usize| self.trace(*d).iter().any(|e| e.action.is_alloc_or_free());
        let has_blocks = |d: &usize| self.device_segments(*d).any(|s| s.blocks.iter().any(|b| b.state.is_active()));
        devices.clone().find(has_actions)
            .or_else(|| devices.clone().find(has_blocks))
            .or_else(|| devices.clone().find(|d| !self.trace(*d).is_empty()))
            .unwrap_or(0)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot holds millions of entries: each byte of one is megabytes of the peak
    /// memory of a summary (issue 29 holds it to 1.5× the file). The three texts take a
    /// thin pointer each, not a fat one.
    #[test]
    fn a_trace_entry_takes_64_bytes() {
        assert_eq!(std::mem::size_of::<TraceEntry>(), 64);
        assert_eq!(std::mem::size_of::<Option<Text>>(), 8);
        let t = Text::from("N/A");
        assert_eq!((&*t, format!("{t:?}")), ("N/A", "\"N/A\"".to_string()), "reads and prints as the text it holds");
    }

    #[test]
    fn a_text_s_value_is_worked_out_once_for_each_copy() {
        let (a, b) = (Text::from("activation"), Text::from("gradient"));
        let mut by = ByText::default();
        let mut asked = Vec::new();
        for t in [Some(&a), Some(&b), None, Some(&a), None, Some(&b)] {
            let v = by.get(t.map(|t| &**t), |text| {
                asked.push(text.map(str::to_owned));
                text.map_or(0, str::len)
            });
            assert_eq!(v, t.map_or(0, |t| t.len()));
        }
        assert_eq!(asked, [Some("activation".to_string()), Some("gradient".to_string()), None]);
    }
}
