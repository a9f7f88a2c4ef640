"""A ViT-B/16 (timm, no pretrained weights) trained with Accelerate on random images: a
transformer whose one convolution is its patch embedding. ``--mixed``: Accelerate's
mixed_precision; ``--tf32``: FP32 matmuls as TF32; ``--cpu-ms``: busy CPU per sample in
the Dataset (an augmentation the workers cannot keep up with). The loop's own clock is
the truth (--out)."""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import timm  # noqa: E402
import torch  # noqa: E402
from _truth import Truth  # noqa: E402
from accelerate import Accelerator  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--mixed", default="no", choices=["no", "fp16", "bf16"])
p.add_argument("--tf32", action="store_true")
p.add_argument("--batch", type=int, default=64)
p.add_argument("--workers", type=int, default=4)
p.add_argument("--cpu-ms", type=float, default=0.0)
p.add_argument("--model", default="vit_base_patch16_224")
p.add_argument("--seconds", type=float, default=35.0)
p.add_argument("--out")
a = p.parse_args()

truth = Truth(a.out)
if a.tf32:
    torch.backends.cuda.matmul.fp32_precision = "tf32"


class Images(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int):  # noqa: ANN204
        if a.cpu_ms:
            end = time.perf_counter() + a.cpu_ms / 1000
            while time.perf_counter() < end:
                pass
        return torch.randn(3, 224, 224), i % 1000


acc = Accelerator(mixed_precision=a.mixed)
model = timm.create_model(a.model, pretrained=False, num_classes=1000)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
loader = torch.utils.data.DataLoader(Images(), batch_size=a.batch, shuffle=True,
                                     num_workers=a.workers, pin_memory=True, drop_last=True)
model, opt, loader = acc.prepare(model, opt, loader)
model.train()
steps = 0
t0 = None
for x, y in loader:
    with acc.autocast():
        loss = torch.nn.functional.cross_entropy(model(x), y)
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    steps += 1
    if t0 is None:
        t0 = time.monotonic()
    if time.monotonic() - t0 > a.seconds:
        break
truth.write(steps=steps, micro_batches=steps, batch=a.batch)
