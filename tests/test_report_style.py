"""One style for numbers and words in every report (docs/report.md, "One style"): a percent
is written `20 %` in rule messages as in the evidence beside them, with the same precision;
the time line of the text report says what the Markdown table says; titles sit where the
bodies under them sit."""

from __future__ import annotations

import json
import re
from argparse import Namespace
from pathlib import Path

import pytest
from conftest import RECORDINGS as RECORDING_PATHS
from test_advise_support import DATA, run_cli

from gpuwatch.advise import build
from gpuwatch.advisor.report import (
    evidence_value,
    host_kernels_note,
    percent,
    render_markdown,
    render_text,
)
from gpuwatch.advisor.rules import load_rules

RECORDINGS = [p.name for p in RECORDING_PATHS] + ["demo"]
# a percent written the other way: no space before the sign
GLUED = re.compile(r"\d%")
# every percent as the report writes it
PERCENT = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?) %")
PROSE = ("title", "message", "action", "expected_gain_text", "hook_would_add")


def _report(name: str) -> dict:
    demo = name == "demo"
    return build(Namespace(replay=None if demo else str(DATA / name), demo=demo,
                           config_file=None, rules_dir=None, format="json"))


@pytest.fixture(scope="module")
def reports() -> dict[str, dict]:
    return {name: _report(name) for name in RECORDINGS}


def _precision_ok(text: str) -> list[str]:
    """Percents that break the precision rule: a tenth only below 10 % and (memory) from
    90 % up, never between."""
    return [m.group(0) for m in PERCENT.finditer(text)
            if "." in m.group(1) and 10 <= float(m.group(1)) < 90]


@pytest.mark.parametrize("name", RECORDINGS)
def test_every_percent_is_written_one_way(reports, name):
    rep = reports[name]
    text, md = render_text(rep, width=100), render_markdown(rep)
    for shown in (text, md, *(str(a.get(k) or "") for a in rep["advice"] for k in PROSE)):
        assert not GLUED.search(shown), GLUED.findall(shown)
        assert _precision_ok(shown) == [], shown


@pytest.mark.parametrize("name", RECORDINGS)
def test_a_message_says_the_percent_its_evidence_says(reports, name):
    rules = load_rules().by_id()
    for a in reports[name]["advice"]:
        # (the message: of the action's variants only one is written)
        # (a name in an optional [[...]] fragment counts where its fragment was written:
        # each of its literal pieces is in the message)
        tpl = rules[a["id"]].message
        groups = tpl.groups or (0,) * len(tpl.parts)
        message = " ".join(a["message"].split())
        pieces: dict[int, list[str]] = {}
        for (lit, _, _), g in zip(tpl.parts, groups, strict=True):
            if g and lit.strip():
                pieces.setdefault(g, []).append(" ".join(lit.split()))
        written = {g for g, lits in pieces.items() if all(x in message for x in lits)}
        named = {n for (_, n, spec), g in zip(tpl.parts, groups, strict=True)
                 if n and spec.endswith("%") and (not g or g in written)}
        for key in sorted(named & set(a["evidence"])):
            shown = evidence_value(key, a["evidence"][key])
            assert shown in a["message"], (a["id"], key, shown, a["message"])


def test_every_rule_template_writes_percents_the_one_way():
    """Every built-in rule's message, actions and gain text, rendered with a value for each
    placeholder: new rules get the style without anyone editing their text."""
    rules = load_rules()
    assert len(rules.rules) >= 10
    for rule in rules.rules:
        templates = [rule.message, *(a.text for a in rule.actions)]
        if rule.gain_text is not None:
            templates.append(rule.gain_text)
        for t in templates:
            # (0.09996 and 0.89996: a tenth that rounds up to 10.0 and to 90.0 %)
            for value in (0.2, 0.079, 0.975, 1.0, 0.09996, 0.89996):
                out = t.render(dict.fromkeys(t.names(), value))
                assert not GLUED.search(out), (rule.id, out)
                assert _precision_ok(out) == [], (rule.id, out)


def test_a_percent_just_under_ten_is_written_whole():
    """A share of 9.996 % (an H200's SMs busy in a Seq2SeqTrainer's steps) is "10 %", as
    every percent from 10 % on: written to a tenth it would read "10.0 %". Memory from
    90 % up keeps its tenth (fine_top), and 89.996 % full is "90.0 %" there."""
    assert percent(0.099933) == "10 %" and percent(0.0994) == "9.9 %"
    assert percent(0.89996) == "90 %" and percent(0.89996, fine_top=True) == "90.0 %"
    assert percent(0.8994, fine_top=True) == "90 %" and percent(0.99996) == "100 %"


def test_a_rule_of_ones_own_gets_the_style(tmp_path):
    (tmp_path / "mine.yaml").write_text(
        "rules:\n"
        "  - id: my-util-check\n"
        "    title: Util under 90%\n"
        "    severity: info\n"
        "    when: mean(util, 10s) < 0.9\n"
        "    evidence:\n"
        "      util: mean(util, 10s)\n"
        "    message: The GPU ran kernels {util:.2%} of the time (aim for 90%).\n"
        "    action: Look at {util:.0%}.\n")
    proc = run_cli("advise", "--replay", str(DATA / "small_batch.jsonl"), "--rules-dir",
                   str(tmp_path), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    (mine,) = [a for a in json.loads(proc.stdout)["advice"] if a["id"] == "my-util-check"]
    util = evidence_value("util", mine["evidence"]["util"])
    assert util.endswith(" %") and "." not in util  # 20 %, whole: between 10 and 90
    assert mine["message"] == f"The GPU ran kernels {util} of the time (aim for 90 %)."
    assert mine["action"] == f"Look at {util}."
    assert mine["title"] == "Util under 90 %"


@pytest.mark.parametrize("name", RECORDINGS)
def test_the_time_line_says_what_the_table_says(reports, name):
    rep = reports[name]
    text, md = render_text(rep, width=100), render_markdown(rep)
    names = {"data": "data wait", "sync": "waiting on peers", "gpu": "GPU work",
             "host": "host", "other": "other"}
    # the breakdown's rows (the phases table has fewer cells), and the jobs that have one
    # (an inference process has phases, no breakdown)
    rows = [r for r in md.splitlines() if re.match(r"\| \S+ \| (pid|rank|\?)", r)
            and r.count("|") == 10]
    lines = [ln for ln in text.splitlines() if " time: " in ln or " time at work: " in ln]
    jobs = [j for j in rep["jobs"] if j.get("time_share")]
    assert len(rows) == len(lines) == len(jobs)
    for job, row, line in zip(jobs, rows, lines, strict=True):
        cells = [c.strip() for c in row.strip("|").split("|")]
        cpu = job["gpu"] is None  # a CPU-only job: its host time is the step's own work
        # the host share says, beside it, how much of it a kernel ran through (the same
        # words in both)
        kernels = host_kernels_note(job)
        for i, cat in enumerate(("data", "sync", "gpu", "host", "other")):
            shown = percent(job["time_share"][cat])
            if cat == "host" and kernels:
                shown += f" ({kernels})"
            assert cells[2 + i] == shown, (cat, row)
            if cpu and cat in ("sync", "gpu"):
                assert names[cat] not in line, (cat, line)
                continue
            name = "the step's own work on the CPU" if cpu and cat == "host" else names[cat]
            assert f"{name} {shown}" in line, (cat, line)


@pytest.mark.parametrize("name", ["demo", "gpu_fp32_conv.jsonl", "gpu_leak_oom.jsonl"])
def test_titles_and_bodies_sit_at_one_indent(reports, name):
    rep = reports[name]
    assert rep["advice"]
    lines = render_text(rep, width=100).splitlines()
    heads = [i for i, ln in enumerate(lines) if re.match(r"\d+\. \[[A-Z]+\] ", ln)]
    assert len(heads) == len(rep["advice"])
    for i, a in zip(heads, rep["advice"], strict=True):
        assert lines[i + 1] == "    " + a["title"]
        body = lines[i + 1:lines.index("", i + 1) if "" in lines[i + 1:] else len(lines)]
        assert all(ln.startswith("    ") and not ln.startswith("     ") for ln in body), body


def test_the_style_is_written_down_once():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "report.md").read_text()
    assert "## One style" in doc
    section = doc.split("## One style", 1)[1].split("\n## ", 1)[0]
    for example in ("`20 %`", "`7.9 %`", "`97.5 %`", "`{util:.0%}`"):
        assert example in section, example


# a unit the report writes after a number, as a line of the text report would start with it
UNIT_FIRST = re.compile(r"^ *(%|[µm]?s|min|[KMGT]i?B(/s)?|cores?)([ ,.;:)]|$)")


def _parted(lines: list[str]) -> list[str]:
    """Line breaks that part a number from its unit, or a word at its hyphen."""
    return [f"{a!r} / {b!r}" for a, b in zip(lines, lines[1:], strict=False)
            if (re.search(r"\d$", a) and UNIT_FIRST.match(b)) or re.search(r"\w-$", a)]


@pytest.mark.parametrize("name", RECORDINGS)
def test_a_wrapped_line_never_parts_a_number_from_its_unit(reports, name):
    rep = reports[name]
    for width in (60, 100):
        lines = render_text(rep, width=width).splitlines()
        # (nor a word from the rest of itself at its hyphen: mode="reduce-\noverhead")
        assert _parted(lines) == []
        assert "\u00a0" not in "\n".join(lines)


def test_the_wrap_keeps_units_that_a_plain_wrap_would_part():
    import textwrap

    from gpuwatch.advisor.report import _wrap

    text = ("the main process is busy while the GPU idles 37 % of the time; in 15 % of it a "
            'kernel ran (torch.compile(model) or mode="reduce-overhead"), 380 ms a step')
    parted = [w for w in range(30, 90) if _parted(textwrap.wrap(text, w))]
    assert parted  # widths where textwrap alone parts them
    for w in parted:
        lines = _wrap(text, w)
        assert _parted(lines) == [], lines
        assert " ".join(lines) == text
