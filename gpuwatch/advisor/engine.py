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

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.advisor.attribution import ATTRIBUTION_SIGNALS
from gpuwatch.advisor.condsrc import compile_rule
from gpuwatch.advisor.expr import compile_condition, condition_parts
from gpuwatch.advisor.frame import PER_GPU_CPU, Frame, Subject
from gpuwatch.advisor.knobs import in_args_class
from gpuwatch.advisor.knobs import knob as knob_text
from gpuwatch.advisor.rules import Rule, RuleSet, format_value
from gpuwatch.advisor.vocabulary import VOCABULARY
from gpuwatch.advisor.windows import GROWTH_SIGNALS, growth, scan_stat, window_stat

log = logging.getLogger(__name__)

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
TRAIN_SHARE = 0.6
_TABLE_OF = {name: d.table for name, d in VOCABULARY.items()}


Leaf = Callable[["_Ctx"], Any]


# a recording longer than this many buckets at 1 s is judged on coarser buckets, so a
# day of 8 GPUs takes seconds (rules' windows are 15 s and more: 5 s buckets still hold)
MAX_BUCKETS = 20_000
_NICE_RES = (1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0)


def resolution_for(span_seconds: float, sample_seconds: float | None = None) -> float:
    """The bucket for a recording of ``span_seconds``: at most MAX_BUCKETS of them, and
    none shorter than the sampler's interval (``sample_seconds``): a daemon sampling every
    2 s leaves every other 1-s bucket without a GPU reading, and the rules' windows would
    hold half the seconds they name."""
    want = span_seconds / MAX_BUCKETS
    if sample_seconds is not None and sample_seconds > 0:
        want = max(want, sample_seconds * 0.999)  # (1.0 s stays 1.0 s)
    for r in _NICE_RES:
        if r >= want:
            return r
    return _NICE_RES[-1]


class _Ctx:
    """Evaluation context of one subject, moved from bucket to bucket (:meth:`at`).

    Every value a rule reads, a windowed statistic (``mean(util, 15s)``) or a newest value
    (``last(hook)``), has a *slot*: a number the engine gave it when the rules were
    compiled (:meth:`Engine._slot`), and a function computing it. ``vals`` holds this
    bucket's values by slot, so each is computed at most once per bucket and subject,
    whichever and however many rules read it.
    """

    __slots__ = ("end", "engine", "frame", "job_table", "locals", "pos", "subj", "vals",
                 "warm")

    def __init__(self, engine: Engine, subj: Subject) -> None:
        self.engine = engine
        self.frame = engine.frame
        self.subj = subj
        self.end = 0
        self.vals: list[Any] = []
        self.locals: dict[str, Any] = {}
        self.warm: Any = _MISSING  # frame.train_start(subj), once per bucket
        self.job_table: Any = _MISSING  # the table of its job's step signals, likewise
        self.pos = 0  # the subject's place in this bucket's order (Finding.order)

    def at(self, end: int) -> None:
        self.end = end
        self.vals = self.engine._blank.copy()
        self.warm = _MISSING
        self.job_table = _MISSING

    def train_start(self) -> int | None:
        warm = self.warm
        if warm is _MISSING:
            warm = self.warm = self.frame.train_start(self.subj)
        return warm

    def value(self, i: int) -> Any:
        """Slot ``i``'s value at this bucket."""
        vals = self.vals
        if i >= len(vals):  # a slot made after this bucket began (evidence)
            vals.extend([_MISSING] * (i + 1 - len(vals)))
        v = vals[i]
        if v is _MISSING:
            v = vals[i] = self.engine._computes[i](self)
        return v

    def window(self, fn: str, name: str, seconds: float) -> Any:
        return self.value(self.engine._slot((fn, name, seconds)))

    def knob(self, name: str, old: Any, new: Any) -> str | None:
        """A setting's change in the words of the framework that drives the job."""
        framework = self.frame.config_value(self.subj, "framework")
        sampler = self.frame.config_value(self.subj, "batch_sampler") \
            if name == "batch_size" else None
        return knob_text(name, framework if isinstance(framework, str) else None, old, new,
                         sampler if isinstance(sampler, str) else None, self.args_class())

    def args_class(self) -> str | None:
        """The class of the Hugging Face Trainer's arguments where the job runs under the
        Trainer and says it (``fw_args``); None otherwise."""
        if self.frame.config_value(self.subj, "framework") != "transformers":
            return None
        args = self.frame.config_value(self.subj, "fw_args")
        return args if isinstance(args, str) else None

    def last(self, name: str) -> Any:
        if self.locals and name in self.locals:
            return self.locals[name]
        return self.value(self.engine._slot(name))


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
    detail_t: float = -math.inf
    # the evidence and numbers read at detail_t; their words (message, action, gain) are
    # written when first asked for: a refresh every REFRESH_SECONDS of an advice that
    # holds for an hour is overwritten by the next long before a report reads it
    _details: dict[str, Any] = field(default_factory=dict, repr=False)
    _words: tuple[Any, ...] | None = field(default=None, repr=False)
    # where it began in the engine's order of judging: (bucket end, the subject's place,
    # the rule's place); activations sorted by it are in the order one engine makes them
    order: tuple[float, int, int] = field(default=(0.0, 0, 0), repr=False, compare=False)
    # last read while its job evaluated after its steps stopped (Engine._step)
    eval_read: bool = field(default=False, repr=False, compare=False)

    @property
    def details(self) -> dict[str, Any]:
        words = self._words
        if words is not None:
            self._words = None
            self._details = _render(self.rule, *words)
        return self._details

    @details.setter
    def details(self, value: dict[str, Any]) -> None:
        self._words = None
        self._details = value

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
        self._stale = max(1, math.ceil(STALE_SECONDS / res))
        self.frame = Frame(res, ruleset.signals(), keep, on_bucket=self._evaluate,
                           gpu_reads=self._gpu_reads())
        self.states: dict[tuple[str, int | None], _State] = {}
        # per subject, the ids of the rules with a state there (states' keys, for the loop)
        self._stated: dict[int | None, set[str]] = {}
        self.findings: list[Finding] = []  # every activation, in order
        self.on_start = on_start
        self.on_end = on_end
        self.evaluated_until: float | None = None
        self.ticks = 0
        # rules that raised (a bug in a rule or in gpuwatch): how often, and the first
        # error's words; their condition reads as not holding, the other rules go on
        self.rule_errors: dict[str, list[Any]] = {}
        self.rule_error_order: dict[str, tuple[float, int, int, str]] = {}
        # the report's step-time attribution: over the whole run (None, a recording) or
        # over the last this many seconds (the live daemon)
        self.jobs_window: float | None = None
        # each subject is judged by the rules of its scope, in the rule set's order
        self._gpu_rules = [r for r in self.rules if r.scope != "host"]
        self._rule_pos = {r.id: i for i, r in enumerate(self.rules)}
        self._whole_run = frozenset(r.id for r in self.rules if r.whole_run)
        # which subjects this engine judges, by GPU index (None: the host); None: all.
        # A recording split over processes (split.py) gives each its share: the frame is
        # fed and bucketed whole in each, so every rule reads what it would read alone
        self.judges: Callable[[int | None], bool] | None = None
        self._host_rules = [r for r in self.rules if r.scope == "host"]
        self._cpu_job_rules = list(self.rules)
        # the window a training rule must find mostly training: the usual one
        self._train_window = 15.0
        # (scope, compute capability) -> what to ask of each rule that applies there
        self._plans: dict[tuple[str, float | None], list[tuple[Any, ...]]] = {}
        # ids of rules another rule defers to: only their verdicts need keeping per bucket
        self._suppressors = {sid for r in self.rules for sid in r.suppressed_by}
        # the values rules read: slot numbers, what computes each, a bucket's empty row
        self._slots: dict[Any, int] = {}
        self._computes: list[Leaf] = []
        self._readers: list[Leaf] = []  # what a condition calls to read each slot
        self._blank: list[Any] = []
        self._ctxs: dict[int | None, _Ctx] = {}
        # per subject, the bucket of the newest step whose stop its findings were read at
        # (_closing_read)
        self._closed_at: dict[int | None, int] = {}
        # this bucket's memory fits, by ring and window: a ring may serve several subjects
        self._fits: dict[tuple[Any, int], Any] = {}
        # each rule's when and unless as one function reading the slots directly
        # (condsrc), else as closures over them
        self._compiled: dict[str, Callable[[Any], bool]] = {}
        for rule in self.rules:
            if rule.when_node is not None:
                self._compiled[rule.id] = compile_rule(
                    rule.when_node, rule.unless_nodes, self._slot_of, self._reader, _MISSING,
                    f"<rule {rule.id}, {rule.file}:{rule.line}>") or _holds(
                    tuple(condition_parts(rule.when_node, self._reader)),
                    tuple(compile_condition(n, self._reader) for n in rule.unless_nodes))

    def _gpu_reads(self) -> dict[str, int] | None:
        """How many buckets back the rules read each GPU signal's ring, as the slots
        compiled below read it (None: a rule built by hand, whose reads are not known)."""
        out: dict[str, int] = {}
        for rule in self.rules:
            if rule.reads is None:
                return None
            for name, seconds in rule.reads.items():
                if name in ATTRIBUTION_SIGNALS:
                    continue  # its inputs are read over any window: kept whole
                if name in GROWTH_SIGNALS:  # the fit of its source
                    name = GROWTH_SIGNALS[name][0]
                    seconds = seconds or ATTRIBUTION_LAST_SECONDS
                if _TABLE_OF.get(name) != "gpu":
                    continue
                # a window's buckets, or a newest value's look back (_compile_last)
                n = max(1, round(seconds / self.res)) if seconds > 0 else self._stale
                out[name] = max(out.get(name, 0), n)
        return out

    def judge_only(self, judged: Callable[[int | None], bool]) -> None:
        """Ask the rules about the subjects ``judged`` only (by GPU index; None: the
        host), as a process judging its share of a recording does (split.py); the GPUs
        not judged here are bucketed lightly (Frame.judge_only): what no reader here asks
        of them is not kept. Before any sample."""
        self.frame.judge_only(judged)
        self.judges = judged

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

    # -- slots: what rules read, compiled once ---------------------------------------------
    def _slot(self, key: Any) -> int:
        """The slot of ``key``: ``(fn, name, seconds)`` (a window), ``name`` (the newest
        value) or ``("growth", n)`` (the memory fit both growth signals read)."""
        i = self._slots.get(key)
        if i is None:
            # numbered first: compiling may make the slots it reads (the memory fit)
            i = self._slots[key] = len(self._computes)
            self._computes.append(None)  # type: ignore[arg-type]
            self._readers.append(None)  # type: ignore[arg-type]
            self._blank.append(_MISSING)
            compute = self._computes[i] = self._compile(key, i)
            # the windows and newest values keep their own value in the slot (one call a
            # read, not two: the most read values); the rest are kept by a reader
            self._readers[i] = compute if getattr(compute, "keeps_slot", False) \
                else _keeping(i, compute)
        return i

    def _reader(self, fn: str, name: str, seconds: float) -> Leaf:
        """expr.LeafFactory: a value of a condition read straight from its slot, computed
        at most once per bucket."""
        return self._slot_of(fn, name, seconds)[1]

    def _slot_of(self, fn: str, name: str, seconds: float) -> tuple[int, Leaf]:
        """condsrc.SlotOf: the slot of a value a condition reads, and its reader."""
        i = self._slot(name if fn == "last" and seconds == 0.0 else (fn, name, seconds))
        return i, self._readers[i]

    def _compile(self, key: Any, i: int) -> Leaf:
        if isinstance(key, str):
            return self._compile_last(key, i)
        if key[0] == "growth":
            return self._compile_growth(key[1], key[2])
        return self._compile_window(*key, i)

    def _compile_growth(self, source: str, n: int) -> Leaf:
        """The least-squares fit of ``source`` (torch's allocated memory, or the GPU's
        used memory) over ``n`` buckets."""
        res = self.res
        find = self._table_finder(source)
        fits = self._fits

        def fit(ctx: _Ctx) -> Any:
            table = find(ctx)
            ring = table.rings.get(source) if table is not None else None
            if ring is None:
                return None
            # GPUs that share one job's steps (steps no GPU was named for) share its ring:
            # the fit is made once per bucket for all of them
            key = (ring, n)
            got = fits.get(key, _MISSING)
            if got is _MISSING:
                got = fits[key] = growth(ring, ctx.end, n, res)
            return got
        return fit

    def _compile_window(self, fn: str, name: str, seconds: float, i: int) -> Leaf:
        frame, res = self.frame, self.res
        n = max(1, round(seconds / res))
        if name in ATTRIBUTION_SIGNALS:
            # the attribution is a quantity of a whole window, whatever the function; rules
            # read it from the end of the first step on (start-up is not judged), once
            # a few seconds of training are in
            least = min(MIN_TRAIN_BUCKETS, n)

            def attribution(ctx: _Ctx) -> Any:
                warm = ctx.train_start()
                if warm is not None and ctx.end - warm < least:
                    return None
                a = frame.attribution(ctx.subj, ctx.end, n)
                return a.value(name) if a is not None else None
            return attribution
        if name in GROWTH_SIGNALS:
            # the slope and its R^2 come from one fit, made once per bucket
            source, pick = GROWTH_SIGNALS[name]
            j = self._slot(("growth", source, n))

            def grown(ctx: _Ctx) -> Any:
                got = ctx.value(j)
                return None if got is None else got[pick]
            return grown
        table_kind = _TABLE_OF[name]
        if table_kind == "config":
            return lambda ctx: frame.config_value(ctx.subj, name)
        if table_kind == "fact":
            return lambda ctx: frame.fact(ctx.subj, name)
        find = self._table_finder(name)
        if fn in _PARTIAL_OK:
            # counters' increases and the newest value need no full window
            if fn == "last":
                return _newest(i, find, name, n)

            def partial(ctx: _Ctx) -> Any:
                vals = ctx.vals
                v = vals[i]
                if v is _MISSING:
                    table = find(ctx)
                    ring = table.rings.get(name) if table is not None else None
                    v = vals[i] = window_stat(ring, fn, ctx.end, n, res) \
                        if ring is not None else None
                return v
            partial.keeps_slot = True  # type: ignore[attr-defined]
            return partial
        least = min(MIN_TRAIN_BUCKETS, round(seconds / res))
        job = table_kind == "job"
        gpu = table_kind == "gpu"
        mean = fn == "mean"

        def full(ctx: _Ctx) -> Any:
            vals = ctx.vals
            v = vals[i]
            if v is not _MISSING:  # read before in this bucket
                return v
            v = None
            subj = ctx.subj
            if gpu:  # frame.lookup_table's first case, without the call
                table = subj.gpu_table if subj.gpu is not None else None
            else:
                table = find(ctx)
            ring = table.rings.get(name) if table is not None else None
            if ring is not None:
                end = ctx.end
                if job:
                    warm = None
                else:
                    warm = ctx.warm
                    if warm is _MISSING:
                        warm = ctx.train_start()
                if warm is not None and end - warm < n:
                    # a job the hook reports: its GPU and host are judged from its first
                    # step on, so a window reaching back into start-up reads only training
                    # time; a few seconds of it already count (warnings within 20 s of
                    # the start)
                    m = end - warm
                    if m >= least:
                        v = scan_stat(ring, fn, end, m, res)  # shortened: no view for it
                elif job or end - subj.first >= n:
                    # (a window reaching back before the GPU was first seen is incomplete:
                    # it says nothing rather than judge a few seconds as the whole window;
                    # a job's own signals begin with its steps, and their window is the
                    # job's life so far until it is longer)
                    if mean:  # most windows: straight to the prefix sums (Ring.mean)
                        base = ring.base
                        e = base + len(ring.vals)
                        e = (end if end < e else e) - base  # min(), without the call
                        s = e - n if e > n else 0
                        if e < s:
                            e = s
                        pw = ring.pw
                        w = pw[e] - pw[s]
                        if w > 0:
                            v = (ring.psum[e] - ring.psum[s]) / w
                    else:
                        v = window_stat(ring, fn, end, n, res)
            vals[i] = v
            return v
        full.keeps_slot = True  # type: ignore[attr-defined]
        return full

    def _compile_last(self, name: str, i: int) -> Leaf:
        """``last(name)``: the newest value, within how long a source may be silent."""
        frame = self.frame
        if name in ATTRIBUTION_SIGNALS or name in GROWTH_SIGNALS:
            j = self._slot(("last", name, ATTRIBUTION_LAST_SECONDS))
            return lambda ctx: ctx.value(j)
        table_kind = _TABLE_OF[name]
        if table_kind == "config":
            return lambda ctx: frame.config_value(ctx.subj, name)
        if table_kind == "fact":
            return lambda ctx: frame.fact(ctx.subj, name)
        find = self._table_finder(name)
        # step signals arrive as often as steps do: allow them a longer look back
        stale = self._stale * (10 if table_kind == "job" else 1)
        return _newest(i, find, name, stale)

    def _table_finder(self, name: str) -> Leaf:
        """``frame.lookup_table(subj, name)`` as a function of the context. What a bucket
        cannot change is not asked again: a host signal's table, and a subject's job
        table, found once per subject and bucket for all its step signals."""
        frame = self.frame
        kind = _TABLE_OF[name]
        if kind == "gpu":
            def gpu_table(ctx: _Ctx) -> Any:
                subj = ctx.subj
                return subj.gpu_table if subj.gpu is not None else None
            return gpu_table
        if kind == "host" and name not in PER_GPU_CPU:
            host = frame.host_tables
            return lambda ctx: host
        lookup = frame.lookup_table
        if kind == "job":
            def job_table(ctx: _Ctx) -> Any:
                table = ctx.job_table
                if table is _MISSING:
                    table = ctx.job_table = lookup(ctx.subj, name)
                return table
            return job_table
        return lambda ctx: lookup(ctx.subj, name)

    def _plan(self, scope: str, cc: float | None) -> list[tuple[Any, ...]]:
        """The rules a subject of this scope (``gpu``, ``host``, or ``cpu_job``: a job the
        hook reports with no GPU in the data) and compute capability is judged by, in
        order, each with what the loop asks of it."""
        plan = []
        rules = {"gpu": self._gpu_rules, "host": self._host_rules,
                 "cpu_job": self._cpu_job_rules}[scope]
        for rule in rules:
            if cc is not None and not rule.applies_to(cc):
                continue
            test = self._compiled.get(rule.id)
            if test is None:
                if rule.holds is not None:
                    test = _holds((rule.holds,), rule.unless_holds)
                else:  # a Rule built by hand, without the predicates
                    when = rule.when
                    test = _holds((lambda ctx, when=when: when(ctx) is True,),  # noqa: E731
                                  tuple((lambda ctx, u=u: u(ctx) is True)
                                        for _, u in rule.unless))
            # the phase to be in, with the training share it asks (the key of the cache of
            # _in_phase's answers per subject and bucket)
            phase = None if rule.phase == "any" else (
                rule.phase, TRAIN_SHARE if rule.train_share is None else rule.train_share)
            plan.append((rule, rule.id, phase, test,
                         rule.suppressed_by, rule.id in self._suppressors))
        self._plans[(scope, cc)] = plan
        return plan

    # -- evaluation -------------------------------------------------------------------------
    def _context(self, subj: Subject, end: int) -> Any:
        """``subj``'s evaluation context at bucket end ``end``."""
        ctx = self._ctxs.get(subj.gpu)
        if ctx is None or ctx.subj is not subj:
            ctx = self._ctxs[subj.gpu] = _Ctx(self, subj)
        ctx.at(end)
        return ctx

    def _evaluate(self, idx: int) -> None:
        t = (idx + 1) * self.res
        self.evaluated_until = t
        self.ticks += 1
        self._fits.clear()
        frame = self.frame
        if frame.trained_after_serving:
            self._withdraw_serving(frame.trained_after_serving, t)
        plans = self._plans
        stated = self._stated
        states = self.states
        judges = self.judges
        for pos, subj in enumerate(list(frame.subjects.values())):
            if judges is not None and not judges(subj.gpu):
                continue
            host = subj.gpu is None
            if host:
                if not frame.host_tables.ever and not subj.job.ever:
                    continue
                # a job the hook reports with no GPU in the data (CPU-only): the job's
                # rules judge it too, as far as their evidence needs no GPU
                scope = ("cpu_job" if len(frame.subjects) == 1
                         and (subj.job.ever or subj.hook_seen) else "host")
            else:
                scope = "gpu"
            live = stated.get(subj.gpu)
            if live and not live.isdisjoint(self._whole_run):
                self._closing_read(subj, live, idx, t)
            ctx = self._context(subj, idx + 1)
            ctx.pos = pos
            cc = frame.fact(subj, "compute_capability")
            plan = plans.get((scope, cc))
            if plan is None:
                plan = self._plan(scope, cc)
            holding: dict[str, bool] = {}
            phase_ok: dict[tuple[str, float], bool] = {}
            live = stated.get(subj.gpu)
            if live is None:
                live = stated[subj.gpu] = set()
            over = None
            for rule, rid, phase, test, suppressed_by, suppresses in plan:
                if phase is not None:
                    if over is None:
                        over = frame.job_over(subj, idx)
                    if over:
                        # the job ended (its hook's exit report, or its process gone from
                        # NVML's list) before this bucket: its phases' rules hold no more
                        # and start nothing (the windows after it hold its last seconds
                        # beside the idle GPU it left)
                        if suppresses:
                            holding[rid] = False
                        if rid in live:
                            self._step(rule, subj, ctx, False, t)
                        continue
                    ok = phase_ok.get(phase)
                    if ok is None:
                        ok = phase_ok[phase] = self._in_phase(*phase, subj, idx + 1)
                    if not ok:
                        # not what the job is doing now: the rule's state stands as it is
                        if suppresses:
                            st = states.get((rid, subj.gpu))
                            holding[rid] = bool(st and st.finding and st.finding.active)
                        continue
                # a condition stops at its first conjunct that is not true (its first
                # window, for most rules), then asks its unless clauses
                try:
                    cond = test(ctx)
                except Exception as err:  # noqa: BLE001 - one rule's failure is its own
                    cond = self._rule_failed(rule, subj, err)
                if cond and suppressed_by:
                    for sid in suppressed_by:
                        if holding.get(sid):
                            cond = False
                            break
                if suppresses:
                    holding[rid] = cond
                if cond or rid in live:  # else: nothing held, nothing to do
                    self._step(rule, subj, ctx, cond, t)

    def _withdraw_serving(self, owners: list[Subject], t: float) -> None:
        """The processes that speak for ``owners``' jobs were read as serving a model and
        trained after all: the hook counts that time as an evaluation ahead of training
        now (docs/hook.md, "Phases"). Advice of the inference phase on their subjects was
        read from a phase that was not, and is withdrawn: gone from the findings (a live
        one ends now)."""
        frame = self.frame
        owned = {id(o) for o in owners}
        owners.clear()
        gone = [f for f in self.findings if f.rule.phase == "inference"
                and (s := frame.subjects.get(f.gpu)) is not None
                and id(frame.phase_owner(s)) in owned]
        if not gone:
            return
        drop = {id(f) for f in gone}
        self.findings = [f for f in self.findings if id(f) not in drop]
        for f in gone:
            key = (f.rule.id, f.gpu)
            st = self.states.get(key)
            if st is not None and st.finding is f:
                del self.states[key]
                self._stated.get(f.gpu, set()).discard(f.rule.id)
            if f.active:
                f.active = False
                f.ended = t
                if self.on_end is not None:
                    self.on_end(f)

    def _rule_failed(self, rule: Rule, subj: Subject, err: Exception,
                     part: str = "condition") -> bool:
        """A rule raised: said once per rule (with its file and line) and counted; where
        it raised its condition does not hold. The rules after it are judged as ever."""
        seen = self.rule_errors.get(rule.id)
        if seen is not None:
            seen[0] += 1
            return False
        where = "the host" if subj.gpu is None else f"GPU {subj.gpu}"
        said = f"{type(err).__name__}: {err}"
        self.rule_errors[rule.id] = [1, f"{rule.file}:{rule.line}", part, said]
        ctx = self._ctxs.get(subj.gpu)
        # where it first failed, in the order of Finding.order (split.merge keeps the
        # earliest of several processes')
        self.rule_error_order[rule.id] = (self.evaluated_until or 0.0,
                                          ctx.pos if ctx is not None else 0,
                                          self._rule_pos.get(rule.id, 0), where)
        then = ("where it fails it does not hold" if part == "condition" else
                "its advice stands without the numbers it failed to read")
        log.error("rule %s (%s:%s) failed evaluating its %s on %s (%s): %s; the other rules "
                  "go on (said once per rule)", rule.id, rule.file, rule.line, part, where,
                  said, then,
                  exc_info=(type(err), err, err.__traceback__))
        return False

    def _in_phase(self, phase: str, share_asked: float, subj: Subject, end: int) -> bool:
        """Whether ``subj``'s job is doing ``phase`` (a rule's ``phase:``) at bucket ``end``;
        for ``train``, with at least ``share_asked`` of the window training (the rule's
        ``train_share``).

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
            # NVML and psutil alone: once its GPU has begun to work for its process (where
            # NVML lists no process on it, once it has begun to work at all: a rank whose
            # DataLoader workers prefetch before it touched its GPU is starting up)
            return subj.gpu is None or frame.started_work(
                subj, end, round(self._train_window / self.res))
        now = owner.phase
        if phase == "train":
            ring = owner.phase_table.rings.get("phase_train")
            # training now, or the newest closed bucket (the one before this: its share is
            # written when it closes) mostly training: the phase at a bucket's last instant
            # flickers where validation runs every fraction of a second (Lightning's
            # BoringModel: an epoch of 64 steps and a validation of 64 batches, 5 a second)
            if now != "train":
                newest = ring.mean(end - 1, 1) if ring is not None else None
                if newest is None or newest < 0.5:
                    return False
            n = max(1, round(self._train_window / self.res))
            warm = frame.train_start(subj)
            if warm is not None:  # windows start at the first step: so does this share
                n = max(1, min(n, end - warm))
            share = ring.mean(end, n) if ring is not None else None
            return share is None or share >= share_asked
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
            self._stated.setdefault(subj.gpu, set()).add(rule.id)
        f = st.finding
        if cond:
            st.false_since = None
            if st.since is None:
                st.since = t - self.res
            if f is None or not f.active:
                if t - st.since >= rule.for_s - 1e-9:
                    f = Finding(rule, subj.gpu, start=t, last_seen=t,
                                order=(t, ctx.pos, self._rule_pos.get(rule.id, 0)))
                    st.finding = f
                    self.findings.append(f)
                    self._details(f, ctx, t)
                    if self.on_start is not None:
                        self.on_start(f)
            else:
                f.last_seen = t
                f.held_seconds += self.res
                # refreshed at the first bucket of each REFRESH_SECONDS of the clock, not
                # of the finding's own: the findings of one rule on the ranks of a job read
                # their job-wide values (job_busy_in_steps) at the same moment, so they say
                # the same number. Once the job's steps have stopped (it ended; its windows
                # now reach into the teardown), the evidence read while it trained stands;
                # so does a training rule's, without the hook, once its process stopped
                # looking like it trains (the GPU's util at 58 %, read 6 s after an H100
                # at 97 % finished: `fw_accel_clm_launch_bare`)
                stale = t // REFRESH_SECONDS > f.detail_t // REFRESH_SECONDS
                closing = rule.phase == "eval" and self.frame.ended_pids \
                    and self._ends_evaluating(f, subj, ctx.end - 1)
                if stale or f.eval_read or closing:
                    if not self.frame.steps_stopped(subj, ctx.end - 1) and not (
                            rule.phase == "train"
                            and self.frame.bare_work_stopped(subj, ctx.end - 1)):
                        # (read again at once where it was last read in an evaluation
                        # after the steps, which is over now: its closing numbers)
                        self._details(f, ctx, t)
                        f.eval_read = False
                    elif (stale or closing) and self._evaluating_after_steps(rule, subj):
                        self._details(f, ctx, t)
                        f.eval_read = True
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
                self._stated[subj.gpu].discard(rule.id)

    def _closing_read(self, subj: Subject, live: set[str], idx: int, t: float) -> None:
        """Once ``subj``'s job's steps have stopped (it ended, or went on to evaluate or
        to wait), its active findings of rules whose evidence is the run's so far
        (``whole_run: true``: seconds and counts since the first step) read it once more
        as it stood at its last step: the windows end with that step's bucket (not in the
        teardown after it), and the counts are the run's closing ones (read every
        REFRESH_SECONDS of the clock, the last ten seconds' saves were missed:
        `fw_lightning_cnn_ckpt_ddp` said 34 of its 40). Other rules' evidence (windows of
        the last seconds) stands as read while it trained; so does one read at or after
        that bucket, and an evaluation's rule read while the job evaluates after its
        steps (_evaluating_after_steps)."""
        frame = self.frame
        if not frame.steps_stopped(subj, idx):
            return
        owner = frame._job_table(subj)[1]
        last = owner.job_last
        if last is None or self._closed_at.get(subj.gpu) == last:
            return
        self._closed_at[subj.gpu] = last
        end = last + 1
        ctx = None
        for rid in list(live & self._whole_run):
            st = self.states.get((rid, subj.gpu))
            f = st.finding if st is not None else None
            if f is None or not f.active or not f.rule.whole_run \
                    or f.detail_t >= end * self.res \
                    or self._evaluating_after_steps(f.rule, subj):
                continue
            if ctx is None:
                ctx = _Ctx(self, subj)
                ctx.at(end)
            self._details(f, ctx, t)

    def _ends_evaluating(self, f: Finding, subj: Subject, idx: int) -> bool:
        """Whether ``subj``'s job ended (its hook's `job_end` line) in bucket ``idx`` or
        before, evaluating after its steps, since ``f`` was last read: its closing
        numbers are read then, not at the clock's next refresh, which comes after the
        job is gone (the Trainer's evaluate() after train(), 5 s of its 23 s of
        evaluation, was left out: `fw_hf_eval_epoch`)."""
        end = self.frame.job_end_bucket(subj)
        return end is not None and end <= idx and f.detail_t < (end + 1) * self.res

    def _evaluating_after_steps(self, rule: Rule, subj: Subject) -> bool:
        """An evaluation's rule while the job evaluates after its steps stopped (the
        Trainer's evaluate() and predict() after train(), Lightning's test() after fit()):
        its evidence, the run's evaluation and training seconds, goes on growing, so it is
        read again as for a job that trains; other rules' evidence stands as read while it
        trained (its windows reach into the end)."""
        if rule.phase != "eval":
            return False
        owner = self.frame.phase_owner(subj)
        return owner is not None and owner.phase == "eval"

    def _details(self, f: Finding, ctx: _Ctx, t: float) -> None:
        """Evidence, numbers and text, read from the window where the rule holds now;
        where the rule's evidence raises, its advice stands with the numbers it had (none,
        at its start) and the error is said as for a condition (``_rule_failed``)."""
        try:
            self._read_details(f, ctx, t)
        except Exception as err:  # noqa: BLE001 - the advice stands without its numbers
            self._rule_failed(f.rule, ctx.subj, err, "evidence")
            if f.detail_t == -math.inf:  # its first reading: words from no numbers
                hook = bool(self.frame.fact(ctx.subj, "hook"))
                f._words = ({"gpu": ctx.subj.gpu}, {}, DEFAULT_CONFIDENCE, None, None, hook,
                            ctx.args_class())
                f.detail_t = t
            ctx.locals = {}

    def _read_details(self, f: Finding, ctx: _Ctx, t: float) -> None:
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
        action = None
        for a in rule.actions:
            if cc is not None and ((a.arch_min is not None and cc < a.arch_min - 1e-9)
                                   or (a.arch_max is not None and cc > a.arch_max + 1e-9)):
                continue
            if a.when is not None and a.when(ctx) is not True:
                continue
            action = a.text
            break
        hook = self.frame.fact(subj, "hook")
        # the words are rendered from these when the details are read (Finding.details)
        f._words = (shown, evidence, round(conf, 2), gain, action, bool(hook),
                    ctx.args_class())
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


def _newest(i: int, find: Leaf, name: str, look_back: int) -> Leaf:
    """The newest value of ``name`` within ``look_back`` buckets, kept in slot ``i`` for
    the rest of the bucket (``find`` gives the subject's table)."""
    def newest(ctx: _Ctx) -> Any:
        vals = ctx.vals
        v = vals[i]
        if v is _MISSING:
            table = find(ctx)
            ring = table.rings.get(name) if table is not None else None
            v = vals[i] = ring.last(ctx.end, look_back) if ring is not None else None
        return v
    newest.keeps_slot = True  # type: ignore[attr-defined]
    return newest


def _render(rule: Rule, shown: dict[str, Any], evidence: dict[str, float], conf: float,
            gain: float | None, action: Any, hook: bool,
            args_class: str | None) -> dict[str, Any]:
    """A finding's details: the numbers read at its refresh and the rule's words (the
    Trainer's ``TrainingArguments(`` in the job's own arguments class, ``args_class``)."""
    return {
        "confidence": conf,
        "message": _clean(in_args_class(rule.message.render(shown), args_class)),
        "evidence": evidence,
        "action": _clean(in_args_class(action.render(shown), args_class))
        if action is not None else "",
        "expected_gain": gain,
        "expected_gain_text": _clean(rule.gain_text.render(shown))
        if rule.gain_text is not None and gain is not None else None,
        "hook_would_add": _clean(rule.without_hook.render(shown))
        if rule.without_hook is not None and not hook else None,
    }


def _holds(parts: tuple[Callable[[Any], bool], ...],
           unless: tuple[Callable[[Any], bool], ...]) -> Callable[[Any], bool]:
    """Every part true, in order (stopping at the first that is not), and no unless."""
    def holds(ctx: Any) -> bool:
        for part in parts:
            if not part(ctx):
                return False
        for u in unless:
            if u(ctx):
                return False
        return True
    return holds


def _keeping(i: int, compute: Leaf) -> Leaf:
    """A reader of slot ``i`` that computes it at most once per bucket."""
    def read(ctx: _Ctx) -> Any:
        v = ctx.vals[i]
        if v is _MISSING:
            v = ctx.vals[i] = compute(ctx)
        return v
    return read


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
