"""The incremental evaluation gives the advice the plain one gives, recording by recording.

The engine keeps its windowed statistics incrementally (monotonic deques, sorted windows,
counters that held still, one value per (signal, function, window) per bucket shared by
every rule) and stops a condition at its first operand that is not true. The reference
here is the evaluation as it was before that: every window read by a pass over the ring,
every condition evaluated whole, a fresh context per subject and bucket, under the
engine's own loop (so whatever the loop decides, gates and states, is the same on both
sides and only the evaluation is compared). The reference keeps every ring as long as the
longest window (the rules' reads are withheld from it), where the engine keeps each GPU
signal only as far back as its readers look. Both judge every
recording in tests/data through ``gpuwatch advise --replay`` (the CLI's code, in process,
with the engine swapped) and must agree on the report and on every activation: which
rule, which GPU, when it began and ended, and its evidence.

The reference's window statistics are written out below on purpose (a slow copy of what
the engine computed before), so that a change to gpuwatch/advisor/windows.py is checked
against them rather than against itself.
"""

from __future__ import annotations

import io
import json
import math
import random
from contextlib import redirect_stdout
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import RECORDINGS, recording_name

from gpuwatch import cli
from gpuwatch.advisor import engine as engine_mod
from gpuwatch.advisor import sources
from gpuwatch.advisor.attribution import ATTRIBUTION_SIGNALS
from gpuwatch.advisor.knobs import knob as knob_text
from gpuwatch.advisor.rules import RuleSet, load_rules
from gpuwatch.advisor.vocabulary import VOCABULARY
from gpuwatch.advisor.windows import GROWTH_SIGNALS, Ring, scan_stat, window_stat

# whatever recordings are there now
_MISSING = object()
_PCT = {"median": 0.5, "p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}


# -- the reference: windows read by a pass over the ring -----------------------------------
def _span(ring: Ring, end: int, n: int) -> tuple[int, int]:
    e = min(end, ring.base + len(ring.vals)) - ring.base
    s = max(0, e - n)
    return s, max(s, e)


def _values(ring: Ring, end: int, n: int) -> list[float]:
    s, e = _span(ring, end, n)
    return [v for v in ring.vals[s:e] if v is not None]


def _mean(ring: Ring, end: int, n: int) -> float | None:
    # the prefix sums, as the engine has always read a mean (the same float result)
    s, e = _span(ring, end, n)
    w = ring.pw[e] - ring.pw[s]
    return None if w <= 0 else (ring.psum[e] - ring.psum[s]) / w


def _last(ring: Ring, end: int, n: int) -> float | None:
    s, e = _span(ring, end, n)
    for v in reversed(ring.vals[s:e]):
        if v is not None:
            return v
    return None


def _increase(vals: list[float]) -> float | None:
    if len(vals) < 2:
        return None if not vals else 0.0
    if vals[0] == vals[-1] and min(vals) == max(vals):
        return 0.0
    if vals == sorted(vals):
        return vals[-1] - vals[0]
    total, prev = 0.0, vals[0]
    for v in vals[1:]:
        total += v - prev if v >= prev else v
        prev = v
    return total


def _percentile(vals: list[float], q: float) -> float:
    vals = sorted(vals)
    if len(vals) == 1:
        return vals[0]
    pos = q * (len(vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def reference_stat(ring: Ring, fn: str, end: int, n: int, res: float) -> float | None:
    if fn in ("mean", "avg"):
        return _mean(ring, end, n)
    if fn == "last":
        return _last(ring, end, n)
    vals = _values(ring, end, n)
    if fn == "count":
        return float(len(vals))
    if not vals:
        return None
    if fn == "min":
        return min(vals)
    if fn == "max":
        return max(vals)
    if fn == "first":
        return vals[0]
    if fn in _PCT:
        return _percentile(vals, _PCT[fn])
    if fn == "stddev":
        m = sum(vals) / len(vals)
        return math.sqrt(sum((v - m) ** 2 for v in vals) / len(vals))
    if fn in ("delta", "increase"):
        return _increase(vals)
    if fn == "rate":
        inc = _increase(vals)
        return None if inc is None else inc / (n * res)
    raise ValueError(fn)


def reference_growth(ring: Ring | None, end: int, n: int, res: float
                     ) -> tuple[float, float] | None:
    if ring is None:
        return None
    s, e = _span(ring, end, n)
    pts = [(i, v) for i, v in enumerate(ring.vals[s:e]) if v is not None]
    if len(pts) < 5:
        return None
    k = len(pts)
    mx = sum(p[0] for p in pts) / k
    my = sum(p[1] for p in pts) / k
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    sxy = sum((p[0] - mx) * (p[1] - my) for p in pts)
    syy = sum((p[1] - my) ** 2 for p in pts)
    if sxx <= 0:
        return None
    slope = sxy / sxx
    r2 = (sxy * sxy) / (sxx * syy) if syy > 0 else 0.0
    return slope / res, r2


class ReferenceCtx:
    """One subject at one bucket end, every value computed on request (cached per call)."""

    def __init__(self, frame: Any, subj: Any, end: int) -> None:
        self.frame, self.subj, self.end, self.res = frame, subj, end, frame.res
        self.cache: dict[Any, Any] = {}
        self.locals: dict[str, Any] = {}
        self.stale = max(1, math.ceil(engine_mod.STALE_SECONDS / frame.res))

    def window(self, fn: str, name: str, seconds: float) -> Any:
        key = (fn, name, seconds)
        if key not in self.cache:
            self.cache[key] = self._window(fn, name, seconds)
        return self.cache[key]

    def _window(self, fn: str, name: str, seconds: float) -> Any:
        frame, subj, end, res = self.frame, self.subj, self.end, self.res
        n = max(1, round(seconds / res))
        if name in ATTRIBUTION_SIGNALS:
            warm = frame.train_start(subj)
            if warm is not None and end - warm < min(engine_mod.MIN_TRAIN_BUCKETS, n):
                return None
            a = frame.attribution(subj, end, n)
            return a.value(name) if a is not None else None
        if name in GROWTH_SIGNALS:
            source, pick = GROWTH_SIGNALS[name]
            table = frame.lookup_table(subj, source)
            ring = table.rings.get(source) if table is not None else None
            got = reference_growth(ring, end, n, res)
            return None if got is None else got[pick]
        kind = VOCABULARY[name].table
        if kind == "config":
            return frame.config_value(subj, name)
        if kind == "fact":
            return frame.fact(subj, name)
        table = frame.lookup_table(subj, name)
        ring = table.rings.get(name) if table is not None else None
        if ring is None:
            return None
        if fn not in ("delta", "increase", "rate", "last", "count"):
            warm = frame.train_start(subj) if kind != "job" else None
            if warm is not None and end - warm < n:
                n = end - warm
                if n < min(engine_mod.MIN_TRAIN_BUCKETS, round(seconds / res)):
                    return None
            elif kind != "job" and end - subj.first < n:
                return None  # (a job's own signals: its life so far, see engine.full)
        return reference_stat(ring, fn, end, n, res)

    def knob(self, name: str, old: Any, new: Any) -> Any:
        framework = self.frame.config_value(self.subj, "framework")
        sampler = self.frame.config_value(self.subj, "batch_sampler")
        args = self.frame.config_value(self.subj, "fw_args")
        return knob_text(name, framework if isinstance(framework, str) else None, old, new,
                         sampler if name == "batch_size" and isinstance(sampler, str)
                         else None,
                         args if framework == "transformers" and isinstance(args, str)
                         else None)

    def args_class(self) -> Any:
        framework = self.frame.config_value(self.subj, "framework")
        args = self.frame.config_value(self.subj, "fw_args")
        return args if framework == "transformers" and isinstance(args, str) else None

    def last(self, name: str) -> Any:
        if name in self.locals:
            return self.locals[name]
        if name in ATTRIBUTION_SIGNALS or name in GROWTH_SIGNALS:
            return self.window("last", name, engine_mod.ATTRIBUTION_LAST_SECONDS)
        kind = VOCABULARY[name].table
        if kind == "config":
            return self.frame.config_value(self.subj, name)
        if kind == "fact":
            return self.frame.fact(self.subj, name)
        table = self.frame.lookup_table(self.subj, name)
        ring = table.rings.get(name) if table is not None else None
        stale = self.stale * (10 if kind == "job" else 1)
        return _last(ring, self.end, stale) if ring is not None else None


class ReferenceEngine(engine_mod.Engine):
    """The engine's own loop (states, durations, suppression, gates), with the plain
    evaluation under it: a :class:`ReferenceCtx` made anew per subject and bucket, and each
    rule's whole ``when`` and ``unless`` evaluated (the rules are handed over without their
    compiled predicates, so the engine takes them as rules built by hand)."""

    created: list[engine_mod.Engine] = []

    def __init__(self, ruleset: RuleSet, **kw: Any) -> None:
        plain = RuleSet([replace(r, holds=None, unless_holds=(), when_node=None,
                                 unless_nodes=(), reads=None) for r in ruleset.rules],
                        ruleset.sources)
        super().__init__(plain, **kw)
        type(self).created.append(self)

    def _context(self, subj: Any, end: int) -> Any:
        return ReferenceCtx(self.frame, subj, end)


class IncrementalEngine(engine_mod.Engine):
    """The engine as shipped, remembering the engines made (to read their activations)."""

    created: list[engine_mod.Engine] = []

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        type(self).created.append(self)


def _advise(path: Path, engine_class: type, monkeypatch: pytest.MonkeyPatch
            ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``gpuwatch advise --replay PATH --format json`` with ``engine_class`` judging: the
    report, and every activation of every rule."""
    engine_class.created = []
    monkeypatch.setattr(sources, "Engine", engine_class)
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["advise", "--replay", str(path), "--format", "json"]) == 0
    report = json.loads(out.getvalue())
    report.pop("generated_at", None)
    (eng,) = engine_class.created
    activations = [{"rule": f.rule.id, "gpu": f.gpu, "start": f.start, "ended": f.ended,
                    "last_seen": f.last_seen, "active": f.active,
                    "held_seconds": f.held_seconds, "details": f.details}
                   for f in eng.findings]
    return report, activations


@pytest.mark.parametrize("path", RECORDINGS, ids=[recording_name(p) for p in RECORDINGS])
def test_incremental_evaluation_gives_the_same_advice_and_onsets(path: Path, monkeypatch):
    report, activations = _advise(path, IncrementalEngine, monkeypatch)
    ref_report, ref_activations = _advise(path, ReferenceEngine, monkeypatch)
    assert activations == ref_activations
    assert report == ref_report


# -- the views against the pass, on rings built to be awkward -------------------------------
def _awkward_values(rng: random.Random, count: int) -> list[float | None]:
    """Runs of repeats (counters that hold still, ties), gaps, -0.0 beside 0.0, resets,
    and a NaN now and then."""
    out: list[float | None] = []
    v = 0.0
    while len(out) < count:
        kind = rng.random()
        run = rng.randint(1, 12)
        if kind < 0.15:
            out += [None] * run
        elif kind < 0.2:
            out += [rng.choice([0.0, -0.0]) for _ in range(run)]
        elif kind < 0.23:
            out.append(float("nan"))
        elif kind < 0.5:
            out += [v] * run  # held still
        elif kind < 0.6:
            v = 0.0  # a counter reset
            out.append(v)
        else:
            v += rng.choice([1.0, 2.0, 0.5, rng.random()])
            out += [v if rng.random() < 0.8 else rng.uniform(-5, 5) for _ in range(run)]
    return out[:count]


FNS = ["min", "max", "median", "p50", "p90", "p95", "p99", "delta", "increase", "rate",
       "first", "count", "last", "mean", "stddev"]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return a == b


@pytest.mark.parametrize("seed", range(6))
def test_every_window_statistic_matches_a_pass_over_the_window(seed: int):
    """Read at every bucket like the engine does (and now and then not for a while, or
    the same bucket twice), with the ring trimmed and reset under it as the frame does."""
    rng = random.Random(seed)
    values = _awkward_values(rng, 1500)
    keep = 80
    ring = Ring(1000)
    windows = [1, 2, 5, 15, 60]
    compared = 0
    idx = 1000
    for v in values:
        if rng.random() < 0.004:  # a long gap: the frame drops the ring's history
            idx += keep + rng.randint(1, 50)
            ring.reset(idx)
        ring.push(v, rng.choice([1.0, 1.0, 1.0, 2.5, 0.0]))
        idx += 1
        if len(ring.vals) > 2 * keep:
            ring.trim(keep)
        if rng.random() < 0.1:
            continue  # not read at this bucket: the views catch up later
        end = idx + (rng.randint(0, 3) if rng.random() < 0.05 else 0)  # past the ring's end
        for fn in FNS:
            for n in windows:
                got = window_stat(ring, fn, end, n, 1.0)
                want = reference_stat(ring, fn, end, n, 1.0)
                assert _same(got, want), (fn, n, end, got, want, ring.vals[-n:])
                assert _same(scan_stat(ring, fn, end, n, 1.0), want)
                compared += 1
    assert compared > 50_000


def test_growth_matches_the_least_squares_pass():
    rng = random.Random(7)
    from gpuwatch.advisor.windows import growth

    ring = Ring(0)
    for i in range(3000):
        kind = rng.random()
        if kind < 0.1:
            ring.push(None)
        elif kind < 0.6:
            ring.push(float(ring.vals[-1] if ring.vals and ring.vals[-1] is not None
                            else 2**30))  # whole bytes held still
        elif kind < 0.8:
            ring.push(float(2**30 + i * 4096))  # a leak
        else:
            ring.push(rng.uniform(0, 1e9))  # noise, not whole numbers
        for n in (5, 20, 60):
            assert growth(ring, i + 1, n, 1.0) == reference_growth(ring, i + 1, n, 1.0)


def test_a_phases_level_is_fitted_from_how_much_of_each_bucket_it_held():
    """ring_mean_in_phase: the level of a signal while a phase holds (the GPU's busy
    share in the seconds a job trained), each bucket a mix of the phase's level and the
    rest's by the phase's share of it. Where the shares spread (evaluations of seconds
    between stretches of training), the fit finds both levels exactly, whatever the rings'
    bases (trimmed apart) and the buckets either lacks; where every bucket mixes them
    alike, each counts by its share; nothing where the phase never held."""
    from gpuwatch.advisor.windows import ring_mean_in_phase

    rng = random.Random(11)
    for train, other in ((0.7, 0.3), (0.15, 0.05), (0.55, 0.6)):
        vals, share = Ring(0), Ring(0)
        for _ in range(400):
            p = rng.choice((0.0, 1.0, rng.random()))
            v = train * p + other * (1 - p)
            vals.push(None if rng.random() < 0.1 else v)
            share.push(None if rng.random() < 0.1 else p)
        vals.trim(150)
        share.trim(90)  # bases differ now
        for s in range(330, 400, 7):
            for n in (5, 15, 60):
                assert ring_mean_in_phase(vals, share, s - n, s) == pytest.approx(train), \
                    (train, s, n)
    # every bucket half training: the levels cannot be told apart, the weighted mean
    vals, share = Ring(0), Ring(0)
    for i in range(20):
        vals.push(0.2 + 0.01 * (i % 3))
        share.push(0.5 + 0.02 * (i % 2))
    want = sum(v * p for v, p in zip(vals.vals, share.vals, strict=True)) / sum(share.vals)
    assert ring_mean_in_phase(vals, share, 0, 20) == pytest.approx(want)
    # a phase that never held: nothing; no ring: nothing; a fit past 1 is clamped
    zero = Ring(0)
    for _ in range(20):
        zero.push(0.0)
    assert ring_mean_in_phase(vals, zero, 0, 20) is None
    assert ring_mean_in_phase(None, share, 0, 20) is None
    assert ring_mean_in_phase(vals, None, 0, 20) is None
    high, share = Ring(0), Ring(0)
    for p in (0.0, 1.0, 0.0, 1.0, 0.5):
        high.push(0.2 + 0.95 * p + (0.3 if p == 0.5 else 0.0))
        share.push(p)
    assert ring_mean_in_phase(high, share, 0, 5) == 1.0


def test_a_reading_of_the_interval_before_its_line_is_paired_with_the_buckets_it_spans():
    """A GPM reading describes the sample interval before its line: with lines 0.25 s into
    their buckets at 1 s, three quarters of it lie in the bucket before. Paired so
    (``before``), the fit finds the training's level; paired with its own bucket alone, it
    is off (the fw_hf_large_eval10 shape: training at 70 %, evaluating at 25 %)."""
    from gpuwatch.advisor.windows import ring_mean_in_phase

    rng = random.Random(5)
    train, other, before = 0.7, 0.25, 0.75
    vals, share = Ring(0), Ring(0)
    shares = [rng.choice((0.0, 1.0, 1.0, rng.random())) for _ in range(200)]
    for i, p in enumerate(shares):
        seen = (1 - before) * p + before * (shares[i - 1] if i else p)
        vals.push(train * seen + other * (1 - seen))
        share.push(p)
    assert ring_mean_in_phase(vals, share, 20, 200, before) == pytest.approx(train)
    assert ring_mean_in_phase(vals, share, 20, 200) < train - 0.08
    # a bucket whose bucket before is unknown is left out, not paired with nothing
    assert ring_mean_in_phase(vals, share, 0, 1, before) is None


def test_table_push_writes_the_ring_as_ring_push_does():
    """The frame's Table.push writes its ring straight (Ring.push inlined); here against the
    ring written push by push as before, the gaps filled or dropped and the ring trimmed
    the same way, on values with gaps, None, zero and fractional weights."""
    from gpuwatch.advisor.frame import Frame, Table

    rng = random.Random(11)
    frame = Frame(1.0, ["util"], keep_seconds=40)
    table = Table(frame)
    keep = frame.keep
    ref: Ring | None = None
    idx = 500
    for _ in range(5000):
        idx += 1 if rng.random() < 0.9 else rng.choice([2, 3, keep, keep + 1, keep + 30])
        value = None if rng.random() < 0.1 else rng.choice([0.0, -0.0, 1.5, rng.random()])
        weight = rng.choice([1.0, 1.0, 0.0, 2.5])
        table.push(idx, "util", value, weight)
        # the reference: Table.push as it was, calling Ring.push and Ring.trim
        if ref is None:
            if value is None:
                continue
            ref = Ring(idx)
        else:
            gap = idx - ref.base - len(ref.vals)
            if gap > keep:
                ref.reset(idx)
            else:
                for _ in range(max(0, gap)):
                    ref.push(None)
        ref.push(value, weight)
        if len(ref.vals) > 2 * keep:
            ref.trim(keep)
        got = table.rings["util"]
        assert (got.base, got.last_none) == (ref.base, ref.last_none)
        assert all(_same(a, b) for a, b in zip(got.vals, ref.vals, strict=True))
        assert got.psum == ref.psum and got.pw == ref.pw


def test_a_short_phase_between_two_lines_of_the_same_phase_lies_before_the_last():
    """Two `phase` lines 5 s apart that both say train, the second carrying 0.01 s more
    of checkpoint (a rank's call to the Trainer's _save_checkpoint that wrote nothing):
    the checkpoint lies before the training that runs up to the second line, so the rest
    of the bucket the line falls in (until the next line describes it) is training, not
    the short phase's. It once ended at the line, and the bucket was read as checkpoint."""
    from gpuwatch.advisor.frame import Frame

    frame = Frame(1.0, ["phase_train"], keep_seconds=40)
    t0 = 1000.0
    frame.feed({"kind": "gpu", "t": t0, "gpu": 0, "util": 0.5})
    for k in range(12):
        t = t0 + 5.0 * (k + 1) + 0.02  # just into a bucket
        ck = 0.01 * k
        frame.feed({"kind": "phase", "t": t, "gpu": 0, "pid": 7, "phase": "train",
                    "seconds": {"startup": 1.0, "train": 5.0 * (k + 1) - 1.0 - ck,
                                "checkpoint": ck}, "checkpoints": k})
        for s in range(5):
            frame.feed({"kind": "gpu", "t": t + s + 0.5, "gpu": 0, "util": 0.5})
    frame.finish()
    subj = frame.subjects[0]
    ring = frame.phase_owner(subj).phase_table.rings["phase_train"]
    shares = [ring.mean(b + 1, 1) for b in range(int(t0) + 10, int(t0) + 55)]
    assert all(s is not None and s >= 0.98 for s in shares), shares


# -- each GPU ring as long as its readers look back -------------------------------------------
def _gpu_stream(minutes: int) -> list[dict[str, Any]]:
    """A GPU line and a host line a second, a training process on the GPU."""
    out: list[dict[str, Any]] = []
    for i in range(minutes * 60):
        t = 1.8e9 + i
        out.append({"kind": "gpu", "t": t, "gpu": 0, "util": 0.5 + 0.4 * (i % 7 == 0),
                    "mem_util": 0.2, "mem_used_bytes": 2**33, "mem_total_bytes": 2**36,
                    "power_watts": 300.0, "power_limit_watts": 700.0, "temp_celsius": 60,
                    "sm_clock_mhz": 1980, "clock_event_reasons": 0, "sm_active": 0.4,
                    "tensor_active": 0.1, "ecc_uncorrected_total": 0, "xid_errors_total": 0,
                    "processes": [{"pid": 4242, "used_memory_bytes": 2**32}]})
        out.append({"kind": "host", "t": t, "cpu_util_per_core": [0.5] * 8, "load1": 1.0})
    return out


def test_gpu_rings_keep_what_their_readers_read_and_the_counters_keep_ten_minutes():
    """The built-in rules read the ECC and XID counters over 10 minutes and every other
    GPU signal over a minute at most: those rings stop at about twice what is read (they
    were all ten minutes long), the counters' and the attribution's inputs' do not."""
    eng = engine_mod.Engine(load_rules())
    frame = eng.frame
    assert frame.keep >= 600
    for line in _gpu_stream(25):
        eng.feed(line)
    eng.finish()
    rings = frame.subjects[0].gpu_table.rings
    for name in ("temp_celsius", "power_watts", "mem_util", "tensor_active"):
        keep = frame.gpu_keeps[name]
        assert keep <= 64 < frame.keep
        assert rings[name].keep == keep and len(rings[name].vals) <= 2 * keep
    for name in ("ecc_uncorrected_total", "xid_errors_total", "util", "sm_active"):
        assert name not in frame.gpu_keeps
        assert len(rings[name].vals) >= frame.keep  # ten minutes and more
    # every window a rule reads fits in its ring (a growth signal's: its source's fit)
    for rule in eng.rules:
        for name, seconds in (rule.reads or {}).items():
            if name in GROWTH_SIGNALS:
                name = GROWTH_SIGNALS[name][0]
                seconds = seconds or engine_mod.ATTRIBUTION_LAST_SECONDS
            if name in frame.gpu_keeps and seconds > 0:
                assert round(seconds) + 4 <= frame.gpu_keeps[name], (rule.id, name)


def test_a_rule_file_that_reads_a_gpu_signal_further_back_makes_its_ring_longer(tmp_path):
    """A rule from --rules-dir reading temperature over 5 minutes: that ring keeps 5
    minutes (and the rest stay short), so the rule sees its whole window."""
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    (rules_dir / "hot.yaml").write_text(
        "rules:\n"
        "  - id: hot-for-long\n"
        "    title: Hot for five minutes\n"
        "    severity: info\n"
        "    when: min(temp_celsius, 5m) >= 55\n"
        "    message: GPU {gpu} has been at 55 C or more for five minutes.\n"
        "    action: Check the cooling.\n")
    eng = engine_mod.Engine(load_rules([str(rules_dir)]))
    assert eng.frame.gpu_keeps["temp_celsius"] == 304
    assert eng.frame.gpu_keeps["power_watts"] <= 64
    for line in _gpu_stream(8):
        eng.feed(line)
    eng.finish()
    assert len(eng.frame.subjects[0].gpu_table.rings["temp_celsius"].vals) >= 300
    (hot,) = [f for f in eng.summary() if f.rule.id == "hot-for-long"]
    assert hot.start == pytest.approx(1.8e9 + 300, abs=2)  # after the whole 5 minutes


def test_rules_built_by_hand_keep_every_ring_whole():
    """Without the rules' reads (a Rule built in code) no ring is shortened."""
    plain = load_rules()
    plain = RuleSet([replace(r, reads=None) for r in plain.rules], plain.sources)
    assert engine_mod.Engine(plain).frame.gpu_keeps == {}
