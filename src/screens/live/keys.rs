//! The live screen's key table (also the replay's, which offers a subset).

crate::actions! {
    /// The live screen's actions.
    LiveKey, quit = Quit;
    TogglePrecision, "toggle_precision", "p", "precision: fp32, bf16, fp16 autocast";
    CtxHalve, "ctx_halve", "[", "halve context length";
    CtxDouble, "ctx_double", "]", "double context length";
    BatchDown, "batch_down", "{", "batch size - 1";
    BatchUp, "batch_up", "}", "batch size + 1";
    ToggleMode, "toggle_mode", "m", "forward-only / full step";
    ToggleAttention, "toggle_attention", "a", "attention naive / fused";
    NextCheckpointing, "next_checkpointing", "k", "activation checkpointing: none, every block, every 2nd";
    Snapshot, "snapshot", "s", "save a memory_viz snapshot";
    TogglePause, "toggle_pause", "space", "pause / resume training";
    StepOnce, "step_once", ".", "one step while paused";
    FreezeView, "freeze_view", "f", "freeze the view (keeps ingesting)";
    PanLeft, "pan_left", "left", "pan back in time";
    PanRight, "pan_right", "right", "pan forward in time";
    GoLive, "go_live", "end", "back to live: follow the newest steps";
    ZoomIn, "zoom_in", "+", "zoom in";
    ZoomOut, "zoom_out", "-", "zoom out";
    ToggleAxis, "toggle_axis", "x", "x axis: events / time";
    ToggleBands, "toggle_bands", "c", "bands by category / by allocation";
    FocusTable, "focus_table", "tab", "focus the allocations table";
    SelectUp, "select_up", "up", "table: previous row (event log: scroll up)";
    SelectDown, "select_down", "down", "table: next row (event log: scroll down)";
    Inspect, "inspect", "enter", "open / close the selected allocation's inspector";
    EventLog, "event_log", "l", "open / close the event log";
    NextTheme, "next_theme", "t", "next theme";
    NextRank, "next_rank", "R", "show the next rank of a multi-rank job";
    NextDevice, "next_device", "D", "show the next GPU of a job that allocates on several";
    ToggleRecord, "toggle_record", "r", "start / stop recording the session";
    SpeedUp, "speed_up", ">", "replay: twice as fast";
    SpeedDown, "speed_down", "<", "replay: half as fast";
    NextStep, "next_step", "n", "replay: seek a step forward";
    PrevStep, "prev_step", "N", "replay: seek a step back";
    Help, "help", "?", "this help";
    Detach, "detach", "d", "quit, leaving the job running (py, attach)";
    Quit, "quit", "q", "quit (stops a job vramscope started; an attached one runs on)";
}

impl LiveKey {
    /// Whether the screen offers this key: a replay cannot turn the knobs, save or record,
    /// and only a replay has a pace to change or steps to seek.
    pub fn offered(self, replay: bool) -> bool {
        use LiveKey::*;
        match self {
            SpeedUp | SpeedDown | NextStep | PrevStep => replay,
            TogglePrecision | CtxHalve | CtxDouble | BatchDown | BatchUp | ToggleMode | ToggleAttention | NextCheckpointing | Snapshot | StepOnce | ToggleRecord | Detach => !replay,
            _ => true,
        }
    }

    /// The help line, in a replay's words where they differ.
    pub fn help_for(self, replay: bool) -> &'static str {
        match self {
            LiveKey::TogglePause if replay => "pause / resume the replay",
            LiveKey::Quit if replay => "quit",
            a => a.help(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{press, Key, KeyError, KeyMap};
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

    #[test]
    fn defaults_cover_every_action_from_the_issue() {
        let k: KeyMap<LiveKey> = KeyMap::default();
        assert_eq!(k.action(&press(KeyCode::Char('p'))), Some(LiveKey::TogglePrecision));
        assert_eq!(k.action(&press(KeyCode::Char(']'))), Some(LiveKey::CtxDouble));
        assert_eq!(k.action(&press(KeyCode::Char(' '))), Some(LiveKey::TogglePause));
        assert_eq!(k.action(&press(KeyCode::Tab)), Some(LiveKey::FocusTable));
        assert_eq!(k.action(&KeyEvent::new(KeyCode::Char('}'), KeyModifiers::SHIFT)), Some(LiveKey::BatchUp));
        assert_eq!(k.help_rows().len(), LiveKey::ALL.len());
        assert_eq!(k.action(&press(KeyCode::End)), Some(LiveKey::GoLive));
        assert_eq!(k.action(&press(KeyCode::Enter)), Some(LiveKey::Inspect));
        assert_eq!(Key::parse("end").unwrap().label(), "end");
    }

    #[test]
    fn live_and_replay_offer_their_own_keys() {
        assert!(LiveKey::TogglePrecision.offered(false) && !LiveKey::TogglePrecision.offered(true));
        assert!(LiveKey::NextStep.offered(true) && !LiveKey::NextStep.offered(false));
        assert!(LiveKey::Help.offered(true) && LiveKey::Help.offered(false));
        assert_eq!(LiveKey::TogglePause.help_for(true), "pause / resume the replay");
        assert_eq!(LiveKey::TogglePause.help_for(false), LiveKey::TogglePause.help());
    }

    #[test]
    fn a_file_overrides_and_duplicates_are_rejected() {
        let k = KeyMap::<LiveKey>::from_toml("[keys]\ntoggle_precision = \"P\"\n").unwrap();
        assert_eq!(k.action(&press(KeyCode::Char('P'))), Some(LiveKey::TogglePrecision));
        assert_eq!(k.action(&press(KeyCode::Char('p'))), None);
        // The file wins over a default on the same key (issue 34: such a file failed to
        // load): q saves a snapshot, quit has no key but ctrl-c, and the help says so.
        let k = KeyMap::<LiveKey>::from_toml("[keys]\nsnapshot = \"q\"\n").unwrap();
        assert_eq!(k.action(&press(KeyCode::Char('q'))), Some(LiveKey::Snapshot));
        assert_eq!(k.action(&press(KeyCode::Char('s'))), None);
        assert_eq!(k.key_of(LiveKey::Quit), None);
        assert!(k.help_rows().contains(&("unbound".to_string(), LiveKey::Quit.help())));
        // Only two of the file's own bindings on one key are an error.
        let e = KeyMap::<LiveKey>::from_toml("[keys]\nsnapshot = \"x\"\nhelp = \"x\"\n").unwrap_err();
        assert!(matches!(e, KeyError::Duplicate { .. }), "{e}");
        assert!(e.to_string().contains("'x' is bound to both help and snapshot"), "{e}");
        let e = KeyMap::<LiveKey>::from_toml("[keys]\nfly = \"x\"\n").unwrap_err();
        assert!(e.to_string().contains("unknown action 'fly'"));
        let e = KeyMap::<LiveKey>::from_toml("[keys]\nquit = \"xyz\"\n").unwrap_err();
        assert!(matches!(e, KeyError::BadKey { .. }));
    }

    #[test]
    fn ctrl_c_always_quits() {
        let k = KeyMap::<LiveKey>::from_toml("[keys]\nquit = \"Q\"\n").unwrap();
        assert_eq!(k.action(&KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)), Some(LiveKey::Quit));
    }
}
