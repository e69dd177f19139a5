//! The modelled GPU and `estimate` against real GPU runs of the CS336 model (issue 32):
//! medium, batch 4, vocab 10,000, under CUDA's bf16 autocast and in fp32
//! (`vramscope_core::fixtures::REAL_RUNS`). Held phase by phase and by the sizes alive at the
//! peak, within 3%. The ctx-512 bf16 training step is beside the other real snapshots (CI
//! has it); the others are downloaded by `scripts/fixtures`, and their tests skip with a line
//! without them. The policy op by op is held in py_hook.rs, and the estimate to the engine at
//! small shapes under both policies in reference_model.rs.

mod common;

use std::collections::{BTreeMap, HashMap};

use vramscope_core::report::estimate::{estimate, Estimate};
use vramscope_core::snapshot::model::{Action, BlockState, Snapshot};
use vramscope_core::step_config::{Attention, Mode, Precision, Preset, StepConfig};
use vramscope_core::stream::StepReport;

/// Within 3%, the bound.
const TOLERANCE: f64 = 0.03;

fn real(name: &str) -> Option<Snapshot> {
    let path = vramscope_core::fixtures::real_run_for_test(&common::repo_root(), name)?;
    Some(vramscope_core::snapshot::read_snapshot_file(&path).unwrap())
}

/// What memory_viz's active timeline shows of a snapshot's first device: requested bytes
/// live, the peak per phase and the sizes alive at the highest one.
struct Active {
    by_phase: BTreeMap<&'static str, u64>,
    peak: u64,
    sizes_at_peak: Vec<u64>,
}

/// `phase_of` names the phase an entry begins (None: the one before goes on). Memory live
/// before the trace begins is what its segments still hold plus what the trace frees, less
/// what it allocates.
fn active(s: &Snapshot, first_phase: &'static str, phase_of: impl Fn(&Snapshot, u32) -> Option<&'static str>) -> Active {
    let trace = &s.device_traces[0];
    let mut live: HashMap<u64, u64> = HashMap::new();
    for seg in s.segments.iter().filter(|g| g.device == 0) {
        let mut addr = seg.address;
        for b in &seg.blocks {
            if b.state != BlockState::Inactive {
                live.insert(addr, b.requested_size);
            }
            addr += b.size;
        }
    }
    for e in trace.iter().rev() {
        match e.action {
            Action::Alloc => {
                live.remove(&e.addr);
            }
            Action::FreeCompleted => {
                live.insert(e.addr, e.size);
            }
            _ => {}
        }
    }
    let mut total: u64 = live.values().sum();
    let mut out = Active { by_phase: BTreeMap::new(), peak: 0, sizes_at_peak: Vec::new() };
    let mut phase = first_phase;
    for e in trace {
        phase = phase_of(s, e.frames).unwrap_or(phase);
        match e.action {
            Action::Alloc => {
                live.insert(e.addr, e.size);
                total += e.size;
            }
            Action::FreeCompleted => {
                total -= live.remove(&e.addr).unwrap_or(0);
            }
            _ => continue,
        }
        let p = out.by_phase.entry(phase).or_default();
        *p = (*p).max(total);
        if total > out.peak {
            out.peak = total;
            out.sizes_at_peak = live.values().copied().collect();
        }
    }
    out.sizes_at_peak.sort_unstable();
    out
}

/// A real run's phases, from its Python frames: backward begins where autograd makes the
/// loss's gradient, the optimizer's step in the optimizer's file.
fn real_phases(s: &Snapshot) -> Active {
    active(s, "forward", |s, stack| {
        let frames: Vec<_> = s.stack(stack).collect();
        if frames.iter().any(|f| f.name == "_make_grads") {
            Some("backward")
        } else if frames.iter().any(|f| f.filename.ends_with("optimizer.py")) {
            Some("optimizer")
        } else {
            None
        }
    })
}

fn config(ctx: i64, precision: Precision, mode: Mode) -> StepConfig {
    StepConfig {
        model_name: "medium".into(),
        dims: Preset::Medium.dims(),
        ctx,
        batch: 4,
        precision,
        mode,
        attention: Attention::Naive,
        optimizer: Default::default(),
        checkpointing: Default::default(),
    }
}

fn assert_within(what: &str, ours: u64, truth: u64) {
    let err = (ours as f64 - truth as f64) / truth as f64;
    eprintln!("{what}: {ours} B against the GPU's {truth} B ({:+.2}%)", err * 100.0);
    assert!(err.abs() <= TOLERANCE, "{what}: {ours} B against the GPU's {truth} B ({:+.2}%)", err * 100.0);
}

/// Bytes in the sizes one multiset has more of than the other (each side's surplus).
fn size_surplus(a: &[u64], b: &[u64]) -> u64 {
    let mut count: HashMap<u64, i64> = HashMap::new();
    for s in a {
        *count.entry(*s).or_default() += 1;
    }
    for s in b {
        *count.entry(*s).or_default() -= 1;
    }
    count.iter().map(|(s, n)| s * n.unsigned_abs()).sum()
}

fn estimate_phases(e: &Estimate) -> [(&'static str, u64); 3] {
    [("forward", e.train_forward_peak_bytes), ("backward", e.backward_peak_bytes), ("optimizer", e.optimizer_peak_bytes)]
}

/// The Done-when of issue 32: `vramscope run --headless --json --model medium --ctx 512
/// --batch 4 --mode train --precision bf16 --steps 2` on CPU, against the real bf16 step.
#[test]
fn a_cpu_run_of_the_bf16_training_step_allocates_as_the_real_gpu_run_did() {
    let Some(truth) = real("cs336_medium_ctx512_batch4_bf16_train") else { return };
    let truth = real_phases(&truth);
    let dir = tempfile::tempdir().unwrap();
    let out = common::vramscope()
        .args(["run", "--headless", "--json", "--model", "medium", "--ctx", "512", "--batch", "4", "--mode", "train"])
        .args(["--precision", "bf16", "--steps", "2", "--device", "cpu", "--snapshot-at", "1", "--snapshot-dir"])
        .arg(dir.path())
        .timeout(std::time::Duration::from_secs(900))
        .assert()
        .success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    let step: StepReport = serde_json::from_str(stdout.lines().last().expect("a step line")).unwrap();
    assert_eq!(step.step, 1);
    assert_within("the step's active peak", step.peak_active_bytes, truth.peak);
    assert_within("the step's allocated peak", step.peak_allocated_bytes, truth.peak);
    for (phase, real) in &truth.by_phase {
        assert_within(&format!("{phase}'s active peak"), step.phase_active_peak_bytes[*phase], *real);
    }
    let saved = std::fs::read_dir(dir.path()).unwrap().next().expect("the step's snapshot").unwrap().path();
    let ours = active(&vramscope_core::snapshot::read_snapshot_file(&saved).unwrap(), "other", |_, _| None);
    let surplus = size_surplus(&ours.sizes_at_peak, &truth.sizes_at_peak);
    eprintln!("sizes alive at the peak: {surplus} B differ between the two");
    assert!(
        (surplus as f64) <= TOLERANCE * truth.peak as f64,
        "the tensors alive at the peak differ by {surplus} B of {} B",
        truth.peak
    );
    // The same cell under CPU autocast's lists is the 8% gap this issue closed.
    let cpu_policy = vramscope_core::report::estimate::estimate_on(
        &config(512, Precision::Bf16, Mode::Train),
        vramscope_core::report::estimate::Target { cpu: true, autocast_policy: vramscope_core::step_config::AutocastPolicy::Cpu },
    );
    assert!((cpu_policy.step_peak_bytes as f64) < 0.95 * truth.peak as f64, "CPU autocast's policy gives {} B", cpu_policy.step_peak_bytes);
}

/// A forward pass at ctx 512 under bf16: the real run stops at the logits; the engine's
/// forward mode also computes the loss, but at this cell its peak lies in the model (the
/// estimate's two figures agree), so the two runs are comparable.
#[test]
fn a_cpu_run_of_the_bf16_forward_pass_allocates_as_the_real_gpu_run_did() {
    let Some(truth) = real("cs336_medium_ctx512_batch4_bf16_forward") else { return };
    let truth = real_phases(&truth);
    let e = estimate(&config(512, Precision::Bf16, Mode::Forward));
    assert_eq!(e.logits_peak_bytes, e.forward_peak_bytes, "the peak lies before the loss");
    let out = common::vramscope()
        .args(["run", "--headless", "--json", "--model", "medium", "--ctx", "512", "--batch", "4", "--mode", "forward"])
        .args(["--precision", "bf16", "--steps", "2", "--device", "cpu"])
        .timeout(std::time::Duration::from_secs(600))
        .assert()
        .success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    let step: StepReport = serde_json::from_str(stdout.lines().last().expect("a step line")).unwrap();
    assert_within("the forward pass's active peak", step.peak_active_bytes, truth.peak);
}

/// `estimate` for a GPU, phase by phase, against every real run that is here: bf16 at ctx
/// 512 and 1024, fp32 at ctx 256 (training steps); bf16 at 512 and fp32 at 256 and 1024
/// (forward passes to the logits).
#[test]
fn the_estimate_is_within_three_percent_of_real_gpu_runs_phase_by_phase() {
    let cells = [
        ("cs336_medium_ctx512_batch4_bf16_train", 512, Precision::Bf16, Mode::Train),
        ("cs336_medium_ctx1024_batch4_bf16_train", 1024, Precision::Bf16, Mode::Train),
        ("cs336_medium_ctx256_batch4_fp32_train", 256, Precision::Fp32, Mode::Train),
        ("cs336_medium_ctx512_batch4_bf16_forward", 512, Precision::Bf16, Mode::Forward),
        ("cs336_medium_ctx256_batch4_fp32_forward", 256, Precision::Fp32, Mode::Forward),
        ("cs336_medium_ctx1024_batch4_fp32_forward", 1024, Precision::Fp32, Mode::Forward),
    ];
    for (name, ctx, precision, mode) in cells {
        let Some(s) = real(name) else { continue };
        let truth = real_phases(&s);
        let e = estimate(&config(ctx, precision, mode));
        match mode {
            Mode::Train => {
                for (phase, ours) in estimate_phases(&e) {
                    assert_within(&format!("{name}: {phase}"), ours, truth.by_phase[phase]);
                }
                assert_within(&format!("{name}: the step"), e.step_peak_bytes, truth.peak);
            }
            Mode::Forward => assert_within(&format!("{name}: to the logits"), e.logits_peak_bytes, truth.peak),
        }
    }
}

/// The real runs' own figures, so a reader of the tests above can trust how they are read:
/// the peak memory_viz states for the ctx-512 step (its README).
#[test]
fn the_real_runs_are_read_as_memory_viz_reads_them() {
    let Some(s) = real("cs336_medium_ctx512_batch4_bf16_train") else { return };
    let a = real_phases(&s);
    assert_eq!(a.peak, 12_426_629_128);
    assert_eq!(a.by_phase.keys().copied().collect::<Vec<_>>(), ["backward", "forward", "optimizer"]);
    assert_eq!(a.sizes_at_peak.iter().sum::<u64>(), a.peak);
}
