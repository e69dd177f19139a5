//! Where the real PyTorch snapshots the tests and benchmarks are held to are found. They
//! come from public repositories and may not be redistributed, so a plain clone has none:
//! `$VRAMSCOPE_FIXTURES` when set (and then only there: CI sets it to an empty folder to run
//! as a plain clone), else `../shared/fixtures/snapshots` (and `cuda-autocast`) beside the
//! clone, else the cache `scripts/fixtures` downloads them to (pinned by commit, checked by
//! sha256).

use std::io::Write;
use std::path::{Path, PathBuf};

/// The files, without `.pickle`.
pub const REAL_SNAPSHOTS: [&str; 4] = [
    "kkaitlyn111_cs336-a2-systems_memory_ctx128_forward",
    "MAGMA27_assignment2-systems_memory_snapshot",
    "SnapViewer_assets_memory",
    "Constructor-Sun_code_location_memory_snapshot",
];

/// Real GPU runs of the CS336 model under CUDA autocast and in fp32 (medium, batch 4,
/// vocab 10,000; one snapshot each, issue 32's truth). `..._train` is one full training step
/// after warm-up, `..._forward` one forward pass to the logits under inference_mode. The
/// ctx-512 training step is in ../shared; `scripts/fixtures` downloads them all.
pub const REAL_RUNS: [&str; 6] = [
    "cs336_medium_ctx512_batch4_bf16_train",
    "cs336_medium_ctx1024_batch4_bf16_train",
    "cs336_medium_ctx256_batch4_fp32_train",
    "cs336_medium_ctx512_batch4_bf16_forward",
    "cs336_medium_ctx256_batch4_fp32_forward",
    "cs336_medium_ctx1024_batch4_fp32_forward",
];

/// Where a set of real files may be: `$VRAMSCOPE_FIXTURES/<sub>` alone when it is set, else
/// `../shared/fixtures/<shared>` beside the clone, then the download cache's `<sub>`.
fn places(repo_root: &Path, shared: &str, sub: &str) -> Vec<PathBuf> {
    match std::env::var_os("VRAMSCOPE_FIXTURES") {
        Some(dir) => vec![PathBuf::from(dir).join(sub)],
        None => {
            let cache = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/vramscope/fixtures").join(sub));
            [Some(repo_root.join("../shared/fixtures").join(shared)), cache].into_iter().flatten().collect()
        }
    }
}

/// The first folder holding every real snapshot, for a checkout at `repo_root`.
pub fn real_snapshots_dir(repo_root: &Path) -> Option<PathBuf> {
    places(repo_root, "snapshots", "").into_iter().find(|d| REAL_SNAPSHOTS.iter().all(|f| d.join(format!("{f}.pickle")).is_file()))
}

/// A real torch.profiler trace of a GPU job, from 2021: ResNet-50 on a V100 (pytorch/kineto's
/// TensorBoard plugin samples), gzipped, without addresses or totals, CPU and CUDA memory
/// events mixed. `scripts/fixtures` downloads it into `profiler/`.
pub const REAL_TRACE: &str = "kineto_resnet50_v100_2021.pt.trace.json.gz";

/// One of `REAL_RUNS`, where it is.
pub fn real_run(repo_root: &Path, name: &str) -> Option<PathBuf> {
    find(repo_root, "cuda-autocast", &format!("{name}.pickle"))
}

fn find(repo_root: &Path, sub: &str, file: &str) -> Option<PathBuf> {
    places(repo_root, sub, sub).into_iter().map(|d| d.join(file)).find(|f| f.is_file())
}

/// For a test held to one of `REAL_RUNS`: `None` after saying it skipped, as `for_test`.
pub fn real_run_for_test(repo_root: &Path, name: &str) -> Option<PathBuf> {
    said_if_absent(real_run(repo_root, name), name)
}

/// `REAL_TRACE` for a test, as `real_run_for_test`.
pub fn real_trace_for_test(repo_root: &Path) -> Option<PathBuf> {
    said_if_absent(find(repo_root, "profiler", REAL_TRACE), REAL_TRACE)
}

fn said_if_absent(file: Option<PathBuf>, name: &str) -> Option<PathBuf> {
    if file.is_none() {
        let test = std::thread::current().name().unwrap_or("a test").to_string();
        let _ = writeln!(std::io::stderr(), "skipped {test} at {name}: that real file is absent here; `scripts/fixtures` downloads it (pinned, checked by sha256)");
    }
    file
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
