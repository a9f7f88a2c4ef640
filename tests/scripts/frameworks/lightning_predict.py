"""Batch inference with Lightning: ``Trainer.predict`` over a DataLoader of images, again
and again until ``--seconds`` have passed (a job scoring a dataset, no training at all).
``--cpu-ms`` makes each item cost its loader that much CPU (decoding, in a real job).

The model is a timm ResNet (a small CNN where timm is missing) in ``--precision`` (the
Trainer's); ``--batch`` and ``--workers`` are the predict DataLoader's. A Callback counts
the predict batches and the rounds (the truth, --out).
"""

from __future__ import annotations

import argparse
import json
import time

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--model", default="resnet50")
p.add_argument("--size", type=int, default=224, help="image side")
p.add_argument("--batch", type=int, default=64)
p.add_argument("--workers", type=int, default=4)
p.add_argument("--samples", type=int, default=8192, help="images per predict round")
p.add_argument("--precision", default="32-true")
p.add_argument("--accelerator", default="gpu")
p.add_argument("--cpu-ms", type=float, default=0.0,
               help="CPU milliseconds each item costs its loader (decoding, in a real job)")
p.add_argument("--seconds", type=float, default=40.0)
p.add_argument("--out", help="write the batches and rounds counted here (JSON)")
a = p.parse_args()


class Images(Dataset):
    def __len__(self) -> int:
        return a.samples

    def __getitem__(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(i)
        until = time.perf_counter() + a.cpu_ms / 1000
        while time.perf_counter() < until:
            pass
        return (torch.rand(3, a.size, a.size, generator=g) - 0.5) / 0.25


def make_model() -> torch.nn.Module:
    try:
        import timm
    except ImportError:
        timm = None
    if timm is not None:
        return timm.create_model(a.model, num_classes=1000)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, stride=2), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                               torch.nn.Linear(32, 1000))


class Scorer(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = make_model()

    def predict_step(self, batch, i):  # noqa: ANN001, ANN201
        return self.net(batch).argmax(-1).cpu()


class Count(pl.Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_predict_batch_end(self, *args, **kw) -> None:  # noqa: ANN002, ANN003
        self.batches += 1


count = Count()
trainer = pl.Trainer(accelerator=a.accelerator, devices=1, precision=a.precision, logger=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=[count])
model = Scorer()
loader = DataLoader(Images(), batch_size=a.batch, num_workers=a.workers,
                    persistent_workers=a.workers > 0, pin_memory=a.accelerator == "gpu")
t0 = time.time()
rounds = 0
while time.time() - t0 < a.seconds:
    trainer.predict(model, loader)
    rounds += 1
if a.out:
    with open(a.out, "w") as f:
        json.dump({"predict_batches": count.batches, "rounds": rounds, "batch": a.batch,
                   "workers": a.workers}, f)
