"""The store: the latest snapshot and bounded windows of recent history.

Writers (the sampler, the hook receiver, replay) publish; readers (the exporter, the
advisor, the recorder) read. The latest snapshot is swapped atomically (a reference
assignment), so a scrape never waits on a tick. History is kept per kind in bounded
deques: at most ``history_seconds`` of time and ``max_records`` records each, and only
until its reader (the live advisor) has taken it (``release``).

Training steps are thinned as they come in (``StepThinner``), so the step history, and
the recording made from it, stay bounded whatever the step rate: each job's steps pass
one by one up to ``step_lines_per_second`` in a second; the rest of that second, and
every second after one that overflowed, is kept as one ``StepsSample`` per job holding
exact counts and sums. The live advisor reads the history every few seconds; at 2 000
steps/s per job, one record per step would overrun ``max_records`` between two reads.
"""

from __future__ import annotations

import math
import random
import threading
from collections import deque, namedtuple
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from gpuwatch.samples import (
    ConfigSample,
    GpuSample,
    HookProblem,
    HostSample,
    JobEnd,
    JobStats,
    PhaseSample,
    Sample,
    Snapshot,
    StepSample,
    StepsSample,
)

Listener = Callable[[Sample], None]

# One training step as the hook receiver hands it to ``Store.add_steps``: StepSample's
# fields, in its order, in a tuple. The thinner sums most steps of a fast job and keeps
# only a few as lines, so a StepSample (a frozen dataclass, field by field to make) is
# made only for a step kept as a line (``StepSample(*values)``).
StepValues = namedtuple("StepValues", [f.name for f in fields(StepSample)])

STEP_LINES_PER_SECOND = 20  # per job: steps kept one by one in a second, at most
STEP_INTERVAL = 1.0  # seconds: what one StepsSample of a job covers at most
# an interval's steps may arrive this long after its end (the hook reports every 0.5 s);
# after that, what it summed is released even without a newer step (a job that stopped)
STEP_GRACE = 0.75
MAX_DURATIONS = 4_096  # step times kept per interval for its percentiles (then sampled)
MAX_OPEN_JOBS = 1_024  # jobs with an open interval; beyond, the oldest is released


@dataclass
class _Sums:
    """A job's steps of one interval, summed (what becomes a StepsSample)."""

    t: float
    steps: int = 0
    begin_t: float | None = None
    first_step: int | None = None
    last_step: int | None = None
    skipped: int | None = None
    timed: int = 0
    step_seconds: float = 0.0
    data_wait_seconds: float | None = None
    samples: int | None = None
    sample_seconds: float = 0.0
    batch_size: int | None = None
    first_batch: int | None = None
    first_batch_wait_seconds: float = 0.0
    first_batch_data_wait_seconds: float = 0.0
    loss_scale: float | None = None
    mem_allocated_bytes: int | None = None
    mem_reserved_bytes: int | None = None
    max_mem_allocated_bytes: int | None = None
    micro_batches: int | None = None
    micro_counted: int | None = None
    pid: int | None = None
    rank: int | None = None
    gpu: int | None = None
    durations: list[float] | None = None
    seen: int = 0  # durations offered (the reservoir keeps MAX_DURATIONS of them)

    def add(self, s: StepSample | StepValues, rng: random.Random) -> None:
        # called for every step a fast job sends (thousands a second with many ranks):
        # the fields unpacked at once (a named tuple's fields, read by name, are looked up
        # on its type each time), plain comparisons
        if type(s) is not StepValues:
            s = StepValues(*(getattr(s, name) for name in StepValues._fields))
        (t, step, ss, dw, batch, loss_scale, mem_allocated, mem_reserved, max_mem_allocated,
         _loss, skipped, first, first_wait, micro, pid, rank, gpu) = s
        self.steps += 1
        if t > self.t:
            self.t = t
        begin = t - (ss or 0.0)
        if self.begin_t is None or begin < self.begin_t:
            self.begin_t = begin
        if self.first_step is None or step < self.first_step:
            self.first_step = step
        if self.last_step is None or step > self.last_step:
            self.last_step = step
        if skipped is not None:
            self.skipped = (self.skipped or 0) + (1 if skipped else 0)
        if ss is not None:
            self.timed += 1
            self.step_seconds += ss
            if dw is not None:
                self.data_wait_seconds = (self.data_wait_seconds or 0.0) + dw
            if batch is not None:
                self.samples = (self.samples or 0) + batch
                self.sample_seconds += ss
            self._duration(ss, rng)
        if batch is not None:
            self.batch_size = batch
        if micro is not None:
            self.micro_batches = (self.micro_batches or 0) + micro
            self.micro_counted = (self.micro_counted or 0) + 1
        if first is not None:
            self.first_batch = (self.first_batch or 0) + (1 if first else 0)
            if first:
                self.first_batch_wait_seconds += first_wait or 0.0
                self.first_batch_data_wait_seconds += dw or 0.0
        # the newest known value of each (the hook sends these with a report's last step)
        if loss_scale is not None:
            self.loss_scale = loss_scale
        if mem_allocated is not None:
            self.mem_allocated_bytes = mem_allocated
        if mem_reserved is not None:
            self.mem_reserved_bytes = mem_reserved
        if max_mem_allocated is not None:
            self.max_mem_allocated_bytes = max_mem_allocated
        if pid is not None:
            self.pid = pid
        if rank is not None:
            self.rank = rank
        if gpu is not None:
            self.gpu = gpu

    def add_unseen(self, u: StepsSample) -> None:
        """Steps known only by their sums (those a hook datagram had no room for): they
        ended by ``u.t`` and began, back to back, their summed time before it."""
        self.steps += u.steps
        if u.t > self.t:
            self.t = u.t
        begin = u.begin_t if u.begin_t is not None else u.t - (u.step_seconds or 0.0)
        if self.begin_t is None or begin < self.begin_t:
            self.begin_t = begin
        if u.skipped is not None:
            self.skipped = (self.skipped or 0) + u.skipped
        self.timed += u.timed
        self.step_seconds += u.step_seconds or 0.0
        if u.data_wait_seconds is not None:
            self.data_wait_seconds = (self.data_wait_seconds or 0.0) + u.data_wait_seconds
        if u.samples is not None:
            self.samples = (self.samples or 0) + u.samples
            self.sample_seconds += u.sample_seconds or 0.0
        if u.first_batch:
            self.first_batch = (self.first_batch or 0) + u.first_batch
            self.first_batch_wait_seconds += u.first_batch_wait_seconds or 0.0
            self.first_batch_data_wait_seconds += u.first_batch_data_wait_seconds or 0.0
        if u.micro_counted:
            self.micro_batches = (self.micro_batches or 0) + (u.micro_batches or 0)
            self.micro_counted = (self.micro_counted or 0) + u.micro_counted

    def _duration(self, ss: float, rng: random.Random) -> None:
        # a reservoir: the percentiles stay honest estimates without keeping every step
        self.seen += 1
        if self.durations is None:
            self.durations = []
        if len(self.durations) < MAX_DURATIONS:
            self.durations.append(ss)
        else:
            i = rng.randrange(self.seen)
            if i < MAX_DURATIONS:
                self.durations[i] = ss

    def sample(self) -> StepsSample:
        q: dict[str, float] = {}
        if self.durations:
            d = sorted(self.durations)
            q = {"step_seconds_min": d[0], "step_seconds_max": d[-1]}
            for p in (50, 90, 99):  # nearest rank
                q[f"step_seconds_p{p}"] = d[max(0, math.ceil(p / 100 * len(d)) - 1)]
        timed = self.timed > 0
        fb = bool(self.first_batch)
        return StepsSample(
            t=self.t, steps=self.steps, begin_t=self.begin_t, first_step=self.first_step,
            last_step=self.last_step, skipped=self.skipped, timed=self.timed,
            step_seconds=self.step_seconds if timed else None,
            data_wait_seconds=self.data_wait_seconds if timed else None,
            samples=self.samples,
            sample_seconds=self.sample_seconds if self.samples is not None else None,
            batch_size=self.batch_size, first_batch=self.first_batch,
            first_batch_wait_seconds=self.first_batch_wait_seconds if fb else None,
            first_batch_data_wait_seconds=self.first_batch_data_wait_seconds if fb else None,
            loss_scale=self.loss_scale, mem_allocated_bytes=self.mem_allocated_bytes,
            mem_reserved_bytes=self.mem_reserved_bytes,
            max_mem_allocated_bytes=self.max_mem_allocated_bytes,
            micro_batches=self.micro_batches, micro_counted=self.micro_counted,
            pid=self.pid, rank=self.rank, gpu=self.gpu, **q)


@dataclass
class _Open:
    """A job's open interval: steps passed one by one so far, and the sums of the rest."""

    index: int
    lines: int = 0
    sums: _Sums | None = None
    fast: bool = False  # the interval before overflowed: sum from the first step


JobKey = tuple[int | None, int | None, int | None]


class StepThinner:
    """Per job, steps pass one by one up to ``per_second`` in an interval; the rest of it
    (and all of an interval that follows one that overflowed) come out as one
    ``StepsSample`` when the interval closes: at the job's first step of a later interval,
    or ``grace`` seconds after its end (``due``). Not thread-safe: the store locks it."""

    def __init__(self, per_second: float = STEP_LINES_PER_SECOND,
                 interval: float = STEP_INTERVAL, grace: float = STEP_GRACE) -> None:
        self.interval = interval
        self.limit = max(0, int(per_second * interval))
        self.grace = grace
        self._open: dict[JobKey, _Open] = {}
        self._rng = random.Random(0)  # reproducible percentiles

    @staticmethod
    def key(s: StepSample | StepsSample) -> JobKey:
        return (s.pid, s.rank, s.gpu)

    def add(self, s: StepSample | StepValues | StepsSample,
            out: list[StepSample | StepsSample]) -> None:
        """Take one step (a ``StepValues`` becomes a ``StepSample`` if it is kept as a
        line); append what is ready to ``out``. A ``StepsSample`` is a summary already (a
        recording's) and passes as it is."""
        if isinstance(s, StepsSample):
            out.append(s)
            return
        self._take(s, out)

    def add_unseen(self, s: StepsSample, out: list[StepSample | StepsSample]) -> None:
        """Steps known only by their sums, that precede the job's next step: they join its
        open interval's sums."""
        self._take(s, out)

    def _take(self, s: StepSample | StepValues | StepsSample,
              out: list[StepSample | StepsSample]) -> None:
        key = self.key(s)
        index = math.floor(s.t / self.interval)
        o = self._open.get(key)
        fast = False
        if o is not None and index > o.index:
            # a job faster than the limit stays summed from its next interval's first step
            fast = index == o.index + 1 and o.lines + (o.sums.steps if o.sums else 0) > self.limit
            self._release(key, out)
            o = None
        if o is None:
            if len(self._open) >= MAX_OPEN_JOBS:
                self._release(next(iter(self._open)), out)
            o = self._open[key] = _Open(index=index, fast=fast)
        # a step of an interval already closed joins the open one: late, but counted once
        if isinstance(s, StepsSample):
            self._sums(o, s.t).add_unseen(s)
        elif o.sums is None and not o.fast and o.lines < self.limit:
            o.lines += 1
            out.append(s if type(s) is StepSample else StepSample(*s))
        elif s.loss is not None:
            # the hook reads the loss of one step per report (at most two a second): that
            # step keeps its line, or a fast job's loss would never reach a recording
            out.append(s if type(s) is StepSample else StepSample(*s))
        else:
            self._sums(o, s.t).add(s, self._rng)

    def _sums(self, o: _Open, t: float) -> _Sums:
        if o.sums is None:
            o.sums = _Sums(t=t)
        return o.sums

    def _release(self, key: JobKey, out: list[StepSample | StepsSample]) -> None:
        o = self._open.pop(key)
        if o.sums is not None and o.sums.steps:
            out.append(o.sums.sample())

    def due(self, now: float, out: list[StepSample | StepsSample]) -> None:
        """Release the intervals that ended more than ``grace`` seconds before ``now``."""
        for key, o in list(self._open.items()):
            if (o.index + 1) * self.interval + self.grace <= now:
                self._release(key, out)

    def flush(self, out: list[StepSample | StepsSample], pid: int | None = None) -> None:
        """Release every open interval (of ``pid`` only, where given)."""
        for key in list(self._open):
            if pid is None or key[0] == pid:
                self._release(key, out)


def unseen_steps(window: Any, steps: Sequence[StepSample], *, t: float, pid: int | None,
                 rank: int | None, gpu: int | None) -> StepsSample | None:
    """The steps a hook datagram counted in its ``window`` but had no room to list
    (``steps_omitted``): the window's sums less those of the steps it listed. They are the
    report's oldest: they ended when the first listed step began, and began (at the
    latest) their summed time before that."""
    listed = len(steps)
    n = int(window.steps) - listed
    if n <= 0:
        return None
    timed = [s for s in steps if s.step_seconds is not None]
    with_batch = [s for s in timed if s.batch_size is not None]
    first = [s for s in steps if s.first_batch]

    def rest(total: float, part: float) -> float:
        return max(0.0, float(total) - part)

    if steps:
        t = min(t, steps[0].t - (steps[0].step_seconds or 0.0))
    step_seconds = rest(window.step_seconds, sum(s.step_seconds or 0.0 for s in timed))
    return StepsSample(
        t=t, steps=n, pid=pid, rank=rank, gpu=gpu, begin_t=t - step_seconds,
        skipped=max(0, int(window.skipped) - sum(1 for s in steps if s.skipped)),
        timed=max(0, int(window.timed) - len(timed)),
        step_seconds=step_seconds,
        data_wait_seconds=rest(window.data_wait_seconds,
                               sum(s.data_wait_seconds or 0.0 for s in timed)),
        samples=max(0, int(window.samples) - sum(s.batch_size or 0 for s in with_batch)),
        sample_seconds=rest(window.sample_seconds,
                            sum(s.step_seconds or 0.0 for s in with_batch)),
        first_batch=max(0, int(window.iterators) - len(first)),
        first_batch_wait_seconds=rest(window.first_batch_wait_seconds,
                                      sum(s.first_batch_wait_seconds or 0.0 for s in first)),
        **_unseen_micro(window, steps))


def _unseen_micro(window: Any, steps: Sequence[StepSample]) -> dict[str, int]:
    counted = [s.micro_batches for s in steps if s.micro_batches is not None]
    n = int(getattr(window, "micro_counted", 0) or 0) - len(counted)
    if n <= 0:
        return {}
    return {"micro_batches": max(0, int(window.micro_batches) - sum(counted)),
            "micro_counted": n}


def _newest(ring: deque, since: float, slack: float = 1.0) -> list[Any]:
    """The samples of a ring kept in time order with ``t >= since``, oldest first. Read
    back ``slack`` seconds past ``since``: two ticks published at once (tick() beside the
    loop) may land a few milliseconds out of order."""
    if not ring or ring[0].t >= since:
        return list(ring)
    out = []
    stop = since - slack
    for s in reversed(ring):
        if s.t < stop:
            break
        if s.t >= since:
            out.append(s)
    out.reverse()
    return out


class Store:
    def __init__(self, history_seconds: float = 900.0, max_records: int = 20_000, *,
                 step_lines_per_second: float = STEP_LINES_PER_SECOND) -> None:
        self.history_seconds = history_seconds
        self.max_records = max_records
        self._lock = threading.Lock()
        self._published = Snapshot(t=0.0)
        # the published snapshot with the hook's jobs and counters added, built on first
        # read after a change: ticks are frequent and scrapes rare, so the tick doesn't pay
        self._latest: Snapshot | None = None
        self._gpu: dict[int, deque[GpuSample]] = {}
        self._host: deque[HostSample] = deque(maxlen=max_records)
        self._steps: deque[StepSample | StepsSample] = deque(maxlen=max_records)
        self._thinner = StepThinner(step_lines_per_second)
        self._configs: dict[tuple[int | None, int | None], ConfigSample] = {}
        self._jobs: dict[int, JobStats] = {}
        self._ends: deque[JobEnd] = deque(maxlen=1000)
        # what the hook says besides steps: phases, its own problems (trimmed by time)
        self._events: deque[PhaseSample | HookProblem] = deque(maxlen=max_records)
        self._listeners: list[Listener] = []
        self._hook_messages = 0
        self._hook_dropped: dict[str, int] = {}
        # errors of parts that are not the sampler (the hook receiver, the recorder); merged
        # into the snapshot's errors_total on read
        self._errors: dict[str, int] = {}
        # every sample older than this has been taken by the history's reader (``release``)
        self._released = -math.inf

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
            # a job that stopped stepping: what its last interval summed is due by now
            steps: list[StepSample | StepsSample] = []
            self._thinner.due(snapshot.t, steps)
            self._keep_steps(steps)
            listeners = list(self._listeners) if self._listeners else ()
        for fn in listeners:
            for g in snapshot.gpus:
                fn(g)
            if snapshot.host is not None:
                fn(snapshot.host)
            for s in steps:
                fn(s)

    def add_steps(self, steps: Iterable[StepSample | StepValues | StepsSample],
                  unseen: StepsSample | None = None) -> None:
        """Training steps, thinned per job (``StepThinner``) on their way into the history
        and to the listeners, where each is a ``StepSample`` (or, summed, a
        ``StepsSample``); ``unseen``: steps before them known only by their sums."""
        out: list[StepSample | StepsSample] = []
        with self._lock:
            if unseen is not None:
                self._thinner.add_unseen(unseen, out)
            add = self._thinner.add
            for s in steps:
                add(s, out)
            self._keep_steps(out)
            listeners = list(self._listeners)
        for fn in listeners:
            for s in out:
                fn(s)

    def flush_steps(self, pid: int | None = None) -> None:
        """Release every job's open interval (``pid``'s only, where given): at a job's end,
        and before a recording is closed."""
        out: list[StepSample | StepsSample] = []
        with self._lock:
            self._thinner.flush(out, pid)
            self._keep_steps(out)
            listeners = list(self._listeners)
        for fn in listeners:
            for s in out:
                fn(s)

    def _keep_steps(self, steps: list[StepSample | StepsSample]) -> None:
        if steps:
            # steps reach here out of time order across jobs (each job's hook reports
            # every 0.5 s): those older than what the reader has taken stay out
            released = self._released
            self._steps.extend(s for s in steps if s.t >= released)
            self._trim(self._steps, max(s.t for s in steps))

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

    def add_event(self, event: PhaseSample | HookProblem) -> None:
        """A job's phase (``PhaseSample``) or a problem of its hook (``HookProblem``):
        kept with the history and passed to the listeners (the recorder)."""
        with self._lock:
            if event.t >= self._released:
                self._events.append(event)
                self._trim(self._events, event.t)
            listeners = list(self._listeners)
        for fn in listeners:
            fn(event)

    def set_job(self, stats: JobStats) -> None:
        """Per-job aggregates from the hook; they ride along in the next snapshot."""
        with self._lock:
            self._jobs[stats.pid] = stats
            self._latest = None

    def add_job_end(self, end: JobEnd) -> None:
        """A training process ended: kept (the last 1000) and passed to the listeners (the
        recorder writes it as a `job_end` line), after what the job's last steps summed."""
        self.flush_steps(end.pid)
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

    def release(self, before: float) -> None:
        """The history's reader (the live advisor) has taken every sample older than
        ``before`` into windows of its own: they go now. Nothing else reads the history,
        so a daemon whose advisor keeps up holds the few seconds between two evaluations,
        not ``history_seconds`` of every GPU's samples; ``history_seconds`` bounds what
        it holds while the advisor falls behind."""
        with self._lock:
            if before <= self._released:
                return
            self._released = before
            for ring in (*self._gpu.values(), self._host, self._steps, self._events):
                while ring and ring[0].t < before:
                    ring.popleft()

    def clear(self) -> None:
        """Forget history (replay starting over)."""
        with self._lock:
            self._released = -math.inf
            self._gpu.clear()
            self._host.clear()
            self._steps.clear()
            self._events.clear()
            self._thinner = StepThinner(self._thinner.limit / self._thinner.interval)
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

    def step_history(self, since: float = 0.0) -> list[StepSample | StepsSample]:
        with self._lock:
            return [s for s in self._steps if s.t >= since]

    def configs(self) -> list[ConfigSample]:
        with self._lock:
            return list(self._configs.values())

    def timeline(self, since: float = 0.0) -> list[Sample]:
        """All history since ``since`` in time order: the advisor's input."""
        with self._lock:
            out: list[Sample] = []
            # GPU and host samples are kept in tick order: read back from the newest, so
            # the live advisor asking for the last few seconds pays for those, not for
            # the whole window (steps arrive out of order across jobs: all are looked at)
            for ring in (*self._gpu.values(), self._host):
                out.extend(_newest(ring, since))
            out.extend(s for s in self._steps if s.t >= since)
            out.extend(s for s in self._events if s.t >= since)
            out.extend(e for e in self._ends if e.t >= since)  # how jobs ended (an OOM)
            out.extend(self._configs.values())
        out.sort(key=lambda s: s.t)
        return out

    def _trim(self, ring: deque, now: float) -> None:
        horizon = max(now - self.history_seconds, self._released)
        while ring and ring[0].t < horizon:
            ring.popleft()
