"""A Lightning image classifier (a timm ResNet) trained reproducibly: ``Trainer(deterministic=True)``.

Lightning then asks torch for deterministic algorithms and leaves cuDNN's benchmark off,
which is the job's choice, not an oversight. The LightningModule counts the training
batches (the truth, --out) and stops after ``--seconds``.
"""

from __future__ import annotations

import argparse
import json
import time

import lightning as L
import timm
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=128)
p.add_argument("--workers", type=int, default=6)
p.add_argument("--model", default="resnet34")
p.add_argument("--precision", default="bf16-mixed")
p.add_argument("--deterministic", default="true", choices=["true", "false", "warn"])
p.add_argument("--seconds", type=float, default=35)
p.add_argument("--out", help="write the steps counted here (JSON)")
a = p.parse_args()


class Shapes(Dataset):
    def __len__(self) -> int:
        return 200_000

    def __getitem__(self, i: int) -> tuple:
        g = torch.Generator().manual_seed(i)
        x = torch.rand(3, 160, 160, generator=g)
        if i % 2:
            x = x.flip(-1)
        return x, i % 100


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = timm.create_model(a.model, num_classes=100)
        self.n = 0
        self.t0: float | None = None

    def training_step(self, batch, i):  # noqa: ANN001, ANN201
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def on_train_batch_end(self, *args) -> None:  # noqa: ANN002
        self.n += 1
        self.t0 = self.t0 or time.time()
        if time.time() - self.t0 > a.seconds:
            self.trainer.should_stop = True

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Shapes(), batch_size=a.batch, shuffle=True, num_workers=a.workers,
                          pin_memory=True, persistent_workers=True)


L.seed_everything(0)
model = Net()
deterministic = {"true": True, "false": False, "warn": "warn"}[a.deterministic]
L.Trainer(accelerator="gpu", devices=1, precision=a.precision, deterministic=deterministic,
          max_epochs=5, logger=False, enable_checkpointing=False,
          enable_model_summary=False).fit(model)
if a.out:
    with open(a.out, "w") as f:
        json.dump({"steps": model.n, "batch": a.batch, "deterministic": a.deterministic}, f)
