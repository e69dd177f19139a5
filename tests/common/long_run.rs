//! A long training run's trace, made up: steps that each allocate activations of many
//! sizes and free them in reverse, as a forward and backward pass do. Shared by the
//! viewer's tests and benchmarks (`#[path]`), so both load the screen the same way.

use vramscope_core::snapshot::model::{Action, Snapshot, TraceEntry};

/// A device-0 trace of `entries` entries or a few more (alloc, free_requested and
/// free_completed per allocation), 1 µs apart.
pub fn long_run(entries: usize) -> Snapshot {
    const PER_STEP: u64 = 48;
    let mut trace = Vec::with_capacity(entries + 3 * PER_STEP as usize);
    let mut step = 0u64;
    while trace.len() < entries {
        let sizes: Vec<u64> = (0..PER_STEP).map(|i| ((i * 7 + step) % 37 + 1) * (64 << 10) + if i % 16 == 0 { 8 << 20 } else { 0 }).collect();
        // Each step's blocks sit at fresh addresses, as a caching allocator hands out
        // blocks that were split differently.
        let base = 0x7f00_0000_0000 + (step % 64) * (1 << 32);
        let addr = |i: u64| base + i * (16 << 20);
        for (i, &size) in sizes.iter().enumerate() {
            trace.push(TraceEntry::new(Action::Alloc, addr(i as u64), size));
        }
        for (i, &size) in sizes.iter().enumerate().rev() {
            trace.push(TraceEntry::new(Action::FreeRequested, addr(i as u64), size));
            trace.push(TraceEntry::new(Action::FreeCompleted, addr(i as u64), size));
        }
        step += 1;
    }
    for (t, e) in trace.iter_mut().enumerate() {
        e.time_us = t as i64;
    }
    // Stack 0, the empty one every entry names, so the snapshot can be written too.
    Snapshot { device_traces: vec![trace], stacks: vec![Vec::new()], ..Snapshot::default() }
}
