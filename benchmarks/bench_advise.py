#!/usr/bin/env python3
"""What the advisor costs: hours of 8 GPUs judged offline, and the live advisor per tick.

Run from the repository root (no GPU needed):

    python3 benchmarks/bench_advise.py                 # 2 h x 8 GPUs
    python3 benchmarks/bench_advise.py --hours 24 --out bench_advise.json

1. **Offline**: builds a recording of 8 GPUs at 1 s ticks (``--hours`` long) from the
   recordings in tests/data (each decimated to 1 Hz, shifted and concatenated; every GPU
   cycles through the scenarios from a different start, the host lines and the hook's
   step lines (one a second) come along), then times ``gpuwatch advise --replay`` on it in
   a fresh process: wall time, CPU time and peak RSS, beside the file's size (the trace is
   streamed and the rules' windows kept in bounded rings, so the RSS must not grow with
   the file), and the CPU **per hour of recording per GPU**; all of that in one process
   (``GPUWATCH_REPLAY_WORKERS=1``), then again as the CLI judges it on this machine: split
   over a process per GPU and one more, as far as the CPUs go (gpuwatch/advisor/split.py),
   its wall time and the CPU of all its processes.
2. **Live**: a Store holding 15 min of 1 s history for 8 GPUs, each GPU with one rank of
   an 8-rank job reporting through the hook (ten steps a second each, its configuration
   sent once); times ``LiveAdvisor``'s first evaluation (the whole history, as after a
   start) and its steady CPU per tick (one tick of 8 GPUs, the host and the ranks' steps
   published, one evaluation, the store keeping from then on the daemon's default
   ``history_seconds``), and the same without the hook (8 GPUs alone), beside the
   sampler's own tick with 8 stubbed GPUs (tests/nvml_stub.py).

``--workers 1,2,3`` also judges the recording at each of those process counts, in turn.
``--split`` also times, in this process, reading the recording alone, reading and bucketing
it with no rule evaluated, and the whole replay: where the offline CPU goes.

Prints a Markdown table; ``--out FILE`` writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATA = ROOT / "tests" / "data"
SCENARIOS = ["tuned", "small_batch", "input_bound", "near_oom", "fp32", "idle"]


def _decimated(name: str) -> tuple[dict[str, Any], list[dict[str, Any]], float]:
    """One recording at 1 Hz: the first gpu, host and step line of each second."""
    with open(DATA / f"{name}.jsonl", encoding="utf-8") as f:
        lines = [json.loads(x) for x in f if x.strip()]
    meta, body = lines[0], lines[1:]
    t0 = body[0]["t"]
    seen: set[tuple[str, int]] = set()
    out = []
    for d in body:
        sec = int(d["t"] - t0)
        key = (d["kind"], sec)
        if key in seen:
            continue
        seen.add(key)
        out.append(dict(d, t=float(sec)))
    return meta, out, float(int(body[-1]["t"] - t0) + 1)


def build_day(path: Path, gpus: int = 8, seconds: int = 86_400) -> dict[str, Any]:
    """Write the day-long recording; returns what it holds."""
    segs = [_decimated(n) for n in SCENARIOS]
    meta = dict(segs[0][0], scenario="bench: a day of 8 GPUs", sample_hz=1)
    start = 1_800_000_000.0
    counts = {"gpu": 0, "host": 0, "step": 0}
    # per GPU: an iterator over (scenario index) cycling from a different start
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(meta) + "\n")
        offset = 0.0
        k = 0
        while offset < seconds:
            # all GPUs switch scenario together so segments line up; GPU g plays
            # scenario (k + g) mod 6, GPU 0's host and step lines ride along
            seg_len = max(segs[(k + g) % len(segs)][2] for g in range(gpus))
            per_t: dict[float, list[dict[str, Any]]] = {}
            for g in range(gpus):
                _, lines, _ = segs[(k + g) % len(segs)]
                for d in lines:
                    if d["kind"] == "gpu":
                        # GPU g's processes are its own (GPUs g and g + 6 play one
                        # scenario: one pid on both would be one process on two GPUs)
                        procs = [dict(p, pid=p["pid"] + 100_000 * g)
                                 for p in d.get("processes") or ()] if g else \
                            d.get("processes")
                        per_t.setdefault(d["t"], []).append(dict(d, gpu=g, processes=procs))
                    elif g == 0:
                        per_t.setdefault(d["t"], []).append(dict(d))
            for t in sorted(per_t):
                if offset + t >= seconds:
                    break
                for d in per_t[t]:
                    d["t"] = round(start + offset + t, 3)
                    counts[d["kind"]] = counts.get(d["kind"], 0) + 1
                    f.write(json.dumps(d, separators=(",", ":")) + "\n")
            offset += seg_len
            k += 1
    return {"seconds": seconds, "gpus": gpus, "lines": counts,
            "bytes": path.stat().st_size}


_JUDGE = r"""
import json, resource, sys, time
t0 = time.perf_counter(); c0 = time.process_time()
from gpuwatch.advisor.rules import load_rules
from gpuwatch.advisor import sources, split
forked = []
start = split.start
def counting(*args, **kwargs):
    children = start(*args, **kwargs)
    forked.append(len(children))
    return children
split.start = counting
engine, meta = sources.judge_trace(sys.argv[1], load_rules())
found = sorted({(f.rule.id, f.gpu) for f in engine.findings})
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                  "children_cpu_s": kids.ru_utime + kids.ru_stime,
                  "processes": 1 + sum(forked),
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "resolution_s": engine.res, "ticks": engine.ticks,
                  "advice": len(found), "activations": len(engine.findings)}))
"""


def bench_offline(path: Path, workers: str | None = "1") -> dict[str, Any]:
    """``advise --replay``'s judging of ``path``: in one process (``workers`` "1"), or
    split as the CLI would split it here (None)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("GPUWATCH_REPLAY_WORKERS", None)
    if workers is not None:
        env["GPUWATCH_REPLAY_WORKERS"] = workers
    proc = subprocess.run([sys.executable, "-c", _JUDGE, str(path)], capture_output=True,
                          text=True, env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


_BASELINE = r"""
import resource, json
import gpuwatch.advisor.rules, gpuwatch.advisor.sources, gpuwatch.trace.format
print(json.dumps({"rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def baseline_rss() -> int:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", _BASELINE], capture_output=True, text=True,
                          env=env, check=True)
    return json.loads(proc.stdout)["rss"]


STEPS_PER_SECOND = 10  # each rank's steps a second in the live bench


def _store_with_history(gpus: int, seconds: int, ranks: bool) -> Any:
    from gpuwatch.samples import ConfigSample, GpuInfo
    from gpuwatch.store import Store

    store = Store(history_seconds=seconds + 60)
    infos = tuple(GpuInfo(gpu=g, name="NVIDIA H200", compute_capability=(9, 0),
                          gpm_supported=True) for g in range(gpus))
    t0 = time.time() - seconds
    if ranks:  # an 8-rank job, one rank a GPU, as torchrun starts it
        for g in range(gpus):
            store.set_config(ConfigSample(t=t0, pid=1000 + g, rank=g, values={
                "world_size": gpus, "batch_size": 64, "num_workers": 4, "pin_memory": True,
                "persistent_workers": True, "autocast_dtype": "bfloat16",
                "fused_optimizer": True}))
    for i in range(seconds):
        _publish_tick(store, t0 + i, gpus, infos, ranks)
    return store, infos, t0 + seconds


def _publish_tick(store: Any, t: float, gpus: int, infos: Any, ranks: bool) -> None:
    from gpuwatch.samples import GpuProcess, GpuSample, HostSample, Snapshot, StepSample

    store.publish(_tick(t, gpus, infos, GpuSample, HostSample, Snapshot, GpuProcess))
    if ranks:
        step = int(t) * STEPS_PER_SECOND
        store.add_steps([StepSample(
            t=t - (STEPS_PER_SECOND - k) / STEPS_PER_SECOND, step=step + k,
            step_seconds=1.0 / STEPS_PER_SECOND, data_wait_seconds=0.002, batch_size=64,
            mem_allocated_bytes=1_500_000_000, mem_reserved_bytes=1_800_000_000,
            max_mem_allocated_bytes=1_700_000_000, pid=1000 + g, rank=g, gpu=g)
            for g in range(gpus) for k in range(STEPS_PER_SECOND)])


def _tick(t: float, gpus: int, infos: Any, GpuSample: Any, HostSample: Any, Snapshot: Any,
          GpuProcess: Any) -> Any:
    # a small-batch job on every GPU: the advice stays on, the realistic steady state
    samples = tuple(GpuSample(t=t, gpu=g, util=0.2, sm_active=0.08, tensor_active=0.01,
                              fp32_active=0.0, mem_used_bytes=2_000_000_000,
                              mem_total_bytes=150_754_820_096, power_watts=150.0,
                              power_limit_watts=700.0, temp_celsius=40, clock_event_reasons=0,
                              processes=(GpuProcess(pid=1000 + g,
                                                    mem_used_bytes=1_500_000_000),))
                    for g in range(gpus))
    host = HostSample(t=t, cpu_util_per_core=(0.1,) * 64, load1=9.0, job_cpu_cores=9.0,
                      job_processes=8 * 5, mem_used_bytes=10**10, mem_total_bytes=10**12)
    return Snapshot(t=t, gpus=samples, infos=infos, host=host)


def bench_live(gpus: int = 8, seconds: int = 900, ticks: int = 300,
               ranks: bool = True) -> dict[str, Any]:
    """The live advisor over ``seconds`` of history, then one tick at a time: wall and
    CPU (this thread's) per evaluation of one new tick."""
    from gpuwatch.advisor import LiveAdvisor

    store, infos, t_next = _store_with_history(gpus, seconds, ranks)
    advisor = LiveAdvisor(store, None)
    t0, c0 = time.perf_counter(), time.thread_time()
    advisor.evaluate()
    first, first_cpu = time.perf_counter() - t0, time.thread_time() - c0
    # from here on the store keeps what the daemon's does (its history_seconds default)
    from gpuwatch.serve.config import Config

    store.history_seconds = Config().history_seconds
    per_tick, per_tick_cpu = [], []
    for i in range(ticks):
        _publish_tick(store, t_next + i, gpus, infos, ranks)
        t0, c0 = time.perf_counter(), time.thread_time()
        advisor.evaluate()
        per_tick.append(time.perf_counter() - t0)
        per_tick_cpu.append(time.thread_time() - c0)
    return {"gpus": gpus, "ranks": gpus if ranks else 0, "history_seconds": seconds,
            "first_evaluation_s": first, "first_evaluation_cpu_s": first_cpu,
            "tick_median_s": statistics.median(per_tick),
            "tick_p95_s": sorted(per_tick)[int(0.95 * len(per_tick))],
            "tick_cpu_median_s": statistics.median(per_tick_cpu),
            "tick_cpu_mean_s": statistics.fmean(per_tick_cpu),
            "active_advice": sorted({f.rule.id for f in advisor.active()}),
            "jobs": len(advisor.jobs())}


def bench_split(path: Path) -> dict[str, float]:
    """Where the offline replay's CPU goes, in this process: reading the recording alone,
    reading and bucketing it (the frame, no rule evaluated), and the whole replay; the
    differences are the bucketing's and the evaluation's shares."""
    from gpuwatch.advisor.engine import Engine
    from gpuwatch.advisor.rules import load_rules
    from gpuwatch.trace import format as trace

    ruleset = load_rules([])

    def judge(evaluate: bool) -> None:
        meta, lines = trace.iter_trace_lines(str(path))
        engine = Engine(ruleset, res=1.0)
        if not evaluate:
            engine.frame.on_bucket = None
        engine.frame.set_meta(meta)
        for gpu, info in trace.meta_infos(meta).items():
            engine.frame.set_gpu_info(gpu, name=info.name, cc=info.compute_capability)
        engine.feed_all(lines)
        engine.finish()

    c0 = time.process_time()
    sum(1 for _ in trace.iter_trace_lines(str(path))[1])
    c1 = time.process_time()
    judge(evaluate=False)
    c2 = time.process_time()
    judge(evaluate=True)
    c3 = time.process_time()
    return {"read_cpu_s": c1 - c0, "bucket_cpu_s": (c2 - c1) - (c1 - c0),
            "evaluate_cpu_s": (c3 - c2) - (c2 - c1), "all_cpu_s": c3 - c2}


def bench_sampler(gpus: int = 8, reps: int = 200) -> dict[str, Any] | None:
    """The sampler's tick with stubbed NVML (its Python side), for comparison."""
    try:
        from gpuwatch.collect.sampler import Sampler
        from gpuwatch.store import Store
        from tests.nvml_stub import NvmlStub, StubGpu
    except (ImportError, AttributeError) as err:  # the stub or sampler may change
        return {"error": f"sampler not measured: {err!r}"}
    try:
        stub = NvmlStub([StubGpu(i, processes=[(1000 + i, 2**30)]) for i in range(gpus)])
        sampler = Sampler(Store(), interval=1.0, nvml_module=stub)
        for _ in range(10):
            sampler.tick()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            sampler.tick()
            times.append(time.perf_counter() - t0)
        close = getattr(sampler, "close", None) or getattr(sampler, "stop", None)
        if close:
            close()
        return {"gpus": gpus, "tick_median_s": statistics.median(times)}
    except Exception as err:  # noqa: BLE001 - a teammate's API change must not end the bench
        return {"error": f"sampler not measured: {err!r}"}


def fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.0f} µs"


def report(r: dict[str, Any]) -> str:
    day, off, live, smp = r["day"], r["offline"], r["live"], r.get("sampler") or {}
    bare = r.get("live_without_hook") or {}
    mib = 2**20
    hours = day["seconds"] / 3600
    rows = [
        ("offline: recording", (f"{hours:g} h x {day['gpus']} GPUs, "
         f"{sum(day['lines'].values()):,} lines, {day['bytes'] / mib:.0f} MiB")),
        ("offline: judged in one process (wall / CPU)",
         f"{fmt_s(off['wall_s'])} / {fmt_s(off['cpu_s'])}"),
        ("**offline: CPU per hour of recording per GPU**",
         f"**{fmt_s(off['cpu_s'] / hours / day['gpus'])}**"),
        ("offline: bucket resolution, evaluations", (f"{off['resolution_s']:g} s, "
         f"{off['ticks']:,} ticks x {day['gpus']} GPUs")),
        ("offline: peak RSS, one process (imports alone)", (f"{off['peak_rss_bytes'] / mib:.0f} MiB "
         f"({r['baseline_rss_bytes'] / mib:.0f} MiB)")),
        ("offline: advice found (GPU x rule)", (f"{off['advice']} ({off['activations']} "
         "activations)")),
        (f"live: first evaluation, 15 min x {live['gpus']} GPUs and {live['ranks']} ranks "
         "(wall / CPU)", (f"{fmt_s(live['first_evaluation_s'])} / "
                          f"{fmt_s(live['first_evaluation_cpu_s'])}")),
        (f"**live: CPU per tick, {live['gpus']} GPUs and {live['ranks']} ranks** "
         "(median / mean; wall p95)", (f"**{fmt_s(live['tick_cpu_median_s'])}** / "
                                       f"{fmt_s(live['tick_cpu_mean_s'])}; "
                                       f"{fmt_s(live['tick_p95_s'])}")),
        (f"live: CPU per tick, {bare.get('gpus', '-')} GPUs without the hook (median)",
         fmt_s(bare.get("tick_cpu_median_s"))),
        ("live: advice active at the end (8 ranks)", ", ".join(live["active_advice"]) or "none"),
        ("sampler: tick, 8 stubbed GPUs (median)", fmt_s(smp.get("tick_median_s"))
         if "tick_median_s" in smp else smp.get("error", "-")),
    ]
    par = r.get("offline_split")
    if par and par["processes"] > 1:
        rows.insert(2, (f"**offline: judged as the CLI does here, by {par['processes']} "
                        "processes** (wall / CPU of all; vs one process)",
                        f"**{fmt_s(par['wall_s'])}** / "
                        f"{fmt_s(par['cpu_s'] + par['children_cpu_s'])}; "
                        f"{off['wall_s'] / par['wall_s']:.2f}x"))
    elif par:
        rows.insert(2, ("offline: judged as the CLI does here (one process: "
                        f"{r['cpus']} CPU{'s' if r['cpus'] != 1 else ''})",
                        f"{fmt_s(par['wall_s'])} / {fmt_s(par['cpu_s'])}"))
    split = r.get("split")
    if split:
        rows.insert(3, ("offline, in one process (CPU): reading / bucketing / evaluating "
                        "(of the whole)", (f"{fmt_s(split['read_cpu_s'])} / "
                                           f"{fmt_s(split['bucket_cpu_s'])} / "
                                           f"{fmt_s(split['evaluate_cpu_s'])} "
                                           f"({fmt_s(split['all_cpu_s'])})")))
    import platform

    out = [f"## bench_advise: {platform.node()}, {r['cpus']} CPUs, Python {r['python']}, "
           f"load average {' '.join(f'{x:.1f}' for x in r['load'])}", "",
           "| measure | value |", "| --- | --- |"]
    out += [f"| {a} | {b} |" for a, b in rows]
    if r.get("by_workers"):
        out += ["", "| processes | wall / CPU of all |", "| --- | --- |"]
        out += [f"| {c['processes']} | {fmt_s(c['wall_s'])} / {fmt_s(c['cpu_s'])} |"
                for c in r["by_workers"]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", metavar="FILE", help="write the results as JSON here")
    ap.add_argument("--hours", type=float, default=2.0, help="length of the recording")
    ap.add_argument("--keep", metavar="FILE", help="keep the generated recording here")
    ap.add_argument("--workers", metavar="N,N,...",
                    help="also judge the recording at each of these process counts "
                         "(GPUWATCH_REPLAY_WORKERS), in turn: wall and CPU of all")
    ap.add_argument("--split", action="store_true",
                    help="also split the replay's CPU into reading, bucketing and evaluation")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.keep) if args.keep else Path(tmp) / "day.jsonl"
        day = build_day(path, seconds=int(args.hours * 3600))
        offline = bench_offline(path)
        offline_split = bench_offline(path, None)
        counts = []
        for n in (args.workers or "").split(","):
            if n.strip():
                got = bench_offline(path, n.strip())
                counts.append({"workers": int(n), "processes": got["processes"],
                               "wall_s": got["wall_s"],
                               "cpu_s": got["cpu_s"] + got["children_cpu_s"]})
        # before the split grows this process: a child's ru_maxrss starts from its parent's
        baseline = baseline_rss()
        split = bench_split(path) if args.split else None
    result = {"day": day, "offline": offline, "offline_split": offline_split,
              "by_workers": counts, "split": split,
              "baseline_rss_bytes": baseline,
              "live": bench_live(), "live_without_hook": bench_live(ranks=False),
              "sampler": bench_sampler(), "python": sys.version.split()[0],
              "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(), "load": os.getloadavg()}
    print(report(result))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
