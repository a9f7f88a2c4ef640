"""`gpuwatch advise`: judge a run and say what to change, with the evidence.

From a recording (``--replay FILE``, ``--replay -`` for one piped in, ``--demo``), a running daemon (``--url``, its
/api/advice) or a Prometheus server (``--prometheus URL``: the fleet report, every
instance and GPU over ``--window`` seconds, narrowed by ``--match SELECTOR``, grouped per
host with the jobs and ranks the hook reported). Prints text, Markdown, JSON or one
self-contained HTML page (charts of a recording: advisor/html.py); exits 0
whether or not there is advice, 2 on bad input (a bad file, bad rules, a bad selector,
nothing listening).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.resources
import json
import os
import sys
import tempfile
import urllib.parse
from typing import Any

from gpuwatch.errors import UserError

DEFAULT_URL = "http://127.0.0.1:9442"
DEFAULT_WINDOW = 600.0
STDIN_NAME = "<stdin>"  # how a recording piped to --replay - is named in the report


def _ruleset(args: argparse.Namespace) -> Any:
    from gpuwatch.advisor.rules import load_rules
    from gpuwatch.serve.config import config_from_args

    config = config_from_args(args)  # the config file's rules_dirs, then --rules-dir
    return load_rules(config.rules_dirs)


def _check_flags(args: argparse.Namespace) -> None:
    """Every flag's problem before anything is judged or fetched."""
    window = getattr(args, "window", None)
    match = getattr(args, "match", None)
    prometheus = getattr(args, "prometheus", None)
    if window is not None and not window > 0:
        raise UserError(f"--window must be a positive number of seconds, got {window:g}")
    # flags that only a Prometheus source can honour are refused elsewhere, never ignored
    if not prometheus:
        for flag, value in (("--window", window), ("--match", match)):
            if value is not None:
                other = ("a recording is judged whole" if getattr(args, "replay", None)
                         or getattr(args, "demo", False) else
                         "the daemon judges over its own live history")
                raise UserError(f"{flag} applies to --prometheus only ({other})")
    for flag, given in (("--url", getattr(args, "url", None)), ("--prometheus", prometheus)):
        if given is not None:
            _check_url(flag, given)


def build(args: argparse.Namespace) -> dict[str, Any]:
    """The report (JSON-able dict) the arguments ask for."""
    from gpuwatch.advisor import report, sources

    _check_flags(args)
    window = getattr(args, "window", None)
    match = getattr(args, "match", None)
    prometheus = getattr(args, "prometheus", None)
    if getattr(args, "replay", None) or getattr(args, "demo", False):
        ruleset = _ruleset(args)
        if args.demo:
            resource = importlib.resources.files("gpuwatch.data") / "demo.jsonl"
            with importlib.resources.as_file(resource) as path:
                return sources.recording_report(str(path), ruleset, shown=sources.DEMO_NAME)
        return sources.recording_report(args.replay, ruleset,
                                        shown=getattr(args, "replay_shown", None))
    if prometheus:
        selector = sources.parse_selector(match) if match is not None else ""
        ruleset = _ruleset(args)
        win = window or DEFAULT_WINDOW
        engines = sources.judge_prometheus(prometheus, ruleset, window=win, selector=selector)
        if not engines:
            narrowed = f" matching {{{selector}}}" if selector else ""
            raise UserError(f"Prometheus at {prometheus} has no gpuwatch_* series{narrowed} in "
                            f"the last {win:g} s (is it scraping gpuwatch?)")
        parts = [(e, e.summary(), inst) for inst, (e, _) in engines.items()]
        src = {"kind": "prometheus", "url": prometheus, "window_seconds": win,
               "selector": selector or None, "instances": sorted(engines)}
        rep = report.build_report(parts, src)
        rep["hosts"] = fleet_hosts(rep, {inst: facts for inst, (_, facts) in engines.items()})
        rep["ranks"] = fleet_ranks(rep["hosts"])
        return rep
    url = getattr(args, "url", None) or DEFAULT_URL
    # (the daemon is also the source where none was named: say which one was read)
    source = "--url" if getattr(args, "url", None) else f"a running daemon ({url}, the default)"
    for flag, given in (("--rules-dir", getattr(args, "rules_dir", None)),
                        ("--config.file", getattr(args, "config_file", None))):
        if given:
            raise UserError(f"{flag} does not apply to {source}: the daemon judges with its "
                            "own rules (set rules_dirs in its configuration); give "
                            "--replay FILE, --demo or --prometheus URL to judge here")
    got = sources.fetch_daemon_report(url)
    got.setdefault("source", {})["url"] = url
    return got


def _check_url(flag: str, url: str) -> None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UserError(f"{flag}: bad URL {url!r}: expected http://HOST:PORT or https://HOST:PORT")


def build_with_timeline(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """The report the arguments ask for and, for a recording, its timeline (the HTML
    report's charts; None for a daemon or Prometheus)."""
    from gpuwatch.advisor import sources, timeline

    if getattr(args, "replay", None) or getattr(args, "demo", False):
        _check_flags(args)
        ruleset = _ruleset(args)
        if args.demo:
            resource = importlib.resources.files("gpuwatch.data") / "demo.jsonl"
            with importlib.resources.as_file(resource) as path:
                return timeline.judge_recording(str(path), ruleset, shown=sources.DEMO_NAME)
        return timeline.judge_recording(args.replay, ruleset,
                                        shown=getattr(args, "replay_shown", None))
    return build(args), None


# -- the fleet report (--prometheus) --------------------------------------------------------
def fleet_hosts(rep: dict[str, Any], facts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The report grouped per host: its GPUs (also those seen only as lost), the jobs and
    ranks the hook reported there, and its own advice."""
    hosts = []
    for inst in sorted(facts):
        f = facts[inst]
        entries = {g["gpu"]: g for g in rep.get("gpus", []) if g.get("instance") == inst}
        gpus = []
        for gpu in sorted(set(entries) | set(f.get("gpu_up", {})) | set(f.get("gpus", {}))):
            entry = dict(entries.get(gpu) or {"gpu": gpu, "instance": inst,
                                              "name": f.get("gpus", {}).get(gpu, {}).get("name")})
            entry["up"] = f.get("gpu_up", {}).get(gpu)
            gpus.append(entry)
        hosts.append({"instance": inst, "gpus": gpus, "jobs": f.get("jobs", []),
                      "advice": [a for a in rep.get("advice", []) if a.get("instance") == inst]})
    return hosts


# a rank whose own time per step is this much slower than the fastest rank's sets the
# job's pace (nvidia-resiliency-ext's straggler score: best median / own median < 0.75);
# the same threshold as the straggler-rank rule, which compares ranks on one host
STRAGGLER_SCORE = 0.75


def fleet_ranks(hosts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Compare the ranks the hook reported across hosts, as ranks of one job.

    Synchronous data-parallel ranks share one step time (each waits for the slowest in
    the collectives), so step times alone can't tell them apart. Where a daemon saw a rank
    wait on peers of its own host (a ``sync`` share above 0 in
    gpuwatch_train_time_share_ratio), a rank's own time per step is its step time less
    that share, scored against the fastest rank's. A daemon with one rank can't see whom
    its rank waits for (its ``sync`` is 0), so across such hosts the ranks are compared by
    the time they lose on their own: the DataLoader wait plus the host share (the data
    wait alone where no shares are exported). The selection must hold one job: two ranks
    with the same number mean several jobs (narrow with --match), and the comparison is
    left out with a note saying so."""
    ranks = [{"instance": h["instance"], **j} for h in hosts for j in h["jobs"]
             if j.get("rank") is not None and j.get("step_seconds")]
    if len({r["instance"] for r in ranks}) < 2:
        return None  # one host: the straggler-rank rule of its own engine compares them
    numbers = [r["rank"] for r in ranks]
    if len(set(numbers)) != len(numbers):
        return {"ranks": ranks, "straggler": None, "basis": None,
                "note": "ranks with the same number on several hosts: these are several "
                        "jobs; narrow with --match to one job's hosts to compare its ranks"}
    ranks.sort(key=lambda r: r["rank"])
    shares = [r.get("time_share") or {} for r in ranks]
    per_host = {inst: sum(r["instance"] == inst for r in ranks) for inst in
                {r["instance"] for r in ranks}}
    # a host with a single rank reads sync 0 whether or not that rank waits: own time
    # only holds where every host can see its ranks wait for each other
    if (all(sh.get("sync") is not None for sh in shares) and any(sh["sync"] > 0 for sh in shares)
            and min(per_host.values()) >= 2):
        return _by_own_time(ranks)
    return _by_stall(ranks)


def _straggler(r: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"instance": r["instance"], "rank": r["rank"], "pid": r["pid"], "gpu": r["gpu"],
            "data_wait_ratio": r.get("data_wait_ratio"), **extra}


def _by_own_time(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    for r in ranks:
        r["own_seconds"] = round(r["step_seconds"] * (1.0 - r["time_share"]["sync"]), 6)
    best = min(r["own_seconds"] for r in ranks)
    for r in ranks:
        r["rank_score"] = round(best / r["own_seconds"], 3) if r["own_seconds"] > 0 else 1.0
    slow = min(ranks, key=lambda r: r["rank_score"])
    straggler = None
    if slow["rank_score"] < STRAGGLER_SCORE:
        others = sorted(r["own_seconds"] for r in ranks if r is not slow)
        median = others[len(others) // 2]
        straggler = _straggler(slow, rank_score=slow["rank_score"],
                               own_seconds=slow["own_seconds"],
                               speedup_at_median_pace=round(slow["own_seconds"] / median, 2))
    return {"ranks": ranks, "straggler": straggler, "basis": "own_time", "note": None}


def _by_stall(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    have_shares = all(r.get("time_share") for r in ranks)
    for r in ranks:
        sh = r.get("time_share") or {}
        if have_shares:
            r["stall_ratio"] = round(sh.get("data", 0.0) + sh.get("host", 0.0), 4)
        else:
            r["stall_ratio"] = r.get("data_wait_ratio")
    note = ("each host saw one rank, so no rank's wait on its peers is measured: ranks "
            "compared by the time they lose on their own (data wait + host)") if have_shares \
        else ("no step-time breakdown (gpuwatch_train_time_share_ratio) from these daemons: "
              "ranks compared by data wait only")
    straggler = None
    if all(r["stall_ratio"] is not None for r in ranks):
        slow = max(ranks, key=lambda r: r["stall_ratio"])
        rest = sorted(r["stall_ratio"] for r in ranks if r is not slow)
        # the same 0.75 threshold: a quarter of each step lost above the others' median
        if slow["stall_ratio"] - rest[len(rest) // 2] > 1.0 - STRAGGLER_SCORE:
            straggler = _straggler(slow, stall_ratio=slow["stall_ratio"],
                                   others_stall_ratio=rest[len(rest) // 2])
    return {"ranks": ranks, "straggler": straggler, "basis": "stall", "note": note}


def _ranks_text(block: dict[str, Any] | None) -> list[str]:
    from gpuwatch.advisor.report import duration, percent

    if not block:
        return []
    lines = [f"Ranks across hosts ({len(block['ranks'])}):"]
    for r in block["ranks"]:
        own = f", own {duration(r['own_seconds'])}" if r.get("own_seconds") else ""
        score = f", score {r['rank_score']:.2f}" if r.get("rank_score") is not None else ""
        wait = (f", data wait {percent(r['data_wait_ratio'])}"
                if r.get("data_wait_ratio") is not None else "")
        stall = (f", lost on its own {percent(r['stall_ratio'])}"
                 if r.get("stall_ratio") is not None and r.get("time_share") else "")
        lines.append(f"  rank {r['rank']} on {r['instance']} GPU {r['gpu']}: step "
                     f"{duration(r['step_seconds'])}{own}{wait}{stall}{score}")
    s = block.get("straggler")
    if s:
        if s.get("rank_score") is not None:
            why = (f"its own time per step is {1 / s['rank_score']:.2f}x the fastest rank's; "
                   f"at the other ranks' median pace the job would go "
                   f"{s['speedup_at_median_pace']:.2f}x faster")
        else:
            why = (f"it loses {percent(s['stall_ratio'])} of each step on its own (the "
                   f"others' median: {percent(s['others_stall_ratio'])}), and the other ranks wait for it "
                   "in the collectives")
        lines.append(f"  Straggler: rank {s['rank']} on {s['instance']} (GPU {s['gpu']}): "
                     f"{why}. Look at that host's advice and its input pipeline.")
    if block.get("note"):
        lines.append(f"  Note: {block['note']}")
    return lines


def _job_text(j: dict[str, Any]) -> str:
    from gpuwatch.advisor.report import duration, percent

    parts = [f"pid {j['pid']}" if j.get("pid") is not None else "a job"]
    if j.get("rank") is not None:
        parts.append(f"rank {j['rank']}")
    if j.get("gpu") is not None:
        parts.append(f"GPU {j['gpu']}")
    facts = []
    if j.get("step_seconds") is not None:
        facts.append(f"step {duration(j['step_seconds'])}")
    if j.get("data_wait_ratio") is not None:
        facts.append(f"data wait {percent(j['data_wait_ratio'])}")
    if j.get("samples_per_second") is not None:
        facts.append(f"{j['samples_per_second']:.0f} samples/s")
    if j.get("time_share"):
        facts.append("time: " + ", ".join(f"{k} {percent(v)}" for k, v in
                                          sorted(j["time_share"].items(), key=lambda kv: -kv[1])))
    return " ".join(parts) + (f" ({'; '.join(facts)})" if facts else "")


def _host_report(rep: dict[str, Any], host: dict[str, Any]) -> dict[str, Any]:
    """The fleet report cut down to one host, for the single-host renderers."""
    sub = dict(rep)
    sub["gpus"] = [g for g in rep.get("gpus", []) if g.get("instance") == host["instance"]]
    sub["advice"] = host["advice"]
    sub["notes"] = []
    return sub


def _fleet_header(rep: dict[str, Any]) -> str:
    src = rep.get("source", {})
    hosts = rep.get("hosts", [])
    n_gpus = sum(len(h["gpus"]) for h in hosts)
    sel = f", selector {{{src['selector']}}}" if src.get("selector") else ""
    return (f"Prometheus {src.get('url')}, last {src.get('window_seconds', 0):.0f} s{sel}: "
            f"{len(hosts)} host(s), {n_gpus} GPU(s), {len(rep.get('advice', []))} piece(s) "
            "of advice")


def _host_heading(host: dict[str, Any]) -> str:
    lost = [g["gpu"] for g in host["gpus"] if g.get("up") is False]
    text = f"{host['instance']}: {len(host['gpus'])} GPU(s)"
    if lost:
        text += ", lost: " + ", ".join(f"GPU {g}" for g in lost)
    return text


def render_fleet_text(rep: dict[str, Any]) -> str:
    from gpuwatch.advisor import report

    lines = [f"gpuwatch fleet advice: {_fleet_header(rep)}"]
    for host in rep.get("hosts", []):
        lines += ["", f"== {_host_heading(host)} =="]
        lines += [f"job {_job_text(j)}" for j in host["jobs"]]
        body = report.render_text(_host_report(rep, host)).splitlines()
        if body and body[0].startswith("gpuwatch advice:"):
            body = body[1:]  # the fleet header said where the data came from
        lines += body
    ranks = _ranks_text(rep.get("ranks"))
    if ranks:
        lines += [""] + ranks
    for note in rep.get("notes", []):
        lines += ["", f"Note: {note}"]
    return "\n".join(lines).rstrip() + "\n"


def render_fleet_markdown(rep: dict[str, Any]) -> str:
    from gpuwatch.advisor import report

    lines = [f"# gpuwatch fleet advice: {_fleet_header(rep)}"]
    for host in rep.get("hosts", []):
        lines += ["", f"## {_host_heading(host)}", ""]
        lines += [f"- job {_job_text(j)}" for j in host["jobs"]]
        body = report.render_markdown(_host_report(rep, host)).splitlines()
        if body and body[0].startswith("# gpuwatch advice:"):
            body = body[1:]
        while body and not body[0].strip():
            body = body[1:]
        if host["jobs"]:
            lines.append("")
        # one level down: the host is the section
        lines += [("#" + ln) if ln.startswith("#") else ln for ln in body]
    ranks = _ranks_text(rep.get("ranks"))
    if ranks:
        lines += ["", "## " + ranks[0].rstrip(":"), "", "```", *[ln.strip() for ln in ranks[1:]],
                  "```"]
    for note in rep.get("notes", []):
        lines += ["", f"> {note}"]
    return "\n".join(lines).rstrip() + "\n"


@contextlib.contextmanager
def _stdin_recording() -> Any:
    """A recording piped in (``--replay -``), copied whole to a private temporary file: the
    replay reads its file more than once (its span first; a long one in several processes),
    which a pipe cannot be. Plain or gzip, as a file is. Removed when done."""
    stdin = sys.stdin
    if stdin is None or stdin.closed:
        raise UserError("--replay -: there is no standard input to read a recording from")
    if stdin.isatty():
        raise UserError("--replay -: standard input is a terminal; pipe a recording in, e.g. "
                        "zcat run.jsonl.gz | gpuwatch advise --replay -")
    with _copied(getattr(stdin, "buffer", stdin), "-", "standard input", STDIN_NAME) as path:
        yield path


@contextlib.contextmanager
def _copied(src: Any, flag: str, what: str, shown: str) -> Any:
    """``src`` (a binary stream, or a text one) read to its end into a private temporary
    file, named ``shown`` in messages; removed when done."""
    from gpuwatch.trace import format as trace_format

    fd, path = tempfile.mkstemp(prefix="gpuwatch-stdin-", suffix=".jsonl")
    try:
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := src.read(1 << 20):
                    # (a text stream without a binary buffer: a notebook's, a test's)
                    out.write(chunk.encode("utf-8") if isinstance(chunk, str) else chunk)
        except OSError as err:
            raise UserError(f"--replay {flag}: cannot copy {what} to {path}: "
                            f"{err.strerror or err} (TMPDIR names where the copy goes)") from err
        if os.path.getsize(path) == 0:
            raise UserError(f"--replay {flag}: {what} was empty: expected a gpuwatch-trace/1 "
                            "recording (gpuwatch run --record FILE makes one)")
        trace_format.SHOWN_AS[path] = shown
        yield path
    finally:
        trace_format.SHOWN_AS.pop(path, None)
        with contextlib.suppress(OSError):
            os.unlink(path)


@contextlib.contextmanager
def _pipe_recording(name: str) -> Any:
    """A recording given by the name of a pipe (``<(zcat run.jsonl.gz)``, /dev/stdin, a
    FIFO): read once, into a copy, as ``--replay -`` is (a pipe cannot be read twice)."""
    try:
        src = open(name, "rb")  # noqa: SIM115 (closed below, after the copy)
    except OSError as err:
        raise UserError(f"--replay {name}: cannot read it: {err.strerror or err}") from err
    with src, _copied(src, name, "what it gave", name) as path:
        yield path


def main(args: argparse.Namespace) -> int:
    from gpuwatch.advisor import report

    replay = getattr(args, "replay", None)
    if replay == "":
        raise UserError("--replay: expected a recording's file name (or - for standard "
                        "input), got an empty one")
    if replay == "-":
        with _stdin_recording() as path:
            args.replay, args.replay_shown = path, STDIN_NAME
            return main(args)
    if replay and os.path.exists(replay) and not os.path.isfile(replay) \
            and not os.path.isdir(replay):
        with _pipe_recording(replay) as path:
            args.replay, args.replay_shown = path, replay
            return main(args)
    fmt = getattr(args, "format", "text") or "text"
    if fmt == "html":
        from gpuwatch.advisor import html

        rep, timeline = build_with_timeline(args)
        _emit(html.render(rep, timeline))
        return 0
    rep = build(args)
    fleet = rep.get("source", {}).get("kind") == "prometheus" and "hosts" in rep
    if fmt == "json":
        out = json.dumps(rep, indent=2) + "\n"
    elif fmt == "markdown":
        out = render_fleet_markdown(rep) if fleet else report.render_markdown(rep)
    else:
        out = render_fleet_text(rep) if fleet else report.render_text(rep)
    _emit(out)
    return 0


def _emit(text: str) -> None:
    """The report to standard output; what its encoding cannot write (a lone surrogate
    from a JSON escape in a recording, a file name that is not UTF-8) as a backslash
    escape rather than a traceback."""
    try:
        sys.stdout.write(text)
    except UnicodeEncodeError:
        enc = sys.stdout.encoding or "utf-8"
        sys.stdout.write(text.encode(enc, "backslashreplace").decode(enc))
    sys.stdout.flush()
