//! `vramscope whatif`: a device's trace replayed through the allocator model under other
//! allocator settings. The first row replays it under the recorded settings and is checked
//! against the recording (a model that does not reproduce the recording cannot be trusted
//! with the other rows). Every row starts from the memory the recording began with and
//! follows the trace's requests; when the trace has an `oom`, every row has the device
//! memory the allocator had then (reserved plus free on the device), so a request can
//! fail earlier, or the failed one fit.

use std::path::PathBuf;

use serde::Serialize;

use super::snapshot_summary::reserved_peak;
use crate::allocator::replay::{feed_trace, oom_capacity, replay_snapshot, state_before_trace};
use crate::allocator::{AllocatorConfig, CachingAllocatorModel};
use crate::format::bytes;
use crate::snapshot::model::{Action, Segment, Snapshot};

/// The max_split_size of the default row: blocks this large are never split, so large
/// cached blocks are not carved up for small requests.
pub const DEFAULT_MAX_SPLIT_MB: u64 = 512;

#[derive(clap::Args, Clone, Debug)]
pub struct WhatifArgs {
    /// A PyTorch memory snapshot with a trace (`torch.cuda.memory._dump_snapshot`).
    pub file: PathBuf,
    /// Device whose trace to replay (default: the first one with trace entries).
    #[arg(long)]
    pub device: Option<usize>,
    /// Settings to try, in PYTORCH_CUDA_ALLOC_CONF syntax; repeat for more rows. Default:
    /// expandable segments on and off, and a max_split_size, each changed from the
    /// recorded settings.
    #[arg(long = "alloc-conf", value_name = "CONF", value_parser = parse_alloc_conf)]
    pub alloc_conf: Vec<AllocatorConfig>,
    /// One JSON object per row.
    #[arg(long)]
    pub json: bool,
}

fn parse_alloc_conf(s: &str) -> Result<AllocatorConfig, String> {
    AllocatorConfig::parse_conf(s).map_err(|e| e.to_string())
}

/// How the recorded-settings row compares with the recording.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SelfCheck {
    /// Same peak reserved bytes as the recording, and the recorded OOM reproduced.
    pub matches_recording: bool,
    pub recorded_peak_reserved_bytes: u64,
    pub recorded_oom: bool,
    /// The trace holds more allocated at once than the recording ever reserved: no
    /// allocator produced it (a synthetic or edited file).
    pub recording_inconsistent: bool,
    /// Entry by entry: "segment_map 40/40, alloc addresses 199/199, …".
    pub replay: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WhatifRow {
    /// The settings, in PYTORCH_CUDA_ALLOC_CONF syntax ("" = PyTorch's defaults).
    pub alloc_conf: String,
    /// Whether these are the recorded settings.
    pub recorded: bool,
    pub peak_reserved_bytes: u64,
    /// The most bytes allocated at once (block sizes), and at that moment: reserved
    /// bytes, the largest cached free block, and 1 - allocated / reserved.
    pub peak_active_bytes: u64,
    pub reserved_at_peak_bytes: u64,
    pub largest_free_block_bytes: u64,
    pub fragmentation_at_peak: f64,
    /// The same at the OOM: the recorded one, or where this row ran out first.
    pub reserved_at_oom_bytes: Option<u64>,
    pub largest_free_block_at_oom_bytes: Option<u64>,
    pub fragmentation_at_oom: Option<f64>,
    /// cudaMalloc or page-map calls.
    pub segments_created: u64,
    /// Whether the requests that failed in the recording would have succeeded (and none
    /// failed before); null when the recording has no OOM.
    pub oom_would_fit: Option<bool>,
    /// The trace entry where this row first ran out of memory. Past a failed `alloc`
    /// (one that succeeded in the recording) the program would have stopped: so does the
    /// replay.
    pub out_of_memory_at_entry: Option<usize>,
    /// On the recorded-settings row.
    pub self_check: Option<SelfCheck>,
}

/// The recording's first OOM.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RecordedOom {
    pub entry: usize,
    pub requested_bytes: u64,
    pub device_free_bytes: u64,
    /// Reserved then plus the device's free bytes: the memory every row has.
    pub capacity_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Whatif {
    pub device: usize,
    pub trace_entries: usize,
    pub oom: Option<RecordedOom>,
    pub rows: Vec<WhatifRow>,
}

/// The settings the snapshot recorded (PyTorch's defaults when it recorded none).
pub fn recorded_config(s: &Snapshot) -> AllocatorConfig {
    s.allocator_settings.as_ref().map(AllocatorConfig::from_settings).unwrap_or_default()
}

/// The default rows: the recorded settings with expandable segments on, and off, and
/// with max_split_size (those equal to the recorded settings left out).
pub fn default_configs(recorded: &AllocatorConfig) -> Vec<AllocatorConfig> {
    let with = |f: &dyn Fn(&mut AllocatorConfig)| {
        let mut c = recorded.clone();
        f(&mut c);
        c.conf = c.render_conf();
        c
    };
    let rows = [
        with(&|c| c.expandable_segments = true),
        with(&|c| c.expandable_segments = false),
        with(&|c| c.max_split_size = Some(DEFAULT_MAX_SPLIT_MB << 20)),
    ];
    let same = |c: &AllocatorConfig| AllocatorConfig { conf: String::new(), ..c.clone() } == AllocatorConfig { conf: String::new(), ..recorded.clone() };
    rows.into_iter().filter(|c| !same(c)).collect()
}

/// Replays `device`'s trace under the recorded settings, then under each of `configs`.
pub fn whatif(s: &Snapshot, device: usize, configs: &[AllocatorConfig]) -> Whatif {
    let trace: &[_] = s.device_traces.get(device).map_or(&[], Vec::as_slice);
    let recorded = recorded_config(s);
    let before = state_before_trace(s, device, &recorded);
    let capacity = oom_capacity(s, device);
    let oom = trace.iter().position(|e| e.action == Action::Oom).map(|entry| RecordedOom {
        entry,
        requested_bytes: trace[entry].size,
        device_free_bytes: trace[entry].addr,
        capacity_bytes: capacity.unwrap_or(0),
    });
    let mut first = replay_row(s, device, &before, &recorded, capacity, true);
    let recorded_peak = reserved_peak(s, device).0;
    let (_, rep) = replay_snapshot(s, device, &recorded);
    let oom_reproduced = oom.as_ref().is_none_or(|o| first.out_of_memory_at_entry == Some(o.entry));
    first.self_check = Some(SelfCheck {
        matches_recording: first.peak_reserved_bytes == recorded_peak && oom_reproduced,
        recorded_peak_reserved_bytes: recorded_peak,
        recorded_oom: oom.is_some(),
        recording_inconsistent: first.peak_active_bytes > recorded_peak,
        replay: rep.to_string(),
    });
    let mut rows = vec![first];
    rows.extend(configs.iter().map(|c| replay_row(s, device, &before, c, capacity, false)));
    Whatif { device, trace_entries: trace.len(), oom, rows }
}

fn fragmentation(allocated: u64, reserved: u64) -> f64 {
    if reserved == 0 {
        0.0
    } else {
        1.0 - allocated as f64 / reserved as f64
    }
}

/// One row: `device`'s trace replayed from `before` under `cfg` with `capacity`.
/// `recorded` replays with the recorded segment addresses (the self-check row).
pub fn replay_row(s: &Snapshot, device: usize, before: &[Segment], cfg: &AllocatorConfig, capacity: Option<u64>, recorded: bool) -> WhatifRow {
    let trace: &[_] = s.device_traces.get(device).map_or(&[], Vec::as_slice);
    let mut m = CachingAllocatorModel::from_segments(cfg.clone(), before);
    m.set_capacity(capacity);
    let has_oom = trace.iter().any(|e| e.action == Action::Oom);
    let st = m.stats();
    let mut peak = (st.allocated_bytes, st.reserved_bytes, m.largest_free_block());
    // (reserved, largest free block, allocated) at the first OOM.
    let mut at_oom: Option<(u64, u64, u64)> = None;
    let mut failed_at: Option<usize> = None;
    feed_trace(&mut m, trace, recorded, |m, pos, _, ok| {
        let st = m.stats();
        if st.allocated_bytes > peak.0 {
            peak = (st.allocated_bytes, st.reserved_bytes, m.largest_free_block());
        }
        let action = trace[pos].action;
        if (action == Action::Oom || !ok) && at_oom.is_none() {
            at_oom = Some((st.reserved_bytes, m.largest_free_block(), st.allocated_bytes));
        }
        if !ok {
            failed_at.get_or_insert(pos);
        }
        ok || action == Action::Oom
    });
    let st = m.stats();
    WhatifRow {
        alloc_conf: cfg.conf.clone(),
        recorded,
        peak_reserved_bytes: st.peak_reserved_bytes,
        peak_active_bytes: peak.0,
        reserved_at_peak_bytes: peak.1,
        largest_free_block_bytes: peak.2,
        fragmentation_at_peak: fragmentation(peak.0, peak.1),
        reserved_at_oom_bytes: at_oom.map(|o| o.0),
        largest_free_block_at_oom_bytes: at_oom.map(|o| o.1),
        fragmentation_at_oom: at_oom.map(|o| fragmentation(o.2, o.0)),
        segments_created: st.device_allocs,
        oom_would_fit: has_oom.then_some(failed_at.is_none()),
        out_of_memory_at_entry: failed_at,
        self_check: None,
    }
}

/// The rows as a table, with the OOM they are about and the self-check's verdict.
pub fn write_text(out: &mut impl std::io::Write, name: &str, w: &Whatif) -> std::io::Result<()> {
    writeln!(out, "{name} · device {} · {} trace entries", w.device, w.trace_entries)?;
    if let Some(o) = &w.oom {
        writeln!(
            out,
            "OOM at trace entry {}: {} requested, {} free on the device; every row has the {} the allocator had (reserved then + free)",
            o.entry,
            bytes(o.requested_bytes),
            bytes(o.device_free_bytes),
            bytes(o.capacity_bytes)
        )?;
    }
    let width = w.rows.iter().map(|r| setting_label(r).chars().count()).max().unwrap_or(0).max(8);
    let mut head = format!("{:<width$}  {:>13}  {:>11}  {:>14}  {:>13}  {:>6}", "settings", "peak reserved", "peak active", "reserved@peak", "largest@peak", "frag");
    if w.oom.is_some() {
        head += &format!("  {:>13}  {:>13}  {:>6}", "reserved@OOM", "largest@OOM", "frag");
    }
    head += &format!("  {:>8}", "segments");
    if w.oom.is_some() {
        head += "  OOM request";
    }
    writeln!(out, "{head}")?;
    for r in &w.rows {
        let mut line = format!(
            "{:<width$}  {:>13}  {:>11}  {:>14}  {:>13}  {:>5.1}%",
            setting_label(r),
            bytes(r.peak_reserved_bytes),
            bytes(r.peak_active_bytes),
            bytes(r.reserved_at_peak_bytes),
            bytes(r.largest_free_block_bytes),
            r.fragmentation_at_peak * 100.0
        );
        if let Some(o) = &w.oom {
            let b = |v: Option<u64>| v.map_or_else(|| "–".to_string(), bytes);
            let frag = r.fragmentation_at_oom.map_or_else(|| "–".to_string(), |f| format!("{:.1}%", f * 100.0));
            line += &format!("  {:>13}  {:>13}  {:>6}", b(r.reserved_at_oom_bytes), b(r.largest_free_block_at_oom_bytes), frag);
            let fit = oom_outcome(r, o);
            line += &format!("  {:>8}  {fit}", r.segments_created);
        } else {
            line += &format!("  {:>8}", r.segments_created);
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    if let Some(sentence) = self_check_sentence(w) {
        writeln!(out, "{sentence}")?;
    }
    Ok(())
}

/// What became of the recording's failed request under a row's settings.
pub fn oom_outcome(r: &WhatifRow, oom: &RecordedOom) -> String {
    match (r.oom_would_fit, r.out_of_memory_at_entry) {
        (Some(true), _) => "fits".to_string(),
        (_, Some(at)) if at < oom.entry => format!("fails earlier, at entry {at}"),
        _ => "does not fit".to_string(),
    }
}

/// The self-check's verdict as a sentence.
pub fn self_check_sentence(w: &Whatif) -> Option<String> {
    let first = w.rows.first()?;
    let c = first.self_check.as_ref()?;
    if c.matches_recording {
        let oom = if c.recorded_oom { ", the OOM" } else { "" };
        return Some(format!(
            "self-check: the recorded settings reproduce the recording (peak reserved {} as recorded{oom}; {})",
            bytes(c.recorded_peak_reserved_bytes),
            c.replay
        ));
    }
    let why = if c.recording_inconsistent {
        format!(
            "; the recording cannot be replayed: its trace has {} allocated at once but it never reserved more than {}",
            bytes(first.peak_active_bytes),
            bytes(c.recorded_peak_reserved_bytes)
        )
    } else {
        String::new()
    };
    Some(format!(
        "self-check FAILED: under the recorded settings the model reaches peak reserved {} where the recording has {} ({}){why}; the other rows are not to be trusted",
        bytes(first.peak_reserved_bytes),
        bytes(c.recorded_peak_reserved_bytes),
        c.replay
    ))
}

/// "recorded: expandable_segments:True", "defaults", or the settings as given.
pub fn setting_label(r: &WhatifRow) -> String {
    let conf = if r.alloc_conf.is_empty() { "defaults" } else { &r.alloc_conf };
    if r.recorded {
        format!("recorded: {conf}")
    } else {
        conf.to_string()
    }
}

/// `vramscope whatif`.
pub fn run(args: WhatifArgs) -> anyhow::Result<()> {
    // Allocator settings replayed: categories play no part.
    let (snap, device) = crate::snapshot::read_device(&args.file, args.device, &crate::report::frame_rules::FrameRules::off())?;
    anyhow::ensure!(
        snap.device_traces.get(device).is_some_and(|t| !t.is_empty()),
        "{}: device {device} has no trace entries to replay",
        args.file.display()
    );
    let configs = if args.alloc_conf.is_empty() { default_configs(&recorded_config(&snap)) } else { args.alloc_conf };
    let w = whatif(&snap, device, &configs);
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &w.rows)?;
        std::io::Write::write_all(&mut out, b"\n")?;
    } else {
        write_text(&mut out, &crate::input::title(&args.file), &w)?;
    }
    Ok(())
}
