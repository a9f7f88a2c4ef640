"""The rules engine: rule files, the safe evaluator, windowed evaluation, reports.

``LiveAdvisor`` runs it inside the daemon; ``gpuwatch advise`` (gpuwatch/advise.py) runs it
over a recording, a daemon or Prometheus.
"""

from __future__ import annotations

from gpuwatch.advisor.live import LiveAdvisor

__all__ = ["LiveAdvisor"]
