//! Writes a recording as the session runs. The file is created with create_new (never an
//! existing file) and written in place rather than via a temporary file: a session killed
//! with SIGKILL must leave every chunk written so far behind. Chunks are not fsynced one by
//! one (the kernel keeps written pages when the process dies; only a power cut loses the
//! tail); the file is fsynced when the recording is closed.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::source::feed::Incoming;

use super::codec::Encoder;
use super::{RecordError, CHUNK_HEADER_LEN, MAGIC, VERSION};

/// A chunk is cut when it holds this many events, this many body bytes, or spans this long.
const CHUNK_EVENTS: u64 = 16_384;
const CHUNK_BYTES: usize = 1 << 20;
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
    enc: Encoder,
    /// Stamp of the first record in the open chunk.
    chunk_start: Option<u64>,
    summary: RecordSummary,
    /// The first write error; recording stops there and `finish` reports it.
    failed: Option<RecordError>,
}

impl Recorder {
    pub fn create(path: &Path) -> Result<Recorder, RecordError> {
        let mut file = File::options().write(true).create_new(true).open(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                RecordError::Exists(path.to_path_buf())
            } else {
                RecordError::Io { path: path.to_path_buf(), source: e }
            }
        })?;
        let mut header = MAGIC.to_vec();
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&0u16.to_le_bytes());
        file.write_all(&header).map_err(RecordError::io(path))?;
        Ok(Recorder {
            file,
            enc: Encoder::default(),
            chunk_start: None,
            summary: RecordSummary { path: path.to_path_buf(), events: 0, chunks: 0, bytes: header.len() as u64 },
            failed: None,
        })
    }

    pub fn path(&self) -> &Path {
        &self.summary.path
    }

    /// Records one item received at `stamp_ns` (capture clock).
    pub fn record(&mut self, stamp_ns: u64, item: &Incoming) -> Result<(), RecordError> {
        if let Some(e) = &self.failed {
            return Err(RecordError::Stopped(e.to_string()));
        }
        let r = self.enc.item(stamp_ns, item).and_then(|()| {
            let start = *self.chunk_start.get_or_insert(stamp_ns);
            if self.enc.events >= CHUNK_EVENTS || self.enc.body.len() >= CHUNK_BYTES || stamp_ns.saturating_sub(start) >= CHUNK_NS {
                self.write_chunk()
            } else {
                Ok(())
            }
        });
        self.note(r)
    }

    /// Writes the open chunk if it has been open for a second (called on idle ticks, so a
    /// quiet session still reaches the disk).
    pub fn flush_if_due(&mut self, now_ns: u64) -> Result<(), RecordError> {
        if self.failed.is_none() && self.chunk_start.is_some_and(|s| now_ns.saturating_sub(s) >= CHUNK_NS) {
            let r = self.write_chunk();
            return self.note(r);
        }
        Ok(())
    }

    fn note(&mut self, r: Result<(), RecordError>) -> Result<(), RecordError> {
        if let Err(e) = &r {
            self.failed = Some(RecordError::Stopped(e.to_string()));
        }
        r
    }

    fn write_chunk(&mut self) -> Result<(), RecordError> {
        if self.enc.is_empty() {
            return Ok(());
        }
        let packed = zstd::bulk::compress(&self.enc.body, ZSTD_LEVEL).map_err(RecordError::io(&self.summary.path))?;
        let mut out = Vec::with_capacity(CHUNK_HEADER_LEN + packed.len());
        out.extend_from_slice(&(packed.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.enc.body.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&packed).to_le_bytes());
        out.extend_from_slice(&packed);
        // One write per chunk, so a kill leaves whole chunks plus at most one partial one.
        self.file.write_all(&out).map_err(RecordError::io(&self.summary.path))?;
        self.summary.events += self.enc.events;
        self.summary.chunks += 1;
        self.summary.bytes += out.len() as u64;
        self.enc.reset();
        self.chunk_start = None;
        Ok(())
    }

    /// Writes the end record and the last chunk, and fsyncs. Reports the first error met.
    pub fn finish(mut self) -> Result<RecordSummary, RecordError> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        self.enc.end();
        self.write_chunk()?;
        self.file.sync_all().map_err(RecordError::io(&self.summary.path))?;
        Ok(self.summary.clone())
    }

    /// Records every item as it passes. Iteration ends early if a write fails; `finish`
    /// then reports why.
    pub fn tee<'a, I: Iterator<Item = Incoming> + 'a>(&'a mut self, items: I) -> impl Iterator<Item = Incoming> + 'a {
        let mut items = items;
        std::iter::from_fn(move || {
            let item = items.next()?;
            self.record(crate::capture::now_ns(), &item).ok()?;
            Some(item)
        })
    }
}
