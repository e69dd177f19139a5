//! A screen whose terminal goes away (the tmux session killed, as an SSH drop does) ends
//! within a second, and so does one sent SIGTERM; none spins on a dead tty (issue 34,
//! first item): the viewer, watch, and the live screen as a replay draws it.

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
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Path::new(&format!("/proc/{pid}")).exists()
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
        std::process::Command::new("tmux").args(["kill-session", "-t", &s.name]).status().unwrap();
        assert!(!alive_after(&pid, Duration::from_secs(2)), "{name}: still running 2 s after its terminal went");
        let _ = std::fs::remove_file(dir.path().join("pid"));
        let (_s, pid) = start(dir.path(), name, &args, ready);
        std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(!alive_after(&pid, Duration::from_secs(2)), "{name}: still running 2 s after SIGTERM");
    }
}
