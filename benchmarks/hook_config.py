"""What reading the job's settings costs the hook's reporting thread, once a report (at
most two a second): ``_config()`` whole, and its look for sparse gradients alone, with an
SGD optimizer over ``--params`` parameters whose gradients are dense (the look's worst case:
it reads up to SPARSE_SCAN of them at every report until one is sparse). Medians of
``--calls`` calls, in µs, on this machine's CPU (torch on the CPU is enough: the look reads
Python attributes, not the device).

    python3 benchmarks/hook_config.py [--params 300] [--calls 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def median_us(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=int, default=300)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    import torch

    from gpuwatch.job.hook import core as hook

    with tempfile.TemporaryDirectory() as tmp:
        assert hook.attach(str(Path(tmp) / "nobody.sock"))
        h = hook._hook
        try:
            params = [torch.nn.Parameter(torch.zeros(4)) for _ in range(args.params)]
            opt = torch.optim.SGD(params, lr=0.1)
            sum(p.sum() for p in params).backward()
            opt.step()
            whole = median_us(h._config, args.calls)
            look = median_us(lambda: h._sparse_grads(opt), args.calls)
        finally:
            hook.detach()
    print(f"| what (SGD over {args.params} parameters, dense gradients) | median |")
    print("| --- | --- |")
    print(f"| `_config()`, once a report | {whole:.1f} µs |")
    print(f"| of it, the look for sparse gradients (up to {hook.SPARSE_SCAN} parameters) "
          f"| {look:.1f} µs |")


if __name__ == "__main__":
    main()
