"""Recording size against step rate: a real CPU torch job (tests/scripts/fast_steps.py)
under `gpuwatch run --record`, at a few step rates; prints steps/s, bytes/s, MB/hour and
whether the recording's step count is exact. Usage: python benchmarks/bench_record_rate.py
[--seconds 10]"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=10.0)
    args = p.parse_args()
    print("| fetch µs | steps/s | lines | bytes/s | MB/hour | step count exact |")
    print("| --- | --- | --- | --- | --- | --- |")
    for fetch in (20_000, 2_000, 100):  # ~50, ~400, ~2000 steps/s here
        with tempfile.TemporaryDirectory() as d:
            rec, truth = Path(d, "rec.jsonl"), Path(d, "truth.json")
            subprocess.run([sys.executable, "-m", "gpuwatch", "run", "--web.listen-address",
                            "127.0.0.1:0", "--quiet", "--record", str(rec), "--",
                            sys.executable, str(REPO / "tests/scripts/fast_steps.py"),
                            "--seconds", str(args.seconds), "--fetch-us", str(fetch),
                            "--out", str(truth)], check=True, cwd=REPO)
            lines = [json.loads(x) for x in rec.read_text().splitlines()]
            want = json.loads(truth.read_text())["steps"]
            got = sum(1 if x["kind"] == "step" else x["steps"] for x in lines
                      if x["kind"] in ("step", "steps"))
            span = lines[-1]["t"] - lines[1]["t"]
            bps = rec.stat().st_size / span
            print(f"| {fetch} | {want / args.seconds:.0f} | {len(lines)} | {bps:.0f} | "
                  f"{bps * 3600 / 1e6:.1f} | {got == want} |")


if __name__ == "__main__":
    main()
