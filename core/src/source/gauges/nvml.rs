//! NVML gauges: `convert_device` turns a `DeviceQuery`'s raw readings into a
//! `DeviceSample`, deciding which failures are fatal, and `NvmlQuery` is the query that
//! asks NVML itself.

use std::collections::BTreeMap;

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};

use super::host::process_name;
use super::raw::{DeviceQuery, Raw, RawDevice, RawError, RawMemory, RawProcess};
use super::reader::{GaugeError, GaugeReader};
use super::sample::{DeviceSample, Gauges, ProcessSample, SourceKind};
use super::watched::Watched;

/// Whether two PCI bus ids name one device. NVML writes an 8-digit domain
/// ("00000000:3B:00.0"), CUDA and PyTorch often 4 ("0000:3b:00.0"), in either case.
pub fn same_pci_bus(a: &str, b: &str) -> bool {
    fn parts(id: &str) -> Option<(u64, u64, u64, u64)> {
        let (domain, rest) = id.trim().split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (device, function) = rest.split_once('.').unwrap_or((rest, "0"));
        let hex = |s: &str| u64::from_str_radix(s, 16).ok();
        Some((hex(domain)?, hex(bus)?, hex(device)?, hex(function)?))
    }
    matches!((parts(a), parts(b)), (Some(x), Some(y)) if x == y)
}

/// An optional reading: absent when unsupported or hidden, fatal when the device is gone.
fn optional<T>(r: Raw<T>, call: &'static str, device: u32) -> Result<Option<T>, GaugeError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(RawError::NotSupported | RawError::NoPermission | RawError::Other(_)) => Ok(None),
        Err(RawError::Lost(detail)) => Err(GaugeError::NvmlCall {
            call,
            device,
            detail,
        }),
    }
}

/// Turns one device's raw readings into a sample. Memory is the reading this tool exists
/// for, so any failure there is fatal; other readings become `None` unless the device is
/// lost. Processes listed as both compute and graphics are counted once.
pub fn convert_device(raw: RawDevice, job: &[u32]) -> Result<DeviceSample, GaugeError> {
    let d = raw.index;
    let memory = raw.memory.map_err(|e| GaugeError::NvmlCall {
        call: "memory_info",
        device: d,
        detail: e.to_string(),
    })?;
    let name = optional(raw.name, "name", d)?.unwrap_or_else(|| format!("GPU {d}"));
    let util = optional(raw.utilization, "utilization_rates", d)?;

    let mut procs: BTreeMap<u32, ProcessSample> = BTreeMap::new();
    let lists = [
        optional(raw.compute_processes, "running_compute_processes", d)?,
        optional(raw.graphics_processes, "running_graphics_processes", d)?,
    ];
    for p in lists.into_iter().flatten().flatten() {
        let entry = procs.entry(p.pid).or_insert_with(|| ProcessSample {
            pid: p.pid,
            used_bytes: None,
            sm_util: None,
            name: None,
            is_self: job.contains(&p.pid),
        });
        entry.used_bytes = entry.used_bytes.max(p.used_bytes);
        entry.name = entry.name.take().or(p.name);
    }
    for (pid, sm) in optional(raw.process_sm_util, "process_utilization_stats", d)?
        .into_iter()
        .flatten()
    {
        // Later samples overwrite earlier ones: the newest period wins.
        if let Some(p) = procs.get_mut(&pid) {
            p.sm_util = Some(sm);
        }
    }

    Ok(DeviceSample {
        index: d,
        name,
        mem_used: memory.used,
        mem_total: memory.total,
        mem_free: memory.free,
        gpu_util: util.map(|u| u.0),
        mem_util: util.map(|u| u.1),
        temp_c: optional(raw.temp_c, "temperature", d)?,
        power_mw: optional(raw.power_mw, "power_usage", d)?,
        power_limit_mw: optional(raw.power_limit_mw, "enforced_power_limit", d)?,
        sm_clock_mhz: optional(raw.sm_clock_mhz, "clock_info(SM)", d)?,
        mem_clock_mhz: optional(raw.mem_clock_mhz, "clock_info(memory)", d)?,
        processes: procs.into_values().collect(),
        pci_bus_id: raw.pci_bus_id,
    })
}

/// A `GaugeReader` over any device query: NVML itself, or a recording.
pub struct NvmlReader<Q> {
    query: Q,
    /// The job's processes: their memory is marked as the job's.
    job: Watched,
}

impl<Q: DeviceQuery> NvmlReader<Q> {
    pub fn new(query: Q, job: Watched) -> Self {
        NvmlReader { query, job }
    }
}

impl<Q: DeviceQuery> GaugeReader for NvmlReader<Q> {
    fn kind(&self) -> SourceKind {
        SourceKind::Nvml
    }

    fn sample(&mut self) -> Result<Gauges, GaugeError> {
        let raw = self
            .query
            .read_devices()
            .map_err(|e| GaugeError::NvmlDevices(e.to_string()))?;
        let job = self.job.pids();
        let devices = raw
            .into_iter()
            .map(|r| convert_device(r, &job))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Gauges::Devices(devices))
    }
}

/// The live NVML query.
pub struct NvmlQuery {
    nvml: Nvml,
    count: u32,
    /// Per device, the newest process-utilization timestamp seen, so each call returns
    /// only the samples of the last period.
    last_util_us: Vec<u64>,
}

impl NvmlQuery {
    /// Loads and initializes NVML. Fails, with the loader's own words, where there is no
    /// driver or library, and where there are no GPUs.
    pub fn open() -> Result<NvmlQuery, GaugeError> {
        let nvml = Nvml::init().map_err(|e| {
            GaugeError::NvmlUnavailable(match e {
                // dlerror's text names the library and says why it did not load.
                NvmlError::LibloadingError(le) => le.to_string(),
                other => other.to_string(),
            })
        })?;
        let count = nvml
            .device_count()
            .map_err(|e| GaugeError::NvmlUnavailable(format!("device count failed: {e}")))?;
        if count == 0 {
            return Err(GaugeError::NvmlUnavailable("NVML lists no GPUs".into()));
        }
        Ok(NvmlQuery {
            nvml,
            count,
            last_util_us: vec![0; count as usize],
        })
    }

    /// The driver's version, for bug reports.
    pub fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }
}

fn raw_processes(list: Result<Vec<ProcessInfo>, NvmlError>) -> Raw<Vec<RawProcess>> {
    Ok(list?
        .into_iter()
        .map(|p| RawProcess {
            pid: p.pid,
            used_bytes: match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            },
            name: process_name(p.pid),
        })
        .collect())
}

/// `last_util_us`: the newest process-utilization timestamp seen on this device.
fn read_device(index: u32, dev: &Device<'_>, last_util_us: &mut u64) -> RawDevice {
    let last = last_util_us;
    let process_sm_util = match dev.process_utilization_stats(*last) {
        Ok(samples) => {
            *last = samples.iter().map(|s| s.timestamp).max().unwrap_or(*last);
            let mut v: Vec<_> = samples
                .iter()
                .map(|s| (s.timestamp, s.pid, s.sm_util))
                .collect();
            v.sort_unstable();
            Ok(v.into_iter().map(|(_, pid, sm)| (pid, sm)).collect())
        }
        // NVML answers NotFound when no process ran in the period.
        Err(NvmlError::NotFound) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    };
    RawDevice {
        index,
        name: dev.name().map_err(Into::into),
        memory: dev
            .memory_info()
            .map(|m| RawMemory {
                used: m.used,
                total: m.total,
                free: m.free,
            })
            .map_err(Into::into),
        utilization: dev
            .utilization_rates()
            .map(|u| (u.gpu, u.memory))
            .map_err(Into::into),
        temp_c: dev.temperature(TemperatureSensor::Gpu).map_err(Into::into),
        power_mw: dev.power_usage().map_err(Into::into),
        power_limit_mw: dev.enforced_power_limit().map_err(Into::into),
        sm_clock_mhz: dev.clock_info(Clock::SM).map_err(Into::into),
        mem_clock_mhz: dev.clock_info(Clock::Memory).map_err(Into::into),
        compute_processes: raw_processes(dev.running_compute_processes()),
        graphics_processes: raw_processes(dev.running_graphics_processes()),
        process_sm_util,
        pci_bus_id: dev.pci_info().ok().map(|p| p.bus_id),
    }
}

impl DeviceQuery for NvmlQuery {
    fn read_devices(&mut self) -> Raw<Vec<RawDevice>> {
        let mut out = Vec::with_capacity(self.count as usize);
        for i in 0..self.count {
            // Handles are cheap lookups; taking them each time keeps `Nvml` unborrowed.
            let dev = self.nvml.device_by_index(i)?;
            out.push(read_device(i, &dev, &mut self.last_util_us[i as usize]));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::gauges::recorded::RecordedQuery;

    const GIB: u64 = 1 << 30;
    const SELF: u32 = 4242;

    fn proc_(pid: u32, mib: Option<u64>, name: &str) -> RawProcess {
        RawProcess {
            pid,
            used_bytes: mib.map(|m| m << 20),
            name: Some(name.into()),
        }
    }

    fn busy_device() -> RawDevice {
        RawDevice {
            utilization: Ok((87, 41)),
            temp_c: Ok(61),
            power_mw: Ok(312_400),
            power_limit_mw: Ok(700_000),
            sm_clock_mhz: Ok(1980),
            mem_clock_mhz: Ok(2619),
            compute_processes: Ok(vec![
                proc_(SELF, Some(30_000), "vramscope"),
                proc_(77, None, "python"),
            ]),
            // The trainer also holds a graphics context: count it once, with its memory.
            graphics_processes: Ok(vec![
                proc_(SELF, Some(30_000), "vramscope"),
                proc_(9, Some(12), "Xorg"),
            ]),
            process_sm_util: Ok(vec![(SELF, 50), (77, 10), (SELF, 80)]),
            ..RawDevice::new(0, "NVIDIA H100 80GB HBM3", 40 * GIB, 80 * GIB)
        }
    }

    #[test]
    fn full_readings_convert_to_a_sample() {
        let d = convert_device(busy_device(), &[SELF]).unwrap();
        assert_eq!(
            (d.mem_used, d.mem_total, d.mem_free),
            (40 * GIB, 80 * GIB, 40 * GIB)
        );
        assert_eq!(
            (d.gpu_util, d.mem_util, d.temp_c),
            (Some(87), Some(41), Some(61))
        );
        assert_eq!(
            (d.power_mw, d.power_limit_mw),
            (Some(312_400), Some(700_000))
        );
        assert_eq!((d.sm_clock_mhz, d.mem_clock_mhz), (Some(1980), Some(2619)));
        let pids: Vec<u32> = d.processes.iter().map(|p| p.pid).collect();
        assert_eq!(pids, [9, 77, SELF], "deduplicated, in pid order");
        let me = &d.processes[2];
        assert!(me.is_self && !d.processes[0].is_self);
        assert_eq!(me.used_bytes, Some(30_000 << 20));
        assert_eq!(me.sm_util, Some(80), "the newest utilization sample wins");
        assert_eq!(
            d.processes[1].used_bytes, None,
            "hidden memory stays unknown"
        );
        assert_eq!(d.processes[0].sm_util, None);
    }

    #[test]
    fn unsupported_or_forbidden_readings_become_absent() {
        let raw = RawDevice {
            name: Err(RawError::Other("garbled".into())),
            compute_processes: Err(RawError::NoPermission),
            ..busy_device()
        };
        let d = convert_device(raw, &[SELF]).unwrap();
        assert_eq!(d.name, "GPU 0");
        assert_eq!(
            d.processes.iter().map(|p| p.pid).collect::<Vec<_>>(),
            [9, SELF]
        );
        let bare = convert_device(RawDevice::new(3, "A100", GIB, 40 * GIB), &[SELF]).unwrap();
        assert_eq!(
            (bare.index, bare.gpu_util, bare.power_mw, bare.temp_c),
            (3, None, None, None)
        );
        assert!(bare.processes.is_empty());
    }

    #[test]
    fn lost_device_or_memory_failure_is_fatal_and_says_where() {
        let lost = RawDevice {
            power_mw: Err(RawError::Lost("device's fell off the bus".into())),
            ..busy_device()
        };
        assert_eq!(
            convert_device(lost, &[SELF]).unwrap_err().to_string(),
            "NVML power_usage failed on GPU 0: device's fell off the bus"
        );
        let no_mem = RawDevice {
            memory: Err(RawError::NoPermission),
            ..RawDevice::new(2, "H100", 0, 0)
        };
        assert_eq!(
            convert_device(no_mem, &[SELF]).unwrap_err().to_string(),
            "NVML memory_info failed on GPU 2: no permission"
        );
    }

    #[test]
    fn pci_bus_ids_match_whatever_their_spelling() {
        assert!(same_pci_bus("00000000:3B:00.0", "0000:3b:00.0"));
        assert!(same_pci_bus("00000000:3B:00.0", "0000:3b:00"));
        assert!(!same_pci_bus("00000000:3B:00.0", "00000000:3C:00.0"));
        assert!(!same_pci_bus("00000000:3B:00.0", "garbage"));
    }

    #[test]
    fn reader_replays_a_recording_and_stops_on_loss() {
        let frames = vec![
            Ok(vec![
                busy_device(),
                RawDevice::new(1, "H100", GIB, 80 * GIB),
            ]),
            Err(RawError::Lost("driver not loaded".into())),
        ];
        let mut reader = NvmlReader::new(RecordedQuery::new(frames), Watched::of(&[SELF]));
        assert_eq!(reader.kind(), SourceKind::Nvml);
        let Gauges::Devices(d) = reader.sample().unwrap() else {
            panic!("host sample")
        };
        assert_eq!(
            d.iter().map(|d| d.mem_used).collect::<Vec<_>>(),
            [40 * GIB, GIB]
        );
        assert_eq!(
            reader.sample().unwrap_err().to_string(),
            "NVML device list failed: driver not loaded"
        );
    }
}
