//! FFI to the C++ capture shim (csrc/): the recording CPU allocator, the CUDA trace
//! tracker, step/phase/scope tags, and CPU bf16 autocast.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int};

use crate::event::Phase;

pub mod snapshot;
pub mod tracker;

/// One event as the shim records it (layout shared with `VsRawEvent` in csrc/capture.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RawEvent {
    pub t_ns: u64,
    pub addr: u64,
    pub size: u64,
    pub stream: i64,
    pub step: u32,
    pub scope: u32,
    pub action: u8,
    pub phase: u8,
    /// CUDA ordinal, or `CPU_DEVICE`.
    pub device: u8,
    pad0: u8,
    pad1: u32,
}

pub const CPU_DEVICE: u8 = 0xff;

/// Raw action codes: the CUDA tracker forwards c10's `TraceEntry::Action`; the CPU wrapper
/// only ever emits these two.
pub const RAW_ALLOC: u8 = 0;
pub const RAW_FREE: u8 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaStats {
    pub allocated: u64,
    pub allocated_peak: u64,
    pub reserved: u64,
    pub reserved_peak: u64,
    pub active: u64,
    pub requested: u64,
    pub num_ooms: u64,
}

extern "C" {
    fn vs_install_cpu_allocator() -> c_int;
    fn vs_set_tags(step: u32, phase: u8);
    fn vs_set_scope(scope: u32);
    fn vs_set_capture_enabled(on: bool);
    fn vs_now_ns() -> u64;
    fn vs_drain(out: *mut RawEvent, cap: usize) -> usize;
    fn vs_pending() -> usize;
    fn vs_autocast(device_type: c_int, enabled: bool) -> c_int;
    fn vs_last_error() -> *const c_char;
    fn vs_clear_grad(t: *const torch_sys::C_tensor);
    fn vs_cuda_compiled() -> c_int;
    fn vs_cuda_attach(history_entries: i64) -> c_int;
    fn vs_cuda_stats(device: c_int, out: *mut CudaStats) -> c_int;
    fn vs_cuda_reset_peaks(device: c_int) -> c_int;
    fn vs_cuda_empty_cache() -> c_int;
    fn vs_cuda_snapshot(out: *mut *mut c_char, len: *mut usize) -> c_int;
    fn vs_free(p: *mut std::ffi::c_void);
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

pub fn set_tags(step: u32, phase: Phase) {
    unsafe { vs_set_tags(step, phase as u8) }
}

pub fn set_scope(scope: u32) {
    unsafe { vs_set_scope(scope) }
}

/// Turns recording off and on (the allocator stays installed): for overhead benchmarks.
pub fn set_capture_enabled(on: bool) {
    unsafe { vs_set_capture_enabled(on) }
}

/// The shim's clock: nanoseconds since the process loaded it (events use the same clock).
pub fn now_ns() -> u64 {
    unsafe { vs_now_ns() }
}

/// Appends every buffered event to `out`, oldest first.
pub fn drain_into(out: &mut Vec<RawEvent>) {
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

/// bf16 autocast on for `cuda` or CPU; `false` leaves the region and clears the cast cache.
pub fn autocast(cuda: bool, enabled: bool) -> Result<(), ShimError> {
    check(unsafe { vs_autocast(cuda as c_int, enabled) })
}

/// Sets `t.grad` to None, freeing the gradient (PyTorch's `zero_grad(set_to_none=True)`).
pub fn clear_grad(t: &tch::Tensor) {
    // SAFETY: tch's tensor pointer is a `torch::Tensor*`, valid while `t` lives.
    unsafe { vs_clear_grad(t.as_ptr()) }
}

pub fn cuda_compiled() -> bool {
    unsafe { vs_cuda_compiled() == 1 }
}

pub fn cuda_attach(history_entries: i64) -> Result<(), ShimError> {
    check(unsafe { vs_cuda_attach(history_entries) })
}

pub fn cuda_stats(device: usize) -> Result<CudaStats, ShimError> {
    let mut s = CudaStats::default();
    check(unsafe { vs_cuda_stats(device as c_int, &mut s) })?;
    Ok(s)
}

pub fn cuda_reset_peaks(device: usize) -> Result<(), ShimError> {
    check(unsafe { vs_cuda_reset_peaks(device as c_int) })
}

pub fn cuda_empty_cache() -> Result<(), ShimError> {
    check(unsafe { vs_cuda_empty_cache() })
}

/// PyTorch's own `_memory_snapshot_pickled()` bytes.
pub fn cuda_snapshot_pickle() -> Result<Vec<u8>, ShimError> {
    let mut p: *mut c_char = std::ptr::null_mut();
    let mut len = 0usize;
    check(unsafe { vs_cuda_snapshot(&mut p, &mut len) })?;
    // SAFETY: the shim malloc'd `len` bytes at `p`; we copy them and free with its free.
    let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, len) }.to_vec();
    unsafe { vs_free(p.cast()) };
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_event_layout_matches_the_shim() {
        // csrc/capture.h: 4×8 bytes, 2×4, 4×1, 4 = 48 bytes.
        assert_eq!(std::mem::size_of::<RawEvent>(), 48);
        assert_eq!(std::mem::size_of::<CudaStats>(), 56);
    }
}
