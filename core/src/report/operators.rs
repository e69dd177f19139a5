//! The per-operator memory table of a torch.profiler trace, as the TensorBoard plugin's
//! memory view has it: for each operator, what was allocated and freed inside it, by the
//! operator itself ("self": it is the innermost operator around the event) and including the
//! operators it called, and what it holds at the device's peak.

use std::collections::HashMap;

use serde::Serialize;

use crate::snapshot::model::{Action, FrameId, Snapshot};
use crate::snapshot::timeline::Timeline;

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct OperatorRow {
    pub name: String,
    pub allocations: u64,
    pub self_allocations: u64,
    pub allocated_bytes: u64,
    pub self_allocated_bytes: u64,
    pub freed_bytes: u64,
    pub self_freed_bytes: u64,
    /// Allocated less freed, inside the operator and what it called.
    pub increase_bytes: i64,
    pub self_increase_bytes: i64,
    /// Bytes its own allocations hold at the device's peak.
    pub at_peak_bytes: u64,
}

/// The table for `device`, largest self increase first; empty for a file that is not a
/// trace.
pub fn operator_table(snap: &Snapshot, tl: &Timeline, device: usize) -> Vec<OperatorRow> {
    let Some(window) = &snap.profiled else { return Vec::new() };
    let is_op = |f: &FrameId| window.operator_frames.binary_search(f).is_ok();
    let mut rows: HashMap<FrameId, OperatorRow> = HashMap::new();
    // The operators around a stack, innermost first.
    let ops_of = |stack: u32| snap.stacks.get(stack as usize).into_iter().flatten().copied().filter(is_op).collect::<Vec<FrameId>>();
    for e in snap.trace(device) {
        let alloc = match e.action {
            Action::Alloc => true,
            Action::FreeCompleted => false,
            _ => continue,
        };
        let ops = ops_of(e.frames);
        let mut seen = Vec::with_capacity(ops.len());
        for (depth, f) in ops.into_iter().enumerate() {
            // Recursion (an op inside itself) counts once per event.
            if seen.contains(&f) {
                continue;
            }
            seen.push(f);
            let r = rows.entry(f).or_default();
            match (alloc, depth == 0) {
                (true, own) => {
                    r.allocations += 1;
                    r.allocated_bytes += e.size;
                    if own {
                        r.self_allocations += 1;
                        r.self_allocated_bytes += e.size;
                    }
                }
                (false, own) => {
                    r.freed_bytes += e.size;
                    if own {
                        r.self_freed_bytes += e.size;
                    }
                }
            }
        }
    }
    for a in tl.allocations.iter().filter(|a| tl.total_events > 0 && a.alive_at(tl.peak_index)) {
        if let Some(f) = ops_of(a.stack).first() {
            rows.entry(*f).or_default().at_peak_bytes += a.size;
        }
    }
    let mut out: Vec<OperatorRow> = rows
        .into_iter()
        .map(|(f, mut r)| {
            r.name = snap.frames[f as usize].name.clone();
            r.increase_bytes = r.allocated_bytes as i64 - r.freed_bytes as i64;
            r.self_increase_bytes = r.self_allocated_bytes as i64 - r.self_freed_bytes as i64;
            r
        })
        .collect();
    out.sort_by(|a, b| b.self_increase_bytes.cmp(&a.self_increase_bytes).then(b.self_allocated_bytes.cmp(&a.self_allocated_bytes)).then(a.name.cmp(&b.name)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_and_children_bytes_follow_the_operators_around_each_event() {
        let json = r#"{"traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "tid": 1, "ts": 0, "dur": 10},
            {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "tid": 1, "ts": 1, "dur": 5},
            {"ph": "i", "name": "[memory]", "tid": 1, "ts": 2, "args": {"Device Type": 0, "Bytes": 1000, "Addr": 16}},
            {"ph": "i", "name": "[memory]", "tid": 1, "ts": 7, "args": {"Device Type": 0, "Bytes": 24, "Addr": 32}},
            {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "tid": 1, "ts": 20, "dur": 5},
            {"ph": "i", "name": "[memory]", "tid": 1, "ts": 21, "args": {"Device Type": 0, "Bytes": 1000, "Addr": 48}},
            {"ph": "i", "name": "[memory]", "tid": 1, "ts": 22, "args": {"Device Type": 0, "Bytes": -1000, "Addr": 16}}
        ]}"#;
        let snap = crate::profiler::read_from(b"", json.as_bytes()).unwrap();
        let device = snap.host_device().unwrap();
        let tl = Timeline::from_snapshot(&snap, device);
        let t = operator_table(&snap, &tl, device);
        let row = |n: &str| t.iter().find(|r| r.name == n).cloned().unwrap();
        let (linear, addmm, relu) = (row("aten::linear"), row("aten::addmm"), row("aten::relu"));
        assert_eq!((addmm.self_allocations, addmm.self_allocated_bytes, addmm.allocated_bytes), (1, 1000, 1000));
        assert_eq!((linear.self_allocated_bytes, linear.allocated_bytes, linear.allocations), (24, 1024, 2), "its own 24 B and addmm's 1000");
        assert_eq!((relu.self_allocated_bytes, relu.self_freed_bytes, relu.self_increase_bytes), (1000, 1000, 0));
        // The peak (2024 B) holds addmm's 1000, linear's 24 and relu's 1000.
        assert_eq!((addmm.at_peak_bytes, linear.at_peak_bytes, relu.at_peak_bytes), (1000, 24, 1000));
        assert_eq!(t[0].name, "aten::addmm", "largest self increase first");
    }
}
