//! Session recordings: everything the live screen was fed, streamed to a file in
//! checksummed zstd chunks (docs/recording-format.md), and the sources that play a
//! recording, or a PyTorch snapshot's device_traces, back into the same consumers.

pub mod codec;
pub mod player;
pub mod reader;
pub mod trace;
pub mod writer;

use std::path::PathBuf;

/// First bytes of a recording. The high first byte and CR LF catch text-mode mangling.
pub const MAGIC: [u8; 8] = *b"\x89VSREC\r\n";
pub const VERSION: u16 = 1;
/// Magic, version (u16 LE), reserved flags (u16 LE).
pub const HEADER_LEN: usize = 12;
/// Compressed length, raw length, CRC-32 of the compressed bytes: three u32 LE.
pub const CHUNK_HEADER_LEN: usize = 12;
/// A chunk body never exceeds this (the writer cuts at 1 MiB); larger means corruption.
pub const MAX_RAW_CHUNK: usize = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{0} already exists; recordings never overwrite a file")]
    Exists(PathBuf),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{0}: not a vramscope recording (expected the bytes 89 'VSREC' CR LF) nor a memory snapshot pickle")]
    NotARecording(PathBuf),
    #[error("{path}: recording format version {found}; this vramscope reads version {VERSION}")]
    Version { path: PathBuf, found: u16 },
    #[error("recording stopped after an earlier error: {0}")]
    Stopped(String),
    #[error("recording is corrupt: {0}")]
    Corrupt(String),
    #[error("recording holds a report or gauge batch that does not parse: {0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Snapshot(#[from] crate::snapshot::reader::ReadError),
}

impl RecordError {
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> RecordError {
        let path = path.into();
        move |source| RecordError::Io { path, source }
    }
}
