"""benchmarks/repeat_gpus_daemon.py's stand-in for a bigger node: each GPU listed K times,
every copy read as a GPU of its own by the real sampler (here over the NVML stub)."""

from __future__ import annotations

from benchmarks.repeat_gpus_daemon import RepeatedGpus
from gpuwatch.collect.sampler import Sampler
from gpuwatch.samples import HostSample
from gpuwatch.store import Store
from tests.conftest import wait_for
from tests.nvml_stub import NvmlStub, StubGpu


class NoHost:
    def sample(self, t: float, gpu_pids: object, mains: object = ()) -> HostSample:
        return HostSample(t=t)


def test_each_gpu_is_read_as_k_gpus_and_its_xid_events_registered_once() -> None:
    stub = NvmlStub([StubGpu(0, util=(10, 1)), StubGpu(1, util=(90, 9))])
    sampler = Sampler(Store(), nvml_module=RepeatedGpus(stub, 3), slow_interval=3600.0,
                      host=NoHost())
    try:
        snap = wait_for(lambda: len((s := sampler.tick()).gpus) == 6 and s,
                        "six GPUs read")
        assert [g.gpu for g in snap.gpus] == [0, 1, 2, 3, 4, 5]
        assert [g.util for g in snap.gpus] == [0.1, 0.9] * 3  # GPU i is the driver's i % 2
        assert stub.count("nvmlDeviceGetUtilizationRates", 0) >= 3
        wait_for(lambda: stub.event_sets and len(stub.event_sets[0].registered) == 2,
                 "XID events registered for the two devices")
        # each device once, by its first copy; the copies are refused before the driver
        assert stub.count("nvmlDeviceRegisterEvents", 0) == 1
        assert stub.count("nvmlDeviceRegisterEvents", 1) == 1
        assert sampler._xid is not None and sampler._xid.registered == (0, 1)
        assert snap.health.errors_total == {}
    finally:
        sampler.stop()
