"""The directory ``gpuwatch run --`` puts first on the job's PYTHONPATH (see sitecustomize)."""
