//! `vramscope report SNAPSHOT… -o DIR`: what a write-up needs, in one folder. For each
//! snapshot: its timeline and size histograms (PNG and SVG), a text report (the summary,
//! efficiency, findings, top consumers) and a Markdown page that shows them; for several
//! snapshots, an index with each one's peaks and the skew. Nothing is ever overwritten: a
//! name that exists gets a numbered one beside it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::export::{export, export_histograms, ExportOptions};
use vramscope_core::format::bytes;
use vramscope_core::report::breakdown::breakdown_of;
use vramscope_core::report::findings::{findings, Findings};
use vramscope_core::report::frame_rules::FrameRules;
use vramscope_core::report::snapshot_set::{self, SetRow};
use vramscope_core::report::snapshot_summary::{summarize, write_text, SnapshotSummary};
use vramscope_core::snapshot::timeline::Timeline;
use vramscope_core::snapshot::unique_path;

/// What one snapshot's pages are made of.
pub struct Options<'a> {
    pub device: Option<usize>,
    pub rules: &'a FrameRules,
    /// Consumers listed by top frame at the peak.
    pub top: usize,
}

/// Writes the write-up of `files` into `dir` (made when missing); returns the page to open
/// first (the index, or the one snapshot's page).
pub fn write_report(files: &[PathBuf], dir: &Path, o: &Options) -> anyhow::Result<PathBuf> {
    let mut rows = Vec::new();
    let mut pages = Vec::new();
    for path in files {
        let (summary, page) = write_one(path, dir, o)?;
        rows.push(SetRow::of(vramscope_core::input::title(path), &summary));
        pages.push(page);
    }
    if let [one] = pages.as_slice() {
        return Ok(one.clone());
    }
    let mut md = String::from("# Memory snapshots\n\n```text\n");
    let mut table = Vec::new();
    snapshot_set::write_text(&mut table, &rows)?;
    md += &String::from_utf8_lossy(&table);
    md += "```\n\n";
    for (row, page) in rows.iter().zip(&pages) {
        let _ = writeln!(md, "- [{}]({}): peak active {}", row.file, name_of(page), bytes(row.peak_active_bytes));
    }
    write_new(dir, "index.md", md.as_bytes())
}

fn name_of(p: &Path) -> String {
    p.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

/// Writes `data` as `name` in `dir`, or beside it under a numbered name when it exists.
fn write_new(dir: &Path, name: &str, data: &[u8]) -> anyhow::Result<PathBuf> {
    let path = unique_path(dir, name);
    vramscope_core::snapshot::writer::save_atomic(&path, |w: &mut std::io::BufWriter<std::fs::File>| std::io::Write::write_all(w, data))?;
    Ok(path)
}

/// One snapshot's images, text report and page.
fn write_one(path: &Path, dir: &Path, o: &Options) -> anyhow::Result<(SnapshotSummary, PathBuf)> {
    let (snap, device) = vramscope_core::snapshot::read_device(path, o.device, o.rules)?;
    // Made once a file is read: a file or device that is not there leaves nothing behind.
    std::fs::create_dir_all(dir).with_context(|| format!("cannot make {}", dir.display()))?;
    let tl = Timeline::from_snapshot(&snap, device);
    let summary = summarize(&snap, &tl, device, 10);
    let f = findings(&snap, &tl, device, &summary);
    let title = vramscope_core::input::title(path);
    let stem = title.split('.').next().unwrap_or("snapshot").to_string();
    let mut images = Vec::new();
    for ext in ["png", "svg"] {
        let timeline = export(&snap, &unique_path(dir, &format!("{stem}_timeline.{ext}")), &ExportOptions { device, title: title.clone(), ..ExportOptions::default() })?;
        let hists = [("sizes allocated", &f.allocation_sizes), ("cached free blocks at the end", &f.free_block_sizes)];
        let sizes = export_histograms(&hists, &unique_path(dir, &format!("{stem}_sizes.{ext}")), (1200, 450))?;
        images.push((timeline, sizes));
    }
    let consumers = breakdown_of(&snap, &tl, tl.allocations.iter().filter(|a| tl.total_events == 0 || a.alive_at(tl.peak_index)), tl.peak_index, false);
    let mut text = Vec::new();
    write_text(&mut text, &title, &summary)?;
    let mut text = String::from_utf8(text).expect("the summary is text");
    text += &findings_text(&f);
    let _ = writeln!(text, "top {} consumers at the peak, by top frame:", o.top);
    for g in consumers.groups.iter().take(o.top) {
        let _ = writeln!(text, "  {}", g.row());
    }
    let report = write_new(dir, &format!("{stem}_report.txt"), text.as_bytes())?;
    let (timeline, sizes) = &images[0];
    let mut md = format!("# {title}\n\n![timeline]({})\n\n![sizes]({})\n\n", name_of(timeline), name_of(sizes));
    let _ = writeln!(md, "SVG: [timeline]({}), [sizes]({}). The whole text report: [{}]({}).\n", name_of(&images[1].0), name_of(&images[1].1), name_of(&report), name_of(&report));
    md += &format!("```text\n{}```\n", findings_text(&f));
    let by = summary.breakdown.by.replace('_', " ");
    let _ = writeln!(md, "\n## At the peak, by {by}\n\n| {by} | bytes | allocations |\n|---|---:|---:|");
    for g in &summary.breakdown.groups {
        let _ = writeln!(md, "| {} | {} | {} |", g.name, bytes(g.bytes), g.allocations);
    }
    let _ = writeln!(md, "\n## Top {} consumers at the peak\n\n| top frame | bytes | allocations |\n|---|---:|---:|", o.top);
    for g in consumers.groups.iter().take(o.top) {
        let _ = writeln!(md, "| `{}` | {} | {} |", g.name.replace('|', "\\|"), bytes(g.bytes), g.allocations);
    }
    let page = write_new(dir, &format!("{stem}.md"), md.as_bytes())?;
    Ok((summary, page))
}

fn findings_text(f: &Findings) -> String {
    let mut s = format!("efficiency       {:.0}% of peak reserved was active at the peak; {:.0}% of reserved is allocated at the end\n", f.efficiency_at_peak * 100.0, f.efficiency_at_end * 100.0);
    if f.findings.is_empty() {
        s += "findings         none over the thresholds (cache overhead 10%, unused blocks 100 MB, fragmentation, growth)\n";
    }
    for line in &f.findings {
        let _ = writeln!(s, "finding          {line}");
    }
    s
}
