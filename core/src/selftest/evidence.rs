//! What the engine's selftest mode writes at the end of its run (JSON): the shim's raw
//! events exactly as recorded, the tracker's and the allocator's own figures at the moment
//! the stream was cut, and on CUDA PyTorch's own snapshot and NVML's readings.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One event as the capture shim recorded it, before the tracker saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawRecord {
    /// The shim's action code (`producer::raw`: CPU alloc 0, free 2, oom 8; on CUDA c10's).
    pub action: u8,
    pub addr: u64,
    pub size: u64,
    pub device: u8,
}

/// The figures the checks hold the stream to, read when the stream was cut.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Figures {
    /// Live requested bytes and allocations in the tracker.
    pub active_bytes: u64,
    pub live_count: u64,
    /// The allocator's own counters: the model's on CPU, the caching allocator's on CUDA.
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
}

/// NVML's used memory of the training device: with the CUDA context up and nothing
/// reserved, and at the cut.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlFigures {
    pub index: u32,
    pub baseline_used: u64,
    pub baseline_reserved: u64,
    pub end_used: u64,
    pub end_reserved: u64,
    /// The same readings for the engine's process alone, where NVML lists it.
    pub process_baseline_used: Option<u64>,
    pub process_end_used: Option<u64>,
}

/// How the forced out-of-memory went, as the engine saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomFigures {
    pub step: u64,
    pub requested: u64,
    /// The error the step raised (None: the allocation succeeded).
    pub error: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// Why the pass could not run (no CUDA device): its checks are skipped with this.
    pub unavailable: Option<String>,
    /// `--device N` names a device this machine does not have: a bad flag.
    pub bad_device: Option<String>,
    pub device: String,
    pub torch_version: Option<String>,
    pub cuda_version: Option<String>,
    pub gpu_name: Option<String>,
    /// A fault the run injected on purpose (`VRAMSCOPE_SELFTEST_FAULT`), said in the results.
    pub fault: Option<String>,
    /// Every raw event of the session, in order, up to the cut.
    pub raw: Vec<RawRecord>,
    /// Stream events with a sequence number below this were emitted before the cut.
    pub cut_seq: u64,
    pub figures: Figures,
    /// PyTorch's own snapshot (`_memory_snapshot_pickled`), taken at the cut (CUDA).
    pub pytorch_snapshot: Option<PathBuf>,
    /// Why PyTorch's snapshot could not be taken.
    pub pytorch_snapshot_error: Option<String>,
    /// NVML's readings, or why there are none.
    pub nvml: Option<Result<NvmlFigures, String>>,
    pub oom: Option<OomFigures>,
}
