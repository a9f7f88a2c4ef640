"""Injected by ``gpuwatch run -- CMD``: attach the torch hook when, and only if, the job
imports torch.

``gpuwatch run`` puts this directory first on PYTHONPATH, so Python imports this file at
start-up instead of any other ``sitecustomize``; that one still runs, chained from here.
Nothing here imports torch: a meta path finder waits for the job's own ``import torch``
and attaches the hook right after torch has finished importing. Any failure here is
swallowed: gpuwatch must never stop a job from starting. ``GPUWATCH_DISABLE=1`` turns
the hook off.
"""

# A failure here must never stop the job from starting: everything is caught.
# ruff: noqa: BLE001, S110

from __future__ import annotations

import os
import sys

# realpath: this directory may be reached twice, once through a symlink
_HERE = os.path.dirname(os.path.realpath(__file__))
_SAID = "GPUWATCH_HOOK_PROBLEM_SAID"  # set once the job was told why it is not measured


def _same_dir(entry):
    try:
        return os.path.realpath(entry or os.curdir) == _HERE
    except Exception:
        return False


def _say_once(why):
    """Tell the job once (not each of its processes) that the hook could not attach."""
    if os.environ.get(_SAID):
        return
    os.environ[_SAID] = "1"  # inherited by the job's other processes: they stay quiet
    try:
        print(f"gpuwatch: the torch hook is off in this job ({why}); training runs "
              f"unmeasured", file=sys.stderr)
    except Exception:
        pass


def _attach():
    try:
        hook = _import_hook_module()
    except Exception as err:  # e.g. a Python the hook does not support
        _say_once(f"on Python {sys.version.split()[0]}: {type(err).__name__}: {err}")
        return
    try:
        if not hook.attach_when_training():
            why = getattr(hook, "attach_problem", None)
            _say_once(why() if why is not None else "it could not attach")
    except Exception as err:
        _say_once(f"{type(err).__name__}: {err}")


def _chain():
    """Run the sitecustomize this file shadows, as site.py would have."""
    import importlib.machinery
    import importlib.util

    others = [p for p in sys.path if not _same_dir(p)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as err:  # the message site.py prints for a failing sitecustomize
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
              f"{type(err).__name__}: {err}", file=sys.stderr)


def _import_hook_module():
    import importlib
    import importlib.util

    if "gpuwatch" not in sys.modules:
        # the hook of the gpuwatch that launched the job (this file's own package), not
        # whichever one the job's Python finds first (another install, another version):
        # it must speak the launcher's protocol. Loaded by location, without putting the
        # launcher's site-packages on the job's path.
        package_dir = os.path.dirname(os.path.dirname(_HERE))  # gpuwatch/job/_inject
        spec = importlib.util.spec_from_file_location(
            "gpuwatch", os.path.join(package_dir, "__init__.py"),
            submodule_search_locations=[package_dir])
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpuwatch"] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules["gpuwatch"]
            raise
    return importlib.import_module("gpuwatch.job.hook")


class _AttachAfterTorch:
    """A meta path finder that only watches for ``torch`` and attaches once it is loaded."""

    gpuwatch_attach_after_torch = True  # how another copy of this file recognises one

    def __init__(self):
        self._busy = False

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or path is not None or self._busy:
            return None
        # another watcher (a second gpuwatch's) asks the finders in turn, this one
        # included: without this guard the two would ask each other forever
        self._busy = True
        try:
            for finder in sys.meta_path:
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                spec = find(name, path, target) if find is not None else None
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy = False
        loader = spec.loader
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec
        watcher = self

        def exec_module(module):
            run(module)
            try:
                del loader.exec_module
            except AttributeError:
                pass
            try:
                sys.meta_path.remove(watcher)
            except ValueError:
                pass
            _attach()

        try:
            loader.exec_module = exec_module
        except Exception:
            pass
        return spec


def _setup():
    # leave the job's own import path as it would be; children still get PYTHONPATH
    sys.path[:] = [p for p in sys.path if not _same_dir(p)]
    _chain()
    if os.environ.get("GPUWATCH_DISABLE", "") not in ("", "0"):
        return
    if "torch" in sys.modules:  # imported by a chained sitecustomize or a .pth file
        _attach()
        return
    if any(getattr(f, "gpuwatch_attach_after_torch", False) for f in sys.meta_path):
        return  # a second gpuwatch's sitecustomize (chained from here) already watches
    sys.meta_path.insert(0, _AttachAfterTorch())


try:
    _setup()
except Exception:
    pass
