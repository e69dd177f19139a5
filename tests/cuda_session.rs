//! A producer session end to end without a GPU: a capture that hands over what CUDA's trace
//! tracker would (several devices, segments made before it attached, the allocator's
//! counters) or what the CPU wrapper records among the host's in-band records, a real
//! session and server, and viewers on the socket whose screens' stores are held to the
//! allocator's figures.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vramscope_core::allocator::{AllocatorConfig, CachingAllocatorModel};
use vramscope_core::channel::Endpoint;
use vramscope_core::event::{Action, Category, Phase};
use vramscope_core::producer::raw::{CudaStats, RawEvent, CPU_DEVICE, RAW_ALLOC, RAW_FREE, RAW_MARK_PHASE};
use vramscope_core::producer::scopes::Scopes;
use vramscope_core::producer::server::{Listen, Log, Server};
use vramscope_core::producer::session::{Capture, Session, SessionOptions, StepEnd};
use vramscope_core::producer::tracker::Backend;
use vramscope_core::snapshot::model::Frame;
use vramscope_core::source::job::JobSource;
use vramscope_core::step_config::{Mode, Precision};
use vramscope_core::store::ranks::Ranks;
use vramscope_core::stream::{EngineInfo, Incoming, Report};

const MIB: u64 = 1 << 20;

/// What the shim would hold: events to drain, and each device's allocator counters.
#[derive(Clone, Default)]
struct FakeCuda {
    pending: Arc<Mutex<Vec<RawEvent>>>,
    /// The step and phase a phase mark stamps on what is recorded after it, as the shim's.
    tags: Arc<Mutex<(u32, u8)>>,
    stats: Arc<Mutex<BTreeMap<u8, CudaStats>>>,
}

impl FakeCuda {
    fn push(&self, device: u8, action: Action, addr: u64, size: u64) {
        let e = RawEvent { action: action as u8, addr, size, device, ..RawEvent::default() };
        self.pending.lock().unwrap().push(e);
    }

    fn counters(&self, device: u8, allocated: u64, reserved: u64) {
        self.stats.lock().unwrap().insert(device, CudaStats { allocated, reserved, ..CudaStats::default() });
    }
}

impl Capture for FakeCuda {
    fn now_ns(&self) -> u64 {
        1_000
    }
    fn drain(&self, out: &mut Vec<RawEvent>) {
        out.append(&mut self.pending.lock().unwrap());
    }
    fn set_tags(&self, _: u32, _: Phase) {}
    fn mark(&self, rec: &RawEvent) {
        if rec.action == RAW_MARK_PHASE {
            *self.tags.lock().unwrap() = (rec.step, rec.phase);
        }
        self.pending.lock().unwrap().push(*rec);
    }
    fn cuda_stats(&self, device: u8) -> Result<CudaStats, String> {
        self.stats.lock().unwrap().get(&device).copied().ok_or_else(|| "no such device".into())
    }
    fn cuda_snapshot(&self) -> Result<Vec<u8>, String> {
        Err("not needed here".into())
    }
    fn dropped(&self) -> u64 {
        0
    }
    fn cuda_pci_bus_id(&self, device: u8) -> Option<String> {
        Some(format!("00000000:{:02X}:00.0", 0x18 + device))
    }
}

fn socket(t: &tempfile::TempDir) -> PathBuf {
    let d = t.path().join("sockets");
    vramscope_core::channel::dir::ensure_private_dir(&d).unwrap();
    d.join("job-r0.sock")
}

/// A session as the hook starts one (its CPU tensors modelled until CUDA starts), with a
/// viewer attached before anything happens.
fn start(t: &tempfile::TempDir, capture: FakeCuda) -> (Session, JobSource, PathBuf) {
    let path = socket(t);
    let log: Log = Arc::new(|_: &str| {});
    let server = Server::bind(&Listen::Unix(path.clone()), 1 << 16, log.clone()).unwrap();
    let viewer = JobSource::attach("job".into(), &[(0, Endpoint::Unix(path.clone()))], None).unwrap();
    assert!(server.wait_for_viewer(Duration::from_secs(10)));
    let scopes = Arc::new(Scopes::new(Box::new(|_| {})));
    let info = EngineInfo { device: "cpu".into(), name: "train".into(), pid: 4242, ..EngineInfo::default() };
    let opts = SessionOptions {
        info,
        backend: Backend::Modelled(Box::new(CachingAllocatorModel::new(AllocatorConfig::default()))),
        snapshot_dir: t.path().to_path_buf(),
        runner_frame: Frame { name: "train".into(), filename: "train.py".into(), line: 0 },
        start_paused: false,
        announce_viewers: false,
        snapshot_trace_from_step: None,
    };
    let mut s = Session::new(Box::new(capture), scopes, server, opts, log);
    s.start(0);
    (s, viewer, path)
}

fn step_end() -> StepEnd {
    StepEnd { loss: Some(1.0), elapsed_s: 0.1, mode: Mode::Train, precision: Precision::Fp32, attention: None, checkpointing: None, ctx: 8, batch: 2 }
}

/// Everything `viewer` gets until the stream ends, into a screen's stores.
fn screen_of(viewer: &JobSource) -> (Ranks, Vec<Report>) {
    let mut ranks = Ranks::new(1 << 16);
    let mut reports = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        match viewer.receiver().recv_timeout(Duration::from_millis(200)) {
            Ok((rank, item)) => {
                if let Incoming::Report(r) = &item {
                    reports.push(r.clone());
                }
                let done = matches!(item, Incoming::Report(Report::Finished));
                ranks.ingest(rank, item);
                if done {
                    return (ranks, reports);
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(_) => break,
        }
    }
    panic!("the stream did not finish");
}

#[test]
fn every_device_the_job_allocates_on_is_shown_with_its_own_figures() {
    let t = tempfile::tempdir().unwrap();
    let cuda = FakeCuda::default();
    let (mut s, viewer, _) = start(&t, cuda.clone());
    // The job initialises CUDA; its model lives on cuda:1 (LOCAL_RANK says nothing of it),
    // and it also puts a buffer on cuda:0.
    s.follow_cuda();
    s.set_phase(Phase::Forward);
    cuda.push(1, Action::SegmentAlloc, 0x1_0000_0000, 20 * MIB);
    cuda.push(1, Action::Alloc, 0x1_0000_0000, 6 * MIB);
    cuda.push(0, Action::SegmentAlloc, 0x2_0000_0000, 2 * MIB);
    cuda.push(0, Action::Alloc, 0x2_0000_0000, 4096);
    cuda.counters(1, 6 * MIB, 20 * MIB);
    cuda.counters(0, 4096, 2 * MIB);
    s.set_phase(Phase::Backward);
    cuda.push(1, Action::Alloc, 0x1_0060_0000, 3 * MIB);
    cuda.push(1, Action::FreeRequested, 0x1_0060_0000, 3 * MIB);
    cuda.push(1, Action::FreeCompleted, 0x1_0060_0000, 3 * MIB);
    s.end_step(&step_end());
    s.finish();
    let (mut ranks, reports) = screen_of(&viewer);

    // The first device the job allocated on is the rank's own, named, with its bus id.
    let first = ranks.shown();
    let info = first.info.as_ref().unwrap();
    assert_eq!((info.device.as_str(), info.cuda, info.pci_bus_id.as_deref()), ("cuda:1", true, Some("00000000:19:00.0")));
    assert_eq!((first.history.live_total(), first.history.reserved()), (6 * MIB, 20 * MIB));
    // The other device is said, and shown on its own, not added in.
    assert!(
        reports.iter().any(|r| matches!(r, Report::Note(n) if n.contains("also allocates on cuda:0"))),
        "{reports:?}"
    );
    let summary = ranks.summary();
    assert_eq!((summary.devices.clone(), summary.device_shown, summary.count), (vec!["cuda:1".to_string(), "cuda:0".to_string()], 0, 1));
    ranks.next_device();
    let other = ranks.shown();
    assert_eq!(other.info.as_ref().unwrap().device, "cuda:0");
    assert_eq!((other.history.live_total(), other.history.reserved()), (4096, 2 * MIB));
    // Each device's step report carries its own peaks.
    let steps: Vec<(Option<u8>, u64)> = reports.iter().filter_map(|r| if let Report::Step(s) = r { Some((s.device, s.peak_active_bytes)) } else { None }).collect();
    assert_eq!(steps, [(Some(0), 4096), (None, 9 * MIB)]);
    ranks.next_device();
    assert_eq!(ranks.shown().info.as_ref().unwrap().device, "cuda:1", "wraps");
}

#[test]
fn a_viewer_that_attaches_late_gets_every_device_and_the_allocators_reserved_bytes() {
    let t = tempfile::tempdir().unwrap();
    let cuda = FakeCuda::default();
    let (mut s, first_viewer, path) = start(&t, cuda.clone());
    s.follow_cuda();
    s.set_phase(Phase::Forward);
    cuda.push(0, Action::SegmentAlloc, 0x1_0000_0000, 20 * MIB);
    cuda.push(0, Action::Alloc, 0x1_0000_0000, 5 * MIB);
    cuda.push(2, Action::SegmentAlloc, 0x3_0000_0000, 2 * MIB);
    cuda.push(2, Action::Alloc, 0x3_0000_0000, 1000);
    // The allocator also holds 40 MiB of segments made before the tracker attached.
    cuda.counters(0, 5 * MIB, 60 * MIB);
    cuda.counters(2, 1024, 2 * MIB);
    s.set_phase(Phase::Other);
    let late = JobSource::attach("job".into(), &[(0, Endpoint::Unix(path))], None).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.server().viewers() < 2 {
        s.flush();
        assert!(Instant::now() < deadline, "the late viewer was never let in");
        std::thread::sleep(Duration::from_millis(20));
    }
    s.finish();
    drop(first_viewer);
    let (mut ranks, _) = screen_of(&late);
    let shown = ranks.shown();
    assert_eq!(shown.info.as_ref().unwrap().device, "cuda:0");
    assert_eq!(shown.history.reserved(), 60 * MIB, "reserved is the allocator's, segments made before attaching included");
    assert_eq!(shown.history.live_total(), 5 * MIB);
    ranks.next_device();
    assert_eq!((ranks.shown().history.live_total(), ranks.shown().history.reserved()), (1000, 2 * MIB));
}

#[test]
fn what_the_jobs_thread_says_in_band_lands_where_it_was_said() {
    // The hook on a CPU job: phases, names and step ends go into the shim's buffer among
    // the allocator's events, and are processed only when the flusher drains.
    let t = tempfile::tempdir().unwrap();
    let cpu = FakeCuda::default();
    let (mut s, viewer, _) = start(&t, cpu.clone());
    let b = s.in_band(Box::new(cpu.clone()));
    let raw = |action: u8, addr: u64, size: u64| {
        let (step, phase) = *cpu.tags.lock().unwrap();
        cpu.pending.lock().unwrap().push(RawEvent { action, addr, size, step, phase, device: CPU_DEVICE, ..RawEvent::default() });
    };
    let grad = s.scopes.intern("grad of w");

    b.phase(0, Phase::Forward);
    raw(RAW_ALLOC, 0x10_0000, MIB);
    b.tag(0x10_0000, Category::Input, 0);
    raw(RAW_ALLOC, 0x20_0000, 4 * MIB);
    raw(RAW_FREE, 0x10_0000, 0);
    // The input's address is reused by an activation after the input was named: the name
    // belongs to the first tensor only.
    raw(RAW_ALLOC, 0x10_0000, MIB);
    b.phase(0, Phase::Backward);
    raw(RAW_FREE, 0x20_0000, 0);
    raw(RAW_ALLOC, 0x30_0000, 2 * MIB);
    b.tag(0x30_0000, Category::Gradient, grad);
    b.step_end(0, step_end());
    b.phase(1, Phase::Forward);
    raw(RAW_ALLOC, 0x40_0000, 8 * MIB);
    raw(RAW_FREE, 0x40_0000, 0);
    b.step_end(1, step_end());
    assert_eq!(s.tracker.active_bytes, 0, "nothing is processed on the job's thread");

    s.drain();
    assert_eq!(s.step, 1);
    s.finish();
    let (ranks, reports) = screen_of(&viewer);
    let steps: Vec<_> = reports.iter().filter_map(|r| if let Report::Step(s) = r { Some(s.clone()) } else { None }).collect();
    assert_eq!(steps.iter().map(|s| s.step).collect::<Vec<_>>(), [0, 1]);
    let phase_peaks = |i: usize| steps[i].phase_active_peak_bytes.iter().map(|(p, b)| (p.clone(), *b / MIB)).collect::<Vec<_>>();
    assert_eq!(phase_peaks(0), [("backward".to_string(), 3), ("forward".to_string(), 5)]);
    assert_eq!(phase_peaks(1), [("forward".to_string(), 11)]);
    assert_eq!(steps[0].category_bytes.iter().find(|(c, _)| *c == "input"), None, "the input was freed; its address's next tensor is not one");
    assert_eq!(steps[0].category_bytes.iter().find(|(c, _)| *c == "gradient").map(|(_, b)| *b), Some(2 * MIB));
    // The screen's store saw the same: the name on the gradient, the phases on the events.
    let shown = ranks.shown();
    assert_eq!(shown.history.live_total(), 3 * MIB);
    let live = shown.largest_live(10);
    assert!(live.iter().any(|a| a.size == 2 * MIB && a.category == Category::Gradient && a.phase == Phase::Backward && a.scope == grad), "{live:?}");
    assert!(live.iter().any(|a| a.size == MIB && a.category != Category::Input && a.phase == Phase::Forward), "{live:?}");
}
