"""The host layer: host CPU, memory, swap and load, and the process trees of GPU jobs (psutil).

It runs every tick beside a training job, so it is built to be cheap:

- Host CPU utilisation comes from deltas of each core's times between two calls (what
  ``psutil.cpu_percent(interval=None)`` does), kept per ``HostSampler`` so two samplers in
  one process do not steal each other's deltas. Nothing ever sleeps. On Linux the cores'
  times and the memory and swap figures are read straight from ``/proc/stat`` and
  ``/proc/meminfo``, one read each (psutil's calls build a named tuple per core and read
  ``/proc/meminfo`` twice and ``/proc/vmstat``); elsewhere psutil's calls.
- Per-process CPU needs deltas too: ``psutil.Process`` objects are kept between calls,
  keyed by PID and checked against their creation time (``is_running()``), so a reused PID
  starts over instead of inheriting a dead process's counters. A process seen for the first
  time reports what it used since it was born if that was after the last tick (a
  DataLoader worker that ``persistent_workers=False`` restarts every epoch may live only a
  tick or two: it would otherwise never be counted), else 0.0 cores. Such a process,
  once torch has named it a DataLoader worker, counts once as a worker started
  (``loader_workers_started``): a pool started again and again is a DataLoader whose
  ``persistent_workers=False`` restarts it every epoch.
- Descendants are found from ``/proc/PID/task/TID/children`` where the kernel offers it
  (no scan of the process table); elsewhere one scan per tick builds a parent map that all
  trees share (``children(recursive=True)`` would scan once per tree). A child is listed
  under the thread that forked it, and a training process has dozens of threads (torch's
  pools, CUDA's, the pin-memory thread): reading every thread's file every tick cost more
  than all the rest of a tree (6 ms a tick for a rank with 8 workers and 100 threads on
  the development VM). So each tick reads the files of the main thread (where
  ``iter(DataLoader)`` forks its workers) and of any thread seen with children before; all
  of a process's threads are read when it is first seen, and again every
  ``THREAD_RESCAN_S`` (and at once when a known thread has gone), so a child of a thread
  that never forked before is found within that time; born since the full read before,
  it is new all the same (a worker that counts as started).
- Each process in a tree costs one read of ``/proc/PID/stat`` a tick on Linux (its state,
  CPU times, start time, RSS and name: psutil's calls for these read ``stat`` and ``statm``
  and check the start time again, about 5x the CPU); its start time tells it from a later
  process that got its PID. Elsewhere psutil's calls.

Grouping GPU processes into jobs, so that each GPU's CPU is its own rank's: the main
process of a GPU (the one NVML lists there holding the most of its memory: the rank) is
always the root of a job tree, with its own descendants (its DataLoader workers). Any other
process using a GPU is a root too unless one of its ancestors uses a GPU, in which case it
is part of that ancestor's tree (a training process and a worker that touched CUDA are one
job, counted once). A tree stops where another root's begins: a launcher that holds a CUDA
context itself (``mp.spawn`` from a parent that touched the GPU, an ``accelerate`` or
``deepspeed`` launcher that did) is a job of its own, not the "main process" of all its
ranks with every rank and worker counted as its workers. ``torchrun``'s launcher uses no
GPU: each rank is a root, as before. Each tree carries the GPUs its root is listed on.

Which roots are ranks of one job: a distributed launcher (torchrun, accelerate, deepspeed)
gives each rank ``RANK``, ``WORLD_SIZE`` and the launch's rendezvous (``MASTER_ADDR``,
``MASTER_PORT``, torchrun's ``TORCHELASTIC_RUN_ID``) in its environment. A root's
``/proc/PID/environ`` is read once in its life, only those keys are kept, and the
rendezvous only as a digest (``dist_job``), so that the advisor can tell, without the
hook, that a rank's GPU waits for a slower peer. The same read notes which of a few
debugging switches the environment turns on (``DEBUG_ENV``: ``CUDA_LAUNCH_BLOCKING=1``,
``PYTORCH_NO_CUDA_MEMORY_CACHING=1``, ``TORCH_DISTRIBUTED_DEBUG=DETAIL``), by name only
(``debug_env``), so that the advisor can say, without the hook, that every step pays for
one. The file is readable only by the process's own user (or root): another user's job
simply has no rank, and no switches, here.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import psutil

from gpuwatch import logs
from gpuwatch.samples import HostSample, JobTree

log = logging.getLogger(__name__)

# seconds between reads of every thread's children file of a process in a job tree
THREAD_RESCAN_S = 10.0

# what torch (2.5 and newer) names each DataLoader worker process (its comm, as ps shows)
LOADER_WORKER_NAME = "pt_data_worker"
_LOADER_COMM = LOADER_WORKER_NAME.encode()

_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, ProcessLookupError,
         PermissionError, FileNotFoundError)


@dataclass
class _Tracked:
    """One process followed across ticks (its psutil object keeps the CPU-time deltas)."""

    proc: psutil.Process
    name: str | None
    user: str | None
    seen: int  # the tick it was last used in
    fresh: bool = True  # no CPU reading yet (psutil's first cpu_percent is meaningless)
    dist: tuple[int | None, int | None, str | None] | None = None  # read_dist, once
    debug: tuple[str, ...] | None = None  # parse_debug of the same read (None: unreadable)
    # /proc/PID/io write_bytes at the last reading, and when (seconds since boot); None
    # until read. io_denied: it cannot be read (another user's process, no such file)
    written: int | None = None
    written_t: float | None = None
    io_denied: bool = False
    # new when first seen (born since the tick before, or found late and born since its
    # parent's threads were all read before: _since_birth), and not yet counted as a
    # DataLoader worker's start (a spawned worker is named only once its interpreter has
    # started)
    newborn: bool = False
    # of a job's root: the DataLoader workers started in its tree since it was first seen
    started_total: int = 0
    # from /proc/PID/stat (read_pid_stat), where it can be read: the start time that tells
    # this process from a later one with its PID, the CPU ticks at the last reading and
    # when (seconds since boot), and the newest reading (by _track, once a tick; _usage
    # takes this tick's from it)
    start: int | None = None
    cpu_ticks: int | None = None
    cpu_t: float | None = None
    stat: tuple[bytes, bytes, int, int, int] | None = None


_DIST_KEYS = (b"RANK", b"WORLD_SIZE", b"TORCHELASTIC_RUN_ID", b"MASTER_ADDR", b"MASTER_PORT",
              b"LOCAL_RANK", b"NODE_RANK")
_RENDEZVOUS = (b"TORCHELASTIC_RUN_ID", b"MASTER_ADDR", b"MASTER_PORT")


def parse_dist(environ: bytes) -> tuple[int | None, int | None, str | None]:
    """(rank, world size, launch digest) from a NUL-separated environment block; each None
    where it is missing or not what a launcher writes."""
    env: dict[bytes, bytes] = {}
    for item in environ.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq and key in _DIST_KEYS:
            env[key] = value

    def count(key: bytes) -> int | None:
        v = env.get(key, b"")
        return int(v) if v.isdigit() and len(v) < 10 else None

    rank, world = count(b"RANK"), count(b"WORLD_SIZE")
    if rank is None and count(b"NODE_RANK") in (None, 0):
        # Lightning's DDP launcher gives the ranks it starts LOCAL_RANK, NODE_RANK and
        # WORLD_SIZE but no RANK: on the first node (or one alone) the two are the same
        rank = count(b"LOCAL_RANK")
    if world is None or world < 1 or rank is None or rank >= world:
        return None, None, None
    ident = b"|".join(env.get(k, b"") for k in _RENDEZVOUS)
    if not ident.strip(b"|"):
        return rank, world, None  # ranks it cannot tie to one launch: no group
    return rank, world, hashlib.blake2s(ident, digest_size=6).hexdigest()


def _launching_rank(jobs: list[JobTree], whole: dict[int, list[int]]) -> list[JobTree]:
    """Rank 0 of a launch whose ranks it started itself (Lightning's DDP re-runs its
    script for ranks 1..N-1, their environment naming the launch; its own environment,
    read as it started, names none): a GPU's main process with no rank of its own, whose
    tree holds other GPUs' mains that all name one launch, ranks 1 and up, none of them
    rank 0, is that launch's rank 0."""
    by_pid = {j.pid: j for j in jobs}
    out = []
    for job in jobs:
        if job.rank is None and len(job.gpus) == 1:
            inner = [by_pid[p] for p in whole.get(job.pid, ()) if p in by_pid]
            launches = {(k.world_size, k.dist_job) for k in inner}
            if inner and len(launches) == 1:
                ((world, launch),) = launches
                ranks = {k.rank for k in inner}
                if (launch is not None and world is not None and None not in ranks
                        and 0 not in ranks and len(ranks) == len(inner) < world):
                    job = replace(job, rank=0, world_size=world, dist_job=launch)
        out.append(job)
    return out


# debugging switches a job's environment can turn on, each costing every step something,
# and the value that turns it on as the library reading it parses it (no other is kept, and
# of the environment nothing else: the name stands for "set to that value"):
# - CUDA_LAUNCH_BLOCKING: the CUDA runtime's "1" makes every kernel launch wait for it;
# - PYTORCH_NO_CUDA_MEMORY_CACHING: torch's allocator reads it as a 0/1 flag
#   (c10::utils::check_env); on, every tensor's memory is a cudaMalloc and a cudaFree;
# - TORCH_DISTRIBUTED_DEBUG: c10d's level, read without regard to case; DETAIL checks
#   every collective against the other ranks' before it runs (INFO only logs).
DEBUG_ENV = {b"CUDA_LAUNCH_BLOCKING": b"1", b"PYTORCH_NO_CUDA_MEMORY_CACHING": b"1",
             b"TORCH_DISTRIBUTED_DEBUG": b"DETAIL"}


def parse_debug(environ: bytes) -> tuple[str, ...]:
    """The names in ``DEBUG_ENV`` that a NUL-separated environment block sets to the value
    that turns them on, in DEBUG_ENV's order."""
    on = set()
    for item in environ.split(b"\0"):
        key, eq, value = item.partition(b"=")
        want = DEBUG_ENV.get(key) if eq else None
        if want is not None and value.strip().upper() == want:
            on.add(key)
    return tuple(k.decode() for k in DEBUG_ENV if k in on)


def _read_environ(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read(1 << 20)  # an environment is far smaller; never read without end
    except OSError:
        return None


def read_dist(pid: int) -> tuple[int | None, int | None, str | None]:
    """What ``pid``'s environment says of its distributed launch (parse_dist); all None
    where it cannot be read (another user's process, another OS, a process gone)."""
    block = _read_environ(pid)
    return (None, None, None) if block is None else parse_dist(block)


def read_debug(pid: int) -> tuple[str, ...] | None:
    """The debugging switches ``pid``'s environment turns on (parse_debug); None where it
    cannot be read."""
    block = _read_environ(pid)
    return None if block is None else parse_debug(block)


def _since_boot() -> float | None:
    """Seconds since boot, the clock of /proc's process start times (None off Linux)."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(clock) if clock is not None else None


def _sum_known(values: Iterable[float | None]) -> float | None:
    """The sum of the values that are known; None where none is."""
    known = [v for v in values if v is not None]
    return round(sum(known), 1) if known else None


def _procfs() -> str:
    return getattr(psutil, "PROCFS_PATH", "/proc")


try:
    _CLOCK_TICKS = float(os.sysconf("SC_CLK_TCK"))
except (AttributeError, ValueError, OSError):  # not a POSIX system: psutil's path is used
    _CLOCK_TICKS = 0.0


try:
    _PAGE_BYTES = int(os.sysconf("SC_PAGE_SIZE"))
except (AttributeError, ValueError, OSError):
    _PAGE_BYTES = 0


def read_pid_stat(pid: int) -> tuple[bytes, bytes, int, int, int] | None:
    """(comm, state, CPU clock ticks used (user + system), start time in clock ticks since
    boot, RSS in pages) of one process, from one read of ``/proc/PID/stat``: what the
    tree's walk takes from psutil's status, cpu_times, memory_info and name (which read
    ``stat`` and ``statm`` and check the start time on every call). None where the file
    cannot be read: the process is gone, or this is no Linux procfs."""
    try:
        with open(f"{_procfs()}/{pid}/stat", "rb") as f:
            data = f.read()
        # comm may hold spaces and parentheses: it runs from the first "(" to the last ")"
        head, _, rest = data.rpartition(b")")
        comm = head.partition(b"(")[2]
        fields = rest.split()
        # after comm: state is field 3; utime 14, stime 15, starttime 22, rss 24 (man 5 proc)
        return (comm, fields[0], int(fields[11]) + int(fields[12]), int(fields[19]),
                int(fields[21]))
    except (OSError, ValueError, IndexError):
        return None


def read_proc_stat_cpus() -> list[tuple[float, float]] | None:
    """Each core's (busy, total) seconds from ``/proc/stat`` in one read: what
    ``_busy_and_total`` makes of ``psutil.cpu_times(percpu=True)``, without a named tuple
    of ten floats per core (on a node of 100+ cores, most of the host's tick). None where
    the file is not Linux's (psutil is asked instead)."""
    if not _CLOCK_TICKS:
        return None
    try:
        with open(f"{_procfs()}/stat", "rb") as f:
            lines = f.read().split(b"\n")
    except OSError:
        return None
    out = []
    ticks = _CLOCK_TICKS
    try:
        for line in lines[1:]:  # the first line is every core's sum
            if line[:3] != b"cpu":
                if out:
                    break  # the cores' lines come together, first
                continue
            # user nice system idle iowait irq softirq steal [guest guest_nice]: guest
            # time is inside user and nice already; iowait is idle
            u = list(map(int, line.split()[1:9]))
            total = sum(u)
            out.append(((total - u[3] - u[4]) / ticks, total / ticks))
    except (ValueError, IndexError):  # not the layout above
        return None
    return out or None


_MEMINFO_KEYS = (b"MemTotal:", b"MemAvailable:", b"SwapTotal:", b"SwapFree:")


def read_meminfo() -> tuple[int, int, int, int] | None:
    """(memory total, available, swap total, swap free) in bytes from one read of
    ``/proc/meminfo``: psutil's virtual_memory and swap_memory read it twice, and the
    latter ``/proc/vmstat`` too (for swap-in and -out, which nothing here reads). None
    where a key is missing (a kernel before 3.14 has no MemAvailable: psutil estimates
    it) or the file is not there."""
    try:
        with open(f"{_procfs()}/meminfo", "rb") as f:
            data = f.read()
    except OSError:
        return None
    found: dict[bytes, int] = {}
    for line in data.split(b"\n"):
        key, _, rest = line.partition(b" ")
        if key in _MEMINFO_KEYS:
            try:
                found[key] = int(rest.split()[0]) * 1024
            except (IndexError, ValueError):
                return None
            if len(found) == 4:
                break
    if len(found) != 4:
        return None
    return (found[b"MemTotal:"], found[b"MemAvailable:"], found[b"SwapTotal:"],
            found[b"SwapFree:"])


def _busy_and_total(times: object) -> tuple[float, float]:
    # Linux counts guest time inside user/nice and iowait outside idle (as psutil and htop).
    total = sum(times)  # type: ignore[arg-type]
    total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    idle = getattr(times, "idle", 0.0) + getattr(times, "iowait", 0.0)
    return total - idle, total


def _started(tracked: _Tracked, loader: bool) -> bool:
    """Whether this reading counts a DataLoader worker's start: a newborn process torch
    has named a worker, counted once."""
    if loader and tracked.newborn:
        tracked.newborn = False
        return True
    return False


class HostSampler:
    """Samples the host and the process trees of the processes using a GPU."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tick = 0
        self._procs: dict[int, _Tracked] = {}
        self._last_cpu = self._read_cpu_times()
        # the last tick's and this one's time on the clock process start times are kept in
        # (seconds since boot): what "born since the last tick" means
        self._prev_t: float | None = None
        self._now: float | None = None
        self._proc_children = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
        # per process: the threads whose children files each tick reads (the main thread
        # and those seen with children), and when all of them were last read (monotonic,
        # and the tick's seconds since boot)
        self._forkers: dict[int, tuple[tuple[int, ...], float, float | None]] = {}
        # this tick: children found by a full read of their parent's threads, each with
        # when (seconds since boot) that parent's threads were all read before; a child
        # born since then could not have been seen earlier (its thread was not read)
        self._unseen_since: dict[int, float] = {}
        self._clock: Callable[[], float] = time.monotonic
        self.thread_rescan_s = THREAD_RESCAN_S
        # each process's tick from one read of /proc/PID/stat (Linux), else through psutil
        self.read_stat = bool(_CLOCK_TICKS and _PAGE_BYTES)

    # -- public ----------------------------------------------------------------------
    def sample(self, t: float, gpu_pids: Collection[int] | Mapping[int, Collection[int]],
               mains: Collection[int] = ()) -> HostSample:
        """One reading of the host at ``t``.

        ``gpu_pids``: the processes NVML saw on a GPU, or a mapping of each to the GPUs it
        was seen on; ``mains``: each GPU's main process (the one holding most of its
        memory), each the root of its own job tree wherever it sits in the process tree.
        """
        with self._lock:
            self._tick += 1
            self._prev_t, self._now = self._now, _since_boot()
            self._unseen_since.clear()
            per_core, total = self._cpu()
            load = self._call("load", psutil.getloadavg)
            mem = read_meminfo()
            if mem is not None:
                mem_total, mem_used = mem[0], mem[0] - mem[1]
                swap_total, swap_used = mem[2], mem[2] - mem[3]
            else:
                vm = self._call("memory", psutil.virtual_memory)
                swap = self._call("swap", psutil.swap_memory)
                mem_total, mem_used = (vm.total, vm.total - vm.available) if vm else (None,) * 2
                swap_total, swap_used = (swap.total, swap.used) if swap else (None,) * 2
            if isinstance(gpu_pids, Mapping):
                on_gpus = {int(p): tuple(sorted(g)) for p, g in gpu_pids.items()}
            else:
                on_gpus = {int(p): () for p in gpu_pids}
            jobs = self._jobs(on_gpus, set(mains)) if on_gpus else ()
            self._forget_unseen()
        sample = HostSample(
            t=t,
            cpu_util_per_core=per_core,
            cpu_util=total,
            load1=load[0] if load else None,
            load5=load[1] if load else None,
            load15=load[2] if load else None,
            # used = total - available: memory that can't be had back without swapping,
            # which is what pressure means (psutil's own `used` counts caches differently
            # from one kernel version to the next)
            mem_used_bytes=mem_used,
            mem_total_bytes=mem_total,
            swap_used_bytes=swap_used,
            swap_total_bytes=swap_total,
            jobs=jobs,
        )
        if not jobs:
            return sample
        return replace(
            sample,
            job_cpu_cores=round(sum(j.cpu_cores for j in jobs), 3),
            job_main_cpu_cores=round(sum(j.main_cpu_cores for j in jobs), 3),
            job_workers_cpu_cores=round(sum(j.workers_cpu_cores for j in jobs), 3),
            job_loader_workers=sum(j.loader_workers or 0 for j in jobs),
            job_loader_cpu_cores=round(sum(j.loader_cpu_cores or 0.0 for j in jobs), 3),
            job_write_bytes_per_second=_sum_known(j.main_write_bytes_per_second for j in jobs),
            job_loader_workers_started=sum(j.loader_workers_started or 0 for j in jobs),
            job_processes=sum(j.processes for j in jobs),
            job_rss_bytes=sum(j.rss_bytes for j in jobs),
        )

    def process_identity(self, pid: int) -> tuple[str | None, str | None]:
        """(name, user) of a process, cached while it stays in view; (None, None) if gone."""
        with self._lock:
            tracked = self._track(pid)
            if tracked is None:
                return None, None
            return tracked.name, tracked.user

    # -- host-wide -------------------------------------------------------------------
    def _read_cpu_times(self) -> list[tuple[float, float]] | None:
        fast = read_proc_stat_cpus()
        if fast is not None:
            return fast
        times = self._call("cpu", psutil.cpu_times, True)
        return [_busy_and_total(c) for c in times] if times else None

    def _cpu(self) -> tuple[tuple[float, ...], float | None]:
        now = self._read_cpu_times()
        last = self._last_cpu
        if not now or not last or len(now) != len(last):
            self._last_cpu = now
            return (), None  # first reading, or a core came or went: no delta yet
        per_core: list[float] = []
        busy_sum = total_sum = 0.0
        for (b1, t1), (b2, t2) in zip(last, now, strict=False):
            db, dt = max(b2 - b1, 0.0), t2 - t1
            if dt <= 0:
                # called again within one clock tick: nothing measured yet; keep the old
                # baseline so the next call measures over the whole interval
                return (), None
            per_core.append(round(min(db / dt, 1.0), 4))
            busy_sum += db
            total_sum += dt
        self._last_cpu = now
        return tuple(per_core), round(min(busy_sum / total_sum, 1.0), 4)

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except (OSError, RuntimeError, psutil.Error) as err:
            logs.once(log, f"host-{what}", logging.WARNING,
                      "cannot read host %s: %s (reported as not measured)", what, err)
            return None

    # -- processes -------------------------------------------------------------------
    def _track(self, pid: int) -> _Tracked | None:
        """The tracked process for ``pid``, new if unseen or if the PID was reused."""
        tracked = self._procs.get(pid)
        if tracked is not None and tracked.seen == self._tick:
            return tracked  # already checked this tick
        if tracked is not None:
            if tracked.start is not None and self._now is not None:
                # one read serves the check and the tick's usage (_usage)
                stat = read_pid_stat(pid)
                tracked.stat = stat
                if stat is None or stat[3] != tracked.start:
                    tracked = None  # exited, or the PID now belongs to another process
                    self._forkers.pop(pid, None)  # its threads are read whole next time
            elif not tracked.proc.is_running():
                tracked = None
                self._forkers.pop(pid, None)
        if tracked is None:
            try:
                proc = psutil.Process(pid)
                with proc.oneshot():
                    name = proc.name()
                    try:
                        user: str | None = proc.username()
                    except (psutil.AccessDenied, KeyError):
                        user = None
            except _GONE:
                self._procs.pop(pid, None)
                return None
            tracked = _Tracked(proc=proc, name=name, user=user, seen=self._tick)
            if self.read_stat and self._now is not None:
                # read right after psutil's own: the start time of the process it names
                stat = read_pid_stat(pid)
                if stat is not None:
                    tracked.start, tracked.stat = stat[3], stat
            self._procs[pid] = tracked
        tracked.seen = self._tick
        return tracked

    def _forget_unseen(self) -> None:
        # keep only what was looked at this tick (or by process_identity since the last
        # one): a PID out of view for a whole tick may come back as another process
        stale = [pid for pid, tr in self._procs.items() if tr.seen < self._tick - 1]
        for pid in stale:
            del self._procs[pid]
            self._forkers.pop(pid, None)
        if len(self._forkers) > len(self._procs):
            self._forkers = {pid: f for pid, f in self._forkers.items() if pid in self._procs}

    def _children_map(self) -> dict[int, list[int]] | None:
        """Parent → children for the whole table (one scan), where /proc has no children files."""
        if self._proc_children:
            return None
        kids: dict[int, list[int]] = {}
        for proc in psutil.process_iter(["ppid"]):
            ppid = proc.info.get("ppid")
            if ppid is not None:
                kids.setdefault(ppid, []).append(proc.pid)
        return kids

    def _direct_children(self, pid: int, kids: dict[int, list[int]] | None) -> Iterable[int]:
        if kids is not None:
            return kids.get(pid, ())
        # children forked by any thread are listed under that thread only
        now = self._clock()
        known = self._forkers.get(pid)
        if known is not None and now - known[1] < self.thread_rescan_s:
            found: list[int] = []
            for tid in known[0]:
                try:
                    with open(f"/proc/{pid}/task/{tid}/children") as f:
                        found.extend(map(int, f.read().split()))
                except OSError:
                    if tid == pid:
                        self._forkers.pop(pid, None)
                        return ()  # the process is gone
                    break  # a thread that forked has ended: read them all now
            else:
                return found
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            self._forkers.pop(pid, None)
            return ()
        found = []
        forkers = [pid]
        before = known[2] if known is not None else None
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    children = f.read().split()
            except OSError:
                continue
            if children:
                found.extend(map(int, children))
                if tid != str(pid):
                    forkers.append(int(tid))
        self._forkers[pid] = (tuple(forkers), now, self._now)
        if before is not None:
            new = [child for child in found if child not in self._procs]
            if new and self._still_tracked(pid):  # not a reused PID's old reading
                for child in new:
                    self._unseen_since.setdefault(child, before)
        return found

    def _still_tracked(self, pid: int) -> bool:
        """Whether ``pid`` is still the process tracked under it (the walk reads a
        process's children before its tick's own check, ``_track``)."""
        tracked = self._procs.get(pid)
        if tracked is None:
            return False
        if tracked.start is not None:
            stat = read_pid_stat(pid)
            return stat is not None and stat[3] == tracked.start
        try:
            return tracked.proc.is_running()
        except psutil.Error:
            return False

    def _descendants(self, pid: int, kids: dict[int, list[int]] | None,
                     stop: Collection[int] = ()) -> list[int]:
        """``pid``'s descendants, not entering the subtree of any pid in ``stop``."""
        out: list[int] = []
        seen = {pid}
        todo = [pid]
        while todo:
            for child in self._direct_children(todo.pop(), kids):
                if child not in seen and child not in stop:
                    seen.add(child)
                    out.append(child)
                    todo.append(child)
        return out

    def _jobs(self, on_gpus: dict[int, tuple[int, ...]], mains: set[int]
              ) -> tuple[JobTree, ...]:
        try:
            kids = self._children_map()
        except (OSError, psutil.Error) as err:
            logs.once(log, "host-ptable", logging.WARNING, "cannot list processes: %s", err)
            return ()
        whole = trees = {pid: self._descendants(pid, kids) for pid in on_gpus}
        # a GPU process inside another GPU process's tree belongs to that tree, unless it
        # is a GPU's main process (a rank under a launcher that touched CUDA)
        nested = {pid for root, members in trees.items() for pid in members if pid in on_gpus}
        roots = (trees.keys() - nested) | (nested & mains)
        if nested & mains:
            # a root inside another root's tree: each tree stops where another begins
            trees = {r: self._descendants(r, kids, stop=roots) for r in roots}
        jobs: list[JobTree] = []
        for root in sorted(roots):
            job = self._job(root, trees[root], on_gpus.get(root, ()))
            if job is not None:
                jobs.append(job)
        if nested & mains:
            jobs = _launching_rank(jobs, whole)
        if not jobs:
            logs.once(log, "host-nojobs", logging.INFO,
                      "none of the GPU processes %s is visible here (another PID namespace?)",
                      sorted(on_gpus))
        return tuple(jobs)

    def _job(self, root: int, descendants: list[int], gpus: tuple[int, ...] = ()
             ) -> JobTree | None:
        main = self._usage(root)
        if main is None:
            return None  # the root is gone: its tree is no longer a job
        workers_cpu = loader_cpu = 0.0
        rss = main[1]
        processes, loaders, started = 1, 0, 0
        for pid in descendants:
            usage = self._usage(pid)
            if usage is None:
                continue  # a worker that exited mid-read costs only itself
            workers_cpu += usage[0]
            rss += usage[1]
            processes += 1
            if usage[2]:
                loaders += 1
                loader_cpu += usage[0]
                if usage[3]:
                    started += 1
        tracked = self._procs[root]
        tracked.started_total += started
        if tracked.dist is None:
            block = _read_environ(root)
            if block is None:
                tracked.dist = (None, None, None)
            else:
                tracked.dist, tracked.debug = parse_dist(block), parse_debug(block)
        write_rate = self._write_rate(tracked)
        rank, world, dist_job = tracked.dist
        return JobTree(
            pid=root,
            name=tracked.name,
            user=tracked.user,
            rank=rank,
            world_size=world,
            dist_job=dist_job,
            debug_env=tracked.debug,
            cpu_cores=round(main[0] + workers_cpu, 3),
            main_cpu_cores=round(main[0], 3),
            workers_cpu_cores=round(workers_cpu, 3),
            processes=processes,
            rss_bytes=rss,
            gpus=gpus,
            loader_workers=loaders,
            loader_cpu_cores=round(loader_cpu, 3),
            main_write_bytes_per_second=write_rate,
            loader_workers_started=started,
            loader_workers_started_total=tracked.started_total,
        )

    def _write_rate(self, tracked: _Tracked) -> float | None:
        """Bytes per second the process has written to storage since the last tick
        (/proc/PID/io ``write_bytes``: counted as it dirties page cache, so a checkpoint
        written to a disk counts as it is written; tmpfs, pipes and sockets do not). None
        on its first reading, and where it cannot be read."""
        if tracked.io_denied:
            return None
        try:
            written = tracked.proc.io_counters().write_bytes
        except (psutil.AccessDenied, AttributeError, NotImplementedError):
            tracked.io_denied = True  # another user's process: not readable, ever
            return None
        except _GONE:
            return None
        now, prev, prev_t = self._now, tracked.written, tracked.written_t
        tracked.written, tracked.written_t = written, now
        if prev is None or prev_t is None or now is None or now <= prev_t:
            return None
        return round(max(0, written - prev) / (now - prev_t), 1)

    def _since_birth(self, pid: int, born: float, cpu: float) -> tuple[float, bool]:
        """Of a process first seen now, born ``born`` seconds after boot and ``cpu``
        seconds of CPU used: (CPU cores over the last tick's interval, whether it is new:
        born since the last tick). A process born since then used all its CPU in that
        interval; one older, or any at the first tick, counts 0.0 (its use before is
        unknown). One older is new all the same where it was found late, by a full read
        of its parent's threads, and born since the read before that one (the child of a
        thread that had not forked before: a DataLoader iterated off the main thread)."""
        prev, now = self._prev_t, self._now
        if prev is None or now is None or now <= prev or born < prev - 0.05:
            since = self._unseen_since.get(pid)
            return 0.0, since is not None and born >= since - 0.05
        return cpu / (now - prev), True

    def _usage(self, pid: int) -> tuple[float, int, bool, bool] | None:
        """(CPU cores busy since the last tick, RSS bytes, whether torch named it a
        DataLoader worker, whether it is a worker just started: named now, not before, and
        new when first seen, ``_since_birth``) of one process; None if gone."""
        tracked = self._track(pid)
        if tracked is None:
            return None
        if tracked.start is not None:
            return self._usage_from_stat(pid, tracked)
        try:
            with tracked.proc.oneshot():
                if tracked.proc.status() == psutil.STATUS_ZOMBIE:
                    return None  # exited, not yet reaped by its parent: no longer a worker
                cores = tracked.proc.cpu_percent(None) / 100.0
                if tracked.fresh:
                    tracked.fresh = False
                    # psutil's create_time is boot time (whole seconds) + the start in
                    # clock ticks: less the boot time, it is on the since-boot clock
                    proc = tracked.proc
                    cores, tracked.newborn = self._since_birth(
                        pid, proc.create_time() - psutil.boot_time(),
                        sum(proc.cpu_times()[:2]))
                rss = tracked.proc.memory_info().rss
                # read anew each tick from the same stat record: a worker renames itself
                # as it starts, after the fork that copied its parent's name
                loader = tracked.proc.name() == LOADER_WORKER_NAME
        except _GONE:
            self._procs.pop(pid, None)
            return None
        return max(cores, 0.0), rss, loader, _started(tracked, loader)

    def _usage_from_stat(self, pid: int, tracked: _Tracked) -> tuple[float, int, bool, bool] | None:
        """:meth:`_usage` from this tick's ``/proc/PID/stat`` reading (Linux)."""
        stat = tracked.stat
        if stat is None:
            self._procs.pop(pid, None)
            return None
        comm, state, ticks, start, pages = stat
        if state == b"Z":
            return None  # exited, not yet reaped by its parent: no longer a worker
        now, prev_ticks, prev_t = self._now, tracked.cpu_ticks, tracked.cpu_t
        tracked.cpu_ticks, tracked.cpu_t = ticks, now
        if tracked.fresh:
            tracked.fresh = False
            cores, tracked.newborn = self._since_birth(pid, start / _CLOCK_TICKS,
                                                       ticks / _CLOCK_TICKS)
        elif prev_ticks is None or prev_t is None or now is None or now <= prev_t:
            cores = 0.0
        else:
            cores = round((ticks - prev_ticks) / _CLOCK_TICKS / (now - prev_t), 3)
        # read anew each tick: a worker renames itself as it starts, after the fork that
        # copied its parent's name
        loader = comm == _LOADER_COMM
        return max(cores, 0.0), pages * _PAGE_BYTES, loader, _started(tracked, loader)
