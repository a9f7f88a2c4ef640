"""How a recorded run went over time: the HTML report's charts and `gpuwatch compare`'s
figures.

The advice report (report.py) says what a run came to; the timeline says how it got
there: per GPU, util, SM and tensor active, memory, power and clocks; per job (rank), its
step time, data wait and step-time breakdown, and the phases it went through; where each
piece of advice started and ended. It is fed the same lines as the engine
(``judge_trace``'s ``observe``) and reads the breakdown from the engine's own frame as
each bucket closes (``on_bucket``), so the charts show the report's numbers, not a second
opinion.

Values are kept per chart bucket (sums and counts), a whole number of the engine's
buckets wide, chosen so that a recording gives at most about ``MAX_POINTS`` of them.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Callable, Iterable
from typing import Any

from gpuwatch.advisor.attribution import SHARE_CATEGORIES
from gpuwatch.advisor.engine import Engine

MAX_POINTS = 400
# the fields a GPU line gives that the charts show (docs/trace-format.md)
GPU_FIELDS = ("util", "sm_active", "tensor_active", "mem_used_bytes", "power_watts",
              "sm_clock_mhz", "mem_clock_mhz")
# the phases the hook reports (`phase` lines), in the order a run goes through them
PHASES = ("startup", "compile", "train", "eval", "checkpoint", "inference")
JobKey = tuple[Any, Any]  # (pid, rank) as the hook's lines give them (None where absent)


def buckets_per_point(span_seconds: float | None, res: float) -> int:
    """How many of the engine's ``res``-wide buckets make one chart point."""
    if span_seconds is None or span_seconds <= 0:
        return 1
    return max(1, math.ceil(span_seconds / res / MAX_POINTS))


class _Job:
    """One training process's steps, as its `step`/`steps` lines tell them."""

    __slots__ = ("alloc_floor", "alloc_peak", "batch_sizes", "buckets", "config", "first_t",
                 "gpu", "last_t", "phases", "pid", "rank", "samples_after", "steps",
                 "steps_after")

    def __init__(self, pid: Any, rank: Any) -> None:
        self.pid, self.rank = pid, rank
        self.gpu: int | None = None
        self.first_t: float | None = None  # end of its first step: its span starts here
        self.last_t: float | None = None
        self.steps = 0  # every step
        self.steps_after = 0  # steps after the first (those the span's clock covers)
        self.samples_after = 0.0
        # chart bucket -> [steps, step seconds summed, timed steps, data wait summed,
        # step seconds of the steps whose data wait is known]
        self.buckets: dict[int, list[float]] = {}
        self.batch_sizes: set[int] = set()
        self.alloc_floor: float | None = None  # the allocator's least, between steps
        self.alloc_peak: float | None = None
        self.config: dict[str, Any] = {}
        self.phases: list[tuple[float, str, dict[str, float]]] = []

    def span(self) -> float | None:
        if self.first_t is None or self.last_t is None or self.last_t <= self.first_t:
            return None
        return self.last_t - self.first_t

    def samples_per_second(self) -> float | None:
        span = self.span()
        if span is None or not self.samples_after:
            return None
        return self.samples_after / span

    def add_alloc(self, alloc: Any, peak: Any) -> None:
        if alloc is not None:
            a = float(alloc)
            self.alloc_floor = a if self.alloc_floor is None else min(self.alloc_floor, a)
        if peak is not None:
            p = float(peak)
            self.alloc_peak = p if self.alloc_peak is None else max(self.alloc_peak, p)


class Timeline:
    """The course of one run, bucketed ``res`` seconds wide (``every`` engine buckets)."""

    def __init__(self, res: float, every: int = 1) -> None:
        self.res = float(res) * every
        self.every = every
        self.t0: float | None = None
        self.t1: float | None = None
        # gpu -> field -> chart bucket -> [sum, count]
        self.gpu: dict[int, dict[str, dict[int, list[float]]]] = {}
        self.gpu_facts: dict[int, dict[str, Any]] = {}
        self.jobs: dict[JobKey, _Job] = {}
        # gpu -> chart bucket -> the step-time breakdown over that bucket (the frame's)
        self.shares: dict[int, dict[int, dict[str, float]]] = {}
        self.advice: list[dict[str, Any]] = []
        self.phase_lines = 0
        self.meta: dict[str, Any] = {}

    # -- feeding ---------------------------------------------------------------------------
    def feed(self, line: Any) -> None:
        """One trace line (a checked dict, as ``iter_trace_lines`` gives them)."""
        if type(line) is not dict:
            return
        kind = line.get("kind")
        t = line.get("t")
        if not isinstance(t, (int, float)):
            return
        if self.t0 is None:
            self.t0 = t
        if self.t1 is None or t > self.t1:
            self.t1 = t
        if kind == "gpu":
            self._gpu(line, t)
        elif kind == "step":
            self._step(line, t, 1, line.get("step_seconds"), 1 if line.get(
                "step_seconds") is not None else 0)
        elif kind == "steps":
            n = int(line.get("steps") or 0)
            if n > 0:
                self._step(line, t, n, line.get("step_seconds"), int(line.get("timed") or 0))
        elif kind == "config":
            values = line.get("values")
            if not isinstance(values, dict):
                values = {k: v for k, v in line.items() if k not in ("t", "kind", "pid", "rank")}
            self._job(line).config.update(values)
        elif kind == "phase":
            self.phase_lines += 1
            self._phase(line, t)

    def _gpu(self, line: dict[str, Any], t: float) -> None:
        if line.get("lost"):
            return
        gpu = int(line["gpu"])
        fields = self.gpu.setdefault(gpu, {})
        b = int(t // self.res)
        for name in GPU_FIELDS:
            v = line.get(name)
            if v is None:
                continue
            cell = fields.setdefault(name, {}).get(b)
            if cell is None:
                fields[name][b] = [float(v), 1.0]
            else:
                cell[0] += v
                cell[1] += 1.0
        facts = self.gpu_facts.setdefault(gpu, {})
        for name in ("mem_total_bytes", "power_limit_watts"):
            v = line.get(name)
            if v is not None:
                facts[name] = max(float(v), facts.get(name, 0.0))
        if line.get("name"):
            facts["name"] = line["name"]

    def _job(self, line: dict[str, Any]) -> _Job:
        key = (line.get("pid"), line.get("rank"))
        job = self.jobs.get(key)
        if job is None:
            job = self.jobs[key] = _Job(*key)
        gpu = line.get("gpu")
        if gpu is not None:
            job.gpu = int(gpu)
        return job

    def _step(self, line: dict[str, Any], t: float, n: int, ss: Any, timed: int) -> None:
        job = self._job(line)
        job.steps += n
        job.last_t = t if job.last_t is None else max(job.last_t, t)
        bs = line.get("batch_size")
        if bs:
            job.batch_sizes.add(int(bs))
        if job.first_t is None:
            # the first step carries the run's start (CUDA init, compiling): the span,
            # like the report's, starts where it ended
            job.first_t = t
        else:
            job.steps_after += n
            samples = line.get("samples") if line.get("kind") == "steps" else bs
            if samples is None and bs:
                samples = bs * n
            job.samples_after += float(samples or 0)
        cell = job.buckets.get(int(t // self.res))
        if cell is None:
            cell = job.buckets[int(t // self.res)] = [0.0, 0.0, 0.0, 0.0, 0.0]
        cell[0] += n
        if ss is not None and timed:
            cell[1] += float(ss)  # a `steps` line's is already summed over its timed steps
            cell[2] += timed
            dw = line.get("data_wait_seconds")
            if dw is not None:
                cell[3] += float(dw)
                cell[4] += float(ss)
        job.add_alloc(line.get("mem_allocated_bytes"), line.get("max_mem_allocated_bytes"))

    def _phase(self, line: dict[str, Any], t: float) -> None:
        phase = line.get("phase")
        if not isinstance(phase, str):
            return
        seconds = line.get("seconds") if isinstance(line.get("seconds"), dict) else {}
        self._job(line).phases.append((t, phase, dict(seconds)))

    def on_bucket(self, engine: Engine, idx: int) -> None:
        """After the engine closed bucket ``idx``: at each chart bucket's end, the frame's
        step-time breakdown over that chart bucket."""
        if (idx + 1) % self.every:
            return
        b = (idx + 1) // self.every - 1
        for entry in engine.frame.jobs(idx + 1, self.every):
            gpu = entry.get("gpu")
            if gpu is not None and entry.get("time_share"):
                self.shares.setdefault(int(gpu), {})[b] = dict(entry["time_share"])

    def finish(self, engine: Engine, path: str | None = None) -> None:
        """After the engine finished: every activation of every rule, and (for a reader
        that skips `phase` lines as unknown) the phases read from the file itself."""
        for f in engine.findings:
            self.advice.append({"id": f.rule.id, "gpu": f.gpu, "severity": f.rule.severity,
                                "title": f.rule.title, "start": f.start, "end": f.ended})
        if path is not None and not self.phase_lines:
            for line in scan_phases(path):
                self.feed(line)

    # -- reading ---------------------------------------------------------------------------
    def resolve(self, report: dict[str, Any]) -> None:
        """Give each job without a GPU of its own the one the report's ``jobs`` name for
        its pid, or the only GPU."""
        by_pid = {j.get("pid"): j.get("gpu") for j in report.get("jobs", [])
                  if j.get("pid") is not None}
        gpus = [g["gpu"] for g in report.get("gpus", [])]
        for job in self.jobs.values():
            if job.gpu is None:
                job.gpu = by_pid.get(job.pid)
            if job.gpu is None and len(gpus) == 1:
                job.gpu = gpus[0]

    def x(self, b: int) -> float:
        """A chart bucket's middle, in seconds from the run's first line."""
        return (b + 0.5) * self.res - (self.t0 or 0.0)

    def gpu_series(self, gpu: int) -> dict[str, list[tuple[float, float]]]:
        """Per field, (seconds from the start, the bucket's mean) in time order."""
        out = {}
        for name, cells in self.gpu.get(gpu, {}).items():
            out[name] = [(self.x(b), s / n) for b, (s, n) in sorted(cells.items()) if n]
        return out

    def job_series(self, job: _Job) -> dict[str, list[tuple[float, float]]]:
        step, wait, rate = [], [], []
        for b, (n, ss, timed, dw, dw_ss) in sorted(job.buckets.items()):
            x = self.x(b)
            rate.append((x, n / self.res))
            if timed:
                step.append((x, ss / timed))
            if dw_ss > 0:
                wait.append((x, min(1.0, dw / dw_ss)))
        return {"step_seconds": step, "data_wait_ratio": wait, "steps_per_second": rate}

    def share_series(self, gpu: int) -> list[tuple[float, dict[str, float]]]:
        return [(self.x(b), s) for b, s in sorted(self.shares.get(gpu, {}).items())]

    def phase_spans(self, job: _Job) -> list[tuple[float, float, str]]:
        """(start, end, phase) in seconds from the run's start: each `phase` line says the
        phase the job is in at its time, until the next line (or its last step).

        Serving is read only after 10 s of it, counted from its first batch: the hook's
        first line that says inference holds those seconds, and its span begins that
        long before the line. A process read as serving that trained after all counts
        that time as an evaluation ahead of training (its seconds hold no inference): the
        span is evaluation for as long as its first line after says it evaluated, and
        start-up (the training's set-up) from there to that line."""
        t0 = self.t0 or 0.0
        lines = sorted(job.phases, key=lambda p: p[0])
        final = self.phase_seconds(job)
        evaluated_first = final is not None and not final.get("inference")
        # (from, phase), one per change of phase: each span until the next's from
        cuts: list[tuple[float, str]] = []
        served_from: float | None = None  # where the newest stretch read as serving began
        for t, phase, seconds in lines:
            served = seconds.get("inference")
            if phase == "inference" and served_from is None:
                if isinstance(served, (int, float)) and served > 0:
                    # back to its first batch: not before the stretch before it began (it
                    # goes where it is overtaken whole), nor before the recording
                    t = max(t - served, t0, cuts[-1][0] if cuts else t0)
                    if cuts and cuts[-1][0] >= t:
                        cuts.pop()
                served_from = t
            elif phase != "inference" and served_from is not None and not served:
                # its first line since the hook counts that time as evaluation (a line
                # while it served, a compilation's, still holds the inference seconds)
                ev = seconds.get("eval")
                if evaluated_first and isinstance(ev, (int, float)) and ev > 0 \
                        and served_from + ev < t:
                    cuts.append((served_from + ev, "startup"))
                served_from = None
            if not cuts or cuts[-1][1] != phase:
                cuts.append((t, phase))
        end = max(lines[-1][0], job.last_t or lines[-1][0], self.t1 or lines[-1][0]) \
            if lines else 0.0
        spans: list[tuple[float, float, str]] = []
        for i, (t, phase) in enumerate(cuts):
            if evaluated_first and phase == "inference":
                phase = "eval"
            until = cuts[i + 1][0] if i + 1 < len(cuts) else end
            if spans and spans[-1][2] == phase and abs(spans[-1][1] - (t - t0)) < 1e-9:
                spans[-1] = (spans[-1][0], until - t0, phase)
            else:
                spans.append((t - t0, until - t0, phase))
        return [s for s in spans if s[1] > s[0]]

    def phase_seconds(self, job: _Job) -> dict[str, float] | None:
        """The newest cumulative seconds per phase the job reported, None without any."""
        for _, _, seconds in reversed(job.phases):
            if seconds:
                return {k: float(v) for k, v in seconds.items()
                        if isinstance(v, (int, float))}
        return None

    def training_window(self, gpu: int | None = None) -> tuple[float, float] | None:
        """From the first step's end to the last step of the jobs (on ``gpu``)."""
        jobs = [j for j in self.jobs.values() if j.first_t is not None
                and (gpu is None or j.gpu is None or j.gpu == gpu)]
        if not jobs:
            return None
        return min(j.first_t for j in jobs), max(j.last_t for j in jobs)

    def gpu_mean(self, gpu: int, name: str, window: tuple[float, float] | None
                 ) -> float | None:
        cells = self.gpu.get(gpu, {}).get(name, {})
        lo = hi = None
        if window is not None:
            lo, hi = int(window[0] // self.res), int(window[1] // self.res)
        s = n = 0.0
        for b, (bs, bn) in cells.items():
            if lo is None or lo <= b <= hi:
                s += bs
                n += bn
        return s / n if n else None

    def gpu_max(self, gpu: int, name: str, window: tuple[float, float] | None
                ) -> float | None:
        cells = self.gpu.get(gpu, {}).get(name, {})
        lo = hi = None
        if window is not None:
            lo, hi = int(window[0] // self.res), int(window[1] // self.res)
        vals = [bs / bn for b, (bs, bn) in cells.items() if bn and (lo is None
                                                                   or lo <= b <= hi)]
        return max(vals) if vals else None


def scan_phases(path: str) -> Iterable[dict[str, Any]]:
    """The `phase` lines of a recording, read from the file itself: a reader that does
    not know the kind yet skips them. Only lines that mention a phase are parsed."""
    try:
        with open(path, "rb") as probe:
            gz = probe.read(2) == b"\x1f\x8b"
        opener: Callable[..., Any] = gzip.open if gz else open
        with opener(path, "rb") as f:
            for raw in f:
                if b'"phase"' not in raw:
                    continue
                try:
                    d = json.loads(raw)
                except (ValueError, RecursionError):
                    continue
                if isinstance(d, dict) and d.get("kind") == "phase" and isinstance(
                        d.get("t"), (int, float)):
                    yield d
    except (OSError, EOFError, zlib.error):
        return  # a file cut short or damaged: the reader says so; the charts end there


def judge_recording(path: str, ruleset: Any, shown: str | None = None
                    ) -> tuple[dict[str, Any], Timeline]:
    """A recording judged whole: the advice report (as ``gpuwatch advise --replay``) and
    its timeline."""
    from gpuwatch.advisor import sources

    span = sources.trace_span(path)
    res = sources.replay_resolution(path)
    timeline = Timeline(res, buckets_per_point(span, res))
    rep, engine, meta = sources.judge_recording(path, ruleset, shown=shown, res=res,
                                                observe=timeline.feed,
                                                on_bucket=timeline.on_bucket)
    timeline.finish(engine, path)
    timeline.resolve(rep)
    timeline.meta = dict(meta)
    return rep, timeline


__all__ = ["GPU_FIELDS", "MAX_POINTS", "PHASES", "SHARE_CATEGORIES",
           "Timeline", "buckets_per_point", "judge_recording", "scan_phases"]
