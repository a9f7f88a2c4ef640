"""The in-process torch hook (public as :mod:`gpuwatch.torch`).

``core`` holds the hook's state, its wrappers around torch and its reporting thread.
This package is the only gpuwatch code that imports torch.
"""

from __future__ import annotations

from gpuwatch.job.hook.core import (
           attach,
           attach_problem,
           attach_when_training,
           detach,
           is_attached,
           stats,
)

__all__ = ["attach", "attach_problem", "attach_when_training", "detach", "is_attached",
           "stats"]
