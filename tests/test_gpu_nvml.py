"""The real sampler on a real NVIDIA GPU (the lent H100/H200); skipped where NVML has none.

    python3 -m pytest -m gpu tests/test_gpu_nvml.py

Each field is checked against what NVML itself answers: a field the sampler leaves empty
must be one the driver refuses, and a field it fills must be sane.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpuwatch.collect.sampler import Sampler
from gpuwatch.samples import HostSample
from gpuwatch.store import Store


def _gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver: no GPU here
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_gpu_count() == 0, reason="needs an NVIDIA GPU with a working driver"),
]


class NullHost:
    def sample(self, t: float, gpu_pids: Any, mains: Any = ()) -> HostSample:
        return HostSample(t=t)


def answers(fn: Callable[[], Any]) -> bool:
    """Whether NVML gives this value on this card (so the sampler must too)."""
    import pynvml

    try:
        fn()
    except pynvml.NVMLError:
        return False
    return True


@pytest.fixture
def sampler():
    # the energy counter on every 2nd slow round: the rounds between carry its value
    s = Sampler(Store(), interval=0.2, slow_interval=1.0, energy_interval=2.0, host=NullHost())
    yield s
    s.stop()


@pytest.fixture
def nv():
    import pynvml

    pynvml.nvmlInit()
    yield pynvml
    pynvml.nvmlShutdown()


def test_info_is_filled(sampler, nv) -> None:
    assert sampler.nvml_available
    assert len(sampler.infos) == nv.nvmlDeviceGetCount()
    for info in sampler.infos:
        h = nv.nvmlDeviceGetHandleByIndex(info.gpu)
        assert info.name and info.name == nv.nvmlDeviceGetName(h)
        assert info.uuid and info.uuid.startswith("GPU-")
        assert info.driver_version == nv.nvmlSystemGetDriverVersion()
        assert info.compute_capability == tuple(nv.nvmlDeviceGetCudaComputeCapability(h))
        assert info.pci_bus_id and ":" in info.pci_bus_id
        assert info.mem_total_bytes and info.mem_total_bytes > 2**30
        if info.compute_capability >= (9, 0):
            assert info.gpm_supported, "Hopper and newer have GPM"


def test_cheap_fields_present_and_sane(sampler, nv) -> None:
    sampler.tick()
    time.sleep(0.2)
    snap = sampler.tick()
    assert snap.nvml_available and len(snap.gpus) == len(sampler.infos)
    assert snap.health.errors_total == {}
    for g in snap.gpus:
        h = nv.nvmlDeviceGetHandleByIndex(g.gpu)
        assert not g.lost and g.uuid == sampler.infos[g.gpu].uuid
        assert 0.0 <= g.util <= 1.0 and 0.0 <= g.mem_util <= 1.0
        assert 0 <= g.mem_used_bytes <= g.mem_total_bytes
        assert g.mem_total_bytes == sampler.infos[g.gpu].mem_total_bytes
        if answers(lambda h=h: nv.nvmlDeviceGetPowerUsage(h)):
            assert g.power_watts > 0
        if answers(lambda h=h: nv.nvmlDeviceGetEnforcedPowerLimit(h)):
            assert g.power_limit_watts > 0
        assert 0 < g.temp_celsius < 120
        assert g.sm_clock_mhz > 0 and g.mem_clock_mhz > 0
        assert 0 <= g.pstate <= 15
        assert g.clock_event_reasons is not None and g.clock_event_reasons >= 0
        assert isinstance(g.processes, tuple)


def test_gpm_fields_after_two_ticks_on_hopper(sampler) -> None:
    hopper = [i.gpu for i in sampler.infos if i.compute_capability >= (9, 0)]
    if not hopper:
        pytest.skip("GPM needs compute capability 9.0 or newer")
    sampler.tick()
    time.sleep(0.2)
    snap = sampler.tick()
    for g in (snap.gpus[i] for i in hopper):
        for name in ("sm_active", "sm_occupancy", "tensor_active", "fp16_active",
                     "fp32_active", "fp64_active"):
            value = getattr(g, name)
            assert value is not None and 0.0 <= value <= 1.0, name
        # NVML may answer NaN for DRAM on an idle card: then it is None, never out of range
        assert g.dram_active is None or 0.0 <= g.dram_active <= 1.0


def test_slow_fields_arrive_after_the_slow_cadence(sampler, nv) -> None:
    give_up = time.monotonic() + 15.0
    snap = sampler.tick()
    while time.monotonic() < give_up and snap.gpus[0].energy_joules is None:
        time.sleep(0.2)
        snap = sampler.tick()
    for g in snap.gpus:
        h = nv.nvmlDeviceGetHandleByIndex(g.gpu)
        if answers(lambda h=h: nv.nvmlDeviceGetTotalEnergyConsumption(h)):
            assert g.energy_joules is not None and g.energy_joules > 0
        if answers(lambda h=h: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES)):
            assert g.pcie_tx_bytes_per_second is not None and g.pcie_tx_bytes_per_second >= 0
            assert g.pcie_rx_bytes_per_second is not None and g.pcie_rx_bytes_per_second >= 0
        if answers(lambda h=h: nv.nvmlDeviceGetPcieReplayCounter(h)):
            assert g.pcie_replay_total is not None and g.pcie_replay_total >= 0
        if answers(lambda h=h: nv.nvmlDeviceGetTotalEccErrors(
                h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)):
            assert g.ecc_corrected_total is not None and g.ecc_uncorrected_total is not None
        if answers(lambda h=h: nv.nvmlDeviceGetRemappedRows(h)):
            assert g.remapped_rows_pending is not None
    # the energy counter only grows
    first = snap.gpus[0].energy_joules
    time.sleep(1.2)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        later = sampler.tick().gpus[0].energy_joules
        if later is not None and first is not None and later > first:
            break
        time.sleep(0.2)
    else:
        pytest.fail("energy did not advance over two slow reads")


_BUSY = textwrap.dedent("""
    import sys, time, torch
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    print("ready", flush=True)
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:
        y = x @ x
        torch.cuda.synchronize()
""")


def test_a_busy_job_shows_in_gpm_and_processes(sampler) -> None:
    """A bf16 matmul loop in a child: tensor pipes busy, the child listed on GPU 0."""
    probe = subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                           check=False, capture_output=True)
    if probe.returncode != 0:
        pytest.skip("no CUDA torch in this Python to make the GPU busy")
    if not sampler.infos[0].gpm_supported:
        pytest.skip("GPM not supported on GPU 0")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=sampler.infos[0].uuid or "0")
    child = subprocess.Popen([sys.executable, "-c", _BUSY, "20"], stdout=subprocess.PIPE,
                             env=env, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(1.5)  # NVML's utilization window is up to a second long
        sampler.tick()
        time.sleep(0.5)
        g = sampler.tick().gpus[0]
        assert g.sm_active is not None and g.sm_active > 0.3
        assert g.tensor_active is not None and g.tensor_active > 0.05
        assert g.util is not None and g.util > 0.5
        assert g.processes, "a process holding GPU memory is listed"
        ours = [p for p in g.processes if p.pid == child.pid]
        if ours:  # same pid namespace as the driver: name and user come from psutil
            assert ours[0].name and ours[0].name.startswith("python")
            assert ours[0].mem_used_bytes is None or ours[0].mem_used_bytes > 2**27
    finally:
        child.kill()
        child.wait()


def test_nvidia_smi_agrees_on_memory_total(sampler) -> None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi not installed")
    out = subprocess.run([smi, "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    totals = {int(i): int(mib) for i, mib in (line.split(",") for line in out.strip().splitlines())}
    snap = sampler.tick()
    for g in snap.gpus:
        # nvidia-smi prints MiB, rounded down
        assert abs(g.mem_total_bytes / 2**20 - totals[g.gpu]) <= 1
