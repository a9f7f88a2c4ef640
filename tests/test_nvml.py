"""The NVML layer on its own: how each NVML answer becomes a value, None or a lost GPU."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pynvml
import pytest

from gpuwatch.collect.nvml import GpuLost, Nvml, XidWatcher, handle_key
from tests.nvml_stub import NvmlStub, StubGpu


def open_nvml(stub: NvmlStub) -> tuple[Nvml, Counter[str]]:
    errors: Counter[str] = Counter()
    nvml = Nvml(stub, on_error=lambda source: errors.update([source]))
    assert nvml.open()
    return nvml, errors


def test_open_enumerates_gpus_and_a_gpu_without_a_handle_is_lost_from_the_start() -> None:
    stub = NvmlStub([StubGpu(0), StubGpu(1), StubGpu(2)])
    stub.gpus[1].lost = True
    nvml, errors = open_nvml(stub)
    assert [g.index for g in nvml.gpus] == [0, 1, 2]
    assert [g.lost for g in nvml.gpus] == [False, True, False]
    assert errors == {"gpu1_lost": 1}
    assert nvml.driver_version == "580.159.04"
    with pytest.raises(GpuLost):
        nvml.gpus[1].read_fast()
    assert nvml.gpus[2].read_fast()["util"] == 0.75


def test_open_without_a_driver_says_why_and_does_not_raise() -> None:
    nvml = Nvml(NvmlStub(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    assert not nvml.open()
    assert not nvml.available and nvml.gpus == ()
    assert "NVML Shared Library Not Found" in nvml.reason
    nvml.close()  # nothing to shut down: no error


def test_not_supported_and_no_permission_are_asked_once_not_found_every_time() -> None:
    me = 4242
    stub = NvmlStub([StubGpu(0, raises={
        "nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NOT_SUPPORTED,
        "nvmlDeviceGetComputeRunningProcesses_v3": pynvml.NVML_ERROR_NO_PERMISSION,
        "nvmlDeviceGetGraphicsRunningProcesses_v3": pynvml.NVML_ERROR_NO_PERMISSION,
        "nvmlDeviceGetComputeRunningProcesses_v2": pynvml.NVML_ERROR_NO_PERMISSION,
        "nvmlDeviceGetGraphicsRunningProcesses_v2": pynvml.NVML_ERROR_NO_PERMISSION,
    }, processes=[(me, 1)])])
    nvml, errors = open_nvml(stub)
    gpu = nvml.gpus[0]
    for _ in range(3):
        fields = gpu.read_fast()
        assert "power_watts" not in fields and fields["temp_celsius"] == 61.0
        # no permission for the versioned calls: the unversioned one still answers
        assert fields["processes"] == ((me, 1),)
        assert gpu.read_process_utilization() == {}  # NotFound: no samples yet
    assert stub.count("nvmlDeviceGetPowerUsage", 0) == 1
    assert stub.count("nvmlDeviceGetComputeRunningProcesses_v3", 0) == 1
    assert stub.count("nvmlDeviceGetComputeRunningProcesses", 0) == 3
    assert stub.count("nvmlDeviceGetProcessUtilization", 0) == 3  # asked again each time
    assert errors == {}


def test_an_unknown_error_costs_that_field_and_is_counted() -> None:
    stub = NvmlStub([StubGpu(0, failing={"nvmlDeviceGetClockInfo"})])
    nvml, errors = open_nvml(stub)
    fields = nvml.gpus[0].read_fast()
    assert "sm_clock_mhz" not in fields and "mem_clock_mhz" not in fields
    assert fields["util"] == 0.75
    assert errors == {"gpu0": 2}
    nvml.gpus[0].read_fast()
    assert stub.count("nvmlDeviceGetClockInfo", 0) == 4  # a transient error is retried
    assert not nvml.gpus[0].lost


def test_gpu_is_lost_raises_and_no_nvml_call_follows() -> None:
    stub = NvmlStub([StubGpu(0, lost_after=1)])
    nvml, errors = open_nvml(stub)
    gpu = nvml.gpus[0]
    gpu.read_fast()
    with pytest.raises(GpuLost):
        gpu.read_fast()
    asked = sum(stub.calls.values())
    with pytest.raises(GpuLost):
        gpu.read_slow()
    assert sum(stub.calls.values()) == asked
    assert gpu.lost and errors == {"gpu0_lost": 1}


def test_gpm_pairs_consecutive_samples_and_converts_percent_to_ratio() -> None:
    stub = NvmlStub([StubGpu(0, gpm_percent={
        pynvml.NVML_GPM_METRIC_SM_UTIL: 50.0,
        pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: float("nan"),
        pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 25.0,
    })])
    nvml, errors = open_nvml(stub)
    gpu = nvml.gpus[0]
    assert gpu.probe().gpm_supported
    assert "sm_active" not in gpu.read_fast()
    for _ in range(3):  # the stub refuses a pair that is not (older, newer) of this GPU
        fields = gpu.read_fast()
        assert fields["sm_active"] == 0.5 and fields["dram_active"] == 0.25
        assert "tensor_active" not in fields  # NaN
        assert "sm_occupancy" not in fields  # the driver did not give this metric
    assert stub.count("nvmlGpmSampleGet", 0) == 4  # one sample per read, no sleeping
    assert errors == {}
    nvml.close()
    assert stub.shutdowns == 1


def test_process_utilization_is_the_mean_of_new_samples_only() -> None:
    stub = NvmlStub([StubGpu(0, process_util=[(10, 30), (11, 80), (10, 50)])])
    nvml, _errors = open_nvml(stub)
    gpu = nvml.gpus[0]
    assert gpu.read_process_utilization() == {10: pytest.approx(0.4), 11: pytest.approx(0.8)}
    assert gpu.read_process_utilization() == {}  # nothing newer than what was read


def test_xid_watcher_polls_what_was_queued_and_frees_its_set_at_close() -> None:
    stub = NvmlStub([StubGpu(0), StubGpu(1, events=False)])
    nvml, errors = open_nvml(stub)
    watcher = XidWatcher(nvml)
    assert not stub.event_sets  # nothing asked of NVML before the first poll
    watcher.poll()  # the event set made, the GPUs that support events registered
    assert watcher.registered == (0,)
    assert stub.inject_xid(0, 13) and stub.inject_xid(0, 13) and stub.inject_xid(0, 79)
    assert not stub.inject_xid(1, 13)  # no event support: not registered
    assert watcher.totals(0) == {}  # queued by the driver until polled
    watcher.poll()
    assert watcher.totals(0) == {13: 2, 79: 1} and watcher.totals(1) == {}
    # more than one poll takes: the rest at the next
    for _ in range(XidWatcher.MAX_PER_POLL + 5):
        stub.inject_xid(0, 48)
    watcher.poll()
    assert watcher.totals(0)[48] == XidWatcher.MAX_PER_POLL
    watcher.poll()
    assert watcher.totals(0)[48] == XidWatcher.MAX_PER_POLL + 5
    # every poll is one wait of 0 ms: nothing blocks
    assert stub.calls[("nvmlEventSetWait_v2", None)] >= 3
    assert errors == {}
    nvml.close()  # the event set is freed before nvmlShutdown
    assert stub.event_sets[0].freed and stub.shutdowns == 1
    waits = stub.calls[("nvmlEventSetWait_v2", None)]
    watcher.poll()  # after close: nothing asked of NVML
    assert stub.calls[("nvmlEventSetWait_v2", None)] == waits


def test_xid_watcher_gives_up_on_a_wait_that_keeps_failing() -> None:
    stub = NvmlStub([StubGpu(0)])
    nvml, errors = open_nvml(stub)
    watcher = XidWatcher(nvml)
    watcher.poll()
    stub.event_wait_error = pynvml.NVML_ERROR_UNKNOWN
    for _ in range(XidWatcher.GIVE_UP_AFTER + 5):
        watcher.poll()
    assert errors == {"xid": XidWatcher.GIVE_UP_AFTER}  # then no more asked
    stub.event_wait_error = None
    stub.inject_xid(0, 13)
    watcher.poll()
    assert watcher.totals(0) == {}


def test_xid_watcher_without_event_support_asks_nothing_more() -> None:
    stub = NvmlStub([StubGpu(0, events=False)])
    nvml, errors = open_nvml(stub)
    watcher = XidWatcher(nvml)
    for _ in range(3):
        watcher.poll()
    assert watcher.registered == () and errors == {}
    assert stub.calls[("nvmlEventSetWait_v2", None)] == 0


def test_a_poll_stuck_in_nvml_keeps_other_polls_out_until_it_returns() -> None:
    stub = NvmlStub([StubGpu(0)])
    nvml, _errors = open_nvml(stub)
    watcher = XidWatcher(nvml)
    watcher.poll()
    stub.hang_event_wait()
    stuck = threading.Thread(target=watcher.poll, daemon=True)
    stuck.start()
    assert stub.event_wait_blocked.wait(5)
    waits = stub.calls[("nvmlEventSetWait_v2", None)]
    t0 = time.perf_counter()
    watcher.poll()  # returns at once: never a second thread inside the event set
    assert time.perf_counter() - t0 < 0.5
    assert stub.calls[("nvmlEventSetWait_v2", None)] == waits
    stub.inject_xid(0, 31)
    stub.release_event_wait()
    stuck.join(5)
    assert not stuck.is_alive() and watcher.totals(0) == {31: 1}


def test_an_empty_graphics_list_is_read_every_tenth_tick_and_every_tick_once_it_lists() -> None:
    """A compute node's GPU lists no graphics process: that list is read on every 10th
    planned read; one that appears is in the GPU's processes within 10 reads, and is read
    every read while it stays."""
    from gpuwatch.collect.nvml import GRAPHICS_QUIET_SKIP

    stub = NvmlStub([StubGpu(0, processes=[(100, 4096)])])
    nvml, _ = open_nvml(stub)
    gpu = nvml.gpus[0]
    graphics = "nvmlDeviceGetGraphicsRunningProcesses_v3"
    compute = "nvmlDeviceGetComputeRunningProcesses_v3"
    assert gpu.read_fast()["processes"] == ((100, 4096),)  # the careful read: both lists
    assert (stub.count(compute, 0), stub.count(graphics, 0)) == (1, 1)
    for _ in range(30):
        assert gpu.read_fast()["processes"] == ((100, 4096),)
    assert stub.count(compute, 0) == 31
    assert stub.count(graphics, 0) == 1 + 30 // (GRAPHICS_QUIET_SKIP + 1)

    # a graphics-only process appears: listed within 10 reads, then read every read
    stub.gpus[0].graphics_processes = [(200, 512)]
    reads = 0
    while (200, 512) not in gpu.read_fast()["processes"]:
        reads += 1
        assert reads < GRAPHICS_QUIET_SKIP + 1
    before = stub.count(graphics, 0)
    for _ in range(5):
        assert gpu.read_fast()["processes"] == ((100, 4096), (200, 512))
    assert stub.count(graphics, 0) == before + 5
    # a careful read (after any trouble on the planned path) hands on what it saw: the
    # process stays in view on the planned reads after it
    for _ in range(6):
        gpu._plan = None
        assert gpu.read_fast()["processes"] == ((100, 4096), (200, 512))
        assert gpu.read_fast()["processes"] == ((100, 4096), (200, 512))
    # it leaves: the list is empty once, then read sparsely again
    stub.gpus[0].graphics_processes = []
    assert gpu.read_fast()["processes"] == ((100, 4096),)
    before = stub.count(graphics, 0)
    for _ in range(GRAPHICS_QUIET_SKIP):
        gpu.read_fast()
    assert stub.count(graphics, 0) == before
    gpu.read_fast()
    assert stub.count(graphics, 0) == before + 1


def test_handle_key_identifies_ctypes_handles_by_address() -> None:
    first = pynvml.c_nvmlDevice_t()
    assert handle_key(first) == handle_key(pynvml.c_nvmlDevice_t())  # both NULL
    stub_handle = StubGpu(0)
    assert handle_key(stub_handle) is stub_handle
