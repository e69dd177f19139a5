//! `vramscope view` and `vramscope diff`: whole-screen snapshots of each view, the
//! loading screen of a long file, `--summary --json` and diffs. Each runs on a training
//! run made here (`training::`, in every checkout) and on the real fixtures where they
//! are present, through the same checks; on the real fixtures alone, `--summary --json`
//! against an independent Python reading of the pickles, and one-line errors on bad
//! files.

mod common;
#[path = "common/training_snapshot.rs"]
mod training_snapshot;

use std::path::Path;

use common::vramscope;
use vramscope_core::report::frame_rules::FrameRules;
use common::viewer::{screen, screen_buffer, text};

use vramscope::keys::KeyMap;
use vramscope::screens::viewer::keys::ViewerKey;
use vramscope::screens::viewer::loading::{spawn_loader, LoadUpdate, Loading};
use vramscope::screens::viewer::data::ViewerData;
use vramscope_core::report::snapshot_summary::segment_stats;
use vramscope_core::snapshot::{read_snapshot_file_observed, ReadPass};
use vramscope::draw::draw_to_buffer;
use vramscope::theme::{ColorSupport, Theme};
use vramscope_core::snapshot::model::Snapshot;

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
    'segments': len(segs),
    'blocks': sum(len(s['blocks']) for s in segs),
    'trace_entries': len(trace),
    'inactive_bytes': sum(free),
    'largest_free_block': max(free, default=0),
    'fragmentation': 1 - allocated / reserved if reserved else 0.0,
}))
"#;

fn summary_json(name: &str) -> serde_json::Value {
    summary_json_of(&common::fixture_path(name))
}

fn summary_json_of(path: &Path) -> serde_json::Value {
    let out = vramscope().args(["view", "--summary", "--json"]).arg(path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn summary_figures_match_python_on_every_fixture() {
    if common::skip_without_real_snapshots() {
        return;
    }
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

/// The summary names its largest allocation by `top_frame`, with `file:line` among its
/// frames.
fn largest_is_named(s: &serde_json::Value, top_frame: &str, file: &str, line: i64) {
    assert_eq!(s["largest"][0]["top_frame"], top_frame);
    let frames = s["largest"][0]["frames"].as_array().unwrap();
    assert!(frames.iter().any(|f| f["filename"].as_str().unwrap().ends_with(file) && f["line"] == line), "{frames:?}");
}

/// The file's annotation `name` lands on the timeline.
fn annotation_is_placed(s: &serde_json::Value, name: &str) {
    assert!(s["annotations"].as_array().unwrap().iter().any(|a| a["name"] == name && a["event"].is_u64()), "{}", s["annotations"]);
}

#[test]
fn largest_allocation_names_its_model_frame() {
    if common::skip_without_real_snapshots() {
        return;
    }
    largest_is_named(&summary_json(common::MAGMA27), "forward (model.py:39)", "model.py", 39);
    // SnapViewer's file has annotations; they land on the timeline.
    annotation_is_placed(&summary_json(common::SNAPVIEWER), "Annotation3");
}

#[test]
fn bad_files_give_one_line_and_exit_2() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let full = std::fs::read(common::fixture_path(common::MAGMA27)).unwrap();
    let cases: [(&str, &[u8]); 4] = [
        ("empty", b""),
        ("text", b"hello, not a snapshot\n"),
        ("truncated", &full[..full.len() / 2]),
        ("list", b"\x80\x04]\x94K\x01a."),
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

/// `diff a a` is empty; `diff a b` reports both peaks and what grew. Returns `diff a b`.
fn diff_reports_peaks(a: &Path, b: &Path) -> serde_json::Value {
    let out = vramscope().args(["diff", "--json"]).arg(a).arg(a).output().unwrap();
    assert!(out.status.success());
    let same: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(same["peak_active_bytes"]["delta"], 0);
    assert!(same["grew"].as_array().unwrap().is_empty() && same["shrank"].as_array().unwrap().is_empty());
    let out = vramscope().args(["diff", "--json"]).arg(a).arg(b).output().unwrap();
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (sa, sb) = (summary_json_of(a), summary_json_of(b));
    assert_eq!(d["peak_active_bytes"]["a"], sa["peak_active_bytes"]);
    assert_eq!(d["peak_active_bytes"]["b"], sb["peak_active_bytes"]);
    assert_eq!(d["peak_reserved_bytes"]["b"], sb["peak_reserved_bytes"]);
    let grew = d["grew"].as_array().unwrap();
    assert!(!grew.is_empty() && grew.iter().all(|g| g["bytes"]["delta"].as_i64().unwrap() > 0));
    // What grew and shrank at the peak accounts for the whole change in active bytes.
    let text = vramscope().arg("diff").arg(a).arg(b).output().unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("peak active"));
    d
}

#[test]
fn diff_of_a_file_with_itself_is_empty_and_across_files_reports_peaks() {
    if common::skip_without_real_snapshots() {
        return;
    }
    diff_reports_peaks(&common::fixture_path(common::MAGMA27), &common::fixture_path(common::KKAITLYN));
}


fn magma() -> ViewerData {
    ViewerData::open(&common::fixture_path(common::MAGMA27), None, &FrameRules::off()).unwrap()
}

#[test]
fn view_timeline() {
    if common::skip_without_real_snapshots() {
        return;
    }
    insta::assert_snapshot!(screen(&mut magma(), &[]));
}

/// Two steps less detail, zoomed in twice, the second band inspected.
fn less_detail_zoomed_with_inspector(d: &mut ViewerData) -> String {
    use ViewerKey::*;
    let s = screen(d, &[DetailLess, DetailLess, ZoomIn, ZoomIn, SelectDown, Inspect]);
    assert!(s.contains("detail 25%") && s.contains(" allocation "), "{s}");
    s
}

#[test]
fn view_timeline_less_detail_zoomed_with_inspector() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let s = less_detail_zoomed_with_inspector(&mut magma());
    insta::assert_snapshot!(s);
}

#[test]
fn view_largest_with_inspector() {
    if common::skip_without_real_snapshots() {
        return;
    }
    use ViewerKey::*;
    insta::assert_snapshot!(screen(&mut magma(), &[NextTab, SelectDown, Inspect]));
}

#[test]
fn view_segments() {
    if common::skip_without_real_snapshots() {
        return;
    }
    use ViewerKey::*;
    insta::assert_snapshot!(screen(&mut magma(), &[NextTab, NextTab]));
}

#[test]
fn view_categories() {
    if common::skip_without_real_snapshots() {
        return;
    }
    use ViewerKey::*;
    insta::assert_snapshot!(screen(&mut magma(), &[NextTab, NextTab, NextTab]));
}

/// The timeline after `keys`, the file's annotations marked under it.
fn annotated_timeline(d: &mut ViewerData, keys: &[ViewerKey]) -> String {
    let s = screen(d, keys);
    assert!(s.contains('▶'), "{s}");
    s
}

#[test]
fn view_annotations_on_the_timeline() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let mut d = ViewerData::open(&common::fixture_path(common::SNAPVIEWER), None, &FrameRules::off()).unwrap();
    let s = annotated_timeline(&mut d, &[]);
    insta::assert_snapshot!(s);
}

/// Long enough (about 9 MB) for the reader to report progress several times per pass.
const COPIES: usize = 40;

/// Reading `path` (several MB) shows the segments, then ever longer prefixes of the trace.
fn read_shows_growing_prefixes(path: &Path) {
    // (pass, done, segments shown, trace length, its last entry)
    let mut seen = Vec::new();
    let snap = read_snapshot_file_observed(path, &mut |p| {
        let t = p.traces.first().copied().unwrap_or_default();
        seen.push((p.pass, p.done, p.segments.is_some(), t.len(), t.last().map(|e| (e.action, e.addr, e.size, e.time_us))));
    })
    .unwrap();
    let trace = &snap.device_traces[0];
    let size = std::fs::metadata(path).unwrap().len() as usize;
    assert!(seen.len() >= 6, "progress through both passes of a {size}-byte file: {seen:?}");
    assert!(seen.windows(2).all(|w| (w[0].0, w[0].1) <= (w[1].0, w[1].1)), "checking, then decoding, each forward: {seen:?}");
    let check = seen.iter().filter(|s| s.0 == ReadPass::Check).count();
    assert!(check >= 2 && seen[..check].iter().all(|s| !s.2 && s.3 == 0), "checking decodes nothing: {seen:?}");
    let partial: Vec<_> = seen.iter().filter(|s| s.0 == ReadPass::Decode && s.3 > 0 && s.3 < trace.len()).collect();
    assert!(partial.len() >= 2, "the trace is shown while it grows: {seen:?}");
    assert!(partial.iter().all(|s| s.2), "segments (first in the file) are shown before the trace");
    for s in &seen {
        if s.3 > 0 {
            let e = &trace[s.3 - 1];
            assert_eq!(s.4, Some((e.action, e.addr, e.size, e.time_us)), "each shown trace is a prefix of the final one");
        }
    }
    assert_eq!(seen.last().unwrap(), &(ReadPass::Decode, size, true, trace.len(), trace.last().map(|e| (e.action, e.addr, e.size, e.time_us))));
}

#[test]
fn a_read_shows_the_segments_then_growing_prefixes_of_the_trace() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.pickle");
    common::long_snapshot_file(common::KKAITLYN, COPIES, &path);
    read_shows_growing_prefixes(&path);
}

/// The loading screen's timeline of `path` (named long.pickle) grows into the loaded
/// one: more than `min_events` actions in `categories` categories, with blocks alive
/// throughout.
fn loading_timeline_grows_into_the_loaded_one(path: &Path, min_events: usize, categories: usize) {
    let rx = spawn_loader(path.to_path_buf(), None, std::sync::Arc::new(FrameRules::off()));
    let mut loading = Loading::new("long.pickle".into());
    let mut midway = None;
    let mut fractions = Vec::new();
    let data = loop {
        let u = rx.recv().expect("the reader sends until Done");
        if let Some(done) = loading.apply(u) {
            break done.unwrap();
        }
        fractions.push(loading.fraction());
        let tl = loading.timeline().expect("the timeline so far");
        if midway.is_none() && loading.segments.is_some() && loading.fraction() > 0.5 && tl.total_events > 0 {
            midway = Some((0..tl.total_events).map(|i| tl.totals_at(i)).collect::<Vec<u64>>());
        }
    };
    assert!(fractions.windows(2).all(|w| w[0] <= w[1]) && *fractions.last().unwrap() == 1.0, "{fractions:?}");
    assert!(loading.timeline().is_none(), "the timeline went to the viewer");
    let tl = &data.tl;
    let fresh = vramscope_core::snapshot::timeline::Timeline::from_snapshot(&data.snap, 0);
    assert!(tl.total_events > min_events && tl.categories.len() == categories, "{} {:?}", tl.total_events, tl.categories);
    // Completed from what the loading screen fed, it is the timeline built from scratch.
    assert_eq!(tl.allocations, fresh.allocations);
    assert_eq!((tl.total_events, tl.peak_bytes, tl.peak_index), (fresh.total_events, fresh.peak_bytes, fresh.peak_index));
    assert_eq!((&tl.categories, &tl.event_positions), (&fresh.categories, &fresh.event_positions));
    assert!((0..tl.total_events).all(|i| tl.totals_at(i) == fresh.totals_at(i)));
    assert!((0..tl.total_events).step_by(997).all(|i| tl.category_totals_at(i) == fresh.category_totals_at(i)));
    // Midway it showed a prefix of it, less the blocks alive throughout.
    let midway = midway.expect("a frame past half the file");
    assert!(midway.len() > 1000 && midway.len() < tl.total_events, "{}", midway.len());
    let throughout: u64 = tl.allocations.iter().filter(|a| a.alive_at_start && a.end.is_none()).map(|a| a.size).sum();
    assert!(throughout > 0);
    assert!(midway.iter().enumerate().all(|(i, &t)| t + throughout == tl.totals_at(i)));
}

#[test]
fn the_loading_timeline_grows_into_the_loaded_one() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.pickle");
    common::long_snapshot_file(common::KKAITLYN, COPIES, &path);
    loading_timeline_grows_into_the_loaded_one(&path, 100_000, 4);
}

/// The loading screen of `name` with `done` of `total` bytes decoded: the segments of
/// `snap` and the first `entries` entries of its trace.
fn loading_screen(name: &str, snap: &Snapshot, (done, total): (usize, usize), entries: usize) -> String {
    let mut loading = Loading::new(name.into());
    for u in [
        LoadUpdate::Progress { pass: ReadPass::Decode, done, total },
        LoadUpdate::Device(0),
        LoadUpdate::Segments(segment_stats(snap.device_segments(0)).1),
        LoadUpdate::Events(snap.device_traces[0][..entries].iter().map(|e| (e.action, e.addr, e.size, 0)).collect(), vec!["unknown".into()]),
    ] {
        assert!(loading.apply(u).is_none());
    }
    loading.refresh_detail();
    let theme = Theme::load("dark").unwrap();
    let s = text(&draw_to_buffer(160, 40, |f| vramscope::screens::viewer::render::render_loading(f, &loading, &KeyMap::default(), &theme)));
    assert!(s.contains(&format!("{entries} trace entries so far")) && s.contains("▼ active peak"), "{s}");
    s
}

#[test]
fn view_while_loading() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let snap = common::load(common::MAGMA27);
    let s = loading_screen(&format!("{}.pickle", common::MAGMA27), &snap, (180_000, 495_064), 2500);
    assert!(s.contains("loading 49%"), "{s}");
    insta::assert_snapshot!(s);
}

/// `rank1` is the run of `rank0` on cuda:1, device 0's lists empty: it opens on device 1,
/// loaded in one go or through the loading screen, and diffs as the same run.
fn opens_on_its_device(rank0: &Path, rank1: &Path) {
    let snap = vramscope_core::snapshot::read_snapshot_file(rank1).unwrap();
    let n = snap.device_traces[1].len();
    let fresh = vramscope_core::snapshot::timeline::Timeline::from_snapshot(&snap, 1);
    let data = ViewerData::open(rank1, None, &FrameRules::off()).unwrap();
    assert_eq!((data.device, data.tl.peak_bytes), (1, fresh.peak_bytes));
    let rx = spawn_loader(rank1.to_path_buf(), None, std::sync::Arc::new(FrameRules::off()));
    let mut loading = Loading::new("rank1.pickle".into());
    let data = loop {
        if let Some(done) = loading.apply(rx.recv().unwrap()) {
            break done.unwrap();
        }
    };
    assert_eq!(loading.device, Some(1));
    assert_eq!((data.device, &data.tl.allocations, data.tl.peak_bytes), (1, &fresh.allocations, fresh.peak_bytes));
    // Asked for device 0, the screen says where the trace is.
    let mut data = ViewerData::open(rank1, Some(0), &FrameRules::off()).unwrap();
    let s = screen(&mut data, &[]);
    assert!(s.contains(&format!("Device 1 has {n} trace entries: d shows the next device")), "{s}");
    let s = screen(&mut data, &[ViewerKey::NextDevice]);
    assert!(s.contains("device 1 of 2") && s.contains("▼ active peak"), "{s}");
    // Against the same run on device 0 (another rank), nothing changed.
    let out = vramscope().args(["diff", "--json"]).arg(rank0).arg(rank1).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((&d["peak_active_bytes"]["delta"], &d["peak_reserved_bytes"]["delta"]), (&serde_json::json!(0), &serde_json::json!(0)));
    assert!(d["peak_active_bytes"]["a"].as_u64().unwrap() > 0);
}

#[test]
fn a_snapshot_of_another_gpu_opens_on_its_device() {
    if common::skip_without_real_snapshots() {
        return;
    }
    // A run on cuda:1 (or DDP rank 1): device 0's lists are empty.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rank1.pickle");
    let mut snap = common::load(common::KKAITLYN);
    let trace = std::mem::take(&mut snap.device_traces[0]);
    snap.device_traces = vec![Vec::new(), trace];
    for s in &mut snap.segments {
        s.device = 1;
    }
    vramscope_core::snapshot::save_snapshot_atomic(&snap, &path).unwrap();
    opens_on_its_device(&common::fixture_path(common::KKAITLYN), &path);
}

/// MAGMA27 with categories the way a profiler-fed writer records them: logits-sized
/// blocks activations, mid-sized ones parameters, the rest temporaries.
fn categorized() -> ViewerData {
    let mut snap = common::load(common::MAGMA27);
    for e in &mut snap.device_traces[0] {
        let c = match e.size {
            s if s >= 64 << 20 => "activation",
            s if s >= 1 << 20 => "parameter",
            _ => "temporary",
        };
        e.category = Some(c.into());
    }
    ViewerData::new("categorized.pickle".into(), snap, 0)
}

/// The colours of the timeline's bands (full-block cells inside the plot).
fn band_colours(buf: &ratatui::buffer::Buffer) -> std::collections::BTreeSet<String> {
    let area = buf.area;
    (4..area.height - 4).flat_map(|y| (11..area.width - 2).map(move |x| (x, y))).filter(|&p| buf[p].symbol() == "█").map(|p| format!("{:?}", buf[p].fg)).collect()
}

/// `categorized` (whose trace names `categories`) colours its bands by category, or by
/// allocation; `plain` (a file without categories) by allocation, saying why. Returns
/// the screen coloured by category.
fn colours_by_category_or_by_allocation(categorized: &mut ViewerData, plain: &mut ViewerData, categories: &[&str]) -> String {
    let theme = Theme::load("dark").unwrap();
    let buf = screen_buffer(categorized, &[], &theme, 160, 40);
    let s = text(&buf);
    assert!(s.contains("by category (c: by allocation)"), "{s}");
    // Each category one colour: the bands take exactly the colours of the categories drawn.
    let want: std::collections::BTreeSet<String> = categories
        .iter()
        .map(|n| format!("{:?}", theme.category(vramscope_core::event::Category::parse(n).unwrap())))
        .collect();
    // The selected band (accent, peak colour under the cursor) aside.
    let mut got = band_colours(&buf);
    got.retain(|c| *c != format!("{:?}", theme.ui.accent) && *c != format!("{:?}", theme.chart.peak));
    assert!(got.len() >= 2 && got.is_subset(&want), "{got:?} not within {want:?}");
    // By allocation, neighbours differ: more colours than categories.
    let buf = screen_buffer(categorized, &[ViewerKey::ColourBy], &theme, 160, 40);
    assert!(text(&buf).contains("by allocation (c: by category)"));
    assert!(band_colours(&buf).len() > want.len(), "{:?}", band_colours(&buf));
    // A file without categories says why it colours by allocation, and stays so.
    let plain = screen(plain, &[ViewerKey::ColourBy]);
    assert!(plain.contains("by allocation (no categories in the file)"), "{plain}");
    s
}

#[test]
fn the_timeline_colours_by_category_or_by_allocation() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let s = colours_by_category_or_by_allocation(&mut categorized(), &mut magma(), &["activation", "parameter", "temporary", "unknown"]);
    // Four categories' legend fits beside the status.
    assert!(s.contains("█ activation"), "{s}");
}

/// The largest list of `categorized` has a category column, that of `plain` (a file
/// without categories) none; returns the former.
fn largest_with_category_column(categorized: &mut ViewerData, plain: &mut ViewerData) -> String {
    let s = screen(categorized, &[ViewerKey::NextTab]);
    let head = s.lines().find(|l| l.contains("requested")).unwrap();
    assert!(head.contains("category"), "{s}");
    // Without categories there is no column saying unknown on every row.
    let plain = screen(plain, &[ViewerKey::NextTab]);
    assert!(!plain.contains("category") && !plain.contains("unknown"), "{plain}");
    s
}

/// Row `n` of the largest list.
fn row(s: &str, n: usize) -> &str {
    s.lines().find(|l| l.starts_with(&format!("│{n} "))).unwrap()
}

#[test]
fn the_largest_list_has_a_category_column() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let s = largest_with_category_column(&mut categorized(), &mut magma());
    // The logits-sized block is an activation.
    assert!(row(&s, 1).contains("█ activation") && row(&s, 1).contains("forward (model.py:39)"), "{s}");
}

/// The inspector is the right-hand 48 columns.
fn inspector_column(s: &str) -> Vec<String> {
    s.lines().map(|l| l.chars().skip(112).collect::<String>()).collect()
}

/// The inspector on the top band at the peak whose frames include a Python one (blocks
/// older than the trace have no frames, those made in backward only native ones): the
/// Python frames first, the native ones folded into a line. Returns the keys that got
/// there, the inspector's column and the row of its frames' header.
fn inspect_a_band_with_python_frames(d: &mut ViewerData) -> (Vec<ViewerKey>, Vec<String>, usize) {
    use ViewerKey::*;
    let mut keys = vec![Inspect];
    while !inspector_column(&screen(d, &keys)).iter().any(|l| l.contains(".py:")) {
        keys.insert(0, SelectDown);
        assert!(keys.len() < 40, "no band with Python frames at the peak");
    }
    let side = inspector_column(&screen(d, &keys));
    let header = side.iter().position(|l| l.contains("frames (collapsed; f toggles)")).expect("frames header");
    assert!(side[header + 1].contains(".py:"), "the user's Python line first:\n{}", side.join("\n"));
    assert!(side.iter().any(|l| l.contains("native frames (f shows them)")), "{}", side.join("\n"));
    assert!(!side.iter().any(|l| l.contains("at::") || l.contains("c10::")), "{}", side.join("\n"));
    (keys, side, header)
}

/// After `keys`, unfolded, the frames run past the inspector's box: the title says which
/// of its rows show, and the keys scroll. Returns how many rows there are.
fn unfolded_frames_scroll(d: &mut ViewerData, keys: &[ViewerKey]) -> usize {
    use ViewerKey::*;
    let with = |more: &[ViewerKey]| [keys, more].concat();
    let s = screen(d, &with(&[AllFrames]));
    let rows = s.split(" allocation 1–35/").nth(1).and_then(|t| t.split(' ').next()?.parse().ok()).unwrap_or_else(|| panic!("rows 1–35 of more:\n{s}"));
    assert!(s.contains(&format!(" allocation 1–35/{rows} (pageup/pagedown) ")) && !s.contains("native frames (f"), "{s}");
    let scrolled = screen(d, &with(&[AllFrames, InspectorDown, InspectorDown]));
    assert!(scrolled.contains(&format!(" allocation 11–45/{rows} ")), "{scrolled}");
    let back = screen(d, &with(&[AllFrames, InspectorDown, InspectorDown, InspectorUp, InspectorUp, InspectorUp]));
    assert_eq!(back, s);
    rows
}

#[test]
fn the_inspector_shows_python_frames_first_and_scrolls() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let mut d = ViewerData::open(&common::fixture_path(common::KKAITLYN), None, &FrameRules::off()).unwrap();
    let (keys, side, header) = inspect_a_band_with_python_frames(&mut d);
    insta::assert_snapshot!(side[header - 7..].join("\n"));
    assert_eq!(unfolded_frames_scroll(&mut d, &keys), 182);
}

/// The help over `d` at 80×24: every key and every word of every description whole.
fn help_at_80_by_24(d: &mut ViewerData) -> String {
    let theme = Theme::load("dark").unwrap();
    let s = text(&screen_buffer(d, &[ViewerKey::Help], &theme, 80, 24));
    let keys = KeyMap::<ViewerKey>::default();
    for (key, help) in keys.help_rows() {
        assert!(s.contains(&key), "{key}:\n{s}");
        for word in help.split_whitespace() {
            assert!(s.split(|c: char| c.is_whitespace() || c == '│').any(|w| w == word), "'{word}' of '{help}':\n{s}");
        }
    }
    s
}

#[test]
fn the_help_fits_an_80_by_24_terminal_without_cutting_words() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let s = help_at_80_by_24(&mut magma());
    insta::assert_snapshot!(s);
}

/// Each colour depth, with the name of its screen's snapshot.
const DEPTHS: [(ColorSupport, &str); 2] = [(ColorSupport::Palette256, "viewer_colours_256"), (ColorSupport::TrueColor, "viewer_colours_truecolor")];

/// The 80×24 screen of `d` with its colours at `depth`: the categories drawn stay apart,
/// and 256 colours draw no RGB.
fn colours_at(depth: ColorSupport, d: &mut ViewerData) -> String {
    use vramscope_core::event::Category;
    let theme = Theme::load_at("dark", depth).unwrap();
    let buf = screen_buffer(d, &[], &theme, 80, 24);
    let [a, p, t] = [Category::Activation, Category::Parameter, Category::Temporary].map(|c| theme.category(c));
    assert!(a != p && p != t && a != t, "{depth:?}: {a:?} {p:?} {t:?}");
    if depth == ColorSupport::Palette256 {
        let area = buf.area;
        let rgb = (0..area.height).flat_map(|y| (0..area.width).map(move |x| (x, y))).find(|&c| matches!(buf[c].fg, ratatui::style::Color::Rgb(..)) || matches!(buf[c].bg, ratatui::style::Color::Rgb(..)));
        assert_eq!(rgb, None, "256 colours draw no RGB");
    }
    common::colour_capture::colours(&buf)
}

#[test]
fn viewer_colours_at_256_and_truecolor() {
    if common::skip_without_real_snapshots() {
        return;
    }
    for (depth, name) in DEPTHS {
        insta::assert_snapshot!(name, colours_at(depth, &mut categorized()));
    }
}

/// The what-if panel on a 1.5M-entry trace: the key and the frame after it return with
/// "computing…" (the replays run on a worker, so the screen keeps answering keys), and
/// the rows show once the worker's result lands.
#[test]
fn the_what_if_panel_on_a_long_trace_computes_off_the_ui_thread() {
    use vramscope::screens::viewer::ui::{handle, landed, settle, ViewerUi};
    let mut data = ViewerData::new("long run".into(), common::long_run::long_run(1_500_000), 0);
    assert!(data.snap.device_traces[0].len() >= 1_500_000);
    let mut ui = ViewerUi::new(&data);
    let keys = KeyMap::<ViewerKey>::default();
    let theme = Theme::load("dark").unwrap();
    let draw = |data: &ViewerData, ui: &ViewerUi| text(&draw_to_buffer(160, 40, |f| vramscope::screens::viewer::render::render_viewer(f, data, ui, &keys, &theme)));
    handle(ViewerKey::WhatIf, &mut data, &mut ui, 1);
    let asked = draw(&data, &ui);
    assert!(asked.contains("replaying the trace under each setting: computing…"), "{asked}");
    assert!(!asked.contains("frag@peak"), "{asked}");
    // The screen goes on answering keys meanwhile.
    handle(ViewerKey::NextTab, &mut data, &mut ui, 1);
    assert!(draw(&data, &ui).contains("largest allocations"));
    settle(&mut data, &mut ui);
    assert!(!landed(&mut data, &mut ui), "nothing left to land");
    let done = draw(&data, &ui);
    assert!(done.contains("frag@peak") && done.contains("recorded: defaults"), "{done}");
    assert!(!done.contains("computing…"), "{done}");
}

/// The same checks on a small training run made here (`training_snapshot`): they run in
/// every checkout, with or without the real fixtures.
mod training {
    use super::*;
    use std::path::PathBuf;
    use training_snapshot::TrainingRun;

    /// `run` written to `dir` as `name`, as `vramscope view` is given it.
    fn written(run: TrainingRun, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        training_snapshot::write(run, &path);
        path
    }

    /// The run, opened as `vramscope view train.pickle` opens it.
    fn training() -> ViewerData {
        let dir = tempfile::tempdir().unwrap();
        ViewerData::open(&written(TrainingRun::default(), dir.path(), "train.pickle"), None, &FrameRules::off()).unwrap()
    }

    /// The run as a file whose writer recorded no categories.
    fn uncategorized() -> ViewerData {
        let mut snap = TrainingRun::default().snapshot();
        for e in &mut snap.device_traces[0] {
            e.category = None;
        }
        ViewerData::new("train.pickle".into(), snap, 0)
    }

    /// The categories of the run: those its trace names, and "unknown" for the blocks
    /// alive throughout it.
    const CATEGORIES: [&str; 7] = ["unknown", "parameter", "input", "activation", "temporary", "gradient", "optimizer_state"];

    #[test]
    fn view_timeline() {
        let s = screen(&mut training(), &[]);
        assert!(s.contains("device 0 of 1 · 46 segments, 131 blocks, 1028 trace entries"), "{s}");
        assert!(s.contains("▼ active peak 271 MiB") && s.contains("by category (c: by allocation)"), "{s}");
        // The cursor starts at the peak: in the second step's backward pass.
        assert!(s.contains("action 334 · t+0.028 s · active 271 MiB · in step 1 > backward"), "{s}");
        insta::assert_snapshot!(s);
    }

    #[test]
    fn view_timeline_less_detail_zoomed_with_inspector() {
        let s = less_detail_zoomed_with_inspector(&mut training());
        // Zoomed in around the peak, the inspector on the second band from the top.
        assert!(!s.contains("actions 0–682 of 682") && s.contains("category   "), "{s}");
        insta::assert_snapshot!(s);
    }

    #[test]
    fn view_largest_with_inspector() {
        use ViewerKey::*;
        let s = screen(&mut training(), &[NextTab, SelectDown, Inspect]);
        // The first layer's attention softmax: torch's Python frame, then the model's.
        assert!(row(&s, 2).contains("16.0 MiB") && row(&s, 2).contains("forward (model.py:50)"), "{s}");
        let side = inspector_column(&s);
        let header = side.iter().position(|l| l.contains("frames (collapsed")).expect("frames header");
        assert!(side[header + 1].contains("  softmax (functional.py:2140)") && side[header + 2].contains("  forward (model.py:50)"), "{s}");
        insta::assert_snapshot!(s);
    }

    #[test]
    fn view_segments() {
        use ViewerKey::*;
        let s = screen(&mut training(), &[NextTab, NextTab]);
        assert!(s.contains(" segments · 46 on device 0 "), "{s}");
        // The dataset, on the GPU before recording began, fills most of the first segment.
        assert!(s.contains("│0x7f3a40000000 large 12.0 MiB  11.4 MiB"), "{s}");
        assert_eq!(s.lines().filter(|l| l.starts_with("│0x7f3a")).count(), 31, "as many rows as fit:\n{s}");
        insta::assert_snapshot!(s);
    }

    #[test]
    fn view_categories() {
        use ViewerKey::*;
        let s = screen(&mut training(), &[NextTab, NextTab, NextTab]);
        assert!(s.contains(" bytes at the peak (action 334) by category "), "{s}");
        for c in CATEGORIES {
            assert!(s.lines().any(|l| l.split_whitespace().any(|w| w == c)), "{c}:\n{s}");
        }
        // Activations hold most of the peak.
        assert!(s.lines().nth(3).unwrap().contains("59.0%") && s.lines().nth(3).unwrap().contains("activation"), "{s}");
        insta::assert_snapshot!(s);
    }

    #[test]
    fn view_annotations_on_the_timeline() {
        let s = annotated_timeline(&mut training(), &[ViewerKey::ZoomIn, ViewerKey::ZoomIn]);
        // Phases start (▶) and end (◀) under the plot; the status names those the cursor is in.
        let marks = s.lines().find(|l| l.contains('▲')).expect("the ribbon");
        assert!(marks.contains('◀'), "{s}");
        assert!(s.contains("in step 1 > backward"), "{s}");
        insta::assert_snapshot!(s);
    }

    #[test]
    fn largest_allocation_names_its_model_frame() {
        let dir = tempfile::tempdir().unwrap();
        let s = summary_json_of(&written(TrainingRun::default(), dir.path(), "train.pickle"));
        // The first layer's attention scores, `q @ k.transpose(-2, -1)`.
        largest_is_named(&s, "forward (model.py:48)", "model.py", 48);
        for phase in ["step 0", "forward", "backward", "optimizer"] {
            annotation_is_placed(&s, phase);
        }
    }

    /// `--profile` (issue 29) says on stderr where the summary's time went, stage by stage,
    /// and the report itself is the same.
    #[test]
    fn summary_profile_names_each_stage_and_leaves_the_report_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = written(TrainingRun::default(), dir.path(), "train.pickle");
        let plain = vramscope().args(["view", "--summary", "--json"]).arg(&path).output().unwrap();
        let profiled = vramscope().args(["view", "--summary", "--json", "--profile"]).arg(&path).output().unwrap();
        assert!(profiled.status.success(), "{}", String::from_utf8_lossy(&profiled.stderr));
        assert_eq!(plain.stdout, profiled.stdout);
        let err = String::from_utf8_lossy(&profiled.stderr);
        let line = err.lines().find_map(|l| l.strip_prefix("vramscope: profile: ")).unwrap_or_else(|| panic!("a profile line: {err}"));
        let stages: Vec<(&str, f64)> = line
            .split(" · ")
            .map(|s| {
                let (name, secs) = s.strip_suffix(" s").and_then(|s| s.rsplit_once(' ')).unwrap_or_else(|| panic!("{s}"));
                (name, secs.parse().unwrap())
            })
            .collect();
        let names: Vec<&str> = stages.iter().map(|s| s.0).collect();
        assert_eq!(names, ["open and map", "pre-scan", "decode", "categories", "timeline", "summary", "JSON", "total"]);
        let (parts, total) = (stages[..7].iter().map(|s| s.1).sum::<f64>(), stages[7].1);
        assert!((parts - total).abs() <= 0.004, "the stages add up to the total: {line}");
        // One snapshot's stages: several files are refused, in one line.
        let both = vramscope().args(["view", "--summary", "--profile"]).arg(&path).arg(&path).output().unwrap();
        assert_eq!(both.status.code(), Some(2));
        assert_eq!(String::from_utf8_lossy(&both.stderr).trim(), "vramscope: --profile times one snapshot's summary: give one file");
    }

    #[test]
    fn diff_of_a_file_with_itself_is_empty_and_across_files_reports_peaks() {
        let dir = tempfile::tempdir().unwrap();
        let a = written(TrainingRun::default(), dir.path(), "batch8.pickle");
        let b = written(TrainingRun { batch: 16, ..TrainingRun::default() }, dir.path(), "batch16.pickle");
        let d = diff_reports_peaks(&a, &b);
        // Twice the sequences: the activations at the peak double (all but the 4-byte
        // loss); the parameters, their gradients and Adam's state do not change.
        let at_peak = |c: &str| d["groups"].as_array().unwrap().iter().find(|g| g["name"] == c).unwrap()["bytes"].clone();
        assert_eq!(at_peak("activation")["delta"].as_u64(), at_peak("activation")["a"].as_u64().map(|a| a - 4), "{d}");
        for c in ["parameter", "gradient", "optimizer_state"] {
            assert_eq!(at_peak(c)["delta"], 0, "{c}: {d}");
        }
        assert_eq!(d["grew"][0]["top_frame"], "forward (model.py:50)", "the attention softmax grew most: {d}");
    }

    /// Long enough (about 7 MB) for the reader to report progress several times per pass.
    const LONG: TrainingRun = TrainingRun { steps: 320, batch: 8, device: 0 };

    #[test]
    fn a_read_shows_the_segments_then_growing_prefixes_of_the_trace() {
        let dir = tempfile::tempdir().unwrap();
        read_shows_growing_prefixes(&written(LONG, dir.path(), "long.pickle"));
    }

    #[test]
    fn the_loading_timeline_grows_into_the_loaded_one() {
        let dir = tempfile::tempdir().unwrap();
        loading_timeline_grows_into_the_loaded_one(&written(LONG, dir.path(), "long.pickle"), 60_000, CATEGORIES.len());
    }

    #[test]
    fn view_while_loading() {
        let s = loading_screen("train.pickle", &TrainingRun::default().snapshot(), (45_000, 90_000), 400);
        assert!(s.contains("loading 60%") && s.contains("46 segments, reserved 618 MiB"), "{s}");
        insta::assert_snapshot!(s);
    }

    #[test]
    fn a_snapshot_of_another_gpu_opens_on_its_device() {
        let dir = tempfile::tempdir().unwrap();
        let rank0 = written(TrainingRun::default(), dir.path(), "rank0.pickle");
        let rank1 = written(TrainingRun { device: 1, ..TrainingRun::default() }, dir.path(), "rank1.pickle");
        opens_on_its_device(&rank0, &rank1);
    }

    #[test]
    fn the_timeline_colours_by_category_or_by_allocation() {
        colours_by_category_or_by_allocation(&mut training(), &mut uncategorized(), &CATEGORIES);
    }

    #[test]
    fn the_largest_list_has_a_category_column() {
        let s = largest_with_category_column(&mut training(), &mut uncategorized());
        // The attention scores are a temporary, their softmax an activation.
        assert!(row(&s, 1).contains("█ temporary") && row(&s, 1).contains("forward (model.py:48)"), "{s}");
        assert!(row(&s, 2).contains("█ activation") && row(&s, 2).contains("forward (model.py:50)"), "{s}");
    }

    #[test]
    fn the_inspector_shows_python_frames_first_and_scrolls() {
        let mut d = training();
        // The top band at the peak was made in backward: its native frames show as they are.
        let top = inspector_column(&screen(&mut d, &[ViewerKey::Inspect]));
        assert!(top.iter().any(|l| l.contains("MmBackward0")) && !top.iter().any(|l| l.contains(".py:") || l.contains("native frames (f")), "{}", top.join("\n"));
        let (keys, side, header) = inspect_a_band_with_python_frames(&mut d);
        // Below the backward pass's gradients, the loss: torch's frame, then the model's.
        assert!(side[header + 1].contains("  cross_entropy (functional.py:3494)") && side[header + 2].contains("  forward (model.py:121)"), "{}", side.join("\n"));
        insta::assert_snapshot!(side[header - 8..].join("\n"));
        // All 38 frames, the long C++ names wrapped.
        assert_eq!(unfolded_frames_scroll(&mut d, &keys), 81);
    }

    #[test]
    fn the_help_fits_an_80_by_24_terminal_without_cutting_words() {
        let s = help_at_80_by_24(&mut training());
        insta::assert_snapshot!(s);
    }

    #[test]
    fn viewer_colours_at_256_and_truecolor() {
        for (depth, name) in DEPTHS {
            insta::assert_snapshot!(name, colours_at(depth, &mut training()));
        }
    }
}
