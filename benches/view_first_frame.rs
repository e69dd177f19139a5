//! Time from nothing to `vramscope view`'s first frame on a ~1 GB snapshot (the loading
//! screen's first frame with the timeline, and the loaded viewer's), and the peak RSS it
//! takes: the same library calls the viewer makes, drawn into a 200×60 TestBackend buffer.
//!
//! Generates (once, cached under target/bench-data/) a snapshot-shaped pickle with Python:
//! 4000 segments, millions of trace entries whose allocs and frees pair up the way a
//! training loop's do, and 20-40 frames per entry drawn from shared frame dicts. Each
//! measurement runs in a fresh child process so VmHWM is that run's alone. Python's
//! `pickle.load` of the same file is timed in the same run, for the ratio.
//!
//! Run: `cargo bench --bench view_first_frame`

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use vramscope::keys::KeyMap;
use vramscope::screens::viewer::keys::ViewerKey;
use vramscope::screens::viewer::loading::{spawn_loader, Loading};
use vramscope::screens::viewer::ui::ViewerUi;
use vramscope::screens::viewer::run::LOADING_REDRAW;
use vramscope::draw::draw_to_buffer;
use vramscope::screens::viewer::render::{render_loading, render_viewer};
use vramscope::theme::Theme;

const ENTRIES: usize = 4_500_000;

const GENERATOR: &str = r#"
import os, pickle, random, sys
random.seed(11)
out, n = sys.argv[1], int(sys.argv[2])
frames = [{'name': f'layer_{i}.forward', 'filename': f'/home/user/project/pkg/module_{i % 300}.py', 'line': (i * 37) % 2000}
          for i in range(5000)]
stacks = [random.sample(frames, random.randint(20, 40)) for _ in range(20000)]
base = 0x7f0000000000
segments = []
for s in range(4000):
    addr = base + s * (20 << 20)
    blocks = [{'address': addr + b * (2 << 20), 'size': 2 << 20, 'requested_size': (2 << 20) - b * 512,
               'state': ('active_allocated', 'inactive')[b % 2], 'frames': list(random.choice(stacks))}
              for b in range(10)]
    segments.append({'device': 0, 'address': addr, 'total_size': 20 << 20, 'allocated_size': 10 << 20,
                     'active_size': 10 << 20, 'requested_size': 10 << 20, 'stream': 0, 'segment_type': 'large',
                     'segment_pool_id': (0, 0), 'is_expandable': False, 'frames': list(random.choice(stacks)), 'blocks': blocks})
trace, live, nxt, t = [], [], base + (1 << 40), 1759252584402607
def entry(action, addr, size, stack):
    global t
    t += 3
    return {'action': action, 'addr': addr, 'size': size, 'stream': 0, 'time_us': t,
            'compile_context': '', 'user_metadata': '', 'frames': list(stack)}
while len(trace) < n:
    # Activations pile up (forward) then drain (backward), around a steady core.
    grow = (len(trace) // 200000) % 2 == 0
    if not live or random.random() < (0.62 if grow else 0.4):
        stack = random.choice(stacks)
        size = random.choice((512, 4096, 1 << 20, 3 << 20, 16 << 20)) + random.randrange(512)
        trace.append(entry('alloc', nxt, size, stack))
        live.append((nxt, size, stack))
        nxt += 1 << 25
        if len(trace) % 997 == 0:
            trace.append(entry('segment_alloc', nxt, 20 << 20, stack))
    else:
        addr, size, stack = live.pop(random.randrange(len(live)))
        trace.append(entry('free_requested', addr, size, stack))
        trace.append(entry('free_completed', addr, size, stack))
settings = {'PYTORCH_CUDA_ALLOC_CONF': '', 'max_split_size': -1, 'garbage_collection_threshold': 0.0,
            'expandable_segments': False, 'roundup_power2_divisions': {str(1 << k): 0 for k in range(16)}}
marks = [{'name': 'Optimizer.step#AdamW.step', 'stage': st, 'device': 0, 'time_us': 1759252584402607 + k * 300000}
         for k, st in enumerate(['START', 'END'] * 20)]
snap = {'segments': segments, 'device_traces': [trace], 'allocator_settings': settings, 'external_annotations': marks}
with open(out + '.tmp', 'wb') as f:
    pickle.dump(snap, f, protocol=4)
os.replace(out + '.tmp', out)
"#;

/// Child mode: opens the file from a cold process the way the viewer does (reader thread,
/// loading screen redrawn every `LOADING_REDRAW` and at the first events, then the loaded
/// viewer's first frame); prints the first loading frame with timeline content, the
/// entries it showed, the loaded viewer's frame (all in seconds from the start), peak
/// RSS in KiB and the trace's entries.
fn child(path: &Path) {
    let keys = KeyMap::<ViewerKey>::default();
    let theme = Theme::load("dark").unwrap();
    let t0 = Instant::now();
    // The built-in frame rules, as `vramscope view` runs them.
    let rx = spawn_loader(path.to_path_buf(), None, std::sync::Arc::new(vramscope_core::report::frame_rules::FrameRules::default()));
    let mut loading = Loading::new("bench".into());
    let mut first: Option<(f64, usize)> = None;
    let mut last_draw = Instant::now();
    let data = loop {
        if let Some(done) = loading.receive(&rx, Duration::from_millis(50)) {
            break done.expect("load");
        }
        let events = loading.timeline().map_or(0, |tl| tl.total_events);
        if (first.is_none() && events > 0) || last_draw.elapsed() >= LOADING_REDRAW {
            loading.refresh_detail();
            let buf = draw_to_buffer(200, 60, |f| render_loading(f, &loading, &keys, &theme));
            last_draw = Instant::now();
            if first.is_none() && events > 0 {
                let text: String = (0..60).flat_map(|y| (0..200).map(move |x| (x, y))).map(|p| buf[p].symbol().to_string()).collect();
                assert!(text.contains("▼ active peak"), "the first loading frame shows the timeline and its peak");
                first = Some((t0.elapsed().as_secs_f64(), loading.entries));
            }
        }
    };
    let ui = ViewerUi::new(&data);
    let buf = draw_to_buffer(200, 60, |f| render_viewer(f, &data, &ui, &keys, &theme));
    let full = t0.elapsed().as_secs_f64();
    assert!(buf.area.width == 200);
    let (first_s, first_entries) = first.expect("a loading frame before the end");
    println!("{first_s} {first_entries} {full} {} {}", common::status_kib("VmHWM"), data.snap.trace_entry_count());
}

/// Seconds for one `pickle.load` (garbage collector on, as Python users run it),
/// measured inside Python (interpreter start excluded).
const PY_LOAD: &str = r#"
import pickle, time, sys
with open(sys.argv[1], 'rb') as f:
    t = time.perf_counter()
    pickle.load(f)
    print(time.perf_counter() - t)
"#;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        return child(Path::new(&args[i + 1]));
    }
    let path = common::generated(&format!("view-{ENTRIES}.pickle"), GENERATOR, &ENTRIES.to_string());
    let size = std::fs::metadata(&path).expect("data file").len();
    println!("file: {} ({:.1} MB)", path.display(), size as f64 / 1e6);
    println!("run  first_frame_s  entries_shown  loaded_frame_s  peak_rss_MB  rss/file  entries");
    let mut loaded = f64::INFINITY;
    for run in 1..=3 {
        let out = Command::new(std::env::current_exe().unwrap()).arg("--child").arg(&path).output().expect("child");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: Vec<f64> = String::from_utf8_lossy(&out.stdout).split_whitespace().map(|x| x.parse().unwrap()).collect();
        let rss = v[3] * 1024.0;
        println!("{run}  {:.3}  {}  {:.3}  {:.1}  {:.2}x  {}", v[0], v[1], v[2], rss / 1e6, rss / size as f64, v[4]);
        loaded = loaded.min(v[2]);
    }
    let out = Command::new(common::python()).args(["-c", PY_LOAD]).arg(&path).output().expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let py: f64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("python timing");
    println!("python pickle.load of the same file: {py:.3} s; the loaded viewer's first frame (best run) is {:.2}x faster", py / loaded);
}
