//! `vramscope diff A B`: what grew and what shrank between two snapshots.

use std::collections::HashMap;

use serde::Serialize;

use crate::snapshot::model::Snapshot;
use crate::snapshot::timeline::Timeline;

use super::breakdown::{breakdown_at_peak, has_categories};
use super::frames::{shown_frames, top_frame_label};
use super::snapshot_summary::peak_reserved;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Change {
    pub a: u64,
    pub b: u64,
    pub delta: i64,
}

impl Change {
    pub fn new(a: u64, b: u64) -> Change {
        Change { a, b, delta: b as i64 - a as i64 }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GroupChange {
    pub name: String,
    pub bytes: Change,
}

/// Allocations alive at each file's peak with the same frames and size, counted.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AllocationChange {
    pub size: u64,
    pub top_frame: Option<String>,
    pub count: Change,
    pub bytes: Change,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SnapshotDiff {
    /// The device compared in each file.
    pub device_a: usize,
    pub device_b: usize,
    pub peak_active_bytes: Change,
    pub peak_reserved_bytes: Change,
    pub allocations: Change,
    pub trace_entries: Change,
    /// "category" when both files name categories, else "top_frame".
    pub breakdown_by: &'static str,
    /// Bytes alive at the peak per group, largest change first.
    pub groups: Vec<GroupChange>,
    /// Matched allocation groups that hold more bytes at B's peak, most first.
    pub grew: Vec<AllocationChange>,
    /// ... and fewer, most first.
    pub shrank: Vec<AllocationChange>,
}

/// (size, frames text) → (count, top frame) of the allocations alive at the peak. Frames
/// are compared as text: frame ids mean nothing across files.
fn peak_groups(snap: &Snapshot, tl: &Timeline) -> HashMap<(u64, String), (u64, Option<String>)> {
    let mut out: HashMap<(u64, String), (u64, Option<String>)> = HashMap::new();
    let mut text: HashMap<u32, String> = HashMap::new();
    for a in tl.allocations.iter().filter(|a| tl.total_events == 0 || a.alive_at(tl.peak_index)) {
        let key = text
            .entry(a.stack)
            .or_insert_with(|| {
                shown_frames(snap, a.stack, false)
                    .iter()
                    .map(|f| format!("{}|{}|{}|{}", f.name, f.filename, f.line, f.repeats))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .clone();
        let e = out.entry((a.size, key)).or_insert_with(|| (0, top_frame_label(snap, a.stack)));
        e.0 += 1;
    }
    out
}

/// `a` and `b`: a snapshot, its timeline, and the device that timeline is of.
pub fn diff(a: (&Snapshot, &Timeline, usize), b: (&Snapshot, &Timeline, usize), top: usize) -> SnapshotDiff {
    let (sa, ta, da) = a;
    let (sb, tb, db) = b;
    let by_category = has_categories(ta) && has_categories(tb);
    let (ba, bb) = (breakdown_at_peak(sa, ta, by_category), breakdown_at_peak(sb, tb, by_category));
    let mut groups: HashMap<String, (u64, u64)> = HashMap::new();
    for g in &ba.groups {
        groups.entry(g.name.clone()).or_default().0 += g.bytes;
    }
    for g in &bb.groups {
        groups.entry(g.name.clone()).or_default().1 += g.bytes;
    }
    let mut groups: Vec<GroupChange> = groups.into_iter().map(|(name, (x, y))| GroupChange { name, bytes: Change::new(x, y) }).collect();
    groups.sort_by(|x, y| y.bytes.delta.unsigned_abs().cmp(&x.bytes.delta.unsigned_abs()).then_with(|| x.name.cmp(&y.name)));

    let (ga, gb) = (peak_groups(sa, ta), peak_groups(sb, tb));
    // Groups whose frames differ only below the top frame look the same in a row (size and
    // top frame): they are counted as one, so no two rows read alike.
    let mut shown: HashMap<(u64, Option<String>), (u64, u64)> = HashMap::new();
    for key in ga.keys().chain(gb.keys().filter(|k| !ga.contains_key(*k))) {
        let (ca, fa) = ga.get(key).cloned().unwrap_or((0, None));
        let (cb, fb) = gb.get(key).cloned().unwrap_or((0, None));
        let counts = shown.entry((key.0, fa.or(fb))).or_default();
        (counts.0, counts.1) = (counts.0 + ca, counts.1 + cb);
    }
    let mut changes: Vec<AllocationChange> = shown
        .into_iter()
        .filter(|(_, (ca, cb))| ca != cb)
        .map(|((size, top_frame), (ca, cb))| AllocationChange { size, top_frame, count: Change::new(ca, cb), bytes: Change::new(ca * size, cb * size) })
        .collect();
    changes.sort_by(|x, y| y.bytes.delta.unsigned_abs().cmp(&x.bytes.delta.unsigned_abs()).then(y.size.cmp(&x.size)).then_with(|| x.top_frame.cmp(&y.top_frame)));
    let (mut grew, mut shrank): (Vec<_>, Vec<_>) = changes.into_iter().partition(|c| c.bytes.delta > 0);
    grew.truncate(top);
    shrank.truncate(top);
    SnapshotDiff {
        device_a: da,
        device_b: db,
        peak_active_bytes: Change::new(ta.peak_bytes, tb.peak_bytes),
        peak_reserved_bytes: Change::new(peak_reserved(sa, ta, da), peak_reserved(sb, tb, db)),
        allocations: Change::new(ta.allocations.len() as u64, tb.allocations.len() as u64),
        trace_entries: Change::new(sa.trace_entry_count() as u64, sb.trace_entry_count() as u64),
        breakdown_by: ba.by,
        groups,
        grew,
        shrank,
    }
}

/// The diff as lines for a terminal.
pub fn write_text(out: &mut impl std::io::Write, a: &str, b: &str, d: &SnapshotDiff) -> std::io::Result<()> {
    use crate::format::bytes;
    let signed = |v: i64| if v < 0 { format!("-{}", bytes(v.unsigned_abs())) } else { format!("+{}", bytes(v as u64)) };
    let line = |out: &mut dyn std::io::Write, what: &str, c: &Change| writeln!(out, "{what:<16} {:>10} → {:>10}  ({})", bytes(c.a), bytes(c.b), signed(c.delta));
    writeln!(out, "A = {a} (device {})\nB = {b} (device {})", d.device_a, d.device_b)?;
    line(out, "peak active", &d.peak_active_bytes)?;
    line(out, "peak reserved", &d.peak_reserved_bytes)?;
    writeln!(out, "{:<16} {:>10} → {:>10}", "allocations", d.allocations.a, d.allocations.b)?;
    writeln!(out, "{:<16} {:>10} → {:>10}", "trace entries", d.trace_entries.a, d.trace_entries.b)?;
    writeln!(out, "at the peak, by {}:", d.breakdown_by.replace('_', " "))?;
    let changed: Vec<&GroupChange> = d.groups.iter().filter(|g| g.bytes.delta != 0).take(10).collect();
    if changed.is_empty() {
        writeln!(out, "  no change")?;
    }
    for g in changed {
        writeln!(out, "  {:>11}  {}", signed(g.bytes.delta), g.name)?;
    }
    for (title, list) in [("grew", &d.grew), ("shrank", &d.shrank)] {
        writeln!(out, "{title} (allocations alive at the peak, matched by frames and size):")?;
        if list.is_empty() {
            writeln!(out, "  nothing")?;
        }
        for c in list {
            writeln!(out, "  {:>11}  {} × {} → {}  {}", signed(c.bytes.delta), bytes(c.size), c.count.a, c.count.b, c.top_frame.as_deref().unwrap_or("(no frames)"))?;
        }
    }
    Ok(())
}
