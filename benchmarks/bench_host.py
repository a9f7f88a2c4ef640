#!/usr/bin/env python3
"""What the host sampler costs per tick, and what reading each job root's writes adds.

    python3 benchmarks/bench_host.py                       # 1 job tree of 4 workers
    python3 benchmarks/bench_host.py --jobs 8 --workers 6  # 8 ranks' trees
    python3 benchmarks/bench_host.py --walk --jobs 2 --workers 8 --threads 10
    python3 benchmarks/bench_host.py --host-fields --cores 128

``--walk``: the tree's walk three ways in alternating rounds: as it was before issue #13's
host work (every thread's children file each tick, each process through psutil), with the
threads' files read as shipped (the main thread and threads seen forking each tick, every
thread each ``THREAD_RESCAN_S``) but psutil per process, and as shipped (one
``/proc/PID/stat`` read per process). The sampler's clock moves ``--interval`` a tick, so
the full thread reads come as often as in a daemon at that cadence. ``--threads``: each
process of the trees holds that many more threads, sleeping (a training process and its
DataLoader workers hold dozens: torch's pools, CUDA's, the pin-memory thread).

``--host-fields``: the host-wide part of a tick alone (each core's CPU times, memory and
swap), psutil's calls (``cpu_times(percpu=True)``, ``virtual_memory()``, ``swap_memory()``)
against the sampler's own reads of ``/proc/stat`` and ``/proc/meminfo``, in alternating
rounds: on this machine's /proc, and on a copy of it whose ``stat`` lists ``--cores`` cores
(a GPU node's count; a file read from disk costs less than the kernel's making of
/proc/stat, so that row compares the parsing).

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
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuwatch.collect import host as host_mod  # noqa: E402

# each process holds argv[2] more threads, sleeping
THREADS = ("import threading, time\n"
           "for _ in range({n}):\n"
           "    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n")
CHILD = ("import subprocess, sys, time\n"
         "threads = " + repr(THREADS) + ".format(n=int(sys.argv[2]))\n"
         "kids = [subprocess.Popen([sys.executable, '-c', threads + 'time.sleep(600)'])\n"
         "        for _ in range(int(sys.argv[1]))]\n"
         "exec(threads)\n"
         "print('ready', flush=True)\n"
         "time.sleep(600)\n")


def _tick_cpu(sampler: host_mod.HostSampler, roots: dict[int, tuple[int, ...]],
              ticks: int) -> float:
    t0 = time.process_time()
    for _ in range(ticks):
        sampler.sample(time.time(), roots, list(roots))
    return (time.process_time() - t0) / ticks


def _walk_cpu(sampler: host_mod.HostSampler, roots: dict[int, tuple[int, ...]],
              ticks: int, clock: list[float], interval: float) -> float:
    """CPU per tick, the sampler's clock (the threads' re-reads) moving ``interval`` a tick."""
    t0 = time.process_time()
    for _ in range(ticks):
        clock[0] += interval
        sampler.sample(time.time(), roots, list(roots))
    return (time.process_time() - t0) / ticks


def walk(roots: dict[int, tuple[int, ...]], args: argparse.Namespace) -> None:
    clocks: dict[str, list[float]] = {}
    samplers: dict[str, host_mod.HostSampler] = {}
    for name, rescan, stat in (("before", 0.0, False), ("threads", None, False),
                               ("shipped", None, True)):
        s = host_mod.HostSampler()
        clock = clocks[name] = [0.0]
        s._clock = lambda clock=clock: clock[0]  # type: ignore[method-assign]
        if rescan is not None:
            s.thread_rescan_s = rescan
        s.read_stat = s.read_stat and stat
        s.sample(time.time(), roots, list(roots))
        samplers[name] = s
    got: dict[str, list[float]] = {k: [] for k in samplers}
    for r in range(args.rounds):
        order = list(samplers.items())
        for name, s in order if r % 2 == 0 else reversed(order):
            got[name].append(_walk_cpu(s, roots, args.ticks, clocks[name], args.interval))
    trees = {k: s.sample(time.time(), roots, list(roots)).jobs for k, s in samplers.items()}
    for jobs in trees.values():
        assert len(jobs) == args.jobs and all(j.processes == args.workers + 1 for j in jobs)
    med = {k: statistics.median(v) * 1e6 for k, v in got.items()}
    print(f"## bench_host --walk: {platform.node()}, {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}; {args.jobs} job tree(s) of {args.workers} workers, "
          f"{args.threads} more threads a process, {args.rounds} alternating rounds of "
          f"{args.ticks} ticks, the clock {args.interval:g} s a tick")
    print("| the walk | CPU per tick (median of rounds) | before / this |")
    print("| --- | --- | --- |")
    for name, what in (("before", "before: every thread's children, psutil per process"),
                       ("threads", "the threads' files as shipped, psutil per process"),
                       ("shipped", "as shipped: and one /proc/PID/stat read per process")):
        print(f"| {what} | {med[name]:.0f} µs | {med['before'] / med[name]:.2f}× |")


def _per_call(fn: object, calls: int) -> float:
    t0 = time.process_time()
    for _ in range(calls):
        fn()  # type: ignore[operator]
    return (time.process_time() - t0) / calls


def _fake_proc(cores: int) -> str:
    """A copy of /proc's stat (its cores' lines made ``cores`` long), meminfo, vmstat."""
    d = tempfile.mkdtemp(prefix="bench-procfs-")
    lines = Path("/proc/stat").read_text().splitlines()
    first_core = next(line for line in lines[1:] if line.startswith("cpu"))
    rest = [line for line in lines[1:] if not line.startswith("cpu")]
    values = first_core.split()[1:]
    body = [lines[0]] + [f"cpu{i} " + " ".join(values) for i in range(cores)] + rest
    Path(d, "stat").write_text("\n".join(body) + "\n")
    for name in ("meminfo", "vmstat"):
        shutil.copy(f"/proc/{name}", Path(d, name))
    return d


def host_fields(args: argparse.Namespace) -> None:
    import psutil

    def with_psutil() -> object:
        cpus = [host_mod._busy_and_total(c) for c in psutil.cpu_times(percpu=True)]
        vm, swap = psutil.virtual_memory(), psutil.swap_memory()
        return cpus, vm.total - vm.available, swap.used

    def own() -> object:
        return host_mod.read_proc_stat_cpus(), host_mod.read_meminfo()

    print(f"## bench_host --host-fields: {platform.node()}, {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}, psutil {psutil.__version__}; {args.rounds} alternating "
          f"rounds of {args.ticks * 10} calls")
    print("| procfs | cores | psutil's calls | the sampler's reads | ratio |")
    print("| --- | --- | --- | --- | --- |")
    fake = _fake_proc(args.cores)
    try:
        for where, path in (("this machine's /proc", "/proc"), ("a copy, on disk", fake)):
            psutil.PROCFS_PATH = path
            cores = len(host_mod.read_proc_stat_cpus() or ())
            assert cores == len(psutil.cpu_times(percpu=True))
            got: dict[str, list[float]] = {"psutil": [], "own": []}
            for r in range(args.rounds):
                order = (("psutil", with_psutil), ("own", own))
                for name, fn in order if r % 2 == 0 else reversed(order):
                    got[name].append(_per_call(fn, args.ticks * 10))
            med = {k: statistics.median(v) * 1e6 for k, v in got.items()}
            print(f"| {where} | {cores} | {med['psutil']:.1f} µs | {med['own']:.1f} µs | "
                  f"{med['psutil'] / med['own']:.2f}× |")
    finally:
        psutil.PROCFS_PATH = "/proc"
        shutil.rmtree(fake, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1, help="job trees (one per GPU main process)")
    ap.add_argument("--workers", type=int, default=4, help="children in each tree")
    ap.add_argument("--ticks", type=int, default=200, help="ticks per round")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--host-fields", action="store_true",
                    help="time the host-wide reads alone: psutil's against the sampler's")
    ap.add_argument("--threads", type=int, default=0,
                    help="more threads (sleeping) in each process of the trees")
    ap.add_argument("--walk", action="store_true",
                    help="time the tree's walk as before issue #13's host work, in part, "
                         "and as shipped")
    ap.add_argument("--interval", type=float, default=1.0,
                    help="with --walk: seconds the sampler's clock moves a tick")
    ap.add_argument("--cores", type=int, default=128,
                    help="with --host-fields: cores in the copied /proc/stat")
    args = ap.parse_args()
    if args.host_fields:
        host_fields(args)
        return
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(args.workers),
                               str(args.threads)], stdout=subprocess.PIPE, text=True)
             for _ in range(args.jobs)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        roots = {p.pid: (g,) for g, p in enumerate(procs)}
        if args.walk:
            walk(roots, args)
            return
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
