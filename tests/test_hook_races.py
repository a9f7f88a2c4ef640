"""The hook's reporting thread beside a training thread that runs autograd without the
GIL: a job stepping thousands of times a second, reported on every 2 ms, must end as it
would alone, every iteration counted.

Before, the reporter read ``param.grad`` (looking for sparse gradients) while autograd's
accumulation swapped it: the job died of a corrupted heap (SIGSEGV, or glibc's
``free(): corrupted unsorted chunks`` and SIGABRT) in every 3-s run of the ``sgd`` variant,
and once in about twenty runs of tests/scripts/fast_steps.py at the usual report rate
(CI saw it there)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, clean_env

from gpuwatch.samples import StepSample, StepsSample
from gpuwatch.trace.format import read_trace

SCRIPT = str(REPO / "tests" / "scripts" / "hook_race.py")


def _config(rec: Path) -> dict:
    configs = [json.loads(x) for x in rec.read_text().splitlines() if '"config"' in x]
    configs = [c for c in configs if c.get("kind") == "config"]
    assert configs, "the hook sent no settings"
    return configs[-1]


@pytest.mark.parametrize("variant", ["sgd", "scaler", "sparse", "nostep"])
def test_a_job_reported_on_every_2_ms_ends_as_it_would_alone(tmp_path: Path,
                                                             variant: str) -> None:
    rec, truth = tmp_path / "rec.jsonl", tmp_path / "truth.json"
    run = subprocess.run([sys.executable, "-m", "gpuwatch", "run", "--web.listen-address",
                          "127.0.0.1:0", "--quiet", "--record", str(rec), "--",
                          sys.executable, SCRIPT, "--variant", variant, "--seconds", "3",
                          "--out", str(truth)],
                         check=False, env=clean_env(PYTHONFAULTHANDLER="1"), cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-4000:]
    steps = json.loads(truth.read_text())["steps"]
    trace = read_trace(str(rec))
    counted = sum(1 for s in trace.samples if isinstance(s, StepSample)) + \
        sum(s.steps for s in trace.samples if isinstance(s, StepsSample))
    print(f"{variant}: {steps} iterations, {counted} counted")
    assert steps > 50, "the job stepped too slowly to test anything"
    assert counted == steps
    cfg = _config(rec)
    # what the reporter no longer reads itself is still told
    assert cfg.get("sparse_grads") is {"sgd": False, "scaler": False, "sparse": True,
                                       "nostep": None}[variant]
    if variant == "scaler":
        assert cfg["grad_scaler"] is True and cfg["channels_last"] is False
