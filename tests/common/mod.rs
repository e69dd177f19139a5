//! Fixture loading for integration tests: real snapshots from ../shared/fixtures.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

use vramscope::snapshot::model::Snapshot;

pub const KKAITLYN: &str = "kkaitlyn111_cs336-a2-systems_memory_ctx128_forward";
pub const MAGMA27: &str = "MAGMA27_assignment2-systems_memory_snapshot";
pub const SNAPVIEWER: &str = "SnapViewer_assets_memory";
pub const ALL: [&str; 3] = [KKAITLYN, MAGMA27, SNAPVIEWER];

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn python() -> PathBuf {
    repo().join(".venv/bin/python")
}

pub fn fixture_path(name: &str) -> PathBuf {
    repo()
        .join("../shared/fixtures/snapshots")
        .join(format!("{name}.pickle"))
}

/// Loads a fixture through scripts/snapshot_to_json.py (cached under the target dir).
pub fn load(name: &str) -> Snapshot {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fixture-json");
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join(format!("{name}.json"));
    if !json.exists() {
        let st = Command::new(python())
            .arg(repo().join("scripts/snapshot_to_json.py"))
            .arg(fixture_path(name))
            .arg(&json)
            .status()
            .expect("run the project venv's python");
        assert!(st.success(), "converting {name} failed");
    }
    serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap()
}
