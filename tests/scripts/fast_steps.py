"""A real torch training loop that steps as fast as it can (about 2 000 steps a second on
a laptop core) for --seconds, with a DataLoader whose fetches take a measurable share.

Writes its own ground truth to --out as one JSON object: steps taken, and the summed step
time and data wait measured the way the hook measures them (the wait in the loader's
``next()``, the step from one optimizer.step() to the next)."""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=3.0)
p.add_argument("--fetch-us", type=float, default=100.0, help="busy time per sample fetched")
p.add_argument("--out", required=True)
args = p.parse_args()


class Slow(Dataset):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        end = time.perf_counter() + args.fetch_us / 1e6
        while time.perf_counter() < end:
            pass
        return torch.ones(4)


model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
it = iter(DataLoader(Slow(), batch_size=1, num_workers=0))
steps = 0
wait = 0.0
deadline = time.perf_counter() + args.seconds
while time.perf_counter() < deadline:
    t0 = time.perf_counter()
    x = next(it)
    wait += time.perf_counter() - t0
    opt.zero_grad(set_to_none=True)
    model(x).sum().backward()
    opt.step()
    steps += 1
with open(args.out, "w") as f:
    json.dump({"steps": steps, "data_wait_seconds": wait}, f)
