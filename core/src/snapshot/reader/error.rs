//! How reading a snapshot fails.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    // The io error is part of the message, not a `source`, so error chains print it once.
    #[error("cannot read {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("not a pickle: the input is empty")]
    Empty,
    #[error(
        "not a pickle: first byte 0x{byte:02x} (a pickle of protocol 2 to 5 starts with 0x80)"
    )]
    NotPickle { byte: u8 },
    #[error("unsupported pickle protocol {version} at byte {offset}: expected 2 to 5")]
    Protocol { version: u8, offset: usize },
    #[error("truncated at byte {offset}: expected {expected}")]
    Truncated { offset: usize, expected: String },
    #[error("unsupported pickle opcode {name} (0x{code:02x}) at byte {offset}: snapshots are plain data")]
    ObjectOpcode {
        name: &'static str,
        code: u8,
        offset: usize,
    },
    #[error("unsupported pickle opcode {name} (0x{code:02x}) at byte {offset}: only the binary data opcodes of protocols 2 to 5 are read")]
    UnsupportedOpcode {
        name: &'static str,
        code: u8,
        offset: usize,
    },
    #[error("unknown pickle opcode 0x{code:02x} at byte {offset}")]
    UnknownOpcode { code: u8, offset: usize },
    #[error("malformed pickle at byte {offset}: {detail}")]
    Malformed { offset: usize, detail: String },
    #[error("not a memory snapshot: {detail}")]
    Schema { detail: String },
    #[error("{0}")]
    Trace(crate::profiler::TraceError),
}

pub(super) fn malformed(offset: usize, detail: impl Into<String>) -> ReadError {
    ReadError::Malformed {
        offset,
        detail: detail.into(),
    }
}
