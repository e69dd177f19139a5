//! A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp):
//! size rounding, small/large pools, segment sizes, best-fit reuse per stream and pool,
//! max_split_size, split and merge, expandable segments, empty_cache, and running out of
//! a device's memory. It turns a stream of requests (CPU allocations during a CPU run, or
//! a recorded trace) into the block and segment events a GPU would report.

pub mod config;
pub mod model;
pub mod replay;

pub use config::{round_size, segment_size, AllocatorConfig, ConfError};
pub use model::{
    AllocatorStats, CachingAllocatorModel, ModelOp, DEFAULT_DEVICE_MEMORY, MODEL_BASE_ADDR,
};
pub use replay::{
    feed_trace, oom_capacity, replay_snapshot, reserved_before_trace, reserved_change,
    state_before_trace, ReplayReport, Tally,
};
