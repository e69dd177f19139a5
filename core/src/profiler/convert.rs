//! A torch.profiler trace as a memory snapshot, so every view of a snapshot works on it.
//! - Each `[memory]` event is an alloc or a free on its device: CUDA devices by their id,
//!   the CPU as the snapshot's host device.
//! - Each event's frames are the spans enclosing it on its thread, innermost first:
//!   operators, Python functions (`with_stack`), annotations, `ProfilerStep#N`.
//! - `ProfilerStep#N` gives step annotations, and the optimizer's annotations and autograd's
//!   operators give vramscope's phase annotations (`forward (step N)`, ...).
//!
//! The trace covers only the profiled window. Memory live before it is one block "before the
//! profiled window", sized from the allocator's `Total Allocated` where the trace has it, and
//! a block of its own for each one the window frees. Traces without addresses (2021) pair a
//! free with the latest live allocation of its size.

use std::collections::{BTreeMap, HashMap};

use super::blocks::{made_up, one_block_segment, SYNTHETIC_BASE};
use super::parse::{Device, MemoryEvent, Span, SpanKind, Trace};
use crate::event::Phase;
use crate::snapshot::model::{
    Action, Annotation, AnnotationStage, Frame, ProfiledWindow, Segment, Snapshot, StackId,
    StackInterner, TraceEntry,
};

/// The frames of each memory event (by index into `trace.memory`), innermost first.
fn enclosing_spans(trace: &Trace, order: &[usize]) -> Vec<Vec<u32>> {
    let mut spans_by_tid: HashMap<u64, Vec<&Span>> = HashMap::new();
    for s in &trace.spans {
        spans_by_tid.entry(s.tid).or_default().push(s);
    }
    for v in spans_by_tid.values_mut() {
        // Outer spans first where two begin together.
        v.sort_by(|a, b| a.ts.total_cmp(&b.ts).then(b.end.total_cmp(&a.end)));
    }
    let mut out = vec![Vec::new(); trace.memory.len()];
    let mut cursor: HashMap<u64, (usize, Vec<usize>)> = HashMap::new();
    for &i in order {
        let e = &trace.memory[i];
        let Some(spans) = spans_by_tid.get(&e.tid) else { continue };
        let (next, open) = cursor.entry(e.tid).or_default();
        while *next < spans.len() && spans[*next].ts <= e.ts {
            while open.last().is_some_and(|&o| spans[o].end < spans[*next].ts) {
                open.pop();
            }
            open.push(*next);
            *next += 1;
        }
        while open.last().is_some_and(|&o| spans[o].end < e.ts) {
            open.pop();
        }
        out[i] = open.iter().rev().map(|&o| spans[o]).filter(|s| s.ts <= e.ts && e.ts <= s.end).map(|s| s.name).collect();
    }
    out
}

/// `path/file.py(13): name` as a frame; anything else is a frame named as the span is.
fn frame_of(name: &str, kind: SpanKind) -> Frame {
    if kind == SpanKind::Python {
        if let Some((place, func)) = name.split_once("): ") {
            if let Some((file, line)) = place.rsplit_once('(') {
                return Frame { name: func.to_string(), filename: file.to_string(), line: line.parse().unwrap_or(0) };
            }
        }
    }
    Frame { name: name.to_string(), filename: String::new(), line: 0 }
}

/// One device's allocations, as trace entries and the blocks alive before and after.
struct DeviceLog {
    entries: Vec<TraceEntry>,
    /// Blocks the window frees without having allocated them (address, size).
    before: Vec<(u64, u64)>,
    /// Blocks alive at the end (address, size, stack).
    after: Vec<(u64, u64, StackId)>,
    /// Live before the window, where the trace states the allocator's total.
    total_before: Option<i64>,
}

fn device_log(trace: &Trace, events: &[usize], stacks: &[StackId], synthetic: &mut u64) -> DeviceLog {
    let mut live: BTreeMap<u64, (u64, StackId)> = BTreeMap::new();
    // Traces without addresses: the live allocations of each size, latest last.
    let mut by_size: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut log = DeviceLog { entries: Vec::new(), before: Vec::new(), after: Vec::new(), total_before: None };
    for (k, &i) in events.iter().enumerate() {
        let e: &MemoryEvent = &trace.memory[i];
        if k == 0 {
            log.total_before = e.total_allocated.map(|t| t - e.bytes);
        }
        let size = e.bytes.unsigned_abs();
        let entry = |action, addr| TraceEntry { time_us: e.ts as i64, frames: stacks[i], ..TraceEntry::new(action, addr, size) };
        if e.bytes > 0 {
            let addr = e.addr.unwrap_or_else(|| {
                let a = made_up(synthetic, size);
                by_size.entry(size).or_default().push(a);
                a
            });
            // A block allocated again without its free: the free went unrecorded.
            if let Some((old, _)) = live.remove(&addr) {
                log.entries.push(entry(Action::FreeCompleted, addr));
                log.entries.last_mut().expect("pushed").size = old;
            }
            live.insert(addr, (size, stacks[i]));
            log.entries.push(entry(Action::Alloc, addr));
        } else if e.bytes < 0 {
            let addr = match e.addr {
                Some(a) => Some(a),
                None => by_size.get_mut(&size).and_then(Vec::pop),
            };
            let addr = match addr.filter(|a| live.remove(a).is_some()) {
                Some(a) => a,
                None => {
                    let a = e.addr.unwrap_or_else(|| made_up(synthetic, size));
                    log.before.push((a, size));
                    a
                }
            };
            log.entries.push(entry(Action::FreeCompleted, addr));
        }
    }
    log.after = live.into_iter().map(|(a, (s, st))| (a, s, st)).collect();
    log
}

/// The phases of one profiled step, from what ran inside it: autograd's operators are
/// backward, the optimizer's annotations its step and zero_grad, and what comes before
/// backward is forward.
fn step_phases(trace: &Trace, step: &Span) -> Vec<(Phase, f64, f64)> {
    let within = |s: &&Span| s.ts >= step.ts && s.end <= step.end;
    let name = |s: &Span| trace.names[s.name as usize].as_str();
    let range = |f: &dyn Fn(&Span) -> bool| {
        trace.spans.iter().filter(within).filter(|s| f(s)).fold(None, |acc: Option<(f64, f64)>, s| {
            Some(acc.map_or((s.ts, s.end), |(a, b)| (a.min(s.ts), b.max(s.end))))
        })
    };
    let backward = range(&|s| s.kind == SpanKind::Op && (name(s).starts_with("autograd::engine::evaluate_function") || name(s).starts_with("torch::autograd::")));
    // Annotations; 2021 traces file them with the operators.
    let optimizer = range(&|s| name(s).starts_with("Optimizer.step#"));
    let zero_grad = range(&|s| name(s).starts_with("Optimizer.zero_grad#"));
    let forward_end = [backward, optimizer, zero_grad].iter().flatten().map(|r| r.0).fold(step.end, f64::min);
    let mut out = vec![(Phase::Forward, step.ts, forward_end)];
    out.extend([(Phase::Backward, backward), (Phase::Optimizer, optimizer), (Phase::ZeroGrad, zero_grad)].into_iter().filter_map(|(p, r)| r.map(|(a, b)| (p, a, b))));
    out
}

/// The snapshot of a trace with memory events. `Err` names what is missing.
pub fn to_snapshot(trace: &Trace) -> Result<Snapshot, String> {
    if trace.memory.is_empty() {
        return Err("the trace has no memory events: profile with `torch.profiler.profile(profile_memory=True)`".into());
    }
    let mut order: Vec<usize> = (0..trace.memory.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&trace.memory[a], &trace.memory[b]);
        x.ts.total_cmp(&y.ts).then(x.order.cmp(&y.order)).then(a.cmp(&b))
    });
    let mut snap = Snapshot::default();
    let mut interner = StackInterner::default();
    interner.stack(&mut snap, Vec::new());
    let names = enclosing_spans(trace, &order);
    let kinds: HashMap<u32, SpanKind> = trace.spans.iter().map(|s| (s.name, s.kind)).collect();
    let mut stacks = vec![0; trace.memory.len()];
    let mut operator_frames = std::collections::BTreeSet::new();
    for (i, spans) in names.iter().enumerate() {
        let frames = spans
            .iter()
            .map(|n| {
                let id = interner.frame(&mut snap, frame_of(&trace.names[*n as usize], kinds[n]));
                if kinds[n] == SpanKind::Op {
                    operator_frames.insert(id);
                }
                id
            })
            .collect();
        stacks[i] = interner.stack(&mut snap, frames);
    }
    let before_frame = interner.frame(&mut snap, Frame { name: "allocated before the profiled window".into(), filename: String::new(), line: 0 });
    let before_stack = interner.stack(&mut snap, vec![before_frame]);

    let mut by_device: BTreeMap<Device, Vec<usize>> = BTreeMap::new();
    for &i in &order {
        by_device.entry(trace.memory[i].device).or_default().push(i);
    }
    let cuda_count = by_device.keys().filter_map(|d| if let Device::Cuda(n) = d { Some(*n as usize + 1) } else { None }).max().unwrap_or(0);
    snap.device_traces = vec![Vec::new(); cuda_count];
    let mut synthetic = SYNTHETIC_BASE;
    let mut window = ProfiledWindow {
        totals: trace.memory.iter().any(|e| e.total_allocated.is_some()),
        operator_frames: operator_frames.into_iter().collect(),
        ..ProfiledWindow::default()
    };
    for (device, events) in &by_device {
        let index = match device {
            Device::Cuda(n) => *n as usize,
            Device::Cpu => cuda_count,
        };
        if let Some(r) = events.iter().filter_map(|&i| trace.memory[i].total_reserved).max() {
            window.peak_reserved.push((index, r.max(0) as u64));
        }
        let log = device_log(trace, events, &stacks, &mut synthetic);
        let ordinal = match device {
            Device::Cuda(n) => *n as i64,
            Device::Cpu => -1,
        };
        let mut segments: Vec<Segment> = log.after.iter().map(|&(a, s, st)| one_block_segment(ordinal, a, s, st)).collect();
        // Live through the whole window: what the allocator held before it, less what the
        // window frees of that.
        let freed_before: u64 = log.before.iter().map(|b| b.1).sum();
        let kept = log.total_before.map_or(0, |t| (t.max(0) as u64).saturating_sub(freed_before));
        if kept > 0 {
            segments.push(one_block_segment(ordinal, made_up(&mut synthetic, kept), kept, before_stack));
        }
        match device {
            Device::Cuda(n) => {
                snap.device_traces[*n as usize] = log.entries;
                snap.segments.extend(segments);
            }
            Device::Cpu => {
                snap.host_trace = log.entries;
                snap.host_segments = segments;
            }
        }
    }
    // Step and phase annotations on every device shown.
    let mut steps: Vec<&Span> = trace.spans.iter().filter(|s| s.kind == SpanKind::Step).collect();
    steps.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    for device in 0..snap.device_count() as i64 {
        for step in &steps {
            let label = &trace.names[step.name as usize];
            let n = label.trim_start_matches("ProfilerStep#");
            let mut marks = vec![(label.clone(), step.ts, step.end)];
            marks.extend(step_phases(trace, step).into_iter().map(|(p, a, b)| (p.annotation(n), a, b)));
            for (name, a, b) in marks {
                snap.external_annotations.push(Annotation { name: name.clone(), stage: AnnotationStage::Start, device, time_us: a as i64 });
                snap.external_annotations.push(Annotation { name, stage: AnnotationStage::End, device, time_us: b as i64 });
            }
        }
    }
    snap.external_annotations.sort_by_key(|a| a.time_us);
    window.steps = steps.iter().filter_map(|s| trace.names[s.name as usize].trim_start_matches("ProfilerStep#").parse().ok()).collect();
    snap.profiled = Some(window);
    Ok(snap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiler::parse::read;

    fn mem(ts: f64, bytes: i64, addr: Option<u64>, total: Option<i64>) -> String {
        let addr = addr.map_or(String::new(), |a| format!(r#", "Addr": {a}"#));
        let total = total.map_or(String::new(), |t| format!(r#", "Total Allocated": {t}"#));
        format!(r#"{{"ph": "i", "name": "[memory]", "tid": 1, "ts": {ts}, "args": {{"Device Type": 0, "Device Id": -1, "Bytes": {bytes}{addr}{total}}}}}"#)
    }

    fn span(cat: &str, name: &str, ts: f64, dur: f64) -> String {
        format!(r#"{{"ph": "X", "cat": "{cat}", "name": "{name}", "tid": 1, "ts": {ts}, "dur": {dur}}}"#)
    }

    fn snapshot(events: &[String]) -> Snapshot {
        let json = format!(r#"{{"traceEvents": [{}]}}"#, events.join(","));
        to_snapshot(&trace(json.as_bytes())).unwrap()
    }

    fn trace(json: &[u8]) -> Trace {
        match read(json).unwrap() {
            crate::profiler::parse::Parsed::Trace(t) => t,
            other => panic!("not a trace: {other:?}"),
        }
    }

    #[test]
    fn allocations_get_the_frames_of_the_spans_around_them_and_memory_before_the_window_a_block() {
        let s = snapshot(&[
            span("user_annotation", "ProfilerStep#3", 0.0, 100.0),
            span("python_function", "train.py(12): step", 1.0, 50.0),
            span("cpu_op", "aten::addmm", 5.0, 10.0),
            mem(6.0, 256, Some(4096), Some(1256)),
            mem(20.0, -1000, Some(64), Some(256)),
            mem(30.0, -256, Some(4096), Some(0)),
        ]);
        let host = s.host_device().expect("CPU memory is the host's");
        assert_eq!(s.device_name(host), "host");
        let t = s.trace(host);
        assert_eq!(t.iter().map(|e| (e.action, e.addr, e.size)).collect::<Vec<_>>(), [(Action::Alloc, 4096, 256), (Action::FreeCompleted, 64, 1000), (Action::FreeCompleted, 4096, 256)]);
        let frames: Vec<_> = s.stack(t[0].frames).map(|f| (f.name.as_str(), f.filename.as_str(), f.line)).collect();
        assert_eq!(frames, [("aten::addmm", "", 0), ("step", "train.py", 12), ("ProfilerStep#3", "", 0)]);
        // 1000 live before the window (the first event's total less its bytes), all freed in it.
        assert!(s.host_segments.is_empty(), "nothing is alive at the end");
        let names: Vec<_> = s.external_annotations.iter().map(|a| a.name.as_str()).collect();
        assert!(names.contains(&"ProfilerStep#3") && names.contains(&"forward (step 3)"), "{names:?}");
    }

    #[test]
    fn without_addresses_a_free_takes_the_latest_allocation_of_its_size() {
        let s = snapshot(&[mem(1.0, 64, None, None), mem(2.0, 64, None, None), mem(3.0, -64, None, None), mem(4.0, -32, None, None)]);
        let t = s.trace(s.host_device().unwrap());
        assert_eq!(t[2].addr, t[1].addr, "the latest 64-byte allocation");
        assert_eq!(s.host_segments.len(), 1, "the first allocation is alive at the end");
        assert_eq!(s.host_segments[0].address, t[0].addr);
        assert_ne!(t[3].addr, t[0].addr, "a free of a size never allocated in the window was allocated before it");
    }

    #[test]
    fn cuda_devices_keep_their_ids_and_a_trace_without_memory_says_how_to_get_it() {
        let json = r#"{"traceEvents": [{"ph": "i", "name": "[memory]", "tid": 1, "ts": 1, "args": {"Device Type": 1, "Device Id": 1, "Bytes": 512, "Addr": 8}}]}"#;
        let s = to_snapshot(&trace(json.as_bytes())).unwrap();
        assert_eq!(s.device_traces.len(), 2);
        assert_eq!(s.device_traces[1].len(), 1);
        assert_eq!(s.default_device(), 1);
        let none = to_snapshot(&trace(br#"{"traceEvents": []}"#)).unwrap_err();
        assert!(none.contains("profile_memory=True"), "{none}");
    }
}
