//! Where the real PyTorch snapshots the tests and benchmarks are held to are found. They
//! come from public repositories and may not be redistributed, so a plain clone has none:
//! `$VRAMSCOPE_FIXTURES` when set (and then only there: CI sets it to an empty folder to run
//! as a plain clone), else `../shared/fixtures/snapshots` beside the clone, else the cache
//! `scripts/fixtures` downloads them to (pinned by commit, checked by sha256).

use std::io::Write;
use std::path::{Path, PathBuf};

/// The files, without `.pickle`.
pub const REAL_SNAPSHOTS: [&str; 4] = [
    "kkaitlyn111_cs336-a2-systems_memory_ctx128_forward",
    "MAGMA27_assignment2-systems_memory_snapshot",
    "SnapViewer_assets_memory",
    "Constructor-Sun_code_location_memory_snapshot",
];

/// The first folder holding every real snapshot, for a checkout at `repo_root`.
pub fn real_snapshots_dir(repo_root: &Path) -> Option<PathBuf> {
    let places = match std::env::var_os("VRAMSCOPE_FIXTURES") {
        Some(dir) => vec![PathBuf::from(dir)],
        None => {
            let cache = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/vramscope/fixtures"));
            [Some(repo_root.join("../shared/fixtures/snapshots")), cache].into_iter().flatten().collect()
        }
    };
    places.into_iter().find(|d| REAL_SNAPSHOTS.iter().all(|f| d.join(format!("{f}.pickle")).is_file()))
}

/// The one line a test or benchmark prints when it skips for want of them.
pub fn skipped(what: &str) -> String {
    format!("skipped {what}: it needs the real PyTorch snapshots, absent here; `scripts/fixtures` downloads them (pinned, checked by sha256)")
}

/// For a test held to them: `None` after saying it skipped, on stderr directly, so the line
/// shows in a passing run (the test harness captures only `eprintln!`).
pub fn for_test(repo_root: &Path) -> Option<PathBuf> {
    let dir = real_snapshots_dir(repo_root);
    if dir.is_none() {
        let test = std::thread::current().name().unwrap_or("a test").to_string();
        let _ = writeln!(std::io::stderr(), "{}", skipped(&test));
    }
    dir
}
