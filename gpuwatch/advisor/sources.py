"""Data sources for the advisor: a recording, a running daemon, a Prometheus server.

Each maps its data onto the trace vocabulary and feeds the same :class:`Engine`.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gpuwatch.advisor.engine import Engine, resolution_for
from gpuwatch.advisor.rules import RuleSet
from gpuwatch.errors import UserError


def trace_sample_seconds(path: str) -> float | None:
    """The sampler's interval a recording names in its meta line (None when unknown)."""
    from gpuwatch.trace.format import _open_binary

    try:
        with _open_binary(path) as f:  # plain or gzip, as the reader opens it
            lines = [f.readline() for _ in range(5)]
    except (OSError, EOFError, zlib.error, UserError):
        return None
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and d.get("kind") == "meta":
            hz = d.get("sample_hz")
            if isinstance(hz, (int, float)) and not isinstance(hz, bool) \
                    and math.isfinite(hz) and hz > 0:
                return 1.0 / float(hz)
            return None
    return None


def replay_resolution(path: str) -> float:
    """The bucket a recording is judged in: by its length and its sampler's interval."""
    span = trace_span(path)
    return resolution_for(span if span is not None else 0.0, trace_sample_seconds(path))


def trace_span(path: str) -> float | None:
    """Seconds between a plain recording's first and last lines (None when unknown)."""
    try:
        with open(path, "rb") as f:
            if f.read(2) == b"\x1f\x8b":
                return None  # compressed: no cheap way to the end
            f.seek(0)
            first_t = None
            for _ in range(5):
                line = f.readline()
                if not line:
                    break
                t = _line_t(line)
                if t is not None:
                    first_t = t
                    break
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 65536))
            tail = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(tail):
        t = _line_t(line)
        if t is not None and first_t is not None:
            return max(0.0, t - first_t)
    return None


def _line_t(line: bytes) -> float | None:
    try:
        d = json.loads(line)
    except ValueError:
        return None
    t = d.get("t") if isinstance(d, dict) else None
    return float(t) if isinstance(t, (int, float)) else None


def judge_trace(path: str, ruleset: RuleSet, *, res: float | None = None,
                observe: Callable[[Any], None] | None = None,
                on_bucket: Callable[[Engine, int], None] | None = None
                ) -> tuple[Engine, dict]:
    """Judge a whole recording (streamed, bounded memory); returns the engine and meta.
    ``observe`` sees every line the engine is fed (the report's tally of what it judged);
    ``on_bucket(engine, idx)`` runs after the rules judged each closed bucket (the HTML
    report's charts read the step-time breakdown there, while the frame still holds it).

    A long recording of several GPUs is judged by several processes at once, each its
    share of the GPUs (split.py; ``GPUWATCH_REPLAY_WORKERS`` sets how many): the same
    engine and report as one process would make."""
    from gpuwatch.advisor import split

    if res is None:
        res = replay_resolution(path)
    engine = Engine(ruleset, res=res)
    planned = split.plan(path)
    limit = planned.size if planned.workers > 1 else None
    children: list = []

    def run(other: Engine) -> None:  # a child's share, fed the whole recording
        _feed_recording(other, path, limit=limit)

    try:
        if planned.workers > 1:
            judges = split.shares(planned.workers, planned.gpus, charts=on_bucket is not None)
            children = split.start(engine, run, judges)
            if children:
                engine.judge_only(split.mine(judges, children))
        if on_bucket is not None:
            evaluate = engine.frame.on_bucket

            def both(idx: int) -> None:
                if evaluate is not None:
                    evaluate(idx)
                on_bucket(engine, idx)

            engine.frame.on_bucket = both
        meta = _feed_recording(engine, path, observe, limit=limit)
        if children:
            split.finish(engine, run, children)
    except BaseException:
        split.abandon(children)
        raise
    return engine, meta


def _feed_recording(engine: Engine, path: str,
                    observe: Callable[[Any], None] | None = None,
                    limit: int | None = None) -> dict:
    """Feed a whole recording (its first ``limit`` bytes) to ``engine`` and close its last
    bucket; its meta line."""
    from gpuwatch.trace import format as trace

    # checked line dicts, not sample objects: the frame reads fields by name either way,
    # and building a frozen dataclass per line was a third of the reader's time
    meta, lines = trace.iter_trace_lines(path, limit)
    engine.frame.set_meta(meta)
    for gpu, info in trace.meta_infos(meta).items():
        engine.frame.set_gpu_info(gpu, name=info.name, cc=info.compute_capability)
    if observe is not None:
        lines = _tee(lines, observe)
    engine.feed_all(lines)
    engine.finish()
    return dict(meta)


# how the bundled recording is named in a report (`advise --demo`, `run --demo`)
DEMO_NAME = "demo (bundled recording)"
NO_GPU_IN_RECORDING = ("the recording holds no GPU lines (it was made where NVML found no "
                       "GPU: a CPU-only job, or a host without the NVIDIA driver)")


def recording_report(path: str, ruleset: RuleSet, *, shown: str | None = None,
                     observe: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """The report of a whole recording: what `gpuwatch advise --replay FILE` prints (as
    JSON), and what the daemon serves at /api/advice while it replays FILE. ``shown``
    names the file in the report; ``observe`` sees every line judged (progress)."""
    return judge_recording(path, ruleset, shown=shown, observe=observe)[0]


def judge_recording(path: str, ruleset: RuleSet, *, shown: str | None = None,
                    observe: Callable[[Any], None] | None = None, res: float | None = None,
                    on_bucket: Callable[[Engine, int], None] | None = None
                    ) -> tuple[dict[str, Any], Engine, dict]:
    """A recording judged whole: its report, the engine that judged it, its meta line
    (the HTML report's timeline reads the engine as it goes: ``on_bucket``)."""
    from gpuwatch.advisor import report

    tally = report.RunTally()
    feed = tally.feed
    if observe is not None:
        def feed(line: Any) -> None:
            tally.feed(line)
            observe(line)
    engine, meta = judge_trace(path, ruleset, res=res, observe=feed, on_bucket=on_bucket)
    frame = engine.frame
    src = {"kind": "replay", "path": shown or path, "scenario": meta.get("scenario"),
           "start": frame.t_first, "end": frame.t_last,
           "duration_seconds": (frame.t_last - frame.t_first)
           if frame.t_first is not None and frame.t_last is not None else None,
           "resolution_seconds": engine.res}
    rep = report.build_report([(engine, engine.summary(), None)], src, tally=tally,
                              no_gpu_reason=NO_GPU_IN_RECORDING)
    return rep, engine, meta


def _tee(lines: Iterable[Any], observe: Callable[[Any], None]) -> Iterator[Any]:
    for line in lines:
        observe(line)
        yield line


# -- a running daemon ------------------------------------------------------------------------
def fetch_json(url: str, timeout: float = 10.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as err:
        # the whole answer is parsed (a daemon's own error may be long), a part of it shown
        body = err.read(1 << 16).decode("utf-8", "replace")
        try:
            said = json.loads(body).get("error")
        except (ValueError, AttributeError):
            said = None
        if isinstance(said, str):  # a gpuwatch daemon's own error
            raise UserError(f"{url} answered HTTP {err.code}: {said[:300]}") from err
        # another server's page (HTML, text): not pasted in, one line says what it is
        kind = (err.headers.get("Content-Type") or "no content type").split(";")[0]
        raise UserError(f"{url} answered HTTP {err.code} ({kind}): not a gpuwatch daemon's "
                        "answer; is the address right (gpuwatch run serves /api/advice)?"
                        ) from err
    except (TimeoutError, urllib.error.URLError, ConnectionError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise UserError(f"nothing answers at {url} ({reason}); is the daemon running "
                        "(gpuwatch run)? Or judge a recording with --replay FILE") from err
    except ValueError as err:
        raise UserError(f"{url} did not answer JSON: {err}") from err


def _check_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UserError(f"bad URL {url!r}: expected http://HOST:PORT")
    return url.rstrip("/")


def fetch_daemon_report(url: str) -> dict[str, Any]:
    """The daemon's /api/advice report (the live advisor's, same JSON as --format json)."""
    report = fetch_json(_check_url(url) + "/api/advice")
    if not isinstance(report, dict) or not isinstance(report.get("advice"), list):
        raise UserError(f"{url}/api/advice did not answer an advice report")
    for i, item in enumerate(report["advice"]):
        # what every renderer reads of an item: a daemon of another version may say less
        missing = [k for k in _ADVICE_KEYS if not isinstance(item, dict) or k not in item]
        if missing:
            raise UserError(f"{url}/api/advice: advice item {i} lacks {', '.join(missing)} "
                            f"(report format {report.get('format')!r}: a daemon of another "
                            "gpuwatch version?)")
    return report


_ADVICE_KEYS = ("id", "severity", "title", "message", "action", "evidence", "gpu",
                "confidence", "expected_gain", "expected_gain_text", "hook_would_add")


# -- Prometheus --------------------------------------------------------------------------------
# exported name -> (vocabulary field on a gpu/host line, scale)
_GPU_SERIES = {
    "gpuwatch_gpu_utilization_ratio": ("util", 1.0),
    "gpuwatch_gpu_memory_utilization_ratio": ("mem_util", 1.0),
    "gpuwatch_gpu_memory_used_bytes": ("mem_used_bytes", 1.0),
    "gpuwatch_gpu_memory_total_bytes": ("mem_total_bytes", 1.0),
    "gpuwatch_gpu_power_watts": ("power_watts", 1.0),
    "gpuwatch_gpu_power_limit_watts": ("power_limit_watts", 1.0),
    "gpuwatch_gpu_temperature_celsius": ("temp_celsius", 1.0),
    "gpuwatch_gpu_sm_clock_hertz": ("sm_clock_mhz", 1e-6),
    "gpuwatch_gpu_memory_clock_hertz": ("mem_clock_mhz", 1e-6),
    "gpuwatch_gpu_pstate": ("pstate", 1.0),
    "gpuwatch_gpu_energy_joules_total": ("energy_joules", 1.0),
    "gpuwatch_gpu_pcie_replays_total": ("pcie_replay_total", 1.0),
    "gpuwatch_gpu_remapped_rows_pending": ("remapped_rows_pending", 1.0),
    "gpuwatch_gpu_remapped_rows_failure": ("remapped_rows_failure", 1.0),
    "gpuwatch_gpu_sm_active_ratio": ("sm_active", 1.0),
    "gpuwatch_gpu_sm_occupancy_ratio": ("sm_occupancy", 1.0),
    "gpuwatch_gpu_tensor_active_ratio": ("tensor_active", 1.0),
    "gpuwatch_gpu_dram_active_ratio": ("dram_active", 1.0),
    "gpuwatch_gpu_fp16_active_ratio": ("fp16_active", 1.0),
    "gpuwatch_gpu_fp32_active_ratio": ("fp32_active", 1.0),
    "gpuwatch_gpu_fp64_active_ratio": ("fp64_active", 1.0),
}
_HOST_SERIES = {
    "gpuwatch_host_cpu_utilization_ratio": "cpu_util",
    "gpuwatch_host_load1": "load1",
    "gpuwatch_host_load5": "load5",
    "gpuwatch_host_memory_used_bytes": "mem_used_bytes",
    "gpuwatch_host_memory_total_bytes": "mem_total_bytes",
    "gpuwatch_host_swap_used_bytes": "swap_used_bytes",
}
# summed over the job trees of one instance
_JOB_SERIES = {
    "gpuwatch_job_cpu_cores": "job_cpu_cores",
    "gpuwatch_job_main_cpu_cores": "job_main_cpu_cores",
    "gpuwatch_job_workers_cpu_cores": "job_workers_cpu_cores",
    "gpuwatch_job_processes": "job_processes",
    "gpuwatch_job_rss_bytes": "job_rss_bytes",
    "gpuwatch_job_loader_workers": "job_loader_workers",
    "gpuwatch_job_loader_cpu_cores": "job_loader_cpu_cores",
    "gpuwatch_job_write_bytes_per_second": "job_write_bytes_per_second",
}
_TRAIN_SERIES = {
    "gpuwatch_train_steps_total": "steps_total",
    "gpuwatch_train_skipped_steps_total": "skipped_total",
    "gpuwatch_train_step_seconds": "step_seconds",
    "gpuwatch_train_data_wait_ratio": "data_wait_ratio",
    "gpuwatch_train_loss_scale": "loss_scale",
    "gpuwatch_train_samples_per_second": "samples_per_second",
    "gpuwatch_train_memory_allocated_bytes": "mem_allocated_bytes",
    "gpuwatch_train_memory_reserved_bytes": "mem_reserved_bytes",
    "gpuwatch_train_memory_max_allocated_bytes": "max_mem_allocated_bytes",
}
_REASON_BITS = {"gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4,
                "hw_slowdown": 0x8, "sync_boost": 0x10, "sw_thermal_slowdown": 0x20,
                "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80,
                "display_clock_setting": 0x100}


# one label matcher of a PromQL selector: name, operator, a quoted value
_MATCHER = re.compile(r"""\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"""
                      r"""("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)\s*""")


def parse_selector(text: str) -> str:
    """Check a ``--match`` selector (``instance=~"gpu-1.*"``, braces optional, matchers
    separated by commas) and return its matchers, ready to go inside ``{...}``.

    Raises UserError naming what was expected where. Prometheus parses it again (it has
    the last word on regular expressions)."""
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    if not body.strip():
        raise UserError(f"--match {text!r} is empty: expected label matchers such as "
                        "instance=~\"gpu-1.*\"")
    out = []
    pos = 0
    while pos < len(body):
        m = _MATCHER.match(body, pos)
        if m is None:
            raise UserError(f"--match {text!r}: expected LABEL=\"VALUE\" (or !=, =~, !~ and a "
                            f"quoted value) at {body[pos:].strip()[:40]!r}")
        name, op, quoted = m.groups()
        if name == "__name__":
            raise UserError(f"--match {text!r}: __name__ can't be matched (gpuwatch chooses "
                            "the series); match target labels such as instance or job")
        if op in ("=~", "!~"):
            value = quoted[1:-1] if quoted[0] == "`" else _unquote(quoted)
            try:
                re.compile(value)
            except re.error as err:
                raise UserError(f"--match {text!r}: bad regular expression {value!r} for "
                                f"{name}: {err}") from err
        out.append(f"{name}{op}{quoted}")
        pos = m.end()
        if pos < len(body):
            if body[pos] != ",":
                raise UserError(f"--match {text!r}: expected ',' between matchers at "
                                f"{body[pos:].strip()[:40]!r}")
            pos += 1
    return ",".join(out)


def _unquote(quoted: str) -> str:
    if quoted[0] == '"':
        try:
            return str(json.loads(quoted))
        except ValueError:
            return quoted[1:-1]
    return quoted[1:-1].replace("\\'", "'")


class _Prom:
    """Range queries against one Prometheus, every one narrowed by ``selector``."""

    def __init__(self, url: str, start: float, end: float, step: float,
                 selector: str = "") -> None:
        self.url = _check_url(url)
        self.start, self.end, self.step = start, end, step
        self.selector = selector

    def sel(self, name: str) -> str:
        """``name{selector}`` (just the name without a selector)."""
        return f"{name}{{{self.selector}}}" if self.selector else name

    def query_range(self, query: str) -> list[dict[str, Any]]:
        params = {"query": query, "start": f"{self.start:.3f}", "end": f"{self.end:.3f}",
                  "step": f"{self.step:g}"}
        data = prom_get(self.url, "/api/v1/query_range", params)
        return data.get("result", []) if isinstance(data, dict) else []


def prom_get(base: str, path: str, params: dict[str, str]) -> Any:
    """GET one Prometheus HTTP API call; its ``data``. Every failure is a short UserError
    naming the server (never the encoded query, which can run to kilobytes)."""
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=30.0) as resp:
            body = resp.read()
    except urllib.error.HTTPError as err:
        text = err.read().decode("utf-8", "replace")
        try:
            reason = json.loads(text).get("error") or text
        except (ValueError, AttributeError):
            reason = text
        if err.code == 404:
            raise UserError(f"{base} answered HTTP 404 for {path}: is it a Prometheus server? "
                            "(--prometheus takes Prometheus' URL, e.g. http://prom:9090, "
                            "not a gpuwatch daemon's)") from err
        raise UserError(f"Prometheus at {base} refused the query (HTTP {err.code}): "
                        f"{str(reason).strip()[:300]}") from err
    except (TimeoutError, urllib.error.URLError, ConnectionError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise UserError(f"nothing answers at {base} ({reason}): is Prometheus running there? "
                        "(--prometheus takes its URL, e.g. http://prom:9090)") from err
    try:
        data = json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"{base}{path} did not answer JSON: is it a Prometheus server?") from err
    if not isinstance(data, dict) or data.get("status") != "success":
        got = data.get("error", data) if isinstance(data, dict) else data
        raise UserError(f"Prometheus at {base} refused the query: {str(got)[:300]}")
    return data.get("data")


def _points(series: dict[str, Any]) -> list[tuple[float, float]]:
    out = []
    for t, v in series.get("values", []):
        try:
            x = float(v)
        except ValueError:
            continue
        if math.isfinite(x):
            out.append((float(t), x))
    return out


def judge_prometheus(url: str, ruleset: RuleSet, *, window: float = 600.0,
                     end: float | None = None, step: float | None = None,
                     selector: str = "") -> dict[str, tuple[Engine, dict[str, Any]]]:
    """Query every gpuwatch_* series over ``window`` seconds and judge each instance.

    ``selector`` (from :func:`parse_selector`) narrows every query, e.g. to some instances.
    Returns instance -> (engine, facts). Series are mapped back onto the trace vocabulary:
    one synthetic gpu/host/step line per instance, GPU and query step. Each instance is
    queried and judged on its own (an engine of its own, queries narrowed to it), so
    nothing crosses from one host to another and memory stays that of one host however
    large the fleet. The facts hold what the report lists per host: every GPU seen
    (``gpu_up``) and every job and rank the hook reported (``jobs``).
    """
    import time as _time

    end = _time.time() if end is None else end
    if step is None:
        step = max(1.0, min(60.0, window / 1000.0))
    out: dict[str, tuple[Engine, dict[str, Any]]] = {}
    for inst in prometheus_instances(url, window=window, end=end, selector=selector):
        one = "instance=" + json.dumps(inst, ensure_ascii=False)
        out.update(_judge_selection(url, ruleset, window=window, end=end, step=step,
                                    selector=f"{selector},{one}" if selector else one))
    return out


def prometheus_instances(url: str, *, window: float, end: float, selector: str = ""
                         ) -> list[str]:
    """Every instance with a gpuwatch_* series matching ``selector`` in the window."""
    sel = f",{selector}" if selector else ""
    span = f"{max(1, round(window * 1000))}ms"
    query = f'group by (instance) (last_over_time({{__name__=~"gpuwatch_.+"{sel}}}[{span}]))'
    data = prom_get(_check_url(url), "/api/v1/query", {"query": query, "time": f"{end:.3f}"})
    result = data.get("result", []) if isinstance(data, dict) else []
    return sorted({r.get("metric", {}).get("instance", "") for r in result})


def _judge_selection(url: str, ruleset: RuleSet, *, window: float, end: float, step: float,
                     selector: str) -> dict[str, tuple[Engine, dict[str, Any]]]:
    """Judge what ``selector`` selects, one engine per instance in it."""
    prom = _Prom(url, end - window, end, step, selector)
    # instance -> t -> {gpu -> line}
    gpu_lines: dict[str, dict[float, dict[int, dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(dict))
    host_lines: dict[str, dict[float, dict[str, Any]]] = defaultdict(dict)
    step_lines: dict[str, list[dict[str, Any]]] = defaultdict(list)
    facts: dict[str, dict[str, Any]] = defaultdict(lambda: {"gpus": {}, "gpu_up": {},
                                                            "jobs": []})

    def gline(inst: str, t: float, gpu: int) -> dict[str, Any]:
        per_t = gpu_lines[inst][t]
        line = per_t.get(gpu)
        if line is None:
            line = per_t[gpu] = {"kind": "gpu", "t": t, "gpu": gpu}
        return line

    names = "|".join(list(_GPU_SERIES) + list(_HOST_SERIES) + list(_JOB_SERIES))
    sel = f",{selector}" if selector else ""
    for s in prom.query_range(f'{{__name__=~"{names}"{sel}}}'):
        labels = s.get("metric", {})
        name = labels.get("__name__", "")
        inst = labels.get("instance", "")
        if name in _GPU_SERIES:
            gpu = _int(labels.get("gpu"))
            if gpu is None:
                continue
            field, scale = _GPU_SERIES[name]
            for t, v in _points(s):
                gline(inst, t, gpu)[field] = v * scale
        elif name in _HOST_SERIES:
            for t, v in _points(s):
                host_lines[inst].setdefault(t, {"kind": "host", "t": t})[_HOST_SERIES[name]] = v
        elif name in _JOB_SERIES:
            field = _JOB_SERIES[name]
            for t, v in _points(s):
                line = host_lines[inst].setdefault(t, {"kind": "host", "t": t})
                line[field] = line.get(field, 0.0) + v
    for s in prom.query_range(f'sum by (instance, gpu, type) ({prom.sel("gpuwatch_gpu_ecc_errors_total")})'):
        labels = s.get("metric", {})
        gpu = _int(labels.get("gpu"))
        field = {"uncorrected": "ecc_uncorrected_total", "corrected": "ecc_corrected_total"}.get(
            labels.get("type", ""))
        if gpu is None or field is None:
            continue
        for t, v in _points(s):
            gline(labels.get("instance", ""), t, gpu)[field] = v
    for s in prom.query_range(f"sum by (instance, gpu) ({prom.sel('gpuwatch_gpu_xid_errors_total')})"):
        labels = s.get("metric", {})
        gpu = _int(labels.get("gpu"))
        if gpu is None:
            continue
        for t, v in _points(s):
            gline(labels.get("instance", ""), t, gpu)["xid_total"] = {0: int(v)}
    # DataLoader workers started in the job trees in each step: the counter's rate over a
    # minute (two steps where they are longer), times the step
    span = f"{max(60_000, round(2 * step * 1000))}ms"
    started = prom.sel("gpuwatch_job_loader_workers_started_total")
    for s in prom.query_range(f"sum by (instance) (rate({started}[{span}])) * {step:g}"):
        inst = s.get("metric", {}).get("instance", "")
        for t, v in _points(s):
            host_lines[inst].setdefault(t, {"kind": "host", "t": t})["job_loader_workers_started"] = v
    for s in prom.query_range(prom.sel("gpuwatch_gpu_clock_event_reason")):
        labels = s.get("metric", {})
        gpu, bit = _int(labels.get("gpu")), _REASON_BITS.get(labels.get("reason", ""))
        if gpu is None or bit is None:
            continue
        for t, v in _points(s):
            line = gline(labels.get("instance", ""), t, gpu)
            line["clock_event_reasons"] = line.get("clock_event_reasons", 0) | (bit if v else 0)
    for s in prom.query_range(prom.sel("gpuwatch_process_gpu_memory_used_bytes")):
        labels = s.get("metric", {})
        gpu, pid = _int(labels.get("gpu")), _int(labels.get("pid"))
        if gpu is None or pid is None:
            continue
        for t, v in _points(s):
            line = gline(labels.get("instance", ""), t, gpu)
            line.setdefault("processes", []).append({"pid": pid, "mem_used_bytes": v})
    for s in prom.query_range(
            f"count by (instance) ({prom.sel('gpuwatch_host_cpu_core_utilization_ratio')})"):
        pts = _points(s)
        if pts:
            facts[s["metric"].get("instance", "")]["host_cpus"] = pts[-1][1]
    for s in prom.query_range(prom.sel("gpuwatch_gpu_up")):
        labels = s.get("metric", {})
        gpu, pts = _int(labels.get("gpu")), _points(s)
        if gpu is not None and pts:
            facts[labels.get("instance", "")]["gpu_up"][gpu] = pts[-1][1] == 1.0
    for s in prom.query_range(prom.sel("gpuwatch_gpu_info")):
        labels = s.get("metric", {})
        gpu = _int(labels.get("gpu"))
        if gpu is not None:
            facts[labels.get("instance", "")]["gpus"][gpu] = {
                "name": labels.get("name"), "compute_capability": labels.get("compute_capability")}
    for inst, jobs in _train_lines(prom, step, step_lines).items():
        facts[inst]["jobs"] = jobs
    # GPU lines without processes read as "no process holds the GPU", as NVML would say
    for per_t in gpu_lines.values():
        for lines in per_t.values():
            for line in lines.values():
                line.setdefault("processes", [])
    out: dict[str, tuple[Engine, dict[str, Any]]] = {}
    for inst in sorted(set(gpu_lines) | set(host_lines) | set(facts)):
        engine = Engine(ruleset, res=step)
        f = facts[inst]
        if f.get("host_cpus"):
            engine.frame.set_meta({"host_cpus": f["host_cpus"]})
        for gpu, info in f["gpus"].items():
            engine.frame.set_gpu_info(gpu, name=info.get("name"), cc=info.get("compute_capability"))
        merged: list[dict[str, Any]] = []
        for lines in gpu_lines.get(inst, {}).values():
            merged.extend(lines.values())
        merged.extend(host_lines.get(inst, {}).values())
        merged.extend(step_lines.get(inst, []))
        merged.sort(key=lambda d: d["t"])
        engine.feed_all(merged)
        engine.finish()
        out[inst] = (engine, {"instance": inst, **f})
    return out


def _train_lines(prom: _Prom, step: float, out: dict[str, list[dict[str, Any]]]
                 ) -> dict[str, list[dict[str, Any]]]:
    """The hook's per-job gauges and counters as synthetic step lines (one per query step).

    Returns instance -> one summary per job and rank (pid, rank, GPU, medians over the
    window), for the fleet report and for comparing the ranks of one job across hosts."""
    names = "|".join(_TRAIN_SERIES)
    sel = f",{prom.selector}" if prom.selector else ""
    # (instance, pid, rank, gpu) -> t -> field -> value
    jobs: dict[tuple[str, str, str, str], dict[float, dict[str, float]]] = defaultdict(
        lambda: defaultdict(dict))
    for s in prom.query_range(f'{{__name__=~"{names}"{sel}}}'):
        labels = s.get("metric", {})
        key = (labels.get("instance", ""), labels.get("pid", ""), labels.get("rank", ""),
               labels.get("gpu", ""))
        field = _TRAIN_SERIES.get(labels.get("__name__", ""))
        if field is None:
            continue
        for t, v in _points(s):
            jobs[key][t][field] = v
    for (inst, pid, rank, gpu), per_t in jobs.items():
        prev_steps = prev_skipped = None
        for t in sorted(per_t):
            d = per_t[t]
            steps, skipped = d.get("steps_total"), d.get("skipped_total")
            count = None
            if steps is not None and prev_steps is not None:
                count = steps - prev_steps if steps >= prev_steps else steps
            skipped_now = None
            if skipped is not None and prev_skipped is not None:
                skipped_now = skipped - prev_skipped if skipped >= prev_skipped else skipped
            prev_steps, prev_skipped = steps, skipped
            if not count:
                continue
            line: dict[str, Any] = {"kind": "step", "t": t, "_count": count,
                                    "gpu": _int(gpu), "pid": _int(pid), "rank": _int(rank)}
            ss = d.get("step_seconds")
            if ss is not None:
                line["step_seconds"] = ss
                if d.get("data_wait_ratio") is not None:
                    line["data_wait_seconds"] = ss * d["data_wait_ratio"]
                if d.get("samples_per_second"):
                    line["batch_size"] = round(d["samples_per_second"] * ss)
            for f in ("loss_scale", "mem_allocated_bytes", "mem_reserved_bytes",
                      "max_mem_allocated_bytes"):
                if d.get(f) is not None:
                    line[f] = d[f]
            if skipped_now is not None:
                line["skipped"] = skipped_now > 0
            out[inst].append(line)
    shares = _time_shares(prom)
    summaries: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for (inst, pid, rank, gpu), per_t in sorted(jobs.items()):
        summaries[inst].append(_job_summary(pid, rank, gpu, per_t,
                                            shares.get((inst, pid, rank, gpu))))
    return summaries


def _time_shares(prom: _Prom) -> dict[tuple[str, str, str, str], dict[str, float]]:
    """Mean step-time share per category and job rank over the window, where the daemon
    exports ``gpuwatch_train_time_share_ratio`` (empty where it does not)."""
    out: dict[tuple[str, str, str, str], dict[str, float]] = defaultdict(dict)
    for s in prom.query_range(prom.sel("gpuwatch_train_time_share_ratio")):
        labels = s.get("metric", {})
        pts = [v for _, v in _points(s)]
        cat = labels.get("category")
        if pts and cat:
            key = (labels.get("instance", ""), labels.get("pid", ""), labels.get("rank", ""),
                   labels.get("gpu", ""))
            out[key][cat] = round(statistics.fmean(pts), 4)
    return out


def _job_summary(pid: str, rank: str, gpu: str, per_t: dict[float, dict[str, float]],
                 shares: dict[str, float] | None) -> dict[str, Any]:
    ts = sorted(per_t)

    def median(field: str) -> float | None:
        vals = [per_t[t][field] for t in ts if per_t[t].get(field) is not None]
        return round(statistics.median(vals), 6) if vals else None

    steps = [per_t[t]["steps_total"] for t in ts if per_t[t].get("steps_total") is not None]
    return {"pid": _int(pid), "rank": _int(rank), "gpu": _int(gpu),
            "first_seen": ts[0] if ts else None, "last_seen": ts[-1] if ts else None,
            "steps_total": steps[-1] if steps else None,
            "step_seconds": median("step_seconds"),
            "data_wait_ratio": median("data_wait_ratio"),
            "samples_per_second": median("samples_per_second"),
            "time_share": shares or None}


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None
