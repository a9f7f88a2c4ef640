"""The advisor inside the daemon: rules evaluated continuously over the store's history.

Each evaluation feeds the samples published since the last one into a streaming
:class:`Engine` (so a tick costs what the new samples cost, not the whole history), and
the engine's hysteresis decides what starts and ends. Active advice is exported as
``gpuwatch_advice_active{rule,gpu,severity} 1`` and served at /api/advice; each piece is
logged once when it starts and once when it ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from gpuwatch.advisor import endings
from gpuwatch.advisor.engine import Engine, Finding
from gpuwatch.advisor.report import RunTally, build_report
from gpuwatch.advisor.rules import RuleSet, load_rules

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
        self.res = res
        self.engine = self._new_engine()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
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

    # -- life cycle --------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpuwatch-advisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
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

    def _new_engine(self) -> Engine:
        engine = Engine(self.ruleset, res=self.res, on_start=self._started,
                        on_end=self._ended)
        engine.jobs_window = JOBS_WINDOW_SECONDS
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
        latest = self.store.latest()
        self._set_infos(latest.infos)
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
            latest = self.store.latest()
            if latest.infos != self._infos_seen:
                self._set_infos(latest.infos)
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
        """The /api/advice body: the same JSON `gpuwatch advise --format json` prints."""
        with self._lock:
            frame = self.engine.frame
            source = {"kind": "live", "evaluated_until": self.engine.evaluated_until,
                      "start": frame.t_first, "end": frame.t_last,
                      "resolution_seconds": self.engine.res}
            nvml = bool(getattr(self.store.latest(), "nvml_available", True))
            report = build_report([(self.engine, self._active(), None)], source,
                                  tally=self.tally, no_gpu_reason=NO_GPU if nvml else NO_NVML)
            # the ends the store kept (the receiver's and the launcher's, and a replay's
            # `job_end` lines), as `advise --replay` lists them
            ended = getattr(self.store, "job_ends", None)
            if ended is not None:
                report["job_ends"] = endings.entries(
                    [*report.get("job_ends", []), *(asdict(e) for e in ended())])
            return report
