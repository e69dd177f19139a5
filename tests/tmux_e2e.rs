//! The real binary in a real terminal: tmux runs `vramscope`, keys go in with send-keys,
//! the screen comes back with capture-pane.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

struct Session {
    name: String,
}

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).output().expect("tmux is installed (scripts/test installs it)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Session {
    /// Starts `cmd` in a detached 200×60 session whose pane stays after the program exits.
    fn start(name: &str, cmd: &str) -> Session {
        let _ = Command::new("tmux").args(["kill-session", "-t", name]).output();
        let status = Command::new("tmux")
            .args(["new-session", "-d", "-s", name, "-x", "200", "-y", "60"])
            .arg(format!("TERM=xterm-256color {cmd}; sleep 30"))
            .status()
            .expect("tmux starts");
        assert!(status.success());
        Session { name: name.into() }
    }

    fn screen(&self) -> String {
        tmux(&["capture-pane", "-p", "-t", &self.name])
    }

    fn keys(&self, keys: &str) {
        tmux(&["send-keys", "-t", &self.name, keys]);
    }

    fn display(&self, what: &str) -> String {
        tmux(&["display-message", "-p", "-t", &self.name, what]).trim().to_string()
    }

    /// Waits until the screen satisfies `pred`, or fails showing the last screen.
    fn wait_for(&self, what: &str, secs: u64, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.screen();
            if pred(&s) {
                return s;
            }
            if Instant::now() > deadline {
                panic!("timed out waiting for {what}; screen:\n{s}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["kill-session", "-t", &self.name]).output();
    }
}

fn wait_file(path: &Path, secs: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if let Ok(s) = std::fs::read_to_string(path) {
            if !s.is_empty() {
                return s;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("{} never appeared", path.display());
}

/// The step counter in the header ("step N").
fn shown_step(screen: &str) -> Option<u64> {
    let i = screen.find("step ")?;
    screen[i + 5..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

fn launch(name: &str, dir: &Path) -> Session {
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let cmd = format!(
        "{bin} --model tiny --ctx 64 --batch 2 --snapshot-dir {d}; echo $? > {d}/exit",
        d = dir.display()
    );
    Session::start(name, &cmd)
}

#[test]
fn keys_change_the_next_step_and_q_restores_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let s = launch("vramscope-e2e-keys", dir.path());
    s.wait_for("a finished step", 120, |sc| shown_step(sc).is_some_and(|n| n >= 1));
    assert_eq!(s.display("#{alternate_on}"), "1", "the app draws on the alternate screen");
    s.keys("p");
    s.keys("]");
    s.keys("s");
    let screen = s.wait_for("bf16 and ctx 128 in the header", 120, |sc| sc.contains("bf16") && sc.contains("ctx 128"));
    assert!(screen.contains("active memory"), "{screen}");
    let saved = std::fs::read_dir(dir.path())
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "pickle"));
    let saved = match saved {
        Some(p) => p,
        None => {
            s.wait_for("snapshot saved", 120, |sc| sc.contains("saved:"));
            std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.path()).find(|p| p.extension().is_some_and(|e| e == "pickle")).expect("snapshot file")
        }
    };
    let snap = vramscope::snapshot::read_snapshot_file(&saved).expect("the snapshot loads with our reader");
    assert!(snap.trace_entry_count() > 0);
    s.keys("q");
    assert_eq!(wait_file(&dir.path().join("exit"), 60).trim(), "0", "exit code");
    assert_eq!(s.display("#{alternate_on}"), "0", "alternate screen left");
    assert_eq!(s.display("#{cursor_flag}"), "1", "cursor shown again");
}

#[test]
fn sighup_stops_cleanly_and_restores_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let s = launch("vramscope-e2e-hup", dir.path());
    s.wait_for("a finished step", 120, |sc| shown_step(sc).is_some_and(|n| n >= 1));
    let shell = s.display("#{pane_pid}");
    let child = Command::new("pgrep").args(["-P", &shell, "vramscope"]).output().unwrap();
    let pid = String::from_utf8_lossy(&child.stdout).trim().to_string();
    assert!(!pid.is_empty(), "vramscope runs under the pane's shell");
    assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    assert_eq!(wait_file(&dir.path().join("exit"), 60).trim(), "0", "a hangup is a clean stop");
    assert_eq!(s.display("#{alternate_on}"), "0", "alternate screen left");
}
