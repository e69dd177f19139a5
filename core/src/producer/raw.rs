//! What the C++ capture shim records (python/vramscope_hook/csrc/capture.h), in the layout
//! it writes: the engine links the shim, the Python hook loads it, and both hand these to
//! the tracker.

/// One event as the shim records it (layout shared with `VsRawEvent`).
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
    pub pad0: u8,
    pub pad1: u32,
}

pub const CPU_DEVICE: u8 = 0xff;

/// Raw action codes: the CUDA tracker forwards c10's `TraceEntry::Action`; the CPU wrapper
/// emits alloc, free and (for a failed allocation) oom.
pub const RAW_ALLOC: u8 = 0;
pub const RAW_FREE: u8 = 2;
pub const RAW_OOM: u8 = 8;

/// The host's own records among the events (the shim's `vs_mark`; c10's actions stay below
/// 0x80): a phase begins (`step`, `phase`), a tensor is named (`addr` its key, `phase` its
/// category, `scope` its name or 0), a step ends (`step`; what the host said of it waits
/// in the session's queue).
pub const RAW_MARK_PHASE: u8 = 0x80;
pub const RAW_MARK_TAG: u8 = 0x81;
pub const RAW_MARK_STEP_END: u8 = 0x82;

impl RawEvent {
    pub fn is_mark(&self) -> bool {
        self.action >= RAW_MARK_PHASE
    }

    pub fn mark(action: u8, step: u32, phase: u8, addr: u64, scope: u32) -> RawEvent {
        RawEvent { action, step, phase, addr, scope, device: CPU_DEVICE, ..RawEvent::default() }
    }
}

/// The CUDA caching allocator's counters (layout shared with `VsCudaStats`).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_shim() {
        // capture.h: 4×8 bytes, 2×4, 4×1, 4 = 48 bytes; seven u64 counters.
        assert_eq!(std::mem::size_of::<RawEvent>(), 48);
        assert_eq!(std::mem::size_of::<CudaStats>(), 56);
    }
}
