//! Snapshot reader/writer against real PyTorch snapshots, Python's own unpickler and
//! memory_viz's command line tools, plus hostile inputs.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

mod common;

use vramscope_core::snapshot::model::{
    Action, AllocatorSettings, Annotation, AnnotationStage, Block, BlockState, Frame, Segment,
    SegmentType, SettingValue, Snapshot, StackInterner, TraceEntry,
};
use vramscope_core::snapshot::{
    read_snapshot, read_snapshot_file, save_snapshot_atomic, unique_path, write_snapshot,
};

const FIXTURES: [&str; 3] = [
    "MAGMA27_assignment2-systems_memory_snapshot.pickle",
    "kkaitlyn111_cs336-a2-systems_memory_ctx128_forward.pickle",
    "SnapViewer_assets_memory.pickle",
];

use common::{fixture, python};

/// Counts computed by Python's own `pickle.load`: the independent check.
const PY_COUNTS: &str = r#"
import pickle, json, sys, collections
d = pickle.load(open(sys.argv[1], 'rb'))
blocks = [b for s in d['segments'] for b in s['blocks']]
traces = d['device_traces']
print(json.dumps({
    'segments': len(d['segments']),
    'blocks': len(blocks),
    'entries': [len(t) for t in traces],
    'active_bytes': sum(b['size'] for b in blocks if b['state'] != 'inactive'),
    'actions': collections.Counter(e['action'] for t in traces for e in t),
    'frame_refs': sum(len(e['frames']) for t in traces for e in t),
    'annotations': len(d.get('external_annotations', [])),
    'settings_keys': sorted((d.get('allocator_settings') or {}).keys()),
}))
"#;

#[derive(Debug, PartialEq, serde::Deserialize)]
struct Counts {
    segments: usize,
    blocks: usize,
    entries: Vec<usize>,
    active_bytes: u64,
    actions: BTreeMap<String, usize>,
    frame_refs: usize,
    annotations: usize,
    settings_keys: Vec<String>,
}

fn python_counts(file: &Path) -> Counts {
    common::python_json(PY_COUNTS, file)
}

fn rust_counts(s: &Snapshot) -> Counts {
    let blocks = s.segments.iter().flat_map(|g| &g.blocks);
    let mut actions = BTreeMap::new();
    for e in s.device_traces.iter().flatten() {
        *actions.entry(e.action.as_str().to_string()).or_insert(0) += 1;
    }
    let mut settings_keys: Vec<String> = s
        .allocator_settings
        .iter()
        .flat_map(|a| a.entries.iter().map(|(k, _)| k.clone()))
        .collect();
    settings_keys.sort();
    Counts {
        segments: s.segments.len(),
        blocks: s.block_count(),
        entries: s.device_traces.iter().map(Vec::len).collect(),
        active_bytes: blocks.filter(|b| b.state.is_active()).map(|b| b.size).sum(),
        actions,
        frame_refs: s
            .device_traces
            .iter()
            .flatten()
            .map(|e| s.stacks[e.frames as usize].len())
            .sum(),
        annotations: s.external_annotations.len(),
        settings_keys,
    }
}

fn written(s: &Snapshot) -> Vec<u8> {
    let mut out = Vec::new();
    write_snapshot(s, &mut out).expect("write");
    out
}

#[test]
fn fixtures_agree_with_python_pickle() {
    if common::skip_without_real_snapshots() {
        return;
    }
    for name in FIXTURES {
        let snap = read_snapshot_file(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ours = rust_counts(&snap);
        assert!(
            ours.segments > 0 && ours.entries.iter().sum::<usize>() > 0,
            "{name}: empty read"
        );
        assert_eq!(ours, python_counts(&fixture(name)), "{name}");
    }
}

#[test]
fn fixture_schema_variants() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let magma = read_snapshot_file(&fixture(FIXTURES[0])).unwrap();
    let e = &magma.device_traces[0][0];
    assert!(e.compile_context.is_some() && e.user_metadata.is_some());
    assert_eq!(
        magma
            .allocator_settings
            .as_ref()
            .unwrap()
            .get("max_split_size"),
        Some(&SettingValue::Int(-1))
    );
    let old = read_snapshot_file(&fixture(FIXTURES[1])).unwrap();
    assert!(old.device_traces[0]
        .iter()
        .all(|e| e.compile_context.is_none()));
    assert!(old.device_traces[0]
        .iter()
        .any(|e| e.action == Action::SegmentAlloc));
    let synthetic = read_snapshot_file(&fixture(FIXTURES[2])).unwrap();
    assert!(synthetic.allocator_settings.is_none());
    assert!(synthetic.segments.iter().any(|s| s.is_expandable));
    assert!(!synthetic.external_annotations.is_empty());
    // Frames shared through the memo become one interned frame.
    let mut frames = magma.frames.clone();
    frames.sort_by(|a, b| (&a.name, &a.filename, a.line).cmp(&(&b.name, &b.filename, b.line)));
    frames.dedup();
    assert_eq!(frames.len(), magma.frames.len());
}

#[test]
fn fixtures_round_trip() {
    if common::skip_without_real_snapshots() {
        return;
    }
    for name in FIXTURES {
        let snap = read_snapshot_file(&fixture(name)).unwrap();
        let again = read_snapshot(&written(&snap)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(again, snap, "{name}");
    }
}

/// A snapshot with everything the fixtures lack: oom, annotations, categories, unusual
/// settings values, several devices, addresses past 2^32.
fn synthetic() -> Snapshot {
    let mut s = Snapshot::default();
    let mut interner = StackInterner::default();
    let f = |name: &str, line| Frame {
        name: name.into(),
        filename: "/src/train.py".into(),
        line,
    };
    let f0 = interner.frame(&mut s, f("forward", 10));
    let f1 = interner.frame(&mut s, f("step", 99));
    let seg_stack = interner.stack(&mut s, vec![f0, f1]);
    let empty = interner.stack(&mut s, vec![]);
    let entry_stack = interner.stack(&mut s, vec![f1]);
    let base = 0x7f00_0000_0000u64;
    s.segments.push(Segment {
        device: 1,
        address: base,
        total_size: 2 << 20,
        allocated_size: 1 << 20,
        active_size: 1 << 20,
        requested_size: 1_000_000,
        stream: 0,
        segment_type: SegmentType::Large,
        segment_pool_id: (1, 7),
        is_expandable: true,
        frames: seg_stack,
        blocks: vec![
            Block {
                address: base,
                size: 1 << 20,
                requested_size: 1_000_000,
                state: BlockState::ActiveAllocated,
                frames: seg_stack,
            },
            Block {
                address: base + (1 << 20),
                size: 1 << 20,
                requested_size: 0,
                state: BlockState::Inactive,
                frames: empty,
            },
        ],
    });
    let entry = |action, addr, category: Option<&str>| TraceEntry {
        action,
        addr,
        size: 1_000_000,
        stream: 140_000_000_000,
        time_us: 1_759_252_584_402_607,
        frames: entry_stack,
        category: category.map(Into::into),
        compile_context: None,
        user_metadata: Some("step 3".into()),
    };
    s.device_traces = vec![
        vec![],
        vec![
            entry(Action::Alloc, base, Some("unknown")),
            entry(Action::FreeRequested, base, Some("activation")),
            entry(Action::FreeCompleted, base, None),
            entry(Action::Oom, 123_456_789, None),
        ],
    ];
    s.external_annotations = vec![
        Annotation {
            name: "forward".into(),
            stage: AnnotationStage::Start,
            device: 1,
            time_us: 5,
        },
        Annotation {
            name: "forward".into(),
            stage: AnnotationStage::End,
            device: 1,
            time_us: 9,
        },
    ];
    s.allocator_settings = Some(AllocatorSettings {
        entries: vec![
            (
                "PYTORCH_CUDA_ALLOC_CONF".into(),
                SettingValue::Str("expandable_segments:True".into()),
            ),
            ("max_split_size".into(), SettingValue::Int(-1)),
            (
                "garbage_collection_threshold".into(),
                SettingValue::Float(0.5),
            ),
            ("expandable_segments".into(), SettingValue::Bool(true)),
            ("unset".into(), SettingValue::None),
            (
                "roundup_power2_divisions".into(),
                SettingValue::Dict(vec![
                    ("1".into(), SettingValue::Int(4)),
                    ("2".into(), SettingValue::Int(0)),
                ]),
            ),
        ],
    });
    s
}

#[test]
fn synthetic_round_trip() {
    let s = synthetic();
    let again = read_snapshot(&written(&s)).unwrap();
    assert_eq!(again, s);
    assert_eq!(
        again.device_traces[1][3].addr, 123_456_789,
        "oom keeps device_free"
    );
}

#[test]
fn written_files_load_in_python_and_memory_viz() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let py = python();
    let dir = tempfile::tempdir().unwrap();
    let mut cases: Vec<(String, Snapshot)> = FIXTURES
        .iter()
        .map(|n| (n.to_string(), read_snapshot_file(&fixture(n)).unwrap()))
        .collect();
    cases.push(("synthetic.pickle".into(), synthetic()));
    for (name, snap) in &cases {
        let path = save_snapshot_atomic(snap, &dir.path().join(name)).unwrap();
        assert_eq!(python_counts(&path), rust_counts(snap), "{name}");
        for tool in ["stats", "trace"] {
            // The SnapViewer fixture's blocks do not add up to its segment sizes, so
            // `stats` rejects the original file as well.
            if tool == "stats" && name.starts_with("SnapViewer") {
                continue;
            }
            let out = Command::new(&py)
                .args(["-m", "torch.cuda._memory_viz", tool])
                .arg(&path)
                .current_dir(dir.path())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "memory_viz {tool} {name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                !out.stdout.is_empty(),
                "memory_viz {tool} {name} printed nothing"
            );
        }
    }
}

/// Opcodes of a written file as Python's pickletools sees them.
const PY_OPCODES: &str = r#"
import pickletools, sys, json
data = open(sys.argv[1], 'rb').read()
ops = sorted({op.name for op, arg, pos in pickletools.genops(data)})
proto = next(arg for op, arg, pos in pickletools.genops(data) if op.name == 'PROTO')
print(json.dumps({'ops': ops, 'proto': proto}))
"#;

const MEMORY_VIZ_OPCODES: [&str; 31] = [
    "PROTO",
    "FRAME",
    "STOP",
    "MARK",
    "APPEND",
    "APPENDS",
    "LIST",
    "TUPLE",
    "DICT",
    "SETITEM",
    "SETITEMS",
    "EMPTY_DICT",
    "EMPTY_LIST",
    "EMPTY_TUPLE",
    "TUPLE1",
    "TUPLE2",
    "TUPLE3",
    "NEWTRUE",
    "NEWFALSE",
    "NONE",
    "BININT",
    "BININT1",
    "BININT2",
    "LONG1",
    "BINFLOAT",
    "SHORT_BINUNICODE",
    "BINUNICODE",
    "BINGET",
    "LONG_BINGET",
    "BINPUT",
    "LONG_BINPUT",
];

#[test]
fn written_opcodes_are_memory_viz_compatible() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut big = read_snapshot_file(&fixture(FIXTURES[1])).unwrap();
    // Past the 1000-item batch and the 64 KiB frame size, and a 300-byte string.
    big.frames[0].name = "x".repeat(300);
    for s in [synthetic(), big] {
        let path = dir.path().join("w.pickle");
        std::fs::write(&path, written(&s)).unwrap();
        let v: serde_json::Value = common::python_json(PY_OPCODES, &path);
        assert_eq!(v["proto"], 4);
        for op in v["ops"].as_array().unwrap() {
            let op = op.as_str().unwrap();
            assert!(
                op == "MEMOIZE" || MEMORY_VIZ_OPCODES.contains(&op),
                "opcode {op} is not accepted by MemoryViz.js"
            );
        }
        std::fs::remove_file(&path).unwrap();
    }
}

fn err(bytes: &[u8]) -> String {
    match read_snapshot(bytes) {
        Ok(_) => panic!("accepted hostile input {:?}", &bytes[..bytes.len().min(32)]),
        Err(e) => e.to_string(),
    }
}

#[test]
fn rejects_code_and_objects() {
    // Python's own pickles of a set (protocol 2: GLOBAL + REDUCE) and of a class instance.
    {
        let py = python();
        for expr in [
            "pickle.dumps({1, 2}, 2)",
            "pickle.dumps(fractions.Fraction(1, 3), 4)",
        ] {
            let out = Command::new(&py)
                .args([
                    "-c",
                    &format!("import pickle, fractions, sys; sys.stdout.buffer.write({expr})"),
                ])
                .output()
                .unwrap();
            let msg = err(&out.stdout);
            assert!(
                msg.contains("GLOBAL") && msg.contains("snapshots are plain data"),
                "{msg}"
            );
        }
    }
    let msg = err(b"\x80\x02cos\nsystem\n(S'echo hi'\ntR.");
    assert_eq!(
        msg,
        "unsupported pickle opcode GLOBAL (0x63) at byte 2: snapshots are plain data"
    );
    let msg = err(b"\x80\x04\x8c\x02os\x8c\x06system\x93.");
    assert!(msg.contains("STACK_GLOBAL (0x93) at byte 14"), "{msg}");
    let msg = err(b"\x80\x04]R.");
    assert!(msg.contains("REDUCE (0x52) at byte 3"), "{msg}");
}

#[test]
fn rejects_malformed_input() {
    assert_eq!(err(b""), "not a pickle: the input is empty");
    assert!(err(b"{\"json\": 1}").starts_with("not a pickle: first byte 0x7b"));
    assert!(err(b"\x80\x09}.").contains("protocol 9"));
    // A 2 GiB string length with 3 bytes behind it: an error, not an allocation.
    let msg = err(b"\x80\x04X\xff\xff\xff\x7fabc.");
    assert!(
        msg.starts_with("truncated at byte 7: expected BINUNICODE text (2147483647 bytes, 4 left)"),
        "{msg}"
    );
    let msg = err(b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xff.");
    assert!(msg.starts_with("truncated at byte 11"), "{msg}");
    let msg = err(b"\x80\x04X\x01");
    assert!(
        msg.starts_with("truncated at byte 3: expected 4-byte length for BINUNICODE"),
        "{msg}"
    );
    let msg = err(b"\x80\x04\x8b\xff\xff\xff\x7f\x00.");
    assert!(msg.starts_with("truncated at byte 7"), "{msg}");
    assert!(err(b"\x80\x04]h\x05.").contains("memo index 5 out of range (memo has 0 entries)"));
    assert!(err(b"\x80\x04]\x94j\x00\x00\x01\x00.").contains("memo index 65536 out of range"));
    assert!(
        err(b"\x80\x04\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.")
            .contains("outside the 64-bit range")
    );
    assert!(err(b"\x80\x04}K\x01.").contains("STOP with 2 values"));
    assert!(err(b"\x80\x04e.").contains("needs a MARK"));
    assert!(err(b"\x80\x04K\x01K\x02a.").contains("expected a list"));
    assert!(err(b"\x80\x04}\x8c\x01a\x8c\x01bs.").contains("no `segments`"));
    // A bare list is a list of segments (what `torch.cuda.memory_snapshot()` returns).
    assert!(err(b"\x80\x04K\x01.").contains("the top-level value is an integer"));
    assert!(err(b"\x80\x04]K\x01a.").contains("element 0 of `segments` is an integer, not a segment"));
    assert!(err(b"\x80\x04\x8f.").contains("EMPTY_SET"));
    assert!(err(b"\x80\x05\x97.").contains("NEXT_BUFFER"));
    // A cycle: a list appended to itself, then used as the trace list.
    let msg = err(b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces]\x94h\x00au.");
    assert!(msg.contains("not a memory snapshot"), "{msg}");
}

#[test]
fn rejects_deep_nesting_without_overflow() {
    for (open, close) in [(&b"]"[..], &b"a"[..]), (b"](", b"e"), (b"", b"\x85")] {
        let mut p = b"\x80\x04".to_vec();
        p.extend(b"]".repeat(100_000 / 2 * (open.is_empty() as usize)));
        for _ in 0..100_000 {
            p.extend_from_slice(open);
        }
        if open.is_empty() {
            p.extend_from_slice(b"]");
        }
        for _ in 0..100_000 {
            p.extend_from_slice(close);
        }
        p.push(b'.');
        let msg = err(&p);
        assert!(msg.contains("nested deeper than"), "{msg}");
    }
}

#[test]
fn truncated_fixture_fails_cleanly_everywhere() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let bytes = std::fs::read(fixture(FIXTURES[2])).unwrap();
    let step = (bytes.len() / 3000).max(1);
    for cut in (0..bytes.len()).filter(|c| *c < 400 || c % step == 0) {
        let msg = err(&bytes[..cut]);
        assert!(
            msg.starts_with("truncated at byte") || cut == 0,
            "cut {cut}: {msg}"
        );
    }
}

#[test]
fn random_bytes_fail_cleanly() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let fixture_bytes = std::fs::read(fixture(FIXTURES[0])).unwrap();
    for i in 0..20_000 {
        let len = (next() % 200) as usize;
        let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if i % 2 == 0 {
            b.splice(0..0, [0x80, 4]);
        }
        if i % 4 == 1 {
            // Corrupt a real snapshot in a few places.
            b = fixture_bytes.clone();
            for _ in 0..4 {
                let at = (next() as usize) % b.len();
                b[at] = next() as u8;
            }
            let _ = read_snapshot(&b);
            continue;
        }
        let _ = err(&b);
    }
}

#[test]
fn atomic_save_refuses_overwrite_and_creates_dirs() {
    let dir = tempfile::tempdir().unwrap();
    let s = synthetic();
    let path = dir.path().join("a/b/run.pickle");
    assert_eq!(save_snapshot_atomic(&s, &path).unwrap(), path);
    assert_eq!(read_snapshot_file(&path).unwrap(), s);
    let e = save_snapshot_atomic(&s, &path).unwrap_err().to_string();
    assert_eq!(
        e,
        format!("refusing to overwrite existing file {}", path.display())
    );
    let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "temp file left behind");

    assert_eq!(
        unique_path(&dir.path().join("a/b"), "run.pickle"),
        dir.path().join("a/b/run-1.pickle")
    );
    save_snapshot_atomic(&s, &dir.path().join("a/b/run-1.pickle")).unwrap();
    assert_eq!(
        unique_path(&dir.path().join("a/b"), "run.pickle"),
        dir.path().join("a/b/run-2.pickle")
    );
    assert_eq!(unique_path(dir.path(), "fresh"), dir.path().join("fresh"));

    // A regular file where a directory should be: a clear error naming it.
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, b"x").unwrap();
    let e = save_snapshot_atomic(&s, &blocker.join("sub/run.pickle"))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(&format!(
            "cannot create directory {}",
            blocker.join("sub").display()
        )),
        "{e}"
    );
}

/// Trace entries in every shape the reader's fast path takes or leaves to the generic
/// decoder, written by Python with protocols 4 and 2; prints what Python reads back.
const PY_ENTRY_SHAPES: &str = r#"
import pickle, json, sys
out = sys.argv[1]
fr = [{'name': f'f{i}', 'filename': f'/src/m{i % 7}.py', 'line': i} for i in range(1500)]
shared = [fr[3], fr[4]]
empty = ''
trace = []
for i in range(3000):
    e = {'action': ['alloc', 'free_requested', 'free_completed', 'segment_alloc'][i % 4],
         'addr': 0x7f0000000000 + 512 * i, 'size': 512 + i, 'stream': 0, 'time_us': 1759252584402607 + i,
         'frames': fr[i % 40:i % 40 + 25]}
    k = i % 16
    if k == 0: e['frames'] = []
    elif k == 1: e['frames'] = [fr[i % 1500]]
    elif k == 2: e['frames'] = fr[:1200]
    elif k == 3: e['frames'] = shared
    elif k == 4: e['addr'] = 2**64 - 1 - i
    elif k == 5: e['stream'] = True
    elif k == 6: e['stream'] = -3; e['category'] = None
    elif k == 7: e['category'] = 'activation'; e['compile_context'] = empty; e['user_metadata'] = empty
    elif k == 8: e['extra'] = [1, 2]
    elif k == 9: e['user_metadata'] = 'ünï ' + str(i) * 100
    elif k == 10: e['frames'] = None
    elif k == 11: e = {'time_us': 5, 'frames': fr[::100], 'size': 2**40 + i, 'action': 'alloc', 'addr': i}
    # Frames written out in the entry (a rewritten snapshot), one of them twice.
    elif k == 12: e['frames'] = [dict(f) for f in fr[i % 40:i % 40 + 25]]
    elif k == 13: d = dict(fr[i % 1500]); e['frames'] = [d, dict(fr[7]), d]; e['pool_id'] = (1, i % 3)
    elif k == 14: e['frames'] = [dict(fr[3], fx_node_op='call_function', fx_node_name='mm')]
    elif k == 15: e['pool_id'] = [2, 5]
    trace.append(e)
snap = {'segments': [], 'device_traces': [trace, trace[:0]]}
for proto, path in ((4, out), (2, out + '.p2')):
    with open(path, 'wb') as f:
        pickle.dump(snap, f, protocol=proto)
def row(e):
    return [e['action'], e['addr'], e['size'], int(e.get('stream', 0)), e['time_us'],
            [[f['name'], f['filename'], f['line']] for f in (e['frames'] or [])],
            e.get('category'), e.get('compile_context'), e.get('user_metadata'), list(e.get('pool_id', (0, 0)))]
print(json.dumps([[row(e) for e in t] for t in snap['device_traces']]))
"#;

#[test]
fn every_trace_entry_shape_reads_as_python_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shapes.pickle");
    let expected: serde_json::Value = common::python_json(PY_ENTRY_SHAPES, &path);
    for file in [path.clone(), dir.path().join("shapes.pickle.p2")] {
        let snap = read_snapshot_file(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let ours: Vec<Vec<serde_json::Value>> = snap
            .device_traces
            .iter()
            .enumerate()
            .map(|(d, t)| {
                t.iter()
                    .enumerate()
                    .map(|(i, e)| {
                        let frames: Vec<_> = snap.stack(e.frames).map(|f| serde_json::json!([f.name, f.filename, f.line])).collect();
                        let pool = snap.entry_pool(d, i);
                        serde_json::json!([e.action.as_str(), e.addr, e.size, e.stream, e.time_us, frames, e.category, e.compile_context, e.user_metadata, [pool.0, pool.1]])
                    })
                    .collect()
            })
            .collect();
        assert_eq!(serde_json::json!(ours), expected, "{}", file.display());
    }
}
