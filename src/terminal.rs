//! The terminal while an app owns it: raw mode and the alternate screen, restored however
//! the app ends: return, error (drop), panic (ratatui's hook), and SIGTERM/SIGHUP, which only raise a flag the app's loop checks, so the
//! loop ends like a quit and everything unwinds normally (an SSH drop included).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use ratatui::DefaultTerminal;

pub struct TerminalSession {
    pub terminal: DefaultTerminal,
    stop: Arc<AtomicBool>,
    hangup: Arc<AtomicBool>,
    /// The controlling terminal, watched for a hangup (None without one).
    tty: Option<std::fs::File>,
}

impl TerminalSession {
    pub fn enter() -> anyhow::Result<TerminalSession> {
        let stop = Arc::new(AtomicBool::new(false));
        let hangup = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
            signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
        }
        signal_hook::flag::register(signal_hook::consts::SIGHUP, hangup.clone()).context("installing signal handlers")?;
        let terminal = ratatui::try_init().context("setting up the terminal")?;
        let tty = std::fs::File::open("/dev/tty").ok();
        Ok(TerminalSession { terminal, stop, hangup, tty })
    }

    /// The next input event within `timeout`, or None. The wait is on the tty itself:
    /// once a terminal hangs up, crossterm's own wait spins forever for an event that never
    /// comes. A hangup counts as SIGHUP does (the loop ends at its next check); crossterm
    /// is asked only when the tty has input, or for what it queued (a resize).
    pub fn next_event(&self, timeout: std::time::Duration) -> anyhow::Result<Option<crossterm::event::Event>> {
        let wait = match &self.tty {
            Some(tty) => {
                use std::os::fd::AsRawFd;
                let mut p = libc::pollfd { fd: tty.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one pollfd for an fd this session owns.
                let n = unsafe { libc::poll(&mut p, 1, timeout.as_millis().min(i32::MAX as u128) as i32) };
                if n > 0 && p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
                    self.hangup.store(true, Ordering::Relaxed);
                    self.stop.store(true, Ordering::Relaxed);
                    return Ok(None);
                }
                std::time::Duration::ZERO
            }
            None => timeout,
        };
        if !crossterm::event::poll(wait)? {
            return Ok(None);
        }
        Ok(Some(crossterm::event::read()?))
    }

    /// A hangup or terminate arrived: the app should end as if `q` was pressed.
    pub fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// The terminal went away (an SSH drop), rather than someone asking the app to end.
    pub fn hung_up(&self) -> bool {
        self.hangup.load(Ordering::Relaxed)
    }
}

impl Drop for TerminalSession {
    fn drop(&mut self) {
        ratatui::restore();
    }
}
