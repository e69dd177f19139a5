//! `vramscope view` and `vramscope diff` on the real fixtures: `--summary --json` against
//! an independent Python reading of the same pickles, one-line errors on bad files, and
//! whole-screen snapshots of each view.

mod common;

use std::process::Command;

use assert_cmd::cargo::CommandCargoExt;
use vramscope::app::keys::{KeyMap, ViewAction};
use vramscope::app::snapshot_viewer::{handle, ViewerData, ViewerUi};
use vramscope::render::snapshot_viewer::render_viewer_to_buffer;
use vramscope::render::theme::Theme;

/// Summary figures straight from the pickle with Python's own unpickler.
const REFERENCE: &str = r#"
import json, pickle, sys
d = pickle.load(open(sys.argv[1], 'rb'))
trace = d['device_traces'][0] if d['device_traces'] else []
segs = [s for s in d['segments'] if s['device'] == 0]
# Active Memory Timeline peak: pair allocs with frees, free_requested+free_completed = one.
sizes, alive0, live, total_events = {}, 0, {}, []
merged = []
for e in trace:
    if e['action'] == 'free_completed' and merged and merged[-1]['action'] == 'free_requested' and merged[-1]['addr'] == e['addr']:
        merged[-1] = dict(merged[-1], action='free')
        continue
    merged.append(e)
cur, base, steps = 0, 0, []
for e in merged:
    if e['action'] == 'alloc':
        live[e['addr']] = e['size']; cur += e['size']; steps.append(cur)
    elif e['action'] in ('free', 'free_completed'):
        if e['addr'] in live:
            steps.append(cur); cur -= live.pop(e['addr'])
        else:
            # Alive since before the trace: raises everything up to and including now.
            steps = [v + e['size'] for v in steps]; steps.append(cur + e['size'])
for s in segs:
    for b in s['blocks']:
        if b['state'] == 'active_allocated' and b['address'] not in live:
            base += b['requested_size']
peak = max(steps) + base if steps else base
reserved = sum(s['total_size'] for s in segs)
r = reserved
for e in trace:
    if e['action'] in ('segment_alloc', 'segment_map'): r -= e['size']
    if e['action'] in ('segment_free', 'segment_unmap'): r += e['size']
peak_reserved = max(r, reserved)
for e in trace:
    if e['action'] in ('segment_alloc', 'segment_map'): r += e['size']
    if e['action'] in ('segment_free', 'segment_unmap'): r -= e['size']
    peak_reserved = max(peak_reserved, r)
allocated = sum(s['allocated_size'] for s in segs)
free = [b['size'] for s in segs for b in s['blocks'] if b['state'] == 'inactive']
print(json.dumps({
    'peak_active_bytes': peak,
    'peak_reserved_bytes': peak_reserved,
    'reserved_bytes': reserved,
    'allocated_bytes': allocated,
    'segments': len(d['segments']),
    'blocks': sum(len(s['blocks']) for s in d['segments']),
    'trace_entries': sum(len(t) for t in d['device_traces']),
    'inactive_bytes': sum(free),
    'largest_free_block': max(free, default=0),
    'fragmentation': 1 - allocated / reserved if reserved else 0.0,
}))
"#;

fn vramscope() -> Command {
    Command::cargo_bin("vramscope").unwrap()
}

fn summary_json(name: &str) -> serde_json::Value {
    let out = vramscope().args(["view", "--summary", "--json"]).arg(common::fixture_path(name)).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn summary_figures_match_python_on_every_fixture() {
    for name in common::ALL {
        let got = summary_json(name);
        let want: serde_json::Value = common::python_json(REFERENCE, &common::fixture_path(name));
        for key in ["peak_active_bytes", "peak_reserved_bytes", "reserved_bytes", "allocated_bytes", "segments", "blocks", "trace_entries", "inactive_bytes", "largest_free_block"] {
            assert_eq!(got[key], want[key], "{name}: {key}");
        }
        let frag = (got["fragmentation"].as_f64().unwrap() - want["fragmentation"].as_f64().unwrap()).abs();
        assert!(frag < 1e-12, "{name}: fragmentation");
        let largest = got["largest"].as_array().unwrap();
        assert_eq!(largest.len(), 10, "{name}");
        let sizes: Vec<u64> = largest.iter().map(|a| a["requested_size"].as_u64().unwrap()).collect();
        assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{name}: largest first");
        assert!(largest.iter().all(|a| a["size"].as_u64().unwrap() >= a["requested_size"].as_u64().unwrap() && a["frames"].is_array()));
    }
}

#[test]
fn largest_allocation_names_its_model_frame() {
    let s = summary_json(common::MAGMA27);
    assert_eq!(s["largest"][0]["top_frame"], "forward (model.py:39)");
    let frames = s["largest"][0]["frames"].as_array().unwrap();
    assert!(frames.iter().any(|f| f["filename"].as_str().unwrap().ends_with("model.py") && f["line"] == 39));
    // SnapViewer's file has annotations; they land on the timeline.
    let s = summary_json(common::SNAPVIEWER);
    assert!(s["annotations"].as_array().unwrap().iter().any(|a| a["name"] == "Annotation3" && a["event"].is_u64()));
}

#[test]
fn bad_files_give_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let full = std::fs::read(common::fixture_path(common::MAGMA27)).unwrap();
    let cases: [(&str, &[u8]); 4] = [
        ("empty", b""),
        ("text", b"hello, not a snapshot\n"),
        ("truncated", &full[..full.len() / 2]),
        ("list", b"\x80\x04]\x94."),
    ];
    for (name, bytes) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        for args in [vec!["view", "--summary"], vec!["view"]] {
            let out = vramscope().args(&args).arg(&p).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{name}: {err}");
            assert_eq!(err.lines().count(), 1, "{name}: {err}");
            assert!(err.starts_with("vramscope: ") && err.contains(name), "{name}: {err}");
        }
    }
    let out = vramscope().args(["view", "--summary"]).arg(dir.path().join("missing")).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn diff_of_a_file_with_itself_is_empty_and_across_files_reports_peaks() {
    let a = common::fixture_path(common::MAGMA27);
    let b = common::fixture_path(common::KKAITLYN);
    let out = vramscope().args(["diff", "--json"]).arg(&a).arg(&a).output().unwrap();
    assert!(out.status.success());
    let same: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(same["peak_active_bytes"]["delta"], 0);
    assert!(same["grew"].as_array().unwrap().is_empty() && same["shrank"].as_array().unwrap().is_empty());
    let out = vramscope().args(["diff", "--json"]).arg(&a).arg(&b).output().unwrap();
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (sa, sb) = (summary_json(common::MAGMA27), summary_json(common::KKAITLYN));
    assert_eq!(d["peak_active_bytes"]["a"], sa["peak_active_bytes"]);
    assert_eq!(d["peak_active_bytes"]["b"], sb["peak_active_bytes"]);
    assert_eq!(d["peak_reserved_bytes"]["b"], sb["peak_reserved_bytes"]);
    let grew = d["grew"].as_array().unwrap();
    assert!(!grew.is_empty() && grew.iter().all(|g| g["bytes"]["delta"].as_i64().unwrap() > 0));
    // What grew and shrank at the peak accounts for the whole change in active bytes.
    let text = vramscope().arg("diff").arg(&a).arg(&b).output().unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("peak active"));
}

fn screen(data: &mut ViewerData, keys_pressed: &[ViewAction]) -> String {
    let keys = KeyMap::<ViewAction>::default();
    let theme = Theme::load("dark").unwrap();
    let mut ui = ViewerUi::new(data);
    ui.columns = vramscope::render::snapshot_viewer::plot_columns(160, false);
    for a in keys_pressed {
        handle(*a, data, &mut ui, 1);
        ui.columns = vramscope::render::snapshot_viewer::plot_columns(160, ui.inspector);
    }
    let buf = render_viewer_to_buffer(data, &ui, &keys, &theme, 160, 40);
    (0..buf.area.height)
        .map(|y| (0..buf.area.width).map(|x| buf[(x, y)].symbol().to_string()).collect::<String>().trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

fn magma() -> ViewerData {
    ViewerData::open(&common::fixture_path(common::MAGMA27), 0).unwrap()
}

#[test]
fn view_timeline() {
    insta::assert_snapshot!(screen(&mut magma(), &[]));
}

#[test]
fn view_timeline_less_detail_zoomed_with_inspector() {
    use ViewAction::*;
    let s = screen(&mut magma(), &[DetailLess, DetailLess, ZoomIn, ZoomIn, SelectDown, Inspect]);
    assert!(s.contains("detail 25%") && s.contains(" allocation "), "{s}");
    insta::assert_snapshot!(s);
}

#[test]
fn view_largest_with_inspector() {
    use ViewAction::*;
    insta::assert_snapshot!(screen(&mut magma(), &[NextTab, SelectDown, Inspect]));
}

#[test]
fn view_segments() {
    use ViewAction::*;
    insta::assert_snapshot!(screen(&mut magma(), &[NextTab, NextTab]));
}

#[test]
fn view_categories() {
    use ViewAction::*;
    insta::assert_snapshot!(screen(&mut magma(), &[NextTab, NextTab, NextTab]));
}

#[test]
fn view_annotations_on_the_timeline() {
    let mut d = ViewerData::open(&common::fixture_path(common::SNAPVIEWER), 0).unwrap();
    let s = screen(&mut d, &[]);
    assert!(s.contains('▶'), "{s}");
    insta::assert_snapshot!(s);
}
