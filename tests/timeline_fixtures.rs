//! The Active Memory Timeline on real snapshots against an independent Python version of
//! memory_viz's algorithm (reading the pickle directly).

mod common;


use vramscope::snapshot::timeline::Timeline;

const REFERENCE: &str = r#"
import json, pickle, sys
d = pickle.load(open(sys.argv[1], 'rb'))
dev = 0
events = []
for e in d['device_traces'][dev]:
    if (e['action'] == 'free_completed' and events and events[-1]['action'] == 'free_requested'
            and events[-1]['addr'] == e['addr']):
        events[-1]['action'] = 'free'
        continue
    events.append(dict(e))
sizes, initial, actions, open_ = [], [], [], {}
for e in events:
    if e['action'] == 'alloc':
        sizes.append(e['size']); open_[e['addr']] = len(sizes) - 1; actions.append(len(sizes) - 1)
    elif e['action'] in ('free', 'free_completed'):
        if e['addr'] in open_:
            actions.append(open_.pop(e['addr']))
        else:
            sizes.append(e['size']); initial.append(len(sizes) - 1); actions.append(len(sizes) - 1)
for seg in d['segments']:
    if seg['device'] != dev:
        continue
    addr = seg['address']
    for b in seg['blocks']:
        if b['state'] == 'active_allocated' and addr not in open_:
            sizes.append(b['requested_size']); initial.append(len(sizes) - 1)
        addr += b['size']
alive = set(initial)
total = sum(sizes[i] for i in initial)
during = []
for el in actions:
    if el in alive:
        during.append(total); total -= sizes[el]; alive.discard(el)
    else:
        alive.add(el); total += sizes[el]; during.append(total)
print(json.dumps({'during': during, 'elements': len(sizes), 'initial': len(initial)}))
"#;

fn check(name: &str) {
    let want: serde_json::Value = common::python_json(REFERENCE, &common::fixture_path(name));
    let during: Vec<u64> = serde_json::from_value(want["during"].clone()).unwrap();
    let t = Timeline::from_snapshot(&common::load(name), 0);
    let got: Vec<u64> = (0..t.total_events).map(|i| t.totals_at(i)).collect();
    assert_eq!(got.len(), during.len(), "{name}: action count");
    assert_eq!(got, during, "{name}: totals per action");
    let peak = *during.iter().max().unwrap();
    assert_eq!(t.peak_bytes, peak, "{name}: peak");
    assert_eq!(
        t.peak_index,
        during.iter().position(|&v| v == peak).unwrap()
    );
    assert_eq!(
        t.allocations.len() as u64,
        want["elements"].as_u64().unwrap()
    );
    let initial = t.allocations.iter().filter(|a| a.alive_at_start).count() as u64;
    assert_eq!(initial, want["initial"].as_u64().unwrap());
    eprintln!(
        "{name}: {} actions, {} allocations ({initial} alive at start), peak {peak} B at action {}",
        t.total_events,
        t.allocations.len(),
        t.peak_index
    );
}

#[test]
fn kkaitlyn_timeline_matches_memory_viz() {
    check(common::KKAITLYN);
}

#[test]
fn magma27_timeline_matches_memory_viz() {
    check(common::MAGMA27);
}

#[test]
fn snapviewer_timeline_matches_memory_viz() {
    check(common::SNAPVIEWER);
}
