//! Several snapshots in one view (issue 38): each rank's, as a torchtitan-style job writes
//! them. `--summary` tables them with the skew between the highest peak and the lowest; on
//! the screen the header has every file's peak and the skew, and `R` steps through them.
//! `report` writes the write-up. Made here: the training run at two batch sizes.

mod common;
// Shared with the viewer's tests, which use all of it.
#[allow(dead_code)]
#[path = "common/training_snapshot.rs"]
mod training_snapshot;

use common::tmux::{wait_file, Session};
use serde_json::Value;
use training_snapshot::TrainingRun;

/// rank0 at batch 8 and rank1 at batch 16 (more activations, a higher peak) in a directory.
fn ranks(dir: &std::path::Path) {
    for (rank, batch) in [(0, 8), (1, 16)] {
        training_snapshot::write(TrainingRun { batch, ..TrainingRun::default() }, &dir.join(format!("rank{rank}_memory_snapshot.pickle")));
    }
}

#[test]
fn a_directory_of_ranks_is_tabled_with_its_skew() {
    let dir = tempfile::tempdir().unwrap();
    ranks(dir.path());
    let one = |name: &str| -> Value {
        let out = common::vramscope().args(["view", "--summary", "--json"]).arg(dir.path().join(name)).assert().success();
        serde_json::from_slice(&out.get_output().stdout).unwrap()
    };
    let (r0, r1) = (one("rank0_memory_snapshot.pickle")["peak_active_bytes"].as_u64().unwrap(), one("rank1_memory_snapshot.pickle")["peak_active_bytes"].as_u64().unwrap());
    assert!(r1 > r0, "the larger batch peaks higher: {r1} vs {r0}");
    let out = common::vramscope().args(["view", "--summary", "--json"]).arg(dir.path()).assert().success();
    let v: Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    let peaks: Vec<u64> = v["files"].as_array().unwrap().iter().map(|r| r["peak_active_bytes"].as_u64().unwrap()).collect();
    assert_eq!(peaks, [r0, r1], "one row per file, in rank order, each as its own summary says");
    assert_eq!(v["skew"]["highest"], "rank1_memory_snapshot.pickle");
    let ratio = v["skew"]["ratio"].as_f64().unwrap();
    assert!((ratio - (r1 - r0) as f64 / r0 as f64).abs() < 1e-9, "{ratio}");
    // Named one by one, the same table.
    let files = [dir.path().join("rank0_memory_snapshot.pickle"), dir.path().join("rank1_memory_snapshot.pickle")];
    let text = common::vramscope().args(["view", "--summary"]).args(&files).assert().success();
    let text = String::from_utf8_lossy(&text.get_output().stdout).into_owned();
    assert!(text.lines().last().unwrap().starts_with("skew: rank1_memory_snapshot.pickle peaks "), "{text}");
}

#[test]
fn the_screen_steps_through_the_files_with_r() {
    let dir = tempfile::tempdir().unwrap();
    ranks(dir.path());
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let exit = tempfile::tempdir().unwrap();
    let s = Session::start("vramscope-e2e-set", &format!("{bin} view {}; echo $? > {}/exit", dir.path().display(), exit.path().display()));
    s.wait_for("the first file", 30, |sc| sc.contains("rank0_memory_snapshot.pickle (1 of 2)") && sc.contains("active memory timeline"));
    // Every file's peak, read on a worker, and the skew in the header.
    s.wait_for("the peaks", 30, |sc| sc.contains("files: skew ") && sc.contains("(rank1_memory_snapshot.pickle over"));
    s.keys("R");
    s.wait_for("the second", 30, |sc| sc.contains("rank1_memory_snapshot.pickle (2 of 2)") && sc.contains("active memory timeline"));
    s.keys("R");
    s.wait_for("round to the first", 30, |sc| sc.contains("rank0_memory_snapshot.pickle (1 of 2)"));
    s.keys("q");
    assert_eq!(wait_file(&exit.path().join("exit"), 20).trim(), "0", "exit code");
    s.assert_terminal_restored();
}

/// `vramscope report DIR -o OUT`: a page, a text report, timelines and size histograms per
/// snapshot (PNG and SVG), and an index with the skew; a second run beside the first
/// overwrites nothing.
#[test]
fn a_report_folder_holds_the_write_up_and_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    ranks(dir.path());
    let out = tempfile::tempdir().unwrap();
    let report = |what: &std::path::Path| common::vramscope().arg("report").arg(what).arg("-o").arg(out.path()).assert().success();
    report(dir.path());
    let index = std::fs::read_to_string(out.path().join("index.md")).unwrap();
    assert!(index.contains("skew: rank1_memory_snapshot.pickle peaks") && index.contains("](rank0_memory_snapshot.md)"), "{index}");
    let page = std::fs::read_to_string(out.path().join("rank1_memory_snapshot.md")).unwrap();
    for want in ["![timeline](rank1_memory_snapshot_timeline.png)", "![sizes](rank1_memory_snapshot_sizes.png)", "efficiency ", "## At the peak, by category", "## Top 30 consumers at the peak"] {
        assert!(page.contains(want), "{want}: {page}");
    }
    let text = std::fs::read_to_string(out.path().join("rank1_memory_snapshot_report.txt")).unwrap();
    assert!(text.contains("peak active") && text.contains("top 30 consumers at the peak, by top frame:"), "{text}");
    for image in ["rank0_memory_snapshot_timeline.svg", "rank0_memory_snapshot_sizes.svg", "rank0_memory_snapshot_sizes.png"] {
        assert!(std::fs::metadata(out.path().join(image)).unwrap().len() > 1000, "{image}");
    }
    let before = std::fs::read(out.path().join("rank0_memory_snapshot.md")).unwrap();
    report(&dir.path().join("rank0_memory_snapshot.pickle"));
    assert_eq!(std::fs::read(out.path().join("rank0_memory_snapshot.md")).unwrap(), before, "the first page stays");
    let pages = std::fs::read_dir(out.path()).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("rank0_memory_snapshot") && e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".md")).count();
    assert_eq!(pages, 2, "the second run's page sits beside the first");
}

/// Second tier: a real snapshot that ends with most of its reserved memory cached free
/// (MAGMA27: 11.9 of 13.2 GiB) gets the findings a write-up needs.
#[test]
fn a_real_snapshots_report_names_its_findings() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    common::vramscope().arg("report").arg(common::fixture_path(common::MAGMA27)).arg("-o").arg(out.path()).assert().success();
    let text = std::fs::read_to_string(out.path().join(format!("{}_report.txt", common::MAGMA27))).unwrap();
    for want in ["finding          cache overhead: 11.9 GiB of the 13.2 GiB reserved", "finding          unused blocks: 5 cached free block(s) of 100 MB or more", "finding          fragmentation:"] {
        assert!(text.contains(want), "{want}: {text}");
    }
}

/// Every command that takes a snapshot's `--device` refuses one the file lacks: one line
/// naming the devices it has, exit 2, nothing written (issue 34: `export --device 9` wrote
/// an empty SVG and exited 0; `report` left its folder behind).
#[test]
fn a_device_the_file_lacks_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("one.pickle");
    training_snapshot::write(TrainingRun::default(), &snap);
    let out = dir.path().join("out");
    let s = snap.to_str().unwrap();
    let o = out.to_str().unwrap();
    for args in [
        vec!["export", s, "--device", "9", "-o", &format!("{o}.svg")],
        vec!["report", s, "--device", "9", "-o", o],
        vec!["view", "--summary", s, "--device", "9"],
        vec!["diff", s, s, "--device", "9"],
        vec!["whatif", s, "--device", "9"],
        vec!["replay", "--headless", s, "--device", "9"],
    ] {
        let r = common::vramscope().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim(), format!("vramscope: {s}: no device 9 (the file has device 0 only)"), "{args:?}");
        assert!(r.stdout.is_empty(), "{args:?} printed {}", String::from_utf8_lossy(&r.stdout));
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, [std::ffi::OsString::from("one.pickle")], "{args:?} wrote something");
    }
}
