"""The ``gpuwatch-trace/1`` format: reading (validated), writing, and the meta line.

A trace is JSON Lines: a ``meta`` line first, then ``gpu``, ``host``, ``step`` and
``config`` lines in time order (docs/trace-format.md). Writers omit what was not measured;
readers treat a missing field as "not measured" and ignore fields they don't know, so a
newer writer's extra fields never break an older reader.

What a reader does with a problem:

- fatal, collected and reported together in one ``FileFormatError`` (up to
  ``MAX_PROBLEMS`` of them, each as ``file:line: message``): a missing or foreign meta line,
  a line that is not JSON, a missing or non-numeric ``t``, a missing ``kind``, a known field
  of the wrong type or out of range, time going backwards;
- skipped with a warning (counted, logged once per file, kept in ``Trace.warnings``): lines
  of an unknown kind (a newer format's additions), a second meta line, and a truncated last
  line (a recorder killed mid-write loses only the line it was writing); a compressed file
  that ends early is read up to where it ends.

Files ending in ``.gz`` (or starting with the gzip magic) are read and written compressed.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import logging
import math
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import IO, TYPE_CHECKING, Any

from gpuwatch import __version__
from gpuwatch.errors import FileFormatError, file_error
from gpuwatch.nonfinite import NONFINITE_LOSS, nonfinite_name
from gpuwatch.samples import (
    TRACE_FORMAT,
    ConfigSample,
    GpuInfo,
    GpuProcess,
    GpuSample,
    HookProblem,
    HostSample,
    JobEnd,
    JobTree,
    PhaseSample,
    Sample,
    StepSample,
    StepsSample,
)

if TYPE_CHECKING:
    from typing_extensions import Self

log = logging.getLogger(__name__)

MAX_PROBLEMS = 20
_FORMAT_PREFIX = "gpuwatch-trace/"
# a ratio a little above 1 is rounding in the source (GPM math, CPU jiffies), not a bad file
_RATIO_SLACK = 1e-3
_RATIO_MAX = 1.0 + _RATIO_SLACK


# -- field checkers: each returns the value as the sample wants it, or raises _Bad ---------
class _Bad(Exception):
    pass


def _json_error(raw: bytes, err: BaseException) -> str:
    """Why ``raw`` is not a JSON line, in the words of what is wrong with it (json.loads
    on bytes guesses UTF-16 or UTF-32 from NUL bytes, and its error names that codec)."""
    if isinstance(err, RecursionError):
        return "nested too deeply"
    if b"\0" in raw:
        return ("it holds NUL bytes: not UTF-8 text (a file saved as UTF-16, or zeros a "
                "crash left behind)")
    return str(err)


def _show(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


Check = Callable[[str, Any], Any]


def _number(lo: float | None = None, hi: float | None = None, what: str = "a number") -> Check:
    low = -math.inf if lo is None else lo
    high = math.inf if hi is None else hi

    def check(name: str, v: Any) -> Any:
        kind = type(v)  # exact types first: this runs for nearly every field of every line
        if kind is float:
            if math.isnan(v):
                return None  # NaN is how some sources say "not measured"
            if low <= v <= high and v not in (math.inf, -math.inf):
                return v
        elif kind is int and low <= v <= high and -_FINITE <= v <= _FINITE:
            return v  # (an int past the largest float is no number the advisor can use)
        raise _Bad(f"field '{name}' must be {what}, got {_show(v)}")
    return check


def _integer(lo: int | None = 0, what: str = "a whole number >= 0") -> Check:
    def check(name: str, v: Any) -> Any:
        if isinstance(v, float) and v.is_integer():
            v = int(v)  # 1.5e11 from a writer that does not keep ints
        if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo) \
                or not -_FINITE <= v <= _FINITE:
            raise _Bad(f"field '{name}' must be {what}, got {_show(v)}")
        return v
    return check


def _loss(name: str, v: Any) -> Any:
    """A step's loss: any number, or "nan", "inf", "-inf" (a diverged run's loss, which is
    the fact to tell, not a value "not measured"). A NaN literal, as older recordings wrote
    it, is the loss's NaN too."""
    kind = type(v)
    if kind is float or (kind is int and -_FINITE <= v <= _FINITE):
        return v
    if kind is str and v in NONFINITE_LOSS:
        return NONFINITE_LOSS[v]
    raise _Bad(f"field '{name}' must be a number, or \"nan\", \"inf\" or \"-inf\", "
               f"got {_show(v)}")


_ratio = _number(0.0, _RATIO_MAX, "a number 0-1")
_nonneg = _number(0.0, None, "a number >= 0")
_anynum = _number()
_count = _integer()
_any_int = _integer(None, "a whole number")


def _string(name: str, v: Any) -> Any:
    if not isinstance(v, str):
        raise _Bad(f"field '{name}' must be a string, got {_show(v)}")
    return v


def _boolean(name: str, v: Any) -> Any:
    if not isinstance(v, bool):
        raise _Bad(f"field '{name}' must be true or false, got {_show(v)}")
    return v


# The fast path's tables (``_fast_values``): per field, (exact types, low, high) for a
# plain value, or the checker itself for a list or object. Ranges are those of the checkers
# above; floats must also be finite, hence the largest float as the open end (a bigger int
# is left to the full check). bool is its own type, so true is never taken for 1.
_FINITE = sys.float_info.max
_NUMERIC = frozenset({int, float})
_INT = frozenset({int})


def _fast_rule(check: Check) -> Any:
    if check is _ratio:
        return (_NUMERIC, 0.0, _RATIO_MAX)
    if check is _nonneg:
        return (_NUMERIC, 0.0, _FINITE)
    if check is _anynum or check is _loss:  # (a loss that is not finite: the full check)
        return (_NUMERIC, -_FINITE, _FINITE)
    if check is _count:
        return (_INT, 0, _FINITE)
    if check is _any_int:
        return (_INT, -_FINITE, _FINITE)
    if check is _string:
        return (frozenset({str}), None, None)
    if check is _boolean:
        return (frozenset({bool}), None, None)
    return check


def _capability(name: str, v: Any) -> Any:
    if (not isinstance(v, list) or len(v) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1000
                       for x in v)):
        raise _Bad(f"field '{name}' must be [major, minor], got {_show(v)}")
    return (v[0], v[1])


def _ratios(name: str, v: Any) -> Any:
    # every host line has one per core: test the usual all-floats-in-range list at once
    if type(v) is list and all(type(x) is float and 0.0 <= x <= _RATIO_MAX for x in v):
        return tuple(v)
    if not isinstance(v, list):
        raise _Bad(f"field '{name}' must be a list of numbers 0-1, got {_show(v)}")
    out = []
    for i, x in enumerate(v):
        value = _ratio(f"{name}[{i}]", x)
        if value is None:  # a list can't leave one core out, and 0 would be a lie
            raise _Bad(f"field '{name}[{i}]' must be a number 0-1, got NaN")
        out.append(value)
    return tuple(out)


def _objects(spec: Mapping[str, Check], required: Sequence[str]) -> Check:
    """A list of objects (processes, job trees), each as the dict of its checked fields.

    Dicts rather than GpuProcess/JobTree: the advisor reads them by name, and a sample
    builds its records from them (``_sample``).
    """
    table = {name: _fast_rule(c) for name, c in spec.items()}

    def usual(item: dict[str, Any]) -> bool:
        for name in required:
            if name not in item:
                return False
        for name, v in item.items():
            rule = table.get(name)
            if type(rule) is not tuple:  # unknown (to drop) or nested: the full check
                return False
            types, lo, hi = rule
            if type(v) not in types or (lo is not None and not lo <= v <= hi):
                return False
        return True

    def check(name: str, v: Any) -> Any:
        if not isinstance(v, list):
            raise _Bad(f"field '{name}' must be a list, got {_show(v)}")
        out = []
        for i, item in enumerate(v):
            if not isinstance(item, dict):
                raise _Bad(f"field '{name}[{i}]' must be an object, got {_show(item)}")
            out.append(item if usual(item) else _fields(item, spec, required, f"{name}[{i}]."))
        return tuple(out)
    return check


def _xids(name: str, v: Any) -> Any:
    if not isinstance(v, dict):
        raise _Bad(f"field '{name}' must be an object of XID code to count, got {_show(v)}")
    out = {}
    for key, count in v.items():
        try:
            code = int(key)
        except ValueError:
            raise _Bad(f"field '{name}' has a key that is not an XID code: {key!r}") from None
        out[code] = _count(f"{name}.{key}", count)
    return out


_PROCESS: dict[str, Check] = {"pid": _count, "mem_used_bytes": _count, "sm_util": _ratio,
                              "name": _string, "user": _string}
def _indices(name: str, v: Any) -> Any:
    if not isinstance(v, list):
        raise _Bad(f"field '{name}' must be a list of GPU indices, got {_show(v)}")
    return tuple(_count(f"{name}[{i}]", x) for i, x in enumerate(v))


def _counts_by_name(name: str, v: Any) -> Any:
    if not isinstance(v, dict):
        raise _Bad(f"field '{name}' must be an object of counts by name, got {_show(v)}")
    return {str(k): _count(f"{name}.{k}", n) for k, n in v.items()}


def _names(name: str, v: Any) -> Any:
    if not isinstance(v, list):
        raise _Bad(f"field '{name}' must be a list of names, got {_show(v)}")
    return tuple(_string(f"{name}[{i}]", x) for i, x in enumerate(v))


def _seconds_by_name(name: str, v: Any) -> Any:
    if not isinstance(v, dict):
        raise _Bad(f"field '{name}' must be an object of seconds by phase, got {_show(v)}")
    out = {}
    for key, seconds in v.items():
        value = _nonneg(f"{name}.{key}", seconds)
        if value is not None:
            out[str(key)] = value
    return out


_JOB: dict[str, Check] = {"pid": _count, "name": _string, "user": _string,
                          "cpu_cores": _nonneg, "main_cpu_cores": _nonneg,
                          "workers_cpu_cores": _nonneg, "processes": _count, "rss_bytes": _count,
                          "gpus": _indices, "rank": _count, "world_size": _count,
                          "dist_job": _string, "debug_env": _names,
                          "loader_workers": _count,
                          "loader_cpu_cores": _nonneg,
                          "main_write_bytes_per_second": _nonneg,
                          "loader_workers_started": _count, "loader_workers_started_total": _count}

_GPU: dict[str, Check] = {
    "gpu": _count, "uuid": _string, "lost": _boolean,
    "util": _ratio, "mem_util": _ratio, "mem_used_bytes": _count, "mem_total_bytes": _count,
    "power_watts": _nonneg, "power_limit_watts": _nonneg, "temp_celsius": _anynum,
    "sm_clock_mhz": _nonneg, "mem_clock_mhz": _nonneg, "pstate": _count,
    "clock_event_reasons": _count,
    "energy_joules": _nonneg, "pcie_tx_bytes_per_second": _nonneg,
    "pcie_rx_bytes_per_second": _nonneg, "pcie_replay_total": _count,
    "ecc_corrected_total": _count, "ecc_uncorrected_total": _count,
    "remapped_rows_correctable": _count, "remapped_rows_uncorrectable": _count,
    "remapped_rows_pending": _boolean, "remapped_rows_failure": _boolean,
    "sm_active": _ratio, "sm_occupancy": _ratio, "tensor_active": _ratio, "dram_active": _ratio,
    "fp16_active": _ratio, "fp32_active": _ratio, "fp64_active": _ratio,
    "processes": _objects(_PROCESS, ("pid",)),
    "xid_total": _xids,
}
_HOST: dict[str, Check] = {
    "cpu_util_per_core": _ratios, "cpu_util": _ratio,
    "load1": _nonneg, "load5": _nonneg, "load15": _nonneg,
    "mem_used_bytes": _count, "mem_total_bytes": _count,
    "swap_used_bytes": _count, "swap_total_bytes": _count,
    "job_cpu_cores": _nonneg, "job_processes": _count, "job_rss_bytes": _count,
    "job_main_cpu_cores": _nonneg, "job_workers_cpu_cores": _nonneg,
    "job_loader_workers": _count, "job_loader_cpu_cores": _nonneg,
    "job_write_bytes_per_second": _nonneg, "job_loader_workers_started": _count,
    "jobs": _objects(_JOB, ("pid",)),
}
_STEP: dict[str, Check] = {
    "step": _any_int, "step_seconds": _nonneg, "data_wait_seconds": _nonneg,
    "batch_size": _count, "loss_scale": _nonneg, "mem_allocated_bytes": _count,
    "mem_reserved_bytes": _count, "max_mem_allocated_bytes": _count, "loss": _loss,
    "skipped": _boolean, "first_batch": _boolean, "first_batch_wait_seconds": _nonneg,
    "micro_batches": _count, "pid": _count, "rank": _count,
    "gpu": _count,
}
_STEPS: dict[str, Check] = {
    "steps": _count, "begin_t": _nonneg, "first_step": _any_int, "last_step": _any_int,
    "skipped": _count, "timed": _count, "step_seconds": _nonneg, "data_wait_seconds": _nonneg,
    "samples": _count, "sample_seconds": _nonneg,
    "step_seconds_min": _nonneg, "step_seconds_p50": _nonneg, "step_seconds_p90": _nonneg,
    "step_seconds_p99": _nonneg, "step_seconds_max": _nonneg, "batch_size": _count,
    "first_batch": _count, "first_batch_wait_seconds": _nonneg,
    "first_batch_data_wait_seconds": _nonneg, "loss_scale": _nonneg,
    "mem_allocated_bytes": _count, "mem_reserved_bytes": _count,
    "max_mem_allocated_bytes": _count, "micro_batches": _count, "micro_counted": _count,
    "pid": _count, "rank": _count, "gpu": _count,
}
_PHASE: dict[str, Check] = {
    "phase": _string, "seconds": _seconds_by_name, "compiles": _count, "checkpoints": _count,
    "eval_batches": _count,
    "eval_samples": _count, "eval_batch_size": _count, "eval_wait_seconds": _nonneg,
    "eval_train_loader": _boolean,
    "inference_batches": _count, "inference_samples": _count, "inference_batch_size": _count,
    "inference_wait_seconds": _nonneg, "generate_calls": _count, "hook_state": _string, "pid": _count, "rank": _count,
    "gpu": _count, "calls": _counts_by_name, "call_seconds": _seconds_by_name,
}
_HOOK_PROBLEM: dict[str, Check] = {"what": _string, "error": _string, "pid": _count,
                                   "rank": _count, "gpu": _count}
_CONFIG: dict[str, Check] = {"pid": _count, "rank": _count}
_JOB_END: dict[str, Check] = {
    "pid": _count, "exit_reason": _string, "rank": _count, "gpu": _count, "error": _string,
    "steps_total": _count, "first_step_t": _nonneg, "last_report_t": _nonneg,
    "mem_allocated_bytes": _count, "mem_reserved_bytes": _count,
    "max_mem_allocated_bytes": _count,
}
_META: dict[str, Check] = {
    "scenario": _string, "gpu_name": _string, "compute_capability": _capability,
    "driver_version": _string, "host_cpus": _integer(1, "a whole number >= 1"),
    "sample_hz": _number(1e-9, None, "a number > 0"),
}

_KINDS: dict[str, tuple[type, dict[str, Check], tuple[str, ...]]] = {
    "gpu": (GpuSample, _GPU, ("gpu",)),
    "host": (HostSample, _HOST, ()),
    "step": (StepSample, _STEP, ("step",)),
    "steps": (StepsSample, _STEPS, ("steps",)),
    "config": (ConfigSample, _CONFIG, ()),
    "job_end": (JobEnd, _JOB_END, ("pid", "exit_reason")),
    "phase": (PhaseSample, _PHASE, ("phase",)),
    "hook_problem": (HookProblem, _HOOK_PROBLEM, ("what",)),
}
_KIND_OF = {cls: kind for kind, (cls, _, _) in _KINDS.items()}
_TIME = _number(0.0, None, "a Unix time in seconds")


def _fast_table(spec: Mapping[str, Check]) -> dict[str, Any]:
    table = {name: _fast_rule(check) for name, check in spec.items()}
    table["t"] = (_NUMERIC, 0.0, _FINITE)  # _TIME
    table["kind"] = (frozenset({str}), None, None)
    return table


# config lines keep every field (they are the job's settings): always the full check
_FAST: dict[str, tuple[dict[str, Any], tuple[str, ...], str]] = {
    kind: (_fast_table(spec), required, kind)
    for kind, (_cls, spec, required) in _KINDS.items() if kind != "config"}


def _fields(d: Mapping[str, Any], spec: Mapping[str, Check], required: Sequence[str],
            prefix: str = "") -> dict[str, Any]:
    """The known fields of ``d``, checked and converted; unknown ones are ignored."""
    out: dict[str, Any] = {}
    problems: list[str] = []
    for name in required:
        if d.get(name) is None:
            problems.append(f"missing field '{prefix}{name}'")
    for name, value in d.items():
        check = spec.get(name)
        if check is None or value is None:
            continue
        try:
            value = check(prefix + name, value)
        except _Bad as bad:
            problems.append(str(bad))
            continue
        if value is not None:
            out[name] = value
    if problems:
        raise _Bad("; ".join(problems))
    return out


class TraceLineError(ValueError):
    """A line that is not a valid sample; the message says which field and why."""


class UnknownKindError(TraceLineError):
    """A line whose ``kind`` this version does not know (skipped by readers)."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"unknown kind {kind!r}")
        self.kind = kind


# -- one line <-> one sample -------------------------------------------------------------
def line_to_sample(d: Mapping[str, Any]) -> Sample:
    """The sample one trace line holds; raises ``TraceLineError`` saying what is wrong."""
    return _sample(_checked(dict(d) if type(d) is dict else d))  # a copy: d stays as it is


_RECORDS = (("processes", GpuProcess), ("jobs", JobTree))


def _sample(values: dict[str, Any]) -> Sample:
    """The sample for a line's checked values (``_checked``); takes ``values`` apart."""
    cls = _KINDS[values.pop("kind")][0]
    for name, record in _RECORDS:
        items = values.get(name)
        if items:
            values[name] = tuple(record(**x) for x in items)
    return cls(**values)


def _checked(d: Any) -> dict[str, Any]:
    """A line's checked values: the sample's fields, converted, with ``kind`` beside them.

    Raises ``TraceLineError``. ``d`` may be reused for the result (the reader owns the dicts
    it parses): a usual line is checked field by field against a table and kept as it is;
    anything else (a wrong type, a value out of range, NaN, a missing field, a config line)
    goes through the full check, which says exactly what is wrong.
    """
    if type(d) is dict:
        kind = d.get("kind")
        fast = _FAST.get(kind) if type(kind) is str else None
        if fast is not None:
            values = _fast_values(d, *fast)
            if values is not None:
                return values
    return _checked_slowly(d)


def _fast_values(d: dict[str, Any], table: Mapping[str, Any], required: tuple[str, ...],
                 kind: str) -> dict[str, Any] | None:
    """``d`` checked and trimmed to its known fields, or None where the full check must look.

    The reader spends most of its time here (a day of 8 GPUs is ~800 000 lines), so the
    usual case costs one table look-up and a type and range test per field; it accepts only
    what the full check (``_fields``) would accept unchanged, so both give the same values.
    """
    if d.get("t") is None:
        return None
    for name in required:
        if d.get(name) is None:
            return None
    drop: list[str] | None = None
    converted: list[tuple[str, Any]] | None = None
    for name, v in d.items():
        rule = table.get(name)
        if rule is None or v is None:  # an unknown field, or null: not measured
            if drop is None:
                drop = []
            drop.append(name)
        elif type(rule) is tuple:
            types, lo, hi = rule
            if type(v) not in types or (lo is not None and not lo <= v <= hi):
                return None  # NaN fails the range test too: the full check drops it
        else:  # a list or object field: its own checker builds what the sample holds
            try:
                value = rule(name, v)
            except _Bad:
                return None
            if converted is None:
                converted = []
            converted.append((name, value))
    if drop is not None:
        for name in drop:
            del d[name]
    if converted is not None:
        for name, value in converted:
            d[name] = value
    if kind == "gpu" and "processes" not in d:
        d["processes"] = ()  # what GpuSample holds by default: nobody on the GPU
    return d


def _checked_slowly(d: Any) -> dict[str, Any]:
    """The full check of one line: every problem of it, in one message."""
    if not isinstance(d, Mapping):
        raise TraceLineError(f"a line must be a JSON object, got {_show(d)}")
    kind = d.get("kind")
    if not isinstance(kind, str):
        raise TraceLineError("missing field 'kind'" if kind is None
                             else f"field 'kind' must be a string, got {_show(kind)}")
    if kind not in _KINDS:
        if kind == "meta":
            raise TraceLineError("a meta line belongs only at the start of a trace")
        raise UnknownKindError(kind)
    cls, spec, required = _KINDS[kind]
    try:
        if d.get("t") is None:
            raise _Bad("missing field 't'")
        t = _TIME("t", d["t"])
        if t is None:
            raise _Bad("field 't' must be a Unix time in seconds, got NaN")
        values = _fields(d, spec, required)
    except _Bad as bad:
        raise TraceLineError(str(bad)) from None
    values["t"] = t
    values["kind"] = kind
    if cls is ConfigSample:
        values["values"] = {k: v for k, v in d.items() if k not in ("t", "kind", "pid", "rank")}
    elif cls is GpuSample:
        values.setdefault("processes", ())
    return values


def _plain(v: Any) -> Any:
    """A sample field as JSON wants it, or None to leave it out."""
    if isinstance(v, float) and not math.isfinite(v):
        return None  # never write NaN: the field simply was not measured
    if isinstance(v, tuple) and v and isinstance(v[0], (GpuProcess, JobTree)):
        return [_object(x) for x in v]
    if isinstance(v, tuple):
        return list(v)
    return v


def _object(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(obj):
        v = _plain(getattr(obj, f.name))
        if v is not None:
            out[f.name] = v
    return out


def sample_to_line(sample: Sample) -> dict[str, Any]:
    """The trace line for one sample; fields that were not measured are left out."""
    kind = _KIND_OF.get(type(sample))
    if kind is None:
        raise TypeError(f"not a sample: {type(sample).__name__}")
    line: dict[str, Any] = {"t": sample.t, "kind": kind}
    if isinstance(sample, ConfigSample):
        if sample.pid is not None:
            line["pid"] = sample.pid
        if sample.rank is not None:
            line["rank"] = sample.rank
        for k, v in sample.values.items():
            line.setdefault(k, v)  # a value named like t/kind/pid/rank can't override them
        return line
    for f in fields(sample):
        if f.name == "t":
            continue
        v = getattr(sample, f.name)
        if f.name == "lost" and not v:
            continue  # the usual case says nothing
        if f.name in ("xid_total", "jobs", "cpu_util_per_core", "calls", "call_seconds") \
                and not v:
            continue
        if f.name == "xid_total":
            line[f.name] = {str(code): n for code, n in sorted(v.items())}
            continue
        if f.name == "loss":
            name = nonfinite_name(v)
            if name is not None:
                line["loss"] = name  # JSON has no NaN: a trace writes its name
                continue
        v = _plain(v)
        if v is not None:
            line[f.name] = v
    if isinstance(sample, GpuSample) and "processes" not in line:
        line["processes"] = []  # a GPU line always says who is on it (nobody, here)
    return line


# -- the meta line ------------------------------------------------------------------------
def make_meta(*, infos: Sequence[GpuInfo], host_cpus: int | None, sample_hz: float,
              scenario: str | None = None) -> dict[str, Any]:
    """The meta line for a recording: GPU facts from ``infos[0]``, every GPU under ``gpus``.

    With no GPU (``infos`` empty) there is no ``gpu_name``: the trace holds host lines only.
    """
    meta: dict[str, Any] = {"kind": "meta", "format": TRACE_FORMAT}
    if scenario is not None:
        meta["scenario"] = scenario
    if infos:
        first = infos[0]
        if first.name is not None:
            meta["gpu_name"] = first.name
        if first.compute_capability is not None:
            meta["compute_capability"] = list(first.compute_capability)
        if first.driver_version is not None:
            meta["driver_version"] = first.driver_version
    if host_cpus is not None:
        meta["host_cpus"] = host_cpus
    meta["sample_hz"] = int(sample_hz) if float(sample_hz).is_integer() else round(sample_hz, 6)
    if infos:
        # every GPU, not only those that differ from the first: the uuids join a trace to
        # Prometheus series, and one list is simpler to read than a list of exceptions
        meta["gpus"] = [_object(GpuInfo(gpu=i.gpu, uuid=i.uuid, name=i.name,
                                        compute_capability=i.compute_capability,
                                        pci_bus_id=i.pci_bus_id,
                                        mem_total_bytes=i.mem_total_bytes))
                        for i in infos]
        for g in meta["gpus"]:
            g.pop("gpm_supported", None)
    meta["gpuwatch_version"] = __version__
    return meta


def meta_infos(meta: Mapping[str, Any]) -> dict[int, GpuInfo]:
    """Per-GPU facts a meta line gives (``gpus``, else the file-wide fields), by index."""
    base = GpuInfo(gpu=0, name=meta.get("gpu_name"), driver_version=meta.get("driver_version"),
                   compute_capability=_cc_or_none(meta.get("compute_capability")))
    out: dict[int, GpuInfo] = {}
    gpus = meta.get("gpus")
    for g in gpus if isinstance(gpus, list) else ():  # (anything else tells nothing)
        if not isinstance(g, dict) or not isinstance(g.get("gpu"), int):
            continue
        out[g["gpu"]] = GpuInfo(
            gpu=g["gpu"],
            uuid=g.get("uuid") if isinstance(g.get("uuid"), str) else None,
            name=g.get("name") if isinstance(g.get("name"), str) else base.name,
            driver_version=base.driver_version,
            compute_capability=_cc_or_none(g.get("compute_capability"))
            or base.compute_capability,
            pci_bus_id=g.get("pci_bus_id") if isinstance(g.get("pci_bus_id"), str) else None,
            mem_total_bytes=g.get("mem_total_bytes")
            if isinstance(g.get("mem_total_bytes"), int)
            and 0 < g["mem_total_bytes"] <= _FINITE else None,
        )
    if not out and base.name is not None:
        out[0] = base
    return out


def _cc_or_none(v: Any) -> tuple[int, int] | None:
    try:
        return _capability("compute_capability", v) if v is not None else None
    except _Bad:
        return None


# -- reading ----------------------------------------------------------------------------
@dataclass
class Trace:
    path: str
    meta: dict[str, Any]
    samples: list[Sample]
    warnings: list[tuple[int | None, str]] = field(default_factory=list)


class _Prefix(io.RawIOBase):
    """The first ``limit`` bytes of a file: a recording that is still being written, read
    by several processes that must all see the same lines (advisor/split.py)."""

    def __init__(self, raw: IO[bytes], limit: int) -> None:
        super().__init__()
        self._raw = raw
        self._left = limit

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self._left <= 0:
            return 0
        n = self._raw.readinto(memoryview(b)[:self._left]) or 0  # type: ignore[attr-defined]
        self._left -= n
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


def _open_binary(path: str, limit: int | None = None) -> IO[bytes]:
    try:
        if limit is None:
            raw = open(path, "rb")  # noqa: SIM115 - closed by the reader's generator
        else:
            raw = io.BufferedReader(_Prefix(open(path, "rb", buffering=0), limit), 1 << 16)
    except OSError as err:
        raise file_error("read", "trace", path, err) from err
    if raw.peek(2)[:2] != b"\x1f\x8b":
        return raw
    if limit is None:
        raw.close()
        return gzip.open(path, "rb")  # type: ignore[return-value]
    gz = gzip.GzipFile(fileobj=raw, mode="rb")
    gz.myfileobj = raw  # type: ignore[attr-defined] - closed with it, as gzip.open's own
    return gz  # type: ignore[return-value]


_scan_json = json.JSONDecoder().scan_once


def _parse(raw: bytes) -> Any:
    """``json.loads(raw)``, minus its per-call overhead for the usual line.

    The C scanner parses the text directly; anything unusual (not UTF-8, leading
    whitespace, a byte-order mark, bad JSON, more after the value) is handed to
    ``json.loads``, so what it accepts and what its errors say stay the same.
    """
    try:
        text = raw.decode()
        obj, end = _scan_json(text, 0)
    except (UnicodeDecodeError, StopIteration, ValueError):
        return json.loads(raw)
    if end != len(text) and text[end:].strip(" \t\n\r"):
        return json.loads(raw)
    return obj


# a file read under another name in its messages (a recording piped to `gpuwatch advise
# --replay -` is read from a temporary copy, and named as standard input): path -> name
SHOWN_AS: dict[str, str] = {}


class _Reader:
    """One pass over one file: the meta line, then samples; problems collected as it goes."""

    def __init__(self, path: str, limit: int | None = None) -> None:
        self.path = SHOWN_AS.get(path, path)  # as the messages name it
        self.problems: list[tuple[int | None, str]] = []
        self.more_problems = 0
        self.warnings: list[tuple[int | None, str]] = []
        self.unknown: Counter[str] = Counter()
        self.first_unknown: int | None = None
        self._file = _open_binary(path, limit)
        self._lines = self._numbered()
        try:
            self.meta = self._read_meta()
        except BaseException:
            self._file.close()
            raise

    def _numbered(self) -> Iterator[tuple[int, bytes, bool]]:
        """(line number, text, is it the last line), tolerating a compressed file cut short."""
        prev: tuple[int, bytes] | None = None
        n = 0
        try:
            for n, raw in enumerate(self._file, 1):
                if prev is not None:
                    yield prev[0], prev[1], False
                prev = (n, raw)
        except (EOFError, gzip.BadGzipFile, OSError, zlib.error) as err:
            why = ("is damaged" if isinstance(err, zlib.error)
                   else "is not a readable gzip file" if isinstance(err, gzip.BadGzipFile)
                   else "ends early")
            self.warnings.append((n + 1, f"the file {why} ({err}); read up to here"))
        if prev is not None:
            yield prev[0], prev[1], True

    def _fail(self, line: int | None, msg: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append((line, msg))
        else:
            self.more_problems += 1

    def _raise(self) -> None:
        problems = list(self.problems)
        if self.more_problems:
            problems.append((None, (f"more problems after these {MAX_PROBLEMS}; "
                                   f"stopped reading there")))
        raise FileFormatError(self.path, problems)

    def _read_meta(self) -> dict[str, Any]:
        for n, raw, _last in self._lines:
            if not raw.strip():
                continue
            try:
                meta = json.loads(raw)
            except (ValueError, RecursionError) as err:
                raise FileFormatError(self.path, [(n, (f"not JSON ({_json_error(raw, err)}); "
                                                      f"the first line of a trace must be "
                                                      f"its meta line"))]) from None
            if not isinstance(meta, dict) or meta.get("kind") != "meta":
                got = meta.get("kind") if isinstance(meta, dict) else meta
                raise FileFormatError(self.path, [(n, (
                    f"the first line must be the meta line "
                    f'{{"kind":"meta","format":"{TRACE_FORMAT}",...}}, got kind {_show(got)}'))])
            fmt = meta.get("format")
            if fmt != TRACE_FORMAT:
                if isinstance(fmt, str) and fmt.startswith(_FORMAT_PREFIX):
                    msg = (f"this trace is {fmt}; this gpuwatch ({__version__}) reads "
                           f"{TRACE_FORMAT}")
                else:
                    msg = f"meta field 'format' must be {TRACE_FORMAT!r}, got {_show(fmt)}"
                raise FileFormatError(self.path, [(n, msg)])
            try:
                _fields(meta, _META, ())
            except _Bad as bad:
                raise FileFormatError(self.path, [(n, f"meta: {bad}")]) from None
            return meta
        # a compressed file damaged or cut short before its first line ends says why
        why = "; ".join(w.removesuffix("; read up to here") for _, w in self.warnings)
        raise FileFormatError(self.path, [(None, f"no meta line: {why}" if why
                                           else "empty file: no meta line")])

    def samples(self) -> Iterator[Sample]:
        for values in self.lines():
            yield _sample(values)

    def lines(self) -> Iterator[dict[str, Any]]:
        """Each good line's checked values (``_checked``), until a problem stops it."""
        last_t: float | None = None
        last_line = 0
        # the loop of a long recording (a day of 8 GPUs is ~800 000 lines): _parse and
        # _checked's usual case are written out here, what they hand on is called
        scan, fast_kinds, fast_values = _scan_json, _FAST, _fast_values
        try:
            for n, raw, is_last in self._lines:
                if self.more_problems:
                    break  # enough to show; a wholly wrong file is not read to its end
                if raw[:1] != b"{" and not raw.strip():  # a usual line is not blank
                    continue
                try:
                    try:
                        text = raw.decode()
                        d, end = scan(text, 0)
                    except (UnicodeDecodeError, StopIteration, ValueError):
                        d = json.loads(raw)  # what it says is what json.loads says
                    else:
                        if end != len(text) and text[end:].strip(" \t\n\r"):
                            d = json.loads(raw)
                except (ValueError, RecursionError) as err:
                    if is_last and not raw.endswith(b"\n"):
                        self.warnings.append((n, ("the last line is cut short (a recorder "
                                                 "stopped mid-write?); skipped")))
                        continue
                    self._fail(n, f"not JSON: {_json_error(raw, err)}")
                    continue
                values = None
                if type(d) is dict:
                    kind = d.get("kind")
                    fast = fast_kinds.get(kind) if type(kind) is str else None
                    if fast is not None:
                        values = fast_values(d, *fast)
                try:
                    if values is None:
                        values = _checked_slowly(d)
                except UnknownKindError as err:
                    self.unknown[err.kind] += 1
                    self.first_unknown = self.first_unknown or n
                    continue
                except TraceLineError as err:
                    if isinstance(d, dict) and d.get("kind") == "meta":
                        self.warnings.append((n, ("a second meta line (recordings joined "
                                                 "together?); skipped")))
                        continue
                    self._fail(n, str(err))
                    continue
                t = values["t"]
                if last_t is not None and t < last_t:
                    self._fail(n, f"time goes backwards: t={t!r} after t={last_t!r} "
                                  f"on line {last_line}")
                last_t, last_line = t, n
                if not self.problems:
                    yield values
        finally:
            self._file.close()
        if self.unknown:
            kinds = ", ".join(f"{k!r} ({c})" for k, c in sorted(self.unknown.items()))
            self.warnings.append((self.first_unknown, (f"skipped lines of unknown kind {kinds}: "
                                                      f"written by a newer gpuwatch?")))
        for line, msg in self.warnings:
            log.warning("%s", f"{self.path}:{line}: {msg}" if line else f"{self.path}: {msg}")
        if self.problems:
            self._raise()


def iter_trace_lines(path: str, limit: int | None = None
                     ) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
    """Like ``iter_trace``, with each sample as the dict of its checked fields and ``kind``.

    The same checks and errors; what it saves is building a sample object per line, which
    a consumer that reads fields by name (the advisor's ``Frame.feed``) does not need.
    Fields a line leaves out are absent, except ``processes`` on gpu lines (``()``); a
    config line's settings are under ``values``, as in ``ConfigSample``.
    """
    reader = _Reader(path, limit)
    return reader.meta, reader.lines()


def iter_trace(path: str) -> tuple[dict[str, Any], Iterator[Sample]]:
    """The meta line (checked now) and a lazy iterator of samples, in bounded memory.

    The iterator raises ``FileFormatError`` at the first fatal problem's end of scan: it
    stops yielding at the first bad line, reads on to list up to ``MAX_PROBLEMS`` problems,
    then raises them all in one message.
    """
    reader = _Reader(path)
    return reader.meta, reader.samples()


def read_trace(path: str) -> Trace:
    """A whole trace in memory, validated; ``FileFormatError`` lists every problem found."""
    reader = _Reader(path)
    samples = list(reader.samples())
    return Trace(path=path, meta=reader.meta, samples=samples, warnings=list(reader.warnings))


# -- writing ----------------------------------------------------------------------------
def dumps_line(line: Mapping[str, Any]) -> str:
    return json.dumps(line, separators=(",", ":"), allow_nan=False)


class TraceWriter:
    """Writes a trace: the meta line at once, then one line per sample.

    Plain files and stdout are line-buffered (every line reaches the OS as it is written, so
    a killed process loses at most the line in flight); gzip output is flushed at least once
    a second and on ``close()``. Safe to call from several threads.
    """

    def __init__(self, path: str, meta: Mapping[str, Any]) -> None:
        self.path = path
        self.lines_written = 0
        self._lock = threading.Lock()
        self._gzip = path.endswith(".gz")
        self._last_flush = time.monotonic()
        self._own = path != "-"
        try:
            if not self._own:
                self._out: IO[str] = sys.stdout
            elif self._gzip:
                self._out = io.TextIOWrapper(gzip.open(path, "wb"),  # noqa: SIM115 - closed by close()
                                             encoding="utf-8", newline="\n")
            else:
                self._out = open(path, "w", encoding="utf-8", buffering=1)  # noqa: SIM115
        except OSError as err:
            raise file_error("write", "trace", path, err) from err
        try:
            self._write(dict(meta))
        except BaseException:
            # a meta line that can't be written (disk full, a value JSON can't hold):
            # nobody will close what the caller never got
            with contextlib.suppress(OSError):
                self.close()
            raise

    def write(self, sample: Sample) -> None:
        self._write(sample_to_line(sample))

    def write_line(self, line: Mapping[str, Any]) -> None:
        """Write an already-built line (e.g. one read from another trace)."""
        self._write(line)

    def _write(self, line: Mapping[str, Any]) -> None:
        text = dumps_line(line) + "\n"
        with self._lock:
            if self._out is None:
                raise ValueError(f"trace {self.path} is closed")
            self._out.write(text)
            self.lines_written += 1
            now = time.monotonic()
            if not self._own or (self._gzip and now - self._last_flush >= 1.0):
                self._out.flush()
                self._last_flush = now

    def flush(self) -> None:
        with self._lock:
            if self._out is not None:
                self._out.flush()

    def close(self) -> None:
        with self._lock:
            out, self._out = self._out, None  # type: ignore[assignment]
            if out is None:
                return
            out.flush()
            if self._own:
                out.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
