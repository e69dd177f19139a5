//! The Prometheus endpoint (`--metrics ADDR`): what vramscope knows of a job (allocated
//! against reserved, per-step and per-phase peaks, bytes by category, fragmentation, step
//! time) and the device's or host's readings, at `/metrics` in Prometheus's text format.
//!
//! The loop that holds the stores (the screen, a headless run, `watch`) copies their
//! figures into a plain snapshot after what it ingests; a scrape encodes that snapshot on
//! the endpoint's own thread. A scrape never reaches the job, nor waits for the loop.

pub mod http;

use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use vramscope_core::event::Category;
use vramscope_core::source::gauges::history::GaugeHistory;
use vramscope_core::store::ranks::Ranks;
use vramscope_core::store::Store;

/// Which job, rank and machine a figure is of (`rank` empty for a single process).
type Labels = Vec<(&'static str, String)>;

/// One rank's figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankFigures {
    pub device: String,
    pub rank: String,
    pub host: String,
    /// Bytes the live allocations asked for now (memory_viz's active memory).
    pub allocated: u64,
    pub reserved: u64,
    pub step_peak: u64,
    pub categories: Vec<(&'static str, u64)>,
    pub phase_peaks: Vec<(String, u64)>,
    /// Reserved bytes no allocation uses, as a share of reserved.
    pub fragmentation: f64,
    pub step_time_s: f64,
    pub tokens_per_s: f64,
    pub steps: u64,
    pub dropped_events: u64,
    pub ooms: u64,
}

/// One GPU's readings (NVML).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuFigures {
    pub index: u32,
    pub name: String,
    pub used: u64,
    pub total: u64,
    pub utilization: Option<f64>,
    pub power_w: Option<f64>,
    pub temperature_c: Option<f64>,
    /// (pid, bytes) of each process on it.
    pub processes: Vec<(u32, u64)>,
}

/// The machine's readings when NVML is not there.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostFigures {
    pub rss: u64,
    pub memory_used: u64,
    pub memory_total: u64,
    pub cpu: Option<f64>,
}

/// Everything one scrape serves.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figures {
    pub host: String,
    pub ranks: Vec<RankFigures>,
    pub gpus: Vec<GpuFigures>,
    pub host_gauges: Option<HostFigures>,
}

impl RankFigures {
    pub fn of(store: &Store, host: &str) -> RankFigures {
        let last = store.last_step();
        let (allocated, reserved) = (store.history.live_total(), store.history.reserved());
        let cats = store.history.category_bytes();
        let info = store.info.as_ref();
        RankFigures {
            device: info.map(|i| i.device.clone()).unwrap_or_default(),
            rank: info.and_then(|i| i.rank).map(|r| r.to_string()).unwrap_or_default(),
            host: info.map(|i| i.host.clone()).filter(|h| !h.is_empty()).unwrap_or_else(|| host.to_string()),
            allocated,
            reserved,
            step_peak: last.map_or(0, |s| s.peak_allocated_bytes),
            categories: Category::ALL.iter().map(|c| (c.as_str(), cats[*c as usize])).collect(),
            phase_peaks: last.map(|s| s.phase_peak_bytes.iter().map(|(p, b)| (p.clone(), *b)).collect()).unwrap_or_default(),
            fragmentation: if reserved > 0 { reserved.saturating_sub(allocated) as f64 / reserved as f64 } else { 0.0 },
            step_time_s: last.map_or(0.0, |s| s.step_time_s),
            tokens_per_s: last.map_or(0.0, |s| s.tokens_per_s),
            steps: last.map_or(0, |s| s.step + 1),
            dropped_events: store.lost_events + last.map_or(0, |s| s.dropped_events),
            ooms: store.ooms,
        }
    }
}

impl Figures {
    /// A job's ranks, and the readings in the shown rank's gauges (shared by all ranks).
    pub fn of_ranks(ranks: &Ranks) -> Figures {
        let host = vramscope_core::producer::host_name();
        let mut f = Figures::of_gauges(&ranks.shown().gauges);
        f.ranks = ranks.iter().map(|(_, s)| RankFigures::of(s, &host)).collect();
        f
    }

    /// The device's (or host's) readings alone (`vramscope watch`).
    pub fn of_gauges(g: &GaugeHistory) -> Figures {
        let gpus = g
            .latest_devices()
            .iter()
            .map(|d| GpuFigures {
                index: d.index,
                name: d.name.clone(),
                used: d.mem_used,
                total: d.mem_total,
                utilization: d.gpu_util.map(|u| u as f64 / 100.0),
                power_w: d.power_mw.map(|p| p as f64 / 1000.0),
                temperature_c: d.temp_c.map(f64::from),
                processes: d.processes.iter().map(|p| (p.pid, p.used_bytes.unwrap_or(0))).collect(),
            })
            .collect();
        let host_gauges = g.latest_host().map(|h| HostFigures {
            rss: h.rss_bytes,
            memory_used: h.mem_used,
            memory_total: h.mem_total,
            cpu: h.cpu_percent.map(|c| c as f64 / 100.0),
        });
        Figures { host: vramscope_core::producer::host_name(), ranks: Vec::new(), gpus, host_gauges }
    }
}

/// Encodes the latest snapshot at each scrape.
#[derive(Debug, Default)]
struct Snapshot(Arc<Mutex<Figures>>);

/// One metric family: its name (a counter's without `_total`), help, type, and samples.
struct Family {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Labels, f64)>,
}

impl Figures {
    /// Every family this snapshot holds, in the names the endpoint serves.
    fn families(&self) -> Vec<Family> {
        let rank_labels = |r: &RankFigures| -> Labels { vec![("device", r.device.clone()), ("rank", r.rank.clone()), ("host", r.host.clone())] };
        let gauge = |name, help, get: &dyn Fn(&RankFigures) -> f64| Family {
            name,
            help,
            kind: MetricType::Gauge,
            samples: self.ranks.iter().map(|r| (rank_labels(r), get(r))).collect(),
        };
        let counter = |name, help, get: &dyn Fn(&RankFigures) -> f64| Family { kind: MetricType::Counter, ..gauge(name, help, get) };
        let mut out = vec![
            gauge("vramscope_allocated_bytes", "Bytes the job's live allocations asked for (active memory).", &|r| r.allocated as f64),
            gauge("vramscope_reserved_bytes", "Bytes the caching allocator holds (modelled on CPU).", &|r| r.reserved as f64),
            gauge("vramscope_step_peak_bytes", "Peak allocated bytes of the last finished step.", &|r| r.step_peak as f64),
            gauge("vramscope_fragmentation_ratio", "Reserved bytes no allocation uses, as a share of reserved.", &|r| r.fragmentation),
            gauge("vramscope_step_time_seconds", "Wall time of the last finished step.", &|r| r.step_time_s),
            gauge("vramscope_tokens_per_second", "Tokens per second of the last finished step.", &|r| r.tokens_per_s),
            counter("vramscope_steps", "Steps finished.", &|r| r.steps as f64),
            counter("vramscope_dropped_events", "Allocator events this viewer did not get (totals stay exact).", &|r| r.dropped_events as f64),
            counter("vramscope_oom", "Out-of-memory errors.", &|r| r.ooms as f64),
        ];
        out.push(Family {
            name: "vramscope_category_bytes",
            help: "Live bytes by what they hold (parameter, optimizer_state, gradient, activation, ...).",
            kind: MetricType::Gauge,
            samples: self
                .ranks
                .iter()
                .flat_map(|r| r.categories.iter().map(move |(c, b)| ([rank_labels(r), vec![("category", c.to_string())]].concat(), *b as f64)))
                .collect(),
        });
        out.push(Family {
            name: "vramscope_phase_peak_bytes",
            help: "Peak allocated bytes of each phase of the last finished step.",
            kind: MetricType::Gauge,
            samples: self
                .ranks
                .iter()
                .flat_map(|r| r.phase_peaks.iter().map(move |(p, b)| ([rank_labels(r), vec![("phase", p.clone())]].concat(), *b as f64)))
                .collect(),
        });
        let gpu = |g: &GpuFigures| -> Labels { vec![("gpu", g.index.to_string()), ("modelName", g.name.clone()), ("host", self.host.clone())] };
        let per_gpu = |name, help, get: &dyn Fn(&GpuFigures) -> Option<f64>| Family {
            name,
            help,
            kind: MetricType::Gauge,
            samples: self.gpus.iter().filter_map(|g| Some((gpu(g), get(g)?))).collect(),
        };
        out.extend([
            per_gpu("vramscope_gpu_memory_used_bytes", "Device memory used, all processes (NVML).", &|g| Some(g.used as f64)),
            per_gpu("vramscope_gpu_memory_total_bytes", "Device memory in all (NVML).", &|g| Some(g.total as f64)),
            per_gpu("vramscope_gpu_utilization_ratio", "Share of time a kernel ran (NVML).", &|g| g.utilization),
            per_gpu("vramscope_gpu_power_watts", "Power draw (NVML).", &|g| g.power_w),
            per_gpu("vramscope_gpu_temperature_celsius", "GPU temperature (NVML).", &|g| g.temperature_c),
        ]);
        out.push(Family {
            name: "vramscope_gpu_process_memory_used_bytes",
            help: "Device memory of each process on the GPU (NVML).",
            kind: MetricType::Gauge,
            samples: self.gpus.iter().flat_map(|g| g.processes.iter().map(move |(pid, b)| ([gpu(g), vec![("pid", pid.to_string())]].concat(), *b as f64))).collect(),
        });
        if let Some(h) = &self.host_gauges {
            let host: Labels = vec![("host", self.host.clone())];
            let one = |name, help, v: Option<f64>| Family { name, help, kind: MetricType::Gauge, samples: v.map(|v| (host.clone(), v)).into_iter().collect() };
            out.extend([
                one("vramscope_host_rss_bytes", "Resident memory of the job's processes (without NVML).", Some(h.rss as f64)),
                one("vramscope_host_memory_used_bytes", "The machine's memory in use (without NVML).", Some(h.memory_used as f64)),
                one("vramscope_host_memory_total_bytes", "The machine's memory (without NVML).", Some(h.memory_total as f64)),
                one("vramscope_host_cpu_ratio", "Share of all CPU cores busy (without NVML).", h.cpu),
            ]);
        }
        out
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let figures = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for f in figures.families().into_iter().filter(|f| !f.samples.is_empty()) {
            let mut metric = encoder.encode_descriptor(f.name, f.help, None, f.kind)?;
            for (labels, v) in &f.samples {
                let e = metric.encode_family(labels)?;
                match f.kind {
                    MetricType::Counter => ConstCounter::new(*v as u64).encode(e)?,
                    _ => ConstGauge::new(*v).encode(e)?,
                }
            }
        }
        Ok(())
    }
}

/// The endpoint: bound when created (so a bad address or a taken port is said before any
/// training starts), serving the latest published figures.
pub struct Metrics {
    figures: Arc<Mutex<Figures>>,
    pub addr: std::net::SocketAddr,
    _server: http::Server,
}

impl Metrics {
    /// Serves on `addr` (`PORT` binds loopback; `HOST:PORT` what it names).
    pub fn serve(addr: &str) -> anyhow::Result<Metrics> {
        let at = vramscope_core::channel::parse_listen(addr).map_err(|e| anyhow::anyhow!("{}", e.to_string().replacen("--listen", "--metrics", 1)))?;
        let figures = Arc::new(Mutex::new(Figures::default()));
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Snapshot(figures.clone())));
        let server = http::Server::start(at, registry).map_err(|e| anyhow::anyhow!("--metrics {addr}: {e}"))?;
        let addr = server.addr;
        // Anything but loopback was named by the user; said, since the figures name the
        // job's host, devices and phases (its modules).
        eprintln!(
            "vramscope: metrics at http://{addr}/metrics{}",
            if addr.ip().is_loopback() {
                " (loopback only)"
            } else {
                " (not loopback: whoever reaches this address reads the job's host, device and phase names)"
            }
        );
        Ok(Metrics { figures, addr, _server: server })
    }

    pub fn publish(&self, f: Figures) {
        *self.figures.lock().unwrap_or_else(|e| e.into_inner()) = f;
    }
}

/// A headless run's stores, kept for the endpoint only (a screen has its own): what
/// arrives is ingested, and published after each step and at most four times a second.
pub struct Feed<'a> {
    metrics: &'a Metrics,
    ranks: Ranks,
    published: std::time::Instant,
}

impl<'a> Feed<'a> {
    pub fn new(metrics: &'a Metrics) -> Feed<'a> {
        Feed { metrics, ranks: Ranks::new(1 << 16), published: std::time::Instant::now() }
    }

    pub fn ingest(&mut self, rank: u32, item: &vramscope_core::stream::Incoming) {
        let step = matches!(item, vramscope_core::stream::Incoming::Report(vramscope_core::stream::Report::Step(_)));
        self.ranks.ingest(rank, item.clone());
        if step || self.published.elapsed() >= std::time::Duration::from_millis(250) {
            self.metrics.publish(Figures::of_ranks(&self.ranks));
            self.published = std::time::Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_core::stream::{EngineInfo, Incoming, Report};

    #[test]
    fn a_scrape_serves_each_rank_s_figures_under_the_documented_names() {
        let mut ranks = Ranks::new(1 << 12);
        for r in [0u32, 1] {
            let info = EngineInfo { device: format!("cuda:{r}"), rank: Some(r), host: "node7".into(), ..EngineInfo::default() };
            ranks.ingest(r, Incoming::Report(Report::Started(info)));
        }
        let f = Figures::of_ranks(&ranks);
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Snapshot(Arc::new(Mutex::new(f)))));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for want in [
            r#"vramscope_allocated_bytes{device="cuda:1",rank="1",host="node7"} 0"#,
            "# TYPE vramscope_steps counter",
            r#"vramscope_steps_total{device="cuda:0",rank="0",host="node7"} 0"#,
            r#"vramscope_category_bytes{device="cuda:0",rank="0",host="node7",category="parameter"} 0"#,
            "# EOF",
        ] {
            assert!(text.contains(want), "{want} in:\n{text}");
        }
    }
}
