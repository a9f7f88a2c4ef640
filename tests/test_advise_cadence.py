"""A daemon sampling less often than once a second (`gpuwatch run --interval 2`): its
recording, and its own live advisor, are judged in buckets no shorter than its interval,
so every bucket holds a reading and a rule's 15 s window holds 15 s."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from test_advise_live import play
from test_advise_support import advise_json, at_twice_the_interval, load, write

from gpuwatch.advisor import LiveAdvisor
from gpuwatch.advisor.engine import resolution_for
from gpuwatch.store import Store

HOOK_KINDS = ("step", "steps", "config", "phase", "hook_problem", "job_end")


def by_gpu(report: dict) -> set[tuple[str, int | None]]:
    return {(a["id"], a["gpu"]) for a in report["advice"]}


@pytest.mark.parametrize("sample_seconds,span,want", [
    (1.0, 100.0, 1.0), (0.5, 100.0, 1.0), (0.1, 100.0, 1.0), (None, 100.0, 1.0),
    (2.0, 100.0, 2.0), (1.5, 100.0, 2.0), (3.0, 100.0, 5.0), (120.0, 100.0, 60.0),
    (1.0, 200_000.0, 10.0), (2.0, 200_000.0, 10.0), (15.0, 200_000.0, 15.0),
])
def test_the_bucket_is_never_shorter_than_the_samplers_interval(sample_seconds, span, want):
    assert resolution_for(span, sample_seconds) == want


# Each one was told something else, or lost a finding, when its every other tick was
# dropped and the rest judged in 1-s buckets (half of them empty): slow-checkpointing's
# stretches of idle writing cut by the empty seconds (saves from outside, on one GPU and
# on rank 0 of four), the batch told during the hook's evaluations, the batch of three of
# the four ranks lost
@pytest.mark.parametrize("name,hook", [
    ("fw_hf_save", False), ("fw_lightning_cnn_ckpt", False), ("fw_hf_large_eval10", True),
    ("fw_lightning_cnn_epochs_ddp", False),
])
def test_a_recording_made_at_2s_is_told_what_the_same_run_at_1s_is(tmp_path, name, hook):
    lines = load(name)
    if not hook:
        lines = [d for d in lines if d.get("kind") not in HOOK_KINDS]
    whole = advise_json(write(tmp_path / "at1s.jsonl", lines))
    thin = advise_json(write(tmp_path / "at2s.jsonl", at_twice_the_interval(lines)))
    assert whole["source"]["resolution_seconds"] == 1.0
    assert thin["source"]["resolution_seconds"] == 2.0
    assert by_gpu(thin) == by_gpu(whole)
    assert by_gpu(whole)  # (each is told something at 1 s)


def test_the_live_advisor_of_a_daemon_at_2s_judges_in_2s_buckets(tmp_path):
    """`gpuwatch run --interval 2` beside a job saving with its GPU idle, no hook: the
    daemon's own advisor judges in 2-s buckets and says slow-checkpointing, as the replay
    of the same readings does (in 1-s buckets every other one held no reading, and the
    stretches of idle writing it counts were cut at each)."""
    lines = [d for d in load("fw_hf_save") if d.get("kind") not in HOOK_KINDS]
    path = write(tmp_path / "at2s.jsonl", at_twice_the_interval(lines))
    store = Store()
    advisor = LiveAdvisor(store, SimpleNamespace(interval=2.0, rules_dirs=()))
    assert advisor.res == 2.0 and advisor.engine.res == 2.0
    assert advisor._new_engine().res == 2.0  # (a replay's loop point keeps it)
    play(store, advisor, path, every=10)
    live = {(a["id"], a["gpu"]) for a in advisor.report_json()["advice"]}
    assert ("slow-checkpointing", 0) in live
    assert live == by_gpu(advise_json(path))
    # the daemon's default interval keeps 1-s buckets
    assert LiveAdvisor(Store(), SimpleNamespace(interval=1.0, rules_dirs=())).res == 1.0
    assert LiveAdvisor(Store(), None).res == 1.0
