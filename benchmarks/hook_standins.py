"""Stand-ins for torch's functions that the hook wraps, shared by bench_hook.py's micro rows
and instructions.py: each returns at once, so what a wrapper costs is its time less the
stand-in's own."""

from __future__ import annotations

from typing import Any


def raw(_self: Any, *_args: Any) -> None:
    """A method of torch's that returns at once (``__next__``, ``scale``, ``update``)."""
    return None


def raw_backward(tensors: Any, grad_tensors: Any = None, retain_graph: Any = None,
                 create_graph: Any = False, grad_variables: Any = None,
                 inputs: Any = None) -> None:
    """``torch.autograd.backward``'s own parameters, as the hook's wrapper passes them on
    (the wrapper takes its fast signature only for these)."""
    return None


def training_facts() -> list[Any]:
    """What a DataLoader iterator carries once its first batch came in a loader that
    trains: [batch size, facts, None, start, the loader (weakly), True]."""
    return [16, {}, None, 0.0, None, True]


class It:
    """A DataLoader iterator as the hook sees it (``_gpuwatch``: :func:`training_facts`)."""

    def __init__(self) -> None:
        self._gpuwatch = training_facts()
