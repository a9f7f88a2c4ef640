"""What the torch hook costs a training step, with and without it, side by side in one run.

    python3 benchmarks/bench_hook.py [--steps 3000] [--repeats 5] [--out FILE]
    python3 benchmarks/bench_hook.py --micro-only      # only the hook's own code paths
    python3 benchmarks/bench_hook.py --micro-only --passes 9   # nine passes, the median one

1. A tiny training loop (DataLoader ``next()``, forward, backward, optimizer step; on CUDA
   with a GradScaler and a fused optimizer), timed per step, in alternating blocks with the
   hook detached and attached (so drift hits both alike); the median per-step time of each
   and the difference. A real receiver listens, so reports are really sent.
2. The hook's own per-step code paths, called directly in a loop (µs per call): the
   optimizer-step hook, the scaler's update, the DataLoader ``next()`` wrapper's overhead.
   ``--passes N`` measures them N times, each pass with a fresh hook, and reports the pass
   of median per-step total beside every pass's total: on a shared host whole passes run
   at one of two levels (docs/benchmarks.md), so one pass alone is a draw.
3. On CUDA, the hooked steps run under ``torch.cuda.set_sync_debug_mode("error")``: any
   device synchronization, by the loop or by the hook (its reporting thread included),
   would raise; the table says whether any did.

Prints a Markdown table; ``--out FILE`` also writes the numbers as JSON. Target: < 10 µs
of hook cost per step.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn

from gpuwatch.job.hook import core as hook


def make_loop(device: str) -> tuple[Any, Any]:
    torch.manual_seed(0)
    dev = torch.device(device)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)).to(dev)
    cuda = dev.type == "cuda"
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=cuda)
    scaler = torch.amp.GradScaler(dev.type, enabled=cuda)
    # the data already on the device: no host-to-device copy (and no sync) in the loop
    data = torch.utils.data.TensorDataset(torch.randn(4096, 32, device=dev),
                                          torch.randn(4096, 1, device=dev))
    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=False, drop_last=True)
    state = {"it": iter(loader)}

    def step() -> None:
        try:
            x, y = next(state["it"])
        except StopIteration:
            state["it"] = iter(loader)
            x, y = next(state["it"])
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    return step, dev


def time_steps(step: Any, n: int, cuda: bool) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)
    if cuda:
        torch.cuda.synchronize()
    return out


def loop_costs(device: str, steps: int, repeats: int, sock: str) -> dict[str, Any]:
    step, dev = make_loop(device)
    cuda = dev.type == "cuda"
    time_steps(step, 200, cuda)  # warm up: allocator, kernels, autotuning
    without: list[float] = []
    with_hook: list[float] = []
    sync_error: str | None = None
    reports = 0
    for _ in range(repeats):
        without += time_steps(step, steps, cuda)
        hook.attach(sock)
        try:
            with_hook += time_steps(step, steps, cuda)
            reports = hook.stats()["reports_sent"]
        finally:
            hook.detach()
    if cuda:
        # the sync check runs apart from the timed blocks: the debug mode itself slows
        # every CUDA call, which would be charged to the hook
        hook.attach(sock)
        errors_before = hook.stats()["hook_errors"]
        try:
            torch.cuda.set_sync_debug_mode("error")
            time_steps(step, steps, False)
            time.sleep(1.2)  # let the reporter run (and read the device) under the check
        except RuntimeError as err:
            sync_error = str(err).splitlines()[0]
        finally:
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
            hook_errors = hook.stats()["hook_errors"] - errors_before
            hook.detach()
        if hook_errors:
            sync_error = sync_error or f"{hook_errors} errors in the hook's reporter"
    med_without = statistics.median(without) * 1e6
    med_with = statistics.median(with_hook) * 1e6
    return {"device": str(dev), "steps": len(with_hook), "median_step_us_without": med_without,
            "median_step_us_with": med_with, "overhead_us": med_with - med_without,
            "reports_sent_last_block": reports,
            "sync_check": None if not cuda else (sync_error or "no sync")}


class _Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Identity(), nn.Identity()

    def forward(self, x: Any) -> Any:
        return self.b(self.a(x))


class _PlainPair(nn.Module):  # the same, of a class of its own (never wrapped)
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Identity(), nn.Identity()

    def forward(self, x: Any) -> Any:
        return self.b(self.a(x))


def micro_costs(calls: int, sock: str, rounds: int = 5) -> dict[str, float]:
    """µs per call of the hook's own per-step code, called directly: each path ``calls``
    times in each of ``rounds`` rounds, the median round. Wrappers are timed around a
    stand-in for torch's function that returns at once, less the stand-in's own time."""
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    loss = torch.ones(())
    hook.attach(sock)
    try:
        h = hook._hook
        h.thread = object()  # type: ignore[assignment]  # no reporter: measure the caller only
        # the reporter takes the step records twice a second; here they would pile up (and
        # the garbage collector would charge their growing number to the hook): keep a few
        h.pending = collections.deque(maxlen=1000)
        on_step = hook._on_optimizer_step

        from hook_standins import It, raw, raw_backward, training_facts  # (benchmarks/)

        it = It()
        # an inference loop no DataLoader feeds: a model of two children switched to eval()
        # before any training is watched (its passes counted through its class's
        # __call__); the base is a model of another class, the same code, put in eval mode
        # through train(False), which the hook does not see
        watched, plain = _Pair(), _PlainPair()
        watched.eval()
        plain.train(False)
        x = torch.zeros(4, 4)
        with torch.inference_mode():
            for _ in range(hook.INFER_BATCHES + 1):  # past start-up: an inference process
                watched(x)
        wrapped_next = hook._wrap_next(raw)
        backward = hook._wrap_backward(raw_backward)
        scale = hook._wrap_scaler_scale(raw)
        update = hook._wrap_scaler_update(raw)
        times: dict[str, list[float]] = {}

        def timed(key: str, fn: Any, *args: Any, base: float = 0.0) -> float:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            took = time.perf_counter() - t0
            times.setdefault(key, []).append((took - base) / calls * 1e6)
            return took

        with torch.inference_mode():  # first: the first backward() below unwatches it
            for _ in range(rounds):
                base = timed("raw", plain, x)
                timed("inference_forward_pass_us", watched, x, base=base)
        assert len(h.infer_watch) == 1, "the watched model's pass is what is timed"
        for _ in range(rounds):
            h.scaler_mode = False
            timed("optimizer_step_hook_us", on_step, opt, (), {})
            it._gpuwatch = training_facts()  # fresh each round
            base = timed("raw", raw, it)
            timed("dataloader_next_wrapper_us", wrapped_next, it, base=base)
            base = timed("raw", raw_backward, p)
            h.source = hook.OPTIMIZER  # what every loop with an optimizer pays
            timed("backward_wrapper_us", backward, p, base=base)
            h.source = hook.BACKWARD  # a loop without an optimizer: backward() ends iterations
            timed("backward_iteration_us", backward, p, base=base)
            h.source = hook.OPTIMIZER
            base = timed("raw", raw, scaler, loss)
            timed("scaler_scale_wrapper_us", scale, scaler, loss, base=base)
            h.scaler_mode = True
            base = timed("raw", raw, scaler, None)
            timed("scaler_update_us", update, scaler, None, base=base)
    finally:
        hook.detach()
    out = {k: statistics.median(v) for k, v in times.items() if k != "raw"}
    out["per_step_total_us"] = (out["optimizer_step_hook_us"]
                                + out["dataloader_next_wrapper_us"]
                                + out["backward_wrapper_us"])
    out["per_step_total_with_scaler_us"] = (out["scaler_update_us"]
                                            + out["dataloader_next_wrapper_us"]
                                            + out["backward_wrapper_us"]
                                            + out["scaler_scale_wrapper_us"])
    out["per_step_total_backward_clocked_us"] = (out["backward_iteration_us"]
                                                 + out["dataloader_next_wrapper_us"])
    return out


RECEIVER = """
import sys
from gpuwatch.job.receiver import HookReceiver
from gpuwatch.store import Store
receiver = HookReceiver(Store(), sys.argv[1])
receiver.start()
print("ready", flush=True)
sys.stdin.read()
receiver.stop()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3000, help="steps per block")
    ap.add_argument("--repeats", type=int, default=5, help="blocks with and without")
    ap.add_argument("--calls", type=int, default=200_000,
                    help="micro-benchmark calls per path and round")
    ap.add_argument("--rounds", type=int, default=5,
                    help="micro-benchmark rounds (the median is reported)")
    ap.add_argument("--passes", type=int, default=1,
                    help="micro-benchmark passes, each with a fresh hook (the table gives "
                         "the pass of median per-step total, and every pass's total)")
    ap.add_argument("--micro-only", action="store_true",
                    help="only the hook's own code paths (part 2): no training loop")
    ap.add_argument("--cpu", type=int, default=None,
                    help="run on this CPU only (sched_setaffinity; the receiver, a process "
                         "of its own, runs anywhere): a core that nothing else is scheduled "
                         "on gives the code's own cost")
    ap.add_argument("--out", help="also write the numbers as JSON here")
    a = ap.parse_args()
    directory = tempfile.mkdtemp(prefix="gwbench-")
    sock = os.path.join(directory, "hook.sock")
    # the receiver runs in a process of its own, as the daemon does: in this process its
    # thread would take the GIL from the loop being timed and charge that to the hook
    receiver = subprocess.Popen(
        [sys.executable, "-c", RECEIVER, sock], cwd=str(Path(__file__).resolve().parents[1]),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if receiver.stdout.readline().strip() != "ready":  # the socket is bound
        raise SystemExit("the receiver did not start")
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})  # after the receiver started: it does not inherit it
    try:
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        loops = [] if a.micro_only else [loop_costs(d, a.steps, a.repeats, sock)
                                         for d in devices]
        passes = [micro_costs(a.calls, sock, a.rounds) for _ in range(max(1, a.passes))]
        # the pass whose per-step total is the median (a pass's paths belong together:
        # on a shared host a whole pass runs faster or slower, see docs/benchmarks.md)
        passes.sort(key=lambda m: m["per_step_total_us"])
        micro = passes[(len(passes) - 1) // 2]
    finally:
        receiver.stdin.close()  # the receiver stops at end of input
        receiver.wait(timeout=30)
        shutil.rmtree(directory, ignore_errors=True)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}"
          + (f", {gpu}" if gpu else ", no GPU")
          + (f", on CPU {a.cpu} only" if a.cpu is not None else ""))
    for r in loops:
        if r is loops[0]:
            print()
            print("| device | steps | median step without hook (µs) | with hook (µs) "
                  "| difference (µs) | device syncs under the hook |")
            print("| --- | ---: | ---: | ---: | ---: | --- |")
        print(f"| {r['device']} | {r['steps']} | {r['median_step_us_without']:.1f} | "
              f"{r['median_step_us_with']:.1f} | {r['overhead_us']:+.1f} | "
              f"{r['sync_check'] or 'n/a (CPU)'} |")
    print()
    print("| hook code path (called directly) | µs per call |")
    print("| --- | ---: |")
    for key, value in micro.items():
        print(f"| {key.removesuffix('_us').replace('_', ' ')} | {value:.2f} |")
    if len(passes) > 1:
        print()
        print(f"per step total, each of {len(passes)} passes (µs, sorted): "
              + ", ".join(f"{m['per_step_total_us']:.2f}" for m in passes))
    if a.out:
        Path(a.out).write_text(json.dumps({"torch": torch.__version__, "gpu": gpu,
                                           "cpu": a.cpu, "loops": loops, "micro": micro,
                                           "passes": passes}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
