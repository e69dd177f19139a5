//! Categories for any snapshot, named from its stack frames (issue 38): a training run made
//! here, written without categories as `_record_memory_history` writes them, and (second
//! tier) the real snapshots. At the peak, the categories add up to the active total.

mod common;
// Shared with the viewer's tests, which use all of it.
#[allow(dead_code)]
#[path = "common/training_snapshot.rs"]
mod training_snapshot;

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use training_snapshot::TrainingRun;

fn summary(path: &Path, extra: &[&str]) -> Value {
    let out = common::vramscope().args(["view", "--summary", "--json"]).args(extra).arg(path).assert().success();
    serde_json::from_slice(&out.get_output().stdout).unwrap()
}

/// The breakdown at the peak as name → bytes, checked to add up to the peak.
fn at_peak(s: &Value) -> BTreeMap<String, u64> {
    let groups: BTreeMap<String, u64> = s["breakdown"]["groups"].as_array().unwrap().iter().map(|g| (g["name"].as_str().unwrap().to_string(), g["bytes"].as_u64().unwrap())).collect();
    assert_eq!(groups.values().sum::<u64>(), s["peak_active_bytes"].as_u64().unwrap(), "the categories add up to the peak: {groups:?}");
    groups
}

#[test]
fn a_snapshot_without_categories_is_broken_down_by_the_rules() {
    let dir = tempfile::tempdir().unwrap();
    let mut snap = TrainingRun::default().snapshot();
    for e in snap.device_traces.iter_mut().flatten() {
        e.category = None;
    }
    let path = dir.path().join("plain.pickle");
    vramscope_core::snapshot::save_snapshot_atomic(&snap, &path).unwrap();

    let s = summary(&path, &[]);
    assert_eq!(s["breakdown"]["by"], "category");
    let groups = at_peak(&s);
    // Backward's allocations sit below the autograd engine's frames; Adam's below torch/optim.
    for named in ["gradient", "optimizer_state"] {
        assert!(groups.contains_key(named), "{named}: {groups:?}");
    }
    let c = &s["frame_rules"];
    let (matched, unmatched) = (c["matched_bytes"].as_u64().unwrap(), c["unmatched_bytes"].as_u64().unwrap());
    assert!(matched > 0 && unmatched > 0, "{c}");
    let text = common::vramscope().args(["view", "--summary"]).arg(&path).assert().success();
    let text = String::from_utf8_lossy(&text.get_output().stdout).into_owned();
    assert!(text.contains("categories       from stack frames: rules matched"), "{text}");

    // A rules file names what the defaults leave: every allocation runs under train.py.
    let rules = dir.path().join("categories.toml");
    std::fs::write(&rules, "[[rule]]\ncategory = \"training loop\"\nmatch = [\"nanogpt/train.py:\"]\n").unwrap();
    let with_file = summary(&path, &["--categories", rules.to_str().unwrap()]);
    assert_eq!(with_file["frame_rules"]["unmatched_bytes"], 0, "{}", with_file["frame_rules"]);
    assert!(at_peak(&with_file).contains_key("training loop"));
    // off: the breakdown by top frame, as before rules.
    assert_eq!(summary(&path, &["--categories", "off"])["breakdown"]["by"], "top_frame");

    // diff and export take the rules too.
    let diff = common::vramscope().args(["diff", "--json", "--categories"]).arg(&rules).arg(&path).arg(&path).assert().success();
    let diff: Value = serde_json::from_slice(&diff.get_output().stdout).unwrap();
    assert!(diff.to_string().contains("training loop"), "{diff}");
    let svg = dir.path().join("timeline.svg");
    common::vramscope().args(["export", "-o"]).arg(&svg).arg(&path).assert().success();
    assert!(std::fs::read_to_string(&svg).unwrap().contains("optimizer_state"), "the legend names the rules' categories");
    let bad = common::vramscope().args(["view", "--summary", "--categories"]).arg(dir.path().join("none.toml")).arg(&path).assert().failure();
    let err = String::from_utf8_lossy(&bad.get_output().stderr).into_owned();
    assert!(err.trim().lines().count() == 1 && err.contains("cannot read"), "{err}");
}

#[test]
fn real_snapshots_are_broken_down_by_category_and_add_up() {
    if common::skip_without_real_snapshots() {
        return;
    }
    for name in [common::MAGMA27, common::KKAITLYN, common::CONSTRUCTOR_SUN] {
        let s = summary(&common::fixture_path(name), &[]);
        assert_eq!(s["breakdown"]["by"], "category", "{name}");
        assert!(s["frame_rules"]["matched_bytes"].as_u64().unwrap() > 0, "{name}");
        at_peak(&s);
    }
}
