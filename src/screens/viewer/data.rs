//! A snapshot as the viewer holds it: the file, one device's timeline, the detail drawn,
//! and the analyses the panels show.

use std::cell::OnceCell;
use std::path::Path;

use vramscope_core::report::oom::{oom_marks, oom_reports, OomReport};
use vramscope_core::report::whatif::{default_configs, recorded_config, whatif, Whatif};
use vramscope_core::report::snapshot_summary::{
    annotation_marks, breakdown_at_peak, has_categories, largest_ids, reserved_figures, segment_stats,
    AnnotationMark, Breakdown, SegmentStats, SegmentTotals,
};
use vramscope_core::snapshot::model::Snapshot;
use vramscope_core::snapshot::timeline::{DetailView, StackColumn, Timeline};
/// Share of allocations drawn one by one, in percent, for the detail control.
pub const DETAIL_STEPS: [f64; 9] = [0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0];
/// memory_viz draws this many allocations one by one by default.
const DEFAULT_DRAWN: usize = 15_000;

/// The snapshot, one device's timeline, and what the panels compute from them on demand.
pub struct ViewerData {
    pub name: String,
    pub snap: Snapshot,
    pub device: usize,
    pub tl: Timeline,
    pub detail: DetailView,
    pub detail_step: usize,
    largest: OnceCell<Vec<u32>>,
    segments: OnceCell<(Vec<SegmentStats>, SegmentTotals)>,
    breakdown: OnceCell<Breakdown>,
    marks: OnceCell<Vec<AnnotationMark>>,
    /// (peak, final) reserved bytes.
    reserved: (u64, u64),
    /// Warnings and notes about the file the header shows: figures that contradict each
    /// other, what the reader left out.
    notes: Vec<String>,
    ooms: OnceCell<Vec<(usize, usize)>>,
    oom_reports: OnceCell<Vec<OomReport>>,
    whatif: OnceCell<Whatif>,
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
    pub fn new(name: String, snap: Snapshot, device: usize) -> ViewerData {
        let tl = Timeline::from_snapshot(&snap, device);
        ViewerData::with_timeline(name, snap, device, tl)
    }

    /// `new` with the timeline already built (`Timeline::from_snapshot` or its equal).
    pub fn with_timeline(name: String, snap: Snapshot, device: usize, tl: Timeline) -> ViewerData {
        let n = tl.allocations.len();
        let detail_step = default_detail_step(n);
        let detail = tl.detail(drawn_count(detail_step, n));
        let reserved = reserved_figures(&snap, &tl, device);
        let conflict = reserved.conflict.map(|c| format!("warning: {}", c.describe()));
        let notes = conflict.into_iter().chain(snap.skipped.describe().map(|s| format!("not read: {s}"))).collect();
        ViewerData {
            name,
            snap,
            device,
            tl,
            detail,
            detail_step,
            largest: OnceCell::new(),
            segments: OnceCell::new(),
            breakdown: OnceCell::new(),
            marks: OnceCell::new(),
            reserved: (reserved.peak, reserved.last),
            notes,
            ooms: OnceCell::new(),
            oom_reports: OnceCell::new(),
            whatif: OnceCell::new(),
        }
    }

    /// Warnings first, then notes; each one line for the header.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Reads `path` and shows `device`, or by default the first with trace entries.
    pub fn open(path: &Path, device: Option<usize>) -> anyhow::Result<ViewerData> {
        let (snap, device) = vramscope_core::snapshot::read_device(path, device)?;
        Ok(ViewerData::new(vramscope_core::input::title(path), snap, device))
    }

    pub fn drawn(&self) -> usize {
        self.detail.drawn.len()
    }

    pub fn set_detail_step(&mut self, step: usize) {
        self.detail_step = step.min(DETAIL_STEPS.len() - 1);
        self.detail = self.tl.detail(drawn_count(self.detail_step, self.tl.allocations.len()));
    }

    pub fn largest(&self) -> &[u32] {
        self.largest.get_or_init(|| largest_ids(&self.tl))
    }

    pub fn segments(&self) -> &(Vec<SegmentStats>, SegmentTotals) {
        self.segments.get_or_init(|| segment_stats(self.snap.device_segments(self.device)))
    }

    pub fn breakdown(&self) -> &Breakdown {
        self.breakdown.get_or_init(|| breakdown_at_peak(&self.snap, &self.tl, has_categories(&self.tl)))
    }

    pub fn marks(&self) -> &[AnnotationMark] {
        self.marks.get_or_init(|| annotation_marks(&self.snap, &self.tl, self.device))
    }

    /// (peak, final) reserved bytes.
    pub fn reserved(&self) -> (u64, u64) {
        self.reserved
    }

    /// (trace position, timeline action after it) of each `oom` entry on the device.
    pub fn ooms(&self) -> &[(usize, usize)] {
        self.ooms.get_or_init(|| oom_marks(&self.snap, &self.tl, self.device))
    }

    /// The OOM reports (a replay of the trace up to the last OOM: computed when asked).
    pub fn oom_reports(&self) -> &[OomReport] {
        self.oom_reports.get_or_init(|| oom_reports(&self.snap, &self.tl, self.device))
    }

    /// The default what-if rows for this device (a replay per row: computed when asked).
    pub fn whatif(&self) -> &Whatif {
        self.whatif.get_or_init(|| whatif(&self.snap, self.device, &default_configs(&recorded_config(&self.snap))))
    }

    /// The drawn stack at timeline action `cursor` (the last one past the end).
    pub fn stack_at_cursor(&self, cursor: usize) -> StackColumn {
        self.tl.stack_at(&self.detail, cursor.min(self.tl.total_events.saturating_sub(1)))
    }
}
