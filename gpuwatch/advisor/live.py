"""The advisor inside the daemon: rules evaluated continuously over the store's history.

Each evaluation feeds the samples published since the last one into a streaming
:class:`Engine` (so a tick costs what the new samples cost, not the whole history), and
the engine's hysteresis decides what starts and ends. Active advice is exported as
``gpuwatch_advice_active{rule,gpu,severity} 1`` and served at /api/advice; each piece is
logged once when it starts and once when it ends.

/api/advice is right from the first request. Sampling, it judges what has come so far
(evaluated on request, not only every ``interval``) and, until the rules' windows are
full, says it is warming up and for how long (``warming_up``). Replaying a recording
(:meth:`LiveAdvisor.judge_ahead`), it answers with the whole recording judged ahead, the
report `gpuwatch advise --replay FILE` prints, while the live engine follows the replay
for ``gpuwatch_advice_active``.
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from gpuwatch import threads
from gpuwatch.advisor import endings
from gpuwatch.advisor.engine import Engine, Finding, resolution_for
from gpuwatch.advisor.report import HOOK_NOTE, RunTally, build_report, inference_batches
from gpuwatch.advisor.rules import RuleSet, human_duration, human_percent, load_rules

log = logging.getLogger(__name__)

# samples newer than this are left for the next evaluation: the hook's step datagrams
# can arrive a little after the tick that covers them
LAG_SECONDS = 2.0
# what /api/advice says it judged (how long a job trained, how busy its GPU was): the
# recent past, as long as the training rules' longest windows
TALLY_SECONDS = 120.0
NO_NVML = ("NVML is not available on this host (no NVIDIA driver, or it failed to load), "
           "so the daemon samples the host only")
NO_GPU = "NVML found no GPU on this host"
# the live step-time attribution (/api/advice jobs, gpuwatch_train_time_share_ratio) covers
# this much recent time
JOBS_WINDOW_SECONDS = 30.0
# /api/advice brings the evaluation up to date when the last one is older than this
FRESH_SECONDS = 1.0
# a request waits this long for a recording being judged ahead before it answers that it
# is warming up (the bundled demo takes a fraction of a second)
AHEAD_WAIT_SECONDS = 3.0


def warmup_seconds(ruleset: RuleSet) -> float:
    """How much data most rules need before they can speak: the median, over the rules
    that read windows, of the longest window plus how long the condition must hold (the
    built-in training rules: a 15 s window held 10 s)."""
    needs = [r.max_window + r.for_s for r in ruleset.rules if r.max_window > 0]
    return float(statistics.median(needs)) if needs else 0.0


class AdviceCollector:
    """Prometheus collector of the active advice (built fresh on every scrape).

    Example exposition::

        gpuwatch_advice_active{gpu="0",rule="raise-batch-size",severity="warning"} 1.0
        gpuwatch_advice_start_timestamp_seconds{gpu="0",rule="raise-batch-size",...} 1.79e+09
    """

    def __init__(self, advisor: LiveAdvisor) -> None:
        self._advisor = advisor

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        active = GaugeMetricFamily("gpuwatch_advice_active",
                                   "Advice active now (1), by rule, GPU and severity.",
                                   labels=["rule", "gpu", "severity"])
        start = GaugeMetricFamily("gpuwatch_advice_start_timestamp_seconds",
                                  "When the active advice started (Unix seconds).",
                                  labels=["rule", "gpu", "severity"])
        try:
            findings = self._advisor.active()
        except Exception:  # a scrape must not fail because the advisor did
            log.exception("reading the active advice failed")
            findings = []
        for f in findings:
            labels = [f.rule.id, "" if f.gpu is None else str(f.gpu), f.rule.severity]
            active.add_metric(labels, 1.0)
            start.add_metric(labels, f.start)
        yield active
        yield start
        from gpuwatch.serve.exporter import time_share_families

        try:
            jobs = self._advisor.jobs()
        except Exception:  # the attribution must not fail the scrape either
            log.exception("reading the step-time attribution failed")
            jobs = []
        yield from time_share_families(jobs)


class LiveAdvisor:
    """Evaluates the rules over ``store.timeline()`` every ``interval`` seconds."""

    def __init__(self, store: Any, config: Any = None, *, interval: float = 5.0,
                 ruleset: RuleSet | None = None, res: float = 1.0) -> None:
        self.store = store
        self.interval = float(interval)
        dirs = tuple(getattr(config, "rules_dirs", ()) or ())
        self.ruleset = ruleset if ruleset is not None else load_rules(dirs)
        # how long each GPU sample's readings cover (the sampler's interval): the frame
        # pairs them with the second they describe
        self.sample_seconds = float(getattr(config, "interval", None) or 1.0)
        # buckets no shorter than that interval (--interval 2: 2-s buckets, each with its
        # reading, as a recording made so is judged)
        self.res = max(float(res), resolution_for(0.0, self.sample_seconds))
        self.engine = self._new_engine()
        self._lock = threading.Lock()
        self._loop = threads.Periodic(self._tick, self.interval, "gpuwatch-advisor")
        self._fed_until: float | None = None
        self._fed_at_edge: set[int] = set()
        self._infos_seen: tuple[Any, ...] = ()
        self.tally = RunTally(window=TALLY_SECONDS)
        self.last_evaluation: float | None = None
        # loop points of a replay not yet reached by the evaluation (appended by the
        # replay's thread: deque appends and pops are atomic)
        self._boundaries: deque[float] = deque()
        # advice active when the data last started over, shown until this segment
        # judges the same (rule, GPU) again or reaches its own loop point without it
        self._held: dict[tuple[str, int | None], Finding] = {}
        self.segments = 1
        self.warmup = warmup_seconds(self.ruleset)
        self.started_at = time.time()
        self._ahead: _Ahead | None = None

    # -- life cycle --------------------------------------------------------------------
    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    @property
    def running(self) -> bool:
        return self._loop.running

    def _tick(self) -> None:
        try:
            self.evaluate()
        except Exception:  # one bad evaluation must not end the advisor
            log.exception("advisor evaluation failed")

    # -- segments ----------------------------------------------------------------------------
    def new_segment(self, t: float) -> None:
        """The data starts over at ``t`` (a replay looped back to its first line): no
        window may reach across it, so what comes from ``t`` on is judged by a fresh
        engine. Safe to call from another thread."""
        self._boundaries.append(float(t))
        if self._ahead is not None:
            self._ahead.refresh()  # a recording that grew is judged again

    def judge_ahead(self, path: str, shown: str | None = None) -> None:
        """A recording is being replayed: /api/advice answers with the whole of it judged
        ahead (in a thread of its own, started now), as `gpuwatch advise --replay` does;
        ``shown`` names it in the report."""
        self._ahead = _Ahead(path, shown, self.ruleset)
        self._ahead.refresh()

    def _new_engine(self) -> Engine:
        engine = Engine(self.ruleset, res=self.res, on_start=self._started,
                        on_end=self._ended)
        engine.jobs_window = JOBS_WINDOW_SECONDS
        engine.frame.sample_seconds = self.sample_seconds
        return engine

    def _restart(self, t: float, configs: list[Any]) -> None:
        old = self.engine
        old.advance_to(t)  # judge everything before the loop point on its own
        # held over from the loop point before and not judged again since: ended
        for f in self._held.values():
            self._end_held(f, t)
        self._held = {(f.rule.id, f.gpu): f for f in old.active()}
        self.engine = self._new_engine()
        self.tally = RunTally(window=TALLY_SECONDS)
        self.segments += 1
        self._infos_seen = ()  # told to the new engine once it has data (evaluate)
        for c in configs:
            self.engine.feed(c)

    def _end_held(self, f: Finding, t: float) -> None:
        f.active = False
        f.ended = t
        self._ended(f)

    def _set_infos(self, infos: tuple[Any, ...]) -> None:
        self._infos_seen = infos
        for info in infos:
            self.engine.frame.set_gpu_info(info.gpu, name=info.name,
                                           cc=info.compute_capability, gpm=info.gpm_supported)

    # -- evaluation --------------------------------------------------------------------------
    def evaluate(self) -> None:
        """Feed what the store gained since the last call and evaluate up to now - lag."""
        with self._lock:
            self._evaluate()

    def _evaluate(self) -> None:
        latest = self.store.latest()
        since = self._fed_until if self._fed_until is not None else 0.0
        samples = self.store.timeline(since)
        newest = max((s.t for s in samples if type(s).__name__ != "ConfigSample"),
                     default=None)
        if newest is None:
            return
        horizon = newest - LAG_SECONDS
        if self._fed_until is not None and horizon <= self._fed_until:
            return
        edge: set[int] = set()
        feed = self.engine.feed
        configs = [s for s in samples if type(s).__name__ == "ConfigSample"]
        bounds = self._boundaries
        for s in samples:
            t = s.t
            if type(s).__name__ == "ConfigSample":
                feed(s)  # a setting is state: feeding it again changes nothing
                continue
            if t > horizon:
                break
            if self._fed_until is not None and (t < self._fed_until or (
                    t == self._fed_until and id(s) in self._fed_at_edge)):
                continue
            while bounds and t >= bounds[0]:
                self._restart(bounds.popleft(), configs)
                feed = self.engine.feed
            feed(s)
            self.tally.feed(s)
            if t == horizon:
                edge.add(id(s))
        self._fed_at_edge = edge
        self._fed_until = horizon
        # what is older than the horizon is in the engine's windows now: the store need not
        # hold it (the horizon's own samples stay: the next read starts there)
        release = getattr(self.store, "release", None)
        if release is not None:
            release(horizon)
        # the GPUs' facts once the engine has data: a GPU made known before its first
        # sample would have its windows read as complete from the start
        if latest.infos != self._infos_seen and self.engine.frame.t_first is not None:
            self._set_infos(latest.infos)
        self.engine.advance_to(horizon)
        self.last_evaluation = time.time()

    def _started(self, f: Finding) -> None:
        if self._held.pop((f.rule.id, f.gpu), None) is not None:
            return  # the same advice as before the loop point: not news
        where = "host" if f.gpu is None else f"GPU {f.gpu}"
        log.info("advice started: %s on %s (%s): %s", f.rule.id, where, f.rule.severity,
                 f.details.get("message", f.rule.title))

    def _ended(self, f: Finding) -> None:
        where = "host" if f.gpu is None else f"GPU {f.gpu}"
        log.info("advice ended: %s on %s after %.0f s", f.rule.id, where, f.held_seconds)

    # -- surfaces -------------------------------------------------------------------------
    def active(self) -> list[Finding]:
        with self._lock:
            return self._active()

    def _active(self) -> list[Finding]:
        now = self.engine.active()
        if not self._held:
            return list(now)
        keys = {(f.rule.id, f.gpu) for f in now}
        return list(now) + [f for k, f in self._held.items() if k not in keys]

    def jobs(self) -> list[dict[str, Any]]:
        with self._lock:
            return self.engine.jobs()

    def collector(self) -> AdviceCollector:
        return AdviceCollector(self)

    def report_json(self) -> dict[str, Any]:
        """The /api/advice body: the same JSON `gpuwatch advise --format json` prints.

        Replaying, the recording judged ahead (waiting a moment for it the first time);
        else, or until that is ready, what has been judged so far, brought up to date
        first, with ``warming_up`` while that is less than the rules need."""
        ahead = self._ahead
        if ahead is not None:
            got = ahead.report(wait=AHEAD_WAIT_SECONDS)
            if got is not None:
                return got
        with self._lock:
            if self.last_evaluation is None or time.time() - self.last_evaluation > FRESH_SECONDS:
                self._evaluate()
            return self._live_report(ahead)

    def _live_report(self, ahead: _Ahead | None) -> dict[str, Any]:
        frame = self.engine.frame
        source = {"kind": "live", "evaluated_until": self.engine.evaluated_until,
                  "start": frame.t_first, "end": frame.t_last,
                  "resolution_seconds": self.engine.res}
        latest = self.store.latest()
        nvml = bool(getattr(latest, "nvml_available", True))
        waiting = self._not_judged_yet(latest)
        report = build_report([(self.engine, self._active(), None)], source,
                              tally=self.tally,
                              no_gpu_reason=waiting or (NO_GPU if nvml else NO_NVML))
        # the ends the store kept (the receiver's and the launcher's, and a replay's
        # `job_end` lines), as `advise --replay` lists them
        ended = getattr(self.store, "job_ends", None)
        if ended is not None:
            report["job_ends"] = endings.entries(
                [*report.get("job_ends", []), *(asdict(e) for e in ended())],
                inference_batches(report.get("jobs", [])))
        judged = 0.0
        if self.engine.evaluated_until is not None and frame.t_first is not None:
            judged = max(0.0, self.engine.evaluated_until - frame.t_first)
        report["warming_up"] = None
        if ahead is not None:
            # what the live engine saw so far says nothing of the recording's hook data
            report["notes"] = [n for n in report["notes"] if n != HOOK_NOTE]
            report["warming_up"] = ahead.warming_up()
        elif judged < self.warmup:
            # nothing judged yet: the first samples still have the lag to wait out
            left = self.warmup - judged + (LAG_SECONDS if judged == 0 else 0.0)
            report["warming_up"] = {
                "judged_seconds": round(judged, 1), "needed_seconds": self.warmup,
                "ready_in_seconds": round(left, 1),
                "reason": f"the advisor has judged {human_duration(judged)} of data, and most "
                          f"rules need {human_duration(self.warmup)} (a window to fill, then "
                          f"a time to hold): their advice can come in about "
                          f"{human_duration(left)}"}
        return report

    def _not_judged_yet(self, latest: Any) -> str | None:
        """Why the report has no GPU yet though the host may have some: no sample yet, or
        none old enough to judge (the advisor waits for late step datagrams)."""
        if self.engine.frame.gpus():
            return None
        if latest.infos:
            return (f"no GPU sample is old enough to judge (the advisor judges samples "
                    f"{LAG_SECONDS:g} s old, so that late training-step reports count)")
        if not getattr(latest, "nvml_available", True):
            return None  # known: no NVML here (NO_NVML says so)
        health = getattr(latest, "health", None)
        if getattr(health, "ticks_total", 1) == 0 and not latest.gpus:
            since = time.time() - self.started_at
            return f"no sample yet: the daemon started {human_duration(since)} ago"
        return None


class _Ahead:
    """A recording judged whole in a thread of its own; judged again when the file
    changed (a recording still being written), keeping the last report meanwhile."""

    def __init__(self, path: str, shown: str | None, ruleset: RuleSet) -> None:
        self.path = path
        self.shown = shown
        self.ruleset = ruleset
        self._lock = threading.Lock()
        self._report: dict[str, Any] | None = None
        self._error: str | None = None
        self._stamp: tuple[int, float] | None = None  # the file's (size, mtime) judged
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._began = 0.0
        self._span: float | None = None  # the recording's seconds, for progress
        self._t0: float | None = None
        self._t: float | None = None
        self._created = time.monotonic()

    def _file_stamp(self) -> tuple[int, float] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_size, st.st_mtime

    def refresh(self) -> None:
        """Judge the file (again) unless it is unchanged or a judgement is under way."""
        stamp = self._file_stamp()
        with self._lock:
            if (self._thread is not None and self._thread.is_alive()) or (
                    stamp is not None and stamp == self._stamp):
                return
            self._stamp = stamp
            self._thread = threads.Thread(target=self._judge, name="gpuwatch-judge-ahead",
                                          daemon=True)
            self._thread.start()

    def _judge(self) -> None:
        from gpuwatch.advisor.sources import recording_report, trace_span

        self._began = time.monotonic()
        self._span = trace_span(self.path)
        self._t0 = self._t = None

        def seen(line: Any) -> None:
            t = line.get("t") if type(line) is dict else getattr(line, "t", None)
            if t is not None:
                if self._t0 is None:
                    self._t0 = t
                self._t = t

        try:
            got = recording_report(self.path, self.ruleset, shown=self.shown, observe=seen)
        except Exception as err:  # the replay and the live advice go on without it
            log.warning("judging %s ahead failed: %s; /api/advice follows the replay",
                        self.path, err)
            with self._lock:
                self._error = str(err)
            self._ready.set()
            return
        got["notes"] = [*got["notes"], (
            "A recording served as if live: this is the whole recording judged ahead, as "
            "`gpuwatch advise --replay` judges it; gpuwatch_advice_active follows the "
            "replay as it plays.")]
        with self._lock:
            self._report = got
            self._error = None
        self._ready.set()

    def report(self, wait: float) -> dict[str, Any] | None:
        """The latest report, or None. Until the first is ready, a request waits for it,
        but only within ``wait`` s of the judging's start: later ones answer at once."""
        if not self._ready.is_set():
            self._ready.wait(max(0.0, wait - (time.monotonic() - self._created)))
        with self._lock:
            if self._report is None:
                return None
            out = dict(self._report)
        out["generated_at"] = round(time.time(), 3)
        out["warming_up"] = None
        return out

    def warming_up(self) -> dict[str, Any]:
        with self._lock:
            if self._error is not None:
                return {"judged_seconds": None, "needed_seconds": None,
                        "ready_in_seconds": None,
                        "reason": f"judging the recording ahead failed ({self._error}); "
                                  "this is what the replay has served so far"}
        done = None
        if self._span and self._t is not None and self._t0 is not None:
            done = min(1.0, max(0.0, (self._t - self._t0) / self._span))
        elapsed = time.monotonic() - self._began
        left = elapsed * (1 - done) / done if done else None
        how = (f"{human_percent(done)} done, about {human_duration(left)} left"
               if left is not None and done is not None
               else "just begun")
        return {"judged_seconds": None if done is None or self._span is None
                else round(done * self._span, 1),
                "needed_seconds": self._span, "ready_in_seconds":
                None if left is None else round(left, 1),
                "reason": f"judging the recording ahead ({how}); until then, this is what the "
                          "replay has served so far"}
