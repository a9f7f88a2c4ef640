"""The systemd service: the unit files as systemd reads them, and the notify protocol as
`gpuwatch run` speaks it to a notify socket of the test's own (a path and an abstract name).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import NVML_GPUS, REPO, daemon_env, http_get, parse_metrics, wait_for

from gpuwatch.samples import GpuSample, Health, Snapshot
from gpuwatch.serve.sdnotify import Notifier, SamplingProgress

SYSTEMD = REPO / "systemd"
UNIT = SYSTEMD / "gpuwatch.service"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")
INSTALLED = "/opt/gpuwatch/bin/gpuwatch"


def _unit() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


# -- the unit as systemd reads it ------------------------------------------------------

@needs_analyze
def test_unit_verifies_clean(tmp_path):
    proc = subprocess.run([ANALYZE, "verify", str(UNIT)], capture_output=True, text=True,
                          timeout=60, check=False)
    lines = [x for x in (proc.stdout + proc.stderr).splitlines() if x.strip()]
    if not os.path.exists(INSTALLED):
        # the one thing verify can't find on a machine where the service isn't installed
        lines = [x for x in lines if f"Command {INSTALLED} is not executable" not in x]
    assert lines == [], "\n".join(lines)
    # the same unit with an ExecStart that exists here: verify must pass outright
    copy = tmp_path / "gpuwatch.service"
    copy.write_text(UNIT.read_text().replace(INSTALLED, shutil.which("true") or "/bin/true"))
    proc = subprocess.run([ANALYZE, "verify", str(copy)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), \
        proc.stdout + proc.stderr


@needs_analyze
def test_unit_exposure_is_at_most_2_5():
    proc = subprocess.run([ANALYZE, "security", "--offline=yes", "--no-pager", str(UNIT)],
                          capture_output=True, text=True, timeout=60, check=False)
    text = proc.stdout + proc.stderr
    m = re.search(r"Overall exposure level for gpuwatch\.service: (\d+\.\d+)", text)
    assert m, text
    assert float(m.group(1)) <= 2.5, text


def test_unit_keeps_what_gpuwatch_reads():
    unit = _unit()
    assert unit["Type"] == ["notify"] and unit["Restart"] == ["on-failure"]
    assert unit["User"] == ["gpuwatch"] and unit["Group"] == ["gpuwatch"]
    assert unit["EnvironmentFile"] == ["-/etc/default/gpuwatch"]
    assert unit["ExecStart"][0].endswith("gpuwatch run $ARGS")
    assert "WatchdogSec" in unit
    # the NVIDIA device nodes stay reachable: an allow-list, not PrivateDevices
    assert unit["DevicePolicy"] == ["closed"] and "PrivateDevices" not in unit
    allowed = " ".join(unit["DeviceAllow"])
    for node in ("/dev/nvidiactl", "char-nvidia-frontend", "char-nvidia-uvm",
                 "char-nvidia-caps"):
        assert node in allowed
    # other users' processes stay visible in /proc (names, memory of their GPU jobs)
    assert unit.get("ProtectProc", ["default"]) == ["default"] and "ProcSubset" not in unit
    assert "PrivateUsers" not in unit  # would map every other user to nobody
    families = unit["RestrictAddressFamilies"][0].split()
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(families)  # notify + hook, HTTP
    # the hook socket's directory: the group may enter, nobody else
    assert unit["RuntimeDirectory"] == ["gpuwatch"] and unit["RuntimeDirectoryMode"] == ["0750"]


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="no systemd-sysusers")
def test_sysusers_and_tmpfiles_make_the_user_group_and_config_dir(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    for name in ("passwd", "group", "shadow", "gshadow"):
        (etc / name).touch()
    subprocess.run(["systemd-sysusers", f"--root={tmp_path}", str(SYSTEMD / "gpuwatch.sysusers")],
                   check=True, capture_output=True, timeout=60)
    passwd = (etc / "passwd").read_text()
    assert re.search(r"^gpuwatch:x:\d+:\d+:.*:/usr/sbin/nologin$", passwd, re.M), passwd
    assert re.search(r"^gpuwatch:x:\d+:", (etc / "group").read_text(), re.M)
    subprocess.run(["systemd-tmpfiles", f"--root={tmp_path}", "--create",
                    str(SYSTEMD / "gpuwatch.tmpfiles")], check=True, capture_output=True,
                   timeout=60)
    assert (etc / "gpuwatch").is_dir()


def test_shipped_defaults_and_config_are_accepted(tmp_path):
    from gpuwatch.serve.config import load_config

    args = re.search(r'^ARGS="(.*)"$', (SYSTEMD / "gpuwatch.default").read_text(), re.M)
    assert args and "/etc/gpuwatch/gpuwatch.yaml" in args.group(1)
    config = load_config(str(SYSTEMD / "gpuwatch.yaml"))
    # every interface, as node_exporter and dcgm-exporter: Prometheus scrapes it from its own
    # host (README; docs/security.md says what that exposes and how TLS closes it;
    # tests/test_install.py scrapes it so)
    assert config.listen_address == ":9442"


# -- the notify protocol --------------------------------------------------------------

class NotifySocket:
    """A datagram socket standing in for systemd's: collects what the daemon says."""

    def __init__(self, tmp_path: Path, abstract: bool) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = f"gpuwatch-test-{uuid.uuid4().hex}"
            self.sock.bind("\0" + name)
            self.env = "@" + name
        else:
            path = str(tmp_path / "notify.sock")
            self.sock.bind(path)
            self.env = path
        self.messages: list[tuple[float, str]] = []

    def drain(self, seconds: float) -> list[str]:
        """Everything received in the next ``seconds``."""
        got = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                break
            text = data.decode()
            self.messages.append((time.monotonic(), text))
            got.append(text)
        return got

    def wait_for(self, field: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for msg in self.drain(min(0.5, deadline - time.monotonic())):
                if field in msg.split("\n"):
                    return msg
        raise AssertionError(f"no {field} within {timeout} s; got {self.messages}")

    def close(self) -> None:
        self.sock.close()


def _start(tmp_path: Path, notify: NotifySocket, *args: str, watchdog_usec: int | None,
           watchdog_pid: str = "self", script: list[str] | None = None) -> subprocess.Popen:
    env = daemon_env(tmp_path)
    env["NOTIFY_SOCKET"] = notify.env
    if watchdog_usec is not None:
        env["WATCHDOG_USEC"] = str(watchdog_usec)
    cmd = [*(script or [sys.executable, "-m", "gpuwatch", "run"]),
           "--web.listen-address", "127.0.0.1:0", *args]
    if watchdog_pid == "self":
        # systemd sets WATCHDOG_PID to the main pid; exec keeps the shell's pid for python
        cmd = ["sh", "-c", 'WATCHDOG_PID=$$ exec "$@"', "sh", *cmd]
    elif watchdog_pid:
        env["WATCHDOG_PID"] = watchdog_pid
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"gpuwatch did not stop on SIGTERM:\n{err}") from None
    return err


def _pings(messages: list[str]) -> int:
    return sum(1 for m in messages if "WATCHDOG=1" in m.split("\n"))


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_ready_watchdog_and_stopping(tmp_path, abstract):
    notify = NotifySocket(tmp_path, abstract)
    proc = _start(tmp_path, notify, "--interval", "0.2", watchdog_usec=1_000_000)
    try:
        ready = notify.wait_for("READY=1")
        url = re.search(r"STATUS=serving (http://\S+)/metrics", ready)
        assert url, ready
        # READY means it serves: the first request succeeds
        assert http_get(url.group(1) + "/healthz")[0] == 200
        # WatchdogSec=1s: a ping at least every 0.5 s
        assert _pings(notify.drain(2.6)) >= 4
    finally:
        err = _stop(proc)
    notify.wait_for("STOPPING=1", timeout=5)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    notify.close()


def test_no_watchdog_pings_when_watchdog_pid_is_another_process(tmp_path):
    notify = NotifySocket(tmp_path, abstract=False)
    proc = _start(tmp_path, notify, "--interval", "0.2", watchdog_usec=500_000,
                  watchdog_pid=str(os.getpid()))
    try:
        notify.wait_for("READY=1")
        assert _pings(notify.drain(1.5)) == 0
    finally:
        _stop(proc)
    notify.close()


def test_watchdog_survives_one_hung_gpu_and_stops_when_the_loop_gets_nowhere(tmp_path):
    """Stubbed NVML (tests/scripts/stub_daemon.py): a hung call on one GPU costs its
    fields only, pings go on; every GPU hung, and pings stop so systemd would restart it."""
    notify = NotifySocket(tmp_path, abstract=True)
    script = [sys.executable, str(REPO / "tests" / "scripts" / "stub_daemon.py")]
    proc = _start(tmp_path, notify, "--interval", "0.2", watchdog_usec=1_000_000,
                  script=script)
    try:
        ready = notify.wait_for("READY=1")
        url = re.search(r"STATUS=serving (http://\S+)/metrics", ready).group(1)
        assert _pings(notify.drain(1.5)) >= 2

        proc.send_signal(signal.SIGUSR1)  # GPU 0's reads hang

        def stalled(gpu: int) -> float:
            m = parse_metrics(http_get(url + "/metrics")[2])
            return m.get(("gpuwatch_errors_total",
                          frozenset({("source", f"gpu{gpu}_stalled")})), 0.0)

        wait_for(lambda: stalled(0) >= 3, "GPU 0 to count as stalled", 20, proc)
        assert _pings(notify.drain(3.0)) >= 4  # the watchdog goes on ...
        m = parse_metrics(http_get(url + "/metrics")[2])
        # ... and GPU 1 is still sampled while GPU 0 hangs
        assert stalled(1) == 0
        util = {dict(labels)["gpu"]: v for (name, labels), v in m.items()
                if name == "gpuwatch_gpu_utilization_ratio"}
        assert util.get("1") == 0.75 and "0" not in util

        proc.send_signal(signal.SIGUSR2)  # every GPU's reads hang
        wait_for(lambda: stalled(1) >= 3, "GPU 1 to count as stalled", 20, proc)
        notify.drain(2.0)  # the progress window (3 ticks + 1 s) runs out
        assert _pings(notify.drain(3.0)) == 0
        assert proc.poll() is None  # it still runs and serves; systemd does the restart
        assert http_get(url + "/healthz")[0] in (200, 503)
    finally:
        err = _stop(proc)
    assert "no more watchdog pings" in err
    notify.close()


# -- the protocol's parts, without a daemon -----------------------------------------

def test_notifier_reads_and_unsets_its_environment():
    env = {"NOTIFY_SOCKET": "@abc", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "42", "X": "1"}
    n = Notifier.from_environ(env, pid=42)
    assert n.address == b"\0abc" and n.watchdog_timeout == 2.0
    assert env == {"X": "1"}  # a child of the daemon never speaks for it
    assert Notifier.from_environ({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "1000",
                                  "WATCHDOG_PID": "7"}, pid=8).watchdog_timeout is None
    assert Notifier.from_environ({"WATCHDOG_USEC": "nonsense"}, pid=1).watchdog_timeout is None
    off = Notifier.from_environ({}, pid=1)
    assert not off.enabled and off.notify("READY=1") is False
    bad = Notifier.from_environ({"NOTIFY_SOCKET": "relative/path"}, pid=1)
    assert not bad.enabled


def test_notifier_to_a_vanished_socket_fails_soft(tmp_path, caplog):
    n = Notifier(str(tmp_path / "nobody-listens.sock"))
    assert n.notify("READY=1") is False and n.notify("WATCHDOG=1") is False
    assert len([r for r in caplog.records if "cannot notify" in r.getMessage()]) == 1


def test_sampling_progress_counts_stalls_per_gpu():
    now = [0.0]
    snaps: list[Snapshot] = []

    def snap(t: float, ticks: int, stalled: dict[int, int], lost: tuple[int, ...] = ()
             ) -> Snapshot:
        return Snapshot(t=t, gpus=tuple(GpuSample(t=t, gpu=i, lost=i in lost) for i in (0, 1)),
                        health=Health(ticks_total=ticks, errors_total={
                            f"gpu{i}_stalled": n for i, n in stalled.items()}))

    progress = SamplingProgress(lambda: snaps[-1], interval=1.0, clock=lambda: now[0])
    tick = 0
    stalled = {0: 0, 1: 0}

    def advance(stall: tuple[int, ...], ticks: int = 1, lost: tuple[int, ...] = ()) -> bool:
        nonlocal tick
        for _ in range(ticks):
            tick += 1
            now[0] += 1.0
            for i in stall:
                stalled[i] += 1
            snaps.append(snap(100.0 + tick, tick, dict(stalled), lost))
        return progress.check()

    assert advance(()) and advance(())
    assert all(advance((0,)) for _ in range(10))  # one GPU stuck: still progress
    assert advance((0, 1), ticks=2)  # both stuck, within the window
    assert not advance((0, 1), ticks=3)  # both stuck for longer: no progress
    assert advance((0,))  # GPU 1 came back
    assert advance((), lost=(0, 1))  # no live GPU: ticks alone are progress
    now[0] += 10  # no new tick at all
    assert not progress.check()


@pytest.mark.gpu
def test_nvml_works_under_the_units_memory_deny_write_execute(tmp_path):
    """MemoryDenyWriteExecute=true (the unit's) as the kernel's PR_SET_MDWE: the real
    NVML library still loads and every GPU is sampled. Needs Linux 6.3+ and a GPU."""
    code = ("import ctypes, sys\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "if libc.prctl(65, 1, 0, 0, 0) != 0: sys.exit(77)\n"  # PR_SET_MDWE, refuse W+X
            "from gpuwatch.cli import main\n"
            "sys.exit(main(['run', '--web.listen-address', '127.0.0.1:0', '--interval', '0.5']))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=daemon_env(tmp_path),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []

    def pump() -> None:
        assert proc.stderr is not None
        lines.extend(proc.stderr)

    threading.Thread(target=pump, daemon=True).start()
    try:
        if proc.poll() == 77:
            pytest.skip("this kernel has no PR_SET_MDWE")
        url = wait_for(lambda: (m := re.search(r"serving (http://\S+)/metrics", "".join(lines)))
                       and m.group(1), "the serving line", 60, proc)

        def gpus() -> set[str]:
            m = parse_metrics(http_get(url + "/metrics")[2])
            return {dict(labels)["gpu"] for (name, labels), _ in m.items()
                    if name == "gpuwatch_gpu_utilization_ratio"}

        wait_for(lambda: len(gpus()) == NVML_GPUS, "every GPU sampled under MDWE", 60, proc)
    finally:
        err = _stop(proc)
    assert "Traceback" not in err
