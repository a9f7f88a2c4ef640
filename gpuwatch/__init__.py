"""gpuwatch: GPU monitoring daemon, Prometheus exporter and training advisor."""

__version__ = "0.1.0"


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext gpuwatch``: the ``%gpuwatch`` magic (gpuwatch/notebook.py). Imported
    here only when asked: this file is imported inside every training job."""
    from gpuwatch.notebook import load_ipython_extension as load

    load(ipython)
