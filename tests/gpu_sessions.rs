//! Sessions recorded on a real GPU, kept in tests/gpu/ (see its README.md): what vramscope
//! recorded there is PyTorch's own trace of the same job, entry for entry, and replayed it
//! gives the peaks torch's own counters reported. Every CI run holds the reader, the
//! recording format and the checks to them, with no GPU.

mod common;

use std::path::PathBuf;

use vramscope_core::record::player::Script;
use vramscope_core::record::reader::Recording;
use vramscope_core::selftest::{cuda, Outcome};
use vramscope_core::stream::{Incoming, Report};

/// fp32 with an out-of-memory at step 3; bf16 autocast with expandable segments.
const SESSIONS: [&str; 2] = ["h100-fp32-oom", "h100-bf16-expandable"];

fn file(session: &str, ext: &str) -> PathBuf {
    common::repo_root().join("tests/gpu").join(format!("{session}.{ext}"))
}

fn items(session: &str) -> Vec<Incoming> {
    let rec = Recording::open(&file(session, "vsrec")).expect("the recording reads");
    assert!(rec.corrupt().is_none(), "{session}: {:?}", rec.corrupt());
    (0..rec.chunk_count()).flat_map(|i| rec.items(i).expect("a whole chunk")).map(|(_, _, item)| item).collect()
}

/// torch's own figures, as the job wrote them (`--out`).
fn torch_said(session: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(file(session, "torch.json")).unwrap()).unwrap()
}

#[test]
fn each_gpu_session_is_pytorchs_trace_entry_for_entry() {
    for session in SESSIONS {
        let events = Recording::open(&file(session, "vsrec")).unwrap().memory_events(0).expect("whole chunks");
        let snap = vramscope_core::snapshot::read_snapshot_file(&file(session, "pytorch.pickle")).expect("PyTorch's snapshot reads");
        let memory_entries = snap.trace(0).iter().filter(|e| e.action != vramscope_core::event::Action::Snapshot).count();
        assert!(memory_entries > 4000, "{session}: a whole trace ({memory_entries} entries)");
        for (check, outcome) in cuda::against_pytorch(&events, &snap, 0) {
            assert!(matches!(outcome, Outcome::Pass(_)), "{session} {check}: {outcome:?}");
        }
    }
}

#[test]
fn replayed_each_gives_the_peaks_torch_reported_and_the_oom_where_it_happened() {
    for session in SESSIONS {
        let mut failed = None;
        let mut script = Script::open(&file(session, "vsrec")).unwrap();
        let steps = vramscope_core::report::headless::run(script.stream(&mut failed), false, &mut Vec::new()).expect("replay runs");
        assert!(failed.is_none(), "{failed:?}");
        let torch = &torch_said(session)["cuda"];
        let peak = |f: fn(&vramscope_core::stream::StepReport) -> u64| steps.iter().map(f).max().unwrap();
        assert_eq!(peak(|s| s.peak_allocated_bytes), torch["max_allocated"].as_u64().unwrap(), "{session}: torch.cuda.max_memory_allocated");
        assert_eq!(peak(|s| s.peak_reserved_bytes), torch["max_reserved"].as_u64().unwrap(), "{session}: torch.cuda.max_memory_reserved");
        assert_eq!(steps.last().unwrap().reserved_bytes, torch["reserved"].as_u64().unwrap(), "{session}: torch.cuda.memory_reserved at the end");
        // A CUDA loss is not read by the hook: unknown, not a number.
        assert!(steps.iter().all(|s| s.loss.is_none()), "{session}");
    }
    let ooms: Vec<_> = items(SESSIONS[0]).into_iter().filter_map(|i| if let Incoming::Report(Report::Oom(o)) = i { Some(o) } else { None }).collect();
    assert_eq!(ooms.len(), 1, "{ooms:?}");
    // The job asked for 2^50 bytes at step 3; torch's message says 1048576 GiB.
    assert_eq!(ooms[0].step, 3);
    assert!(ooms[0].message.contains(&(1u64 << 50).to_string()), "{}", ooms[0].message);
    assert!(torch_said(SESSIONS[0])["oom"]["message"].as_str().unwrap().contains("Tried to allocate 1048576.00 GiB"));
}
