#!/usr/bin/env python3
"""What the sampler costs beside the NVML calls it makes, on the stub (no GPU needed).

    python3 benchmarks/profile_tick.py             # 1 and 8 GPUs
    python3 benchmarks/profile_tick.py --gpus 8 --profile

Over ``tests/nvml_stub.py`` an NVML call costs a few microseconds of Python, not a trip
to the driver, so what is left beside the same calls made raw is the sampler's own
overhead. Per GPU, with the functions bench_tick.py uses on a GPU:

- ``raw``: the stub calls the fast tick makes (the list bench_tick.py times on a GPU),
  back to back ("hot") and once per interval on a thread of their own ("at the cadence");
- ``read_fast``: the NVML layer making them (``NvmlGpu.read_fast()``, this thread);
- the **daemon path**: what ``Sampler.start()`` runs per tick, the reader reading each GPU
  and building its sample plus the loop's tick divided by the GPUs; hot (back to back on
  this thread), and at the cadence (the started sampler, each thread's CPU clock: wake-ups
  and cold caches included, as in the daemon);
- ``tick()``: the synchronous tick tests call, which hands the reader a request and waits
  for the answers (a hand-off the daemon loop does not make).

``overhead`` is the daemon path's CPU minus the raw calls' CPU, like for like. On a VM a
thread's wake-up alone can cost tens of microseconds of CPU and a read after 100 ms idle
several times a hot one: compare rows of one run, not runs. ``--profile`` adds cProfile of
one worker's read and of the loop's tick, run on this thread.
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

from bench_tick import (
    NullHost,
    daemon_path_at_cadence,
    daemon_path_hot,
    median_us,
    raw_at_cadence,
    raw_calls,
    wall_and_cpu_us,
)

from gpuwatch.collect.sampler import Sampler
from gpuwatch.store import Store
from tests.nvml_stub import NvmlStub, StubGpu

GiB = 2**30


def make_stub(gpus: int) -> NvmlStub:
    # one process per GPU, as on a training node: its name lookup is part of the tick
    me = os.getpid()
    return NvmlStub([StubGpu(i, processes=[(me, 2 * GiB)]) for i in range(gpus)])


def measure(gpus: int, interval: float, seconds: float, reps: int,
            rounds: int = 5) -> dict[str, Any]:
    stub = make_stub(gpus)
    stub.nvmlInit()
    raws = []
    for h in stub.gpus:
        cheap, gpm, _names = raw_calls(stub, h)
        raws.append(lambda cheap=cheap, gpm=gpm: (cheap(), gpm and gpm()))
    row: dict[str, Any] = {"gpus": gpus}
    sampler = Sampler(Store(), nvml_module=make_stub(gpus), interval=1.0,
                      slow_interval=3600.0, host=NullHost())
    # rounds interleaved, the best of each kept: a noisy neighbour or a clock change
    # then hits every row alike instead of one
    best: dict[str, float] = {}

    def keep(name: str, value: float) -> None:
        best[name] = min(best.get(name, value), value)

    try:
        sampler.tick()
        for _ in range(rounds):
            wall, cpu = wall_and_cpu_us(raws[0], reps)
            keep("raw_us", wall)
            keep("raw_cpu_us", cpu)
            keep("read_fast_us", median_us(sampler._nvml.gpus[0].read_fast, reps))
            wall, cpu = wall_and_cpu_us(sampler.tick, reps)
            keep("tick_per_gpu_us", wall / gpus)
            keep("tick_per_gpu_cpu_us", cpu / gpus)
            if hasattr(sampler, "_tick_slot"):  # the daemon path as this design runs it
                hot = daemon_path_hot(sampler, reps)
                keep("hot_us", statistics.fmean(hot["per_gpu_us"]))
                keep("hot_cpu_us", statistics.fmean(hot["per_gpu_cpu_us"]))
                keep("hot_loop_per_gpu_cpu_us", hot["loop_tick_cpu_us"] / gpus)
            else:  # the design before: the loop called tick() itself
                keep("hot_us", best["tick_per_gpu_us"])
                keep("hot_cpu_us", best["tick_per_gpu_cpu_us"])
    finally:
        sampler.stop()
    row.update(best)
    row["raw_cadence"] = raw_at_cadence(raws, interval, seconds)
    row["cadence"] = daemon_path_at_cadence(
        Sampler(Store(), nvml_module=make_stub(gpus), interval=interval, slow_interval=3600.0,
                host=NullHost()), seconds)
    return row


def profile(gpus: int, reps: int) -> None:
    """cProfile what the reader does per GPU read and what the loop does per tick, here."""
    sampler = Sampler(Store(), nvml_module=make_stub(gpus), interval=1.0,
                      slow_interval=3600.0, host=NullHost())
    try:
        sampler.tick()
        worker = sampler._fast[0]
        read = getattr(worker, "_read", None)
        if read is not None:
            pr = cProfile.Profile()
            pr.runcall(lambda: [read(time.time()) for _ in range(reps)])
            print(f"\n### one GPU's read x {reps}")
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
    ap.add_argument("--reps", type=int, default=1000, help="repetitions per round")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds, best kept")
    ap.add_argument("--profile", action="store_true", help="also cProfile a read and a tick")
    args = ap.parse_args(argv)
    rows = [measure(n, args.interval, args.seconds, args.reps, args.rounds)
            for n in args.gpus or [1, 8]]
    print("| per GPU, on the stub | " + " | ".join(f"{r['gpus']} GPU" for r in rows) + " |")
    print("| --- |" + " --- |" * len(rows))
    lines = [
        ("raw stub calls the tick makes, hot, CPU", lambda r: r["raw_cpu_us"]),
        ("NvmlGpu.read_fast(), hot, wall", lambda r: r["read_fast_us"]),
        ("daemon path, hot, CPU (read + loop tick / GPUs)", lambda r: r["hot_cpu_us"]),
        ("of which the loop tick / GPUs", lambda r: r.get("hot_loop_per_gpu_cpu_us")),
        ("**overhead, hot: daemon path - raw (CPU)**",
         lambda r: r["hot_cpu_us"] - r["raw_cpu_us"]),
        ("raw stub calls at the cadence, CPU", lambda r: r["raw_cadence"]["cpu_us"]),
        ("the same with their thread's wake-up / GPUs",
         lambda r: r["raw_cadence"]["cpu_with_wake_us"]),
        ("daemon at the cadence: worker CPU per read",
         lambda r: r["cadence"]["worker_cpu_per_read_us"]),
        ("daemon at the cadence: loop CPU per tick / GPUs",
         lambda r: r["cadence"]["loop_cpu_per_tick_us"] / r["gpus"]),
        ("**overhead at the cadence: daemon path - raw (CPU)**",
         lambda r: r["cadence"]["per_gpu_cpu_us"] - r["raw_cadence"]["cpu_us"]),
        ("daemon at the cadence: whole process CPU per tick / GPUs",
         lambda r: r["cadence"]["process_cpu_per_tick_per_gpu_us"]),
        ("Sampler.tick() (synchronous), wall", lambda r: r["tick_per_gpu_us"]),
        ("Sampler.tick() (synchronous), CPU", lambda r: r["tick_per_gpu_cpu_us"]),
    ]
    for label, get in lines:
        print(f"| {label} | " + " | ".join(fmt(get(r)) for r in rows) + " |")
    for r in rows:
        c = r["cadence"]
        print(f"\n{r['gpus']} GPU: {c['ticks']} ticks at --interval {args.interval}, "
              f"errors {c['errors'] or 'none'}")
    if args.profile:
        for n in args.gpus or [8]:
            profile(n, args.reps)
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "profile"
    sys.exit(main())
