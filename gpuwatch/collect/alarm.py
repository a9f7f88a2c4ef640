"""A one-shot timer that one thread waits on and another moves without waking it.

The sampler's loop thread only has to act on a tick its reader did not publish in time (a
reader stuck inside an NVML call, or none left). Waking it at every tick to see that the
reader did publish cost it a thread wake-up per tick (~90 µs of CPU on an H100 host: as much
as a third of a GPU's NVML calls). With this alarm the reader, as it publishes a tick, moves
the alarm to the next tick's check time; the loop sleeps until the alarm fires, which it does
only when a publication is late.

Linux's timerfd does exactly this (``timerfd_settime`` on an absolute CLOCK_MONOTONIC time is
one system call, and the waiter blocks in ``select`` on the descriptor). The calls go
through ctypes to the C library (``os.timerfd_*`` came only with Python 3.13; ctypes is
loaded already, by pynvml). Where there is no timerfd (not Linux), :func:`make_alarm`
returns None and the loop wakes every tick.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import time
from typing import Any

log = logging.getLogger(__name__)

_CLOCK_MONOTONIC = getattr(time, "CLOCK_MONOTONIC", 1)
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class Alarm:
    """A timerfd on CLOCK_MONOTONIC (the clock of ``time.monotonic`` on Linux).

    :meth:`set_at` may be called from any thread, as often as wanted; :meth:`wait` blocks
    one thread until the time last set has passed (or :meth:`fire_now`)."""

    def __init__(self) -> None:
        self.fd = -1
        self._set: Any = None
        flags = os.O_NONBLOCK | os.O_CLOEXEC
        libc = ctypes.CDLL(None, use_errno=True)
        create = libc.timerfd_create  # AttributeError where the C library has none
        settime = libc.timerfd_settime
        create.restype = ctypes.c_int
        settime.restype = ctypes.c_int
        fd = create(_CLOCK_MONOTONIC, flags)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_create: {os.strerror(err)}")
        # one struct, written in place: set_at runs once per tick on the reader
        spec = _Itimerspec()
        value = spec.it_value
        ref = ctypes.byref(spec)

        def set_at(when: float) -> None:
            sec = int(when)
            value.tv_sec = sec
            value.tv_nsec = int((when - sec) * 1e9)
            if settime(fd, _TFD_TIMER_ABSTIME, ref, None) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"timerfd_settime: {os.strerror(err)}")
        self.fd = fd
        self._set = set_at
        # disarmed until the first set_at: a wait before it blocks until fire_now()

    def set_at(self, when: float) -> None:
        """Fire at ``when`` (``time.monotonic()`` seconds); replaces any earlier time."""
        self._set(when)

    def fire_now(self) -> None:
        # an absolute time already past fires at once (zero would disarm the timer)
        self._set(max(time.monotonic() - 1.0, 1e-6))

    def wait(self) -> None:
        """Until the time set has passed; consumes the expiry. Returns at once when it
        passed before the call (an expiry is kept until read)."""
        fd = self.fd
        while True:
            try:
                os.read(fd, 8)
                return
            except BlockingIOError:
                pass
            except InterruptedError:
                continue
            select.select([fd], [], [])

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


def make_alarm() -> Alarm | None:
    """An Alarm, or None where the system has no timerfd (the loop then wakes every tick)."""
    alarm = None
    try:
        alarm = Alarm()
        alarm.set_at(time.monotonic() + 3600.0)  # try the call once; and leave it armed far out
        return alarm
    except (OSError, AttributeError, ValueError, TypeError) as err:
        if alarm is not None:
            alarm.close()
        log.debug("no timerfd (%s): the sampler's loop wakes at every tick", err)
        return None


__all__ = ["Alarm", "make_alarm"]
