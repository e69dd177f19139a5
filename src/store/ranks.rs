//! A job's ranks, each with its own store (a rank's figures are exact on their own), the
//! one on screen, and how they compare: per-rank peak and the skew between ranks.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::stream::Incoming;

use super::Store;

pub struct Ranks {
    stores: BTreeMap<u32, Store>,
    /// The rank on screen.
    pub shown: u32,
    history_cap: usize,
    /// The recording being written, shown until it stops, whichever rank is on screen.
    pub recording: Option<PathBuf>,
}

/// What the screen shows of a job's ranks besides the one it draws.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankSummary {
    pub shown: u32,
    pub count: usize,
    pub peaks: Vec<RankPeak>,
    pub skew: Option<f64>,
    pub recording: Option<PathBuf>,
}

/// One rank's line in the comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct RankPeak {
    pub rank: u32,
    /// The rank's session peak (`Store::session_peak`).
    pub peak: u64,
}

impl Ranks {
    pub fn new(history_cap: usize) -> Ranks {
        Ranks::with(Store::new(history_cap), history_cap)
    }

    /// Rank 0 already holding `store` (a replay's title and log, a test's screen).
    pub fn with(store: Store, history_cap: usize) -> Ranks {
        Ranks { stores: BTreeMap::from([(0, store)]), shown: 0, history_cap, recording: None }
    }

    /// Routes an item: device gauges are the machine's and go to every rank.
    pub fn ingest(&mut self, rank: u32, item: Incoming) {
        match item {
            Incoming::Gauges(g) => {
                for s in self.stores.values_mut() {
                    s.ingest_gauges(g.clone());
                }
            }
            Incoming::Restart => {
                for s in self.stores.values_mut() {
                    s.restart(self.history_cap);
                }
            }
            item => {
                let cap = self.history_cap;
                let s = self.stores.entry(rank).or_insert_with(|| Store::new(cap));
                s.ingest(item);
            }
        }
    }

    pub fn shown(&self) -> &Store {
        self.stores.get(&self.shown).or_else(|| self.stores.values().next()).expect("rank 0 always exists")
    }

    pub fn shown_mut(&mut self) -> &mut Store {
        let shown = if self.stores.contains_key(&self.shown) { self.shown } else { *self.stores.keys().next().expect("a rank") };
        self.stores.get_mut(&shown).expect("the rank shown exists")
    }

    /// Every rank's store, rank order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Store)> {
        self.stores.iter().map(|(r, s)| (*r, s))
    }

    /// Shows the next rank (wrapping).
    pub fn next_rank(&mut self) {
        let next = self.stores.range(self.shown + 1..).next().or_else(|| self.stores.iter().next()).map(|(r, _)| *r);
        self.shown = next.unwrap_or(0);
    }

    pub fn count(&self) -> usize {
        self.stores.len()
    }

    /// Changes whenever any rank's store does (screens redraw on it).
    pub fn version(&self) -> u64 {
        self.stores.values().map(|s| s.version).sum()
    }

    /// Each rank's peak, rank order.
    pub fn peaks(&self) -> Vec<RankPeak> {
        self.stores.iter().map(|(r, s)| RankPeak { rank: *r, peak: s.session_peak() }).collect()
    }

    /// Highest peak over lowest, across ranks that have finished a step (None below two).
    pub fn skew(&self) -> Option<f64> {
        let peaks: Vec<u64> = self.peaks().into_iter().map(|p| p.peak).filter(|p| *p > 0).collect();
        let (lo, hi) = (peaks.iter().min()?, peaks.iter().max()?);
        (peaks.len() >= 2).then(|| *hi as f64 / *lo as f64)
    }

    pub fn summary(&self) -> RankSummary {
        RankSummary { shown: self.shown, count: self.count(), peaks: self.peaks(), skew: self.skew(), recording: self.recording.clone() }
    }

    /// Every rank has finished streaming.
    pub fn finished(&self) -> bool {
        self.stores.values().all(|s| s.finished)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::{Report, StepReport};
    use crate::step_config::{Mode, Precision};

    fn step(rank: u32, peak: u64) -> Incoming {
        Incoming::Report(Report::Step(StepReport {
            step: 0,
            mode: Mode::Train,
            precision: Precision::Fp32,
            attention: None,
            ctx: 8,
            batch: 2,
            peak_allocated_bytes: peak,
            reserved_bytes: 0,
            peak_reserved_bytes: 0,
            peak_active_bytes: 0,
            phase_peak_bytes: Default::default(),
            category_bytes: Default::default(),
            live_bytes: 0,
            step_time_s: 1.0,
            tokens_per_s: 16.0,
            loss: 0.0,
            dropped_batches: 0,
            dropped_events: 0,
            rank: Some(rank),
        }))
    }

    #[test]
    fn ranks_keep_their_own_figures_and_compare() {
        let mut r = Ranks::new(1 << 10);
        r.ingest(0, step(0, 100));
        r.ingest(1, step(1, 150));
        assert_eq!(r.peaks(), vec![RankPeak { rank: 0, peak: 100 }, RankPeak { rank: 1, peak: 150 }]);
        assert_eq!(r.skew(), Some(1.5));
        assert_eq!(r.shown().session_peak(), 100);
        r.next_rank();
        assert_eq!((r.shown, r.shown().session_peak()), (1, 150));
        r.next_rank();
        assert_eq!(r.shown, 0, "wraps");
        assert!(!r.finished());
        r.ingest(0, Incoming::Report(Report::Finished));
        r.ingest(1, Incoming::Report(Report::Finished));
        assert!(r.finished());
    }
}
