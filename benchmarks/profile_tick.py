#!/usr/bin/env python3
"""What the sampler costs beside the NVML calls it makes, on the stub (no GPU needed).

    python3 benchmarks/profile_tick.py             # 1 and 8 GPUs
    python3 benchmarks/profile_tick.py --gpus 8 --profile

Over ``tests/nvml_stub.py`` an NVML call costs a few microseconds of Python, not a trip
to the driver, so what is left beside the same calls made raw is the sampler's own
overhead. Per GPU, medians or means over many ticks:

- ``raw``: the stub calls the fast tick makes (the same list bench_tick.py times on a GPU);
- ``read_fast``: the NVML layer making them (``NvmlGpu.read_fast()``, this thread);
- ``daemon``: the real path, ``Sampler.start()`` at ``--interval``: the CPU each GPU's
  worker thread spends per read (wake-up, reads, building the sample) plus the loop
  thread's CPU per tick divided by the GPUs (gather, Snapshot, store.publish), read from
  each thread's own CPU clock; and the whole process's CPU per tick per GPU (XID and slow
  threads included);
- ``tick()``: the synchronous tick tests and benchmarks call, which hands each worker
  its read and waits for it (a hand-off the daemon loop does not make).

``overhead`` is the daemon path's CPU minus the raw calls' CPU. ``--profile`` adds
cProfile of one worker's read and of the loop's tick, run on this thread.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_tick import NullHost, median_us, raw_calls, wall_and_cpu_us  # noqa: E402

from gpuwatch.sampler import Sampler  # noqa: E402
from gpuwatch.store import Store  # noqa: E402
from tests.nvml_stub import NvmlStub, StubGpu  # noqa: E402

GiB = 2**30


def make_stub(gpus: int) -> NvmlStub:
    # one process per GPU, as on a training node: its name lookup is part of the tick
    me = os.getpid()
    return NvmlStub([StubGpu(i, processes=[(me, 2 * GiB)]) for i in range(gpus)])


def thread_cpu_ns(threads: list[threading.Thread]) -> dict[str, int]:
    out = {}
    for t in threads:
        if t.ident is None or not t.is_alive():
            continue
        try:
            out[t.name] = time.clock_gettime_ns(time.pthread_getcpuclockid(t.ident))
        except (OSError, AttributeError):  # not Linux, or the thread just left
            pass
    return out


def daemon_path(gpus: int, interval: float, seconds: float) -> dict[str, Any]:
    """The started Sampler: CPU per read per worker, per tick of the loop, per process."""
    sampler = Sampler(Store(), nvml_module=make_stub(gpus), interval=interval,
                      slow_interval=3600.0, host=NullHost())
    try:
        sampler.start()
        time.sleep(max(3 * interval, 0.5))  # past the first ticks (GPM pairs, name lookups)
        threads = list(threading.enumerate())
        workers = [t.name for t in threads
                   if t.name.startswith("gpuwatch-gpu") and not t.name.endswith("-slow")]
        fast = [w for w in getattr(sampler, "_fast", [])]
        reads0 = sum(getattr(w, "reads", 0) for w in fast)
        read_ns0 = sum(getattr(w, "read_ns", 0) for w in fast)
        ticks0 = sampler.store.latest().health.ticks_total
        cpu0, p0 = thread_cpu_ns(threads), time.process_time_ns()
        time.sleep(seconds)
        cpu1, p1 = thread_cpu_ns(threads), time.process_time_ns()
        ticks = sampler.store.latest().health.ticks_total - ticks0
        reads = sum(getattr(w, "reads", 0) for w in fast) - reads0
        read_ns = sum(getattr(w, "read_ns", 0) for w in fast) - read_ns0
        errors = dict(sampler.store.latest().health.errors_total)
    finally:
        sampler.stop()
    ticks = max(ticks, 1)
    worker_cpu = sum(cpu1[n] - cpu0[n] for n in workers if n in cpu0 and n in cpu1)
    loop_cpu = cpu1.get("gpuwatch-sampler", 0) - cpu0.get("gpuwatch-sampler", 0)
    out = {
        "ticks": ticks,
        # the old design handed one read per tick per GPU: then reads = ticks * GPUs
        "worker_cpu_per_read_us": worker_cpu / max(reads or ticks * gpus, 1) / 1000.0,
        "loop_cpu_per_tick_us": loop_cpu / ticks / 1000.0,
        "process_cpu_per_tick_per_gpu_us": (p1 - p0) / ticks / gpus / 1000.0,
        "process_cpu_percent": 100.0 * (p1 - p0) / 1e9 / seconds,
        "errors": errors,
    }
    out["daemon_cpu_per_gpu_us"] = (out["worker_cpu_per_read_us"]
                                    + out["loop_cpu_per_tick_us"] / gpus)
    out["worker_wall_per_read_us"] = read_ns / reads / 1000.0 if reads else None
    return out


def measure(gpus: int, interval: float, seconds: float, reps: int) -> dict[str, Any]:
    stub = make_stub(gpus)
    stub.nvmlInit()
    cheap, gpm, names = raw_calls(stub, stub.gpus[0])

    def raw() -> None:
        cheap()
        if gpm:
            gpm()

    row: dict[str, Any] = {"gpus": gpus, "raw_calls": names}
    row["raw_us"], row["raw_cpu_us"] = wall_and_cpu_us(raw, reps)

    sampler = Sampler(Store(), nvml_module=make_stub(gpus), interval=1.0,
                      slow_interval=3600.0, host=NullHost())
    try:
        gpu = sampler._nvml.gpus[0]
        row["read_fast_us"] = median_us(gpu.read_fast, reps)
        wall, cpu = wall_and_cpu_us(sampler.tick, reps)
        row["tick_per_gpu_us"], row["tick_per_gpu_cpu_us"] = wall / gpus, cpu / gpus
    finally:
        sampler.stop()
    row["daemon"] = daemon_path(gpus, interval, seconds)
    row["overhead_cpu_us"] = row["daemon"]["daemon_cpu_per_gpu_us"] - row["raw_cpu_us"]
    return row


def profile(gpus: int, reps: int) -> None:
    """cProfile what a worker does per read and what the loop does per tick, here."""
    sampler = Sampler(Store(), nvml_module=make_stub(gpus), interval=1.0,
                      slow_interval=3600.0, host=NullHost())
    try:
        sampler.tick()
        worker = sampler._fast[0]
        read = getattr(worker, "_read", None)
        if read is not None:
            pr = cProfile.Profile()
            pr.runcall(lambda: [read(time.time()) for _ in range(reps)])
            print(f"\n### one worker's read x {reps}")
            pstats.Stats(pr).sort_stats("tottime").print_stats(15)
        tick_slot = getattr(sampler, "_tick_slot", None)
        if tick_slot is not None:
            # the loop's tick over samples the workers already left in their slots
            def ticks() -> None:
                for slot in range(1, reps + 1):
                    t = sampler._slot_time(slot)
                    for w in sampler._fast:
                        w.slot = (slot, w._read(t), 0)
                    tick_slot(slot)
            pr = cProfile.Profile()
            pr.runcall(ticks)
            print(f"\n### the loop's tick x {reps} ({gpus} GPUs, reads included)")
            pstats.Stats(pr).sort_stats("tottime").print_stats(15)
    finally:
        sampler.stop()


def fmt(us: float | None) -> str:
    return "-" if us is None else f"{us:.1f} µs"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, action="append", help="GPU count (repeatable)")
    ap.add_argument("--interval", type=float, default=0.1, help="the daemon path's interval")
    ap.add_argument("--seconds", type=float, default=5.0, help="how long to run it")
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--profile", action="store_true", help="also cProfile a read and a tick")
    args = ap.parse_args(argv)
    rows = [measure(n, args.interval, args.seconds, args.reps) for n in args.gpus or [1, 8]]
    print("| per GPU, on the stub | " + " | ".join(f"{r['gpus']} GPU" for r in rows) + " |")
    print("| --- |" + " --- |" * len(rows))
    lines = [
        ("raw stub calls the tick makes, CPU", lambda r: r["raw_cpu_us"]),
        ("NvmlGpu.read_fast(), wall", lambda r: r["read_fast_us"]),
        ("daemon: worker CPU per read", lambda r: r["daemon"]["worker_cpu_per_read_us"]),
        ("daemon: worker wall per read", lambda r: r["daemon"]["worker_wall_per_read_us"]),
        ("daemon: loop CPU per tick / GPUs",
         lambda r: r["daemon"]["loop_cpu_per_tick_us"] / r["gpus"]),
        ("**daemon: CPU per GPU (worker + loop)**", lambda r: r["daemon"]["daemon_cpu_per_gpu_us"]),
        ("**overhead: daemon CPU - raw CPU**", lambda r: r["overhead_cpu_us"]),
        ("daemon: whole process CPU per tick / GPUs",
         lambda r: r["daemon"]["process_cpu_per_tick_per_gpu_us"]),
        ("Sampler.tick() (synchronous), wall", lambda r: r["tick_per_gpu_us"]),
        ("Sampler.tick() (synchronous), CPU", lambda r: r["tick_per_gpu_cpu_us"]),
    ]
    for label, get in lines:
        print(f"| {label} | " + " | ".join(fmt(get(r)) for r in rows) + " |")
    for r in rows:
        d = r["daemon"]
        print(f"\n{r['gpus']} GPU: {d['ticks']} ticks at --interval {args.interval}, process "
              f"{d['process_cpu_percent']:.2f} % of a core, errors {d['errors'] or 'none'}")
    if args.profile:
        for n in args.gpus or [8]:
            profile(n, args.reps)
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "profile"
    sys.exit(main())
