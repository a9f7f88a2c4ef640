#!/usr/bin/env python3
"""What the notebook's watch costs the training in the kernel, and what one redraw costs.

Run from the repository root (no GPU needed):

    python3 benchmarks/bench_notebook.py --out bench_notebook.json

In one process (standing in for the kernel), a small CPU training loop (an MLP, batch 64,
no DataLoader) runs a fixed number of steps, three ways, interleaved in rounds so that a
busy neighbour on the machine hits them alike:

1. **bare**: no gpuwatch at all;
2. **watched**: ``gpuwatch.notebook``'s daemon beside the process, the hook attached, and
   a live view redrawn every 2 s (the default) on its thread;
3. **watched, redrawn every 0.1 s**: the same, with the view redrawn twenty times as often,
   to make its share visible.

Reports the median step time of each, their ratios to bare, and the median time of one
redraw (two HTTP requests to the daemon and the page built), on the thread that draws.
The view's output goes nowhere (no frontend); the redraw does all the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402 - the benchmark's own training loop

import gpuwatch.notebook as nb  # noqa: E402


def train(steps: int) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
    return times


class _Headless(nb.LiveView):
    """A live view with no frontend: draws on its thread, shows nothing."""

    def show(self) -> None:
        import threading

        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _put(self, text: str) -> None:
        self.draws += 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(1)
    session = nb.Session(interval=1.0)
    session.start()
    results: dict[str, list[float]] = {"bare": [], "watched": [], "watched_0.1s": []}
    try:
        for _ in range(args.rounds):
            import gpuwatch.torch as hook

            hook.detach()
            results["bare"] += train(args.steps)
            hook.attach(session.socket)
            for name, refresh in (("watched", 2.0), ("watched_0.1s", 0.1)):
                session.refresh = refresh
                view = _Headless(session, widgets=False)
                view.show()
                results[name] += train(args.steps)
                view.stop()
        view = _Headless(session, widgets=False)
        redraw = []
        for _ in range(50):
            t = time.perf_counter()
            view.render()
            redraw.append(time.perf_counter() - t)
    finally:
        session.hooked = True
        session.stop()
    med = {k: statistics.median(v) for k, v in results.items()}
    out = {
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, "
                   f"{os.cpu_count()} CPUs, torch {torch.__version__} (CPU, 1 thread)",
        "steps_per_run": args.steps, "rounds": args.rounds,
        "median_step_ms": {k: round(v * 1e3, 4) for k, v in med.items()},
        "ratio_to_bare": {k: round(v / med["bare"], 4) for k, v in med.items()},
        "median_redraw_ms": round(statistics.median(redraw) * 1e3, 3),
    }
    print("| run | median step | to bare |\n| --- | --- | --- |")
    for k in results:
        print(f"| {k} | {out['median_step_ms'][k]:.3f} ms | {out['ratio_to_bare'][k]:.3f} |")
    print(f"\none redraw (median of 50): {out['median_redraw_ms']:.2f} ms; {out['machine']}")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
