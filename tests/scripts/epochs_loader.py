"""A loop over a DataLoader's epochs, nothing else: the process tree of a job whose
workers ``persistent_workers`` keeps or starts anew at every epoch.

    python3 epochs_loader.py --workers 2 [--persistent] [--epoch-seconds 0.5]

Each epoch is a few batches of a small in-memory data set, each batch followed by a
short sleep (the step, as far as the process tree can tell), so the epochs take about
``--epoch-seconds``. Prints ``ready`` once the loader exists; runs until killed. No GPU.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--workers", type=int, default=2)
p.add_argument("--persistent", action="store_true")
p.add_argument("--epoch-seconds", type=float, default=0.5)
a = p.parse_args()

BATCHES = 4
loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=64 // BATCHES,
                    num_workers=a.workers, persistent_workers=a.persistent)
print("ready", flush=True)
while True:
    for _batch in loader:
        time.sleep(a.epoch_seconds / BATCHES)
