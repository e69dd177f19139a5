//! CS336's BasicsTransformerLM in tch, op for op as the course's reference (`cs336-basics`:
//! model.py, nn_utils.py) runs it: einsum linears, RMSNorm upcast to fp32, RoPE as written
//! (fp32 cos/sin tables, so under bf16 autocast q and k come out fp32), scores by einsum then
//! `/ √d_k`, a `torch.where` causal mask, a three-step softmax, SiLU as `x * sigmoid(x)`, and
//! cross-entropy through its own log-softmax. Every temporary is dropped when the reference's
//! Python frees it (an expression's operands when the op that used them returns, a local
//! when its function returns), so the allocator sees the same requests in the same order;
//! the explicit `drop`s below are those moments. tests/reference_model.rs holds the engine
//! to python/vramscope_hook/cs336.py, vramscope's restatement of the reference, under the same
//! allocator model. `Attention::Fused` swaps the attention core for
//! scaled_dot_product_attention. Weights are plain leaf tensors, so the loop knows every
//! parameter's address (for exact categories).

use tch::{Device, Kind, Tensor};

use vramscope_core::producer::scopes::Scopes;
use vramscope_core::step_config::{Attention, Checkpointing, ModelDims};

const RMS_EPS: f64 = 1e-5;
const ROPE_THETA: f64 = 10_000.0;
/// `nn.init.trunc_normal_(torch.empty(rows, cols), std, -3 std, 3 std)` as torch 2.13 runs
/// it: normal draws, then redraws where the mask of out-of-range values says, until none
/// is; a leaf that requires grad. (Its temporaries, the masks and redraws, are part of
/// the allocator's history.)
fn truncated_normal(rows: i64, cols: i64, std: f64, device: Device) -> Tensor {
    let mut w = Tensor::empty([rows, cols], (Kind::Float, device));
    // The bounds as fp32 holds them (torch reads them back through a tensor).
    let bound = |x: f64| Tensor::scalar_tensor(x, (Kind::Float, Device::Cpu)).double_value(&[]);
    let (lo, hi) = (bound(-3.0 * std), bound(3.0 * std));
    let _ = w.normal_(0.0, std);
    // The latest redraw (None: still `w` itself) and the latest mask.
    let mut result: Option<Tensor> = None;
    let mut mask: Option<Tensor> = None;
    loop {
        let next_mask = {
            let cur = result.as_ref().unwrap_or(&w);
            let below = cur.lt(lo);
            let above = cur.gt(hi);
            let m = below.bitwise_or_tensor(&above);
            drop(below);
            drop(above);
            m
        };
        let m = mask.insert(next_mask);
        let any = m.any();
        let again = any.int64_value(&[]) != 0;
        drop(any);
        if !again {
            break;
        }
        let next = {
            let cur = result.as_ref().unwrap_or(&w);
            let mut fresh = cur.empty_like();
            let _ = fresh.normal_(0.0, std);
            let next = fresh.where_self(m, cur);
            drop(fresh);
            next
        };
        result = Some(next);
    }
    if let Some(r) = &result {
        w.copy_(r);
    }
    drop(result);
    drop(mask);
    w.set_requires_grad(true)
}

struct Linear {
    /// [out, in], as the reference's Linear.
    w: Tensor,
}

impl Linear {
    fn new(d_in: i64, d_out: i64, device: Device) -> Linear {
        Linear { w: truncated_normal(d_out, d_in, (2.0 / (d_in + d_out) as f64).sqrt(), device) }
    }
    /// `einsum(x, W, "... d_in, d_out d_in -> ... d_out")`, as einops hands it to torch.
    fn forward(&self, x: &Tensor) -> Tensor {
        Tensor::einsum("...a,ba->...b", &[x, &self.w], None::<i64>)
    }
}

struct RmsNorm {
    g: Tensor,
}

impl RmsNorm {
    fn new(d: i64, device: Device) -> RmsNorm {
        RmsNorm { g: Tensor::ones([d], (Kind::Float, device)).set_requires_grad(true) }
    }
    /// In fp32 whatever the input (the residual stream is fp32 already, so the upcast is
    /// the same tensor).
    fn forward(&self, x: &Tensor) -> Tensor {
        let kind = x.kind();
        let x32 = x.to_kind(Kind::Float);
        let squares = x32.pow_tensor_scalar(2);
        let mean = squares.mean_dim(-1, true, None::<Kind>);
        drop(squares);
        let shifted = mean.g_add_scalar(RMS_EPS);
        drop(mean);
        let inv_rms = shifted.rsqrt();
        drop(shifted);
        let normed = &x32 * &inv_rms;
        let out = (&self.g * &normed).to_kind(kind);
        drop(normed);
        drop(inv_rms);
        out
    }
}

/// The RoPE table [2 (cos, sin), ctx, d_head / 2], fp32, built as the reference builds its
/// cache (each temporary of the construction included).
fn rope_table(ctx: i64, d_head: i64, device: Device) -> Tensor {
    let steps = Tensor::arange_start_step(0, d_head, 2, (Kind::Int64, device));
    let exponents = steps.g_div_scalar(d_head);
    drop(steps);
    let base = Tensor::scalar_tensor(ROPE_THETA, (Kind::Float, device));
    let negated = exponents.neg();
    let inv_freq = base.pow(&negated);
    drop(base);
    drop(negated);
    let positions = Tensor::arange(ctx, (Kind::Int64, device));
    let angles = Tensor::einsum("a,b->ab", &[&positions, &inv_freq], None::<i64>);
    drop(inv_freq);
    let cos = angles.cos();
    let sin = angles.sin();
    let table = Tensor::stack(&[&cos, &sin], 0);
    drop(exponents);
    drop(angles);
    drop(positions);
    drop(cos);
    drop(sin);
    table
}

/// `x - torch.max(x, dim=-1, keepdim=True)[0]`, and the max (its indices die at the `[0]`).
fn shift_by_max(x: &Tensor) -> (Tensor, Tensor) {
    let (peak, index) = x.max_dim(-1, true);
    drop(index);
    let shifted = x - &peak;
    (peak, shifted)
}

/// The reference's three-step softmax over the last dimension.
fn softmax(x: &Tensor) -> Tensor {
    let (peak, shifted) = shift_by_max(x);
    drop(peak);
    let exps = shifted.exp();
    let total = exps.sum_dim_intlist(-1, true, None::<Kind>);
    let probs = &exps / &total;
    drop(total);
    drop(shifted);
    drop(exps);
    probs
}

fn log_softmax(x: &Tensor) -> Tensor {
    let (peak, shifted) = shift_by_max(x);
    let exps = shifted.exp();
    let total = exps.sum_dim_intlist(-1, true, None::<Kind>);
    drop(exps);
    let log_total = total.log();
    drop(total);
    let out = &shifted - &log_total;
    drop(log_total);
    drop(shifted);
    drop(peak);
    out
}

/// The reference's cross-entropy: mean over tokens of the negated log-softmax picked at
/// each target. logits [batch, ctx, vocab], targets [batch, ctx].
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Tensor {
    let logp = log_softmax(logits);
    let neg = logp.neg();
    drop(logp);
    let picked = neg.gather(-1, &targets.unsqueeze(-1), false);
    let loss = picked.mean(None::<Kind>);
    drop(picked);
    drop(neg);
    loss
}

struct Block {
    ln1: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ln2: RmsNorm,
    w1: Linear,
    w2: Linear,
    w3: Linear,
    scope_attn: u32,
    scope_ffn: u32,
    scope_ln1: u32,
    scope_ln2: u32,
}

/// A block forward ran without grad (activation checkpointing): its input, kept for the
/// recompute, and its output, a leaf.
pub struct Checkpointed {
    block: usize,
    input: Tensor,
    output: Tensor,
}

pub struct TransformerLm {
    pub dims: ModelDims,
    device: Device,
    embed: Tensor,
    blocks: Vec<Block>,
    ln_final: RmsNorm,
    lm_head: Linear,
    /// The context length the RoPE table covers, and the table.
    rope: (i64, Tensor),
    scope_embed: u32,
    scope_final: u32,
    scope_head: u32,
    scope_rope: u32,
}

impl TransformerLm {
    /// Built in the reference's order (embedding, RoPE table, per layer q, k, v, output
    /// projections, w1, w2, w3, the two norms; final norm, LM head), so the allocator's
    /// segments start as the reference's do.
    pub fn new(dims: ModelDims, ctx: i64, device: Device, scopes: &Scopes) -> TransformerLm {
        let d = dims.d_model;
        let embed = truncated_normal(dims.vocab, d, 1.0, device);
        let scope_rope = scopes.intern("rope_cache");
        let rope = {
            let _s = scopes.enter(scope_rope);
            (ctx, rope_table(ctx, d / dims.heads, device))
        };
        let blocks = (0..dims.layers)
            .map(|i| {
                let (q, k, v, o) = (Linear::new(d, d, device), Linear::new(d, d, device), Linear::new(d, d, device), Linear::new(d, d, device));
                let (w1, w2, w3) = (Linear::new(d, dims.d_ff, device), Linear::new(dims.d_ff, d, device), Linear::new(d, dims.d_ff, device));
                let (ln1, ln2) = (RmsNorm::new(d, device), RmsNorm::new(d, device));
                Block {
                    ln1,
                    q,
                    k,
                    v,
                    o,
                    ln2,
                    w1,
                    w2,
                    w3,
                    scope_attn: scopes.intern(&format!("layers.{i}.attn")),
                    scope_ffn: scopes.intern(&format!("layers.{i}.ffn")),
                    scope_ln1: scopes.intern(&format!("layers.{i}.ln1")),
                    scope_ln2: scopes.intern(&format!("layers.{i}.ln2")),
                }
            })
            .collect();
        let ln_final = RmsNorm::new(d, device);
        let lm_head = Linear::new(d, dims.vocab, device);
        TransformerLm {
            dims,
            device,
            embed,
            blocks,
            ln_final,
            lm_head,
            rope,
            scope_embed: scopes.intern("token_embeddings"),
            scope_final: scopes.intern("ln_final"),
            scope_head: scopes.intern("lm_head"),
            scope_rope,
        }
    }

    /// Every parameter with its name, in the reference's `named_parameters()` order (the
    /// order its optimizer visits them): the names the allocations table and snapshots show.
    pub fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut p = vec![("token_embeddings.weight".to_string(), &self.embed)];
        for (i, b) in self.blocks.iter().enumerate() {
            for (name, t) in [
                ("attn.q_proj.weight", &b.q.w),
                ("attn.k_proj.weight", &b.k.w),
                ("attn.v_proj.weight", &b.v.w),
                ("attn.output_proj.weight", &b.o.w),
                ("ffn.w1.weight", &b.w1.w),
                ("ffn.w2.weight", &b.w2.w),
                ("ffn.w3.weight", &b.w3.w),
                ("ln1.weight", &b.ln1.g),
                ("ln2.weight", &b.ln2.g),
            ] {
                p.push((format!("layers.{i}.{name}"), t));
            }
        }
        p.push(("ln_final.weight".to_string(), &self.ln_final.g));
        p.push(("lm_head.weight".to_string(), &self.lm_head.w));
        p
    }

    pub fn parameters(&self) -> Vec<&Tensor> {
        self.named_parameters().into_iter().map(|(_, t)| t).collect()
    }

    /// `zero_grad(set_to_none=True)`: gradients are freed, not zeroed, in parameter order.
    pub fn clear_grads(&self) {
        for p in self.parameters() {
            crate::capture::clear_grad(p);
        }
    }

    pub fn parameter_count(&self) -> i64 {
        self.parameters().iter().map(|t| t.numel() as i64).sum()
    }

    /// Sizes the RoPE table for `ctx` when the context length changed since the last step,
    /// so memory after a change (or an OOM at a long ctx) reflects the context in use.
    pub fn prepare(&mut self, ctx: i64, scopes: &Scopes) {
        if self.rope.0 == ctx {
            return;
        }
        let _s = scopes.enter(self.scope_rope);
        // The old table is freed before the new one is built.
        self.rope = (0, Tensor::new());
        self.rope = (ctx, rope_table(ctx, self.dims.d_model / self.dims.heads, self.device));
    }

    /// tokens [batch, ctx] (int64) → logits [batch, ctx, vocab], and the blocks
    /// `checkpointing` ran without grad, for `backward_checkpointed` (pass
    /// `Checkpointing::None` without grad).
    pub fn forward(&self, tokens: &Tensor, attention: Attention, checkpointing: Checkpointing, scopes: &Scopes) -> (Tensor, Vec<Checkpointed>) {
        let embedded = {
            let _s = scopes.enter(self.scope_embed);
            self.embed.index(&[Some(tokens)])
        };
        // The embedding stays referenced until forward returns, as in the reference.
        let mut x: Option<Tensor> = None;
        let mut checkpointed = Vec::new();
        for (i, b) in self.blocks.iter().enumerate() {
            let input = x.as_ref().unwrap_or(&embedded);
            let next = if checkpointing.covers(i as i64) {
                // torch.utils.checkpoint(block, x, use_reentrant=True): the block runs without
                // grad, keeping nothing but its input; its output is a leaf that collects the
                // gradient backward brings to it.
                let output = tch::no_grad(|| self.block(b, input, attention, scopes)).set_requires_grad(true);
                checkpointed.push(Checkpointed { block: i, input: input.shallow_clone(), output: output.shallow_clone() });
                output
            } else {
                self.block(b, input, attention, scopes)
            };
            x = Some(next);
        }
        let normed = {
            let _s = scopes.enter(self.scope_final);
            self.ln_final.forward(x.as_ref().unwrap_or(&embedded))
        };
        drop(x);
        let logits = {
            let _s = scopes.enter(self.scope_head);
            self.lm_head.forward(&normed)
        };
        drop(normed);
        drop(embedded);
        (logits, checkpointed)
    }

    /// Backward through the checkpointed blocks, once `loss.backward()` has brought the
    /// gradient to the last one's output: each block, last first, runs its forward again
    /// with grad (under autocast where forward ran under it: `autocast(true)` and
    /// `autocast(false)` enter and leave it) and backward goes through it with its output's
    /// gradient. A block's input gradient goes on into the graph before it, or straight to
    /// the checkpointed block before it, as torch's reentrant checkpoint hands it on.
    pub fn backward_checkpointed(&self, mut checkpointed: Vec<Checkpointed>, attention: Attention, scopes: &Scopes, autocast: &dyn Fn(bool)) -> Result<(), crate::capture::ShimError> {
        let mut carried: Option<Tensor> = None;
        while let Some(Checkpointed { block, input, output }) = checkpointed.pop() {
            let grad = carried.take().unwrap_or_else(|| output.grad());
            drop(output);
            let x = input.detach().set_requires_grad(true);
            autocast(true);
            let y = self.block(&self.blocks[block], &x, attention, scopes);
            autocast(false);
            crate::capture::backward(y, grad)?;
            let grad_in = x.grad();
            drop(x);
            if checkpointed.last().is_some_and(|before| before.block + 1 == block) {
                carried = Some(grad_in);
            } else {
                crate::capture::backward(input, grad_in)?;
            }
        }
        Ok(())
    }

    fn block(&self, b: &Block, x: &Tensor, attention: Attention, scopes: &Scopes) -> Tensor {
        let h = {
            let _s = scopes.enter(b.scope_ln1);
            b.ln1.forward(x)
        };
        let attn_out = {
            let _s = scopes.enter(b.scope_attn);
            self.attention(b, &h, attention)
        };
        drop(h);
        let mid = x + &attn_out;
        let h = {
            let _s = scopes.enter(b.scope_ln2);
            b.ln2.forward(&mid)
        };
        let ffn_out = {
            let _s = scopes.enter(b.scope_ffn);
            swiglu(b, &h)
        };
        drop(h);
        let out = &mid + &ffn_out;
        drop(attn_out);
        drop(mid);
        drop(ffn_out);
        out
    }

    fn attention(&self, b: &Block, x: &Tensor, attention: Attention) -> Tensor {
        let (bs, t, d) = x.size3().expect("activations are [batch, ctx, d_model]");
        let h = self.dims.heads;
        let dh = d / h;
        // [b, t, (h dh)] → [b, h, t, dh], a view.
        let split = |y: Tensor| y.view([bs, t, h, dh]).permute([0, 2, 1, 3]);
        let q = split(b.q.forward(x));
        let k = split(b.k.forward(x));
        let v = split(b.v.forward(x));
        let q_rot = self.rope_forward(&q);
        drop(q);
        let k_rot = self.rope_forward(&k);
        drop(k);
        let (heads_out, mask) = match attention {
            Attention::Naive => {
                let positions = Tensor::arange(t, (Kind::Int64, self.device));
                let mask = positions.view([t, 1]).ge_tensor(&positions.view([1, t])).unsqueeze(0);
                let out = attention_core(&q_rot, &k_rot, &v, &mask);
                (out, Some((positions, mask)))
            }
            Attention::Fused => {
                let out = Tensor::scaled_dot_product_attention(&q_rot, &k_rot, &v, None::<Tensor>, 0.0, true, None, false);
                (out, None)
            }
        };
        let merged = heads_out.permute([0, 2, 1, 3]).reshape([bs, t, d]).contiguous();
        drop(heads_out);
        let out = b.o.forward(&merged);
        drop(q_rot);
        drop(k_rot);
        drop(v);
        if let Some((positions, mask)) = mask {
            drop(positions);
            drop(mask);
        }
        drop(merged);
        out
    }

    /// Rotates feature pairs (2i, 2i+1) of x [batch, heads, ctx, d_head] by position, and
    /// puts the rotated evens before the rotated odds, as the reference's RoPE does.
    fn rope_forward(&self, x: &Tensor) -> Tensor {
        let s = x.size();
        let pairs = x.view([s[0], s[1], s[2], s[3] / 2, 2]).permute([4, 0, 1, 2, 3]);
        let halves = pairs.unbind(0);
        let (even, odd) = (&halves[0], &halves[1]);
        let table = self.rope.1.narrow(1, 0, s[2]).unbind(0);
        let (cos, sin) = (&table[0], &table[1]);
        let a = cos * even;
        let c = sin * odd;
        let first = &a - &c;
        drop(a);
        drop(c);
        let a = sin * even;
        let c = cos * odd;
        let second = &a + &c;
        drop(a);
        drop(c);
        let out = Tensor::cat(&[&first, &second], -1);
        drop(first);
        drop(second);
        out
    }
}

/// Scores by einsum then `/ √d_k`, the causal mask by `torch.where`, the three-step
/// softmax, then the weighted sum of values by einsum.
fn attention_core(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Tensor {
    let d_k = k.size()[3];
    let raw = Tensor::einsum("...ab,...cb->...ac", &[q, k], None::<i64>);
    // Python divides by a float through a 0-dim double tensor, which autograd saves until
    // backward; dividing by a Scalar would save no tensor.
    let root_d_k = Tensor::scalar_tensor((d_k as f64).sqrt(), (Kind::Double, Device::Cpu));
    let scores = &raw / &root_d_k;
    drop(root_d_k);
    drop(raw);
    let masked = scores.where_scalarother(mask, f64::NEG_INFINITY);
    drop(scores);
    let probs = softmax(&masked);
    let out = Tensor::einsum("...ab,...bc->...ac", &[&probs, v], None::<i64>);
    drop(masked);
    drop(probs);
    out
}

/// `w2(silu(w1 x) * w3 x)` with SiLU as `x * sigmoid(x)`.
fn swiglu(b: &Block, x: &Tensor) -> Tensor {
    let gate = b.w1.forward(x);
    let sig = gate.sigmoid();
    let silu = &gate * &sig;
    drop(sig);
    drop(gate);
    let up = b.w3.forward(x);
    let prod = &silu * &up;
    drop(silu);
    drop(up);
    let out = b.w2.forward(&prod);
    drop(prod);
    out
}
