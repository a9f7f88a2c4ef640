"""The hook's guarantees, with real torch on the CPU: it never blocks, never raises into the
training loop, never changes results, and its injection neither imports torch nor hides
another sitecustomize.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpuwatch.job import sender  # noqa: E402 (after the importorskip above)
from gpuwatch.job.hook import core as hook  # noqa: E402
from gpuwatch.launcher import inject_dir  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "tests" / "scripts" / "train_cpu.py"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(f"/tmp/gwh-{os.getpid()}-{time.monotonic_ns()}")
    d.mkdir()
    yield d
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


@pytest.fixture
def attached(short_dir: Path) -> Iterator[Path]:
    """The hook attached in this process; detached (every patch undone) afterwards."""
    path = short_dir / "hook.sock"
    assert hook.attach(str(path))
    try:
        yield path
    finally:
        hook.detach()


def _tiny_step(opt: torch.optim.Optimizer, p: torch.nn.Parameter) -> None:
    p.grad = torch.ones_like(p)
    opt.step()


def _hook_stats(stderr: str) -> dict:
    [line] = [ln for ln in stderr.splitlines() if ln.startswith("gpuwatch-hook-stats ")]
    return json.loads(line.split(" ", 1)[1])


def test_a_receiver_that_never_reads_costs_dropped_reports_not_a_stall(attached: Path) -> None:
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stuck.bind(str(attached))  # bound, never read: its queue fills up
    try:
        p = torch.nn.Parameter(torch.zeros(4))
        opt = torch.optim.SGD([p], lr=0.1)
        for i in range(200):
            _tiny_step(opt, p)
            if i % 10 == 9:
                hook._hook.report()  # what the reporting thread does, here without waiting
        stats = hook.stats()
        assert stats["steps_total"] == 200
        assert stats["sender_dropped"].get("busy", 0) > 0
        assert stats["reports_sent"] >= 20
    finally:
        stuck.close()


def test_a_full_queue_that_drains_soon_loses_no_report(attached: Path) -> None:
    """Ranks reporting at the same moment fill the daemon's socket queue for a few ms: the
    report is tried again after short pauses instead of being dropped."""
    slow = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    slow.bind(str(attached))
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    filler.setblocking(False)
    try:
        queued = 0
        while True:  # fill the queue to the brim, as other ranks' reports would
            try:
                filler.sendto(b"x" * 64, str(attached))
                queued += 1
            except BlockingIOError:
                break
        p = torch.nn.Parameter(torch.zeros(4))
        opt = torch.optim.SGD([p], lr=0.1)
        _tiny_step(opt, p)

        def drain_later() -> None:
            time.sleep(0.003)
            for _ in range(queued):
                slow.recv(65536)
        t = threading.Thread(target=drain_later)
        t.start()
        hook._hook.report()
        t.join()
        assert hook.stats()["sender_dropped"] == {}
        slow.settimeout(1.0)
        got = slow.recv(65536)
        assert len(got) > 64  # the hook's report, behind the fillers: not dropped
    finally:
        slow.close()
        filler.close()


def test_every_rank_starts_its_report_timer_at_its_own_point() -> None:
    # ranks of a host start together: each process's first report waits a part of the
    # interval of its own, so their reports do not fill the daemon's queue at once
    code = "from gpuwatch.job import sender; print(sender.report_offset())"
    got = [float(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                text=True, check=True).stdout) for _ in range(4)]
    assert all(0.0 <= g < sender.REPORT_INTERVAL for g in got)
    assert len(set(got)) == 4


def test_the_reporting_thread_waits_its_offset_first(short_dir: Path, monkeypatch) -> None:
    monkeypatch.setattr(sender, "report_offset", lambda: 0.3)
    path = short_dir / "hook.sock"
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(str(path))
    rx.settimeout(3.0)
    try:
        t0 = time.monotonic()
        assert hook.attach(str(path))  # an explicit attach starts the reporting thread
        try:
            rx.recv(65536)
            waited = time.monotonic() - t0
        finally:
            hook.detach()
        assert 0.25 <= waited < sender.REPORT_INTERVAL + 0.3
    finally:
        rx.close()


def test_no_receiver_at_all_is_counted_and_harmless(attached: Path) -> None:
    p = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([p], lr=0.5)
    _tiny_step(opt, p)
    hook._hook.report()
    assert hook.stats()["sender_dropped"] == {"no_receiver": 1}
    assert torch.equal(p.detach(), torch.full((4,), -0.5))


def test_errors_inside_the_hook_never_reach_the_training_loop(attached: Path) -> None:
    p = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([p], lr=0.5)
    h = hook._hook
    h.pending = None  # sabotage: every step's bookkeeping now fails
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2)
    got = []
    for batch in loader:
        got.append(batch.tolist())
        _tiny_step(opt, p)
    assert got == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert torch.equal(p.detach(), torch.full((4,), -2.0))
    assert h.errors == 4
    h.paths = [12345]  # sabotage the sender: not a path at all
    h.report()  # what the reporting thread does: the error is counted, not raised
    assert h.errors == 5
    for _ in range(hook.MAX_HOOK_ERRORS):
        _tiny_step(opt, p)
    assert h.off  # too many errors: the hook stopped measuring, training did not stop


def test_detach_restores_torch() -> None:
    from torch.amp.grad_scaler import GradScaler
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    def patched() -> tuple:
        return (GradScaler.step, GradScaler.update, _BaseDataLoaderIter.__next__,
                _BaseDataLoaderIter.__init__, torch.utils.data.DataLoader._get_iterator,
                torch.autocast.__enter__, torch.utils.checkpoint.checkpoint,
                torch.autograd.backward, torch.optim.Optimizer.__init__,
                torch.nn.Module.eval, torch.save, torch.compile, sys.excepthook)

    def registered() -> tuple:  # torch's own hook points: the global hook dicts
        mod = torch.nn.modules.module
        return (len(mod._global_module_registration_hooks),
                len(mod._global_parameter_registration_hooks))

    before, hooks_before = patched(), registered()
    assert hook.attach("/nonexistent/gpuwatch.sock")
    during = patched()
    assert all(a is not b for a, b in zip(before, during, strict=True))
    assert registered() == tuple(n + 1 for n in hooks_before)
    hook.detach()
    assert patched() == before
    assert registered() == hooks_before
    assert not hook.is_attached()


def _train(out: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TRAIN), "--steps", "25", "--workers", "2",
                           "--scaler", "plain", "--inf-every", "6", "--result", str(out),
                           *extra], check=False, env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_results_are_identical_with_the_hook_and_no_daemon(tmp_path: Path) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH")}
    base["PYTHONPATH"] = str(REPO)
    plain = _train(tmp_path / "plain.pt", base)
    injected_env = dict(base, PYTHONPATH=inject_dir() + os.pathsep + str(REPO),
                        GPUWATCH_SOCKET="/nonexistent/dir/hook.sock")
    injected = _train(tmp_path / "injected.pt", injected_env)
    explicit = _train(tmp_path / "explicit.pt", dict(base, GPUWATCH_SOCKET="/nonexistent/x"),
                      "--attach")
    for run in (plain, injected, explicit):
        assert run.returncode == 0, run.stderr
    assert "gpuwatch-hook-stats" not in plain.stderr
    for run in (injected, explicit):
        stats = _hook_stats(run.stderr)
        assert stats["steps_total"] == 25
        assert stats["skipped_total"] == 4
        assert stats["hook_errors"] == 0
    a, b, c = (torch.load(tmp_path / f"{n}.pt") for n in ("plain", "injected", "explicit"))
    for key in a:
        assert torch.equal(a[key], b[key]) and torch.equal(a[key], c[key]), key


def test_injection_does_not_import_torch_or_hide_another_sitecustomize(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = 'yes'\n")
    code = ("import json, os, sys; print(json.dumps({'torch': 'torch' in sys.modules, "
            "'theirs': os.environ.get('THEIRS_RAN'), 'path': sys.path}))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH")}
    env["PYTHONPATH"] = str(theirs)
    run = subprocess.run([sys.executable, "-m", "gpuwatch", "run", "--quiet", "--",
                          sys.executable, "-c", code], check=False, env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["torch"] is False
    assert seen["theirs"] == "yes"
    assert inject_dir() not in seen["path"]
    assert str(theirs) in seen["path"]


def _import_torch_with(pythonpath: list[str], cwd: Path) -> subprocess.CompletedProcess:
    code = ("import torch, sys; from gpuwatch.job.hook import core as hook\n"
            "m = torch.nn.Linear(2, 1); "
            "o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
            "for _ in range(5):\n m(torch.ones(1, 2)).sum().backward(); o.step()\n"
            "print(hook.is_attached(), hook.stats()['steps_total'], hook.__file__)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH")}
    env.update(PYTHONPATH=os.pathsep.join(pythonpath), GPUWATCH_SOCKET="/nonexistent/x")
    return subprocess.run([sys.executable, "-c", code], check=False, env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_the_injection_reached_twice_attaches_once(tmp_path: Path) -> None:
    """The inject directory on the path twice (through a symlink), and a second gpuwatch
    install's inject directory beside it (a job that runs its own `gpuwatch run`): the
    import watchers used to ask each other forever (RecursionError on `import torch`)."""
    link = tmp_path / "inject-link"
    link.symlink_to(inject_dir())
    other = tmp_path / "other"
    shutil.copytree(REPO / "gpuwatch", other / "gpuwatch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for path in ([inject_dir(), str(link)],
                 [str(other / "gpuwatch" / "job" / "_inject"), inject_dir()]):
        run = _import_torch_with(path, tmp_path)
        assert run.returncode == 0, run.stderr
        attached, steps, _where = run.stdout.split()
        assert (attached, steps) == ("True", "5"), path  # one hook: no step counted twice


def test_a_hook_that_cannot_attach_says_so_once_and_the_job_runs(tmp_path: Path) -> None:
    """A broken hook (here: a gpuwatch whose hook module fails to import, as it would on a
    Python it does not support): the job runs, and is told once why it is not measured."""
    other = tmp_path / "other"
    shutil.copytree(REPO / "gpuwatch", other / "gpuwatch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (other / "gpuwatch" / "job" / "hook" / "core.py").write_text("raise ImportError('no hook for you')\n")
    code = ("import subprocess, sys, torch\n"
            "subprocess.run([sys.executable, '-c', 'import torch'], check=True)\n"
            "print(torch.ones(2).sum().item())")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH")}
    env["PYTHONPATH"] = str(other / "gpuwatch" / "job" / "_inject")
    run = subprocess.run([sys.executable, "-c", code], check=False, env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "2.0"
    said = [ln for ln in run.stderr.splitlines() if ln.startswith("gpuwatch:")]
    version = sys.version.split()[0]
    assert said == [f"gpuwatch: the torch hook is off in this job (on Python {version}: "
                    f"ImportError: no hook for you); training runs unmeasured"]  # just once
