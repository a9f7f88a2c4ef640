#!/usr/bin/env python3
"""Where one process's replay goes: the advisor taken apart on one recording.

Run from the repository root (no GPU needed), on a recording of several GPUs, e.g. the
first 30 minutes of bench_advise.py's 8 GPUs:

    python3 benchmarks/bench_advise.py --keep rec2h.jsonl
    head -16700 rec2h.jsonl > rec30.jsonl
    python3 benchmarks/advise_parts.py rec30.jsonl

Each row judges the whole recording in this process (``GPUWATCH_REPLAY_WORKERS=1``) with
one part of the engine replaced, best CPU of ``--rounds``:

1. **Parts**: reading and bucketing alone (no rule asked); every rule asked, each
   condition answering "no" at once (the engine's loop); everything but the verdicts'
   bookkeeping (``Engine._step``); everything but the evidence refreshes
   (``Engine._details``); everything; and the timeline an HTML report's charts read
   (``timeline.judge_recording``, as ``advise --format html``).
2. **Shares**: one process judging only the host, only one GPU, only half of the GPUs,
   the others bucketed lightly as a split's process buckets them (``Frame.judge_only``):
   what split.py's ``PARENT_LOAD`` and ``CHARTS_LOAD`` weigh, in GPUs' worth.
3. **Rules**: each rule's condition timed (a timer around each call: its own cost is in
   the figures), and each rule's evidence refresh.
4. With ``--counts``: the values the first GPU's rules compute per bucket, by kind
   (windows, newest values, attribution reads, settings...), judged alone under cProfile.

Measurement only: the parts are replaced on the classes for the length of a row and put
back after it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["GPUWATCH_REPLAY_WORKERS"] = "1"

from gpuwatch.advisor import engine as engine_mod  # noqa: E402
from gpuwatch.advisor import sources, timeline  # noqa: E402
from gpuwatch.advisor.rules import load_rules  # noqa: E402
from gpuwatch.trace import format as trace  # noqa: E402


@contextmanager
def replaced(cls: Any, name: str, value: Any) -> Iterator[None]:
    old = cls.__dict__[name]
    setattr(cls, name, value)
    try:
        yield
    finally:
        setattr(cls, name, old)


@contextmanager
def judging(share: Callable[[int | None], bool]) -> Iterator[None]:
    """Every engine made meanwhile judges only ``share`` as a split's process does, the
    other GPUs bucketed lightly."""
    init = engine_mod.Engine.__init__

    def made(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        self.judge_only(share)
    with replaced(engine_mod.Engine, "__init__", made):
        yield


@contextmanager
def nothing() -> Iterator[None]:
    yield


def cpu(run: Callable[[], Any], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.process_time()
        run()
        best = min(best, time.process_time() - t)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("recording", help="a trace of several GPUs (plain or gzip)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each row (best CPU)")
    ap.add_argument("--counts", action="store_true",
                    help="also count, for the first GPU judged alone, the values its "
                         "rules compute per bucket, by kind (cProfile's call counts)")
    args = ap.parse_args(argv)
    path = args.recording
    rules = load_rules([])
    meta, lines = trace.iter_trace_lines(path)
    gpus = sorted({d["gpu"] for d in lines if d.get("kind") == "gpu"})

    def judge() -> Any:
        return sources.judge_recording(path, rules)

    E = engine_mod.Engine
    plan_of = E._plan

    def plan_no(self: Any, scope: str, cc: Any) -> list[Any]:
        plan = plan_of(self, scope, cc)  # kept by the engine: changed in place
        plan[:] = [(r, rid, ph, lambda ctx: False, sb, su) for r, rid, ph, _, sb, su in plan]
        return plan

    parts = [
        ("reading and bucketing only (no rule asked)",
         replaced(E, "_evaluate", lambda self, idx: None)),
        ("every rule asked, each condition answering \"no\" at once",
         replaced(E, "_plan", plan_no)),
        ("everything but the verdicts' bookkeeping (Engine._step)",
         replaced(E, "_step", lambda self, *a: None)),
        ("everything but the evidence refreshes (Engine._details)",
         replaced(E, "_details", lambda self, *a: None)),
        ("**everything**", nothing()),
    ]
    print(f"## advise_parts: {path}, {len(gpus)} GPUs, Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, best of {args.rounds}\n")
    print("| what ran | CPU |\n| --- | --- |")
    whole = 0.0
    for label, ctx in parts:
        with ctx:
            s = cpu(judge, args.rounds)
        whole = s
        print(f"| {label} | {s:.2f} s |")
    charts = cpu(lambda: timeline.judge_recording(path, rules), args.rounds)
    print(f"| everything, and the timeline of an HTML report's charts | {charts:.2f} s |")

    print("\n| one process judging | CPU | over reading and bucketing |\n| --- | --- | --- |")
    with judging(lambda gpu: False):
        floor = cpu(judge, args.rounds)
    print(f"| nothing | {floor:.2f} s | |")
    half = gpus[: len(gpus) // 2]
    per_gpu = None
    for label, share in [("the host", lambda g: g is None),
                         (f"GPU {gpus[0]}", lambda g: g == gpus[0]),
                         (f"GPUs {half}", lambda g: g in half)]:
        with judging(share):
            s = cpu(judge, args.rounds)
        print(f"| {label} | {s:.2f} s | {s - floor:.2f} s |")
        if label.startswith("GPUs"):
            per_gpu = (s - floor) / max(1, len(half))
    if per_gpu:
        print(f"\nper GPU (the half's share): {per_gpu:.2f} s; the timeline of the charts: "
              f"{charts - whole:.2f} s, {(charts - whole) / per_gpu:.1f} GPUs' worth")

    spent: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    held: Counter[str] = Counter()
    clock = time.perf_counter

    def plan_timed(self: Any, scope: str, cc: Any) -> list[Any]:
        def timed(rid: str, test: Callable[[Any], bool]) -> Callable[[Any], bool]:
            def run(ctx: Any) -> bool:
                t = clock()
                got = test(ctx)
                spent[rid] += clock() - t
                calls[rid] += 1
                held[rid] += bool(got)
                return got
            return run
        plan = plan_of(self, scope, cc)
        plan[:] = [(r, rid, ph, timed(rid, t), sb, su) for r, rid, ph, t, sb, su in plan]
        return plan

    read = E._read_details
    refresh: Counter[str] = Counter()
    refreshes: Counter[str] = Counter()

    def read_timed(self: Any, f: Any, ctx: Any, t: float) -> None:
        s = clock()
        read(self, f, ctx, t)
        refresh[f.rule.id] += clock() - s
        refreshes[f.rule.id] += 1
    with replaced(E, "_plan", plan_timed), replaced(E, "_read_details", read_timed):
        judge()
    print(f"\nconditions, timed one by one: {sum(spent.values()):.2f} s in all\n")
    print("| rule | condition: s | µs a call | held | evidence: refreshes | µs each |")
    print("| --- | --- | --- | --- | --- | --- |")
    for rid, s in spent.most_common(12):
        n = refreshes[rid]
        each = f"{1e6 * refresh[rid] / n:.0f}" if n else "-"
        print(f"| {rid} | {s:.3f} | {1e6 * s / calls[rid]:.1f} | "
              f"{held[rid] / calls[rid]:.0%} | {n} | {each} |")
    total_n = sum(refreshes.values())
    if total_n:
        print(f"\nevidence refreshes: {total_n}, {sum(refresh.values()):.2f} s "
              f"({1e6 * sum(refresh.values()) / total_n:.0f} µs each on average)")
    if args.counts:
        value_counts(path, rules, gpus[0])
    return 0


# the engine's value readers (engine.py), by the name of the function that computes each
# kind of value: what a judged GPU's rules ask at each bucket
_READERS = {
    "full": "windowed statistics (mean, min, max, percentiles)",
    "partial": "counter windows (delta, increase, rate, count)",
    "newest": "newest values (last)",
    "attribution": "step-time attribution reads",
    "fit": "memory fits",
    "<lambda>": "settings, facts and the other small readers",
}


def value_counts(path: str, rules: Any, gpu: int) -> None:
    """How many values of each kind GPU ``gpu``'s rules compute per bucket, judged alone
    (the others bucketed lightly): cProfile's call counts of the engine's readers."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    with judging(lambda g: g == gpu):
        prof.enable()
        _, engine, _ = sources.judge_recording(path, rules)
        prof.disable()
    calls: Counter[str] = Counter()
    for (file, _line, name), row in pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]
        if file.endswith("advisor/engine.py") and name in _READERS:
            calls[name] += row[1]  # primitive calls
    buckets = max(1, engine.ticks)
    print(f"\nvalues computed per bucket for GPU {gpu} judged alone ({buckets} buckets, "
          "cProfile's call counts):\n")
    print("| kind | per bucket |\n| --- | --- |")
    for name, label in _READERS.items():
        print(f"| {label} | {calls[name] / buckets:.1f} |")
    print(f"| **all** | {sum(calls.values()) / buckets:.1f} |")


if __name__ == "__main__":
    raise SystemExit(main())
