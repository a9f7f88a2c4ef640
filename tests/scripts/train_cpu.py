"""A tiny but real training loop for the hook's tests: a DataLoader with workers, an
optimizer, optionally a GradScaler (with forced skips), autocast, checkpointing, gloo DDP.

It measures itself like the shared workload does (one JSON line per iteration to --out,
with the trace's step field names) so tests can compare what gpuwatch received with the
ground truth. --crash makes it fail in the ways a job fails. Nothing here knows gpuwatch
unless --attach is given.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import signal
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--cpu-ms", type=float, default=0.0, help="busy CPU time per sample")
p.add_argument("--step-ms", type=float, default=0.0, help="sleep per iteration (the 'GPU')")
p.add_argument("--scaler", choices=["none", "plain", "fused"], default="none")
p.add_argument("--inf-every", type=int, default=0, help="make every Nth loss inf (skips)")
p.add_argument("--nan-from", type=int, default=-1,
               help="from this step on the loss is NaN (the weights then follow: divergence)")
p.add_argument("--autocast", choices=["none", "bf16"], default="none")
p.add_argument("--checkpoint", action="store_true", help="use torch.utils.checkpoint")
p.add_argument("--params", choices=["fp32", "bf16"], default="fp32",
               help="bf16: model.to(torch.bfloat16), the inputs cast with it (no autocast)")
p.add_argument("--dist", action="store_true", help="DDP from torchrun's environment")
p.add_argument("--find-unused", action="store_true",
               help="DistributedDataParallel(find_unused_parameters=True)")
p.add_argument("--unused", action="store_true", help="a layer the forward pass never uses")
p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
               help="cuda: the model on cuda:LOCAL_RANK, NCCL for --dist")
p.add_argument("--crash", choices=["none", "exception", "exit3", "sigkill", "sigterm", "oom"],
               default="none")
p.add_argument("--crash-at", type=int, default=5)
p.add_argument("--print-every", type=int, default=0, help="print a line every N steps")
p.add_argument("--attach", action="store_true", help="call gpuwatch.torch.attach()")
p.add_argument("--gc-every", type=int, default=0, help="gc.collect() every N steps")
p.add_argument("--empty-cache-every", type=int, default=0,
               help="torch.cuda.empty_cache() every N steps")
p.add_argument("--out", default=None, help="ground truth: one JSON line per iteration")
p.add_argument("--result", default=None, help="the final parameters, to compare runs")
p.add_argument("--count-sigint", default=None,
               help="count SIGINTs into this file; the first one ends training cleanly")
a = p.parse_args()

if a.attach:
    import gpuwatch.torch

    gpuwatch.torch.attach()

torch.manual_seed(0)
rank = 0
dev = torch.device("cpu")
if a.device == "cuda":
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
if a.dist:
    import torch.distributed as dist

    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    rank = dist.get_rank()


class Synthetic(Dataset):
    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int):
        if a.cpu_ms > 0:
            end = time.perf_counter() + a.cpu_ms / 1000.0
            while time.perf_counter() < end:
                pass
        g = torch.Generator().manual_seed(i)
        x = torch.randn(16, generator=g)
        return x, x.sum(dim=0, keepdim=True)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.b = nn.Linear(32, 1)
        self.spare = nn.Linear(4, 4) if a.unused else None

    def forward(self, x):
        h = torch.utils.checkpoint.checkpoint(self.a, x, use_reentrant=False) \
            if a.checkpoint else self.a(x)
        return self.b(h)


param_dtype = torch.bfloat16 if a.params == "bf16" else torch.float32
model = Net().to(dev, dtype=param_dtype)
if a.dist:
    model = nn.parallel.DistributedDataParallel(model, find_unused_parameters=a.find_unused)
if a.scaler == "fused":
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
else:
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler(dev.type, enabled=a.scaler != "none")
loader = DataLoader(Synthetic(), batch_size=a.batch, num_workers=a.workers,
                    persistent_workers=a.workers > 0, shuffle=False)
stop_requested = []
if a.count_sigint:
    def on_sigint(_signum: int, _frame: object) -> None:
        stop_requested.append(1)
        with open(a.count_sigint, "w") as f:
            f.write(str(len(stop_requested)))

    signal.signal(signal.SIGINT, on_sigint)
if a.out and a.dist:
    a.out = f"{a.out}.{rank}"
out = open(a.out, "w") if a.out else None  # noqa: SIM115 - closed at the end or by a crash
t_iter = time.perf_counter()  # creating the iterator (starting workers) is waiting for data
it = iter(loader)
for step in range(a.steps):
    if stop_requested:
        time.sleep(1.0)  # long enough for a duplicate SIGINT to land, if one were sent
        break
    if step == a.crash_at and a.crash != "none":
        if out:
            out.flush()
        if a.crash == "exception":
            raise ValueError("the test job failed on purpose")
        if a.crash == "exit3":
            sys.exit(3)
        if a.crash == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if a.crash == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        if a.crash == "oom":
            torch.empty(2**62, dtype=torch.uint8)  # a real allocator failure
    t0 = time.perf_counter() if step else t_iter
    x, y = next(it)
    t1 = time.perf_counter()
    x, y = x.to(dev, dtype=param_dtype), y.to(dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
        loss = nn.functional.mse_loss(model(x).float(), y)
    if a.inf_every and step % a.inf_every == a.inf_every - 1:
        loss = loss * float("inf")
    if 0 <= a.nan_from <= step:
        loss = loss * float("nan")
    opt.zero_grad(set_to_none=True)
    scale_before = scaler.get_scale() if scaler.is_enabled() else None
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    if a.gc_every and step % a.gc_every == 0:
        gc.collect()
    if a.empty_cache_every and step % a.empty_cache_every == 0:
        torch.cuda.empty_cache()
    skipped = scaler.is_enabled() and scaler.get_scale() < scale_before
    if a.step_ms:
        time.sleep(a.step_ms / 1000.0)
    t2 = time.perf_counter()
    if out:
        out.write(json.dumps({"t": time.time(), "kind": "step", "step": step, "rank": rank,
                              "pid": os.getpid(),
                              "step_seconds": t2 - t0, "data_wait_seconds": t1 - t0,
                              "batch_size": a.batch, "skipped": bool(skipped),
                              "loss": loss.item() if math.isfinite(loss.item()) else None,
                              "loss_scale": scaler.get_scale() if scaler.is_enabled() else None})
                  + "\n")
    if a.print_every and step % a.print_every == 0:
        print(f"train step {step} loss {loss.item():.4f} done", flush=True)
if out:
    out.close()
if a.result:
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, a.result)
if a.dist:
    dist.destroy_process_group()
if "gpuwatch.job.hook.core" in sys.modules:  # attached, explicitly or by `gpuwatch run`
    from gpuwatch.job.hook import core as hook

    print("gpuwatch-hook-stats " + json.dumps(hook.stats()), file=sys.stderr)
print(f"trained {step + 1} steps", file=sys.stderr)
