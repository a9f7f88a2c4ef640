"""A loop that stops after its first 20 s of training to compute a metric on the CPU for
~70 s (pure Python over the predictions, the GPU idle), then trains on: a pause, not a hang."""
import argparse
import json
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--pause", type=float, default=70)
p.add_argument("--out")
a = p.parse_args()
t0 = time.time()
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(200_000, 1024), torch.randint(0, 10, (200_000,))),
                                     batch_size=1024, shuffle=True, num_workers=4, pin_memory=True, persistent_workers=True)
steps = 0
truth = {}
def train(seconds):
    global steps
    t = time.time()
    while time.time() - t < seconds:
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps += 1
            if time.time() - t > seconds:
                return
train(20)
p0 = time.time()
acc = 0
while time.time() - p0 < a.pause:  # the "metric": pure Python on the CPU
    acc += sum(i * i % 7 for i in range(100_000))
truth["pause_seconds"] = time.time() - p0
train(20)
truth.update(steps=steps, wall_seconds=time.time() - t0)
if a.out:
    with open(a.out, "w") as f:
        json.dump(truth, f)
