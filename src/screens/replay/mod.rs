//! `vramscope replay FILE`: the live screen fed by a recording or a snapshot trace. Space
//! pauses, > and < change the speed, n and N seek a step forward or back.

use crossbeam_channel::Sender;

use vramscope_core::record::player::{spawn_player, PlayerCommand, Script};
use vramscope_core::source::feed::bridge;
use vramscope_core::store::ranks::Ranks;
use vramscope_core::store::{LogKind, Store};

use super::live::keys::LiveKey;
use super::live::run::{event_loop, Controls, Screen, HISTORY_CAP};
use crate::terminal::TerminalSession;

const SPEEDS: std::ops::RangeInclusive<f64> = (1.0 / 64.0)..=64.0;

struct ReplayControls {
    player: Sender<PlayerCommand>,
    speed: f64,
}

impl Controls for ReplayControls {
    fn key(&mut self, a: LiveKey, ranks: &mut Ranks) -> bool {
        let store = ranks.shown_mut();
        let cmd = match a {
            LiveKey::Quit | LiveKey::Detach => return true,
            LiveKey::TogglePause | LiveKey::StepOnce => PlayerCommand::TogglePause,
            LiveKey::SpeedUp | LiveKey::SpeedDown => {
                let s = if a == LiveKey::SpeedUp { self.speed * 2.0 } else { self.speed / 2.0 };
                self.speed = s.clamp(*SPEEDS.start(), *SPEEDS.end());
                store.log_line(LogKind::Info, format!("replay speed ×{}", self.speed));
                PlayerCommand::Speed(self.speed)
            }
            LiveKey::NextStep => PlayerCommand::NextStep,
            LiveKey::PrevStep => PlayerCommand::PrevStep,
            LiveKey::ToggleRecord => {
                store.log_line(LogKind::Info, "replay: this is a recording already".into());
                return false;
            }
            _ => {
                store.log_line(LogKind::Info, "replay: knobs are fixed by the recording".into());
                return false;
            }
        };
        let _ = self.player.send(cmd);
        false
    }
}

/// Plays `script` on the screen at `speed` until the user quits.
pub fn run_replay(script: Script, speed: f64, screen: Screen) -> anyhow::Result<()> {
    anyhow::ensure!(SPEEDS.contains(&speed), "--speed must be between 1/64 and 64, got {speed}");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut store = Store::new(HISTORY_CAP);
    store.log_line(LogKind::Info, script.describe());
    store.title = Some(format!("replay of {}", script.name));
    let (tx, rx) = crossbeam_channel::bounded(256);
    let player = spawn_player(script, speed, tx);
    let mut controls = ReplayControls { player, speed };
    let mut session = TerminalSession::enter()?;
    rt.block_on(event_loop(&mut session, bridge(rx, None), &mut controls, &screen, Ranks::with(store, HISTORY_CAP)))
}

#[derive(clap::Args, Clone)]
pub struct ReplayArgs {
    /// A recording (vramscope run --record) or a memory snapshot pickle; `-` reads
    /// standard input.
    pub file: std::path::PathBuf,
    /// Playback speed relative to the recorded timing (1/64 to 64).
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// Print the recorded per-step lines instead of the screen.
    #[arg(long)]
    pub headless: bool,
    /// With --headless: one JSON object per step.
    #[arg(long)]
    pub json: bool,
    /// A snapshot's device to show first (default: the one with allocations); the others
    /// are a key (D) away.
    #[arg(long)]
    pub device: Option<usize>,
}

/// The per-step lines of a live headless run, from a recording, unpaced. The line on how
/// the recording ends goes to stderr, so stdout matches the live run's byte for byte.
pub fn run_replay_headless(script: &mut Script, json: bool, out: &mut impl std::io::Write) -> anyhow::Result<()> {
    let mut failed = None;
    let played = vramscope_core::report::headless::run(script.stream(&mut failed), json, out);
    match (failed, script.failure()) {
        // The error says where the file broke; nothing else to add.
        (Some(e), _) => Err(e.into()),
        (None, Some(why)) => Err(anyhow::anyhow!(why)),
        (None, None) => {
            eprintln!("{}", script.describe());
            played.map(|_| ())
        }
    }
}
