"""A recommendation model's hand-written loop (no DataLoader: ids drawn on the GPU): an
EmbeddingBag table that takes most of the GPU's memory (``--rows`` x 128 floats, 56 GB by
default, sparse gradients, plain SGD, so no optimizer state beside it) under a small MLP,
at batch 256 of 20 ids a sample: each step many small kernels, the memory held by the
table, not by the batch's activations."""
import argparse
import json
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=256)
p.add_argument("--rows", type=int, default=110_000_000)
p.add_argument("--dim", type=int, default=128)
p.add_argument("--ids", type=int, default=20)
p.add_argument("--seconds", type=float, default=35)
p.add_argument("--out")
a = p.parse_args()
t0 = time.time()
dev = "cuda"
table = torch.nn.EmbeddingBag(a.rows, a.dim, mode="sum", sparse=True, device=dev)
mlp = torch.nn.Sequential(torch.nn.Linear(a.dim, 256), torch.nn.ReLU(),
                          torch.nn.Linear(256, 64), torch.nn.ReLU(),
                          torch.nn.Linear(64, 1)).to(dev)
opt = torch.optim.SGD(list(table.parameters()) + list(mlp.parameters()), lr=0.01)
offsets = torch.arange(0, a.batch * a.ids, a.ids, device=dev)
steps = 0
first = None
while time.time() - t0 < a.seconds:
    ids = torch.randint(0, a.rows, (a.batch * a.ids,), device=dev)
    y = torch.randint(0, 2, (a.batch, 1), device=dev).float()
    logits = mlp(table(ids, offsets))
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if first is None:
        torch.cuda.synchronize()
        first = time.time()
    if steps % 500 == 0:
        print(f"step {steps} loss {loss.item():.4f}", flush=True)
    steps += 1
torch.cuda.synchronize()
if a.out:
    with open(a.out, "w") as f:
        json.dump({"steps": steps, "wall_seconds": time.time() - t0,
                   "train_seconds": time.time() - (first or t0),
                   "table_bytes": a.rows * a.dim * 4}, f)
