//! The Prometheus endpoint (issue "Cluster scale"): a real Prometheus server (Debian's
//! package, installed by scripts/test) scrapes a job watched with `--metrics`, and what it
//! stored equals the job's own step lines; the shipped Grafana dashboard asks only for
//! metrics the endpoint serves; bad addresses and taken ports are said before anything runs.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{repo_root, vramscope};

/// A child killed however the test ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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
}

#[test]
fn every_dashboard_query_names_a_metric_the_endpoint_serves() {
    let _turn = ONE_JOB.lock().unwrap_or_else(|e| e.into_inner());
    // What a job and the host gauges serve.
    let mut job = Killed(
        Command::new(assert_cmd::cargo::cargo_bin("vramscope"))
            .args(["run", "--headless", "--steps", "2", "--ctx", "32", "--batch", "2", "--metrics", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let addr = metrics_addr(job.0.stderr.take().unwrap());
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
    let mut watch = Killed(
        Command::new(assert_cmd::cargo::cargo_bin("vramscope"))
            .args(["watch", "--metrics", "127.0.0.1:0", "--headless", "--interval-ms", "50"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let waddr = metrics_addr(watch.0.stderr.take().unwrap());
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
