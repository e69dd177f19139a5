//! `vramscope run --headless`: one line (or one JSON object) per step.

use std::io::Write;

use crate::source::job::Fed;
use crate::stream::{Incoming, Report, StepReport};

use crate::format::bytes;
use crate::step_config::Checkpointing;

pub fn step_line(r: &StepReport) -> String {
    let phases = crate::event::Phase::ALL
        .iter()
        .filter_map(|p| r.phase_peak_bytes.get(p.as_str()).map(|b| (p.as_str(), b)))
        .map(|(p, b)| format!("{p} {}", bytes(*b)))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "{}{}step {:>3}  {} {} {}{}{} | peak allocated {} ({}) | reserved {} | {} | {}{}",
        r.rank.map(|k| format!("rank {k} ")).unwrap_or_default(),
        r.device.map(|d| format!("cuda:{d} ")).unwrap_or_default(),
        r.step,
        r.mode,
        r.precision,
        r.shape(),
        r.attention.map(|a| format!(" {a}")).unwrap_or_default(),
        r.checkpointing.filter(|c| *c != Checkpointing::None).map(|c| format!(", {}", c.label())).unwrap_or_default(),
        bytes(r.peak_allocated_bytes),
        phases,
        bytes(r.reserved_bytes),
        crate::format::duration(r.step_time_s),
        r.throughput(),
        if r.dropped_events > 0 { format!(" | dropped {} events", r.dropped_events) } else { String::new() }
    )
}

/// Prints a session's steps as its items arrive, from any source (a job's ranks, a
/// recording), until it ends. Returns the step reports. A rank's error is said on stderr as
/// it comes and the other ranks go on; the run then fails with `Failed`. An OOM the job
/// handles itself is said and the run goes on (the job's own exit status decides); a run
/// that pauses after an error or an OOM (vramscope's engine does, for someone to resume)
/// ends there.
pub fn run(items: impl Iterator<Item = Fed>, json: bool, out: &mut impl Write) -> anyhow::Result<Vec<StepReport>> {
    let mut steps = Vec::new();
    // Each rank's latest word on who it is, said before its first step (a job learns its
    // parameter count when its model first runs).
    let mut info: std::collections::BTreeMap<u32, crate::stream::EngineInfo> = Default::default();
    let mut said = std::collections::BTreeSet::new();
    // What went wrong, said as it happened; an OOM fails the run only if it stops it.
    let mut failed = false;
    let mut trouble: Option<&'static str> = None;
    // Headless has no store: batches and gauges pass by unread.
    for (rank, item) in items {
        let Incoming::Report(report) = item else { continue };
        match report {
            Report::Started(i) => {
                // A job that knows its parameter count says who it is at once; the hook
                // learns it when the model first runs, so its line waits for a step.
                if !json && i.parameters > 0 && said.insert(rank) {
                    say_who(out, &i)?;
                }
                info.insert(rank, i);
            }
            Report::Step(mut r) => {
                let i = info.get(&rank);
                if json {
                    // One write per line: a job sharing this stdout cannot land inside it
                    // (a pipe keeps writes of up to 4 KiB whole).
                    let mut line = serde_json::to_string(&r)?;
                    line.push('\n');
                    out.write_all(line.as_bytes())?;
                } else {
                    if let Some(i) = i.filter(|_| said.insert(rank)) {
                        say_who(out, i)?;
                    }
                    // A single process's lines need no rank.
                    if i.is_none_or(|i| i.world_size.is_none()) {
                        r.rank = None;
                    }
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
                eprintln!("vramscope: snapshot of step {step} failed: {error}");
                (failed, trouble) = (true, Some("a snapshot failed"));
            }
            Report::Oom(o) => {
                let line = format!(
                    "out of memory at step {} ({}): {}{}",
                    o.step,
                    o.phase.as_str(),
                    o.message,
                    o.snapshot.as_ref().map(|p| format!(" (snapshot: {})", p.display())).unwrap_or_default()
                );
                // A job that handles the error itself goes on; vramscope's engine pauses,
                // and with nobody to resume it the run ends there.
                say(out, json, &line)?;
                trouble = Some("running out of memory");
            }
            Report::Paused(true) if trouble.is_some() => {
                let what = trouble.unwrap_or_default();
                anyhow::bail!("the run paused after {what}, and a headless run has nobody to resume it")
            }
            Report::Error(e) => {
                eprintln!("vramscope: {e}");
                (failed, trouble) = (true, Some("an error"));
            }
            Report::Note(n) => say(out, json, &n)?,
            Report::Knob(_) | Report::Paused(_) | Report::Finished | Report::Exited { .. } => {}
        }
    }
    if failed {
        return Err(Failed.into());
    }
    Ok(steps)
}

/// A line of vramscope's own among the steps; under --json standard output holds step
/// objects alone, so it goes to stderr.
fn say(out: &mut impl Write, json: bool, line: &str) -> std::io::Result<()> {
    if json {
        eprintln!("vramscope: {line}");
        Ok(())
    } else {
        writeln!(out, "vramscope: {line}")
    }
}

fn say_who(out: &mut impl Write, i: &crate::stream::EngineInfo) -> std::io::Result<()> {
    let name = i.config.as_ref().map_or(i.name.as_str(), |c| c.model_name.as_str());
    let of = i.world_size.map(|w| format!(" rank {} of {w}", i.rank.unwrap_or(0))).unwrap_or_default();
    let note = i.note.as_ref().map(|n| format!(" — {n}")).unwrap_or_default();
    writeln!(out, "vramscope: {name}{of} on {} ({} parameters){note}", i.device, i.parameters)
}

/// A headless run that went wrong, already said on stderr as it happened.
#[derive(Debug, thiserror::Error)]
#[error("the run failed (see above)")]
pub struct Failed;
