//! torch.profiler traces open where snapshots do (issue 36): a trace this machine's torch
//! writes with `tensorboard_trace_handler`, its `export_memory_timeline` files, and (second
//! tier) a real GPU trace from 2021.

mod common;

use common::tmux::{wait_file, Session};
use serde_json::Value;

fn summary(args: &[&str], path: &std::path::Path) -> Value {
    let out = common::vramscope().args(["view", "--summary", "--json"]).args(args).arg(path).assert().success();
    serde_json::from_slice(&out.get_output().stdout).unwrap()
}

#[derive(serde::Deserialize)]
struct Stated {
    max_total_allocated: u64,
    memory_events: u64,
    /// With `--timeline`: each form's peak and bytes by category there, summed by Python.
    timeline: Option<AtPeak>,
    timeline_raw: Option<AtPeak>,
}

#[derive(serde::Deserialize)]
struct AtPeak {
    peak: u64,
    by_category: std::collections::BTreeMap<String, u64>,
}

/// tests/py/profile_trace.py into `dir`: three profiled steps of a small MLP on CPU (`args`
/// change that).
fn make_trace_with(dir: &std::path::Path, args: &[&str]) -> Stated {
    let out = std::process::Command::new(common::python()).arg(common::repo_root().join("tests/py/profile_trace.py")).arg(dir).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(out.stdout.trim_ascii_end().rsplit(|b| *b == b'\n').next().unwrap()).unwrap()
}

fn make_trace(dir: &std::path::Path) -> Stated {
    make_trace_with(dir, &[])
}

#[test]
fn a_trace_written_by_tensorboard_trace_handler_opens_as_its_memory() {
    let dir = tempfile::tempdir().unwrap();
    let stated = make_trace(dir.path());
    let s = summary(&[], dir.path());
    assert_eq!(s["device_name"], "host", "CPU memory is the host's");
    assert_eq!(s["peak_active_bytes"], stated.max_total_allocated, "the peak is the trace's own Total Allocated");
    assert_eq!(s["events"], stated.memory_events);
    assert_eq!(s["profiled"]["steps"], serde_json::json!([2, 3, 4]));
    assert_eq!(s["profiled"]["relative_to_window_start"], false);
    let marks: Vec<String> = s["annotations"].as_array().unwrap().iter().filter(|a| a["stage"] == "START").map(|a| a["name"].as_str().unwrap().to_string()).collect();
    for step in 2..=4 {
        for phase in ["forward", "backward", "optimizer", "zero_grad"] {
            assert!(marks.contains(&format!("{phase} (step {step})")), "{phase} of step {step}: {marks:?}");
        }
    }
    // The allocations name the operators and the Python that made them.
    let largest = s["largest"].as_array().unwrap();
    assert!(largest.iter().any(|a| a["top_frame"].as_str().is_some_and(|f| f.contains(".py:"))), "{largest:?}");
    // The per-operator table: the two Linear layers' forward matmuls, three steps of them:
    // outputs [64, 512] and [64, 10] in fp32.
    let ops = s["operators"].as_array().unwrap();
    let addmm = ops.iter().find(|r| r["name"] == "aten::addmm").expect("aten::addmm has a row");
    assert_eq!(addmm["self_allocations"], 6);
    assert_eq!(addmm["self_allocated_bytes"], 3 * (64 * 512 + 64 * 10) * 4);
    let held: u64 = ops.iter().map(|r| r["at_peak_bytes"].as_u64().unwrap()).sum();
    assert!(held <= stated.max_total_allocated, "what operators hold at the peak is part of it: {held}");
    let text = common::vramscope().args(["view", "--summary"]).arg(dir.path()).assert().success();
    let text = String::from_utf8_lossy(&text.get_output().stdout).into_owned();
    assert!(text.contains("torch.profiler trace: the profiled window only (3 steps, 2 to 4)"), "{text}");
    assert!(!text.contains("warning"), "{text}");
    assert!(text.contains("operators, by what they keep"), "{text}");
    // diff and export take a trace as they take a snapshot.
    let diff = common::vramscope().arg("diff").arg(dir.path()).arg(dir.path()).arg("--json").assert().success();
    let diff: Value = serde_json::from_slice(&diff.get_output().stdout).unwrap();
    assert_eq!(diff["peak_active_bytes"]["a"], stated.max_total_allocated);
    assert_eq!(diff["peak_reserved_bytes"]["a"], 0, "the trace's Total Reserved, 0 on CPU");
    let png = dir.path().join("timeline.png");
    common::vramscope().arg("export").arg(dir.path()).arg("-o").arg(&png).assert().success();
    assert!(std::fs::metadata(&png).unwrap().len() > 1000);
    // replay plays it (its CPU memory as the host device).
    let replay = common::vramscope().args(["replay", "--headless"]).arg(dir.path()).assert().success();
    let said = String::from_utf8_lossy(&replay.get_output().stderr).into_owned();
    assert!(said.contains("snapshot trace") && said.contains("events over"), "{said}");
}

#[test]
fn what_is_not_a_usable_trace_is_said_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let no_memory = dir.path().join("cpu_only.json");
    std::fs::write(&no_memory, r#"{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": 1, "ts": 1, "dur": 2}]}"#).unwrap();
    let cut = dir.path().join("cut.json");
    std::fs::write(&cut, r#"{"traceEvents": [{"ph": "X", "na"#).unwrap();
    let odd = dir.path().join("odd.json");
    std::fs::write(&odd, r#"{"traceEvents": [1, 2]}"#).unwrap();
    let short_row = dir.path().join("timeline.json");
    std::fs::write(&short_row, "[[1, 2], [[0, 64], [0, 0]]]").unwrap();
    let cases = [
        (no_memory, "the trace has no memory events: profile with `torch.profiler.profile(profile_memory=True)`"),
        (cut, "the trace ends early"),
        (odd, "not a torch.profiler trace: invalid type: integer `1`, expected a trace event (a JSON object)"),
        (short_row, "a memory timeline row has 2 numbers, not 9 (a zero, then torch.profiler's 8 categories)"),
    ];
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let cases = cases.map(|(p, w)| (vec![p.into_os_string()], w.to_string())).into_iter().chain([
        (vec![empty.clone().into_os_string()], "no torch.profiler traces in the directory".to_string()),
        (vec![empty.into_os_string(), "--rank".into(), "1".into()], "no torch.profiler traces in the directory".to_string()),
        (vec![dir.path().join("odd.json").into_os_string(), "--window".into(), "1".into()], "--rank and --window pick a trace in a directory".to_string()),
    ]);
    for (args, want) in cases {
        let out = common::vramscope().args(["view", "--summary"]).args(&args).assert().failure();
        let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(&want), "{err}");
    }
}

/// `export_memory_timeline`'s two forms open with torch.profiler's categories: the peak and
/// the bytes of each category there are what Python sums from the same file, and the screen
/// says what the file is.
#[test]
fn a_memory_timeline_opens_with_its_categories() {
    let dir = tempfile::tempdir().unwrap();
    let stated = make_trace_with(&dir.path().join("log"), &["--timeline", dir.path().to_str().unwrap()]);
    for (file, truth, form) in [("timeline.json", &stated.timeline, "memory_timeline"), ("timeline.raw.json.gz", &stated.timeline_raw, "memory_timeline_raw")] {
        let truth = truth.as_ref().unwrap();
        let s = summary(&[], &dir.path().join(file));
        assert_eq!(s["profiled"]["form"], form, "{file}");
        assert_eq!(s["device_name"], "exported device", "the file names none");
        assert_eq!(s["peak_active_bytes"], truth.peak, "{file}");
        assert_eq!(s["breakdown"]["by"], "category", "{file}");
        let at_peak: std::collections::BTreeMap<String, u64> =
            s["breakdown"]["groups"].as_array().unwrap().iter().map(|g| (g["name"].as_str().unwrap().to_string(), g["bytes"].as_u64().unwrap())).collect();
        assert_eq!(at_peak, truth.by_category, "{file}");
    }
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let cmd = format!("{bin} view {}/timeline.raw.json.gz; echo $? > {}/exit", dir.path().display(), dir.path().display());
    let s = Session::start("vramscope-e2e-timeline", &cmd);
    let screen = s.wait_for("the timeline", 30, |sc| sc.contains("active memory timeline") && sc.contains("peak active"));
    assert!(screen.contains("memory timeline, ") && screen.contains(" tensor events"), "{screen}");
    s.keys("Tab");
    s.keys("Tab");
    s.wait_for("no operators said", 10, |sc| sc.contains("keeps no operators"));
    s.keys("q");
    assert_eq!(wait_file(&dir.path().join("exit"), 20).trim(), "0", "exit code");
    s.assert_terminal_restored();
}

/// Each device's memory over the window, computed independently on the JSON: the running sum
/// of its `[memory]` events' bytes, by time, and its highest value.
const RUNNING_SUMS: &str = r#"
import gzip, json, sys
events = json.load(gzip.open(sys.argv[1]))["traceEvents"]
peaks = {}
for kind, ident in {(e["args"]["Device Type"], e["args"]["Device Id"]) for e in events if e.get("name") == "[memory]"}:
    run = peak = 0
    for e in sorted((e for e in events if e.get("name") == "[memory]" and (e["args"]["Device Type"], e["args"]["Device Id"]) == (kind, ident)), key=lambda e: e["ts"]):
        run += e["args"]["Bytes"]
        peak = max(peak, run)
    peaks["host" if kind == 0 else f"device {ident}"] = peak
print(json.dumps(peaks))
"#;

/// The 2021 format: gzipped, no addresses, no totals, CPU and CUDA events mixed.
#[test]
fn a_real_gpu_trace_from_2021_opens_and_each_device_peaks_at_its_running_sum() {
    let Some(path) = vramscope_core::fixtures::real_trace_for_test(&common::repo_root()) else { return };
    let truth: std::collections::BTreeMap<String, u64> = common::python_json(RUNNING_SUMS, &path);
    assert_eq!(truth.len(), 2, "{truth:?}");
    for device in ["0", "1"] {
        let s = summary(&["--device", device], &path);
        let name = s["device_name"].as_str().unwrap().to_string();
        assert_eq!(s["peak_active_bytes"], truth[&name], "{name}");
        assert_eq!(s["profiled"]["relative_to_window_start"], true);
        assert_eq!(s["profiled"]["steps"], serde_json::json!([5, 6, 7, 8, 9, 10]));
    }
}

/// The screen draws the trace's timeline in a real terminal, says what it covers, lists its
/// operators, and quits cleanly.
#[test]
fn the_viewer_draws_a_traces_timeline_in_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    make_trace(&dir.path().join("log"));
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let cmd = format!("{bin} view {}/log; echo $? > {}/exit", dir.path().display(), dir.path().display());
    let s = Session::start("vramscope-e2e-trace", &cmd);
    let screen = s.wait_for("the timeline", 30, |sc| sc.contains("active memory timeline") && sc.contains("peak active"));
    assert!(screen.contains("host of 1") && screen.contains("torch.profiler trace, profiled window only (3 steps)"), "{screen}");
    assert!(screen.contains("peak reserved 0 B"), "the trace's Total Reserved on CPU: {screen}");
    assert!(!screen.contains("warning"), "a trace has no segments to contradict: {screen}");
    // The third view of a trace is its operators.
    s.keys("Tab");
    s.keys("Tab");
    let ops = s.wait_for("the operators", 10, |sc| sc.contains("operators · ") && sc.contains("aten::addmm"));
    assert!(ops.contains("self alloc") && ops.contains("at peak"), "{ops}");
    s.keys("q");
    assert_eq!(wait_file(&dir.path().join("exit"), 20).trim(), "0", "exit code");
    s.assert_terminal_restored();
}

/// A torchrun job's directory: one file per rank and window; `--rank` and `--window` pick,
/// the summary says which file it read, and on the screen `R` and `W` step through them.
#[test]
fn the_ranks_and_windows_of_a_torchrun_job_are_picked_by_flag() {
    let dir = tempfile::tempdir().unwrap();
    let torchrun = common::python().with_file_name("torchrun");
    let out = std::process::Command::new(torchrun)
        .args(["--nproc-per-node", "2", "--standalone"])
        .arg(common::repo_root().join("tests/py/profile_ddp.py"))
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for (rank, window, step) in [(0, 0, 1), (0, 1, 3), (1, 0, 1), (1, 1, 3)] {
        let s = summary(&["--rank", &rank.to_string(), "--window", &window.to_string()], dir.path());
        let picked = s["profiled"]["picked"].as_str().unwrap();
        assert!(picked.starts_with(&format!("worker {} of 2 (rank {rank}), window {} of 2: ", rank + 1, window + 1)), "{picked}");
        assert_eq!(s["profiled"]["steps"], serde_json::json!([step]));
    }
    let out = common::vramscope().args(["view", "--summary", "--rank", "2"]).arg(dir.path()).assert().failure();
    assert!(String::from_utf8_lossy(&out.get_output().stderr).contains("no rank 2 here: the directory has 2 workers (rank 0, rank 1)"));
    // On the screen, W steps through the worker's windows and R through the workers.
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let exit = tempfile::tempdir().unwrap();
    let s = Session::start("vramscope-e2e-ranks", &format!("{bin} view {}; echo $? > {}/exit", dir.path().display(), exit.path().display()));
    s.wait_for("rank 0's first window", 30, |sc| sc.contains("worker 1 of 2 (rank 0), window 1 of 2") && sc.contains("active memory timeline"));
    s.keys("W");
    s.wait_for("its second window", 30, |sc| sc.contains("worker 1 of 2 (rank 0), window 2 of 2") && sc.contains("active memory timeline"));
    s.keys("R");
    s.wait_for("rank 1", 30, |sc| sc.contains("worker 2 of 2 (rank 1), window 1 of 2") && sc.contains("active memory timeline"));
    s.keys("q");
    assert_eq!(wait_file(&exit.path().join("exit"), 20).trim(), "0", "exit code");
    s.assert_terminal_restored();
}

/// The growth check across profiled steps: a loop that keeps every step's output grows,
/// the same loop without it is steady.
#[test]
fn the_growth_check_runs_across_profiled_steps() {
    for (leak, grows) in [(false, false), (true, true)] {
        let dir = tempfile::tempdir().unwrap();
        make_trace_with(dir.path(), if leak { &["--active", "6", "--leak"] } else { &["--active", "6"] });
        let g = &summary(&[], dir.path())["growth"];
        assert_eq!(g["steps_checked"], 5, "{g}");
        assert_eq!(g["healthy"], !grows, "{g}");
        let lines = g["lines"].to_string();
        assert_eq!(lines.contains("memory keeps growing: phase forward"), grows, "{lines}");
    }
}
