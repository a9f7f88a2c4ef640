"""systemd's notify protocol, and the watchdog that pings only while sampling progresses.

The protocol (sd_notify(3)) is one datagram of ``KEY=VALUE`` lines to the AF_UNIX socket
named by ``$NOTIFY_SOCKET``: a path, or an abstract name written with a leading ``@``.
``$WATCHDOG_USEC`` asks for ``WATCHDOG=1`` at least that often, and only from the process
``$WATCHDOG_PID`` names when it is set. No python-systemd dependency: a page of code.

The watchdog is the point of ``Type=notify`` here: a daemon that still answers HTTP but
whose sampling loop has stopped serves stale numbers forever. So ``WATCHDOG=1`` goes out
only while :class:`SamplingProgress` sees the loop publish ticks, and, on a host with GPUs,
at least one GPU read finishing: one GPU stuck in a hung NVML call costs only that GPU's
fields (the sampler counts it as ``gpu<N>_stalled``) and the pings go on; every GPU stuck,
or the loop itself stuck, and they stop, so systemd restarts the service after
``WatchdogSec``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, MutableMapping

from gpuwatch import threads
from gpuwatch.samples import Snapshot

log = logging.getLogger(__name__)


def _address(value: str) -> str | bytes | None:
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return b"\0" + value[1:].encode()  # Linux abstract namespace
    return None


class Notifier:
    """Sends notify messages to ``$NOTIFY_SOCKET``; does nothing when it is not set.

    ``from_environ`` removes the variables it reads (as sd_notify's ``unset_environment``
    does), so a process the daemon starts never talks to systemd in its name.
    """

    def __init__(self, address: str | bytes | None, watchdog_usec: int | None = None) -> None:
        self.address = address
        # seconds between pings systemd wants at least; None: no watchdog asked for us
        self.watchdog_timeout = watchdog_usec / 1e6 if watchdog_usec else None
        self._sock: socket.socket | None = None
        self._failed = False
        self._lock = threading.Lock()

    @classmethod
    def from_environ(cls, environ: MutableMapping[str, str] | None = None,
                     pid: int | None = None) -> Notifier:
        env = os.environ if environ is None else environ
        raw = env.pop("NOTIFY_SOCKET", "")
        usec_text = env.pop("WATCHDOG_USEC", "")
        pid_text = env.pop("WATCHDOG_PID", "")
        address = _address(raw) if raw else None
        if raw and address is None:
            log.warning("NOTIFY_SOCKET=%r is not a socket path or @name; not notifying", raw)
        usec = _watchdog_usec(usec_text, pid_text, os.getpid() if pid is None else pid)
        return cls(address, usec)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *fields: str) -> bool:
        """Send ``fields`` (``"READY=1"``, ...) as one datagram; False if it could not go."""
        if self.address is None:
            return False
        message = "\n".join(fields).encode()
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX,
                                               socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.sendto(message, self.address)
            except OSError as err:
                if not self._failed:  # once: a gone manager fails the same way every time
                    log.warning("cannot notify systemd at %r: %s", self.address, err)
                    self._failed = True
                return False
        return True

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


def _watchdog_usec(usec_text: str, pid_text: str, pid: int) -> int | None:
    if not usec_text:
        return None
    try:
        usec = int(usec_text)
    except ValueError:
        log.warning("WATCHDOG_USEC=%r is not a number; no watchdog", usec_text)
        return None
    if usec <= 0:
        return None
    if pid_text:
        try:
            if int(pid_text) != pid:  # meant for another process (e.g. our parent)
                return None
        except ValueError:
            log.warning("WATCHDOG_PID=%r is not a pid; no watchdog", pid_text)
            return None
    return usec


class SamplingProgress:
    """Whether the sampling loop has made progress lately, judged from published snapshots.

    ``check()`` is called periodically (by :class:`Watchdog`); it is True while, within
    ``stale_after`` seconds, a new tick was published and, where live GPUs exist, some GPU
    produced a fresh read (a tick counts as fresh for GPU N unless it counted
    ``gpu<N>_stalled``).
    """

    def __init__(self, snapshot: Callable[[], Snapshot], interval: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._snapshot = snapshot
        self._clock = clock
        # a tick is due every interval; three missed ones are a stall, not jitter
        self.stale_after = 3 * interval + 1.0
        self._last_key: tuple[float, int] | None = None
        self._last_stalled: dict[int, int] = {}
        self._last_progress = clock()

    def check(self) -> bool:
        now = self._clock()
        try:
            snap = self._snapshot()
        except Exception:  # a broken store is no progress
            log.exception("reading the latest snapshot for the watchdog failed")
            return now - self._last_progress < self.stale_after
        ticks = snap.health.ticks_total
        key = (snap.t, ticks)
        stalled = {g.gpu: int(snap.health.errors_total.get(f"gpu{g.gpu}_stalled", 0))
                   for g in snap.gpus if not g.lost}
        if self._last_key is not None and key != self._last_key and snap.t > 0:
            new_ticks = ticks - self._last_key[1]
            if not stalled or new_ticks <= 0:
                fresh = True  # no live GPU (or a replay without tick counts): ticks suffice
            else:
                fresh = any(count - self._last_stalled.get(gpu, 0) < new_ticks
                            for gpu, count in stalled.items())
            if fresh:
                self._last_progress = now
        if self._last_key is None or key != self._last_key:
            self._last_key = key
            self._last_stalled = stalled
        return now - self._last_progress < self.stale_after


class Watchdog:
    """Sends ``WATCHDOG=1`` at half the timeout systemd set, while ``progress()`` holds."""

    def __init__(self, notifier: Notifier, progress: Callable[[], bool]) -> None:
        if notifier.watchdog_timeout is None:
            raise ValueError("systemd asked for no watchdog")
        self.notifier = notifier
        self.progress = progress
        self.period = notifier.watchdog_timeout / 2
        self._stop = threading.Event()
        self._thread = threads.Thread(target=self._run, name="gpuwatch-watchdog",
                                      daemon=True)
        self._silent = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=2)

    def _run(self) -> None:
        # progress is looked at more often than pings go out, so a stall is seen promptly
        step = min(self.period, 1.0)
        next_ping = 0.0
        wait = 0.0  # the first look at once: READY=1 has just gone out
        while not self._stop.wait(wait):
            wait = step
            ok = self.progress()
            if not ok:
                if not self._silent:
                    log.error("the sampling loop makes no progress; no more watchdog pings "
                              "(systemd restarts the service after WatchdogSec)")
                    self._silent = True
                continue
            if self._silent:
                log.warning("the sampling loop makes progress again; watchdog pings resume")
                self._silent = False
            now = time.monotonic()
            if now >= next_ping:
                self.notifier.notify("WATCHDOG=1")
                next_ping = now + self.period

