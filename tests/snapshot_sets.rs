//! Several snapshots in one view (issue 38): each rank's, as a torchtitan-style job writes
//! them. `--summary` tables them with the skew between the highest peak and the lowest; on
//! the screen `R` steps through them. Made here: the training run at two batch sizes.

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
    s.keys("R");
    s.wait_for("the second", 30, |sc| sc.contains("rank1_memory_snapshot.pickle (2 of 2)") && sc.contains("active memory timeline"));
    s.keys("R");
    s.wait_for("round to the first", 30, |sc| sc.contains("rank0_memory_snapshot.pickle (1 of 2)"));
    s.keys("q");
    assert_eq!(wait_file(&exit.path().join("exit"), 20).trim(), "0", "exit code");
    s.assert_terminal_restored();
}
