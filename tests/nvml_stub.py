"""A stand-in for the ``pynvml`` module, configured per device (after gpustat's tests).

Constants, ctypes structures and the NVMLError classes are the real bindings' own, so the
code under test sees the same error values and ``except`` clauses match exactly as they
would on a GPU host. Functions are the stub's: an NVML function the stub does not define
raises AttributeError instead of reaching a real driver.

Each scenario is a device setting: ``not_supported`` (NVMLError_NotSupported), ``failing``
(NVMLError_Unknown; ``"*"`` for every call), ``raises`` ({function: NVML error code}),
``lost_after`` (GPU_IS_LOST once that many
utilization reads have answered), ``hang(fn)`` (the next call of ``fn`` blocks until
``release()``), and the stub-wide ``init_error`` (nvmlInit fails; set it to None later and
the driver "appears"), ``missing`` (FunctionNotFound) and ``reload_driver()`` (the driver
unloaded and loaded again under the process: the library state is gone, every handle from
before is stale).
"""

from __future__ import annotations

import copy
import ctypes
import queue
import threading
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pynvml

_PASSTHROUGH = ("NVML_", "nvmlEventType", "nvmlMemory_", "NVMLError", "c_nvml")

H100_GPM = {
    pynvml.NVML_GPM_METRIC_SM_UTIL: 89.0,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 41.5,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 37.0,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: float("nan"),  # NVML does return NaN here at times
    pynvml.NVML_GPM_METRIC_FP16_UTIL: 0.0,
    pynvml.NVML_GPM_METRIC_FP32_UTIL: 12.0,
    pynvml.NVML_GPM_METRIC_FP64_UTIL: 100.4,  # rounding overshoot
}


# a C function called through ctypes (which releases the GIL around it), answering at once
_FOREIGN_CALL = ctypes.CDLL(None).getppid


def error(code: int) -> pynvml.NVMLError:
    """The exception real pynvml raises for ``code`` (e.g. NVMLError_NotSupported)."""
    return pynvml.NVMLError(code)


class StubGpu:
    """One device: what it reports and how it misbehaves."""

    def __init__(self, index: int, **over: Any) -> None:
        self.index = index
        self.name = over.pop("name", "NVIDIA H100 80GB HBM3")
        self.uuid = over.pop("uuid", f"GPU-{index:08d}-stub-0000-0000-000000000000")
        self.cc = over.pop("cc", (9, 0))
        self.pci_bus_id = over.pop("pci_bus_id", f"00000000:{index + 1:02X}:00.0")
        self.util = over.pop("util", (75, 30))  # percent: gpu, memory
        self.mem_total = over.pop("mem_total", 80 * 2**30)
        self.mem_used = over.pop("mem_used", 20 * 2**30)
        self.mem_reserved = over.pop("mem_reserved", 512 * 2**20)
        self.power_mw = over.pop("power_mw", 312_500)
        self.power_limit_mw = over.pop("power_limit_mw", 700_000)
        self.temp = over.pop("temp", 61)
        self.sm_clock = over.pop("sm_clock", 1980)
        self.mem_clock = over.pop("mem_clock", 2619)
        self.pstate = over.pop("pstate", 0)
        self.clock_reasons = over.pop("clock_reasons", 0x4)
        self.processes: list[tuple[int, int | None]] = list(over.pop("processes", ()))
        self.graphics_processes: list[tuple[int, int | None]] = list(
            over.pop("graphics_processes", ()))
        self.process_util: list[tuple[int, int]] = list(over.pop("process_util", ()))  # pid, %
        self.gpm = over.pop("gpm", True)
        self.gpm_percent: dict[int, float] = dict(over.pop("gpm_percent", H100_GPM))
        self.pcie_tx_kb = over.pop("pcie_tx_kb", 1550)
        self.pcie_rx_kb = over.pop("pcie_rx_kb", 2048)
        self.energy_mj = over.pop("energy_mj", 2_281_545)
        self.pcie_replay = over.pop("pcie_replay", 1)
        self.ecc = over.pop("ecc", (3, 0))
        self.remapped = over.pop("remapped", (0, 0, 0, 0))
        self.events = over.pop("events", True)
        self.not_supported: set[str] = set(over.pop("not_supported", ()))
        self.failing: set[str] = set(over.pop("failing", ()))
        self.raises: dict[str, int] = dict(over.pop("raises", {}))  # fn -> NVML error code
        self.lost_after: int | None = over.pop("lost_after", None)
        if over:
            raise TypeError(f"unknown StubGpu settings: {sorted(over)}")
        self.lost = False
        self.util_reads = 0
        self._hangs: dict[str, threading.Event] = {}
        self.blocked = threading.Event()  # set while a hung call is blocked
        self.released = threading.Event()

    def hang(self, fn: str) -> None:
        """Make the next call of ``fn`` block until release()."""
        self.released.clear()
        self._hangs[fn] = self.released

    def release(self) -> None:
        self._hangs.clear()
        self.released.set()

    def hang_gate(self, fn: str) -> threading.Event | None:
        return self._hangs.get(fn)


class StubEventSet:
    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()
        self.registered: dict[int, int] = {}  # gpu index -> event type mask
        self.freed = False


class NvmlStub:
    """The module object handed to ``Sampler(nvml_module=...)``."""

    def __init__(self, gpus: list[StubGpu] | None = None, *, init_error: int | None = None,
                 missing: tuple[str, ...] = (), driver_version: str = "580.159.04",
                 gil_release: bool = False) -> None:
        self.gpus = list(gpus) if gpus is not None else [StubGpu(0)]
        # every call leaves the interpreter lock for a moment, as pynvml's ctypes calls into
        # the driver do: threads reading GPUs at once then contend as they would on a GPU
        # host (benchmarks/bench_tick.py); a C call that returns at once, not a sleep
        self._foreign = _FOREIGN_CALL if gil_release else None
        self.init_error = init_error
        self.missing = set(missing)
        self.driver_version = driver_version
        self.refcount = 0  # like libnvidia-ml: every nvmlInit needs its nvmlShutdown
        self.shutdowns = 0
        self.calls: Counter[tuple[str, int | None]] = Counter()
        self._lock = threading.Lock()
        self._gpm_samples: dict[int, Any] = {}  # address -> [buffer, gpu index, sequence]
        self._gpm_seq = 0
        self.event_sets: list[StubEventSet] = []
        self._event_gate: threading.Event | None = None  # hang_event_wait()
        self.event_wait_blocked = threading.Event()  # set while a wait is held there
        self.event_wait_error: int | None = None  # every event wait fails with this code

    def __getattr__(self, name: str) -> Any:
        if name.startswith(_PASSTHROUGH):
            return getattr(pynvml, name)
        raise AttributeError(name)

    def count(self, fn: str, gpu: int | None = None) -> int:
        with self._lock:
            return self.calls[(fn, gpu)]

    # -- the common entry -----------------------------------------------------------------
    def _enter(self, fn: str, gpu: StubGpu | None = None) -> None:
        with self._lock:
            self.calls[(fn, gpu.index if gpu is not None else None)] += 1
        if self._foreign is not None:
            self._foreign()
        if fn in self.missing:
            raise error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if self.refcount <= 0:
            raise error(pynvml.NVML_ERROR_UNINITIALIZED)
        if gpu is None:
            return
        if not any(g is gpu for g in self.gpus):  # a handle from before a driver reload
            raise error(pynvml.NVML_ERROR_UNINITIALIZED)
        if gpu.lost:
            raise error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.not_supported:
            raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if fn in gpu.failing or "*" in gpu.failing:
            raise error(pynvml.NVML_ERROR_UNKNOWN)
        if fn in gpu.raises:
            raise error(gpu.raises[fn])
        gate = gpu.hang_gate(fn)
        if gate is not None:
            gpu.blocked.set()
            gate.wait()
            gpu.blocked.clear()

    def reload_driver(self) -> None:
        """The driver was unloaded and loaded again: NVML's state is gone (every call says
        UNINITIALIZED until the next nvmlInit) and the old handles are stale; the devices
        are new objects (``stub.gpus[i]``), configured as before."""
        with self._lock:
            self.refcount = 0
            fresh = []
            for gpu in self.gpus:
                new = copy.copy(gpu)
                new._hangs = {}
                new.blocked, new.released = threading.Event(), threading.Event()
                fresh.append(new)
            self.gpus = fresh
            self.event_sets = []

    # -- library --------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        with self._lock:
            self.calls[("nvmlInit", None)] += 1
        if self.init_error is not None:
            raise error(self.init_error)
        self.refcount += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.refcount -= 1
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> StubGpu:
        self._enter("nvmlDeviceGetHandleByIndex")
        gpu = self.gpus[index]
        if gpu.lost:
            raise error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    # -- static facts ---------------------------------------------------------------------
    def nvmlDeviceGetName(self, h: StubGpu) -> str:
        self._enter("nvmlDeviceGetName", h)
        return h.name

    def nvmlDeviceGetUUID(self, h: StubGpu) -> str:
        self._enter("nvmlDeviceGetUUID", h)
        return h.uuid

    def nvmlDeviceGetCudaComputeCapability(self, h: StubGpu) -> tuple[int, int]:
        self._enter("nvmlDeviceGetCudaComputeCapability", h)
        return h.cc

    def nvmlDeviceGetPciInfo(self, h: StubGpu) -> SimpleNamespace:
        self._enter("nvmlDeviceGetPciInfo", h)
        return SimpleNamespace(busId=h.pci_bus_id.encode())  # bytes, as some bindings give

    # -- cheap fields ---------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, h: StubGpu) -> SimpleNamespace:
        self._enter("nvmlDeviceGetUtilizationRates", h)
        if h.lost_after is not None and h.util_reads >= h.lost_after:
            h.lost = True
            raise error(pynvml.NVML_ERROR_GPU_IS_LOST)
        h.util_reads += 1
        return SimpleNamespace(gpu=h.util[0], memory=h.util[1])

    def nvmlDeviceGetMemoryInfo(self, h: StubGpu, version: int | None = None) -> SimpleNamespace:
        if version:
            self._enter("nvmlDeviceGetMemoryInfo_v2", h)
            free = h.mem_total - h.mem_used - h.mem_reserved
            return SimpleNamespace(version=version, total=h.mem_total, reserved=h.mem_reserved,
                                   free=free, used=h.mem_used)
        self._enter("nvmlDeviceGetMemoryInfo", h)
        # v1 counts reserved memory as used
        used = h.mem_used + h.mem_reserved
        return SimpleNamespace(total=h.mem_total, free=h.mem_total - used, used=used)

    def nvmlDeviceGetPowerUsage(self, h: StubGpu) -> int:
        self._enter("nvmlDeviceGetPowerUsage", h)
        return h.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: StubGpu) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit", h)
        return h.power_limit_mw

    def nvmlDeviceGetTemperature(self, h: StubGpu, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", h)
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return h.temp

    def nvmlDeviceGetClockInfo(self, h: StubGpu, clock: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", h)
        return {pynvml.NVML_CLOCK_SM: h.sm_clock, pynvml.NVML_CLOCK_MEM: h.mem_clock}[clock]

    def nvmlDeviceGetPerformanceState(self, h: StubGpu) -> int:
        self._enter("nvmlDeviceGetPerformanceState", h)
        return h.pstate

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: StubGpu) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", h)
        return h.clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: StubGpu) -> int:
        self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return h.clock_reasons

    def _procs(self, fn: str, h: StubGpu, procs: list[tuple[int, int | None]]) -> list:
        self._enter(fn, h)
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in procs]

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h: StubGpu) -> list:
        return self._procs("nvmlDeviceGetComputeRunningProcesses_v3", h, h.processes)

    def nvmlDeviceGetComputeRunningProcesses(self, h: StubGpu) -> list:
        return self._procs("nvmlDeviceGetComputeRunningProcesses", h, h.processes)

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, h: StubGpu) -> list:
        return self._procs("nvmlDeviceGetGraphicsRunningProcesses_v3", h, h.graphics_processes)

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: StubGpu) -> list:
        return self._procs("nvmlDeviceGetGraphicsRunningProcesses", h, h.graphics_processes)

    # -- GPM ------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, h: StubGpu) -> SimpleNamespace:
        self._enter("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(version=1, isSupportedDevice=int(h.gpm))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        buf = ctypes.c_int(0)
        ptr = ctypes.cast(ctypes.pointer(buf), pynvml.c_nvmlGpmSample_t)
        with self._lock:
            self._gpm_samples[ctypes.cast(ptr, ctypes.c_void_p).value] = [buf, None, -1]
        return ptr

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        with self._lock:
            self._gpm_samples.pop(ctypes.cast(sample, ctypes.c_void_p).value, None)

    def nvmlGpmSampleGet(self, h: StubGpu, sample: Any) -> Any:
        self._enter("nvmlGpmSampleGet", h)
        with self._lock:
            entry = self._gpm_samples[ctypes.cast(sample, ctypes.c_void_p).value]
            self._gpm_seq += 1
            entry[1], entry[2] = h.index, self._gpm_seq
        return sample

    def nvmlGpmMetricsGet(self, get: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        with self._lock:
            first = self._gpm_samples.get(ctypes.cast(get.sample1, ctypes.c_void_p).value)
            second = self._gpm_samples.get(ctypes.cast(get.sample2, ctypes.c_void_p).value)
        # what a driver needs: two samples of one GPU, the older one first
        if (first is None or second is None or first[1] is None or first[1] != second[1]
                or not first[2] < second[2]):
            raise error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[first[1]]
        for i in range(get.numMetrics):
            m = get.metrics[i]
            if m.metricId in gpu.gpm_percent:
                m.value = gpu.gpm_percent[m.metricId]
                m.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                m.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return get

    # -- slow fields ----------------------------------------------------------------------
    def nvmlDeviceGetPcieThroughput(self, h: StubGpu, counter: int) -> int:
        self._enter("nvmlDeviceGetPcieThroughput", h)
        return h.pcie_tx_kb if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else h.pcie_rx_kb

    def nvmlDeviceGetTotalEnergyConsumption(self, h: StubGpu) -> int:
        self._enter("nvmlDeviceGetTotalEnergyConsumption", h)
        return h.energy_mj

    def nvmlDeviceGetPcieReplayCounter(self, h: StubGpu) -> int:
        self._enter("nvmlDeviceGetPcieReplayCounter", h)
        return h.pcie_replay

    def nvmlDeviceGetTotalEccErrors(self, h: StubGpu, error_type: int, counter: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", h)
        assert counter == pynvml.NVML_VOLATILE_ECC
        return h.ecc[0] if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else h.ecc[1]

    def nvmlDeviceGetRemappedRows(self, h: StubGpu) -> tuple[int, int, int, int]:
        self._enter("nvmlDeviceGetRemappedRows", h)
        return h.remapped

    def nvmlDeviceGetProcessUtilization(self, h: StubGpu, last_seen: int) -> list:
        self._enter("nvmlDeviceGetProcessUtilization", h)
        samples = [SimpleNamespace(pid=pid, timeStamp=1_000 * (n + 1), smUtil=sm, memUtil=0,
                                   encUtil=0, decUtil=0)
                   for n, (pid, sm) in enumerate(h.process_util)]
        samples = [s for s in samples if s.timeStamp > last_seen]
        if not samples:
            raise error(pynvml.NVML_ERROR_NOT_FOUND)  # what NVML says when it has no samples
        return samples

    # -- events ---------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> StubEventSet:
        self._enter("nvmlEventSetCreate")
        es = StubEventSet()
        self.event_sets.append(es)
        return es

    def nvmlDeviceRegisterEvents(self, h: StubGpu, types: int, es: StubEventSet) -> None:
        self._enter("nvmlDeviceRegisterEvents", h)
        if not h.events:
            raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        es.registered[h.index] = es.registered.get(h.index, 0) | types

    def hang_event_wait(self) -> None:
        """Make the next nvmlEventSetWait_v2 block until release_event_wait()."""
        self._event_gate = threading.Event()

    def release_event_wait(self) -> None:
        gate, self._event_gate = self._event_gate, None
        if gate is not None:
            gate.set()

    def nvmlEventSetWait_v2(self, es: StubEventSet, timeout_ms: int) -> SimpleNamespace:
        self._enter("nvmlEventSetWait_v2")
        gate = self._event_gate
        if gate is not None:
            self.event_wait_blocked.set()
            gate.wait()
            self.event_wait_blocked.clear()
        if self.event_wait_error is not None:
            raise error(self.event_wait_error)
        try:
            return es.queue.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise error(pynvml.NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, es: StubEventSet) -> None:
        self._enter("nvmlEventSetFree")
        es.freed = True

    def inject_xid(self, index: int, xid: int) -> bool:
        """Deliver an XID critical error for GPU ``index``; False if nobody registered it."""
        gpu = self.gpus[index]
        delivered = False
        for es in self.event_sets:
            if es.registered.get(index, 0) & pynvml.nvmlEventTypeXidCriticalError:
                es.queue.put(SimpleNamespace(device=gpu,
                                             eventType=pynvml.nvmlEventTypeXidCriticalError,
                                             eventData=xid, gpuInstanceId=0, computeInstanceId=0))
                delivered = True
        return delivered
