"""Instructions per call of the hook's per-step paths, and per datagram of the daemon's
receive path, counted by callgrind: load-free, so two versions compare on a busy machine.

    python3 benchmarks/instructions.py hook [--calls 2000]
    python3 benchmarks/instructions.py receiver

Needs valgrind. Runs itself under ``valgrind --tool=callgrind``, collecting only inside
``operator.call`` (which nothing else here calls) and dumping a part after each, so each
measured loop is one part and importing torch costs nothing counted (only minutes).

- ``hook``: each path of gpuwatch/job/hook/core.py that a training step runs, called
  ``--calls`` times after 300 of warm-up, as benchmarks/bench_hook.py's micro rows call
  them (wrappers around a stand-in that returns at once, less the stand-in's own count;
  the DataLoader iterator carrying its facts; no reporting thread). BLAS and OpenMP
  threads are set to 1: a spinning worker thread would be counted too.
- ``receiver``: 64 ranks' reports of 25 steps, as benchmarks/bench_receiver.py sends
  them, handed to ``HookReceiver._handle`` (decoding, validation, the job's stats, the
  store's step thinning); 1,024 datagrams counted after 256 of warm-up.
"""

from __future__ import annotations

import argparse
import collections
import glob
import operator
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HOOK_PATHS = ["raw1", "raw2", "raw3", "optimizer_step_hook", "dataloader_next_wrapper",
              "backward_wrapper", "backward_iteration", "scaler_scale_wrapper",
              "scaler_update"]
# which stand-in's count each wrapper's is taken less
BASE = {"dataloader_next_wrapper": "raw1", "backward_wrapper": "raw3",
        "backward_iteration": "raw3", "scaler_scale_wrapper": "raw2", "scaler_update": "raw2"}


def inside_hook(calls: int) -> None:
    import torch
    from torch import nn

    from gpuwatch.job.hook import core as hook

    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    loss = torch.ones(())
    hook._attach(os.path.join(tempfile.mkdtemp(), "none.sock"))  # no reporting thread
    h = hook._hook
    h.thread = object()
    h.pending = collections.deque(maxlen=1000)

    from hook_standins import It, raw, raw_backward  # (benchmarks/, beside this file)

    it = It()
    for _ in range(300):  # the first step ends start-up
        hook._on_optimizer_step(opt, (), {})
    backward = hook._wrap_backward(raw_backward)

    def source(value: str, scaler_mode: bool = False) -> Any:
        def setup() -> None:
            h.source = value
            h.scaler_mode = scaler_mode
        return setup

    optimizer, backward_clocked = source(hook.OPTIMIZER), source(hook.BACKWARD)
    paths = [(raw, (it,), optimizer), (raw, (scaler, loss), optimizer),
             (raw_backward, (p,), optimizer),
             (hook._on_optimizer_step, (opt, (), {}), optimizer),
             (hook._wrap_next(raw), (it,), optimizer), (backward, (p,), optimizer),
             (backward, (p,), backward_clocked),
             (hook._wrap_scaler_scale(raw), (scaler, loss), optimizer),
             (hook._wrap_scaler_update(raw), (scaler, None), source(hook.OPTIMIZER, True))]
    for fn, args, setup in paths:
        setup()
        for _ in range(300):
            fn(*args)

        def loop(fn: Any = fn, args: Any = args) -> None:
            for _ in range(calls):
                fn(*args)

        operator.call(loop)


def inside_receiver() -> None:
    from gpuwatch.job import protocol
    from gpuwatch.job.receiver import HookReceiver
    from gpuwatch.store import Store

    ranks, per, reports, warm = 64, 25, 20, 4
    store = Store()
    rx = HookReceiver(store, os.path.join(tempfile.mkdtemp(), "unused.sock"))
    t0 = time.time() - reports * 0.5
    config = {"world_size": ranks, "batch_size": 64, "num_workers": 4, "pin_memory": True,
              "persistent_workers": True, "fused_optimizer": True}
    data = []
    for k in range(reports):
        now = t0 + k * 0.5
        for rank in range(ranks):
            records = [protocol.StepRecord(
                step=k * per + i, t=now - (per - 1 - i) * 0.02, step_seconds=0.02,
                data_wait_seconds=0.001, batch_size=64, skipped=False,
                loss=2.5 if i == per - 1 else None) for i in range(per)]
            header = {
                "kind": "report", "pid": 100_000 + rank, "seq": k, "t": now, "rank": rank,
                "local_rank": rank % 8, "world_size": ranks, "gpu": rank % 8,
                "steps_total": (k + 1) * per, "skipped_total": 0,
                "window": {"steps": per, "skipped": 0, "timed": per,
                           "step_seconds": per * 0.02, "data_wait_seconds": per * 0.001,
                           "samples": per * 64, "sample_seconds": per * 0.02,
                           "iterators": 0, "first_batch_wait_seconds": 0.0},
                "loss_scale": None, "mem_allocated_bytes": 2 << 30,
                "mem_reserved_bytes": 3 << 30, "max_mem_allocated_bytes": 5 << 30,
                "config": config if k == 0 else None, "exit_reason": None, "error": None,
                "sender_dropped": {}, "hook_errors": 0, "phase": "train",
                "phases": {"startup": 3.0, "train": 0.5 * k}, "compiles": 0,
                "eval": {"batches": 0, "samples": 0, "batch_size": None, "wait_seconds": 0.0},
                "inference": {}, "problems": [], "hook_state": "on"}
            data.append(protocol.encode(header, records))
    for d in data[:warm * ranks]:
        rx._handle(d, [], 0)

    def loop() -> None:
        for d in data[warm * ranks:]:
            rx._handle(d, [], 0)

    operator.call(loop)


def parts(prefix: str) -> list[int]:
    """The instructions of each dumped part, in order."""
    out = []
    for name in sorted(glob.glob(prefix + ".*"), key=lambda f: int(f.rsplit(".", 1)[1])):
        for line in Path(name).read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                out.append(int(line.split()[1]))
                break
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("hook", "receiver"))
    ap.add_argument("--calls", type=int, default=2000, help="calls per hook path")
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.inside:
        sys.path.insert(0, str(ROOT))
        inside_hook(a.calls) if a.what == "hook" else inside_receiver()
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "callgrind.out")
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   MKL_NUM_THREADS="1")
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
               "--toggle-collect=_operator_call", "--dump-after=_operator_call",
               f"--callgrind-out-file={prefix}", sys.executable, __file__, a.what,
               "--calls", str(a.calls), "--inside"]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        except FileNotFoundError:
            raise SystemExit("valgrind is not installed (apt-get install valgrind)") from None
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-2000:])
        counts = parts(prefix)
    if a.what == "receiver":
        print(f"receiver: {counts[0] / 1024:,.0f} instructions per datagram "
              "(64 ranks, 25 steps each)")
        return 0
    got = dict(zip(HOOK_PATHS, counts, strict=True))
    per = {name: (got[name] - got.get(BASE.get(name, ""), 0)) / a.calls
           for name in HOOK_PATHS if not name.startswith("raw")}
    # the same sums as bench_hook.py's per-step rows
    per["per_step_total"] = (per["optimizer_step_hook"] + per["dataloader_next_wrapper"]
                             + per["backward_wrapper"])
    per["per_step_total_with_scaler"] = (per["scaler_update"] + per["dataloader_next_wrapper"]
                                         + per["backward_wrapper"]
                                         + per["scaler_scale_wrapper"])
    per["per_step_total_backward_clocked"] = (per["backward_iteration"]
                                              + per["dataloader_next_wrapper"])
    print("| hook code path | instructions per call |")
    print("| --- | ---: |")
    for name, value in per.items():
        print(f"| {name.replace('_', ' ')} | {value:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
