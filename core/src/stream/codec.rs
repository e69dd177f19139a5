//! Records inside a chunk: each item with its arrival stamp, batches as delta/varint columns
//! (zstd then finds the repetition), reports and gauge batches as JSON (they are rare).
//! Delta state starts afresh in every chunk, so any whole chunk decodes on its own.
//!
//! Decoding is bounded by what the writer writes (`limits`): a body that claims more
//! events, names or JSON than a writer ever puts in a chunk is corrupt, whatever its size.

use crate::event::{Batch, Category, MemEvent, Phase, PhaseMark, Retag};
use crate::snapshot::model::Action;

use super::Incoming;

const TAG_END: u8 = 0;
const TAG_BATCH: u8 = 1;
const TAG_REPORT: u8 = 2;
const TAG_GAUGES: u8 = 3;
/// The rank of the records that follow in this chunk (0 until one says otherwise).
const TAG_RANK: u8 = 4;

/// What a writer of this format puts in one chunk at most, and what a reader accepts: twice
/// that, the margin for other writers. Anything beyond is corruption or hostility, refused
/// before it is allocated.
pub mod limits {
    /// The writer cuts a chunk at this many events...
    pub const WRITER_EVENTS: usize = 16_384;
    /// ...or this many body bytes.
    pub const WRITER_BYTES: usize = 1 << 20;
    pub const MAX_EVENTS: usize = 2 * WRITER_EVENTS;
    pub const MAX_BODY_BYTES: usize = 2 * WRITER_BYTES;
    /// One report or gauge record's JSON. The writer refuses larger (it never makes one).
    pub const MAX_JSON: usize = 256 << 10;
    /// One module scope name.
    pub const MAX_NAME: usize = 4096;
}

/// One decoded record: when the consumer that wrote it received it (ns, capture clock),
/// from which rank of a job (0 for a single process), and what.
#[derive(Clone, Debug, PartialEq)]
// A record passes by value once; boxing its item would cost an allocation per record.
#[allow(clippy::large_enum_variant)]
pub enum Record {
    Item { stamp_ns: u64, rank: u32, item: Incoming },
    /// The producer closed the stream normally; nothing may follow it.
    End,
}

/// Where in a chunk body decoding failed, and why.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{what} at byte {at} of the chunk's records")]
pub struct CodecError {
    pub at: usize,
    pub what: String,
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_signed(out: &mut Vec<u8>, v: i64) {
    put_varint(out, zigzag(v))
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Encodes records into one chunk's body.
#[derive(Default)]
pub struct Encoder {
    pub body: Vec<u8>,
    last_stamp: u64,
    rank: u32,
    /// MemEvents in this chunk so far.
    pub events: u64,
}

/// Why an item cannot be encoded at all.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("a record's JSON is {0} bytes, over the {max} byte limit", max = limits::MAX_JSON)]
    TooLarge(usize),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

impl Encoder {
    pub fn is_empty(&self) -> bool {
        self.body.is_empty()
    }

    /// Empties the body for the next chunk; delta state restarts with it.
    pub fn reset(&mut self) {
        self.body.clear();
        self.last_stamp = 0;
        self.rank = 0;
        self.events = 0;
    }

    pub fn end(&mut self) {
        self.body.push(TAG_END);
    }

    /// Appends one item. A batch must fit the chunk's event limit (see `split_batch`).
    pub fn item(&mut self, stamp_ns: u64, rank: u32, item: &Incoming) -> Result<(), EncodeError> {
        let tag = match item {
            Incoming::Batch(_) => TAG_BATCH,
            Incoming::Report(_) => TAG_REPORT,
            Incoming::Gauges(_) => TAG_GAUGES,
            // A replay's own signal: nothing that happened in the session.
            Incoming::Restart => return Ok(()),
        };
        let json = match item {
            Incoming::Report(r) => Some(serde_json::to_vec(r)?),
            Incoming::Gauges(g) => Some(serde_json::to_vec(g)?),
            _ => None,
        };
        if let Some(j) = &json {
            if j.len() > limits::MAX_JSON {
                return Err(EncodeError::TooLarge(j.len()));
            }
        }
        let out = &mut self.body;
        if rank != self.rank {
            out.push(TAG_RANK);
            put_varint(out, rank as u64);
            self.rank = rank;
        }
        out.push(tag);
        put_signed(out, stamp_ns.wrapping_sub(self.last_stamp) as i64);
        self.last_stamp = stamp_ns;
        match (item, json) {
            (Incoming::Batch(b), _) => {
                self.events += b.events.len() as u64;
                put_batch(out, b);
            }
            (_, Some(j)) => put_bytes(out, &j),
            _ => unreachable!("reports and gauges have JSON"),
        }
        Ok(())
    }
}

/// Splits off the first `n` events of `b` into a batch of their own, so no chunk exceeds
/// the writer's limit. Scope names travel with the front (its events may use them), retags
/// stay with the rest (they correct allocations made up to the batch's end), and each mark
/// goes with the part that holds its position.
pub fn split_off_front(b: &mut Batch, n: usize) -> Batch {
    let n = n.min(b.events.len());
    let cut = b.first_seq + n as u64;
    let (front_marks, rest_marks) = std::mem::take(&mut b.marks).into_iter().partition(|m| m.seq < cut);
    b.marks = rest_marks;
    let front = Batch {
        first_seq: b.first_seq,
        events: b.events.drain(..n).collect(),
        marks: front_marks,
        retags: Vec::new(),
        scopes: std::mem::take(&mut b.scopes),
    };
    b.first_seq = cut;
    front
}

/// A batch as parts of at most `max_events` events each.
pub fn split_batch(mut b: Batch, max_events: usize) -> Vec<Batch> {
    let max_events = max_events.max(1);
    let mut parts = Vec::new();
    while b.events.len() > max_events {
        parts.push(split_off_front(&mut b, max_events));
    }
    parts.push(b);
    parts
}

fn put_batch(out: &mut Vec<u8>, b: &Batch) {
    put_varint(out, b.first_seq);
    put_varint(out, b.events.len() as u64);
    // Column by column: each column is one kind of number, which compresses far better
    // than interleaved fields.
    let mut prev = 0u64;
    for e in &b.events {
        put_signed(out, e.t_ns.wrapping_sub(prev) as i64);
        prev = e.t_ns;
    }
    let mut prev = 0u64;
    for e in &b.events {
        put_signed(out, e.addr.wrapping_sub(prev) as i64);
        prev = e.addr;
    }
    for e in &b.events {
        put_varint(out, e.size);
    }
    let mut prev = 0u32;
    for e in &b.events {
        put_signed(out, e.step as i64 - prev as i64);
        prev = e.step;
    }
    for e in &b.events {
        put_varint(out, e.scope as u64);
    }
    for e in &b.events {
        out.push(e.action as u8 | (e.phase as u8) << 4);
    }
    for e in &b.events {
        out.push(e.category as u8);
    }
    for e in &b.events {
        put_signed(out, e.stream);
    }
    for e in &b.events {
        out.push(e.device);
    }
    put_varint(out, b.marks.len() as u64);
    for m in &b.marks {
        put_varint(out, m.seq);
        put_varint(out, m.t_ns);
        put_varint(out, m.step as u64);
        out.push(m.phase as u8);
    }
    put_varint(out, b.retags.len() as u64);
    for r in &b.retags {
        put_varint(out, r.addr);
        out.push(r.category as u8);
        put_varint(out, r.scope as u64);
    }
    put_varint(out, b.scopes.len() as u64);
    for (id, name) in &b.scopes {
        put_varint(out, *id as u64);
        put_bytes(out, name.as_bytes());
    }
}

/// Reads one chunk's body back into records, one at a time.
pub struct Decoder<'a> {
    body: &'a [u8],
    /// The format version the body was written in (retags carry scopes from version 2).
    version: u16,
    pos: usize,
    last_stamp: u64,
    rank: u32,
    /// Events decoded so far in this chunk (bounded by `limits::MAX_EVENTS`).
    events: usize,
    ended: bool,
}

impl<'a> Decoder<'a> {
    pub fn new(body: &'a [u8], version: u16) -> Self {
        Decoder { body, version, pos: 0, last_stamp: 0, rank: 0, events: 0, ended: false }
    }

    fn bad(&self, what: impl Into<String>) -> CodecError {
        CodecError { at: self.pos, what: what.into() }
    }

    fn byte(&mut self) -> Result<u8, CodecError> {
        let b = *self.body.get(self.pos).ok_or_else(|| self.bad("records end early"))?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, CodecError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(self.bad("varint longer than 10 bytes"))
    }

    fn signed(&mut self) -> Result<i64, CodecError> {
        self.varint().map(unzigzag)
    }

    /// A count of things that each take at least one byte, and at most `limit` of them.
    fn count(&mut self, limit: usize, what: &str) -> Result<usize, CodecError> {
        let n = self.varint()?;
        if n > limit as u64 {
            return Err(self.bad(format!("{n} {what} (at most {limit})")));
        }
        let n = n as usize;
        if n > self.body.len() - self.pos {
            return Err(self.bad(format!("{n} {what} in {} bytes", self.body.len() - self.pos)));
        }
        Ok(n)
    }

    fn bytes(&mut self, limit: usize, what: &str) -> Result<&'a [u8], CodecError> {
        let n = self.count(limit, what)?;
        let s = &self.body[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn json<T: serde::de::DeserializeOwned>(&mut self, what: &str) -> Result<T, CodecError> {
        let at = self.pos;
        let b = self.bytes(limits::MAX_JSON, "bytes of JSON")?;
        serde_json::from_slice(b).map_err(|e| CodecError { at, what: format!("{what} that does not parse: {e}") })
    }

    /// The next record, or None at the end of the body.
    pub fn next_record(&mut self) -> Result<Option<Record>, CodecError> {
        loop {
            if self.pos == self.body.len() {
                return Ok(None);
            }
            if self.ended {
                return Err(self.bad("records after the end record"));
            }
            let tag = self.byte()?;
            let item = match tag {
                TAG_END => {
                    self.ended = true;
                    if self.pos != self.body.len() {
                        return Err(self.bad("records after the end record"));
                    }
                    return Ok(Some(Record::End));
                }
                TAG_RANK => {
                    self.rank = u32::try_from(self.varint()?).map_err(|_| self.bad("rank out of range"))?;
                    continue;
                }
                TAG_BATCH | TAG_REPORT | TAG_GAUGES => {
                    let stamp_ns = self.last_stamp.wrapping_add(self.signed()? as u64);
                    self.last_stamp = stamp_ns;
                    let item = match tag {
                        TAG_BATCH => Incoming::Batch(self.batch()?),
                        TAG_REPORT => Incoming::Report(self.json("a report")?),
                        _ => Incoming::Gauges(self.json("a gauge batch")?),
                    };
                    (stamp_ns, item)
                }
                t => return Err(CodecError { at: self.pos - 1, what: format!("unknown record tag {t}") }),
            };
            return Ok(Some(Record::Item { stamp_ns: item.0, rank: self.rank, item: item.1 }));
        }
    }

    fn batch(&mut self) -> Result<Batch, CodecError> {
        let first_seq = self.varint()?;
        let n = self.count(limits::MAX_EVENTS - self.events, "more events in the chunk")?;
        self.events += n;
        let blank = MemEvent {
            t_ns: 0,
            addr: 0,
            size: 0,
            stream: 0,
            step: 0,
            scope: 0,
            action: Action::Alloc,
            phase: Phase::Other,
            device: 0,
            category: Category::Unknown,
        };
        let mut events = vec![blank; n];
        let mut prev = 0u64;
        for e in events.iter_mut() {
            e.t_ns = prev.wrapping_add(self.signed()? as u64);
            prev = e.t_ns;
        }
        let mut prev = 0u64;
        for e in events.iter_mut() {
            e.addr = prev.wrapping_add(self.signed()? as u64);
            prev = e.addr;
        }
        for e in events.iter_mut() {
            e.size = self.varint()?;
        }
        let mut prev = 0i64;
        for e in events.iter_mut() {
            prev = prev.checked_add(self.signed()?).ok_or_else(|| self.bad("step out of range"))?;
            e.step = u32::try_from(prev).map_err(|_| self.bad("step out of range"))?;
        }
        for e in events.iter_mut() {
            e.scope = u32::try_from(self.varint()?).map_err(|_| self.bad("scope id out of range"))?;
        }
        for e in events.iter_mut() {
            let b = self.byte()?;
            e.action = Action::from_u8(b & 0x0f).ok_or_else(|| self.bad("unknown action"))?;
            e.phase = Phase::from_u8(b >> 4);
        }
        for e in events.iter_mut() {
            e.category = Category::from_u8(self.byte()?);
        }
        for e in events.iter_mut() {
            e.stream = self.signed()?;
        }
        for e in events.iter_mut() {
            e.device = self.byte()?;
        }
        // Marks, retags and names each take several bytes; the body's length bounds them.
        let n = self.count(usize::MAX, "phase marks")?;
        let mut marks = Vec::with_capacity(n);
        for _ in 0..n {
            let (seq, t_ns) = (self.varint()?, self.varint()?);
            let step = u32::try_from(self.varint()?).map_err(|_| self.bad("step out of range"))?;
            marks.push(PhaseMark { seq, t_ns, step, phase: Phase::from_u8(self.byte()?) });
        }
        let n = self.count(usize::MAX, "category retags")?;
        let mut retags = Vec::with_capacity(n);
        for _ in 0..n {
            let (addr, category) = (self.varint()?, Category::from_u8(self.byte()?));
            let scope = if self.version >= 2 { self.varint()? } else { 0 };
            let scope = u32::try_from(scope).map_err(|_| self.bad("scope id out of range"))?;
            retags.push(Retag { addr, category, scope });
        }
        let n = self.count(usize::MAX, "scope names")?;
        let mut scopes = Vec::with_capacity(n);
        for _ in 0..n {
            let id = u32::try_from(self.varint()?).map_err(|_| self.bad("scope id out of range"))?;
            let name = std::str::from_utf8(self.bytes(limits::MAX_NAME, "bytes of scope name")?)
                .map_err(|_| self.bad("scope name is not UTF-8"))?;
            scopes.push((id, name.to_string()));
        }
        Ok(Batch { first_seq, events, marks, retags, scopes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::{KnobChange, Report};

    fn ev(t_ns: u64, addr: u64, size: u64, action: Action, step: u32) -> MemEvent {
        MemEvent { t_ns, addr, size, stream: 7, step, scope: 3, action, phase: Phase::Backward, device: 1, category: Category::Gradient }
    }

    #[test]
    fn items_round_trip_through_a_chunk_body() {
        let batch = Batch {
            first_seq: 40,
            events: vec![ev(1000, 0x7f00_0000_1000, 512, Action::Alloc, 2), ev(900, 0x1000, 512, Action::FreeRequested, 3)],
            marks: vec![PhaseMark { seq: 41, t_ns: 950, step: 3, phase: Phase::Optimizer }],
            retags: vec![Retag { addr: 0x1000, category: Category::OptimizerState, scope: 9 }],
            scopes: vec![(3, "layers.0.ffn".into())],
        };
        let items = vec![
            (5, 0, Incoming::Batch(batch)),
            (3, 2, Incoming::Report(Report::Knob(KnobChange { step: 4, knob: "ctx".into(), from: "32".into(), to: "64".into() }))),
            (u64::MAX, 2, Incoming::Report(Report::Finished)),
        ];
        let mut enc = Encoder::default();
        for (s, rank, i) in &items {
            enc.item(*s, *rank, i).unwrap();
        }
        enc.item(9, 0, &Incoming::Restart).unwrap();
        enc.end();
        assert_eq!(enc.events, 2);
        let mut dec = Decoder::new(&enc.body, 2);
        for (s, rank, i) in items {
            assert_eq!(dec.next_record().unwrap(), Some(Record::Item { stamp_ns: s, rank, item: i }));
        }
        assert_eq!(dec.next_record().unwrap(), Some(Record::End));
        assert_eq!(dec.next_record().unwrap(), None);
    }

    #[test]
    fn version_1_retags_have_no_scope() {
        // Version 1 wrote a retag as addr, category: a recording made before names existed.
        let mut body = vec![TAG_BATCH, 0];
        for v in [0u64, 0, 0, 1] {
            put_varint(&mut body, v); // first_seq, no events, no marks, one retag
        }
        put_varint(&mut body, 0x40);
        body.push(Category::Parameter as u8);
        put_varint(&mut body, 0); // no scope names
        let r = Decoder::new(&body, 1).next_record().unwrap().unwrap();
        let Record::Item { item: Incoming::Batch(b), .. } = r else { panic!("{r:?}") };
        assert_eq!(b.retags, vec![Retag { addr: 0x40, category: Category::Parameter, scope: 0 }]);
    }

    #[test]
    fn a_cut_body_is_an_error_not_a_panic() {
        let mut enc = Encoder::default();
        let b = Batch { events: vec![ev(1, 2, 3, Action::Alloc, 0)], scopes: vec![(1, "x".into())], ..Batch::default() };
        // Rank 0: a body cut right after a rank record would be a whole (empty) body.
        enc.item(1, 0, &Incoming::Batch(b)).unwrap();
        for cut in 1..enc.body.len() {
            let mut dec = Decoder::new(&enc.body[..cut], 2);
            assert!(dec.next_record().is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn counts_beyond_the_limits_are_refused_before_allocating() {
        // A batch that claims a billion events in a few bytes.
        let mut body = vec![TAG_BATCH, 0, 0];
        put_varint(&mut body, 1 << 30);
        let e = Decoder::new(&body, 2).next_record().unwrap_err();
        assert!(e.what.contains("1073741824 more events in the chunk (at most 32768)"), "{e}");
        // A JSON record over the limit.
        let mut body = vec![TAG_REPORT, 0];
        put_varint(&mut body, (limits::MAX_JSON + 1) as u64);
        let e = Decoder::new(&body, 2).next_record().unwrap_err();
        assert!(e.what.contains("bytes of JSON"), "{e}");
    }

    #[test]
    fn split_batches_keep_every_event_mark_name_and_retag() {
        let b = Batch {
            first_seq: 10,
            events: (0..5).map(|i| ev(i, i, 1, Action::Alloc, 0)).collect(),
            marks: [10, 12, 13, 15].iter().map(|&seq| PhaseMark { seq, t_ns: 0, step: 0, phase: Phase::Forward }).collect(),
            retags: vec![Retag { addr: 1, category: Category::Parameter, scope: 0 }],
            scopes: vec![(1, "a".into())],
        };
        let parts = split_batch(b.clone(), 2);
        let shape: Vec<(u64, usize, Vec<u64>)> = parts.iter().map(|p| (p.first_seq, p.events.len(), p.marks.iter().map(|m| m.seq).collect())).collect();
        assert_eq!(shape, [(10, 2, vec![10]), (12, 2, vec![12, 13]), (14, 1, vec![15])]);
        assert_eq!(parts[0].scopes, b.scopes);
        assert_eq!(parts[2].retags, b.retags);
        assert!(parts[..2].iter().all(|p| p.retags.is_empty()) && parts[1..].iter().all(|p| p.scopes.is_empty()));
    }
}
