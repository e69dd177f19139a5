//! PyTorch memory snapshots: the model, a safe fast reader, a memory_viz-compatible writer,
//! and memory_viz's Active Memory Timeline computation.

mod max_pyramid;
pub mod model;
pub mod open;
mod pages;
pub mod reader;
pub mod timeline;
pub mod writer;

pub use open::{pick_device, read_device, read_device_observed, OpenError};
pub use reader::{read_snapshot, read_snapshot_file, read_snapshot_file_observed, walk_opcodes, ReadError, ReadPass, ReadProgress};
pub use writer::{save_snapshot_atomic, unique_path, write_snapshot, WriteError};
