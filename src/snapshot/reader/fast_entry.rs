//! The fast path for the bulk of a snapshot: trace entry dicts read straight from the bytes.

use super::cursor::{long_value, Op};
use super::model::{FrameId, StackId, TraceEntry};
use super::op;
use super::prescan::memo_ref;
use super::schema::{action_of, Key};
use super::vm::{Memo, Value, Vm};

/// A trace entry's `frames` as `FastEntry` reads them: the frame ids collected, or a
/// stack already interned (a list read back by BINGET).
pub(super) enum FastFrames {
    Ids,
    Stack(StackId),
}

/// Reads one trace entry dict straight from the bytes for `Vm::fast_entry`, changing
/// nothing: the memo puts it would make are kept aside (`puts`, `memo_len`). Every
/// method returns `None` on anything it does not know.
pub(super) struct FastEntry<'v, 'a> {
    pub(super) vm: &'v Vm<'a>,
    pub(super) data: &'a [u8],
    pub(super) pos: usize,
    pub(super) memo_len: u32,
    /// Strings memoized within the entry and read back later: (memo slot, text).
    pub(super) puts: [(usize, &'a str); 4],
    pub(super) nputs: usize,
}

impl<'a> FastEntry<'_, 'a> {
    pub(super) fn byte(&self) -> Option<u8> {
        self.data.get(self.pos).copied()
    }

    pub(super) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let b = self.data.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(b)
    }

    pub(super) fn fixed<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    /// A MEMOIZE here, if any; the memo slot it fills when that is read back later.
    pub(super) fn memoize(&mut self) -> Option<Option<usize>> {
        if self.byte() != Some(op::MEMOIZE) {
            return Some(None);
        }
        let idx = self.memo_len;
        self.memo_len = idx.checked_add(1)?;
        self.pos += 1;
        Some(self.vm.refs.slot(idx))
    }

    pub(super) fn string(&mut self) -> Option<&'a str> {
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

    pub(super) fn opt_string(&mut self) -> Option<Option<String>> {
        if self.byte()? == op::NONE {
            self.pos += 1;
            return Some(None);
        }
        Some(Some(self.string()?.to_owned()))
    }

    /// An integer or bool, as `Op` holds it.
    pub(super) fn int(&mut self) -> Option<Op<'static>> {
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
    pub(super) fn unsigned(&mut self) -> Option<u64> {
        match self.int()? {
            Op::Int(i) => u64::try_from(i).ok(),
            Op::UInt(u) => Some(u),
            _ => None,
        }
    }

    /// As `Vm::i64_field` takes it.
    pub(super) fn signed(&mut self) -> Option<i64> {
        match self.int()? {
            Op::Int(i) => Some(i),
            Op::Bool(b) => Some(b as i64),
            _ => None,
        }
    }

    /// `frames`: None, a stack read back, or a new list of frames read back (as Python
    /// writes it: empty, `BINGET APPEND` for one, `MARK BINGET... APPENDS` batches).
    pub(super) fn frames(&mut self, ids: &mut Vec<FrameId>) -> Option<FastFrames> {
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
    pub(super) fn entry(&mut self, ids: &mut Vec<FrameId>) -> Option<(TraceEntry, FastFrames)> {
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

impl<'a> Vm<'a> {

    /// Fast path for the bulk of a snapshot, a trace entry at `EMPTY_DICT`: read straight
    /// from the bytes into the `Value::Entry` the generic path would build at its
    /// SETITEMS, with the same memo puts. Anything unusual (a key or value form it does
    /// not know, a dict or list read back later, a FRAME opcode inside) leaves everything
    /// as it was and returns false, for the generic path to decode.
    pub(super) fn fast_entry(&mut self) -> bool {
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
}
