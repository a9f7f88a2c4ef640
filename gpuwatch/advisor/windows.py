"""One signal's bucketed history and the windowed statistics rules read from it.

History is kept as fixed-width time buckets: each bucket holds one value and a weight,
and each ring keeps running prefix sums, so a windowed mean costs O(1) however long the
window. Rings are trimmed to the longest window the rules use.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, insort
from collections import deque
from typing import Any


class Ring:
    """Bucket values of one signal, with prefix sums for O(1) weighted window means.

    ``views`` holds the incremental state of the other statistics rules read from it (a
    monotonic deque for a windowed max, the sorted window of a percentile, ...), one per
    (function, window length), created on first use and brought up to date when read.
    """

    __slots__ = ("base", "keep", "last_none", "psum", "pw", "trim_at", "vals", "views")

    def __init__(self, base: int, keep: int | None = None) -> None:
        self.base = base  # absolute bucket index of vals[0]
        # the buckets its readers look back over (the frame's Table.push trims it to them
        # once it holds twice as many); None: whoever owns it trims it
        self.keep = keep
        self.trim_at = 2 * keep if keep is not None else 1 << 62
        self.vals: list[float | None] = []
        # the prefix sums as C doubles, 8 bytes a bucket each rather than a float object
        # and its pointer (32): a daemon's rings hold each GPU's signals, and these two
        # are most of their memory
        self.psum = array("d", (0.0,))
        self.pw = array("d", (0.0,))
        # absolute index of the newest bucket without a value: a window that starts after
        # it holds a value in every bucket (its count and first value need no pass)
        self.last_none = base - 1
        self.views: dict[tuple[str, int], Any] | None = None

    def push(self, value: float | None, weight: float = 1.0) -> None:
        vals = self.vals
        vals.append(value)
        psum, pw = self.psum, self.pw
        if value is None or weight <= 0:
            if value is None:
                self.last_none = self.base + len(vals) - 1
            psum.append(psum[-1])
            pw.append(pw[-1])
        else:
            psum.append(psum[-1] + value * weight)
            pw.append(pw[-1] + weight)

    def end(self) -> int:
        return self.base + len(self.vals)

    def reset(self, base: int) -> None:
        """Empty, starting over at absolute bucket ``base`` (a gap longer than any window:
        nothing before it is read again)."""
        self.vals.clear()
        del self.psum[1:], self.pw[1:]
        self.psum[0] = self.pw[0] = 0.0
        self.base = base

    def trim(self, keep: int) -> None:
        extra = len(self.vals) - keep
        if extra > keep:  # trim in chunks: O(1) amortised
            del self.vals[:extra]
            del self.psum[:extra]
            del self.pw[:extra]
            self.base += extra

    def span(self, end: int, n: int) -> tuple[int, int]:
        """List positions of the ``n`` buckets ending before absolute index ``end``."""
        e = min(end, self.end()) - self.base
        s = max(0, e - n)
        return s, max(s, e)

    def values(self, end: int, n: int) -> list[float]:
        s, e = self.span(end, n)
        return [v for v in self.vals[s:e] if v is not None]

    def mean(self, end: int, n: int) -> float | None:
        # span() inlined: the windowed mean is the most read statistic
        base = self.base
        e = min(end, base + len(self.vals)) - base
        s = e - n if e > n else 0
        if e < s:
            e = s
        pw = self.pw
        w = pw[e] - pw[s]
        if w <= 0:
            return None
        return (self.psum[e] - self.psum[s]) / w

    def last(self, end: int, n: int) -> float | None:
        vals = self.vals
        e = min(end, self.base + len(vals)) - self.base
        if e > 0 and n > 0:
            v = vals[e - 1]
            if v is not None:  # the usual case: the newest bucket has a value
                return v
        s, e = self.span(end, n)
        for i in range(e - 1, s - 1, -1):
            v = vals[i]
            if v is not None:
                return v
        return None


def _percentile(vals: list[float], q: float) -> float:
    return _pick_percentile(sorted(vals), q)


def _counter_increase(vals: list[float]) -> float | None:
    if len(vals) < 2:
        return None if not vals else 0.0
    if vals[0] == vals[-1] and min(vals) == max(vals):
        return 0.0  # the usual case: no new errors (C-speed check)
    if vals == sorted(vals):
        return vals[-1] - vals[0]  # no reset in the window
    total = 0.0
    prev = vals[0]
    for v in vals[1:]:
        total += v - prev if v >= prev else v  # a reset starts the counter from zero
        prev = v
    return total


_COUNTER_FNS = frozenset({"delta", "increase", "rate"})
_PCT = {"median": 0.5, "p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}


def scan_stat(ring: Ring, fn: str, end: int, n: int, res: float) -> float | None:
    """One windowed statistic over the ``n`` buckets before ``end``, read by a pass over
    the window: for windows the views do not keep (a shortened one) and what they leave
    to it (NaN, a counter that moved)."""
    if fn in ("mean", "avg"):
        return ring.mean(end, n)
    if fn == "last":
        return ring.last(end, n)
    if fn in _COUNTER_FNS:
        # the usual case, a counter that did not move: one C-speed pass over the window
        # instead of filtering, min and max
        s, e = ring.span(end, n)
        window = ring.vals[s:e]
        first = window[0] if window else None
        if first is not None and first == first and window.count(first) == len(window):
            return 0.0
    vals = ring.values(end, n)
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
        return _counter_increase(vals)
    if fn == "rate":
        inc = _counter_increase(vals)
        return None if inc is None else inc / (n * res)
    raise ValueError(f"unknown window function {fn!r}")


# -- incremental views -------------------------------------------------------------------
# Each view is brought up to date by the buckets pushed since it was last read (usually
# one), so a statistic over a long window costs O(1) amortised per read instead of a pass
# over the window. A view answers exactly what scan_stat would (the same value, the same
# tie picked); where it cannot be sure (a NaN in the window, a counter that moved, time
# read backwards) it returns _SCAN and the caller does the pass.
_SCAN = object()


def _bounds(ring: Ring, end: int, n: int) -> tuple[int, int]:
    """Absolute [s, e) of the ``n`` buckets before ``end`` that the ring holds."""
    base = ring.base
    e = base + len(ring.vals)
    if end < e:  # min(), without the call: every view's read starts here
        e = end
    s = e - n
    if s < base:
        s = base
    return s, e


class _Extreme:
    """Windowed min or max: a monotonic deque of (bucket, value) whose front is the
    answer. Ties keep the oldest in front, as min() and max() return the first."""

    __slots__ = ("dq", "is_max", "nan_at", "upto")

    def __init__(self, is_max: bool) -> None:
        self.dq: deque[tuple[int, float]] = deque()
        self.is_max = is_max
        self.upto = -(1 << 62)  # buckets before this have been taken in
        self.nan_at = -(1 << 62)

    def read(self, ring: Ring, end: int, n: int) -> Any:
        s, e = _bounds(ring, end, n)
        if e < self.upto:
            return _SCAN
        dq = self.dq
        i = self.upto if self.upto > s else s
        if i < e:
            vals, base = ring.vals, ring.base
            is_max = self.is_max
            for v in vals[i - base:e - base]:
                if v is not None:
                    if v != v:
                        self.nan_at = i
                    elif is_max:
                        while dq and dq[-1][1] < v:
                            dq.pop()
                        dq.append((i, v))
                    else:
                        while dq and dq[-1][1] > v:
                            dq.pop()
                        dq.append((i, v))
                i += 1
            self.upto = e
        while dq and dq[0][0] < s:
            dq.popleft()
        if self.nan_at >= s:
            return _SCAN
        return dq[0][1] if dq else None


class _Sorted:
    """A window's values kept sorted (bisect), for its percentiles. Equal values stay in
    arrival order, so the list is exactly what sorted() makes of the window."""

    __slots__ = ("nan_at", "srt", "upto", "win")

    def __init__(self) -> None:
        self.win: deque[tuple[int, float]] = deque()
        self.srt: list[float] = []
        self.upto = -(1 << 62)
        self.nan_at = -(1 << 62)

    def read(self, ring: Ring, end: int, n: int) -> Any:
        s, e = _bounds(ring, end, n)
        if e < self.upto:
            return _SCAN
        win, srt = self.win, self.srt
        i = self.upto if self.upto > s else s
        if i < e:
            vals, base = ring.vals, ring.base
            for v in vals[i - base:e - base]:
                if v is not None:
                    if v != v:
                        self.nan_at = i
                    else:
                        win.append((i, v))
                        insort(srt, v)
                i += 1
            self.upto = e
        while win and win[0][0] < s:
            # the oldest of equal values leaves first, and it is the first of them in srt
            del srt[bisect_left(srt, win.popleft()[1])]
        if self.nan_at >= s:
            return _SCAN
        return srt


class _Steady:
    """Whether a counter held still over a window, for delta, increase and rate.

    Kept: the newest value and its bucket, and where the newest change came from (the
    bucket of the value before it). A window holds its values' last change only if that
    earlier value lies inside it too; if none does, every value in it is the same and it
    increased by exactly 0. The newest change is enough: an older change inside the
    window would put the newer one's earlier value inside it as well.
    """

    __slots__ = ("changed_from", "prev", "prev_at", "upto")

    def __init__(self) -> None:
        self.changed_from = -(1 << 62)
        self.prev: Any = None
        self.prev_at = -(1 << 62)
        self.upto = -(1 << 62)

    def read(self, ring: Ring, end: int, n: int) -> Any:
        s, e = _bounds(ring, end, n)
        if e < self.upto:
            return _SCAN
        i = self.upto if self.upto > s else s
        if i < e:
            vals, base = ring.vals, ring.base
            prev, prev_at = self.prev, self.prev_at
            for v in vals[i - base:e - base]:
                if v is not None:
                    # after a skipped stretch the value compared against lies before the
                    # window: such a change is never inside it
                    if prev is not None and v != prev:  # NaN != NaN: never steady
                        self.changed_from = prev_at
                    prev, prev_at = v, i
                i += 1
            self.prev, self.prev_at = prev, prev_at
            self.upto = e
        if self.prev_at < s:
            return None  # no value in the window
        if self.changed_from < s:
            return 0.0
        return _SCAN


_VIEW_OF = {"min": "min", "max": "max", "median": "pct", "p50": "pct", "p90": "pct",
            "p95": "pct", "p99": "pct", "delta": "steady", "increase": "steady",
            "rate": "steady"}


def window_stat(ring: Ring, fn: str, end: int, n: int, res: float) -> float | None:
    """One windowed statistic over the ``n`` buckets before ``end``, kept incrementally.

    Read at every bucket with the same ``n`` (a rule's window), it costs O(1) amortised:
    means from the prefix sums, min and max from monotonic deques, percentiles from a
    sorted window, counters from whether they moved. Gives what :func:`scan_stat` gives.
    """
    if fn in ("mean", "avg"):
        return ring.mean(end, n)
    if fn == "last":
        return ring.last(end, n)
    kind = _VIEW_OF.get(fn)
    if kind is None:  # first, count, stddev: rare in rules, read by a pass
        if fn in ("first", "count"):
            s, e = _bounds(ring, end, n)
            if ring.last_none < s:  # a value in every bucket: no pass needed
                if fn == "count":
                    return float(e - s) if e > s else 0.0
                return ring.vals[s - ring.base] if e > s else None
        return scan_stat(ring, fn, end, n, res)
    views = ring.views
    if views is None:
        views = ring.views = {}
    key = (kind, n)
    view = views.get(key)
    if view is None:
        view = views[key] = (_Extreme(kind == "max") if kind in ("min", "max")
                             else _Sorted() if kind == "pct" else _Steady())
    got = view.read(ring, end, n)
    if got is _SCAN:
        return scan_stat(ring, fn, end, n, res)
    if kind == "pct":
        return _pick_percentile(got, _PCT[fn]) if got else None
    return got


def _pick_percentile(vals: list[float], q: float) -> float:
    """_percentile of a list that is already sorted."""
    if len(vals) == 1:
        return vals[0]
    pos = q * (len(vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


# each growth signal: the ring its fit reads, and which of the fit's two numbers it is
# (0: the slope per second, 1: R^2)
GROWTH_SIGNALS: dict[str, tuple[str, int]] = {
    "mem_allocated_growth_bytes_per_second": ("mem_allocated_bytes", 0),
    "mem_allocated_growth_r2": ("mem_allocated_bytes", 1),
    "mem_used_growth_bytes_per_second": ("mem_used_bytes", 0),
    "mem_used_growth_r2": ("mem_used_bytes", 1),
}


def growth(ring: Ring | None, end: int, n: int, res: float) -> tuple[float, float] | None:
    """Least-squares slope (per second) and R^2 of a ring's values over a window; None with
    fewer than 5 values (a leak is a rise sustained over many steps)."""
    if ring is None:
        return None
    s, e = ring.span(end, n)
    window = ring.vals[s:e]
    ys = window if None not in window else [v for v in window if v is not None]
    k = len(ys)
    if k < 5:
        return None
    # the usual case, memory that did not move: whole numbers of bytes sum exactly, so
    # every deviation from the mean is exactly 0 and the fit below would give slope 0
    # and R^2 0 (its x values are distinct positions: sxx > 0)
    y0 = ys[0]
    if ys.count(y0) == k and float(y0).is_integer() and abs(y0) * k < 2.0**53:
        return 0.0 / res, 0.0
    pts = [(i, v) for i, v in enumerate(window) if v is not None]
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


def ring_sums(ring: Ring | None, s: int, e: int) -> tuple[float, float]:
    """Sum of value x weight and of weights over absolute buckets [s, e)."""
    if ring is None:
        return 0.0, 0.0
    a = max(s, ring.base) - ring.base
    b = min(e, ring.base + len(ring.vals)) - ring.base
    if b <= a:
        return 0.0, 0.0
    return ring.psum[b] - ring.psum[a], ring.pw[b] - ring.pw[a]


def ring_mean(ring: Ring | None, s: int, e: int) -> float | None:
    """Weighted mean over absolute buckets [s, e) (ring_sums' total / weight, inlined:
    the attribution reads several per GPU at every bucket)."""
    if ring is None:
        return None
    base = ring.base
    a = s - base if s > base else 0
    b = e - base
    if b > len(ring.vals):
        b = len(ring.vals)
    if b <= a:
        return None
    pw = ring.pw
    w = pw[b] - pw[a]
    return (ring.psum[b] - ring.psum[a]) / w if w > 0 else None


# the least spread of the training shares over a window's buckets (their variance) for
# the two phases' levels to be told apart by a fit: below it, each bucket by its share
PHASE_FIT_VARIANCE = 0.01


def ring_mean_in_phase(ring: Ring | None, by: Ring | None, s: int, e: int,
                       before: float = 0.0) -> float | None:
    """``ring``'s level while ``by`` (a phase's share of each bucket, 0-1) is 1, over
    absolute buckets [s, e): the GPU's busy share in the seconds a job trained, where its
    evaluations or saves share the window. Each bucket's value is taken as a mix of the
    two levels by its share, ``v = a p + c (1 - p)``, fitted by least squares where the
    shares spread enough to tell them apart (evaluations of seconds between stretches of
    training); else (a phase changing many times a second, every bucket mixing them alike)
    the mean with each bucket weighted by its share. Clamped to 0-1; None where no bucket
    had that phase. NVML reads each second whole, where the hook's phases split it; a
    reading describes an interval before its line (GPM's counters, the time since the last
    sample), which may begin in the bucket before: ``before`` is the share of it that does,
    so ``ring``'s bucket ``i`` is paired with ``by``'s ``i`` and ``i - 1`` in those shares."""
    if ring is None or by is None:
        return None
    rv, rb = ring.vals, ring.base
    bv, bb = by.vals, by.base
    own = 1.0 - before
    n = spp = spq = sqq = sup = suq = sp = 0.0
    for i in range(max(s, rb, bb + (1 if before > 0 else 0)),
                   min(e, rb + len(rv), bb + len(bv))):
        v, p = rv[i - rb], bv[i - bb]
        if v is None or p is None:
            continue
        if before > 0:
            p0 = bv[i - 1 - bb]
            if p0 is None:
                continue
            p = own * p + before * p0
        p = min(1.0, max(0.0, p))
        q = 1.0 - p
        n += 1
        sp += p
        spp += p * p
        spq += p * q
        sqq += q * q
        sup += v * p
        suq += v * q
    if sp <= 0:
        return None
    level = phase_level(n, sp, spp, spq, sqq, sup, suq)
    return level if level is not None else min(1.0, max(0.0, sup / sp))


def phase_level(n: float, sp: float, spp: float, spq: float, sqq: float, sup: float,
                suq: float) -> float | None:
    """The least-squares level ``a`` of ``v = a p + c (1 - p)`` from its sums (over the
    buckets: 1, p, p², p q, q², v p, v q, with q = 1 - p), clamped to 0-1; None where the
    shares do not spread enough to tell the two levels apart (ring_mean_in_phase)."""
    if n < 3:
        return None
    det = spp * sqq - spq * spq
    if spp / n - (sp / n) ** 2 < PHASE_FIT_VARIANCE or det <= 0:
        return None
    return min(1.0, max(0.0, (sup * sqq - suq * spq) / det))
