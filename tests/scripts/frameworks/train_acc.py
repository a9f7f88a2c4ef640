"""Evaluating on the training data: the tutorials' CNN loop that measures its training
accuracy after each epoch (``model.eval()``, then the training DataLoader again under
``torch.no_grad()``, then the test set), or Lightning validating on the loader it trains
on (``trainer.fit(model, train_dataloaders=loader, val_dataloaders=loader)``, as quick
examples do). Synthetic CIFAR-sized images already in memory, a small CNN in fp32.

``--loop plain|lightning``; ``--seconds``: epochs are run until then (whole ones). The
script's own clock (--out): optimizer steps, training samples, and the seconds spent in
the evaluation passes (``eval_seconds``, ``evals``: the training-accuracy pass and the
test pass together, per epoch, or each Lightning validation)."""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _truth import Truth  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--loop", choices=["plain", "lightning"], default="plain")
p.add_argument("--samples", type=int, default=20_000)
p.add_argument("--test-samples", type=int, default=5_000)
p.add_argument("--batch", type=int, default=128)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--seconds", type=float, default=40.0)
p.add_argument("--out")
a = p.parse_args()
truth = Truth(a.out)
torch.manual_seed(0)


def images(n: int) -> torch.utils.data.TensorDataset:
    return torch.utils.data.TensorDataset(torch.randn(n, 3, 32, 32),
                                          torch.randint(0, 10, (n,)))


def loader(data: torch.utils.data.Dataset, shuffle: bool) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(data, batch_size=a.batch, shuffle=shuffle,
                                       num_workers=a.workers, pin_memory=torch.cuda.is_available(),
                                       persistent_workers=a.workers > 0)


def net() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(128 * 8 * 8, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10))


train = loader(images(a.samples), shuffle=True)
test = loader(images(a.test_samples), shuffle=False)

if a.loop == "plain":
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = net().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def accuracy(data: torch.utils.data.DataLoader) -> float:
        right = seen = 0
        with torch.no_grad():
            for x, y in data:
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
                right += (model(x).argmax(1) == y).sum().item()
                seen += len(y)
        return right / seen

    t0 = time.time()
    samples = 0
    while time.time() - t0 < a.seconds:
        model.train()
        for x, y in train:
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            truth.data["steps"] += 1
            samples += len(y)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        truth.eval_begins()
        model.eval()
        train_acc, test_acc = accuracy(train), accuracy(test)
        truth.eval_ends()
        print(f"epoch: train accuracy {train_acc:.3f}, test {test_acc:.3f}", flush=True)
    truth.write(samples=samples)
else:
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net()

        def training_step(self, batch, i):  # noqa: ANN001, ANN201
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def validation_step(self, batch, i):  # noqa: ANN001, ANN201
            x, y = batch
            self.log("val_acc", (self.net(x).argmax(1) == y).float().mean())

        def configure_optimizers(self):  # noqa: ANN201
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    class Clock(pl.Callback):
        def __init__(self) -> None:
            self.t0 = time.time()
            self.samples = 0

        def on_train_batch_end(self, trainer, module, outputs, batch, i):  # noqa: ANN001
            truth.data["steps"] += 1
            self.samples += len(batch[1])

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
    trainer.fit(Module(), train_dataloaders=train, val_dataloaders=train)
    truth.write(samples=clock.samples)
