"""The advice report as one self-contained HTML file (``gpuwatch advise --format html``,
the notebook's ``%gpuwatch report``).

It holds the GPUs' facts; per GPU over time, util, SM and tensor active, memory, power and
clocks; per job and rank, step time, data wait and the step-time breakdown as stacked
areas, with the phases shaded; each piece of advice marked where it started, with its
evidence and the change; how jobs ended; the notes. The charts are inline SVG
(advisor/svg.py), the style sheet is inline, there is no script, and a
Content-Security-Policy forbids every fetch: the file opens offline and asks the network
for nothing.

Every number also in the JSON report carries it raw (``data-key`` = its path in the
report, ``data-value`` = the value), so a test or a script can check the page against
the JSON.
"""

from __future__ import annotations

import json
import secrets
from html import escape
from typing import Any

from gpuwatch.advisor import svg
from gpuwatch.advisor.report import (
    MIN_TRAINING_SECONDS,
    advice_order,
    blocks_of,
    duration,
    evidence_items,
    evidence_value,
    hook_text,
    host_kernels_note,
    lockstep_gpus,
    no_advice_text,
    not_judged_text,
    percent,
    same_on,
    source_line,
    spread_text,
    where_text,
)
from gpuwatch.advisor.rules import human_bytes
from gpuwatch.advisor.timeline import PHASES, Timeline

CATEGORIES = (("data", "data wait", "#e8a33d"), ("sync", "waiting on peers", "#9467bd"),
              ("gpu", "GPU work", "#2ca02c"), ("host", "host", "#1f77b4"),
              ("other", "other", "#b0b0b0"))
PHASE_COLORS = {"startup": "#7f7f7f", "compile": "#8c564b", "train": "#2ca02c",
                "eval": "#1f77b4", "checkpoint": "#d62728", "inference": "#9467bd"}
SEVERITY_COLORS = {"critical": "#b02a37", "warning": "#c77c02", "info": "#1f6feb"}
GiB = 2**30
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

STYLE = """
.gw-report{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2329;
 max-width:1000px;margin:0 auto;padding:8px 16px}
.gw-report h1{font-size:22px;margin:8px 0 2px}.gw-report h2{font-size:18px;margin:26px 0 6px;
 border-bottom:1px solid #d8dee4;padding-bottom:3px}.gw-report h3{font-size:15px;margin:16px 0 4px}
.gw-report .src{color:#57606a;margin:0 0 10px}
.gw-report table{border-collapse:collapse;margin:6px 0}.gw-report th,.gw-report td{
 border:1px solid #d8dee4;padding:3px 8px;text-align:left;vertical-align:top}
.gw-report th{background:#f3f5f7;font-weight:600}.gw-report td.num{text-align:right;
 font-variant-numeric:tabular-nums}
.gw-report .verdict{padding:8px 12px;border-radius:6px;background:#f3f5f7;margin:8px 0}
.gw-report ol.toc{margin:4px 0 4px 18px;padding:0}
.gw-report details{margin:6px 0}.gw-report summary{cursor:pointer;color:#57606a}
.gw-report h4{font-size:14px;margin:10px 0 2px}
.gw-report .card{border:1px solid #d8dee4;border-left:5px solid var(--sev);border-radius:6px;
 padding:8px 12px;margin:10px 0}
.gw-report .badge{display:inline-block;color:#fff;background:var(--sev);border-radius:10px;
 padding:0 8px;font-size:12px;font-weight:600;text-transform:uppercase}
.gw-report .num-badge{display:inline-block;width:20px;height:20px;border-radius:10px;
 background:var(--sev);color:#fff;text-align:center;font-size:12px;line-height:20px;
 font-weight:700;margin-right:4px}
.gw-report code{background:#f3f5f7;border-radius:3px;padding:0 3px}
.gw-report .muted{color:#57606a}.gw-report .note{border-left:4px solid #d8dee4;
 padding:2px 10px;color:#3b434b}
.gw-report svg.chart{display:block;max-width:100%;height:auto;background:#fff}
.gw-report svg .grid{stroke:#eaeef2;stroke-width:1}.gw-report svg .frame{fill:none;
 stroke:#afb8c1}.gw-report svg .tick{font-size:10px;fill:#57606a}
.gw-report svg .line{fill:none;stroke-width:1.6}.gw-report svg .span-label{font-size:10px}
.gw-report svg .mark-label{font-size:10px;fill:#fff;font-weight:700}
.gw-report ul.legend{list-style:none;margin:0 0 10px;padding:0 0 0 58px;font-size:12px;
 color:#3b434b}.gw-report ul.legend li{display:inline-block;margin-right:14px}
.gw-report .swatch{display:inline-block;width:14px;height:3px;vertical-align:middle;
 margin-right:4px}.gw-report .swatch.area{height:10px}
.gw-report .chart-title{font-weight:600;margin:10px 0 0;font-size:13px}
"""

_YES = {True: "yes", False: "no", None: "?"}


def _key(path: str, value: Any) -> str:
    """The attributes that tie a shown number to its place in the JSON report."""
    return f' data-key="{escape(path)}" data-value="{escape(json.dumps(value))}"'


def _t0(rep: dict[str, Any], tl: Timeline | None) -> float:
    if tl is not None and tl.t0 is not None:
        return tl.t0
    start = rep.get("source", {}).get("start")
    return float(start) if isinstance(start, (int, float)) else 0.0


def _since(rep: dict[str, Any], tl: Timeline | None, t: Any) -> str:
    if not isinstance(t, (int, float)):
        return "?"
    return f"+{t - _t0(rep, tl):.0f} s"


def render(report: dict[str, Any], timeline: Timeline | None = None, *,
           fragment: bool = False) -> str:
    """The report as HTML: a whole document, or (``fragment``) a ``<div>`` with its own
    style for a notebook's output (the style is scoped to it, its ids are unique)."""
    uid = "gw" + secrets.token_hex(3)
    advice = sorted(report.get("advice", []), key=advice_order)
    # the numbering of the advice: the text report's blocks (the same piece on several GPUs
    # is one card), in the JSON's order (advice_order); each piece carries its block's number
    blocks = blocks_of(advice, lockstep_gpus(report))
    numbers = {id(a): n for n, (_, _, group) in enumerate(blocks, 1) for a in group}
    body: list[str] = []
    body.append("<h1>gpuwatch report</h1>")
    body.append(f'<p class="src">{escape(source_line(report))} · torch hook data: '
                f"{hook_text(report)} · {escape(report.get('format', ''))}</p>")
    body.append(_verdict(report, advice, blocks, uid))
    body.append(_gpu_facts(report, timeline))
    if report.get("jobs"):
        body.append(_breakdown_table(report))
    if timeline is not None:
        for gpu in sorted(set(timeline.gpu) | {g["gpu"] for g in report.get("gpus", [])}):
            body.append(_gpu_charts(report, timeline, gpu, advice, numbers, uid))
        for job in sorted(timeline.jobs.values(), key=lambda j: (
                j.gpu if j.gpu is not None else -1, j.rank if j.rank is not None else -1,
                j.pid or 0)):
            if job.steps:
                body.append(_job_charts(report, timeline, job, advice, numbers, uid))
    else:
        body.append('<p class="note">No charts: this report comes from a daemon or a '
                    "Prometheus server, which hand over the verdict, not the recording. "
                    "Record the run (<code>gpuwatch run --record FILE</code>) and use "
                    "<code>gpuwatch advise --replay FILE --format html</code> for charts."
                    "</p>")
    body.append(_advice_cards(report, timeline, blocks, uid))
    if report.get("job_ends"):
        body.append("<h2>How jobs ended</h2><ul>" + "".join(
            f"<li>{escape(e['summary'])}.</li>" for e in report["job_ends"]) + "</ul>")
    if report.get("notes"):
        body.append("<h2>Notes</h2>" + "".join(
            f'<p class="note">{escape(n)}</p>' for n in report["notes"]))
    content = f'<div class="gw-report" id="{uid}">{"".join(body)}</div>'
    style = f"<style>{STYLE}</style>"
    if fragment:
        return style + content
    title = escape(f"gpuwatch report: {source_line(report)}")
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{title}</title>{style}</head><body>{content}</body></html>\n")


def _verdict(rep: dict[str, Any], advice: list[dict[str, Any]], blocks: list[Any],
             uid: str) -> str:
    if not advice:
        return f'<div class="verdict">{escape(no_advice_text(rep))}</div>'
    head = ""
    if rep.get("judged", {}).get("gpu") is False:
        head = f"<p>{escape(not_judged_text(rep))}</p>"
    n = len(advice)
    items = []
    for i, (a, gpus, _) in enumerate(blocks, 1):
        gain = (f" · expected gain {evidence_value('expected_gain', a['expected_gain'])}"
                if a.get("expected_gain") else "")
        items.append(f'<li><a href="#{uid}-advice-{i}"><code>{escape(a["id"])}</code></a> on '
                     f"{escape(where_text(a, gpus))}: {escape(a.get('title', ''))}{gain}</li>")
    what = "1 piece of advice" if n == 1 else f"{n} pieces of advice"
    order = "" if n == 1 else ", the one that wins back the most time first"
    return (f'<div class="verdict">{head}<b>{what}</b>{escape(same_on(n, len(blocks)))}{order}:'
            f'<ol class="toc">{"".join(items)}</ol></div>')


def _gpu_facts(rep: dict[str, Any], tl: Timeline | None) -> str:
    gpus = rep.get("gpus", [])
    if not gpus:
        reason = rep.get("judged", {}).get("reason") or "there is no GPU data"
        return f'<h2>GPUs</h2><p class="note">No GPU: {escape(reason)}.</p>'
    meta = tl.meta if tl is not None else {}
    rows = []
    for i, g in enumerate(gpus):
        s = g.get("supports", {})
        facts = tl.gpu_facts.get(g["gpu"], {}) if tl is not None else {}
        mem = human_bytes(facts["mem_total_bytes"]) if facts.get("mem_total_bytes") else "?"
        power = f"{facts['power_limit_watts']:.0f} W" if facts.get("power_limit_watts") else "?"
        cc = g.get("compute_capability") or "?"
        where = f"{g['instance']} " if g.get("instance") else ""
        rows.append(
            f"<tr><td>{escape(where)}{g['gpu']}</td><td>{escape(g.get('name') or '?')}</td>"
            f"<td{_key(f'gpus.{i}.compute_capability', g.get('compute_capability'))}>"
            f"{escape(cc)}</td><td>{mem}</td><td>{power}</td>"
            f"<td>{_YES[s.get('bf16')]}</td><td>{_YES[s.get('tf32')]}</td>"
            f"<td>{_YES[s.get('fp8')]}</td><td>{_YES[s.get('tensor_cores')]}</td>"
            f"<td>{_YES[g.get('gpm')]}</td><td>{_YES[g.get('hook')]}</td></tr>")
    driver = (f'<p class="muted">Driver {escape(str(meta["driver_version"]))}'
              f'{", " + str(meta["host_cpus"]) + " host CPUs" if meta.get("host_cpus") else ""}'
              "</p>") if meta.get("driver_version") else ""
    judged = _judged_rows(rep)
    return ("<h2>GPUs</h2><table><tr><th>GPU</th><th>model</th><th>compute capability</th>"
            "<th>memory</th><th>power limit</th><th>bf16</th><th>TF32</th><th>FP8</th>"
            "<th>tensor cores</th><th>GPM counters</th><th>torch hook</th></tr>"
            f"{''.join(rows)}</table>{driver}{judged}")


def _judged_rows(rep: dict[str, Any]) -> str:
    rows = []
    for i, g in enumerate(rep.get("judged", {}).get("gpus", [])):
        busy = g.get("busy_ratio")
        if busy is None or g.get("training_seconds", 0) < MIN_TRAINING_SECONDS:
            continue
        signal = {"breakdown": "GPU share of the step time", "sm_active": "SM active",
                  "util": "util"}.get(g.get("busy_signal"), g.get("busy_signal") or "?")
        rows.append(f"<tr><td>{g['gpu']}</td>"
                    f"<td class=\"num\"{_key(f'judged.gpus.{i}.training_seconds', g['training_seconds'])}>"
                    f"{escape(duration(g['training_seconds']))}</td>"
                    f"<td class=\"num\"{_key(f'judged.gpus.{i}.busy_ratio', busy)}>"
                    f"{percent(busy)}</td><td>{escape(signal)}</td></tr>")
    if not rows:
        return ""
    return ("<table><tr><th>GPU</th><th>trained for</th><th>busy meanwhile</th>"
            f"<th>read from</th></tr>{''.join(rows)}</table>")


def _who(j: Any) -> str:
    pid = j.get("pid") if isinstance(j, dict) else j.pid
    rank = j.get("rank") if isinstance(j, dict) else j.rank
    bits = [f"pid {pid}"] if pid is not None else []
    if rank is not None:
        bits.append(f"rank {rank}")
    return ", ".join(bits) or "the job"


def _breakdown_table(rep: dict[str, Any]) -> str:
    rows = []
    for i, j in enumerate(rep["jobs"]):
        shares = j.get("time_share") or {}
        kernels = host_kernels_note(j)
        cells = ""
        for c, _, _ in CATEGORIES:
            if c not in shares:
                cells += "<td>?</td>"
                continue
            shown = f"{_key(f'jobs.{i}.time_share.{c}', shares[c])}>{percent(shares[c])}"
            if c == "host" and kernels:
                # what of the host share had a kernel running, said beside it as the text
                # does (outside the keyed element, whose text is the share alone)
                cells += (f"<td class=\"num\"><span{shown}</span> "
                          f"<small>({escape(kernels)})</small></td>")
            else:
                cells += f"<td class=\"num\"{shown}</td>"
        step = (f"<td class=\"num\"{_key(f'jobs.{i}.step_seconds', j['step_seconds'])}>"
                f"{escape(duration(j['step_seconds']))}</td>") if j.get("step_seconds") else (
            "<td>no hook</td>" if j.get("source") == "nvml" else "<td>?</td>")
        steps = (f"<td class=\"num\"{_key(f'jobs.{i}.steps', j['steps'])}>{j['steps']}</td>"
                 if j.get("steps") is not None else "<td>?</td>")
        phases = ""
        if j.get("phases"):
            phases = ", ".join(f"{escape(p.replace('_', ' '))} {escape(duration(s))}" for p, s in sorted(
                j["phases"].items(), key=lambda kv: PHASES.index(kv[0])
                if kv[0] in PHASES else 99))
        where = f"{j['instance']} " if j.get("instance") else ""
        top = dict((c, n) for c, n, _ in CATEGORIES).get(j.get("bottleneck"), "?")
        gpu = "CPU" if j.get("gpu") is None else j["gpu"]
        rows.append(f"<tr><td>{escape(where)}{gpu}</td><td>{escape(_who(j))}</td>"
                    f"{cells}{step}{steps}<td>{escape(top)}</td>"
                    f"<td>{phases or '<span class=muted>none reported</span>'}</td></tr>")
    heads = "".join(f"<th>{n}</th>" for _, n, _ in CATEGORIES)
    return ("<h2>Where the time went</h2><p class=\"muted\">Each job's (rank's) wall time "
            "over the run, split so the parts add up to 100 %.</p>"
            f"<table><tr><th>GPU</th><th>job</th>{heads}<th>step</th><th>steps</th>"
            f"<th>bottleneck</th><th>phases</th></tr>{''.join(rows)}</table>")


def _marks(rep: dict[str, Any], tl: Timeline, gpu: int | None, advice: list[dict[str, Any]],
           numbers: dict[int, int], uid: str) -> list[svg.Mark]:
    """Where each activation of each piece of advice (on ``gpu``, or the host's) began."""
    by_key = {(a["id"], a.get("gpu")): a for a in advice}
    out = []
    for act in tl.advice:
        if act["gpu"] is not None and act["gpu"] != gpu:
            continue
        a = by_key.get((act["id"], act["gpu"]))
        if a is None:
            continue
        n = numbers[id(a)]
        end = f", ended at {_since(rep, tl, act['end'])}" if act.get("end") else ""
        out.append(svg.Mark(x=act["start"] - (tl.t0 or 0.0), label=str(n),
                            title=f"{n}. {act['id']} started at {_since(rep, tl, act['start'])}"
                                  f"{end}", color=SEVERITY_COLORS.get(act["severity"], "#444"),
                            href=f"#{uid}-advice-{n}"))
    return out


def _x_max(tl: Timeline) -> float:
    return max(1.0, (tl.t1 or 0.0) - (tl.t0 or 0.0))


def _chart(chart: svg.Chart, items: list[tuple[str, str]], kind: str = "line",
           shaded: list[tuple[str, str]] = ()) -> str:
    """A chart with its title and legend (``shaded``: the phases, as swatches)."""
    return (f'<div class="chart-title">{escape(chart.title)}</div>{svg.render(chart)}'
            f"{svg.legend(items, kind)}{svg.legend(shaded, 'area') if shaded else ''}")


def _gpu_charts(rep: dict[str, Any], tl: Timeline, gpu: int, advice: list[dict[str, Any]],
                numbers: dict[int, int], uid: str) -> str:
    series = tl.gpu_series(gpu)
    name = next((g.get("name") for g in rep.get("gpus", []) if g["gpu"] == gpu), None)
    marks = _marks(rep, tl, gpu, advice, numbers, uid)
    xm, gap = _x_max(tl), 2.5 * tl.res
    out = [f"<h2>GPU {gpu}{' · ' + escape(name) if name else ''} over time</h2>"]
    if not series:
        return out[0] + '<p class="note">No samples of this GPU.</p>'
    busy = [("util", "util", "#1f77b4"), ("sm_active", "SM active", "#2ca02c"),
            ("tensor_active", "tensor active", "#d62728")]
    lines = [svg.Line(label, color, series[f]) for f, label, color in busy if series.get(f)]
    if lines:
        out.append(_chart(svg.Chart("Busy (share of time)", xm, percent_axis, 1.0, lines,
                                    marks=marks, gap=gap), [(ln.name, ln.color) for ln in lines]))
    facts = tl.gpu_facts.get(gpu, {})
    if series.get("mem_used_bytes"):
        # in GiB, so the axis ticks are round numbers of GiB
        total = facts.get("mem_total_bytes")
        total = total / GiB if total else None
        lines = [svg.Line("memory used", "#9467bd",
                          [(x, v / GiB) for x, v in series["mem_used_bytes"]])]
        if total:
            lines.append(svg.Line("memory total", "#57606a", [(0.0, total), (xm, total)],
                                  dashed=True, joined=True))
        out.append(_chart(svg.Chart("Memory", xm, _axis_gib, total, lines, marks=marks,
                                    gap=gap), [(ln.name, ln.color) for ln in lines]))
    if series.get("power_watts"):
        limit = facts.get("power_limit_watts")
        lines = [svg.Line("power", "#e8a33d", series["power_watts"])]
        if limit:
            lines.append(svg.Line("power limit", "#57606a", [(0.0, limit), (xm, limit)],
                                  dashed=True, joined=True))
        out.append(_chart(svg.Chart("Power", xm, lambda v: f"{v:.0f} W",
                                    limit * 1.05 if limit else None, lines, marks=marks,
                                    gap=gap), [(ln.name, ln.color) for ln in lines]))
    clocks = [("sm_clock_mhz", "SM clock", "#17becf"), ("mem_clock_mhz", "memory clock",
                                                        "#8c564b")]
    lines = [svg.Line(label, color, series[f]) for f, label, color in clocks if series.get(f)]
    if lines:
        out.append(_chart(svg.Chart("Clocks", xm, lambda v: f"{v:.0f} MHz", None, lines,
                                    marks=marks, gap=gap), [(ln.name, ln.color) for ln in lines]))
    return "".join(out)


def _axis_gib(v: float) -> str:
    return f"{v:g} GiB" if v >= 1 or v == 0 else f"{v * 1024:.0f} MiB"


def percent_axis(v: float) -> str:
    return f"{v * 100:.0f} %"


def _job_charts(rep: dict[str, Any], tl: Timeline, job: Any, advice: list[dict[str, Any]],
                numbers: dict[int, int], uid: str) -> str:
    xm, gap = _x_max(tl), 2.5 * tl.res
    where = f" on GPU {job.gpu}" if job.gpu is not None else ""
    who = f" ({escape(_who(job))})" if job.pid is not None or job.rank is not None else ""
    out = [f"<h2>Job{who}{where} over time</h2>"]
    sps = job.samples_per_second()
    facts = [f"{job.steps} steps"]
    if job.batch_sizes:
        facts.append("batch " + ", ".join(str(b) for b in sorted(job.batch_sizes)))
    if sps is not None:
        facts.append(f"{sps:.0f} samples/s")
    # the job's phases as the report's table gives them (the phase in force counted to its
    # newest step), else as the time line's `phase` lines add up
    said = [j["phases"] for j in rep.get("jobs", []) if j.get("phases")
            and j.get("pid") == job.pid and j.get("gpu") == job.gpu]
    seconds = (dict(sorted(said[0].items(), key=lambda kv: PHASES.index(kv[0])
                           if kv[0] in PHASES else 99))
               if said else tl.phase_seconds(job))
    if seconds:
        facts.append("phases: " + ", ".join(f"{p} {duration(s)}" for p, s in seconds.items()))
    out.append(f'<p class="muted">{escape("; ".join(facts))}</p>')
    spans = [svg.Span(a - 0.0, b - 0.0, phase, PHASE_COLORS.get(phase, "#7f7f7f"))
             for a, b, phase in tl.phase_spans(job)]
    phase_items = sorted({(s.label, s.color) for s in spans},
                         key=lambda it: PHASES.index(it[0]) if it[0] in PHASES else 99)
    marks = _marks(rep, tl, job.gpu, advice, numbers, uid)
    series = tl.job_series(job)
    if series["step_seconds"]:
        line = svg.Line("step time", "#1f77b4", series["step_seconds"])
        out.append(_chart(svg.Chart("Step time", xm, _axis_seconds, None, [line], spans=spans,
                                    marks=marks, gap=gap),
                          [(line.name, line.color)], shaded=phase_items))
    if series["data_wait_ratio"]:
        line = svg.Line("data wait (share of step time)", "#e8a33d", series["data_wait_ratio"])
        out.append(_chart(svg.Chart("Data wait", xm, percent_axis, 1.0, [line], spans=spans,
                                    marks=marks, gap=gap),
                          [(line.name, line.color)], shaded=phase_items))
    shares = tl.share_series(job.gpu) if job.gpu is not None else []
    if job.first_t is not None:
        # from the job's first step on: before it the frame had only NVML's view of the
        # process (start-up), which is not this job's breakdown
        first = job.first_t - (tl.t0 or 0.0) - tl.res
        last = (job.last_t or job.first_t) - (tl.t0 or 0.0) + tl.res
        shares = [(x, s) for x, s in shares if first <= x <= last]
    if shares:
        areas = [(label, color, [(x, s.get(c, 0.0)) for x, s in shares])
                 for c, label, color in CATEGORIES]
        chart = svg.Chart("Where the time went (step-time breakdown)", xm, percent_axis, 1.0,
                          areas=areas, spans=spans, marks=marks, gap=gap)
        out.append(f'<div class="chart-title">{escape(chart.title)}</div>{svg.render(chart)}'
                   + svg.legend([(label, color) for _, label, color in CATEGORIES], "area")
                   + (svg.legend(phase_items, "area") if phase_items else ""))
    return "".join(out)


def _axis_seconds(v: float) -> str:
    return "0" if v == 0 else duration(v)


def _evidence_table(a: dict[str, Any], i: int) -> str:
    rows = []
    for (label, shown), (k, v) in zip(evidence_items(a["evidence"]), a["evidence"].items(),
                                      strict=True):
        rows.append(f"<tr><td>{escape(label)} <span class=\"muted\"><code>"
                    f"{escape(k)}</code></span></td><td class=\"num\""
                    f"{_key(f'advice.{i}.evidence.{k}', v)}>{escape(shown)}</td></tr>")
    return "<table><tr><th>evidence</th><th>value</th></tr>" + "".join(rows) + "</table>"


def _advice_cards(rep: dict[str, Any], tl: Timeline | None, blocks: list[Any],
                  uid: str) -> str:
    """A card per block of the text report: the piece of its first GPU in full, the others'
    own words and figures folded under it where they differ."""
    if not blocks:
        return ""
    out = ["<h2>Advice</h2>"]
    index = {id(a): i for i, a in enumerate(rep.get("advice", []))}
    for n, (a, gpus, group) in enumerate(blocks, 1):
        i = index.get(id(group[0]), n - 1)
        color = SEVERITY_COLORS.get(a.get("severity"), "#444")
        where = where_text(a, gpus)
        when = f"started at {_since(rep, tl, a.get('since'))}"
        if a.get("active") is False:
            when += f", ended (held {duration(a.get('held_seconds') or 0)})"
        elif a.get("held_seconds"):
            when += f", held {duration(a['held_seconds'])}"
        conf = a.get("confidence")
        parts = [f'<div class="card" id="{uid}-advice-{n}" style="--sev:{color}">',
                 f'<div><span class="num-badge">{n}</span><span class="badge">'
                 f"{escape(a.get('severity', ''))}</span> <code>{escape(a['id'])}</code> on "
                 f"{escape(where)} · {escape(when)} · confidence "
                 f"<span{_key(f'advice.{i}.confidence', conf)}>{conf:.2f}</span></div>"
                 if isinstance(conf, (int, float)) else
                 f"<div><span class=\"num-badge\">{n}</span><code>{escape(a['id'])}</code></div>",
                 f"<h3>{escape(a.get('title', ''))}</h3>",
                 f"<p>{escape(a.get('message', ''))}</p>"]
        if a.get("evidence"):
            parts.append(_evidence_table(a, i))
        spread = spread_text(a, gpus)
        if spread:
            parts.append(f'<p class="muted">{escape(spread)}</p>')
        parts.append(f"<p><b>Change:</b> {escape(a.get('action', ''))}</p>")
        if a.get("expected_gain_text"):
            gain = a.get("expected_gain")
            # a lockstep block quotes its least-gaining piece's gain (report._lockstep_gain)
            gi = next((index.get(id(m), i) for m in group
                       if m.get("expected_gain") == gain), i)
            parts.append(f"<p><b>Expected gain</b> (<span"
                         f"{_key(f'advice.{gi}.expected_gain', gain)}>"
                         f"{escape(evidence_value('expected_gain', gain))}</span>): "
                         f"{escape(a['expected_gain_text'])}</p>")
        if a.get("hook_would_add"):
            parts.append(f"<p class=\"muted\"><i>With the hook:</i> "
                         f"{escape(a['hook_would_add'])}</p>")
        others = [m for m in group[1:] if _differs(m, group[0])]
        if others:
            parts.append(f"<details><summary>The other GPUs' own words and figures "
                         f"({len(others)})</summary>")
            for m in others:
                j = index.get(id(m), i)
                parts.append(f"<h4>GPU {m.get('gpu')}</h4><p>{escape(m.get('message', ''))}"
                             "</p>")
                if m.get("evidence"):
                    parts.append(_evidence_table(m, j))
                if m.get("action") != a.get("action"):
                    parts.append(f"<p><b>Change:</b> {escape(m.get('action', ''))}</p>")
            parts.append("</details>")
        parts.append(f'<p class="muted">Rule {escape(a.get("rule_file", ""))}</p></div>')
        out.append("".join(parts))
    return "".join(out)


def _differs(a: dict[str, Any], lead: dict[str, Any]) -> bool:
    """Whether a piece of a block says or shows anything its block's first does not."""
    return (a.get("message") != lead.get("message") or a.get("action") != lead.get("action")
            or [evidence_value(k, v) for k, v in (a.get("evidence") or {}).items()]
            != [evidence_value(k, v) for k, v in (lead.get("evidence") or {}).items()])
