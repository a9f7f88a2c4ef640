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
from dataclasses import dataclass, replace
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
        ("loss", "job", "loss", "mean", ("training loss (the hook sends each report's newest "
         "iteration's, unscaled)"), False),
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
        ("first_batch_wait_ratio", "job", "ratio", "mean", ("share of step time spent waiting "
         "for the first batch of a restarted DataLoader iterator (step lines' first_batch; "
         "the run's first iterator does not count)"), True),
        ("first_batch_wait_seconds", "job", "seconds", "mean", ("data wait of a new "
         "iterator's first batch (window mean: per new iterator)"), True),
        ("iterator_rate", "job", "1/s", "mean", ("new DataLoader iterators (epochs) started "
         "per second"), True),
        ("mem_allocated_growth_bytes_per_second", "job", "bytes/s", "mean", ("torch "
         "allocated at step end: its least-squares slope over the window, per second"),
         True),
        ("mem_allocated_growth_r2", "job", "ratio", "mean", ("how straight that rise is "
         "(R^2 of the fit: 1 = a steady rate)"), True),
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
        ("channels_last", "config", "bool", "last", ("the model's parameters are in "
         "torch.channels_last memory format"), False),
        ("cudnn_tf32", "config", "bool", "last", ("torch.backends.cudnn.allow_tf32: cuDNN "
         "runs FP32 convolutions as TF32 (on by default)"), False),
        ("uses_dataloader", "config", "bool", "last", ("the job iterates a torch DataLoader "
         "(false: the hook saw none)"), False),
        ("step_source", "config", "text", "last", ("what the hook counts as a step: "
         "'optimizer' (optimizer.step) or 'backward' (loops without torch.optim)"), False),
        ("autocast", "config", "bool", "last", "autocast to a 16-bit type is on", True),
        # step-time attribution (docs/advice.md): each is a share of the window's wall time
        # since the job's first step, and the five always sum to 1; any window function
        # reads the share over its window (``mean(share_data, 15s)``, ``last`` = 15 s)
        ("share_data", "job", "ratio", "mean", ("share of wall time blocked in the "
         "DataLoader (claimed first)"), True),
        ("share_sync", "job", "ratio", "mean", ("share of wall time this rank waits on a slower "
         "peer in collectives (several ranks only; claimed second)"), True),
        ("share_gpu", "job", "ratio", "mean", ("share of wall time the GPU works (SM active "
         "where GPM exists, else NVML util; claimed third)"), True),
        ("share_host", "job", "ratio", "mean", ("share of wall time the main process is busy "
         "inside steps while the GPU idles (Python, launches, host syncs)"), True),
        ("share_other", "job", "ratio", "mean", ("the rest: outside steps (pauses, evaluation, "
         "checkpoints) or nobody busy"), True),
        ("gpu_busy", "job", "ratio", "mean", ("the GPU busy share the attribution uses: SM "
         "active where GPM exists, else NVML util, over the job's training time"), True),
        ("job_rank", "job", "rank", "last", "the job's rank (0 for a single process)", True),
        ("job_ranks", "job", "count", "last", ("ranks of this job on this host: those the hook "
         "reports, else those whose environment ties them to one launch (1: a single "
         "process)"), True),
        ("rank_score", "job", "ratio", "mean", ("the fastest rank's own time per step over "
         "this rank's (1: sets no one's pace; below 0.75: a straggler)"), True),
        ("slowest_rank", "job", "rank", "last", "the rank with the lowest rank_score", True),
        ("peer_straggler", "job", "0/1", "last", ("another rank of this job is a straggler "
         "(rank_score < 0.75) that this rank waits for"), True),
        ("straggler_gain", "job", "ratio", "last", ("step time now over step time once the "
         "slowest rank's own bottleneck is gone: the other ranks' median pace, or its own GPU "
         "work where that is slower (how much faster the job would go)"), True),
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

    def add_n(self, name: str, total: float, n: float) -> None:
        """``n`` samples at once, summing to ``total`` (a trace's `steps` line)."""
        s = self.s
        if name in s:
            s[name] += total
            self.n[name] += n
        else:
            s[name] = total
            self.n[name] = n
        self.last[name] = total / n if n else total

    def add_weighted(self, name: str, v: float, w: float) -> None:
        """``v`` counted ``w`` times (a step standing for several)."""
        self.add_n(name, v * w, w)

    def mean(self, name: str) -> float | None:
        n = self.n.get(name)
        return self.s[name] / n if n else None

    def clear(self) -> None:
        self.s.clear()
        self.n.clear()
        self.last.clear()

# -- step-time attribution -----------------------------------------------------------------
# categories in the order they claim wall time (docs/advice.md): each takes only what the
# ones before it left, so the five always sum to 1 (the PyTorch profiler TensorBoard
# plugin's priority-claim design)
SHARE_CATEGORIES = ("data", "sync", "gpu", "host", "other")
SHARE_SIGNALS = {f"share_{c}": c for c in SHARE_CATEGORIES}
RANK_SIGNALS = frozenset({"gpu_busy", "job_rank", "job_ranks", "rank_score", "slowest_rank",
                          "peer_straggler", "straggler_gain"})
ATTRIBUTION_SIGNALS = frozenset(SHARE_SIGNALS) | RANK_SIGNALS
# nvidia-resiliency-ext flags a rank whose score (best rank's time / its own) is below this
STRAGGLER_SCORE = 0.75
# workers this busy (each pegging its core) are the bottleneck when nothing else is
_WORKERS_PEGGED = 0.8


@dataclass(frozen=True, slots=True)
class JobWindow:
    """What the attribution reads of one job over a stretch of wall time (``wall`` s)."""

    wall: float
    hook: bool  # step times measured by the hook (else NVML and psutil alone)
    steps: float = 0.0  # steps that ended in it
    step_total: float = 0.0  # their summed step time, seconds
    data_total: float | None = None  # summed DataLoader wait, seconds
    busy: float | None = None  # GPU busy share: SM active where GPM exists, else util
    util: float | None = None  # NVML util (time any kernel ran: NCCL spin kernels count)
    main: float | None = None  # main process busy (1 = one core)
    workers_busy: float | None = None  # DataLoader workers busy (1 = each pegs a core)
    workers: float | None = None  # DataLoader worker processes

    @property
    def workers_pegged(self) -> bool:
        """DataLoader workers, each keeping its core busy: what the GPU waits for."""
        return bool(self.workers) and (self.workers_busy or 0.0) >= _WORKERS_PEGGED

    def need(self) -> float:
        """Share of wall time this rank's own pipeline leaves its GPU without work: its
        data wait, or the time NVML saw no kernel at all (a rank that waits on a peer runs
        NCCL kernels meanwhile, so it needs little)."""
        if self.hook:
            data = (self.data_total or 0.0) / self.wall
        else:  # pegged DataLoader workers: what the GPU's idle time waits for (claim_shares)
            data = 1.0 - min(1.0, max(0.0, self.busy)) \
                if self.workers_pegged and self.busy is not None else 0.0
        idle = 1.0 - self.util if self.util is not None else 0.0
        return min(1.0, max(data, idle))


class _SpanTotals:
    """A job's attribution inputs summed bucket by bucket since its first step."""

    __slots__ = ("s",)

    _KEYS = ("wall", "steps", "step_total", "data_total", "busy", "util", "main",
             "workers_busy", "workers")

    def __init__(self) -> None:
        self.s: dict[str, float] = {}

    def add(self, w: JobWindow) -> None:
        s = self.s
        s["wall"] = s.get("wall", 0.0) + w.wall
        s["hook"] = 1.0 if w.hook else s.get("hook", 0.0)
        for k in ("steps", "step_total"):
            s[k] = s.get(k, 0.0) + getattr(w, k)
        if w.data_total is not None:
            s["data_total"] = s.get("data_total", 0.0) + w.data_total
        for k in ("busy", "util", "main", "workers_busy", "workers"):
            v = getattr(w, k)
            if v is not None:  # a time-weighted mean over the buckets that measured it
                s[k] = s.get(k, 0.0) + v * w.wall
                s["_w_" + k] = s.get("_w_" + k, 0.0) + w.wall

    def total(self) -> JobWindow | None:
        s = self.s
        if not s.get("wall"):
            return None

        def mean(k: str) -> float | None:
            w = s.get("_w_" + k)
            return s[k] / w if w else None

        return JobWindow(wall=s["wall"], hook=bool(s.get("hook")), steps=s.get("steps", 0.0),
                         step_total=s.get("step_total", 0.0), data_total=s.get("data_total"),
                         busy=mean("busy"), util=mean("util"), main=mean("main"),
                         workers_busy=mean("workers_busy"), workers=mean("workers"))


@dataclass(frozen=True, slots=True)
class Attribution:
    """One job's (one rank's) wall time split into the five categories, and its rank's
    standing among the job's ranks."""

    shares: dict[str, float]
    window: JobWindow
    rank: int | None = None
    ranks: int = 1
    score: float = 1.0
    slowest_rank: int | None = None
    peer_straggler: bool = False
    straggler_gain: float = 1.0

    def value(self, name: str) -> float | None:
        if name in SHARE_SIGNALS:
            return self.shares[SHARE_SIGNALS[name]]
        if name == "gpu_busy":
            return self.window.busy
        if name == "job_rank":
            return float(self.rank) if self.rank is not None else 0.0
        if name == "job_ranks":
            return float(self.ranks)
        if name == "rank_score":
            return self.score
        if name == "slowest_rank":
            return float(self.slowest_rank) if self.slowest_rank is not None else None
        if name == "peer_straggler":
            return 1.0 if self.peer_straggler else 0.0
        if name == "straggler_gain":
            return self.straggler_gain
        return None

    def top(self) -> str:
        """The largest slice: the bottleneck ("gpu": the GPU itself, which is as it
        should be)."""
        return max(SHARE_CATEGORIES, key=lambda c: self.shares[c])


def claim_shares(w: JobWindow, sync: float = 0.0) -> dict[str, float] | None:
    """Split ``w``'s wall time by priority claims; None when the GPU was not measured."""
    if w.wall <= 0 or w.busy is None:
        return None
    busy = min(1.0, max(0.0, w.busy))
    if w.hook:
        in_step = min(1.0, w.step_total / w.wall)
        data = min(in_step, (w.data_total or 0.0) / w.wall)
        sync = min(max(0.0, sync), in_step - data)
        gpu = min(busy, 1.0 - data - sync)
        room = max(0.0, in_step - data - sync - gpu)
        # inside steps, the GPU idle and no data wait: the main process is at work (Python,
        # launches, a host sync) unless psutil saw it idle (sleeping, blocked on I/O)
        host = min(room, w.main) if w.main is not None else room
    else:
        # without step times, all the time counts as training: a rank's wait for a slower
        # peer first (the ranks of one launch, host.py), then GPU work; pegged DataLoader
        # workers are taken to be what the rest waits for, else the main process
        sync = min(1.0, max(0.0, sync))
        gpu = min(busy, 1.0 - sync)
        rest = 1.0 - gpu - sync
        if w.workers_pegged:
            data, host = rest, 0.0
        else:
            data = 0.0
            host = min(rest, w.main) if w.main is not None else 0.0
    shares = {"data": data, "sync": sync, "gpu": gpu, "host": host}
    shares = {k: max(0.0, v) for k, v in shares.items()}
    total = sum(shares.values())
    if total > 1.0:
        shares = {k: v / total for k, v in shares.items()}
        total = 1.0
    shares["other"] = 1.0 - total
    return shares


def attribute_group(windows: dict[Any, tuple[JobWindow, int | None]]
                    ) -> dict[Any, Attribution]:
    """Attribution for the ranks of one job (a single process: a group of one).

    A rank whose own pipeline needs less of each step than the slowest rank's waits for it
    in the collectives: that difference is its ``sync`` share, claimed before GPU work
    (NCCL kernels spinning on a peer keep NVML util high but do no work)."""
    needs = {k: w.need() for k, (w, _) in windows.items()}
    multi = len(windows) >= 2
    top = max(needs.values(), default=0.0)
    syncs = {k: (top - n if multi else 0.0) for k, n in needs.items()}
    own = {k: max(1e-6, 1.0 - s) for k, s in syncs.items()}
    best = min(own.values(), default=1.0)
    slowest = max(own, key=lambda k: own[k]) if multi else None
    slow_rank = windows[slowest][1] if slowest is not None else None
    shares_of = {k: claim_shares(w, syncs[k]) for k, (w, _) in windows.items()}
    others = sorted(v for k, v in own.items() if k != slowest)
    gain = 1.0
    if others and slowest is not None:
        mid = len(others) // 2
        pace = others[mid] if len(others) % 2 else (others[mid - 1] + others[mid]) / 2
        # with its own bottleneck (data wait, host time) gone, the slowest rank still does
        # its GPU work: the job goes at the slower of that and the others' median pace
        sh = shares_of[slowest]
        if sh is not None and max(sh["data"], sh["host"]) >= sh["gpu"]:
            pace = max(pace, own[slowest] * (1.0 - max(sh["data"], sh["host"])))
        gain = own[slowest] / pace
    slow_score = best / own[slowest] if slowest is not None else 1.0
    out = {}
    for k, (w, rank) in windows.items():
        shares = shares_of[k]
        if shares is None:
            continue
        out[k] = Attribution(shares=shares, window=w, rank=rank, ranks=len(windows),
                             score=best / own[k], slowest_rank=slow_rank,
                             peer_straggler=(multi and k != slowest
                                             and slow_score < STRAGGLER_SCORE),
                             straggler_gain=max(1.0, gain) if multi else 1.0)
    return out


GROWTH_SIGNALS = frozenset({"mem_allocated_growth_bytes_per_second",
                            "mem_allocated_growth_r2"})


def growth(ring: Ring | None, end: int, n: int, res: float) -> tuple[float, float] | None:
    """Least-squares slope (per second) and R^2 of a ring's values over a window; None with
    fewer than 5 values (a leak is a rise sustained over many steps)."""
    if ring is None:
        return None
    s, e = ring.span(end, n)
    pts = [(i, v) for i, v in enumerate(ring.vals[s:e]) if v is not None]
    if len(pts) < 5:
        return None
    k = len(pts)
    mx = sum(p[0] for p in pts) / k
    my = sum(p[1] for p in pts) / k
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    sxy = sum((p[0] - mx) * (p[1] - my) for p in pts)
    syy = sum((p[1] - my) ** 2 for p in pts)
    if sxx <= 0:
        return None
    slope = sxy / sxx
    r2 = (sxy * sxy) / (sxx * syy) if syy > 0 else 0.0
    return slope / res, r2


def _ring_sums(ring: Ring | None, s: int, e: int) -> tuple[float, float]:
    """Sum of value x weight and of weights over absolute buckets [s, e)."""
    if ring is None:
        return 0.0, 0.0
    a = max(s, ring.base) - ring.base
    b = min(e, ring.base + len(ring.vals)) - ring.base
    if b <= a:
        return 0.0, 0.0
    return ring.psum[b] - ring.psum[a], ring.pw[b] - ring.pw[a]


def _ring_mean(ring: Ring | None, s: int, e: int) -> float | None:
    total, w = _ring_sums(ring, s, e)
    return total / w if w > 0 else None



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
        # the CPU of this GPU's own job trees (its rank and that rank's workers), from the
        # host line's per-tree ``jobs``: per-rank evidence without the hook
        self.cpu = Table(frame)
        self.config: dict[str, Any] = {}
        self.facts: dict[str, Any] = {}
        self.pids: set[int] = set()
        self.prev_loss_scale: float | None = None
        self.proc_pids: set[int] = set()
        # the job the hook reports for this GPU: its pid and rank; its attribution's clock
        # starts when its first step ends (job_warm), not at process start
        self.job_pid: int | None = None
        self.job_rank: int | None = None
        # without the hook: (launch digest, rank, world size) of this GPU's main process,
        # from its environment (host.py); the ranks of one launch are one job
        self.dist: tuple[str, int, int] | None = None
        self.iterators_seen = 0  # DataLoader iterators whose first batch the hook marked
        self.job_last: int | None = None  # the bucket of its newest step
        # the bucket after its first step ended: GPU and host windows of a job the hook
        # reports start here, so start-up (imports, CUDA init, compiling) is not judged
        self.job_warm: int | None = None
        self.job_t1: float | None = None  # when its newest step ended
        # when the steps its span counts (those read from job_warm on) began: the whole
        # run's wall clock runs from here to job_t1, so the time matches the steps summed
        self.span_t0: float | None = None
        self.span = _SpanTotals()  # the attribution's inputs summed since the first step
        self.steps_seen = 0.0  # every step the hook reported for this job, counted exactly
        self.span_at_last_step: JobWindow | None = None


class Frame:
    """Bucketed history of every subject, fed samples in time order.

    ``on_bucket(idx)`` is called after each bucket closes (evaluation time =
    ``(idx + 1) * res``). Only signals in ``needed`` (and what they derive from) are kept.
    """

    def __init__(self, res: float, needed: Iterable[str], keep_seconds: float,
                 on_bucket: Callable[[int], None] | None = None) -> None:
        self.res = float(res)
        self.keep = max(4, math.ceil(keep_seconds / self.res) + 2)
        # the attribution's inputs are always kept: the report's jobs list reads them
        self.needed = set(needed) | _dependencies(set(needed)) | _ATTRIBUTION_INPUTS
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
        self._attr_cache: dict[tuple[int, int], dict[int | None, Attribution]] = {}
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
        jobs = get("jobs")
        if jobs:
            self._feed_jobs(jobs)

    def _feed_jobs(self, jobs: Iterable[Any]) -> None:
        """Each job tree's CPU, summed per GPU its root is on (``gpus`` in the tree, or
        the GPUs whose latest gpu line lists its pid: older recordings)."""
        per: dict[int, list[float]] = {}
        dists: dict[int, tuple[str, int, int] | None] = {}
        for j in jobs:
            jg = _get(j)
            pid = jg("pid")
            gpus = jg("gpus") or [g for g, sj in self.subjects.items()
                                  if g is not None and pid in sj.proc_pids]
            if len(gpus) == 1:  # a rank's tree: its launch (a launcher's own has none)
                dist_job, rank, world = jg("dist_job"), jg("rank"), jg("world_size")
                g = int(gpus[0])
                if dist_job is not None and rank is not None and world is not None:
                    dists[g] = (str(dist_job), int(rank), int(world))
                else:
                    dists.setdefault(g, None)
            main, workers = jg("main_cpu_cores"), jg("workers_cpu_cores")
            if main is None or workers is None:
                continue
            procs = float(jg("processes") or 1)
            for g in gpus:
                t = per.setdefault(int(g), [0.0, 0.0, 0.0, 0.0])
                t[0] += 1.0
                t[1] += float(main)
                t[2] += float(workers)
                t[3] += max(0.0, procs - 1.0)
        for g, dist in dists.items():  # each line says it anew: a job that ended has none
            subj = self.subjects.get(g)
            if subj is not None:
                subj.dist = dist
        for g, (mains, main, workers, nworkers) in per.items():
            subj = self.subjects.get(g)
            if subj is None:  # a GPU no gpu line described: nothing to judge it by
                continue
            acc = subj.cpu.acc
            acc.add("mains", mains)
            acc.add("main", main)
            acc.add("workers", workers)
            acc.add("nworkers", nworkers)

    def _hook_starts(self, subj: Subject) -> None:
        """``subj``'s job sent its first step: from the next bucket on it is judged by
        the hook's steps. What was summed before it from NVML and psutil alone (the
        process looked like it trained) is dropped, so the whole run's split is the
        hook's alone."""
        subj.job_warm = self.idx + 1
        subj.span = _SpanTotals()
        subj.span_at_last_step = None
        subj.span_t0 = None

    def _span_begins(self, subj: Subject, begin: float) -> None:
        """A step line read in a bucket the span counts: its steps began at ``begin``."""
        if subj.job_warm is not None and self.idx is not None and self.idx >= subj.job_warm:
            subj.span_t0 = begin if subj.span_t0 is None else min(subj.span_t0, begin)

    def feed_step(self, s: Any) -> None:
        get = _get(s)
        self._advance(get("t"))
        subj = self._job_subject(get("gpu"), get("pid"), get("rank"))
        self.hook_steps = True
        pid, rank = get("pid"), get("rank")
        if pid is not None:
            subj.job_pid = pid
        if rank is not None:
            subj.job_rank = int(rank)
        subj.job_last = self.idx
        if subj.job_warm is None and self.idx is not None:
            self._hook_starts(subj)
        t_end = get("t")
        subj.job_t1 = t_end if subj.job_t1 is None else max(subj.job_t1, t_end)
        job = subj.job
        job.ever = True
        acc = job.acc
        # a Prometheus-derived step line stands for several steps (``_count``)
        count = float(get("_count") or 1.0)
        acc.add("_steps", count)
        subj.steps_seen += count
        ss = get("step_seconds")
        dw = get("data_wait_seconds")
        self._span_begins(subj, t_end - float(ss or 0.0) * count)
        if ss is not None:
            # a line standing for ``count`` steps weighs as many: the sums of step time and
            # data wait (the attribution's) stay right, the means stay means
            acc.add_weighted("step_seconds", float(ss), count)
            if dw is not None:
                acc.add_weighted("data_wait_seconds", float(dw), count)
                acc.add_weighted("_dw_ss", float(ss), count)
        for f in ("batch_size", "mem_allocated_bytes", "mem_reserved_bytes",
                  "max_mem_allocated_bytes", "loss"):
            v = get(f)
            if v is not None:
                acc.add(f, float(v))
        first = get("first_batch")
        if first is not None:
            acc.add("_fb_known", 1.0)
            if first:
                # the run's first iterator starts its workers whatever persistent_workers
                # says: only the ones after it are restarts
                subj.iterators_seen += 1
                if subj.iterators_seen > 1:
                    acc.add("_fb_dw", float(dw or 0.0))
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

    def feed_steps(self, s: Any) -> None:
        """A `steps` line: a job's steps of one interval, summed (docs/trace-format.md)."""
        get = _get(s)
        n = get("steps") or 0
        if n <= 0:
            return
        t_end = get("t")
        self._advance(t_end)
        subj = self._job_subject(get("gpu"), get("pid"), get("rank"))
        self.hook_steps = True
        pid, rank = get("pid"), get("rank")
        if pid is not None:
            subj.job_pid = pid
        if rank is not None:
            subj.job_rank = int(rank)
        subj.job_last = self.idx
        if subj.job_warm is None and self.idx is not None:
            self._hook_starts(subj)
        subj.job_t1 = t_end if subj.job_t1 is None else max(subj.job_t1, t_end)
        begin = get("begin_t")
        self._span_begins(subj, t_end if begin is None else min(float(begin), t_end))
        job = subj.job
        job.ever = True
        acc = job.acc
        acc.add("_steps", float(n))
        subj.steps_seen += n
        timed = get("timed") or 0
        ss, dw = get("step_seconds"), get("data_wait_seconds")
        if timed and ss is not None:
            acc.add_n("step_seconds", float(ss), timed)
            if dw is not None:
                acc.add_n("data_wait_seconds", float(dw), timed)
                acc.add_n("_dw_ss", float(ss), timed)
        for f in ("batch_size", "mem_allocated_bytes", "mem_reserved_bytes",
                  "max_mem_allocated_bytes"):
            v = get(f)
            if v is not None:
                acc.add(f, float(v))
        first = get("first_batch")
        if first is not None:
            acc.add("_fb_known", 1.0)
            if first:
                # the run's first iterator is no restart (as in feed_step); its own wait is
                # not told apart from the others', so it leaves its share of the sum
                restarts = first - (1 if subj.iterators_seen == 0 else 0)
                subj.iterators_seen += first
                if restarts > 0:
                    fb_dw = float(get("first_batch_data_wait_seconds") or 0.0)
                    acc.add_n("_fb_dw", fb_dw * restarts / first, restarts)
        scale = get("loss_scale")
        skipped = get("skipped")
        fell = False
        if scale is not None:
            scale = float(scale)
            acc.add("loss_scale", scale)
            fell = subj.prev_loss_scale is not None and scale < subj.prev_loss_scale
            subj.prev_loss_scale = scale
        if skipped is not None:
            acc.add_n("_skip", float(skipped), n)
        elif scale is not None:
            acc.add("_skip", 1.0 if fell else 0.0)
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
        elif kind == "steps":
            self.feed_steps(s)
        elif kind == "config":
            self.feed_config(s)
        elif kind == "job_end" and len(self.job_ends) < 1000:
            self.job_ends.append(dict(s) if type(s) is dict else
                                 {f: getattr(s, f) for f in s.__slots__})

    # -- closing a bucket ----------------------------------------------------------------
    def _close(self, idx: int) -> None:
        self._attr_cache.clear()
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
            if subj.cpu.acc.n:
                self._close_cpu(idx, subj.cpu)
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
        no_hook = not self.hook_steps
        for subj in self.subjects.values():
            if subj.job_warm is not None and idx >= subj.job_warm:
                w = self.job_window(subj, idx + 1, 1, clamp=False)
                if w is not None:
                    subj.span.add(w)
                    if subj.job_last == idx:
                        subj.span_at_last_step = subj.span.total()
            elif subj.gpu is not None and no_hook and subj.job_warm is None and subj.proc_pids:
                # without the hook: the buckets in which the GPU's process looks like it
                # trains (kernels running, or its DataLoader workers pegged)
                w = self.job_window(subj, idx + 1, 1)
                if w is not None and w.util is not None and (
                        w.util >= 0.05 or w.workers_pegged):
                    subj.span.add(w)
                    subj.span_at_last_step = subj.span.total()
                    if len(subj.proc_pids) == 1:
                        subj.job_pid = next(iter(subj.proc_pids))
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
        if "_fb_known" in acc.n:
            fb = acc.s.get("_fb_dw", 0.0)
            n_fb = acc.n.get("_fb_dw", 0.0)
            ss_all = acc.s.get("step_seconds", 0.0)
            if ss_all > 0:
                job.push(idx, "first_batch_wait_ratio", min(1.0, fb / ss_all), ss_all)
            job.push(idx, "iterator_rate", n_fb / self.res)
            if n_fb:
                job.push(idx, "first_batch_wait_seconds", fb / n_fb, n_fb)
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

    # -- step-time attribution --------------------------------------------------------------
    def _job_table(self, subj: Subject) -> tuple[Table | None, Subject]:
        if subj.job.ever:
            return subj.job, subj
        # steps no GPU was named for are the only GPU's (subjects: the GPUs and the host)
        if subj.gpu is not None and self.host.job.ever and len(self.subjects) == 2:
            return self.host.job, self.host
        return None, subj

    def steps_stopped(self, subj: Subject, idx: int, grace: float = 2.0) -> bool:
        """Whether the hook reported steps for ``subj``'s job and none in the last
        ``grace`` seconds before bucket ``idx`` ended (the job ended or paused)."""
        _, owner = self._job_table(subj)
        last = owner.job_last
        return last is not None and (idx - last) * self.res > grace

    def job_window(self, subj: Subject, end: int, n: int, clamp: bool = True
                   ) -> JobWindow | None:
        """The attribution's inputs for ``subj`` over the ``n`` buckets before ``end``,
        from its job's first step on (None: nothing to attribute)."""
        if subj.gpu is None:
            return None
        table, owner = self._job_table(subj)
        hook = table is not None
        start = end - n
        if hook:
            # from the end of the job's first step: the first iteration carries its
            # one-off start (CUDA init, cuDNN autotuning, compiling), as the rules' do
            if owner.job_warm is None:
                return None
            start = max(start, owner.job_warm)
        else:
            start = max(start, subj.first)
        if end - start < 1:
            return None
        gt = subj.gpu_table.rings
        busy_ring = gt.get("sm_active") if subj.facts.get("gpm") else None
        busy = _ring_mean(busy_ring, start, end)
        util = _ring_mean(gt.get("util"), start, end)
        if busy is None:
            busy = util
        main = _ring_mean(self._cpu_ring(subj, "main_busy_ratio"), start, end)
        wb = _ring_mean(self._cpu_ring(subj, "workers_busy_ratio"), start, end)
        workers = _ring_mean(self._cpu_ring(subj, "job_workers"), start, end)
        wall = (end - start) * self.res
        if not hook:
            return JobWindow(wall=wall, hook=False, busy=busy, util=util, main=main,
                             workers_busy=wb, workers=workers)
        rings = table.rings
        step_total, _ = _ring_sums(rings.get("step_seconds"), start, end)
        rate_sum, _ = _ring_sums(rings.get("step_rate"), start, end)
        dw, dw_steps = _ring_sums(rings.get("data_wait_ratio"), start, end)
        # a step that began before the window still counts whole in it; a window's own
        # total is clamped (``clamp``), a run's is summed from unclamped buckets
        return JobWindow(wall=wall, hook=True, steps=rate_sum * self.res,
                         step_total=min(step_total, wall) if clamp else step_total,
                         data_total=dw if dw_steps > 0 else None, busy=busy, util=util,
                         main=main, workers_busy=wb, workers=workers)

    def train_start(self, subj: Subject) -> int | None:
        """The bucket from which ``subj``'s job is in training (after its first step), or
        None without the hook's steps."""
        if subj.job.ever:  # the usual case first: the rules ask this for every window
            return subj.job_warm
        if not self.host.job.ever:
            return None
        _, owner = self._job_table(subj)
        return owner.job_warm if owner.job.ever else None

    def _group_key(self, subj: Subject) -> Any:
        """Which ranks are one job: one process per GPU with a rank and the same world
        size (torchrun on one host); anything else stands alone."""
        if not subj.job.ever:
            # without the hook: the ranks its environment ties to one launch
            d = subj.dist
            if d is not None and d[2] >= 2 and not self.hook_steps:
                return ("launch", d[0], d[2])
            return ("alone", subj.gpu)
        ws = self.config_value(subj, "world_size")
        if subj.job_rank is None or (ws is not None and ws <= 1):
            return ("alone", subj.gpu)
        return ("ranks", ws)

    def attribution(self, subj: Subject, end: int, n: int) -> Attribution | None:
        """``subj``'s job's attribution over the ``n`` buckets before ``end``."""
        key = (end, n)
        got = self._attr_cache.get(key)
        if got is None:
            got = self._attribute_all(lambda s: self.job_window(s, end, n))
            self._attr_cache[key] = got
        return got.get(subj.gpu)

    def _attribute_all(self, window: Callable[[Subject], JobWindow | None]
                       ) -> dict[int | None, Attribution]:
        groups: dict[Any, dict[int | None, tuple[JobWindow, int | None]]] = {}
        for subj in self.subjects.values():
            w = window(subj)
            if w is None:
                continue
            rank = subj.job_rank
            if rank is None and not w.hook and subj.dist is not None:
                rank = subj.dist[1]
            groups.setdefault(self._group_key(subj), {})[subj.gpu] = (w, rank)
        out: dict[int | None, Attribution] = {}
        for members in groups.values():
            out.update(attribute_group(members))
        return out

    def _whole_run(self, subj: Subject) -> JobWindow | None:
        w = subj.span_at_last_step
        if w is None or not w.hook or subj.span_t0 is None or subj.job_t1 is None:
            return w
        # the span sums the steps read from the bucket after the first step's on; buckets
        # round that out to whole ones, so its wall is taken from the steps' own clock:
        # from when the first of them began to when the last ended
        wall = max(subj.job_t1 - subj.span_t0, 1e-3)
        return replace(w, wall=wall, step_total=min(w.step_total, wall))

    def jobs(self, end: int | None = None, n: int | None = None) -> list[dict[str, Any]]:
        """One entry per job and rank: ``pid``, ``rank``, ``gpu``, ``time_share``. Over the
        ``n`` buckets before ``end``, or (``n`` None) the whole run from each job's first
        step to its last."""
        if n is None:
            got = self._attribute_all(self._whole_run)
        else:
            e = end if end is not None else (self.idx or 0)
            got = self._attribute_all(lambda s: self.job_window(s, e, n))
        out = []
        for gpu in sorted(g for g in got if g is not None):
            a = got[gpu]
            subj = self.subjects[gpu]
            w = a.window
            pid = subj.job_pid
            if pid is None and len(subj.proc_pids) == 1:
                pid = next(iter(subj.proc_pids))
            entry: dict[str, Any] = {
                "pid": pid,
                "rank": a.rank,
                "gpu": gpu,
                "time_share": {c: round(a.shares[c], 4) for c in SHARE_CATEGORIES},
                "bottleneck": a.top(),
                "source": "hook" if w.hook else "nvml",
                "seconds": round(w.wall, 1),
                # the whole run's count is exact (the span leaves out the first step's
                # bucket); a window's is what its buckets hold
                "steps": (int(round(self._job_table(subj)[1].steps_seen)) if n is None
                          else int(round(w.steps))) if w.hook else None,
                "step_seconds": round(w.step_total / w.steps, 6) if w.hook and w.steps
                else None,
            }
            if a.ranks > 1:
                entry["ranks"] = a.ranks
                entry["rank_score"] = round(a.score, 3)
                entry["slowest_rank"] = a.slowest_rank
            out.append(entry)
        return out

    def finish(self) -> None:
        """Close the open bucket (end of a recording)."""
        if self.idx is not None:
            self.flush_to(self.idx + 1)

    # -- reading ---------------------------------------------------------------------------
    def _close_cpu(self, idx: int, table: Table) -> None:
        a = table.acc
        table.ever = True
        mains, main, workers, nworkers = (a.mean(k) for k in ("mains", "main", "workers",
                                                              "nworkers"))
        a.clear()
        if not mains:
            return
        table.push(idx, "job_main_processes", mains)
        table.push(idx, "job_workers", nworkers)
        table.push(idx, "main_cpu_cores", main / mains)
        table.push(idx, "main_busy_ratio", min(1.0, main / mains))
        table.push(idx, "workers_cpu_cores", workers)
        if nworkers is not None and nworkers >= 1:
            table.push(idx, "workers_busy_ratio", min(1.0, workers / nworkers))

    def _cpu_ring(self, subj: Subject, name: str) -> Ring | None:
        """A GPU's own job CPU where the trees say which GPU they are on, else the host's."""
        ring = subj.cpu.rings.get(name) if subj.cpu.ever else None
        return ring if ring is not None else self.host_tables.rings.get(name)

    def lookup_table(self, subj: Subject, name: str) -> Table | None:
        table = VOCABULARY[name].table
        if table == "gpu":
            return subj.gpu_table if subj.gpu is not None else None
        if table == "host":
            if subj.cpu.ever and name in _PER_GPU_CPU and name in subj.cpu.rings:
                return subj.cpu
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
            "StepsSample": "steps", "ConfigSample": "config", "JobEnd": "job_end"}

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


# host signals a GPU also has of its own, from the job trees on it (``Subject.cpu``)
_PER_GPU_CPU = frozenset({"job_main_processes", "job_workers", "main_cpu_cores",
                          "main_busy_ratio", "workers_cpu_cores", "workers_busy_ratio"})

_ATTRIBUTION_INPUTS = {"util", "sm_active", "step_seconds", "data_wait_ratio", "step_rate",
                       "main_busy_ratio", "workers_busy_ratio", "job_workers"}


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
    "ATTRIBUTION_SIGNALS",
    "GROWTH_SIGNALS",
    "CONFIG_KEYS",
    "SHARE_CATEGORIES",
    "Attribution",
    "JobWindow",
    "claim_shares",
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
