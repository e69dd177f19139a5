//! What the machine's stack, memo and containers hold: pickled values, with lists stored
//! by element type once their elements are recognised records.

use super::error::ReadError;
use crate::snapshot::model::{Annotation, Block, FrameId, Segment, StackId, TraceEntry};

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

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Room for `n` more entries, reserved where it can be (a bound from the file's size
    /// may be more than the machine lends): as much as there is.
    pub(super) fn room(&mut self, n: usize) -> &mut [std::mem::MaybeUninit<TraceEntry>] {
        let _ = self.entries.try_reserve(n);
        let spare = self.entries.spare_capacity_mut();
        let n = n.min(spare.len());
        &mut spare[..n]
    }

    /// Appends `entries`, which are another list's from its entry `at` on, with their pools
    /// as that list's `pools` runs give them.
    pub(super) fn extend_from(&mut self, entries: impl Iterator<Item = TraceEntry>, pools: &[(u32, (i64, i64))], at: usize) {
        let start = self.entries.len();
        self.entries.extend(entries);
        let end = at + (self.entries.len() - start);
        let k = pools.partition_point(|r| r.0 as usize <= at);
        let first = if k == 0 { (0, 0) } else { pools[k - 1].1 };
        let changes = pools[k..].iter().take_while(|r| (r.0 as usize) < end).map(|r| (r.0 as usize, r.1));
        let mut last = self.pools.last().map_or((0, 0), |r| r.1);
        for (i, p) in std::iter::once((at, first)).chain(changes) {
            if p != last && i < end {
                self.pools.push(((start + i - at) as u32, p));
                last = p;
            }
        }
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
