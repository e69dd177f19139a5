//! Live bytes at one moment grouped by category or by top frame: the snapshot summary's
//! and the OOM report's breakdowns.

use std::collections::HashMap;

use serde::Serialize;

use super::frames::top_frame_label;
use crate::snapshot::model::{Snapshot, StackId};
use crate::snapshot::timeline::{Timeline, TimelineAlloc};

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GroupBytes {
    pub name: String,
    pub bytes: u64,
    pub allocations: usize,
}

impl GroupBytes {
    /// The group as a row of a text table: bytes, allocations, name.
    pub fn row(&self) -> String {
        let noun = if self.allocations == 1 { "alloc " } else { "allocs" };
        format!("{:>10}  {:>6} {noun}  {}", crate::format::bytes(self.bytes), self.allocations, self.name)
    }
}

/// Bytes alive at the peak, grouped by category or by top frame; largest first.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Breakdown {
    /// "category" or "top_frame".
    pub by: &'static str,
    pub at_event: usize,
    pub groups: Vec<GroupBytes>,
}

/// Whether the trace names categories (group by them then, else by top frame): ones it
/// records, or ones the frame rules matched on this device.
pub fn has_categories(tl: &Timeline) -> bool {
    tl.categories.iter().any(|c| c != "unknown" && c != super::frame_rules::UNMATCHED)
}

pub fn breakdown_at_peak(snap: &Snapshot, tl: &Timeline, by_category: bool) -> Breakdown {
    let at = tl.peak_index;
    let alive = tl.allocations.iter().filter(|a| tl.total_events == 0 || a.alive_at(at));
    breakdown_of(snap, tl, alive, at, by_category)
}

/// Bytes of `allocations` grouped by category or by top frame; largest first.
pub fn breakdown_of<'a>(snap: &Snapshot, tl: &Timeline, allocations: impl Iterator<Item = &'a TimelineAlloc>, at_event: usize, by_category: bool) -> Breakdown {
    let mut groups: HashMap<String, (u64, usize)> = HashMap::new();
    let mut labels: HashMap<StackId, String> = HashMap::new();
    for a in allocations {
        let name = if by_category {
            tl.categories[a.category as usize].clone()
        } else {
            labels
                .entry(a.stack)
                .or_insert_with(|| top_frame_label(snap, a.stack).unwrap_or_else(|| "(no frames)".into()))
                .clone()
        };
        let g = groups.entry(name).or_default();
        g.0 += a.size;
        g.1 += 1;
    }
    let mut groups: Vec<GroupBytes> = groups.into_iter().map(|(name, (bytes, allocations))| GroupBytes { name, bytes, allocations }).collect();
    groups.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    Breakdown { by: if by_category { "category" } else { "top_frame" }, at_event, groups }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_counts_one_allocation_in_the_singular() {
        let g = |allocations| GroupBytes { name: "optimizer_state".into(), bytes: 2048, allocations };
        assert_eq!(g(1).row(), "  2.00 KiB       1 alloc   optimizer_state");
        assert_eq!(g(3).row(), "  2.00 KiB       3 allocs  optimizer_state");
    }
}
