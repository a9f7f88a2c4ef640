"""What the hook reports about a real training job, compared with the job's own measurements.

Every test runs ``python3 -m gpuwatch run ... -- python3 tests/scripts/train_cpu.py`` (real
torch on the CPU, a real DataLoader with worker processes, a real GradScaler) and reads
what gpuwatch received: from ``--record`` (the per-step lines), or from a receiver that
plays the host's system daemon (``GPUWATCH_SYSTEM_SOCKET``) for the per-job stats. The
script writes its own ground truth (``--out``), as the shared workload does.

Tolerances: iterations and skipped steps must match exactly. Times are measured by two
clocks around slightly different spans (the hook's iteration runs from one iteration's end
to the next; the script's from just before ``next()`` to just after ``update()``), so sums
of step time and of data wait must agree within 10 % (plus 20 ms of slack for the first
iteration, which the script and the hook start a few microseconds apart).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import clean_env, wait_for

from gpuwatch.job.receiver import HookReceiver
from gpuwatch.store import Store

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "tests" / "scripts" / "train_cpu.py")
RUN = [sys.executable, "-m", "gpuwatch", "run"]




class SystemDaemon:
    """A receiver standing in for the host's gpuwatch service, as the launcher finds it."""

    def __init__(self, path: str) -> None:
        self.store = Store()
        self.receiver = HookReceiver(self.store, path, vanish_after=1.0)
        self.receiver.start()
        self.env = clean_env(GPUWATCH_SYSTEM_SOCKET=path)

    def jobs(self) -> dict[int, object]:
        self.receiver.flush()
        return {j.pid: j for j in self.store.latest().jobs}


@pytest.fixture
def system() -> Iterator[SystemDaemon]:
    d = Path(f"/tmp/gwt-{os.getpid()}-{time.monotonic_ns()}")
    d.mkdir()
    daemon = SystemDaemon(str(d / "hook.sock"))
    yield daemon
    daemon.receiver.stop()
    d.rmdir()


def read_lines(path: Path, kind: str) -> list[dict]:
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [x for x in lines if x.get("kind") == kind]


@pytest.mark.parametrize("scaler", ["plain", "fused"])
def test_recorded_steps_match_the_jobs_own_measurements(tmp_path: Path, scaler: str) -> None:
    """plain: SGD, a skipped step never calls optimizer.step(); fused: Adam(fused=True)
    steps anyway and skips inside its kernel, by the scaler's found_inf flag."""
    truth, rec = tmp_path / "truth.jsonl", tmp_path / "rec.jsonl"
    run = subprocess.run([*RUN, "--web.listen-address", "127.0.0.1:0", "--quiet", "--record",
                          str(rec), "--", sys.executable, TRAIN, "--steps", "40",
                          "--workers", "2", "--scaler", scaler, "--inf-every", "5",
                          "--cpu-ms", "1", "--step-ms", "60", "--out", str(truth)],
                         check=False, env=clean_env(), cwd=REPO, capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stderr
    # under 20 steps a second (the recorder's per-step limit): every step has its line
    expected = read_lines(truth, "step")
    got = read_lines(rec, "step")
    print(f"{scaler}: {len(got)} steps received, {sum(bool(s.get('skipped')) for s in got)} "
          f"skipped; the job counted {len(expected)} and "
          f"{sum(s['skipped'] for s in expected)}")
    assert [s["step"] for s in got] == [s["step"] for s in expected] == list(range(40))
    assert [bool(s.get("skipped")) for s in got] == [s["skipped"] for s in expected]
    assert sum(s["skipped"] for s in expected) == 8
    # DataLoader workers (2 processes) never report: one pid, the script's own
    assert {s["pid"] for s in got} == {s["pid"] for s in expected}
    assert {s["batch_size"] for s in got} == {8}
    for key in ("step_seconds", "data_wait_seconds"):
        mine = sum(s[key] for s in got if s.get(key) is not None)
        theirs = sum(s[key] for s in expected)
        print(f"  {key}: hook {mine:.4f} s, job {theirs:.4f} s")
        assert mine == pytest.approx(theirs, rel=0.10, abs=0.02), key
    # the loss (unscaled: the tensor handed to scaler.scale()) on one step per report,
    # exactly the job's own loss of that step; a skipped step's infinite loss by name (the
    # job's own record has none for it)
    losses = {s["step"]: s["loss"] for s in got if "loss" in s}
    print(f"  losses read: {losses}")
    assert losses and all(v == (expected[k]["loss"] if expected[k]["loss"] is not None
                                else "inf") for k, v in losses.items())
    # the loss scale rides on the last step of each report; the newest one is exact
    scales = [s["loss_scale"] for s in got if s.get("loss_scale") is not None]
    assert scales and scales[-1] == expected[-1]["loss_scale"]
    [config] = read_lines(rec, "config")[-1:]
    assert config["pid"] == expected[0]["pid"]
    assert {k: config[k] for k in ("num_workers", "persistent_workers", "batch_size",
                                   "grad_scaler", "fused_optimizer", "pin_memory")} == \
        {"num_workers": 2, "persistent_workers": True, "batch_size": 8, "grad_scaler": True,
         "fused_optimizer": scaler == "fused", "pin_memory": False}


def test_config_facts_autocast_and_checkpointing(tmp_path: Path) -> None:
    rec = tmp_path / "rec.jsonl"
    run = subprocess.run([*RUN, "--web.listen-address", "127.0.0.1:0", "--quiet", "--record",
                          str(rec), "--", sys.executable, TRAIN, "--steps", "6", "--workers", "1",
                          "--autocast", "bf16", "--checkpoint"],
                         check=False, env=clean_env(), cwd=REPO, capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stderr
    config = read_lines(rec, "config")[-1]
    assert config["autocast"] is True and config["autocast_dtype"] == "bfloat16"
    assert config["gradient_checkpointing"] is True
    assert config["grad_scaler"] is False and config["optimizer"] == "SGD"
    assert config["device"] == "cpu" and config["tf32"] is False
    assert config["num_workers"] == 1 and config["prefetch_factor"] == 2
    assert config["param_dtype"] == "float32"


def test_a_model_cast_to_bf16_reports_its_parameters_dtype(tmp_path: Path) -> None:
    """model.to(torch.bfloat16) computes in bf16 with autocast off: the hook says both."""
    rec = tmp_path / "rec.jsonl"
    run = subprocess.run([*RUN, "--web.listen-address", "127.0.0.1:0", "--quiet", "--record",
                          str(rec), "--", sys.executable, TRAIN, "--steps", "6", "--workers", "0",
                          "--params", "bf16"],
                         check=False, env=clean_env(), cwd=REPO, capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stderr
    config = read_lines(rec, "config")[-1]
    assert config["autocast"] is False and config["param_dtype"] == "bfloat16"


def test_job_stats_reach_a_daemon_already_running(system: SystemDaemon, tmp_path: Path) -> None:
    truth = tmp_path / "truth.jsonl"
    run = subprocess.run([*RUN, "--quiet", "--", sys.executable, TRAIN, "--steps", "30",
                          "--workers", "2", "--scaler", "plain", "--inf-every", "3",
                          "--out", str(truth)],
                         check=False, env=system.env, cwd=REPO, capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stderr
    expected = read_lines(truth, "step")
    jobs = system.jobs()
    print(jobs)
    assert list(jobs) == [expected[0]["pid"]]  # the workers never appear as jobs
    job = jobs[expected[0]["pid"]]
    assert (job.steps_total, job.skipped_steps_total) == (30, 10)
    assert not job.alive and job.exit_reason == "exited"
    assert job.rank is None and job.gpu is None
    assert job.loss_scale == expected[-1]["loss_scale"]
    assert job.samples_per_second > 0 and 0 <= job.data_wait_ratio <= 1
    assert job.mem_allocated_bytes is None  # on the CPU the allocator counters don't exist


@pytest.mark.parametrize(("crash", "code", "reason"), [
    ("exception", 1, "exception"),
    ("exit3", 3, "exited"),
    ("oom", 1, "oom"),
    ("sigkill", -9, "vanished"),  # the launcher dies by its job's signal, as `timeout` does
    ("sigterm", -15, "vanished"),
])
def test_a_job_that_fails_is_reported_and_its_exit_code_passed_on(
        system: SystemDaemon, crash: str, code: int, reason: str) -> None:
    # slow steps, so that a job killed without warning has reported at least once before
    run = subprocess.run([*RUN, "--quiet", "--", sys.executable, TRAIN, "--steps", "100",
                          "--workers", "1", "--step-ms", "100", "--crash", crash,
                          "--crash-at", "8"],
                         check=False, env=system.env, cwd=REPO, capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == code, run.stderr
    job = wait_for(lambda: next((j for j in system.jobs().values() if not j.alive), None),
                   f"the job marked {reason}")
    print(crash, run.returncode, job)
    assert job.exit_reason == reason
    if reason == "vanished":
        assert 1 <= job.steps_total <= 8  # as of its last report
    else:
        assert job.steps_total == 8  # the exit report is sent before the process dies
    # the end, as the recorder gets it (a job_end line)
    [end] = system.store.job_ends()
    assert (end.pid, end.exit_reason, end.steps_total) == (job.pid, reason, job.steps_total)
    assert end.first_step_t is not None and end.first_step_t <= end.t
    if reason == "oom":
        assert "can't allocate memory" in end.error
    elif reason == "exception":
        assert end.error == "ValueError: the test job failed on purpose"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_rank_torchrun_job_reports_every_rank(system: SystemDaemon, tmp_path: Path) -> None:
    truth = tmp_path / "truth.jsonl"
    run = subprocess.run([*RUN, "--quiet", "--", sys.executable, "-m", "torch.distributed.run",
                          "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                          "--master-port", str(free_port()), TRAIN, "--dist",
                          "--steps", "20", "--workers", "1", "--out", str(truth)],
                         check=False, env=system.env, cwd=REPO, capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stderr
    pids = {rank: read_lines(Path(f"{truth}.{rank}"), "step")[0]["pid"] for rank in (0, 1)}
    jobs = system.jobs()
    print(jobs)
    # the ranks, and nothing else: not torchrun's agent, not the DataLoader workers
    assert sorted(jobs) == sorted(pids.values())
    for rank, pid in pids.items():
        assert jobs[pid].rank == rank
        assert jobs[pid].steps_total == 20
        assert not jobs[pid].alive and jobs[pid].exit_reason == "exited"


@pytest.mark.parametrize("unused", [False, True])
def test_ddp_reports_whether_its_search_found_unused_parameters(tmp_path: Path,
                                                                unused: bool) -> None:
    """DistributedDataParallel(find_unused_parameters=True) under torchrun (gloo): the
    hook reports the setting and what DDP's own statistics found unused, on every rank: a
    model that uses every parameter, nothing; one with a layer its forward pass never
    calls (Linear(4, 4): 20 float32 values), its 80 bytes."""
    rec = tmp_path / "rec.jsonl"
    run = subprocess.run([*RUN, "--quiet", "--web.listen-address", "127.0.0.1:0", "--record",
                          str(rec), "--", sys.executable, "-m", "torch.distributed.run",
                          "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                          "--master-port", str(free_port()), TRAIN, "--dist", "--steps", "30",
                          "--workers", "0", "--find-unused", *(["--unused"] if unused else [])],
                         check=False, env=clean_env(), cwd=REPO, capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stderr
    got = [json.loads(x) for x in rec.read_text().splitlines() if x.strip()]
    final = {d["rank"]: d for d in got if d.get("kind") == "config" and d.get("in_training")}
    assert sorted(final) == [0, 1]
    for c in final.values():
        assert c["ddp_find_unused"] is True and c["ddp_static_graph"] is False
        assert c["ddp_unused_bytes"] == (80 if unused else 0)
    assert not [d for d in got if d.get("kind") == "hook_problem"]
