//! The caching allocator itself, in layers: `state` holds segments split into blocks,
//! the per-(stream, pool) free lists ordered by (size, address) for best fit and the
//! counters; `expandable` maps and unmaps the pages of expandable segments; `caching` is
//! what a request does (best fit, split, merge of free neighbours on free, and, when the
//! device's capacity is set, the out-of-memory path: free cached memory, retry, fail);
//! `snapshot` loads a snapshot's segments and lists the model's own.

mod caching;
mod expandable;
mod ops;
mod snapshot;
mod state;
#[cfg(test)]
mod testing;

pub use expandable::DEFAULT_DEVICE_MEMORY;
pub use ops::{AllocatorStats, ModelOp};
pub use state::{CachingAllocatorModel, MODEL_BASE_ADDR};
