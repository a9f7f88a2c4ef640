"""On a real GPU: the daemon beside a small torch training job (skipped without a GPU).

Run on the lent machine with the workload at hand:
    GPUWATCH_WORKLOAD=.dev/workload.py python3 -m pytest tests/test_gpu_daemon.py -m gpu -s -q
It prints every series it saw, for the issue note.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROMTOOL, REPO, http_get, names_of, wait_for

pytestmark = pytest.mark.gpu

# what every H100/H200 reports (docs/metrics.md); the slow tier arrives within slow_interval
PER_GPU = (
    "gpuwatch_gpu_info", "gpuwatch_gpu_up", "gpuwatch_gpu_utilization_ratio",
    "gpuwatch_gpu_memory_utilization_ratio", "gpuwatch_gpu_memory_used_bytes",
    "gpuwatch_gpu_memory_total_bytes", "gpuwatch_gpu_power_watts",
    "gpuwatch_gpu_power_limit_watts", "gpuwatch_gpu_energy_joules_total",
    "gpuwatch_gpu_temperature_celsius", "gpuwatch_gpu_sm_clock_hertz",
    "gpuwatch_gpu_memory_clock_hertz", "gpuwatch_gpu_pstate", "gpuwatch_gpu_clock_event_reason",
    "gpuwatch_gpu_pcie_transmit_bytes_per_second", "gpuwatch_gpu_pcie_receive_bytes_per_second",
    "gpuwatch_gpu_pcie_replays_total", "gpuwatch_gpu_ecc_errors_total",
    "gpuwatch_gpu_remapped_rows", "gpuwatch_gpu_remapped_rows_pending",
    "gpuwatch_gpu_remapped_rows_failure",
)
GPM = ("gpuwatch_gpu_sm_active_ratio", "gpuwatch_gpu_sm_occupancy_ratio",
       "gpuwatch_gpu_tensor_active_ratio", "gpuwatch_gpu_dram_active_ratio",
       "gpuwatch_gpu_fp16_active_ratio", "gpuwatch_gpu_fp32_active_ratio")
OTHERS = (
    "gpuwatch_process_gpu_memory_used_bytes", "gpuwatch_host_cpu_utilization_ratio",
    "gpuwatch_host_cpu_core_utilization_ratio", "gpuwatch_host_load1",
    "gpuwatch_host_memory_used_bytes", "gpuwatch_host_memory_total_bytes",
    "gpuwatch_job_cpu_cores", "gpuwatch_job_processes", "gpuwatch_job_rss_bytes",
    "gpuwatch_up", "gpuwatch_nvml_up", "gpuwatch_ticks_total",
    "gpuwatch_tick_duration_seconds", "gpuwatch_last_success_timestamp_seconds",
)


def _workload() -> Path:
    path = os.environ.get("GPUWATCH_WORKLOAD")
    if not path:
        pytest.skip("set GPUWATCH_WORKLOAD to the path of workload.py")
    p = Path(path)
    if not p.is_absolute():
        p = REPO / p
    if not p.is_file():
        pytest.fail(f"GPUWATCH_WORKLOAD={path}: no such file")
    return p


def _values(samples: dict, name: str) -> list[tuple[dict, float]]:
    return [(dict(labels), v) for (n, labels), v in samples.items() if n == name]


def _one(samples: dict, name: str, **labels: str) -> float:
    found = [v for lab, v in _values(samples, name)
             if all(lab.get(k) == val for k, val in labels.items())]
    assert found, f"no {name}{labels}"
    return found[0]


def test_daemon_beside_a_training_job(gpuwatch_daemon, tmp_path):
    workload = _workload()
    job_log = tmp_path / "workload.log"
    with open(job_log, "w") as log_file:  # a file, so a chatty job never blocks on a pipe
        job = subprocess.Popen([sys.executable, str(workload), "--seconds", "60", "--batch",
                                "64", "--workers", "2", "--precision", "bf16"],
                               stdout=subprocess.DEVNULL, stderr=log_file, cwd=tmp_path)
    try:
        d = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0", "--interval", "0.5")
        pid = str(job.pid)
        want = set(PER_GPU) | set(OTHERS)

        def loaded():
            m = d.metrics()
            busy = any(v > 0 for _, v in _values(m, "gpuwatch_gpu_utilization_ratio"))
            mine = any(lab.get("pid") == pid
                       for lab, _ in _values(m, "gpuwatch_process_gpu_memory_used_bytes"))
            # the job's tree: its main process and its two DataLoader workers
            tree = any(lab.get("pid") == pid and v >= 3
                       for lab, v in _values(m, "gpuwatch_job_processes"))
            return m if busy and mine and tree and want <= names_of(m) else None

        try:
            m = wait_for(loaded, "GPU load, the job's process series and every family",
                         timeout=120, proc=d.proc)
        except AssertionError:
            m = d.metrics()
            _print(m)
            missing = sorted(want - names_of(m))
            raise AssertionError(f"missing: {missing}; job pid {pid}; job stderr: "
                                 f"{job_log.read_text()[-2000:]}; daemon stderr:\n{d.stderr()}") from None
        _print(m)
        info = _values(m, "gpuwatch_gpu_info")
        assert info, "no gpuwatch_gpu_info"
        for lab, _ in info:
            gpu = lab["gpu"]
            assert _one(m, "gpuwatch_gpu_up", gpu=gpu) == 1
            assert 0 <= _one(m, "gpuwatch_gpu_utilization_ratio", gpu=gpu) <= 1
            used = _one(m, "gpuwatch_gpu_memory_used_bytes", gpu=gpu)
            total = _one(m, "gpuwatch_gpu_memory_total_bytes", gpu=gpu)
            assert 0 < used <= total
            assert _one(m, "gpuwatch_gpu_power_watts", gpu=gpu) > 0
            assert 0 < _one(m, "gpuwatch_gpu_power_limit_watts", gpu=gpu) < 2000
            assert 10 < _one(m, "gpuwatch_gpu_temperature_celsius", gpu=gpu) < 110
            assert 1e8 < _one(m, "gpuwatch_gpu_sm_clock_hertz", gpu=gpu) < 5e9
            assert 0 <= _one(m, "gpuwatch_gpu_pstate", gpu=gpu) <= 15
            reasons = {r["reason"] for r, _ in _values(m, "gpuwatch_gpu_clock_event_reason")
                       if r["gpu"] == gpu}
            assert len(reasons) == 9
            major = int(lab["compute_capability"].split(".")[0])
            if major >= 9:
                for name in GPM:
                    assert 0 <= _one(m, name, gpu=gpu) <= 1, name
        assert max(v for _, v in _values(m, "gpuwatch_gpu_utilization_ratio")) > 0
        mem = [v for lab, v in _values(m, "gpuwatch_process_gpu_memory_used_bytes")
               if lab["pid"] == pid]
        assert mem and mem[0] > 0
        assert _one(m, "gpuwatch_nvml_up") == 1
        assert _one(m, "gpuwatch_job_processes", pid=pid) >= 3
        assert _one(m, "gpuwatch_job_rss_bytes", pid=pid) > 0
        if PROMTOOL:
            lint = subprocess.run([PROMTOOL, "check", "metrics"],
                                  input=http_get(d.url + "/metrics")[2], capture_output=True,
                                  text=True, timeout=60, check=False)
            print("promtool check metrics:", lint.returncode, lint.stdout, lint.stderr)
            assert lint.returncode == 0 and not lint.stdout.strip()
        assert d.stop() == 0
    finally:
        job.terminate()
        try:
            job.wait(30)
        except subprocess.TimeoutExpired:
            job.kill()


def _print(m: dict) -> None:
    print("\n--- series seen by gpuwatch on this GPU ---")
    for (name, labels), value in sorted(m.items(), key=lambda kv: (kv[0][0], sorted(kv[0][1]))):
        if name == "gpuwatch_host_cpu_core_utilization_ratio":
            continue  # one per core: too many to paste
        lab = ",".join(f'{k}="{v}"' for k, v in sorted(labels))
        print(f"{name}{{{lab}}} {value:g}")
