//! torch.profiler traces open where snapshots do (issue 36): a trace this machine's torch
//! writes with `tensorboard_trace_handler`, and (second tier) a real GPU trace from 2021.

mod common;

use serde_json::Value;

fn summary(args: &[&str], path: &std::path::Path) -> Value {
    let out = common::vramscope().args(["view", "--summary", "--json"]).args(args).arg(path).assert().success();
    serde_json::from_slice(&out.get_output().stdout).unwrap()
}

#[derive(serde::Deserialize)]
struct Stated {
    max_total_allocated: u64,
    memory_events: u64,
}

#[test]
fn a_trace_written_by_tensorboard_trace_handler_opens_as_its_memory() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(common::python()).arg(common::repo_root().join("tests/py/profile_trace.py")).arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stated: Stated = serde_json::from_slice(out.stdout.trim_ascii_end().rsplit(|b| *b == b'\n').next().unwrap()).unwrap();
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
    let text = common::vramscope().args(["view", "--summary"]).arg(dir.path()).assert().success();
    let text = String::from_utf8_lossy(&text.get_output().stdout).into_owned();
    assert!(text.contains("torch.profiler trace: the profiled window only (3 steps, 2 to 4)"), "{text}");
    assert!(!text.contains("warning"), "{text}");
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
    let cases = [(no_memory, "the trace has no memory events: profile with `torch.profiler.profile(profile_memory=True)`"), (cut, "the trace ends early"), (odd, "not a torch.profiler trace: invalid type: integer `1`, expected a trace event (a JSON object)")];
    for (path, want) in cases {
        let out = common::vramscope().args(["view", "--summary"]).arg(&path).assert().failure();
        let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(want), "{err}");
    }
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
