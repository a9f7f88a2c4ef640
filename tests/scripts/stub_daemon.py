"""`gpuwatch run ARGS` with NVML replaced by tests/nvml_stub.py's stub GPUs (two, or
``$STUB_GPUS``).

For tests of what a CPU machine cannot do to a real driver: SIGUSR1 makes GPU 0's
per-tick reads hang (one hung NVML call), SIGUSR2 makes every GPU's hang (the sampling
loop gets no GPU read through); ``$STUB_GPU_PIDS`` puts real processes on GPU 0.
``$STUB_SM_ACTIVE`` sets GPU 0's GPM SM activity (percent). Everything else is the real
CLI and daemon.
"""

from __future__ import annotations

import os
import signal
import sys

import pynvml

import gpuwatch.collect.nvml
from gpuwatch.cli import main
from tests.nvml_stub import NvmlStub, StubGpu

HUNG_CALL = "nvmlDeviceGetUtilizationRates"  # read by every GPU's worker every tick

# STUB_GPU_PIDS=1234,5678: real processes the stub reports on GPU 0 (1 GiB each)
_pids = [int(p) for p in os.environ.get("STUB_GPU_PIDS", "").split(",") if p]
# STUB_GPUS=8: how many stub GPUs (default 2); the GPUs after the first have no processes
_count = max(1, int(os.environ.get("STUB_GPUS", "2")))
# STUB_SM_ACTIVE=40: GPU 0's GPM SM activity, percent (default the stub's H100 figure)
_sm = os.environ.get("STUB_SM_ACTIVE")
_gpu0 = StubGpu(0, processes=[(pid, 2**30) for pid in _pids])
if _sm is not None:
    _gpu0.gpm_percent[pynvml.NVML_GPM_METRIC_SM_UTIL] = float(_sm)
stub = NvmlStub([_gpu0] + [StubGpu(i) for i in range(1, _count)])
gpuwatch.collect.nvml.load_module = lambda: stub


def _hang_one(_signum: int, _frame: object) -> None:
    stub.gpus[0].hang(HUNG_CALL)


def _hang_all(_signum: int, _frame: object) -> None:
    for gpu in stub.gpus:
        gpu.hang(HUNG_CALL)


signal.signal(signal.SIGUSR1, _hang_one)
signal.signal(signal.SIGUSR2, _hang_all)

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
