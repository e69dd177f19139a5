//! The real binary in a real terminal: tmux runs `vramscope`, keys go in with send-keys,
//! the screen comes back with capture-pane.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::tmux::{wait_file, Session};

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
    s.keys("k");
    s.keys("s");
    let screen = s.wait_for("bf16, ctx 128 and checkpointing in the header", 120, |sc| sc.contains("bf16") && sc.contains("ctx 128") && sc.contains("checkpoint every block"));
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
    let snap = vramscope_core::snapshot::read_snapshot_file(&saved).expect("the snapshot loads with our reader");
    assert!(snap.trace_entry_count() > 0);
    s.keys("q");
    assert_eq!(wait_file(&dir.path().join("exit"), 60).trim(), "0", "exit code");
    s.assert_terminal_restored();
}

#[test]
fn s_after_the_run_has_ended_says_so_and_saves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let cmd = format!("{bin} --model tiny --ctx 32 --batch 1 --steps 2 --snapshot-dir {d}; echo $? > {d}/exit", d = dir.path().display());
    let s = Session::start("vramscope-e2e-ended", &cmd);
    s.wait_for("the run to finish", 120, |sc| sc.contains("finished"));
    s.keys("s");
    s.keys("l");
    s.wait_for("the run has ended", 30, |sc| sc.contains("the run has ended"));
    let pickles = std::fs::read_dir(dir.path()).unwrap().flatten().filter(|e| e.path().extension().is_some_and(|x| x == "pickle")).count();
    assert_eq!(pickles, 0, "nothing was promised, nothing written");
    s.keys("q");
    assert_eq!(wait_file(&dir.path().join("exit"), 60).trim(), "0");
    s.assert_terminal_restored();
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
    s.assert_terminal_restored();
}

#[test]
fn view_opens_a_snapshot_moves_detail_inspects_and_quits_cleanly() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let file = common::fixture_path(common::MAGMA27);
    let cmd = format!("{bin} view {}; echo $? > {}/exit", file.display(), dir.path().display());
    let s = Session::start("vramscope-e2e-view", &cmd);
    let first = s.wait_for("the timeline", 30, |sc| sc.contains("active memory timeline") && sc.contains("peak 13.0 GiB"));
    assert_eq!(s.display("#{alternate_on}"), "1", "the viewer draws on the alternate screen");
    assert!(first.contains("detail 100%"), "{first}");
    s.keys("[");
    s.wait_for("less detail", 10, |sc| sc.contains("detail 50%"));
    s.keys("Enter");
    let inspected = s.wait_for("the inspector", 10, |sc| sc.contains(" allocation ") && sc.contains("requested") && sc.contains("frames (collapsed"));
    assert!(inspected.contains("address"), "{inspected}");
    s.keys("q");
    assert_eq!(wait_file(&dir.path().join("exit"), 20).trim(), "0", "exit code");
    s.assert_terminal_restored();
}

#[test]
fn view_behind_the_loading_screen_opens_and_a_truncated_file_fails_cleanly() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let d = dir.path().display();
    let long = dir.path().join("long.pickle");
    common::long_snapshot_file(common::KKAITLYN, 40, &long);
    // `--loading-screen-after 0` draws the loading screen however fast the file reads.
    let cmd = format!("{bin} view {} --loading-screen-after 0; echo $? > {d}/exit", long.display());
    let s = Session::start("vramscope-e2e-load", &cmd);
    s.wait_for("the loaded viewer", 60, |sc| sc.contains("active memory timeline · ") && sc.contains(" · actions ") && sc.contains("detail "));
    s.keys("q");
    assert_eq!(wait_file(&dir.path().join("exit"), 20).trim(), "0", "exit code");
    let bytes = std::fs::read(&long).unwrap();
    let cut = dir.path().join("cut.pickle");
    std::fs::write(&cut, &bytes[..bytes.len() * 3 / 5]).unwrap();
    let cmd = format!("{bin} view {} --loading-screen-after 0 2> {d}/err; echo $? > {d}/exit2", cut.display());
    let s = Session::start("vramscope-e2e-cut", &cmd);
    assert_eq!(wait_file(&dir.path().join("exit2"), 60).trim(), "2", "a bad file is exit code 2");
    let err = std::fs::read_to_string(dir.path().join("err")).unwrap();
    assert!(err.lines().count() == 1 && err.contains("cut.pickle"), "one line naming the file: {err}");
    s.assert_terminal_restored();
}

/// The pid of `name`, a child of `parent`.
fn child_named(parent: &str, name: &str) -> String {
    let out = Command::new("pgrep").args(["-P", parent, name]).output().unwrap();
    let pid = String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("").trim().to_string();
    assert!(!pid.is_empty(), "{name} runs under {parent}");
    pid
}

#[test]
fn the_screen_survives_the_engine_being_killed_says_why_and_keeps_what_it_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let d = dir.path().display();
    let cmd = format!("{bin} --model tiny --ctx 64 --batch 2 --snapshot-dir {d} --record {d}/s.vsrec; echo $? > {d}/exit");
    let s = Session::start("vramscope-e2e-kill", &cmd);
    s.wait_for("a finished step", 120, |sc| shown_step(sc).is_some_and(|n| n >= 1));
    let vramscope = child_named(&s.display("#{pane_pid}"), "vramscope");
    let engine = child_named(&vramscope, "vramscope-engin");
    assert!(Command::new("kill").args(["-KILL", &engine]).status().unwrap().success());
    let screen = s.wait_for("the engine's end on screen", 30, |sc| sc.contains("was killed by signal 9 (SIGKILL)"));
    assert!(screen.contains("the training engine"), "{screen}");
    assert_eq!(s.display("#{alternate_on}"), "1", "the screen stays up after its engine dies");
    s.keys("q");
    assert_eq!(wait_file(&dir.path().join("exit"), 60).trim(), "0", "exit code");
    s.assert_terminal_restored();
    // What the session recorded is all there, up to the kill and the reason for it.
    let replay = Command::new(bin).args(["replay", "--headless"]).arg(dir.path().join("s.vsrec")).output().unwrap();
    let err = String::from_utf8_lossy(&replay.stderr);
    assert!(err.contains("recording closed normally") && err.contains("killed by signal 9"), "{err}");
    assert!(String::from_utf8_lossy(&replay.stdout).contains("step   0"));
}

#[test]
fn py_draws_the_jobs_phases_s_writes_a_snapshot_pytorch_reads_and_q_stops_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let d = dir.path().display();
    let script = common::repo_root().join("tests/py/train_transformer.py");
    let cmd = format!(
        "{bin} py --snapshot-dir {d} {} --steps 1000 --sleep 0.2 --out {d}/never.json; echo $? > {d}/exit",
        script.display()
    );
    let s = Session::start("vramscope-e2e-py", &cmd);
    let screen = s.wait_for("steps and the phase row", 180, |sc| {
        shown_step(sc).is_some_and(|n| n >= 3) && sc.lines().any(|l| l.contains('F') && l.contains('B') && l.contains('O') && l.contains('·'))
    });
    assert!(screen.contains("train_transformer") && screen.contains("active memory"), "{screen}");
    s.keys("s");
    s.wait_for("the snapshot saved", 60, |sc| sc.contains("saved:"));
    let snap = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.path()).find(|p| p.extension().is_some_and(|e| e == "pickle")).expect("a snapshot file");
    let stats = Command::new(common::python()).args(["-m", "torch.cuda._memory_viz", "stats"]).arg(&snap).current_dir(dir.path()).output().unwrap();
    assert!(stats.status.success(), "torch.cuda._memory_viz reads it: {}", String::from_utf8_lossy(&stats.stderr));
    s.keys("q");
    assert_eq!(wait_file(&dir.path().join("exit"), 60).trim(), "0", "exit code");
    s.assert_terminal_restored();
    // The pane's shell names the file too, and may take a moment to go after writing the
    // exit code; the job, left running, would stay for minutes.
    // So does the tmux server's own command line when this session started the server.
    let running = || {
        let pids = Command::new("pgrep").args(["-f", &format!("{d}/never.json")]).output().unwrap().stdout;
        String::from_utf8_lossy(&pids).split_whitespace().any(|pid| !std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().starts_with("tmux"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while running() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(!running(), "q stopped the job it started");
}

/// Issue 35 (and 33's dropped events): the densest job a real script makes (an MLP trained
/// with gradient accumulation, ~550 allocator events a step at full speed, torch on both
/// cores) watched live loses no event.
#[test]
fn a_dense_job_watched_live_loses_no_event() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let d = dir.path().display();
    let script = common::repo_root().join("tests/py/dense_mlp.py");
    let cmd = format!("{bin} py {} --steps 100000; echo $? > {d}/exit", script.display());
    let s = Session::start("vramscope-e2e-dense", &cmd);
    let screen = s.wait_for("2000 steps", 240, |sc| shown_step(sc).is_some_and(|n| n >= 2000));
    assert!(screen.contains("capture ok") && !screen.contains("capture dropping"), "{screen}");
    s.keys("q");
    wait_file(&dir.path().join("exit"), 60);
    s.assert_terminal_restored();
}

/// The socket directory's files named for a launched job (`<job>-r<rank>.sock` / `.token`).
fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir).map(|r| r.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.ends_with(".sock") || n.ends_with(".token")).collect()).unwrap_or_default()
}

/// Issue 34: a paused `py` job. `d` left it paused at 0% CPU until someone attached, and `q`
/// showed nothing for 10 s before a SIGTERM. Now `d` resumes it (the job runs to its end
/// unwatched) and `q` says it is stopping the job and stops it within seconds; neither
/// leaves a socket behind.
#[test]
fn a_paused_job_is_resumed_when_left_and_stopped_promptly_on_q() {
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let script = common::repo_root().join("tests/py/train_transformer.py");
    for key in ["d", "q"] {
        let dir = tempfile::tempdir().unwrap();
        let sockets = dir.path().join("sockets");
        let d = dir.path().display();
        let cmd = format!(
            "VRAMSCOPE_SOCKET_DIR={} {bin} py {} --steps 40 --sleep 0.05 --out {d}/out.json; echo $? > {d}/exit",
            sockets.display(),
            script.display()
        );
        let s = Session::start(&format!("vramscope-e2e-paused-{key}"), &cmd);
        s.wait_for("a step", 180, |sc| shown_step(sc).is_some_and(|n| n >= 1));
        s.keys("Space");
        s.wait_for("PAUSED", 30, |sc| sc.contains("PAUSED"));
        let left = std::time::Instant::now();
        s.keys(key);
        assert_eq!(wait_file(&dir.path().join("exit"), 30).trim(), "0", "{key}: exit code");
        s.assert_terminal_restored();
        if key == "d" {
            s.wait_for("the resumed job's word", 10, |sc| sc.contains("the job runs on (it was paused: resumed)"));
            // Resumed, the job trains its 40 steps unwatched and writes its figures.
            wait_file(&dir.path().join("out.json"), 120);
        } else {
            let sc = s.wait_for("the stop said", 10, |sc| sc.contains("vramscope: the job "));
            assert!(sc.contains("stopping the job…"), "{sc}");
            assert!(left.elapsed() < Duration::from_secs(8), "q on a paused job took {:?}", left.elapsed());
            assert!(!dir.path().join("out.json").exists(), "q stopped the job before its end");
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !leftovers(&sockets).is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(leftovers(&sockets), Vec::<String>::new(), "{key}: the job's files are gone");
    }
}
