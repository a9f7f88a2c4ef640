"""The Prometheus exporter: a custom collector over the store's latest snapshot.

Every scrape builds its metric families fresh from ``Store.latest()``: there are no global
Gauge objects, so a process that exits or a GPU that is gone simply stops appearing, and a
field the GPU cannot report (``None``) has no series rather than a zero (its family is still
declared, HELP and TYPE, from the first scrape). The names are those of docs/metrics.md.
A sample of the exposition output (one H200 under load)::

    # HELP gpuwatch_gpu_info Static facts about a GPU (value is always 1).
    # TYPE gpuwatch_gpu_info gauge
    gpuwatch_gpu_info{compute_capability="9.0",driver_version="580.159.04",gpu="0",name="NVIDIA H200",pci_bus_id="",uuid=""} 1.0
    # HELP gpuwatch_gpu_up 1 while the GPU answers NVML, 0 once it is lost.
    # TYPE gpuwatch_gpu_up gauge
    gpuwatch_gpu_up{gpu="0",uuid=""} 1.0
    # HELP gpuwatch_gpu_utilization_ratio Time fraction in which a kernel was running (NVML utilization.gpu).
    # TYPE gpuwatch_gpu_utilization_ratio gauge
    gpuwatch_gpu_utilization_ratio{gpu="0",uuid=""} 1.0
    # HELP gpuwatch_gpu_clock_event_reason Whether a clock event reason is active (1) or not (0).
    # TYPE gpuwatch_gpu_clock_event_reason gauge
    gpuwatch_gpu_clock_event_reason{gpu="0",reason="gpu_idle",uuid=""} 0.0
    gpuwatch_gpu_clock_event_reason{gpu="0",reason="sw_power_cap",uuid=""} 1.0
    # HELP gpuwatch_gpu_sm_active_ratio Fraction of time SMs had a warp resident (GPM).
    # TYPE gpuwatch_gpu_sm_active_ratio gauge
    gpuwatch_gpu_sm_active_ratio{gpu="0",uuid=""} 0.89
    # HELP gpuwatch_process_gpu_memory_used_bytes GPU memory used by a process.
    # TYPE gpuwatch_process_gpu_memory_used_bytes gauge
    gpuwatch_process_gpu_memory_used_bytes{gpu="0",name="python3",pid="4242",user="alice",uuid=""} 1.2e+10
    # HELP gpuwatch_ticks_total Sampling ticks completed.
    # TYPE gpuwatch_ticks_total counter
    gpuwatch_ticks_total 1234.0
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuwatch import __version__, logs
from gpuwatch.job.protocol import DROP_REASONS, PHASES
from gpuwatch.samples import GpuInfo, GpuSample, Health, HostSample, JobStats, Snapshot

log = logging.getLogger(__name__)

# NVML clock event ("throttle") reason bits, nvmlClocksEventReason* in nvml.h
CLOCK_EVENT_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)

GPU_LABELS = ["gpu", "uuid"]
PROCESS_LABELS = ["gpu", "uuid", "pid", "name", "user"]
JOB_LABELS = ["pid", "name", "user"]
TRAIN_LABELS = ["pid", "rank", "gpu"]

# (metric name, help, GpuSample field, scale) for the plain per-GPU gauges
_GPU_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("gpuwatch_gpu_utilization_ratio",
     "Time fraction in which a kernel was running (NVML utilization.gpu).", "util", 1.0),
    ("gpuwatch_gpu_memory_utilization_ratio",
     "How busy the memory controller was (not how full memory is).", "mem_util", 1.0),
    ("gpuwatch_gpu_memory_used_bytes", "GPU memory in use, whole device.", "mem_used_bytes", 1.0),
    ("gpuwatch_gpu_memory_total_bytes", "GPU memory in total.", "mem_total_bytes", 1.0),
    ("gpuwatch_gpu_power_watts", "Power draw.", "power_watts", 1.0),
    ("gpuwatch_gpu_power_limit_watts", "Enforced power limit.", "power_limit_watts", 1.0),
    ("gpuwatch_gpu_temperature_celsius", "GPU core temperature.", "temp_celsius", 1.0),
    ("gpuwatch_gpu_sm_clock_hertz", "SM clock.", "sm_clock_mhz", 1e6),
    ("gpuwatch_gpu_memory_clock_hertz", "Memory clock.", "mem_clock_mhz", 1e6),
    ("gpuwatch_gpu_pstate", "Performance state: 0 (P0, fastest) to 15.", "pstate", 1.0),
    ("gpuwatch_gpu_pcie_transmit_bytes_per_second", "PCIe transmit throughput.",
     "pcie_tx_bytes_per_second", 1.0),
    ("gpuwatch_gpu_pcie_receive_bytes_per_second", "PCIe receive throughput.",
     "pcie_rx_bytes_per_second", 1.0),
    ("gpuwatch_gpu_sm_active_ratio", "Fraction of time SMs had a warp resident (GPM).",
     "sm_active", 1.0),
    ("gpuwatch_gpu_sm_occupancy_ratio", "Resident warps over the SMs' maximum (GPM).",
     "sm_occupancy", 1.0),
    ("gpuwatch_gpu_tensor_active_ratio", "Fraction of time the tensor pipes were busy (GPM).",
     "tensor_active", 1.0),
    ("gpuwatch_gpu_dram_active_ratio", "Fraction of time device memory was read or written (GPM).",
     "dram_active", 1.0),
    ("gpuwatch_gpu_fp16_active_ratio", "Fraction of time the FP16 pipe was busy (GPM).",
     "fp16_active", 1.0),
    ("gpuwatch_gpu_fp32_active_ratio", "Fraction of time the FP32 pipe was busy (GPM).",
     "fp32_active", 1.0),
    ("gpuwatch_gpu_fp64_active_ratio", "Fraction of time the FP64 pipe was busy (GPM).",
     "fp64_active", 1.0),
)

# (metric name without _total, help, GpuSample field) for per-GPU counters without labels
_GPU_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("gpuwatch_gpu_energy_joules", "Energy consumed since the driver was loaded.",
     "energy_joules"),
    ("gpuwatch_gpu_pcie_replays", "PCIe replay counter.", "pcie_replay_total"),
)

_HOST_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("gpuwatch_host_load1", "Load average over 1 minute.", "load1"),
    ("gpuwatch_host_load5", "Load average over 5 minutes.", "load5"),
    ("gpuwatch_host_load15", "Load average over 15 minutes.", "load15"),
    ("gpuwatch_host_memory_used_bytes", "Host memory in use.", "mem_used_bytes"),
    ("gpuwatch_host_memory_total_bytes", "Host memory in total.", "mem_total_bytes"),
    ("gpuwatch_host_swap_used_bytes", "Swap in use.", "swap_used_bytes"),
    ("gpuwatch_host_swap_total_bytes", "Swap in total.", "swap_total_bytes"),
)


# every source of gpuwatch_errors_total, exported at 0 from the first scrape on: a counter
# that appears only with its first error hides that error from increase() and rate()
ERROR_SOURCES: tuple[str, ...] = (
    "nvml",         # NVML could not start, or had to be started again
    "xid",          # waiting for XID events failed
    "tick", "host", "store",
    "snapshot", "export_gpu", "export_process", "export_host", "export_train",
    "hook_socket",  # the hook socket vanished or could not be rebound
    "recorder",     # the recording stopped (disk full, a write error)
    "replay",       # a replayed recording's line could not be served
)
# per GPU, for each GPU the daemon knows: a failed call, the GPU lost, a read stuck in NVML
GPU_ERROR_SOURCES: tuple[str, ...] = ("gpu{}", "gpu{}_lost", "gpu{}_stalled",
                                      "gpu{}_slow_stalled")


class Collector(Protocol):
    def collect(self) -> Iterable[Metric]: ...


def _label(value: object) -> str:
    return "" if value is None else str(value)


class GpuwatchCollector:
    """Yields every gpuwatch series from ``snapshot()`` (usually ``store.latest``).

    ``extra`` collectors (the advisor's ``gpuwatch_advice_*``) are collected in the same
    scrape; one that raises costs its own series and is counted, never the scrape.
    """

    def __init__(self, snapshot: Callable[[], Snapshot],
                 extra: Sequence[Collector] = ()) -> None:
        self._snapshot = snapshot
        self._extra = list(extra)
        self._collect_errors: dict[str, int] = {}

    def add_collector(self, collector: Collector) -> None:
        self._extra.append(collector)

    def describe(self) -> list[Metric]:
        # an empty description keeps the registry from collecting at registration time
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            snap = self._snapshot()
        except Exception as err:  # a broken source must not fail the scrape
            log.debug("reading the snapshot failed", exc_info=True)
            logs.once(log, "collect-snapshot", logging.ERROR,
                      "cannot read the latest snapshot (%r); serving self-health only", err)
            self._count_error("snapshot")
            snap = None
        families: list[Metric] = []
        if snap is not None:
            for part, build in (("gpu", _gpu_families), ("process", _process_families),
                                ("host", _host_families), ("train", _train_families)):
                try:
                    families.extend(build(snap))
                except Exception as err:  # one bad part must not fail the scrape
                    log.debug("exporting the %s series failed", part, exc_info=True)
                    logs.once(log, f"collect-{part}", logging.ERROR,
                              "cannot export the %s series (%r); skipping them", part, err)
                    self._count_error(f"export_{part}")
        for collector in self._extra:
            try:
                families.extend(collector.collect())
            except Exception as err:  # nor one bad extra collector
                name = type(collector).__name__
                log.debug("collector %s failed", name, exc_info=True)
                logs.once(log, f"collect-extra-{name}", logging.ERROR,
                          "collector %s failed (%r); its series are left out", name, err)
                self._count_error(f"collector_{name}")
        families.extend(_self_families(snap, self._collect_errors))
        yield from _with_declarations(families)

    def _count_error(self, source: str) -> None:
        self._collect_errors[source] = self._collect_errors.get(source, 0) + 1


def _with_declarations(families: list[Metric]) -> Iterator[Metric]:
    """The families with samples, then every other family gpuwatch exports, HELP and TYPE
    only: a series not sampled yet (no GPU, no job, no tick, no advice) is still declared,
    so Prometheus' metadata and dashboard checks know every name from the first scrape."""
    seen: set[str] = set()
    for fam in families:
        if fam.samples and fam.name not in seen:
            seen.add(fam.name)
            yield fam
    for fam in (*families, *_declared_families()):
        if fam.name not in seen:
            seen.add(fam.name)
            yield Metric(fam.name, fam.documentation, fam.type, fam.unit)


@functools.cache
def _declared_families() -> tuple[Metric, ...]:
    # the builders run over a snapshot with every part present but no readings, so each
    # family's HELP text stays written in one place, next to the code that fills it
    template = Snapshot(t=1.0, host=HostSample(t=1.0),
                        health=Health(tick_seconds=0.0, last_success_time=1.0))
    families: list[Metric] = []
    for build in (_gpu_families, _process_families, _host_families, _train_families):
        families.extend(build(template))
    # the step-time shares come from the advisor, which may not run; declared all the same
    families.extend(time_share_families(()))
    families.extend(_self_families(template, {}))
    return tuple(families)


def _gpu_families(snap: Snapshot) -> list[Metric]:
    infos: dict[int, GpuInfo] = {i.gpu: i for i in snap.infos}
    samples: dict[int, GpuSample] = {g.gpu: g for g in snap.gpus}

    def uuid_of(index: int) -> str:
        sample, info = samples.get(index), infos.get(index)
        return _label((sample and sample.uuid) or (info and info.uuid))

    info_f = GaugeMetricFamily(
        "gpuwatch_gpu_info", "Static facts about a GPU (value is always 1).",
        labels=["gpu", "uuid", "name", "driver_version", "compute_capability", "pci_bus_id"])
    up = GaugeMetricFamily("gpuwatch_gpu_up", "1 while the GPU answers NVML, 0 once it is lost.",
                           labels=GPU_LABELS)
    for index in sorted(set(infos) | set(samples)):
        info = infos.get(index)
        if info is not None:
            cc = info.compute_capability
            info_f.add_metric([str(index), uuid_of(index), _label(info.name),
                               _label(info.driver_version),
                               f"{cc[0]}.{cc[1]}" if cc else "", _label(info.pci_bus_id)], 1)
        sample = samples.get(index)
        up.add_metric([str(index), uuid_of(index)], 0 if sample is None or sample.lost else 1)
    out: list[Metric] = [info_f, up]

    live = [g for g in snap.gpus if not g.lost]
    for name, help_text, attr, scale in _GPU_GAUGES:
        fam = GaugeMetricFamily(name, help_text, labels=GPU_LABELS)
        for g in live:
            value = getattr(g, attr)
            if value is not None:
                fam.add_metric([str(g.gpu), uuid_of(g.gpu)], float(value) * scale)
        out.append(fam)
    for name, help_text, attr in _GPU_COUNTERS:
        fam = CounterMetricFamily(name, help_text, labels=GPU_LABELS)
        for g in live:
            value = getattr(g, attr)
            if value is not None:
                fam.add_metric([str(g.gpu), uuid_of(g.gpu)], float(value))
        out.append(fam)

    reasons = GaugeMetricFamily(
        "gpuwatch_gpu_clock_event_reason",
        "Whether a clock event (throttle) reason is active (1) or not (0).",
        labels=["gpu", "uuid", "reason"])
    ecc = CounterMetricFamily("gpuwatch_gpu_ecc_errors", "ECC errors (volatile counts).",
                              labels=["gpu", "uuid", "type"])
    remapped = GaugeMetricFamily("gpuwatch_gpu_remapped_rows", "Rows remapped in GPU memory.",
                                 labels=["gpu", "uuid", "type"])
    pending = GaugeMetricFamily("gpuwatch_gpu_remapped_rows_pending",
                                "1 while a row remapping waits for a GPU reset.",
                                labels=GPU_LABELS)
    failure = GaugeMetricFamily("gpuwatch_gpu_remapped_rows_failure",
                                "1 once a row remapping has failed.", labels=GPU_LABELS)
    xid = CounterMetricFamily("gpuwatch_gpu_xid_errors", "XID errors seen since start, by code.",
                              labels=["gpu", "uuid", "xid"])
    for g in live:
        base = [str(g.gpu), uuid_of(g.gpu)]
        if g.clock_event_reasons is not None:
            for reason, bit in CLOCK_EVENT_REASONS:
                reasons.add_metric(base + [reason], 1 if g.clock_event_reasons & bit else 0)
        for kind, value in (("corrected", g.ecc_corrected_total),
                            ("uncorrected", g.ecc_uncorrected_total)):
            if value is not None:
                ecc.add_metric(base + [kind], float(value))
        for kind, value in (("correctable", g.remapped_rows_correctable),
                            ("uncorrectable", g.remapped_rows_uncorrectable)):
            if value is not None:
                remapped.add_metric(base + [kind], float(value))
        if g.remapped_rows_pending is not None:
            pending.add_metric(base, 1 if g.remapped_rows_pending else 0)
        if g.remapped_rows_failure is not None:
            failure.add_metric(base, 1 if g.remapped_rows_failure else 0)
    # XIDs are counted even for a lost GPU: the XID is often why it was lost
    for g in snap.gpus:
        for code, count in sorted(g.xid_total.items()):
            xid.add_metric([str(g.gpu), uuid_of(g.gpu), str(code)], float(count))
    out += [reasons, ecc, remapped, pending, failure, xid]
    return out


def _process_families(snap: Snapshot) -> list[Metric]:
    infos = {i.gpu: i for i in snap.infos}
    mem = GaugeMetricFamily("gpuwatch_process_gpu_memory_used_bytes",
                            "GPU memory used by a process.", labels=PROCESS_LABELS)
    sm = GaugeMetricFamily("gpuwatch_process_gpu_sm_utilization_ratio",
                           "SM utilization of a process, where NVML gives it.",
                           labels=PROCESS_LABELS)
    for g in snap.gpus:
        if g.lost:
            continue
        info = infos.get(g.gpu)
        uuid = _label(g.uuid or (info.uuid if info else None))
        seen: set[int] = set()
        for p in g.processes:
            if p.pid in seen:  # NVML lists a process once per context; export it once
                continue
            seen.add(p.pid)
            labels = [str(g.gpu), uuid, str(p.pid), _label(p.name), _label(p.user)]
            if p.mem_used_bytes is not None:
                mem.add_metric(labels, float(p.mem_used_bytes))
            if p.sm_util is not None:
                sm.add_metric(labels, float(p.sm_util))
    return [mem, sm]


def _host_families(snap: Snapshot) -> list[Metric]:
    host: HostSample | None = snap.host
    if host is None:
        return []
    out: list[Metric] = []
    cpu = GaugeMetricFamily("gpuwatch_host_cpu_utilization_ratio",
                            "Host CPU busy, all cores (0-1).")
    cpu_util = host.cpu_util
    if cpu_util is None and host.cpu_util_per_core:
        # recordings carry only the per-core values; all cores is their mean
        cpu_util = sum(host.cpu_util_per_core) / len(host.cpu_util_per_core)
    if cpu_util is not None:
        cpu.add_metric([], float(cpu_util))
    out.append(cpu)
    core = GaugeMetricFamily("gpuwatch_host_cpu_core_utilization_ratio",
                             "Host CPU busy, per core (0-1).", labels=["core"])
    for i, value in enumerate(host.cpu_util_per_core):
        core.add_metric([str(i)], float(value))
    out.append(core)
    for name, help_text, attr in _HOST_GAUGES:
        value = getattr(host, attr)
        fam = GaugeMetricFamily(name, help_text)
        if value is not None:
            fam.add_metric([], float(value))
        out.append(fam)

    job_fams = {
        "cpu": GaugeMetricFamily("gpuwatch_job_cpu_cores",
                                 "CPU cores busy in a GPU job's process tree (1.6 = 160 %).",
                                 labels=JOB_LABELS),
        "main": GaugeMetricFamily("gpuwatch_job_main_cpu_cores",
                                  "CPU cores busy in the job's root process alone.",
                                  labels=JOB_LABELS),
        "workers": GaugeMetricFamily("gpuwatch_job_workers_cpu_cores",
                                     "CPU cores busy in the job's descendants (e.g. DataLoader "
                                     "workers).", labels=JOB_LABELS),
        "procs": GaugeMetricFamily("gpuwatch_job_processes", "Processes in the job's tree.",
                                   labels=JOB_LABELS),
        "rss": GaugeMetricFamily("gpuwatch_job_rss_bytes",
                                 "Summed RSS of the job's tree (shared pages count per process).",
                                 labels=JOB_LABELS),
        "loaders": GaugeMetricFamily("gpuwatch_job_loader_workers",
                                     "Processes in the job's tree that torch names as its "
                                     "DataLoader workers (pt_data_worker, torch 2.5+).",
                                     labels=JOB_LABELS),
        "loader_cpu": GaugeMetricFamily("gpuwatch_job_loader_cpu_cores",
                                        "CPU cores busy in the job's DataLoader workers "
                                        "(pt_data_worker processes).", labels=JOB_LABELS),
        "write": GaugeMetricFamily("gpuwatch_job_write_bytes_per_second",
                                   "Bytes per second the job's main process wrote to "
                                   "storage over the last tick (/proc/PID/io write_bytes: "
                                   "files on a disk; not tmpfs, pipes or sockets).",
                                   labels=JOB_LABELS),
    }
    trees: list[tuple[list[str], dict[str, Any]]] = [
        ([str(j.pid), _label(j.name), _label(j.user)],
         {"cpu": j.cpu_cores, "main": j.main_cpu_cores, "workers": j.workers_cpu_cores,
          "procs": j.processes, "rss": j.rss_bytes, "loaders": j.loader_workers,
          "loader_cpu": j.loader_cpu_cores, "write": j.main_write_bytes_per_second})
        for j in host.jobs]
    if not trees and host.job_cpu_cores is not None:
        # a recording keeps only the sum over the job trees, without pids: export that sum
        # with empty labels so dashboards and fleet rules still see the job's CPU
        trees.append((["", "", ""],
                      {"cpu": host.job_cpu_cores, "main": host.job_main_cpu_cores,
                       "workers": host.job_workers_cpu_cores, "procs": host.job_processes,
                       "rss": host.job_rss_bytes, "loaders": host.job_loader_workers,
                       "loader_cpu": host.job_loader_cpu_cores,
                       "write": host.job_write_bytes_per_second}))
    for labels, values in trees:
        for key, value in values.items():
            if value is not None:
                job_fams[key].add_metric(labels, float(value))
    out.extend(job_fams.values())
    started = CounterMetricFamily(
        "gpuwatch_job_loader_workers_started",
        "DataLoader workers started in the job's tree since gpuwatch first saw it (a "
        "DataLoader with persistent_workers=False starts them anew at every epoch).",
        labels=JOB_LABELS)
    for j in host.jobs:
        if j.loader_workers_started_total is not None:
            started.add_metric([str(j.pid), _label(j.name), _label(j.user)],
                               float(j.loader_workers_started_total))
    out.append(started)
    return out


def _train_families(snap: Snapshot) -> list[Metric]:
    steps = CounterMetricFamily("gpuwatch_train_steps", "Training steps reported by the hook.",
                                labels=TRAIN_LABELS)
    skipped = CounterMetricFamily("gpuwatch_train_skipped_steps",
                                  "Optimizer steps that GradScaler skipped.", labels=TRAIN_LABELS)
    gauges: list[tuple[GaugeMetricFamily, Callable[[JobStats], float | None]]] = [
        (GaugeMetricFamily("gpuwatch_train_step_seconds",
                           "Mean step time over the hook's last report.", labels=TRAIN_LABELS),
         lambda j: j.step_seconds),
        (GaugeMetricFamily("gpuwatch_train_data_wait_ratio",
                           "Share of step time blocked on the DataLoader.", labels=TRAIN_LABELS),
         lambda j: j.data_wait_ratio),
        (GaugeMetricFamily("gpuwatch_train_loss_scale", "GradScaler loss scale.",
                           labels=TRAIN_LABELS), lambda j: j.loss_scale),
        (GaugeMetricFamily("gpuwatch_train_samples_per_second", "Training throughput.",
                           labels=TRAIN_LABELS), lambda j: j.samples_per_second),
        (GaugeMetricFamily("gpuwatch_train_memory_allocated_bytes",
                           "torch allocator: memory allocated.", labels=TRAIN_LABELS),
         lambda j: j.mem_allocated_bytes),
        (GaugeMetricFamily("gpuwatch_train_memory_reserved_bytes",
                           "torch allocator: memory reserved.", labels=TRAIN_LABELS),
         lambda j: j.mem_reserved_bytes),
        (GaugeMetricFamily("gpuwatch_train_memory_max_allocated_bytes",
                           "torch allocator: peak memory allocated.", labels=TRAIN_LABELS),
         lambda j: j.max_mem_allocated_bytes),
        (GaugeMetricFamily("gpuwatch_train_up", "1 while the job reports, 0 after it died.",
                           labels=TRAIN_LABELS), lambda j: 1 if j.alive else 0),
        (GaugeMetricFamily("gpuwatch_train_hook_measuring",
                           "1 while the job's hook measures, 0 once it stopped itself after "
                           "errors of its own (its problems say why).", labels=TRAIN_LABELS),
         lambda j: 0 if j.hook_state == "off" else 1),
    ]
    problems = CounterMetricFamily("gpuwatch_train_hook_problems",
                                   "Distinct problems the job's hook reported (a setting it "
                                   "could not read, an error of its own).", labels=TRAIN_LABELS)
    phase_labels = [*TRAIN_LABELS, "phase"]
    phase_seconds = CounterMetricFamily(
        "gpuwatch_train_phase_seconds", "Seconds the job spent in each phase: startup, "
        "compile, train, eval, checkpoint, inference.", labels=phase_labels)
    phase_now = GaugeMetricFamily("gpuwatch_train_phase",
                                  "1 for the phase the job is in now, 0 for the others.",
                                  labels=phase_labels)
    for j in snap.jobs:
        labels = [str(j.pid), _label(j.rank), _label(j.gpu)]
        steps.add_metric(labels, float(j.steps_total))
        skipped.add_metric(labels, float(j.skipped_steps_total))
        problems.add_metric(labels, float(j.hook_problems))
        for fam, get in gauges:
            value = get(j)
            if value is not None:
                fam.add_metric(labels, float(value))
        if j.phase is not None:
            for phase in PHASES:
                phase_seconds.add_metric([*labels, phase],
                                         float(j.phase_seconds.get(phase, 0.0)))
                phase_now.add_metric([*labels, phase], 1.0 if phase == j.phase else 0.0)
    return [steps, skipped, problems, phase_seconds, phase_now] + [fam for fam, _ in gauges]


def time_share_families(jobs: Iterable[Mapping[str, Any]]) -> list[Metric]:
    """``gpuwatch_train_time_share_ratio{pid,rank,gpu,category}``: each job's (rank's) wall
    time split into data, sync, gpu, host and other (the advisor's attribution over its
    last window; docs/advice.md). The categories of one job sum to 1. Example::

        gpuwatch_train_time_share_ratio{category="data",gpu="0",pid="4242",rank="0"} 0.72
    """
    fam = GaugeMetricFamily("gpuwatch_train_time_share_ratio",
                            "Share of a training job's wall time by category (data, sync, gpu, "
                            "host, other; they sum to 1).", labels=[*TRAIN_LABELS, "category"])
    for j in jobs:
        shares = j.get("time_share") or {}
        base = [_label(j.get("pid")), _label(j.get("rank")), _label(j.get("gpu"))]
        for category, value in shares.items():
            if isinstance(value, (int, float)):
                fam.add_metric([*base, str(category)], float(value))
    return [fam]


def _self_families(snap: Snapshot | None, collect_errors: dict[str, int]) -> list[Metric]:
    up = GaugeMetricFamily("gpuwatch_up", "1 while the gpuwatch daemon serves metrics.")
    up.add_metric([], 1)
    build = GaugeMetricFamily("gpuwatch_build_info", "gpuwatch's version (value is always 1).",
                              labels=["version"])
    build.add_metric([__version__], 1)
    out: list[Metric] = [up, build]
    errors = CounterMetricFamily("gpuwatch_errors", "Errors by source (a source failing "
                                 "costs its own readings only).", labels=["source"])
    merged = dict.fromkeys(ERROR_SOURCES, 0)
    if snap is not None:
        for index in sorted({i.gpu for i in snap.infos} | {g.gpu for g in snap.gpus}):
            merged.update(dict.fromkeys((f.format(index) for f in GPU_ERROR_SOURCES), 0))
    for source, count in collect_errors.items():
        merged[source] = merged.get(source, 0) + count
    health = snap.health if snap is not None else None
    if health is not None:
        for source, count in health.errors_total.items():
            merged[source] = merged.get(source, 0) + count
    for source, count in sorted(merged.items()):
        errors.add_metric([source], float(count))
    out.append(errors)
    # the hook's counters from the start too, every drop reason at 0
    hook = CounterMetricFamily("gpuwatch_hook_messages", "Datagrams accepted from the hook.")
    hook.add_metric([], float(health.hook_messages_total if health is not None else 0))
    dropped = CounterMetricFamily("gpuwatch_hook_messages_dropped",
                                  "Datagrams from the hook that were rejected, by reason.",
                                  labels=["reason"])
    drops = dict.fromkeys(DROP_REASONS, 0)
    if health is not None:
        drops.update(health.hook_messages_dropped_total)
    for reason, count in sorted(drops.items()):
        dropped.add_metric([reason], float(count))
    out += [hook, dropped]
    # before the first tick there is nothing to say about NVML or ticks yet
    if snap is None or snap.t == 0.0 or health is None:
        return out
    nvml = GaugeMetricFamily("gpuwatch_nvml_up", "1 when NVML initialised, 0 without it.")
    nvml.add_metric([], 1 if snap.nvml_available else 0)
    ticks = CounterMetricFamily("gpuwatch_ticks", "Sampling ticks completed.")
    ticks.add_metric([], float(health.ticks_total))
    out += [nvml, ticks]
    if health.tick_seconds is not None:
        dur = GaugeMetricFamily("gpuwatch_tick_duration_seconds", "Duration of the last tick.")
        dur.add_metric([], float(health.tick_seconds))
        out.append(dur)
    if health.last_success_time is not None:
        last = GaugeMetricFamily("gpuwatch_last_success_timestamp_seconds",
                                 "When the last tick completed, Unix seconds.")
        last.add_metric([], float(health.last_success_time))
        out.append(last)
    return out
