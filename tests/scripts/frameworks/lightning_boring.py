"""Lightning's own demo model, unchanged: ``lightning.pytorch.demos.boring_classes.BoringModel``
(a Linear(32, 2), SGD, epochs of 64 samples at the DataLoader's default batch of 1,
validating every epoch over 64 more), fitted by ``Trainer`` with its defaults but for
``max_time`` and the devices, as a user trying Lightning on a GPU host would run it.

A ``Callback`` counts the steps and times the validations (the script's own truth, --out).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from _truth import Truth, lightning_clock  # noqa: E402
from lightning.pytorch.demos.boring_classes import BoringModel  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--devices", type=int, default=1)
p.add_argument("--seconds", type=float, default=40.0)
p.add_argument("--out")
a = p.parse_args()

truth = Truth(a.out)


class Clock(lightning_clock(truth)):
    def on_train_epoch_end(self, trainer, module):  # noqa: ANN001
        truth.data["epochs"] = trainer.current_epoch + 1


trainer = pl.Trainer(max_epochs=-1, max_time={"seconds": a.seconds},
                     accelerator="gpu" if torch.cuda.is_available() else "cpu",
                     devices=a.devices, callbacks=[Clock()])
trainer.fit(BoringModel())
if trainer.global_rank == 0:
    truth.write(micro_batches=1, batch=1, eval_batch=1)
print("trained", trainer.global_step, "steps", file=sys.stderr)
