//! The job side of the stream, free of libtorch: what turns the capture shim's raw events
//! into the device-shaped stream with exact accounting (tracker), cuts snapshots (cut),
//! names modules and allocations (scopes), serves viewers (server), and drives all of it
//! from a training loop (session). vramscope's own engine process and the Python hook in a
//! user's job both host a session, so both produce the same stream.

pub mod cut;
pub mod raw;
pub mod scopes;
pub mod server;
pub mod session;
pub mod tracker;

/// This machine's name, for a job's info (ranks of one job may run on several).
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
