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
import gc
import inspect
import multiprocessing.process
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.utils.checkpoint
import torch.utils.data
import torch.utils.data.dataloader
from torch.amp.grad_scaler import GradScaler
from torch.nn.utils import parametrize
from torch.optim.optimizer import register_optimizer_step_post_hook

from gpuwatch.job import protocol, sender
from gpuwatch.job.hook import facts
from gpuwatch.job.hook.frameworks import Framework, in_lightning_tuner

ENV_SOCKET = "GPUWATCH_SOCKET"  # one path, or several separated by os.pathsep
SYSTEM_SOCKET = "/run/gpuwatch/hook.sock"
HEARTBEAT_INTERVAL = 2.0  # a report even without new steps, so silence means trouble
# With an optimizer built but not stepped yet, backward() ends are held this long (or this
# many) before they count as iterations: gradient accumulation and GANs call backward()
# several times before the first step, and counting those too would count twice.
BACKWARD_GRACE = 10.0  # seconds
MAX_HELD_BACKWARDS = 10_000
OPTIMIZER = "optimizer"  # step_source values
BACKWARD = "backward"
CONFIG_INTERVAL = 30.0  # the configuration again, for a daemon started after the job
# optimizers that take sparse gradients, and how many of their parameters are looked at
# for one (an embedding table usually comes first; the look is a few µs a report)
_SPARSE_OPTIMIZERS = frozenset({"SGD", "SparseAdam", "Adagrad"})
SPARSE_SCAN = 64
MAX_PENDING_STEPS = 100_000  # per-step records waiting for the reporter (older ones dropped)
MAX_HOOK_ERRORS = 100  # after this many internal errors the hook stops measuring

# What the process is doing (docs/hook.md, "Phases"). Start-up lasts until the first
# iteration ends; evaluation, checkpoints and torch.compile's compilation interrupt
# training and are left out of the iteration they fall in; a process that runs forward
# passes (batches, generate()) and never a backward() is an inference process.
STARTUP = "startup"
TRAIN = "train"
EVAL = "eval"
CHECKPOINT = "checkpoint"
COMPILE = "compile"
INFERENCE = "inference"
PHASES = (STARTUP, COMPILE, TRAIN, EVAL, CHECKPOINT, INFERENCE)
# DistributedDataParallel's class (an empty tuple, which nothing is an instance of, on a
# torch built without it)
_DDP: Any = getattr(torch.nn.parallel, "DistributedDataParallel", ())
# a module switched to eval() starts an evaluation only if it holds at least this share of
# the parameter tensors the optimizer trains (a frozen BatchNorm's eval() in every step is
# not an evaluation)
EVAL_MODULE_SHARE = 0.5
# two loaders read side by side (zip(), Lightning's CombinedLoader) call next() on one
# right after the other: at most this long between the first's batch and the second's
# call (Python's thread switch interval, which another thread holding the interpreter
# may put between them); a sample drawn from another loader and run through the model
# before the training batch is fetched takes longer
SIDE_BY_SIDE_GAP = 0.005
# a process is an inference process once it has fetched this many batches, or called
# generate() this often, and kept at it this long, without a single backward(): more
# batches than any training step fetches before its first backward() (accumulation
# prefetched, a sanity check's validation batches, workers slow to start)
INFER_BATCHES = 64
INFER_GENERATE_CALLS = 3
INFER_AFTER = 10.0  # seconds, compiling left out
# An inference loop that feeds its model tensors it slices itself (no DataLoader, no
# generate()) is seen through the model: each module a process switches to eval() before
# it trains (from_pretrained() does; so do sentence-transformers' encode() and most
# inference scripts), and that module's direct children (a wrapper may call its own
# forward() directly), get a forward pre-hook that counts their passes in eval mode. At
# most this many modules; all are released at the process's first sign of training (an
# optimizer, torch.compile(), a backward()), before any training forward, and at detach().
INFER_WATCH_MAX = 8

_perf = time.perf_counter
# what a forked child inherited from its parent's hook: kept alive for good (after_fork)
_inherited: list[dict[str, Any]] = []
_hook: _Hook | None = None
_attach_lock = threading.Lock()
# CUDA graphs being captured in this process (torch.cuda.CUDAGraph.capture_begin, which
# torch.cuda.graph, make_graphed_callables and torch.compile's CUDA graphs call), and the
# lock the reporter holds over its own CUDA calls. A capture in torch's default "global"
# mode fails when any other thread makes a call CUDA deems unsafe meanwhile (an event
# query, a pinned or device allocation): the job's capture_end() raises. So a capture
# begins only once the reporter's calls under way are done, and the reporter makes none
# while one is under way (its flags and loss wait for the next report); as torch's own
# NCCL watchdog learned to (pytorch/pytorch#104487, #148594).
_capture_lock = threading.Lock()
_captures = 0

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
_NOT_STEADY = object()  # _Hook.train_info when no iterator's batches take the short way


class _Flags:
    """Skip flags of one iteration that are still tensors (a fused optimizer's found_inf)."""

    __slots__ = ("submitted", "tensors")

    def __init__(self, tensors: list[Any]) -> None:
        self.tensors = tensors
        self.submitted = False


class _Hook:
    """All state of the hook in one process. Hot-path methods are kept tiny."""

    # Every attribute _reset() sets, and no other. Slots, not an instance dict: with some
    # eighty attributes a dict is read through a hint on each access, a slot at a fixed
    # offset, and the wrappers of each training step read and write a few dozen of them.
    __slots__ = ("paths", "pid", "off", "n", "skipped_known", "iter_start", "wait",
                 "samples", "first", "loader", "loader_seen", "loader_made", "train_info",
                 "active", "source", "optimizer_made", "depth", "held_backwards", "convs",
                 "uses_conv", "sparse_grads", "data_parallel", "fsdp", "fsdp_version",
                 "compute_device", "ddp",
                 "scaler_mode", "in_scaler_step", "opt_stepped", "found_inf",
                 "primary", "other_opt", "several_opts", "shared_opts", "unscaled", "turn_bw",
                 "loader_trained", "clock",
                 "scaler", "stream", "amp_iter", "amp_n",
                 "autocast_seen", "checkpointing", "backwards", "bw_plain", "phase",
                 "phase_t0", "phase_seconds", "phase_stack", "excluded", "train_loaders",
                 "last_info", "prev_step", "mem_due", "mem_end",
                 "backward_seen", "opt_params", "eval_batches", "eval_samples",
                 "eval_batch_size", "eval_wait", "eval_probe", "eval_t1", "eval_model",
                 "eval_train_loader",
                 "side", "eval_run", "fetched_n", "infer_batches", "infer_t0",
                 "infer_compile0", "infer_samples", "infer_batch_size", "infer_wait",
                 "infer_eval_batch", "infer_done", "infer_t1", "infer_open", "gen_samples",
                 "generate_calls", "infer_watch", "compile_called",
                 "compiles", "saving", "saves", "cleanups", "framework", "framework_patched", "problems",
                 "loss_tensor", "loss_of", "loss_taken", "loss_off", "scaled", "pending", "held",
                 "inflight", "skipped_resolved", "loss_scale", "seq", "last_send",
                 "last_config", "last_config_time", "last_status", "dropped", "errors",
                 "exit_reason", "error", "finished", "device", "gpu_ids", "sock", "thread",
                 "role", "stop", "report_lock")

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
        # Each iteration's end appends one record to `pending` (_step_lists() says what it
        # holds). To keep that cheap, the data wait, the excluded seconds and the first
        # batches are running totals, never reset: the reporting thread takes each
        # iteration's share as the difference from the record before. Samples and
        # backward() calls stay per iteration (small ints: Python keeps those, a growing
        # total would be a new int object at every batch).
        self.iter_start: float | None = None  # perf_counter at the end of the last iteration
        self.wait = 0.0  # data wait while training, seconds, since attach
        self.samples = 0  # samples fetched in the current iteration (0: none, or unknown)
        # new DataLoader iterators whose first batch came in training, and their data wait
        # (creating them included), since attach: replaced, never changed in place
        self.first: tuple[int, float] = (0, 0.0)
        self.loader: tuple[int | None, dict[str, Any]] | None = None  # last loader used
        # the iterator facts (_wrap_iter_init) whose next batch takes the short way in
        # __next__: the training loader's, while training; anything that could change
        # what _fetched() decides (the phase, the loader, the hook off) sets it back
        self.train_info: Any = _NOT_STEADY
        self.loader_seen = False
        self.loader_made = False  # a DataLoader iterator was created in this process
        self.active = False  # built a model, an optimizer or a loader: a process that trains
        self.source: str | None = None  # what ends an iteration: OPTIMIZER or BACKWARD
        self.optimizer_made = False
        self.depth = 0  # nested backward() calls (reentrant checkpointing runs one inside)
        # backward() ends held while undecided: (end, and the totals wait, samples,
        # first and excluded then)
        self.held_backwards: list[tuple[float, float, int, tuple[int, float], float]] = []
        self.convs: list[weakref.ref] = []  # a few conv modules, for channels_last
        self.uses_conv = False
        # an embedding with sparse gradients (nn.Embedding/EmbeddingBag(sparse=True), seen
        # as a submodule, or a sparse .grad among the optimizer's first parameters): fused
        # SGD refuses them
        self.sparse_grads = False
        # the first torch.nn.DataParallel built (one process driving several GPUs through
        # threads), for its device count; its __init__ sets device_ids after registering
        # the module, so the count is read later, by the reporting thread
        self.data_parallel: weakref.ref | None = None
        # the first FullyShardedDataParallel unit built (FSDP1: it registers the module it
        # wraps), for its CPU offload setting, read by the reporting thread
        self.fsdp: weakref.ref | None = None
        self.fsdp_version: int | None = None  # 1 or 2, as _fsdp_cpu_offload found it
        # the first DistributedDataParallel built (it registers the module it wraps), for
        # find_unused_parameters and whether DDP found any unused, read by the reporting
        # thread
        self.ddp: weakref.ref | None = None
        self.scaler_mode = False  # an enabled GradScaler clocks iterations (at update())
        self.in_scaler_step = 0
        self.opt_stepped = False
        self.found_inf: list[Any] = []  # fused optimizers: skip flags still on the device
        self.primary: weakref.ref | None = None  # the optimizer that clocks iterations
        # another optimizer that stepped since the primary last did (_turns): a weak
        # reference to it, and the totals when it stepped (end, wait, samples, backward()
        # calls, excluded seconds, first batches)
        self.other_opt: tuple[Any, ...] | None = None
        # optimizers over parameters of their own step in turn (a GAN's generator and
        # discriminator): an iteration's backward() calls are theirs, not micro-batches
        # of one step, and are not reported
        self.several_opts = False
        # the optimizers seen stepping in turn with the primary over some of its
        # parameters (a wrapper stepping the one it holds: Lookahead, ZeroRedundancy-
        # Optimizer), so that their parameters are compared once
        self.shared_opts: weakref.WeakSet = weakref.WeakSet()
        # an optimizer that stepped outside the GradScaler clocking iterations since its
        # last update(), noted as other_opt is, and the newest scale() call then
        # (_scaler_gone)
        self.unscaled: tuple[Any, ...] | None = None
        # under a GradScaler: the iteration in which the primary last stepped and its
        # backward() calls by then, so that another optimizer's step knows whether a
        # backward() of its own came before it (_noted); without one, the primary's step
        # ends the iteration and its count starts again at 0
        self.turn_bw: tuple[int, int] = (-1, 0)
        # the same, once its steps may take the short way (_on_optimizer_step): set while
        # the hook is on, no GradScaler clocks iterations and steps do (source OPTIMIZER);
        # whatever ends one of those sets it back to None
        self.clock: weakref.ref | None = None
        self.scaler: weakref.ref | None = None
        self.stream: Any = None  # the training thread's CUDA stream, for ordered reads
        # autocast in force during training: the dtype of the last enabled autocast
        # entered, and in which iteration (`n` then), so a setting changed after start-up
        # is what is judged (_config() reads it)
        self.amp_iter: str | None = None
        self.amp_n = -2
        self.autocast_seen: str | None = None  # before the first iteration: any enabled one
        self.checkpointing = False
        self.backwards = 0  # top-level backward() calls in the current iteration
        # backward() may take the short way (_wrap_backward): it was seen, the process is
        # not evaluating, the batch before was a training loader's. Any phase change, and
        # a batch of a loader not known to train, set it back to False
        self.bw_plain = False
        # phases: the one in force, since when (perf_counter), the seconds of those that
        # ended, and what an interruption (checkpoint, compile) returns to
        self.phase = STARTUP
        self.phase_t0 = _perf()
        self.phase_seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.phase_stack: list[str] = []
        self.excluded = 0.0  # seconds of evaluation, checkpoints, compiling, since attach
        # the DataLoaders whose batches a backward() followed: they train; any other one,
        # once training began, evaluates. Held weakly, not by id(): a freed training
        # loader's address may go to the next loader made, an evaluation's
        self.train_loaders: weakref.WeakSet = weakref.WeakSet()
        self.last_info: list[Any] | None = None  # the iterator of the last batch fetched
        self.backward_seen = False
        self.opt_params = 0  # parameter tensors of the optimizer that clocks iterations
        self.eval_batches = 0  # batches of other loaders once training began
        self.eval_samples = 0
        self.eval_batch_size: int | None = None
        # an evaluation read a DataLoader that trains (a training accuracy under no_grad,
        # Lightning validating on its training loader): its batch size is the training's
        self.eval_train_loader = False
        self.eval_wait = 0.0  # their data wait, seconds
        # the first batch of a loader not known to train, which began an evaluation:
        # (its facts, fetch start and end, its first-batch wait, the evaluation's
        # batch size before, whether gradients were on). A backward() right after it says
        # it was training's after all (a training DataLoader built anew each epoch, a
        # tuner's trial: undo_eval), unless gradients were off as it came (a validation
        # batch taken between a training batch and its backward()); so does a training
        # loader's batch right after it (two loaders read side by side: _fetched)
        self.eval_probe: tuple[Any, ...] | None = None
        # where the newest evaluation batch (or an evaluation loader's end) came: no
        # evaluation ends before it (eval_end)
        self.eval_t1 = 0.0
        # the model whose eval() began the evaluation in force (a weak reference; None:
        # begun by a batch): the training loader's batches while it stays in eval mode
        # with gradients off are the evaluation's (_evaluating_on)
        self.eval_model: Any = None
        # a loader whose one batch began an evaluation that a training loader's batch ended
        # at once, and the iteration it came in: (its iterator's facts, n). The same again
        # in the next iteration: two loaders read side by side, both training (_fetched)
        self.side: tuple[Any, int] | None = None
        self.loader_trained = False  # a DataLoader's batches trained in this process
        # the batches of the evaluation in force since one that began it or a new
        # loader's first in it, while all came from that loader with gradients on: its
        # iterator's facts, what the evaluation's counters, batch size and newest batch
        # were before it (batches, samples, wait, batch size, eval_t1), that batch's
        # iterator wait (None: not an iterator's first) and fetch (start, end). A
        # backward() with no training batch since the last iteration says those batches
        # were training's (undo_run)
        self.eval_run: tuple[Any, ...] | None = None
        # the iteration (n) in which a training batch last came by next()'s long way (a
        # loader of unknown batch size counts no samples: this says a batch came)
        self.fetched_n = -1
        self.infer_batches = 0  # batches and generate() calls of a process that never trained
        self.infer_t0: float | None = None  # when the first of them came
        self.infer_compile0 = 0.0  # compile seconds by then
        self.infer_samples = 0
        self.infer_wait = 0.0  # its DataLoader's wait for those batches, seconds
        self.infer_batch_size: int | None = None
        self.infer_eval_batch: int | None = None  # infer_batch_size when it was read as serving
        # while read as serving: the end of its newest work (the last batch a loader
        # gave, or a generate() call's end), and what had been served when a loader ended
        # or another began (seconds, a loader's batches, their samples, their wait): where
        # an evaluation ahead of training ends. infer_open: that was a loader's end, and
        # generate() calls still finishing its batches (a loader that fetches a batch
        # ahead, as Accelerate's, ends before its last batch is worked on) move it on
        self.infer_t1: float | None = None
        self.infer_done: tuple[float, int, int, float] | None = None
        self.infer_open = False
        self.gen_samples = 0  # the sequences generate() was asked for, of infer_samples
        self.generate_calls = 0
        # modules whose forward passes in eval mode are counted (_watch_forwards): id ->
        # (its _Pass, the hook's handle); torch.compile() or torch.jit.script() was called
        # (nothing is watched after it: the hooks would be compiled or traced)
        self.infer_watch: dict[int, tuple[Any, Any]] = {}
        self.compile_called = False
        self.compiles = 0
        self.saving = False
        self.saves = 0  # checkpoint saves during training (a nested save counts once)
        # gc.collect() and torch.cuda.empty_cache() called while training: {name: [calls,
        # seconds inside]} (_wrap_cleanup); reported once one was
        self.cleanups: dict[str, list[float]] = {}
        self.framework = Framework()
        self.framework_patched = False
        self.problems = facts.Problems()
        # the tensor the last top-level backward() ran on (its graph already freed by
        # that backward), unscaled; end_iteration() pairs it with its iteration in
        # loss_of, which the reporter takes. References only: no copy, no sync.
        self.loss_tensor: Any = None
        self.loss_of: tuple[int, Any] | None = None  # (iteration, its loss_tensor)
        self.loss_taken: tuple[int, Any] | None = None  # the reporter's copy of loss_of
        self.loss_off = False  # a loss that could not be read: none read again
        self.scaled: tuple[Any, Any] | None = None  # GradScaler.scale()'s (result, input)
        self.pending: collections.deque = collections.deque(maxlen=MAX_PENDING_STEPS)
        # the allocator's counters read at the end of an iteration: the reporter asks for
        # them (mem_due) and the next iteration's end reads them (mem_end). Read on the
        # reporting thread they would land anywhere in a step (during forward, with the
        # activations held), and activation memory per sample (the peak over what a step
        # keeps) came out 3 to 60 MiB for four identical DDP ranks
        self.mem_due = False
        self.mem_end: dict[str, int | None] | None = None
        # -- the reporter's --
        self.prev_step: tuple[Any, ...] | None = None  # the last record taken from pending
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
        self.last_status: dict[str, Any] | None = None
        self.dropped: dict[str, int] = {}
        self.errors = 0
        self.exit_reason: str | None = None
        self.error: str | None = None
        self.finished = False
        self.device: Any = None
        # the device the steps run on where the parameters stay on the host (FSDP's CPU
        # offload): the loss's, seen once
        self.compute_device: Any = None
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
        _inherited.append({name: getattr(self, name, None) for name in _Hook.__slots__})
        sock = self.sock
        watched = self.infer_watch  # on the child's modules too: its own to remove
        self._reset()
        self.infer_watch = dict(watched)
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def fault(self) -> None:
        """An error inside the hook (called from an ``except`` block): count it, say where
        (once per place); after too many, stop measuring, and say that too."""
        self.errors += 1
        try:
            err = sys.exc_info()[1]
            tb = err.__traceback__ if err is not None else None
            where = "hook"
            while tb is not None:  # the innermost frame of ours
                if tb.tb_frame.f_globals.get("__name__", "").startswith("gpuwatch"):
                    where = f"hook.{tb.tb_frame.f_code.co_name}"
                tb = tb.tb_next
            if err is not None:
                self.problems.add(where, err)
        except Exception:
            pass
        if self.errors >= MAX_HOOK_ERRORS and not self.off:
            self.off = True
            self.no_short_ways()
            self.problems.add("hook.off", f"stopped measuring after {self.errors} errors of "
                              f"its own; steps, data wait and settings are no longer sent")

    def no_short_ways(self) -> None:
        """The per-step wrappers go the long way again, where every check is made (the
        hook stopped measuring, or detached)."""
        self.clock = None
        self.train_info = _NOT_STEADY
        self.bw_plain = False

    # -- phases -------------------------------------------------------------------------
    def switch(self, phase: str, now: float) -> None:
        """The process moves to ``phase``; time in an interruption (evaluation, a
        checkpoint, compiling) is left out of the iteration it falls in."""
        old = self.phase
        if now < self.phase_t0:
            # a batch whose fetch began before the phase in force did (a loader pulled by
            # a thread of its own, a Dataset that switches a model to eval mode): the
            # switch is now, never before, or the phase's seconds would run backwards
            now = self.phase_t0
        spent = now - self.phase_t0
        self.phase_seconds[old] += spent
        if old is EVAL or old is CHECKPOINT or old is COMPILE:
            self.excluded += spent
        if old is EVAL:
            self.eval_probe = None  # only an evaluation of one batch, straight after
            self.eval_run = None
        if phase is not CHECKPOINT and phase is not COMPILE and phase is not EVAL:
            # (a save or a compilation inside an evaluation comes back to it: kept)
            self.eval_model = None
        self.phase = phase
        self.phase_t0 = now
        # the short ways of the per-step wrappers hold only while training
        self.bw_plain = False
        if phase is not TRAIN:
            self.clock = None
            self.train_info = _NOT_STEADY

    def interrupt(self, phase: str) -> None:
        """A checkpoint or a compilation begins (they nest: a save inside an evaluation)."""
        self.phase_stack.append(self.phase)
        self.switch(phase, _perf())

    def resume(self) -> None:
        back = self.phase_stack.pop() if self.phase_stack else (TRAIN if self.n else STARTUP)
        self.switch(back, _perf())

    def other_batch(self, info: list[Any] | None, t0: float, t1: float) -> None:
        """A batch of a loader that has not trained, once training began: evaluation
        (``info`` None: the loader's end, no batch)."""
        probe = None
        grad = torch.is_grad_enabled()
        if self.phase is TRAIN:
            self.switch(EVAL, t0)
            if info is not None:
                probe = (info, t0, t1, info[2], self.eval_batch_size, grad)
        elif info is not None and info[2] is not None and self.phase is EVAL:
            # a loader's first batch while evaluating: the next epoch's training loader,
            # built anew after the evaluation (Lightning validating at each epoch's end
            # with reload_dataloaders_every_n_epochs=1, a loop that makes its DataLoader
            # each epoch), should a backward() follow it; else another evaluation loader
            probe = (info, t0, t1, info[2], self.eval_batch_size, grad)
        if probe is not None:
            # the batches of this loader from here on, should they all come with
            # gradients on and a backward() follow them (undo_run)
            self.eval_run = (info, self.eval_batches, self.eval_samples, self.eval_wait,
                             self.eval_batch_size, self.eval_t1, info[2], t0, t1) \
                if grad else None
        elif self.eval_run is not None and (info is not self.eval_run[0] or not grad):
            self.eval_run = None
        self.eval_probe = probe  # a second batch, or the loader's end: evaluation it is
        self.eval_wait += t1 - t0
        if probe is None:
            self.eval_t1 = t1
            # a backward() after this says nothing of the loader of this batch: it is the
            # evaluation's (a loop validating between a batch's fetch and its backward())
            self.last_info = None
        if info is not None and info[2] is not None:
            self.eval_wait += info[2]  # making its iterator (its workers' start)
        if info is not None:
            self.eval_batches += 1
            info[2] = None  # its first batch is no training epoch's start
            if info[0]:
                self.eval_samples += info[0]
                self.eval_batch_size = info[0]

    def eval_end(self, info: list[Any], t0: float) -> float:
        """Where the evaluation in force ends for a training iterator's first batch, asked
        for at ``t0``: where the iterator was made (``info[3]``) if that came after the
        evaluation began (the workers it started are the new epoch's cost, in its first
        batch's wait), else ``t0``."""
        made = info[3]
        if made < self.eval_t1:
            made = self.eval_t1  # the evaluation's batches went on after it was made
        return made if self.phase_t0 < made < t0 else max(t0, self.phase_t0)

    def undo_eval(self, now: float) -> None:
        """A backward() came right after the one batch that began an evaluation: that
        batch was training's, from a loader built anew (each epoch, or by a batch size
        tuner's trial). What it counted as evaluation is training's again: the time since
        it began, its data wait, its samples, and its epoch start."""
        info, t0, t1, first_wait, eval_batch_size = self.eval_probe[:5]
        self.eval_probe = None
        self._training_since(self.eval_end(info, t0), now)
        self.eval_wait -= t1 - t0 + (first_wait or 0.0)
        self.eval_batches -= 1
        self.loader = info
        if info[0]:
            self.eval_samples -= info[0]
            self.samples += info[0]
        self.eval_batch_size = eval_batch_size
        self.wait += t1 - t0 + (first_wait or 0.0)
        if first_wait is not None:
            firsts, waited = self.first
            self.first = (firsts + 1, waited + first_wait + (t1 - t0))

    def _training_since(self, since: float, now: float) -> None:
        """Training again at ``now``, what the evaluation in force counted from ``since``
        on training's: before it (the process evaluated before the batch that turned out
        to be training's was fetched, or its iterator made), evaluation, left out of the
        iteration."""
        if self.phase_t0 < since:
            spent = since - self.phase_t0
            self.phase_seconds[EVAL] += spent
            self.excluded += spent
            self.phase_t0 = since
        self.phase_seconds[TRAIN] += now - self.phase_t0
        self.phase = TRAIN
        self.phase_t0 = now
        self.eval_model = None

    def undo_run(self, now: float) -> None:
        """A backward() with no training batch since the last iteration, after batches of
        one loader that all came with gradients on (``eval_run``): they were training's,
        from a loader built after training began and read several batches before its
        first backward() (the Trainer fetching an optimizer step's micro-batches at once,
        Accelerate's loaders one batch ahead: a second Trainer in the same process).
        Their time (from where the evaluation ends for that loader's first batch:
        eval_end), batches, samples, wait and epoch start are training's, and the loader
        trains."""
        info, batches, samples, wait, batch_size, eval_t1, first_wait, t0, t1 = self.eval_run
        self.eval_run = None
        self.eval_probe = None
        self.eval_t1 = eval_t1  # the evaluation's newest batch before these
        self._training_since(self.eval_end(info, t0), now)
        self.samples += self.eval_samples - samples
        self.wait += self.eval_wait - wait
        self.eval_batches, self.eval_samples, self.eval_wait = batches, samples, wait
        self.eval_batch_size = batch_size
        if first_wait is not None:
            firsts, waited = self.first
            self.first = (firsts + 1, waited + first_wait + (t1 - t0))
        self.loader = info
        self.trains(info)

    def probe_trains(self, probe: tuple[Any, ...]) -> bool:
        """Whether the batch that began an evaluation (``probe``), now followed by a
        backward() or an optimizer step, was training's: it came with gradients on, or it
        is the iteration's only batch (a loop that turns gradients on around its steps
        alone). A validation batch taken under no_grad between a batch and its backward()
        comes after the iteration's training batch (of known size or not)."""
        return probe[5] or not (self.samples or self.fetched_n == self.n)

    def trains(self, info: list[Any]) -> None:
        """The batches of ``info``'s iterator are what trains, and its loader's next
        ones."""
        info[5] = True
        self.loader_trained = True
        loader = info[4]() if info[4] is not None else None
        if loader is not None:
            self.train_loaders.add(loader)

    def inference_work(self, batch: int | None, now: float, wait: float = 0.0) -> None:
        """A batch (or a generate() call) before any backward(): a process that keeps
        doing this with no backward() at all serves or evaluates a model, it does not train.
        ``wait``: the seconds its DataLoader kept the process waiting for the batch (the
        first batch's wait, before the process counts as serving, is start-up's)."""
        if self.infer_t0 is None:
            self.infer_t0 = now
            self.infer_compile0 = self.phase_seconds[COMPILE]
        else:
            self.infer_wait += wait
        self.infer_batches += 1
        if batch:
            self.infer_samples += batch
            self.infer_batch_size = batch
        if self.phase is STARTUP and (self.infer_batches >= INFER_BATCHES
                                      or self.generate_calls >= INFER_GENERATE_CALLS):
            busy = now - self.infer_t0 - (self.phase_seconds[COMPILE] - self.infer_compile0)
            if busy >= INFER_AFTER:
                # since its first batch it has been serving: that time is inference
                self.switch(INFERENCE, now)
                # its batch now: an evaluation's, should the process train after all
                self.infer_eval_batch = self.infer_batch_size
                moved = min(busy, self.phase_seconds[STARTUP])
                self.phase_seconds[STARTUP] -= moved
                self.phase_seconds[INFERENCE] += moved
                if not self.framework.looked:
                    # the framework that drives it (Trainer.predict, Lightning's predict
                    # loop), looked for once from the inference batch's own stack
                    try:
                        self.framework.find(sys._getframe(2), self.problems)
                    except Exception:
                        self.fault()

    def is_model(self, module: Any) -> bool:
        """Whether ``module.eval()`` switches the model (not a frozen layer inside it):
        it holds at least half of the parameter tensors the optimizer trains."""
        if not self.opt_params:
            ref = self.primary
            opt = ref() if ref is not None else None
            if opt is not None:
                self.opt_params = sum(len(g["params"]) for g in opt.param_groups)
        if not self.opt_params:
            return len(module._modules) >= 2  # no optimizer known: not a leaf layer
        need = max(1, int(self.opt_params * EVAL_MODULE_SHARE))
        for i, _ in enumerate(module.parameters(), 1):
            if i >= need:
                return True
        return False

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
            held.append((now, self.wait, self.samples, self.first, self.excluded))
            if now - held[0][0] < BACKWARD_GRACE and len(held) < MAX_HELD_BACKWARDS:
                return  # an optimizer exists: its first step may be on the way
            # it never stepped (an optimizer built only for its learning rate?): count
            # the held backward() ends as the iterations they were, each with the totals
            # it ended with (samples: this iteration's, so far)
            self.held_backwards = []
            base = 0
            for end, wait, samples, first, excluded in held:
                self.samples, self.backwards = samples - base, 1
                self.end_iteration(False, end, (wait, first, excluded))
                base = samples
            self.source = BACKWARD
            return
        self.source = BACKWARD
        self.end_iteration(False)

    def end_iteration(self, skipped: Any, now: float | None = None,
                      totals: tuple[float, tuple[int, float], float] | None = None) -> None:
        """An iteration ended (at ``now``; ``totals``: the wait, first batches and excluded
        seconds it ended with, when not the current ones). The optimizer step hook's
        short way (_on_optimizer_step) records the same, without skip flags and start."""
        if now is None:
            now = _perf()
        if self.phase is not TRAIN:
            self._training_again(now)
        n = self.n
        wait, first, excluded = (self.wait, self.first, self.excluded) if totals is None \
            else totals
        self.pending.append((n, now, wait, self.samples, self.backwards, excluded, first,
                             skipped, self.iter_start))
        self.loss_of = (n, self.loss_tensor)
        self.n = n + 1
        if skipped is True:
            self.skipped_known += 1
        self.iter_start = now
        self.samples = 0
        self.backwards = 0
        if self.mem_due:
            self.memory_at_step_end()
        if self.thread is None:
            self.start_reporting()

    def memory_at_step_end(self) -> None:
        """The allocator's counters now, at an iteration's end, for the next report (host
        side: no device synchronization), and a look for sparse gradients while they
        exist; once per report, not per step, on the training's own thread."""
        self.mem_due = False
        self.mem_end = self._guarded(self._memory, "memory", None)
        if not self.sparse_grads:
            self._guarded(self._look_for_sparse_grads, "sparse_grads", None)

    def _training_again(self, now: float) -> None:
        """An iteration ends outside the training phase: the first one (start-up ends,
        and the framework driving the loop is looked for), or the first after an
        evaluation that no training batch closed."""
        phase = self.phase
        probe = self.eval_probe
        if phase is EVAL and probe is not None and probe[0] is self.last_info \
                and self.probe_trains(probe):
            # the batch that began the evaluation ends in this optimizer step with no
            # backward() between: training's, its gradients taken another way
            # (torch.autograd.grad, torch.func), its loader a training one
            self.undo_eval(now)
            self.trains(probe[0])
        elif phase is EVAL or phase is STARTUP or phase is INFERENCE:
            self.switch(TRAIN, now)
        if self.phase_seconds[INFERENCE]:
            self._evaluated_first(now)
        if not self.framework.looked:
            try:
                self.framework.find(sys._getframe(2), self.problems)
                # its checkpoint method at once: the first save may come a few steps on,
                # before the reporting thread's next turn
                _patch_framework(self)
            except Exception:
                self.fault()

    def _evaluated_first(self, now: float) -> None:
        """The process read as serving a model trains after all (its first iteration just
        ended at ``now``): what it ran before was an evaluation ahead of training
        (Trainer.evaluate() before train(), eval_on_start, Lightning's validate() before
        fit(), a loop's own baseline). Its time until its loader's end, its batches and
        samples are evaluation's; it was never an inference process. The batches of this
        first iteration (its micro-batches, its samples), fetched before its backward(),
        are training's."""
        sec = self.phase_seconds
        moved = sec[INFERENCE]
        done = self.infer_done
        if done is not None:
            # where its last evaluation loader ended (or the training loader began): the
            # rest is training's start-up (the Trainer's set-up, this first iteration);
            # compiling has its own seconds already. The training loader's batches
            # before this backward() came after it
            seconds, batches, samples, wait = done
            evaluated = min(moved, seconds)
            sec[STARTUP] += moved - evaluated
            self.samples = max(0, self.samples - samples)  # the first iteration counted them
            self.wait = max(0.0, self.wait - wait)
        else:  # no DataLoader at all (generate() or a model's passes, its own loop)
            evaluated = moved
            batches = self.infer_batches - self.generate_calls
            samples = self.infer_samples - self.gen_samples
            wait = self.infer_wait
        if batches <= 0:  # generate() calls without a loader feeding them
            batches, samples = self.generate_calls, self.gen_samples
        sec[EVAL] += evaluated
        sec[INFERENCE] = 0.0
        self.eval_batches += batches
        self.eval_samples += samples
        self.eval_wait += wait
        if self.eval_batch_size is None:
            self.eval_batch_size = self.infer_eval_batch
        # the framework was looked for from the evaluation's stack: again from training's
        # (inside a batch-size finder or not; its checkpoint method)
        self.framework = Framework()

    def scaler_update(self, scaler: Any) -> None:
        ref = self.scaler
        if ref is None or ref() is not scaler:
            self.scaler = weakref.ref(scaler)
        if self.found_inf:
            skipped, self.found_inf = self.found_inf, []
        else:
            skipped = not self.opt_stepped
        self.opt_stepped = False  # for the next iteration (only the scaler's path reads it)
        seen = self.unscaled
        if seen is not None:  # the scaler clocks still; that one stepped beside it
            self.unscaled = None
            _in_turn(self, seen)
        if self.source is OPTIMIZER:
            self.end_iteration(skipped)
        else:
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
        # each process starts its timer at its own point of the interval, so that the
        # ranks of a host, started together, do not all report in the same millisecond
        if stop.wait(sender.report_offset()):
            return
        self.report()
        while not stop.wait(sender.REPORT_INTERVAL):
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
        if self.compute_device is None and self.loss_taken is not None:
            self._guarded(self._loss_device, "device", None)
        pending = self.pending
        taken = []
        while pending:
            try:
                taken.append(pending.popleft())
            except IndexError:
                break
        steps, self.prev_step = _step_lists(taken, self.prev_step)
        for rec in steps:
            if isinstance(rec[5], list):
                rec[5] = _Flags(rec[5])
            self.held.append(rec)
        try:
            with _capture_lock:
                if not _captures:
                    self._resolve(final)
        except Exception:
            # the device reads failed: the steps still go, with what is known of them
            self.fault()
            self.inflight = None
            for rec in self.held:
                if isinstance(rec[5], _Flags):
                    rec[5] = None
                if rec[7] is _PENDING:
                    rec[7] = None
        held = self.held
        ready = 0
        while ready < len(held) and not isinstance(held[ready][5], _Flags) \
                and held[ready][7] is not _PENDING and not self._first_undecided(held[ready]):
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
        try:
            _late_patches(self)
        except Exception:
            self.fault()
        try:
            config = self._config()
        except Exception as err:  # each fact has its own guard: this is a bug of ours
            self.problems.add("config", err)
            config = self.last_config
        status = self._status(final)
        config_due = config is not None and (
            config != self.last_config or now - self.last_config_time >= CONFIG_INTERVAL)
        status_due = status != self.last_status
        if not steps and not final and not config_due and not status_due \
                and now - self.last_send < HEARTBEAT_INTERVAL:
            return
        offset = now - _perf()  # perf_counter → Unix seconds, fresh each report
        window = {"steps": len(steps), "skipped": 0, "timed": 0, "step_seconds": 0.0,
                  "data_wait_seconds": 0.0, "samples": 0, "sample_seconds": 0.0,
                  "iterators": 0, "first_batch_wait_seconds": 0.0, "micro_batches": 0,
                  "micro_counted": 0}
        records = []
        # backward() calls of several optimizers stepping in turn are no micro-batches;
        # the first iteration's one backward() before the primary optimizer's step says
        # neither until that optimizer steps again (a GAN's generator, its discriminator
        # next): unknown, not one, but in the exit report, which says what it knows (those
        # of several are held till then: _first_undecided)
        several = self.several_opts
        undecided = self.n < 2 and not final
        for n, end, dur, wait, batch, skipped, first, loss, micro in steps:
            if several or (undecided and n == 0):
                micro = None
            if micro is not None:
                window["micro_batches"] += micro
                window["micro_counted"] += 1
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
                first_batch_wait_seconds=None if first is None else first[1], loss=loss,
                micro_batches=micro))
        rank, local_rank, world = self._guarded(self._rank, "rank", (None, None, None))
        gpu, uuid = self._guarded(self._gpu, "gpu", (None, None))
        # memory as the last iteration's end left it (see mem_end); while not training, or
        # at the exit, as it is now
        mem = self.mem_end
        self.mem_end = None
        if final or self.phase is not TRAIN or not self.n:
            mem = self._guarded(self._memory, "memory", {})
        elif mem is None:
            mem = {}  # no iteration ended since the last report: the next one reads it
        self.mem_due = not final
        header: dict[str, Any] = {
            "kind": "exit" if final else "report", "pid": self.pid, "seq": self.seq,
            "t": now, "rank": rank, "local_rank": local_rank, "world_size": world,
            "gpu": gpu, "uuid": uuid, "steps_total": self.n,
            "skipped_total": self.skipped_known + self.skipped_resolved,
            # (none once no scaler scales: a read in flight when it stopped may have set it)
            "window": window,
            "loss_scale": self.loss_scale if self.scaler is not None else None, **mem,
            "config": config if config_due else None,
            "exit_reason": (self.exit_reason or "exited") if final else None,
            "error": self.error, "sender_dropped": dict(self.dropped),
            "hook_errors": self.errors, **status,
            "phases": self._phase_seconds(final),
        }
        self._send(protocol.encode(header, records))
        self.seq += 1
        self.last_send = now
        self.last_status = status
        if config_due:
            self.last_config, self.last_config_time = config, now

    def _first_undecided(self, rec: list[Any]) -> bool:
        """Whether ``rec`` is the first iteration's record with several backward() calls
        while the primary optimizer has not stepped a second time: until then nothing
        says whether they were micro-batches or the calls of several optimizers stepping
        in turn (_turns), so it waits for that (or for the exit report, which takes all)."""
        return rec[0] == 0 and (rec[8] or 0) > 1 and self.n < 2

    def _guarded(self, fn: Callable[[], Any], what: str, default: Any) -> Any:
        try:
            return fn()
        except Exception as err:
            self.problems.add(what, err)
            return default

    def _probe_pending(self, final: bool = False) -> tuple[Any, ...] | None:
        """The one batch that began an evaluation while no second batch or backward() has
        said what it was (a new training loader's first batch is taken back by its
        backward(): undo_eval). What it counted is not reported until then, or a report
        taken in between (a new loader's workers can take a second to start) would say an
        evaluation that the next report takes back. The exit report (``final``) holds
        nothing back: no backward() comes after it, and what the batch began was the
        evaluation (a sample drawn from a validation loader before the process ended)."""
        probe = self.eval_probe
        return probe if probe is not None and self.phase is EVAL and not final else None

    def _status(self, final: bool = False) -> dict[str, Any]:
        """What changes rarely: the phase, evaluation and inference counts, problems
        (``final``: for the exit report, see _probe_pending)."""
        eval_batches, eval_samples, eval_wait = (self.eval_batches, self.eval_samples,
                                                 self.eval_wait)
        phase = self.phase
        probe = self._probe_pending(final)
        if probe is not None:
            info, t0, t1 = probe[0], probe[1], probe[2]
            if self.phase_t0 >= t0:  # its batch began the evaluation: training until it
                phase = TRAIN  # says otherwise (one made while evaluating stays evaluation)
            eval_batches -= 1
            eval_samples -= info[0] or 0
            eval_wait -= t1 - t0 + (probe[3] or 0.0)
        return {
            "phase": phase,
            "compiles": self.compiles,
            "checkpoints": self.saves,
            "eval": {"batches": max(eval_batches, 0), "samples": max(eval_samples, 0),
                     "batch_size": self.eval_batch_size if probe is None else probe[4],
                     "wait_seconds": round(max(eval_wait, 0.0), 3),
                     **({"train_loader": True} if self.eval_train_loader else {})},
            # a process that trains is no inference process, whatever came before its
            # first backward() (prefetched batches, a sample generate() at start-up)
            "inference": {} if self.backward_seen else {
                "batches": self.infer_batches, "samples": self.infer_samples,
                "batch_size": self.infer_batch_size, "generate_calls": self.generate_calls,
                "wait_seconds": round(self.infer_wait, 3)},
            "problems": self.problems.as_list(),
            "hook_state": "off" if self.off else "on",
            **self._cleanup_status(),
        }

    def _cleanup_status(self) -> dict[str, Any]:
        """The cleanups called while training (``calls``, and the seconds spent inside
        them, ``call_seconds``, by name), once any was."""
        got = dict(self.cleanups)  # another thread may add a name meanwhile
        if not got:
            return {}
        return {"calls": {k: int(v[0]) for k, v in got.items()},
                "call_seconds": {k: round(v[1], 4) for k, v in got.items()}}

    def _phase_seconds(self, final: bool = False) -> dict[str, float]:
        """Seconds in each phase so far, the one in force included (but not an
        evaluation begun by one batch whose kind is still open, unless ``final``: see
        _probe_pending). Never below 0: the daemon refuses a report that says so."""
        phase, t0 = self.phase, self.phase_t0
        out = dict(self.phase_seconds)
        probe = self._probe_pending(final)
        if probe is None:
            out[phase] = out.get(phase, 0.0) + max(0.0, _perf() - t0)
        else:  # evaluating before that loader began: evaluation either way
            out[phase] = out.get(phase, 0.0) + max(0.0, self.eval_end(probe[0], probe[1]) - t0)
        return {k: round(max(0.0, v), 3) for k, v in out.items() if v > 0}

    def _send(self, data: bytes) -> None:
        if self.sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.setblocking(False)
            self.sock = sock
        for path in self.paths:
            reason = sender.send(self.sock, data, path)
            if reason is not None:
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
                    scale_read = values.pop()
                    if self.scaler is not None:  # (none: it scales no more, _scaler_gone)
                        self.loss_scale = float(scale_read)
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
                try:
                    loss_rec[7] = float(loss.detach())
                except Exception as err:
                    self._loss_unreadable(loss_rec, err)
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

        def submit() -> tuple[Any, Any]:
            with torch.cuda.device(device), torch.cuda.stream(stream):
                stacked = torch.stack([t.float().reshape(()) for t in tensors])
                buf = torch.empty(stacked.shape, dtype=torch.float32, pin_memory=True)
                buf.copy_(stacked, non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
            return event, buf
        try:
            event, buf = submit()
        except Exception as err:
            if loss_rec is None:
                raise
            # the loss could not be read (its memory taken back, as CUDA graphs' trees do
            # with a compiled step's outputs at the next replay): the flags and scale go
            # without it
            self._loss_unreadable(loss_rec, err)
            loss_rec = None
            tensors.pop()  # (appended last)
            if not tensors:
                return
            event, buf = submit()
        for rec in unresolved:
            rec[5].submitted = True
        self.inflight = (event, buf, unresolved, with_scale, loss_rec)

    def _loss_unreadable(self, rec: list[Any], err: BaseException) -> None:
        """Reading the loss of step record ``rec`` raised: that step goes without one, the
        failure is said once (``problems``: "loss"), and no loss is read again in this
        process (what failed once, as a loss the framework's memory pool takes back, fails
        at nearly every report; counted as the hook's own errors it would turn the hook off
        within a minute)."""
        rec[7] = None
        self.loss_off = True
        self.problems.add("loss", err)

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
        # a plain tensor only: a subclass's reads dispatch to its own code on this thread
        # (a DTensor's, under tensor parallelism's loss_parallel(), may redistribute)
        if type(t) is not torch.Tensor or t.numel() != 1 or not t.is_floating_point() \
                or self.loss_off:
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
        """The device the job trains on: its optimizer's first parameter's, or where the
        parameters live on the host while the steps run on a GPU (FSDP's CPU offload, an
        optimizer offloaded to the CPU), the loss's."""
        dev = getattr(self._first_param(), "device", None)
        if dev is not None and dev.type == "cpu":
            dev = self._loss_device() or dev
        if dev is not None:
            self.device = dev
        return self.device

    def _first_param(self) -> Any:
        """The primary optimizer's first parameter (None without one)."""
        ref = self.primary
        opt = ref() if ref is not None else None
        try:
            return opt.param_groups[0]["params"][0] if opt is not None else None
        except (IndexError, KeyError, AttributeError, TypeError):
            return None

    def _loss_device(self) -> Any:
        """The GPU the last loss backward() ran from was computed on (None before one, or
        where it was not on a GPU); kept once seen."""
        if self.compute_device is None:
            for held in (self.loss_taken, self.loss_of):
                dev = getattr(held[1], "device", None) if held is not None else None
                if getattr(dev, "type", None) == "cuda":
                    self.compute_device = dev
                    break
        return self.compute_device

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
        """The settings, each read under its own guard (a failure costs that fact, said
        once in ``problems``). ``in_training``: read after the first iteration, so what
        training may still change (autocast, TF32, the optimizer) is what is in force."""
        cfg: dict[str, Any] = {}
        p = self.problems
        read = facts.read
        loader = self.loader
        if loader is not None:
            cfg.update(loader[1])
        cfg["in_training"] = self.n > 0
        # autocast in the last iteration that finished (or the one under way: the
        # iteration it was entered in is kept, not what each iteration entered); before
        # the first, any seen
        amp = (self.amp_iter if self.amp_n >= self.n - 1 else None) if self.n \
            else self.autocast_seen
        cfg["autocast"] = amp is not None
        cfg["autocast_dtype"] = amp
        read(cfg, "tf32", facts.matmul_tf32, p)
        read(cfg, "cudnn_tf32", facts.cudnn_tf32, p)
        read(cfg, "float32_matmul_precision", facts.float32_matmul_precision, p)
        read(cfg, "cudnn_benchmark", lambda: bool(torch.backends.cudnn.benchmark), p)
        read(cfg, "deterministic", facts.deterministic, p)
        read(cfg, "anomaly_detection", facts.anomaly_detection, p)
        read(cfg, "launch_blocking", facts.launch_blocking, p)
        read(cfg, "no_alloc_cache", facts.no_alloc_cache, p)
        read(cfg, "dist_debug_detail", facts.dist_debug_detail, p)
        ref = self.primary
        opt = ref() if ref is not None else None
        if opt is not None:
            defaults = getattr(opt, "defaults", {}) or {}
            read(cfg, "optimizer", lambda: type(opt).__name__, p)
            read(cfg, "fused_optimizer", lambda: bool(defaults.get("fused")), p)
            read(cfg, "foreach_optimizer", lambda: defaults.get("foreach"), p)
            read(cfg, "param_dtype", self._param_dtype, p)
            # an embedding built with sparse=True (seen as a submodule), or a sparse
            # .grad seen at an iteration's end (memory_at_step_end); once seen, it stays
            cfg["sparse_grads"] = self.sparse_grads
        cfg["grad_scaler"] = self.scaler is not None
        cfg["gradient_checkpointing"] = self.checkpointing
        cfg["uses_dataloader"] = self.loader_made
        cfg["uses_conv"] = self.uses_conv
        facts.read_known(cfg, "channels_last", self._channels_last, p)
        if self.source is not None:
            cfg["step_source"] = self.source
        if self.data_parallel is not None:
            facts.read_known(cfg, "data_parallel_gpus", self._data_parallel_gpus, p)
        if self.ddp is not None:
            facts.read_known(cfg, "ddp_find_unused",
                             lambda: self._ddp_flag("find_unused_parameters"), p)
            facts.read_known(cfg, "ddp_static_graph", lambda: self._ddp_flag("static_graph"), p)
            if cfg.get("ddp_find_unused"):
                facts.read_known(cfg, "ddp_unused_bytes", self._ddp_unused_bytes, p)
        facts.read_known(cfg, "fsdp_cpu_offload", self._fsdp_cpu_offload, p)
        if cfg.get("fsdp_cpu_offload") is not None and self.fsdp_version is not None:
            cfg["fsdp_version"] = self.fsdp_version
        read(cfg, "device", lambda: None if self._device() is None else str(self._device()), p)
        cfg["torch_version"] = torch.__version__
        try:
            self.framework.settings(cfg, p)
        except Exception as err:
            p.add("framework", err)
        return cfg

    def _look_for_sparse_grads(self) -> None:
        """Sets ``sparse_grads`` on a sparse ``.grad`` among the first SPARSE_SCAN
        parameters of the primary optimizer, if it takes them (SGD, SparseAdam, Adagrad).

        Only on the thread that trains, at an iteration's end: there a ``.grad`` is what
        the backward() left. Read on the reporting thread, ``param.grad`` raced autograd's
        accumulation, which swaps the gradient without holding the GIL: the training
        process died of a corrupted heap (SIGSEGV, SIGABRT) about once in twenty 3-s runs
        of a loop stepping 2 000 times a second, every time with reports 2 ms apart."""
        ref = self.primary
        opt = ref() if ref is not None else None
        if opt is None or type(opt).__name__ not in _SPARSE_OPTIMIZERS:
            return
        seen = 0
        for group in opt.param_groups:
            for param in group["params"]:
                grad = param.grad
                if grad is not None and grad.is_sparse:
                    self.sparse_grads = True
                    return
                seen += 1
                if seen >= SPARSE_SCAN:
                    return

    def _data_parallel_gpus(self) -> int | None:
        """How many devices the job's ``torch.nn.DataParallel`` replicates its model over
        (``device_ids``; on a machine without CUDA none); None once it is gone."""
        ref = self.data_parallel
        dp = ref() if ref is not None else None
        ids = getattr(dp, "device_ids", None)  # set by __init__ after the module
        return None if ids is None else len(ids)

    def _ddp_flag(self, name: str) -> bool | None:
        """The job's DistributedDataParallel's boolean setting ``name`` (None once it is
        gone, or before its __init__ set it)."""
        ref = self.ddp
        value = getattr(ref() if ref is not None else None, name, None)
        return None if value is None else bool(value)

    def _ddp_unused_bytes(self) -> int | None:
        """Bytes of the parameters the forward pass left unused, as DDP's own statistics
        recorded them at the iterations it samples (1 to 10, then every 100th: torch's DDP
        logger, which copies them out under the reducer's lock); None before it sampled
        one. Only where find_unused_parameters is on: otherwise DDP does not look."""
        ref = self.ddp
        ddp = ref() if ref is not None else None
        if ddp is None or getattr(ddp, "logger", None) is None:
            return None  # (its __init__ makes the logger last: it may be under way)
        data = ddp._get_ddp_logging_data()
        if not data.get("iteration") or "unused_parameter_size" not in data:
            return None
        return int(data["unused_parameter_size"])

    def _fsdp_cpu_offload(self) -> bool | None:
        """Whether the job's FSDP units keep their parameters on the CPU (FSDP1's
        ``cpu_offload.offload_params``: the optimizer step then runs on the CPU); None once
        the unit is gone. FSDP2 (``fully_shard``) registers no module, so its offload is
        read from the optimizer's first parameter: a DTensor sharded over a mesh of GPUs
        whose shard lives on the CPU (``CPUOffloadPolicy``). Sets ``fsdp_version``."""
        ref = self.fsdp
        unit = ref() if ref is not None else None
        offload = getattr(unit, "cpu_offload", None)  # set by __init__ after the module
        if offload is not None:
            self.fsdp_version = 1
            return bool(offload.offload_params)
        self.fsdp_version = None
        param = self._first_param()
        # a DTensor's mesh names the device its collectives run on; its local shard's
        # device is where the parameter is kept. Without offload FSDP2 and tensor
        # parallelism look alike from here: absent, not False
        mesh = getattr(param, "device_mesh", None) if type(param).__name__ == "DTensor" \
            else None
        if mesh is None or param.device.type != "cpu" or mesh.device_type == "cpu":
            return None
        self.fsdp_version = 2
        return True

    def _param_dtype(self) -> str | None:
        """The dtype the model computes in without autocast: FSDP1's mixed precision
        ``param_dtype`` where set (its kept parameters stay float32), else the optimizer's
        first parameter's ('bfloat16' for a model cast with ``model.to(torch.bfloat16)``)."""
        ref = self.fsdp
        unit = ref() if ref is not None else None
        mp = getattr(unit, "mixed_precision", None)
        dtype = getattr(mp, "param_dtype", None)
        if dtype is None:
            dtype = getattr(self._first_param(), "dtype", None)
        if dtype is None:
            return None
        name = str(dtype)
        return name[6:] if name.startswith("torch.") else name  # (3.8: no removeprefix)

    def _channels_last(self) -> bool | None:
        """Whether the conv weights are channels_last (the memory format a conv net gets
        from ``model.to(memory_format=torch.channels_last)``), from the first 2-d conv
        whose weight tells the formats apart; None when none does."""
        for ref in self.convs:
            conv = ref()
            # a parametrized weight (weight_norm, spectral_norm, orthogonal) is computed
            # when read: on this thread, with gradients on, and spectral_norm's power
            # iteration updates its buffers in training mode. Not read
            if conv is None or parametrize.is_parametrized(conv, "weight"):
                continue
            weight = getattr(conv, "weight", None)
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


def _step_lists(records: list[tuple[Any, ...]], prev: tuple[Any, ...] | None
                ) -> tuple[list[list[Any]], tuple[Any, ...] | None]:
    """Each iteration's record as the reporter keeps it, from those the training thread
    appended to ``pending``, in order; ``prev``: the record before the first (None: none
    taken yet). Returns the lists and the new ``prev``.

    A record is ``(n, end, wait, samples, backwards, excluded, first)``, plus ``(skipped,
    start)`` where ``end_iteration()`` made it (the optimizer step hook's short way
    leaves them out: not skipped, and started where the iteration before ended).
    ``wait``, ``excluded`` (seconds) and ``first`` (iterators, seconds) are running
    totals: the iteration's share is the difference from the record before (from zero
    for the first one). After records lost to an overflowing ``pending`` (the reporting
    thread stalled), the first one kept has no record before it: its step time, data
    wait and first batches are unknown.

    The list: ``[n, end, step seconds, data wait, samples, skipped, (iterators, their
    wait) or None, loss, micro-batches]``, skipped and loss as the reporter resolves
    them."""
    out = []
    for rec in records:
        n, end, wait, samples, backwards, excluded, first = rec[:7]
        skipped, start = (rec[7], rec[8]) if len(rec) > 7 else (False, None)
        if prev is not None and prev[0] == n - 1:
            start = prev[1]
            base_wait, base_excluded, base_first = prev[2], prev[5], prev[6]
        elif n == 0:
            base_wait, base_excluded, base_first = 0.0, 0.0, (0, 0.0)
        else:
            start, base_wait, base_excluded, base_first = None, wait, excluded, first
        fresh = None
        if first is not base_first and first[0] != base_first[0]:
            fresh = (first[0] - base_first[0], first[1] - base_first[1])
        out.append([n, end, None if start is None else end - start - (excluded - base_excluded),
                    wait - base_wait, samples or None, skipped, fresh, None, backwards or None])
        prev = rec
    return out, prev


# -- the wrappers (module level, so detach() can find and restore them) --------------------

def _on_optimizer_step(optimizer: Any, _args: Any, _kwargs: Any) -> None:
    h = _hook
    if h is None:
        return
    try:
        clock = h.clock
        if clock is not None and clock() is optimizer:
            # every step after the first, in a loop without a GradScaler: one check for
            # what the way below decides (the hook is on, no scaler clocks, this optimizer
            # does, steps, not backward(), end iterations, the process trains and
            # reports). What end_iteration() does then, in place: the record without
            # skip flags and start (_step_lists() reads both kinds)
            n = h.n
            h.pending.append((n, _perf(), h.wait, h.samples, h.backwards, h.excluded,
                              h.first))
            h.loss_of = (n, h.loss_tensor)
            h.n = n + 1
            h.samples = 0
            h.backwards = 0
            if h.mem_due:
                h.memory_at_step_end()
            return
        if h.off:
            return
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
                h.turn_bw = (h.n, h.backwards)
            else:
                _turns(h, optimizer, False)
            return
        if h.scaler_mode and not _scaler_gone(h, optimizer):
            return  # an extra optimizer stepped outside the scaler: the scaler clocks
        ref = h.primary
        if ref is None or ref() is None:
            h.primary = weakref.ref(optimizer)
        elif not _turns(h, optimizer, True):
            return  # several optimizers: the primary's steps are the iteration clock
        if h.source is OPTIMIZER:
            h.end_iteration(False)
        else:
            h.step_end(False)
        if h.n <= 1 and not h.sparse_grads:  # at the first step; later, once a report
            h._guarded(h._look_for_sparse_grads, "sparse_grads", None)  # (mem_due)
        if h.source is OPTIMIZER and not h.off and h.phase is TRAIN \
                and h.thread is not None:
            h.clock = h.primary  # its next steps take the short way (switch() ends it)
    except Exception:
        h.fault()


def _turns(h: _Hook, optimizer: Any, clocks: bool) -> bool:
    """``optimizer`` stepped, the primary one known: whether it is the primary (now).
    Another optimizer's step is noted (``other_opt``), and the primary's steps leave the
    short way until the primary steps again. The same other one stepping twice with the
    primary idle between becomes the primary: a new optimizer for a later phase of
    training (more layers unfrozen, a second Trainer) while the first one lives on (a
    list, a scheduler or an old Trainer holds it); ``clocks``: steps end iterations, and
    its first step, noted, was one. The primary stepping after another optimizer may
    mean that several step in turn (a GAN's two: _in_turn)."""
    primary = h.primary()
    other = h.other_opt
    if primary is optimizer:
        if not clocks:
            h.turn_bw = (h.n, h.backwards)
        if other is not None:
            h.other_opt = None
            _in_turn(h, other)
        return True
    h.clock = None  # the primary's next step takes the long way, to see the turn
    again = other is not None and other[0]() is optimizer
    if primary is None or again:
        h.primary = weakref.ref(optimizer)
        h.other_opt = None
        if again and clocks:
            _end_noted(h, other)
        if again:
            _framework_again(h)
        return True
    h.other_opt = _noted(h, optimizer)
    return False


def _framework_again(h: _Hook) -> None:
    """A new optimizer clocks iterations (_turns, _scaler_gone): what drives it may be
    another framework, or another object of the same (a second Trainer, whose settings
    are the ones in force now): looked for again from this step's stack, and its
    checkpoint method wrapped."""
    try:
        h.framework = Framework()
        h.framework_patched = False
        h.framework.find(sys._getframe(3), h.problems)
        _patch_framework(h)
    except Exception:
        h.fault()


def _in_turn(h: _Hook, noted: tuple[Any, ...]) -> None:
    """Another optimizer's step (``noted``) came in an iteration of the primary's: several
    optimizers step in turn (``several_opts``) where it updates parameters of its own and
    a backward() of its own came before it (a GAN's discriminator and generator). One
    stepped straight after the primary, after the same backward() calls, splits one
    model's parameters (Muon for the matrices and AdamW for the rest): micro-batches are
    still micro-batches."""
    them = noted[0]()
    primary = h.primary() if h.primary is not None else None
    if them is None or primary is None or not noted[7] or h.several_opts \
            or them in h.shared_opts:
        return
    if _disjoint(primary, them):
        h.several_opts = True
    else:
        h.shared_opts.add(them)


def _noted(h: _Hook, optimizer: Any) -> tuple[Any, ...]:
    """``optimizer``'s step now, noted with the totals it ended with (a weak reference to
    it, the end, the wait, samples, backward() calls, excluded seconds, first batches),
    and whether a backward() came since the primary's last step (turn_bw)."""
    n, before = h.turn_bw
    own = h.backwards > (before if n == h.n else 0)
    return (weakref.ref(optimizer), _perf(), h.wait, h.samples, h.backwards, h.excluded,
            h.first, own)


def _end_noted(h: _Hook, noted: tuple[Any, ...]) -> None:
    """The iteration a step noted before (_noted) ended, recorded now with the totals it
    ended with; what came since stays the current iteration's."""
    if h.source is not OPTIMIZER:
        return
    end, wait, samples, backwards, excluded, first = noted[1:7]
    samples_now, backwards_now = h.samples, h.backwards
    h.samples, h.backwards = samples, backwards
    h.end_iteration(False, end, (wait, first, excluded))
    h.samples = max(samples_now - samples, 0)
    h.backwards = max(backwards_now - backwards, 0)


def _scaler_gone(h: _Hook, optimizer: Any) -> bool:
    """An optimizer stepped outside the GradScaler that clocks iterations: whether the
    scaler clocks them no more. It does not once the same optimizer stepped outside it
    twice with no update() between: training again without loss scaling (a bf16 or fp32
    run after an fp16 one in the same process, a notebook run again with the advice
    taken). That optimizer clocks iterations then, its first of the two steps one too. An
    optimizer stepped outside the scaler at each iteration beside it (a GAN's second,
    unscaled) leaves the scaler the clock, and so does one stepped at every micro-batch
    while the scaler's loss is scaled between (a probe head's optimizer beside a model
    that accumulates: scale() was called since its step before)."""
    seen = h.unscaled
    if seen is None or seen[0]() is not optimizer or seen[8] is not h.scaled:
        h.unscaled = (*_noted(h, optimizer), h.scaled)
        return False
    h.unscaled = None
    h.scaler_mode = False
    # nor does it scale the loss: the settings say no GradScaler, and its scale (the
    # first run's, 65536 on the H200 with fp16 then bf16) is no longer read as the loss
    # scale; its next update() takes it up again
    h.scaler = None
    h.loss_scale = None
    h.primary = weakref.ref(optimizer)
    h.other_opt = None
    _end_noted(h, seen)
    _framework_again(h)
    return True


def _disjoint(a: Any, b: Any) -> bool:
    """Whether optimizers ``a`` and ``b`` update no parameter in common (False where their
    parameters cannot be read)."""
    try:
        mine = {id(p) for group in a.param_groups for p in group["params"]}
        return not any(id(p) in mine for group in b.param_groups for p in group["params"])
    except Exception:
        return False


def _wrap_scaler_step(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        h = _hook
        if h is None or h.off or not self.is_enabled():
            return orig(self, optimizer, *args, **kwargs)
        h.scaler_mode = True
        h.clock = None  # the scaler clocks iterations now, not the optimizer's steps
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
        if h is not None and not h.off:
            try:
                ref = h.scaler
                # the scaler seen before was enabled (scaler_update() saw no other), and a
                # GradScaler is enabled or not for life: no need to ask it again
                if (ref is not None and ref() is self) or self.is_enabled():
                    h.scaler_update(self)
            except Exception:
                h.fault()
        return result
    return update


def _wrap_cleanup(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``gc.collect`` or ``torch.cuda.empty_cache``: counted and timed while the job trains
    (a loop that frees memory at every step pays for it at every step: a collection walks
    every Python object; an emptied cache makes the next step's tensors cudaMalloc calls).
    Outside training they pass straight through."""
    def factory(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def cleanup(*args: Any, **kwargs: Any) -> Any:
            h = _hook
            if h is None or h.phase is not TRAIN or h.off:
                return orig(*args, **kwargs)
            t0 = _perf()
            try:
                return orig(*args, **kwargs)
            finally:
                _timed_call(h, name, t0)
        return cleanup
    return factory


def _timed_call(h: _Hook, name: str, t0: float) -> None:
    """One more call of ``name`` made while the job trains, begun at ``t0`` (``calls``,
    ``call_seconds``: protocol.CLEANUPS)."""
    try:
        got = h.cleanups.get(name)
        if got is None:
            got = h.cleanups[name] = [0, 0.0]
        got[0] += 1
        got[1] += _perf() - t0
    except Exception:
        h.fault()


def _wrap_next(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def __next__(self: Any) -> Any:
        h = _hook
        if h is None:
            return orig(self)
        t0 = _perf()
        try:
            batch = orig(self)
        except BaseException:
            # StopIteration at the end of the data (or the loader's own error): waited too
            _fetched(h, self, t0, _perf(), False)
            raise
        t1 = _perf()
        try:
            info = self._gpuwatch  # the facts _wrap_iter_init set
            if info is h.train_info:
                # the training loader's next batch while training (what nearly every
                # call is): what _fetched() would do then, decided there once. This
                # iterator gave a batch already, a backward() followed its batches, its
                # batch size is known, and the process trains with the hook on
                h.wait += t1 - t0
                h.samples += info[0]
                return batch
        except AttributeError:
            pass  # an iterator made before the hook attached: _fetched() says so
        except Exception:
            h.fault()
            return batch
        _fetched(h, self, t0, t1, True)
        return batch
    return __next__


def _fetched(h: _Hook, it: Any, t0: float, t1: float, got: bool) -> None:
    """A DataLoader iterator's ``__next__`` waited from ``t0`` to ``t1``; ``got``: a batch
    came (not StopIteration at the end of the data)."""
    try:
        if h.off:
            return
        # getattr, not __dict__: reading an instance's __dict__ makes Python keep its
        # attributes in a real dict from then on, and __next__'s read of _gpuwatch then
        # takes the slow way, every batch
        info = getattr(it, "_gpuwatch", None)
        if info is None and got:
            it._gpuwatch = None  # made before the hook attached: no facts (and no lookup)
        h.last_info = info
        if info is not None and info[5] is not True:
            h.bw_plain = False  # a backward() now would say that this loader trains
        # once training began, a loader whose batches no backward() followed evaluates
        # (info[5]: True once one did)
        if h.n and info is not None and info[5] is not True:
            h.other_batch(info if got else None, t0, t1)
            return
        if h.phase is EVAL:
            if info is not None and _evaluating_on(h):
                # the training loader read by the evaluation (a training accuracy): its
                # batches are the evaluation's, and its end is no training's
                if got:
                    h.eval_train_loader = True
                h.other_batch(info if got else None, t0, t1)
                return
            probe = h.eval_probe
            side = None
            if got and probe is not None and probe[5] and h.eval_model is None \
                    and info is not None and info[5] is True and probe[0] is not info \
                    and t0 - probe[2] < SIDE_BY_SIDE_GAP:
                # the one batch that began this evaluation came with gradients on, no
                # model.eval() before it, and a training loader's batch follows it at
                # once (nothing ran between the two): two loaders read side by side for
                # each step (zip(), Lightning's CombinedLoader), where it comes so in two
                # iterations in a row (a sample drawn now and then from another loader
                # comes so once; one drawn each step has its forward pass between)
                side = h.side
                h.side = (probe[0], h.n)
            if side is not None and side[0] is probe[0] and side[1] == h.n - 1:
                h.side = None
                h.undo_eval(t0)
                h.trains(probe[0])
            else:
                # the training loader again: evaluation is over, where this iterator was
                # made if that came after it began (an epoch's new iterator: the workers it
                # started are the epoch's cost, counted in its first batch's wait)
                h.switch(TRAIN, t0 if info is None or info[2] is None
                         else h.eval_end(info, t0))
                h.eval_probe = None
        elif h.phase is INFERENCE:
            # where an evaluation ahead of training ends, should the process train: a
            # loader's end, or another loader's first batch (after the last one's batch)
            if not got:
                _served(h, t1)
                h.infer_open = True
            elif info is not None and info[2] is not None:
                # (after generate() calls alone, no loader's batch: from this one's wait)
                _served(h, t0 if h.infer_t1 is None else h.infer_t1)
                h.infer_open = False
            if got:
                h.infer_t1 = t1
        h.wait += t1 - t0
        if h.iter_start is None:
            h.iter_start = t0
        if info is not None and got:
            h.loader = info
            h.fetched_n = h.n
            if info[0] is not None:
                h.samples += info[0]
            if info[2] is not None:  # this iterator's first batch
                h.wait += info[2]  # making the iterator (_wrap_iter_init)
                firsts, first_wait = h.first
                h.first = (firsts + 1, first_wait + info[2] + (t1 - t0))
                info[2] = None
            # its next batches take the short way in __next__ while this holds
            h.train_info = info if info[5] is True and info[0] is not None \
                and h.phase is TRAIN else _NOT_STEADY
        h.loader_seen = True
        if got and not h.backward_seen:
            h.inference_work(info[0] if info is not None else None, t1, t1 - t0)
    except Exception:
        h.fault()


def _evaluating_on(h: _Hook) -> bool:
    """Whether a training loader's batch now is the evaluation's: the model whose eval()
    began it is in eval mode still, and gradients are off (a training accuracy measured
    under torch.no_grad()). The Trainer fetches its next batches after an evaluation
    before its training_step calls model.train(), with gradients on: training's."""
    ref = h.eval_model
    model = ref() if ref is not None else None
    return model is not None and not model.training and not torch.is_grad_enabled()


def _generated(h: _Hook, t: float) -> None:
    """A generate() call ended at ``t`` in a process read as serving: the newest of its
    work, and, after its loader's end, where an evaluation ahead of training ends."""
    h.infer_t1 = t
    if h.infer_open:
        _served(h, t)


def _served(h: _Hook, t: float) -> None:
    """What a process read as serving had served by ``t`` (its seconds in the phase, its
    loaders' batches, samples and wait), for an evaluation ahead of training to end at."""
    h.infer_done = (h.phase_seconds[INFERENCE] + max(0.0, t - h.phase_t0),
                    h.infer_batches - h.generate_calls, h.infer_samples - h.gen_samples,
                    h.infer_wait)


# frameworks that rebuild a DataLoader around a batch sampler of their own (Accelerate's
# prepare() under several processes: DataLoaderShard(batch_sampler=BatchSamplerShard(...)))
_FRAMEWORK_MODULES = ("accelerate", "lightning", "pytorch_lightning", "lightning_fabric",
                      "transformers")


def _own_batch_sampler(bs: Any) -> str | None:
    """The class of the job's own batch sampler, or None where the batches come from torch's
    BatchSampler that a framework built from the DataLoader's batch_size (its own setting,
    ``per_device_train_batch_size``, is then the one to change). A framework's wrapper is
    looked through to the sampler it wraps."""
    wrapped = False
    for _ in range(4):
        if bs is None:
            return None
        inner = getattr(bs, "batch_sampler", None) or getattr(bs, "_batch_sampler", None) \
            if type(bs).__module__.startswith(_FRAMEWORK_MODULES) else None
        if inner is None:  # not a wrapper (Lightning's demos ship samplers of their own)
            break
        wrapped, bs = True, inner
    else:
        return None
    if wrapped and type(bs) is torch.utils.data.BatchSampler:
        return None
    return type(bs).__name__


def _weak(obj: Any) -> weakref.ref | None:
    """A weak reference to ``obj``, or None where its class takes none (``__slots__``)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


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
            sampler = None
            if batch is None:
                # batches made by a batch_sampler: its batch_size (where it has one) is the
                # one to change, and its class names where
                bs = getattr(loader, "batch_sampler", None)
                batch = getattr(bs, "batch_size", None)
                sampler = _own_batch_sampler(bs)
            # [batch size, config facts, seconds spent creating it until its first batch
            # (None after it), when its creation began, a weak reference to the loader,
            # True once a backward() followed its batches (None: not known yet)]
            self._gpuwatch = [batch if isinstance(batch, int) else None, {
                "num_workers": loader.num_workers,
                "pin_memory": bool(loader.pin_memory),
                "persistent_workers": bool(loader.persistent_workers),
                "prefetch_factor": loader.prefetch_factor if loader.num_workers else None,
                "batch_size": batch if isinstance(batch, int) else None,
                "batch_sampler": sampler,
            }, init, t0, _weak(loader), loader in h.train_loaders or None]
            if ("lightning.pytorch" in sys.modules or "pytorch_lightning" in sys.modules) \
                    and in_lightning_tuner(sys._getframe(1)):
                # a loader Lightning's tuner made for a trial (each of the BatchSizeFinder's
                # batch sizes): its first batch is no epoch's start
                self._gpuwatch[2] = None
            # starting the workers is waiting for data too (the cost that persistent
            # workers save at each epoch): counted with its first batch, as the training's
            # wait or the evaluation's, once that batch says which (_fetched)
            if h.iter_start is None:
                h.iter_start = t0
            h.loader_made = True
            if h.thread is None:
                h.start_reporting()
        except Exception:
            h.fault()
    return __init__


# torch.autograd.backward's parameters and their defaults (as in torch 2.13).
# Where the function has exactly these, its wrapper takes them by name: a call then packs
# no *args tuple and no **kwargs dict (Tensor.backward passes `inputs=` by keyword, which
# cost two dicts a call). Any other signature gets the wrapper that forwards *args.
_BACKWARD_PARAMETERS = (("tensors", inspect.Parameter.empty), ("grad_tensors", None),
                        ("retain_graph", None), ("create_graph", False),
                        ("grad_variables", None), ("inputs", None))


def _has_parameters(fn: Callable[..., Any],
                    expected: tuple[tuple[str, Any], ...]) -> bool:
    """Whether ``fn`` takes exactly ``expected`` (name, default), all positional or
    keyword: then a wrapper with the same parameters can pass them all on, by position."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if len(params) != len(expected):
        return False
    for i, (name, default) in enumerate(expected):  # (the hook runs on Python 3.8 too)
        p = params[i]
        if p.name != name or p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD \
                or p.default is not default:
            return False
    return True


def _backward_begins(h: _Hook, t: Any) -> None:
    """A top-level ``backward()`` on ``t`` begins: what it says, every check made. Once
    this ran, the next ones take the short way (``bw_plain``) until a phase changes or
    a loader not known to train gives a batch."""
    if h.off:
        return
    scaled = h.scaled
    if scaled is not None:  # a GradScaler is in use: the loss is what scale() got
        t = scaled[1] if scaled[0] is t else None
    h.loss_tensor = t
    h.backwards += 1
    h.backward_seen = True
    if h.infer_watch:
        _unwatch_forwards(h)
    if h.phase is EVAL:
        probe = h.eval_probe
        if probe is not None and probe[0] is h.last_info:
            if h.probe_trains(probe):
                h.undo_eval(_perf())
            else:
                # fetched with gradients off after this iteration's training batch (a
                # validation batch between a batch and its backward()): the evaluation's,
                # its loader no training one
                h.last_info = None
                h.switch(TRAIN, _perf())
        elif h.eval_run is not None and h.loader_trained \
                and not (h.samples or h.fetched_n == h.n):
            # a new training loader read several batches ahead, where a loader trained
            # before (a loop that trains on no DataLoader evaluates on its loader)
            h.undo_run(_perf())
        else:
            h.switch(TRAIN, _perf())
    info = h.last_info
    if info is not None and info[5] is not True:
        h.trains(info)
    h.bw_plain = True


def _wrap_backward(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.autograd.backward`` (which ``Tensor.backward`` calls): the loss, the
    micro-batches, what trains; the iteration's end where no optimizer clocks. Its depth
    tells a backward() run inside another (reentrant checkpointing) from a top-level one."""
    if not _has_parameters(orig, _BACKWARD_PARAMETERS):
        return _wrap_backward_any(orig)

    @functools.wraps(orig)
    def backward(tensors: Any, grad_tensors: Any = None, retain_graph: Any = None,
                 create_graph: Any = False, grad_variables: Any = None,
                 inputs: Any = None) -> Any:
        h = _hook
        if h is None:
            return orig(tensors, grad_tensors, retain_graph, create_graph, grad_variables,
                        inputs)
        depth = h.depth
        if not depth:
            try:
                if h.bw_plain:
                    # what _backward_begins() does once nothing else can change
                    scaled = h.scaled
                    h.loss_tensor = tensors if scaled is None else \
                        scaled[1] if scaled[0] is tensors else None
                    h.backwards += 1
                else:
                    _backward_begins(h, tensors)
            except Exception:
                h.fault()
        h.depth = depth + 1
        try:
            result = orig(tensors, grad_tensors, retain_graph, create_graph, grad_variables,
                          inputs)
        except BaseException:
            if not depth:
                _backward_failed(h)
            raise
        finally:
            h.depth = depth
        if not depth and h.source is not OPTIMIZER and not h.off:
            _backward_ended(h)
        return result
    return backward


def _backward_failed(h: _Hook) -> None:
    """A top-level backward() raised (CUDA out-of-memory, most often): let go of its loss.
    A backward that fails part way has not freed its graph, so the loss it ran on still
    holds every activation the forward saved. A job that catches the error and tries again
    (Trainer(auto_find_batch_size=True), accelerate's find_executable_batch_size,
    Lightning's batch size finder) would otherwise run its next attempt beside all of
    that memory, and fail again where it would have fit.

    What the iteration fetched did not train: its samples and micro-batches are dropped.
    Before the first iteration ended (a batch size finder's attempts), the first one starts
    over at its next batch: the attempts were start-up (the phase says so), not a step."""
    try:
        h.loss_tensor = None
        h.scaled = None
        h.samples = 0
        h.backwards = 0
        if h.n == 0 and not h.held_backwards:
            h.iter_start = None
            h.wait = 0.0
            h.first = (0, 0.0)
            h.excluded = 0.0
    except Exception:
        h.fault()  # the job's own error is re-raised whatever happens here


def _backward_ended(h: _Hook) -> None:
    """A top-level backward() returned where no optimizer clocks the iterations: it ends
    one (or is held while an optimizer may still step)."""
    try:
        if h.source is BACKWARD:
            h.end_iteration(False)
        else:
            h.backward_end()
    except Exception:
        h.fault()


def _wrap_backward_any(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``_wrap_backward`` for a ``torch.autograd.backward`` of other parameters."""
    @functools.wraps(orig)
    def backward(*args: Any, **kwargs: Any) -> Any:
        h = _hook
        if h is None:
            return orig(*args, **kwargs)
        depth = h.depth
        if not depth:
            try:
                _backward_begins(h, args[0] if args else kwargs.get("tensors"))
            except Exception:
                h.fault()
        h.depth = depth + 1
        try:
            result = orig(*args, **kwargs)
        except BaseException:
            if not depth:
                _backward_failed(h)
            raise
        finally:
            h.depth = depth
        if not depth and h.source is not OPTIMIZER and not h.off:
            _backward_ended(h)
        return result
    return backward


def _wrap_optimizer_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        h = _hook
        if h is not None and not h.off:
            h.optimizer_made = True
            if h.infer_watch:
                _unwatch_forwards(h)
            if h.thread is None:
                h.start_reporting()
    return __init__


def _patch_embedding(conv: Any) -> bool:
    """Whether ``conv`` cuts its input into patches that do not overlap (its kernel as large
    as its stride, above 1, no padding, no dilation): a ViT's, a Swin's or a ConvNeXt's
    stem, a linear layer over patches. A transformer with one is no conv net: its TF32,
    channels_last and cuDNN settings matter little."""
    try:
        k, stride, pad = tuple(conv.kernel_size), tuple(conv.stride), conv.padding
        unpadded = pad == "valid" or (not isinstance(pad, str) and not any(pad))
        return (k == stride and min(k) > 1 and unpadded
                and all(d == 1 for d in conv.dilation))
    except (AttributeError, TypeError, ValueError):  # a conv of its own kind: a conv net's
        return False


def _on_submodule(_parent: Any, _name: str, module: Any) -> None:
    """A submodule is registered (torch's global module registration hook): a model is
    being built; note its convolutions."""
    h = _hook
    if h is None or h.off:
        return
    try:
        if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) \
                and getattr(module, "sparse", False):
            h.sparse_grads = True
        if isinstance(module, torch.nn.modules.conv._ConvNd) and not _patch_embedding(module):
            h.uses_conv = True
            if len(h.convs) < 8 and isinstance(module, torch.nn.Conv2d):
                h.convs.append(weakref.ref(module))
        # the first of each that is alive (a notebook may build a new one after the
        # last). The name first: DataParallel's replicate() sets every submodule of every
        # replica at every step, and each of those calls comes here
        if _name == "module":
            if isinstance(_parent, torch.nn.DataParallel) and (
                    h.data_parallel is None or h.data_parallel() is None):
                h.data_parallel = weakref.ref(_parent)
            elif isinstance(_parent, _DDP) and (h.ddp is None or h.ddp() is None):
                h.ddp = weakref.ref(_parent)
        elif _name == "_fsdp_wrapped_module" and (h.fsdp is None or h.fsdp() is None) \
                and type(_parent).__name__ == "FullyShardedDataParallel":
            h.fsdp = weakref.ref(_parent)
        if h.thread is None:
            h.start_reporting()
    except Exception:
        h.fault()


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
            info = getattr(it, "_gpuwatch", None)  # not __dict__: see _fetched()
            if info is not None and info[2] is not None:
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
        if h is not None:
            try:
                if getattr(self, "_enabled", False):
                    h.amp_iter = dtype = str(self.fast_dtype).replace("torch.", "")
                    h.amp_n = h.n  # the iteration under way
                    if h.autocast_seen is None:
                        h.autocast_seen = dtype
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


def _wrap_module_eval(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``Module.eval``: a model switched to eval mode while it trains begins an evaluation
    (Hugging Face's evaluation loop, Lightning's validation, a hand-written one). It ends at
    the next training batch, backward() or optimizer step."""
    @functools.wraps(orig)
    def eval(self: Any) -> Any:  # noqa: A001 (the method's own name)
        h = _hook
        if h is not None and not h.off:
            try:
                if h.phase is TRAIN:
                    if h.is_model(self):
                        h.switch(EVAL, _perf())
                        h.eval_model = _weak(self)
                elif h.phase is EVAL and h.eval_model is None and h.n and h.is_model(self):
                    h.eval_model = _weak(self)  # an evaluation its first batch began
                elif not h.backward_seen and not h.optimizer_made:
                    _watch_forwards(h, self)
            except Exception:
                h.fault()
        return orig(self)
    eval._gpuwatch = True  # type: ignore[attr-defined]
    return eval


def _watch_forwards(h: _Hook, module: Any) -> None:
    """Count ``module``'s forward passes in eval mode, and those of its direct children
    (a wrapper may call its own forward() directly, past its hooks), until the process
    shows that it trains: a forward pre-hook on each (_Pass). Pickling and deepcopy leave
    them out (_wrap_getstate); torch.jit.script and torch.compile remove them first."""
    with _watch_lock:
        if h.compile_called or _unwatchable(module):
            return
        watched = h.infer_watch
        known = watched.get(id(module))
        if known is not None and known[0].ref() is module:
            return  # watched already (sentence-transformers' encode() calls eval() each time)
        for key in [k for k, e in watched.items() if e[0].ref() is None]:
            del watched[key]  # modules since freed (their hooks went with them)
        # one model inside another counts each pass once: a module inside a watched model
        # is not watched; a model around watched ones (a sentence-transformers model around
        # the BERT that from_pretrained() switched to eval() first) takes over from them
        roots = [(c, c.ref()) for c, _ in watched.values() if c.root is None]
        inner = []
        for counter, r in roots:
            if r is None:
                continue
            if any(sub is module for sub in r.modules()):
                return
            if any(sub is r for sub in module.modules()):
                inner.append(counter)
        if inner:
            _remove_watch(h, lambda c: c in inner or c.root in inner)
            watched = h.infer_watch
        root: _Pass | None = None
        for m in (module, *module._modules.values()):
            if len(watched) >= INFER_WATCH_MAX:
                return
            if m is None or _unwatchable(m):
                continue
            entry = watched.get(id(m))
            if entry is not None and entry[0].ref() is m:
                continue
            counter = _Pass(m, root)
            try:
                handle = m.register_forward_pre_hook(counter, with_kwargs=True)
            except Exception:
                continue  # a module that takes no hooks: not watched
            watched[id(m)] = (counter, handle)
            if root is None:
                root = counter


def _unwatchable(module: Any) -> bool:
    """A module not to watch: TorchScript's (it takes no Python hooks), or one compiled."""
    return isinstance(module, torch.jit.ScriptModule) or hasattr(module, "_orig_mod") \
        or module.__dict__.get("_compiled_call_impl") is not None


def _unwatch_forwards(h: _Hook, only: Any = None) -> None:
    """Remove the watch: every module's (or, with ``only``, those ``only`` selects)."""
    with _watch_lock:
        _remove_watch(h, only)


def _remove_watch(h: _Hook, only: Any = None) -> None:
    keep = {}
    for key, (counter, handle) in h.infer_watch.items():
        if only is not None and not only(counter):
            keep[key] = (counter, handle)
            continue
        try:
            handle.remove()
        except Exception:
            h.fault()
    h.infer_watch = keep


_watch_lock = threading.Lock()


class _Pass:
    """The forward pre-hook of a watched module: each of its calls in eval mode, where no
    DataLoader batch and no generate() call already counts the work, is one inference
    batch. A root (the module eval() was called on) counts its calls; a child counts only
    where no call of its root came since its own last one (the root's forward() called
    directly, past its hooks), and only the first such child, so its siblings in the same
    pass do not count it again."""

    __slots__ = ("ref", "root", "n", "root_n", "lead", "__weakref__")

    def __init__(self, module: Any, root: _Pass | None) -> None:
        self.ref = weakref.ref(module)
        self.root = root
        self.n = 0  # calls seen
        self.root_n = root.n if root is not None else 0  # the root's calls at our last one
        self.lead: _Pass | None = None  # (a root's) the child that counts for it

    def __call__(self, module: Any, args: Any, kwargs: Any) -> None:
        h = _hook
        if h is None or h.off or module.training or h.backward_seen or h.loader_seen \
                or h.generate_calls:
            return None
        try:
            if self.ref() is not module or _compiling() or _tracing():
                return None  # (a DataParallel replica sharing its hooks; a trace)
            self.n += 1
            root = self.root
            if root is not None:
                direct = root.n == self.root_n
                self.root_n = root.n
                if not direct:
                    return None  # inside its root's counted call
                if root.lead is None:
                    root.lead = self
                elif root.lead is not self:
                    return None  # a sibling counts this pass
            h.inference_work(_batch_of(args, kwargs), _perf())
            if self.n == INFER_BATCHES:
                # who counts is known: the other hooks of this model go (each hooked
                # module's call takes torch's slower path)
                mine = self if root is None else root
                counting = self if root is None or mine.lead is self else None
                if counting is not None:
                    _unwatch_forwards(h, lambda c: c is not counting
                                      and (c is mine or c.root is mine))
        except Exception:
            h.fault()
        return None


def _wrap_getstate(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``Module.__getstate__`` (pickle, torch.save of a whole model, deepcopy, cloudpickle):
    a watched module's state without the hook's own forward pre-hooks, so that a copy or
    a saved model holds nothing of gpuwatch."""
    @functools.wraps(orig)
    def __getstate__(self: Any) -> Any:
        state = orig(self)
        try:
            hooks = state.get("_forward_pre_hooks") if isinstance(state, dict) else None
            if hooks and any(isinstance(f, _Pass) for f in hooks.values()):
                state = dict(state)
                mine = [k for k, f in hooks.items() if isinstance(f, _Pass)]
                state["_forward_pre_hooks"] = type(hooks)(
                    (k, f) for k, f in hooks.items() if k not in mine)
                kw = state.get("_forward_pre_hooks_with_kwargs")
                if kw:
                    state["_forward_pre_hooks_with_kwargs"] = type(kw)(
                        (k, v) for k, v in kw.items() if k not in mine)
        except Exception:
            h = _hook
            if h is not None:
                h.fault()
        return state
    return __getstate__


def _wrap_jit_script(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.jit.script`` of a module compiles its forward hooks: the watch goes first,
    for good (as for torch.compile). Scripting a function (libraries do it at import)
    changes nothing."""
    @functools.wraps(orig)
    def script(*args: Any, **kwargs: Any) -> Any:
        h = _hook
        if h is not None and args and isinstance(args[0], torch.nn.Module):
            try:
                h.compile_called = True
                if h.infer_watch:
                    _unwatch_forwards(h)
            except Exception:
                h.fault()
        return orig(*args, **kwargs)
    return script


_compiling: Callable[[], bool] = getattr(getattr(torch, "compiler", None), "is_compiling",
                                         None) or (lambda: False)
_tracing: Callable[[], bool] = getattr(torch.jit, "is_tracing", None) or (lambda: False)


def _batch_of(args: Any, kwargs: Any) -> int | None:
    """The batch of a forward pass: the first dimension of its first tensor argument
    (positional, keyword, or a value of a mapping of tensors: a tokenizer's output)."""
    values = list(args)
    if kwargs:
        values.extend(kwargs.values())
    for v in values:
        if isinstance(v, Mapping):  # a dict, a tokenizer's BatchEncoding (a UserDict)
            v = next((x for x in v.values() if isinstance(x, torch.Tensor)), None)
        if isinstance(v, torch.Tensor):
            return int(v.shape[0]) if v.dim() else None
    return None


def _checkpointing(h: _Hook) -> bool:
    """Enter the checkpoint phase for a save during training (False: not counted)."""
    if h.off or not h.n or h.saving or threading.current_thread() is h.thread:
        return False
    try:
        h.saving = True
        h.saves += 1
        h.interrupt(CHECKPOINT)
        return True
    except Exception:
        h.saving = False
        h.fault()
        return False


def _checkpointed(h: _Hook) -> None:
    h.saving = False
    try:
        h.resume()
    except Exception:
        h.fault()


def _wrap_save(orig: Callable[..., Any]) -> Callable[..., Any]:
    """A call that writes a checkpoint during training (``torch.save``, a framework's own
    save method): left out of the iteration."""
    @functools.wraps(orig)
    def save(*args: Any, **kwargs: Any) -> Any:
        h = _hook
        if h is None or not _checkpointing(h):
            return orig(*args, **kwargs)
        try:
            return orig(*args, **kwargs)
        finally:
            _checkpointed(h)
    return save


def _wrap_save_marked(orig: Callable[..., Any]) -> Callable[..., Any]:
    wrapped = _wrap_save(orig)
    wrapped._gpuwatch = True  # type: ignore[attr-defined]
    return wrapped


def _wrap_method_as_checkpoint(obj: Any, name: str) -> None:
    """A framework's own checkpoint method (on that one object: Hugging Face's
    ``Trainer._save_checkpoint`` writes safetensors files, which torch.save never sees)."""
    orig = getattr(obj, name, None)
    if orig is None or getattr(orig, "_gpuwatch", False):
        return

    setattr(obj, name, _wrap_save_marked(orig))


def _on_compile_start(*_args: Any) -> None:
    h = _hook
    if h is not None and not h.off and h.pid == os.getpid():
        try:
            h.compiles += 1
            h.interrupt(COMPILE)
        except Exception:
            h.fault()


def _on_compile_end(*_args: Any) -> None:
    h = _hook
    if h is not None and not h.off and h.phase is COMPILE and h.pid == os.getpid():
        try:
            h.resume()
        except Exception:
            h.fault()


_compile_callbacks = False


def _hook_compiler() -> None:
    """torch.compile is in use: time its compilations through dynamo's own compile
    callbacks (torch 2.5+; an older torch has none, and compiling stays unnamed)."""
    global _compile_callbacks
    if _compile_callbacks:
        return
    _compile_callbacks = True
    try:
        from torch._dynamo import callback
    except Exception:
        return
    if callable(getattr(callback, "on_compile_start", None)):
        callback.on_compile_start(_on_compile_start)
        callback.on_compile_end(_on_compile_end)


def _unhook_compiler() -> None:
    global _compile_callbacks
    if not _compile_callbacks:
        return
    _compile_callbacks = False
    callback = sys.modules.get("torch._dynamo.callback")
    handler = getattr(callback, "callback_handler", None)
    for fn, remove in ((_on_compile_start, "remove_start_callback"),
                       (_on_compile_end, "remove_end_callback")):
        try:
            getattr(handler, remove)(fn)
        except Exception:
            pass


def _wrap_compile(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def compile(*args: Any, **kwargs: Any) -> Any:  # noqa: A001 (torch's own name)
        h = _hook
        if h is not None and not h.off:
            try:
                h.compile_called = True
                if h.infer_watch:
                    # before dynamo traces the model: a hook removed after tracing would
                    # fail its guards and compile the model again
                    _unwatch_forwards(h)
                _hook_compiler()
            except Exception:
                h.fault()
        return orig(*args, **kwargs)
    return compile


_generating = threading.local()  # generate() calls in progress in this thread, in training


def _wrap_generate(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Hugging Face's ``generate()``: inference work (and, in a process that never runs
    backward(), the sign of an inference process), with the number of sequences asked."""
    @functools.wraps(orig)
    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        h = _hook
        if h is not None and not h.off and not h.backward_seen:
            try:
                ids = kwargs.get("input_ids", args[0] if args else None)
                shape = getattr(ids, "shape", None)
                h.generate_calls += 1
                n = int(shape[0]) if shape else None
                if n:
                    h.gen_samples += n
                h.inference_work(n, _perf())
            except Exception:
                h.fault()
            out = orig(self, *args, **kwargs)
            try:
                if h.phase is INFERENCE and not h.backward_seen:
                    _generated(h, _perf())
            except Exception:
                h.fault()
            return out
        if h is not None and h.phase is TRAIN and not h.off:
            # inside a training step: an RL fine-tuning loop's rollouts (TRL's GRPO,
            # RLOO, online DPO; a PPO loop of its own), the steps' own work, timed as the
            # cleanups are (a generate() within one in the same thread, assisted
            # decoding's, counts once)
            t0 = _perf()
            depth = getattr(_generating, "depth", 0)
            _generating.depth = depth + 1
            try:
                return orig(self, *args, **kwargs)
            finally:
                _generating.depth = depth
                if not depth:
                    _timed_call(h, "train_generate", t0)
        return orig(self, *args, **kwargs)
    generate._gpuwatch = True  # type: ignore[attr-defined]
    return generate


def _patch_generate(module: Any) -> None:
    mixin = getattr(module, "GenerationMixin", None)
    if mixin is not None and not getattr(mixin.generate, "_gpuwatch", False):
        _patch(mixin, "generate", _wrap_generate)


def _patch_accelerate(module: Any) -> None:
    """``Accelerator.save_state`` is a checkpoint: it writes the model through safetensors,
    which torch.save never sees, before the optimizer's state through torch.save."""
    cls = getattr(module, "Accelerator", None)
    save = getattr(cls, "save_state", None)
    if save is not None and not getattr(save, "_gpuwatch", False):
        _patch(cls, "save_state", _wrap_save_marked)


def _patch_pretrained_eval(module: Any) -> None:
    """transformers 5's ``PreTrainedModel.eval`` is its own (``self.train(False)``), so
    ``Module.eval``'s wrapper never sees a Hugging Face model switched to eval mode: the
    same wrapper goes on it (an evaluation begins; an inference loop is watched)."""
    cls = getattr(module, "PreTrainedModel", None)
    own = getattr(cls, "__dict__", {}).get("eval")
    if own is not None and not getattr(own, "_gpuwatch", False):
        _patch(cls, "eval", _wrap_module_eval)


# modules a job may import after torch, and what to patch in them once they are loaded
_AFTER_IMPORT: dict[str, Callable[[Any], None]] = {
    "transformers.generation.utils": _patch_generate,
    "transformers.modeling_utils": _patch_pretrained_eval,
    "accelerate.accelerator": _patch_accelerate,
}


class _AfterImport:
    """A meta path finder that patches a module right after it loads (the first call
    into it already measured); it asks the other finders for the module, changing
    nothing of how it is found or loaded, and leaves the path once all are patched."""

    def __init__(self) -> None:
        self.busy = False
        self.waiting = {n for n in _AFTER_IMPORT if n not in sys.modules}

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.waiting or self.busy:
            return None
        self.busy = True
        try:
            spec = None
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None) if finder is not self else None
                spec = find(name, path, target) if find is not None else None
                if spec is not None:
                    break
        finally:
            self.busy = False
        loader = getattr(spec, "loader", None)
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module: Any) -> None:
            run(module)
            self.loaded(name, module)
        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):
            return spec
        return spec

    def loaded(self, name: str, module: Any) -> None:
        self.waiting.discard(name)
        if not self.waiting:
            self.leave()
        h = _hook
        if h is None:
            return
        try:
            with _late_lock:
                _AFTER_IMPORT[name](module)
        except Exception:
            h.fault()

    def leave(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


_after_import: _AfterImport | None = None
# the late patches' look-then-patch (_patch_loaded, _AfterImport.loaded,
# _patch_framework), made by the importing or training thread and the reporter alike: one
# at a time, or both could wrap generate() (each call then counted twice) or a
# framework's checkpoint method
_late_lock = threading.RLock()


def _late_patches(h: _Hook) -> None:
    """Patches for modules imported before the hook attached, and the framework's own
    checkpoint method once the framework is known (the reporting thread looks)."""
    _patch_loaded()
    _patch_framework(h)


def _patch_loaded() -> None:
    """The patches of _AFTER_IMPORT for the modules already loaded (each skips what it
    patched before)."""
    for name, patch in _AFTER_IMPORT.items():
        module = sys.modules.get(name)
        if module is not None:
            with _late_lock:
                patch(module)


def _patch_framework(h: _Hook) -> None:
    """The framework's own checkpoint method, once the framework is known."""
    obj = h.framework.obj()
    with _late_lock:
        if obj is not None and not h.framework_patched:
            h.framework_patched = True
            if h.framework.name == "transformers":
                _wrap_method_as_checkpoint(obj, "_save_checkpoint")
            elif h.framework.name == "lightning":
                _wrap_method_as_checkpoint(obj, "save_checkpoint")


_scaler_update: Any = None
_optimizer_hook_handle: Any = None
_parameter_hook_handle: Any = None
_module_hook_handle: Any = None
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


def _at_main_end() -> None:
    """The main thread's end (``threading``'s own exit callbacks, which run before
    ``atexit``'s handlers and the interpreter's teardown): the program's work is done,
    unless another thread that Python waits for still runs (then ``atexit`` reports, as
    before). Report now: what follows can take long and is no phase of the job's (a
    DataLoader's persistent workers stopped at exit, 5 s each where they do not answer;
    a tracker's upload), and would otherwise count as the last phase's time."""
    h = _hook
    if h is None or h.pid != os.getpid() or h.finished:
        return
    try:
        me = threading.current_thread()
        if any(t is not me and not t.daemon and t.is_alive() for t in threading.enumerate()):
            return
        h.finish()
    except Exception:
        pass


_main_end_registered = False


def _register_main_end() -> None:
    """``_at_main_end`` among ``threading``'s exit callbacks (a private API of CPython
    3.9+, as ``concurrent.futures`` uses it): once per process; where it is missing or
    refuses (shutdown under way), ``atexit`` alone reports."""
    global _main_end_registered
    register = getattr(threading, "_register_atexit", None)
    if _main_end_registered or register is None:
        return
    try:
        register(_at_main_end)
        _main_end_registered = True
    except Exception:
        pass


def _after_fork_in_child() -> None:
    # the module's locks anew: the parent's reporter may have held one when it forked,
    # and no thread of the child would ever release it (a DataLoader worker importing
    # transformers' generation module would wait on _late_lock for good)
    global _capture_lock, _captures, _late_lock
    _capture_lock, _captures, _late_lock = threading.Lock(), 0, threading.RLock()
    h = _hook
    if h is not None:
        h.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _wrap_capture_begin(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``CUDAGraph.capture_begin``: counted before it begins (_captures), once the
    reporter's CUDA calls under way are done."""
    @functools.wraps(orig)
    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        global _captures
        with _capture_lock:
            _captures += 1
        try:
            return orig(self, *args, **kwargs)
        except BaseException:
            _capture_over()
            raise
    return capture_begin


def _capture_over() -> None:
    global _captures
    with _capture_lock:
        _captures = max(0, _captures - 1)


def _wrap_capture_end(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``CUDAGraph.capture_end``: the capture is over, whether it succeeded or not
    (cudaStreamEndCapture takes the stream out of capture in both cases)."""
    @functools.wraps(orig)
    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return orig(self, *args, **kwargs)
        finally:
            _capture_over()
    return capture_end


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
    global _module_hook_handle, _prev_excepthook, _prev_threading_excepthook, _problem
    global _after_import
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
            _patch(torch.nn.Module, "eval", _wrap_module_eval)
            _patch(torch.nn.Module, "__getstate__", _wrap_getstate)
            if callable(getattr(torch.jit, "script", None)):
                _patch(torch.jit, "script", _wrap_jit_script)
            _patch(torch, "save", _wrap_save)
            if callable(getattr(torch, "compile", None)):
                _patch(torch, "compile", _wrap_compile)
            _patch(os, "_exit", _wrap_os_exit)
            graph_cls = getattr(sys.modules.get("torch.cuda.graphs"), "CUDAGraph", None)
            if callable(getattr(graph_cls, "capture_begin", None)) \
                    and callable(getattr(graph_cls, "capture_end", None)):
                _patch(graph_cls, "capture_begin", _wrap_capture_begin)
                _patch(graph_cls, "capture_end", _wrap_capture_end)
            _patch(gc, "collect", _wrap_cleanup("gc_collect"))
            cuda_memory = sys.modules.get("torch.cuda.memory")
            for owner in (torch.cuda, cuda_memory):
                if owner is not None and callable(getattr(owner, "empty_cache", None)):
                    _patch(owner, "empty_cache", _wrap_cleanup("empty_cache"))
            _patch(multiprocessing.process.BaseProcess, "run", _wrap_process_run)
            spawn = sys.modules.get("torch.multiprocessing.spawn")
            if spawn is not None and callable(getattr(spawn, "_wrap", None)):
                _patch(spawn, "_wrap", _wrap_spawn_wrap)
            _optimizer_hook_handle = register_optimizer_step_post_hook(_on_optimizer_step)
            register = getattr(torch.nn.modules.module,
                               "register_module_parameter_registration_hook", None)
            if register is not None:  # torch 2.0+
                _parameter_hook_handle = register(_on_parameter)
            register = getattr(torch.nn.modules.module,
                               "register_module_module_registration_hook", None)
            if register is not None:  # torch 2.0+
                _module_hook_handle = register(_on_submodule)
            _after_import = _AfterImport()
            if _after_import.waiting:
                sys.meta_path.insert(0, _after_import)
            # the modules loaded already (an attach() after `import transformers`): at once,
            # not at the reporting thread's first report (from_pretrained's eval() may come
            # first); that report tries again where one failed
            try:
                _patch_loaded()
            except Exception:
                pass
            _prev_excepthook = sys.excepthook
            sys.excepthook = _excepthook
            _prev_threading_excepthook = threading.excepthook
            threading.excepthook = _threading_excepthook
            atexit.register(_at_exit)
            _register_main_end()
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
    global _optimizer_hook_handle, _parameter_hook_handle, _module_hook_handle
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
    if _module_hook_handle is not None:
        _module_hook_handle.remove()
        _module_hook_handle = None
    _unhook_compiler()
    if _after_import is not None:
        _after_import.leave()


def detach() -> None:
    """Stop measuring: undo every wrapper and stop reporting (no exit report is sent)."""
    global _hook
    with _attach_lock:
        h, _hook = _hook, None
        if h is None:
            return
        h.off = True
        h.no_short_ways()
        h.stop.set()
        _unwatch_forwards(h)
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
