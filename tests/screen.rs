//! Whole-screen snapshots of the live screen, fed synthetic batches and reports (so they
//! are deterministic), at 80×24 and 200×60, with keys applied through the same handler
//! the app uses.

use std::collections::BTreeMap;
use std::path::PathBuf;

use vramscope::app::keys::{Action, KeyMap};
use vramscope::app::view::View;
use vramscope::event::{Retag, Action as Act, Batch, Category, MemEvent, Phase, PhaseMark};
use vramscope::render::draw_to_buffer;
use vramscope::render::live::render_live;
use vramscope::render::theme::Theme;
use vramscope::source::gauges::sample::{DeviceSample, GaugeBatch, GaugeSample, Gauges, HostSample, ProcessSample, SourceKind, SourceStatus};
use vramscope::store::ranks::RankSummary;
use vramscope::store::Store;
use vramscope::step_config::{Attention, Mode, Precision, Preset, StepConfig};
use vramscope::stream::{EngineInfo, KnobChange, OomReport, Report, StepReport};

const MIB: u64 = 1 << 20;

fn config(ctx: i64, precision: Precision) -> StepConfig {
    StepConfig { model_name: "tiny".into(), dims: Preset::Tiny.dims(), ctx, batch: 4, precision, mode: Mode::Train, attention: Attention::Naive, optimizer: Default::default() }
}

/// Two training steps' worth of events: parameters, forward activations that backward
/// frees, gradients, optimizer state on the first step, temporaries.
fn session() -> Store {
    let mut store = Store::new(1 << 20);
    let info = EngineInfo {
        device: "cpu".into(),
        parameters: 9_316_608,
        config: Some(config(256, Precision::Fp32)),
        note: Some("no CUDA device found: training on CPU, GPU memory modelled from CPU allocations".into()),
        name: "tiny".into(),
        knobs: config(256, Precision::Fp32).knobs(),
        ..EngineInfo::default()
    };
    store.ingest_report(Report::Started(info));
    let seq = std::cell::Cell::new(0u64);
    let mut addr = 0x7f00_0000_0000u64;
    let ev = |b: &mut Batch, action: Act, a: u64, size: u64, step: u32, phase: Phase, scope: u32, cat: Category| {
        let n = seq.get();
        if b.events.is_empty() {
            b.first_seq = n;
        }
        b.events.push(MemEvent { t_ns: n * 1000, addr: a, size, stream: 0, step, scope, action, phase, device: 0, category: cat });
        seq.set(n + 1);
    };
    let mark = |b: &mut Batch, step: u32, phase: Phase| {
        b.marks.push(PhaseMark { seq: seq.get(), t_ns: seq.get() * 1000, step, phase });
    };
    let mut b = Batch { scopes: vec![(1, "layers.0.attn".into()), (2, "layers.0.ffn".into()), (3, "lm_head".into())], ..Default::default() };
    ev(&mut b, Act::SegmentAlloc, addr, 192 * MIB, 0, Phase::Other, 0, Category::Unknown);
    let params: Vec<u64> = (0..8).map(|i| { addr += 4 * MIB; let _ = i; addr }).collect();
    for p in &params {
        ev(&mut b, Act::Alloc, *p, 4 * MIB, 0, Phase::Other, 0, Category::Unknown);
        b.retags.push(Retag { addr: *p, category: Category::Parameter, scope: 0 });
    }
    store.ingest_batch(b);
    for step in 0..2u32 {
        let mut b = Batch::default();
        mark(&mut b, step, Phase::Forward);
        let mut acts = Vec::new();
        for i in 0..12u64 {
            addr += 2 * MIB;
            let scope = 1 + (i % 3) as u32;
            ev(&mut b, Act::Alloc, addr, MIB + i * 64 * 1024, step, Phase::Forward, scope, Category::Activation);
            acts.push((addr, MIB + i * 64 * 1024));
            addr += MIB;
            ev(&mut b, Act::Alloc, addr, MIB / 2, step, Phase::Forward, scope, Category::Activation);
            ev(&mut b, Act::FreeRequested, addr, MIB / 2, step, Phase::Forward, scope, Category::Temporary);
        }
        store.ingest_batch(std::mem::take(&mut b));
        mark(&mut b, step, Phase::Backward);
        let mut grads = Vec::new();
        for (a, size) in acts.iter().rev() {
            ev(&mut b, Act::FreeRequested, *a, *size, step, Phase::Backward, 0, Category::Activation);
            if grads.len() < 8 {
                addr += 4 * MIB;
                ev(&mut b, Act::Alloc, addr, 4 * MIB, step, Phase::Backward, 0, Category::Temporary);
                grads.push(addr);
            }
        }
        b.retags.extend(grads.iter().map(|g| Retag { addr: *g, category: Category::Gradient, scope: 0 }));
        store.ingest_batch(std::mem::take(&mut b));
        mark(&mut b, step, Phase::Optimizer);
        if step == 0 {
            for _ in 0..16 {
                addr += 4 * MIB;
                ev(&mut b, Act::Alloc, addr, 4 * MIB, step, Phase::Optimizer, 0, Category::Temporary);
                b.retags.push(Retag { addr, category: Category::OptimizerState, scope: 0 });
            }
        }
        store.ingest_batch(std::mem::take(&mut b));
        mark(&mut b, step, Phase::ZeroGrad);
        for g in &grads {
            ev(&mut b, Act::FreeRequested, *g, 4 * MIB, step, Phase::ZeroGrad, 0, Category::Gradient);
        }
        mark(&mut b, step, Phase::Other);
        store.ingest_batch(b);
        let phase_peak_bytes: BTreeMap<String, u64> =
            [("forward", 60), ("backward", 90), ("optimizer", 120), ("zero_grad", 100)].iter().map(|(p, m)| (p.to_string(), m * MIB)).collect();
        store.ingest_report(Report::Step(StepReport {
            step: step as u64, mode: Mode::Train, precision: Precision::Fp32, attention: Some(Attention::Naive), ctx: 256, batch: 4,
            peak_allocated_bytes: 120 * MIB, reserved_bytes: 160 * MIB, peak_reserved_bytes: 160 * MIB, peak_active_bytes: 118 * MIB,
            phase_peak_bytes, category_bytes: BTreeMap::new(), live_bytes: 96 * MIB, step_time_s: 1.25, tokens_per_s: 819.2, loss: 9.2,
            dropped_batches: 0, dropped_events: 0, rank: None,
        }));
    }
    store.ingest_report(Report::Knob(KnobChange { step: 2, knob: "precision".into(), from: "fp32".into(), to: "bf16".into() }));
    store.ingest_report(Report::SnapshotSaved { step: 1, path: PathBuf::from("snapshots/tiny_ctx256_fp32_train_step1.pickle") });
    store
}

/// NVML readings every 10 events' worth of time: the device holds reserved memory plus a
/// CUDA context the allocator never sees.
fn with_gpu(mut store: Store) -> Store {
    if let Some(info) = &mut store.info {
        info.device = "cuda:0".into();
        info.cuda = true;
    }
    let end = store.history.end();
    let samples = (0..end / 10)
        .map(|k| {
            let t = store.history.get(k * 10).map(|e| e.t_ns).unwrap_or(0);
            let used = 192 * MIB + 500 * MIB;
            GaugeSample {
                t_ns: t,
                gauges: Gauges::Devices(vec![DeviceSample {
                    index: 0, name: "NVIDIA H100 80GB HBM3".into(), mem_used: used, mem_total: 80 << 30, mem_free: (80 << 30) - used,
                    gpu_util: Some(97), mem_util: Some(40), temp_c: Some(61), power_mw: Some(512_000), power_limit_mw: Some(700_000),
                    sm_clock_mhz: Some(1980), mem_clock_mhz: Some(2619), processes: Vec::new(),
                }]),
            }
        })
        .collect();
    store.ingest_gauges(GaugeBatch { first_seq: 0, status: Some(SourceStatus { kind: SourceKind::Nvml, reason: None }), samples });
    store
}

/// A machine without NVML: host gauges, and the reason said once.
fn with_host(mut store: Store) -> Store {
    let host = HostSample { rss_bytes: 900 * MIB, mem_total: 24 << 30, mem_used: 6 << 30, cpu_percent: Some(180.0), self_cpu_percent: Some(170.0), cpu_count: 2 };
    store.ingest_gauges(GaugeBatch {
        first_seq: 0,
        status: Some(SourceStatus { kind: SourceKind::Host, reason: Some("NVML unavailable: libnvidia-ml.so.1: cannot open shared object file".into()) }),
        samples: vec![GaugeSample { t_ns: 0, gauges: Gauges::Host(host) }],
    });
    store
}

fn text(store: &Store, view: &View, w: u16, h: u16) -> String {
    let theme = Theme::load("dark").unwrap();
    let buf = draw_to_buffer(w, h, |f| render_live(f, store, &RankSummary::default(), view, &KeyMap::default(), &theme));
    (0..h)
        .map(|y| (0..w).map(|x| buf[(x, y)].symbol().to_string()).collect::<String>().trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

fn whole(store: &Store) -> View {
    View { window: store.history.end().max(64), ..View::default() }
}

#[test]
fn live_screen_80x24() {
    let store = with_host(session());
    let screen = text(&store, &whole(&store), 80, 24);
    assert!(screen.contains("bf16"), "the knob change shows in the header:\n{screen}");
    insta::assert_snapshot!(screen);
}

#[test]
fn live_screen_200x60_on_a_gpu() {
    let store = with_gpu(session());
    let screen = text(&store, &whole(&store), 200, 60);
    for want in ["peak", "optimizer state", "parameter", "largest live allocations", "device gauges: NVML", "cuda:0", "GPU 0 NVIDIA H100", "non-PyTorch", "500 MiB", "┄"] {
        assert!(screen.contains(want), "'{want}' missing:\n{screen}");
    }
    insta::assert_snapshot!(screen);
}

#[test]
fn help_overlay_is_generated_from_the_key_table() {
    let store = with_host(session());
    let mut view = whole(&store);
    view.help = true;
    let screen = text(&store, &view, 200, 60);
    for a in Action::ALL {
        assert!(screen.contains(a.help()), "help lacks '{}'", a.help());
    }
    insta::assert_snapshot!(screen);
}

#[test]
fn out_of_memory_state() {
    let mut store = with_host(session());
    store.ingest_report(Report::Oom(OomReport { step: 2, phase: Phase::Backward, message: "CUDA out of memory. Tried to allocate 20.00 GiB".into(), snapshot: None }));
    store.ingest_report(Report::Paused(true));
    let screen = text(&store, &whole(&store), 200, 60);
    assert!(screen.contains("OUT OF MEMORY"));
    assert!(screen.contains("lower ctx with ["), "tells the user what to do:\n{screen}");
    insta::assert_snapshot!(screen);
}

#[test]
fn by_allocation_bands_and_a_too_small_terminal() {
    let store = with_host(session());
    let view = View { by_category: false, ..whole(&store) };
    let screen = text(&store, &view, 200, 60);
    assert!(screen.contains("by allocation"));
    insta::assert_snapshot!("by_allocation", screen);
    let small = text(&store, &view, 50, 12);
    assert!(small.contains("needs at least 60×18"), "{small}");
}

#[test]
fn the_device_gauges_follow_the_gpu_this_process_trains_on() {
    // CUDA calls it cuda:0; NVML lists it as device 2, and a stray CUDA context of ours sits
    // on NVML device 0.
    let ours = |used: u64| ProcessSample { pid: 4242, used_bytes: Some(used), sm_util: None, name: Some("vramscope".into()), is_self: true };
    let gpu = |index: u32, processes: Vec<ProcessSample>| DeviceSample {
        index, name: format!("GPU {index}"), mem_used: 0, mem_total: 80 << 30, mem_free: 80 << 30, gpu_util: None, mem_util: None,
        temp_c: None, power_mw: None, power_limit_mw: None, sm_clock_mhz: None, mem_clock_mhz: None, processes,
    };
    let batch = || GaugeBatch {
        first_seq: 0,
        status: None,
        samples: vec![GaugeSample { t_ns: 0, gauges: Gauges::Devices(vec![gpu(0, vec![ours(300 * MIB)]), gpu(1, Vec::new()), gpu(2, vec![ours(30 << 30)])]) }],
    };
    let mut store = with_gpu(session());
    assert_eq!(store.gauges.selected_device(), 0, "before NVML lists the process: the CUDA ordinal");
    store.ingest_gauges(batch());
    assert_eq!(store.gauges.selected_device(), 2);
    // A CPU run never moves the selection.
    let mut cpu = session();
    cpu.ingest_gauges(batch());
    assert_eq!(cpu.gauges.selected_device(), 0);
}
