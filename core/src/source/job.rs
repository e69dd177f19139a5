//! A running job as a source: vramscope's engine process or a user's PyTorch job with the
//! hook, one stream per rank. It either starts the job (`launch`: the job's producers
//! listen in the owner-only socket directory under a job name this side chose, and are
//! found there as they appear) or attaches to one that runs already (`attach`). Each rank's
//! stream is read on its own thread, decoded within the stream's bounds, and what arrives
//! is tagged with its rank. A stream that stops without its end record, or that breaks the
//! format, is said once on that rank (and the producer is dropped); the others go on.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::channel::{self, dir, peer, ChannelError, Endpoint};
use crate::stream::chunk::{ChunkReader, StreamError};
use crate::stream::codec::Record;
use crate::stream::{Control, Incoming, Report};

/// An item from one rank of a job.
pub type Fed = (u32, Incoming);

/// Items waiting for the consumer; a full queue holds the readers back, so the job's own
/// queue (bounded, counted) takes the back-pressure, never the job.
const QUEUE: usize = 1024;
/// How often a launched job's socket directory is looked at for new ranks.
const DISCOVER_EVERY: Duration = Duration::from_millis(50);

/// A connection's two halves: the stream read, the controls written.
pub type Duplex = (Box<dyn Read + Send>, Box<dyn Write + Send>);

/// Opens a connection to a producer: checks it runs as this user (Unix) or presents the
/// token (TCP) before reading a byte, and says hello.
pub fn connect(endpoint: &Endpoint, token: Option<&str>) -> Result<Duplex, ChannelError> {
    match endpoint {
        Endpoint::Unix(path) => {
            let s = UnixStream::connect(path).map_err(|e| ChannelError::Refused(format!("{}: {e}", path.display())))?;
            if let Err(c) = peer::check_same_user(&s) {
                return Err(ChannelError::Refused(format!(
                    "{}: the job there runs as uid {}, not as this user; refusing to read it",
                    path.display(),
                    c.uid
                )));
            }
            let mut w = s.try_clone()?;
            channel::write_hello(&mut w, None)?;
            Ok((Box::new(s), Box::new(w)))
        }
        Endpoint::Tcp(addr) => {
            let token = token.ok_or_else(|| ChannelError::Refused(format!("{addr}: a TCP job needs its token (--token or --token-file)")))?;
            let s = TcpStream::connect_timeout(addr, Duration::from_secs(5)).map_err(|e| ChannelError::Refused(format!("{addr}: {e}")))?;
            s.set_nodelay(true)?;
            let mut w = s.try_clone()?;
            channel::write_hello(&mut w, Some(token))?;
            Ok((Box::new(s), Box::new(w)))
        }
    }
}

/// The child process a launched job runs as, shared with the readers that explain how a
/// stream ended.
type ChildSlot = Arc<Mutex<Option<Child>>>;

/// Each rank's control connection, and what was sent before any rank was connected (a
/// launched job's first rank gets it when it connects).
#[derive(Default)]
struct Controls {
    ranks: BTreeMap<u32, Box<dyn Write + Send>>,
    early: Vec<String>,
}

impl Controls {
    fn add(&mut self, rank: u32, mut w: Box<dyn Write + Send>) {
        let early = std::mem::take(&mut self.early);
        if early.iter().all(|line| w.write_all(line.as_bytes()).is_ok()) && w.flush().is_ok() {
            self.ranks.insert(rank, w);
        }
    }

    fn send(&mut self, line: &str) {
        if self.ranks.is_empty() {
            self.early.push(line.to_string());
            return;
        }
        self.ranks.retain(|_, w| w.write_all(line.as_bytes()).and_then(|()| w.flush()).is_ok());
    }
}

pub struct JobSource {
    items: Receiver<Fed>,
    controls: Arc<Mutex<Controls>>,
    child: ChildSlot,
    /// What the job is called, for titles and log lines.
    pub name: String,
    threads: Vec<JoinHandle<()>>,
    /// The job's output file (a user's job under the screen), to say where it went.
    pub output: Option<PathBuf>,
    /// A launched job's socket directory: what its ranks leave there is removed once the
    /// process has ended (a killed rank cannot remove its own socket or token file).
    sockets: Option<PathBuf>,
}

/// One line on how a process ended.
pub fn describe_exit(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => "exited normally".into(),
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by signal {s} ({})", signal_name(s)),
        (None, None) => "ended".into(),
    }
}

fn signal_name(s: i32) -> &'static str {
    match s {
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT, an abort in native code",
        libc::SIGBUS => "SIGBUS",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// What vramscope exits with for a job that ended with `status`: its code, or 128 plus the
/// signal that killed it, as a shell says it.
pub fn exit_code_of(status: ExitStatus) -> std::process::ExitCode {
    use std::os::unix::process::ExitStatusExt;
    let code = status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(1);
    std::process::ExitCode::from(code.clamp(0, 255) as u8)
}

/// How a launched job's process ended, if it has within `wait`.
fn child_exit(child: &ChildSlot, wait: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + wait;
    loop {
        if let Some(c) = child.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            if let Ok(Some(s)) = c.try_wait() {
                return Some(s);
            }
        } else {
            return None;
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads one rank's stream to its end; says on that rank how it ended when it was not the
/// end record.
/// `token`: one was sent in the hello (TCP).
fn read_stream(rank: u32, who: String, token: bool, r: Box<dyn Read + Send>, tx: &Sender<Fed>, child: &ChildSlot, what: &str) {
    let outcome: Result<bool, StreamError> = (|| {
        let mut chunks = ChunkReader::new(r)?;
        while let Some(records) = chunks.next_chunk()? {
            for rec in records {
                match rec {
                    // A producer's stream has one rank; the connection says which.
                    Record::Item { item, .. } => {
                        if tx.send((rank, item)).is_err() {
                            return Ok(true);
                        }
                    }
                    Record::End => return Ok(true),
                }
            }
        }
        Ok(false)
    })();
    let why = match outcome {
        // A job that ended its stream may still fail (an exception after its last step:
        // the hook finishes at exit either way): how its process ended is said too.
        Ok(true) => {
            if let Some(status) = child_exit(child, Duration::from_secs(5)) {
                let _ = tx.send((rank, Incoming::Report(Report::Exited { how: describe_exit(status), success: status.success() })));
            }
            return;
        }
        Ok(false) => match child_exit(child, Duration::from_secs(2)) {
            Some(status) if !status.success() => format!("{what} {}", describe_exit(status)),
            _ => format!("{what} stopped sending without saying why ({who})"),
        },
        // The job closes a viewer it refuses without a byte: over TCP, a wrong token.
        Err(StreamError::Empty) => match child_exit(child, Duration::from_secs(2)) {
            Some(status) if !status.success() => format!("{what} {}", describe_exit(status)),
            _ if token => format!("{who} refused the token: give the one the job printed when it started (--token, or --token-file FILE)"),
            _ => format!("{what} closed the connection before its stream began ({who})"),
        },
        Err(StreamError::Io(e)) => format!("{what}: the connection broke ({who}): {e}"),
        Err(e) => format!("{what} sent a broken stream and was dropped ({who}): {e}"),
    };
    let _ = tx.send((rank, Incoming::Report(Report::Error(why))));
    let _ = tx.send((rank, Incoming::Report(Report::Finished)));
}

impl JobSource {
    fn new(name: String) -> (JobSource, Sender<Fed>) {
        let (tx, rx) = crossbeam_channel::bounded(QUEUE);
        let s = JobSource {
            items: rx,
            controls: Arc::new(Mutex::new(Controls::default())),
            child: Arc::new(Mutex::new(None)),
            name,
            threads: Vec::new(),
            output: None,
            sockets: None,
        };
        (s, tx)
    }

    fn add_rank(&mut self, rank: u32, endpoint: &Endpoint, token: Option<&str>, tx: &Sender<Fed>, what: &str) -> Result<(), ChannelError> {
        let (r, w) = connect(endpoint, token)?;
        self.controls.lock().unwrap_or_else(|e| e.into_inner()).add(rank, w);
        let (tx, child, who, what, token) = (tx.clone(), self.child.clone(), endpoint.to_string(), what.to_string(), token.is_some());
        let t = std::thread::Builder::new().name(format!("vramscope-rank{rank}")).spawn(move || read_stream(rank, who, token, r, &tx, &child, &what))?;
        self.threads.push(t);
        Ok(())
    }

    /// Attaches to running producers: (rank, endpoint) each.
    pub fn attach(name: String, endpoints: &[(u32, Endpoint)], token: Option<&str>) -> Result<JobSource, ChannelError> {
        let (mut s, tx) = JobSource::new(name);
        for (rank, ep) in endpoints {
            s.add_rank(*rank, ep, token, &tx, &format!("rank {rank}"))?;
        }
        Ok(s)
    }

    /// Starts `cmd` as job `job` (its producers listen as `<dir>/<job>-r<rank>.sock`) and
    /// connects to each rank as it appears, until the process ends. `what` names it in
    /// messages ("the training engine", "the job").
    pub fn launch(mut cmd: std::process::Command, job: &str, what: &str, output: Output) -> anyhow::Result<JobSource> {
        use std::process::Stdio;
        let sockets = dir::socket_dir()?;
        cmd.env("VRAMSCOPE_JOB", job).env("VRAMSCOPE_SOCKET_DIR", &sockets).env("VRAMSCOPE_WAIT_FOR_VIEWER", "1");
        cmd.stdin(Stdio::null());
        match &output {
            Output::Inherit => {}
            Output::InheritToStderr => {
                cmd.stdout(Stdio::from(std::io::stderr()));
            }
            Output::Capture => {
                cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            }
            Output::File(p) => {
                use std::os::unix::fs::OpenOptionsExt;
                let f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(p)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
                cmd.stdout(f.try_clone()?).stderr(f);
            }
        }
        let mut child = cmd.spawn().map_err(|e| anyhow::anyhow!("starting {what} ({:?}): {e}", cmd.get_program()))?;
        let (mut s, tx) = JobSource::new(job.to_string());
        s.sockets = Some(sockets.clone());
        if let Output::Capture = output {
            if let Some(o) = child.stdout.take() {
                forward_lines(o, tx.clone());
            }
            if let Some(e) = child.stderr.take() {
                forward_lines(e, tx.clone());
            }
        }
        *s.child.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
        if let Output::File(p) = output {
            follow_file(p.clone(), tx.clone(), s.child.clone());
            s.output = Some(p);
        }
        let (child, controls, job, what) = (s.child.clone(), s.controls.clone(), job.to_string(), what.to_string());
        let t = std::thread::Builder::new().name("vramscope-discover".into()).spawn(move || discover(&sockets, &job, &what, &tx, &child, &controls))?;
        s.threads.push(t);
        Ok(s)
    }

    /// The next item from any rank; None once every stream and the process have ended.
    pub fn next(&self) -> Option<Fed> {
        self.items.recv().ok()
    }

    pub fn receiver(&self) -> &Receiver<Fed> {
        &self.items
    }

    /// Sends a control to every rank (a rank that went away is skipped; before any rank
    /// has connected, it waits for the first).
    pub fn send(&self, c: &Control) {
        let line = serde_json::to_string(c).expect("controls serialize") + "\n";
        self.controls.lock().unwrap_or_else(|e| e.into_inner()).send(&line);
    }

    /// The pid of a launched job's process.
    pub fn child_pid(&self) -> Option<u32> {
        self.child.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|c| c.id())
    }

    /// Stops a launched job: SIGINT (as ctrl-c would), then SIGTERM and SIGKILL if it does
    /// not end. Returns how it ended.
    pub fn stop_child(&self, grace: Duration) -> Option<ExitStatus> {
        let pid = self.child_pid()? as i32;
        for (sig, wait) in [(libc::SIGINT, grace), (libc::SIGTERM, grace), (libc::SIGKILL, Duration::from_secs(5))] {
            // SAFETY: a pid of our own child, which we have not reaped.
            unsafe { libc::kill(-pid, sig) };
            unsafe { libc::kill(pid, sig) };
            if let Some(s) = self.wait_child(wait) {
                return Some(s);
            }
        }
        None
    }

    /// Waits for a launched job's process to end (it ends by itself after its stream).
    pub fn wait_child(&self, wait: Duration) -> Option<ExitStatus> {
        let ended = child_exit(&self.child, wait);
        if ended.is_some() {
            self.remove_leftovers();
        }
        ended
    }

    /// Removes the sockets and token files the ended job's ranks left behind.
    fn remove_leftovers(&self) {
        let Some(dir) = &self.sockets else { return };
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            let socket = dir::parse_socket_name(name).is_some_and(|(j, _)| j == self.name);
            let token = name.strip_suffix(".token").and_then(|stem| stem.rsplit_once("-r")).is_some_and(|(j, r)| j == self.name && r.parse::<u32>().is_ok());
            if socket || token {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// Lets go of a launched job: it runs on without a viewer.
    pub fn detach(&self) {
        *self.controls.lock().unwrap_or_else(|e| e.into_inner()) = Controls::default();
        self.child.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// Connects to the launched job's ranks as their sockets appear, and says how the process
/// ended if no rank ever streamed.
fn discover(dir: &Path, job: &str, what: &str, tx: &Sender<Fed>, child: &ChildSlot, controls: &Arc<Mutex<Controls>>) {
    let mut seen = BTreeSet::new();
    let mut readers: Vec<JoinHandle<()>> = Vec::new();
    loop {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let name = e.file_name();
                let Some((j, rank)) = name.to_str().and_then(dir::parse_socket_name) else { continue };
                if j != job || seen.contains(&rank) {
                    continue;
                }
                let ep = Endpoint::Unix(e.path());
                // An error: not listening yet (bound, not accepting), or a stale file: next round.
                if let Ok((r, w)) = connect(&ep, None) {
                    seen.insert(rank);
                    controls.lock().unwrap_or_else(|e| e.into_inner()).add(rank, w);
                    let (tx, child, who) = (tx.clone(), child.clone(), ep.to_string());
                    let what = if rank == 0 { what.to_string() } else { format!("{what} (rank {rank})") };
                    if let Ok(t) = std::thread::Builder::new().name(format!("vramscope-rank{rank}")).spawn(move || read_stream(rank, who, false, r, &tx, &child, &what)) {
                        readers.push(t);
                    }
                }
            }
        }
        let exited = child.lock().unwrap_or_else(|e| e.into_inner()).as_mut().is_none_or(|c| matches!(c.try_wait(), Ok(Some(_))));
        if exited {
            break;
        }
        std::thread::sleep(DISCOVER_EVERY);
    }
    for r in readers {
        let _ = r.join();
    }
    if seen.is_empty() {
        let why = match child.lock().unwrap_or_else(|e| e.into_inner()).as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            Some(s) => format!("{what} {} before it began streaming", describe_exit(s)),
            None => format!("{what} ended before it began streaming"),
        };
        let _ = tx.send((0, Incoming::Report(Report::Error(why))));
        let _ = tx.send((0, Incoming::Report(Report::Finished)));
    }
}

/// How young a socket nobody answers on may be and still be a job starting up.
const SOCKET_GRACE: Duration = Duration::from_secs(10);

/// Running jobs in the socket directory, by job name: (rank, socket) each. Sockets nobody
/// answers on (jobs that died) are removed, unless made in the last seconds: a job's server
/// binds its socket a moment before it listens.
pub fn list_jobs() -> Result<BTreeMap<String, Vec<(u32, Endpoint)>>, ChannelError> {
    let dir = dir::socket_dir()?;
    let mut jobs: BTreeMap<String, Vec<(u32, Endpoint)>> = BTreeMap::new();
    for e in std::fs::read_dir(&dir)?.flatten() {
        let name = e.file_name();
        let Some((job, rank)) = name.to_str().and_then(dir::parse_socket_name) else { continue };
        if UnixStream::connect(e.path()).is_err() {
            let new = e.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok()).is_some_and(|age| age < SOCKET_GRACE);
            if !new {
                let _ = std::fs::remove_file(e.path());
            }
            continue;
        }
        jobs.entry(job.to_string()).or_default().push((rank, Endpoint::Unix(e.path())));
    }
    for ranks in jobs.values_mut() {
        ranks.sort_by_key(|r| r.0);
    }
    Ok(jobs)
}

/// Where a launched job's output goes.
pub enum Output {
    /// The terminal's (headless runs: the job's output passes through).
    Inherit,
    /// The terminal's, the job's stdout going to stderr: `--json` keeps stdout for its own
    /// lines, which a job printing beside them could split.
    InheritToStderr,
    /// Into the job's log on screen, line by line (vramscope's engine, which lives and dies
    /// with its viewer).
    Capture,
    /// Into this new file (0600), whose lines the screen shows: a user's job, which must
    /// be able to outlive its viewer without its prints failing.
    File(PathBuf),
}

/// Sends each line `r` yields to the job's log (rank 0) until it ends.
fn forward_lines(r: impl Read + Send + 'static, tx: Sender<Fed>) {
    let _ = std::thread::Builder::new().name("vramscope-output".into()).spawn(move || {
        for line in std::io::BufReader::new(r).lines() {
            let Ok(line) = line else { return };
            if tx.send((0, Incoming::Report(Report::Note(line)))).is_err() {
                return;
            }
        }
    });
}

/// Follows a file the job writes, sending new whole lines to the job's log, until the job
/// has ended and the file has no more.
fn follow_file(path: PathBuf, tx: Sender<Fed>, child: ChildSlot) {
    let _ = std::thread::Builder::new().name("vramscope-output".into()).spawn(move || {
        let Ok(f) = std::fs::File::open(&path) else { return };
        let mut r = std::io::BufReader::new(f);
        let mut line = String::new();
        loop {
            match r.read_line(&mut line) {
                Ok(0) => {
                    if child_exit(&child, Duration::ZERO).is_some() || child.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                Ok(_) if line.ends_with('\n') => {
                    let text = line.trim_end().to_string();
                    line.clear();
                    if tx.send((0, Incoming::Report(Report::Note(text)))).is_err() {
                        return;
                    }
                }
                // Half a line: wait for the rest.
                Ok(_) => std::thread::sleep(Duration::from_millis(50)),
                Err(_) => return,
            }
        }
    });
}
