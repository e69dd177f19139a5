//! The gauge thread end to end: the real NVML failure on this machine, recorded NVML
//! readings through sampler → batches → history, loss of the GPU mid-run, back-pressure.

use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver};
use vramscope_core::source::gauges::{
    open_reader, spawn_gauges, spawn_gauges_with, GaugeBatch, GaugeConfig, GaugeHistory,
    GaugeReader, Gauges, Metric, NvmlQuery, NvmlReader, OpenedSource, RawDevice, RawError,
    RecordedQuery, SourceKind, SourceStatus, Watched,
};

const GIB: u64 = 1 << 30;

fn recv(rx: &Receiver<GaugeBatch>) -> GaugeBatch {
    rx.recv_timeout(Duration::from_secs(5))
        .expect("a batch within 5 s")
}

fn cfg(interval_ms: u64) -> GaugeConfig {
    GaugeConfig {
        interval: Duration::from_millis(interval_ms),
        origin: Instant::now(),
        job: Watched::default(),
    }
}

#[test]
fn without_nvml_the_host_source_is_chosen_and_says_why() {
    match NvmlQuery::open() {
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.starts_with("NVML unavailable: "), "{msg}");
            if msg.contains("cannot open shared object file") {
                assert!(msg.contains("libnvidia-ml.so.1"), "{msg}");
            }
            let (reader, status) = open_reader(&Watched::default());
            assert_eq!(
                status,
                SourceStatus {
                    kind: SourceKind::Host,
                    reason: Some(msg)
                }
            );
            assert!(matches!(reader.unwrap().sample(), Ok(Gauges::Host(_))));
        }
        // On a GPU machine the same call must pick NVML.
        Ok(_) => assert_eq!(open_reader(&Watched::default()).1.kind, SourceKind::Nvml),
    }
}

#[test]
fn real_sampler_states_its_source_once_and_stops_on_drop() {
    let (tx, rx) = bounded(16);
    let handle = spawn_gauges(cfg(20), tx);
    let first = recv(&rx);
    let status = first.status.expect("the first batch states the source");
    assert_eq!(first.first_seq, 0);
    assert_eq!(first.samples.len(), 1);
    match status.kind {
        SourceKind::Host => {
            assert!(status.reason.unwrap().starts_with("NVML unavailable: "));
            assert!(first.samples[0].host().unwrap().rss_bytes > 0);
        }
        SourceKind::Nvml => assert!(!first.samples[0].devices().is_empty()),
        SourceKind::None => panic!("no source: {:?}", status.reason),
    }
    let second = recv(&rx);
    assert_eq!(second.status, None, "the reason is said once");
    assert_eq!(second.first_seq, 1);
    drop(handle);
    // The thread flushed and hung up: the channel drains and disconnects.
    while rx.recv_timeout(Duration::from_secs(5)).is_ok() {}
    assert!(rx.recv().is_err());
}

#[test]
fn dropping_the_handle_interrupts_a_long_interval() {
    let (tx, rx) = bounded(4);
    let handle = spawn_gauges(cfg(60_000), tx);
    recv(&rx);
    let t = Instant::now();
    drop(handle);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "stop waited for the interval"
    );
}

fn device(used_gib: u64, temp: Result<u32, RawError>) -> RawDevice {
    RawDevice {
        utilization: Ok((50, 20)),
        temp_c: temp,
        ..RawDevice::new(0, "NVIDIA H100 80GB HBM3", used_gib * GIB, 80 * GIB)
    }
}

/// Opens a recording as if NVML had started.
fn recorded(frames: Vec<Result<Vec<RawDevice>, RawError>>) -> impl FnOnce() -> OpenedSource + Send {
    move || {
        let reader = NvmlReader::new(RecordedQuery::new(frames), Watched::of(&[1]));
        let status = SourceStatus {
            kind: SourceKind::Nvml,
            reason: None,
        };
        (Some(Box::new(reader) as Box<dyn GaugeReader>), status)
    }
}

#[test]
fn with_no_source_the_sampler_says_why_and_ends() {
    let (tx, rx) = bounded(4);
    let status = SourceStatus {
        kind: SourceKind::None,
        reason: Some("NVML unavailable: x; host gauges: cannot read /proc/stat: gone".into()),
    };
    let sent = status.clone();
    let _handle = spawn_gauges_with(cfg(5), tx, move || (None, sent));
    let batch = recv(&rx);
    assert_eq!(batch.status, Some(status));
    assert!(batch.samples.is_empty());
    assert!(
        rx.recv_timeout(Duration::from_secs(5)).is_err(),
        "the thread ended"
    );
}

#[test]
fn recorded_nvml_flows_into_history_then_degrades_to_host_once() {
    let frames = vec![
        Ok(vec![device(10, Ok(40))]),
        Ok(vec![device(20, Ok(41))]),
        Ok(vec![device(30, Ok(42))]),
        Ok(vec![device(30, Err(RawError::Lost("GPU is lost".into())))]),
    ];
    let (tx, rx) = bounded(64);
    let handle = spawn_gauges_with(cfg(5), tx, recorded(frames));
    let mut history = GaugeHistory::new(10_000, 0);
    let mut statuses = Vec::new();
    while history.latest_host().is_none() {
        let b = recv(&rx);
        statuses.extend(b.status.clone());
        history.ingest(b);
    }
    // Host samples keep coming; the change of source is announced once.
    for _ in 0..3 {
        let b = recv(&rx);
        statuses.extend(b.status.clone());
        history.ingest(b);
    }
    drop(handle);
    assert_eq!(
        statuses,
        [
            SourceStatus {
                kind: SourceKind::Nvml,
                reason: None
            },
            SourceStatus {
                kind: SourceKind::Host,
                reason: Some("NVML temperature failed on GPU 0: GPU is lost".into())
            },
        ]
    );
    assert_eq!(history.status().unwrap().kind, SourceKind::Host);
    let mem: Vec<f64> = history
        .series(Metric::DeviceMemUsed(0))
        .iter()
        .map(|p| p.1)
        .collect();
    assert_eq!(mem, [10.0, 20.0, 30.0].map(|g| g * GIB as f64));
    let temps: Vec<f64> = history
        .series(Metric::DeviceTemp(0))
        .iter()
        .map(|p| p.1)
        .collect();
    assert_eq!(temps, [40.0, 41.0, 42.0]);
    assert_eq!(
        history.peak(Metric::DeviceMemUsed(0)),
        Some(30.0 * GIB as f64)
    );
    assert!(history.series(Metric::HostRss).len() >= 3);
    let times: Vec<u64> = history.samples().map(|s| s.t_ns).collect();
    assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
    assert_eq!(history.missed(), 0);
}

#[test]
fn a_full_channel_drops_batches_and_history_counts_the_gap() {
    let (tx, rx) = bounded(1);
    let handle = spawn_gauges_with(cfg(5), tx, recorded(vec![Ok(vec![device(1, Ok(30))])]));
    // Nobody reads for a while: the first batch waits in the channel, later ones drop.
    std::thread::sleep(Duration::from_millis(900));
    assert!(handle.dropped() > 0);
    let mut history = GaugeHistory::new(10_000, 0);
    history.ingest(recv(&rx));
    history.ingest(recv(&rx));
    assert!(history.missed() > 0);
    assert!(history.missed() <= handle.dropped());
    assert_eq!(history.status().unwrap().kind, SourceKind::Nvml);
}

#[test]
fn history_keeps_only_its_capacity() {
    let mut history = GaugeHistory::new(3, 0);
    let frames: Vec<_> = (1..=5).map(|g| Ok(vec![device(g, Ok(30))])).collect();
    let mut reader = NvmlReader::new(RecordedQuery::new(frames), Watched::of(&[1]));
    for seq in 0..5 {
        history.ingest(GaugeBatch {
            first_seq: seq,
            status: None,
            samples: vec![vramscope_core::source::gauges::GaugeSample {
                t_ns: seq * 1000,
                gauges: reader.sample().unwrap(),
            }],
        });
    }
    assert_eq!(history.len(), 3);
    let mem: Vec<f64> = history
        .series(Metric::DeviceMemUsed(0))
        .iter()
        .map(|p| p.1 / GIB as f64)
        .collect();
    assert_eq!(mem, [3.0, 4.0, 5.0]);
    assert_eq!(history.latest_device(0).unwrap().mem_used, 5 * GIB);
}

/// Issue 34: `run --headless --metrics` served the allocator's figures but no device or host
/// gauges (headless started no sampler), though a headless job on every node is where
/// Prometheus scrapes them. Scraped here from the real binary: the host's readings (NVML's
/// on a GPU machine) are served.
#[test]
fn a_headless_run_serves_the_device_or_host_gauges() {
    use std::io::{BufRead, Read, Write};
    /// Ends the run however the test ends (its engine goes with it).
    struct Job(std::process::Child);
    impl Drop for Job {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut job = Job(
        std::process::Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(["run", "--headless", "--steps", "1000", "--ctx", "16", "--batch", "1", "--metrics", "127.0.0.1:0"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut err = std::io::BufReader::new(job.0.stderr.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "no metrics address said");
        if let Some(rest) = line.split("metrics at http://").nth(1) {
            break rest.split('/').next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    let scrape = || {
        let mut s = std::net::TcpStream::connect(&addr).ok()?;
        write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        Some(body)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let served = loop {
        let body = scrape().unwrap_or_default();
        if body.contains("vramscope_host_memory_total_bytes") || body.contains("vramscope_gpu_memory_total_bytes") {
            break body;
        }
        assert!(Instant::now() < deadline, "no device or host gauges served:\n{body}");
        std::thread::sleep(Duration::from_millis(200));
    };
    drop(job);
    assert!(served.contains("vramscope_host_rss_bytes") || served.contains("vramscope_gpu_memory_used_bytes"), "{served}");
}
