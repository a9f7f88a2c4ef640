"""The NVML layer: the only module that calls NVML.

Every call goes through :meth:`NvmlGpu._call`, which turns the answers a monitor must live
with into values instead of exceptions:

- ``NotSupported``, ``FunctionNotFound`` (or a function the bindings lack) and
  ``NoPermission``: the field is "not available" (``None``) and the function is never called
  again on that GPU, so the first read doubles as the capability probe;
- ``NotFound``/``NoData``: nothing to report right now (``None``), try again next time;
- ``GPU_IS_LOST``/``RESET_REQUIRED``, or a GPU whose every call fails for a few reads in a
  row: the GPU is marked lost (:class:`GpuLost`) and left alone, the others go on;
- anything else: that one field is ``None`` and the error is counted.

Nothing here starts threads or sleeps: the sampler decides which thread runs which read
(one worker per GPU, so a hung call stalls only its own GPU). The module is injectable
(``Nvml(module=stub)``) so tests can stand a stub in for ``pynvml``.
"""

from __future__ import annotations

import ctypes
import logging
import struct
import threading
from collections.abc import Callable
from math import isnan
from typing import Any

from gpuwatch import logs
from gpuwatch.samples import GpuInfo

log = logging.getLogger(__name__)

# pynvml's NVML_ERROR_* values, used when a (stub) module lacks the constant
_DEFAULT_CODES = {
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "NOT_FOUND": 6,
    "TIMEOUT": 10,
    "FUNCTION_NOT_FOUND": 13,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "NO_DATA": 24,
    "UNINITIALIZED": 1,
    "DRIVER_NOT_LOADED": 9,
    "LIB_RM_VERSION_MISMATCH": 18,
}

# answers that say the library itself is gone, not one GPU: the driver was unloaded or
# reloaded (an upgrade) under the daemon, and every handle from before is stale
_LIBRARY_GONE = ("UNINITIALIZED", "DRIVER_NOT_LOADED", "LIB_RM_VERSION_MISMATCH")

# a GPU whose every call failed (with errors other than "not supported") on this many
# fast reads in a row is treated as lost: it is not coming back without a reset
LOST_AFTER_FAILED_READS = 3

# GPM metric id name -> GpuSample field; NVML reports percent
GPM_METRICS: tuple[tuple[str, str], ...] = (
    ("NVML_GPM_METRIC_SM_UTIL", "sm_active"),
    ("NVML_GPM_METRIC_SM_OCCUPANCY", "sm_occupancy"),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", "tensor_active"),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", "dram_active"),
    ("NVML_GPM_METRIC_FP16_UTIL", "fp16_active"),
    ("NVML_GPM_METRIC_FP32_UTIL", "fp32_active"),
    ("NVML_GPM_METRIC_FP64_UTIL", "fp64_active"),
)

# P-state 32 is NVML_PSTATE_UNKNOWN
_PSTATE_UNKNOWN = 32

# GPM calls are serialized across GPUs: on a 2x H200 host (driver 580.159.04) one GPU's
# nvmlGpmMetricsGet crashed the process (SIGSEGV) while another GPU's nvmlGpmSampleGet ran
# on another thread. A GPU that can't get the lock soon (another GPU's GPM call is stuck)
# skips GPM for that tick rather than stall: its cheap fields still arrive.
_GPM_LOCK = threading.Lock()
_GPM_LOCK_TIMEOUT = 0.02  # seconds; a GPM read takes ~40-60 us

# the running-process queries by name, newest version first: the unversioned pynvml name
# turns FunctionNotFound into a non-NVML exception, so the versions are asked for by name
_RUNNING_PROCESSES = tuple(
    tuple(f"nvmlDeviceGet{kind}RunningProcesses{suffix}" for suffix in ("_v3", "_v2", ""))
    for kind in ("Compute", "Graphics"))
# a GPU with no graphics process (a compute node's, nearly always) has its graphics list
# read on every 10th tick only, and on every tick again once it lists one: with processes
# on the GPU the call costs as much as the compute list's (on an H200, 8 ranks running, the
# two lists were over half of the tick's NVML time)
GRAPHICS_QUIET_SKIP = 9
# the slow tier's dearest call (3.5-5 ms of CPU on an H200): the sampler reads it on fewer
# rounds, and asks again after a round where it did not answer unless it is unsupported
ENERGY_CALL = "nvmlDeviceGetTotalEnergyConsumption"


class GpuLost(Exception):
    """The GPU fell off the bus or stopped answering; its reads are over."""

    def __init__(self, gpu: int, reason: str) -> None:
        self.gpu = gpu
        self.reason = reason
        super().__init__(f"GPU {gpu} is lost: {reason}")


class NvmlGone(Exception):
    """NVML stopped answering as a library (driver unloaded or reloaded): start it again."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"NVML stopped answering: {reason}")


def load_module() -> Any:
    """Import ``pynvml`` (nvidia-ml-py); raises ImportError when it is not installed."""
    import pynvml

    return pynvml


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _gpm_result_layout(nv: Any, count: int) -> struct.Struct | None:
    """A Struct that reads (nvmlReturn, value) of the first ``count`` GPM metrics at once.

    pynvml's structures read every field through a Python ``__getattribute__``: pulling
    seven results out that way cost more than the GPM calls themselves. One ``unpack_from``
    over the same memory, at offsets taken from pynvml's own ctypes layout, costs ~0.2 us.
    None when the layout is not the one this reads (then GPM is left off, not misread).
    """
    try:
        metric = nv.c_nvmlGpmMetric_t
        base = nv.c_nvmlGpmMetricsGet_t.metrics.offset
        ret, value, size = metric.nvmlReturn, metric.value, ctypes.sizeof(metric)
    except AttributeError:
        return None
    if ret.size != 4 or value.size != 8:
        return None
    parts, pos = [], 0
    for i in range(count):
        for offset, code, width in ((base + i * size + ret.offset, "I", 4),
                                    (base + i * size + value.offset, "d", 8)):
            parts.append(f"{offset - pos}x{code}" if offset > pos else code)
            pos = offset + width
    return struct.Struct("=" + "".join(parts))


def handle_key(handle: Any) -> Any:
    """A hashable identity for a device handle (ctypes pointers don't compare by address)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


class Nvml:
    """An initialised NVML library and its GPUs.

    ``open()`` never raises for a missing driver: it returns False and ``reason`` says why,
    so the daemon can carry on with host metrics.
    """

    def __init__(self, module: Any = None, on_error: Callable[[str], None] | None = None,
                 said_lost: set[int] | None = None) -> None:
        self._module = module
        # GPUs whose loss was logged; shared by the sampler across NVML restarts
        self.said_lost: set[int] = said_lost if said_lost is not None else set()
        self.nv: Any = None
        self.on_error = on_error or (lambda source: None)
        self.available = False
        self.reason: str | None = None
        self.driver_version: str | None = None
        self.gpus: tuple[NvmlGpu, ...] = ()
        self._initialised = False
        # False when trying again cannot help (the bindings are not installed)
        self.retryable = True
        # what must be freed before nvmlShutdown (the XID watcher's event set)
        self.closing: list[Callable[[], None]] = []

    def code(self, name: str) -> int:
        return getattr(self.nv, "NVML_ERROR_" + name, _DEFAULT_CODES[name])

    @property
    def gone_codes(self) -> tuple[int, ...]:
        return tuple(self.code(name) for name in _LIBRARY_GONE)

    def open(self) -> bool:
        """nvmlInit and enumerate GPUs (handles only: per-GPU reads belong on GPU threads)."""
        try:
            self.nv = self._module if self._module is not None else load_module()
        except ImportError as err:
            self.reason = f"the NVML Python bindings (nvidia-ml-py) are not installed: {err}"
            self.retryable = False
            return False
        try:
            self.nv.nvmlInit()
        except Exception as err:  # noqa: BLE001 - LibraryNotFound, DriverNotLoaded...
            self.reason = f"NVML could not be initialised: {err or type(err).__name__}"
            return False
        self._initialised = True
        self.available = True
        try:
            self.driver_version = _text(self.nv.nvmlSystemGetDriverVersion())
        except Exception as err:  # noqa: BLE001 - never fatal
            log.debug("driver version not available: %s", err)
        try:
            count = int(self.nv.nvmlDeviceGetCount())
        except Exception as err:  # noqa: BLE001 - never fatal
            self.reason = f"NVML could not count GPUs: {err}"
            self.on_error("nvml")
            count = 0
        gpus = []
        for index in range(count):
            gpu = NvmlGpu(self, index)
            try:
                gpu.handle = self.nv.nvmlDeviceGetHandleByIndex(index)
            except Exception as err:  # noqa: BLE001 - never fatal
                # a GPU that can't even give a handle is lost from the start; the rest go on
                gpu.mark_lost(f"no handle: {err}")
            gpus.append(gpu)
        self.gpus = tuple(gpus)
        return True

    def close(self) -> None:
        """Free GPM samples and shut NVML down; call only once no thread is inside NVML."""
        if not self._initialised:
            return
        for free in self.closing:
            free()
        for gpu in self.gpus:
            gpu.free()
        try:
            self.nv.nvmlShutdown()
        except Exception as err:  # noqa: BLE001 - never fatal
            log.debug("nvmlShutdown failed: %s", err)
        self._initialised = False
        self.available = False

    def missing_function(self, name: str) -> None:
        logs.once(log, "nvml-missing:" + name, logging.INFO,
                  "NVML function %s is not in this driver or binding; its field is not available",
                  name)


class NvmlGpu:
    """One GPU: its static facts and its reads. One thread at a time per read tier."""

    def __init__(self, nvml: Nvml, index: int) -> None:
        self.nvml = nvml
        self.nv = nvml.nv
        self.index = index
        self.handle: Any = None
        self.lost = False
        self.lost_reason: str | None = None
        self.info = GpuInfo(gpu=index)
        # keys of calls that answered "not available": never asked again
        self.unsupported: set[str] = set()
        self._funcs: dict[str, Any] = {}  # bound once: the tick pays no attribute lookups
        self._failed_reads = 0
        self._has_processes = True  # until the first read says otherwise
        self._graphics_wait = 0  # planned reads to go before the graphics list is read
        # did any call answer / fail during the current read, per thread: the fast and the
        # slow tier read the same GPU from two threads, and only the fast read judges "lost"
        self._read = threading.local()
        self._gpm_ids: list[tuple[int, str]] = []
        self._gpm_samples: list[Any] = []
        self._gpm_have_previous = False
        # two c_nvmlGpmMetricsGet_t built once, one per order of the sample pair: the tick
        # alternates between them and sets nothing (each pynvml field write costs ~0.4 us)
        self._gpm_gets: list[Any] = []
        self._gpm_results: struct.Struct | None = None
        # constants looked up once: a module attribute per call is a dict lookup at best
        self._temp_sensor = getattr(self.nv, "NVML_TEMPERATURE_GPU", 0)
        self._clock_sm = getattr(self.nv, "NVML_CLOCK_SM", 1)
        self._clock_mem = getattr(self.nv, "NVML_CLOCK_MEM", 2)
        self._memory_v2 = getattr(self.nv, "nvmlMemory_v2", None)
        self._proc_util_seen = 0  # NVML timestamp (us) of the newest per-process sample read
        self._lost_lock = threading.Lock()
        # the cheap reads as bound functions, once a careful read showed which answer
        # (see _planned_read); None until then and after any read that was not clean
        self._plan: tuple[Any, ...] | None = None

    # -- the one door --------------------------------------------------------------
    def _call(self, fn: str, *args: Any, key: str | None = None) -> Any:
        """Call ``nv.fn(*args)``; ``None`` means not available (see the module docstring).

        A success leaves no trace here (this runs ~14 times a tick per GPU): the fast read
        sees its answers in the values; only the error paths note "failed" / "answered".
        """
        key = key or fn
        if key in self.unsupported:
            return None
        if self.lost:
            raise GpuLost(self.index, self.lost_reason or "lost")
        func = self._funcs.get(fn)
        if func is None:
            func = self._funcs[fn] = getattr(self.nv, fn, None)
        if func is None:
            self.unsupported.add(key)
            self.nvml.missing_function(fn if key == fn else f"{fn} ({key})")
            return None
        try:
            return func(*args)
        except self.nv.NVMLError as err:
            return self._nvml_error(err, fn, key)
        except Exception as err:  # noqa: BLE001 - a binding bug costs this field only
            self._read.failed = True
            self.nvml.on_error(f"gpu{self.index}")
            logs.once(log, f"nvml-exc:{self.index}:{fn}", logging.WARNING,
                      "GPU %d: %s raised %s: %s", self.index, fn, type(err).__name__, err)
            return None

    def _nvml_error(self, err: Any, fn: str, key: str) -> None:
        code = getattr(err, "value", None)
        nvml = self.nvml
        if code in (nvml.code("NOT_SUPPORTED"), nvml.code("FUNCTION_NOT_FOUND"),
                    nvml.code("NO_PERMISSION")):
            self.unsupported.add(key)
            if code == nvml.code("FUNCTION_NOT_FOUND"):
                nvml.missing_function(fn if key == fn else f"{fn} ({key})")
            elif code == nvml.code("NO_PERMISSION"):
                logs.once(log, f"nvml-perm:{self.index}:{key}", logging.INFO,
                          "GPU %d: no permission for %s; that field is not available",
                          self.index, fn)
            else:
                log.debug("GPU %d: %s not supported", self.index, fn)
            return
        if code in (nvml.code("NOT_FOUND"), nvml.code("NO_DATA")):
            self._read.ok = True  # the GPU answered; it just had nothing to say
            return
        if code in nvml.gone_codes:
            raise NvmlGone(f"{fn}: {err}") from err
        if code in (nvml.code("GPU_IS_LOST"), nvml.code("RESET_REQUIRED")):
            self.mark_lost(f"{fn}: {err}")
            raise GpuLost(self.index, f"{fn}: {err}") from err
        self._read.failed = True
        nvml.on_error(f"gpu{self.index}")
        logs.once(log, f"nvml-err:{self.index}:{fn}:{code}", logging.WARNING,
                  "GPU %d: %s failed: %s (counted in gpuwatch_errors_total)", self.index, fn, err)
        return

    def mark_lost(self, reason: str) -> None:
        with self._lost_lock:
            if self.lost:
                return
            self.lost = True
            self.lost_reason = reason
        self.nvml.on_error(f"gpu{self.index}_lost")
        said = self.nvml.said_lost
        if self.index not in said:  # not again when NVML, started again, finds it lost still
            said.add(self.index)
            log.warning("GPU %d is lost (%s): no more reads from it; the other GPUs carry on",
                        self.index, reason)

    # -- static facts ----------------------------------------------------------------
    def probe(self) -> GpuInfo:
        """Read the static facts and set up GPM; run once, on this GPU's worker thread."""
        if self.lost:
            return self.info
        h = self.handle
        c = self._call
        cc = c("nvmlDeviceGetCudaComputeCapability", h)
        pci = c("nvmlDeviceGetPciInfo", h)
        mem = self._memory()
        self._setup_gpm()
        self.info = GpuInfo(
            gpu=self.index,
            uuid=_text(c("nvmlDeviceGetUUID", h)),
            name=_text(c("nvmlDeviceGetName", h)),
            driver_version=self.nvml.driver_version,
            compute_capability=(int(cc[0]), int(cc[1])) if cc is not None else None,
            pci_bus_id=_text(getattr(pci, "busId", None)) if pci is not None else None,
            mem_total_bytes=int(mem.total) if mem is not None else None,
            gpm_supported=bool(self._gpm_ids),
        )
        return self.info

    def _setup_gpm(self) -> None:
        nv = self.nv
        support = self._call("nvmlGpmQueryDeviceSupport", self.handle)
        if support is None or not getattr(support, "isSupportedDevice", 0):
            return
        ids = [(getattr(nv, name), field) for name, field in GPM_METRICS if hasattr(nv, name)]
        if not ids:
            return
        results = _gpm_result_layout(nv, len(ids))
        if results is None:
            log.info("GPU %d: this pynvml's GPM structures are not the known layout; "
                     "GPM metrics are not available", self.index)
            return
        first = self._call("nvmlGpmSampleAlloc")
        second = self._call("nvmlGpmSampleAlloc") if first is not None else None
        if second is None:
            if first is not None:
                self._call("nvmlGpmSampleFree", first)
            return
        gets = []
        for older, newer in ((first, second), (second, first)):
            get = nv.c_nvmlGpmMetricsGet_t()
            get.version = nv.NVML_GPM_METRICS_GET_VERSION
            get.numMetrics = len(ids)
            get.sample1 = older
            get.sample2 = newer
            for i, (metric_id, _field) in enumerate(ids):
                get.metrics[i].metricId = metric_id
            gets.append(get)
        self._gpm_ids = ids
        self._gpm_samples = [first, second]
        self._gpm_gets = gets
        self._gpm_results = results

    def free(self) -> None:
        for sample in self._gpm_samples:
            try:
                self.nv.nvmlGpmSampleFree(sample)
            except Exception as err:  # noqa: BLE001 - never fatal
                log.debug("nvmlGpmSampleFree failed: %s", err)
        self._gpm_samples = []
        self._gpm_ids = []
        self._gpm_gets = []

    # -- cheap fields, every tick ------------------------------------------------------
    def _memory(self) -> Any:
        # v2 separates reserved memory from used; older drivers only have v1
        version = self._memory_v2
        if version is not None and "memory_v2" not in self.unsupported:
            mem = self._call("nvmlDeviceGetMemoryInfo", self.handle, version, key="memory_v2")
            if mem is not None or "memory_v2" not in self.unsupported:
                return mem
        return self._call("nvmlDeviceGetMemoryInfo", self.handle)

    def read_fast(self) -> dict[str, Any]:
        """The cheap fields and GPM, as GpuSample keyword arguments.

        ``processes`` is a tuple of (pid, mem_used_bytes). Raises GpuLost.

        Once a read went through every call cleanly, the next ones call the same functions
        straight (:meth:`_planned_read`): the one door of :meth:`_call` costs more than some
        of the calls. Anything unusual on that path (an error, a field that stopped
        answering) and the read is made again the careful way, which says what happened.
        """
        plan = self._plan
        if plan is not None and not self.lost:
            try:
                out = self._planned_read(plan)
            except Exception:  # noqa: BLE001 - the careful read below meets it again
                self._plan = None
            else:
                if self._gpm_ids and not self._gpm(out):
                    self._plan = None  # no GPM sample: let the careful path judge it
                return out
        return self._careful_read()

    def _planned_read(self, plan: tuple[Any, ...]) -> dict[str, Any]:
        """The careful read's calls and conversions, without its checks per call."""
        (h, util, memory, mem_args, power, limit, temp, temp_args, clock, sm_args, mem_clk_args,
         pstate_fn, reasons_fn, proc_fns) = plan
        out: dict[str, Any] = {}
        if util is not None:
            u = util(h)
            out["util"] = u.gpu / 100.0
            out["mem_util"] = u.memory / 100.0
        if memory is not None:
            mem = memory(h, *mem_args)
            total = int(mem.total)
            out["mem_used_bytes"] = total - int(mem.free)
            out["mem_total_bytes"] = total
        if power is not None:
            out["power_watts"] = power(h) / 1000.0
        if limit is not None:
            out["power_limit_watts"] = limit(h) / 1000.0
        if temp is not None:
            out["temp_celsius"] = float(temp(h, *temp_args))
        if sm_args is not None:
            out["sm_clock_mhz"] = float(clock(h, *sm_args))
        if mem_clk_args is not None:
            out["mem_clock_mhz"] = float(clock(h, *mem_clk_args))
        if pstate_fn is not None:
            pstate = pstate_fn(h)
            if 0 <= pstate < _PSTATE_UNKNOWN:
                out["pstate"] = int(pstate)
        if reasons_fn is not None:
            out["clock_event_reasons"] = int(reasons_fn(h))
        mem_of: dict[int, int | None] = {}
        for fn, graphics in proc_fns:
            if not graphics:
                listed = fn(h)
            elif self._graphics_wait > 0:
                self._graphics_wait -= 1
                continue
            else:
                listed = fn(h)
                self._graphics_wait = 0 if listed else GRAPHICS_QUIET_SKIP
            for p in listed:
                used = getattr(p, "usedGpuMemory", None)
                pid = int(p.pid)
                prev = mem_of.get(pid)
                mem_of[pid] = used if prev is None else max(prev, used or 0)
        procs = out["processes"] = tuple(mem_of.items())
        self._has_processes = bool(procs)
        self._failed_reads = 0
        return out

    def _make_plan(self) -> tuple[Any, ...] | None:
        """The functions a clean careful read just called, bound (None: not plannable)."""
        un, f = self.unsupported, self._funcs.get
        if any(f(name) is None for name in (
                "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo",
                "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit",
                "nvmlDeviceGetTemperature", "nvmlDeviceGetClockInfo",
                "nvmlDeviceGetPerformanceState") if name not in un):
            return None
        if "memory_v2" in un or self._memory_v2 is None:
            memory = None if "nvmlDeviceGetMemoryInfo" in un else f("nvmlDeviceGetMemoryInfo")
            mem_args: tuple[Any, ...] = ()
        else:
            memory, mem_args = f("nvmlDeviceGetMemoryInfo"), (self._memory_v2,)
        reasons = None
        for name in ("nvmlDeviceGetCurrentClocksEventReasons",
                     "nvmlDeviceGetCurrentClocksThrottleReasons"):
            if name not in un:
                reasons = f(name)
                if reasons is None:
                    return None
                break
        procs = []
        for names in _RUNNING_PROCESSES:
            for name in names:
                if name not in un:
                    fn = f(name)
                    if fn is None:
                        return None
                    procs.append((fn, "Graphics" in name))
                    break
        return (self.handle,
                None if "nvmlDeviceGetUtilizationRates" in un
                else f("nvmlDeviceGetUtilizationRates"),
                memory, mem_args,
                None if "nvmlDeviceGetPowerUsage" in un else f("nvmlDeviceGetPowerUsage"),
                None if "nvmlDeviceGetEnforcedPowerLimit" in un
                else f("nvmlDeviceGetEnforcedPowerLimit"),
                None if "nvmlDeviceGetTemperature" in un else f("nvmlDeviceGetTemperature"),
                (self._temp_sensor,), f("nvmlDeviceGetClockInfo"),
                None if "clock_sm" in un else (self._clock_sm,),
                None if "clock_mem" in un else (self._clock_mem,),
                None if "nvmlDeviceGetPerformanceState" in un
                else f("nvmlDeviceGetPerformanceState"),
                reasons, tuple(procs))

    def _careful_read(self) -> dict[str, Any]:
        h, c = self.handle, self._call
        read = self._read
        read.ok = read.failed = False
        out: dict[str, Any] = {}
        u = c("nvmlDeviceGetUtilizationRates", h)
        if u is not None:
            out["util"] = u.gpu / 100.0
            out["mem_util"] = u.memory / 100.0
        mem = self._memory()
        if mem is not None:
            # "used" is what a job can no longer allocate: v2's used excludes the driver's
            # reserved memory, v1's includes it, so report total - free on both (the
            # recordings and older tools read it that way)
            total = int(mem.total)
            out["mem_used_bytes"] = total - int(mem.free)
            out["mem_total_bytes"] = total
        power = c("nvmlDeviceGetPowerUsage", h)
        if power is not None:
            out["power_watts"] = power / 1000.0
        limit = c("nvmlDeviceGetEnforcedPowerLimit", h)
        if limit is not None:
            out["power_limit_watts"] = limit / 1000.0
        temp = c("nvmlDeviceGetTemperature", h, self._temp_sensor)
        if temp is not None:
            out["temp_celsius"] = float(temp)
        sm = c("nvmlDeviceGetClockInfo", h, self._clock_sm, key="clock_sm")
        if sm is not None:
            out["sm_clock_mhz"] = float(sm)
        memclk = c("nvmlDeviceGetClockInfo", h, self._clock_mem, key="clock_mem")
        if memclk is not None:
            out["mem_clock_mhz"] = float(memclk)
        pstate = c("nvmlDeviceGetPerformanceState", h)
        if pstate is not None and 0 <= pstate < _PSTATE_UNKNOWN:
            out["pstate"] = int(pstate)
        # "throttle" was renamed "clocks event" in driver 535; the old name is the fallback
        reasons = c("nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None and "nvmlDeviceGetCurrentClocksEventReasons" in self.unsupported:
            reasons = c("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        if reasons is not None:
            out["clock_event_reasons"] = int(reasons)
        procs = out["processes"] = self._processes()
        self._has_processes = bool(procs)
        gpm = self._gpm(out) if self._gpm_ids else False
        if read.failed:
            # something failed: did anything answer? (a success leaves no flag, see _call)
            answered = read.ok or gpm or procs is not None or any(
                v is not None for v in (u, mem, power, limit, temp, sm, memclk, pstate, reasons))
            self._check_persistent_failure(answered)
        else:
            self._failed_reads = 0
        if procs is None:
            out["processes"] = ()
        # a read where everything answered (or was learnt unsupported): the next ones may
        # go straight (a field with nothing to say right now, NOT_FOUND/NO_DATA, may not)
        clean = not read.failed and not read.ok and procs is not None and (
            gpm or not self._gpm_ids) and pstate is not None and pstate >= 0
        self._plan = self._make_plan() if clean else None
        return out

    def _processes(self) -> tuple[tuple[int, int | None], ...] | None:
        """(pid, used bytes) per process; None when neither query answered."""
        answered = False
        mem: dict[int, int | None] = {}
        for graphics, names in enumerate(_RUNNING_PROCESSES):
            for fn in names:
                if fn in self.unsupported:
                    continue
                procs = self._call(fn, self.handle)
                if procs is None and fn in self.unsupported:
                    continue  # learnt just now: try the older version
                if graphics and procs is not None:
                    # the planned reads go on from what this one saw (a listed graphics
                    # process must stay in view on every read that follows)
                    self._graphics_wait = 0 if procs else GRAPHICS_QUIET_SKIP
                if procs is not None:
                    answered = True
                    for p in procs:
                        used = getattr(p, "usedGpuMemory", None)
                        # one process with both a compute and a graphics context reports
                        # the same allocation twice; summing would double count it
                        pid = int(p.pid)
                        prev = mem.get(pid)
                        mem[pid] = used if prev is None else max(prev, used or 0)
                break
        return tuple(mem.items()) if answered else None

    def _gpm(self, out: dict[str, Any]) -> bool:
        """Take this tick's GPM sample and, with the previous one, add the GPM fields.

        False when the GPU did not give a sample.
        """
        if not _GPM_LOCK.acquire(timeout=_GPM_LOCK_TIMEOUT):
            return False
        try:
            return self._gpm_locked(out)
        finally:
            _GPM_LOCK.release()

    def _gpm_locked(self, out: dict[str, Any]) -> bool:
        current = self._gpm_samples[1]
        if self._call("nvmlGpmSampleGet", self.handle, current) is None:
            return False
        if self._gpm_have_previous:
            get = self._gpm_gets[0]
            if self._call("nvmlGpmMetricsGet", get) is not None:
                # (nvmlReturn, percent) per metric, in _gpm_ids order
                results = self._gpm_results.unpack_from(get)
                for i, (_metric_id, field) in enumerate(self._gpm_ids):
                    ret, percent = results[2 * i], results[2 * i + 1]
                    # NaN is no data; GPM sometimes overshoots 100 by rounding, and a
                    # ratio above 1 would mislead every consumer
                    if ret == 0 and not isnan(percent):
                        out[field] = 0.0 if percent <= 0.0 else (
                            1.0 if percent >= 100.0 else percent / 100.0)
        # the newer sample becomes the base of the next tick's pair: one sample per tick
        self._gpm_samples.reverse()
        self._gpm_gets.reverse()
        self._gpm_have_previous = True
        return True

    def _check_persistent_failure(self, answered: bool) -> None:
        if not answered:
            self._failed_reads += 1
            if self._failed_reads >= LOST_AFTER_FAILED_READS:
                reason = f"every call failed on {self._failed_reads} reads in a row"
                self.mark_lost(reason)
                raise GpuLost(self.index, reason)
        else:
            self._failed_reads = 0

    # -- slow fields, on the slow cadence -------------------------------------------------
    def read_slow(self, energy: bool = True) -> dict[str, Any]:
        """PCIe throughput, energy (unless ``energy`` is false), PCIe replays, ECC and row
        remapping. Raises GpuLost.

        PCIe throughput alone takes ~20 ms a direction (NVML samples over a window), which
        is why this never runs on the tick's path. The energy counter costs 3.5-5 ms of CPU
        in the driver on an H200 (more than the rest together), so the slow worker may
        read it on fewer rounds.
        """
        nv, h, c = self.nv, self.handle, self._call
        out: dict[str, Any] = {}
        # NVML says KB/s; it means KiB/s (1024), as nvidia-smi's MB/s figures show
        tx = c("nvmlDeviceGetPcieThroughput", h, nv.NVML_PCIE_UTIL_TX_BYTES, key="pcie_tx")
        if tx is not None:
            out["pcie_tx_bytes_per_second"] = float(tx) * 1024.0
        rx = c("nvmlDeviceGetPcieThroughput", h, nv.NVML_PCIE_UTIL_RX_BYTES, key="pcie_rx")
        if rx is not None:
            out["pcie_rx_bytes_per_second"] = float(rx) * 1024.0
        if energy:
            joules = c(ENERGY_CALL, h)
            if joules is not None:
                out["energy_joules"] = joules / 1000.0
        replay = c("nvmlDeviceGetPcieReplayCounter", h)
        if replay is not None:
            out["pcie_replay_total"] = int(replay)
        corrected = c("nvmlDeviceGetTotalEccErrors", h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                      nv.NVML_VOLATILE_ECC, key="ecc_corrected")
        if corrected is not None:
            out["ecc_corrected_total"] = int(corrected)
        uncorrected = c("nvmlDeviceGetTotalEccErrors", h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                        nv.NVML_VOLATILE_ECC, key="ecc_uncorrected")
        if uncorrected is not None:
            out["ecc_uncorrected_total"] = int(uncorrected)
        rows = c("nvmlDeviceGetRemappedRows", h)
        if rows is not None:
            corr, unc, pending, failure = rows
            out["remapped_rows_correctable"] = int(corr)
            out["remapped_rows_uncorrectable"] = int(unc)
            out["remapped_rows_pending"] = bool(pending)
            out["remapped_rows_failure"] = bool(failure)
        return out

    def read_process_utilization(self) -> dict[int, float]:
        """Per-process SM utilization (0-1), mean over NVML's samples since the last read."""
        if not self._has_processes:
            # ~3 ms of CPU to learn "not found" on an H200: skip it while no process runs
            return {}
        samples = self._call("nvmlDeviceGetProcessUtilization", self.handle,
                             self._proc_util_seen)
        if not samples:
            return {}
        sums: dict[int, list[float]] = {}
        for s in samples:
            self._proc_util_seen = max(self._proc_util_seen, int(s.timeStamp))
            acc = sums.setdefault(int(s.pid), [0.0, 0.0])
            acc[0] += s.smUtil
            acc[1] += 1
        return {pid: min(total / n / 100.0, 1.0) for pid, (total, n) in sums.items()}


_NO_XIDS: dict[int, int] = {}  # shared: never changed


class XidWatcher:
    """Counts XID errors per GPU per XID code from NVML events.

    Polled, not waited on: the sampler's reader calls :meth:`poll` once a tick, after the
    tick is published, and takes the events the driver queued since (a wait of 0 ms: ~4 µs
    of CPU on an H100). A thread blocked in ``nvmlEventSetWait`` had to wake every 250 ms
    to see a stop, and each wake cost 120–150 µs of CPU on an H100: a fifth of an idle
    daemon's CPU with one GPU. The event set is made and the GPUs registered at the first
    poll, on the reader, so a hung call there is rescued like a hung read (the sampler
    retires the reader; this watcher's lock keeps the fresh one out of NVML's events until
    the call returns). Devices that don't support events are skipped quietly.
    """

    MAX_PER_POLL = 64  # events taken per tick; more wait for the next
    GIVE_UP_AFTER = 10  # polls failing in a row

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml
        self._lock = threading.Lock()  # held by the poll while inside NVML's event calls
        # per GPU, a dict that is replaced, never changed, once handed out: every tick of
        # every GPU reads it, so reads take no lock and make no copy
        self._counts: dict[int, dict[int, int]] = {}
        self._by_handle: dict[Any, int] = {}
        self.registered: tuple[int, ...] = ()
        self._set: Any = None
        self._wait: Callable[..., Any] | None = None
        self._type = 0x8  # NVML's XID event type, and its TIMEOUT code: set by _start
        self._timeout: int | None = None
        self._started = False
        self._done = False  # nothing to poll (no GPU supports events, given up, freed)
        self._failures = 0
        nvml.closing.append(self.free)

    def totals(self, gpu: int) -> dict[int, int]:
        """XID counts of ``gpu`` by code; shared with every sample: do not change it."""
        return self._counts.get(gpu, _NO_XIDS)

    def poll(self) -> None:
        """Count the XID events queued since the last poll. Never raises; returns at once
        while another thread is still inside an event call."""
        if self._done or not self._lock.acquire(blocking=False):
            return
        try:
            if not self._started:
                self._started = True
                self._start()
            if not self._done:
                self._take()
        except Exception:  # noqa: BLE001 - XID counting must never cost a tick
            self._done = True
            log.exception("counting XID events failed; XID errors no longer counted")
        finally:
            self._lock.release()

    def _start(self) -> None:
        nv = self.nvml.nv
        xid_type = self._type = getattr(nv, "nvmlEventTypeXidCriticalError", 0x8)
        self._timeout = self.nvml.code("TIMEOUT")
        try:
            self._set = nv.nvmlEventSetCreate()
        except Exception as err:  # noqa: BLE001 - never fatal
            log.debug("XID events not available: nvmlEventSetCreate: %s", err)
            self._done = True
            return
        registered = []
        for gpu in self.nvml.gpus:
            if gpu.lost:
                continue
            try:
                nv.nvmlDeviceRegisterEvents(gpu.handle, xid_type, self._set)
            except Exception as err:  # noqa: BLE001 - never fatal
                log.debug("GPU %d: no XID events: %s", gpu.index, err)
                continue
            self._by_handle[handle_key(gpu.handle)] = gpu.index
            registered.append(gpu.index)
        self.registered = tuple(registered)
        self._wait = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
        self._done = not registered

    def _take(self) -> None:
        nv = self.nvml.nv
        xid_type = self._type
        wait = self._wait
        assert wait is not None
        for _ in range(self.MAX_PER_POLL):
            try:
                data = wait(self._set, 0)
            except nv.NVMLError as err:
                if getattr(err, "value", None) == self._timeout:
                    self._failures = 0  # nothing (more) queued
                    return
                self._failures += 1
                self.nvml.on_error("xid")
                logs.once(log, "xid-wait", logging.WARNING, "waiting for XID events: %s", err)
                if self._failures >= self.GIVE_UP_AFTER:
                    log.warning("XID event wait keeps failing; XID errors no longer counted")
                    self._done = True
                return
            self._failures = 0
            if not (data.eventType & xid_type):
                continue
            gpu_index = self._by_handle.get(handle_key(data.device))
            if gpu_index is None:
                continue
            xid = int(data.eventData)
            per_gpu = dict(self._counts.get(gpu_index, _NO_XIDS))
            per_gpu[xid] = per_gpu.get(xid, 0) + 1
            self._counts[gpu_index] = per_gpu
            log.warning("GPU %d: XID %d", gpu_index, xid)

    def free(self) -> None:
        """Free the event set: NVML's close calls it before nvmlShutdown, once no thread
        is inside NVML."""
        es, self._set = self._set, None
        self._done = True
        if es is None:
            return
        try:
            self.nvml.nv.nvmlEventSetFree(es)
        except Exception as err:  # noqa: BLE001 - never fatal
            log.debug("nvmlEventSetFree failed: %s", err)
