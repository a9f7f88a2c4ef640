"""Time to advice: how long after a job's first training step each piece of advice starts.

Judges every recording in tests/data (or the files given) at 1 s buckets, the daemon's
tick, and prints one row per advice: seconds from the start of the first step (the hook's
``step`` lines) to the advice's start; without steps, from the first GPU sample with a
process on the GPU. This is what docs/benchmarks.md quotes ("Time to advice").

    python3 benchmarks/onset.py [--markdown] [--synthetic] [FILE ...]

``--synthetic`` adds the failure classes of issue #9 as tests/synthetic.py builds them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuwatch.advisor import sources  # noqa: E402
from gpuwatch.advisor.rules import load_rules  # noqa: E402


def first_training_time(path: Path) -> tuple[float | None, str]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        next(f)
        first_proc = None
        for line in f:
            d = json.loads(line)
            if d.get("kind") == "step":
                return d["t"] - (d.get("step_seconds") or 0.0), "first step"
            if first_proc is None and d.get("kind") == "gpu" and d.get("processes"):
                first_proc = d["t"]
    return first_proc, "first GPU process"


def onsets(path: Path) -> list[tuple[str, str, int | None, float | None]]:
    ruleset = load_rules(())
    engine, _ = sources.judge_trace(str(path), ruleset, res=1.0)
    t0, _ = first_training_time(path)
    rows = []
    seen = set()
    for f in engine.findings:  # every activation, in order: the first of each counts
        key = (f.rule.id, f.gpu)
        if key in seen:
            continue
        seen.add(key)
        rows.append((f.rule.id, f.rule.severity, f.gpu,
                     None if t0 is None else f.start - t0))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--synthetic", action="store_true")
    args = ap.parse_args()
    data = ROOT / "tests" / "data"  # plain and gzip'd (the framework recordings)
    files = args.files or sorted([*data.glob("*.jsonl"), *data.glob("*.jsonl.gz")],
                                 key=lambda p: p.name.removesuffix(".gz"))
    if args.synthetic:
        sys.path.insert(0, str(ROOT / "tests"))
        import synthetic

        tmp = Path(tempfile.mkdtemp(prefix="gpuwatch-onset-"))
        runs = {"starved_cnn": synthetic.starved_cnn(), "gan": synthetic.gan(),
                "ddp_slow_rank": synthetic.ddp(slow=True),
                "ddp_balanced": synthetic.ddp(slow=False),
                "fp32_conv": synthetic.resnet_fp32(), "manual_lstm": synthetic.manual_lstm(),
                "leak_oom": synthetic.leak_to_oom()}
        files = files + [run.write(tmp / f"synthetic_{name}.jsonl")
                         for name, run in runs.items()]
    if args.markdown:
        print("| recording | advice | severity | GPU | seconds after the first step |")
        print("| --- | --- | --- | --- | --- |")
    for path in files:
        rows = onsets(path)
        if not rows:
            rows = [("(none)", "", None, None)]
        for rule, sev, gpu, dt in rows:
            when = "" if dt is None else f"{dt:.0f}"
            if args.markdown:
                print(f"| `{path.name}` | {rule} | {sev} | {'' if gpu is None else gpu} "
                      f"| {when} |")
            else:
                print(f"{path.name:34} {rule:32} {sev:9} {'' if gpu is None else gpu!s:3} "
                      f"{when:>5}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
