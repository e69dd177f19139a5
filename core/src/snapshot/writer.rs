//! Writes snapshots as pickles that both Python's `pickle.load` and memory_viz
//! (MemoryViz.js) read: protocol 4 framing, and only the opcodes MemoryViz.js accepts
//! (see DESIGN.md §2). Frame dicts, stacks and strings are written once and memoized;
//! later uses are BINGETs, which keeps files about as small as PyTorch's own.

use std::collections::HashMap;
use std::os::unix::fs::OpenOptionsExt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::model::{
    AnnotationStage, Block, FrameId, Segment, SettingValue, Snapshot, StackId, TraceEntry,
    HOST_TRACE,
};
use super::reader::op;

/// Frames are cut at this size, as Python's pickler does.
const FRAME_TARGET: usize = 64 * 1024;
/// Python's pickler batches APPENDS/SETITEMS by 1000; readers expect no more per MARK.
const BATCH: usize = 1000;

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("refusing to overwrite existing file {0}")]
    Exists(PathBuf),
    // The io errors are part of the messages, not `source`s, so chains print them once.
    #[error("cannot create directory {path}: {err}")]
    CreateDir { path: PathBuf, err: io::Error },
    #[error("cannot write {path}: {err}")]
    Io { path: PathBuf, err: io::Error },
}

/// Serialize `snap` as a memory_viz-compatible pickle.
pub fn write_snapshot(snap: &Snapshot, out: &mut impl Write) -> io::Result<()> {
    let mut p = Pickler {
        out,
        buf: Vec::with_capacity(FRAME_TARGET + 4096),
        memo_len: 0,
        strings: HashMap::new(),
        frame_memo: vec![None; snap.frames.len()],
        stack_memo: vec![None; snap.stacks.len()],
        snap,
    };
    p.out.write_all(&[op::PROTO, 4])?;
    p.snapshot()?;
    p.buf.push(op::STOP);
    p.flush_frame()
}

/// Write `snap` to `path` atomically: a temp file in the same directory, fsync, then a
/// no-overwrite link into place. Creates missing parent directories. Returns `path`.
pub fn save_snapshot_atomic(snap: &Snapshot, path: &Path) -> Result<PathBuf, WriteError> {
    save_atomic(path, |w| write_snapshot(snap, w))
}

/// Writes what `write` produces to `path` atomically, never overwriting: a temp file in the
/// same directory, fsync, then a no-overwrite link into place. Creates missing parent
/// directories. Returns `path`.
pub fn save_atomic(
    path: &Path,
    write: impl FnOnce(&mut io::BufWriter<File>) -> io::Result<()>,
) -> Result<PathBuf, WriteError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&dir).map_err(|err| WriteError::CreateDir {
        path: dir.clone(),
        err,
    })?;
    if path.exists() {
        return Err(WriteError::Exists(path.to_path_buf()));
    }
    let io_err = |err| WriteError::Io {
        path: path.to_path_buf(),
        err,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (tmp, file) = create_temp(&dir, &name).map_err(io_err)?;
    let result = (|| {
        let mut w = io::BufWriter::with_capacity(1 << 20, file);
        write(&mut w)?;
        let file = w.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        // hard_link fails if `path` appeared meanwhile: never overwrites. Filesystems
        // without hard links get a rename after a fresh existence check.
        match fs::hard_link(&tmp, path) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists && !path.exists() => {
                fs::rename(&tmp, path)
            }
            r => r,
        }
    })();
    let _ = fs::remove_file(&tmp);
    match result {
        Ok(()) => {
            // Make the new directory entry durable; some filesystems refuse to open a
            // directory for syncing, which does not undo the write.
            if let Ok(d) = File::open(&dir) {
                let _ = d.sync_all();
            }
            Ok(path.to_path_buf())
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            Err(WriteError::Exists(path.to_path_buf()))
        }
        Err(e) => Err(io_err(e)),
    }
}

/// Checks before a run that files can be written in `dir`, by making it (as a save would)
/// and a file in it, then taking away what the check made: a run that would train for
/// hours and then fail to save its snapshot fails now instead.
pub fn check_writable_dir(dir: &Path) -> Result<(), WriteError> {
    let missing: Vec<PathBuf> = dir.ancestors().take_while(|a| !a.as_os_str().is_empty() && !a.exists()).map(Path::to_path_buf).collect();
    fs::create_dir_all(dir).map_err(|err| WriteError::CreateDir { path: dir.to_path_buf(), err })?;
    let probe = create_temp(dir, "write-check");
    if let Ok((tmp, _)) = &probe {
        let _ = fs::remove_file(tmp);
    }
    // Innermost first: each is empty once the one inside it is gone.
    for d in &missing {
        let _ = fs::remove_dir(d);
    }
    probe.map(drop).map_err(|err| WriteError::Io { path: dir.to_path_buf(), err })
}

fn create_temp(dir: &Path, name: &str) -> io::Result<(PathBuf, File)> {
    let pid = std::process::id();
    let mut n = 0u32;
    loop {
        let tmp = dir.join(format!(".{name}.{pid}.{n}.tmp"));
        // Its owner's alone: a snapshot holds the job's file paths and call stacks.
        match OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
            Err(e) => return Err(e),
        }
    }
}

/// `dir/stem` if free, else `dir/stem-1`, `dir/stem-2`, ... The suffix goes before the
/// extension: `run.pickle` → `run-1.pickle`.
pub fn unique_path(dir: &Path, stem: &str) -> PathBuf {
    let first = dir.join(stem);
    if !first.exists() {
        return first;
    }
    let (base, ext) = match stem.rfind('.') {
        Some(i) if i > 0 => (&stem[..i], &stem[i..]),
        _ => (stem, ""),
    };
    (1u64..)
        .map(|i| dir.join(format!("{base}-{i}{ext}")))
        .find(|p| !p.exists())
        .unwrap_or(first)
}

struct Pickler<'s, W: Write> {
    out: &'s mut W,
    /// The current frame's bytes; ops are appended whole so frames never split one.
    buf: Vec<u8>,
    memo_len: u32,
    strings: HashMap<&'s str, u32>,
    frame_memo: Vec<Option<u32>>,
    stack_memo: Vec<Option<u32>>,
    snap: &'s Snapshot,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

impl<'s, W: Write> Pickler<'s, W> {
    fn flush_frame(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.out.write_all(&[op::FRAME])?;
        self.out.write_all(&(self.buf.len() as u64).to_le_bytes())?;
        self.out.write_all(&self.buf)?;
        self.buf.clear();
        Ok(())
    }

    /// Called between records: closes the frame once it is big enough.
    fn boundary(&mut self) -> io::Result<()> {
        if self.buf.len() >= FRAME_TARGET {
            self.flush_frame()?;
        }
        Ok(())
    }

    fn memoize(&mut self) -> u32 {
        self.buf.push(op::MEMOIZE);
        self.memo_len += 1;
        self.memo_len - 1
    }

    fn get(&mut self, idx: u32) {
        match u8::try_from(idx) {
            Ok(i) => self.buf.extend_from_slice(&[op::BINGET, i]),
            Err(_) => {
                self.buf.push(op::LONG_BINGET);
                self.buf.extend_from_slice(&idx.to_le_bytes());
            }
        }
    }

    fn int(&mut self, v: i64) {
        if (0..=0xff).contains(&v) {
            self.buf.extend_from_slice(&[op::BININT1, v as u8]);
        } else if (0..=0xffff).contains(&v) {
            self.buf.push(op::BININT2);
            self.buf.extend_from_slice(&(v as u16).to_le_bytes());
        } else if let Ok(v) = i32::try_from(v) {
            self.buf.push(op::BININT);
            self.buf.extend_from_slice(&v.to_le_bytes());
        } else {
            self.long1(&v.to_le_bytes(), v < 0);
        }
    }

    fn uint(&mut self, v: u64) {
        match i64::try_from(v) {
            Ok(v) => self.int(v),
            // Past i64::MAX: nine bytes, the last zero, keep it positive.
            Err(_) => {
                let mut b = [0u8; 9];
                b[..8].copy_from_slice(&v.to_le_bytes());
                self.long1(&b, false);
            }
        }
    }

    /// LONG1 with the shortest two's complement form of `le` (LONG4 is not in
    /// MemoryViz.js's opcode list).
    fn long1(&mut self, le: &[u8], negative: bool) {
        let fill = if negative { 0xff } else { 0 };
        let mut n = le.len();
        while n > 1 && le[n - 1] == fill && (le[n - 2] & 0x80 != 0) == negative {
            n -= 1;
        }
        self.buf.extend_from_slice(&[op::LONG1, n as u8]);
        self.buf.extend_from_slice(&le[..n]);
    }

    fn str(&mut self, s: &'s str) -> io::Result<()> {
        if let Some(&idx) = self.strings.get(s) {
            self.get(idx);
            return Ok(());
        }
        match u8::try_from(s.len()) {
            Ok(n) => self.buf.extend_from_slice(&[op::SHORT_BINUNICODE, n]),
            Err(_) => {
                let n = u32::try_from(s.len())
                    .map_err(|_| invalid(format!("string of {} bytes is too long", s.len())))?;
                self.buf.push(op::BINUNICODE);
                self.buf.extend_from_slice(&n.to_le_bytes());
            }
        }
        self.buf.extend_from_slice(s.as_bytes());
        let idx = self.memoize();
        self.strings.insert(s, idx);
        Ok(())
    }

    fn bool(&mut self, b: bool) {
        self.buf.push(if b { op::NEWTRUE } else { op::NEWFALSE });
    }

    /// `EMPTY_DICT MARK`; `end_dict` closes with SETITEMS. Our dicts stay under BATCH keys.
    fn begin_dict(&mut self) {
        self.buf.extend_from_slice(&[op::EMPTY_DICT, op::MARK]);
    }

    fn end_dict(&mut self) {
        self.buf.push(op::SETITEMS);
    }

    /// A list of `items` written by `each`.
    fn list<T>(
        &mut self,
        items: &'s [T],
        each: impl FnMut(&mut Self, &'s T) -> io::Result<()>,
    ) -> io::Result<()> {
        self.buf.push(op::EMPTY_LIST);
        self.append_all(items, each)
    }

    /// Appends `items` to the list on top of the stack, at most BATCH per MARK.
    fn append_all<T>(
        &mut self,
        items: &'s [T],
        mut each: impl FnMut(&mut Self, &'s T) -> io::Result<()>,
    ) -> io::Result<()> {
        for chunk in items.chunks(BATCH) {
            if chunk.len() > 1 {
                self.buf.push(op::MARK);
            }
            for item in chunk {
                each(self, item)?;
                self.boundary()?;
            }
            self.buf.push(if chunk.len() > 1 {
                op::APPENDS
            } else {
                op::APPEND
            });
        }
        Ok(())
    }

    fn frame(&mut self, id: FrameId) -> io::Result<()> {
        let slot = self.frame_memo.get(id as usize).ok_or_else(|| {
            invalid(format!(
                "stack refers to frame {id}, the snapshot has {}",
                self.snap.frames.len()
            ))
        })?;
        if let Some(idx) = *slot {
            self.get(idx);
            return Ok(());
        }
        let f = &self.snap.frames[id as usize];
        self.buf.push(op::EMPTY_DICT);
        let idx = self.memoize();
        self.frame_memo[id as usize] = Some(idx);
        self.buf.push(op::MARK);
        self.str("name")?;
        self.str(&f.name)?;
        self.str("filename")?;
        self.str(&f.filename)?;
        self.str("line")?;
        self.int(f.line);
        for (k, v) in self.snap.frame_fx(id) {
            self.str(k)?;
            self.str(v)?;
        }
        self.end_dict();
        Ok(())
    }

    fn stack(&mut self, id: StackId) -> io::Result<()> {
        let slot = self.stack_memo.get(id as usize).ok_or_else(|| {
            invalid(format!(
                "record refers to stack {id}, the snapshot has {}",
                self.snap.stacks.len()
            ))
        })?;
        if let Some(idx) = *slot {
            self.get(idx);
            return Ok(());
        }
        self.buf.push(op::EMPTY_LIST);
        let idx = self.memoize();
        self.stack_memo[id as usize] = Some(idx);
        self.append_all(&self.snap.stacks[id as usize], |p, &f| p.frame(f))
    }

    fn snapshot(&mut self) -> io::Result<()> {
        let snap = self.snap;
        self.begin_dict();
        self.str("segments")?;
        self.list(&snap.segments, Self::segment)?;
        self.str("device_traces")?;
        let mut device = 0;
        self.list(&snap.device_traces, |p, trace| {
            device += 1;
            p.trace(trace, device - 1)
        })?;
        if !snap.host_segments.is_empty() || !snap.host_trace.is_empty() {
            self.str("host_segments")?;
            self.list(&snap.host_segments, Self::segment)?;
            self.str("host_traces")?;
            self.buf.push(op::EMPTY_LIST);
            self.trace(&snap.host_trace, HOST_TRACE)?;
            self.buf.push(op::APPEND);
        }
        if let Some(settings) = &snap.allocator_settings {
            self.str("allocator_settings")?;
            self.setting_dict(&settings.entries)?;
        }
        self.str("external_annotations")?;
        self.list(&snap.external_annotations, |p, a| {
            p.begin_dict();
            p.str("name")?;
            p.str(&a.name)?;
            p.str("stage")?;
            p.str(match a.stage {
                AnnotationStage::Start => "START",
                AnnotationStage::End => "END",
            })?;
            p.str("device")?;
            p.int(a.device);
            p.str("time_us")?;
            p.int(a.time_us);
            p.end_dict();
            Ok(())
        })?;
        self.end_dict();
        Ok(())
    }

    fn segment(&mut self, s: &'s Segment) -> io::Result<()> {
        self.begin_dict();
        self.str("device")?;
        self.int(s.device);
        self.str("address")?;
        self.uint(s.address);
        self.str("total_size")?;
        self.uint(s.total_size);
        self.str("allocated_size")?;
        self.uint(s.allocated_size);
        self.str("active_size")?;
        self.uint(s.active_size);
        self.str("requested_size")?;
        self.uint(s.requested_size);
        self.str("stream")?;
        self.int(s.stream);
        self.str("segment_type")?;
        self.str(s.segment_type.as_str())?;
        self.str("segment_pool_id")?;
        self.int(s.segment_pool_id.0);
        self.int(s.segment_pool_id.1);
        self.buf.push(op::TUPLE2);
        self.str("is_expandable")?;
        self.bool(s.is_expandable);
        self.str("frames")?;
        self.stack(s.frames)?;
        self.str("blocks")?;
        self.list(&s.blocks, Self::block)?;
        self.end_dict();
        Ok(())
    }

    fn block(&mut self, b: &'s Block) -> io::Result<()> {
        self.begin_dict();
        self.str("address")?;
        self.uint(b.address);
        self.str("size")?;
        self.uint(b.size);
        self.str("requested_size")?;
        self.uint(b.requested_size);
        self.str("state")?;
        self.str(b.state.as_str())?;
        self.str("frames")?;
        self.stack(b.frames)?;
        if let Some(forward) = self.snap.forward_frames(b.address) {
            self.str("forward_frames")?;
            self.stack(forward)?;
        }
        self.end_dict();
        Ok(())
    }

    /// One trace (`trace` is its `Details` key); each entry says its pool when the
    /// trace has any besides (0, 0).
    fn trace(&mut self, entries: &'s [TraceEntry], trace: u32) -> io::Result<()> {
        let mut runs = self.snap.details.pools.iter().filter(|r| r.trace == trace).peekable();
        let pooled = runs.peek().is_some();
        let (mut i, mut pool) = (0, (0, 0));
        self.list(entries, |p, e| {
            if let Some(r) = runs.next_if(|r| r.from as usize <= i) {
                pool = r.pool;
            }
            i += 1;
            p.entry(e, pooled.then_some(pool))
        })
    }

    fn entry(&mut self, e: &'s TraceEntry, pool: Option<(i64, i64)>) -> io::Result<()> {
        self.begin_dict();
        self.str("action")?;
        self.str(e.action.as_str())?;
        self.str(if e.action == super::model::Action::Oom {
            "device_free"
        } else {
            "addr"
        })?;
        self.uint(e.addr);
        self.str("size")?;
        self.uint(e.size);
        self.str("stream")?;
        self.int(e.stream);
        self.str("time_us")?;
        self.int(e.time_us);
        for (key, v) in [
            ("category", e.category.as_deref()),
            ("compile_context", e.compile_context.as_deref()),
            ("user_metadata", e.user_metadata.as_deref()),
        ] {
            if let Some(v) = v {
                self.str(key)?;
                self.str(v)?;
            }
        }
        if let Some((a, b)) = pool {
            self.str("pool_id")?;
            self.int(a);
            self.int(b);
            self.buf.push(op::TUPLE2);
        }
        self.str("frames")?;
        self.stack(e.frames)?;
        self.end_dict();
        Ok(())
    }

    fn setting_dict(&mut self, entries: &'s [(String, SettingValue)]) -> io::Result<()> {
        self.buf.push(op::EMPTY_DICT);
        for chunk in entries.chunks(BATCH) {
            self.buf.push(op::MARK);
            for (k, v) in chunk {
                self.str(k)?;
                self.setting(v)?;
            }
            self.buf.push(op::SETITEMS);
        }
        Ok(())
    }

    fn setting(&mut self, v: &'s SettingValue) -> io::Result<()> {
        match v {
            SettingValue::None => self.buf.push(op::NONE),
            SettingValue::Bool(b) => self.bool(*b),
            SettingValue::Int(i) => self.int(*i),
            SettingValue::Float(f) => {
                self.buf.push(op::BINFLOAT);
                self.buf.extend_from_slice(&f.to_be_bytes());
            }
            SettingValue::Str(s) => self.str(s)?,
            SettingValue::Dict(entries) => self.setting_dict(entries)?,
        }
        Ok(())
    }
}
