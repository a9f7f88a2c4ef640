#!/usr/bin/env python3
"""What the host sampler costs per tick, and what reading each job root's writes adds.

    python3 benchmarks/bench_host.py                       # 1 job tree of 4 workers
    python3 benchmarks/bench_host.py --jobs 8 --workers 6  # 8 ranks' trees

Starts ``--jobs`` sleeping processes, each with ``--workers`` sleeping children (a GPU main
process and its DataLoader workers, as the sampler sees them), then times
``HostSampler.sample`` over them: the CPU of one tick (host CPU, memory, load, every tree's
processes), in rounds that alternate between the sampler as it is and the same sampler with
the per-root ``/proc/PID/io`` read (``_write_rate``) stubbed out, so both see the same
machine. Prints the median CPU per tick of each and their ratio (no GPU needed).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuwatch.collect import host as host_mod  # noqa: E402

CHILD = ("import subprocess, sys, time\n"
         "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
         "        for _ in range(int(sys.argv[1]))]\n"
         "print('ready', flush=True)\n"
         "time.sleep(600)\n")


def _tick_cpu(sampler: host_mod.HostSampler, roots: dict[int, tuple[int, ...]],
              ticks: int) -> float:
    t0 = time.process_time()
    for _ in range(ticks):
        sampler.sample(time.time(), roots, list(roots))
    return (time.process_time() - t0) / ticks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1, help="job trees (one per GPU main process)")
    ap.add_argument("--workers", type=int, default=4, help="children in each tree")
    ap.add_argument("--ticks", type=int, default=200, help="ticks per round")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(args.workers)],
                              stdout=subprocess.PIPE, text=True)
             for _ in range(args.jobs)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        roots = {p.pid: (g,) for g, p in enumerate(procs)}
        with_io = host_mod.HostSampler()
        without = host_mod.HostSampler()
        without._write_rate = lambda tracked: None  # type: ignore[method-assign]
        for s in (with_io, without):
            s.sample(time.time(), roots, list(roots))
        got: dict[str, list[float]] = {"with": [], "without": []}
        for r in range(args.rounds):
            order = (("with", with_io), ("without", without))
            for name, s in order if r % 2 == 0 else reversed(order):
                got[name].append(_tick_cpu(s, roots, args.ticks))
        tree = with_io.sample(time.time(), roots, list(roots)).jobs
        assert len(tree) == args.jobs and all(j.processes == args.workers + 1 for j in tree)
    finally:
        for p in procs:
            subprocess.run(["pkill", "-P", str(p.pid)], check=False)
            p.kill()
            p.wait()
    med = {k: statistics.median(v) * 1e6 for k, v in got.items()}
    print(f"## bench_host: {platform.node()}, {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}; {args.jobs} job tree(s) of {args.workers} workers, "
          f"{args.rounds} alternating rounds of {args.ticks} ticks")
    print("| sampler | CPU per tick (median of rounds) |")
    print("| --- | --- |")
    print(f"| without the write-rate read | {med['without']:.0f} µs |")
    print(f"| as shipped (one /proc/PID/io read per job root) | {med['with']:.0f} µs |")
    print(f"| ratio | {med['with'] / med['without']:.3f}× "
          f"(+{(med['with'] - med['without']) / args.jobs:.0f} µs per job root) |")


if __name__ == "__main__":
    main()
