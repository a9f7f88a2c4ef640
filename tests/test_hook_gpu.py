"""The hook on a real GPU (run on the lent machine; skipped where there is no CUDA).

- the shared workload (``$GPUWATCH_WORKLOAD``, skipped if unset) under ``gpuwatch run``,
  compared with its own ``--steps-out``: fp16 with a learning rate that makes the loss
  scale collapse (skipped steps, decided on the GPU by fused AdamW, counted exactly), and
  an input-bound run (``--workers 0 --cpu-ms 2``: the data-wait share must be high and
  agree with the workload's own);
- two ranks with NCCL under torchrun, one GPU each (skipped with fewer than two GPUs);
- the loss, read by the reporting thread with no device synchronization
  (``torch.cuda.set_sync_debug_mode("error")``), equal to the loop's own.

Each test prints what it saw.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs CUDA")]

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "tests" / "scripts" / "train_cpu.py")
RUN = [sys.executable, "-m", "gpuwatch", "run", "--web.listen-address", "127.0.0.1:0",
       "--quiet"]
WORKLOAD = os.environ.get("GPUWATCH_WORKLOAD")
needs_workload = pytest.mark.skipif(not WORKLOAD, reason="set GPUWATCH_WORKLOAD to workload.py")


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH")}
    e["PYTHONPATH"] = str(REPO)
    return e


def lines(path: Path, kind: str) -> list[dict]:
    out = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [x for x in out if x.get("kind") == kind]


def totals(path: Path, pid: int | None = None) -> tuple[int, int]:
    """(steps, skipped) over a recording's `step` and `steps` lines (a job over 20 steps
    a second gets the rest of each second summed in one `steps` line), of ``pid`` only
    where given."""
    n = skipped = 0
    for d in lines(path, "step"):
        if pid is None or d.get("pid") == pid:
            n += 1
            skipped += bool(d.get("skipped"))
    for d in lines(path, "steps"):
        if pid is None or d.get("pid") == pid:
            n += d["steps"]
            skipped += d.get("skipped") or 0
    return n, skipped


def skipped_by_scale(truth: list[dict], init: float = 65536.0) -> list[bool]:
    """The workload records the scale after each update(); a skip halves it.

    Once the scale has underflowed to 0.0, halving can't show: a step is then skipped
    exactly when its gradients are not finite, i.e. while the loss is NaN/inf (the
    workload logs the loss every 10th step; the last logged loss stands for the steps
    after it).
    """
    out, prev, loss = [], init, 0.0
    for s in truth:
        if "loss" in s and s["loss"] is not None:
            loss = s["loss"]
        if prev == 0.0 and s["loss_scale"] == 0.0:
            out.append(not math.isfinite(loss))
        else:
            out.append(s["loss_scale"] < prev)
        prev = s["loss_scale"]
    return out


def run_workload(tmp_path: Path, *flags: str) -> tuple[list[dict], list[dict], list[dict]]:
    truth, rec = tmp_path / "truth.jsonl", tmp_path / "rec.jsonl"
    run = subprocess.run([*RUN, "--record", str(rec), "--", sys.executable, WORKLOAD,
                          "--seconds", "20", "--steps-out", str(truth), *flags],
                         check=False, env=env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return lines(truth, "step"), lines(rec, "step"), lines(rec, "config")


@needs_workload
def test_fp16_loss_scale_collapse_counts_every_skipped_step(tmp_path: Path) -> None:
    truth, got, config = run_workload(tmp_path, "--precision", "fp16", "--lr", "5")
    want = skipped_by_scale(truth)
    have = [bool(s.get("skipped")) for s in got]
    # the last known scale, from step lines and the seconds summed in steps lines alike
    both = sorted(got + lines(tmp_path / "rec.jsonl", "steps"), key=lambda s: s["t"])
    scales = [s["loss_scale"] for s in both if s.get("loss_scale") is not None]
    print(f"workload: {len(truth)} steps, {sum(want)} skipped, last scale "
          f"{truth[-1]['loss_scale']}; gpuwatch: {len(got)} steps, {sum(have)} skipped, "
          f"last scale {scales[-1] if scales else None}; config {config[-1] if config else None}")
    # every step counted, and every skip, in step lines or in the seconds summed
    assert totals(tmp_path / "rec.jsonl") == (len(truth), sum(want))
    assert sum(want) > 0
    # the steps that kept their own line are exactly the workload's
    by_step = {s["step"]: w for s, w in zip(truth, want, strict=True)}
    assert have == [by_step[s["step"]] for s in got]
    assert scales and scales[-1] == truth[-1]["loss_scale"]
    assert config[-1]["fused_optimizer"] is True and config[-1]["autocast_dtype"] == "float16"
    mem = [s for s in got if s.get("mem_allocated_bytes") is not None]
    assert mem and mem[-1]["max_mem_allocated_bytes"] >= mem[-1]["mem_allocated_bytes"] > 0


@needs_workload
def test_input_bound_run_shows_a_high_data_wait_share(tmp_path: Path) -> None:
    truth, got, config = run_workload(tmp_path, "--workers", "0", "--cpu-ms", "2",
                                      "--precision", "bf16")
    share = sum(s["data_wait_seconds"] for s in truth) / sum(s["step_seconds"] for s in truth)
    timed = [s for s in got if s.get("step_seconds") is not None]
    mine = sum(s["data_wait_seconds"] for s in timed) / sum(s["step_seconds"] for s in timed)
    print(f"workload: {len(truth)} steps, data wait {share:.1%}; gpuwatch: {len(got)} steps, "
          f"data wait {mine:.1%}; config {config[-1] if config else None}")
    assert totals(tmp_path / "rec.jsonl")[0] == len(truth)
    assert mine > 0.5
    assert mine == pytest.approx(share, abs=0.05)
    assert config[-1]["num_workers"] == 0


def test_two_ranks_on_two_gpus_under_torchrun(tmp_path: Path) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    truth, rec = tmp_path / "truth.jsonl", tmp_path / "rec.jsonl"
    run = subprocess.run([*RUN, "--record", str(rec), "--", sys.executable, "-m",
                          "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                          "127.0.0.1", "--master-port", str(port), TRAIN, "--dist", "--device",
                          "cuda", "--steps", "200", "--workers", "2", "--scaler", "fused",
                          "--inf-every", "7", "--out", str(truth)],
                         check=False, env=env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    got = lines(rec, "step")
    for rank in (0, 1):
        expected = lines(Path(f"{truth}.{rank}"), "step")
        mine = [s for s in got if s.get("pid") == expected[0]["pid"]]
        gpus = {s.get("gpu") for s in mine}
        print(f"rank {rank}: pid {expected[0]['pid']}, {len(mine)} steps, "
              f"{sum(bool(s.get('skipped')) for s in mine)} skipped, gpus {gpus}")
        # every step and skip counted (step lines and the seconds summed in steps lines);
        # the steps that kept their own line match the script's, flag for flag
        assert totals(rec, expected[0]["pid"]) == (
            len(expected), sum(bool(s["skipped"]) for s in expected))
        by_step = {s["step"]: bool(s["skipped"]) for s in expected}
        assert [bool(s.get("skipped")) for s in mine] == [by_step[s["step"]] for s in mine]
        assert {s.get("rank") for s in mine} == {rank}
        assert len(gpus) == 1 and None not in gpus
    assert len({s.get("gpu") for s in got}) == 2  # one GPU each


def test_the_loss_is_read_without_a_device_sync(tmp_path: Path) -> None:
    """fp16 autocast, GradScaler and fused Adam on the GPU; every op of the loop and of the
    hook's reporting thread runs under sync debug mode "error" (a sync would raise, and the
    hook would count it in hook_errors). The hook's losses must be the loop's own, exactly
    (both read from the same float32 tensor after the loop)."""
    from gpuwatch.job.hook import core as hook
    from gpuwatch.job.receiver import HookReceiver
    from gpuwatch.samples import StepSample
    from gpuwatch.store import Store

    store = Store()
    path = str(tmp_path / "hook.sock")
    receiver = HookReceiver(store, path)
    receiver.start()
    assert hook.attach(path)
    try:
        dev = torch.device("cuda")
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 1)).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
        scaler = torch.amp.GradScaler("cuda")
        x, y = torch.randn(64, 256, device=dev), torch.randn(64, 1, device=dev)
        losses = []
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(400):
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = torch.nn.functional.mse_loss(model(x).float(), y)
                opt.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                losses.append(loss.detach().clone())
                time.sleep(0.005)  # 2 s of steps: several reports, each reading a loss
        finally:
            torch.cuda.set_sync_debug_mode(0)
        h = hook._hook
        assert h is not None
        h.finish()
        errors = h.errors
    finally:
        hook.detach()
        receiver.flush()
        receiver.stop()
    truth = [float(t) for t in losses]
    got = {s.step: s.loss for s in store.timeline() if isinstance(s, StepSample)
           and s.loss is not None}
    print(f"hook errors {errors}; losses read at steps {sorted(got)}")
    assert errors == 0
    assert len(got) >= 3
    assert all(v == truth[k] for k, v in got.items())


def test_memory_is_read_at_the_end_of_an_iteration(tmp_path: Path) -> None:
    """The allocator's counters go out as an iteration's end left them, not as the report
    found them: each step here holds 64 MiB of activations for 10 ms before its backward(),
    where a reporting thread reading at its own moment lands most of the time. Every value
    sent must be one the loop itself read right after an optimizer step."""
    from gpuwatch.job.hook import core as hook
    from gpuwatch.job.receiver import HookReceiver
    from gpuwatch.samples import StepSample, StepsSample
    from gpuwatch.store import Store

    store = Store()
    path = str(tmp_path / "hook.sock")
    receiver = HookReceiver(store, path)
    receiver.start()
    assert hook.attach(path)
    ends: set[int] = set()
    try:
        dev = torch.device("cuda")
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                    torch.nn.Linear(4096, 1)).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        x, y = torch.randn(4096, 1024, device=dev), torch.randn(4096, 1, device=dev)
        t_end = time.monotonic() + 3.0
        while time.monotonic() < t_end:
            loss = torch.nn.functional.mse_loss(model(x), y)  # 4096 x 4096 floats held
            torch.cuda.synchronize()
            time.sleep(0.01)  # most of the step: the activations are held
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            ends.add(torch.cuda.memory_allocated(dev))
        h = hook._hook
        assert h is not None
        h.finish()
    finally:
        hook.detach()
        receiver.flush()
        receiver.stop()
    sent = [(s.mem_allocated_bytes, s.max_mem_allocated_bytes) for s in store.timeline()
            if isinstance(s, (StepSample, StepsSample))
            and getattr(s, "mem_allocated_bytes", None) is not None]
    print(f"the loop's step-end values {sorted(ends)}; sent {sorted(set(sent))}")
    assert len(sent) >= 3
    assert {a for a, _ in sent} <= ends
    peak = torch.cuda.max_memory_allocated(dev)
    assert all(a < p <= peak for a, p in sent)


@pytest.mark.parametrize("variant", ["sgd", "scaler", "sparse", "nostep", "graphs"])
def test_a_job_reported_on_every_2_ms_ends_as_it_would_alone_on_the_gpu(
        tmp_path: Path, variant: str) -> None:
    """tests/test_hook_races.py on the GPU: the reporting thread every 2 ms beside a loop
    stepping as fast as CUDA lets it (the scaler's skip flags, its scale and the loss read
    through the reporter's non-blocking copies). Before, its ``param.grad`` reads raced
    autograd's accumulation and could corrupt the job's heap. ``graphs`` also captures a
    CUDA graph in torch's default global mode every 20 iterations, which any unsafe CUDA
    call of the reporter's meanwhile (its event query, its pinned buffer) would fail."""
    rec, out = tmp_path / "rec.jsonl", tmp_path / "truth.json"
    run = subprocess.run([*RUN, "--record", str(rec), "--", sys.executable,
                          str(REPO / "tests" / "scripts" / "hook_race.py"), "--variant", variant,
                          "--device", "cuda", "--seconds", "3", "--out", str(out)],
                         env={**env(), "PYTHONFAULTHANDLER": "1"}, capture_output=True,
                         text=True, timeout=180, check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    steps = json.loads(out.read_text())["steps"]
    counted, skipped = totals(rec)
    cfg = lines(rec, "config")[-1]
    print(f"{variant} on the GPU: {steps} iterations, {counted} counted, {skipped} skipped, "
          f"sparse_grads {cfg.get('sparse_grads')}, device {cfg.get('device')}")
    assert steps > 200 and counted == steps
    if variant != "nostep":  # (the optimizer's first parameter's device)
        assert str(cfg.get("device")).startswith("cuda")
    assert cfg.get("sparse_grads") is {"sgd": False, "scaler": False, "sparse": True,
                                       "nostep": None}[variant]
