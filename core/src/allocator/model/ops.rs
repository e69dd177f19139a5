//! What the model reports: the operations a trace would record, and the counters of
//! `torch.cuda.memory_stats`.

/// What the model did, in the order the real allocator's trace would record it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelOp {
    SegmentAlloc {
        addr: u64,
        size: u64,
    },
    SegmentFree {
        addr: u64,
        size: u64,
    },
    /// Pages mapped into an expandable segment's address range.
    SegmentMap {
        addr: u64,
        size: u64,
    },
    /// Free pages of an expandable segment handed back to the device.
    SegmentUnmap {
        addr: u64,
        size: u64,
    },
    /// `size` is the request, `block_size` what the block occupies.
    Alloc {
        addr: u64,
        size: u64,
        block_size: u64,
    },
    Free {
        addr: u64,
        size: u64,
        block_size: u64,
    },
}

/// Counters in the sense of `torch.cuda.memory_stats` (aggregated over pools).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    /// Equal to `allocated_bytes`: the model frees blocks at once (no pending stream uses).
    pub active_bytes: u64,
    pub requested_bytes: u64,
    /// Free bytes in segments that are split (cached but fragmented); expandable segments
    /// are left out, as PyTorch does.
    pub inactive_split_bytes: u64,
    /// cudaMalloc'd segments (expandable segments map pages instead and are not counted).
    pub segments: u64,
    /// Allocated blocks.
    pub blocks: u64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub peak_active_bytes: u64,
    /// cudaMalloc and page-map calls (PyTorch's `num_device_alloc`).
    pub device_allocs: u64,
    /// cudaFree and unmap calls (`num_device_free`).
    pub device_frees: u64,
    /// Requests that failed for want of device memory (`num_ooms`).
    pub ooms: u64,
}
