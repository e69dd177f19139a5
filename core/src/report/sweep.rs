//! `vramscope sweep`: one engine per configuration (a fresh model and an empty allocator
//! each time, everything freed at shutdown), warm-up steps, then measured steps.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::fit::Scaling;
use super::sweep_row::{Measured, Outcome, SweepRow};
use crate::event::Phase;
use crate::format::bytes;
use crate::source::job::Output;
use crate::source::launch::{launch_engine, EngineOptions};
use crate::step_config::{Attention, AutocastPolicy, Checkpointing, DeviceChoice, Mode, Precision, StepConfig};
use crate::stream::{Control, Incoming, Report, StepReport};

/// What a sweep varies besides the configurations themselves.
#[derive(Clone, Debug)]
pub struct SweepOptions {
    pub device: DeviceChoice,
    pub warmup: u64,
    pub steps: u64,
    pub seed: i64,
    /// Write a snapshot of each configuration's last measured step here.
    pub snapshot_dir: Option<PathBuf>,
    /// The modelled GPU's allocator settings (CPU).
    pub alloc_conf: String,
    /// Whose bf16 autocast a CPU run follows.
    pub autocast_policy: AutocastPolicy,
}

/// The cross product of the lists, in the order the flags vary slowest to fastest:
/// model, ctx, batch, precision, mode, attention.
pub fn configurations(
    models: &[StepConfig],
    ctx: &[i64],
    batch: &[i64],
    precision: &[Precision],
    mode: &[Mode],
    attention: &[Attention],
    checkpointing: &[Checkpointing],
) -> Vec<StepConfig> {
    let mut out = Vec::new();
    for m in models {
        for &c in ctx {
            for &b in batch {
                for &p in precision {
                    for &md in mode {
                        for &a in attention {
                            for &k in checkpointing {
                                out.push(StepConfig { ctx: c, batch: b, precision: p, mode: md, attention: a, checkpointing: k, ..m.clone() });
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// The size in an allocator's out-of-memory message: CUDA's "Tried to allocate 20.00 GiB",
/// or the CPU allocator's "you tried to allocate 1099511627776 bytes".
pub fn requested_size(message: &str) -> Option<u64> {
    let lower = message.to_ascii_lowercase();
    let at = lower.find("tried to allocate ")? + "tried to allocate ".len();
    // "<number> <unit>" with the unit's trailing punctuation cut: "20.00 GiB (GPU 0 ...",
    // "1099511627776 bytes. Error code 12".
    let mut words = message[at..].split_whitespace();
    let number = words.next()?;
    let unit = words.next().unwrap_or("").trim_end_matches(|c: char| !c.is_ascii_alphabetic());
    let unit = if unit.eq_ignore_ascii_case("bytes") { "B" } else { unit };
    crate::format::parse_bytes(&format!("{number}{unit}")).ok()
}

fn snapshot_name(c: &StepConfig) -> String {
    let checkpointing = if c.checkpointing == Checkpointing::None { String::new() } else { format!("_ckpt-{}", c.checkpointing) };
    format!("{}_ctx{}_b{}_{}_{}_{}_{}{checkpointing}.pickle", c.model_name, c.ctx, c.batch, c.precision, c.mode, c.attention, c.optimizer)
}

/// Runs one configuration to completion on its own engine process (a fresh model and an
/// empty allocator, everything handed back when the process ends).
pub fn run_one(config: &StepConfig, o: &SweepOptions) -> SweepRow {
    let total = o.warmup + o.steps.max(1);
    let mut opts = EngineOptions::new(config.clone());
    opts.device = o.device;
    opts.steps = Some(total);
    opts.seed = o.seed;
    opts.alloc_conf = o.alloc_conf.clone();
    opts.autocast_policy = o.autocast_policy;
    if let Some(dir) = &o.snapshot_dir {
        opts.snapshot_at = vec![total - 1];
        opts.snapshot_dir = dir.clone();
        // What goes into a write-up is what the table measured.
        opts.snapshot_trace_from_step = Some(o.warmup);
    }
    let mut row = SweepRow { config: config.clone(), outcome: Outcome::Failed { error: "no step finished".into() }, snapshot: None };
    // The engine's own output (libtorch's warnings) would break the progress bar.
    let source = match launch_engine(&opts, Output::Capture) {
        Ok(e) => e,
        Err(e) => {
            row.outcome = Outcome::Failed { error: format!("{e:#}") };
            return row;
        }
    };
    let mut all_steps = Vec::new();
    let mut saved = None;
    let mut failure = None;
    while let Some((_, item)) = source.next() {
        let Incoming::Report(r) = item else { continue };
        match r {
            Report::Step(r) => all_steps.push(r),
            Report::SnapshotSaved { path, .. } => saved = Some(path),
            Report::SnapshotFailed { error, .. } => failure = Some(Outcome::Failed { error: format!("snapshot failed: {error}") }),
            Report::Oom(oom) => {
                failure = Some(Outcome::Oom {
                    phase: oom.phase.as_str().to_string(),
                    requested_bytes: requested_size(&oom.message),
                    message: oom.message,
                });
                break;
            }
            Report::Error(e) => {
                failure = Some(Outcome::Failed { error: e });
                break;
            }
            _ => {}
        }
    }
    // After an OOM or an error the engine waits, paused: stop it, which hands back all it held.
    source.send(&Control::Stop);
    if source.wait_child(Duration::from_secs(30)).is_none() {
        source.stop_child(Duration::from_secs(5));
    }
    row.snapshot = saved.and_then(|p| rename_snapshot(&p, &snapshot_name(config)));
    row.outcome = match failure {
        Some(f) => f,
        None if all_steps.len() as u64 <= o.warmup => row.outcome,
        None => Outcome::Measured(summarize(all_steps, o.warmup)),
    };
    row
}

/// Runs every configuration in turn, advancing `progress` as each finishes.
pub fn sweep(configs: &[StepConfig], o: &SweepOptions, progress: &indicatif::ProgressBar) -> Vec<SweepRow> {
    configs
        .iter()
        .map(|c| {
            progress.set_message(format!("{} ctx {} batch {} {} {} {}, checkpointing {}", c.model_name, c.ctx, c.batch, c.precision, c.mode, c.attention, c.checkpointing));
            let row = run_one(c, o);
            progress.inc(1);
            row
        })
        .collect()
}

/// Gives the engine's snapshot a name that tells configurations apart (the engine's name
/// leaves out batch and attention).
fn rename_snapshot(path: &Path, name: &str) -> Option<PathBuf> {
    let dir = path.parent()?;
    let target = crate::snapshot::unique_path(dir, name);
    match std::fs::rename(path, &target) {
        Ok(()) => Some(target),
        Err(_) => Some(path.to_path_buf()),
    }
}

/// Summarizes the steps after the `warmup` first ones.
fn summarize(all: Vec<StepReport>, warmup: u64) -> Measured {
    let activation_bytes = all
        .windows(2)
        .filter(|w| w[1].step >= warmup)
        .filter_map(|w| w[1].phase_peak_bytes.get(Phase::Forward.as_str()).map(|p| p.saturating_sub(w[0].live_bytes)))
        .max();
    let steps: Vec<StepReport> = all.into_iter().filter(|s| s.step >= warmup).collect();
    let top = steps
        .iter()
        .max_by_key(|s| s.peak_allocated_bytes)
        .expect("summarize gets at least one step");
    let peak_phase = top
        .phase_peak_bytes
        .iter()
        .max_by_key(|(_, b)| **b)
        .map_or("other".to_string(), |(p, _)| p.clone());
    let n = steps.len() as f64;
    Measured {
        peak_allocated_bytes: top.peak_allocated_bytes,
        peak_phase,
        phase_peak_bytes: top.phase_peak_bytes.clone(),
        activation_bytes,
        reserved_bytes: steps.iter().map(|s| s.peak_reserved_bytes).max().unwrap_or(0),
        mean_active_bytes: (steps.iter().map(|s| s.mean_active_bytes as f64).sum::<f64>() / n) as u64,
        category_peak_bytes: steps.iter().fold(std::collections::BTreeMap::new(), |mut most, s| {
            for (c, b) in &s.category_peak_bytes {
                let m = most.entry(c.clone()).or_insert(0);
                *m = (*m).max(*b);
            }
            most
        }),
        step_time_s: steps.iter().map(|s| s.step_time_s).sum::<f64>() / n,
        tokens_per_s: steps.iter().map(|s| s.tokens_per_s).sum::<f64>() / n,
        samples_per_s: steps.iter().map(|s| s.samples_per_s).sum::<f64>() / n,
        steps,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Markdown,
    Csv,
    Json,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "markdown" | "md" => Ok(Format::Markdown),
            "csv" => Ok(Format::Csv),
            "json" => Ok(Format::Json),
            _ => Err(format!("unknown format '{s}' (allowed: markdown, csv, json)")),
        }
    }
}

const HEADER: [&str; 15] = [
    "model", "ctx", "batch", "precision", "mode", "attention", "checkpointing", "peak allocated", "peak phase", "activations", "reserved",
    "mean active", "step time (s)", "tokens/s", "samples/s",
];

/// One table row's cells; `raw` gives bytes as integers (CSV) instead of "1.50 GiB".
fn cells(r: &SweepRow, raw: bool) -> Vec<String> {
    let c = &r.config;
    let size = |b: u64| if raw { b.to_string() } else { bytes(b) };
    let mut v = vec![
        c.model_name.clone(),
        c.ctx.to_string(),
        c.batch.to_string(),
        c.precision.to_string(),
        c.mode.to_string(),
        c.attention.to_string(),
        c.checkpointing.to_string(),
    ];
    match &r.outcome {
        Outcome::Measured(m) => v.extend([
            size(m.peak_allocated_bytes),
            m.peak_phase.clone(),
            m.activation_bytes.map(size).unwrap_or_default(),
            size(m.reserved_bytes),
            size(m.mean_active_bytes),
            format!("{:.3}", m.step_time_s),
            format!("{:.0}", m.tokens_per_s),
            format!("{:.1}", m.samples_per_s),
        ]),
        Outcome::Oom { phase, requested_bytes, .. } => v.extend([
            match requested_bytes {
                Some(b) => format!("OOM (tried to allocate {})", size(*b)),
                None => "OOM".to_string(),
            },
            phase.clone(),
        ]),
        Outcome::Failed { error } => v.push(format!("failed: {error}")),
    }
    // Cells a failed configuration has no value for.
    v.resize(HEADER.len(), String::new());
    v
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The table in `format`; JSON is `{"rows": [...], "fits": [...]}`, Markdown puts the fits
/// in a second table. CSV holds rows only (`fits` must be empty).
pub fn render(rows: &[SweepRow], fits: &[Scaling], format: Format) -> String {
    match format {
        Format::Markdown => {
            // Numbers right-aligned, names and phases left; one per column of HEADER.
            const ALIGN: [&str; HEADER.len()] = ["---", "---:", "---:", "---", "---", "---", "---", "---:", "---", "---:", "---:", "---:", "---:", "---:", "---:"];
            let mut s = format!("| {} |\n| {} |\n", HEADER.join(" | "), ALIGN.join(" | "));
            for r in rows {
                s += &format!("| {} |\n", cells(r, false).join(" | ").replace('\n', " "));
            }
            if !fits.is_empty() {
                s += "\n";
                s += &super::fit::render(fits);
            }
            s
        }
        Format::Csv => {
            let mut s = HEADER.map(|h| h.replace(' ', "_")).join(",") + "\n";
            for r in rows {
                s += &(cells(r, true).iter().map(|c| csv_field(c)).collect::<Vec<_>>().join(",") + "\n");
            }
            s
        }
        Format::Json => {
            serde_json::to_string_pretty(&serde_json::json!({ "rows": rows, "fits": fits })).expect("sweep rows serialize") + "\n"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_messages_give_the_requested_size() {
        assert_eq!(
            requested_size("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.15 GiB total capacity)"),
            Some(20 << 30)
        );
        assert_eq!(
            requested_size("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1099511627776 bytes. Error code 12"),
            Some(1 << 40)
        );
        assert_eq!(requested_size("out of memory"), None);
    }

    #[test]
    fn the_cross_product_varies_checkpointing_fastest_then_attention() {
        let base = StepConfig {
            model_name: "tiny".into(),
            dims: crate::step_config::Preset::Tiny.dims(),
            ctx: 1,
            batch: 1,
            precision: Precision::Fp32,
            mode: Mode::Train,
            attention: Attention::Naive,
            optimizer: Default::default(),
            checkpointing: Default::default(),
        };
        let ckpt = [Checkpointing::None, Checkpointing::Every(1)];
        let all = configurations(&[base], &[64, 128], &[1, 2], &[Precision::Fp32], &[Mode::Forward, Mode::Train], Attention::ALL, &ckpt);
        assert_eq!(all.len(), 32);
        assert_eq!((all[0].ctx, all[0].batch, all[0].mode, all[0].attention), (64, 1, Mode::Forward, Attention::Naive));
        assert_eq!((all[1].attention, all[1].checkpointing), (Attention::Naive, Checkpointing::Every(1)), "checkpointing varies fastest");
        assert_eq!(all[2].attention, Attention::Fused);
        assert_eq!(all[31].ctx, 128);
    }

    #[test]
    fn oom_cells_say_oom_with_the_size_and_csv_quotes_commas() {
        let row = SweepRow {
            config: configurations(
                &[StepConfig {
                    model_name: "xl".into(),
                    dims: crate::step_config::Preset::Xl.dims(),
                    ctx: 1,
                    batch: 1,
                    precision: Precision::Fp32,
                    mode: Mode::Train,
                    attention: Attention::Naive,
                    optimizer: Default::default(),
                    checkpointing: Default::default(),
                }],
                &[2048],
                &[4],
                &[Precision::Fp32],
                &[Mode::Train],
                &[Attention::Naive],
                &[Checkpointing::None],
            )
            .remove(0),
            outcome: Outcome::Oom { phase: "forward".into(), requested_bytes: Some(3 << 30), message: "a, b".into() },
            snapshot: None,
        };
        let md = render(std::slice::from_ref(&row), &[], Format::Markdown);
        assert!(md.contains("| OOM (tried to allocate 3.00 GiB) | forward |"), "{md}");
        let csv = render(std::slice::from_ref(&row), &[], Format::Csv);
        assert!(csv.lines().nth(1).unwrap().contains("OOM (tried to allocate 3221225472)"), "{csv}");
        let json: serde_json::Value = serde_json::from_str(&render(&[row], &[], Format::Json)).unwrap();
        assert_eq!(json["rows"][0]["outcome"], "oom");
        assert_eq!(json["rows"][0]["requested_bytes"], 3u64 << 30);
    }
}
