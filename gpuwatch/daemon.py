"""The daemon: wires the store, a source (the sampler, or a replayed recording), the hook
receiver, the advisor, the recorder and the HTTP server, and runs until told to stop.

Every part but the store and the source is optional: a teammate's module that is missing,
or a part that fails to start, is logged and left out, and the rest still serves.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from importlib import resources
from typing import Any

from prometheus_client import CollectorRegistry

from gpuwatch import threads
from gpuwatch.errors import UserError, file_error
from gpuwatch.samples import Sample
from gpuwatch.serve import sdnotify
from gpuwatch.serve.config import Config, config_from_args
from gpuwatch.serve.exporter import GpuwatchCollector
from gpuwatch.serve.httpserver import HttpServer
from gpuwatch.serve.privacy import redacting
from gpuwatch.serve.webconfig import WebConfigFile
from gpuwatch.store import Store

log = logging.getLogger(__name__)

SYSTEM_HOOK_DIR = "/run/gpuwatch"  # created by the systemd unit (RuntimeDirectory=gpuwatch)
HOOK_SOCKET_NAME = "hook.sock"
# the C heap's free pages go back to the kernel this long after the start (imports, the
# rule files, NVML's init and the advisor's first evaluation are behind it by then), and
# again at this interval (the windows turn over, leaving free pages between live ones)
TRIM_FIRST_SECONDS = 15.0
TRIM_EVERY_SECONDS = 600.0


def _malloc_trim() -> Callable[[], Any] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none (musl)."""
    try:
        import ctypes

        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return lambda: fn(0)


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class HeapTrimmer:
    """Hands the C heap's free pages back to the kernel now and then.

    glibc keeps memory that Python freed mapped for later, and only gives back what lies at
    the top of its heap: what the start-up parsed and threw away, and what the windows
    dropped as they turned over, stays in the daemon's RSS though nothing uses it.
    ``malloc_trim(0)`` returns every free page (docs/benchmarks.md measures the daemon's
    RSS with it). Without glibc it does nothing."""

    def __init__(self, first: float | None = None, every: float | None = None) -> None:
        self.trims = 0
        self.released_bytes = 0
        self._trim = _malloc_trim()
        self._loop = threads.Periodic(
            self._tick, TRIM_EVERY_SECONDS if every is None else every, "gpuwatch-heap-trim",
            first=TRIM_FIRST_SECONDS if first is None else first)

    @property
    def available(self) -> bool:
        return self._trim is not None

    def trim(self) -> int | None:
        """Trim once; the RSS it gave back, in bytes (None: not known or not glibc)."""
        if self._trim is None:
            return None
        before = _rss_bytes()
        self._trim()
        after = _rss_bytes()
        self.trims += 1
        if before is None or after is None:
            return None
        self.released_bytes += max(0, before - after)
        log.debug("heap trimmed: RSS %.1f -> %.1f MiB", before / 2**20, after / 2**20)
        return before - after

    def start(self) -> None:
        if self._trim is not None:
            self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    def _tick(self) -> bool:
        try:
            self.trim()
        except Exception:  # never worth more than a line in the log
            log.exception("trimming the heap failed; not trying again")
            return False
        return True


def _optional(module: str, name: str) -> Any | None:
    """``module.name`` if that module exists, else None: the daemon runs without it.

    Only the module itself being absent is tolerated; an error inside it still raises.
    """
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is not None and module.startswith(err.name):
            log.debug("%s is not available: %s", module, err)
            return None
        raise
    return getattr(mod, name, None)


def _private_dir(base: str, name: str) -> str | None:
    """``base/name`` as a directory only we can use, or None when that is not safe."""
    path = os.path.join(base, name)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
    except OSError:
        return None
    # someone else could have made it first in a shared /tmp
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return path


def default_hook_socket() -> str:
    """Where the hook socket goes when none is configured.

    The systemd service's runtime directory when we may write there; else a directory of
    our own under $XDG_RUNTIME_DIR, or under the temp dir.
    """
    if os.path.isdir(SYSTEM_HOOK_DIR) and os.access(SYSTEM_HOOK_DIR, os.W_OK | os.X_OK):
        return os.path.join(SYSTEM_HOOK_DIR, HOOK_SOCKET_NAME)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    directory = None
    if xdg and os.path.isdir(xdg):
        directory = _private_dir(xdg, "gpuwatch")
    if directory is None:
        directory = _private_dir(tempfile.gettempdir(), f"gpuwatch-{os.getuid()}")
    if directory is None:
        directory = tempfile.mkdtemp(prefix="gpuwatch-")
    return os.path.join(directory, HOOK_SOCKET_NAME)


class Daemon:
    """One gpuwatch daemon: ``start()``, then ``serve_forever()`` or ``stop()``.

    ``replay`` serves a recording instead of sampling; then no hook socket is opened and
    nothing but the HTTP port is bound, so several replays can run side by side.
    ``url`` is the bound address after ``start()`` (port 0 becomes the real port).
    """

    def __init__(self, config: Config, *, replay: str | None = None,
                 replay_name: str | None = None, serve_http: bool = True,
                 hook_socket: str | None = None, hook_required: bool = True,
                 sampler_kwargs: dict[str, Any] | None = None) -> None:
        self.config = config
        self.replay = replay
        self.replay_name = replay_name  # how reports name it (the demo's temporary path isn't)
        self.serve_http = serve_http
        self.store = Store(history_seconds=config.history_seconds)
        self.url: str | None = None
        self.hook_socket: str | None = None
        self._wanted_socket = hook_socket or config.hook_socket
        # False (the launcher): a hook socket that cannot be opened costs the training
        # metrics only, said in ``hook_error``; metrics and the job go on
        self._hook_required = hook_required
        self.hook_error: str | None = None
        self._sampler_kwargs = dict(sampler_kwargs or {})
        self.source: Any = None  # the Sampler or the Replayer
        self.receiver: Any = None
        self.advisor: Any = None
        self.recorder: Any = None
        self.http: HttpServer | None = None
        self.trimmer = HeapTrimmer()
        self._started: list[Any] = []
        self._stop = threading.Event()
        self._previous_handlers: dict[int, Any] = {}  # while catch_signals() holds them
        self._stopped = False
        self._start_time = 0.0
        self._last_sample = 0.0
        self.scenario: str | None = None  # for the meta line of a recording
        self.on_stopping: Callable[[], Any] | None = None  # systemd's STOPPING=1

    # -- life cycle ------------------------------------------------------------------
    def start(self) -> None:
        self._start_time = time.monotonic()
        # what is served over HTTP: without the names/users the config keeps private
        published = redacting(self.store.latest, self.config.privacy)
        collector = GpuwatchCollector(published)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        if self.serve_http:
            web = WebConfigFile(self.config.web_config_file) \
                if self.config.web_config_file else None  # a bad file fails the start
            self.http = HttpServer(self.config.listen_address, registry=registry,
                                   snapshot=published, health=self.health,
                                   description=self._description(), web=web)
            # bind before starting anything, so a port in use fails fast and alone
            self.http.bind()
        self.store.subscribe(self._saw_sample)
        try:
            self._make_source()
            if self.config.record:
                # before the source starts, so that its first tick is recorded too
                self._start_recorder()
            self.source.start()
            self._started.append(self.source)
            if self.replay is None:
                self._start_receiver()
            self._start_advisor(collector)
            if self.http is not None:
                self.http.start()
                self._started.append(self.http)
                self.url = self.http.url
            self.trimmer.start()
            self._started.append(self.trimmer)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        if self.on_stopping is not None:
            self.on_stopping()
        if self.http is not None and self.http not in self._started:
            self.http.stop()  # bound but never started
        # stop serving first, then what produces samples, and the recorder last so that it
        # writes out everything the sources produced
        order = [self.trimmer, self.http, self.source, self.receiver, self.advisor,
                 self.recorder]
        for part in [p for p in order if p is not None and p in self._started]:
            try:
                part.stop()
            except Exception:  # keep stopping the rest
                log.exception("error stopping %s", type(part).__name__)
        self._started.clear()
        self.store.unsubscribe(self._saw_sample)

    def catch_signals(self) -> None:
        """From now on SIGINT and SIGTERM stop the daemon cleanly (main thread only). Called
        before the daemon says it serves, so a stop sent the moment it does (a test, a
        service manager) finds the handler in place; ``serve_forever`` puts the previous
        handlers back."""
        previous = self._previous_handlers
        if previous or threading.current_thread() is not threading.main_thread():
            return

        def on_signal(signum: int, _frame: Any) -> None:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            # a second signal during shutdown acts as usual (kills)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)

    def serve_forever(self) -> None:
        """Run until SIGINT or SIGTERM (or ``stop()`` from another thread), then stop."""
        self.catch_signals()
        try:
            # a signal's handler sets _stop and ends the wait at once (the main thread's
            # lock waits are interrupted for it); the timeout is only a backstop
            while not self._stop.wait(5.0):
                pass
        finally:
            for sig, handler in self._previous_handlers.items():
                signal.signal(sig, handler)
            self._previous_handlers.clear()
            self.stop()

    def health(self) -> tuple[bool, str]:
        """Healthy while the source keeps publishing (ticks are not stuck)."""
        now = time.monotonic()
        limit = max(10 * self.config.interval, 30.0)
        if self._last_sample == 0.0:
            if now - self._start_time < limit:
                return True, "ok: starting, no sample yet"
            return False, f"unhealthy: no sample in the {now - self._start_time:.0f} s since start"
        age = now - self._last_sample
        if age > limit:
            return False, f"unhealthy: last sample {age:.0f} s ago"
        return True, f"ok: last sample {age:.1f} s ago"

    def _saw_sample(self, _sample: Sample) -> None:
        self._last_sample = time.monotonic()

    def _description(self) -> str:
        if self.replay:
            return f"Replaying {os.path.basename(self.replay)} as if live."
        return "Sampling the GPUs and the host."

    # -- the parts ---------------------------------------------------------------------
    def _make_source(self) -> None:
        if self.replay is not None:
            replayer_cls = _optional("gpuwatch.trace.replay", "Replayer")
            if replayer_cls is None:
                raise UserError("replay is not available in this build (gpuwatch.trace.replay)")
            self.source = replayer_cls(self.store, self.replay, loop=True)
        else:
            sampler_cls = _optional("gpuwatch.collect.sampler", "Sampler")
            if sampler_cls is None:
                raise UserError("the sampler is not available in this build (gpuwatch.collect.sampler)")
            self.source = sampler_cls(self.store, interval=self.config.interval,
                                      slow_interval=self.config.slow_interval,
                                      energy_interval=self.config.energy_interval,
                                      **self._sampler_kwargs)

    def _start_receiver(self) -> None:
        receiver_cls = _optional("gpuwatch.job.receiver", "HookReceiver")
        if receiver_cls is None:
            log.info("the hook receiver is not available; training metrics are off")
            return
        path = self._wanted_socket or default_hook_socket()
        try:
            receiver = receiver_cls(self.store, path)
            receiver.start()
        except (OSError, UserError) as err:
            if self._wanted_socket and not self._hook_required:
                self.hook_error = f"cannot open the hook socket {path}: {err}"
                log.warning("%s; training metrics are off", self.hook_error)
                return
            if self._wanted_socket:
                raise UserError(f"cannot open the hook socket {path}: {err}") from err
            # the shared default is taken (another daemon): use one of our own
            fallback = os.path.join(os.path.dirname(path), f"hook-{os.getpid()}.sock")
            log.warning("hook socket %s is in use (%s); using %s", path, err, fallback)
            receiver = receiver_cls(self.store, fallback)
            receiver.start()
        self.receiver = receiver
        self._started.append(receiver)
        self.hook_socket = str(getattr(receiver, "socket_path", path))

    def _start_advisor(self, collector: GpuwatchCollector) -> None:
        advisor_cls = _optional("gpuwatch.advisor", "LiveAdvisor")
        if advisor_cls is None:
            advisor_cls = _optional("gpuwatch.advisor.live", "LiveAdvisor")
        if advisor_cls is None:
            log.info("the advisor is not available; /api/advice answers 503")
            return
        try:
            advisor = advisor_cls(self.store, self.config)
            if hasattr(self.source, "on_loop") and hasattr(advisor, "new_segment"):
                self.source.on_loop = advisor.new_segment  # a replay: judge each pass alone
            if self.replay is not None and hasattr(advisor, "judge_ahead"):
                # /api/advice is the whole recording's report from the first request
                advisor.judge_ahead(self.replay, self.replay_name)
            advisor.start()
        except UserError:
            raise  # a bad rule file is the user's to fix, not to hide
        except Exception:  # metrics still serve without advice
            log.exception("the advisor failed to start; serving without advice")
            return
        self.advisor = advisor
        self._started.append(advisor)
        collector.add_collector(advisor.collector())
        if self.http is not None:
            self.http.advice = advisor.report_json

    def _start_recorder(self) -> None:
        recorder_cls = _optional("gpuwatch.trace.record", "Recorder")
        if recorder_cls is None:
            raise UserError("recording is not available in this build (gpuwatch.trace.record)")
        recorder = recorder_cls(self.store, self.config.record, self.trace_meta())
        recorder.start()
        self.recorder = recorder
        self._started.append(recorder)

    def trace_meta(self) -> dict[str, Any]:
        """The `meta` line for a recording of what this daemon sees."""
        from gpuwatch.trace.format import make_meta

        infos = getattr(self.source, "infos", None) or self.store.latest().infos
        return make_meta(infos=tuple(infos), host_cpus=os.cpu_count(),
                         sample_hz=1.0 / self.config.interval, scenario=self.scenario)


@contextlib.contextmanager
def demo_recording() -> Iterator[str]:
    """The bundled demo recording as a file path (extracted if the package is zipped)."""
    with resources.as_file(resources.files("gpuwatch.data") / "demo.jsonl") as path:
        yield str(path)


def _systemd_ready(daemon: Daemon, notifier: sdnotify.Notifier) -> sdnotify.Watchdog | None:
    """Tell systemd we serve (Type=notify); ping its watchdog while sampling progresses."""
    if not notifier.enabled:
        return None
    daemon.on_stopping = lambda: notifier.notify("STOPPING=1", "STATUS=stopping")
    notifier.notify("READY=1", f"STATUS=serving {daemon.url}/metrics")
    if notifier.watchdog_timeout is None:
        return None
    progress = sdnotify.SamplingProgress(daemon.store.latest, daemon.config.interval)
    watchdog = sdnotify.Watchdog(notifier, progress.check)
    watchdog.start()
    return watchdog


def main(args: argparse.Namespace) -> int:
    """`gpuwatch run` without a command: the daemon in the foreground."""
    config = config_from_args(args)
    replay = getattr(args, "replay", None)
    if getattr(args, "demo", False):
        if replay:
            raise UserError("--demo and --replay both given: choose one")
        from gpuwatch.advisor.sources import DEMO_NAME

        with demo_recording() as path:
            return _serve(config, path, "the bundled demo recording", name=DEMO_NAME)
    if replay is not None:
        try:  # before the port is bound; worded as `advise --replay` words it
            open(replay, "rb").close()
        except OSError as err:
            raise file_error("read", "trace", replay, err) from err
    return _serve(config, replay, replay)


def _serve(config: Config, replay: str | None, what: str | None, name: str | None = None
           ) -> int:
    # read (and unset) before anything starts, so no thread or child inherits it
    notifier = sdnotify.Notifier.from_environ()
    daemon = Daemon(config, replay=replay, replay_name=name)
    daemon.start()
    daemon.catch_signals()  # before it says it serves: a stop sent then is a clean one
    doing = f"replaying {what}" if replay else "sampling"
    hook = f"; hook socket {daemon.hook_socket}" if daemon.hook_socket else ""
    print(f"gpuwatch: serving {daemon.url}/metrics ({doing}); advice at {daemon.url}/api/advice"
          f"{hook}", file=sys.stderr, flush=True)
    watchdog = _systemd_ready(daemon, notifier)
    try:
        daemon.serve_forever()
    finally:
        if watchdog is not None:
            watchdog.stop()
        notifier.close()
    failed = getattr(daemon.recorder, "failed", None)
    if failed:  # --record stopped early: the recording is incomplete
        raise UserError(failed)
    return 0


def record_main(args: argparse.Namespace) -> int:
    """``gpuwatch record FILE``: sample like the daemon, serve nothing, write a trace."""
    duration = getattr(args, "duration", None)
    if duration is not None and not duration > 0:
        raise UserError(f"--duration must be above 0 seconds, got {duration:g}")
    config = config_from_args(args)
    # the daemon's own recorder, started before its sampler so the first tick is in it
    config = replace(config, record=args.file)
    stop = threading.Event()
    previous: dict[int, Any] = {}

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("received %s, finishing the recording", signal.Signals(signum).name)
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # a second signal acts as usual
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    daemon = Daemon(config, serve_http=False)
    daemon.scenario = args.scenario
    recorder: Any = None
    try:
        daemon.start()
        recorder = daemon.recorder
        if args.file != "-":
            log.info("recording to %s every %g s%s", args.file, config.interval,
                     f" for {duration:g} s" if duration else " until interrupted")
        deadline = None if duration is None else time.monotonic() + duration
        # short waits: the signal handler runs between them on the main thread
        while not stop.is_set() and not (recorder is not None and recorder.failed):
            left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if left <= 0:
                break
            stop.wait(left)
    finally:
        daemon.stop()  # the recorder last: it writes out the last of the samples
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if recorder is not None and recorder.broken_pipe:
        # the reader has all it wanted (`| head`): end as other tools do there, by SIGPIPE,
        # quietly (and without the interpreter flushing into the broken pipe at exit)
        from gpuwatch.launcher import die_by_signal

        die_by_signal(signal.SIGPIPE)
    if recorder is not None and recorder.failed:
        raise UserError(recorder.failed)
    return 0
