//! Reads a recording file: checks the header, walks the chunks once (one chunk in memory at
//! a time) to index the whole ones and to find where a cut or broken file stops, then
//! decodes chunks on demand. Memory stays bounded by one chunk, whatever the file's size.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::event::MemEvent;
use crate::stream::chunk::{check_header, decode_all, unpack, ChunkHeader, StreamError, CHUNK_HEADER_LEN, HEADER_LEN};
use crate::stream::codec::Record;
use crate::stream::Incoming;

use super::RecordError;

/// How the file ends.
#[derive(Clone, Debug, PartialEq)]
pub enum Ending {
    /// The session closed the recording.
    Closed,
    /// Whole chunks only, but no end record: the session was killed (or still records).
    Unclosed,
    /// Bytes after the last whole chunk that are not a whole chunk: a killed writer.
    Cut { offset: u64, why: String },
    /// A chunk that is there but wrong (a bad checksum, a claim past the bounds, records
    /// that break the format); nothing from it on is played.
    Corrupt { offset: u64, why: String },
}

/// Random access to the recording's bytes: a file, or bytes in memory.
enum Bytes {
    File(File, u64),
    Memory(Vec<u8>),
}

impl Bytes {
    fn len(&self) -> u64 {
        match self {
            Bytes::File(_, n) => *n,
            Bytes::Memory(b) => b.len() as u64,
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        match self {
            Bytes::File(f, _) => f.read_exact_at(buf, offset),
            Bytes::Memory(b) => {
                let s = b.get(offset as usize..offset as usize + buf.len()).ok_or(std::io::ErrorKind::UnexpectedEof)?;
                buf.copy_from_slice(s);
                Ok(())
            }
        }
    }
}

pub struct Recording {
    /// What it is called in messages: the path as given.
    pub name: String,
    bytes: Bytes,
    version: u16,
    /// Offset and header of each whole chunk.
    chunks: Vec<(u64, ChunkHeader)>,
    pub ending: Ending,
}

impl Recording {
    pub fn open(path: &Path) -> Result<Recording, RecordError> {
        let f = File::open(path).map_err(RecordError::io(path))?;
        let n = f.metadata().map_err(RecordError::io(path))?.len();
        Recording::index(path.display().to_string(), Bytes::File(f, n))
    }

    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Recording, RecordError> {
        Recording::index(path.display().to_string(), Bytes::Memory(bytes))
    }

    fn index(name: String, bytes: Bytes) -> Result<Recording, RecordError> {
        let mut h = [0u8; HEADER_LEN];
        let n = (bytes.len() as usize).min(HEADER_LEN);
        bytes.read_at(&mut h[..n], 0).map_err(|e| RecordError::Stream { name: name.clone(), source: e.into() })?;
        let version = check_header(&h[..n]).map_err(|e| match e {
            StreamError::NotAStream => RecordError::NotARecording(name.clone()),
            e => RecordError::Stream { name: name.clone(), source: e },
        })?;
        let mut rec = Recording { name, bytes, version, chunks: Vec::new(), ending: Ending::Unclosed };
        rec.ending = rec.walk();
        Ok(rec)
    }

    /// Walks the chunks, checking each one's bounds and checksum; indexes the good ones.
    fn walk(&mut self) -> Ending {
        let total = self.bytes.len();
        let mut pos = HEADER_LEN as u64;
        let mut packed = Vec::new();
        let mut body = Vec::new();
        let mut closed = false;
        while pos < total {
            let chunk = self.chunks.len() + 1;
            let left = total - pos;
            if left < CHUNK_HEADER_LEN as u64 {
                return Ending::Cut { offset: pos, why: format!("chunk {chunk} header is cut short ({left} of {CHUNK_HEADER_LEN} bytes)") };
            }
            let mut hb = [0u8; CHUNK_HEADER_LEN];
            if let Err(e) = self.bytes.read_at(&mut hb, pos) {
                return Ending::Cut { offset: pos, why: e.to_string() };
            }
            let h = match ChunkHeader::parse(&hb) {
                Ok(h) => h,
                Err(why) => return Ending::Corrupt { offset: pos, why: format!("chunk {chunk}: {why}") },
            };
            let data = pos + CHUNK_HEADER_LEN as u64;
            if data + h.packed as u64 > total {
                return Ending::Cut { offset: pos, why: format!("chunk {chunk} is cut short ({} of {} bytes)", total - data, h.packed) };
            }
            if closed {
                return Ending::Corrupt { offset: pos, why: format!("chunk {chunk} follows the end record") };
            }
            packed.resize(h.packed, 0);
            if let Err(e) = self.bytes.read_at(&mut packed, data) {
                return Ending::Cut { offset: pos, why: e.to_string() };
            }
            if let Err(why) = unpack(&h, &packed, &mut body) {
                return Ending::Corrupt { offset: pos, why: format!("chunk {chunk}: {why}") };
            }
            match decode_all(&body, self.version) {
                Ok(records) => closed = records.last() == Some(&Record::End),
                Err(e) => return Ending::Corrupt { offset: pos, why: format!("chunk {chunk}: {e}") },
            }
            self.chunks.push((pos, h));
            pos = data + h.packed as u64;
        }
        if closed {
            Ending::Closed
        } else {
            Ending::Unclosed
        }
    }

    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    pub fn file_len(&self) -> u64 {
        self.bytes.len()
    }

    /// The records of whole chunk `i`, read and checked again (the file may have changed).
    pub fn decode(&self, i: usize) -> Result<Vec<Record>, RecordError> {
        let (offset, h) = self.chunks[i];
        let err = |why: String| RecordError::Stream { name: self.name.clone(), source: StreamError::Corrupt { chunk: i as u64 + 1, offset, why } };
        let mut packed = vec![0u8; h.packed];
        self.bytes.read_at(&mut packed, offset + CHUNK_HEADER_LEN as u64).map_err(|e| err(e.to_string()))?;
        let mut body = Vec::new();
        unpack(&h, &packed, &mut body).map_err(err)?;
        decode_all(&body, self.version).map_err(|e| err(e.to_string()))
    }

    /// Chunk `i`'s items with their stamps and ranks.
    pub fn items(&self, i: usize) -> Result<Vec<(u64, u32, Incoming)>, RecordError> {
        Ok(self
            .decode(i)?
            .into_iter()
            .filter_map(|r| match r {
                Record::Item { stamp_ns, rank, item } => Some((stamp_ns, rank, item)),
                Record::End => None,
            })
            .collect())
    }

    /// Every allocator event of `device` the session recorded, in order (all ranks').
    pub fn memory_events(&self, device: u8) -> Result<Vec<MemEvent>, RecordError> {
        let mut events = Vec::new();
        for i in 0..self.chunk_count() {
            for (_, _, item) in self.items(i)? {
                if let Incoming::Batch(b) = item {
                    events.extend(b.events.iter().filter(|e| e.device == device));
                }
            }
        }
        Ok(events)
    }

    /// The file is broken somewhere (not merely cut by a killed writer).
    pub fn corrupt(&self) -> Option<String> {
        match &self.ending {
            Ending::Corrupt { offset, why } => Some(format!("{}: recording is corrupt at byte {offset}: {why}", self.name)),
            _ => None,
        }
    }

    /// One line on how the file ends, for the screen's log and headless output.
    pub fn ending_line(&self) -> String {
        let name = &self.name;
        let n = self.chunks.len();
        match &self.ending {
            Ending::Closed => format!("replay: {name}: {n} chunks, recording closed normally"),
            Ending::Unclosed => format!("replay: {name}: {n} whole chunks and no end record (the session was killed or is still recording)"),
            Ending::Cut { offset, why } => format!("replay: {name}: stopped at byte {offset} of {} after {n} whole chunks: {why}", self.bytes.len()),
            Ending::Corrupt { offset, why } => format!("replay: {name}: stopped at byte {offset} of {} after {n} whole chunks: {why}", self.bytes.len()),
        }
    }
}
