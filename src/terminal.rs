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
        Ok(TerminalSession { terminal, stop, hangup })
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
