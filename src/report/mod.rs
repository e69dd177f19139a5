//! Headless output: per-step lines and JSON, and the analyses of snapshot files.

pub mod headless;
pub mod diff;
pub mod snapshot_summary;
