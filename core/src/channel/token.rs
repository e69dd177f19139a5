//! The TCP token: 32 random bytes as hex, compared in constant time, kept in a file only
//! its owner can read.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::ChannelError;

pub fn new_token() -> std::io::Result<String> {
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Equal without revealing through timing how much of `given` matched.
pub fn tokens_equal(given: &str, expected: &str) -> bool {
    let (g, e) = (given.as_bytes(), expected.as_bytes());
    let mut diff = (g.len() ^ e.len()) as u8 | u8::from(g.len() != e.len());
    for (i, b) in e.iter().enumerate() {
        diff |= g.get(i).copied().unwrap_or(0) ^ b;
    }
    diff == 0
}

/// Writes a new token file, 0600, never over an existing file.
pub fn write_token_file(path: &Path, token: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    writeln!(f, "{token}")
}

/// A token file's token, refused unless only its owner (this user) can read it.
pub fn read_token_file(path: &Path) -> Result<String, ChannelError> {
    let bad = |why: String| ChannelError::Refused(format!("{}: {why}", path.display()));
    let m = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if m.uid() != super::dir::euid() {
        return Err(bad(format!("belongs to uid {}, not to this user", m.uid())));
    }
    if m.permissions().mode() & 0o077 != 0 {
        return Err(bad(format!("others can read it (mode {:o}); a token file must be 600", m.permissions().mode() & 0o777)));
    }
    let s = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    Ok(s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_compared_whole() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert!(tokens_equal(&a, &a.clone()));
        assert!(!tokens_equal(&a[..63], &a));
        assert!(!tokens_equal(&b, &a));
        assert!(!tokens_equal("", &a));
    }

    #[test]
    fn token_files_are_private_and_never_overwritten() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t");
        write_token_file(&p, "abc").unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(write_token_file(&p, "def").is_err());
        assert_eq!(read_token_file(&p).unwrap(), "abc");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(read_token_file(&p).unwrap_err().to_string().contains("mode 644"));
    }
}
