"""A training loss that is NaN or infinite: carried as such from the hook to the advice.

JSON has no NaN or infinity, so the datagram and the trace write such a loss by name
("nan", "inf", "-inf"); before, both wrote it as null, which reads "not measured", and a
diverged run was told nothing of it. The advisor counts them apart from the loss's own
windows (a NaN would poison their sums) and says ``loss-not-finite``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import synthetic
from conftest import clean_env
from test_advise_support import advise_json, ids

from gpuwatch.job import protocol
from gpuwatch.samples import StepSample
from gpuwatch.trace import format as trace

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
RUN = [sys.executable, "-m", "gpuwatch", "run", "--web.listen-address", "127.0.0.1:0",
       "--quiet"]


def _header(**extra: object) -> dict:
    return {"kind": "report", "pid": 4242, "seq": 0, "t": 1_800_000_000.0, "rank": 0,
            "steps_total": 3, **extra}


def test_the_datagram_carries_a_nan_or_infinite_loss_by_name() -> None:
    steps = [protocol.StepRecord(step=i, t=1_800_000_000.0 + i, step_seconds=0.1, loss=loss)
             for i, loss in enumerate([2.5, math.nan, math.inf, -math.inf])]
    data = protocol.encode(_header(), steps)
    sent = json.loads(data)["steps"]
    # the loss column keeps its numbers (null for these), the names ride beside it
    assert sent["loss"] == [2.5, None, None, None]
    assert sent["loss_nonfinite"] == [None, "nan", "inf", "-inf"]
    got = [s.loss for s in protocol.decode(data).steps]
    assert got[0] == 2.5 and math.isnan(got[1]) and got[2] == math.inf and got[3] == -math.inf
    # a receiver that does not know the column reads those losses as unknown, nothing lost
    old = json.loads(data)
    del old["steps"]["loss_nonfinite"]
    assert [s.loss for s in protocol.decode(json.dumps(old).encode()).steps] == [
        2.5, None, None, None]
    # a finite run sends no such column at all
    plain = protocol.encode(_header(), steps[:1])
    assert "loss_nonfinite" not in json.loads(plain)["steps"]
    # any other text is a malformed datagram, named by its index
    bad = json.loads(data)
    bad["steps"]["loss_nonfinite"][1] = "NaN!"
    with pytest.raises(protocol.ProtocolError, match=r"steps\.loss_nonfinite\[1\]"):
        protocol.decode(json.dumps(bad).encode())
    bad["steps"]["loss_nonfinite"] = ["nan"]
    with pytest.raises(protocol.ProtocolError, match="steps.loss_nonfinite must be an array"):
        protocol.decode(json.dumps(bad).encode())


def test_a_trace_writes_and_reads_a_nan_loss_by_name(tmp_path: Path) -> None:
    line = trace.sample_to_line(StepSample(t=1_800_000_000.0, step=7, loss=math.nan, pid=1))
    assert line["loss"] == "nan"
    assert trace.sample_to_line(StepSample(t=1.0, step=1, loss=-math.inf))["loss"] == "-inf"
    back = trace.line_to_sample(json.loads(trace.dumps_line(line)))
    assert math.isnan(back.loss)
    # a recording written before this (its writer let the NaN literal through) means the
    # same; a word that is not one of the three names is an error with file and line
    assert math.isnan(trace.line_to_sample({**line, "loss": math.nan}).loss)
    path = tmp_path / "bad.jsonl"
    src = (DATA / "h200_fp16_collapse.jsonl").read_text().splitlines()
    at = next(i for i, x in enumerate(src) if '"loss":NaN' in x)
    src[at] = src[at].replace('"loss":NaN', '"loss":"NaN!"')
    path.write_text("\n".join(src) + "\n")
    run = subprocess.run([sys.executable, "-m", "gpuwatch", "advise", "--replay", str(path)],
                         capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert run.returncode == 2
    assert f"bad.jsonl:{at + 1}" in run.stderr and "loss" in run.stderr
    assert '"nan", "inf" or "-inf"' in run.stderr


def _advise(path: Path) -> dict:
    run = subprocess.run([sys.executable, "-m", "gpuwatch", "advise", "--replay", str(path),
                          "--format", "json"], capture_output=True, text=True, cwd=REPO,
                         timeout=120, check=True)
    return json.loads(run.stdout)


def test_a_recorded_divergence_is_told_first_and_the_collapse_gives_way() -> None:
    """h200_fp16_collapse (fp16 at --lr 5 on an H200): its loss is NaN from step 10 on and
    the GradScaler's scale falls to 0. The NaN loss is told, with the step and the last
    finite loss; the collapse it brings and the larger batch give way to it."""
    report = _advise(DATA / "h200_fp16_collapse.jsonl")
    ids = [a["id"] for a in report["advice"]]
    assert ids[0] == "loss-not-finite"
    assert "loss-scale-collapse" not in ids and "raise-batch-size" not in ids
    a = report["advice"][0]
    assert a["severity"] == "critical"
    assert a["evidence"]["loss_nonfinite_step"] == 10
    assert a["evidence"]["loss_nonfinite"] >= 0.9
    assert a["evidence"]["loss_finite_last"] == pytest.approx(9.9932)
    assert "The loss is NaN at each of the" in a["message"]
    assert "readings since step 10" in a["message"]
    assert a["evidence"]["loss_nonfinite_readings"] >= 5
    assert "bf16" in a["action"] and "clip_grad_norm_" in a["action"]


def _loop(tmp_path: Path, name: str, *args: str) -> Path:
    rec = tmp_path / f"{name}.jsonl"
    run = subprocess.run([*RUN, "--record", str(rec), "--", sys.executable,
                          str(REPO / "tests" / "scripts" / "train_cpu.py"), "--steps", "700",
                          "--workers", "0", "--step-ms", "20", *args],
                         check=False, env=clean_env(), cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return rec


def test_a_loop_whose_loss_turns_nan_is_told_so_and_a_healthy_one_is_not(
        tmp_path: Path) -> None:
    """A real torch loop (SGD, CPU) whose loss is made NaN from step 30 on: its gradients,
    then its weights, are NaN, and every later loss with them. The recording carries each
    loss the hook read by name; the advice names the step and the last finite loss. The same
    loop without it is told nothing of the loss."""
    rec = _loop(tmp_path, "nan", "--nan-from", "30")
    losses = [json.loads(x).get("loss") for x in rec.read_text().splitlines()
              if '"kind":"step"' in x]
    losses = [x for x in losses if x is not None]
    assert "nan" in losses and all(isinstance(x, float) or x == "nan" for x in losses)
    first_nan = next(i for i, x in enumerate(losses) if x == "nan")
    assert all(x == "nan" for x in losses[first_nan:])  # it never comes back
    report = _advise(rec)
    (a,) = [a for a in report["advice"] if a["id"] == "loss-not-finite"]
    assert a["severity"] == "critical"
    assert 30 <= a["evidence"]["loss_nonfinite_step"] <= 60  # the first NaN the hook read
    assert isinstance(a["evidence"]["loss_finite_last"], float)
    assert "torch.nn.utils.clip_grad_norm_" in a["action"]
    healthy = _advise(_loop(tmp_path, "ok"))
    assert "loss-not-finite" not in [x["id"] for x in healthy["advice"]]


def test_the_trainer_at_a_learning_rate_that_diverges_is_told_in_its_words(
        tmp_path: Path) -> None:
    """The real Hugging Face Trainer (a tiny BERT, the CPU) at learning_rate=1e30 without
    clipping: within a few steps every loss is NaN. Told, with the Trainer's own knobs."""
    from test_frameworks import record

    rec, truth = record(tmp_path, "hf_trainer", "--steps", "100000", "--seconds", "12",
                        "--eval-every", "100000", "--accum", "1", "--lr", "1e30",
                        "--max-grad-norm", "0")
    assert truth["steps"] > 100
    losses = [x["loss"] for x in _step_lines(rec) if "loss" in x]
    assert losses and losses[-1] == "nan"
    report = _advise(rec)
    (a,) = [a for a in report["advice"] if a["id"] == "loss-not-finite"]
    assert "TrainingArguments(learning_rate=" in a["action"]
    assert "TrainingArguments(max_grad_norm=1.0)" in a["action"]
    assert a["gpu"] is None  # a CPU-only job: told of the host's job


def _step_lines(rec: Path) -> list[dict]:
    return [json.loads(x) for x in rec.read_text().splitlines() if '"kind":"step"' in x]


def _feed(engine, pid: int, t0: float, losses: list[float | None], first_step: int = 0):
    """A job on GPU 0 whose step i ends at t0 + i * 0.5 s, reading losses[i] (None: none
    read at that step), beside a busy GPU."""
    for i, loss in enumerate(losses):
        t = t0 + i * 0.5
        engine.feed({"kind": "gpu", "t": t, "gpu": 0, "util": 0.9, "sm_active": 0.7,
                     "mem_used_bytes": 20 << 30, "mem_total_bytes": 80 << 30,
                     "processes": [{"pid": pid, "mem_used_bytes": 20 << 30}]})
        line = {"kind": "step", "t": t + 0.2, "pid": pid, "gpu": 0, "step": first_step + i,
                "step_seconds": 0.5, "data_wait_seconds": 0.0}
        if loss is not None:
            line["loss"] = loss
        engine.feed(line)


def _told(engine) -> list:
    return [f for f in engine.findings if f.rule.id == "loss-not-finite"]


def test_a_loss_nan_now_and_then_is_not_a_divergence() -> None:
    """Every other loss read NaN for a minute (one bad batch in two: a data problem, not
    a model gone NaN): never five in a row, so not told, whatever its share."""
    from gpuwatch.advisor.engine import Engine
    from gpuwatch.advisor.rules import load_rules

    e = Engine(load_rules())
    _feed(e, 11, 1_800_000_000.0, [2.0] * 20 + [math.nan, 1.9] * 60)
    e.finish()
    assert not _told(e)


def test_a_loss_finite_again_ends_it_and_a_new_job_starts_its_own_count() -> None:
    """Job 11's loss NaN from step 20 for 30 s: told, since step 20, its last finite loss
    2.0; then finite again: the advice ends. Then job 12 on the same GPU, its steps from
    1000, NaN from its first reading: told of its own step, with no last finite loss of
    job 11's."""
    from gpuwatch.advisor.engine import Engine
    from gpuwatch.advisor.rules import load_rules

    e = Engine(load_rules())
    t0 = 1_800_000_000.0
    _feed(e, 11, t0, [2.0] * 20 + [math.nan] * 60 + [1.5] * 80)
    (a,) = _told(e)
    assert not a.active  # finite again: over
    assert a.details["evidence"]["loss_nonfinite_step"] == 20
    assert a.details["evidence"]["loss_finite_last"] == 2.0
    _feed(e, 12, t0 + 100, [math.inf] * 60, first_step=1000)
    e.finish()
    b = _told(e)[-1]
    assert b is not a
    ev = b.details["evidence"]
    assert ev["loss_nonfinite_step"] == 1000
    assert ev.get("loss_finite_last") is None  # job 11's is not job 12's
    assert "The loss is infinite at each of the" in b.details["message"]


@pytest.mark.parametrize("build, rule", [(synthetic.starved_cnn, "add-dataloader-workers"),
                                         (synthetic.resnet_fp32, "enable-mixed-precision")])
def test_speed_advice_gives_way_to_a_diverged_loss(tmp_path: Path, build, rule: str) -> None:
    """A data-starved CNN (add-dataloader-workers) and an fp32 ResNet (enable-mixed-precision),
    each as recorded, then the same run with its loss NaN from its fifth second on: the
    divergence is told and the speed advice is not (every step after it is lost, however
    fast)."""
    healthy = build()
    assert rule in ids(advise_json(healthy.write(tmp_path / "healthy.jsonl")))
    diverged = build()
    for d in diverged.lines:
        if d["kind"] == "step":
            d["loss"] = 2.0 if d["t"] - diverged.first_step < 5.0 else "nan"
    told = ids(advise_json(diverged.write(tmp_path / "diverged.jsonl")))
    assert "loss-not-finite" in told and rule not in told
