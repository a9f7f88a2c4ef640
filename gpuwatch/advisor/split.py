"""A long recording of several GPUs judged by several processes at once.

Judging a recording is one pass in time order, and most of its cost is the rules: every
rule, every GPU, every bucket. The GPUs' rules do not read each other's verdicts, only
the recording (the ranks of one job read each other's steps and time shares, which the
frame holds). So each process reads and buckets the whole recording, as one process
would, and judges only its share of the GPUs: what every rule reads is what it would read
alone, and the activations, put back in the order one engine makes them
(``Finding.order``), are the same report (tests/test_advise_split.py holds every
recording in tests/data to that). The GPUs a process does not judge it buckets lightly
(``Frame.judge_only``): of each only what the frame reads of every GPU for the others.

The parent judges the host and its own share while it feeds the report's tally and
charts; each child is a fork that judges its share and sends its activations back
through a pipe. Only a single-threaded process on Linux forks (the daemon and a notebook
kernel have threads: they judge in one process), only a plain file is split (each child
reads it again, up to the size it had when the judging began, so a recording still being
written is judged over the same lines by all), and a child that fails or could not be
started is judged again by the parent. A child dies with its parent.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import signal
import sys
import threading
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple

from gpuwatch.advisor.engine import Engine, Finding, _State
from gpuwatch.errors import UserError

log = logging.getLogger(__name__)

ENV = "GPUWATCH_REPLAY_WORKERS"
# below this a recording is judged in one process: a child pays the reading and the
# bucketing again, which only the rules of a long recording of several GPUs outweigh
MIN_BYTES = 4 << 20
# past 4 processes a 16-CPU machine gained a second at most while the CPU used kept
# growing with each (each process's reading and bucketing is its floor, and they contend
# for the memory and the caches): docs/benchmarks.md, "The advisor"
MAX_WORKERS = 4
FORCED_MAX = 64  # what GPUWATCH_REPLAY_WORKERS may ask for
# what the parent does beside its GPUs, in GPUs' worth of CPU: the host's rules and the
# tally ~0.3-0.8 of a GPU's, the timeline behind an HTML report's charts ~1.4-1.8 GPUs'
# (benchmarks/advise_parts.py on bench_advise.py's 8 GPUs, 2-core VM, 2026-12-02;
# docs/benchmarks.md, "The advisor")
PARENT_LOAD = 0.5
CHARTS_LOAD = 2.0
# the start of the file read for the GPUs it holds (a tick of 8 GPUs is ~3 KiB)
PEEK_BYTES = 256 << 10

Run = Callable[[Engine], None]


def forced_workers() -> int | None:
    """``GPUWATCH_REPLAY_WORKERS`` as a number of processes (None: unset or empty)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise UserError(f"{ENV}={raw!r}: expected a whole number of processes, 1 or more "
                        "(1 judges a recording in one process)")
    return n


def can_fork() -> bool:
    """Whether this process may fork children that run Python: Linux, one thread, native
    ones included (a thread holding a lock at the fork would leave the child stuck on
    it)."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork") \
            or threading.active_count() != 1:
        return False
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def usable_cpus() -> int:
    """The CPUs this process may run on, within its cgroup's CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cpus


def peek_gpus(path: str, limit: int = PEEK_BYTES) -> list[int]:
    """The GPU indices of the gpu lines in the first ``limit`` bytes of a recording."""
    from gpuwatch.trace.format import _open_binary

    try:
        with _open_binary(path) as f:  # plain or gzip, as the reader opens it
            data = f.read(limit)
    except (OSError, EOFError, zlib.error, UserError):
        return []
    seen: set[int] = set()
    for line in data.splitlines()[:-1] if len(data) >= limit else data.splitlines():
        if b'"gpu"' not in line:
            continue
        try:
            d = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(d, dict) and d.get("kind") == "gpu" and type(d.get("gpu")) is int:
            seen.add(d["gpu"])
    return sorted(seen)


class Plan(NamedTuple):
    workers: int  # processes, this one included
    gpus: list[int]  # the GPUs seen at the file's start
    size: int | None  # the file's size when it was planned: every process reads that far


def plan(path: str) -> Plan:
    """How many processes judge ``path``, the GPUs seen at its start, and its size."""
    if not can_fork() or not os.path.isfile(path):
        return Plan(1, [], None)
    forced = forced_workers()
    if forced == 1:
        return Plan(1, [], None)
    size = os.path.getsize(path)
    gpus = peek_gpus(path)
    if forced is not None:
        # as asked, though a process beyond one per GPU and the host's judges nothing
        return Plan(min(forced, FORCED_MAX, max(2, len(gpus) + 1)), gpus, size)
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    if len(gpus) < 2 or size < (MIN_BYTES // 8 if gz else MIN_BYTES):
        return Plan(1, gpus, size)
    # a process per GPU and the first one, which also judges the host and feeds the
    # report's tally and charts, as far as the CPUs go
    return Plan(max(1, min(len(gpus) + 1, usable_cpus(), MAX_WORKERS)), gpus, size)


def shares(workers: int, seen: list[int], charts: bool = False
           ) -> list[Callable[[int | None], bool]]:
    """Which subjects each process judges: the host the parent (0), which also feeds the
    report's tally and, where asked (``charts``), the timeline of an HTML report's charts
    (the notebook's report and ``compare`` feed it too); each GPU seen at the
    start the least loaded process (a child where they tie); a GPU first seen later by
    its index. The parent's own load is counted in GPUs' worth (PARENT_LOAD, CHARTS_LOAD)."""
    load = [PARENT_LOAD + (CHARTS_LOAD if charts else 0.0)] + [0.0] * (workers - 1)
    place = {}
    for gpu in seen:
        w = min(range(workers), key=lambda i: (load[i], -i))
        place[gpu] = w
        load[w] += 1

    def share(w: int) -> Callable[[int | None], bool]:
        def judges(gpu: int | None) -> bool:
            if gpu is None:
                return w == 0
            got = place.get(gpu)
            return (got if got is not None else (gpu + 1) % workers) == w
        return judges
    return [share(w) for w in range(workers)]


class _Child:
    __slots__ = ("fd", "pid", "share", "worker")

    def __init__(self, worker: int, pid: int, fd: int,
                 share: Callable[[int | None], bool]) -> None:
        self.worker, self.pid, self.fd, self.share = worker, pid, fd, share


def start(engine: Engine, run: Run, judges: list[Callable[[int | None], bool]]
          ) -> list[_Child]:
    """Fork a child for each share after the first; it judges its share with a copy of
    ``engine`` (fed by ``run``) and sends back its activations. Call before ``engine``
    has been fed anything. A share whose fork failed has no child: the caller judges it
    (``mine``)."""
    children: list[_Child] = []
    parent = os.getpid()
    stop = {signal.SIGINT, signal.SIGTERM}
    for w in range(1, len(judges)):
        r, wfd = os.pipe()
        # no signal between the fork and the child's own handlers: a KeyboardInterrupt
        # there would unwind the child into the caller's code
        old = signal.pthread_sigmask(signal.SIG_BLOCK, stop)
        try:
            pid = os.fork()
        except OSError as err:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
            os.close(r)
            os.close(wfd)
            log.warning("could not start a process to judge part of the recording (%s): "
                        "this one judges its GPUs", err)
            break
        if pid == 0:  # the child: never returns
            try:
                os.close(r)
                for c in children:
                    os.close(c.fd)
                _child(engine, run, judges[w], wfd, parent, old)
            finally:
                os._exit(1)
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        os.close(wfd)
        children.append(_Child(w, pid, r, judges[w]))
    if children:
        log.debug("the recording is judged by %d processes, each its share of the GPUs",
                  len(children) + 1)
    return children


def mine(judges: list[Callable[[int | None], bool]], children: list[_Child]
         ) -> Callable[[int | None], bool]:
    """What the parent judges: its own share and every share no child took."""
    taken = {c.worker for c in children}
    return _any_of([j for w, j in enumerate(judges) if w not in taken])


def _any_of(shares: list[Callable[[int | None], bool]]) -> Callable[[int | None], bool]:
    """What any of ``shares`` judges."""
    if len(shares) == 1:
        return shares[0]
    return lambda gpu: any(j(gpu) for j in shares)


def _child(engine: Engine, run: Run, share: Callable[[int | None], bool], wfd: int,
           parent: int, mask: Any) -> None:
    # Ctrl-C reaches the whole process group: a child simply ends (the parent reaps it);
    # and it ends with its parent, however the parent ends
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it ended before the line above
        os._exit(1)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        # the parent says what there is to say: the same lines read twice would print
        # their warnings twice
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        logging.disable(logging.CRITICAL)
        engine.judge_only(share)
        run(engine)
        payload: tuple[str, Any] = ("ok", export(engine))
    except BaseException as err:  # noqa: BLE001 - said to the parent, which judges again
        payload = ("failed", f"{type(err).__name__}: {err}")
    try:
        data = memoryview(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
        while data:
            data = data[os.write(wfd, data):]
    finally:
        os._exit(0)


def export(engine: Engine) -> dict[str, Any]:
    """An engine's activations and rule errors as plain data."""
    return {
        "findings": [(f.rule.id, f.gpu, f.start, f.last_seen, f.active, f.ended,
                      f.held_seconds, f.detail_t, f.details, f.order)
                     for f in engine.findings],
        "rule_errors": {rid: (list(v), engine.rule_error_order.get(rid))
                        for rid, v in engine.rule_errors.items()},
    }


def merge(engine: Engine, got: dict[str, Any]) -> None:
    """Add another process's activations and rule errors to ``engine``'s: each rule's
    errors counted together, the first said where it first failed, the rules in the order
    they first failed (as one process says them)."""
    rules = {r.id: r for r in engine.rules}
    for (rid, gpu, start_t, last_seen, active, ended, held, detail_t, details,
         order) in got["findings"]:
        f = Finding(rules[rid], gpu, start=start_t, last_seen=last_seen, active=active,
                    ended=ended, held_seconds=held, detail_t=detail_t, order=tuple(order))
        f.details = details
        engine.findings.append(f)
        st = engine.states.get((rid, gpu))
        if st is None:
            st = engine.states[(rid, gpu)] = _State()
            engine._stated.setdefault(gpu, set()).add(rid)
        if st.finding is None or st.finding.order < f.order:
            st.finding = f
    errors, order = engine.rule_errors, engine.rule_error_order
    for rid, ((n, where, part, said), first) in got["rule_errors"].items():
        mine = errors.get(rid)
        if mine is not None:
            mine[0] += n
            if first is not None and (rid not in order or tuple(first) < order[rid]):
                mine[1:] = [where, part, said]
                order[rid] = tuple(first)
            continue
        errors[rid] = [n, where, part, said]
        if first is not None:
            order[rid] = tuple(first)
        log.error("rule %s (%s) failed evaluating its %s on %s: %s; the other rules go on "
                  "(said once per rule)", rid, where, part,
                  first[3] if first is not None else "a GPU", said)
    if len(errors) > 1:
        ranked = sorted(errors, key=lambda r: order.get(r, (math.inf,)))
        engine.rule_errors = {r: errors[r] for r in ranked}


def finish(engine: Engine, run: Run, children: list[_Child]) -> None:
    """Take each child's activations into ``engine`` (whose own share is judged), in the
    order one engine judging every subject makes them. The shares of children that
    failed or vanished are judged again here, together, in one more pass."""
    failed = []
    for child in children:
        chunks = []
        try:
            while True:
                chunk = os.read(child.fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
        except BaseException:
            abandon(children)  # interrupted: this child and the rest are stopped, not awaited
            raise
        os.close(child.fd)
        child.fd = -1
        _reap(child.pid)
        try:
            status, got = pickle.loads(b"".join(chunks))
        except Exception as err:  # noqa: BLE001 - killed, or out of memory
            status, got = "failed", f"no answer ({type(err).__name__})"
        if status == "ok":
            merge(engine, got)
        else:
            log.warning("the process judging part of the recording's GPUs failed (%s); "
                        "judged again in this one", got)
            failed.append(child.share)
    if failed:
        again = Engine(engine.ruleset, res=engine.res)
        again.judge_only(_any_of(failed))
        # the file's warnings were said by the first pass
        reader_log = logging.getLogger("gpuwatch.trace.format")
        was = reader_log.disabled
        reader_log.disabled = True
        try:
            run(again)
        finally:
            reader_log.disabled = was
        merge(engine, export(again))
    engine.findings.sort(key=_order)


def abandon(children: list[_Child]) -> None:
    """The parent failed or was interrupted: stop and reap every child left."""
    for child in children:
        if child.fd < 0:
            continue  # already reaped
        try:
            os.kill(child.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.close(child.fd)
        except OSError:
            pass
        child.fd = -1
        _reap(child.pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _order(f: Finding) -> tuple[float, int, int]:
    return f.order


__all__ = ["ENV", "FORCED_MAX", "MAX_WORKERS", "MIN_BYTES", "Plan", "abandon", "can_fork",
           "export", "finish", "forced_workers", "merge", "mine", "peek_gpus", "plan",
           "shares", "start", "usable_cpus"]
