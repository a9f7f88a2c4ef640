#!/usr/bin/env python3
"""What one sampler tick costs per GPU, beside the raw NVML calls it makes and other tools.

Run on a GPU host from the repository root:

    python3 benchmarks/bench_tick.py --out bench_tick.json

Measured in one run, medians over many repetitions:

- the raw pynvml calls the fast tick makes (cheap fields, processes, GPM pair), in a loop;
- ``NvmlGpu.read_fast()``: the NVML layer doing those calls (no thread hand-off);
- the **daemon path** per GPU, what ``Sampler.start()`` runs each tick: the GPU's worker
  reading and building its sample, plus the loop's tick (gather the samples, Snapshot,
  ``store.publish``) divided by the GPUs. Measured twice: *hot*, back to back on this
  thread (comparable with the raw calls above, also back to back), and *at cadence*, the
  started sampler at ``--interval 0.1`` for a while, read from each thread's own CPU clock
  (wake-ups and cold caches included) beside the raw calls made at the same cadence;
- ``Sampler.tick()`` per GPU: the synchronous tick that tests call, which hands each
  worker its read and waits for the answer (a hand-off the daemon loop does not make),
  wall time and the CPU time the process spent;
- the same tick while the slow tier runs back to back beside it (driver contention);
- each slow-tier call once, wall and CPU (is NVML sleeping or spinning in its 20 ms?);
- ``nvidia-smi --query-gpu`` as a subprocess, nvitop's Device queries and
  ``gpustat.new_query()`` where those packages import (skipped with a note otherwise);
- the daemon's CPU (% of one core) and RSS running ``python3 -m gpuwatch run`` at
  ``--interval 1`` and ``--interval 0.1`` (falls back to the Sampler alone in a subprocess
  when the CLI can't run, and says which was measured).

Without a GPU it reports "no GPU" and measures only the daemon.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
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
    """The loop's work per GPU, back to back on this thread (the sampler is not started).

    Each worker's read is exactly what its thread runs per tick, but the wake-up; the
    loop's tick is run over samples left in the workers' slots, as the workers leave them.
    """
    workers = sampler._fast
    t = time.time()
    reads = [wall_and_cpu_us(lambda w=w: w._read(t), reps) for w in workers]
    samples = [w._read(t) for w in workers]
    slots = iter(range(10**9, 2 * 10**9))

    def loop_tick() -> None:
        slot = next(slots)
        for w, sample in zip(workers, samples, strict=True):
            w.slot = (slot, sample, 0)
        sampler._tick_slot(slot)

    tick_wall, tick_cpu = wall_and_cpu_us(loop_tick, reps)
    n = max(len(workers), 1)
    return {"read_us": [r[0] for r in reads], "read_cpu_us": [r[1] for r in reads],
            "loop_tick_us": tick_wall, "loop_tick_cpu_us": tick_cpu,
            "per_gpu_us": [r[0] + tick_wall / n for r in reads],
            "per_gpu_cpu_us": [r[1] + tick_cpu / n for r in reads]}


def _thread_cpu_ns(threads: list[threading.Thread]) -> dict[str, int]:
    out = {}
    for t in threads:
        try:
            out[t.name] = time.clock_gettime_ns(time.pthread_getcpuclockid(t.ident))
        except (OSError, TypeError, AttributeError):  # gone, never started, not Linux
            pass
    return out


def daemon_path_at_cadence(sampler: Any, seconds: float) -> dict[str, Any]:
    """The started sampler: each thread's CPU from its own clock, per read and per tick."""
    try:
        sampler.start()
        time.sleep(max(3 * sampler.interval, 0.5))  # past the first ticks
        threads = [t for t in threading.enumerate() if t.name.startswith("gpuwatch-")]
        workers = [t.name for t in threads
                   if t.name.startswith("gpuwatch-gpu") and not t.name.endswith("-slow")]
        fast = list(getattr(sampler, "_fast", []))
        reads0 = sum(getattr(w, "reads", 0) for w in fast)
        read_ns0 = sum(getattr(w, "read_ns", 0) for w in fast)
        ticks0 = sampler.store.latest().health.ticks_total
        cpu0, proc0 = _thread_cpu_ns(threads), time.process_time_ns()
        time.sleep(seconds)
        cpu1, proc1 = _thread_cpu_ns(threads), time.process_time_ns()
        ticks = max(sampler.store.latest().health.ticks_total - ticks0, 1)
        reads = sum(getattr(w, "reads", 0) for w in fast) - reads0
        read_ns = sum(getattr(w, "read_ns", 0) for w in fast) - read_ns0
        errors = dict(sampler.store.latest().health.errors_total)
    finally:
        sampler.stop()
    n = max(len(workers), 1)
    worker_cpu = sum(cpu1[w] - cpu0[w] for w in workers if w in cpu0 and w in cpu1)
    loop_cpu = cpu1.get("gpuwatch-sampler", 0) - cpu0.get("gpuwatch-sampler", 0)
    # a design that hands one read per tick per GPU counts no reads: then reads = ticks * n
    per_read = worker_cpu / max(reads or ticks * n, 1) / 1000.0
    return {"interval": sampler.interval, "seconds": seconds, "ticks": ticks,
            "worker_cpu_per_read_us": per_read,
            "worker_wall_per_read_us": read_ns / reads / 1000.0 if reads else None,
            "loop_cpu_per_tick_us": loop_cpu / ticks / 1000.0,
            "per_gpu_cpu_us": per_read + loop_cpu / ticks / n / 1000.0,
            "process_cpu_per_tick_per_gpu_us": (proc1 - proc0) / ticks / n / 1000.0,
            "errors": errors}


def raw_at_cadence(raw_fns: list[Callable[[], Any]], interval: float,
                   seconds: float) -> dict[str, Any]:
    """The raw calls of every GPU once per ``interval`` on a thread of their own, as cold as
    the daemon's reads. Per GPU: the median wall and mean CPU of the calls alone, and the
    thread's CPU per tick with its one wake-up (the least any sampler pays) over the GPUs."""
    walls: list[float] = []
    cpus: list[float] = []
    ticks = 0
    thread_cpu = 0

    def run() -> None:
        nonlocal ticks, thread_cpu
        bell = threading.Lock()
        bell.acquire()
        end = time.monotonic() + seconds
        start_cpu = time.thread_time_ns()
        while time.monotonic() < end:
            bell.acquire(timeout=interval)
            for fn in raw_fns:
                t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                fn()
                walls.append((time.perf_counter_ns() - t0) / 1000.0)
                cpus.append((time.thread_time_ns() - c0) / 1000.0)
            ticks += 1
        thread_cpu = time.thread_time_ns() - start_cpu

    thread = threading.Thread(target=run, name="raw-at-cadence")
    thread.start()
    thread.join()
    return {"interval": interval, "calls": len(walls), "wall_us": statistics.median(walls),
            "cpu_us": statistics.fmean(cpus),
            "cpu_with_wake_us": thread_cpu / max(ticks, 1) / max(len(raw_fns), 1) / 1000.0}


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


def bench_gpus(nv: Any, reps: int, cadence_seconds: float = 10.0) -> dict[str, Any]:
    from gpuwatch.collect.nvml import Nvml
    from gpuwatch.collect.sampler import Sampler
    from gpuwatch.store import Store

    out: dict[str, Any] = {"gpus": []}
    raw_fns: list[Callable[[], Any]] = []
    count = nv.nvmlDeviceGetCount()
    for i in range(count):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        cheap, gpm, names = raw_calls(nv, h)
        row: dict[str, Any] = {"gpu": i, "name": str(nv.nvmlDeviceGetName(h)), "raw_calls": names}
        row["raw_cheap_us"] = median_us(cheap, reps)
        row["raw_gpm_us"] = median_us(gpm, reps) if gpm else None

        def raw_all(cheap=cheap, gpm=gpm) -> None:
            cheap()
            if gpm:
                gpm()

        row["raw_total_us"], row["raw_total_cpu_us"] = wall_and_cpu_us(raw_all, reps)
        raw_fns.append(raw_all)
        out["gpus"].append(row)

    # the synchronous tick, and the daemon path hot, per GPU
    sampler = Sampler(Store(), interval=1.0, slow_interval=3600.0, host=NullHost())
    sampler.tick()
    time.sleep(0.5)  # let the first slow read (started by the first tick) finish
    wall, cpu = wall_and_cpu_us(sampler.tick, reps)
    n = max(len(out["gpus"]), 1)
    out["tick_us"], out["tick_cpu_us"] = wall, cpu
    hot = daemon_path_hot(sampler, reps)
    out["daemon_hot"] = hot

    # the side-by-side comparison: per GPU, the raw calls, the NVML layer and the daemon
    # path's read (the worker's read + building its sample) in alternating rounds
    layer = Nvml()
    layer.open()
    t_now = time.time()
    for i, (gpu, row) in enumerate(zip(layer.gpus, out["gpus"], strict=True)):
        gpu.probe()
        row["slow_calls"] = slow_calls(layer.nv, gpu.handle)
        worker = sampler._fast[i]
        got = interleaved_us({"raw": raw_fns[i], "layer": gpu.read_fast,
                              "daemon": lambda w=worker: w._read(t_now)}, reps)
        row["raw_total_us"], row["raw_total_cpu_us"] = got["raw"]
        row["read_fast_us"] = got["layer"][0]
        row["daemon_read_us"], row["daemon_read_cpu_us"] = got["daemon"]
        per_tick_wall, per_tick_cpu = hot["loop_tick_us"] / n, hot["loop_tick_cpu_us"] / n
        row["daemon_per_gpu_us"] = got["daemon"][0] + per_tick_wall
        row["daemon_per_gpu_cpu_us"] = got["daemon"][1] + per_tick_cpu
        row["tick_per_gpu_us"] = wall / n
        row["tick_per_gpu_cpu_us"] = cpu / n
    layer.close()
    errors = dict(sampler.store.latest().health.errors_total)
    sampler.stop()
    out["tick_errors"] = errors

    # the daemon path at its cadence, beside the raw calls at the same cadence
    out["raw_at_cadence"] = raw_at_cadence(raw_fns, CADENCE_INTERVAL, cadence_seconds)
    out["daemon_at_cadence"] = daemon_path_at_cadence(
        Sampler(Store(), interval=CADENCE_INTERVAL, slow_interval=3600.0, host=NullHost()),
        cadence_seconds)

    # the tick while the slow tier runs back to back beside it
    sampler = Sampler(Store(), interval=1.0, slow_interval=1e-6, host=NullHost())
    out["tick_with_slow_running_us"] = median_us(sampler.tick, max(reps // 4, 50))
    out["tick_with_slow_running_errors"] = dict(sampler.store.latest().health.errors_total)
    sampler.stop()
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
    # what the XID thread's wait costs while nothing happens
    try:
        es = nv.nvmlEventSetCreate()
        nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, es)
        w, c, note = once_wall_cpu_us(lambda: nv.nvmlEventSetWait_v2(es, 250))
        out["event_wait_250ms"] = {"wall_us": w, "cpu_us": c, "result": note}
        nv.nvmlEventSetFree(es)
    except Exception as err:  # noqa: BLE001 - a benchmark row, not a crash
        out["event_wait_250ms"] = {"wall_us": None, "cpu_us": None, "result": repr(err)}
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
_FALLBACK = """
import sys, threading
sys.path.insert(0, sys.argv[2])
from gpuwatch.collect.sampler import Sampler
from gpuwatch.store import Store
s = Sampler(Store(), interval=float(sys.argv[1]))
s.start()
threading.Event().wait()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_daemon(interval: float, seconds: float, settle: float = 3.0) -> dict[str, Any]:
    import psutil

    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cli = [sys.executable, "-m", "gpuwatch", "run", "--interval", str(interval),
           "--web.listen-address", f"127.0.0.1:{_free_port()}", "--quiet"]
    fallback = [sys.executable, "-c", _FALLBACK, str(interval), str(REPO)]
    for what, cmd in (("python3 -m gpuwatch run", cli), ("Sampler in a subprocess", fallback)):
        proc = subprocess.Popen(cmd, env=env, cwd=str(REPO), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        time.sleep(settle)
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-400:] if proc.stderr else ""
            print(f"  {what} exited ({proc.returncode}): {err.strip()}", file=sys.stderr)
            continue
        p = psutil.Process(proc.pid)
        c0 = p.cpu_times()
        t0 = time.monotonic()
        rss = [p.memory_info().rss]
        while time.monotonic() - t0 < seconds:
            time.sleep(1.0)
            rss.append(p.memory_info().rss)
        c1 = p.cpu_times()
        wall = time.monotonic() - t0
        threads = p.num_threads()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        busy = (c1.user - c0.user) + (c1.system - c0.system)
        return {"interval": interval, "measured": what, "seconds": round(wall, 1),
                "cpu_percent": 100.0 * busy / wall, "rss_mb": max(rss) / 2**20,
                "threads": threads}
    return {"interval": interval, "measured": "nothing: neither the CLI nor the Sampler ran"}


# -- report --------------------------------------------------------------------------------------
def fmt(us: float | None) -> str:
    if us is None:
        return "-"
    return f"{us / 1000:.1f} ms" if us >= 1000 else f"{us:.1f} µs"


def report(result: dict[str, Any]) -> str:
    lines = [f"## bench_tick — {result['device']}", ""]
    gpu = result.get("gpu")
    if gpu is None:
        lines += [f"no GPU: {result.get('no_gpu_reason')}", ""]
    else:
        lines += ["| per GPU | median | vs raw calls |", "| --- | --- | --- |"]
        for row in gpu["gpus"]:
            raw, raw_cpu = row["raw_total_us"], row["raw_total_cpu_us"]
            n_cheap = len(row["raw_calls"]) - (1 if row["raw_gpm_us"] else 0)
            lines.append(f"| **GPU {row['gpu']}** ({row['name']}) | | |")
            lines.append(f"| raw cheap calls ({n_cheap}) | {fmt(row['raw_cheap_us'])} | |")
            lines.append(f"| raw GPM sample + metrics | {fmt(row['raw_gpm_us'])} | |")
            lines.append(f"| raw calls the tick makes | {fmt(raw)} (CPU {fmt(raw_cpu)}) | 1.00x |")
            lines.append(f"| NvmlGpu.read_fast() | {fmt(row['read_fast_us'])} | "
                         f"{row['read_fast_us'] / raw:.2f}x |")
            lines.append(f"| worker read + sample (daemon path) | {fmt(row['daemon_read_us'])} "
                         f"(CPU {fmt(row['daemon_read_cpu_us'])}) | |")
            lines.append(f"| **daemon path per GPU, wall** (read + loop tick / GPUs) | "
                         f"{fmt(row['daemon_per_gpu_us'])} | "
                         f"{row['daemon_per_gpu_us'] / raw:.2f}x |")
            lines.append(f"| **daemon path per GPU, CPU** | {fmt(row['daemon_per_gpu_cpu_us'])} | "
                         f"{row['daemon_per_gpu_cpu_us'] / raw_cpu:.2f}x (CPU vs CPU) |")
            lines.append(f"| Sampler.tick() synchronous, per GPU, wall | "
                         f"{fmt(row['tick_per_gpu_us'])} | {row['tick_per_gpu_us'] / raw:.2f}x |")
            lines.append(f"| Sampler.tick() synchronous, per GPU, CPU | "
                         f"{fmt(row['tick_per_gpu_cpu_us'])} | "
                         f"{row['tick_per_gpu_cpu_us'] / raw_cpu:.2f}x (CPU vs CPU) |")
        hot = gpu["daemon_hot"]
        lines.append(f"| daemon loop tick (all GPUs, hot) | {fmt(hot['loop_tick_us'])} "
                     f"(CPU {fmt(hot['loop_tick_cpu_us'])}) | |")
        rc, dc = gpu["raw_at_cadence"], gpu["daemon_at_cadence"]
        lines.append(f"| **at --interval {dc['interval']}** ({dc['ticks']} ticks; cold) | | |")
        lines.append(f"| raw calls per GPU at that cadence | {fmt(rc['wall_us'])} "
                     f"(CPU {fmt(rc['cpu_us'])}) | 1.00x |")
        lines.append(f"| the same with their thread's one wake-up, CPU | "
                     f"{fmt(rc['cpu_with_wake_us'])} | "
                     f"{rc['cpu_with_wake_us'] / rc['cpu_us']:.2f}x |")
        lines.append(f"| worker per read: wall, CPU (wake-up included) | "
                     f"{fmt(dc['worker_wall_per_read_us'])}, "
                     f"{fmt(dc['worker_cpu_per_read_us'])} | |")
        lines.append(f"| loop per tick, CPU | {fmt(dc['loop_cpu_per_tick_us'])} | |")
        lines.append(f"| **daemon path per GPU, CPU** (worker + loop / GPUs) | "
                     f"{fmt(dc['per_gpu_cpu_us'])} | "
                     f"{dc['per_gpu_cpu_us'] / rc['cpu_us']:.2f}x (CPU vs CPU) |")
        lines.append(f"| whole process CPU per tick per GPU | "
                     f"{fmt(dc['process_cpu_per_tick_per_gpu_us'])} | |")
        lines.append(f"| tick (all GPUs) with the slow tier running beside it | "
                     f"{fmt(gpu['tick_with_slow_running_us'])} | |")
        others = result.get("others", {})
        for key, label in (("nvitop_us", "nvitop Device, ten queries"),
                           ("gpustat_per_gpu_us", "gpustat.new_query() / GPUs"),
                           ("nvidia_smi_us", "nvidia-smi --query-gpu (all GPUs)")):
            if key in others:
                lines.append(f"| {label} | {fmt(others[key])} | |")
        for key in ("nvitop_note", "gpustat_note", "nvidia_smi_note"):
            if key in others:
                lines.append(f"| {key.split('_')[0]} | {others[key]} | |")
        lines += ["", "| slow tier, one call (GPU 0) | wall | CPU | result |",
                  "| --- | --- | --- | --- |"]
        for name, r in gpu["gpus"][0]["slow_calls"].items():
            lines.append(f"| {name} | {fmt(r['wall_us'])} | {fmt(r['cpu_us'])} | {r['result']} |")
        if gpu.get("tick_errors"):
            lines.append(f"\ntick errors: {gpu['tick_errors']}")
    if result.get("daemon"):
        lines += ["", "| daemon | measured | CPU (% of one core) | RSS | threads |",
                  "| --- | --- | --- | --- | --- |"]
        for d in result["daemon"]:
            if "cpu_percent" in d:
                lines.append(f"| --interval {d['interval']} | {d['measured']} | "
                             f"{d['cpu_percent']:.2f} % | {d['rss_mb']:.1f} MB | {d['threads']} |")
            else:
                lines.append(f"| --interval {d['interval']} | {d['measured']} | - | - | - |")
    lines += ["", "targets: " + ", ".join(f"{k}: {'ok' if v else 'MISSED'}"
                                          for k, v in result["targets"].items())]
    return "\n".join(lines)


def targets(result: dict[str, Any]) -> dict[str, bool]:
    out: dict[str, bool] = {}
    gpu = result.get("gpu")
    if gpu:
        out[f"daemon path CPU within {TARGET_TICK_RATIO}x of raw calls"] = all(
            r["daemon_per_gpu_cpu_us"] <= TARGET_TICK_RATIO * r["raw_total_cpu_us"]
            for r in gpu["gpus"])
        out[f"daemon path wall within {TARGET_TICK_RATIO}x of raw calls"] = all(
            r["daemon_per_gpu_us"] <= TARGET_TICK_RATIO * r["raw_total_us"] for r in gpu["gpus"])
        out[f"daemon path CPU at cadence within {TARGET_TICK_RATIO}x of raw calls there"] = (
            gpu["daemon_at_cadence"]["per_gpu_cpu_us"]
            <= TARGET_TICK_RATIO * gpu["raw_at_cadence"]["cpu_us"])
    for d in result.get("daemon", []):
        if "cpu_percent" not in d:
            continue
        if d["interval"] == 1.0:
            out[f"< {TARGET_CPU_PERCENT_AT_1S} % of a core at 1 s"] = (
                d["cpu_percent"] < TARGET_CPU_PERCENT_AT_1S)
        out[f"< {TARGET_RSS_MB:.0f} MB RSS at {d['interval']} s"] = d["rss_mb"] < TARGET_RSS_MB
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", metavar="FILE", help="write the results as JSON here")
    ap.add_argument("--reps", type=int, default=2000, help="repetitions per micro-benchmark")
    ap.add_argument("--cadence-seconds", type=float, default=10.0,
                    help=f"how long to watch the daemon path at --interval {CADENCE_INTERVAL}")
    ap.add_argument("--daemon-seconds", type=float, default=20.0,
                    help="how long to watch the daemon at each interval (0: skip)")
    args = ap.parse_args(argv)

    result: dict[str, Any] = {"device": platform.node(), "python": sys.version.split()[0],
                              "cpus": os.cpu_count()}
    try:
        import pynvml as nv

        nv.nvmlInit()
        result["driver"] = str(nv.nvmlSystemGetDriverVersion())
        count = nv.nvmlDeviceGetCount()
        if count == 0:
            raise RuntimeError("NVML found no GPU")
    except Exception as err:  # noqa: BLE001 - no GPU here: report it and measure the rest
        result["no_gpu_reason"] = f"{type(err).__name__}: {err}"
        print(f"no GPU: {result['no_gpu_reason']}", file=sys.stderr)
        count = 0
    if count:
        result["device"] = f"{count}x {nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(0))}"
        result["gpu"] = bench_gpus(nv, args.reps, args.cadence_seconds)
        result["others"] = bench_others(count, args.reps)
        nv.nvmlShutdown()
    result["daemon"] = []
    if args.daemon_seconds > 0:
        for interval in (1.0, 0.1):
            print(f"watching the daemon at --interval {interval} for {args.daemon_seconds:.0f} s",
                  file=sys.stderr)
            result["daemon"].append(measure_daemon(interval, args.daemon_seconds))
    result["targets"] = targets(result)
    print(report(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    sys.exit(main())
