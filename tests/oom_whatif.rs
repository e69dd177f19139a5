//! Out-of-memory forensics and `vramscope whatif` on the real fixtures, held to an
//! independent Python reading of the same pickles.

mod common;

use common::viewer::screen;
use common::vramscope;
use vramscope_core::report::frame_rules::FrameRules;
use vramscope::screens::viewer::keys::ViewerKey;
use vramscope::screens::viewer::data::ViewerData;

/// Per device: the recorded peak reserved bytes (final segments rewound through the
/// segment events) and, at each `oom` entry, the request, the device's free bytes,
/// reserved bytes then, and the allocations alive then (requested, and rounded to 512 B
/// blocks as expandable segments split them).
const REFERENCE: &str = r#"
import json, pickle, sys
d = pickle.load(open(sys.argv[1], 'rb'))
grow, shrink = ('segment_alloc', 'segment_map'), ('segment_free', 'segment_unmap')
out = []
for dev, trace in enumerate(d['device_traces']):
    r = sum(s['total_size'] for s in d['segments'] if s['device'] == dev)
    for e in trace:
        r += -e['size'] if e['action'] in grow else e['size'] if e['action'] in shrink else 0
    peak, live, ooms = r, {}, []
    for i, e in enumerate(trace):
        r += e['size'] if e['action'] in grow else -e['size'] if e['action'] in shrink else 0
        peak = max(peak, r)
        if e['action'] == 'alloc':
            live[e['addr']] = e['size']
        elif e['action'] == 'free_completed':
            live.pop(e['addr'], None)
        elif e['action'] == 'oom':
            ooms.append({'entry': i, 'requested': e['size'], 'device_free': e['device_free'], 'reserved': r,
                         'alive_requested': sum(live.values()),
                         'alive_blocks': sum(max(512, (v + 511) // 512 * 512) for v in live.values())})
    out.append({'peak_reserved': peak, 'ooms': ooms})
print(json.dumps(out))
"#;

fn reference(name: &str) -> serde_json::Value {
    common::python_json(REFERENCE, &common::fixture_path(name))
}

fn run_json(args: &[&str], name: &str) -> serde_json::Value {
    let out = vramscope().args(args).arg(common::fixture_path(name)).output().unwrap();
    assert!(out.status.success(), "{args:?} {name}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn run_text(args: &[&str], name: &str) -> String {
    let out = vramscope().args(args).arg(common::fixture_path(name)).output().unwrap();
    assert!(out.status.success(), "{args:?} {name}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_oom_devices_summary_starts_with_the_request_and_the_free_bytes() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let want = &reference(common::CONSTRUCTOR_SUN)[1]["ooms"][0];
    let text = run_text(&["view", "--summary", "--device", "1"], common::CONSTRUCTOR_SUN);
    let second = text.lines().nth(1).unwrap();
    assert!(second.starts_with("OUT OF MEMORY") && second.contains("4.94 GiB requested") && second.contains("91.2 MiB free"), "{text}");
    assert!(text.lines().nth(3).unwrap().contains("too much alive"), "{text}");
    let s = run_json(&["view", "--summary", "--json", "--device", "1"], common::CONSTRUCTOR_SUN);
    let oom = &s["oom"][0];
    assert_eq!(s["oom"].as_array().unwrap().len(), 1);
    assert_eq!(oom["entry"], want["entry"]);
    assert_eq!(oom["requested_bytes"], want["requested"]);
    assert_eq!(oom["requested_bytes"], 5_308_694_528u64);
    assert_eq!(oom["device_free_bytes"], want["device_free"]);
    assert_eq!(oom["device_free_bytes"], 95_682_560u64);
    assert_eq!(oom["reserved_bytes"], want["reserved"]);
    assert_eq!(oom["allocated_bytes"], want["alive_blocks"]);
    assert_eq!(oom["modelled_exactly"], true);
    // Allocated plus the request is more than reserved plus free: too much alive.
    let (alloc, req, res, free) = (want["alive_blocks"].as_u64().unwrap(), want["requested"].as_u64().unwrap(), want["reserved"].as_u64().unwrap(), want["device_free"].as_u64().unwrap());
    assert!(alloc + req > res + free);
    assert_eq!(oom["cause"], "too_much_alive");
    let by_site: u64 = oom["by_top_frame"]["groups"].as_array().unwrap().iter().map(|g| g["bytes"].as_u64().unwrap()).sum();
    assert_eq!(by_site, want["alive_requested"].as_u64().unwrap(), "every live byte has a call site");
    assert_eq!(oom["by_top_frame"]["groups"][0]["name"], "update_nodes (models.py:174)");
    // The devices that did not run out say nothing of it.
    for device in ["0", "2"] {
        let s = run_json(&["view", "--summary", "--json", "--device", device], common::CONSTRUCTOR_SUN);
        assert_eq!(s["oom"], serde_json::json!([]), "device {device}");
    }
}

#[test]
fn whatifs_first_row_equals_the_recorded_peak_reserved_on_every_real_fixture() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let cases = [(common::KKAITLYN, 0), (common::MAGMA27, 0), (common::CONSTRUCTOR_SUN, 0), (common::CONSTRUCTOR_SUN, 1), (common::CONSTRUCTOR_SUN, 2)];
    for (name, device) in cases {
        let want = &reference(name)[device];
        let rows = run_json(&["whatif", "--json", "--device", &device.to_string()], name);
        let first = &rows[0];
        assert_eq!(first["recorded"], true);
        assert_eq!(first["peak_reserved_bytes"], want["peak_reserved"], "{name} device {device}");
        assert_eq!(first["self_check"]["matches_recording"], true, "{name} device {device}: {first}");
        // Default rows: expandable segments flipped, and a max_split_size.
        assert_eq!(rows.as_array().unwrap().len(), 3, "{name}");
        for r in rows.as_array().unwrap() {
            for key in ["alloc_conf", "peak_reserved_bytes", "peak_active_bytes", "fragmentation_at_peak", "largest_free_block_bytes", "oom_would_fit"] {
                assert!(r.get(key).is_some(), "{key} in {r}");
            }
            assert!(r["peak_active_bytes"].as_u64() <= r["peak_reserved_bytes"].as_u64());
        }
        let oom = want["ooms"].as_array().unwrap().first();
        match oom {
            None => assert!(rows.as_array().unwrap().iter().all(|r| r["oom_would_fit"].is_null())),
            Some(o) => {
                assert_eq!(first["oom_would_fit"], false);
                assert_eq!(first["out_of_memory_at_entry"], o["entry"]);
                // Every row has the device memory of the recording, never more.
                let capacity = o["reserved"].as_u64().unwrap() + o["device_free"].as_u64().unwrap();
                for r in rows.as_array().unwrap() {
                    assert!(r["peak_reserved_bytes"].as_u64().unwrap() <= capacity, "{r}");
                    assert!(r["oom_would_fit"].is_boolean());
                }
            }
        }
    }
}

#[test]
fn whatif_says_when_a_recording_cannot_be_replayed() {
    if common::skip_without_real_snapshots() {
        return;
    }
    // SnapViewer's file is synthetic: its trace holds far more at once than it reserved.
    let rows = run_json(&["whatif", "--json"], common::SNAPVIEWER);
    let check = &rows[0]["self_check"];
    assert_eq!(check["matches_recording"], false);
    assert_eq!(check["recording_inconsistent"], true);
    assert_eq!(check["recorded_peak_reserved_bytes"], reference(common::SNAPVIEWER)[0]["peak_reserved"]);
    let text = run_text(&["whatif"], common::SNAPVIEWER);
    assert!(text.contains("self-check FAILED") && text.contains("cannot be replayed"), "{text}");
}

#[test]
fn whatif_table_names_each_setting_and_the_oom_verdict() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let text = run_text(&["whatif", "--device", "1", "--alloc-conf", "expandable_segments:False", "--alloc-conf", "expandable_segments:True,roundup_power2_divisions:4"], common::CONSTRUCTOR_SUN);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[1].starts_with("OOM at trace entry 421: 4.94 GiB requested, 91.2 MiB free"), "{text}");
    assert!(lines[2].starts_with("settings") && lines[2].contains("reserved@OOM") && lines[2].ends_with("OOM request"), "{text}");
    assert!(lines[3].starts_with("recorded: expandable_segments:True") && lines[3].ends_with("does not fit"), "{text}");
    assert!(lines[4].starts_with("expandable_segments:False "), "{text}");
    assert!(lines[5].starts_with("expandable_segments:True,roundup_power2_divisions:4 "), "{text}");
    assert!(lines[6].starts_with("self-check: the recorded settings reproduce the recording"), "{text}");
}

#[test]
fn a_bad_alloc_conf_names_the_option_and_exits_2() {
    if common::skip_without_real_snapshots() {
        return;
    }
    for (conf, want) in [("max_split_size_mb:10", "max_split_size_mb"), ("expandable:True", "unknown option `expandable`")] {
        vramscope()
            .args(["whatif", "--alloc-conf", conf])
            .arg(common::fixture_path(common::MAGMA27))
            .assert()
            .failure()
            .code(2)
            .stderr(predicates::str::contains(want));
    }
    // A device without a trace has nothing to replay.
    vramscope()
        .args(["whatif", "--device", "3"])
        .arg(common::fixture_path(common::CONSTRUCTOR_SUN))
        .assert()
        .failure()
        .code(2)
        .stderr(predicates::str::contains("device 3 has no trace entries"));
}

fn constructor(device: usize) -> ViewerData {
    ViewerData::open(&common::fixture_path(common::CONSTRUCTOR_SUN), Some(device), &FrameRules::off()).unwrap()
}

#[test]
fn the_viewer_marks_the_oom_and_explains_it() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let mut data = constructor(1);
    let s = screen(&mut data, &[]);
    assert!(s.lines().next().unwrap().contains("OUT OF MEMORY at action 287"), "{s}");
    assert!(s.lines().any(|l| l.contains('!')), "the timeline marks it: {s}");
    assert!(s.lines().last().unwrap().contains("o why OOM"), "{s}");
    let s = screen(&mut data, &[ViewerKey::OomReport]);
    for want in ["out of memory · device 1", "4.94 GiB at trace entry 421", "91.2 MiB", "too much alive", "update_nodes (models.py:174)"] {
        assert!(s.contains(want), "{want}: {s}");
    }
    insta::assert_snapshot!(s);
    // The key moved the cursor to the OOM; closing the report shows it there.
    let s = screen(&mut data, &[ViewerKey::OomReport, ViewerKey::OomReport]);
    assert!(s.contains("action 287") && s.contains("out of memory just before"), "{s}");
    // A device that did not run out says so.
    let s = screen(&mut constructor(0), &[ViewerKey::OomReport]);
    assert!(s.contains("no out-of-memory entry"), "{s}");
    assert!(!s.lines().last().unwrap().contains("why OOM"), "{s}");
}

#[test]
fn the_viewer_shows_the_whatif_rows() {
    if common::skip_without_real_snapshots() {
        return;
    }
    let s = screen(&mut constructor(1), &[ViewerKey::WhatIf]);
    for want in ["what if · device 1", "recorded: expandable_segments:True", "does not fit", "fails earlier, at entry 420", "self-check: the recorded settings reproduce the recording"] {
        assert!(s.contains(want), "{want}: {s}");
    }
    insta::assert_snapshot!(s);
    // The same key closes it.
    let s = screen(&mut constructor(1), &[ViewerKey::WhatIf, ViewerKey::WhatIf]);
    assert!(!s.contains("what if · device"), "{s}");
}
