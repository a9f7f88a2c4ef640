"""A plain loop driven by Hugging Face Accelerate with gradient accumulation.

What a user writes: ``Accelerator(gradient_accumulation_steps=N)`` and
``with accelerator.accumulate(model):`` around each micro-batch, a DataLoader of the
micro-batch size. The truth (--out) is the micro-batch, the accumulation and the number
of optimizer steps the loop itself counted.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _truth import Truth  # noqa: E402
from accelerate import Accelerator  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--micro", type=int, default=4)
p.add_argument("--accum", type=int, default=16)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--width", type=int, default=256)
p.add_argument("--cpu-ms", type=float, default=0.0, help="host work per micro-batch")
p.add_argument("--seconds", type=float, default=None, help="stop after this long")
p.add_argument("--save-every", type=int, default=0,
               help="accelerator.save_state() every N optimizer steps (0: never)")
p.add_argument("--out")
a = p.parse_args()

truth = Truth(a.out)
torch.manual_seed(0)
accelerator = Accelerator(gradient_accumulation_steps=a.accum,
                          cpu=not torch.cuda.is_available())
model = torch.nn.Sequential(torch.nn.Linear(64, a.width), torch.nn.ReLU(),
                            torch.nn.Linear(a.width, a.width), torch.nn.ReLU(),
                            torch.nn.Linear(a.width, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
n = a.micro * a.accum * a.steps
ds = torch.utils.data.TensorDataset(torch.randn(n, 64), torch.randn(n, 1))
loader = torch.utils.data.DataLoader(ds, batch_size=a.micro, shuffle=True)
model, opt, loader = accelerator.prepare(model, opt, loader)
steps = saves = 0
ckpt_dir = tempfile.mkdtemp(prefix="ckpt-", dir=".")  # on the disk the job runs from
began = time.time()
for x, y in loader:
    with accelerator.accumulate(model):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        if a.cpu_ms:
            time.sleep(a.cpu_ms / 1000)
        opt.step()
        opt.zero_grad()
        if accelerator.sync_gradients:
            steps += 1
            if a.save_every and steps % a.save_every == 0:
                accelerator.save_state(ckpt_dir)
                saves += 1
            if a.seconds is not None and time.time() - began > a.seconds:
                break
truth.write(steps=steps, micro_batches=a.accum, micro_batch=a.micro,
            **({"saves": saves} if a.save_every else {}))
print("trained", steps, "optimizer steps", file=sys.stderr)
