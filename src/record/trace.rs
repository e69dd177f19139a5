//! A PyTorch memory snapshot's device_traces as a stream of batches, so a trace recorded
//! with `torch.cuda.memory._record_memory_history` animates on the live screen. Phases come
//! from annotations named like vramscope's own ("forward (step 3)"); anything else is Other.

use crate::event::{Action, Batch, Category, MemEvent, Phase, PhaseMark};
use crate::snapshot::model::{AnnotationStage, Snapshot, TraceEntry};
use crate::snapshot::timeline::Timeline;
use crate::stream::Incoming;
use crate::stream::Report;

/// Events per batch: small enough that the screen moves smoothly while it plays.
const BATCH_EVENTS: usize = 256;

/// "forward (step 3)" → (Forward, 3).
fn parse_annotation(name: &str) -> Option<(Phase, u32)> {
    let (phase, rest) = name.split_once(" (step ")?;
    let step = rest.strip_suffix(')')?.parse().ok()?;
    Phase::ALL.into_iter().find(|p| p.as_str() == phase).map(|p| (p, step))
}

/// The trace's items with their stamps (ns from the first entry), ending with `Finished`.
/// Entries of all devices are merged in time order. A trace without times (all zero) is
/// paced one microsecond per entry, so it still plays rather than appearing at once.
///
/// The store counts an allocation from its alloc to its `FreeRequested`; memory_viz, from
/// its alloc to the free its timeline pairs with it, and blocks older than the trace
/// (freed without an alloc, or active at the end and never allocated) from the start.
/// So the items begin with those blocks allocated, and each free is sent where the
/// device's Active Memory Timeline puts it: the store's peak is memory_viz's (for one
/// device; several are added together).
pub fn trace_items(snap: &Snapshot) -> Vec<(u64, Incoming)> {
    let mut initial = Vec::new();
    let mut entries: Vec<(i64, u8, &TraceEntry, FreeRole)> = Vec::new();
    for (d, trace) in snap.device_traces.iter().enumerate() {
        let tl = Timeline::from_snapshot(snap, d);
        let mut frees = vec![false; trace.len()];
        for a in &tl.allocations {
            if let Some(end) = a.end {
                frees[tl.event_positions[end]] = true;
            }
            if a.alive_at_start {
                let category = tl.categories.get(a.category as usize).and_then(|c| Category::parse(c)).unwrap_or(Category::Unknown);
                initial.push((d as u8, a.addr, a.size, category));
            }
        }
        entries.extend(trace.iter().zip(frees).map(|(e, frees)| (e.time_us, d as u8, e, FreeRole::of(e.action, frees))));
    }
    // One device's trace is in time order already; several are merged by time.
    if !entries.is_sorted_by_key(|e| e.0) {
        entries.sort_by_key(|e| e.0);
    }
    let timed = entries.first().map(|e| e.0) != entries.last().map(|e| e.0);
    let t0 = entries.first().map(|e| e.0).unwrap_or(0);
    let t_ns = |i: usize, time_us: i64| if timed { (time_us - t0).max(0) as u64 * 1000 } else { i as u64 * 1000 };

    let mut marks: Vec<(i64, Phase, u32)> = snap
        .external_annotations
        .iter()
        .filter_map(|a| {
            let (phase, step) = parse_annotation(&a.name)?;
            Some(match a.stage {
                AnnotationStage::Start => (a.time_us, phase, step),
                AnnotationStage::End => (a.time_us, Phase::Other, step),
            })
        })
        .collect();
    // An end and the next start at the same time: the start wins by coming last.
    marks.sort_by_key(|m| (m.0, m.1 != Phase::Other));
    let mut marks = marks.into_iter().peekable();

    let (mut phase, mut step) = (Phase::Other, 0u32);
    let mut out = Vec::new();
    let mut batch = Batch { events: Vec::with_capacity(BATCH_EVENTS), ..Batch::default() };
    let mut sent = 0u64;
    let event = |t_ns, addr, size, stream, action, phase, step, device, category| MemEvent { t_ns, addr, size, stream, step, scope: 0, action, phase, device, category };
    for (device, addr, size, category) in initial {
        batch.events.push(event(0, addr, size, 0, Action::Alloc, Phase::Other, 0, device, category));
    }
    for (i, (time_us, device, e, role)) in entries.iter().enumerate() {
        while let Some((_, p, s)) = marks.next_if(|m| timed && m.0 <= *time_us) {
            (phase, step) = (p, s);
            batch.marks.push(PhaseMark { seq: sent + batch.events.len() as u64, t_ns: t_ns(i, *time_us), step, phase });
        }
        let category = e.category.as_deref().and_then(Category::parse).unwrap_or(Category::Unknown);
        let mut push = |action| batch.events.push(event(t_ns(i, *time_us), e.addr, e.size, e.stream, action, phase, step, *device, category));
        match role {
            FreeRole::Deferred => {}
            FreeRole::Implied => {
                push(Action::FreeRequested);
                push(Action::FreeCompleted);
            }
            FreeRole::AsIs => push(e.action),
        }
        if batch.events.len() >= BATCH_EVENTS || i + 1 == entries.len() {
            let stamp = batch.events.last().map(|e| e.t_ns).unwrap_or(0);
            sent += batch.events.len() as u64;
            let next = Batch { first_seq: sent, events: Vec::with_capacity(BATCH_EVENTS), ..Batch::default() };
            out.push((stamp, Incoming::Batch(std::mem::replace(&mut batch, next))));
        }
    }
    if !batch.events.is_empty() {
        out.push((0, Incoming::Batch(batch)));
    }
    let end = out.last().map(|o| o.0).unwrap_or(0);
    out.push((end, Incoming::Report(Report::Finished)));
    out
}

/// How an entry reaches the store, which frees at `FreeRequested` and nowhere else.
#[derive(Clone, Copy, Debug, PartialEq)]
enum FreeRole {
    AsIs,
    /// A request whose free the timeline puts at a later completion: sent there.
    Deferred,
    /// A completion the timeline frees at with no request just before it (a trace
    /// recorded with `skip_actions`, or a request deferred to it): the request is sent
    /// here first.
    Implied,
}

impl FreeRole {
    fn of(action: Action, frees_here: bool) -> FreeRole {
        match (action, frees_here) {
            (Action::FreeRequested, false) => FreeRole::Deferred,
            (Action::FreeCompleted, true) => FreeRole::Implied,
            _ => FreeRole::AsIs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::model::{Action, Annotation, TraceEntry};

    #[test]
    fn annotations_become_phases_and_categories_are_kept() {
        let mut snap = Snapshot::default();
        let mut a = TraceEntry::new(Action::Alloc, 0x100, 64);
        a.time_us = 10;
        a.category = Some("activation".into());
        let mut f = TraceEntry::new(Action::FreeRequested, 0x100, 64);
        f.time_us = 30;
        let mut done = f.clone();
        done.action = Action::FreeCompleted;
        snap.device_traces = vec![vec![a, f, done]];
        let ann = |stage, time_us| Annotation { name: "backward (step 2)".into(), stage, device: 0, time_us };
        snap.external_annotations = vec![ann(AnnotationStage::Start, 20), ann(AnnotationStage::End, 40)];
        let items = trace_items(&snap);
        let Incoming::Batch(b) = &items[0].1 else { panic!("batch first") };
        assert_eq!(b.events[0].category, Category::Activation);
        assert_eq!((b.events[0].phase, b.events[0].t_ns), (Phase::Other, 0));
        assert_eq!((b.events[1].phase, b.events[1].step, b.events[1].t_ns), (Phase::Backward, 2, 20_000));
        assert_eq!(b.events[1].category, Category::Unknown);
        assert_eq!(b.marks, vec![PhaseMark { seq: 1, t_ns: 20_000, step: 2, phase: Phase::Backward }]);
        assert_eq!(items.last().unwrap().1, Incoming::Report(Report::Finished));
        assert_eq!(parse_annotation("optimizer (step 12)"), Some((Phase::Optimizer, 12)));
        assert_eq!(parse_annotation("my_region"), None);
    }
}
