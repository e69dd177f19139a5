//! CS336's BasicsTransformerLM in tch: token embedding, pre-norm blocks (RMSNorm, causal
//! multi-head attention with RoPE, SwiGLU), final norm, LM head. Weights are plain leaf
//! tensors so the loop knows every parameter's address (for exact categories).

use tch::{Device, Kind, Tensor};

use vramscope::producer::scopes::Scopes;
use vramscope::step_config::{Attention, ModelDims};

const RMS_EPS: f64 = 1e-5;
const ROPE_THETA: f64 = 10_000.0;

struct Linear {
    /// [out, in], as torch.nn.Linear.
    w: Tensor,
}

impl Linear {
    fn new(d_in: i64, d_out: i64, device: Device) -> Linear {
        // CS336 init: truncated normal, std sqrt(2 / (d_in + d_out)), cut at 3 std.
        let std = (2.0 / (d_in + d_out) as f64).sqrt();
        let w = (Tensor::randn([d_out, d_in], (Kind::Float, device)) * std)
            .clamp(-3.0 * std, 3.0 * std)
            .set_requires_grad(true);
        Linear { w }
    }
    fn forward(&self, x: &Tensor) -> Tensor {
        x.matmul(&self.w.tr())
    }
}

struct RmsNorm {
    g: Tensor,
}

impl RmsNorm {
    fn new(d: i64, device: Device) -> RmsNorm {
        RmsNorm { g: Tensor::ones([d], (Kind::Float, device)).set_requires_grad(true) }
    }
    /// Computed in fp32 whatever the input precision, as CS336 specifies.
    fn forward(&self, x: &Tensor) -> Tensor {
        let kind = x.kind();
        let xf = x.to_kind(Kind::Float);
        let rms = (xf.square().mean_dim(-1, true, Kind::Float) + RMS_EPS).rsqrt();
        (xf * rms * &self.g).to_kind(kind)
    }
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

pub struct TransformerLm {
    pub dims: ModelDims,
    device: Device,
    embed: Tensor,
    blocks: Vec<Block>,
    ln_final: RmsNorm,
    lm_head: Linear,
    /// RoPE tables for the current context length: [ctx, d_head/2].
    rope: Option<(i64, Tensor, Tensor)>,
    scope_embed: u32,
    scope_final: u32,
    scope_head: u32,
    scope_rope: u32,
}

impl TransformerLm {
    pub fn new(dims: ModelDims, device: Device, scopes: &Scopes) -> TransformerLm {
        let d = dims.d_model;
        let embed = Tensor::randn([dims.vocab, d], (Kind::Float, device))
            .clamp(-3.0, 3.0)
            .set_requires_grad(true);
        let blocks = (0..dims.layers)
            .map(|i| Block {
                ln1: RmsNorm::new(d, device),
                q: Linear::new(d, d, device),
                k: Linear::new(d, d, device),
                v: Linear::new(d, d, device),
                o: Linear::new(d, d, device),
                ln2: RmsNorm::new(d, device),
                w1: Linear::new(d, dims.d_ff, device),
                w2: Linear::new(dims.d_ff, d, device),
                w3: Linear::new(d, dims.d_ff, device),
                scope_attn: scopes.intern(&format!("layers.{i}.attn")),
                scope_ffn: scopes.intern(&format!("layers.{i}.ffn")),
                scope_ln1: scopes.intern(&format!("layers.{i}.ln1")),
                scope_ln2: scopes.intern(&format!("layers.{i}.ln2")),
            })
            .collect();
        TransformerLm {
            dims,
            device,
            embed,
            blocks,
            ln_final: RmsNorm::new(d, device),
            lm_head: Linear::new(d, dims.vocab, device),
            rope: None,
            scope_embed: scopes.intern("token_embeddings"),
            scope_final: scopes.intern("ln_final"),
            scope_head: scopes.intern("lm_head"),
            scope_rope: scopes.intern("rope_cache"),
        }
    }

    /// Every parameter with its name, as the CS336 reference's `named_parameters()` calls
    /// it (the names the allocations table and snapshots show).
    pub fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut p = vec![("token_embeddings.weight".to_string(), &self.embed)];
        for (i, b) in self.blocks.iter().enumerate() {
            for (name, t) in [
                ("ln1.weight", &b.ln1.g),
                ("attn.q_proj.weight", &b.q.w),
                ("attn.k_proj.weight", &b.k.w),
                ("attn.v_proj.weight", &b.v.w),
                ("attn.output_proj.weight", &b.o.w),
                ("ln2.weight", &b.ln2.g),
                ("ffn.w1.weight", &b.w1.w),
                ("ffn.w2.weight", &b.w2.w),
                ("ffn.w3.weight", &b.w3.w),
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

    /// `zero_grad(set_to_none=True)`: gradients are freed, not zeroed.
    pub fn clear_grads(&self) {
        for p in self.parameters() {
            crate::capture::clear_grad(p);
        }
    }

    pub fn parameter_count(&self) -> i64 {
        self.parameters().iter().map(|t| t.numel() as i64).sum()
    }

    /// Sizes the RoPE tables for `ctx`; rebuilt when ctx changes, so memory after a
    /// change (or an OOM at a long ctx) reflects the context actually in use.
    pub fn prepare(&mut self, ctx: i64, scopes: &Scopes) {
        if self.rope.as_ref().is_some_and(|(c, _, _)| *c == ctx) {
            return;
        }
        let _s = scopes.enter(self.scope_rope);
        let half = self.dims.d_model / self.dims.heads / 2;
        let inv = Tensor::arange(half, (Kind::Float, self.device))
            .g_mul_scalar(-2.0 / (2 * half) as f64 * ROPE_THETA.ln())
            .exp();
        let pos = Tensor::arange(ctx, (Kind::Float, self.device));
        let ang = pos.unsqueeze(1) * inv.unsqueeze(0);
        self.rope = None; // free the old tables before allocating the new ones
        self.rope = Some((ctx, ang.cos(), ang.sin()));
    }

    /// tokens [batch, ctx] (int64) → logits [batch, ctx, vocab].
    // `x = x + a` must stay: tch's `+=` adds in place, which breaks the autograd graph
    // (the residual stream is saved for backward).
    #[allow(clippy::assign_op_pattern)]
    pub fn forward(&self, tokens: &Tensor, attention: Attention, scopes: &Scopes) -> Tensor {
        let mut x = {
            let _s = scopes.enter(self.scope_embed);
            self.embed.index_select(0, &tokens.flatten(0, -1)).view([
                tokens.size()[0],
                tokens.size()[1],
                self.dims.d_model,
            ])
        };
        for b in &self.blocks {
            let h = {
                let _s = scopes.enter(b.scope_ln1);
                b.ln1.forward(&x)
            };
            let a = {
                let _s = scopes.enter(b.scope_attn);
                self.attention(b, &h, attention)
            };
            x = x + a;
            let h = {
                let _s = scopes.enter(b.scope_ln2);
                b.ln2.forward(&x)
            };
            let f = {
                let _s = scopes.enter(b.scope_ffn);
                b.w2.forward(&(b.w1.forward(&h).silu() * b.w3.forward(&h)))
            };
            x = x + f;
        }
        let h = {
            let _s = scopes.enter(self.scope_final);
            self.ln_final.forward(&x)
        };
        let _s = scopes.enter(self.scope_head);
        self.lm_head.forward(&h)
    }

    fn attention(&self, b: &Block, x: &Tensor, attention: Attention) -> Tensor {
        let (bs, t, d) = x.size3().expect("activations are [batch, ctx, d_model]");
        let h = self.dims.heads;
        let dh = d / h;
        let split = |y: Tensor| y.view([bs, t, h, dh]).transpose(1, 2);
        let q = self.rope(split(b.q.forward(x)), t);
        let k = self.rope(split(b.k.forward(x)), t);
        let v = split(b.v.forward(x));
        let out = match attention {
            Attention::Naive => {
                // Materialised [batch, heads, ctx, ctx] scores: the quadratic term CS336 measures.
                let scores = q.matmul(&k.transpose(-2, -1)) / (dh as f64).sqrt();
                let mask = Tensor::ones([t, t], (Kind::Bool, self.device)).triu(1);
                let probs = scores.masked_fill(&mask, f64::NEG_INFINITY).softmax(-1, scores.kind());
                probs.matmul(&v)
            }
            Attention::Fused => Tensor::scaled_dot_product_attention(
                &q,
                &k,
                &v,
                None::<Tensor>,
                0.0,
                true,
                None,
                false,
            ),
        };
        b.o.forward(&out.transpose(1, 2).contiguous().view([bs, t, d]))
    }

    /// Rotates pairs of features of x [batch, heads, ctx, d_head] by position.
    fn rope(&self, x: Tensor, t: i64) -> Tensor {
        let (_, cos, sin) = self.rope.as_ref().expect("prepare() runs before forward");
        let kind = x.kind();
        let cos = cos.narrow(0, 0, t).to_kind(kind);
        let sin = sin.narrow(0, 0, t).to_kind(kind);
        let s = x.size();
        let pairs = x.view([s[0], s[1], s[2], s[3] / 2, 2]);
        let x1 = pairs.select(-1, 0);
        let x2 = pairs.select(-1, 1);
        let r1 = &x1 * &cos - &x2 * &sin;
        let r2 = x1 * &sin + x2 * &cos;
        Tensor::stack(&[r1, r2], -1).view([s[0], s[1], s[2], s[3]])
    }
}
