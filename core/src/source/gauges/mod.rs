//! Device gauges: what the GPU (via NVML) or, without one, the host (via /proc) says about
//! memory and load, sampled on their own thread.

pub mod history;
pub mod host;
pub mod nvml;
pub mod raw;
pub mod reader;
pub mod recorded;
pub mod sample;
pub mod sampler;
pub mod watched;

pub use history::{GaugeHistory, Metric};
pub use host::HostReader;
pub use nvml::{convert_device, NvmlQuery, NvmlReader};
pub use raw::{DeviceQuery, RawDevice, RawError, RawMemory, RawProcess};
pub use reader::{GaugeError, GaugeReader};
pub use recorded::RecordedQuery;
pub use sample::{
    DeviceSample, GaugeBatch, GaugeSample, Gauges, HostSample, ProcessSample, SourceKind,
    SourceStatus,
};
pub use sampler::{
    open_reader, spawn_gauges, spawn_gauges_with, GaugeConfig, GaugeHandle, OpenedSource,
};
pub use watched::Watched;
