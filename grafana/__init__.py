"""gpuwatch Grafana dashboards, built as code (see build.py)."""
