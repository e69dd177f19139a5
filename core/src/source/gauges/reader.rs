//! The one interface the sampler thread needs from a gauge source.

use thiserror::Error;

use super::sample::{Gauges, SourceKind};

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum GaugeError {
    /// NVML could not start (no driver, no library, no GPU).
    #[error("NVML unavailable: {0}")]
    NvmlUnavailable(String),
    /// An NVML call failed after a good start (GPU lost, driver unloaded, permission).
    #[error("NVML {call} failed on GPU {device}: {detail}")]
    NvmlCall {
        call: &'static str,
        device: u32,
        detail: String,
    },
    #[error("NVML device list failed: {0}")]
    NvmlDevices(String),
    #[error("cannot read {path}: {detail}")]
    Proc { path: String, detail: String },
}

/// A source of gauge readings. Readers live on the sampler thread, so they need not be
/// `Send` (NVML device handles borrow the library handle).
pub trait GaugeReader {
    fn kind(&self) -> SourceKind;
    /// One reading of everything this source knows. An error means the source is no
    /// longer usable; the sampler falls back rather than retrying.
    fn sample(&mut self) -> Result<Gauges, GaugeError>;
}
