"""``gpuwatch run -- CMD ARGS``: start a training job with the torch hook injected, watch it.

- **Injection without code changes.** The job's environment gets ``PYTHONPATH`` with
  ``gpuwatch/_inject`` first (its ``sitecustomize`` attaches the hook when the job imports
  torch, and chains to any other sitecustomize) and ``GPUWATCH_SOCKET`` (where to report).
  Every Python process of the job inherits both: torchrun's ranks report, each on its own.
- **Where reports go.** To a gpuwatch daemon already running on the host (the systemd
  service's ``/run/gpuwatch/hook.sock``, or the sockets in an inherited
  ``$GPUWATCH_SOCKET``), and to this command's own daemon (``gpuwatch.daemon.Daemon``
  on a private socket, serving /metrics for the job's lifetime). When a system daemon
  already serves the host, ours serves no HTTP (unless ``--web.listen-address`` is given)
  and only feeds the status line and ``--record``. When the HTTP port is taken, ours moves
  to a free port (said once). Whatever fails beside the job, the job runs.
- **Process group.** The job runs in a process group of its own, so a signal passed on
  reaches all of it (``bash -c 'python train.py; ...'`` and the trainer under it, the
  DataLoader workers). On a terminal the job's group is made the foreground one, as a
  shell does: Ctrl-C, Ctrl-\\ and Ctrl-Z go to the job itself and it can read the terminal;
  when the job stops (Ctrl-Z) this command stops too, and ``fg`` resumes both.
- **Signals.** SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to this command
  are passed on to the job's process group, once: the second of two identical signals from
  one sender within ``DUPLICATE_WINDOW`` (``timeout`` signals its child, then its whole
  group) is not passed on again. After the job has ended, one of them stops this command
  at once, whatever it was still doing (e.g. writing a recording into a pipe nobody reads).
- **Exit.** The job's exit code. When signal N killed the job, this command dies by
  signal N itself (as ``env`` and ``timeout`` do), so a shell loop of jobs stops on Ctrl-C;
  127 when the command was not found, 126 when it could not be executed. A file without a
  ``#!`` line is run with ``/bin/sh``, as ``env`` and the shells do.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpuwatch.errors import UserError
from gpuwatch.job import receiver as receiver_mod
from gpuwatch.job.statusline import StatusLine, summary_line
from gpuwatch.store import Store

log = logging.getLogger(__name__)

SYSTEM_SOCKET = "/run/gpuwatch/hook.sock"
ENV_SOCKET = "GPUWATCH_SOCKET"
# where to look for a system daemon's socket (tests; non-standard installs)
ENV_SYSTEM_SOCKET = "GPUWATCH_SYSTEM_SOCKET"
ENV_STATUS_INTERVAL = "GPUWATCH_STATUS_INTERVAL"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)
_SI_KERNEL = 0x80  # siginfo si_code of a signal the kernel generated (e.g. the tty driver)
# the same signal from the same sender this soon after is the same request, sent twice
DUPLICATE_WINDOW = 0.5  # seconds
# how long the end of a run (the last samples, the recording) may take before we give up
STOP_TIMEOUT = 10.0  # seconds
# AF_UNIX paths are limited to 108 bytes including the terminating NUL on Linux
_MAX_SOCKET_PATH = 107
_SOCKET_NAME = "hook.sock"
_CORE_SIGNALS = (signal.SIGQUIT, signal.SIGILL, signal.SIGTRAP, signal.SIGABRT, signal.SIGBUS,
                 signal.SIGFPE, signal.SIGSEGV, signal.SIGSYS, signal.SIGXCPU, signal.SIGXFSZ)


def inject_dir() -> str:
    """The directory whose ``sitecustomize.py`` attaches the hook."""
    import gpuwatch.job._inject

    return os.path.dirname(os.path.abspath(gpuwatch.job._inject.__file__))


def child_environment(base: Mapping[str, str], sockets: list[str]) -> dict[str, str]:
    env = dict(base)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = inject_dir() + (os.pathsep + old if old else "")
    env[ENV_SOCKET] = os.pathsep.join(sockets)
    return env


def external_sockets(env: Mapping[str, str]) -> list[str]:
    """Receivers already listening (a system daemon, an outer ``gpuwatch run``)."""
    found = [p for p in env.get(ENV_SOCKET, "").split(os.pathsep)
             if p and receiver_mod.probe(p)]
    system = env.get(ENV_SYSTEM_SOCKET) or SYSTEM_SOCKET
    if system not in found and receiver_mod.probe(system):
        found.append(system)
    return found


def private_socket_dir(env: Mapping[str, str] | None = None) -> str | None:
    """A new directory of our own whose ``hook.sock`` fits an AF_UNIX address, or None.

    A long ``$TMPDIR`` (a cluster's per-job scratch path) makes a socket path the kernel
    refuses: try the runtime dir, the temp dir, then the short system ones."""
    env = os.environ if env is None else env
    tried: list[str] = []
    for base in (env.get("XDG_RUNTIME_DIR"), tempfile.gettempdir(), "/tmp", "/dev/shm",
                 "/var/tmp"):
        if not base or base in tried or not os.path.isdir(base):
            continue
        tried.append(base)
        # mkdtemp's name is prefix + 8 characters
        longest = os.path.join(base, "gpuwatch-job-XXXXXXXX", _SOCKET_NAME)
        if len(os.fsencode(longest)) > _MAX_SOCKET_PATH:
            continue
        try:
            return tempfile.mkdtemp(prefix="gpuwatch-job-", dir=base)
        except OSError:
            continue
    return None


def _port_in_use(err: BaseException) -> bool:
    cause = err.__cause__
    return isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE


def _any_port(listen: str) -> str:
    from gpuwatch.serve.config import parse_listen_address

    host, _ = parse_listen_address(listen)
    return f"[{host}]:0" if ":" in host else f"{host}:0"


class _Watch:
    """What this command runs beside the job: a daemon, or at least a receiver."""

    def __init__(self) -> None:
        self.daemon: Any = None
        self.store: Store | None = None
        self.receiver: Any = None
        self.socket: str | None = None
        self.url: str | None = None
        self.notes: list[str] = []
        self.unfinished = False  # stop() gave up on a part (e.g. a recording into a stuck pipe)

    def start(self, args: argparse.Namespace, socket_path: str | None, serve_http: bool) -> None:
        from gpuwatch.serve.config import config_from_args

        config = config_from_args(args)  # bad flags are the user's to fix: before the job
        try:
            from gpuwatch.daemon import Daemon
        except ImportError as err:
            self.notes.append(f"the daemon is not available ({err}); training metrics only")
            self._bare(socket_path)
            return
        # one daemon: the port is bound before anything starts, so a port in use costs
        # nothing but a second bind, and the sampler starts once
        cfg = config
        for attempt in range(2 if serve_http else 1):
            daemon = Daemon(cfg, serve_http=serve_http, hook_socket=socket_path,
                            hook_required=False)
            try:
                daemon.start()
            except UserError as err:
                if attempt == 0 and serve_http and _port_in_use(err):
                    cfg = replace(config, listen_address=_any_port(config.listen_address))
                    continue  # taken (another job's gpuwatch): a free port instead
                if cfg.record:
                    raise  # --record asked for something we cannot do here
                self.notes.append(f"could not serve metrics ({err})")
                break
            except Exception as err:  # noqa: BLE001 - the job runs anyway
                self.notes.append(f"the daemon failed to start ({err})")
                break
            if attempt == 1:
                self.notes.append(f"{config.listen_address} is in use; serving this job's "
                                  f"metrics on {daemon.url}/metrics instead")
            hook_error = getattr(daemon, "hook_error", None)
            if hook_error:
                self.notes.append(f"cannot receive the hook's reports ({hook_error})")
            self.daemon, self.store, self.url = daemon, daemon.store, daemon.url
            self.receiver = daemon.receiver
            self.socket = daemon.hook_socket
            return
        self._bare(socket_path)

    def _bare(self, socket_path: str | None) -> None:
        """Just a store and a receiver: the status line still works."""
        self.store = Store()
        if socket_path is None:
            self.notes.append("no directory for a hook socket; training metrics are off")
            return
        try:
            rec = receiver_mod.HookReceiver(self.store, socket_path)
            rec.start()
        except (OSError, UserError) as err:
            self.notes.append(f"cannot receive the hook's reports ({err})")
            return
        self.receiver, self.socket = rec, socket_path

    def job_ended(self, pid: int, reason: str) -> None:
        rec = self.receiver
        if rec is None:
            return
        for name, call in (("flush", ()), ("process_exited", (pid, reason)), ("reap", ())):
            fn = getattr(rec, name, None)
            if fn is not None:
                try:
                    fn(*call)
                except Exception:  # the summary may be less complete; nothing worse
                    log.debug("receiver.%s failed", name, exc_info=True)

    def advice(self) -> Any:
        advisor = getattr(self.daemon, "advisor", None)
        fn = getattr(advisor, "report_json", None)
        return fn() if fn is not None else None

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop everything, giving up on what takes longer than ``timeout``."""
        part = self.daemon if self.daemon is not None else self.receiver
        if part is None:
            return
        worker = threading.Thread(target=part.stop, name="gpuwatch-stop", daemon=True)
        worker.start()
        worker.join(timeout)
        recorder = getattr(self.daemon, "recorder", None)
        if worker.is_alive() or getattr(recorder, "unfinished", False):
            self.unfinished = True
            what = (f"the recording to {recorder.path} could not be finished"
                    if recorder is not None else "gpuwatch could not stop cleanly")
            self.notes.append(f"{what} within {timeout:g} s; giving up on it")
        elif recorder is not None and getattr(recorder, "failed", None):
            self.notes.append(recorder.failed)


class _Job:
    """The job's process (the leader of its own process group) and the terminal, if any."""

    def __init__(self, pid: int, tty: int | None) -> None:
        self.pid = pid
        self.tty = tty  # our controlling terminal, when the job was given its foreground
        self.ended = threading.Event()

    def in_foreground(self) -> bool:
        if self.tty is None:
            return False
        try:
            return os.tcgetpgrp(self.tty) == self.pid
        except OSError:
            return False

    def signal(self, signum: int) -> None:
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            pass
        except PermissionError:  # a setuid program in the group: the leader at least
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def wait(self) -> int:
        """Wait for the job to end; its wait status. On a terminal, follow its Ctrl-Z."""
        while True:
            options = os.WUNTRACED if self.tty is not None else 0
            _, status = os.waitpid(self.pid, options)
            if not os.WIFSTOPPED(status):
                return status
            # stopped (Ctrl-Z): stop as well, so the shell sees its job stopped; `fg` or
            # `bg` continues us, and we continue the job
            _set_foreground(self.tty, os.getpgrp())
            os.kill(os.getpid(), signal.SIGSTOP)
            if _foreground_is(self.tty, os.getpgrp()):
                _set_foreground(self.tty, self.pid)
            self.signal(signal.SIGCONT)


def _open_tty() -> int | None:
    """Our controlling terminal when we are in its foreground process group, else None."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    if _foreground_is(fd, os.getpgrp()):
        return fd
    os.close(fd)
    return None


def _foreground_is(tty: int | None, pgrp: int) -> bool:
    if tty is None:
        return False
    try:
        return os.tcgetpgrp(tty) == pgrp
    except OSError:
        return False


def _set_foreground(tty: int | None, pgrp: int) -> bool:
    if tty is None:
        return False
    # a background process group may set the foreground only with SIGTTOU blocked
    old = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTTOU])
    try:
        os.tcsetpgrp(tty, pgrp)
        return True
    except OSError:
        return False
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _forward_signals(job: _Job) -> None:
    last: dict[tuple[int, int], float] = {}
    while True:
        info = signal.sigwaitinfo(FORWARDED)
        signum = info.si_signo
        if job.ended.is_set():
            # the job is over and we are finishing: a signal now means stop now
            die_by_signal(signum)
        if info.si_code == _SI_KERNEL and signum == signal.SIGHUP and job.in_foreground():
            continue  # the terminal hung up: it sent SIGHUP to the job's group itself
        # (a Ctrl-C from the terminal reaches us only when it came before the job had the
        # terminal's foreground: then the job did not get it, and it is passed on)
        now = time.monotonic()
        key = (signum, info.si_pid)
        if info.si_code != _SI_KERNEL and now - last.get(key, -DUPLICATE_WINDOW) < DUPLICATE_WINDOW:
            continue  # e.g. `timeout`: to its child (us), then to its whole process group
        last[key] = now
        job.signal(signum)


def die_by_signal(signum: int) -> None:
    """End this process by ``signum`` with its default action, as the job ended.

    Returns only if the signal does not end the process (it is ignored or stops it)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if signum in _CORE_SIGNALS:
        # the job's crash is not ours: no core file of gpuwatch (as `timeout` does)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's can't be set, need not be
            signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    signal.pthread_kill(threading.get_ident(), signum)


def _exit_text(code: int) -> tuple[int, str, str]:
    """(our exit code, words for the summary, the job's exit reason for the receiver)."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return 128 - code, f"job killed by {name}", "killed"
    return code, f"job exited with code {code}", "exited"


def _status_interval() -> float:
    try:
        return min(60.0, max(0.05, float(os.environ.get(ENV_STATUS_INTERVAL, "2"))))
    except ValueError:
        return 2.0


def _spawn(command: list[str], env: dict[str, str], ignored: set[int]) -> int:
    """Start the job as the leader of a new process group; OSError as ``execvp`` raises it.

    ``ignored``: signals ignored when we were started (nohup's SIGHUP), left so for the job.
    """
    default = (*FORWARDED, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTTOU)
    kwargs: dict[str, Any] = {"setpgroup": 0, "setsigmask": (),
                              "setsigdef": tuple(s for s in default if s not in ignored)}
    try:
        return os.posix_spawnp(command[0], command, env, **kwargs)
    except OSError as err:
        if err.errno != errno.ENOEXEC:
            raise
    # no #! line: a shell script, as execvp and `env` run it
    path = command[0] if "/" in command[0] else shutil.which(command[0], path=env.get("PATH"))
    return os.posix_spawn("/bin/sh", ["/bin/sh", path or command[0], *command[1:]], env,
                          **kwargs)


def _cannot_run(program: str) -> tuple[int, str] | None:
    """(exit code, message) when ``program`` can't be started, as a shell says it: 127 for
    a command not found, 126 for one found but not runnable; None when it looks runnable
    (spawning it may still fail; that is answered the same way)."""
    if "/" not in program:
        if shutil.which(program) is None:
            return 127, f"command not found: {program}"
        return None
    if not os.path.exists(program):
        return 127, f"command not found: {program}"
    if os.path.isdir(program):
        return 126, f"cannot run {program}: Is a directory"
    if not os.access(program, os.X_OK):
        return 126, f"cannot run {program}: Permission denied"
    return None


def main(args: argparse.Namespace) -> int:
    command: list[str] = list(args.command)
    if not command:
        raise UserError("no command given after --")
    for flag, given in (("--demo", getattr(args, "demo", False)),
                        ("--replay", getattr(args, "replay", None))):
        if given:
            raise UserError(f"{flag} serves a recording; it cannot watch a command "
                            f"(run `gpuwatch run {flag}{' FILE' if flag == '--replay' else ''}` "
                            "without `-- CMD`)")
    missing = _cannot_run(command[0])
    if missing is not None:
        # before anything starts or is printed: no "watching" line for a job that never runs
        code, text = missing
        print(f"gpuwatch: {text}", file=sys.stderr)
        return code
    quiet = getattr(args, "status", None) is False
    status_on = args.status if getattr(args, "status", None) is not None else sys.stderr.isatty()
    listen_given = getattr(args, "listen_address", None) is not None
    # block the forwarded signals before any thread starts, so that only the forwarding
    # thread ever receives them (sigwaitinfo tells us who sent each)
    ignored = {s for s in FORWARDED if signal.getsignal(s) is signal.SIG_IGN}
    for sig in FORWARDED:
        if sig not in ignored:
            signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_BLOCK, [*FORWARDED, signal.SIGTTOU])
    private_dir = private_socket_dir()
    socket_path = os.path.join(private_dir, _SOCKET_NAME) if private_dir else None
    watch = _Watch()
    code = 0
    died_by = 0
    tty: int | None = None
    handed_over = False
    try:
        external = external_sockets(os.environ)
        serve_http = not external or listen_given
        if serve_http or status_on or getattr(args, "record", None):
            watch.start(args, socket_path, serve_http=serve_http)
        sockets = external + ([watch.socket] if watch.socket else [])
        for note in watch.notes:
            print(f"gpuwatch: {note}", file=sys.stderr, flush=True)
        watch.notes.clear()
        if not quiet:
            where = [f"metrics at {watch.url}/metrics"] if watch.url else []
            if external:
                where.append(f"reporting to {', '.join(external)}")
            print(f"gpuwatch: watching {' '.join(command)}"
                  + (f" ({'; '.join(where)})" if where else ""), file=sys.stderr, flush=True)
        env = child_environment(os.environ, sockets)
        try:
            pid = _spawn(command, env, ignored)
        except FileNotFoundError:
            print(f"gpuwatch: command not found: {command[0]}", file=sys.stderr)
            return 127
        except OSError as err:
            print(f"gpuwatch: cannot run {command[0]}: {err.strerror}", file=sys.stderr)
            return 126
        tty = _open_tty()
        if tty is not None and not _set_foreground(tty, pid):
            os.close(tty)
            tty = None
        handed_over = tty is not None
        job = _Job(pid, tty)
        threading.Thread(target=_forward_signals, args=(job,), name="gpuwatch-signals",
                         daemon=True).start()
        status = None
        if status_on and watch.store is not None:
            store = watch.store
            status = StatusLine(store.latest, lambda: list(store.latest().jobs), sys.stderr,
                                pid=pid, interval=_status_interval(), advice=watch.advice)
            status.start()
        wait_status = job.wait()
        if tty is not None:
            _set_foreground(tty, os.getpgrp())
        job.ended.set()
        exit_code = os.waitstatus_to_exitcode(wait_status)
        code, words, reason = _exit_text(exit_code)
        died_by = -exit_code if exit_code < 0 else 0
        watch.job_ended(pid, reason)
        if status is not None:
            jobs = list(watch.store.latest().jobs) if watch.store is not None else []
            status.stop(summary_line(jobs, words))
    finally:
        watch.stop()
        for note in watch.notes:
            print(f"gpuwatch: {note}", file=sys.stderr, flush=True)
        if private_dir:
            shutil.rmtree(private_dir, ignore_errors=True)
        if tty is not None:
            os.close(tty)
    if died_by:
        if handed_over and died_by in (signal.SIGINT, signal.SIGQUIT):
            # the terminal's Ctrl-C went to the job's group instead of ours: pass it on to
            # ours as the terminal would have, so a shell script running us in a loop stops
            with contextlib.suppress(OSError):
                os.killpg(os.getpgrp(), died_by)
        die_by_signal(died_by)
    if watch.unfinished:
        # a thread is stuck writing (to a pipe nobody reads): the interpreter's own exit
        # would wait for it, or abort on the stream it holds
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(code)
    return code
