"""How a training process's reports leave it: when, and what a full queue costs.

The hook (gpuwatch/job/hook/core.py) sends one datagram per report to the daemon's Unix
socket from its reporting thread. This module holds that part without torch, so the
benchmark of many ranks (benchmarks/bench_receiver.py) sends exactly as the hook does.
"""

from __future__ import annotations

import os
import random
import socket
import time

REPORT_INTERVAL = 0.5  # seconds: at most two reports a second
# a report the daemon's socket queue cannot take yet (ranks of one host reporting at the
# same moment fill it: Linux's default net.unix.max_dgram_qlen is 10) is tried again after
# these pauses, 37 ms at most, before it counts as dropped; a report is sent by the
# reporting thread, or at the job's exit, never by the training thread
BUSY_RETRY_SECONDS = (0.002, 0.005, 0.01, 0.02)


def report_offset() -> float:
    """How long a process's reporting thread waits before its first report: a point of
    the interval of its own (pid and clock), so that the ranks of a host, started
    together, do not all report in the same millisecond and fill the daemon's queue."""
    return random.Random(os.getpid() ^ time.perf_counter_ns()).uniform(0.0, REPORT_INTERVAL)


def send(sock: socket.socket, data: bytes, path: str, retry: bool = True) -> str | None:
    """Send ``data`` to ``path`` on the non-blocking datagram ``sock``. None once sent,
    else why not: ``busy`` (the queue stayed full through the retries), ``no_receiver``,
    ``denied`` or ``error``."""
    try:
        sock.sendto(data, path)
        return None
    except BlockingIOError:
        pass
    except (FileNotFoundError, ConnectionRefusedError):
        return "no_receiver"
    except PermissionError:
        return "denied"
    except OSError:
        return "error"
    if retry:
        for pause in BUSY_RETRY_SECONDS:
            time.sleep(pause)
            try:
                sock.sendto(data, path)
                return None
            except BlockingIOError:
                continue
            except OSError:
                return "error"
    return "busy"
