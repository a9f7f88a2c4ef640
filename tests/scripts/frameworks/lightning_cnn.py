"""Image classification with Lightning the way a tutorial writes it: a timm ResNet (a small
CNN where timm is missing) on synthetic images that the Dataset decodes and augments per
item (random crop, flip, a blur, normalization: CPU work in the loader), trained by
``lightning.pytorch.Trainer`` with ``--precision``, ``--accum``
(``accumulate_grad_batches``) and ``--workers`` from the command line, on one GPU or
several (DDP).

``--leak N`` keeps every Nth step's input batch on the GPU in a list on the module (the
mistake of collecting samples for an image grid at ``on_train_epoch_end`` without
``.cpu()``): allocated memory grows step after step.
``--compile`` wraps the model in ``torch.compile`` inside the module (Lightning has no
switch of its own: the tutorials compile the model they hand it). ``--no-persistent`` leaves
``persistent_workers`` at the DataLoader's default (False): each epoch starts its workers
anew (with ``--samples`` small, epochs are short).
``--reload`` builds the training DataLoader in the module's ``train_dataloader()`` and asks
``Trainer(reload_dataloaders_every_n_epochs=1)``: a new loader each epoch, the same data;
with ``--val-samples N`` it also validates on N images (``--val-batch``) at each epoch's
end, Lightning's default, and times the validations (``eval_seconds``, ``evals``).
``--find-batch N`` lets Lightning's ``BatchSizeFinder`` callback size the batch (power
mode, N trials of 3 steps from ``--batch``; the module's ``batch_size`` feeds the loader).
``--slow-rank R`` gives rank R's loader twice the augmentation work and half the workers
(one node whose data path is slower: its rank holds the others back at every all-reduce).

A Callback counts the optimizer steps (the script's own truth, --out).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _truth import Truth  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--model", default="resnet18")
p.add_argument("--size", type=int, default=64, help="image side after the crop")
p.add_argument("--batch", type=int, default=128)
p.add_argument("--accum", type=int, default=1)
p.add_argument("--workers", type=int, default=4)
p.add_argument("--precision", default="32-true")
p.add_argument("--devices", type=int, default=1)
p.add_argument("--blur", type=int, default=1, help="blur passes per item (CPU per item)")
p.add_argument("--leak", type=int, default=0)
p.add_argument("--slow-rank", type=int, default=-1)
p.add_argument("--samples", type=int, default=500_000)
p.add_argument("--ckpt-every", type=int, default=0,
               help="ModelCheckpoint(every_n_train_steps=N), the newest kept (0: none)")
p.add_argument("--compile", action="store_true", help="torch.compile(model) in the module")
p.add_argument("--no-persistent", action="store_true",
               help="persistent_workers=False (the DataLoader's default): workers made anew each epoch")
p.add_argument("--reload", action="store_true",
               help="a new training DataLoader each epoch (reload_dataloaders_every_n_epochs=1)")
p.add_argument("--find-batch", type=int, default=0,
               help="BatchSizeFinder(mode='power', max_trials=N) among the callbacks (0: none)")
p.add_argument("--val-samples", type=int, default=0,
               help="validate on this many images at each epoch's end (0: no validation)")
p.add_argument("--val-batch", type=int, default=16)
p.add_argument("--seconds", type=float, default=45.0)
p.add_argument("--detect-anomaly", action="store_true", help="Trainer(detect_anomaly=True)")
p.add_argument("--read-ms", type=float, default=0.0,
               help="each sample waits this long in __getitem__, its CPU idle (images read "
                    "from a network filesystem or an object store)")
p.add_argument("--out")
a = p.parse_args()

truth = Truth(a.out)
RANK = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
slow = RANK == a.slow_rank


def make_model() -> torch.nn.Module:
    try:
        import timm
        return timm.create_model(a.model, num_classes=100, pretrained=False)
    except ImportError:
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 100))


class Images(torch.utils.data.Dataset):
    MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    KERNEL = torch.full((3, 1, 3, 3), 1 / 9)

    def __len__(self) -> int:
        return a.samples

    def __getitem__(self, i: int):  # noqa: ANN204
        if a.read_ms:
            time.sleep(a.read_ms / 1000)
        g = torch.Generator().manual_seed(i)
        side = a.size + a.size // 8
        raw = torch.randint(0, 256, (3, side, side), dtype=torch.uint8, generator=g)
        x0, y0 = (int(v) for v in torch.randint(0, side - a.size + 1, (2,), generator=g))
        img = raw[:, y0:y0 + a.size, x0:x0 + a.size].float() / 255
        if torch.rand(1, generator=g).item() < 0.5:
            img = img.flip(-1)
        for _ in range(a.blur * (2 if slow else 1)):
            img = F.conv2d(img.unsqueeze(0), self.KERNEL, padding=1, groups=3).squeeze(0)
        return (img - self.MEAN) / self.STD, i % 100


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = torch.compile(make_model()) if a.compile else make_model()
        self.kept: list[torch.Tensor] = []

    def training_step(self, batch, i):  # noqa: ANN001, ANN201
        x, y = batch
        # every batch run, the batch size finder's trials too (callbacks are set aside
        # during its trials, and it restores the weights and global_step after them)
        truth.data["batches_run"] = truth.data.get("batches_run", 0) + 1
        loss = F.cross_entropy(self.model(x), y)
        if a.leak and i % a.leak == 0:
            self.kept.append(x)  # for a grid at the epoch's end; never moved off the GPU
        return loss

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)


class Count(pl.Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, i):  # noqa: ANN001
        truth.data["steps"] = trainer.global_step

    def on_train_epoch_start(self, trainer, module):  # noqa: ANN001
        truth.data["epochs"] = truth.data.get("epochs", 0) + 1

    def on_save_checkpoint(self, trainer, module, checkpoint):  # noqa: ANN001
        truth.data["saves"] = truth.data.get("saves", 0) + 1


torch.set_num_threads(1)  # per-item work stays on the worker's own core
workers = max(1, a.workers // 2) if slow else a.workers


def make_loader(batch: int = a.batch) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(Images(), batch_size=batch, shuffle=True,
                                       num_workers=workers, pin_memory=True,
                                       persistent_workers=workers > 0 and not a.no_persistent)


class Reloading(Classifier):
    def train_dataloader(self) -> torch.utils.data.DataLoader:
        truth.data["loaders"] = truth.data.get("loaders", 0) + 1
        return make_loader()


class Validated(Reloading):
    """Reloading, and validated at each epoch's end on ``--val-samples`` images."""

    def validation_step(self, batch, i):  # noqa: ANN001, ANN201
        x, y = batch
        return F.cross_entropy(self.model(x), y)

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        data = torch.utils.data.Subset(Images(), range(a.val_samples))
        return torch.utils.data.DataLoader(data, batch_size=a.val_batch, num_workers=workers,
                                           pin_memory=True,
                                           persistent_workers=workers > 0)


class Timed(pl.Callback):
    def on_validation_start(self, trainer, module):  # noqa: ANN001
        if not trainer.sanity_checking:
            self.v0 = time.perf_counter()

    def on_validation_end(self, trainer, module):  # noqa: ANN001
        if not trainer.sanity_checking:
            truth.data["eval_seconds"] = truth.data.get("eval_seconds", 0.0) \
                + time.perf_counter() - self.v0
            truth.data["evals"] = truth.data.get("evals", 0) + 1


class Sized(Classifier):
    """The batch as the module's attribute, which BatchSizeFinder scales."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_size = a.batch

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return make_loader(self.batch_size)


finder = [pl.callbacks.BatchSizeFinder(mode="power", steps_per_trial=3, init_val=a.batch,
                                       max_trials=a.find_batch)] if a.find_batch else []
ckpt_dir = tempfile.mkdtemp(prefix="ckpt-", dir=".") if a.ckpt_every else None  # on disk
saving = [pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, save_top_k=1,
                                       every_n_train_steps=a.ckpt_every)] if a.ckpt_every else []
trainer = pl.Trainer(accelerator="gpu" if torch.cuda.is_available() else "cpu",
                     devices=a.devices, precision=a.precision,
                     accumulate_grad_batches=a.accum, max_epochs=1000,
                     reload_dataloaders_every_n_epochs=1 if a.reload else 0,
                     max_time={"seconds": a.seconds}, logger=False,
                     enable_checkpointing=a.ckpt_every > 0, enable_progress_bar=False,
                     enable_model_summary=False,
                     callbacks=[Count(), *saving, *finder, *([Timed()] if a.val_samples else [])],
                     limit_val_batches=1.0 if a.val_samples else 0, num_sanity_val_steps=0,
                     detect_anomaly=a.detect_anomaly)
if a.reload:
    trainer.fit(Validated() if a.val_samples else Reloading())
elif a.find_batch:
    module = Sized()
    trainer.fit(module)
    truth.data["found_batch"] = module.batch_size
else:
    trainer.fit(Classifier(), make_loader())
if trainer.global_rank == 0:
    truth.write(micro_batches=a.accum, batch=a.batch)
print("trained", trainer.global_step, "steps", file=sys.stderr)
