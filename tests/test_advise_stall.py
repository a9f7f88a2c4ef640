"""A job whose steps stop while its hook still says it trains (training-stalled), fed to
the real engine with the built-in rules: what the GPU does meanwhile picks the words, and a
job that went on to evaluate, or whose hook fell silent, is not stalled."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from test_advise_support import one_gpu_second

from gpuwatch.advisor.engine import Engine
from gpuwatch.advisor.rules import load_rules

T0 = 1_800_000_000.0


def run(gap_util: float, gap_sm: float, gap_phase: str | None, gap: int = 120) -> Engine:
    """30 s of steps of 0.1 s, then ``gap`` s without a step, the hook's phase line every
    5 s saying ``gap_phase`` (None: no line: the hook fell silent)."""
    e = Engine(load_rules())
    for i in range(30 + gap):
        training = i < 30
        one_gpu_second(e, T0 + i, 0.9 if training else gap_util,
                       0.8 if training else gap_sm, 20, training)
        phase = "train" if training else gap_phase
        if phase is not None and i % 5 == 0:
            e.feed({"kind": "phase", "t": T0 + i + 0.5, "pid": 7, "gpu": 0, "phase": phase,
                    "seconds": {"train": float(min(i, 30)),
                                **({} if phase == "train" else {phase: float(i - 30)})}})
    e.finish()
    return e


def stalled(e: Engine) -> list:
    return [f for f in e.findings if f.rule.id == "training-stalled"]


def test_ranks_spinning_in_a_collective_are_a_hang():
    (f,) = stalled(run(1.0, 0.05, "train"))
    assert f.start - (T0 + 30) >= 60  # a minute (and 20 step times) after the last step
    assert "NCCL's do while a rank waits in a collective" in f.details["message"]
    assert "flight recorder" in f.details["action"]


def test_a_loop_waiting_with_its_gpu_idle_is_told_to_look_outside_it():
    (f,) = stalled(run(0.0, 0.0, "train"))
    assert "nothing running" in f.details["message"]
    assert "persistent_workers=True" in f.details["action"]
    assert "flight recorder" not in f.details["action"]


@pytest.mark.parametrize("phase", ["eval", "checkpoint", None])
def test_evaluating_saving_or_a_silent_hook_is_no_stall(phase):
    assert not stalled(run(1.0, 0.05, phase))


def test_a_short_pause_is_no_stall():
    assert not stalled(run(0.0, 0.0, "train", gap=45))


def test_a_stall_ends_once_the_hook_falls_silent():
    """Flagged while the hook said it trains; then the process is gone (no more phase
    lines): the stall ends, rather than reading back its last gap for minutes."""
    e = Engine(load_rules())
    for i in range(300):
        training, heard = i < 30, i < 150
        one_gpu_second(e, T0 + i, 0.9 if training else 1.0, 0.8 if training else 0.05, 20,
                       training, held=heard)
        if heard and i % 5 == 0:
            e.feed({"kind": "phase", "t": T0 + i + 0.5, "pid": 7, "gpu": 0, "phase": "train",
                    "seconds": {"train": float(i)}})
    e.finish()
    (f,) = stalled(e)
    assert f.start < T0 + 150 and not f.active and f.ended <= T0 + 150 + 30


def test_a_data_parallel_job_replaced_by_ddp_is_not_told_again():
    """A DataParallel job on GPUs 0-1, then the same training relaunched as two DDP ranks
    (new pids, their settings without data_parallel_gpus): the advice to move ends."""
    e = Engine(load_rules())
    for i in range(240):
        dp = i < 100
        for g in (0, 1):
            pid = 7 if dp else 8 + g
            e.feed({"kind": "gpu", "t": T0 + i, "gpu": g, "util": 0.6, "sm_active": 0.5,
                    "mem_used_bytes": 20 << 30, "mem_total_bytes": 80 << 30,
                    "processes": [{"pid": pid, "mem_used_bytes": 20 << 30}]})
            if g == 0 or not dp:
                e.feed({"kind": "steps", "t": T0 + i + 0.999, "begin_t": T0 + i, "pid": pid,
                        "gpu": g, "steps": 10, "timed": 10, "step_seconds": 0.999,
                        "data_wait_seconds": 0.0})
            if i % 10 == 0 and (g == 0 or not dp):
                e.feed({"kind": "config", "t": T0 + i + 0.5, "pid": pid, "gpu": g,
                        "in_training": True, "optimizer": "AdamW", "fused_optimizer": True,
                        **({"data_parallel_gpus": 2} if dp else {})})
    e.finish()
    got = [f for f in e.findings if f.rule.id == "use-ddp-not-dataparallel"]
    assert {f.gpu for f in got} == {0, 1}  # GPU 1 read the job of GPU 0's process
    assert all(not f.active and f.ended <= T0 + 140 for f in got)


@pytest.mark.parametrize("step", [8.0, 20.0, 40.0])
def test_slow_steps_keep_their_windows_and_their_whole_run(step):
    """Steps of 8-40 s: the time between two of them lies between steps, so no window of
    the run is cut short, and the whole run's time is the steps' own."""
    e = Engine(load_rules())
    nxt, none, windows = step, 0, 0
    for i in range(600):
        e.feed({"kind": "gpu", "t": T0 + i, "gpu": 0, "util": 0.9, "sm_active": 0.8,
                "mem_used_bytes": 20 << 30, "mem_total_bytes": 80 << 30,
                "processes": [{"pid": 7, "mem_used_bytes": 20 << 30}]})
        if i + 1 >= nxt:
            e.feed({"kind": "steps", "t": T0 + i + 0.999, "begin_t": T0 + i + 0.999 - step,
                    "pid": 7, "gpu": 0, "steps": 1, "timed": 1, "step_seconds": step,
                    "data_wait_seconds": 0.0})
            nxt += step
        if i % 5 == 0:
            e.feed({"kind": "phase", "t": T0 + i + 0.5, "pid": 7, "gpu": 0, "phase": "train",
                    "seconds": {"train": float(i)}})
        if i > 2 * step + 20:
            windows += 1
            none += e.frame.job_window(e.frame.subjects[0], e.frame.idx, 15) is None
    e.finish()
    assert none == 0, (none, windows)
    span = e.frame.subjects[0].span.total()
    assert span.wall >= 0.9 * span.step_total
    assert not stalled(e)


def _with_trees(mine: Callable[[int], int], other: Callable[[int], int]) -> Engine:
    """The idle stall of ``run`` with the host's process trees each second: this GPU's job
    (pid 7, ``mine(i)`` processes: its main and its DataLoader workers) and a CPU-only
    neighbour (pid 200, ``other(i)``)."""
    e = Engine(load_rules())
    for i in range(150):
        training = i < 30
        one_gpu_second(e, T0 + i, 0.9 if training else 0.0, 0.8 if training else 0.0, 20,
                       training)
        tree = {"name": "python3", "user": "u", "cpu_cores": 0.1, "main_cpu_cores": 0.1,
                "workers_cpu_cores": 0.0, "rss_bytes": 1 << 30}
        e.feed({"kind": "host", "t": T0 + i + 0.2, "cpu_util": 0.1, "load1": 1.0,
                "mem_used_bytes": 1 << 34, "mem_total_bytes": 1 << 37,
                "job_processes": mine(i) + other(i),
                "jobs": [dict(tree, pid=7, processes=mine(i), gpus=[0]),
                         dict(tree, pid=200, processes=other(i), gpus=[])]})
        if i % 5 == 0:
            e.feed({"kind": "phase", "t": T0 + i + 0.5, "pid": 7, "gpu": 0, "phase": "train",
                    "seconds": {"train": float(min(i, 30))}})
    e.finish()
    return e


def test_another_jobs_processes_coming_and_going_do_not_hide_a_stall():
    """A CPU-only job beside it whose workers start and stop every 10 s: this job's own
    tree holds still, so its stall is told as without the neighbour."""
    steady = stalled(_with_trees(lambda i: 5, lambda i: 5))
    cycling = stalled(_with_trees(lambda i: 5, lambda i: 5 if (i // 10) % 2 == 0 else 1))
    assert len(steady) == len(cycling) == 1
    assert cycling[0].start == steady[0].start and cycling[0].active


def test_a_job_whose_loader_workers_exit_one_by_one_is_ending_not_stalled():
    """Its own DataLoader workers joined one by one, 15 s each (a loop that left a loader
    with six workers running, slowed 3x), the GPU idle: no stall."""
    assert not stalled(_with_trees(lambda i: 7 - max(0, min(6, (i - 30) // 15)), lambda i: 5))
