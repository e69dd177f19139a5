//! A screen whose terminal goes away (the tmux session killed, as an SSH drop does) ends
//! within a second, and so does one sent SIGTERM; none spins on a dead tty (issue 34,
//! first item): the viewer, watch, the live screen as a replay draws it, over vramscope's
//! engine, and over a user's job.

mod common;
// Shared with the viewer's tests, which use all of it.
#[allow(dead_code)]
#[path = "common/training_snapshot.rs"]
mod training_snapshot;

use std::path::Path;
use std::time::{Duration, Instant};

use common::tmux::{wait_file, Session};

/// Whether process `pid` is still there after `within`.
fn alive_after(pid: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if !running(pid) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    running(pid)
}

/// Whether `pid` has not exited. A process that exited after its tmux server did is left
/// to init to reap, which may take its time: a zombie has ended.
fn running(pid: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state follows the command's closing parenthesis.
    !stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
}

/// Starts `args` of the binary in tmux, its pid written to `dir/pid`; returns the session
/// once `ready` shows, and the pid.
fn start(dir: &Path, name: &str, args: &str, ready: &str) -> (Session, String) {
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let s = Session::start(name, &format!("sh -c 'echo $$ > {}/pid; exec {bin} {args}'", dir.display()));
    let pid = wait_file(&dir.join("pid"), 20).trim().to_string();
    s.wait_for(ready, 30, |sc| sc.contains(ready));
    (s, pid)
}

#[test]
fn screens_end_when_their_terminal_goes() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("train.pickle");
    training_snapshot::write(training_snapshot::TrainingRun::default(), &snap);
    let recording = common::repo_root().join("recordings/fp32-to-bf16-then-double-ctx.vsrec");
    let screens = [
        ("gone-view", format!("view {}", snap.display()), "active memory timeline"),
        ("gone-watch", "watch".to_string(), "vramscope watch"),
        // The live screen, as a replay draws it.
        ("gone-replay", format!("replay {}", recording.display()), "replay of "),
    ];
    for (name, args, ready) in screens {
        let _ = std::fs::remove_file(dir.path().join("pid"));
        let (s, pid) = start(dir.path(), name, &args, ready);
        s.close();
        assert!(!alive_after(&pid, Duration::from_secs(2)), "{name}: still running 2 s after its terminal went");
        let _ = std::fs::remove_file(dir.path().join("pid"));
        let (_s, pid) = start(dir.path(), name, &args, ready);
        std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(!alive_after(&pid, Duration::from_secs(2)), "{name}: still running 2 s after SIGTERM");
    }
}

/// The live screen over vramscope's own engine and over a user's job (`py`): the terminal
/// killed, each vramscope ends within a second or two; the engine ends with it, while the
/// user's job runs on, attachable, as an SSH drop leaves it (README); SIGTERM ends each
/// too, stopping the job it started, as `q` does.
#[test]
fn live_screens_end_when_their_terminal_goes_and_a_users_job_runs_on() {
    let dir = tempfile::tempdir().unwrap();
    let sockets = dir.path().join("sockets");
    let marker = dir.path().join("never.json");
    let script = common::repo_root().join("tests/py/train_transformer.py");
    let job_running = || {
        let out = std::process::Command::new("pgrep").args(["-f", &marker.display().to_string()]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.starts_with("python"))
        })
    };
    let screens = [
        ("gone-live", "run --ctx 16 --batch 1".to_string(), "active memory"),
        ("gone-py", format!("py {} --steps 100000 --sleep 0.05 --out {}", script.display(), marker.display()), "train_transformer"),
    ];
    for (name, args, ready) in screens {
        let env_args = format!("env VRAMSCOPE_SOCKET_DIR={} {}", sockets.display(), env!("CARGO_BIN_EXE_vramscope"));
        let _ = std::fs::remove_file(dir.path().join("pid"));
        let s = Session::start(name, &format!("sh -c 'echo $$ > {}/pid; exec {env_args} {args}'", dir.path().display()));
        let pid = wait_file(&dir.path().join("pid"), 20).trim().to_string();
        s.wait_for(ready, 120, |sc| sc.contains(ready) && sc.contains("step "));
        s.close();
        assert!(!alive_after(&pid, Duration::from_secs(2)), "{name}: still running 2 s after its terminal went");
        if name == "gone-py" {
            let job = job_running().expect("the user's job runs on after the terminal went");
            std::process::Command::new("kill").args(["-TERM", &job]).status().unwrap();
            assert!(!alive_after(&job, Duration::from_secs(20)), "the job ends when told");
        }
        let _ = std::fs::remove_file(dir.path().join("pid"));
        let s = Session::start(name, &format!("sh -c 'echo $$ > {}/pid; exec {env_args} {args}'", dir.path().display()));
        let pid = wait_file(&dir.path().join("pid"), 20).trim().to_string();
        s.wait_for(ready, 120, |sc| sc.contains(ready) && sc.contains("step "));
        std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(!alive_after(&pid, Duration::from_secs(15)), "{name}: still running after SIGTERM");
        assert!(job_running().is_none(), "{name}: SIGTERM stops the job it started");
    }
}
