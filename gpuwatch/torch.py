"""Explicit use of the torch hook: ``import gpuwatch.torch; gpuwatch.torch.attach()``.

Call ``attach()`` once, early in the training script (after ``import torch``), in every
process that trains; ``gpuwatch run -- python train.py`` does this for you. Reports go to
``$GPUWATCH_SOCKET``, else to the system daemon's ``/run/gpuwatch/hook.sock``; with no
daemon there, training runs exactly as it would without gpuwatch. See docs/hook.md.
"""

from __future__ import annotations

from gpuwatch.job.hook import attach, detach, is_attached, stats

__all__ = ["attach", "detach", "is_attached", "stats"]
