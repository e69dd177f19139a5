//! The stream's byte form, the same in a recording file and on a job's socket: a 12-byte
//! header, then checksummed zstd chunks of records (docs/recording-format.md).
//!
//! Both directions are bounded by what the writer writes: `ChunkWriter` never makes a chunk
//! of more than `limits::WRITER_EVENTS` events or `limits::WRITER_BYTES` record bytes, and
//! `ChunkReader` refuses a chunk that claims or unpacks to more than twice that, reading
//! from any `Read` (a file, a pipe, a socket) one chunk at a time.

use std::io::{self, Read};

use super::codec::{limits, split_batch, split_off_front, CodecError, Decoder, EncodeError, Encoder, Record};
use super::Incoming;

/// First bytes of a stream. The high first byte and CR LF catch text-mode mangling.
pub const MAGIC: [u8; 8] = *b"\x89VSREC\r\n";
/// Version 2 added ranks and named retags; version 1 streams still read.
pub const VERSION: u16 = 2;
/// Magic, version (u16 LE), reserved flags (u16 LE).
pub const HEADER_LEN: usize = 12;
/// Compressed length, raw length, CRC-32 of the compressed bytes: three u32 LE.
pub const CHUNK_HEADER_LEN: usize = 12;
/// The most compressed bytes a chunk of `MAX_BODY_BYTES` can take (zstd's bound, rounded up).
pub const MAX_PACKED_BYTES: usize = limits::MAX_BODY_BYTES + (limits::MAX_BODY_BYTES >> 7) + 1024;

pub fn header() -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(&MAGIC);
    h[8..10].copy_from_slice(&VERSION.to_le_bytes());
    h
}

pub fn has_magic(bytes: &[u8]) -> bool {
    bytes.starts_with(&MAGIC)
}

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("not a vramscope stream (expected the bytes 89 'VSREC' CR LF)")]
    NotAStream,
    /// Not one byte came: a producer that refused the viewer, or died before its stream.
    #[error("the connection closed before the stream began")]
    Empty,
    #[error("format version {0}; this vramscope reads versions 1 to {VERSION}")]
    Version(u16),
    /// Bytes that are there but wrong: nothing past them is decoded.
    #[error("chunk {chunk} (at byte {offset}) is corrupt: {why}")]
    Corrupt { chunk: u64, offset: u64, why: String },
    /// The stream stops inside a chunk (a killed writer, a closed socket).
    #[error("chunk {chunk} (at byte {offset}) is cut short: {why}")]
    Cut { chunk: u64, offset: u64, why: String },
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// A chunk header, checked against the bounds before anything is read or allocated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChunkHeader {
    pub packed: usize,
    pub raw: usize,
    pub crc: u32,
}

impl ChunkHeader {
    pub fn parse(b: &[u8; CHUNK_HEADER_LEN]) -> Result<ChunkHeader, String> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let (packed, raw, crc) = (u32_at(0) as usize, u32_at(4) as usize, u32_at(8));
        if raw > limits::MAX_BODY_BYTES {
            return Err(format!("it claims {raw} bytes unpacked (at most {})", limits::MAX_BODY_BYTES));
        }
        if packed > MAX_PACKED_BYTES {
            return Err(format!("it claims {packed} packed bytes (at most {MAX_PACKED_BYTES})"));
        }
        Ok(ChunkHeader { packed, raw, crc })
    }
}

/// Checks a chunk's packed bytes and unpacks them into `body`, never past the header's
/// raw length (so a zstd bomb stops at the bound).
pub fn unpack(h: &ChunkHeader, packed: &[u8], body: &mut Vec<u8>) -> Result<(), String> {
    if crc32fast::hash(packed) != h.crc {
        return Err("it fails its CRC-32".into());
    }
    body.clear();
    body.reserve(h.raw);
    let n = zstd::bulk::Decompressor::new()
        .and_then(|mut d| d.decompress_to_buffer(packed, body))
        .map_err(|e| format!("it does not unpack to its {} bytes: {e}", h.raw))?;
    if n != h.raw {
        return Err(format!("it unpacks to {n} bytes, its header says {}", h.raw));
    }
    Ok(())
}

/// Reads a stream chunk by chunk from any reader.
pub struct ChunkReader<R> {
    r: R,
    version: u16,
    /// Byte offset of the next chunk header.
    offset: u64,
    /// Chunks read so far.
    chunks: u64,
    ended: bool,
    packed: Vec<u8>,
    body: Vec<u8>,
}

/// Reads until `buf` is full; the bytes read, short only at the end of the stream.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Checks a stream header; returns the version.
pub fn check_header(h: &[u8]) -> Result<u16, StreamError> {
    if h.len() < HEADER_LEN || !has_magic(h) {
        return Err(StreamError::NotAStream);
    }
    match u16::from_le_bytes([h[8], h[9]]) {
        v @ 1..=VERSION => Ok(v),
        v => Err(StreamError::Version(v)),
    }
}

impl<R: Read> ChunkReader<R> {
    /// Reads and checks the header.
    pub fn new(mut r: R) -> Result<ChunkReader<R>, StreamError> {
        let mut h = [0u8; HEADER_LEN];
        let n = read_full(&mut r, &mut h)?;
        if n == 0 {
            return Err(StreamError::Empty);
        }
        let version = check_header(&h[..n])?;
        Ok(ChunkReader { r, version, offset: HEADER_LEN as u64, chunks: 0, ended: false, packed: Vec::new(), body: Vec::new() })
    }

    pub fn version(&self) -> u16 {
        self.version
    }

    /// Chunks read so far.
    pub fn chunks(&self) -> u64 {
        self.chunks
    }

    /// Where the whole chunks end.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The next chunk's records, decoded; None at a clean end of the stream.
    pub fn next_chunk(&mut self) -> Result<Option<Vec<Record>>, StreamError> {
        let chunk = self.chunks + 1;
        let offset = self.offset;
        let mut hb = [0u8; CHUNK_HEADER_LEN];
        let n = read_full(&mut self.r, &mut hb)?;
        if n == 0 {
            return Ok(None);
        }
        if n < CHUNK_HEADER_LEN {
            return Err(StreamError::Cut { chunk, offset, why: format!("its header has {n} of {CHUNK_HEADER_LEN} bytes") });
        }
        if self.ended {
            return Err(StreamError::Corrupt { chunk, offset, why: "it follows the end record".into() });
        }
        let h = ChunkHeader::parse(&hb).map_err(|why| StreamError::Corrupt { chunk, offset, why })?;
        self.packed.resize(h.packed, 0);
        let n = read_full(&mut self.r, &mut self.packed)?;
        if n < h.packed {
            return Err(StreamError::Cut { chunk, offset, why: format!("{n} of its {} bytes are there", h.packed) });
        }
        unpack(&h, &self.packed, &mut self.body).map_err(|why| StreamError::Corrupt { chunk, offset, why })?;
        let records = decode_all(&self.body, self.version).map_err(|e| StreamError::Corrupt { chunk, offset, why: e.to_string() })?;
        self.ended = records.last() == Some(&Record::End);
        self.offset += (CHUNK_HEADER_LEN + h.packed) as u64;
        self.chunks = chunk;
        Ok(Some(records))
    }
}

/// Every record of one chunk body. The body is bounded, and so is what it decodes to.
pub fn decode_all(body: &[u8], version: u16) -> Result<Vec<Record>, CodecError> {
    let mut dec = Decoder::new(body, version);
    let mut out = Vec::new();
    while let Some(r) = dec.next_record()? {
        out.push(r);
    }
    Ok(out)
}

/// Packs records into chunks within the writer's limits, handing each finished chunk (its
/// 12-byte header and packed bytes, one buffer) to the caller to write in one piece.
pub struct ChunkWriter {
    enc: Encoder,
    level: i32,
    /// Stamp of the first record in the open chunk.
    chunk_start: Option<u64>,
    /// A chunk older than this (ns) is written at the next record or `flush_if_due`.
    max_age_ns: u64,
    /// MemEvents in the chunks handed out so far.
    pub events: u64,
    pub chunks: u64,
}

impl ChunkWriter {
    pub fn new(level: i32, max_age_ns: u64) -> ChunkWriter {
        ChunkWriter { enc: Encoder::default(), level, chunk_start: None, max_age_ns, events: 0, chunks: 0 }
    }

    /// Adds one item; returns the chunks it completed.
    pub fn push(&mut self, stamp_ns: u64, rank: u32, item: &Incoming) -> Result<Vec<Vec<u8>>, EncodeError> {
        let mut out = Vec::new();
        match item {
            Incoming::Batch(b) if b.events.len() + self.enc.events as usize > limits::WRITER_EVENTS => {
                // Fill the open chunk, then whole chunks.
                let mut rest = b.clone();
                let room = limits::WRITER_EVENTS - self.enc.events as usize;
                if room > 0 {
                    let front = split_off_front(&mut rest, room);
                    self.push_one(stamp_ns, rank, &Incoming::Batch(front), &mut out)?;
                }
                for part in split_batch(rest, limits::WRITER_EVENTS) {
                    self.push_one(stamp_ns, rank, &Incoming::Batch(part), &mut out)?;
                }
            }
            _ => self.push_one(stamp_ns, rank, item, &mut out)?,
        }
        if self.due(stamp_ns) {
            out.extend(self.flush());
        }
        Ok(out)
    }

    fn push_one(&mut self, stamp_ns: u64, rank: u32, item: &Incoming, out: &mut Vec<Vec<u8>>) -> Result<(), EncodeError> {
        let before = self.enc.body.len();
        self.enc.item(stamp_ns, rank, item)?;
        let full_events = self.enc.events as usize > limits::WRITER_EVENTS;
        if (self.enc.body.len() > limits::WRITER_BYTES || full_events) && before > 0 {
            // It did not fit: close the chunk without it, and start the next with it.
            self.enc.body.truncate(before);
            if let Incoming::Batch(b) = item {
                self.enc.events -= b.events.len() as u64;
            }
            out.extend(self.flush());
            self.enc.item(stamp_ns, rank, item)?;
        }
        self.chunk_start.get_or_insert(stamp_ns);
        if self.enc.body.len() >= limits::WRITER_BYTES || self.enc.events as usize >= limits::WRITER_EVENTS {
            out.extend(self.flush());
        }
        Ok(())
    }

    fn due(&self, now_ns: u64) -> bool {
        self.chunk_start.is_some_and(|s| now_ns.saturating_sub(s) >= self.max_age_ns)
    }

    /// The open chunk if it has been open longer than the writer's age limit.
    pub fn flush_if_due(&mut self, now_ns: u64) -> Option<Vec<u8>> {
        if self.due(now_ns) {
            self.flush()
        } else {
            None
        }
    }

    /// The open chunk, if it has any record.
    pub fn flush(&mut self) -> Option<Vec<u8>> {
        if self.enc.is_empty() {
            return None;
        }
        let packed = zstd::bulk::compress(&self.enc.body, self.level).expect("zstd compresses a bounded buffer");
        let mut out = Vec::with_capacity(CHUNK_HEADER_LEN + packed.len());
        out.extend_from_slice(&(packed.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.enc.body.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&packed).to_le_bytes());
        out.extend_from_slice(&packed);
        self.events += self.enc.events;
        self.chunks += 1;
        self.enc.reset();
        self.chunk_start = None;
        Some(out)
    }

    /// The end record and the last chunk.
    pub fn end(&mut self) -> Option<Vec<u8>> {
        self.enc.end();
        self.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Action, Batch, Category, MemEvent, Phase, PhaseMark};
    use crate::stream::Report;

    fn events(n: usize) -> Vec<MemEvent> {
        (0..n)
            .map(|i| MemEvent {
                t_ns: i as u64,
                addr: 0x1000 + 512 * i as u64,
                size: 512,
                stream: 0,
                step: 0,
                scope: 0,
                action: Action::Alloc,
                phase: Phase::Forward,
                device: 0,
                category: Category::Activation,
            })
            .collect()
    }

    fn read_back(bytes: &[u8]) -> Vec<Record> {
        let mut r = ChunkReader::new(bytes).unwrap();
        let mut out = Vec::new();
        while let Some(c) = r.next_chunk().unwrap() {
            out.extend(c);
        }
        out
    }

    #[test]
    fn a_huge_batch_is_split_across_chunks_within_the_writer_limits() {
        let n = 3 * limits::WRITER_EVENTS + 5;
        let batch = Batch {
            first_seq: 100,
            events: events(n),
            marks: vec![PhaseMark { seq: 100 + 2 * limits::WRITER_EVENTS as u64 + 1, t_ns: 0, step: 0, phase: Phase::Backward }],
            retags: Vec::new(),
            scopes: vec![(1, "layers.0".into())],
        };
        let mut w = ChunkWriter::new(1, u64::MAX);
        let mut bytes = header().to_vec();
        for c in w.push(0, 0, &Incoming::Batch(batch.clone())).unwrap() {
            bytes.extend(c);
        }
        bytes.extend(w.end().unwrap());
        assert_eq!(w.events, n as u64);
        let mut r = ChunkReader::new(&bytes[..]).unwrap();
        let mut got = Vec::new();
        while let Some(records) = r.next_chunk().unwrap() {
            let in_chunk: usize = records.iter().map(|r| match r { Record::Item { item: Incoming::Batch(b), .. } => b.events.len(), _ => 0 }).sum();
            assert!(in_chunk <= limits::WRITER_EVENTS, "{in_chunk} events in one chunk");
            got.extend(records);
        }
        let parts: Vec<&Batch> = got.iter().filter_map(|r| match r { Record::Item { item: Incoming::Batch(b), .. } => Some(b), _ => None }).collect();
        let all: Vec<MemEvent> = parts.iter().flat_map(|b| b.events.clone()).collect();
        assert_eq!(all, batch.events, "every event once, in order");
        assert_eq!(parts[0].scopes, batch.scopes, "names come first");
        let with_mark = parts.iter().position(|b| !b.marks.is_empty()).unwrap();
        let p = parts[with_mark];
        assert!(p.first_seq <= batch.marks[0].seq && batch.marks[0].seq < p.first_seq + p.events.len() as u64);
        assert_eq!(got.last(), Some(&Record::End));
    }

    #[test]
    fn a_bomb_chunk_is_refused_from_its_header() {
        // A header that claims 64 MiB unpacked, as a hostile file would.
        let mut bytes = header().to_vec();
        bytes.extend((10u32).to_le_bytes());
        bytes.extend((64u32 << 20).to_le_bytes());
        bytes.extend(0u32.to_le_bytes());
        bytes.extend([0u8; 10]);
        let e = ChunkReader::new(&bytes[..]).unwrap().next_chunk().unwrap_err();
        assert!(matches!(e, StreamError::Corrupt { chunk: 1, offset: 12, .. }), "{e}");
        assert!(e.to_string().contains("67108864 bytes unpacked"), "{e}");
    }

    #[test]
    fn a_chunk_that_unpacks_past_its_header_is_refused() {
        // 1 MiB of zeros packs to a few bytes; the header says 1000.
        let packed = zstd::bulk::compress(&vec![0u8; 1 << 20], 1).unwrap();
        let mut bytes = header().to_vec();
        bytes.extend((packed.len() as u32).to_le_bytes());
        bytes.extend(1000u32.to_le_bytes());
        bytes.extend(crc32fast::hash(&packed).to_le_bytes());
        bytes.extend(&packed);
        let e = ChunkReader::new(&bytes[..]).unwrap().next_chunk().unwrap_err();
        assert!(e.to_string().contains("does not unpack to its 1000 bytes"), "{e}");
    }

    #[test]
    fn an_end_record_must_be_last() {
        let mut w = ChunkWriter::new(1, u64::MAX);
        let mut bytes = header().to_vec();
        bytes.extend(w.end().unwrap());
        let mut w2 = ChunkWriter::new(1, u64::MAX);
        w2.push(0, 0, &Incoming::Report(Report::Finished)).unwrap();
        bytes.extend(w2.flush().unwrap());
        let mut r = ChunkReader::new(&bytes[..]).unwrap();
        assert_eq!(r.next_chunk().unwrap(), Some(vec![Record::End]));
        let e = r.next_chunk().unwrap_err();
        assert!(e.to_string().contains("follows the end record"), "{e}");
        // Inside one body too: an end record followed by more records.
        let body = [0u8, 0u8];
        let e = decode_all(&body, VERSION).unwrap_err();
        assert!(e.to_string().contains("after the end record"), "{e}");
    }

    #[test]
    fn ranks_travel_with_the_records_that_follow() {
        let mut w = ChunkWriter::new(1, u64::MAX);
        let mut bytes = header().to_vec();
        for (rank, stamp) in [(0, 1), (1, 2), (1, 3), (0, 4)] {
            for c in w.push(stamp, rank, &Incoming::Report(Report::Paused(rank == 1))).unwrap() {
                bytes.extend(c);
            }
        }
        bytes.extend(w.end().unwrap());
        let ranks: Vec<(u64, u32)> = read_back(&bytes)
            .into_iter()
            .filter_map(|r| match r { Record::Item { stamp_ns, rank, .. } => Some((stamp_ns, rank)), Record::End => None })
            .collect();
        assert_eq!(ranks, [(1, 0), (2, 1), (3, 1), (4, 0)]);
    }

    #[test]
    fn a_stream_cut_inside_a_chunk_says_so_and_where() {
        let mut w = ChunkWriter::new(1, u64::MAX);
        let mut bytes = header().to_vec();
        w.push(0, 0, &Incoming::Batch(Batch { events: events(100), ..Batch::default() })).unwrap();
        bytes.extend(w.flush().unwrap());
        let whole = bytes.len();
        w.push(1, 0, &Incoming::Report(Report::Finished)).unwrap();
        bytes.extend(w.flush().unwrap());
        let mut r = ChunkReader::new(&bytes[..whole + 5]).unwrap();
        assert!(r.next_chunk().unwrap().is_some());
        let e = r.next_chunk().unwrap_err();
        assert!(matches!(e, StreamError::Cut { chunk: 2, .. }), "{e}");
        assert_eq!(r.offset(), whole as u64, "the good part ends after chunk 1");
    }
}
