//! The light binary (issue "One light binary"): the commands that train nothing never load
//! libtorch, and a training engine that cannot start is said, not crashed into.

mod common;

use std::path::Path;
use std::process::Command;

use common::{fixture_path, repo_root, vramscope, KKAITLYN, MAGMA27};

/// A directory of "libtorch" libraries that cannot be loaded, put first on the loader's path.
fn unloadable_libtorch() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for lib in ["libtorch_cpu.so", "libtorch_cuda.so", "libc10.so", "libc10_cuda.so", "libtorch.so"] {
        std::fs::write(d.path().join(lib), b"not a library").unwrap();
    }
    d
}

#[test]
fn the_binary_needs_no_libtorch_library() {
    let bin = assert_cmd::cargo::cargo_bin("vramscope");
    let out = Command::new("readelf").arg("-d").arg(&bin).output().expect("readelf (binutils) is installed");
    let dynamic = String::from_utf8_lossy(&out.stdout);
    let needed: Vec<&str> = dynamic.lines().filter(|l| l.contains("(NEEDED)")).collect();
    assert!(!needed.is_empty(), "{dynamic}");
    for n in &needed {
        assert!(!n.contains("torch") && !n.contains("c10") && !n.contains("cuda"), "needs {n}");
    }
}

#[test]
fn commands_that_train_nothing_work_with_libtorch_unloadable() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let hide = unloadable_libtorch();
    let out = tempfile::tempdir().unwrap();
    let (a, b) = (fixture_path(KKAITLYN), fixture_path(MAGMA27));
    let sample = repo_root().join("recordings/fp32-to-bf16-then-double-ctx.vsrec");
    let svg = out.path().join("t.svg");
    let runs: Vec<Vec<&std::ffi::OsStr>> = vec![
        vec!["--version".as_ref()],
        vec!["--help".as_ref()],
        vec!["view".as_ref(), a.as_os_str(), "--summary".as_ref(), "--json".as_ref()],
        vec!["diff".as_ref(), a.as_os_str(), b.as_os_str(), "--json".as_ref()],
        vec!["export".as_ref(), a.as_os_str(), "-o".as_ref(), svg.as_os_str()],
        vec!["estimate".as_ref(), "--model".as_ref(), "2.7B".as_ref()],
        vec!["replay".as_ref(), "--headless".as_ref(), sample.as_os_str()],
        vec!["watch".as_ref(), "--once".as_ref(), "--json".as_ref()],
    ];
    for args in runs {
        let r = vramscope().env("LD_LIBRARY_PATH", hide.path()).args(&args).output().unwrap();
        assert!(r.status.success(), "{args:?}: {}", String::from_utf8_lossy(&r.stderr));
    }
    assert!(Path::new(&svg).exists());
}

#[test]
fn an_engine_that_cannot_load_libtorch_is_said_not_crashed_into() {
    let hide = unloadable_libtorch();
    let r = vramscope()
        .env("LD_LIBRARY_PATH", hide.path())
        .args(["run", "--headless", "--steps", "1", "--ctx", "32"])
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(2));
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("the training engine exited with code 127 before it began streaming"), "{err}");
    assert!(err.contains("libtorch") || err.contains("libc10"), "the loader's own reason passes through: {err}");
}
