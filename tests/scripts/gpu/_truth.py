"""Ground truth shared by the recording scripts: each iteration's own timing, written as
one JSON summary at exit so tests can compare gpuwatch's breakdown with the script's."""

from __future__ import annotations

import atexit
import json
import os
import statistics
import time


class Truth:
    def __init__(self, path: str | None, **facts) -> None:
        self.path = path
        self.facts = dict(facts)
        self.steps: list[float] = []
        self.waits: list[float] = []
        self.first_batch_waits: list[float] = []
        self.t0 = time.time()
        self._last = time.perf_counter()
        self.end = "running"
        atexit.register(self.write)

    def step(self, wait: float = 0.0, first_batch: bool = False) -> None:
        now = time.perf_counter()
        self.steps.append(now - self._last)
        self.waits.append(wait)
        if first_batch:
            self.first_batch_waits.append(wait)
        self._last = now

    def write(self) -> None:
        if not self.path:
            return
        steps = self.steps[1:] or self.steps
        waits = self.waits[1:] or self.waits
        total = sum(steps) or 1e-9
        out = dict(self.facts)
        out.update(
            pid=os.getpid(), rank=int(os.environ.get("RANK", 0)), iterations=len(self.steps),
            started=self.t0, ended=time.time(), end=self.end,
            step_seconds_median=statistics.median(steps) if steps else None,
            step_seconds_mean=total / len(steps) if steps else None,
            data_wait_share=sum(waits) / total,
            first_batch_wait_seconds=sum(self.first_batch_waits),
            first_batches=len(self.first_batch_waits),
        )
        path = self.path.replace("{rank}", str(out["rank"]))
        with open(path, "w") as f:
            json.dump(out, f, indent=1)


def timed(loader, truth: Truth):
    """Iterate a DataLoader, giving each batch with the seconds the loop was blocked on it:
    ``__next__``, and for the first batch also creating the iterator (which starts the
    workers when they are not persistent), as a training loop's ``for`` does."""
    t = time.perf_counter()
    it = iter(loader)
    first = True
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        yield batch, time.perf_counter() - t, first
        first = False
        t = time.perf_counter()
