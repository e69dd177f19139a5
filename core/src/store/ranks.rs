//! A job's ranks, each with its own store (a rank's figures are exact on their own), the
//! one on screen, and how they compare: per-rank peak and the skew between ranks. A rank
//! that allocates on several CUDA devices has a store for each device after its first.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::stream::{EngineInfo, Incoming, Report};

use super::Store;

/// Where a store belongs: its rank, and, for a rank's CUDA devices after its first, which.
type Key = (u32, Option<u8>);

pub struct Ranks {
    stores: BTreeMap<Key, Store>,
    /// The rank on screen.
    pub shown: u32,
    /// The device of that rank on screen (None: its first).
    pub shown_device: Option<u8>,
    history_cap: usize,
    /// The recording being written, shown until it stops, whichever rank is on screen.
    pub recording: Option<PathBuf>,
    /// Each rank's first device where it does not say (a snapshot's trace): the device of
    /// its first events.
    first_device: BTreeMap<u32, u8>,
}

/// What the screen shows of a job's ranks besides the one it draws.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankSummary {
    pub shown: u32,
    pub count: usize,
    /// The shown rank's devices, by name, when it allocates on several; and which is shown.
    pub devices: Vec<String>,
    pub device_shown: usize,
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
        Ranks { stores: BTreeMap::from([((0, None), store)]), shown: 0, shown_device: None, history_cap, recording: None, first_device: BTreeMap::new() }
    }

    /// Routes an item: device gauges are the machine's and go to every store; a rank's
    /// other devices get their batches and steps, and what the rank says of itself.
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
            Incoming::Batch(b) => {
                let events_device = b.events.first().map(|e| e.device);
                if let Some(d) = events_device {
                    self.first_device.entry(rank).or_insert(d);
                }
                let device = events_device.filter(|d| self.is_other_device(rank, *d));
                // Names are the rank's, whichever device's batch brought them.
                if !b.scopes.is_empty() {
                    for (k, s) in self.stores.range_mut((rank, None)..=(rank, Some(u8::MAX))) {
                        if k.1 != device {
                            s.ingest_batch(crate::event::Batch { scopes: b.scopes.clone(), ..Default::default() });
                        }
                    }
                }
                self.store((rank, device)).ingest(Incoming::Batch(b));
            }
            Incoming::Report(Report::Step(r)) => self.store((rank, r.device)).ingest_report(Report::Step(r)),
            Incoming::Report(r @ (Report::Started(_) | Report::Paused(_) | Report::Finished)) => {
                self.store((rank, None));
                let keys: Vec<Key> = self.stores.range((rank, None)..=(rank, Some(u8::MAX))).map(|(k, _)| *k).collect();
                for k in keys {
                    let r = match (&r, k.1) {
                        (Report::Started(info), Some(d)) => Report::Started(Self::of_device(info, d)),
                        _ => r.clone(),
                    };
                    self.stores.get_mut(&k).expect("listed").ingest_report(r);
                }
            }
            item => self.store((rank, None)).ingest(item),
        }
    }

    /// Device `d`'s events are not those of the rank's first device: the CUDA device it
    /// says it follows, else the device of its first events.
    fn is_other_device(&self, rank: u32, d: u8) -> bool {
        let first = match self.stores.get(&(rank, None)).and_then(|s| s.info.as_ref()) {
            Some(i) if i.cuda => i.device.strip_prefix("cuda:").and_then(|n| n.parse::<u8>().ok()),
            _ => self.first_device.get(&rank).copied(),
        };
        first.is_some_and(|f| f != d)
    }

    /// The store at `key`, made at its first item; another device's starts knowing who the
    /// rank is.
    fn store(&mut self, key: Key) -> &mut Store {
        let cap = self.history_cap;
        if !self.stores.contains_key(&key) {
            let mut s = Store::new(cap);
            if let Some(other) = self.stores.values().next() {
                s.adopt_gauges(&other.gauges);
            }
            if let (Some(d), Some(main)) = (key.1, self.stores.get(&(key.0, None))) {
                // Another device of a rank: who the rank is, the names it gave, and, in a
                // replay, what is replayed, with the device said.
                s.ingest_batch(crate::event::Batch { scopes: main.scopes.iter().cloned().enumerate().map(|(i, n)| (i as u32, n)).collect(), ..Default::default() });
                s.title = main.title.clone();
                if let Some(info) = main.info.clone() {
                    s.ingest_report(Report::Started(Self::of_device(&info, d)));
                }
            }
            self.stores.insert(key, s);
        }
        self.stores.get_mut(&key).expect("made above")
    }

    /// What a rank says of itself, as its device `d` shows it.
    fn of_device(info: &EngineInfo, d: u8) -> EngineInfo {
        EngineInfo { device: format!("cuda:{d}"), pci_bus_id: None, note: None, ..info.clone() }
    }

    fn shown_key(&self) -> Key {
        [(self.shown, self.shown_device), (self.shown, None)]
            .into_iter()
            .find(|k| self.stores.contains_key(k))
            .unwrap_or_else(|| *self.stores.keys().next().expect("rank 0 always exists"))
    }

    pub fn shown(&self) -> &Store {
        &self.stores[&self.shown_key()]
    }

    pub fn shown_mut(&mut self) -> &mut Store {
        let k = self.shown_key();
        self.stores.get_mut(&k).expect("the store shown exists")
    }

    /// Every store, rank order, each rank's devices together.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Store)> {
        self.stores.iter().map(|((r, _), s)| (*r, s))
    }

    /// Shows the next rank (wrapping), from its first device.
    pub fn next_rank(&mut self) {
        let next = self.stores.range((self.shown + 1, None)..).next().or_else(|| self.stores.iter().next()).map(|((r, _), _)| *r);
        self.shown = next.unwrap_or(0);
        self.shown_device = None;
    }

    /// The shown rank's devices: None (its first), then the others in order.
    fn devices(&self) -> Vec<Option<u8>> {
        self.stores.range((self.shown, None)..=(self.shown, Some(u8::MAX))).map(|((_, d), _)| *d).collect()
    }

    /// Shows the shown rank's next device (wrapping).
    pub fn next_device(&mut self) {
        let devices = self.devices();
        let at = devices.iter().position(|d| *d == self.shown_device).unwrap_or(0);
        self.shown_device = devices.get((at + 1) % devices.len().max(1)).copied().flatten();
    }

    /// Ranks, not counting their devices.
    pub fn count(&self) -> usize {
        self.stores.keys().filter(|(_, d)| d.is_none()).count()
    }

    /// Changes whenever any rank's store does, or another one is shown (screens redraw on
    /// it).
    pub fn version(&self) -> u64 {
        let shown = u64::from(self.shown) + self.shown_device.map_or(0, |d| u64::from(d) + 1);
        self.stores.values().map(|s| s.version).sum::<u64>() + shown
    }

    /// Each rank's peak (of its first device), rank order.
    pub fn peaks(&self) -> Vec<RankPeak> {
        self.stores.iter().filter(|((_, d), _)| d.is_none()).map(|((r, _), s)| RankPeak { rank: *r, peak: s.session_peak() }).collect()
    }

    /// Highest peak over lowest, across ranks that have finished a step (None below two).
    pub fn skew(&self) -> Option<f64> {
        let peaks: Vec<u64> = self.peaks().into_iter().map(|p| p.peak).filter(|p| *p > 0).collect();
        let (lo, hi) = (peaks.iter().min()?, peaks.iter().max()?);
        (peaks.len() >= 2).then(|| *hi as f64 / *lo as f64)
    }

    pub fn summary(&self) -> RankSummary {
        let devices = self.devices();
        let (names, device_shown) = if devices.len() > 1 {
            let first = self.first_device.get(&self.shown).map_or_else(|| "first".to_string(), |d| format!("cuda:{d}"));
            let name = |d: &Option<u8>| match (self.stores[&(self.shown, *d)].info.as_ref(), d) {
                (Some(i), _) => i.device.clone(),
                (None, Some(d)) => format!("cuda:{d}"),
                (None, None) => first.clone(),
            };
            (devices.iter().map(name).collect(), devices.iter().position(|d| *d == self.shown_device).unwrap_or(0))
        } else {
            (Vec::new(), 0)
        };
        RankSummary {
            shown: self.shown,
            count: self.count(),
            devices: names,
            device_shown,
            peaks: self.peaks(),
            skew: self.skew(),
            recording: self.recording.clone(),
        }
    }

    /// Every rank has finished streaming.
    pub fn finished(&self) -> bool {
        self.stores.values().all(|s| s.finished)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::StepReport;

    fn step(rank: u32, peak: u64) -> Incoming {
        Incoming::Report(Report::Step(StepReport { rank: Some(rank), ..StepReport::of_peak(0, peak) }))
    }

    #[test]
    fn a_rank_that_streams_later_has_the_machines_gauges_and_says_where_they_come_from() {
        use crate::source::gauges::sample::{GaugeBatch, SourceKind, SourceStatus};
        let mut r = Ranks::new(1 << 10);
        let status = SourceStatus { kind: SourceKind::Host, reason: Some("no NVML".into()) };
        r.ingest(0, Incoming::Gauges(GaugeBatch { first_seq: 0, status: Some(status), samples: Vec::new() }));
        r.ingest(0, Incoming::Gauges(GaugeBatch { first_seq: 0, status: None, samples: Vec::new() }));
        r.ingest(1, step(1, 150));
        r.next_rank();
        let one = r.shown();
        assert_eq!(one.log.front().map(|l| l.text.as_str()), Some("device gauges: host (no NVML)"), "its log is not empty");
        assert_eq!(one.gauges.missed(), 0);
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
