"""Recordings: the ``gpuwatch-trace/1`` file format (``format``), writing one from the
store as the daemon samples (``record``), and serving one back as if live (``replay``).
"""
