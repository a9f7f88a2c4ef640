"""The advice report: one JSON shape (``gpuwatch advise --format json``, /api/advice), and
its text and Markdown renderings.

The report opens with each GPU and what its architecture supports, then the advice in the
order to act on it (:func:`advice_order`). The JSON keeps raw numbers; text and Markdown
show each with its unit at a precision a person reads (:func:`evidence_value`).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import textwrap
import time
from collections import deque
from collections.abc import Collection, Iterable
from typing import Any

from gpuwatch.advisor import endings
from gpuwatch.advisor.engine import SEVERITY_RANK, Engine, Finding
from gpuwatch.advisor.facts import arch_supports, cc_text

REPORT_FORMAT = "gpuwatch-advice/1"

HOOK_NOTE = ("No data from the torch hook: this advice comes from NVML and the process tree "
             "alone. Run the job as `gpuwatch run -- python train.py ...` (or import "
             "gpuwatch.torch) to add step time, data wait, loss scale and the job's settings, "
             "which make the advice exact (e.g. num_workers=0 → 8) and more certain.")


def gpu_entries(engine: Engine, instance: str | None = None) -> list[dict[str, Any]]:
    frame = engine.frame
    out = []
    for gpu in frame.gpus():
        subj = frame.subjects[gpu]
        cc = frame.fact(subj, "compute_capability")
        entry: dict[str, Any] = {
            "gpu": gpu,
            "name": frame.fact(subj, "gpu_name"),
            "compute_capability": cc_text(cc),
            "supports": arch_supports(cc),
            "gpm": bool(frame.fact(subj, "gpm")),
            "hook": bool(frame.fact(subj, "hook")),
        }
        if instance is not None:
            entry["instance"] = instance
        out.append(entry)
    return out


def findings_json(findings: Iterable[Finding], instance: str | None = None
                  ) -> list[dict[str, Any]]:
    items = []
    for f in findings:
        item = f.to_json()
        if instance is not None:
            item["instance"] = instance
        items.append(item)
    return items


# -- what was judged -----------------------------------------------------------------------
# A GPU is "busy" when SM active (GPM) or, without GPM, NVML util says so; a job that
# keeps it under this share of the time is underused (the design card: "raise the batch
# size when util is under 70 %"), and a report never calls such a run fine.
UNDERUSED_BELOW = 0.70
# a tick counts as training when the hook saw a step on its GPU this recently
STEP_RECENT_SECONDS = 2.0
# without the hook: a process on the GPU doing work (GPU or CPU), as the training rules' gate
NO_HOOK_UTIL = 0.05
NO_HOOK_JOB_CORES = 0.5
# less training than this (the training rules' shortest window) is start-up, not a run
MIN_TRAINING_SECONDS = 10.0
_MAX_TICK_SECONDS = 5.0  # a gap longer than this between ticks is not counted as time


def _getter(obj: Any) -> Any:
    if type(obj) is dict:
        return obj.get
    return lambda k: getattr(obj, k, None)


class _Slot:
    """Per-GPU sums of ticks: (seconds, busy-seconds) while steps ran, and while a
    process worked without steps."""

    __slots__ = ("busy_gpm", "busy_hook", "busy_proc", "hook_s", "last_t", "proc_s", "seen_s")

    def __init__(self) -> None:
        self.hook_s = self.busy_hook = self.proc_s = self.busy_proc = self.seen_s = 0.0
        self.busy_gpm = False
        self.last_t: float | None = None


class RunTally:
    """What a report can say it judged: per GPU, how long a training job ran on it and how
    busy the GPU was meanwhile. Fed the same samples as the engine (trace line dicts or
    samples.py records); ``window`` seconds (live) keeps only the recent past."""

    def __init__(self, window: float | None = None) -> None:
        self.window = window
        self.slots: dict[int, _Slot] = {}
        self.host_lines = 0
        self.steps = 0
        self._last_step: dict[int | None, float] = {}
        self._pid_gpu: dict[int, int] = {}
        self._job_cores: float | None = None
        self._ticks: deque[tuple[int, float, float, float, float, float, float]] = deque()

    def feed(self, s: Any) -> None:
        get = _getter(s)
        kind = get("kind") if type(s) is dict else _KINDS.get(type(s).__name__)
        t = get("t")
        if t is None:
            return
        if kind == "gpu":
            self._gpu(get, float(t))
        elif kind == "host":
            self.host_lines += 1
            cores = get("job_cpu_cores")
            self._job_cores = float(cores) if cores is not None else None
        elif kind in ("step", "steps"):
            self.steps += 1 if kind == "step" else int(get("steps") or 0)
            gpu = get("gpu")
            if gpu is None and get("pid") is not None:
                gpu = self._pid_gpu.get(int(get("pid")))
            self._last_step[gpu] = float(t)

    def _gpu(self, get: Any, t: float) -> None:
        gpu = int(get("gpu"))
        slot = self.slots.get(gpu)
        if slot is None:
            slot = self.slots[gpu] = _Slot()
        dt = 0.0 if slot.last_t is None else t - slot.last_t
        slot.last_t = t
        if not 0 < dt <= _MAX_TICK_SECONDS:
            return
        procs = get("processes") or ()
        for p in procs:
            pid = p.get("pid") if type(p) is dict else getattr(p, "pid", None)
            if pid is not None:
                self._pid_gpu[int(pid)] = gpu
        util, sm = get("util"), get("sm_active")
        if sm is not None:
            slot.busy_gpm = True
        busy = sm if sm is not None else util
        if busy is None:
            return
        busy = min(1.0, max(0.0, float(busy)))
        last = max(self._last_step.get(gpu, -math.inf), self._last_step.get(None, -math.inf))
        hook = t - last <= STEP_RECENT_SECONDS
        working = bool(procs) and ((util or 0.0) >= NO_HOOK_UTIL
                                   or (self._job_cores or 0.0) >= NO_HOOK_JOB_CORES)
        row = (gpu, dt, dt if hook else 0.0, busy * dt if hook else 0.0,
               dt if working else 0.0, busy * dt if working else 0.0, t)
        self._add(row, 1.0)
        if self.window is not None:
            self._ticks.append(row)
            while self._ticks and self._ticks[0][6] < t - self.window:
                self._add(self._ticks.popleft(), -1.0)

    def _add(self, row: tuple[int, float, float, float, float, float, float], sign: float
             ) -> None:
        slot = self.slots[row[0]]
        slot.seen_s += sign * row[1]
        slot.hook_s += sign * row[2]
        slot.busy_hook += sign * row[3]
        slot.proc_s += sign * row[4]
        slot.busy_proc += sign * row[5]

    def gpus(self, hook: bool) -> list[dict[str, Any]]:
        """Per GPU: seconds of training seen and the busy share meanwhile."""
        out = []
        for gpu in sorted(self.slots):
            sl = self.slots[gpu]
            secs, busy = (sl.hook_s, sl.busy_hook) if hook else (sl.proc_s, sl.busy_proc)
            secs = max(0.0, secs)
            out.append({"gpu": gpu, "seconds": round(max(0.0, sl.seen_s), 1),
                        "training_seconds": round(secs, 1),
                        "busy_ratio": round(busy / secs, 4)
                        if secs >= MIN_TRAINING_SECONDS else None,
                        "busy_signal": "sm_active" if sl.busy_gpm else "util"})
        return out


_KINDS = {"GpuSample": "gpu", "HostSample": "host", "StepSample": "step",
          "StepsSample": "steps", "ConfigSample": "config"}


def judged(tally: RunTally | None, engine_gpus: list[int], hook_steps: bool,
           no_gpu_reason: str | None, jobs: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """What the rules could judge, and why not where they could not. Where the report has
    a step-time breakdown for a GPU (``jobs``), its GPU share and span are what was judged
    (the training rules read the same); the tally stands in elsewhere."""
    if not engine_gpus:
        return {"gpu": False, "training": False, "gpus": [],
                "reason": no_gpu_reason or "there is no GPU data (NVML found no GPU)"}
    per_gpu = tally.gpus(hook_steps) if tally is not None else []
    broken_down: dict[int, dict[str, Any]] = {}
    for j in jobs:
        share = (j.get("time_share") or {}).get("gpu")
        if j.get("gpu") is None or share is None or not j.get("seconds"):
            continue
        got = broken_down.get(j["gpu"])
        if got is None or share > got["busy_ratio"]:
            broken_down[j["gpu"]] = {"busy_ratio": round(float(share), 4),
                                     "training_seconds": round(float(j["seconds"]), 1),
                                     "busy_signal": "breakdown"}
    for g in per_gpu:
        g.update(broken_down.pop(g["gpu"], {}))
        # the breakdown counts whole buckets: never more training than time seen
        g["training_seconds"] = min(g["training_seconds"], g["seconds"])
    per_gpu += [dict(gpu=gpu, seconds=v["training_seconds"], **v)
                for gpu, v in sorted(broken_down.items())]
    training = any(g["training_seconds"] >= MIN_TRAINING_SECONDS for g in per_gpu)
    return {"gpu": True, "training": training if tally is not None else None,
            "gpus": per_gpu, "reason": None}


def advice_order(item: dict[str, Any]) -> tuple[float, float, float, float, int]:
    """The order a person should act in: critical items (a GPU failing, a run going to
    waste) first, then by the time each change would win back (its expected speed-up:
    a 1.5x gain wins back a third of the run, a 1.1x gain a tenth), then severity and
    confidence. Advice without a gain estimate sorts as a gain of 1.0 would."""
    sev = SEVERITY_RANK.get(item.get("severity", "info"), 0)
    gain = item.get("expected_gain")
    gain = float(gain) if isinstance(gain, (int, float)) and gain > 0 else 1.0
    return (0.0 if sev >= SEVERITY_RANK["critical"] else 1.0, -gain, -sev,
            -(item.get("confidence") or 0.0), item["gpu"] if item.get("gpu") is not None else -1)


def hook_problem_notes(problems: list[dict[str, Any]]) -> list[str]:
    """One note per process whose hook lost facts or stopped, saying what and where."""
    by_pid: dict[Any, list[dict[str, Any]]] = {}
    for p in problems:
        by_pid.setdefault((p.get("instance"), p.get("pid")), []).append(p)
    notes = []
    for (instance, pid), items in by_pid.items():
        where = f"{instance} " if instance else ""
        who = f"the hook in pid {pid}" if pid is not None else "the hook"
        gpu = next((p.get("gpu") for p in items if p.get("gpu") is not None), None)
        off = [p for p in items if p.get("what") == "hook.off"]
        rest = [p for p in items if p.get("what") != "hook.off"]
        said = "; ".join(f"{p['what']}: {p.get('error') or 'failed'}" for p in rest[:4])
        more = f" (and {len(rest) - 4} more)" if len(rest) > 4 else ""
        if off:
            on = f"GPU {gpu}" if gpu is not None else "its job"
            notes.append(f"{where}{who.capitalize()} stopped: {off[0].get('error')}"
                         f"{'; before that: ' + said + more if said else ''}. The advice for "
                         f"{on} from then on comes from NVML and the process tree only.")
        elif said:
            notes.append(f"{where}{who.capitalize()} could not read everything: {said}{more}. "
                         "Only those facts are missing; steps and the rest were measured.")
    return notes


def _pieces(n: int) -> str:
    return f"{n} piece of advice" if n == 1 else f"{n} pieces of advice"


def _order_text(advice: list[dict[str, Any]]) -> str:
    if len(advice) == 1:
        return "with its evidence"
    return "the one that wins back the most time first"


def build_report(parts: list[tuple[Engine, list[Finding], str | None]], source: dict[str, Any],
                 *, tally: RunTally | None = None, no_gpu_reason: str | None = None
                 ) -> dict[str, Any]:
    """One report from one or more engines (several: one per Prometheus instance).

    ``tally`` (fed the same samples) says how long a job trained on each GPU and how busy
    the GPU was meanwhile; ``no_gpu_reason`` why there is no GPU data, where there is none.
    """
    gpus: list[dict[str, Any]] = []
    advice: list[dict[str, Any]] = []
    jobs: list[dict[str, Any]] = []
    steps = config = phases = False
    host_cpus = None
    ended: list[dict[str, Any]] = []
    problems: list[dict[str, Any]] = []
    failed: list[str] = []
    for engine, findings, instance in parts:
        for rid, (n, where, part, said) in getattr(engine, "rule_errors", {}).items():
            on = f" on {instance}" if instance is not None else ""
            failed.append(f"Rule {rid} ({where}) failed {n} time{'s' if n != 1 else ''} "
                          f"evaluating its {part}{on} (first: {said}): "
                          + ("where it failed it was judged as not holding"
                             if part == "condition" else
                             "its advice stands without the numbers it failed to read")
                          + "; the other rules were judged as usual.")
        ended += getattr(engine.frame, "job_ends", [])
        problems += [dict(p, instance=instance) if instance is not None else dict(p)
                     for p in getattr(engine.frame, "problems", [])]
        phases = phases or getattr(engine.frame, "hook_phases", False)
        gpus += gpu_entries(engine, instance)
        advice += findings_json(findings, instance)
        for job in engine.jobs():
            jobs.append(dict(job, instance=instance) if instance is not None else job)
        steps = steps or engine.frame.hook_steps
        config = config or engine.frame.hook_config
        host_cpus = host_cpus or engine.frame.facts.get("host_cpus")
    advice.sort(key=advice_order)
    notes = hook_problem_notes(problems) + failed
    if not steps and not config and not phases and gpus:
        notes.append(HOOK_NOTE)
    if gpus and not any(g["gpm"] for g in gpus):
        notes.append("No GPM counters (SM/tensor/FP32 activity: Hopper and newer): "
                     "precision advice relies on the torch hook's settings, and 'GPU "
                     "underused' on NVML utilization alone.")
    seen = judged(tally, [g["gpu"] for g in gpus], steps, no_gpu_reason,
                  jobs=[j for j in jobs if j.get("instance") is None])
    return {
        "format": REPORT_FORMAT,
        "generated_at": round(time.time(), 3),
        "source": source,
        "hook": {"steps": steps, "config": config, "phases": phases,
                 "problems": [{k: v for k, v in p.items() if v is not None}
                              for p in problems]},
        "host": {"cpus": int(host_cpus) if host_cpus else None},
        "gpus": gpus,
        "judged": seen,
        "warming_up": None,  # the daemon's, while it has judged less than its rules need
        "jobs": jobs,
        "advice": advice,
        "job_ends": endings.entries(ended, inference_batches(jobs)),
        "notes": notes,
    }


# -- evidence with units --------------------------------------------------------------------
# The JSON keeps each evidence value raw (ratios 0-1, seconds, bytes); text and Markdown show
# it the way a person reads it: `util 20 %`, `step 8.3 ms`, `54.8 MiB`, `1.2 GB/s`.

# names a person knows better by another name (the rest: the signal name, unit suffix off)
_LABELS = {
    "util": "util", "util_max": "util max", "sm_active": "SM active",
    "sm_occupancy": "SM occupancy", "tensor_active": "tensor active",
    "dram_active": "DRAM active", "fp16_active": "FP16 pipe", "fp32_active": "FP32 pipe",
    "fp64_active": "FP64 pipe", "mem_util": "memory controller busy",
    "mem_used_ratio": "memory used", "mem_free_bytes": "memory free",
    "mem_used_bytes": "memory used", "mem_total_bytes": "memory",
    "mem_reserved_ratio": "reserved by torch", "mem_reserved_bytes": "reserved by torch",
    "mem_allocated_bytes": "allocated by torch",
    "max_mem_allocated_bytes": "peak allocated by torch",
    "act_mem_per_sample_bytes": "activations per sample",
    "anomaly_detection": "anomaly detection", "launch_blocking": "CUDA_LAUNCH_BLOCKING=1",
    "no_alloc_cache": "PYTORCH_NO_CUDA_MEMORY_CACHING=1",
    "gc_collect_calls": "gc.collect() calls", "gc_collect_seconds": "in gc.collect()",
    "train_generate_calls": "generate() calls", "train_generate_seconds": "in generate()",
    "empty_cache_calls": "empty_cache() calls", "empty_cache_seconds": "in empty_cache()",
    "dist_debug_detail": "TORCH_DISTRIBUTED_DEBUG=DETAIL",
    "fw_debug_overflow": 'debug="underflow_overflow"',
    "ddp_find_unused": "find_unused_parameters", "ddp_unused_bytes": "unused parameters found",
    "data_wait_ratio": "data wait", "step_seconds": "step", "data_wait_seconds": "data wait",
    "batch_size": "batch", "job_workers": "loader workers",
    "job_main_processes": "training processes", "main_busy_ratio": "main process busy",
    "workers_busy_ratio": "workers busy", "cpu_free_cores": "CPU free",
    "cpu_util": "host CPU busy", "load_per_cpu": "load per CPU", "host_cpus": "host CPUs",
    "skipped_ratio": "skipped steps", "loss_scale": "loss scale",
    "compute_capability": "compute capability", "power_ratio": "power of limit",
    "job_cpu_cores": "job CPU", "gpu_processes": "GPU processes",
    "gpu_process_mem_bytes": "GPU memory held", "num_workers": "num_workers",
    "step_rate": "step rate", "iterator_rate": "new DataLoader iterators",
    "iterators_per_minute": "DataLoader iterators per minute",
    "mem_allocated_growth_bytes_per_second": "allocated memory growth",
    "mem_allocated_growth_r2": "linear fit R²",
    "mem_used_growth_bytes_per_second": "used memory growth (NVML)",
    "mem_used_growth_r2": "linear fit R²",
    "first_batch_wait_ratio": "first-batch wait share",
    "first_batch_wait_seconds": "first-batch wait", "share_data": "data share",
    "share_sync": "sync share", "share_gpu": "GPU share", "share_host": "host share",
    "host_kernel_share": "host time with a kernel running",
    "act_mem_per_batch_bytes": "activations a step",
    "share_other": "other share", "gpu_busy": "GPU busy", "job_rank": "rank",
    "job_ranks": "ranks", "slowest_rank": "slowest rank", "rank_score": "rank score",
    "straggler_gain": "job speed-up at the median rank's pace",
    "data_over_peers": "data wait over the other ranks' median",
    "host_over_peers": "host over the other ranks' median",
    "gpu_over_peers": "GPU work over the other ranks' median",
    "peer_straggler": "waits on a slower peer", "sm_clock_mhz": "SM clock",
    "mem_clock_mhz": "memory clock", "power_watts": "power", "temp_celsius": "temperature",
    "power_limit_watts": "power limit", "clock_power_capped": "power-capped",
    "clock_thermal": "thermal slowdown", "clock_hw_slowdown": "HW slowdown",
    "oom_peak_bytes": "allocator peak when it died", "oom_reserved_bytes": "reserved then", "oom_steps": "steps before it died",
    "oom_batch_size": "batch when it died", "oom_eval_batch_size": "evaluation batch then",
    "oom_inference_batch_size": "inference batch then", "oom_micro_batches": "micro-batches per step",
    "gradient_checkpointing": "gradient checkpointing",
    "loss_nonfinite": "losses NaN or infinite", "loss_nonfinite_step": "since step",
    "loss_finite_last": "last finite loss", "autocast_dtype": "autocast",
    "loss_nonfinite_readings": "NaN or infinite readings in a row",
}
# a unit told by the name's ending, for evidence a rule names itself
_SUFFIX_UNITS = (("_bytes_per_second", "bytes/s"), ("_bytes", "bytes"), ("_ratio", "ratio"),
                 ("_seconds", "seconds"), ("_cores", "cores"), ("_watts", "watts"),
                 ("_celsius", "celsius"), ("_mhz", "MHz"), ("_share", "ratio"))


def evidence_unit(name: str) -> str | None:
    """The unit of an evidence value: the vocabulary's, or told by the name."""
    from gpuwatch.advisor.vocabulary import VOCABULARY

    d = VOCABULARY.get(name)
    if d is not None:
        return d.unit
    for suffix, unit in _SUFFIX_UNITS:
        if name.endswith(suffix):
            return unit
    # a statistic of a signal under a name of its own: loss_scale_max_60s, util_max
    best = max((n for n in VOCABULARY if name.startswith(n + "_")), key=len, default=None)
    return VOCABULARY[best].unit if best is not None else None


def evidence_label(name: str) -> str:
    if name in _LABELS:
        return _LABELS[name]
    for suffix, _ in _SUFFIX_UNITS:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    return name.replace("_", " ")


def _num(v: float, digits: int = 3) -> str:
    """A plain number with about ``digits`` significant digits, never in e-notation."""
    if v == 0 or not math.isfinite(v):
        return "0" if v == 0 else str(v)
    if float(v).is_integer() and abs(v) < 1e15:
        return f"{int(v):d}"
    mag = math.floor(math.log10(abs(v)))
    return f"{v:.{max(0, digits - 1 - mag)}f}"


def percent(v: float, fine_top: bool = False) -> str:
    """Whole percent, but a tenth below 10 % (0.4 % is not 0 %) and, with ``fine_top``
    (how full memory is), from 90 % up (97.5 % vs 99.9 % full is the point). The rule
    templates' ``{x:.0%}`` write the same (rules.human_percent)."""
    from gpuwatch.advisor.rules import human_percent

    return human_percent(v, fine_top)


def duration(v: float) -> str:
    from gpuwatch.advisor.rules import human_duration

    return human_duration(v)


def rate_bytes(v: float) -> str:
    for unit, size in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if abs(v) >= size:
            return f"{v / size:.1f} {unit}"
    return f"{v:.0f} B/s"


def evidence_value(name: str, v: Any) -> str:
    """One evidence value with its unit, at a precision a person reads."""
    from gpuwatch.advisor.rules import format_value, human_bytes

    if v is None or isinstance(v, (bool, str)):
        return format_value(v)
    if not isinstance(v, (int, float)) or not math.isfinite(v):
        return str(v)
    unit = evidence_unit(name)
    if name.endswith("_r2"):  # a fit's R²: a plain number 0-1, not a share of anything
        return f"{v:.3f}"
    if name.endswith(("_gain", "speedup")) or unit == "times":  # a factor
        if v >= 10_000:  # a tiny model's room in a large GPU: the digits say nothing more
            return "over 10,000x"
        return f"{v:.2g}x" if v < 10 else f"{v:.0f}x"
    if unit == "ratio":
        return percent(v, fine_top="mem" in name)
    if unit == "seconds":
        return duration(v)
    if unit == "bytes":
        return human_bytes(v)
    if unit == "bytes/s":
        # link bandwidth (PCIe) is quoted in decimal GB/s everywhere; memory in GiB as the
        # rest of the report (and the rule messages) quote it
        return rate_bytes(v) if name.startswith("pcie") else human_bytes(v) + "/s"
    if unit == "cores":
        return f"{v:.1f} cores"
    if unit in ("count", "samples", "rows", "batches"):
        return f"{v:.0f}" if abs(v - round(v)) < 0.05 else f"{v:.1f}"
    if unit in ("bool", "0/1"):
        if v in (0, 1):
            return "yes" if v else "no"
        return f"{percent(v)} of the time"  # the window's mean of a 0/1 signal
    if unit == "major.minor":
        return f"{v:.1f}"
    if unit == "watts":
        return f"{v:.0f} W"
    if unit == "celsius":
        return f"{v:.0f} °C"
    if unit == "MHz":
        return f"{v:.0f} MHz"
    if unit == "0-15":
        return f"P{v:.0f}"
    if unit in ("steps/s", "samples/s"):
        return f"{_num(v)} {unit}"
    if unit == "1/s":
        return f"{_num(v)} per second"
    if unit == "rank":
        return f"{v:.0f}"
    if unit == "joules":
        return f"{v / 1e3:.1f} kJ" if abs(v) >= 1e4 else f"{v:.0f} J"
    return _num(v)


# -- rendering ------------------------------------------------------------------------------
def _yes(v: bool | None) -> str:
    return "?" if v is None else ("yes" if v else "no")


def _gpu_line(g: dict[str, Any]) -> str:
    s = g["supports"]
    where = f"{g['instance']} " if g.get("instance") else ""
    cc = g.get("compute_capability") or "unknown"
    return (f"{where}GPU {g['gpu']}  {g.get('name') or 'unknown model'}  compute capability {cc}: "
            f"bf16 {_yes(s['bf16'])}, TF32 {_yes(s['tf32'])}, FP8 {_yes(s['fp8'])}, "
            f"tensor cores {_yes(s['tensor_cores'])}; GPM counters {_yes(g['gpm'])}")


def source_line(report: dict[str, Any]) -> str:
    """What the report judged, in words (a recording, a daemon, Prometheus)."""
    src = report.get("source", {})
    kind = src.get("kind")
    if kind == "replay":
        dur = src.get("duration_seconds")
        span = f", {dur:.0f} s" if isinstance(dur, (int, float)) else ""
        served = f", replayed by the daemon at {src['url']}" if src.get("url") else ""
        return f"recording {src.get('path')}{span}{served}"
    if kind == "prometheus":
        return f"Prometheus {src.get('url')}, last {src.get('window_seconds', 0):.0f} s"
    if kind == "live":
        return f"live daemon{(' ' + src['url']) if src.get('url') else ''}"
    return str(kind or "unknown source")


def _evidence_text(ev: dict[str, Any]) -> str:
    return ", ".join(f"{label} {value}" for label, value in evidence_items(ev))


def evidence_items(ev: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value with unit) per evidence entry; two entries that would read alike
    (a share and a duration of one thing) keep their signal names apart."""
    labels = [evidence_label(k) for k in ev]
    out = []
    for (k, v), label in zip(ev.items(), labels, strict=True):
        if labels.count(label) > 1:
            label = k.replace("_", " ")
        out.append((label, evidence_value(k, v)))
    return out


def warming_up_text(report: dict[str, Any]) -> str:
    """A daemon that has not judged enough yet says so, and for how long (docs/report.md)."""
    return f"Warming up: {report['warming_up']['reason']}."


def not_judged_text(report: dict[str, Any]) -> str:
    reason = report.get("judged", {}).get("reason") or "there is no GPU data"
    if any(j.get("gpu") is None for j in report.get("jobs", [])):
        return (f"No GPU in this data: {reason}. What needs a GPU could not be judged; the "
                "job's steps, phases and data loading, measured by the torch hook, were.")
    return (f"Not judged: the GPU and training rules could not be judged, because {reason}. "
            "Only the host was judged.")


def _training_spans(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [g for g in report.get("judged", {}).get("gpus", [])
            if g.get("training_seconds", 0) >= MIN_TRAINING_SECONDS
            and g.get("busy_ratio") is not None]


def _inference_only(j: dict[str, Any]) -> bool:
    """Whether the hook saw this job (rank) only run inference: never a training step."""
    return j.get("phase") == "inference" and not j.get("time_share")


def inference_batches(jobs: Iterable[dict[str, Any]]) -> dict[int, Any]:
    """pid -> inference counts (batches, generate() calls), for the jobs the hook saw
    only run inference."""
    return {j["pid"]: j.get("inference") or {} for j in jobs
            if _inference_only(j) and isinstance(j.get("pid"), int)}


def _inference_gpus(report: dict[str, Any]) -> set[int]:
    """The GPUs whose jobs (all of them) only ran inference, as far as the hook saw."""
    by_gpu: dict[int, bool] = {}
    for j in report.get("jobs", []):
        if j.get("gpu") is None:
            continue
        by_gpu[j["gpu"]] = by_gpu.get(j["gpu"], True) and _inference_only(j)
    return {g for g, only in by_gpu.items() if only}


def _busy_phrase(g: dict[str, Any], inference: Collection[int] = (),
                 bare: Collection[int] = ()) -> str:
    # without the hook nothing tells training from other work on the GPU (the job's
    # breakdown is its "time at work"): the span is the time its job worked there
    what_ran = "ran inference" if g["gpu"] in inference else (
        "ran on it" if g["gpu"] in bare else "trained")
    span = f"{duration(g['training_seconds'])} the job {what_ran}"
    if g.get("busy_signal") == "breakdown":
        return f"GPU {g['gpu']} worked {percent(g['busy_ratio'])} of the {span}"
    what = "SM active" if g.get("busy_signal") == "sm_active" else "util"
    return f"GPU {g['gpu']} was {percent(g['busy_ratio'])} busy ({what}) over the {span}"


def no_advice_text(report: dict[str, Any]) -> str:
    """The verdict when no rule fired, which says what was judged: never "nothing calls for
    a change" about data with no GPU in it, or about a job that left its GPU underused."""
    seen = report.get("judged")
    if not seen:  # a report from an older daemon
        return "No advice: nothing in this data calls for a change."
    # warming up: too little judged to say that nothing calls for a change
    warming = bool(report.get("warming_up"))
    if seen.get("gpu") is False:
        if any(j.get("gpu") is None for j in report.get("jobs", [])):
            return not_judged_text(report) + (" Nothing in them calls for a change yet."
                                              if warming else
                                              " Nothing in them calls for a change.")
        return not_judged_text(report) + (" The host rules are still warming up (above)."
                                          if warming else
                                          " Nothing on the host calls for a change.")
    if warming:
        return "No advice yet: the advisor is warming up (above)."
    if seen.get("training") is False:
        # a job whose steps the report breaks down (the hook's): the training seconds
        # judged for its GPU (NVML's process alone may be start-up or an idle holder)
        stepped = {j.get("gpu") for j in report.get("jobs", []) if j.get("seconds")}
        short = [g for g in seen.get("gpus") or []
                 if g.get("training_seconds", 0) > 0 and g.get("gpu") in stepped]
        if short:
            # it trained, too briefly to judge: never "no training job" beside its figures
            said = "; ".join(f"GPU {g['gpu']} {g['training_seconds']:g} s" for g in short)
            return (f"No advice: the training seen was too short to judge ({said}; a job is "
                    f"judged once it has trained {MIN_TRAINING_SECONDS:g} s), and the GPU "
                    "health rules found nothing wrong.")
        return ("No advice: no training job ran on a GPU in this data (no steps from the "
                "torch hook, no process working on a GPU), and the GPU health rules found "
                "nothing wrong.")
    spans = _training_spans(report)
    inference = _inference_gpus(report)
    jobs = [j for j in report.get("jobs", []) if j.get("time_share")]
    # the GPUs no job of the hook's ran on: nothing there tells training from other work
    hooked = {j.get("gpu") for j in report.get("jobs", []) if j.get("source") == "hook"}
    bare = {g["gpu"] for g in spans if g["gpu"] not in hooked}
    under = [g for g in spans if g["busy_ratio"] < UNDERUSED_BELOW]
    if under and all(g["gpu"] in inference for g in under):
        return ("No rule named the cause, but the GPU was not used fully: "
                + "; ".join(_busy_phrase(g, inference, bare) for g in under)
                + f". An inference process that keeps its GPU under "
                f"{percent(UNDERUSED_BELOW)} busy has time to win back: more requests per "
                "batch, fewer host syncs between them, and CUDA graphs "
                "(torch.compile(mode=\"reduce-overhead\")) for the per-call launch cost.")
    if under:
        said = ("No rule named the cause, but the GPU was not used fully: "
                + "; ".join(_busy_phrase(g, inference, bare) for g in under))
        # where a kernel ran through most of each one's host share (NVML util above SM
        # active: attribution.host_kernel_share), the kernels leave the SMs idle: fewer
        # host syncs or more workers would not fill them
        kernels = [_kernels_through_host(jobs, g["gpu"]) for g in under]
        if all(k is not None for k in kernels):
            ranked = any((j.get("ranks") or 1) > 1 for j in jobs
                         if j.get("gpu") in {g["gpu"] for g in under})
            return (said + ". In most of the time its SMs idled, a kernel was running ("
                    + ", ".join(f"GPU {g['gpu']}: {percent(k)} of the {percent(host)}"
                                for g, (k, host) in zip(under, kernels, strict=True))
                    + "): while they run, its kernels leave SMs idle (too few blocks for "
                    "every SM, or a wave's tail"
                    + ("; on a rank, the collectives' kernels too, which hold a few SMs"
                       if ranked else "")
                    + "), which launching them sooner would not change; a larger batch (or "
                    "more tokens or pixels a sample) gives each kernel more blocks, and "
                    "torch.compile fuses the small element-wise ones.")
        return (said
                + (". A job" if all(g["gpu"] in bare for g in under) else ". A training job")
                + f" that keeps its GPU under {percent(UNDERUSED_BELOW)} "
                "busy has time to win back: look at where each step's time goes (step time, "
                "data wait, the main process's CPU: the torch hook measures them), then a "
                "larger batch, more DataLoader workers or fewer host syncs.")
    if spans:
        return ("No advice: nothing in this data calls for a change. "
                + "; ".join(_busy_phrase(g, inference, bare) for g in spans) + ".")
    return "No advice: nothing in this data calls for a change."


_CATEGORY_NAMES = {"data": "data wait", "sync": "waiting on peers", "gpu": "GPU work",
                   "host": "host", "other": "other"}


_PHASE_NAMES = {"startup": "start-up", "compile": "compiling", "train": "training",
                "eval": "evaluation", "checkpoint": "checkpoints", "inference": "inference",
                "after_steps": "after its last step"}


def _kernels_through_host(jobs: list[dict[str, Any]], gpu: int
                          ) -> tuple[float, float] | None:
    """(the share of the time a kernel ran while the SMs of ``gpu``'s job idled, that
    job's host share), where the first is most of the second, the host's is the largest
    of the time lost, and it is worth saying (HOST_KERNELS_SAID); else None (and for a
    GPU of several jobs)."""
    mine = [j for j in jobs if j.get("gpu") == gpu]
    if len(mine) != 1:
        return None
    k = mine[0].get("host_kernel_share")
    shares = mine[0].get("time_share") or {}
    host = shares.get("host")
    if k is None or host is None or k < HOST_KERNELS_SAID or k < 0.5 * host:
        return None
    # the host's the largest of the time lost (not a job mostly waiting on data or away)
    if host < max(shares.get(c) or 0.0 for c in ("data", "sync", "other")):
        return None
    return k, host


# the part of the host share with a kernel running (attribution.host_kernel_share) is
# said beside it from this much of the time on (below it, the tail of any busy GPU's
# kernels: 4-7 % on the fw_* runs whose SMs are 90 % active)
HOST_KERNELS_SAID = 0.1


def host_kernels_note(j: dict[str, Any]) -> str | None:
    """What of a job's host share had a kernel running (the SMs idle inside it), where
    it is enough to say: the host's share counts the SMs idle, not the GPU waiting."""
    k = j.get("host_kernel_share")
    if j.get("gpu") is None or k is None or k < HOST_KERNELS_SAID:
        return None
    return f"in {percent(k)} of the time a kernel ran but left the SMs idle"


def job_where(j: dict[str, Any]) -> str:
    where = f"{j['instance']} " if j.get("instance") else ""
    return f"{where}GPU {j['gpu']}" if j.get("gpu") is not None else f"{where}CPU-only job"


def job_line(j: dict[str, Any]) -> str:
    """One job's (rank's) step-time breakdown: where its training time went."""
    who = [f"pid {j['pid']}"] if j.get("pid") is not None else []
    if j.get("rank") is not None and (j.get("ranks") or 1) > 1:
        who.append(f"rank {j['rank']}")
    if j.get("framework"):
        who.append(j["framework"])
    who_txt = f" ({', '.join(who)})" if who else ""
    shares = j.get("time_share")
    if not shares:
        if j.get("phase") == "inference":
            inf = j.get("inference") or {}
            # generate_calls 0: every one was a DataLoader's batch (None: an older hook's
            # recording, which did not tell them apart)
            kind = "batches" if inf.get("generate_calls") == 0 else "batches or generate() calls"
            what = (f"{inf['batches']} {kind} of {inf.get('batch_size')}"
                    if inf.get("batches") else "forward passes only")
            return f"{job_where(j)}{who_txt}: inference only, never a backward ({what})"
        return f"{job_where(j)}{who_txt}: no training step measured yet"
    cpu = j.get("gpu") is None
    names = dict(_CATEGORY_NAMES, host="the step's own work on the CPU") if cpu \
        else _CATEGORY_NAMES
    kernels = host_kernels_note(j)
    parts = ", ".join(f"{names.get(c, c)} {percent(v)}"
                      + (f" ({kernels})" if c == "host" and kernels else "")
                      for c, v in sorted(shares.items(), key=lambda kv: -kv[1])
                      if not (cpu and c in ("gpu", "sync")))
    tail = []
    if j.get("step_seconds"):
        tail.append(f"step {duration(j['step_seconds'])}")
    if (j.get("micro_batches") or 1) > 1.05:
        tail.append(f"{j['micro_batches']:g} micro-batches per step")
    if j.get("source") == "nvml":
        tail.append("estimated without the hook")
    tail_txt = f" ({', '.join(tail)})" if tail else ""
    # without the hook nothing tells training from inference (or start-up): the split is
    # of all the time the process worked, and not called training
    label = "time at work" if j.get("source") == "nvml" else "training time"
    return f"{job_where(j)}{who_txt} {label}: {parts}{tail_txt}"


def phases_line(j: dict[str, Any]) -> str | None:
    """Where a job's wall time went by phase (the hook's phases), or None without them."""
    phases = j.get("phases") or {}
    total = sum(phases.values())
    if not total:
        return None
    order = ("startup", "compile", "train", "eval", "checkpoint", "inference", "after_steps")
    parts = [f"{_PHASE_NAMES[p]} {duration(phases[p])} ({percent(phases[p] / total)})"
             for p in order if phases.get(p)]
    return f"    by phase: {', '.join(parts)}"


def hook_text(report: dict[str, Any]) -> str:
    """What the torch hook gave this report: steps, settings, phases, or none."""
    hook = report.get("hook", {})
    seen = [what for what, got in (("steps", hook.get("steps")), ("settings", hook.get("config")),
                                   ("phases", hook.get("phases"))) if got]
    return ", ".join(seen) or "none"


# what a text or Markdown block shows of a piece of advice, as it shows it: the same on
# several GPUs (the ranks of one job told to fuse their optimizer) is one block naming them
_SHOWN = ("id", "severity", "active", "instance", "title", "message", "action",
          "expected_gain_text", "hook_would_add")
# what must match for pieces that differ only in their figures (the ranks of one DDP job,
# each busy 21-22 % of its steps) to be one block: the same change, said with one GPU's
# figures and the evidence's range over all of them
_SAME_CHANGE = ("id", "severity", "active", "instance", "title", "hook_would_add")
# the figures of a message, left out where two messages are compared for their words
_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")  # "65,771" is one
# the figures of an action that describe the GPU rather than the change (its memory per
# sample, how many would fit: "~816", "66.5 MiB", "85 %"); the change itself ("=1 → 8",
# "x8") must be the same for pieces to join
_ACTION_FIGURE = re.compile(r"~\d{1,3}(?:,\d{3})+(?:\.\d+)?|~\d+(?:\.\d+)?"
                            r"|\d+(?:\.\d+)?(?= ?(?:[KMGT]i?B|%))")


def grouped(advice: list[dict[str, Any]], lockstep: list[tuple[Any, frozenset[int]]] = ()
            ) -> list[tuple[dict[str, Any], list[int | None]]]:
    """``advice`` in its order, each piece with the GPUs it reads the same on: a piece
    whose every shown field equals an earlier one's joins that one's block; so does one
    that asks for the same change on the same evidence with other figures, and the block's
    piece then carries ``spread``: each evidence entry that differs, as its range.
    ``lockstep``: the GPUs of each job whose ranks step together (``lockstep_gpus``); a
    block within one of them quotes the least of its pieces' gains, not its lead's."""
    return [(lead, gpus) for lead, gpus, _ in blocks_of(advice, lockstep)]


def lockstep_gpus(report: dict[str, Any]) -> list[tuple[Any, frozenset[int]]]:
    """(instance, GPUs) of each job whose ranks step together: the report's jobs of one
    rank count N > 1 that are exactly N entries with N distinct ranks (two jobs of the same
    size on one host cannot be told apart here, and are left out)."""
    by: dict[tuple[Any, int], list[dict[str, Any]]] = {}
    for j in report.get("jobs", []):
        n = j.get("ranks") or 1
        if n > 1 and j.get("gpu") is not None and j.get("rank") is not None:
            by.setdefault((j.get("instance"), n), []).append(j)
    return [(inst, frozenset(j["gpu"] for j in js)) for (inst, n), js in by.items()
            if len(js) == n and len({j["rank"] for j in js}) == n]


def _lockstep_gain(lead: dict[str, Any], group: list[dict[str, Any]],
                   lockstep: list[tuple[Any, frozenset[int]]]) -> dict[str, Any]:
    """The block's lead with the gain of its least-gaining piece where the block's GPUs
    are ranks of one job: they step together, so the job goes as fast as the rank that
    gains least (each piece's gain is its own GPU's)."""
    gains = [a.get("expected_gain") for a in group]
    if len(group) < 2 or not all(isinstance(g, (int, float)) for g in gains) \
            or len(set(gains)) == 1:
        return lead
    gpus = {a.get("gpu") for a in group}
    inst = lead.get("instance")
    if not any(i == inst and gpus <= ranks for i, ranks in lockstep):
        return lead
    least = min(group, key=lambda a: a["expected_gain"])
    text = least.get("expected_gain_text")
    if not text or text == lead.get("expected_gain_text"):
        return lead  # the same figure once shown
    return dict(lead, expected_gain=least["expected_gain"],
                expected_gain_text=f"{text} (GPU {least.get('gpu')}'s, the least of its "
                                   f"ranks': they step together, so the job goes no faster "
                                   f"than the rank that gains least)")


def blocks_of(advice: list[dict[str, Any]], lockstep: list[tuple[Any, frozenset[int]]] = ()
              ) -> list[tuple[dict[str, Any], list[int | None], list[dict[str, Any]]]]:
    """As ``grouped``, with each block's pieces (``advice``'s own dicts, in its order)."""
    blocks: list[tuple[dict[str, Any], list[int | None]]] = []
    members: list[list[dict[str, Any]]] = []
    seen: dict[str, int] = {}
    alike: dict[str, int] = {}
    for a in advice:
        ev = a.get("evidence") or {}
        key = json.dumps([a.get(k) for k in _SHOWN]
                         + [f"{a.get('confidence', 0):.2f}", _evidence_text(ev)], default=str)
        change = json.dumps([a.get(k) for k in _SAME_CHANGE]
                            + [_ACTION_FIGURE.sub("#", a.get("action") or ""),
                               f"{a.get('confidence', 0):.2f}", sorted(ev),
                               _NUMBER.sub("#", a.get("message") or "")], default=str)
        i = seen.get(key, alike.get(change))
        if i is not None and a.get("gpu") is not None and blocks[i][1][0] is not None:
            blocks[i][1].append(a["gpu"])
            members[i].append(a)
            continue
        seen.setdefault(key, len(blocks))
        alike.setdefault(change, len(blocks))
        blocks.append((a, [a.get("gpu")]))
        members.append([a])
    out = []
    for (lead, gpus), group in zip(blocks, members, strict=True):
        spread = _spread(group)
        shown = sorted(gpus) if None not in gpus else gpus  # named in order; led by its first
        lead = _lockstep_gain(lead, group, lockstep)
        out.append((dict(lead, spread=spread) if spread else lead, shown, group))
    return out


def _spread(group: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(label, range) for each evidence entry whose value differs between the pieces of
    one block: numbers as lowest-highest, anything else as its values in turn."""
    if len(group) < 2:
        return []
    out = []
    gains = [a.get("expected_gain") for a in group]
    if all(isinstance(g, (int, float)) for g in gains) and len(
            {evidence_value("expected_gain", g) for g in gains}) > 1:
        out.append(("expected gain", f"{evidence_value('expected_gain', min(gains))} to "
                                     f"{evidence_value('expected_gain', max(gains))}"))
    evs = [a.get("evidence") or {} for a in group]
    lead = evs[0]
    labels = dict(zip(lead, (label for label, _ in evidence_items(lead)), strict=True))
    for k in lead:
        values = [ev.get(k) for ev in evs]
        shown = [evidence_value(k, v) for v in values]
        if len(set(shown)) == 1:
            continue
        nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
                and math.isfinite(v)]
        if len(nums) == len(values):
            lo, hi = evidence_value(k, min(nums)), evidence_value(k, max(nums))
            text = lo if lo == hi else f"{lo} to {hi}"
        else:
            text = " / ".join(dict.fromkeys(shown))
        out.append((labels[k], text))
    return out


def spread_text(a: dict[str, Any], gpus: list[int | None]) -> str | None:
    """The line under a block whose GPUs read alike but for their figures."""
    spread = a.get("spread")
    if not spread:
        return None
    ranges = ", ".join(f"{label} {text}" for label, text in spread)
    return (f"The figures above are GPU {a.get('gpu')}'s; over GPUs "
            f"{', '.join(str(g) for g in gpus)}: {ranges}.")


def where_text(a: dict[str, Any], gpus: list[int | None]) -> str:
    if gpus[0] is None:
        where = "host"
    elif len(gpus) == 1:
        where = f"GPU {gpus[0]}"
    else:
        where = "GPUs " + ", ".join(str(g) for g in gpus)
    return f"{a['instance']} {where}" if a.get("instance") else where


def same_on(n: int, blocks: int) -> str:
    """The header's note where some blocks stand for several GPUs."""
    if n == blocks:
        return ""
    return f" ({blocks} block{'s' if blocks != 1 else ''}: the same on several GPUs is one)"


# a number and its unit stay on one line when a paragraph wraps ("16 %", "380 ms", "2.0 GiB"):
# the space between them is held as a no-break space while wrapping (textwrap breaks only at
# ASCII whitespace), then given back
_NBSP = "\u00a0"
_GLUE = re.compile(r"(?<=\d) (?=(?:%|[µm]?s|min|h|[KMGT]i?B(?:/s)?|B(?:/s)?|cores?|W|MHz|°C)"
                   r"(?![\w/]))")


class _Wrapper(textwrap.TextWrapper):
    """Wraps at spaces only: a number keeps its unit, and a hyphenated word or argument
    (mode="reduce-overhead") is never split at its hyphen."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(break_on_hyphens=False, **kw)

    def wrap(self, text: str) -> list[str]:
        return [line.replace(_NBSP, " ") for line in super().wrap(_GLUE.sub(_NBSP, text))]


def _wrap(text: str, width: int, **kw: Any) -> list[str]:
    return _Wrapper(width=width, **kw).wrap(text)


def render_text(report: dict[str, Any], width: int | None = None) -> str:
    width = width or min(100, max(60, shutil.get_terminal_size((100, 24)).columns))
    hook_txt = hook_text(report)
    lines = [f"gpuwatch advice: {source_line(report)} (torch hook data: {hook_txt})", ""]
    if report.get("warming_up"):
        lines += _wrap(warming_up_text(report), width=width) + [""]
    for g in report.get("gpus", []):
        lines.append(_gpu_line(g))
    for j in report.get("jobs", []):
        lines.append(job_line(j))
        by_phase = phases_line(j)
        if by_phase:
            lines.append(by_phase)
    if report.get("gpus") or report.get("jobs"):
        lines.append("")
    for end in report.get("job_ends", []):
        lines += _wrap("Ended: " + end["summary"] + ".", width=width,
                               subsequent_indent="    ")
    if report.get("job_ends"):
        lines.append("")
    advice = report.get("advice", [])
    if not advice:
        lines += _wrap(no_advice_text(report), width=width)
    else:
        if report.get("judged", {}).get("gpu") is False:
            lines += _wrap(not_judged_text(report), width=width) + [""]
    blocks = grouped(advice, lockstep_gpus(report))
    if advice:
        lines += _wrap(f"{_pieces(len(advice))}{same_on(len(advice), len(blocks))}"
                               f", {_order_text(advice)}:", width=width)
    wrap = _Wrapper(width=width, initial_indent="    ", subsequent_indent="    ")
    for i, (a, gpus) in enumerate(blocks, 1):
        where = where_text(a, gpus)
        state = "" if a.get("active", True) else " (ended)"
        lines.append("")
        lines.append(f"{i}. [{a['severity'].upper()}] {a['id']} on {where}, confidence "
                     f"{a['confidence']:.2f}{state}")
        lines += wrap.wrap(a["title"])  # indented as the body under it
        lines += wrap.wrap(a["message"])
        if a.get("evidence"):
            lines += wrap.wrap("Evidence: " + _evidence_text(a["evidence"]))
        spread = spread_text(a, gpus)
        if spread:
            lines += wrap.wrap(spread)
        lines += wrap.wrap("Change: " + a["action"])
        if a.get("expected_gain_text"):
            lines += wrap.wrap("Expected gain: " + a["expected_gain_text"])
        if a.get("hook_would_add"):
            lines += wrap.wrap("With the hook: " + a["hook_would_add"])
    for note in report.get("notes", []):
        lines.append("")
        lines += _wrap("Note: " + note, width=width)
    return "\n".join(lines) + "\n"


def render_markdown(report: dict[str, Any]) -> str:
    lines = [f"# gpuwatch advice: {source_line(report)}", "",
             f"Torch hook data: {hook_text(report)}.", ""]
    if report.get("warming_up"):
        lines += [f"> {warming_up_text(report)}", ""]
    if report.get("gpus"):  # (no GPU in the data: the verdict says so, no empty table)
        lines += ["## GPUs", "",
                  "| GPU | model | compute capability | bf16 | TF32 | FP8 | GPM |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
    for g in report.get("gpus", []):
        s = g["supports"]
        where = f"{g['instance']} {g['gpu']}" if g.get("instance") else str(g["gpu"])
        lines.append(f"| {where} | {g.get('name') or '?'} | {g.get('compute_capability') or '?'}"
                     f" | {_yes(s['bf16'])} | {_yes(s['tf32'])} | {_yes(s['fp8'])} "
                     f"| {_yes(g['gpm'])} |")
    if report.get("jobs"):
        split = [j for j in report["jobs"] if j.get("time_share")]
        bare = bool(split) and all(j.get("source") == "nvml" for j in split)
        what = ("Each job's (rank's) time at work, estimated without the hook (nothing "
                "there tells training from inference or start-up), split so the parts add "
                "up to 100 % (docs/advice.md, step-time attribution)." if bare else
                "Each job's (rank's) training time, split so the parts add up to 100 % "
                "(docs/advice.md, step-time attribution); evaluation, checkpoints and "
                "start-up are phases of their own, below.")
        lines += ["", "## Where the time went", "", what, "",
                  "| GPU | job | data wait | waiting on peers | GPU work | host | other "
                  "| step | bottleneck |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for j in report["jobs"]:
            if not j.get("time_share"):
                continue
            gpu = "CPU" if j.get("gpu") is None else str(j["gpu"])
            where = f"{j['instance']} {gpu}" if j.get("instance") else gpu
            who = " ".join(x for x in (f"pid {j['pid']}" if j.get("pid") is not None else "",
                                       f"rank {j['rank']}" if j.get("rank") is not None
                                       and (j.get("ranks") or 1) > 1 else "") if x) or "?"
            shares = j.get("time_share") or {}
            kernels = host_kernels_note(j)
            cells = " | ".join((percent(shares[c]) if c in shares else "?")
                               + (f" ({kernels})" if c == "host" and kernels else "")
                               for c in ("data", "sync", "gpu", "host", "other"))
            step = duration(j["step_seconds"]) if j.get("step_seconds") else (
                "no hook" if j.get("source") == "nvml" else "?")
            lines.append(f"| {where} | {who} | {cells} | {step} | "
                         f"{_CATEGORY_NAMES.get(j.get('bottleneck'), j.get('bottleneck') or '?')} |")
    phased = [j for j in report.get("jobs", []) if j.get("phases")]
    if phased:
        lines += ["", "## Phases", "",
                  "| GPU | job | start-up | compiling | training | evaluation | checkpoints "
                  "| inference |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for j in phased:
            gpu = "CPU" if j.get("gpu") is None else str(j["gpu"])
            ph = j["phases"]
            cells = " | ".join(duration(ph[p]) if ph.get(p) else "–"
                               for p in ("startup", "compile", "train", "eval", "checkpoint",
                                         "inference"))
            who = f"pid {j['pid']}" if j.get("pid") is not None else "?"
            lines.append(f"| {gpu} | {who} | {cells} |")
    if report.get("job_ends"):
        lines += ["", "## Job ends", ""]
        lines += [f"- {end['summary']}." for end in report["job_ends"]]
    lines += ["", "## Advice", ""]
    advice = report.get("advice", [])
    if not advice:
        lines.append(no_advice_text(report))
    elif report.get("judged", {}).get("gpu") is False:
        lines += [not_judged_text(report), ""]
    blocks = grouped(advice, lockstep_gpus(report))
    if len(blocks) < len(advice):
        lines += [f"{_pieces(len(advice))}{same_on(len(advice), len(blocks))}.", ""]
    for i, (a, gpus) in enumerate(blocks, 1):
        where = where_text(a, gpus)
        state = "" if a.get("active", True) else ", ended"
        lines += [(f"### {i}. `{a['id']}` ({a['severity']}, {where}, confidence "
                  f"{a['confidence']:.2f}{state})"), "", f"**{a['title']}**", "", a["message"], ""]
        # in the text report's order: message, evidence, change, gain, what the hook adds
        if a.get("evidence"):
            lines += ["| evidence | value |", "| --- | --- |"]
            lines += [f"| `{k}` | {evidence_value(k, v)} |" for k, v in a["evidence"].items()]
            lines.append("")
        spread = spread_text(a, gpus)
        if spread:
            lines += [spread, ""]
        lines += [f"**Change:** {a['action']}", ""]
        if a.get("expected_gain_text"):
            lines += [f"**Expected gain:** {a['expected_gain_text']}", ""]
        if a.get("hook_would_add"):
            lines += [f"*With the hook:* {a['hook_would_add']}", ""]
    for note in report.get("notes", []):
        lines += ["", f"> {note}"]
    return "\n".join(lines).rstrip() + "\n"
