//! The directory that holds job sockets and token files: `$XDG_RUNTIME_DIR/vramscope`, else
//! `vramscope-<uid>` under the temp dir. Only its owner may enter it: it is created 0700,
//! and one that already exists must be a real directory (not a link), owned by us, closed
//! to everyone else, or it is refused, so nobody can plant one in /tmp first.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::ChannelError;

pub fn euid() -> u32 {
    // SAFETY: geteuid has no failure mode.
    unsafe { libc::geteuid() }
}

/// The socket directory, created if missing; `VRAMSCOPE_SOCKET_DIR` overrides it (tests).
pub fn socket_dir() -> Result<PathBuf, ChannelError> {
    let dir = match std::env::var_os("VRAMSCOPE_SOCKET_DIR") {
        Some(d) => PathBuf::from(d),
        None => match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
            Some(x) if private_dir(&x).is_ok() => x.join("vramscope"),
            _ => std::env::temp_dir().join(format!("vramscope-{}", euid())),
        },
    };
    ensure_private_dir(&dir)?;
    Ok(dir)
}

/// Creates `dir` 0700 if missing and checks it is ours and private.
pub fn ensure_private_dir(dir: &Path) -> Result<(), ChannelError> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(ChannelError::Dir { path: dir.to_path_buf(), why: format!("cannot create it: {e}") }),
    }
    private_dir(dir).map_err(|why| ChannelError::Dir { path: dir.to_path_buf(), why })
}

/// Why `dir` is not a directory only we can enter, if it is not.
fn private_dir(dir: &Path) -> Result<(), String> {
    let m = std::fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    if !m.file_type().is_dir() {
        return Err("is not a directory (a link or file is in its place)".into());
    }
    if m.uid() != euid() {
        return Err(format!("belongs to uid {}, not to this user (uid {})", m.uid(), euid()));
    }
    if m.permissions().mode() & 0o077 != 0 {
        return Err(format!("is open to other users (mode {:o}); it must be 700", m.permissions().mode() & 0o777));
    }
    Ok(())
}

/// The socket of `job`'s rank: `<dir>/<job>-r<rank>.sock`.
pub fn socket_path(dir: &Path, job: &str, rank: u32) -> PathBuf {
    dir.join(format!("{job}-r{rank}.sock"))
}

/// The job name and rank a socket file's name carries.
pub fn parse_socket_name(name: &str) -> Option<(&str, u32)> {
    let stem = name.strip_suffix(".sock")?;
    let (job, rank) = stem.rsplit_once("-r")?;
    Some((job, rank.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_open_to_others_or_not_ours_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("s");
        ensure_private_dir(&d).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().permissions().mode() & 0o777, 0o700);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = ensure_private_dir(&d).unwrap_err().to_string();
        assert!(e.ends_with("is open to other users (mode 755); it must be 700"), "{e}");
        let link = t.path().join("l");
        std::os::unix::fs::symlink(t.path(), &link).unwrap();
        assert!(ensure_private_dir(&link).unwrap_err().to_string().contains("a link or file"));
    }

    #[test]
    fn socket_names_carry_job_and_rank() {
        let p = socket_path(Path::new("/d"), "1234-train", 3);
        assert_eq!(p, Path::new("/d/1234-train-r3.sock"));
        assert_eq!(parse_socket_name("1234-train-r3.sock"), Some(("1234-train", 3)));
        assert_eq!(parse_socket_name("x.token"), None);
    }
}
