"""`gpuwatch advise --format html`: the report of every recording in tests/data/ rendered in
Debian's headless chromium, with no console message and no request of its own, and its
numbers the JSON report's. Phases are shaded where a recording has `phase` lines."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from html import escape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import browser
import pytest
from conftest import RECORDINGS as RECORDING_PATHS
from conftest import recording

from gpuwatch.advisor.report import blocks_of, evidence_value, where_text

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
RECORDINGS = [p.name for p in RECORDING_PATHS]

pytestmark = pytest.mark.skipif(not browser.available(), reason="no chromium")


def gpuwatch(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "gpuwatch", *args], capture_output=True,
                          text=True, env=env, timeout=300, check=False)


class _Keyed(HTMLParser):
    """Every element carrying ``data-key``: (key, raw value, the text shown in it)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, Any, str]] = []
        self._open: list[list[Any]] = []
        self.tags: dict[str, int] = {}
        self.span_titles: list[str] = []
        self._in_span_title = False
        self._span_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for item in self._open:
            item[3] += 1
        if "data-key" in a:
            self._open.append([a["data-key"], json.loads(a["data-value"] or "null"), "", 0])
        if tag == "rect" and (a.get("class") or "") == "span":
            self._span_depth = 1
        elif self._span_depth and tag == "title":
            self._in_span_title = True

    def handle_endtag(self, tag: str) -> None:
        if self._in_span_title and tag == "title":
            self._in_span_title = False
            self._span_depth = 0
        for item in list(self._open):
            if item[3] == 0:
                self._open.remove(item)
                self.found.append((item[0], item[1], item[2].strip()))
            else:
                item[3] -= 1

    def handle_data(self, data: str) -> None:
        for item in self._open:
            item[2] += data
        if self._in_span_title:
            self.span_titles.append(data)


def keyed(dom: str) -> _Keyed:
    p = _Keyed()
    p.feed(dom)
    return p


def resolve(report: dict[str, Any], key: str) -> Any:
    node: Any = report
    for part in key.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def shown_number(text: str) -> tuple[float, float]:
    """The number a cell shows, in the JSON's units (86 % -> 0.86, 154 ms -> 0.154), and
    how precisely it shows it (half its last digit)."""
    m = re.fullmatch(r"([-\d.]+)\s*(%|ms|s|µs|min|h|x)?", text.strip())
    assert m, f"not a number with a unit: {text!r}"
    digits = m.group(1).partition(".")[2]
    scale = {"%": 0.01, "ms": 1e-3, "µs": 1e-6, "s": 1.0, "min": 60.0, "h": 3600.0,
             "x": 1.0, None: 1.0}[m.group(2)]
    return float(m.group(1)) * scale, 0.5 * 10 ** -len(digits) * scale + 1e-9


def check_numbers(report: dict[str, Any], dom: str) -> int:
    """Each keyed element's raw value is the JSON's and its text shows that value."""
    parsed = keyed(dom)
    assert parsed.found or not (report.get("jobs") or report.get("advice"))
    for key, raw, text in parsed.found:
        want = resolve(report, key)
        assert raw == want, (key, raw, want)
        if ".evidence." in key:
            assert text == evidence_value(key.rsplit(".", 1)[1], want), (key, text, want)
        elif key.endswith("compute_capability"):
            assert text == (want or "?")
        elif isinstance(want, int):
            assert text == str(want), (key, text, want)
        elif isinstance(want, float):
            got, tol = shown_number(text)
            assert abs(got - want) <= tol, (key, text, want)
    return len(parsed.found)


@pytest.mark.slow
@pytest.mark.parametrize("name", RECORDINGS)
def test_html_report_of_each_recording_renders_offline_with_the_json_numbers(name, tmp_path):
    page = tmp_path / "report.html"
    got = gpuwatch("advise", "--replay", str(DATA / name), "--format", "html")
    assert got.returncode == 0, got.stderr
    page.write_text(got.stdout)
    js = gpuwatch("advise", "--replay", str(DATA / name), "--format", "json")
    assert js.returncode == 0, js.stderr
    report = json.loads(js.stdout)
    html = got.stdout
    # self-contained: no script, nothing that could be fetched, a policy that forbids it
    assert "<script" not in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html)
    assert "Content-Security-Policy" in html
    rendered = browser.render(page, tmp_path)
    assert rendered.console == []
    assert rendered.page_requests == []
    dom = rendered.dom
    assert "gpuwatch report" in dom
    n = check_numbers(report, dom)
    parsed = keyed(dom)
    if report["gpus"]:
        # a chart per GPU at least (busy; memory, power and clocks where recorded)
        assert dom.count('class="chart"') >= len(report["gpus"])
        assert "GPU 0" in dom
    blocks = blocks_of(report["advice"])
    for i, (lead, gpus, group) in enumerate(blocks, 1):
        # a card per block of the text report (the same piece on several GPUs is one),
        # numbered in the JSON's order, naming its GPUs; every piece's message and change
        # are on the page (the block's first in full, the others folded where they differ)
        assert f'-advice-{i}"' in dom
        assert escape(where_text(lead, gpus)) in html
        for a in group:
            assert escape(a["message"]) in html and escape(a["action"]) in html
    assert f'-advice-{len(blocks) + 1}"' not in dom
    if report["jobs"] and any(j.get("step_seconds") for j in report["jobs"]):
        assert n >= len(report["jobs"]) * 6  # the shares, the step time, the steps
    assert parsed.tags.get("svg", 0) >= (1 if report["gpus"] else 0)


def test_the_check_sees_a_console_error_and_a_fetch(tmp_path):
    """The test's own instruments: a page that logs an error and fetches an image (from a
    closed port on this machine) is caught on both counts."""
    page = tmp_path / "bad.html"
    page.write_text('<!doctype html><p>x</p><img src="http://127.0.0.1:9/x.png">'
                    '<script>console.error("boom")</script>')
    rendered = browser.render(page, tmp_path)
    assert any("boom" in c for c in rendered.console)
    assert rendered.page_requests == ["http://127.0.0.1:9/x.png"]


def _with_phases(src: Path, out: Path) -> list[tuple[float, str]]:
    """``src`` with `phase` lines, as the hook writes them: start-up until the first step,
    training, an evaluation in the middle, a checkpoint at the end."""
    lines = src.read_text().splitlines()
    steps = [json.loads(x)["t"] for x in lines if '"kind":"step"' in x]
    first, last = steps[0], steps[-1]
    mid = (first + last) / 2
    marks = [(json.loads(lines[1])["t"], "startup"), (first, "train"), (mid, "eval"),
             (mid + 3, "train"), (last - 1, "checkpoint")]
    seconds: dict[str, float] = {}
    prev_t, prev = marks[0]
    phase_lines = []
    for t, phase in marks:
        seconds[prev] = seconds.get(prev, 0.0) + (t - prev_t)
        phase_lines.append((t, json.dumps({"t": t, "kind": "phase", "pid": None, "rank": None,
                                           "gpu": 0, "phase": phase,
                                           "seconds": {k: round(v, 3) for k, v in
                                                       seconds.items()}})))
        prev_t, prev = t, phase
    body = [(json.loads(x)["t"], x) for x in lines[1:]] + phase_lines
    body.sort(key=lambda p: p[0])
    out.write_text("\n".join([lines[0], *[x for _, x in body]]) + "\n")
    return marks


def test_phases_are_shaded_where_a_recording_has_them(tmp_path):
    rec = tmp_path / "phased.jsonl"
    marks = _with_phases(DATA / "input_bound.jsonl", rec)
    page = tmp_path / "report.html"
    got = gpuwatch("advise", "--replay", str(rec), "--format", "html")
    assert got.returncode == 0, got.stderr
    page.write_text(got.stdout)
    rendered = browser.render(page, tmp_path)
    assert rendered.console == [] and rendered.page_requests == []
    parsed = keyed(rendered.dom)
    shaded = {t.split(":")[0] for t in parsed.span_titles}
    assert shaded == {"startup", "train", "eval", "checkpoint"}
    # each chart of the job shades them: step time, data wait, the breakdown
    assert rendered.dom.count('class="span"') >= 3 * (len(marks))
    # without phase lines, nothing is shaded
    plain = gpuwatch("advise", "--replay", str(DATA / "input_bound.jsonl"), "--format", "html")
    assert 'class="span"' not in plain.stdout


def test_a_daemon_report_renders_without_charts(tmp_path, gpuwatch_daemon):
    d = gpuwatch_daemon("--replay", str(DATA / "tuned.jsonl"),
                        "--web.listen-address", "127.0.0.1:0")
    got = gpuwatch("advise", "--url", d.url, "--format", "html")
    assert got.returncode == 0, got.stderr
    page = tmp_path / "live.html"
    page.write_text(got.stdout)
    rendered = browser.render(page, tmp_path)
    assert rendered.console == [] and rendered.page_requests == []
    # a replaying daemon hands over the recording judged ahead (as `advise --replay`)
    assert "No charts" in rendered.dom and f"replayed by the daemon at {d.url}" in rendered.dom


def test_the_ranks_of_one_job_told_the_same_are_one_card(tmp_path):
    """Lightning's Transformer demo on 4 GPUs: each piece of advice said for all four ranks
    is one card naming GPUs 0-3 (as the text report's block), the ranks' own figures folded
    under it; the chart marks of every GPU link to that card."""
    name = recording("fw_lightning_transformer_ddp").name
    report = json.loads(gpuwatch("advise", "--replay", str(DATA / name), "--format",
                                 "json").stdout)
    got = gpuwatch("advise", "--replay", str(DATA / name), "--format", "html")
    assert got.returncode == 0, got.stderr
    html = got.stdout
    pieces = [a for a in report["advice"] if a["id"] == "raise-batch-size"]
    assert sorted(a["gpu"] for a in pieces) == [0, 1, 2, 3]
    cards = re.findall(r'<div class="card" id="(gw[0-9a-f]+-advice-\d+)"', html)
    assert len(cards) == len(blocks_of(report["advice"])) < len(report["advice"])
    card = html[html.index(f'id="{cards[0]}"'):html.index(f'id="{cards[1]}"')]
    assert "raise-batch-size</code> on GPUs 0, 1, 2, 3" in card
    # the other ranks' own evidence, keyed to their own pieces of the JSON
    assert card.count("<h4>GPU ") == 3 and "<details>" in card
    for a in pieces:
        i = report["advice"].index(a)
        assert f'data-key="advice.{i}.evidence.batch_size"' in card
    # the verdict lists the blocks, not the pieces
    toc = html[html.index('<ol class="toc">'):html.index("</ol>")]
    assert toc.count("<li>") == len(cards)
    # every GPU's chart marks raise-batch-size with the one card's number
    marks = set(re.findall(r'href="#(gw[0-9a-f]+-advice-\d+)"', html[:html.index("<h2>Advice")]))
    assert cards[0] in marks
    page = tmp_path / "report.html"
    page.write_text(html)
    rendered = browser.render(page, tmp_path)
    assert rendered.console == [] and rendered.page_requests == []
    check_numbers(report, rendered.dom)

