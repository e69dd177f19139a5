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

/// Issue 34, item 7: each bad output or setting is one line that names it, said before any
/// training (a run with an unwritable --snapshot-dir trained fully, then failed).
#[test]
fn outputs_and_settings_that_cannot_work_are_said_once_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("s.pickle");
    vramscope().args(["run", "--headless", "--steps", "1", "--ctx", "16", "--batch", "1", "--snapshot-at", "0", "--snapshot-dir"]).arg(dir.path()).assert().success();
    std::fs::rename(std::fs::read_dir(dir.path()).unwrap().next().unwrap().unwrap().path(), &snap).unwrap();
    let blocker = dir.path().join("a-file");
    std::fs::write(&blocker, "").unwrap();
    let s = snap.to_str().unwrap();
    // (arguments, environment, the one line said)
    type Case<'a> = (Vec<String>, Vec<(&'a str, &'a str)>, String);
    let cases: Vec<Case> = vec![
        (
            vec!["run", "--headless", "--steps", "1", "--snapshot-dir", &format!("{}/snaps", blocker.display())].into_iter().map(String::from).collect(),
            vec![],
            format!("vramscope: --snapshot-dir {0}/snaps: cannot create directory {0}/snaps: Not a directory (os error 20)", blocker.display()),
        ),
        (
            vec!["run", "--headless", "--steps", "1", "--record", &format!("{}/x.vsrec", blocker.display())].into_iter().map(String::from).collect(),
            vec![],
            format!("vramscope: {}/x.vsrec: Not a directory (os error 20)", blocker.display()),
        ),
        (
            vec!["export", s, "-o", &format!("{}/x.svg", blocker.display())].into_iter().map(String::from).collect(),
            vec![],
            format!("vramscope: cannot create directory {}: File exists (os error 17)", blocker.display()),
        ),
        (
            vec!["run", "--headless", "--steps", "1"].into_iter().map(String::from).collect(),
            vec![("PYTORCH_CUDA_ALLOC_CONF", "bogus:1")],
            "vramscope: PYTORCH_CUDA_ALLOC_CONF: unknown option `bogus`".into(),
        ),
        (
            vec!["run", "--headless", "--steps", "1", "--alloc-conf", "bogus:1"].into_iter().map(String::from).collect(),
            vec![],
            "vramscope: --alloc-conf: unknown option `bogus`".into(),
        ),
    ];
    for (args, env, want) in cases {
        let r = vramscope().args(&args).envs(env).output().unwrap();
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim(), want, "{args:?}");
        assert!(r.stdout.is_empty(), "{args:?} ran: {}", String::from_utf8_lossy(&r.stdout));
    }
    // A directory the check had to make is not left behind.
    let fresh = dir.path().join("new/snaps");
    vramscope().args(["run", "--headless", "--steps", "1", "--ctx", "16", "--batch", "1", "--snapshot-dir"]).arg(&fresh).assert().success();
    assert!(!dir.path().join("new").exists());
    // An image too large to draw is a bad flag, not an abort.
    let r = vramscope().args(["export", s, "--width", "100000", "--height", "100000", "-o"]).arg(dir.path().join("big.png")).output().unwrap();
    assert_eq!(r.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.stderr).contains("100000 is not in 64..=8192"));
    // An unwritable file is named as the file, not as "snapshot".
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::os::unix::fs::PermissionsExt::from_mode(0o500)).unwrap();
    if std::fs::write(ro.join("probe"), "").is_err() {
        let r = vramscope().args(["export", s, "-o"]).arg(ro.join("x.svg")).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&r.stderr).trim(), format!("vramscope: cannot write {}/x.svg: Permission denied (os error 13)", ro.display()));
    }
}
