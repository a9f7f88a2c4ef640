"""A hand-written loop that does everything a framework does between its steps, timing each
part with its own clock (--out): gradient accumulation, an evaluation (model.eval() and
another DataLoader under no_grad) every few steps, a checkpoint (torch.save), optionally a
torch.compile'd model, and a frozen BatchNorm switched to eval() in every step (which is no
evaluation). ``--fail-fact`` makes one of the hook's fact readers fail (as torch 2.9+'s
legacy TF32 getters do once the new API was used); ``--break-hook`` makes the hook fail
until it switches itself off.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--accum", type=int, default=3)
p.add_argument("--eval-every", type=int, default=10)
p.add_argument("--eval-batches", type=int, default=30)
p.add_argument("--eval-ms", type=float, default=10.0)
p.add_argument("--step-ms", type=float, default=5.0)
p.add_argument("--save", action="store_true")
p.add_argument("--compile", action="store_true")
p.add_argument("--fail-fact", action="store_true")
p.add_argument("--break-hook", action="store_true")
p.add_argument("--out")
a = p.parse_args()

if a.fail_fact or a.break_hook:
    import sys

    core = sys.modules.get("gpuwatch.job.hook.core")
    if a.fail_fact:
        def broken() -> bool:
            raise RuntimeError("mix of the legacy and new APIs (as torch 2.9+ says)")
        core.facts.matmul_tf32 = broken
    if a.break_hook:
        def breaks(*_args: object, **_kw: object) -> None:
            raise ValueError("a bug of gpuwatch's own")
        core.MAX_HOOK_ERRORS = 5
        core._Hook.end_iteration = breaks  # every optimizer step: five, and it stops

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                            torch.nn.Linear(32, 1))
frozen = model[1]
run = torch.compile(model, backend="eager") if a.compile else model
opt = torch.optim.SGD(model.parameters(), lr=0.01)
n = a.steps * a.accum * 8
train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(n, 16),
                                                                    torch.randn(n, 1)),
                                    batch_size=8)
val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
    torch.randn(a.eval_batches * 4, 16), torch.randn(a.eval_batches * 4, 1)), batch_size=4)
truth = {"eval_seconds": 0.0, "save_seconds": 0.0, "steps": 0, "evals": 0}
# what a checkpoint writes: the model and a large optimizer-like state (a slow save)
state = {"pad": torch.randn(16_000_000)} if a.save else {}
it = iter(train)
eval_t0 = None  # an evaluation began: it lasts until the next training batch is asked for
for step in range(a.steps):
    for _ in range(a.accum):
        fetch = time.perf_counter()
        if eval_t0 is not None:
            truth["eval_seconds"] += fetch - eval_t0
            eval_t0 = None
        x, y = next(it)
        frozen.eval()  # a frozen layer: not an evaluation
        loss = torch.nn.functional.mse_loss(run(x), y) / a.accum
        loss.backward()
        time.sleep(a.step_ms / 1000 / a.accum)
    opt.step()
    opt.zero_grad()
    truth["steps"] += 1
    if (step + 1) % a.eval_every == 0 and step + 1 < a.steps:
        eval_t0 = time.perf_counter()
        model.eval()
        with torch.no_grad():
            for x, _y in val:
                run(x)
                time.sleep(a.eval_ms / 1000)
        model.train()
        truth["evals"] += 1
        if a.save:
            t0 = time.perf_counter()
            torch.save({"model": model.state_dict(), **state}, f"{a.out or '/tmp/phases'}.ckpt")
            spent = time.perf_counter() - t0
            truth["save_seconds"] += spent
            eval_t0 += spent  # the save is its own phase, not the evaluation's
if a.out:
    with open(a.out, "w") as f:
        json.dump(truth, f)
