"""Serve a ``gpuwatch-trace/1`` recording as if it were live.

The recording is read as a stream (never wholly in memory) and played in real time, or
``speed`` times faster:

- the ``gpu`` and ``host`` lines of one tick (the same ``t``, or within half a sample
  period of the tick's first line) become one ``Snapshot``;
- ``step`` and ``steps`` lines go to ``Store.add_steps`` and, aggregated, to
  ``Store.set_job`` as ``JobStats`` (see ``_Job``); ``config`` lines go to ``Store.set_config``.

Every ``t`` is shifted so the recording's first line happens now: a sample recorded at
``t0 + d`` is published at (and stamped with) ``start + d / speed``. Durations inside
samples (``step_seconds``) are not scaled. At the end, with ``loop``, it starts over one
sample period after the last line: time keeps increasing, counters keep rising, and step
numbers continue where the last pass ended rather than starting at 0 again. A file that
grows during the replay (a recording still being written) is played up to where it ended
when each pass began; what was appended joins the next pass. ``on_loop``
hears where each new pass begins, so the live advisor judges each pass on its own (the
end of one pass and the start-up of the next are no one run).

Jobs are keyed by the ``pid`` of their step lines. A recording whose step lines carry no
pid (those of FORMAT v1 may not) has its steps credited to the one process seen on a GPU in
the recording, or to the synthetic pid 0 when there is not exactly one.

Replay opens no socket and never touches NVML.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from itertools import pairwise

from gpuwatch import threads
from gpuwatch.errors import GpuwatchError, UserError
from gpuwatch.samples import (
    ConfigSample,
    GpuInfo,
    GpuSample,
    Health,
    HookProblem,
    HostSample,
    JobStats,
    PhaseSample,
    Snapshot,
    StepSample,
    StepsSample,
)
from gpuwatch.store import Store
from gpuwatch.trace.format import iter_trace, meta_infos

log = logging.getLogger(__name__)

JOB_WINDOW_SECONDS = 2.0  # step time, data wait and throughput are judged over this much
SYNTHETIC_PID = 0
_GPM_FIELDS = ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp16_active",
               "fp32_active", "fp64_active")


# one step line, or one `steps` line, as the job window sums it: (t, timed steps, their
# step time, data wait (None: not measured) and its step time, batch sizes and their time)
_Part = tuple[float, int, float, float | None, float, int | None, float]


def _part(s: StepSample | StepsSample) -> _Part:
    if isinstance(s, StepsSample):
        ss = s.step_seconds or 0.0
        dw = s.data_wait_seconds if s.timed else None
        return (s.t, s.timed, ss, dw, ss if dw is not None else 0.0, s.samples,
                s.sample_seconds or 0.0)
    ss = s.step_seconds
    if ss is None:
        return (s.t, 0, 0.0, None, 0.0, None, 0.0)
    dw = s.data_wait_seconds
    return (s.t, 1, ss, dw, ss if dw is not None else 0.0, s.batch_size,
            ss if s.batch_size is not None else 0.0)


@dataclass
class _Job:
    """Running aggregates of one job's step (and `steps`) lines, across passes."""

    pid: int
    rank: int | None = None
    gpu: int | None = None
    steps_total: int = 0
    skipped_total: int = 0
    step_base: int = 0  # added to recorded step numbers in this pass
    first_step: int | None = None  # the lowest and highest step numbers of this pass
    last_step: int | None = None
    last: StepSample | StepsSample | None = None
    window: deque[_Part] = field(default_factory=deque)

    def add(self, step: StepSample | StepsSample) -> None:
        if isinstance(step, StepsSample):
            self.steps_total += step.steps
            self.skipped_total += step.skipped or 0
            lo, hi = step.first_step, step.last_step
        else:
            self.steps_total += 1
            if step.skipped:
                self.skipped_total += 1
            lo = hi = step.step
        self.rank = step.rank if step.rank is not None else self.rank
        self.gpu = step.gpu if step.gpu is not None else self.gpu
        if lo is not None and hi is not None:
            self.first_step = lo if self.first_step is None else min(self.first_step, lo)
            self.last_step = hi if self.last_step is None else max(self.last_step, hi)
        self.last = step
        self.window.append(_part(step))
        # the window is in recorded time, so it means the same at any replay speed
        while self.window and self.window[0][0] < step.t - JOB_WINDOW_SECONDS:
            self.window.popleft()

    def next_pass(self) -> None:
        if self.first_step is not None and self.last_step is not None:
            self.step_base += self.last_step - self.first_step + 1
        self.first_step = self.last_step = None
        self.window.clear()

    def stats(self, t: float, default_gpu: int | None) -> JobStats:
        w = self.window
        timed = sum(p[1] for p in w)
        waits = [(p[3], p[4]) for p in w if p[1] and p[3] is not None]
        batches = [(p[5], p[6]) for p in w if p[1] and p[5] is not None]
        last = self.last
        return JobStats(
            pid=self.pid,
            rank=self.rank,
            gpu=self.gpu if self.gpu is not None else default_gpu,
            t=t,
            steps_total=self.steps_total,
            skipped_steps_total=self.skipped_total,
            step_seconds=sum(p[2] for p in w) / timed if timed else None,
            data_wait_ratio=_ratio(waits),
            loss_scale=last.loss_scale if last else None,
            samples_per_second=_ratio(batches),
            mem_allocated_bytes=last.mem_allocated_bytes if last else None,
            mem_reserved_bytes=last.mem_reserved_bytes if last else None,
            max_mem_allocated_bytes=last.max_mem_allocated_bytes if last else None,
        )


def _ratio(pairs: list[tuple[float, float]]) -> float | None:
    """sum(num) / sum(den); None when there is nothing."""
    total = sum(d for _, d in pairs)
    return sum(n for n, _ in pairs) / total if pairs and total > 0 else None


class Replayer:
    """Plays a recording into a Store: ``start()``, ``stop()``; ``infos`` once constructed.

    The whole file is checked when the Replayer is made (one streaming pass), so a bad file
    fails at start with every problem listed, not minutes into a replay.
    """

    def __init__(self, store: Store, path: str, *, loop: bool = True, speed: float = 1.0) -> None:
        if not speed > 0:
            raise UserError(f"replay speed must be above 0, got {speed!r}")
        self.store = store
        self.path = path
        self.loop = loop
        self.speed = float(speed)
        self.passes = 0  # completed passes over the file
        self.ticks_total = 0
        self.finished = threading.Event()  # set when a replay without loop has ended
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._jobs: dict[int, _Job] = {}
        self._errors: dict[str, int] = {}
        # called with the (wall) time each new pass starts at: a consumer that judges
        # windows of history (the live advisor) must not let one reach across it
        self.on_loop: Callable[[float], None] | None = None
        self._scan()

    # -- set-up: one pass to validate and learn the shape of the recording --------------
    def _scan(self) -> None:
        meta, samples = iter_trace(self.path)
        self.meta = meta
        first: dict[int, GpuSample] = {}
        gpm: set[int] = set()
        gpu_pids: set[int] = set()
        tick_times: list[float] = []
        self.first_t: float | None = None
        self.last_t: float | None = None
        for s in samples:
            if self.first_t is None:
                self.first_t = s.t
            self.last_t = s.t
            if isinstance(s, GpuSample):
                first.setdefault(s.gpu, s)
                if any(getattr(s, f) is not None for f in _GPM_FIELDS):
                    gpm.add(s.gpu)
                gpu_pids.update(p.pid for p in s.processes)
            if (isinstance(s, (GpuSample, HostSample)) and len(tick_times) < 1000
                    and (not tick_times or s.t != tick_times[-1])):
                tick_times.append(s.t)
        hz = meta.get("sample_hz")
        if isinstance(hz, (int, float)) and hz > 0:
            self.period = 1.0 / hz
        elif len(tick_times) > 1:
            self.period = statistics.median(b - a for a, b in pairwise(tick_times))
        else:
            self.period = 1.0
        self.default_pid = gpu_pids.pop() if len(gpu_pids) == 1 else SYNTHETIC_PID
        known = meta_infos(meta)
        infos = []
        for index in sorted(set(first) | set(known)):
            base = known.get(index) or known.get(0) or GpuInfo(gpu=index)
            line = first.get(index)
            infos.append(replace(
                base, gpu=index,
                uuid=(line.uuid if line is not None and line.uuid else None) or base.uuid,
                mem_total_bytes=(line.mem_total_bytes if line is not None else None)
                or base.mem_total_bytes,
                gpm_supported=index in gpm))
        self.infos: tuple[GpuInfo, ...] = tuple(infos)
        self._default_gpu = self.infos[0].gpu if len(self.infos) == 1 else None

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threads.Thread(target=self._run, name="gpuwatch-replay", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    # -- the play loop -----------------------------------------------------------------------
    def _run(self) -> None:
        if self.first_t is None or self.last_t is None:
            log.warning("%s holds no samples; nothing to replay", self.path)
            self.finished.set()
            return
        base = time.time()  # when (in wall time) this pass's first recorded line happens
        try:
            while not self._stop.is_set():
                # a pass plays what the file held up to ``end`` (its last line when the
                # pass began); lines a writer appends meanwhile wait for the next pass, so
                # time never runs back at a loop and nothing is played in a burst
                end = self.last_t
                grown = self._play(base, end)
                if self._stop.is_set():
                    break
                self.store.flush_steps()  # what the pass's last steps summed
                self.passes += 1
                if not self.loop:
                    self._end_jobs(base + (end - self.first_t) / self.speed)
                    break
                for job in self._jobs.values():
                    job.next_pass()
                base += (end - self.first_t + self.period) / self.speed
                self.last_t = max(end, grown)
                if self.on_loop is not None:
                    try:
                        self.on_loop(base)
                    except Exception:  # the replay goes on whatever a listener does
                        log.exception("a loop listener failed")
        except GpuwatchError as err:  # the file changed under us since the scan
            self._errors["replay"] = self._errors.get("replay", 0) + 1
            log.error("replay stopped: %s", err)
        finally:
            self.finished.set()

    def _play(self, base: float, end: float) -> float:
        """One pass over the lines up to ``end``; the last ``t`` the file holds now."""
        assert self.first_t is not None
        first_t, speed, half = self.first_t, self.speed, self.period / 2
        group: list[GpuSample | HostSample] = []
        steps: list[StepSample | StepsSample] = []
        _meta, samples = iter_trace(self.path)

        def at(t: float) -> float:
            return base + (t - first_t) / speed

        newest = end
        for s in samples:
            if s.t > end:  # appended since the pass began: the next pass plays it
                newest = max(newest, s.t)
                continue
            due = at(s.t)
            delay = due - time.time()
            if delay > 0.002:
                # about to sleep: what is already due goes out first
                self._publish_steps(steps)
                if group and s.t - group[0].t > half:
                    self._publish_group(group, at(group[0].t))
                    group = []
                if self._stop.wait(delay):
                    return newest
            if isinstance(s, (GpuSample, HostSample)):
                if group and s.t - group[0].t > half:
                    self._publish_steps(steps)
                    self._publish_group(group, at(group[0].t))
                    group = []
                group.append(s)
            elif isinstance(s, StepSample):
                job = self._job_for(s)
                steps.append(replace(s, t=due, step=s.step + job.step_base))
                job.add(s)
            elif isinstance(s, StepsSample):
                job = self._job_for(s)
                offset = job.step_base  # (not ``base``: at() reads that one)
                steps.append(replace(
                    s, t=due, begin_t=None if s.begin_t is None else at(s.begin_t),
                    first_step=None if s.first_step is None else s.first_step + offset,
                    last_step=None if s.last_step is None else s.last_step + offset))
                job.add(s)
            elif isinstance(s, ConfigSample):
                self._publish_steps(steps)
                self.store.set_config(replace(s, t=due))
            elif isinstance(s, (PhaseSample, HookProblem)):
                self._publish_steps(steps)
                self.store.add_event(replace(s, t=due))
        self._publish_steps(steps)
        if group:
            self._publish_group(group, at(group[0].t))
        return newest

    def _job_for(self, step: StepSample | StepsSample) -> _Job:
        pid = step.pid if step.pid is not None else self.default_pid
        job = self._jobs.get(pid)
        if job is None:
            job = self._jobs[pid] = _Job(pid=pid)
        return job

    def _publish_steps(self, steps: list[StepSample | StepsSample]) -> None:
        if not steps:
            return
        self.store.add_steps(list(steps))
        t = steps[-1].t
        touched = {s.pid if s.pid is not None else self.default_pid for s in steps}
        steps.clear()
        for pid in touched:
            self.store.set_job(self._jobs[pid].stats(t, self._default_gpu))

    def _publish_group(self, group: Iterable[GpuSample | HostSample], t: float) -> None:
        gpus: dict[int, GpuSample] = {}
        host: HostSample | None = None
        for s in group:
            if isinstance(s, GpuSample):
                gpus[s.gpu] = replace(s, t=t)
            else:
                host = replace(s, t=t)
        self.ticks_total += 1
        health = Health(ticks_total=self.ticks_total, tick_seconds=None,
                        errors_total=dict(self._errors), last_success_time=t)
        self.store.publish(Snapshot(
            t=t, gpus=tuple(gpus[i] for i in sorted(gpus)), infos=self.infos, host=host,
            health=health, nvml_available=bool(self.infos)))

    def _end_jobs(self, t: float) -> None:
        # the recording is over, and so is every job in it
        for job in self._jobs.values():
            self.store.set_job(replace(job.stats(t, self._default_gpu), alive=False,
                                       exit_reason="exited"))

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a replay without ``loop`` to reach its end; True once it has."""
        return self.finished.wait(timeout)
