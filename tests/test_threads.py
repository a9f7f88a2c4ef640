"""The daemon's threads carry their names into the kernel (gpuwatch/threads.py), where
``top -H``, ``ps -L`` and benchmarks/bench_tick.py's split of the daemon's CPU read them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from gpuwatch import threads
from tests.conftest import REPO, DaemonProcess, daemon_env, wait_for


def kernel_names(pid: int) -> list[str]:
    names = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            names.append(Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip())
        except OSError:
            pass  # a thread that ended meanwhile
    return names


def test_the_kernel_name_is_the_threads_within_its_15_bytes() -> None:
    assert threads.os_name("gpuwatch-gpu-reader") == "gw-gpu-reader"
    assert threads.os_name("gpuwatch-gpu12-slow") == "gw-gpu12-slow"
    assert threads.os_name("gpuwatch-hook-receiver") == "gw-hook-receive"  # cut at 15 bytes
    assert threads.os_name("elsewhere") == "elsewhere"
    # 15 bytes, never half a character: é's second byte would be the 16th
    assert threads.os_name("gpuwatch-é" + "gpuwatch-é") == "gw-égpuwatch-"


def test_a_thread_names_itself_and_runs_its_target() -> None:
    seen: dict[str, object] = {}

    def target(x: int) -> None:
        seen["arg"] = x
        seen["comm"] = Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text()

    t = threads.Thread(target=target, args=(7,), name="gpuwatch-test-thread", daemon=True)
    t.start()
    t.join(10)
    assert seen == {"arg": 7, "comm": "gw-test-thread\n"}
    assert t.name == "gpuwatch-test-thread"  # Python's own name is left as it was


def test_the_daemons_threads_are_named_in_the_kernel(tmp_path: Path) -> None:
    env = dict(daemon_env(tmp_path), STUB_GPUS="2")
    proc = subprocess.Popen([sys.executable, str(REPO / "tests/scripts/stub_daemon.py"),
                             "--web.listen-address", "127.0.0.1:0"],
                            cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    daemon = DaemonProcess(proc)
    threading.Thread(target=lambda: daemon.lines.extend(proc.stderr or ()), daemon=True).start()
    try:
        want = {"gw-gpu-reader", "gw-gpu0-slow", "gw-gpu1-slow", "gw-sampler",
                "gw-http", "gw-http-janitor", "gw-hook-receive", "gw-advisor",
                "gw-heap-trim"}
        names = wait_for(lambda: (n := set(kernel_names(proc.pid))) >= want and n,
                         "every daemon thread named in /proc", 30, proc)
        # the main thread keeps the process's own name; nothing else is left unnamed
        unnamed = [n for n in kernel_names(proc.pid) if not n.startswith("gw-")]
        assert len(unnamed) == 1, (unnamed, names)
    finally:
        assert daemon.stop() == 0, daemon.stderr()


def test_periodic_calls_after_first_then_every_until_stopped_or_told() -> None:
    calls: list[float] = []
    start = time.monotonic()

    def tick() -> bool:
        calls.append(time.monotonic() - start)
        return len(calls) < 4  # False at the fourth call: no fifth

    loop = threads.Periodic(tick, 0.05, "gpuwatch-test-periodic", first=0.2)
    loop.start()
    wait_for(lambda: len(calls) == 4 and not any(
        t.name == "gpuwatch-test-periodic" for t in threading.enumerate()),
        "four calls, then the thread's end", 10)
    assert calls[0] >= 0.19  # the first call waited for `first`
    time.sleep(0.2)
    assert len(calls) == 4
    loop.stop()  # after its own end: nothing to wait for
    assert not loop.running

    stopped = threads.Periodic(lambda: calls.append(-1.0), 0.02, "gpuwatch-test-periodic")
    stopped.start()
    assert stopped.running
    stopped.stop()
    count = len(calls)
    time.sleep(0.1)
    assert len(calls) == count and not stopped.running
