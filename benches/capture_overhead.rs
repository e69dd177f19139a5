//! Capture overhead: step time of the `small` preset on CPU with capture on vs off,
//! interleaved in one run so machine noise hits both alike. Target ≤ 1.02×.
//!
//!   cargo bench --bench capture_overhead -- [rounds] [ctx] [batch]

use std::time::Duration;

use vramscope::train::config::{Attention, DeviceChoice, Mode, Precision, Preset, StepConfig};
use vramscope::train::engine::{Engine, EngineOptions, Report};

/// Median step time of `steps` steps after one warm-up step.
fn median_step_s(capture: bool, ctx: i64, batch: i64, steps: u64) -> f64 {
    let cfg = StepConfig {
        model_name: "small".into(),
        dims: Preset::Small.dims(),
        ctx,
        batch,
        precision: Precision::Fp32,
        mode: Mode::Train,
        attention: Attention::Naive,
    };
    let mut o = EngineOptions::new(cfg);
    o.device = DeviceChoice::Cpu;
    o.steps = Some(steps + 1);
    o.capture = capture;
    let mut engine = Engine::spawn(o).expect("engine");
    let batches = engine.batches.clone();
    let mut times = Vec::new();
    loop {
        while batches.try_recv().is_ok() {}
        match engine.reports.recv_timeout(Duration::from_millis(10)) {
            Ok(Report::Step(s)) if s.step > 0 => times.push(s.step_time_s),
            Ok(Report::Finished) => break,
            Ok(Report::Error(e)) => panic!("{e}"),
            _ => {}
        }
    }
    engine.shutdown();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let rounds: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(4);
    let ctx: i64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(128);
    let batch: i64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    println!("capture overhead: small preset, CPU, ctx {ctx}, batch {batch}, {rounds} interleaved rounds of 3 steps each");
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        // Alternate which goes first so warm caches favour neither.
        let order = if r % 2 == 0 { [true, false] } else { [false, true] };
        for capture in order {
            let t = median_step_s(capture, ctx, batch, 3);
            println!("  round {r}: capture {:<3} {t:.3} s/step", if capture { "on" } else { "off" });
            if capture { on.push(t) } else { off.push(t) }
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (m_on, m_off) = (mean(&on), mean(&off));
    println!("capture on  {m_on:.3} s/step\ncapture off {m_off:.3} s/step\nratio on/off {:.4}× (target ≤ 1.02×)", m_on / m_off);
}
