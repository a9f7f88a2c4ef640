"""A long recording of several GPUs judged by several processes at once.

Judging a recording is one pass in time order, and most of its cost is the rules: every
rule, every GPU, every bucket. The GPUs' rules do not read each other's verdicts, only
the recording (the ranks of one job read each other's steps and time shares, which the
frame holds). So each process reads and buckets the whole recording, as one process
would, and judges only its share of the GPUs: what every rule reads is what it would read
alone, and the activations, put back in the order one engine makes them
(``Finding.order``), are the same report (tests/test_advise_split.py holds every
recording in tests/data to that).

The parent judges the host and its own share while it feeds the report's tally and
charts; each child is a fork that judges its share and sends its activations back
through a pipe. Only a single-threaded process on Linux forks (the daemon and a notebook
kernel have threads: they judge in one process), only a plain file is split (each child
reads it again), and a child that fails is judged again by the parent.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import pickle
import sys
import threading
from collections.abc import Callable
from typing import Any

from gpuwatch.advisor.engine import Engine, Finding, _State
from gpuwatch.errors import UserError

log = logging.getLogger(__name__)

ENV = "GPUWATCH_REPLAY_WORKERS"
# below this a recording is judged in one process: a child pays the reading and the
# bucketing again, which only the rules of a long recording of several GPUs outweigh
MIN_BYTES = 4 << 20
# past 3-4 processes the wall time stopped falling on a 16-CPU machine (each process's
# reading and bucketing is the floor, and they contend for the memory and the caches)
# while the CPU used kept growing with each: docs/benchmarks.md, "The advisor"
MAX_WORKERS = 4
FORCED_MAX = 64  # what GPUWATCH_REPLAY_WORKERS may ask for
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
    """Whether this process may fork children that run Python: Linux, one thread (a
    thread holding a lock at the fork would leave the child stuck on it)."""
    return (sys.platform.startswith("linux") and hasattr(os, "fork")
            and threading.active_count() == 1)


def peek_gpus(path: str, limit: int = PEEK_BYTES) -> list[int]:
    """The GPU indices of the gpu lines in the first ``limit`` bytes of a recording."""
    try:
        with open(path, "rb") as raw:
            head = raw.read(2)
            raw.seek(0)
            if head == b"\x1f\x8b":
                with gzip.open(raw, "rb") as unzipped:
                    data = unzipped.read(limit)
            else:
                data = raw.read(limit)
    except (OSError, EOFError):
        return []
    seen: set[int] = set()
    for line in data.splitlines()[:-1] if len(data) >= limit else data.splitlines():
        if b'"gpu"' not in line:
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and d.get("kind") == "gpu" and type(d.get("gpu")) is int:
            seen.add(d["gpu"])
    return sorted(seen)


def plan(path: str) -> tuple[int, list[int]]:
    """How many processes judge ``path``, and the GPUs seen at its start."""
    forced = forced_workers()
    if forced == 1 or not can_fork() or not os.path.isfile(path):
        return 1, []
    gpus = peek_gpus(path)
    if forced is not None:
        return min(forced, FORCED_MAX), gpus
    if len(gpus) < 2 or os.path.getsize(path) < MIN_BYTES:
        return 1, gpus
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    # a process per GPU and the first one, which also judges the host and feeds the
    # report's tally and charts, as far as the CPUs go
    return max(1, min(len(gpus) + 1, cpus, MAX_WORKERS)), gpus


def shares(workers: int, seen: list[int]) -> list[Callable[[int | None], bool]]:
    """Which subjects each process judges: the host the parent (0), which also feeds the
    report's tally and charts (about one GPU's work); each GPU seen at the start the
    least loaded process (a child where they tie); a GPU first seen later by its index."""
    load = [1] + [0] * (workers - 1)
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
    has been fed anything."""
    children: list[_Child] = []
    for w in range(1, len(judges)):
        r, wfd = os.pipe()
        try:
            pid = os.fork()
        except OSError as err:
            os.close(r)
            os.close(wfd)
            log.debug("no fork (%s): the parent judges the rest", err)
            break
        if pid == 0:  # the child: never returns
            os.close(r)
            for c in children:
                os.close(c.fd)
            _child(engine, run, judges[w], wfd)
        os.close(wfd)
        children.append(_Child(w, pid, r, judges[w]))
    if children:
        log.debug("the recording is judged by %d processes, each its share of the GPUs",
                  len(children) + 1)
    return children


def _child(engine: Engine, run: Run, share: Callable[[int | None], bool], wfd: int) -> None:
    try:
        # the parent says what there is to say: the same lines read twice would print
        # their warnings twice
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        logging.disable(logging.CRITICAL)
        engine.judges = share
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
        "rule_errors": {rid: list(v) for rid, v in engine.rule_errors.items()},
    }


def merge(engine: Engine, got: dict[str, Any]) -> None:
    """Add another process's activations and rule errors to ``engine``'s."""
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
    for rid, (n, where, part, said) in got["rule_errors"].items():
        mine = engine.rule_errors.get(rid)
        if mine is not None:
            mine[0] += n
            continue
        engine.rule_errors[rid] = [n, where, part, said]
        log.error("rule %s (%s) failed evaluating its %s: %s; the other rules go on "
                  "(said once per rule)", rid, where, part, said)


def finish(engine: Engine, run: Run, children: list[_Child]) -> None:
    """Take each child's activations into ``engine`` (whose own share is judged), in the
    order one engine judging every subject makes them. A child that failed or vanished
    has its share judged again here."""
    redo = []
    for child in children:
        chunks = []
        try:
            while True:
                chunk = os.read(child.fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(child.fd)
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
            redo.append(child)
    for child in redo:
        again = Engine(engine.ruleset, res=engine.res)
        again.judges = child.share
        run(again)
        merge(engine, export(again))
    engine.findings.sort(key=_order)


def abandon(children: list[_Child]) -> None:
    """The parent failed: stop and reap every child."""
    for child in children:
        try:
            os.kill(child.pid, 9)
        except OSError:
            pass
        try:
            os.close(child.fd)
        except OSError:
            pass
        _reap(child.pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _order(f: Finding) -> tuple[float, int, int]:
    return f.order


__all__ = ["ENV", "FORCED_MAX", "MAX_WORKERS", "MIN_BYTES", "abandon", "can_fork", "export", "finish",
           "forced_workers", "merge", "peek_gpus", "plan", "shares", "start"]
