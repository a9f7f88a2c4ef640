#!/usr/bin/env python3
"""What each NVML call of the tick and of the slow tier costs, alone (a GPU host).

    python3 benchmarks/bench_nvml_calls.py               # GPU 0: 20 spaced rounds, 100 hot
    python3 benchmarks/bench_nvml_calls.py --gpu 1 --spaced 40 --hot 200
    python3 benchmarks/bench_nvml_calls.py --stub --spaced 2 --hot 5   # the script runs

Each call is timed on its own (thread CPU clock and wall clock), in rounds: "spaced"
rounds leave 50 ms between calls and a second between rounds (the driver and the CPU idle
between two reads, as at the daemon's 1 s cadence); "hot" rounds make the calls back to
back. Besides the calls gpuwatch makes (``read_fast()`` is a whole tick's reads of one GPU,
``read_slow()`` the slow tier's), it times ``nvmlDeviceGetFieldValues`` batches: the
energy counter, the PCIe byte counters, all ten slow fields at once, and the eight
counters that ``read_slow()`` takes through five calls, as one batch beside those calls. Medians; where the driver refuses a call, it is listed as an error.
``--stub`` runs it over tests/nvml_stub.py: a check of the script, its figures say nothing
of a driver.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_tick import once_wall_cpu_us  # noqa: E402
from gpuwatch.collect.nvml import Nvml  # noqa: E402

SLOW_FIELDS = ("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "NVML_FI_DEV_PCIE_COUNT_TX_BYTES",
               "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", "NVML_FI_DEV_PCIE_REPLAY_COUNTER",
               "NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
               "NVML_FI_DEV_REMAPPED_COR", "NVML_FI_DEV_REMAPPED_UNC",
               "NVML_FI_DEV_REMAPPED_PENDING", "NVML_FI_DEV_REMAPPED_FAILURE")
# the counters read_slow() takes through five calls of their own: energy, PCIe replays,
# ECC corrected and uncorrected (volatile), the four remapped-rows figures
COUNTER_FIELDS = ("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "NVML_FI_DEV_PCIE_REPLAY_COUNTER",
                  "NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
                  "NVML_FI_DEV_REMAPPED_COR", "NVML_FI_DEV_REMAPPED_UNC",
                  "NVML_FI_DEV_REMAPPED_PENDING", "NVML_FI_DEV_REMAPPED_FAILURE")


def calls_of(nv: Any, h: Any, gpu: Any) -> dict[str, Callable[[], Any]]:
    def fields(*names: str) -> list[int]:
        return [getattr(nv, n) for n in names if hasattr(nv, n)]
    slow = fields(*SLOW_FIELDS)
    counters = fields(*COUNTER_FIELDS)
    return {
        "utilization": lambda: nv.nvmlDeviceGetUtilizationRates(h),
        "memory (v2)": lambda: nv.nvmlDeviceGetMemoryInfo(h, nv.nvmlMemory_v2),
        "power": lambda: nv.nvmlDeviceGetPowerUsage(h),
        "power limit": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h),
        "temperature": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "SM clock": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "memory clock": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
        "P-state": lambda: nv.nvmlDeviceGetPerformanceState(h),
        "clock event reasons": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
        "compute processes": lambda: nv.nvmlDeviceGetComputeRunningProcesses(h),
        "**read_fast() (a tick's reads)**": gpu.read_fast,
        "slow: PCIe TX throughput": lambda: nv.nvmlDeviceGetPcieThroughput(
            h, nv.NVML_PCIE_UTIL_TX_BYTES),
        "slow: PCIe RX throughput": lambda: nv.nvmlDeviceGetPcieThroughput(
            h, nv.NVML_PCIE_UTIL_RX_BYTES),
        "slow: total energy": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h),
        "slow: PCIe replay counter": lambda: nv.nvmlDeviceGetPcieReplayCounter(h),
        "slow: ECC corrected (volatile)": lambda: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
        "slow: remapped rows": lambda: nv.nvmlDeviceGetRemappedRows(h),
        "**read_slow() (the slow tier's reads)**": gpu.read_slow,
        "field values: energy": lambda: nv.nvmlDeviceGetFieldValues(
            h, fields("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION")),
        "field values: PCIe TX + RX byte counters": lambda: nv.nvmlDeviceGetFieldValues(
            h, fields("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES")),
        f"field values: all {len(slow)} slow fields": lambda: nv.nvmlDeviceGetFieldValues(
            h, slow),
        "field values: the 8 counters of read_slow()'s 5 calls (energy, replays, ECC, rows)":
            lambda: nv.nvmlDeviceGetFieldValues(h, counters),
        "those 8 counters through read_slow()'s 5 calls": lambda: (
            nv.nvmlDeviceGetTotalEnergyConsumption(h), nv.nvmlDeviceGetPcieReplayCounter(h),
            nv.nvmlDeviceGetTotalEccErrors(h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                           nv.NVML_VOLATILE_ECC),
            nv.nvmlDeviceGetTotalEccErrors(h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                           nv.NVML_VOLATILE_ECC),
            nv.nvmlDeviceGetRemappedRows(h)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--spaced", type=int, default=20, help="rounds a second apart")
    ap.add_argument("--hot", type=int, default=100, help="rounds back to back")
    ap.add_argument("--stub", action="store_true", help="over tests/nvml_stub.py (no GPU)")
    args = ap.parse_args()
    module = None
    if args.stub:
        from tests.nvml_stub import NvmlStub, StubGpu
        module = NvmlStub([StubGpu(0)])
    nvml = Nvml(module)
    if not nvml.open() or args.gpu >= len(nvml.gpus):
        sys.exit("bench_nvml_calls: no NVML GPU here (this benchmark needs one)")
    gpu = nvml.gpus[args.gpu]
    nv = nvml.nv
    calls = calls_of(nv, gpu.handle, gpu)
    got: dict[str, dict[str, list[tuple[float, float]]]] = {"spaced": {}, "hot": {}}
    errors: dict[str, str] = {}
    for mode, rounds, gap in (("spaced", args.spaced, 1.0), ("hot", args.hot, 0.0)):
        for _ in range(rounds):
            for name, fn in calls.items():
                wall, cpu, note = once_wall_cpu_us(fn)
                if note == "ok":
                    got[mode].setdefault(name, []).append((cpu, wall))
                else:  # a call the driver refuses is reported, not fatal
                    errors[name] = note
                if gap:
                    time.sleep(0.05)
            if gap:
                time.sleep(gap)
    name = "tests/nvml_stub.py" if args.stub else nv.nvmlDeviceGetName(gpu.handle)
    driver = "none" if args.stub else nv.nvmlSystemGetDriverVersion()
    print(f"## bench_nvml_calls: GPU {args.gpu} of {len(nvml.gpus)}, {name}, driver "
          f"{driver}; {args.spaced} spaced and {args.hot} hot rounds, medians")
    print("| call | CPU, spaced | wall, spaced | CPU, hot | wall, hot |")
    print("| --- | --- | --- | --- | --- |")
    for call in calls:
        row = [call]
        for mode in ("spaced", "hot"):
            v = got[mode].get(call)
            row += [f"{statistics.median(x[0] for x in v):.1f} µs" if v else "-",
                    f"{statistics.median(x[1] for x in v):.1f} µs" if v else "-"]
        print("| " + " | ".join(row) + " |")
    for call, err in errors.items():
        print(f"refused: {call}: {err}")
    nvml.close()


if __name__ == "__main__":
    main()
