"""The code that runs inside the job (the injection, the hook, the protocol) must run on
every Python that torch 2.1+ supports: 3.8 to 3.13. The daemon may use newer Python.

Always: an AST check with ``feature_version=(3, 8)`` and a scan for 3.9+ library calls the
parser cannot see. Where a python3.8 / python3.9 interpreter exists (pyenv on the dev box),
also compile there, round-trip a datagram, and start a torch-less job under the injection.
"""

from __future__ import annotations

import ast
import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# every module a job's process imports: the package roots on the way, the injection, the
# hook package and the protocol
INJECTED = ["gpuwatch/__init__.py", "gpuwatch/job/__init__.py", "gpuwatch/job/_inject/__init__.py",
            "gpuwatch/job/_inject/sitecustomize.py", "gpuwatch/job/protocol.py",
            "gpuwatch/nonfinite.py",
            "gpuwatch/torch.py",
            *sorted(str(p.relative_to(REPO)) for p in (REPO / "gpuwatch/job/hook").glob("*.py"))]
# (what to look for, why it breaks on 3.8): APIs and keywords newer than 3.8
NEWER = [(".removeprefix(", "str.removeprefix is 3.9+"), (".removesuffix(", "3.9+"),
         ("slots=True", "dataclass(slots=True) is 3.10+"), ("kw_only=", "3.10+"),
         ("strict=", "zip(strict=) is 3.10+"), ("functools.cache(", "3.9+"),
         ("@cache", "functools.cache is 3.9+"), ("math.lcm", "3.9+"), ("ExceptionGroup", "3.11+"),
         ("tomllib", "3.11+"), ("typing.Self", "3.11+"), ("TypeAlias", "3.10+")]


def _old_pythons() -> list[str]:
    found = []
    for version in ("3.8", "3.9"):
        exe = shutil.which(f"python{version}")
        candidates = glob.glob(f"/root/.pyenv/versions/{version}.*/bin/python{version}")
        for path in ([exe] if exe else []) + candidates:
            ok = subprocess.run([path, "-c", "pass"], capture_output=True, check=False)
            if ok.returncode == 0:
                found.append(path)
                break
    return found


@pytest.mark.parametrize("name", INJECTED)
def test_injected_code_parses_as_python_3_8(name: str) -> None:
    src = (REPO / name).read_text()
    tree = ast.parse(src, filename=name, feature_version=(3, 8))
    assert not any(type(node).__name__ == "Match" for node in ast.walk(tree))
    problems = [f"{name}: {needle!r} ({why})" for needle, why in NEWER if needle in src]
    # `X | Y` is fine in annotations (`from __future__ import annotations` keeps them
    # strings) but not at run time: in isinstance() or assigned as a type alias
    if "|" in src and "def " in src:
        assert "from __future__ import annotations" in src, name
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            for arg in node.args[1:]:
                if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.BitOr):
                    problems.append(f"{name}:{node.lineno}: isinstance with X | Y")
    assert not problems


@pytest.mark.parametrize("python", _old_pythons() or
                         [pytest.param(None, marks=pytest.mark.skip("no python3.8/3.9 here"))])
def test_injected_code_runs_on_an_old_python(python: str, tmp_path: Path) -> None:
    code = ("import sys\nsys.path.insert(0, sys.argv[1])\n"
            "for f in sys.argv[2:]:\n compile(open(f).read(), f, 'exec')\n"
            "from gpuwatch.job import protocol\n"
            "r = protocol.decode(protocol.encode({'kind': 'report', 'pid': 1, 'seq': 0, "
            "'t': 1.0, 'window': {'steps': 1, 'iterators': 1}}, "
            "[protocol.StepRecord(step=0, t=1.0, first_batch=True)]))\n"
            "assert r.window.iterators == 1 and r.steps[0].first_batch is True\n"
            "print('ok')\n")
    run = subprocess.run([python, "-c", code, str(REPO), *[str(REPO / f) for f in INJECTED]],
                         capture_output=True, text=True, check=False, cwd=tmp_path, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
    # a job on that Python under the injection (no torch there): it starts and runs as usual
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWATCH", "PYTHON"))}
    env["PYTHONPATH"] = str(REPO / "gpuwatch" / "job" / "_inject")
    job = subprocess.run([python, "-c", "print('job ran')"], capture_output=True, text=True,
                         check=False, cwd=tmp_path, env=env, timeout=60)
    assert job.returncode == 0 and job.stdout == "job ran\n" and job.stderr == "", job.stderr
