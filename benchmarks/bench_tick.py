#!/usr/bin/env python3
"""What one sampler tick costs per GPU, beside the raw NVML calls it makes.

    python3 benchmarks/bench_tick.py                          # NVML's GPUs, else the stub
    python3 benchmarks/bench_tick.py --stub --gpus 8 --interval 1 --interval 0.1
    python3 benchmarks/bench_tick.py --gpus 4 --interval 1 --interval 0.1 --out tick.json
    python3 benchmarks/bench_tick.py --gpus 4 --repeat-gpus 2 --interval 1   # 8 GPUs read

Prints one short table (and writes JSON with ``--out``). Per GPU, for each cadence:

- **raw calls**: exactly the calls the fast tick makes (cheap fields, processes, the GPM
  pair), made once per interval for every GPU on a thread of their own, each call's CPU
  clocked; "+ wake-up" adds that thread's own wake-up per tick, shared by the GPUs;
- **daemon path**: the started ``Sampler`` at that interval, each of its threads' CPU
  from its own clock (wake-ups, cold caches and waits included): the reader's CPU per GPU
  read plus the publishing loop's CPU per tick shared by the GPUs. The raw thread runs at
  the same time, half an interval out of phase, so both see the same machine;
- **hot**: the same, back to back on this thread (the reader's read of each GPU and the
  loop's tick over the samples it left), beside the raw calls, in alternating rounds.

``--stub`` (the default where NVML finds no GPU) stands tests/nvml_stub.py in for the
driver with ``--gpus`` GPUs: each stub call runs Python and leaves the interpreter lock
for a moment, as pynvml's ctypes calls do, so threads contend as on a GPU host; what it
measures is the sampler's own overhead. On a GPU host ``--gpus N`` reads only the first N
GPUs (NVML ignores CUDA_VISIBLE_DEVICES). ``--rss-seconds`` watches a whole daemon
process at each interval (the CLI; with the stub tests/scripts/stub_daemon.py) for CPU and
RSS, its peak and its course by minute (the store's history and the advisor's windows fill
for the first minutes: ``--rss-seconds 1200`` shows where it levels off); ``--full`` adds each slow-tier call once and other tools (nvidia-smi, nvitop,
gpustat) where they import. ``--repeat-gpus K`` (a GPU host) lists each GPU K times, each
copy read as a GPU of its own by the real driver (benchmarks/repeat_gpus_daemon.py): a
stand-in for a node with more GPUs than the one at hand, which reads a copy a little
warmer than a GPU of its own would be, and runs the copies' slow tiers on one device.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuwatch.samples import HostSample

TARGET_TICK_RATIO = 1.5
CADENCE_INTERVAL = 0.1  # the daemon path is watched at the shortest interval (most ticks)
TARGET_CPU_PERCENT_AT_1S = 0.5
TARGET_RSS_MB = 60.0


class NullHost:
    """No host sampling: the tick measured here is the GPU part alone (no HostSample is
    built either: that would be a cost of this benchmark, not of the GPU tick)."""

    def sample(self, t: float, gpu_pids: Any, mains: Any = ()) -> HostSample | None:
        return None


def median_us(fn: Callable[[], Any], reps: int, warmup: int = 20) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1000.0


def wall_and_cpu_us(fn: Callable[[], Any], reps: int, warmup: int = 20) -> tuple[float, float]:
    """Median wall time per call, and the process's mean CPU time per call (all threads)."""
    wall = median_us(fn, reps, warmup)
    c0 = time.process_time_ns()
    for _ in range(reps):
        fn()
    cpu = (time.process_time_ns() - c0) / reps / 1000.0
    return wall, cpu


def interleaved_us(fns: dict[str, Callable[[], Any]], reps: int,
                   rounds: int = 10) -> dict[str, tuple[float, float]]:
    """Median wall and mean thread-CPU µs per call of each function, measured in
    alternating rounds, so that drift, turbo and other threads' NVML traffic hit every
    function alike (one block after another gave 1.3x in one run and 1.8x in the next)."""
    walls: dict[str, list[int]] = {k: [] for k in fns}
    cpus: dict[str, int] = dict.fromkeys(fns, 0)
    per_round = max(reps // rounds, 1)
    for fn in fns.values():
        for _ in range(20):
            fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            c0 = time.thread_time_ns()
            for _ in range(per_round):
                t0 = time.perf_counter_ns()
                fn()
                walls[name].append(time.perf_counter_ns() - t0)
            cpus[name] += time.thread_time_ns() - c0
    return {name: (statistics.median(walls[name]) / 1000.0,
                   cpus[name] / (per_round * rounds) / 1000.0) for name in fns}


def once_wall_cpu_us(fn: Callable[[], Any]) -> tuple[float, float, str]:
    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    try:
        fn()
        note = "ok"
    except Exception as err:  # noqa: BLE001 - a benchmark row, not a crash
        note = f"{type(err).__name__}: {err}"
    return ((time.perf_counter_ns() - t0) / 1000.0, (time.thread_time_ns() - c0) / 1000.0, note)


# -- the daemon path ------------------------------------------------------------------------
def daemon_path_hot(sampler: Any, reps: int) -> dict[str, Any]:
    """The loop's work per GPU, back to back on this thread (the sampler is not started):
    the reader's read of each GPU, and the loop's tick over the samples it left."""
    gpus = sampler._fast
    t = time.time()
    reads = [wall_and_cpu_us(lambda g=g: g._read(t), reps) for g in gpus]
    samples = [g._read(t) for g in gpus]
    slots = iter(range(10**9, 2 * 10**9))

    def loop_tick() -> None:
        slot = next(slots)
        for g, sample in zip(gpus, samples, strict=True):
            g.slot = (slot, sample, 0)
        sampler._tick_slot(slot)

    tick_wall, tick_cpu = wall_and_cpu_us(loop_tick, reps)
    n = max(len(gpus), 1)
    return {"read_us": [r[0] for r in reads], "read_cpu_us": [r[1] for r in reads],
            "loop_tick_us": tick_wall, "loop_tick_cpu_us": tick_cpu,
            "per_gpu_us": [r[0] + tick_wall / n for r in reads],
            "per_gpu_cpu_us": [r[1] + tick_cpu / n for r in reads]}


def _thread_cpu_ns(threads: list[threading.Thread]) -> dict[int, tuple[str, int]]:
    out = {}
    for t in threads:
        try:
            out[t.ident] = (t.name, time.clock_gettime_ns(time.pthread_getcpuclockid(t.ident)))
        except (OSError, TypeError, AttributeError):  # gone, never started, not Linux
            pass
    return out


def _cpu_by_role(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]]
                 ) -> dict[str, int]:
    """CPU ns per thread role over the window (a reader that ended in it is left out)."""
    out: dict[str, int] = {}
    for ident, (name, ns) in after.items():
        if ident in before:
            role = ("reader" if name == "gpuwatch-gpu-reader" else
                    "loop" if name == "gpuwatch-sampler" else "other")
            out[role] = out.get(role, 0) + ns - before[ident][1]
    return out


class _RawThread:
    """The raw calls of every GPU once per interval, on a thread of their own, woken half
    an interval after each of the sampler's ticks."""

    def __init__(self, raw_fns: list[Callable[[], Any]], grid: tuple[float, float, float],
                 clock: Callable[[], float]) -> None:
        self.raw_fns, self.grid, self.clock = raw_fns, grid, clock
        self.stop = threading.Event()
        self.ticks = 0
        self.calls_cpu_ns = 0
        self.calls_wall: list[float] = []
        self.thread = threading.Thread(target=self._run, name="bench-raw", daemon=True)

    def _run(self) -> None:
        bell = threading.Lock()
        bell.acquire()
        start, interval, _lead = self.grid
        k = math.floor((self.clock() - start) / interval) + 1
        while not self.stop.is_set():
            due = start + (k + 0.5) * interval
            delay = due - self.clock()
            if delay > 0:
                bell.acquire(timeout=delay)
            for fn in self.raw_fns:
                t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                fn()
                self.calls_cpu_ns += time.thread_time_ns() - c0
                self.calls_wall.append((time.perf_counter_ns() - t0) / 1000.0)
            self.ticks += 1
            k = max(k + 1, math.floor((self.clock() - start) / interval) + 1)


def at_cadence(make_sampler: Callable[[float], Any], raw_fns: list[Callable[[], Any]],
               interval: float, seconds: float) -> dict[str, Any]:
    """The started sampler and the raw calls at ``interval``, side by side (see the module
    docstring): CPU per GPU of each, from each thread's own clock."""
    sampler = make_sampler(interval)
    n = max(len(sampler._fast), 1)
    raw: _RawThread | None = None
    try:
        sampler.start()
        deadline = time.monotonic() + 10
        while sampler._grid is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(max(3 * interval, 0.5))  # past the first ticks
        raw = _RawThread(raw_fns, sampler._grid, sampler._clock)
        raw.thread.start()
        time.sleep(max(2 * interval, 0.2))
        threads = [t for t in threading.enumerate()
                   if t.name.startswith("gpuwatch-") or t is raw.thread]
        reads0 = sum(g.reads for g in sampler._fast)
        read_ns0 = sum(g.read_ns for g in sampler._fast)
        ticks0 = sampler.store.latest().health.ticks_total
        raw0 = (raw.ticks, raw.calls_cpu_ns, time.clock_gettime_ns(
            time.pthread_getcpuclockid(raw.thread.ident)))
        cpu0, proc0 = _thread_cpu_ns(threads), time.process_time_ns()
        time.sleep(seconds)
        cpu1, proc1 = _thread_cpu_ns(threads), time.process_time_ns()
        raw1 = (raw.ticks, raw.calls_cpu_ns, time.clock_gettime_ns(
            time.pthread_getcpuclockid(raw.thread.ident)))
        ticks = max(sampler.store.latest().health.ticks_total - ticks0, 1)
        reads = max(sum(g.reads for g in sampler._fast) - reads0, 1)
        read_ns = sum(g.read_ns for g in sampler._fast) - read_ns0
        errors = dict(sampler.store.latest().health.errors_total)
    finally:
        if raw is not None:
            raw.stop.set()
        sampler.stop()
        if raw is not None:
            raw.thread.join(5)
    roles = _cpu_by_role(cpu0, cpu1)
    raw_ticks = max(raw1[0] - raw0[0], 1)
    raw_calls_us = (raw1[1] - raw0[1]) / raw_ticks / n / 1000.0
    raw_wake_us = (raw1[2] - raw0[2]) / raw_ticks / n / 1000.0
    reader_us = roles.get("reader", 0) / reads / 1000.0
    loop_us = roles.get("loop", 0) / ticks / 1000.0
    daemon_us = reader_us + loop_us / n
    others = (proc1 - proc0) - sum(roles.values()) - (raw1[2] - raw0[2])
    return {"interval": interval, "seconds": seconds, "gpus": n, "ticks": ticks,
            "raw_ticks": raw_ticks, "raw_calls_cpu_us": raw_calls_us,
            "raw_with_wake_cpu_us": raw_wake_us,
            "raw_calls_wall_us": statistics.median(raw.calls_wall) if raw.calls_wall else None,
            "reader_cpu_per_read_us": reader_us, "reader_wall_per_read_us": read_ns / reads / 1000.0,
            "loop_cpu_per_tick_us": loop_us, "daemon_cpu_per_gpu_us": daemon_us,
            "ratio": daemon_us / raw_calls_us if raw_calls_us else None,
            "ratio_with_wake": daemon_us / raw_wake_us if raw_wake_us else None,
            "other_threads_cpu_per_tick_us": max(others, 0) / ticks / 1000.0,
            "errors": errors}


# kept for benchmarks/profile_tick.py: the two halves measured one after the other
def raw_at_cadence(raw_fns: list[Callable[[], Any]], interval: float,
                   seconds: float) -> dict[str, Any]:
    """The raw calls of every GPU once per ``interval`` on a thread of their own. Per GPU:
    the median wall and mean CPU of the calls alone, and the thread's CPU per tick with
    its one wake-up over the GPUs."""
    raw = _RawThread(raw_fns, (time.monotonic(), interval, 0.0), time.monotonic)
    raw.thread.start()
    time.sleep(seconds)
    raw.stop.set()
    raw.thread.join()
    ticks, n = max(raw.ticks, 1), max(len(raw_fns), 1)
    return {"interval": interval, "calls": len(raw.calls_wall),
            "wall_us": statistics.median(raw.calls_wall) if raw.calls_wall else None,
            "cpu_us": raw.calls_cpu_ns / ticks / n / 1000.0,
            "cpu_with_wake_us": raw.calls_cpu_ns / ticks / n / 1000.0}


def daemon_path_at_cadence(sampler: Any, seconds: float) -> dict[str, Any]:
    """The started sampler alone: the reader's CPU per read and the loop's per tick."""
    got = at_cadence(lambda _interval: sampler, [], sampler.interval, seconds)
    return {"interval": got["interval"], "seconds": seconds, "ticks": got["ticks"],
            "worker_cpu_per_read_us": got["reader_cpu_per_read_us"],
            "worker_wall_per_read_us": got["reader_wall_per_read_us"],
            "loop_cpu_per_tick_us": got["loop_cpu_per_tick_us"],
            "per_gpu_cpu_us": got["daemon_cpu_per_gpu_us"],
            "process_cpu_per_tick_per_gpu_us": got["daemon_cpu_per_gpu_us"],
            "errors": got["errors"]}


# -- the raw calls -------------------------------------------------------------------------
def raw_calls(nv: Any, h: Any) -> tuple[Callable[[], Any], Callable[[], Any] | None, list[str]]:
    """Exactly the pynvml calls the fast tick makes on this GPU, with the same fallbacks."""
    def works(fn: Callable[[], Any]) -> bool:
        try:
            fn()
            return True
        except nv.NVMLError:
            return False
        except AttributeError:
            return False

    candidates: list[tuple[str, Callable[[], Any]]] = [
        ("utilization", lambda: nv.nvmlDeviceGetUtilizationRates(h)),
        ("memory_v2", lambda: nv.nvmlDeviceGetMemoryInfo(h, nv.nvmlMemory_v2)),
        ("memory", lambda: nv.nvmlDeviceGetMemoryInfo(h)),
        ("power", lambda: nv.nvmlDeviceGetPowerUsage(h)),
        ("power_limit", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h)),
        ("temperature", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
        ("sm_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
        ("mem_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
        ("pstate", lambda: nv.nvmlDeviceGetPerformanceState(h)),
        ("clock_events", lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h)),
        ("throttle", lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
        ("compute_procs", lambda: nv.nvmlDeviceGetComputeRunningProcesses_v3(h)),
        ("graphics_procs", lambda: nv.nvmlDeviceGetGraphicsRunningProcesses_v3(h)),
    ]
    chosen: list[tuple[str, Callable[[], Any]]] = []
    names = {name for name, fn in candidates if works(fn)}
    for name, fn in candidates:
        if name not in names:
            continue
        if name == "memory" and "memory_v2" in names:
            continue
        if name == "throttle" and "clock_events" in names:
            continue
        chosen.append((name, fn))
    calls = [fn for _name, fn in chosen]

    def cheap() -> None:
        for fn in calls:
            fn()

    gpm = None
    try:
        supported = nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice
    except (nv.NVMLError, AttributeError):
        supported = 0
    if supported:
        from gpuwatch.collect.nvml import GPM_METRICS

        ids = [getattr(nv, n) for n, _f in GPM_METRICS if hasattr(nv, n)]
        samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        get = nv.c_nvmlGpmMetricsGet_t()
        get.version = nv.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(ids)
        for i, m in enumerate(ids):
            get.metrics[i].metricId = m
        nv.nvmlGpmSampleGet(h, samples[0])

        def gpm() -> None:
            nv.nvmlGpmSampleGet(h, samples[1])
            get.sample1, get.sample2 = samples[0], samples[1]
            nv.nvmlGpmMetricsGet(get)
            samples.reverse()

        gpm_fn: Callable[[], Any] | None = gpm
        chosen.append(("gpm_sample+metrics", gpm))
    else:
        gpm_fn = None
    return cheap, gpm_fn, [name for name, _fn in chosen]


class FirstGpus:
    """pynvml with only its first ``n`` GPUs (NVML itself ignores CUDA_VISIBLE_DEVICES)."""

    def __init__(self, nv: Any, n: int) -> None:
        self._nv, self._n = nv, n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nv, name)

    def nvmlDeviceGetCount(self) -> int:
        return min(self._n, self._nv.nvmlDeviceGetCount())


def stub_module(gpus: int) -> Any:
    from tests.nvml_stub import NvmlStub, StubGpu

    # one process per GPU, as on a training node: its name lookup is part of the tick
    me = os.getpid()
    return NvmlStub([StubGpu(i, processes=[(me, 2**31)]) for i in range(gpus)],
                    gil_release=True)


def bench(nv_factory: Callable[[], Any], intervals: list[float], seconds: float,
          reps: int, rounds: int = 1) -> dict[str, Any]:
    """The hot row and one row per cadence, over modules ``nv_factory()`` makes (a fresh
    one per sampler, so the raw calls and the sampler share no state)."""
    from gpuwatch.collect.sampler import Sampler
    from gpuwatch.store import Store

    nv = nv_factory()
    nv.nvmlInit()
    raw_fns: list[Callable[[], Any]] = []
    names: list[str] = []
    for i in range(nv.nvmlDeviceGetCount()):
        cheap, gpm, names = raw_calls(nv, nv.nvmlDeviceGetHandleByIndex(i))
        raw_fns.append(lambda cheap=cheap, gpm=gpm: (cheap(), gpm() if gpm else None))

    def make_sampler(interval: float) -> Any:
        return Sampler(Store(), interval=interval, slow_interval=3600.0, host=NullHost(),
                       nvml_module=nv_factory())

    out: dict[str, Any] = {"gpus": len(raw_fns), "raw_calls": names}
    sampler = make_sampler(1.0)
    try:
        sampler.tick()
        time.sleep(0.3)
        t_now = time.time()
        fns: dict[str, Callable[[], Any]] = {}
        for i, (fn, g) in enumerate(zip(raw_fns, sampler._fast, strict=True)):
            fns[f"raw{i}"] = fn
            fns[f"read{i}"] = lambda g=g: g._read(t_now)
        got = interleaved_us(fns, reps * 2 * len(raw_fns))
        hot = daemon_path_hot(sampler, reps)
    finally:
        sampler.stop()
    n = len(raw_fns)
    raw_cpu = statistics.fmean(got[f"raw{i}"][1] for i in range(n))
    read_cpu = statistics.fmean(got[f"read{i}"][1] for i in range(n))
    out["hot"] = {"raw_calls_cpu_us": raw_cpu, "reader_cpu_per_read_us": read_cpu,
                  "raw_calls_wall_us": statistics.fmean(got[f"raw{i}"][0] for i in range(n)),
                  "reader_wall_per_read_us": statistics.fmean(got[f"read{i}"][0]
                                                              for i in range(n)),
                  "loop_cpu_per_tick_us": hot["loop_tick_cpu_us"],
                  "daemon_cpu_per_gpu_us": read_cpu + hot["loop_tick_cpu_us"] / n}
    out["hot"]["ratio"] = out["hot"]["daemon_cpu_per_gpu_us"] / raw_cpu
    # rounds taken in turn across the cadences; each cadence's row is its round of median
    # ratio (a whole round runs faster or slower on a shared host: the rounds say how much)
    runs: dict[float, list[dict[str, Any]]] = {interval: [] for interval in intervals}
    for _ in range(max(1, rounds)):
        for interval in intervals:
            runs[interval].append(at_cadence(make_sampler, raw_fns, interval, seconds))
    out["cadence"] = []
    for interval in intervals:
        got = sorted(runs[interval], key=lambda c: c["ratio"])
        row = dict(got[(len(got) - 1) // 2])
        row["round_ratios"] = [c["ratio"] for c in got]
        out["cadence"].append(row)
    nv.nvmlShutdown()
    return out


def xid_costs(nv: Any) -> dict[str, dict[str, Any]]:
    """What waiting for XID events costs while none come, per call, this thread's CPU:
    a blocking wait that times out (how a thread of its own waited, every 250 ms), a wait
    of 0 ms, and the sampler's poll (XidWatcher.poll: its first, which makes the event set
    and registers every GPU, then one a tick)."""
    from gpuwatch.collect.nvml import Nvml, XidWatcher

    out: dict[str, dict[str, Any]] = {}

    def per_call(key: str, fn: Callable[[], Any], n: int) -> None:
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        note = "ok"
        for _ in range(n):
            try:
                fn()
            except Exception as err:  # noqa: BLE001 - a timeout is the expected answer
                note = f"{type(err).__name__}: {err}"
        out[key] = {"wall_us": (time.perf_counter_ns() - w0) / 1000.0 / n,
                    "cpu_us": (time.thread_time_ns() - c0) / 1000.0 / n,
                    "result": f"{note} (mean of {n})"}

    try:
        es = nv.nvmlEventSetCreate()
        for i in range(nv.nvmlDeviceGetCount()):
            nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(i),
                                        nv.nvmlEventTypeXidCriticalError, es)
        per_call("event_wait_250ms", lambda: nv.nvmlEventSetWait_v2(es, 250), 8)
        per_call("event_wait_0ms", lambda: nv.nvmlEventSetWait_v2(es, 0), 2000)
        nv.nvmlEventSetFree(es)
    except Exception as err:  # noqa: BLE001 - a benchmark row, not a crash
        out["event_wait"] = {"wall_us": None, "cpu_us": None, "result": repr(err)}
    nvml = Nvml(nv)
    if nvml.open():
        watcher = XidWatcher(nvml)
        per_call("xid_poll_first", watcher.poll, 1)
        out["xid_poll_first"]["result"] += f", registered GPUs {list(watcher.registered)}"
        per_call("xid_poll", watcher.poll, 5000)
        nvml.close()
    return out


def slow_calls(nv: Any, h: Any) -> dict[str, dict[str, Any]]:
    calls = {
        "pcie_tx": lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES),
        "pcie_rx": lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES),
        "energy": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h),
        "pcie_replay": lambda: nv.nvmlDeviceGetPcieReplayCounter(h),
        "ecc_corrected": lambda: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
        "remapped_rows": lambda: nv.nvmlDeviceGetRemappedRows(h),
        "process_utilization": lambda: nv.nvmlDeviceGetProcessUtilization(h, 0),
    }
    out = {}
    for name, fn in calls.items():
        fn_wall, fn_cpu, note = once_wall_cpu_us(fn)
        out[name] = {"wall_us": fn_wall, "cpu_us": fn_cpu, "result": note}
    out.update(xid_costs(nv))
    return out


# -- other tools -------------------------------------------------------------------------------
def bench_others(count: int, reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    smi = shutil.which("nvidia-smi")
    if smi:
        query = ("utilization.gpu,utilization.memory,memory.used,memory.total,power.draw,"
                 "power.limit,temperature.gpu,clocks.sm,clocks.mem,pstate")
        cmd = [smi, f"--query-gpu={query}", "--format=csv,noheader,nounits"]
        out["nvidia_smi_us"] = median_us(
            lambda: subprocess.run(cmd, check=True, capture_output=True), 20, warmup=2)
    else:
        out["nvidia_smi_note"] = "nvidia-smi not found"
    try:
        from nvitop import Device

        devices = [Device(i) for i in range(count)]
        methods = ("gpu_utilization", "memory_utilization", "memory_used", "memory_total",
                   "power_usage", "power_limit", "temperature", "sm_clock", "memory_clock",
                   "performance_state")

        def nvitop_query(d: Any = devices[0]) -> None:
            for m in methods:
                getattr(d, m)()

        out["nvitop_us"] = median_us(nvitop_query, reps)
        out["nvitop_query"] = list(methods)
    except Exception as err:  # noqa: BLE001 - not installed, or it failed: a note, not a crash
        out["nvitop_note"] = f"skipped: {type(err).__name__}: {err}"
    try:
        import gpustat

        out["gpustat_us"] = median_us(gpustat.new_query, 10, warmup=1)
        out["gpustat_per_gpu_us"] = out["gpustat_us"] / max(count, 1)
    except Exception as err:  # noqa: BLE001 - not installed, or it failed: a note, not a crash
        out["gpustat_note"] = f"skipped: {type(err).__name__}: {err}"
    return out


# -- the daemon ---------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_daemon(interval: float, seconds: float, stub_gpus: int | None,
                   settle: float = 3.0, repeat: int = 1,
                   energy_interval: float | None = None) -> dict[str, Any]:
    """A whole daemon process (``gpuwatch run``; with the stub, tests/scripts/stub_daemon.py;
    with ``repeat`` > 1, benchmarks/repeat_gpus_daemon.py) watched with psutil: CPU (% of
    one core), RSS (at the end, its peak, by minute), threads. ``energy_interval``: the
    daemon's (a configuration file of that one key), else its default."""
    import psutil

    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = ["run", "--interval", str(interval), "--web.listen-address",
            f"127.0.0.1:{_free_port()}", "--quiet"]
    if energy_interval is not None:
        config = tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="bench-tick-",
                                             delete=False)
        with config:
            config.write(f"energy_interval: {energy_interval:g}\n")
        args += ["--config.file", config.name]
    if stub_gpus is not None:
        env["STUB_GPUS"] = str(stub_gpus)
        cmd = [sys.executable, str(REPO / "tests" / "scripts" / "stub_daemon.py"), *args[1:]]
        what = f"gpuwatch run, {stub_gpus} stub GPUs"
    elif repeat > 1:
        env["REPEAT_GPUS"] = str(repeat)
        cmd = [sys.executable, str(REPO / "benchmarks" / "repeat_gpus_daemon.py"), *args[1:]]
        what = f"gpuwatch run, each GPU listed {repeat} times"
    else:
        cmd = [sys.executable, "-m", "gpuwatch", *args]
        what = "gpuwatch run"
    proc = subprocess.Popen(cmd, env=env, cwd=str(REPO), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        time.sleep(settle)
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-400:] if proc.stderr else ""
            return {"interval": interval, "measured": f"nothing: {what} exited: {err.strip()}"}
        p = psutil.Process(proc.pid)
        c0 = p.cpu_times()
        by0 = thread_cpu(proc.pid)
        t0 = time.monotonic()
        rss = [p.memory_info().rss]
        curve = []  # (minutes since the start, MB) at each whole minute watched
        while time.monotonic() - t0 < seconds:
            time.sleep(1.0)
            rss.append(p.memory_info().rss)
            if len(rss) % 60 == 1:
                curve.append((round((time.monotonic() - t0 + settle) / 60, 1),
                              round(rss[-1] / 2**20, 1)))
        c1 = p.cpu_times()
        by1 = thread_cpu(proc.pid)
        wall = time.monotonic() - t0
        threads = p.num_threads()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        if energy_interval is not None:
            os.unlink(config.name)
    busy = (c1.user - c0.user) + (c1.system - c0.system)
    split: dict[str, float] = {}
    for tid, (name, cpu) in by1.items():
        # a thread born meanwhile (an HTTP connection's) counts from nothing
        before = by0[tid][1] if tid in by0 and by0[tid][0] == name else 0.0
        # gw-gpu3-slow: one row for every GPU's (the main thread keeps the process's name;
        # libnvidia-ml starts one of its own, "cuda000...")
        key = re.sub(r"\d+", "N", name) if name.startswith("gw-") else name
        split[key] = split.get(key, 0.0) + 100.0 * (cpu - before) / wall
    if energy_interval is not None:
        what += f", energy_interval {energy_interval:g} s"
    return {"interval": interval, "measured": what, "seconds": round(wall, 1),
            "cpu_percent": 100.0 * busy / wall, "rss_mb": max(rss) / 2**20, "threads": threads,
            "rss_last_mb": rss[-1] / 2**20, "rss_by_minute": curve,
            "by_thread": dict(sorted(split.items(), key=lambda kv: -kv[1]))}


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Each thread of ``pid``: its name as the kernel knows it (the daemon names its
    threads: gpuwatch/threads.py) and its CPU seconds so far, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm", encoding="utf-8") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="utf-8") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / tick)  # utime + stime
    return out


# -- report --------------------------------------------------------------------------------------
def fmt(us: float | None) -> str:
    if us is None:
        return "-"
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} µs"


def report(result: dict[str, Any]) -> str:
    b = result["bench"]
    lines = [f"## bench_tick: {result['device']}; {result['host']}, {result['cpus']} CPUs, "
             f"Python {result['python']}, load average {result['load']}", "",
             "| per GPU | GPUs | raw calls, CPU | + their wake-up | daemon path, CPU | "
             "reader CPU / read (wall) | loop CPU / tick | vs raw calls | vs raw + wake-up | "
             "ticks |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    h = b["hot"]
    lines.append(f"| hot (back to back) | {b['gpus']} | {fmt(h['raw_calls_cpu_us'])} | - | "
                 f"{fmt(h['daemon_cpu_per_gpu_us'])} | {fmt(h['reader_cpu_per_read_us'])} "
                 f"({fmt(h['reader_wall_per_read_us'])}) | {fmt(h['loop_cpu_per_tick_us'])} | "
                 f"**{h['ratio']:.2f}x** | - | - |")
    for c in b["cadence"]:
        lines.append(
            f"| at --interval {c['interval']:g} | {c['gpus']} | {fmt(c['raw_calls_cpu_us'])} | "
            f"{fmt(c['raw_with_wake_cpu_us'])} | {fmt(c['daemon_cpu_per_gpu_us'])} | "
            f"{fmt(c['reader_cpu_per_read_us'])} ({fmt(c['reader_wall_per_read_us'])}) | "
            f"{fmt(c['loop_cpu_per_tick_us'])} | **{c['ratio']:.2f}x** | "
            f"{c['ratio_with_wake']:.2f}x | {c['ticks']} |")
    for c in b["cadence"]:
        if len(c.get("round_ratios", ())) > 1:
            lines.append(f"\nat --interval {c['interval']:g}, vs raw calls, each of "
                         f"{len(c['round_ratios'])} rounds (sorted; the row is the median "
                         f"round): " + ", ".join(f"{r:.2f}x" for r in c["round_ratios"]))
    for c in b["cadence"]:
        if c["errors"]:
            lines.append(f"\nerrors at --interval {c['interval']:g}: {c['errors']}")
    if result.get("daemon"):
        lines += ["", "| daemon process | CPU (% of one core) | RSS at the end (peak) | threads |",
                  "| --- | --- | --- | --- |"]
        for d in result["daemon"]:
            if "cpu_percent" in d:
                lines.append(f"| {d['measured']}, --interval {d['interval']:g} | "
                             f"{d['cpu_percent']:.2f} % | {d['rss_last_mb']:.1f} MB "
                             f"({d['rss_mb']:.1f} MB) | {d['threads']} |")
            else:
                lines.append(f"| --interval {d['interval']:g} | {d['measured']} | - | - |")
        for d in result["daemon"]:
            if len(d.get("rss_by_minute") or ()) > 1:
                lines.append(f"\nits RSS by minute since the start, --interval {d['interval']:g}"
                             " (minute: MB): " + ", ".join(f"{m:g}: {mb:.1f}"
                                                            for m, mb in d["rss_by_minute"]))
        for d in result["daemon"]:
            if d.get("by_thread"):
                lines += ["", f"its CPU by thread (% of one core, the kernel's clock ticks: "
                              f"{100.0 / os.sysconf('SC_CLK_TCK') / d['seconds']:.3f} % a tick "
                              f"over {d['seconds']:g} s), --interval {d['interval']:g}: "
                              + ", ".join(f"{name} {pct:.3f} %"
                                          for name, pct in d["by_thread"].items() if pct > 0)]
    if result.get("slow_calls"):
        lines += ["", "| slow tier, one call (GPU 0) | wall | CPU | result |",
                  "| --- | --- | --- | --- |"]
        for name, r in result["slow_calls"].items():
            lines.append(f"| {name} | {fmt(r['wall_us'])} | {fmt(r['cpu_us'])} | {r['result']} |")
    others = result.get("others") or {}
    for key, label in (("nvitop_us", "nvitop Device, ten queries"),
                       ("gpustat_per_gpu_us", "gpustat.new_query() / GPUs"),
                       ("nvidia_smi_us", "nvidia-smi --query-gpu (all GPUs)")):
        if key in others:
            lines.append(f"\n{label}: {fmt(others[key])}")
    lines += ["", "targets: " + ", ".join(f"{k}: {'ok' if v else 'MISSED'}"
                                          for k, v in result["targets"].items())]
    return "\n".join(lines)


def targets(result: dict[str, Any]) -> dict[str, bool]:
    out: dict[str, bool] = {}
    b = result["bench"]
    for c in b["cadence"]:
        out[f"daemon path CPU within {TARGET_TICK_RATIO}x of the raw calls at "
            f"{c['interval']:g} s"] = c["ratio"] <= TARGET_TICK_RATIO
    for d in result.get("daemon", []):
        if "cpu_percent" not in d:
            continue
        if d["interval"] == 1.0:
            out[f"< {TARGET_CPU_PERCENT_AT_1S} % of a core at 1 s"] = (
                d["cpu_percent"] < TARGET_CPU_PERCENT_AT_1S)
        # what it holds while it runs (the peak is start-up's, before the first heap trim)
        out[f"< {TARGET_RSS_MB:.0f} MB RSS at {d['interval']:g} s"] = \
            d["rss_last_mb"] < TARGET_RSS_MB
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stub", action="store_true",
                    help="the NVML stub (tests/nvml_stub.py) instead of the driver")
    ap.add_argument("--gpus", type=int, default=None,
                    help="stub GPUs (default 8); on a GPU host, read only the first N")
    ap.add_argument("--interval", type=float, action="append",
                    help="a cadence to measure at, seconds (repeatable; default 1 and 0.1)")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long at each cadence")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds at each cadence, taken in turn (the row is the round of "
                         "median ratio; every round's ratio is listed)")
    ap.add_argument("--reps", type=int, default=500, help="repetitions of the hot row")
    ap.add_argument("--rss-seconds", type=float, default=10.0,
                    help="how long to watch a whole daemon process at each cadence (0: skip)")
    ap.add_argument("--full", action="store_true",
                    help="on a GPU host: also each slow-tier call once and other tools")
    ap.add_argument("--repeat-gpus", type=int, default=1, metavar="K",
                    help="on a GPU host: list each GPU K times, read as K GPUs (8 over a "
                         "4-GPU machine: a stand-in for a bigger node; "
                         "benchmarks/repeat_gpus_daemon.py)")
    ap.add_argument("--energy-interval", metavar="S,S,...",
                    type=lambda text: [float(x) for x in text.split(",")],
                    help="watch the daemon once with each of these energy_interval values "
                         "(seconds, >= 30), in turn, instead of once with its default; "
                         "watch for 120 s or more (--rss-seconds) to see its slow rounds")
    ap.add_argument("--out", metavar="FILE", help="write the results as JSON here")
    args = ap.parse_args(argv)
    intervals = args.interval or [1.0, CADENCE_INTERVAL]

    result: dict[str, Any] = {"host": platform.node(), "python": sys.version.split()[0],
                              "cpus": os.cpu_count(),
                              "load": " ".join(f"{x:.1f}" for x in os.getloadavg())}
    nv: Any = None
    if not args.stub:
        try:
            import pynvml as nv

            nv.nvmlInit()
            if nv.nvmlDeviceGetCount() == 0:
                raise RuntimeError("NVML found no GPU")
            result["driver"] = str(nv.nvmlSystemGetDriverVersion())
        except Exception as err:  # noqa: BLE001 - no GPU here: measure over the stub
            print(f"no GPU ({type(err).__name__}: {err}): measuring over the NVML stub",
                  file=sys.stderr)
            nv = None
    stub_gpus: int | None = None
    if nv is None:
        stub_gpus = args.gpus or 8
        result["device"] = f"{stub_gpus} stub GPUs (tests/nvml_stub.py, GIL left per call)"
        factory: Callable[[], Any] = lambda: stub_module(stub_gpus)  # noqa: E731
    else:
        count = nv.nvmlDeviceGetCount()
        if args.gpus:
            count = min(count, args.gpus)
        name = nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(0))
        result["device"] = f"{count}x {name}, driver {result['driver']}"
        if args.repeat_gpus > 1:
            from benchmarks.repeat_gpus_daemon import RepeatedGpus

            result["device"] += (f"; each listed {args.repeat_gpus} times: "
                                 f"{count * args.repeat_gpus} GPUs read")
            factory = lambda: RepeatedGpus(FirstGpus(nv, count), args.repeat_gpus)  # noqa: E731
        else:
            factory = lambda: FirstGpus(nv, count)  # noqa: E731
    result["bench"] = bench(factory, intervals, args.seconds, args.reps, args.rounds)
    if nv is not None and args.full:
        result["slow_calls"] = slow_calls(nv, nv.nvmlDeviceGetHandleByIndex(0))
        result["others"] = bench_others(result["bench"]["gpus"], args.reps)
    if nv is not None:
        nv.nvmlShutdown()
    result["daemon"] = []
    if args.rss_seconds > 0:
        for interval in intervals:
            for energy in args.energy_interval or [None]:
                print(f"watching a daemon process at --interval {interval:g} for "
                      f"{args.rss_seconds:.0f} s"
                      + (f", energy_interval {energy:g} s" if energy else ""), file=sys.stderr)
                result["daemon"].append(measure_daemon(
                    interval, args.rss_seconds, stub_gpus,
                    repeat=args.repeat_gpus if stub_gpus is None else 1,
                    energy_interval=energy))
    result["targets"] = targets(result)
    print(report(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    sys.exit(main())
