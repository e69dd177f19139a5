//! `vramscope attach --pid` on jobs started with plain `python` (issue 30): what it streams,
//! that the job runs on untouched once vramscope leaves, and the one-line refusals this
//! machine can produce (gdb is installed by scripts/setup's test dependencies).

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{python, repo_root, vramscope};

/// `tests/py/plain_job.py` with `args`, started as a user starts it, vramscope nowhere.
fn plain_job(args: &[&str], dir: &Path) -> Child {
    Command::new(python())
        .arg(repo_root().join("tests/py/plain_job.py"))
        .args(args)
        .current_dir(dir)
        .env_remove("PYTHONPATH")
        .env_remove("VRAMSCOPE_HOOK")
        // A job that dies of a signal says where (a crash in the attach would be silent).
        .env("PYTHONFAULTHANDLER", "1")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("job.err")).unwrap())
        .spawn()
        .unwrap()
}

/// Waits until process `pid` has torch loaded (a job that has not imported it is refused).
fn wait_for_torch(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default().contains("libtorch_cpu.so") {
        assert!(Instant::now() < deadline, "the job never imported torch");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One attach at a time: each test drives gdb and a training job or two, and on a 2-core
/// machine five at once starve the jobs they watch.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn sockets() -> std::path::PathBuf {
    vramscope_core::channel::dir::socket_dir().unwrap()
}

fn attach_json(pid: u32, steps: u64, dir: &Path) -> Vec<serde_json::Value> {
    let out = vramscope()
        .args(["attach", "--pid", &pid.to_string(), "--headless", "--json", "--steps", &steps.to_string(), "--snapshot-dir"])
        .arg(dir)
        .timeout(Duration::from_secs(120))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if !out.status.success() {
        // Time for a launcher to report how its workers ended.
        std::thread::sleep(Duration::from_secs(3));
    }
    // The job's own stderr (plain_job writes it there) says why a hook that started left.
    let job_said = std::fs::read_to_string(dir.join("job.err")).unwrap_or_default();
    assert!(out.status.success(), "{text}{}\nthe job said: {job_said}", String::from_utf8_lossy(&out.stderr));
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Each step counts the job's parameters and AdamW's two moments, made before vramscope
/// came and learned from the job's own objects (`plain_job --out` wrote its own count).
fn assert_learned_what_it_held(steps: &[serde_json::Value], figures: &Path) {
    let figures: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(figures).unwrap()).unwrap();
    let params = figures["parameter_bytes"].as_u64().unwrap();
    for s in steps {
        let seen = s["category_bytes"]["parameter"].as_u64().unwrap();
        assert!(seen.abs_diff(params) * 50 <= params, "parameter bytes {seen}, the job's own count {params}");
        assert_eq!(s["category_bytes"]["optimizer_state"].as_u64(), Some(2 * seen), "AdamW's two moments: {s}");
    }
}

#[test]
fn a_plain_python_job_streams_whole_steps_and_runs_on_as_before_once_vramscope_leaves() {
    let _serial = one_at_a_time();
    let t = tempfile::tempdir().unwrap();
    let (out, times) = (t.path().join("figures.json"), t.path().join("times.txt"));
    let mut job = plain_job(&["--steps", "900", "--out", out.to_str().unwrap(), "--times", times.to_str().unwrap()], t.path());
    wait_for_torch(job.id());
    std::thread::sleep(Duration::from_secs(1));
    let attached_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let steps = attach_json(job.id(), 3, t.path());
    assert_eq!(steps.len(), 3, "{steps:?}");
    for s in &steps {
        for phase in ["forward", "backward", "optimizer"] {
            assert!(s["phase_peak_bytes"][phase].as_u64().is_some_and(|b| b > 0), "{phase} in {s}");
        }
    }
    assert_learned_what_it_held(&steps, &out);
    // The hook leaves the job once its viewer is gone, and a second attach works.
    wait_until_unhooked(job.id());
    let left_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert_eq!(attach_json(job.id(), 2, t.path()).len(), 2, "attached again");
    let status = job.wait().unwrap();
    assert!(status.success(), "the job ran to its end: {status:?}");
    let mut said = String::new();
    std::io::Read::read_to_string(job.stdout.as_mut().unwrap(), &mut said).unwrap();
    assert!(said.contains("trained 900 steps"), "{said}");
    // The pause the job saw while vramscope got in: well under a second between two steps.
    let rows: Vec<(f64, f64)> = std::fs::read_to_string(&times).unwrap().lines().map(|l| {
        let mut it = l.split_whitespace().map(|v| v.parse::<f64>().unwrap());
        (it.next().unwrap(), it.next().unwrap())
    }).collect();
    let gap = rows.windows(2).filter(|w| w[1].0 > attached_at && w[0].0 < left_at).map(|w| w[1].0 - w[0].0).fold(0.0, f64::max);
    assert!(gap < 1.0, "the job stood still {gap:.2} s");
}

/// What the job held before is learned from its tensors on the job's own thread, at its
/// next forward, optimizer step or step end. Read from the attach's thread, a gradient could
/// be set by the job's backward (which runs without the GIL) in the middle of the read: a
/// job died of a segfault so. Every use of the parameters off the job's thread is noted.
#[test]
fn the_job_s_tensors_are_read_on_its_own_thread_and_what_it_held_is_still_learned() {
    let _serial = one_at_a_time();
    let t = tempfile::tempdir().unwrap();
    let (out, watch) = (t.path().join("figures.json"), t.path().join("watch.json"));
    let mut job = plain_job(&["--steps", "600", "--out", out.to_str().unwrap(), "--watch", watch.to_str().unwrap()], t.path());
    wait_for_torch(job.id());
    std::thread::sleep(Duration::from_secs(1));
    let steps = attach_json(job.id(), 2, t.path());
    assert_eq!(steps.len(), 2, "{steps:?}");
    assert_learned_what_it_held(&steps, &out);
    assert!(job.wait().unwrap().success(), "the job ran to its end");
    let elsewhere: Vec<String> = serde_json::from_str(&std::fs::read_to_string(&watch).unwrap()).unwrap();
    assert!(elsewhere.is_empty(), "the parameters were used off the job's thread: {elsewhere:?}");
}

/// Waits until no vramscope session serves from inside process `pid` (the hook left).
fn wait_until_unhooked(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while sessions_of(pid) > 0 {
        assert!(Instant::now() < deadline, "the hook never left the job");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// vramscope sessions serving from inside process `pid`.
fn sessions_of(pid: u32) -> usize {
    std::fs::read_dir(sockets()).map(|d| d.filter_map(Result::ok).filter(|e| {
        let n = e.file_name().to_string_lossy().into_owned();
        n.contains(&format!("-pid{pid}")) && n.ends_with(".sock")
    }).count()).unwrap_or(0)
}

fn refusal(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = vramscope();
    cmd.arg("attach").args(args).timeout(Duration::from_secs(60));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    err
}

#[test]
fn what_cannot_be_attached_to_is_said_in_one_line_and_the_job_is_left_as_it_was() {
    let _serial = one_at_a_time();
    // No such process.
    let max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max").unwrap().trim().parse().unwrap();
    let e = refusal(&["--pid", &(max + 1).to_string(), "--headless"], &[]);
    assert!(e.contains("no process with PID"), "{e}");
    // Not Python.
    let mut sleep = Command::new("sleep").arg("60").spawn().unwrap();
    let e = refusal(&["--pid", &sleep.id().to_string(), "--headless"], &[]);
    assert!(e.contains("is not a CPython process") && e.contains("sleep"), "{e}");
    sleep.kill().unwrap();
    let _ = sleep.wait();
    // Python without torch.
    let mut bare = Command::new(python()).args(["-c", "import time; time.sleep(60)"]).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let e = refusal(&["--pid", &bare.id().to_string(), "--headless"], &[]);
    assert!(e.contains("has not imported torch yet"), "{e}");
    bare.kill().unwrap();
    let _ = bare.wait();

    let t = tempfile::tempdir().unwrap();
    // A job that never allocates (asleep before its first step): nothing changes in it.
    let ready = t.path().join("ready.json");
    let mut idle = plain_job(&["--steps", "1", "--idle", "600", "--out", ready.to_str().unwrap()], t.path());
    // Its model is built and written down: from here on it only sleeps.
    common::tmux::wait_file(&ready, 60);
    std::thread::sleep(Duration::from_millis(500));
    let e = refusal(&["--pid", &idle.id().to_string(), "--headless"], &[]);
    assert!(e.contains("called neither malloc nor free"), "{e}");
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", idle.id())).unwrap();
    assert!(!maps.contains("libvramscope_hook"), "nothing was loaded into the job");
    assert!(idle.try_wait().unwrap().is_none(), "the job lives on");
    // A gdb that stops the job and then never answers (a cuda-gdb did, on a GPU box):
    // vramscope ends it in bounded time, and the job is not left stopped.
    let bin = t.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let hung = bin.join("gdb");
    std::fs::write(&hung, "#!/bin/sh\nwhile [ $# -gt 0 ]; do [ \"$1\" = -p ] && kill -STOP \"$2\"; shift; done\ntrap '' INT\nexec sleep 600\n").unwrap();
    std::fs::set_permissions(&hung, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let asked = Instant::now();
    let e = refusal(&["--pid", &idle.id().to_string(), "--headless"], &[("PATH", &path)]);
    assert!(e.contains("did not answer") && e.contains("runs on as it was"), "{e}");
    assert!(asked.elapsed() < Duration::from_secs(40), "ended in bounded time: {:?}", asked.elapsed());
    let state = std::fs::read_to_string(format!("/proc/{}/stat", idle.id())).unwrap();
    let state = state.rsplit(") ").next().unwrap().chars().next().unwrap();
    assert!(state != 'T' && state != 't', "the job was left stopped ({state})");
    // No gdb, and a Python without sys.remote_exec.
    let e = refusal(&["--pid", &idle.id().to_string(), "--headless"], &[("PATH", "/nonexistent")]);
    assert!(e.contains("gdb is not installed") && e.contains("sys.remote_exec"), "{e}");
    idle.kill().unwrap();
    let _ = idle.wait();
}

/// Live, in a real terminal: the attached job's steps on the screen, `d` leaves it running,
/// the terminal is restored, and the hook comes out of the job.
#[test]
fn live_in_a_terminal_d_leaves_the_job_running_without_the_hook() {
    let _serial = one_at_a_time();
    let t = tempfile::tempdir().unwrap();
    let mut job = plain_job(&["--steps", "1500"], t.path());
    wait_for_torch(job.id());
    std::thread::sleep(Duration::from_secs(1));
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let cmd = format!("{bin} attach --pid {} --snapshot-dir {d}; echo $? > {d}/exit", job.id(), d = t.path().display());
    let s = common::tmux::Session::start("vramscope-attach-pid", &cmd);
    let screen = s.wait_for("the job's steps", 120, |sc| sc.contains("plain_job") && sc.contains("step 2"));
    assert!(screen.contains("active memory"), "{screen}");
    s.keys("d");
    assert_eq!(common::tmux::wait_file(&t.path().join("exit"), 60).trim(), "0");
    s.assert_terminal_restored();
    wait_until_unhooked(job.id());
    assert!(job.try_wait().unwrap().is_none(), "the job runs on");
    job.kill().unwrap();
    let _ = job.wait();
}

/// torchrun's launcher, attached by its PID: the hook goes into each worker rank (not the
/// launcher), and the screen gets every rank.
#[test]
fn attaching_to_torchrun_watches_each_worker_rank() {
    let _serial = one_at_a_time();
    let t = tempfile::tempdir().unwrap();
    let torchrun = python().parent().unwrap().join("torchrun");
    let mut launcher = Command::new(torchrun)
        .args(["--nproc-per-node", "2", "--standalone"])
        .arg(repo_root().join("tests/py/train_ddp.py"))
        .args(["--steps", "3000", "--sleep", "0.05"])
        .current_dir(t.path())
        .env_remove("PYTHONPATH")
        .env_remove("VRAMSCOPE_HOOK")
        .env("PYTHONFAULTHANDLER", "1")
        .stdout(Stdio::null())
        // Where a failed attach finds what the workers said (a rank that died, and why).
        .stderr(std::fs::File::create(t.path().join("job.err")).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ranks = vramscope::attach_pid::trainers(launcher.id());
        if ranks.len() == 2 && ranks.iter().all(|&r| std::fs::read_to_string(format!("/proc/{r}/maps")).unwrap_or_default().contains("libtorch_cpu.so")) {
            break;
        }
        assert!(Instant::now() < deadline, "torchrun's workers never started");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(3));
    let steps = attach_json(launcher.id(), 2, t.path());
    let ranks: std::collections::BTreeSet<i64> = steps.iter().filter_map(|s| s["rank"].as_i64()).collect();
    assert_eq!(ranks, [0, 1].into(), "{steps:?}");
    let _ = launcher.kill();
    let _ = launcher.wait();
    // Its workers end with it (torchrun's own process group handling may leave them).
    let _ = Command::new("pkill").args(["-f", "train_ddp.py --steps 3000"]).status();
}

/// On a GPU machine, what the job held in CUDA memory before the attach comes from
/// PyTorch's snapshot (tests/py/fake_cuda.py fakes a device holding a 2 MiB segment with
/// 512 KiB in use): the steps seen count it, reserved and live.
#[test]
fn an_attach_learns_the_cuda_memory_the_job_already_holds_from_pytorchs_snapshot() {
    let _serial = one_at_a_time();
    let t = tempfile::tempdir().unwrap();
    let mut job = plain_job(&["--steps", "2000", "--fake-cuda"], t.path());
    wait_for_torch(job.id());
    std::thread::sleep(Duration::from_secs(2));
    let steps = attach_json(job.id(), 2, t.path());
    assert_eq!(steps.len(), 2, "{steps:?}");
    for s in &steps {
        assert_eq!(s["reserved_bytes"].as_u64(), Some(2 << 20), "the segment held before: {s}");
        assert_eq!(s["live_bytes"].as_u64(), Some(512 << 10), "the block in use before: {s}");
    }
    job.kill().unwrap();
    let _ = job.wait();
}

/// The attach's search of the job's objects (for its models and optimizers) never lets the
/// job's other threads run while it holds them. One building a tuple from a generator would
/// find a second reference at the tuple's resize and die of a SystemError: CI saw a job die
/// so on attach. The search as it was, in Python, fails this at its first try.
#[test]
fn the_attach_s_search_of_the_job_s_objects_leaves_a_tuple_being_built_alone() {
    let out = Command::new(python())
        .arg(repo_root().join("tests/py/instances_race.py"))
        .arg("core")
        .env("VRAMSCOPE_HOOK_CORE", common::built("libvramscope_hook.so"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["errors"], serde_json::json!([]), "{v}");
    assert!(v["searches"].as_u64() > Some(10) && v["built"].as_u64() > Some(0), "both threads ran: {v}");
    // Three markers, one of them of the subclass.
    assert_eq!(v["found"], serde_json::json!([3, 1]), "{v}");
}
