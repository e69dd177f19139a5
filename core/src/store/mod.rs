//! The UI side's data: everything producers send, ingested into ring buffers and live
//! tables that screens query. Live, replay and headless consumers all feed the same store.

pub mod history;
pub mod ranks;

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use std::path::PathBuf;

use crate::event::{Action, Batch, Category, MemEvent, Phase, Retag};
use crate::source::gauges::history::GaugeHistory;
use crate::source::gauges::sample::{GaugeBatch, GaugeSample, SourceKind};
use crate::stream::{EngineInfo, Incoming, KnobChange, OutOfMemory, Report, StepReport};

pub use history::{Column, Entry, History};

/// Event log lines kept.
const LOG_LINES: usize = 1000;

/// One allocation's lifetime on the history axis, for the by-allocation view.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AllocSpan {
    pub start: u64,
    /// None while still live.
    pub end: Option<u64>,
    pub size: u64,
    pub addr: u64,
    pub category: Category,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LiveAlloc {
    pub addr: u64,
    pub size: u64,
    pub category: Category,
    pub phase: Phase,
    pub step: u32,
    pub scope: u32,
    /// Index in `Store::spans`.
    span: usize,
}

/// Something worth a marker on the timeline.
#[derive(Clone, Debug, PartialEq)]
pub enum Marker {
    Knob(KnobChange),
    Snapshot(PathBuf),
    Oom(OutOfMemory),
}

impl Marker {
    /// K, S or !: what the timeline draws.
    pub fn letter(&self) -> char {
        match self {
            Marker::Knob(_) => 'K',
            Marker::Snapshot(_) => 'S',
            Marker::Oom(_) => '!',
        }
    }

    fn kind(&self) -> usize {
        match self {
            Marker::Knob(_) => 0,
            Marker::Snapshot(_) => 1,
            Marker::Oom(_) => 2,
        }
    }

    /// A few words beside the marker: which knob went where, or what happened.
    pub fn label(&self) -> String {
        match self {
            Marker::Knob(k) => format!("{}→{}", k.knob, k.to),
            Marker::Snapshot(_) => "snapshot".into(),
            Marker::Oom(_) => "out of memory".into(),
        }
    }
}

/// A marker at a history index, numbered per kind from 1 ("K3" is the third knob change),
/// the tag the event log gives the same line.
#[derive(Clone, Debug, PartialEq)]
pub struct Mark {
    pub at: u64,
    pub marker: Marker,
    pub number: u32,
}

impl Mark {
    pub fn tag(&self) -> String {
        format!("{}{}", self.marker.letter(), self.number)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PhaseSpan {
    pub start: u64,
    pub phase: Phase,
    pub step: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub enum LogKind {
    Info,
    Warn,
    Error,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LogLine {
    pub kind: LogKind,
    pub text: String,
    /// The step running when it was said.
    pub step: u64,
    /// The timeline marker it goes with ("K3").
    pub tag: Option<String>,
}

pub struct Store {
    pub history: History,
    live: FxHashMap<u64, LiveAlloc>,
    /// Allocations in the order they were made (memory_viz stacks bands in this order).
    spans: Vec<AllocSpan>,
    /// History start when spans were last pruned.
    pruned_at: u64,
    /// Phase changes by history index, oldest first.
    pub phases: VecDeque<PhaseSpan>,
    pub markers: VecDeque<Mark>,
    /// Markers made so far, per kind (numbers them).
    marks_made: [u32; 3],
    pub steps: VecDeque<StepReport>,
    pub scopes: Vec<String>,
    pub info: Option<EngineInfo>,
    /// What is shown when it is not a live engine (a replay's file), for the header.
    pub title: Option<String>,
    /// Device (NVML) or host readings, beside the allocator's view.
    pub gauges: GaugeHistory,
    pub log: VecDeque<LogLine>,
    pub paused: bool,
    pub finished: bool,
    /// How a job vramscope started ended, and whether that was a success.
    pub exited: Option<(String, bool)>,
    pub oom: Option<OutOfMemory>,
    /// Out-of-memory errors so far.
    pub ooms: u64,
    /// Events known lost between producer and store (sequence gaps).
    pub lost_events: u64,
    next_seq: Option<u64>,
    /// Highest live total seen, with its history index.
    pub peak: (u64, u64),
    /// Highest live total of each step, by the step its events carry, oldest first.
    step_peaks: VecDeque<(u32, u64)>,
    /// Highest allocated bytes any step report gave.
    reported_peak: u64,
    /// A step report said the producer dropped events.
    reported_drops: bool,
    /// Said that NVML's readings could not be matched to the job's device.
    said_unmatched_device: bool,
    /// Bumped on every change, so screens redraw only when something changed.
    pub version: u64,
    step_cap: usize,
}

impl Store {
    /// What a recording started now needs first so it replays to this store's state: who
    /// the job is, every name, every live allocation.
    pub fn resync_items(&self) -> Vec<Incoming> {
        let mut items: Vec<Incoming> = self.info.clone().map(|i| Incoming::Report(Report::Started(i))).into_iter().collect();
        let scopes = (1..self.scopes.len()).map(|i| (i as u32, self.scopes[i].clone())).collect();
        let events = self.live_events();
        let first_seq = self.history.end();
        items.push(Incoming::Batch(Batch { first_seq, events, scopes, ..Batch::default() }));
        items
    }

    pub fn new(history_cap: usize) -> Store {
        Store {
            history: History::new(history_cap),
            live: FxHashMap::default(),
            spans: Vec::new(),
            pruned_at: 0,
            phases: VecDeque::new(),
            markers: VecDeque::new(),
            marks_made: [0; 3],
            steps: VecDeque::new(),
            scopes: vec![String::new()],
            info: None,
            title: None,
            // 10 minutes at the default 250 ms interval.
            gauges: GaugeHistory::new(2400, 0),
            log: VecDeque::new(),
            paused: false,
            finished: false,
            exited: None,
            oom: None,
            ooms: 0,
            lost_events: 0,
            next_seq: None,
            peak: (0, 0),
            step_peaks: VecDeque::new(),
            reported_peak: 0,
            reported_drops: false,
            said_unmatched_device: false,
            version: 0,
            step_cap: 100_000,
        }
    }

    /// Takes any item a source sends.
    pub fn ingest(&mut self, item: Incoming) {
        match item {
            Incoming::Batch(b) => self.ingest_batch(b),
            Incoming::Report(r) => self.ingest_report(r),
            Incoming::Gauges(g) => self.ingest_gauges(g),
            Incoming::Restart => self.restart(self.history.capacity()),
        }
    }

    /// Starts again from empty (a replay went back in time), keeping the title and log.
    pub fn restart(&mut self, history_cap: usize) {
        let old = std::mem::replace(self, Store::new(history_cap));
        self.title = old.title;
        self.log = old.log;
        self.version = old.version + 1;
    }

    pub fn ingest_batch(&mut self, b: Batch) {
        self.version += 1;
        for (id, name) in b.scopes {
            let id = id as usize;
            if self.scopes.len() <= id {
                self.scopes.resize(id + 1, String::new());
            }
            self.scopes[id] = name;
        }
        if let Some(expected) = self.next_seq {
            if b.first_seq > expected && !b.events.is_empty() {
                self.lost_events += b.first_seq - expected;
            }
        }
        if !b.events.is_empty() {
            self.next_seq = Some(b.first_seq + b.events.len() as u64);
        }
        let mut marks = b.marks.into_iter().peekable();
        for (i, e) in b.events.iter().enumerate() {
            while let Some(m) = marks.next_if(|m| m.seq <= b.first_seq + i as u64) {
                self.phases.push_back(PhaseSpan { start: self.history.end(), phase: m.phase, step: m.step });
            }
            self.ingest_event(e);
        }
        for m in marks {
            self.phases.push_back(PhaseSpan { start: self.history.end(), phase: m.phase, step: m.step });
        }
        for r in b.retags {
            self.retag(r);
        }
        self.forget_before(self.history.start());
    }

    fn ingest_event(&mut self, e: &MemEvent) {
        let mut entry = Entry {
            t_ns: e.t_ns,
            delta: 0,
            reserved_delta: 0,
            category: e.category,
            action: Some(e.action),
            phase: e.phase,
            step: e.step,
        };
        match e.action {
            Action::Alloc => {
                let span = self.spans.len();
                self.spans.push(AllocSpan { start: self.history.end(), end: None, size: e.size, addr: e.addr, category: e.category });
                self.live.insert(
                    e.addr,
                    LiveAlloc { addr: e.addr, size: e.size, category: e.category, phase: e.phase, step: e.step, scope: e.scope, span },
                );
                entry.delta = e.size as i64;
            }
            Action::FreeRequested => {
                // The bytes leave the category they were counted under.
                if let Some(l) = self.live.remove(&e.addr) {
                    entry.delta = -(l.size as i64);
                    entry.category = l.category;
                    self.spans[l.span].end = Some(self.history.end());
                }
            }
            Action::SegmentAlloc | Action::SegmentMap => entry.reserved_delta = e.size as i64,
            Action::SegmentFree | Action::SegmentUnmap => entry.reserved_delta = -(e.size as i64),
            Action::FreeCompleted | Action::Snapshot | Action::Oom => {}
        }
        self.history.push(entry);
        let total = self.history.live_total();
        if total > self.peak.0 {
            self.peak = (total, self.history.end() - 1);
        }
        match self.step_peaks.back_mut() {
            Some((step, peak)) if *step == e.step => *peak = (*peak).max(total),
            _ => {
                if self.step_peaks.len() == self.step_cap {
                    self.step_peaks.pop_front();
                }
                self.step_peaks.push_back((e.step, total));
            }
        }
    }

    fn retag(&mut self, Retag { addr, category: to, scope }: Retag) {
        let Some(l) = self.live.get_mut(&addr) else { return };
        if scope != 0 {
            l.scope = scope;
        }
        if l.category == to {
            return;
        }
        let from = std::mem::replace(&mut l.category, to);
        self.spans[l.span].category = to;
        let size = l.size as i64;
        let last = self.history.end().checked_sub(1).and_then(|i| self.history.get(i).copied());
        let (t_ns, phase, step) = last.map(|e| (e.t_ns, e.phase, e.step)).unwrap_or((0, Phase::Other, 0));
        for (category, delta) in [(from, -size), (to, size)] {
            self.history.push(Entry { t_ns, delta, reserved_delta: 0, category, action: None, phase, step });
        }
    }

    fn forget_before(&mut self, index: u64) {
        // Keep the span that is open at `index`.
        while self.phases.len() > 1 && self.phases[1].start <= index {
            self.phases.pop_front();
        }
        while self.markers.front().is_some_and(|m| m.at < index) {
            self.markers.pop_front();
        }
        // Spans that ended before the history start can go (only when the history itself
        // was trimmed, which is rare); live allocations' indices move with them.
        if index > self.pruned_at {
            let mut remap = vec![usize::MAX; self.spans.len()];
            let mut kept = 0;
            for (i, s) in self.spans.iter().enumerate() {
                if s.end.is_none_or(|e| e >= index) {
                    remap[i] = kept;
                    kept += 1;
                }
            }
            self.spans.retain(|s| s.end.is_none_or(|e| e >= index));
            for l in self.live.values_mut() {
                l.span = remap[l.span];
            }
            self.pruned_at = index;
        }
    }

    pub fn ingest_gauges(&mut self, mut b: GaugeBatch) {
        self.version += 1;
        // Samples come stamped on the shared monotonic clock; events on the job's.
        if let Some(zero) = self.info.as_ref().map(|i| i.clock_zero_ns).filter(|z| *z > 0) {
            for s in &mut b.samples {
                s.t_ns = s.t_ns.saturating_sub(zero);
            }
        }
        if let Some(status) = &b.status {
            self.say_gauge_source(status);
        }
        // NVML numbers devices its own way (PCI order, all of them), CUDA its own (fastest
        // first, renumbered by CUDA_VISIBLE_DEVICES): the job's device is the one with its
        // PCI bus id, else where its process holds the most memory.
        let mut unmatched = None;
        if let Some(info) = self.info.as_ref().filter(|i| i.cuda) {
            if let Some(sample) = b.samples.last().filter(|s| !s.devices().is_empty()) {
                match training_device(sample, info) {
                    Some(d) => self.gauges.set_selected_device(d),
                    None => unmatched = Some(info.pid),
                }
            }
        }
        self.gauges.ingest(b);
        if let Some(pid) = unmatched.filter(|_| !self.said_unmatched_device) {
            self.said_unmatched_device = true;
            let shown = self.gauges.selected_device();
            self.log_line(
                LogKind::Warn,
                format!("NVML does not list the job's process (pid {pid}; in a container NVML shows the host's PIDs) and its GPU's PCI bus id is unknown: showing NVML device {shown}, which may not be the job's"),
            );
        }
    }

    /// Which gauges feed the screen: said once, when the source is chosen or changes, never
    /// per sample.
    fn say_gauge_source(&mut self, status: &crate::source::gauges::sample::SourceStatus) {
        let line = match (status.kind, &status.reason) {
            (SourceKind::Nvml, _) => "device gauges: NVML".to_string(),
            (kind, Some(why)) => format!("device gauges: {} ({why})", kind.as_str()),
            (kind, None) => format!("device gauges: {}", kind.as_str()),
        };
        let kind = if status.kind == SourceKind::Nvml { LogKind::Info } else { LogKind::Warn };
        self.log_line(kind, line);
    }

    /// A store that joins a session late (a rank's, a device's) takes the machine's gauges
    /// as the others hold them: their readings so far, and the line saying where they come
    /// from.
    pub fn adopt_gauges(&mut self, gauges: &GaugeHistory) {
        self.gauges = gauges.clone();
        if let Some(status) = gauges.status().cloned() {
            self.say_gauge_source(&status);
        }
    }

    pub fn ingest_report(&mut self, r: Report) {
        self.version += 1;
        let here = self.history.end();
        match r {
            Report::Started(info) => {
                if let Some(n) = &info.note {
                    self.log_line(LogKind::Info, n.clone());
                }
                // Without a bus id the CUDA ordinal is the best guess until NVML lists the
                // job's process (it is NVML's index unless CUDA_VISIBLE_DEVICES renumbers).
                if info.pci_bus_id.is_none() {
                    if let Some(d) = info.device.strip_prefix("cuda:").and_then(|d| d.parse().ok()) {
                        self.gauges.set_selected_device(d);
                    }
                }
                self.info = Some(info);
            }
            Report::Knob(k) => {
                let text = format!("{} {} → {} from step {}", k.knob, k.from, k.to, k.step);
                if let Some(info) = &mut self.info {
                    if let Some(c) = &mut info.config {
                        // A recording's knob changes are ones the engine made.
                        let _ = crate::step_config::apply_knob(c, &k.knob, &k.to);
                    }
                    match info.knobs.iter_mut().find(|x| x.name == k.knob) {
                        Some(x) => x.value = k.to.clone(),
                        None => info.knobs.push(crate::stream::Knob { name: k.knob.clone(), value: k.to.clone() }),
                    }
                }
                self.mark(here, Marker::Knob(k), LogKind::Info, text);
            }
            Report::Step(s) => {
                if self.steps.len() == self.step_cap {
                    self.steps.pop_front();
                }
                self.reported_peak = self.reported_peak.max(s.peak_allocated_bytes);
                self.reported_drops |= s.dropped_events > 0;
                self.steps.push_back(s);
            }
            Report::SnapshotSaved { step, path } => {
                let text = format!("snapshot of step {step} saved: {}", path.display());
                self.mark(here, Marker::Snapshot(path), LogKind::Info, text);
            }
            Report::SnapshotFailed { step, error } => {
                self.log_line(LogKind::Error, format!("snapshot of step {step} failed: {error}"))
            }
            Report::Oom(o) => {
                let text = format!("out of memory at step {} ({}): {} — lower ctx with [ and resume with space", o.step, o.phase.as_str(), o.message);
                self.mark(here, Marker::Oom(o.clone()), LogKind::Error, text);
                self.oom = Some(o);
                self.ooms += 1;
            }
            Report::Paused(p) => {
                self.paused = p;
                if !p {
                    self.oom = None;
                }
            }
            Report::Error(e) => self.log_line(LogKind::Error, e),
            Report::Note(n) => self.log_line(LogKind::Info, n),
            Report::Finished => self.finished = true,
            Report::Exited { how, success } => {
                if !success {
                    self.log_line(LogKind::Error, format!("the job {how}"));
                }
                self.exited = Some((how, success));
            }
        }
    }

    /// Markers made so far, of every kind: a new one means a new marked log line.
    pub fn marks_made(&self) -> u64 {
        self.marks_made.iter().map(|n| u64::from(*n)).sum()
    }

    pub fn log_line(&mut self, kind: LogKind, text: String) {
        self.push_log(LogLine { kind, text, step: self.step_now(), tag: None });
    }

    fn push_log(&mut self, line: LogLine) {
        if self.log.len() == LOG_LINES {
            self.log.pop_front();
        }
        self.log.push_back(line);
    }

    /// A numbered marker at history index `at`, and its line in the log with the same tag.
    fn mark(&mut self, at: u64, marker: Marker, kind: LogKind, text: String) {
        let n = &mut self.marks_made[marker.kind()];
        *n += 1;
        let mark = Mark { at, marker, number: *n };
        self.push_log(LogLine { kind, text, step: self.step_now(), tag: Some(mark.tag()) });
        self.markers.push_back(mark);
    }

    /// An alloc event for every live allocation, in the order they were made.
    pub fn live_events(&self) -> Vec<MemEvent> {
        let mut live: Vec<&LiveAlloc> = self.live.values().collect();
        live.sort_by_key(|l| l.span);
        let t_ns = self.history.end().checked_sub(1).and_then(|i| self.history.get(i)).map_or(0, |e| e.t_ns);
        live.iter()
            .map(|l| MemEvent {
                t_ns,
                addr: l.addr,
                size: l.size,
                stream: 0,
                step: l.step,
                scope: l.scope,
                action: Action::Alloc,
                phase: l.phase,
                device: 0,
                category: l.category,
            })
            .collect()
    }

    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    /// The `n` largest live allocations, largest first.
    pub fn largest_live(&self, n: usize) -> Vec<&LiveAlloc> {
        let mut v: Vec<&LiveAlloc> = self.live.values().collect();
        let n = n.min(v.len());
        if n == 0 {
            return Vec::new();
        }
        v.select_nth_unstable_by(n - 1, |a, b| b.size.cmp(&a.size).then(a.addr.cmp(&b.addr)));
        v.truncate(n);
        v.sort_by(|a, b| b.size.cmp(&a.size).then(a.addr.cmp(&b.addr)));
        v
    }

    /// Allocations of at least `min_size` bytes alive at some point of [from, to), in
    /// allocation order. (Smaller ones cannot show as bands of their own.)
    pub fn spans_in(&self, from: u64, to: u64, min_size: u64) -> impl Iterator<Item = &AllocSpan> {
        self.spans
            .iter()
            .filter(move |s| s.size >= min_size && s.start < to && s.end.is_none_or(|e| e > from))
    }

    pub fn scope_name(&self, id: u32) -> &str {
        self.scopes.get(id as usize).map(String::as_str).unwrap_or("")
    }

    pub fn last_step(&self) -> Option<&StepReport> {
        self.steps.back()
    }

    /// The step running now: the one after the last reported, or the latest a phase mark
    /// names (a snapshot trace reports no steps).
    pub fn step_now(&self) -> u64 {
        let reported = self.last_step().map_or(0, |s| s.step + 1);
        reported.max(self.phases.back().map_or(0, |p| u64::from(p.step)))
    }

    /// Whether every allocator event reached the store (no gaps, no drops reported).
    pub fn events_complete(&self) -> bool {
        self.lost_events == 0 && !self.reported_drops
    }

    /// Active bytes now and by category, and whether they are exact: summed from the events
    /// while every one arrived; once some were lost, the job's own figures at the end of its
    /// last step (its tracker saw every event), which the events here can no longer give.
    pub fn active_figures(&self) -> (u64, [u64; 8], bool) {
        match self.last_step().filter(|_| !self.events_complete()) {
            Some(s) => {
                let mut cats = [0u64; 8];
                for c in Category::ALL {
                    cats[c as usize] = s.category_bytes.get(c.as_str()).copied().unwrap_or(0);
                }
                (s.live_bytes, cats, false)
            }
            None => (self.history.live_total(), self.history.category_bytes(), true),
        }
    }

    /// The session's peak of live bytes, as the timeline draws it; when events were lost,
    /// the step reports' exact figure if higher.
    pub fn session_peak(&self) -> u64 {
        if self.events_complete() && self.peak.0 > 0 {
            self.peak.0
        } else {
            self.peak.0.max(self.reported_peak)
        }
    }

    /// Peak live bytes of the last reported step, by the same measure as `session_peak`.
    pub fn last_step_peak(&self) -> Option<u64> {
        let last = self.last_step()?;
        let drawn = self.step_peaks.iter().rev().find(|(s, _)| u64::from(*s) == last.step).map(|(_, p)| *p);
        Some(match drawn {
            Some(p) if self.events_complete() => p,
            p => p.unwrap_or(0).max(last.peak_allocated_bytes),
        })
    }

    /// Where each step begins in [from, to), with its number: the first phase mark of a
    /// step that is not "other".
    pub fn step_starts(&self, from: u64, to: u64) -> Vec<(u64, u32)> {
        let first = self.phases.partition_point(|p| p.start < from);
        // The step in effect before the window, so a step that began earlier is not counted.
        let mut prev = self.phases.range(..first).rev().find(|p| p.phase != Phase::Other).map(|p| p.step);
        let mut out = Vec::new();
        for p in self.phases.range(first..).take_while(|p| p.start < to).filter(|p| p.phase != Phase::Other) {
            if prev != Some(p.step) {
                out.push((p.start, p.step));
                prev = Some(p.step);
            }
        }
        out
    }

    /// Where the `n`th newest step began (1: the one running), when the phase marks held
    /// name that many steps.
    pub fn newest_steps_start(&self, n: usize) -> Option<u64> {
        let (mut steps, mut step, mut start) = (0, None, None);
        for p in self.phases.iter().rev().filter(|p| p.phase != Phase::Other) {
            if step != Some(p.step) {
                if steps == n {
                    break;
                }
                (steps, step) = (steps + 1, Some(p.step));
            }
            start = Some(p.start);
        }
        start.filter(|_| steps == n)
    }

    /// The phase in effect over most of [a, b) (the one at `a` when it is empty).
    pub fn dominant_phase(&self, a: u64, b: u64) -> Phase {
        if b <= a {
            return self.phase_at(a).map_or(Phase::Other, |p| p.phase);
        }
        let mut held = [0u64; 5];
        let k = self.phases.partition_point(|p| p.start <= a);
        let before = k.checked_sub(1).map_or(Phase::Other, |i| self.phases[i].phase);
        let mut at = a;
        let mut phase = before;
        for p in self.phases.range(k..).take_while(|p| p.start < b) {
            held[phase as usize] += p.start - at;
            (at, phase) = (p.start, p.phase);
        }
        held[phase as usize] += b - at;
        // The first phase holding the most, in time order of Phase::ALL.
        let best = held.iter().copied().max().unwrap_or(0);
        Phase::ALL.into_iter().find(|p| held[*p as usize] == best).unwrap_or(Phase::Other)
    }

    /// The live allocation at `addr`.
    pub fn live_alloc(&self, addr: u64) -> Option<&LiveAlloc> {
        self.live.get(&addr)
    }

    /// The history index where a live allocation was made.
    pub fn made_at(&self, a: &LiveAlloc) -> Option<u64> {
        self.spans.get(a.span).filter(|s| s.addr == a.addr).map(|s| s.start)
    }

    /// Every live allocation, largest first (the allocations table's order).
    pub fn live_by_size(&self) -> Vec<&LiveAlloc> {
        let mut v: Vec<&LiveAlloc> = self.live.values().collect();
        v.sort_by(|a, b| b.size.cmp(&a.size).then(a.addr.cmp(&b.addr)));
        v
    }

    /// The phase in effect at history index `i`.
    pub fn phase_at(&self, i: u64) -> Option<PhaseSpan> {
        let k = self.phases.partition_point(|p| p.start <= i);
        k.checked_sub(1).map(|k| self.phases[k])
    }

    pub fn current_phase(&self) -> Phase {
        self.phases.back().map(|p| p.phase).unwrap_or(Phase::Other)
    }

}

/// The NVML index of the job's device: the one with its PCI bus id (as PyTorch maps CUDA
/// devices to NVML's), else the one where its process (`pid`; before jobs said their pid,
/// the process the sampler marked as itself) holds the most memory.
fn training_device(sample: &GaugeSample, info: &EngineInfo) -> Option<u32> {
    let devices = sample.devices();
    if let Some(bus) = &info.pci_bus_id {
        let by_bus = devices.iter().find(|d| d.pci_bus_id.as_deref().is_some_and(|b| crate::source::gauges::nvml::same_pci_bus(b, bus)));
        if let Some(d) = by_bus {
            return Some(d.index);
        }
    }
    let pid = info.pid;
    devices
        .iter()
        .filter_map(|d| {
            d.processes.iter().find(|p| if pid != 0 { p.pid == pid } else { p.is_self }).map(|p| (p.used_bytes.unwrap_or(0), d.index))
        })
        .max_by_key(|&(used, index)| (used, std::cmp::Reverse(index)))
        .map(|(_, index)| index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::PhaseMark;

    fn ev(action: Action, addr: u64, size: u64, cat: Category, phase: Phase) -> MemEvent {
        MemEvent { t_ns: 0, addr, size, stream: 0, step: 0, scope: 0, action, phase, device: 0, category: cat }
    }

    #[test]
    fn frees_leave_the_category_they_were_counted_in_and_retags_move_bytes() {
        let mut s = Store::new(1 << 16);
        s.ingest_batch(Batch {
            first_seq: 0,
            events: vec![
                ev(Action::SegmentAlloc, 0x1000, 2 << 20, Category::Unknown, Phase::Forward),
                ev(Action::Alloc, 0x1000, 1000, Category::Activation, Phase::Forward),
                ev(Action::Alloc, 0x2000, 500, Category::Activation, Phase::Forward),
            ],
            marks: vec![PhaseMark { seq: 0, t_ns: 0, step: 0, phase: Phase::Forward }],
            retags: vec![Retag { addr: 0x2000, category: Category::Gradient, scope: 1 }],
            scopes: vec![(1, "layers.0.attn".into())],
        });
        let cats = s.history.category_bytes();
        assert_eq!(cats[Category::Activation as usize], 1000);
        assert_eq!(cats[Category::Gradient as usize], 500);
        assert_eq!(s.history.reserved(), 2 << 20);
        // The tracker reports the free as temporary (made and freed in one phase), but the
        // bytes were counted as activation.
        s.ingest_batch(Batch {
            first_seq: 3,
            events: vec![ev(Action::FreeRequested, 0x1000, 1000, Category::Temporary, Phase::Forward)],
            ..Default::default()
        });
        let cats = s.history.category_bytes();
        assert_eq!(cats[Category::Activation as usize], 0);
        assert_eq!(cats[Category::Temporary as usize], 0);
        assert_eq!(s.peak.0, 1500);
        assert_eq!(s.largest_live(5).iter().map(|l| l.size).collect::<Vec<_>>(), vec![500]);
        assert_eq!(s.scope_name(1), "layers.0.attn");
        assert_eq!(s.largest_live(1)[0].scope, 1, "a retag's scope names the allocation");
        assert_eq!(s.lost_events, 0);
    }

    #[test]
    fn steps_are_found_from_their_phase_marks() {
        let mut s = Store::new(1 << 16);
        // Three steps of 10 events: forward 4, backward 4, optimizer 2; "other" between.
        let mut b = Batch::default();
        for step in 0..3u32 {
            for (at, phase) in [(0, Phase::Forward), (4, Phase::Backward), (8, Phase::Optimizer)] {
                b.marks.push(PhaseMark { seq: u64::from(step) * 10 + at, t_ns: 0, step, phase });
            }
            b.marks.push(PhaseMark { seq: u64::from(step) * 10 + 9, t_ns: 0, step, phase: Phase::Other });
        }
        b.events = (0..30).map(|i| ev(Action::Alloc, 0x100 + i, 8, Category::Temporary, Phase::Other)).collect();
        s.ingest_batch(b);
        assert_eq!(s.step_starts(0, 30), vec![(0, 0), (10, 1), (20, 2)]);
        assert_eq!(s.step_starts(5, 30), vec![(10, 1), (20, 2)], "a step begun before the window is not counted");
        assert_eq!(s.newest_steps_start(1), Some(20));
        assert_eq!(s.newest_steps_start(3), Some(0));
        assert_eq!(s.newest_steps_start(4), None, "only three steps");
        assert_eq!(s.dominant_phase(0, 10), Phase::Forward, "forward and backward hold 4 each: the first wins");
        assert_eq!(s.dominant_phase(3, 10), Phase::Backward);
        assert_eq!(s.dominant_phase(12, 12), Phase::Forward, "an empty span: the phase at its start");
    }

    #[test]
    fn sequence_gaps_count_lost_events() {
        let mut s = Store::new(1 << 16);
        let one = |seq| Batch {
            first_seq: seq,
            events: vec![ev(Action::Alloc, seq + 1, 8, Category::Temporary, Phase::Other)],
            ..Default::default()
        };
        s.ingest_batch(one(0));
        s.ingest_batch(one(5));
        assert_eq!(s.lost_events, 4);
    }
}
