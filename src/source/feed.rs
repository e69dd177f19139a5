//! The items every producer (engine, gauge thread, recording, snapshot trace) sends and every
//! consumer (store, headless printer, recorder) takes: one shape for live, replay and headless.

use crossbeam_channel::{Receiver, TryRecvError};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::event::Batch;
use crate::source::gauges::sample::GaugeBatch;
use crate::train::engine::{Engine, Report};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Incoming {
    Batch(Batch),
    Report(Report),
    Gauges(GaugeBatch),
    /// A replay went back in time: consumers start again from an empty store.
    Restart,
}

/// The next item from an engine's channels (and a gauge thread's, when given), blocking.
/// Batches go first when both are ready, so a step's events precede its report. None once
/// the engine has finished and everything it sent has been taken.
pub fn next_item(batches: &Receiver<Batch>, reports: &Receiver<Report>, gauges: Option<&Receiver<GaugeBatch>>) -> Option<Incoming> {
    match batches.try_recv() {
        Ok(b) => return Some(Incoming::Batch(b)),
        Err(TryRecvError::Disconnected) => return reports.recv().ok().map(Incoming::Report),
        Err(TryRecvError::Empty) => {}
    }
    let never = crossbeam_channel::never();
    let gauges = gauges.unwrap_or(&never);
    crossbeam_channel::select! {
        recv(batches) -> b => match b {
            Ok(b) => Some(Incoming::Batch(b)),
            Err(_) => reports.recv().ok().map(Incoming::Report),
        },
        recv(reports) -> r => r.ok().map(Incoming::Report),
        recv(gauges) -> g => match g {
            Ok(g) => Some(Incoming::Gauges(g)),
            // The gauge thread stopped (no source at all): carry on without it.
            Err(_) => next_item(batches, reports, None),
        },
    }
}

/// An engine's items in order, ending after `Report::Finished` (for headless consumers).
/// An engine thread that goes away without finishing (a panic) ends with an error report.
pub fn engine_items(engine: &Engine) -> impl Iterator<Item = Incoming> + '_ {
    let mut finished = false;
    std::iter::from_fn(move || {
        if finished {
            // What the engine sent before finishing still belongs to the session.
            return engine.batches.try_recv().ok().map(Incoming::Batch);
        }
        let item = next_item(&engine.batches, &engine.reports, None)
            .unwrap_or_else(|| Incoming::Report(Report::Error("the training engine stopped without saying why".into())));
        finished = matches!(item, Incoming::Report(Report::Finished | Report::Error(_)));
        Some(item)
    })
}

/// Forwards an engine's and a gauge thread's channels into an async loop, from a thread.
pub fn bridge(engine: &Engine, gauges: Receiver<GaugeBatch>) -> mpsc::Receiver<Incoming> {
    let (tx, rx) = mpsc::channel(1024);
    let batches = engine.batches.clone();
    let reports = engine.reports.clone();
    std::thread::Builder::new()
        .name("vramscope-bridge".into())
        .spawn(move || {
            while let Some(item) = next_item(&batches, &reports, Some(&gauges)) {
                if tx.blocking_send(item).is_err() {
                    break;
                }
            }
        })
        .expect("spawn bridge thread");
    rx
}
