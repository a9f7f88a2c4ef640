"""The store: the latest snapshot and bounded windows of recent history.

Writers (the sampler, the hook receiver, replay) publish; readers (the exporter, the
advisor, the recorder) read. The latest snapshot is swapped atomically (a reference
assignment), so a scrape never waits on a tick. History is kept per kind in bounded
deques: at most ``history_seconds`` of time and ``max_records`` records each.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace

from gpuwatch.samples import (
    ConfigSample,
    GpuSample,
    HostSample,
    JobEnd,
    JobStats,
    Sample,
    Snapshot,
    StepSample,
)

Listener = Callable[[Sample], None]


class Store:
    def __init__(self, history_seconds: float = 900.0, max_records: int = 20_000) -> None:
        self.history_seconds = history_seconds
        self.max_records = max_records
        self._lock = threading.Lock()
        self._published = Snapshot(t=0.0)
        # the published snapshot with the hook's jobs and counters added, built on first
        # read after a change: ticks are frequent and scrapes rare, so the tick doesn't pay
        self._latest: Snapshot | None = None
        self._gpu: dict[int, deque[GpuSample]] = {}
        self._host: deque[HostSample] = deque(maxlen=max_records)
        self._steps: deque[StepSample] = deque(maxlen=max_records)
        self._configs: dict[tuple[int | None, int | None], ConfigSample] = {}
        self._jobs: dict[int, JobStats] = {}
        self._ends: deque[JobEnd] = deque(maxlen=1000)
        self._listeners: list[Listener] = []
        self._hook_messages = 0
        self._hook_dropped: dict[str, int] = {}
        # errors of parts that are not the sampler (the hook receiver, the recorder); merged
        # into the snapshot's errors_total on read
        self._errors: dict[str, int] = {}

    # -- writers -------------------------------------------------------------------
    def publish(self, snapshot: Snapshot) -> None:
        """Publish one tick's snapshot; its GPU and host samples join the history."""
        with self._lock:
            self._published = snapshot
            self._latest = None  # composed with the hook's jobs and counters on first read
            for g in snapshot.gpus:
                ring = self._gpu.get(g.gpu)
                if ring is None:
                    ring = self._gpu[g.gpu] = deque(maxlen=self.max_records)
                ring.append(g)
                self._trim(ring, snapshot.t)
            if snapshot.host is not None:
                self._host.append(snapshot.host)
                self._trim(self._host, snapshot.t)
            listeners = list(self._listeners) if self._listeners else ()
        for fn in listeners:
            for g in snapshot.gpus:
                fn(g)
            if snapshot.host is not None:
                fn(snapshot.host)

    def add_steps(self, steps: Iterable[StepSample]) -> None:
        steps = list(steps)
        with self._lock:
            self._steps.extend(steps)
            if steps:
                self._trim(self._steps, steps[-1].t)
            listeners = list(self._listeners)
        for fn in listeners:
            for s in steps:
                fn(s)

    def set_config(self, config: ConfigSample) -> None:
        with self._lock:
            key = (config.pid, config.rank)
            changed = self._configs.get(key) is None or self._configs[key].values != config.values
            if config.pid is not None:
                # one process has one rank at a time: a rank that changed replaces the old
                # entry (else a process sending ever new ranks grows this without bound)
                for old in [k for k in self._configs if k[0] == config.pid and k != key]:
                    del self._configs[old]
            self._configs[key] = config
            listeners = list(self._listeners) if changed else []
        for fn in listeners:
            fn(config)

    def set_job(self, stats: JobStats) -> None:
        """Per-job aggregates from the hook; they ride along in the next snapshot."""
        with self._lock:
            self._jobs[stats.pid] = stats
            self._latest = None

    def add_job_end(self, end: JobEnd) -> None:
        """A training process ended: kept (the last 1000) and passed to the listeners (the
        recorder writes it as a `job_end` line)."""
        with self._lock:
            self._ends.append(end)
            listeners = list(self._listeners)
        for fn in listeners:
            fn(end)

    def job_ends(self, since: float = 0.0) -> list[JobEnd]:
        with self._lock:
            return [e for e in self._ends if e.t >= since]

    def drop_job(self, pid: int) -> None:
        """Forget a job that ended long ago, and the configuration it reported."""
        with self._lock:
            self._jobs.pop(pid, None)
            for key in [k for k in self._configs if k[0] == pid]:
                del self._configs[key]
            self._latest = None

    def count_hook_message(self, dropped_reason: str | None = None) -> None:
        """Count one datagram from the hook; ``dropped_reason`` when it was rejected."""
        with self._lock:
            if dropped_reason is None:
                self._hook_messages += 1
            else:
                self._hook_dropped[dropped_reason] = self._hook_dropped.get(dropped_reason, 0) + 1
            self._latest = None

    def count_error(self, source: str) -> None:
        """Count one error of ``source`` (gpuwatch_errors_total{source})."""
        with self._lock:
            self._errors[source] = self._errors.get(source, 0) + 1
            self._latest = None

    def subscribe(self, fn: Listener) -> None:
        """Call ``fn`` with every new sample (the recorder); it must not block."""
        with self._lock:
            self._listeners.append(fn)

    def unsubscribe(self, fn: Listener) -> None:
        with self._lock:
            if fn in self._listeners:
                self._listeners.remove(fn)

    def clear(self) -> None:
        """Forget history (replay starting over)."""
        with self._lock:
            self._gpu.clear()
            self._host.clear()
            self._steps.clear()
            self._configs.clear()
            self._jobs.clear()
            self._ends.clear()
            self._latest = None

    # -- readers -------------------------------------------------------------------
    def latest(self) -> Snapshot:
        snap = self._latest
        if snap is not None:
            return snap
        with self._lock:
            pub = self._published
            errors = pub.health.errors_total
            if self._errors:
                errors = dict(errors)
                for source, count in self._errors.items():
                    errors[source] = errors.get(source, 0) + count
            health = replace(pub.health, errors_total=errors,
                             hook_messages_total=self._hook_messages,
                             hook_messages_dropped_total=dict(self._hook_dropped))
            snap = replace(pub, jobs=tuple(self._jobs.values()), health=health)
            self._latest = snap
        return snap

    def gpu_history(self, gpu: int, since: float = 0.0) -> list[GpuSample]:
        with self._lock:
            ring = self._gpu.get(gpu)
            return [s for s in ring if s.t >= since] if ring else []

    def host_history(self, since: float = 0.0) -> list[HostSample]:
        with self._lock:
            return [s for s in self._host if s.t >= since]

    def step_history(self, since: float = 0.0) -> list[StepSample]:
        with self._lock:
            return [s for s in self._steps if s.t >= since]

    def configs(self) -> list[ConfigSample]:
        with self._lock:
            return list(self._configs.values())

    def timeline(self, since: float = 0.0) -> list[Sample]:
        """All history since ``since`` in time order: the advisor's input."""
        with self._lock:
            out: list[Sample] = [s for ring in self._gpu.values() for s in ring if s.t >= since]
            out.extend(s for s in self._host if s.t >= since)
            out.extend(s for s in self._steps if s.t >= since)
            out.extend(self._configs.values())
        out.sort(key=lambda s: s.t)
        return out

    def _trim(self, ring: deque, now: float) -> None:
        horizon = now - self.history_seconds
        while ring and ring[0].t < horizon:
            ring.popleft()
