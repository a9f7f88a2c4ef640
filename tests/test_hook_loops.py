"""Iterations from any training loop, config facts from the start, epoch starts.

Real torch on the CPU. The end-to-end tests run ``gpuwatch run --record`` around
tests/scripts/train_loops.py (loops shaped like pytorch/examples' word_language_model,
DCGAN, and gradient accumulation) and compare the recording with the script's own ground
truth. Iteration counts and first-batch flags must match exactly; first-batch waits within
10 % + 10 ms (two clocks around the same calls, a few microseconds apart).
"""

from __future__ import annotations

import collections
import gc
import io
import itertools
import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


@pytest.mark.parametrize("new_loader", [False, True])
def test_a_gan_counts_one_iteration_per_generator_step_and_marks_epoch_starts(
        tmp_path: Path, new_loader: bool) -> None:
    """DCGAN: three backward() and two optimizer steps per iteration; 4-batch epochs with
    persistent_workers=False, so each epoch starts new workers. Also with the DataLoader
    built anew each epoch: a loader the hook has not seen train, whose first batch a
    backward() follows, is training's (its epoch start, its wait), not an evaluation."""
    steps, configs, truth = record_loop(tmp_path, "gan", "--epochs", "3",
                                        "--epoch-batches", "4", "--workers", "2",
                                        *(["--new-loader"] if new_loader else []))
    final = lines(tmp_path / "rec.jsonl", "phase")[-1]
    assert "eval" not in final["seconds"] and final["eval_batches"] == 0
    assert sum(s["batch_size"] for s in steps) == 12 * 8
    assert [s["step"] for s in steps] == [s["step"] for s in truth] == list(range(12))
    # three backward() calls of two optimizers' losses: no micro-batches of one step
    assert all("micro_batches" not in s for s in steps)
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
    assert {s["micro_batches"] for s in steps} == {4}
    assert configs[-1]["step_source"] == "optimizer"


# -- in this process -------------------------------------------------------------------

@pytest.fixture
def attached(tmp_path: Path) -> Iterator[hook._Hook]:
    assert hook.attach(str(tmp_path / "nobody.sock"))
    try:
        yield hook._hook
    finally:
        hook.detach()


def _no_reporter(h: hook._Hook) -> None:
    """Stop the reporting thread attach() started (it reports at once, then every
    interval), so that the step records stay in ``pending`` for the test to read or
    report by hand: one that took them in the middle of a test made it fail by timing."""
    h.stop.set()
    thread = h.thread
    if isinstance(thread, threading.Thread):
        thread.join(timeout=10)
        assert not thread.is_alive()
    h.thread = object()  # and none started at the next step


def _training_step(attached: hook._Hook) -> Callable[[torch.Tensor], None]:
    """One parameter and its SGD optimizer, the reporter stopped (_no_reporter): a
    training step on a batch (its backward() and optimizer step)."""
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    _no_reporter(attached)

    def step(batch: torch.Tensor) -> None:
        (w * batch.float().mean()).sum().backward()
        opt.step()
        opt.zero_grad()
    return step


class _SlowStart(torch.utils.data.Sampler):
    """Two batches of four, whose iterator takes ``seconds`` to make (a sampler's
    shuffle, a loader's workers starting): iter() of it runs as the iterator is made."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __len__(self) -> int:
        return 2

    def __iter__(self):  # noqa: ANN204
        time.sleep(self.seconds)
        return iter([[0, 1, 2, 3], [4, 5, 6, 7]])


class _Buckets(torch.utils.data.Sampler):
    """A batch sampler with no batch_size (token-budget bucketing): batches of 4 whose
    size the hook cannot read, so it counts no samples for them."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n // 4

    def __iter__(self):  # noqa: ANN204
        return iter([list(range(i, i + 4)) for i in range(0, self.n, 4)])


def _model() -> torch.nn.Module:
    """A model as the hook tells one from a frozen layer (two children): its eval()
    begins an evaluation."""
    return torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))


def _after_an_epoch(attached: hook._Hook, samples: int) -> tuple[Any, ...]:
    """One epoch trained on a loader of ``samples`` (batches of 4): the training step
    (_training_step), a model (_model), the training loader and an evaluation loader of
    the same size."""
    step = _training_step(attached)
    train = torch.utils.data.DataLoader(list(range(samples)), batch_size=4)
    val = torch.utils.data.DataLoader(list(range(samples)), batch_size=4)
    for batch in train:
        step(batch)
    return step, _model(), train, val


def _records(attached: hook._Hook) -> list[list[Any]]:
    """The iterations recorded so far, as the reporter reads them (_step_lists: step
    seconds at [2], samples at [4], None where none was counted)."""
    return hook._step_lists(list(attached.pending), None)[0]


def _step_samples(attached: hook._Hook) -> int:
    """The samples the recorded iterations counted, all together."""
    return sum(r[4] or 0 for r in _records(attached))


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
    durations = [rec[2] for rec in hook._step_lists(list(attached.pending), None)[0]]
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


def test_sparse_gradients_are_reported(attached: hook._Hook) -> None:
    """A recommendation model's table: an EmbeddingBag with sparse=True trained by SGD,
    whose fused form refuses sparse gradients. Standing alone (no model registers it) it is
    seen by its sparse .grad while the optimizer holds one, and stays seen after
    zero_grad(); inside a model, by the module registration hook from its construction."""
    table = torch.nn.EmbeddingBag(1000, 8, mode="sum", sparse=True)
    opt = torch.optim.SGD(table.parameters(), lr=0.1)
    ids, offsets = torch.tensor([1, 5, 7, 9]), torch.tensor([0, 2])
    opt.zero_grad()
    table(ids, offsets).sum().backward()
    opt.step()
    assert attached.primary is not None and attached.primary() is opt
    assert attached._config()["sparse_grads"] is True
    opt.zero_grad()  # set_to_none: no .grad left to read
    assert attached._config()["sparse_grads"] is True


def test_dense_gradients_are_not_reported_sparse(attached: hook._Hook) -> None:
    dense = torch.nn.Sequential(torch.nn.Embedding(100, 8), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(dense.parameters(), lr=0.1)
    dense(torch.tensor([[1, 2]])).sum().backward()
    opt.step()
    assert attached._config()["sparse_grads"] is False
    model = torch.nn.Sequential(torch.nn.Embedding(100, 8, sparse=True), torch.nn.Linear(8, 1))
    assert attached._config()["sparse_grads"] is True  # registered: before any step
    del model


def test_deterministic_kernels_asked_for_are_reported(attached: hook._Hook) -> None:
    """torch.use_deterministic_algorithms (Lightning's Trainer(deterministic=True)) or
    cudnn.deterministic alone: the job asked for reproducible kernels."""
    assert attached._config()["deterministic"] is False
    was = torch.backends.cudnn.deterministic
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)  # deterministic="warn"
        assert attached._config()["deterministic"] is True
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = True
        assert attached._config()["deterministic"] is True
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = was


def test_debugging_left_on_is_reported(attached: hook._Hook,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Autograd's anomaly detection (process-wide: read by the reporting thread while the
    training thread set it, as Lightning's Trainer(detect_anomaly=True) sets it around its
    loop) and CUDA_LAUNCH_BLOCKING=1 in the environment, each as it is when read."""
    monkeypatch.delenv("CUDA_LAUNCH_BLOCKING", raising=False)
    cfg = attached._config()
    assert cfg["anomaly_detection"] is False and cfg["launch_blocking"] is False
    read: list[dict] = []
    with torch.autograd.detect_anomaly(check_nan=True):
        thread = threading.Thread(target=lambda: read.append(attached._config()))
        thread.start()
        thread.join(timeout=30)
    assert read and read[0]["anomaly_detection"] is True
    assert attached._config()["anomaly_detection"] is False  # the block's end turns it off
    for value, on in (("1", True), (" 1 ", True), ("0", False), ("", False)):
        monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", value)
        assert attached._config()["launch_blocking"] is on, value
    # torch's allocator reads its switch as 0 or 1; c10d its level in any case
    for value, on in (("1", True), ("0", False), ("true", False)):
        monkeypatch.setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", value)
        assert attached._config()["no_alloc_cache"] is on, value
    for value, on in (("DETAIL", True), ("detail", True), ("INFO", False), ("OFF", False)):
        monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", value)
        assert attached._config()["dist_debug_detail"] is on, value
    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG")
    monkeypatch.delenv("PYTORCH_NO_CUDA_MEMORY_CACHING")
    cfg = attached._config()
    assert cfg["no_alloc_cache"] is False and cfg["dist_debug_detail"] is False
    assert not attached.problems.seen


def test_a_patch_embedding_alone_is_no_conv_net(attached: hook._Hook) -> None:
    """A ViT's one convolution cuts the image into patches (kernel = stride, no padding):
    the model is a transformer, and the advice for conv nets (channels_last, cuDNN's
    benchmark, bf16 where TF32 is on) is not for it. A ConvNeXt's stem is a patch
    embedding too, but its depthwise convolutions make it a conv net."""
    vit = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 16, stride=16), torch.nn.Flatten(2),
                              torch.nn.Linear(196, 196), torch.nn.Linear(196, 10))
    assert vit(torch.zeros(1, 3, 224, 224)).shape == (1, 64, 10)
    assert attached._config()["uses_conv"] is False
    assert "channels_last" not in attached._config()
    convnext = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 4, stride=4),
                                   torch.nn.Conv2d(32, 32, 7, padding=3, groups=32))
    assert convnext(torch.zeros(1, 3, 32, 32)).shape == (1, 32, 8, 8)
    assert attached._config()["uses_conv"] is True
    assert not attached.problems.seen


def test_one_dimensional_convolutions_tell_no_layout(attached: hook._Hook) -> None:
    """An audio model's 1-d convolutions (Whisper's, wav2vec 2.0's stem) are convolutions
    cuDNN runs, but channels_last is a layout of 4-d tensors: it is not reported, so it is
    not advised."""
    stem = torch.nn.Sequential(torch.nn.Conv1d(80, 64, 3, padding=1),
                               torch.nn.Conv1d(64, 64, 3, stride=2, padding=1))
    assert stem(torch.zeros(1, 80, 100)).shape == (1, 64, 50)
    config = attached._config()
    assert config["uses_conv"] is True and "channels_last" not in config
    assert not attached.problems.seen


def test_a_data_parallel_model_is_reported_with_its_device_count(attached: hook._Hook) -> None:
    """``torch.nn.DataParallel`` registers the model before it sets ``device_ids`` (and on a
    machine without CUDA leaves them empty): the count is read when the settings are."""
    assert "data_parallel_gpus" not in attached._config()
    net = torch.nn.Linear(4, 4)
    dp = torch.nn.DataParallel(net)
    assert attached._config()["data_parallel_gpus"] == len(dp.device_ids) == 0
    dp.device_ids = [0, 1, 2, 3]  # what __init__ sets where four GPUs are visible
    assert attached._config()["data_parallel_gpus"] == 4
    torch.nn.DataParallel(torch.nn.Linear(2, 2))  # a second one: the first is the job's
    assert attached._config()["data_parallel_gpus"] == 4
    del dp
    import gc

    gc.collect()
    assert "data_parallel_gpus" not in attached._config()  # gone: no stale count
    assert not attached.problems.seen  # nothing failed on the way


def _one_rank_group(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0",
                 "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(k, v)
    torch.distributed.init_process_group("gloo")


def test_fsdp_cpu_offload_is_reported(attached: hook._Hook, monkeypatch: pytest.MonkeyPatch,
                                      ) -> None:
    """An FSDP unit (FSDP1, as Accelerate, the Trainer and Lightning build it) registers the
    module it wraps: the hook reads whether its parameters live on the CPU."""
    from torch.distributed.fsdp import CPUOffload
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    _one_rank_group(monkeypatch)
    try:
        assert "fsdp_cpu_offload" not in attached._config()
        unit = FSDP(torch.nn.Sequential(torch.nn.Linear(4, 4)), device_id=torch.device("cpu"),
                    cpu_offload=CPUOffload(offload_params=True))
        assert attached._config()["fsdp_cpu_offload"] is True
        del unit
        import gc

        gc.collect()
        assert "fsdp_cpu_offload" not in attached._config()
        kept = FSDP(torch.nn.Linear(2, 2), device_id=torch.device("cpu"))  # noqa: F841
        assert attached._config()["fsdp_cpu_offload"] is False
        assert not attached.problems.seen
    finally:
        torch.distributed.destroy_process_group()


def test_fsdp2_cpu_offload_is_read_from_the_optimizers_parameters(
        attached: hook._Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    """FSDP2's ``fully_shard`` registers no module: its offload is read from the optimizer's
    first parameter, a DTensor whose shard is on the CPU while its mesh is of GPUs. A
    machine without CUDA has only CPU meshes, so the mesh is named a GPU one here, as it is
    where fully_shard(offload_policy=CPUOffloadPolicy()) runs on GPUs; a CPU mesh (FSDP2
    on the CPU) and the same model without FSDP report no offload."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    _one_rank_group(monkeypatch)
    try:
        plain = torch.nn.Linear(4, 4)
        opt0 = torch.optim.AdamW(plain.parameters())
        attached.primary = weakref.ref(opt0)
        assert "fsdp_cpu_offload" not in attached._config()
        mesh = init_device_mesh("cpu", (1,))
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        for layer in model:
            fully_shard(layer, mesh=mesh, offload_policy=CPUOffloadPolicy(pin_memory=False))
        fully_shard(model, mesh=mesh, offload_policy=CPUOffloadPolicy(pin_memory=False))
        opt = torch.optim.AdamW(model.parameters())
        attached.primary = weakref.ref(opt)
        cfg = attached._config()
        assert "fsdp_cpu_offload" not in cfg and "fsdp_version" not in cfg  # FSDP2 on CPUs
        # the mesh fully_shard gets on a GPU host (a property over _device_type in torch
        # 2.13, a plain attribute before)
        attr = "_device_type" if isinstance(getattr(type(mesh), "device_type", None),
                                            property) else "device_type"
        setattr(mesh, attr, "cuda")
        cfg = attached._config()
        assert cfg["fsdp_cpu_offload"] is True and cfg["fsdp_version"] == 2
        setattr(mesh, attr, "cpu")
        assert "fsdp_version" not in attached._config()
        assert not attached.problems.seen
    finally:
        torch.distributed.destroy_process_group()


def test_the_compute_device_is_the_losss_where_the_parameters_stay_on_the_host(
        attached: hook._Hook) -> None:
    """With FSDP's CPU offload the optimizer's parameters live on the CPU while the steps
    run on a GPU: the hook names the GPU the loss was computed on (its memory and its GPU
    follow). A machine without CUDA has no CUDA tensor: the loss here is an object that
    names one, as a CUDA tensor's .device does; a loss on another device (meta) is not
    taken for the GPU."""
    import types

    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.1)
    attached.primary = weakref.ref(opt)
    assert attached._device().type == "cpu"  # a CPU job: its loss on the CPU too
    attached.loss_of = (0, (w * 2).sum())
    assert attached._device().type == "cpu"
    attached.loss_of = (1, torch.empty((), device="meta"))
    assert attached._device().type == "cpu"
    attached.loss_of = (2, types.SimpleNamespace(device=torch.device("cuda", 1)))
    assert attached._device() == torch.device("cuda", 1)
    attached.loss_of = None  # read once by the reporter: the device is kept
    assert attached._device() == torch.device("cuda", 1)


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
    got = [s.loss for s in r.steps]
    assert got[:2] == [None, -1.5]  # GAN losses go negative
    assert math.isnan(got[2])  # a NaN loss is named beside the column, and read back
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
    _no_reporter(attached)  # this test reports by hand
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


class _FailingBackward(torch.autograd.Function):
    """Saves a tensor for backward, then fails in backward as a CUDA allocation would."""

    @staticmethod
    def forward(ctx, x):  # noqa: ANN001, ANN205
        ctx.save_for_backward(x * 1.0)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.parametrize("scaled", [False, True])
def test_a_backward_that_fails_leaves_nothing_of_its_graph_held(
        attached: hook._Hook, scaled: bool) -> None:
    """A backward() that raises part way (CUDA out-of-memory) has not freed its graph: the
    loss it ran on still holds what the forward saved. A job that catches the error and
    tries a smaller batch (the Trainer's auto_find_batch_size) must get that memory back:
    the hook keeps no reference to the failed loss, nor to GradScaler.scale()'s pair."""
    w = torch.nn.Parameter(torch.ones(64))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0) if scaled else None
    _no_reporter(attached)
    (w * 2).sum().backward()  # one iteration that works: the hook takes its short ways
    opt.step()
    refs = []
    for _ in range(2):  # the second time through the hook's short way (bw_plain)
        saved_by_forward = w * 3.0
        refs.append(weakref.ref(saved_by_forward))
        loss = _FailingBackward.apply(saved_by_forward).sum()
        with pytest.raises(torch.OutOfMemoryError):
            (scaler.scale(loss) if scaler else loss).backward()
        del saved_by_forward, loss
        gc.collect()
        assert refs[-1]() is None, "the failed backward's graph is still held"
    assert attached.loss_tensor is None and attached.scaled is None
    (w * w).sum().backward()  # the job goes on: its next backward counts
    opt.step()
    assert attached.n == 2 and not attached.errors


def _backward_every_way(w: torch.Tensor) -> list[torch.Tensor]:
    """Every form of calling backward() that torch allows, each on a fresh graph; the
    gradient after each. Ten top-level backward() calls."""
    grads = []

    def loss() -> torch.Tensor:
        return (w * w * torch.arange(1.0, 4.0)).sum()

    calls = [
        lambda: loss().backward(),
        lambda: loss().backward(torch.tensor(2.0)),  # gradient, by position
        lambda: loss().backward(inputs=[w]),  # Tensor.backward passes inputs= by keyword
        lambda: torch.autograd.backward(loss()),
        lambda: torch.autograd.backward(tensors=loss()),
        lambda: torch.autograd.backward([loss()], [torch.tensor(0.5)]),
        lambda: torch.autograd.backward(loss(), None, None, False, None, [w]),
        lambda: torch.autograd.backward(loss(), grad_tensors=torch.tensor(3.0),
                                        create_graph=False),
    ]
    for call in calls:
        w.grad = None
        call()
        grads.append(w.grad.clone())
    kept = loss()
    torch.autograd.backward(kept, retain_graph=True)
    torch.autograd.backward(kept)  # the graph was kept for this second pass
    grads.append(w.grad.clone())
    return grads


def test_every_way_of_calling_backward_counts_and_changes_nothing(
        attached: hook._Hook) -> None:
    """The wrapper takes torch.autograd.backward's own parameters (no *args packing);
    each form a script may use still reaches torch as it was given and counts once."""
    assert "args" not in torch.autograd.backward.__code__.co_varnames  # the named one
    w = torch.nn.Parameter(torch.ones(3))
    _no_reporter(attached)  # the records stay where they are
    with_hook = _backward_every_way(w)
    # no optimizer: each top-level backward() is an iteration, the first one ends start-up
    assert attached.n == 10 and attached.source == hook.BACKWARD
    assert [rec[8] for rec in hook._step_lists(list(attached.pending), None)[0]] == [1] * 10
    hook.detach()
    assert torch.equal(torch.stack(with_hook), torch.stack(_backward_every_way(w)))


def test_a_backward_of_other_parameters_is_measured_through_the_general_wrapper(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch whose autograd.backward takes other parameters (one to come, say): the
    wrapper that forwards *args and **kwargs, as they were given, is used instead."""
    real = torch.autograd.backward
    seen = []

    def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False,
                 grad_variables=None, inputs=None, *, future=None):  # noqa: ANN001, ANN202
        seen.append(future)
        return real(tensors, grad_tensors, retain_graph, create_graph, grad_variables, inputs)

    monkeypatch.setattr(torch.autograd, "backward", backward)
    assert hook.attach(str(tmp_path / "nobody.sock"))
    try:
        assert "args" in torch.autograd.backward.__code__.co_varnames  # the general one
        w = torch.nn.Parameter(torch.ones(3))
        (w * 2).sum().backward()
        torch.autograd.backward((w * 3).sum(), future="yes")
        assert seen == [None, "yes"]
        assert torch.equal(w.grad, torch.full((3,), 5.0))
        assert hook._hook.n == 2 and hook._hook.source == hook.BACKWARD
    finally:
        hook.detach()
    assert torch.autograd.backward is backward


def test_a_report_between_a_new_loaders_first_batch_and_its_backward_says_no_evaluation(
        attached: hook._Hook) -> None:
    """A training DataLoader made anew (each epoch, a batch size finder's trial) is not
    known to train until a backward() follows its first batch; that batch begins an
    evaluation the backward takes back (undo_eval). A report taken in between (the new
    loader's workers can take a second to start on a GPU host) must not say the evaluation
    either: the next report would take it back, and the daemon would have counted it (0.2 s
    of evaluation in Lightning's BatchSizeFinder on an H200). A real evaluation (a second
    batch) is said as before."""
    step = _training_step(attached)

    def loader() -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(list(range(40)), batch_size=4)

    for batch in itertools.islice(loader(), 3):
        step(batch)
    it = iter(loader())  # a new training loader: not known to train yet
    batch = next(it)
    time.sleep(0.05)
    assert attached.phase == hook.EVAL  # provisionally
    status, seconds = attached._status(), attached._phase_seconds()
    assert status["phase"] == hook.TRAIN and "eval" not in seconds
    assert status["eval"]["batches"] == 0 and status["eval"]["samples"] == 0
    assert status["eval"]["wait_seconds"] == 0.0
    step(batch)  # its backward: training's after all
    status, seconds = attached._status(), attached._phase_seconds()
    assert status["phase"] == hook.TRAIN and "eval" not in seconds
    assert seconds["train"] >= 0.05 and status["eval"]["batches"] == 0
    # an evaluation: a loader whose two batches no backward() follows
    _evaluates_two_batches(attached, loader())


def test_a_training_loader_built_anew_after_each_validation_starts_an_epoch(
        attached: hook._Hook) -> None:
    """Lightning validating at each epoch's end with reload_dataloaders_every_n_epochs=1, a
    loop that makes its DataLoader each epoch and validates between epochs: the new
    training loader's first batch comes while the hook still reads the validation. A
    backward() after it makes it training's: that epoch's start, its wait, its samples;
    the validation before it stays evaluation, left out of the iteration it fell in."""
    step = _training_step(attached)

    class Slow(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 12

        def __getitem__(self, i: int) -> torch.Tensor:
            time.sleep(0.01)  # each item 10 ms: a first batch waits 40 ms
            return torch.tensor(float(i))

    val = torch.utils.data.DataLoader(list(range(16)), batch_size=4)
    t_val = 0.0
    for _ in range(3):
        for batch in torch.utils.data.DataLoader(Slow(), batch_size=4):  # 3 steps an epoch
            step(batch)
        v0 = time.perf_counter()
        with torch.no_grad():
            for _ in val:  # the validation at the epoch's end: 4 batches
                time.sleep(0.05)
        t_val += time.perf_counter() - v0
    status = attached._status()
    assert status["phase"] == hook.EVAL  # the last validation (its loader ended)
    assert status["eval"]["batches"] == 12 and status["eval"]["samples"] == 48
    # the next epoch's loader: until its first batch's backward(), reports say the
    # evaluation it may still be, without that batch
    it = iter(torch.utils.data.DataLoader(Slow(), batch_size=4))
    batch = next(it)
    status = attached._status()
    assert status["phase"] == hook.EVAL and status["eval"]["batches"] == 12
    step(batch)
    status, seconds = attached._status(), attached._phase_seconds()
    assert status["phase"] == hook.TRAIN and status["eval"]["batches"] == 12
    # each validation ended where the next epoch's loader was made
    assert seconds["eval"] == pytest.approx(t_val, abs=0.05)
    recs = hook._step_lists(list(attached.pending), None)[0]
    assert [r[0] for r in recs] == list(range(10))
    assert [r[4] for r in recs] == [4] * 10  # every batch's samples are training's
    firsts = [r[0] for r in recs if r[6] is not None]
    assert firsts == [0, 3, 6, 9], [r[6] for r in recs]  # every epoch's first batch
    for r in recs:
        if r[6] is not None:
            assert r[6][0] == 1 and r[6][1] >= 0.035  # its wait: four 10 ms items
    # the steps after a validation hold none of it (0.2 s): a step, its 40 ms batch
    assert all(r[2] is None or r[2] < 0.2 for r in recs), [r[2] for r in recs]


@pytest.mark.parametrize("after", ["training", "a validation"])
def test_a_new_loader_read_several_batches_before_its_backward_trains(
        attached: hook._Hook, after: str) -> None:
    """A loader built after training began whose step fetches three batches before its
    first backward() (the Trainer's two micro-batches at once, and Accelerate's one read
    ahead: a second Trainer in the same process), after training or after a validation:
    its batches are training's, their samples the steps', the epoch's start counted, and
    a validation before them stays evaluation. Before, every batch of it read as an
    evaluation, for good: no backward() ever followed its latest batch."""
    step = _training_step(attached)
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    for batch in torch.utils.data.DataLoader(list(range(12)), batch_size=4):
        step(batch)
    t_val = 0.0
    if after == "a validation":
        v0 = time.perf_counter()
        with torch.no_grad():
            for _ in torch.utils.data.DataLoader(list(range(8)), batch_size=4):
                time.sleep(0.05)
        t_val = time.perf_counter() - v0
    it = iter(torch.utils.data.DataLoader(list(range(96)), batch_size=8))
    ahead = next(it)
    for _ in range(5):
        micro = [ahead, next(it)]
        ahead = next(it, None)  # the loader's next batch, read ahead
        for batch in micro:
            (w * batch.float().mean()).sum().backward()
        opt.step()
        opt.zero_grad()
    status = attached._status()
    assert status["phase"] == hook.TRAIN
    assert status["eval"]["batches"] == (2 if t_val else 0)
    recs = _records(attached)
    assert [r[0] for r in recs] == list(range(3 + 5))
    assert _step_samples(attached) == 12 + 5 * 16 + 8  # and the one read ahead
    assert [r[0] for r in recs if r[6] is not None] == [0, 3]  # each loader's start
    assert attached._phase_seconds().get("eval", 0.0) == pytest.approx(t_val, abs=0.03)


def test_a_validation_read_with_gradients_on_before_a_training_batch_stays_one(
        attached: hook._Hook) -> None:
    """Validation batches fetched with gradients on and no model.eval() (a hand-written
    loop that forgets both), then the training loader's next batch and its backward():
    the validation stays evaluation, its batches and samples none of the steps'."""
    step = _training_step(attached)
    train = torch.utils.data.DataLoader(list(range(32)), batch_size=4)
    it = iter(train)
    for _ in range(3):
        step(next(it))
    for batch in torch.utils.data.DataLoader(list(range(12)), batch_size=4):
        (batch.float() * 2).sum()  # a forward pass with gradients on, no backward()
    step(next(it))
    status = attached._status()
    assert status["phase"] == hook.TRAIN
    assert status["eval"]["batches"] == 3 and status["eval"]["samples"] == 12
    assert _step_samples(attached) == 4 * 4


def test_an_epochs_new_iterator_after_a_validation_is_the_epochs_cost(
        attached: hook._Hook) -> None:
    """The Trainer's loop: one training DataLoader, iterated anew each epoch, with an
    evaluation at each epoch's end. Making an epoch's iterator (starting its workers, a
    sampler's shuffle: here a sampler that takes 0.1 s) is that epoch's cost, in its first
    batch's wait; the evaluation ends where the iterator was made, not at its first batch."""
    step = _training_step(attached)

    train = torch.utils.data.DataLoader(list(range(8)), batch_sampler=_SlowStart(0.1))
    val = torch.utils.data.DataLoader(list(range(8)), batch_size=4)
    t_val = 0.0
    for _ in range(3):
        for batch in train:  # 2 steps an epoch
            step(batch)
        v0 = time.perf_counter()
        with torch.no_grad():
            for _ in val:
                time.sleep(0.05)
        t_val += time.perf_counter() - v0
    next(iter(train))  # the fourth epoch's first batch ends the third evaluation
    seconds = attached._phase_seconds()
    assert attached.phase == hook.TRAIN
    assert seconds["eval"] == pytest.approx(t_val, abs=0.05)  # not 0.3 s more
    recs = hook._step_lists(list(attached.pending), None)[0]
    firsts = [r[6] for r in recs if r[6] is not None]
    assert len(firsts) == 3 and all(wait >= 0.1 for _, wait in firsts), firsts


def test_an_iterator_made_before_a_validation_ends_it_after_the_validation(
        attached: hook._Hook) -> None:
    """A loop that switches the model to eval mode, makes the next epoch's training
    iterator, then validates, then trains: the evaluation ends after its last batch, not
    where the iterator was made (that put the validation's seconds in the first step)."""
    step, net, train, val = _after_an_epoch(attached, 16)
    t_val = 0.0
    for _ in range(2):
        v0 = time.perf_counter()
        net.eval()
        it = iter(train)  # made before the validation
        with torch.no_grad():
            for _ in val:
                time.sleep(0.05)
        net.train()
        t_val += time.perf_counter() - v0
        for batch in it:
            step(batch)
    seconds = attached._phase_seconds()
    assert seconds["eval"] == pytest.approx(t_val, abs=0.03)
    durations = [r[2] for r in hook._step_lists(list(attached.pending), None)[0]]
    assert max(d for d in durations if d is not None) < 0.1, durations  # not 0.2 s in one


def test_an_evaluation_batch_that_ends_the_process_is_in_its_exit_report(
        attached: hook._Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    """One batch drawn from a validation loader after model.eval(), then a long pass with
    no batch (sampling, generating) and the process ends: nothing says what that batch
    was, and the exit report holds nothing back (the evaluation's seconds were lost)."""
    sent: list[bytes] = []
    monkeypatch.setattr(hook._Hook, "_send", lambda _self, data: sent.append(data))
    step, net, train, val = _after_an_epoch(attached, 8)
    net.eval()
    e0 = time.perf_counter()
    next(iter(val))
    time.sleep(0.3)
    # while it runs, its kind is open: held back, as before
    assert attached._status()["eval"]["batches"] == 0
    attached.report(final=True)
    evaluated = time.perf_counter() - e0
    exit_report = protocol.decode(sent[-1])
    assert exit_report.kind == "exit"
    assert exit_report.phases["eval"] == pytest.approx(evaluated, abs=0.05)
    assert exit_report.eval.batches == 1 and exit_report.eval.samples == 4


def test_a_fetch_begun_before_an_evaluation_never_makes_negative_seconds(
        attached: hook._Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    """A training loader pulled by a prefetching thread (prefetch_generator's
    BackgroundGenerator): its next() is under way when the main thread switches the
    model to eval mode. Its batch ends the evaluation where it came, never before the
    evaluation began: phase seconds that ran backwards made the daemon refuse every report
    after (the hook dark)."""
    sent: list[bytes] = []
    monkeypatch.setattr(hook._Hook, "_send", lambda _self, data: sent.append(data))
    step = _training_step(attached)
    net = _model()

    class Slow(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 40

        def __getitem__(self, i: int) -> torch.Tensor:
            time.sleep(0.01)
            return torch.tensor(float(i))

    def background(it: Any) -> Iterator[Any]:
        q: queue.Queue = queue.Queue(1)
        end = object()

        def run() -> None:
            for x in it:
                q.put(x)
            q.put(end)
        threading.Thread(target=run, daemon=True).start()
        while (x := q.get()) is not end:
            yield x

    train = torch.utils.data.DataLoader(Slow(), batch_size=4)
    val = torch.utils.data.DataLoader(list(range(16)), batch_size=4)
    for i, batch in enumerate(background(train)):
        step(batch)
        time.sleep(0.03)
        if i % 5 == 4:
            net.eval()  # the prefetching thread's next() is under way
            with torch.no_grad():
                for _ in val:
                    time.sleep(0.002)
            net.train()
            assert min(attached.phase_seconds.values()) >= 0.0, attached.phase_seconds
    attached.report(final=True)
    report = protocol.decode(sent[-1])  # the daemon's own check: accepted
    assert all(v >= 0 for v in report.phases.values())
    assert report.eval.batches == 8


def test_validating_between_a_batch_and_its_backward_leaves_the_loaders_as_they_are(
        attached: hook._Hook) -> None:
    """``for i, batch in enumerate(train): if i % 5 == 4: validate(); step(batch)``: the
    validation runs between a training batch and its backward(). The backward() said the
    validation loader trained (the last loader fetched): its batches were read as steps'
    data, its iterators as epoch starts, and its time as training."""
    step = _training_step(attached)
    net = _model()
    train = torch.utils.data.DataLoader(list(range(40)), batch_size=4)
    val = torch.utils.data.DataLoader(list(range(16)), batch_size=4)
    t_val = 0.0
    for _ in range(2):
        for i, batch in enumerate(train):
            if i % 5 == 4:
                v0 = time.perf_counter()
                net.eval()
                with torch.no_grad():
                    for _ in val:
                        time.sleep(0.02)
                net.train()
                t_val += time.perf_counter() - v0
            step(batch)
    assert val not in attached.train_loaders and train in attached.train_loaders
    recs = hook._step_lists(list(attached.pending), None)[0]
    assert [r[4] for r in recs] == [4] * 20  # each step its own batch, no validation's
    assert [r[0] for r in recs if r[6] is not None] == [0, 10]  # the two epochs' starts
    status = attached._status()
    assert status["eval"]["batches"] == 16 and status["eval"]["samples"] == 64
    assert attached._phase_seconds().get("eval", 0.0) == pytest.approx(t_val, abs=0.03)


def test_making_an_evaluation_iterator_is_the_evaluations_wait(
        attached: hook._Hook) -> None:
    """An evaluation loader whose iterator takes 0.3 s to make (its workers' start, a
    sampler's set-up): that is the evaluation's wait, not the next training step's data
    wait (which came out longer than the step itself)."""
    step = _training_step(attached)
    net = _model()

    train = torch.utils.data.DataLoader(list(range(32)), batch_size=4)
    val = torch.utils.data.DataLoader(list(range(8)), batch_sampler=_SlowStart(0.3))
    for i, batch in enumerate(train):
        step(batch)
        if i == 3:
            net.eval()
            with torch.no_grad():
                for _ in val:
                    pass
            net.train()
    recs = hook._step_lists(list(attached.pending), None)[0]
    for r in recs[1:]:
        assert r[3] <= r[2], recs  # no step waits on data longer than it took
    assert max(r[3] for r in recs[1:]) < 0.1
    assert attached._status()["eval"]["wait_seconds"] >= 0.3


def test_a_loop_that_takes_its_gradients_without_backward_trains(
        attached: hook._Hook) -> None:
    """Gradients from torch.autograd.grad, set by hand, then an optimizer step: no
    backward() says which loader trains, and every batch after the first iteration read
    as an evaluation's (each step's time left out of it, its samples unknown). The
    optimizer step after the batch says it as well."""
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    _no_reporter(attached)
    train = torch.utils.data.DataLoader(list(range(40)), batch_size=4)
    for _ in range(2):
        for batch in train:
            time.sleep(0.01)
            loss = (w * batch.float().mean()).sum()
            (w.grad,) = torch.autograd.grad(loss, [w])
            opt.step()
            opt.zero_grad()
    assert train in attached.train_loaders
    status = attached._status()
    assert status["phase"] == hook.TRAIN and status["eval"]["batches"] == 0
    assert "eval" not in attached._phase_seconds()
    recs = hook._step_lists(list(attached.pending), None)[0]
    assert len(recs) == 20 and [r[4] for r in recs] == [4] * 20
    assert all(r[2] >= 0.01 for r in recs[1:]), [r[2] for r in recs]


def test_a_validation_begun_by_model_eval_reads_as_evaluation_throughout(
        attached: hook._Hook) -> None:
    """The Trainer and Lightning call model.eval() before their evaluation loader's first
    batch: the hook is evaluating already when that batch comes (a loader's first batch
    while evaluating might be the next epoch's training loader, until a second batch or a
    backward() says which). Reports say the evaluation all along, never training."""
    net = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    _no_reporter(attached)
    train = torch.utils.data.DataLoader(torch.ones(8, 2), batch_size=4)
    val = torch.utils.data.DataLoader(torch.ones(8, 2), batch_size=4)

    def epoch() -> None:
        for batch in train:
            net(batch).sum().backward()
            opt.step()
            opt.zero_grad()
    epoch()
    net.eval()
    assert attached.phase == hook.EVAL
    it = iter(val)
    with torch.no_grad():
        net(next(it))
        status = attached._status()
        assert status["phase"] == hook.EVAL and status["eval"]["batches"] == 0
        net(next(it))
        status = attached._status()
        assert status["phase"] == hook.EVAL and status["eval"]["batches"] == 2
    net.train()
    epoch()  # training again: its loader's next epoch
    assert attached._status()["phase"] == hook.TRAIN
    assert attached._status()["eval"]["batches"] == 2


@pytest.mark.parametrize("then", ["validation", "training"])
def test_a_pass_over_the_training_data_in_eval_mode_is_evaluation(
        attached: hook._Hook, then: str) -> None:
    """A loop that measures its training accuracy after each epoch: model.eval(), then the
    training loader again under torch.no_grad() (pytorch's tutorials, many notebooks).
    The loader trains, but these batches do not: the pass is evaluation, its batches the
    evaluation's, and the next epoch's first step does not carry it. Before, its first
    batch read as training again (the training loader's batch ends an evaluation): the
    pass's seconds and samples went into the next step."""
    step, net, train, val = _after_an_epoch(attached, 16)
    e0 = time.perf_counter()
    net.eval()
    with torch.no_grad():
        for _ in train:  # the training accuracy
            time.sleep(0.03)
        if then == "validation":
            for _ in val:
                time.sleep(0.01)
    net.train()
    evaluated = time.perf_counter() - e0
    status = attached._status()
    assert status["phase"] == hook.EVAL
    assert status["eval"]["batches"] == (8 if then == "validation" else 4)
    assert status["eval"]["samples"] == (32 if then == "validation" else 16)
    for batch in train:
        step(batch)
    assert attached._status()["phase"] == hook.TRAIN
    seconds = attached._phase_seconds()
    assert seconds["eval"] == pytest.approx(evaluated, abs=0.03)
    assert _step_samples(attached) == 32  # the two epochs' samples, no pass's
    durations = [r[2] for r in _records(attached) if r[2] is not None]
    assert max(durations) < 0.1, durations  # not the pass's 0.12 s in one step


def test_a_training_batch_fetched_before_model_train_after_an_evaluation_trains(
        attached: hook._Hook) -> None:
    """The Trainer evaluates, then fetches its next batches (all of an accumulation's
    micro-batches at once) before its training_step calls model.train(): gradients on,
    those batches are training's, as they were."""
    step, net, train, val = _after_an_epoch(attached, 16)
    net.eval()
    with torch.no_grad():
        for _ in val:
            pass
    it = iter(train)
    batches = [next(it), next(it)]  # the model still in eval mode, gradients on
    net.train()
    for batch in batches:
        step(batch)
    status = attached._status()
    assert status["phase"] == hook.TRAIN and status["eval"]["batches"] == 4
    assert _step_samples(attached) == 24


def test_two_loaders_read_side_by_side_both_train(attached: hook._Hook) -> None:
    """Two training loaders zipped for each step (labeled and unlabeled data, two
    domains; Lightning's CombinedLoader does the same): a backward() follows the second
    one's batch, so only it was known to train, and from the second step on each batch of
    the first began an "evaluation" that the second's batch ended. Seen so in two steps
    in a row, both train: of the whole run only the first of those batches stays the
    evaluation's (one sample drawn now and then is no second loader: the next test)."""
    step = _training_step(attached)
    labeled = torch.utils.data.DataLoader(list(range(32)), batch_size=4)
    unlabeled = torch.utils.data.DataLoader(list(range(64)), batch_size=8)
    for _ in range(2):
        for x, u in zip(labeled, unlabeled, strict=True):
            step(torch.cat([x, u]))
    status = attached._status()
    assert status["phase"] == hook.TRAIN
    assert status["eval"]["batches"] == 1 and status["eval"]["samples"] == 4
    assert len(_records(attached)) == 16 and _step_samples(attached) == 2 * (32 + 64) - 4


def test_a_sample_drawn_now_and_then_from_another_loader_is_evaluation(
        attached: hook._Hook) -> None:
    """Every few steps one batch of the validation loader, gradients on, no model.eval(),
    to generate a sample under no_grad (language and diffusion loops log samples so): a
    training batch follows it at once, as with two loaders read side by side, but not in
    two steps in a row. Evaluation, and the validation loader no training one."""
    step = _training_step(attached)
    train = torch.utils.data.DataLoader(list(range(32)), batch_size=4)
    val = torch.utils.data.DataLoader(list(range(32)), batch_size=4)
    slept = 0.0
    for _ in range(3):
        for i, batch in enumerate(train):
            step(batch)
            if i % 4 == 3:
                next(iter(val))
                with torch.no_grad():
                    time.sleep(0.05)  # generating
                    slept += 0.05
    status = attached._status()
    assert status["eval"]["batches"] == 6 and val not in attached.train_loaders
    assert attached._phase_seconds()["eval"] == pytest.approx(slept, abs=0.03)
    assert _step_samples(attached) == 96


def test_a_validation_batch_drawn_at_every_step_is_evaluation(attached: hook._Hook) -> None:
    """One validation batch drawn after each step, gradients on, its loss taken under
    no_grad (no model.eval()) before the next training batch: at every step, unlike a
    sample drawn now and then, but the forward pass between the two fetches says they are
    not two loaders read side by side."""
    step = _training_step(attached)
    train = torch.utils.data.DataLoader(list(range(32)), batch_size=4)
    val = iter(torch.utils.data.DataLoader(list(range(400)), batch_size=4))
    for _ in range(2):
        for batch in train:
            step(batch)
            next(val)
            with torch.no_grad():
                time.sleep(0.01)  # the validation loss
    status = attached._status()
    assert status["eval"]["batches"] == 16
    assert _step_samples(attached) == 64


def test_a_loop_with_gradients_on_only_around_its_steps_trains(attached: hook._Hook) -> None:
    """Gradients off for the whole process (torch.set_grad_enabled(False)) and on around
    each step, its DataLoader built each epoch: each epoch's first batch comes with
    gradients off and its backward() follows, so it is training's, as a new loader's first
    batch is (not a validation batch taken before a backward(): those come after the
    iteration's training batch)."""
    step = _training_step(attached)
    was = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    try:
        for _ in range(3):
            for batch in torch.utils.data.DataLoader(list(range(32)), batch_size=4):
                with torch.enable_grad():
                    step(batch)
    finally:
        torch.set_grad_enabled(was)
    status = attached._status()
    assert status["phase"] == hook.TRAIN and status["eval"]["batches"] == 0
    assert _step_samples(attached) == 96


def test_an_evaluation_that_saves_a_checkpoint_goes_on_after_it(attached: hook._Hook) -> None:
    """model.eval(), the validation, the best model saved (torch.save), then the training
    accuracy: the save is a checkpoint inside the evaluation, which goes on after it, the
    training data's pass included."""
    step, net, train, val = _after_an_epoch(attached, 16)
    net.eval()
    with torch.no_grad():
        for _ in val:
            pass
        torch.save(net.state_dict(), io.BytesIO())
        for _ in train:
            time.sleep(0.01)
    status = attached._status()
    assert status["phase"] == hook.EVAL and status["eval"]["batches"] == 8
    assert attached.samples == 0  # nothing of the pass waits for the next step


@pytest.mark.parametrize("sized", [True, False])
def test_one_batch_of_another_loader_under_no_grad_between_steps_is_evaluation(
        attached: hook._Hook, sized: bool) -> None:
    """A validation loss taken on one batch now and then, under torch.no_grad() (no
    model.eval()), between a training batch's fetch and its backward(): evaluation, and
    its loader no training one, not a new training loader's first batch (that is an
    iteration's only batch); also where the training batches have no size the hook can
    read (a batch sampler of its own), so that it counts no samples for them."""
    step = _training_step(attached)
    train = torch.utils.data.DataLoader(list(range(32)), batch_size=4) if sized \
        else torch.utils.data.DataLoader(list(range(32)), batch_sampler=_Buckets(32))
    val_loader = torch.utils.data.DataLoader(list(range(32)), batch_size=4)
    val = iter(val_loader)
    for i, batch in enumerate(train):
        if i in (2, 5):
            with torch.no_grad():
                next(val)
        step(batch)
    status = attached._status()
    assert status["phase"] == hook.TRAIN and status["eval"]["batches"] == 2
    assert val_loader not in attached.train_loaders
    assert _step_samples(attached) == (32 if sized else 0)


def test_a_new_loader_at_a_freed_training_loaders_address_is_not_taken_for_it(
        attached: hook._Hook) -> None:
    """The hook knows a training DataLoader by the loader itself, not by its id(): once a
    training loader is freed (an epoch's loader made anew, a batch size finder's trial),
    Python may give its address to the next loader made, an evaluation's. Known by id,
    that loader read as training: its batches were steps' data, its evaluation unseen."""
    step = _training_step(attached)

    def loader() -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(list(range(40)), batch_size=4)

    for _ in range(200):  # until the allocator hands the freed address on (most tries)
        first = loader()
        for batch in itertools.islice(first, 3):
            step(batch)
        freed = id(first)
        del first, batch
        ev = loader()
        if id(ev) == freed:
            break
    else:
        pytest.skip("the allocator never gave a freed loader's address to the next one")
    _evaluates_two_batches(attached, ev)


def _evaluates_two_batches(attached: hook._Hook, loader: torch.utils.data.DataLoader) -> None:
    """Two batches of ``loader`` under no_grad, no backward(): the hook reads an evaluation
    (of 2 batches of 4 samples)."""
    with torch.no_grad():
        it = iter(loader)
        next(it)
        next(it)
    time.sleep(0.02)
    status, seconds = attached._status(), attached._phase_seconds()
    assert status["phase"] == hook.EVAL and seconds["eval"] >= 0.02
    assert status["eval"]["batches"] == 2 and status["eval"]["samples"] == 8


def test_a_loop_under_accelerates_batch_size_finder_is_reported(attached: hook._Hook) -> None:
    """accelerate's find_executable_batch_size runs the loop again at 90 % of the batch on
    every out-of-memory (the Trainer's auto_find_batch_size runs through it): the memory
    it fills is its aim. The hook sees its frame above the first iteration's end and
    reports fw_auto_batch, in a plain loop too."""
    memory = pytest.importorskip("accelerate.utils.memory")
    from gpuwatch.job.hook.facts import Problems

    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    _no_reporter(attached)
    tried = []

    @memory.find_executable_batch_size(starting_batch_size=64)
    def train(batch_size: int) -> None:
        tried.append(batch_size)
        if batch_size > 50:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        for _ in range(3):
            (w * batch_size).sum().backward()
            opt.step()
            opt.zero_grad()

    train()
    assert tried == [64, 57, 51, 45] and attached.n == 3
    cfg: dict = {}
    attached.framework.settings(cfg, Problems())
    assert cfg == {"fw_auto_batch": True}  # no framework: a plain loop


def _sent_steps(attached: hook._Hook, monkeypatch: pytest.MonkeyPatch
                ) -> Callable[[], list[list[Any]]]:
    """The reporter stopped (_no_reporter) and its sender replaced: a function that
    reports by hand and returns the step records each report sent so far, one list a
    report."""
    _no_reporter(attached)
    sent: list[bytes] = []
    # the hook's state has fixed slots: its sender is replaced on the class
    monkeypatch.setattr(hook._Hook, "_send", lambda _self, data: sent.append(data))

    def report(final: bool = False) -> list[list[Any]]:
        attached.report(final)
        return [list(protocol.decode(data).steps) for data in sent]
    return report


def test_optimizers_stepping_in_turn_report_no_micro_batches(
        attached: hook._Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    """DCGAN's iteration: two backward() calls and the discriminator's step, then the
    generator's backward() and step. The first optimizer to step clocks iterations, and
    their backward() calls are two optimizers' losses, not micro-batches of one step
    (before: 2 for the first iteration, 3 for each after, which the advisor reads as
    gradient accumulation). The first iteration's record, sent before the generator ever
    stepped, waits until the discriminator steps again."""
    d, g = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt_d, opt_g = torch.optim.Adam([d]), torch.optim.Adam([g])
    report = _sent_steps(attached, monkeypatch)
    for i in range(5):
        (d * 2).sum().backward()
        (d * 3).sum().backward()
        opt_d.step()
        if i == 0:
            assert report() == [[]]  # its two backward() calls undecided: held
        (d * g).sum().backward()
        opt_g.step()
    sent = report()
    assert attached.n == 5 and attached.several_opts
    steps = [s for batch in sent for s in batch]
    assert [s.step for s in steps] == list(range(5))
    assert [s.micro_batches for s in steps] == [None] * 5


def test_a_held_first_iteration_goes_with_the_next_report(
        attached: hook._Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gradient accumulation with one optimizer: the first iteration's record waits for
    the second iteration's end, then goes with its micro-batches as every other one;
    a process that ends after one iteration sends it in its exit report."""
    w = torch.nn.Parameter(torch.ones(3))

    def iteration(opt: torch.optim.Optimizer) -> None:
        for _ in range(4):
            (w * 2).sum().backward()
        opt.step()
    opt = torch.optim.SGD([w], lr=0.1)
    report = _sent_steps(attached, monkeypatch)
    iteration(opt)
    assert report() == [[]]
    iteration(opt)
    iteration(opt)
    sent = report()
    assert [[s.step for s in batch] for batch in sent] == [[], [0, 1, 2]]
    assert {s.micro_batches for s in sent[1]} == {4}
    assert not attached.several_opts
    hook.detach()  # a fresh hook, ended after its first iteration: the exit report
    assert hook.attach(str(attached.paths[0]))
    report = _sent_steps(hook._hook, monkeypatch)
    iteration(torch.optim.SGD([w], lr=0.1))
    assert [s.micro_batches for s in report(final=True)[-1]] == [4]


def test_a_new_optimizer_for_a_later_phase_clocks_while_the_first_lives_on(
        attached: hook._Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fine-tuning in two phases: the head trained with one optimizer, then the whole
    model with a new one, the first kept (a list, a scheduler or an old Trainer holding
    it). Before: the first optimizer stayed the clock, so the second phase counted no
    iteration at all (a stalled job to the advisor). Now the new optimizer's second step
    with the first idle between makes it the clock, its first step counted too."""
    head, body = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    first = torch.optim.SGD([head], lr=0.1)
    report = _sent_steps(attached, monkeypatch)
    for _ in range(3):
        (head * 2).sum().backward()
        first.step()
    kept = [first]  # noqa: F841 (what keeps it alive)
    second = torch.optim.AdamW([body, head], lr=1e-4)
    for _ in range(4):
        (head * body).sum().backward()
        second.step()
    assert attached.n == 7 and not attached.several_opts
    steps = [s for batch in report() for s in batch]
    assert [s.step for s in steps] == list(range(7))
    assert {s.micro_batches for s in steps} == {1}
    assert all(s.step_seconds is not None for s in steps[1:])
    assert attached.primary() is second


class _StepsInside(torch.optim.Optimizer):
    """A wrapper over ``params`` that steps the optimizer it holds inside its own step:
    Lookahead's shape (the same parameters), or ZeroRedundancyOptimizer's (the inner one
    holds this rank's share of them). Both steps reach torch's step hooks."""

    def __init__(self, params: list[torch.Tensor], inner: torch.optim.Optimizer) -> None:
        self.inner = inner
        super().__init__(params, inner.defaults)

    def step(self, closure: Any = None) -> Any:
        return self.inner.step(closure)


@pytest.mark.parametrize("share", ["all", "a shard"])
def test_an_optimizer_stepped_inside_a_wrapper_over_its_parameters_is_one(
        attached: hook._Hook, monkeypatch: pytest.MonkeyPatch, share: str) -> None:
    """Two optimizers step each iteration, one inside the other, over the same
    parameters or the inner over a share of them: one iteration each, and accumulation's
    micro-batches as they are."""
    w, v = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt = _StepsInside([w, v], torch.optim.SGD([w, v] if share == "all" else [v], lr=0.1))
    report = _sent_steps(attached, monkeypatch)
    for _ in range(4):
        (w * v).sum().backward()
        (w * 3 * v).sum().backward()
        opt.step()
    assert attached.n == 4 and not attached.several_opts
    steps = [s for batch in report() for s in batch]
    assert [(s.step, s.micro_batches) for s in steps] == [(i, 2) for i in range(4)]


def test_optimizers_stepped_in_turn_by_one_scaler_report_no_micro_batches(
        attached: hook._Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GAN under one GradScaler: the scaler's update() clocks iterations, and the two
    optimizers it steps make the backward() calls no micro-batches."""
    d, g = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt_d, opt_g = torch.optim.SGD([d], lr=0.1), torch.optim.SGD([g], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    report = _sent_steps(attached, monkeypatch)
    for _ in range(3):
        scaler.scale((d * 2).sum()).backward()
        scaler.scale((d * 3).sum()).backward()
        scaler.step(opt_d)
        scaler.scale((d * g).sum()).backward()
        scaler.step(opt_g)
        scaler.update()
    assert attached.n == 3 and attached.several_opts
    assert [s.micro_batches for batch in report() for s in batch] == [None] * 3


def test_training_without_a_scaler_after_training_with_one_is_counted(
        attached: hook._Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    """fp16 with a GradScaler, then the same model trained again without one (bf16 or
    fp32: a notebook run again with the advice taken), then with one again. Before, the
    scaler stayed the clock for good and the second run counted no iteration. An
    optimizer stepped outside the scaler beside it at each iteration leaves the scaler
    the clock. Once no scaler clocks, the settings say no GradScaler and no loss scale
    is read (before, the first run's scaler stayed in both: "fp16 with a GradScaler" was
    advised to a bf16 run on an H200)."""
    w, extra = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    report = _sent_steps(attached, monkeypatch)
    opt, side = torch.optim.SGD([w], lr=0.1), torch.optim.SGD([extra], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(4):
        scaler.scale((w * 2).sum()).backward()
        scaler.step(opt)
        (extra * 2).sum().backward()
        side.step()  # unscaled, beside it
        scaler.update()
    assert attached.n == 4 and attached.scaler_mode
    assert attached._config()["grad_scaler"] and attached._scale_tensor() is not None
    attached._resolve(False)
    assert attached.loss_scale == scaler.get_scale()
    opt = torch.optim.SGD([w], lr=0.1)
    for _ in range(5):
        (w * 2).sum().backward()
        opt.step()
    assert attached.n == 9 and not attached.scaler_mode
    # the first scaler lives on (scaler, side), but scales nothing now: the settings say
    # so, and its scale is no loss scale of the steps
    assert scaler.is_enabled() and not attached._config()["grad_scaler"]
    assert attached._scale_tensor() is None
    attached._resolve(False)
    assert attached.loss_scale is None  # no loss scale is sent (the H200's said 65536)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(3):
        scaler.scale((w * 2).sum()).backward()
        scaler.step(opt)
        scaler.update()
    assert attached.n == 12 and attached.scaler_mode
    assert attached._config()["grad_scaler"] and attached._scale_tensor() is not None
    steps = [s for batch in report() for s in batch]
    assert [s.step for s in steps] == list(range(12))
    assert all(s.step_seconds is not None for s in steps[1:])
    # the unscaled optimizer's backward() calls beside the scaler's made no micro-batches
    assert attached.several_opts
    assert [s.micro_batches for s in steps] == [None] * 12


def test_optimizers_splitting_one_models_parameters_keep_its_micro_batches(
        attached: hook._Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    """Muon for a model's matrices and AdamW for the rest, both stepped after the same
    four backward() calls (nanochat's and modded-nanogpt's shape): the micro-batches are
    accumulation's, sent as they are; only an optimizer with a backward() of its own
    before its step (a GAN's) makes the calls several optimizers' turns."""
    matrix, bias = torch.nn.Parameter(torch.ones(3, 3)), torch.nn.Parameter(torch.ones(3))
    opts = [torch.optim.SGD([matrix], lr=0.1), torch.optim.AdamW([bias], lr=0.1)]
    report = _sent_steps(attached, monkeypatch)
    for _ in range(5):
        for _ in range(4):
            (matrix.sum() * bias).sum().backward()
        for opt in opts:
            opt.step()
    assert attached.n == 5 and not attached.several_opts
    assert [s.micro_batches for batch in report() for s in batch] == [4] * 5


def test_a_loop_without_a_training_loader_keeps_its_validation(
        attached: hook._Hook) -> None:
    """Training batches sliced from tensors (nanoGPT's get_batch), a validation of a few
    batches of a DataLoader with torch.no_grad() inside the loop body (gradients on at
    each fetch) and a break before the loader's end: the validation stays evaluation, and
    its loader no training one, though no DataLoader batch comes before the next
    backward()."""
    w = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([w], lr=0.1)
    data = torch.randn(64, 4)
    val = torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=8)
    for i in range(12):
        (w * data[i:i + 4]).sum().backward()
        opt.step()
        opt.zero_grad()
        if i % 4 == 3:
            for j, batch in enumerate(val):
                if j == 3:
                    break
                with torch.no_grad():
                    (w * batch).sum()
    status = attached._status()
    assert attached.n == 12
    assert status["eval"]["batches"] == 3 * 4  # each validation's 3 batches, and the 4th
    assert not attached.loader_trained and len(attached.train_loaders) == 0


def test_an_optimizer_stepped_at_each_micro_batch_beside_a_scaler_leaves_it_the_clock(
        attached: hook._Hook) -> None:
    """A model accumulating 4 micro-batches through a GradScaler, a probe head's plain
    optimizer stepped at each micro-batch after its own backward(): the scaler's update()
    clocks the iterations (the probe's steps before the scaler's first count, as the first
    optimizer to step); the probe's steps never take the clock, since the scaler's loss is
    scaled between them."""
    w, head = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt, probe = torch.optim.SGD([w], lr=0.1), torch.optim.SGD([head], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(6):
        for _ in range(4):
            scaler.scale((w * 2).sum()).backward()
            (head * 2).sum().backward()
            probe.step()
        scaler.step(opt)
        scaler.update()
    assert attached.scaler_mode
    assert attached.n == 4 + 6


def test_steps_lost_to_a_stalled_reporter_leave_the_others_exact(
        attached: hook._Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    """The step records wait in a bounded queue: a reporter that stalls loses the oldest.
    The wait and step time of each record are taken as differences of running totals, so
    the first record kept after a loss has no step time; the others keep theirs."""
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    loader = torch.utils.data.DataLoader(list(range(40)), batch_size=4)
    _no_reporter(attached)  # this test reports by hand
    sent: list[bytes] = []
    monkeypatch.setattr(hook._Hook, "_send", lambda _self, data: sent.append(data))

    def train(batches: int) -> None:
        for batch in itertools.islice(loader, batches):  # a new iterator each time
            (w * batch.float().mean()).sum().backward()
            opt.step()
            opt.zero_grad()

    train(4)
    attached.report()
    attached.pending = collections.deque(maxlen=3)  # the reporter stalls: 3 records kept
    train(10)
    attached.report()
    reports = [protocol.decode(data) for data in sent]
    steps = [s for r in reports for s in r.steps]
    assert [s.step for s in steps] == [0, 1, 2, 3, 11, 12, 13]
    assert reports[-1].steps_total == 14
    assert steps[0].step_seconds is not None  # from the first batch on
    assert all(s.step_seconds is not None and s.step_seconds > 0 for s in steps[1:4])
    assert steps[4].step_seconds is None and steps[4].data_wait_seconds is None
    assert all(s.step_seconds > 0 and s.data_wait_seconds > 0 for s in steps[5:])
    assert all(s.batch_size == 4 and s.micro_batches == 1 for s in steps)
    assert [s.first_batch for s in steps] == [True] + [False] * 6
    assert reports[-1].window.timed == 2


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


# -- inference that no DataLoader or generate() feeds -------------------------------------

class _Block(torch.nn.Module):
    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(n_in, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class _Encoder(torch.nn.Module):
    """A model whose wrapper may call its own forward() directly (older
    sentence-transformers): its children, of classes of its own, see every pass."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = _Block(8, 16)
        self.head = _Block(16, 4)

    def forward(self, features: dict) -> torch.Tensor:
        return self.head(torch.relu(self.embed(features["x"])))


def _hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize("call", ["module", "forward"])
def test_forward_passes_in_eval_mode_make_an_inference_process(
        attached: hook._Hook, monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    """A loop that slices its own batches (model(x[i:i + n]) under inference_mode, or
    sentence-transformers' encode()): each forward pass in eval mode is one inference
    batch, counted once though the model and its children are all watched (also where
    the model's forward() is called directly, past its __call__: its first child counts);
    the batch is the first tensor's first dimension, also inside a mapping (a tokenizer's
    output). A second eval() adds nothing; once the counting module is known, the other
    hooks of the model go."""
    monkeypatch.setattr(hook, "INFER_AFTER", 0.0)
    monkeypatch.setattr(hook, "INFER_BATCHES", 16)
    _no_reporter(attached)
    model = _Encoder()
    model.eval()
    model.eval()
    assert _hooks(model) == 3  # the model and its two children
    x = torch.randn(100, 8)
    passes = 0
    with torch.inference_mode():
        for _ in range(2):
            for i in range(0, 100, 7):
                batch = collections.UserDict({"x": x[i:i + 7]})
                model(batch) if call == "module" else model.forward(batch)
                passes += 1
    assert attached.infer_batches == passes == 30
    assert attached.infer_samples == 200 and attached.infer_batch_size == 2  # 100 = 14 * 7 + 2
    assert attached.phase == hook.INFERENCE
    status = attached._status()
    assert status["inference"]["batches"] == 30 and status["inference"]["batch_size"] == 2
    assert _hooks(model) == 1  # the counting one's alone
    # a second model, used after the first: its passes count too
    other = _Encoder()
    other.eval()
    with torch.inference_mode():
        for _ in range(5):
            other({"x": x[:3]})
    assert attached.infer_batches == 35


def test_a_watched_model_pickles_copies_and_scripts_as_it_was(attached: hook._Hook,
                                                              tmp_path: Path) -> None:
    """The hook's forward pre-hooks are left out of a watched model's state: torch.save of
    the whole model and deepcopy (an EMA model) hold nothing of gpuwatch, and the copies
    load and run without it; torch.jit.trace runs through them, and torch.jit.script (which
    compiles a module's hooks) removes them first."""
    import copy

    model = _Encoder()
    model.eval()
    assert _hooks(model) == 3
    path = tmp_path / "model.pt"
    torch.save(model, path)
    assert b"gpuwatch" not in path.read_bytes()
    loaded = torch.load(path, weights_only=False)
    ema = copy.deepcopy(model)
    assert _hooks(loaded) == 0 and _hooks(ema) == 0 and _hooks(model) == 3
    x = {"x": torch.ones(2, 8)}
    assert torch.equal(loaded(x), model(x)) and torch.equal(ema(x), model(x))
    traced = torch.jit.trace(model.embed, torch.ones(2, 8))
    assert torch.equal(traced(torch.ones(2, 8)), model.embed(torch.ones(2, 8)))

    def double(t: torch.Tensor) -> torch.Tensor:
        return t * 2

    torch.jit.script(double)  # a function (libraries script some at import): no change
    assert _hooks(model) == 3 and not attached.compile_called
    scripted = torch.jit.script(model.embed)
    assert _hooks(model) == 0 and attached.compile_called
    assert torch.equal(scripted(torch.ones(2, 8)), model.embed(torch.ones(2, 8)))


def test_a_training_process_leaves_its_model_unwatched(attached: hook._Hook) -> None:
    """from_pretrained() switches every model to eval mode: a process that then trains
    must lose the watch before its first training forward (an optimizer built), and its
    evaluation passes must not count as inference."""
    model = _Encoder()
    model.eval()
    assert _hooks(model) == 3
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert _hooks(model) == 0 and not attached.infer_watch
    model.train()
    for _ in range(3):
        model({"x": torch.randn(4, 8)}).sum().backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    with torch.no_grad():
        for _ in range(5):
            model({"x": torch.randn(4, 8)})
    assert _hooks(model) == 0 and attached.infer_batches == 0
    assert attached.n == 3


def test_compiling_unwatches_first_and_for_good(attached: hook._Hook,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile() removes the watch before dynamo traces anything (a wrapper removed
    after tracing would fail its guards and compile again), and nothing is watched after:
    neither the compiled module nor a model switched to eval() later."""
    model = _Encoder()
    model.eval()
    assert _hooks(model) == 3
    compiled = []
    monkeypatch.setattr(hook, "_hook_compiler", lambda: compiled.append(_hooks(model)))
    wrapped = hook._wrap_compile(lambda m, **kw: m)
    assert wrapped(model) is model
    assert compiled == [0]
    later = _Encoder()
    later.eval()
    assert _hooks(later) == 0 and not attached.infer_watch


def test_detach_removes_the_watch(tmp_path: Path) -> None:
    assert hook.attach(str(tmp_path / "nobody.sock"))
    model = _Encoder()
    try:
        model.eval()
        assert _hooks(model) == 3
    finally:
        hook.detach()
    assert _hooks(model) == 0


def test_forward_passes_of_dataloader_batches_count_once(attached: hook._Hook,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Inference over a DataLoader: its batches count (as before), the model's passes do
    not count them again."""
    monkeypatch.setattr(hook, "INFER_AFTER", 0.0)
    _no_reporter(attached)
    model = _Encoder()
    model.eval()
    loader = torch.utils.data.DataLoader(torch.randn(80, 8), batch_size=8)
    with torch.inference_mode():
        for batch in loader:
            model({"x": batch})
    assert attached.infer_batches == 10 and attached.infer_samples == 80


def test_an_evaluation_before_training_is_evaluation_once_the_process_trains(
        attached: hook._Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    """trainer.evaluate() before train(), eval_on_start, Lightning's validate() before
    fit(): batches before any backward() make the process look like it serves a model (the
    inference phase), until its first iteration ends. Then that time is evaluation's up to
    its loader's last batch (a compilation after it keeps its own seconds; the training's
    set-up and first iteration are start-up's), its batches and samples are evaluation's,
    the training loader's batches are not (two micro-batches here), and no report says
    inference again."""
    monkeypatch.setattr(hook, "INFER_AFTER", 0.0)
    monkeypatch.setattr(hook, "INFER_BATCHES", 4)
    _no_reporter(attached)
    model = torch.nn.Linear(8, 1)
    ev = torch.utils.data.DataLoader(torch.randn(40, 8), batch_size=4)
    train = torch.utils.data.DataLoader(torch.randn(64, 8), batch_size=16)
    t0 = time.perf_counter()
    model.eval()
    with torch.no_grad():
        for batch in ev:
            model(batch)
            time.sleep(0.01)
    evaluated = time.perf_counter() - t0
    assert attached.phase == hook.INFERENCE
    assert attached._status()["inference"]["batches"] == 10
    attached.interrupt(hook.COMPILE)  # dynamo compiling the training step, say
    time.sleep(0.1)
    attached.resume()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    time.sleep(0.1)  # the training's set-up: start-up's, not the evaluation's
    it = iter(train)
    for _ in range(2):  # two optimizer steps of two micro-batches each
        for _ in range(2):
            model(next(it)).sum().backward()
        opt.step()
        opt.zero_grad()
    status, seconds = attached._status(), attached._phase_seconds()
    assert status["phase"] == hook.TRAIN and status["inference"] == {}
    assert "inference" not in seconds or seconds["inference"] == 0.0
    assert evaluated * 0.9 <= seconds["eval"] <= evaluated + 0.05, (seconds, evaluated)
    assert seconds["compile"] >= 0.1 and seconds["startup"] >= 0.1, seconds
    assert status["eval"] == {"batches": 10, "samples": 40, "batch_size": 4,
                              "wait_seconds": status["eval"]["wait_seconds"]}
    assert attached.n == 2 and attached.framework.looked  # looked for again, from training
    # each iteration's samples: its own micro-batches, not the evaluation's before them
    assert [r[3] for r in attached.pending] == [32, 32]


def test_an_evaluation_before_training_ends_with_its_last_generate_not_its_loaders_end(
        attached: hook._Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    """Accelerate's DataLoaderShard (the loaders of the Trainer) fetches one batch ahead:
    the loader under it ends before the last batch is worked on. Seq2SeqTrainer.evaluate()
    before train() generates on that last batch after its loader's end; the evaluation
    ahead of training ends when that generate() does (on an H200, one generate() of 16
    was a second the loader's end left out), its batches counted once each."""
    monkeypatch.setattr(hook, "INFER_AFTER", 0.0)
    monkeypatch.setattr(hook, "INFER_BATCHES", 4)
    _no_reporter(attached)
    model = torch.nn.Linear(8, 1)

    def slow_generate(self: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
        time.sleep(0.1)  # a generation's seconds
        return input_ids

    generate = hook._wrap_generate(slow_generate)
    ev = torch.utils.data.DataLoader(torch.randn(24, 8), batch_size=4)
    t0 = time.perf_counter()
    model.eval()
    with torch.no_grad():
        it = iter(ev)
        batch = next(it)
        while batch is not None:
            ahead = next(it, None)  # the batch after it, fetched first
            generate(model, batch)
            batch = ahead
    evaluated = time.perf_counter() - t0
    assert attached.phase == hook.INFERENCE
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    time.sleep(0.2)  # the training's set-up: start-up's
    for batch in torch.utils.data.DataLoader(torch.randn(32, 8), batch_size=16):
        model(batch).sum().backward()
        opt.step()
        opt.zero_grad()
    status, seconds = attached._status(), attached._phase_seconds()
    assert status["phase"] == hook.TRAIN and "inference" not in seconds
    assert evaluated - 0.03 <= seconds["eval"] <= evaluated + 0.03, (seconds, evaluated)
    assert seconds["startup"] >= 0.2, seconds
    assert (status["eval"]["batches"], status["eval"]["samples"]) == (6, 24)


def test_a_watched_forward_that_fails_to_count_still_runs(attached: hook._Hook,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """The count guards itself: a bug of ours is counted, the forward pass runs, and the
    next pass counts again."""
    _no_reporter(attached)
    model = _Encoder()
    model.eval()

    def broken(*args: object) -> None:
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(hook._Hook, "inference_work", broken)
    errors = attached.errors
    with torch.inference_mode():
        out = model({"x": torch.ones(3, 8)})
    assert out.shape == (3, 4)
    assert attached.errors > errors
    monkeypatch.undo()
    with torch.inference_mode():
        model({"x": torch.ones(3, 8)})
    assert attached.infer_batches == 1


def test_attaching_after_transformers_is_imported_wraps_its_eval_at_once(tmp_path: Path
                                                                         ) -> None:
    """transformers 5's PreTrainedModel.eval bypasses Module.eval: the hook wraps it too,
    at attach() where transformers was imported first (from_pretrained()'s eval() may come
    before the reporting thread's first report), and detach() gives it back."""
    modeling = pytest.importorskip("transformers.modeling_utils")
    assert hook.attach(str(tmp_path / "nobody.sock"))
    try:
        assert getattr(modeling.PreTrainedModel.__dict__["eval"], "_gpuwatch", False)
    finally:
        hook.detach()
    assert not getattr(modeling.PreTrainedModel.__dict__["eval"], "_gpuwatch", False)


class _Wrapper(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = inner
        self.out = torch.nn.Linear(4, 2)

    def forward(self, features: dict) -> torch.Tensor:
        return self.out(self.encoder(features))


def test_a_model_around_a_watched_one_counts_each_pass_once(attached: hook._Hook,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """from_pretrained() switches the inner model to eval() first, then a wrapper around it
    (sentence-transformers' model around its BERT) is switched too: the wrapper takes over
    (the inner model's own watch goes), and a part of a watched model switched on its own
    adds nothing."""
    _no_reporter(attached)
    inner = _Encoder()
    inner.eval()
    assert _hooks(inner) == 3
    outer = _Wrapper(inner)
    outer.eval()
    inner.head.eval()
    assert _hooks(inner.head) == 0 and _hooks(inner.embed) == 0
    with torch.inference_mode():
        for _ in range(10):
            outer({"x": torch.ones(3, 8)})
    assert attached.infer_batches == 10


def test_a_loss_that_cannot_be_read_is_said_once_and_not_read_again(
        attached: hook._Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loss whose memory was taken back before the reporter read it (as CUDA graphs'
    trees do with a compiled step's outputs at its next replay; here its storage freed,
    as FSDP frees a parameter's): that step goes without a loss, the failure is said once
    as a problem, and no loss is read again. Before, every such report counted an error of
    the hook's own, and a hundred turned the hook off within a minute: the steps, the data
    wait and every other fact went with it."""
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.1)
    report = _sent_steps(attached, monkeypatch)

    def iteration(free: bool = False) -> None:
        loss = (w * w).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if free:
            loss.detach().untyped_storage().resize_(0)
    iteration()
    report()
    iteration()
    iteration(free=True)
    report()
    for _ in range(3):
        iteration()
        report()
    sent = report()
    steps = [s for batch in sent for s in batch]
    assert [s.step for s in steps] == list(range(6))
    # the first report read its step's loss; the second's newest step's could not be
    # read, and none was read after
    assert steps[0].loss is not None and all(s.loss is None for s in steps[1:])
    assert attached.loss_off and attached.errors == 0 and not attached.off
    (said,) = [p for p in attached.problems.as_list() if p["what"] == "loss"]
    assert "not allocated" in said["error"]


def test_a_loss_of_a_tensor_subclass_is_not_read(attached: hook._Hook,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A loss that is a tensor subclass (a DTensor under tensor parallelism's
    loss_parallel(), whose reads run its own dispatch and may redistribute) is not read
    on the reporting thread: no loss, no problem, no error; a plain loss after it is."""
    class Wrapped(torch.Tensor):
        pass
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.1)
    report = _sent_steps(attached, monkeypatch)
    loss = (w * w).sum().as_subclass(Wrapped)
    loss.backward()
    opt.step()
    report()
    plain = (w * w).sum()
    plain.backward()
    opt.step()
    sent = report()
    steps = [s for batch in sent for s in batch]
    assert [s.loss for s in steps] == [None, pytest.approx(plain.item())]
    assert attached.errors == 0 and not attached.loss_off
    assert not [p for p in attached.problems.as_list() if p["what"] == "loss"]


def test_a_parametrized_conv_weight_is_not_computed_by_the_reporter(
        attached: hook._Hook) -> None:
    """A conv under spectral_norm: reading its weight runs the parametrization, whose
    power iteration updates the module's buffers in training mode. The settings read
    (as the reporting thread reads them) leave the module as it was, and take the
    memory format from a plain conv where there is one."""
    sn = torch.nn.utils.parametrizations.spectral_norm(torch.nn.Conv2d(3, 8, 3))
    plain = torch.nn.Conv2d(8, 8, 3).to(memory_format=torch.channels_last)
    net = torch.nn.Sequential(sn, plain).train()
    before = {k: v.clone() for k, v in sn.state_dict().items()}
    cfg = attached._config()
    assert cfg["uses_conv"] is True and cfg["channels_last"] is True
    after = sn.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    del net



def test_no_device_read_while_a_cuda_graph_is_captured(
        attached: hook._Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a CUDA graph is captured (torch's default capture mode fails when another
    thread makes an unsafe CUDA call meanwhile: an event query, a pinned allocation) the
    reporter reads nothing from a device: its steps go, the loss is read at a report
    after the capture. The capture's count is kept by the wrappers of
    CUDAGraph.capture_begin/capture_end, which give it back when the call fails
    (tests/test_hook_gpu.py captures real graphs beside the 2-ms reporter)."""
    from gpuwatch.job.hook import core
    graph_cls = torch.cuda.graphs.CUDAGraph
    assert graph_cls.capture_begin.__wrapped__ is not None  # wrapped by attach()
    with pytest.raises((TypeError, AttributeError, RuntimeError)):  # (no CUDA here: it fails)
        graph_cls.capture_begin(object())
    assert core._captures == 0
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.1)
    report = _sent_steps(attached, monkeypatch)
    (w * w).sum().backward()
    opt.step()
    monkeypatch.setattr(core, "_captures", 1)  # as capture_begin leaves it, mid-capture
    report()
    monkeypatch.setattr(core, "_captures", 0)  # capture_end
    (w * w).sum().backward()
    opt.step()
    steps = [s for batch in report() for s in batch]
    assert [s.step for s in steps] == [0, 1]
    assert steps[0].loss is None and steps[1].loss is not None
    assert attached.errors == 0


def test_a_forked_child_does_not_inherit_the_reporters_locks(attached: hook._Hook) -> None:
    """A DataLoader worker forked while the reporter held one of the hook's locks (its
    late patches, its CUDA calls): the child gets them anew, free, and would not wait
    on them for good (e.g. importing transformers' generation module in the worker)."""
    from gpuwatch.job.hook import core
    held, release = threading.Event(), threading.Event()

    def reporter() -> None:
        with core._late_lock, core._capture_lock:
            held.set()
            release.wait(10)
    t = threading.Thread(target=reporter)
    t.start()
    try:
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:  # the child: both locks free
            ok = core._late_lock.acquire(timeout=2) and core._capture_lock.acquire(timeout=2)
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        t.join(10)
    assert os.waitstatus_to_exitcode(status) == 0
