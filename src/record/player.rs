//! Plays a recording or a snapshot trace: as fast as possible for headless consumers, or
//! paced by the recorded stamps × speed on a thread for the screen, with pause and seek.
//! A recording is decoded one chunk at a time, so memory stays bounded by a chunk.

use std::path::Path;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::io::Read;

use crate::input::{self, Input, Opened};
use crate::source::job::Fed;
use crate::stream::chunk::{has_magic, ChunkReader};
use crate::stream::codec::Record;
use crate::stream::{Incoming, Report};

use super::reader::Recording;
use super::trace::trace_items;
use super::RecordError;

/// Longer gaps (a session paused for minutes) play in this long.
const MAX_GAP: Duration = Duration::from_secs(2);

/// One stamped item of a rank.
type Stamped = (u64, u32, Incoming);

enum Kind {
    /// A file: whole chunks, indexed, so it can be played again from the start.
    Recording(Recording),
    /// A pipe or standard input: chunks as they arrive, once.
    Stream(ChunkReader<Box<dyn Read + Send>>),
    /// A snapshot pickle's device_traces, converted whole (a snapshot is read whole anyway).
    Trace(Vec<(u64, Incoming)>),
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
        let opened = input::open(path, 8).map_err(RecordError::io(path))?;
        let head = opened.head(8).map_err(RecordError::io(path))?;
        let Opened { input, name } = opened;
        let is_pickle = head.first() == Some(&0x80);
        if !has_magic(&head) && !is_pickle {
            return Err(RecordError::NotARecording(name));
        }
        let kind = match input {
            Input::File(_, p) if has_magic(&head) => Kind::Recording(Recording::open(&p)?),
            Input::File(_, p) => Kind::Trace(trace_items(&crate::snapshot::reader::read_snapshot_file(&p)?)),
            Input::Stream { head, rest } if has_magic(&head) => {
                let r: Box<dyn Read + Send> = Box::new(std::io::Cursor::new(head).chain(rest));
                Kind::Stream(ChunkReader::new(r).map_err(|source| RecordError::Stream { name: name.clone(), source })?)
            }
            Input::Stream { head, rest } => {
                let bytes = Opened::read_stream(head, rest, &name).map_err(RecordError::io(path))?;
                Kind::Trace(trace_items(&crate::snapshot::reader::read_snapshot(&bytes)?))
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
            Kind::Trace(items) => (i == 0).then(|| Ok(items.iter().map(|(s, it)| (*s, 0, it.clone())).collect())),
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
            Kind::Trace(items) => format!(
                "replay: {}: snapshot trace, {} events (no training config: phases from annotations, categories where recorded)",
                self.name,
                items.iter().map(|(_, i)| if let Incoming::Batch(b) = i { b.events.len() } else { 0 }).sum::<usize>()
            ),
        }
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
