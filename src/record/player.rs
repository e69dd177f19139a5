//! Plays a recording or a snapshot trace: as fast as possible for headless consumers, or
//! paced by the recorded stamps × speed on a thread for the screen, with pause and seek.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use tokio::sync::mpsc;

use crate::source::feed::Incoming;
use crate::train::engine::Report;

use super::reader::{has_magic, Recording};
use super::trace::trace_items;
use super::RecordError;

/// Longer gaps (a session paused for minutes) play in this long.
const MAX_GAP: Duration = Duration::from_secs(2);

/// What can be played.
pub enum Script {
    Recording(Recording),
    /// A snapshot pickle's device_traces, converted whole (snapshots are bounded in size).
    Trace { path: PathBuf, items: Vec<(u64, Incoming)> },
}

impl Script {
    /// A recording or a memory snapshot pickle, told apart by their first bytes.
    pub fn open(path: &Path) -> Result<Script, RecordError> {
        let mut head = [0u8; 8];
        let n = std::fs::File::open(path).and_then(|mut f| f.read(&mut head)).map_err(RecordError::io(path))?;
        if has_magic(&head[..n]) {
            return Ok(Script::Recording(Recording::open(path)?));
        }
        // Pickle protocol 2+ starts with PROTO (0x80).
        if head[..n].first() == Some(&0x80) {
            let snap = crate::snapshot::reader::read_snapshot_file(path)?;
            return Ok(Script::Trace { path: path.to_path_buf(), items: trace_items(&snap) });
        }
        Err(RecordError::NotARecording(path.to_path_buf()))
    }

    fn parts(&self) -> usize {
        match self {
            Script::Recording(r) => r.chunk_count(),
            Script::Trace { .. } => 1,
        }
    }

    fn part(&self, i: usize) -> Result<Vec<(u64, Incoming)>, RecordError> {
        match self {
            Script::Recording(r) => r.items(i),
            Script::Trace { items, .. } => Ok(items.clone()),
        }
    }

    /// What is being played and how it ends, in one line.
    pub fn describe(&self) -> String {
        match self {
            Script::Recording(r) => r.ending_line(),
            Script::Trace { path, items } => format!(
                "replay: {}: snapshot trace, {} events (no training config: phases from annotations, categories where recorded)",
                path.display(),
                items.iter().map(|(_, i)| if let Incoming::Batch(b) = i { b.events.len() } else { 0 }).sum::<usize>()
            ),
        }
    }

    /// Every item in order, unpaced. A chunk that fails to decode ends the stream and
    /// leaves its error in `failed`.
    pub fn stream<'a>(&'a self, failed: &'a mut Option<RecordError>) -> impl Iterator<Item = Incoming> + 'a {
        (0..self.parts()).map_while(move |i| match self.part(i) {
            Ok(items) => Some(items.into_iter().map(|(_, item)| item)),
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
pub fn spawn_player(script: Script, speed: f64, tx: mpsc::Sender<Incoming>) -> Sender<PlayerCommand> {
    let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
    std::thread::Builder::new()
        .name("vramscope-replay".into())
        .spawn(move || {
            let mut p = Player { script, tx, speed, paused: false, seek_to: None, last_step: None, part: 0, items: Vec::new(), next: 0, last_stamp: None, due: None };
            p.play(cmd_rx);
        })
        .expect("spawn replay thread");
    cmd_tx
}

struct Player {
    script: Script,
    tx: mpsc::Sender<Incoming>,
    speed: f64,
    paused: bool,
    /// Play unpaced until the report of this step has gone out.
    seek_to: Option<u64>,
    last_step: Option<u64>,
    part: usize,
    items: Vec<(u64, Incoming)>,
    next: usize,
    last_stamp: Option<u64>,
    /// When the next item is due (unset while paused or seeking).
    due: Option<Instant>,
}

enum Next {
    Item(u64, Incoming),
    End,
}

impl Player {
    fn send(&self, item: Incoming) -> bool {
        self.tx.blocking_send(item).is_ok()
    }

    fn set_paused(&mut self, paused: bool) -> bool {
        self.paused = paused;
        self.due = None;
        self.send(Incoming::Report(Report::Paused(paused)))
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
                let target = self.last_step.and_then(|s| s.checked_sub(1));
                (self.part, self.items, self.next, self.last_stamp, self.last_step) = (0, Vec::new(), 0, None, None);
                if !self.send(Incoming::Restart) {
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
            if self.part >= self.script.parts() {
                return Next::End;
            }
            match self.script.part(self.part) {
                Ok(items) => (self.items, self.next) = (items, 0),
                Err(e) => {
                    let _ = self.send(Incoming::Report(Report::Error(e.to_string())));
                    self.part = self.script.parts();
                    return Next::End;
                }
            }
            self.part += 1;
        }
        let (stamp, item) = self.items[self.next].clone();
        Next::Item(stamp, item)
    }

    fn play(&mut self, commands: Receiver<PlayerCommand>) {
        loop {
            let next = self.peek();
            let waiting = matches!(next, Next::End) || (self.paused && self.seek_to.is_none());
            if waiting {
                match commands.recv() {
                    Ok(c) if self.command(c) => continue,
                    _ => return,
                }
            }
            let Next::Item(stamp, item) = next else { unreachable!("End waits above") };
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
            if !self.send(item) {
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
