"""Lightning training on two loaders at once: ``train_dataloader()`` returns a dict of two
DataLoaders (labeled images and a second, smaller set, as semi-supervised and multi-domain
examples do), which Lightning's ``CombinedLoader`` reads side by side for each step
(``max_size_cycle``: the smaller one cycles), validating on a third loader each epoch. A
small CNN in fp32 on synthetic CIFAR-sized images already in memory.

The script's own clock (--out): optimizer steps, the samples of both loaders the steps
took, and the validations' seconds (``eval_seconds``, ``evals``)."""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _truth import Truth  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--samples", type=int, default=20_000, help="the first loader's images")
p.add_argument("--second", type=int, default=5_000, help="the second loader's images")
p.add_argument("--val-samples", type=int, default=2_000)
p.add_argument("--batch", type=int, default=128)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--seconds", type=float, default=40.0)
p.add_argument("--out")
a = p.parse_args()
truth = Truth(a.out)
torch.manual_seed(0)


def loader(n: int, shuffle: bool) -> torch.utils.data.DataLoader:
    data = torch.utils.data.TensorDataset(torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,)))
    return torch.utils.data.DataLoader(data, batch_size=a.batch, shuffle=shuffle,
                                       num_workers=a.workers,
                                       pin_memory=torch.cuda.is_available(),
                                       persistent_workers=a.workers > 0)


class Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(128 * 8 * 8, 10))

    def training_step(self, batch, i):  # noqa: ANN001, ANN201
        (x, y), (u, v) = batch["labeled"], batch["second"]
        return F.cross_entropy(self.net(x), y) + 0.5 * F.cross_entropy(self.net(u), v)

    def validation_step(self, batch, i):  # noqa: ANN001, ANN201
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(1) == y).float().mean())

    def train_dataloader(self) -> dict:
        return {"labeled": loader(a.samples, True), "second": loader(a.second, True)}

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return loader(a.val_samples, False)

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


class Clock(pl.Callback):
    def __init__(self) -> None:
        self.t0 = time.time()
        self.samples = 0

    def on_train_batch_end(self, trainer, module, outputs, batch, i):  # noqa: ANN001
        truth.data["steps"] += 1
        self.samples += len(batch["labeled"][1]) + len(batch["second"][1])

    def on_validation_start(self, trainer, module):  # noqa: ANN001
        truth.eval_begins()

    def on_validation_end(self, trainer, module):  # noqa: ANN001
        truth.eval_ends()
        if time.time() - self.t0 >= a.seconds:
            trainer.should_stop = True


clock = Clock()
trainer = pl.Trainer(accelerator="auto", devices=1, max_epochs=1000, precision="32-true",
                     num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, callbacks=[clock])
trainer.fit(Module())
truth.write(samples=clock.samples)
