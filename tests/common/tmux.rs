//! A real terminal for end-to-end tests: tmux runs the binary, keys go in with send-keys,
//! the screen comes back with capture-pane.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

pub struct Session {
    pub name: String,
}

/// tmux on the session's own server. With one shared server, a test whose session was the
/// last one stopped the server while another test's `new-session` was connecting to it
/// ("server exited unexpectedly").
fn tmux(server: &str) -> Command {
    let mut c = Command::new("tmux");
    c.args(["-L", server]);
    c
}

impl Session {
    /// Starts `cmd` in a detached 200×60 session whose pane stays after the program exits.
    /// The session and its server are named with the test process's pid, so two test runs
    /// on one machine never drive each other's sessions.
    pub fn start(name: &str, cmd: &str) -> Session {
        let name = format!("vramscope-{name}-{}", std::process::id());
        let _ = tmux(&name).arg("kill-server").output();
        let status = tmux(&name)
            .args(["new-session", "-d", "-s", &name, "-x", "200", "-y", "60"])
            .arg(format!("TERM=xterm-256color {cmd}; sleep 30"))
            .status()
            .expect("tmux starts");
        assert!(status.success());
        Session { name }
    }

    fn run(&self, args: &[&str]) -> String {
        let out = tmux(&self.name).args(args).output().expect("tmux is installed (scripts/test installs it)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", &self.name])
    }

    /// The terminal goes, as when an SSH connection drops: the session and its server end.
    pub fn close(&self) {
        assert!(tmux(&self.name).args(["kill-session", "-t", &self.name]).status().unwrap().success());
    }

    /// The screen with its colours, as SGR escape codes.
    pub fn screen_with_colours(&self) -> String {
        self.run(&["capture-pane", "-p", "-e", "-t", &self.name])
    }

    pub fn keys(&self, keys: &str) {
        self.run(&["send-keys", "-t", &self.name, keys]);
    }

    /// The program left the alternate screen and showed the cursor again.
    pub fn assert_terminal_restored(&self) {
        assert_eq!(self.display("#{alternate_on}"), "0", "alternate screen left");
        assert_eq!(self.display("#{cursor_flag}"), "1", "cursor shown again");
    }

    pub fn display(&self, what: &str) -> String {
        self.run(&["display-message", "-p", "-t", &self.name, what]).trim().to_string()
    }

    /// Waits until the screen satisfies `pred`, or fails showing the last screen.
    pub fn wait_for(&self, what: &str, secs: u64, pred: impl Fn(&str) -> bool) -> String {
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
        let _ = tmux(&self.name).arg("kill-server").output();
    }
}

/// Waits for a non-empty file (an exit code written by the pane's shell).
pub fn wait_file(path: &Path, secs: u64) -> String {
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

