//! Start-up cost of the commands that train nothing: wall time and peak RSS of
//! `--version`, `view --summary --json` of a small real snapshot, and `watch --once --json`,
//! for this build and, side by side in the same run, for another build of vramscope (the
//! one before the engine became its own process), interleaved so machine load hits both
//! alike. Targets: `--version` and the summary within 100 ms, all three under 60 MB.
//!
//!   cargo bench --bench startup -- [runs] [other vramscope binary]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// (wall ms, peak RSS MB) of one run of `bin args`, measured on that process alone.
fn once(bin: &Path, args: &[String]) -> (f64, f64) {
    let started = Instant::now();
    // Reaped by wait4 below, which also gives its peak RSS.
    #[allow(clippy::zombie_processes)]
    let child = Command::new(bin).args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn");
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: our own child, reaped once, with valid out-pointers.
    unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "{} {args:?} failed", bin.display());
    (started.elapsed().as_secs_f64() * 1e3, usage.ru_maxrss as f64 / 1024.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let runs: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(15);
    let other = args.get(1).map(PathBuf::from);
    let this = common::built("vramscope");
    let Some(snapshot) = common::real_snapshot("MAGMA27_assignment2-systems_memory_snapshot.pickle") else { return };
    let commands: Vec<(&str, Vec<String>)> = vec![
        ("--version", vec!["--version".into()]),
        ("view --summary --json (0.5 MB snapshot)", vec!["view".into(), snapshot.display().to_string(), "--summary".into(), "--json".into()]),
        ("watch --once --json", vec!["watch".into(), "--once".into(), "--json".into()]),
    ];
    let builds: Vec<(&str, PathBuf)> = std::iter::once(("this build", this)).chain(other.map(|o| ("other build", o))).collect();
    println!("{runs} runs each, interleaved; median wall time and peak RSS of the process");
    for (name, cmd) in &commands {
        let mut results: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); builds.len()];
        for r in 0..runs {
            // Alternate which build goes first, so neither always runs on a warm cache.
            let order: Vec<usize> = if r % 2 == 0 { (0..builds.len()).collect() } else { (0..builds.len()).rev().collect() };
            for i in order {
                let (ms, mb) = once(&builds[i].1, cmd);
                results[i].0.push(ms);
                results[i].1.push(mb);
            }
        }
        println!("{name}:");
        let medians: Vec<(f64, f64)> = results.into_iter().map(|(t, m)| (median(t), median(m))).collect();
        for ((build, path), (ms, mb)) in builds.iter().zip(&medians) {
            println!("  {build:<11} {ms:8.1} ms  {mb:7.1} MB   ({})", path.display());
        }
        if let [new, old] = &medians[..] {
            println!("  this / other: {:.3}× time, {:.3}× memory", new.0 / old.0, new.1 / old.1);
        }
    }
}
