"""Who may report to the hook socket, and what the daemon publishes about other people's
processes: socket permissions tested with real uids, names and users through a real
daemon's /metrics and /api/snapshot."""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, daemon_env, http_get, parse_metrics, wait_for

from gpuwatch.job.receiver import HookReceiver
from gpuwatch.store import Store

NOBODY = 65534
is_root = os.geteuid() == 0


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory everyone may traverse (pytest's tmp_path is private to us)."""
    d = Path(tempfile.mkdtemp(prefix="gpuwatch-sec-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _other_group() -> grp.struct_group | None:
    """A real group other than our primary one that we may give a file to."""
    if is_root:
        for g in grp.getgrall():
            if g.gr_gid not in (0, os.getgid()) and g.gr_gid != NOBODY:
                return g
        return None
    for gid in os.getgroups():
        if gid != os.getgid():
            return grp.getgrgid(gid)
    return None


def _send_as(path: Path, uid: int, gids: list[int]) -> str:
    """Send a datagram to ``path`` from a child process running as ``uid`` in ``gids``."""
    pid = os.fork()
    if pid == 0:  # the child: only syscalls, then _exit
        code = 3
        try:
            os.setgroups(gids)
            os.setgid(gids[0])
            os.setuid(uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                s.sendto(b"{}", str(path))
                code = 0
            except PermissionError:
                code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return {0: "sent", 1: "denied"}.get(os.waitstatus_to_exitcode(status), "failed")


def test_socket_in_an_existing_group_is_0660_in_that_group(open_dir):
    group = _other_group()
    if group is None:
        pytest.skip("no second group to give the socket to")
    path = open_dir / "hook.sock"
    rec = HookReceiver(Store(), str(path), group=group.gr_name)
    rec.start()
    try:
        st = os.stat(path)
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == group.gr_gid
        if is_root:  # real uids: a member of the group sends, anyone else is refused
            assert _send_as(path, NOBODY, [group.gr_gid]) == "sent"
            assert _send_as(path, NOBODY, [NOBODY]) == "denied"
    finally:
        rec.stop()


def test_socket_without_the_group_is_private_to_its_owner(open_dir):
    path = open_dir / "hook.sock"
    rec = HookReceiver(Store(), str(path), group="gpuwatch-no-such-group")
    rec.start()
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        if is_root:
            # even someone sharing our primary group may not report
            assert _send_as(path, NOBODY, [os.getgid()]) == "denied"
    finally:
        rec.stop()


# -- what is published about processes -------------------------------------------------

SECRET = "--api-token=SECRET-TOKEN-8e1f"


def _stub_daemon(tmp_path: Path, pids: list[int], config: str | None = None
                 ) -> tuple[subprocess.Popen, str, list[str]]:
    args = ["--web.listen-address", "127.0.0.1:0", "--interval", "0.2"]
    if config is not None:
        cfg = tmp_path / "gpuwatch.yml"
        cfg.write_text(config)
        args += ["--config.file", str(cfg)]
    env = daemon_env(tmp_path)
    env["STUB_GPU_PIDS"] = ",".join(map(str, pids))
    proc = subprocess.Popen([sys.executable, str(REPO / "tests/scripts/stub_daemon.py"), *args],
                            cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    url = wait_for(lambda: (m := re.search(r"serving (http://\S+)/metrics", "".join(lines)))
                   and m.group(1), "the serving line", 60, proc)
    return proc, url, lines


def _published(url: str, pid: int) -> tuple[str, dict, dict]:
    """(/metrics text, the process's labels, its /api/snapshot entry) once it shows."""
    def ready():
        text = http_get(url + "/metrics")[2]
        for (name, labels), _ in parse_metrics(text).items():
            if name == "gpuwatch_process_gpu_memory_used_bytes" and ("pid", str(pid)) in labels:
                return text, dict(labels)
        return None

    text, labels = wait_for(ready, f"pid {pid} in /metrics", 30)
    snap = json.loads(http_get(url + "/api/snapshot")[2])
    entry = next(p for g in snap["gpus"] for p in g["processes"] if p["pid"] == pid)
    return text + json.dumps(snap), labels, entry


@pytest.fixture
def job() -> Iterator[subprocess.Popen]:
    """Someone's job with a secret on its command line."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", SECRET])
    yield proc
    proc.kill()
    proc.wait()


def test_names_and_users_published_command_lines_never(tmp_path, job):
    daemon, url, lines = _stub_daemon(tmp_path, [job.pid])
    try:
        everything, labels, entry = _published(url, job.pid)
        assert labels["name"].startswith("python") and labels["user"]
        assert entry["name"] == labels["name"] and entry["user"] == labels["user"]
        assert "SECRET-TOKEN" not in everything
        assert "cmdline" not in everything
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)


def test_privacy_switch_drops_names_and_users(tmp_path, job):
    daemon, url, lines = _stub_daemon(tmp_path, [job.pid], config=(
        "privacy:\n  export_process_names: false\n  export_users: false\n"))
    try:
        everything, labels, entry = _published(url, job.pid)
        # the series stays (pid, memory), the identities go
        assert labels["name"] == "" and labels["user"] == ""
        assert entry["name"] is None and entry["user"] is None
        assert "python" not in everything and "SECRET-TOKEN" not in everything
        user = pwd.getpwuid(os.getuid()).pw_name
        assert f'user="{user}"' not in everything
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)


@pytest.mark.parametrize(("text", "expected"), [
    ("privacy: yes\n", "privacy: expected a mapping"),
    ("privacy:\n  export_users: nope\n", "export_users: expected true or false"),
    ("privacy:\n  hide_everything: true\n", "unknown key 'hide_everything'"),
])
def test_bad_privacy_settings_name_the_line(tmp_path, text, expected):
    from gpuwatch.errors import FileFormatError
    from gpuwatch.serve.config import load_config

    cfg = tmp_path / "gpuwatch.yml"
    cfg.write_text(text)
    with pytest.raises(FileFormatError) as err:
        load_config(str(cfg))
    assert f"{cfg}:1:" in str(err.value) and expected in str(err.value)
