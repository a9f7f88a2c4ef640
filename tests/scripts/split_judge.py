"""Judge recordings in one process and split over several; print what differs.

Run by tests/test_advise_split.py in a process of its own (one thread: the split forks):

    python3 tests/scripts/split_judge.py OUT_DIR REC.jsonl[.gz] ...

For each recording, and for the same recording without the hook's lines (written to
OUT_DIR), the report and every activation (rule, GPU, start, end, time held, evidence,
words) judged with ``GPUWATCH_REPLAY_WORKERS=1`` and with 2 and with one process per GPU
and one more (so some process judges no GPU at all); and, for each split, how many
children were forked. One JSON line per recording and split.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path
from typing import Any

from gpuwatch.advisor import split
from gpuwatch.advisor.rules import load_rules
from gpuwatch.advisor.sources import judge_recording

HOOK_KINDS = ("step", "steps", "config", "phase", "hook_problem", "job_end")
forked: list[int] = []
_start = split.start


def _counting_start(*args: Any, **kwargs: Any) -> Any:
    children = _start(*args, **kwargs)
    forked.append(len(children))
    return children


split.start = _counting_start


def judged(path: Path, workers: int) -> tuple[dict[str, Any], list[Any]]:
    os.environ[split.ENV] = str(workers)
    rep, engine, _ = judge_recording(str(path), RULES)
    rep.pop("generated_at", None)
    acts = [(f.rule.id, f.gpu, f.start, f.ended, f.active, f.last_seen, f.held_seconds,
             f.details) for f in engine.findings]
    return rep, json.loads(json.dumps(acts))


def lines(path: Path) -> Any:
    """A recording's lines, plain or gzip'd."""
    return gzip.open(path, "rt") if path.name.endswith(".gz") else open(path)


def gpus_of(path: Path) -> int:
    seen = set()
    with lines(path) as f:
        for line in f:
            d = json.loads(line)
            if d.get("kind") == "gpu":
                seen.add(d["gpu"])
    return len(seen)


def bare(src: Path, out: Path) -> Path:
    dst = out / (src.name.removesuffix(".gz").removesuffix(".jsonl") + ".nohook.jsonl")
    with lines(src) as f, open(dst, "w") as g:
        for line in f:
            if json.loads(line).get("kind") not in HOOK_KINDS:
                g.write(line)
    return dst


RULES = load_rules(())

if __name__ == "__main__":
    out = Path(sys.argv[1])
    for arg in sys.argv[2:]:
        src = Path(arg)
        for path in (src, bare(src, out)):
            n = gpus_of(path)
            want = judged(path, 1)
            for workers in sorted({2, n + 1}):
                del forked[:]
                got = judged(path, workers)
                print(json.dumps({"recording": path.name, "gpus": n, "workers": workers,
                                  "forked": sum(forked), "same_report": got[0] == want[0],
                                  "same_activations": got[1] == want[1],
                                  "activations": len(want[1])}), flush=True)
