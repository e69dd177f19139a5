//! What `vramscope attach --pid` costs a job: a plain training loop
//! (tests/py/plain_job.py, an MLP with AdamW, ~2 ms steps) started without vramscope, then
//! attached to for 100 steps and left. Per round, the job's own step times: the median of
//! its last 400 steps before the attach against its first 400 from 3 s after vramscope left
//! (target: within the spread of the control), and its longest stand-still while vramscope
//! got in (target: under 1 s). Each round is paired with a control round of the same job
//! that nobody attaches to, measured over the same windows, so machine noise shows as the
//! control's spread.
//!
//!   cargo bench --bench attach_overhead -- [rounds]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One round: (median step after / before, longest gap between step ends while attaching).
fn round(dir: &Path, attach: bool) -> (f64, f64) {
    let times = dir.join(format!("times-{attach}.txt"));
    let mut job = Command::new(common::python())
        .arg(common::root().join("tests/py/plain_job.py"))
        .args(["--steps", "2200", "--sleep", "0.01", "--times"])
        .arg(&times)
        .env_remove("PYTHONPATH")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the job");
    std::thread::sleep(Duration::from_secs(6));
    let start = now();
    if attach {
        let st = Command::new(common::built("vramscope"))
            .args(["attach", "--pid", &job.id().to_string(), "--headless", "--steps", "100"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run vramscope attach");
        assert!(st.success(), "vramscope attach failed");
    } else {
        std::thread::sleep(Duration::from_secs(3));
    }
    let end = now();
    assert!(job.wait().expect("the job ends").success());
    let rows: Vec<(f64, f64)> = std::fs::read_to_string(&times)
        .expect("the job's step times")
        .lines()
        .map(|l| {
            let mut it = l.split_whitespace().map(|v| v.parse::<f64>().expect("a number"));
            (it.next().expect("end time"), it.next().expect("duration"))
        })
        .collect();
    let before: Vec<f64> = rows.iter().filter(|r| r.0 < start).map(|r| r.1).collect();
    let after: Vec<f64> = rows.iter().filter(|r| r.0 > end + 3.0).map(|r| r.1).take(400).collect();
    let before = before[before.len().saturating_sub(400)..].to_vec();
    let gap = rows.windows(2).filter(|w| w[1].0 >= start && w[1].0 <= end).map(|w| w[1].0 - w[0].0).fold(0.0, f64::max);
    (median(after) / median(before), gap)
}

fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let dir = tempfile::tempdir().expect("a scratch folder");
    let (mut attached, mut control, mut gaps) = (Vec::new(), Vec::new(), Vec::new());
    println!("round  after/before attached  after/before control  longest stand-still attaching");
    for r in 0..rounds {
        let (a, gap) = round(dir.path(), true);
        let (c, _) = round(dir.path(), false);
        println!("{r:>5}  {a:>21.3}  {c:>20.3}  {gap:>27.3} s");
        attached.push(a);
        control.push(c);
        gaps.push(gap);
    }
    let spread = |v: &[f64]| (v.iter().cloned().fold(f64::MAX, f64::min), v.iter().cloned().fold(0.0, f64::max));
    let ((alo, ahi), (clo, chi)) = (spread(&attached), spread(&control));
    println!(
        "median after/before: attached {:.3} ({alo:.3}-{ahi:.3}), control {:.3} ({clo:.3}-{chi:.3}); longest stand-still {:.3} s (target under 1 s)",
        median(attached.clone()),
        median(control.clone()),
        gaps.iter().cloned().fold(0.0, f64::max)
    );
}
