"""Helpers for the advisor's tests: run the CLI, build synthetic recordings from the real
ones (time-stretched, GPM fields removed, several GPUs, another compute capability).

Holds no tests itself; the test_advise_* and test_rules_* modules import it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from conftest import open_recording, read_recording, recording, recording_name  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SCENARIOS = ["tuned", "small_batch", "input_bound", "near_oom", "fp32", "idle"]
# recorded later by gpuwatch itself (tests/data/README.md): other sizes, precisions, loaders
LATER = ["h200_fp16_collapse", "h200_input_bound_w2", "h200_small_model_batch4",
         "h200_fp32_b16", "h200_tf32", "h200_tuned_b128"]
# what only the hook can know: without its step lines this advice cannot be given
HOOK_ONLY = {"loss-scale-collapse", "loss-not-finite"}
SIX = {"raise-batch-size", "add-dataloader-workers", "enable-gradient-checkpointing",
       "enable-mixed-precision", "loss-scale-collapse", "loss-not-finite", "gpu-idle"}
EXPECTED = {"small_batch": "raise-batch-size", "input_bound": "add-dataloader-workers",
            "near_oom": "enable-gradient-checkpointing", "fp32": "enable-mixed-precision",
            "tuned": None, "idle": None,
            # its loss NaN from step 10 on: that, not the scale it brings down, is told
            "h200_fp16_collapse": "loss-not-finite",
            "h200_input_bound_w2": "add-dataloader-workers",
            "h200_small_model_batch4": "raise-batch-size",
            "h200_fp32_b16": "enable-mixed-precision", "h200_tf32": None,
            "h200_tuned_b128": None}
GPM = ("sm_active", "sm_occupancy", "tensor_active", "fp32_active", "fp16_active",
       "dram_active", "fp64_active")


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "gpuwatch", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=timeout, check=False)


def advise_json(path: str | Path, *extra: str) -> dict[str, Any]:
    proc = run_cli("advise", "--replay", str(path), "--format", "json", *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def advise_text(path: str | Path, *extra: str) -> str:
    proc = run_cli("advise", "--replay", str(path), *extra)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def ids(report: dict[str, Any], gpu: int | None = None) -> set[str]:
    return {a["id"] for a in report["advice"] if gpu is None or a["gpu"] == gpu}


def load(name: str) -> list[dict[str, Any]]:
    with open_recording(recording(name)) as f:
        return [json.loads(line) for line in f if line.strip()]


def write(path: Path, lines: Iterable[dict[str, Any]]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(d) + "\n" for d in lines)
    return path


def transform(lines: list[dict[str, Any]], fn: Callable[[dict[str, Any]], Any]
              ) -> list[dict[str, Any]]:
    """Apply ``fn`` to each non-meta line (a copy); ``fn`` returns the line, a list, or None."""
    out = [dict(lines[0])]
    for d in lines[1:]:
        got = fn(dict(d))
        if got is None:
            continue
        out.extend(got if isinstance(got, list) else [got])
    return out


def without_steps(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return transform(lines, lambda d: None if d["kind"] in ("step", "config") else d)


def without_gpm(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def drop(d: dict[str, Any]) -> dict[str, Any]:
        for k in GPM:
            d.pop(k, None)
        return d
    return transform(lines, drop)


def stretched(lines: list[dict[str, Any]], k: float) -> list[dict[str, Any]]:
    """Time-stretched by ``k``: every phase lasts k times longer (same values)."""
    t0 = lines[1]["t"]

    def stretch(d: dict[str, Any]) -> dict[str, Any]:
        d["t"] = t0 + (d["t"] - t0) * k
        if d["kind"] in ("step", "steps"):  # a step, or the hook's summary of many
            if d.get("begin_t") is not None:
                d["begin_t"] = t0 + (d["begin_t"] - t0) * k
            for f in ("step_seconds", "data_wait_seconds", "sample_seconds",
                      "step_seconds_min", "step_seconds_p50", "step_seconds_p90",
                      "step_seconds_p99", "step_seconds_max", "first_batch_wait_seconds",
                      "first_batch_data_wait_seconds"):
                if d.get(f) is not None:
                    d[f] = d[f] * k
        return d
    return transform(lines, stretch)


def with_meta(lines: list[dict[str, Any]], **meta: Any) -> list[dict[str, Any]]:
    out = [dict(lines[0], **meta)]
    out.extend(lines[1:])
    return out


def multi_gpu(lines: list[dict[str, Any]], n: int, ddp: bool = False) -> list[dict[str, Any]]:
    """The same job on ``n`` GPUs, each gpu line copied per index: one process driving all
    of them, or (``ddp``) one process per GPU, each with its own tree of workers."""
    def copy(d: dict[str, Any]) -> Any:
        if d["kind"] == "host" and ddp:
            for f in ("job_cpu_cores", "job_processes", "job_rss_bytes"):
                if d.get(f) is not None:
                    d[f] = d[f] * n
            if d.get("jobs"):  # one tree per rank, as the host layer writes them
                d["jobs"] = [dict(j, pid=j["pid"] + i) for i in range(n) for j in d["jobs"]]
            return d
        if d["kind"] != "gpu":
            return d
        return [dict(d, gpu=i, processes=[dict(p, pid=p["pid"] + (i if ddp else 0))
                                          for p in d["processes"]]) for i in range(n)]
    return transform(lines, copy)


def decimated(lines: list[dict[str, Any]], k: int = 10) -> list[dict[str, Any]]:
    """Sampled k times less often (10 Hz -> 1 Hz, the daemon's default): every k-th gpu line
    of each GPU and every k-th host line; the hook's lines are the job's own and all stay."""
    seen: dict[tuple[str, Any], int] = {}

    def keep(d: dict[str, Any]) -> dict[str, Any] | None:
        if d["kind"] not in ("gpu", "host"):
            return d
        key = (d["kind"], d.get("gpu"))
        n = seen[key] = seen.get(key, -1) + 1
        return d if n % k == 0 else None
    out = transform(lines, keep)
    out[0]["sample_hz"] = (lines[0].get("sample_hz") or 10) / k
    return out


# readings that describe the sampler's whole interval (GPM between two of its samples;
# CPU time and bytes written since the last tick): averaged when ticks are merged. NVML's
# util, power and memory are the driver's own last second or the moment: kept as read
_GPU_OVER_INTERVAL = ("sm_active", "sm_occupancy", "tensor_active", "dram_active",
                      "fp16_active", "fp32_active", "fp64_active", "pcie_tx_bytes_per_second",
                      "pcie_rx_bytes_per_second")
_HOST_OVER_INTERVAL = ("cpu_util", "job_cpu_cores", "job_main_cpu_cores",
                       "job_workers_cpu_cores", "job_loader_cpu_cores",
                       "job_write_bytes_per_second")
_JOB_OVER_INTERVAL = ("cpu_cores", "main_cpu_cores", "workers_cpu_cores", "loader_cpu_cores",
                      "main_write_bytes_per_second")


def _merged(before: dict[str, Any], d: dict[str, Any], keys: tuple[str, ...]
            ) -> dict[str, Any]:
    out = dict(d)
    for k in keys:
        a, b = before.get(k), d.get(k)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) \
                and not isinstance(b, bool):
            out[k] = (a + b) / 2
    return out


def at_twice_the_interval(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A 1-s recording as a daemon sampling every 2 s would have written it: every other
    tick (its gpu and host lines), the readings that cover the interval averaged over the
    two seconds it now covers; the hook's lines are the job's own and all stay."""
    ticks = sorted({d["t"] for d in lines if d.get("kind") == "host"})
    kept = set(ticks[1::2])
    gpu_before: dict[Any, dict[str, Any]] = {}
    host_before: list[dict[str, Any]] = []
    out = [dict(lines[0], sample_hz=(lines[0].get("sample_hz") or 1) / 2)]
    for d in lines[1:]:
        kind = d.get("kind")
        if kind == "gpu":
            if d["t"] not in kept:
                gpu_before[d["gpu"]] = d
                continue
            a = gpu_before.pop(d["gpu"], None)
            d = _merged(a, d, _GPU_OVER_INTERVAL) if a is not None else d
        elif kind == "host":
            if d["t"] not in kept:
                host_before[:] = [d]
                continue
            if host_before:
                a = host_before.pop()
                d = _merged(a, d, _HOST_OVER_INTERVAL)
                cores, now = a.get("cpu_util_per_core"), d.get("cpu_util_per_core")
                if isinstance(cores, list) and isinstance(now, list) \
                        and len(cores) == len(now):
                    d["cpu_util_per_core"] = [(x + y) / 2 for x, y in zip(cores, now, strict=True)]
                jobs = {j.get("pid"): j for j in a.get("jobs") or []}
                d["jobs"] = [_merged(jobs[j.get("pid")], j, _JOB_OVER_INTERVAL)
                             if j.get("pid") in jobs else j for j in d.get("jobs") or []]
        out.append(d)
    return out


def _idle(d: dict[str, Any], t: float, mem_used: Any) -> dict[str, Any]:
    """``d`` (a gpu or host line) as the daemon reads it with no job on the machine."""
    if d["kind"] == "gpu":
        out = {k: (0.0 if k in ("util", "mem_util") or k in _GPU_OVER_INTERVAL else v)
               for k, v in d.items()}
        out.update(t=t, processes=[], power_watts=70.0, clock_event_reasons=1,
                   sm_clock_mhz=345.0)
        if mem_used is not None:
            out["mem_used_bytes"] = mem_used
        return out
    out = {k: v for k, v in d.items() if not k.startswith("job") and k != "jobs"}
    cores = d.get("cpu_util_per_core")
    out.update(t=t, cpu_util=0.0)
    if isinstance(cores, list):
        out["cpu_util_per_core"] = [0.0] * len(cores)
    return out


def outlived(lines: list[dict[str, Any]], before: int = 0, after: int = 90
             ) -> list[dict[str, Any]]:
    """The daemon running ``before`` seconds before the recording's first tick and
    ``after`` seconds after its last (a service, or a daemon started beside the job):
    every second the GPUs idle with no process and their memory given back (the first
    tick's), the host with no job."""
    ticks = sorted({d["t"] for d in lines if d.get("kind") == "host"})
    first = [d for d in lines if d.get("t") == ticks[0] and d.get("kind") in ("gpu", "host")]
    last = [d for d in lines if d.get("t") == ticks[-1] and d.get("kind") in ("gpu", "host")]
    freed = {d["gpu"]: d.get("mem_used_bytes") for d in first if d["kind"] == "gpu"}
    pre = [_idle(d, ticks[0] - i, freed.get(d.get("gpu")))
           for i in range(before, 0, -1) for d in first]
    post = [_idle(d, ticks[-1] + i, freed.get(d.get("gpu")))
            for i in range(1, after + 1) for d in last]
    return [lines[0], *pre, *lines[1:], *post]


H100_80GB = 85_520_809_984  # bytes NVML reports for an H100 80GB HBM3


def on_card(lines: list[dict[str, Any]], total: int = H100_80GB,
            name: str = "NVIDIA H100 80GB HBM3") -> list[dict[str, Any]]:
    """The same job on a card with ``total`` bytes: a job's footprint stays what it is, except
    a run that fills the device (the near-OOM case grows until memory runs out), which keeps
    its fraction of the device, torch's counters scaled with it."""
    gpu = [d for d in lines if d["kind"] == "gpu" and d.get("mem_total_bytes")]
    was = gpu[0]["mem_total_bytes"]
    f = total / was if max(d.get("mem_used_bytes", 0) for d in gpu) > 0.9 * was else 1.0

    def edit(d: dict[str, Any]) -> dict[str, Any]:
        if d["kind"] == "gpu" and d.get("mem_total_bytes"):
            d["mem_total_bytes"] = total
            if "mem_used_bytes" in d:
                d["mem_used_bytes"] = int(d["mem_used_bytes"] * f)
            d["processes"] = [dict(p, mem_used_bytes=int(p["mem_used_bytes"] * f))
                              for p in d.get("processes", [])]
        elif d["kind"] == "step":
            for k in ("mem_allocated_bytes", "mem_reserved_bytes", "max_mem_allocated_bytes"):
                if d.get(k) is not None:
                    d[k] = int(d[k] * f)
        return d
    return with_meta(transform(lines, edit), gpu_name=name)


def with_other_process(lines: list[dict[str, Any]], held: int, pid: int = 424242
                       ) -> list[dict[str, Any]]:
    """Another process (not the job) holds ``held`` bytes of every GPU's memory."""
    def edit(d: dict[str, Any]) -> dict[str, Any]:
        if d["kind"] == "gpu" and "mem_used_bytes" in d:
            d["mem_used_bytes"] += held
            d["processes"] = d.get("processes", []) + [{"pid": pid, "mem_used_bytes": held}]
        return d
    return transform(lines, edit)


def io_bound(lines: list[dict[str, Any]], share: float, workers_cores: float = 0.05
             ) -> list[dict[str, Any]]:
    """Each step also waits ``share`` of its (longer) time for data the DataLoader workers
    fetch from slow storage: the workers sleep in I/O (``workers_cores`` of CPU in all), and
    the GPU and the main process are idle for that share."""
    k = 1 / (1 - share)

    def edit(d: dict[str, Any]) -> dict[str, Any]:
        if d["kind"] == "step":
            d["step_seconds"] *= k
            d["data_wait_seconds"] = d["step_seconds"] * share
        elif d["kind"] == "gpu":
            for f in ("util", "sm_active", "sm_occupancy", "tensor_active", "fp32_active",
                      "fp16_active", "dram_active"):
                if d.get(f) is not None:
                    d[f] *= 1 - share
        elif d["kind"] == "host" and d.get("job_cpu_cores"):
            main = min(d["job_cpu_cores"], 1.0) * (1 - share)
            d["job_cpu_cores"] = main + workers_cores
            if "job_main_cpu_cores" in d:
                d["job_main_cpu_cores"] = main
                d["job_workers_cpu_cores"] = workers_cores
            if d.get("jobs"):  # the one job tree the sums are made of says the same
                d["jobs"] = [dict(j, cpu_cores=main + workers_cores, main_cpu_cores=main,
                                  workers_cpu_cores=workers_cores) for j in d["jobs"]]
        return d
    return transform(lines, edit)


def one_gpu_second(engine: Any, t: float, util: float, sm_active: float, mem_gib: int,
                   steps: bool, held: bool = True, pid: int = 7) -> None:
    """One second of GPU 0 fed to ``engine``: its NVML line (``pid`` holding ``mem_gib``
    GiB of 80, none where not ``held``) and, with ``steps``, the hook's line of ten steps
    of 0.1 s that ended in it."""
    engine.feed({"kind": "gpu", "t": t, "gpu": 0, "util": util, "sm_active": sm_active,
                 "mem_used_bytes": mem_gib << 30, "mem_total_bytes": 80 << 30,
                 "processes": [{"pid": pid, "mem_used_bytes": mem_gib << 30}] if held else []})
    if steps:
        engine.feed({"kind": "steps", "t": t + 0.999, "begin_t": t, "pid": pid, "gpu": 0,
                     "steps": 10, "timed": 10, "step_seconds": 0.999,
                     "data_wait_seconds": 0.0})
