"""Recording: every sample the store sees, written as a ``gpuwatch-trace/1`` file.

``Recorder`` subscribes to a Store and writes on a thread of its own, so a slow disk never
stalls a tick (the store's listeners must not block). Samples from different sources reach
the store slightly out of time order (a step datagram from the hook can land after the tick
that followed its end), while a trace must be in time order; so lines wait in a small
reorder buffer, ``reorder_seconds`` of recorded time, and leave it sorted. A sample later
than that is still written, with its ``t`` raised to the last written one (counted in
``late_samples``), rather than lost. ``stop()`` writes out everything held.

``gpuwatch record FILE`` (``main``) samples like ``gpuwatch run`` (the daemon without its
HTTP server, with the hook receiver so training steps are recorded too) and writes until
SIGINT/SIGTERM or ``--duration``, leaving a complete file. On a host without a GPU it
records host lines only, and the meta line has no ``gpu_name``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import queue
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpuwatch import logs, threads
from gpuwatch.errors import file_error, file_problem
from gpuwatch.samples import TRACE_FORMAT, Sample
from gpuwatch.store import Store
from gpuwatch.trace.format import TraceWriter

log = logging.getLogger(__name__)

_STOP = object()
MAX_HELD = 10_000  # samples in the reorder buffer at most
# samples waiting for the writer at most: a writer stuck on a full pipe nobody reads must
# not grow memory without bound (samples beyond are dropped and counted)
MAX_QUEUED = 100_000
STOP_TIMEOUT = 5.0  # seconds stop() waits for the writer to write out what it holds


class Recorder:
    """Writes every sample published into ``store`` to ``path`` ('-' for stdout)."""

    def __init__(self, store: Store, path: str, meta: Mapping[str, Any], *,
                 reorder_seconds: float = 2.0) -> None:
        self.store = store
        self.path = path
        # whatever the caller built, the first line is a valid meta line of our format
        self.meta: dict[str, Any] = {"kind": "meta", "format": TRACE_FORMAT}
        self.meta.update((k, v) for k, v in meta.items()
                         if k not in ("kind", "format") and v is not None)
        self.reorder_seconds = reorder_seconds
        self.samples_written = 0
        self.late_samples = 0
        self.bad_samples = 0  # samples that could not be written (e.g. a non-finite value)
        self.failed: str | None = None  # why recording stopped early (a write error)
        self.broken_pipe = False  # the reader of the output went away (`record - | head`)
        self.unfinished = False  # stop() gave up waiting for the writer (a stuck pipe)
        self.dropped_samples = 0  # not written: the writer was too far behind
        self._dropping = False
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._writer: TraceWriter | None = None
        self._thread: threading.Thread | None = None
        self._heap: list[tuple[float, int, Sample]] = []
        self._seq = itertools.count()
        self._newest = float("-inf")
        self._last_written = float("-inf")

    def start(self) -> None:
        """Open the file (a UserError if it can't be) and start recording."""
        if self._thread is not None:
            return
        try:
            self._writer = TraceWriter(self.path, self.meta)
        except OSError as err:  # opened, but the meta line could not be written (disk full)
            raise file_error("write", "trace", self.path, err) from err
        self._thread = threads.Thread(target=self._run, name="gpuwatch-recorder", daemon=True)
        self._thread.start()
        self.store.subscribe(self._offer)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Write out everything received so far and close the file.

        Waits at most ``timeout`` seconds: a writer blocked on a pipe nobody reads is left
        behind (``unfinished``), and the caller goes on."""
        if self._thread is None:
            return
        # what the jobs' open intervals summed so far belongs in the file
        self.store.flush_steps()
        self.store.unsubscribe(self._offer)
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.unfinished = True
            log.error("the recording to %s could not be finished within %g s (is anything "
                      "reading it?); giving up", self.path, timeout)
        self._thread = None

    def _offer(self, sample: Sample) -> None:
        backlog = self._queue.qsize()
        if backlog >= MAX_QUEUED:
            self.dropped_samples += 1
            if not self._dropping:  # once per time it falls behind, not per sample
                self._dropping = True
                self.store.count_error("recorder")
                if self.dropped_samples == 1:
                    log.warning("the recording to %s is %d samples behind; dropping samples "
                                "until it catches up (counted in gpuwatch_errors_total"
                                "{source=\"recorder\"})", self.path, MAX_QUEUED)
            return
        if self._dropping and backlog < MAX_QUEUED // 2:
            self._dropping = False
        self._queue.put(sample)

    # -- the writer thread ---------------------------------------------------------------------
    def _run(self) -> None:
        assert self._writer is not None
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    self._release(float("inf"))
                    break
                self._hold(item)
                self._release(self._newest - self.reorder_seconds)
                # a sample stamped far in the future (a hook's clock) must not hold back
                # everything after it: the buffer stays small whatever the times say
                while len(self._heap) > MAX_HELD:
                    self._release(self._heap[0][0])
        except BrokenPipeError:
            # the reader went away (`gpuwatch record - | head`): the end, not an error
            self.broken_pipe = True
            self.failed = f"the reader of {self.path} went away; recording stopped"
            log.debug("recording stopped: broken pipe")
            if self.path == "-":
                _silence_stdout()
        except OSError as err:
            # what was written stays a readable trace (a cut last line is skipped on
            # replay); say where it ends, so a reader knows what is missing
            lines = self._writer.lines_written
            end = (f"; the recording ends at line {lines} (t={self._last_written:.3f})"
                   if self._last_written > float("-inf") else "")
            self.failed = file_problem("write", "trace", self.path, err) + end
            self.store.count_error("recorder")
            log.error("recording stopped: %s; the daemon goes on without it", self.failed)
        except Exception as err:  # noqa: BLE001 - say so, rather than die silently
            self.failed = f"recording {self.path} failed: {err!r}"
            self.store.count_error("recorder")
            log.exception("recording stopped")
        finally:
            # nobody reads the queue any more: stop filling it
            self.store.unsubscribe(self._offer)
            try:
                self._writer.close()
            except BrokenPipeError:
                self.broken_pipe = True
                if self.path == "-":
                    _silence_stdout()
            except OSError as err:
                log.error("closing %s failed: %s", self.path, err)

    def _hold(self, sample: Sample) -> None:
        heapq.heappush(self._heap, (sample.t, next(self._seq), sample))
        self._newest = max(self._newest, sample.t)

    def _release(self, until: float) -> None:
        assert self._writer is not None
        while self._heap and self._heap[0][0] <= until:
            t, _seq, sample = heapq.heappop(self._heap)
            if t < self._last_written:
                self.late_samples += 1
                if self.late_samples == 1:
                    log.warning("a %s sample arrived %.1f s late for the trace's time order; "
                                "written with its time raised (more are counted, not logged)",
                                type(sample).__name__, self._last_written - t)
                sample = replace(sample, t=self._last_written)
            try:
                self._writer.write(sample)
            except (ValueError, TypeError) as err:  # a sample JSON can't hold costs only itself
                self.bad_samples += 1
                logs.once(log, "recorder-bad-sample", logging.WARNING,
                          "a %s sample cannot be recorded (%s); skipped (more are not logged)",
                          type(sample).__name__, err)
                continue
            self._last_written = sample.t
            self.samples_written += 1


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null: what is still buffered for a reader that went away must not
    raise again when the interpreter flushes stdout at exit."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    os.dup2(null, 1)
    os.close(null)
