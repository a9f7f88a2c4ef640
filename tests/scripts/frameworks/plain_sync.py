"""A hand-written loop on tensors already on the GPU (no DataLoader): an MLP in fp32 at
batch 256, loss.item() and torch.cuda.synchronize() every step for a progress line."""
import argparse
import json
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=256)
p.add_argument("--width", type=int, default=1024)
p.add_argument("--seconds", type=float, default=35)
p.add_argument("--out")
a = p.parse_args()
t0 = time.time()
dev = "cuda"
X = torch.randn(200_000, 512, device=dev)
Y = torch.randint(0, 10, (200_000,), device=dev)
model = torch.nn.Sequential(torch.nn.Linear(512, a.width), torch.nn.ReLU(),
                            torch.nn.Linear(a.width, a.width), torch.nn.ReLU(),
                            torch.nn.Linear(a.width, a.width), torch.nn.ReLU(),
                            torch.nn.Linear(a.width, 10)).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
steps = 0
while time.time() - t0 < a.seconds:
    idx = torch.randint(0, X.shape[0], (a.batch,), device=dev)
    loss = torch.nn.functional.cross_entropy(model(X[idx]), Y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    if steps % 100 == 0:
        print(f"step {steps} loss {loss.item():.4f}", flush=True)
    steps += 1
if a.out:
    with open(a.out, "w") as f:
        json.dump({"steps": steps, "wall_seconds": time.time() - t0}, f)
