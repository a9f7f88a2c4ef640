"""``gpuwatch run -- CMD``: exit codes, signals passed on, the status line, a port in use.

All through the real command line in a subprocess; the terminal tests use a real pseudo
terminal (``pty``), as a user's shell would give the command.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import clean_env, wait_for

from gpuwatch.job.receiver import HookReceiver
from gpuwatch.store import Store

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "tests" / "scripts" / "train_cpu.py")
RUN = [sys.executable, "-m", "gpuwatch", "run"]




@pytest.fixture
def system() -> Iterator[tuple[Store, HookReceiver, dict[str, str]]]:
    """A receiver playing the host's gpuwatch service, so a test sees the job's reports."""
    d = Path(f"/tmp/gwl-{os.getpid()}-{time.monotonic_ns()}")
    d.mkdir()
    store = Store()
    rec = HookReceiver(store, str(d / "hook.sock"))
    rec.start()
    yield store, rec, clean_env(GPUWATCH_SYSTEM_SOCKET=rec.socket_path)
    rec.stop()
    d.rmdir()


def run_quiet(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run([*RUN, "--quiet", "--", *command], check=False, env=clean_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("script", "code"), [
    ("exit 0", 0), ("exit 3", 3), ("kill -KILL $$", -9), ("kill -TERM $$", -15),
    ("kill -QUIT $$", -3),
])
def test_exit_code_is_the_jobs(script: str, code: int) -> None:
    # a job killed by signal N kills the launcher by signal N (subprocess: -N), as `env` and
    # `timeout` do: a shell sees 128 + N and knows a signal ended it
    assert run_quiet("sh", "-c", script).returncode == code


def test_a_shell_sees_128_plus_n_and_no_core_file(tmp_path: Path) -> None:
    quoted = " ".join(f"'{a}'" for a in RUN)
    # the job itself leaves no core (ulimit -c 0); the launcher may, unless it sees to it
    run = subprocess.run(["sh", "-c", f"ulimit -c unlimited; {quoted} --quiet -- sh -c "
                          "'ulimit -c 0; kill -QUIT $$'; echo status=$?"], check=False,
                         env=clean_env(), cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert "status=131" in run.stdout, run.stderr
    assert not list(tmp_path.glob("core*"))


def test_a_script_without_a_shebang_runs_with_sh(tmp_path: Path) -> None:
    script = tmp_path / "job"
    script.write_text('echo "ran with $# args: $1"\nexit 4\n')
    script.chmod(0o755)
    run = run_quiet(str(script), "first")
    assert run.returncode == 4, run.stderr
    assert run.stdout == "ran with 1 args: first\n"
    with_path = subprocess.run([*RUN, "--quiet", "--", "job"], check=False, cwd=REPO,
                               env=clean_env(PATH=f"{tmp_path}:{os.environ['PATH']}"),
                               capture_output=True, text=True, timeout=120)
    assert with_path.returncode == 4 and with_path.stdout == "ran with 0 args: \n"


def test_missing_command_exits_127() -> None:
    run = run_quiet("no-such-command-gpuwatch-test")
    assert run.returncode == 127
    assert "command not found: no-such-command-gpuwatch-test" in run.stderr


def _start_training(env: dict[str, str], *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*RUN, "--quiet", "--", sys.executable, TRAIN, "--steps", "100000",
                             "--workers", "1", "--step-ms", "20", *extra],
                            env=env, cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize(("sig", "code", "reason"), [
    (signal.SIGTERM, -signal.SIGTERM, "vanished"),
    (signal.SIGINT, -signal.SIGINT, "interrupted"),
])
def test_signals_to_the_launcher_reach_the_job(system, sig: int, code: int, reason: str) -> None:
    store, rec, env = system
    launcher = _start_training(env)
    try:
        wait_for(lambda: store.latest().jobs, "the job's first report")
        launcher.send_signal(sig)
        _, err = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
        launcher.wait()
    assert launcher.returncode == code, err
    rec.flush()
    rec.reap()
    [job] = store.latest().jobs
    assert not job.alive and job.exit_reason == reason


def test_a_signal_is_passed_on_exactly_once(system, tmp_path: Path) -> None:
    store, _, env = system
    count = tmp_path / "sigints"
    launcher = _start_training(env, "--count-sigint", str(count))
    # a step, not the first report (that comes with the optimizer, before the job's handler)
    wait_for(lambda: any(j.steps_total for j in store.latest().jobs), "the job's first step")
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 0, err  # the job handled it and finished cleanly
    assert count.read_text() == "1"


class Terminal:
    """A command on a pseudo terminal of 24 rows and 160 columns, as its controlling tty."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the pty is its controlling terminal
            os.chdir(REPO)
            os.execvpe(argv[0], argv, env)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))
        self.output = b""

    def read_until(self, cond: Callable[[bytes], bool], deadline: float = 60.0) -> None:
        end = time.monotonic() + deadline
        while not cond(self.output) and time.monotonic() < end:
            if not self._read(0.1):
                break

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            try:
                data = os.read(self.fd, 65536)
            except OSError as err:  # EIO: every process holding the pty has exited
                if err.errno == errno.EIO:
                    return False
                raise
            if not data:
                return False
            self.output += data
        return True

    def finish(self) -> int:
        while self._read(0.5):
            pass
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        return os.waitstatus_to_exitcode(status)


def test_status_line_on_a_terminal_keeps_the_jobs_output_whole() -> None:
    env = clean_env(GPUWATCH_STATUS_INTERVAL="0.2", TERM="xterm")
    term = Terminal([*RUN, "--web.listen-address", "127.0.0.1:0", "--", sys.executable, TRAIN,
                     "--steps", "150", "--workers", "1", "--step-ms", "15", "--scaler", "plain",
                     "--inf-every", "10", "--print-every", "5"], env)
    code = term.finish()
    out = term.output.decode(errors="replace")
    assert code == 0, out
    # on by default on a terminal: drawn on the bottom row, outside the scroll region
    assert "\x1b[1;23r" in out
    bottom = re.findall(r"\x1b7\x1b\[24;1H\x1b\[7m(.*?)\x1b\[0m\x1b\[K\x1b8", out)
    print(f"{len(bottom)} status redraws; the last: {bottom[-1] if bottom else None}")
    live = [b for b in bottom if "steps" in b and "step " in b]
    assert live, bottom
    assert all(b.startswith("gpuwatch | CPU ") for b in bottom)
    assert any("samples/s" in b and "data wait" in b and "skipped" in b for b in live)
    # every line the job printed shows whole. A redraw may land between the job's text and
    # its newline (an unbuffered print() is two writes, and PYTHONUNBUFFERED or torchrun's
    # `python -u` are common), but each redraw restores the cursor where it found it, so
    # on screen it is invisible: take the redraws out, and the job's lines must remain
    shown = re.sub(r"\x1b7\x1b\[24;1H.*?\x1b8", "", out)
    printed = re.findall(r"train step (\d+) loss \d+\.\d+ done\r\n", shown)
    assert [int(n) for n in printed] == list(range(0, 150, 5)), out
    # at the end the scroll region is reset and the summary follows
    assert "\x1b[r" in out
    assert re.search(r"gpuwatch: job exited with code 0; 150 steps \(15 skipped\)", out)


def test_ctrl_c_on_a_terminal_reaches_the_job_once(tmp_path: Path) -> None:
    count = tmp_path / "sigints"
    env = clean_env(TERM="xterm")
    term = Terminal([*RUN, "--quiet", "--web.listen-address", "127.0.0.1:0", "--",
                     sys.executable, TRAIN, "--steps", "100000", "--workers", "1",
                     "--step-ms", "20", "--print-every", "5", "--count-sigint", str(count)], env)
    term.read_until(lambda out: b"train step 5 " in out)
    os.write(term.fd, b"\x03")  # the terminal sends SIGINT to job and launcher alike
    assert term.finish() == 0, term.output.decode(errors="replace")
    assert count.read_text() == "1"  # not twice: the launcher knew the terminal sent it


def test_status_lines_into_a_pipe() -> None:
    run = subprocess.run([*RUN, "--web.listen-address", "127.0.0.1:0", "--status", "--",
                          sys.executable, TRAIN, "--steps", "100", "--workers", "1",
                          "--step-ms", "15"],
                         check=False, env=clean_env(GPUWATCH_STATUS_INTERVAL="0.2"), cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "\x1b" not in run.stderr  # no terminal controls where there is no terminal
    lines = [ln for ln in run.stderr.splitlines() if ln.startswith("gpuwatch | ")]
    assert any(re.search(r"\d+ steps \| step [\d.]+ ms \| data wait \d+% \| [\d.]+ samples/s",
                         ln) for ln in lines), lines
    assert "gpuwatch: job exited with code 0; 100 steps" in run.stderr


def test_quiet_means_no_status_line() -> None:
    run = subprocess.run([*RUN, "--web.listen-address", "127.0.0.1:0", "--quiet", "--",
                          sys.executable, "-c", "print('job output')"],
                         check=False, env=clean_env(GPUWATCH_STATUS_INTERVAL="0.1"), cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0
    assert run.stdout == "job output\n"
    assert "gpuwatch |" not in run.stderr and "gpuwatch: job exited" not in run.stderr


def test_a_port_in_use_moves_the_jobs_metrics_elsewhere() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run([*RUN, "--web.listen-address", f"127.0.0.1:{port}", "--status", "--",
                              sys.executable, "-c", "print('ran')"],
                             check=False, env=clean_env(), cwd=REPO,
                             capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "ran\n"
    notes = re.findall(rf"127\.0\.0\.1:{port} is in use; serving this job's metrics on "
                       r"http://127\.0\.0\.1:(\d+)/metrics instead", run.stderr)
    assert len(notes) == 1 and int(notes[0]) != port


def _pipe_nobody_reads() -> tuple[int, int]:
    """A pipe of one page: a writer blocks after 4 KiB, as behind `| sleep 300`."""
    r, w = os.pipe()
    fcntl.fcntl(w, 1031, 4096)  # F_SETPIPE_SZ
    return r, w


@pytest.mark.parametrize("sig", [None, signal.SIGTERM, signal.SIGINT, signal.SIGQUIT],
                         ids=["no-signal", "TERM", "INT", "QUIT"])
def test_recording_into_a_pipe_nobody_reads_never_hangs(tmp_path: Path, sig: int | None) -> None:
    done = tmp_path / "done"
    r, w = _pipe_nobody_reads()
    try:
        launcher = subprocess.Popen(
            [*RUN, "--quiet", "--web.listen-address", "127.0.0.1:0", "--interval", "0.1",
             "--record", "-", "--", "sh", "-c",
             # 100 step lines fill the pipe while the job still runs
             f"'{sys.executable}' '{TRAIN}' --steps 100 --workers 0 >/dev/null; "
             f"touch '{done}'"],
            env=clean_env(), cwd=REPO, stdin=subprocess.DEVNULL, stdout=w,
            stderr=subprocess.PIPE, text=True)
        os.close(w)
        wait_for(done.exists, "the job to end", proc=launcher)
        time.sleep(1.0)  # the launcher is finishing: its recorder is stuck on the full pipe
        if sig is not None:
            launcher.send_signal(sig)
        try:
            _, err = launcher.communicate(timeout=4 if sig is not None else 30)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.communicate()
            raise AssertionError("gpuwatch run hung after its job ended") from None
    finally:
        os.close(r)
    if sig is None:
        assert launcher.returncode == 0, err  # the job's code, after a bounded wait
        assert "could not be finished" in err
    else:
        assert launcher.returncode == -sig, err
    assert "Traceback" not in err and "Fatal Python error" not in err


def test_a_long_tmpdir_still_serves_receives_and_runs_the_job(tmp_path: Path) -> None:
    deep = tmp_path / ("x" * 60) / ("y" * 60)
    deep.mkdir(parents=True)
    trace = tmp_path / "trace.jsonl"
    run = subprocess.run(
        [*RUN, "--status", "--web.listen-address", "127.0.0.1:0", "--record", str(trace), "--",
         sys.executable, TRAIN, "--steps", "20", "--workers", "0"],
        check=False, cwd=REPO, env=clean_env(TMPDIR=str(deep), XDG_RUNTIME_DIR=str(deep),
                                             GPUWATCH_STATUS_INTERVAL="0.2"),
        capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    assert re.search(r"gpuwatch: watching .* \(metrics at http://127\.0\.0\.1:\d+/metrics\)",
                     run.stderr), run.stderr
    assert "could not serve" not in run.stderr and "hook socket" not in run.stderr
    # the sampler started once: its start-up warning (no GPU here) at most once
    assert run.stderr.count("no NVIDIA GPU/driver found") <= 1, run.stderr
    assert "gpuwatch: job exited with code 0; 20 steps" in run.stderr
    steps = [ln for ln in trace.read_text().splitlines() if '"kind":"step"' in ln
             or '"kind": "step"' in ln]
    assert len(steps) == 20


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_sigterm_reaches_the_whole_job_not_just_its_shell(tmp_path: Path) -> None:
    pidfile = tmp_path / "trainer.pid"
    trainer = (f"import os, time; open('{pidfile}', 'w').write(str(os.getpid())); "
               "time.sleep(300)")
    launcher = subprocess.Popen(
        [*RUN, "--quiet", "--web.listen-address", "127.0.0.1:0", "--", "bash", "-c",
         f'"{sys.executable}" -c "{trainer}"; echo after'],
        env=clean_env(), cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    trainer_pid = None
    try:
        trainer_pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(),
                                   "the trainer to start", proc=launcher))
        launcher.send_signal(signal.SIGTERM)
        out, err = launcher.communicate(timeout=30)
        assert launcher.returncode == -signal.SIGTERM, err
        assert "after" not in out
        wait_for(lambda: not _alive(trainer_pid), "the trainer to end", timeout=10)
    finally:
        launcher.kill()
        launcher.wait()
        if trainer_pid is not None and _alive(trainer_pid):
            os.kill(trainer_pid, signal.SIGKILL)


COUNTER = """
import signal, sys, time
n = 0
def count(*_):
    global n
    n += 1
signal.signal(signal.SIGINT, count)
open(sys.argv[1] + '.ready', 'w').close()
while n == 0:
    time.sleep(0.01)
time.sleep(1.5)  # any second delivery arrives by now
open(sys.argv[1], 'w').write(str(n))
"""


def test_timeout_signalling_launcher_and_group_reaches_the_job_once(tmp_path: Path) -> None:
    count = tmp_path / "sigints"
    run = subprocess.run(["timeout", "-s", "INT", "4", *RUN, "--quiet", "--web.listen-address",
                          "127.0.0.1:0", "--", sys.executable, "-c", COUNTER, str(count)],
                         check=False, env=clean_env(), cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert (tmp_path / "sigints.ready").exists(), run.stderr
    assert run.returncode == 124, run.stderr  # timed out; the job then exited 0
    assert count.read_text() == "1"


@pytest.mark.parametrize("shell", ["bash", "sh"])
def test_ctrl_c_stops_a_shell_loop_of_jobs(shell: str) -> None:
    quoted = " ".join(f"'{a}'" for a in RUN)
    loop = (f"for i in 1 2 3; do {quoted} --quiet --web.listen-address 127.0.0.1:0 -- "
            "sh -c 'echo ready-$0; exec sleep 30' $i; echo next-$i; done; echo after-loop")
    term = Terminal([shell, "-c", loop], clean_env(TERM="xterm"))
    term.read_until(lambda out: b"ready-1" in out, deadline=60)
    assert b"ready-1" in term.output, term.output
    os.write(term.fd, b"\x03")
    term.read_until(lambda out: b"next-1" in out or b"ready-2" in out, deadline=5)
    os.kill(term.pid, signal.SIGKILL) if b"ready-2" in term.output else None
    code = term.finish()
    out = term.output.decode(errors="replace")
    assert "next-1" not in out and "ready-2" not in out and "after-loop" not in out, out
    assert code == -signal.SIGINT, out
