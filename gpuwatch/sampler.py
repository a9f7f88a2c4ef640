"""The tick loop: every GPU and the host, on absolute deadlines, into the store.

Threads, and why each exists:

- one **fast worker per GPU** runs that GPU's cheap reads and GPM. NVML calls can hang and
  cannot be interrupted from Python, so the tick hands each worker its read and waits up to
  a deadline; a GPU whose worker has not answered gets no fresh fields that tick, is not
  handed more work while it is stuck (counted as ``gpu<N>_stalled``), and the tick
  publishes on time for everything else.
- one **slow worker per GPU** runs the slow tier (PCIe throughput takes ~20 ms a
  direction, energy ~4 ms) every ``slow_interval``, triggered by the tick when due, so
  those calls never delay a tick; the newest slow values ride along in each tick's sample.
- one **XID thread** waits on NVML events with a timeout, so it can stop.
- the **loop thread** (``start()``) ticks at ``start + k * interval``; a tick that
  overruns skips the slots it missed instead of bunching ticks to catch up.

``tick()`` is synchronous and usable without ``start()`` (tests, benchmarks).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from typing import Any, Protocol

import psutil

from gpuwatch.nvml import GpuLost, Nvml, NvmlGpu, XidWatcher
from gpuwatch.samples import GpuInfo, GpuProcess, GpuSample, Health, HostSample, Snapshot
from gpuwatch.store import Store

log = logging.getLogger(__name__)

MIN_INTERVAL = 0.1
MAX_INTERVAL = 60.0
# how long __init__ waits for every GPU's static facts before going on without the slow ones
PROBE_TIMEOUT = 5.0
# how long stop() waits, in all, for threads to leave NVML before giving up on them
STOP_TIMEOUT = 3.0

_LOST = "lost"  # a worker's answer for a GPU that just fell off


class HostSource(Protocol):
    def sample(self, t: float, gpu_pids: Collection[int]) -> HostSample: ...


class _FastWorker:
    """The thread that owns one GPU's per-tick reads."""

    def __init__(self, gpu: NvmlGpu, outbox: queue.SimpleQueue, on_error: Callable[[str], None]):
        self.gpu = gpu
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.outbox = outbox
        self.on_error = on_error
        self.busy = False  # handed a job that has not come back yet (tick thread only)
        self.thread = threading.Thread(target=self._run, name=f"gpuwatch-gpu{gpu.index}",
                                       daemon=True)

    def _run(self) -> None:
        while True:
            job = self.inbox.get()
            if job is None:
                return
            try:
                result: Any = self.gpu.probe() if job == "probe" else self.gpu.read_fast()
            except GpuLost:
                result = _LOST
            except Exception:
                self.on_error(f"gpu{self.gpu.index}")
                log.exception("GPU %d: read failed", self.gpu.index)
                result = None
            self.outbox.put((self.gpu.index, job, result))


class _SlowWorker:
    """The thread that runs one GPU's slow tier when the tick says it is due."""

    def __init__(self, gpu: NvmlGpu, stop: threading.Event, on_error: Callable[[str], None]):
        self.gpu = gpu
        self.stop = stop
        self.on_error = on_error
        self.trigger = threading.Event()
        self.running = False
        self.fields: dict[str, Any] = {}  # replaced whole, so readers never see half of it
        self.proc_util: dict[int, float] = {}
        self.thread = threading.Thread(target=self._run, name=f"gpuwatch-gpu{gpu.index}-slow",
                                       daemon=True)

    def _run(self) -> None:
        while True:
            self.trigger.wait()
            # running goes up before the trigger goes down: the tick must never see neither
            self.running = True
            self.trigger.clear()
            if self.stop.is_set():
                return
            try:
                fields = self.gpu.read_slow()
                proc_util = self.gpu.read_process_utilization()
            except GpuLost:
                return
            except Exception:
                self.on_error(f"gpu{self.gpu.index}")
                log.exception("GPU %d: slow read failed", self.gpu.index)
            else:
                # per-process first: a tick that sees the new fields sees their processes too
                self.proc_util = proc_util
                self.fields = fields
            finally:
                self.running = False


class _ProcessNames:
    """Name and user of GPU processes, from psutil, cached by pid and creation time.

    A pid is trusted while it stays on a GPU from tick to tick; one that leaves is
    forgotten, so if it comes back (perhaps a new process with a reused pid) it is looked up
    again and checked against its creation time. A vanished or forbidden pid costs only its
    own name and user.
    """

    def __init__(self) -> None:
        self._cache: dict[int, tuple[float | None, str | None, str | None]] = {}

    def lookup(self, pids: Collection[int]) -> dict[int, tuple[str | None, str | None]]:
        fresh: dict[int, tuple[float | None, str | None, str | None]] = {}
        for pid in pids:
            entry = self._cache.get(pid)
            fresh[pid] = entry if entry is not None else self._read(pid)
        self._cache = fresh
        return {pid: (name, user) for pid, (_ct, name, user) in fresh.items()}

    @staticmethod
    def _read(pid: int) -> tuple[float | None, str | None, str | None]:
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                create_time = proc.create_time()
                name = proc.name()
                try:
                    user = proc.username()
                except (psutil.AccessDenied, KeyError):
                    user = None
        except (psutil.Error, OSError):
            # gone, a zombie, another pid namespace, or not ours to read
            return (None, None, None)
        return (create_time, name, user)


class Sampler:
    """Samples every GPU (through :mod:`gpuwatch.nvml`) and the host into a Store."""

    def __init__(self, store: Store, *, interval: float = 1.0, slow_interval: float = 10.0,
                 nvml_module: object | None = None, host: object | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not MIN_INTERVAL <= interval <= MAX_INTERVAL:
            raise ValueError(f"interval must be {MIN_INTERVAL} to {MAX_INTERVAL} s, got {interval}")
        if slow_interval <= 0:
            raise ValueError(f"slow_interval must be positive, got {slow_interval}")
        self.store = store
        self.interval = float(interval)
        self.slow_interval = float(slow_interval)
        self._clock = clock
        # the tick waits this long (real time) for GPU workers; the rest of the slot is slack
        self.read_deadline = min(max(0.5 * self.interval, 0.05), 2.0)
        self._stop = threading.Event()
        self._wait: Callable[[float], bool] = self._stop.wait  # tests inject simulated time
        self._tick_lock = threading.Lock()
        self._err_lock = threading.Lock()
        self._errors: Counter[str] = Counter()
        self._ticks = 0
        self._tick_no = 0
        self._last_success: float | None = None
        self._next_slow: float | None = None
        self._loop: threading.Thread | None = None
        self._names = _ProcessNames()
        self.skipped_slots = 0  # ticks skipped because an earlier one overran
        self.host = self._make_host(host)

        self._nvml = Nvml(nvml_module, on_error=self._count)
        self.nvml_available = self._nvml.open()
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._fast: list[_FastWorker] = []
        self._slow: list[_SlowWorker] = []
        self._xid: XidWatcher | None = None
        self._xid_thread: threading.Thread | None = None
        self.infos: tuple[GpuInfo, ...] = ()
        if not self.nvml_available:
            # once per daemon: the reason is the same on every tick
            log.warning("no NVIDIA GPU/driver found (%s); sampling host metrics only",
                        self._nvml.reason)
            return
        if not self._nvml.gpus:
            log.warning("NVML found no GPU; sampling host metrics only")
        for gpu in self._nvml.gpus:
            self._fast.append(_FastWorker(gpu, self._outbox, self._count))
            self._slow.append(_SlowWorker(gpu, self._stop, self._count))
        for w in (*self._fast, *self._slow):
            w.thread.start()
        self.infos = self._probe()
        if self._nvml.gpus:
            self._xid = XidWatcher(self._nvml)
            self._xid_thread = threading.Thread(target=self._xid.run, args=(self._stop,),
                                                name="gpuwatch-xid", daemon=True)
            self._xid_thread.start()

    # -- public ---------------------------------------------------------------------------
    def start(self) -> None:
        """Tick in the background until stop()."""
        if self._loop is not None:
            return
        self._loop = threading.Thread(target=self._run, name="gpuwatch-sampler", daemon=True)
        self._loop.start()

    def stop(self) -> None:
        """Stop every thread (promptly: none sleeps longer than a wait timeout) and NVML."""
        self._stop.set()
        for w in self._fast:
            w.inbox.put(None)
        for s in self._slow:
            s.trigger.set()
        deadline = time.monotonic() + STOP_TIMEOUT
        threads = [t for t in (self._loop, self._xid_thread) if t is not None]
        threads += [w.thread for w in self._fast] + [s.thread for s in self._slow]
        stuck = []
        for t in threads:
            if t is threading.current_thread() or t.ident is None:  # never started
                continue
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                stuck.append(t.name)
        if stuck:
            # shutting NVML down under a thread that is inside it would be worse than leaking
            log.warning("threads still inside NVML at stop (%s); not calling nvmlShutdown",
                        ", ".join(stuck))
        else:
            self._nvml.close()

    def tick(self) -> Snapshot:
        """One tick: read every GPU and the host, publish the Snapshot, return it."""
        with self._tick_lock:
            started = time.perf_counter()
            t = time.time()
            errors_before = self._error_total()
            # after stop() the workers are gone and NVML is shut: host only
            gpus = self._tick_gpus(t) if self._fast and not self._stop.is_set() else ()
            pids = sorted({p.pid for g in gpus for p in g.processes})
            host = self._sample_host(t, pids)
            self._ticks += 1
            if self._error_total() == errors_before:
                self._last_success = t
            with self._err_lock:
                errors = dict(self._errors)
            health = Health(ticks_total=self._ticks, tick_seconds=time.perf_counter() - started,
                            errors_total=errors, last_success_time=self._last_success)
            snapshot = Snapshot(t=t, gpus=gpus, infos=self.infos, host=host, health=health,
                                nvml_available=self.nvml_available)
            try:
                self.store.publish(snapshot)
            except Exception:
                self._count("store")
                log.exception("publishing a snapshot failed")
            return snapshot

    # -- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        start = self._clock()
        slot = 0
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # never let one bad tick end the loop
                self._count("tick")
                log.exception("tick failed")
            now = self._clock()
            # the next slot on the grid that is still ahead: overrun slots are skipped
            due = max(slot + 1, math.floor((now - start) / self.interval) + 1)
            self.skipped_slots += due - slot - 1
            slot = due
            if self._wait(start + slot * self.interval - now):
                return

    # -- GPUs -----------------------------------------------------------------------------------
    def _probe(self) -> tuple[GpuInfo, ...]:
        infos = {gpu.index: gpu.info for gpu in self._nvml.gpus}
        waiting = set()
        for w in self._fast:
            if not w.gpu.lost:
                w.busy = True
                w.inbox.put("probe")
                waiting.add(w.gpu.index)
        deadline = time.monotonic() + PROBE_TIMEOUT
        while waiting:
            try:
                remaining = max(0.0, deadline - time.monotonic())
                index, _job, result = self._outbox.get(timeout=remaining)
            except queue.Empty:
                break
            self._fast[index].busy = False
            waiting.discard(index)
            if isinstance(result, GpuInfo):
                infos[index] = result
        for index in waiting:
            self._count(f"gpu{index}_stalled")
            log.warning("GPU %d: static facts did not come back within %.0f s; "
                        "it is left alone while NVML is stuck on it", index, PROBE_TIMEOUT)
        return tuple(infos[i] for i in sorted(infos))

    def _collect(self, index: int, job: Any, result: Any, results: dict[int, Any]) -> None:
        self._fast[index].busy = False
        if job == "probe":  # a late answer from a GPU that was stuck at start
            if isinstance(result, GpuInfo):
                self.infos = tuple(result if i.gpu == index else i for i in self.infos)
        elif job == self._tick_no:
            results[index] = result

    def _tick_gpus(self, t: float) -> tuple[GpuSample, ...]:
        self._tick_no += 1
        results: dict[int, Any] = {}
        while True:  # answers from workers that were stuck on an earlier tick free them again
            try:
                self._collect(*self._outbox.get_nowait(), results)
            except queue.Empty:
                break
        handed: list[_FastWorker] = []
        for w in self._fast:
            if w.gpu.lost:
                continue
            if w.busy:  # still inside an earlier read: no more work until it comes back
                self._count(f"gpu{w.gpu.index}_stalled")
                continue
            w.busy = True
            w.inbox.put(self._tick_no)
            handed.append(w)
        self._trigger_slow()
        deadline = time.monotonic() + self.read_deadline
        while len(results) < len(handed):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                self._collect(*self._outbox.get(timeout=remaining), results)
            except queue.Empty:
                break
        for w in handed:
            if w.gpu.index not in results:
                self._count(f"gpu{w.gpu.index}_stalled")
        return self._build(t, results)

    def _build(self, t: float, results: dict[int, Any]) -> tuple[GpuSample, ...]:
        fresh = {i: r for i, r in results.items() if isinstance(r, dict)}
        pids = {pid for r in fresh.values() for pid, _mem in r.get("processes", ())}
        names = self._names.lookup(pids)
        samples = []
        for w in self._fast:
            gpu = w.gpu
            i = gpu.index
            uuid = self.infos[i].uuid if i < len(self.infos) else None
            xids = self._xid.totals(i) if self._xid is not None else {}
            if gpu.lost or results.get(i) == _LOST:
                samples.append(GpuSample(t=t, gpu=i, uuid=uuid, lost=True, xid_total=xids))
                continue
            slow = self._slow[i]
            fields = dict(slow.fields)
            fast = fresh.get(i)
            processes: tuple[GpuProcess, ...] = ()
            if fast is not None:
                fields.update(fast)
                proc_util = slow.proc_util
                processes = tuple(
                    GpuProcess(pid=pid, mem_used_bytes=mem, sm_util=proc_util.get(pid),
                               name=names.get(pid, (None, None))[0],
                               user=names.get(pid, (None, None))[1])
                    for pid, mem in fields.pop("processes", ()))
            samples.append(GpuSample(t=t, gpu=i, uuid=uuid, processes=processes,
                                     xid_total=xids, **fields))
        return tuple(samples)

    def _trigger_slow(self) -> None:
        now = self._clock()
        if self._next_slow is None:
            self._next_slow = now
        if now < self._next_slow:
            return
        for s in self._slow:
            if s.gpu.lost:
                continue
            if s.running or s.trigger.is_set():
                self._count(f"gpu{s.gpu.index}_slow_stalled")
                continue
            s.trigger.set()
        missed = math.floor((now - self._next_slow) / self.slow_interval)
        self._next_slow += (missed + 1) * self.slow_interval

    # -- host and bookkeeping ---------------------------------------------------------------------
    def _make_host(self, host: object | None) -> Any:
        if host is not None:
            return host
        try:
            from gpuwatch.host import HostSampler

            return HostSampler()
        except Exception as err:  # noqa: BLE001 - GPU metrics still flow
            log.warning("host metrics not available: %s", err)
            return None

    def _sample_host(self, t: float, pids: Collection[int]) -> HostSample | None:
        if self.host is None:
            return None
        try:
            return self.host.sample(t, pids)
        except Exception:
            self._count("host")
            log.exception("host sample failed")
            return None

    def _count(self, source: str) -> None:
        with self._err_lock:
            self._errors[source] += 1

    def _error_total(self) -> int:
        with self._err_lock:
            return sum(self._errors.values())


__all__ = ["MAX_INTERVAL", "MIN_INTERVAL", "Sampler"]
