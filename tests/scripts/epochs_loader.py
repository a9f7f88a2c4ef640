"""A loop over a DataLoader's epochs, nothing else: the process tree of a job whose
workers ``persistent_workers`` keeps or starts anew at every epoch.

    python3 epochs_loader.py --workers 2 [--persistent] [--epoch-seconds 0.5]
                             [--start-method spawn] [--subprocess-every 0.2]

Each epoch is a few batches of a small in-memory data set, each batch followed by a
short sleep (the step, as far as the process tree can tell), so the epochs take about
``--epoch-seconds``. ``--start-method`` picks how the workers start (fork by default on
Linux; spawned ones take torch's worker name only once their interpreter has started).
``--subprocess-every S`` also runs a short child that is no DataLoader worker (``sleep``)
every S seconds, as a script that shells out to ``nvidia-smi`` does. Prints ``ready`` once
the loader exists; runs until killed. No GPU.
"""

from __future__ import annotations

import argparse
import subprocess
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

BATCHES = 4


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--epoch-seconds", type=float, default=0.5)
    p.add_argument("--start-method", default=None)
    p.add_argument("--subprocess-every", type=float, default=0.0)
    a = p.parse_args()

    loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=64 // BATCHES,
                        num_workers=a.workers, persistent_workers=a.persistent,
                        multiprocessing_context=a.start_method)
    print("ready", flush=True)
    last_child = 0.0
    while True:
        for _batch in loader:
            time.sleep(a.epoch_seconds / BATCHES)
            if a.subprocess_every and time.monotonic() - last_child >= a.subprocess_every:
                last_child = time.monotonic()
                subprocess.Popen(["sleep", "0.6"])  # reaped by nobody: a zombie once done


if __name__ == "__main__":  # spawned workers import this module again
    main()
