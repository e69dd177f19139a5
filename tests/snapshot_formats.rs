//! Every form of snapshot the reader takes, written by Python the way each PyTorch
//! version writes it: what newer PyTorch adds (protocol 5, `pool_id`, `forward_frames`,
//! FX frame keys, host memory, `annotate` entries, keys not known yet), the forms
//! `_memory_viz` still reads (a bare segment list, PyTorch 2.0's `history` blocks, traces
//! of only `snapshot` and `oom` entries), and messages for files that really are malformed.

mod common;

use std::path::{Path, PathBuf};

use common::vramscope;
use vramscope_core::report::frame_rules::FrameRules;
use vramscope_core::report::snapshot_summary::allocation_info;
use vramscope_core::snapshot::model::{BlockState, HOST_TRACE};
use vramscope_core::snapshot::timeline::Timeline;
use vramscope_core::snapshot::{read_snapshot, read_snapshot_file, write_snapshot};

/// A snapshot as PyTorch 2.13 / main writes it, with every newer key, pickled with
/// protocol 5 (Python 3.14's default). Device 0's trace is a wrapped ring: it starts with
/// the free of a block allocated before it, has a request and completion kept apart by
/// `annotate` entries, and a completion with no request (`skip_actions`). Prints what
/// Python reads back.
const NEWER: &str = r#"
import json, pickle, sys
out = sys.argv[1]
def fr(i, fx=False):
    f = {'name': f'fn{i}', 'filename': f'/src/mod{i % 5}.py', 'line': 10 + i}
    if fx:
        f.update({'fx_node_op': 'call_function', 'fx_node_name': f'linear_{i}', 'fx_node_target': 'aten.mm',
                  'fx_original_trace': f'File "model.py", line {i}, in forward'})
    return f
frames = [fr(i, fx=(i % 4 == 0)) for i in range(12)]
base, MB = 0x7f0000000000, 1 << 20
def block(addr, size, req, state, stack, fwd=None):
    b = {'address': addr, 'size': size, 'requested_size': req, 'state': state, 'frames': stack}
    if fwd is not None:
        b['forward_frames'] = fwd
    return b
def segment(device, addr, total, stream, kind, pool, blocks):
    alloc = sum(b['size'] for b in blocks if b['state'] == 'active_allocated')
    return {'device': device, 'address': addr, 'total_size': total, 'allocated_size': alloc,
            'active_size': sum(b['size'] for b in blocks if b['state'] != 'inactive'),
            'requested_size': sum(b['requested_size'] for b in blocks if b['state'] != 'inactive'),
            'stream': stream, 'segment_type': kind, 'segment_pool_id': pool, 'is_expandable': False,
            'frames': frames[:3], 'blocks': blocks}
segments = [
    segment(0, base, 8 * MB, 0, 'large', (0, 0),
            [block(base, 2 * MB, 2 * MB - 100, 'active_allocated', frames[1:4], fwd=frames[5:7]),
             block(base + 2 * MB, 3 * MB, 3 * MB, 'active_allocated', frames[2:5]),
             block(base + 5 * MB, 1 * MB, 1 * MB, 'active_awaiting_free', frames[3:5]),
             block(base + 6 * MB, 2 * MB, 0, 'inactive', [])]),
    segment(0, base + 64 * MB, 2 * MB, 7, 'small', (1, 3),
            [block(base + 64 * MB, 512, 500, 'active_allocated', frames[:2]),
             block(base + 64 * MB + 512, 512, 512, 'active_pending_free', []),
             block(base + 64 * MB + 1024, 2 * MB - 1024, 0, 'inactive', [])]),
]
t = [1759252584402607]
def entry(action, addr, size, stack, **kw):
    t[0] += 5
    e = {'action': action, 'addr': addr, 'size': size, 'stream': 0, 'time_us': t[0], 'frames': stack,
         'compile_context': 'N/A', 'user_metadata': '', 'pool_id': (0, 0)}
    e.update(kw)
    return e
oom = entry('oom', 0, 40 * MB, frames[1:3], device_free=123456)
del oom['addr']
trace = [
    entry('free_requested', base + 70 * MB, 4 * MB, frames[6:9]),
    entry('free_completed', base + 70 * MB, 4 * MB, frames[6:9]),
    entry('segment_free', base + 70 * MB, 4 * MB, []),
    entry('alloc', base + 2 * MB, 3 * MB, frames[2:5], user_metadata='{"step": 3}',
          compile_context='Torch-Compiled Region: 0/1'),
    {'action': 'annotate', 'time_us': t[0], 'name': 'marker', 'stage': 'START'},
    entry('segment_alloc', base + 10 * MB, 6 * MB, [], pool_id=(1, 3)),
    entry('alloc', base + 10 * MB, 6 * MB, frames[4:8], pool_id=(1, 3), internal_metadata={'k': 1}),
    entry('free_requested', base + 10 * MB, 6 * MB, frames[4:8], pool_id=(1, 3)),
    {'action': 'annotate', 'time_us': t[0]},
    entry('free_completed', base + 10 * MB, 6 * MB, frames[4:8], pool_id=(1, 3)),
    entry('segment_free', base + 10 * MB, 6 * MB, [], pool_id=(1, 3)),
    entry('segment_alloc', base + 64 * MB, 2 * MB, [], pool_id=(1, 3)),
    entry('alloc', base + 64 * MB, 500, frames[:2], pool_id=(1, 3)),
    entry('free_completed', base + 90 * MB, 1 * MB, frames[9:11]),
    entry('segment_free', base + 90 * MB, 2 * MB, []),
    entry('snapshot', 0, 0, []),
    oom,
]
host_segments = [segment(-1, 0x10000, 4096, 0, 'small', (0, 0),
                         [block(0x10000, 1024, 1000, 'active_allocated', frames[10:12]),
                          block(0x10400, 3072, 0, 'inactive', [])])]
host_traces = [[entry('alloc', 0x10000, 1000, frames[10:12]), entry('alloc', 0x20000, 64, []),
                entry('free_completed', 0x20000, 64, [])]]
snap = {'segments': segments, 'device_traces': [trace, []],
        'allocator_settings': {'PYTORCH_CUDA_ALLOC_CONF': 'expandable_segments:True', 'max_split_size': -1,
                               'garbage_collection_threshold': 0.0, 'expandable_segments': True,
                               'roundup_power2_divisions': {'1': 0, '2': 0}},
        'external_annotations': [{'name': 'forward', 'stage': 'START', 'device': 0, 'time_us': t[0] - 40, 'extra': 1},
                                 {'name': 'forward', 'stage': 'END', 'device': 0, 'time_us': t[0]}],
        'host_segments': host_segments, 'host_traces': host_traces}
with open(out, 'wb') as f:
    pickle.dump(snap, f, protocol=5)
known = [e for e in trace if e['action'] != 'annotate']
print(json.dumps({
    'entries': len(known),
    'annotate': len(trace) - len(known),
    'pools': [list(e['pool_id']) for e in known],
    'host_entries': len(host_traces[0]),
    'oom_device_free': oom['device_free'],
}))
"#;

#[derive(serde::Deserialize)]
struct Newer {
    entries: usize,
    annotate: u64,
    pools: Vec<(i64, i64)>,
    host_entries: usize,
    oom_device_free: u64,
}

fn newer_file(dir: &Path) -> (PathBuf, Newer) {
    let path = dir.join("newer.pickle");
    let want: Newer = common::python_json(NEWER, &path);
    (path, want)
}

#[test]
fn a_protocol_5_file_with_every_newer_key_reads_and_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let (path, want) = newer_file(dir.path());
    assert_eq!(std::fs::read(&path).unwrap()[..2], [0x80, 5], "Python wrote protocol 5");
    let snap = read_snapshot_file(&path).unwrap();

    // Unknown actions and keys are left out and counted, never fatal.
    let trace = &snap.device_traces[0];
    assert_eq!(trace.len(), want.entries);
    assert_eq!(snap.skipped.actions.get("annotate"), Some(&want.annotate));
    assert_eq!(snap.skipped.keys.get("trace entry.internal_metadata"), Some(&1));
    assert_eq!(snap.skipped.keys.get("annotation.extra"), Some(&1));
    assert!(snap.skipped.describe().unwrap().contains("annotate ×2"));

    // pool_id per entry, device_free on the oom, both block states that await a free.
    let pools: Vec<(i64, i64)> = (0..trace.len()).map(|i| snap.entry_pool(0, i)).collect();
    assert_eq!(pools, want.pools);
    assert_eq!(trace.last().unwrap().addr, want.oom_device_free);
    let states: Vec<BlockState> = snap.segments.iter().flat_map(|s| s.blocks.iter().map(|b| b.state)).collect();
    assert_eq!(states.iter().filter(|s| **s == BlockState::ActivePendingFree).count(), 2);

    // Host memory is a device of its own, after the CUDA ones.
    assert_eq!((snap.cuda_devices(), snap.host_device(), snap.device_count()), (2, Some(2), 3));
    assert_eq!(snap.device_name(2), "host");
    assert_eq!(snap.trace(2).len(), want.host_entries);
    assert_eq!(snap.trace_key(2), HOST_TRACE);

    // The inspector's figures: compile context, user metadata, pool, FX nodes, forward frames.
    let tl = Timeline::from_snapshot(&snap, 0);
    let info = |addr: u64| {
        let id = tl.allocations.iter().position(|a| a.addr == addr && !a.alive_at_start).unwrap();
        allocation_info(&snap, &tl, 0, id as u32, false)
    };
    let base = 0x7f00_0000_0000u64;
    let a = info(base + (2 << 20));
    assert_eq!(a.compile_context.as_deref(), Some("Torch-Compiled Region: 0/1"));
    assert_eq!(a.user_metadata.as_deref(), Some("{\"step\": 3}"));
    assert_eq!(a.pool, None);
    assert_eq!(a.frames[2].fx.as_deref(), Some("call_function linear_4 (aten.mm)"));
    assert_eq!(info(base + (10 << 20)).pool, Some((1, 3)));
    let alive = tl.allocations.iter().position(|a| a.addr == base).unwrap();
    let fwd = allocation_info(&snap, &tl, 0, alive as u32, false).forward_frames;
    assert_eq!(fwd.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["fn5", "fn6"]);

    // Written back: the same snapshot, and Python finds the keys again.
    let mut bytes = Vec::new();
    write_snapshot(&snap, &mut bytes).unwrap();
    let mut again = read_snapshot(&bytes).unwrap();
    assert!(again.skipped.is_empty());
    again.skipped = snap.skipped.clone();
    assert_eq!(again, snap);
    let written = dir.path().join("written.pickle");
    std::fs::write(&written, &bytes).unwrap();
    let keys: serde_json::Value = common::python_json(
        r#"
import json, pickle, sys
d = pickle.load(open(sys.argv[1], 'rb'))
t = d['device_traces'][0]
print(json.dumps({
    'pool_ids': sorted({tuple(e['pool_id']) for e in t}),
    'forward_frames': sum('forward_frames' in b for s in d['segments'] for b in s['blocks']),
    'fx': sorted({k for e in t for f in e['frames'] for k in f if k.startswith('fx_')}),
    'host': [len(d['host_segments']), len(d['host_traces'][0])],
}))
"#,
        &written,
    );
    assert_eq!(keys["pool_ids"], serde_json::json!([[0, 0], [1, 3]]));
    assert_eq!(keys["forward_frames"], 1);
    assert_eq!(keys["fx"], serde_json::json!(["fx_node_name", "fx_node_op", "fx_node_target", "fx_original_trace"]));
    assert_eq!(keys["host"], serde_json::json!([1, 3]));
}

#[test]
fn its_timeline_is_memory_viz_s_with_the_unknown_action_in_the_trace() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = newer_file(dir.path());
    let want = common::MemoryVizTimeline::of(&path, 0);
    let tl = Timeline::from_snapshot(&read_snapshot_file(&path).unwrap(), 0);
    let got: Vec<u64> = (0..tl.total_events).map(|i| tl.totals_at(i)).collect();
    assert_eq!(got, want.during);
    assert_eq!(tl.peak_bytes, want.peak());
    assert_eq!(tl.allocations.len(), want.elements);
    assert_eq!(tl.allocations.iter().filter(|a| a.alive_at_start).count(), want.initial);
}

/// The forms `python -m torch.cuda._memory_viz` reads besides today's dict, written as
/// those PyTorch versions wrote them. Prints, per file, the bytes allocated on the device
/// that holds data.
const LEGACY: &str = r#"
import json, pickle, sys, os
out = sys.argv[1]
frames = [{'filename': f'/work/train.py', 'name': f'step{i}', 'line': i} for i in range(4)]
MB = 1 << 20
def modern_segment(device, addr, sizes):
    blocks, a = [], addr
    for size, state in sizes:
        blocks.append({'address': a, 'size': size, 'requested_size': size - 256 if state != 'inactive' else 0,
                       'state': state, 'frames': frames[:2]})
        a += size
    return {'device': device, 'address': addr, 'total_size': a - addr,
            'allocated_size': sum(s for s, st in sizes if st == 'active_allocated'),
            'active_size': sum(s for s, st in sizes if st != 'inactive'),
            'requested_size': sum(b['requested_size'] for b in blocks), 'stream': 0, 'segment_type': 'large',
            'segment_pool_id': (0, 0), 'is_expandable': False, 'frames': [], 'blocks': blocks}
# torch.cuda.memory_snapshot(): the bare list of segments, here of a run on cuda:1.
bare = [modern_segment(1, 0x7f0000000000, [(2 * MB, 'active_allocated'), (2 * MB, 'inactive')]),
        modern_segment(1, 0x7f0010000000, [(4 * MB, 'active_allocated'), (16 * MB, 'active_allocated')])]
# PyTorch 2.0's _dump_snapshot: blocks without address or requested_size, frames and the
# real size in `history`; trace entries without time_us; C++ frames apart.
def legacy_block(size, state, real=None):
    b = {'size': size, 'state': state}
    if real is not None:
        b['history'] = [{'addr': 0, 'real_size': real, 'frames': frames[1:3], 'cpp_frames': ['c10::foo']}]
    return b
legacy_seg = {'device': 0, 'address': 0x7f0020000000, 'total_size': 20 * MB, 'allocated_size': 12 * MB,
              'active_size': 12 * MB, 'stream': 0, 'segment_type': 'large',
              'blocks': [legacy_block(8 * MB, 'active_allocated', 8 * MB - 1000), legacy_block(4 * MB, 'active_allocated', 3 * MB),
                         legacy_block(8 * MB, 'inactive')]}
legacy_trace = [{'action': 'alloc', 'addr': 0x7f0020000000 + 12 * MB, 'size': 1000, 'stream': 0, 'frames': frames[:1]},
                {'action': 'free_requested', 'addr': 0x7f0020000000 + 12 * MB, 'size': 1000, 'stream': 0, 'frames': frames[:1]},
                {'action': 'free_completed', 'addr': 0x7f0020000000 + 12 * MB, 'size': 1000, 'stream': 0, 'frames': frames[:1]},
                {'action': 'oom', 'device_free': 1234, 'size': 30 * MB, 'stream': 0}]
legacy = {'segments': [legacy_seg], 'device_traces': [legacy_trace]}
# A trace of only a snapshot and an oom entry, as a handler that dumps on OOM leaves it.
only = {'segments': [modern_segment(0, 0x7f0030000000, [(6 * MB, 'active_allocated'), (2 * MB, 'inactive')])],
        'device_traces': [[{'action': 'snapshot', 'addr': 0, 'size': 0, 'stream': 0, 'time_us': 5, 'frames': []},
                           {'action': 'oom', 'device_free': 99, 'size': 8 * MB, 'stream': 0, 'time_us': 9, 'frames': []}]]}
files = {'bare': bare, 'legacy': legacy, 'oom_only': only}
result = {}
for name, data in files.items():
    with open(os.path.join(out, name + '.pickle'), 'wb') as f:
        pickle.dump(data, f, protocol=4)
    segs = data if isinstance(data, list) else data['segments']
    dev = segs[0]['device']
    result[name] = {'device': dev, 'allocated_bytes': sum(s['allocated_size'] for s in segs if s['device'] == dev)}
print(json.dumps(result))
"#;

#[test]
fn the_forms_memory_viz_reads_open_with_the_right_allocated_bytes() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let want: serde_json::Value = common::python_json(LEGACY, dir.path());
    for name in ["bare", "legacy", "oom_only"] {
        let path = dir.path().join(format!("{name}.pickle"));
        let out = vramscope().args(["view", "--summary", "--json"]).arg(&path).output().unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let w = &want[name];
        // --device defaults to the device with data (the bare list is of cuda:1).
        assert_eq!(got["device"], w["device"], "{name}");
        assert_eq!(got["allocated_bytes"], w["allocated_bytes"], "{name}");
        let device = w["device"].as_u64().unwrap() as usize;
        let mv = common::MemoryVizTimeline::of(&path, device);
        assert_eq!(got["peak_active_bytes"], mv.peak(), "{name}: memory_viz's peak");
        assert_eq!(got["events"], mv.during.len(), "{name}: memory_viz's actions");
    }
    // PyTorch 2.0's blocks: placed from the segment's address, sized by their history.
    let snap = read_snapshot_file(&dir.path().join("legacy.pickle")).unwrap();
    let blocks = &snap.segments[0].blocks;
    assert_eq!(blocks.iter().map(|b| b.address - 0x7f00_2000_0000).collect::<Vec<_>>(), [0, 8 << 20, 12 << 20]);
    assert_eq!(blocks.iter().map(|b| b.requested_size).collect::<Vec<_>>(), [(8 << 20) - 1000, 3 << 20, 8 << 20]);
    assert_eq!(snap.stack(blocks[1].frames).map(|f| f.name.as_str()).collect::<Vec<_>>(), ["step1", "step2"]);
    assert_eq!(snap.skipped.keys.get("block history.cpp_frames"), Some(&2));
    // A trace with no alloc or free is drawn as memory_viz draws it: the final state.
    let tl = Timeline::from_snapshot(&read_snapshot_file(&dir.path().join("oom_only.pickle")).unwrap(), 0);
    assert_eq!((tl.total_events, tl.peak_bytes), (1, (6 << 20) - 256));
}

/// Python-written files that really are malformed, and what the one-line error says.
const MALFORMED: &str = r#"
import json, pickle, sys, os
out = sys.argv[1]
seg = {'device': 0, 'address': 4096, 'total_size': 2097152, 'segment_type': 'small', 'blocks': []}
cases = {
    'block_without_state': {'segments': [dict(seg, blocks=[{'address': 4096, 'size': 512}])], 'device_traces': []},
    'no_segments': {'device_traces': [[]], 'allocator_settings': {}},
    'entry_without_action': {'segments': [], 'device_traces': [[{'addr': 1, 'size': 2}]]},
    'segment_without_address': {'segments': [dict((k, v) for k, v in seg.items() if k != 'address')]},
    'alloc_without_addr': {'segments': [], 'device_traces': [[{'action': 'alloc', 'size': 2}]]},
}
for name, data in cases.items():
    with open(os.path.join(out, name + '.pickle'), 'wb') as f:
        pickle.dump(data, f)
print(json.dumps(sorted(cases)))
"#;

#[test]
fn malformed_files_are_named_by_the_key_or_shape_that_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = common::python_json(MALFORMED, dir.path());
    let expect = [
        ("block_without_state", "element 0 of `blocks` is a dict with keys [address, size], not a block (a block has `size` and `state`)"),
        ("no_segments", "the top-level dict has no `segments` (it has keys [device_traces, allocator_settings])"),
        ("entry_without_action", "element 0 of `device_traces[0]` is a dict with keys [addr, size], not a trace entry (a trace entry has an `action`)"),
        ("segment_without_address", "segment completed at byte"),
        ("alloc_without_addr", "trace entry completed at byte"),
    ];
    assert_eq!(names.len(), expect.len());
    for (name, text) in expect {
        let out = vramscope().args(["view", "--summary"]).arg(dir.path().join(format!("{name}.pickle"))).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(err.contains(text), "{name}: {err}");
    }
    let out = vramscope().args(["view", "--summary"]).arg(dir.path().join("segment_without_address.pickle")).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("no `address`"));
    let out = vramscope().args(["view", "--summary"]).arg(dir.path().join("alloc_without_addr.pickle")).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("no `addr`"));
}

/// The peak of `path`'s first device with data, as each command shows it: the viewer's
/// timeline, `view --summary --json`, `replay` (the store fed by the trace), the caption
/// `export` draws, and `diff --json` against itself.
fn peaks_everywhere(path: &Path, dir: &Path) -> [(&'static str, u64); 5] {
    use vramscope_core::record::player::Script;
    use vramscope_core::stream::Incoming;
    let json = |args: &[&str]| -> serde_json::Value {
        let out = vramscope().args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let file = path.to_str().unwrap();
    let view = vramscope::screens::viewer::data::ViewerData::open(path, None, &FrameRules::off()).unwrap().tl.peak_bytes;
    let summary = json(&["view", "--summary", "--json", file])["peak_active_bytes"].as_u64().unwrap();
    let mut store = vramscope_core::store::Store::new(1 << 20);
    let mut failed = None;
    let mut script = Script::open(path).unwrap();
    for (_, item) in script.stream(&mut failed) {
        if let Incoming::Batch(b) = item {
            store.ingest_batch(b);
        }
    }
    let svg = dir.join(format!("{}.svg", path.file_stem().unwrap().to_string_lossy()));
    vramscope().args(["export", file, "-o"]).arg(&svg).assert().success();
    let svg = std::fs::read_to_string(&svg).unwrap();
    let caption = svg.split(" bytes)").next().and_then(|s| s.rsplit('(').next()).unwrap();
    let diff = json(&["diff", "--json", file, file])["peak_active_bytes"]["a"].as_u64().unwrap();
    [("view", view), ("summary", summary), ("replay", store.peak.0), ("export", caption.parse().unwrap()), ("diff", diff)]
}

#[test]
fn one_file_has_one_peak_in_view_summary_replay_export_and_diff() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (newer, _) = newer_file(dir.path());
    for (path, device) in [(newer, 0), (common::fixture_path(common::MAGMA27), 0), (common::fixture_path(common::KKAITLYN), 0)] {
        let want = common::MemoryVizTimeline::of(&path, device).peak();
        for (command, peak) in peaks_everywhere(&path, dir.path()) {
            assert_eq!(peak, want, "{}: {command} shows memory_viz's peak", path.display());
        }
    }
}

#[test]
fn per_device_counts_are_the_device_s_own() {
    if common::skip_without_real_snapshots() {
        return;
    }
    // Constructor-Sun's run used four GPUs, three with traces.
    let path = common::fixture_path("Constructor-Sun_code_location_memory_snapshot");
    let want: Vec<serde_json::Value> = common::python_json(
        r#"
import json, pickle, sys
d = pickle.load(open(sys.argv[1], 'rb'))
n = max(len(d['device_traces']), 1 + max(s['device'] for s in d['segments']))
print(json.dumps([{'segments': sum(s['device'] == i for s in d['segments']),
                   'blocks': sum(len(s['blocks']) for s in d['segments'] if s['device'] == i),
                   'trace_entries': len(d['device_traces'][i]) if i < len(d['device_traces']) else 0} for i in range(n)]))
"#,
        &path,
    );
    assert!(want.len() > 1);
    for (device, w) in want.iter().enumerate() {
        let out = vramscope().args(["view", "--summary", "--json", "--device", &device.to_string()]).arg(&path).output().unwrap();
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        for key in ["segments", "blocks", "trace_entries"] {
            assert_eq!(s[key], w[key], "device {device}: {key}");
            assert_eq!(s["per_device"][device][key], w[key], "device {device}: per_device {key}");
        }
        assert_eq!(s["per_device"].as_array().unwrap().len(), want.len());
    }
    let text = vramscope().args(["view", "--summary", "--device", "1"]).arg(&path).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    let counts = format!("{} segments, {} blocks, {} trace entries", want[1]["segments"], want[1]["blocks"], want[1]["trace_entries"]);
    assert!(text.contains(&counts) && text.contains("every device"), "{text}");
}

#[test]
fn figures_that_cannot_both_be_true_open_with_a_warning() {
    if common::skip_without_real_snapshots() {
        return;
    }
    // 6 MiB allocated in a trace whose device never reserves more than 2 MiB.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("contradiction.pickle");
    common::python_json::<serde_json::Value>(
        r#"
import pickle, sys
seg = {'device': 0, 'address': 4096, 'total_size': 2 << 20, 'allocated_size': 0, 'active_size': 0,
       'stream': 0, 'segment_type': 'large', 'blocks': [{'address': 4096, 'size': 2 << 20, 'state': 'inactive'}]}
trace = [{'action': 'alloc', 'addr': 1 << 40, 'size': 6 << 20, 'stream': 0, 'time_us': 1},
         {'action': 'free_requested', 'addr': 1 << 40, 'size': 6 << 20, 'stream': 0, 'time_us': 2},
         {'action': 'free_completed', 'addr': 1 << 40, 'size': 6 << 20, 'stream': 0, 'time_us': 3}]
pickle.dump({'segments': [seg], 'device_traces': [trace]}, open(sys.argv[1], 'wb'))
print('{}')
"#,
        &path,
    );
    let out = vramscope().args(["view", "--summary"]).arg(&path).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let warning = "warning: active memory 6.00 MiB at action 0 is above the 2.00 MiB reserved then";
    assert_eq!(text.lines().nth(1).unwrap_or(""), format!("{warning}: this file's figures cannot all be true"), "{text}");
    let out = vramscope().args(["view", "--summary", "--json"]).arg(&path).output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["figures_conflict"]["reserved_bytes"], 2 << 20);
    // The viewer's header says it too; a consistent file has no such line.
    let keys = vramscope::keys::KeyMap::default();
    let theme = vramscope::theme::Theme::load("dark").unwrap();
    let header = |p: &Path| {
        let data = vramscope::screens::viewer::data::ViewerData::open(p, None, &FrameRules::off()).unwrap();
        let ui = vramscope::screens::viewer::ui::ViewerUi::new(&data);
        let buf = vramscope::draw::draw_to_buffer(160, 40, |f| vramscope::screens::viewer::render::render_viewer(f, &data, &ui, &keys, &theme));
        (0..3).map(|y| (0..160).map(|x| buf[(x, y)].symbol().to_string()).collect::<String>()).collect::<Vec<_>>().join("\n")
    };
    assert!(header(&path).contains(warning), "{}", header(&path));
    assert!(!header(&common::fixture_path(common::MAGMA27)).contains("warning"));
    // The real GPU snapshots hold together; SnapViewer's synthetic one does not (2.10 GiB
    // active in 250 MiB reserved).
    for (name, warns) in [(common::MAGMA27, false), (common::KKAITLYN, false), ("Constructor-Sun_code_location_memory_snapshot", false), (common::SNAPVIEWER, true)] {
        let out = vramscope().args(["view", "--summary"]).arg(common::fixture_path(name)).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).contains("warning: active memory"), warns, "{name}");
    }
}

#[test]
fn the_inspector_shows_what_newer_pytorch_records() {
    use vramscope::keys::KeyMap;
    use vramscope::screens::viewer::keys::ViewerKey::*;
    use vramscope::screens::viewer::data::ViewerData;
    use vramscope::screens::viewer::ui::{handle, settle, ViewerUi};
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = newer_file(dir.path());
    let keys = KeyMap::default();
    let theme = vramscope::theme::Theme::load("dark").unwrap();
    // The largest allocations, one row down per press: 6 MiB (pool (1, 3)), 4 MiB (freed
    // before the trace), 3 MiB (compiled, with user metadata), 2 MiB (made in backward).
    let screen = |downs: usize| {
        let mut data = ViewerData::open(&path, None, &FrameRules::off()).unwrap();
        let mut ui = ViewerUi::new(&data);
        for a in [NextTab].into_iter().chain(std::iter::repeat_n(SelectDown, downs)).chain([Inspect]) {
            handle(a, &mut data, &mut ui, 1);
            settle(&mut data, &mut ui);
        }
        let buf = vramscope::draw::draw_to_buffer(160, 40, |f| vramscope::screens::viewer::render::render_viewer(f, &data, &ui, &keys, &theme));
        (0..40).map(|y| (0..160).map(|x| buf[(x, y)].symbol().to_string()).collect::<String>().trim_end().to_string()).collect::<Vec<_>>().join("\n")
    };
    let compiled = screen(2);
    assert!(compiled.contains("Torch-Compiled Region: 0/1") && compiled.contains("{\"step\": 3}") && compiled.contains("fx call_function linear_4 (aten.mm)"), "{compiled}");
    insta::assert_snapshot!(compiled);
    assert!(screen(0).contains("pool       (1, 3)"));
    let backward = screen(3);
    assert!(backward.contains("made in backward for the forward op at:") && backward.contains("fn5 (mod0.py:15)"), "{backward}");
}
