//! The channel between a job and the viewers that watch and steer it, and who may use it
//! (docs/security.md). By default a Unix socket in a directory only the job's owner can
//! enter, each side checking the other's uid before reading a byte; TCP only when asked
//! for, with a random token the viewer must present before anything is sent or accepted.

pub mod dir;
pub mod peer;
pub mod token;

use std::io::{self, BufRead, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// What a viewer sends first on every connection: the word, the protocol version, and the
/// token (`-` on a Unix socket, where the peer's uid is the check).
pub const HELLO: &str = "VSHELLO";
pub const PROTOCOL: u16 = 1;
/// A hello, or one control line, never exceeds this; a longer one is hostile.
pub const MAX_LINE: usize = 4096;
/// How long a connection may take to say hello before it is dropped.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("{path}: {why}")]
    Dir { path: PathBuf, why: String },
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Refused(String),
    #[error("--listen {given}: {why} (give PORT, or HOST:PORT)")]
    Listen { given: String, why: String },
}

/// Where a job listens or a viewer connects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "{a}"),
        }
    }
}

/// `--listen` values: a port alone binds loopback; HOST:PORT binds what it names.
pub fn parse_listen(s: &str) -> Result<SocketAddr, ChannelError> {
    let bad = |why: &str| ChannelError::Listen { given: s.to_string(), why: why.to_string() };
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    s.parse::<SocketAddr>().map_err(|_| {
        if s.contains(':') {
            bad("not an IP address and port")
        } else {
            bad("not a port number")
        }
    })
}

/// Reads one line of at most `MAX_LINE` bytes (without its newline); None at end of stream.
pub fn read_line(r: &mut impl BufRead) -> io::Result<Option<String>> {
    let mut buf = Vec::new();
    let n = r.by_ref().take(MAX_LINE as u64 + 1).read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') {
        let why = if buf.len() > MAX_LINE { format!("a line longer than {MAX_LINE} bytes") } else { "a line cut short".into() };
        return Err(io::Error::new(io::ErrorKind::InvalidData, why));
    }
    buf.pop();
    String::from_utf8(buf).map(Some).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a line that is not UTF-8"))
}

/// The viewer's first line.
pub fn write_hello(w: &mut impl Write, token: Option<&str>) -> io::Result<()> {
    writeln!(w, "{HELLO} {PROTOCOL} {}", token.unwrap_or("-"))?;
    w.flush()
}

/// The token a hello line carries (None for `-`), or why the line is not a hello.
pub fn parse_hello(line: &str) -> Result<Option<String>, String> {
    let mut words = line.split(' ');
    match (words.next(), words.next(), words.next(), words.next()) {
        (Some(HELLO), Some(v), Some(token), None) => {
            if v != PROTOCOL.to_string() {
                return Err(format!("protocol version {v}, this job speaks {PROTOCOL}"));
            }
            Ok((token != "-").then(|| token.to_string()))
        }
        _ => Err("not a vramscope viewer's hello".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_values_default_to_loopback() {
        assert_eq!(parse_listen("9123").unwrap(), "127.0.0.1:9123".parse().unwrap());
        assert_eq!(parse_listen("0.0.0.0:80").unwrap(), "0.0.0.0:80".parse().unwrap());
        let e = parse_listen("localhost:x").unwrap_err().to_string();
        assert_eq!(e, "--listen localhost:x: not an IP address and port (give PORT, or HOST:PORT)");
        assert!(parse_listen("70000").unwrap_err().to_string().contains("not a port number"));
    }

    #[test]
    fn hello_lines_carry_the_token_and_are_bounded() {
        let mut buf = Vec::new();
        write_hello(&mut buf, Some("abc")).unwrap();
        let line = read_line(&mut &buf[..]).unwrap().unwrap();
        assert_eq!(parse_hello(&line), Ok(Some("abc".into())));
        assert_eq!(parse_hello("VSHELLO 1 -"), Ok(None));
        assert!(parse_hello("GET / HTTP/1.1").is_err());
        assert!(parse_hello("VSHELLO 9 -").unwrap_err().contains("version 9"));
        let long = vec![b'a'; MAX_LINE + 10];
        assert!(read_line(&mut &long[..]).unwrap_err().to_string().contains("longer than"));
        assert_eq!(read_line(&mut &b""[..]).unwrap(), None);
    }
}
