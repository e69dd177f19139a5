//! The endpoint's HTTP server: hyper's HTTP/1.1 on a tokio runtime of its own, on a thread
//! of its own, so no scrape, slow client or flood of connections reaches the job or the
//! screen. `GET` and `HEAD /metrics` are answered with the registry's text; other paths
//! 404, other methods 405.
//!
//! - Connections are served concurrently and kept alive; at most [`MAX_CONNECTIONS`] are
//!   open at once, and one past that is answered 503 and closed, so a flood costs bounded
//!   memory (each connection's buffers are bounded by [`MAX_HEADER_BYTES`]).
//! - A request's headers must arrive within [`HEADER_TIMEOUT`] of the server waiting for
//!   them, and that wait starts again after each response, so it is the idle keep-alive
//!   timeout too: a client that sends nothing, or its headers a byte at a time, is dropped.
//! - A response the client does not read within [`WRITE_TIMEOUT`] drops its connection.
//! - The content type is negotiated as Prometheus does: OpenMetrics when the `Accept`
//!   header prefers `application/openmetrics-text`, else the classic text format 0.0.4.
//!   gzip when `Accept-Encoding` allows it (Prometheus asks for it at every scrape).

use std::future::Future;
use std::io::Write as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{oneshot, Semaphore};

/// Connections served at once. A Prometheus server or two, health checks and people with
/// curl need a handful; the rest of the 256 is headroom, and 256 connections' buffers are
/// a few MiB at most.
pub const MAX_CONNECTIONS: usize = 256;

/// Connections the kernel holds for the server to take (std's bind gives 128): a burst of
/// scrapes and idle connections larger than that, arriving while the machine is busy,
/// would have its handshakes dropped and retried a second or three later.
const BACKLOG: u32 = 1024;

/// How long a client may take to send a request's headers, counted from when the server
/// waits for them (the connection's opening, or the end of its last response). A scraper
/// sends its ~300 bytes of headers in one write, within milliseconds even across a busy
/// cluster network; 5 s is generous for it, is what the hand-written server allowed, and
/// is Apache's keep-alive timeout. Prometheus's scrapes further apart than that open a
/// fresh connection, which costs one handshake.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a response may wait on a client that does not read it.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The most a request's line and headers may take (a scrape's are under 1 KiB); past it
/// the answer is 431. Also the bound on each connection's read buffer.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// OpenMetrics text, as prometheus-client writes it.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Prometheus's classic text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Said to a connection past [`MAX_CONNECTIONS`] before it is closed.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\nRetry-After: 1\r\n\r\n";

pub struct Server {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds `addr` now (so a taken port or a bad address is an error before anything
    /// runs), then serves on a thread of its own until dropped.
    pub fn start(addr: SocketAddr, registry: Registry) -> std::io::Result<Server> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
        let listener = {
            let _in = rt.enter();
            let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
            // As std's bind: a port in TIME_WAIT can be bound again, one listened on cannot.
            socket.set_reuseaddr(true)?;
            socket.bind(addr)?;
            socket.listen(BACKLOG)?
        };
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let registry = Arc::new(registry);
        let thread = std::thread::Builder::new().name("vramscope-metrics".into()).spawn(move || {
            rt.block_on(async move {
                tokio::select! {
                    _ = stopped => {}
                    _ = serve(listener, registry) => {}
                }
            });
            // Dropping the runtime drops every connection still open.
            drop(rt);
        })?;
        Ok(Server { addr, stop: Some(stop), thread: Some(thread) })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn serve(listener: TcpListener, registry: Arc<Registry>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES)
        .max_header_size(MAX_HEADER_BYTES)
        .keep_alive(true);
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            // Out of file descriptors, or a connection reset before it was taken: the
            // next accept may do better once a connection has closed.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            let _ = stream.try_write(BUSY);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let registry = registry.clone();
        let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
            let res = respond(req.method(), req.uri().path(), req.headers(), &registry);
            async move { Ok::<_, std::convert::Infallible>(res) }
        });
        let conn = http.serve_connection(TokioIo::new(WriteDeadline::new(stream)), service);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(slot);
        });
    }
}

/// The answer to one request.
pub fn respond(method: &Method, path: &str, headers: &HeaderMap, registry: &Registry) -> Response<Full<Bytes>> {
    let plain = |status: StatusCode, body: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *r.status_mut() = status;
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        r
    };
    if path != "/metrics" {
        return plain(StatusCode::NOT_FOUND, "vramscope serves /metrics only\n");
    }
    if method != Method::GET && method != Method::HEAD {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "/metrics answers GET and HEAD\n");
        r.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let openmetrics = wants_openmetrics(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    let mut text = String::new();
    let encoded = if openmetrics {
        prometheus_client::encoding::text::encode(&mut text, registry)
    } else {
        prometheus_client::encoding::text::encode_registry(&mut text, registry).map(|()| text = classic(&text))
    };
    if encoded.is_err() {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, "the metrics could not be encoded\n");
    }
    let gzip = accepts_gzip(headers.get(header::ACCEPT_ENCODING).and_then(|v| v.to_str().ok()));
    let body = if gzip { gzipped(text.as_bytes()) } else { Bytes::from(text) };
    let mut r = Response::new(Full::new(body));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(if openmetrics { OPENMETRICS } else { PROMETHEUS_TEXT }));
    h.insert(header::VARY, HeaderValue::from_static("Accept, Accept-Encoding"));
    if gzip {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    r
}

fn gzipped(text: &[u8]) -> Bytes {
    let mut gz = flate2::write::GzEncoder::new(Vec::with_capacity(text.len() / 4 + 64), flate2::Compression::default());
    // Writing into a Vec cannot fail.
    let _ = gz.write_all(text);
    Bytes::from(gz.finish().unwrap_or_default())
}

/// Each media range of an `Accept`-style header with its quality (1 when not given).
fn ranges(header: &str) -> impl Iterator<Item = (String, f32)> + '_ {
    header.split(',').filter_map(|range| {
        let mut parts = range.split(';');
        let what = parts.next()?.trim().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
            .map_or(1.0, |(_, v)| v.trim().parse::<f32>().unwrap_or(0.0));
        (!what.is_empty()).then_some((what, q))
    })
}

/// Whether a scraper's `Accept` prefers OpenMetrics to the classic text (which is what a
/// client that names neither, like curl, gets). Prometheus asks for OpenMetrics first.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    let (mut om, mut text) = (0.0f32, 0.0f32);
    for (what, q) in ranges(accept.unwrap_or("")) {
        match what.as_str() {
            "application/openmetrics-text" => om = om.max(q),
            "text/plain" | "text/*" | "*/*" => text = text.max(q),
            _ => {}
        }
    }
    om > 0.0 && om >= text
}

/// Whether `Accept-Encoding` allows gzip.
pub fn accepts_gzip(accept_encoding: Option<&str>) -> bool {
    let mut gzip = None;
    let mut any = 0.0f32;
    for (what, q) in ranges(accept_encoding.unwrap_or("")) {
        match what.as_str() {
            "gzip" | "x-gzip" => gzip = Some(gzip.unwrap_or(0.0f32).max(q)),
            "*" => any = q,
            _ => {}
        }
    }
    gzip.unwrap_or(any) > 0.0
}

/// prometheus-client's OpenMetrics text (without its `# EOF`) as the classic text format
/// 0.0.4: a counter's family is named as its samples are, with `_total`, and there are no
/// `# UNIT` lines. Samples and labels are written alike in both.
pub fn classic(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> =
        openmetrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::with_capacity(openmetrics.len() + 16 * counters.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let descriptor = ["# HELP ", "# TYPE "].into_iter().find_map(|p| Some((p, line.strip_prefix(p)?)));
        match descriptor {
            Some((p, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let tail = if p == "# TYPE " && tail == "unknown" { "untyped" } else { tail };
                let total = if counters.contains(name) { "_total" } else { "" };
                out.push_str(&format!("{p}{name}{total} {tail}\n"));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// A connection whose writes fail once the client has read none of a response for
/// [`WRITE_TIMEOUT`]: the clock starts when a write would block and stops when a flush
/// (the end of a response) goes through.
struct WriteDeadline {
    io: TcpStream,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl WriteDeadline {
    fn new(io: TcpStream) -> WriteDeadline {
        WriteDeadline { io, stalled: None }
    }

    fn pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<T>> {
        let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_TIMEOUT)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the client read no response"))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for WriteDeadline {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteDeadline {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let me = self.get_mut();
        match Pin::new(&mut me.io).poll_write(cx, buf) {
            Poll::Pending => me.pending(cx),
            done => done,
        }
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        let me = self.get_mut();
        match Pin::new(&mut me.io).poll_write_vectored(cx, bufs) {
            Poll::Pending => me.pending(cx),
            done => done,
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let me = self.get_mut();
        match Pin::new(&mut me.io).poll_flush(cx) {
            Poll::Pending => me.pending(cx),
            done => {
                me.stalled = None;
                done
            }
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let me = self.get_mut();
        match Pin::new(&mut me.io).poll_shutdown(cx) {
            Poll::Pending => me.pending(cx),
            done => done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Instant;

    fn registry() -> Registry {
        let mut registry = Registry::default();
        let g = prometheus_client::metrics::gauge::Gauge::<i64>::default();
        g.set(7);
        registry.register("vramscope_test", "a test gauge", g);
        let c = prometheus_client::metrics::counter::Counter::<u64>::default();
        c.inc_by(3);
        registry.register("vramscope_things", "a test counter", c);
        registry
    }

    /// One request on a fresh connection: the whole answer.
    fn ask(addr: SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_metrics_and_nothing_else() {
        let s = Server::start("127.0.0.1:0".parse().unwrap(), registry()).unwrap();
        let ok = ask(s.addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK") && ok.contains("vramscope_test 7"), "{ok}");
        assert!(ok.contains(&format!("content-type: {PROMETHEUS_TEXT}")), "{ok}");
        assert!(ask(s.addr, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").starts_with("HTTP/1.1 404"));
        let post = ask(s.addr, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405") && post.contains("allow: GET, HEAD"), "{post}");
        let head = ask(s.addr, "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200 OK") && head.ends_with("\r\n\r\n") && head.contains("content-length: "), "{head}");
        // A port already taken is an error, not a silent second server.
        assert!(Server::start(s.addr, Registry::default()).is_err());
    }

    #[test]
    fn an_idle_connection_is_closed_at_the_header_timeout_and_the_server_stops_when_dropped() {
        let s = Server::start("127.0.0.1:0".parse().unwrap(), registry()).unwrap();
        let mut idle = TcpStream::connect(s.addr).unwrap();
        idle.set_read_timeout(Some(HEADER_TIMEOUT + Duration::from_secs(3))).unwrap();
        let started = Instant::now();
        // Closed by the server (no answer, then the end), not timed out on our side.
        let r = idle.read(&mut [0u8; 64]);
        let took = started.elapsed();
        assert!(matches!(r, Ok(0)), "{r:?} after {took:?}");
        assert!(took >= HEADER_TIMEOUT - Duration::from_millis(100) && took < HEADER_TIMEOUT + Duration::from_secs(2), "{took:?}");
        let addr = s.addr;
        drop(s);
        assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(), "still listening after drop");
    }

    #[test]
    fn a_body_far_larger_than_the_buffers_is_served_whole() {
        // A big job's figures: many ranks, each with its categories and phases.
        let mut registry = Registry::default();
        let family = prometheus_client::metrics::family::Family::<Vec<(String, String)>, prometheus_client::metrics::gauge::Gauge>::default();
        for i in 0..5000 {
            family.get_or_create(&vec![("rank".into(), i.to_string()), ("phase".into(), format!("block_{i}.attention"))]).set(i);
        }
        registry.register("vramscope_big", "a big family", family);
        let s = Server::start("127.0.0.1:0".parse().unwrap(), registry).unwrap();
        let ok = ask(s.addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let (head, body) = ok.split_once("\r\n\r\n").unwrap();
        assert!(body.len() > 16 * MAX_HEADER_BYTES, "{}", body.len());
        assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
        assert_eq!(body.lines().filter(|l| l.starts_with("vramscope_big{")).count(), 5000);
        assert!(body.contains("vramscope_big{rank=\"4999\",phase=\"block_4999.attention\"} 4999\n"));
    }

    #[test]
    fn content_types_are_negotiated_as_prometheus_asks() {
        // Prometheus 2.x's scrape Accept header.
        let prom = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(wants_openmetrics(Some(prom)));
        assert!(!wants_openmetrics(Some("text/plain;version=0.0.4;q=1,*/*;q=0.1")));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(None));
        assert!(!wants_openmetrics(Some("application/openmetrics-text;q=0")));
        assert!(accepts_gzip(Some("gzip")));
        assert!(accepts_gzip(Some("deflate, gzip;q=0.5")));
        assert!(accepts_gzip(Some("*")));
        assert!(!accepts_gzip(Some("gzip;q=0, *")));
        assert!(!accepts_gzip(Some("identity")));
        assert!(!accepts_gzip(None));
    }

    #[test]
    fn the_classic_text_names_counters_families_with_their_total() {
        let mut om = String::new();
        prometheus_client::encoding::text::encode(&mut om, &registry()).unwrap();
        assert!(om.contains("# TYPE vramscope_things counter\nvramscope_things_total 3\n") && om.ends_with("# EOF\n"), "{om}");
        let text = classic(&om);
        assert!(text.contains("# HELP vramscope_things_total a test counter.\n# TYPE vramscope_things_total counter\nvramscope_things_total 3\n"), "{text}");
        assert!(text.contains("# TYPE vramscope_test gauge\nvramscope_test 7\n") && !text.contains("# EOF"), "{text}");
    }

    #[test]
    fn gzip_and_openmetrics_when_asked() {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_static("application/openmetrics-text;version=1.0.0"));
        h.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        let r = respond(&Method::GET, "/metrics", &h, &registry());
        assert_eq!(r.headers()[header::CONTENT_TYPE], OPENMETRICS);
        assert_eq!(r.headers()[header::CONTENT_ENCODING], "gzip");
        let body = futures::executor::block_on(http_body_util::BodyExt::collect(r.into_body())).unwrap().to_bytes();
        let mut text = String::new();
        flate2::read::GzDecoder::new(&body[..]).read_to_string(&mut text).unwrap();
        assert!(text.contains("vramscope_things_total 3") && text.ends_with("# EOF\n"), "{text}");
    }
}
