//! The native core of vramscope's Python hook: inside a user's PyTorch job it hosts the
//! same producer session as vramscope's own engine, so the job streams the same events to
//! the same screens. The Python side (python/vramscope_hook) loads it with ctypes, compiles
//! and loads the capture shim against the job's own torch, and calls in at phase and step
//! boundaries; this core reaches the shim through the symbols it exports.
//!
//! Every entry point catches its own failures: a vramscope problem must never take the
//! user's job down. They return 0 on success, -1 with `vsh_last_error` otherwise.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use serde::Deserialize;

mod attach;
mod history;

use vramscope_core::allocator::{AllocatorConfig, CachingAllocatorModel};
use vramscope_core::event::{Category, Phase};
use vramscope_core::producer::raw::{CudaStats, RawEvent, CPU_DEVICE};
use vramscope_core::producer::scopes::Scopes;
use vramscope_core::producer::server::{Listen, Log, Server};
use vramscope_core::producer::session::{between_steps, lock, Flusher, Boundary, Capture, InBand, Session, SessionOptions, Shared, StepEnd};
use vramscope_core::producer::tracker::Backend;
use vramscope_core::snapshot::model::Frame;
use vramscope_core::step_config::{AutocastPolicy, Mode, Precision};
use vramscope_core::stream::{EngineInfo, Report};

/// How the Python side starts the core (JSON).
#[derive(Deserialize)]
struct Config {
    /// The capture shim the Python side built and loaded; None where it could not be built
    /// (then CUDA memory comes from PyTorch's history, see `history`).
    shim: Option<PathBuf>,
    /// Why there is no shim, or why it has no CUDA capture, as the Python side said it.
    #[serde(default)]
    shim_note: Option<String>,
    job: String,
    rank: u32,
    world_size: Option<u32>,
    socket_dir: Option<PathBuf>,
    /// TCP: `PORT` or `HOST:PORT`; the rank's port is that plus its local rank.
    listen: Option<String>,
    local_rank: u32,
    wait_for_viewer: bool,
    /// `vramscope attach --pid`: the hook comes out of the job when its viewers are gone.
    #[serde(default)]
    unhook_when_alone: bool,
    snapshot_dir: PathBuf,
    /// The script's name, for the header and snapshot names.
    name: String,
    /// "auto" (the device the job allocates on: CUDA once it initialises CUDA, else its
    /// CPU tensors, modelled), "cpu" (model the CPU tensors, whatever the job does) or
    /// "cuda:N" (only that CUDA device).
    device: String,
    alloc_conf: String,
    queue_batches: usize,
    /// torch sees a GPU: PYTORCH_CUDA_ALLOC_CONF is the real allocator's, not the model's.
    #[serde(default)]
    cuda_available: bool,
    /// Whose bf16 autocast policy CPU autocast regions follow while the GPU is modelled.
    #[serde(default)]
    autocast_policy: AutocastPolicy,
}

/// The settings of the GPU modelled from the job's CPU tensors, and what to say about them.
/// Where the job has CUDA, PYTORCH_CUDA_ALLOC_CONF is written for the real allocator (a key
/// newer than ours, `backend:cudaMallocAsync`): the model takes what it can and says so, and
/// capture goes on. On a CPU-only job the settings are the model's own, and a mistake in
/// them is the user's to fix.
fn model_config(conf: &str, cuda_available: bool) -> Result<(AllocatorConfig, Option<String>), String> {
    match AllocatorConfig::parse_conf(conf) {
        Ok(c) => Ok((c, None)),
        Err(e) if cuda_available => Ok((AllocatorConfig::default(), Some(format!("PYTORCH_CUDA_ALLOC_CONF: {e}: the CPU tensors before CUDA starts are modelled with PyTorch's default settings")))),
        Err(e) => Err(format!("PYTORCH_CUDA_ALLOC_CONF: {e}")),
    }
}

/// The shim's entry points, found by name in the library the Python side loaded.
struct ShimFns {
    install_cpu_allocator: extern "C" fn() -> c_int,
    remove_cpu_allocator: extern "C" fn(),
    dropped: extern "C" fn() -> u64,
    set_tags: extern "C" fn(u32, u8),
    mark: extern "C" fn(*const RawEvent),
    set_scope: extern "C" fn(u32),
    now_ns: extern "C" fn() -> u64,
    clock_zero_ns: extern "C" fn() -> u64,
    drain: extern "C" fn(*mut RawEvent, usize) -> usize,
    pending: extern "C" fn() -> usize,
    set_oom_callback: extern "C" fn(Option<extern "C" fn(u8, u64)>),
    last_error: extern "C" fn() -> *const c_char,
    cuda_attach: extern "C" fn() -> c_int,
    cuda_stats: extern "C" fn(c_int, *mut CudaStats) -> c_int,
    cuda_snapshot: extern "C" fn(*mut *mut c_char, *mut usize) -> c_int,
    cuda_pci_bus_id: extern "C" fn(c_int, *mut c_char, usize) -> c_int,
    free: extern "C" fn(*mut c_void),
    set_cuda_autocast_policy: extern "C" fn(bool),
    phases_in_place: extern "C" fn(bool),
}

impl ShimFns {
    fn load(path: &std::path::Path) -> Result<ShimFns, String> {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: dlopen/dlsym with NUL-terminated names; the library stays loaded (the
        // Python side holds it, and we never dlclose).
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW) };
        if h.is_null() {
            return Err(format!("cannot load the capture shim {}", path.display()));
        }
        fn sym<T: Copy>(h: *mut c_void, name: &str) -> Result<T, String> {
            let n = CString::new(name).expect("a symbol name");
            let p = unsafe { libc::dlsym(h, n.as_ptr()) };
            if p.is_null() {
                return Err(format!("the capture shim lacks {name}"));
            }
            // SAFETY: the shim exports `name` with exactly this signature (capture.h).
            Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
        }
        Ok(ShimFns {
            install_cpu_allocator: sym(h, "vs_install_cpu_allocator")?,
            remove_cpu_allocator: sym(h, "vs_remove_cpu_allocator")?,
            dropped: sym(h, "vs_dropped")?,
            set_tags: sym(h, "vs_set_tags")?,
            mark: sym(h, "vs_mark")?,
            set_scope: sym(h, "vs_set_scope")?,
            now_ns: sym(h, "vs_now_ns")?,
            clock_zero_ns: sym(h, "vs_clock_zero_ns")?,
            drain: sym(h, "vs_drain")?,
            pending: sym(h, "vs_pending")?,
            set_oom_callback: sym(h, "vs_set_oom_callback")?,
            last_error: sym(h, "vs_last_error")?,
            cuda_attach: sym(h, "vs_cuda_attach")?,
            cuda_stats: sym(h, "vs_cuda_stats")?,
            cuda_snapshot: sym(h, "vs_cuda_snapshot")?,
            cuda_pci_bus_id: sym(h, "vs_cuda_pci_bus_id")?,
            free: sym(h, "vs_free")?,
            set_cuda_autocast_policy: sym(h, "vs_set_cuda_autocast_policy")?,
            phases_in_place: sym(h, "vs_phases_in_place")?,
        })
    }

    /// The CPU tensors are no longer the modelled GPU: libtorch's own CPU allocator back, and
    /// CPU autocast's own op lists.
    fn stop_modelling(&self) {
        (self.phases_in_place)(false);
        (self.remove_cpu_allocator)();
        (self.set_cuda_autocast_policy)(false);
    }

    fn check(&self, rc: c_int) -> Result<(), String> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: a thread-local NUL-terminated string owned by the shim.
        Err(unsafe { CStr::from_ptr((self.last_error)()) }.to_string_lossy().into_owned())
    }
}

static SHIM: OnceLock<ShimFns> = OnceLock::new();

fn shim() -> Option<&'static ShimFns> {
    SHIM.get()
}

/// CLOCK_MONOTONIC nanoseconds (the shim's clock, and the viewer's).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Without a shim, the session's clock starts here.
static CLOCK_ZERO: OnceLock<u64> = OnceLock::new();

fn clock_zero_ns() -> u64 {
    match shim() {
        Some(s) => (s.clock_zero_ns)(),
        None => *CLOCK_ZERO.get_or_init(monotonic_ns),
    }
}

/// The loaded shim, as a producer session sees it.
struct Loaded;

impl Capture for Loaded {
    fn now_ns(&self) -> u64 {
        match shim() {
            Some(s) => (s.now_ns)(),
            None => monotonic_ns().saturating_sub(clock_zero_ns()),
        }
    }

    fn drain(&self, out: &mut Vec<RawEvent>) {
        if let Some(s) = shim() {
            drain_shim(s, out);
        }
        history::drain(out);
    }

    fn set_tags(&self, step: u32, phase: Phase) {
        if let Some(s) = shim() {
            (s.set_tags)(step, phase as u8);
        }
        history::set_tags(step, phase as u8);
    }

    fn mark(&self, rec: &RawEvent) {
        if let Some(s) = shim() {
            (s.mark)(rec);
        }
    }

    fn cuda_stats(&self, device: u8) -> Result<CudaStats, String> {
        if history::active() {
            return history::stats(device).ok_or_else(|| format!("no counters read for cuda:{device} yet"));
        }
        let s = shim().ok_or("no capture shim")?;
        let mut st = CudaStats::default();
        s.check((s.cuda_stats)(device as c_int, &mut st))?;
        Ok(st)
    }

    fn dropped(&self) -> u64 {
        shim().map_or(0, |s| (s.dropped)()) + history::dropped()
    }

    fn cuda_pci_bus_id(&self, device: u8) -> Option<String> {
        if history::active() {
            return history::bus_id(device);
        }
        let s = shim()?;
        let mut buf = [0 as c_char; 32];
        s.check((s.cuda_pci_bus_id)(device as c_int, buf.as_mut_ptr(), buf.len())).ok()?;
        // SAFETY: the shim wrote a NUL-terminated string into `buf`.
        Some(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
    }

    fn cuda_snapshot(&self) -> Result<Vec<u8>, String> {
        if history::active() {
            return history::snapshot();
        }
        let s = shim().ok_or("no capture shim")?;
        let (mut p, mut len) = (std::ptr::null_mut(), 0usize);
        s.check((s.cuda_snapshot)(&mut p, &mut len))?;
        // SAFETY: the shim malloc'd `len` bytes at `p`; copied, then freed with its free.
        let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, len) }.to_vec();
        (s.free)(p.cast());
        Ok(bytes)
    }
}

/// Everything the shim buffered, oldest first.
fn drain_shim(s: &ShimFns, out: &mut Vec<RawEvent>) {
        loop {
            let pending = (s.pending)();
            if pending == 0 {
                return;
            }
            let start = out.len();
            out.resize(start + pending, RawEvent::default());
            // SAFETY: `out` has `pending` slots from `start`.
            let n = (s.drain)(unsafe { out.as_mut_ptr().add(start) }, pending);
            out.truncate(start + n);
        }
}

/// A knob the script declared: its kind checks a viewer's values.
#[derive(Clone, Copy)]
enum KnobKind {
    Int,
    Float,
    Bool,
    Str,
}

/// Which device the hook follows (`Config::device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Follow {
    Auto,
    Cpu,
    Cuda(u8),
}

impl std::str::FromStr for Follow {
    type Err = String;
    fn from_str(s: &str) -> Result<Follow, String> {
        match s {
            "" | "auto" => Ok(Follow::Auto),
            "cpu" => Ok(Follow::Cpu),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Follow::Cuda)
                .ok_or_else(|| format!("device '{s}': expected auto, cpu or cuda:N")),
        }
    }
}

/// A job that catches its OOMs on purpose (a batch-size finder) must not pay a snapshot
/// for each: one per this long.
const OOM_SNAPSHOT_EVERY: Duration = Duration::from_secs(10);

struct Core {
    session: Shared,
    /// While the modelled CPU is followed: phases, names and step ends go in band (see
    /// `InBand`), so the job's thread neither models events nor waits for the flusher.
    /// CUDA's are said at once: the allocator's counters are read at each boundary.
    in_band: Option<InBand>,
    /// The step under way, as the job's thread counts it.
    step: u64,
    follow: Follow,
    /// When the last OOM snapshot was cut, and how many OOMs went without one since.
    last_oom_snapshot: Option<std::time::Instant>,
    oom_unsnapshotted: u64,
    /// Stopped before the session finishes (see `Flusher`).
    flusher: Flusher,
    scopes: Arc<Scopes>,
    knobs: HashMap<String, KnobKind>,
    /// Knob values as last read: they change only where declared and where a step's end
    /// applies a viewer's control, and reading them from the session waited on its lock,
    /// which the flusher holds while it models events (20 µs a step, issue 35).
    knob_values: HashMap<String, Option<String>>,
    name: String,
    rank: u32,
    /// Where the hook leaves the job once alone (`Config::unhook_when_alone`): since when
    /// no viewer has been there, and whether one ever came.
    alone: Option<Alone>,
}

impl Core {
    /// CUDA is followed from now on: what was said in band is processed first, and the
    /// session counts steps again.
    fn leave_in_band(&mut self) -> MutexGuard<'_, Session> {
        let mut s = lock(&self.session);
        if self.in_band.take().is_some() {
            s.drain();
            s.step = self.step;
        }
        s
    }
}

struct Alone {
    since: std::time::Instant,
    had_viewer: bool,
}

/// A viewer that went away comes back within this (a reconnect), or the hook leaves.
const ALONE_AFTER_VIEWER: Duration = Duration::from_secs(2);
/// The vramscope that attached never connected (it was killed, say): the hook leaves.
const ALONE_NEVER_VIEWED: Duration = Duration::from_secs(60);

impl Alone {
    /// Whether the hook should leave now, given how many viewers there are.
    fn leave(&mut self, viewers: usize, now: std::time::Instant) -> bool {
        if viewers > 0 {
            self.had_viewer = true;
            self.since = now;
            return false;
        }
        now.duration_since(self.since) > if self.had_viewer { ALONE_AFTER_VIEWER } else { ALONE_NEVER_VIEWED }
    }
}

static CORE: Mutex<Option<Core>> = Mutex::new(None);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    static KNOB_VALUE: RefCell<CString> = RefCell::new(CString::default());
}

fn fail(msg: String) -> c_int {
    LAST_ERROR.with(|e| *e.borrow_mut() = CString::new(msg.replace('\0', " ")).unwrap_or_default());
    -1
}

/// Runs `f` on the core, turning errors and panics into -1 and a message: nothing unwinds
/// into Python.
fn with_core(f: impl FnOnce(&mut Core) -> Result<(), String>) -> c_int {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut g = CORE.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_mut() {
            Some(core) => f(core),
            None => Err("vramscope's hook is not started".into()),
        }
    }));
    match r {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => fail(e),
        Err(_) => fail("vramscope's hook failed (a bug: please report it)".into()),
    }
}

fn cstr<'a>(p: *const c_char) -> Result<&'a str, String> {
    if p.is_null() {
        return Err("null string".into());
    }
    // SAFETY: the Python side passes NUL-terminated UTF-8 strings it keeps alive for the call.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|e| e.to_string())
}

/// `n` values the Python side passes at `p` and keeps alive for the call.
fn borrowed_slice<'a, T>(p: *const T, n: usize) -> Result<&'a [T], String> {
    if p.is_null() {
        return Err("null array".into());
    }
    // SAFETY: the Python side's ctypes array of `n` values, alive for the call.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// One value the Python side passes at `p` and keeps alive for the call.
fn borrowed<'a, T>(p: *const T) -> Result<&'a T, String> {
    // SAFETY: null or the Python side's ctypes structure, alive for the call.
    unsafe { p.as_ref() }.ok_or_else(|| "null pointer".into())
}

#[no_mangle]
pub extern "C" fn vsh_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// What an allocation failure gets: a snapshot (at most one per `OOM_SNAPSHOT_EVERY`),
/// nothing for a device the session does not follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OomAction {
    Snapshot,
    /// Said without a snapshot: one was cut moments ago.
    Skip,
    /// Another device's OOM: said with its device, without a snapshot (vramscope's hold
    /// the first device's trace).
    OtherDevice,
}

fn oom_action(followed: Option<u8>, device: u8, last: Option<std::time::Instant>, now: std::time::Instant) -> OomAction {
    if device != CPU_DEVICE && followed.is_some_and(|f| f != device) {
        OomAction::OtherDevice
    } else if last.is_some_and(|t| now.duration_since(t) < OOM_SNAPSHOT_EVERY) {
        OomAction::Skip
    } else {
        OomAction::Snapshot
    }
}

extern "C" fn on_oom(device: u8, requested: u64) {
    // On the allocating thread, before the error reaches the job's code: the snapshot shows
    // what held the memory the request did not fit in.
    let mut core = CORE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = core.as_mut() {
        let now = std::time::Instant::now();
        let mut s = lock(&c.session);
        match oom_action(s.followed_device(), device, c.last_oom_snapshot, now) {
            OomAction::Snapshot => {
                c.last_oom_snapshot = Some(now);
                let name = format!("{}_rank{}_step{}_oom.pickle", c.name, c.rank, c.step);
                let path = s.snapshot_now(&name);
                s.oom(requested, path, None);
            }
            OomAction::Skip => {
                c.oom_unsnapshotted += 1;
                let why = format!("no snapshot: one was cut less than {} s ago ({} OOMs without one)", OOM_SNAPSHOT_EVERY.as_secs(), c.oom_unsnapshotted);
                s.oom(requested, None, Some(&why));
            }
            OomAction::OtherDevice => {
                s.oom(requested, None, Some(&format!("on cuda:{device}; snapshots hold the job's first device")));
            }
        }
    }
}

fn start(cfg: Config) -> Result<Core, String> {
    if let Some(path) = &cfg.shim {
        let _ = SHIM.set(ShimFns::load(path)?);
    }
    let follow: Follow = cfg.device.parse()?;
    let in_band = !matches!(follow, Follow::Cuda(_)) && shim().is_some();
    let mut note = cfg.shim_note.clone();
    let backend = match follow {
        // Nothing to record until the job initialises CUDA (`vsh_cuda_initialised`).
        Follow::Cuda(d) => Backend::Cuda { device: d },
        Follow::Auto | Follow::Cpu => {
            let (alloc, said) = model_config(&cfg.alloc_conf, cfg.cuda_available && follow == Follow::Auto)?;
            note = note.or(said);
            // The modelled GPU's bf16 regions allocate as the chosen policy's lists say.
            if let Some(s) = shim() {
                (s.set_cuda_autocast_policy)(cfg.autocast_policy == AutocastPolicy::Cuda);
            }
            Backend::Modelled(Box::new(CachingAllocatorModel::new(alloc)))
        }
    };
    let log: Log = Arc::new(|line: &str| eprintln!("{line}"));
    let listen = Listen::for_job(cfg.socket_dir.as_deref(), cfg.listen.as_deref(), &cfg.job, cfg.rank, cfg.local_rank).map_err(|e| e.to_string())?;
    let server = Server::bind_job(&listen, &cfg.job, cfg.rank, cfg.queue_batches, log.clone()).map_err(|e| e.to_string())?;
    let info = EngineInfo {
        device: match follow {
            Follow::Cuda(d) => format!("cuda:{d}"),
            _ => "cpu".into(),
        },
        cuda: matches!(follow, Follow::Cuda(_)),
        parameters: 0,
        config: None,
        note,
        name: cfg.name.clone(),
        pid: std::process::id(),
        rank: Some(cfg.rank),
        world_size: cfg.world_size,
        host: vramscope_core::producer::host_name(),
        knobs: Vec::new(),
        clock_zero_ns: clock_zero_ns(),
        alloc_conf: cfg.alloc_conf.clone(),
        pci_bus_id: None,
        // Without a shim nothing applies a policy to CPU autocast: claim none.
        autocast: match follow {
            Follow::Cuda(_) => Some(AutocastPolicy::Cuda),
            _ => shim().map(|_| cfg.autocast_policy),
        },
    };
    let scopes = Arc::new(Scopes::new(Box::new(|id| {
        if let Some(s) = shim() {
            (s.set_scope)(id);
        }
    })));
    let runner = Frame { name: format!("{} (vramscope_hook)", cfg.name), filename: cfg.name.clone(), line: 0 };
    if cfg.wait_for_viewer {
        server.wait_for_viewer(Duration::from_secs(30));
    }
    let session = Session::new(
        Box::new(Loaded),
        scopes.clone(),
        server,
        SessionOptions { info, backend, snapshot_dir: cfg.snapshot_dir, runner_frame: runner, start_paused: false, announce_viewers: !cfg.wait_for_viewer, snapshot_trace_from_step: None },
        log,
    );
    let session = Arc::new(Mutex::new(session));
    // Last: a start that failed before this point leaves libtorch's allocator untouched.
    if let Some(s) = shim() {
        if !matches!(follow, Follow::Cuda(_)) {
            s.check((s.install_cpu_allocator)())?;
        }
    }
    lock(&session).start(0);
    let in_band = in_band.then(|| lock(&session).in_band(Box::new(Loaded)));
    if let Some(s) = shim().filter(|_| in_band.is_some()) {
        // The host's thread writes phases in the shim's slot (see `vsh_phase`).
        (s.phases_in_place)(true);
    }
    let flusher = Flusher::spawn(&session);
    if let Some(s) = shim() {
        (s.set_oom_callback)(Some(on_oom));
    }
    Ok(Core {
        session,
        in_band,
        step: 0,
        follow,
        last_oom_snapshot: None,
        oom_unsnapshotted: 0,
        flusher,
        scopes,
        knobs: HashMap::new(),
        knob_values: HashMap::new(),
        name: cfg.name,
        rank: cfg.rank,
        alone: cfg.unhook_when_alone.then(|| Alone { since: std::time::Instant::now(), had_viewer: false }),
    })
}

/// The job initialised CUDA (the Python side's `torch.cuda._lazy_call`, which runs at lazy
/// init, or at once when it is done): the caching allocator's per-device allocators exist
/// now, so the tracker attaches to them, and the CPU wrapper goes (CPU tensors are not
/// device memory). Returns -1 with the reason when CUDA's memory cannot be followed.
#[no_mangle]
pub extern "C" fn vsh_cuda_initialised() -> c_int {
    with_core(|c| {
        if c.follow == Follow::Cpu {
            return Ok(());
        }
        // On failure the Python side falls back to PyTorch's memory history.
        let s = shim().ok_or("no capture shim")?;
        s.check((s.cuda_attach)())?;
        s.stop_modelling();
        c.leave_in_band().follow_cuda();
        Ok(())
    })
}

/// The job initialised CUDA and its memory comes from PyTorch's history (`history`): the
/// session follows CUDA from now on, fed by `vsh_history_push`. `snapshot` gives PyTorch's
/// pickled snapshot when one is cut.
#[no_mangle]
pub extern "C" fn vsh_history_start(snapshot: Option<history::SnapshotFn>, why: *const c_char) -> c_int {
    with_core(|c| {
        let why = cstr(why)?;
        history::start(snapshot);
        if let Some(s) = shim() {
            s.stop_modelling();
        }
        let mut session = c.leave_in_band();
        session.follow_cuda();
        session.report(Report::Note(format!("{why}: CUDA memory comes from PyTorch's memory history, read at every phase boundary")));
        Ok(())
    })
}

/// An allocation (or, `action` 2, its free) the job made before the hook came, as found
/// in its objects or PyTorch's snapshot (`vramscope attach --pid`); c10's action numbering,
/// `device` 255 for CPU. Tag it with `vsh_tag` to name it.
#[no_mangle]
pub extern "C" fn vsh_seed(action: u8, addr: u64, size: u64, device: u8) -> c_int {
    with_core(|_| {
        history::seed(action, addr, size, device, Loaded.now_ns());
        Ok(())
    })
}

/// A line for the screen's event log (what an attach learned, say).
#[no_mangle]
pub extern "C" fn vsh_note(text: *const c_char) -> c_int {
    with_core(|c| {
        lock(&c.session).report(Report::Note(cstr(text)?.to_string()));
        Ok(())
    })
}

/// Trace entries read from PyTorch's history, oldest first.
#[no_mangle]
pub extern "C" fn vsh_history_push(entries: *const history::HistoryEntry, n: usize) -> c_int {
    with_core(|_| {
        if n == 0 {
            return Ok(());
        }
        let entries = borrowed_slice(entries, n)?;
        let epoch_now_us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64);
        history::push(entries, Loaded.now_ns(), epoch_now_us);
        Ok(())
    })
}

/// The caching allocator's counters for `device` (torch.cuda.memory_stats), as read with
/// the entries; `dropped`: entries the history's ring lost before this read.
#[no_mangle]
pub extern "C" fn vsh_history_stats(device: u8, stats: *const CudaStats, dropped: u64) -> c_int {
    with_core(|_| {
        let st = borrowed(stats)?;
        history::set_stats(device, *st);
        history::add_dropped(dropped);
        Ok(())
    })
}

/// CUDA device `device`'s PCI bus id as NVML spells it, which finds its readings.
#[no_mangle]
pub extern "C" fn vsh_history_bus_id(device: u8, id: *const c_char) -> c_int {
    with_core(|_| {
        history::set_bus_id(device, cstr(id)?.to_string());
        Ok(())
    })
}

/// Starts the core from its JSON config. Call once, right after torch is imported.
#[no_mangle]
pub extern "C" fn vsh_start(config_json: *const c_char) -> c_int {
    let r = std::panic::catch_unwind(|| -> Result<(), String> {
        let cfg: Config = serde_json::from_str(cstr(config_json)?).map_err(|e| format!("hook config: {e}"))?;
        let core = start(cfg)?;
        *CORE.lock().unwrap_or_else(|e| e.into_inner()) = Some(core);
        Ok(())
    });
    match r {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => fail(e),
        Err(_) => fail("vramscope's hook failed to start (a bug: please report it)".into()),
    }
}

/// The id of a module scope or an allocation name (interned once).
#[no_mangle]
pub extern "C" fn vsh_intern(name: *const c_char) -> u32 {
    let mut id = 0;
    let rc = with_core(|c| {
        id = c.scopes.intern(cstr(name)?);
        Ok(())
    });
    if rc == 0 {
        id
    } else {
        0
    }
}

/// A phase boundary (Phase's numbering). While the modelled CPU is followed, a host may
/// instead write the phase in the shim's slot (`vs_phase_slot`, 0xff while it may not).
#[no_mangle]
pub extern "C" fn vsh_phase(phase: u8) -> c_int {
    with_core(|c| {
        match &c.in_band {
            Some(b) => b.phase(c.step, Phase::from_u8(phase)),
            None => lock(&c.session).set_phase(Phase::from_u8(phase)),
        }
        Ok(())
    })
}

/// Names what the allocation at `addr` holds (Category's numbering), and what it is called
/// (null: keep its module scope).
#[no_mangle]
pub extern "C" fn vsh_tag(addr: u64, category: u8, name: *const c_char) -> c_int {
    with_core(|c| {
        let name = if name.is_null() { 0 } else { c.scopes.intern(cstr(name)?) };
        tag(c, Category::from_u8(category), &[addr], &[name]);
        Ok(())
    })
}

/// `vsh_tag` for `n` allocations at once, all holding `category`, each called by an
/// interned name (`vsh_intern`; 0: keep its module scope): a model's gradients, new every
/// step, took a call each, and each call cost the job's thread microseconds (issue 35).
#[no_mangle]
pub extern "C" fn vsh_tag_many(category: u8, addrs: *const u64, names: *const u32, n: usize) -> c_int {
    with_core(|c| {
        tag(c, Category::from_u8(category), borrowed_slice(addrs, n)?, borrowed_slice(names, n)?);
        Ok(())
    })
}

fn tag(c: &Core, category: Category, addrs: &[u64], names: &[u32]) {
    let named = addrs.iter().zip(names);
    // An attach's seeds wait outside the shim's buffer: a name for one follows them.
    match c.in_band.as_ref().filter(|_| !history::seeding()) {
        Some(b) => named.for_each(|(a, id)| b.tag(*a, category, *id)),
        None => {
            let mut s = lock(&c.session);
            s.drain();
            named.for_each(|(a, id)| s.tag_scope(*a, category, *id));
        }
    }
}

/// The job's parameter count, once its model is known.
#[no_mangle]
pub extern "C" fn vsh_set_parameters(n: i64) -> c_int {
    with_core(|c| {
        lock(&c.session).set_parameters(n);
        Ok(())
    })
}

/// Declares a knob with its default (`kind`: "int", "float", "bool" or "str").
#[no_mangle]
pub extern "C" fn vsh_declare_knob(name: *const c_char, value: *const c_char, kind: *const c_char) -> c_int {
    with_core(|c| {
        let kind = match cstr(kind)? {
            "int" => KnobKind::Int,
            "float" => KnobKind::Float,
            "bool" => KnobKind::Bool,
            _ => KnobKind::Str,
        };
        let name = cstr(name)?;
        c.knobs.insert(name.to_string(), kind);
        c.knob_values.remove(name);
        lock(&c.session).declare_knob(name, cstr(value)?);
        Ok(())
    })
}

/// A knob's value now (valid until the next call on this thread); null if undeclared.
#[no_mangle]
pub extern "C" fn vsh_knob(name: *const c_char) -> *const c_char {
    let mut value = None;
    with_core(|c| {
        let name = cstr(name)?;
        value = match c.knob_values.get(name) {
            Some(v) => v.clone(),
            None => {
                let v = lock(&c.session).info().knob(name).map(str::to_string);
                c.knob_values.insert(name.to_string(), v.clone());
                v
            }
        };
        Ok(())
    });
    match value {
        Some(v) => KNOB_VALUE.with(|k| {
            *k.borrow_mut() = CString::new(v).unwrap_or_default();
            k.borrow().as_ptr()
        }),
        None => std::ptr::null(),
    }
}

fn check_knob(kind: KnobKind, value: &str) -> Result<String, String> {
    match kind {
        KnobKind::Int => value.parse::<i64>().map(|v| v.to_string()).map_err(|e| e.to_string()),
        KnobKind::Float => value.parse::<f64>().map(|v| v.to_string()).map_err(|e| e.to_string()),
        KnobKind::Bool => match value {
            "true" | "True" | "1" => Ok("True".into()),
            "false" | "False" | "0" => Ok("False".into()),
            v => Err(format!("'{v}' is not true or false")),
        },
        KnobKind::Str => Ok(value.to_string()),
    }
}

/// Ends a step (one `optimizer.step()`): reports it, writes a snapshot a viewer asked for,
/// then applies viewers' controls, waiting here while the job is paused. `mode`: 0 forward
/// only, 1 train; `precision`: 0 fp32, 1 bf16, 2 fp16. Returns 1 if a viewer asked the job to stop,
/// 2 if the hook should come out of the job (attached by PID, and its viewers are gone), plus
/// 4 where a viewer's control changed a knob (what `vsh_knob` said before no longer holds).
#[no_mangle]
pub extern "C" fn vsh_step_end(loss: f64, loss_read: u8, elapsed_s: f64, ctx: i64, batch: i64, mode: u8, precision: u8) -> c_int {
    let mut session = None;
    let mut kinds = HashMap::new();
    let mut leave = false;
    let rc = with_core(|c| {
        let end = StepEnd {
            loss: (loss_read == 1).then_some(loss),
            elapsed_s,
            mode: if mode == 1 { Mode::Train } else { Mode::Forward },
            precision: match precision {
                1 => Precision::Bf16,
                2 => Precision::Fp16,
                _ => Precision::Fp32,
            },
            attention: None,
            checkpointing: None,
            ctx,
            batch,
        };
        let step = c.step;
        c.step += 1;
        let snapshot_name = |c: &Core| format!("{}_rank{}_step{step}.pickle", c.name, c.rank);
        let now = std::time::Instant::now();
        match &c.in_band {
            Some(b) => {
                if let Some(alone) = c.alone.as_mut() {
                    leave = alone.leave(b.viewers(), now);
                }
                b.step_end(step, end);
                if b.take_snapshot_request() {
                    let mut s = lock(&c.session);
                    s.drain();
                    s.snapshot(&snapshot_name(c));
                }
                if b.nothing_between() {
                    return Ok(());
                }
            }
            None => {
                let mut s = lock(&c.session);
                if let Some(alone) = c.alone.as_mut() {
                    leave = alone.leave(s.server().viewers(), now);
                }
                s.end_step(&end);
                if s.take_snapshot_request() {
                    s.snapshot(&snapshot_name(c));
                }
                s.step += 1;
            }
        }
        session = Some(c.session.clone());
        kinds = c.knobs.clone();
        Ok(())
    });
    if rc != 0 {
        return rc;
    }
    if leave {
        return 2;
    }
    // Without the core's lock: the wait may be long, and the OOM handler and the Python
    // side's other threads need the core meanwhile.
    let Some(session) = session else {
        return 0;
    };
    let mut changed = false;
    let boundary = between_steps(&session, &mut |name, value| {
        let to = match kinds.get(name) {
            Some(k) => check_knob(*k, value).map_err(|e| format!("knob {name}: {e}")),
            None => Err(format!("this job declares no knob '{name}' (declare it with vramscope_hook.knob)")),
        };
        changed |= to.is_ok();
        to
    });
    if changed {
        with_core(|c| {
            c.knob_values.clear();
            Ok(())
        });
    }
    i32::from(boundary == Boundary::Stop) | if changed { 4 } else { 0 }
}

/// The job is dying of an out-of-memory error the caching allocator never saw (cuBLAS's
/// workspace, cuDNN, NCCL): said like an allocator OOM, without a snapshot.
#[no_mangle]
pub extern "C" fn vsh_foreign_oom(message: *const c_char) -> c_int {
    with_core(|c| {
        let message = cstr(message)?.to_string();
        lock(&c.session).report_oom(message, None);
        Ok(())
    })
}

/// Ends the stream (the job is exiting): snapshots being written finish, viewers get the end.
#[no_mangle]
pub extern "C" fn vsh_finish() -> c_int {
    let core = CORE.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(c) = core {
        if let Some(s) = shim() {
            (s.set_oom_callback)(None);
            // Whatever ends the session (the job's exit, a start that failed after this
            // point) leaves libtorch's own CPU allocator in place.
            s.stop_modelling();
        }
        drop(c.flusher);
        lock(&c.session).finish();
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attached_hook_leaves_once_its_viewers_are_gone() {
        let t0 = std::time::Instant::now();
        let mut a = Alone { since: t0, had_viewer: false };
        // Waiting for the vramscope that attached to connect.
        assert!(!a.leave(0, t0 + Duration::from_secs(30)));
        assert!(!a.leave(1, t0 + Duration::from_secs(31)));
        // A viewer's reconnect is not a departure; a departure is.
        assert!(!a.leave(0, t0 + Duration::from_secs(32)));
        assert!(a.leave(0, t0 + Duration::from_secs(34)));
        // One that never came: the hook leaves after a minute.
        let mut never = Alone { since: t0, had_viewer: false };
        assert!(never.leave(0, t0 + Duration::from_secs(61)));
    }

    #[test]
    fn knob_values_are_checked_against_their_kind() {
        assert_eq!(check_knob(KnobKind::Int, "512"), Ok("512".into()));
        assert!(check_knob(KnobKind::Int, "5.5").is_err());
        assert_eq!(check_knob(KnobKind::Float, "3e-4"), Ok("0.0003".into()));
        assert_eq!(check_knob(KnobKind::Bool, "true"), Ok("True".into()));
        assert!(check_knob(KnobKind::Bool, "yes").unwrap_err().contains("not true or false"));
    }

    #[test]
    fn the_device_setting_is_auto_cpu_or_one_cuda_device() {
        assert_eq!("auto".parse(), Ok(Follow::Auto));
        assert_eq!("".parse(), Ok(Follow::Auto));
        assert_eq!("cpu".parse(), Ok(Follow::Cpu));
        assert_eq!("cuda:1".parse(), Ok(Follow::Cuda(1)));
        assert_eq!("cuda".parse::<Follow>(), Err("device 'cuda': expected auto, cpu or cuda:N".into()));
    }

    #[test]
    fn a_cuda_jobs_allocator_settings_never_stop_the_capture() {
        let (c, note) = model_config("expandable_segments:True", true).unwrap();
        assert!(c.expandable_segments && note.is_none());
        // Real settings the model does not know: said, and the defaults modelled.
        for conf in ["backend:cudaMallocAsync", "pinned_use_background_threads:True,some_new_key:1"] {
            let (c, note) = model_config(conf, true).unwrap();
            assert_eq!(c, AllocatorConfig::default(), "{conf}");
            assert!(note.unwrap().contains("default settings"), "{conf}");
        }
        // Without CUDA the settings are the modelled GPU's own: a mistake is refused.
        assert!(model_config("some_new_key:1", false).unwrap_err().contains("some_new_key"));
    }

    #[test]
    fn ooms_are_snapshotted_once_per_window_and_only_for_the_device_followed() {
        let t0 = std::time::Instant::now();
        assert_eq!(oom_action(Some(0), 0, None, t0), OomAction::Snapshot);
        // A batch-size finder's next OOMs, moments later, are said without one.
        assert_eq!(oom_action(Some(0), 0, Some(t0), t0 + Duration::from_secs(1)), OomAction::Skip);
        assert_eq!(oom_action(Some(0), 0, Some(t0), t0 + OOM_SNAPSHOT_EVERY), OomAction::Snapshot);
        // Another GPU's OOM is not this one's.
        assert_eq!(oom_action(Some(0), 1, None, t0), OomAction::OtherDevice);
        // The CPU's own (modelled) OOM, and a CUDA OOM before the device is known, are ours.
        assert_eq!(oom_action(None, CPU_DEVICE, None, t0), OomAction::Snapshot);
        assert_eq!(oom_action(None, 2, None, t0), OomAction::Snapshot);
    }

    #[test]
    fn calls_before_start_fail_with_a_message_not_a_crash() {
        assert_eq!(vsh_phase(1), -1);
        let msg = unsafe { CStr::from_ptr(vsh_last_error()) }.to_string_lossy().into_owned();
        assert_eq!(msg, "vramscope's hook is not started");
        assert!(vsh_knob(c"ctx".as_ptr()).is_null());
    }
}
