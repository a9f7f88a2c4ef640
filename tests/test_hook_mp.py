"""Ranks started by multiprocessing send their exit report, and say what they died of.

Real torch on the CPU under ``gpuwatch run --record`` (tests/scripts/train_mp.py, two
ranks; the parent only starts them). fork and forkserver children leave by ``os._exit``
(no ``atexit``); multiprocessing's ``_bootstrap`` and ``torch.multiprocessing.spawn``'s
``_wrap`` catch a rank's exception (no ``sys.excepthook``). Ground truth: each rank's own
step lines (60 ms steps: under the recording's 20 step lines a second); the crashing rank raises torch's CUDA out-of-memory error before its step 5.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
MP = str(REPO / "tests" / "scripts" / "train_mp.py")
RUN = [sys.executable, "-m", "gpuwatch", "run", "--web.listen-address", "127.0.0.1:0",
       "--quiet"]
OOM = "OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB"


def run_ranks(tmp_path: Path, *args: str, ok: bool) -> tuple[dict[int, list[dict]],
                                                            dict[int, dict],
                                                            dict[int, list[dict]]]:
    """(recorded steps by pid, job_end lines by pid, the ranks' own steps by pid)

    (forkserver's clean exits are proven by the healthy rank of the OOM test below.)"""
    rec, truth = tmp_path / "rec.jsonl", tmp_path / "truth"
    run = subprocess.run([*RUN, "--record", str(rec), "--", sys.executable, MP, "--ranks", "2",
                          "--steps", "30", "--step-ms", "60", "--out", str(truth), *args],
                         check=False, env=clean_env(), cwd=REPO, capture_output=True, text=True,
                         timeout=180)
    assert (run.returncode == 0) == ok, run.stdout + run.stderr
    lines = [json.loads(x) for x in rec.read_text().splitlines() if x.strip()]
    steps: dict[int, list[dict]] = {}
    for x in lines:
        if x["kind"] == "step":
            steps.setdefault(x["pid"], []).append(x)
    ends = {x["pid"]: x for x in lines if x["kind"] == "job_end"}
    assert len(ends) == sum(x["kind"] == "job_end" for x in lines)  # one end per process
    own: dict[int, list[dict]] = {}
    for rank in (0, 1):
        # a rank torch.multiprocessing.spawn terminated (a peer failed) before it opened
        # its file has written nothing (seen on a loaded 2-core machine)
        path = Path(f"{truth}.{rank}")
        mine = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        own[mine[0]["pid"] if mine else -rank - 1] = mine
    # the ranks' own exit codes, for a failure's message
    print(run.stdout[-2000:], run.stderr[-4000:])
    return steps, ends, own


def test_forked_ranks_send_their_exit_report(tmp_path: Path) -> None:
    steps, ends, own = run_ranks(tmp_path, "--start-method", "fork", ok=True)
    assert set(steps) == set(ends) == set(own)  # the parent never reports
    for pid, truth in own.items():
        assert [s["step"] for s in steps[pid]] == [s["step"] for s in truth] == list(range(30))
        assert (ends[pid]["exit_reason"], ends[pid]["steps_total"]) == ("exited", 30)


def test_an_oom_in_a_forkserver_process_target_is_reported(tmp_path: Path) -> None:
    steps, ends, own = run_ranks(tmp_path, "--start-method", "forkserver", "--crash", "oom",
                                 "--crash-rank", "1", ok=False)
    check_one_oom(steps, ends, own)


def check_one_oom(steps: dict[int, list[dict]], ends: dict[int, dict],
                  own: dict[int, list[dict]]) -> None:
    """The OOM rank: its 5 steps and `oom` with the error text. The healthy rank: every
    step it made; but torch.multiprocessing.spawn terminates the other ranks once one
    failed: then it ends without an exit report, so `vanished`, never `oom`)."""
    [oom] = [pid for pid, truth in own.items() if len(truth) == 5]
    assert len(steps[oom]) == 5 == ends[oom]["steps_total"]
    assert ends[oom]["exit_reason"] == "oom" and ends[oom]["error"].startswith(OOM)
    [ok] = [pid for pid in own if pid != oom]
    if len(own[ok]) == 30:
        assert len(steps[ok]) == 30
        assert ends[ok]["exit_reason"] == "exited" and "error" not in ends[ok]
    else:  # terminated: what it had reported (none, if it died before its first report).
        # The hook counts a step at its optimizer step; the rank writes its own line 60 ms
        # later, after its sleep: a SIGTERM in between leaves the hook one step ahead (seen
        # on CI: 22 reported, 21 written)
        got = [s["step"] for s in steps.get(ok, [])]
        mine = [s["step"] for s in own[ok]]
        assert got == list(range(len(got))) and len(got) <= len(mine) + 1
        assert got[:len(mine)] == mine[:len(got)]
        assert ends.get(ok, {"exit_reason": "vanished"})["exit_reason"] == "vanished"


def test_an_oom_in_a_torch_multiprocessing_spawn_rank_is_reported(tmp_path: Path) -> None:
    steps, ends, own = run_ranks(tmp_path, "--launch", "spawn", "--start-method", "spawn",
                                 "--crash", "oom", "--crash-rank", "0", ok=False)
    check_one_oom(steps, ends, own)
