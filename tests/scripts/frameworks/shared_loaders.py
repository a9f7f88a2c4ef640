"""Loaders that training and evaluation share, or that a step reads two at a time. A small
CNN in fp32 on synthetic CIFAR-sized images already in memory, ``--loop``:

- ``plain``: the tutorials' loop measuring its training accuracy after each epoch
  (``model.eval()``, the training DataLoader again under ``torch.no_grad()``, then the
  test set);
- ``lightning``: Lightning validating on the loader it trains on
  (``trainer.fit(model, train_dataloaders=loader, val_dataloaders=loader)``, as quick
  examples do);
- ``combined``: Lightning training on two loaders at once (a dict from
  ``train_dataloader()``, which its ``CombinedLoader`` reads side by side for each step,
  the second, ``--second`` images, cycling: semi-supervised and multi-domain examples),
  validating on the test set.

Epochs run until ``--seconds`` (whole ones). The script's own clock (--out): optimizer
steps, the training samples the steps took, and the evaluations' seconds
(``eval_seconds``, ``evals``: per epoch the training-accuracy pass and the test pass
together, or each Lightning validation).

``--exit-seconds S``: a teardown of S seconds after the script's last line (an ``atexit``
handler sleeping: what stopping the loaders' persistent workers took at exit on an H200,
5 s a worker, or a tracker's upload). ``--in-thread`` (plain): the loop runs in a thread
that the main thread starts and leaves running (Python waits for it at exit)."""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _truth import Truth, lightning_clock  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--loop", choices=["plain", "lightning", "combined"], default="plain")
p.add_argument("--samples", type=int, default=20_000)
p.add_argument("--second", type=int, default=5_000, help="combined: the second loader's")
p.add_argument("--test-samples", type=int, default=5_000)
p.add_argument("--batch", type=int, default=128)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--seconds", type=float, default=40.0)
p.add_argument("--exit-seconds", type=float, default=0.0)
p.add_argument("--in-thread", action="store_true")
p.add_argument("--out")
a = p.parse_args()
if a.exit_seconds:
    import atexit

    atexit.register(time.sleep, a.exit_seconds)
truth = Truth(a.out)
torch.manual_seed(0)


def loader(n: int, shuffle: bool) -> torch.utils.data.DataLoader:
    data = torch.utils.data.TensorDataset(torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,)))
    return torch.utils.data.DataLoader(data, batch_size=a.batch, shuffle=shuffle,
                                       num_workers=a.workers,
                                       pin_memory=torch.cuda.is_available(),
                                       persistent_workers=a.workers > 0)


def net() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(128 * 8 * 8, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10))


train = loader(a.samples, shuffle=True)
test = loader(a.test_samples, shuffle=False)

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

    def run() -> None:
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

    if a.in_thread:
        import threading

        threading.Thread(target=run, name="training").start()
    else:
        run()
else:
    import lightning.pytorch as pl

    def pairs(batch: tuple | dict) -> list:
        return list(batch.values()) if isinstance(batch, dict) else [batch]

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net()

        def training_step(self, batch, i):  # noqa: ANN001, ANN201
            return sum(F.cross_entropy(self.net(x), y) for x, y in pairs(batch))

        def validation_step(self, batch, i):  # noqa: ANN001, ANN201
            x, y = batch
            self.log("val_acc", (self.net(x).argmax(1) == y).float().mean())

        def configure_optimizers(self):  # noqa: ANN201
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    class Clock(lightning_clock(truth)):
        def __init__(self) -> None:
            super().__init__()
            self.t0 = time.time()
            self.samples = 0

        def on_train_batch_end(self, trainer, module, outputs, batch, i):  # noqa: ANN001
            super().on_train_batch_end(trainer, module, outputs, batch, i)
            self.samples += sum(len(y) for _, y in pairs(batch))

        def on_validation_end(self, trainer, module):  # noqa: ANN001
            super().on_validation_end(trainer, module)
            if time.time() - self.t0 >= a.seconds:
                trainer.should_stop = True

    clock = Clock()
    trainer = pl.Trainer(accelerator="auto", devices=1, max_epochs=1000, precision="32-true",
                         num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, callbacks=[clock])
    if a.loop == "lightning":
        trainer.fit(Module(), train_dataloaders=train, val_dataloaders=train)
    else:
        trainer.fit(Module(), train_dataloaders={"labeled": train,
                                                 "second": loader(a.second, True)},
                    val_dataloaders=test)
    truth.write(samples=clock.samples)
