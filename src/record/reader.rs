//! Reads a recording: checks the header, walks the chunks and stops at the first one that is
//! cut short or fails its checksum (a killed session), saying where. Chunks decode lazily.

use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::source::feed::Incoming;

use super::codec::{Decoder, Record};
use super::{RecordError, CHUNK_HEADER_LEN, HEADER_LEN, MAGIC, MAX_RAW_CHUNK, VERSION};

/// How the file ends.
#[derive(Clone, Debug, PartialEq)]
pub enum Ending {
    /// The session closed the recording.
    Closed,
    /// Whole chunks only, but no end record: the session was killed (or still records).
    Unclosed,
    /// Bytes after the last whole chunk that are not a whole, valid chunk.
    Cut { offset: u64, why: String },
}

pub struct Recording {
    pub path: PathBuf,
    bytes: Vec<u8>,
    /// Compressed bytes and raw length of each whole chunk.
    chunks: Vec<(Range<usize>, usize)>,
    pub ending: Ending,
}

pub fn has_magic(bytes: &[u8]) -> bool {
    bytes.starts_with(&MAGIC)
}

impl Recording {
    pub fn open(path: &Path) -> Result<Recording, RecordError> {
        let bytes = std::fs::read(path).map_err(RecordError::io(path))?;
        Recording::from_bytes(path, bytes)
    }

    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Recording, RecordError> {
        if !has_magic(&bytes) || bytes.len() < HEADER_LEN {
            return Err(RecordError::NotARecording(path.to_path_buf()));
        }
        let found = u16::from_le_bytes([bytes[8], bytes[9]]);
        if found != VERSION {
            return Err(RecordError::Version { path: path.to_path_buf(), found });
        }
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes")) as usize;
        let mut chunks = Vec::new();
        let mut pos = HEADER_LEN;
        let cut = loop {
            if pos == bytes.len() {
                break None;
            }
            let left = bytes.len() - pos;
            if left < CHUNK_HEADER_LEN {
                break Some(format!("chunk {} header is cut short ({left} of {CHUNK_HEADER_LEN} bytes)", chunks.len() + 1));
            }
            let (len, raw, crc) = (u32_at(pos), u32_at(pos + 4), u32_at(pos + 8) as u32);
            if raw > MAX_RAW_CHUNK {
                break Some(format!("chunk {} claims {raw} bytes unpacked (at most {MAX_RAW_CHUNK})", chunks.len() + 1));
            }
            let data = pos + CHUNK_HEADER_LEN..pos + CHUNK_HEADER_LEN + len;
            if data.end > bytes.len() {
                break Some(format!("chunk {} is cut short ({} of {len} bytes)", chunks.len() + 1, bytes.len() - data.start));
            }
            if crc32fast::hash(&bytes[data.clone()]) != crc {
                break Some(format!("chunk {} fails its CRC-32", chunks.len() + 1));
            }
            pos = data.end;
            chunks.push((data, raw));
        };
        let mut rec = Recording { path: path.to_path_buf(), bytes, chunks, ending: Ending::Unclosed };
        rec.ending = match cut {
            Some(why) => Ending::Cut { offset: pos as u64, why },
            None if rec.chunks.is_empty() => Ending::Unclosed,
            None => {
                let last = rec.decode(rec.chunks.len() - 1)?;
                if last.last() == Some(&Record::End) { Ending::Closed } else { Ending::Unclosed }
            }
        };
        Ok(rec)
    }

    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    pub fn file_len(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// The records of whole chunk `i`.
    pub fn decode(&self, i: usize) -> Result<Vec<Record>, RecordError> {
        let (range, raw) = &self.chunks[i];
        let body = zstd::bulk::decompress(&self.bytes[range.clone()], *raw)
            .map_err(|e| RecordError::Corrupt(format!("chunk {} does not unpack: {e}", i + 1)))?;
        if body.len() != *raw {
            return Err(RecordError::Corrupt(format!("chunk {} unpacks to {} bytes, its header says {raw}", i + 1, body.len())));
        }
        let mut dec = Decoder::new(&body);
        let mut out = Vec::new();
        while let Some(r) = dec.next_record().map_err(|e| RecordError::Corrupt(format!("chunk {}: {e}", i + 1)))? {
            out.push(r);
        }
        Ok(out)
    }

    /// Chunk `i`'s items with their stamps.
    pub fn items(&self, i: usize) -> Result<Vec<(u64, Incoming)>, RecordError> {
        Ok(self
            .decode(i)?
            .into_iter()
            .filter_map(|r| match r {
                Record::Item { stamp_ns, item } => Some((stamp_ns, item)),
                Record::End => None,
            })
            .collect())
    }

    /// One line on how the file ends, for the screen's log and headless output.
    pub fn ending_line(&self) -> String {
        let name = self.path.display();
        let n = self.chunks.len();
        match &self.ending {
            Ending::Closed => format!("replay: {name}: {n} chunks, recording closed normally"),
            Ending::Unclosed => format!("replay: {name}: {n} whole chunks and no end record (the session was killed or is still recording)"),
            Ending::Cut { offset, why } => format!(
                "replay: {name}: stopped at byte {offset} of {} after {n} whole chunks: {why}",
                self.bytes.len()
            ),
        }
    }
}
