//! What the reader shows its caller while it reads: progress to draw, and bytes it may
//! release, every `TICK` bytes of each pass.

use crate::snapshot::model::{Segment, TraceEntry};

/// How far the reader advances between calls to its `release` and `observe` hooks.
pub(super) const TICK: usize = 2 << 20;

/// Which pass over the file a `ReadProgress` is from (in the order they run).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ReadPass {
    /// Validating the opcodes (nothing is decoded yet).
    Check,
    Decode,
}

/// What the reader has decoded so far. Frame and stack ids in these records are the
/// reader's own until the last call (at the end of the read), which shows the final
/// snapshot's lists.
pub struct ReadProgress<'s> {
    pub pass: ReadPass,
    /// Bytes of the file this pass has gone through, of `total`.
    pub done: usize,
    pub total: usize,
    /// The top-level `segments` list, once the reader has gone past it.
    pub segments: Option<&'s [Segment]>,
    /// Each device's trace decoded so far, in device order: a prefix of its final trace.
    pub traces: Vec<&'s [TraceEntry]>,
}

pub(super) struct Hooks<'h> {
    pub(super) release: &'h (dyn Fn(std::ops::Range<usize>) + Sync),
    pub(super) observe: &'h mut dyn FnMut(&ReadProgress<'_>),
    /// Where this pass's released bytes end: each tick releases only what it adds (a
    /// release from the start every time would walk the whole prefix again).
    released: (ReadPass, usize),
}

impl<'h> Hooks<'h> {
    pub(super) fn new(release: &'h (dyn Fn(std::ops::Range<usize>) + Sync), observe: &'h mut dyn FnMut(&ReadProgress<'_>)) -> Self {
        Hooks { release, observe, released: (ReadPass::Check, 0) }
    }

    /// Called at every `TICK` bytes of a pass, at `pos`, with `done` bytes of it gone
    /// through (more than `pos` when another thread checks a later stretch).
    pub(super) fn tick(
        &mut self,
        pass: ReadPass,
        data: &[u8],
        (pos, done): (usize, usize),
        segments: Option<&[Segment]>,
        traces: Vec<&[TraceEntry]>,
    ) {
        let from = if self.released.0 == pass { self.released.1 } else { 0 };
        (self.release)(from..pos);
        self.released = (pass, pos);
        (self.observe)(&ReadProgress {
            pass,
            done,
            total: data.len(),
            segments,
            traces,
        });
    }
}
