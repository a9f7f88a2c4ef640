"""`gpuwatch compare BEFORE AFTER`: two runs side by side, and whether the change paid off.

Each side is a recording (judged whole, as ``gpuwatch advise --replay``) or a running
daemon (its /api/advice and /api/snapshot). What is compared: samples/s and step time with
their ratio; util, SM active and memory on the GPUs the jobs trained on; the step-time
breakdown; the phases, where the hook reported them; which advice went away and which is
new. The verdict reads samples/s (step time where no batch size is known).

Two runs compare only where both trained with the hook's steps (without them there is no
throughput to compare: util alone rises with a larger batch for no gain) and where they
train the same model: the torch allocator's floor between steps (the model's weights,
gradients and optimizer state) within ``SAME_MODEL_WITHIN`` of each other, and the same
kind of network (the hook's ``uses_conv``). Anything else is said to be not comparable,
with the reason; ``force`` compares anyway and keeps the reasons in the output.
"""

from __future__ import annotations

import json
import os
from html import escape
from typing import Any

from gpuwatch.advisor.report import duration, percent
from gpuwatch.advisor.rules import human_bytes

COMPARE_FORMAT = "gpuwatch-compare/1"
# two runs' allocator floors this close (relative) are taken for one model
SAME_MODEL_WITHIN = 0.10
# a change of throughput smaller than this is no change (run-to-run noise)
NOISE = 0.05
CATEGORIES = (("data", "data wait"), ("sync", "waiting on peers"), ("gpu", "GPU work"),
              ("host", "host"), ("other", "other"))


# -- one run's figures ------------------------------------------------------------------------
def summarize(report: dict[str, Any], timeline: Any = None,
              snapshot: dict[str, Any] | None = None, label: str | None = None
              ) -> dict[str, Any]:
    """The figures of one run: from a recording's report and timeline, or from a daemon's
    report and snapshot (``timeline`` None)."""
    src = report.get("source", {})
    jobs = [j for j in report.get("jobs", []) if j.get("source") == "hook"]
    out: dict[str, Any] = {
        "label": label or _label(src),
        "source": {k: src.get(k) for k in ("kind", "path", "url", "scenario",
                                           "duration_seconds") if src.get(k) is not None},
        "hook_steps": bool(report.get("hook", {}).get("steps")),
        "ranks": len(jobs),
        "steps": sum(j.get("steps") or 0 for j in jobs) or None,
        "step_seconds": max((j["step_seconds"] for j in jobs if j.get("step_seconds")),
                            default=None),
        "samples_per_second": None,
        "batch_sizes": [],
        "model_state_bytes": None,
        "uses_conv": None,
        "gpu_names": sorted({g.get("name") for g in report.get("gpus", []) if g.get("name")}),
        "gpus": [],
        "time_share": _mean_shares(jobs or report.get("jobs", [])),
        "phases": _phases(report),
        "advice": sorted({(a["id"], a.get("gpu")) for a in report.get("advice", [])},
                         key=lambda k: (k[0], -1 if k[1] is None else k[1])),
    }
    used = sorted({j["gpu"] for j in report.get("jobs", []) if j.get("gpu") is not None}) \
        or [g["gpu"] for g in report.get("gpus", [])]
    if timeline is not None:
        _from_timeline(out, timeline, used)
    elif snapshot is not None:
        _from_snapshot(out, snapshot, used, jobs)
    out["advice"] = [{"id": i, "gpu": g} for i, g in out["advice"]]
    return out


def _label(src: dict[str, Any]) -> str:
    if src.get("path"):
        return os.path.basename(str(src["path"]))
    if src.get("url"):
        return f"live {src['url']}"
    return str(src.get("kind") or "run")


def _mean_shares(jobs: list[dict[str, Any]]) -> dict[str, float] | None:
    """The jobs' breakdowns, weighted by how long each ran."""
    total = 0.0
    acc: dict[str, float] = {}
    for j in jobs:
        shares = j.get("time_share")
        w = float(j.get("seconds") or 0.0) or 1.0
        if not shares:
            continue
        total += w
        for c, v in shares.items():
            acc[c] = acc.get(c, 0.0) + w * float(v)
    if not total:
        return None
    return {c: round(v / total, 4) for c, v in acc.items()}


def _phases(report: dict[str, Any]) -> dict[str, float] | None:
    got: dict[str, float] = {}
    for j in report.get("jobs", []):
        for p, s in (j.get("phases") or {}).items():
            if isinstance(s, (int, float)):
                got[p] = got.get(p, 0.0) + float(s)
    return got or None


def _from_timeline(out: dict[str, Any], tl: Any, used: list[int]) -> None:
    jobs = [j for j in tl.jobs.values() if j.steps]
    rates = [r for r in (j.samples_per_second() for j in jobs) if r is not None]
    out["samples_per_second"] = round(sum(rates), 2) if rates else None
    out["batch_sizes"] = sorted({b for j in jobs for b in j.batch_sizes})
    floors = [j.alloc_floor for j in jobs if j.alloc_floor is not None]
    out["model_state_bytes"] = max(floors) if floors else None
    conv = [j.config.get("uses_conv") for j in tl.jobs.values()
            if j.config.get("uses_conv") is not None]
    out["uses_conv"] = any(bool(c) for c in conv) if conv else None
    if out["phases"] is None:
        phases: dict[str, float] = {}
        for j in jobs:
            for p, s in (tl.phase_seconds(j) or {}).items():
                phases[p] = phases.get(p, 0.0) + s
        out["phases"] = phases or None
    for gpu in used:
        window = tl.training_window(gpu)
        total = tl.gpu_facts.get(gpu, {}).get("mem_total_bytes")
        peak = tl.gpu_max(gpu, "mem_used_bytes", window)
        out["gpus"].append({
            "gpu": gpu,
            "util": _r(tl.gpu_mean(gpu, "util", window)),
            "sm_active": _r(tl.gpu_mean(gpu, "sm_active", window)),
            "tensor_active": _r(tl.gpu_mean(gpu, "tensor_active", window)),
            "mem_used_bytes": peak,
            "mem_used_ratio": _r(peak / total) if peak is not None and total else None,
            "window": "training" if window is not None else "whole recording",
        })


def _from_snapshot(out: dict[str, Any], snap: dict[str, Any], used: list[int],
                   judged: list[dict[str, Any]] = ()) -> None:
    """``judged``: the report's jobs, whose step time is the run's. A snapshot's samples per
    second are one report's (the last half second): each job's samples per step are taken
    from it (steady: the batch) and divided by the step time the report judged, so samples/s
    and step time speak of the same span, and a verdict does not move with the instant."""
    jobs = [j for j in snap.get("jobs", []) if j.get("alive", True)]
    run_step = {j.get("pid"): j.get("step_seconds") for j in judged if j.get("step_seconds")}
    rates = []
    for j in jobs:
        sps, now = j.get("samples_per_second"), j.get("step_seconds")
        if sps is None:
            continue
        span = run_step.get(j.get("pid"))
        rates.append(sps * now / span if now and span else sps)
    out["samples_per_second"] = round(sum(rates), 2) if rates else None
    # the hook's own counters, where the live breakdown (its last 30 s) has no job yet
    steps = sum(int(j.get("steps_total") or 0) for j in jobs)
    if steps:
        out["hook_steps"] = True
        out["steps"] = out["steps"] or steps
        out["ranks"] = out["ranks"] or len(jobs)
    times = [j["step_seconds"] for j in jobs if j.get("step_seconds")]
    if out["step_seconds"] is None and times:
        out["step_seconds"] = max(times)
    gpus = {g["gpu"]: g for g in snap.get("gpus", []) if not g.get("lost")}
    for gpu in used:
        g = gpus.get(gpu)
        if g is None:
            continue
        used_b, total = g.get("mem_used_bytes"), g.get("mem_total_bytes")
        out["gpus"].append({
            "gpu": gpu, "util": g.get("util"), "sm_active": g.get("sm_active"),
            "tensor_active": g.get("tensor_active"), "mem_used_bytes": used_b,
            "mem_used_ratio": _r(used_b / total) if used_b is not None and total else None,
            "window": "now",
        })


def _r(v: float | None) -> float | None:
    return None if v is None else round(float(v), 4)


# -- the comparison ---------------------------------------------------------------------------
def _ratio(a: Any, b: Any) -> float | None:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or a <= 0:
        return None
    return round(b / a, 3)


def _pair(a: Any, b: Any) -> dict[str, Any]:
    return {"before": a, "after": b, "ratio": _ratio(a, b)}


def why_not_comparable(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Why these two runs can't be compared (empty: they can)."""
    reasons = []
    for name, s in (("BEFORE", before), ("AFTER", after)):
        if not s["hook_steps"] or not s["steps"]:
            reasons.append(f"{name} ({s['label']}) has no training steps from the torch hook: "
                           "without step time and samples there is no speed to compare (util "
                           "alone rises with a larger batch for no gain); run the job under "
                           "`gpuwatch run -- ...` or with gpuwatch.torch attached")
    if reasons:
        return reasons
    a, b = before["model_state_bytes"], after["model_state_bytes"]
    if a and b and abs(a - b) / max(a, b) > SAME_MODEL_WITHIN:
        reasons.append(f"another model: the torch allocator holds {human_bytes(a)} between "
                       f"steps in BEFORE and {human_bytes(b)} in AFTER (the model's weights, "
                       "gradients and optimizer state)")
    if before["uses_conv"] is not None and after["uses_conv"] is not None \
            and before["uses_conv"] != after["uses_conv"]:
        which = "BEFORE" if before["uses_conv"] else "AFTER"
        reasons.append(f"another model: only {which} has convolution layers")
    return reasons


def compare(before: dict[str, Any], after: dict[str, Any], *, force: bool = False
            ) -> dict[str, Any]:
    """Two runs' figures (:func:`summarize`) side by side, with the verdict."""
    reasons = why_not_comparable(before, after)
    notes = []
    if before["batch_sizes"] and after["batch_sizes"] \
            and before["batch_sizes"] != after["batch_sizes"]:
        notes.append(f"batch {_list(before['batch_sizes'])} -> {_list(after['batch_sizes'])}: "
                     "samples/s is the measure; a step is not the same work in both")
    if before["ranks"] != after["ranks"] and before["ranks"] and after["ranks"]:
        notes.append(f"{before['ranks']} -> {after['ranks']} ranks: samples/s is summed over "
                     "the ranks")
    if before["gpu_names"] and after["gpu_names"] and before["gpu_names"] != after["gpu_names"]:
        notes.append(f"another GPU: {', '.join(before['gpu_names'])} -> "
                     f"{', '.join(after['gpu_names'])}")
    if not before["model_state_bytes"] or not after["model_state_bytes"]:
        notes.append("the model could not be checked to be the same (no allocator figures "
                     "on one side)")
    for name, s in (("BEFORE", before), ("AFTER", after)):
        if s["source"].get("kind") == "live":
            notes.append(f"{name} is a live daemon: its step time and breakdown cover its "
                         "last 30 s, samples/s and the GPU figures are as of now")
    shares = {}
    for c, _ in CATEGORIES:
        a = (before["time_share"] or {}).get(c)
        b = (after["time_share"] or {}).get(c)
        if a is not None or b is not None:
            shares[c] = {"before": a, "after": b}
    gpus = []
    for ga in before["gpus"]:
        gb = next((g for g in after["gpus"] if g["gpu"] == ga["gpu"]), None)
        if gb is None and len(before["gpus"]) == 1 and len(after["gpus"]) == 1:
            gb = after["gpus"][0]
        if gb is None:
            continue
        gpus.append({"gpu": ga["gpu"], **{k: {"before": ga.get(k), "after": gb.get(k)}
                                          for k in ("util", "sm_active", "tensor_active",
                                                    "mem_used_ratio")}})
    before_ids = {(a["id"], a["gpu"]) for a in before["advice"]}
    after_ids = {(a["id"], a["gpu"]) for a in after["advice"]}
    advice = {
        "gone": _ids(before_ids - after_ids),
        "new": _ids(after_ids - before_ids),
        "kept": _ids(before_ids & after_ids),
    }
    changes = {
        "samples_per_second": _pair(before["samples_per_second"], after["samples_per_second"]),
        "step_seconds": _pair(before["step_seconds"], after["step_seconds"]),
        "time_share": shares,
        "gpus": gpus,
        "phases": {"before": before["phases"], "after": after["phases"]}
        if before["phases"] or after["phases"] else None,
    }
    comparable = not reasons
    verdict, text = _verdict(changes) if comparable or force else (
        "not_comparable", "Not comparable: " + "; ".join(reasons) + ".")
    return {"format": COMPARE_FORMAT, "comparable": comparable, "reasons": reasons,
            "forced": bool(force and reasons), "verdict": verdict, "verdict_text": text,
            "notes": notes, "before": before, "after": after, "changes": changes,
            "advice": advice}


def _ids(keys: set[tuple[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": i, "gpu": g} for i, g in sorted(keys, key=lambda k: (k[0], k[1] or -1))]


def _list(v: list[int]) -> str:
    return ", ".join(str(x) for x in v)


def _verdict(changes: dict[str, Any]) -> tuple[str, str]:
    sps = changes["samples_per_second"]["ratio"]
    what = "the samples per second"
    gain = sps
    if gain is None:
        step = changes["step_seconds"]["ratio"]
        gain = round(1.0 / step, 3) if step else None
        what = "the steps per second (no batch size on one side)"
    if gain is None:
        return "unknown", "No verdict: neither samples/s nor step time is known on both sides."
    if gain >= 1.0 + NOISE:
        return "paid_off", f"The change paid off: {gain:.2f}x {what}."
    if gain <= 1.0 - NOISE:
        return "worse", f"The change made it slower: {gain:.2f}x {what}."
    return "no_change", (f"No measurable change: {gain:.2f}x {what} (within "
                         f"{NOISE:.0%} either way).")


# -- rendering ----------------------------------------------------------------------------------
def _num(v: Any) -> str:
    if v is None:
        return "?"
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def _x(r: Any) -> str:
    return "" if r is None else f" ({r:.2f}x)"


def _pct(v: Any, fine_top: bool = False) -> str:
    return "?" if v is None else percent(v, fine_top=fine_top)


def _dur(v: Any) -> str:
    return "?" if v is None else duration(v)


def lines(cmp: dict[str, Any]) -> list[tuple[str, str]]:
    """(what, before -> after) for each figure, as text and Markdown show them."""
    ch = cmp["changes"]
    out = []
    s = ch["samples_per_second"]
    out.append(("samples/s", f"{_num(s['before'])} -> {_num(s['after'])}{_x(s['ratio'])}"))
    s = ch["step_seconds"]
    out.append(("step time", f"{_dur(s['before'])} -> {_dur(s['after'])}{_x(s['ratio'])}"))
    for g in ch["gpus"]:
        bits = []
        for k, label in (("util", "util"), ("sm_active", "SM active"),
                         ("tensor_active", "tensor active"), ("mem_used_ratio", "memory peak")):
            v = g[k]
            if v["before"] is None and v["after"] is None:
                continue
            fine = k == "mem_used_ratio"
            bits.append(f"{label} {_pct(v['before'], fine)} -> {_pct(v['after'], fine)}")
        if bits:
            out.append((f"GPU {g['gpu']}", "; ".join(bits)))
    if ch["time_share"]:
        parts = [f"{name} {_pct(ch['time_share'][c]['before'])} -> "
                 f"{_pct(ch['time_share'][c]['after'])}"
                 for c, name in CATEGORIES if c in ch["time_share"]]
        out.append(("time", ", ".join(parts)))
    if ch.get("phases"):
        ph = ch["phases"]
        names = sorted(set(ph["before"] or {}) | set(ph["after"] or {}))
        out.append(("phases", ", ".join(
            f"{p} {_dur((ph['before'] or {}).get(p))} -> {_dur((ph['after'] or {}).get(p))}"
            for p in names)))
    adv = cmp["advice"]

    def names(items: list[dict[str, Any]]) -> str:
        return ", ".join(a["id"] + (f" (GPU {a['gpu']})" if a["gpu"] is not None else "")
                         for a in items)

    bits = []
    if adv["gone"]:
        bits.append(f"{names(adv['gone'])} gone")
    if adv["new"]:
        bits.append(f"new: {names(adv['new'])}")
    if adv["kept"]:
        bits.append(f"still: {names(adv['kept'])}")
    out.append(("advice", "; ".join(bits) or "none before, none after"))
    return out


def headline(cmp: dict[str, Any]) -> str:
    """One line, as the issue put it: samples/s 1554 -> 2870 (1.85x); data wait 42 % -> 3 %;
    add-dataloader-workers gone."""
    ch = cmp["changes"]
    bits = []
    s = ch["samples_per_second"]
    if s["before"] is not None or s["after"] is not None:
        bits.append(f"samples/s {_num(s['before'])} -> {_num(s['after'])}{_x(s['ratio'])}")
    data = ch["time_share"].get("data")
    if data:
        bits.append(f"data wait {_pct(data['before'])} -> {_pct(data['after'])}")
    bits += [f"{a['id']} gone" for a in cmp["advice"]["gone"]]
    bits += [f"{a['id']} new" for a in cmp["advice"]["new"]]
    return "; ".join(bits)


def render_text(cmp: dict[str, Any]) -> str:
    b, a = cmp["before"], cmp["after"]
    out = [f"gpuwatch compare: BEFORE {b['label']} -> AFTER {a['label']}", ""]
    if not cmp["comparable"]:
        out.append("Not comparable:")
        out += [f"  - {r}" for r in cmp["reasons"]]
        if not cmp["forced"]:
            out += ["", "(--force compares them anyway)"]
            return "\n".join(out) + "\n"
        out += ["", "Compared anyway (--force):", ""]
    width = max(len(w) for w, _ in lines(cmp))
    out += [f"{w.ljust(width)}  {v}" for w, v in lines(cmp)]
    out += ["", cmp["verdict_text"]]
    out += [f"Note: {n}." for n in cmp["notes"]]
    return "\n".join(out) + "\n"


def render_markdown(cmp: dict[str, Any]) -> str:
    b, a = cmp["before"], cmp["after"]
    out = [f"# gpuwatch compare: `{b['label']}` -> `{a['label']}`", ""]
    if not cmp["comparable"]:
        out += ["**Not comparable:**", ""] + [f"- {r}" for r in cmp["reasons"]] + [""]
        if not cmp["forced"]:
            return "\n".join(out)
    out += ["| | before -> after |", "| --- | --- |"]
    out += [f"| {w} | {v} |" for w, v in lines(cmp)]
    out += ["", f"**{cmp['verdict_text']}**", ""]
    out += [f"> {n}." for n in cmp["notes"]]
    return "\n".join(out).rstrip() + "\n"


def render_json(cmp: dict[str, Any]) -> str:
    return json.dumps(cmp, indent=2) + "\n"


def render_html(cmp: dict[str, Any]) -> str:
    from gpuwatch.advisor import html as html_mod

    b, a = cmp["before"], cmp["after"]
    body = [f"<h1>gpuwatch compare</h1><p class=\"src\">BEFORE {escape(b['label'])} → AFTER "
            f"{escape(a['label'])} · {COMPARE_FORMAT}</p>"]
    if not cmp["comparable"]:
        body.append('<div class="verdict"><b>Not comparable:</b><ul>' + "".join(
            f"<li>{escape(r)}</li>" for r in cmp["reasons"]) + "</ul></div>")
    if cmp["comparable"] or cmp["forced"]:
        body.append(f'<div class="verdict"><b>{escape(cmp["verdict_text"])}</b></div>')
        rows = "".join(f"<tr><th>{escape(w)}</th><td>{escape(v)}</td></tr>"
                       for w, v in lines(cmp))
        body.append(f"<table>{rows}</table>")
        shares = cmp["changes"]["time_share"]
        if shares:
            body.append("<h2>Where the time went</h2>" + _share_bars(shares))
    body += [f'<p class="note">{escape(n)}.</p>' for n in cmp["notes"]]
    content = f'<div class="gw-report">{"".join(body)}</div>'
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{html_mod.CSP}">'
            f"<title>gpuwatch compare: {escape(b['label'])} → {escape(a['label'])}</title>"
            f"<style>{html_mod.STYLE}</style></head><body>{content}</body></html>\n")


def _share_bars(shares: dict[str, dict[str, Any]]) -> str:
    from gpuwatch.advisor.html import CATEGORIES as COLORS
    from gpuwatch.advisor.svg import legend

    color = {c: col for c, _, col in COLORS}
    rows = []
    for i, side in enumerate(("before", "after")):
        x = 70.0
        y = 8 + i * 30
        rows.append(f'<text x="4" y="{y + 15}" class="tick">{side}</text>')
        for c, name in CATEGORIES:
            v = (shares.get(c) or {}).get(side) or 0.0
            w = 660 * v
            if w > 0:
                rows.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="22" '
                            f'fill="{color[c]}"><title>{name} {percent(v)}</title></rect>')
            x += w
    svg = (f'<svg class="chart" viewBox="0 0 740 70" width="740" height="70" '
           f'xmlns="http://www.w3.org/2000/svg">{"".join(rows)}</svg>')
    return svg + legend([(n, color[c]) for c, n in CATEGORIES], "area")


# -- the command --------------------------------------------------------------------------------
def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


def load(spec: str, ruleset: Any) -> dict[str, Any]:
    """One side's figures: a recording's (judged whole) or a running daemon's."""
    from gpuwatch.advisor import sources
    from gpuwatch.advisor.timeline import judge_recording
    from gpuwatch.errors import UserError

    if is_url(spec):
        report = sources.fetch_daemon_report(spec)
        url = spec.rstrip("/")
        report.setdefault("source", {})["url"] = url
        snapshot = sources.fetch_json(url + "/api/snapshot")
        return summarize(report, snapshot=snapshot if isinstance(snapshot, dict) else None)
    if not os.path.isfile(spec):
        raise UserError(f"cannot compare {spec}: no such file (a recording, or a daemon's "
                        "http://HOST:PORT)")
    report, timeline = judge_recording(spec, ruleset)
    return summarize(report, timeline)


def main(args: Any) -> int:
    import sys

    from gpuwatch.advisor.rules import load_rules
    from gpuwatch.serve.config import config_from_args

    rules = None
    if not (is_url(args.before) and is_url(args.after)):
        rules = load_rules(config_from_args(args).rules_dirs)
    cmp = compare(load(args.before, rules), load(args.after, rules), force=args.force)
    render = {"text": render_text, "markdown": render_markdown, "json": render_json,
              "html": render_html}[args.format or "text"]
    sys.stdout.write(render(cmp))
    sys.stdout.flush()
    # 0 when compared (whatever the verdict), 3 when the runs don't compare
    return 0 if cmp["comparable"] or cmp["forced"] else 3
