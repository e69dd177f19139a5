//! The `vramscope` command as a user runs it.

mod common;

use common::vramscope;

use predicates::prelude::*;

#[test]
fn headless_run_prints_one_line_per_step() {
    let out = vramscope()
        .args(["run", "--headless", "--model", "tiny", "--steps", "3", "--ctx", "32", "--batch", "2"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    let steps: Vec<&str> = text.lines().filter(|l| l.starts_with("step")).collect();
    assert_eq!(steps.len(), 3, "{text}");
    for l in steps {
        for want in ["train", "fp32", "ctx 32", "batch 2", "peak", "forward", "backward", "optimizer", "reserved", "tok/s"] {
            assert!(l.contains(want), "'{want}' missing from: {l}");
        }
    }
    assert!(text.contains("training on CPU"), "says why the CPU is used: {text}");
}

#[test]
fn headless_json_has_the_documented_fields() {
    let out = vramscope()
        .args(["run", "--headless", "--json", "--steps", "2", "--ctx", "32", "--batch", "2", "--mode", "forward", "--precision", "bf16"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let lines: Vec<serde_json::Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect();
    assert_eq!(lines.len(), 2);
    for (i, v) in lines.iter().enumerate() {
        assert_eq!(v["step"], i as u64);
        assert_eq!(v["mode"], "forward");
        assert_eq!(v["precision"], "bf16");
        assert_eq!(v["ctx"], 32);
        assert_eq!(v["batch"], 2);
        for k in ["peak_allocated_bytes", "reserved_bytes", "step_time_s", "tokens_per_s", "dropped_events"] {
            assert!(v[k].is_number(), "{k} in {v}");
        }
        assert!(v["peak_allocated_bytes"].as_u64().unwrap() > 0);
        assert!(v["phase_peak_bytes"]["forward"].as_u64().unwrap() > 0);
        assert!(v["phase_peak_bytes"].get("backward").is_none(), "forward-only has no backward");
    }
}

#[test]
fn bad_flags_name_the_flag_and_the_allowed_values() {
    let cases: [(&[&str], &[&str]); 6] = [
        (&["--model", "huge"], &["--model", "tiny, small, medium, large, xl, 2.7B, 10B"]),
        (&["--ctx", "0"], &["--ctx", "between 1 and"]),
        (&["--batch", "0"], &["--batch", "between 1 and"]),
        (&["--precision", "fp8"], &["--precision", "fp32, bf16, fp16"]),
        (&["--device", "tpu"], &["--device", "auto, cpu, cuda, cuda:N"]),
        (&["--ctx", "many"], &["--ctx", "whole number"]),
    ];
    for (args, wants) in cases {
        let mut cmd = vramscope();
        cmd.args(["run", "--headless"]).args(args);
        let mut assert = cmd.assert().failure().code(2);
        for w in wants {
            assert = assert.stderr(predicate::str::contains(*w));
        }
    }
}

#[test]
fn asking_for_cuda_without_a_gpu_is_a_clear_error() {
    if std::path::Path::new("/dev/nvidia1").exists() {
        return; // this machine has a second GPU: the flag is valid here
    }
    vramscope()
        .args(["run", "--headless", "--device", "cuda:1", "--steps", "1"])
        .assert()
        .failure()
        .code(2)
        .stderr(predicate::str::contains("--device cuda:1: no CUDA device"));
}

#[test]
fn snapshots_at_chosen_steps_open_in_pytorchs_tools() {
    let dir = tempfile::tempdir().unwrap();
    vramscope()
        .args(["run", "--headless", "--steps", "2", "--ctx", "32", "--batch", "2", "--snapshot-at", "0,1", "--snapshot-dir"])
        .arg(dir.path())
        .assert()
        .success()
        .stdout(predicate::str::contains("snapshot of step 1 saved"));
    let mut files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let names: Vec<String> = files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["tiny_ctx32_fp32_train_naive_reference_step0.pickle", "tiny_ctx32_fp32_train_naive_reference_step1.pickle"]);
    for f in &files {
        let snap = vramscope_core::snapshot::read_snapshot_file(f).expect("our reader opens it");
        assert!(!snap.segments.is_empty() && snap.trace_entry_count() > 100);
        assert!(snap.external_annotations.iter().any(|a| a.name.starts_with("backward")));
        // PyTorch's own tools, run from a neutral directory.
        for tool in ["stats", "trace"] {
            let out = std::process::Command::new(common::python())
                .current_dir(dir.path())
                .args(["-m", "torch.cuda._memory_viz", tool])
                .arg(f)
                .output()
                .expect("venv python runs");
            assert!(out.status.success(), "_memory_viz {tool}: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}
