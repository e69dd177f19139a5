//! What a file argument opens: a regular file, or a stream read incrementally (`-` for
//! standard input, a pipe such as `<(ssh host cat snap.pickle)`, a FIFO, a device). A
//! stream is judged by its first bytes before anything more is read, so `/dev/zero`
//! fails at once, and it is named for what it is rather than by its file descriptor.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// A stream that reaches this size without ending is not read further: save it to a file
/// (which is read without this limit, memory-mapped).
pub const MAX_STREAMED: u64 = 16 << 30;

pub enum Input {
    File(File, PathBuf),
    /// The first bytes already read (`head`), then the rest.
    Stream { head: Vec<u8>, rest: Box<dyn Read + Send> },
}

/// An input and the name messages and titles give it.
pub struct Opened {
    pub input: Input,
    pub name: String,
}

/// How a stream is named: the path with what it is.
fn stream_name(path: &Path, kind: &str) -> String {
    format!("{} ({kind})", path.display())
}

/// What a file type that is not a regular file is read as; directories cannot be.
fn stream_kind(path: &Path, t: std::fs::FileType) -> io::Result<&'static str> {
    if t.is_fifo() {
        Ok("a pipe")
    } else if t.is_char_device() || t.is_block_device() {
        Ok("a device")
    } else if t.is_dir() {
        Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is a directory", path.display())))
    } else {
        Ok("a stream")
    }
}

/// How messages name `path`: as given, `-` as standard input.
pub fn shown(path: &Path) -> String {
    if path == Path::new("-") {
        "standard input".into()
    } else {
        path.display().to_string()
    }
}

/// The name a title gives `path`: a file by its name, a stream as `open` names it (the
/// pipe behind `<(…)` is `/dev/fd/63 (a pipe)`, not `63`).
pub fn title(path: &Path) -> String {
    if path == Path::new("-") {
        return shown(path);
    }
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => stream_kind(path, m.file_type()).map_or_else(|_| path.display().to_string(), |k| stream_name(path, k)),
        _ => path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned()),
    }
}

/// Opens `path` (`-` = standard input); a stream's first `head` bytes are read now.
pub fn open(path: &Path, head: usize) -> io::Result<Opened> {
    let (rest, name): (Box<dyn Read + Send>, String) = if path == Path::new("-") {
        (Box::new(io::stdin()), "standard input".into())
    } else {
        let f = File::open(path)?;
        let t = f.metadata()?.file_type();
        if t.is_file() {
            return Ok(Opened { input: Input::File(f, path.to_path_buf()), name: path.display().to_string() });
        }
        let kind = stream_kind(path, t)?;
        (Box::new(f), stream_name(path, kind))
    };
    let mut rest = rest;
    let mut h = vec![0u8; head];
    let mut n = 0;
    while n < head {
        match rest.read(&mut h[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    h.truncate(n);
    Ok(Opened { input: Input::Stream { head: h, rest }, name })
}

impl Opened {
    /// The first bytes, without consuming a stream (a file is read at its start).
    pub fn head(&self, n: usize) -> io::Result<Vec<u8>> {
        match &self.input {
            Input::File(f, _) => {
                let mut b = vec![0u8; n];
                let k = std::os::unix::fs::FileExt::read_at(f, &mut b, 0)?;
                b.truncate(k);
                Ok(b)
            }
            Input::Stream { head, .. } => Ok(head[..n.min(head.len())].to_vec()),
        }
    }

    /// A stream's whole content, up to `MAX_STREAMED` bytes.
    pub fn read_stream(head: Vec<u8>, rest: Box<dyn Read + Send>, name: &str) -> io::Result<Vec<u8>> {
        let mut all = head;
        rest.take(MAX_STREAMED + 1).read_to_end(&mut all)?;
        if all.len() as u64 > MAX_STREAMED {
            return Err(io::Error::other(format!(
                "{name}: more than {} GiB without ending; save it to a file and open that",
                MAX_STREAMED >> 30
            )));
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_pipes_are_streams_named_for_what_they_are() {
        let o = open(Path::new("/dev/zero"), 8).unwrap();
        assert_eq!(o.name, "/dev/zero (a device)");
        assert!(matches!(&o.input, Input::Stream { head, .. } if head == &[0u8; 8]));
        let t = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(t.path(), b"abc").unwrap();
        let o = open(t.path(), 8).unwrap();
        assert!(matches!(o.input, Input::File(..)));
        assert_eq!(o.head(8).unwrap(), b"abc");
        let d = tempfile::tempdir().unwrap();
        assert!(open(d.path(), 8).err().unwrap().to_string().contains("is a directory"));
        assert_eq!(title(Path::new("/dev/zero")), "/dev/zero (a device)");
        assert_eq!(title(t.path()), t.path().file_name().unwrap().to_string_lossy());
        assert_eq!(title(Path::new("-")), "standard input");
    }
}
