"""The live status line of ``gpuwatch run -- CMD``: one line every few seconds on stderr.

What it shows, from the store (NVML, psutil, the hook) and the advisor when there is one::

    gpuwatch | GPU0 util 97% SM 85% mem 12.3/80.0 GiB | CPU 1.6 cores | step 41.2 ms
      | data wait 3% | 1554 samples/s | scale 65536, 2 skipped | advice: ...

How it shares the terminal with the job: the job writes to the same terminal directly
(its output is not piped through us, so it keeps its colours, its progress bars and its
line buffering). On a terminal the status line lives on the bottom row, outside a scroll
region that holds everything else (the technique apt uses for its progress bar): the
job's output scrolls above it and is never overwritten or split, and each redraw is one
``write()`` that saves the cursor, draws the bottom row and restores the cursor, which the
terminal applies atomically with respect to the job's writes. At the end the region is
reset and the row cleared. Where stderr is not a terminal (``--status`` into a pipe or a
log), each update is a plain line of its own.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

import psutil

from gpuwatch.samples import JobStats, Snapshot

log = logging.getLogger(__name__)

GiB = 1024**3


def _pct(x: float | None) -> str | None:
    return None if x is None else f"{100 * x:.0f}%"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _num(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


class TreeCpu:
    """CPU cores busy in a process tree (the job and its children), between two calls."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._last: tuple[float, float] | None = None

    def cores(self) -> float | None:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return None
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                continue  # gone between listing and reading: it costs its own share
        now = time.monotonic()
        last, self._last = self._last, (now, total)
        if last is None or now <= last[0]:
            return None
        return max(0.0, (total - last[1]) / (now - last[0]))


def _advice_text(report: Any) -> str | None:
    """The newest piece of advice from the advisor's JSON report, whatever its exact shape."""
    items = report
    if isinstance(report, dict):
        items = report.get("advice", report.get("active", report.get("items")))
    if not isinstance(items, list) or not items:
        return None
    item = items[-1] if isinstance(items[-1], dict) else items[0]
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        for key in ("title", "summary", "message", "action", "rule"):
            if isinstance(item.get(key), str) and item[key]:
                return item[key]
    return None


_BOTTLENECK = {"data": "data wait", "sync": "waiting on a peer rank", "gpu": "GPU-bound",
               "host": "host-bound", "other": "outside steps"}


def bottleneck_text(report: Any) -> str | None:
    """The top bottleneck from the advisor's report: the largest slice of the step-time
    attribution over all jobs and ranks (``host-bound 84%``; with ranks, which one)."""
    jobs = report.get("jobs") if isinstance(report, dict) else None
    best: tuple[float, str] | None = None
    for j in jobs or []:
        shares = j.get("time_share") if isinstance(j, dict) else None
        if not isinstance(shares, dict) or not shares:
            continue
        cat, share = max(shares.items(), key=lambda kv: kv[1])
        if cat == "gpu" and len(jobs) > 1:
            continue  # a GPU-bound rank is not what holds a multi-rank job back
        where = f" on rank {j['rank']}" if j.get("rank") is not None and len(jobs) > 1 else ""
        text = f"{_BOTTLENECK.get(cat, cat)} {_pct(share)}{where}"
        if best is None or (cat != "gpu" and share > best[0]) or best[1].startswith("GPU"):
            best = (share, text)
    return best[1] if best else None


def format_status(snapshot: Snapshot, jobs: list[JobStats], cpu_cores: float | None,
                  advice: str | None = None, bottleneck: str | None = None) -> str:
    """One status line (without the terminal controls)."""
    parts = ["gpuwatch"]
    alive = [j for j in jobs if j.alive] or jobs
    used = {j.gpu for j in alive if j.gpu is not None}
    gpus = [g for g in snapshot.gpus if not used or g.gpu in used]
    for g in gpus[:4]:
        bits = [f"GPU{g.gpu}"]
        if g.lost:
            bits.append("lost")
        if g.util is not None:
            bits.append(f"util {_pct(g.util)}")
        if g.sm_active is not None:
            bits.append(f"SM {_pct(g.sm_active)}")
        if g.mem_used_bytes is not None and g.mem_total_bytes:
            bits.append(f"mem {g.mem_used_bytes / GiB:.1f}/{g.mem_total_bytes / GiB:.1f} GiB")
        parts.append(" ".join(bits))
    if len(gpus) > 4:
        parts.append(f"+{len(gpus) - 4} GPUs")
    if cpu_cores is not None:
        parts.append(f"CPU {cpu_cores:.1f} cores")
    if not alive:
        parts.append("waiting for the first training step")
    else:
        steps = sum(j.steps_total for j in alive)
        label = f"{len(alive)} ranks, " if len(alive) > 1 else ""
        parts.append(f"{label}{steps} steps")
        times = [j.step_seconds for j in alive if j.step_seconds is not None]
        if times:
            parts.append(f"step {_ms(max(times))}")
        waits = [j.data_wait_ratio for j in alive if j.data_wait_ratio is not None]
        if waits:
            parts.append(f"data wait {_pct(max(waits))}")
        rates = [j.samples_per_second for j in alive if j.samples_per_second is not None]
        if rates:
            parts.append(f"{_num(sum(rates))} samples/s")
        scales = [j.loss_scale for j in alive if j.loss_scale is not None]
        skipped = sum(j.skipped_steps_total for j in alive)
        if scales:
            parts.append(f"scale {min(scales):g}, {skipped} skipped")
        elif skipped:
            parts.append(f"{skipped} skipped")
        mem = [j.max_mem_allocated_bytes for j in alive if j.max_mem_allocated_bytes]
        if mem and not gpus:
            parts.append(f"peak alloc {max(mem) / GiB:.1f} GiB")
        dead = [j for j in jobs if not j.alive]
        if dead and len(jobs) > 1:
            parts.append(f"{len(dead)} exited")
    if bottleneck:
        parts.append(f"time: {bottleneck}")
    if advice:
        parts.append(f"advice: {advice}")
    return " | ".join(parts)


def summary_line(jobs: list[JobStats], exit_text: str) -> str:
    """The last line, after the job ended."""
    if not jobs:
        return f"gpuwatch: {exit_text}; no training steps were reported"
    steps = sum(j.steps_total for j in jobs)
    skipped = sum(j.skipped_steps_total for j in jobs)
    bits = [f"{steps} steps" + (f" ({skipped} skipped)" if skipped else "")]
    if len(jobs) > 1:
        bits.append(f"{len(jobs)} ranks")
    times = [j.step_seconds for j in jobs if j.step_seconds is not None]
    if times:
        bits.append(f"last step {_ms(max(times))}")
    waits = [j.data_wait_ratio for j in jobs if j.data_wait_ratio is not None]
    if waits:
        bits.append(f"data wait {_pct(max(waits))}")
    reasons = sorted({j.exit_reason for j in jobs if j.exit_reason and j.exit_reason != "exited"})
    if reasons:
        bits.append("ended: " + ", ".join(reasons))
    return f"gpuwatch: {exit_text}; " + ", ".join(bits)


class StatusLine:
    """Redraws the status line every ``interval`` seconds until ``stop()``."""

    def __init__(self, snapshot: Callable[[], Snapshot], jobs: Callable[[], list[JobStats]],
                 stream: TextIO, *, pid: int | None = None, interval: float = 2.0,
                 advice: Callable[[], Any] | None = None, tty: bool | None = None) -> None:
        self.snapshot = snapshot
        self.jobs = jobs
        self.stream = stream
        self.interval = interval
        self.advice = advice
        self.cpu = TreeCpu(pid) if pid is not None else None
        if tty is None:
            tty = stream.isatty() and os.environ.get("TERM", "") not in ("", "dumb")
        self.tty = tty
        self.lines_drawn = 0
        self._rows = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpuwatch-status", daemon=True)
        self._thread.start()

    def stop(self, last_line: str | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            if self.tty and self._rows:
                self._teardown()
            if last_line:
                self._write(last_line + "\n")

    def render(self) -> str:
        advice = bottleneck = None
        if self.advice is not None:
            try:
                report = self.advice()
                advice = _advice_text(report)
                bottleneck = bottleneck_text(report)
            except Exception:  # noqa: BLE001 - the status line goes on without advice
                advice = None
        cores = self.cpu.cores() if self.cpu is not None else None
        return format_status(self.snapshot(), self.jobs(), cores, advice, bottleneck)

    def draw(self) -> None:
        text = self.render()
        with self._lock:
            if self._stop.is_set() and self._thread is not None:
                return
            if self.tty:
                self._draw_tty(text)
            else:
                self._write(text + "\n")
            self.lines_drawn += 1

    def _run(self) -> None:
        if self.cpu is not None:
            self.cpu.cores()  # the first reading only sets the baseline
        while not self._stop.wait(self.interval):
            try:
                self.draw()
            except Exception:  # a status line must never take the job down
                log.debug("status line failed", exc_info=True)

    # -- the terminal ------------------------------------------------------------------------
    def _write(self, text: str) -> None:
        # one write() system call per update: a terminal applies it whole, never with the
        # job's output in the middle of an escape sequence
        try:
            self.stream.flush()
            fd = self.stream.fileno()
        except (OSError, ValueError, AttributeError):
            fd = None
        try:
            if fd is None:
                self.stream.write(text)
                self.stream.flush()
                return
            data = text.encode(getattr(self.stream, "encoding", None) or "utf-8", "replace")
            while data:
                data = data[os.write(fd, data):]
        except (OSError, ValueError):
            pass

    def _draw_tty(self, text: str) -> None:
        cols, rows = shutil.get_terminal_size((80, 24))
        if rows < 3:
            self._write("\r" + text[:cols - 1] + "\x1b[K\n")
            return
        out = []
        if rows != self._rows:
            # make room first, so shrinking the scroll region hides no line of the job's;
            # setting the region homes the cursor, so save and restore it around that
            out.append("\n\x1b7" f"\x1b[1;{rows - 1}r" "\x1b8\x1b[1A")
            self._rows = rows
        out.append(f"\x1b7\x1b[{rows};1H\x1b[7m{text[:cols - 1]}\x1b[0m\x1b[K\x1b8")
        self._write("".join(out))

    def _teardown(self) -> None:
        rows = self._rows
        self._write(f"\x1b7\x1b[r\x1b[{rows};1H\x1b[K\x1b8")
        self._rows = 0
