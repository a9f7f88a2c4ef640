"""The package's layout (docs/architecture.md): which side each module serves, and that
imports only run down the sides, never up and never across.

Sides, lowest first: what every side shares (the top level's errors, logs, samples,
store, threads, nonfinite); the sources (collect/, job/, trace/), which never import each other; serve/;
advisor/; and the entry points with the composition root (the top level's cli,
__main__, daemon, launcher, advise, torch), which may import anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "gpuwatch"

SHARED = {"__init__", "errors", "logs", "nonfinite", "samples", "store", "threads"}
ENTRIES = {"__main__", "cli", "daemon", "launcher", "advise", "torch", "notebook"}
RANK = {"shared": 0, "collect": 1, "job": 1, "trace": 1, "serve": 2, "advisor": 3, "entry": 4}


def side_of(module: str) -> str:
    """``gpuwatch.collect.nvml`` → ``collect``; ``gpuwatch.store`` → ``shared``."""
    parts = module.split(".")
    if parts[0] != "gpuwatch":
        raise ValueError(module)
    if len(parts) == 1:
        return "shared"
    head = parts[1]
    if head in RANK and head not in ("shared", "entry"):
        return head
    if head in SHARED or head == "data":
        return "shared"
    if head in ENTRIES:
        return "entry"
    raise AssertionError(f"{module}: not on any side (docs/architecture.md)")


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(module: str, path: Path) -> set[str]:
    """Every gpuwatch module ``module`` imports: at the top, inside functions, and by name
    through importlib."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            # `from gpuwatch.job import receiver` imports the module gpuwatch.job.receiver
            found.update(f"{base}.{a.name}" for a in node.names)
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                  "import_module", "_optional")):
            found.add(node.args[0].value)
    known = modules()
    return {m for m in found if m.startswith("gpuwatch") and m in known and m != module}


MODULES = modules()
# the one import up the sides: `%load_ext gpuwatch` asks the package itself for IPython's
# hook, which imports the notebook front-end inside the function, only when called
UPWARD_ENTRY_POINTS = {("gpuwatch", "gpuwatch.notebook")}


def test_the_package_imports_nothing_at_import_time():
    """gpuwatch/__init__.py runs inside every training job (the hook's injection): its
    only import of the package's own code is the notebook's, inside a function."""
    tree = ast.parse((PKG / "__init__.py").read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not top


def test_the_top_level_holds_entry_points_the_composition_root_and_what_is_shared():
    top = {p.stem for p in PKG.glob("*.py")}
    assert top == SHARED | ENTRIES
    folders = {p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == {"advisor", "collect", "data", "job", "serve", "trace"}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_down_the_sides(module: str):
    mine = side_of(module)
    wrong = []
    for other in sorted(imports_of(module, MODULES[module])):
        theirs = side_of(other)
        if mine == "entry" or theirs == "shared" or theirs == mine:
            continue
        if (module, other) in UPWARD_ENTRY_POINTS:
            continue
        if RANK[theirs] >= RANK[mine]:
            wrong.append(f"{module} ({mine}) imports {other} ({theirs})")
    assert not wrong


def test_the_daemon_side_never_imports_torch():
    for module, path in MODULES.items():
        if module.startswith("gpuwatch.job.hook") or module == "gpuwatch.torch":
            continue
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(n == "torch" or n.startswith("torch.") for n in names), module


def test_a_side_importing_upwards_is_caught(tmp_path):
    """The check itself: a collect module that imports the advisor is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from gpuwatch.advisor import engine\n")
    got = imports_of("gpuwatch.collect.bad", bad)
    assert "gpuwatch.advisor.engine" in got
    assert RANK[side_of("gpuwatch.advisor.engine")] > RANK[side_of("gpuwatch.collect.bad")]
