//! Headless output and analysis: per-step lines, sweeps, estimates, scaling fits, growth checks.

pub mod estimate;
pub mod fit;
pub mod growth;
pub mod headless;
pub mod sweep;
