"""A job's end in the recording (`job_end` lines) and in `gpuwatch advise --replay`'s report.

Real torch on the CPU: train_cpu.py dies of a real allocator failure under
``gpuwatch run --record``; the report must say that it died, of what, when and after how
many steps, in text, Markdown and JSON (``job_ends``), and the daemon's live /api/advice
lists the same ``job_ends``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import DaemonProcess, clean_env, http_get, wait_for

from gpuwatch.errors import FileFormatError
from gpuwatch.samples import JobEnd
from gpuwatch.trace import format as trace

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "tests" / "scripts" / "train_cpu.py")
GW = [sys.executable, "-m", "gpuwatch"]


def advise(rec: Path, fmt: str) -> str:
    run = subprocess.run([*GW, "advise", "--replay", str(rec), "--format", fmt], check=True,
                         env=clean_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    return run.stdout


def test_an_oom_is_recorded_and_reported(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    rec = tmp_path / "rec.jsonl"
    run = subprocess.run([*GW, "run", "--web.listen-address", "127.0.0.1:0", "--quiet",
                          "--record", str(rec), "--", sys.executable, TRAIN, "--steps", "50",
                          "--workers", "1", "--step-ms", "50", "--crash", "oom",
                          "--crash-at", "8"],
                         check=False, env=clean_env(), cwd=REPO, capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 1, run.stderr
    lines = [json.loads(x) for x in rec.read_text().splitlines()]
    [end] = [x for x in lines if x["kind"] == "job_end"]
    steps = [x for x in lines if x["kind"] == "step"]
    assert end["pid"] == steps[0]["pid"] and end["exit_reason"] == "oom"
    assert end["steps_total"] == 8 == len(steps)
    assert "can't allocate memory" in end["error"]
    assert end["first_step_t"] == pytest.approx(steps[0]["t"], abs=1e-3)
    assert end["t"] >= steps[-1]["t"]

    report = json.loads(advise(rec, "json"))
    [got] = report["job_ends"]
    assert (got["pid"], got["exit_reason"], got["steps_total"]) == (end["pid"], "oom", 8)
    assert got["summary"].startswith(f"job pid {end['pid']} died of out of memory (")
    assert "s after its first step, after 8 steps" in got["summary"]
    text = advise(rec, "text")
    assert f"Ended: job pid {end['pid']} died of out of memory" in text
    markdown = advise(rec, "markdown")
    assert "## Job ends" in markdown and f"- job pid {end['pid']} died of" in markdown


def test_job_end_lines_round_trip_and_are_checked(tmp_path: Path) -> None:
    end = JobEnd(t=1000.0, pid=42, exit_reason="oom", rank=1, gpu=3,
                 error="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                 steps_total=512, first_step_t=939.0, last_report_t=999.5,
                 mem_allocated_bytes=80 * 2**30, max_mem_allocated_bytes=81 * 2**30)
    path = tmp_path / "t.jsonl"
    with trace.TraceWriter(str(path), {"kind": "meta", "format": "gpuwatch-trace/1"}) as w:
        w.write(end)
    assert trace.read_trace(str(path)).samples == [end]
    report = json.loads(advise(path, "json"))
    assert report["job_ends"][0]["summary"] == (
        "job pid 42 (rank 1, GPU 3) died of CUDA out of memory (torch.OutOfMemoryError: CUDA "
        "out of memory. Tried to allocate 2.00 GiB) at 00:16:40 UTC, 61 s after its first "
        "step, after 512 steps; allocator 80.0 GiB in use (peak 81.0 GiB)")

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind":"meta","format":"gpuwatch-trace/1"}\n'
                   '{"t":1,"kind":"job_end","pid":42}\n'
                   '{"t":2,"kind":"job_end","pid":42,"exit_reason":"oom","steps_total":-1}\n')
    with pytest.raises(FileFormatError) as err:
        trace.read_trace(str(bad))
    assert "bad.jsonl:2: missing field 'exit_reason'" in str(err.value)
    assert "bad.jsonl:3: field 'steps_total' must be a whole number >= 0" in str(err.value)


def test_the_live_api_advice_lists_job_ends_as_the_replay_does(
        gpuwatch_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    """A job attached to a running daemon dies of an allocator failure: the daemon's
    /api/advice gets the same top-level `job_ends` as `advise --replay` of its recording."""
    pytest.importorskip("torch")
    rec, truth = tmp_path / "rec.jsonl", tmp_path / "truth.jsonl"
    d = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0", "--interval", "0.5",
                        "--record", str(rec))
    sock = re.search(r"hook socket (\S+)", d.stderr())
    assert sock, d.stderr()
    run = subprocess.run([sys.executable, TRAIN, "--steps", "50", "--workers", "0",
                          "--step-ms", "20", "--crash", "oom", "--crash-at", "8", "--attach",
                          "--out", str(truth)],
                         check=False, env=clean_env(GPUWATCH_SOCKET=sock.group(1)), cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr
    pid = json.loads(truth.read_text().splitlines()[0])["pid"]

    def ends() -> list[dict] | None:
        status, _, body = http_get(d.url + "/api/advice")
        return json.loads(body).get("job_ends") if status == 200 else None

    [live] = wait_for(ends, "job_ends in /api/advice", 60, d.proc)
    assert (live["pid"], live["exit_reason"], live["steps_total"]) == (pid, "oom", 8)
    assert "can't allocate memory" in live["error"]
    assert live["summary"].startswith(f"job pid {pid} died of out of memory (")
    assert d.stop() == 0
    assert json.loads(advise(rec, "json"))["job_ends"] == [live]
