//! CUDA: vramscope's tracker stream held to PyTorch's own recorder (its snapshot's trace,
//! segments and blocks), NVML's reading, and the forced out-of-memory. Both recorders start
//! together in the engine, so every comparison here is exact.

use std::collections::{BTreeMap, HashMap};

use crate::event::{Action, MemEvent};
use crate::report::snapshot_summary::reserved_peak;
use crate::snapshot::model::{BlockState, Snapshot, TraceEntry};
use crate::snapshot::timeline::Timeline;

use super::check::Outcome;
use super::evidence::{NvmlFigures, OomFigures};

fn describe(action: Action, addr: u64, size: u64) -> String {
    match action {
        Action::Oom => format!("oom of {size} B ({addr} B free)"),
        a => format!("{} of {size} B at {addr:#x}", a.as_str()),
    }
}

/// Snapshot entries carry no memory: PyTorch records one when a snapshot is taken.
fn counts(a: Action) -> bool {
    a != Action::Snapshot
}

/// Every alloc, free and segment event in the same order, with the same sizes and addresses.
pub fn trace(stream: &[MemEvent], pytorch: &[TraceEntry]) -> Outcome {
    let ours: Vec<(Action, u64, u64)> = stream.iter().filter(|e| counts(e.action)).map(|e| (e.action, e.addr, e.size)).collect();
    let theirs: Vec<(Action, u64, u64)> = pytorch.iter().filter(|e| counts(e.action)).map(|e| (e.action, e.addr, e.size)).collect();
    if let Some(i) = ours.iter().zip(&theirs).position(|(a, b)| a != b) {
        let (o, t) = (ours[i], theirs[i]);
        return Outcome::Fail(format!(
            "entry #{i}: PyTorch recorded {}, vramscope's tracker {}",
            describe(t.0, t.1, t.2),
            describe(o.0, o.1, o.2)
        ));
    }
    if ours.len() != theirs.len() {
        let n = ours.len().min(theirs.len());
        let (who, e) = if theirs.len() > n { ("PyTorch", theirs[n]) } else { ("vramscope's tracker", ours[n]) };
        return Outcome::Fail(format!(
            "PyTorch recorded {} entries, vramscope's tracker {}: the first unmatched is {who}'s entry #{n}, {}",
            theirs.len(),
            ours.len(),
            describe(e.0, e.1, e.2)
        ));
    }
    if theirs.is_empty() {
        return Outcome::Fail("PyTorch's trace is empty: its recorder saw nothing".into());
    }
    let allocs = theirs.iter().filter(|e| e.0 == Action::Alloc).count();
    Outcome::Pass(format!("{} entries ({allocs} allocs) in the same order, sizes and addresses", theirs.len()))
}

/// The state a stream leaves: mapped address ranges and live blocks, with its peaks.
#[derive(Default)]
struct Replay {
    /// start → end of each mapped range.
    mapped: BTreeMap<u64, u64>,
    blocks: HashMap<u64, u64>,
    active: u64,
    reserved: u64,
    peak_active: u64,
    peak_reserved: u64,
}

impl Replay {
    fn of(stream: &[MemEvent]) -> Replay {
        let mut r = Replay::default();
        for e in stream {
            match e.action {
                Action::Alloc => {
                    r.blocks.insert(e.addr, e.size);
                    r.active += e.size;
                }
                Action::FreeRequested => {
                    if let Some(s) = r.blocks.remove(&e.addr) {
                        r.active -= s;
                    }
                }
                Action::SegmentAlloc | Action::SegmentMap => {
                    r.mapped.insert(e.addr, e.addr + e.size);
                    r.reserved += e.size;
                }
                Action::SegmentFree | Action::SegmentUnmap => {
                    r.unmap(e.addr, e.addr + e.size);
                    r.reserved = r.reserved.saturating_sub(e.size);
                }
                _ => {}
            }
            r.peak_active = r.peak_active.max(r.active);
            r.peak_reserved = r.peak_reserved.max(r.reserved);
        }
        r
    }

    /// Removes [from, to) from the mapped ranges (an unmap may cut a range's middle).
    fn unmap(&mut self, from: u64, to: u64) {
        let cut: Vec<(u64, u64)> = self.mapped.range(..to).filter(|&(_, &end)| end > from).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in cut {
            self.mapped.remove(&s);
            if s < from {
                self.mapped.insert(s, from);
            }
            if e > to {
                self.mapped.insert(to, e);
            }
        }
    }

    fn mapped_in(&self, from: u64, to: u64) -> u64 {
        self.mapped.range(..to).map(|(&s, &e)| e.min(to).saturating_sub(s.max(from))).sum()
    }
}

/// The segments and live blocks the stream leaves equal PyTorch's snapshot's.
pub fn segments(stream: &[MemEvent], snap: &Snapshot, device: usize) -> Outcome {
    let r = Replay::of(stream);
    let segs: Vec<_> = snap.segments.iter().filter(|s| s.device == device as i64).collect();
    for s in &segs {
        let mapped = r.mapped_in(s.address, s.address + s.total_size);
        if mapped != s.total_size {
            return Outcome::Fail(format!(
                "PyTorch's segment at {:#x} holds {} B; vramscope's stream has {mapped} B reserved there",
                s.address, s.total_size
            ));
        }
    }
    let theirs: u64 = segs.iter().map(|s| s.total_size).sum();
    let ours: u64 = r.mapped.iter().map(|(&s, &e)| e - s).sum();
    if ours != theirs {
        let outside = r.mapped.iter().find(|&(&s, _)| !segs.iter().any(|g| g.address <= s && s < g.address + g.total_size));
        return Outcome::Fail(format!(
            "vramscope's stream reserves {ours} B, PyTorch's segments {theirs} B{}",
            outside.map(|(s, e)| format!(": {} B at {s:#x} is in no PyTorch segment", e - s)).unwrap_or_default()
        ));
    }
    let mut theirs_blocks: HashMap<u64, u64> = HashMap::new();
    for b in segs.iter().flat_map(|s| &s.blocks) {
        if b.state != BlockState::Inactive {
            theirs_blocks.insert(b.address, b.requested_size);
        }
    }
    let mut addrs: Vec<u64> = theirs_blocks.keys().chain(r.blocks.keys()).copied().collect();
    addrs.sort_unstable();
    addrs.dedup();
    for a in addrs {
        let (t, o) = (theirs_blocks.get(&a), r.blocks.get(&a));
        if t != o {
            let say = |s: Option<&u64>| s.map_or("no block".to_string(), |s| format!("a {s} B block"));
            return Outcome::Fail(format!("at {a:#x}: PyTorch's snapshot has {}, vramscope's stream {}", say(t), say(o)));
        }
    }
    Outcome::Pass(format!("{} segments ({theirs} B) and {} live blocks equal", segs.len(), theirs_blocks.len()))
}

/// Active (memory_viz's timeline) and reserved peaks of the stream equal PyTorch's.
pub fn peaks(stream: &[MemEvent], snap: &Snapshot, device: usize) -> Outcome {
    let r = Replay::of(stream);
    let active = Timeline::from_snapshot(snap, device).peak_bytes;
    let (reserved, _) = reserved_peak(snap, device);
    if (r.peak_active, r.peak_reserved) != (active, reserved) {
        return Outcome::Fail(format!(
            "PyTorch's snapshot peaks at {active} B active and {reserved} B reserved, vramscope's stream at {} B and {} B",
            r.peak_active, r.peak_reserved
        ));
    }
    Outcome::Pass(format!("active peak {active} B and reserved peak {reserved} B equal PyTorch's"))
}

/// How much of a stream that went on after PyTorch dumped its snapshot (the job's teardown
/// freeing its tensors) stands before that dump: the prefix holding as many memory entries
/// as PyTorch's trace. Snapshot entries carry no memory, and each recorder sees the other's.
pub fn cut_at_pytorchs_end(stream: &[MemEvent], pytorch: &[TraceEntry]) -> usize {
    let wanted = pytorch.iter().filter(|e| counts(e.action)).count();
    if wanted == 0 {
        return 0;
    }
    stream.iter().enumerate().filter(|(_, e)| counts(e.action)).nth(wanted - 1).map_or(stream.len(), |(i, _)| i + 1)
}

/// A session's stream held to PyTorch's own history of the same job, dumped at its end
/// (`_record_memory_history` from CUDA init on, then `_dump_snapshot`): the trace, the
/// segments and blocks, and the peaks, at the point PyTorch dumped.
pub fn against_pytorch(stream: &[MemEvent], snap: &Snapshot, device: usize) -> [(&'static str, Outcome); 3] {
    let stream = &stream[..cut_at_pytorchs_end(stream, snap.trace(device))];
    [("trace", trace(stream, snap.trace(device))), ("segments_blocks", segments(stream, snap, device)), ("peaks", peaks(stream, snap, device))]
}

/// NVML's used memory covers what the allocator reserved plus the CUDA context (measured
/// as what was used with the context up and nothing reserved).
pub fn nvml(n: &NvmlFigures) -> Outcome {
    let (base, end, whose) = match (n.process_baseline_used, n.process_end_used) {
        (Some(b), Some(e)) => (b, e, "the engine process"),
        _ => (n.baseline_used, n.end_used, "the device"),
    };
    let context = base.saturating_sub(n.baseline_reserved);
    let need = n.end_reserved + context;
    if end < need {
        return Outcome::Fail(format!(
            "NVML says {whose} (GPU {}) uses {end} B, less than the {} B reserved plus the {context} B CUDA context",
            n.index, n.end_reserved
        ));
    }
    Outcome::Pass(format!(
        "NVML: {whose} uses {end} B ≥ {} B reserved + {context} B CUDA context",
        n.end_reserved
    ))
}

/// What the light side saw of the forced OOM: the report, its snapshot, and a step after it.
pub struct OomSeen {
    /// The OOM report's snapshot, read back: its trace's last oom entry's size.
    pub snapshot_oom_size: Result<Option<u64>, String>,
    pub reported: bool,
    pub steps_after: u64,
}

pub fn oom(engine: Option<&OomFigures>, seen: &OomSeen) -> Outcome {
    let Some(f) = engine else { return Outcome::Fail("the engine did not attempt the forced OOM".into()) };
    if f.error.is_none() {
        return Outcome::Fail(format!("allocating {} B did not fail: nothing to catch", f.requested));
    }
    if !seen.reported {
        return Outcome::Fail(format!("step {} failed ({}) but no OOM report reached vramscope", f.step, f.error.as_deref().unwrap_or("")));
    }
    match &seen.snapshot_oom_size {
        Err(e) => return Outcome::Fail(format!("the OOM's snapshot: {e}")),
        Ok(None) => return Outcome::Fail("the OOM's snapshot has no oom entry in its trace".into()),
        Ok(Some(size)) if *size != f.requested => {
            return Outcome::Fail(format!("the OOM's snapshot records an oom of {size} B, the engine asked for {} B", f.requested))
        }
        Ok(Some(_)) => {}
    }
    if seen.steps_after == 0 {
        return Outcome::Fail(format!("no step ran after the OOM at step {}", f.step));
    }
    Outcome::Pass(format!(
        "{} B at step {} failed, was caught and snapshotted with its oom entry; {} step(s) ran after it",
        f.requested, f.step, seen.steps_after
    ))
}

/// Recorded inputs for tests: a real PyTorch snapshot and the stream vramscope's tracker
/// makes of its trace.
#[cfg(test)]
pub(crate) mod recorded {
    use super::*;
    use crate::producer::raw::RawEvent;
    use crate::producer::tracker::{Backend, Tracker};

    /// `expandable_segments:True`, an `oom` on device 1: every block it ends with was
    /// allocated inside its trace, so its trace is the whole story, as in the engine.
    pub const CONSTRUCTOR_SUN: &str = "Constructor-Sun_code_location_memory_snapshot.pickle";

    /// The real snapshot `name`, or `None` after the line saying the test skipped.
    pub fn fixture_path(name: &str) -> Option<std::path::PathBuf> {
        Some(crate::fixtures::for_test(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))?.join(name))
    }

    pub fn fixture(name: &str) -> Option<Snapshot> {
        Some(crate::snapshot::read_snapshot_file(&fixture_path(name)?).expect("the fixture reads"))
    }

    /// PyTorch's trace entries fed to vramscope's tracker as the shim's trace tracker hands
    /// them over: the stream the engine sends on CUDA.
    pub fn tracker_stream(snap: &Snapshot, device: u8) -> Vec<MemEvent> {
        let mut t = Tracker::new(Backend::Cuda { device }, 1 << 20);
        let raw: Vec<RawEvent> = snap
            .trace(device as usize)
            .iter()
            .map(|e| RawEvent { addr: e.addr, size: e.size, stream: e.stream, action: e.action as u8, device, ..Default::default() })
            .collect();
        t.ingest(&raw);
        t.take_batch(Vec::new()).events
    }
}

#[cfg(test)]
mod tests {
    use super::recorded::{fixture, tracker_stream, CONSTRUCTOR_SUN};
    use super::*;

    fn fail(o: Outcome) -> String {
        match o {
            Outcome::Fail(why) => why,
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn a_real_snapshot_and_its_tracker_stream_agree_on_every_device() {
        let Some(snap) = fixture(CONSTRUCTOR_SUN) else { return };
        for device in 0..3u8 {
            let stream = tracker_stream(&snap, device);
            let d = device as usize;
            for (what, o) in [("trace", trace(&stream, snap.trace(d))), ("segments", segments(&stream, &snap, d)), ("peaks", peaks(&stream, &snap, d))] {
                assert!(matches!(o, Outcome::Pass(_)), "device {device} {what}: {o:?}");
            }
        }
        let stream = tracker_stream(&snap, 1);
        let Outcome::Pass(why) = trace(&stream, snap.trace(1)) else { unreachable!() };
        assert_eq!(why, "596 entries (199 allocs) in the same order, sizes and addresses");
    }

    #[test]
    fn a_stream_that_went_on_is_cut_where_pytorchs_trace_ends() {
        use crate::event::{Category, Phase};
        let ev = |action, addr| MemEvent { t_ns: 0, addr, size: 512, stream: 0, step: 0, scope: 0, action, phase: Phase::Other, device: 0, category: Category::Unknown };
        let entry = |action, addr| TraceEntry::new(action, addr, 512);
        let pytorch = [entry(Action::Alloc, 1), entry(Action::Snapshot, 0), entry(Action::Alloc, 2)];
        // Ours saw a snapshot PyTorch did not record, then the teardown's frees.
        let ours = [ev(Action::Snapshot, 0), ev(Action::Alloc, 1), ev(Action::Alloc, 2), ev(Action::FreeRequested, 2), ev(Action::FreeCompleted, 2)];
        assert_eq!(cut_at_pytorchs_end(&ours, &pytorch), 3);
        assert!(matches!(trace(&ours[..3], &pytorch), Outcome::Pass(_)));
        // A stream that stopped short is taken whole, and the trace check names what is missing.
        assert_eq!(cut_at_pytorchs_end(&ours[..2], &pytorch), 2);
        assert!(matches!(trace(&ours[..2], &pytorch), Outcome::Fail(_)));
        assert_eq!(cut_at_pytorchs_end(&ours, &[]), 0);
    }

    #[test]
    fn a_dropped_or_changed_entry_is_named() {
        let Some(snap) = fixture(CONSTRUCTOR_SUN) else { return };
        let stream = tracker_stream(&snap, 0);
        let i = stream.iter().position(|e| e.action == Action::FreeRequested).unwrap();
        let mut dropped = stream.clone();
        dropped.remove(i);
        let e = &snap.trace(0)[i];
        assert_eq!(e.action, Action::FreeRequested);
        let why = fail(trace(&dropped, snap.trace(0)));
        assert!(why.starts_with(&format!("entry #{i}: PyTorch recorded free_requested of {} B at {:#x}, vramscope's tracker free_completed", e.size, e.addr)), "{why}");
        let mut resized = stream.clone();
        resized[i].size += 512;
        let why = fail(trace(&resized, snap.trace(0)));
        assert_eq!(why, format!("entry #{i}: PyTorch recorded free_requested of {} B at {:#x}, vramscope's tracker free_requested of {} B at {:#x}", e.size, e.addr, e.size + 512, e.addr));
        let why = fail(trace(&stream[..stream.len() - 1], snap.trace(0)));
        assert!(why.starts_with("PyTorch recorded 6445 entries, vramscope's tracker 6444: the first unmatched is PyTorch's entry #6444"), "{why}");
        // The oom entry (device 1) is compared too.
        let stream = tracker_stream(&snap, 1);
        let k = stream.iter().position(|e| e.action == Action::Oom).unwrap();
        let mut no_oom = stream.clone();
        no_oom.remove(k);
        assert!(fail(trace(&no_oom, snap.trace(1))).starts_with(&format!("entry #{k}: PyTorch recorded oom of")));
    }

    #[test]
    fn segments_and_blocks_must_match_the_snapshots() {
        let Some(snap) = fixture(CONSTRUCTOR_SUN) else { return };
        let stream = tracker_stream(&snap, 1);
        // A block still live at the end that the stream has at another address.
        let mut moved = stream.clone();
        let last_alloc = (0..moved.len())
            .rev()
            .find(|&i| moved[i].action == Action::Alloc && !moved[i..].iter().any(|e| e.action == Action::FreeRequested && e.addr == moved[i].addr))
            .unwrap();
        let addr = moved[last_alloc].addr;
        moved[last_alloc].addr += 512;
        let why = fail(segments(&moved, &snap, 1));
        assert!(why.starts_with(&format!("at {addr:#x}: PyTorch's snapshot has a ")) && why.ends_with("vramscope's stream no block"), "{why}");
        // A mapping the stream never undid.
        let unmap = stream.iter().rposition(|e| e.action == Action::SegmentUnmap).unwrap();
        let mut kept = stream.clone();
        kept.remove(unmap);
        let why = fail(segments(&kept, &snap, 1));
        assert!(why.contains("B reserved there") || why.starts_with("vramscope's stream reserves"), "{why}");
        // A snapshot block of another size.
        let mut other = snap.clone();
        let b = other.segments.iter_mut().filter(|s| s.device == 1).flat_map(|s| s.blocks.iter_mut()).find(|b| b.state == BlockState::ActiveAllocated).unwrap();
        b.requested_size += 1;
        let at = b.address;
        let why = fail(segments(&stream, &other, 1));
        assert!(why.starts_with(&format!("at {at:#x}: PyTorch's snapshot has a ")), "{why}");
    }

    #[test]
    fn peaks_must_match_the_snapshots() {
        let Some(snap) = fixture(CONSTRUCTOR_SUN) else { return };
        let stream = tracker_stream(&snap, 0);
        let mut bigger = stream.clone();
        // A lost free: the block stays in every later total.
        let first_free = bigger.iter().position(|e| e.action == Action::FreeRequested).unwrap();
        let lost = bigger.remove(first_free).size;
        let Outcome::Pass(_) = peaks(&stream, &snap, 0) else { panic!("the unperturbed stream fails") };
        let active = Timeline::from_snapshot(&snap, 0).peak_bytes;
        let why = fail(peaks(&bigger, &snap, 0));
        assert!(why.starts_with(&format!("PyTorch's snapshot peaks at {active} B active")), "{why}");
        assert!(why.contains(&format!("vramscope's stream at {} B", active + lost)), "{why}");
        // A segment mapped twice over lifts the reserved peak.
        let mut more = stream.clone();
        let map = more.iter().position(|e| e.action == Action::SegmentMap).unwrap();
        more.insert(map, more[map]);
        assert!(fail(peaks(&more, &snap, 0)).starts_with("PyTorch's snapshot peaks at "));
    }

    #[test]
    fn nvml_must_cover_reserved_and_context() {
        let mut n = NvmlFigures { index: 0, baseline_used: 600 << 20, baseline_reserved: 0, end_used: 2600 << 20, end_reserved: 2000 << 20, ..NvmlFigures::default() };
        assert!(matches!(nvml(&n), Outcome::Pass(_)));
        n.end_used -= 1;
        assert_eq!(
            fail(nvml(&n)),
            "NVML says the device (GPU 0) uses 2726297599 B, less than the 2097152000 B reserved plus the 629145600 B CUDA context"
        );
        // The process's own figures win where NVML lists the process.
        n.process_baseline_used = Some(500 << 20);
        n.process_end_used = Some(2500 << 20);
        assert!(matches!(nvml(&n), Outcome::Pass(why) if why.starts_with("NVML: the engine process uses")));
    }

    #[test]
    fn an_oom_must_be_caught_snapshotted_and_survived() {
        let f = OomFigures { step: 1, requested: 1 << 46, error: Some("CUDA out of memory".into()) };
        let ok = OomSeen { snapshot_oom_size: Ok(Some(1 << 46)), reported: true, steps_after: 2 };
        assert!(matches!(oom(Some(&f), &ok), Outcome::Pass(_)));
        assert!(fail(oom(None, &ok)).contains("did not attempt"));
        assert!(fail(oom(Some(&OomFigures { error: None, ..f.clone() }), &ok)).contains("did not fail"));
        assert!(fail(oom(Some(&f), &OomSeen { reported: false, ..ok })).contains("no OOM report"));
        let no_entry = OomSeen { snapshot_oom_size: Ok(None), reported: true, steps_after: 2 };
        assert!(fail(oom(Some(&f), &no_entry)).contains("no oom entry"));
        let dead = OomSeen { snapshot_oom_size: Ok(Some(1 << 46)), reported: true, steps_after: 0 };
        assert_eq!(fail(oom(Some(&f), &dead)), "no step ran after the OOM at step 1");
    }
}
