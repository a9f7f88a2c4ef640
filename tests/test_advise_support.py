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

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SCENARIOS = ["tuned", "small_batch", "input_bound", "near_oom", "fp32", "idle"]
# recorded later by gpuwatch itself (tests/data/README.md): other sizes, precisions, loaders
LATER = ["h200_fp16_collapse", "h200_input_bound_w2", "h200_small_model_batch4",
         "h200_fp32_b16", "h200_tf32", "h200_tuned_b128"]
# what only the hook can know: without its step lines this advice cannot be given
HOOK_ONLY = {"loss-scale-collapse"}
SIX = {"raise-batch-size", "add-dataloader-workers", "enable-gradient-checkpointing",
       "enable-mixed-precision", "loss-scale-collapse", "gpu-idle"}
EXPECTED = {"small_batch": "raise-batch-size", "input_bound": "add-dataloader-workers",
            "near_oom": "enable-gradient-checkpointing", "fp32": "enable-mixed-precision",
            "tuned": None, "idle": None,
            "h200_fp16_collapse": "loss-scale-collapse",
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


def ids(report: dict[str, Any], gpu: int | None = None) -> set[str]:
    return {a["id"] for a in report["advice"] if gpu is None or a["gpu"] == gpu}


def load(name: str) -> list[dict[str, Any]]:
    with open(DATA / f"{name}.jsonl", encoding="utf-8") as f:
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
        if d["kind"] == "step":
            for f in ("step_seconds", "data_wait_seconds"):
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
            return d
        if d["kind"] != "gpu":
            return d
        return [dict(d, gpu=i, processes=[dict(p, pid=p["pid"] + (i if ddp else 0))
                                          for p in d["processes"]]) for i in range(n)]
    return transform(lines, copy)
