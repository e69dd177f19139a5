//! Fast, safe reader for PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot`).
//!
//! A snapshot is a pickle of plain data. Instead of building a generic value tree (which
//! costs several times the file size), this is a purpose-built pickle VM for the data-only
//! subset of protocols 2-5 that converts dicts into typed records (`TraceEntry`, `Block`,
//! `Segment`, `Annotation`, `Frame`) as soon as their `SETITEMS` arrives. Strings are
//! borrowed from the input; frames are interned once per memoized frame dict.
//!
//! Two passes: a cheap pre-scan validates the opcode stream and records which memo slots
//! are ever read back (`BINGET`), so the main pass keeps only those: Python memoizes every
//! container, and keeping them all would double the memory use.
//!
//! Object-building opcodes (GLOBAL, REDUCE, BUILD, ...) are rejected: a snapshot is data.
//! This file depends only on `super::model` (and libc), so the fuzz crate can include it by path.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::{Path, PathBuf};

use super::model::{
    Action, AllocatorSettings, Annotation, AnnotationStage, Block, BlockState, Frame, FrameId,
    Segment, SegmentType, SettingValue, Snapshot, StackId, TraceEntry,
};

/// Deeper generic nesting is refused: real snapshots nest 6 levels, and dropping a
/// pathologically deep tree would recurse.
const MAX_DEPTH: u32 = 100;

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
}

/// Read and decode a snapshot file. Regular files are memory-mapped and the pages
/// already decoded are released as the reader advances, so peak memory is mostly the
/// decoded snapshot, not the file; other files are read into memory.
pub fn read_snapshot_file(path: &Path) -> Result<Snapshot, ReadError> {
    read_snapshot_file_observed(path, &mut |_| {})
}

/// `read_snapshot_file`, showing `observe` what is decoded so far every `TICK` bytes of
/// each pass and once more at the end, so a viewer can draw a large file while it loads.
pub fn read_snapshot_file_observed(
    path: &Path,
    observe: &mut dyn FnMut(&ReadProgress<'_>),
) -> Result<Snapshot, ReadError> {
    let io = |err| ReadError::Io {
        path: path.to_path_buf(),
        err,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    #[cfg(unix)]
    if let Some(map) = mapped::Mapped::open(&file).map_err(io)? {
        return decode(map.bytes(), &mut |upto| map.release(upto), observe);
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut &file, &mut bytes).map_err(io)?;
    decode(&bytes, &mut |_| {}, observe)
}

/// Decode a snapshot pickle.
pub fn read_snapshot(bytes: &[u8]) -> Result<Snapshot, ReadError> {
    decode(bytes, &mut |_| {}, &mut |_| {})
}

/// Which pass over the file a `ReadProgress` is from (in the order they run).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ReadPass {
    /// Validating the opcodes (nothing is decoded yet).
    Check,
    Decode,
}

/// What the reader has decoded so far. Frame and stack ids in these records are the
/// reader's own until the last call (at the end of the read), which shows the final
/// snapshot's lists.
pub struct ReadProgress<'s> {
    pub pass: ReadPass,
    /// Bytes of the file this pass has gone through, of `total`.
    pub done: usize,
    pub total: usize,
    /// The top-level `segments` list, once the reader has gone past it.
    pub segments: Option<&'s [Segment]>,
    /// Each device's trace decoded so far, in device order: a prefix of its final trace.
    pub traces: Vec<&'s [TraceEntry]>,
}

/// How far the reader advances between calls to its `release` and `observe` hooks.
const TICK: usize = 2 << 20;

/// `release(n)` is told periodically that bytes before `n` may be dropped from memory;
/// they must still read the same if touched again (a file mapping re-faults them).
fn decode(
    bytes: &[u8],
    release: &mut dyn FnMut(usize),
    observe: &mut dyn FnMut(&ReadProgress<'_>),
) -> Result<Snapshot, ReadError> {
    match bytes.first() {
        None => return Err(ReadError::Empty),
        Some(&op::PROTO) => {}
        Some(&byte) => return Err(ReadError::NotPickle { byte }),
    }
    let mut hooks = Hooks { release, observe };
    let refs = prescan(bytes, &mut hooks)?;
    let mut vm = Vm::new(bytes, refs);
    let top = vm.run(&mut hooks)?;
    let mut snap = vm.into_snapshot(top)?;
    canonicalize_tables(&mut snap);
    (hooks.observe)(&ReadProgress {
        pass: ReadPass::Decode,
        done: bytes.len(),
        total: bytes.len(),
        segments: Some(&snap.segments),
        traces: snap.device_traces.iter().map(Vec::as_slice).collect(),
    });
    Ok(snap)
}

struct Hooks<'h> {
    release: &'h mut dyn FnMut(usize),
    observe: &'h mut dyn FnMut(&ReadProgress<'_>),
}

impl Hooks<'_> {
    /// Called at every `TICK` bytes of a pass.
    fn tick(
        &mut self,
        pass: ReadPass,
        data: &[u8],
        pos: usize,
        segments: Option<&[Segment]>,
        traces: Vec<&[TraceEntry]>,
    ) {
        (self.release)(pos);
        (self.observe)(&ReadProgress {
            pass,
            done: pos,
            total: data.len(),
            segments,
            traces,
        });
    }
}

/// Pickle opcodes (the writer uses the same table).
pub(super) mod op {
    pub const MARK: u8 = b'(';
    pub const STOP: u8 = b'.';
    pub const POP: u8 = b'0';
    pub const POP_MARK: u8 = b'1';
    pub const DUP: u8 = b'2';
    pub const FLOAT: u8 = b'F';
    pub const INT: u8 = b'I';
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const LONG: u8 = b'L';
    pub const BININT2: u8 = b'M';
    pub const NONE: u8 = b'N';
    pub const PERSID: u8 = b'P';
    pub const BINPERSID: u8 = b'Q';
    pub const REDUCE: u8 = b'R';
    pub const STRING: u8 = b'S';
    pub const BINSTRING: u8 = b'T';
    pub const SHORT_BINSTRING: u8 = b'U';
    pub const UNICODE: u8 = b'V';
    pub const BINUNICODE: u8 = b'X';
    pub const APPEND: u8 = b'a';
    pub const BUILD: u8 = b'b';
    pub const GLOBAL: u8 = b'c';
    pub const DICT: u8 = b'd';
    pub const EMPTY_DICT: u8 = b'}';
    pub const APPENDS: u8 = b'e';
    pub const GET: u8 = b'g';
    pub const BINGET: u8 = b'h';
    pub const INST: u8 = b'i';
    pub const LONG_BINGET: u8 = b'j';
    pub const LIST: u8 = b'l';
    pub const EMPTY_LIST: u8 = b']';
    pub const OBJ: u8 = b'o';
    pub const PUT: u8 = b'p';
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const SETITEM: u8 = b's';
    pub const TUPLE: u8 = b't';
    pub const EMPTY_TUPLE: u8 = b')';
    pub const SETITEMS: u8 = b'u';
    pub const BINFLOAT: u8 = b'G';
    pub const PROTO: u8 = 0x80;
    pub const NEWOBJ: u8 = 0x81;
    pub const EXT1: u8 = 0x82;
    pub const EXT2: u8 = 0x83;
    pub const EXT4: u8 = 0x84;
    pub const TUPLE1: u8 = 0x85;
    pub const TUPLE2: u8 = 0x86;
    pub const TUPLE3: u8 = 0x87;
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const LONG1: u8 = 0x8a;
    pub const LONG4: u8 = 0x8b;
    pub const BINBYTES: u8 = b'B';
    pub const SHORT_BINBYTES: u8 = b'C';
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE8: u8 = 0x8d;
    pub const BINBYTES8: u8 = 0x8e;
    pub const EMPTY_SET: u8 = 0x8f;
    pub const ADDITEMS: u8 = 0x90;
    pub const FROZENSET: u8 = 0x91;
    pub const NEWOBJ_EX: u8 = 0x92;
    pub const STACK_GLOBAL: u8 = 0x93;
    pub const MEMOIZE: u8 = 0x94;
    pub const FRAME: u8 = 0x95;
    pub const BYTEARRAY8: u8 = 0x96;
    pub const NEXT_BUFFER: u8 = 0x97;
    pub const READONLY_BUFFER: u8 = 0x98;
}

/// Opcodes that build objects or run code: refused with "snapshots are plain data".
fn object_opcode_name(code: u8) -> Option<&'static str> {
    Some(match code {
        op::GLOBAL => "GLOBAL",
        op::STACK_GLOBAL => "STACK_GLOBAL",
        op::REDUCE => "REDUCE",
        op::BUILD => "BUILD",
        op::INST => "INST",
        op::OBJ => "OBJ",
        op::NEWOBJ => "NEWOBJ",
        op::NEWOBJ_EX => "NEWOBJ_EX",
        op::PERSID => "PERSID",
        op::BINPERSID => "BINPERSID",
        op::EXT1 => "EXT1",
        op::EXT2 => "EXT2",
        op::EXT4 => "EXT4",
        _ => return None,
    })
}

/// Valid opcodes this reader does not take (text protocol 0, sets, out-of-band buffers).
fn unsupported_opcode_name(code: u8) -> Option<&'static str> {
    Some(match code {
        op::FLOAT => "FLOAT",
        op::INT => "INT",
        op::LONG => "LONG",
        op::STRING => "STRING",
        op::BINSTRING => "BINSTRING",
        op::SHORT_BINSTRING => "SHORT_BINSTRING",
        op::UNICODE => "UNICODE",
        op::GET => "GET",
        op::PUT => "PUT",
        op::EMPTY_SET => "EMPTY_SET",
        op::ADDITEMS => "ADDITEMS",
        op::FROZENSET => "FROZENSET",
        op::BYTEARRAY8 => "BYTEARRAY8",
        op::NEXT_BUFFER => "NEXT_BUFFER",
        op::READONLY_BUFFER => "READONLY_BUFFER",
        _ => return None,
    })
}

/// One decoded opcode; arguments borrow from the input.
enum Op<'a> {
    Proto(u8),
    Frame,
    Stop,
    Mark,
    Pop,
    PopMark,
    Dup,
    None,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(&'static str, &'a [u8]),
    Bytes(&'a [u8]),
    EmptyList,
    EmptyDict,
    EmptyTuple,
    List,
    Dict,
    Tuple,
    TupleN(usize),
    Append,
    Appends,
    SetItem,
    SetItems,
    Memoize,
    Put(u32),
    Get(u32),
}

/// Byte-level opcode decoder shared by the pre-scan and the main pass.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    #[inline]
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], ReadError> {
        let remaining = self.data.len() - self.pos;
        if n > remaining {
            return Err(ReadError::Truncated {
                offset: self.pos,
                expected: format!("{} ({n} bytes, {remaining} left)", what()),
            });
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    #[inline]
    fn fixed<const N: usize>(&mut self, what: &str, opname: &str) -> Result<[u8; N], ReadError> {
        let s = self.take(N, &|| format!("{N}-byte {what} for {opname}"))?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn length(&mut self, raw: u64, opname: &str) -> Result<usize, ReadError> {
        // Compared with what is left before anything is sliced, so a hostile 2 GiB
        // length costs nothing.
        usize::try_from(raw).map_err(|_| ReadError::Truncated {
            offset: self.pos,
            expected: format!("{raw} bytes of {opname} data"),
        })
    }

    /// Decode the opcode at `self.pos`; returns it with its starting offset.
    #[inline]
    fn next(&mut self) -> Result<(usize, Op<'a>), ReadError> {
        let at = self.pos;
        let Some(&code) = self.data.get(at) else {
            return Err(ReadError::Truncated {
                offset: at,
                expected: "an opcode (the pickle has no STOP)".into(),
            });
        };
        self.pos += 1;
        let o = match code {
            op::PROTO => Op::Proto(self.fixed::<1>("version", "PROTO")?[0]),
            op::FRAME => {
                self.fixed::<8>("length", "FRAME")?;
                Op::Frame
            }
            op::STOP => Op::Stop,
            op::MARK => Op::Mark,
            op::POP => Op::Pop,
            op::POP_MARK => Op::PopMark,
            op::DUP => Op::Dup,
            op::NONE => Op::None,
            op::NEWTRUE => Op::Bool(true),
            op::NEWFALSE => Op::Bool(false),
            op::BININT => Op::Int(i32::from_le_bytes(self.fixed("integer", "BININT")?) as i64),
            op::BININT1 => Op::Int(self.fixed::<1>("integer", "BININT1")?[0] as i64),
            op::BININT2 => Op::Int(u16::from_le_bytes(self.fixed("integer", "BININT2")?) as i64),
            op::LONG1 => {
                let n = self.fixed::<1>("length", "LONG1")?[0] as usize;
                let b = self.take(n, &|| "LONG1 integer bytes".into())?;
                long_value(b).ok_or_else(|| out_of_range(at, "LONG1", n))?
            }
            op::LONG4 => {
                let n = i32::from_le_bytes(self.fixed("length", "LONG4")?);
                let n = usize::try_from(n).map_err(|_| ReadError::Malformed {
                    offset: at,
                    detail: format!("LONG4 with negative length {n}"),
                })?;
                let b = self.take(n, &|| "LONG4 integer bytes".into())?;
                long_value(b).ok_or_else(|| out_of_range(at, "LONG4", n))?
            }
            op::BINFLOAT => Op::Float(f64::from_be_bytes(self.fixed("float", "BINFLOAT")?)),
            op::SHORT_BINUNICODE => {
                let n = self.fixed::<1>("length", "SHORT_BINUNICODE")?[0] as usize;
                Op::Str(
                    "SHORT_BINUNICODE",
                    self.take(n, &|| "SHORT_BINUNICODE text".into())?,
                )
            }
            op::BINUNICODE => {
                let n = u32::from_le_bytes(self.fixed("length", "BINUNICODE")?) as u64;
                let n = self.length(n, "BINUNICODE")?;
                Op::Str("BINUNICODE", self.take(n, &|| "BINUNICODE text".into())?)
            }
            op::BINUNICODE8 => {
                let n = u64::from_le_bytes(self.fixed("length", "BINUNICODE8")?);
                let n = self.length(n, "BINUNICODE8")?;
                Op::Str("BINUNICODE8", self.take(n, &|| "BINUNICODE8 text".into())?)
            }
            op::SHORT_BINBYTES => {
                let n = self.fixed::<1>("length", "SHORT_BINBYTES")?[0] as usize;
                Op::Bytes(self.take(n, &|| "SHORT_BINBYTES data".into())?)
            }
            op::BINBYTES => {
                let n = u32::from_le_bytes(self.fixed("length", "BINBYTES")?) as u64;
                let n = self.length(n, "BINBYTES")?;
                Op::Bytes(self.take(n, &|| "BINBYTES data".into())?)
            }
            op::BINBYTES8 => {
                let n = u64::from_le_bytes(self.fixed("length", "BINBYTES8")?);
                let n = self.length(n, "BINBYTES8")?;
                Op::Bytes(self.take(n, &|| "BINBYTES8 data".into())?)
            }
            op::EMPTY_LIST => Op::EmptyList,
            op::EMPTY_DICT => Op::EmptyDict,
            op::EMPTY_TUPLE => Op::EmptyTuple,
            op::LIST => Op::List,
            op::DICT => Op::Dict,
            op::TUPLE => Op::Tuple,
            op::TUPLE1 => Op::TupleN(1),
            op::TUPLE2 => Op::TupleN(2),
            op::TUPLE3 => Op::TupleN(3),
            op::APPEND => Op::Append,
            op::APPENDS => Op::Appends,
            op::SETITEM => Op::SetItem,
            op::SETITEMS => Op::SetItems,
            op::MEMOIZE => Op::Memoize,
            op::BINPUT => Op::Put(self.fixed::<1>("memo index", "BINPUT")?[0] as u32),
            op::LONG_BINPUT => {
                Op::Put(u32::from_le_bytes(self.fixed("memo index", "LONG_BINPUT")?))
            }
            op::BINGET => Op::Get(self.fixed::<1>("memo index", "BINGET")?[0] as u32),
            op::LONG_BINGET => {
                Op::Get(u32::from_le_bytes(self.fixed("memo index", "LONG_BINGET")?))
            }
            _ => {
                if let Some(name) = object_opcode_name(code) {
                    return Err(ReadError::ObjectOpcode {
                        name,
                        code,
                        offset: at,
                    });
                }
                if let Some(name) = unsupported_opcode_name(code) {
                    return Err(ReadError::UnsupportedOpcode {
                        name,
                        code,
                        offset: at,
                    });
                }
                return Err(ReadError::UnknownOpcode { code, offset: at });
            }
        };
        Ok((at, o))
    }
}

fn out_of_range(offset: usize, opname: &str, n: usize) -> ReadError {
    ReadError::Malformed {
        offset,
        detail: format!("{opname} integer of {n} bytes is outside the 64-bit range"),
    }
}

/// Little-endian two's complement integer as i64, or u64 when it only fits unsigned.
fn long_value(b: &[u8]) -> Option<Op<'static>> {
    let negative = b.last().is_some_and(|x| x & 0x80 != 0);
    let (low, high) = b.split_at(b.len().min(8));
    let mut buf = [if negative { 0xff } else { 0 }; 8];
    buf[..low.len()].copy_from_slice(low);
    let fill = if negative { 0xff } else { 0 };
    if !high.iter().all(|&x| x == fill) {
        return None;
    }
    let v = i64::from_le_bytes(buf);
    if b.len() > 8 && !negative && v < 0 {
        // 9+ bytes with zero high bytes: an unsigned value past i64::MAX.
        return Some(Op::UInt(v as u64));
    }
    if b.len() > 8 && negative && v >= 0 {
        return None;
    }
    Some(Op::Int(v))
}

/// Memo slots read back by BINGET, as a bitset with rank support.
struct MemoRefs {
    words: Vec<u64>,
    /// `ranks[i]` = number of set bits in `words[..i]`.
    ranks: Vec<u32>,
}

impl MemoRefs {
    #[inline]
    fn slot(&self, idx: u32) -> Option<usize> {
        let w = *self.words.get((idx / 64) as usize)?;
        let bit = 1u64 << (idx % 64);
        (w & bit != 0).then(|| {
            self.ranks[(idx / 64) as usize] as usize + (w & (bit - 1)).count_ones() as usize
        })
    }
    fn count(&self) -> usize {
        self.ranks.last().copied().unwrap_or(0) as usize
            + self.words.last().map_or(0, |w| w.count_ones() as usize)
    }
}

/// Tracks Python's `len(memo)`; a put may overwrite or append, never skip ahead.
fn memo_put(len: &mut u32, idx: u32, at: usize) -> Result<(), ReadError> {
    if idx > *len {
        return Err(ReadError::Malformed {
            offset: at,
            detail: format!("memo index {idx} skips ahead of the {len} memo entries defined"),
        });
    }
    if idx == *len {
        *len = len.checked_add(1).ok_or_else(|| ReadError::Malformed {
            offset: at,
            detail: "too many memo entries".into(),
        })?;
    }
    Ok(())
}

fn memo_get_check(len: u32, idx: u32, at: usize) -> Result<(), ReadError> {
    if idx >= len {
        return Err(ReadError::Malformed {
            offset: at,
            detail: format!("memo index {idx} out of range (memo has {len} entries)"),
        });
    }
    Ok(())
}

/// First pass: validate every opcode and its length, and find the memo slots read back.
fn prescan(data: &[u8], hooks: &mut Hooks<'_>) -> Result<MemoRefs, ReadError> {
    // The position lives in a local, not in a Cursor whose address escapes: kept in a
    // register, not stored and reloaded around every opcode.
    let mut pos = 0;
    let mut words: Vec<u64> = Vec::new();
    let mut len = 0u32;
    let mut next_tick = TICK;
    loop {
        if pos >= next_tick {
            hooks.tick(ReadPass::Check, data, pos, None, Vec::new());
            next_tick = pos + TICK;
        }
        // The opcodes that make up nearly all of a snapshot, skipped without decoding
        // when complete; anything else (or a truncated one) takes the full decoder.
        if let Some((idx, n)) = memo_ref(&data[pos..]) {
            mark_get(&mut words, len, idx, pos)?;
            pos += n;
            continue;
        }
        match &data[pos..] {
            [op::MEMOIZE, ..] => {
                let idx = len;
                memo_put(&mut len, idx, pos)?;
                pos += 1;
                continue;
            }
            [op::MARK
            | op::EMPTY_DICT
            | op::EMPTY_LIST
            | op::SETITEMS
            | op::APPENDS
            | op::NONE
            | op::NEWTRUE
            | op::NEWFALSE, ..] => {
                pos += 1;
                continue;
            }
            [op::BININT1, _, ..] => {
                pos += 2;
                continue;
            }
            [op::SHORT_BINUNICODE, n, rest @ ..] if rest.len() >= *n as usize => {
                pos += 2 + *n as usize;
                continue;
            }
            _ => {}
        }
        let mut cur = Cursor { data, pos };
        let (at, o) = cur.next()?;
        pos = cur.pos;
        match o {
            Op::Stop => break,
            Op::Proto(v) => check_proto(v, at)?,
            Op::Memoize => {
                let idx = len;
                memo_put(&mut len, idx, at)?
            }
            Op::Put(idx) => memo_put(&mut len, idx, at)?,
            Op::Get(idx) => mark_get(&mut words, len, idx, at)?,
            _ => {}
        }
    }
    let mut ranks = Vec::with_capacity(words.len());
    let mut acc = 0u32;
    for w in &words {
        ranks.push(acc);
        acc += w.count_ones();
    }
    Ok(MemoRefs { words, ranks })
}

/// A complete BINGET or LONG_BINGET at the start of `bytes`: its memo index and length.
#[inline]
fn memo_ref(bytes: &[u8]) -> Option<(u32, usize)> {
    match bytes {
        [op::BINGET, i, ..] => Some((*i as u32, 2)),
        [op::LONG_BINGET, a, b, c, d, ..] => Some((u32::from_le_bytes([*a, *b, *c, *d]), 5)),
        _ => None,
    }
}

/// Record that memo slot `idx` is read back (checked against the `len` slots defined).
#[inline]
fn mark_get(words: &mut Vec<u64>, len: u32, idx: u32, at: usize) -> Result<(), ReadError> {
    memo_get_check(len, idx, at)?;
    let w = (idx / 64) as usize;
    if words.len() <= w {
        words.resize(w + 1, 0);
    }
    words[w] |= 1 << (idx % 64);
    Ok(())
}

fn check_proto(v: u8, offset: usize) -> Result<(), ReadError> {
    if (2..=5).contains(&v) {
        Ok(())
    } else {
        Err(ReadError::Protocol { version: v, offset })
    }
}

/// Generic container contents with the nesting depth of what it owns.
#[derive(Clone, Debug, Default)]
struct Seq<'a> {
    items: Vec<Value<'a>>,
    depth: u32,
}

/// A list, stored by element type once its elements are recognised records.
#[derive(Clone, Debug)]
enum ListData<'a> {
    Values(Seq<'a>),
    Frames(Vec<FrameId>),
    Entries(Vec<TraceEntry>),
    Blocks(Vec<Block>),
    Segments(Vec<Segment>),
    Annotations(Vec<Annotation>),
}

#[derive(Clone, Debug, Default)]
enum Value<'a> {
    #[default]
    None,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(&'a str),
    Bytes(&'a [u8]),
    List(ListData<'a>),
    Tuple(Seq<'a>),
    /// Flat `[k0, v0, k1, v1, ...]`; later duplicates win, as in Python.
    Dict(Seq<'a>),
    /// A memoized container that is read back later: lives in `Vm::arena`.
    Shared(u32),
    Frame(FrameId),
    Stack(StackId),
    Entry(Box<TraceEntry>),
    Block(Box<Block>),
    Segment(Box<Segment>),
    Annotation(Box<Annotation>),
    /// An arena slot whose value is being converted (a cycle if met again).
    Taken,
}

impl<'a> Value<'a> {
    fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "a bool",
            Value::Int(_) | Value::UInt(_) => "an integer",
            Value::Float(_) => "a float",
            Value::Str(_) => "a string",
            Value::Bytes(_) => "bytes",
            Value::List(_) | Value::Stack(_) => "a list",
            Value::Tuple(_) => "a tuple",
            Value::Dict(_) => "a dict",
            Value::Shared(_) => "a shared container",
            Value::Frame(_) => "a frame",
            Value::Entry(_) => "a trace entry",
            Value::Block(_) => "a block",
            Value::Segment(_) => "a segment",
            Value::Annotation(_) => "an annotation",
            Value::Taken => "a container already used elsewhere (shared or recursive)",
        }
    }

    fn depth(&self) -> u32 {
        match self {
            Value::List(ListData::Values(s)) | Value::Tuple(s) | Value::Dict(s) => s.depth + 1,
            Value::List(_) => 1,
            _ => 0,
        }
    }

    /// Values a memo slot can hold by copy; containers go to the arena instead.
    fn cheap_copy(&self) -> Option<Memo<'a>> {
        Some(match self {
            Value::None => Memo::None,
            Value::Bool(b) => Memo::Bool(*b),
            Value::Int(i) => Memo::Int(*i),
            Value::UInt(u) => Memo::UInt(*u),
            Value::Float(f) => Memo::Float(*f),
            Value::Str(s) => Memo::Str(s),
            Value::Bytes(b) => Memo::Bytes(b),
            Value::Shared(h) => Memo::Shared(*h),
            Value::Frame(f) => Memo::Frame(*f),
            Value::Stack(s) => Memo::Stack(*s),
            _ => return None,
        })
    }
}

/// What a memo slot holds: the `Value`s that copy cheaply, as a small `Copy` type so
/// the millions of BINGETs copy 24 bytes and never run `Value`'s drop or clone.
#[derive(Clone, Copy, Debug, Default)]
enum Memo<'a> {
    #[default]
    None,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(&'a str),
    Bytes(&'a [u8]),
    Shared(u32),
    Frame(FrameId),
    Stack(StackId),
}

impl<'a> Memo<'a> {
    #[inline]
    fn value(self) -> Value<'a> {
        match self {
            Memo::None => Value::None,
            Memo::Bool(b) => Value::Bool(b),
            Memo::Int(i) => Value::Int(i),
            Memo::UInt(u) => Value::UInt(u),
            Memo::Float(f) => Value::Float(f),
            Memo::Str(s) => Value::Str(s),
            Memo::Bytes(b) => Value::Bytes(b),
            Memo::Shared(h) => Value::Shared(h),
            Memo::Frame(f) => Value::Frame(f),
            Memo::Stack(s) => Value::Stack(s),
        }
    }
}

fn seq_from(items: Vec<Value<'_>>, at: usize) -> Result<Seq<'_>, ReadError> {
    let depth = items.iter().map(Value::depth).max().unwrap_or(0);
    check_depth(depth, at)?;
    Ok(Seq { items, depth })
}

fn check_depth(depth: u32, at: usize) -> Result<(), ReadError> {
    if depth > MAX_DEPTH {
        return Err(ReadError::Malformed {
            offset: at,
            detail: format!("containers nested deeper than {MAX_DEPTH} levels"),
        });
    }
    Ok(())
}

/// Multiply-rotate hasher: the keys are short and trusted to be non-adversarial in
/// distribution terms only; a collision flood would slow, never break, the reader.
#[derive(Default)]
struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        // Final avalanche: hashbrown indexes by the low bits, which the multiply alone
        // leaves poorly mixed.
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^ (h >> 33)
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().unwrap_or_default()));
        }
        for &b in chunks.remainder() {
            self.add(b as u64);
        }
    }
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_i64(&mut self, i: i64) {
        self.add(i as u64);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
}

impl FastHasher {
    #[inline]
    fn add(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// The dict keys the reader knows. Matching a key once to this enum costs one string
/// comparison instead of one per candidate, which matters at millions of dicts.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Key {
    Action,
    Addr,
    DeviceFree,
    Size,
    Stream,
    TimeUs,
    Frames,
    Category,
    CompileContext,
    UserMetadata,
    Address,
    RequestedSize,
    State,
    Device,
    TotalSize,
    AllocatedSize,
    ActiveSize,
    SegmentType,
    SegmentPoolId,
    IsExpandable,
    Blocks,
    Name,
    Filename,
    Line,
    Stage,
    Other,
}

impl Key {
    fn name(self) -> &'static str {
        match self {
            Key::Action => "action",
            Key::Addr => "addr",
            Key::DeviceFree => "device_free",
            Key::Size => "size",
            Key::Stream => "stream",
            Key::TimeUs => "time_us",
            Key::Frames => "frames",
            Key::Category => "category",
            Key::CompileContext => "compile_context",
            Key::UserMetadata => "user_metadata",
            Key::Address => "address",
            Key::RequestedSize => "requested_size",
            Key::State => "state",
            Key::Device => "device",
            Key::TotalSize => "total_size",
            Key::AllocatedSize => "allocated_size",
            Key::ActiveSize => "active_size",
            Key::SegmentType => "segment_type",
            Key::SegmentPoolId => "segment_pool_id",
            Key::IsExpandable => "is_expandable",
            Key::Blocks => "blocks",
            Key::Name => "name",
            Key::Filename => "filename",
            Key::Line => "line",
            Key::Stage => "stage",
            Key::Other => "",
        }
    }
}

fn key_of(k: &str) -> Key {
    let b = k.as_bytes();
    let Some(&first) = b.first() else {
        return Key::Other;
    };
    let cand = match (b.len(), first) {
        (4, b'a') => Key::Addr,
        (4, b'l') => Key::Line,
        (4, b'n') => Key::Name,
        (4, b's') => Key::Size,
        (5, b's') => match b[3] {
            b't' => Key::State,
            b'g' => Key::Stage,
            _ => return Key::Other,
        },
        (6, b'a') => Key::Action,
        (6, b'b') => Key::Blocks,
        (6, b'd') => Key::Device,
        (6, b'f') => Key::Frames,
        (6, b's') => Key::Stream,
        (7, b'a') => Key::Address,
        (7, b't') => Key::TimeUs,
        (8, b'c') => Key::Category,
        (8, b'f') => Key::Filename,
        (10, b't') => Key::TotalSize,
        (11, b'a') => Key::ActiveSize,
        (11, b'd') => Key::DeviceFree,
        (12, b's') => Key::SegmentType,
        (13, b'i') => Key::IsExpandable,
        (13, b'u') => Key::UserMetadata,
        (14, b'a') => Key::AllocatedSize,
        (14, b'r') => Key::RequestedSize,
        (15, b'c') => Key::CompileContext,
        (15, b's') => Key::SegmentPoolId,
        _ => return Key::Other,
    };
    if cand.name() == k {
        cand
    } else {
        Key::Other
    }
}

/// Keys are nearly always memoized strings, so one key arrives again and again at the
/// same address in the input; remembering recent addresses skips the comparison.
struct KeyCache {
    slots: [std::cell::Cell<(usize, usize, Key)>; 64],
}

impl KeyCache {
    fn new() -> Self {
        KeyCache {
            slots: std::array::from_fn(|_| std::cell::Cell::new((0, 0, Key::Other))),
        }
    }

    /// Only valid for strings of one input buffer: same address and length, same bytes.
    fn get(&self, k: &str) -> Key {
        let addr = k.as_ptr() as usize;
        let slot = &self.slots[(addr >> 1) % 64];
        let (a, len, key) = slot.get();
        if a == addr && len == k.len() {
            return key;
        }
        let key = key_of(k);
        slot.set((addr, k.len(), key));
        key
    }
}

fn action_of(s: &str) -> Option<Action> {
    Some(match s {
        "alloc" => Action::Alloc,
        "free_requested" => Action::FreeRequested,
        "free_completed" => Action::FreeCompleted,
        "segment_alloc" => Action::SegmentAlloc,
        "segment_free" => Action::SegmentFree,
        "segment_map" => Action::SegmentMap,
        "segment_unmap" => Action::SegmentUnmap,
        "snapshot" => Action::Snapshot,
        "oom" => Action::Oom,
        _ => return None,
    })
}

/// The kind of record a dict is, judged by its keys.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Entry,
    Block,
    Segment,
    Annotation,
    Frame,
}

fn classify(pairs: &[Value<'_>], keys: &KeyCache) -> Option<Kind> {
    let (mut filename, mut line, mut name, mut state, mut size, mut address) =
        (false, false, false, false, false, false);
    for k in pairs.iter().step_by(2) {
        let Value::Str(k) = k else { continue };
        match keys.get(k) {
            Key::Action => return Some(Kind::Entry),
            Key::Stage => return Some(Kind::Annotation),
            Key::Blocks | Key::SegmentType => return Some(Kind::Segment),
            Key::Filename => filename = true,
            Key::Line => line = true,
            Key::Name => name = true,
            Key::State => state = true,
            Key::Size => size = true,
            Key::Address => address = true,
            _ => {}
        }
    }
    if filename && line && name {
        Some(Kind::Frame)
    } else if state && size && address {
        Some(Kind::Block)
    } else {
        None
    }
}

/// Stack interning, the hottest lookup of a snapshot (one per trace entry, 20-40 frames
/// each, and distinct stacks too many for the cache): an open-addressing table whose
/// slots carry a hash tag and where the stack's frames lie in one flat pool, so a
/// lookup costs two memory accesses (slot, frames) and one comparison.
#[derive(Default)]
struct StackTable {
    stacks: Vec<Vec<FrameId>>,
    /// The frames of every stack, back to back: `pool[slot.start..][..slot.len]`.
    pool: Vec<FrameId>,
    /// Power-of-two length, at most half full; `id == 0` marks an empty slot.
    slots: Vec<StackSlot>,
    /// The slot of the stack interned last: a free and its completion, back to back,
    /// share one, and its frames in `pool` are still in cache.
    last: Option<StackSlot>,
}

#[derive(Clone, Copy, Default)]
struct StackSlot {
    tag: u32,
    len: u32,
    start: u32,
    /// Stack id + 1.
    id: u32,
}

impl StackTable {
    fn hash(ids: &[FrameId]) -> u64 {
        let mut h = FastHasher(ids.len() as u64);
        let mut pairs = ids.chunks_exact(2);
        for p in &mut pairs {
            h.add((p[0] as u64) << 32 | p[1] as u64);
        }
        if let [last] = pairs.remainder() {
            h.add(*last as u64);
        }
        h.finish()
    }

    /// The id of this stack, added (taking `ids`) if new; `None` when the table is full
    /// (4 G stacks or frames).
    fn intern(&mut self, ids: &mut Vec<FrameId>) -> Option<StackId> {
        if let Some(last) = self.last.filter(|l| self.frames_of(l) == Some(ids.as_slice())) {
            return Some(last.id - 1);
        }
        let slot = self.lookup_or_add(ids)?;
        self.last = Some(slot);
        Some(slot.id - 1)
    }

    fn frames_of(&self, s: &StackSlot) -> Option<&[FrameId]> {
        self.pool.get(s.start as usize..s.start as usize + s.len as usize)
    }

    fn lookup_or_add(&mut self, ids: &mut Vec<FrameId>) -> Option<StackSlot> {
        let h = Self::hash(ids);
        let tag = (h >> 32) as u32;
        if self.slots.is_empty() {
            self.slots = vec![StackSlot::default(); 1024];
        }
        let mask = self.slots.len() - 1;
        let mut i = h as usize & mask;
        loop {
            let s = self.slots[i];
            if s.id == 0 {
                break;
            }
            if s.tag == tag && s.len as usize == ids.len() && self.frames_of(&s) == Some(ids.as_slice()) {
                return Some(s);
            }
            i = (i + 1) & mask;
        }
        let id = StackId::try_from(self.stacks.len()).ok()?;
        let slot = StackSlot {
            tag,
            len: u32::try_from(ids.len()).ok()?,
            start: u32::try_from(self.pool.len()).ok()?,
            id: id.checked_add(1)?,
        };
        self.slots[i] = slot;
        self.pool.extend_from_slice(ids);
        self.stacks.push(std::mem::take(ids));
        if self.stacks.len() * 2 > self.slots.len() {
            self.grow();
        }
        Some(slot)
    }

    fn grow(&mut self) {
        let mut slots = vec![StackSlot::default(); self.slots.len() * 2];
        let mask = slots.len() - 1;
        for s in self.slots.iter().filter(|s| s.id != 0) {
            let ids = &self.pool[s.start as usize..][..s.len as usize];
            let mut i = Self::hash(ids) as usize & mask;
            while slots[i].id != 0 {
                i = (i + 1) & mask;
            }
            slots[i] = *s;
        }
        self.slots = slots;
    }
}

const NO_FRAME: FrameId = FrameId::MAX;

/// A trace entry's `frames` as `FastEntry` reads them: the frame ids collected, or a
/// stack already interned (a list read back by BINGET).
enum FastFrames {
    Ids,
    Stack(StackId),
}

/// Reads one trace entry dict straight from the bytes for `Vm::fast_entry`, changing
/// nothing: the memo puts it would make are kept aside (`puts`, `memo_len`). Every
/// method returns `None` on anything it does not know.
struct FastEntry<'v, 'a> {
    vm: &'v Vm<'a>,
    data: &'a [u8],
    pos: usize,
    memo_len: u32,
    /// Strings memoized within the entry and read back later: (memo slot, text).
    puts: [(usize, &'a str); 4],
    nputs: usize,
}

impl<'a> FastEntry<'_, 'a> {
    fn byte(&self) -> Option<u8> {
        self.data.get(self.pos).copied()
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let b = self.data.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(b)
    }

    fn fixed<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    /// A MEMOIZE here, if any; the memo slot it fills when that is read back later.
    fn memoize(&mut self) -> Option<Option<usize>> {
        if self.byte() != Some(op::MEMOIZE) {
            return Some(None);
        }
        let idx = self.memo_len;
        self.memo_len = idx.checked_add(1)?;
        self.pos += 1;
        Some(self.vm.refs.slot(idx))
    }

    fn string(&mut self) -> Option<&'a str> {
        let text = match self.byte()? {
            op::SHORT_BINUNICODE => {
                self.pos += 1;
                let [n] = self.fixed()?;
                self.take(n as usize)?
            }
            op::BINUNICODE => {
                self.pos += 1;
                let n = u32::from_le_bytes(self.fixed()?);
                self.take(usize::try_from(n).ok()?)?
            }
            op::BINGET | op::LONG_BINGET => {
                let (idx, len) = memo_ref(&self.data[self.pos..])?;
                if idx >= self.memo_len {
                    return None;
                }
                let slot = self.vm.refs.slot(idx)?;
                let s = if idx >= self.vm.memo_len {
                    self.puts[..self.nputs].iter().find(|p| p.0 == slot)?.1
                } else {
                    match self.vm.memo[slot] {
                        Memo::Str(s) => s,
                        _ => return None,
                    }
                };
                self.pos += len;
                return Some(s);
            }
            _ => return None,
        };
        let s = std::str::from_utf8(text).ok()?;
        if let Some(slot) = self.memoize()? {
            *self.puts.get_mut(self.nputs)? = (slot, s);
            self.nputs += 1;
        }
        Some(s)
    }

    fn opt_string(&mut self) -> Option<Option<String>> {
        if self.byte()? == op::NONE {
            self.pos += 1;
            return Some(None);
        }
        Some(Some(self.string()?.to_owned()))
    }

    /// An integer or bool, as `Op` holds it.
    fn int(&mut self) -> Option<Op<'static>> {
        let op = self.byte()?;
        self.pos += 1;
        Some(match op {
            op::BININT1 => Op::Int(self.fixed::<1>()?[0] as i64),
            op::BININT2 => Op::Int(u16::from_le_bytes(self.fixed()?) as i64),
            op::BININT => Op::Int(i32::from_le_bytes(self.fixed()?) as i64),
            op::LONG1 => {
                let [n] = self.fixed()?;
                long_value(self.take(n as usize)?)?
            }
            op::NEWTRUE => Op::Bool(true),
            op::NEWFALSE => Op::Bool(false),
            _ => return None,
        })
    }

    /// As `Vm::u64_field` takes it.
    fn unsigned(&mut self) -> Option<u64> {
        match self.int()? {
            Op::Int(i) => u64::try_from(i).ok(),
            Op::UInt(u) => Some(u),
            _ => None,
        }
    }

    /// As `Vm::i64_field` takes it.
    fn signed(&mut self) -> Option<i64> {
        match self.int()? {
            Op::Int(i) => Some(i),
            Op::Bool(b) => Some(b as i64),
            _ => None,
        }
    }

    /// `frames`: None, a stack read back, or a new list of frames read back (as Python
    /// writes it: empty, `BINGET APPEND` for one, `MARK BINGET... APPENDS` batches).
    fn frames(&mut self, ids: &mut Vec<FrameId>) -> Option<FastFrames> {
        ids.clear();
        match self.byte()? {
            op::NONE => {
                self.pos += 1;
                return Some(FastFrames::Ids);
            }
            op::BINGET | op::LONG_BINGET => {
                let (idx, len) = memo_ref(&self.data[self.pos..])?;
                if idx >= self.vm.memo_len {
                    return None;
                }
                let Value::Stack(s) = self.vm.memo_value(self.vm.refs.slot(idx)?) else {
                    return None;
                };
                self.pos += len;
                return Some(FastFrames::Stack(s));
            }
            op::EMPTY_LIST => self.pos += 1,
            _ => return None,
        }
        if self.memoize()?.is_some() {
            return None; // a list read back later is shared
        }
        loop {
            match self.byte()? {
                op::MARK => {
                    self.pos += 1;
                    let before = ids.len();
                    self.pos = self.vm.frame_refs(self.pos, ids);
                    if ids.len() == before || self.byte()? != op::APPENDS {
                        return None;
                    }
                    self.pos += 1;
                }
                _ => match self.vm.frame_at(self.pos) {
                    Some((f, len)) if self.data.get(self.pos + len) == Some(&op::APPEND) => {
                        ids.push(f);
                        self.pos += len + 1;
                    }
                    _ => return Some(FastFrames::Ids),
                },
            }
        }
    }

    /// `EMPTY_DICT [MEMOIZE] MARK key value ... SETITEMS` of entry keys only, as
    /// `Vm::entry_from` reads them (the last of a repeated key wins); `frames` is left
    /// for the caller to intern.
    fn entry(&mut self, ids: &mut Vec<FrameId>) -> Option<(TraceEntry, FastFrames)> {
        if self.byte()? != op::EMPTY_DICT {
            return None;
        }
        self.pos += 1;
        if self.memoize()?.is_some() || self.byte()? != op::MARK {
            return None; // a dict read back later is shared; one pair is a SETITEM
        }
        self.pos += 1;
        let (mut action, mut addr, mut size, mut stream, mut time_us) = (None, None, None, 0, 0);
        let mut frames = FastFrames::Ids;
        let (mut category, mut compile_context, mut user_metadata) = (None, None, None);
        while self.byte()? != op::SETITEMS {
            let key = self.string()?;
            match self.vm.keys.get(key) {
                Key::Action => action = Some(action_of(self.string()?)?),
                Key::Addr | Key::DeviceFree => addr = Some(self.unsigned()?),
                Key::Size => size = Some(self.unsigned()?),
                Key::Stream => stream = self.signed()?,
                Key::TimeUs => time_us = self.signed()?,
                Key::Frames => frames = self.frames(ids)?,
                Key::Category => category = self.opt_string()?,
                Key::CompileContext => compile_context = self.opt_string()?,
                Key::UserMetadata => user_metadata = self.opt_string()?,
                _ => return None,
            }
        }
        self.pos += 1;
        let entry = TraceEntry {
            action: action?,
            addr: addr?,
            size: size?,
            stream,
            time_us,
            frames: 0,
            category,
            compile_context,
            user_metadata,
        };
        Some((entry, frames))
    }
}

struct Vm<'a> {
    cur: Cursor<'a>,
    stack: Vec<Value<'a>>,
    marks: Vec<usize>,
    refs: MemoRefs,
    memo: Vec<Memo<'a>>,
    /// The frame each memo slot holds (`NO_FRAME` if none): a compact copy of `memo` for
    /// the hottest lookup, BINGETs of frames, kept by `set_memo`.
    memo_frames: Vec<FrameId>,
    memo_len: u32,
    arena: Vec<Value<'a>>,
    /// The memo slot of each arena entry, to store converted frames/stacks there too.
    arena_memo: Vec<usize>,
    frames: Vec<Frame>,
    frame_ids: FastMap<(&'a str, &'a str, i64), FrameId>,
    stacks: StackTable,
    scratch: Vec<Value<'a>>,
    frame_scratch: Vec<FrameId>,
    keys: KeyCache,
    /// Offset of the opcode being run, for error messages.
    at: usize,
}

fn malformed(offset: usize, detail: impl Into<String>) -> ReadError {
    ReadError::Malformed {
        offset,
        detail: detail.into(),
    }
}

impl<'a> Vm<'a> {
    fn new(data: &'a [u8], refs: MemoRefs) -> Self {
        let memo = vec![Memo::None; refs.count()];
        let memo_frames = vec![NO_FRAME; refs.count()];
        Vm {
            cur: Cursor { data, pos: 0 },
            stack: Vec::with_capacity(4096),
            marks: Vec::with_capacity(64),
            refs,
            memo,
            memo_frames,
            memo_len: 0,
            arena: Vec::new(),
            arena_memo: Vec::new(),
            frames: Vec::new(),
            frame_ids: FastMap::default(),
            stacks: StackTable::default(),
            scratch: Vec::new(),
            frame_scratch: Vec::new(),
            keys: KeyCache::new(),
            at: 0,
        }
    }

    fn schema(&self, what: &str, detail: String) -> ReadError {
        ReadError::Schema {
            detail: format!("{what} completed at byte {}: {detail}", self.at),
        }
    }

    fn pop(&mut self) -> Result<Value<'a>, ReadError> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return Err(malformed(
                self.at,
                "a value is needed but the stack top is a MARK",
            ));
        }
        self.stack
            .pop()
            .ok_or_else(|| malformed(self.at, "a value is needed but the stack is empty"))
    }

    fn pop_mark(&mut self) -> Result<usize, ReadError> {
        self.marks
            .pop()
            .ok_or_else(|| malformed(self.at, "an opcode that needs a MARK found none"))
    }

    fn run(&mut self, hooks: &mut Hooks<'_>) -> Result<Value<'a>, ReadError> {
        let mut next_tick = TICK;
        loop {
            if self.cur.pos >= next_tick {
                let (segments, traces) = self.peek();
                hooks.tick(ReadPass::Decode, self.cur.data, self.cur.pos, segments, traces);
                next_tick = self.cur.pos + TICK;
            }
            // The opcodes that make up nearly all of a snapshot, run straight from the
            // bytes when complete; anything else (or a truncated one) is decoded fully.
            let at = self.cur.pos;
            self.at = at;
            let rest = &self.cur.data[at..];
            // Each arm pushes in place: a value handed on through a temporary stalls on
            // store forwarding.
            match rest {
                [op::BINGET | op::LONG_BINGET, ..] => {
                    if let Some((idx, len)) = memo_ref(rest) {
                        let slot = self.memo_slot(idx)?;
                        self.stack.push(self.memo_value(slot));
                        self.cur.pos += len;
                        continue;
                    }
                }
                [op::BININT1, i, ..] => {
                    self.stack.push(Value::Int(*i as i64));
                    self.cur.pos += 2;
                    continue;
                }
                [op::EMPTY_DICT, ..] => {
                    if self.fast_entry() {
                        continue;
                    }
                    self.stack.push(Value::Dict(Seq::default()));
                    self.cur.pos += 1;
                    continue;
                }
                [op::EMPTY_LIST, ..] => {
                    self.stack.push(Value::List(ListData::Values(Seq::default())));
                    self.cur.pos += 1;
                    continue;
                }
                [op::MEMOIZE, ..] => {
                    self.cur.pos += 1;
                    self.put(self.memo_len)?;
                    continue;
                }
                _ => {}
            }
            let (at, o) = self.cur.next()?;
            self.at = at;
            match o {
                Op::Proto(v) => check_proto(v, at)?,
                Op::Frame => {}
                Op::Stop => {
                    if !self.marks.is_empty() || self.stack.len() != 1 {
                        return Err(malformed(
                            at,
                            format!(
                                "STOP with {} values and {} marks on the stack, expected one value",
                                self.stack.len(),
                                self.marks.len()
                            ),
                        ));
                    }
                    return self.pop();
                }
                Op::Mark => {
                    self.marks.push(self.stack.len());
                    self.frame_run()?;
                }
                Op::Pop => {
                    if self.marks.last() == Some(&self.stack.len()) {
                        self.marks.pop();
                    } else {
                        self.pop()?;
                    }
                }
                Op::PopMark => {
                    let m = self.pop_mark()?;
                    self.stack.truncate(m);
                }
                Op::Dup => {
                    let top = self
                        .stack
                        .last()
                        .ok_or_else(|| malformed(at, "DUP on an empty stack"))?;
                    // Copying a container could multiply memory; no snapshot writer emits DUP.
                    let v = top.cheap_copy().ok_or_else(|| {
                        malformed(at, format!("DUP of {} is not supported", top.kind()))
                    })?;
                    self.stack.push(v.value());
                }
                Op::None => self.stack.push(Value::None),
                Op::Bool(b) => self.stack.push(Value::Bool(b)),
                Op::Int(i) => self.stack.push(Value::Int(i)),
                Op::UInt(u) => self.stack.push(Value::UInt(u)),
                Op::Float(f) => self.stack.push(Value::Float(f)),
                Op::Str(name, b) => {
                    let s = std::str::from_utf8(b)
                        .map_err(|_| malformed(at, format!("{name} text is not valid UTF-8")))?;
                    self.stack.push(Value::Str(s));
                }
                Op::Bytes(b) => self.stack.push(Value::Bytes(b)),
                Op::EmptyList => self
                    .stack
                    .push(Value::List(ListData::Values(Seq::default()))),
                Op::EmptyDict => self.stack.push(Value::Dict(Seq::default())),
                Op::EmptyTuple => self.stack.push(Value::Tuple(Seq::default())),
                Op::List => {
                    let m = self.pop_mark()?;
                    let mut list = ListData::Values(Seq::default());
                    let mut items = self.stack.split_off(m);
                    self.extend_list(&mut list, &mut items)?;
                    self.stack.push(Value::List(list));
                }
                Op::Tuple => {
                    let m = self.pop_mark()?;
                    let items = self.stack.split_off(m);
                    self.stack.push(Value::Tuple(seq_from(items, at)?));
                }
                Op::TupleN(n) => {
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + n {
                        return Err(malformed(
                            at,
                            format!("TUPLE{n} needs {n} values on the stack"),
                        ));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    self.stack.push(Value::Tuple(seq_from(items, at)?));
                }
                Op::Dict => {
                    let m = self.pop_mark()?;
                    let mut d = Value::Dict(Seq::default());
                    let mut pairs = self.stack.split_off(m);
                    self.set_items(&mut d, &mut pairs)?;
                    self.stack.push(d);
                }
                Op::Append => {
                    let floor = self.marks.last().copied().unwrap_or(0);
                    self.add_to_container(
                        self.stack.len().saturating_sub(1).max(floor),
                        Self::append_items,
                    )?;
                }
                Op::Appends => {
                    let m = self.pop_mark()?;
                    self.add_to_container(m, Self::append_items)?;
                }
                Op::SetItem => {
                    let floor = self.marks.last().copied().unwrap_or(0);
                    self.add_to_container(
                        self.stack.len().saturating_sub(2).max(floor),
                        Self::set_items,
                    )?;
                }
                Op::SetItems => {
                    let m = self.pop_mark()?;
                    self.add_to_container(m, Self::set_items)?;
                }
                Op::Memoize => {
                    let idx = self.memo_len;
                    self.put(idx)?;
                }
                Op::Put(idx) => self.put(idx)?,
                Op::Get(idx) => {
                    let v = self.memo_value(self.memo_slot(idx)?);
                    self.stack.push(v);
                }
            }
        }
    }

    /// The top-level `segments` and `device_traces` decoded so far. Until its SETITEMS,
    /// the top dict's keys and values lie on the stack above its MARK: `'segments'`,
    /// the segment list, `'device_traces'`, the outer list, then the per-device lists
    /// not yet appended to it, the last one growing. Other layouts show nothing here
    /// and are still read in full.
    fn peek(&self) -> (Option<&[Segment]>, Vec<&[TraceEntry]>) {
        fn list<'v, 'a>(arena: &'v [Value<'a>], v: &'v Value<'a>) -> Option<&'v ListData<'a>> {
            match v {
                Value::List(l) => Some(l),
                Value::Shared(h) => match &arena[*h as usize] {
                    Value::List(l) => Some(l),
                    _ => None,
                },
                _ => None,
            }
        }
        // A device's trace so far: typed once its first batch is in, empty before.
        let trace = |v| match list(&self.arena, v)? {
            ListData::Entries(e) => Some(e.as_slice()),
            ListData::Values(s) if s.items.is_empty() => Some(&[][..]),
            _ => None,
        };
        let list = |v| list(&self.arena, v);
        let mut segments = None;
        let mut traces = Vec::new();
        let Some(&base) = self.marks.first() else {
            return (segments, traces);
        };
        let items = &self.stack[base.min(self.stack.len())..];
        let mut i = 0;
        while let (Some(Value::Str(key)), Some(value)) = (items.get(i), items.get(i + 1)) {
            match *key {
                "segments" => {
                    // Complete once the next key follows it.
                    if let (Some(ListData::Segments(v)), Some(Value::Str(_))) =
                        (list(value), items.get(i + 2))
                    {
                        segments = Some(v.as_slice());
                    }
                }
                "device_traces" => {
                    if let Some(ListData::Values(outer)) = list(value) {
                        traces.extend(outer.items.iter().map_while(trace));
                    }
                    traces.extend(items[i + 2..].iter().map_while(trace));
                    break;
                }
                _ => {}
            }
            i += 2;
        }
        (segments, traces)
    }

    /// The memo slot BINGET `idx` reads. Checked apart from `memo_value`: a value returned
    /// inside a `Result` goes through memory and stalls on store forwarding every BINGET.
    #[inline(always)]
    fn memo_slot(&self, idx: u32) -> Result<usize, ReadError> {
        memo_get_check(self.memo_len, idx, self.at)?;
        self.refs
            .slot(idx)
            .ok_or_else(|| malformed(self.at, "memo slot was not seen by the pre-scan"))
    }

    #[inline(always)]
    fn memo_value(&self, slot: usize) -> Value<'a> {
        match self.memo[slot] {
            // Converted shared records are pushed by value: no lookup later.
            Memo::Shared(h) => match &self.arena[h as usize] {
                Value::Frame(f) => Value::Frame(*f),
                Value::Stack(s) => Value::Stack(*s),
                _ => Value::Shared(h),
            },
            m => m.value(),
        }
    }

    /// The frame a memo index holds once converted; anything else (including an index
    /// out of range) is `None` and left to the generic BINGET.
    #[inline]
    fn memo_frame(&self, idx: u32) -> Option<FrameId> {
        if idx >= self.memo_len {
            return None;
        }
        let f = *self.memo_frames.get(self.refs.slot(idx)?)?;
        (f != NO_FRAME).then_some(f)
    }

    fn set_memo(&mut self, slot: usize, m: Memo<'a>) {
        self.memo[slot] = m;
        self.memo_frames[slot] = match m {
            Memo::Frame(f) => f,
            _ => NO_FRAME,
        };
    }

    /// Fast path for the bulk of a snapshot, a trace entry at `EMPTY_DICT`: read straight
    /// from the bytes into the `Value::Entry` the generic path would build at its
    /// SETITEMS, with the same memo puts. Anything unusual (a key or value form it does
    /// not know, a dict or list read back later, a FRAME opcode inside) leaves everything
    /// as it was and returns false, for the generic path to decode.
    fn fast_entry(&mut self) -> bool {
        let mut ids = std::mem::take(&mut self.frame_scratch);
        ids.clear();
        let mut p = FastEntry {
            vm: self,
            data: self.cur.data,
            pos: self.cur.pos,
            memo_len: self.memo_len,
            puts: [(0, ""); 4],
            nputs: 0,
        };
        let done = match p.entry(&mut ids) {
            Some((mut entry, frames)) => {
                let (pos, memo_len, puts) = (p.pos, p.memo_len, p.puts[..p.nputs].to_vec());
                let stack = match frames {
                    FastFrames::Stack(s) => Some(s),
                    FastFrames::Ids => self.stacks.intern(&mut ids),
                };
                match stack {
                    Some(s) => {
                        entry.frames = s;
                        for (slot, text) in puts {
                            self.set_memo(slot, Memo::Str(text));
                        }
                        self.memo_len = memo_len;
                        self.cur.pos = pos;
                        self.stack.push(Value::Entry(Box::new(entry)));
                        true
                    }
                    None => false,
                }
            }
            None => false,
        };
        ids.clear();
        self.frame_scratch = ids;
        done
    }

    /// Fast path for the bulk of a snapshot, a stack written as `MARK BINGET... APPENDS`
    /// of already-seen frame dicts: collect frame ids straight from the bytes into the
    /// list, skipping the value stack. Anything else stops the run; what was collected
    /// is then pushed as ordinary values and decoding goes on as usual.
    fn frame_run(&mut self) -> Result<(), ReadError> {
        let mut ids = std::mem::take(&mut self.frame_scratch);
        let data = self.cur.data;
        self.cur.pos = self.frame_refs(self.cur.pos, &mut ids);
        let closes = !ids.is_empty() && data.get(self.cur.pos) == Some(&op::APPENDS);
        match self.frame_list_below_mark().filter(|_| closes) {
            Some(list) => {
                match list {
                    ListData::Frames(v) => v.extend_from_slice(&ids),
                    list => *list = ListData::Frames(ids.clone()),
                }
                self.at = self.cur.pos;
                self.cur.pos += 1;
                self.marks.pop();
            }
            None => self.stack.extend(ids.iter().map(|&f| Value::Frame(f))),
        }
        ids.clear();
        self.frame_scratch = ids;
        Ok(())
    }

    /// A frame dict seen before, read back at `at`: its id and the BINGET's length.
    #[inline]
    fn frame_at(&self, at: usize) -> Option<(FrameId, usize)> {
        let (idx, len) = memo_ref(self.cur.data.get(at..)?)?;
        Some((self.memo_frame(idx)?, len))
    }

    /// The frames read back by the BINGETs from `at` on, onto `ids`; where they end.
    fn frame_refs(&self, mut at: usize, ids: &mut Vec<FrameId>) -> usize {
        while let Some((f, len)) = self.frame_at(at) {
            ids.push(f);
            at += len;
        }
        at
    }

    /// Put a shared container back in its arena slot; once it is a frame or a stack,
    /// its memo slot holds the id itself, saving BINGET a lookup.
    fn settle(&mut self, h: u32, v: Value<'a>) {
        if let Value::Frame(_) | Value::Stack(_) = v {
            if let Some(copy) = v.cheap_copy() {
                self.set_memo(self.arena_memo[h as usize], copy);
            }
        }
        self.arena[h as usize] = v;
    }

    /// The list the innermost MARK's APPENDS would extend, if it is a frame list or
    /// still empty (owned on the stack or shared in the arena).
    fn frame_list_below_mark(&mut self) -> Option<&mut ListData<'a>> {
        let mark = *self.marks.last()?;
        let floor = self.marks.len().checked_sub(2).map_or(0, |i| self.marks[i]);
        if mark <= floor || self.stack.len() != mark {
            return None;
        }
        let slot = match self.stack[mark - 1] {
            Value::Shared(h) => &mut self.arena[h as usize],
            _ => &mut self.stack[mark - 1],
        };
        match slot {
            Value::List(list) => match list {
                ListData::Frames(_) => Some(list),
                ListData::Values(s) if s.items.is_empty() => Some(list),
                _ => None,
            },
            _ => None,
        }
    }

    /// Move the values from stack index `from` up into the container just below them
    /// (resolving a shared handle to its arena slot). The values pass through a reused
    /// scratch buffer: no allocation per dict or list.
    fn add_to_container(
        &mut self,
        from: usize,
        add: fn(&mut Self, &mut Value<'a>, &mut Vec<Value<'a>>) -> Result<(), ReadError>,
    ) -> Result<(), ReadError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if from == 0 || from - 1 < floor || from > self.stack.len() {
            return Err(malformed(
                self.at,
                "no container on the stack to add items to",
            ));
        }
        let mut items = std::mem::take(&mut self.scratch);
        items.extend(self.stack.drain(from..));
        let i = from - 1;
        let (mut target, shared) = match self.stack[i] {
            Value::Shared(h) => (
                std::mem::replace(&mut self.arena[h as usize], Value::Taken),
                Some(h),
            ),
            _ => (std::mem::take(&mut self.stack[i]), None),
        };
        let r = add(self, &mut target, &mut items);
        match shared {
            Some(h) => self.settle(h, target),
            None => self.stack[i] = target,
        }
        items.clear();
        self.scratch = items;
        r
    }

    fn put(&mut self, idx: u32) -> Result<(), ReadError> {
        memo_put(&mut self.memo_len, idx, self.at)?;
        let Some(slot) = self.refs.slot(idx) else {
            return Ok(()); // never read back: nothing to keep
        };
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(malformed(self.at, "memoize with no value on the stack"));
        }
        let Some(top) = self.stack.last_mut() else {
            return Err(malformed(self.at, "memoize with no value on the stack"));
        };
        let v = match top.cheap_copy() {
            Some(v) => v,
            None => {
                // A container read back later is shared: both the stack and the memo
                // refer to one arena slot, so later SETITEMS/APPENDS reach both.
                let h = u32::try_from(self.arena.len())
                    .map_err(|_| malformed(self.at, "too many shared containers"))?;
                self.arena.push(std::mem::replace(top, Value::Shared(h)));
                self.arena_memo.push(slot);
                Memo::Shared(h)
            }
        };
        self.set_memo(slot, v);
        Ok(())
    }

    fn append_items(
        &mut self,
        target: &mut Value<'a>,
        items: &mut Vec<Value<'a>>,
    ) -> Result<(), ReadError> {
        match target {
            Value::List(list) => self.extend_list(list, items),
            other => Err(malformed(
                self.at,
                format!("APPEND(S) target is {}, expected a list", other.kind()),
            )),
        }
    }

    fn set_items(
        &mut self,
        d: &mut Value<'a>,
        pairs: &mut Vec<Value<'a>>,
    ) -> Result<(), ReadError> {
        if !pairs.len().is_multiple_of(2) {
            return Err(malformed(
                self.at,
                "SETITEMS with an odd number of keys and values",
            ));
        }
        let Value::Dict(seq) = d else {
            return Err(malformed(
                self.at,
                format!(
                    "SETITEM(S) target is {}, expected a dict that is still being built",
                    d.kind()
                ),
            ));
        };
        if seq.items.is_empty() {
            if let Some(kind) = classify(pairs, &self.keys) {
                *d = self.convert(kind, pairs)?;
                return Ok(());
            }
        }
        let depth = pairs.iter().map(Value::depth).max().unwrap_or(0);
        seq.depth = seq.depth.max(depth);
        check_depth(seq.depth + 1, self.at)?;
        seq.items.append(pairs);
        Ok(())
    }

    /// Resolve an item entering a list: shared converted frames by value, generic
    /// record dicts converted.
    fn list_item(&mut self, item: Value<'a>) -> Result<Value<'a>, ReadError> {
        match item {
            Value::Shared(h) => Ok(match &self.arena[h as usize] {
                Value::Frame(f) => Value::Frame(*f),
                _ => Value::Shared(h),
            }),
            Value::Dict(mut seq) => match classify(&seq.items, &self.keys) {
                Some(kind) => self.convert(kind, &mut seq.items),
                None => Ok(Value::Dict(seq)),
            },
            v => Ok(v),
        }
    }

    fn extend_list(
        &mut self,
        list: &mut ListData<'a>,
        items: &mut Vec<Value<'a>>,
    ) -> Result<(), ReadError> {
        let n = items.len();
        for item in items.drain(..) {
            let item = self.list_item(item)?;
            if let ListData::Values(seq) = list {
                if seq.items.is_empty() {
                    // The first element picks the typed representation.
                    match &item {
                        Value::Frame(_) => *list = ListData::Frames(Vec::with_capacity(n)),
                        Value::Entry(_) => *list = ListData::Entries(Vec::with_capacity(n)),
                        Value::Block(_) => *list = ListData::Blocks(Vec::with_capacity(n)),
                        Value::Segment(_) => *list = ListData::Segments(Vec::with_capacity(n)),
                        Value::Annotation(_) => {
                            *list = ListData::Annotations(Vec::with_capacity(n))
                        }
                        _ => {}
                    }
                }
            }
            match (&mut *list, item) {
                (ListData::Frames(v), Value::Frame(f)) => v.push(f),
                (ListData::Entries(v), Value::Entry(e)) => v.push(*e),
                (ListData::Blocks(v), Value::Block(b)) => v.push(*b),
                (ListData::Segments(v), Value::Segment(s)) => v.push(*s),
                (ListData::Annotations(v), Value::Annotation(a)) => v.push(*a),
                (ListData::Values(seq), item) => {
                    seq.depth = seq.depth.max(item.depth());
                    check_depth(seq.depth + 1, self.at)?;
                    seq.items.push(item);
                }
                (typed, item) => {
                    // Mixed element kinds: fall back to generic values.
                    let mut seq = Seq {
                        items: untype(std::mem::replace(typed, ListData::Frames(Vec::new()))),
                        depth: 1,
                    };
                    seq.items.push(item);
                    seq.depth = seq.items.iter().map(Value::depth).max().unwrap_or(0);
                    *typed = ListData::Values(seq);
                }
            }
        }
        Ok(())
    }

    fn convert(&mut self, kind: Kind, pairs: &mut [Value<'a>]) -> Result<Value<'a>, ReadError> {
        match kind {
            Kind::Frame => self.frame_from(pairs).map(Value::Frame),
            Kind::Entry => self.entry_from(pairs).map(|e| Value::Entry(Box::new(e))),
            Kind::Block => self.block_from(pairs).map(|b| Value::Block(Box::new(b))),
            Kind::Segment => self
                .segment_from(pairs)
                .map(|s| Value::Segment(Box::new(s))),
            Kind::Annotation => self
                .annotation_from(pairs)
                .map(|a| Value::Annotation(Box::new(a))),
        }
    }

    fn frame_from(&mut self, pairs: &mut [Value<'a>]) -> Result<FrameId, ReadError> {
        let (mut name, mut filename, mut line) = (None, None, None);
        for kv in pairs.chunks_exact_mut(2) {
            let Value::Str(k) = kv[0] else { continue };
            match self.keys.get(k) {
                Key::Name => name = Some(self.str_field("frame", k, &kv[1])?),
                Key::Filename => filename = Some(self.str_field("frame", k, &kv[1])?),
                Key::Line => line = Some(self.i64_field("frame", k, &kv[1])?),
                _ => {}
            }
        }
        let (Some(name), Some(filename), Some(line)) = (name, filename, line) else {
            return Err(self.schema("frame", "needs `name`, `filename` and `line`".into()));
        };
        self.intern_frame(name, filename, line)
    }

    fn intern_frame(
        &mut self,
        name: &'a str,
        filename: &'a str,
        line: i64,
    ) -> Result<FrameId, ReadError> {
        if let Some(&id) = self.frame_ids.get(&(name, filename, line)) {
            return Ok(id);
        }
        let id = FrameId::try_from(self.frames.len())
            .ok()
            .filter(|&id| id != NO_FRAME)
            .ok_or_else(|| malformed(self.at, "too many frames"))?;
        self.frames.push(Frame {
            name: name.to_owned(),
            filename: filename.to_owned(),
            line,
        });
        self.frame_ids.insert((name, filename, line), id);
        Ok(id)
    }

    fn intern_stack(&mut self, mut ids: Vec<FrameId>) -> Result<StackId, ReadError> {
        self.stacks
            .intern(&mut ids)
            .ok_or_else(|| malformed(self.at, "too many stacks"))
    }

    /// A `frames` value as an interned stack.
    fn stack_field(&mut self, what: &str, v: &mut Value<'a>) -> Result<StackId, ReadError> {
        match std::mem::take(v) {
            Value::Stack(id) => Ok(id),
            Value::None => self.intern_stack(Vec::new()),
            Value::List(ListData::Frames(ids)) => self.intern_stack(ids),
            Value::List(ListData::Values(seq)) => {
                let mut ids = Vec::with_capacity(seq.items.len());
                for item in seq.items {
                    ids.push(self.frame_item(what, item)?);
                }
                self.intern_stack(ids)
            }
            Value::Shared(h) => {
                let slot = std::mem::replace(&mut self.arena[h as usize], Value::Taken);
                let mut inner = match slot {
                    Value::Taken => {
                        return Err(self.schema(what, "`frames` refers to itself".into()))
                    }
                    Value::Shared(_) => {
                        return Err(self.schema(what, "`frames` is a nested reference".into()))
                    }
                    other => other,
                };
                let r = self.stack_field(what, &mut inner);
                // Keep the converted stack so each later BINGET of this list is free.
                let settled = match r {
                    Ok(id) => Value::Stack(id),
                    Err(_) => inner,
                };
                self.settle(h, settled);
                r
            }
            other => Err(self.schema(
                what,
                format!("`frames` is {}, expected a list", other.kind()),
            )),
        }
    }

    fn frame_item(&mut self, what: &str, item: Value<'a>) -> Result<FrameId, ReadError> {
        match item {
            Value::Frame(f) => Ok(f),
            Value::Dict(mut seq) => self.frame_from(&mut seq.items),
            Value::Shared(h) => {
                match std::mem::replace(&mut self.arena[h as usize], Value::Taken) {
                    Value::Dict(mut seq) => {
                        let id = self.frame_from(&mut seq.items)?;
                        self.settle(h, Value::Frame(id));
                        Ok(id)
                    }
                    Value::Frame(f) => {
                        self.arena[h as usize] = Value::Frame(f);
                        Ok(f)
                    }
                    other => Err(self.schema(
                        what,
                        format!("a frame is {}, expected a dict", other.kind()),
                    )),
                }
            }
            other => Err(self.schema(
                what,
                format!("a frame is {}, expected a dict", other.kind()),
            )),
        }
    }

    fn str_field(&self, what: &str, key: &str, v: &Value<'a>) -> Result<&'a str, ReadError> {
        match v {
            Value::Str(s) => Ok(s),
            other => Err(self.schema(
                what,
                format!("`{key}` is {}, expected a string", other.kind()),
            )),
        }
    }

    fn opt_string(
        &self,
        what: &str,
        key: &str,
        v: &Value<'a>,
    ) -> Result<Option<String>, ReadError> {
        match v {
            Value::None => Ok(None),
            v => self.str_field(what, key, v).map(|s| Some(s.to_owned())),
        }
    }

    fn i64_field(&self, what: &str, key: &str, v: &Value<'a>) -> Result<i64, ReadError> {
        match v {
            Value::Int(i) => Ok(*i),
            Value::Bool(b) => Ok(*b as i64),
            Value::UInt(u) => Err(self.schema(
                what,
                format!("`{key}` = {u} does not fit a signed 64-bit integer"),
            )),
            other => Err(self.schema(
                what,
                format!("`{key}` is {}, expected an integer", other.kind()),
            )),
        }
    }

    fn u64_field(&self, what: &str, key: &str, v: &Value<'a>) -> Result<u64, ReadError> {
        match v {
            Value::Int(i) if *i >= 0 => Ok(*i as u64),
            Value::UInt(u) => Ok(*u),
            Value::Int(i) => Err(self.schema(what, format!("`{key}` is negative ({i})"))),
            other => Err(self.schema(
                what,
                format!("`{key}` is {}, expected an integer", other.kind()),
            )),
        }
    }

    fn bool_field(&self, what: &str, key: &str, v: &Value<'a>) -> Result<bool, ReadError> {
        match v {
            Value::Bool(b) => Ok(*b),
            Value::Int(i @ (0 | 1)) => Ok(*i == 1),
            other => Err(self.schema(
                what,
                format!("`{key}` is {}, expected a bool", other.kind()),
            )),
        }
    }

    fn required<T>(&self, what: &str, key: &str, v: Option<T>) -> Result<T, ReadError> {
        v.ok_or_else(|| self.schema(what, format!("no `{key}`")))
    }

    fn entry_from(&mut self, pairs: &mut [Value<'a>]) -> Result<TraceEntry, ReadError> {
        const W: &str = "trace entry";
        let (mut action, mut addr, mut size, mut stream, mut time_us, mut frames) =
            (None, None, None, 0, 0, None);
        let (mut category, mut compile_context, mut user_metadata) = (None, None, None);
        for kv in pairs.chunks_exact_mut(2) {
            let Value::Str(k) = kv[0] else { continue };
            let v = &mut kv[1];
            match self.keys.get(k) {
                Key::Action => {
                    let s = self.str_field(W, k, v)?;
                    action = Some(
                        action_of(s)
                            .ok_or_else(|| self.schema(W, format!("unknown action `{s}`")))?,
                    );
                }
                Key::Addr | Key::DeviceFree => addr = Some(self.u64_field(W, k, v)?),
                Key::Size => size = Some(self.u64_field(W, k, v)?),
                Key::Stream => stream = self.i64_field(W, k, v)?,
                Key::TimeUs => time_us = self.i64_field(W, k, v)?,
                Key::Frames => frames = Some(self.stack_field(W, v)?),
                Key::Category => category = self.opt_string(W, k, v)?,
                Key::CompileContext => compile_context = self.opt_string(W, k, v)?,
                Key::UserMetadata => user_metadata = self.opt_string(W, k, v)?,
                _ => {}
            }
        }
        let frames = match frames {
            Some(f) => f,
            None => self.intern_stack(Vec::new())?,
        };
        Ok(TraceEntry {
            action: self.required(W, "action", action)?,
            addr: self.required(W, "addr", addr)?,
            size: self.required(W, "size", size)?,
            stream,
            time_us,
            frames,
            category,
            compile_context,
            user_metadata,
        })
    }

    fn block_from(&mut self, pairs: &mut [Value<'a>]) -> Result<Block, ReadError> {
        const W: &str = "block";
        let (mut address, mut size, mut requested, mut state, mut frames) =
            (None, None, None, None, None);
        for kv in pairs.chunks_exact_mut(2) {
            let Value::Str(k) = kv[0] else { continue };
            let v = &mut kv[1];
            match self.keys.get(k) {
                Key::Address => address = Some(self.u64_field(W, k, v)?),
                Key::Size => size = Some(self.u64_field(W, k, v)?),
                Key::RequestedSize => requested = Some(self.u64_field(W, k, v)?),
                Key::State => {
                    let s = self.str_field(W, k, v)?;
                    state = Some(
                        BlockState::parse(s)
                            .ok_or_else(|| self.schema(W, format!("unknown state `{s}`")))?,
                    );
                }
                Key::Frames => frames = Some(self.stack_field(W, v)?),
                _ => {}
            }
        }
        let size = self.required(W, "size", size)?;
        let frames = match frames {
            Some(f) => f,
            None => self.intern_stack(Vec::new())?,
        };
        Ok(Block {
            address: self.required(W, "address", address)?,
            size,
            requested_size: requested.unwrap_or(size),
            state: self.required(W, "state", state)?,
            frames,
        })
    }

    fn segment_from(&mut self, pairs: &mut [Value<'a>]) -> Result<Segment, ReadError> {
        const W: &str = "segment";
        let mut seg = Segment {
            device: 0,
            address: 0,
            total_size: 0,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: 0,
            segment_type: SegmentType::Large,
            segment_pool_id: (0, 0),
            is_expandable: false,
            frames: 0,
            blocks: Vec::new(),
        };
        let (mut address, mut total, mut seg_type, mut frames) = (None, None, None, None);
        for kv in pairs.chunks_exact_mut(2) {
            let Value::Str(k) = kv[0] else { continue };
            let v = &mut kv[1];
            match self.keys.get(k) {
                Key::Device => seg.device = self.i64_field(W, k, v)?,
                Key::Address => address = Some(self.u64_field(W, k, v)?),
                Key::TotalSize => total = Some(self.u64_field(W, k, v)?),
                Key::AllocatedSize => seg.allocated_size = self.u64_field(W, k, v)?,
                Key::ActiveSize => seg.active_size = self.u64_field(W, k, v)?,
                Key::RequestedSize => seg.requested_size = self.u64_field(W, k, v)?,
                Key::Stream => seg.stream = self.i64_field(W, k, v)?,
                Key::SegmentType => {
                    seg_type = Some(match self.str_field(W, k, v)? {
                        "large" => SegmentType::Large,
                        "small" => SegmentType::Small,
                        s => return Err(self.schema(W, format!("unknown segment_type `{s}`"))),
                    })
                }
                Key::SegmentPoolId => seg.segment_pool_id = self.pool_id(v)?,
                Key::IsExpandable => seg.is_expandable = self.bool_field(W, k, v)?,
                Key::Frames => frames = Some(self.stack_field(W, v)?),
                Key::Blocks => seg.blocks = self.records(k, std::mem::take(v))?,
                _ => {}
            }
        }
        seg.address = self.required(W, "address", address)?;
        seg.total_size = self.required(W, "total_size", total)?;
        seg.segment_type = self.required(W, "segment_type", seg_type)?;
        seg.frames = match frames {
            Some(f) => f,
            None => self.intern_stack(Vec::new())?,
        };
        Ok(seg)
    }

    fn pool_id(&self, v: &Value<'a>) -> Result<(i64, i64), ReadError> {
        const W: &str = "segment";
        let v = match v {
            Value::Shared(h) => &self.arena[*h as usize],
            v => v,
        };
        match v {
            Value::Tuple(s) | Value::List(ListData::Values(s)) if s.items.len() == 2 => Ok((
                self.i64_field(W, "segment_pool_id", &s.items[0])?,
                self.i64_field(W, "segment_pool_id", &s.items[1])?,
            )),
            other => Err(self.schema(
                W,
                format!(
                    "`segment_pool_id` is {}, expected a pair of integers",
                    other.kind()
                ),
            )),
        }
    }

    fn annotation_from(&mut self, pairs: &mut [Value<'a>]) -> Result<Annotation, ReadError> {
        const W: &str = "annotation";
        let (mut name, mut stage, mut device, mut time_us) = (None, None, 0, None);
        for kv in pairs.chunks_exact_mut(2) {
            let Value::Str(k) = kv[0] else { continue };
            let v = &kv[1];
            match self.keys.get(k) {
                Key::Name => name = Some(self.str_field(W, k, v)?.to_owned()),
                Key::Stage => {
                    stage = Some(match self.str_field(W, k, v)? {
                        "START" => AnnotationStage::Start,
                        "END" => AnnotationStage::End,
                        s => return Err(self.schema(W, format!("unknown stage `{s}`"))),
                    })
                }
                Key::Device => device = self.i64_field(W, k, v)?,
                Key::TimeUs => time_us = Some(self.i64_field(W, k, v)?),
                _ => {}
            }
        }
        Ok(Annotation {
            name: self.required(W, "name", name)?,
            stage: self.required(W, "stage", stage)?,
            device,
            time_us: self.required(W, "time_us", time_us)?,
        })
    }

    /// A list of records of one kind, whatever representation it ended up in.
    fn records<T: Record<'a>>(&mut self, key: &str, v: Value<'a>) -> Result<Vec<T>, ReadError> {
        let items = match self.resolve(v) {
            Value::List(list) => match T::take_typed(list) {
                Ok(done) => return Ok(done),
                Err(ListData::Values(seq)) => seq.items,
                Err(other) => untype(other),
            },
            other => {
                return Err(self.schema(
                    "snapshot",
                    format!("`{key}` is {}, expected a list", other.kind()),
                ))
            }
        };
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let item = self.resolve(item);
            let kind = item.kind();
            match T::from_value(self, item) {
                Some(r) => out.push(r?),
                None => {
                    return Err(self.schema("snapshot", format!("an element of `{key}` is {kind}")))
                }
            }
        }
        Ok(out)
    }

    /// A shared container taken out of the arena (using it twice is refused: copying
    /// could multiply memory), anything else as is.
    fn resolve(&mut self, v: Value<'a>) -> Value<'a> {
        match v {
            Value::Shared(h) => match &self.arena[h as usize] {
                Value::Frame(f) => Value::Frame(*f),
                Value::Stack(s) => Value::Stack(*s),
                _ => std::mem::replace(&mut self.arena[h as usize], Value::Taken),
            },
            v => v,
        }
    }

    fn into_snapshot(mut self, top: Value<'a>) -> Result<Snapshot, ReadError> {
        let Value::Dict(mut seq) = self.resolve(top) else {
            return Err(ReadError::Schema {
                detail: "top-level value is not a dict".into(),
            });
        };
        let mut snap = Snapshot::default();
        let mut have_segments = false;
        for kv in seq.items.chunks_exact_mut(2) {
            let Value::Str(k) = kv[0] else { continue };
            let v = std::mem::take(&mut kv[1]);
            match k {
                "segments" => {
                    snap.segments = self.records(k, v)?;
                    have_segments = true;
                }
                "device_traces" => {
                    let per_device: Vec<Value<'a>> = self.records(k, v)?;
                    snap.device_traces = Vec::with_capacity(per_device.len());
                    for dev in per_device {
                        snap.device_traces
                            .push(self.records("device_traces[i]", dev)?);
                    }
                }
                "external_annotations" => snap.external_annotations = self.records(k, v)?,
                "allocator_settings" => {
                    snap.allocator_settings = match self.setting_value(v, 0)? {
                        Some(SettingValue::None) => None,
                        Some(SettingValue::Dict(entries)) => Some(AllocatorSettings { entries }),
                        _ => {
                            return Err(ReadError::Schema {
                                detail: "`allocator_settings` is not a dict".into(),
                            })
                        }
                    }
                }
                _ => {}
            }
        }
        if !have_segments {
            return Err(ReadError::Schema {
                detail: "top-level dict has no `segments`".into(),
            });
        }
        snap.frames = self.frames;
        snap.stacks = self.stacks.stacks;
        Ok(snap)
    }

    /// A settings value; `None` for shapes `SettingValue` cannot hold (ignored like
    /// unknown keys elsewhere).
    fn setting_value(
        &mut self,
        v: Value<'a>,
        depth: u32,
    ) -> Result<Option<SettingValue>, ReadError> {
        check_depth(depth, self.at)?;
        Ok(Some(match self.resolve(v) {
            Value::None => SettingValue::None,
            Value::Bool(b) => SettingValue::Bool(b),
            Value::Int(i) => SettingValue::Int(i),
            Value::Float(f) => SettingValue::Float(f),
            Value::Str(s) => SettingValue::Str(s.to_owned()),
            Value::Dict(seq) => {
                let mut entries: Vec<(String, SettingValue)> = Vec::new();
                let mut it = seq.items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    let Value::Str(k) = k else { continue };
                    if let Some(v) = self.setting_value(v, depth + 1)? {
                        match entries.iter_mut().find(|(e, _)| e == k) {
                            Some(slot) => slot.1 = v,
                            None => entries.push((k.to_owned(), v)),
                        }
                    }
                }
                SettingValue::Dict(entries)
            }
            _ => return Ok(None),
        }))
    }
}

/// A record type a snapshot list holds.
trait Record<'a>: Sized {
    /// The list's elements when it is already stored as this type.
    fn take_typed(list: ListData<'a>) -> Result<Vec<Self>, ListData<'a>>;
    /// One element; `None` when it is not this kind of record.
    fn from_value(vm: &mut Vm<'a>, v: Value<'a>) -> Option<Result<Self, ReadError>>;
}

/// Implements `Record` for a typed record: its `ListData` variant, `Value` variant,
/// `Kind` and conversion from dict pairs.
macro_rules! record {
    ($t:ty, $list:ident, $val:ident, $kind:ident, $from:ident) => {
        impl<'a> Record<'a> for $t {
            fn take_typed(list: ListData<'a>) -> Result<Vec<Self>, ListData<'a>> {
                match list {
                    ListData::$list(v) => Ok(v),
                    ListData::Values(s) if s.items.is_empty() => Ok(Vec::new()),
                    other => Err(other),
                }
            }
            fn from_value(vm: &mut Vm<'a>, v: Value<'a>) -> Option<Result<Self, ReadError>> {
                match v {
                    Value::$val(x) => Some(Ok(*x)),
                    Value::Dict(mut s) if classify(&s.items, &vm.keys) == Some(Kind::$kind) => {
                        Some(vm.$from(&mut s.items))
                    }
                    _ => None,
                }
            }
        }
    };
}

record!(TraceEntry, Entries, Entry, Entry, entry_from);
record!(Block, Blocks, Block, Block, block_from);
record!(Segment, Segments, Segment, Segment, segment_from);
record!(
    Annotation,
    Annotations,
    Annotation,
    Annotation,
    annotation_from
);

/// Generic elements (the per-device lists of `device_traces`).
impl<'a> Record<'a> for Value<'a> {
    fn take_typed(list: ListData<'a>) -> Result<Vec<Self>, ListData<'a>> {
        Err(list)
    }
    fn from_value(_vm: &mut Vm<'a>, v: Value<'a>) -> Option<Result<Self, ReadError>> {
        Some(Ok(v))
    }
}

/// A typed list back to generic values (only for lists mixing element kinds).
fn untype(list: ListData<'_>) -> Vec<Value<'_>> {
    match list {
        ListData::Values(s) => s.items,
        ListData::Frames(v) => v.into_iter().map(Value::Frame).collect(),
        ListData::Entries(v) => v.into_iter().map(|e| Value::Entry(Box::new(e))).collect(),
        ListData::Blocks(v) => v.into_iter().map(|b| Value::Block(Box::new(b))).collect(),
        ListData::Segments(v) => v.into_iter().map(|s| Value::Segment(Box::new(s))).collect(),
        ListData::Annotations(v) => v
            .into_iter()
            .map(|a| Value::Annotation(Box::new(a)))
            .collect(),
    }
}

/// Renumber stacks and frames in traversal order (segments with their blocks, then
/// traces), dropping unused ones. The result depends only on the data, not on the order
/// records happened to complete in the file, so `read(write(s)) == s` holds.
fn canonicalize_tables(snap: &mut Snapshot) {
    const UNSEEN: u32 = u32::MAX;
    let mut stack_map = vec![UNSEEN; snap.stacks.len()];
    let mut order: Vec<StackId> = Vec::new();
    let mut visit = |id: &mut StackId| {
        let slot = &mut stack_map[*id as usize];
        if *slot == UNSEEN {
            *slot = order.len() as StackId;
            order.push(*id);
        }
        *id = *slot;
    };
    for seg in &mut snap.segments {
        visit(&mut seg.frames);
        for b in &mut seg.blocks {
            visit(&mut b.frames);
        }
    }
    for e in snap.device_traces.iter_mut().flatten() {
        visit(&mut e.frames);
    }
    let mut old_stacks = std::mem::take(&mut snap.stacks);
    let mut old_frames = std::mem::take(&mut snap.frames);
    let mut frame_map = vec![UNSEEN; old_frames.len()];
    for old in order {
        let mut st = std::mem::take(&mut old_stacks[old as usize]);
        for f in &mut st {
            let slot = &mut frame_map[*f as usize];
            if *slot == UNSEEN {
                *slot = snap.frames.len() as FrameId;
                let of = &mut old_frames[*f as usize];
                snap.frames.push(Frame {
                    name: std::mem::take(&mut of.name),
                    filename: std::mem::take(&mut of.filename),
                    line: of.line,
                });
            }
            *f = *slot;
        }
        snap.stacks.push(st);
    }
}

#[cfg(unix)]
mod mapped {
    use std::fs::File;
    use std::io;
    use std::os::fd::AsRawFd;

    /// A read-only private mapping of a whole regular file.
    pub struct Mapped {
        ptr: *mut libc::c_void,
        len: usize,
        page: usize,
    }

    impl Mapped {
        /// `None` when the file cannot be mapped (empty, not a regular file): the caller
        /// reads it instead.
        pub fn open(file: &File) -> io::Result<Option<Mapped>> {
            let meta = file.metadata()?;
            let Ok(len) = usize::try_from(meta.len()) else {
                return Ok(None);
            };
            if len == 0 || !meta.is_file() {
                return Ok(None);
            }
            // SAFETY: a fresh PROT_READ, MAP_PRIVATE mapping; we never write through it.
            // Snapshot files are written once and renamed into place; truncating one
            // while it is being read would fault, as with any mapped file.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE,
                    file.as_raw_fd(),
                    0,
                )
            };
            if ptr == libc::MAP_FAILED {
                return Ok(None);
            }
            // SAFETY: advice on the range just mapped.
            unsafe { libc::madvise(ptr, len, libc::MADV_SEQUENTIAL) };
            // SAFETY: sysconf has no preconditions.
            let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
                .unwrap_or(4096)
                .max(1);
            Ok(Some(Mapped { ptr, len, page }))
        }

        pub fn bytes(&self) -> &[u8] {
            // SAFETY: the mapping is `len` readable bytes and lives as long as `self`.
            unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
        }

        /// Drop the resident pages before `upto`. The mapping stays valid: a page read
        /// again faults back in from the (unchanged) file.
        pub fn release(&self, upto: usize) {
            let end = upto.min(self.len) / self.page * self.page;
            if end > 0 {
                // SAFETY: a page-aligned prefix of our own private read-only mapping.
                unsafe { libc::madvise(self.ptr, end, libc::MADV_DONTNEED) };
            }
        }
    }

    impl Drop for Mapped {
        fn drop(&mut self) {
            // SAFETY: unmapping exactly what `open` mapped; `bytes()` borrows end before.
            unsafe { libc::munmap(self.ptr, self.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int_of(b: &[u8]) -> Option<(bool, i128)> {
        match long_value(b)? {
            Op::Int(i) => Some((true, i as i128)),
            Op::UInt(u) => Some((false, u as i128)),
            _ => None,
        }
    }

    #[test]
    fn long_integers_decode_like_python() {
        assert_eq!(int_of(&[]), Some((true, 0)));
        assert_eq!(int_of(&[0xff]), Some((true, -1)));
        assert_eq!(int_of(&[0x00, 0x80]), Some((true, -32768)));
        assert_eq!(int_of(&[0x00, 0x80, 0x00]), Some((true, 32768)));
        assert_eq!(
            int_of(&[0, 0, 0, 0, 0, 0, 0, 0x80]),
            Some((true, i64::MIN as i128))
        );
        // 2**63 and 2**64-1 need a ninth zero byte and come back unsigned.
        assert_eq!(
            int_of(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0]),
            Some((false, 1i128 << 63))
        );
        assert_eq!(
            int_of(&[0xff; 8].iter().chain(&[0]).copied().collect::<Vec<_>>()),
            Some((false, u64::MAX as i128))
        );
        // Padding that only repeats the sign is accepted; real magnitude past 64 bits is not.
        assert_eq!(int_of(&[5, 0, 0, 0, 0, 0, 0, 0, 0, 0]), Some((true, 5)));
        assert_eq!(
            int_of(&[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
            Some((true, -2))
        );
        assert_eq!(int_of(&[0, 0, 0, 0, 0, 0, 0, 0, 1]), None);
        assert_eq!(int_of(&[0, 0, 0, 0, 0, 0, 0, 0x7f, 0xff]), None);
    }

    #[test]
    fn memo_slots_rank_only_referenced_indices() {
        // BINGET of memo 0 and 70 only: two slots, in index order.
        let mut p = vec![op::PROTO, 4];
        for _ in 0..71 {
            p.extend([op::NONE, op::MEMOIZE, op::POP]);
        }
        p.extend([op::BINGET, 70, op::BINGET, 0, op::POP, op::STOP]);
        let hooks = &mut Hooks { release: &mut |_| {}, observe: &mut |_| {} };
        let refs = prescan(&p, hooks).unwrap();
        assert_eq!(refs.count(), 2);
        assert_eq!(
            (refs.slot(0), refs.slot(70), refs.slot(1), refs.slot(5000)),
            (Some(0), Some(1), None, None)
        );
    }

    #[test]
    fn hooks_see_progress_and_do_not_change_the_result() {
        let mut p = vec![
            op::PROTO,
            4,
            op::EMPTY_DICT,
            op::MARK,
            op::SHORT_BINUNICODE,
            8,
        ];
        p.extend(b"segments");
        p.extend([op::EMPTY_LIST, op::SHORT_BINUNICODE, 3]);
        p.extend(b"pad");
        p.push(op::BINUNICODE);
        let pad = TICK + 10;
        p.extend((pad as u32).to_le_bytes());
        p.extend(std::iter::repeat_n(b'x', pad));
        p.extend([op::SETITEMS, op::STOP]);
        let mut calls = Vec::new();
        let mut passes = Vec::new();
        let snap = decode(&p, &mut |n| calls.push(n), &mut |r| passes.push((r.pass, r.done))).unwrap();
        assert_eq!(snap, read_snapshot(&p).unwrap());
        assert_eq!(calls.len(), 2, "one release per pass: {calls:?}");
        assert!(calls.iter().all(|&n| n > TICK));
        let end = (ReadPass::Decode, p.len());
        assert_eq!(passes, [(ReadPass::Check, calls[0]), (ReadPass::Decode, calls[1]), end]);
    }
}
