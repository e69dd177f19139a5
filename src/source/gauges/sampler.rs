//! The gauge thread: samples the active source at a fixed interval and sends batches.
//! It owns the reader (NVML handles stay on one thread) and falls back to host gauges,
//! once, when NVML fails.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};

use super::host::HostReader;
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
}

impl Default for GaugeConfig {
    fn default() -> Self {
        GaugeConfig {
            interval: Duration::from_millis(250),
            origin: Instant::now(),
        }
    }
}

/// Opens NVML, or host gauges with the reason NVML is not used.
pub fn open_reader() -> (Box<dyn GaugeReader>, SourceStatus) {
    match NvmlQuery::open() {
        Ok(q) => (
            Box::new(NvmlReader::new(q, std::process::id())),
            SourceStatus {
                kind: SourceKind::Nvml,
                reason: None,
            },
        ),
        Err(e) => fall_back(&e),
    }
}

/// Host gauges after `why`; if /proc is unreadable too, an empty source that says so.
fn fall_back(why: &GaugeError) -> (Box<dyn GaugeReader>, SourceStatus) {
    match HostReader::open() {
        Ok(h) => (
            Box::new(h),
            SourceStatus {
                kind: SourceKind::Host,
                reason: Some(why.to_string()),
            },
        ),
        Err(host_err) => (
            Box::new(NoSource),
            SourceStatus {
                kind: SourceKind::None,
                reason: Some(format!("{why}; host gauges: {host_err}")),
            },
        ),
    }
}

/// Stands in when no source works; the sampler stops at its first sample.
struct NoSource;

impl GaugeReader for NoSource {
    fn kind(&self) -> SourceKind {
        SourceKind::None
    }
    fn sample(&mut self) -> Result<super::sample::Gauges, GaugeError> {
        Err(GaugeError::Proc {
            path: "/proc".into(),
            detail: "no gauge source".into(),
        })
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

    pub fn stop(self) {}
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
    spawn_gauges_with(cfg, tx, open_reader)
}

/// As `spawn_gauges`, with the source opened by `open` on the sampler thread.
pub fn spawn_gauges_with<F>(cfg: GaugeConfig, tx: Sender<GaugeBatch>, open: F) -> GaugeHandle
where
    F: FnOnce() -> (Box<dyn GaugeReader>, SourceStatus) + Send + 'static,
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
    mut reader: Box<dyn GaugeReader>,
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
    let mut deadline = Instant::now();
    loop {
        match reader.sample() {
            Ok(gauges) => out.pending.samples.push(GaugeSample {
                t_ns: cfg.origin.elapsed().as_nanos() as u64,
                gauges,
            }),
            Err(e) => {
                let no_fallback = reader.kind() != SourceKind::Nvml;
                let (next, status) = if no_fallback {
                    (Box::new(NoSource) as Box<dyn GaugeReader>, SourceStatus {
                        kind: SourceKind::None,
                        reason: Some(e.to_string()),
                    })
                } else {
                    fall_back(&e)
                };
                let stopped = status.kind == SourceKind::None;
                reader = next;
                out.pending.status = Some(status);
                out.flush();
                if stopped {
                    return;
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
