"""Runs never seen: variants of the recordings that a different model, GPU, host or daemon
set-up would produce. The advice must follow the evidence, not the particular files."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_advise_support import (
    EXPECTED,
    HOOK_ONLY,
    LATER,
    SCENARIOS,
    SIX,
    advise_json,
    ids,
    load,
    multi_gpu,
    stretched,
    transform,
    with_meta,
    without_gpm,
    without_steps,
    write,
)

TRAINING = ["tuned", "small_batch", "input_bound", "near_oom", "fp32"]


def judge(tmp_path: Path, lines: list) -> dict:
    return advise_json(write(tmp_path / "variant.jsonl", lines))


def expect(name: str) -> set[str]:
    return {EXPECTED[name]} if EXPECTED[name] else set()


@pytest.mark.parametrize("k", [3, 10])
@pytest.mark.parametrize("name", SCENARIOS + LATER)
@pytest.mark.parametrize("hook", [True, False])
def test_slower_runs_get_the_same_advice(tmp_path, name, k, hook):
    """Every phase k times longer: slower steps, a longer start-up and warm-up."""
    lines = stretched(load(name), k)
    lines = lines if hook else without_steps(lines)
    assert ids(judge(tmp_path, lines)) & SIX == expect(name) - (set() if hook else HOOK_ONLY)


@pytest.mark.parametrize("name", ["tuned", "small_batch", "input_bound", "near_oom"])
def test_without_gpm_the_rest_still_holds(tmp_path, name):
    """An A100 or T4: NVML has no SM/tensor activity, only util."""
    for lines in (without_gpm(load(name)), without_gpm(without_steps(load(name)))):
        report = judge(tmp_path, lines)
        assert ids(report) & SIX == expect(name)
        assert report["gpus"][0]["gpm"] is False


def config_line(lines: list, **values) -> list:
    """The hook's config line, written just before the first step."""
    t = next((d["t"] for d in lines[1:] if d["kind"] == "step"), lines[1]["t"] + 0.5)
    body = lines[1:] + [{"kind": "config", "t": t - 0.5, **values}]
    return [lines[0]] + sorted(body, key=lambda d: d["t"])


def test_without_gpm_precision_needs_the_hooks_settings(tmp_path):
    no_gpm = without_gpm(load("fp32"))
    assert "enable-mixed-precision" not in ids(judge(tmp_path, no_gpm))
    fp32_config = config_line(no_gpm, num_workers=6, autocast_dtype=None, tf32=False)
    report = judge(tmp_path, fp32_config)
    (a,) = [a for a in report["advice"] if a["id"] == "enable-mixed-precision"]
    assert a["confidence"] < 0.8  # settings, not measured tensor activity
    # a bf16 job reported by the hook gets no precision advice
    bf16 = config_line(without_gpm(load("tuned")), autocast_dtype="bfloat16", tf32=False)
    assert ids(judge(tmp_path, bf16)) & SIX == set()


def test_hook_confirms_precision_advice_and_autocast_suppresses_it(tmp_path):
    confirmed = judge(tmp_path, config_line(load("fp32"), autocast_dtype=None, tf32=False))
    plain = judge(tmp_path, load("fp32"))
    assert confirmed["advice"][0]["confidence"] > plain["advice"][0]["confidence"]
    # autocast on yet tensor cores idle: some other cause; not this advice
    on = judge(tmp_path, config_line(load("fp32"), autocast_dtype="bfloat16", tf32=False))
    assert "enable-mixed-precision" not in ids(on)


@pytest.mark.parametrize("cc,want,refuse", [
    ([7, 5], ["float16", "GradScaler", "no bf16 or TF32"], ["bfloat16"]),
    ([7, 0], ["float16", "GradScaler"], ["bfloat16"]),
    ([8, 0], ["bfloat16", "allow_tf32"], ["FP8"]),
    ([8, 9], ["bfloat16", "FP8"], []),
])
def test_precision_advice_follows_compute_capability(tmp_path, cc, want, refuse):
    report = judge(tmp_path, with_meta(load("fp32"), compute_capability=cc))
    (a,) = [a for a in report["advice"] if a["id"] == "enable-mixed-precision"]
    for w in want:
        assert w in a["action"]
    for r in refuse:
        assert r not in a["action"]
    gpu = report["gpus"][0]
    assert gpu["supports"]["bf16"] == (cc >= [8, 0])
    assert gpu["supports"]["fp8"] == (cc >= [8, 9])


def test_no_tensor_cores_no_precision_advice(tmp_path):
    report = judge(tmp_path, with_meta(load("fp32"), compute_capability=[6, 1]))
    assert ids(report) & SIX == set()


@pytest.mark.parametrize("name", TRAINING)
@pytest.mark.parametrize("ddp", [False, True])
def test_multi_gpu_jobs_get_the_advice_on_every_gpu(tmp_path, name, ddp):
    for lines in (multi_gpu(load(name), 4, ddp), multi_gpu(without_steps(load(name)), 4, ddp)):
        report = judge(tmp_path, lines)
        assert [g["gpu"] for g in report["gpus"]] == [0, 1, 2, 3]
        for gpu in range(4):
            assert ids(report, gpu) & SIX == expect(name)


def test_advice_stays_on_the_gpu_whose_evidence_it_is(tmp_path):
    """GPU 1 nearly full, GPU 0 healthy, one host."""
    tuned = load("tuned")
    oom = [d for d in load("near_oom")[1:] if d["kind"] == "gpu"]
    shift = tuned[1]["t"] - oom[0]["t"]
    extra = [dict(d, t=d["t"] + shift, gpu=1) for d in oom]
    lines = [tuned[0]] + sorted(without_steps(tuned)[1:] + extra, key=lambda d: d["t"])
    report = judge(tmp_path, lines)
    assert ids(report, 0) & SIX == set()
    assert ids(report, 1) & SIX == {"enable-gradient-checkpointing"}


def test_idle_for_minutes_is_gpu_idle_and_nothing_else(tmp_path):
    for lines in (stretched(load("idle"), 30), multi_gpu(stretched(load("idle"), 30), 2)):
        report = judge(tmp_path, lines)
        assert ids(report) & SIX == {"gpu-idle"}
        a = report["advice"][0]
        assert "GiB of GPU memory" in a["message"] and a["evidence"]["util_max"] <= 0.01


def test_a_short_idle_hold_is_not_advice(tmp_path):
    assert ids(judge(tmp_path, stretched(load("idle"), 10))) & SIX == set()  # ~6 min


def with_loss_scale(lines: list, scale_at) -> list:
    def edit(d):
        if d["kind"] == "step":
            d["loss_scale"] = scale_at(d["step"])
        return d
    return transform(lines, edit)


def test_collapsing_loss_scale(tmp_path):
    # fp16 with too high a learning rate: the scale halves every few steps, for good
    report = judge(tmp_path, with_loss_scale(load("tuned"), lambda s: 65536.0 / 2 ** (s // 8)))
    assert "loss-scale-collapse" in ids(report)
    a = next(a for a in report["advice"] if a["id"] == "loss-scale-collapse")
    assert a["severity"] == "critical" and "bfloat16" in a["action"]
    assert report["advice"][0]["id"] == "loss-scale-collapse"  # most valuable first
    # on a 7.x GPU the same evidence gets no bf16 advice
    old = judge(tmp_path, with_meta(with_loss_scale(load("tuned"),
                                                    lambda s: 65536.0 / 2 ** (s // 8)),
                                    compute_capability=[7, 0]))
    b = next(a for a in old["advice"] if a["id"] == "loss-scale-collapse")
    assert "bfloat16" not in b["action"] and "clip_grad_norm_" in b["action"]


def test_normal_loss_scale_calibration_is_not_a_collapse(tmp_path):
    # GradScaler's usual start: a few halvings in the first steps, then steady growth
    def scale(s):
        return 65536.0 / 2 ** min(s, 5) * (2 ** (s // 200))
    assert "loss-scale-collapse" not in ids(judge(tmp_path, with_loss_scale(load("tuned"),
                                                                            scale)))


@pytest.mark.parametrize("k", [3, 10])
def test_calibration_at_slow_steps_is_not_a_collapse(tmp_path, k):
    """TrainingArguments(fp16=True) on 4 H100s, its steps made k times slower: GradScaler
    skips its first two steps while the scale halves from 65536 to 16384, as at any speed.
    At 200 ms and more a step those two are over a tenth of the first 30 s; they are the
    calibration (skips before the first step it did not skip), not a collapse. Real
    collapses, slowed the same, still are."""
    got = ids(judge(tmp_path, stretched(load("fw_hf_fp16_ddp"), k)))
    assert "loss-scale-collapse" not in got and "use-bf16-not-fp16" in got
    # (h200_fp16_collapse's loss is NaN from its tenth step on: loss-not-finite is told
    # there instead, and the collapse gives way to it)
    for name, rule in (("gpu_fp16_overflow", "loss-scale-collapse"),
                       ("h200_fp16_collapse", "loss-not-finite")):
        assert rule in ids(judge(tmp_path, stretched(load(name), k))), name
    if k == 3:  # as recorded: skipping from the first step on is no calibration, and
        # after 8 skips they count (the message once read "0 % of recent steps skipped")
        (a,) = [a for a in judge(tmp_path, load("gpu_fp16_overflow"))["advice"]
                if a["id"] == "loss-scale-collapse"]
        assert a["evidence"]["skipped_ratio"] >= 0.3


def test_each_job_on_a_gpu_calibrates_its_own_scaler(tmp_path):
    """Two fp16 jobs one after the other on one GPU, each skipping its first three steps
    while GradScaler calibrates: neither's calibration counts as skipped steps."""
    from gpuwatch.advisor.engine import Engine
    from gpuwatch.advisor.rules import load_rules

    e = Engine(load_rules())
    t0 = 1_800_000_000.0
    for job, start in ((11, 0), (12, 60)):
        for i in range(50):
            t = t0 + start + i * 0.5
            e.feed({"kind": "gpu", "t": t, "gpu": 0, "util": 0.9, "sm_active": 0.7,
                    "mem_used_bytes": 20 << 30, "mem_total_bytes": 80 << 30,
                    "processes": [{"pid": job, "mem_used_bytes": 20 << 30}]})
            e.feed({"kind": "step", "t": t + 0.2, "pid": job, "gpu": 0, "step": i,
                    "step_seconds": 0.5, "data_wait_seconds": 0.0, "skipped": i < 3,
                    "loss_scale": 65536.0 / 2 ** min(i + 1, 3)})
    e.finish()
    assert not [f for f in e.findings if f.rule.id == "loss-scale-collapse"]
    # the frame's count: every step after each calibration, none skipped
    job = e.frame.subjects[0].job
    assert job.rings["skipped_ratio"].mean(e.frame.idx, 200) == 0.0


def test_memory_held_by_another_process_is_not_checkpointing_advice(tmp_path):
    def small_job(d):
        if d["kind"] == "step":
            d["mem_reserved_bytes"] = 8 * 2**30  # the job itself holds 8 GiB of 140
        return d
    assert "enable-gradient-checkpointing" not in ids(judge(
        tmp_path, transform(load("near_oom"), small_job)))
