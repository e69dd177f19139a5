//! The UI side's record of gauge samples: a fixed-capacity ring and the queries the
//! screens draw from.

use std::collections::VecDeque;

use super::sample::{DeviceSample, GaugeBatch, GaugeSample, HostSample, SourceStatus};

/// A series the screens can plot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// Bytes used on a device.
    DeviceMemUsed(u32),
    /// GPU utilization percent.
    DeviceUtil(u32),
    /// Watts.
    DevicePower(u32),
    /// Degrees C.
    DeviceTemp(u32),
    HostRss,
    HostMemUsed,
    /// All cores, percent.
    HostCpu,
}

impl Metric {
    pub fn value(self, s: &GaugeSample) -> Option<f64> {
        let dev = |i: u32| s.devices().iter().find(|d| d.index == i);
        let host = || s.host();
        match self {
            Metric::DeviceMemUsed(i) => dev(i).map(|d| d.mem_used as f64),
            Metric::DeviceUtil(i) => dev(i)?.gpu_util.map(f64::from),
            Metric::DevicePower(i) => dev(i)?.power_mw.map(|p| p as f64 / 1000.0),
            Metric::DeviceTemp(i) => dev(i)?.temp_c.map(f64::from),
            Metric::HostRss => host().map(|h| h.rss_bytes as f64),
            Metric::HostMemUsed => host().map(|h| h.mem_used as f64),
            Metric::HostCpu => host()?.cpu_percent.map(f64::from),
        }
    }
}

#[derive(Clone, Debug)]
pub struct GaugeHistory {
    samples: VecDeque<GaugeSample>,
    capacity: usize,
    status: Option<SourceStatus>,
    next_seq: u64,
    missed: u64,
    selected_device: u32,
}

impl GaugeHistory {
    /// `selected_device`: the device the engine trains on, highlighted by the screens.
    pub fn new(capacity: usize, selected_device: u32) -> Self {
        assert!(capacity > 0, "a gauge history needs room for one sample");
        GaugeHistory {
            samples: VecDeque::with_capacity(capacity),
            capacity,
            status: None,
            next_seq: 0,
            missed: 0,
            selected_device,
        }
    }

    pub fn ingest(&mut self, batch: GaugeBatch) {
        if let Some(s) = batch.status {
            self.status = Some(s);
        }
        self.missed += batch.first_seq.saturating_sub(self.next_seq);
        self.next_seq = batch.first_seq + batch.samples.len() as u64;
        for s in batch.samples {
            if self.samples.len() == self.capacity {
                self.samples.pop_front();
            }
            self.samples.push_back(s);
        }
    }

    pub fn status(&self) -> Option<&SourceStatus> {
        self.status.as_ref()
    }

    /// Samples lost in transit (dropped batches), from sequence gaps.
    pub fn missed(&self) -> u64 {
        self.missed
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn selected_device(&self) -> u32 {
        self.selected_device
    }

    pub fn set_selected_device(&mut self, index: u32) {
        self.selected_device = index;
    }

    pub fn samples(&self) -> impl DoubleEndedIterator<Item = &GaugeSample> + ExactSizeIterator {
        self.samples.iter()
    }

    pub fn latest(&self) -> Option<&GaugeSample> {
        self.samples.back()
    }

    pub fn latest_devices(&self) -> &[DeviceSample] {
        self.latest().map(GaugeSample::devices).unwrap_or(&[])
    }

    pub fn latest_device(&self, index: u32) -> Option<&DeviceSample> {
        self.latest_devices().iter().find(|d| d.index == index)
    }

    pub fn latest_host(&self) -> Option<&HostSample> {
        self.latest()?.host()
    }

    /// (t_ns, value) over the history, oldest first, skipping samples without the value.
    pub fn series(&self, metric: Metric) -> Vec<(u64, f64)> {
        self.samples
            .iter()
            .filter_map(|s| Some((s.t_ns, metric.value(s)?)))
            .collect()
    }

    /// The largest value of `metric` in the history.
    pub fn peak(&self, metric: Metric) -> Option<f64> {
        self.samples
            .iter()
            .filter_map(|s| metric.value(s))
            .fold(None, |m, v| Some(m.map_or(v, |m: f64| m.max(v))))
    }
}
