//! The job's side of the channel. It listens where the job's owner said, lets in only that
//! owner (on a Unix socket, the peer's uid; on TCP, the token), and gives every attached
//! viewer its own bounded queue and writer thread: a slow, absent or killed viewer never
//! blocks the job, and what a viewer misses is counted in the step reports it gets.

use std::collections::{HashSet, VecDeque};
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use crate::channel::{self, peer, token, ChannelError, Endpoint, HELLO_TIMEOUT};
use crate::stream::chunk::{header, ChunkWriter};
use crate::stream::{Control, Incoming, Report};

/// Where a job listens.
#[derive(Clone, Debug)]
pub enum Listen {
    Unix(PathBuf),
    Tcp { addr: SocketAddr, token: String },
}

impl Listen {
    /// Where rank `rank` of `job` listens: on TCP when `tcp` (`PORT` or `HOST:PORT`, each
    /// local rank one port up) is given, with a new token; else its Unix socket in the
    /// owner-only directory (`socket_dir`, or the default one).
    pub fn for_job(socket_dir: Option<&Path>, tcp: Option<&str>, job: &str, rank: u32, local_rank: u32) -> Result<Listen, ChannelError> {
        if let Some(l) = tcp {
            let mut addr = channel::parse_listen(l)?;
            if addr.port() != 0 {
                addr.set_port(addr.port() + local_rank as u16);
            }
            return Ok(Listen::Tcp { addr, token: token::new_token()? });
        }
        let d = match socket_dir {
            Some(d) => {
                channel::dir::ensure_private_dir(d)?;
                d.to_path_buf()
            }
            None => channel::dir::socket_dir()?,
        };
        Ok(Listen::Unix(channel::dir::socket_path(&d, job, rank)))
    }
}

/// Queued reports a viewer may fall behind by before it is dropped as stuck (batches are
/// dropped long before: they are bounded separately and counted).
const MAX_QUEUED_REPORTS: usize = 10_000;
/// How long a finishing job waits for its viewers to take the rest of its stream.
const FINISH_WAIT: Duration = Duration::from_secs(10);
/// zstd level on the wire: the job's CPU matters more than the bytes on a local socket.
pub const WIRE_ZSTD_LEVEL: i32 = 1;

/// Writes the job's lines (refused peers, where it listens) where its owner sees them.
pub type Log = Arc<dyn Fn(&str) + Send + Sync>;

struct Outbox {
    items: VecDeque<(u64, Incoming)>,
    batches: usize,
    reports: usize,
    dropped_batches: u64,
    dropped_events: u64,
    /// Set when the viewer went away or the job ended.
    closed: bool,
    /// The job ended normally: the writer sends the end record.
    finished: bool,
}

pub struct Client {
    /// Who it is, for log lines: "uid 0 pid 42" or "127.0.0.1:5123".
    pub peer: String,
    out: Mutex<Outbox>,
    wake: Condvar,
    capacity: usize,
}

impl Client {
    fn outbox(&self) -> std::sync::MutexGuard<'_, Outbox> {
        self.out.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues an item; batches beyond the queue's capacity are dropped and counted.
    fn push(&self, stamp: u64, item: Incoming) {
        let mut o = self.outbox();
        if o.closed {
            return;
        }
        match &item {
            Incoming::Batch(b) if o.batches >= self.capacity => {
                o.dropped_batches += 1;
                o.dropped_events += b.events.len() as u64;
                return;
            }
            Incoming::Batch(_) => o.batches += 1,
            _ if o.reports >= MAX_QUEUED_REPORTS => {
                // It stopped reading altogether: let it go rather than hold its backlog.
                o.closed = true;
                drop(o);
                self.wake.notify_all();
                return;
            }
            _ => o.reports += 1,
        }
        o.items.push_back((stamp, item));
        drop(o);
        self.wake.notify_all();
    }

    fn close(&self, finished: bool) {
        let mut o = self.outbox();
        o.closed = true;
        o.finished = finished;
        drop(o);
        self.wake.notify_all();
    }

    fn is_closed(&self) -> bool {
        self.outbox().closed
    }
}

/// See `Server::handle`.
#[derive(Clone)]
pub struct ServerHandle(Arc<Shared>);

impl ServerHandle {
    pub fn take_snapshot_request(&self) -> bool {
        self.0.snapshot.swap(false, Ordering::SeqCst)
    }

    pub fn viewers(&self) -> usize {
        self.0.clients.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

struct Shared {
    clients: Mutex<Vec<Arc<Client>>>,
    /// Let in, waiting for the session to send them what they missed.
    joining: Mutex<Vec<Arc<Client>>>,
    joined: Condvar,
    refused: Mutex<HashSet<String>>,
    /// Every viewer's writer thread, so the job's end can wait for them to drain.
    writers: Mutex<Vec<JoinHandle<()>>>,
    closing: AtomicBool,
    /// Set when a viewer asks the job to stop: a host checks it mid-step.
    stop: Arc<AtomicBool>,
    /// Set when a viewer asks for a snapshot: taken at the end of the step under way.
    snapshot: AtomicBool,
    controls: Sender<Control>,
    log: Log,
    capacity: usize,
    token: Option<String>,
}

impl Shared {
    /// A refused peer (`key`: its uid, or its address) is said once, not once per attempt.
    fn refuse(&self, key: &str, who: &str, why: &str) {
        if self.refused.lock().unwrap_or_else(|e| e.into_inner()).insert(key.to_string()) {
            (self.log)(&format!("vramscope: refused a connection from {who}: {why}"));
        }
    }
}

pub struct Server {
    shared: Arc<Shared>,
    /// Where it listens, with TCP's port resolved.
    pub endpoint: Endpoint,
    pub controls: Receiver<Control>,
    acceptor: Option<JoinHandle<()>>,
    socket_path: Option<PathBuf>,
    /// A TCP job's token file, removed when it ends as its socket would be.
    token_path: Option<PathBuf>,
}

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Server {
    /// Binds and starts accepting. A Unix socket goes in its owner-only directory (the
    /// caller made it) and is made 0600; an existing socket there is refused, never taken
    /// over, unless nothing answers on it (a job that died).
    pub fn bind(listen: &Listen, queue_batches: usize, log: Log) -> Result<Server, ChannelError> {
        let (listener, endpoint, token, socket_path) = match listen {
            Listen::Unix(path) => {
                if path.exists() {
                    if UnixStream::connect(path).is_ok() {
                        return Err(ChannelError::Refused(format!("{}: another job is listening there", path.display())));
                    }
                    std::fs::remove_file(path)?;
                }
                let l = UnixListener::bind(path)?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
                (Listener::Unix(l), Endpoint::Unix(path.clone()), None, Some(path.clone()))
            }
            Listen::Tcp { addr, token } => {
                let l = TcpListener::bind(addr).map_err(|e| ChannelError::Refused(format!("cannot listen on {addr}: {e}")))?;
                let a = l.local_addr()?;
                (Listener::Tcp(l), Endpoint::Tcp(a), Some(token.clone()), None)
            }
        };
        let (ctl_tx, ctl_rx) = crossbeam_channel::bounded(256);
        let shared = Arc::new(Shared {
            clients: Mutex::new(Vec::new()),
            joining: Mutex::new(Vec::new()),
            joined: Condvar::new(),
            refused: Mutex::new(HashSet::new()),
            writers: Mutex::new(Vec::new()),
            closing: AtomicBool::new(false),
            stop: Arc::new(AtomicBool::new(false)),
            snapshot: AtomicBool::new(false),
            controls: ctl_tx,
            log,
            capacity: queue_batches.max(1),
            token,
        });
        let s2 = shared.clone();
        let acceptor = std::thread::Builder::new().name("vramscope-accept".into()).spawn(move || accept_loop(listener, s2))?;
        Ok(Server { shared, endpoint, controls: ctl_rx, acceptor: Some(acceptor), socket_path, token_path: None })
    }

    /// Binds for rank `rank` of `job` and, on TCP, tells the job's owner how to attach: the
    /// address and token on the job's stderr, and the token in a file only they can read.
    pub fn bind_job(listen: &Listen, job: &str, rank: u32, queue_batches: usize, log: Log) -> Result<Server, ChannelError> {
        let mut server = Server::bind(listen, queue_batches, log.clone())?;
        if let Listen::Tcp { token, .. } = listen {
            let file = channel::dir::socket_dir()?.join(format!("{job}-r{rank}.token"));
            let _ = std::fs::remove_file(&file);
            token::write_token_file(&file, token)?;
            server.token_path = Some(file.clone());
            log(&format!(
                "vramscope: rank {rank} listening on {ep}; attach with: vramscope attach {ep} --token-file {} (token {token})",
                file.display(),
                ep = server.endpoint
            ));
        }
        Ok(server)
    }

    /// Viewers let in since the last call; the caller queues what they missed, then `admit`s
    /// them so they get the stream from here on.
    pub fn take_joining(&self) -> Vec<Arc<Client>> {
        std::mem::take(&mut *self.shared.joining.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Queues `items` for `client` ahead of the stream and adds it to the broadcast.
    pub fn admit(&self, client: Arc<Client>, items: Vec<(u64, Incoming)>) {
        for (stamp, item) in items {
            client.push(stamp, item);
        }
        self.shared.clients.lock().unwrap_or_else(|e| e.into_inner()).push(client);
    }

    /// Waits up to `timeout` for a first viewer to be let in; true if one was.
    pub fn wait_for_viewer(&self, timeout: Duration) -> bool {
        let j = self.shared.joining.lock().unwrap_or_else(|e| e.into_inner());
        let (j, _) = self.shared.joined.wait_timeout_while(j, timeout, |j| j.is_empty()).unwrap_or_else(|e| e.into_inner());
        !j.is_empty()
    }

    /// Sends an item to every attached viewer.
    pub fn broadcast(&self, stamp: u64, item: &Incoming) {
        let mut clients = self.shared.clients.lock().unwrap_or_else(|e| e.into_inner());
        clients.retain(|c| !c.is_closed());
        for c in clients.iter() {
            c.push(stamp, item.clone());
        }
    }

    /// Whether a viewer asked for a snapshot since the last call.
    pub fn take_snapshot_request(&self) -> bool {
        self.handle().take_snapshot_request()
    }

    /// What a host's thread asks of the server at each step's end without the session's
    /// lock: whether a snapshot was asked for, and how many viewers there are.
    pub fn handle(&self) -> ServerHandle {
        ServerHandle(self.shared.clone())
    }

    /// Raised when a viewer asks the job to stop (hosts may raise it too, on SIGTERM).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.shared.stop.clone()
    }

    /// The job cannot start: every viewer let in so far hears why, then the stream ends.
    pub fn fail(&mut self, why: &str) {
        for c in self.take_joining() {
            self.admit(c, vec![(0, Incoming::Report(Report::Error(why.to_string()))), (0, Incoming::Report(Report::Finished))]);
        }
        self.finish();
    }

    pub fn viewers(&self) -> usize {
        self.handle().viewers()
    }

    /// Events dropped because a viewer's queue was full, summed over the viewers here now.
    pub fn dropped_events(&self) -> u64 {
        self.shared.clients.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|c| c.outbox().dropped_events).sum()
    }

    /// Ends every viewer's stream with the end record (after what is queued), waits a
    /// bounded time for them to take it, and stops listening.
    pub fn finish(&mut self) {
        self.shared.closing.store(true, Ordering::SeqCst);
        for c in self.shared.clients.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            c.close(true);
        }
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
        for p in [self.socket_path.take(), self.token_path.take()].into_iter().flatten() {
            let _ = std::fs::remove_file(p);
        }
        // A job's last reports must reach its viewers before the process exits; a viewer
        // that reads nothing may hold it only this long.
        let deadline = std::time::Instant::now() + FINISH_WAIT;
        let writers = std::mem::take(&mut *self.shared.writers.lock().unwrap_or_else(|e| e.into_inner()));
        for w in writers {
            while !w.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if w.is_finished() {
                let _ = w.join();
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.finish();
    }
}

fn poll_readable(fd: i32, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, timeout_ms) > 0 }
}

fn accept_loop(listener: Listener, shared: Arc<Shared>) {
    let fd = match &listener {
        Listener::Unix(l) => l.as_raw_fd(),
        Listener::Tcp(l) => l.as_raw_fd(),
    };
    while !shared.closing.load(Ordering::SeqCst) {
        // Wakes to notice the job ending.
        if !poll_readable(fd, 100) {
            continue;
        }
        match &listener {
            Listener::Unix(l) => {
                if let Ok((s, _)) = l.accept() {
                    let who = match peer::check_same_user(&s) {
                        Ok(c) => format!("uid {} pid {}", c.uid, c.pid),
                        Err(c) => {
                            shared.refuse(&format!("uid {}", c.uid), &format!("uid {} (pid {})", c.uid, c.pid), "only the job's owner may watch it");
                            continue;
                        }
                    };
                    let (r, w) = match s.try_clone() {
                        Ok(r) => (r, s),
                        Err(_) => continue,
                    };
                    let _ = r.set_read_timeout(Some(HELLO_TIMEOUT));
                    spawn_client(&shared, who, Box::new(r), Box::new(w));
                }
            }
            Listener::Tcp(l) => {
                if let Ok((s, addr)) = l.accept() {
                    let _ = s.set_nodelay(true);
                    let (r, w) = match s.try_clone() {
                        Ok(r) => (r, s),
                        Err(_) => continue,
                    };
                    let _ = r.set_read_timeout(Some(HELLO_TIMEOUT));
                    spawn_client(&shared, addr.to_string(), Box::new(r), Box::new(w));
                }
            }
        }
    }
}

/// A peer as refusals count it: its uid, or its address without the port.
fn peer_key(who: &str) -> String {
    who.parse::<SocketAddr>().map(|a| a.ip().to_string()).unwrap_or_else(|_| who.split(" pid").next().unwrap_or(who).to_string())
}

trait Conn: std::io::Read + Send {
    fn clear_timeout(&self);
}
impl Conn for UnixStream {
    fn clear_timeout(&self) {
        let _ = self.set_read_timeout(None);
    }
}
impl Conn for TcpStream {
    fn clear_timeout(&self) {
        let _ = self.set_read_timeout(None);
    }
}

/// Reads the viewer's hello (and checks the token) on its own thread, so a silent peer
/// holds up nobody; then the viewer's control lines.
fn spawn_client(shared: &Arc<Shared>, who: String, r: Box<dyn Conn>, w: Box<dyn Write + Send>) {
    let shared = shared.clone();
    let _ = std::thread::Builder::new().name("vramscope-viewer".into()).spawn(move || {
        let mut r = BufReader::new(r);
        let hello = match channel::read_line(&mut r) {
            Ok(Some(line)) => channel::parse_hello(&line),
            Ok(None) => return,
            Err(e) => Err(e.to_string()),
        };
        let token_ok = match (&hello, &shared.token) {
            (Err(why), _) => {
                shared.refuse(&peer_key(&who), &who, why);
                return;
            }
            (Ok(given), Some(expected)) => given.as_deref().is_some_and(|g| token::tokens_equal(g, expected)),
            (Ok(_), None) => true,
        };
        if !token_ok {
            shared.refuse(&peer_key(&who), &who, "wrong or missing token");
            return;
        }
        r.get_ref().clear_timeout();
        let client = Arc::new(Client {
            peer: who,
            out: Mutex::new(Outbox { items: VecDeque::new(), batches: 0, reports: 0, dropped_batches: 0, dropped_events: 0, closed: false, finished: false }),
            wake: Condvar::new(),
            capacity: shared.capacity,
        });
        let c2 = client.clone();
        match std::thread::Builder::new().name("vramscope-send".into()).spawn(move || write_loop(&c2, w)) {
            Ok(h) => shared.writers.lock().unwrap_or_else(|e| e.into_inner()).push(h),
            Err(_) => return,
        }
        shared.joining.lock().unwrap_or_else(|e| e.into_inner()).push(client.clone());
        shared.joined.notify_all();
        read_controls(&shared, &client, r);
    });
}

fn read_controls(shared: &Shared, client: &Client, mut r: BufReader<Box<dyn Conn>>) {
    loop {
        match channel::read_line(&mut r) {
            Ok(Some(line)) => match serde_json::from_str::<Control>(&line) {
                // A full queue means a viewer sends faster than steps run: extra controls go.
                Ok(Control::Snapshot) => shared.snapshot.store(true, Ordering::SeqCst),
                Ok(c) => {
                    if c == Control::Stop {
                        shared.stop.store(true, Ordering::SeqCst);
                    }
                    let _ = shared.controls.try_send(c);
                }
                Err(e) => {
                    (shared.log)(&format!("vramscope: dropped the viewer at {}: it sent a control that is not one ({e})", client.peer));
                    break;
                }
            },
            Ok(None) => break,
            Err(e) => {
                if !client.is_closed() {
                    (shared.log)(&format!("vramscope: dropped the viewer at {}: {e}", client.peer));
                }
                break;
            }
        }
    }
    client.close(false);
}

fn write_loop(client: &Client, mut w: Box<dyn Write + Send>) {
    let mut cw = ChunkWriter::new(WIRE_ZSTD_LEVEL, u64::MAX);
    if w.write_all(&header()).is_err() {
        client.close(false);
        return;
    }
    loop {
        let (items, dropped, closed, finished) = {
            let mut o = client.outbox();
            while o.items.is_empty() && !o.closed {
                o = client.wake.wait(o).unwrap_or_else(|e| e.into_inner());
            }
            let items = std::mem::take(&mut o.items);
            (o.batches, o.reports) = (0, 0);
            (items, (o.dropped_batches, o.dropped_events), o.closed, o.finished)
        };
        let mut out: Vec<Vec<u8>> = Vec::new();
        for (stamp, mut item) in items {
            // Each viewer hears what it, not another viewer, missed.
            if let Incoming::Report(Report::Step(s)) = &mut item {
                (s.dropped_batches, s.dropped_events) = dropped;
            }
            match cw.push(stamp, 0, &item) {
                Ok(chunks) => out.extend(chunks),
                Err(_) => continue,
            }
        }
        out.extend(if finished { cw.end() } else { cw.flush() });
        for chunk in out {
            if w.write_all(&chunk).is_err() {
                client.close(false);
                return;
            }
        }
        if closed {
            let _ = w.flush();
            return;
        }
    }
}
