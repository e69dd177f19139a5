//! Plays a recording or a snapshot trace: as fast as possible for headless consumers, or
//! paced by the recorded stamps × speed on a thread for the screen, with pause and seek.
//! A recording is decoded one chunk at a time, so memory stays bounded by a chunk. A
//! snapshot trace (often well under a second of training) is stretched to be watchable and
//! cut into small batches that begin where its annotated phases do, so seeking by step
//! stops exactly at a step's start.

use std::path::Path;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::io::Read;

use crate::event::{Batch, Phase};
use crate::input::{self, Input};
use crate::snapshot::ReadError;
use crate::source::job::Fed;
use crate::stream::chunk::{has_magic, ChunkReader};
use crate::stream::codec::Record;
use crate::stream::{Incoming, Report};

use super::reader::Recording;
use super::trace::trace_items;
use super::RecordError;

/// Longer gaps (a session paused for minutes) play in this long.
const MAX_GAP: Duration = Duration::from_secs(2);
/// A shorter snapshot trace plays over this long at speed 1.
const WATCHABLE_NS: u64 = 20_000_000_000;
/// Events per batch of a trace as it plays: the screen moves a little at a time.
const TRACE_PIECE: usize = 32;

/// One stamped item of a rank.
type Stamped = (u64, u32, Incoming);

enum Kind {
    /// A file: whole chunks, indexed, so it can be played again from the start.
    Recording(Recording),
    /// A pipe or standard input: chunks as they arrive, once.
    Stream(ChunkReader<Box<dyn Read + Send>>),
    /// A snapshot pickle's device_traces, converted whole (a snapshot is read whole anyway).
    Trace(Trace),
}

/// A snapshot trace ready to play.
struct Trace {
    items: Vec<(u64, Incoming)>,
    /// Its events span this long, as recorded.
    span_ns: u64,
    /// Stamps are this many times the recorded times, so it plays for `WATCHABLE_NS`.
    stretch: u64,
    events: usize,
    /// Annotations marked its phases (and steps).
    has_steps: bool,
}

impl Trace {
    fn new(items: Vec<(u64, Incoming)>) -> Trace {
        let span_ns = items.iter().map(|(s, _)| *s).max().unwrap_or(0);
        let stretch = (WATCHABLE_NS / span_ns.max(1)).max(1);
        let batches = || items.iter().filter_map(|(_, i)| if let Incoming::Batch(b) = i { Some(b) } else { None });
        let events = batches().map(|b| b.events.len()).sum();
        let has_steps = batches().any(|b| b.marks.iter().any(|m| m.phase != Phase::Other));
        let items = items
            .into_iter()
            .flat_map(|(stamp, item)| match item {
                Incoming::Batch(b) => split_batch(b).into_iter().map(|b| (b.events.last().map_or(stamp, |e| e.t_ns) * stretch, Incoming::Batch(b))).collect(),
                other => vec![(stamp * stretch, other)],
            })
            .collect();
        Trace { items, span_ns, stretch, events, has_steps }
    }
}

/// Cuts a batch into pieces of at most `TRACE_PIECE` events, each phase mark starting a
/// new piece. Names come first, retags last, as the whole batch would apply them.
fn split_batch(b: Batch) -> Vec<Batch> {
    let Batch { first_seq, events, mut marks, retags, scopes } = b;
    marks.sort_by_key(|m| m.seq);
    let mut marks = marks.into_iter().peekable();
    let mut out: Vec<Batch> = Vec::new();
    let mut piece = Batch { first_seq, scopes, ..Batch::default() };
    for (k, e) in events.into_iter().enumerate() {
        let seq = first_seq + k as u64;
        let marked = marks.peek().is_some_and(|m| m.seq <= seq);
        if !piece.events.is_empty() && (marked || piece.events.len() == TRACE_PIECE) {
            out.push(std::mem::replace(&mut piece, Batch { first_seq: seq, ..Batch::default() }));
        }
        piece.marks.extend(std::iter::from_fn(|| marks.next_if(|m| m.seq <= seq)));
        piece.events.push(e);
    }
    piece.marks.extend(marks);
    piece.retags = retags;
    out.push(piece);
    out
}

/// The step a batch begins, when it begins at a phase mark of one.
fn begins_step(item: &Incoming) -> Option<u64> {
    let Incoming::Batch(b) = item else { return None };
    let m = b.marks.first().filter(|m| m.seq == b.first_seq && m.phase != Phase::Other)?;
    Some(u64::from(m.step))
}

/// What can be played, and how far it has been.
pub struct Script {
    kind: Kind,
    /// What it is called in messages.
    pub name: String,
    /// The next part (chunk) to play.
    next: usize,
    /// How a stream ended, once it has.
    stream_end: Option<Result<(), String>>,
}

impl Script {
    /// A recording or a memory snapshot pickle (a file, `-`, or a pipe), told apart by
    /// their first bytes.
    pub fn open(path: &Path) -> Result<Script, RecordError> {
        Script::open_at(path, None)
    }

    /// As `open`, a snapshot's `device` first (its default device when None: the one with
    /// allocations); its other devices play beside it, each on its own.
    pub fn open_at(path: &Path, device: Option<usize>) -> Result<Script, RecordError> {
        // The directory tensorboard_trace_handler wrote: its first trace.
        if path.is_dir() {
            let name = path.display().to_string();
            let snap = crate::profiler::read_trace(path).map_err(|e| RecordError::from(ReadError::Trace(e)))?;
            let first = crate::snapshot::pick_device(&name, &snap, device)?;
            return Ok(Script { kind: Kind::Trace(Trace::new(trace_items(&snap, first))), name, next: 0, stream_end: None });
        }
        let opened = input::open(path, 8).map_err(RecordError::io(path))?;
        let head = opened.head(8).map_err(RecordError::io(path))?;
        let name = opened.name.clone();
        if !has_magic(&head) && head.first() != Some(&0x80) && !crate::profiler::looks_like_trace(&head) {
            return Err(RecordError::NotARecording(name));
        }
        if device.is_some() && has_magic(&head) {
            return Err(RecordError::DeviceOfRecording(name));
        }
        let kind = match opened.input {
            Input::File(_, p) if has_magic(&head) => Kind::Recording(Recording::open(&p)?),
            Input::Stream { head, rest } if has_magic(&head) => {
                let r: Box<dyn Read + Send> = Box::new(std::io::Cursor::new(head).chain(rest));
                Kind::Stream(ChunkReader::new(r).map_err(|source| RecordError::Stream { name: name.clone(), source })?)
            }
            // A snapshot pickle, read as `view` reads it.
            _ => {
                let snap = crate::snapshot::reader::read_snapshot_opened(opened, path, &mut |_| {}).map_err(|e| match e {
                    ReadError::Io { path, err } => RecordError::Io { path, err },
                    e => e.into(),
                })?;
                let first = crate::snapshot::pick_device(&name, &snap, device)?;
                Kind::Trace(Trace::new(trace_items(&snap, first)))
            }
        };
        Ok(Script { kind, name, next: 0, stream_end: None })
    }

    pub fn from_recording(r: Recording) -> Script {
        Script { name: r.name.clone(), kind: Kind::Recording(r), next: 0, stream_end: None }
    }

    /// The next part's items; None at the end.
    fn next_part(&mut self) -> Option<Result<Vec<Stamped>, RecordError>> {
        let i = self.next;
        self.next += 1;
        match &mut self.kind {
            Kind::Recording(r) => (i < r.chunk_count()).then(|| r.items(i)),
            Kind::Trace(t) => (i == 0).then(|| Ok(t.items.iter().map(|(s, it)| (*s, 0, it.clone())).collect())),
            Kind::Stream(reader) => {
                if self.stream_end.is_some() {
                    return None;
                }
                match reader.next_chunk() {
                    Ok(Some(records)) => Some(Ok(records
                        .into_iter()
                        .filter_map(|r| match r {
                            Record::Item { stamp_ns, rank, item } => Some((stamp_ns, rank, item)),
                            Record::End => None,
                        })
                        .collect())),
                    Ok(None) => {
                        self.stream_end = Some(Ok(()));
                        None
                    }
                    Err(source) => {
                        self.stream_end = Some(Err(source.to_string()));
                        Some(Err(RecordError::Stream { name: self.name.clone(), source }))
                    }
                }
            }
        }
    }

    /// Plays again from the start; a stream cannot.
    fn rewind(&mut self) -> Result<(), String> {
        match self.kind {
            Kind::Stream(_) => Err(format!("{} is a stream: it cannot go back (replay a file to seek back)", self.name)),
            _ => {
                self.next = 0;
                Ok(())
            }
        }
    }

    /// The recording file is broken (after its good chunks), as an error.
    pub fn failure(&self) -> Option<String> {
        match &self.kind {
            Kind::Recording(r) => r.corrupt(),
            _ => None,
        }
    }

    /// What is being played and how it ends, in one line.
    pub fn describe(&self) -> String {
        match &self.kind {
            Kind::Recording(r) => r.ending_line(),
            Kind::Stream(r) => match &self.stream_end {
                Some(Ok(())) if r.ended() => format!("replay: {}: {} chunks, recording closed normally", self.name, r.chunks()),
                Some(Ok(())) => format!("replay: {}: {} whole chunks and no end record", self.name, r.chunks()),
                Some(Err(e)) => format!("replay: {}: stopped after {} whole chunks: {e}", self.name, r.chunks()),
                None => format!("replay: {}: a stream, {} chunks so far", self.name, r.chunks()),
            },
            Kind::Trace(t) => format!(
                "replay: {}: snapshot trace, {} events over {}{} (no training config: {}, categories where recorded)",
                self.name,
                t.events,
                crate::format::seconds(t.span_ns),
                if t.stretch > 1 { format!(", played {}× slower to be watchable", t.stretch) } else { String::new() },
                if t.has_steps { "phases and steps from annotations" } else { "no step annotations, so n and N cannot seek" },
            ),
        }
    }

    /// Whether it has steps to seek by.
    fn has_steps(&self) -> bool {
        !matches!(&self.kind, Kind::Trace(t) if !t.has_steps)
    }

    /// Every item in order, unpaced. A chunk that fails to decode ends the stream and
    /// leaves its error in `failed`.
    pub fn stream<'a>(&'a mut self, failed: &'a mut Option<RecordError>) -> impl Iterator<Item = Fed> + 'a {
        std::iter::from_fn(move || match self.next_part()? {
            Ok(items) => Some(items.into_iter().map(|(_, rank, item)| (rank, item))),
            Err(e) => {
                *failed = Some(e);
                None
            }
        })
        .flatten()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PlayerCommand {
    TogglePause,
    Speed(f64),
    /// Play without pacing to the end of the next step, then pause.
    NextStep,
    /// Start again from an empty store and play to the end of the previous step, paused.
    PrevStep,
}

/// Plays `script` on a thread into `tx`, paced by its stamps / `speed`. The thread ends
/// when the receiver or the command sender is dropped.
pub fn spawn_player(script: Script, speed: f64, tx: Sender<Fed>) -> Sender<PlayerCommand> {
    let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
    std::thread::Builder::new()
        .name("vramscope-replay".into())
        .spawn(move || {
            let mut p = Player { script, tx, speed, paused: false, seek_to: None, last_step: None, items: Vec::new(), next: 0, last_stamp: None, due: None };
            p.play(cmd_rx);
        })
        .expect("spawn replay thread");
    cmd_tx
}

struct Player {
    script: Script,
    tx: Sender<Fed>,
    speed: f64,
    paused: bool,
    /// Play unpaced until the report of this step has gone out.
    seek_to: Option<u64>,
    last_step: Option<u64>,
    items: Vec<Stamped>,
    next: usize,
    last_stamp: Option<u64>,
    /// When the next item is due (unset while paused or seeking).
    due: Option<Instant>,
}

// An item passes by value once; boxing it would cost an allocation per item.
#[allow(clippy::large_enum_variant)]
enum Next {
    Item(u64, u32, Incoming),
    End,
}

impl Player {
    fn send(&self, rank: u32, item: Incoming) -> bool {
        self.tx.send((rank, item)).is_ok()
    }

    fn set_paused(&mut self, paused: bool) -> bool {
        self.paused = paused;
        self.due = None;
        self.send(0, Incoming::Report(Report::Paused(paused)))
    }

    /// False when the consumer has gone.
    fn command(&mut self, c: PlayerCommand) -> bool {
        match c {
            PlayerCommand::TogglePause => return self.set_paused(!self.paused),
            PlayerCommand::Speed(s) => {
                self.speed = s;
                self.due = None;
            }
            PlayerCommand::NextStep | PlayerCommand::PrevStep if !self.script.has_steps() => {
                return self.send(0, Incoming::Report(Report::Note(format!("{} has no step annotations: nothing to seek by", self.script.name))));
            }
            PlayerCommand::NextStep => self.seek_to = Some(self.last_step.map_or(0, |s| s + 1)),
            PlayerCommand::PrevStep => {
                if let Err(why) = self.script.rewind() {
                    return self.send(0, Incoming::Report(Report::Note(why)));
                }
                let target = self.last_step.and_then(|s| s.checked_sub(1));
                (self.items, self.next, self.last_stamp, self.last_step) = (Vec::new(), 0, None, None);
                if !self.send(0, Incoming::Restart) {
                    return false;
                }
                self.seek_to = target;
                if target.is_none() {
                    return self.set_paused(true);
                }
            }
        }
        true
    }

    fn peek(&mut self) -> Next {
        while self.next == self.items.len() {
            match self.script.next_part() {
                None => return Next::End,
                Some(Ok(items)) => (self.items, self.next) = (items, 0),
                Some(Err(e)) => {
                    let _ = self.send(0, Incoming::Report(Report::Error(e.to_string())));
                    return Next::End;
                }
            }
        }
        let (stamp, rank, item) = self.items[self.next].clone();
        Next::Item(stamp, rank, item)
    }

    fn play(&mut self, commands: Receiver<PlayerCommand>) {
        let mut said_end = false;
        loop {
            let next = self.peek();
            if matches!(next, Next::End) && !said_end {
                said_end = true;
                if let Some(why) = self.script.failure() {
                    let _ = self.send(0, Incoming::Report(Report::Error(why)));
                }
            }
            let waiting = matches!(next, Next::End) || (self.paused && self.seek_to.is_none());
            if waiting {
                match commands.recv() {
                    Ok(c) if self.command(c) => {
                        said_end = false;
                        continue;
                    }
                    _ => return,
                }
            }
            let Next::Item(stamp, rank, item) = next else { unreachable!("End waits above") };
            // A trace says a step ended by beginning the next: stop before it when seeking.
            if let Some(done) = begins_step(&item).and_then(|s| s.checked_sub(1)) {
                self.last_step = self.last_step.max(Some(done));
                if self.seek_to.is_some_and(|t| done >= t) {
                    self.seek_to = None;
                    if !self.set_paused(true) {
                        return;
                    }
                    continue;
                }
            }
            if self.seek_to.is_none() {
                let gap = Duration::from_nanos(self.last_stamp.map_or(0, |l| stamp.saturating_sub(l)));
                let due = *self.due.get_or_insert_with(|| Instant::now() + gap.div_f64(self.speed).min(MAX_GAP));
                match commands.recv_deadline(due) {
                    Ok(c) if self.command(c) => continue,
                    Ok(_) | Err(RecvTimeoutError::Disconnected) => return,
                    Err(RecvTimeoutError::Timeout) => {}
                }
            }
            self.next += 1;
            self.last_stamp = Some(stamp);
            self.due = None;
            let step = if let Incoming::Report(Report::Step(s)) = &item { Some(s.step) } else { None };
            if !self.send(rank, item) {
                return;
            }
            if let Some(s) = step {
                self.last_step = Some(s);
                if self.seek_to.is_some_and(|t| s >= t) {
                    self.seek_to = None;
                    if !self.set_paused(true) {
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Action, Category, MemEvent, PhaseMark};

    /// A trace of `steps` steps of 100 events each, 10 µs apart; each step's forward mark
    /// is on its first event and its backward mark on its 60th.
    fn trace(steps: u32) -> Vec<(u64, Incoming)> {
        let mut b = Batch::default();
        for step in 0..steps {
            for k in 0..100u64 {
                let seq = u64::from(step) * 100 + k;
                let phase = if k < 60 { Phase::Forward } else { Phase::Backward };
                if k == 0 || k == 60 {
                    b.marks.push(PhaseMark { seq, t_ns: seq * 10_000, step, phase });
                }
                b.events.push(MemEvent { t_ns: seq * 10_000, addr: seq, size: 512, stream: 0, step, scope: 0, action: Action::Alloc, phase, device: 0, category: Category::Unknown });
            }
        }
        let end = b.events.last().unwrap().t_ns;
        vec![(end, Incoming::Batch(b)), (end, Incoming::Report(Report::Finished))]
    }

    fn script(items: Vec<(u64, Incoming)>) -> Script {
        Script { kind: Kind::Trace(Trace::new(items)), name: "t.pickle".into(), next: 0, stream_end: None }
    }

    #[test]
    fn a_trace_is_cut_at_its_phases_and_stretched_to_be_watchable() {
        let t = Trace::new(trace(3));
        let batches: Vec<&Batch> = t.items.iter().filter_map(|(_, i)| if let Incoming::Batch(b) = i { Some(b) } else { None }).collect();
        assert!(batches.iter().all(|b| b.events.len() <= TRACE_PIECE));
        assert_eq!(batches.iter().map(|b| b.events.len()).sum::<usize>(), 300);
        // Every mark opens its piece, and pieces follow one another without a gap.
        for b in &batches {
            assert!(b.marks.iter().all(|m| m.seq == b.first_seq), "{:?}", b.marks);
        }
        for w in batches.windows(2) {
            assert_eq!(w[1].first_seq, w[0].first_seq + w[0].events.len() as u64);
        }
        assert_eq!(batches.iter().filter(|b| !b.marks.is_empty()).count(), 6);
        // 2.99 ms of trace: played over about 20 s, and said so.
        assert_eq!(t.span_ns, 2_990_000);
        assert_eq!(t.items.last().unwrap().0, 2_990_000 * t.stretch);
        assert!((19_000_000_000..=20_000_000_000).contains(&(t.span_ns * t.stretch)));
        let s = script(trace(3));
        assert!(s.describe().contains("300 events over 3.0 ms, played 6688× slower"), "{}", s.describe());
    }

    /// Items up to the next `Paused(true)`, as the screen receives them.
    fn until_paused(rx: &crossbeam_channel::Receiver<crate::source::job::Fed>) -> Vec<Incoming> {
        let mut out = Vec::new();
        loop {
            let (_, item) = rx.recv_timeout(Duration::from_secs(10)).expect("the player pauses");
            if item == Incoming::Report(Report::Paused(true)) {
                return out;
            }
            out.push(item);
        }
    }

    fn events(items: &[Incoming]) -> Vec<u32> {
        items.iter().flat_map(|i| if let Incoming::Batch(b) = i { b.events.iter().map(|e| e.step).collect() } else { vec![] }).collect()
    }

    #[test]
    fn n_and_shift_n_seek_a_traces_steps_by_its_annotations() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let player = spawn_player(script(trace(3)), 1.0, tx);
        player.send(PlayerCommand::NextStep).unwrap();
        let got = until_paused(&rx);
        // To the end of step 0 and not an event further.
        let steps = events(&got);
        assert_eq!(steps.last(), Some(&0));
        assert_eq!(steps.len() % 100, 0, "whole steps: {}", steps.len());
        player.send(PlayerCommand::NextStep).unwrap();
        assert_eq!(events(&until_paused(&rx)), vec![1; 100], "exactly step 1");
        player.send(PlayerCommand::PrevStep).unwrap();
        let back = until_paused(&rx);
        assert_eq!(back.first(), Some(&Incoming::Restart));
        assert_eq!(events(&back), vec![0; 100], "from the start to the end of step 0");
    }

    #[test]
    fn a_trace_without_annotations_says_it_cannot_seek() {
        let mut items = trace(2);
        if let Incoming::Batch(b) = &mut items[0].1 {
            b.marks.clear();
        }
        let s = script(items);
        assert!(s.describe().contains("no step annotations"), "{}", s.describe());
        let (tx, rx) = crossbeam_channel::unbounded();
        let player = spawn_player(s, 1.0, tx);
        player.send(PlayerCommand::TogglePause).unwrap();
        player.send(PlayerCommand::NextStep).unwrap();
        let said = std::iter::from_fn(|| rx.recv_timeout(Duration::from_secs(10)).ok()).find_map(|(_, i)| match i {
            Incoming::Report(Report::Note(n)) => Some(n),
            _ => None,
        });
        assert_eq!(said.as_deref(), Some("t.pickle has no step annotations: nothing to seek by"));
    }
}
