//! A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp):
//! size rounding, small/large pools, segment sizes, best-fit reuse per stream and pool,
//! max_split_size, split and merge, empty_cache. It turns a stream of requests (CPU
//! allocations during a CPU run, or a recorded trace) into the block and segment events a
//! GPU would report.

pub mod config;
pub mod model;
pub mod replay;

pub use config::{round_size, segment_size, AllocatorConfig, ConfError};
pub use model::{AllocatorStats, CachingAllocatorModel, ModelOp, MODEL_BASE_ADDR};
pub use replay::{replay_snapshot, state_before_trace, ReplayReport};
