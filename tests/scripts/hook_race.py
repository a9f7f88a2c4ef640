"""A training loop stepping as fast as it can while the injected hook reports every
2 ms (500 times its usual rate), so that anything the reporting thread reads while the
training thread runs autograd without the GIL is read thousands of times a second.

Variants (--variant):
  sgd     plain SGD on a Linear, one backward() and one step an iteration (SGD is one of
          the optimizers whose parameters the hook looks at for sparse gradients)
  scaler  a GradScaler on the CPU, autocast to bfloat16, Adam over a small conv net (the
          scale, the skip flags and the conv weights' format are read) and an evaluation
          under no_grad every 200 iterations
  sparse  an EmbeddingBag with sparse gradients under SGD (sparse .grad tensors)
  nostep  no optimizer: backward() then an in-place update, so backward() ends clock
  graphs  (CUDA only) sgd, and at every 20th iteration a new CUDA graph captured in torch's
          default "global" mode (any other thread's unsafe CUDA call meanwhile, an event
          query or a pinned allocation, fails the capture) and replayed

--device cuda runs it on the GPU (the scaler variant then in float16, its skip flags and
scale read by the reporter through its non-blocking copies).

Writes its own count of iterations to --out as JSON: {"steps": N}."""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn

try:  # the hook is injected by `gpuwatch run`; alone, the script still runs
    from gpuwatch.job import sender
    sender.REPORT_INTERVAL = 0.002
except ImportError:
    pass

p = argparse.ArgumentParser()
p.add_argument("--variant", choices=("sgd", "scaler", "sparse", "nostep", "graphs"), default="sgd")
p.add_argument("--seconds", type=float, default=3.0)
p.add_argument("--device", default="cpu")
p.add_argument("--out", required=True)
args = p.parse_args()
torch.manual_seed(0)
dev = torch.device(args.device)
steps = 0


def until() -> float:
    """The loop's deadline, from when the variant is set up (CUDA's start-up not in it)."""
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() + args.seconds


if args.variant in ("sgd", "graphs"):
    model = nn.Linear(4, 1).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.ones(1, 4, device=dev)
    graphs = args.variant == "graphs"
    if graphs and dev.type != "cuda":
        raise SystemExit("--variant graphs needs --device cuda")
    static = torch.ones(256, device=dev)
    deadline = until()
    while time.perf_counter() < deadline:
        opt.zero_grad(set_to_none=True)
        model(x).sum().backward()
        opt.step()
        steps += 1
        if graphs and steps % 20 == 0:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up on a side stream, as torch's docs do
                static * 2
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):  # capture_error_mode="global", the default
                out = static * 2 + 1
            g.replay()
elif args.variant == "scaler":
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 1)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(dev.type)
    x = torch.randn(2, 3, 8, 8, device=dev)
    half = torch.float16 if dev.type == "cuda" else torch.bfloat16
    deadline = until()
    while time.perf_counter() < deadline:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=half):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        steps += 1
        if steps % 200 == 0:
            with torch.no_grad():
                model(x)
elif args.variant == "sparse":
    table = nn.EmbeddingBag(1000, 8, mode="sum", sparse=True).to(dev)
    opt = torch.optim.SGD(table.parameters(), lr=0.1)
    ids, offsets = torch.tensor([1, 5, 7, 9], device=dev), torch.tensor([0, 2], device=dev)
    deadline = until()
    while time.perf_counter() < deadline:
        opt.zero_grad(set_to_none=True)
        table(ids, offsets).sum().backward()
        opt.step()
        steps += 1
else:
    w = torch.zeros(4, requires_grad=True, device=dev)
    x = torch.ones(4, device=dev)
    deadline = until()
    while time.perf_counter() < deadline:
        (w * x).sum().backward()
        with torch.no_grad():
            w -= 1e-3 * w.grad
            w.grad = None
        steps += 1

if dev.type == "cuda":
    torch.cuda.synchronize()
with open(args.out, "w") as f:
    json.dump({"steps": steps}, f)
