//! `vramscope selftest`: runs the engine's selftest mode on the CPU and on a CUDA device,
//! feeds its stream to a live store as the screen would, and holds both to the checks in
//! `crate::selftest`. Exit code 0 when nothing failed, 1 otherwise.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::event::{Action, MemEvent};
use crate::selftest::check::Versions;
use crate::selftest::cuda::{self, OomSeen};
use crate::selftest::{accounting, peaks, rules, Check, Evidence, Outcome, Results};
use crate::snapshot::read_snapshot_file;
use crate::source::gauges::nvml::NvmlQuery;
use crate::source::job::Output;
use crate::source::launch::{launch_engine, EngineOptions};
use crate::step_config::{Attention, DeviceChoice, Mode, Precision, Preset, StepConfig};
use crate::store::Store;
use crate::stream::{Control, Incoming, Report};

#[derive(Args, Clone, Debug)]
pub struct SelftestArgs {
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
    /// The CUDA device whose capture is checked (its ordinal).
    #[arg(long, default_value_t = 0)]
    pub device: u8,
    /// Write the results, versions and first mismatch to this file (attach it to bug reports).
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// Steps per pass: the forced OOM in the second, two more after it, the snapshot at the last.
const STEPS: u64 = 4;
const OOM_STEP: u64 = 1;

/// What one engine run gave: its stream up to the cut, the store fed with all of it, the
/// snapshots it wrote, its reports, and its evidence file.
struct Pass {
    stream: Vec<MemEvent>,
    store: Store,
    last_snapshot: Option<PathBuf>,
    oom_snapshot: Option<PathBuf>,
    oom_reported: bool,
    steps_after_oom: u64,
    errors: Vec<String>,
    evidence: Result<Evidence, String>,
}

fn config() -> StepConfig {
    StepConfig {
        model_name: "tiny".into(),
        dims: Preset::Tiny.dims(),
        ctx: 32,
        batch: 2,
        precision: Precision::Fp32,
        mode: Mode::Train,
        attention: Attention::Naive,
        optimizer: Default::default(),
        checkpointing: Default::default(),
    }
}

fn run_pass(device: DeviceChoice, dir: &Path, name: &str) -> anyhow::Result<Pass> {
    let dir = dir.join(name);
    std::fs::create_dir_all(&dir).with_context(|| format!("{}", dir.display()))?;
    let evidence_path = dir.join("evidence.json");
    let mut opts = EngineOptions::new(config());
    opts.device = device;
    opts.steps = Some(STEPS);
    opts.queue_batches = 1 << 16;
    opts.snapshot_at = vec![STEPS - 1];
    opts.snapshot_dir = dir.clone();
    opts.selftest = Some(evidence_path.clone());
    opts.force_oom_at_step = Some(OOM_STEP);
    let source = launch_engine(&opts, Output::Capture)?;
    let mut pass = Pass {
        stream: Vec::new(),
        store: Store::new(1 << 20),
        last_snapshot: None,
        oom_snapshot: None,
        oom_reported: false,
        steps_after_oom: 0,
        errors: Vec::new(),
        evidence: Err(String::new()),
    };
    let mut batches = Vec::new();
    while let Some((_, item)) = source.next() {
        match &item {
            Incoming::Batch(b) => batches.push(b.clone()),
            Incoming::Report(Report::Oom(o)) => {
                pass.oom_reported = true;
                pass.oom_snapshot = o.snapshot.clone();
                // The loop pauses after a failed step; surviving it means going on.
                source.send(&Control::Resume);
            }
            Incoming::Report(Report::SnapshotSaved { path, .. }) => pass.last_snapshot = Some(path.clone()),
            Incoming::Report(Report::Step(s)) if s.step > OOM_STEP => pass.steps_after_oom += 1,
            Incoming::Report(Report::Error(e)) => pass.errors.push(e.clone()),
            _ => {}
        }
        pass.store.ingest(item);
    }
    let evidence = std::fs::read(&evidence_path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice::<Evidence>(&b).map_err(|e| e.to_string()));
    pass.evidence = evidence.map_err(|e| {
        let said = if pass.errors.is_empty() { String::new() } else { format!(" (the engine said: {})", pass.errors.join("; ")) };
        format!("the engine wrote no evidence ({}: {e}){said}", evidence_path.display())
    });
    let cut = pass.evidence.as_ref().map_or(u64::MAX, |e| e.cut_seq);
    for b in batches {
        let first = b.first_seq;
        pass.stream.extend(b.events.into_iter().enumerate().filter(|&(i, _)| first + (i as u64) < cut).map(|(_, e)| e));
    }
    Ok(pass)
}

/// The last `oom` entry of the snapshot at `path`: its requested bytes.
fn oom_entry(path: Option<&Path>, device: usize) -> Result<Option<u64>, String> {
    let path = path.ok_or("the OOM report names no snapshot")?;
    let snap = read_snapshot_file(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(snap.trace(device).iter().rev().find(|e| e.action == Action::Oom).map(|e| e.size))
}

fn oom_check(pass: &Pass, ev: &Evidence, device: usize) -> Outcome {
    let seen = OomSeen {
        snapshot_oom_size: oom_entry(pass.oom_snapshot.as_deref(), device),
        reported: pass.oom_reported,
        steps_after: pass.steps_after_oom,
    };
    cuda::oom(ev.oom.as_ref(), &seen)
}

fn cpu_checks(pass: &Pass) -> Vec<Check> {
    let names = ["cpu.capture_accounting", "cpu.snapshot_peaks", "cpu.oom"];
    let ev = match &pass.evidence {
        Ok(ev) => ev,
        Err(why) => return names.iter().map(|n| Outcome::Fail(why.clone()).named(n)).collect(),
    };
    let snapshot = match &pass.last_snapshot {
        None => Outcome::Fail("the engine reported no snapshot".into()),
        Some(p) => match read_snapshot_file(p) {
            Ok(snap) => peaks::check(&snap, &pass.store),
            Err(e) => Outcome::Fail(format!("{}: {e}", p.display())),
        },
    };
    vec![
        accounting::check(&ev.raw, &pass.stream, &ev.figures).named(names[0]),
        snapshot.named(names[1]),
        oom_check(pass, ev, 0).named(names[2]),
    ]
}

const CUDA_CHECKS: [&str; 5] = ["cuda.trace_matches_pytorch", "cuda.segments_blocks", "cuda.peaks", "cuda.nvml_used", "cuda.oom"];

fn cuda_checks(pass: &Pass, device: u8) -> Vec<Check> {
    let all = |o: &dyn Fn() -> Outcome| CUDA_CHECKS.iter().map(|n| o().named(n)).collect();
    let ev = match &pass.evidence {
        Ok(ev) => ev,
        Err(why) => return all(&|| Outcome::Fail(why.clone())),
    };
    if let Some(why) = &ev.unavailable {
        return all(&|| Outcome::Skipped(format!("no CUDA here: {why}")));
    }
    let d = device as usize;
    let snap = match (&ev.pytorch_snapshot, &ev.pytorch_snapshot_error) {
        (Some(p), _) => read_snapshot_file(p).map_err(|e| format!("PyTorch's snapshot {}: {e}", p.display())),
        (None, why) => Err(format!("PyTorch's snapshot was not taken: {}", why.as_deref().unwrap_or("no reason given"))),
    };
    let against = |f: &dyn Fn(&crate::snapshot::model::Snapshot) -> Outcome| match &snap {
        Ok(s) => f(s),
        Err(why) => Outcome::Fail(why.clone()),
    };
    let nvml = match &ev.nvml {
        None => Outcome::Skipped("NVML was not read".into()),
        Some(Err(why)) => Outcome::Skipped(format!("no NVML: {why}")),
        Some(Ok(n)) => cuda::nvml(n),
    };
    vec![
        against(&|s| cuda::trace(&pass.stream, s.trace(d))).named(CUDA_CHECKS[0]),
        against(&|s| cuda::segments(&pass.stream, s, d)).named(CUDA_CHECKS[1]),
        against(&|s| cuda::peaks(&pass.stream, s, d)).named(CUDA_CHECKS[2]),
        nvml.named(CUDA_CHECKS[3]),
        oom_check(pass, ev, d).named(CUDA_CHECKS[4]),
    ]
}

/// A report file must be writable before minutes are spent on the checks.
fn check_report_path(path: &Path) -> anyhow::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if path.is_dir() {
        anyhow::bail!("--report {}: is a directory", path.display());
    }
    let probe = dir.join(format!(".vramscope-selftest-probe.{}", std::process::id()));
    std::fs::write(&probe, b"").with_context(|| format!("--report {}: cannot write in {}", path.display(), dir.display()))?;
    let _ = std::fs::remove_file(probe);
    Ok(())
}

pub fn run(args: SelftestArgs) -> anyhow::Result<ExitCode> {
    if let Some(p) = &args.report {
        check_report_path(p)?;
    }
    let scratch = tempdir()?;
    let mut checks = vec![rules::check().named("allocator.rules")];
    let cpu = run_pass(DeviceChoice::Cpu, &scratch, "cpu")?;
    checks.extend(cpu_checks(&cpu));
    let gpu = run_pass(DeviceChoice::Cuda(args.device), &scratch, "cuda")?;
    if let Some(bad) = gpu.evidence.as_ref().ok().and_then(|e| e.bad_device.clone()) {
        let _ = std::fs::remove_dir_all(&scratch);
        anyhow::bail!(bad);
    }
    checks.extend(cuda_checks(&gpu, args.device));
    let (cpu_ev, gpu_ev) = (cpu.evidence.as_ref().ok(), gpu.evidence.as_ref().ok());
    let versions = Versions {
        vramscope: env!("CARGO_PKG_VERSION").to_string(),
        torch: cpu_ev.and_then(|e| e.torch_version.clone()),
        cuda: cpu_ev.and_then(|e| e.cuda_version.clone()),
        driver: NvmlQuery::open().ok().and_then(|q| q.driver_version()),
        gpu: gpu_ev.and_then(|e| e.gpu_name.clone()),
    };
    let mut results = Results::new(checks, versions);
    if let Some(fault) = cpu_ev.and_then(|e| e.fault.clone()) {
        results.first_mismatch = results.first_mismatch.map(|m| format!("{m} [fault injected: {fault}]"));
    }
    let _ = std::fs::remove_dir_all(&scratch);
    if args.json {
        println!("{}", results.json());
    } else {
        print!("{}", results.lines());
    }
    if let Some(p) = &args.report {
        results.write_report(p).with_context(|| format!("--report {}", p.display()))?;
    }
    Ok(if results.failed() { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// A fresh directory of this user's for the engine's snapshots and evidence.
fn tempdir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("vramscope-selftest-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("{}", dir.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selftest::cuda::recorded::{fixture, fixture_path, tracker_stream, CONSTRUCTOR_SUN};
    use crate::selftest::evidence::{NvmlFigures, OomFigures};
    use crate::selftest::Status;

    /// The CUDA pass as the command sees it, from recorded inputs: device 1 of a real
    /// snapshot (which ran out of memory) as PyTorch's snapshot, its trace through the
    /// tracker as the stream, the same file as the OOM's snapshot.
    fn recorded_pass() -> Option<Pass> {
        let snap = fixture(CONSTRUCTOR_SUN)?;
        let path = fixture_path(CONSTRUCTOR_SUN)?;
        let oom = snap.trace(1).iter().find(|e| e.action == Action::Oom).unwrap().size;
        let evidence = Evidence {
            device: "cuda:1".into(),
            pytorch_snapshot: Some(path.clone()),
            nvml: Some(Ok(NvmlFigures { index: 1, baseline_used: 500 << 20, end_used: 40 << 30, end_reserved: 30 << 30, ..NvmlFigures::default() })),
            oom: Some(OomFigures { step: OOM_STEP, requested: oom, error: Some("CUDA out of memory".into()) }),
            ..Evidence::default()
        };
        Some(Pass {
            stream: tracker_stream(&snap, 1),
            store: Store::new(16),
            last_snapshot: None,
            oom_snapshot: Some(path),
            oom_reported: true,
            steps_after_oom: 2,
            errors: Vec::new(),
            evidence: Ok(evidence),
        })
    }

    #[test]
    fn the_cuda_checks_pass_on_a_recorded_run_and_name_what_breaks() {
        let Some(pass) = recorded_pass() else { return };
        let checks = cuda_checks(&pass, 1);
        assert_eq!(checks.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), CUDA_CHECKS);
        for c in &checks {
            assert_eq!(c.status, Status::Pass, "{}: {}", c.name, c.reason);
        }
        // The stream loses one free: the trace and the peaks say so (the block's address is
        // used again later, so the blocks left at the end still agree).
        let mut lossy = recorded_pass().expect("present, as above");
        let i = lossy.stream.iter().position(|e| e.action == Action::FreeRequested).unwrap();
        lossy.stream.remove(i);
        let checks = cuda_checks(&lossy, 1);
        let failed: Vec<&str> = checks.iter().filter(|c| c.status == Status::Fail).map(|c| c.name.as_str()).collect();
        assert_eq!(failed, ["cuda.trace_matches_pytorch", "cuda.peaks"]);
        // No PyTorch snapshot: its three checks fail with the reason, the others still run.
        let mut none = recorded_pass().expect("present, as above");
        if let Ok(ev) = &mut none.evidence {
            ev.pytorch_snapshot = None;
            ev.pytorch_snapshot_error = Some("no history".into());
        }
        let checks = cuda_checks(&none, 1);
        assert_eq!(checks[0].reason, "PyTorch's snapshot was not taken: no history");
        assert_eq!(checks[4].status, Status::Pass);
    }

    #[test]
    fn without_cuda_every_cuda_check_is_skipped_never_passed() {
        let Some(mut pass) = recorded_pass() else { return };
        pass.evidence = Ok(Evidence { unavailable: Some("torch.cuda.is_available() is False".into()), ..Evidence::default() });
        for c in cuda_checks(&pass, 0) {
            assert_eq!((c.status, c.reason.as_str()), (Status::Skipped, "no CUDA here: torch.cuda.is_available() is False"), "{}", c.name);
        }
        pass.evidence = Err("the engine wrote no evidence".into());
        assert!(cuda_checks(&pass, 0).iter().all(|c| c.status == Status::Fail));
    }
}
