//! Session recordings: everything the live screen was fed, streamed to a file in the
//! stream's chunks (docs/recording-format.md), and the sources that play a recording, or a
//! PyTorch snapshot's device_traces, back into the same consumers.

pub mod player;
pub mod reader;
pub mod trace;
pub mod writer;

use std::path::PathBuf;

use crate::stream::chunk::StreamError;
use crate::stream::codec::EncodeError;

/// One line each; a file is named once, at the front.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{0} already exists; recordings never overwrite a file")]
    Exists(PathBuf),
    // Not a `source`: a chain would print the io error twice.
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{0}: not a vramscope recording (expected the bytes 89 'VSREC' CR LF) nor a memory snapshot pickle")]
    NotARecording(String),
    #[error("{name}: {source}")]
    Stream { name: String, source: StreamError },
    #[error("recording stopped after an earlier error: {0}")]
    Stopped(String),
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error(transparent)]
    Snapshot(#[from] crate::snapshot::reader::ReadError),
    #[error(transparent)]
    Device(#[from] crate::snapshot::OpenError),
    #[error("{0}: --device picks a snapshot's device; a recording's devices are switched on screen with D")]
    DeviceOfRecording(String),
}

impl RecordError {
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> RecordError {
        let path = path.into();
        move |err| RecordError::Io { path, err }
    }
}
