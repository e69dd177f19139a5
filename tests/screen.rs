//! Whole-screen snapshots of the live screen, fed synthetic batches and reports (so they
//! are deterministic), at 80×24 and 200×60, with keys applied through the same handler
//! the app uses.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use ratatui::buffer::Buffer;
use ratatui::style::Color;
use vramscope::keys::KeyMap;
use vramscope::screens::live::keys::LiveKey;
use vramscope::screens::live::run::{handle, Controls};
use vramscope::screens::live::view::View;
use vramscope::theme::ColorSupport;
use vramscope_core::store::ranks::Ranks;
use vramscope_core::stream::Incoming;
use vramscope_core::event::{Retag, Action as Act, Batch, Category, MemEvent, Phase, PhaseMark};
use vramscope::draw::draw_to_buffer;
use common::colour_capture::colours;
use vramscope::screens::live::render::render_live;
use vramscope::theme::Theme;
use vramscope_core::source::gauges::sample::{DeviceSample, GaugeBatch, GaugeSample, Gauges, HostSample, ProcessSample, SourceKind, SourceStatus};
use vramscope_core::store::ranks::RankSummary;
use vramscope_core::store::{LogKind, Store};
use vramscope_core::step_config::{Attention, AutocastPolicy, Mode, Precision, Preset, StepConfig};
use vramscope_core::stream::{EngineInfo, Knob, KnobChange, OutOfMemory, Report, StepReport};

const MIB: u64 = 1 << 20;
const PARAMS: [&str; 8] = [
    "token_embeddings.weight",
    "layers.0.attn.q_proj.weight",
    "layers.0.attn.k_proj.weight",
    "layers.0.attn.v_proj.weight",
    "layers.0.attn.output_proj.weight",
    "layers.0.ffn.w1.weight",
    "layers.0.ffn.w2.weight",
    "lm_head.weight",
];

fn config(ctx: i64, precision: Precision) -> StepConfig {
    StepConfig { model_name: "tiny".into(), dims: Preset::Tiny.dims(), ctx, batch: 4, precision, mode: Mode::Train, attention: Attention::Naive, optimizer: Default::default(), checkpointing: Default::default() }
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
    // Names as the engine gives them: modules for activations, and through retags the
    // parameters, their gradients and AdamW's state.
    let mut scopes: Vec<(u32, String)> = ["layers.0.attn", "layers.0.ffn", "lm_head"].iter().map(|s| s.to_string()).enumerate().map(|(i, s)| (i as u32 + 1, s)).collect();
    let mut name = |n: String| {
        let id = scopes.len() as u32 + 1;
        scopes.push((id, n));
        id
    };
    let params: Vec<(u64, String)> = PARAMS.iter().map(|n| { addr += 4 * MIB; (addr, n.to_string()) }).collect();
    let param_ids: Vec<u32> = params.iter().map(|(_, n)| name(n.clone())).collect();
    let grad_ids: Vec<u32> = params.iter().map(|(_, n)| name(format!("grad of {n}"))).collect();
    let state_ids: Vec<u32> = params.iter().flat_map(|(_, n)| [format!("exp_avg of {n}"), format!("exp_avg_sq of {n}")]).collect::<Vec<_>>().into_iter().map(&mut name).collect();
    let mut b = Batch { scopes, ..Default::default() };
    ev(&mut b, Act::SegmentAlloc, addr, 192 * MIB, 0, Phase::Other, 0, Category::Unknown);
    for ((p, _), id) in params.iter().zip(&param_ids) {
        ev(&mut b, Act::Alloc, *p, 4 * MIB, 0, Phase::Other, 0, Category::Unknown);
        b.retags.push(Retag { addr: *p, category: Category::Parameter, scope: *id });
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
        b.retags.extend(grads.iter().zip(&grad_ids).map(|(g, id)| Retag { addr: *g, category: Category::Gradient, scope: *id }));
        store.ingest_batch(std::mem::take(&mut b));
        mark(&mut b, step, Phase::Optimizer);
        if step == 0 {
            for id in &state_ids {
                addr += 4 * MIB;
                ev(&mut b, Act::Alloc, addr, 4 * MIB, step, Phase::Optimizer, 0, Category::Temporary);
                b.retags.push(Retag { addr, category: Category::OptimizerState, scope: *id });
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
            step: step as u64, mode: Mode::Train, precision: Precision::Fp32, attention: Some(Attention::Naive), checkpointing: None, ctx: 256, batch: 4,
            peak_allocated_bytes: 120 * MIB, reserved_bytes: 160 * MIB, peak_reserved_bytes: 160 * MIB, peak_active_bytes: 118 * MIB,
            phase_peak_bytes, phase_active_peak_bytes: BTreeMap::new(), mean_active_bytes: 0, category_peak_bytes: BTreeMap::new(), category_bytes: BTreeMap::new(), live_bytes: 96 * MIB, step_time_s: 1.25, tokens_per_s: 819.2, samples_per_s: 3.2, loss: Some(9.2),
            dropped_batches: 0, dropped_events: 0, rank: None, device: None,
        }));
    }
    store.ingest_report(Report::Knob(KnobChange { step: 2, knob: "precision".into(), from: "fp32".into(), to: "bf16".into() }));
    store.ingest_report(Report::SnapshotSaved { step: 1, path: PathBuf::from("snapshots/tiny_ctx256_fp32_train_step1.pickle") });
    store
}

/// NVML readings every 10 events' worth of time: the device holds reserved memory plus a
/// CUDA context the allocator never sees.
fn with_gpu(mut store: Store) -> Store {
    let bus = "00000000:18:00.0";
    if let Some(info) = &mut store.info {
        info.device = "cuda:0".into();
        info.cuda = true;
        info.pci_bus_id = Some(bus.into());
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
                    sm_clock_mhz: Some(1980), mem_clock_mhz: Some(2619), processes: Vec::new(), pci_bus_id: Some(bus.into()),
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

/// Issue 34: every state of the live screen (and a replay's) reads at 80×24 and 120×36: the
/// header gives way field by field, never mid-word or mid-number, and an out-of-memory, a
/// pause or lost events never fall off.
#[test]
fn every_state_reads_at_80x24_and_120x36() {
    let mut oom = with_host(session());
    oom.ingest_report(Report::Oom(OutOfMemory { step: 2, phase: Phase::Backward, message: "CUDA out of memory. Tried to allocate 20.00 GiB".into(), snapshot: None }));
    oom.ingest_report(Report::Paused(true));
    let mut paused = with_gpu(session());
    paused.ingest_report(Report::Paused(true));
    let mut dropping = with_host(session());
    let mut gap = Batch { first_seq: 1_000_000, ..Batch::default() };
    gap.events.push(MemEvent { t_ns: 9_000_000, addr: 0xdead_0000, size: 512 * 1024, stream: 0, step: 2, scope: 0, action: Act::Alloc, phase: Phase::Other, device: 0, category: Category::Input });
    dropping.ingest_batch(gap);
    let mut replay = with_host(session());
    replay.title = Some("replay of fp32-to-bf16-then-double-ctx.vsrec".into());
    let states: [(&str, Store, &[&str]); 5] = [
        ("running", with_host(session()), &["step 2", "bf16", "ctx 256", "batch 4"]),
        ("oom", oom, &["OUT OF MEMORY", "step 2"]),
        ("paused_on_a_gpu", paused, &["PAUSED", "step 2"]),
        ("dropping", dropping, &["events lost", "step 2"]),
        ("replay", replay, &["step 2", "replay of"]),
    ];
    for (name, store, wants) in states {
        for (w, h) in [(80u16, 24u16), (120, 36)] {
            let screen = text(&store, &whole(&store), w, h);
            let header: Vec<&str> = screen.lines().take(2).collect();
            for want in wants {
                assert!(header.iter().any(|l| l.contains(want)), "{name} at {w}×{h}: '{want}' not in the header:\n{screen}");
            }
            for l in &header {
                assert!(l.chars().count() <= w as usize && !l.contains('…'), "{name} at {w}×{h}: a cut header line: {l}");
                // Every field whole: the header's fields end at a separator or the line's end.
                for field in l.split(" · ") {
                    assert!(!field.ends_with(' ') && !field.is_empty(), "{name} at {w}×{h}: '{field}' in {l}");
                }
            }
            insta::assert_snapshot!(format!("live_{name}_{w}x{h}"), screen);
        }
    }
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

/// Issue 34: a finished run's host gauges read `process RSS 0 B`, as if the job held no
/// memory; its processes are gone, and the panel says so.
#[test]
fn a_finished_jobs_rss_says_it_exited() {
    let mut store = with_host(session());
    store.ingest_gauges(GaugeBatch {
        first_seq: 1,
        status: None,
        samples: vec![GaugeSample { t_ns: 1, gauges: Gauges::Host(HostSample { rss_bytes: 0, mem_total: 24 << 30, mem_used: 6 << 30, cpu_percent: Some(3.0), self_cpu_percent: Some(1.0), cpu_count: 2 }) }],
    });
    store.finished = true;
    let screen = text(&store, &whole(&store), 200, 60);
    assert!(screen.contains("process RSS  – (the job exited)"), "{screen}");
}

#[test]
fn help_overlay_is_generated_from_the_key_table() {
    let store = with_host(session());
    let mut view = whole(&store);
    view.help = true;
    let screen = text(&store, &view, 200, 60);
    for a in LiveKey::ALL {
        assert_eq!(screen.contains(a.help()), a.offered(false), "live help and '{}'", a.help());
    }
    insta::assert_snapshot!(screen);
    // A replay's help is its own: pace and seek, no knobs.
    let mut replay = with_host(session());
    replay.title = Some("replay of run.vsrec".into());
    let screen = text(&replay, &view, 200, 60);
    for a in LiveKey::ALL {
        assert_eq!(screen.contains(a.help_for(true)), a.offered(true), "replay help and '{}'", a.help_for(true));
    }
}


fn draw(store: &Store, view: &View, theme: &Theme, w: u16, h: u16) -> Buffer {
    draw_to_buffer(w, h, |f| render_live(f, store, &RankSummary::default(), view, &KeyMap::default(), theme))
}

/// The background of the phase row under the first column where `letter` is drawn.
fn ribbon_bg(buf: &Buffer, letter: &str) -> Color {
    let y = (0..buf.area.height).find(|y| (0..buf.area.width).any(|x| buf[(x, *y)].symbol() == "F")).expect("a phase row");
    let x = (0..buf.area.width).find(|x| buf[(*x, y)].symbol() == letter).unwrap_or_else(|| panic!("no {letter} in the phase row"));
    buf[(x, y)].bg
}

#[test]
fn live_screen_colours_at_256_and_truecolor() {
    let store = with_host(session());
    for (depth, name) in [(ColorSupport::Palette256, "live_screen_colours_256"), (ColorSupport::TrueColor, "live_screen_colours_truecolor")] {
        let theme = Theme::load_at("dark", depth).unwrap();
        let buf = draw(&store, &whole(&store), &theme, 80, 24);
        let [f, b, o] = ["F", "B", "O"].map(|l| ribbon_bg(&buf, l));
        assert!(f != b && b != o && f != o, "{depth:?}: forward {f:?}, backward {b:?}, optimizer {o:?}");
        if depth == ColorSupport::Palette256 {
            for c in [f, b, o] {
                assert!(matches!(c, Color::Indexed(_)), "256 colours draw no RGB: {c:?}");
            }
        }
        insta::assert_snapshot!(name, colours(&buf));
    }
    // At 16 colours the phases colour only their row, and still differ there.
    let theme = Theme::load_at("dark", ColorSupport::Ansi16).unwrap();
    let buf = draw(&store, &whole(&store), &theme, 80, 24);
    let [f, b, o] = ["F", "B", "O"].map(|l| ribbon_bg(&buf, l));
    assert!(f != b && b != o && f != o);
    let plot_bg = buf[(30, 8)].bg;
    assert_eq!(plot_bg, theme.ui.background, "the plot itself is not shaded at 16 colours");
}

#[test]
fn the_timeline_reads_like_a_chart() {
    let store = with_host(session());
    let screen = text(&store, &whole(&store), 120, 36);
    // Round ticks, step numbers under the phase row, markers saying what they are.
    for want in ["50 MiB", "100 MiB", "150 MiB", "    step", "K1", "precision→bf16", "S1"] {
        assert!(screen.contains(want), "'{want}' missing:\n{screen}");
    }
    let axis = screen.lines().find(|l| l.contains("    step")).unwrap();
    let numbers: Vec<&str> = axis.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()).collect();
    assert_eq!(numbers, ["0", "1"], "{axis}");
    // The peak the timeline labels is the figure the side panel gives.
    let side = screen.lines().find_map(|l| l.split("peak (all)").nth(1)).unwrap().trim().trim_end_matches('│').trim();
    assert!(screen.contains(&format!("peak {side}")), "timeline peak vs side panel {side}:\n{screen}");
    // Every category keeps its legend row, empty or not.
    for c in Category::ALL {
        assert!(screen.contains(&c.as_str().replace('_', " ")[..10.min(c.as_str().len())]), "{c:?} left the legend");
    }
}

#[test]
fn a_window_without_the_session_peak_labels_its_own_and_the_time_axis_counts_seconds() {
    let store = with_host(session());
    // The first step's forward pass only: the session peak is later.
    let view = View { window: 40, right: Some(60), ..View::default() };
    let screen = text(&store, &view, 120, 36);
    assert!(screen.contains("window active peak"), "{screen}");
    assert!(screen.contains("panned (end: live)"), "{screen}");
    let view = View { time_axis: true, ..whole(&store) };
    let screen = text(&store, &view, 120, 36);
    // Events are a microsecond apart here: the title spans the run, step 1 says when it began.
    let end = store.history.get(store.history.end() - 1).unwrap().t_ns;
    let (at, _) = store.step_starts(0, store.history.end())[1];
    let began = store.history.get(at).unwrap().t_ns;
    assert!(end > 100_000 && began > 50_000 && began < end, "{began} {end}");
    assert!(screen.contains(&format!("· 0 µs–{} µs · live", end / 1000)), "time range in the title:\n{screen}");
    assert!(screen.contains(&format!("1 · {} µs", began / 1000)), "step 1 with the time it began:\n{screen}");
}

/// Keys through the app's own handler.
struct NoControls;
impl Controls for NoControls {
    fn key(&mut self, a: LiveKey, _: &mut Ranks) -> bool {
        a == LiveKey::Quit
    }
}

#[test]
fn the_selection_stays_on_its_allocation_and_enter_inspects_it() {
    let mut ranks = Ranks::with(with_host(session()), 1 << 20);
    let mut view = whole(ranks.shown());
    let themes = vec![Theme::load("dark").unwrap(), Theme::load("light").unwrap()];
    for a in [LiveKey::SelectDown, LiveKey::SelectDown] {
        assert!(!handle(a, &mut ranks, &mut view, &mut NoControls, &themes));
    }
    let chosen = view.selected.expect("a row is selected");
    let selected_line = |store: &Store, view: &View| {
        let buf = draw(store, view, &themes[0], 120, 36);
        let y = (0..36).find(|y| buf[(2, *y)].bg == themes[0].ui.selection).expect("a highlighted row");
        (0..120).map(|x| buf[(x, y)].symbol().to_string()).collect::<String>()
    };
    let before = selected_line(ranks.shown(), &view);
    assert!(before.contains("exp_avg") || before.contains("weight"), "{before}");
    // A larger allocation arrives and the rows re-sort: the same allocation stays selected.
    ranks.ingest(0, Incoming::Batch(Batch {
        first_seq: ranks.shown().history.end(),
        events: vec![MemEvent { t_ns: 1, addr: 0x10, size: 64 * MIB, stream: 0, step: 2, scope: 3, action: Act::Alloc, phase: Phase::Forward, device: 0, category: Category::Activation }],
        ..Default::default()
    }));
    assert_eq!(selected_line(ranks.shown(), &view), before);
    assert_eq!(view.selected, Some(chosen));
    handle(LiveKey::Inspect, &mut ranks, &mut view, &mut NoControls, &themes);
    let screen = text(ranks.shown(), &view, 120, 36);
    let name = before.split_whitespace().find(|w| w.contains("weight")).unwrap();
    for want in ["allocation (enter closes)", "4.00 MiB (4194304 bytes)", "address", name] {
        assert!(screen.contains(want), "'{want}' missing from the inspector:\n{screen}");
    }
    // The biggest row names what it is by its module.
    assert!(screen.contains("64.0 MiB") && screen.contains("lm_head"), "{screen}");
    // t says which theme it switched to.
    handle(LiveKey::NextTheme, &mut ranks, &mut view, &mut NoControls, &themes);
    assert_eq!(ranks.shown().log.back().unwrap().text, "theme: light · truecolor (t for the next)");
}

#[test]
fn the_event_log_keeps_every_line_and_scrolls() {
    let mut store = with_host(session());
    for i in 0..40 {
        store.ingest_report(Report::Knob(KnobChange { step: 3 + i, knob: "ctx".into(), from: "256".into(), to: format!("{}", 512 + i) }));
    }
    let mut ranks = Ranks::with(store, 1 << 20);
    let mut view = whole(ranks.shown());
    let themes = vec![Theme::load("dark").unwrap()];
    handle(LiveKey::EventLog, &mut ranks, &mut view, &mut NoControls, &themes);
    let screen = text(ranks.shown(), &view, 120, 36);
    assert!(screen.contains("K41 ctx 256 → 551 from step 42"), "the newest, tagged as its marker:\n{screen}");
    assert!(!screen.contains("K1 precision fp32 → bf16"), "{screen}");
    for _ in 0..30 {
        handle(LiveKey::SelectUp, &mut ranks, &mut view, &mut NoControls, &themes);
    }
    let screen = text(ranks.shown(), &view, 120, 36);
    assert!(screen.contains("K1 precision fp32 → bf16 from step 2"), "scrolled back to the first knob:\n{screen}");
    assert!(screen.contains("30 newer below"), "{screen}");
}

#[test]
fn out_of_memory_state() {
    let mut store = with_host(session());
    store.ingest_report(Report::Oom(OutOfMemory { step: 2, phase: Phase::Backward, message: "CUDA out of memory. Tried to allocate 20.00 GiB".into(), snapshot: None }));
    store.ingest_report(Report::Paused(true));
    let screen = text(&store, &whole(&store), 200, 60);
    assert!(screen.contains("OUT OF MEMORY"));
    assert!(screen.contains("lower ctx with ["), "tells the user what to do:\n{screen}");
    insta::assert_snapshot!(screen);
}

#[test]
fn lost_events_show_the_jobs_exact_figures_and_mark_what_the_events_draw_incomplete() {
    let mut store = session();
    let whole_screen = text(&store, &whole(&store), 160, 40);
    assert!(whole_screen.contains("capture ok") && !whole_screen.contains("incomplete"), "{whole_screen}");
    // A gap in the stream: events between were lost on their way to the screen.
    let mut gap = Batch { first_seq: 1_000_000, ..Batch::default() };
    gap.events.push(MemEvent { t_ns: 9_000_000, addr: 0xdead_0000, size: 512 * 1024, stream: 0, step: 2, scope: 0, action: Act::Alloc, phase: Phase::Other, device: 0, category: Category::Input });
    store.ingest_batch(gap);
    assert!(store.lost_events > 0);
    let (active, _, exact) = store.active_figures();
    assert_eq!((active, exact), (96 * MIB, false), "the last step's own live bytes, not the events' sum");
    let screen = text(&store, &whole(&store), 160, 40);
    assert!(screen.contains("at step end  96.0 MiB"), "{screen}");
    assert!(screen.contains("incomplete: events were lost"), "{screen}");
    assert!(screen.contains("figures at step end exact; timeline and table incomplete"), "{screen}");
}

#[test]
fn the_header_says_whose_autocast_a_bf16_step_follows() {
    let header = |autocast: Option<AutocastPolicy>, knobs: bool| {
        let mut store = session();
        let c = config(256, Precision::Bf16);
        let info = EngineInfo {
            device: "cpu".into(),
            parameters: 9_316_608,
            // A user's job declares its precision as a knob; vramscope's model as its config.
            config: (!knobs).then(|| c.clone()),
            knobs: if knobs { vec![Knob { name: "precision".into(), value: "bf16".into() }] } else { Vec::new() },
            name: "tiny".into(),
            autocast,
            ..EngineInfo::default()
        };
        store.ingest_report(Report::Started(info));
        text(&store, &whole(&store), 160, 40).lines().next().unwrap_or_default().to_string()
    };
    for knobs in [false, true] {
        assert!(header(Some(AutocastPolicy::Cuda), knobs).contains("bf16 (CUDA autocast)"), "{}", header(Some(AutocastPolicy::Cuda), knobs));
        assert!(header(Some(AutocastPolicy::Cpu), knobs).contains("bf16 (CPU autocast)"), "{}", header(Some(AutocastPolicy::Cpu), knobs));
        // A recording made before the policy was said claims neither.
        let unknown = header(None, knobs);
        assert!(unknown.contains("bf16") && !unknown.contains("autocast"), "{unknown}");
    }
}

#[test]
fn a_job_that_crashed_says_so_instead_of_finished() {
    let mut store = session();
    store.ingest_report(Report::Finished);
    assert!(text(&store, &whole(&store), 120, 36).contains("finished"));
    store.ingest_report(Report::Exited { how: "exited with code 1".into(), success: false });
    let screen = text(&store, &whole(&store), 120, 36);
    assert!(screen.contains("CRASHED (exited with code 1)") && !screen.contains("finished"), "{screen}");
    assert!(store.log.iter().any(|l| l.text == "the job exited with code 1"));
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
        pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x18 + index * 0x10)),
    };
    let batch = || GaugeBatch {
        first_seq: 0,
        status: None,
        samples: vec![GaugeSample { t_ns: 0, gauges: Gauges::Devices(vec![gpu(0, vec![ours(300 * MIB)]), gpu(1, Vec::new()), gpu(2, vec![ours(30 << 30)])]) }],
    };
    let mut store = with_gpu(session());
    if let Some(info) = &mut store.info {
        info.pci_bus_id = None;
    }
    assert_eq!(store.gauges.selected_device(), 0, "before NVML lists the process: the CUDA ordinal");
    store.ingest_gauges(batch());
    assert_eq!(store.gauges.selected_device(), 2);
    // A CPU run never moves the selection.
    let mut cpu = session();
    cpu.ingest_gauges(batch());
    assert_eq!(cpu.gauges.selected_device(), 0);

    // In a container NVML lists the host's PIDs, never the job's, and under
    // CUDA_VISIBLE_DEVICES=1 the job's cuda:0 is NVML's device 1: its PCI bus id finds it.
    let hidden = || GaugeBatch {
        first_seq: 0,
        status: None,
        samples: vec![GaugeSample { t_ns: 0, gauges: Gauges::Devices((0..3).map(|i| gpu(i, Vec::new())).collect()) }],
    };
    let mut boxed = with_gpu(session());
    let mut info = boxed.info.clone().unwrap();
    info.pci_bus_id = Some("0000:28:00.0".into());
    boxed.ingest_report(Report::Started(info));
    boxed.ingest_gauges(hidden());
    assert_eq!(boxed.gauges.selected_device(), 1);
    assert!(!boxed.log.iter().any(|l| l.text.contains("does not list")), "matched, nothing to say");
    // With neither a bus id nor the process listed, the screen says it cannot tell.
    let mut unknown = with_gpu(session());
    if let Some(info) = &mut unknown.info {
        info.pci_bus_id = None;
    }
    unknown.ingest_gauges(hidden());
    let said: Vec<&str> = unknown.log.iter().map(|l| l.text.as_str()).filter(|t| t.contains("does not list the job's process")).collect();
    assert_eq!(said.len(), 1, "{said:?}");
    unknown.ingest_gauges(hidden());
    assert_eq!(unknown.log.iter().filter(|l| l.text.contains("does not list")).count(), 1, "said once");
}

#[test]
fn a_trace_without_modules_says_so_and_long_log_lines_wrap() {
    // What a snapshot trace gives: allocations with no module names anywhere.
    let mut store = Store::new(1 << 16);
    store.title = Some("replay of t.pickle".into());
    store.ingest_batch(Batch {
        first_seq: 0,
        events: vec![MemEvent { t_ns: 0, addr: 0x10, size: 96 * MIB, stream: 0, step: 0, scope: 0, action: Act::Alloc, phase: Phase::Other, device: 0, category: Category::Unknown }],
        ..Default::default()
    });
    let long = format!("replay: {}/memory_snapshot.pickle: snapshot trace, 5392 events over 0.25 s END-OF-LINE", "/a/long/path".repeat(8));
    store.log_line(LogKind::Info, long);
    let screen = text(&store, &View { log: Some(0), ..View::default() }, 100, 30);
    assert!(screen.contains("no module recorded"), "{screen}");
    assert!(!screen.contains("outside any module"), "{screen}");
    assert!(screen.contains("END-OF-LINE"), "the end of a long line, wrapped:\n{screen}");
}
