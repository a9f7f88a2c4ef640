"""The advice report: one JSON shape (``gpuwatch advise --format json``, /api/advice), and
its text and Markdown renderings.

The report opens with each GPU and what its architecture supports, then the advice, most
valuable first (severity, then expected gain, then confidence).
"""

from __future__ import annotations

import shutil
import textwrap
import time
from collections.abc import Iterable
from typing import Any

from gpuwatch.advisor import endings
from gpuwatch.advisor.engine import Engine, Finding, sort_key
from gpuwatch.advisor.signals import arch_supports, cc_text

REPORT_FORMAT = "gpuwatch-advice/1"

HOOK_NOTE = ("No data from the torch hook: this advice comes from NVML and the process tree "
             "alone. Run the job as `gpuwatch run -- python train.py ...` (or import "
             "gpuwatch.torch) to add step time, data wait, loss scale and the job's settings, "
             "which make the advice exact (e.g. num_workers=0 -> 8) and more certain.")


def gpu_entries(engine: Engine, instance: str | None = None) -> list[dict[str, Any]]:
    frame = engine.frame
    out = []
    for gpu in frame.gpus():
        subj = frame.subjects[gpu]
        cc = frame.fact(subj, "compute_capability")
        entry: dict[str, Any] = {
            "gpu": gpu,
            "name": frame.fact(subj, "gpu_name"),
            "compute_capability": cc_text(cc),
            "supports": arch_supports(cc),
            "gpm": bool(frame.fact(subj, "gpm")),
            "hook": bool(frame.fact(subj, "hook")),
        }
        if instance is not None:
            entry["instance"] = instance
        out.append(entry)
    return out


def findings_json(findings: Iterable[Finding], instance: str | None = None
                  ) -> list[dict[str, Any]]:
    items = []
    for f in findings:
        item = f.to_json()
        if instance is not None:
            item["instance"] = instance
        items.append(item)
    return items


def build_report(parts: list[tuple[Engine, list[Finding], str | None]], source: dict[str, Any]
                 ) -> dict[str, Any]:
    """One report from one or more engines (several: one per Prometheus instance)."""
    gpus: list[dict[str, Any]] = []
    advice: list[dict[str, Any]] = []
    steps = config = False
    host_cpus = None
    ended: list[dict[str, Any]] = []
    for engine, findings, instance in parts:
        ended += getattr(engine.frame, "job_ends", [])
        gpus += gpu_entries(engine, instance)
        advice += findings_json(findings, instance)
        steps = steps or engine.frame.hook_steps
        config = config or engine.frame.hook_config
        host_cpus = host_cpus or engine.frame.facts.get("host_cpus")
    advice.sort(key=sort_key)
    notes = []
    if not steps:
        notes.append(HOOK_NOTE)
    if gpus and not any(g["gpm"] for g in gpus):
        notes.append("No GPM counters (SM/tensor/FP32 activity: Hopper and newer): "
                     "precision advice relies on the torch hook's settings, and 'GPU "
                     "underused' on NVML utilization alone.")
    return {
        "format": REPORT_FORMAT,
        "generated_at": round(time.time(), 3),
        "source": source,
        "hook": {"steps": steps, "config": config},
        "host": {"cpus": int(host_cpus) if host_cpus else None},
        "gpus": gpus,
        "advice": advice,
        "job_ends": endings.entries(ended),
        "notes": notes,
    }


# -- rendering ------------------------------------------------------------------------------
def _yes(v: bool | None) -> str:
    return "?" if v is None else ("yes" if v else "no")


def _gpu_line(g: dict[str, Any]) -> str:
    s = g["supports"]
    where = f"{g['instance']} " if g.get("instance") else ""
    cc = g.get("compute_capability") or "unknown"
    return (f"{where}GPU {g['gpu']}  {g.get('name') or 'unknown model'}  compute capability {cc}: "
            f"bf16 {_yes(s['bf16'])}, TF32 {_yes(s['tf32'])}, FP8 {_yes(s['fp8'])}, "
            f"tensor cores {_yes(s['tensor_cores'])}; GPM counters {_yes(g['gpm'])}")


def _source_line(report: dict[str, Any]) -> str:
    src = report.get("source", {})
    kind = src.get("kind")
    if kind == "replay":
        dur = src.get("duration_seconds")
        span = f", {dur:.0f} s" if isinstance(dur, (int, float)) else ""
        return f"recording {src.get('path')}{span}"
    if kind == "prometheus":
        return f"Prometheus {src.get('url')}, last {src.get('window_seconds', 0):.0f} s"
    if kind == "live":
        return f"live daemon{(' ' + src['url']) if src.get('url') else ''}"
    return str(kind or "unknown source")


def _evidence_text(ev: dict[str, float]) -> str:
    parts = []
    for k, v in ev.items():
        if k.endswith("_bytes"):
            from gpuwatch.advisor.rules import human_bytes

            parts.append(f"{k}={human_bytes(v)}")
        else:
            parts.append(f"{k}={v:g}")
    return ", ".join(parts)


def render_text(report: dict[str, Any], width: int | None = None) -> str:
    width = width or min(100, max(60, shutil.get_terminal_size((100, 24)).columns))
    hook = report.get("hook", {})
    hook_txt = "steps and settings" if hook.get("config") else (
        "steps" if hook.get("steps") else "none")
    lines = [f"gpuwatch advice: {_source_line(report)} (torch hook data: {hook_txt})", ""]
    for g in report.get("gpus", []):
        lines.append(_gpu_line(g))
    if report.get("gpus"):
        lines.append("")
    for end in report.get("job_ends", []):
        lines += textwrap.wrap("Ended: " + end["summary"] + ".", width=width,
                               subsequent_indent="    ")
    if report.get("job_ends"):
        lines.append("")
    advice = report.get("advice", [])
    if not advice:
        lines.append("No advice: nothing in this data calls for a change.")
    else:
        lines.append(f"{len(advice)} piece(s) of advice, most valuable first:")
    wrap = textwrap.TextWrapper(width=width, initial_indent="    ", subsequent_indent="    ")
    for i, a in enumerate(advice, 1):
        where = "host" if a.get("gpu") is None else f"GPU {a['gpu']}"
        if a.get("instance"):
            where = f"{a['instance']} {where}"
        state = "" if a.get("active", True) else " (ended)"
        lines.append("")
        lines.append(f"{i}. [{a['severity'].upper()}] {a['id']} on {where}, confidence "
                     f"{a['confidence']:.2f}{state}")
        lines.append(f"   {a['title']}")
        lines += wrap.wrap(a["message"])
        if a.get("evidence"):
            lines += wrap.wrap("Evidence: " + _evidence_text(a["evidence"]))
        lines += wrap.wrap("Change: " + a["action"])
        if a.get("expected_gain_text"):
            lines += wrap.wrap("Expected gain: " + a["expected_gain_text"])
        if a.get("hook_would_add"):
            lines += wrap.wrap("With the hook: " + a["hook_would_add"])
    for note in report.get("notes", []):
        lines.append("")
        lines += textwrap.wrap("Note: " + note, width=width)
    return "\n".join(lines) + "\n"


def render_markdown(report: dict[str, Any]) -> str:
    lines = [f"# gpuwatch advice: {_source_line(report)}", "", "## GPUs", "",
             "| GPU | model | compute capability | bf16 | TF32 | FP8 | GPM |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for g in report.get("gpus", []):
        s = g["supports"]
        where = f"{g['instance']} {g['gpu']}" if g.get("instance") else str(g["gpu"])
        lines.append(f"| {where} | {g.get('name') or '?'} | {g.get('compute_capability') or '?'}"
                     f" | {_yes(s['bf16'])} | {_yes(s['tf32'])} | {_yes(s['fp8'])} "
                     f"| {_yes(g['gpm'])} |")
    if report.get("job_ends"):
        lines += ["", "## Job ends", ""]
        lines += [f"- {end['summary']}." for end in report["job_ends"]]
    lines += ["", "## Advice", ""]
    advice = report.get("advice", [])
    if not advice:
        lines.append("No advice: nothing in this data calls for a change.")
    for i, a in enumerate(advice, 1):
        where = "host" if a.get("gpu") is None else f"GPU {a['gpu']}"
        lines += [(f"### {i}. `{a['id']}` ({a['severity']}, {where}, confidence "
                  f"{a['confidence']:.2f})"), "", f"**{a['title']}**", "", a["message"], "",
                  f"**Change:** {a['action']}", ""]
        if a.get("expected_gain_text"):
            lines += [f"**Expected gain:** {a['expected_gain_text']}", ""]
        if a.get("evidence"):
            lines += ["| evidence | value |", "| --- | --- |"]
            lines += [f"| `{k}` | {v:g} |" for k, v in a["evidence"].items()]
            lines.append("")
        if a.get("hook_would_add"):
            lines += [f"*With the hook:* {a['hook_would_add']}", ""]
    for note in report.get("notes", []):
        lines += ["", f"> {note}"]
    return "\n".join(lines).rstrip() + "\n"
