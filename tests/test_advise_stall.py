"""A job whose steps stop while its hook still says it trains (training-stalled), fed to
the real engine with the built-in rules: what the GPU does meanwhile picks the words, and a
job that went on to evaluate, or whose hook fell silent, is not stalled."""

from __future__ import annotations

import pytest

from gpuwatch.advisor.engine import Engine
from gpuwatch.advisor.rules import load_rules

T0 = 1_800_000_000.0


def run(gap_util: float, gap_sm: float, gap_phase: str | None, gap: int = 120) -> Engine:
    """30 s of steps of 0.1 s, then ``gap`` s without a step, the hook's phase line every
    5 s saying ``gap_phase`` (None: no line: the hook fell silent)."""
    e = Engine(load_rules())
    for i in range(30 + gap):
        training = i < 30
        e.feed({"kind": "gpu", "t": T0 + i, "gpu": 0,
                "util": 0.9 if training else gap_util,
                "sm_active": 0.8 if training else gap_sm,
                "mem_used_bytes": 20 << 30, "mem_total_bytes": 80 << 30,
                "processes": [{"pid": 7, "mem_used_bytes": 20 << 30}]})
        if training:
            e.feed({"kind": "steps", "t": T0 + i + 0.999, "begin_t": T0 + i, "pid": 7,
                    "gpu": 0, "steps": 10, "timed": 10, "step_seconds": 0.999,
                    "data_wait_seconds": 0.0})
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
