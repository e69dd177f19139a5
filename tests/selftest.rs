//! `vramscope selftest` end to end on this CPU-only machine: the CPU checks pass, the CUDA
//! checks are skipped with the reason, an injected capture fault fails the matching check
//! with its first mismatch named, and bad flags are one-line errors.

mod common;

use common::vramscope;
use serde_json::Value;

fn checks(v: &Value) -> Vec<(String, String, String)> {
    v["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| (c["name"].as_str().unwrap().to_string(), c["status"].as_str().unwrap().to_string(), c["reason"].as_str().unwrap().to_string()))
        .collect()
}

#[test]
fn selftest_passes_on_cpu_and_skips_cuda_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("selftest.json");
    let out = vramscope().args(["selftest", "--json", "--report"]).arg(&report).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "stdout: {stdout}\nstderr: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(&stdout).expect("--json prints JSON");
    let cs = checks(&v);
    let names: Vec<&str> = cs.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "allocator.rules",
            "cpu.capture_accounting",
            "cpu.snapshot_peaks",
            "cpu.oom",
            "cuda.trace_matches_pytorch",
            "cuda.segments_blocks",
            "cuda.peaks",
            "cuda.nvml_used",
            "cuda.oom"
        ]
    );
    for (name, status, reason) in &cs {
        if name.starts_with("cuda.") {
            assert_eq!(status, "skipped", "{name}: {reason}");
            assert!(reason.starts_with("no CUDA here: torch.cuda.is_available() is False"), "{name}: {reason}");
        } else {
            assert_eq!(status, "pass", "{name}: {reason}");
        }
    }
    assert!(cs[1].2.contains(" allocations and ") && cs[1].2.contains(" live ("), "{}", cs[1].2);
    assert!(cs[3].2.starts_with("70368744177664 B at step 1 failed, was caught and snapshotted"), "{}", cs[3].2);
    assert_eq!(v["first_mismatch"], Value::Null);
    assert!(v["versions"]["torch"].as_str().unwrap().starts_with("2.13"), "{}", v["versions"]);
    assert_eq!(v["versions"]["vramscope"], env!("CARGO_PKG_VERSION"));
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(written, v, "the report holds what --json printed");
}

#[test]
fn an_injected_fault_fails_the_capture_check_with_the_mismatch_named() {
    for (fault, says) in [("drop-free", "the shim recorded free of alloc #"), ("alloc-size", "the shim recorded alloc of ")] {
        let out = vramscope().args(["selftest"]).env("VRAMSCOPE_SELFTEST_FAULT", fault).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{fault}: {stdout}");
        let line = stdout.lines().find(|l| l.contains("cpu.capture_accounting")).unwrap();
        assert!(line.starts_with("FAIL") && line.contains(says), "{fault}: {line}");
        assert!(stdout.lines().any(|l| l.starts_with("pass") && l.contains("allocator.rules")), "{stdout}");
        let first = stdout.lines().find(|l| l.starts_with("first mismatch: ")).unwrap();
        assert!(first.starts_with("first mismatch: cpu.capture_accounting: ") && first.contains(&format!("[fault injected: {fault}:")), "{first}");
    }
}

#[test]
fn bad_flags_and_an_unwritable_report_are_one_line_errors() {
    let out = vramscope().args(["selftest", "--report", "/nonexistent-dir/selftest.json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("vramscope: --report /nonexistent-dir/selftest.json: cannot write in /nonexistent-dir"), "{err}");
    let out = vramscope().args(["selftest", "--device", "gpu"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: invalid value 'gpu' for '--device <DEVICE>'"));
}
