//! What the gauge thread measures, in the units the screens draw: bytes, percent, watts
//! (as milliwatts, NVML's unit), degrees C, MHz. Fields a device does not report are `None`.

use serde::{Deserialize, Serialize};

/// One process's memory on one device, as NVML lists it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessSample {
    pub pid: u32,
    /// `None` when the driver hides it (some containers, WDDM).
    pub used_bytes: Option<u64>,
    /// SM utilization of this process over the last sample period, percent.
    pub sm_util: Option<u32>,
    /// From /proc/<pid>/comm; `None` for processes outside our PID namespace.
    pub name: Option<String>,
    /// This process is the job's (a rank of it), or vramscope itself with no job.
    pub is_self: bool,
}

/// Readings of one device at one instant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceSample {
    pub index: u32,
    pub name: String,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_free: u64,
    pub gpu_util: Option<u32>,
    pub mem_util: Option<u32>,
    pub temp_c: Option<u32>,
    pub power_mw: Option<u32>,
    pub power_limit_mw: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub processes: Vec<ProcessSample>,
    /// NVML's PCI bus id, when it says (recordings before it have none).
    #[serde(default)]
    pub pci_bus_id: Option<String>,
}

/// Host readings, used when NVML is unavailable.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostSample {
    /// Resident set size of the job's processes (vramscope's own with none yet).
    pub rss_bytes: u64,
    pub mem_total: u64,
    /// Total minus MemAvailable, the figure `free` calls used.
    pub mem_used: u64,
    /// All cores together, 0..=100, since the previous sample.
    pub cpu_percent: Option<f32>,
    /// The job's processes, in percent of one core, since the previous sample.
    pub self_cpu_percent: Option<f32>,
    pub cpu_count: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gauges {
    Devices(Vec<DeviceSample>),
    Host(HostSample),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GaugeSample {
    /// Nanoseconds since the session origin (the same clock as `MemEvent::t_ns`).
    pub t_ns: u64,
    pub gauges: Gauges,
}

impl GaugeSample {
    pub fn devices(&self) -> &[DeviceSample] {
        match &self.gauges {
            Gauges::Devices(d) => d,
            Gauges::Host(_) => &[],
        }
    }

    pub fn host(&self) -> Option<&HostSample> {
        match &self.gauges {
            Gauges::Host(h) => Some(h),
            Gauges::Devices(_) => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    Nvml,
    Host,
    /// Neither source works (no NVML and no readable /proc); the thread has stopped.
    None,
}

impl SourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Nvml => "NVML",
            SourceKind::Host => "host",
            SourceKind::None => "none",
        }
    }
}

/// Which source is active and, when it is not NVML, why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceStatus {
    pub kind: SourceKind,
    pub reason: Option<String>,
}

/// What the gauge thread sends. `status` is set in the first batch and whenever the
/// source changes (NVML lost mid-run), so the screen shows the reason once.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GaugeBatch {
    /// Sequence number of `samples[0]` (gaps reveal dropped batches).
    pub first_seq: u64,
    pub status: Option<SourceStatus>,
    pub samples: Vec<GaugeSample>,
}
