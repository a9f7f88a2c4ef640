"""`gpuwatch advise --replay` on the real recordings, with and without the hook's lines.

A careful engineer's verdicts (tests/data/FORMAT.md): each misconfigured run gets its
advice and none of the other five of the six; the healthy run and the short idle hold get
none of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_advise_support import (
    DATA,
    EXPECTED,
    HOOK_ONLY,
    LATER,
    SCENARIOS,
    SIX,
    advise_json,
    ids,
    load,
    recording,
    run_cli,
    without_steps,
    write,
)


@pytest.mark.parametrize("name", SCENARIOS + LATER)
def test_recording_gets_what_a_careful_engineer_would_say(name):
    report = advise_json(recording(name))
    want = EXPECTED[name]
    assert ids(report) & SIX == ({want} if want else set())


@pytest.mark.parametrize("name", SCENARIOS + LATER)
def test_same_advice_without_the_hook(name, tmp_path: Path):
    path = write(tmp_path / f"{name}.jsonl", without_steps(load(name)))
    report = advise_json(path)
    want = EXPECTED[name]
    assert ids(report) & SIX == ({want} - HOOK_ONLY if want else set())
    assert report["hook"] == {"steps": False, "config": False, "phases": False, "problems": []}
    assert any("torch hook" in n for n in report["notes"])


def test_json_report_shape():
    report = advise_json(DATA / "input_bound.jsonl")
    assert report["format"] == "gpuwatch-advice/1"
    (gpu,) = report["gpus"]
    assert gpu["gpu"] == 0 and gpu["compute_capability"] == "9.0"
    assert gpu["supports"] == {"tensor_cores": True, "fp16": True, "bf16": True, "tf32": True,
                               "fp8": True}
    (a,) = report["advice"]
    assert a["severity"] in ("info", "warning", "critical")
    assert a["gpu"] == 0 and 0 <= a["confidence"] <= 1
    assert all(isinstance(v, (int, float)) for v in a["evidence"].values())
    assert a["message"] and a["action"] and a["expected_gain"] >= 1


def test_evidence_is_from_the_steady_state_not_start_up():
    a = advise_json(DATA / "input_bound.jsonl")["advice"][0]
    # 87 % of each step waits for data in the steady state (FORMAT.md)
    assert 0.8 <= a["evidence"]["data_wait_ratio"] <= 0.95
    assert a["evidence"]["job_workers"] == 0
    assert "num_workers=0 → " in a["action"] and "pin_memory=True" in a["action"]


def test_hook_makes_the_advice_concrete_and_surer(tmp_path: Path):
    with_hook = advise_json(DATA / "small_batch.jsonl")["advice"][0]
    no_hook = advise_json(write(tmp_path / "sb.jsonl", without_steps(load("small_batch"))))
    no_hook = no_hook["advice"][0]
    assert with_hook["confidence"] > no_hook["confidence"]
    assert "batch_size=2 → " in with_hook["action"] and "batch_size=" not in no_hook["action"]
    assert "square-root" in with_hook["action"]  # the learning-rate rule that goes with it
    assert no_hook["hook_would_add"] and with_hook["hook_would_add"] is None


def test_suggested_batch_comes_from_measured_memory_per_sample():
    a = advise_json(DATA / "small_batch.jsonl")["advice"][0]
    per_sample = a["evidence"]["act_mem_per_sample_bytes"]
    # peak allocated minus what stays between steps, over the batch of 2
    steps = [d for d in load("small_batch") if d["kind"] == "step"]
    last = steps[-1]
    assert per_sample == pytest.approx(
        (last["max_mem_allocated_bytes"] - last["mem_allocated_bytes"]) / 2, rel=0.01)


def test_text_report_opens_with_the_gpus_then_advice():
    proc = run_cli("advise", "--replay", str(DATA / "fp32.jsonl"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    first_gpu = next(i for i, line in enumerate(lines) if line.startswith("GPU 0"))
    first_advice = next(i for i, line in enumerate(lines) if "enable-mixed-precision" in line)
    assert first_gpu < first_advice
    assert "bf16 yes, TF32 yes, FP8 yes" in lines[first_gpu]
    assert "torch.bfloat16" in proc.stdout and "Expected gain" in proc.stdout


def test_markdown_report():
    proc = run_cli("advise", "--replay", str(DATA / "near_oom.jsonl"), "--format", "markdown")
    assert proc.returncode == 0
    assert proc.stdout.startswith("# gpuwatch advice")
    assert "`enable-gradient-checkpointing`" in proc.stdout and "| `mem_used_ratio` |" in proc.stdout


def test_no_advice_is_still_success():
    proc = run_cli("advise", "--replay", str(DATA / "tuned.jsonl"))
    assert proc.returncode == 0 and "No advice" in proc.stdout


def test_demo():
    proc = run_cli("advise", "--demo", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["advice"][0]["id"] == "raise-batch-size"


def test_bad_recording_exits_2(tmp_path: Path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind":"meta","format":"gpuwatch-trace/1"}\n{"t": "soon", "kind": "gpu"}\n')
    proc = run_cli("advise", "--replay", str(bad))
    assert proc.returncode == 2 and f"{bad}:2:" in proc.stderr
    proc = run_cli("advise", "--replay", str(tmp_path / "missing.jsonl"))
    assert proc.returncode == 2 and "missing.jsonl" in proc.stderr
