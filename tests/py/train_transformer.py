"""A small decoder-only transformer trained with AdamW, as a user writes one (CS336 style:
pre-norm blocks, RMSNorm, causal attention with einsum, SwiGLU). It knows nothing about
vramscope, except that it declares a `ctx` knob when the hook is there. It writes its own
figures (parameter names and bytes, optimizer state bytes) to --out, for the tests to hold
vramscope's stream to."""

import argparse
import json
import math
import os
import time

import torch
import torch.nn as nn

try:
    import vramscope_hook
except ImportError:
    vramscope_hook = None


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.output_proj = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = (p(x).view(b, t, h, d // h).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(d // h)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1)
        probs = torch.softmax(torch.where(mask, float("-inf"), scores), dim=-1)
        return self.output_proj((probs @ v).transpose(1, 2).reshape(b, t, d))


class FFN(nn.Module):
    def __init__(self, d, d_ff):
        super().__init__()
        self.w1 = nn.Linear(d, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d, bias=False)
        self.w3 = nn.Linear(d, d_ff, bias=False)

    def forward(self, x):
        a = self.w1(x)
        return self.w2(a * torch.sigmoid(a) * self.w3(x))


class Block(nn.Module):
    def __init__(self, d, heads, d_ff):
        super().__init__()
        self.ln1 = RMSNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = RMSNorm(d)
        self.ffn = FFN(d, d_ff)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    def __init__(self, vocab=1000, d=64, heads=4, d_ff=256, layers=2):
        super().__init__()
        self.token_embeddings = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d, heads, d_ff) for _ in range(layers))
        self.ln_final = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        x = self.token_embeddings(tokens)
        for block in self.layers:
            x = block(x)
        return self.lm_head(self.ln_final(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--ctx", type=int, default=32)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--out", help="write this script's own figures here (JSON)")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds to wait after each step")
    p.add_argument("--oom-at", type=int, default=-1, help="at this step, ask for more memory than exists")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--timings", help="write each step's seconds here, one per line")
    p.add_argument("--linger", type=float, default=0.0, help="seconds to wait, model alive, after training")
    p.add_argument("--device", default="cpu", help="where the model trains (cpu, cuda, cuda:N)")
    p.add_argument("--compile", action="store_true", help="train the model through torch.compile")
    p.add_argument("--pytorch-history", metavar="FILE", help="CUDA: also record PyTorch's own memory history, from CUDA init on, and dump its snapshot here at the end")
    a = p.parse_args()
    torch.manual_seed(0)
    device = torch.device(a.device)
    if a.pytorch_history:
        # Initialised first, so both recorders see the job's first allocation.
        torch.cuda.init()
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    model = TransformerLM(d=a.d_model, heads=4, d_ff=4 * a.d_model, layers=a.layers).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if a.compile:
        model = torch.compile(model)
    vocab = 1000
    figures = {"oom": None, "ctx_used": []}
    times = []
    for step in range(a.steps):
        started = time.perf_counter()
        ctx = vramscope_hook.knob("ctx", a.ctx) if vramscope_hook else a.ctx
        figures["ctx_used"].append(ctx)
        tokens = torch.randint(vocab, (a.batch, ctx), device=device)
        targets = torch.randint(vocab, (a.batch, ctx), device=device)
        opt.zero_grad(set_to_none=True)
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.view(-1, vocab), targets.view(-1))
        if step == a.oom_at:
            snapdir = os.environ.get("VRAMSCOPE_SNAPSHOT_DIR", "snapshots")
            try:
                torch.empty(1 << 50, dtype=torch.uint8, device=device)
            except RuntimeError as e:
                # The OOM snapshot must already be on disk when the error reaches us.
                saved = sorted(f for f in os.listdir(snapdir) if f.endswith("_oom.pickle")) if os.path.isdir(snapdir) else []
                figures["oom"] = {"message": str(e).splitlines()[0], "snapshots_when_caught": saved}
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the step's time is the GPU's, not its launches'
        times.append(time.perf_counter() - started)
        if a.sleep:
            time.sleep(a.sleep)
    if a.timings:
        with open(a.timings, "w") as f:
            f.write("\n".join(map(str, times)) + "\n")
    figures["parameters"] = {n: p.nbytes for n, p in model.named_parameters()}
    figures["parameter_bytes"] = sum(p.nbytes for p in model.parameters())
    figures["optimizer_state_bytes"] = sum(
        t.nbytes for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor) and t.numel() > 1
    )
    figures["modules"] = [n for n, _ in model.named_modules() if n]
    if device.type == "cuda":
        figures["cuda"] = {
            "allocated": torch.cuda.memory_allocated(device),
            "max_allocated": torch.cuda.max_memory_allocated(device),
            "reserved": torch.cuda.memory_reserved(device),
            "max_reserved": torch.cuda.max_memory_reserved(device),
        }
    if a.pytorch_history:
        torch.cuda.memory._dump_snapshot(a.pytorch_history)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(figures, f)
    print(f"trained {a.steps} steps, final loss {loss.item():.3f}", flush=True)
    time.sleep(a.linger)


if __name__ == "__main__":
    main()
