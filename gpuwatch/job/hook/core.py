"""The in-process torch hook: measures a training loop from inside and reports to gpuwatch.

``attach()`` (public as ``gpuwatch.torch.attach()``, or injected by ``gpuwatch run --``)
installs light wrappers around a few torch entry points and reports aggregated numbers
twice a second over a Unix datagram socket (schema: :mod:`gpuwatch.job.protocol`):

- an iteration ends at each optimizer step (torch's global optimizer step post hook), or,
  with an enabled ``GradScaler``, at ``scaler.update()``, so that a step the scaler skipped
  (``optimizer.step()`` never ran) still counts, marked skipped; a loop that never steps an
  optimizer (parameters updated by hand) ends its iterations at the end of each top-level
  ``backward()`` instead (config fact ``step_source``);
- time blocked in the DataLoader (creating an iterator, and its ``__next__``) is the
  iteration's data wait; the first batch of each new iterator is marked;
- the loss scale, the skip flags of fused optimizers (decided on the GPU) and the
  allocator's memory are read by the reporting thread, once per report, with an
  asynchronous copy and an event (never a device synchronization);
- configuration facts (DataLoader settings, autocast, TF32, cudnn.benchmark, fused
  optimizer, gradient checkpointing, the GPU) ride along when they change;
- an uncaught exception (an out-of-memory error above all) is reported before the
  process dies, and a last report leaves at exit.

Guarantees: the training loop never blocks on gpuwatch (non-blocking ``sendto``; a missing,
slow or dead daemon only costs dropped reports, which are counted), no exception of the
hook's own reaches user code (every hook body is guarded), and results do not change (the
wrappers call the original with the original arguments and return its result).

This is the only gpuwatch module that imports torch.
"""

# The hook runs inside the user's training process: every hook body catches everything
# (and counts it) so that no error of gpuwatch's reaches user code.
# ruff: noqa: BLE001, S110

from __future__ import annotations

import atexit
import collections
import functools
import multiprocessing.process
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint
import torch.utils.data
import torch.utils.data.dataloader
from torch.amp.grad_scaler import GradScaler
from torch.optim.optimizer import register_optimizer_step_post_hook

from gpuwatch.job import protocol

ENV_SOCKET = "GPUWATCH_SOCKET"  # one path, or several separated by os.pathsep
SYSTEM_SOCKET = "/run/gpuwatch/hook.sock"
REPORT_INTERVAL = 0.5  # seconds: at most two reports a second
HEARTBEAT_INTERVAL = 2.0  # a report even without new steps, so silence means trouble
# With an optimizer built but not stepped yet, backward() ends are held this long (or this
# many) before they count as iterations: gradient accumulation and GANs call backward()
# several times before the first step, and counting those too would count twice.
BACKWARD_GRACE = 10.0  # seconds
MAX_HELD_BACKWARDS = 10_000
OPTIMIZER = "optimizer"  # step_source values
BACKWARD = "backward"
CONFIG_INTERVAL = 30.0  # the configuration again, for a daemon started after the job
MAX_PENDING_STEPS = 100_000  # per-step records waiting for the reporter (older ones dropped)
MAX_HOOK_ERRORS = 100  # after this many internal errors the hook stops measuring

_perf = time.perf_counter
# what a forked child inherited from its parent's hook: kept alive for good (after_fork)
_inherited: list[dict[str, Any]] = []
_hook: _Hook | None = None
_attach_lock = threading.Lock()

# (what, attribute, original, wrapper) for every patch, so detach() can undo them
_patches: list[tuple[Any, str, Any, Any]] = []


def _socket_paths(explicit: str | None) -> list[str]:
    text = explicit or os.environ.get(ENV_SOCKET) or SYSTEM_SOCKET
    return [p for p in text.split(os.pathsep) if p]


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    # the CPU allocator raises a plain RuntimeError
    return isinstance(exc, RuntimeError) and ("out of memory" in str(exc)
                                              or "can't allocate memory" in str(exc))


_PENDING = object()  # a step's loss while its copy from the device is under way


class _Flags:
    """Skip flags of one iteration that are still tensors (a fused optimizer's found_inf)."""

    __slots__ = ("submitted", "tensors")

    def __init__(self, tensors: list[Any]) -> None:
        self.tensors = tensors
        self.submitted = False


class _Hook:
    """All state of the hook in one process. Hot-path methods are kept tiny."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        self._reset()

    def _reset(self) -> None:
        """Fresh state: at attach, and in a forked child (which is a process of its own)."""
        self.pid = os.getpid()
        self.off = False
        # -- written by the training thread (hot path) --
        self.n = 0  # iterations finished
        self.skipped_known = 0  # skips known at step time
        self.iter_start: float | None = None  # perf_counter at the end of the last iteration
        self.wait = 0.0  # data wait in the current iteration
        self.samples: int | None = None  # samples fetched in the current iteration
        self.firsts = 0  # new DataLoader iterators whose first batch came in this iteration
        self.first_wait = 0.0  # their data wait (creating them included)
        self.loader: tuple[int | None, dict[str, Any]] | None = None  # last loader used
        self.loader_seen = False
        self.loader_made = False  # a DataLoader iterator was created in this process
        self.active = False  # built a model, an optimizer or a loader: a process that trains
        self.source: str | None = None  # what ends an iteration: OPTIMIZER or BACKWARD
        self.optimizer_made = False
        self.depth = 0  # nested backward() calls (reentrant checkpointing runs one inside)
        # backward() ends held while undecided: (end, and the iteration's wait, samples,
        # firsts and first_wait so far)
        self.held_backwards: list[tuple[float, float, int | None, int, float]] = []
        self.convs: list[weakref.ref] = []  # a few conv modules, for channels_last
        self.uses_conv = False
        self.scaler_mode = False  # an enabled GradScaler clocks iterations (at update())
        self.in_scaler_step = 0
        self.opt_stepped = False
        self.found_inf: list[Any] = []  # fused optimizers: skip flags still on the device
        self.primary: weakref.ref | None = None  # the optimizer that clocks iterations
        self.scaler: weakref.ref | None = None
        self.stream: Any = None  # the training thread's CUDA stream, for ordered reads
        self.autocast_dtype: str | None = None
        self.checkpointing = False
        # the tensor the last top-level backward() ran on (its graph already freed by
        # that backward), unscaled; end_iteration() pairs it with its iteration in
        # loss_of, which the reporter takes. References only: no copy, no sync.
        self.loss_tensor: Any = None
        self.loss_of: tuple[int, Any] | None = None  # (iteration, its loss_tensor)
        self.loss_taken: tuple[int, Any] | None = None  # the reporter's copy of loss_of
        self.scaled: tuple[Any, Any] | None = None  # GradScaler.scale()'s (result, input)
        self.pending: collections.deque = collections.deque(maxlen=MAX_PENDING_STEPS)
        # -- the reporter's --
        self.held: list[list[Any]] = []  # steps whose skip flag is still on the device
        # event, buffer, the steps whose flags it holds, whether it ends with the scale,
        # and the step whose loss ends it (None: no loss in it)
        self.inflight: tuple[Any, Any, list[list[Any]], bool, list[Any] | None] | None = None
        self.skipped_resolved = 0
        self.loss_scale: float | None = None
        self.seq = 0
        self.last_send = 0.0
        self.last_config: dict[str, Any] | None = None
        self.last_config_time = 0.0
        self.dropped: dict[str, int] = {}
        self.errors = 0
        self.exit_reason: str | None = None
        self.error: str | None = None
        self.finished = False
        self.device: Any = None
        self.gpu_ids: dict[int, tuple[int | None, str | None]] = {}
        self.sock: socket.socket | None = None
        self.thread: threading.Thread | None = None
        self.role: str | None = None  # "worker" once known to be a DataLoader worker
        self.stop = threading.Event()
        self.report_lock = threading.Lock()

    def after_fork(self) -> None:
        # threads and locks do not survive fork; the child starts over as its own job
        # (a DataLoader worker never finishes an iteration, so it never reports). The
        # parent's state is kept, never released: it can hold CUDA tensors (the loss,
        # skip flags, copy buffers), and freeing one in a forked child calls into a CUDA
        # context the child cannot use, which aborts it ("CUDA error: initialization
        # error" in ~TensorImpl: a DataLoader worker of a CUDA job, killed by SIGABRT)
        _inherited.append(dict(self.__dict__))
        sock = self.sock
        self._reset()
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def fault(self) -> None:
        """An error inside the hook: count it; after too many, stop measuring."""
        self.errors += 1
        if self.errors >= MAX_HOOK_ERRORS:
            self.off = True

    # -- the training thread ---------------------------------------------------------------
    def step_end(self, skipped: Any) -> None:
        """An optimizer step (or scaler update) ended an iteration."""
        if self.source is not OPTIMIZER:
            was = self.source
            self.source = OPTIMIZER  # from now on only steps count, never backward()
            self.held_backwards = []
            if was is BACKWARD:
                # the backward() just before this step already counted this iteration
                self.opt_stepped = False
                return
        self.end_iteration(skipped)

    def backward_end(self) -> None:
        """A top-level backward() returned; an iteration when no optimizer ever steps."""
        if self.source is BACKWARD:
            self.end_iteration(False)
            return
        if self.optimizer_made:
            now = _perf()
            held = self.held_backwards
            held.append((now, self.wait, self.samples, self.firsts, self.first_wait))
            if now - held[0][0] < BACKWARD_GRACE and len(held) < MAX_HELD_BACKWARDS:
                return  # an optimizer exists: its first step may be on the way
            # it never stepped (an optimizer built only for its learning rate?): count
            # the held backward() ends as the iterations they were
            self.held_backwards = []
            base = (0.0, 0, 0, 0.0)
            for end, wait, samples, firsts, first_wait in held:
                self.wait, self.firsts = wait - base[0], firsts - base[2]
                self.samples = None if samples is None else samples - base[1]
                self.first_wait = first_wait - base[3]
                self.end_iteration(False, end)
                base = (wait, samples or 0, firsts, first_wait)
            self.source = BACKWARD
            return
        self.source = BACKWARD
        self.end_iteration(False)

    def end_iteration(self, skipped: Any, now: float | None = None) -> None:
        if now is None:
            now = _perf()
        start = self.iter_start
        first = None
        if self.firsts:
            first = (self.firsts, self.first_wait)
            self.firsts, self.first_wait = 0, 0.0
        self.pending.append([self.n, now, None if start is None else now - start, self.wait,
                             self.samples, skipped, first, None])
        self.loss_of = (self.n, self.loss_tensor)
        self.n += 1
        if skipped is True:
            self.skipped_known += 1
        self.iter_start = now
        self.wait = 0.0
        self.samples = None
        self.opt_stepped = False
        if self.thread is None:
            self.start_reporting()

    def scaler_update(self, scaler: Any) -> None:
        ref = self.scaler
        if ref is None or ref() is not scaler:
            self.scaler = weakref.ref(scaler)
        if self.found_inf:
            skipped, self.found_inf = self.found_inf, []
        else:
            skipped = not self.opt_stepped
        self.step_end(skipped)

    # -- reporting ---------------------------------------------------------------------------
    def start_reporting(self) -> None:
        """Start the reporting thread: at the first sign that this process trains."""
        self.active = True
        if self.thread is None and not self.off:
            self.thread = threading.Thread(target=self._loop, name="gpuwatch-hook",
                                           daemon=True)
            self.thread.start()

    def _loop(self) -> None:
        stop = self.stop
        while not stop.wait(REPORT_INTERVAL):
            self.report()

    def report(self, final: bool = False) -> None:
        """Send what is new (the reporting thread calls this; so does the exit)."""
        with self.report_lock:
            self._guarded_report(final)

    def _guarded_report(self, final: bool) -> None:
        try:
            self._report(final)
        except Exception:  # never let a bug of ours kill the reporter or the exit: count it
            self.fault()

    def _report(self, final: bool) -> None:
        if not final and not self.is_training_process():
            return  # nothing yet says that this process trains (or it is a loader worker)
        # the newest iteration's loss, taken before its step record leaves `pending` (it
        # is appended first), so that its record is among those held below
        self.loss_taken = self.loss_of
        pending = self.pending
        while pending:
            try:
                rec = pending.popleft()
            except IndexError:
                break
            if isinstance(rec[5], list):
                rec[5] = _Flags(rec[5])
            self.held.append(rec)
        self._resolve(final)
        held = self.held
        ready = 0
        while ready < len(held) and not isinstance(held[ready][5], _Flags) \
                and held[ready][7] is not _PENDING:
            ready += 1
        if final:
            for rec in held[ready:]:
                if isinstance(rec[5], _Flags):
                    rec[5] = None  # the device never answered: unknown, not "not skipped"
                if rec[7] is _PENDING:
                    rec[7] = None
            ready = len(held)
        steps, self.held = held[:ready], held[ready:]
        now = time.time()
        config = self._config()
        config_due = config != self.last_config or now - self.last_config_time >= CONFIG_INTERVAL
        if not steps and not final and not config_due and now - self.last_send < HEARTBEAT_INTERVAL:
            return
        offset = now - _perf()  # perf_counter → Unix seconds, fresh each report
        window = {"steps": len(steps), "skipped": 0, "timed": 0, "step_seconds": 0.0,
                  "data_wait_seconds": 0.0, "samples": 0, "sample_seconds": 0.0,
                  "iterators": 0, "first_batch_wait_seconds": 0.0}
        records = []
        for n, end, dur, wait, batch, skipped, first, loss in steps:
            if first is not None:
                window["iterators"] += first[0]
                window["first_batch_wait_seconds"] += first[1]
            if skipped is True:
                window["skipped"] += 1
            if dur is not None:
                window["timed"] += 1
                window["step_seconds"] += dur
                window["data_wait_seconds"] += wait
                if batch is not None:
                    window["samples"] += batch
                    window["sample_seconds"] += dur
            records.append(protocol.StepRecord(
                step=n, t=end + offset, step_seconds=dur,
                data_wait_seconds=wait if (dur is not None or wait) else None,
                batch_size=batch, skipped=skipped, first_batch=first is not None,
                first_batch_wait_seconds=None if first is None else first[1], loss=loss))
        rank, local_rank, world = self._rank()
        gpu, uuid = self._gpu()
        mem = self._memory()
        header: dict[str, Any] = {
            "kind": "exit" if final else "report", "pid": self.pid, "seq": self.seq,
            "t": now, "rank": rank, "local_rank": local_rank, "world_size": world,
            "gpu": gpu, "uuid": uuid, "steps_total": self.n,
            "skipped_total": self.skipped_known + self.skipped_resolved,
            "window": window, "loss_scale": self.loss_scale, **mem,
            "config": config if config_due else None,
            "exit_reason": (self.exit_reason or "exited") if final else None,
            "error": self.error, "sender_dropped": dict(self.dropped),
            "hook_errors": self.errors,
        }
        self._send(protocol.encode(header, records))
        self.seq += 1
        self.last_send = now
        if config_due:
            self.last_config, self.last_config_time = config, now

    def _send(self, data: bytes) -> None:
        if self.sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.setblocking(False)
            self.sock = sock
        for path in self.paths:
            try:
                self.sock.sendto(data, path)
                continue
            except BlockingIOError:
                reason = "busy"  # the receiver's queue is full: it is slow
            except (FileNotFoundError, ConnectionRefusedError):
                reason = "no_receiver"
            except PermissionError:
                reason = "denied"
            except OSError:
                reason = "error"
            self.dropped[reason] = self.dropped.get(reason, 0) + 1

    # -- reading the device without synchronizing -----------------------------------------
    def _scale_tensor(self) -> Any:
        ref = self.scaler
        scaler = ref() if ref is not None else None
        if scaler is None:
            return None
        get = getattr(scaler, "_get_scale_async", None)
        return get() if get is not None else None

    def _resolve(self, final: bool) -> None:
        self._resolve_once(final)
        if final and self.inflight is not None:
            # the last report: the copy just submitted holds the last steps' flags; wait
            # for it (bounded) rather than report those steps as unknown
            self._resolve_once(final)

    def _resolve_once(self, final: bool) -> None:
        """Turn skip flags held as device tensors into booleans, and read the loss scale.

        CPU tensors are read at once (no device to wait for). CUDA tensors are copied with
        one non-blocking copy into pinned memory per report, on the training's stream,
        and read at a later report once the event says the copy is done."""
        if self.inflight is not None:
            event, buf, recs, with_scale, loss_rec = self.inflight
            done = event.query()
            if not done and final:
                deadline = time.monotonic() + 1.0
                while not done and time.monotonic() < deadline:
                    time.sleep(0.01)
                    done = event.query()
            if done:
                values = buf.tolist()
                if loss_rec is not None:
                    loss_rec[7] = values.pop()
                if with_scale:
                    self.loss_scale = float(values.pop())
                i = 0
                for rec in recs:
                    k = len(rec[5].tensors)
                    rec[5] = any(v != 0 for v in values[i:i + k])
                    self.skipped_resolved += rec[5]
                    i += k
                self.inflight = None
        unresolved: list[list[Any]] = []
        for rec in self.held:
            flags = rec[5]
            if not isinstance(flags, _Flags) or flags.submitted:
                continue
            if all(t.device.type == "cpu" for t in flags.tensors):
                rec[5] = any(float(t) != 0 for t in flags.tensors)
                self.skipped_resolved += rec[5]
            else:
                unresolved.append(rec)
        scale = self._scale_tensor()
        if scale is not None and scale.device.type == "cpu":
            self.loss_scale = float(scale)
            scale = None
        if self.inflight is not None:
            return
        loss_rec, loss = self._take_loss()
        if loss is not None and loss.device.type != "cuda":
            if loss.device.type == "cpu":
                loss_rec[7] = float(loss.detach())
            loss = None  # another accelerator: reading it would wait for the device
        if not unresolved and scale is None and loss is None:
            return
        tensors = [t for rec in unresolved for t in rec[5].tensors]
        device = (tensors[0] if tensors else scale if scale is not None else loss).device
        if device.type != "cuda" or any(t.device != device for t in tensors):
            # another accelerator, or flags spread over devices: read directly, once
            for rec in unresolved:
                rec[5] = any(float(t) != 0 for t in rec[5].tensors)
                self.skipped_resolved += rec[5]
            if scale is not None:
                self.loss_scale = float(scale)
            return
        with_scale = scale is not None and scale.device == device
        if with_scale:
            tensors.append(scale.float())
        if loss is not None and loss.device == device:
            tensors.append(loss.detach())
            loss_rec[7] = _PENDING
        else:
            loss_rec = None
        stream = self.stream if self.stream is not None and self.stream.device == device \
            else torch.cuda.current_stream(device)
        with torch.cuda.device(device), torch.cuda.stream(stream):
            stacked = torch.stack([t.float().reshape(()) for t in tensors])
            buf = torch.empty(stacked.shape, dtype=torch.float32, pin_memory=True)
            buf.copy_(stacked, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        for rec in unresolved:
            rec[5].submitted = True
        self.inflight = (event, buf, unresolved, with_scale, loss_rec)

    def _take_loss(self) -> tuple[Any, Any]:
        """(the held step record, its loss tensor) for the newest iteration, taken when
        the report began, if its last top-level backward() ran on a loss (one
        floating-point value); unscaled: for ``scaler.scale(loss).backward()`` the
        backward() wrapper kept the tensor handed to ``scale()``, so the value is exact
        whatever the scale does after. (None, None) otherwise."""
        none = (None, None)
        taken, self.loss_taken = self.loss_taken, None
        if taken is None:
            return none
        if self.loss_of is taken:
            self.loss_of = None  # read once
        n, t = taken
        if not isinstance(t, torch.Tensor) or t.numel() != 1 or not t.is_floating_point():
            return none
        if self.scaler_mode and self.scaled is None:
            return none  # a scaler whose scale() is its own (FSDP's): the loss is scaled
        rec = next((r for r in reversed(self.held) if r[0] == n), None)
        return (rec, t) if rec is not None else none

    def _memory(self) -> dict[str, int | None]:
        dev = self._device()
        if dev is None or dev.type != "cuda" or not torch.cuda.is_initialized():
            return {}
        # host-side allocator counters: no device synchronization
        return {"mem_allocated_bytes": torch.cuda.memory_allocated(dev),
                "mem_reserved_bytes": torch.cuda.memory_reserved(dev),
                "max_mem_allocated_bytes": torch.cuda.max_memory_allocated(dev)}

    # -- who we are --------------------------------------------------------------------------
    def _device(self) -> Any:
        ref = self.primary
        opt = ref() if ref is not None else None
        if opt is not None:
            try:
                self.device = opt.param_groups[0]["params"][0].device
            except (IndexError, KeyError, AttributeError, TypeError):
                pass
        return self.device

    def _gpu(self) -> tuple[int | None, str | None]:
        dev = self._device()
        if dev is None or dev.type != "cuda":
            return None, None
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        if index not in self.gpu_ids:
            uuid = None
            try:
                uuid = str(torch.cuda.get_device_properties(index).uuid)
                uuid = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
            except Exception:  # an old torch without uuid: the index must do
                uuid = None
            # CUDA numbers the visible devices; NVML numbers all of them. The receiver
            # prefers the UUID; the index is right when the lists are plain numbers.
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            nvml: int | None = index
            if visible is not None:
                entries = [e.strip() for e in visible.split(",") if e.strip()]
                try:
                    nvml = int(entries[index])
                except (IndexError, ValueError):
                    nvml = None
            self.gpu_ids[index] = (nvml, uuid)
        return self.gpu_ids[index]

    def _rank(self) -> tuple[int | None, int | None, int | None]:
        rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        return rank, _env_int("LOCAL_RANK"), world

    def _config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {}
        loader = self.loader
        if loader is not None:
            cfg.update(loader[1])
        cfg["autocast"] = self.autocast_dtype is not None
        cfg["autocast_dtype"] = self.autocast_dtype
        cfg["tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
        cfg["cudnn_tf32"] = bool(torch.backends.cudnn.allow_tf32)
        cfg["float32_matmul_precision"] = torch.get_float32_matmul_precision()
        cfg["cudnn_benchmark"] = bool(torch.backends.cudnn.benchmark)
        ref = self.primary
        opt = ref() if ref is not None else None
        if opt is not None:
            defaults = getattr(opt, "defaults", {}) or {}
            cfg["optimizer"] = type(opt).__name__
            cfg["fused_optimizer"] = bool(defaults.get("fused"))
            cfg["foreach_optimizer"] = defaults.get("foreach")
        cfg["grad_scaler"] = self.scaler is not None
        cfg["gradient_checkpointing"] = self.checkpointing
        cfg["uses_dataloader"] = self.loader_made
        cfg["uses_conv"] = self.uses_conv
        channels_last = self._channels_last()
        if channels_last is not None:
            cfg["channels_last"] = channels_last
        if self.source is not None:
            cfg["step_source"] = self.source
        dev = self._device()
        cfg["device"] = str(dev) if dev is not None else None
        cfg["torch_version"] = torch.__version__
        return cfg

    def _channels_last(self) -> bool | None:
        """Whether the conv weights are channels_last (the memory format a conv net gets
        from ``model.to(memory_format=torch.channels_last)``), from the first 2-d conv
        whose weight tells the formats apart; None when none does."""
        for ref in self.convs:
            conv = ref()
            weight = getattr(conv, "weight", None) if conv is not None else None
            if not isinstance(weight, torch.Tensor) or weight.dim() != 4:
                continue
            cl = weight.is_contiguous(memory_format=torch.channels_last)
            if cl != weight.is_contiguous():  # 1x1 and depthwise kernels are both
                return cl
        return None

    # -- the end -----------------------------------------------------------------------------
    def is_training_process(self) -> bool:
        """A process that trains (or tried to): it built a model, an optimizer or a
        DataLoader iterator, ran backward() or stepped, or died of OOM; never a DataLoader
        worker. A process that only imports torch (torchrun's agent, a launcher's CLI, a
        worker being spawned) sends nothing."""
        if os.getpid() != self.pid or self.role == "worker":
            return False
        if torch.utils.data.get_worker_info() is not None:
            self.role = "worker"
            return False
        mp = sys.modules.get("multiprocessing")
        if mp is not None and mp.parent_process() is not None:
            # started by multiprocessing: a DataLoader worker (spawn, forkserver) has
            # imported torch before its worker loop set get_worker_info(); its target says
            target = getattr(mp.current_process(), "_target", None)
            if target is None:
                return False  # not bootstrapped yet: don't know
            if target is torch.utils.data._utils.worker._worker_loop:
                self.role = "worker"
                return False
        return self.active or self.n > 0 or self.loader_seen or self.exit_reason == "oom" \
            or torch.cuda.is_initialized()

    def finish(self) -> None:
        """The last report: at exit, or right after an uncaught exception."""
        if self.finished:
            return
        self.finished = True
        if not self.is_training_process():
            return
        self.stop.set()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)
        # the reporter may be stuck (e.g. in a device call): then report without its lock
        if self.report_lock.acquire(timeout=1.0):
            try:
                self._guarded_report(final=True)
            finally:
                self.report_lock.release()
        else:
            self._guarded_report(final=True)


# -- the wrappers (module level, so detach() can find and restore them) --------------------

def _on_optimizer_step(optimizer: Any, _args: Any, _kwargs: Any) -> None:
    h = _hook
    if h is None or h.off:
        return
    try:
        if h.in_scaler_step:
            h.opt_stepped = True
            # a fused optimizer steps even when the scaler found inf/NaN: its kernel
            # skips the update on the device, by this flag
            flag = getattr(optimizer, "found_inf", None)
            if flag is not None:
                h.found_inf.append(flag)
                if flag.is_cuda and (h.stream is None or h.n % 256 == 0):
                    h.stream = torch.cuda.current_stream(flag.device)
            if h.primary is None:
                h.primary = weakref.ref(optimizer)
            return
        if h.scaler_mode:
            return  # an extra optimizer stepped outside the scaler: the scaler clocks
        ref = h.primary
        if ref is None or ref() is None:
            h.primary = weakref.ref(optimizer)
        elif ref() is not optimizer:
            return  # several optimizers: the first one to step is the iteration clock
        if h.source is OPTIMIZER:
            h.end_iteration(False)
        else:
            h.step_end(False)
    except Exception:
        h.fault()


def _wrap_scaler_step(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        h = _hook
        if h is None or h.off or not self.is_enabled():
            return orig(self, optimizer, *args, **kwargs)
        h.scaler_mode = True
        h.in_scaler_step += 1
        try:
            return orig(self, optimizer, *args, **kwargs)
        finally:
            h.in_scaler_step -= 1
            try:
                if not h.in_scaler_step and type(self).update is not _scaler_update:
                    # a subclass with its own update() (FSDP's ShardedGradScaler) never
                    # reaches our wrapper: the iteration ends with the step instead
                    h.scaler_update(self)
            except Exception:
                h.fault()
    return step


def _wrap_scaler_scale(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def scale(self: Any, outputs: Any) -> Any:
        result = orig(self, outputs)
        h = _hook
        if h is not None:
            h.scaled = (result, outputs)  # which loss a backward() on `result` was
        return result
    return scale


def _wrap_scaler_update(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def update(self: Any, new_scale: Any = None) -> Any:
        result = orig(self, new_scale)
        h = _hook
        if h is not None and not h.off and self.is_enabled():
            try:
                h.scaler_update(self)
            except Exception:
                h.fault()
        return result
    return update


def _wrap_next(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def __next__(self: Any) -> Any:
        h = _hook
        if h is None or h.off:
            return orig(self)
        t0 = _perf()
        try:
            return orig(self)
        finally:
            t1 = _perf()
            try:
                h.wait += t1 - t0
                if h.iter_start is None:
                    h.iter_start = t0
                info = self.__dict__.get("_gpuwatch")
                if info is not None:
                    h.loader = info
                    if info[0] is not None:
                        h.samples = (h.samples or 0) + info[0]
                    if info[2] is not None:  # this iterator's first batch
                        h.firsts += 1
                        h.first_wait += info[2] + (t1 - t0)
                        info[2] = None
                h.loader_seen = True
            except Exception:
                h.fault()
    return __next__


def _wrap_iter_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def __init__(self: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
        t0 = _perf()
        orig(self, loader, *args, **kwargs)
        h = _hook
        if h is None or h.off:
            return
        try:
            init = _perf() - t0
            batch = loader.batch_size
            if batch is None:
                batch = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
            # [batch size, config facts, seconds spent creating it until its first batch
            # (None after it), when its creation began]
            self._gpuwatch = [batch if isinstance(batch, int) else None, {
                "num_workers": loader.num_workers,
                "pin_memory": bool(loader.pin_memory),
                "persistent_workers": bool(loader.persistent_workers),
                "prefetch_factor": loader.prefetch_factor if loader.num_workers else None,
                "batch_size": batch if isinstance(batch, int) else None,
            }, init, t0]
            # starting the workers is waiting for data too: the cost that persistent
            # workers save at each epoch
            h.wait += init
            if h.iter_start is None:
                h.iter_start = t0
            h.loader_made = True
            if h.thread is None:
                h.start_reporting()
        except Exception:
            h.fault()
    return __init__


def _wrap_backward(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def backward(*args: Any, **kwargs: Any) -> Any:
        h = _hook
        if h is None or h.off:
            return orig(*args, **kwargs)
        if not h.depth:
            t = args[0] if args else kwargs.get("tensors")
            scaled = h.scaled
            if scaled is not None:  # a GradScaler is in use: the loss is what scale() got
                t = scaled[1] if scaled[0] is t else None
            h.loss_tensor = t
        h.depth += 1
        try:
            result = orig(*args, **kwargs)
        finally:
            h.depth -= 1
        if not h.depth and h.source is not OPTIMIZER:
            try:
                if h.source is BACKWARD:
                    h.end_iteration(False)
                else:
                    h.backward_end()
            except Exception:
                h.fault()
        return result
    return backward


def _wrap_optimizer_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        h = _hook
        if h is not None and not h.off:
            h.optimizer_made = True
            if h.thread is None:
                h.start_reporting()
    return __init__


def _wrap_conv_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        h = _hook
        if h is not None and not h.off:
            try:
                h.uses_conv = True
                if len(h.convs) < 8 and isinstance(self, torch.nn.Conv2d):
                    h.convs.append(weakref.ref(self))
                if h.thread is None:
                    h.start_reporting()
            except Exception:
                h.fault()
    return __init__


def _on_parameter(_module: Any, _name: str, _param: Any) -> None:
    """A model is being built (a parameter registered): this process trains."""
    h = _hook
    if h is not None and not h.off and h.thread is None:
        try:
            h.start_reporting()
        except Exception:
            h.fault()


def _wrap_get_iterator(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``DataLoader._get_iterator``: the whole of an iterator's creation, the subclass's
    part included (``_MultiProcessingDataLoaderIter`` starts its workers after the base
    class's ``__init__``, which alone is what ``_wrap_iter_init`` can time)."""
    @functools.wraps(orig)
    def _get_iterator(self: Any) -> Any:
        t0 = _perf()
        it = orig(self)
        h = _hook
        if h is None or h.off:
            return it
        try:
            total = _perf() - t0
            info = it.__dict__.get("_gpuwatch")
            if info is not None and info[2] is not None:
                h.wait += max(0.0, total - info[2])
                info[2] = total
                if h.iter_start == info[3]:
                    h.iter_start = t0
                info[3] = t0
        except Exception:
            h.fault()
        return it
    return _get_iterator


def _wrap_autocast_enter(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def __enter__(self: Any) -> Any:
        h = _hook
        if h is not None and h.autocast_dtype is None:
            try:
                if getattr(self, "_enabled", False):
                    h.autocast_dtype = str(self.fast_dtype).replace("torch.", "")
            except Exception:
                h.fault()
        return orig(self)
    return __enter__


def _wrap_checkpoint(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def checkpoint(function: Any, *args: Any, **kwargs: Any) -> Any:
        h = _hook
        if h is not None:
            h.checkpointing = True
        return orig(function, *args, **kwargs)
    return checkpoint


_scaler_update: Any = None
_optimizer_hook_handle: Any = None
_parameter_hook_handle: Any = None
_problem: str | None = None  # why attach() failed, when it did
_prev_excepthook: Any = None
_prev_threading_excepthook: Any = None


def _died_of(value: BaseException) -> None:
    """The process's training died of ``value``: say so in the exit report, now."""
    try:
        h = _hook
        if h is not None and h.pid == os.getpid() and not h.finished:
            h.exit_reason = "oom" if _is_oom(value) else (
                "interrupted" if isinstance(value, KeyboardInterrupt) else "exception")
            h.error = f"{type(value).__name__}: {value}"[:protocol.MAX_TEXT]
            # report now: the rest of shutdown may hang (e.g. a collective that never ends)
            h.finish()
    except Exception:
        pass


def _excepthook(tp: type[BaseException], value: BaseException, tb: Any) -> None:
    _died_of(value)
    (_prev_excepthook or sys.__excepthook__)(tp, value, tb)


def _wrap_os_exit(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``os._exit``: how multiprocessing's fork and forkserver children leave (after
    ``BaseProcess._bootstrap`` returns), and how many training scripts end to skip a
    hanging shutdown. No ``atexit`` handler runs then: send the exit report first."""
    @functools.wraps(orig)
    def _exit(*args: Any, **kwargs: Any) -> Any:
        _at_exit()
        return orig(*args, **kwargs)
    return _exit


def _wrap_process_run(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``multiprocessing``'s ``BaseProcess.run``: ``_bootstrap`` catches the target's
    exception and exits 1, so no ``sys.excepthook`` sees it."""
    @functools.wraps(orig)
    def run(self: Any) -> Any:
        try:
            return orig(self)
        except Exception as err:
            _died_of(err)
            raise
    return run


def _wrap_spawn_wrap(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.multiprocessing.spawn``'s ``_wrap(fn, i, args, error_file)``, each rank's
    target: it catches the rank's exception, hands the traceback to the parent and exits 1
    (Ctrl-C: 0), so neither ``sys.excepthook`` nor ``run()`` ever sees it. Pickled by
    reference, so a spawned rank finds this wrapper once its hook has attached."""
    @functools.wraps(orig)
    def _wrap(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def rank_fn(*fn_args: Any, **fn_kwargs: Any) -> Any:
            try:
                return fn(*fn_args, **fn_kwargs)
            except (Exception, KeyboardInterrupt) as err:
                _died_of(err)
                raise
        return orig(rank_fn, *args, **kwargs)
    return _wrap


def _threading_excepthook(args: Any) -> None:
    try:
        h = _hook
        if h is not None and _is_oom(args.exc_value):
            h.exit_reason = "oom"
            h.error = f"{args.exc_type.__name__}: {args.exc_value}"[:protocol.MAX_TEXT]
    except Exception:
        pass
    (_prev_threading_excepthook or threading.__excepthook__)(args)


def _at_exit() -> None:
    h = _hook
    if h is not None and h.pid == os.getpid():
        try:
            h.finish()
        except Exception:
            pass


def _after_fork_in_child() -> None:
    h = _hook
    if h is not None:
        h.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _patch(owner: Any, name: str, wrapper_factory: Callable[[Any], Any]) -> Any:
    orig = getattr(owner, name)
    wrapper = wrapper_factory(orig)
    setattr(owner, name, wrapper)
    _patches.append((owner, name, orig, wrapper))
    return wrapper


def attach(socket_path: str | None = None) -> bool:
    """Start measuring this process's training and reporting it to gpuwatch.

    ``socket_path`` (or ``$GPUWATCH_SOCKET``, or the system daemon's
    ``/run/gpuwatch/hook.sock``) is where reports go; several paths may be joined with
    ``os.pathsep``. Safe to call more than once, and from a process where no gpuwatch
    daemon runs (reports are then dropped and counted). Returns True once attached.
    Reports (the configuration, and heartbeats until the first step) start at once.
    """
    if not _attach(socket_path):
        return False
    h = _hook
    if h is not None and h.thread is None:
        try:
            h.start_reporting()
        except Exception:
            h.fault()
    return True


def attach_when_training() -> bool:
    """``attach()`` for ``gpuwatch run``'s injection into every Python process of a job:
    reports start only once the process shows that it trains (it builds a model, an
    optimizer or a DataLoader iterator, or runs backward()), so that a process that only
    imports torch (torchrun's agent, a launcher's CLI, a DataLoader worker) sends nothing.
    """
    return _attach(None)


def _attach(socket_path: str | None) -> bool:
    global _hook, _scaler_update, _optimizer_hook_handle, _parameter_hook_handle
    global _prev_excepthook, _prev_threading_excepthook, _problem
    with _attach_lock:
        if _hook is not None:
            return True
        try:
            hook = _Hook(_socket_paths(socket_path))
            _patch(torch.utils.data.dataloader._BaseDataLoaderIter, "__next__", _wrap_next)
            _patch(torch.utils.data.dataloader._BaseDataLoaderIter, "__init__",
                   _wrap_iter_init)
            _patch(torch.utils.data.DataLoader, "_get_iterator", _wrap_get_iterator)
            _patch(GradScaler, "step", _wrap_scaler_step)
            _patch(GradScaler, "scale", _wrap_scaler_scale)
            _scaler_update = _patch(GradScaler, "update", _wrap_scaler_update)
            _patch(torch.autocast, "__enter__", _wrap_autocast_enter)
            _patch(torch.utils.checkpoint, "checkpoint", _wrap_checkpoint)
            # Tensor.backward() calls torch.autograd.backward(): one wrapper sees both
            _patch(torch.autograd, "backward", _wrap_backward)
            _patch(torch.optim.Optimizer, "__init__", _wrap_optimizer_init)
            _patch(torch.nn.modules.conv._ConvNd, "__init__", _wrap_conv_init)
            _patch(os, "_exit", _wrap_os_exit)
            _patch(multiprocessing.process.BaseProcess, "run", _wrap_process_run)
            spawn = sys.modules.get("torch.multiprocessing.spawn")
            if spawn is not None and callable(getattr(spawn, "_wrap", None)):
                _patch(spawn, "_wrap", _wrap_spawn_wrap)
            _optimizer_hook_handle = register_optimizer_step_post_hook(_on_optimizer_step)
            register = getattr(torch.nn.modules.module,
                               "register_module_parameter_registration_hook", None)
            if register is not None:  # torch 2.0+
                _parameter_hook_handle = register(_on_parameter)
            _prev_excepthook = sys.excepthook
            sys.excepthook = _excepthook
            _prev_threading_excepthook = threading.excepthook
            threading.excepthook = _threading_excepthook
            atexit.register(_at_exit)
        except Exception as err:
            _problem = f"{type(err).__name__}: {err}"[:protocol.MAX_TEXT]
            _undo_patches()
            return False
        _hook = hook
        return True


def attach_problem() -> str | None:
    """Why the last ``attach()`` failed (None when it did not)."""
    return _problem


def _undo_patches() -> None:
    global _optimizer_hook_handle, _parameter_hook_handle
    while _patches:
        owner, name, orig, wrapper = _patches.pop()
        if getattr(owner, name, None) is wrapper:
            setattr(owner, name, orig)
    if _optimizer_hook_handle is not None:
        _optimizer_hook_handle.remove()
        _optimizer_hook_handle = None
    if _parameter_hook_handle is not None:
        _parameter_hook_handle.remove()
        _parameter_hook_handle = None


def detach() -> None:
    """Stop measuring: undo every wrapper and stop reporting (no exit report is sent)."""
    global _hook
    with _attach_lock:
        h, _hook = _hook, None
        if h is None:
            return
        h.off = True
        h.stop.set()
        _undo_patches()
        if sys.excepthook is _excepthook:
            sys.excepthook = _prev_excepthook
        if threading.excepthook is _threading_excepthook:
            threading.excepthook = _prev_threading_excepthook
        atexit.unregister(_at_exit)
        if h.sock is not None:
            h.sock.close()


def is_attached() -> bool:
    return _hook is not None


def stats() -> dict[str, Any]:
    """This process's own counters, as the hook sees them (for tests and benchmarks)."""
    h = _hook
    if h is None:
        return {}
    return {"steps_total": h.n, "skipped_total": h.skipped_known + h.skipped_resolved,
            "reports_sent": h.seq, "sender_dropped": dict(h.dropped), "hook_errors": h.errors}
