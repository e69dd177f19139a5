//! What a snapshot says, as plain data: peaks, the largest allocations and their frames,
//! segment occupancy and fragmentation, bytes by category. The viewer's panels and
//! `view --summary` both read these; nothing here draws.

use serde::Serialize;

use super::frames::shown_frames;
use super::oom::{oom_reports, OomReport};
use crate::allocator::config::{round_size, AllocatorConfig};
use crate::allocator::replay::{reserved_before_trace, reserved_change};
use crate::snapshot::model::{Action, AnnotationStage, BlockState, RuleCoverage, Segment, Skipped, Snapshot, TraceForm};
use crate::snapshot::timeline::Timeline;

// Part of what the summary shows, so the viewer finds them here.
use super::breakdown::{breakdown_at_peak, has_categories, Breakdown};
use super::frames::{top_frame_label, ShownFrame};

/// One allocation of the timeline, described for a person.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AllocationInfo {
    /// Index into `Timeline::allocations`.
    pub id: u32,
    pub address: u64,
    /// Block bytes: the segment's block when it is still there, else the request rounded
    /// the way the allocator rounds.
    pub size: u64,
    pub requested_size: u64,
    /// Timeline action index of the alloc; None when alive since before the trace.
    pub start_event: Option<usize>,
    /// Action index of the free; None when alive at the end.
    pub end_event: Option<usize>,
    pub start_time_us: Option<i64>,
    pub end_time_us: Option<i64>,
    pub alive_at_peak: bool,
    pub category: Option<String>,
    pub top_frame: Option<String>,
    /// Innermost first, noise dropped and repeats merged.
    pub frames: Vec<ShownFrame>,
    /// What newer PyTorch records with the alloc (`torch.compile` region, the user's
    /// `_set_memory_metadata`, a memory pool other than the default), when present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compile_context: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_metadata: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<(i64, i64)>,
    /// The forward op's frames behind a block made in backward (its `forward_frames`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub forward_frames: Vec<ShownFrame>,
}

/// Time (µs) of a timeline action.
pub fn event_time(snap: &Snapshot, tl: &Timeline, device: usize, event: usize) -> Option<i64> {
    let pos = *tl.event_positions.get(event)?;
    snap.trace(device).get(pos).map(|e| e.time_us)
}

/// Block size of `addr` in the final segments when active there.
fn final_block_size(snap: &Snapshot, device: usize, addr: u64) -> Option<u64> {
    snap.device_segments(device)
        .filter(|s| (s.address..s.address + s.total_size).contains(&addr))
        .flat_map(|s| &s.blocks)
        .find(|b| b.address == addr && b.state.is_active())
        .map(|b| b.size)
}

/// The trace entry that made an allocation (none for blocks older than the trace).
fn alloc_entry<'s>(snap: &'s Snapshot, tl: &Timeline, device: usize, id: u32) -> Option<(usize, &'s crate::snapshot::model::TraceEntry)> {
    let a = &tl.allocations[id as usize];
    if a.alive_at_start {
        return None;
    }
    let pos = *tl.event_positions.get(a.start)?;
    snap.trace(device).get(pos).filter(|e| e.action == Action::Alloc).map(|e| (pos, e))
}

pub fn allocation_info(snap: &Snapshot, tl: &Timeline, device: usize, id: u32, all_frames: bool) -> AllocationInfo {
    let a = &tl.allocations[id as usize];
    let entry = alloc_entry(snap, tl, device, id);
    let text = |t: Option<&crate::snapshot::model::Text>| t.map(|t| t.to_string()).filter(|t| !t.is_empty() && t != "N/A");
    let forward = snap
        .device_segments(device)
        .flat_map(|s| &s.blocks)
        .find(|b| b.address == a.addr && a.end.is_none())
        .and_then(|b| snap.forward_frames(b.address));
    let divisions = snap.allocator_settings.as_ref().map(AllocatorConfig::from_settings).unwrap_or_default().division_table();
    let size = match a.end {
        None => final_block_size(snap, device, a.addr),
        Some(_) => None,
    }
    .unwrap_or_else(|| round_size(a.size, &divisions));
    let start_event = (!a.alive_at_start).then_some(a.start);
    let category = tl.categories.get(a.category as usize).filter(|c| *c != "unknown").cloned();
    AllocationInfo {
        id,
        address: a.addr,
        size,
        requested_size: a.size,
        start_event,
        end_event: a.end,
        start_time_us: start_event.and_then(|e| event_time(snap, tl, device, e)),
        end_time_us: a.end.and_then(|e| event_time(snap, tl, device, e)),
        alive_at_peak: tl.total_events == 0 || a.alive_at(tl.peak_index),
        category,
        top_frame: top_frame_label(snap, a.stack),
        frames: shown_frames(snap, a.stack, all_frames),
        compile_context: text(entry.and_then(|e| e.1.compile_context.as_ref())),
        user_metadata: text(entry.and_then(|e| e.1.user_metadata.as_ref())),
        pool: entry.map(|(pos, _)| snap.entry_pool(device, pos)).filter(|p| *p != (0, 0)),
        forward_frames: forward.map(|st| shown_frames(snap, st, all_frames)).unwrap_or_default(),
    }
}

/// Allocation ids, largest first (ties: earlier first).
pub fn largest_ids(tl: &Timeline) -> Vec<u32> {
    tl.largest(usize::MAX)
}

/// One segment's occupancy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SegmentStats {
    pub address: u64,
    pub device: i64,
    pub stream: i64,
    pub segment_type: &'static str,
    pub blocks: usize,
    /// Bytes cudaMalloc'd.
    pub reserved: u64,
    pub allocated: u64,
    pub requested: u64,
    /// Cached free bytes (inactive blocks).
    pub inactive: u64,
    pub largest_free_block: u64,
}

/// All segments of a device together.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SegmentTotals {
    pub segments: usize,
    pub reserved: u64,
    pub allocated: u64,
    pub requested: u64,
    pub inactive: u64,
    pub largest_free_block: u64,
    /// Share of reserved bytes not holding allocations: 1 - allocated / reserved, as the
    /// allocator model defines it.
    pub fragmentation: f64,
}

/// Occupancy of one device's segments, each and together.
pub fn segment_stats<'a>(segments: impl IntoIterator<Item = &'a Segment>) -> (Vec<SegmentStats>, SegmentTotals) {
    let rows: Vec<SegmentStats> = segments
        .into_iter()
        .map(|s| {
            let free = s.blocks.iter().filter(|b| b.state == BlockState::Inactive);
            SegmentStats {
                address: s.address,
                device: s.device,
                stream: s.stream,
                segment_type: s.segment_type.as_str(),
                blocks: s.blocks.len(),
                reserved: s.total_size,
                allocated: s.allocated_size,
                requested: s.requested_size,
                inactive: free.clone().map(|b| b.size).sum(),
                largest_free_block: free.map(|b| b.size).max().unwrap_or(0),
            }
        })
        .collect();
    let mut t = SegmentTotals { segments: rows.len(), ..Default::default() };
    for r in &rows {
        t.reserved += r.reserved;
        t.allocated += r.allocated;
        t.requested += r.requested;
        t.inactive += r.inactive;
        t.largest_free_block = t.largest_free_block.max(r.largest_free_block);
    }
    t.fragmentation = if t.reserved == 0 { 0.0 } else { 1.0 - t.allocated as f64 / t.reserved as f64 };
    (rows, t)
}

/// Reserved bytes over the trace: the final segments, rewound through the trace's segment
/// events. Returns (peak, final).
pub fn reserved_peak(snap: &Snapshot, device: usize) -> (u64, u64) {
    let last: u64 = snap.segments.iter().filter(|s| s.device == device as i64).map(|s| s.total_size).sum();
    let trace: &[_] = snap.device_traces.get(device).map_or(&[], Vec::as_slice);
    let mut now = reserved_before_trace(snap, device) as i128;
    let mut peak = now.max(last as i128);
    for e in trace {
        now += reserved_change(e);
        peak = peak.max(now);
    }
    (peak.max(0) as u64, last)
}

/// Active bytes above the bytes reserved at the same action: figures that cannot both
/// be true (every allocation lies in a reserved segment).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FiguresConflict {
    pub action: usize,
    pub active_bytes: u64,
    pub reserved_bytes: u64,
}

impl FiguresConflict {
    pub fn describe(&self) -> String {
        use crate::format::bytes;
        format!(
            "active memory {} at action {} is above the {} reserved then: this file's figures cannot all be true",
            bytes(self.active_bytes),
            self.action,
            bytes(self.reserved_bytes)
        )
    }
}

/// Reserved memory along a device's trace, and where it contradicts active memory.
#[derive(Clone, Debug, PartialEq)]
pub struct ReservedFigures {
    pub peak: u64,
    /// At the end (the final segments).
    pub last: u64,
    /// The action where active memory exceeds reserved memory the most, if it ever does
    /// (a device with neither segments nor segment events has no reserved figure to hold).
    pub conflict: Option<FiguresConflict>,
}

/// The highest reserved bytes on `device`: from the segments, or for a torch.profiler trace
/// (which has none) the `Total Reserved` it states (0 where it states none).
pub fn peak_reserved(snap: &Snapshot, tl: &Timeline, device: usize) -> u64 {
    peak_reserved_of(snap, device, || reserved_figures(snap, tl, device).peak)
}

/// `peak_reserved`, with the peak of the trace's segment events (worked out only where it
/// is needed) from `from_trace`.
fn peak_reserved_of(snap: &Snapshot, device: usize, from_trace: impl FnOnce() -> u64) -> u64 {
    match &snap.profiled {
        Some(p) => p.peak_reserved(device).unwrap_or(0),
        None => from_trace(),
    }
}

/// `ReservedFigures` of `tl`, the timeline of `device`'s trace, in one pass over its
/// actions. Reserved bytes before entry `p` are the final segments rewound through all
/// segment events, plus those before `p`: the rewind is only known at the end, so each
/// action keeps active bytes less the events before it, and the worst is compared once
/// the rewind is known. Only the timeline's segment events are read from the trace.
pub fn reserved_figures(snap: &Snapshot, tl: &Timeline, device: usize) -> ReservedFigures {
    let last: u64 = snap.device_segments(device).map(|s| s.total_size).sum();
    let trace = snap.trace(device);
    // The change of each segment event, by its position: the rest change nothing.
    let changes = tl.segment_positions.iter().filter_map(|&p| Some((p, reserved_change(trace.get(p)?))));
    let mut changes = changes.peekable();
    let (mut before, mut highest, mut any_event) = (0i128, 0i128, false);
    // (active less the segment events so far, action, those events' sum then)
    let mut worst: Option<(i128, usize, i128)> = None;
    for (i, &pos) in tl.event_positions.iter().enumerate() {
        for (_, d) in std::iter::from_fn(|| changes.next_if(|c| c.0 <= pos)) {
            (before, highest, any_event) = (before + d, highest.max(before + d), any_event || d != 0);
        }
        let over = tl.totals_at(i) as i128 - before;
        if worst.is_none_or(|w| over > w.0) {
            worst = Some((over, i, before));
        }
    }
    for (_, d) in changes {
        (before, highest, any_event) = (before + d, highest.max(before + d), any_event || d != 0);
    }
    let start = last as i128 - before;
    let known = any_event || snap.device_segments(device).next().is_some();
    let conflict = worst.filter(|&(over, _, _)| known && over > start).map(|(_, i, before_it)| {
        FiguresConflict { action: i, active_bytes: tl.totals_at(i), reserved_bytes: (start + before_it).max(0) as u64 }
    });
    ReservedFigures { peak: (start + highest).max(0) as u64, last, conflict }
}

/// Segments, blocks and trace entries of one device.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceCounts {
    pub device: usize,
    /// "device N" or "host".
    pub name: String,
    pub segments: usize,
    pub blocks: usize,
    pub trace_entries: usize,
}

/// The counts of every device of the file, in device order.
pub fn device_counts(snap: &Snapshot) -> Vec<DeviceCounts> {
    (0..snap.device_count())
        .map(|d| {
            let (segments, blocks) = snap.device_segments(d).fold((0, 0), |(n, b), s| (n + 1, b + s.blocks.len()));
            DeviceCounts { device: d, name: snap.device_name(d), segments, blocks, trace_entries: snap.trace(d).len() }
        })
        .collect()
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AnnotationMark {
    pub name: String,
    /// "START" or "END".
    pub stage: &'static str,
    pub time_us: i64,
    /// First timeline action at or after the annotation; None past the last action.
    pub event: Option<usize>,
}

/// The first action at or after `time_us` (the trace's times ascend): a binary search.
fn first_action_from(snap: &Snapshot, tl: &Timeline, device: usize, time_us: i64) -> usize {
    let (mut lo, mut hi) = (0, tl.total_events);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if event_time(snap, tl, device, mid).unwrap_or(i64::MAX) < time_us {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The device's annotations placed on the timeline's action axis by time.
pub fn annotation_marks(snap: &Snapshot, tl: &Timeline, device: usize) -> Vec<AnnotationMark> {
    snap.external_annotations
        .iter()
        .filter(|a| a.device == device as i64)
        .map(|a| {
            let k = first_action_from(snap, tl, device, a.time_us);
            AnnotationMark {
                name: a.name.clone(),
                stage: match a.stage {
                    AnnotationStage::Start => "START",
                    AnnotationStage::End => "END",
                },
                time_us: a.time_us,
                event: (k < tl.total_events).then_some(k),
            }
        })
        .collect()
}

/// `vramscope view --summary`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SnapshotSummary {
    /// Out-of-memory failures on `device`'s trace: the first thing to say about a file.
    pub oom: Vec<OomReport>,
    pub device: usize,
    /// "device N" or "host".
    pub device_name: String,
    pub devices: usize,
    /// Figures of this file that contradict each other, said before anything else.
    pub warnings: Vec<String>,
    pub figures_conflict: Option<FiguresConflict>,
    /// The Active Memory Timeline's peak (memory_viz's), on `device`.
    pub peak_active_bytes: u64,
    pub peak_active_event: usize,
    pub peak_active_time_us: Option<i64>,
    /// The first trace entry's `time_us`, which the text gives the peak's time from.
    pub trace_start_time_us: Option<i64>,
    /// Highest reserved (segment) bytes over the trace on `device`.
    pub peak_reserved_bytes: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    /// Counts on `device`.
    pub segments: usize,
    pub blocks: usize,
    pub trace_entries: usize,
    /// Counts of every device.
    pub per_device: Vec<DeviceCounts>,
    /// What the reader left out (unknown actions and keys), counted.
    pub skipped: Skipped,
    /// Timeline actions and allocations on `device`.
    pub events: usize,
    pub allocations: usize,
    pub fragmentation: f64,
    pub inactive_bytes: u64,
    pub largest_free_block: u64,
    pub largest: Vec<AllocationInfo>,
    pub breakdown: Breakdown,
    pub annotations: Vec<AnnotationMark>,
    /// A torch.profiler trace: what it covers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profiled: Option<ProfiledSummary>,
    /// A torch.profiler trace: memory by operator (`operators::operator_table`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub operators: Vec<super::operators::OperatorRow>,
    /// A torch.profiler trace with steps: the growth check across them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub growth: Option<GrowthSummary>,
    /// Categories named from the frames (the file records none): how much the rules matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame_rules: Option<RuleCoverage>,
}

/// `--check-growth`'s verdict on a trace's profiled steps.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GrowthSummary {
    pub healthy: bool,
    /// Steps compared, after the window's first.
    pub steps_checked: usize,
    /// What it found, one line each.
    pub lines: Vec<String>,
}

/// What a torch.profiler trace covers, said before its figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProfiledSummary {
    /// Which of torch.profiler's files it was.
    pub form: TraceForm,
    /// The profiled steps (`ProfilerStep#N`).
    pub steps: Vec<u64>,
    /// Memory is counted from the window's start (the trace states no totals).
    pub relative_to_window_start: bool,
    /// Reserved bytes are the trace's `Total Reserved`, where it states them.
    pub reserved_stated: bool,
    /// Read from a directory: which worker's which window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub picked: Option<String>,
}

impl ProfiledSummary {
    fn describe(&self) -> String {
        match self.form {
            TraceForm::MemoryTimeline => {
                return "torch.profiler memory timeline (export_memory_timeline) of one device, which the file does not name: category totals only, \
                        so each allocation below is a rise in one (the .raw.json.gz form keeps one per tensor); no steps, operators or frames"
                    .into()
            }
            TraceForm::MemoryTimelineRaw => {
                return "torch.profiler memory timeline (export_memory_timeline, raw) of one device, which the file does not name: \
                        one allocation per tensor, paired by size and category; no steps, operators or frames"
                    .into()
            }
            TraceForm::Trace => {}
        }
        let steps = match self.steps.as_slice() {
            [] => "no ProfilerStep marks".to_string(),
            [one] => format!("step {one}"),
            [first, .., last] => format!("{} steps, {first} to {last}", self.steps.len()),
        };
        let from = if self.relative_to_window_start { "; memory counted from the window's start (the trace states no totals)" } else { "" };
        let picked = self.picked.as_ref().map_or_else(String::new, |p| format!("\n                 {p}"));
        format!("torch.profiler trace: the profiled window only ({steps}){from}{picked}")
    }
}

pub fn summarize(snap: &Snapshot, tl: &Timeline, device: usize, top: usize) -> SnapshotSummary {
    let (_, totals) = segment_stats(snap.device_segments(device));
    let reserved = reserved_figures(snap, tl, device);
    let peak_reserved_bytes = peak_reserved_of(snap, device, || reserved.peak);
    let per_device = device_counts(snap);
    let here = per_device.get(device).cloned();
    let profiled = snap.profiled.as_ref();
    // A trace has no segments: its reserved bytes are what it states, and cannot conflict.
    let conflict = if profiled.is_some() { None } else { reserved.conflict };
    SnapshotSummary {
        oom: oom_reports(snap, tl, device),
        device,
        device_name: snap.device_name(device),
        devices: snap.device_count(),
        warnings: conflict.iter().map(FiguresConflict::describe).collect(),
        figures_conflict: conflict,
        peak_active_bytes: tl.peak_bytes,
        peak_active_event: tl.peak_index,
        peak_active_time_us: event_time(snap, tl, device, tl.peak_index),
        trace_start_time_us: snap.trace(device).first().map(|e| e.time_us),
        peak_reserved_bytes,
        reserved_bytes: totals.reserved,
        allocated_bytes: totals.allocated,
        segments: here.as_ref().map_or(0, |c| c.segments),
        blocks: here.as_ref().map_or(0, |c| c.blocks),
        trace_entries: here.as_ref().map_or(0, |c| c.trace_entries),
        per_device,
        skipped: snap.skipped.clone(),
        events: tl.total_events,
        allocations: tl.allocations.len(),
        fragmentation: totals.fragmentation,
        inactive_bytes: totals.inactive,
        largest_free_block: totals.largest_free_block,
        largest: tl.largest(top).into_iter().map(|id| allocation_info(snap, tl, device, id, false)).collect(),
        breakdown: breakdown_at_peak(snap, tl, has_categories(tl)),
        annotations: annotation_marks(snap, tl, device),
        profiled: profiled.map(|p| ProfiledSummary {
            form: p.form,
            steps: p.steps.clone(),
            relative_to_window_start: !p.totals,
            reserved_stated: p.peak_reserved(device).is_some(),
            picked: p.picked.clone(),
        }),
        operators: super::operators::operator_table(snap, tl, device),
        frame_rules: snap.frame_rules.clone(),
        growth: super::growth::check_profiled_steps(snap, device).map(|g| GrowthSummary {
            healthy: g.healthy() && g.steps_checked >= super::growth::MIN_STEPS,
            steps_checked: g.steps_checked,
            lines: g.to_string().lines().map(str::to_string).collect(),
        }),
    }
}

/// The summary as lines for a terminal.
pub fn write_text(out: &mut impl std::io::Write, name: &str, s: &SnapshotSummary) -> std::io::Result<()> {
    use crate::format::bytes;
    let at = match (s.peak_active_time_us, s.trace_start_time_us) {
        (Some(t), Some(t0)) => format!(", {} into the trace", crate::format::duration((t - t0) as f64 / 1e6)),
        _ => String::new(),
    };
    writeln!(out, "{name} · {} of {}", s.device_name, s.devices)?;
    for w in &s.warnings {
        writeln!(out, "warning: {w}")?;
    }
    for r in &s.oom {
        super::oom::write_text(out, r, 5)?;
    }
    if let Some(p) = &s.profiled {
        writeln!(out, "{}", p.describe())?;
    }
    writeln!(out, "peak active      {} at action {} of {}{at}", bytes(s.peak_active_bytes), s.peak_active_event, s.events)?;
    match &s.profiled {
        Some(p) => {
            let reserved = if p.reserved_stated { format!("{} (the trace's Total Reserved)", bytes(s.peak_reserved_bytes)) } else { "not in the file".into() };
            writeln!(out, "peak reserved    {reserved}")?;
            writeln!(out, "at the end       allocated {}", bytes(s.allocated_bytes))?;
        }
        None => {
            writeln!(out, "peak reserved    {}", bytes(s.peak_reserved_bytes))?;
            writeln!(out, "at the end       reserved {}, allocated {}, cached free {}", bytes(s.reserved_bytes), bytes(s.allocated_bytes), bytes(s.inactive_bytes))?;
            writeln!(out, "fragmentation    {:.1}% of reserved holds no allocation; largest free block {}", s.fragmentation * 100.0, bytes(s.largest_free_block))?;
        }
    }
    writeln!(out, "counts           {} segments, {} blocks, {} trace entries, {} allocations on {}", s.segments, s.blocks, s.trace_entries, s.allocations, s.device_name)?;
    if s.per_device.len() > 1 {
        let each: Vec<String> = s.per_device.iter().map(|c| format!("{} {}/{}/{}", c.name, c.segments, c.blocks, c.trace_entries)).collect();
        writeln!(out, "every device     segments/blocks/trace entries: {}", each.join(", "))?;
    }
    if let Some(skipped) = s.skipped.describe() {
        writeln!(out, "not read         {skipped}")?;
    }
    writeln!(out, "largest allocations:")?;
    for a in &s.largest {
        let life = match (a.start_event, a.end_event) {
            (None, None) => "whole trace".to_string(),
            (Some(x), None) => format!("{x}–end"),
            (None, Some(y)) => format!("start–{y}"),
            (Some(x), Some(y)) => format!("{x}–{y}"),
        };
        writeln!(out, "  {:>10}  {:<16} {}", bytes(a.size), life, a.top_frame.as_deref().unwrap_or("(no frames)"))?;
    }
    if let Some(c) = &s.frame_rules {
        let share = c.matched_bytes as f64 * 100.0 / (c.matched_bytes + c.unmatched_bytes).max(1) as f64;
        writeln!(out, "categories       from stack frames: rules matched {share:.0}% of allocated bytes (the rest: unmatched; unknown: alive before the trace)")?;
    }
    writeln!(out, "at the peak, by {}:", s.breakdown.by.replace('_', " "))?;
    for g in s.breakdown.groups.iter().take(10) {
        writeln!(out, "  {}", g.row())?;
    }
    if let Some(g) = &s.growth {
        writeln!(out, "growth across the profiled steps:")?;
        for line in &g.lines {
            writeln!(out, "  {line}")?;
        }
    }
    if !s.operators.is_empty() {
        writeln!(out, "operators, by what they keep (self; with what they call in brackets):")?;
        writeln!(out, "  {:>10}  {:>10}  {:>8}  {:>10}  operator", "increase", "allocated", "allocs", "at peak")?;
        for r in s.operators.iter().take(10) {
            let signed = |b: i64| if b < 0 { format!("-{}", bytes(b.unsigned_abs())) } else { bytes(b as u64) };
            writeln!(
                out,
                "  {:>10}  {:>10}  {:>8}  {:>10}  {} ({} / {})",
                signed(r.self_increase_bytes),
                bytes(r.self_allocated_bytes),
                r.self_allocations,
                bytes(r.at_peak_bytes),
                r.name,
                signed(r.increase_bytes),
                bytes(r.allocated_bytes)
            )?;
        }
    }
    if !s.annotations.is_empty() {
        writeln!(out, "annotations:")?;
        for a in &s.annotations {
            let ev = a.event.map_or_else(|| "after the trace".to_string(), |e| format!("action {e}"));
            writeln!(out, "  {:<5} {}  ({ev})", a.stage, a.name)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::model::{Block, SegmentType, TraceEntry};
    use Action::{Alloc, FreeCompleted, FreeRequested, SegmentAlloc, SegmentFree};

    const MB: u64 = 1 << 20;

    /// A trace that reserves 4 MB, gives it back (`empty_cache`), and ends on 1 MB holding
    /// half a megabyte; `extra` goes in before the end.
    fn emptied_cache(extra: &[TraceEntry]) -> Snapshot {
        let mut trace = vec![
            TraceEntry::new(SegmentAlloc, 0x10_0000, 4 * MB),
            TraceEntry::new(Alloc, 0x10_0000, 3 * MB),
            TraceEntry::new(FreeRequested, 0x10_0000, 3 * MB),
            TraceEntry::new(FreeCompleted, 0x10_0000, 3 * MB),
            TraceEntry::new(SegmentFree, 0x10_0000, 4 * MB),
        ];
        trace.extend_from_slice(extra);
        trace.push(TraceEntry::new(SegmentAlloc, 0x80_0000, MB));
        trace.push(TraceEntry::new(Alloc, 0x80_0000, MB / 2));
        let block = |address, size, state| Block { address, size, requested_size: size, state, frames: 0 };
        Snapshot {
            segments: vec![Segment {
                device: 0,
                address: 0x80_0000,
                total_size: MB,
                allocated_size: MB / 2,
                active_size: MB / 2,
                requested_size: MB / 2,
                stream: 0,
                segment_type: SegmentType::Large,
                segment_pool_id: (0, 0),
                is_expandable: false,
                frames: 0,
                blocks: vec![block(0x80_0000, MB / 2, BlockState::ActiveAllocated), block(0x88_0000, MB / 2, BlockState::Inactive)],
            }],
            device_traces: vec![trace],
            ..Default::default()
        }
    }

    #[test]
    fn reserved_memory_peaks_where_the_trace_s_segments_did_not_where_they_end() {
        let snap = emptied_cache(&[]);
        let tl = Timeline::from_snapshot(&snap, 0);
        let r = reserved_figures(&snap, &tl, 0);
        assert_eq!((r.peak, r.last), (4 * MB, MB));
        assert_eq!(r.conflict, None);
        assert_eq!(summarize(&snap, &tl, 0, 3).peak_reserved_bytes, 4 * MB);
    }

    #[test]
    fn active_memory_above_what_was_reserved_then_is_a_conflict_at_its_action() {
        // 2 MB allocated while nothing is reserved (between the two segments).
        let snap = emptied_cache(&[TraceEntry::new(Alloc, 0x40_0000, 2 * MB), TraceEntry::new(FreeCompleted, 0x40_0000, 2 * MB)]);
        let tl = Timeline::from_snapshot(&snap, 0);
        let r = reserved_figures(&snap, &tl, 0);
        assert_eq!(r.peak, 4 * MB);
        assert_eq!(r.conflict, Some(FiguresConflict { action: 2, active_bytes: 2 * MB, reserved_bytes: 0 }));
    }
}
