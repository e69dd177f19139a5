//! Byte-level opcode decoding, shared by the pre-scan and the main pass.

use super::op;
use super::op::{object_opcode_name, unsupported_opcode_name};
use super::error::ReadError;

/// One decoded opcode; arguments borrow from the input.
pub(super) enum Op<'a> {
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
pub(super) struct Cursor<'a> {
    pub(super) data: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Cursor<'a> {
    #[inline]
    pub(super) fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], ReadError> {
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
    pub(super) fn fixed<const N: usize>(&mut self, what: &str, opname: &str) -> Result<[u8; N], ReadError> {
        let s = self.take(N, &|| format!("{N}-byte {what} for {opname}"))?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(super) fn length(&mut self, raw: u64, opname: &str) -> Result<usize, ReadError> {
        // Compared with what is left before anything is sliced, so a hostile 2 GiB
        // length costs nothing.
        usize::try_from(raw).map_err(|_| ReadError::Truncated {
            offset: self.pos,
            expected: format!("{raw} bytes of {opname} data"),
        })
    }

    /// Decode the opcode at `self.pos`; returns it with its starting offset.
    #[inline]
    pub(super) fn next(&mut self) -> Result<(usize, Op<'a>), ReadError> {
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

pub(super) fn out_of_range(offset: usize, opname: &str, n: usize) -> ReadError {
    ReadError::Malformed {
        offset,
        detail: format!("{opname} integer of {n} bytes is outside the 64-bit range"),
    }
}

/// The little-endian two's complement integer in the first `n` (1 to 8) bytes of `word`,
/// sign-extended in one step: the bytes past it are shifted out.
#[inline]
pub(super) fn sign_extended(word: [u8; 8], n: usize) -> i64 {
    let shift = 64 - 8 * n as u32;
    i64::from_le_bytes(word) << shift >> shift
}

/// Little-endian two's complement integer as i64, or u64 when it only fits unsigned.
#[inline]
pub(super) fn long_value(b: &[u8]) -> Option<Op<'static>> {
    // Up to 8 bytes (addresses, times).
    if let n @ 1..=8 = b.len() {
        let mut buf = [0u8; 8];
        buf[..n].copy_from_slice(b);
        return Some(Op::Int(sign_extended(buf, n)));
    }
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

pub(super) fn check_proto(v: u8, offset: usize) -> Result<(), ReadError> {
    if (2..=5).contains(&v) {
        Ok(())
    } else {
        Err(ReadError::Protocol { version: v, offset })
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
}
