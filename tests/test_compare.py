"""`gpuwatch compare BEFORE AFTER` on pairs of recordings in tests/data/: the starved run
against the tuned one, fp32 against bf16, the DDP straggler against its balanced twin
give the ratios measured from the recordings themselves; pairs that don't compare are
refused with the reason; a recording compares against a live daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"


def gpuwatch(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "gpuwatch", *args], capture_output=True,
                          text=True, env=env, timeout=300, check=False)


def compare_json(before: str, after: str, *extra: str) -> tuple[int, dict[str, Any]]:
    got = gpuwatch("compare", before, after, "--format", "json", *extra)
    assert got.returncode in (0, 3), got.stderr
    return got.returncode, json.loads(got.stdout)


def measured_samples_per_second(path: Path) -> float:
    """From the recording's own step lines, per process: the samples of every step after
    the first over the time from the first step's end to the last's, summed."""
    per: dict[Any, list[float]] = {}
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            if d.get("kind") != "step":
                continue
            key = (d.get("pid"), d.get("rank"))
            if key not in per:
                per[key] = [d["t"], d["t"], 0.0]
                continue
            per[key][1] = d["t"]
            per[key][2] += d.get("batch_size") or 0
    return sum(samples / (t1 - t0) for t0, t1, samples in per.values())


def step_seconds(path: Path) -> float:
    got = gpuwatch("advise", "--replay", str(path), "--format", "json")
    return max(j["step_seconds"] for j in json.loads(got.stdout)["jobs"] if j["step_seconds"])


@pytest.mark.parametrize("before,after,gone,paid", [
    # the starved run (no DataLoader workers) against the tuned one: 4x the samples
    ("input_bound.jsonl", "tuned.jsonl", "add-dataloader-workers", 3.5),
    # plain fp32 (TF32 off) against bf16: data/FORMAT.md's 6.6x in step time
    ("fp32.jsonl", "tuned.jsonl", "enable-mixed-precision", 6.0),
    # one rank starved of data against both ranks fed: README's 7.5x
    ("gpu_ddp_slow_rank.jsonl", "gpu_ddp_balanced.jsonl", "straggler-rank", 7.0),
])
def test_compare_gives_the_measured_ratios(before, after, gone, paid):
    rc, cmp = compare_json(str(DATA / before), str(DATA / after))
    assert rc == 0 and cmp["comparable"] and cmp["reasons"] == []
    sps = cmp["changes"]["samples_per_second"]
    want_b = measured_samples_per_second(DATA / before)
    want_a = measured_samples_per_second(DATA / after)
    assert sps["before"] == pytest.approx(want_b, rel=1e-3)
    assert sps["after"] == pytest.approx(want_a, rel=1e-3)
    assert sps["ratio"] == pytest.approx(want_a / want_b, rel=2e-3)
    assert sps["ratio"] > paid
    step = cmp["changes"]["step_seconds"]
    sb, sa = step_seconds(DATA / before), step_seconds(DATA / after)
    assert (step["before"], step["after"]) == (sb, sa)
    assert step["ratio"] == pytest.approx(sa / sb, abs=1e-3)
    assert gone in {a["id"] for a in cmp["advice"]["gone"]}
    assert cmp["verdict"] == "paid_off"
    # the other way round, the same runs are a loss
    rc, back = compare_json(str(DATA / after), str(DATA / before))
    assert rc == 0 and back["verdict"] == "worse"
    assert gone in {a["id"] for a in back["advice"]["new"]}


def test_text_says_it_in_one_line_per_figure():
    got = gpuwatch("compare", str(DATA / "input_bound.jsonl"), str(DATA / "tuned.jsonl"))
    assert got.returncode == 0, got.stderr
    _, cmp = compare_json(str(DATA / "input_bound.jsonl"), str(DATA / "tuned.jsonl"))
    s = cmp["changes"]["samples_per_second"]
    text = got.stdout
    assert f"samples/s  {s['before']:.0f} -> {s['after']:.0f} ({s['ratio']:.2f}x)" in text
    data = cmp["changes"]["time_share"]["data"]
    assert data["before"] > 0.8 and data["after"] < 0.01
    assert "data wait 86 % -> 0.3 %" in text
    assert "add-dataloader-workers (GPU 0) gone" in text
    assert "The change paid off: 3.94x the samples per second." in text
    assert "util 26 % -> 98 %" in text and "SM active 22 % -> 87 %" in text


def test_markdown_and_html():
    md = gpuwatch("compare", str(DATA / "fp32.jsonl"), str(DATA / "tuned.jsonl"),
                  "--format", "markdown")
    assert md.returncode == 0
    assert md.stdout.startswith("# gpuwatch compare: `fp32.jsonl` -> `tuned.jsonl`")
    assert "| samples/s | 252 -> 1635 (6.49x) |" in md.stdout
    page = gpuwatch("compare", str(DATA / "fp32.jsonl"), str(DATA / "tuned.jsonl"),
                    "--format", "html")
    assert page.returncode == 0
    assert "<script" not in page.stdout and "Content-Security-Policy" in page.stdout
    assert "The change paid off: 6.49x the samples per second." in page.stdout


@pytest.mark.parametrize("before,after,why", [
    # another model: 1.8 GiB of model state against 2.6 GiB (width 1024, 12 layers)
    ("tuned.jsonl", "h200_tuned_b128.jsonl", "another model"),
    ("gpu_starved_cnn.jsonl", "gpu_fp32_conv.jsonl", "another model"),
    ("h200_fp32_b16.jsonl", "h200_tf32.jsonl", "another model"),
    # no step data: a process that holds memory and trains nothing
    ("idle.jsonl", "tuned.jsonl", "no training steps from the torch hook"),
    # no hook on one side: the same straggler job, once without it
    ("gpu_ddp_slow_rank_nohook.jsonl", "gpu_ddp_balanced.jsonl",
     "no training steps from the torch hook"),
])
def test_pairs_that_do_not_compare_are_refused(before, after, why):
    got = gpuwatch("compare", str(DATA / before), str(DATA / after))
    assert got.returncode == 3
    assert "Not comparable:" in got.stdout and why in got.stdout
    assert "paid off" not in got.stdout
    rc, cmp = compare_json(str(DATA / before), str(DATA / after))
    assert rc == 3 and not cmp["comparable"] and cmp["verdict"] == "not_comparable"
    assert any(why in r for r in cmp["reasons"])
    forced = gpuwatch("compare", str(DATA / before), str(DATA / after), "--force")
    assert forced.returncode == 0 and why in forced.stdout and "Compared anyway" in forced.stdout


def test_runs_of_the_same_model_compare_whatever_else_changed():
    """The same workload with other DataLoader workers, or holding a ballast of memory:
    the same model state between steps, so they compare."""
    rc, cmp = compare_json(str(DATA / "h200_input_bound_w2.jsonl"), str(DATA / "tuned.jsonl"))
    assert rc == 0 and cmp["comparable"] and cmp["verdict"] == "paid_off"
    rc, cmp = compare_json(str(DATA / "tuned.jsonl"), str(DATA / "near_oom.jsonl"))
    assert rc == 0 and cmp["comparable"]
    assert cmp["before"]["model_state_bytes"] == cmp["after"]["model_state_bytes"]


def test_missing_file_is_a_clear_error():
    got = gpuwatch("compare", str(DATA / "nope.jsonl"), str(DATA / "tuned.jsonl"))
    assert got.returncode == 2
    assert "nope.jsonl: no such file" in got.stderr


def test_phases_are_compared_where_reported(tmp_path):
    from test_html_report import _with_phases

    rec = tmp_path / "phased.jsonl"
    _with_phases(DATA / "input_bound.jsonl", rec)
    rc, cmp = compare_json(str(rec), str(DATA / "tuned.jsonl"))
    assert rc == 0
    phases = cmp["changes"]["phases"]
    assert set(phases["before"]) == {"startup", "train", "eval"}
    assert phases["after"] is None
    text = gpuwatch("compare", str(rec), str(DATA / "tuned.jsonl")).stdout
    assert "phases" in text and "eval 3.0 s -> ?" in text
    # none reported on either side: no phases line
    _, plain = compare_json(str(DATA / "input_bound.jsonl"), str(DATA / "tuned.jsonl"))
    assert plain["changes"]["phases"] is None


@pytest.mark.slow
def test_a_recording_against_the_live_daemon(gpuwatch_daemon):
    import time
    import urllib.request

    d = gpuwatch_daemon("--replay", str(DATA / "tuned.jsonl"),
                        "--web.listen-address", "127.0.0.1:0")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # the replay's start-up, then its first steps
        with urllib.request.urlopen(d.url + "/api/snapshot", timeout=5) as r:
            snap = json.loads(r.read())
        # a few seconds into its steps: the hook's rate is over its last report only
        if any(j.get("samples_per_second") and j["steps_total"] >= 60 for j in snap["jobs"]):
            break
        time.sleep(0.5)
    rc, cmp = compare_json(str(DATA / "input_bound.jsonl"), d.url)
    assert rc == 0, cmp["reasons"]
    # a replaying daemon hands over its recording judged whole (a sampling one, its last
    # 30 s, which compare says in a note; there is no GPU job to sample on this machine)
    assert cmp["after"]["source"]["kind"] == "replay"
    assert cmp["after"]["source"]["url"] == d.url
    assert cmp["changes"]["samples_per_second"]["ratio"] > 3.0


def test_a_daemons_samples_per_second_speak_of_the_span_its_step_time_does():
    """A snapshot's samples/s is one report's, the last half second, and jumps from one to
    the next (210-270 on the demo); the step time the daemon's report judged is the run's.
    Samples per step come from the snapshot (the batch: steady), the rate from the judged
    step time, so two compares against the same daemon agree whatever the instant says."""
    from gpuwatch.advisor.compare import summarize

    report = {"source": {"kind": "live", "url": "http://x"}, "hook": {"steps": True},
              "jobs": [{"source": "hook", "pid": 7, "gpu": 0, "steps": 500,
                        "seconds": 50.0, "step_seconds": 0.1}],
              "gpus": [{"gpu": 0}], "advice": []}
    got = []
    for sps, now in ((320.0, 0.075), (240.0, 0.1), (200.0, 0.12)):  # 24 samples a step
        snap = {"jobs": [{"pid": 7, "alive": True, "samples_per_second": sps,
                          "step_seconds": now, "steps_total": 500}], "gpus": []}
        got.append(summarize(report, snapshot=snap)["samples_per_second"])
    assert got == [240.0, 240.0, 240.0]
    # a job the report has no step time for keeps the snapshot's own rate
    snap = {"jobs": [{"pid": 8, "alive": True, "samples_per_second": 99.0,
                      "step_seconds": 0.2, "steps_total": 5}], "gpus": []}
    assert summarize(report, snapshot=snap)["samples_per_second"] == 99.0
