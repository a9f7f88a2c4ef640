"""What the hook tells the daemon besides steps, for a real loop on the CPU
(tests/scripts/phases_loop.py, under ``gpuwatch run --record``), against the loop's own
clock: its phases (evaluation, checkpoints, compiling), its micro-batches, and what it
could not read or do (a fact that fails, the hook switching itself off), each said once,
with the steps still measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
LOOP = str(REPO / "tests" / "scripts" / "phases_loop.py")
RUN = [sys.executable, "-m", "gpuwatch", "run", "--web.listen-address", "127.0.0.1:0",
       "--quiet"]


def run_loop(tmp_path: Path, *args: str) -> tuple[list[dict], dict]:
    rec, truth = tmp_path / "rec.jsonl", tmp_path / "truth.json"
    run = subprocess.run([*RUN, "--record", str(rec), "--", sys.executable, LOOP, *args,
                          "--out", str(truth)], check=False, env=clean_env(), cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(x) for x in rec.read_text().splitlines() if x.strip()]
    return lines, json.loads(truth.read_text())


def kind(lines: list[dict], k: str) -> list[dict]:
    return [d for d in lines if d.get("kind") == k]


def test_evaluation_checkpoints_and_micro_batches_by_the_loops_own_clock(tmp_path):
    lines, truth = run_loop(tmp_path, "--save")
    steps = kind(lines, "step") + kind(lines, "steps")
    assert sum(s.get("steps", 1) for s in steps) == truth["steps"] == 30
    assert {s["micro_batches"] for s in kind(lines, "step")} == {3}
    last = kind(lines, "phase")[-1]
    got = last["seconds"]
    print(f"hook {got}; loop: eval {truth['eval_seconds']:.3f} s, "
          f"save {truth['save_seconds']:.3f} s")
    assert got["eval"] == pytest.approx(truth["eval_seconds"], rel=0.1, abs=0.05)
    assert got["checkpoint"] == pytest.approx(truth["save_seconds"], rel=0.1, abs=0.05)
    # the frozen BatchNorm's eval() in every step is no evaluation: exactly the two
    # evaluations' batches, 30 each, are counted
    assert last["eval_batches"] == truth["evals"] * 30 and last["eval_batch_size"] == 4
    # a step never holds an evaluation or a checkpoint
    assert max(s["step_seconds"] for s in kind(lines, "step") if s.get("step_seconds")) < \
        truth["eval_seconds"] / truth["evals"]
    assert not kind(lines, "hook_problem")


def test_compiling_is_its_own_phase(tmp_path):
    lines, truth = run_loop(tmp_path, "--compile", "--steps", "12")
    last = kind(lines, "phase")[-1]
    assert last["compiles"] >= 1 and last["seconds"].get("compile", 0) > 0
    steps = kind(lines, "step") + kind(lines, "steps")
    assert sum(s.get("steps", 1) for s in steps) == 12


def test_a_fact_that_fails_is_said_once_and_the_steps_go_on(tmp_path):
    lines, truth = run_loop(tmp_path, "--fail-fact")
    problems = kind(lines, "hook_problem")
    assert [p["what"] for p in problems] == ["config.tf32"]
    assert "legacy and new APIs" in problems[0]["error"]
    steps = kind(lines, "step") + kind(lines, "steps")
    assert sum(s.get("steps", 1) for s in steps) == 30  # not one report dropped
    configs = kind(lines, "config")
    assert configs and all("tf32" not in c for c in configs)
    assert all("cudnn_tf32" in c for c in configs)  # only that fact is lost
    report = json.loads(subprocess.run(
        [sys.executable, "-m", "gpuwatch", "advise", "--replay", str(tmp_path / "rec.jsonl"),
         "--format", "json"], check=True, capture_output=True, text=True, cwd=REPO).stdout)
    assert any("could not read everything: config.tf32" in n for n in report["notes"])


def test_a_hook_that_switches_itself_off_says_so(tmp_path):
    lines, _ = run_loop(tmp_path, "--break-hook")
    whats = [p["what"] for p in kind(lines, "hook_problem")]
    # where it failed: the hook's innermost frame of the error (here, where it ends an
    # iteration), once per place; then that it stopped
    assert whats[-1] == "hook.off" and "hook._on_optimizer_step" in whats
    assert kind(lines, "phase")[-1]["hook_state"] == "off"
    off = next(p for p in kind(lines, "hook_problem") if p["what"] == "hook.off")
    assert "stopped measuring after 5 errors" in off["error"]
    text = subprocess.run([sys.executable, "-m", "gpuwatch", "advise", "--replay",
                           str(tmp_path / "rec.jsonl")], check=True, capture_output=True,
                          text=True, cwd=REPO).stdout
    assert "stopped: stopped measuring after 5 errors" in text
