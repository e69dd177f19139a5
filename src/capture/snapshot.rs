//! Cuts a PyTorch-format snapshot from the tracker: segments and blocks (modelled on CPU,
//! the real allocator's on CUDA), the trace ring with module/phase frames and categories,
//! phases as external_annotations.

use crate::event::{Action, Phase};
use crate::snapshot::model::{
    Annotation, AnnotationStage, Frame, Snapshot, StackInterner, StackId, TraceEntry,
};

use super::tracker::Tracker;

/// Frame tables shared by every snapshot of a session: one stack per (scope, phase).
pub struct FrameTables {
    pub tables: Snapshot,
    interner: StackInterner,
}

impl Default for FrameTables {
    fn default() -> Self {
        let mut tables = Snapshot::default();
        let mut interner = StackInterner::default();
        // Stack 0 is the empty stack: events with no module and phase.
        interner.stack(&mut tables, Vec::new());
        FrameTables { tables, interner }
    }
}

impl FrameTables {
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
        let f = Frame {
            name: "vramscope::train::engine::step".into(),
            filename: "src/train/engine.rs".into(),
            line: 0,
        };
        ids.push(self.interner.frame(&mut self.tables, f));
        self.interner.stack(&mut self.tables, ids)
    }
}

/// `epoch_us_at_zero`: wall-clock µs at the shim clock's zero, so `time_us` is epoch µs
/// like PyTorch's.
pub fn cut(
    tracker: &Tracker,
    frames: &FrameTables,
    base: Option<Snapshot>,
    epoch_us_at_zero: i64,
) -> Snapshot {
    let device = match tracker.backend() {
        super::tracker::Backend::Modelled(_) => 0usize,
        super::tracker::Backend::Cuda { device } => *device as usize,
    };
    let mut snap = base.unwrap_or_default();
    let time_us = |t_ns: u64| epoch_us_at_zero + (t_ns / 1000) as i64;
    if let Some(model) = tracker.model() {
        snap.segments = model.segments(device as i64);
        snap.allocator_settings = Some(model.config().to_settings());
    }
    // Our stacks replace whatever tables the base had; its segments keep stack 0.
    for seg in &mut snap.segments {
        if tracker.model().is_none() {
            seg.frames = 0;
            for b in &mut seg.blocks {
                b.frames = 0;
            }
        }
    }
    snap.frames = frames.tables.frames.clone();
    snap.stacks = frames.tables.stacks.clone();
    let trace: Vec<TraceEntry> = tracker
        .trace()
        .map(|e| TraceEntry {
            action: e.action,
            addr: e.addr,
            size: e.size,
            stream: e.stream,
            time_us: time_us(e.t_ns),
            frames: tracker.stack_of.get(&(e.scope, e.phase)).copied().unwrap_or(0),
            // Segment events get "unknown": memory_viz throws on a trace whose categories
            // do not include it (a typo in its fallback), and they have no category anyway.
            category: Some(
                if matches!(e.action, Action::Alloc | Action::FreeRequested | Action::FreeCompleted) {
                    e.category.as_str()
                } else {
                    "unknown"
                }
                .to_string(),
            ),
            compile_context: None,
            user_metadata: None,
        })
        .collect();
    snap.device_traces = vec![Vec::new(); device + 1];
    snap.device_traces[device] = trace;
    // Each phase runs until the next mark.
    let marks: Vec<_> = tracker.marks().copied().collect();
    snap.external_annotations.clear();
    for w in marks.windows(2) {
        let (m, next) = (w[0], w[1]);
        if m.phase == Phase::Other {
            continue;
        }
        let name = format!("{} (step {})", m.phase.as_str(), m.step);
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
    snap
}
