"""Windowed rule evaluation with durations, suppression, architecture gates and hysteresis.

The engine is fed samples in time order (from a recording, the live store or Prometheus)
and evaluates every rule for every GPU at the end of each time bucket. A rule becomes
active once its condition (``when``, not suppressed by ``unless`` or by a rule it defers
to) has held for ``for``; it ends only after the condition has been false for ``keep``,
so advice does not flap. The same engine serves a whole recording (every advice that was
active at some point, with evidence from the window where it held) and the live daemon
(what is active now).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.advisor.attribution import ATTRIBUTION_SIGNALS
from gpuwatch.advisor.frame import Frame, Subject
from gpuwatch.advisor.knobs import knob as knob_text
from gpuwatch.advisor.rules import Rule, RuleSet, format_value
from gpuwatch.advisor.vocabulary import VOCABULARY
from gpuwatch.advisor.windows import GROWTH_SIGNALS, growth, window_stat

SEVERITY_RANK = {"critical": 3, "warning": 2, "info": 1}
_MISSING = object()
DEFAULT_CONFIDENCE = 0.7
# how often (seconds of holding) the evidence of an active rule is re-read
REFRESH_SECONDS = 10.0
# a gauge's last value older than this is "not measured" (a source that stopped)
STALE_SECONDS = 30.0
# counters' increases and "newest value" need no full window: a new error counts at once
# training time (buckets) a window of a hook-reported job needs before it is judged
MIN_TRAIN_BUCKETS = 5
# a bare attribution signal (``share_data``) reads the share over this window
ATTRIBUTION_LAST_SECONDS = 15.0
_PARTIAL_OK = frozenset({"delta", "increase", "rate", "last", "count"})
# a training rule is judged only while its window is mostly training time (the rest:
# evaluation, checkpoints, compiling, which the hook's phases tell apart)
TRAIN_SHARE = 0.75
_TABLE_OF = {name: d.table for name, d in VOCABULARY.items()}


class _Ctx:
    """Evaluation context: one subject at one bucket end, with a per-tick cache."""

    __slots__ = ("cache", "end", "frame", "locals", "res", "stale", "subj")

    def __init__(self, frame: Frame, subj: Subject, end: int) -> None:
        self.frame = frame
        self.subj = subj
        self.end = end
        self.res = frame.res
        self.cache: dict[tuple[str, str, float], Any] = {}
        self.locals: dict[str, Any] = {}
        self.stale = max(1, math.ceil(STALE_SECONDS / frame.res))

    def window(self, fn: str, name: str, seconds: float) -> Any:
        key = (fn, name, seconds)
        v = self.cache.get(key, _MISSING)
        if v is not _MISSING:
            return v
        v = self._window(fn, name, seconds)
        self.cache[key] = v
        return v

    def _window(self, fn: str, name: str, seconds: float) -> Any:
        if name in ATTRIBUTION_SIGNALS:
            # the attribution is a quantity of a whole window, whatever the function; rules
            # read it from the end of the first step on (start-up is not judged), once
            # a few seconds of training are in
            n = max(1, round(seconds / self.res))
            warm = self.frame.train_start(self.subj)
            if warm is not None and self.end - warm < min(MIN_TRAIN_BUCKETS, n):
                return None
            a = self.frame.attribution(self.subj, self.end, n)
            return a.value(name) if a is not None else None
        if name in GROWTH_SIGNALS:
            table = self.frame.lookup_table(self.subj, "mem_allocated_bytes")
            ring = table.rings.get("mem_allocated_bytes") if table is not None else None
            got = growth(ring, self.end, max(1, round(seconds / self.res)), self.res)
            if got is None:
                return None
            return got[0] if name == "mem_allocated_growth_bytes_per_second" else got[1]
        table_kind = _TABLE_OF[name]
        if table_kind == "config":
            return self.frame.config_value(self.subj, name)
        if table_kind == "fact":
            return self.frame.fact(self.subj, name)
        table = self.frame.lookup_table(self.subj, name)
        if table is None:
            return None
        ring = table.rings.get(name)
        if ring is None:
            return None
        n = max(1, round(seconds / self.res))
        if fn not in _PARTIAL_OK:
            warm = self.frame.train_start(self.subj) if table_kind != "job" else None
            if warm is not None and self.end - warm < n:
                # a job the hook reports: its GPU and host are judged from its first step
                # on, so a window reaching back into start-up reads only training time;
                # a few seconds of it already count (warnings within 20 s of the start)
                n = self.end - warm
                if n < min(MIN_TRAIN_BUCKETS, round(seconds / self.res)):
                    return None
            # a window reaching back before the GPU was first seen is incomplete: say
            # nothing rather than judge a few seconds as if they were the whole window
            elif self.end - self.subj.first < n:
                return None
        if fn == "mean":  # most windows: straight to the prefix sums
            return ring.mean(self.end, n)
        return window_stat(ring, fn, self.end, n, self.res)

    def knob(self, name: str, old: Any, new: Any) -> str | None:
        """A setting's change in the words of the framework that drives the job."""
        framework = self.frame.config_value(self.subj, "framework")
        return knob_text(name, framework if isinstance(framework, str) else None, old, new)

    def last(self, name: str) -> Any:
        if name in self.locals:
            return self.locals[name]
        key = ("last", name, 0.0)
        v = self.cache.get(key, _MISSING)
        if v is not _MISSING:
            return v
        if name in ATTRIBUTION_SIGNALS or name in GROWTH_SIGNALS:
            v = self.window("last", name, ATTRIBUTION_LAST_SECONDS)
            self.cache[key] = v
            return v
        table_kind = _TABLE_OF[name]
        if table_kind == "config":
            v = self.frame.config_value(self.subj, name)
        elif table_kind == "fact":
            v = self.frame.fact(self.subj, name)
        else:
            table = self.frame.lookup_table(self.subj, name)
            ring = table.rings.get(name) if table is not None else None
            # step signals arrive as often as steps do: allow them a longer look back
            stale = self.stale * (10 if table_kind == "job" else 1)
            v = ring.last(self.end, stale) if ring is not None else None
        self.cache[key] = v
        return v


@dataclass
class Finding:
    """One piece of advice for one GPU (``gpu`` None: the host)."""

    rule: Rule
    gpu: int | None
    start: float
    last_seen: float
    active: bool = True
    ended: float | None = None
    held_seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)
    detail_t: float = -math.inf

    def to_json(self) -> dict[str, Any]:
        r = self.rule
        out: dict[str, Any] = {
            "id": r.id,
            "title": r.title,
            "severity": r.severity,
            "gpu": self.gpu,
        }
        out.update(self.details)
        out["active"] = self.active
        out["since"] = round(self.start, 3)
        out["last_seen"] = round(self.last_seen, 3)
        out["held_seconds"] = round(self.held_seconds, 1)
        out["rule_file"] = f"{r.file}:{r.line}"
        return out


@dataclass
class _State:
    since: float | None = None  # when the condition began to hold (continuously)
    false_since: float | None = None
    finding: Finding | None = None


Listener = Callable[[Finding], None]


class Engine:
    """Evaluates a :class:`RuleSet` over samples fed in time order."""

    def __init__(self, ruleset: RuleSet, *, res: float = 1.0,
                 on_start: Listener | None = None, on_end: Listener | None = None) -> None:
        self.ruleset = ruleset
        self.rules = ruleset.rules
        self.res = res
        keep = max((r.max_window for r in self.rules), default=60.0) + 2 * res
        self.frame = Frame(res, ruleset.signals(), keep, on_bucket=self._evaluate)
        self.states: dict[tuple[str, int | None], _State] = {}
        self.findings: list[Finding] = []  # every activation, in order
        self.on_start = on_start
        self.on_end = on_end
        self.evaluated_until: float | None = None
        self.ticks = 0
        # the report's step-time attribution: over the whole run (None, a recording) or
        # over the last this many seconds (the live daemon)
        self.jobs_window: float | None = None
        # each subject is judged by the rules of its scope, in the rule set's order
        self._gpu_rules = [r for r in self.rules if r.scope != "host"]
        self._host_rules = [r for r in self.rules if r.scope == "host"]
        self._cpu_job_rules = list(self.rules)
        # the window a training rule must find mostly training: the usual one
        self._train_window = 15.0

    # -- input --------------------------------------------------------------------------
    def feed(self, sample: Any) -> None:
        self.frame.feed(sample)

    def feed_all(self, samples: Iterable[Any]) -> None:
        feed = self.frame.feed
        for s in samples:
            feed(s)

    def advance_to(self, t: float) -> None:
        """Close every bucket that ends at or before ``t`` (live: time moves on)."""
        self.frame.flush_to(int(t // self.res))

    def finish(self) -> None:
        self.frame.finish()

    # -- evaluation -------------------------------------------------------------------------
    def _evaluate(self, idx: int) -> None:
        t = (idx + 1) * self.res
        self.evaluated_until = t
        self.ticks += 1
        frame = self.frame
        states = self.states
        for subj in list(frame.subjects.values()):
            if subj.gpu is None:
                if not frame.host_tables.ever and not subj.job.ever:
                    continue
                # a job the hook reports with no GPU in the data (CPU-only): the job's
                # rules judge it too, as far as their evidence needs no GPU
                cpu_job = len(frame.subjects) == 1 and (subj.job.ever or subj.hook_seen)
                rules = self._cpu_job_rules if cpu_job else self._host_rules
            else:
                rules = self._gpu_rules
            ctx = _Ctx(frame, subj, idx + 1)
            cc = frame.fact(subj, "compute_capability")
            holding: dict[str, bool] = {}
            phase_ok: dict[str, bool] = {}
            for rule in rules:
                if cc is not None and not rule.applies_to(cc):
                    continue
                if rule.phase != "any":
                    ok = phase_ok.get(rule.phase)
                    if ok is None:
                        ok = phase_ok[rule.phase] = self._in_phase(rule.phase, subj, idx + 1)
                    if not ok:
                        # not what the job is doing now: the rule's state stands as it is
                        holding[rule.id] = bool((st := states.get((rule.id, subj.gpu)))
                                                and st.finding and st.finding.active)
                        continue
                if rule.holds is not None:
                    cond = rule.holds(ctx)
                    if cond:
                        for u in rule.unless_holds:
                            if u(ctx):
                                cond = False
                                break
                else:  # a Rule built by hand, without the predicates
                    cond = rule.when(ctx) is True
                    if cond:
                        for _, u in rule.unless:
                            if u(ctx) is True:
                                cond = False
                                break
                if cond and rule.suppressed_by:
                    for sid in rule.suppressed_by:
                        if holding.get(sid):
                            cond = False
                            break
                holding[rule.id] = cond
                if cond or (rule.id, subj.gpu) in states:  # else: nothing held, nothing to do
                    self._step(rule, subj, ctx, cond, t)

    def _in_phase(self, phase: str, subj: Subject, end: int) -> bool:
        """Whether ``subj``'s job is doing ``phase`` (a rule's ``phase:``) at bucket ``end``.

        Without the hook's phases, training rules are judged as the data allows (NVML and
        psutil, or the hook's steps), except while a hook that reports no steps yet says
        the job is starting; rules of the other phases need the phases."""
        frame = self.frame
        owner = frame.phase_owner(subj)
        if owner is None:
            if phase != "train":
                return False
            if frame.train_start(subj) is not None:
                return True  # the hook's steps, without phases (an older hook)
            if frame.hook_attached(subj) and not frame.hook_dead(subj):
                return False  # its hook reports no step yet: starting up
            # NVML and psutil alone: once its GPU has begun to work for its process
            return subj.gpu is None or not subj.proc_pids or frame.started_work(
                subj, end, round(self._train_window / self.res))
        now = owner.phase
        if phase == "train":
            if now != "train":
                return False
            ring = owner.phase_table.rings.get("phase_train")
            n = max(1, round(self._train_window / self.res))
            warm = frame.train_start(subj)
            if warm is not None:  # windows start at the first step: so does this share
                n = max(1, min(n, end - warm))
            share = ring.mean(end, n) if ring is not None else None
            return share is None or share >= TRAIN_SHARE
        if phase == "inference":
            return now == "inference"
        if phase == "startup":
            return True
        return owner.phase_seconds.get("train", 0.0) > 0  # eval: a job that trains

    def _step(self, rule: Rule, subj: Subject, ctx: _Ctx, cond: bool, t: float) -> None:
        key = (rule.id, subj.gpu)
        st = self.states.get(key)
        if st is None:
            if not cond:
                return
            st = self.states[key] = _State()
        f = st.finding
        if cond:
            st.false_since = None
            if st.since is None:
                st.since = t - self.res
            if f is None or not f.active:
                if t - st.since >= rule.for_s - 1e-9:
                    f = Finding(rule, subj.gpu, start=t, last_seen=t)
                    st.finding = f
                    self.findings.append(f)
                    self._details(f, ctx, t)
                    if self.on_start is not None:
                        self.on_start(f)
            else:
                f.last_seen = t
                f.held_seconds += self.res
                # once the job's steps have stopped (it ended; its windows now reach into
                # the teardown), the evidence read while it trained stands
                if t - f.detail_t >= REFRESH_SECONDS and not self.frame.steps_stopped(
                        subj, ctx.end - 1):
                    self._details(f, ctx, t)
        else:
            st.since = None
            if f is not None and f.active:
                if st.false_since is None:
                    st.false_since = t - self.res
                if t - st.false_since >= rule.keep_s - 1e-9:
                    f.active = False
                    f.ended = t
                    if self.on_end is not None:
                        self.on_end(f)
            elif f is None:
                del self.states[key]

    def _details(self, f: Finding, ctx: _Ctx, t: float) -> None:
        """Evidence, numbers and text, read from the window where the rule holds now."""
        rule = f.rule
        ctx.locals = {}
        for name, fn in rule.values:
            ctx.locals[name] = fn(ctx)
        evidence: dict[str, float] = {}
        shown: dict[str, Any] = dict(ctx.locals)
        for name, fn in rule.evidence:
            v = fn(ctx)
            shown[name] = v
            if isinstance(v, bool):
                v = 1.0 if v else 0.0
            if isinstance(v, (int, float)) and math.isfinite(v):
                evidence[name] = _round(v)
        ctx.locals.update({k: v for k, v in shown.items() if k not in ctx.locals})
        subj = ctx.subj
        shown["gpu"] = subj.gpu
        cc = self.frame.fact(subj, "compute_capability")
        shown["compute_capability"] = format_value(cc, ".1f") if cc is not None else "unknown"
        shown["gpu_name"] = self.frame.fact(subj, "gpu_name") or "GPU"
        st = self.states.get((rule.id, subj.gpu))
        held = t - st.since if st is not None and st.since is not None else 0.0
        shown["held_seconds"] = held
        shown["held_minutes"] = held / 60.0
        for name in rule.template_names:
            if name not in shown and name in VOCABULARY:
                shown[name] = ctx.last(name)
        conf = rule.confidence(ctx) if rule.confidence is not None else DEFAULT_CONFIDENCE
        conf = 0.5 if not isinstance(conf, (int, float)) else min(1.0, max(0.0, float(conf)))
        gain = rule.gain(ctx) if rule.gain is not None else None
        gain = _round(max(1.0, float(gain))) if isinstance(gain, (int, float)) \
            and not isinstance(gain, bool) and math.isfinite(gain) else None
        shown["expected_gain"] = gain
        action = ""
        for a in rule.actions:
            if cc is not None and ((a.arch_min is not None and cc < a.arch_min - 1e-9)
                                   or (a.arch_max is not None and cc > a.arch_max + 1e-9)):
                continue
            if a.when is not None and a.when(ctx) is not True:
                continue
            action = a.text.render(shown)
            break
        hook = self.frame.fact(subj, "hook")
        f.details = {
            "confidence": round(conf, 2),
            "message": _clean(rule.message.render(shown)),
            "evidence": evidence,
            "action": _clean(action),
            "expected_gain": gain,
            "expected_gain_text": _clean(rule.gain_text.render(shown))
            if rule.gain_text is not None and gain is not None else None,
            "hook_would_add": _clean(rule.without_hook) if rule.without_hook and not hook
            else None,
        }
        f.detail_t = t
        ctx.locals = {}

    # -- reading -------------------------------------------------------------------------
    def jobs(self) -> list[dict[str, Any]]:
        """Step-time attribution per job and rank (the report's ``jobs``)."""
        if self.jobs_window is None:
            return self.frame.jobs()
        if self.evaluated_until is None:
            return []
        end = round(self.evaluated_until / self.res)
        return self.frame.jobs(end, max(1, round(self.jobs_window / self.res)))

    def active(self) -> list[Finding]:
        return [s.finding for s in self.states.values()
                if s.finding is not None and s.finding.active]

    def summary(self) -> list[Finding]:
        """One finding per (rule, GPU) over everything seen: the latest activation, with
        its time held summed over all of them (a recording's verdict)."""
        best: dict[tuple[str, int | None], Finding] = {}
        total: dict[tuple[str, int | None], float] = {}
        for f in self.findings:
            key = (f.rule.id, f.gpu)
            total[key] = total.get(key, 0.0) + f.held_seconds + f.rule.for_s
            best[key] = f
        for key, f in best.items():
            f.held_seconds = max(f.held_seconds, total[key] - f.rule.for_s)
        return list(best.values())


def _round(v: float) -> float:
    if v == 0 or not math.isfinite(v):
        return float(v)
    digits = 4 - math.floor(math.log10(abs(v)))
    return float(round(v, max(0, digits)))


def _clean(text: str) -> str:
    return " ".join(text.split())


def sort_key(item: dict[str, Any]) -> tuple[float, float, float, int]:
    """Most valuable first: severity, then expected gain, then confidence."""
    return (-SEVERITY_RANK.get(item.get("severity", "info"), 0),
            -(item.get("expected_gain") or 1.0), -(item.get("confidence") or 0.0),
            item["gpu"] if item.get("gpu") is not None else -1)
