//! CPU: a snapshot the engine wrote, read back with vramscope's reader, gives the peaks the
//! live store computed from the stream.

use crate::report::snapshot_summary::reserved_peak;
use crate::snapshot::model::Snapshot;
use crate::snapshot::timeline::Timeline;
use crate::store::Store;

use super::check::Outcome;

/// `snap` was cut after the store's last step.
pub fn check(snap: &Snapshot, store: &Store) -> Outcome {
    let active = Timeline::from_snapshot(snap, 0).peak_bytes;
    let (reserved, _) = reserved_peak(snap, 0);
    let step_active = store.steps.iter().map(|s| s.peak_active_bytes).max().unwrap_or(0);
    let step_reserved = store.steps.iter().map(|s| s.peak_reserved_bytes).max().unwrap_or(0);
    let live = store.peak.0;
    if active != live || active != step_active {
        return Outcome::Fail(format!(
            "active peak: the snapshot read back says {active} B, the live store {live} B (steps' reports {step_active} B)"
        ));
    }
    if reserved != step_reserved {
        return Outcome::Fail(format!("reserved peak: the snapshot read back says {reserved} B, the live store's steps {step_reserved} B"));
    }
    if active == 0 {
        return Outcome::Fail("the snapshot read back holds no allocation".into());
    }
    Outcome::Pass(format!(
        "active peak {active} B and reserved peak {reserved} B, read back from {} trace entries, equal the live store's",
        snap.trace(0).len()
    ))
}
