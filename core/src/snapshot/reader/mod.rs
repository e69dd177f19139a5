//! Fast, safe reader for PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot`).
//!
//! A snapshot is a pickle of plain data. Instead of building a generic value tree (which
//! costs several times the file size), this is a purpose-built pickle VM for the data-only
//! subset of protocols 2-5 that converts dicts into typed records (`TraceEntry`, `Block`,
//! `Segment`, `Annotation`, `Frame`) as soon as their `SETITEMS` arrives. Strings are
//! borrowed from the input; frames are interned once per memoized frame dict.
//!
//! Two passes: a cheap pre-scan validates the opcode stream and records which memo slots
//! are ever read back (`BINGET`), so the main pass keeps only those: Python memoizes every
//! container, and keeping them all would double the memory use. The main pass decodes a
//! large trace on the machine's cores; the result is the same on any number.
//!
//! Object-building opcodes (GLOBAL, REDUCE, BUILD, ...) are rejected: a snapshot is data.
//!
//! Layout, each file using only those before it: `error`; `op` and `cursor` decode
//! opcodes from bytes; `hooks` shows the caller progress; `prescan` is the first pass
//! (memo slots read back); `intern` holds the stack table; `value` is what the machine
//! holds and `keys` tells which dict is which record; `vm` is the machine's state (value
//! stack, marks, memo, interned tables); `records` turns dicts into the snapshot's records;
//! `fast_entry` reads the usual trace entry straight from the bytes; `run` is the main
//! pass; `parallel` hands a large trace's entries to threads, from the pre-scan's
//! checkpoints, and takes their work back in order; `top_level` makes the `Snapshot` of
//! the top-level value.

mod cursor;
mod error;
mod fast_entry;
mod hooks;
mod intern;
mod keys;
pub(super) mod op;
mod parallel;
mod prescan;
mod records;
mod run;
mod top_level;
mod value;
mod vm;

use std::path::Path;

use crate::snapshot::model::Snapshot;
use hooks::Hooks;
use prescan::{prescan, Scan};
use run::Ran;
use top_level::canonicalize_tables;
use vm::Vm;

pub use error::ReadError;
pub use hooks::{ReadPass, ReadProgress};

/// Read and decode a snapshot file. Regular files are memory-mapped and the pages
/// already decoded are released as the reader advances, so peak memory is mostly the
/// decoded snapshot, not the file. Anything else (`-` for standard input, a pipe such as
/// `<(ssh host cat snap.pickle)`, a device) is judged by its first two bytes before more
/// is read, so `/dev/zero` fails at once, then read into memory.
pub fn read_snapshot_file(path: &Path) -> Result<Snapshot, ReadError> {
    read_snapshot_file_observed(path, &mut |_| {})
}

/// `read_snapshot_file`, showing `observe` what is decoded so far every `TICK` bytes of
/// each pass and once more at the end, so a viewer can draw a large file while it loads.
pub fn read_snapshot_file_observed(
    path: &Path,
    observe: &mut dyn FnMut(&ReadProgress<'_>),
) -> Result<Snapshot, ReadError> {
    // A torch.profiler trace (a file, or the directory tensorboard_trace_handler wrote) is
    // read as the snapshot of its memory events.
    if path.is_dir() {
        return crate::profiler::read_trace(path).map_err(ReadError::Trace);
    }
    let opened = crate::input::open(path, 2).map_err(|err| ReadError::Io { path: path.to_path_buf(), err })?;
    read_snapshot_opened(opened, path, observe)
}

/// Reads a snapshot from what `crate::input::open(path, …)` opened (a stream's head
/// already read): `read_snapshot_file_observed` after the open.
pub fn read_snapshot_opened(
    opened: crate::input::Opened,
    path: &Path,
    observe: &mut dyn FnMut(&ReadProgress<'_>),
) -> Result<Snapshot, ReadError> {
    let io = |err| ReadError::Io {
        path: path.to_path_buf(),
        err,
    };
    // A regular file's first bytes, past JSON's leading whitespace: enough to tell a trace.
    if matches!(opened.input, crate::input::Input::File(..)) && crate::profiler::looks_like_trace(&opened.head(64).map_err(io)?) {
        return crate::profiler::read_trace(path).map_err(ReadError::Trace);
    }
    let (head, rest) = match opened.input {
        crate::input::Input::Stream { head, rest } if crate::profiler::looks_like_trace(&head) => {
            return crate::profiler::read_from(&head, rest).map_err(ReadError::Trace);
        }
        crate::input::Input::File(file, _) => {
            if let Some(map) = mapped::Mapped::open(&file).map_err(io)? {
                return decode(map.bytes(), &|range| map.release(range), observe);
            }
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut &file, &mut bytes).map_err(io)?;
            return decode(&bytes, &|_| {}, observe);
        }
        crate::input::Input::Stream { head, rest } => (head, rest),
    };
    // The protocol header, checked before the rest of a stream is waited for.
    check_header(&head)?;
    let bytes = crate::input::Opened::read_stream(head, rest, &opened.name).map_err(io)?;
    decode(&bytes, &|_| {}, observe)
}

/// Decode a snapshot pickle.
pub fn read_snapshot(bytes: &[u8]) -> Result<Snapshot, ReadError> {
    decode(bytes, &|_| {}, &mut |_| {})
}

/// Walks and checks every opcode of a snapshot pickle in order on one thread, decoding
/// nothing: the least any reader of the format must do, which the benches measure the
/// read against (issue 29).
pub fn walk_opcodes(bytes: &[u8]) -> Result<(), ReadError> {
    check_header(bytes)?;
    prescan::walk(bytes)
}

/// The PROTO opcode a pickle of protocol 2 to 5 starts with, as far as `head` goes.
fn check_header(head: &[u8]) -> Result<(), ReadError> {
    match head {
        [] => Err(ReadError::Empty),
        [b, ..] if *b != op::PROTO => Err(ReadError::NotPickle { byte: *b }),
        [_, v, ..] => cursor::check_proto(*v, 1),
        [_] => Ok(()),
    }
}

/// Decoding threads at most: past this, the main pass taking their work is the limit.
const MAX_THREADS: usize = 16;

/// How a trace is decoded: the threads, the bytes each takes at a time, and the file's
/// offset from which a trace may go to them.
#[derive(Clone, Copy)]
struct Threads {
    threads: usize,
    chunk_bytes: usize,
    from: usize,
}

impl Threads {
    const ONE: Threads = Threads { threads: 1, chunk_bytes: usize::MAX, from: usize::MAX };

    /// A file of `len` bytes on up to `threads` threads: one for small files, where
    /// starting threads costs more than it saves.
    fn from_size(len: usize, threads: usize) -> Threads {
        if threads < 2 || len < 4 << 20 {
            return Threads::ONE;
        }
        Threads { threads, chunk_bytes: 1 << 20, from: 0 }
    }
}

/// The main pass: the snapshot of its top-level value, and the stretches of traces
/// threads decoded; the pre-scan's findings back when the threads' work did not fit.
fn run(bytes: &[u8], scan: Scan, t: Threads, hooks: &mut Hooks<'_>) -> Result<Result<(Snapshot, u32), Scan>, ReadError> {
    let mut vm = Vm::new(bytes, scan);
    (vm.threads, vm.chunk_bytes, vm.parallel_from) = (t.threads, t.chunk_bytes, t.from);
    match vm.run_to(hooks, usize::MAX)? {
        Ran::Done(top) => {
            let stretches = vm.stretches;
            vm.into_snapshot(top).map(|s| Ok((s, stretches)))
        }
        Ran::Refit => Ok(Err(Scan { refs: vm.refs, checkpoints: vm.checkpoints })),
        Ran::Stopped => Err(ReadError::Malformed { offset: bytes.len(), detail: "the pickle has no STOP".into() }),
    }
}

/// The pre-scan and the main pass, on `t`'s threads: the snapshot (its tables as met), the
/// stretches of traces threads decoded, and whether their work did not fit the main pass,
/// which then read again in order.
fn both_passes(bytes: &[u8], t: Threads, hooks: &mut Hooks<'_>) -> Result<(Snapshot, u32, bool), ReadError> {
    // Each pass is shown as it begins, so a caller can time it (`view --summary --profile`).
    let begins = |pass| ReadProgress { pass, done: 0, total: bytes.len(), segments: None, traces: Vec::new() };
    (hooks.observe)(&begins(ReadPass::Check));
    let scan = prescan(bytes, t.threads, hooks)?;
    (hooks.observe)(&begins(ReadPass::Decode));
    match run(bytes, scan, t, hooks)? {
        Ok((snap, stretches)) => Ok((snap, stretches, false)),
        // The threads' work did not fit the main pass (no well-formed snapshot does that):
        // the pre-scan's findings back, for a read in order.
        Err(scan) => {
            let (snap, _) = run(bytes, scan, Threads::ONE, hooks)?.map_err(|_| ReadError::Malformed { offset: 0, detail: "the pickle reads differently in order".into() })?;
            Ok((snap, 0, true))
        }
    }
}

/// `release(range)` is told periodically that those bytes may be dropped from memory
/// (from any thread); they must still read the same if touched again (a file mapping
/// re-faults them).
fn decode(
    bytes: &[u8],
    release: &(dyn Fn(std::ops::Range<usize>) + Sync),
    observe: &mut dyn FnMut(&ReadProgress<'_>),
) -> Result<Snapshot, ReadError> {
    check_header(bytes)?;
    let mut hooks = Hooks::new(release, observe);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_THREADS);
    let (mut snap, _, _) = both_passes(bytes, Threads::from_size(bytes.len(), threads), &mut hooks)?;
    canonicalize_tables(&mut snap);
    (hooks.observe)(&ReadProgress {
        pass: ReadPass::Decode,
        done: bytes.len(),
        total: bytes.len(),
        segments: Some(&snap.segments),
        traces: snap.device_traces.iter().map(Vec::as_slice).collect(),
    });
    Ok(snap)
}

mod mapped {
    use std::fs::File;
    use std::io;
    use std::os::fd::AsRawFd;

    /// A read-only private mapping of a whole regular file.
    pub struct Mapped {
        ptr: *mut libc::c_void,
        len: usize,
        page: usize,
    }

    // SAFETY: the mapping is read-only and lives as long as `Mapped`; reading it and
    // advising on its pages are safe from any thread.
    unsafe impl Sync for Mapped {}

    impl Mapped {
        /// `None` when the file cannot be mapped (empty, not a regular file): the caller
        /// reads it instead.
        pub fn open(file: &File) -> io::Result<Option<Mapped>> {
            let meta = file.metadata()?;
            let Ok(len) = usize::try_from(meta.len()) else {
                return Ok(None);
            };
            if len == 0 || !meta.is_file() {
                return Ok(None);
            }
            // SAFETY: a fresh PROT_READ, MAP_PRIVATE mapping; we never write through it.
            // Snapshot files are written once and renamed into place; truncating one
            // while it is being read would fault, as with any mapped file.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE,
                    file.as_raw_fd(),
                    0,
                )
            };
            if ptr == libc::MAP_FAILED {
                return Ok(None);
            }
            // SAFETY: advice on the range just mapped.
            unsafe { libc::madvise(ptr, len, libc::MADV_SEQUENTIAL) };
            Ok(Some(Mapped { ptr, len, page: crate::snapshot::pages::size() }))
        }

        pub fn bytes(&self) -> &[u8] {
            // SAFETY: the mapping is `len` readable bytes and lives as long as `self`.
            unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
        }

        /// Drop the resident pages wholly inside `range`. The mapping stays valid: a
        /// page read again faults back in from the (unchanged) file.
        pub fn release(&self, range: std::ops::Range<usize>) {
            let start = range.start.div_ceil(self.page) * self.page;
            let end = range.end.min(self.len) / self.page * self.page;
            if end > start {
                // SAFETY: page-aligned pages of our own private read-only mapping.
                unsafe { libc::madvise(self.ptr.cast::<u8>().add(start).cast(), end - start, libc::MADV_DONTNEED) };
            }
        }
    }

    impl Drop for Mapped {
        fn drop(&mut self) {
            // SAFETY: unmapping exactly what `open` mapped; `bytes()` borrows end before.
            unsafe { libc::munmap(self.ptr, self.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::hooks::TICK;
    use super::*;

    #[test]
    fn hooks_see_progress_and_do_not_change_the_result() {
        let mut p = vec![
            op::PROTO,
            4,
            op::EMPTY_DICT,
            op::MARK,
            op::SHORT_BINUNICODE,
            8,
        ];
        p.extend(b"segments");
        p.extend([op::EMPTY_LIST, op::SHORT_BINUNICODE, 3]);
        p.extend(b"pad");
        p.push(op::BINUNICODE);
        let pad = TICK + 10;
        p.extend((pad as u32).to_le_bytes());
        p.extend(std::iter::repeat_n(b'x', pad));
        p.extend([op::SETITEMS, op::STOP]);
        let calls = std::sync::Mutex::new(Vec::new());
        let mut passes = Vec::new();
        let release = |r: std::ops::Range<usize>| calls.lock().unwrap().push(r.end);
        let snap = decode(&p, &release, &mut |r| passes.push((r.pass, r.done))).unwrap();
        let calls = calls.into_inner().unwrap();
        assert_eq!(snap, read_snapshot(&p).unwrap());
        assert_eq!(calls.len(), 2, "one release per pass: {calls:?}");
        assert!(calls.iter().all(|&n| n > TICK));
        let end = (ReadPass::Decode, p.len());
        // Each pass is shown as it begins, then at its tick, and the decode at its end.
        assert_eq!(passes, [(ReadPass::Check, 0), (ReadPass::Check, calls[0]), (ReadPass::Decode, 0), (ReadPass::Decode, calls[1]), end]);
    }

    /// Reads `bytes` as `decode` does, on `t`'s threads: as `both_passes` says.
    fn read_or_fail_on(bytes: &[u8], t: Threads) -> Result<(Snapshot, u32, bool), ReadError> {
        let mut observe = |_: &ReadProgress<'_>| {};
        let mut hooks = Hooks::new(&|_| {}, &mut observe);
        check_header(bytes)?;
        let (mut snap, stretches, again) = both_passes(bytes, t, &mut hooks)?;
        canonicalize_tables(&mut snap);
        Ok((snap, stretches, again))
    }

    /// A well-formed snapshot read on `t`'s threads: the snapshot and the stretches
    /// threads decoded.
    fn read_on(bytes: &[u8], t: Threads) -> (Snapshot, u32) {
        let (snap, stretches, again) = read_or_fail_on(bytes, t).unwrap();
        assert!(!again, "the threads' work did not fit");
        (snap, stretches)
    }

    /// Two devices' traces, `n` entries each: stacks new and read back all along (shared
    /// as PyTorch writes them), texts new and repeated, pools changing, and actions this
    /// reader skips.
    fn many_entries(n: usize) -> Snapshot {
        use crate::snapshot::model::{Action, Frame, StackInterner, Text, TraceEntry};
        let mut snap = Snapshot::default();
        let mut interner = StackInterner::default();
        for device in 0..2u64 {
            let mut trace = Vec::new();
            for i in 0..n as u64 {
                let frames = (0..i % 5).map(|k| interner.frame(&mut snap, Frame { name: format!("f{}", (i / 40 + k) % 97), filename: "model.py".into(), line: k as i64 })).collect();
                let action = [Action::Alloc, Action::FreeRequested, Action::FreeCompleted, Action::SegmentAlloc][(i % 4) as usize];
                let mut e = TraceEntry { frames: interner.stack(&mut snap, frames), time_us: (i * 3) as i64, stream: (i % 3) as i64, ..TraceEntry::new(action, 0x1000 * (device * n as u64 + i / 2), 512 * (i % 7 + 1)) };
                e.compile_context = (i % 3 == 0).then(|| Text::from(format!("ctx {}", i / 30).as_str()));
                e.user_metadata = (i % 11 == 0).then(|| Text::from("meta"));
                trace.push(e);
                // A new pool every 700 entries, back to (0, 0) at times: runs that begin
                // and end inside a thread's stretch.
                if i % 700 == 0 {
                    let k = (i / 700) as i64;
                    snap.details.pools.push(crate::snapshot::model::PoolRun { trace: device as u32, from: i as u32, pool: (k % 3, k % 2) });
                }
            }
            snap.device_traces.push(trace);
        }
        snap
    }

    /// Every width of integer an entry holds (BININT1 to LONG1 of nine bytes, negative
    /// ones too) reads back as written, by the fast path as by the generic one.
    #[test]
    fn integers_of_every_width_read_back_as_written() {
        use crate::snapshot::model::{Action, StackInterner, TraceEntry};
        let mut snap = Snapshot::default();
        let frames = StackInterner::default().stack(&mut snap, Vec::new());
        let values = (0..63).flat_map(|b| [1i64 << b, -(1i64 << b), (1i64 << b) - 1, !((1i64 << b) - 1) + 3]).chain([i64::MIN, i64::MAX]);
        let trace: Vec<TraceEntry> = values
            .enumerate()
            .map(|(i, v)| TraceEntry { time_us: v, stream: v.rotate_right(i as u32 % 64), frames, ..TraceEntry::new(Action::Alloc, v.unsigned_abs(), v as u64) })
            .collect();
        snap.device_traces.push(trace.clone());
        let mut bytes = Vec::new();
        crate::snapshot::writer::write_snapshot(&snap, &mut bytes).unwrap();
        assert_eq!(read_snapshot(&bytes).unwrap().device_traces[0], trace);
    }

    #[test]
    fn a_trace_read_on_threads_is_the_trace_read_in_order() {
        let mut bytes = Vec::new();
        crate::snapshot::writer::write_snapshot(&many_entries(40_000), &mut bytes).unwrap();
        let (in_order, none) = read_on(&bytes, Threads::ONE);
        assert_eq!((in_order.device_traces[1].len(), none), (40_000, 0));
        for (threads, chunk_bytes) in [(2, 4 << 10), (3, 9_000), (8, 64 << 10)] {
            let (snap, stretches) = read_on(&bytes, Threads { threads, chunk_bytes, from: 0 });
            assert!(stretches > 20, "{threads} threads decoded {stretches} stretches");
            assert!(snap == in_order, "{threads} threads, {chunk_bytes}-byte stretches: not the snapshot read in order");
        }
    }

    /// A trace damaged anywhere reads on threads as it reads in order: the same snapshot,
    /// or an error too. (Where the damage shows, an error's detail, and at times its offset,
    /// depends on how much of the entry around it the path that met it had taken apart.)
    /// Some damage leaves the threads' work not fitting the main pass, which then reads
    /// again in order.
    #[test]
    fn a_damaged_trace_reads_on_threads_as_it_reads_in_order() {
        let mut bytes = Vec::new();
        crate::snapshot::writer::write_snapshot(&many_entries(3_000), &mut bytes).unwrap();
        let threads = Threads { threads: 3, chunk_bytes: 2_000, from: 0 };
        let (mut again, mut failed, mut rng) = (0, 0, 0x9e37_79b9_7f4a_7c15u64);
        for _ in 0..1_500 {
            // xorshift: a byte somewhere after the header, set to an opcode or to noise.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let mut damaged = bytes.clone();
            let at = 16 + (rng % (bytes.len() as u64 - 16)) as usize;
            damaged[at] = [op::MEMOIZE, op::BINGET, op::MARK, op::EMPTY_DICT, op::APPENDS, op::SETITEMS, (rng >> 32) as u8][(rng >> 40) as usize % 7];
            let in_order = read_or_fail_on(&damaged, Threads::ONE);
            let on_threads = read_or_fail_on(&damaged, threads);
            match (&on_threads, &in_order) {
                (Ok(t), Ok(o)) => {
                    again += t.2 as u32;
                    assert!(t.0 == o.0, "byte {at} set to {:#04x}: read on threads, not the snapshot read in order", damaged[at]);
                }
                (Err(_), Err(_)) => failed += 1,
                _ => panic!("byte {at} set to {:#04x}: on threads {:?}, in order {:?}", damaged[at], on_threads.err(), in_order.err()),
            }
        }
        assert!(failed > 100 && again > 0, "{failed} reads failed, {again} read again in order");
    }

    /// The real files: written by PyTorch's pickler, whose frames end inside entries.
    #[test]
    fn real_snapshots_read_on_threads_are_the_snapshots_read_in_order() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let Some(dir) = crate::fixtures::for_test(&root) else { return };
        for name in crate::fixtures::REAL_SNAPSHOTS {
            let bytes = std::fs::read(dir.join(format!("{name}.pickle"))).unwrap();
            let (in_order, _) = read_on(&bytes, Threads::ONE);
            let (snap, stretches) = read_on(&bytes, Threads { threads: 3, chunk_bytes: 1, from: 0 });
            assert!(stretches > 0, "{name}: no stretch on threads");
            assert!(snap == in_order, "{name}: read on threads, not the snapshot read in order");
        }
    }

    /// A key or a text read back from a memo index a PUT gave another value since: read as
    /// what it holds now (the fast path remembers those it met by index, and forgets at a
    /// PUT).
    #[test]
    fn a_memo_index_given_another_key_or_text_by_a_put_reads_as_the_new_one() {
        let s = |p: &mut Vec<u8>, t: &str| {
            p.extend([op::SHORT_BINUNICODE, t.len() as u8]);
            p.extend(t.as_bytes());
        };
        let int = |p: &mut Vec<u8>, v: i32| {
            p.push(op::BININT);
            p.extend(v.to_le_bytes());
        };
        let mut p = vec![op::PROTO, 4, op::EMPTY_DICT, op::MARK];
        s(&mut p, "segments");
        p.push(op::EMPTY_LIST);
        s(&mut p, "device_traces");
        p.extend([op::EMPTY_LIST, op::MARK, op::EMPTY_LIST, op::MARK]);
        // Memo: 0 "action", 1 "alloc", 2 "addr", 3 "size", 4 "compile_context", 5 "N/A".
        p.extend([op::EMPTY_DICT, op::MARK]);
        for t in ["action", "alloc"] {
            s(&mut p, t);
            p.push(op::MEMOIZE);
        }
        s(&mut p, "addr");
        p.push(op::MEMOIZE);
        int(&mut p, 0x1000);
        s(&mut p, "size");
        p.push(op::MEMOIZE);
        int(&mut p, 64);
        for t in ["compile_context", "N/A"] {
            s(&mut p, t);
            p.push(op::MEMOIZE);
        }
        p.push(op::SETITEMS);
        let entry = |p: &mut Vec<u8>, first: i32, second: i32| {
            p.extend([op::EMPTY_DICT, op::MARK, op::BINGET, 0, op::BINGET, 1, op::BINGET, 2]);
            int(p, first);
            p.extend([op::BINGET, 3]);
            int(p, second);
            p.extend([op::BINGET, 4, op::BINGET, 5, op::SETITEMS]);
        };
        entry(&mut p, 0x2000, 128);
        // Indices 2 and 3 swap their keys, and 5 holds another text.
        s(&mut p, "size");
        p.extend([op::BINPUT, 2, op::POP]);
        s(&mut p, "addr");
        p.extend([op::BINPUT, 3, op::POP]);
        s(&mut p, "X");
        p.extend([op::BINPUT, 5, op::POP]);
        entry(&mut p, 256, 0x3000);
        p.extend([op::APPENDS, op::APPENDS, op::SETITEMS, op::STOP]);
        let snap = read_snapshot(&p).unwrap();
        let got: Vec<(u64, u64, &str)> = snap.device_traces[0].iter().map(|e| (e.addr, e.size, e.compile_context.as_deref().unwrap_or("none"))).collect();
        assert_eq!(got, [(0x1000, 64, "N/A"), (0x2000, 128, "N/A"), (0x3000, 256, "X")]);
    }
}
