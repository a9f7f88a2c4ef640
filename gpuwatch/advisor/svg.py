"""Charts as inline SVG: lines and stacked areas over time, with shaded spans (phases) and
marked moments (where advice started). Text only, no script, nothing fetched: a report
that holds them opens offline in any browser and inside a notebook's output.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape

Point = tuple[float, float]

WIDTH = 760
HEIGHT = 170
_LEFT, _RIGHT, _TOP, _BOTTOM = 58, 12, 14, 24


@dataclass
class Line:
    name: str
    color: str
    points: Sequence[Point]
    dashed: bool = False
    joined: bool = False  # a reference line (a limit): never broken at gaps


@dataclass
class Span:
    """A shaded stretch of time (a phase), labelled."""

    x0: float
    x1: float
    label: str
    color: str


@dataclass
class Mark:
    """A moment (where a piece of advice started): a numbered line across the chart."""

    x: float
    label: str
    title: str
    color: str = "#b02a37"
    href: str | None = None


@dataclass
class Chart:
    title: str
    x_max: float
    fmt: Callable[[float], str]  # a y value with its unit
    y_max: float | None = None  # None: from the data
    lines: list[Line] = field(default_factory=list)
    # stacked areas: (name, color, [(x, share)]) bottom first; their x are shared
    areas: list[tuple[str, str, Sequence[Point]]] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    gap: float | None = None  # points further apart than this are not joined


def nice_step(span: float, ticks: int = 5) -> float:
    """A round step (1, 2 or 5 times a power of ten) giving about ``ticks`` ticks."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _n(v: float) -> str:
    return f"{v:.1f}"


def render(chart: Chart) -> str:
    w, h = WIDTH, HEIGHT
    pw, ph = w - _LEFT - _RIGHT, h - _TOP - _BOTTOM
    x_max = chart.x_max if chart.x_max > 0 else 1.0
    y_max = chart.y_max
    if y_max is None:
        ys = [p[1] for line in chart.lines for p in line.points if math.isfinite(p[1])]
        top = max(ys, default=0.0)
        step = nice_step(top or 1.0, 4)
        y_max = max(step, math.ceil(top / step) * step) if top > 0 else 1.0

    def sx(x: float) -> float:
        return _LEFT + max(0.0, min(x, x_max)) / x_max * pw

    def sy(y: float) -> float:
        return _TOP + ph - max(0.0, min(y, y_max)) / y_max * ph

    out = [f'<svg class="chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
           f'aria-label="{escape(chart.title)}" xmlns="http://www.w3.org/2000/svg">',
           f"<title>{escape(chart.title)}</title>"]
    if not chart.areas:  # behind the lines; over stacked areas, which would hide them
        _spans(out, chart, sx, ph)
    # grid and axes
    y_step = nice_step(y_max, 4)
    y = 0.0
    while y <= y_max + 1e-9:
        py = sy(y)
        out.append(f'<line class="grid" x1="{_LEFT}" x2="{w - _RIGHT}" y1="{_n(py)}" '
                   f'y2="{_n(py)}"/>')
        out.append(f'<text class="tick" x="{_LEFT - 4}" y="{_n(py + 3)}" '
                   f'text-anchor="end">{escape(chart.fmt(y))}</text>')
        y += y_step
    x_step = nice_step(x_max, 8)
    x = 0.0
    while x <= x_max + 1e-9:
        px = sx(x)
        out.append(f'<line class="grid" x1="{_n(px)}" x2="{_n(px)}" y1="{_TOP}" '
                   f'y2="{_TOP + ph}"/>')
        out.append(f'<text class="tick" x="{_n(px)}" y="{h - 8}" text-anchor="middle">'
                   f'{_seconds(x)}</text>')
        x += x_step
    # stacked areas, bottom first
    if chart.areas:
        xs = [p[0] for p in chart.areas[0][2]]
        base = [0.0] * len(xs)
        for name, color, pts in chart.areas:
            top = [b + v for b, (_, v) in zip(base, pts, strict=True)]
            for seg in _segments(list(range(len(xs))), [xs[i] for i in range(len(xs))],
                                 chart.gap):
                upper = " ".join(f"{_n(sx(xs[i]))},{_n(sy(top[i]))}" for i in seg)
                lower = " ".join(f"{_n(sx(xs[i]))},{_n(sy(base[i]))}" for i in reversed(seg))
                out.append(f'<polygon class="area" points="{upper} {lower}" fill="{color}" '
                           f'fill-opacity="0.85"><title>{escape(name)}</title></polygon>')
            base = top
        _spans(out, chart, sx, ph)
    for line in chart.lines:
        pts = [p for p in line.points if math.isfinite(p[1])]
        idx = list(range(len(pts)))
        for seg in _segments(idx, [p[0] for p in pts], None if line.joined else chart.gap):
            coords = " ".join(f"{_n(sx(pts[i][0]))},{_n(sy(pts[i][1]))}" for i in seg)
            dash = ' stroke-dasharray="5 4"' if line.dashed else ""
            if len(seg) == 1:
                i = seg[0]
                out.append(f'<circle cx="{_n(sx(pts[i][0]))}" cy="{_n(sy(pts[i][1]))}" r="2" '
                           f'fill="{line.color}"/>')
                continue
            out.append(f'<polyline class="line" points="{coords}" stroke="{line.color}"'
                       f'{dash}><title>{escape(line.name)}</title></polyline>')
    for m in chart.marks:
        px = sx(m.x)
        mark = (f'<g class="mark"><title>{escape(m.title)}</title>'
                f'<line x1="{_n(px)}" x2="{_n(px)}" y1="{_TOP}" y2="{_TOP + ph}" '
                f'stroke="{m.color}" stroke-dasharray="3 3"/>'
                f'<circle cx="{_n(px)}" cy="{_TOP + 8}" r="8" fill="{m.color}"/>'
                f'<text x="{_n(px)}" y="{_TOP + 11.5}" text-anchor="middle" class="mark-label">'
                f'{escape(m.label)}</text></g>')
        if m.href:
            mark = f'<a href="{escape(m.href)}">{mark}</a>'
        out.append(mark)
    out.append(f'<rect class="frame" x="{_LEFT}" y="{_TOP}" width="{pw}" height="{ph}"/>')
    out.append("</svg>")
    return "".join(out)


def _spans(out: list[str], chart: Chart, sx: Callable[[float], float], ph: float) -> None:
    """The shaded phases, each with its name where there is room for it."""
    for s in chart.spans:
        x0, x1 = sx(s.x0), sx(s.x1)
        w = _n(max(0.5, x1 - x0))
        tip = f"<title>{escape(s.label)}: {s.x0:.0f}-{s.x1:.0f} s</title>"
        if chart.areas:
            # a tint over stacked areas would change their colours: a ribbon above the
            # plot instead, and a line where each phase begins
            out.append(f'<rect class="span" x="{_n(x0)}" y="2" width="{w}" height="9" '
                       f'fill="{s.color}" fill-opacity="0.75">{tip}</rect>')
            out.append(f'<line x1="{_n(x0)}" x2="{_n(x0)}" y1="{_TOP}" y2="{_TOP + ph}" '
                       f'stroke="{s.color}" stroke-width="1.2"/>')
            continue
        out.append(f'<rect class="span" x="{_n(x0)}" y="{_TOP}" width="{w}" height="{ph}" '
                   f'fill="{s.color}" fill-opacity="0.16">{tip}</rect>')
        if x1 - x0 > 8 * len(s.label) / 2:
            out.append(f'<text class="span-label" x="{_n(x0 + 3)}" y="{_TOP + 10}" '
                       f'fill="{s.color}">{escape(s.label)}</text>')

def _segments(idx: list[int], xs: list[float], gap: float | None) -> list[list[int]]:
    """Runs of points with no gap wider than ``gap`` between neighbours."""
    if not idx:
        return []
    out = [[idx[0]]]
    for a, b in zip(idx, idx[1:], strict=False):
        if gap is not None and xs[b] - xs[a] > gap:
            out.append([b])
        else:
            out[-1].append(b)
    return out


def _seconds(x: float) -> str:
    if x >= 3600 and x % 60 == 0:
        return f"{x / 3600:g} h" if x % 3600 == 0 else f"{x / 60:g} min"
    if x >= 120 and x % 60 == 0:
        return f"{x / 60:g} min"
    return f"{x:g} s"


def legend(items: Sequence[tuple[str, str]], kind: str = "line") -> str:
    """A legend under a chart: (name, color) each."""
    cells = []
    for name, color in items:
        swatch = (f'<span class="swatch {kind}" style="background:{color}"></span>')
        cells.append(f"<li>{swatch}{escape(name)}</li>")
    return f'<ul class="legend">{"".join(cells)}</ul>'
