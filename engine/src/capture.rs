//! FFI to the C++ capture shim (python/vramscope_hook/csrc/, linked into this binary): the
//! recording CPU allocator, the CUDA trace tracker, step/phase/scope tags, CPU bf16
//! autocast, and the out-of-memory callback. `Shim` is the session's view of it.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int};
use std::sync::OnceLock;

use vramscope_core::event::Phase;
use vramscope_core::producer::raw::{CudaStats, RawEvent};
use vramscope_core::producer::session::Capture;

/// Called with the device (`CPU_DEVICE` for the CPU) and the requested bytes when an
/// allocation fails, before the error unwinds.
type OomCallback = extern "C" fn(u8, u64);

extern "C" {
    fn vs_install_cpu_allocator() -> c_int;
    fn vs_set_tags(step: u32, phase: u8);
    fn vs_mark(rec: *const RawEvent);
    fn vs_set_scope(scope: u32);
    fn vs_set_capture_enabled(on: bool);
    fn vs_now_ns() -> u64;
    fn vs_clock_zero_ns() -> u64;
    fn vs_drain(out: *mut RawEvent, cap: usize) -> usize;
    fn vs_pending() -> usize;
    fn vs_dropped() -> u64;
    fn vs_set_oom_callback(cb: Option<OomCallback>);
    fn vs_autocast(device_type: c_int, enabled: bool, fp16: bool) -> c_int;
    fn vs_amp_unscale(grads: *const *const torch_sys::C_tensor, n: c_int, found_inf: *const torch_sys::C_tensor, inv_scale: *const torch_sys::C_tensor) -> c_int;
    fn vs_set_cuda_autocast_policy(on: bool);
    fn vs_last_error() -> *const c_char;
    fn vs_clear_grad(t: *const torch_sys::C_tensor);
    fn vs_backward(t: *const torch_sys::C_tensor, grad: *const torch_sys::C_tensor) -> c_int;
    fn vs_cuda_compiled() -> c_int;
    fn vs_cuda_init() -> c_int;
    fn vs_cuda_attach() -> c_int;
    fn vs_cuda_record_history(entries: i64) -> c_int;
    fn vs_cuda_pci_bus_id(device: c_int, out: *mut c_char, len: usize) -> c_int;
    fn vs_cuda_stats(device: c_int, out: *mut CudaStats) -> c_int;
    fn vs_cuda_empty_cache() -> c_int;
    fn vs_cuda_snapshot(out: *mut *mut c_char, len: *mut usize) -> c_int;
    fn vs_free(p: *mut std::ffi::c_void);
    fn vs_torch_version() -> *const c_char;
    fn vs_cuda_version() -> *const c_char;
}

#[derive(Debug, thiserror::Error)]
#[error("capture shim: {0}")]
pub struct ShimError(pub String);

fn check(rc: c_int) -> Result<(), ShimError> {
    if rc == 0 {
        Ok(())
    } else {
        // SAFETY: the shim returns a pointer to a thread-local NUL-terminated string.
        let msg = unsafe { CStr::from_ptr(vs_last_error()) };
        Err(ShimError(msg.to_string_lossy().into_owned()))
    }
}

/// Installs the recording CPU allocator (idempotent). Call before creating any tensor.
pub fn install_cpu_allocator() -> Result<(), ShimError> {
    check(unsafe { vs_install_cpu_allocator() })
}

pub fn set_scope(scope: u32) {
    unsafe { vs_set_scope(scope) }
}

/// Turns recording off and on (the allocator stays installed): for overhead benchmarks.
pub fn set_capture_enabled(on: bool) {
    unsafe { vs_set_capture_enabled(on) }
}

/// CLOCK_MONOTONIC nanoseconds at the shim clock's zero.
pub fn clock_zero_ns() -> u64 {
    unsafe { vs_clock_zero_ns() }
}

/// Drops what the shim buffered (frees of tensors that predate the session).
pub fn discard_pending() {
    let mut v = Vec::new();
    Shim.drain(&mut v);
}

type OomHandler = Box<dyn Fn(u8, u64) + Send + Sync>;

static OOM_HANDLER: OnceLock<OomHandler> = OnceLock::new();

extern "C" fn on_oom(device: u8, requested: u64) {
    if let Some(h) = OOM_HANDLER.get() {
        h(device, requested);
    }
}

/// Runs `handler` with the device and the requested bytes when an allocation fails, before
/// the error reaches the training code (set once per process).
pub fn set_oom_handler(handler: OomHandler) {
    if OOM_HANDLER.set(handler).is_ok() {
        unsafe { vs_set_oom_callback(Some(on_oom)) }
    }
}

/// Autocast to bf16 (or `fp16`) on for `cuda` or CPU; `enabled: false` leaves the region and
/// clears the cast cache.
pub fn autocast(cuda: bool, enabled: bool, fp16: bool) -> Result<(), ShimError> {
    check(unsafe { vs_autocast(cuda as c_int, enabled, fp16) })
}

/// `torch._amp_foreach_non_finite_check_and_unscale_`: each gradient times `inv_scale` in
/// place, `found_inf` set to 1 if any holds an inf or NaN.
pub fn amp_unscale(grads: &[tch::Tensor], found_inf: &tch::Tensor, inv_scale: &tch::Tensor) -> Result<(), ShimError> {
    let ptrs: Vec<*const torch_sys::C_tensor> = grads.iter().map(|g| g.as_ptr()).collect();
    // SAFETY: tch's tensor pointers are `torch::Tensor*`, valid while the tensors live.
    check(unsafe { vs_amp_unscale(ptrs.as_ptr(), ptrs.len() as c_int, found_inf.as_ptr(), inv_scale.as_ptr()) })
}

/// CPU autocast follows CUDA's op lists (on) or CPU's own (off): the shim's AutocastCPU
/// kernels, python/vramscope_hook/csrc/autocast_policy.cpp.
pub fn cuda_autocast_policy_on_cpu(on: bool) {
    unsafe { vs_set_cuda_autocast_policy(on) }
}

/// `torch.autograd.backward(t, grad)`: backward from `t` with `grad` as its gradient,
/// accumulating into the leaves' `.grad`. Both are consumed: `t` is freed before backward
/// runs (only its graph is needed), `grad` once backward is done with it.
pub fn backward(t: tch::Tensor, grad: tch::Tensor) -> Result<(), ShimError> {
    // SAFETY: tch's tensor pointers are `torch::Tensor*`, valid while the tensors live; the
    // shim empties both, which tch then frees as empty tensors.
    check(unsafe { vs_backward(t.as_ptr(), grad.as_ptr()) })
}

/// Sets `t.grad` to None, freeing the gradient (PyTorch's `zero_grad(set_to_none=True)`).
pub fn clear_grad(t: &tch::Tensor) {
    // SAFETY: tch's tensor pointer is a `torch::Tensor*`, valid while `t` lives.
    unsafe { vs_clear_grad(t.as_ptr()) }
}

pub fn cuda_compiled() -> bool {
    unsafe { vs_cuda_compiled() == 1 }
}

/// The libtorch version the shim was built against.
pub fn torch_version() -> String {
    // SAFETY: a static NUL-terminated string.
    unsafe { CStr::from_ptr(vs_torch_version()) }.to_string_lossy().into_owned()
}

/// The CUDA runtime version the shim was built against; None in a build without CUDA.
pub fn cuda_version() -> Option<String> {
    // SAFETY: a static NUL-terminated string.
    let v = unsafe { CStr::from_ptr(vs_cuda_version()) }.to_string_lossy().into_owned();
    (!v.is_empty()).then_some(v)
}

/// Lazy CUDA init, as the first CUDA tensor does it: the caching allocator's per-device
/// allocators exist afterwards, so trackers can attach to them.
pub fn cuda_init() -> Result<(), ShimError> {
    check(unsafe { vs_cuda_init() })
}

/// Attaches the trace tracker and OOM observers to every device's caching allocator.
/// Fails (saying why) before lazy CUDA init, where it would see nothing.
pub fn cuda_attach() -> Result<(), ShimError> {
    check(unsafe { vs_cuda_attach() })
}

/// Has PyTorch keep its own trace of `entries` (its snapshot then carries it).
pub fn cuda_record_history(entries: i64) -> Result<(), ShimError> {
    check(unsafe { vs_cuda_record_history(entries) })
}

pub fn cuda_empty_cache() -> Result<(), ShimError> {
    check(unsafe { vs_cuda_empty_cache() })
}

/// The linked shim, as a producer session sees it.
pub struct Shim;

impl Capture for Shim {
    fn now_ns(&self) -> u64 {
        unsafe { vs_now_ns() }
    }

    fn drain(&self, out: &mut Vec<RawEvent>) {
        loop {
            let pending = unsafe { vs_pending() };
            if pending == 0 {
                return;
            }
            let start = out.len();
            out.resize(start + pending, RawEvent::default());
            // SAFETY: `out` has `pending` initialised slots from `start`.
            let n = unsafe { vs_drain(out.as_mut_ptr().add(start), pending) };
            out.truncate(start + n);
        }
    }

    fn set_tags(&self, step: u32, phase: Phase) {
        unsafe { vs_set_tags(step, phase as u8) }
    }

    fn mark(&self, rec: &RawEvent) {
        unsafe { vs_mark(rec) }
    }

    fn cuda_stats(&self, device: u8) -> Result<CudaStats, String> {
        let mut s = CudaStats::default();
        check(unsafe { vs_cuda_stats(device as c_int, &mut s) }).map_err(|e| e.0)?;
        Ok(s)
    }

    fn dropped(&self) -> u64 {
        unsafe { vs_dropped() }
    }

    fn cuda_pci_bus_id(&self, device: u8) -> Option<String> {
        let mut buf = [0 as c_char; 32];
        check(unsafe { vs_cuda_pci_bus_id(device as c_int, buf.as_mut_ptr(), buf.len()) }).ok()?;
        // SAFETY: the shim wrote a NUL-terminated string into `buf`.
        Some(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
    }

    fn cuda_snapshot(&self) -> Result<Vec<u8>, String> {
        let mut p: *mut c_char = std::ptr::null_mut();
        let mut len = 0usize;
        check(unsafe { vs_cuda_snapshot(&mut p, &mut len) }).map_err(|e| e.0)?;
        // SAFETY: the shim malloc'd `len` bytes at `p`; we copy them and free with its free.
        let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, len) }.to_vec();
        unsafe { vs_free(p.cast()) };
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cuda_tracker_refuses_to_attach_before_cuda_initialises() {
        if !cuda_compiled() {
            // A build without CUDA says so instead.
            let e = cuda_attach().unwrap_err().0;
            assert!(e.contains("built without CUDA") && e.contains("nvidia-cuda-crt"), "{e}");
            return;
        }
        if tch::Cuda::is_available() {
            eprintln!("skipped: a GPU is present; `vramscope selftest` proves the attach order there");
            return;
        }
        // PyTorch's allocator forwards trackers only to the per-device allocators lazy CUDA
        // init has made: attached before it, a tracker would silently see nothing.
        let e = cuda_attach().unwrap_err().0;
        assert!(e.contains("not initialised yet"), "{e}");
        // Without a GPU, the init that would make them fails with the driver's own reason.
        let e = cuda_init().unwrap_err().0;
        assert!(!e.is_empty());
    }
}
