//! `trace_against_pytorch RECORDING PYTORCH_SNAPSHOT [DEVICE]`: a session vramscope
//! recorded, held to PyTorch's own memory history of the same job (`_record_memory_history`
//! from CUDA init on, `_dump_snapshot` at the end) with the selftest's checks: every trace
//! entry in order, the segments and blocks, the peaks, where PyTorch dumped.
//! `scripts/gpu-check` makes such pairs on a GPU. Exits 1 when a check fails.
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use vramscope_core::record::reader::Recording;
use vramscope_core::selftest::{cuda, Outcome};

fn main() -> anyhow::Result<ExitCode> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [recording, snapshot, rest @ ..] = args.as_slice() else {
        anyhow::bail!("usage: trace_against_pytorch RECORDING PYTORCH_SNAPSHOT [DEVICE]");
    };
    let device: u8 = rest.first().map_or(Ok(0), |d| d.parse()).context("DEVICE: a CUDA ordinal")?;
    let events = Recording::open(Path::new(recording))?.memory_events(device)?;
    let snap = vramscope_core::snapshot::read_snapshot_file(Path::new(snapshot)).with_context(|| snapshot.clone())?;
    println!("{recording}: {} events on cuda:{device}; {snapshot}: {} trace entries", events.len(), snap.trace(device as usize).len());
    let mut failed = false;
    for (name, outcome) in cuda::against_pytorch(&events, &snap, device as usize) {
        let (word, why) = match outcome {
            Outcome::Pass(why) => ("pass", why),
            Outcome::Fail(why) => {
                failed = true;
                ("FAIL", why)
            }
            Outcome::Skipped(why) => ("skipped", why),
        };
        println!("{name:16} {word:7} {why}");
    }
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}
