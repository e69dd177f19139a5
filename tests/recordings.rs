//! Recordings: a replay prints the live run's step lines byte for byte, a cut or killed
//! recording replays up to its last whole chunk and says where, files are never
//! overwritten, the sample recordings show what they claim, and snapshot traces play.

mod common;

use common::vramscope;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vramscope_core::record::player::Script;
use vramscope_core::record::reader::{Ending, Recording};
use vramscope_core::record::writer::Recorder;
use vramscope_core::record::RecordError;
use vramscope_core::stream::chunk::{CHUNK_HEADER_LEN, HEADER_LEN};
use vramscope_core::stream::Incoming;
use vramscope_core::step_config::{Mode, Precision};
use vramscope_core::stream::StepReport;

fn sample(name: &str) -> PathBuf {
    common::repo_root().join("recordings").join(name)
}

fn replay_steps(mut script: Script) -> Vec<StepReport> {
    let mut failed = None;
    let steps = vramscope_core::report::headless::run(script.stream(&mut failed), false, &mut Vec::new()).expect("replay runs");
    assert!(failed.is_none(), "{failed:?}");
    steps
}

/// Where each whole chunk of a recording ends, read from the chunk headers.
fn chunk_ends(bytes: &[u8]) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut pos = HEADER_LEN;
    while pos < bytes.len() {
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        pos += CHUNK_HEADER_LEN + len;
        ends.push(pos);
    }
    assert_eq!(pos, bytes.len());
    ends
}

#[test]
fn replaying_a_recording_prints_the_live_runs_step_lines_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("session.vsrec");
    let live = vramscope()
        .args(["run", "--headless", "--device", "cpu", "--steps", "3", "--ctx", "32", "--batch", "2", "--record"])
        .arg(&rec)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let live = String::from_utf8(live).unwrap();
    assert_eq!(live.lines().filter(|l| l.starts_with("step ")).count(), 3, "{live}");
    let replayed = vramscope().args(["replay", "--headless"]).arg(&rec).assert().success();
    let out = replayed.get_output();
    assert_eq!(String::from_utf8(out.stdout.clone()).unwrap(), live);
    assert!(String::from_utf8_lossy(&out.stderr).contains("recording closed normally"));
    // Same for the JSON lines, which carry every figure of every step.
    let json = vramscope().args(["replay", "--headless", "--json"]).arg(&rec).assert().success();
    let steps: Vec<StepReport> = String::from_utf8(json.get_output().stdout.clone()).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let lines: Vec<String> = steps.iter().map(vramscope_core::report::headless::step_line).collect();
    assert_eq!(lines, live.lines().filter(|l| l.starts_with("step ")).map(String::from).collect::<Vec<_>>());
    // The replay's screen holds what the allocator reserved: the segments made while the
    // model was built, before the recorder's viewer attached, included.
    let mut store = vramscope_core::store::Store::new(1 << 20);
    let mut failed = None;
    for (_, item) in Script::open(&rec).unwrap().stream(&mut failed) {
        store.ingest(item);
    }
    assert_eq!(store.history.reserved(), steps.last().unwrap().reserved_bytes, "the screen's reserved is the allocator's");
    // A second recording to the same file is refused and leaves the first intact.
    let before = std::fs::read(&rec).unwrap();
    let refused = vramscope().args(["run", "--headless", "--device", "cpu", "--steps", "1", "--ctx", "32", "--record"]).arg(&rec).assert().failure();
    assert!(String::from_utf8_lossy(&refused.get_output().stderr).contains("already exists"));
    assert_eq!(std::fs::read(&rec).unwrap(), before);
}

#[test]
fn a_recording_cut_at_any_byte_replays_its_whole_chunks_and_says_where() {
    let path = sample("fp32-to-bf16-then-double-ctx.vsrec");
    let bytes = std::fs::read(&path).unwrap();
    let ends = chunk_ends(&bytes);
    assert!(ends.len() >= 4, "the sample should span several chunks, has {}", ends.len());
    let full = replay_steps(Script::from_recording(Recording::open(&path).unwrap()));
    // A fixed-seed generator: random cut points, the same on every run.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..40 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let cut = HEADER_LEN + (x % (bytes.len() - HEADER_LEN) as u64) as usize;
        let rec = Recording::from_bytes(Path::new("cut.vsrec"), bytes[..cut].to_vec()).unwrap();
        let whole = ends.iter().filter(|e| **e <= cut).count();
        assert_eq!(rec.chunk_count(), whole, "cut at {cut}");
        let last_end = if whole == 0 { HEADER_LEN } else { ends[whole - 1] };
        if cut == last_end {
            assert_eq!(rec.ending, Ending::Unclosed);
        } else {
            assert!(matches!(&rec.ending, Ending::Cut { offset, .. } if *offset == last_end as u64), "cut at {cut}: {:?}", rec.ending);
            assert!(rec.ending_line().contains(&format!("stopped at byte {last_end} of {cut} after {whole} whole chunks")), "{}", rec.ending_line());
        }
        let steps = replay_steps(Script::from_recording(rec));
        assert_eq!(steps[..], full[..steps.len()], "a cut replay shows a prefix of the steps");
    }
    // A flipped byte inside chunk 2 fails its checksum: chunk 1 still plays.
    let mut bad = bytes.clone();
    bad[ends[0] + CHUNK_HEADER_LEN + 5] ^= 0x40;
    let rec = Recording::from_bytes(Path::new("bad.vsrec"), bad).unwrap();
    assert_eq!(rec.chunk_count(), 1);
    assert!(rec.ending_line().contains("chunk 2: it fails its CRC-32"), "{}", rec.ending_line());
}

#[test]
fn a_session_killed_with_sigkill_replays_up_to_its_last_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("killed.vsrec");
    let bin = assert_cmd::cargo::cargo_bin("vramscope");
    let mut child = std::process::Command::new(bin)
        .args(["run", "--headless", "--device", "cpu", "--steps", "1000", "--ctx", "32", "--batch", "2", "--record"])
        .arg(&rec)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Chunks are cut at least every second; wait for a few.
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::fs::read(&rec).map(|b| Recording::from_bytes(&rec, b).map(|r| r.chunk_count()).unwrap_or(0)).unwrap_or(0) < 3 {
        assert!(Instant::now() < deadline, "no chunks written");
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let out = vramscope().args(["replay", "--headless"]).arg(&rec).assert().success();
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(err.contains("no end record") || err.contains("stopped at byte"), "{err}");
    assert!(String::from_utf8_lossy(&out.get_output().stdout).contains("vramscope: tiny on cpu"));
}

#[test]
fn the_sample_recordings_show_the_sessions_they_are_named_after() {
    for name in ["fp32-to-bf16-then-double-ctx.vsrec", "forward-only-then-full-step.vsrec"] {
        let len = std::fs::metadata(sample(name)).unwrap().len();
        assert!(len < 1 << 20, "{name} is {len} bytes");
    }
    let rec = Recording::open(&sample("fp32-to-bf16-then-double-ctx.vsrec")).unwrap();
    assert_eq!(rec.ending, Ending::Closed);
    let steps = replay_steps(Script::from_recording(rec));
    let first = &steps[0];
    assert_eq!((first.precision, first.ctx), (Precision::Fp32, 32));
    let last = steps.last().unwrap();
    assert_eq!((last.precision, last.ctx), (Precision::Bf16, 64));
    let steps = replay_steps(Script::open(&sample("forward-only-then-full-step.vsrec")).unwrap());
    assert_eq!(steps[0].mode, Mode::Forward);
    assert_eq!(steps.last().unwrap().mode, Mode::Train);
    // Optimizer state exists only once full steps run.
    assert!(steps.last().unwrap().peak_allocated_bytes > 2 * steps[0].peak_allocated_bytes);
}

#[test]
fn a_snapshot_pickles_trace_plays_every_entry() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let path = common::fixture_path(common::MAGMA27);
    let snap = vramscope_core::snapshot::reader::read_snapshot_file(&path).unwrap();
    let mut script = Script::open(&path).unwrap();
    let mut failed = None;
    let mut store = vramscope_core::store::Store::new(1 << 20);
    let mut finished = false;
    for (_, item) in script.stream(&mut failed) {
        match item {
            Incoming::Batch(b) => store.ingest_batch(b),
            Incoming::Report(r) => {
                finished |= r == vramscope_core::stream::Report::Finished;
                store.ingest_report(r)
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(finished && failed.is_none());
    // Every entry plays, after the blocks alive at the start (memory_viz's), and the
    // peak is memory_viz's.
    let tl = vramscope_core::snapshot::timeline::Timeline::from_snapshot(&snap, 0);
    let events = snap.trace_entry_count() + tl.allocations.iter().filter(|a| a.alive_at_start).count();
    assert_eq!(store.history.end() as usize, events);
    assert_eq!(store.lost_events, 0);
    assert_eq!(store.peak.0, tl.peak_bytes);
    assert!(script.describe().contains(&format!("snapshot trace, {events} events")));
}

#[test]
fn a_recorder_never_overwrites_and_other_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let existing = dir.path().join("notes.txt");
    std::fs::write(&existing, "keep me").unwrap();
    assert!(matches!(Recorder::create(&existing), Err(RecordError::Exists(_))));
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep me");
    let e = Script::open(&existing).err().expect("a text file is not a recording");
    assert!(e.to_string().contains("not a vramscope recording"), "{e}");
}

/// A snapshot of a job on three GPUs replays one device at a time (D switches), each with
/// its own peak, memory_viz's for that device, never the devices added together.
#[test]
fn a_multi_gpu_snapshot_replays_each_device_on_its_own() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let path = common::fixture_path(common::CONSTRUCTOR_SUN);
    let snap = vramscope_core::snapshot::reader::read_snapshot_file(&path).unwrap();
    let mut ranks = vramscope_core::store::ranks::Ranks::new(1 << 20);
    let mut failed = None;
    for (rank, item) in Script::open_at(&path, Some(1)).unwrap().stream(&mut failed) {
        ranks.ingest(rank, item);
    }
    assert!(failed.is_none(), "{failed:?}");
    let summary = ranks.summary();
    assert_eq!(summary.devices, ["cuda:1", "cuda:0", "cuda:2"], "--device 1 first, then the others");
    for d in [1usize, 0, 2] {
        let tl = vramscope_core::snapshot::timeline::Timeline::from_snapshot(&snap, d);
        assert_eq!(ranks.shown().session_peak(), tl.peak_bytes, "cuda:{d}'s peak is its own");
        ranks.next_device();
    }
    let err = vramscope().args(["replay", "--headless", "--device", "9"]).arg(&path).assert().code(2);
    assert!(String::from_utf8_lossy(&err.get_output().stderr).contains("no device 9 (the file has devices 0 to 3)"));
}
