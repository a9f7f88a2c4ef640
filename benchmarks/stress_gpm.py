#!/usr/bin/env python3
"""Every GPU's sampler at 0.1 s for a while: does GPM stay readable with all GPUs at once?

    python3 benchmarks/stress_gpm.py [--seconds 20]

Concurrent GPM calls on two GPUs crashed NVML (SIGSEGV) on a 2x H200 host before GPM
reads were serialized; this runs the started sampler on every GPU, fast tier at 0.1 s and
slow tier at 1 s, then prints the ticks, the errors counted, and the share of ticks that
carried GPM fields per GPU. Needs a GPU with GPM (Hopper or newer).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuwatch.collect.sampler import Sampler
from gpuwatch.store import Store


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    a = ap.parse_args()
    store = Store()
    sampler = Sampler(store, interval=0.1, slow_interval=1.0)
    sampler.start()
    try:
        time.sleep(a.seconds)
    finally:
        sampler.stop()
    snap = store.latest()
    print(f"ticks {snap.health.ticks_total}, errors {dict(snap.health.errors_total)}")
    for g in snap.gpus:
        history = store.gpu_history(g.gpu)
        share = sum(s.sm_active is not None for s in history) / max(len(history), 1)
        print(f"GPU {g.gpu}: {len(history)} ticks, GPM present in {share:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
