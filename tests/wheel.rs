//! The release wheel as a user gets it: `scripts/wheel` builds it, and in a fresh venv
//! holding only it and a torch (the project venv's, linked in so the test downloads
//! nothing), with no Rust on PATH and outside the repository, `vramscope` answers
//! `--version`, reads, compares, draws and replays a snapshot under other settings, estimates,
//! samples the machine, watches a user's training script, and trains the built-in
//! model in that torch (there is no engine in the wheel) as the engine does.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{python, repo_root};

fn said(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn build_wheel() -> PathBuf {
    let out = Command::new("bash").arg(repo_root().join("scripts/wheel")).output().unwrap();
    assert!(out.status.success(), "scripts/wheel: {}", said(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(stdout.lines().last().expect("the wheel's path, last").trim())
}

/// What Python `code` prints about the wheel, opened as the zip file `z`.
fn in_wheel(wheel: &Path, code: &str) -> String {
    let out = Command::new(python()).args(["-c", &format!("import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); {code}")]).arg(wheel).output().unwrap();
    assert!(out.status.success(), "{}", said(&out));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// A venv of the system's Python whose only packages are the wheel and, through a `.pth`
/// file, the project venv's torch and its dependencies (not the project's own hook).
fn fresh_venv(dir: &Path, wheel: &Path) -> PathBuf {
    let venv = dir.join("venv");
    let base = Command::new(python()).args(["-c", "import sys; print(sys._base_executable)"]).output().unwrap();
    let base = String::from_utf8_lossy(&base.stdout).trim().to_string();
    let st = Command::new(&base).args(["-m", "venv"]).arg(&venv).status().unwrap();
    assert!(st.success());
    let site = |py: &Path| {
        let out = Command::new(py).args(["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).output().unwrap();
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    };
    let torch_only = dir.join("torch-site");
    std::fs::create_dir(&torch_only).unwrap();
    for entry in std::fs::read_dir(site(&python())).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("vramscope") && !name.starts_with("__editable__") {
            std::os::unix::fs::symlink(entry.path(), torch_only.join(&name)).unwrap();
        }
    }
    std::fs::write(site(&venv.join("bin/python")).join("torch.pth"), format!("{}\n", torch_only.display())).unwrap();
    let out = Command::new(venv.join("bin/python"))
        .args(["-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--disable-pip-version-check"])
        .arg(wheel)
        .output()
        .unwrap();
    assert!(out.status.success(), "pip install: {}", said(&out));
    venv
}

/// `vramscope` from the venv as a user runs it: not activated, no cargo on PATH, outside
/// the repository.
fn vramscope(venv: &Path, cwd: &Path) -> Command {
    let mut cmd = Command::new(venv.join("bin/vramscope"));
    cmd.current_dir(cwd).env("PATH", "/usr/local/bin:/usr/bin:/bin").env_remove("VIRTUAL_ENV").env_remove("VRAMSCOPE_PYTHON_DIR");
    cmd
}

#[test]
fn the_wheel_installs_beside_a_torch_and_works_without_rust_or_the_repository() {
    let wheel = build_wheel();
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    let tag = name.trim_end_matches(".whl").rsplit('-').next().unwrap();
    assert!(tag.starts_with("manylinux_2_") && tag.ends_with("_x86_64"), "{name}");
    let files = in_wheel(&wheel, "print('\\n'.join(z.namelist()))");
    assert!(files.lines().any(|f| f.ends_with(".data/scripts/vramscope")), "{files}");
    assert!(files.lines().any(|f| f == "vramscope_hook/libvramscope_hook.so"), "{files}");
    assert!(!files.contains("libtorch") && !files.contains("libc10"), "no libtorch inside: {files}");
    assert!(std::fs::metadata(&wheel).unwrap().len() < 20 << 20, "under 20 MB");
    // `pip install vramscope[cuda13]` brings the CUDA headers the shim is compiled with.
    let metadata = in_wheel(&wheel, "print(z.read(next(n for n in z.namelist() if n.endswith('METADATA'))).decode())");
    for extra in ["cuda13", "cuda12"] {
        assert!(metadata.contains(&format!("Provides-Extra: {extra}")), "{metadata}");
    }
    assert!(metadata.contains("Requires-Dist: nvidia-cuda-crt<14,>=13; extra == \"cuda13\""), "{metadata}");

    let t = tempfile::tempdir().unwrap();
    let venv = fresh_venv(t.path(), &wheel);
    let out = vramscope(&venv, t.path()).arg("--version").output().unwrap();
    assert!(out.status.success() && said(&out).starts_with("vramscope "), "{}", said(&out));

    let snap = t.path().join("run.pickle");
    vramscope_core::snapshot::save_snapshot_atomic(&common::long_run::long_run(3_000), &snap).unwrap();
    let out = vramscope(&venv, t.path()).args(["view", "--summary", "--json"]).arg(&snap).output().unwrap();
    assert!(out.status.success(), "{}", said(&out));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(summary["peak_active_bytes"].as_u64().is_some_and(|b| b > 0), "{summary}");
    // The other commands that read snapshots or the machine, as from the wheel.
    let (snap_s, svg) = (snap.display().to_string(), t.path().join("timeline.svg").display().to_string());
    let commands: [(&[&str], &str); 5] = [
        (&["diff", &snap_s, &snap_s], "peak active"),
        (&["export", &snap_s, "-o", &svg], "wrote"),
        (&["whatif", &snap_s], "expandable_segments:True"),
        (&["estimate", "--model", "tiny", "--ctx", "128"], "parameters"),
        (&["watch", "--once", "--json"], "\"source\""),
    ];
    for (args, expect) in commands {
        let out = vramscope(&venv, t.path()).args(args).output().unwrap();
        assert!(out.status.success() && said(&out).contains(expect), "{args:?}: {}", said(&out));
    }

    let fig = t.path().join("fig.json");
    std::fs::copy(repo_root().join("tests/py/train_transformer.py"), t.path().join("train.py")).unwrap();
    let out = vramscope(&venv, t.path())
        .env("VRAMSCOPE_SOCKET_DIR", {
            let d = t.path().join("sockets");
            vramscope_core::channel::dir::ensure_private_dir(&d).unwrap();
            d
        })
        .args(["py", "--headless", "--json", "train.py", "--steps", "2", "--out"])
        .arg(&fig)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", said(&out));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{}", said(&out));
    let figures: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&fig).unwrap()).unwrap();
    assert_eq!(lines[1]["category_bytes"]["parameter"], figures["parameter_bytes"], "exact parameter bytes: {}", said(&out));

    // `vramscope` alone is the built-in model: from the wheel, in the venv's torch.
    let args = ["--headless", "--json", "--steps", "2", "--model", "tiny", "--layers", "1", "--ctx", "32", "--batch", "1"];
    let out = vramscope(&venv, t.path()).env("VRAMSCOPE_SOCKET_DIR", t.path().join("sockets")).args(args).output().unwrap();
    assert!(out.status.success(), "{}", said(&out));
    let steps = |out: &Output| -> Vec<serde_json::Value> { String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect() };
    let wheel_steps = steps(&out);
    let engine = common::vramscope().args(args).output().unwrap();
    let engine_steps = steps(&engine);
    assert_eq!(wheel_steps.len(), 2, "{}", said(&out));
    for (w, e) in wheel_steps.iter().zip(&engine_steps) {
        for key in ["ctx", "batch", "peak_active_bytes", "reserved_bytes"] {
            assert_eq!(w[key], e[key], "{key}: wheel {w} engine {e}");
        }
    }
}
