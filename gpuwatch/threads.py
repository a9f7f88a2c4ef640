"""The daemon's threads, named for the operating system too.

Python names a thread only for itself (``threading.Thread.name``; before 3.14 the kernel
knows every thread of the daemon as ``python3``). A :class:`Thread` of this module also
gives the kernel its name, so ``top -H``, ``ps -L``, ``py-spy`` and
``/proc/PID/task/TID/comm`` tell the GPU reader from the HTTP server, and
``benchmarks/bench_tick.py`` splits the daemon's CPU by thread. The kernel keeps 15
bytes: ``gpuwatch-`` becomes ``gw-``, and the rest is cut there. :class:`Periodic` runs
a function on such a thread every so many seconds (the live advisor, the heap trimmer).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

PREFIX = "gpuwatch-"
COMM_BYTES = 15  # TASK_COMM_LEN less its NUL


def os_name(name: str) -> str:
    """The name the kernel is given for a thread called ``name``."""
    if name.startswith(PREFIX):
        name = "gw-" + name[len(PREFIX):]
    return name.encode("utf-8", "replace")[:COMM_BYTES].decode("utf-8", "ignore")


def name_this_thread(name: str) -> bool:
    """Give the calling thread ``name`` in the kernel's books; False where it could not
    (not Linux, /proc not mounted, a sandbox): the thread runs the same either way."""
    try:
        with open("/proc/thread-self/comm", "w", encoding="utf-8") as f:
            f.write(os_name(name))
        return True
    except OSError:
        return False


class Thread(threading.Thread):
    """A ``threading.Thread`` that names itself in the kernel as it starts to run."""

    def run(self) -> None:
        name_this_thread(self.name)
        super().run()


class Periodic:
    """Calls ``fn`` on a :class:`Thread` of its own named ``name``, ``first`` seconds after
    :meth:`start` (``every`` if not given) and every ``every`` seconds after that, until
    :meth:`stop` or until ``fn`` returns False. ``fn`` handles its own exceptions."""

    def __init__(self, fn: Callable[[], Any], every: float, name: str,
                 first: float | None = None) -> None:
        self.fn = fn
        self.every = every
        self.first = every if first is None else first
        self.name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self._thread = Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            self._thread = None

    def _run(self) -> None:
        wait = self.first
        while not self._stop.wait(wait):
            if self.fn() is False:
                return
            wait = self.every
