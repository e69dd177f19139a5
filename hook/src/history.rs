//! CUDA memory from PyTorch's own memory history, where the capture shim cannot follow the
//! caching allocator (it was built without CUDA headers, or not built at all: no compiler).
//! The Python side turns on `torch.cuda.memory._record_memory_history`, reads the trace at
//! every phase boundary, and pushes its entries, the allocator's counters and, on request,
//! PyTorch's snapshot here; the session drains them as it drains the shim.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use vramscope_core::producer::raw::{CudaStats, RawEvent};

/// One trace entry as the Python side hands it over (layout shared with `_history.py`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HistoryEntry {
    /// PyTorch's `time_us` (microseconds since the Unix epoch; 0 where the torch has none).
    pub time_us: i64,
    pub addr: u64,
    pub size: u64,
    pub stream: i64,
    /// c10's `TraceEntry::Action` numbering, as the shim's tracker forwards it.
    pub action: u8,
    pub device: u8,
}

/// Writes PyTorch's pickled snapshot: a pointer to bytes the Python side keeps alive until
/// its next call, and their length. 0 on success.
pub type SnapshotFn = extern "C" fn(*mut *const u8, *mut usize) -> c_int;

#[derive(Default)]
pub struct History {
    events: Vec<RawEvent>,
    stats: HashMap<u8, CudaStats>,
    bus_ids: HashMap<u8, String>,
    snapshot: Option<SnapshotFn>,
    /// Entries the trace's ring overwrote before a read (at least this many).
    dropped: u64,
    /// The latest stamp given, so that entries stay in order on the session's clock.
    last_ns: u64,
}

/// Some once the Python side started reading the history.
static HISTORY: Mutex<Option<History>> = Mutex::new(None);
/// Memory the job held before the hook came (`vramscope attach --pid`), as the Python side
/// found it in the job's objects and PyTorch's snapshot; drained before anything else.
static SEEDED: Mutex<Vec<RawEvent>> = Mutex::new(Vec::new());
/// The session's current step and phase, stamped on the entries pushed (a read happens at
/// the boundary that ends the phase its entries belong to).
static TAGS: AtomicU64 = AtomicU64::new(0);

fn history() -> std::sync::MutexGuard<'static, Option<History>> {
    HISTORY.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn start(snapshot: Option<SnapshotFn>) {
    *history() = Some(History { snapshot, ..History::default() });
}

pub fn active() -> bool {
    history().is_some()
}

pub fn set_tags(step: u32, phase: u8) {
    TAGS.store(u64::from(step) << 8 | u64::from(phase), Ordering::Relaxed);
}

/// `entries` at `now_ns` on the session's clock, `epoch_now_us` being the same moment on
/// the Unix clock: each entry is placed by its own time where it has one.
pub fn push(entries: &[HistoryEntry], now_ns: u64, epoch_now_us: i64) {
    let mut g = history();
    let Some(h) = g.as_mut() else { return };
    let tags = TAGS.load(Ordering::Relaxed);
    for e in entries {
        let ago_ns = if e.time_us > 0 { (epoch_now_us - e.time_us).max(0) as u64 * 1000 } else { 0 };
        let t = now_ns.saturating_sub(ago_ns).clamp(h.last_ns, now_ns.max(h.last_ns));
        h.last_ns = t;
        h.events.push(RawEvent {
            t_ns: t,
            addr: e.addr,
            size: e.size,
            stream: e.stream,
            step: (tags >> 8) as u32,
            phase: tags as u8,
            action: e.action,
            device: e.device,
            ..RawEvent::default()
        });
    }
}

pub fn set_stats(device: u8, stats: CudaStats) {
    if let Some(h) = history().as_mut() {
        h.stats.insert(device, stats);
    }
}

pub fn set_bus_id(device: u8, id: String) {
    if let Some(h) = history().as_mut() {
        h.bus_ids.insert(device, id);
    }
}

pub fn add_dropped(n: u64) {
    if let Some(h) = history().as_mut() {
        h.dropped += n;
    }
}

/// One event of what was there before (c10's action numbering), stamped `now_ns`.
pub fn seed(action: u8, addr: u64, size: u64, device: u8, now_ns: u64) {
    let tags = TAGS.load(Ordering::Relaxed);
    let e = RawEvent { t_ns: now_ns, addr, size, action, device, step: (tags >> 8) as u32, phase: tags as u8, ..RawEvent::default() };
    SEEDED.lock().unwrap_or_else(|e| e.into_inner()).push(e);
}

/// Seeds wait to be drained.
pub fn seeding() -> bool {
    !SEEDED.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
}

pub fn drain(out: &mut Vec<RawEvent>) {
    out.append(&mut SEEDED.lock().unwrap_or_else(|e| e.into_inner()));
    if let Some(h) = history().as_mut() {
        out.append(&mut h.events);
    }
}

pub fn stats(device: u8) -> Option<CudaStats> {
    history().as_ref().and_then(|h| h.stats.get(&device).copied())
}

pub fn bus_id(device: u8) -> Option<String> {
    history().as_ref().and_then(|h| h.bus_ids.get(&device).cloned())
}

pub fn dropped() -> u64 {
    history().as_ref().map_or(0, |h| h.dropped)
}

/// PyTorch's snapshot, from the Python side (on the thread that asked: the job's, at a step
/// boundary, which holds no lock the Python side needs).
pub fn snapshot() -> Result<Vec<u8>, String> {
    let f = history().as_ref().and_then(|h| h.snapshot).ok_or("PyTorch's memory history gives no snapshot here")?;
    let (mut p, mut len) = (std::ptr::null(), 0usize);
    if f(&mut p, &mut len) != 0 || p.is_null() {
        return Err("PyTorch's snapshot could not be read".into());
    }
    // SAFETY: the Python side keeps `len` bytes at `p` alive until its next call.
    Ok(unsafe { std::slice::from_raw_parts(p, len) }.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_keep_their_order_on_the_sessions_clock_and_carry_the_phase() {
        start(None);
        set_tags(3, 2);
        let e = |time_us, addr| HistoryEntry { time_us, addr, size: 512, action: 0, ..HistoryEntry::default() };
        // Unix now = 10,000 µs ↔ session 50 ms: an entry 2 ms old lands at 48 ms; one with a
        // clock that ran backwards (or no time) never lands before the one before it.
        push(&[e(8_000, 1), e(7_000, 2), e(0, 3)], 50_000_000, 10_000);
        let mut out = Vec::new();
        drain(&mut out);
        let t: Vec<u64> = out.iter().map(|r| r.t_ns).collect();
        assert_eq!(t, [48_000_000, 48_000_000, 50_000_000]);
        assert!(out.iter().all(|r| r.step == 3 && r.phase == 2 && r.size == 512));
        drain(&mut out);
        assert_eq!(out.len(), 3, "drained once");
    }
}
