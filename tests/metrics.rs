//! The Prometheus endpoint (issue "Cluster scale"): a real Prometheus server (Debian's
//! package, installed by scripts/test) scrapes a job watched with `--metrics`, and what it
//! stored equals the job's own step lines; the shipped Grafana dashboard asks only for
//! metrics the endpoint serves; bad addresses and taken ports are said before anything runs.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{repo_root, vramscope};

/// A child, started in a process group of its own, ended with all it started however the
/// test ends (a job's engine or Python would otherwise outlive it).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let group = -(self.0.id() as i32);
        // Asked first, so `vramscope` can stop its job as it would on a ^C.
        unsafe { libc::kill(group, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && !matches!(self.0.try_wait(), Ok(Some(_))) {
            std::thread::sleep(Duration::from_millis(50));
        }
        unsafe { libc::kill(group, libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// `vramscope ARGS` in a process group of its own, ended however the test ends; and the
/// address it says it serves metrics on.
fn serving(args: &[&str]) -> (Killed, SocketAddr) {
    let mut child = Killed(
        Command::new(assert_cmd::cargo::cargo_bin("vramscope")).args(args).stdout(Stdio::null()).stderr(Stdio::piped()).process_group(0).spawn().unwrap(),
    );
    let addr = metrics_addr(child.0.stderr.take().unwrap());
    (child, addr)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// GET `path` from `addr`: the body.
fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    // Prometheus answers in chunks; the JSON is small enough to be one.
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return body.split_once("\r\n").map(|(_, rest)| rest.to_string());
    }
    Some(body.to_string())
}

/// The metric names a scrape served (counters with their `_total`).
fn served_names(body: &str) -> BTreeSet<String> {
    body.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).map(|l| l.split(['{', ' ']).next().unwrap().to_string()).collect()
}

/// The address the process says it serves metrics on. Its stderr is read on to the end
/// on a thread: closed, the process's next line would fail.
fn metrics_addr(stderr: std::process::ChildStderr) -> SocketAddr {
    let mut stderr = std::io::BufReader::new(stderr);
    let mut line = String::new();
    while stderr.read_line(&mut line).unwrap() > 0 {
        if let Some(rest) = line.split("metrics at http://").nth(1) {
            let addr = rest.split('/').next().unwrap().parse().unwrap();
            std::thread::spawn(move || {
                // Passed on, so a failing test shows what the process said.
                for l in stderr.lines().map_while(Result::ok) {
                    eprintln!("[vramscope] {l}");
                }
            });
            return addr;
        }
        line.clear();
    }
    panic!("no metrics address said");
}

/// Tests that run a job take turns: with two jobs at once on a loaded 2-core CI machine
/// the `py` job once printed no step before it ended (its stderr is passed on if it
/// happens again).
static ONE_JOB: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn prometheus_stores_what_the_job_reports() {
    let _turn = ONE_JOB.lock().unwrap_or_else(|e| e.into_inner());
    let t = tempfile::tempdir().unwrap();
    vramscope_core::channel::dir::ensure_private_dir(&t.path().join("sockets")).unwrap();
    let mut job = Killed(
        Command::new(assert_cmd::cargo::cargo_bin("vramscope"))
            .env("VRAMSCOPE_SOCKET_DIR", t.path().join("sockets"))
            .args(["py", "--headless", "--json", "--metrics", "127.0.0.1:0"])
            .arg(repo_root().join("tests/py/train_transformer.py"))
            .args(["--steps", "3", "--linger", "120"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap(),
    );
    let addr = metrics_addr(job.0.stderr.take().unwrap());
    let mut out = std::io::BufReader::new(job.0.stdout.take().unwrap());
    let mut steps: Vec<serde_json::Value> = Vec::new();
    while steps.len() < 3 {
        let mut l = String::new();
        assert!(out.read_line(&mut l).unwrap() > 0, "the job ended early");
        if l.starts_with('{') {
            steps.push(serde_json::from_str(&l).unwrap());
        }
    }
    let last = &steps[2];

    let prom_port = free_port();
    let config = t.path().join("prometheus.yml");
    std::fs::write(&config, format!("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: vramscope\n    static_configs:\n      - targets: ['{addr}']\n")).unwrap();
    let _prom = Killed(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", t.path().join("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("Debian's prometheus is installed (scripts/test installs it)"),
    );
    let prom: SocketAddr = format!("127.0.0.1:{prom_port}").parse().unwrap();
    let query = |q: &str| -> Option<f64> {
        let body = get(prom, &format!("/api/v1/query?query={}", q.replace('{', "%7B").replace('}', "%7D").replace('"', "%22").replace('=', "%3D")))?;
        let v: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
        v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    while query("vramscope_steps_total") != Some(3.0) {
        assert!(Instant::now() < deadline, "Prometheus never stored 3 steps");
        std::thread::sleep(Duration::from_millis(500));
    }
    let want = |k: &str| last[k].as_u64().unwrap() as f64;
    assert_eq!(query(r#"vramscope_category_bytes{category="parameter"}"#), Some(last["category_bytes"]["parameter"].as_u64().unwrap() as f64));
    assert_eq!(query("vramscope_reserved_bytes"), Some(want("reserved_bytes")));
    assert_eq!(query("vramscope_step_peak_bytes"), Some(want("peak_allocated_bytes")));
    assert_eq!(query(r#"vramscope_steps_total{rank="0"}"#), Some(3.0), "labelled with the job's rank");

    // Every metric the endpoint serves (to curl, in the classic text) is one Prometheus
    // stored (it asks for OpenMetrics, gzipped).
    let served = served_names(&get(addr, "/metrics").unwrap());
    let stored = || -> BTreeSet<String> {
        let q: String = r#"group by (__name__) ({__name__=~"vramscope_.+"})"#.bytes().map(|b| format!("%{b:02X}")).collect();
        let Some(body) = get(prom, &format!("/api/v1/query?query={q}")) else { return BTreeSet::new() };
        let v: serde_json::Value = serde_json::from_str(body.trim()).unwrap_or_default();
        v["data"]["result"].as_array().into_iter().flatten().filter_map(|r| Some(r["metric"]["__name__"].as_str()?.to_string())).collect()
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let stored = stored();
        if stored.is_superset(&served) {
            break;
        }
        assert!(Instant::now() < deadline, "served but not stored: {:?}", served.difference(&stored).collect::<Vec<_>>());
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(served.len() >= 10, "{served:?}");
}

#[test]
fn every_dashboard_query_names_a_metric_the_endpoint_serves() {
    let _turn = ONE_JOB.lock().unwrap_or_else(|e| e.into_inner());
    // What a job and the host gauges serve.
    let (_job, addr) = serving(&["run", "--headless", "--steps", "2", "--ctx", "32", "--batch", "2", "--metrics", "127.0.0.1:0"]);
    let deadline = Instant::now() + Duration::from_secs(120);
    let finished_a_step = |body: &str| body.lines().any(|l| l.starts_with("vramscope_steps_total{") && !l.ends_with(" 0"));
    let served = loop {
        if let Some(b) = get(addr, "/metrics").filter(|b| finished_a_step(b)) {
            break served_names(&b);
        }
        assert!(Instant::now() < deadline, "no step reached the endpoint");
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut served = served;
    // The device gauges: NVML's where there is a GPU, the host's otherwise; the dashboard
    // asks for both, and `watch` serves whichever this machine has.
    let (_watch, waddr) = serving(&["watch", "--metrics", "127.0.0.1:0", "--headless", "--interval-ms", "50"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let names = get(waddr, "/metrics").map(|b| served_names(&b)).unwrap_or_default();
        if names.iter().any(|n| n.starts_with("vramscope_host_") || n.starts_with("vramscope_gpu_")) {
            served.extend(names);
            break;
        }
        assert!(Instant::now() < deadline, "watch served no gauges");
        std::thread::sleep(Duration::from_millis(100));
    }
    let nvml = served.iter().any(|n| n.starts_with("vramscope_gpu_"));
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(repo_root().join("docs/grafana/vramscope.json")).unwrap()).unwrap();
    let mut asked = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for (i, _) in expr.match_indices("vramscope_") {
                let name: String = expr[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                asked.insert(name);
            }
        }
    }
    assert!(asked.len() >= 15, "{asked:?}");
    for name in &asked {
        // The gauges of the other kind of machine cannot be served here.
        let other_kind = if nvml { name.starts_with("vramscope_host_") } else { name.starts_with("vramscope_gpu_") };
        assert!(other_kind || served.contains(name), "the dashboard asks for {name}, which is not served: {served:?}");
    }
}

#[test]
fn bad_addresses_and_taken_ports_are_said_before_anything_runs() {
    let r = vramscope().args(["run", "--headless", "--metrics", "localhost:x"]).output().unwrap();
    assert_eq!(r.status.code(), Some(2));
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(err.trim(), "vramscope: --metrics localhost:x: not an IP address and port (give PORT, or HOST:PORT)");
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let started = Instant::now();
    let r = vramscope().args(["run", "--headless", "--metrics", &port.to_string()]).output().unwrap();
    assert_eq!(r.status.code(), Some(2));
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.lines().count() == 1 && err.contains(&format!("--metrics {port}")) && err.contains("in use"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "said before the engine started");
}

// Issue #37: the endpoint holds up like an exporter. Each test below runs against the real
// binary on loopback, with its connections and time bounded.

/// One answer read off a connection (every answer the endpoint gives has a Content-Length).
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }
}

/// Reads one answer (to a request of `method`) from `r`.
fn read_answer(r: &mut impl BufRead, method: &str) -> std::io::Result<Answer> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| std::io::Error::other(format!("no status line: {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':').ok_or_else(|| std::io::Error::other(format!("not a header: {l:?}")))?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let mut a = Answer { status, headers, body: Vec::new() };
    if method != "HEAD" {
        let len: usize = a.header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
        a.body = vec![0; len];
        r.read_exact(&mut a.body)?;
    }
    Ok(a)
}

/// One request on a connection of its own, with what it took.
fn ask(addr: SocketAddr, method: &str, path: &str, headers: &str) -> std::io::Result<(Answer, Duration)> {
    let started = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Connection: close\r\n\r\n")?;
    let a = read_answer(&mut std::io::BufReader::new(s), method)?;
    Ok((a, started.elapsed()))
}

/// A scrape as curl makes it: status 200, and what it took.
fn scrape(addr: SocketAddr) -> Duration {
    let (a, took) = ask(addr, "GET", "/metrics", "").expect("a scrape is answered");
    assert_eq!(a.status, 200);
    took
}

/// An endpoint that needs no job: `watch --headless` serving the host's (or NVML's)
/// readings, and its process id.
fn exporter() -> (Killed, SocketAddr) {
    let (watch, addr) = serving(&["watch", "--metrics", "127.0.0.1:0", "--headless", "--interval-ms", "100"]);
    // Its first readings are in.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ask(addr, "GET", "/metrics", "").is_ok_and(|(a, _)| a.text().contains("vramscope_")) {
        assert!(Instant::now() < deadline, "watch served nothing");
        std::thread::sleep(Duration::from_millis(50));
    }
    (watch, addr)
}

/// A process's resident memory in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().trim().trim_end_matches("kB").trim().parse().unwrap();
    kb * 1024
}

#[test]
fn a_scrape_behind_fifty_idle_connections_is_answered_within_a_second() {
    let (_watch, addr) = exporter();
    let idle: Vec<TcpStream> = (0..50).map(|_| TcpStream::connect(addr).unwrap()).collect();
    // Taken by the server, and left waiting for headers that never come.
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        let took = scrape(addr);
        eprintln!("a scrape behind 50 idle connections: {took:?}");
        assert!(took < Duration::from_secs(1), "a scrape behind 50 idle connections took {took:?}");
    }
    drop(idle);
}

#[test]
fn a_hundred_concurrent_scrapes_are_all_answered_within_a_second() {
    let (_watch, addr) = exporter();
    let go = std::sync::Arc::new(std::sync::Barrier::new(100));
    let scrapers: Vec<_> = (0..100)
        .map(|_| {
            let go = go.clone();
            std::thread::spawn(move || {
                go.wait();
                scrape(addr)
            })
        })
        .collect();
    let took: Vec<Duration> = scrapers.into_iter().map(|t| t.join().expect("every scrape answered 200")).collect();
    let slowest = took.iter().max().unwrap();
    eprintln!("the slowest of 100 concurrent scrapes: {slowest:?}");
    assert!(*slowest < Duration::from_secs(1), "the slowest of 100 concurrent scrapes took {slowest:?}");
}

/// A slowloris: a request's headers sent one byte a second, never finished. Returns how
/// long the server kept it (None: still open after `give_up`).
fn slowloris(addr: SocketAddr, give_up: Duration) -> std::io::Result<Option<Duration>> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(1)))?;
    let started = Instant::now();
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nX-Slow: {}", "a".repeat(64));
    for b in request.bytes() {
        if s.write_all(&[b]).is_err() {
            return Ok(Some(started.elapsed()));
        }
        // A second's wait that ends early if the server closes.
        match s.read(&mut [0u8; 256]) {
            Ok(0) => return Ok(Some(started.elapsed())),
            Ok(_) => panic!("the server answered headers that never ended"),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return Ok(Some(started.elapsed())),
        }
        if started.elapsed() > give_up {
            return Ok(None);
        }
    }
    Ok(None)
}

/// The header timeout the endpoint keeps (src/metrics/http.rs's HEADER_TIMEOUT).
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

#[test]
fn a_client_sending_its_headers_a_byte_a_second_is_dropped_at_the_header_timeout_while_scrapes_go_on() {
    let _turn = ONE_JOB.lock().unwrap_or_else(|e| e.into_inner());
    // A training job that outlasts the test (killed at its end).
    let (_job, addr) = serving(&["run", "--headless", "--steps", "10000", "--ctx", "32", "--batch", "2", "--metrics", "127.0.0.1:0"]);
    let loris = std::thread::spawn(move || slowloris(addr, HEADER_TIMEOUT + Duration::from_secs(3)));
    let mut scrapes = 0;
    while !loris.is_finished() {
        let took = scrape(addr);
        assert!(took < Duration::from_secs(1), "a scrape beside a slowloris took {took:?}");
        scrapes += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    let kept = loris.join().unwrap().unwrap().expect("the slowloris was still connected 3 s past the header timeout");
    eprintln!("the slowloris was dropped after {kept:?}; {scrapes} scrapes meanwhile");
    assert!(kept >= HEADER_TIMEOUT - Duration::from_millis(200) && kept < HEADER_TIMEOUT + Duration::from_secs(2), "dropped after {kept:?}");
    assert!(scrapes >= 10, "only {scrapes} scrapes while the slowloris was connected");
}

#[test]
fn a_flood_of_connections_is_capped_costs_bounded_memory_and_clears() {
    let (watch, addr) = exporter();
    let before = rss(watch.0.id());
    // Past the endpoint's 256: those over it are told 503 and closed at once.
    let mut flood: Vec<TcpStream> = (0..400).map(|_| TcpStream::connect(addr).unwrap()).collect();
    for s in &flood {
        s.set_nonblocking(true).unwrap();
    }
    let mut told = vec![false; flood.len()];
    let deadline = Instant::now() + Duration::from_secs(3);
    while told.iter().filter(|t| **t).count() < 400 - 256 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        for (s, told) in flood.iter_mut().zip(&mut told) {
            let mut buf = [0u8; 128];
            if !*told && matches!(s.read(&mut buf), Ok(n) if n > 0 && buf.starts_with(b"HTTP/1.1 503")) {
                *told = true;
            }
        }
    }
    let refused = told.iter().filter(|t| **t).count();
    assert_eq!(refused, 400 - 256, "connections past 256 are refused, the rest held");
    let grew = rss(watch.0.id()).saturating_sub(before);
    eprintln!("400 connections at once: {refused} refused, the endpoint's memory grew {} KiB", grew / 1024);
    assert!(grew < 8 << 20, "256 connections cost {grew} bytes");
    // Gone, they free their places at once.
    drop(flood);
    std::thread::sleep(Duration::from_millis(200));
    let took = scrape(addr);
    assert!(took < Duration::from_secs(1), "{took:?}");
}

#[test]
fn head_gzip_keep_alive_and_the_content_types_prometheus_negotiates() {
    let (_watch, addr) = exporter();
    let (plain, _) = ask(addr, "GET", "/metrics", "").unwrap();
    assert_eq!(plain.header("content-type"), Some("text/plain; version=0.0.4; charset=utf-8"));
    let names = served_names(&plain.text());
    assert!(!plain.text().contains("# EOF"));

    // HEAD: the headers a GET gets, no body.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "HEAD /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 200") && raw.ends_with("\r\n\r\n"), "{raw}");
    assert!(raw.to_ascii_lowercase().contains("content-length: "), "{raw}");

    // gzip when asked, as Prometheus asks, and OpenMetrics when preferred.
    let prometheus_accept = "Accept: application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\n";
    let (gz, _) = ask(addr, "GET", "/metrics", &format!("{prometheus_accept}Accept-Encoding: gzip\r\n")).unwrap();
    assert_eq!(gz.status, 200);
    assert_eq!(gz.header("content-encoding"), Some("gzip"));
    assert_eq!(gz.header("content-type"), Some("application/openmetrics-text; version=1.0.0; charset=utf-8"));
    let mut om = String::new();
    flate2::read::GzDecoder::new(&gz.body[..]).read_to_string(&mut om).unwrap();
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert_eq!(served_names(&om), names);

    // Keep-alive: two scrapes on one connection.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = std::io::BufReader::new(s.try_clone().unwrap());
    for _ in 0..2 {
        write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
        let a = read_answer(&mut r, "GET").unwrap();
        assert_eq!(a.status, 200);
        assert_eq!(served_names(&a.text()), names);
    }

    // Anything else.
    assert_eq!(ask(addr, "GET", "/", "").unwrap().0.status, 404);
    let (post, _) = ask(addr, "POST", "/metrics", "Content-Length: 0\r\n").unwrap();
    assert_eq!((post.status, post.header("allow")), (405, Some("GET, HEAD")));

    // The classic text is what Prometheus's own checker reads without a complaint.
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("Debian's prometheus (with promtool) is installed (scripts/test installs it)");
    promtool.stdin.take().unwrap().write_all(&plain.body).unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(out.status.success(), "promtool: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

/// The measurement's windows: the hostile load is off, then on, then off... for this long
/// each (past the header timeout, so the slowloris is dropped in each), so that whatever
/// else the machine does falls on both alike.
const WINDOW: Duration = Duration::from_secs(6);

fn loaded_at(since_start: Duration) -> bool {
    (since_start.as_millis() / WINDOW.as_millis()) % 2 == 1
}

/// A process's CPU time (user and system) in clock ticks (1/100 s on Linux).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    Some(fields.next()?.parse::<u64>().ok()? + fields.next()?.parse::<u64>().ok()?)
}

/// What a hostile port does to the job, in the loaded windows: 50 idle connections (opened
/// again as the endpoint drops them), a slowloris (likewise), and a burst of 100 concurrent
/// scrapes a second, each as Prometheus asks (OpenMetrics, gzip). Its threads run at nice
/// 19: on a cluster the scrapers are on other machines, and on this 2-core one they would
/// otherwise take the job's cores themselves, which is not what is measured.
fn hostile(addr: SocketAddr, started: Instant, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::Ordering::SeqCst;
    // Linux's nice is a thread's, inherited by the threads it starts.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
    let on = move || loaded_at(started.elapsed());
    let loris = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // Until the run ends (and its endpoint with it).
            while !stop.load(SeqCst) {
                if !on() {
                    std::thread::sleep(Duration::from_millis(20));
                } else if slowloris(addr, WINDOW).is_err() {
                    return;
                }
            }
        })
    };
    let mut idle: Vec<TcpStream> = Vec::new();
    let accept = "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\nAccept-Encoding: gzip\r\n";
    let (mut scrapes, mut failed, mut slowest) = (0, 0, Duration::ZERO);
    // Until the run ends: a scrape that fails is one after its endpoint closed.
    while !stop.load(SeqCst) && failed == 0 {
        if !on() {
            idle.clear();
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let second = Instant::now();
        // Those the endpoint dropped at its header timeout are opened again.
        idle.retain(|s| {
            s.set_nonblocking(true).unwrap();
            !matches!(std::io::Read::read(&mut &*s, &mut [0u8; 16]), Ok(0))
        });
        while idle.len() < 50 {
            let Ok(s) = TcpStream::connect(addr) else { break };
            idle.push(s);
        }
        let burst: Vec<_> = (0..100).map(|_| std::thread::spawn(move || ask(addr, "GET", "/metrics", accept).map(|(a, took)| (a.status, took)))).collect();
        for b in burst {
            match b.join().unwrap() {
                Ok((200, took)) => {
                    slowest = slowest.max(took);
                    scrapes += 1;
                }
                _ => failed += 1,
            }
        }
        while on() && second.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    loris.join().unwrap();
    eprintln!("beside it: {scrapes} scrapes answered 200 (the slowest {slowest:?}), {failed} not (the run had ended)");
}

/// The job's step time with the endpoint quiet and hostile, in alternating windows of one
/// headless run (BENCHMARKS.md):
/// cargo test --release -p vramscope --test metrics -- --ignored --nocapture step_time
#[test]
#[ignore = "a measurement (about a minute), run by hand"]
fn step_time_beside_a_hostile_endpoint() {
    let _turn = ONE_JOB.lock().unwrap_or_else(|e| e.into_inner());
    let steps: u32 = std::env::var("STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(500);
    let mut job = Killed(
        Command::new(assert_cmd::cargo::cargo_bin("vramscope"))
            .args(["run", "--headless", "--json", "--ctx", "32", "--batch", "2", "--metrics", "127.0.0.1:0"])
            .args(["--steps", &steps.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap(),
    );
    let addr = metrics_addr(job.0.stderr.take().unwrap());
    let started = Instant::now();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = std::thread::spawn({
        let stop = stop.clone();
        move || hostile(addr, started, stop)
    });
    let pid = job.0.id();
    // Per window kind (quiet, hostile): step times, and vramscope's CPU ticks over seconds.
    let mut times: [Vec<f64>; 2] = Default::default();
    let mut cpu = [(0u64, 0.0f64); 2];
    let mut last: Option<(Duration, u64)> = None;
    let margin = Duration::from_millis(250);
    for line in std::io::BufReader::new(job.0.stdout.take().unwrap()).lines().map_while(Result::ok).filter(|l| l.starts_with('{')) {
        let (end, ticks) = (started.elapsed(), cpu_ticks(pid).unwrap_or(0));
        let took = serde_json::from_str::<serde_json::Value>(&line).unwrap()["step_time_s"].as_f64().unwrap();
        let begin = end.saturating_sub(Duration::from_secs_f64(took));
        // A step wholly inside one window (a margin either side), not the warm-up.
        let window = |t: Duration| t.as_millis() / WINDOW.as_millis();
        if last.is_some() && window(begin.saturating_sub(margin)) == window(end + margin) {
            let k = loaded_at(end) as usize;
            times[k].push(took);
            if let Some((then, ticks_then)) = last.filter(|(then, _)| window(*then) == window(end)) {
                cpu[k].0 += ticks - ticks_then;
                cpu[k].1 += (end - then).as_secs_f64();
            }
        }
        last = Some((end, ticks));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    load.join().unwrap();
    let stats = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v.len(), v[v.len() / 2], v.iter().sum::<f64>() / v.len() as f64, v[v.len() * 9 / 10])
    };
    let mut medians = [0.0; 2];
    for (k, what) in ["quiet  ", "hostile"].into_iter().enumerate() {
        let (n, median, mean, p90) = stats(&mut times[k]);
        medians[k] = median;
        eprintln!(
            "{what}: {n} steps, median {:.1} ms, mean {:.1} ms, p90 {:.1} ms; vramscope's CPU {:.1}% of a core",
            median * 1e3,
            mean * 1e3,
            p90 * 1e3,
            cpu[k].0 as f64 / 100.0 / cpu[k].1 * 100.0
        );
    }
    eprintln!("median step time {:+.1}% with the hostile endpoint", (medians[1] / medians[0] - 1.0) * 100.0);
}
