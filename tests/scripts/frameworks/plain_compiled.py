"""A small MLP regression in a plain loop under ``torch.compile``, reading ``loss.item()`` every step.

Batches are gathered from a tensor in host memory and copied to the GPU each step. The
loop counts its steps (the truth, --out) and stops after ``--seconds``; ``--mode none``
leaves the model uncompiled.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=256)
p.add_argument("--width", type=int, default=512)
p.add_argument("--mode", default="default", help="torch.compile's mode, or none")
p.add_argument("--seconds", type=float, default=35)
p.add_argument("--out", help="write the steps counted here (JSON)")
a = p.parse_args()

dev = "cuda"
layers = [m for _ in range(6) for m in (torch.nn.Linear(a.width, a.width), torch.nn.GELU())]
model = torch.nn.Sequential(*layers, torch.nn.Linear(a.width, 1)).to(dev)
if a.mode == "none":
    run = model
elif a.mode == "default":
    run = torch.compile(model)
else:
    run = torch.compile(model, mode=a.mode)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
X = torch.randn(100_000, a.width)
Y = X[:, :4].sum(1, keepdim=True)
losses: list[float] = []
t0: float | None = None
n = 0
while True:
    idx = torch.randint(0, len(X), (a.batch,))
    x, y = X[idx].to(dev), Y[idx].to(dev)
    loss = torch.nn.functional.mse_loss(run(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
    n += 1
    t0 = t0 or time.time()
    if time.time() - t0 > a.seconds:
        break
if a.out:
    with open(a.out, "w") as f:
        json.dump({"steps": n, "batch": a.batch, "mode": a.mode}, f)
