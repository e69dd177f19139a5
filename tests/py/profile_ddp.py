"""Two gloo ranks under torchrun, each profiling two windows of one step with
tensorboard_trace_handler into the directory given: four trace files, each stating its
rank (`distributedInfo`)."""

import os
import sys

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(128, 128))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(32, 128)
with profile(
    activities=[ProfilerActivity.CPU],
    schedule=schedule(wait=0, warmup=1, active=1, repeat=2),
    on_trace_ready=tensorboard_trace_handler(sys.argv[1]),
    profile_memory=True,
) as prof:
    for _ in range(5):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        prof.step()
# Both ranks' traces are written. torch 2.13 sometimes aborts tearing down gloo after a
# profiled run ("terminate called without an active exception"): leave without it.
dist.barrier()
sys.stdout.flush()
os._exit(0)
