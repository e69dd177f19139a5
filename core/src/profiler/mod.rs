//! torch.profiler traces, opened where a memory snapshot is: a chrome trace
//! (`export_chrome_trace`, `tensorboard_trace_handler`'s `*.pt.trace.json`, gzipped or not)
//! or the directory `tensorboard_trace_handler` writes. `parse` keeps what the memory view
//! needs while it streams the JSON; `convert` makes the snapshot of it.

pub mod convert;
pub mod parse;

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

/// Does a file that starts with `head` look like a trace: gzip, or a JSON object?
pub fn looks_like_trace(head: &[u8]) -> bool {
    head.starts_with(&[0x1f, 0x8b]) || head.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
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

/// Reads the trace at `path` (a file, or a directory's first trace) as a snapshot.
pub fn read_trace(path: &Path) -> Result<Snapshot, TraceError> {
    if path.is_dir() {
        let file = traces_in(path)?.swap_remove(0);
        let name = file.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        return read_file(&file).map_err(|e| TraceError::Content(format!("{name}: {e}")));
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
    let trace = if head.starts_with(&[0x1f, 0x8b]) { parse::read(flate2::read::MultiGzDecoder::new(input)) } else { parse::read(input) }
        .map_err(TraceError::of_json)?;
    convert::to_snapshot(&trace).map_err(TraceError::Content)
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
    fn only_json_objects_and_gzip_look_like_traces() {
        assert!(looks_like_trace(b"  \n{\"traceEvents\""));
        assert!(looks_like_trace(&[0x1f, 0x8b, 8]));
        assert!(!looks_like_trace(&[0x80, 4]));
        assert!(!looks_like_trace(b"[1]"));
    }
}
