"""Immutable sample records: what every source produces and every consumer reads.

Field names are the `gpuwatch-trace/1` field names (docs/trace-format.md), so that a
sample, a trace line and a rule's signal all speak one vocabulary. A field that could not
be measured is ``None`` ("not available"), never zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

TRACE_FORMAT = "gpuwatch-trace/1"


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One process holding memory on one GPU."""

    pid: int
    mem_used_bytes: int | None = None  # in bytes
    sm_util: float | None = None  # 0-1, NVML per-process SM utilization, where given
    name: str | None = None  # from psutil
    user: str | None = None  # from psutil


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """Static facts about one GPU, probed once at start."""

    gpu: int  # NVML index
    uuid: str | None = None
    name: str | None = None
    driver_version: str | None = None
    compute_capability: tuple[int, int] | None = None
    pci_bus_id: str | None = None
    mem_total_bytes: int | None = None
    gpm_supported: bool = False


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU. ``lost`` marks a GPU that fell off the bus."""

    t: float  # Unix seconds
    gpu: int
    uuid: str | None = None
    lost: bool = False
    # cheap fields, every tick
    util: float | None = None  # 0-1, NVML utilization.gpu
    mem_util: float | None = None  # 0-1, memory controller busy
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    temp_celsius: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    pstate: int | None = None  # 0 (P0, fastest) .. 15
    clock_event_reasons: int | None = None  # NVML bitmask
    # slow fields, on the slow cadence (the newest value is carried into each tick)
    energy_joules: float | None = None  # counter since driver load
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    pcie_replay_total: int | None = None  # counter
    ecc_corrected_total: int | None = None  # counter, volatile
    ecc_uncorrected_total: int | None = None  # counter, volatile
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    # GPM (Hopper and newer), 0-1
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    fp16_active: float | None = None
    fp32_active: float | None = None
    fp64_active: float | None = None
    processes: tuple[GpuProcess, ...] = ()
    # XID errors seen since start, by XID code (counter per code)
    xid_total: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JobTree:
    """The process tree of one process using a GPU: the job and its DataLoader workers."""

    pid: int
    name: str | None = None
    user: str | None = None
    cpu_cores: float = 0.0  # CPU cores busy, summed over the tree (1.6 = 160 %)
    main_cpu_cores: float = 0.0  # the root process alone
    workers_cpu_cores: float = 0.0  # its descendants
    processes: int = 1
    rss_bytes: int = 0  # summed RSS (forked pages count once per process)
    # the descendants torch names as its DataLoader workers (the process name
    # "pt_data_worker": torch 2.5 and newer), and their CPU cores; the tree's other
    # children (a framework's helper, compile workers) are not. 0 where none is so named,
    # which older torch also reads as; None in a recording from an older gpuwatch
    loader_workers: int | None = None
    loader_cpu_cores: float | None = None
    # bytes per second the root process wrote to storage since the last tick (/proc/PID/io
    # write_bytes: files on a disk, as their pages are dirtied; not tmpfs, pipes, sockets);
    # None on the first tick, for another user's process, or from an older gpuwatch
    main_write_bytes_per_second: float | None = None
    # DataLoader workers (named so, as loader_workers) started in the tree since the last
    # tick: born since the tick before the sampler first saw them (a DataLoader with
    # persistent_workers=False starts its whole pool at every epoch and evaluation); and all
    # started since the sampler first saw the root (a counter); None from an older gpuwatch
    loader_workers_started: int | None = None
    loader_workers_started_total: int | None = None
    gpus: tuple[int, ...] = ()  # the GPUs NVML lists the root on (its rank's GPU)
    # what the root's environment says of a distributed launch (torchrun, accelerate,
    # deepspeed set them): its RANK, WORLD_SIZE, and a digest of the launch's identity
    # (TORCHELASTIC_RUN_ID, MASTER_ADDR:MASTER_PORT) that its ranks share; None if unset or
    # unreadable (another user's process)
    rank: int | None = None
    world_size: int | None = None
    dist_job: str | None = None
    # the debugging switches the root's environment turns on (host.DEBUG_ENV: e.g.
    # CUDA_LAUNCH_BLOCKING for "=1"), by name only; () for none, None where it cannot be
    # read (another user's process) or from an older gpuwatch
    debug_env: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class HostSample:
    t: float
    cpu_util_per_core: tuple[float, ...] = ()  # 0-1 each
    cpu_util: float | None = None  # 0-1, all cores
    load1: float | None = None
    load5: float | None = None
    load15: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    swap_used_bytes: int | None = None
    swap_total_bytes: int | None = None
    # the training job's trees, summed (trace `host` line fields)
    job_cpu_cores: float | None = None
    job_processes: int | None = None
    job_rss_bytes: int | None = None
    job_main_cpu_cores: float | None = None
    job_workers_cpu_cores: float | None = None
    job_loader_workers: int | None = None  # the trees' named DataLoader workers (JobTree)
    job_loader_cpu_cores: float | None = None
    job_write_bytes_per_second: float | None = None  # the trees' main processes, summed
    job_loader_workers_started: int | None = None  # the trees' DataLoader workers started
    jobs: tuple[JobTree, ...] = ()


@dataclass(frozen=True, slots=True)
class StepSample:
    """One training iteration, as the in-process hook saw it (`step` trace line)."""

    t: float  # end of the iteration
    step: int
    step_seconds: float | None = None
    data_wait_seconds: float | None = None
    batch_size: int | None = None
    loss_scale: float | None = None
    mem_allocated_bytes: int | None = None
    mem_reserved_bytes: int | None = None
    max_mem_allocated_bytes: int | None = None
    loss: float | None = None
    skipped: bool | None = None
    first_batch: bool | None = None  # its data wait included a new DataLoader iterator's first
    first_batch_wait_seconds: float | None = None  # that part of its data wait
    micro_batches: int | None = None  # backward() calls in it: gradient accumulation
    pid: int | None = None
    rank: int | None = None
    gpu: int | None = None


@dataclass(frozen=True, slots=True)
class StepsSample:
    """A job's steps of one interval, summed (`steps` trace line): what stands for its
    `step` lines where the job steps faster than those are kept (docs/trace-format.md).

    Counts and sums are exact, so consumers still get exact step counts, skipped counts,
    means and the data-wait share; the percentiles describe the steps' durations."""

    t: float  # end of the last step it counts
    steps: int  # steps it counts (none of them has a `step` line of its own)
    begin_t: float | None = None  # when the first of them began
    first_step: int | None = None  # step numbers of the first and last of them
    last_step: int | None = None
    skipped: int | None = None  # of those whose skipping is known, how many were skipped
    timed: int = 0  # steps whose duration is known; the sums below are over these
    step_seconds: float | None = None  # summed
    data_wait_seconds: float | None = None  # summed
    samples: int | None = None  # batch sizes summed over timed steps that had one
    sample_seconds: float | None = None  # the step time of those same steps
    step_seconds_min: float | None = None
    step_seconds_p50: float | None = None
    step_seconds_p90: float | None = None
    step_seconds_p99: float | None = None
    step_seconds_max: float | None = None
    batch_size: int | None = None  # of the last step that had one
    first_batch: int | None = None  # steps whose data wait included a new iterator's first
    first_batch_wait_seconds: float | None = None  # that part of their wait, summed
    first_batch_data_wait_seconds: float | None = None  # their whole data wait, summed
    loss_scale: float | None = None  # the last known
    mem_allocated_bytes: int | None = None  # the allocator, as last known
    mem_reserved_bytes: int | None = None
    max_mem_allocated_bytes: int | None = None
    micro_batches: int | None = None  # backward() calls, summed over the steps that counted
    micro_counted: int | None = None  # them (absent: not counted)
    pid: int | None = None
    rank: int | None = None
    gpu: int | None = None


@dataclass(frozen=True, slots=True)
class ConfigSample:
    """What the hook learned of a job's configuration (`config` trace line)."""

    t: float
    pid: int | None = None
    rank: int | None = None
    values: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PhaseSample:
    """What a training process is doing, and the seconds it spent in each phase so far
    (`phase` trace line): start-up, compile, train, eval, checkpoint, inference."""

    t: float
    phase: str
    seconds: Mapping[str, float] = field(default_factory=dict)  # cumulative, by phase
    compiles: int | None = None  # torch.compile compilations so far
    checkpoints: int | None = None  # checkpoint saves during training so far
    eval_batches: int | None = None  # batches of other loaders since training began
    eval_samples: int | None = None
    eval_batch_size: int | None = None
    eval_wait_seconds: float | None = None
    # True: some evaluation batches came from a DataLoader that trains (None: none did)
    eval_train_loader: bool | None = None
    inference_batches: int | None = None  # a process that never trained: its batches
    inference_samples: int | None = None
    inference_batch_size: int | None = None
    inference_wait_seconds: float | None = None  # its DataLoader's wait for those batches
    generate_calls: int | None = None
    hook_state: str | None = None  # "off": the hook stopped measuring
    # gc.collect() / torch.cuda.empty_cache() called while training so far: calls and the
    # seconds inside them, by name (protocol.CLEANUPS); empty until one was
    calls: Mapping[str, int] = field(default_factory=dict)
    call_seconds: Mapping[str, float] = field(default_factory=dict)
    pid: int | None = None
    rank: int | None = None
    gpu: int | None = None


@dataclass(frozen=True, slots=True)
class HookProblem:
    """Something the hook in a process could not read or do (`hook_problem` trace line):
    ``what`` (``config.tf32``, ``hook.off``) and the error, said once per process."""

    t: float
    what: str
    error: str = ""
    pid: int | None = None
    rank: int | None = None
    gpu: int | None = None


@dataclass(frozen=True, slots=True)
class JobStats:
    """Per-job aggregates from the hook, as exported (one per pid)."""

    pid: int
    rank: int | None = None
    gpu: int | None = None
    t: float = 0.0  # last report
    steps_total: int = 0
    skipped_steps_total: int = 0
    step_seconds: float | None = None  # mean over the last report
    data_wait_ratio: float | None = None  # 0-1, over the last report
    loss_scale: float | None = None
    samples_per_second: float | None = None
    mem_allocated_bytes: int | None = None
    mem_reserved_bytes: int | None = None
    max_mem_allocated_bytes: int | None = None
    alive: bool = True
    exit_reason: str | None = None  # e.g. "oom", "exited", "vanished"
    phase: str | None = None  # what it does now (PhaseSample.phase)
    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    hook_problems: int = 0  # distinct problems the hook reported
    hook_state: str = "on"


@dataclass(frozen=True, slots=True)
class JobEnd:
    """A training process ended (`job_end` trace line): how, when, and its last state.

    ``t`` is when gpuwatch learned of it: the hook's exit report (sent as the process
    exits), the launcher reaping its child, or, for a process that died without a word
    (killed by a signal or the kernel's OOM killer), the receiver finding it gone; then
    ``last_report_t`` (its last sign of life) bounds when it died."""

    t: float
    pid: int
    exit_reason: str  # exited, oom, exception, interrupted, killed, vanished
    rank: int | None = None
    gpu: int | None = None
    error: str | None = None  # the exception's text (e.g. the CUDA OOM message)
    steps_total: int | None = None
    first_step_t: float | None = None  # Unix seconds, the end of its first iteration
    last_report_t: float | None = None
    mem_allocated_bytes: int | None = None  # the allocator, as of its last report
    mem_reserved_bytes: int | None = None
    max_mem_allocated_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Health:
    """The daemon's view of itself, exported as self-health series."""

    ticks_total: int = 0
    tick_seconds: float | None = None  # duration of the last tick
    errors_total: Mapping[str, int] = field(default_factory=dict)  # by source
    last_success_time: float | None = None
    hook_messages_total: int = 0
    hook_messages_dropped_total: Mapping[str, int] = field(default_factory=dict)  # by reason


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the daemon knows right now; what /metrics serves."""

    t: float
    gpus: tuple[GpuSample, ...] = ()
    infos: tuple[GpuInfo, ...] = ()
    host: HostSample | None = None
    jobs: tuple[JobStats, ...] = ()
    health: Health = field(default_factory=Health)
    nvml_available: bool = True


Sample = (GpuSample | HostSample | StepSample | StepsSample | ConfigSample | JobEnd
          | PhaseSample | HookProblem)
