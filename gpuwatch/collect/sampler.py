"""The tick loop: every GPU and the host, on absolute deadlines, into the store.

Threads, and why each exists:

- one **reader** reads every GPU's cheap fields and GPM, one GPU after another, and builds
  their GpuSamples. While the loop runs (``start()``) it keeps the tick grid itself: it
  wakes ``READ_LEAD`` before each deadline, reads, and leaves each sample in its GPU's slot.
  One thread for all GPUs: no per-GPU wake-up and no hand-off per tick (each cost more CPU
  than a GPU's NVML calls), and no GPUs' reads contending for the interpreter at once.
- NVML calls can hang and cannot be interrupted from Python, so no thread ever waits on
  one for long: a reader stuck inside one GPU's call for ``stuck_after`` is left to it (it
  ends once the call returns) and a **fresh reader** takes over the other GPUs at once, the
  rest of that tick's included. The stuck GPU gets no fresh fields while it is held
  (counted as ``gpu<N>_stalled``), nothing asks it anything more, and it rejoins the reads
  when its call returns. So a hung call costs its own GPU's fields and nothing else.
- the **loop thread** (``start()``) publishes at ``start + k * interval`` what the reader
  did not: it takes the fresh slots (waiting up to ``read_deadline`` only for reads that
  are late, never for a GPU that is stuck), samples the host, publishes the Snapshot. A
  tick that overruns skips the slots it missed instead of bunching ticks to catch up; so
  does the reader. While the reader publishes every tick itself, the loop does not wake at
  each tick to see that it did: it sleeps on an alarm (:mod:`gpuwatch.collect.alarm`, a
  timerfd) that each publication moves to the next tick's check time, so it wakes only
  when a tick is late. Where there is no timerfd it wakes at every tick.
- one **slow worker per GPU** runs the slow tier (PCIe throughput takes ~20 ms a
  direction, energy ~4 ms) every ``slow_interval``, triggered by the tick when due, so
  those calls never delay a tick; the newest slow values ride along in each tick's sample.
  The energy counter, more than half of the tier's CPU, is read on the rounds nearest
  ``energy_interval`` apart (60 s by default; every round at most).
- no thread waits for XID events: the reader polls the ones the driver queued (a wait of
  0 ms) after each tick is out (:class:`~gpuwatch.collect.nvml.XidWatcher`). A thread
  blocked in ``nvmlEventSetWait`` would have to wake every few hundred ms to see a stop,
  at 120–150 µs of CPU a wake on an H100. A poll stuck in NVML is rescued as a stuck read.
- an **NVML opener**, now and then: NVML that failed to start, that answers as if the
  driver went away (unloaded, reloaded, upgraded), or whose every GPU is lost, is started
  again on a thread of its own (``nvmlInit`` can hang) with backoff; the old reader is
  retired first and the old library shut down once no thread is inside it. The loop never
  waits for it, and the GPUs are exported as down meanwhile.

``tick()`` is synchronous and usable without ``start()`` (tests, benchmarks): it hands the
reader a request to read every GPU now and waits for the answers (up to
``read_deadline``), so it pays a hand-off that the loop does not;
benchmarks/bench_tick.py measures both.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Protocol

import psutil

from gpuwatch import threads
from gpuwatch.collect.alarm import Alarm, make_alarm
from gpuwatch.collect.nvml import ENERGY_CALL, GpuLost, Nvml, NvmlGone, NvmlGpu, XidWatcher
from gpuwatch.samples import GpuInfo, GpuProcess, GpuSample, Health, HostSample, Snapshot
from gpuwatch.store import Store

log = logging.getLogger(__name__)

MIN_INTERVAL = 0.1
MAX_INTERVAL = 60.0
# how long __init__ waits for every GPU's static facts before going on without the slow ones
PROBE_TIMEOUT = 5.0
# how long stop() waits, in all, for threads to leave NVML before giving up on them
STOP_TIMEOUT = 3.0
# how long before a tick's deadline the reader starts: a read takes ~0.1-0.3 ms per GPU, so
# the samples are ready when the tick publishes and it need not wait (or be woken) for them
READ_LEAD = 0.005
# a reader inside one GPU's calls this long (seconds, at most; see Sampler.stuck_after) is
# taken to be stuck there: a fresh reader takes the other GPUs over
STUCK_AFTER = 0.02
# the same for a GPU's first read of its static facts (GPM set-up makes it slower)
PROBE_STUCK_AFTER = 1.0
# a GPU whose read is this late (seconds) is said to be stuck, once; before, only counted
STALL_SAY_AFTER = 1.0
# NVML that failed to start, or stopped answering (the driver unloaded or reloaded), is
# started again after this many seconds, doubling up to the second figure: a driver that
# loads after the daemon is picked up without a restart
NVML_RETRY = (1.0, 60.0)

_LOST = "lost"  # a worker's answer for a GPU that just fell off
_GONE = "gone"  # a worker's answer when NVML itself stopped answering
_NOTHING: tuple[int, Any] = (-1, None)  # an answer not yet given


class HostSource(Protocol):
    def sample(self, t: float, gpu_pids: Collection[int] | Mapping[int, Collection[int]],
               mains: Collection[int] = ()) -> HostSample: ...


class _Bell:
    """A wake-up that is never lost: a ring before the wait makes the wait return at once.

    A bare lock used as a binary semaphore. threading.Event builds a Condition and a fresh
    lock on every wait, and these waits happen per GPU per tick.
    """

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def ring(self) -> None:
        try:
            self._lock.release()
        except RuntimeError:  # already rung, not yet heard: one ring is enough
            pass

    def wait(self, timeout: float | None = None) -> bool:
        """Until rung (True; the ring is used up) or ``timeout`` seconds (False)."""
        if timeout is None:
            return self._lock.acquire()
        return self._lock.acquire(timeout=max(timeout, 0.0))


class _FastGpu:
    """One GPU's per-tick reads: the sample it builds and what the tick reads back.

    A reader (:class:`_Reader`) calls it; ``held_by`` is the reader inside its NVML calls
    right now, so no other reader touches this GPU until that one is out.
    """

    def __init__(self, sampler: Sampler, gpu: NvmlGpu, slow: _SlowWorker) -> None:
        self.sampler = sampler
        self.gpu = gpu
        self.index = gpu.index
        self.slow = slow
        # (request number, GpuSample | _LOST | GpuInfo | None) of tick()/the probe
        self.answer: tuple[int, Any] = _NOTHING
        # (grid slot, GpuSample | _LOST | None, ns the read took), the loop's reads: one
        # tuple, so a reader never pairs one slot's number with another slot's sample
        self.slot: tuple[int, Any, int] = (-1, None, 0)
        self.held_by: _Reader | None = None
        self.reading: int | None = None  # the grid slot being read now (-1: a request)
        self.reads = 0  # grid reads, and their wall time (benchmarks)
        self.read_ns = 0
        self.uuid: str | None = None
        self.names = _ProcessNames()
        self._procs_key: Any = None  # what the last processes tuple was built from
        self._procs: tuple[GpuProcess, ...] = ()
        self.stalled_since: float | None = None  # monotonic, since the first late tick
        self.stall_said = False

    def held(self) -> bool:
        """Inside an NVML call of a reader that was taken to be stuck there."""
        r = self.held_by
        return r is not None and r.retired

    def serve(self, kind: str, t: float) -> Any:
        """A request's answer: the static facts ("probe") or a sample at ``t``."""
        if kind != "probe":
            return self._read(t)
        try:
            result = self.gpu.probe()
        except GpuLost:
            return _LOST
        except NvmlGone as err:
            self.sampler._nvml_gone(err.reason)
            return None
        except Exception:
            self.sampler._count(f"gpu{self.index}")
            log.exception("GPU %d: probe failed", self.index)
            return None
        self.uuid = result.uuid
        self.sampler._info_changed()
        return result

    def _read(self, t: float) -> Any:
        """This GPU's sample at ``t``: a GpuSample, _LOST, or None when the read failed."""
        try:
            fast = self.gpu.read_fast()
            return self._build(t, fast)
        except GpuLost:
            self.sampler._gpu_lost(self.gpu)
            return _LOST
        except NvmlGone as err:
            self.sampler._nvml_gone(err.reason)
            return _GONE
        except Exception:
            self.sampler._count(f"gpu{self.index}")
            log.exception("GPU %d: read failed", self.index)
            return None

    def _build(self, t: float, fast: dict[str, Any]) -> GpuSample:
        slow = self.slow
        # fields before proc_util: the slow worker replaces them in the other order, so
        # processes are at least as new as the fields they go with
        slow_fields = slow.fields
        procs = fast.pop("processes", ())
        if procs or self._procs_key is not None:
            proc_util = slow.proc_util
            key = (procs, proc_util)
            if key != self._procs_key:  # mostly the same processes as last tick: reuse
                self._procs = self._processes(procs, proc_util)
                self._procs_key = key if procs else None
        xids = self.sampler._xid.totals(self.index) if self.sampler._xid is not None else {}
        if slow_fields:
            fast = {**slow_fields, **fast}
        return GpuSample(t=t, gpu=self.index, uuid=self.uuid, processes=self._procs,
                         xid_total=xids, **fast)

    def _processes(self, procs: tuple[tuple[int, int | None], ...],
                   proc_util: dict[int, float]) -> tuple[GpuProcess, ...]:
        names = self.names.lookup([pid for pid, _mem in procs])
        return tuple(
            GpuProcess(pid=pid, mem_used_bytes=mem, sm_util=proc_util.get(pid),
                       name=names.get(pid, (None, None))[0], user=names.get(pid, (None, None))[1])
            for pid, mem in procs)


XID_POLL = object()  # a reader's ``current`` while it polls the XID events


class _Reader:
    """The thread that reads the GPUs one after another: each grid slot while the loop
    runs, and the requests of tick() and the probe. Normally one for all GPUs; one that
    gets stuck inside a GPU's call is retired (:meth:`Sampler._rescue`) and leaves once
    the call returns."""

    def __init__(self, sampler: Sampler, next_slot: int = 0, served: int = 0) -> None:
        self.sampler = sampler
        self.bell = _Bell()
        self.retired = False
        # the GPU whose calls it is inside now (XID_POLL: the XID events'), or None
        self.current: _FastGpu | object | None = None
        self.since = 0.0  # perf_counter when it went in
        self.next_slot = next_slot
        self.served = served  # the newest request number served in full
        self.thread = threads.Thread(target=self._run, name="gpuwatch-gpu-reader",
                                     daemon=True)

    def _run(self) -> None:
        s = self.sampler
        stop = s._stop
        clock = s._clock
        while not stop.is_set() and not self.retired:
            req = s._request
            if req is not None and req[0] > self.served:
                self._serve(req)
                continue
            grid = s._grid
            if grid is None:
                self.bell.wait()
                continue
            start, interval, lead = grid
            now = clock()
            # the next slot whose tick is still ahead or still waiting for late reads;
            # slots missed meanwhile are skipped, as the loop skips them
            slot = max(self.next_slot, math.ceil((now - start - s.read_deadline) / interval))
            due = start + slot * interval - lead
            if due > now and self.bell.wait(due - now):
                continue  # a request, a stop or a new grid: look again
            self._sweep(slot)
            self.next_slot = slot + 1

    def _enter(self, g: _FastGpu, reading: int) -> None:
        self.since = time.perf_counter()
        g.held_by = self
        g.reading = reading
        self.current = g

    def _leave(self, g: _FastGpu) -> None:
        self.current = None
        g.reading = None
        g.held_by = None

    def _sweep(self, slot: int) -> None:
        s = self.sampler
        t = s._slot_time(slot)
        for g in s._fast:
            if self.retired:
                return
            # lost, held by a stuck reader, or read already by the reader before this one
            if g.gpu.lost or g.held_by is not None or g.slot[0] >= slot:
                continue
            self._enter(g, slot)
            woke = time.perf_counter_ns()
            result = g._read(t)
            took = time.perf_counter_ns() - woke
            g.slot = (slot, result, took)  # before leaving: no other reader reads it again
            self._leave(g)
            g.read_ns += took
            g.reads += 1
            if s._collecting:  # the tick is waiting for late reads: tell it
                s._collected.ring()
        if s.reader_publishes and s._grid is not None and not self.retired:
            s._publish_read(slot)
        self._poll_xid()

    def _poll_xid(self) -> None:
        """The XID events queued since the last tick, once the tick is out. A poll stuck
        in NVML is rescued as a stuck read is: the loop retires this reader and a fresh
        one reads the GPUs (the watcher keeps it out of the events meanwhile)."""
        xid = self.sampler._xid
        if xid is None or self.retired:
            return
        self.since = time.perf_counter()
        self.current = XID_POLL
        try:
            xid.poll()
        finally:
            self.current = None

    def _serve(self, req: tuple[int, str, float]) -> None:
        s = self.sampler
        number, kind, t = req
        for g in s._fast:
            if self.retired:
                return
            if g.gpu.lost or g.held_by is not None or g.answer[0] == number:
                continue
            self._enter(g, -1)
            result = g.serve(kind, t)
            g.answer = (number, result)
            self._leave(g)
        self.served = number
        s._collected.ring()
        if kind != "probe":
            self._poll_xid()


class _SlowWorker:
    """The thread that runs one GPU's slow tier when the tick says it is due."""

    def __init__(self, gpu: NvmlGpu, stop: threading.Event, on_error: Callable[[str], None],
                 energy_every: int = 1):
        self.gpu = gpu
        self.stop = stop
        self.on_error = on_error
        # the energy counter on the first round and every energy_every-th after it; the
        # rounds between carry its last value, so the series never drops out
        self.energy_every = max(1, energy_every)
        self.rounds = 0
        self.trigger = threading.Event()
        self.running = False
        self.retired = False
        self.fields: dict[str, Any] = {}  # replaced whole, so readers never see half of it
        self.proc_util: dict[int, float] = {}
        self.thread = threads.Thread(target=self._run, name=f"gpuwatch-gpu{gpu.index}-slow",
                                     daemon=True)

    def _run(self) -> None:
        while True:
            self.trigger.wait()
            # running goes up before the trigger goes down: the tick must never see neither
            self.running = True
            self.trigger.clear()
            if self.stop.is_set() or self.retired:
                return
            energy = self.rounds % self.energy_every == 0
            try:
                fields = self.gpu.read_slow(energy=energy)
                proc_util = self.gpu.read_process_utilization()
            except (GpuLost, NvmlGone):
                return  # the fast worker says so, once
            except Exception:
                self.on_error(f"gpu{self.gpu.index}")
                log.exception("GPU %d: slow read failed", self.gpu.index)
            else:
                if not energy:
                    self.rounds += 1
                    if "energy_joules" in self.fields:
                        fields["energy_joules"] = self.fields["energy_joules"]
                elif "energy_joules" in fields or ENERGY_CALL in self.gpu.unsupported:
                    self.rounds += 1
                # else the counter did not answer: the next round asks it again (and the
                # rounds between carry only a value read)
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
        if not pids:
            self._cache = {}
            return {}
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
    """Samples every GPU (through :mod:`gpuwatch.collect.nvml`) and the host into a Store."""

    def __init__(self, store: Store, *, interval: float = 1.0, slow_interval: float = 30.0,
                 energy_interval: float = 60.0,
                 nvml_module: object | None = None, host: object | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 nvml_retry: tuple[float, float] = NVML_RETRY) -> None:
        if not MIN_INTERVAL <= interval <= MAX_INTERVAL:
            raise ValueError(f"interval must be {MIN_INTERVAL} to {MAX_INTERVAL} s, got {interval}")
        if slow_interval <= 0:
            raise ValueError(f"slow_interval must be positive, got {slow_interval}")
        self.store = store
        self.interval = float(interval)
        self.slow_interval = float(slow_interval)
        if energy_interval <= 0:
            raise ValueError(f"energy_interval must be positive, got {energy_interval}")
        # the energy counter on every k-th slow round: the nearest k to energy_interval,
        # at least every round
        self.energy_every = max(1, round(energy_interval / self.slow_interval))
        self._clock = clock
        # a tick waits this long (real time) for late GPU reads; the rest of the slot is slack
        self.read_deadline = min(max(0.5 * self.interval, 0.05), 2.0)
        # a reader inside one GPU's calls this long is stuck there: others take over (well
        # within the deadline, so the other GPUs' reads still make their tick)
        self.stuck_after = min(STUCK_AFTER, self.read_deadline / 3)
        self._stop = threading.Event()
        # the loop sleeps on a bare lock that stop() rings: Event.wait builds a Condition
        # and a lock on every call, once per tick (tests inject simulated time)
        self._stop_bell = _Bell()
        self._wait: Callable[[float], bool] = self._sleep
        self._tick_lock = threading.Lock()
        self._err_lock = threading.Lock()
        self._host_failed = False  # the last host read raised (logged once per episode)
        self._errors: Counter[str] = Counter()
        self._error_count = 0  # errors ever counted: "did any happen since?" without a sum
        self._errors_seen = 0  # _error_count at the last tick
        self._errors_view: dict[str, int] = {}  # a copy for Health, rebuilt when it changes
        self._ticks = 0
        self._request_no = 0
        self._last_success: float | None = None
        self._next_slow: float | None = None
        self._loop: threading.Thread | None = None
        # (start, interval, lead) of the tick grid while the loop runs: the reader reads on it
        self._grid: tuple[float, float, float] | None = None
        # (number, "read" or "probe", t): the newest request of tick() or the probe
        self._request: tuple[int, str, float] | None = None
        # wall time of each grid slot, set by whichever thread gets there first, so every
        # sample of a tick and its Snapshot carry one t
        self._slot_t: dict[int, float] = {}
        self._collected = _Bell()  # rung by the reader when answers or a late read are in
        self._collecting = False  # the loop is waiting for late reads
        self._published = -1  # the newest grid slot published
        self._by_reader = -1  # the newest grid slot the reader published itself
        # while the loop runs on the real clock: the reader moves it to the next tick's check
        # time as it publishes, and the loop sleeps on it (the module docstring)
        self._alarm: Alarm | None = None
        # the reader publishes a tick itself once every GPU's read is in, so the loop only
        # looks after it (a tick whose reads are late or stuck); off, the loop publishes
        # every tick (tests that drive the loop's clock)
        self.reader_publishes = True
        self._info_lock = threading.Lock()
        self.skipped_slots = 0  # ticks skipped because an earlier one overran
        self.host = self._make_host(host)

        self._nvml_module = nvml_module
        self._nvml_retry = nvml_retry
        self._retry_wait = nvml_retry[0]
        self._reopen_due: float | None = None  # when to start NVML again (monotonic clock)
        self._reopen_thread: threading.Thread | None = None
        self._gone_lock = threading.Lock()
        self._fast: list[_FastGpu] = []
        self._slow: list[_SlowWorker] = []
        self._reader: _Reader | None = None
        # readers taken to be stuck inside a GPU's call (they end once it returns)
        self._stuck: list[_Reader] = []
        self._xid: XidWatcher | None = None  # polled by the reader after each tick
        self.infos: tuple[GpuInfo, ...] = ()
        self.nvml_restarts = 0  # times NVML was started again after it stopped answering
        self._retired_threads: list[threading.Thread] = []
        self._retired_nvml: Nvml | None = None
        self._lost_said: set[int] = set()
        self._nvml = Nvml(nvml_module, on_error=self._count, said_lost=self._lost_said)
        self.nvml_available = self._nvml.open()
        if not self.nvml_available:
            # once per daemon: the reason is the same on every tick; the retries say nothing
            # until one succeeds
            self._count("nvml")
            retry = (f"; trying again every {self._nvml_retry[1]:g} s at most"
                     if self._nvml.retryable else "")
            log.warning("no NVIDIA GPU/driver found (%s); sampling host metrics only%s",
                        self._nvml.reason, retry)
            if self._nvml.retryable:
                self._reopen_due = self._clock() + self._retry_wait
            return
        self._attach()

    # -- public ---------------------------------------------------------------------------
    def start(self) -> None:
        """Tick in the background until stop()."""
        if self._loop is not None:
            return
        if self._clock is time.monotonic and self._wait == self._sleep:
            self._alarm = make_alarm()  # (a simulated clock or wait: the loop wakes every tick)
        self._loop = threads.Thread(target=self._run, name="gpuwatch-sampler", daemon=True)
        self._loop.start()

    def stop(self) -> None:
        """Stop every thread (promptly: none sleeps longer than a wait timeout) and NVML."""
        self._stop.set()
        self._stop_bell.ring()
        alarm = self._alarm
        if alarm is not None:
            try:
                alarm.fire_now()
            except OSError:
                pass
        self._grid = None
        if self._reader is not None:
            self._reader.bell.ring()
        for s in self._slow:
            s.trigger.set()
        deadline = time.monotonic() + STOP_TIMEOUT
        with self._gone_lock:  # no NVML restart adds workers from here on
            ours = [t for t in (self._loop, self._reopen_thread) if t is not None]
            ours += [r.thread for r in (self._reader, *self._stuck) if r is not None]
            ours += [s.thread for s in self._slow]
            ours += self._retired_threads
        stuck = []
        for t in ours:
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
        if alarm is not None and not (self._loop is not None and self._loop.is_alive()):
            self._alarm = None  # (a stuck reader that publishes still finds None)
            alarm.close()

    def tick(self) -> Snapshot:
        """One tick now: read every GPU and the host, publish the Snapshot, return it.

        Synchronous: each GPU's worker is handed its read and answers (see the module
        docstring). The loop started by start() publishes without that hand-off.
        """
        with self._tick_lock:
            started = time.perf_counter()
            t = time.time()
            # after stop() the workers are gone and NVML is shut: host only
            gpus = self._tick_gpus(t) if self._fast and not self._stop.is_set() else ()
            return self._publish(t, gpus, started, 0.0)

    # -- the loop ---------------------------------------------------------------------------
    def _sleep(self, seconds: float) -> bool:
        """Sleep ``seconds``; True when stop() was called."""
        if self._stop.is_set():
            return True
        self._stop_bell.wait(seconds)
        return self._stop.is_set()

    def _run(self) -> None:
        start = self._clock()
        interval = self.interval
        self._grid = (start, interval, READ_LEAD)
        if self._reader is not None:
            self._reader.bell.ring()  # from now on it keeps the grid itself
        alarm = self._alarm
        slot = 0
        try:
            while not self._stop.is_set():
                self._maybe_reopen()
                try:
                    self._tick_slot(slot)
                except Exception:  # never let one bad tick end the loop
                    self._count("tick")
                    log.exception("tick failed")
                now = self._clock()
                # the next slot on the grid that is still ahead: overrun slots are skipped
                due = max(slot + 1, math.floor((now - start) / interval) + 1)
                # the reader publishes a slot whose reads are all in before its time is
                # up: the loop looks a little after, only to see that it did
                after = READ_LEAD if self.reader_publishes and self._reader is not None else 0.0
                if alarm is not None and after and self._by_reader >= slot:
                    # the reader published this tick itself, and with it set the alarm to
                    # the next tick's check time: sleep until a tick is late, not to each
                    try:
                        alarm.wait()
                    except OSError:  # never left without a clock: back to waking each tick
                        self._count("tick")
                        log.exception("the sampler's alarm failed; waking at every tick")
                        alarm = self._alarm = None
                    if self._stop.is_set():
                        return
                    now = self._clock()
                    # the newest slot whose check time has passed: the reader published the
                    # ones before it (an early expiry leaves the next slot to wait for)
                    due = max(due, math.floor((now - start - after) / interval))
                slot = due
                if self._wait(start + slot * interval + after - now):
                    return
        finally:
            self._grid = None  # no loop, no grid: the reader waits for requests again
            if self._reader is not None:
                self._reader.bell.ring()

    def _tick_slot(self, slot: int) -> None:
        """The loop's tick: the reader has read (or is reading) this slot already, and
        published it if every read was in (then there is nothing left to do)."""
        with self._tick_lock:
            if slot <= self._published:
                return
            started = time.perf_counter()
            t = self._slot_time(slot)
            gpus: tuple[GpuSample, ...] = ()
            read_seconds = 0.0
            if self._fast and not self._stop.is_set():
                gpus, read_seconds = self._gather(slot, t)
            self._publish(t, gpus, started, read_seconds)
            self._published_slot(slot)

    def _publish_read(self, slot: int) -> None:
        """The reader's publish, right after its sweep: only when every present GPU's read
        of ``slot`` is in. Otherwise (a GPU stuck or late) the loop publishes it, waiting
        as long as it may for late reads; so it does when it holds the tick already."""
        if not self._tick_lock.acquire(blocking=False):
            return
        try:
            if slot <= self._published or self._stop.is_set():
                return
            results: dict[int, Any] = {}
            read_ns = 0
            for g in self._fast:
                if g.gpu.lost:
                    continue
                number, result, took = g.slot
                if number != slot:
                    return
                results[g.index] = result
                if took > read_ns:
                    read_ns = took
            started = time.perf_counter()
            for g in self._fast:
                if g.stalled_since is not None and g.index in results:
                    self._unstalled(g)
            self._trigger_slow()
            t = self._slot_time(slot)
            self._publish(t, self._assemble(t, results), started, read_ns / 1e9)
            self._published_slot(slot)
            self._by_reader = slot
            alarm = self._alarm
            if alarm is not None:
                # the loop's next look: the next tick's check time, unless this moves it again
                grid = self._grid
                if grid is not None:
                    try:
                        alarm.set_at(grid[0] + (slot + 1) * grid[1] + grid[2])
                    except OSError:  # (closed by stop()) else it fires when last set
                        if not self._stop.is_set():
                            self._count("tick")
        finally:
            self._tick_lock.release()

    def _published_slot(self, slot: int) -> None:
        # slots between two published ones were skipped (a tick or a read overran)
        if self._published >= 0 and slot > self._published + 1:
            self.skipped_slots += slot - self._published - 1
        self._published = slot
        self._forget_slots(slot)

    def _forget_slots(self, slot: int) -> None:
        # this slot's time and any a late reader set after an earlier tick
        for old in [k for k in list(self._slot_t) if k <= slot]:
            self._slot_t.pop(old, None)

    def _slot_time(self, slot: int) -> float:
        # setdefault is atomic: the first thread to ask stamps the slot for all
        return self._slot_t.setdefault(slot, time.time())

    def _gather(self, slot: int, t: float) -> tuple[tuple[GpuSample, ...], float]:
        """This slot's fresh samples, waiting only for reads that are late, not stuck."""
        self._trigger_slow()
        results: dict[int, Any] = {}
        read_ns = 0
        late: list[_FastGpu] = []
        stuck: list[_FastGpu] = []
        for g in self._fast:
            if g.gpu.lost:
                continue
            number, result, took = g.slot
            if number == slot:
                results[g.index] = result
                read_ns = max(read_ns, took)
                if g.stalled_since is not None:
                    self._unstalled(g)
            elif g.held() or (g.reading is not None and g.reading < slot):
                stuck.append(g)  # stuck in an earlier read
            else:
                late.append(g)
        if late:
            self._collecting = True
            self._collected.wait(0)  # a stale ring from an earlier tick
            deadline = time.monotonic() + self.read_deadline
            try:
                while late:
                    late = [g for g in late if g.slot[0] != slot]
                    # a reader stuck in one GPU: a fresh one reads the others in time
                    self._rescue(self.stuck_after)
                    remaining = deadline - time.monotonic()
                    if not late or remaining <= 0:
                        break
                    self._collected.wait(min(remaining, self.stuck_after / 2))
            finally:
                self._collecting = False
            for g in self._fast:
                number, result, took = g.slot
                if g.index not in results and number == slot:
                    results[g.index] = result
                    read_ns = max(read_ns, took)
        for g in (*stuck, *late):
            if g.index not in results:
                self._stalled(g)
        # the tick's critical path: its slowest read, then the rest of the tick
        return self._assemble(t, results), read_ns / 1e9

    def _publish(self, t: float, gpus: tuple[GpuSample, ...], started: float,
                 read_seconds: float) -> Snapshot:
        on_gpus, mains = gpu_processes(gpus)
        host = self._sample_host(t, on_gpus, mains)
        self._ticks += 1
        errors = self._errors_view
        if self._error_count != self._errors_seen:  # errors since the last tick
            with self._err_lock:
                self._errors_seen = self._error_count
                errors = self._errors_view = dict(self._errors)
        else:
            self._last_success = t
        health = Health(ticks_total=self._ticks,
                        tick_seconds=time.perf_counter() - started + read_seconds,
                        errors_total=errors, last_success_time=self._last_success)
        snapshot = Snapshot(t=t, gpus=gpus, infos=self.infos, host=host, health=health,
                            nvml_available=self.nvml_available)
        try:
            self.store.publish(snapshot)
        except Exception:
            self._count("store")
            log.exception("publishing a snapshot failed")
        return snapshot

    # -- NVML starting, stopping answering, starting again -----------------------------------------
    def _attach(self) -> None:
        """Workers for the GPUs of the freshly opened ``self._nvml``; their static facts."""
        nvml = self._nvml
        if not nvml.gpus:
            log.warning("NVML found no GPU; sampling host metrics only")
        with self._gone_lock:
            if self._stop.is_set():
                return
            # before the workers: their samples read the XID totals
            self._xid = XidWatcher(nvml) if nvml.gpus else None
            slow = [_SlowWorker(gpu, self._stop, self._count, self.energy_every)
                    for gpu in nvml.gpus]
            fast = [_FastGpu(self, gpu, sw) for gpu, sw in zip(nvml.gpus, slow, strict=True)]
            reader = _Reader(self, served=self._request_no) if fast else None
            self._slow, self._fast, self._reader = slow, fast, reader
            self.infos = tuple(gpu.info for gpu in nvml.gpus)
            # up before the reader starts: it publishes ticks of its own from its first
            self.nvml_available = True
            # the static facts are asked for before it starts, so it answers them before
            # any tick's read (a sample carries its GPU's uuid)
            number, handed = self._hand("probe", 0.0)
            for thread in [sw.thread for sw in slow] + ([reader.thread] if reader else []):
                thread.start()
        self._probe(number, handed)
        for w in fast:
            if not w.gpu.lost:
                self._lost_said.discard(w.index)
        self._check_all_lost()

    def _nvml_gone(self, reason: str) -> None:
        """NVML answered as if the driver went away: retire every worker, start it again."""
        with self._gone_lock:
            if self._reopen_due is not None or not self.nvml_available:
                return  # already being dealt with (every GPU's worker says so)
            self._count("nvml")
            log.warning("NVML stopped answering (%s): the driver was unloaded or reloaded; "
                        "starting NVML again (GPUs are reported down meanwhile)", reason)
            self.nvml_available = False
            self._retire()
            self._retry_wait = self._nvml_retry[0]
            self._reopen_due = self._clock()  # at once: a reload is usually over by now

    def _gpu_lost(self, gpu: NvmlGpu) -> None:
        """Once every GPU is lost, NVML is started again later (a GPU reset, or a driver
        reload that answers GPU_IS_LOST, may bring them back)."""
        self._check_all_lost()

    def _check_all_lost(self) -> None:
        with self._gone_lock:
            fast = self._fast
            if (fast and all(w.gpu.lost for w in fast) and self._reopen_due is None
                    and self.nvml_available and not self._stop.is_set()):
                self.nvml_available = False
                self._retire()
                # doubling from try to try: a GPU off the bus stays lost, and each try costs
                # an nvmlInit
                self._reopen_due = self._clock() + self._retry_wait
                self._retry_wait = min(self._retry_wait * 2, self._nvml_retry[1])

    def _retire(self) -> None:
        """Stop the current workers (under _gone_lock); NVML is closed once they are out."""
        readers = [r for r in (self._reader, *self._stuck) if r is not None]
        for r in readers:
            r.retired = True
            r.bell.ring()
        for sw in self._slow:
            sw.retired = True
            sw.trigger.set()
        self._retired_threads = [r.thread for r in readers] + [sw.thread for sw in self._slow]
        self._retired_nvml = self._nvml
        # the GPUs stay known (infos), without samples: exported as down, not vanished
        self._fast, self._slow, self._xid, self._reader, self._stuck = [], [], None, None, []

    def _maybe_reopen(self) -> None:
        """On the loop: start NVML again when due, on a thread of its own (nvmlInit can hang)."""
        due = self._reopen_due
        if due is None or self._clock() < due:
            return
        running = self._reopen_thread
        if running is not None and running.is_alive():
            return
        self._reopen_due = None
        self._reopen_thread = threads.Thread(target=self._reopen, name="gpuwatch-nvml-open",
                                             daemon=True)
        self._reopen_thread.start()

    def _reopen(self) -> None:
        old = self._retired_nvml
        if old is not None:
            deadline = time.monotonic() + STOP_TIMEOUT
            for t in self._retired_threads:
                t.join(max(0.0, deadline - time.monotonic()))
            if any(t.is_alive() for t in self._retired_threads):
                log.warning("threads still inside NVML; starting it again without shutting "
                            "the old one down")
            else:
                old.close()
            self._retired_nvml = None
            self._retired_threads = []
        if self._stop.is_set():
            return
        nvml = Nvml(self._nvml_module, on_error=self._count, said_lost=self._lost_said)
        if not nvml.open():
            log.debug("NVML still not available: %s", nvml.reason)
            with self._gone_lock:
                self._retry_wait = min(self._retry_wait * 2, self._nvml_retry[1])
                self._reopen_due = self._clock() + self._retry_wait
            return
        self._nvml = nvml
        self.nvml_restarts += 1
        if self._stop.is_set():
            return
        # said before the reader starts: its first tick may be published before _attach
        # returns
        log.info("NVML is up (driver %s): sampling %d GPU(s)", nvml.driver_version,
                 len(nvml.gpus))
        self._attach()

    # -- GPUs -----------------------------------------------------------------------------------
    def _hand(self, kind: str, t: float) -> tuple[int, list[_FastGpu]]:
        """Ask the reader to read (or probe) every free, present GPU; the ones held by a
        stuck reader count as stalled."""
        self._request_no += 1
        number = self._request_no
        handed = []
        for g in self._fast:
            if g.gpu.lost:
                continue
            if g.held():  # still inside an earlier read: no more work until it is back
                self._stalled(g)
                continue
            handed.append(g)
        self._collected.wait(0)  # a stale ring from an earlier tick
        self._request = (number, kind, t)
        if self._reader is not None:
            self._reader.bell.ring()
        return number, handed

    def _answers(self, number: int, handed: list[_FastGpu], timeout: float,
                 stuck_after: float) -> dict[int, Any]:
        deadline = time.monotonic() + timeout
        waiting = handed
        while True:
            waiting = [g for g in waiting if g.answer[0] != number]
            remaining = deadline - time.monotonic()
            if not waiting or remaining <= 0:
                break
            self._rescue(stuck_after)  # a reader stuck in one GPU: a fresh one asks the rest
            self._collected.wait(min(remaining, stuck_after / 2))
        return {g.index: g.answer[1] for g in handed if g.answer[0] == number}

    def _rescue(self, stuck_after: float) -> None:
        """A reader inside one GPU's call for ``stuck_after`` seconds is left to it: a fresh
        reader takes the other GPUs over, this tick's reads and request included. The old
        one leaves once the call returns (the GPU it holds rejoins then)."""
        r = self._reader
        if r is None or r.current is None or time.perf_counter() - r.since < stuck_after:
            return
        with self._gone_lock:
            if self._reader is not r or r.current is None or self._stop.is_set():
                return
            r.retired = True
            self._stuck = [x for x in self._stuck if x.thread.is_alive()] + [r]
            fresh = _Reader(self, next_slot=r.next_slot, served=r.served)
            self._reader = fresh
            fresh.thread.start()

    def _probe(self, number: int, handed: list[_FastGpu]) -> None:
        """Wait for the static facts asked for (``_hand("probe")``)."""
        if not handed:
            return
        answers = self._answers(number, handed, PROBE_TIMEOUT, PROBE_STUCK_AFTER)
        for w in handed:
            if w.index not in answers:
                self._count(f"gpu{w.index}_stalled")
                log.warning("GPU %d: static facts did not come back within %.0f s; "
                            "it is left alone while NVML is stuck on it", w.index, PROBE_TIMEOUT)

    def _stalled(self, w: _FastGpu) -> None:
        """A tick without this GPU's read: counted every time, said once per stall that
        lasts (a read merely late on a busy host is counted, not said)."""
        self._count(f"gpu{w.index}_stalled")
        now = time.monotonic()
        if w.stalled_since is None:
            w.stalled_since = now
        if not w.stall_said and now - w.stalled_since >= STALL_SAY_AFTER:
            w.stall_said = True
            log.warning("GPU %d: an NVML call has not returned; its fields are left out "
                        "until it does (counted in gpuwatch_errors_total{source=\"gpu%d_stalled\"})",
                        w.index, w.index)

    def _unstalled(self, w: _FastGpu) -> None:
        since, w.stalled_since = w.stalled_since, None
        said, w.stall_said = w.stall_said, False
        if since is not None and said:
            log.info("GPU %d answers again after %.1f s", w.index, time.monotonic() - since)

    def _info_changed(self) -> None:
        # a worker's probe answered (perhaps late, after being stuck at start)
        with self._info_lock:
            self.infos = tuple(gpu.info for gpu in self._nvml.gpus)

    def _tick_gpus(self, t: float) -> tuple[GpuSample, ...]:
        number, handed = self._hand("read", t)
        self._trigger_slow()
        results = self._answers(number, handed, self.read_deadline, self.stuck_after)
        for w in handed:
            if w.index not in results:
                self._stalled(w)
            elif w.stalled_since is not None:
                self._unstalled(w)
        return self._assemble(t, results)

    def _assemble(self, t: float, results: dict[int, Any]) -> tuple[GpuSample, ...]:
        """One sample per GPU: read ones as read, the others lost or with slow fields only."""
        samples = []
        for w in self._fast:
            result = results.get(w.index)
            if isinstance(result, GpuSample) and not w.gpu.lost:
                samples.append(result)
                continue
            xids = self._xid.totals(w.index) if self._xid is not None else {}
            if w.gpu.lost or result is _LOST:
                samples.append(GpuSample(t=t, gpu=w.index, uuid=w.uuid, lost=True,
                                         xid_total=xids))
            else:  # stalled or failed: no fresh fields, the newest slow ones carried
                samples.append(GpuSample(t=t, gpu=w.index, uuid=w.uuid, xid_total=xids,
                                         **w.slow.fields))
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
            from gpuwatch.collect.host import HostSampler

            return HostSampler()
        except Exception as err:  # noqa: BLE001 - GPU metrics still flow
            log.warning("host metrics not available: %s", err)
            return None

    def _sample_host(self, t: float, pids: Mapping[int, Collection[int]],
                     mains: Collection[int] = ()) -> HostSample | None:
        if self.host is None:
            return None
        try:
            sample = self.host.sample(t, pids, mains)
        except Exception:
            self._count("host")
            # a host read that keeps failing would log a traceback every tick: the first
            # one says why, the rest are counted (gpuwatch_errors_total{source="host"})
            if not self._host_failed:
                self._host_failed = True
                log.exception("host sample failed (counted from now on, not logged again "
                              "until it recovers)")
            return None
        if self._host_failed:
            self._host_failed = False
            log.info("host sampling recovered")
        return sample

    def _count(self, source: str) -> None:
        with self._err_lock:
            self._errors[source] += 1
            self._error_count += 1


def gpu_processes(gpus: Iterable[GpuSample]) -> tuple[dict[int, list[int]], list[int]]:
    """The processes NVML lists, each with the GPUs it is on; and each GPU's main process:
    the one holding the most of its memory (its rank, not a launcher's or a worker's stray
    CUDA context), which the host layer makes the root of its own job tree."""
    on_gpus: dict[int, list[int]] = {}
    mains: list[int] = []
    for g in gpus:
        best: tuple[int, int] | None = None
        for p in g.processes:
            on_gpus.setdefault(p.pid, []).append(g.gpu)
            key = (p.mem_used_bytes or 0, -p.pid)
            if best is None or key > best:
                best = key
        if best is not None and -best[1] not in mains:
            mains.append(-best[1])
    return on_gpus, mains


__all__ = ["MAX_INTERVAL", "MIN_INTERVAL", "Sampler", "gpu_processes"]
