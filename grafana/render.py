"""Render gpuwatch's dashboards to PNG with matplotlib, from a real Prometheus' data.

No Grafana server is needed: each panel of grafana/dashboards/*.json is drawn where its
gridPos puts it, from the same PromQL (variables set to All), with the panel's unit,
legend format, value mappings and thresholds. It shows what a user would see, close enough
to judge units, legends and empty panels.

    python3 -m grafana.render --prometheus http://127.0.0.1:9090 --minutes 15
    python3 -m grafana.render --demo          # what docs/dashboard-*.png are made with

``--demo`` starts two ``gpuwatch run --replay`` daemons (two recordings from tests/data, as
two hosts) and a Prometheus (/usr/bin/prometheus) scraping them every second with
prometheus/recording.yml loaded, waits ``--seconds`` and renders into docs/.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DASHBOARDS = HERE / "dashboards"
RECORDING_RULES = REPO / "prometheus" / "recording.yml"
DEMO_RECORDINGS = ("h200_input_bound_w2.jsonl", "h200_fp16_collapse.jsonl")

# Grafana's named colours (the ones the dashboards use), as Grafana draws them
COLORS = {"green": "#73BF69", "red": "#F2495C", "orange": "#FF9830", "yellow": "#FADE2A",
          "blue": "#5794F2", "text": "#8e8e8e", "transparent": "#f4f5f5", "purple": "#B877D9"}


# -- the dashboards' queries --------------------------------------------------------

@dataclass(frozen=True)
class Target:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    dashboard: str
    title: str
    type: str
    unit: str
    targets: tuple[Target, ...]
    grid: dict[str, int]
    raw: dict[str, Any]


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def dashboards() -> list[Path]:
    return sorted(DASHBOARDS.glob("*.json"))


def panels(board: dict[str, Any]) -> Iterator[Panel]:
    """Every panel with queries, rows' nested panels included."""
    def walk(items: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for item in items:
            yield item
            yield from walk(item.get("panels") or [])

    for raw in walk(board.get("panels") or []):
        if raw.get("type") == "row":
            continue
        targets = tuple(Target(t["expr"], t.get("legendFormat", "")) for t in raw.get("targets", []))
        unit = raw.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        yield Panel(board["uid"], raw.get("title", ""), raw["type"], unit, targets,
                    raw.get("gridPos", {}), raw)


def substitute(expr: str, values: dict[str, str]) -> str:
    """A query as Grafana sends it, with ``$name`` / ``${name}`` variables replaced."""
    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"no value for variable ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", repl, expr)


def all_values(board: dict[str, Any], step_seconds: float) -> dict[str, str]:
    """Every variable of ``board`` set to All (its allValue), plus Grafana's own."""
    values = {v["name"]: v.get("allValue") or ".*"
              for v in board.get("templating", {}).get("list", []) if v.get("type") == "query"}
    step = f"{max(1, int(step_seconds))}s"
    values.update({"__interval": step, "__rate_interval": f"{max(4, int(4 * step_seconds))}s",
                   "__range": "1h"})
    return values


# -- Prometheus ---------------------------------------------------------------------

class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def api(self, path: str, **params: str) -> Any:
        data = urllib.parse.urlencode(params).encode()
        req = urllib.request.Request(f"{self.url}/api/v1/{path}", data=data, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            body = json.loads(err.read() or b"{}")
            raise ValueError(f"Prometheus rejected {params}: {body.get('error', err)}") from err
        if body.get("status") != "success":
            raise ValueError(f"Prometheus rejected {params}: {body.get('error')}")
        return body["data"]

    def range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        return self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}",
                        step=f"{step:g}")["result"]


def legend_of(fmt: str, labels: dict[str, str]) -> str:
    if not fmt:
        return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


# -- units as Grafana shows them ----------------------------------------------------

def _scaled(value: float, base: float, names: Sequence[str], fmt: str = "{:.3g} {}") -> str:
    i = 0
    while abs(value) >= base and i < len(names) - 1:
        value /= base
        i += 1
    return fmt.format(value, names[i]).strip()


def format_value(value: float, unit: str, decimals: int | None = None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if decimals == 0 and unit in ("none", "short", ""):
        return f"{value:.0f}"
    if unit == "percentunit":
        return f"{value * 100:.3g}%"
    if unit == "bytes":
        return _scaled(value, 1024, ("B", "KiB", "MiB", "GiB", "TiB"))
    if unit == "Bps":
        return _scaled(value, 1024, ("B/s", "KiB/s", "MiB/s", "GiB/s"))
    if unit == "watt":
        return _scaled(value, 1000, ("W", "kW", "MW"))
    if unit == "hertz":
        return _scaled(value, 1000, ("Hz", "kHz", "MHz", "GHz"))
    if unit == "celsius":
        return f"{value:.3g} °C"
    if unit == "s":
        return f"{value * 1000:.3g} ms" if 0 < abs(value) < 1 else f"{value:.3g} s"
    if unit.startswith("suffix:"):
        return _scaled(value, 1000, ("", " K", " M", " G"), "{:.3g}{}") + unit.removeprefix(
            "suffix:")
    return f"{value:.4g}"


# -- drawing ------------------------------------------------------------------------

def _series(prom: Prometheus, panel: Panel, values: dict[str, str], start: float, end: float,
            step: float) -> list[tuple[str, list[float], list[float]]]:
    out = []
    for target in panel.targets:
        for s in prom.range(substitute(target.expr, values), start, end, step):
            ts = [float(t) for t, _ in s["values"]]
            ys = [float(v) for _, v in s["values"]]
            out.append((legend_of(target.legend, s["metric"]), ts, ys))
    out.sort(key=lambda item: item[0])
    return out


def _mapping(panel: Panel) -> dict[str, tuple[str, str]]:
    found: dict[str, tuple[str, str]] = {}
    for m in panel.raw.get("fieldConfig", {}).get("defaults", {}).get("mappings", []):
        for value, result in m.get("options", {}).items():
            found[value] = (result.get("text", value), result.get("color", "text"))
    return found


def _overrides(panel: Panel, name: str, default: dict[str, tuple[str, str]]
               ) -> dict[str, tuple[str, str]]:
    for o in panel.raw.get("fieldConfig", {}).get("overrides", []):
        matcher = o.get("matcher", {})
        if matcher.get("id") == "byRegexp" and re.fullmatch(matcher.get("options", ""), name):
            for prop in o.get("properties", []):
                if prop.get("id") == "mappings":
                    merged = dict(default)
                    for m in prop["value"]:
                        for value, result in m.get("options", {}).items():
                            merged[value] = (result.get("text", value),
                                             result.get("color", "text"))
                    return merged
    return default


def _color(name: str) -> str:
    return COLORS.get(name, name)


def _runs(ts: Sequence[float], step: float) -> list[list[int]]:
    """Indexes of ``ts`` in runs without a gap longer than one and a half steps."""
    runs: list[list[int]] = []
    for i, t in enumerate(ts):
        if runs and t - ts[runs[-1][-1]] <= step * 1.5:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _time_axis(ax: Any, panel: Panel, start: float, end: float) -> None:
    """Times along the bottom, as many as the panel's width holds without overlap."""
    import matplotlib.dates as mdates

    ax.set_xlim(mdates.date2num(_dt(start)), mdates.date2num(_dt(end)))
    width_px = panel.grid.get("w", 8) / 24 * 1600 * 0.95
    locator = mdates.AutoDateLocator(minticks=4, maxticks=max(3, int(width_px // 80)))
    # a narrow panel over a few minutes: minute-long steps in seconds, rather than a warning
    locator.intervald[mdates.SECONDLY] = [1, 5, 10, 15, 30, 60, 120]
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))


def draw_timeseries(ax: Any, panel: Panel, data: list, start: float, end: float,
                    step: float = 2.0) -> None:
    import matplotlib.dates as mdates
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    defaults = panel.raw.get("fieldConfig", {}).get("defaults", {})
    custom = defaults.get("custom", {})
    stacked = custom.get("stacking", {}).get("mode") == "normal"
    log = custom.get("scaleDistribution", {}).get("type") == "log"
    base: dict[float, float] = {}  # stacked: the sum so far at each timestamp
    for label, ts, ys in data:
        xs = [mdates.date2num(_dt(t)) for t in ts]
        if stacked:
            lower = [base.get(t, 0.0) for t in ts]
            upper = [a + b for a, b in zip(lower, ys, strict=True)]
            ax.fill_between(xs, lower, upper, label=label, alpha=0.8, linewidth=0)
            base.update(zip(ts, upper, strict=True))
        else:
            # a gap in the data stays a gap (Grafana doesn't join points across missing
            # samples): one line per run, sharing one colour and legend entry
            line = None
            for run in _runs(ts, step):
                run_xs, run_ys = [xs[i] for i in run], [ys[i] for i in run]
                if line is None:
                    (line,) = ax.plot(run_xs, run_ys, label=label, linewidth=1.1)
                else:
                    ax.plot(run_xs, run_ys, linewidth=1.1, color=line.get_color())
    if log:
        ax.set_yscale("log", base=custom.get("scaleDistribution", {}).get("log", 2))
    lo, hi = defaults.get("min"), defaults.get("max")
    if lo is not None or hi is not None:
        cur_lo, cur_hi = ax.get_ylim()
        ax.set_ylim(cur_lo if lo is None else lo, cur_hi if hi is None else hi)
    if not log:
        decimals = defaults.get("decimals")
        ax.yaxis.set_major_formatter(
            FuncFormatter(lambda v, _: format_value(v, panel.unit, decimals)))
        if decimals == 0:
            # counts: whole-number ticks, and a 0-1 axis rather than a band around 0
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylim(bottom=0, top=max(1.0, ax.get_ylim()[1]))
    _time_axis(ax, panel, start, end)
    ax.grid(True, alpha=0.3)
    if panel.raw.get("options", {}).get("legend", {}).get("showLegend", True):
        _legend(ax, [label for label, _, _ in data], panel.grid.get("w", 8))
    elif data:
        ax.text(0.5, -0.16, f"{len(data)} series (legend hidden; Grafana names them on hover)",
                ha="center", va="top", fontsize=LEGEND_SIZE, color="#666", transform=ax.transAxes)


# text in the pictures: sizes a reader can read at the picture's own size (1600 px wide)
LEGEND_SIZE, TICK_SIZE, TITLE_SIZE = 9, 8, 10.5


def _columns(labels: Sequence[str], width: int) -> int:
    """How many legend columns of these names fit in a panel ``width`` grid units wide."""
    panel_px = width / 24 * 1600 * 0.95
    # a character at LEGEND_SIZE points is about 0.6 em wide at the pictures' 80 dpi
    entry_px = max((len(x) for x in labels), default=0) * LEGEND_SIZE * 0.6 * 80 / 72 + 40
    return max(1, min(len(labels), int(panel_px // entry_px)))


def _legend(ax: Any, labels: Sequence[str], width: int = 8) -> None:
    if labels:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=LEGEND_SIZE,
                  frameon=False, ncol=_columns(labels, width), handlelength=1.2,
                  columnspacing=1.2)


def draw_states(ax: Any, panel: Panel, data: list, start: float, end: float) -> None:
    import matplotlib.dates as mdates
    from matplotlib.patches import Patch

    default = _mapping(panel)
    seen: dict[str, str] = {}
    for row, (label, ts, ys) in enumerate(reversed(data)):
        options = _overrides(panel, label, default)
        step = (ts[1] - ts[0]) if len(ts) > 1 else 1.0
        i = 0
        while i < len(ts):
            j = i
            while j + 1 < len(ts) and ys[j + 1] == ys[i] and ts[j + 1] - ts[j] <= step * 1.5:
                j += 1
            key = f"{ys[i]:g}"
            text, color = options.get(key, (key, "text"))
            seen.setdefault(text, color)
            x0 = mdates.date2num(_dt(ts[i]))
            x1 = mdates.date2num(_dt(ts[j] + step))
            ax.barh(row, x1 - x0, left=x0, height=0.8, color=_color(color),
                    edgecolor="none")
            i = j + 1
    ax.set_yticks(range(len(data)))
    ax.set_yticklabels([label for label, _, _ in reversed(data)], fontsize=LEGEND_SIZE)
    _time_axis(ax, panel, start, end)
    if seen:
        ax.legend(handles=[Patch(color=_color(c), label=t) for t, c in seen.items()],
                  loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=LEGEND_SIZE,
                  frameon=False, ncol=min(5, _columns(list(seen), panel.grid.get("w", 8))))


def _finite(ys: Sequence[float]) -> list[float]:
    return [y for y in ys if not math.isnan(y)]


# Grafana's reducers (a stat panel's reduceOptions.calcs), over the points of the range
REDUCERS = {
    "lastNotNull": lambda ys: _finite(ys)[-1] if _finite(ys) else None,
    "last": lambda ys: ys[-1] if ys else None,
    "firstNotNull": lambda ys: _finite(ys)[0] if _finite(ys) else None,
    "mean": lambda ys: sum(_finite(ys)) / len(_finite(ys)) if _finite(ys) else None,
    "max": lambda ys: max(_finite(ys), default=None),
    "min": lambda ys: min(_finite(ys), default=None),
    "sum": lambda ys: sum(_finite(ys)) if _finite(ys) else None,
}


def reduce_series(panel: Panel, ys: Sequence[float]) -> float | None:
    """One series of a stat panel as the panel reduces it (Grafana's default: the last
    value); a reduction this renderer doesn't know is an error, never a wrong number."""
    calcs = panel.raw.get("options", {}).get("reduceOptions", {}).get("calcs") or ["lastNotNull"]
    if calcs[0] not in REDUCERS:
        raise ValueError(f"{panel.title}: reduction {calcs[0]!r} is not drawn by this renderer")
    return REDUCERS[calcs[0]](ys)


def draw_stat(ax: Any, panel: Panel, data: list) -> None:
    ax.set_axis_off()
    if not data:
        return
    steps = panel.raw.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get(
        "steps", [])

    def color_of(value: float) -> str:
        color = "green"
        for step in steps:
            if step.get("value") is None or value >= step["value"]:
                color = step.get("color", color)
        return _color(color)

    reduced = [(label, ys, reduce_series(panel, ys)) for label, _, ys in data]
    for i, (label, ys, value) in enumerate(reduced):
        if value is None:
            continue
        # the series beneath its number, as Grafana's area graph mode draws it
        slot = ax.inset_axes([i / len(reduced), 0.0, 1 / len(reduced), 0.45])
        slot.set_axis_off()
        slot.fill_between(range(len(ys)), ys, color=color_of(value), alpha=0.18, linewidth=0)
        slot.set_ylim(bottom=min(0.0, min(_finite(ys), default=0.0)))
        text = format_value(value, panel.unit)
        if len(reduced) > 1:
            text = f"{label}\n{text}"
        ax.text((i + 0.5) / len(reduced), 0.5, text, ha="center", va="center",
                fontsize=20 if len(reduced) == 1 else 12, color=color_of(value),
                weight="bold", transform=ax.transAxes)


def _dt(t: float) -> Any:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, tz=timezone.utc)


def render(board: dict[str, Any], prom: Prometheus, out: Path, start: float, end: float,
           step: float = 2.0) -> dict[str, int]:
    """Draw ``board`` to ``out`` (PNG); return the number of series each panel showed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = board.get("panels") or []
    rows = max((p["gridPos"]["y"] + p["gridPos"]["h"] for p in items), default=1)
    unit_h = 0.55  # inches per grid row
    fig = plt.figure(figsize=(20, rows * unit_h + 0.8), dpi=80)
    fig.suptitle(f"{board['title']}  (all hosts, all GPUs; {time.strftime('%H:%M:%S', time.gmtime(start))}"
                 f"-{time.strftime('%H:%M:%S', time.gmtime(end))} UTC)", fontsize=13, x=0.01,
                 ha="left")
    top = 1 - 0.8 / (rows * unit_h + 0.8)
    values = all_values(board, step)
    counts: dict[str, int] = {}

    def box(grid: dict[str, int], pad_bottom: float, label_share: float) -> list[float]:
        x = grid["x"] / 24 + 0.035
        w = grid["w"] / 24 - 0.05
        # state timelines name their rows inside the panel, on the left, as Grafana does
        x, w = x + w * label_share, w * (1 - label_share)
        y_top = top - grid["y"] / rows * top
        h = grid["h"] / rows * top
        return [x, y_top - h + pad_bottom * h, w, h * (1 - pad_bottom) - 0.35 / (rows * unit_h)]

    for raw in items:
        grid = raw["gridPos"]
        if raw.get("type") == "row":
            fig.text(0.01, top - grid["y"] / rows * top - 0.004, raw.get("title", ""),
                     fontsize=12, weight="bold", va="top")
            continue
        panel = next(panels({"uid": board["uid"], "panels": [raw]}))
        data = _series(prom, panel, values, start, end, step)
        counts[panel.title] = len(data)
        pad = 0.1 if panel.type == "stat" else 0.38
        ax = fig.add_axes(box(grid, pad, 0.22 if panel.type == "state-timeline" else 0))
        ax.set_title(panel.title, fontsize=TITLE_SIZE, loc="left")
        ax.tick_params(labelsize=TICK_SIZE)
        if panel.type == "timeseries":
            draw_timeseries(ax, panel, data, start, end, step)
        elif panel.type == "state-timeline":
            draw_states(ax, panel, data, start, end)
        elif panel.type == "stat":
            draw_stat(ax, panel, data)
        if not data:
            ax.text(0.5, 0.5, "No data", ha="center", va="center", color="#888",
                    transform=ax.transAxes, fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return counts


def render_all(prom: Prometheus, out_dir: Path, start: float, end: float,
               step: float = 2.0) -> dict[str, dict[str, int]]:
    return {path.stem: render(load(path), prom, out_dir / f"dashboard-{path.stem.removeprefix('gpuwatch-')}.png",
                              start, end, step)
            for path in dashboards()}


# -- --demo: two replay daemons and a Prometheus of our own -------------------------

def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(check: Any, what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = check()
        except (OSError, ValueError):
            result = None
        if result:
            return result
        time.sleep(0.2)
    raise SystemExit(f"gave up waiting for {what}")


def demo(seconds: float, out_dir: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("--demo needs prometheus (apt-get install prometheus)")
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="gpuwatch-render-"))
    try:
        env = dict(os.environ, PYTHONPATH=str(REPO), XDG_RUNTIME_DIR=str(tmp))
        targets = []
        for name in DEMO_RECORDINGS:
            port = _free_port()
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "gpuwatch", "run", "--quiet", "--replay",
                 str(REPO / "tests" / "data" / name), "--web.listen-address",
                 f"127.0.0.1:{port}"], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            targets.append(f"127.0.0.1:{port}")
        port = _free_port()
        (tmp / "prometheus.yml").write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                       "scrape_timeout": "1s"},
            "rule_files": [str(RECORDING_RULES)],
            # named as hosts are (the docs' legends: "gpu-host-1:9442 GPU 0"), not by the
            # free ports the two replays took here
            "scrape_configs": [{"job_name": "gpuwatch", "static_configs": [
                {"targets": [t], "labels": {"instance": f"gpu-host-{i}:9442"}}
                for i, t in enumerate(targets, 1)]}]}))
        procs.append(subprocess.Popen(
            [binary, f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--log.level=warn"], cwd=tmp, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        prom = Prometheus(f"http://127.0.0.1:{port}")
        _wait(lambda: len(prom.api("query", query="up == 1")["result"]) == len(targets),
              "Prometheus to scrape both daemons", 60)
        start = time.time()
        print(f"gathering {seconds:g} s of data from {', '.join(targets)} ...", file=sys.stderr)
        time.sleep(seconds)
        for uid, counts in render_all(prom, out_dir, start, time.time()).items():
            empty = [title for title, n in counts.items() if n == 0]
            print(f"{uid}: {len(counts)} panels" + (f", no data in: {', '.join(empty)}"
                                                    if empty else ""), file=sys.stderr)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m grafana.render", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prometheus", metavar="URL", help="a Prometheus holding gpuwatch data")
    source.add_argument("--demo", action="store_true",
                        help="start two replay daemons and a Prometheus, then render")
    parser.add_argument("--minutes", type=float, default=15,
                        help="with --prometheus: the window to draw (default 15)")
    parser.add_argument("--seconds", type=float, default=150,
                        help="with --demo: how long to gather data (default 150)")
    parser.add_argument("--out", type=Path, default=REPO / "docs",
                        help="folder for dashboard-*.png (default: docs/)")
    args = parser.parse_args(argv)
    if args.demo:
        demo(args.seconds, args.out)
    else:
        end = time.time()
        render_all(Prometheus(args.prometheus), args.out, end - args.minutes * 60, end,
                   step=max(1.0, args.minutes * 60 / 600))
    return 0


if __name__ == "__main__":
    sys.exit(main())
