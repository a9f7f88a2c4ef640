"""A timm ResNet trained in fp16 autocast with a GradScaler on random images: what a
guide for a T4 tells its reader, run on a GPU that has bf16 (the advice: bf16, no scaler).
The loop's own clock is the truth (--out)."""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import timm  # noqa: E402
import torch  # noqa: E402
from _truth import Truth  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=45.0)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--model", default="resnet50")
p.add_argument("--workers", type=int, default=6)
p.add_argument("--out")
a = p.parse_args()

truth = Truth(a.out)
torch.backends.cudnn.benchmark = True
model = timm.create_model(a.model, pretrained=False, num_classes=100).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scaler = torch.amp.GradScaler("cuda")


class Images(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int):  # noqa: ANN204
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, 224, 224, generator=g), i % 100


loader = torch.utils.data.DataLoader(Images(), batch_size=a.batch, num_workers=a.workers,
                                     pin_memory=True, persistent_workers=True,
                                     prefetch_factor=4)
end = time.monotonic() + a.seconds
steps = 0
for x, y in loader:
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    steps += 1
    if time.monotonic() > end:
        break
truth.write(steps=steps, batch=a.batch)
print("trained", steps, "steps", file=sys.stderr)
