//! Opening a snapshot on a background thread, so `vramscope view` draws a large file
//! while it is read: the reader thread sends progress, the segment totals and the shown
//! device's trace events as they are decoded, then the snapshot. The screen feeds the
//! events into the timeline and draws it as it grows; when the snapshot arrives, the
//! same timeline is completed rather than built again.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::data::{default_detail_step, drawn_count, ViewerData};
use vramscope_core::report::frame_rules::FrameRules;
use vramscope_core::report::snapshot_summary::{segment_stats, SegmentTotals};
use vramscope_core::snapshot::model::{Action, Snapshot, TraceEntry};
use vramscope_core::snapshot::timeline::{category_index, DetailView, Timeline, TimelineBuilder};
use vramscope_core::snapshot::{read_device_observed, ReadPass, ReadProgress};

/// What the reader thread sends: progress with segments, the device and its events
/// between, then `Done`.
pub enum LoadUpdate {
    Progress { pass: ReadPass, done: usize, total: usize },
    Segments(SegmentTotals),
    /// The device shown, once known (before its events).
    Device(usize),
    /// The next entries of the shown device's trace as (action, address, size, category
    /// index), with the category names so far.
    Events(Vec<(Action, u64, u64, u16)>, Vec<String>),
    /// The snapshot and the device to show.
    Done(Box<anyhow::Result<(Snapshot, usize)>>),
}

/// Messages in flight; a full channel makes the reader wait for the screen.
const CHANNEL: usize = 32;

/// Starts reading `path` on its own thread, to show `device` or by default the first with
/// alloc or free actions (as `Snapshot::default_device` picks it once the file is read);
/// once read, `rules` name its categories from its frames where it records none.
pub fn spawn_loader(path: PathBuf, device: Option<usize>, rules: Arc<FrameRules>) -> Receiver<LoadUpdate> {
    let (tx, rx) = sync_channel(CHANNEL);
    std::thread::Builder::new()
        .name("snapshot-reader".into())
        .spawn(move || {
            let mut sent = 0;
            let (mut shown, mut announced, mut segments_sent) = (device, false, false);
            let mut scanned = Vec::new();
            let mut names = Vec::new();
            // Sends fail only once the screen has gone; the read then just finishes.
            let mut observe = |p: &ReadProgress<'_>| {
                let _ = tx.send(LoadUpdate::Progress { pass: p.pass, done: p.done, total: p.total });
                if shown.is_none() {
                    shown = first_with_actions(&p.traces, &mut scanned);
                }
                let Some(device) = shown else { return };
                if !announced {
                    let _ = tx.send(LoadUpdate::Device(device));
                    announced = true;
                }
                if let (false, Some(segments)) = (segments_sent, p.segments) {
                    let on_device = segments.iter().filter(|s| s.device == device as i64);
                    let _ = tx.send(LoadUpdate::Segments(segment_stats(on_device).1));
                    segments_sent = true;
                }
                if let Some(new) = p.traces.get(device).and_then(|t| t.get(sent..)).filter(|n| !n.is_empty()) {
                    sent += new.len();
                    let events = new.iter().map(|e| (e.action, e.addr, e.size, category_index(&mut names, e.category.as_deref()))).collect();
                    let _ = tx.send(LoadUpdate::Events(events, names.clone()));
                }
            };
            let done = read_device_observed(&path, device, &rules, &mut observe).map_err(anyhow::Error::new);
            let _ = tx.send(LoadUpdate::Done(Box::new(done)));
        })
        .expect("spawning the snapshot reader thread");
    rx
}

/// The first of the traces decoded so far with an alloc or free action. Traces come in
/// device order, each complete before the next begins; `scanned` keeps how far each was
/// looked at, so every entry is looked at once over the whole read.
fn first_with_actions(traces: &[&[TraceEntry]], scanned: &mut Vec<usize>) -> Option<usize> {
    if scanned.len() < traces.len() {
        scanned.resize(traces.len(), 0);
    }
    traces.iter().enumerate().position(|(d, t)| {
        let found = t[scanned[d].min(t.len())..].iter().any(|e| e.action.is_alloc_or_free());
        scanned[d] = t.len();
        found
    })
}

/// The viewer's state while the file is read: progress, and the timeline of the trace
/// decoded so far (blocks alive throughout the trace are known only at the end). Until
/// then each allocation's stack is the index of its trace entry.
pub struct Loading {
    pub name: String,
    /// The device shown, once known.
    pub device: Option<usize>,
    pub pass: ReadPass,
    pub done: usize,
    pub total: usize,
    pub segments: Option<SegmentTotals>,
    builder: Option<TimelineBuilder>,
    categories: Vec<String>,
    pub detail: DetailView,
    /// Trace entries received.
    pub entries: usize,
    /// Allocations when `detail` was last chosen.
    detail_of: usize,
}

impl Loading {
    pub fn new(name: String) -> Loading {
        Loading {
            name,
            device: None,
            pass: ReadPass::Check,
            done: 0,
            total: 0,
            segments: None,
            builder: Some(TimelineBuilder::new(Vec::new())),
            categories: Vec::new(),
            detail: DetailView::default(),
            entries: 0,
            detail_of: 0,
        }
    }

    /// The timeline so far; `None` once the load is over.
    pub fn timeline(&self) -> Option<&Timeline> {
        self.builder.as_ref().map(TimelineBuilder::timeline)
    }

    /// Takes one update; the loaded viewer (or the error) when it is the last.
    pub fn apply(&mut self, u: LoadUpdate) -> Option<anyhow::Result<ViewerData>> {
        match u {
            LoadUpdate::Progress { pass, done, total } => (self.pass, self.done, self.total) = (pass, done, total),
            LoadUpdate::Segments(t) => self.segments = Some(t),
            LoadUpdate::Device(d) => self.device = Some(d),
            LoadUpdate::Events(events, names) => {
                if let Some(b) = &mut self.builder {
                    for (i, &(action, addr, size, category)) in events.iter().enumerate() {
                        b.feed(action, addr, size, (self.entries + i) as u32, category);
                    }
                }
                self.entries += events.len();
                self.categories = names;
            }
            LoadUpdate::Done(r) => return Some(r.map(|(snap, device)| self.finish(snap, device))),
        }
        None
    }

    /// The viewer of the loaded snapshot on `device`: its timeline completed from the one
    /// fed so far when that holds the device's whole trace, else (or when frame rules named
    /// categories after the read) built afresh.
    fn finish(&mut self, snap: Snapshot, device: usize) -> ViewerData {
        let builder = self.builder.take();
        self.detail = DetailView::default();
        let trace = snap.trace(device);
        match builder {
            Some(mut b) if self.device == Some(device) && self.entries == trace.len() && snap.frame_rules.is_none() => {
                b.stacks_from_entries(trace);
                let tl = b.finish_snapshot(&snap, device, std::mem::take(&mut self.categories));
                ViewerData::with_timeline(self.name.clone(), snap, device, tl)
            }
            _ => ViewerData::new(self.name.clone(), snap, device),
        }
    }

    /// Chooses again which allocations are drawn one by one once the allocations have
    /// grown by half since the last choice (those since are in the summarized band):
    /// choosing costs a pass over them all, so doing it per redraw would cost the
    /// load's length times the trace.
    pub fn refresh_detail(&mut self) {
        let Some(tl) = self.builder.as_ref().map(TimelineBuilder::timeline) else { return };
        let n = tl.allocations.len();
        if n > self.detail_of + self.detail_of / 2 {
            self.detail = tl.detail(drawn_count(default_detail_step(n), n));
            self.detail_of = n;
        }
    }

    /// Share of the whole read done: checking takes about a fifth of the time.
    pub fn fraction(&self) -> f64 {
        let f = self.done as f64 / self.total.max(1) as f64;
        match self.pass {
            ReadPass::Check => 0.2 * f,
            ReadPass::Decode => 0.2 + 0.8 * f,
        }
    }

    /// Applies what has arrived within `wait`, stopping early at the end of the load.
    pub fn receive(&mut self, rx: &Receiver<LoadUpdate>, wait: Duration) -> Option<anyhow::Result<ViewerData>> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(u) => {
                    if let Some(done) = self.apply(u) {
                        return Some(done);
                    }
                }
                Err(RecvTimeoutError::Timeout) => return None,
                Err(RecvTimeoutError::Disconnected) => {
                    return Some(Err(anyhow::anyhow!("{}: the reader thread stopped", self.name)))
                }
            }
        }
    }
}
