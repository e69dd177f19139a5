//! Bridges blocking sources (a job's ranks, a recording's player, the gauge thread) into
//! the screen's async loop.

use crossbeam_channel::Receiver;
use tokio::sync::mpsc;

use crate::source::gauges::sample::GaugeBatch;
use crate::source::job::Fed;
use crate::stream::Incoming;

/// Forwards `items` (and, while they last, `gauges`, which belong to every rank) into an
/// async channel, from a thread. It closes once `items` ends.
pub fn bridge(items: Receiver<Fed>, gauges: Option<Receiver<GaugeBatch>>) -> mpsc::Receiver<Fed> {
    let (tx, rx) = mpsc::channel(1024);
    std::thread::Builder::new()
        .name("vramscope-bridge".into())
        .spawn(move || {
            let never = crossbeam_channel::never();
            let mut gauges = gauges;
            loop {
                let g = gauges.as_ref().unwrap_or(&never);
                let fed = crossbeam_channel::select! {
                    recv(items) -> i => match i {
                        Ok(f) => f,
                        Err(_) => return,
                    },
                    recv(g) -> b => match b {
                        Ok(b) => (0, Incoming::Gauges(b)),
                        // The gauge thread stopped (no source at all): carry on without it.
                        Err(_) => {
                            gauges = None;
                            continue;
                        }
                    },
                };
                if tx.blocking_send(fed).is_err() {
                    return;
                }
            }
        })
        .expect("spawn bridge thread");
    rx
}
