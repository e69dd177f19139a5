//! `vramscope view` at the sizes users have (issue 34): every view, panel and overlay at
//! 80×24 and 120×36, on a training run made here that ends in an out-of-memory. Headers and
//! titles give way field by field: no number is ever cut, and the OOM never falls off.

mod common;
#[allow(dead_code)]
#[path = "common/training_snapshot.rs"]
mod training_snapshot;

use common::viewer::{screen_buffer, text};
use vramscope::screens::viewer::data::ViewerData;
use vramscope::screens::viewer::keys::ViewerKey;
use vramscope::theme::Theme;
use vramscope_core::event::Action;
use vramscope_core::snapshot::model::TraceEntry;
use training_snapshot::TrainingRun;

const GIB: u64 = 1 << 30;

/// The run, then a 20 GiB request the device could not meet, as PyTorch records it.
fn ends_in_oom() -> ViewerData {
    let mut snap = TrainingRun::default().snapshot();
    let trace = &mut snap.device_traces[0];
    let last = trace.last().cloned().expect("a trace");
    trace.push(TraceEntry { action: Action::Oom, addr: 300 << 20, size: 20 * GIB, time_us: last.time_us + 10, ..last });
    ViewerData::new("train_then_oom.pickle".into(), snap, 0)
}

#[test]
fn every_view_reads_at_80x24_and_120x36() {
    let views: [(&str, &[ViewerKey]); 7] = [
        ("timeline", &[]),
        ("largest", &[ViewerKey::NextTab]),
        ("segments", &[ViewerKey::NextTab, ViewerKey::NextTab]),
        ("categories", &[ViewerKey::NextTab, ViewerKey::NextTab, ViewerKey::NextTab]),
        ("oom_report", &[ViewerKey::OomReport]),
        ("what_if", &[ViewerKey::WhatIf]),
        ("help", &[ViewerKey::Help]),
    ];
    let theme = Theme::load("dark").unwrap();
    for (name, keys) in views {
        for (w, h) in [(80u16, 24u16), (120, 36)] {
            let mut data = ends_in_oom();
            let screen = text(&screen_buffer(&mut data, keys, &theme, w, h));
            let lines: Vec<&str> = screen.lines().collect();
            // The help covers an 80×24 screen whole; its rows are the check.
            if name == "help" {
                assert!(screen.contains("this help") && screen.contains("quit"), "{name} at {w}×{h}:\n{screen}");
                insta::assert_snapshot!(format!("viewer_{name}_{w}x{h}"), screen);
                continue;
            }
            assert!(lines[0].contains("OUT OF MEMORY at action"), "{name} at {w}×{h}: the OOM fell off the header:\n{screen}");
            for l in &lines[..2] {
                assert!(!l.contains('…'), "{name} at {w}×{h}: a header field was cut: {l}");
            }
            assert!(lines[1].contains("active ") && lines[1].contains("reserved "), "{name} at {w}×{h}:\n{screen}");
            if name == "what_if" {
                // Every setting whole, across lines if it must be.
                for setting in ["expandable_segments:True", "max_split_size_mb:"] {
                    assert!(screen.contains(setting), "{name} at {w}×{h}: '{setting}' cut:\n{screen}");
                }
                assert!(screen.contains("does not fit") || screen.contains("fits"), "{name} at {w}×{h}: the verdict column:\n{screen}");
            }
            insta::assert_snapshot!(format!("viewer_{name}_{w}x{h}"), screen);
        }
    }
}

/// The cursor on the action after an out-of-memory keeps its '!' in sight (it hid under
/// the cursor), and a trace that ends in one marks its last action.
#[test]
fn the_oom_marker_shows_under_the_cursor_and_at_the_end() {
    let theme = Theme::load("dark").unwrap();
    let mut data = ends_in_oom();
    let screen = text(&screen_buffer(&mut data, &[], &theme, 120, 36));
    assert!(screen.lines().any(|l| l.contains('!') && l.contains('▲')), "no '!' for the OOM at the end:\n{screen}");
    // An OOM just before the peak's action, where `p` puts the cursor.
    let mut snap = TrainingRun::default().snapshot();
    let tl = vramscope_core::snapshot::timeline::Timeline::from_snapshot(&snap, 0);
    let at = tl.event_positions[tl.peak_index];
    let before = snap.device_traces[0][at].clone();
    snap.device_traces[0].insert(at, TraceEntry { action: Action::Oom, addr: 300 << 20, size: 20 * GIB, ..before });
    let mut data = ViewerData::new("oom_at_peak.pickle".into(), snap, 0);
    let buf = screen_buffer(&mut data, &[ViewerKey::JumpToPeak], &theme, 120, 36);
    let screen = text(&buf);
    let ribbon = screen.lines().position(|l| l.contains('!')).unwrap_or_else(|| panic!("no '!' on the ribbon:\n{screen}"));
    assert!(!screen.lines().nth(ribbon).unwrap().contains('▲'), "the cursor drew over the '!':\n{screen}");
    assert!(screen.contains("out of memory just before"), "{screen}");
}
