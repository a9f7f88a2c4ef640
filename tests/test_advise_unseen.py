"""Runs nobody recorded here, built from the real recordings: the daemon's 1 s sampling, an
80 GB card, a GPU without GPM counters, a GPU shared with another process's memory, and an
input pipeline that waits on storage rather than on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_advise_support import (
    EXPECTED,
    HOOK_ONLY,
    LATER,
    ROOT,
    SCENARIOS,
    SIX,
    advise_json,
    decimated,
    ids,
    io_bound,
    load,
    on_card,
    with_other_process,
    without_gpm,
    without_steps,
    write,
)

GIB = 2**30
# without GPM the precision advice needs the hook's settings (absent from these recordings)
PRECISION = {"fp32", "h200_fp32_b16"}


def judge(tmp_path: Path, lines: list) -> dict:
    return advise_json(write(tmp_path / "unseen.jsonl", lines))


def expect(name: str, hook: bool = True, gpm: bool = True) -> set[str]:
    want = {EXPECTED[name]} if EXPECTED[name] else set()
    if not hook:
        want -= HOOK_ONLY
    if not gpm and name in PRECISION:
        want -= {"enable-mixed-precision"}
    return want


@pytest.mark.parametrize("name", SCENARIOS + LATER)
@pytest.mark.parametrize("hook", [True, False])
def test_one_hertz_sampling_on_an_80gb_card(tmp_path, name, hook):
    """The daemon's default 1 s sampling, the job on an H100 80GB."""
    lines = on_card(decimated(load(name)))
    lines = lines if hook else without_steps(lines)
    assert ids(judge(tmp_path, lines)) & SIX == expect(name, hook)


@pytest.mark.parametrize("name", SCENARIOS + LATER)
def test_one_hertz_without_gpm_or_hook(tmp_path, name):
    """An A100, L4 or T4 (no GPM) watched by the daemon alone: NVML and psutil at 1 Hz."""
    report = judge(tmp_path, decimated(without_gpm(without_steps(load(name)))))
    assert ids(report) & SIX == expect(name, hook=False, gpm=False)


@pytest.mark.parametrize("name", ["tuned", "h200_tuned_b128", "h200_tf32"])
@pytest.mark.parametrize("share", [0.15, 0.6])
def test_data_loading_that_waits_on_storage(tmp_path, name, share):
    """Steps wait for data while the workers sleep in I/O: more workers (more reads in
    flight) and faster storage, never a larger batch."""
    lines = io_bound(load(name), share)
    report = judge(tmp_path, lines)
    assert ids(report) & SIX == {"add-dataloader-workers"}
    (a,) = [a for a in report["advice"] if a["id"] == "add-dataloader-workers"]
    assert a["evidence"]["data_wait_ratio"] == pytest.approx(share, abs=0.02)
    assert "I/O" in a["message"] and "NVMe" in a["action"]
    assert a["confidence"] < 0.9  # storage may be the limit; more workers may not close it
    # without the hook, an idle GPU with idle workers and an idle main process is no sign
    # of a small batch: a small-batch loop keeps its main process busy launching kernels
    for no_hook in (without_steps(lines), decimated(without_gpm(without_steps(lines)))):
        assert "raise-batch-size" not in ids(judge(tmp_path, no_hook))


@pytest.mark.parametrize("name", ["small_batch", "h200_small_model_batch4"])
def test_small_batch_beside_another_process(tmp_path, name):
    """Another process holds most of the device: the job still has tens of GiB to grow
    into, and the suggested batch fits in what is actually free."""
    lines = with_other_process(load(name), 90 * GIB)
    report = judge(tmp_path, lines)
    assert ids(report) & SIX == {"raise-batch-size"}
    a = report["advice"][0]
    bs = a["evidence"]["batch_size"]
    suggested = int(a["action"].split(f"batch_size={bs:.0f} → ")[1].split(")")[0])
    free = 0.85 * 150_754_820_096 - max(
        d["mem_used_bytes"] for d in lines if d["kind"] == "gpu" and "mem_used_bytes" in d)
    assert bs < suggested and (suggested - bs) * a["evidence"]["act_mem_per_sample_bytes"] <= free


def test_healthy_runs_beside_another_process_get_nothing(tmp_path):
    for name in ("tuned", "h200_tuned_b128"):
        lines = with_other_process(load(name), 60 * GIB)
        assert ids(judge(tmp_path, lines)) & SIX == set()
        assert ids(judge(tmp_path, without_steps(lines))) & SIX == set()


def test_a_checkout_judges_with_its_own_rules():
    """Run from a checkout, the built-in rules are that checkout's rules/, not those of some
    other copy of gpuwatch installed in editable mode."""
    from gpuwatch.advisor.rules import builtin_rule_files

    got = dict(builtin_rule_files())
    for path in sorted((ROOT / "rules").glob("*.yaml")):
        assert got[f"rules/{path.name}"] == path.read_text(encoding="utf-8")
