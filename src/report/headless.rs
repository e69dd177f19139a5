//! `vramscope run --headless`: one line (or one JSON object) per step.

use std::io::Write;

use crate::event::Batch;
use crate::train::engine::{Engine, Report, StepReport};

use crate::render::format::bytes;

pub fn step_line(r: &StepReport) -> String {
    let phases = crate::event::Phase::ALL
        .iter()
        .filter_map(|p| r.phase_peak_bytes.get(p.as_str()).map(|b| (p.as_str(), b)))
        .map(|(p, b)| format!("{p} {}", bytes(*b)))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "step {:>3}  {} {} ctx {} batch {} {} | peak {} ({}) | reserved {} | {:.3} s | {:.0} tok/s{}",
        r.step,
        r.mode,
        r.precision,
        r.ctx,
        r.batch,
        r.attention,
        bytes(r.peak_allocated_bytes),
        phases,
        bytes(r.reserved_bytes),
        r.step_time_s,
        r.tokens_per_s,
        if r.dropped_events > 0 { format!(" | dropped {} events", r.dropped_events) } else { String::new() }
    )
}

/// Drives the engine to completion, printing as steps finish; every event batch goes to
/// `on_batch` (headless has no store; reading batches keeps the engine from counting
/// drops). Returns the step reports. An error report ends the run with that error.
pub fn run(
    engine: &mut Engine,
    json: bool,
    out: &mut impl Write,
    on_batch: &mut dyn FnMut(&Batch),
) -> anyhow::Result<Vec<StepReport>> {
    let mut steps = Vec::new();
    let batches = engine.batches.clone();
    loop {
        crossbeam_channel::select! {
            recv(batches) -> b => if let Ok(b) = b { on_batch(&b) },
            recv(engine.reports) -> msg => {
                let Ok(report) = msg else {
                    anyhow::bail!("the training engine stopped without saying why")
                };
                match report {
                    Report::Started(info) => {
                        if !json {
                            writeln!(out, "vramscope: {} on {} ({} parameters){}", info.config.model_name, info.device,
                                info.parameters, info.note.map(|n| format!(" — {n}")).unwrap_or_default())?;
                        }
                    }
                    Report::Step(r) => {
                        if json {
                            writeln!(out, "{}", serde_json::to_string(&r)?)?;
                        } else {
                            writeln!(out, "{}", step_line(&r))?;
                        }
                        out.flush()?;
                        steps.push(r);
                    }
                    Report::SnapshotSaved { step, path } => {
                        if !json {
                            writeln!(out, "snapshot of step {step} saved: {}", path.display())?;
                        }
                    }
                    Report::SnapshotFailed { step, error } => {
                        anyhow::bail!("snapshot of step {step} failed: {error}")
                    }
                    Report::Oom(o) => anyhow::bail!("out of memory at step {} ({}): {}", o.step, o.phase.as_str(), o.message),
                    Report::Error(e) => anyhow::bail!("{e}"),
                    Report::Knob(_) | Report::Paused(_) => {}
                    Report::Finished => {
                        // Batches sent before Finished may still be queued.
                        while let Ok(b) = batches.try_recv() {
                            on_batch(&b);
                        }
                        break;
                    }
                }
            }
        }
    }
    Ok(steps)
}
