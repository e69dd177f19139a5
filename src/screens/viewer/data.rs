//! A snapshot as the viewer holds it: the file, one device's timeline, the detail drawn,
//! and the analyses the panels show.

use std::path::Path;
use std::sync::mpsc::{channel, Receiver, TryRecvError};
use std::sync::Arc;

use vramscope_core::report::oom::{oom_marks, oom_reports, OomReport};
use vramscope_core::report::whatif::{default_configs, recorded_config, whatif, Whatif};
use vramscope_core::report::breakdown::{breakdown_at_peak, has_categories, Breakdown};
use vramscope_core::report::snapshot_summary::{
    annotation_marks, largest_ids, reserved_figures, segment_stats, AnnotationMark, SegmentStats, SegmentTotals,
};
use vramscope_core::report::frame_rules::FrameRules;
use vramscope_core::snapshot::model::Snapshot;
use vramscope_core::snapshot::timeline::{DetailView, StackColumn, Timeline};

/// Share of allocations drawn one by one, in percent, for the detail control.
pub const DETAIL_STEPS: [f64; 9] = [0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0];
/// memory_viz draws this many allocations one by one by default.
const DEFAULT_DRAWN: usize = 15_000;

/// The snapshot, one device's timeline, and what the panels show of them. What takes
/// longer than a frame is computed on a worker when first asked (`ask`), and lands by
/// `poll`; drawing only reads.
pub struct ViewerData {
    pub name: String,
    pub snap: Arc<Snapshot>,
    pub device: usize,
    pub tl: Arc<Timeline>,
    pub detail: DetailView,
    pub detail_step: usize,
    largest: Background<Vec<u32>>,
    breakdown: Background<Breakdown>,
    oom_reports: Background<Vec<OomReport>>,
    whatif: Background<Whatif>,
    segments: (Vec<SegmentStats>, SegmentTotals),
    marks: Vec<AnnotationMark>,
    /// (trace position, timeline action after it) of each `oom` entry on the device.
    ooms: Vec<(usize, usize)>,
    /// (peak, final) reserved bytes.
    reserved: (u64, u64),
    /// Warnings and notes about the file the header shows: figures that contradict each
    /// other, what the reader left out.
    notes: Vec<String>,
    /// A torch.profiler trace's memory by operator (empty for a snapshot).
    pub operators: Vec<vramscope_core::report::operators::OperatorRow>,
}

/// The analyses computed on a worker: each a replay or a pass over every allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Analysis {
    /// Every allocation by size (the largest list).
    Largest,
    /// Bytes at the peak by category or call site.
    Breakdown,
    /// The allocator replayed up to each OOM.
    OomReports,
    /// The trace replayed under each default setting.
    WhatIf,
}

/// A result computed on a worker thread.
pub enum Background<T> {
    NotAsked,
    Computing(Receiver<T>),
    Ready(T),
    /// The worker panicked: a bug, said on screen rather than waited for forever.
    Failed,
}

impl<T: Send + 'static> Background<T> {
    fn ask(&mut self, work: impl FnOnce() -> T + Send + 'static) {
        if matches!(self, Background::NotAsked) {
            let (tx, rx) = channel();
            std::thread::Builder::new()
                .name("vramscope-analysis".into())
                .spawn(move || {
                    let _ = tx.send(work());
                })
                .expect("spawning an analysis thread");
            *self = Background::Computing(rx);
        }
    }

    /// Takes the worker's result if it is there (waiting for it when `wait`); true when
    /// one landed.
    fn poll(&mut self, wait: bool) -> bool {
        let Background::Computing(rx) = self else { return false };
        let got = if wait { rx.recv().map_err(|_| TryRecvError::Disconnected) } else { rx.try_recv() };
        *self = match got {
            Ok(v) => Background::Ready(v),
            Err(TryRecvError::Empty) => return false,
            Err(TryRecvError::Disconnected) => Background::Failed,
        };
        true
    }

    pub fn ready(&self) -> Option<&T> {
        match self {
            Background::Ready(v) => Some(v),
            _ => None,
        }
    }

    /// What a panel shows in place of a result not there yet.
    pub fn waiting_text(&self) -> &'static str {
        match self {
            Background::Failed => "this analysis failed (a bug: please report it)",
            _ => "computing…",
        }
    }
}

pub fn drawn_count(step: usize, allocations: usize) -> usize {
    ((allocations as f64 * DETAIL_STEPS[step] / 100.0).ceil() as usize).min(allocations)
}

/// The finest detail step drawing at most as many allocations as memory_viz does.
pub fn default_detail_step(allocations: usize) -> usize {
    (0..DETAIL_STEPS.len()).rev().find(|&s| drawn_count(s, allocations) <= DEFAULT_DRAWN).unwrap_or(0)
}

impl ViewerData {
    /// Everything the first frame needs: the timeline of `device` and its detail view.
    pub fn new(name: String, snap: impl Into<Arc<Snapshot>>, device: usize) -> ViewerData {
        let snap = snap.into();
        let tl = Timeline::from_snapshot(&snap, device);
        ViewerData::with_timeline(name, snap, device, tl)
    }

    /// `new` with the timeline already built (`Timeline::from_snapshot` or its equal).
    pub fn with_timeline(name: String, snap: impl Into<Arc<Snapshot>>, device: usize, tl: Timeline) -> ViewerData {
        let snap = snap.into();
        let n = tl.allocations.len();
        let detail_step = default_detail_step(n);
        let detail = tl.detail(drawn_count(detail_step, n));
        let reserved = reserved_figures(&snap, &tl, device);
        // A torch.profiler trace has no segments to conflict with.
        let conflict = reserved.conflict.filter(|_| snap.profiled.is_none()).map(|c| format!("warning: {}", c.describe()));
        let rules = snap.frame_rules.as_ref().map(|c| {
            let all = (c.matched_bytes + c.unmatched_bytes).max(1);
            format!("categories from stack frames: rules matched {:.0}% of allocated bytes, the rest is unmatched (--categories adds rules)", c.matched_bytes as f64 * 100.0 / all as f64)
        });
        let notes = conflict.into_iter().chain(snap.skipped.describe().map(|s| format!("not read: {s}"))).chain(rules).collect();
        // These few passes over segments, annotations and oom entries take well under a
        // frame; the timeline draws the marks from its first frame.
        let segments = segment_stats(snap.device_segments(device));
        let marks = annotation_marks(&snap, &tl, device);
        let ooms = oom_marks(&snap, &tl, device);
        // One pass over the device's trace: a trace's operators take the segments' tab.
        let operators = vramscope_core::report::operators::operator_table(&snap, &tl, device);
        ViewerData {
            name,
            snap,
            device,
            tl: Arc::new(tl),
            detail,
            detail_step,
            largest: Background::NotAsked,
            breakdown: Background::NotAsked,
            oom_reports: Background::NotAsked,
            whatif: Background::NotAsked,
            segments,
            marks,
            ooms,
            reserved: (reserved.peak, reserved.last),
            notes,
            operators,
        }
    }

    /// Warnings first, then notes; each one line for the header.
    /// Sets the note that begins with `key`, in place of the one there was.
    pub fn set_note(&mut self, key: &str, note: String) {
        match self.notes.iter_mut().find(|n| n.starts_with(key)) {
            Some(n) => *n = note,
            None => self.notes.push(note),
        }
    }

    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Reads `path` and shows `device`, or by default the first with trace entries.
    pub fn open(path: &Path, device: Option<usize>, rules: &FrameRules) -> anyhow::Result<ViewerData> {
        let (snap, device) = vramscope_core::snapshot::read_device(path, device, rules)?;
        Ok(ViewerData::new(vramscope_core::input::title(path), snap, device))
    }

    pub fn drawn(&self) -> usize {
        self.detail.drawn.len()
    }

    pub fn set_detail_step(&mut self, step: usize) {
        self.detail_step = step.min(DETAIL_STEPS.len() - 1);
        self.detail = self.tl.detail(drawn_count(self.detail_step, self.tl.allocations.len()));
    }

    /// Starts computing `what` on a worker unless it was asked for before.
    pub fn ask(&mut self, what: Analysis) {
        let (snap, tl, device) = (Arc::clone(&self.snap), Arc::clone(&self.tl), self.device);
        match what {
            Analysis::Largest => self.largest.ask(move || largest_ids(&tl)),
            Analysis::Breakdown => self.breakdown.ask(move || breakdown_at_peak(&snap, &tl, has_categories(&tl))),
            Analysis::OomReports => self.oom_reports.ask(move || oom_reports(&snap, &tl, device)),
            Analysis::WhatIf => self.whatif.ask(move || whatif(&snap, device, &default_configs(&recorded_config(&snap)))),
        }
    }

    /// Takes what the workers finished; true when anything landed (the screen redraws).
    pub fn poll(&mut self) -> bool {
        self.poll_all(false)
    }

    /// Waits for everything asked for (`view --summary`-like uses, tests, benchmarks).
    pub fn wait(&mut self) {
        self.poll_all(true);
    }

    fn poll_all(&mut self, wait: bool) -> bool {
        // Every one is polled: `|`, not `||`.
        self.largest.poll(wait) | self.breakdown.poll(wait) | self.oom_reports.poll(wait) | self.whatif.poll(wait)
    }

    /// Allocation ids, largest first.
    pub fn largest(&self) -> &Background<Vec<u32>> {
        &self.largest
    }

    pub fn breakdown(&self) -> &Background<Breakdown> {
        &self.breakdown
    }

    /// The OOM reports (a replay of the trace up to the last OOM).
    pub fn oom_reports(&self) -> &Background<Vec<OomReport>> {
        &self.oom_reports
    }

    /// The default what-if rows for this device (a replay per row).
    pub fn whatif(&self) -> &Background<Whatif> {
        &self.whatif
    }

    pub fn segments(&self) -> &(Vec<SegmentStats>, SegmentTotals) {
        &self.segments
    }

    pub fn marks(&self) -> &[AnnotationMark] {
        &self.marks
    }

    /// (peak, final) reserved bytes.
    pub fn reserved(&self) -> (u64, u64) {
        self.reserved
    }

    /// (trace position, timeline action after it) of each `oom` entry on the device.
    pub fn ooms(&self) -> &[(usize, usize)] {
        &self.ooms
    }

    /// The drawn stack at timeline action `cursor` (the last one past the end).
    pub fn stack_at_cursor(&self, cursor: usize) -> StackColumn {
        self.tl.stack_at(&self.detail, cursor.min(self.tl.total_events.saturating_sub(1)))
    }
}
