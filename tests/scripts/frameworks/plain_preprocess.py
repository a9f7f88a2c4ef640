"""A loop that moves its model to the GPU first, then spends ~30 s preprocessing its data
on the CPU (the GPU holding the model, idle), then trains an MLP in bf16 autocast."""
import argparse
import json
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--prep", type=float, default=30)
p.add_argument("--seconds", type=float, default=25)
p.add_argument("--out")
a = p.parse_args()
t0 = time.time()
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096),
                            torch.nn.GELU(), torch.nn.Linear(4096, 10)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
# "tokenizing": pure-Python work on the CPU
rows = []
while time.time() - t0 < a.prep:
    rows.append([hash((len(rows), j)) % 1000 / 1000.0 for j in range(1024)])
X = torch.tensor(rows[:50_000], dtype=torch.float32)
Y = torch.randint(0, 10, (len(X),))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=512, shuffle=True,
                                     num_workers=2, pin_memory=True, persistent_workers=True)
t1 = time.time()
steps = 0
while time.time() - t1 < a.seconds:
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
        if time.time() - t1 > a.seconds:
            break
if a.out:
    with open(a.out, "w") as f:
        json.dump({"steps": steps, "prep_seconds": t1 - t0, "wall_seconds": time.time() - t0}, f)
