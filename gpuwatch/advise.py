"""`gpuwatch advise`: judge a run and say what to change, with the evidence.

From a recording (``--replay FILE``, ``--demo``), a running daemon (``--url``, its
/api/advice) or a Prometheus server (``--prometheus URL``, every instance and GPU over
``--window`` seconds). Prints text, Markdown or JSON; exits 0 whether or not there is
advice, 2 on bad input (a bad file, bad rules, nothing listening).
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import sys
from typing import Any

from gpuwatch.errors import UserError

DEFAULT_URL = "http://127.0.0.1:9442"
DEFAULT_WINDOW = 600.0
NO_GPU_IN_RECORDING = ("the recording holds no GPU lines (it was made where NVML found no "
                       "GPU: a CPU-only job, or a host without the NVIDIA driver)")


def _ruleset(args: argparse.Namespace) -> Any:
    from gpuwatch.advisor.rules import load_rules
    from gpuwatch.config import config_from_args

    config = config_from_args(args)  # the config file's rules_dirs, then --rules-dir
    return load_rules(config.rules_dirs)


def build(args: argparse.Namespace) -> dict[str, Any]:
    """The report (JSON-able dict) the arguments ask for."""
    from gpuwatch.advisor import report, sources

    window = getattr(args, "window", None)
    if window is not None and not window > 0:
        raise UserError(f"--window must be a positive number of seconds, got {window:g}")
    if getattr(args, "replay", None) or getattr(args, "demo", False):
        ruleset = _ruleset(args)
        tally = report.RunTally()
        if args.demo:
            resource = importlib.resources.files("gpuwatch.data") / "demo.jsonl"
            with importlib.resources.as_file(resource) as path:
                engine, meta = sources.judge_trace(str(path), ruleset, observe=tally.feed)
            shown = "demo (bundled recording)"
        else:
            engine, meta = sources.judge_trace(args.replay, ruleset, observe=tally.feed)
            shown = args.replay
        frame = engine.frame
        src = {"kind": "replay", "path": shown, "scenario": meta.get("scenario"),
               "start": frame.t_first, "end": frame.t_last,
               "duration_seconds": (frame.t_last - frame.t_first)
               if frame.t_first is not None and frame.t_last is not None else None,
               "resolution_seconds": engine.res}
        return report.build_report([(engine, engine.summary(), None)], src, tally=tally,
                                   no_gpu_reason=NO_GPU_IN_RECORDING)
    if getattr(args, "prometheus", None):
        ruleset = _ruleset(args)
        win = window or DEFAULT_WINDOW
        engines = sources.judge_prometheus(args.prometheus, ruleset, window=win)
        if not engines:
            raise UserError(f"Prometheus at {args.prometheus} has no gpuwatch_* series in the "
                            f"last {win:g} s (is it scraping gpuwatch?)")
        parts = [(e, e.summary(), inst) for inst, (e, _) in engines.items()]
        src = {"kind": "prometheus", "url": args.prometheus, "window_seconds": win,
               "instances": sorted(engines)}
        return report.build_report(parts, src)
    url = getattr(args, "url", None) or DEFAULT_URL
    if getattr(args, "rules_dir", None):
        raise UserError("--rules-dir does not apply to --url: the daemon judges with its "
                        "own rules (set rules_dirs in its configuration)")
    got = sources.fetch_daemon_report(url)
    got.setdefault("source", {})["url"] = url
    return got


def main(args: argparse.Namespace) -> int:
    from gpuwatch.advisor import report

    rep = build(args)
    fmt = getattr(args, "format", "text") or "text"
    if fmt == "json":
        out = json.dumps(rep, indent=2) + "\n"
    elif fmt == "markdown":
        out = report.render_markdown(rep)
    else:
        out = report.render_text(rep)
    sys.stdout.write(out)
    sys.stdout.flush()
    return 0
