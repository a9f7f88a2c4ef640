"""The torch hook's datagram schema (version 1): what a training process tells the daemon.

Both sides use this module, so it imports nothing beyond the standard library (and
:mod:`gpuwatch.nonfinite`'s loss names, itself the standard library's only): the hook
runs inside the user's training process, the receiver inside the daemon (which never
imports torch).

One datagram is one JSON object, at most :data:`MAX_DATAGRAM_BYTES` long::

    {"v": 1, "kind": "report", "pid": 4242, "seq": 7, "t": 1715000000.25,
     "rank": 0, "local_rank": 0, "world_size": 2, "gpu": 0, "uuid": "GPU-…",
     "steps_total": 140, "skipped_total": 3,
     "window": {"steps": 20, "skipped": 1, "timed": 20, "step_seconds": 0.41,
                "data_wait_seconds": 0.02, "samples": 1280, "sample_seconds": 0.41,
                "iterators": 1, "first_batch_wait_seconds": 0.015},
     "steps": {"step": [120, …], "t": […], "step_seconds": […],
               "data_wait_seconds": […], "batch_size": […], "skipped": […],
               "first_batch": […], "first_batch_wait_seconds": […], "loss": […]},
     "steps_omitted": 0,
     "loss_scale": 32768.0, "mem_allocated_bytes": …, "mem_reserved_bytes": …,
     "max_mem_allocated_bytes": …,
     "config": {"num_workers": 4, …}, "exit_reason": null, "error": null,
     "sender_dropped": {"no_receiver": 2}, "hook_errors": 0,
     "phase": "train", "phases": {"startup": 41.2, "compile": 38.0, "train": 120.5, …},
     "compiles": 2, "checkpoints": 3, "eval": {"batches": 40, "samples": 320, "batch_size": 8,
     "wait_seconds": 0.4, "train_loader": true}, "inference": {"batches": 0, …, "generate_calls": 0,
     "wait_seconds": 0.0},
     "problems": [{"what": "config.tf32", "error": "RuntimeError: …"}], "hook_state": "on",
     "calls": {"gc_collect": 140}, "call_seconds": {"gc_collect": 6.3}}

- ``kind`` is ``report`` (periodic, also as a heartbeat with no steps) or ``exit`` (the
  last one: the process is exiting; ``exit_reason`` says why).
- ``steps_total`` and ``skipped_total`` are cumulative, so a lost datagram loses detail,
  never counts. ``window`` sums every step finished since the previous datagram; ``steps``
  holds per-step detail for the newest of them, as parallel arrays (at most
  :data:`MAX_STEPS`, fewer when the datagram would not fit) and ``steps_omitted`` counts
  the older ones that only the window and the counters carry.
- ``phase`` is what the process is doing now (:data:`PHASES`), ``phases`` the seconds it
  spent in each so far (cumulative, like the counters). ``steps.micro_batches`` counts the
  backward() calls in each iteration (gradient accumulation), ``window.micro_batches``
  sums them over the ``window.micro_counted`` steps that had a count.
- ``problems`` lists what the hook could not read or do (each once, all of them in every
  report, at most :data:`MAX_PROBLEMS`); ``hook_state`` is ``off`` once it stopped
  measuring after too many errors of its own.
- ``calls`` and ``call_seconds`` (absent until one was made): how often the job called
  ``gc.collect()``, ``torch.cuda.empty_cache()`` and Hugging Face's ``generate()`` while it
  trained (:data:`CLEANUPS`), and the seconds spent inside them; cumulative.
- Readers ignore unknown fields, so fields can be added within version 1; anything else
  is a new version, which a version-1 receiver drops (and counts) as ``version``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gpuwatch.nonfinite import NONFINITE_LOSS, nonfinite_name

VERSION = 1
MAX_DATAGRAM_BYTES = 60_000  # well under the Unix datagram default limit (~208 KB)
MAX_STEPS = 2_000  # per datagram
MAX_CONFIG_KEYS = 64
MAX_TEXT = 500  # characters in any string value (error text, config values)
MAX_INT = 2**63 - 1  # integers beyond this can't be exported (float) or recorded faithfully
KINDS = ("report", "exit")
STEP_FIELDS = ("step", "t", "step_seconds", "data_wait_seconds", "batch_size", "skipped",
               "first_batch", "first_batch_wait_seconds", "loss", "micro_batches")
WINDOW_FIELDS = ("steps", "skipped", "timed", "step_seconds", "data_wait_seconds", "samples",
                 "sample_seconds", "iterators", "first_batch_wait_seconds", "micro_batches",
                 "micro_counted")
PHASES = ("startup", "compile", "train", "eval", "checkpoint", "inference")
HOOK_STATES = ("on", "off")
MAX_PROBLEMS = 16

# reasons a receiver drops a datagram (the label of gpuwatch_hook_messages_dropped_total)
OVERSIZED = "oversized"
MALFORMED = "malformed"
BAD_VERSION = "version"
TOO_MANY_JOBS = "too_many_jobs"  # a new process beyond the receiver's cap on jobs
DROP_REASONS = (OVERSIZED, MALFORMED, BAD_VERSION, TOO_MANY_JOBS)


class ProtocolError(ValueError):
    """A datagram that does not follow the schema; ``reason`` is the drop reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Window:
    """Sums over the steps finished since the previous datagram."""

    steps: int = 0
    skipped: int = 0
    timed: int = 0  # steps whose duration is known (all but a process's first)
    step_seconds: float = 0.0  # summed over the timed steps
    data_wait_seconds: float = 0.0  # summed over the timed steps
    samples: int = 0  # summed batch sizes, over timed steps with a known batch size
    sample_seconds: float = 0.0  # the step time of those same steps
    # DataLoader iterators whose first batch was fetched in these steps (a new epoch's, with
    # persistent_workers=False a new set of workers), and the data wait of those batches
    iterators: int = 0
    first_batch_wait_seconds: float = 0.0
    micro_batches: int = 0  # backward() calls, summed over the steps that counted them
    micro_counted: int = 0  # how many steps that is


class StepRecord(NamedTuple):
    """One iteration in a datagram. A named tuple: the receiver builds one per step of
    every datagram (thousands a second from many ranks), and a tuple is made in one call
    where a frozen dataclass sets each field through ``object.__setattr__``."""

    step: int
    t: float  # Unix seconds, end of the iteration
    step_seconds: float | None = None
    data_wait_seconds: float | None = None
    batch_size: int | None = None
    skipped: bool | None = None
    first_batch: bool | None = None  # its data wait included a new iterator's first batch
    first_batch_wait_seconds: float | None = None  # that part of it (creating the iterator
    # and fetching its first batch); None when first_batch is not true
    loss: float | None = None  # the value its last top-level backward() ran on, unscaled;
    # read for at most one step per report (None on the others, and when not a number); NaN
    # or infinite where the loss was (on the wire: null, and "nan", "inf" or "-inf" in the
    # `loss_nonfinite` column)
    micro_batches: int | None = None  # top-level backward() calls in it (accumulation)


@dataclass(frozen=True)
class Work:
    """Batches a process ran outside training: evaluation, or (a process that never
    trains) inference."""

    batches: int = 0
    samples: int = 0
    batch_size: int | None = None  # of the last batch with a known size
    wait_seconds: float = 0.0  # the loaders' wait for those batches
    generate_calls: int = 0  # inference: Hugging Face generate() calls
    # evaluation: some of its batches came from a DataLoader that trains (a training
    # accuracy, Lightning validating on its training loader)
    train_loader: bool = False


@dataclass(frozen=True)
class Problem:
    """Something the hook could not read or do: ``what`` (``config.tf32``,
    ``hook.report``, ``hook.off``) and the error's text."""

    what: str
    error: str


@dataclass(frozen=True)
class Report:
    """One validated datagram."""

    kind: str
    pid: int
    seq: int
    t: float
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    gpu: int | None = None
    uuid: str | None = None
    steps_total: int = 0
    skipped_total: int = 0
    window: Window = field(default_factory=Window)
    steps: tuple[StepRecord, ...] = ()
    steps_omitted: int = 0
    loss_scale: float | None = None
    mem_allocated_bytes: int | None = None
    mem_reserved_bytes: int | None = None
    max_mem_allocated_bytes: int | None = None
    config: Mapping[str, Any] | None = None
    exit_reason: str | None = None
    error: str | None = None
    sender_dropped: Mapping[str, int] = field(default_factory=dict)
    hook_errors: int = 0
    phase: str | None = None
    phases: Mapping[str, float] = field(default_factory=dict)
    compiles: int = 0
    checkpoints: int = 0
    eval: Work = field(default_factory=Work)
    inference: Work = field(default_factory=Work)
    problems: tuple[Problem, ...] = ()
    hook_state: str = "on"
    # gc.collect() / torch.cuda.empty_cache() while training: calls and seconds, by name
    calls: Mapping[str, int] = field(default_factory=dict)
    call_seconds: Mapping[str, float] = field(default_factory=dict)


# -- encoding (the hook's side) ------------------------------------------------------------

def _finite(x: float | None, digits: int) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return round(x, digits)


def _columns(steps: Sequence[StepRecord]) -> dict[str, list[Any]]:
    cols = _plain_columns(steps)
    names = [nonfinite_name(s.loss) for s in steps]
    if any(names):
        cols["loss_nonfinite"] = names
    return cols


def _plain_columns(steps: Sequence[StepRecord]) -> dict[str, list[Any]]:
    return {
        "step": [s.step for s in steps],
        "t": [round(s.t, 4) for s in steps],
        "step_seconds": [_finite(s.step_seconds, 7) for s in steps],
        "data_wait_seconds": [_finite(s.data_wait_seconds, 7) for s in steps],
        "batch_size": [s.batch_size for s in steps],
        "skipped": [s.skipped for s in steps],
        "first_batch": [s.first_batch for s in steps],
        "first_batch_wait_seconds": [_finite(s.first_batch_wait_seconds, 7) for s in steps],
        "loss": [s.loss if isinstance(s.loss, float) and math.isfinite(s.loss) else None
                 for s in steps],
        "micro_batches": [s.micro_batches for s in steps],
    }


def _dumps(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()


def _clean_config(config: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if config is None:
        return None
    out: dict[str, Any] = {}
    for key, value in list(config.items())[:MAX_CONFIG_KEYS]:
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        elif isinstance(value, str):
            value = value[:MAX_TEXT]
        elif value is not None and not isinstance(value, (bool, int, float)):
            value = str(value)[:MAX_TEXT]
        out[str(key)[:64]] = value
    return out


def encode(header: Mapping[str, Any], steps: Sequence[StepRecord] = (),
           max_bytes: int = MAX_DATAGRAM_BYTES) -> bytes:
    """One datagram: ``header`` (every field but ``v``, ``steps``, ``steps_omitted``) plus as
    many of the newest ``steps`` as fit in ``max_bytes``; the older ones are counted in
    ``steps_omitted`` (the header's ``window`` and counters already cover them)."""
    msg: dict[str, Any] = {"v": VERSION}
    for key, value in header.items():
        if isinstance(value, float) and not math.isfinite(value):
            value = None  # JSON has no inf/nan; "not measured" is the honest reading
        msg[key] = value
    if "error" in msg and isinstance(msg["error"], str):
        msg["error"] = msg["error"][:MAX_TEXT]
    if "config" in msg:
        msg["config"] = _clean_config(msg["config"])
    keep = list(steps[-MAX_STEPS:])
    while True:
        msg["steps"] = _columns(keep)
        msg["steps_omitted"] = len(steps) - len(keep)
        data = _dumps(msg)
        if len(data) <= max_bytes:
            return data
        if keep:
            # shrink in proportion to the overshoot, at least by one step
            per_step = max(1, (len(data) - 200) // max(1, len(keep)))
            cut = max(1, (len(data) - max_bytes) // per_step + 1)
            keep = keep[min(cut, len(keep)):]
            continue
        # still too big without steps: only the free-form parts can be at fault
        if msg.get("config"):
            msg["config"] = None
        elif msg.get("error"):
            msg["error"] = None
        else:
            raise ValueError(f"a report without steps is {len(data)} bytes, over {max_bytes}")


# -- decoding (the receiver's side) --------------------------------------------------------

def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# made once: json.loads() with an argument builds a new decoder (and its scanner) per call
_JSON = json.JSONDecoder(parse_constant=_reject_constant)


def _int(msg: Mapping[str, Any], key: str, *, optional: bool = True, default: int | None = None
         ) -> int | None:
    value = msg.get(key)
    if value is None:
        if optional:
            return default
        raise ProtocolError(MALFORMED, f"{key} is missing")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT:
        raise ProtocolError(MALFORMED, f"{key} must be a non-negative integer, got {value!r:.40}")
    return value


def _num(value: Any, key: str, *, positive: bool = False) -> float | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_INT:
        value = math.inf  # math.isfinite() would raise OverflowError on it
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        raise ProtocolError(MALFORMED, f"{key} must be a non-negative number, got {value!r}")
    return float(value)


def _signed(value: Any, key: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            isinstance(value, int) and not -MAX_INT <= value <= MAX_INT or \
            not math.isfinite(value):
        raise ProtocolError(MALFORMED, f"{key} must be a finite number, got {value!r}")
    return float(value)


def _text(value: Any, key: str, limit: int = MAX_TEXT) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise ProtocolError(MALFORMED, f"{key} must be a string of at most {limit} characters")
    return value


def _window(value: Any) -> Window:
    if value is None:
        return Window()
    if not isinstance(value, dict):
        raise ProtocolError(MALFORMED, "window must be an object")
    ints = {k: _int(value, k, default=0)
            for k in ("steps", "skipped", "timed", "samples", "iterators", "micro_batches",
                      "micro_counted")}
    floats = {k: _num(value.get(k), f"window.{k}") or 0.0
              for k in ("step_seconds", "data_wait_seconds", "sample_seconds",
                        "first_batch_wait_seconds")}
    return Window(**ints, **floats)  # type: ignore[arg-type]


def _steps(value: Any) -> tuple[StepRecord, ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ProtocolError(MALFORMED, "steps must be an object of arrays")
    cols = {k: value.get(k) for k in STEP_FIELDS}
    if not isinstance(cols["step"], list) or not isinstance(cols["t"], list):
        raise ProtocolError(MALFORMED, "steps.step and steps.t must be arrays")
    n = len(cols["step"])
    if n > MAX_STEPS:
        raise ProtocolError(MALFORMED, f"{n} steps in one datagram, over {MAX_STEPS}")
    for key, col in cols.items():
        if col is None:
            cols[key] = [None] * n
        elif not isinstance(col, list) or len(col) != n:
            raise ProtocolError(MALFORMED, f"steps.{key} must be an array of {n} items")
    if _plain(cols):
        # what the hook sends: every value is already what the checks below would let
        # through unchanged, so the records are the columns read across
        # (the columns' lengths are checked above; zip's length check is Python 3.10+, and
        # this module runs in the job, on 3.8 too)
        out = tuple(map(StepRecord._make, zip(*(cols[k] for k in STEP_FIELDS))))  # noqa: B905
    else:
        out = _checked_steps(cols, n)
    names = value.get("loss_nonfinite")
    if names is None:
        return out
    if not isinstance(names, list) or len(names) != n:
        raise ProtocolError(MALFORMED, f"steps.loss_nonfinite must be an array of {n} items")
    fixed = list(out)
    for i, name in enumerate(names):
        if name is None:
            continue
        if not isinstance(name, str) or name not in NONFINITE_LOSS:
            raise ProtocolError(MALFORMED, f"steps.loss_nonfinite[{i}] must be null, \"nan\", "
                                           "\"inf\" or \"-inf\"")
        fixed[i] = fixed[i]._replace(loss=NONFINITE_LOSS[name])
    return tuple(fixed)


def _plain_ints(col: list[Any], nullable: bool = True) -> bool:
    values = [x for x in col if x is not None] if nullable else col
    return all(type(x) is int for x in values) and (
        not values or (min(values) >= 0 and max(values) <= MAX_INT))


def _plain_floats(col: list[Any], nullable: bool = True, signed: bool = False) -> bool:
    values = [x for x in col if x is not None] if nullable else col
    if not all(type(x) is float for x in values):
        return False  # ints (or anything else) go the long way, which makes them floats
    # the sum is finite only when every value is (JSON's 1e999 parses as inf); a sum that
    # overflows sends finite values the long way too, which then judges them one by one
    return not values or (math.isfinite(sum(values)) and (signed or min(values) >= 0))


def _plain_bools(col: list[Any]) -> bool:
    return all(x is None or x is True or x is False for x in col)


def _plain(cols: dict[str, list[Any]]) -> bool:
    """Whether every column holds values that ``_checked_steps`` accepts unchanged (the
    hook's own datagrams): checked a column at a time, which is much cheaper than the
    value-by-value checks that find the first bad value and say where it is."""
    return (_plain_ints(cols["step"], nullable=False)
            and _plain_floats(cols["t"], nullable=False)
            and _plain_floats(cols["step_seconds"])
            and _plain_floats(cols["data_wait_seconds"])
            and _plain_ints(cols["batch_size"])
            and _plain_bools(cols["skipped"])
            and _plain_bools(cols["first_batch"])
            and _plain_floats(cols["first_batch_wait_seconds"])
            and _plain_floats(cols["loss"], signed=True)
            and _plain_ints(cols["micro_batches"]))


def _checked_steps(cols: dict[str, list[Any]], n: int) -> tuple[StepRecord, ...]:
    """The steps checked value by value: the first that does not follow the schema is
    named with its index."""
    out = []
    for i in range(n):
        step, t = cols["step"][i], cols["t"][i]
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_INT:
            raise ProtocolError(MALFORMED, f"steps.step[{i}] must be a non-negative integer")
        batch = cols["batch_size"][i]
        if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int)
                                  or not 0 <= batch <= MAX_INT):
            raise ProtocolError(MALFORMED, f"steps.batch_size[{i}] must be an integer or null")
        skipped = cols["skipped"][i]
        if skipped is not None and not isinstance(skipped, bool):
            raise ProtocolError(MALFORMED, f"steps.skipped[{i}] must be true, false or null")
        first = cols["first_batch"][i]
        if first is not None and not isinstance(first, bool):
            raise ProtocolError(MALFORMED, f"steps.first_batch[{i}] must be true, false or null")
        micro = cols["micro_batches"][i]
        if micro is not None and (isinstance(micro, bool) or not isinstance(micro, int)
                                  or not 0 <= micro <= MAX_INT):
            raise ProtocolError(MALFORMED, f"steps.micro_batches[{i}] must be an integer or null")
        t_value = _num(t, f"steps.t[{i}]")
        if t_value is None:
            raise ProtocolError(MALFORMED, f"steps.t[{i}] is missing")
        out.append(StepRecord(step=step, t=t_value,
                              step_seconds=_num(cols["step_seconds"][i], "steps.step_seconds"),
                              data_wait_seconds=_num(cols["data_wait_seconds"][i],
                                                     "steps.data_wait_seconds"),
                              batch_size=batch, skipped=skipped, first_batch=first,
                              first_batch_wait_seconds=_num(
                                  cols["first_batch_wait_seconds"][i],
                                  "steps.first_batch_wait_seconds"),
                              loss=_signed(cols["loss"][i], f"steps.loss[{i}]"),
                              micro_batches=micro))
    return tuple(out)


def _config(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_CONFIG_KEYS:
        raise ProtocolError(MALFORMED,
                            f"config must be an object of at most {MAX_CONFIG_KEYS} keys")
    for key, item in value.items():
        if len(key) > 64 or (item is not None and not isinstance(item, (bool, int, float, str))):
            raise ProtocolError(MALFORMED, f"config.{key[:64]} must be a scalar")
        # JSON has no inf, but 1e999 parses as one; and ints too big for a float
        if isinstance(item, float) and not math.isfinite(item) or \
                isinstance(item, int) and not -MAX_INT <= item <= MAX_INT:
            raise ProtocolError(MALFORMED, f"config.{key} must be a finite number")
        if isinstance(item, str) and len(item) > MAX_TEXT:
            raise ProtocolError(MALFORMED, f"config.{key} is too long")
    return dict(value)


def _work(value: Any, key: str) -> Work:
    if value is None:
        return Work()
    if not isinstance(value, dict):
        raise ProtocolError(MALFORMED, f"{key} must be an object")
    return Work(batches=_int(value, "batches", default=0) or 0,
                samples=_int(value, "samples", default=0) or 0,
                batch_size=_int(value, "batch_size"),
                wait_seconds=_num(value.get("wait_seconds"), f"{key}.wait_seconds") or 0.0,
                generate_calls=_int(value, "generate_calls", default=0) or 0,
                train_loader=value.get("train_loader") is True)


def _phases(value: Any) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 16:
        raise ProtocolError(MALFORMED, "phases must be a small object of seconds")
    out = {}
    for k, v in value.items():
        if k not in PHASES:
            continue  # a phase a newer hook knows: ignored, as unknown fields are
        out[k] = _num(v, f"phases.{k}") or 0.0
    return out


def _problems(value: Any) -> tuple[Problem, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_PROBLEMS:
        raise ProtocolError(MALFORMED, f"problems must be a list of at most {MAX_PROBLEMS}")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ProtocolError(MALFORMED, f"problems[{i}] must be an object")
        what = _text(item.get("what"), f"problems[{i}].what", 64)
        error = _text(item.get("error"), f"problems[{i}].error")
        if not what:
            raise ProtocolError(MALFORMED, f"problems[{i}].what is missing")
        out.append(Problem(what=what, error=error or ""))
    return tuple(out)


def _counts(value: Any, key: str) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 16:
        raise ProtocolError(MALFORMED, f"{key} must be a small object of counts")
    return {str(k)[:32]: _int(value, k, default=0) or 0 for k in value}


def decode(data: bytes) -> Report:
    """Validate one datagram; :class:`ProtocolError` (with the drop reason) when it is bad."""
    if len(data) > MAX_DATAGRAM_BYTES:
        raise ProtocolError(OVERSIZED, f"{len(data)} bytes, over {MAX_DATAGRAM_BYTES}")
    try:
        # what json.loads() does with bytes, with the decoder made once
        text = data.decode(json.detect_encoding(data), "surrogatepass") \
            if isinstance(data, (bytes, bytearray)) else data
        msg = _JSON.decode(text)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise ProtocolError(MALFORMED, f"not JSON: {err}") from err
    if not isinstance(msg, dict):
        raise ProtocolError(MALFORMED, "not a JSON object")
    version = msg.get("v")
    if version != VERSION:
        if isinstance(version, int) and not isinstance(version, bool):
            raise ProtocolError(BAD_VERSION, f"version {version}, this receiver reads {VERSION}")
        raise ProtocolError(MALFORMED, "no version field")
    kind = msg.get("kind")
    if kind not in KINDS:
        raise ProtocolError(MALFORMED, f"unknown kind {kind!r}")
    pid = _int(msg, "pid", optional=False)
    if not pid:
        raise ProtocolError(MALFORMED, "pid must be positive")
    t = _num(msg.get("t"), "t")
    if t is None:
        raise ProtocolError(MALFORMED, "t is missing")
    scale = _num(msg.get("loss_scale"), "loss_scale")
    return Report(
        kind=kind, pid=pid, seq=_int(msg, "seq", default=0) or 0, t=t,
        rank=_int(msg, "rank"), local_rank=_int(msg, "local_rank"),
        world_size=_int(msg, "world_size"), gpu=_int(msg, "gpu"),
        uuid=_text(msg.get("uuid"), "uuid", 100),
        steps_total=_int(msg, "steps_total", default=0) or 0,
        skipped_total=_int(msg, "skipped_total", default=0) or 0,
        window=_window(msg.get("window")), steps=_steps(msg.get("steps")),
        steps_omitted=_int(msg, "steps_omitted", default=0) or 0,
        loss_scale=scale,
        mem_allocated_bytes=_int(msg, "mem_allocated_bytes"),
        mem_reserved_bytes=_int(msg, "mem_reserved_bytes"),
        max_mem_allocated_bytes=_int(msg, "max_mem_allocated_bytes"),
        config=_config(msg.get("config")),
        exit_reason=_text(msg.get("exit_reason"), "exit_reason", 32),
        error=_text(msg.get("error"), "error"),
        sender_dropped=_counts(msg.get("sender_dropped"), "sender_dropped"),
        hook_errors=_int(msg, "hook_errors", default=0) or 0,
        phase=_phase(msg.get("phase")),
        phases=_phases(msg.get("phases")),
        compiles=_int(msg, "compiles", default=0) or 0,
        checkpoints=_int(msg, "checkpoints", default=0) or 0,
        eval=_work(msg.get("eval"), "eval"),
        inference=_work(msg.get("inference"), "inference"),
        problems=_problems(msg.get("problems")),
        hook_state=_hook_state(msg.get("hook_state")),
        calls=_cleanups(_counts(msg.get("calls"), "calls")),
        call_seconds=_cleanups(_seconds(msg.get("call_seconds"), "call_seconds")),
    )


# the calls a hook counts and times while the job trains (its _wrap_cleanup, and
# generate() inside a training step: _wrap_generate); other names are ignored, as
# unknown fields
CLEANUPS = ("gc_collect", "empty_cache", "train_generate")


def _cleanups(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if k in CLEANUPS}


def _seconds(value: Any, key: str) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 16:
        raise ProtocolError(MALFORMED, f"{key} must be a small object of seconds")
    return {str(k)[:32]: _num(v, f"{key}.{k}") or 0.0 for k, v in value.items()}


def _phase(value: Any) -> str | None:
    text = _text(value, "phase", 32)
    return text if text in PHASES else None


def _hook_state(value: Any) -> str:
    text = _text(value, "hook_state", 16)
    if text is not None and text not in HOOK_STATES:
        raise ProtocolError(MALFORMED, f"hook_state must be one of {HOOK_STATES}")
    return text or "on"
