"""The micro-batch (samples per backward()) as the frame reads it from the hook's step and
config lines: each micro-batch one DataLoader batch under a framework that accumulates,
even in the steps its loaders' read-ahead shifts a batch into or out of; the step's
samples a call otherwise. Fed line by line to the frame itself."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwatch.advisor.frame import Frame


def micro_sizes(framework: str | None, loader: int, steps: list[tuple[int, int]]) -> list:
    """The newest micro_batch_size after each step of (samples, backward() calls), one step
    a second, the hook's config (framework, the DataLoader's batch_size) sent first."""
    f = Frame(1.0, ["micro_batch_size", "batch_room"], 60)
    config: dict[str, Any] = {"t": 0.5, "kind": "config", "pid": 7, "in_training": True,
                              "batch_size": loader}
    if framework:
        config["framework"] = framework
    f.feed(config)
    out = []
    for i, (samples, micro) in enumerate(steps):
        t = 1.0 + i
        f.feed({"t": t + 0.5, "kind": "step", "step": i, "step_seconds": 0.5,
                "batch_size": samples, "micro_batches": micro, "pid": 7})
        f.feed({"t": t + 1.01, "kind": "host", "cpu_util": 0.1})  # closes the bucket
        (subj,) = [s for s in f.subjects.values() if s.job.ever]
        ring = subj.job.rings["micro_batch_size"]
        out.append(ring.last(ring.end(), 1))
    return out


@pytest.mark.parametrize("framework", ["transformers", "accelerate", "lightning"])
def test_a_frameworks_micro_batch_is_its_loaders_batch_in_the_read_ahead_steps(framework):
    """The Trainer at micro-batch 8 with 2 accumulation steps, Accelerate's loader reading
    one batch ahead: the first step holds 3 batches, the last 1 (TRL's SFTTrainer on the
    CPU ended on "training takes 4 per backward pass"): 8 in every step."""
    assert micro_sizes(framework, 8, [(24, 2), (16, 2), (16, 2), (8, 2)]) == [8.0] * 4


def test_a_plain_loop_splitting_its_batch_is_the_steps_samples_a_call():
    """A loop of its own splitting each DataLoader batch of 32 into 2 chunks for its
    backward() calls: 16 samples a call, though 32 is one loader batch."""
    assert micro_sizes(None, 32, [(32, 2), (32, 2)]) == [16.0, 16.0]


def test_two_loaders_read_side_by_side_are_one_micro_batch():
    """Lightning's CombinedLoader: two batches of 128 for each backward() (micro-batches 1):
    256 a call, not one loader batch."""
    assert micro_sizes("lightning", 128, [(256, 1), (256, 1)]) == [256.0, 256.0]
