"""The exporter read back from a fresh registry, over fixture snapshots."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from gpuwatch.samples import (
    GpuInfo,
    GpuProcess,
    GpuSample,
    Health,
    HostSample,
    JobStats,
    JobTree,
    Snapshot,
)
from gpuwatch.serve.exporter import CLOCK_EVENT_REASONS, GpuwatchCollector

DOCS = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
UUID0 = "GPU-00000000-1111-2222-3333-444444444444"
UUID1 = "GPU-99999999-1111-2222-3333-444444444444"


def registry_for(snapshot: Snapshot, extra: tuple = ()) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(GpuwatchCollector(lambda: snapshot, extra=extra))
    return registry


def busy_gpu(**over: object) -> GpuSample:
    return GpuSample(**{**_busy_defaults(), **over})


def _busy(**fields: object) -> dict[str, object]:
    return fields


def _busy_defaults() -> dict[str, object]:
    return _busy(
        t=100.0, gpu=0, uuid=UUID0, util=0.97, mem_util=0.41, mem_used_bytes=12 * 2**30,
        mem_total_bytes=80 * 2**30, power_watts=612.5, power_limit_watts=700.0,
        temp_celsius=61.0, sm_clock_mhz=1980.0, mem_clock_mhz=2619.0, pstate=0,
        clock_event_reasons=0x4 | 0x20, energy_joules=123456.0, pcie_replay_total=3,
        ecc_corrected_total=2, ecc_uncorrected_total=0, remapped_rows_correctable=1,
        remapped_rows_uncorrectable=0, remapped_rows_pending=False, remapped_rows_failure=False,
        sm_active=0.89, sm_occupancy=0.31, tensor_active=0.42, dram_active=0.37,
        fp16_active=0.0, fp32_active=0.05,
        processes=(GpuProcess(pid=4242, mem_used_bytes=11 * 2**30, sm_util=0.9,
                              name="python3", user="alice"),),
        xid_total={79: 1},
    )


def info(gpu: int, uuid: str) -> GpuInfo:
    return GpuInfo(gpu=gpu, uuid=uuid, name="NVIDIA H100 80GB HBM3", driver_version="580.1",
                   compute_capability=(9, 0), pci_bus_id=f"00000000:0{gpu}:00.0")


def g0(labels: dict[str, str] | None = None) -> dict[str, str]:
    return {"gpu": "0", "uuid": UUID0, **(labels or {})}


def test_gpu_fields_are_exported_in_base_units():
    snap = Snapshot(t=100.0, gpus=(busy_gpu(),), infos=(info(0, UUID0),))
    r = registry_for(snap)
    assert r.get_sample_value("gpuwatch_gpu_utilization_ratio", g0()) == pytest.approx(0.97)
    assert r.get_sample_value("gpuwatch_gpu_memory_used_bytes", g0()) == 12 * 2**30
    assert r.get_sample_value("gpuwatch_gpu_memory_total_bytes", g0()) == 80 * 2**30
    assert r.get_sample_value("gpuwatch_gpu_sm_clock_hertz", g0()) == pytest.approx(1.98e9)
    assert r.get_sample_value("gpuwatch_gpu_memory_clock_hertz", g0()) == pytest.approx(2.619e9)
    assert r.get_sample_value("gpuwatch_gpu_power_watts", g0()) == pytest.approx(612.5)
    assert r.get_sample_value("gpuwatch_gpu_energy_joules_total", g0()) == 123456.0
    assert r.get_sample_value("gpuwatch_gpu_sm_active_ratio", g0()) == pytest.approx(0.89)
    assert r.get_sample_value("gpuwatch_gpu_tensor_active_ratio", g0()) == pytest.approx(0.42)
    assert r.get_sample_value("gpuwatch_gpu_pcie_replays_total", g0()) == 3
    assert r.get_sample_value("gpuwatch_gpu_ecc_errors_total", g0({"type": "corrected"})) == 2
    assert r.get_sample_value("gpuwatch_gpu_remapped_rows",
                              g0({"type": "correctable"})) == 1
    assert r.get_sample_value("gpuwatch_gpu_remapped_rows_pending", g0()) == 0
    assert r.get_sample_value("gpuwatch_gpu_xid_errors_total", g0({"xid": "79"})) == 1
    assert r.get_sample_value("gpuwatch_gpu_up", g0()) == 1
    assert r.get_sample_value("gpuwatch_gpu_info", g0({
        "name": "NVIDIA H100 80GB HBM3", "driver_version": "580.1",
        "compute_capability": "9.0", "pci_bus_id": "00000000:00:00.0"})) == 1


def test_clock_event_bitmask_becomes_one_series_per_reason():
    # bits 0x4 (sw_power_cap) and 0x20 (sw_thermal_slowdown) set; 0x1000 is a bit
    # newer drivers may add: it must not break the known ones
    snap = Snapshot(t=1.0, gpus=(busy_gpu(clock_event_reasons=0x4 | 0x20 | 0x1000),))
    r = registry_for(snap)
    seen = {reason: r.get_sample_value("gpuwatch_gpu_clock_event_reason", g0({"reason": reason}))
            for reason, _ in CLOCK_EVENT_REASONS}
    assert seen == {
        "gpu_idle": 0, "applications_clocks_setting": 0, "sw_power_cap": 1, "hw_slowdown": 0,
        "sync_boost": 0, "sw_thermal_slowdown": 1, "hw_thermal_slowdown": 0,
        "hw_power_brake_slowdown": 0, "display_clock_setting": 0,
    }


def test_clock_event_reason_bits_match_nvml():
    pynvml = pytest.importorskip("pynvml")
    names = {"gpu_idle": "GpuIdle", "applications_clocks_setting": "ApplicationsClocksSetting",
             "sw_power_cap": "SwPowerCap", "hw_slowdown": "HwSlowdown",
             "sync_boost": "SyncBoost", "sw_thermal_slowdown": "SwThermalSlowdown",
             "hw_thermal_slowdown": "HwThermalSlowdown",
             "hw_power_brake_slowdown": "HwPowerBrakeSlowdown",
             "display_clock_setting": "DisplayClockSetting"}
    for reason, bit in CLOCK_EVENT_REASONS:
        assert getattr(pynvml, f"nvmlClocksEventReason{names[reason]}") == bit, reason


def test_unmeasured_fields_have_no_series_rather_than_zero():
    sparse = GpuSample(t=1.0, gpu=0, uuid=UUID0, util=0.5)
    r = registry_for(Snapshot(t=1.0, gpus=(sparse,)))
    assert r.get_sample_value("gpuwatch_gpu_utilization_ratio", g0()) == 0.5
    for name in ("gpuwatch_gpu_power_watts", "gpuwatch_gpu_sm_active_ratio",
                 "gpuwatch_gpu_temperature_celsius", "gpuwatch_gpu_energy_joules_total",
                 "gpuwatch_gpu_pcie_replays_total"):
        assert r.get_sample_value(name, g0()) is None, name
    assert r.get_sample_value("gpuwatch_gpu_clock_event_reason",
                              g0({"reason": "gpu_idle"})) is None
    text = generate_latest(r).decode()
    # a family with nothing to say has no sample line, only its HELP/TYPE declaration
    assert "\ngpuwatch_gpu_power_watts" not in text
    assert "# HELP gpuwatch_gpu_power_watts " in text
    assert "gpuwatch_gpu_utilization_ratio{" in text


def test_lost_gpu_reports_down_and_keeps_the_healthy_one():
    lost = GpuSample(t=1.0, gpu=1, uuid=UUID1, lost=True, xid_total={79: 2})
    snap = Snapshot(t=1.0, gpus=(busy_gpu(), lost), infos=(info(0, UUID0), info(1, UUID1)))
    r = registry_for(snap)
    g1 = {"gpu": "1", "uuid": UUID1}
    assert r.get_sample_value("gpuwatch_gpu_up", g1) == 0
    assert r.get_sample_value("gpuwatch_gpu_up", g0()) == 1
    assert r.get_sample_value("gpuwatch_gpu_utilization_ratio", g1) is None
    assert r.get_sample_value("gpuwatch_gpu_utilization_ratio", g0()) == pytest.approx(0.97)
    # the XID that took it down stays visible
    assert r.get_sample_value("gpuwatch_gpu_xid_errors_total", {**g1, "xid": "79"}) == 2
    assert r.get_sample_value("gpuwatch_gpu_info", {
        **g1, "name": "NVIDIA H100 80GB HBM3", "driver_version": "580.1",
        "compute_capability": "9.0", "pci_bus_id": "00000000:01:00.0"}) == 1


def test_known_gpu_without_a_sample_is_down():
    r = registry_for(Snapshot(t=1.0, gpus=(), infos=(info(0, UUID0),)))
    assert r.get_sample_value("gpuwatch_gpu_up", g0()) == 0


def test_exited_process_simply_disappears():
    procs = (GpuProcess(pid=10, mem_used_bytes=1000, name="a", user="u"),
             GpuProcess(pid=11, mem_used_bytes=2000, name="b", user="u"))
    current = [Snapshot(t=1.0, gpus=(busy_gpu(processes=procs),))]
    registry = CollectorRegistry()
    registry.register(GpuwatchCollector(lambda: current[0]))
    lab = {"gpu": "0", "uuid": UUID0, "name": "a", "user": "u", "pid": "10"}
    lab11 = {**lab, "pid": "11", "name": "b"}
    assert registry.get_sample_value("gpuwatch_process_gpu_memory_used_bytes", lab) == 1000
    assert registry.get_sample_value("gpuwatch_process_gpu_memory_used_bytes", lab11) == 2000
    current[0] = Snapshot(t=2.0, gpus=(busy_gpu(processes=procs[1:]),))
    assert registry.get_sample_value("gpuwatch_process_gpu_memory_used_bytes", lab) is None
    assert registry.get_sample_value("gpuwatch_process_gpu_memory_used_bytes", lab11) == 2000


def test_host_and_job_trees():
    host = HostSample(t=1.0, cpu_util_per_core=(0.5, 1.0), cpu_util=0.75, load1=1.5, load5=1.0,
                      load15=0.5, mem_used_bytes=10, mem_total_bytes=100, swap_used_bytes=0,
                      swap_total_bytes=50,
                      jobs=(JobTree(pid=4242, name="python3", user="alice", cpu_cores=1.6,
                                    main_cpu_cores=1.0, workers_cpu_cores=0.6, processes=5,
                                    rss_bytes=999),))
    r = registry_for(Snapshot(t=1.0, host=host))
    assert r.get_sample_value("gpuwatch_host_cpu_utilization_ratio") == 0.75
    assert r.get_sample_value("gpuwatch_host_cpu_core_utilization_ratio", {"core": "1"}) == 1.0
    assert r.get_sample_value("gpuwatch_host_load5") == 1.0
    assert r.get_sample_value("gpuwatch_host_swap_total_bytes") == 50
    job = {"pid": "4242", "name": "python3", "user": "alice"}
    assert r.get_sample_value("gpuwatch_job_cpu_cores", job) == pytest.approx(1.6)
    assert r.get_sample_value("gpuwatch_job_workers_cpu_cores", job) == pytest.approx(0.6)
    assert r.get_sample_value("gpuwatch_job_processes", job) == 5


def test_recording_style_host_sample_exports_mean_cpu_and_job_sums():
    # a trace's host line has per-core values and job sums only
    host = HostSample(t=1.0, cpu_util_per_core=(0.0, 1.0, 0.5, 0.5), job_cpu_cores=0.95,
                      job_processes=1, job_rss_bytes=34852864)
    r = registry_for(Snapshot(t=1.0, host=host))
    assert r.get_sample_value("gpuwatch_host_cpu_utilization_ratio") == 0.5
    empty = {"pid": "", "name": "", "user": ""}
    assert r.get_sample_value("gpuwatch_job_cpu_cores", empty) == pytest.approx(0.95)
    assert r.get_sample_value("gpuwatch_job_main_cpu_cores", empty) is None
    assert r.get_sample_value("gpuwatch_host_load5") is None


def test_training_jobs_from_the_hook():
    jobs = (JobStats(pid=7, rank=0, gpu=0, steps_total=120, skipped_steps_total=2,
                     step_seconds=0.039, data_wait_ratio=0.01, loss_scale=65536.0,
                     samples_per_second=1640.0, mem_allocated_bytes=5, alive=True),
            JobStats(pid=8, rank=None, gpu=None, steps_total=3, alive=False))
    r = registry_for(Snapshot(t=1.0, jobs=jobs))
    j7 = {"pid": "7", "rank": "0", "gpu": "0"}
    j8 = {"pid": "8", "rank": "", "gpu": ""}
    assert r.get_sample_value("gpuwatch_train_steps_total", j7) == 120
    assert r.get_sample_value("gpuwatch_train_skipped_steps_total", j7) == 2
    assert r.get_sample_value("gpuwatch_train_step_seconds", j7) == pytest.approx(0.039)
    assert r.get_sample_value("gpuwatch_train_up", j7) == 1
    assert r.get_sample_value("gpuwatch_train_up", j8) == 0
    assert r.get_sample_value("gpuwatch_train_loss_scale", j8) is None


def test_self_health():
    health = Health(ticks_total=42, tick_seconds=0.003, errors_total={"nvml": 3},
                    last_success_time=1234.5, hook_messages_total=9,
                    hook_messages_dropped_total={"malformed": 2})
    r = registry_for(Snapshot(t=1.0, health=health, nvml_available=False))
    assert r.get_sample_value("gpuwatch_up") == 1
    assert r.get_sample_value("gpuwatch_nvml_up") == 0
    assert r.get_sample_value("gpuwatch_ticks_total") == 42
    assert r.get_sample_value("gpuwatch_tick_duration_seconds") == 0.003
    assert r.get_sample_value("gpuwatch_errors_total", {"source": "nvml"}) == 3
    assert r.get_sample_value("gpuwatch_last_success_timestamp_seconds") == 1234.5
    assert r.get_sample_value("gpuwatch_hook_messages_total") == 9
    assert r.get_sample_value("gpuwatch_hook_messages_dropped_total",
                              {"reason": "malformed"}) == 2


def test_before_the_first_tick_only_liveness_is_claimed():
    r = registry_for(Snapshot(t=0.0))
    assert r.get_sample_value("gpuwatch_up") == 1
    assert r.get_sample_value("gpuwatch_nvml_up") is None
    assert r.get_sample_value("gpuwatch_ticks_total") is None


class _Broken:
    def collect(self):
        raise RuntimeError("advisor exploded")


class Advice:
    """What the live advisor's collector adds: active advice and the time attribution."""

    def collect(self):
        from gpuwatch.serve.exporter import time_share_families

        fam = GaugeMetricFamily("gpuwatch_advice_active", "x", labels=["rule", "gpu", "severity"])
        fam.add_metric(["small_batch", "0", "warning"], 1)
        yield fam
        yield from time_share_families([{"pid": 7, "rank": 0, "gpu": 0, "time_share": {
            "data": 0.5, "sync": 0.0, "gpu": 0.3, "host": 0.1, "other": 0.1}}])


def test_extra_collectors_join_the_scrape_and_fail_soft():
    snap = Snapshot(t=1.0, gpus=(busy_gpu(),))
    r = registry_for(snap, extra=(_Broken(), Advice()))
    # each failed scrape counts once
    assert r.get_sample_value("gpuwatch_errors_total", {"source": "collector__Broken"}) == 1
    assert r.get_sample_value("gpuwatch_errors_total", {"source": "collector__Broken"}) == 2
    assert r.get_sample_value("gpuwatch_advice_active", {
        "rule": "small_batch", "gpu": "0", "severity": "warning"}) == 1
    assert r.get_sample_value("gpuwatch_gpu_utilization_ratio", g0()) == pytest.approx(0.97)


def test_a_failing_snapshot_source_still_serves_self_health():
    def boom() -> Snapshot:
        raise OSError("gone")

    registry = CollectorRegistry()
    registry.register(GpuwatchCollector(boom))
    assert registry.get_sample_value("gpuwatch_errors_total", {"source": "snapshot"}) == 1
    assert registry.get_sample_value("gpuwatch_up") == 1


def test_a_malformed_sample_costs_its_part_only():
    # a source that put junk in a field (a str where a number belongs)
    bad = busy_gpu(util="not a number")
    host = HostSample(t=1.0, cpu_util=0.25)
    r = registry_for(Snapshot(t=1.0, gpus=(bad,), host=host))
    assert r.get_sample_value("gpuwatch_errors_total", {"source": "export_gpu"}) == 1
    assert r.get_sample_value("gpuwatch_gpu_utilization_ratio", g0()) is None
    assert r.get_sample_value("gpuwatch_host_cpu_utilization_ratio") == 0.25


def _documented_names() -> set[str]:
    names = set()
    for line in DOCS.read_text().splitlines():
        if line.startswith("|"):
            first_cell = line.split("|")[1]
            names.update(re.findall(r"`(gpuwatch_[a-z0-9_]+)", first_cell))
    return names


def full_snapshot() -> Snapshot:
    """A snapshot with every field set: every family the exporter has."""
    jobs = (JobStats(pid=7, rank=0, gpu=0, steps_total=1, skipped_steps_total=0,
                     step_seconds=0.1, data_wait_ratio=0.1, loss_scale=1.0,
                     samples_per_second=1.0, mem_allocated_bytes=1, mem_reserved_bytes=1,
                     max_mem_allocated_bytes=1),)
    host = HostSample(t=1.0, cpu_util_per_core=(0.1,), cpu_util=0.1, load1=1, load5=1,
                      load15=1, mem_used_bytes=1, mem_total_bytes=2, swap_used_bytes=0,
                      swap_total_bytes=1, jobs=(JobTree(pid=1),))
    health = Health(ticks_total=1, tick_seconds=0.1, errors_total={"x": 1},
                    last_success_time=1.0, hook_messages_dropped_total={"malformed": 1})
    full = busy_gpu(pcie_tx_bytes_per_second=1.0, pcie_rx_bytes_per_second=1.0,
                    fp64_active=0.0, remapped_rows_failure=True)
    return Snapshot(t=1.0, gpus=(full,), infos=(info(0, UUID0),), host=host, jobs=jobs,
                    health=health)


def test_every_exported_family_is_documented_and_vice_versa():
    snap = full_snapshot()
    r = registry_for(snap, extra=(Advice(),))
    exported = {m.name + ("_total" if m.type == "counter" else "") for m in r.collect()}
    documented = _documented_names()
    # the advisor documents gpuwatch_advice_start_timestamp_seconds; it is not ours to emit
    assert exported - documented == set()
    assert documented - exported == {"gpuwatch_advice_start_timestamp_seconds"}


def test_every_documented_family_is_declared_before_its_first_sample():
    # dashboards and rules are checked against the exporter's declarations, so a family
    # has its HELP/TYPE lines from the first scrape, before any GPU, job or tick
    registry = CollectorRegistry()
    registry.register(GpuwatchCollector(lambda: Snapshot(t=0.0)))
    text = generate_latest(registry).decode()
    declared = set(re.findall(r"^# HELP (gpuwatch_[a-z0-9_]+) ", text, re.M))
    advisor = {"gpuwatch_advice_active", "gpuwatch_advice_start_timestamp_seconds",
               "gpuwatch_train_time_share_ratio"}  # the live advisor's collector declares it
    assert _documented_names() - advisor - declared == set()
    # declared once each, and no sample was invented for the GPU that isn't there
    assert len(re.findall(r"^# HELP ", text, re.M)) == len(declared)
    assert not re.search(r"^gpuwatch_gpu_", text, re.M)
