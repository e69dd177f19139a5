//! `vramscope estimate`: the memory of a configuration worked out without running it, by
//! walking the CS336 reference's ops (`cs336-basics` model.py, nn_utils.py, optimizer.py;
//! the engine runs the same ops, engine/src/model.rs) tensor by tensor: each op's output,
//! with its shape and its dtype under bf16 autocast, made when the op runs and freed when
//! the reference's Python lets go of it, unless autograd saved it for backward. The walk
//! keeps the live total and its peak, and what was alive then.

use serde::Serialize;

use crate::step_config::{Attention, AutocastPolicy, Checkpointing, Mode, Optimizer, Precision, StepConfig, MAX_BATCH, MAX_CTX};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dtype {
    F32,
    Bf16,
    F16,
    I64,
    Bool,
}

impl Dtype {
    fn size(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
            Dtype::I64 => 8,
            Dtype::Bool => 1,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "fp32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "fp16",
            Dtype::I64 => "int64",
            Dtype::Bool => "bool",
        }
    }
}

/// One tensor (or a group of same-shaped tensors) the estimate counts, named by the
/// reference's line of code that makes it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Term {
    pub name: String,
    /// Shape and element size, e.g. "[4, 512, 2560] fp32".
    pub shape: String,
    pub bytes: u64,
}

fn term(name: impl Into<String>, dims: &[i64], dtype: Dtype, count: u64) -> Term {
    let n: u64 = dims.iter().map(|d| *d as u64).product();
    let shape = dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
    let times = if count > 1 { format!("{count} × ") } else { String::new() };
    Term { name: name.into(), shape: format!("{times}[{shape}] {}", dtype.name()), bytes: n * dtype.size() * count }
}

fn sum(terms: &[Term]) -> u64 {
    terms.iter().map(|t| t.bytes).sum()
}

/// A tensor the walk made.
struct Made {
    term: Term,
    /// The layer whose ops made it (None: outside the layers).
    layer: Option<i64>,
    live: bool,
    /// Autograd keeps it for backward (grad mode only).
    saved: bool,
}

/// The walk: the reference's ops as a sequence of tensors made and freed, with the live
/// total of requested bytes (what memory_viz's active timeline stacks).
struct Tape {
    grad: bool,
    /// On a CPU (vramscope's modelled GPU), bf16 matmuls make a transient copy of their
    /// weight (oneDNN's reorder), which a GPU's (and a CPU's fp16 ones) do not.
    cpu: bool,
    made: Vec<Made>,
    layer: Option<i64>,
    live: u64,
    peak: u64,
    /// What was alive at the peak (indices into `made`).
    at_peak: Vec<usize>,
    /// Each layer's `einsum(attention_weights, V)`: the layer, the first tensor it made, and
    /// the attention weights it saved. Backward's peak with naive attention is just after
    /// such an einsum's backward, when everything saved from there on has been let go.
    weights_einsums: Vec<(i64, usize, Id)>,
    /// The first tensor made after the layers (the final norm's).
    head_start: usize,
}

type Id = usize;

impl Tape {
    fn new(grad: bool, cpu: bool, base: u64) -> Tape {
        Tape { grad, cpu, made: Vec::new(), layer: None, live: base, peak: base, at_peak: Vec::new(), weights_einsums: Vec::new(), head_start: 0 }
    }

    fn make(&mut self, line: &str, dims: &[i64], dtype: Dtype) -> Id {
        let t = term(line, dims, dtype, 1);
        self.live += t.bytes;
        self.made.push(Made { term: t, layer: self.layer, live: true, saved: false });
        if self.live > self.peak {
            self.peak = self.live;
            self.at_peak = (0..self.made.len()).filter(|&i| self.made[i].live).collect();
        }
        self.made.len() - 1
    }

    /// Autograd keeps `id` for backward (nothing in no-grad mode).
    fn save(&mut self, id: Id) {
        if self.grad {
            self.made[id].saved = true;
        }
    }

    /// The reference's Python lets go of `id`: freed unless autograd saved it.
    fn free(&mut self, id: Id) {
        let m = &mut self.made[id];
        if m.live && !m.saved {
            m.live = false;
            self.live -= m.term.bytes;
        }
    }

    fn is_fp32(&self, id: Id) -> bool {
        self.made[id].term.shape.ends_with("fp32")
    }

    /// Everything still alive (saved for backward, or the loss).
    fn alive(&self) -> impl Iterator<Item = &Made> {
        self.made.iter().filter(|m| m.live)
    }
}

/// The shapes one step works with.
struct Shape {
    b: i64,
    t: i64,
    d: i64,
    f: i64,
    h: i64,
    v: i64,
    layers: i64,
    /// The compute dtype: fp32, or autocast's bf16 or fp16.
    c: Dtype,
    /// Under autocast (bf16 or fp16).
    half: bool,
    /// What the ops on CUDA's fp32 lists (exp, sum, log) make under bf16 autocast: fp32 on
    /// CUDA's policy, the compute dtype on CPU's.
    listed: Dtype,
    attention: Attention,
}

impl Shape {
    fn of(cfg: &StepConfig, policy: AutocastPolicy) -> Shape {
        let d = cfg.dims;
        let c = match cfg.precision {
            Precision::Fp32 => Dtype::F32,
            Precision::Bf16 => Dtype::Bf16,
            Precision::Fp16 => Dtype::F16,
        };
        Shape {
            b: cfg.batch,
            t: cfg.ctx,
            d: d.d_model,
            f: d.d_ff,
            h: d.heads,
            v: d.vocab,
            layers: d.layers,
            c,
            half: c != Dtype::F32,
            listed: if policy == AutocastPolicy::Cuda { Dtype::F32 } else { c },
            attention: cfg.attention,
        }
    }
}

/// model.py Linear: `einsum(x, self.weight, "... d_in, d_out d_in -> ... d_out")`. Under
/// autocast the weight and an fp32 input are cast to bf16 first; with grad on, the weight's
/// copy is cached and both copies are saved, without grad both die with the op.
fn linear(tp: &mut Tape, s: &Shape, x: Id, x_dims: &[i64], d_out: i64, d_in: i64, what: &str) -> Id {
    let mut out_dims = x_dims.to_vec();
    *out_dims.last_mut().expect("a last dimension") = d_out;
    if s.half {
        let w = tp.make(&format!("{what}: autocast's {} copy of the weight", s.c.name()), &[d_out, d_in], s.c);
        tp.save(w);
        let xc = tp.is_fp32(x).then(|| tp.make(&format!("{what}: autocast's {} copy of the input", s.c.name()), x_dims, s.c));
        tp.save(xc.unwrap_or(x));
        let out = tp.make(&format!("{what}: einsum(x, self.weight, ...)"), &out_dims, s.c);
        // oneDNN's bf16 matmul reorders the weight; the CPU's fp16 matmul does not.
        if tp.cpu && s.c == Dtype::Bf16 {
            let reorder = tp.make(&format!("{what}: the CPU matmul's copy of the {} weight", s.c.name()), &[d_out, d_in], s.c);
            tp.free(reorder);
        }
        if let Some(xc) = xc {
            tp.free(xc);
        }
        tp.free(w);
        out
    } else {
        tp.save(x);
        tp.make(&format!("{what}: einsum(x, self.weight, ...)"), &out_dims, Dtype::F32)
    }
}

/// model.py RMSNorm.forward, in fp32 (its input, the residual stream, is fp32 already).
fn rmsnorm(tp: &mut Tape, s: &Shape, x: Id, what: &str) -> Id {
    let (btd, bt1) = ([s.b, s.t, s.d], [s.b, s.t, 1]);
    tp.save(x);
    let sq = tp.make(&format!("{what}: x.pow(2)"), &btd, Dtype::F32);
    let mean = tp.make(&format!("{what}: x.pow(2).mean(-1, keepdim=True)"), &bt1, Dtype::F32);
    tp.free(sq);
    let shifted = tp.make(&format!("{what}: … + self.eps"), &bt1, Dtype::F32);
    tp.free(mean);
    let rms = tp.make(&format!("{what}: rms = torch.rsqrt(…)"), &bt1, Dtype::F32);
    tp.save(rms);
    tp.free(shifted);
    let normed = tp.make(&format!("{what}: x = x * rms"), &btd, Dtype::F32);
    tp.save(normed);
    let out = tp.make(&format!("{what}: (self.weight * x).to(in_dtype)"), &btd, Dtype::F32);
    tp.free(normed);
    tp.free(rms);
    out
}

/// model.py RotaryEmbedding.forward: fp32 cos/sin times the input's halves, so the result is
/// fp32 under autocast too.
fn rope(tp: &mut Tape, s: &Shape, what: &str) -> Id {
    let half = [s.b, s.h, s.t, s.d / s.h / 2];
    let mut rotated = Vec::new();
    for line in ["x1_rot = cos * x1 - sin * x2", "x2_rot = sin * x1 + cos * x2"] {
        let a = tp.make(&format!("{what} RoPE: {line} (first product)"), &half, Dtype::F32);
        let c = tp.make(&format!("{what} RoPE: {line} (second product)"), &half, Dtype::F32);
        rotated.push(tp.make(&format!("{what} RoPE: {line}"), &half, Dtype::F32));
        tp.free(a);
        tp.free(c);
    }
    let out = tp.make(&format!("{what} RoPE: torch.concat((x1_rot, x2_rot), dim=-1)"), &[s.b, s.h, s.t, s.d / s.h], Dtype::F32);
    for r in rotated {
        tp.free(r);
    }
    out
}

/// An op on CUDA's fp32 list (exp) applied to a `dims` tensor of the compute dtype. Under
/// CUDA's bf16 policy autocast casts the input to an fp32 copy first, which dies with the op.
fn listed_op(tp: &mut Tape, s: &Shape, line: &str, dims: &[i64]) -> Id {
    let copy = (s.listed != s.c).then(|| tp.make(&format!("{line}: autocast's fp32 copy of its input"), dims, Dtype::F32));
    let out = tp.make(line, dims, s.listed);
    if let Some(c) = copy {
        tp.free(c);
    }
    out
}

/// `x - torch.max(x, dim=-1, keepdim=True)[0]` for x of shape `dims`: the max (values and
/// indices; autograd keeps the indices) and the shifted tensor. `lines` name the max and
/// the subtraction.
fn shift_by_max(tp: &mut Tape, dims: &[i64], c: Dtype, lines: [&str; 2]) -> (Id, Id) {
    let mut reduced = dims.to_vec();
    *reduced.last_mut().expect("a last dimension") = 1;
    let peak = tp.make(lines[0], &reduced, c);
    let index = tp.make(&format!("{} (indices)", lines[0]), &reduced, Dtype::I64);
    tp.save(index);
    tp.free(index);
    let shifted = tp.make(lines[1], dims, c);
    (peak, shifted)
}

/// model.py scaled_dot_product_attention and nn_utils.py softmax: Q, K, V [b, h, t, dh].
fn attention_core(tp: &mut Tape, s: &Shape, q: Id, k: Id, v: Id, mask: Id) -> Id {
    let (bhtt, bht1, bhtd) = ([s.b, s.h, s.t, s.t], [s.b, s.h, s.t, 1], [s.b, s.h, s.t, s.d / s.h]);
    let c = s.c;
    let casts: Vec<Id> = if s.half {
        ["Q", "K"].iter().map(|n| tp.make(&format!("einsum(Q, K, ...): autocast's {} copy of {n}", c.name()), &bhtd, c)).collect()
    } else {
        vec![q, k]
    };
    for &x in &casts {
        tp.save(x);
    }
    let raw = tp.make("einsum(Q, K, \"... query d_k, ... key d_k -> ... query key\")", &bhtt, c);
    if s.half {
        for &x in &casts {
            tp.free(x);
        }
    }
    let scores = tp.make("attention_scores = einsum(…) / math.sqrt(d_k)", &bhtt, c);
    tp.free(raw);
    tp.save(mask);
    let masked = tp.make("torch.where(mask, attention_scores, float(\"-inf\"))", &bhtt, c);
    tp.free(scores);
    let (peak, shifted) = shift_by_max(tp, &bhtt, c, ["softmax: torch.max(x, dim=dim, keepdim=True)", "softmax: rescaled_input = x - torch.max(…)[0]"]);
    tp.free(peak);
    let exps = listed_op(tp, s, "softmax: torch.exp(rescaled_input)", &bhtt);
    tp.save(exps);
    let total = tp.make("softmax: torch.sum(exponentiated_rescaled_input, dim=dim, keepdim=True)", &bht1, s.listed);
    tp.save(total);
    let probs = tp.make("softmax: exponentiated_rescaled_input / torch.sum(…)", &bhtt, s.listed);
    tp.free(total);
    tp.free(shifted);
    tp.free(exps);
    let first = tp.made.len();
    // fp32 weights (CUDA's policy) go into the matmul as a bf16 copy, which it keeps.
    let weights = if s.listed != c { tp.make(&format!("einsum(attention_weights, V, ...): autocast's {} copy of attention_weights", c.name()), &bhtt, c) } else { probs };
    tp.save(weights);
    if tp.layer == Some(s.layers - 1) {
        if let Some(layer) = tp.layer {
            tp.weights_einsums.push((layer, first, weights));
        }
    }
    // V is a permuted view of v_proj's output: the matmul copies it unless batch is 1.
    let vc = (s.b > 1).then(|| tp.make("einsum(attention_weights, V, ...): V made contiguous", &bhtd, c));
    tp.save(vc.unwrap_or(v));
    let out = tp.make("einsum(attention_weights, V, \"... query key, ... key d_v -> ... query d_v\")", &bhtd, c);
    if let Some(vc) = vc {
        tp.free(vc);
    }
    tp.free(weights);
    tp.free(masked);
    tp.free(probs);
    out
}

/// `--attention fused`: scaled_dot_product_attention, which keeps its output and the
/// log-sum-exp [b, h, t] for backward.
fn attention_fused(tp: &mut Tape, s: &Shape, q: Id, k: Id, v: Id) -> Id {
    let bhtd = [s.b, s.h, s.t, s.d / s.h];
    let casts: Vec<Id> = if s.half {
        ["Q", "K"].iter().map(|n| tp.make(&format!("scaled_dot_product_attention: autocast's {} copy of {n}", s.c.name()), &bhtd, s.c)).collect()
    } else {
        vec![q, k]
    };
    for &x in casts.iter().chain([&v]) {
        tp.save(x);
    }
    let out = tp.make("scaled_dot_product_attention output", &bhtd, s.c);
    let lse = tp.make("scaled_dot_product_attention log-sum-exp", &[s.b, s.h, s.t], Dtype::F32);
    tp.save(out);
    tp.save(lse);
    tp.free(lse);
    if s.half {
        for x in casts {
            tp.free(x);
        }
    }
    out
}

/// model.py CausalMultiHeadSelfAttention.forward.
fn attention(tp: &mut Tape, s: &Shape, x: Id) -> Id {
    let btd = [s.b, s.t, s.d];
    let q = linear(tp, s, x, &btd, s.d, s.d, "attn.q_proj");
    let k = linear(tp, s, x, &btd, s.d, s.d, "attn.k_proj");
    let v = linear(tp, s, x, &btd, s.d, s.d, "attn.v_proj");
    let q_rot = rope(tp, s, "Q");
    tp.free(q);
    let k_rot = rope(tp, s, "K");
    tp.free(k);
    let (heads, extra) = match s.attention {
        Attention::Naive => {
            let iota = tp.make("iota = torch.arange(sequence_length)", &[s.t], Dtype::I64);
            let mask = tp.make("causal_mask = qi >= kj", &[s.t, s.t], Dtype::Bool);
            (attention_core(tp, s, q_rot, k_rot, v, mask), vec![iota, mask])
        }
        Attention::Fused => (attention_fused(tp, s, q_rot, k_rot, v), Vec::new()),
    };
    let merged = tp.make("rearrange(attn_output, \"batch heads seq d_v -> batch seq (heads d_v)\")", &btd, s.c);
    tp.free(heads);
    let out = linear(tp, s, merged, &btd, s.d, s.d, "attn.output_proj");
    for id in [q_rot, k_rot, v].into_iter().chain(extra).chain([merged]) {
        tp.free(id);
    }
    out
}

/// model.py SwiGLU.forward with silu as `x * torch.sigmoid(x)`.
fn swiglu(tp: &mut Tape, s: &Shape, x: Id) -> Id {
    let (btd, btf) = ([s.b, s.t, s.d], [s.b, s.t, s.f]);
    let gate = linear(tp, s, x, &btd, s.f, s.d, "ffn.w1");
    let sig = tp.make("silu: torch.sigmoid(x)", &btf, s.c);
    tp.save(sig);
    tp.save(gate);
    let silu = tp.make("silu: x * torch.sigmoid(x)", &btf, s.c);
    tp.free(sig);
    tp.free(gate);
    let up = linear(tp, s, x, &btd, s.f, s.d, "ffn.w3");
    tp.save(silu);
    tp.save(up);
    let prod = tp.make("silu(self.w1(x)) * self.w3(x)", &btf, s.c);
    tp.free(silu);
    tp.free(up);
    let out = linear(tp, s, prod, &btf, s.d, s.f, "ffn.w2");
    tp.free(prod);
    out
}

/// model.py TransformerBlock.forward.
fn block(tp: &mut Tape, s: &Shape, x: Id) -> Id {
    let btd = [s.b, s.t, s.d];
    let h = rmsnorm(tp, s, x, "ln1");
    let attn = attention(tp, s, h);
    tp.free(h);
    let mid = tp.make("attn_sublayer_output = x + x_attn", &btd, Dtype::F32);
    let h = rmsnorm(tp, s, mid, "ln2");
    let ffn = swiglu(tp, s, h);
    tp.free(h);
    let out = tp.make("ffn_sublayer_output = attn_sublayer_output + x_ffn", &btd, Dtype::F32);
    for id in [attn, mid, ffn] {
        tp.free(id);
    }
    out
}

/// BasicsTransformerLM.forward, then nn_utils.py cross_entropy of its logits (which die
/// with that expression). The loss stays alive. Returns the peak up to the logits. The
/// blocks `checkpointing` covers run without grad, keeping their input for backward (only
/// with grad on: a forward pass without grad has nothing to checkpoint).
fn forward_and_loss(tp: &mut Tape, s: &Shape, checkpointing: Checkpointing) -> u64 {
    let (btd, btv, bt1) = ([s.b, s.t, s.d], [s.b, s.t, s.v], [s.b, s.t, 1]);
    let embedded = tp.make("Embedding: self.weight[token_ids, :]", &btd, Dtype::F32);
    let mut x = embedded;
    for i in 0..s.layers {
        tp.layer = Some(i);
        let checkpointed = tp.grad && checkpointing.covers(i);
        if checkpointed {
            tp.save(x);
            tp.grad = false;
        }
        let next = block(tp, s, x);
        tp.grad |= checkpointed;
        if x != embedded {
            tp.free(x);
        }
        x = next;
    }
    tp.layer = None;
    tp.head_start = tp.made.len();
    let normed = rmsnorm(tp, s, x, "ln_final");
    if x != embedded {
        tp.free(x);
    }
    let logits = linear(tp, s, normed, &btd, s.v, s.d, "lm_head");
    tp.free(normed);
    tp.free(embedded);
    let to_logits = tp.peak;
    let c = s.c;
    let (peak, shifted) = shift_by_max(tp, &btv, c, ["log_softmax: x_max = torch.max(x, dim=dim, keepdim=True)[0]", "log_softmax: x = x - x_max"]);
    let exps = listed_op(tp, s, "log_softmax: torch.exp(x)", &btv);
    tp.save(exps);
    // From here on the CUDA policy's tensors are fp32: the exp's output, the sum and the
    // log (fp32 lists), then bf16 x minus the fp32 log promotes.
    let l = s.listed;
    let total = tp.make("log_softmax: torch.sum(torch.exp(x), dim=dim, keepdim=True)", &bt1, l);
    tp.save(total);
    tp.free(exps);
    let log = tp.make("log_softmax: torch.log(…)", &bt1, l);
    tp.free(total);
    // bf16 minus fp32: a GPU's kernel casts as it reads, a CPU's casts x into an fp32
    // temporary first.
    let widened = (tp.cpu && l != c).then(|| tp.make("log_softmax: x - torch.log(…): the CPU's fp32 copy of x", &btv, Dtype::F32));
    let logp = tp.make("log_softmax: x - torch.log(…)", &btv, l);
    if let Some(w) = widened {
        tp.free(w);
    }
    for id in [log, shifted, peak] {
        tp.free(id);
    }
    let neg = tp.make("cross_entropy: -log_softmax(inputs)", &btv, l);
    tp.free(logp);
    tp.save(neg);
    let picked = tp.make("cross_entropy: torch.gather(…, -1, targets.unsqueeze(-1))", &bt1, l);
    let loss = tp.make("cross_entropy: torch.mean(…)", &[], l);
    tp.free(picked);
    tp.free(neg);
    tp.free(logits);
    let _ = loss; // alive through backward
    to_logits
}
/// What an estimate is for: a GPU, or (`cpu`) a CPU run of the engine, whose bf16 ops follow
/// `policy` (a GPU always follows CUDA's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Target {
    pub cpu: bool,
    pub autocast_policy: AutocastPolicy,
}

impl Target {
    pub const GPU: Target = Target { cpu: false, autocast_policy: AutocastPolicy::Cuda };
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    pub config: StepConfig,
    /// The peaks a CPU run measures rather than a GPU's, and the autocast policy followed.
    #[serde(flatten)]
    pub target: Target,
    pub parameters: u64,
    pub parameter_bytes: u64,
    pub gradient_bytes: u64,
    /// AdamW's two moments, fp32.
    pub adamw_bytes: u64,
    /// bf16 or fp16 copies of the matmul weights autocast caches and saves in a training
    /// step (0 in fp32).
    pub weight_copy_bytes: u64,
    /// fp16's GradScaler: its scale and growth tracker (0 otherwise).
    pub scaler_bytes: u64,
    /// Token ids and targets, the RoPE table.
    pub input_bytes: u64,
    /// What one transformer block saves for backward, tensor by tensor (one that is not
    /// checkpointed: a checkpointed one keeps its input alone).
    pub per_layer: Vec<Term>,
    pub per_layer_bytes: u64,
    /// Saved outside the blocks (embedding, final norm, LM head, cross-entropy).
    pub outside_layers: Vec<Term>,
    /// Everything the forward pass saves for backward (train mode).
    pub activation_bytes: u64,
    /// One layer's [batch, heads, ctx, ctx] attention scores (0 with fused attention).
    pub attention_scores_bytes: u64,
    /// The fp32 residual stream tensor [batch, ctx, d_model] and how its size is reached.
    pub residual_bytes: u64,
    pub residual_derivation: String,
    /// The transient tensors alive (beside what is saved) at the forward peak of the
    /// configuration's mode.
    pub peak_transients: Vec<Term>,
    /// Peak of a no-grad forward pass.
    pub forward_peak_bytes: u64,
    /// Peak of a no-grad forward pass that stops at the logits (generation, an evaluation
    /// without the loss).
    pub logits_peak_bytes: u64,
    /// Peak of a steady-state training step (forward, backward, AdamW step), by phase.
    pub train_forward_peak_bytes: u64,
    pub backward_peak_bytes: u64,
    pub optimizer_peak_bytes: u64,
    pub step_peak_bytes: u64,
    /// FLOPs and the least traffic of a step, by arithmetic.
    pub compute: super::compute::Compute,
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

/// Every parameter's size in elements, in the reference's order.
fn parameter_sizes(s: &Shape) -> Vec<i64> {
    let (d, f) = (s.d, s.f);
    let mut p = vec![s.v * d];
    for _ in 0..s.layers {
        p.extend([d * d, d * d, d * d, d * d, d * f, f * d, d * f, d, d]);
    }
    p.extend([d, s.v * d]);
    p
}

/// Terms made the same way (same line, shape and dtype) as one row with a count.
fn grouped<'a>(made: impl Iterator<Item = &'a Made>) -> Vec<Term> {
    let mut out: Vec<(Term, u64)> = Vec::new();
    for m in made {
        match out.iter_mut().find(|(t, _)| t.name == m.term.name && t.shape == m.term.shape) {
            Some((_, n)) => *n += 1,
            None => out.push((m.term.clone(), 1)),
        }
    }
    out.into_iter()
        .map(|(t, n)| Term { shape: if n > 1 { format!("{n} × {}", t.shape) } else { t.shape }, bytes: t.bytes * n, name: t.name })
        .collect()
}

/// The estimate for a GPU.
pub fn estimate(cfg: &StepConfig) -> Estimate {
    estimate_on(cfg, Target::GPU)
}

/// The estimate on a GPU, or the peaks a CPU run measures: there bf16 matmuls copy their
/// weight for the duration of the op, and the gather's backward in bf16 accumulates in an
/// fp32 [batch, ctx, vocab] buffer.
pub fn estimate_on(cfg: &StepConfig, target: Target) -> Estimate {
    let cpu = target.cpu;
    let s = Shape::of(cfg, target.autocast_policy);
    let (b, t, dm, v) = (s.b, s.t, s.d, s.v);
    let sizes = parameter_sizes(&s);
    let parameters: u64 = sizes.iter().map(|n| *n as u64).sum();
    let parameter_bytes = parameters * 4;
    let largest_param = sizes.iter().copied().max().unwrap_or(0) as u64 * 4;
    let input_bytes = 2 * (b * t) as u64 * 8 + 2 * (t * dm / s.h / 2) as u64 * 4;
    let persistent = parameter_bytes + input_bytes;
    let moments = 2 * parameter_bytes;
    // fp16 trains with a GradScaler: its scale (fp32) and growth tracker (int32) live from
    // the first step on; the scaled loss through backward; found_inf and the inverse scale
    // (fp32) through the optimizer step.
    let scaler_bytes = if cfg.precision == Precision::Fp16 && cfg.mode == Mode::Train { 8 } else { 0 };

    // Without grad: nothing is saved, and autocast's copies die with their ops.
    let mut no_grad = Tape::new(false, cpu, persistent);
    let logits_peak_bytes = forward_and_loss(&mut no_grad, &s, Checkpointing::None);
    // A training step in the steady state: AdamW's moments exist. `full` is the step
    // without checkpointing: what each block saves, and so what its recompute makes again.
    let train_tape = |checkpointing| {
        let mut tp = Tape::new(true, cpu, persistent + moments + scaler_bytes);
        forward_and_loss(&mut tp, &s, checkpointing);
        tp
    };
    let tape = train_tape(cfg.checkpointing);
    // Without checkpointing the step is its own full tape: it is walked once.
    let unchecked = (cfg.checkpointing != Checkpointing::None).then(|| train_tape(Checkpointing::None));
    let full = unchecked.as_ref().unwrap_or(&tape);
    let end_of_forward = tape.live;

    let (c, l) = (s.c.size(), s.listed.size());
    let (btv, btd) = ((b * t * v) as u64 * c, (b * t * dm) as u64 * c);
    // The loss's tensors after its exp: fp32 on CUDA's bf16 policy.
    let (btv_l, bt1_l) = ((b * t * v) as u64 * l, (b * t) as u64 * l);
    let head_weight = (v * dm) as u64;
    // Backward peaks where it begins (everything saved, and the gradient of the gathered
    // log-probabilities), or at the LM head (the cross-entropy's saved tensors gone, the
    // logits' gradient, the head weight's gradient, the gradient of its input), or in the
    // last layer's attention (three [b, h, t, t] gradients at once with naive attention).
    let loss_saved = 2 * btv_l + (b * t) as u64 * 8 + bt1_l;
    let cpu_scatter = if cpu && s.half && l == 2 { (b * t * v) as u64 * 4 } else { 0 };
    // On CUDA's policy the fp32 gradient of `x - log(…)` is cast back to bf16 for x, next to
    // the gradient of the negation, once the negation's saved input is let go.
    let widened_grad = if l != c { btv } else { 0 };
    let start = end_of_forward + 4 + bt1_l + btv_l + cpu_scatter + widened_grad;
    let head_grads = head_weight * 4 + if s.half { head_weight * 2 } else { 0 };
    let at_head = end_of_forward - loss_saved + btv + head_grads + btd;
    let attention_scores_bytes = match s.attention {
        Attention::Naive => (b * s.h * t * t) as u64 * c,
        Attention::Fused => 0,
    };
    // Naive attention: in a layer's softmax backward; without checkpointing the last
    // layer's, with it possibly an earlier one's, where the gradients of more layers exist.
    // What the layers after it and the head kept has been let go, and of its own saved
    // tensors (made again by the recompute where it is checkpointed) those from its weights'
    // einsum on; the gradients of the parameters after it exist (fp32), and five
    // [b, h, t, t] tensors of the softmax's dtype are alive at once (the weights' gradient,
    // the division's two gradients and the temporaries of the second), beside the fp32
    // residual gradient and the attention output's gradient.
    let kept_by_layer = |layer: i64| -> u64 { tape.alive().filter(|m| m.layer == Some(layer)).map(|m| m.term.bytes).sum() };
    let after_layers: u64 = tape.made[tape.head_start..].iter().filter(|m| m.live).map(|m| m.term.bytes).sum();
    let layer_parameter_bytes = (4 * dm * dm + 3 * dm * s.f + 2 * dm) as u64 * 4;
    let in_attention = full
        .weights_einsums
        .iter()
        .map(|&(layer, first, weights)| {
            let start = full.made.iter().position(|m| m.layer == Some(layer)).unwrap_or(first);
            let own: u64 = (start..first).filter(|&i| full.made[i].live && i != weights).map(|i| full.made[i].term.bytes).sum();
            let released: u64 = (layer..s.layers).map(kept_by_layer).sum::<u64>() + after_layers;
            let grads_after = (head_weight + 2 * dm as u64 + 3 * (dm * s.f) as u64 + (dm * dm) as u64) * 4 + (s.layers - 1 - layer) as u64 * layer_parameter_bytes;
            let softmax = 5 * (b * s.h * t * t) as u64 * l;
            end_of_forward - released + own + grads_after + softmax + (b * t * dm) as u64 * (4 + c)
        })
        .max()
        .unwrap_or(0);
    let scaled_loss = scaler_bytes / 2;
    let backward_peak_bytes = start.max(at_head).max(in_attention) + scaled_loss;
    // The update's temporaries for the largest parameter: the reference's AdamW holds five
    // of its size at once (new m and v, the step's numerator, sqrt(v) + eps and the
    // update); torch's in-place update four (sqrt(v), + eps, the quotient, the update).
    let update_temporaries = match cfg.optimizer {
        Optimizer::Reference => 5,
        Optimizer::Torch => 4,
    };
    // found_inf (4 B) lives through the optimizer step; the inverse scale is gone by then.
    let optimizer_peak_bytes = persistent + moments + scaler_bytes + scaled_loss + parameter_bytes + 4 + update_temporaries * largest_param;
    let step_peak_bytes = tape.peak.max(backward_peak_bytes).max(optimizer_peak_bytes);

    let saved = |layer: Option<i64>| tape.alive().filter(move |m| m.layer == layer && m.saved).collect::<Vec<_>>();
    // What a block saves when it is not checkpointed.
    let per_layer = grouped(full.alive().filter(|m| m.layer == Some(0) && m.saved));
    let outside_layers = grouped(saved(None).into_iter());
    let activation_bytes = tape.alive().filter(|m| m.saved).map(|m| m.term.bytes).sum();
    let peak_tape = match cfg.mode {
        Mode::Forward => &no_grad,
        Mode::Train => &tape,
    };
    let peak_transients = grouped(peak_tape.at_peak.iter().map(|&i| &peak_tape.made[i]).filter(|m| !m.saved));
    let matmul_weights = s.layers as u64 * (4 * (dm * dm) as u64 + 3 * (dm * s.f) as u64) + head_weight;
    let residual = (b * t * dm) as u64 * 4;
    Estimate {
        config: cfg.clone(),
        target,
        parameters,
        parameter_bytes,
        gradient_bytes: parameter_bytes,
        adamw_bytes: 2 * parameter_bytes,
        weight_copy_bytes: if s.half { matmul_weights * 2 } else { 0 },
        scaler_bytes,
        input_bytes,
        per_layer_bytes: sum(&per_layer),
        per_layer,
        outside_layers,
        activation_bytes,
        attention_scores_bytes,
        residual_bytes: residual,
        residual_derivation: format!(
            "batch × ctx × d_model × 4 B = {b} × {t} × {dm} × 4 B = {residual} B = {}",
            crate::format::bytes(residual)
        ),
        peak_transients,
        forward_peak_bytes: no_grad.peak,
        logits_peak_bytes,
        train_forward_peak_bytes: tape.peak,
        backward_peak_bytes,
        optimizer_peak_bytes,
        step_peak_bytes,
        compute: super::compute::compute(cfg, parameters, activation_bytes),
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
    use crate::format::bytes;
    use std::fmt::Write;
    let c = &e.config;
    let train = c.mode == Mode::Train;
    let mut s = String::new();
    // A forward pass without grad keeps no gradients, optimizer state or saved
    // activations: its report holds what it does keep, and says which mode it is.
    let _ = writeln!(
        s,
        "## {} — {}, ctx {}, batch {}, {}, {} attention{}{}{}\n",
        c.model_name,
        if train { "training step" } else { "forward only (no grad)" },
        c.ctx,
        c.batch,
        c.precision.label(Some(e.target.autocast_policy)),
        c.attention,
        if train { format!(", {} AdamW", c.optimizer) } else { String::new() },
        if train && c.checkpointing != Checkpointing::None { format!(", {}", c.checkpointing.label()) } else { String::new() },
        if e.target.cpu { " (as a CPU run measures it)" } else { "" }
    );
    let _ = writeln!(s, "| what | bytes |\n|---|---:|");
    let per_param = |x: u64| x as f64 / e.parameters as f64;
    let _ = writeln!(s, "| parameters ({} × 4 B) | {} |", e.parameters, bytes(e.parameter_bytes));
    if train {
        let _ = writeln!(s, "| gradients (fp32) | {} |", bytes(e.gradient_bytes));
        let _ = writeln!(s, "| AdamW state (2 moments, fp32) | {} |", bytes(e.adamw_bytes));
        let _ = writeln!(
            s,
            "| parameters + gradients + AdamW | {} ({:.0} B per parameter) |",
            bytes(e.parameter_bytes + e.gradient_bytes + e.adamw_bytes),
            per_param(e.parameter_bytes + e.gradient_bytes + e.adamw_bytes)
        );
    }
    if e.weight_copy_bytes > 0 && train {
        let _ = writeln!(s, "| {} weight copies (autocast) | {} |", c.precision, bytes(e.weight_copy_bytes));
    }
    if e.scaler_bytes > 0 {
        let _ = writeln!(s, "| GradScaler (scale, growth tracker) | {} |", bytes(e.scaler_bytes));
    }
    let _ = writeln!(s, "| inputs and RoPE tables | {} |", bytes(e.input_bytes));
    if train {
        let _ = writeln!(s, "| activations saved for backward | {} |", bytes(e.activation_bytes));
    }
    let _ = writeln!(s, "| attention scores, one layer | {} |", bytes(e.attention_scores_bytes));
    let _ = writeln!(s, "\nResidual stream tensor: {}\n", e.residual_derivation);
    if train {
        let checkpointed = c.checkpointing.blocks(c.dims.layers);
        let _ = match checkpointed {
            0 => writeln!(s, "### Saved per layer ({} layers, {} each)\n", c.dims.layers, bytes(e.per_layer_bytes)),
            n => writeln!(
                s,
                "### Saved per layer ({} layers: {} each where not checkpointed; {n} checkpointed keep only their input, {} each, and run forward again in backward)\n",
                c.dims.layers,
                bytes(e.per_layer_bytes),
                bytes(e.residual_bytes)
            ),
        };
        let _ = writeln!(s, "| tensor | shape | bytes |\n|---|---|---:|");
        for t in e.per_layer.iter().chain(&e.outside_layers) {
            let _ = writeln!(s, "| {} | {} | {} |", t.name, t.shape, bytes(t.bytes));
        }
        let _ = writeln!(s, "\n(the last {} rows are saved once, outside the layers)\n", e.outside_layers.len());
    }
    let alive = if train { "Alive at the training forward pass's peak besides what is saved" } else { "Alive at the forward pass's peak besides the parameters and inputs" };
    let _ = writeln!(s, "### {alive}\n\n| tensor | shape | bytes |\n|---|---|---:|");
    for t in &e.peak_transients {
        let _ = writeln!(s, "| {} | {} | {} |", t.name, t.shape, bytes(t.bytes));
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "### Predicted active peaks (bytes live tensors hold)\n\n| precision | forward to the logits (no grad) | forward and loss (no grad) | train: forward | backward | optimizer | full step |\n|---|---:|---:|---:|---:|---:|---:|");
    for p in Precision::ALL {
        let x = estimate_on(&StepConfig { precision: *p, ..c.clone() }, e.target);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            p.label(Some(e.target.autocast_policy)),
            bytes(x.logits_peak_bytes),
            bytes(x.forward_peak_bytes),
            bytes(x.train_forward_peak_bytes),
            bytes(x.backward_peak_bytes),
            bytes(x.optimizer_peak_bytes),
            bytes(x.step_peak_bytes)
        );
    }
    if train {
        let _ = writeln!(s, "\n### Activation checkpointing: memory against recompute\n\n| checkpointing | activations saved | full step peak | forward FLOPs run again |\n|---|---:|---:|---:|");
        let every = c.dims.layers.clamp(2, 4) as u32;
        let mut options = vec![Checkpointing::None, Checkpointing::Every(1), Checkpointing::Every(2), Checkpointing::Every(every)];
        options.push(c.checkpointing);
        options.sort_by_key(|o| match o { Checkpointing::None => 0, Checkpointing::Every(k) => *k });
        options.dedup();
        for o in options {
            let x = estimate_on(&StepConfig { checkpointing: o, ..c.clone() }, e.target);
            let share = x.compute.recompute_flops / x.compute.forward_flops.max(1.0);
            let mark = if o == c.checkpointing { " (this estimate)" } else { "" };
            let _ = writeln!(s, "| {}{mark} | {} | {} | {:.0}% of a forward pass |", o.label(), bytes(x.activation_bytes), bytes(x.step_peak_bytes), share * 100.0);
        }
    }
    let _ = writeln!(s, "\n{}", super::compute::render(&e.compute, c.mode));
    if let Some(f) = fit {
        let opt = |x: Option<i64>| x.map_or("none".to_string(), |v| v.to_string());
        let _ = writeln!(
            s,
            "\nIn {} ({} mode, {}): {} (active peak {}). Largest ctx at batch {}: {}. Largest batch at ctx {}: {}.",
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
            checkpointing: Default::default(),
        }
    }

    #[test]
    fn a_forward_only_report_names_its_mode_and_lists_nothing_a_forward_pass_does_not_keep() {
        let fwd = StepConfig { mode: Mode::Forward, ..cfg(Preset::Small, 256, 4, Precision::Fp32, Attention::Naive) };
        let text = render(&estimate(&fwd), None);
        let title = text.lines().next().unwrap();
        assert!(title.contains("forward only (no grad)") && !title.contains("AdamW"), "{title}");
        for absent in ["gradients", "AdamW state", "saved for backward", "Saved per layer"] {
            assert!(!text.contains(absent), "{absent}:\n{text}");
        }
        assert!(text.contains("Alive at the forward pass's peak"), "{text}");
        let train = render(&estimate(&cfg(Preset::Small, 256, 4, Precision::Fp32, Attention::Naive)), None);
        assert!(train.lines().next().unwrap().contains("training step") && train.contains("| gradients (fp32) |"), "{train}");
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
    fn fp16_is_bf16_plus_the_grad_scaler() {
        let (bf16, fp16) = (estimate(&cfg(Preset::Small, 512, 4, Precision::Bf16, Attention::Naive)), estimate(&cfg(Preset::Small, 512, 4, Precision::Fp16, Attention::Naive)));
        assert_eq!(fp16.activation_bytes, bf16.activation_bytes);
        assert_eq!(fp16.scaler_bytes, 8);
        assert_eq!(fp16.train_forward_peak_bytes, bf16.train_forward_peak_bytes + 8);
        assert_eq!(fp16.backward_peak_bytes, bf16.backward_peak_bytes + 12);
        assert_eq!(fp16.optimizer_peak_bytes, bf16.optimizer_peak_bytes + 12);
        let text = render(&fp16, None);
        assert!(text.contains("autocast's fp16 copy of the weight") && text.contains("| GradScaler (scale, growth tracker) | 8 B |"), "{text}");
        assert!(!text.lines().any(|l| l.contains("autocast's bf16")), "fp16's tensors say fp16: {text}");
        assert!(text.contains("| fp16 (CUDA autocast) |"), "the precisions compared include fp16: {text}");
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
