"""fp16 autocast with GradScaler on inputs nobody normalised (raw sensor values around 1e5):
the first Linear's fp16 output overflows from the very first step, every loss is inf/NaN,
every optimizer step is skipped, and the scale halves each step until it underflows."""

import argparse
import time

import torch
from _truth import Truth
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=40)
p.add_argument("--batch", type=int, default=128)
p.add_argument("--truth")
a = p.parse_args()
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")

model = nn.Sequential(nn.Linear(2048, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                      nn.Linear(4096, 2048)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler(dev.type)
x = torch.randn(a.batch, 2048, device=dev) * 3e5
y = torch.randn(a.batch, 2048, device=dev)
truth = Truth(a.truth, script="fp16_overflow", batch=a.batch)
end = time.time() + a.seconds
skipped = 0
while time.time() < end:
    with torch.autocast(dev.type, dtype=torch.float16):
        loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    scaler.scale(loss).backward()
    before = scaler.get_scale()
    scaler.step(opt)
    scaler.update()
    skipped += scaler.get_scale() < before
    truth.step()
truth.facts.update(skipped_scale_drops=int(skipped), final_scale=scaler.get_scale())
truth.end = "exited"
