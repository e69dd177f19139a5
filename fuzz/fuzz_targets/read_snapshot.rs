//! Any input: the reader returns Ok or Err, never panics; whatever it accepts, the
//! writer writes and the reader reads back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramscope_core::snapshot::{read_snapshot as read, writer};

fuzz_target!(|data: &[u8]| {
    let Ok(snap) = read(data) else {
        return;
    };
    let mut first = Vec::new();
    writer::write_snapshot(&snap, &mut first)
        .expect("a snapshot the reader built must be writable");
    let again = read(&first).expect("the writer's output must read back");
    let mut second = Vec::new();
    writer::write_snapshot(&again, &mut second).expect("rewrite");
    assert!(
        first == second,
        "write(read(write(s))) differs from write(s)"
    );
});
