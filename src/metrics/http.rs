//! The smallest HTTP server that Prometheus needs: `GET /metrics` answered with the
//! registry's text, anything else 404, one connection at a time on its own thread.
//! Requests are bounded (a line of at most 4 KiB, 5 s to send it).

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus_client::registry::Registry;

/// Prometheus's text format, as the OpenMetrics flavour prometheus-client writes.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

pub struct Server {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    pub fn start(addr: SocketAddr, registry: Registry) -> std::io::Result<Server> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::Builder::new().name("vramscope-metrics".into()).spawn(move || {
            for conn in listener.incoming() {
                if s2.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(c) = conn {
                    let _ = answer(c, &registry);
                }
            }
        })?;
        Ok(Server { addr, stop, thread: Some(thread) })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept with a connection of our own.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn answer(c: TcpStream, registry: &Registry) -> std::io::Result<()> {
    c.set_read_timeout(Some(Duration::from_secs(5)))?;
    c.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut r = BufReader::new(c.try_clone()?);
    let line = vramscope_core::channel::read_line(&mut r)?.unwrap_or_default();
    // The rest of the request's headers, bounded like its first line.
    while vramscope_core::channel::read_line(&mut r)?.is_some_and(|l| !l.trim().is_empty()) {}
    let mut w = c;
    let path = line.split_whitespace().nth(1).unwrap_or("");
    if line.starts_with("GET ") && (path == "/metrics" || path.starts_with("/metrics?")) {
        let mut body = String::new();
        prometheus_client::encoding::text::encode(&mut body, registry).map_err(std::io::Error::other)?;
        write!(w, "HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
    } else {
        let body = "vramscope serves /metrics only\n";
        write!(w, "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_metrics_and_nothing_else() {
        let mut registry = Registry::default();
        let g = prometheus_client::metrics::gauge::Gauge::<i64>::default();
        g.set(7);
        registry.register("vramscope_test", "a test gauge", g);
        let s = Server::start("127.0.0.1:0".parse().unwrap(), registry).unwrap();
        let ok = get(s.addr, "/metrics");
        assert!(ok.starts_with("HTTP/1.1 200 OK") && ok.contains("vramscope_test 7"), "{ok}");
        assert!(get(s.addr, "/").starts_with("HTTP/1.1 404"));
        // A port already taken is an error, not a silent second server.
        assert!(Server::start(s.addr, Registry::default()).is_err());
    }
}
