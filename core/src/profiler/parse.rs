//! Streams a chrome trace's `traceEvents` and keeps what the memory view needs: the
//! `[memory]` instant events and the spans that can enclose them (operators, Python
//! functions, annotations, `ProfilerStep#N`). Everything else (kernels, flows, arguments such
//! as input shapes) is skipped as it is read, so memory grows with what is kept, not with the
//! file.

use std::collections::HashMap;
use std::fmt;
use std::io::Read;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::timeline::{Item, ItemVisitor, MemoryTimeline};

/// Where a `[memory]` event's bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Device {
    Cpu,
    Cuda(u8),
}

/// One `[memory]` event: `bytes` is negative for a free.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryEvent {
    pub ts: f64,
    /// `Ev Idx` where the trace has it (events of one timestamp keep their order), else the
    /// order read.
    pub order: i64,
    pub device: Device,
    pub bytes: i64,
    /// Older traces (2021) have no addresses.
    pub addr: Option<u64>,
    /// The allocator's own total after the event (newer traces).
    pub total_allocated: Option<i64>,
    pub total_reserved: Option<i64>,
    pub tid: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanKind {
    /// An operator (`cpu_op`, `Operator` in 2021 traces).
    Op,
    /// A Python function (`with_stack`), named `file.py(line): name`.
    Python,
    /// `record_function` and the profiler's own, such as `Optimizer.step#AdamW.step`.
    Annotation,
    /// `ProfilerStep#N`.
    Step,
}

/// A complete event that can enclose allocations.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub tid: u64,
    pub ts: f64,
    pub end: f64,
    /// Index into `Trace::names`.
    pub name: u32,
    pub kind: SpanKind,
}

/// What was kept of a trace.
#[derive(Debug, Default)]
pub struct Trace {
    pub memory: Vec<MemoryEvent>,
    pub spans: Vec<Span>,
    pub names: Vec<String>,
    /// Events read in all.
    pub events: u64,
    /// `names` by name.
    index: HashMap<String, u32>,
}

#[derive(Deserialize)]
#[serde(expecting = "a trace event (a JSON object)")]
struct RawEvent {
    ph: Option<String>,
    cat: Option<String>,
    name: Option<String>,
    ts: Option<f64>,
    dur: Option<f64>,
    tid: Option<Tid>,
    args: Option<RawArgs>,
}

/// Thread ids are numbers, or (in 2021 traces) numbers written as strings.
#[derive(Deserialize)]
#[serde(untagged)]
enum Tid {
    Number(i64),
    Text(String),
}

impl Tid {
    fn key(&self) -> u64 {
        match self {
            Tid::Number(n) => *n as u64,
            Tid::Text(s) => s.parse::<i64>().map_or_else(|_| fxhash(s), |n| n as u64),
        }
    }
}

fn fxhash(s: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    s.hash(&mut h);
    h.finish()
}

#[derive(Deserialize)]
struct RawArgs {
    #[serde(rename = "Bytes")]
    bytes: Option<f64>,
    #[serde(rename = "Addr")]
    addr: Option<u64>,
    #[serde(rename = "Device Type")]
    device_type: Option<i64>,
    #[serde(rename = "Device Id")]
    device_id: Option<i64>,
    #[serde(rename = "Total Allocated")]
    total_allocated: Option<f64>,
    #[serde(rename = "Total Reserved")]
    total_reserved: Option<f64>,
    #[serde(rename = "Ev Idx")]
    ev_idx: Option<i64>,
}

impl Trace {
    fn intern(&mut self, name: String) -> u32 {
        if let Some(id) = self.index.get(&name) {
            return *id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.clone());
        self.index.insert(name, id);
        id
    }

    fn keep(&mut self, e: RawEvent) {
        self.events += 1;
        let (Some(name), Some(ts)) = (e.name, e.ts) else { return };
        let tid = e.tid.as_ref().map_or(0, Tid::key);
        if name == "[memory]" {
            let Some(a) = e.args else { return };
            let (Some(bytes), Some(kind)) = (a.bytes, a.device_type) else { return };
            let device = match kind {
                0 => Device::Cpu,
                1 => Device::Cuda(a.device_id.unwrap_or(0).clamp(0, 255) as u8),
                // Other backends (XPU, MPS...) are not followed.
                _ => return,
            };
            let order = a.ev_idx.unwrap_or(self.memory.len() as i64);
            self.memory.push(MemoryEvent {
                ts,
                order,
                device,
                bytes: bytes as i64,
                addr: a.addr,
                total_allocated: a.total_allocated.map(|t| t as i64),
                total_reserved: a.total_reserved.map(|t| t as i64),
                tid,
            });
            return;
        }
        if e.ph.as_deref() != Some("X") {
            return;
        }
        let kind = if name.starts_with("ProfilerStep#") {
            SpanKind::Step
        } else {
            match e.cat.as_deref() {
                Some("cpu_op" | "Operator") => SpanKind::Op,
                Some("python_function") => SpanKind::Python,
                Some("user_annotation") => SpanKind::Annotation,
                _ => return,
            }
        };
        let end = ts + e.dur.unwrap_or(0.0).max(0.0);
        let name = self.intern(name);
        self.spans.push(Span { tid, ts, end, name, kind });
    }
}

/// What a JSON file from torch.profiler held.
#[derive(Debug)]
pub enum Parsed {
    Trace(Trace),
    Timeline(MemoryTimeline),
}

/// Reads a chrome trace (the JSON object torch.profiler writes, or a bare list of events)
/// or an `export_memory_timeline` list from `input`.
pub fn read(input: impl Read) -> Result<Parsed, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_reader(std::io::BufReader::with_capacity(1 << 20, input));
    let parsed = TopLevel.deserialize(&mut de)?;
    de.end()?;
    Ok(parsed)
}

struct TopLevel;

impl<'de> DeserializeSeed<'de> for TopLevel {
    type Value = Parsed;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Parsed, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TopLevel {
    type Value = Parsed;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a chrome trace (a JSON object with traceEvents) or an export_memory_timeline list")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Parsed, A::Error> {
        let mut trace = Trace::default();
        let mut seen = false;
        while let Some(key) = map.next_key::<String>()? {
            if key == "traceEvents" {
                map.next_value_seed(Events(&mut trace))?;
                seen = true;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        if !seen {
            return Err(serde::de::Error::custom("no traceEvents list: not a chrome trace"));
        }
        Ok(Parsed::Trace(trace))
    }
    /// A list: of trace events (chrome's array format), or a memory timeline's lists.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Parsed, A::Error> {
        match seq.next_element::<First>()? {
            None => Ok(Parsed::Trace(Trace::default())),
            Some(First::Event(e)) => {
                let mut trace = Trace::default();
                trace.keep(*e);
                Events(&mut trace).visit_seq(seq)?;
                Ok(Parsed::Trace(trace))
            }
            Some(First::Item(item)) => {
                let mut items = vec![item];
                while let Some(item) = seq.next_element::<Item>()? {
                    items.push(item);
                }
                MemoryTimeline::from_items(items).map(Parsed::Timeline).map_err(serde::de::Error::custom)
            }
        }
    }
}

/// The first element of a top-level list, which tells what the rest are.
enum First {
    Event(Box<RawEvent>),
    Item(Item),
}

impl<'de> Deserialize<'de> for First {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<First, D::Error> {
        d.deserialize_any(FirstVisitor)
    }
}

struct FirstVisitor;

impl<'de> Visitor<'de> for FirstVisitor {
    type Value = First;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a trace event (a JSON object) or a memory timeline's list")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<First, A::Error> {
        RawEvent::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(|e| First::Event(Box::new(e)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<First, A::Error> {
        ItemVisitor.visit_seq(seq).map(First::Item)
    }
}

struct Events<'a>(&'a mut Trace);

impl<'de> DeserializeSeed<'de> for Events<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Events<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of trace events")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(e) = seq.next_element::<RawEvent>()? {
            self.0.keep(e);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_events_and_spans_are_kept_and_the_rest_skipped() {
        let json = r#"{"schemaVersion": 1, "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 7, "ts": 10.5, "dur": 4, "args": {"Input Dims": [[2, 3]]}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 9, "ts": 11, "dur": 1},
            {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 7, "ts": 11,
             "args": {"Total Reserved": 0, "Total Allocated": 96, "Bytes": 64, "Device Id": -1, "Device Type": 0, "Addr": 4096, "Ev Idx": 3}},
            {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": "7", "ts": 12, "args": {"Device Type": 1, "Device Id": 2, "Bytes": -512}},
            {"ph": "X", "cat": "Operator", "name": "ProfilerStep#4", "pid": 1, "tid": "7", "ts": 1, "dur": 20}
        ], "traceName": "x"}"#;
        let Parsed::Trace(t) = read(json.as_bytes()).unwrap() else { panic!("a trace") };
        assert_eq!(t.events, 5);
        assert_eq!(t.memory.len(), 2);
        assert_eq!(t.memory[0], MemoryEvent { ts: 11.0, order: 3, device: Device::Cpu, bytes: 64, addr: Some(4096), total_allocated: Some(96), total_reserved: Some(0), tid: 7 });
        assert_eq!((t.memory[1].device, t.memory[1].bytes, t.memory[1].addr, t.memory[1].tid), (Device::Cuda(2), -512, None, 7));
        let kinds: Vec<_> = t.spans.iter().map(|s| (t.names[s.name as usize].as_str(), s.kind, s.end)).collect();
        assert_eq!(kinds, [("aten::addmm", SpanKind::Op, 14.5), ("ProfilerStep#4", SpanKind::Step, 21.0)]);
    }

    #[test]
    fn what_is_not_a_trace_says_so() {
        assert!(read(&b"[1, 2]"[..]).unwrap_err().to_string().contains("a trace event (a JSON object) or a memory timeline's list"));
        assert!(read(&b"7"[..]).unwrap_err().to_string().contains("a chrome trace (a JSON object with traceEvents) or an export_memory_timeline list"));
        assert!(read(&br#"{"a": 1}"#[..]).unwrap_err().to_string().contains("no traceEvents"));
        let cut = read(&br#"{"traceEvents": [{"ph": "X", "na"#[..]).unwrap_err();
        assert!(cut.is_eof(), "{cut}");
    }
}
