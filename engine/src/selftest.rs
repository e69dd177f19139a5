//! The engine's side of `vramscope selftest`: a capture that keeps every raw event the shim
//! hands over (and, asked to by `VRAMSCOPE_SELFTEST_FAULT`, spoils one on its way to the
//! tracker, to show the checks catch it), NVML's readings, and the evidence file written at
//! the end. The comparisons are the light crate's (`vramscope_core::selftest`).

use std::path::Path;
use std::sync::{Arc, Mutex};

use vramscope_core::event::Phase;
use vramscope_core::event::Action;
use vramscope_core::producer::raw::{CudaStats, RawEvent, CPU_DEVICE, RAW_ALLOC, RAW_FREE};
use vramscope_core::producer::session::{Capture, Session};
use vramscope_core::producer::tracker::Backend;
use vramscope_core::selftest::evidence::{Evidence, Figures, NvmlFigures, OomFigures, RawRecord};
use vramscope_core::source::gauges::{DeviceQuery, NvmlQuery, RawDevice};

use crate::capture::{self, Shim};

/// A fault to inject, from `VRAMSCOPE_SELFTEST_FAULT`: `drop-free` loses the shim's 50th
/// free on its way to the tracker, `alloc-size` adds 512 B to its 50th allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    DropFree,
    AllocSize,
}

/// Which raw event the fault hits (late enough to be inside training).
const FAULT_AT: usize = 50;

impl Fault {
    pub fn from_env() -> anyhow::Result<Option<Fault>> {
        match std::env::var("VRAMSCOPE_SELFTEST_FAULT").ok().as_deref() {
            None | Some("") => Ok(None),
            Some("drop-free") => Ok(Some(Fault::DropFree)),
            Some("alloc-size") => Ok(Some(Fault::AllocSize)),
            Some(other) => anyhow::bail!("VRAMSCOPE_SELFTEST_FAULT={other}: expected drop-free or alloc-size"),
        }
    }

    fn describe(self) -> String {
        match self {
            Fault::DropFree => format!("drop-free: the shim's free #{FAULT_AT} never reaches the tracker"),
            Fault::AllocSize => format!("alloc-size: the shim's allocation #{FAULT_AT} reaches the tracker 512 B larger"),
        }
    }
}

#[derive(Default)]
struct Log {
    raw: Vec<RawRecord>,
    allocs: usize,
    frees: usize,
}

/// The shim, with every drained event kept.
pub struct RecordingShim {
    log: Arc<Mutex<Log>>,
    fault: Option<Fault>,
    /// The CUDA device under test; None on CPU.
    cuda: Option<u8>,
}

/// What an event is to the fault: an allocation or a free of the memory under test, as
/// the tracker counts them (on CUDA a free is FREE_REQUESTED, action 2 there being
/// FREE_COMPLETED; other devices' and CPU events never reach its figures).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Counted {
    Alloc,
    Free,
}

fn counted(e: &RawEvent, cuda: Option<u8>) -> Option<Counted> {
    let (device, free) = match cuda {
        Some(d) => (d, Action::FreeRequested as u8),
        None => (CPU_DEVICE, RAW_FREE),
    };
    match e.action {
        _ if e.device != device => None,
        RAW_ALLOC => Some(Counted::Alloc),
        a if a == free => Some(Counted::Free),
        _ => None,
    }
}

/// The evidence kept so far, shared with the loop.
#[derive(Clone)]
pub struct Recorder {
    log: Arc<Mutex<Log>>,
    fault: Option<Fault>,
    /// NVML's reading and the allocator's reserved bytes before training (CUDA).
    nvml_baseline: Option<Result<(NvmlReading, u64), String>>,
}

/// NVML's used bytes of the training device, and of this process where NVML lists it.
#[derive(Clone, Copy)]
struct NvmlReading {
    index: u32,
    used: u64,
    own: Option<u64>,
}

impl Log {
    /// Keeps `events` as evidence and returns them as the tracker is to get them: spoiled
    /// by the fault, when it hits one of them.
    fn keep(&mut self, events: &[RawEvent], fault: Option<Fault>, cuda: Option<u8>) -> Vec<RawEvent> {
        let mut fed = Vec::with_capacity(events.len());
        for &e in events {
            self.raw.push(RawRecord { action: e.action, addr: e.addr, size: e.size, device: e.device });
            match counted(&e, cuda) {
                Some(Counted::Alloc) => {
                    self.allocs += 1;
                    if fault == Some(Fault::AllocSize) && self.allocs == FAULT_AT {
                        fed.push(RawEvent { size: e.size + 512, ..e });
                        continue;
                    }
                }
                Some(Counted::Free) => {
                    self.frees += 1;
                    if fault == Some(Fault::DropFree) && self.frees == FAULT_AT {
                        continue;
                    }
                }
                None => {}
            }
            fed.push(e);
        }
        fed
    }
}

pub fn recording(fault: Option<Fault>, cuda: Option<u8>) -> (RecordingShim, Recorder) {
    let log = Arc::new(Mutex::new(Log::default()));
    let nvml_baseline = cuda.map(|n| Ok((nvml_reading(n)?, Shim.cuda_stats(n)?.reserved)));
    (RecordingShim { log: log.clone(), fault, cuda }, Recorder { log, fault, nvml_baseline })
}

impl Capture for RecordingShim {
    fn now_ns(&self) -> u64 {
        Shim.now_ns()
    }

    fn drain(&self, out: &mut Vec<RawEvent>) {
        let start = out.len();
        Shim.drain(out);
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let drained: Vec<RawEvent> = out.drain(start..).collect();
        out.extend(log.keep(&drained, self.fault, self.cuda));
    }

    fn set_tags(&self, step: u32, phase: Phase) {
        Shim.set_tags(step, phase)
    }

    fn mark(&self, rec: &RawEvent) {
        Shim.mark(rec)
    }

    fn cuda_stats(&self, device: u8) -> Result<CudaStats, String> {
        Shim.cuda_stats(device)
    }

    fn dropped(&self) -> u64 {
        Shim.dropped()
    }

    fn cuda_pci_bus_id(&self, device: u8) -> Option<String> {
        Shim.cuda_pci_bus_id(device)
    }

    fn cuda_snapshot(&self) -> Result<Vec<u8>, String> {
        Shim.cuda_snapshot()
    }
}

/// NVML's device used bytes for CUDA device `cuda` (the device that lists this process,
/// else the same index), and this process's own where listed.
fn nvml_reading(cuda: u8) -> Result<NvmlReading, String> {
    let mut q = NvmlQuery::open().map_err(|e| e.to_string())?;
    let devices = q.read_devices().map_err(|e| e.to_string())?;
    let pid = std::process::id();
    let own = |d: &RawDevice| d.compute_processes.as_ref().ok().and_then(|ps| ps.iter().find(|p| p.pid == pid).map(|p| p.used_bytes));
    let d = devices.iter().find(|d| own(d).is_some()).or_else(|| devices.iter().find(|d| d.index == u32::from(cuda))).ok_or("NVML does not list this device")?;
    let used = d.memory.as_ref().map_err(|e| format!("NVML memory: {e}"))?.used;
    Ok(NvmlReading { index: d.index, used, own: own(d).flatten() })
}

fn device_name(cuda: u8) -> Option<String> {
    let mut q = NvmlQuery::open().ok()?;
    q.read_devices().ok()?.into_iter().find(|d| d.index == u32::from(cuda))?.name.ok()
}

impl Recorder {
    /// What the checks need, read now: call with the session drained at a step boundary.
    pub fn gather(&self, s: &mut Session, oom: Option<OomFigures>, dir: &Path) -> Evidence {
        s.drain();
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let t = &s.tracker;
        let mut ev = Evidence {
            device: s.info().device.clone(),
            torch_version: Some(capture::torch_version()),
            cuda_version: capture::cuda_version(),
            fault: self.fault.map(Fault::describe),
            raw: log.raw.clone(),
            cut_seq: t.next_seq(),
            figures: Figures {
                active_bytes: t.active_bytes,
                live_count: t.live_count() as u64,
                allocated_bytes: t.allocated_bytes,
                reserved_bytes: t.reserved_bytes,
            },
            oom,
            ..Evidence::default()
        };
        if let Some(m) = t.model() {
            let stats = m.stats();
            ev.figures.allocated_bytes = stats.allocated_bytes;
            ev.figures.reserved_bytes = stats.reserved_bytes;
        }
        if let Backend::Cuda { device } = *t.backend() {
            ev.gpu_name = device_name(device);
            match Shim.cuda_stats(device) {
                Ok(c) => {
                    ev.figures.allocated_bytes = c.allocated;
                    ev.figures.reserved_bytes = c.reserved;
                }
                Err(e) => ev.pytorch_snapshot_error = Some(format!("the allocator's counters: {e}")),
            }
            match Shim.cuda_snapshot() {
                Ok(bytes) => {
                    let path = dir.join("pytorch_snapshot.pickle");
                    match std::fs::write(&path, bytes) {
                        Ok(()) => ev.pytorch_snapshot = Some(path),
                        Err(e) => ev.pytorch_snapshot_error = Some(format!("{}: {e}", path.display())),
                    }
                }
                Err(e) => ev.pytorch_snapshot_error = Some(e),
            }
            ev.nvml = self.nvml_baseline.clone().map(|base| {
                let (baseline, baseline_reserved) = base?;
                let end = nvml_reading(device)?;
                Ok(NvmlFigures {
                    index: baseline.index,
                    baseline_used: baseline.used,
                    baseline_reserved,
                    end_used: end.used,
                    end_reserved: ev.figures.reserved_bytes,
                    process_baseline_used: baseline.own,
                    process_end_used: end.own,
                })
            });
        }
        ev
    }
}

/// Why `--device cuda:N` cannot run here, if it cannot: no CUDA at all (the selftest skips
/// its CUDA checks with this), or no such device (a bad flag).
pub fn cuda_unavailable(n: u8) -> Option<Evidence> {
    let built = if capture::cuda_compiled() { "this build has CUDA support" } else { "this build's libtorch has no CUDA" };
    let device = format!("cuda:{n}");
    if !tch::Cuda::is_available() {
        let why = format!("torch.cuda.is_available() is False ({built})");
        return Some(Evidence { unavailable: Some(why), device, ..Evidence::default() });
    }
    let count = tch::Cuda::device_count();
    (i64::from(n) >= count).then(|| Evidence {
        bad_device: Some(format!("--device {n}: this machine has {count} CUDA device(s), 0 to {}", count - 1)),
        device,
        ..Evidence::default()
    })
}

pub fn write(path: &Path, ev: &Evidence) -> anyhow::Result<()> {
    let json = serde_json::to_vec(ev)?;
    vramscope_core::selftest::check::write_atomic(path, &json).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_core::producer::tracker::Tracker;

    /// A CUDA training stream as the trace tracker hands it over: CPU events and another
    /// device's interleaved with device 0's alloc, free_requested, free_completed.
    fn cuda_stream(n: u64) -> Vec<RawEvent> {
        let ev = |action: Action, addr: u64, device: u8| RawEvent { action: action as u8, addr, size: 4096, device, ..RawEvent::default() };
        let mut v = Vec::new();
        for i in 0..n {
            let addr = 0x7f00_0000 + i * 4096;
            v.push(RawEvent { action: RAW_ALLOC, addr: 0x1000 + i, size: 64, device: CPU_DEVICE, ..RawEvent::default() });
            v.push(ev(Action::Alloc, addr, 0));
            v.push(ev(Action::Alloc, addr, 1));
            v.push(ev(Action::FreeRequested, addr, 0));
            v.push(ev(Action::FreeCompleted, addr, 0));
            v.push(RawEvent { action: RAW_FREE, addr: 0x1000 + i, device: CPU_DEVICE, ..RawEvent::default() });
        }
        v
    }

    /// What the tracker of device 0 is left holding after the (spoiled) stream.
    fn tracked(fault: Option<Fault>) -> (usize, u64) {
        let mut log = Log::default();
        let fed: Vec<RawEvent> = log.keep(&cuda_stream(80), fault, Some(0)).into_iter().filter(|e| e.device == 0).collect();
        let mut t = Tracker::new(Backend::Cuda { device: 0 }, 1 << 12);
        t.ingest(&fed);
        assert_eq!((log.allocs, log.frees), (80, 80), "only device 0's allocs and free_requested count");
        (t.live_count(), t.active_bytes)
    }

    #[test]
    fn the_fault_spoils_what_the_cuda_tracker_counts() {
        assert_eq!(tracked(None), (0, 0));
        // The negative control must show: one free lost leaves one allocation live...
        assert_eq!(tracked(Some(Fault::DropFree)), (1, 4096));
        // ...and one allocation 512 B larger leaves 512 B the frees do not return.
        let mut log = Log::default();
        let fed = log.keep(&cuda_stream(80), Some(Fault::AllocSize), Some(0));
        let grown: Vec<&RawEvent> = fed.iter().filter(|e| e.size == 4096 + 512).collect();
        assert_eq!(grown.len(), 1);
        assert_eq!((grown[0].device, grown[0].action), (0, Action::Alloc as u8));
    }

    #[test]
    fn on_cpu_the_fault_counts_the_cpu_wrapper_events() {
        let mut log = Log::default();
        let fed = log.keep(&cuda_stream(80), Some(Fault::DropFree), None);
        assert_eq!((log.allocs, log.frees), (80, 80));
        assert_eq!(fed.len(), 80 * 6 - 1);
        assert!(fed.iter().filter(|e| e.device == CPU_DEVICE && e.action == RAW_FREE).count() == 79);
    }
}
