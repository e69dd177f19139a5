//! Several snapshots side by side: each rank's (`rank0…7_memory_snapshot.pickle`), or one
//! rank's at each iteration. `view --summary` over them gives a table and the skew between
//! the highest peak and the lowest: the rank that runs out first, and by how much.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::format::bytes;

/// The snapshots `paths` name together: several files, or a directory of snapshot files
/// (`*.pickle`, `*.pkl`, gzipped or not). None for one file, or a directory that holds
/// torch.profiler traces instead (`crate::profiler`).
pub fn snapshot_files(paths: &[PathBuf]) -> std::io::Result<Option<Vec<PathBuf>>> {
    if let [one] = paths {
        if !one.is_dir() {
            return Ok(None);
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(one)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| [".pickle", ".pkl", ".pickle.gz", ".pkl.gz"].iter().any(|x| n.ends_with(x))))
            .collect();
        if files.is_empty() {
            return Ok(None);
        }
        files.sort_by_key(|p| natural_key(p));
        return Ok(Some(files));
    }
    Ok(Some(paths.to_vec()))
}

/// A name's parts with its numbers compared as numbers: rank2 before rank10.
fn natural_key(p: &Path) -> Vec<(String, u64)> {
    let name = p.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let mut out = Vec::new();
    let mut text = String::new();
    let mut digits = String::new();
    for ch in name.chars() {
        if ch.is_ascii_digit() {
            digits.push(ch);
        } else {
            if !digits.is_empty() {
                out.push((std::mem::take(&mut text), digits.parse().unwrap_or(u64::MAX)));
                digits.clear();
            }
            text.push(ch);
        }
    }
    out.push((text, digits.parse().unwrap_or(0)));
    out
}

/// One file's figures in the table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SetRow {
    pub file: String,
    pub device_name: String,
    pub peak_active_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Allocated at the end of the trace (the final state's active blocks).
    pub allocated_bytes: u64,
}

impl SetRow {
    /// The row of `file` (as the table names it) from its summary.
    pub fn of(file: String, s: &super::snapshot_summary::SnapshotSummary) -> SetRow {
        SetRow { file, device_name: s.device_name.clone(), peak_active_bytes: s.peak_active_bytes, peak_reserved_bytes: s.peak_reserved_bytes, allocated_bytes: s.allocated_bytes }
    }
}

/// The highest and lowest peak, and how far apart.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Skew {
    pub highest: String,
    pub highest_bytes: u64,
    pub lowest: String,
    pub lowest_bytes: u64,
    /// (highest − lowest) / lowest.
    pub ratio: f64,
}

pub fn skew(rows: &[SetRow]) -> Option<Skew> {
    skew_of(rows.iter().map(|r| (r.file.as_str(), r.peak_active_bytes)))
}

/// The skew of (name, peak) pairs.
pub fn skew_of<'a>(peaks: impl Iterator<Item = (&'a str, u64)> + Clone) -> Option<Skew> {
    let hi = peaks.clone().max_by_key(|p| p.1)?;
    let lo = peaks.min_by_key(|p| p.1)?;
    Some(Skew { highest: hi.0.to_string(), highest_bytes: hi.1, lowest: lo.0.to_string(), lowest_bytes: lo.1, ratio: (hi.1 - lo.1) as f64 / lo.1.max(1) as f64 })
}

/// The table as text: a row per file, then the skew.
pub fn write_text(out: &mut impl Write, rows: &[SetRow]) -> std::io::Result<()> {
    let width = rows.iter().map(|r| r.file.chars().count()).max().unwrap_or(4).max(4);
    writeln!(out, "{:<width$}  {:<8}  {:>12}  {:>13}  {:>12}", "file", "device", "peak active", "peak reserved", "at the end")?;
    for r in rows {
        writeln!(out, "{:<width$}  {:<8}  {:>12}  {:>13}  {:>12}", r.file, r.device_name, bytes(r.peak_active_bytes), bytes(r.peak_reserved_bytes), bytes(r.allocated_bytes))?;
    }
    if let Some(s) = skew(rows).filter(|_| rows.len() > 1) {
        writeln!(out, "skew: {} peaks {:.1}% above {} ({} against {})", s.highest, s.ratio * 100.0, s.lowest, bytes(s.highest_bytes), bytes(s.lowest_bytes))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_lists_its_snapshots_in_rank_order() {
        let dir = tempfile::tempdir().unwrap();
        for n in ["rank10_memory_snapshot.pickle", "rank2_memory_snapshot.pickle", "rank0_memory_snapshot.pickle", "notes.txt"] {
            std::fs::write(dir.path().join(n), b"x").unwrap();
        }
        let files = snapshot_files(&[dir.path().to_path_buf()]).unwrap().unwrap();
        let names: Vec<_> = files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["rank0_memory_snapshot.pickle", "rank2_memory_snapshot.pickle", "rank10_memory_snapshot.pickle"]);
        assert_eq!(snapshot_files(&[dir.path().join("rank0_memory_snapshot.pickle")]).unwrap(), None, "one file is one file");
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(snapshot_files(&[empty.path().to_path_buf()]).unwrap(), None, "not a set: the trace directory's reading says what is wrong");
    }

    #[test]
    fn the_table_ends_with_the_skew() {
        let row = |file: &str, peak| SetRow { file: file.into(), device_name: "device 0".into(), peak_active_bytes: peak, peak_reserved_bytes: peak, allocated_bytes: 0 };
        let mut out = Vec::new();
        write_text(&mut out, &[row("rank0", 100 << 20), row("rank1", 125 << 20)]).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with("skew: rank1 peaks 25.0% above rank0 (125 MiB against 100 MiB)\n"), "{text}");
    }
}
