//! PyTorch memory snapshots: the model, a safe fast reader, a memory_viz-compatible writer,
//! and memory_viz's Active Memory Timeline computation.

pub mod model;
pub mod timeline;
