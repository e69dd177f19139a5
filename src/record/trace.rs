//! A PyTorch memory snapshot's device_traces as a stream of batches, so a trace recorded
//! with `torch.cuda.memory._record_memory_history` animates on the live screen. Phases come
//! from annotations named like vramscope's own ("forward (step 3)"); anything else is Other.

use crate::event::{Batch, Category, MemEvent, Phase, PhaseMark};
use crate::snapshot::model::{AnnotationStage, Snapshot};
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
pub fn trace_items(snap: &Snapshot) -> Vec<(u64, Incoming)> {
    let mut entries: Vec<(i64, u8, &crate::snapshot::model::TraceEntry)> = snap
        .device_traces
        .iter()
        .enumerate()
        .flat_map(|(d, t)| t.iter().map(move |e| (e.time_us, d as u8, e)))
        .collect();
    entries.sort_by_key(|e| e.0);
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
    let mut batch = Batch::default();
    for (i, (time_us, device, e)) in entries.iter().enumerate() {
        while let Some((_, p, s)) = marks.next_if(|m| timed && m.0 <= *time_us) {
            (phase, step) = (p, s);
            batch.marks.push(PhaseMark { seq: i as u64, t_ns: t_ns(i, *time_us), step, phase });
        }
        batch.events.push(MemEvent {
            t_ns: t_ns(i, *time_us),
            addr: e.addr,
            size: e.size,
            stream: e.stream,
            step,
            scope: 0,
            action: e.action,
            phase,
            device: *device,
            category: e.category.as_deref().and_then(Category::parse).unwrap_or(Category::Unknown),
        });
        if batch.events.len() == BATCH_EVENTS || i + 1 == entries.len() {
            let stamp = batch.events.last().map(|e| e.t_ns).unwrap_or(0);
            let next = Batch { first_seq: i as u64 + 1, ..Batch::default() };
            out.push((stamp, Incoming::Batch(std::mem::replace(&mut batch, next))));
        }
    }
    let end = out.last().map(|o| o.0).unwrap_or(0);
    out.push((end, Incoming::Report(Report::Finished)));
    out
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
        snap.device_traces = vec![vec![a, f]];
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
