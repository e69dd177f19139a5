//! The gauge thread: samples the active source at a fixed interval and sends batches.
//! It owns the reader (NVML handles stay on one thread) and falls back to host gauges,
//! once, when NVML fails.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};

use super::host::HostReader;
use super::watched::Watched;
use super::nvml::{NvmlQuery, NvmlReader};
use super::reader::{GaugeError, GaugeReader};
use super::sample::{GaugeBatch, GaugeSample, SourceKind, SourceStatus};

/// Thread name, also what /proc/<pid>/task/<tid>/comm shows (benches find it by this).
pub const THREAD_NAME: &str = "vramscope-gauge";

/// Batches go out at least this often, so the UI (≤ 4 fps) never waits on the sampler.
const MAX_BATCH_AGE: Duration = Duration::from_millis(250);

#[derive(Clone, Debug)]
pub struct GaugeConfig {
    pub interval: Duration,
    /// Zero of `GaugeSample::t_ns`: the session start, shared with the engine.
    pub origin: Instant,
    /// Whose process figures (RSS, CPU, GPU memory) count as the job's.
    pub job: Watched,
}

impl Default for GaugeConfig {
    fn default() -> Self {
        GaugeConfig {
            interval: Duration::from_millis(250),
            origin: Instant::now(),
            job: Watched::default(),
        }
    }
}

/// What a sampler starts with: a reader (none if no source works) and what to tell the UI.
pub type OpenedSource = (Option<Box<dyn GaugeReader>>, SourceStatus);

/// Opens NVML, or host gauges with the reason NVML is not used.
pub fn open_reader(job: &Watched) -> OpenedSource {
    match NvmlQuery::open() {
        Ok(q) => (
            Some(Box::new(NvmlReader::new(q, job.clone()))),
            SourceStatus {
                kind: SourceKind::Nvml,
                reason: None,
            },
        ),
        Err(e) => fall_back(&e, job),
    }
}

/// Host gauges after `why`; if /proc is unreadable too, no source, saying both reasons.
fn fall_back(why: &GaugeError, job: &Watched) -> OpenedSource {
    match HostReader::open(job.clone()) {
        Ok(h) => (
            Some(Box::new(h)),
            SourceStatus {
                kind: SourceKind::Host,
                reason: Some(why.to_string()),
            },
        ),
        Err(host_err) => (
            None,
            SourceStatus {
                kind: SourceKind::None,
                reason: Some(format!("{why}; host gauges: {host_err}")),
            },
        ),
    }
}

/// Stops the sampler when dropped (or on `stop`), waiting for the thread to end.
pub struct GaugeHandle {
    stop_tx: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
    dropped: Arc<AtomicU64>,
}

impl GaugeHandle {
    /// Samples lost because the receiver was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Stops the sampler and waits for it to end (as dropping the handle does).
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for GaugeHandle {
    fn drop(&mut self) {
        // Disconnecting wakes the sampler from its wait at once.
        self.stop_tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Samples the best available source (NVML, else host) on its own thread.
pub fn spawn_gauges(cfg: GaugeConfig, tx: Sender<GaugeBatch>) -> GaugeHandle {
    let job = cfg.job.clone();
    spawn_gauges_with(cfg, tx, move || open_reader(&job))
}

/// As `spawn_gauges`, with the source opened by `open` on the sampler thread.
pub fn spawn_gauges_with<F>(cfg: GaugeConfig, tx: Sender<GaugeBatch>, open: F) -> GaugeHandle
where
    F: FnOnce() -> OpenedSource + Send + 'static,
{
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
    let dropped = Arc::new(AtomicU64::new(0));
    let counter = dropped.clone();
    let thread = std::thread::Builder::new()
        .name(THREAD_NAME.into())
        .spawn(move || {
            let (reader, status) = open();
            run(cfg, reader, status, tx, stop_rx, counter)
        })
        .expect("spawning the gauge thread");
    GaugeHandle {
        stop_tx: Some(stop_tx),
        thread: Some(thread),
        dropped,
    }
}

struct Outbox {
    tx: Sender<GaugeBatch>,
    next_seq: u64,
    pending: GaugeBatch,
    last_send: Instant,
    dropped: Arc<AtomicU64>,
}

impl Outbox {
    /// Sends the pending batch; returns false when the receiver is gone.
    fn flush(&mut self) -> bool {
        if self.pending.samples.is_empty() && self.pending.status.is_none() {
            return true;
        }
        let n = self.pending.samples.len() as u64;
        let batch = std::mem::take(&mut self.pending);
        self.last_send = Instant::now();
        let status = batch.status.clone();
        let ok = match self.tx.try_send(batch) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(n, Ordering::Relaxed);
                // The source status must arrive; it rides on the next batch.
                self.pending.status = status;
                true
            }
            Err(TrySendError::Disconnected(_)) => false,
        };
        self.next_seq += n;
        self.pending.first_seq = self.next_seq;
        ok
    }
}

fn run(
    cfg: GaugeConfig,
    reader: Option<Box<dyn GaugeReader>>,
    status: SourceStatus,
    tx: Sender<GaugeBatch>,
    stop: Receiver<()>,
    dropped: Arc<AtomicU64>,
) {
    let mut out = Outbox {
        tx,
        next_seq: 0,
        pending: GaugeBatch {
            status: Some(status),
            ..GaugeBatch::default()
        },
        last_send: Instant::now(),
        dropped,
    };
    let Some(mut reader) = reader else {
        out.flush();
        return;
    };
    let mut deadline = Instant::now();
    loop {
        match reader.sample() {
            Ok(gauges) => out.pending.samples.push(GaugeSample {
                t_ns: cfg.origin.elapsed().as_nanos() as u64,
                gauges,
            }),
            Err(e) => {
                // NVML failing degrades to host gauges, once; host gauges failing ends it.
                let (next, status) = if reader.kind() == SourceKind::Nvml {
                    fall_back(&e, &cfg.job)
                } else {
                    let status = SourceStatus {
                        kind: SourceKind::None,
                        reason: Some(e.to_string()),
                    };
                    (None, status)
                };
                out.pending.status = Some(status);
                match next {
                    // Sample the new source at once; the status rides with that sample.
                    Some(r) => reader = r,
                    None => {
                        out.flush();
                        return;
                    }
                }
                continue;
            }
        }
        // Send now if waiting one more interval would make the batch too old.
        let due = out.last_send.elapsed() + cfg.interval > MAX_BATCH_AGE;
        if (out.pending.status.is_some() || due) && !out.flush() {
            return;
        }
        // Fixed-rate schedule; after a stall, resume from now instead of bursting.
        deadline += cfg.interval;
        let now = Instant::now();
        if deadline < now {
            deadline = now;
        }
        match stop.recv_timeout(deadline - now) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                out.flush();
                return;
            }
        }
    }
}
