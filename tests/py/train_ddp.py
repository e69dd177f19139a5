"""Two-rank data-parallel training on CPU (torchrun, gloo), as a user writes it: each rank
builds the model, wraps it in DistributedDataParallel and trains with AdamW. Rank r writes
its figures to --out with `{rank}` replaced."""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(500, 64)
        self.hidden = nn.Linear(64, 256)
        self.head = nn.Linear(256, 500)

    def forward(self, tokens):
        return self.head(torch.relu(self.hidden(self.embed(tokens))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds to wait after each step")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DDP(MLP())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(a.steps):
        tokens = torch.randint(500, (4, 16))
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(tokens).view(-1, 500), tokens.view(-1))
        loss.backward()
        opt.step()
        time.sleep(a.sleep)
    if a.out:
        with open(a.out.replace("{rank}", str(rank)), "w") as f:
            json.dump({"rank": rank, "parameter_bytes": sum(p.nbytes for p in model.parameters()),
                       "parameters": [n for n, _ in model.module.named_parameters()]}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
