//! What one step of the CS336 model computes and the least it must move, by arithmetic
//! (nothing here is measured): FLOPs per step and the arithmetic intensity (FLOPs per byte)
//! that says whether a step is bound by compute or by memory bandwidth.

use std::fmt::Write;

use serde::Serialize;

use crate::format::bytes;
use crate::step_config::{Mode, StepConfig};

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Compute {
    /// One forward pass: every matmul's 2·m·n·k, the attention's two [t, t] products.
    pub forward_flops: f64,
    /// The configuration's mode: a forward pass, or forward plus backward (twice the
    /// forward's matmuls: the inputs' and the weights' gradients), plus the checkpointed
    /// blocks' forward run again in backward.
    pub step_flops: f64,
    /// What checkpointing's recompute adds to a training step (0 without it).
    pub recompute_flops: f64,
    /// The least the step reads and writes (`render` lists what is counted).
    pub bytes_moved: u64,
    pub flops_per_byte: f64,
}

/// `activation_bytes`: what the forward pass saves (a training step writes it once and
/// reads it once in backward; a forward pass makes and reads the same tensors once each).
pub fn compute(cfg: &StepConfig, parameters: u64, activation_bytes: u64) -> Compute {
    let d = cfg.dims;
    let (b, t) = (cfg.batch as f64, cfg.ctx as f64);
    let (dm, f, v, layers) = (d.d_model as f64, d.d_ff as f64, d.vocab as f64, d.layers as f64);
    // Per token: q, k, v and the output projection (4·d²), SwiGLU's three matrices (3·d·f),
    // the LM head (v·d); per layer and sequence, Q·Kᵀ and weights·V over all t² pairs (the
    // naive core computes the masked half too).
    let block_flops = 2.0 * b * t * (4.0 * dm * dm + 3.0 * dm * f) + 4.0 * b * t * t * dm;
    let forward_flops = layers * block_flops + 2.0 * b * t * v * dm;
    let train = cfg.mode == Mode::Train;
    let recompute_flops = if train { cfg.checkpointing.blocks(d.layers) as f64 * block_flops } else { 0.0 };
    let step_flops = if train { 3.0 * forward_flops + recompute_flops } else { forward_flops };
    // Each fp32 parameter read in forward; in training read again and its gradient written
    // in backward, then AdamW reads parameter, gradient and both moments and writes
    // parameter and moments (7 × 4 B).
    let per_parameter = if train { 4 + 8 + 28 } else { 4 };
    let bytes_moved = parameters * per_parameter + 2 * activation_bytes;
    Compute { forward_flops, step_flops, recompute_flops, bytes_moved, flops_per_byte: step_flops / bytes_moved.max(1) as f64 }
}

/// `1.23 TFLOP`.
fn flop(x: f64) -> String {
    let (div, unit) = [(1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP")].into_iter().find(|(d, _)| x >= *d).unwrap_or((1.0, "FLOP"));
    format!("{:.2} {unit}", x / div)
}

/// The report's section.
pub fn render(c: &Compute, mode: Mode) -> String {
    let mut s = String::from("### Compute (analytic: counted, not measured)\n\n| what | value |\n|---|---:|\n");
    let _ = writeln!(s, "| forward pass (2 FLOPs per multiply-add: matmuls and the t² attention products) | {} |", flop(c.forward_flops));
    if mode == Mode::Train {
        let _ = writeln!(s, "| training step (backward is twice the forward) | {} |", flop(c.step_flops));
        if c.recompute_flops > 0.0 {
            let _ = writeln!(s, "| of which checkpointed blocks' forward, run again in backward | {} |", flop(c.recompute_flops));
        }
    }
    let moved = match mode {
        Mode::Train => "weights read twice, gradients written, AdamW's 7 × 4 B per parameter, saved activations written and read",
        Mode::Forward => "weights read once, each activation written and read once",
    };
    let _ = writeln!(s, "| bytes moved at least ({moved}) | {} |", bytes(c.bytes_moved));
    let _ = writeln!(s, "| arithmetic intensity | {:.0} FLOP/byte |", c.flops_per_byte);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step_config::{Attention, Precision, Preset};

    #[test]
    fn flops_follow_the_cs336_count() {
        // GPT-2 small's shapes at ctx 1024, batch 1: 2 · tokens · matmul parameters, plus
        // 4 · t² · d per layer.
        let cfg = StepConfig {
            model_name: "small".into(),
            dims: Preset::Small.dims(),
            ctx: 1024,
            batch: 1,
            precision: Precision::Fp32,
            mode: Mode::Forward,
            attention: Attention::Naive,
            optimizer: Default::default(),
            checkpointing: Default::default(),
        };
        let d = cfg.dims;
        let c = compute(&cfg, 1, 0);
        let matmul = (d.layers * (4 * d.d_model * d.d_model + 3 * d.d_model * d.d_ff) + d.vocab * d.d_model) as f64;
        let want = 2.0 * 1024.0 * matmul + (d.layers * 4 * 1024 * 1024 * d.d_model) as f64;
        let near = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b;
        assert!(near(c.forward_flops, want), "{} vs {want}", c.forward_flops);
        let train = compute(&StepConfig { mode: Mode::Train, ..cfg.clone() }, 1000, 500);
        assert!(near(train.step_flops, 3.0 * want), "backward twice the forward");
        // Every block checkpointed: the blocks' forward (all but the LM head's) once more.
        let ckpt = compute(&StepConfig { mode: Mode::Train, checkpointing: crate::step_config::Checkpointing::Every(1), ..cfg.clone() }, 1000, 500);
        let head = 2.0 * 1024.0 * (d.vocab * d.d_model) as f64;
        assert!(near(ckpt.recompute_flops, want - head), "{} vs {}", ckpt.recompute_flops, want - head);
        assert!(near(ckpt.step_flops, 4.0 * want - head));
        assert_eq!(train.bytes_moved, 1000 * 40 + 1000);
        assert_eq!(flop(2.5e12), "2.50 TFLOP");
    }
}
