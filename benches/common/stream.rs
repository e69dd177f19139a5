//! What the screen benches feed the screen: a training-shaped stream of modelled events,
//! made up, or the dense job's as recorded.

use vramscope_core::event::{Action, Batch, Category, MemEvent, Phase, PhaseMark};

/// Per step, forward allocations that mostly survive, backward freeing them, optimizer
/// temporaries: a phase mark every 2000 events, a step every 8000, up to 20,000 live.
pub struct TrainingStream {
    live: Vec<(u64, u64)>,
    seq: u64,
    addr: u64,
    x: u64,
    step: u32,
}

impl TrainingStream {
    pub fn new() -> TrainingStream {
        TrainingStream { live: Vec::new(), seq: 0, addr: 0x7f00_0000_0000, x: 0x9e3779b97f4a7c15, step: 0 }
    }

    /// The stream's next `n` events, as one batch.
    pub fn batch(&mut self, n: usize) -> Batch {
        let mut batch = Batch { first_seq: self.seq, ..Batch::default() };
        for _ in 0..n {
            let seq = self.seq;
            let phase = Phase::ALL[1 + (seq / 2000 % 4) as usize];
            if seq.is_multiple_of(8000) {
                self.step += 1;
            }
            if seq.is_multiple_of(2000) {
                batch.marks.push(PhaseMark { seq, t_ns: seq * 100, step: self.step, phase });
            }
            let x = &mut self.x;
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            let alloc = self.live.len() < 64 || (*x % 100 < 50 && self.live.len() < 20_000);
            let step = self.step;
            let e = if alloc {
                let size = 512 * (1 + *x % 4096);
                self.addr += size;
                self.live.push((self.addr, size));
                MemEvent { t_ns: seq * 100, addr: self.addr, size, stream: 0, step, scope: (*x % 40) as u32, action: Action::Alloc, phase, device: 0, category: Category::provisional(phase) }
            } else {
                let (a, size) = self.live.swap_remove((*x >> 20) as usize % self.live.len());
                MemEvent { t_ns: seq * 100, addr: a, size, stream: 0, step, scope: 0, action: Action::FreeRequested, phase, device: 0, category: Category::Temporary }
            };
            batch.events.push(e);
            self.seq += 1;
        }
        batch
    }
}

/// `events` of the stream in batches of 8192, as the engine sends them.
pub fn training_batches(events: usize) -> Vec<Batch> {
    let mut s = TrainingStream::new();
    (0..events.div_ceil(8192)).map(|i| s.batch(8192.min(events - i * 8192))).collect()
}

/// The dense job's recorded stream (`super::recorded_batches`) played round and round, each
/// round's addresses, steps and times moved past the last's: a longer run of that job.
pub struct RecordedStream {
    events: Vec<MemEvent>,
    /// Phase marks, by the index of the event they precede.
    marks: Vec<PhaseMark>,
    at: usize,
    round: u64,
    seq: u64,
    steps: u32,
    span_ns: u64,
}

impl RecordedStream {
    pub fn new() -> RecordedStream {
        let batches = super::recorded_batches();
        let first = batches.first().map_or(0, |b| b.first_seq);
        let mut marks: Vec<PhaseMark> = batches.iter().flat_map(|b| b.marks.iter().map(|m| PhaseMark { seq: m.seq - first, ..*m })).collect();
        marks.sort_by_key(|m| m.seq);
        let events: Vec<MemEvent> = batches.into_iter().flat_map(|b| b.events).collect();
        let steps = events.iter().map(|e| e.step).max().unwrap_or(0) + 1;
        let span_ns = events.last().map_or(0, |e| e.t_ns) + 1;
        RecordedStream { events, marks, at: 0, round: 0, seq: 0, steps, span_ns }
    }

    /// The stream's next `n` events, as one batch.
    pub fn batch(&mut self, n: usize) -> Batch {
        let mut batch = Batch { first_seq: self.seq, ..Batch::default() };
        for _ in 0..n {
            if self.at == self.events.len() {
                (self.at, self.round) = (0, self.round + 1);
            }
            let (shift, steps, t) = (self.round << 36, self.round as u32 * self.steps, self.round * self.span_ns);
            let from = self.marks.partition_point(|m| (m.seq as usize) < self.at);
            for m in self.marks[from..].iter().take_while(|m| m.seq as usize == self.at) {
                batch.marks.push(PhaseMark { seq: self.seq, t_ns: m.t_ns + t, step: m.step + steps, ..*m });
            }
            let e = self.events[self.at];
            batch.events.push(MemEvent { addr: e.addr + shift, t_ns: e.t_ns + t, step: e.step + steps, ..e });
            self.at += 1;
            self.seq += 1;
        }
        batch
    }
}
