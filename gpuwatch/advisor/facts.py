"""Facts about a GPU that rules compare against: its compute capability and what that
architecture offers a training job."""

from __future__ import annotations

from typing import Any


def cc_number(cc: Any) -> float | None:
    """[9, 0], (8, 6), "8.6" or 8.6 → 8.6 (a number rules can compare)."""
    if cc is None:
        return None
    if isinstance(cc, (list, tuple)) and len(cc) >= 2:
        return float(cc[0]) + float(cc[1]) / 10.0
    if isinstance(cc, (int, float)):
        return float(cc)
    if isinstance(cc, str):
        major, _, minor = cc.strip().partition(".")
        return float(major) + (float(minor[:1]) / 10.0 if minor else 0.0)
    return None


def cc_text(cc: float | None) -> str | None:
    if cc is None:
        return None
    major = int(cc + 1e-9)
    minor = round((cc - major) * 10)
    return f"{major}.{minor}"


def arch_supports(cc: float | None) -> dict[str, bool | None]:
    """What a compute capability gives a training job (None: unknown)."""
    if cc is None:
        return {"tensor_cores": None, "fp16": None, "bf16": None, "tf32": None, "fp8": None}
    return {"tensor_cores": cc >= 7.0, "fp16": cc >= 6.0, "bf16": cc >= 8.0, "tf32": cc >= 8.0,
            "fp8": cc >= 8.9}
