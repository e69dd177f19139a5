"""vramscope's built-in model: the CS336 reference transformer's memory behaviour, in your torch.

`vramscope` with no arguments runs this module under the hook where vramscope's own engine
is not installed (a pip install), so the first screen is the course's model on your GPU and
torch, with the same keys as the engine: `p` precision, `[` `]` context length, `{` `}`
batch size, `m` mode, `a` attention, `k` activation checkpointing, `s` snapshot. Run it by hand with

    vramscope py -- python -m vramscope_hook.cs336 --ctx 128 --precision bf16

The course's reference is the `cs336-basics` package inside stanford-cs336/assignment2-systems
(model.py, nn_utils.py, optimizer.py). This file is NOT that code: it is vramscope's own,
written from the op list in DESIGN.md §4 and issue 21. It performs the same allocating ops,
in the same order, with the same dtypes under bf16 autocast, and keeps each temporary alive
exactly as long as the reference's Python does (a local lives until its function returns or
the name is rebound; an expression's temporaries die when the op that consumed them
returns). The `del`s below spell those moments out. Parameters are registered in the
reference's order, because the optimizer visits them in that order.

vramscope's engine (engine/src/model.rs, engine/src/optim.rs) runs the same ops;
tests/reference_model.rs runs this file under `vramscope py` and the engine at the same
configurations and holds their peaks, and the sizes alive at each peak, equal.

`--reference` imports `cs336_basics` from the Python path instead of the classes below, to
hold this file to the real package by hand (see BENCHMARKS.md).
"""

import argparse
import contextlib
import math

import torch
import torch.nn as nn

import vramscope_hook


def _truncated_normal(rows, cols, std):
    w = torch.empty(rows, cols)
    nn.init.trunc_normal_(w, std=std, a=-3 * std, b=3 * std)
    return nn.Parameter(w)


class Linear(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.weight = _truncated_normal(d_out, d_in, math.sqrt(2 / (d_in + d_out)))

    def forward(self, x):
        # The reference's einops pattern "... d_in, d_out d_in -> ... d_out", as einops
        # compacts it for torch.einsum.
        return torch.einsum("...a,ba->...b", x, self.weight)


class Embedding(nn.Module):
    def __init__(self, vocab, d):
        super().__init__()
        self.weight = _truncated_normal(vocab, d, 1.0)

    def forward(self, tokens):
        return self.weight[tokens, :]


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x32 = x.to(torch.float32)  # the same tensor when x is fp32 already
        squares = x32.pow(2)
        mean = squares.mean(-1, keepdim=True)
        del squares
        shifted = mean + self.eps
        del mean
        inv_rms = torch.rsqrt(shifted)
        del shifted
        normed = x32 * inv_rms
        out = (self.weight * normed).to(dtype)
        del normed, inv_rms
        return out


class Rope(nn.Module):
    """One cos/sin table shared by every layer: [2, context, d_head / 2], fp32."""

    def __init__(self, context, d_head, theta=10_000.0):
        super().__init__()
        self.theta = theta
        self.register_buffer("table", self._table(context, d_head, theta), persistent=False)

    def prepare(self, context):
        """A table for `context` positions, as the engine's: the old one is freed first."""
        if self.table.size(1) == context:
            return
        d_head, theta = self.table.size(2) * 2, self.theta
        self.table = None
        self.table = self._table(context, d_head, theta)

    @staticmethod
    def _table(context, d_head, theta):
        steps = torch.arange(0, d_head, 2)
        exponents = steps / d_head
        del steps
        base = torch.tensor(theta)
        negated = -exponents
        inv_freq = base**negated
        del base, negated
        positions = torch.arange(context)
        angles = torch.einsum("a,b->ab", positions, inv_freq)
        del inv_freq
        cos = torch.cos(angles)
        sin = torch.sin(angles)
        table = torch.stack((cos, sin))
        del exponents, angles, positions, cos, sin
        return table

    def forward(self, x, pos_ids=None):
        # Features pair up as (2i, 2i+1): split them into two strided views.
        *lead, d = x.shape
        pairs = x.view(*lead, d // 2, 2).permute(-1, *range(len(lead) + 1))
        even, odd = pairs.unbind(0)
        cos, sin = self.table[:, : x.size(-2), :].unbind(0)
        a = cos * even
        b = sin * odd
        first = a - b
        del a, b
        a = sin * even
        b = cos * odd
        second = a + b
        del a, b
        out = torch.cat((first, second), dim=-1)
        del first, second
        return out


def softmax(x, dim=-1):
    peak = torch.max(x, dim=dim, keepdim=True)[0]
    shifted = x - peak
    del peak
    exps = torch.exp(shifted)
    total = torch.sum(exps, dim=dim, keepdim=True)
    probs = exps / total
    del total, shifted, exps
    return probs


def log_softmax(x, dim=-1):
    peak = torch.max(x, dim=dim, keepdim=True)[0]
    shifted = x - peak
    exps = torch.exp(shifted)
    total = torch.sum(exps, dim=dim, keepdim=True)
    del exps
    log_total = torch.log(total)
    del total
    out = shifted - log_total
    del log_total, shifted, peak
    return out


def cross_entropy(logits, targets):
    logp = log_softmax(logits)
    neg = -logp
    del logp
    picked = torch.gather(neg, -1, targets.unsqueeze(-1))
    loss = torch.mean(picked)
    del picked, neg
    return loss


def attention_core(q, k, v, mask):
    raw = torch.einsum("...ab,...cb->...ac", q, k)
    scores = raw / math.sqrt(k.shape[-1])
    del raw
    masked = torch.where(mask, scores, float("-inf"))
    del scores
    probs = softmax(masked, dim=-1)
    out = torch.einsum("...ab,...bc->...ac", probs, v)
    del masked, probs
    return out


class Attention(nn.Module):
    def __init__(self, d, heads, rope):
        super().__init__()
        self.heads = heads
        self.q_proj = Linear(d, d)
        self.k_proj = Linear(d, d)
        self.v_proj = Linear(d, d)
        self.output_proj = Linear(d, d)
        self.positional_encoder = rope
        self.fused = False  # scaled_dot_product_attention instead of the reference's core

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads

        def split(y):  # [b, t, (h dh)] -> [b, h, t, dh], a view
            return y.view(b, t, h, d // h).permute(0, 2, 1, 3)

        q = split(self.q_proj(x))
        k = split(self.k_proj(x))
        v = split(self.v_proj(x))
        q = self.positional_encoder(q)
        k = self.positional_encoder(k)
        if self.fused:
            heads_out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            positions = mask = None
        else:
            positions = torch.arange(t)
            mask = (positions.view(t, 1) >= positions.view(1, t))[None]
            heads_out = attention_core(q, k, v, mask)
        merged = heads_out.permute(0, 2, 1, 3).reshape(b, t, d).contiguous()
        del heads_out
        out = self.output_proj(merged)
        del q, k, v, positions, mask, merged
        return out


class SwiGLU(nn.Module):
    def __init__(self, d, d_ff):
        super().__init__()
        self.w1 = Linear(d, d_ff)
        self.w2 = Linear(d_ff, d)
        self.w3 = Linear(d, d_ff)

    def forward(self, x):
        gate = self.w1(x)
        sig = torch.sigmoid(gate)
        silu = gate * sig  # the reference's SiLU: x * sigmoid(x)
        del sig, gate
        up = self.w3(x)
        prod = silu * up
        del silu, up
        out = self.w2(prod)
        del prod
        return out


class Block(nn.Module):
    def __init__(self, d, heads, d_ff, rope):
        super().__init__()
        # Registration order is the reference's: attn, ffn, ln1, ln2.
        self.attn = Attention(d, heads, rope)
        self.ffn = SwiGLU(d, d_ff)
        self.ln1 = RMSNorm(d)
        self.ln2 = RMSNorm(d)

    def forward(self, x):
        attn_out = self.attn(self.ln1(x))
        mid = x + attn_out
        ffn_out = self.ffn(self.ln2(mid))
        out = mid + ffn_out
        del attn_out, mid, ffn_out
        return out


class BasicsTransformerLM(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta=10_000.0):
        super().__init__()
        self.token_embeddings = Embedding(vocab_size, d_model)
        rope = Rope(context_length, d_model // num_heads, rope_theta)
        self.positional_encoder = rope
        self.layers = nn.ModuleList(Block(d_model, num_heads, d_ff, rope) for _ in range(num_layers))
        self.ln_final = RMSNorm(d_model)
        self.lm_head = Linear(d_model, vocab_size)
        self.checkpoint_every = 0  # activation checkpointing: every k-th block from block 0, 0 for none

    def forward(self, tokens):
        embedded = self.token_embeddings(tokens)
        x = embedded  # the embedding stays referenced until forward returns
        for i, layer in enumerate(self.layers):
            if self.checkpoint_every and i % self.checkpoint_every == 0 and torch.is_grad_enabled():
                # The block keeps only its input and runs again in backward. No RNG state is
                # stashed: the model draws no random numbers in forward (no dropout).
                x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=True, preserve_rng_state=False)
            else:
                x = layer(x)
        x = self.ln_final(x)
        logits = self.lm_head(x)
        del x, embedded
        return logits


class AdamW(torch.optim.Optimizer):
    """The reference's AdamW: new moment tensors every step (the old ones are freed only
    when the next parameter's moments replace them in its locals), and a zeros_like per
    moment per step, made even when the state already has one."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def step(self, closure=None):
        prev_m = prev_v = None
        for group in self.param_groups:
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.data
                state = self.state[p]
                t = state.get("t", 1)
                step_size = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
                decay = lr * wd * p.data
                p.data -= decay
                del decay
                zeros = torch.zeros_like(g)
                m_before = state.get("m", zeros)
                del zeros
                prev_m = m_before  # the previous parameter's old m is freed here
                zeros = torch.zeros_like(g)
                v_before = state.get("v", zeros)
                del zeros
                prev_v = v_before
                del m_before, v_before
                a = b1 * prev_m
                c = (1 - b1) * g
                m = a + c
                del a, c
                a = b2 * prev_v
                sq = torch.square(g)
                c = (1 - b2) * sq
                del sq
                v = a + c
                del a, c
                scaled = step_size * m
                root = torch.sqrt(v)
                denom = root + eps
                del root
                update = scaled / denom
                del scaled, denom
                p.data -= update
                del update
                state["m"] = m
                state["v"] = v
                state["t"] = t + 1
                del m, v
        del prev_m, prev_v
        return None


# torch.OutOfMemoryError from 2.5 on; torch.cuda's before.
_OutOfMemory = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


def _checkpoint_every(value):
    """`none`, `all`, `every-K` (vramscope's spelling) → K, 0 for none."""
    if value == "none":
        return 0
    if value == "all":
        return 1
    k = value.removeprefix("every-")
    if k.isdigit() and int(k) >= 1:
        return int(k)
    raise argparse.ArgumentTypeError(f"unknown checkpointing '{value}' (allowed: none, all, every-K)")


def _checkpointing_name(every):
    return {0: "none", 1: "all"}.get(every, f"every-{every}")


def _device(name):
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m vramscope_hook.cs336", description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=10_000)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ctx", type=int, default=128)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32", help="fp16: autocast with a GradScaler")
    p.add_argument("--mode", choices=["forward", "train"], default="train")
    p.add_argument("--attention", choices=["naive", "fused"], default="naive")
    p.add_argument("--optimizer", choices=["reference", "torch"], default="reference", help="the reference's AdamW or torch.optim.AdamW")
    p.add_argument("--checkpointing", type=_checkpoint_every, default="none", help="activation checkpointing: none, all (every block) or every-K")
    p.add_argument("--steps", type=int, default=2, help="steps to run (0: until stopped)")
    p.add_argument("--device", default="auto", help="auto (CUDA when there is one), cpu, cuda or cuda:N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reference", action="store_true", help="run the cs336_basics package on the Python path instead")
    a = p.parse_args(argv)

    if a.reference:
        from cs336_basics.model import BasicsTransformerLM as Model
        from cs336_basics.nn_utils import cross_entropy as loss_fn
        from cs336_basics.optimizer import AdamW as Reference
    else:
        Model, loss_fn, Reference = BasicsTransformerLM, cross_entropy, AdamW

    device = _device(a.device)
    torch.manual_seed(a.seed)
    # Factory calls (weights, tables, batches) make their tensors on the device itself.
    with torch.device(device):
        value = _train(a, Model, loss_fn, Reference, device)
    print(f"ran {a.steps} steps, last loss {value:.3f}")


def _train(a, Model, loss_fn, Reference, device):
    model = Model(a.vocab, a.ctx, a.d_model, a.layers, a.heads, a.d_ff)
    made = {}

    def optimizer(kind):
        # A new optimizer (no state) when the `optimizer` knob changes it.
        if made.get("kind") != kind:
            made.clear()
            cls = Reference if kind == "reference" else torch.optim.AdamW
            made.update(kind=kind, opt=cls(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01))
        return made["opt"]

    # fp16 scales the loss, as on GPUs without bf16; made at the first fp16 step.
    scaler = []
    value = math.nan
    step = 0
    while a.steps == 0 or step < a.steps:
        # The screen's keys change these between steps (the engine's knobs, by name).
        ctx = vramscope_hook.knob("ctx", a.ctx)
        batch = vramscope_hook.knob("batch", a.batch)
        precision = vramscope_hook.knob("precision", a.precision)
        train = vramscope_hook.knob("mode", a.mode) == "train"
        fused = vramscope_hook.knob("attention", a.attention) == "fused"
        opt = optimizer(vramscope_hook.knob("optimizer", a.optimizer))
        if not a.reference:
            model.positional_encoder.prepare(ctx)
            for layer in model.layers:
                layer.attn.fused = fused
            try:
                model.checkpoint_every = _checkpoint_every(vramscope_hook.knob("checkpointing", _checkpointing_name(a.checkpointing)))
            except argparse.ArgumentTypeError:
                pass  # a value the key does not send: keep what runs
        if precision == "fp16" and not scaler:
            scaler.append(torch.amp.GradScaler(device.type))
        value = _step(model, opt, loss_fn, a.vocab, ctx, batch, precision, train, device, scaler[0] if precision == "fp16" else None)
        step += 1
        if vramscope_hook.stop_requested():
            break
    return value


def _step(model, opt, loss_fn, vocab, ctx, batch, precision, train, device, scaler):
    """The engine's step, op for op: fresh tokens and targets, the loss computed from the
    logits in one expression (the logits die with it), backward, the optimizer step,
    zero_grad(set_to_none=True), then the loss and the batch are dropped. Under fp16 the
    `scaler` scales the loss and steps (or skips) the optimizer. An out-of-memory error ends
    the step, not the run: the screen says so and the keys can shrink it."""
    tokens = torch.randint(vocab, (batch, ctx))
    targets = torch.randint(vocab, (batch, ctx))
    grad = contextlib.nullcontext() if train else torch.no_grad()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    cast = torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
    value = math.nan
    try:
        with grad, cast:
            loss = loss_fn(model(tokens), targets)
        value = loss.item()
        vramscope_hook.loss(value)  # read here anyway: on CUDA the hook reads none itself
        if train and scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
        elif train:
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            vramscope_hook.step(value)
        del loss
    except _OutOfMemory as e:
        opt.zero_grad(set_to_none=True)
        print(f"out of memory at ctx {ctx}, batch {batch}, {precision}: {str(e).splitlines()[0]}", flush=True)
        vramscope_hook.step()
    del tokens, targets
    return value


if __name__ == "__main__":
    main()
