//! Records inside a chunk: each item with its arrival stamp, batches as delta/varint columns
//! (zstd then finds the repetition), reports and gauge batches as JSON (they are rare).
//! Delta state starts afresh in every chunk, so any whole chunk decodes on its own.

use crate::event::{Batch, Category, MemEvent, Phase, PhaseMark};
use crate::snapshot::model::Action;
use crate::source::feed::Incoming;

use super::RecordError;

const TAG_END: u8 = 0;
const TAG_BATCH: u8 = 1;
const TAG_REPORT: u8 = 2;
const TAG_GAUGES: u8 = 3;

/// One decoded record: when the recording consumer received it (ns, capture clock), and what.
#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    Item { stamp_ns: u64, item: Incoming },
    /// The session closed the recording normally.
    End,
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
    /// MemEvents in this chunk so far.
    pub events: u64,
}

impl Encoder {
    pub fn is_empty(&self) -> bool {
        self.body.is_empty()
    }

    /// Empties the body for the next chunk; delta state restarts with it.
    pub fn reset(&mut self) {
        self.body.clear();
        self.last_stamp = 0;
        self.events = 0;
    }

    pub fn end(&mut self) {
        self.body.push(TAG_END);
    }

    pub fn item(&mut self, stamp_ns: u64, item: &Incoming) -> Result<(), RecordError> {
        let tag = match item {
            Incoming::Batch(_) => TAG_BATCH,
            Incoming::Report(_) => TAG_REPORT,
            Incoming::Gauges(_) => TAG_GAUGES,
            // A replay's own signal: nothing that happened in the session.
            Incoming::Restart => return Ok(()),
        };
        let out = &mut self.body;
        out.push(tag);
        put_signed(out, stamp_ns.wrapping_sub(self.last_stamp) as i64);
        self.last_stamp = stamp_ns;
        match item {
            Incoming::Batch(b) => {
                self.events += b.events.len() as u64;
                put_batch(out, b);
            }
            Incoming::Report(r) => put_bytes(out, &serde_json::to_vec(r)?),
            Incoming::Gauges(g) => put_bytes(out, &serde_json::to_vec(g)?),
            Incoming::Restart => unreachable!("returned above"),
        }
        Ok(())
    }
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
    for (addr, c) in &b.retags {
        put_varint(out, *addr);
        out.push(*c as u8);
    }
    put_varint(out, b.scopes.len() as u64);
    for (id, name) in &b.scopes {
        put_varint(out, *id as u64);
        put_bytes(out, name.as_bytes());
    }
}

/// Reads one chunk's body back into records.
pub struct Decoder<'a> {
    body: &'a [u8],
    pos: usize,
    last_stamp: u64,
}

impl<'a> Decoder<'a> {
    pub fn new(body: &'a [u8]) -> Self {
        Decoder { body, pos: 0, last_stamp: 0 }
    }

    fn bad(&self, what: &str) -> RecordError {
        RecordError::Corrupt(format!("{what} at byte {} of a chunk body", self.pos))
    }

    fn byte(&mut self) -> Result<u8, RecordError> {
        let b = *self.body.get(self.pos).ok_or_else(|| self.bad("body ends early"))?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, RecordError> {
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

    fn signed(&mut self) -> Result<i64, RecordError> {
        self.varint().map(unzigzag)
    }

    fn count(&mut self) -> Result<usize, RecordError> {
        let n = self.varint()? as usize;
        // Every counted thing takes at least one byte, so a larger count is corruption,
        // not a reason to allocate.
        if n > self.body.len() - self.pos {
            return Err(self.bad("count larger than the body"));
        }
        Ok(n)
    }

    fn bytes(&mut self) -> Result<&'a [u8], RecordError> {
        let n = self.count()?;
        let s = &self.body[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// The next record, or None at the end of the body.
    pub fn next_record(&mut self) -> Result<Option<Record>, RecordError> {
        if self.pos == self.body.len() {
            return Ok(None);
        }
        let tag = self.byte()?;
        if tag == TAG_END {
            return Ok(Some(Record::End));
        }
        let stamp_ns = self.last_stamp.wrapping_add(self.signed()? as u64);
        self.last_stamp = stamp_ns;
        let item = match tag {
            TAG_BATCH => Incoming::Batch(self.batch()?),
            TAG_REPORT => Incoming::Report(serde_json::from_slice(self.bytes()?)?),
            TAG_GAUGES => Incoming::Gauges(serde_json::from_slice(self.bytes()?)?),
            t => return Err(self.bad(&format!("unknown record tag {t}"))),
        };
        Ok(Some(Record::Item { stamp_ns, item }))
    }

    fn batch(&mut self) -> Result<Batch, RecordError> {
        let first_seq = self.varint()?;
        let n = self.count()?;
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
            prev += self.signed()?;
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
        let n = self.count()?;
        let mut marks = Vec::with_capacity(n);
        for _ in 0..n {
            let (seq, t_ns, step) = (self.varint()?, self.varint()?, self.varint()? as u32);
            marks.push(PhaseMark { seq, t_ns, step, phase: Phase::from_u8(self.byte()?) });
        }
        let n = self.count()?;
        let mut retags = Vec::with_capacity(n);
        for _ in 0..n {
            retags.push((self.varint()?, Category::from_u8(self.byte()?)));
        }
        let n = self.count()?;
        let mut scopes = Vec::with_capacity(n);
        for _ in 0..n {
            let id = self.varint()? as u32;
            let name = std::str::from_utf8(self.bytes()?).map_err(|_| self.bad("scope name is not UTF-8"))?;
            scopes.push((id, name.to_string()));
        }
        Ok(Batch { first_seq, events, marks, retags, scopes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::engine::{KnobChange, Report};

    #[test]
    fn items_round_trip_through_a_chunk_body() {
        let ev = |t_ns, addr, size, action, step| MemEvent {
            t_ns,
            addr,
            size,
            stream: 7,
            step,
            scope: 3,
            action,
            phase: Phase::Backward,
            device: 1,
            category: Category::Gradient,
        };
        let batch = Batch {
            first_seq: 40,
            events: vec![ev(1000, 0x7f00_0000_1000, 512, Action::Alloc, 2), ev(900, 0x1000, 512, Action::FreeRequested, 3)],
            marks: vec![PhaseMark { seq: 41, t_ns: 950, step: 3, phase: Phase::Optimizer }],
            retags: vec![(0x1000, Category::OptimizerState)],
            scopes: vec![(3, "layers.0.ffn".into())],
        };
        let items = vec![
            (5, Incoming::Batch(batch)),
            (3, Incoming::Report(Report::Knob(KnobChange { step: 4, knob: "ctx".into(), from: "32".into(), to: "64".into() }))),
            (u64::MAX, Incoming::Report(Report::Finished)),
        ];
        let mut enc = Encoder::default();
        for (s, i) in &items {
            enc.item(*s, i).unwrap();
        }
        enc.item(9, &Incoming::Restart).unwrap();
        enc.end();
        assert_eq!(enc.events, 2);
        let mut dec = Decoder::new(&enc.body);
        for (s, i) in items {
            assert_eq!(dec.next_record().unwrap(), Some(Record::Item { stamp_ns: s, item: i }));
        }
        assert_eq!(dec.next_record().unwrap(), Some(Record::End));
        assert_eq!(dec.next_record().unwrap(), None);
    }

    #[test]
    fn a_cut_body_is_an_error_not_a_panic() {
        let mut enc = Encoder::default();
        enc.item(1, &Incoming::Batch(Batch { first_seq: 0, events: vec![], marks: vec![], retags: vec![], scopes: vec![(1, "x".into())] })).unwrap();
        for cut in 0..enc.body.len() {
            let mut dec = Decoder::new(&enc.body[..cut]);
            if cut > 0 {
                assert!(dec.next_record().is_err(), "cut at {cut}");
            }
        }
    }
}
