"""How each training process ended, for the report: from the `job_end` lines (docs/trace-format.md).

One entry per ended process, with the raw fields (Unix seconds, bytes) and ``summary``, a
sentence a person reads, e.g. "job pid 123 (rank 0, GPU 0) died of CUDA out of memory at
14:02:11 UTC, 61 s after its first step, after 512 steps; allocator 75.2 GiB in use".
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from gpuwatch.advisor.rules import human_bytes

_FIELDS = ("t", "pid", "rank", "gpu", "exit_reason", "error", "steps_total", "first_step_t",
           "last_report_t", "mem_allocated_bytes", "mem_reserved_bytes",
           "max_mem_allocated_bytes")
MAX_ERROR_SHOWN = 200  # characters of the error text in the sentence (all of it in the JSON)


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(t))


def _how(e: Mapping[str, Any]) -> str:
    reason = e.get("exit_reason")
    error = e.get("error") or ""
    shown = error if len(error) <= MAX_ERROR_SHOWN else error[:MAX_ERROR_SHOWN - 1] + "…"
    if reason == "oom":
        what = "CUDA out of memory" if "cuda" in error.lower() else "out of memory"
        return f"died of {what}" + (f" ({shown})" if shown else "")
    if reason == "exception":
        return "died of an uncaught exception" + (f" ({shown})" if shown else "")
    if reason == "interrupted":
        return "was interrupted (Ctrl-C)"
    if reason == "killed":
        return "was killed by a signal"
    if reason == "vanished":
        return ("vanished without an exit report (killed by a signal, or by the kernel's "
                "OOM killer)")
    if reason == "exited":
        return "exited"
    return f"ended ({reason})"


def summary(e: Mapping[str, Any], inference: Any = None) -> str:
    """One sentence for an ending; ``inference``: what the hook counted where the process
    ran inference and never trained (its report's ``inference``: batches and generate()
    calls; or the batches alone)."""
    who = [f"rank {e['rank']}" if e.get("rank") is not None else None,
           f"GPU {e['gpu']}" if e.get("gpu") is not None else None]
    who_text = ", ".join(w for w in who if w)
    text = f"job pid {e['pid']}" + (f" ({who_text})" if who_text else "") + " " + _how(e)
    t = e.get("t")
    last = e.get("last_report_t")
    if e.get("exit_reason") == "vanished" and last is not None:
        t = last
        text += f"; last heard from at {_clock(last)}"
    elif t is not None:
        text += f" at {_clock(t)}"
    first = e.get("first_step_t")
    if first is not None and t is not None:
        text += f", {max(0.0, t - first):.0f} s after its first step"
    elif not e.get("steps_total") and inference:
        # the inference counts (a mapping: batches, generate_calls), or the batches alone
        if isinstance(inference, Mapping):
            counted = inference.get("batches")
            kind = ("batches" if inference.get("generate_calls") == 0
                    else "batches or generate() calls")
        else:
            counted, kind = inference, "batches or generate() calls"
        if counted:
            text += f", having run inference only ({counted} {kind})"
        else:
            text += ", having run inference only"
    elif not e.get("steps_total"):
        text += ", before its first step"
    if e.get("steps_total"):
        n = e["steps_total"]
        text += f", after {n} step{'s' if n != 1 else ''}"
    mem = e.get("mem_allocated_bytes")
    if mem is not None:
        text += f"; allocator {human_bytes(mem)} in use"
        peak = e.get("max_mem_allocated_bytes")
        if peak is not None and peak > mem:
            text += f" (peak {human_bytes(peak)})"
    return text


def entries(lines: Iterable[Mapping[str, Any]],
            inference: Mapping[int, Any] | None = None) -> list[dict[str, Any]]:
    """The report's ``job_ends`` list, in time order; one per process (its first end).
    ``inference``: pid -> inference counts, for the processes that only ran inference."""
    out: dict[int, dict[str, Any]] = {}
    for line in lines:
        pid = line.get("pid")
        if isinstance(pid, int) and pid not in out:
            entry = {k: line.get(k) for k in _FIELDS}
            entry["summary"] = summary(entry, (inference or {}).get(pid))
            out[pid] = entry
    return sorted(out.values(), key=lambda e: e.get("t") or 0.0)
