"""Ranks started by multiprocessing, each a small real training loop, for the hook's
exit-report tests.

- ``--launch process``: ``multiprocessing`` ``Process`` targets with ``--start-method``
  fork, forkserver or spawn (fork and forkserver children leave by ``os._exit``, so no
  ``atexit`` handler runs in them);
- ``--launch spawn``: ``torch.multiprocessing.spawn`` (its ``_wrap`` catches a rank's
  exception, writes it for the parent and exits 1, so no ``sys.excepthook`` sees it).

Each rank writes its own ground truth to ``--out.RANK`` (one JSON line per iteration, the
trace's step field names). ``--crash oom`` makes rank ``--crash-rank`` raise torch's CUDA
out-of-memory error (the error type a GPU job dies of; no GPU needed to raise it) before
iteration ``--crash-at``. The parent only starts and joins the ranks: it never trains.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.multiprocessing as tmp
from torch import nn

OOM_TEXT = "CUDA out of memory. Tried to allocate 20.00 GiB (the test job, on purpose)"


def train(rank: int, a: argparse.Namespace) -> None:
    torch.manual_seed(rank)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    out = open(f"{a.out}.{rank}", "w") if a.out else None  # noqa: SIM115 - closed below
    t0 = time.perf_counter()
    try:
        for step in range(a.steps):
            if a.crash != "none" and rank == a.crash_rank and step == a.crash_at:
                if a.crash == "oom":
                    raise torch.cuda.OutOfMemoryError(OOM_TEXT)
                raise ValueError("the test rank failed on purpose")
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            if a.step_ms:
                time.sleep(a.step_ms / 1000.0)
            if out:
                out.write(json.dumps({"t": time.time(), "kind": "step", "step": step,
                                      "rank": rank, "pid": os.getpid(),
                                      "step_seconds": time.perf_counter() - t0}) + "\n")
                out.flush()
            t0 = time.perf_counter()
    finally:
        if out:
            out.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--launch", choices=["process", "spawn"], default="process")
    p.add_argument("--start-method", choices=["fork", "forkserver", "spawn"], default="fork")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--step-ms", type=float, default=0.0)
    p.add_argument("--crash", choices=["none", "oom", "exception"], default="none")
    p.add_argument("--crash-rank", type=int, default=0)
    p.add_argument("--crash-at", type=int, default=5)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.launch == "spawn":
        try:
            tmp.spawn(train, args=(a,), nprocs=a.ranks, start_method=a.start_method)
        except tmp.ProcessRaisedException as err:
            print(f"a rank failed: {str(err).strip().splitlines()[0]}", flush=True)
            raise SystemExit(1) from None
        return
    ctx = tmp.get_context(a.start_method)
    procs = [ctx.Process(target=train, args=(r, a)) for r in range(a.ranks)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    codes = [proc.exitcode for proc in procs]
    print(f"rank exit codes {codes}", flush=True)
    raise SystemExit(1 if any(codes) else 0)


if __name__ == "__main__":
    main()
