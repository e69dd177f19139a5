//! Headless output and analysis: per-step lines and JSON, snapshot summaries and diffs,
//! sweeps, estimates, scaling fits, growth checks.

pub mod diff;
pub mod estimate;
pub mod fit;
pub mod growth;
pub mod headless;
pub mod snapshot_summary;
pub mod sweep;
