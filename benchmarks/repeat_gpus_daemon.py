#!/usr/bin/env python3
"""`gpuwatch run ARGS` with each of the machine's GPUs listed ``$REPEAT_GPUS`` times (2 by
default): a stand-in for a node with more GPUs than the one at hand (8 handles over a
4-GPU machine), for `bench_tick.py --repeat-gpus`.

Every listed GPU is a real one, read by the real driver with every call a tick and the
slow tier make: GPU ``i`` is the machine's GPU ``i % n``. Each copy is read as its own GPU
(its own reads, GPM samples, slow-tier thread and series); only the XID events are
registered once per physical GPU (NVML refuses a second registration of one device in an
event set). Nothing else is changed: the real CLI and daemon.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpuwatch.collect.nvml  # noqa: E402
from gpuwatch.cli import main  # noqa: E402
from gpuwatch.collect.nvml import handle_key  # noqa: E402


class RepeatedGpus:
    """pynvml with every GPU listed ``times`` times (GPU i is the driver's i % count)."""

    def __init__(self, nv: Any, times: int) -> None:
        self._nv = nv
        self._times = max(1, times)
        self._registered: set[Any] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nv, name)

    def nvmlDeviceGetCount(self) -> int:
        return self._nv.nvmlDeviceGetCount() * self._times

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return self._nv.nvmlDeviceGetHandleByIndex(index % self._nv.nvmlDeviceGetCount())

    def nvmlDeviceRegisterEvents(self, handle: Any, types: int, event_set: Any) -> None:
        key = handle_key(handle)
        if key in self._registered:  # the daemon says it at debug level and goes on
            raise RuntimeError("this GPU's XID events are registered by its first copy")
        self._nv.nvmlDeviceRegisterEvents(handle, types, event_set)
        self._registered.add(key)


def _load() -> Any:
    import pynvml

    return RepeatedGpus(pynvml, int(os.environ.get("REPEAT_GPUS", "2")))


if __name__ == "__main__":
    gpuwatch.collect.nvml.load_module = _load
    sys.exit(main(["run", *sys.argv[1:]]))
