//! The viewer's frames while the what-if panel computes on a 1.5M-entry trace: the key
//! press and each frame drawn meanwhile (the UI thread's work), against the replays the
//! worker does (what one frame took when drawing computed them). Same process, same run.
//!
//! Run: `cargo bench --bench viewer_frame`

#[path = "../tests/common/long_run.rs"]
mod long_run;

use std::time::{Duration, Instant};

use vramscope::draw::draw_to_buffer;
use vramscope::keys::KeyMap;
use vramscope::screens::viewer::data::ViewerData;
use vramscope::screens::viewer::keys::ViewerKey;
use vramscope::screens::viewer::render::render_viewer;
use vramscope::screens::viewer::ui::{handle, landed, ViewerUi};
use vramscope::theme::Theme;
use vramscope_core::report::whatif::{default_configs, recorded_config, whatif};

const ENTRIES: usize = 1_500_000;
/// The live loop's frame: what a frame must stay under for the screen to feel live.
const FRAME: Duration = Duration::from_millis(50);

fn main() {
    let snap = long_run::long_run(ENTRIES);
    let keys = KeyMap::<ViewerKey>::default();
    let theme = Theme::load("dark").expect("the dark theme");
    for run in 1..=3 {
        let mut data = ViewerData::new("long run".into(), snap.clone(), 0);
        let mut ui = ViewerUi::new(&data);
        let started = Instant::now();
        handle(ViewerKey::WhatIf, &mut data, &mut ui, 1);
        let mut frames = Vec::new();
        loop {
            let t = Instant::now();
            let done = landed(&mut data, &mut ui);
            draw_to_buffer(200, 60, |f| render_viewer(f, &data, &ui, &keys, &theme));
            frames.push(t.elapsed());
            if done {
                break;
            }
            std::thread::sleep(FRAME.saturating_sub(t.elapsed()));
        }
        let landed_after = started.elapsed();
        // What the frame after the key press took when drawing ran the replays itself.
        let t = Instant::now();
        let w = whatif(&snap, 0, &default_configs(&recorded_config(&snap)));
        let inline = t.elapsed() + frames[0];
        std::hint::black_box(w);
        let worst = frames.iter().max().copied().unwrap_or_default();
        println!(
            "run {run}: {} frames while computing, worst {:.1} ms (first {:.1} ms); rows landed after {:.2} s; \
             replays inline in one frame: {:.2} s = {:.0}x the worst frame, {:.0}x the {} ms budget",
            frames.len(),
            worst.as_secs_f64() * 1e3,
            frames[0].as_secs_f64() * 1e3,
            landed_after.as_secs_f64(),
            inline.as_secs_f64(),
            inline.as_secs_f64() / worst.as_secs_f64(),
            inline.as_secs_f64() / FRAME.as_secs_f64(),
            FRAME.as_millis()
        );
    }
}
