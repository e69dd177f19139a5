//! Cuts a PyTorch-format snapshot from the tracker: segments and blocks (modelled on CPU,
//! the real allocator's on CUDA), the trace ring with module/phase frames and categories,
//! phases as external_annotations. The cut copies; the conversion runs elsewhere.

use std::collections::HashMap;

use crate::event::{Action, Category, MemEvent, Phase, PhaseMark};
use crate::snapshot::model::{
    AllocatorSettings, Annotation, AnnotationStage, Frame, FrameId, Segment, Snapshot, StackInterner, StackId,
    Text, TraceEntry,
};
use crate::snapshot::ReadError;

use super::tracker::Tracker;

/// Frame tables shared by every snapshot of a session: one stack per (scope, phase).
pub struct FrameTables {
    pub tables: Snapshot,
    interner: StackInterner,
    /// The innermost frame of every stack: where the job's loop runs.
    runner: Frame,
}

impl FrameTables {
    pub fn new(runner: Frame) -> FrameTables {
        let mut tables = Snapshot::default();
        let mut interner = StackInterner::default();
        // Stack 0 is the empty stack: events with no module and phase.
        interner.stack(&mut tables, Vec::new());
        FrameTables { tables, interner, runner }
    }

    /// The stack memory_viz shows for an allocation: module, then phase, then where our loop
    /// runs it (innermost first, as PyTorch orders frames).
    pub fn stack_for(&mut self, scope_name: &str, phase: Phase) -> StackId {
        let mut ids = Vec::with_capacity(3);
        if !scope_name.is_empty() {
            let f = Frame { name: scope_name.to_string(), filename: "model".into(), line: 0 };
            ids.push(self.interner.frame(&mut self.tables, f));
        }
        let f = Frame { name: phase.as_str().to_string(), filename: "phase".into(), line: 0 };
        ids.push(self.interner.frame(&mut self.tables, f));
        ids.push(self.interner.frame(&mut self.tables, self.runner.clone()));
        self.interner.stack(&mut self.tables, ids)
    }
}

/// What a snapshot is made of, copied from the tracker at a step boundary: plain copies
/// only, so the training thread hands it over at once and the decoding of PyTorch's own
/// snapshot, the conversion to trace entries and the write happen on another thread.
pub struct SnapshotCut {
    device: usize,
    /// PyTorch's own snapshot pickle (CUDA): the real segments and blocks.
    base: Option<Vec<u8>>,
    /// The modelled segments and allocator settings (CPU).
    modelled: Option<(Vec<Segment>, AllocatorSettings)>,
    frames: Vec<Frame>,
    stacks: Vec<Vec<FrameId>>,
    stack_of: rustc_hash::FxHashMap<(u32, Phase), StackId>,
    trace: Vec<MemEvent>,
    /// Stream sequence number of `trace[0]`.
    first_seq: u64,
    marks: Vec<PhaseMark>,
    /// Wall-clock µs at the shim clock's zero, so `time_us` is epoch µs like PyTorch's.
    epoch_us_at_zero: i64,
}

impl SnapshotCut {
    pub fn take(tracker: &Tracker, frames: &FrameTables, base: Option<Vec<u8>>, epoch_us_at_zero: i64) -> SnapshotCut {
        let device = match tracker.backend() {
            super::tracker::Backend::Modelled(_) => 0usize,
            super::tracker::Backend::Cuda { device } => *device as usize,
        };

        SnapshotCut {
            device,
            base,
            modelled: tracker.model().map(|m| (m.segments(device as i64), m.config().to_settings())),
            frames: frames.tables.frames.clone(),
            stacks: frames.tables.stacks.clone(),
            stack_of: tracker.stack_of.clone(),
            trace: tracker.trace().copied().collect(),
            first_seq: tracker.next_seq() - tracker.trace().len() as u64,
            marks: tracker.marks().copied().collect(),
            epoch_us_at_zero,
        }
    }

    /// Drops the trace before step `step`'s first phase, but for the allocations and
    /// segments still live then: they open the trace, with their categories and names, at
    /// the bottom of memory_viz's stack, and what came and went before (initialisation's
    /// temporaries, warm-up steps) is gone. A cut without that step keeps its whole trace.
    pub fn trim_before_step(&mut self, step: u32) {
        let Some(from) = self.marks.iter().find(|m| m.step >= step && m.phase != Phase::Other).map(|m| m.seq) else { return };
        let drop = from.saturating_sub(self.first_seq).min(self.trace.len() as u64) as usize;
        let before: Vec<MemEvent> = self.trace.drain(..drop).collect();
        // Index in `before` of each allocation and segment still live at its end.
        let (mut allocs, mut segments) = (HashMap::new(), HashMap::new());
        for (i, e) in before.iter().enumerate() {
            match e.action {
                Action::Alloc => {
                    allocs.insert(e.addr, i);
                }
                Action::FreeRequested => {
                    allocs.remove(&e.addr);
                }
                Action::SegmentAlloc | Action::SegmentMap => {
                    segments.insert(e.addr, i);
                }
                Action::SegmentFree | Action::SegmentUnmap => {
                    segments.remove(&e.addr);
                }
                _ => {}
            }
        }
        let mut kept: Vec<usize> = allocs.into_values().chain(segments.into_values()).collect();
        kept.sort_unstable();
        self.trace.splice(0..0, kept.into_iter().map(|i| before[i]));
        self.first_seq = from;
        self.marks.retain(|m| m.seq >= from);
    }

    /// The snapshot in PyTorch's form: segments and blocks (modelled on CPU, the real
    /// allocator's on CUDA), the trace with module/phase frames and categories, phases as
    /// external_annotations.
    pub fn into_snapshot(self) -> Result<Snapshot, ReadError> {
        let device = self.device;
        let mut snap = match &self.base {
            Some(pickle) => crate::snapshot::reader::read_snapshot(pickle)?,
            None => Snapshot::default(),
        };
        let time_us = |t_ns: u64| self.epoch_us_at_zero + (t_ns / 1000) as i64;
        match self.modelled {
            Some((segments, settings)) => {
                snap.segments = segments;
                snap.allocator_settings = Some(settings);
            }
            // Our stacks replace the tables PyTorch's snapshot had; its segments keep stack 0.
            None => {
                for seg in &mut snap.segments {
                    seg.frames = 0;
                    for b in &mut seg.blocks {
                        b.frames = 0;
                    }
                }
            }
        }
        snap.frames = self.frames;
        snap.stacks = self.stacks;
        let stack_of = &self.stack_of;
        // One shared copy of each category's name, not a string per entry.
        let unknown = Text::from(Category::Unknown.as_str());
        let mut names = vec![unknown.clone(); Category::ALL.len()];
        for c in Category::ALL {
            names[c as usize] = Text::from(c.as_str());
        }
        let trace: Vec<TraceEntry> = self
            .trace
            .iter()
            .map(|e| TraceEntry {
                action: e.action,
                addr: e.addr,
                size: e.size,
                stream: e.stream,
                time_us: time_us(e.t_ns),
                frames: stack_of.get(&(e.scope, e.phase)).copied().unwrap_or(0),
                // Segment events get "unknown": memory_viz throws on a trace whose categories
                // do not include it (a typo in its fallback), and they have no category anyway.
                category: Some(if matches!(e.action, Action::Alloc | Action::FreeRequested | Action::FreeCompleted) {
                    names[e.category as usize].clone()
                } else {
                    unknown.clone()
                }),
                compile_context: None,
                user_metadata: None,
            })
            .collect();
        snap.device_traces = vec![Vec::new(); device + 1];
        snap.device_traces[device] = trace;
        // Each phase runs until the next mark.
        snap.external_annotations.clear();
        for w in self.marks.windows(2) {
            let (m, next) = (w[0], w[1]);
            if m.phase == Phase::Other {
                continue;
            }
            let name = m.phase.annotation(m.step);
            snap.external_annotations.push(Annotation {
                name: name.clone(),
                stage: AnnotationStage::Start,
                device: device as i64,
                time_us: time_us(m.t_ns),
            });
            snap.external_annotations.push(Annotation {
                name,
                stage: AnnotationStage::End,
                device: device as i64,
                time_us: time_us(next.t_ns),
            });
        }
        Ok(snap)
    }
}
