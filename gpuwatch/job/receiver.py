"""The daemon's end of the torch hook: a Unix datagram socket, validated reports, job stats.

``HookReceiver(store, socket_path)`` binds the socket (mode 0660 in the group
``gpuwatch`` where that group exists, so its members may report; else 0600), receives on a
thread of its own, validates each datagram with :mod:`gpuwatch.job.protocol` and turns it into what the store holds:
``JobStats`` per process (``set_job``), per-step ``StepSample`` (``add_steps``) and
``ConfigSample`` (``set_config``). A bad datagram costs only itself: it is dropped and
counted by reason (``count_hook_message(dropped_reason=...)``).

A process that stops reporting and no longer exists is marked ``alive=False,
exit_reason="vanished"`` (killed by a signal, or by the OOM killer: no exit report came);
dead jobs are forgotten ``forget_after`` seconds later. This module never imports torch.
"""

from __future__ import annotations

import errno
import grp
import logging
import math
import os
import select
import socket
import stat
import struct
import threading
import time
from dataclasses import dataclass, replace

import psutil

from gpuwatch import logs, threads
from gpuwatch.errors import UserError
from gpuwatch.job import protocol
from gpuwatch.samples import ConfigSample, HookProblem, JobEnd, JobStats, PhaseSample
from gpuwatch.store import StepValues, Store, unseen_steps

log = logging.getLogger(__name__)

# how far ahead of this host's clock a step's time may be before it is taken as now
MAX_CLOCK_AHEAD = 5.0  # seconds
# a job's `phase` line is written when its phase (or its evaluation, inference or compile
# counts) changes, and otherwise this often, with its seconds by phase so far
PHASE_EVERY = 5.0  # seconds

# processes known at once (alive, or dead and not yet forgotten): each is a set of training
# series, so this caps what senders can add to a scrape; a new one past it is dropped and
# counted (gpuwatch_hook_messages_dropped_total{reason="too_many_jobs"})
MAX_JOBS = 1024
# with no live job, how often the loop wakes to check that its socket file is still there
IDLE_WAKE_SECONDS = 2.0

# _apply() builds each step's StepValues positionally, in this order (checked at import)
_STEP_FIELDS = ("t", "step", "step_seconds", "data_wait_seconds", "batch_size",
                "loss_scale", "mem_allocated_bytes", "mem_reserved_bytes",
                "max_mem_allocated_bytes", "loss", "skipped", "first_batch",
                "first_batch_wait_seconds", "micro_batches", "pid", "rank", "gpu")
if StepValues._fields != _STEP_FIELDS:
    raise ImportError("gpuwatch.samples.StepSample's fields changed: update "
                      "gpuwatch/job/receiver.py's _STEP_FIELDS and _apply()")
# and unpacks each protocol.StepRecord in this order
_RECORD_FIELDS = ("step", "t", "step_seconds", "data_wait_seconds", "batch_size", "skipped",
                  "first_batch", "first_batch_wait_seconds", "loss", "micro_batches")
if protocol.StepRecord._fields != _RECORD_FIELDS:
    raise ImportError("gpuwatch.job.protocol.StepRecord's fields changed: update "
                      "gpuwatch/job/receiver.py's _apply()")

SOCKET_MODE = 0o660
SOCKET_GROUP = "gpuwatch"  # the systemd service's group (systemd/gpuwatch.sysusers)
_RECV_BUFFER = 256 * 1024  # bigger than MAX_DATAGRAM_BYTES, so oversize is seen, not cut
_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass
class _Job:
    stats: JobStats
    last_seen: float  # monotonic
    seq: int = -1
    dead_since: float | None = None  # monotonic
    first_step_t: float | None = None  # Unix seconds: the end of its first iteration
    error: str | None = None  # the exit report's error text
    phase_key: tuple | None = None  # what its last `phase` line said (besides seconds)
    phase_t: float = 0.0  # when that line was written (Unix seconds)
    problems: set[str] | None = None  # problems already passed on


def _end(stats: JobStats, t: float, first_step_t: float | None, error: str | None) -> JobEnd:
    return JobEnd(t=t, pid=stats.pid, exit_reason=stats.exit_reason or "exited",
                  rank=stats.rank, gpu=stats.gpu, error=error, steps_total=stats.steps_total,
                  first_step_t=first_step_t, last_report_t=stats.t or None,
                  mem_allocated_bytes=stats.mem_allocated_bytes,
                  mem_reserved_bytes=stats.mem_reserved_bytes,
                  max_mem_allocated_bytes=stats.max_mem_allocated_bytes)


def _pid_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:  # AccessDenied: it exists, it is someone else's
        return False


def _norm_uuid(uuid: str | None) -> str | None:
    if not uuid:
        return None
    u = uuid.lower()
    return u.removeprefix("gpu-")


def _check_stale(path: str) -> None:
    """Remove a socket file that nobody listens on; refuse anything else at ``path``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise UserError(f"{path} exists and is not a socket; not replacing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)  # a socket file left by a receiver that died
        return
    except OSError as err:
        raise UserError(f"cannot check the existing socket {path}: {err.strerror}") from err
    finally:
        probe.close()
    raise UserError(f"another receiver is listening on {path}")


def _restrict(path: str, group: str | None) -> None:
    """Who may send to the socket: its owner, and the members of ``group`` if it exists.

    Sending to a Unix socket needs write permission on it. With the group (the systemd
    service's ``gpuwatch``, which users join to report from their jobs) the socket is 0660
    in that group; without it, 0600: the daemon's primary group may be a shared one.
    """
    gid = None
    if group:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            gid = None
    if gid is not None and os.stat(path).st_gid != gid:
        try:
            os.chown(path, -1, gid)  # allowed to root, or to a member of the group
        except OSError as err:
            log.info("hook socket %s stays private to its owner: cannot give it to group "
                     "%s (%s)", path, group, err.strerror)
            gid = None
    # the umask decided the mode at bind time; this sets ours
    os.chmod(path, SOCKET_MODE if gid is not None else SOCKET_MODE & 0o700)


class HookReceiver:
    """Receives the hook's datagrams on ``socket_path`` into ``store``."""

    def __init__(self, store: Store, socket_path: str, *, vanish_after: float = 5.0,
                 forget_after: float = 600.0, max_jobs: int = MAX_JOBS,
                 group: str | None = SOCKET_GROUP) -> None:
        self.store = store
        self.max_jobs = max_jobs
        self.socket_path = socket_path
        self.group = group  # who besides the owner may report (see _restrict)
        self.vanish_after = vanish_after
        self.forget_after = forget_after
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._jobs: dict[int, _Job] = {}
        self._passcred = False
        self._gpu_by_uuid: dict[str, int] = {}
        self._last_sweep = 0.0
        self._inode: int | None = None  # of the socket file we bound

    # -- life cycle ----------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        _check_stale(self.socket_path)
        self._sock = self._bind()
        self._thread = threads.Thread(target=self._run, name="gpuwatch-hook-receiver",
                                      daemon=True)
        self._thread.start()
        log.debug("hook receiver listening on %s", self.socket_path)

    def _bind(self) -> socket.socket:
        path = self.socket_path
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, mode=0o755, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(path)
            _restrict(path, self.group)
            try:
                # the kernel then tells us each sender's real pid (in our pid namespace)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
                self._passcred = True
            except (AttributeError, OSError):
                self._passcred = False
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
            except OSError:
                pass
            self._inode = os.lstat(path).st_ino
        except BaseException:
            sock.close()
            raise
        return sock

    def _check_socket(self) -> None:
        """Bind again when the socket file was removed under us (a tmp cleaner, a careless
        ``rm``): the jobs started from now on could not report otherwise."""
        try:
            if os.lstat(self.socket_path).st_ino == self._inode:
                return
            return  # another file now: not ours to remove
        except FileNotFoundError:
            pass
        except OSError:
            return
        self.store.count_error("hook_socket")
        try:
            new = self._bind()
        except OSError as err:
            logs.once(log, "hook-socket-rebind", logging.ERROR,
                      "the hook socket %s was removed and cannot be made again (%s); "
                      "retrying", self.socket_path, err)
            return
        with self._recv_lock:
            old, self._sock = self._sock, new
        if old is not None:
            old.close()
        log.warning("the hook socket %s was removed; listening on a new one there (jobs that "
                    "reported to the old one must start again to report)", self.socket_path)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            try:
                os.unlink(self.socket_path)
            except OSError:
                pass

    def process_exited(self, pid: int, reason: str) -> None:
        """Tell the receiver that ``pid`` is gone (the launcher reaped its child).

        Only a job still marked alive changes: the hook's own exit report, when it came,
        knows better (e.g. ``oom``)."""
        with self._lock:
            job = self._jobs.get(pid)
            if job is None or not job.stats.alive:
                return
            job.stats = replace(job.stats, alive=False, exit_reason=reason)
            job.dead_since = time.monotonic()
            stats = job.stats
            end = _end(stats, time.time(), job.first_step_t, job.error)
        self.store.set_job(stats)
        self.store.add_job_end(end)

    def jobs(self) -> list[JobStats]:
        with self._lock:
            return [j.stats for j in self._jobs.values()]

    def flush(self) -> int:
        """Handle every datagram already queued on the socket now; how many there were.

        The launcher calls this once its job has exited, so that the job's last reports
        are in the store before the summary and before a recording is closed."""
        n = self._drain() if self._sock is not None else 0
        self._sweep(time.monotonic())
        return n

    def reap(self) -> None:
        """Mark every job whose process is gone as vanished now, without waiting for
        ``vanish_after`` (the launcher knows its job has ended)."""
        self._sweep(time.monotonic(), vanish_after=0.0)

    # -- the loop ------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            sock = self._sock
            if sock is None:
                return
            # a live job is watched for its end every 0.5 s; with none, the loop wakes only
            # to see that its socket file is still there
            wait = 0.5 if self._live() else IDLE_WAKE_SECONDS
            try:
                readable, _, _ = select.select([sock], [], [], wait)
            except (OSError, ValueError):
                if self._stop.is_set():
                    return
                time.sleep(0.1)
                continue
            try:
                if readable:
                    self._drain()
                now = time.monotonic()
                if now - self._last_sweep >= 0.5:
                    self._last_sweep = now
                    self._sweep(now)
                    self._check_socket()
            except Exception:  # the receiver must outlive any one datagram or job
                log.exception("the hook receiver hit an error; carrying on")
                time.sleep(0.1)

    def _live(self) -> bool:
        with self._lock:
            return any(job.stats.alive for job in self._jobs.values())

    def _drain(self, limit: int = 1000) -> int:
        sock = self._sock
        if sock is None:
            return 0
        space = socket.CMSG_SPACE(_CREDS.size) if self._passcred else 0
        n = 0
        with self._recv_lock:
            while n < limit:
                try:
                    data, anc, flags, _ = sock.recvmsg(_RECV_BUFFER, space, socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as err:
                    if not self._stop.is_set():
                        log.warning("hook socket receive failed: %s", err)
                    break
                n += 1
                self._handle(data, anc, flags)
        return n

    def _handle(self, data: bytes, anc: list, flags: int) -> None:
        if flags & getattr(socket, "MSG_TRUNC", 0) or len(data) > protocol.MAX_DATAGRAM_BYTES:
            self.store.count_hook_message(dropped_reason=protocol.OVERSIZED)
            return
        try:
            report = protocol.decode(data)
        except protocol.ProtocolError as err:
            log.debug("dropped a hook datagram: %s", err)
            self.store.count_hook_message(dropped_reason=err.reason)
            return
        except Exception as err:  # a bug in validation must cost only this datagram
            log.debug("dropped a hook datagram: %r", err)
            self.store.count_hook_message(dropped_reason=protocol.MALFORMED)
            return
        pid = report.pid
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == getattr(socket, "SCM_CREDENTIALS", -1) \
                    and len(payload) >= _CREDS.size:
                # trust the kernel over the message: right across pid namespaces, unforgeable
                pid = _CREDS.unpack(payload[:_CREDS.size])[0] or pid
        with self._lock:
            full = pid not in self._jobs and len(self._jobs) >= self.max_jobs
        if full:
            self.store.count_hook_message(dropped_reason=protocol.TOO_MANY_JOBS)
            logs.once(log, "hook-too-many-jobs", logging.WARNING,
                      "the hook receiver knows %d processes already; reports from new ones "
                      "are dropped until old ones are forgotten (counted, not logged again)",
                      self.max_jobs)
            return
        self.store.count_hook_message()
        try:
            self._apply(pid, report)
        except Exception:  # a bug here must not stop the receiver
            log.exception("could not apply a hook report from pid %d", pid)

    def _gpu_index(self, report: protocol.Report) -> int | None:
        uuid = _norm_uuid(report.uuid)
        if uuid is not None:
            if uuid not in self._gpu_by_uuid:
                for info in self.store.latest().infos:
                    if info.uuid:
                        self._gpu_by_uuid[_norm_uuid(info.uuid) or ""] = info.gpu
            if uuid in self._gpu_by_uuid:
                return self._gpu_by_uuid[uuid]
        return report.gpu

    def _apply(self, pid: int, r: protocol.Report) -> None:
        gpu = self._gpu_index(r)
        now = time.monotonic()
        with self._lock:
            job = self._jobs.get(pid)
            prev = job.stats if job is not None else None
            if prev is not None and (r.seq <= job.seq and r.seq != 0):  # type: ignore[union-attr]
                return  # a duplicate or an old datagram overtaken by a newer one
            if prev is not None and r.seq == 0 and job.seq > 0:  # type: ignore[union-attr]
                prev = None  # the pid was reused by a new process
            w = r.window
            step_seconds = w.step_seconds / w.timed if w.timed else None
            wait_ratio = min(1.0, w.data_wait_seconds / w.step_seconds) \
                if w.step_seconds > 0 else None
            sps = w.samples / w.sample_seconds if w.sample_seconds > 0 else None
            if sps is not None and not math.isfinite(sps):
                sps = None  # a denormal sample_seconds: not a rate anyone measured
            keep = prev if prev is not None and w.steps == 0 else None  # a heartbeat
            final = r.kind == "exit"
            stats = JobStats(
                pid=pid, rank=r.rank, gpu=gpu, t=r.t,
                steps_total=r.steps_total, skipped_steps_total=r.skipped_total,
                step_seconds=step_seconds if keep is None else keep.step_seconds,
                data_wait_ratio=wait_ratio if keep is None else keep.data_wait_ratio,
                loss_scale=r.loss_scale if r.loss_scale is not None
                else (prev.loss_scale if prev is not None else None),
                samples_per_second=sps if keep is None else keep.samples_per_second,
                mem_allocated_bytes=r.mem_allocated_bytes,
                mem_reserved_bytes=r.mem_reserved_bytes,
                max_mem_allocated_bytes=r.max_mem_allocated_bytes,
                alive=not final,
                exit_reason=(r.exit_reason or "exited") if final else None,
                phase=r.phase, phase_seconds=dict(r.phases),
                hook_problems=len(r.problems), hook_state=r.hook_state,
            )
            if job is None or prev is None:
                job = self._jobs[pid] = _Job(stats=stats, last_seen=now)
            was_alive = job.dead_since is None
            job.stats, job.last_seen, job.seq = stats, now, r.seq
            job.dead_since = now if final else None
            if job.first_step_t is None and r.steps:
                job.first_step_t = r.steps[0].t
            if r.error is not None:
                job.error = r.error
            end = _end(stats, r.t, job.first_step_t, job.error) if final and was_alive \
                else None
            events = self._events(job, pid, r, gpu, final)
        # the hook stamps steps with this host's clock; one stamped far ahead (a wrong
        # clock, a forged datagram) would make the store's time trim drop the history
        latest = time.time() + MAX_CLOCK_AHEAD
        rank = r.rank
        records = r.steps
        # positional, in StepSample's field order (_STEP_FIELDS): thousands a second
        steps = [StepValues(t if t <= latest else latest, step, step_seconds, wait, batch,
                            None, None, None, None, loss, skipped, first, first_wait, micro,
                            pid, rank, gpu)
                 for step, t, step_seconds, wait, batch, skipped, first, first_wait, loss, micro
                 in records[:-1]]
        if records:
            # the scale and the allocator are read once per report: they belong to its end
            s = records[-1]
            steps.append(StepValues(
                t=min(s.t, latest), step=s.step, step_seconds=s.step_seconds,
                data_wait_seconds=s.data_wait_seconds, batch_size=s.batch_size,
                loss_scale=r.loss_scale, mem_allocated_bytes=r.mem_allocated_bytes,
                mem_reserved_bytes=r.mem_reserved_bytes,
                max_mem_allocated_bytes=r.max_mem_allocated_bytes, loss=s.loss,
                skipped=s.skipped, first_batch=s.first_batch,
                first_batch_wait_seconds=s.first_batch_wait_seconds,
                micro_batches=s.micro_batches, pid=pid, rank=rank, gpu=gpu))
        # steps the datagram had no room to list still count (their sums, in the window)
        unseen = unseen_steps(r.window, steps, t=steps[0].t if steps else min(r.t, latest),
                              pid=pid, rank=rank, gpu=gpu) if r.steps_omitted else None
        if steps or unseen is not None:
            self.store.add_steps(steps, unseen=unseen)
        if r.config is not None:
            self.store.set_config(ConfigSample(t=r.t, pid=pid, rank=r.rank, values=r.config))
        for event in events:
            self.store.add_event(event)
        self.store.set_job(stats)
        if end is not None:
            self.store.add_job_end(end)

    @staticmethod
    def _events(job: _Job, pid: int, r: protocol.Report, gpu: int | None,
                final: bool) -> list[PhaseSample | HookProblem]:
        """The `phase` line due for this report, and the hook's problems not passed on yet."""
        out: list[PhaseSample | HookProblem] = []
        if job.problems is None:
            job.problems = set()
        for p in r.problems:
            if p.what not in job.problems:
                job.problems.add(p.what)
                out.append(HookProblem(t=r.t, what=p.what, error=p.error, pid=pid, rank=r.rank,
                                       gpu=gpu))
        if r.phase is None:
            return out  # an older hook: no phases
        key = (r.phase, r.hook_state, r.compiles, r.checkpoints, r.eval.batches, r.inference.batches,
               r.inference.generate_calls)
        if key == job.phase_key and r.t - job.phase_t < PHASE_EVERY and not final:
            return out
        job.phase_key, job.phase_t = key, r.t
        out.append(PhaseSample(
            t=r.t, phase=r.phase, seconds=dict(r.phases), compiles=r.compiles,
            checkpoints=r.checkpoints, eval_batches=r.eval.batches, eval_samples=r.eval.samples,
            eval_batch_size=r.eval.batch_size, eval_wait_seconds=r.eval.wait_seconds,
            eval_train_loader=True if r.eval.train_loader else None,
            inference_batches=r.inference.batches, inference_samples=r.inference.samples,
            inference_batch_size=r.inference.batch_size,
            inference_wait_seconds=r.inference.wait_seconds if r.inference.batches else None,
            generate_calls=r.inference.generate_calls, hook_state=r.hook_state,
            calls=dict(r.calls), call_seconds=dict(r.call_seconds),
            pid=pid, rank=r.rank, gpu=gpu))
        return out

    def _sweep(self, now: float, vanish_after: float | None = None) -> None:
        """Mark silent jobs whose process is gone; forget long-dead ones."""
        silent = self.vanish_after if vanish_after is None else vanish_after
        vanished: list[JobStats] = []
        ends: list[JobEnd] = []
        forget: list[int] = []
        with self._lock:
            for pid, job in list(self._jobs.items()):
                if job.stats.alive:
                    if now - job.last_seen >= silent and _pid_gone(pid):
                        job.stats = replace(job.stats, alive=False, exit_reason="vanished")
                        job.dead_since = now
                        vanished.append(job.stats)
                        ends.append(_end(job.stats, time.time(), job.first_step_t, job.error))
                elif job.dead_since is not None and now - job.dead_since >= self.forget_after:
                    forget.append(pid)
                    del self._jobs[pid]
        for stats, end in zip(vanished, ends, strict=True):
            log.info("training process %d (rank %s) vanished without an exit report",
                     stats.pid, stats.rank)
            self.store.set_job(stats)
            self.store.add_job_end(end)
        for pid in forget:
            self.store.drop_job(pid)


def probe(path: str) -> bool:
    """True when a receiver listens on ``path`` and we may send to it."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        s.connect(path)
        return True
    except OSError as err:
        if err.errno not in (errno.ENOENT, errno.ECONNREFUSED, errno.EACCES, errno.EPERM,
                             errno.ENOTDIR, errno.ENOTSOCK):
            log.debug("probing %s: %s", path, err)
        return False
    finally:
        s.close()
