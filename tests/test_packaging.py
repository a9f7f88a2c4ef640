"""The package as a user gets it: a wheel built from this tree, installed in a fresh venv."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SERVING, http_get, parse_metrics, wait_for

tomllib = pytest.importorskip("tomllib")


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_subpackage_is_listed_in_pyproject():
    # setuptools' explicit list silently drops a subpackage someone forgot to add
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(REPO).parts)
               for p in (REPO / "gpuwatch").rglob("__init__.py")
               if "__pycache__" not in p.parts}
    on_disk.add("gpuwatch.rules")  # rules/ at the top level, installed under gpuwatch
    assert listed == on_disk


def test_test_extra_pins_the_torch_ci_installs():
    # CI installs torch==X first (the CPU build where pip is pointed at one); the extra
    # pins the same release, which a local build (X+cpu) meets, and names no CUDA build
    extra = _pyproject()["project"]["optional-dependencies"]["test"]
    torch = [r for r in extra if re.match(r"torch\b", r)]
    ci = re.findall(r"pip install (torch==[0-9.]+)\s*$", (REPO / ".ci" / "run").read_text(),
                    re.MULTILINE)
    assert ci and torch == ci[:1], (torch, ci)
    assert "+" not in torch[0] and "cu" not in torch[0]


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv (with the system's packages, no network) holding only the built wheel."""
    root = tmp_path_factory.mktemp("pkg")
    wheels = root / "wheels"
    # build from a copy: an in-tree build leaves build/ behind, whose stale files would
    # ride along into later wheels. No build isolation where this Python can build it,
    # so no network is needed.
    src = root / "src"
    skip = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                  ".venv", ".dev", ".whl", ".pytest_cache", ".ruff_cache")

    def ignore(directory: str, names: list[str]) -> set[str]:
        # the recordings under tests/ are not part of the package
        extra = {"data"} if Path(directory).resolve() == REPO / "tests" else set()
        return set(skip(directory, names)) | extra

    shutil.copytree(REPO, src, ignore=ignore)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(wheels), str(src)]
    done = subprocess.run([*build, "--no-build-isolation"], capture_output=True, text=True,
                          env=_clean_env(), cwd=root, timeout=300, check=False)
    if done.returncode != 0:
        # this Python's own setuptools can't build it (too old, or no `wheel`): let pip
        # fetch a build environment as a user's `pip install .` would
        subprocess.run(build, check=True, capture_output=True, text=True, env=_clean_env(),
                       cwd=root, timeout=300)
    (wheel,) = wheels.glob("gpuwatch-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=300)
    _see_our_dependencies(venv)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True, text=True,
                   env=_clean_env(), cwd=root, timeout=300)
    return venv


def _see_our_dependencies(venv: Path) -> None:
    """Let ``venv`` import the dependencies of the environment running the tests.

    ``--system-site-packages`` gives it the base interpreter's packages: right in CI, but
    inside a virtualenv (the README's `pip install -e '.[test]'` there) the dependencies
    live in that virtualenv instead. Its site-packages go on the new venv's path after the
    venv's own (so the wheel's gpuwatch wins), as plain path lines: the .pth files there
    (this checkout's editable install among them) are not run."""
    if sys.prefix == sys.base_prefix:
        return
    import site

    ours = [d for d in site.getsitepackages() if os.path.isdir(d)]
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True, env=_clean_env(),
                             timeout=120).stdout.strip()
    (Path(purelib) / "_gpuwatch_test_deps.pth").write_text("".join(d + "\n" for d in ours))


def _venv_python(venv: Path, code: str) -> str:
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                         text=True, env=_clean_env(), cwd=venv.parent, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.slow
def test_wheel_installs_the_package_and_its_data(installed):
    out = _venv_python(installed, (
        "import json, gpuwatch\n"
        "from importlib.resources import files\n"
        "print(gpuwatch.__file__)\n"
        "demo = files('gpuwatch.data') / 'demo.jsonl'\n"
        "print(json.loads(demo.open().readline())['format'])\n"
        "print(sorted(p.name for p in files('gpuwatch.rules').iterdir()"
        " if p.name.endswith('.yaml')))\n"
    ))
    module_file, fmt, rules = out.splitlines()
    # the installed copy, not the working tree
    assert Path(module_file).resolve().is_relative_to(installed.resolve())
    assert fmt == "gpuwatch-trace/1"
    shipped = sorted(p.name for p in (REPO / "rules").glob("*.yaml"))
    assert rules == repr(shipped)


@pytest.mark.slow
def test_installed_subpackages_import(installed):
    packages = _pyproject()["tool"]["setuptools"]["packages"]
    out = _venv_python(installed, "import importlib\n" + "".join(
        f"importlib.import_module({name!r})\n" for name in packages) + "print('ok')")
    assert out.strip() == "ok"


@pytest.mark.slow
def test_installed_console_script_serves_the_demo(installed, tmp_path):
    # the README's first command, from the installed package
    script = installed / "bin" / "gpuwatch"
    version = subprocess.run([str(script), "--version"], capture_output=True, text=True,
                             env=_clean_env(), timeout=60, check=True)
    assert version.stdout.startswith("gpuwatch ")
    env = {**_clean_env(), "XDG_RUNTIME_DIR": str(tmp_path)}
    proc = subprocess.Popen([str(script), "run", "--demo", "--web.listen-address",
                             "127.0.0.1:0"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True, env=env, cwd=tmp_path)
    try:
        assert proc.stderr is not None
        url = None
        for line in proc.stderr:  # the 'serving' line comes before anything can block
            m = SERVING.search(line)
            if m:
                url = m.group(1)
                break
        assert url, "no 'serving' line"

        def util() -> bool:
            names = {n for n, _ in parse_metrics(http_get(url + "/metrics")[2])}
            return "gpuwatch_gpu_utilization_ratio" in names

        wait_for(util, "the demo's GPU series", proc=proc)
    finally:
        proc.terminate()
        assert proc.wait(20) == 0


def test_ci_runs_the_readmes_test_command():
    readme = (REPO / "README.md").read_text().splitlines()
    # the second command at the top of the README: install, then the test command
    first_commands = [line.strip() for line in readme[:12] if line.startswith("    ")]
    assert len(first_commands) >= 2
    assert "gpuwatch run" in first_commands[0]
    test_command = first_commands[1].split("&&")[-1].strip()
    assert test_command.startswith("python3 -m pytest")
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert test_command in [line.strip() for line in ci]
    assert "pip install torch==2.13.0" in first_commands[1]
