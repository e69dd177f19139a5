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
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde::Deserialize;

use vramscope::allocator::{AllocatorConfig, CachingAllocatorModel};
use vramscope::event::{Category, Phase};
use vramscope::producer::raw::{CudaStats, RawEvent};
use vramscope::producer::scopes::Scopes;
use vramscope::producer::server::{Listen, Log, Server};
use vramscope::producer::session::{between_steps, lock, Flusher, Boundary, Capture, Session, SessionOptions, Shared, StepEnd};
use vramscope::producer::tracker::Backend;
use vramscope::snapshot::model::Frame;
use vramscope::step_config::{Mode, Precision};
use vramscope::stream::EngineInfo;

/// How the Python side starts the core (JSON).
#[derive(Deserialize)]
struct Config {
    /// The capture shim the Python side built and loaded.
    shim: PathBuf,
    job: String,
    rank: u32,
    world_size: Option<u32>,
    socket_dir: Option<PathBuf>,
    /// TCP: `PORT` or `HOST:PORT`; the rank's port is that plus its local rank.
    listen: Option<String>,
    local_rank: u32,
    wait_for_viewer: bool,
    snapshot_dir: PathBuf,
    /// The script's name, for the header and snapshot names.
    name: String,
    /// "cpu" or "cuda:N".
    device: String,
    alloc_conf: String,
    queue_batches: usize,
}

/// The shim's entry points, found by name in the library the Python side loaded.
struct ShimFns {
    install_cpu_allocator: extern "C" fn() -> c_int,
    set_tags: extern "C" fn(u32, u8),
    set_scope: extern "C" fn(u32),
    now_ns: extern "C" fn() -> u64,
    clock_zero_ns: extern "C" fn() -> u64,
    drain: extern "C" fn(*mut RawEvent, usize) -> usize,
    pending: extern "C" fn() -> usize,
    set_oom_callback: extern "C" fn(Option<extern "C" fn(u64)>),
    last_error: extern "C" fn() -> *const c_char,
    cuda_attach: extern "C" fn(i64) -> c_int,
    cuda_stats: extern "C" fn(c_int, *mut CudaStats) -> c_int,
    cuda_reset_peaks: extern "C" fn(c_int) -> c_int,
    cuda_snapshot: extern "C" fn(*mut *mut c_char, *mut usize) -> c_int,
    free: extern "C" fn(*mut c_void),
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
            set_tags: sym(h, "vs_set_tags")?,
            set_scope: sym(h, "vs_set_scope")?,
            now_ns: sym(h, "vs_now_ns")?,
            clock_zero_ns: sym(h, "vs_clock_zero_ns")?,
            drain: sym(h, "vs_drain")?,
            pending: sym(h, "vs_pending")?,
            set_oom_callback: sym(h, "vs_set_oom_callback")?,
            last_error: sym(h, "vs_last_error")?,
            cuda_attach: sym(h, "vs_cuda_attach")?,
            cuda_stats: sym(h, "vs_cuda_stats")?,
            cuda_reset_peaks: sym(h, "vs_cuda_reset_peaks")?,
            cuda_snapshot: sym(h, "vs_cuda_snapshot")?,
            free: sym(h, "vs_free")?,
        })
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

fn shim() -> &'static ShimFns {
    SHIM.get().expect("vsh_start loaded the shim")
}

/// The loaded shim, as a producer session sees it.
struct Loaded;

impl Capture for Loaded {
    fn now_ns(&self) -> u64 {
        (shim().now_ns)()
    }

    fn drain(&self, out: &mut Vec<RawEvent>) {
        let s = shim();
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

    fn set_tags(&self, step: u32, phase: Phase) {
        (shim().set_tags)(step, phase as u8)
    }

    fn cuda_stats(&self, device: u8) -> Result<CudaStats, String> {
        let mut st = CudaStats::default();
        shim().check((shim().cuda_stats)(device as c_int, &mut st))?;
        Ok(st)
    }

    fn cuda_reset_peaks(&self, device: u8) -> Result<(), String> {
        shim().check((shim().cuda_reset_peaks)(device as c_int))
    }

    fn cuda_snapshot(&self) -> Result<Vec<u8>, String> {
        let s = shim();
        let (mut p, mut len) = (std::ptr::null_mut(), 0usize);
        s.check((s.cuda_snapshot)(&mut p, &mut len))?;
        // SAFETY: the shim malloc'd `len` bytes at `p`; copied, then freed with its free.
        let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, len) }.to_vec();
        (s.free)(p.cast());
        Ok(bytes)
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

struct Core {
    session: Shared,
    /// Stopped before the session finishes (see `Flusher`).
    flusher: Flusher,
    scopes: Arc<Scopes>,
    knobs: HashMap<String, KnobKind>,
    name: String,
    rank: u32,
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

#[no_mangle]
pub extern "C" fn vsh_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

extern "C" fn on_oom(requested: u64) {
    // On the allocating thread, before the error reaches the job's code: the snapshot shows
    // what held the memory the request did not fit in.
    let core = CORE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = core.as_ref() {
        let mut s = lock(&c.session);
        let name = format!("{}_rank{}_step{}_oom.pickle", c.name, c.rank, s.step);
        let path = s.snapshot_now(&name);
        s.oom(requested, path);
    }
}

fn start(cfg: Config) -> Result<Core, String> {
    let fns = ShimFns::load(&cfg.shim)?;
    fns.check((fns.install_cpu_allocator)())?;
    let _ = SHIM.set(fns);
    let s = shim();
    let cuda_device = cfg.device.strip_prefix("cuda:").map(|n| n.parse::<u8>().map_err(|e| format!("device {}: {e}", cfg.device))).transpose()?;
    let alloc = AllocatorConfig::parse_conf(&cfg.alloc_conf).map_err(|e| format!("PYTORCH_CUDA_ALLOC_CONF: {e}"))?;
    let backend = match cuda_device {
        Some(d) => {
            s.check((s.cuda_attach)(0))?;
            Backend::Cuda { device: d }
        }
        None => Backend::Modelled(Box::new(CachingAllocatorModel::new(alloc))),
    };
    let log: Log = Arc::new(|line: &str| eprintln!("{line}"));
    let listen = Listen::for_job(cfg.socket_dir.as_deref(), cfg.listen.as_deref(), &cfg.job, cfg.rank, cfg.local_rank).map_err(|e| e.to_string())?;
    let server = Server::bind_job(&listen, &cfg.job, cfg.rank, cfg.queue_batches, log.clone()).map_err(|e| e.to_string())?;
    let info = EngineInfo {
        device: cfg.device.clone(),
        cuda: cuda_device.is_some(),
        parameters: 0,
        config: None,
        note: None,
        name: cfg.name.clone(),
        pid: std::process::id(),
        rank: Some(cfg.rank),
        world_size: cfg.world_size,
        host: vramscope::producer::host_name(),
        knobs: Vec::new(),
        clock_zero_ns: (s.clock_zero_ns)(),
        alloc_conf: cfg.alloc_conf.clone(),
    };
    let scopes = Arc::new(Scopes::new(Box::new(|id| (shim().set_scope)(id))));
    let runner = Frame { name: format!("{} (vramscope_hook)", cfg.name), filename: cfg.name.clone(), line: 0 };
    if cfg.wait_for_viewer {
        server.wait_for_viewer(Duration::from_secs(30));
    }
    let session = Session::new(
        Box::new(Loaded),
        scopes.clone(),
        server,
        SessionOptions { info, backend, snapshot_dir: cfg.snapshot_dir, runner_frame: runner, start_paused: false, announce_viewers: !cfg.wait_for_viewer },
        log,
    );
    let session = Arc::new(Mutex::new(session));
    lock(&session).start(0);
    let flusher = Flusher::spawn(&session);
    (s.set_oom_callback)(Some(on_oom));
    Ok(Core { session, flusher, scopes, knobs: HashMap::new(), name: cfg.name, rank: cfg.rank })
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

/// A phase boundary (Phase's numbering).
#[no_mangle]
pub extern "C" fn vsh_phase(phase: u8) -> c_int {
    with_core(|c| {
        lock(&c.session).set_phase(Phase::from_u8(phase));
        Ok(())
    })
}

/// Names what the allocation at `addr` holds (Category's numbering), and what it is called
/// (null: keep its module scope).
#[no_mangle]
pub extern "C" fn vsh_tag(addr: u64, category: u8, name: *const c_char) -> c_int {
    with_core(|c| {
        let name = if name.is_null() { None } else { Some(cstr(name)?) };
        let mut s = lock(&c.session);
        s.drain();
        s.tag(addr, Category::from_u8(category), name);
        Ok(())
    })
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
        lock(&c.session).declare_knob(name, cstr(value)?);
        Ok(())
    })
}

/// A knob's value now (valid until the next call on this thread); null if undeclared.
#[no_mangle]
pub extern "C" fn vsh_knob(name: *const c_char) -> *const c_char {
    let mut value = None;
    with_core(|c| {
        value = lock(&c.session).info().knob(cstr(name)?).map(str::to_string);
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
/// only, 1 train; `precision`: 0 fp32, 1 bf16. Returns 1 if a viewer asked the job to stop.
#[no_mangle]
pub extern "C" fn vsh_step_end(loss: f64, elapsed_s: f64, ctx: i64, batch: i64, mode: u8, precision: u8) -> c_int {
    let mut session = None;
    let mut kinds = HashMap::new();
    let rc = with_core(|c| {
        let mut s = lock(&c.session);
        let end = StepEnd {
            loss,
            elapsed_s,
            mode: if mode == 1 { Mode::Train } else { Mode::Forward },
            precision: if precision == 1 { Precision::Bf16 } else { Precision::Fp32 },
            attention: None,
            ctx,
            batch,
        };
        s.end_step(&end);
        if s.take_snapshot_request() {
            let name = format!("{}_rank{}_step{}.pickle", c.name, c.rank, s.step);
            s.snapshot(&name);
        }
        s.step += 1;
        session = Some(c.session.clone());
        kinds = c.knobs.clone();
        Ok(())
    });
    if rc != 0 {
        return rc;
    }
    // Without the core's lock: the wait may be long, and the OOM handler and the Python
    // side's other threads need the core meanwhile.
    let session = session.expect("set above");
    let boundary = between_steps(&session, &mut |name, value| match kinds.get(name) {
        Some(k) => check_knob(*k, value).map_err(|e| format!("knob {name}: {e}")),
        None => Err(format!("this job declares no knob '{name}' (declare it with vramscope_hook.knob)")),
    });
    i32::from(boundary == Boundary::Stop)
}

/// Ends the stream (the job is exiting): snapshots being written finish, viewers get the end.
#[no_mangle]
pub extern "C" fn vsh_finish() -> c_int {
    let core = CORE.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(c) = core {
        (shim().set_oom_callback)(None);
        drop(c.flusher);
        lock(&c.session).finish();
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knob_values_are_checked_against_their_kind() {
        assert_eq!(check_knob(KnobKind::Int, "512"), Ok("512".into()));
        assert!(check_knob(KnobKind::Int, "5.5").is_err());
        assert_eq!(check_knob(KnobKind::Float, "3e-4"), Ok("0.0003".into()));
        assert_eq!(check_knob(KnobKind::Bool, "true"), Ok("True".into()));
        assert!(check_knob(KnobKind::Bool, "yes").unwrap_err().contains("not true or false"));
    }

    #[test]
    fn calls_before_start_fail_with_a_message_not_a_crash() {
        assert_eq!(vsh_phase(1), -1);
        let msg = unsafe { CStr::from_ptr(vsh_last_error()) }.to_string_lossy().into_owned();
        assert_eq!(msg, "vramscope's hook is not started");
        assert!(vsh_knob(c"ctx".as_ptr()).is_null());
    }
}
