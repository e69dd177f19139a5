//! Headless output: per-step lines and JSON.

pub mod headless;
