//! A PyTorch memory snapshot's device_traces as a stream of batches, so a trace recorded
//! with `torch.cuda.memory._record_memory_history` animates on the live screen. Phases come
//! from annotations named like vramscope's own ("forward (step 3)"); anything else is Other.

use crate::event::{Action, Batch, Category, MemEvent, Phase, PhaseMark};
use crate::snapshot::model::{AnnotationStage, ByText, Snapshot};
use crate::snapshot::timeline::Timeline;
use crate::stream::Incoming;
use crate::stream::Report;

/// Events per batch: small enough that the screen moves smoothly while it plays.
const BATCH_EVENTS: usize = 256;

/// The trace's items with their stamps (ns from the first entry of any device), ending
/// with `Finished`. Each device plays as a stream of its own (its batches never mix
/// devices, each numbered from 0), `first`'s before the others at equal times, so a
/// screen shows one device at a time and its devices' figures are never added together.
/// A trace without times (all zero) is paced one microsecond per entry, so it still plays
/// rather than appearing at once.
///
/// The store counts an allocation from its alloc to its `FreeRequested`; memory_viz, from
/// its alloc to the free its timeline pairs with it, and blocks older than the trace
/// (freed without an alloc, or active at the end and never allocated) from the start.
/// So a device's items begin with those blocks allocated, and each free is sent where the
/// device's Active Memory Timeline puts it: the store's peak is memory_viz's.
pub fn trace_items(snap: &Snapshot, first: usize) -> Vec<(u64, Incoming)> {
    // The host's memory (a torch.profiler trace's CPU) plays as a device of its own.
    let devices: Vec<usize> = std::iter::once(first)
        .chain((0..snap.device_count()).filter(|d| *d != first && !snap.trace(*d).is_empty()))
        .collect();
    let times = || (0..snap.device_count()).flat_map(|d| snap.trace(d)).map(|e| e.time_us);
    let (lo, hi) = (times().min().unwrap_or(0), times().max().unwrap_or(0));
    let clock = Clock { t0: lo, timed: lo != hi };
    let mut scopes = Scopes::default();
    let mut out: Vec<(u64, Incoming)> = devices.into_iter().flat_map(|d| device_items(snap, d, clock, &mut scopes)).collect();
    out.sort_by_key(|(stamp, _)| *stamp);
    // The chosen device's first batch opens the replay, whatever its time: a screen shows
    // first the device whose events come first.
    let device_of = |item: &Incoming| if let Incoming::Batch(b) = item { b.events.first().map(|e| e.device) } else { None };
    if let Some(i) = out.iter().position(|(_, item)| device_of(item) == Some(first as u8)) {
        let (stamp, item) = out.remove(i);
        let stamp = out.first().map_or(stamp, |o| o.0.min(stamp));
        out.insert(0, (stamp, item));
    }
    let end = out.last().map(|o| o.0).unwrap_or(0);
    out.push((end, Incoming::Report(Report::Finished)));
    out
}

/// Where entries fall in time: µs from the earliest entry, or one µs apart where the trace
/// has no times.
#[derive(Clone, Copy)]
struct Clock {
    t0: i64,
    timed: bool,
}

impl Clock {
    fn t_ns(self, i: usize, time_us: i64) -> u64 {
        if self.timed {
            (time_us - self.t0).max(0) as u64 * 1000
        } else {
            i as u64 * 1000
        }
    }
}

/// What the screen names an allocation by: the frame a person would (its scope), interned
/// once for every device.
#[derive(Default)]
struct Scopes {
    ids: rustc_hash::FxHashMap<String, u32>,
    by_stack: rustc_hash::FxHashMap<crate::snapshot::model::StackId, u32>,
}

impl Scopes {
    /// The scope of `stack` (0: none), and its name when it is new.
    fn of(&mut self, snap: &Snapshot, stack: crate::snapshot::model::StackId, new: &mut Vec<(u32, String)>) -> u32 {
        if let Some(id) = self.by_stack.get(&stack) {
            return *id;
        }
        let id = match crate::report::frames::top_frame_label(snap, stack) {
            None => 0,
            Some(label) => {
                let next = self.ids.len() as u32 + 1;
                *self.ids.entry(label.clone()).or_insert_with(|| {
                    new.push((next, label));
                    next
                })
            }
        };
        self.by_stack.insert(stack, id);
        id
    }
}

fn device_items(snap: &Snapshot, d: usize, clock: Clock, scopes: &mut Scopes) -> Vec<(u64, Incoming)> {
    let trace = snap.trace(d);
    let tl = Timeline::from_snapshot(snap, d);
    let mut frees = vec![false; trace.len()];
    let mut initial = Vec::new();
    for a in &tl.allocations {
        if let Some(end) = a.end {
            frees[tl.event_positions[end]] = true;
        }
        if a.alive_at_start {
            let category = tl.categories.get(a.category as usize).and_then(|c| Category::parse(c)).unwrap_or(Category::Unknown);
            initial.push((a.addr, a.size, category, a.stack));
        }
    }
    let mut marks: Vec<(i64, Phase, u32)> = snap
        .external_annotations
        .iter()
        .filter(|a| a.device == d as i64)
        .filter_map(|a| {
            let (phase, step) = Phase::of_annotation(&a.name)?;
            Some(match a.stage {
                AnnotationStage::Start => (a.time_us, phase, step),
                AnnotationStage::End => (a.time_us, Phase::Other, step),
            })
        })
        .collect();
    // An end and the next start at the same time: the start wins by coming last.
    marks.sort_by_key(|m| (m.0, m.1 != Phase::Other));
    let mut marks = marks.into_iter().peekable();

    let device = d as u8;
    let (mut phase, mut step) = (Phase::Other, 0u32);
    let mut out = Vec::new();
    let mut batch = Batch { events: Vec::with_capacity(BATCH_EVENTS), ..Batch::default() };
    let mut sent = 0u64;
    let mut categories = ByText::default();
    let event = |t_ns, addr, size, stream, action, phase, step, scope, category| MemEvent { t_ns, addr, size, stream, step, scope, action, phase, device, category };
    for (addr, size, category, stack) in initial {
        let scope = scopes.of(snap, stack, &mut batch.scopes);
        batch.events.push(event(0, addr, size, 0, Action::Alloc, Phase::Other, 0, scope, category));
    }
    for (i, e) in trace.iter().enumerate() {
        let t_ns = clock.t_ns(i, e.time_us);
        while let Some((_, p, s)) = marks.next_if(|m| clock.timed && m.0 <= e.time_us) {
            (phase, step) = (p, s);
            batch.marks.push(PhaseMark { seq: sent + batch.events.len() as u64, t_ns, step, phase });
        }
        let category = categories.get(e.category.as_deref(), |text| text.and_then(Category::parse).unwrap_or(Category::Unknown));
        let scope = if e.action == Action::Alloc { scopes.of(snap, e.frames, &mut batch.scopes) } else { 0 };
        let mut push = |action| batch.events.push(event(t_ns, e.addr, e.size, e.stream, action, phase, step, scope, category));
        match FreeRole::of(e.action, frees[i]) {
            FreeRole::Deferred => {}
            FreeRole::Implied => {
                push(Action::FreeRequested);
                push(Action::FreeCompleted);
            }
            FreeRole::AsIs => push(e.action),
        }
        if batch.events.len() >= BATCH_EVENTS {
            let stamp = batch.events.last().map(|e| e.t_ns).unwrap_or(0);
            sent += batch.events.len() as u64;
            let next = Batch { first_seq: sent, events: Vec::with_capacity(BATCH_EVENTS), ..Batch::default() };
            out.push((stamp, Incoming::Batch(std::mem::replace(&mut batch, next))));
        }
    }
    if !batch.events.is_empty() {
        let stamp = batch.events.last().map(|e| e.t_ns).unwrap_or(0);
        out.push((stamp, Incoming::Batch(batch)));
    }
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
        let items = trace_items(&snap, 0);
        let Incoming::Batch(b) = &items[0].1 else { panic!("batch first") };
        assert_eq!(b.events[0].category, Category::Activation);
        assert_eq!((b.events[0].phase, b.events[0].t_ns), (Phase::Other, 0));
        assert_eq!((b.events[1].phase, b.events[1].step, b.events[1].t_ns), (Phase::Backward, 2, 20_000));
        assert_eq!(b.events[1].category, Category::Unknown);
        assert_eq!(b.marks, vec![PhaseMark { seq: 1, t_ns: 20_000, step: 2, phase: Phase::Backward }]);
        assert_eq!(items.last().unwrap().1, Incoming::Report(Report::Finished));
        assert_eq!(Phase::of_annotation("optimizer (step 12)"), Some((Phase::Optimizer, 12)));
        assert_eq!(Phase::of_annotation("my_region"), None);
    }

    #[test]
    fn each_device_plays_as_its_own_stream_the_chosen_one_first_named_by_its_frames() {
        use crate::snapshot::model::Frame;
        let mut snap = Snapshot::default();
        let mut interner = crate::snapshot::model::StackInterner::default();
        let f = interner.frame(&mut snap, Frame { name: "forward".into(), filename: "train.py".into(), line: 12 });
        let stack = interner.stack(&mut snap, vec![f]);
        let entry = |action, addr, time_us| {
            let mut e = TraceEntry::new(action, addr, 1 << 20);
            e.time_us = time_us;
            e.frames = stack;
            e
        };
        snap.device_traces = vec![
            vec![entry(Action::Alloc, 0x10, 5), entry(Action::FreeRequested, 0x10, 6), entry(Action::FreeCompleted, 0x10, 6)],
            vec![entry(Action::Alloc, 0x20, 1), entry(Action::Alloc, 0x30, 7)],
        ];
        let items = trace_items(&snap, 1);
        let batches: Vec<&Batch> = items.iter().filter_map(|(_, i)| if let Incoming::Batch(b) = i { Some(b) } else { None }).collect();
        for b in &batches {
            assert!(b.events.iter().all(|e| e.device == b.events[0].device), "a batch never mixes devices");
        }
        let first: Vec<(u8, u64)> = batches.iter().map(|b| (b.events[0].device, b.first_seq)).collect();
        assert_eq!(first, [(1, 0), (0, 0)], "device 1 first, each numbered from 0");
        assert_eq!(batches[0].scopes, vec![(1, "forward (train.py:12)".to_string())]);
        assert!(batches.iter().flat_map(|b| &b.events).filter(|e| e.action == Action::Alloc).all(|e| e.scope == 1));
    }
}
