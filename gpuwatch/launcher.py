"""``gpuwatch run -- CMD ARGS``: start a training job with the torch hook injected, watch it.

- **Injection without code changes.** The job's environment gets ``PYTHONPATH`` with
  ``gpuwatch/_inject`` first (its ``sitecustomize`` attaches the hook when the job imports
  torch, and chains to any other sitecustomize) and ``GPUWATCH_SOCKET`` (where to report).
  Every Python process of the job inherits both: torchrun's ranks report, each on its own.
- **Where reports go.** To a gpuwatch daemon already running on the host (the systemd
  service's ``/run/gpuwatch/hook.sock``, or the sockets in an inherited
  ``$GPUWATCH_SOCKET``), and to this command's own daemon (``gpuwatch.daemon.Daemon``
  on a private socket, serving /metrics for the job's lifetime). When a system daemon
  already serves the host, ours serves no HTTP and only feeds the status line and
  ``--record``. When the HTTP port is taken, ours moves to a free port (said once).
- **Signals.** SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to this command
  are passed on to the job. The ones a terminal sends (Ctrl-C, Ctrl-\\, hang-up) already
  reach the job, which shares our process group, so those are not sent twice.
- **Exit code.** The job's own; 128 + N when signal N killed it; 127 when the command was
  not found, 126 when it could not be executed.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpuwatch import receiver as receiver_mod
from gpuwatch.errors import UserError
from gpuwatch.statusline import StatusLine, summary_line
from gpuwatch.store import Store

log = logging.getLogger(__name__)

SYSTEM_SOCKET = "/run/gpuwatch/hook.sock"
ENV_SOCKET = "GPUWATCH_SOCKET"
# where to look for a system daemon's socket (tests; non-standard installs)
ENV_SYSTEM_SOCKET = "GPUWATCH_SYSTEM_SOCKET"
ENV_STATUS_INTERVAL = "GPUWATCH_STATUS_INTERVAL"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)
# signals a terminal sends to its whole foreground process group, the job included
_FROM_TERMINAL = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)
_SI_KERNEL = 0x80  # siginfo si_code of a signal the kernel generated (e.g. the tty driver)


def inject_dir() -> str:
    """The directory whose ``sitecustomize.py`` attaches the hook."""
    import gpuwatch._inject

    return os.path.dirname(os.path.abspath(gpuwatch._inject.__file__))


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


def _port_in_use(err: BaseException) -> bool:
    cause = err.__cause__
    return isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE


def _any_port(listen: str) -> str:
    from gpuwatch.config import parse_listen_address

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

    def start(self, args: argparse.Namespace, socket_path: str, serve_http: bool) -> None:
        from gpuwatch.config import config_from_args

        config = config_from_args(args)  # bad flags are the user's to fix: before the job
        try:
            from gpuwatch.daemon import Daemon
        except ImportError as err:
            self.notes.append(f"the daemon is not available ({err}); training metrics only")
            self._bare(socket_path)
            return
        attempts = [(config, serve_http)]
        if serve_http:
            attempts += [(replace(config, listen_address=_any_port(config.listen_address)), True),
                         (config, False)]
        for i, (cfg, http) in enumerate(attempts):
            daemon = Daemon(cfg, serve_http=http, hook_socket=socket_path)
            try:
                daemon.start()
            except UserError as err:
                if i == 0 and http and _port_in_use(err):
                    continue  # taken (another job's gpuwatch): a free port instead
                if cfg.record:
                    raise  # --record asked for something we cannot do here
                self.notes.append(f"could not serve metrics ({err})")
                continue
            except Exception as err:  # noqa: BLE001 - the job runs anyway
                self.notes.append(f"the daemon failed to start ({err})")
                continue
            if i == 1:
                self.notes.append(f"{config.listen_address} is in use; serving this job's "
                                  f"metrics on {daemon.url}/metrics instead")
            self.daemon, self.store, self.url = daemon, daemon.store, daemon.url
            self.receiver = daemon.receiver
            self.socket = daemon.hook_socket
            return
        self._bare(socket_path)

    def _bare(self, socket_path: str) -> None:
        """Just a store and a receiver: the status line still works."""
        self.store = Store()
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

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
        elif self.receiver is not None:
            self.receiver.stop()


def _forward_signals(pid: int, done: threading.Event) -> None:
    while True:
        info = signal.sigwaitinfo(FORWARDED)
        if done.is_set():
            continue
        if info.si_code == _SI_KERNEL and info.si_signo in _FROM_TERMINAL:
            continue  # the terminal sent it to the job as well
        try:
            os.kill(pid, info.si_signo)
        except ProcessLookupError:
            pass


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


def main(args: argparse.Namespace) -> int:
    command: list[str] = list(args.command)
    if not command:
        raise UserError("no command given after --")
    status_on = args.status if getattr(args, "status", None) is not None else sys.stderr.isatty()
    # block the forwarded signals before any thread starts, so that only the forwarding
    # thread ever receives them (sigwaitinfo tells us who sent each one)
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    private_dir = tempfile.mkdtemp(prefix="gpuwatch-job-")
    watch = _Watch()
    try:
        external = external_sockets(os.environ)
        if not external or status_on or getattr(args, "record", None):
            watch.start(args, os.path.join(private_dir, "hook.sock"), serve_http=not external)
        sockets = external + ([watch.socket] if watch.socket else [])
        for note in watch.notes:
            print(f"gpuwatch: {note}", file=sys.stderr, flush=True)
        if status_on:
            where = [f"metrics at {watch.url}/metrics"] if watch.url else []
            if external:
                where.append(f"reporting to {', '.join(external)}")
            print(f"gpuwatch: watching {' '.join(command)}"
                  + (f" ({'; '.join(where)})" if where else ""), file=sys.stderr, flush=True)
        env = child_environment(os.environ, sockets)
        try:
            pid = os.posix_spawnp(command[0], command, env, setsigmask=(),
                                  setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
        except FileNotFoundError:
            print(f"gpuwatch: command not found: {command[0]}", file=sys.stderr)
            return 127
        except OSError as err:
            print(f"gpuwatch: cannot run {command[0]}: {err.strerror}", file=sys.stderr)
            return 126
        done = threading.Event()
        threading.Thread(target=_forward_signals, args=(pid, done), name="gpuwatch-signals",
                         daemon=True).start()
        status = None
        if status_on and watch.store is not None:
            store = watch.store
            status = StatusLine(store.latest, lambda: list(store.latest().jobs), sys.stderr,
                                pid=pid, interval=_status_interval(), advice=watch.advice)
            status.start()
        _, wait_status = os.waitpid(pid, 0)
        done.set()
        code, words, reason = _exit_text(os.waitstatus_to_exitcode(wait_status))
        watch.job_ended(pid, reason)
        if status is not None:
            jobs = list(watch.store.latest().jobs) if watch.store is not None else []
            status.stop(summary_line(jobs, words))
        return code
    finally:
        watch.stop()
        shutil.rmtree(private_dir, ignore_errors=True)
