"""The one vocabulary rules speak, and the bucketed history that windowed statistics read.

Every data source (a recording, the live store, Prometheus) is mapped onto the trace
format's field names, so one rule file serves them all. A few names are renamed where the
trace uses one field name on two line kinds (the host's ``mem_used_bytes`` becomes
``host_mem_used_bytes``), and a few derived signals are defined here (``mem_used_ratio``,
``data_wait_ratio``, ``job_workers`` ...), each computed from raw fields per time bucket.

History is kept as fixed-width time buckets (``res`` seconds): each bucket holds the mean
of the samples that fell in it (the last value for counters and facts) and a weight, and
each signal keeps running prefix sums so a windowed mean costs O(1) however long the
window. Rings are trimmed to the longest window the rules use, so memory stays bounded
however long the recording.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# NVML clock event reason bits (nvmlClocksEventReason* in nvml.h)
_SW_POWER_CAP = 0x4
_HW_SLOWDOWN = 0x8
_SW_THERMAL = 0x20
_HW_THERMAL = 0x40
_HW_POWER_BRAKE = 0x80


@dataclass(frozen=True, slots=True)
class SignalDef:
    """One name of the vocabulary."""

    name: str
    table: str  # gpu | host | job | config | fact
    unit: str
    doc: str
    agg: str = "mean"  # how samples in one bucket combine: mean | last | counter
    derived: bool = False


def _defs() -> dict[str, SignalDef]:
    rows: list[tuple[str, str, str, str, str, bool]] = [
        # name, table, unit, agg, doc, derived
        ("util", "gpu", "ratio", "mean", "NVML utilization.gpu: time fraction a kernel ran", False),
        ("mem_util", "gpu", "ratio", "mean", "memory controller busy (not fullness)", False),
        ("mem_used_bytes", "gpu", "bytes", "mean", "device memory used (all processes)", False),
        ("mem_total_bytes", "gpu", "bytes", "last", "device memory size", False),
        ("power_watts", "gpu", "watts", "mean", "board power draw", False),
        ("power_limit_watts", "gpu", "watts", "last", "enforced power limit", False),
        ("temp_celsius", "gpu", "celsius", "mean", "GPU temperature", False),
        ("sm_clock_mhz", "gpu", "MHz", "mean", "SM clock", False),
        ("mem_clock_mhz", "gpu", "MHz", "mean", "memory clock", False),
        ("pstate", "gpu", "0-15", "last", "performance state (0 fastest)", False),
        ("clock_event_reasons", "gpu", "bitmask", "last", "NVML clock event reasons", False),
        ("energy_joules", "gpu", "joules", "counter", "energy since driver load", False),
        ("pcie_tx_bytes_per_second", "gpu", "bytes/s", "mean", "PCIe transmit", False),
        ("pcie_rx_bytes_per_second", "gpu", "bytes/s", "mean", "PCIe receive", False),
        ("pcie_replay_total", "gpu", "count", "counter", "PCIe replays", False),
        ("ecc_corrected_total", "gpu", "count", "counter", "corrected ECC errors", False),
        ("ecc_uncorrected_total", "gpu", "count", "counter", "uncorrected ECC errors", False),
        ("remapped_rows_correctable", "gpu", "rows", "last", "rows remapped (correctable)", False),
        ("remapped_rows_uncorrectable", "gpu", "rows", "last", "rows remapped (uncorrectable)",
         False),
        ("remapped_rows_pending", "gpu", "0/1", "last", "a row remap waits for a GPU reset", False),
        ("remapped_rows_failure", "gpu", "0/1", "last", "a row remap failed", False),
        ("sm_active", "gpu", "ratio", "mean", "GPM: SMs busy (time x SMs)", False),
        ("sm_occupancy", "gpu", "ratio", "mean", "GPM: resident warps / maximum", False),
        ("tensor_active", "gpu", "ratio", "mean", "GPM: tensor pipes busy", False),
        ("dram_active", "gpu", "ratio", "mean", "GPM: DRAM interface busy", False),
        ("fp16_active", "gpu", "ratio", "mean", "GPM: FP16 (non-tensor) pipe busy", False),
        ("fp32_active", "gpu", "ratio", "mean", "GPM: FP32 pipe busy", False),
        ("fp64_active", "gpu", "ratio", "mean", "GPM: FP64 pipe busy", False),
        # derived, per GPU
        ("mem_used_ratio", "gpu", "ratio", "mean", "mem_used_bytes / mem_total_bytes", True),
        ("mem_free_bytes", "gpu", "bytes", "mean", "mem_total_bytes - mem_used_bytes", True),
        ("power_ratio", "gpu", "ratio", "mean", "power_watts / power_limit_watts", True),
        ("gpu_processes", "gpu", "count", "mean", "processes holding memory on the GPU", True),
        ("gpu_process_mem_bytes", "gpu", "bytes", "mean",
         "memory the GPU's processes hold, summed", True),
        ("xid_errors_total", "gpu", "count", "counter", "XID errors seen, all codes", True),
        ("clock_power_capped", "gpu", "0/1", "mean", ("clocks held down by the power cap "
         "(mean over a window: fraction of time)"), True),
        ("clock_thermal", "gpu", "0/1", "mean", ("clocks held down for temperature "
         "(sw or hw thermal slowdown)"), True),
        ("clock_hw_slowdown", "gpu", "0/1", "mean", ("hardware slowdown or power brake "
         "(power supply, cooling)"), True),
        ("gpu_lost", "gpu", "0/1", "last", "the GPU fell off the bus", True),
        # host
        ("cpu_util", "host", "ratio", "mean", "host CPU busy, all cores", False),
        ("load1", "host", "tasks", "mean", "1-minute load average", False),
        ("load5", "host", "tasks", "mean", "5-minute load average", False),
        ("host_mem_used_bytes", "host", "bytes", "mean", ("host memory used (trace: host "
         "line mem_used_bytes)"), False),
        ("host_mem_total_bytes", "host", "bytes", "last", "host memory size", False),
        ("swap_used_bytes", "host", "bytes", "mean", "swap used", False),
        ("job_cpu_cores", "host", "cores", "mean", ("CPU cores busy in the job's process "
         "trees (1.6 = 160 %)"), False),
        ("job_processes", "host", "count", "mean", "processes in the job's trees", False),
        ("job_rss_bytes", "host", "bytes", "mean", "summed RSS of the job's trees", False),
        ("job_main_cpu_cores", "host", "cores", "mean", ("CPU cores busy in the job's main "
         "process(es) alone (optional field)"), False),
        ("job_workers_cpu_cores", "host", "cores", "mean", ("CPU cores busy in the main "
         "processes' children (optional field)"), False),
        # derived, host
        ("cpu_free_cores", "host", "cores", "mean", "host_cpus x (1 - cpu_util)", True),
        ("load_per_cpu", "host", "ratio", "mean", "load1 / host_cpus", True),
        ("host_mem_used_ratio", "host", "ratio", "mean", "host memory used / total", True),
        ("job_main_processes", "host", "count", "mean", ("processes using a GPU (the job "
         "roots: one per rank)"), True),
        ("job_workers", "host", "count", "mean", ("job processes that are not GPU users: "
         "DataLoader workers (job_processes - job_main_processes)"), True),
        ("main_cpu_cores", "host", "cores", "mean", ("job_main_cpu_cores per main process; "
         "without the split, min(job_cpu_cores, mains) / mains"), True),
        ("workers_cpu_cores", "host", "cores", "mean", ("job_workers_cpu_cores; without the "
         "split, job_cpu_cores minus the mains' estimate"), True),
        ("main_busy_ratio", "host", "ratio", "mean", ("how busy each main process is "
         "(1 = one core pegged)"), True),
        ("workers_busy_ratio", "host", "ratio", "mean", ("how busy each worker is on average "
         "(1 = every worker pegs a core)"), True),
        # hook: step lines (per job, mapped to its GPU)
        ("step_seconds", "job", "seconds", "mean", ("wall time of one iteration (mean: per "
         "step)"), False),
        ("data_wait_seconds", "job", "seconds", "mean", ("time blocked in the DataLoader per "
         "step"), False),
        ("batch_size", "job", "samples", "last", "samples per step (step or config line)", False),
        ("loss_scale", "job", "scale", "last", "GradScaler scale (fp16 only)", False),
        ("loss", "job", "loss", "mean", "training loss", False),
        ("mem_allocated_bytes", "job", "bytes", "last", "torch allocated at step end", False),
        ("mem_reserved_bytes", "job", "bytes", "last", "torch caching allocator reserved", False),
        ("max_mem_allocated_bytes", "job", "bytes", "last", "torch peak allocated", False),
        # derived, hook
        ("data_wait_ratio", "job", "ratio", "mean", ("share of step time blocked on data "
         "(window mean: total wait / total step time)"), True),
        ("step_rate", "job", "steps/s", "mean", "steps per second", True),
        ("samples_per_second", "job", "samples/s", "mean", "step_rate x batch_size", True),
        ("skipped_ratio", "job", "ratio", "mean", ("share of steps GradScaler skipped (or the "
         "loss scale fell)"), True),
        ("act_mem_per_sample_bytes", "job", "bytes", "last", ("activation memory per sample: "
         "(max_mem_allocated - allocated at step end) / batch_size"), True),
        ("mem_reserved_ratio", "job", "ratio", "mean", "mem_reserved_bytes / mem_total_bytes",
         True),
        # hook: config facts (current value; windows don't apply)
        ("num_workers", "config", "count", "last", "DataLoader num_workers", False),
        ("pin_memory", "config", "bool", "last", "DataLoader pin_memory", False),
        ("persistent_workers", "config", "bool", "last", "DataLoader persistent_workers", False),
        ("prefetch_factor", "config", "batches", "last", "DataLoader prefetch_factor", False),
        ("autocast_dtype", "config", "text", "last", ("autocast dtype ('bfloat16', 'float16'; "
         "null when off)"), False),
        ("tf32", "config", "bool", "last", "TF32 matmuls allowed", False),
        ("cudnn_benchmark", "config", "bool", "last", "torch.backends.cudnn.benchmark", False),
        ("fused_optimizer", "config", "bool", "last", "optimizer uses a fused kernel", False),
        ("gradient_checkpointing", "config", "bool", "last", "activation checkpointing on",
         False),
        ("uses_conv", "config", "bool", "last", "the model has convolution layers", False),
        ("world_size", "config", "count", "last", "distributed world size", False),
        ("autocast", "config", "bool", "last", "autocast to a 16-bit type is on", True),
        # facts
        ("compute_capability", "fact", "major.minor", "last", ("the GPU's compute capability "
         "as a number (8.6, 9.0)"), False),
        ("host_cpus", "fact", "cores", "last", "logical CPUs on the host", False),
        ("gpu_count", "fact", "count", "last", "GPUs seen on the host", False),
        ("gpm", "fact", "0/1", "last", ("whether GPM fields (sm_active, tensor_active...) are "
         "measured on this GPU"), False),
        ("hook", "fact", "0/1", "last", "whether the torch hook reports steps for this GPU's job",
         False),
    ]
    return {r[0]: SignalDef(name=r[0], table=r[1], unit=r[2], agg=r[3], doc=r[4], derived=r[5])
            for r in rows}


VOCABULARY: dict[str, SignalDef] = _defs()
CONFIG_KEYS = {n for n, d in VOCABULARY.items() if d.table == "config" and not d.derived}

# raw fields that live on gpu lines
_GPU_RAW = [n for n, d in VOCABULARY.items() if d.table == "gpu" and not d.derived]
_GPM_FIELDS = ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp16_active",
               "fp32_active", "fp64_active")
_HOST_RAW = {"cpu_util": "cpu_util", "load1": "load1", "load5": "load5",
             "host_mem_used_bytes": "mem_used_bytes", "host_mem_total_bytes": "mem_total_bytes",
             "swap_used_bytes": "swap_used_bytes", "job_cpu_cores": "job_cpu_cores",
             "job_processes": "job_processes", "job_rss_bytes": "job_rss_bytes",
             "job_main_cpu_cores": "job_main_cpu_cores",
             "job_workers_cpu_cores": "job_workers_cpu_cores"}
_AUTOCAST_ON = {"bfloat16", "bf16", "float16", "fp16", "half", "torch.bfloat16",
                "torch.float16"}


def _get(obj: Any) -> Callable[[str], Any]:
    if type(obj) is dict:
        return obj.get
    return lambda k: getattr(obj, k, None)


# -- one signal's history ------------------------------------------------------------------
class Ring:
    """Bucket values of one signal, with prefix sums for O(1) weighted window means."""

    __slots__ = ("base", "psum", "pw", "vals")

    def __init__(self, base: int) -> None:
        self.base = base  # absolute bucket index of vals[0]
        self.vals: list[float | None] = []
        self.psum: list[float] = [0.0]
        self.pw: list[float] = [0.0]

    def push(self, value: float | None, weight: float = 1.0) -> None:
        self.vals.append(value)
        psum, pw = self.psum, self.pw
        if value is None or weight <= 0:
            psum.append(psum[-1])
            pw.append(pw[-1])
        else:
            psum.append(psum[-1] + value * weight)
            pw.append(pw[-1] + weight)

    def end(self) -> int:
        return self.base + len(self.vals)

    def trim(self, keep: int) -> None:
        extra = len(self.vals) - keep
        if extra > keep:  # trim in chunks: O(1) amortised
            del self.vals[:extra]
            del self.psum[:extra]
            del self.pw[:extra]
            self.base += extra

    def span(self, end: int, n: int) -> tuple[int, int]:
        """List positions of the ``n`` buckets ending before absolute index ``end``."""
        e = min(end, self.end()) - self.base
        s = max(0, e - n)
        return s, max(s, e)

    def values(self, end: int, n: int) -> list[float]:
        s, e = self.span(end, n)
        return [v for v in self.vals[s:e] if v is not None]

    def mean(self, end: int, n: int) -> float | None:
        # span() inlined: the windowed mean is the most read statistic
        base = self.base
        e = min(end, base + len(self.vals)) - base
        s = e - n if e > n else 0
        if e < s:
            e = s
        pw = self.pw
        w = pw[e] - pw[s]
        if w <= 0:
            return None
        return (self.psum[e] - self.psum[s]) / w

    def last(self, end: int, n: int) -> float | None:
        s, e = self.span(end, n)
        for i in range(e - 1, s - 1, -1):
            v = self.vals[i]
            if v is not None:
                return v
        return None


def _percentile(vals: list[float], q: float) -> float:
    vals = sorted(vals)
    if len(vals) == 1:
        return vals[0]
    pos = q * (len(vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def _counter_increase(vals: list[float]) -> float | None:
    if len(vals) < 2:
        return None if not vals else 0.0
    if vals[0] == vals[-1] and min(vals) == max(vals):
        return 0.0  # the usual case: no new errors (C-speed check)
    if vals == sorted(vals):
        return vals[-1] - vals[0]  # no reset in the window
    total = 0.0
    prev = vals[0]
    for v in vals[1:]:
        total += v - prev if v >= prev else v  # a reset starts the counter from zero
        prev = v
    return total


_COUNTER_FNS = frozenset({"delta", "increase", "rate"})
_PCT = {"median": 0.5, "p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}


def window_stat(ring: Ring, fn: str, end: int, n: int, res: float) -> float | None:
    """One windowed statistic over the ``n`` buckets before ``end``."""
    if fn in ("mean", "avg"):
        return ring.mean(end, n)
    if fn == "last":
        return ring.last(end, n)
    if fn in _COUNTER_FNS:
        # the usual case, a counter that did not move (health rules read 10 min of it at
        # every bucket): one C-speed pass over the window instead of filtering, min and max
        s, e = ring.span(end, n)
        window = ring.vals[s:e]
        first = window[0] if window else None
        if first is not None and first == first and window.count(first) == len(window):
            return 0.0
    vals = ring.values(end, n)
    if fn == "count":
        return float(len(vals))
    if not vals:
        return None
    if fn == "min":
        return min(vals)
    if fn == "max":
        return max(vals)
    if fn == "first":
        return vals[0]
    if fn in _PCT:
        return _percentile(vals, _PCT[fn])
    if fn == "stddev":
        m = sum(vals) / len(vals)
        return math.sqrt(sum((v - m) ** 2 for v in vals) / len(vals))
    if fn in ("delta", "increase"):
        return _counter_increase(vals)
    if fn == "rate":
        inc = _counter_increase(vals)
        return None if inc is None else inc / (n * res)
    raise ValueError(f"unknown window function {fn!r}")


# -- accumulating one bucket ------------------------------------------------------------
class _Acc:
    """The samples of one open bucket for one table: sums, counts and last values."""

    __slots__ = ("last", "n", "s")

    def __init__(self) -> None:
        self.s: dict[str, float] = {}
        self.n: dict[str, float] = {}
        self.last: dict[str, Any] = {}

    def add(self, name: str, v: float) -> None:
        s = self.s
        if name in s:
            s[name] += v
            self.n[name] += 1
        else:
            s[name] = v
            self.n[name] = 1
        self.last[name] = v

    def mean(self, name: str) -> float | None:
        n = self.n.get(name)
        return self.s[name] / n if n else None

    def clear(self) -> None:
        self.s.clear()
        self.n.clear()
        self.last.clear()


class Table:
    """The history of one subject's signals of one kind (a GPU's, the host's, a job's)."""

    def __init__(self, frame: Frame) -> None:
        self.frame = frame
        self.acc = _Acc()
        self.rings: dict[str, Ring] = {}
        self.ever: bool = False  # any sample seen (a hook that never reported stays unknown)

    def push(self, idx: int, name: str, value: float | None, weight: float = 1.0) -> None:
        ring = self.rings.get(name)
        if ring is None:
            if value is None:
                return
            ring = self.rings[name] = Ring(idx)
        else:
            gap = idx - ring.base - len(ring.vals)
            if gap > 0:  # a gap: skip ahead, keeping at most what windows use
                if gap > self.frame.keep:
                    ring.vals.clear()
                    ring.psum[:] = [0.0]
                    ring.pw[:] = [0.0]
                    ring.base = idx
                else:
                    for _ in range(gap):
                        ring.push(None)
        ring.push(value, weight)
        if len(ring.vals) > 2 * self.frame.keep:  # Ring.trim's test, without the call
            ring.trim(self.frame.keep)


class Subject:
    """One GPU (or, with ``gpu`` None, the host and jobs not tied to a GPU)."""

    def __init__(self, frame: Frame, gpu: int | None, first: int) -> None:
        self.gpu = gpu
        self.first = first  # first bucket with data: windows before it are incomplete
        self.gpu_table = Table(frame)
        self.job = Table(frame)
        self.config: dict[str, Any] = {}
        self.facts: dict[str, Any] = {}
        self.pids: set[int] = set()
        self.prev_loss_scale: float | None = None
        self.proc_pids: set[int] = set()


class Frame:
    """Bucketed history of every subject, fed samples in time order.

    ``on_bucket(idx)`` is called after each bucket closes (evaluation time =
    ``(idx + 1) * res``). Only signals in ``needed`` (and what they derive from) are kept.
    """

    def __init__(self, res: float, needed: Iterable[str], keep_seconds: float,
                 on_bucket: Callable[[int], None] | None = None) -> None:
        self.res = float(res)
        self.keep = max(4, math.ceil(keep_seconds / self.res) + 2)
        self.needed = set(needed) | _dependencies(set(needed))
        self.on_bucket = on_bucket
        self.idx: int | None = None  # the open bucket
        self.subjects: dict[int | None, Subject] = {}
        self.host = Subject(self, None, 0)
        self.subjects[None] = self.host
        self.host_acc = _Acc()
        self.host_tables = Table(self)
        self.facts: dict[str, Any] = {}
        self.pid_gpu: dict[int, int] = {}
        self.rank_seen: set[int] = set()
        self._gpu_raw = [f for f in _GPU_RAW if f in self.needed]
        self._gpm_needed = "gpm" in self.needed or any(f in self.needed for f in _GPM_FIELDS)
        self._bucket_pids: set[int] = set()
        self.t_first: float | None = None
        self.t_last: float | None = None
        self.hook_steps = False
        self.hook_config = False
        self.job_ends: list[dict[str, Any]] = []  # `job_end` lines, for the report

    # -- facts -------------------------------------------------------------------------
    def set_meta(self, meta: Mapping[str, Any]) -> None:
        """A recording's meta line (or the daemon's GPU facts): GPU model, CC, host CPUs."""
        cc = meta.get("compute_capability")
        if cc:
            self.facts["compute_capability"] = cc_number(cc)
        if meta.get("host_cpus"):
            self.facts["host_cpus"] = float(meta["host_cpus"])
        if meta.get("gpu_name"):
            self.facts["gpu_name"] = meta["gpu_name"]

    def set_gpu_info(self, gpu: int, name: str | None = None, cc: Any = None,
                     gpm: bool | None = None) -> None:
        subj = self._subject(gpu)
        if name:
            subj.facts["gpu_name"] = name
        if cc:
            subj.facts["compute_capability"] = cc_number(cc)
        if gpm:
            subj.facts["gpm"] = 1.0

    def _subject(self, gpu: int) -> Subject:
        subj = self.subjects.get(gpu)
        if subj is None:
            subj = self.subjects[gpu] = Subject(self, gpu, self.idx or 0)
        return subj

    def gpus(self) -> list[int]:
        return sorted(g for g in self.subjects if g is not None)

    # -- feeding -----------------------------------------------------------------------
    def _advance(self, t: float) -> None:
        if self.t_first is None:
            self.t_first = t
        if self.t_last is None or t > self.t_last:
            self.t_last = t
        idx = int(t // self.res)
        if self.idx is None:
            self.idx = idx
            self.host.first = idx
            return
        if idx > self.idx:
            self.flush_to(idx)

    def flush_to(self, idx: int) -> None:
        """Close every bucket before ``idx`` (evaluating after each one)."""
        if self.idx is None:
            self.idx = idx
            return
        while self.idx < idx:
            self._close(self.idx)
            nxt = self.idx + 1
            # long gaps: nothing to evaluate in between; jump (rings skip ahead on push)
            if idx - nxt > self.keep:
                nxt = idx - self.keep
            self.idx = nxt

    def feed_gpu(self, s: Any) -> None:
        get = _get(s)
        t = get("t")
        self._advance(t)
        gpu = get("gpu")
        subj = self._subject(gpu)
        acc = subj.gpu_table.acc
        subj.gpu_table.ever = True
        if get("lost"):
            acc.add("gpu_lost", 1.0)
            return
        acc.add("gpu_lost", 0.0)
        # the hot loop of a long recording: inlined _Acc.add
        sums, counts, lasts = acc.s, acc.n, acc.last
        for f in self._gpu_raw:
            v = get(f)
            if v is not None:
                if f in sums:
                    sums[f] += v
                    counts[f] += 1
                else:
                    sums[f] = v
                    counts[f] = 1
                lasts[f] = v
        if self._gpm_needed and "gpm" not in subj.facts \
                and any(get(f) is not None for f in _GPM_FIELDS):
            subj.facts["gpm"] = 1.0
        reasons = get("clock_event_reasons")
        if reasons is not None:
            r = int(reasons)
            acc.add("clock_power_capped", 1.0 if r & _SW_POWER_CAP else 0.0)
            acc.add("clock_thermal", 1.0 if r & (_SW_THERMAL | _HW_THERMAL) else 0.0)
            acc.add("clock_hw_slowdown", 1.0 if r & (_HW_SLOWDOWN | _HW_POWER_BRAKE) else 0.0)
        procs = get("processes")
        if procs is not None:
            mem = 0.0
            pids = set()
            for p in procs:
                pg = _get(p)
                pid = pg("pid")
                if pid is not None:
                    pids.add(pid)
                    self.pid_gpu[pid] = gpu
                m = pg("mem_used_bytes")
                if m:
                    mem += m
            acc.add("gpu_processes", float(len(procs)))
            acc.add("gpu_process_mem_bytes", mem)
            subj.proc_pids = pids
            self._bucket_pids |= pids
        xid = get("xid_total")
        if xid:
            acc.add("xid_errors_total", float(sum(xid.values())))
        elif "xid_errors_total" in self.needed and reasons is not None:
            acc.add("xid_errors_total", 0.0)
        cc = get("compute_capability")
        if cc:
            subj.facts["compute_capability"] = cc_number(cc)
        name = get("name")
        if name:
            subj.facts["gpu_name"] = name

    def feed_host(self, s: Any) -> None:
        get = _get(s)
        self._advance(get("t"))
        acc = self.host_acc
        per_core = get("cpu_util_per_core")
        if per_core and "host_cpus" not in self.facts:
            self.facts["host_cpus"] = float(len(per_core))
        cpu = get("cpu_util")
        if cpu is None and per_core:
            cpu = sum(per_core) / len(per_core)
        if cpu is not None:
            acc.add("cpu_util", float(cpu))
        for name, field in _HOST_RAW.items():
            if name == "cpu_util":
                continue
            v = get(field)
            if v is not None:
                acc.add(name, float(v))

    def feed_step(self, s: Any) -> None:
        get = _get(s)
        self._advance(get("t"))
        subj = self._job_subject(get("gpu"), get("pid"), get("rank"))
        self.hook_steps = True
        job = subj.job
        job.ever = True
        acc = job.acc
        # a Prometheus-derived step line stands for several steps (``_count``)
        acc.add("_steps", float(get("_count") or 1.0))
        ss = get("step_seconds")
        dw = get("data_wait_seconds")
        if ss is not None:
            acc.add("step_seconds", float(ss))
            if dw is not None:
                acc.add("data_wait_seconds", float(dw))
                acc.add("_dw_ss", float(ss))
        for f in ("batch_size", "mem_allocated_bytes", "mem_reserved_bytes",
                  "max_mem_allocated_bytes", "loss"):
            v = get(f)
            if v is not None:
                acc.add(f, float(v))
        scale = get("loss_scale")
        skipped = get("skipped")
        fell = False
        if scale is not None:
            scale = float(scale)
            acc.add("loss_scale", scale)
            fell = subj.prev_loss_scale is not None and scale < subj.prev_loss_scale
            subj.prev_loss_scale = scale
        if skipped is not None or scale is not None:
            acc.add("_skip", 1.0 if (skipped or fell) else 0.0)
        bs = get("batch_size")
        alloc, peak = get("mem_allocated_bytes"), get("max_mem_allocated_bytes")
        if bs and alloc is not None and peak is not None:
            acc.add("act_mem_per_sample_bytes", max(0.0, (peak - alloc) / bs))

    def feed_config(self, s: Any) -> None:
        get = _get(s)
        t = get("t")
        if t is not None:
            self._advance(t)
        values = get("values")
        if values is None:  # a trace line: the config keys sit on the line itself
            values = {k: v for k, v in s.items() if k not in ("t", "kind", "pid", "rank", "gpu")}
        subj = self._job_subject(get("gpu"), get("pid"), get("rank"))
        self.hook_config = True
        for k, v in values.items():
            if k in CONFIG_KEYS:
                subj.config[k] = _config_value(v)
        if "autocast_dtype" in values:
            dtype = values.get("autocast_dtype")
            subj.config["autocast"] = 1.0 if str(dtype).lower() in _AUTOCAST_ON else 0.0
        if "batch_size" in values and values["batch_size"] is not None:
            subj.config["batch_size"] = float(values["batch_size"])

    def _job_subject(self, gpu: int | None, pid: int | None, rank: int | None) -> Subject:
        # which GPU a job's lines belong to: its own say, else the GPU its pid holds
        # memory on, else its rank where that names a GPU, else the only GPU
        if gpu is None and pid is not None:
            gpu = self.pid_gpu.get(pid)
        if gpu is None and rank is not None and rank in self.subjects:
            gpu = rank
        if gpu is None:
            gpus = self.gpus()
            if len(gpus) == 1:
                gpu = gpus[0]
        if gpu is None:
            return self.host
        return self._subject(gpu)

    def feed(self, s: Any) -> None:
        """Any sample: a trace line (dict with ``kind``) or a samples.py record."""
        if type(s) is dict:
            kind = s.get("kind")
        else:
            kind = _KIND_OF.get(type(s).__name__)
        if kind == "gpu":
            self.feed_gpu(s)
        elif kind == "host":
            self.feed_host(s)
        elif kind == "step":
            self.feed_step(s)
        elif kind == "config":
            self.feed_config(s)
        elif kind == "job_end" and len(self.job_ends) < 1000:
            self.job_ends.append(dict(s) if type(s) is dict else
                                 {f: getattr(s, f) for f in s.__slots__})

    # -- closing a bucket ----------------------------------------------------------------
    def _close(self, idx: int) -> None:
        need = self.needed
        host = self.host_tables
        a = self.host_acc
        gpus = [s for g, s in self.subjects.items() if g is not None]
        if gpus:
            self.facts["gpu_count"] = float(len(gpus))
        if a.n:
            host.ever = True
            for name in _HOST_RAW:
                if name in need:
                    host.push(idx, name, a.mean(name))
            cpus = self.facts.get("host_cpus")
            cpu = a.mean("cpu_util")
            if cpus and cpu is not None:
                host.push(idx, "cpu_free_cores", cpus * (1.0 - cpu))
            load = a.mean("load1")
            if cpus and load is not None:
                host.push(idx, "load_per_cpu", load / cpus)
            hu, ht = a.mean("host_mem_used_bytes"), a.mean("host_mem_total_bytes")
            if hu is not None and ht:
                host.push(idx, "host_mem_used_ratio", hu / ht)
            jc, jp = a.mean("job_cpu_cores"), a.mean("job_processes")
            if jp is not None:
                pids = self._bucket_pids
                if not pids:
                    pids = set().union(*(s.proc_pids for s in gpus)) if gpus else set()
                mains = float(max(1, len(pids))) if jp >= 1 else 0.0
                workers = max(0.0, jp - mains)
                host.push(idx, "job_main_processes", mains)
                host.push(idx, "job_workers", workers)
                jm, jw = a.mean("job_main_cpu_cores"), a.mean("job_workers_cpu_cores")
                if jc is not None and mains > 0:
                    if jm is None:
                        # without the split, the mains are taken to use the first cores: a
                        # training loop's main process is busy whenever the GPU works
                        jm = min(jc, mains)
                        jw = jc - jm
                    host.push(idx, "main_cpu_cores", jm / mains)
                    host.push(idx, "main_busy_ratio", min(1.0, jm / mains))
                    if jw is not None:
                        host.push(idx, "workers_cpu_cores", jw)
                        if workers >= 1:
                            host.push(idx, "workers_busy_ratio", min(1.0, jw / workers))
            a.clear()
        self._bucket_pids = set()
        for subj in self.subjects.values():
            self._close_job(idx, subj)
            if subj.gpu is None:
                continue
            acc = subj.gpu_table.acc
            if not acc.n:
                continue
            tab = subj.gpu_table
            for name in self._gpu_raw:
                if name in acc.n:
                    agg = VOCABULARY[name].agg
                    tab.push(idx, name, acc.last[name] if agg != "mean" else acc.mean(name))
            for name in ("clock_power_capped", "clock_thermal", "clock_hw_slowdown",
                         "gpu_processes", "gpu_process_mem_bytes"):
                if name in need and name in acc.n:
                    tab.push(idx, name, acc.mean(name))
            for name in ("gpu_lost", "xid_errors_total"):
                if name in need and name in acc.n:
                    tab.push(idx, name, acc.last[name])
            used, total = acc.mean("mem_used_bytes"), acc.last.get("mem_total_bytes")
            if used is not None and total:
                tab.push(idx, "mem_used_ratio", used / total)
                tab.push(idx, "mem_free_bytes", total - used)
            pw, pl = acc.mean("power_watts"), acc.last.get("power_limit_watts")
            if pw is not None and pl:
                tab.push(idx, "power_ratio", pw / pl)
            acc.clear()
        if self.on_bucket is not None:
            self.on_bucket(idx)

    def _close_job(self, idx: int, subj: Subject) -> None:
        job = subj.job
        acc = job.acc
        if not job.ever:
            return
        steps = acc.s.get("_steps", 0.0)
        job.push(idx, "step_rate", steps / self.res)
        if not steps:
            return
        if "step_seconds" in acc.n:
            ss_sum = acc.s["step_seconds"]
            job.push(idx, "step_seconds", ss_sum / acc.n["step_seconds"], acc.n["step_seconds"])
            if "data_wait_seconds" in acc.n:
                dw_sum, dss = acc.s["data_wait_seconds"], acc.s["_dw_ss"]
                job.push(idx, "data_wait_seconds", dw_sum / acc.n["data_wait_seconds"],
                         acc.n["data_wait_seconds"])
                if dss > 0:
                    job.push(idx, "data_wait_ratio", min(1.0, dw_sum / dss), dss)
        for name in ("batch_size", "mem_allocated_bytes", "mem_reserved_bytes",
                     "max_mem_allocated_bytes", "loss_scale", "act_mem_per_sample_bytes"):
            if name in acc.last:
                job.push(idx, name, acc.last[name])
        if "loss" in acc.n:
            job.push(idx, "loss", acc.mean("loss"))
        if "_skip" in acc.n:
            job.push(idx, "skipped_ratio", acc.mean("_skip"), acc.n["_skip"])
        bs = acc.last.get("batch_size")
        if bs:
            job.push(idx, "samples_per_second", steps / self.res * bs)
        reserved = acc.last.get("mem_reserved_bytes")
        total = self._mem_total(subj)
        if reserved is not None and total:
            job.push(idx, "mem_reserved_ratio", reserved / total)
        acc.clear()

    def _mem_total(self, subj: Subject) -> float | None:
        if subj.gpu is not None:
            ring = subj.gpu_table.rings.get("mem_total_bytes")
            v = subj.gpu_table.acc.last.get("mem_total_bytes")
            if v is None and ring is not None:
                v = ring.last(ring.end(), 1)
            return v
        return None

    def finish(self) -> None:
        """Close the open bucket (end of a recording)."""
        if self.idx is not None:
            self.flush_to(self.idx + 1)

    # -- reading ---------------------------------------------------------------------------
    def lookup_table(self, subj: Subject, name: str) -> Table | None:
        table = VOCABULARY[name].table
        if table == "gpu":
            return subj.gpu_table if subj.gpu is not None else None
        if table == "host":
            return self.host_tables
        if table == "job":
            if subj.job.ever:
                return subj.job
            return self.host.job if self.host.job.ever else None
        return None

    def config_value(self, subj: Subject, name: str) -> Any:
        if name in subj.config:
            return subj.config[name]
        return self.host.config.get(name)

    def fact(self, subj: Subject, name: str) -> Any:
        if name == "hook":
            return 1.0 if (subj.job.ever or self.host.job.ever) else 0.0
        if name == "gpm":
            if subj.gpu is None:
                return None
            return subj.facts.get("gpm", 0.0)
        if name in subj.facts:
            return subj.facts[name]
        return self.facts.get(name)


_KIND_OF = {"GpuSample": "gpu", "HostSample": "host", "StepSample": "step",
            "ConfigSample": "config", "JobEnd": "job_end"}

# derived signals and what they are computed from (so the frame keeps those too)
_DEPENDS: dict[str, set[str]] = {
    "mem_used_ratio": {"mem_used_bytes", "mem_total_bytes"},
    "mem_free_bytes": {"mem_used_bytes", "mem_total_bytes"},
    "power_ratio": {"power_watts", "power_limit_watts"},
    "mem_reserved_ratio": {"mem_total_bytes"},
    "cpu_free_cores": {"cpu_util"},
    "load_per_cpu": {"load1"},
    "host_mem_used_ratio": {"host_mem_used_bytes", "host_mem_total_bytes"},
    "job_workers": {"job_processes"},
    "job_main_processes": {"job_processes"},
    "main_cpu_cores": {"job_cpu_cores", "job_processes", "job_main_cpu_cores"},
    "workers_cpu_cores": {"job_cpu_cores", "job_processes", "job_workers_cpu_cores"},
    "main_busy_ratio": {"job_cpu_cores", "job_processes", "job_main_cpu_cores"},
    "workers_busy_ratio": {"job_cpu_cores", "job_processes", "job_workers_cpu_cores"},
}


def _dependencies(names: set[str]) -> set[str]:
    out: set[str] = set()
    for n in names:
        out |= _DEPENDS.get(n, set())
    return out


def _config_value(v: Any) -> Any:
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)):
        return float(v)
    return v


def cc_number(cc: Any) -> float | None:
    """[9, 0], (8, 6), "8.6" or 8.6 → 8.6 (a number rules can compare)."""
    if cc is None:
        return None
    if isinstance(cc, (list, tuple)) and len(cc) >= 2:
        return float(cc[0]) + float(cc[1]) / 10.0
    if isinstance(cc, (int, float)):
        return float(cc)
    if isinstance(cc, str):
        major, _, minor = cc.strip().partition(".")
        return float(major) + (float(minor[:1]) / 10.0 if minor else 0.0)
    return None


def cc_text(cc: float | None) -> str | None:
    if cc is None:
        return None
    major = int(cc + 1e-9)
    minor = round((cc - major) * 10)
    return f"{major}.{minor}"


def arch_supports(cc: float | None) -> dict[str, bool | None]:
    """What a compute capability gives a training job (None: unknown)."""
    if cc is None:
        return {"tensor_cores": None, "fp16": None, "bf16": None, "tf32": None, "fp8": None}
    return {"tensor_cores": cc >= 7.0, "fp16": cc >= 6.0, "bf16": cc >= 8.0, "tf32": cc >= 8.0,
            "fp8": cc >= 8.9}


__all__ = [
    "CONFIG_KEYS",
    "VOCABULARY",
    "Frame",
    "Ring",
    "SignalDef",
    "Subject",
    "arch_supports",
    "cc_number",
    "cc_text",
    "window_stat",
]
