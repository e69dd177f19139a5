"""The densest allocation pattern a real job has (issue 35): a small MLP trained with
gradient accumulation, 4 micro-batches of [32, 256] per AdamW step, many small tensors and
many events per millisecond. `benches/hook_overhead.rs --dense` runs it plainly and under
`vramscope py`."""

import argparse
import time

import torch


def build():
    """The model and its optimizer."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 512), torch.nn.GELU(), torch.nn.Linear(512, 10))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def step(model, opt):
    """One AdamW step over 4 micro-batches; returns its seconds."""
    t = time.perf_counter()
    for _ in range(4):
        x = torch.randn(32, 256)
        loss = torch.nn.functional.cross_entropy(model(x), torch.randint(10, (32,))) / 4
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--timings", help="write each step's seconds here, one per line")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    model, opt = build()
    times = [step(model, opt) for _ in range(a.steps)]
    if a.timings:
        with open(a.timings, "w") as f:
            f.write("".join(f"{s}\n" for s in times))


if __name__ == "__main__":
    main()
