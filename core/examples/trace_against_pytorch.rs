//! `trace_against_pytorch RECORDING PYTORCH_SNAPSHOT [DEVICE]`: a session vramscope
//! recorded, held to PyTorch's own memory history of the same job (`_record_memory_history`
//! from CUDA init on, `_dump_snapshot` at the end) with the selftest's checks: every trace
//! entry in order, the segments and blocks, the peaks. PyTorch dumps before the job's
//! teardown frees its tensors, so the recording is cut where PyTorch's trace ends.
//! `scripts/gpu-check` makes such pairs on a GPU. Exits 1 when a check fails.
use std::fs::File;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use vramscope_core::event::{Action, MemEvent};
use vramscope_core::selftest::{cuda, Outcome};
use vramscope_core::stream::chunk::ChunkReader;
use vramscope_core::stream::codec::Record;
use vramscope_core::stream::Incoming;

fn recorded_events(path: &Path, device: u8) -> anyhow::Result<Vec<MemEvent>> {
    let file = File::open(path).with_context(|| path.display().to_string())?;
    let mut reader = ChunkReader::new(file).with_context(|| path.display().to_string())?;
    let mut events = Vec::new();
    while let Some(records) = reader.next_chunk().with_context(|| path.display().to_string())? {
        for r in records {
            if let Record::Item { item: Incoming::Batch(b), .. } = r {
                events.extend(b.events.iter().filter(|e| e.device == device).copied());
            }
        }
    }
    Ok(events)
}

fn main() -> anyhow::Result<ExitCode> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [recording, snapshot, rest @ ..] = args.as_slice() else {
        anyhow::bail!("usage: trace_against_pytorch RECORDING PYTORCH_SNAPSHOT [DEVICE]");
    };
    let device: u8 = rest.first().map_or(Ok(0), |d| d.parse()).context("DEVICE: a CUDA ordinal")?;
    let ours = recorded_events(Path::new(recording), device)?;
    let snap = vramscope_core::snapshot::read_snapshot_file(Path::new(snapshot)).with_context(|| snapshot.clone())?;
    let theirs = snap.trace(device as usize);
    // Snapshot entries carry no memory, and each recorder sees the other's snapshots.
    let counted = theirs.iter().filter(|e| e.action != Action::Snapshot).count();
    let cut = ours.iter().enumerate().filter(|(_, e)| e.action != Action::Snapshot).nth(counted.saturating_sub(1)).map_or(ours.len(), |(i, _)| i + 1);
    println!("{recording}: {} events on cuda:{device}, {cut} up to PyTorch's dump; {snapshot}: {} trace entries", ours.len(), theirs.len());
    let ours = &ours[..cut];
    let mut failed = false;
    for (name, outcome) in [
        ("trace", cuda::trace(ours, theirs)),
        ("segments_blocks", cuda::segments(ours, &snap, device as usize)),
        ("peaks", cuda::peaks(ours, &snap, device as usize)),
    ] {
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
