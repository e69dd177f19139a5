"""Profiles a few training steps of a small MLP with torch.profiler as people do
(`profile_memory=True`, a schedule, `tensorboard_trace_handler`, `with_stack`), into the
directory given, then prints what the trace states, read with Python's json: the highest
`Total Allocated` of its CPU memory events and how many there are. `--active N` profiles N
steps (3); `--leak` keeps every step's output, the classic leak. `--timeline DIR` also
writes `export_memory_timeline`'s two JSON forms of the CPU there, and prints each one's
peak and its bytes by category at the peak, summed with Python."""

import glob
import gzip
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX

out = sys.argv[1]
active = int(sys.argv[sys.argv.index("--active") + 1]) if "--active" in sys.argv else 3
leak = "--leak" in sys.argv
timeline = sys.argv[sys.argv.index("--timeline") + 1] if "--timeline" in sys.argv else None
kept = []
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
with profile(
    activities=[ProfilerActivity.CPU],
    schedule=schedule(wait=1, warmup=1, active=active, repeat=1),
    on_trace_ready=tensorboard_trace_handler(out),
    profile_memory=True,
    with_stack=True,
    record_shapes=timeline is not None,
) as prof:
    for _ in range(active + 3):
        out_ = model(x)
        if leak:
            kept.append(out_)
        loss = torch.nn.functional.cross_entropy(out_, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        prof.step()

(path,) = glob.glob(f"{out}/*.pt.trace.json")
events = json.load(open(path))["traceEvents"]
memory = [e["args"] for e in events if e.get("name") == "[memory]" and e["args"]["Device Type"] == 0]
stated = {"max_total_allocated": max(m["Total Allocated"] for m in memory), "memory_events": len(memory)}

if timeline:
    names = ["unknown" if c is None else c.name.lower() for c in _CATEGORY_TO_INDEX]

    def at_peak(states):
        """The first of the highest states (bytes by category index) as {name: bytes}."""
        peak = max(states, key=sum)
        return {"peak": sum(peak), "by_category": {names[i]: b for i, b in enumerate(peak) if b}}

    prof.export_memory_timeline(f"{timeline}/timeline.json", device="cpu")
    prof.export_memory_timeline(f"{timeline}/timeline.raw.json.gz", device="cpu")
    times, sizes = json.load(open(f"{timeline}/timeline.json"))
    stated["timeline"] = at_peak([row[1:] for row in sizes])
    running, states = [0] * len(names), []
    for _, _, nbytes, category in json.load(gzip.open(f"{timeline}/timeline.raw.json.gz")):
        running[category] += nbytes
        states.append(list(running))
    stated["timeline_raw"] = at_peak(states)
print(json.dumps(stated))
