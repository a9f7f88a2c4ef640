"""The engine: windows, durations, hysteresis, suppression, architecture gates, evidence."""

from __future__ import annotations

import textwrap

from gpuwatch.advisor.engine import Engine
from gpuwatch.advisor.rules import load_rules

T0 = 1_700_000_000.0


def engine(rules: str, **kw) -> Engine:
    rs = load_rules(builtin=False, files=[("test.yaml", textwrap.dedent(rules))])
    return Engine(rs, **kw)


def gpu(t: float, util: float, gpu_index: int = 0, **extra) -> dict:
    return {"kind": "gpu", "t": T0 + t, "gpu": gpu_index, "util": util,
            "mem_used_bytes": 1e9, "mem_total_bytes": 80e9, "processes": [{"pid": 1}], **extra}


def feed_util(e: Engine, values: list[float], hz: int = 1, **extra) -> None:
    for i, u in enumerate(values):
        e.feed(gpu(i / hz, u, **extra))
    e.finish()


LOW = """
rules:
  - id: low
    title: low
    severity: warning
    when: mean(util, 10s) < 0.5
    for: 5s
    keep: 8s
    evidence:
      u: mean(util, 10s)
    message: util {u:.2f}
    action: act
"""


def test_window_mean_and_duration():
    e = engine(LOW)
    feed_util(e, [0.2] * 30)
    (f,) = e.summary()
    # the first full window is the bucket ending at 10 s (it covers 9-10 s); from 9 s the
    # condition must hold 5 s more
    assert f.start - T0 == 14.0
    assert f.details["evidence"]["u"] == 0.2


def test_condition_shorter_than_its_duration_gives_no_advice():
    e = engine(LOW.replace("10s", "3s"))
    feed_util(e, [0.9] * 10 + [0.1] * 4 + [0.9] * 30)  # the 3 s mean is low for 4 s only
    assert e.summary() == []


def test_no_judgement_before_the_window_is_full():
    e = engine(LOW.replace("for: 5s", "for: 0s"))
    feed_util(e, [0.1] * 9)
    assert e.summary() == []
    e = engine(LOW.replace("for: 5s", "for: 0s"))
    feed_util(e, [0.1] * 12)
    assert len(e.summary()) == 1


def test_no_judgement_before_the_window_is_full_for_a_gpu_named_before_its_data():
    """A recording's meta line (and the fleet's gpu_info) names each GPU before any of its
    lines: the GPU's first bucket with data is still where its windows begin (they once
    began at bucket 0, so a window reaching back before the recording was judged whole on
    a few seconds)."""
    for seconds, told in ((9, 0), (12, 1)):
        e = engine(LOW.replace("for: 5s", "for: 0s"))
        e.frame.set_gpu_info(0, name="NVIDIA H100 80GB HBM3", cc="9.0")
        feed_util(e, [0.1] * seconds)
        assert len(e.summary()) == told, seconds
        assert e.frame.subjects[0].first == round(T0)


def test_hysteresis_ends_only_after_keep_and_logs_once():
    started, ended = [], []
    e = engine(LOW.replace("mean(util, 10s)", "mean(util, 1s)").replace("for: 5s", "for: 3s"),
               on_start=started.append, on_end=ended.append)
    # low for 10 s, a 4 s blip (shorter than keep) , low again, then high for good
    feed_util(e, [0.1] * 10 + [0.9] * 4 + [0.1] * 10 + [0.9] * 20)
    assert len(started) == 1 and len(ended) == 1
    f = started[0]
    assert ended[0] is f and not f.active
    assert f.ended - T0 == 24.0 + 8.0  # high from 24 s on, ended after keep (8 s)


def test_flapping_condition_is_one_advice_not_many():
    started = []
    e = engine(LOW.replace("mean(util, 10s)", "mean(util, 1s)").replace("for: 5s", "for: 2s"),
               on_start=started.append)
    feed_util(e, ([0.1] * 5 + [0.9] * 2) * 10)
    assert len(started) == 1


def test_unless_and_suppressed_by():
    rules = LOW + textwrap.indent(textwrap.dedent("""
        - id: other
          title: other
          severity: info
          when: mean(util, 10s) < 0.9
          suppressed_by: [low]
          message: m
          action: a
        - id: muted
          title: muted
          severity: info
          when: mean(util, 10s) < 0.9
          unless: [last(mem_used_ratio) < 0.5]
          message: m
          action: a
    """), "  ")
    e = engine(rules)
    feed_util(e, [0.2] * 30)
    assert {f.rule.id for f in e.summary()} == {"low"}
    e = engine(rules)
    feed_util(e, [0.7] * 30)  # low does not hold: other is free to speak
    assert {f.rule.id for f in e.summary()} == {"other"}


ARCH = """
rules:
  - id: precision
    title: p
    severity: warning
    arch: {min: "7.0"}
    when: mean(util, 5s) > 0.5
    message: cc {compute_capability}
    action:
      - arch: {min: "8.0"}
        text: use bf16
      - arch: {max: "7.5"}
        text: use fp16 with GradScaler
"""


def run_arch(cc: list[int] | None) -> list:
    e = engine(ARCH)
    if cc is not None:
        e.frame.set_meta({"compute_capability": cc})
    feed_util(e, [0.9] * 12)
    return e.summary()


def test_architecture_gate_and_variants():
    assert run_arch([9, 0])[0].details["action"] == "use bf16"
    assert run_arch([8, 0])[0].details["action"] == "use bf16"
    assert run_arch([7, 5])[0].details["action"] == "use fp16 with GradScaler"
    assert run_arch([6, 1]) == []
    assert run_arch([9, 0])[0].details["message"] == "cc 9.0"


def test_per_gpu_evaluation():
    e = engine(LOW)
    for i in range(30):
        e.feed(gpu(i, 0.1, gpu_index=0))
        e.feed(gpu(i, 0.9, gpu_index=1))
    e.finish()
    assert [(f.rule.id, f.gpu) for f in e.summary()] == [("low", 0)]


def test_resolution_does_not_change_the_verdict():
    for res in (0.5, 1.0, 2.0):
        e = engine(LOW, res=res)
        feed_util(e, [0.2] * 60, hz=2)
        assert len(e.summary()) == 1


def test_counter_delta_handles_resets_and_needs_no_full_window():
    rules = """
    rules:
      - id: errs
        title: e
        severity: critical
        when: delta(ecc_uncorrected_total, 10m) > 0
        evidence:
          n: delta(ecc_uncorrected_total, 10m)
        message: "{n:int} new"
        action: a
    """
    e = engine(rules)
    for i, v in enumerate([5, 5, 5, 5, 6, 7, 0, 1]):  # a reset after 7
        e.feed(gpu(i, 0.5, ecc_uncorrected_total=v))
    e.finish()
    (f,) = e.summary()
    assert f.start - T0 == 5.0  # at the bucket where the count first rose
    assert f.details["evidence"]["n"] == 1.0


def test_memory_stays_bounded_over_long_input():
    e = engine(LOW)
    feed_util(e, [0.9] * 20000)
    ring = e.frame.subjects[0].gpu_table.rings["util"]
    assert len(ring.vals) <= 4 * e.frame.keep


def test_the_health_rules_count_their_errors_in_the_right_number():
    """The built-in gpu-xid-errors and gpu-memory-errors say "1 XID error event" and "3 XID
    error events", "1 new uncorrectable ECC error": the noun follows the count."""
    def told(xid: list[int], ecc: list[int]) -> dict[str, str]:
        e = Engine(load_rules())
        for i, (x, c) in enumerate(zip(xid, ecc, strict=True)):
            # the trace's XID counts by code (79: fallen off the bus)
            e.feed(gpu(i, 0.5, xid_total={79: x} if x else {}, clock_event_reasons=0,
                       ecc_uncorrected_total=c))
        e.finish()
        return {f.rule.id: f.details["message"] for f in e.summary()}

    one = told(xid=[0, 0, 1, 1], ecc=[0, 0, 1, 1])
    assert "raised 1 XID error event in the last 10 minutes" in one["gpu-xid-errors"]
    assert "reported 1 new uncorrectable ECC error in 10" in one["gpu-memory-errors"]
    three = told(xid=[0, 0, 3, 3], ecc=[0, 0, 2, 2])
    assert "raised 3 XID error events in the last" in three["gpu-xid-errors"]
    assert "reported 2 new uncorrectable ECC errors in 10" in three["gpu-memory-errors"]
