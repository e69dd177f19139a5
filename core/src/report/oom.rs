//! Why an allocation ran out of memory, from a trace's `oom` entry (what PyTorch records
//! when it raises OutOfMemoryError, before any OOM handler dumps a snapshot): what was
//! requested, what the device had free, reserved against allocated then, whether the free
//! memory would have held the request in one piece, and what was alive by call site and
//! category. The allocator model replays the trace up to there for what the trace does
//! not say (allocated bytes, the largest free block).

use serde::Serialize;

use super::breakdown::{breakdown_of, has_categories, Breakdown};
use crate::allocator::replay::{
    feed_trace, oom_capacity, reserved_before_trace, reserved_change, state_before_trace,
};
use crate::allocator::{AllocatorConfig, CachingAllocatorModel, ModelOp};
use crate::format::bytes;
use crate::snapshot::model::{Action, Snapshot};
use crate::snapshot::timeline::Timeline;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// Memory was free (cached by the allocator plus free on the device) to hold the
    /// request, but not in one piece.
    Fragmentation,
    /// Allocated memory and the request together exceed what the allocator could have.
    TooMuchAlive,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OomReport {
    /// Position of the `oom` entry in the device's trace.
    pub entry: usize,
    /// The timeline action after the OOM (where the viewer marks it).
    pub action: usize,
    pub time_us: i64,
    /// Bytes requested (rounded as the allocator rounds them).
    pub requested_bytes: u64,
    /// What the device still had free (`cudaMemGetInfo`).
    pub device_free_bytes: u64,
    /// Reserved by the allocator then, from the recording's segment events.
    pub reserved_bytes: u64,
    /// Held by allocations then (block sizes).
    pub allocated_bytes: u64,
    /// Reserved but not allocated.
    pub cached_free_bytes: u64,
    /// The largest block free in the allocator's cache then.
    pub largest_free_block_bytes: u64,
    pub cause: Cause,
    /// Whether the allocator model reproduced the recording up to here, so that the
    /// allocated bytes and largest free block are the allocator's own (else the model's
    /// reconstruction).
    pub modelled_exactly: bool,
    /// Requested bytes alive then, by the allocating call site, and by category when the
    /// file names categories.
    pub by_top_frame: Breakdown,
    pub by_category: Option<Breakdown>,
}

impl OomReport {
    /// Free memory in any piece: cached in the allocator plus free on the device.
    pub fn free_bytes(&self) -> u64 {
        self.cached_free_bytes + self.device_free_bytes
    }

    /// What the allocator could have held in all: reserved plus free on the device.
    pub fn capacity_bytes(&self) -> u64 {
        self.reserved_bytes + self.device_free_bytes
    }

    /// One sentence: why the request failed.
    pub fn verdict(&self) -> String {
        match self.cause {
            Cause::Fragmentation => format!(
                "fragmentation: {} was free in all ({} cached by the allocator, {} on the device), \
                 but the largest free block was {}",
                bytes(self.free_bytes()),
                bytes(self.cached_free_bytes),
                bytes(self.device_free_bytes),
                bytes(self.largest_free_block_bytes)
            ),
            Cause::TooMuchAlive => format!(
                "too much alive: {} allocated plus the {} requested exceed the {} the allocator \
                 could have (reserved + free) by {}",
                bytes(self.allocated_bytes),
                bytes(self.requested_bytes),
                bytes(self.capacity_bytes()),
                bytes(self.allocated_bytes + self.requested_bytes - self.capacity_bytes())
            ),
        }
    }
}

/// (trace position, the timeline action after it) of each `oom` entry on `device`'s
/// trace: cheap, for marking them before a report is asked for.
pub fn oom_marks(snap: &Snapshot, tl: &Timeline, device: usize) -> Vec<(usize, usize)> {
    let trace: &[_] = snap.device_traces.get(device).map_or(&[], Vec::as_slice);
    trace
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action == Action::Oom)
        .map(|(pos, _)| (pos, tl.event_positions.partition_point(|&p| p < pos)))
        .collect()
}

/// The OOMs on `device`'s trace, in order (none without `oom` entries). `tl` is the
/// device's timeline.
pub fn oom_reports(snap: &Snapshot, tl: &Timeline, device: usize) -> Vec<OomReport> {
    let trace: &[_] = snap.device_traces.get(device).map_or(&[], Vec::as_slice);
    let marks = oom_marks(snap, tl, device);
    let Some(&(last, _)) = marks.last() else {
        return Vec::new();
    };
    let cfg = snap
        .allocator_settings
        .as_ref()
        .map(AllocatorConfig::from_settings)
        .unwrap_or_default();
    let mut model = CachingAllocatorModel::from_segments(cfg.clone(), &state_before_trace(snap, device, &cfg));
    model.set_capacity(oom_capacity(snap, device));
    let mut reserved = reserved_before_trace(snap, device) as i128;
    let mut exact = true;
    let mut out = Vec::new();
    feed_trace(&mut model, trace, true, |m, pos, ops, ok| {
        let e = &trace[pos];
        reserved += reserved_change(e);
        match e.action {
            Action::Alloc => exact &= ops.iter().any(|op| matches!(*op, ModelOp::Alloc { addr, .. } if addr == e.addr)),
            Action::Oom => {
                let st = m.stats();
                let reserved = reserved.max(0) as u64;
                let modelled_exactly = exact && !ok && st.reserved_bytes == reserved;
                let action = marks[out.len()].1;
                // Allocated before the OOM and not freed before it.
                let alive = || {
                    tl.allocations
                        .iter()
                        .filter(move |a| (a.alive_at_start || a.start < action) && a.end.is_none_or(|end| end >= action))
                };
                let allocated = st.allocated_bytes.min(reserved);
                let cached_free = reserved - allocated;
                let fits_in_free = e.size <= cached_free + e.addr;
                out.push(OomReport {
                    entry: pos,
                    action,
                    time_us: e.time_us,
                    requested_bytes: e.size,
                    device_free_bytes: e.addr,
                    reserved_bytes: reserved,
                    allocated_bytes: allocated,
                    cached_free_bytes: cached_free,
                    largest_free_block_bytes: m.largest_free_block(),
                    cause: if fits_in_free { Cause::Fragmentation } else { Cause::TooMuchAlive },
                    modelled_exactly,
                    by_top_frame: breakdown_of(snap, tl, alive(), action, false),
                    by_category: has_categories(tl).then(|| breakdown_of(snap, tl, alive(), action, true)),
                });
            }
            _ => {}
        }
        pos < last
    });
    out
}

/// The report as lines for a terminal (the first lines of `view --summary`).
pub fn write_text(out: &mut impl std::io::Write, r: &OomReport, groups: usize) -> std::io::Result<()> {
    writeln!(
        out,
        "OUT OF MEMORY    at trace entry {} (before action {}): {} requested; the device had {} free",
        r.entry,
        r.action,
        bytes(r.requested_bytes),
        bytes(r.device_free_bytes)
    )?;
    let how = if r.modelled_exactly { "" } else { " (allocated and largest free block reconstructed by the model)" };
    writeln!(
        out,
        "  then           reserved {}, allocated {}, reserved but unallocated {}, largest free block {}{how}",
        bytes(r.reserved_bytes),
        bytes(r.allocated_bytes),
        bytes(r.cached_free_bytes),
        bytes(r.largest_free_block_bytes)
    )?;
    writeln!(out, "  why            {}", r.verdict())?;
    for b in std::iter::once(&r.by_top_frame).chain(&r.by_category) {
        writeln!(out, "  alive by {}:", b.by.replace('_', " "))?;
        for g in b.groups.iter().take(groups) {
            writeln!(out, "    {}", g.row())?;
        }
    }
    Ok(())
}
