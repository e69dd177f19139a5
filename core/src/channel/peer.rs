//! Who is on the other end of a Unix socket, from the kernel (SO_PEERCRED): the uid and pid
//! cannot be forged by the peer.

use std::io;
use std::os::fd::AsRawFd;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
}

pub fn peer_cred(sock: &impl AsRawFd) -> io::Result<PeerCred> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred { pid: cred.pid, uid: cred.uid })
}

/// Ok when the peer runs as this process's effective user.
pub fn check_same_user(sock: &impl AsRawFd) -> Result<PeerCred, PeerCred> {
    let me = super::dir::euid();
    match peer_cred(sock) {
        Ok(c) if c.uid == me => Ok(c),
        Ok(c) => Err(c),
        // No credentials: treat as a stranger (uid unknown).
        Err(_) => Err(PeerCred { pid: 0, uid: u32::MAX }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_pair_sees_this_process() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let c = check_same_user(&a).unwrap();
        assert_eq!(c.pid as u32, std::process::id());
    }
}
