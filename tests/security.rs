//! Only the job's owner can watch or steer it (issue "Only the job's owner…"): the socket
//! lives in an owner-only directory and checks its peer's uid, TCP needs the job's token,
//! a control cannot name a path, and what the job writes is its owner's alone. The tests
//! that need a second account create one (CI runs as root).

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use std::time::{Duration, Instant};

use common::{options, tiny};
use vramscope_core::channel::Endpoint;
use vramscope_core::source::job::JobSource;
use vramscope_core::step_config::{Attention, Mode, Precision};
use vramscope_core::stream::{Control, Incoming, Report};

const OTHER: &str = "vramscope-test";

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// A job that is killed however its test ends (a failed assertion too).
struct Job(Child);

impl std::ops::Deref for Job {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Job {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// vramscope's engine as a job of its own, listening as `job` in `dir` (or on TCP).
fn start_engine(dir: &Path, job: &str, snapshots: &Path, tcp: Option<&str>) -> Job {
    let mut o = options(tiny(32, 2, Mode::Train, Precision::Fp32, Attention::Naive), 100_000);
    o.snapshot_dir = snapshots.to_path_buf();
    let mut cmd = Command::new(common::built("vramscope-engine"));
    cmd.arg("--options").arg(serde_json::to_string(&o).unwrap()).env("VRAMSCOPE_SOCKET_DIR", dir).env("VRAMSCOPE_JOB", job);
    if let Some(t) = tcp {
        cmd.env("VRAMSCOPE_LISTEN", t);
    }
    Job(cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap())
}

fn wait_for(what: &str, secs: u64, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Stops the job and returns what it said on stderr (if not read already).
fn stop(mut job: Job) -> String {
    job.kill().unwrap();
    job.wait().unwrap();
    let mut err = String::new();
    if let Some(mut e) = job.stderr.take() {
        e.read_to_string(&mut err).unwrap();
    }
    err
}

fn started(source: &JobSource) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok((_, Incoming::Report(Report::Started(_)))) = source.receiver().recv_timeout(Duration::from_millis(200)) {
            return true;
        }
    }
    false
}

/// A second account (created once); None when this process cannot make one (not root).
fn other_account() -> Option<u32> {
    // SAFETY: geteuid has no failure mode.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: the cross-account checks need a second account (CI runs them as root)");
        return None;
    }
    let id = || Command::new("id").args(["-u", OTHER]).output().ok().filter(|o| o.status.success());
    if id().is_none() {
        let made = Command::new("useradd").args(["--no-create-home", "--shell", "/usr/sbin/nologin", OTHER]).status().unwrap();
        assert!(made.success(), "useradd {OTHER}");
    }
    Some(String::from_utf8_lossy(&id().unwrap().stdout).trim().parse().unwrap())
}

/// Runs a raw client as the other account: connect to the socket, say hello, and print how
/// many bytes the job sent back (or the error).
fn raw_attempt_as_other(sock: &Path) -> String {
    // Connecting may succeed; whether the hello still goes out depends on how fast the job
    // hangs up. What counts is the bytes that come back.
    let py = "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ntry: s.connect(sys.argv[1])\nexcept OSError as e: print('error', e); sys.exit()\ntry: s.sendall(b'VSHELLO 1 -\\n')\nexcept OSError: pass\ns.settimeout(5)\ntry: print('got', len(s.recv(100)))\nexcept OSError: print('got', 0)";
    // Debian's python3: the other account cannot run this account's own interpreters.
    let out = Command::new("runuser").args(["-u", OTHER, "--", "/usr/bin/python3", "-c", py]).arg(sock).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn another_account_can_neither_reach_the_socket_nor_be_let_in_and_the_owner_is() {
    let Some(uid) = other_account() else { return };
    let t = tempfile::tempdir().unwrap();
    // Others may pass through the temp dir to reach what is inside (as /tmp allows).
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = t.path().join("sockets");
    let snaps = t.path().join("snaps");
    let job = start_engine(&dir, "sec", &snaps, None);
    let sock = dir.join("sec-r0.sock");
    wait_for("the job's socket", 60, || sock.exists());
    assert_eq!(mode(&dir), 0o700, "the socket directory is its owner's alone");
    assert_eq!(mode(&sock), 0o600);

    // The directory keeps the other account out, whatever it tries.
    assert!(raw_attempt_as_other(&sock).contains("Permission denied"));
    let bin = assert_cmd::cargo::cargo_bin("vramscope");
    let attach = Command::new("runuser").args(["-u", OTHER, "--"]).arg(&bin).args(["attach", "--headless"]).arg(&sock).output().unwrap();
    assert_eq!(attach.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&attach.stderr).contains("Permission denied"), "{}", String::from_utf8_lossy(&attach.stderr));

    // Opened up by mistake, the socket still lets no one else in: the job checks the
    // peer's uid before reading a byte, sends nothing, and says so once.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(raw_attempt_as_other(&sock), "got 0", "nothing sent to a stranger");
    assert_eq!(raw_attempt_as_other(&sock), "got 0");

    // The owner attaches, asks for a snapshot, detaches and attaches again; the job goes on.
    for _ in 0..2 {
        let source = JobSource::attach("sec".into(), &[(0, Endpoint::Unix(sock.clone()))], None).unwrap();
        assert!(started(&source), "the owner is let in");
        source.send(&Control::Snapshot);
        drop(source);
    }
    wait_for("a snapshot", 60, || std::fs::read_dir(&snaps).map(|d| d.count() > 0).unwrap_or(false));
    let err = stop(job);
    let refusals: Vec<&str> = err.lines().filter(|l| l.contains("refused a connection")).collect();
    assert_eq!(refusals.len(), 1, "said once: {err:?}");
    assert!(refusals[0].contains(&format!("uid {uid} (pid ")) && refusals[0].contains("only the job's owner"), "{}", refusals[0]);
    for snap in std::fs::read_dir(&snaps).unwrap().flatten() {
        assert_eq!(mode(&snap.path()), 0o600, "{} is its owner's alone", snap.path().display());
    }
}

/// The address and token file a TCP job printed.
fn tcp_endpoint(job: &mut Job) -> (std::net::SocketAddr, PathBuf, String) {
    let mut err = std::io::BufReader::new(job.stderr.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut err, &mut line).unwrap();
    let addr = line.split("listening on ").nth(1).and_then(|r| r.split(';').next()).expect("the job says where it listens");
    let file = line.split("--token-file ").nth(1).and_then(|r| r.split(' ').next()).expect("and where its token is");
    job.stderr = None;
    // Keep reading the job's stderr so its later lines can be checked.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = err.read_to_string(&mut rest);
        let _ = tx.send(rest);
    });
    LATER.with(|l| *l.borrow_mut() = Some(rx));
    (addr.parse().unwrap(), PathBuf::from(file), line)
}

thread_local! {
    static LATER: std::cell::RefCell<Option<std::sync::mpsc::Receiver<String>>> = const { std::cell::RefCell::new(None) };
}

fn later_stderr() -> String {
    LATER.with(|l| l.borrow_mut().take().unwrap().recv_timeout(Duration::from_secs(30)).unwrap_or_default())
}

#[test]
fn over_tcp_nothing_is_sent_or_accepted_without_the_token() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sockets");
    let mut job = start_engine(&dir, "tcp", &t.path().join("snaps"), Some("127.0.0.1:0"));
    let (addr, token_file, said) = tcp_endpoint(&mut job);
    assert!(addr.ip().is_loopback(), "loopback unless an address is given: {said}");
    assert_eq!(mode(&token_file), 0o600);
    let token = std::fs::read_to_string(&token_file).unwrap().trim().to_string();
    assert!(said.contains(&token), "the job prints the token for its owner");

    // A wrong token: refused, nothing sent.
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(format!("VSHELLO 1 {}\n", "0".repeat(64)).as_bytes()).unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(s.read(&mut buf).unwrap(), 0, "closed without a byte");
    // No hello at all: still nothing, and the job goes on.
    let mut silent = std::net::TcpStream::connect(addr).unwrap();
    silent.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    assert!(silent.read(&mut buf).is_err(), "nothing is sent before a hello");

    // The token's owner attaches with it, from the file or as given.
    assert!(started(&JobSource::attach("tcp".into(), &[(0, Endpoint::Tcp(addr))], Some(&token)).unwrap()));
    let read = vramscope_core::channel::token::read_token_file(&token_file).unwrap();
    assert_eq!(read, token);
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let loose = common::vramscope().args(["attach", &addr.to_string(), "--headless", "--token-file"]).arg(&token_file).output().unwrap();
    assert!(String::from_utf8_lossy(&loose.stderr).contains("a token file must be 600"), "{}", String::from_utf8_lossy(&loose.stderr));
    // A wrong token is said as one (issue 34: it read "sent a broken stream … 'VSREC'").
    let wrong = common::vramscope().args(["attach", &addr.to_string(), "--headless", "--token", &"1".repeat(64)]).output().unwrap();
    let said = String::from_utf8_lossy(&wrong.stderr);
    assert!(said.contains("refused the token") && !said.contains("VSREC"), "{said}");
    assert_eq!(wrong.status.code(), Some(2), "{said}");
    stop(job);
    let err = later_stderr();
    assert_eq!(err.lines().filter(|l| l.contains("wrong or missing token")).count(), 1, "{err}");
}

/// Issue 34: a TCP job that ended normally left its `.token` file behind.
#[test]
fn a_tcp_job_that_ends_takes_its_token_file_with_it() {
    let t = tempfile::tempdir().unwrap();
    let mut job = start_engine(&t.path().join("sockets"), "tcpend", &t.path().join("snaps"), Some("127.0.0.1:0"));
    let (addr, token_file, _) = tcp_endpoint(&mut job);
    let token = std::fs::read_to_string(&token_file).unwrap().trim().to_string();
    let source = JobSource::attach("tcpend".into(), &[(0, Endpoint::Tcp(addr))], Some(&token)).unwrap();
    assert!(started(&source));
    source.send(&Control::Stop);
    wait_for("the job to end", 60, || job.try_wait().unwrap().is_some());
    assert!(job.try_wait().unwrap().unwrap().success());
    assert!(!token_file.exists(), "{} left behind", token_file.display());
}

#[test]
fn a_control_that_names_a_path_is_refused_and_the_job_goes_on() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sockets");
    let job = start_engine(&dir, "paths", &t.path().join("snaps"), None);
    let sock = dir.join("paths-r0.sock");
    wait_for("the job's socket", 60, || std::os::unix::net::UnixStream::connect(&sock).is_ok());
    let target = t.path().join("elsewhere.pickle");
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    s.write_all(b"VSHELLO 1 -\n").unwrap();
    let bad = serde_json::json!({ "Snapshot": { "path": target } }).to_string();
    s.write_all(format!("{bad}\n").as_bytes()).unwrap();
    // The job drops that viewer: its stream ends.
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink);
    assert!(!target.exists(), "nothing written where a viewer asked");
    let source = JobSource::attach("paths".into(), &[(0, Endpoint::Unix(sock))], None).unwrap();
    assert!(started(&source), "the job goes on for its owner");
    let err = stop(job);
    assert!(err.contains("it sent a control that is not one"), "{err}");
}

#[test]
fn recordings_are_their_owners_alone() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("r.vsrec");
    let r = vramscope_core::record::writer::Recorder::create(&p).unwrap();
    assert_eq!(mode(&p), 0o600);
    r.finish().unwrap();
}
