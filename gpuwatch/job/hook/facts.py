"""The job's settings, each read under its own guard.

The reporting thread reads these once per report. Any one of them may fail (a torch whose
API moved, a framework object in an odd state, the "mix of the legacy and new APIs"
RuntimeError that torch 2.9+ raises from the legacy TF32 getters once the new
``fp32_precision`` API was used): a failure costs that fact only, and is said once (the
hook's ``problems``), never the report or the steps.

TF32 is read through the API torch has: the ``fp32_precision`` getters where they exist
(torch 2.9 and later; they never raise, and they stay right when a framework set TF32
through them), the legacy ``allow_tf32`` flags only on an older torch.
"""

# ruff: noqa: BLE001

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

MAX_PROBLEMS = 16  # distinct problems kept (and sent) per process
MAX_ERROR = 300  # characters of an error's text


def error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"[:MAX_ERROR]


class Problems:
    """What the hook could not read or do, each said once: ``what`` → the error's text."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def add(self, what: str, err: BaseException | str) -> None:
        if what in self.seen or len(self.seen) >= MAX_PROBLEMS:
            return
        self.seen[what] = err if isinstance(err, str) else error_text(err)

    def as_list(self) -> list[dict[str, str]]:
        # (a copy first: the training thread may add one while the reporter reads)
        return [{"what": k, "error": v} for k, v in list(self.seen.items())]


def read(cfg: dict[str, Any], name: str, fn: Callable[[], Any], problems: Problems) -> None:
    """``cfg[name] = fn()``, or the failure noted (once) and the fact left out."""
    try:
        value = fn()
    except Exception as err:
        problems.add(f"config.{name}", err)
        return
    if value is not None or name not in cfg:
        cfg[name] = value


def read_known(cfg: dict[str, Any], name: str, fn: Callable[[], Any],
               problems: Problems) -> None:
    """:func:`read`, leaving ``name`` out where ``fn`` says None (a fact absent, not
    unknown: no DataParallel, no conv weight that tells the formats apart)."""
    read(cfg, name, fn, problems)
    if cfg.get(name) is None:
        cfg.pop(name, None)


# -- precision -------------------------------------------------------------------------------
# what an unset ("none") fp32_precision means at the root: torch's defaults, cuBLAS matmuls
# in full FP32, cuDNN convolutions as TF32
_DEFAULT_TF32 = {"matmul": False, "conv": True}


def _resolved(*levels: Any) -> str | None:
    """The first ``fp32_precision`` of leaf → root that is set (not "none")."""
    for level in levels:
        value = getattr(level, "fp32_precision", None)
        if isinstance(value, str) and value != "none":
            return value
    return None


def has_new_precision_api() -> bool:
    return isinstance(getattr(torch.backends.cuda.matmul, "fp32_precision", None), str)


def matmul_tf32() -> bool:
    """Whether cuBLAS runs FP32 matmuls as TF32."""
    b = torch.backends
    if has_new_precision_api():
        value = _resolved(b.cuda.matmul, getattr(b, "cuda", None), b)
        return _DEFAULT_TF32["matmul"] if value is None else value == "tf32"
    return bool(b.cuda.matmul.allow_tf32)


def cudnn_tf32() -> bool:
    """Whether cuDNN runs FP32 convolutions as TF32."""
    b = torch.backends
    conv = getattr(b.cudnn, "conv", None)
    if conv is not None and isinstance(getattr(conv, "fp32_precision", None), str):
        value = _resolved(conv, b.cudnn, b)
        return _DEFAULT_TF32["conv"] if value is None else value == "tf32"
    return bool(b.cudnn.allow_tf32)


def deterministic() -> bool:
    """Whether the job asked for reproducible kernels: torch.use_deterministic_algorithms
    (Lightning's Trainer(deterministic=True), the Trainer's full_determinism=True) or
    torch.backends.cudnn.deterministic."""
    return bool(torch.are_deterministic_algorithms_enabled()
                or torch.backends.cudnn.deterministic)


# -- debugging modes ---------------------------------------------------------------------------
def anomaly_detection() -> bool:
    """Whether autograd's anomaly detection is on (torch.autograd.set_detect_anomaly(True),
    the torch.autograd.detect_anomaly() block, Lightning's Trainer(detect_anomaly=True),
    which turns it on around fit()'s loop). A process-wide flag: the reporting thread reads
    what the training thread set."""
    return bool(torch.is_anomaly_enabled())


def launch_blocking() -> bool:
    """Whether the job's environment has CUDA_LAUNCH_BLOCKING=1: every kernel launch
    waits for the kernel to finish. CUDA reads it once, when the process first uses the
    GPU; the environment the hook reads is the one the process started with unless the
    job changed it."""
    return os.environ.get("CUDA_LAUNCH_BLOCKING", "").strip() == "1"


def no_alloc_cache() -> bool:
    """Whether the job's environment has PYTORCH_NO_CUDA_MEMORY_CACHING=1: torch's CUDA
    allocator then caches nothing, and each tensor's memory is a cudaMalloc and a cudaFree
    (which waits for the GPU). torch reads it as a 0/1 flag when it first allocates."""
    return os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "").strip() == "1"


def dist_debug_detail() -> bool:
    """Whether the job's environment has TORCH_DISTRIBUTED_DEBUG=DETAIL (in any case, as
    c10d reads it): each collective is checked against the other ranks' before it runs."""
    return os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").strip().upper() == "DETAIL"


_MATMUL_PRECISION = {"tf32": "high", "ieee": "highest", "bf16": "medium"}


def float32_matmul_precision() -> str:
    """``torch.get_float32_matmul_precision()``'s answer, without asking it where it may
    raise (or answer stale) once the new API was used."""
    b = torch.backends
    if has_new_precision_api():
        value = _resolved(b.cuda.matmul, getattr(b, "cuda", None), b)
        return "highest" if value is None else _MATMUL_PRECISION.get(value, value)
    return torch.get_float32_matmul_precision()
