//! Watching a user's own PyTorch job (issue "Watch any PyTorch job live"): plain scripts
//! under tests/py, written as users write them, run with `vramscope py` (or
//! `python -m vramscope_hook` and attached to), on CPU. What vramscope shows is held to
//! what the scripts themselves report.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{python, repo_root, vramscope};
use vramscope_core::channel::Endpoint;
use vramscope_core::event::{Action, Batch, Phase};
use vramscope_core::record::player::Script;
use vramscope_core::source::job::JobSource;
use vramscope_core::stream::{Control, Incoming, Report, StepReport};

fn script(name: &str) -> PathBuf {
    repo_root().join("tests/py").join(name)
}

/// A private socket directory for one test, so tests never see each other's jobs.
fn sockets(t: &tempfile::TempDir) -> PathBuf {
    let d = t.path().join("sockets");
    vramscope_core::channel::dir::ensure_private_dir(&d).unwrap();
    d
}

/// Items per rank from a recording of a session.
fn recorded(path: &Path) -> HashMap<u32, Vec<Incoming>> {
    let mut script = Script::open(path).unwrap();
    let mut failed = None;
    let mut by_rank: HashMap<u32, Vec<Incoming>> = HashMap::new();
    for (rank, item) in script.stream(&mut failed) {
        by_rank.entry(rank).or_default().push(item);
    }
    assert!(failed.is_none(), "{failed:?}");
    by_rank
}

fn batches(items: &[Incoming]) -> impl Iterator<Item = &Batch> {
    items.iter().filter_map(|i| if let Incoming::Batch(b) = i { Some(b) } else { None })
}

fn steps(items: &[Incoming]) -> Vec<&StepReport> {
    items.iter().filter_map(|i| if let Incoming::Report(Report::Step(s)) = i { Some(s) } else { None }).collect()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// The phases step `step` ran through, in order (Other left out, repeats merged).
fn phase_order(items: &[Incoming], step: u32) -> Vec<Phase> {
    let mut order = Vec::new();
    for m in batches(items).flat_map(|b| &b.marks).filter(|m| m.step == step && m.phase != Phase::Other) {
        if order.last() != Some(&m.phase) {
            order.push(m.phase);
        }
    }
    order
}

/// Names the stream gave allocations (scopes interned) and modules.
fn names(items: &[Incoming]) -> BTreeSet<String> {
    batches(items).flat_map(|b| b.scopes.iter().map(|(_, n)| n.clone())).collect()
}

/// Issue 34: a job killed outright cannot remove its socket; the vramscope that started it
/// does, and says how it ended rather than that it "sent a broken stream".
#[test]
fn a_killed_job_leaves_no_socket_behind_and_is_said_to_be_killed() {
    let t = tempfile::tempdir().unwrap();
    let dir = sockets(&t);
    let out = vramscope()
        .env("VRAMSCOPE_SOCKET_DIR", &dir)
        .args(["py", "--headless", "--"])
        .arg(python())
        .args(["-c", "import os, signal, torch; torch.ones(8); os.kill(os.getpid(), signal.SIGKILL)"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("was killed by signal 9 (SIGKILL)") && !err.contains("broken stream"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn a_users_transformer_streams_exact_totals_its_own_names_and_phases_in_order() {
    let t = tempfile::tempdir().unwrap();
    let (rec, fig) = (t.path().join("s.vsrec"), t.path().join("fig.json"));
    let out = vramscope()
        .env("VRAMSCOPE_SOCKET_DIR", sockets(&t))
        .args(["py", "--headless", "--json", "--snapshot-dir"])
        .arg(t.path())
        .arg("--record")
        .arg(&rec)
        .arg(script("train_transformer.py"))
        .args(["--steps", "3", "--out"])
        .arg(&fig)
        .arg("--timings")
        .arg(t.path().join("timings.txt"))
        .assert()
        .success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    // With --json stdout is vramscope's lines alone, whatever the job prints and when.
    let lines: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(lines.iter().all(|l| l["rank"] == 0 && l["mode"] == "train"), "{stdout}");
    assert!(stderr.contains("trained 3 steps"), "the script's own output passes through, on stderr: {stderr}");
    // Each step's time is the step's: the first one's does not take in torch's import and
    // the model's construction (on a GPU, CUDA's start-up: 6-7 s against a 0.5 s step).
    let own: Vec<f64> = std::fs::read_to_string(t.path().join("timings.txt")).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    for (line, own) in lines.iter().zip(&own) {
        let shown = line["step_time_s"].as_f64().unwrap();
        assert!(shown <= own * 1.5 + 0.05, "step {}: {shown} s shown, the script's own {own} s", line["step"]);
    }
    let figures = json(&fig);
    let items = recorded(&rec).remove(&0).expect("rank 0 streamed");

    // Every alloc is freed or still live, and what is live at each step's end is the job's
    // total then.
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut checked = 0;
    for item in &items {
        match item {
            Incoming::Batch(b) => {
                for e in &b.events {
                    match e.action {
                        Action::Alloc => assert!(live.insert(e.addr, e.size).is_none(), "{:#x} allocated twice", e.addr),
                        Action::FreeRequested => assert!(live.remove(&e.addr).is_some_and(|s| s == e.size), "a free of {:#x} matches its alloc", e.addr),
                        _ => {}
                    }
                }
            }
            Incoming::Report(Report::Step(s)) => {
                assert_eq!(live.values().sum::<u64>(), s.live_bytes, "step {}: the stream's live bytes are the job's", s.step);
                assert_eq!(s.category_bytes.values().sum::<u64>(), s.live_bytes);
                checked += 1;
            }
            _ => {}
        }
    }
    assert_eq!(checked, 3);
    let steps = steps(&items);
    let last = steps.last().unwrap();

    // Parameters are the script's own bytes, and AdamW's two moments are twice that.
    let params = figures["parameter_bytes"].as_u64().unwrap();
    assert_eq!(last.category_bytes["parameter"], params, "parameter bytes = sum of p.nbytes");
    assert_eq!(last.category_bytes["optimizer_state"], 2 * params);
    assert_eq!(figures["optimizer_state_bytes"].as_u64().unwrap(), 2 * params);

    // Phases run in order within each step after the first: zero_grad, forward, backward,
    // optimizer (the script zeroes before its forward).
    for step in 1..3u32 {
        assert_eq!(phase_order(&items, step), [Phase::ZeroGrad, Phase::Forward, Phase::Backward, Phase::Optimizer], "step {step}");
    }

    // Modules, parameters, gradients and AdamW state carry the job's own names.
    let names = names(&items);
    for m in ["layers.0.attn", "layers.1.ffn", "lm_head", "token_embeddings"] {
        assert!(names.contains(m), "module {m} in {names:?}");
    }
    for p in figures["parameters"].as_object().unwrap().keys() {
        assert!(names.contains(p), "parameter {p} named");
    }
    assert!(names.contains("exp_avg of layers.0.attn.q_proj.weight"), "{names:?}");
    assert!(names.contains("grad of lm_head.weight"), "{names:?}");
}

#[test]
fn both_ranks_of_a_ddp_job_under_torchrun_stream_with_their_own_names() {
    let t = tempfile::tempdir().unwrap();
    let rec = t.path().join("ddp.vsrec");
    let fig = t.path().join("rank{rank}.json");
    let out = vramscope()
        .env("VRAMSCOPE_SOCKET_DIR", sockets(&t))
        .args(["py", "--headless", "--json", "--record"])
        .arg(&rec)
        .args(["--", "torchrun", "--nproc-per-node", "2", "--standalone"])
        .arg(script("train_ddp.py"))
        .args(["--steps", "3", "--out"])
        .arg(&fig)
        .timeout(Duration::from_secs(240))
        .assert()
        .success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    let lines: Vec<serde_json::Value> = stdout.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect();
    let by_rank = recorded(&rec);
    for rank in [0u64, 1] {
        let mine: Vec<_> = lines.iter().filter(|l| l["rank"] == rank).collect();
        assert_eq!(mine.len(), 3, "rank {rank} streamed its 3 steps: {stdout}");
        let f = json(&t.path().join(format!("rank{rank}.json")));
        assert_eq!(mine[2]["category_bytes"]["parameter"], f["parameter_bytes"], "rank {rank}'s parameters");
        let names = names(&by_rank[&(rank as u32)]);
        for p in f["parameters"].as_array().unwrap() {
            assert!(names.contains(p.as_str().unwrap()), "rank {rank} names {p} as the job does (no DDP prefix): {names:?}");
        }
    }
}

#[test]
fn an_oom_in_the_job_is_snapshotted_before_the_script_sees_the_error() {
    let t = tempfile::tempdir().unwrap();
    let fig = t.path().join("fig.json");
    let out = vramscope()
        .env("VRAMSCOPE_SOCKET_DIR", sockets(&t))
        .args(["py", "--headless", "--snapshot-dir"])
        .arg(t.path())
        .arg(script("train_transformer.py"))
        .args(["--steps", "3", "--oom-at", "1", "--out"])
        .arg(&fig)
        .assert()
        .success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert!(stdout.contains("out of memory at step 1 (forward)"), "{stdout}");
    let oom = &json(&fig)["oom"];
    let caught: Vec<&str> = oom["snapshots_when_caught"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(caught, ["train_transformer_rank0_step1_oom.pickle"], "on disk before the error reached the script");
    let snap = vramscope_core::snapshot::read_snapshot_file(&t.path().join(caught[0])).unwrap();
    let last = snap.device_traces[0].last().unwrap();
    assert_eq!((last.action, last.size), (Action::Oom, 1 << 50), "the snapshot ends with the failed request");
    assert!(stdout.contains("trained 3 steps"), "the job went on after handling its OOM");
}

/// Waits until `pred` holds for the lines a child printed so far.
fn wait_lines(r: &mut impl std::io::BufRead, secs: u64, pred: impl Fn(&str) -> bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut lines = Vec::new();
    while Instant::now() < deadline {
        let mut l = String::new();
        if r.read_line(&mut l).unwrap_or(0) == 0 {
            break;
        }
        let done = pred(&l);
        lines.push(l);
        if done {
            return lines;
        }
    }
    panic!("not seen in {secs} s: {lines:?}");
}

#[test]
fn killing_the_viewer_leaves_the_job_running_and_killing_the_job_tells_the_viewer() {
    let t = tempfile::tempdir().unwrap();
    let bin = assert_cmd::cargo::cargo_bin("vramscope");
    let start = |fig: &Path| {
        Command::new(&bin)
            .env("VRAMSCOPE_SOCKET_DIR", sockets(&t))
            .args(["py", "--headless"])
            .arg(script("train_transformer.py"))
            .args(["--steps", "8", "--sleep", "0.5", "--out"])
            .arg(fig)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // The viewer dies: the job finishes its 8 steps and writes its figures.
    let fig = t.path().join("survived.json");
    let mut viewer = start(&fig);
    let mut out = std::io::BufReader::new(viewer.stdout.take().unwrap());
    wait_lines(&mut out, 120, |l| l.starts_with("step   0"));
    viewer.kill().unwrap();
    viewer.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !fig.exists() {
        assert!(Instant::now() < deadline, "the job did not finish after its viewer was killed");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(json(&fig)["ctx_used"].as_array().unwrap().len(), 8, "all steps ran");

    // The job dies: the viewer says so and fails.
    let mut viewer = start(&t.path().join("never.json"));
    let mut out = std::io::BufReader::new(viewer.stdout.take().unwrap());
    wait_lines(&mut out, 120, |l| l.starts_with("step   0"));
    let job = std::fs::read_to_string(format!("/proc/{}/task/{}/children", viewer.id(), viewer.id())).unwrap();
    let job: i32 = job.split_whitespace().next().expect("the job is the viewer's child").parse().unwrap();
    unsafe { libc::kill(job, libc::SIGKILL) };
    let status = viewer.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut viewer.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success());
    assert!(err.contains("was killed by signal 9 (SIGKILL)"), "{err}");
}

/// A job started as `python -m vramscope_hook`, listening in `dir`.
fn start_standalone(dir: &Path, snapshots: &Path, args: &[&str]) -> std::process::Child {
    Command::new(python())
        .args(["-m", "vramscope_hook", "--snapshot-dir"])
        .arg(snapshots)
        .arg(script("train_transformer.py"))
        .args(args)
        .env("PYTHONPATH", repo_root().join("python"))
        .env("VRAMSCOPE_HOOK_CORE", common::built("libvramscope_hook.so"))
        .env("VRAMSCOPE_SOCKET_DIR", dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The socket the only job in `dir` listens on, once it does.
fn job_socket(dir: &Path) -> Endpoint {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let socks: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "sock")).collect();
        if let [s] = &socks[..] {
            if std::os::unix::net::UnixStream::connect(s).is_ok() {
                return Endpoint::Unix(s.clone());
            }
        }
        assert!(Instant::now() < deadline, "no job socket in {}", dir.display());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn next_report(source: &JobSource, secs: u64, mut want: impl FnMut(&Report) -> bool) -> Report {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        match source.receiver().recv_timeout(Duration::from_millis(200)) {
            Ok((_, Incoming::Report(r))) if want(&r) => return r,
            Ok(_) | Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(e) => panic!("the stream ended: {e}"),
        }
    }
    panic!("no such report in {secs} s");
}

#[test]
fn a_job_started_on_its_own_takes_knobs_pause_and_snapshots_and_survives_detach_and_reattach() {
    let t = tempfile::tempdir().unwrap();
    let dir = sockets(&t);
    let mut job = start_standalone(&dir, t.path(), &["--steps", "30", "--sleep", "0.3", "--ctx", "16"]);
    let ep = job_socket(&dir);
    let source = JobSource::attach("job".into(), &[(0, ep.clone())], None).unwrap();
    let info = next_report(&source, 60, |r| matches!(r, Report::Started(i) if i.knob("ctx").is_some()));
    let Report::Started(info) = info else { unreachable!() };
    assert_eq!(info.knob("ctx"), Some("16"), "the script's declared knob and its value");

    // A knob key doubles ctx: a later step runs with 32.
    source.send(&Control::SetKnob { name: "ctx".into(), value: "32".into() });
    next_report(&source, 60, |r| matches!(r, Report::Knob(k) if k.knob == "ctx" && k.to == "32"));
    next_report(&source, 60, |r| matches!(r, Report::Step(s) if s.ctx == 32));

    // `s`: a snapshot of the job, written where its owner said, that PyTorch's tool reads.
    source.send(&Control::Snapshot);
    let Report::SnapshotSaved { path, .. } = next_report(&source, 60, |r| matches!(r, Report::SnapshotSaved { .. })) else { unreachable!() };
    assert_eq!(path.parent(), Some(t.path()), "{}", path.display());
    let stats = Command::new(python()).args(["-m", "torch.cuda._memory_viz", "stats"]).arg(&path).current_dir(t.path()).output().unwrap();
    assert!(stats.status.success(), "memory_viz reads it: {}", String::from_utf8_lossy(&stats.stderr));

    // Pause holds the job at a step boundary; resume lets it go on.
    source.send(&Control::Pause);
    next_report(&source, 60, |r| *r == Report::Paused(true));
    // Unpaused, a step ends every 0.3 s: none may end in 2 s of pause.
    let held = Instant::now() + Duration::from_secs(2);
    while let Some(left) = held.checked_duration_since(Instant::now()) {
        if let Ok((_, Incoming::Report(Report::Step(s)))) = source.receiver().recv_timeout(left) {
            panic!("step {} ran while paused", s.step);
        }
    }
    source.send(&Control::Resume);
    next_report(&source, 60, |r| *r == Report::Paused(false));
    next_report(&source, 60, |r| matches!(r, Report::Step(_)));

    // Detach (the job runs on), then attach again: the new viewer's totals agree with the
    // job's from its first step report.
    drop(source);
    std::thread::sleep(Duration::from_millis(800));
    let again = JobSource::attach("job".into(), &[(0, ep)], None).unwrap();
    let mut live: HashMap<u64, u64> = HashMap::new();
    // A viewer that attaches first hears the steps so far, then the live allocations; the
    // first step after those is one it saw happen.
    let mut history: Option<u64> = None;
    let mut state_seen = false;
    let report = loop {
        match again.receiver().recv_timeout(Duration::from_secs(60)).expect("the job streams to the new viewer").1 {
            Incoming::Report(Report::Step(s)) if !state_seen => history = history.max(Some(s.step)),
            Incoming::Batch(b) => {
                state_seen = true;
                common::apply_events(&mut live, &b.events);
            }
            Incoming::Report(Report::Step(s)) if history.is_none_or(|h| s.step > h) => break s,
            _ => {}
        }
    };
    assert_eq!(live.values().sum::<u64>(), report.live_bytes, "a viewer that attaches mid-run agrees with the job");
    assert!(job.wait().unwrap().success(), "the job finished");
}

/// Runs `tests/py/hook_lifecycle.py CASE` with the hook importable (as
/// `python -m vramscope_hook` has it); its JSON line and its stderr.
fn lifecycle(case: &str, t: &tempfile::TempDir) -> (serde_json::Value, String) {
    let out = Command::new(python())
        .arg(script("hook_lifecycle.py"))
        .arg(case)
        .env("PYTHONPATH", repo_root().join("python"))
        .env("VRAMSCOPE_HOOK_CORE", common::built("libvramscope_hook.so"))
        .env("VRAMSCOPE_SOCKET_DIR", sockets(t))
        .env("VRAMSCOPE_SNAPSHOT_DIR", t.path())
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string());
    assert!(out.status.success(), "{case}: {stdout}{stderr}");
    let line = stdout.lines().rfind(|l| l.starts_with('{')).unwrap_or_else(|| panic!("{case}: no JSON line: {stdout}{stderr}"));
    (serde_json::from_str(line).unwrap(), stderr)
}

#[test]
fn the_hook_attaches_to_cuda_when_the_job_initialises_it_and_not_before() {
    let t = tempfile::tempdir().unwrap();
    let (out, stderr) = lifecycle("cuda-order", &t);
    // Queued on torch's lazy init, not run: nothing initialised CUDA or made a context.
    assert_eq!(out["queued"], 1, "{out}");
    assert_eq!(out["inits"], serde_json::json!([]), "{out}");
    // Until then the job's CPU tensors are recorded (a CPU job on a GPU machine is watched)...
    assert_eq!(out["recording_before"], true, "{out}");
    // ...and from CUDA init on they are not: a CUDA job's CPU tensors are not device memory.
    assert_eq!(out["recording_after"], false, "{out}");
    // The callback reached the real attach, which looks at the allocator itself: here,
    // with no GPU, CUDA's caching allocator was never initialised, and it says so.
    assert!(stderr.contains("not following CUDA memory") && stderr.contains("not initialised yet"), "{stderr}");
}

#[test]
fn a_forked_worker_records_nothing_and_leaves_the_jobs_session_alone() {
    let t = tempfile::tempdir().unwrap();
    let (out, stderr) = lifecycle("fork", &t);
    assert_eq!(out["child"]["pending"], 0, "nothing buffered for a drain that never comes: {out}");
    assert_eq!(out["child"]["active"], false, "{out}");
    assert_eq!(out["child_status"], 0, "the child exits cleanly, its atexit included: {out} {stderr}");
    assert_eq!(out["parent_active"], true, "{out}");
}

#[test]
fn the_shims_buffer_is_bounded_and_counts_what_it_drops() {
    let t = tempfile::tempdir().unwrap();
    let (out, _) = lifecycle("bound", &t);
    assert_eq!(out["pending"], 1 << 20, "{out}");
    assert!(out["dropped"].as_u64().unwrap() >= 64 * 256, "{out}");
}

#[test]
fn processes_the_job_starts_do_not_load_the_hook() {
    let t = tempfile::tempdir().unwrap();
    let out = vramscope()
        .env("VRAMSCOPE_SOCKET_DIR", sockets(&t))
        .args(["py", "--headless", "--snapshot-dir"])
        .arg(t.path())
        .arg(script("hook_lifecycle.py"))
        .arg("children")
        .assert()
        .success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    let line = stdout.lines().rfind(|l| l.starts_with("{\"self_active\"")).unwrap_or_else(|| panic!("{stdout}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["self_active"], true, "{v}");
    assert_eq!(v["child"], serde_json::json!({"hook_env": null, "active": false}), "{v}");
}

#[test]
fn a_job_dying_of_an_oom_the_allocator_never_saw_says_so_and_its_status_is_passed_on() {
    let t = tempfile::tempdir().unwrap();
    let rec = t.path().join("crash.vsrec");
    let out = vramscope()
        .env("VRAMSCOPE_SOCKET_DIR", sockets(&t))
        .args(["py", "--headless", "--snapshot-dir"])
        .arg(t.path())
        .arg("--record")
        .arg(&rec)
        .arg(script("hook_lifecycle.py"))
        .arg("cublas-oom")
        .assert()
        .code(1);
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(stdout.contains("out of memory at step 0") && stdout.contains("CUBLAS_STATUS_ALLOC_FAILED"), "{stdout}\n{stderr}");
    assert!(stderr.contains("Traceback"), "the job's own traceback still reaches the user: {stderr}");
    assert!(stderr.contains("vramscope: the job exited with code 1"), "{stderr}");
    // The screen learns it too: the job crashed, it did not just finish.
    let items = recorded(&rec).remove(&0).unwrap();
    let exited: Vec<&Report> = items.iter().filter_map(|i| if let Incoming::Report(r @ Report::Exited { .. }) = i { Some(r) } else { None }).collect();
    assert_eq!(exited, [&Report::Exited { how: "exited with code 1".into(), success: false }]);
}

#[test]
fn a_job_without_sequences_reports_samples_per_second_counting_every_micro_batch() {
    let t = tempfile::tempdir().unwrap();
    let run = |json: bool| {
        let mut cmd = vramscope();
        cmd.env("VRAMSCOPE_SOCKET_DIR", sockets(&t)).args(["py", "--headless", "--snapshot-dir"]).arg(t.path());
        if json {
            cmd.arg("--json");
        }
        let out = cmd.arg(script("hook_lifecycle.py")).arg("mlp").assert().success();
        String::from_utf8_lossy(&out.get_output().stdout).to_string()
    };
    let stdout = run(true);
    let steps: Vec<serde_json::Value> = stdout.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(steps.len(), 3, "{stdout}");
    for s in &steps {
        // [32, 256] features are not a context length; 4 micro-batches of 32 are 128 samples.
        assert_eq!((s["ctx"].as_i64(), s["batch"].as_i64()), (Some(0), Some(128)), "{s}");
        assert_eq!(s["tokens_per_s"].as_f64(), Some(0.0), "{s}");
        assert!(s["samples_per_s"].as_f64().unwrap() > 0.0, "{s}");
        // The inputs are a micro-batch's [32, 256] fp32 features and its 32 int64 labels.
        // The logits the loss module is called on are the model's activation, not an input.
        assert_eq!(s["category_peak_bytes"]["input"].as_u64(), Some(32 * 256 * 4 + 32 * 8), "{s}");
    }
    let text = run(false);
    let line = text.lines().find(|l| l.contains("step   1")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("batch 128") && line.contains("samples/s") && !line.contains("ctx") && !line.contains("tok/s"), "{line}");
}

/// `--check-growth` on the leaks people write and on healthy loops that move memory about:
/// each leak is named, exit 1; each healthy loop passes, exit 0.
#[test]
fn the_growth_check_finds_the_leaks_people_write_and_passes_healthy_loops() {
    let t = tempfile::tempdir().unwrap();
    let check = |case: &str| {
        let out = vramscope()
            .env("VRAMSCOPE_SOCKET_DIR", sockets(&t))
            .args(["py", "--headless", "--check-growth", "--snapshot-dir"])
            .arg(t.path())
            .arg(script("growth_cases.py"))
            .arg(case)
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
    };
    // Each named by the phase that made what is kept: the cache's clone is made after
    // zero_grad, in its phase.
    for (leak, phase) in [("kept-outputs", "forward"), ("kept-losses", "forward"), ("cache", "zero_grad")] {
        let (code, said) = check(leak);
        assert_eq!(code, Some(1), "{leak}: {said}");
        assert!(said.contains(&format!("memory keeps growing: phase {phase}")), "{leak}: {said}");
    }
    for healthy in ["warmup", "varying-shapes", "periodic-eval", "no-zero-grad"] {
        let (code, said) = check(healthy);
        assert_eq!(code, Some(0), "{healthy}: {said}");
        assert!(said.contains("no growth: live memory at step end is steady over 7 steps after the first"), "{healthy}: {said}");
    }
}

/// `vramscope py --headless FLAGS tests/py/hook_lifecycle.py CASE` with `env`, which must
/// succeed: its stdout, its stderr, and the JSON step lines among its stdout (`--json`).
fn lifecycle_headless(t: &tempfile::TempDir, case: &str, flags: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> (String, String, Vec<serde_json::Value>) {
    let mut cmd = vramscope();
    cmd.env("VRAMSCOPE_SOCKET_DIR", sockets(t)).args(["py", "--headless"]).args(flags).arg("--snapshot-dir").arg(t.path());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.arg(script("hook_lifecycle.py")).arg(case).assert().success();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.get_output().stdout).to_string(), String::from_utf8_lossy(&out.get_output().stderr).to_string());
    let steps = stdout.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect();
    (stdout, stderr, steps)
}

/// Where the shim cannot follow CUDA's allocator (its headers were not beside torch, or no
/// compiler), CUDA memory comes from PyTorch's own memory history, read at every phase
/// boundary: the peaks and reserved bytes are the history's, phase by phase, what was live
/// before it began included (tests/py/hook_lifecycle.py's `history` fakes the allocator).
#[test]
fn without_the_shims_cuda_capture_the_figures_come_from_pytorchs_memory_history() {
    let t = tempfile::tempdir().unwrap();
    let (stdout, stderr, steps) = lifecycle_headless(&t, "history", &["--json"], &[]);
    assert_eq!(steps.len(), 2, "{stdout}{stderr}");
    const MIB: u64 = 1 << 20;
    let phase = |s: &serde_json::Value, p: &str| s["phase_peak_bytes"][p].as_u64();
    assert_eq!(steps[0]["peak_allocated_bytes"].as_u64(), Some(9 * MIB / 2), "{}", steps[0]);
    assert_eq!(
        (phase(&steps[0], "forward"), phase(&steps[0], "backward"), phase(&steps[0], "optimizer")),
        (Some(9 * MIB / 2), Some(5 * MIB / 2), Some(7 * MIB / 2)),
        "{}",
        steps[0]
    );
    assert_eq!(steps[0]["reserved_bytes"].as_u64(), Some(22 * MIB), "{}", steps[0]);
    assert_eq!(steps[1]["peak_allocated_bytes"].as_u64(), Some(15 * MIB / 2), "{}", steps[1]);
    // Cheapest recording (no stacks), bounded, and restarted after each read.
    let calls = stderr.lines().rfind(|l| l.starts_with("{\"calls\"")).unwrap_or_else(|| panic!("{stderr}"));
    let calls: serde_json::Value = serde_json::from_str(calls).unwrap();
    let first = &calls["calls"][0];
    assert_eq!((first["enabled"].as_str(), first["context"].as_str(), first["max_entries"].as_u64()), (Some("all"), None, Some(200_000)), "{first}");
    assert!(calls["calls"].as_array().unwrap().len() >= 8, "read at every phase boundary: {calls}");
}

/// No compiler: the job runs watched all the same, and says in one line what it shows.
#[test]
fn without_a_compiler_the_job_runs_and_says_what_is_not_captured() {
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    let env = [("VRAMSCOPE_HOOK_CACHE", cache.as_os_str()), ("CXX", "/nonexistent/c++".as_ref())];
    let (stdout, stderr, steps) = lifecycle_headless(&t, "mlp", &["--json"], &env);
    let said: Vec<&str> = stderr.lines().filter(|l| l.starts_with("vramscope_hook:")).collect();
    assert_eq!(said.len(), 1, "{stderr}");
    assert!(said[0].contains("cannot build the capture shim: /nonexistent/c++") && said[0].contains("no allocator events on CPU"), "{stderr}");
    assert_eq!(steps.len(), 3, "every step still reported: {stdout}{stderr}");
}

/// Installed by pip there is no engine: the built-in model runs in the user's torch through
/// the hook (`vramscope_hook.cs336`), allocates as the engine does, and the screen's knob
/// keys change it between steps as they change the engine.
#[test]
fn the_built_in_model_runs_in_the_users_torch_with_the_engines_figures_and_knobs() {
    use vramscope_core::step_config::{Attention, Mode, Precision};
    let cfg = common::tiny(32, 1, Mode::Train, Precision::Fp32, Attention::Naive);
    let mut opts = common::options(cfg.clone(), 3);
    opts.snapshot_dir = tempfile::tempdir().unwrap().keep();
    let source = vramscope::builtin::launch_in_python(&opts, vramscope_core::source::job::Output::Capture).unwrap();
    // Step 0 under way (its forward mark arrived): the change applies from step 1.
    loop {
        let (_, item) = source.next().expect("the stream flows");
        if matches!(&item, Incoming::Batch(b) if b.marks.iter().any(|m| m.step == 0 && m.phase == Phase::Forward)) {
            break;
        }
    }
    source.send(&Control::SetKnob { name: "ctx".into(), value: "64".into() });
    let run = common::collect(&source);
    let steps = run.steps();
    assert_eq!(steps.iter().map(|s| s.ctx).collect::<Vec<_>>(), [32, 64, 64]);
    let knob = run.reports.iter().find_map(|r| if let Report::Knob(k) = r { Some(k.clone()) } else { None }).expect("the change is an event");
    assert_eq!((knob.knob.as_str(), knob.from.as_str(), knob.to.as_str()), ("ctx", "32", "64"));
    // The engine at the same configuration: the same peaks, step for step.
    let mut engine = opts.clone();
    engine.steps = Some(1);
    let engine = common::run(engine);
    assert_eq!(steps[0].peak_active_bytes, engine.steps()[0].peak_active_bytes, "python {:?} engine {:?}", steps[0], engine.steps()[0]);
    assert_eq!(steps[0].reserved_bytes, engine.steps()[0].reserved_bytes);
}

/// `p` on a script that declares no precision of its own: bf16 autocast around the model's
/// forward and its loss from the next step, as `--precision bf16` starts it; a script under
/// its own autocast keeps its precision and the screen says why `p` does nothing.
#[test]
fn the_precision_key_works_on_any_script_that_does_not_choose_its_own() {
    let t = tempfile::tempdir().unwrap();
    let run = |precision: &str, extra: &[&str]| -> Vec<serde_json::Value> {
        let out = vramscope()
            .env("VRAMSCOPE_SOCKET_DIR", sockets(&t))
            .args(["py", "--headless", "--json", "--precision", precision, "--snapshot-dir"])
            .arg(t.path())
            .arg(script("train_transformer.py"))
            .args(["--steps", "2"])
            .args(extra)
            .assert()
            .success();
        String::from_utf8_lossy(&out.get_output().stdout).lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let (fp32, bf16) = (run("fp32", &[]), run("bf16", &[]));
    assert_eq!((fp32[1]["precision"].as_str(), bf16[1]["precision"].as_str()), (Some("fp32"), Some("bf16")));
    let forward = |s: &serde_json::Value| s["phase_peak_bytes"]["forward"].as_u64().unwrap();
    assert!(forward(&bf16[1]) < forward(&fp32[1]), "bf16 forward {} vs fp32 {}", forward(&bf16[1]), forward(&fp32[1]));

    // The key itself: a running job switches at its next step.
    let dir = sockets(&t);
    let mut job = start_standalone(&dir, t.path(), &["--steps", "40", "--sleep", "0.2"]);
    let source = JobSource::attach("job".into(), &[(0, job_socket(&dir))], None).unwrap();
    next_report(&source, 60, |r| matches!(r, Report::Step(s) if s.precision == vramscope_core::step_config::Precision::Fp32));
    source.send(&Control::SetKnob { name: "precision".into(), value: "bf16".into() });
    next_report(&source, 60, |r| matches!(r, Report::Step(s) if s.precision == vramscope_core::step_config::Precision::Bf16));
    drop(source);
    let _ = job.kill();
    let _ = job.wait();

    // A script under its own autocast: bf16 whatever the key says, and said so.
    let (stdout, _, _) = lifecycle_headless(&t, "own-autocast", &["--precision", "fp32"], &[]);
    let steps: Vec<&str> = stdout.lines().filter(|l| l.starts_with("step ")).collect();
    assert!(steps.len() == 2 && steps.iter().all(|l| l.contains(" bf16 ")), "{stdout}");
    assert!(stdout.contains("owns its precision, and p does not change it"), "{stdout}");
}

/// What real scripts showed: a Hugging Face model's batch comes as keyword arguments, and
/// with gradient accumulation the step's loss is the optimizer step's, not one micro-step's.
#[test]
fn keyword_batches_are_counted_and_an_accumulated_steps_loss_is_the_whole_steps() {
    let t = tempfile::tempdir().unwrap();
    let (stdout, stderr, steps) = lifecycle_headless(&t, "kwargs", &["--json"], &[]);
    let logged: Vec<f64> = stderr.lines().filter(|l| l.starts_with("{\"step_loss\"")).map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["step_loss"].as_f64().unwrap()).collect();
    assert_eq!((steps.len(), logged.len()), (3, 3), "{stdout}{stderr}");
    for (s, want) in steps.iter().zip(&logged) {
        assert_eq!((s["batch"].as_i64(), s["ctx"].as_i64()), (Some(32), Some(16)), "4 micro-batches of [8, 16]: {s}");
        let loss = s["loss"].as_f64().unwrap();
        assert!((loss - want).abs() < 1e-4, "step loss {loss}, the script's {want}");
    }
}

/// JSON has no NaN: a diverged loss once went as null, which the viewer refused, dropping
/// the job's whole stream at its first such step (as every CUDA job's unread loss did).
#[test]
fn a_diverged_loss_reaches_the_screen_as_nan_and_the_stream_goes_on() {
    let t = tempfile::tempdir().unwrap();
    let (stdout, stderr, steps) = lifecycle_headless(&t, "diverged", &["--json"], &[]);
    assert!(!stderr.contains("broken stream"), "{stderr}");
    let losses: Vec<_> = steps.iter().map(|s| s["loss"].clone()).collect();
    assert_eq!(losses.len(), 3, "{stdout}{stderr}");
    assert!(losses[0].as_f64().is_some_and(f64::is_finite), "{losses:?}");
    assert_eq!((losses[1].as_str(), losses[2].as_str()), (Some("NaN"), Some("inf")), "{losses:?}");
}

/// A backward torch refuses (a complex loss) that the script catches and goes on from:
/// the hook had read that loss, and summing it at the step's end raised into the job's
/// `optimizer.step()`. The step's loss is unread instead, and the job runs on.
#[test]
fn a_refused_backward_the_script_catches_leaves_its_step_unread_and_the_job_running() {
    let t = tempfile::tempdir().unwrap();
    let (stdout, stderr, steps) = lifecycle_headless(&t, "refused-backward", &["--json"], &[]);
    let losses: Vec<_> = steps.iter().map(|s| s["loss"].clone()).collect();
    assert_eq!(losses.len(), 3, "{stdout}{stderr}");
    assert!(losses[0].as_f64().is_some_and(f64::is_finite) && losses[2].as_f64().is_some_and(f64::is_finite), "{losses:?}");
    assert!(losses[1].is_null(), "{losses:?}");
}

/// Each allocation carries the module it was made in, also where a module's forward
/// raised and the script went on, and outside every module again after the model returns
/// (tests/py/hook_lifecycle.py's `scopes`: sizes tell the modules apart).
#[test]
fn every_allocation_carries_the_module_it_was_made_in() {
    let t = tempfile::tempdir().unwrap();
    let rec = t.path().join("s.vsrec");
    let (stdout, stderr, steps) = lifecycle_headless(&t, "scopes", &["--json", "--record", rec.to_str().unwrap()], &[]);
    assert_eq!(steps.len(), 3, "{stdout}{stderr}");
    let items = recorded(&rec).remove(&0).unwrap();
    let names: HashMap<u32, String> = batches(&items).flat_map(|b| b.scopes.iter().cloned()).collect();
    let scope = |id: u32| if id == 0 { "(none)".to_string() } else { names[&id].clone() };
    for step in 0..3u32 {
        let mut made: Vec<(u64, String)> = batches(&items)
            .flat_map(|b| &b.events)
            // Scalars (4 and 8 bytes) come and go in every module.
            .filter(|e| e.step == step && e.action == Action::Alloc && e.phase == Phase::Forward && e.size > 8)
            .map(|e| (e.size, scope(e.scope)))
            .collect();
        made.sort();
        let mut want = vec![(20, "(none)".into()), (10240, "outer".into()), (10240, "outer.lin".into()), (12288, "outer.inner".into())];
        if step == 1 {
            want.push((12288, "outer.inner".into())); // the forward that raised
            want.sort();
        }
        assert_eq!(made, want, "step {step}");
        // (What backward and the optimizer make may carry a name: "grad of outer.lin.bias".)
        let modules = ["outer", "outer.lin", "outer.inner"];
        let elsewhere: Vec<String> = batches(&items).flat_map(|b| &b.events).filter(|e| e.step == step && e.phase != Phase::Forward).map(|e| scope(e.scope)).filter(|s| modules.contains(&s.as_str())).collect();
        assert!(elsewhere.is_empty(), "step {step}: outside forward, allocations in {elsewhere:?}");
    }
}

/// A model trained through torch.compile. On a GPU (BENCHMARKS.md, "The second GPU
/// session"), Triton failed to compile any kernel under the hook: the shim, loaded into the
/// process's global scope, took libtorch's CUDA libraries there with it, and Triton's
/// library, loaded later, bound to them. And the module wrapper broke dynamo's graph at
/// every module. Now the shim stays out of the global scope, the model is one graph, its
/// steps and phases are reported, and its parameters carry the model's own names, not the
/// compiled wrapper's.
#[test]
fn a_compiled_model_stays_one_graph_and_keeps_its_names() {
    let t = tempfile::tempdir().unwrap();
    let rec = t.path().join("c.vsrec");
    let (stdout, stderr, steps) = lifecycle_headless(&t, "compiled", &["--json", "--record", rec.to_str().unwrap()], &[]);
    let counts: serde_json::Value = stderr.lines().rfind(|l| l.starts_with("{\"graph_breaks\"")).map(|l| serde_json::from_str(l).unwrap()).unwrap_or_else(|| panic!("{stdout}{stderr}"));
    assert_eq!((counts["graph_breaks"].as_u64(), counts["graphs"].as_u64()), (Some(0), Some(1)), "{stderr}");
    assert_eq!(counts["shim_global"], false, "{stderr}");
    assert_eq!(steps.len(), 3, "{stdout}{stderr}");
    let items = recorded(&rec).remove(&0).unwrap();
    // The script zeroes after its step: that phase opens the next step.
    assert_eq!(phase_order(&items, 1), [Phase::ZeroGrad, Phase::Forward, Phase::Backward, Phase::Optimizer], "{stderr}");
    let names = names(&items);
    for n in ["fc1.weight", "grad of fc2.bias", "exp_avg of fc1.weight"] {
        assert!(names.contains(n), "{n} in {names:?}");
    }
    assert!(!names.iter().any(|n| n.contains("_orig_mod")), "{names:?}");
}

/// Every tensor a model is handed is an input, also where it is handed two at once: the
/// first is named in the shim's word in place, the second, while that waits, by a call.
#[test]
fn each_tensor_a_model_is_handed_is_an_input() {
    let t = tempfile::tempdir().unwrap();
    let (stdout, stderr, steps) = lifecycle_headless(&t, "inputs", &["--json"], &[]);
    assert_eq!(steps.len(), 2, "{stdout}{stderr}");
    for s in &steps {
        assert_eq!(s["category_peak_bytes"]["input"].as_u64(), Some((16 * 64 + 16 * 32) * 4), "{s}");
    }
}

/// Gradients and optimizer state carry their names at every step's end, also where the
/// state changes under the optimizer: a checkpoint loaded (step 4) and a moment replaced by
/// a copy (step 8) are named in their step; a moment's storage swapped through `.data` (step
/// 12) within 16 steps, when the hook next looks at the state's storage, not only at which
/// tensors it holds (tests/py/hook_lifecycle.py's `reload`).
#[test]
fn gradients_and_optimizer_state_keep_their_names_when_the_state_changes() {
    let t = tempfile::tempdir().unwrap();
    let (stdout, stderr, steps) = lifecycle_headless(&t, "reload", &["--json"], &[]);
    assert_eq!(steps.len(), 32, "{stdout}{stderr}");
    // Linear(64, 128) and Linear(128, 10) in fp32; AdamW keeps two moments of each.
    const PARAMS: u64 = (64 * 128 + 128 + 128 * 10 + 10) * 4;
    let bytes = |s: &serde_json::Value, c: &str| s["category_bytes"][c].as_u64().unwrap_or(0);
    let unnamed: Vec<u64> = steps.iter().filter(|s| bytes(s, "optimizer_state") != 2 * PARAMS).map(|s| s["step"].as_u64().unwrap()).collect();
    assert!(unnamed.iter().all(|s| (12..28).contains(s)), "state unnamed at the end of steps {unnamed:?}");
    for s in &steps {
        assert_eq!(bytes(s, "gradient"), PARAMS, "{s}");
    }
}

/// What a job makes in a step and keeps for good (on a GPU, cuBLAS's two 32 MiB workspaces,
/// made in the first step's forward and backward) is no activation or temporary once the
/// step after its own has ended: the step lines and the screen said "activation" for it at
/// every step, which reads like a leak.
#[test]
fn what_a_job_keeps_across_steps_is_not_called_an_activation() {
    let t = tempfile::tempdir().unwrap();
    let (stdout, stderr, steps) = lifecycle_headless(&t, "kept", &["--json"], &[]);
    assert_eq!(steps.len(), 3, "{stdout}{stderr}");
    let bytes = |s: &serde_json::Value, c: &str| s["category_bytes"][c].as_u64().unwrap_or(0);
    const WORKSPACE: u64 = 4 << 20;
    assert!(bytes(&steps[0], "activation") >= WORKSPACE, "step 0 made it in forward: {}", steps[0]);
    for s in &steps[1..] {
        assert!(bytes(s, "activation") < WORKSPACE && bytes(s, "unknown") >= WORKSPACE, "{s}");
    }
}

/// A tensor's deepcopy makes its storage through `torch.UntypedStorage`, which asks for
/// libtorch's default CPU allocator by name: the copy an EMA model keeps once went unseen.
#[test]
fn a_deep_copy_the_job_keeps_is_counted_until_it_is_dropped() {
    let t = tempfile::tempdir().unwrap();
    let (stdout, stderr, steps) = lifecycle_headless(&t, "copies", &["--json"], &[]);
    assert_eq!(steps.len(), 4, "{stdout}{stderr}");
    let live: Vec<u64> = steps.iter().map(|s| s["live_bytes"].as_u64().unwrap()).collect();
    const COPY: u64 = 4 << 20;
    assert_eq!(live[1], live[0] + COPY, "the copy is live from step 1: {live:?}");
    assert_eq!(live[2], live[1], "{live:?}");
    assert_eq!(live[3], live[0], "and goes at step 3: {live:?}");
}

/// `vramscope_hook.loss(value)`: the step shows what the script read (the hook reads no
/// CUDA loss itself); a step without it keeps the hook's own reading.
#[test]
fn a_loss_the_script_hands_over_is_the_steps() {
    let t = tempfile::tempdir().unwrap();
    let (stdout, stderr, steps) = lifecycle_headless(&t, "given-loss", &["--json"], &[]);
    let own: Vec<f64> = stderr.lines().filter(|l| l.starts_with("{\"own_loss\"")).map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["own_loss"].as_f64().unwrap()).collect();
    let shown: Vec<f64> = steps.iter().map(|s| s["loss"].as_f64().unwrap()).collect();
    assert_eq!((shown.len(), own.len()), (3, 3), "{stdout}{stderr}");
    assert_eq!((shown[0], shown[2]), (40.0, 42.0), "{shown:?}");
    assert!((shown[1] - own[1]).abs() < 1e-6, "the hook's own reading: {shown:?} {own:?}");
}

/// A model on a device autocast does not know (meta) once died in the hook's forward
/// pre-hook; now it trains, and the precision key says once that it cannot cast there.
#[test]
fn a_model_where_autocast_cannot_go_trains_and_bf16_says_so_once() {
    let t = tempfile::tempdir().unwrap();
    let (stdout, stderr, steps) = lifecycle_headless(&t, "meta", &["--json", "--precision", "bf16"], &[]);
    assert_eq!(steps.len(), 3, "{stdout}{stderr}");
    // Under --json the note goes to stderr, standard output keeping step objects alone.
    assert_eq!(stderr.matches("no bf16 autocast on meta").count(), 1, "{stderr}");
    assert!(stdout.lines().all(|l| l.starts_with('{')), "{stdout}");
    assert!(steps.iter().all(|s| s["precision"] == "fp32"), "nothing was cast: {steps:?}");
}

/// The shim's CUDA autocast policy for CPU tensors (docs/autocast.md): off, each op the CS336
/// model runs keeps CPU autocast's dtype; on, those CUDA runs in fp32 come out fp32, and the
/// rest (matmuls in bf16, elementwise ops in their inputs' dtype) stay as they were.
#[test]
fn the_cuda_autocast_policy_gives_each_op_cudas_dtype_on_cpu() {
    let t = tempfile::tempdir().unwrap();
    let (out, _) = lifecycle("policy", &t);
    let fp32_on_cuda = ["exp", "log", "pow", "rsqrt", "sum", "sum_all", "softmax", "log_softmax"];
    for (op, cpu) in out["cpu"].as_object().unwrap() {
        assert_eq!(cpu, "bfloat16", "{op} under CPU's policy: {out}");
        let want = if fp32_on_cuda.contains(&op.as_str()) { "float32" } else { "bfloat16" };
        assert_eq!(out["cuda"][op], want, "{op} under CUDA's policy: {out}");
    }
    assert_eq!(out["off_again"], out["cpu"], "switched off, CPU's policy again");
}
