"""The hook's guarantees, with real torch on the CPU: it never blocks, never raises into the
training loop, never changes results, and its injection neither imports torch nor hides
another sitecustomize.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpuwatch import hook  # noqa: E402 (after the importorskip above)
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
        for _ in range(200):
            _tiny_step(opt, p)
            hook._hook.report()  # what the reporting thread does, here without waiting
        stats = hook.stats()
        assert stats["steps_total"] == 200
        assert stats["sender_dropped"].get("busy", 0) > 0
        assert stats["reports_sent"] >= 200
    finally:
        stuck.close()


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

    before = (GradScaler.step, GradScaler.update, _BaseDataLoaderIter.__next__,
              torch.autocast.__enter__, torch.utils.checkpoint.checkpoint, sys.excepthook)
    assert hook.attach("/nonexistent/gpuwatch.sock")
    assert GradScaler.step is not before[0]
    hook.detach()
    after = (GradScaler.step, GradScaler.update, _BaseDataLoaderIter.__next__,
             torch.autocast.__enter__, torch.utils.checkpoint.checkpoint, sys.excepthook)
    assert after == before
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
