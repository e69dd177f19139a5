"""Training loops with and without a memory leak, as people write them, for
`vramscope py --headless --check-growth`. `python growth_cases.py CASE`; 8 steps each.

Leaks:
  kept-outputs    `hist.append(out)`: every step's output, and its graph, stays alive
  kept-losses     `total = total + loss` with no backward: every step's graph stays alive
  cache           a dict that caches a tensor per step and is never cleared
Healthy:
  warmup          AdamW's state appears at the first step, then nothing grows
  varying-shapes  batch sizes that go up and down from step to step
  periodic-eval   an evaluation pass under no_grad every third step
  no-zero-grad    gradient accumulation that never zeroes: wrong, but it grows nothing
"""

import sys

import torch

import vramscope_hook

STEPS = 8
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
case = sys.argv[1]


def batch(n=64):
    return torch.randn(n, 128)


if case == "kept-outputs":
    hist = []
    for _ in range(STEPS):
        out = model(batch())
        out.pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        hist.append(out)
elif case == "kept-losses":
    total = 0
    for _ in range(STEPS):
        loss = model(batch()).pow(2).mean()
        total = total + loss
        vramscope_hook.step(loss)
elif case == "cache":
    cache = {}
    for step in range(STEPS):
        x = batch()
        out = model(x)
        out.pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        cache[step] = out.detach().clone()
elif case == "warmup":
    for _ in range(STEPS):
        model(batch()).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
elif case == "varying-shapes":
    for n in [64, 128, 96, 160, 32, 144, 80, 112][:STEPS]:
        model(batch(n)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
elif case == "periodic-eval":
    for step in range(STEPS):
        model(batch()).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if step % 3 == 2:
            with torch.no_grad():
                for _ in range(2):
                    model(batch(256)).mean().item()
elif case == "no-zero-grad":
    for _ in range(STEPS):
        model(batch()).pow(2).mean().backward()
        opt.step()
else:
    raise SystemExit(f"no case {case}")
print("trained", STEPS, "steps")
