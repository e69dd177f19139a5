//! Snapshots of the watch screen, fed recorded NVML readings through the same conversion
//! and history the live screen uses.

use std::time::Duration;

use ratatui::backend::TestBackend;
use ratatui::Terminal;
use vramscope::theme::Theme;
use vramscope::screens::watch::render::render_watch;
use vramscope::screens::watch::state::{ProcessSort, WatchState};
use vramscope_core::source::gauges::{
    GaugeBatch, GaugeError, GaugeHistory, GaugeReader, GaugeSample, Gauges, HostSample, NvmlReader,
    RawDevice, RawProcess, RecordedQuery, SourceKind, SourceStatus,
};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const SELF_PID: u32 = 4242;
const SAMPLES: u64 = 120;
const INTERVAL_NS: u64 = 250_000_000;

fn process(pid: u32, mib: u64, name: &str) -> RawProcess {
    RawProcess {
        pid,
        used_bytes: Some(mib * MIB),
        name: Some(name.into()),
    }
}

/// Device `i` at sample `k`: a training-like sawtooth of memory (activations built up in
/// forward, released in backward) over a fixed base, with load that follows it.
fn reading(i: u32, k: u64) -> RawDevice {
    let phase = k % 12;
    let act_mib = if phase < 6 {
        phase * 1800
    } else {
        (12 - phase) * 1800
    };
    let base_mib = 18_000 + u64::from(i) * 3_000;
    let used = (base_mib + act_mib) * MIB;
    let util = ((k * 7 + u64::from(i) * 13) % 60 + 40) as u32;
    let mut procs = vec![process(1000 + i, base_mib - 600 + act_mib, "python")];
    if i == 0 {
        procs.push(process(SELF_PID, 600, "vramscope"));
    }
    if i == 3 {
        procs.push(process(777, 2_048, "jupyter-kernel"));
    }
    RawDevice {
        utilization: Ok((util, util / 2)),
        temp_c: Ok(45 + (util / 4) + i),
        power_mw: Ok(150_000 + util * 5_000),
        power_limit_mw: Ok(700_000),
        sm_clock_mhz: Ok(1755 + (util % 3) * 100),
        mem_clock_mhz: Ok(2619),
        compute_processes: Ok(procs),
        graphics_processes: Ok(vec![]),
        process_sm_util: Ok(vec![(1000 + i, util), (SELF_PID, 1)]),
        ..RawDevice::new(i, "NVIDIA H100 80GB HBM3", used, 80 * GIB - 500 * MIB)
    }
}

fn nvml_state(gpus: u32, selected: u32) -> WatchState {
    let frames = (0..SAMPLES)
        .map(|k| Ok((0..gpus).map(|i| reading(i, k)).collect()))
        .collect();
    let mut reader = NvmlReader::new(RecordedQuery::new(frames), vramscope_core::source::gauges::Watched::of(&[SELF_PID]));
    let samples = (0..SAMPLES)
        .map(|k| GaugeSample {
            t_ns: k * INTERVAL_NS,
            gauges: reader.sample().unwrap(),
        })
        .collect();
    let mut history = GaugeHistory::new(2400, selected);
    history.ingest(GaugeBatch {
        first_seq: 0,
        status: Some(SourceStatus {
            kind: SourceKind::Nvml,
            reason: None,
        }),
        samples,
    });
    WatchState::new(history, Duration::from_millis(250))
}

fn draw(state: &WatchState, width: u16, height: u16) -> Terminal<TestBackend> {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal
        .draw(|f| render_watch(f, state, &Theme::default()))
        .unwrap();
    terminal
}

fn screen_text(t: &Terminal<TestBackend>) -> String {
    t.backend().to_string()
}

#[test]
fn one_gpu() {
    let state = nvml_state(1, 0);
    insta::assert_snapshot!(draw(&state, 100, 30).backend());
}

#[test]
fn eight_gpus_sorted_by_pid_with_third_selected() {
    let mut state = nvml_state(8, 0);
    state.move_selection(3);
    state.sort = ProcessSort::Memory.next().next();
    assert_eq!(state.history.selected_device(), 3);
    insta::assert_snapshot!(draw(&state, 100, 30).backend());
}

#[test]
fn selection_and_sort_change_what_is_drawn() {
    let mut state = nvml_state(8, 0);
    assert!(state.can_sort() && state.can_select());
    state.help = true;
    let help = screen_text(&draw(&state, 100, 30));
    assert!(help.contains("sort processes: memory, util, pid") && help.contains("select a GPU"), "{help}");
    state.help = false;
    let before = screen_text(&draw(&state, 100, 30));
    assert!(before.contains("GPU 0 · NVIDIA H100"));
    state.move_selection(-1);
    assert_eq!(
        state.history.selected_device(),
        0,
        "selection stops at the top"
    );
    state.move_selection(100);
    assert_eq!(state.history.selected_device(), 7, "and at the bottom");
    let after = screen_text(&draw(&state, 100, 30));
    assert!(after.contains("GPU 7 · NVIDIA H100"));
    // By memory, the biggest process (GPU 7's trainer) comes first.
    let first_row = |s: &str| {
        s.lines()
            .skip_while(|l| !l.contains("GPU      PID"))
            .nth(1)
            .unwrap()
            .to_string()
    };
    assert!(first_row(&after).contains("1007"), "{after}");
    state.sort = ProcessSort::Pid;
    assert!(first_row(&screen_text(&draw(&state, 100, 30))).contains(" 777 "));
}

#[test]
fn host_view_says_why_nvml_is_not_used() {
    let reason = GaugeError::NvmlUnavailable(
        "libnvidia-ml.so.1: cannot open shared object file: No such file or directory".into(),
    )
    .to_string();
    let samples = (0..SAMPLES)
        .map(|k| GaugeSample {
            t_ns: k * INTERVAL_NS,
            gauges: Gauges::Host(HostSample {
                rss_bytes: (300 + k * 4) * MIB,
                mem_total: 16 * GIB,
                mem_used: 6 * GIB + (k % 20) * 100 * MIB,
                cpu_percent: Some(((k * 17) % 90) as f32 + 5.5),
                self_cpu_percent: Some(0.4),
                cpu_count: 2,
            }),
        })
        .collect();
    let mut history = GaugeHistory::new(2400, 0);
    history.ingest(GaugeBatch {
        first_seq: 0,
        status: Some(SourceStatus {
            kind: SourceKind::Host,
            reason: Some(reason),
        }),
        samples,
    });
    let mut state = WatchState::new(history, Duration::from_millis(250));
    let terminal = draw(&state, 100, 30);
    let text = screen_text(&terminal);
    assert_eq!(
        text.matches("libnvidia-ml.so.1").count(),
        1,
        "the reason is shown once"
    );
    // Nothing to sort or select without GPUs: only the keys that work are offered.
    assert!(!text.contains("sort") && !text.contains("select"), "{text}");
    assert!(text.contains("? help"), "{text}");
    // Each graph's label and value sit on their own line, above its data: the line
    // above a label is the previous graph's spacer, never its bars.
    let lines: Vec<&str> = text.lines().skip_while(|l| !l.contains("last 120 samples")).collect();
    for label in ["│ cpu ", "│ rss "] {
        let i = lines.iter().position(|l| l.contains(label)).unwrap_or_else(|| panic!("{label} missing:\n{text}"));
        assert!(!lines[i].contains('█') && !lines[i - 1].contains('█'), "data beside or just above '{label}':\n{text}");
    }
    insta::assert_snapshot!(terminal.backend());
    state.help = true;
    let help = screen_text(&draw(&state, 100, 30));
    assert!(help.contains("keys (? closes)") && help.contains("quit") && !help.contains("sort processes"), "{help}");
}

#[test]
fn too_small_terminal_gets_a_message() {
    let state = nvml_state(1, 0);
    let text = screen_text(&draw(&state, 59, 15));
    assert!(text.contains("Terminal too small: 59x15"), "{text}");
    let text = screen_text(&draw(&state, 60, 15));
    assert!(
        !text.contains("too small") && text.contains("vramscope watch"),
        "{text}"
    );
}

#[test]
fn before_the_first_sample_the_screen_waits() {
    let state = WatchState::new(GaugeHistory::new(10, 0), Duration::from_millis(250));
    assert!(screen_text(&draw(&state, 80, 20)).contains("Waiting for the first sample"));
}

/// Issue 34: `watch` at the sizes users have, one GPU and eight: no cell cut mid-number.
#[test]
fn watch_reads_at_80x24_and_120x36() {
    for (gpus, name) in [(1, "one_gpu"), (8, "eight_gpus")] {
        for (w, h) in [(80u16, 24u16), (120, 36)] {
            let text = screen_text(&draw(&nvml_state(gpus, 0), w, h));
            assert!(text.contains("vramscope watch") && !text.contains("too small"), "{name} at {w}×{h}:\n{text}");
            for l in text.lines() {
                assert!(!l.contains("…") || !l.chars().rev().nth(1).is_some_and(|c| c.is_ascii_digit()), "{name} at {w}×{h}: a number cut: {l}");
            }
            insta::assert_snapshot!(format!("watch_{name}_{w}x{h}"), text);
        }
    }
}
