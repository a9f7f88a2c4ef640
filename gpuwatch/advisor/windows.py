"""One signal's bucketed history and the windowed statistics rules read from it.

History is kept as fixed-width time buckets: each bucket holds one value and a weight,
and each ring keeps running prefix sums, so a windowed mean costs O(1) however long the
window. Rings are trimmed to the longest window the rules use.
"""

from __future__ import annotations

import math


class Ring:
    """Bucket values of one signal, with prefix sums for O(1) weighted window means."""

    __slots__ = ("base", "psum", "pw", "vals")

    def __init__(self, base: int) -> None:
        self.base = base  # absolute bucket index of vals[0]
        self.vals: list[float | None] = []
        self.psum: list[float] = [0.0]
        self.pw: list[float] = [0.0]

    def push(self, value: float | None, weight: float = 1.0) -> None:
        self.vals.append(value)
        psum, pw = self.psum, self.pw
        if value is None or weight <= 0:
            psum.append(psum[-1])
            pw.append(pw[-1])
        else:
            psum.append(psum[-1] + value * weight)
            pw.append(pw[-1] + weight)

    def end(self) -> int:
        return self.base + len(self.vals)

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
        s, e = self.span(end, n)
        for i in range(e - 1, s - 1, -1):
            v = self.vals[i]
            if v is not None:
                return v
        return None


def _percentile(vals: list[float], q: float) -> float:
    vals = sorted(vals)
    if len(vals) == 1:
        return vals[0]
    pos = q * (len(vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


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


def window_stat(ring: Ring, fn: str, end: int, n: int, res: float) -> float | None:
    """One windowed statistic over the ``n`` buckets before ``end``."""
    if fn in ("mean", "avg"):
        return ring.mean(end, n)
    if fn == "last":
        return ring.last(end, n)
    if fn in _COUNTER_FNS:
        # the usual case, a counter that did not move (health rules read 10 min of it at
        # every bucket): one C-speed pass over the window instead of filtering, min and max
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




GROWTH_SIGNALS = frozenset({"mem_allocated_growth_bytes_per_second",
                            "mem_allocated_growth_r2"})


def growth(ring: Ring | None, end: int, n: int, res: float) -> tuple[float, float] | None:
    """Least-squares slope (per second) and R^2 of a ring's values over a window; None with
    fewer than 5 values (a leak is a rise sustained over many steps)."""
    if ring is None:
        return None
    s, e = ring.span(end, n)
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
    total, w = ring_sums(ring, s, e)
    return total / w if w > 0 else None
