"""Collection: what the daemon reads of the machine.

``nvml`` is the only code that calls NVML, ``host`` reads the host and the GPU processes'
trees through psutil, and ``sampler`` runs both on a drift-free tick and publishes each
:class:`gpuwatch.samples.Snapshot` into the :class:`gpuwatch.store.Store`.
"""
