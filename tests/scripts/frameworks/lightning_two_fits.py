"""Two models fitted one after the other in one process, each by a Lightning ``Trainer`` of
its own (the second at twice the batch), the first Trainer kept (a sweep keeping its
results, a notebook's earlier cell): an MLP regression on random features, ``--epochs``
each. The script's own clock (--out): the optimizer steps of both fits, their samples, and
the second's batch size."""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from _truth import Truth  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--samples", type=int, default=640)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--out")
a = p.parse_args()
truth = Truth(a.out)
torch.manual_seed(0)


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 1))

    def training_step(self, batch: list[torch.Tensor], _i: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


data = torch.utils.data.TensorDataset(torch.randn(a.samples, 32), torch.randn(a.samples, 1))
trainers = []
for run in range(2):
    batch = a.batch * (run + 1)
    trainer = pl.Trainer(max_epochs=a.epochs, accelerator="auto", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=batch))
    trainers.append(trainer)
truth.write(steps=sum(t.global_step for t in trainers), samples=2 * a.epochs * a.samples,
            last_batch=a.batch * 2)
