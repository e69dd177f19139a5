//! `vramscope estimate`: the memory of a configuration worked out from the model's code
//! (src/train/model.rs) without running it — what each op keeps for backward, what lives
//! only for a moment, and what the optimizer adds.

use serde::Serialize;

use crate::step_config::{Attention, Mode, Precision, StepConfig, MAX_BATCH, MAX_CTX};

const F32: u64 = 4;
const BF16: u64 = 2;

/// One tensor (or a group of same-shaped tensors) the estimate counts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Term {
    pub name: String,
    /// Shape and element size, e.g. "[4, 512, 2560] fp32".
    pub shape: String,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    pub config: StepConfig,
    pub parameters: u64,
    pub parameter_bytes: u64,
    pub gradient_bytes: u64,
    /// AdamW's two moments, fp32.
    pub adamw_bytes: u64,
    /// bf16 copies of the matmul weights autocast makes (0 in fp32).
    pub weight_copy_bytes: u64,
    /// Token ids and targets, RoPE tables.
    pub input_bytes: u64,
    /// What one transformer block saves for backward, tensor by tensor.
    pub per_layer: Vec<Term>,
    pub per_layer_bytes: u64,
    /// Saved outside the blocks (final norm, log-probabilities).
    pub outside_layers: Vec<Term>,
    /// Everything the forward pass saves for backward (train mode).
    pub activation_bytes: u64,
    /// One layer's [batch, heads, ctx, ctx] attention scores (0 with fused attention).
    pub attention_scores_bytes: u64,
    /// The fp32 residual stream tensor [batch, ctx, d_model] and how its size is reached.
    pub residual_bytes: u64,
    pub residual_derivation: String,
    /// Peak of a no-grad forward pass.
    pub forward_peak_bytes: u64,
    /// Peak of a steady-state training step (forward, backward, AdamW step), by phase.
    pub train_forward_peak_bytes: u64,
    pub backward_peak_bytes: u64,
    pub optimizer_peak_bytes: u64,
    pub step_peak_bytes: u64,
}

impl Estimate {
    /// The peak of the configuration's own mode.
    pub fn peak_bytes(&self) -> u64 {
        match self.config.mode {
            Mode::Forward => self.forward_peak_bytes,
            Mode::Train => self.step_peak_bytes,
        }
    }
}

fn term(name: impl Into<String>, dims: &[i64], elem: u64, count: u64) -> Term {
    let n: u64 = dims.iter().map(|d| *d as u64).product();
    let dtype = match elem {
        1 => "bool",
        2 => "bf16",
        8 => "int64",
        _ => "fp32",
    };
    let shape = dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
    let times = if count > 1 { format!("{count} × ") } else { String::new() };
    Term { name: name.into(), shape: format!("{times}[{shape}] {dtype}"), bytes: n * elem * count }
}

fn sum(terms: &[Term]) -> u64 {
    terms.iter().map(|t| t.bytes).sum()
}

pub fn estimate(cfg: &StepConfig) -> Estimate {
    let d = cfg.dims;
    let (b, t, dm, f, h, v) = (cfg.batch, cfg.ctx, d.d_model, d.d_ff, d.heads, d.vocab);
    let dh = dm / h;
    let bf16 = cfg.precision == Precision::Bf16;
    // Matmuls run in the compute dtype; the residual stream, RMSNorm and log-softmax stay fp32.
    let c = if bf16 { BF16 } else { F32 };
    let (vd, dd, df) = ((v * dm) as u64, (dm * dm) as u64, (dm * f) as u64);
    let layers = d.layers as u64;
    let parameters = 2 * vd + layers * (4 * dd + 3 * df + 2 * dm as u64) + dm as u64;
    let matmul_weights = layers * (4 * dd + 3 * df) + vd;
    let weight_copy_bytes = if bf16 { matmul_weights * BF16 } else { 0 };
    let input_bytes = 2 * (b * t) as u64 * 8 + 2 * (t * dh / 2) as u64 * F32;

    let btd = [b, t, dm];
    let btf = [b, t, f];
    let bt1 = [b, t, 1];
    // A linear's input is saved once in fp32; autocast casts it once per linear and each
    // bf16 copy is saved.
    let linear_input = |name: &str, users: u64| {
        if bf16 {
            term(format!("{name} (bf16 copy per linear)"), &btd, BF16, users)
        } else {
            term(name, &btd, F32, 1)
        }
    };
    let mut per_layer = vec![
        term("input residual x", &btd, F32, 1),
        term("ln1 x·rms", &btd, F32, 1),
        term("ln1 1/rms", &bt1, F32, 1),
        linear_input("ln1 output (q/k/v input)", 3),
        term("q, k, v projections", &btd, c, 3),
        term("q, k after RoPE", &btd, c, 2),
    ];
    if bf16 {
        per_layer.push(term("RoPE cos/sin bf16 casts", &[t, dh / 2], BF16, 4));
    }
    let scores = term("attention probabilities softmax(QKᵀ/√d)", &[b, h, t, t], c, 1);
    let attention_scores_bytes = match cfg.attention {
        Attention::Naive => {
            per_layer.push(scores.clone());
            per_layer.push(term("causal mask", &[t, t], 1, 1));
            scores.bytes
        }
        Attention::Fused => {
            per_layer.push(term("fused attention output", &btd, c, 1));
            per_layer.push(term("fused attention logsumexp", &[b, h, t], F32, 1));
            0
        }
    };
    per_layer.extend([
        term("heads merged (o input)", &btd, c, 1),
        term("residual after attention", &btd, F32, 1),
        term("ln2 x·rms", &btd, F32, 1),
        term("ln2 1/rms", &bt1, F32, 1),
        linear_input("ln2 output (w1/w3 input)", 2),
        term("w1 x, silu(w1 x), w3 x, product (w2 input)", &btf, c, 4),
    ]);
    let per_layer_bytes = sum(&per_layer);
    let outside_layers = vec![
        term("final residual", &btd, F32, 1),
        term("ln_final x·rms", &btd, F32, 1),
        term("ln_final 1/rms", &bt1, F32, 1),
        term("ln_final output (lm_head input)", &btd, c, 1),
        term("log-probabilities", &[b, t, v], F32, 1),
    ];
    let activation_bytes = layers * per_layer_bytes + sum(&outside_layers);
    let logits = (b * t * v) as u64 * c;
    let logprobs = (b * t * v) as u64 * F32;
    let btd_b = (b * t * dm) as u64;

    let parameter_bytes = parameters * F32;
    let adamw_bytes = 2 * parameters * F32;
    let gradient_bytes = parameter_bytes;
    let largest_param = vd * F32;
    let persistent = parameter_bytes + input_bytes;
    // Autocast's log-softmax in fp32 first casts the bf16 logits to an fp32 copy.
    let logits_cast = if bf16 { logprobs } else { 0 };

    // Moments of a naive attention: scores, masked scores and probabilities coexist (the
    // Rust temporaries live to the end of the statement).
    let naive_transient = |saved_already: u64| match cfg.attention {
        Attention::Naive => 3 * scores.bytes - saved_already,
        Attention::Fused => 0,
    };
    // No grad: nothing is saved and autocast caches no weight copies (each lives for its
    // matmul). The largest moment is the head (logits, their fp32 cast, log-probs, the head
    // weight's copy), the attention (residual, norm output, q/k/v, scores) or the FFN (four
    // [b,t,d_ff] temporaries).
    let attn_moment = btd_b * (F32 * 2 + c * 3) + naive_transient(0);
    let ffn_moment = btd_b * (F32 * 2 + c) + 4 * (b * t * f) as u64 * c;
    let head_copy = if bf16 { vd * BF16 } else { 0 };
    let head_moment = btd_b * F32 * 2 + logits + logits_cast + logprobs + head_copy;
    let forward_peak_bytes = persistent + attn_moment.max(ffn_moment).max(head_moment);

    // Training, steady state (AdamW moments exist from the first step on). Forward's highest
    // moment is the head (logits and their cast beside everything saved) or, with naive
    // attention, the scores and masked scores beside the saved probabilities.
    let train_fixed = persistent + weight_copy_bytes + adamw_bytes;
    let train_forward_peak_bytes =
        train_fixed + activation_bytes + (logits + logits_cast).max(naive_transient(scores.bytes));
    // Backward peaks at its start (everything saved, the loss gradient, the lm_head weight
    // gradient) or at its end (every gradient made).
    let backward_peak_bytes =
        (train_forward_peak_bytes + largest_param).max(persistent + gradient_bytes + adamw_bytes);
    // Parameters, gradients, both moments, and the update's temporaries for the largest
    // parameter (measured: about two of its size at a time).
    let optimizer_peak_bytes = persistent + gradient_bytes + adamw_bytes + 2 * largest_param;
    let step_peak_bytes = train_forward_peak_bytes.max(backward_peak_bytes).max(optimizer_peak_bytes);

    Estimate {
        config: cfg.clone(),
        parameters,
        parameter_bytes,
        gradient_bytes,
        adamw_bytes,
        weight_copy_bytes,
        input_bytes,
        per_layer,
        per_layer_bytes,
        outside_layers,
        activation_bytes,
        attention_scores_bytes,
        residual_bytes: btd_b * F32,
        residual_derivation: format!(
            "batch × ctx × d_model × 4 B = {b} × {t} × {dm} × 4 B = {} B = {}",
            btd_b * F32,
            crate::render::format::bytes(btd_b * F32)
        ),
        forward_peak_bytes,
        train_forward_peak_bytes,
        backward_peak_bytes,
        optimizer_peak_bytes,
        step_peak_bytes,
    }
}

/// The largest value of a knob (`set` writes it into the config) in 1..=max whose peak fits
/// `budget`, or None when even 1 does not. Peaks grow with ctx and batch, so this bisects.
fn largest_fitting(cfg: &StepConfig, budget: u64, max: i64, set: impl Fn(&mut StepConfig, i64)) -> Option<i64> {
    let fits = |x: i64| {
        let mut c = cfg.clone();
        set(&mut c, x);
        estimate(&c).peak_bytes() <= budget
    };
    if !fits(1) {
        return None;
    }
    let (mut lo, mut hi) = (1, max);
    if fits(hi) {
        return Some(hi);
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(lo)
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FitVerdict {
    pub budget_bytes: u64,
    pub fits: bool,
    /// Largest ctx at the configuration's batch, and largest batch at its ctx.
    pub max_ctx: Option<i64>,
    pub max_batch: Option<i64>,
}

pub fn fit_in(cfg: &StepConfig, budget: u64) -> FitVerdict {
    FitVerdict {
        budget_bytes: budget,
        fits: estimate(cfg).peak_bytes() <= budget,
        max_ctx: largest_fitting(cfg, budget, MAX_CTX, |c, x| c.ctx = x),
        max_batch: largest_fitting(cfg, budget, MAX_BATCH, |c, x| c.batch = x),
    }
}

/// The report `vramscope estimate` prints (Markdown).
pub fn render(e: &Estimate, fit: Option<&FitVerdict>) -> String {
    use crate::render::format::bytes;
    use std::fmt::Write;
    let c = &e.config;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## {} — ctx {}, batch {}, {}, {} attention\n",
        c.model_name, c.ctx, c.batch, c.precision, c.attention
    );
    let _ = writeln!(s, "| what | bytes |\n|---|---:|");
    let per_param = |x: u64| x as f64 / e.parameters as f64;
    let _ = writeln!(s, "| parameters ({} × 4 B) | {} |", e.parameters, bytes(e.parameter_bytes));
    let _ = writeln!(s, "| gradients (fp32) | {} |", bytes(e.gradient_bytes));
    let _ = writeln!(s, "| AdamW state (2 moments, fp32) | {} |", bytes(e.adamw_bytes));
    let _ = writeln!(
        s,
        "| parameters + gradients + AdamW | {} ({:.0} B per parameter) |",
        bytes(e.parameter_bytes + e.gradient_bytes + e.adamw_bytes),
        per_param(e.parameter_bytes + e.gradient_bytes + e.adamw_bytes)
    );
    if e.weight_copy_bytes > 0 {
        let _ = writeln!(s, "| bf16 weight copies (autocast) | {} |", bytes(e.weight_copy_bytes));
    }
    let _ = writeln!(s, "| inputs and RoPE tables | {} |", bytes(e.input_bytes));
    let _ = writeln!(s, "| activations saved for backward | {} |", bytes(e.activation_bytes));
    let _ = writeln!(s, "| attention scores, one layer | {} |", bytes(e.attention_scores_bytes));
    let _ = writeln!(s, "\nResidual stream tensor: {}\n", e.residual_derivation);
    let _ = writeln!(s, "### Saved per layer ({} layers, {} each)\n", c.dims.layers, bytes(e.per_layer_bytes));
    let _ = writeln!(s, "| tensor | shape | bytes |\n|---|---|---:|");
    for t in e.per_layer.iter().chain(&e.outside_layers) {
        let _ = writeln!(s, "| {} | {} | {} |", t.name, t.shape, bytes(t.bytes));
    }
    let _ = writeln!(s, "\n(the last {} rows are saved once, outside the layers)\n", e.outside_layers.len());
    let _ = writeln!(s, "### Predicted peaks\n\n| precision | forward (no grad) | train: forward | backward | optimizer | full step |\n|---|---:|---:|---:|---:|---:|");
    for p in Precision::ALL {
        let x = estimate(&StepConfig { precision: *p, ..c.clone() });
        let _ = writeln!(
            s,
            "| {p} | {} | {} | {} | {} | {} |",
            bytes(x.forward_peak_bytes),
            bytes(x.train_forward_peak_bytes),
            bytes(x.backward_peak_bytes),
            bytes(x.optimizer_peak_bytes),
            bytes(x.step_peak_bytes)
        );
    }
    if let Some(f) = fit {
        let opt = |x: Option<i64>| x.map_or("none".to_string(), |v| v.to_string());
        let _ = writeln!(
            s,
            "\nIn {} ({} mode, {}): {} (peak {}). Largest ctx at batch {}: {}. Largest batch at ctx {}: {}.",
            bytes(f.budget_bytes),
            c.mode,
            c.precision,
            if f.fits { "fits" } else { "does not fit" },
            bytes(e.peak_bytes()),
            c.batch,
            opt(f.max_ctx),
            c.ctx,
            opt(f.max_batch)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step_config::Preset;

    fn cfg(preset: Preset, ctx: i64, batch: i64, precision: Precision, attention: Attention) -> StepConfig {
        StepConfig {
            model_name: preset.name().into(),
            dims: preset.dims(),
            ctx,
            batch,
            precision,
            mode: Mode::Train,
            attention,
            optimizer: Default::default(),
        }
    }

    #[test]
    fn the_2_7b_preset_matches_the_hand_arithmetic() {
        // Embedding and LM head V·d each; per layer 4 d² attention, 3 d·d_ff SwiGLU, 2 norm
        // gains; one final gain.
        let (v, d, ff, l) = (10_000u64, 2560u64, 10_240u64, 32u64);
        let hand = 2 * v * d + l * (4 * d * d + 3 * d * ff + 2 * d) + d;
        for ctx in [128, 256, 512] {
            let e = estimate(&cfg(Preset::B2_7, ctx, 4, Precision::Fp32, Attention::Naive));
            assert_eq!(e.parameters, hand);
            // fp32 AdamW training keeps 16 bytes per parameter: weight, gradient, two moments.
            assert_eq!(e.parameter_bytes + e.gradient_bytes + e.adamw_bytes, 16 * hand);
            assert_eq!(e.residual_bytes, 4 * ctx as u64 * 2560 * 4);
            assert!(e.step_peak_bytes > 16 * hand);
        }
        let e = estimate(&cfg(Preset::B2_7, 512, 4, Precision::Fp32, Attention::Naive));
        assert_eq!(e.residual_bytes, 20 << 20, "4 × 512 × 2560 × 4 B is 20 MiB");
        assert!(e.residual_derivation.contains("4 × 512 × 2560 × 4 B") && e.residual_derivation.ends_with("20.0 MiB"));
        // Naive attention: one layer's scores are batch × heads × ctx² fp32.
        assert_eq!(e.attention_scores_bytes, 4 * 32 * 512 * 512 * 4);
    }

    #[test]
    fn bf16_halves_matmul_activations_and_fused_drops_the_scores() {
        let fp32 = estimate(&cfg(Preset::Small, 512, 4, Precision::Fp32, Attention::Naive));
        let bf16 = estimate(&cfg(Preset::Small, 512, 4, Precision::Bf16, Attention::Naive));
        assert!(bf16.activation_bytes < fp32.activation_bytes);
        assert!(bf16.weight_copy_bytes > 0 && fp32.weight_copy_bytes == 0);
        assert_eq!(bf16.residual_bytes, fp32.residual_bytes, "the residual stream stays fp32 under autocast");
        let fused = estimate(&cfg(Preset::Small, 512, 4, Precision::Fp32, Attention::Fused));
        assert_eq!(fused.attention_scores_bytes, 0);
        assert!(fused.activation_bytes < fp32.activation_bytes);
    }

    #[test]
    fn fit_search_finds_the_boundary() {
        let c = cfg(Preset::Small, 512, 4, Precision::Fp32, Attention::Naive);
        let budget = estimate(&c).step_peak_bytes;
        let v = fit_in(&c, budget);
        assert!(v.fits);
        assert_eq!(v.max_batch, Some(4), "batch 5 needs more than batch 4's peak");
        assert!(v.max_ctx.unwrap() >= 512);
        let mut c2 = c.clone();
        c2.ctx = v.max_ctx.unwrap() + 1;
        assert!(estimate(&c2).step_peak_bytes > budget);
        assert_eq!(fit_in(&c, 1 << 20).max_batch, None, "1 MiB holds no small model");
    }
}
