"""The daemon hands the C heap's free pages back to the kernel (daemon.HeapTrimmer): what
start-up and the turning windows freed does not stay in its RSS."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import wait_for
from nvml_stub import NvmlStub, StubGpu

from gpuwatch import daemon as daemon_mod
from gpuwatch.daemon import Daemon, HeapTrimmer
from gpuwatch.serve.config import Config

pytestmark = pytest.mark.skipif(not HeapTrimmer().available,
                                reason="the C library has no malloc_trim (not glibc)")
MIB = 2**20


def test_a_trim_gives_back_the_pages_freed_between_live_blocks():
    """40 MB of 1 kB blocks (malloc's own heap, not Python's arenas), one in 64 kept: the
    heap cannot shrink from its top, and glibc keeps the freed pages until a trim."""
    trimmer = HeapTrimmer()
    blocks = [bytes(1000) for _ in range(40_000)]
    kept = blocks[::64]
    del blocks
    before = daemon_mod._rss_bytes()
    released = trimmer.trim()
    after = daemon_mod._rss_bytes()
    assert released is not None and released > 20 * MIB, (before, after)
    assert after is not None and before is not None and after < before - 20 * MIB
    assert trimmer.trims == 1 and trimmer.released_bytes == released
    assert len(kept) == 625  # what stayed live is intact
    assert all(b == bytes(1000) for b in kept)


def test_the_trimmer_runs_on_its_thread_until_stopped():
    trimmer = HeapTrimmer(first=0.05, every=0.05)
    trimmer.start()
    try:
        wait_for(lambda: trimmer.trims >= 3, "three trims", 10)
        (thread,) = [t for t in threading.enumerate() if t.name == "gpuwatch-heap-trim"]
    finally:
        trimmer.stop()
    assert not thread.is_alive()
    count = trimmer.trims
    time.sleep(0.2)
    assert trimmer.trims == count  # none after stop


def test_a_daemon_trims_after_it_started_and_stops_its_trimmer(tmp_path, monkeypatch):
    """The daemon (sampling two stub GPUs, its advisor and HTTP server running) trims its
    heap once start-up is behind it, and its stop ends the trimmer with the rest."""
    monkeypatch.setattr(daemon_mod, "TRIM_FIRST_SECONDS", 0.5)
    cfg = Config(listen_address="127.0.0.1:0", interval=0.1, slow_interval=0.5,
                 hook_socket=str(tmp_path / "hook.sock"))
    d = Daemon(cfg, sampler_kwargs={"nvml_module": NvmlStub([StubGpu(0), StubGpu(1)])})
    d.start()
    try:
        wait_for(lambda: d.trimmer.trims >= 1, "the first trim", 10)
        assert d.trimmer.released_bytes >= 0
        assert any(t.name == "gpuwatch-heap-trim" for t in threading.enumerate())
    finally:
        d.stop()
    assert not any(t.name == "gpuwatch-heap-trim" for t in threading.enumerate())


def test_without_malloc_trim_the_trimmer_does_nothing(monkeypatch):
    monkeypatch.setattr(daemon_mod, "_malloc_trim", lambda: None)
    trimmer = HeapTrimmer(first=0.01)
    assert not trimmer.available and trimmer.trim() is None
    trimmer.start()  # starts no thread
    assert not any(t.name == "gpuwatch-heap-trim" for t in threading.enumerate())
    trimmer.stop()
