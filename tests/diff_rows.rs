//! `vramscope diff` on the real fixtures: no two rows of what grew or shrank read alike
//! (groups that differ only in frames below the shown one are counted together), and
//! merging them loses no bytes.

mod common;
#[allow(dead_code)]
#[path = "common/training_snapshot.rs"]
mod training_snapshot;

use common::vramscope;

fn diff(a: &str, b: &str, json: bool) -> String {
    let mut cmd = vramscope();
    cmd.args(["diff", "--top", "100000"]);
    if json {
        cmd.arg("--json");
    }
    let out = cmd.arg(common::fixture_path(a)).arg(common::fixture_path(b)).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn no_two_rows_look_the_same_and_no_bytes_are_lost() {
    if common::skip_without_real_snapshots() {
        return;
    }
    for (a, b) in [(common::KKAITLYN, common::MAGMA27), (common::SNAPVIEWER, common::KKAITLYN)] {
        let text = diff(a, b, false);
        let rows: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("grew")).filter(|l| l.starts_with("  ")).collect();
        assert!(rows.len() > 5, "{text}");
        let mut seen = std::collections::HashSet::new();
        for r in &rows {
            assert!(seen.insert(*r), "'{r}' twice in:\n{text}");
        }
        let d: serde_json::Value = serde_json::from_str(&diff(a, b, true)).unwrap();
        let sum = |key: &str| d[key].as_array().unwrap().iter().map(|c| c["bytes"]["delta"].as_i64().unwrap()).sum::<i64>();
        // The rows and the groups count the same allocations alive at each peak.
        assert_eq!(sum("grew") + sum("shrank"), sum("groups"), "{a} → {b}");
    }
}

/// Issue 34: `diff A A` printed a heading with nothing under it and never said which device
/// it compared.
#[test]
fn a_file_against_itself_names_its_device_and_says_nothing_changed() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("a.pickle");
    training_snapshot::write(training_snapshot::TrainingRun::default(), &f);
    let out = vramscope().arg("diff").arg(&f).arg(&f).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("A = a.pickle (device 0)\nB = a.pickle (device 0)\n"), "{text}");
    let sections: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("at the peak")).collect();
    assert_eq!(sections[1], "  no change", "{text}");
    assert_eq!(text.matches("  nothing").count(), 2, "{text}");
}
