//! CPU: the capture accounts exactly. Every allocation and free the shim recorded reaches
//! the stream in the same order with the same size (a free naming the same allocation), what
//! is left is live at the end, and the stream's totals equal the allocator model's.

use std::collections::HashMap;

use crate::event::{Action, MemEvent};
use crate::producer::raw::{RAW_ALLOC, RAW_FREE};

use super::check::Outcome;
use super::evidence::{Figures, RawRecord};

/// An allocation or a free, by position: frees name the allocation they end by its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Alloc { size: u64 },
    Free { of: usize, size: u64 },
    /// A free of an address with nothing live there.
    StrayFree { addr: u64 },
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Alloc { size } => write!(f, "alloc of {size} B"),
            Op::Free { of, size } => write!(f, "free of alloc #{of} ({size} B)"),
            Op::StrayFree { addr } => write!(f, "free of {addr:#x}, where nothing is live"),
        }
    }
}

/// Pairs frees with allocations by address, in order.
#[derive(Default)]
struct Ledger {
    ops: Vec<(usize, Op)>,
    allocs: usize,
    live: HashMap<u64, (usize, u64)>,
}

impl Ledger {
    fn alloc(&mut self, at: usize, addr: u64, size: u64) {
        self.live.insert(addr, (self.allocs, size));
        self.allocs += 1;
        self.ops.push((at, Op::Alloc { size }));
    }

    /// Returns false when nothing is live at `addr`.
    fn free(&mut self, at: usize, addr: u64) -> bool {
        match self.live.remove(&addr) {
            Some((of, size)) => {
                self.ops.push((at, Op::Free { of, size }));
                true
            }
            None => false,
        }
    }

    fn live_bytes(&self) -> u64 {
        self.live.values().map(|&(_, s)| s).sum()
    }
}

pub fn check(raw: &[RawRecord], stream: &[MemEvent], figures: &Figures) -> Outcome {
    let mut shim = Ledger::default();
    // Frees of tensors made before the session started: the tracker never knew them.
    let mut earlier = 0usize;
    for (i, r) in raw.iter().enumerate() {
        match r.action {
            RAW_ALLOC => shim.alloc(i, r.addr, r.size),
            RAW_FREE if !shim.free(i, r.addr) => earlier += 1,
            _ => {}
        }
    }
    let mut out = Ledger::default();
    let mut reserved: i128 = 0;
    for (i, e) in stream.iter().enumerate() {
        match e.action {
            Action::Alloc => out.alloc(i, e.addr, e.size),
            Action::FreeRequested if !out.free(i, e.addr) => out.ops.push((i, Op::StrayFree { addr: e.addr })),
            a => reserved += a.reserved_sign() as i128 * e.size as i128,
        }
    }
    for (k, pair) in shim.ops.iter().zip(out.ops.iter()).enumerate() {
        let ((ri, rop), (si, sop)) = pair;
        if rop != sop {
            return Outcome::Fail(format!(
                "allocation event #{k}: the shim recorded {rop} (raw event #{ri}), the stream has {sop} (stream event #{si})"
            ));
        }
    }
    if shim.ops.len() != out.ops.len() {
        let (longer, what) = if shim.ops.len() > out.ops.len() { (&shim.ops, "the shim recorded") } else { (&out.ops, "the stream has") };
        let (at, op) = longer[shim.ops.len().min(out.ops.len())];
        return Outcome::Fail(format!(
            "the shim recorded {} allocation events, the stream {}: first unmatched, {what} {op} (event #{at})",
            shim.ops.len(),
            out.ops.len()
        ));
    }
    let shim_live = (shim.live.len() as u64, shim.live_bytes());
    let stream_live = (out.live.len() as u64, out.live_bytes());
    if shim_live != stream_live || stream_live != (figures.live_count, figures.active_bytes) {
        return Outcome::Fail(format!(
            "live at the end: the shim {} allocations ({} B), the stream {} ({} B), the tracker {} ({} B)",
            shim_live.0, shim_live.1, stream_live.0, stream_live.1, figures.live_count, figures.active_bytes
        ));
    }
    if reserved != figures.reserved_bytes as i128 {
        return Outcome::Fail(format!(
            "reserved: the stream's segment events add up to {reserved} B, the allocator holds {} B",
            figures.reserved_bytes
        ));
    }
    if !(figures.active_bytes <= figures.allocated_bytes && figures.allocated_bytes <= figures.reserved_bytes) {
        return Outcome::Fail(format!(
            "the allocator's allocated bytes ({} B) are not between the live requested bytes ({} B) and the reserved bytes ({} B)",
            figures.allocated_bytes, figures.active_bytes, figures.reserved_bytes
        ));
    }
    if shim.allocs == 0 {
        return Outcome::Fail("the shim recorded no allocation: nothing was captured".into());
    }
    Outcome::Pass(format!(
        "{} allocations and {} frees in the same order and sizes ({earlier} frees of earlier tensors ignored, as the tracker does); {} live ({} B) at the end; reserved {} B and allocated {} B as the allocator's",
        shim.allocs,
        shim.ops.len() - shim.allocs,
        stream_live.0,
        stream_live.1,
        figures.reserved_bytes,
        figures.allocated_bytes
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::AllocatorConfig;
    use crate::event::Phase;
    use crate::producer::raw::{RawEvent, CPU_DEVICE};
    use crate::producer::tracker::Tracker;

    fn raw(action: u8, addr: u64, size: u64) -> RawRecord {
        RawRecord { action, addr, size, device: CPU_DEVICE }
    }

    /// A small run through the real tracker: the stream and figures the engine would send.
    fn through_tracker(records: &[RawRecord]) -> (Vec<MemEvent>, Figures) {
        let mut t = Tracker::modelled(AllocatorConfig::default());
        let evs: Vec<RawEvent> = records
            .iter()
            .map(|r| RawEvent { addr: r.addr, size: r.size, action: r.action, device: r.device, phase: Phase::Forward as u8, ..Default::default() })
            .collect();
        t.ingest(&evs);
        let stats = t.model().unwrap().stats();
        let figures = Figures {
            active_bytes: t.active_bytes,
            live_count: t.live_count() as u64,
            allocated_bytes: stats.allocated_bytes,
            reserved_bytes: stats.reserved_bytes,
        };
        (t.take_batch(Vec::new()).events, figures)
    }

    fn records() -> Vec<RawRecord> {
        vec![
            raw(RAW_ALLOC, 0x10, 4096),
            raw(RAW_ALLOC, 0x20, 3 << 20),
            raw(RAW_FREE, 0x10, 0),
            raw(RAW_FREE, 0x999, 0),
            raw(RAW_ALLOC, 0x10, 100),
            raw(RAW_ALLOC, 0x30, 25 << 20),
            raw(RAW_FREE, 0x30, 0),
        ]
    }

    #[test]
    fn the_trackers_stream_accounts_for_every_raw_event() {
        let r = records();
        let (stream, figures) = through_tracker(&r);
        match check(&r, &stream, &figures) {
            Outcome::Pass(why) => assert!(why.starts_with("4 allocations and 2 frees") && why.contains("1 frees of earlier"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_dropped_free_is_named() {
        let r = records();
        let mut fed = r.clone();
        fed.remove(6);
        let (stream, figures) = through_tracker(&fed);
        let Outcome::Fail(why) = check(&r, &stream, &figures) else { panic!("a dropped free passed") };
        assert_eq!(
            why,
            "the shim recorded 6 allocation events, the stream 5: first unmatched, the shim recorded free of alloc #3 (26214400 B) (event #6)"
        );
        // A lost free whose address is used again: the model ends the old block late, so
        // the free sits elsewhere in the order.
        let mut fed = r.clone();
        fed.remove(2);
        fed.insert(3, raw(RAW_ALLOC, 0x40, 512));
        let mut expected = r.clone();
        expected.insert(3, raw(RAW_ALLOC, 0x40, 512));
        let (stream, figures) = through_tracker(&fed);
        let Outcome::Fail(why) = check(&expected, &stream, &figures) else { panic!("a late free passed") };
        assert!(why.starts_with("allocation event #2: the shim recorded free of alloc #0 (4096 B) (raw event #2), the stream has alloc of 512 B"), "{why}");
    }

    #[test]
    fn a_wrong_size_is_named() {
        let r = records();
        let mut fed = r.clone();
        fed[1].size += 512;
        let (stream, figures) = through_tracker(&fed);
        let Outcome::Fail(why) = check(&r, &stream, &figures) else { panic!("a wrong size passed") };
        assert!(why.starts_with("allocation event #1: the shim recorded alloc of 3145728 B (raw event #1), the stream has alloc of 3146240 B"), "{why}");
    }

    #[test]
    fn totals_must_equal_the_allocators() {
        let r = records();
        let (stream, mut figures) = through_tracker(&r);
        figures.reserved_bytes += 2 << 20;
        let Outcome::Fail(why) = check(&r, &stream, &figures) else { panic!("a wrong reserved figure passed") };
        assert!(why.starts_with("reserved: the stream's segment events add up to"), "{why}");
        let (stream, mut figures) = through_tracker(&r);
        figures.active_bytes -= 1;
        let Outcome::Fail(why) = check(&r, &stream, &figures) else { panic!("a wrong live figure passed") };
        assert!(why.starts_with("live at the end:"), "{why}");
        let Outcome::Fail(why) = check(&r, &stream[..stream.len() - 2], &figures) else { panic!("a short stream passed") };
        assert!(why.contains("first unmatched, the shim recorded free of alloc #3"), "{why}");
        let (stream, figures) = through_tracker(&r);
        let mut stray = stream.clone();
        stray.insert(0, MemEvent { action: Action::FreeRequested, addr: 0xdead, ..stream[1] });
        let Outcome::Fail(why) = check(&r, &stray, &figures) else { panic!("a stray free passed") };
        assert!(why.contains("the stream has free of 0xdead, where nothing is live (stream event #0)"), "{why}");
    }
}
