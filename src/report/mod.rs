//! Headless output: per-step lines and JSON, byte formatting.

pub mod format;
pub mod headless;
