//! What a write-up says of one snapshot beyond its summary: how well reserved memory is
//! used, the sizes allocated and left cached, and findings against the thresholds people
//! check by hand (cache overhead over 10%, unused cached blocks over 100 MB, fragmentation,
//! memory that keeps growing across steps).

use serde::Serialize;

use super::snapshot_summary::SnapshotSummary;
use crate::format::bytes;
use crate::snapshot::model::{BlockState, Snapshot};
use crate::snapshot::timeline::Timeline;

/// Cached but unallocated memory above this share of reserved is worth a finding.
pub const CACHE_OVERHEAD_SHARE: f64 = 0.10;
/// A cached free block at least this big is memory another process could use.
pub const UNUSED_BLOCK_BYTES: u64 = 100 << 20;

/// A histogram over sizes in powers of two: `buckets[k]` counts sizes in (2^(k-1), 2^k].
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SizeHistogram {
    /// (upper bound in bytes, count, bytes).
    pub buckets: Vec<(u64, u64, u64)>,
}

impl SizeHistogram {
    /// Every power of two from the smallest size's to the largest's gets a bucket, empty
    /// ones too, so the buckets lie on an even log scale.
    pub fn of(sizes: impl Iterator<Item = u64>) -> SizeHistogram {
        let mut by_power = [(0u64, 0u64); 65];
        for s in sizes {
            let k = s.max(1).next_power_of_two().trailing_zeros() as usize;
            by_power[k].0 += 1;
            by_power[k].1 += s;
        }
        let used: Vec<usize> = (0..by_power.len()).filter(|k| by_power[*k].0 > 0).collect();
        let buckets = match (used.first(), used.last()) {
            (Some(&lo), Some(&hi)) => (lo..=hi).map(|k| (1u64 << k.min(63), by_power[k].0, by_power[k].1)).collect(),
            _ => Vec::new(),
        };
        SizeHistogram { buckets }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Findings {
    /// Peak active over peak reserved, and allocated over reserved at the end.
    pub efficiency_at_peak: f64,
    pub efficiency_at_end: f64,
    /// Every allocation the trace holds.
    pub allocation_sizes: SizeHistogram,
    /// The segments' free blocks at the end (what the allocator caches).
    pub free_block_sizes: SizeHistogram,
    /// One sentence each; empty when nothing crossed a threshold.
    pub findings: Vec<String>,
}

pub fn findings(snap: &Snapshot, tl: &Timeline, device: usize, s: &SnapshotSummary) -> Findings {
    let ratio = |a: u64, b: u64| if b == 0 { 1.0 } else { a as f64 / b as f64 };
    let free: Vec<u64> = snap.device_segments(device).flat_map(|seg| seg.blocks.iter()).filter(|b| b.state == BlockState::Inactive).map(|b| b.size).collect();
    let mut out = Vec::new();
    let cached = s.reserved_bytes.saturating_sub(s.allocated_bytes);
    if s.reserved_bytes > 0 && ratio(cached, s.reserved_bytes) > CACHE_OVERHEAD_SHARE {
        out.push(format!(
            "cache overhead: {} of the {} reserved at the end holds no allocation ({:.0}%, over {:.0}%); torch.cuda.empty_cache() would hand it back",
            bytes(cached),
            bytes(s.reserved_bytes),
            ratio(cached, s.reserved_bytes) * 100.0,
            CACHE_OVERHEAD_SHARE * 100.0
        ));
    }
    let unused: Vec<u64> = free.iter().copied().filter(|b| *b >= UNUSED_BLOCK_BYTES).collect();
    if !unused.is_empty() {
        out.push(format!("unused blocks: {} cached free block(s) of {} MB or more, {} in all", unused.len(), UNUSED_BLOCK_BYTES >> 20, bytes(unused.iter().sum())));
    }
    if s.inactive_bytes > 0 && s.fragmentation > CACHE_OVERHEAD_SHARE && s.largest_free_block < s.inactive_bytes / 2 {
        out.push(format!(
            "fragmentation: {} is cached free, but the largest free block is {}; a request larger than that needs a new segment (expandable_segments:True avoids it)",
            bytes(s.inactive_bytes),
            bytes(s.largest_free_block)
        ));
    }
    if let Some(g) = s.growth.as_ref().filter(|g| !g.healthy) {
        out.push(format!("memory keeps growing across the steps: {}", g.lines.join("; ")));
    }
    if !s.oom.is_empty() {
        out.push(format!("the trace ends in an out-of-memory error ({} requested)", bytes(s.oom[0].requested_bytes)));
    }
    Findings {
        efficiency_at_peak: ratio(s.peak_active_bytes, s.peak_reserved_bytes),
        efficiency_at_end: ratio(s.allocated_bytes, s.reserved_bytes),
        allocation_sizes: SizeHistogram::of(tl.allocations.iter().map(|a| a.size)),
        free_block_sizes: SizeHistogram::of(free.into_iter()),
        findings: out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_fall_into_power_of_two_buckets() {
        let h = SizeHistogram::of([512, 513, 1024, 3 << 10].into_iter());
        assert_eq!(h.buckets, [(512, 1, 512), (1024, 2, 1537), (2048, 0, 0), (4096, 1, 3 << 10)], "the empty 2 KiB bucket between");
        assert_eq!(SizeHistogram::of(std::iter::empty()).buckets, []);
    }
}
