"""gpuwatch: GPU monitoring daemon, Prometheus exporter and training advisor."""

__version__ = "0.1.0"
