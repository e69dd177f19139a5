//! A job watched without a screen (`run --headless`, `py --headless`, `attach
//! --headless`): per-step lines until every rank's stream ends, optionally recorded,
//! served to Prometheus and checked for growth.

use std::process::ExitCode;
use std::time::Duration;

use crate::metrics::{Feed, Metrics};
use crate::screens::live::run::start_gauges;
use vramscope_core::source::gauges::Watched;
use vramscope_core::record::writer::Recorder;
use vramscope_core::report::growth::{self, LiveByOrigin};
use vramscope_core::source::job::JobSource;
use vramscope_core::stream::{Control, Incoming};

/// Prints the job's steps; the exit code says whether all went well (1: the growth check
/// failed). A job this vramscope started is stopped at the end if it has not stopped
/// (vramscope's engine waits, paused, after an error).
/// `steps`: end once every rank of the job has reported this many (a job attached to runs
/// on).
pub fn headless(source: &JobSource, mut recorder: Option<Recorder>, metrics: Option<&Metrics>, json: bool, check_growth: bool, steps: Option<u64>) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    let mut live = LiveByOrigin::default();
    let feed = std::cell::RefCell::new(metrics.map(Feed::new));
    // The endpoint serves the device's (or host's) readings too: a headless job on every
    // node is where Prometheus scrapes them. Without an endpoint nothing reads them.
    let job = Watched::default();
    let gauges = metrics.map(|_| start_gauges(job.clone()));
    let mut reported: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
    // Every rank of the job: as many as its ranks say the world has.
    let mut world = 1usize;
    let done = std::cell::Cell::new(false);
    let next = || loop {
        let Some((_, readings)) = &gauges else { return source.next() };
        crossbeam_channel::select! {
            recv(source.receiver()) -> item => return item.ok(),
            recv(readings) -> g => match (g, feed.borrow_mut().as_mut()) {
                (Ok(g), Some(f)) => f.ingest(0, &Incoming::Gauges(g)),
                // The sampler ended: the job's items alone from here.
                _ => return source.next(),
            },
        }
    };
    let items = std::iter::from_fn(|| if done.get() { None } else { next() }).inspect(|(rank, i)| {
        use vramscope_core::stream::Report;
        match i {
            Incoming::Report(Report::Started(info)) => {
                world = world.max(info.world_size.unwrap_or(1) as usize);
                job.add(info.pid);
            }
            Incoming::Report(Report::Step(_)) => {
                *reported.entry(*rank).or_default() += 1;
                done.set(steps.is_some_and(|n| reported.len() >= world && reported.values().all(|&r| r >= n)));
            }
            _ => {}
        }
        if let Incoming::Batch(b) = i {
            live.ingest(b);
        }
        if let Some(f) = feed.borrow_mut().as_mut() {
            f.ingest(*rank, i);
        }
    });
    let steps = match &mut recorder {
        Some(r) => vramscope_core::report::headless::run(r.tee(items), json, &mut out),
        None => vramscope_core::report::headless::run(items, json, &mut out),
    };
    source.send(&Control::Stop);
    let exit = match source.wait_child(Duration::from_secs(60)) {
        Some(s) => Some(s),
        None => source.stop_child(Duration::from_secs(5)),
    };
    if let Some(r) = recorder {
        let s = r.finish()?;
        eprintln!("vramscope: recording saved: {} ({} events, {} bytes)", s.path.display(), s.events, s.bytes);
    }
    let steps = steps?;
    // The job's own failure is passed on as its status (vramscope's are 2).
    if let Some(s) = exit.filter(|s| !s.success()) {
        eprintln!("vramscope: the job {}", vramscope_core::source::job::describe_exit(s));
        return Ok(vramscope_core::source::job::exit_code_of(s));
    }
    if check_growth {
        anyhow::ensure!(steps.iter().all(|s| s.dropped_events == 0), "events were dropped: the growth check needs all of them");
        let report = growth::check(&live.finish(), &steps);
        std::io::Write::write_fmt(&mut out, format_args!("{report}"))?;
        if !report.healthy() {
            return Ok(ExitCode::from(1));
        }
    }
    Ok(ExitCode::SUCCESS)
}
