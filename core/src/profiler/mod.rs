//! torch.profiler traces, opened where a memory snapshot is: a chrome trace
//! (`export_chrome_trace`, `tensorboard_trace_handler`'s `*.pt.trace.json`, gzipped or not),
//! the directory `tensorboard_trace_handler` writes, or `export_memory_timeline`'s JSON.
//! `parse` keeps what the memory view needs while it streams the JSON; `convert` makes the
//! snapshot of a trace, `timeline` of a memory timeline.

mod blocks;
pub mod convert;
pub mod parse;
pub mod timeline;

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::snapshot::model::Snapshot;

/// How reading a trace fails; the caller names the path.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("not a torch.profiler trace: {0}")]
    Json(serde_json::Error),
    #[error("{0}")]
    Content(String),
    #[error("no torch.profiler traces in the directory (*.pt.trace.json, *.json, *.json.gz)")]
    EmptyDir,
}

impl TraceError {
    /// A JSON error as the user should read it: a gzip stream that is corrupt or cut short
    /// surfaces as an I/O error, and JSON that stops early is a cut-short file.
    fn of_json(err: serde_json::Error) -> TraceError {
        if err.classify() == serde_json::error::Category::Io {
            TraceError::Content(format!("cannot decompress: {err}"))
        } else if err.is_eof() {
            TraceError::Content(format!("the trace ends early (cut short?): {err}"))
        } else {
            TraceError::Json(err)
        }
    }
}

/// Does a file that starts with `head` look like a trace or memory timeline: gzip, or a JSON
/// object or list? (A pickle starts with its PROTO opcode, 0x80.)
pub fn looks_like_trace(head: &[u8]) -> bool {
    head.starts_with(&[0x1f, 0x8b]) || matches!(head.iter().find(|b| !b.is_ascii_whitespace()), Some(b'{' | b'['))
}

/// The trace files of a directory `tensorboard_trace_handler` wrote, by name: one per
/// worker and profiled window.
pub fn traces_in(dir: &Path) -> Result<Vec<PathBuf>, TraceError> {
    let io = |err| TraceError::Io { path: dir.to_path_buf(), err };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(".json") || n.ends_with(".json.gz")))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(TraceError::EmptyDir);
    }
    Ok(files)
}

/// One trace file of a directory, chosen by worker (rank) and profiled window.
#[derive(Clone, Debug, PartialEq)]
pub struct Picked {
    pub file: PathBuf,
    /// The worker's place (in rank order where the traces state ranks) and how many.
    pub worker: usize,
    pub workers: usize,
    /// The window's place in the worker's time order, and how many it has.
    pub window: usize,
    pub windows: usize,
    /// "worker 2 of 4 (rank 1), window 1 of 3".
    pub place: String,
    /// `place`, then the file's name.
    pub description: String,
}

/// The rank a trace states (`distributedInfo`, written before its events), read from the
/// file's first 256 KiB.
fn stated_rank(file: &Path) -> Option<usize> {
    let f = std::fs::File::open(file).ok()?;
    let mut head = Vec::new();
    let reader: Box<dyn Read> = if file.extension().is_some_and(|e| e == "gz") { Box::new(flate2::read::MultiGzDecoder::new(f)) } else { Box::new(f) };
    reader.take(256 << 10).read_to_end(&mut head).ok();
    let text = String::from_utf8_lossy(&head);
    let info = &text[text.find("\"distributedInfo\"")?..];
    let rank = &info[info.find("\"rank\"")? + 6..];
    let digits: String = rank.trim_start_matches([':', ' ']).chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

struct Worker {
    name: String,
    rank: Option<usize>,
    /// (timestamp, file), in time order.
    files: Vec<(u64, PathBuf)>,
}

/// The workers of a directory `tensorboard_trace_handler` wrote: one file per worker and
/// profiled window, named `{worker}.{timestamp}.pt.trace.json[.gz]`. In the order of the
/// ranks they state, else by name.
fn workers(dir: &Path) -> Result<Vec<Worker>, TraceError> {
    let mut by_name: std::collections::BTreeMap<String, Vec<(u64, PathBuf)>> = std::collections::BTreeMap::new();
    for f in traces_in(dir)? {
        let name = f.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let stem = [".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json"].iter().find_map(|x| name.strip_suffix(x)).unwrap_or(&name);
        let (worker, ts) = match stem.rsplit_once('.') {
            Some((w, t)) if t.bytes().all(|b| b.is_ascii_digit()) && !t.is_empty() => (w.to_string(), t.parse().unwrap_or(0)),
            _ => (stem.to_string(), 0),
        };
        by_name.entry(worker).or_default().push((ts, f));
    }
    let mut workers: Vec<Worker> = by_name
        .into_iter()
        .map(|(name, mut files)| {
            files.sort();
            Worker { rank: stated_rank(&files[0].1), name, files }
        })
        .collect();
    if workers.iter().all(|w| w.rank.is_some()) {
        workers.sort_by_key(|w| w.rank);
    }
    Ok(workers)
}

fn picked(workers: &[Worker], i: usize, k: usize) -> Result<Picked, TraceError> {
    let w = &workers[i];
    let Some((_, file)) = w.files.get(k) else {
        return Err(TraceError::Content(format!("no window {k} of {}: it has {} (0 to {})", w.name, w.files.len(), w.files.len() - 1)));
    };
    let rank = w.rank.map_or_else(String::new, |r| format!(" (rank {r})"));
    let place = format!("worker {} of {}{rank}, window {} of {}", i + 1, workers.len(), k + 1, w.files.len());
    let name = file.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    Ok(Picked { file: file.clone(), worker: i, workers: workers.len(), window: k, windows: w.files.len(), description: format!("{place}: {name}"), place })
}

/// The trace of a directory that `rank` (the rank the traces state, else the worker's
/// place by name; default the first) and `window` (in time order; default the first) pick.
pub fn pick(dir: &Path, rank: Option<usize>, window: Option<usize>) -> Result<Picked, TraceError> {
    let workers = workers(dir)?;
    let asked = rank.unwrap_or(0);
    let ranked = workers.iter().all(|w| w.rank.is_some());
    let found = if ranked { workers.iter().position(|w| w.rank == Some(asked)) } else { (asked < workers.len()).then_some(asked) };
    let Some(i) = found else {
        let names = workers.iter().map(|w| w.rank.map_or_else(|| w.name.clone(), |r| format!("rank {r}"))).collect::<Vec<_>>().join(", ");
        return Err(TraceError::Content(format!("no rank {asked} here: the directory has {} workers ({names})", workers.len())));
    };
    picked(&workers, i, window.unwrap_or(0))
}

/// The trace at a worker's place and a window's, both counted round (the screen's keys step
/// through them).
pub fn pick_at(dir: &Path, worker: usize, window: usize) -> Result<Picked, TraceError> {
    let workers = workers(dir)?;
    let i = worker % workers.len();
    picked(&workers, i, window % workers[i].files.len())
}

/// Reads the trace at `path` (a file, or a directory's first trace) as a snapshot.
pub fn read_trace(path: &Path) -> Result<Snapshot, TraceError> {
    if path.is_dir() {
        let picked = pick(path, None, None)?;
        let name = picked.file.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let mut snap = read_file(&picked.file).map_err(|e| TraceError::Content(format!("{name}: {e}")))?;
        if let Some(p) = snap.profiled.as_mut() {
            p.picked = Some(picked.description);
        }
        return Ok(snap);
    }
    read_file(path)
}

fn read_file(file: &Path) -> Result<Snapshot, TraceError> {
    let io = |err| TraceError::Io { path: file.to_path_buf(), err };
    let mut f = std::fs::File::open(file).map_err(io)?;
    let mut magic = [0u8; 2];
    let n = f.read(&mut magic).map_err(io)?;
    read_from(&magic[..n], f)
}

/// Reads a trace whose first bytes, `head`, were already taken from `rest`.
pub fn read_from(head: &[u8], rest: impl Read) -> Result<Snapshot, TraceError> {
    let input = std::io::Cursor::new(head.to_vec()).chain(rest);
    let parsed = if head.starts_with(&[0x1f, 0x8b]) { parse::read(flate2::read::MultiGzDecoder::new(input)) } else { parse::read(input) }
        .map_err(TraceError::of_json)?;
    match parsed {
        parse::Parsed::Trace(trace) => convert::to_snapshot(&trace),
        parse::Parsed::Timeline(timeline) => timeline::to_snapshot(&timeline),
    }
    .map_err(TraceError::Content)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const TRACE: &str = r#"{"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "tid": 1, "ts": 0, "dur": 10},
        {"ph": "i", "name": "[memory]", "tid": 1, "ts": 1, "args": {"Device Type": 1, "Device Id": 0, "Bytes": 1024}},
        {"ph": "i", "name": "[memory]", "tid": 1, "ts": 2, "args": {"Device Type": 1, "Device Id": 0, "Bytes": -1024}}
    ]}"#;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(data).unwrap();
        z.finish().unwrap()
    }

    #[test]
    fn a_gzipped_trace_in_a_directory_opens_and_a_cut_one_says_so() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_trace(dir.path()).unwrap_err().to_string(), "no torch.profiler traces in the directory (*.pt.trace.json, *.json, *.json.gz)");
        let z = gzip(TRACE.as_bytes());
        std::fs::write(dir.path().join("worker0.1.pt.trace.json.gz"), &z).unwrap();
        let s = read_trace(dir.path()).unwrap();
        assert_eq!(s.device_traces[0].len(), 2);
        assert_eq!(s.profiled.as_ref().map(|p| p.steps.clone()), Some(vec![1]));
        let cut = dir.path().join("cut.json.gz");
        std::fs::write(&cut, &z[..z.len() / 2]).unwrap();
        let err = read_trace(&cut).unwrap_err().to_string();
        assert!(err.contains("cannot decompress") || err.contains("ends early"), "{err}");
        let plain = dir.path().join("plain.json");
        std::fs::write(&plain, &TRACE[..TRACE.len() - 10]).unwrap();
        assert!(read_trace(&plain).unwrap_err().to_string().starts_with("the trace ends early"));
    }

    #[test]
    fn a_directory_of_ranks_and_windows_picks_by_stated_rank_then_time() {
        let dir = tempfile::tempdir().unwrap();
        let with_rank = |r: usize| TRACE.replacen("{\"traceEvents\"", &format!("{{\"distributedInfo\": {{\"backend\": \"gloo\", \"rank\": {r}, \"world_size\": 2}}, \"traceEvents\""), 1);
        // By name the second worker comes first; its stated rank is 1.
        std::fs::write(dir.path().join("host_100.1700000000002.pt.trace.json"), with_rank(1)).unwrap();
        std::fs::write(dir.path().join("host_200.1700000000001.pt.trace.json"), with_rank(0)).unwrap();
        std::fs::write(dir.path().join("host_200.1700000000009.pt.trace.json"), with_rank(0)).unwrap();
        let p = pick(dir.path(), None, None).unwrap();
        assert!(p.file.ends_with("host_200.1700000000001.pt.trace.json"), "{p:?}");
        assert_eq!(p.description, "worker 1 of 2 (rank 0), window 1 of 2: host_200.1700000000001.pt.trace.json");
        assert!(pick(dir.path(), Some(0), Some(1)).unwrap().file.ends_with("host_200.1700000000009.pt.trace.json"));
        assert!(pick(dir.path(), Some(1), None).unwrap().file.ends_with("host_100.1700000000002.pt.trace.json"));
        assert_eq!(pick(dir.path(), Some(2), None).unwrap_err().to_string(), "no rank 2 here: the directory has 2 workers (rank 0, rank 1)");
        assert_eq!(pick(dir.path(), Some(1), Some(1)).unwrap_err().to_string(), "no window 1 of host_100: it has 1 (0 to 0)");
        let s = read_trace(dir.path()).unwrap();
        assert_eq!(s.profiled.unwrap().picked.as_deref(), Some("worker 1 of 2 (rank 0), window 1 of 2: host_200.1700000000001.pt.trace.json"));
    }

    #[test]
    fn only_json_objects_and_gzip_look_like_traces() {
        assert!(looks_like_trace(b"  \n{\"traceEvents\""));
        assert!(looks_like_trace(&[0x1f, 0x8b, 8]));
        assert!(!looks_like_trace(&[0x80, 4]));
        assert!(looks_like_trace(b"[[1]"), "export_memory_timeline's lists");
        assert!(!looks_like_trace(b"(dp0"), "a protocol-0 pickle");
    }
}
