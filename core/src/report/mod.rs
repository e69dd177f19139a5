//! Headless output and analysis: per-step lines and JSON, snapshot summaries and diffs,
//! sweeps, estimates, scaling fits, growth checks, out-of-memory reports and allocator
//! what-ifs.

pub mod breakdown;
pub mod compute;
pub mod diff;
pub mod estimate;
pub mod findings;
pub mod fit;
pub mod frame_rules;
pub mod frames;
pub mod growth;
pub mod headless;
pub mod oom;
pub mod operators;
pub mod snapshot_set;
pub mod snapshot_summary;
pub mod sweep;
pub mod sweep_row;
pub mod whatif;
