"""A LightningModule trained by ``lightning.pytorch.Trainer`` with a validation loop inside
the epoch (``val_check_interval``), on the CPU or GPUs (``--devices`` >1: DDP; ``--strategy
fsdp`` or ``fsdp_offload``: Lightning's FSDPStrategy, with ``cpu_offload=True`` for the
latter).

A Lightning ``Callback`` times the validations (the script's own truth, --out).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from _truth import Truth, lightning_clock  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--val-batch", type=int, default=8)
p.add_argument("--val-every", type=int, default=10)
p.add_argument("--val-samples", type=int, default=512)
p.add_argument("--width", type=int, default=256)
p.add_argument("--workers", type=int, default=0)
p.add_argument("--devices", type=int, default=1)
p.add_argument("--precision", default="32-true")
p.add_argument("--accum", type=int, default=1)
p.add_argument("--strategy", choices=("auto", "fsdp", "fsdp_offload"), default="auto",
               help="fsdp: FSDPStrategy(); fsdp_offload: FSDPStrategy(cpu_offload=True)")
p.add_argument("--val-ms", type=float, default=0.0, help="extra work per validation batch")
p.add_argument("--warm-seconds", type=float, default=0.0,
               help="each loader worker spins the CPU this long before its first sample "
                    "(a dataset that builds an index or decodes a cache at start)")
p.add_argument("--seconds", type=float, default=None, help="stop training after this long")
p.add_argument("--validate-first", action="store_true",
               help="trainer.validate() before trainer.fit() (a baseline's metrics)")
p.add_argument("--detect-anomaly", action="store_true", help="Trainer(detect_anomaly=True)")
p.add_argument("--out")
a = p.parse_args()

truth = Truth(a.out)


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, a.width), torch.nn.ReLU(),
                                       torch.nn.Linear(a.width, a.width), torch.nn.ReLU(),
                                       torch.nn.Linear(a.width, 1))

    def training_step(self, batch, i):  # noqa: ANN001
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, i):  # noqa: ANN001
        x, y = batch
        if a.val_ms:
            time.sleep(a.val_ms / 1000)
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


Clock = lightning_clock(truth)


class Data(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = torch.randn(n, 64, generator=g), torch.randn(n, 1, generator=g)
        self.ready_at: float | None = None

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):  # noqa: ANN204
        if a.warm_seconds and self.ready_at is None:
            self.ready_at = time.monotonic() + a.warm_seconds
            while time.monotonic() < self.ready_at:
                pass  # busy: the worker pegs its core, the GPU waits
        return self.x[i], self.y[i]


def data(n: int, seed: int) -> Data:
    return Data(n, seed)


train = torch.utils.data.DataLoader(data(a.steps * a.batch * a.accum, 1), batch_size=a.batch,
                                    num_workers=a.workers, persistent_workers=a.workers > 0)
val = torch.utils.data.DataLoader(data(a.val_samples, 2), batch_size=a.val_batch,
                                  num_workers=a.workers, persistent_workers=a.workers > 0)
strategy = "auto"
if a.strategy != "auto":
    from lightning.pytorch.strategies import FSDPStrategy

    strategy = FSDPStrategy(cpu_offload=a.strategy == "fsdp_offload")
trainer = pl.Trainer(max_steps=a.steps, strategy=strategy,
                     max_time=None if a.seconds is None else {"seconds": a.seconds}, val_check_interval=a.val_every * a.accum,
                     check_val_every_n_epoch=None, accumulate_grad_batches=a.accum,
                     accelerator="gpu" if torch.cuda.is_available() else "cpu",
                     devices=a.devices, precision=a.precision, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=2, callbacks=[Clock()],
                     detect_anomaly=a.detect_anomaly)
net = Net()
if a.validate_first:
    t = time.perf_counter()
    trainer.validate(net, val, verbose=False)
    # the script's truth keeps the validations inside fit() apart from this one
    truth.data.update(first_eval_seconds=time.perf_counter() - t, eval_seconds=0.0, evals=0)
trainer.fit(net, train, val)
if trainer.global_rank == 0:
    truth.write(micro_batches=a.accum, batch=a.batch, eval_batch=a.val_batch)
print("trained", trainer.global_step, "steps", file=sys.stderr)
