//! Which dict is which record: the dict keys the reader knows, the trace actions, and the
//! kind of record a dict's keys make it.

use super::value::Value;
use crate::snapshot::model::Action;

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
    PoolId,
    ForwardFrames,
    History,
    RealSize,
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
            Key::PoolId => "pool_id",
            Key::ForwardFrames => "forward_frames",
            Key::History => "history",
            Key::RealSize => "real_size",
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
        (7, b'h') => Key::History,
        (7, b'p') => Key::PoolId,
        (7, b't') => Key::TimeUs,
        (8, b'c') => Key::Category,
        (8, b'f') => Key::Filename,
        (9, b'r') => Key::RealSize,
        (10, b't') => Key::TotalSize,
        (11, b'a') => Key::ActiveSize,
        (11, b'd') => Key::DeviceFree,
        (12, b's') => Key::SegmentType,
        (13, b'i') => Key::IsExpandable,
        (13, b'u') => Key::UserMetadata,
        (14, b'a') => Key::AllocatedSize,
        (14, b'f') => Key::ForwardFrames,
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

/// A block is judged by `size` and `state` alone: PyTorch 2.0 wrote blocks without
/// `address` (memory_viz places blocks by their sizes, from the segment's address).
pub(super) fn classify(pairs: &[Value<'_>], keys: &KeyCache) -> Option<Kind> {
    let (mut filename, mut line, mut name, mut state, mut size) = (false, false, false, false, false);
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
            _ => {}
        }
    }
    if filename && line && name {
        Some(Kind::Frame)
    } else if state && size {
        Some(Kind::Block)
    } else {
        None
    }
}
