//! `vramscope run --headless --check-growth N`: is memory that should be gone at the end of
//! a step piling up (the "gradual increase" pattern), or does one step spike?
//!
//! Memory live at the end of each step is grouped by where it was allocated (phase and
//! module scope). A group that grows at every step after the first is a leak: the first
//! step legitimately keeps things (AdamW's moments), later steps should keep nothing.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::event::{Batch, Phase};
use crate::format::bytes;
use crate::snapshot::model::{Action, Snapshot};
use crate::stream::StepReport;

/// Where an allocation was made.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Origin {
    pub phase: Phase,
    /// Module scope name ("" outside any module).
    pub scope: String,
}

/// Bytes live at the end of one step, by origin.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepLive {
    pub step: u32,
    pub by_origin: BTreeMap<Origin, u64>,
}

/// Follows the event stream and samples live bytes by origin at each step's end (the first
/// event tagged with a later step closes the step).
#[derive(Default)]
pub struct LiveByOrigin {
    scopes: HashMap<u32, String>,
    live: HashMap<u64, (Phase, u32, u64)>,
    step: Option<u32>,
    samples: Vec<StepLive>,
}

impl LiveByOrigin {
    pub fn ingest(&mut self, batch: &Batch) {
        self.scopes.extend(batch.scopes.iter().cloned());
        for e in &batch.events {
            if self.step.is_some_and(|s| e.step > s) {
                self.sample();
            }
            self.step = Some(self.step.map_or(e.step, |s| s.max(e.step)));
            match e.action {
                Action::Alloc => {
                    self.live.insert(e.addr, (e.phase, e.scope, e.size));
                }
                Action::FreeRequested | Action::FreeCompleted => {
                    self.live.remove(&e.addr);
                }
                _ => {}
            }
        }
    }

    fn sample(&mut self) {
        let Some(step) = self.step else { return };
        let mut by_origin = BTreeMap::new();
        for (phase, scope, size) in self.live.values() {
            let scope = self.scopes.get(scope).cloned().unwrap_or_default();
            *by_origin.entry(Origin { phase: *phase, scope }).or_insert(0) += size;
        }
        self.samples.push(StepLive { step, by_origin });
    }

    /// The samples, the last step's included.
    pub fn finish(mut self) -> Vec<StepLive> {
        self.sample();
        self.samples
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Growth {
    pub origin: Origin,
    pub first_step: u32,
    pub last_step: u32,
    pub first_bytes: u64,
    pub last_bytes: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Spike {
    pub step: u64,
    pub phase: String,
    pub peak_bytes: u64,
    pub typical_bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct GrowthReport {
    pub growth: Vec<Growth>,
    pub spikes: Vec<Spike>,
    /// Steps compared (after the first).
    pub steps_checked: usize,
}

impl GrowthReport {
    pub fn healthy(&self) -> bool {
        self.growth.is_empty() && self.spikes.is_empty()
    }
}

/// Steps after the first that a pattern needs before it counts as growth.
pub const MIN_STEPS: usize = 3;
/// A step whose peak exceeds the median of the others by this factor (and by 1 MiB) spikes.
const SPIKE_FACTOR: f64 = 1.5;
const SPIKE_MIN_BYTES: u64 = 1 << 20;

/// Growth: an origin whose live bytes rise at every step from the second on. Spikes: a
/// step (after the first) whose peak stands far above the median of the others.
pub fn check(samples: &[StepLive], steps: &[StepReport]) -> GrowthReport {
    // What comes after the last step that finished (the job's exit freeing its memory, or a
    // step cut short) is no step: it would end every series flat.
    let last = steps.iter().map(|s| s.step).max();
    let later: Vec<&StepLive> = samples.iter().filter(|s| s.step > 0 && last.is_none_or(|l| u64::from(s.step) <= l)).collect();
    let mut report = GrowthReport { steps_checked: later.len(), ..Default::default() };
    if later.len() >= MIN_STEPS {
        let mut origins: Vec<&Origin> = later.iter().flat_map(|s| s.by_origin.keys()).collect();
        origins.sort();
        origins.dedup();
        for o in origins {
            let series: Vec<u64> = later.iter().map(|s| s.by_origin.get(o).copied().unwrap_or(0)).collect();
            if series.windows(2).all(|w| w[1] > w[0]) {
                report.growth.push(Growth {
                    origin: o.clone(),
                    first_step: later[0].step,
                    last_step: later[later.len() - 1].step,
                    first_bytes: series[0],
                    last_bytes: series[series.len() - 1],
                });
            }
        }
    }
    let later_steps: Vec<&StepReport> = steps.iter().filter(|s| s.step > 0).collect();
    if later_steps.len() >= MIN_STEPS {
        for s in &later_steps {
            let mut others: Vec<u64> =
                later_steps.iter().filter(|o| o.step != s.step).map(|o| o.peak_allocated_bytes).collect();
            others.sort_unstable();
            let typical = others[others.len() / 2];
            if s.peak_allocated_bytes as f64 > typical as f64 * SPIKE_FACTOR
                && s.peak_allocated_bytes > typical + SPIKE_MIN_BYTES
            {
                let phase = s.phase_peak_bytes.iter().max_by_key(|(_, b)| **b).map_or("other", |(p, _)| p.as_str());
                report.spikes.push(Spike {
                    step: s.step,
                    phase: phase.to_string(),
                    peak_bytes: s.peak_allocated_bytes,
                    typical_bytes: typical,
                });
            }
        }
    }
    report
}

/// The growth check across a torch.profiler trace's profiled steps (`ProfilerStep#N` on
/// `device`): live bytes at each step's end by phase and top frame, and each step's peak,
/// counted from the window's start. The window's first step stands for the job's first.
/// None for a file that is not a trace, or has no steps.
pub fn check_profiled_steps(snap: &Snapshot, device: usize) -> Option<GrowthReport> {
    snap.profiled.as_ref()?;
    let mut spans = snap.annotation_spans(device);
    spans.sort_by_key(|s| s.1);
    let steps: Vec<(i64, i64)> = spans.iter().filter(|s| s.0.starts_with("ProfilerStep#")).map(|s| (s.1, s.2)).collect();
    if steps.is_empty() {
        return None;
    }
    let phases: Vec<(Phase, i64, i64)> = spans.iter().filter_map(|(n, a, b)| Phase::of_annotation(n).map(|(p, _)| (p, *a, *b))).collect();
    let phase_at = |t: i64| phases.iter().find(|(_, a, b)| *a <= t && t <= *b).map_or(Phase::Other, |p| p.0);
    let mut live: HashMap<u64, (u64, Origin)> = HashMap::new();
    let (mut samples, mut reports) = (Vec::new(), Vec::new());
    let (mut k, mut now, mut peak) = (0usize, 0u64, 0u64);
    let mut phase_peaks: BTreeMap<String, u64> = BTreeMap::new();
    let mut close = |k: usize, live: &HashMap<u64, (u64, Origin)>, peak: u64, phase_peaks: &mut BTreeMap<String, u64>| {
        let mut by_origin = BTreeMap::new();
        for (size, origin) in live.values() {
            *by_origin.entry(origin.clone()).or_insert(0) += size;
        }
        samples.push(StepLive { step: k as u32, by_origin });
        reports.push(StepReport { phase_peak_bytes: std::mem::take(phase_peaks), ..StepReport::of_peak(k as u64, peak) });
    };
    for e in snap.trace(device) {
        while k < steps.len() && e.time_us > steps[k].1 {
            close(k, &live, peak, &mut phase_peaks);
            k += 1;
            peak = now;
        }
        if k == steps.len() {
            break;
        }
        match e.action {
            Action::Alloc => {
                let origin = Origin { phase: phase_at(e.time_us), scope: crate::report::frames::top_frame_label(snap, e.frames).unwrap_or_default() };
                live.insert(e.addr, (e.size, origin));
                now += e.size;
            }
            Action::FreeCompleted => {
                if let Some((size, _)) = live.remove(&e.addr) {
                    now -= size;
                }
            }
            _ => continue,
        }
        if e.time_us >= steps[k].0 {
            peak = peak.max(now);
            let p = phase_peaks.entry(phase_at(e.time_us).as_str().to_string()).or_insert(0);
            *p = (*p).max(now);
        }
    }
    if k < steps.len() {
        close(k, &live, peak, &mut phase_peaks);
    }
    Some(check(&samples, &reports))
}

impl fmt::Display for GrowthReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for g in &self.growth {
            let steps = (g.last_step - g.first_step) as u64;
            writeln!(
                f,
                "memory keeps growing: phase {}, scope {}: live at step end {} at step {} → {} at step {} (+{} per step)",
                g.origin.phase.as_str(),
                if g.origin.scope.is_empty() { "(none)" } else { &g.origin.scope },
                bytes(g.first_bytes),
                g.first_step,
                bytes(g.last_bytes),
                g.last_step,
                bytes((g.last_bytes - g.first_bytes) / steps.max(1))
            )?;
        }
        for s in &self.spikes {
            writeln!(
                f,
                "memory spike: step {} peaked at {} in {}, the other steps at about {}",
                s.step,
                bytes(s.peak_bytes),
                s.phase,
                bytes(s.typical_bytes)
            )?;
        }
        if self.steps_checked < MIN_STEPS {
            writeln!(
                f,
                "too few steps to tell: {} after the first, and growth needs {MIN_STEPS} (run at least {} steps)",
                self.steps_checked,
                MIN_STEPS + 1
            )?;
        } else if self.healthy() {
            writeln!(f, "no growth: live memory at step end is steady over {} steps after the first, no spikes", self.steps_checked)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(step: u32, entries: &[(Phase, &str, u64)]) -> StepLive {
        StepLive {
            step,
            by_origin: entries.iter().map(|(p, s, b)| (Origin { phase: *p, scope: s.to_string() }, *b)).collect(),
        }
    }

    #[test]
    fn a_series_growing_every_step_is_growth_and_a_one_off_is_not() {
        let params = (Phase::Other, "", 1000);
        let samples: Vec<StepLive> = (0..5)
            .map(|s| {
                let mut v = vec![params, (Phase::Optimizer, "", 2000)];
                // Kept per step in layers.1.attn during forward.
                v.push((Phase::Forward, "layers.1.attn", 512 * (s as u64 + 1)));
                // A cache filled once at step 2.
                if s >= 2 {
                    v.push((Phase::Backward, "layers.0.ffn", 4096));
                }
                live(s, &v)
            })
            .collect();
        let r = check(&samples, &[]);
        assert_eq!(r.growth.len(), 1, "{r}");
        assert_eq!(r.growth[0].origin.scope, "layers.1.attn");
        assert_eq!((r.growth[0].first_bytes, r.growth[0].last_bytes), (1024, 2560));
        let text = r.to_string();
        assert!(text.contains("phase forward, scope layers.1.attn") && text.contains("+512 B per step"), "{text}");
        let short = check(&samples[..3], &[]);
        assert!(short.growth.is_empty(), "two later steps are too few to call growth");
        assert!(short.to_string().contains("too few steps to tell: 2 after the first"), "{short}");
    }

    #[test]
    fn what_follows_the_last_finished_step_is_not_a_step() {
        // Outputs kept every step; at exit (step 5, never finished) nothing more is kept.
        let samples: Vec<StepLive> = (0..6).map(|s| live(s, &[(Phase::Forward, "fc", 64 * (s.min(4) as u64 + 1))])).collect();
        let steps: Vec<StepReport> = (0..5).map(|s| StepReport::of_peak(s, 1 << 20)).collect();
        let r = check(&samples, &steps);
        assert_eq!((r.growth.len(), r.steps_checked), (1, 4), "{r}");
    }
}
