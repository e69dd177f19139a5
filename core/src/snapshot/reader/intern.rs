//! Hashing and stack interning for the reader.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::snapshot::model::{FrameId, StackId, Text};

/// Multiply-rotate hasher: the keys are short and trusted to be non-adversarial in
/// distribution terms only; a collision flood would slow, never break, the reader.
#[derive(Default)]
pub(super) struct FastHasher(u64);

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
    pub(super) fn add(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

pub(super) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// Stack interning, the hottest lookup of a snapshot (one per trace entry, 20-40 frames
/// each, and distinct stacks too many for the cache): an open-addressing table whose
/// slots carry a hash tag and where the stack's frames lie in one flat pool, so a
/// lookup costs two memory accesses (slot, frames) and one comparison.
#[derive(Default)]
pub(super) struct StackTable {
    pub(super) stacks: Vec<Vec<FrameId>>,
    /// The frames of every stack, back to back: `pool[slot.start..][..slot.len]`.
    pub(super) pool: Vec<FrameId>,
    /// Power-of-two length, at most half full; `id == 0` marks an empty slot.
    pub(super) slots: Vec<StackSlot>,
    /// The slot of the stack interned last: a free and its completion, back to back,
    /// share one, and its frames in `pool` are still in cache.
    pub(super) last: Option<StackSlot>,
}

#[derive(Clone, Copy, Default)]
pub(super) struct StackSlot {
    pub(super) tag: u32,
    pub(super) len: u32,
    pub(super) start: u32,
    /// Stack id + 1.
    pub(super) id: u32,
}

impl StackTable {
    pub(super) fn hash(ids: &[FrameId]) -> u64 {
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
    pub(super) fn intern(&mut self, ids: &mut Vec<FrameId>) -> Option<StackId> {
        if let Some(last) = self.last.filter(|l| self.frames_of(l) == Some(ids.as_slice())) {
            return Some(last.id - 1);
        }
        let slot = self.lookup_or_add(ids)?;
        self.last = Some(slot);
        Some(slot.id - 1)
    }

    pub(super) fn frames_of(&self, s: &StackSlot) -> Option<&[FrameId]> {
        self.pool.get(s.start as usize..s.start as usize + s.len as usize)
    }

    pub(super) fn lookup_or_add(&mut self, ids: &mut Vec<FrameId>) -> Option<StackSlot> {
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

    pub(super) fn grow(&mut self) {
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

pub(super) const NO_FRAME: FrameId = FrameId::MAX;

/// One shared copy of each distinct text (an entry's `compile_context`, `user_metadata`),
/// and the last few met by address: the same memoized string read back.
#[derive(Default)]
pub(super) struct TextTable<'a> {
    texts: FastMap<&'a str, Text>,
    recent: [Option<(usize, usize, Text)>; 8],
}

impl<'a> TextTable<'a> {
    pub(super) fn get(&mut self, s: &'a str) -> Text {
        let (addr, len) = (s.as_ptr() as usize, s.len());
        let slot = &mut self.recent[(addr ^ len) % 8];
        match slot {
            // Same address and length in the one input: the same text.
            Some((a, l, text)) if *a == addr && *l == len => text.clone(),
            // The same text written again (PyTorch writes each entry's `compile_context`
            // anew): compared before it is hashed.
            Some((a, _, text)) if &**text == s => {
                *a = addr;
                text.clone()
            }
            _ => {
                let text = self.texts.entry(s).or_insert_with(|| Text::from(s)).clone();
                *slot = Some((addr, len, text.clone()));
                text
            }
        }
    }
}
