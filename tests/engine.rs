//! A real training step on CPU (tiny preset), checked for what a user relies on.

mod common;

use std::collections::HashMap;

use common::*;
use vramscope_core::event::{Action, Category, Phase};
use vramscope_core::store::Store;
use vramscope_core::step_config::{Attention, Mode, Optimizer, Precision};
use vramscope_core::stream::{Control, Incoming, Report};

/// Feeds a run into a store, the way the live screen does.
fn store_of(run: &Run) -> Store {
    let mut s = Store::new(1 << 24);
    for b in &run.batches {
        s.ingest_batch(b.clone());
    }
    for r in &run.reports {
        s.ingest_report(r.clone());
    }
    s
}

#[test]
fn every_alloc_is_freed_or_still_live_and_the_sum_is_the_live_total() {
    let run = run(options(tiny(32, 2, Mode::Train, Precision::Fp32, Attention::Naive), 2));
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut allocs = 0;
    for b in &run.batches {
        for e in &b.events {
            match e.action {
                Action::Alloc => {
                    allocs += 1;
                    assert!(live.insert(e.addr, e.size).is_none(), "address {:#x} allocated twice", e.addr);
                }
                Action::FreeRequested => {
                    let size = live.remove(&e.addr).unwrap_or_else(|| panic!("free of unknown {:#x}", e.addr));
                    assert_eq!(size, e.size, "a free reports the size that was allocated");
                }
                _ => {}
            }
        }
    }
    assert!(allocs > 200, "a training step makes hundreds of allocations, saw {allocs}");
    let steps = run.steps();
    assert_eq!(steps.len(), 2);
    let last = steps.last().unwrap();
    assert_eq!(live.values().sum::<u64>(), last.live_bytes, "sum of unfreed allocations = live total");
    assert_eq!(last.category_bytes.values().sum::<u64>(), last.live_bytes);
    assert_eq!(store_of(&run).history.live_total(), last.live_bytes, "the store agrees");
    // The viewer joined after the model was built: it still learns the segments made then,
    // so the screen's reserved is the allocator's, never below what is allocated.
    assert_eq!(store_of(&run).history.reserved(), last.reserved_bytes, "the screen's reserved is the allocator's");
    // What stays live between steps: parameters, gradients are freed by zero_grad,
    // optimizer state stays.
    assert!(last.category_bytes.contains_key("parameter"));
    assert!(last.category_bytes.contains_key("optimizer_state"));
    assert!(!last.category_bytes.contains_key("gradient"), "zero_grad frees gradients: {:?}", last.category_bytes);
    assert!(last.reserved_bytes >= last.peak_allocated_bytes.min(last.live_bytes));
    assert!(last.peak_allocated_bytes >= last.peak_active_bytes, "blocks are rounded up from requests");
}

#[test]
fn forward_only_steps_make_no_gradients_or_optimizer_state() {
    let run = run(options(tiny(32, 2, Mode::Forward, Precision::Fp32, Attention::Naive), 2));
    for b in &run.batches {
        for e in &b.events {
            assert!(
                !matches!(e.category, Category::Gradient | Category::OptimizerState),
                "{e:?}"
            );
            assert!(!matches!(e.phase, Phase::Backward | Phase::Optimizer));
        }
        for r in &b.retags {
            assert!(!matches!(r.category, Category::Gradient | Category::OptimizerState));
        }
    }
    for s in run.steps() {
        assert_eq!(s.phase_peak_bytes.keys().collect::<Vec<_>>(), vec!["forward"]);
    }
}

#[test]
fn the_second_full_step_allocates_no_new_optimizer_state_with_torchs_adamw() {
    // torch.optim.AdamW's pattern; the reference's AdamW makes new moments every step.
    let mut cfg = tiny(32, 2, Mode::Train, Precision::Fp32, Attention::Naive);
    cfg.optimizer = Optimizer::Torch;
    let run = run(options(cfg, 3));
    let mut state_by_step: HashMap<u32, u64> = HashMap::new();
    let mut state_addrs = HashMap::new();
    for b in &run.batches {
        for e in &b.events {
            if e.action == Action::Alloc && e.phase == Phase::Optimizer {
                state_addrs.insert(e.addr, (e.step, e.size));
            }
            if e.action == Action::FreeRequested {
                state_addrs.remove(&e.addr);
            }
        }
    }
    // What the optimizer allocated and never freed is its state.
    for (step, size) in state_addrs.values() {
        *state_by_step.entry(*step).or_default() += size;
    }
    let steps = run.steps();
    let state_after = |i: usize| steps[i].category_bytes.get("optimizer_state").copied().unwrap_or(0);
    let params = steps[0].category_bytes["parameter"];
    assert_eq!(state_by_step.get(&0).copied().unwrap_or(0), 2 * params, "AdamW keeps two moments per parameter");
    assert_eq!(state_by_step.get(&1), None, "step 1 allocated new optimizer state");
    assert_eq!(state_by_step.get(&2), None, "step 2 allocated new optimizer state");
    assert_eq!(state_after(0), 2 * params);
    assert_eq!(state_after(2), 2 * params);
}

/// The most activation bytes live in `step`, as the engine counted them from every event
/// (what the store ingests can miss batches when a busy machine delays its reader).
fn activation_peak(run: &Run, step: usize) -> u64 {
    run.steps()[step].category_peak_bytes[Category::Activation.as_str()]
}

/// At a shape where activations dominate (as they do at CS336 sizes). At very small shapes
/// the bf16 weight copies autocast keeps for backward (also live at this point) can
/// outweigh the halved activations.
#[test]
fn bf16_autocast_lowers_activation_bytes() {
    let fp32 = run(options(tiny(256, 4, Mode::Train, Precision::Fp32, Attention::Naive), 2));
    let bf16 = run(options(tiny(256, 4, Mode::Train, Precision::Bf16, Attention::Naive), 2));
    let mut cpu_policy = options(tiny(256, 4, Mode::Train, Precision::Bf16, Attention::Naive), 2);
    cpu_policy.autocast_policy = vramscope_core::step_config::AutocastPolicy::Cpu;
    let cpu_policy = run(cpu_policy);
    let (a32, a16) = (activation_peak(&fp32, 1), activation_peak(&bf16, 1));
    assert!(a32 > 0);
    assert!((a16 as f64) < 0.95 * a32 as f64, "bf16 activations {a16} vs fp32 {a32}");
    // CUDA's policy keeps the softmax's and the loss's tensors in fp32, CPU's in bf16.
    let a16_cpu = activation_peak(&cpu_policy, 1);
    assert!(a16_cpu < a16, "bf16 activations under CPU autocast's lists {a16_cpu} vs CUDA's {a16}");
    let f32_peak = fp32.steps()[1].phase_peak_bytes["forward"];
    let bf_peak = bf16.steps()[1].phase_peak_bytes["forward"];
    assert!(bf_peak < f32_peak, "bf16 forward peak {bf_peak} vs fp32 {f32_peak}");
}

/// Largest single allocation made by layer 0's attention in the forward pass of step 0.
fn largest_attention_alloc(ctx: i64, attention: Attention) -> u64 {
    let run = run(options(tiny(ctx, 2, Mode::Forward, Precision::Fp32, attention), 1));
    let store = store_of(&run);
    let scope = store.scopes.iter().position(|s| s == "layers.0.attn").expect("scope interned") as u32;
    run.batches
        .iter()
        .flat_map(|b| &b.events)
        .filter(|e| e.action == Action::Alloc && e.scope == scope && e.phase == Phase::Forward)
        .map(|e| e.size)
        .max()
        .expect("attention allocates")
}

#[test]
fn doubling_ctx_grows_naive_scores_4x_and_fused_2x() {
    let naive = largest_attention_alloc(256, Attention::Naive) as f64 / largest_attention_alloc(128, Attention::Naive) as f64;
    let fused = largest_attention_alloc(256, Attention::Fused) as f64 / largest_attention_alloc(128, Attention::Fused) as f64;
    assert!((3.6..=4.4).contains(&naive), "naive attention grew {naive:.2}x");
    assert!((1.6..=2.4).contains(&fused), "fused attention grew {fused:.2}x");
}

#[test]
fn a_control_message_changes_the_next_step_not_the_current_one() {
    let source = start(&options(tiny(32, 2, Mode::Train, Precision::Fp32, Attention::Naive), 3));
    // Wait until step 0 is under way (its forward mark arrived), then change ctx.
    let mut before = Vec::new();
    loop {
        let (_, item) = source.next().expect("the stream flows");
        let forward = matches!(&item, Incoming::Batch(b) if b.marks.iter().any(|m| m.step == 0 && m.phase == Phase::Forward));
        before.push(item);
        if forward {
            break;
        }
    }
    source.send(&Control::SetKnob { name: "ctx".into(), value: "64".into() });
    let run = collect(&source);
    let steps = run.steps();
    assert_eq!(steps[0].ctx, 32, "the step in progress keeps its ctx");
    assert_eq!(steps[1].ctx, 64, "the next step uses the new ctx");
    let knob = run.reports.iter().find_map(|r| if let Report::Knob(k) = r { Some(k.clone()) } else { None });
    let knob = knob.expect("the change is itself an event");
    assert_eq!((knob.knob.as_str(), knob.from.as_str(), knob.to.as_str(), knob.step), ("ctx", "32", "64", 1));
    // A knob the model does not have is refused with a note, and nothing changes.
    let source = start(&options(tiny(32, 2, Mode::Train, Precision::Fp32, Attention::Naive), 2));
    source.send(&Control::SetKnob { name: "lr".into(), value: "3".into() });
    let mut notes = Vec::new();
    while let Some((_, item)) = source.next() {
        if let Incoming::Report(Report::Note(n)) = item {
            notes.push(n);
        }
    }
    assert!(notes.iter().any(|n| n.contains("no knob 'lr'")), "{notes:?}");
}

#[test]
fn a_viewer_that_does_not_read_costs_dropped_batches_never_the_jobs_progress_or_exact_totals() {
    const STEPS: u64 = 150;
    let mut opts = options(tiny(32, 2, Mode::Train, Precision::Fp32, Attention::Naive), STEPS);
    opts.queue_batches = 1;
    let source = start(&opts);
    // A second viewer reads nothing for the first 60 steps: its socket holds about 20 steps
    // of 1,700 events, so the job's queue for it overflows. The job must not wait for it.
    let socket = vramscope_core::channel::dir::socket_path(&vramscope_core::channel::dir::socket_dir().unwrap(), &source.name, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !socket.exists() {
        assert!(std::time::Instant::now() < deadline, "the engine never listened at {}", socket.display());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (stalled, _controls) = vramscope_core::source::job::connect(&vramscope_core::channel::Endpoint::Unix(socket), None).unwrap();
    let mut stalled = Some(stalled);
    let mut late_reader = None;
    let mut full = Vec::new();
    while let Some((_, item)) = source.next() {
        match item {
            Incoming::Report(Report::Step(s)) => {
                full.push(s);
                if full.len() == 60 {
                    let r = stalled.take().expect("once");
                    late_reader = Some(std::thread::spawn(move || {
                        let mut reader = vramscope_core::stream::chunk::ChunkReader::new(r).unwrap();
                        let mut steps = Vec::new();
                        while let Some(records) = reader.next_chunk().expect("the late viewer's stream reads") {
                            for r in records {
                                if let vramscope_core::stream::codec::Record::Item { item: Incoming::Report(Report::Step(s)), .. } = r {
                                    steps.push(s);
                                }
                            }
                        }
                        steps
                    }));
                }
            }
            Incoming::Report(Report::Error(e)) => panic!("{e}"),
            _ => {}
        }
    }
    assert_eq!(full.len() as u64, STEPS, "the job ran every step");
    let steps = late_reader.expect("60 steps ran").join().unwrap();
    assert_eq!(steps.len() as u64, STEPS, "every step's report reached the late viewer: reports are never dropped");
    let last = steps.last().unwrap();
    assert!(last.dropped_batches > 0 && last.dropped_events > 0, "{last:?}");
    // The same run with the default queue and a viewer that reads: the same figures.
    let exact = run(options(tiny(32, 2, Mode::Train, Precision::Fp32, Attention::Naive), STEPS));
    let exact = exact.steps();
    let exact = exact.last().unwrap();
    assert_eq!(exact.dropped_events, 0);
    assert_eq!(exact.peak_allocated_bytes, last.peak_allocated_bytes, "totals stay exact");
    assert_eq!(exact.live_bytes, last.live_bytes);
}

#[test]
fn an_out_of_memory_step_is_snapshotted_pauses_and_resumes_with_a_smaller_ctx() {
    // Naive attention scores at this shape need 2 × 4 × 65536² × 4 bytes = 128 GiB:
    // more than this machine (or any GPU) has, so the allocation itself fails.
    let mut opts = options(tiny(65536, 2, Mode::Forward, Precision::Fp32, Attention::Naive), 2);
    opts.steps = Some(2);
    let source = start(&opts);
    let mut before = Vec::new();
    let oom = loop {
        match source.next().expect("the stream flows").1 {
            Incoming::Report(Report::Oom(o)) => break o,
            Incoming::Report(Report::Step(s)) => panic!("a step at ctx 65536 should not fit: {s:?}"),
            Incoming::Report(Report::Error(e)) => panic!("reported as a generic error: {e}"),
            Incoming::Batch(b) => before.push(b),
            _ => {}
        }
    };
    assert_eq!(oom.step, 0);
    assert_eq!(oom.phase, Phase::Forward);
    assert!(oom.message.contains("allocate"), "{}", oom.message);
    // The snapshot was written before the failure unwound: it ends in the oom entry.
    let snap_path = oom.snapshot.clone().expect("an OOM snapshot");
    let snap = vramscope_core::snapshot::read_snapshot_file(&snap_path).unwrap();
    let last = snap.device_traces[0].last().expect("a trace");
    assert_eq!((last.action, last.size), (Action::Oom, 2 * 4 * 65536 * 65536 * 4), "the failed request is the trace's last entry");
    let oom_event = before.iter().flat_map(|b| &b.events).find(|e| e.action == Action::Oom);
    assert!(oom_event.is_some() || snap.device_traces[0].iter().any(|e| e.action == Action::Oom));
    let paused = loop {
        match source.next().expect("the stream flows").1 {
            Incoming::Report(Report::Paused(p)) => break p,
            Incoming::Batch(b) => before.push(b),
            _ => {}
        }
    };
    assert!(paused, "the loop pauses");
    source.send(&Control::SetKnob { name: "ctx".into(), value: "32".into() });
    source.send(&Control::Resume);
    let mut run = collect(&source);
    before.append(&mut run.batches);
    let steps = run.steps();
    // The abandoned step keeps its number; the next one runs with the new ctx.
    assert_eq!(steps.len(), 1, "the step after resuming ran");
    assert_eq!((steps[0].step, steps[0].ctx), (1, 32));
    // Nothing of the abandoned step is still counted as live.
    let mut live: HashMap<u64, u64> = HashMap::new();
    common::apply_events(&mut live, before.iter().flat_map(|b| &b.events));
    assert_eq!(live.values().sum::<u64>(), steps[0].live_bytes, "the stream agrees with the totals");
    let (params, live_total) = (steps[0].category_bytes["parameter"], steps[0].live_bytes);
    assert!(live_total < params + (1 << 20), "live {live_total} vs parameters {params}");
}

#[test]
fn a_cpu_run_models_the_allocator_settings_it_is_given() {
    let mut opts = options(tiny(32, 2, Mode::Train, Precision::Fp32, Attention::Naive), 2);
    opts.alloc_conf = "expandable_segments:True".into();
    opts.snapshot_at = vec![1];
    let run = run(opts);
    let actions: Vec<Action> = run.batches.iter().flat_map(|b| &b.events).map(|e| e.action).collect();
    assert!(actions.contains(&Action::SegmentMap), "expandable segments map pages: {actions:?}");
    assert!(!actions.contains(&Action::SegmentAlloc), "and allocate no fixed segments: {actions:?}");
    let Some(Report::Started(info)) = run.reports.first() else { panic!("started first") };
    assert_eq!(info.alloc_conf, "expandable_segments:True", "the header shows the settings in force");
    let path = run.reports.iter().find_map(|r| if let Report::SnapshotSaved { path, .. } = r { Some(path.clone()) } else { None }).expect("a snapshot");
    let snap = vramscope_core::snapshot::read_snapshot_file(&path).unwrap();
    let settings = snap.allocator_settings.expect("the snapshot records the settings");
    assert_eq!(settings.get("expandable_segments"), Some(&vramscope_core::snapshot::model::SettingValue::Bool(true)), "{settings:?}");
    assert!(snap.segments.iter().all(|s| s.is_expandable), "its segments are expandable");
    // A value PyTorch would refuse is a one-line error naming the option.
    let bad = common::vramscope().args(["run", "--headless", "--alloc-conf", "expandable_segments:maybe"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.lines().count() == 1 && err.contains("--alloc-conf") && err.contains("expandable_segments"), "{err}");
}

/// fp16 is bf16's autocast in float16 plus a GradScaler: every phase of a training step peaks
/// at bf16's peak plus the scaler's one-element tensors (scale and growth tracker, 8 bytes;
/// the scaled loss or found_inf, 4 more), and those two are named on the screen.
#[test]
fn fp16_trains_as_bf16_does_plus_the_grad_scalers_tensors() {
    let peaks = |p| {
        let run = run(options(tiny(64, 2, Mode::Train, p, Attention::Naive), 2));
        let names: HashMap<u32, String> = run.batches.iter().flat_map(|b| b.scopes.iter().cloned()).collect();
        // Named after it was shipped (a retag), or before (its own event says so).
        let retagged = run.batches.iter().flat_map(|b| &b.retags).filter(|r| r.category == Category::OptimizerState).map(|r| r.scope);
        let made = run.batches.iter().flat_map(|b| &b.events).filter(|e| e.action == Action::Alloc && e.category == Category::OptimizerState).map(|e| e.scope);
        let tagged: Vec<String> = retagged.chain(made).filter_map(|s| names.get(&s).cloned()).collect();
        (run.steps().last().unwrap().phase_active_peak_bytes.clone(), tagged)
    };
    let (bf16, _) = peaks(Precision::Bf16);
    let (fp16, tagged) = peaks(Precision::Fp16);
    for (phase, b) in &bf16 {
        let extra = fp16[phase] as i64 - *b as i64;
        assert!((8..=12).contains(&extra), "{phase}: fp16 {} against bf16 {b}", fp16[phase]);
    }
    for name in ["GradScaler._scale", "GradScaler._growth_tracker"] {
        assert!(tagged.iter().any(|t| t == name), "{name} named: {tagged:?}");
    }
}
