"""Iterations from any training loop, config facts from the start, epoch starts.

Real torch on the CPU. The end-to-end tests run ``gpuwatch run --record`` around
tests/scripts/train_loops.py (loops shaped like pytorch/examples' word_language_model,
DCGAN, and gradient accumulation) and compare the recording with the script's own ground
truth. Iteration counts and first-batch flags must match exactly; first-batch waits within
10 % + 10 ms (two clocks around the same calls, a few microseconds apart).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import clean_env

torch = pytest.importorskip("torch")

from gpuwatch.job import protocol  # noqa: E402 (after the importorskip above)
from gpuwatch.job.hook import core as hook  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LOOPS = str(REPO / "tests" / "scripts" / "train_loops.py")
RUN = [sys.executable, "-m", "gpuwatch", "run", "--web.listen-address", "127.0.0.1:0",
       "--quiet"]


def lines(path: Path, kind: str) -> list[dict]:
    out = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [x for x in out if x.get("kind") == kind]


def record_loop(tmp_path: Path, *args: str) -> tuple[list[dict], list[dict], list[dict]]:
    """(recorded step lines, recorded config lines, the script's own step lines)"""
    rec, truth = tmp_path / "rec.jsonl", tmp_path / "truth.jsonl"
    run = subprocess.run([*RUN, "--record", str(rec), "--", sys.executable, LOOPS, *args,
                          "--out", str(truth)],
                         check=False, env=clean_env(), cwd=REPO, capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stderr
    return lines(rec, "step"), lines(rec, "config"), lines(truth, "step")


def test_a_loop_without_an_optimizer_counts_iterations_at_backward(tmp_path: Path) -> None:
    """word_language_model: parameters updated by hand, no DataLoader, evaluation passes
    (no backward) in between, and reentrant checkpointing (a backward() inside backward());
    it pauses after building the model, so its configuration comes before any step."""
    steps, configs, truth = record_loop(tmp_path, "manual", "--steps", "20", "--reentrant",
                                        "--pause", "1.5")
    assert [s["step"] for s in steps] == [s["step"] for s in truth] == list(range(20))
    assert {s["pid"] for s in steps} == {truth[0]["pid"]}
    config = configs[-1]
    assert config["step_source"] == "backward"
    assert config["uses_dataloader"] is False and config["uses_conv"] is False
    assert "channels_last" not in config  # no conv net: not known, so not said
    # sent from the model's construction on: before the first step, during the pause
    assert configs[0]["t"] < steps[0]["t"] - 1.0


def test_a_gan_counts_one_iteration_per_generator_step_and_marks_epoch_starts(
        tmp_path: Path) -> None:
    """DCGAN: three backward() and two optimizer steps per iteration; 4-batch epochs with
    persistent_workers=False, so each epoch starts new workers."""
    steps, configs, truth = record_loop(tmp_path, "gan", "--epochs", "3",
                                        "--epoch-batches", "4", "--workers", "2")
    assert [s["step"] for s in steps] == [s["step"] for s in truth] == list(range(12))
    config = configs[-1]
    assert config["step_source"] == "optimizer"
    assert config["uses_dataloader"] is True and config["persistent_workers"] is False
    assert config["uses_conv"] is True and config["channels_last"] is False
    firsts = [s["step"] for s in steps if s.get("first_batch")]
    assert firsts == [s["step"] for s in truth if s["first_batch"]] == [0, 4, 8]
    assert all(s["first_batch"] is False for s in steps if s["step"] not in firsts)
    for mine, theirs in zip(steps, truth, strict=True):
        if theirs["first_batch"]:
            print(f"step {mine['step']}: first batch {mine['first_batch_wait_seconds']:.4f} s, "
                  f"job {theirs['first_batch_wait_seconds']:.4f} s")
            assert mine["first_batch_wait_seconds"] == pytest.approx(
                theirs["first_batch_wait_seconds"], rel=0.10, abs=0.01)
        else:
            assert "first_batch_wait_seconds" not in mine
        assert mine["data_wait_seconds"] == pytest.approx(theirs["data_wait_seconds"],
                                                          rel=0.10, abs=0.01)


def test_gradient_accumulation_counts_optimizer_steps_only(tmp_path: Path) -> None:
    steps, configs, truth = record_loop(tmp_path, "accumulate", "--steps", "15",
                                        "--accumulate", "4")
    assert [s["step"] for s in steps] == [s["step"] for s in truth] == list(range(15))
    assert configs[-1]["step_source"] == "optimizer"


# -- in this process -------------------------------------------------------------------

@pytest.fixture
def attached(tmp_path: Path) -> Iterator[hook._Hook]:
    assert hook.attach(str(tmp_path / "nobody.sock"))
    try:
        yield hook._hook
    finally:
        hook.detach()


def test_an_optimizer_that_never_steps_falls_back_to_backward(
        attached: hook._Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    """An optimizer built (say, only for its learning rate) but never stepped: backward()
    ends are held for BACKWARD_GRACE, then counted as the iterations they were; a late
    optimizer step takes over without counting its iteration twice."""
    monkeypatch.setattr(hook, "BACKWARD_GRACE", 0.3)
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.1)
    for _ in range(5):
        (w * 2).sum().backward()
    assert attached.n == 0 and attached.source is None  # held: a step may come
    time.sleep(0.35)
    (w * 2).sum().backward()
    assert attached.n == 6 and attached.source == hook.BACKWARD
    durations = [rec[2] for rec in attached.pending]
    assert durations[0] is None and all(d is not None for d in durations[1:])
    assert durations[-1] >= 0.3  # the pause belongs to the iteration it was in
    opt.step()  # ends the iteration the backward() above already counted
    assert attached.n == 6 and attached.source == hook.OPTIMIZER
    (w * 2).sum().backward()
    opt.step()
    assert attached.n == 7
    assert attached._config()["step_source"] == "optimizer"


def test_channels_last_is_read_from_the_conv_weights(attached: hook._Hook) -> None:
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), torch.nn.Conv2d(8, 8, 3))
    assert attached._config()["uses_conv"] is True
    assert attached._config()["channels_last"] is False
    net.to(memory_format=torch.channels_last)
    assert attached._config()["channels_last"] is True


def test_new_window_and_step_fields_round_trip_and_are_validated() -> None:
    header = {"kind": "report", "pid": 7, "seq": 0, "t": 100.0,
              "window": {"steps": 2, "iterators": 1, "first_batch_wait_seconds": 0.25}}
    steps = [protocol.StepRecord(step=0, t=99.0, first_batch=True,
                                 first_batch_wait_seconds=0.25),
             protocol.StepRecord(step=1, t=99.5, first_batch=False)]
    r = protocol.decode(protocol.encode(header, steps))
    assert (r.window.iterators, r.window.first_batch_wait_seconds) == (1, 0.25)
    assert [(s.first_batch, s.first_batch_wait_seconds) for s in r.steps] == \
        [(True, 0.25), (False, None)]
    bad = [({"iterators": -1}, "iterators"), ({"iterators": 1.5}, "iterators"),
           ({"first_batch_wait_seconds": -0.1}, "first_batch_wait_seconds"),
           ({"first_batch_wait_seconds": "x"}, "first_batch_wait_seconds")]
    for window, field in bad:
        with pytest.raises(protocol.ProtocolError, match=field):
            protocol.decode(protocol.encode({**header, "window": window}))
    msg = json.loads(protocol.encode(header, steps))
    msg["steps"]["first_batch"] = [1, 0]
    with pytest.raises(protocol.ProtocolError, match="first_batch"):
        protocol.decode(json.dumps(msg).encode())
    msg["steps"]["first_batch"] = [True, False]
    msg["steps"]["first_batch_wait_seconds"] = [-1, None]
    with pytest.raises(protocol.ProtocolError, match="first_batch_wait_seconds"):
        protocol.decode(json.dumps(msg).encode())


def test_the_loss_column_round_trips_and_is_validated() -> None:
    header = {"kind": "report", "pid": 7, "seq": 0, "t": 100.0, "window": {"steps": 3}}
    steps = [protocol.StepRecord(step=0, t=99.0), protocol.StepRecord(step=1, t=99.2, loss=-1.5),
             protocol.StepRecord(step=2, t=99.4, loss=float("nan"))]
    r = protocol.decode(protocol.encode(header, steps))
    assert [s.loss for s in r.steps] == [None, -1.5, None]  # GAN losses go negative
    msg = json.loads(protocol.encode(header, steps))
    for bad in (["x", None, None], [True, None, None], [10**400, None, None], [None]):
        msg["steps"]["loss"] = bad
        with pytest.raises(protocol.ProtocolError, match="loss"):
            protocol.decode(json.dumps(msg).encode())


def test_the_loss_is_the_unscaled_value_of_the_iterations_last_backward(
        attached: hook._Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GAN's three backward() calls: the iteration's loss is the last one's; with a
    GradScaler, the loss handed to scale(), not the scaled tensor backward() ran on."""
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    attached.thread = object()  # no reporter thread: this test reports by hand
    sent: list[bytes] = []
    # the hook's state has fixed slots: its sender is replaced on the class, for this test
    monkeypatch.setattr(hook._Hook, "_send", lambda _self, data: sent.append(data))
    losses = []
    for i in range(3):
        (w * 3).sum().backward()
        (w * 5).sum().backward()
        loss = (w * w).sum() * (i + 1)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        if i == 1:
            attached.report()
    attached.report()
    got = [s for data in sent for s in protocol.decode(data).steps]
    assert [s.step for s in got] == [0, 1, 2]
    assert [s.loss for s in got] == [None, losses[1], losses[2]]  # one per report
    assert losses[2] != losses[1] and losses[2] < 1024  # unscaled


_FORK_CHILD = r"""
import os, sys, weakref
import torch
from gpuwatch.job.hook import core as hook
hook.attach(sys.argv[1])
model = torch.nn.Linear(4, 1)
for _ in range(3):  # no optimizer: iterations end at backward(), the hook keeps the loss
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
held = hook._hook.loss_tensor
assert held is not None, "the hook kept no loss tensor"
ref = weakref.ref(held)
del held, loss
r, w = os.pipe()
pid = os.fork()
if pid == 0:  # the child: the hook starts over, but frees nothing it inherited
    os.close(r)
    os.write(w, b"alive" if ref() is not None else b"freed")
    os._exit(0)
os.close(w)
got = os.read(r, 16).decode()
os.waitpid(pid, 0)
print(got)
"""


def test_a_forked_child_frees_nothing_its_parent_hook_held(tmp_path: Path) -> None:
    """A DataLoader worker forked from a CUDA job must not release the parent's CUDA
    tensors (the loss, skip flags): freeing one there calls into a CUDA context the child
    cannot use and aborts it (seen on an H100: every worker of a GAN with
    persistent_workers=False died of SIGABRT). Here with CPU tensors: the loss tensor the
    parent's hook held must still be alive in the child after the hook's reset."""
    run = subprocess.run([sys.executable, "-c", _FORK_CHILD, str(tmp_path / "none.sock")],
                         capture_output=True, text=True, timeout=120, cwd=REPO,
                         env=clean_env())
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "alive", run.stdout + run.stderr
