"""How well the steps' GPU level is read where evaluations or saves share the seconds.

Two reports over recordings with the hook's phases (default: tests/data/fw_*), which
docs/advice.md ("One measure of busy") and docs/benchmarks.md quote:

``pairing``: for each GPU, NVML util and GPM's SM active over its job's training span,
each second's reading fitted as a mix of the training's level and the rest's by its share
of training (v = a p + c (1 - p), least squares), with the phases paired three ways: the
reading's own second, the second before, or the two its sample interval spans by where
the line falls in its second. Prints each fit's mean squared residual and counts, per
signal, which pairing fits best (GPUs whose worst residual is over 0.002: where phases and
readings vary enough to tell).

``levels``: for each GPU, the mean SM active of the seconds that held only steps (no other
phase began in them, and at least 3/4 as many steps ended in them as in any second),
beside the GPU share of the run's breakdown that ``gpuwatch advise`` reports.

    python3 benchmarks/phase_fit.py pairing [FILE ...]
    python3 benchmarks/phase_fit.py levels [FILE ...]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuwatch.advisor import sources  # noqa: E402
from gpuwatch.advisor.rules import load_rules  # noqa: E402
from gpuwatch.advisor.windows import Ring  # noqa: E402

PAIRINGS = ("own second", "second before", "interval spanned")
SIGNALS = ("util", "sm_active")


def read(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def fit(ring: Ring | None, by: Ring | None, s: int, e: int, own: float
        ) -> tuple[float, float] | None:
    """(the training's level, the mean squared residual) with each bucket's share of
    training taken as ``own`` x its own + (1 - ``own``) x the bucket before's; None where
    fewer than 6 buckets or shares that do not spread."""
    if ring is None or by is None:
        return None
    xs = []
    for i in range(max(s, ring.base, by.base + 1),
                   min(e, ring.base + len(ring.vals), by.base + len(by.vals))):
        v, p, p0 = ring.vals[i - ring.base], by.vals[i - by.base], by.vals[i - 1 - by.base]
        if v is None or p is None or p0 is None:
            continue
        xs.append((min(1.0, max(0.0, own * p + (1 - own) * p0)), v))
    n = len(xs)
    if n < 6 or statistics.pvariance([p for p, _ in xs]) < 0.01:
        return None
    spp = sum(p * p for p, _ in xs)
    spq = sum(p * (1 - p) for p, _ in xs)
    sqq = sum((1 - p) ** 2 for p, _ in xs)
    sup = sum(v * p for p, v in xs)
    suq = sum(v * (1 - p) for p, v in xs)
    det = spp * sqq - spq * spq
    if det <= 0:
        return None
    a = (sup * sqq - suq * spq) / det
    c = (suq * spp - sup * spq) / det
    return a, sum((v - a * p - c * (1 - p)) ** 2 for p, v in xs) / n


def pairing(paths: list[Path]) -> None:
    rules = load_rules()
    wins = {k: [0, 0, 0] for k in SIGNALS}
    for path in paths:
        offs = [d["t"] % 1.0 for d in read(path) if d.get("kind") == "gpu"]
        off = statistics.median(offs) if offs else 0.5
        got: dict[int, list] = {}

        def at_bucket(engine: Any, idx: int, got: dict[int, list] = got,
                      off: float = off) -> None:
            frame = engine.frame
            for g, subj in frame.subjects.items():
                phases = frame.phase_owner(subj) if g is not None else None
                start = frame.train_start(subj) if phases is not None else None
                if start is None:
                    continue
                by = phases.phase_table.rings.get("phase_train")
                rings = subj.gpu_table.rings
                got[g] = [[fit(rings.get(k), by, start, idx + 1, own)
                           for own in (1.0, 0.0, off)] for k in SIGNALS]

        sources.judge_trace(str(path), rules, on_bucket=at_bucket)
        for g, fits in sorted(got.items()):
            cells = []
            for k, row in zip(SIGNALS, fits, strict=True):
                cells.append(f"{k}: " + ", ".join(
                    "-" if f is None else f"{f[0]:.2f} ({f[1]:.4f})" for f in row))
                mse = [f[1] for f in row if f is not None]
                if len(mse) == 3 and max(mse) > 0.002:
                    wins[k][mse.index(min(mse))] += 1
            if any(f is not None for row in fits for f in row):
                print(f"{path.name} GPU {g}, lines {off:.2f} s into their seconds: "
                      + "; ".join(cells))
    print("level (mean squared residual) per pairing: " + ", ".join(PAIRINGS))
    for k in SIGNALS:
        told = ", ".join(f"{p} {n}" for p, n in zip(PAIRINGS, wins[k], strict=True))
        print(f"{k}: fits best, of {sum(wins[k])} GPUs: {told}")


def levels(paths: list[Path]) -> None:
    rules = load_rules()
    for path in paths:
        recs = read(path)
        report = sources.judge_recording(str(path), rules)[0]
        for job in report["jobs"]:
            g = job["gpu"]
            steps = sorted(d["t"] for d in recs if d.get("kind") == "step" and d.get("gpu") == g)
            if not steps:
                continue
            others = [d["t"] for d in recs if d.get("kind") == "phase"
                      and d.get("phase") != "train" and d.get("gpu", g) == g]
            most = max(sum(1 for s in steps if a < s <= a + 1) for a in steps)
            full = [d["sm_active"] for d in recs
                    if d.get("kind") == "gpu" and d.get("gpu") == g
                    and d.get("sm_active") is not None
                    and not any(d["t"] - 1 < q <= d["t"] for q in others)
                    and sum(1 for s in steps if d["t"] - 1 < s <= d["t"]) >= 0.75 * most]
            level = f"{statistics.fmean(full):.2f}" if full else "-"
            print(f"{path.name} GPU {g}: {len(full)} seconds of steps only, SMs {level} "
                  f"active; the run's GPU share {job['time_share']['gpu']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("pairing", "levels"))
    ap.add_argument("files", nargs="*", type=Path)
    args = ap.parse_args()
    paths = args.files or sorted((ROOT / "tests" / "data").glob("fw_*.jsonl.gz"))
    (pairing if args.what == "pairing" else levels)(paths)


if __name__ == "__main__":
    main()
