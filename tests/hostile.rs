//! Bounded work on every input (issue "Bounded work on every input"): hostile recordings
//! and hostile producers on a job's sockets are refused fast, in little memory, with one
//! line naming what was wrong and where, and good producers beside them go on.

mod common;

use std::io::{BufRead, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use vramscope_core::stream::chunk::{header, ChunkWriter};
use vramscope_core::stream::{Incoming, Report};

/// A chunk whose zstd frame unpacks to `unpacked` zero bytes (end records, in the body's
/// terms), its header claiming `claimed` bytes.
fn bomb_chunk(claimed: u32, unpacked: usize) -> Vec<u8> {
    let packed = zstd::bulk::compress(&vec![0u8; unpacked], 19).unwrap();
    let mut c = Vec::new();
    c.extend((packed.len() as u32).to_le_bytes());
    c.extend(claimed.to_le_bytes());
    c.extend(crc32fast::hash(&packed).to_le_bytes());
    c.extend(packed);
    c
}

/// Runs the binary, returning (exit code, stderr, CPU time, peak RSS in KiB of that
/// process alone). CPU time, not wall time: what the process did, however busy the
/// machine is.
fn run_measured(args: &[&std::ffi::OsStr]) -> (Option<i32>, String, Duration, i64) {
    // Reaped by wait4 below, which also gives its peak RSS.
    #[allow(clippy::zombie_processes)]
    let child = Command::new(assert_cmd::cargo::cargo_bin("vramscope")).args(args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let pid = child.id() as libc::pid_t;
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.unwrap(), &mut err).unwrap();
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: our own child, reaped once, with valid out-pointers.
    unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    let cpu = |t: libc::timeval| Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
    (code, err, cpu(usage.ru_utime) + cpu(usage.ru_stime), usage.ru_maxrss)
}

#[test]
fn a_bomb_recording_is_refused_at_once_in_little_memory_naming_the_chunk() {
    let t = tempfile::tempdir().unwrap();
    // One chunk claiming 64 MiB whose frame unpacks to 64 MiB of end records: 2 KB on disk.
    let one = t.path().join("bomb.vsrec");
    let mut bytes = header().to_vec();
    bytes.extend(bomb_chunk(64 << 20, 64 << 20));
    std::fs::write(&one, &bytes).unwrap();
    assert!(bytes.len() < 4096, "{} bytes", bytes.len());
    // Twenty of them.
    let twenty = t.path().join("bombs.vsrec");
    let mut many = header().to_vec();
    for _ in 0..20 {
        many.extend(bomb_chunk(64 << 20, 64 << 20));
    }
    std::fs::write(&twenty, &many).unwrap();
    // Honest about its size, lying about what its frame unpacks to.
    let liar = t.path().join("liar.vsrec");
    let mut lies = header().to_vec();
    lies.extend(bomb_chunk(1 << 20, 64 << 20));
    std::fs::write(&liar, &lies).unwrap();
    let (_, _, _, baseline) = run_measured(&["--version".as_ref()]);
    for (file, want) in [
        (&one, "chunk 1: it claims 67108864 bytes unpacked (at most 2097152)"),
        (&twenty, "chunk 1: it claims 67108864 bytes unpacked"),
        (&liar, "chunk 1: it does not unpack to its 1048576 bytes"),
    ] {
        let (code, err, took, rss) = run_measured(&["replay".as_ref(), "--headless".as_ref(), file.as_os_str()]);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains(want) && err.contains("at byte 12"), "{err}");
        assert_eq!(err.matches("corrupt").count(), 1, "one prefix per message: {err}");
        assert_eq!(err.matches(&*file.display().to_string()).count(), 1, "names the file once: {err}");
        assert!(took < Duration::from_millis(900), "refused after {took:?} of CPU");
        assert!(rss < baseline + 20 * 1024, "peak RSS {rss} KiB against the binary's {baseline} KiB");
    }
}

#[test]
fn an_end_record_anywhere_but_last_is_corrupt() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("ended.vsrec");
    let mut w = ChunkWriter::new(1, u64::MAX);
    let mut bytes = header().to_vec();
    bytes.extend(w.end().unwrap());
    let after = bytes.len();
    w.push(0, 0, &Incoming::Report(Report::Finished)).unwrap();
    bytes.extend(w.flush().unwrap());
    std::fs::write(&p, &bytes).unwrap();
    let out = common::vramscope().args(["replay", "--headless"]).arg(&p).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("at byte {after}")) && err.contains("chunk 2 follows the end record"), "{err}");
}

/// A fake producer listening as `job`'s `rank` in `dir`: it reads the viewer's hello and
/// sends `bytes`, slowly when `pace` is set, then holds the connection a moment.
fn producer(dir: &Path, job: &str, rank: u32, bytes: Vec<u8>, pace: Option<Duration>) -> std::thread::JoinHandle<()> {
    let l = UnixListener::bind(dir.join(format!("{job}-r{rank}.sock"))).unwrap();
    std::thread::spawn(move || {
        // The viewer looks for live jobs by connecting and hanging up: wait for its hello.
        let mut s = loop {
            let (s, _) = l.accept().unwrap();
            let mut hello = String::new();
            std::io::BufReader::new(s.try_clone().unwrap()).read_line(&mut hello).unwrap();
            if hello.starts_with("VSHELLO") {
                break s;
            }
        };
        for piece in bytes.chunks(if pace.is_some() { 4096 } else { bytes.len().max(1) }) {
            if s.write_all(piece).is_err() {
                return;
            }
            if let Some(p) = pace {
                std::thread::sleep(p);
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    })
}

fn sample() -> PathBuf {
    common::repo_root().join("recordings/fp32-to-bf16-then-double-ctx.vsrec")
}

#[test]
fn hostile_producers_are_dropped_with_a_line_naming_them_while_a_good_one_streams() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sockets");
    vramscope_core::channel::dir::ensure_private_dir(&dir).unwrap();
    let good = std::fs::read(sample()).unwrap();
    let expected_steps = common::vramscope().args(["replay", "--headless", "--json"]).arg(sample()).output().unwrap().stdout.iter().filter(|b| **b == b'\n').count();
    let mut bomb = header().to_vec();
    bomb.extend(bomb_chunk(64 << 20, 64 << 20));
    // A valid chunk whose records claim a billion events.
    let mut absurd_body = vec![1u8, 0, 0];
    vramscope_core::stream::codec::put_varint(&mut absurd_body, 1 << 30);
    let packed = zstd::bulk::compress(&absurd_body, 1).unwrap();
    let mut absurd = header().to_vec();
    absurd.extend((packed.len() as u32).to_le_bytes());
    absurd.extend((absurd_body.len() as u32).to_le_bytes());
    absurd.extend(crc32fast::hash(&packed).to_le_bytes());
    absurd.extend(packed);
    let threads = vec![
        producer(&dir, "job", 0, bomb, None),
        producer(&dir, "job", 1, b"GET / HTTP/1.1\r\n\r\n".to_vec(), None),
        producer(&dir, "job", 2, absurd, None),
        producer(&dir, "job", 3, good, Some(Duration::from_millis(20))),
    ];
    let out = common::vramscope().env("VRAMSCOPE_SOCKET_DIR", &dir).args(["attach", "job", "--headless", "--json"]).output().unwrap();
    for th in threads {
        th.join().unwrap();
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for (rank, why) in [
        (0, "chunk 1 (at byte 12) is corrupt: it claims 67108864 bytes unpacked"),
        (1, "not a vramscope stream"),
        (2, "1073741824 more events in the chunk (at most 32768)"),
    ] {
        let line = err.lines().find(|l| l.contains(&format!("rank {rank} sent a broken stream"))).unwrap_or_else(|| panic!("rank {rank}: {err}"));
        assert!(line.contains(&format!("job-r{rank}.sock")) && line.contains(why), "{line}");
    }
    assert_eq!(stdout.lines().count(), expected_steps, "the good producer's every step: {stdout}");
}

#[test]
fn a_snapshot_streamed_on_stdin_or_a_pipe_reads_as_the_file_does_and_dev_zero_fails_at_once() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let fixture = common::fixture("kkaitlyn111_cs336-a2-systems_memory_ctx128_forward.pickle");
    let summary = |out: std::process::Output| -> serde_json::Value {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let bin = assert_cmd::cargo::cargo_bin("vramscope");
    let from_file = summary(Command::new(&bin).args(["view", "--summary", "--json"]).arg(&fixture).output().unwrap());
    let from_stdin = summary(
        Command::new(&bin).args(["view", "--summary", "--json", "-"]).stdin(std::fs::File::open(&fixture).unwrap()).output().unwrap(),
    );
    let from_pipe = summary(
        Command::new("bash")
            .arg("-c")
            .arg(format!("exec '{}' view --summary --json <(cat '{}')", bin.display(), fixture.display()))
            .output()
            .unwrap(),
    );
    assert!(from_file["peak_active_bytes"].as_u64().unwrap() > 0);
    assert_eq!(from_stdin, from_file, "standard input");
    assert_eq!(from_pipe, from_file, "a pipe");
    let text = Command::new("bash").arg("-c").arg(format!("exec '{}' view --summary <(cat '{}')", bin.display(), fixture.display())).output().unwrap();
    let first = String::from_utf8_lossy(&text.stdout).lines().next().unwrap_or_default().to_string();
    assert!(first.starts_with("/dev/fd/") && first.contains(" (a pipe)"), "the pipe is named for what it is: {first}");
    // Endless zeros: refused on the first byte, not read until memory runs out.
    let (code, err, took, rss_kib) = run_measured(&["view".as_ref(), "--summary".as_ref(), "/dev/zero".as_ref()]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("/dev/zero") && err.contains("not a pickle: first byte 0x00"), "{err}");
    assert!(took < Duration::from_secs(5) && rss_kib < 100 << 10, "{took:?}, {rss_kib} KiB");
}
