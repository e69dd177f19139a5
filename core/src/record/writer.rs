//! Writes a recording as the session runs. The file is created with create_new (never an
//! existing file) and written in place rather than via a temporary file: a session killed
//! with SIGKILL must leave every chunk written so far behind. Chunks are not fsynced one by
//! one (the kernel keeps written pages when the process dies; only a power cut loses the
//! tail); the file is fsynced when the recording is closed.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::stream::chunk::{header, ChunkWriter};
use crate::stream::Incoming;

use super::RecordError;

/// A chunk is written once it spans this long (or reaches the stream's size limits).
const CHUNK_NS: u64 = 1_000_000_000;
/// zstd level: higher levels cost milliseconds per chunk on the consumer thread, not the
/// training thread, and buy a few percent of size.
const ZSTD_LEVEL: i32 = 9;

/// What was written, for the closing message and the benchmark.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordSummary {
    pub path: PathBuf,
    pub events: u64,
    pub chunks: u64,
    pub bytes: u64,
}

pub struct Recorder {
    file: File,
    chunks: ChunkWriter,
    path: PathBuf,
    bytes: u64,
    /// The first write error; recording stops there and `finish` reports it.
    failed: Option<String>,
}

impl Recorder {
    /// A new file, readable by its owner only (it holds the job's paths and stacks).
    pub fn create(path: &Path) -> Result<Recorder, RecordError> {
        let mut file = File::options().write(true).create_new(true).mode(0o600).open(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                RecordError::Exists(path.to_path_buf())
            } else {
                RecordError::Io { path: path.to_path_buf(), err: e }
            }
        })?;
        let h = header();
        file.write_all(&h).map_err(RecordError::io(path))?;
        Ok(Recorder { file, chunks: ChunkWriter::new(ZSTD_LEVEL, CHUNK_NS), path: path.to_path_buf(), bytes: h.len() as u64, failed: None })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records one item of `rank` received at `stamp_ns` (monotonic clock).
    pub fn record(&mut self, stamp_ns: u64, rank: u32, item: &Incoming) -> Result<(), RecordError> {
        if let Some(e) = &self.failed {
            return Err(RecordError::Stopped(e.clone()));
        }
        let r = self.chunks.push(stamp_ns, rank, item).map_err(RecordError::from).and_then(|chunks| self.write(chunks));
        self.note(r)
    }

    /// Writes the open chunk if it has been open for a second (called on idle ticks, so a
    /// quiet session still reaches the disk).
    pub fn flush_if_due(&mut self, now_ns: u64) -> Result<(), RecordError> {
        if self.failed.is_some() {
            return Ok(());
        }
        let chunk = self.chunks.flush_if_due(now_ns);
        let r = self.write(chunk.into_iter().collect());
        self.note(r)
    }

    fn note(&mut self, r: Result<(), RecordError>) -> Result<(), RecordError> {
        if let Err(e) = &r {
            self.failed = Some(e.to_string());
        }
        r
    }

    fn write(&mut self, chunks: Vec<Vec<u8>>) -> Result<(), RecordError> {
        for c in chunks {
            // One write per chunk, so a kill leaves whole chunks plus at most one partial one.
            self.file.write_all(&c).map_err(RecordError::io(&self.path))?;
            self.bytes += c.len() as u64;
        }
        Ok(())
    }

    /// Writes the end record and the last chunk, and fsyncs. Reports the first error met.
    pub fn finish(mut self) -> Result<RecordSummary, RecordError> {
        if let Some(e) = self.failed.take() {
            return Err(RecordError::Stopped(e));
        }
        let last = self.chunks.end();
        self.write(last.into_iter().collect())?;
        self.file.sync_all().map_err(RecordError::io(&self.path))?;
        Ok(RecordSummary { path: self.path.clone(), events: self.chunks.events, chunks: self.chunks.chunks, bytes: self.bytes })
    }

    /// Records every item as it passes. Iteration ends early if a write fails; `finish`
    /// then reports why.
    pub fn tee<'a, I: Iterator<Item = (u32, Incoming)> + 'a>(&'a mut self, items: I) -> impl Iterator<Item = (u32, Incoming)> + 'a {
        let mut items = items;
        std::iter::from_fn(move || {
            let (rank, item) = items.next()?;
            self.record(crate::stream::monotonic_ns(), rank, &item).ok()?;
            Some((rank, item))
        })
    }
}
