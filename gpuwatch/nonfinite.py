"""A float that is not a finite number, as JSON carries it: by name.

JSON has no NaN or infinity, so a training loss that is one travels as ``"nan"``,
``"inf"`` or ``"-inf"``: in the datagram's ``loss_nonfinite`` column (its ``loss`` null)
and in the trace's step line. Shared by the hook's protocol (it runs inside the job, on
Python 3.8 and newer: standard library only) and the trace format.
"""

from __future__ import annotations

import math
from typing import Any

# a loss that is not a finite number, as JSON carries it (JSON has no NaN or infinity): a
# diverged run's loss is the fact to tell, not a value "not measured". It goes in a column
# of its own, `loss_nonfinite` (present only where one is), its `loss` null: a receiver
# older than the column reads such a loss as unknown, as it always did, and drops nothing
NONFINITE_LOSS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def nonfinite_name(x: Any) -> str | None:
    """A NaN or infinite float's name in NONFINITE_LOSS; None for anything else."""
    if not isinstance(x, float) or math.isfinite(x):
        return None
    return "nan" if x != x else ("inf" if x > 0 else "-inf")
