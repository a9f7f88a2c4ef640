"""A loop that keeps GPU tensors alive across steps (outputs collected with their graphs,
as metric code does) until CUDA runs out of memory. The batch never changes. Sized so the
leak fills the GPU in about --fill-seconds."""

import argparse
import time

import torch
from _truth import Truth
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=256)
p.add_argument("--fill-seconds", type=float, default=60)
p.add_argument("--truth")
a = p.parse_args()
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")

model = nn.Sequential(*[nn.Sequential(nn.Linear(4096, 4096), nn.GELU()) for _ in range(6)],
                      nn.Linear(4096, 1000)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(a.batch, 4096, device=dev)
y = torch.randint(0, 1000, (a.batch,), device=dev)
truth = Truth(a.truth, script="leak_oom", batch=a.batch)
# measure the step time, then leak enough per step to fill the GPU in fill_seconds
for _ in range(20):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    truth.step()
if dev.type == "cuda":
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
else:
    free, total = 8 << 30, 8 << 30
t = time.perf_counter()
for _ in range(20):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
if dev.type == "cuda":
    torch.cuda.synchronize()
step_s = (time.perf_counter() - t) / 20
leak_bytes = int(free / (a.fill_seconds / step_s))
truth.facts.update(leak_bytes_per_step=leak_bytes, step_seconds_measured=step_s)
print(f"leaking {leak_bytes / 2**20:.1f} MiB per step of {step_s * 1000:.1f} ms", flush=True)
kept = []
try:
    while True:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        kept.append(torch.empty(leak_bytes, dtype=torch.uint8, device=dev).fill_(1))
        kept.append(loss)  # the loss with its graph, "for the epoch's mean"
        truth.step()
except torch.cuda.OutOfMemoryError:
    truth.end = "oom"
    raise
