//! What a device query returns: each NVML call's own result for each device, as plain
//! data. Split from the conversion so it can be tested, and replayed, without a GPU.

use nvml_wrapper::error::NvmlError;
use serde::{Deserialize, Serialize};

/// How one NVML call failed, reduced to what the conversion decides on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RawError {
    /// The device or driver does not offer this reading.
    NotSupported,
    NoPermission,
    /// The device or the driver is gone; nothing more will work.
    Lost(String),
    Other(String),
}

impl std::fmt::Display for RawError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RawError::NotSupported => f.write_str("not supported"),
            RawError::NoPermission => f.write_str("no permission"),
            RawError::Lost(m) | RawError::Other(m) => f.write_str(m),
        }
    }
}

impl From<NvmlError> for RawError {
    fn from(e: NvmlError) -> Self {
        match e {
            // An old driver without the symbol simply lacks the reading.
            NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) => RawError::NotSupported,
            NvmlError::NoPermission => RawError::NoPermission,
            NvmlError::GpuLost
            | NvmlError::ResetRequired
            | NvmlError::DriverNotLoaded
            | NvmlError::Uninitialized
            | NvmlError::LibRmVersionMismatch
            | NvmlError::OperatingSystem => RawError::Lost(e.to_string()),
            other => RawError::Other(other.to_string()),
        }
    }
}

pub type Raw<T> = Result<T, RawError>;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RawMemory {
    pub used: u64,
    pub total: u64,
    pub free: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RawProcess {
    pub pid: u32,
    pub used_bytes: Option<u64>,
    pub name: Option<String>,
}

/// Every NVML call the gauges make for one device, each with its own result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RawDevice {
    pub index: u32,
    pub name: Raw<String>,
    pub memory: Raw<RawMemory>,
    /// (gpu, memory) utilization percent.
    pub utilization: Raw<(u32, u32)>,
    pub temp_c: Raw<u32>,
    pub power_mw: Raw<u32>,
    pub power_limit_mw: Raw<u32>,
    pub sm_clock_mhz: Raw<u32>,
    pub mem_clock_mhz: Raw<u32>,
    pub compute_processes: Raw<Vec<RawProcess>>,
    pub graphics_processes: Raw<Vec<RawProcess>>,
    /// (pid, SM utilization percent), possibly several samples per pid, oldest first.
    pub process_sm_util: Raw<Vec<(u32, u32)>>,
    /// NVML's PCI bus id ("00000000:3B:00.0"): what a CUDA device is matched by.
    #[serde(default)]
    pub pci_bus_id: Option<String>,
}

impl RawDevice {
    /// A device that reports only its name and memory (every other call unsupported);
    /// recordings fill in the rest.
    pub fn new(index: u32, name: &str, used: u64, total: u64) -> RawDevice {
        RawDevice {
            index,
            name: Ok(name.to_string()),
            memory: Ok(RawMemory {
                used,
                total,
                free: total.saturating_sub(used),
            }),
            utilization: Err(RawError::NotSupported),
            temp_c: Err(RawError::NotSupported),
            power_mw: Err(RawError::NotSupported),
            power_limit_mw: Err(RawError::NotSupported),
            sm_clock_mhz: Err(RawError::NotSupported),
            mem_clock_mhz: Err(RawError::NotSupported),
            compute_processes: Err(RawError::NotSupported),
            graphics_processes: Err(RawError::NotSupported),
            process_sm_util: Err(RawError::NotSupported),
            pci_bus_id: None,
        }
    }
}

/// Raw readings of all devices, one call per sample.
pub trait DeviceQuery {
    fn read_devices(&mut self) -> Raw<Vec<RawDevice>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_errors_map_to_decisions() {
        assert_eq!(
            RawError::from(NvmlError::NotSupported),
            RawError::NotSupported
        );
        assert_eq!(
            RawError::from(NvmlError::FailedToLoadSymbol("x".into())),
            RawError::NotSupported
        );
        assert!(matches!(
            RawError::from(NvmlError::GpuLost),
            RawError::Lost(_)
        ));
        assert!(matches!(
            RawError::from(NvmlError::DriverNotLoaded),
            RawError::Lost(_)
        ));
        assert!(matches!(
            RawError::from(NvmlError::Unknown),
            RawError::Other(_)
        ));
    }
}
