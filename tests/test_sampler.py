"""The real Sampler over a stubbed NVML module, read back from the real Store."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

import psutil
import pynvml
import pytest
from conftest import wait_for

from gpuwatch.collect import sampler as sampler_mod
from gpuwatch.collect.sampler import Sampler
from gpuwatch.samples import HostSample, Snapshot
from gpuwatch.store import Store
from tests.nvml_stub import NvmlStub, StubGpu

GiB = 2**30


class FakeHost:
    """Stands in for gpuwatch.collect.host.HostSampler; remembers the pids it was given."""

    def __init__(self, on_sample: Callable[[], None] | None = None) -> None:
        self.pids: list[set[int]] = []
        self.mains: list[set[int]] = []
        self.on_sample = on_sample

    def sample(self, t: float, gpu_pids: Collection[int],
               mains: Collection[int] = ()) -> HostSample:
        self.pids.append(set(gpu_pids))
        self.mains.append(set(mains))
        if self.on_sample is not None:
            self.on_sample()
        return HostSample(t=t, load1=0.5)


class SimClock:
    """A monotonic clock that moves only when told."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now



def _has_timerfd() -> bool:
    a = sampler_mod.make_alarm()
    if a is not None:
        a.close()
    return a is not None


@pytest.fixture
def make_sampler():
    made: list[tuple[Sampler, NvmlStub | None]] = []

    def make(stub: NvmlStub | None, **kw: Any) -> tuple[Sampler, Store]:
        store = Store()
        kw.setdefault("host", FakeHost())
        sampler = Sampler(store, nvml_module=stub, **kw)
        made.append((sampler, stub))
        return sampler, store

    yield make
    for sampler, stub in made:
        if stub is not None:
            for gpu in stub.gpus:
                gpu.release()
        sampler.stop()


def test_healthy_gpu_every_field_published(make_sampler) -> None:
    me = os.getpid()
    stub = NvmlStub([StubGpu(0, processes=[(me, 3 * GiB)])])
    sampler, store = make_sampler(stub)

    info = sampler.infos[0]
    assert sampler.nvml_available
    assert info.name == "NVIDIA H100 80GB HBM3"
    assert info.uuid == stub.gpus[0].uuid
    assert info.compute_capability == (9, 0)
    assert info.pci_bus_id == "00000000:01:00.0"  # bytes from NVML decoded
    assert info.driver_version == "580.159.04"
    assert info.mem_total_bytes == 80 * GiB
    assert info.gpm_supported

    first = sampler.tick()
    assert store.latest() is not None and store.latest().t == first.t
    g = store.latest().gpus[0]
    assert (g.util, g.mem_util) == (0.75, 0.30)
    # what can no longer be allocated: v2's used plus the driver's reserved memory
    assert g.mem_used_bytes == 20 * GiB + stub.gpus[0].mem_reserved
    assert g.mem_total_bytes == 80 * GiB
    assert (g.power_watts, g.power_limit_watts) == (312.5, 700.0)
    assert g.temp_celsius == 61.0
    assert (g.sm_clock_mhz, g.mem_clock_mhz) == (1980.0, 2619.0)
    assert g.pstate == 0
    assert g.clock_event_reasons == 0x4
    assert g.uuid == info.uuid and not g.lost
    assert [(p.pid, p.mem_used_bytes) for p in g.processes] == [(me, 3 * GiB)]
    # one GPM sample exists after the first tick: no pair, so no GPM values yet
    assert g.sm_active is None

    second = sampler.tick()
    g = store.latest().gpus[0]
    assert g.sm_active == pytest.approx(0.89)
    assert g.sm_occupancy == pytest.approx(0.415)
    assert g.tensor_active == pytest.approx(0.37)
    assert g.fp32_active == pytest.approx(0.12)
    assert g.fp16_active == 0.0
    assert g.dram_active is None  # NaN from NVML
    assert g.fp64_active == 1.0  # 100.4 % clamps to a ratio of 1
    assert [s.t for s in store.gpu_history(0)] == [first.t, second.t]
    health = store.latest().health
    assert health.ticks_total == 2
    assert health.errors_total == {}
    assert health.last_success_time == second.t
    assert health.tick_seconds is not None and health.tick_seconds > 0
    assert store.latest().host is not None and store.latest().host.load1 == 0.5


def test_not_supported_power_and_gpm_cost_only_those_fields(make_sampler) -> None:
    stub = NvmlStub([StubGpu(0), StubGpu(1, gpm=False, not_supported={
        "nvmlDeviceGetPowerUsage", "nvmlGpmQueryDeviceSupport"})])
    sampler, store = make_sampler(stub)
    for _ in range(4):
        sampler.tick()
    g0, g1 = store.latest().gpus
    assert g0.power_watts == 312.5 and g0.sm_active is not None
    assert g1.power_watts is None
    assert g1.sm_active is None and g1.tensor_active is None
    assert not sampler.infos[1].gpm_supported
    assert g1.util == 0.75 and g1.power_limit_watts == 700.0 and g1.temp_celsius == 61.0
    # not supported is learnt on the first ask and never asked again
    assert stub.count("nvmlDeviceGetPowerUsage", 1) == 1
    assert stub.count("nvmlDeviceGetPowerUsage", 0) == 4
    assert stub.count("nvmlGpmSampleGet", 1) == 0
    assert store.latest().health.errors_total == {}


def test_lost_gpu_is_marked_and_left_alone_while_others_go_on(make_sampler) -> None:
    stub = NvmlStub([StubGpu(0), StubGpu(1, lost_after=2)])
    sampler, store = make_sampler(stub)
    for _ in range(2):
        snap = sampler.tick()
        assert not snap.gpus[1].lost
    snap = sampler.tick()
    g0, g1 = snap.gpus
    assert g1.lost and g1.uuid == stub.gpus[1].uuid
    assert g1.util is None and g1.power_watts is None
    assert g0.util == 0.75 and not g0.lost
    assert snap.health.errors_total.get("gpu1_lost") == 1

    calls_to_gpu1 = sum(n for (fn, i), n in stub.calls.items() if i == 1)
    for _ in range(3):
        snap = sampler.tick()
    assert snap.gpus[1].lost and snap.gpus[0].util == 0.75
    assert sum(n for (fn, i), n in stub.calls.items() if i == 1) == calls_to_gpu1
    assert snap.health.errors_total.get("gpu1_lost") == 1
    assert store.gpu_history(1)[-1].lost


def test_gpu_failing_every_call_becomes_lost_one_failing_field_does_not(make_sampler) -> None:
    stub = NvmlStub([StubGpu(0, failing={"nvmlDeviceGetTemperature"}), StubGpu(1)])
    sampler, _store = make_sampler(stub)
    sampler.tick()
    stub.gpus[1].failing = {"*"}
    for _ in range(5):
        snap = sampler.tick()
    g0, g1 = snap.gpus
    assert g0.temp_celsius is None and g0.util == 0.75 and not g0.lost
    assert snap.health.errors_total["gpu0"] == 6  # one per tick, the field only
    assert g1.lost
    assert snap.health.errors_total["gpu1_lost"] == 1
    assert snap.health.errors_total["gpu1"] > 0


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
                                  pynvml.NVML_ERROR_LIBRARY_NOT_FOUND])
def test_no_driver_host_metrics_go_on_and_it_is_said_once(make_sampler, caplog, code) -> None:
    caplog.set_level(logging.WARNING, logger="gpuwatch.collect.sampler")
    stub = NvmlStub([StubGpu(0)], init_error=code)
    sampler, store = make_sampler(stub)
    assert not sampler.nvml_available
    assert sampler.infos == ()
    for _ in range(3):
        snap = sampler.tick()
    assert not snap.nvml_available and snap.gpus == ()
    assert snap.host is not None
    assert store.latest().health.ticks_total == 3
    said = [r for r in caplog.records if "no NVIDIA GPU/driver found" in r.getMessage()]
    assert len(said) == 1
    assert str(pynvml.NVMLError(code)) in said[0].getMessage()
    sampler.stop()
    assert stub.shutdowns == 0  # nvmlShutdown only after a successful nvmlInit


# the GPUs are read one after another: a hung call in the first must not hold the rest
@pytest.mark.parametrize("hung", [0, 1, 2])
def test_hung_call_stalls_only_its_gpu_and_the_tick_publishes(make_sampler, hung) -> None:
    stub = NvmlStub([StubGpu(0), StubGpu(1), StubGpu(2)])
    sampler, store = make_sampler(stub, interval=0.5)
    sampler.tick()
    stub.gpus[hung].hang("nvmlDeviceGetTemperature")
    others = [i for i in range(3) if i != hung]

    snap = sampler.tick()
    assert stub.gpus[hung].blocked.is_set()  # the tick came back while the call is stuck
    assert store.latest() is not None and store.latest().t == snap.t
    for i in others:
        assert snap.gpus[i].util == 0.75 and snap.gpus[i].temp_celsius == 61.0
    g = snap.gpus[hung]
    assert g.util is None and g.temp_celsius is None and not g.lost
    assert snap.health.errors_total[f"gpu{hung}_stalled"] == 1

    asked = stub.count("nvmlDeviceGetUtilizationRates", hung)
    for n in (2, 3):
        snap = sampler.tick()
        assert stub.gpus[hung].blocked.is_set()
        # no more work while stuck
        assert stub.count("nvmlDeviceGetUtilizationRates", hung) == asked
        assert [snap.gpus[i].util for i in others] == [0.75, 0.75]
        assert snap.gpus[hung].util is None
        assert snap.health.errors_total[f"gpu{hung}_stalled"] == n
        assert not any(f"gpu{i}_stalled" in snap.health.errors_total for i in others)

    stub.gpus[hung].release()
    wait_for(lambda: sampler.tick().gpus[hung].util == 0.75, f"GPU {hung} answers again")
    assert [g.util for g in sampler.tick().gpus] == [0.75] * 3


@pytest.mark.parametrize("alarm", [True, False], ids=["alarm", "no-timerfd"])
@pytest.mark.parametrize("hung", [0, 1])
def test_started_loop_a_hung_gpu_stalls_only_itself_and_ticks_go_on(make_sampler, monkeypatch,
                                                                      hung, alarm) -> None:
    if not alarm:  # a system without timerfd: the loop looks at every tick
        monkeypatch.setattr(sampler_mod, "make_alarm", lambda: None)
    stub = NvmlStub([StubGpu(0), StubGpu(1)])
    other = 1 - hung
    sampler, store = make_sampler(stub, interval=0.1)
    sampler.start()
    # (the alarm is there wherever the system has a timerfd)
    assert (sampler._alarm is None) == (not alarm or not _has_timerfd())
    wait_for(lambda: store.latest().health.ticks_total >= 3, "three ticks")
    snap = store.latest()
    assert [g.util for g in snap.gpus] == [0.75, 0.75]
    assert {g.t for g in snap.gpus} == {snap.t}  # one tick, one time: replay groups by it
    assert snap.health.errors_total == {}

    stub.gpus[hung].hang("nvmlDeviceGetTemperature")
    wait_for(stub.gpus[hung].blocked.is_set, f"GPU {hung} stuck in NVML")
    ticks = store.latest().health.ticks_total
    wait_for(lambda: store.latest().health.ticks_total >= ticks + 5, "five more ticks")
    snap = store.latest()
    assert stub.gpus[hung].blocked.is_set()
    assert snap.gpus[other].util == 0.75 and snap.gpus[other].t == snap.t
    assert snap.gpus[hung].util is None and not snap.gpus[hung].lost
    assert snap.health.errors_total[f"gpu{hung}_stalled"] >= 4
    assert f"gpu{other}_stalled" not in snap.health.errors_total
    # nothing waits on a stuck GPU: the ticks keep their pace (0.1 s) while it hangs
    assert snap.health.tick_seconds < 0.05

    stub.gpus[hung].release()
    wait_for(lambda: store.latest().gpus[hung].util == 0.75, f"GPU {hung} answers again")
    # the reader that was stuck leaves once its call returns: one reader reads them all
    wait_for(lambda: [t.name for t in threading.enumerate()].count("gpuwatch-gpu-reader")
             == 1, "one reader left")


def test_a_gpm_call_stuck_on_one_gpu_costs_the_others_only_their_gpm(make_sampler) -> None:
    # GPM calls are serialized across GPUs (concurrent ones crashed NVML on a 2x H200
    # host); a GPU stuck inside GPM must not stall the others' cheap fields
    stub = NvmlStub([StubGpu(0), StubGpu(1)])
    sampler, store = make_sampler(stub, interval=0.5)
    sampler.tick()
    snap = sampler.tick()
    assert snap.gpus[0].sm_active is not None and snap.gpus[1].sm_active is not None
    stub.gpus[1].hang("nvmlGpmSampleGet")
    sampler.tick()
    wait_for(stub.gpus[1].blocked.is_set, "GPU 1 stuck inside GPM")
    snap = sampler.tick()  # GPU 1 now holds the GPM lock, stuck
    g0, g1 = snap.gpus
    assert g0.util == 0.75 and g0.temp_celsius == 61.0  # cheap fields of GPU 0 arrive
    assert g0.sm_active is None  # its GPM waited for the lock no longer than it may
    assert g1.util is None and not g1.lost
    stub.gpus[1].release()
    wait_for(lambda: sampler.tick().gpus[0].sm_active is not None, "GPU 0's GPM again")
    wait_for(lambda: sampler.tick().gpus[1].sm_active is not None, "GPU 1's GPM again")


def test_ticks_keep_to_the_grid_and_skip_slots_after_an_overrun(make_sampler) -> None:
    clock = SimClock(1000.0)
    costs = [0.01, 0.01, 0.25, 0.01, 0.01, 0.01]  # the third tick overruns by 2.5 slots
    starts: list[float] = []

    def tick_cost() -> None:
        starts.append(clock.now)
        clock.now += costs[len(starts) - 1]

    def sim_wait(delay: float) -> bool:
        assert delay > 0
        clock.now += delay
        return len(starts) >= len(costs)  # True ends the loop, as stop() would

    sampler, store = make_sampler(NvmlStub([StubGpu(0)]), interval=0.1, clock=clock,
                                  host=FakeHost(on_sample=tick_cost))
    sampler._wait = sim_wait
    sampler.reader_publishes = False  # the loop publishes every tick, on the simulated clock
    sampler.start()
    wait_for(lambda: store.latest().health.ticks_total == len(costs), "six ticks")
    offsets = [round(t - 1000.0, 6) for t in starts]
    # slots 3 and 4 fall inside the overrun: skipped, not bunched up afterwards
    assert offsets == pytest.approx([0.0, 0.1, 0.2, 0.5, 0.6, 0.7])
    assert sampler.skipped_slots == 2


def test_xid_events_are_counted_per_gpu_and_code(make_sampler) -> None:
    stub = NvmlStub([StubGpu(0), StubGpu(1, events=False)])
    sampler, _store = make_sampler(stub)
    sampler.tick()  # the reader's first poll after it registers GPU 0 for XID events
    wait_for(lambda: stub.event_sets and 0 in stub.event_sets[0].registered,
             "GPU 0 registered for XID events")
    assert stub.inject_xid(0, 79) and stub.inject_xid(0, 79) and stub.inject_xid(0, 48)
    assert not stub.inject_xid(1, 79)  # no event support: skipped
    snap = wait_for(lambda: (s := sampler.tick()).gpus[0].xid_total == {79: 2, 48: 1} and s,
                    "XIDs counted")
    assert snap.gpus[1].xid_total == {}
    assert snap.health.errors_total == {}  # a GPU without events is no error
    sampler.stop()
    assert stub.event_sets[0].freed


@pytest.mark.parametrize("alarm", [True, False], ids=["alarm", "no-timerfd"])
def test_started_loop_an_xid_poll_stuck_in_nvml_costs_no_gpu_its_fields(
        make_sampler, monkeypatch, alarm) -> None:
    if not alarm:
        monkeypatch.setattr(sampler_mod, "make_alarm", lambda: None)
    stub = NvmlStub([StubGpu(0), StubGpu(1)])
    sampler, store = make_sampler(stub, interval=0.1)
    sampler.start()
    wait_for(lambda: stub.event_sets and stub.event_sets[0].registered == {
        0: pynvml.nvmlEventTypeXidCriticalError, 1: pynvml.nvmlEventTypeXidCriticalError},
        "both GPUs registered for XID events at the reader's first poll")
    # no thread of its own: the reader polls the queued events after each tick
    assert not [t for t in threading.enumerate() if "xid" in t.name]
    stub.inject_xid(1, 79)

    def xids() -> list[dict[int, int]]:
        # (the newest snapshot can still be one from before the GPUs were attached)
        return [g.xid_total for g in store.latest().gpus]

    wait_for(lambda: xids() == [{}, {79: 1}], "the XID counted")

    stub.hang_event_wait()
    assert stub.event_wait_blocked.wait(5), "the reader stuck in nvmlEventSetWait"
    ticks = store.latest().health.ticks_total
    wait_for(lambda: store.latest().health.ticks_total >= ticks + 5, "five more ticks")
    snap = store.latest()
    # a fresh reader took the GPUs over: every field of both while the poll still hangs.
    # The tick after the hang is the one that finds the reader stuck and starts another; a
    # GPU misses at most that one (where the new reader's first reads outlast the read
    # deadline: a loaded test machine), never the ticks after it
    assert stub.event_wait_blocked.is_set()
    assert [g.util for g in snap.gpus] == [0.75, 0.75]
    assert {g.t for g in snap.gpus} == {snap.t}
    stalled = {k: n for k, n in snap.health.errors_total.items() if "stalled" in k}
    assert all(n <= 1 for n in stalled.values()), stalled

    stub.inject_xid(0, 48)  # queued while the wait is held
    stub.release_event_wait()
    wait_for(lambda: xids() == [{48: 1}, {79: 1}], "the XIDs counted again")
    wait_for(lambda: [t.name for t in threading.enumerate()].count("gpuwatch-gpu-reader")
             == 1, "one reader left")
    sampler.stop()
    assert stub.event_sets[0].freed and stub.shutdowns == 1


def test_slow_fields_arrive_on_their_cadence_off_the_tick(make_sampler) -> None:
    clock = SimClock()
    me = os.getpid()
    stub = NvmlStub([StubGpu(0, processes=[(me, GiB)], process_util=[(me, 40), (me, 60)])])
    sampler, _store = make_sampler(stub, slow_interval=10.0, energy_interval=10.0, clock=clock)

    snap = wait_for(lambda: (s := sampler.tick()).gpus[0].energy_joules is not None and s,
                    "first slow read")
    g = snap.gpus[0]
    assert g.energy_joules == pytest.approx(2281.545)
    assert g.pcie_tx_bytes_per_second == 1550 * 1024
    assert g.pcie_rx_bytes_per_second == 2048 * 1024
    assert g.pcie_replay_total == 1
    assert (g.ecc_corrected_total, g.ecc_uncorrected_total) == (3, 0)
    assert g.remapped_rows_correctable == 0 and g.remapped_rows_pending is False
    assert g.processes[0].sm_util == pytest.approx(0.5)  # mean of NVML's samples
    assert stub.count("nvmlDeviceGetTotalEnergyConsumption", 0) == 1

    stub.gpus[0].energy_mj = 3_000_000
    clock.now += 5.0  # half a slow interval: carried, not re-read
    snap = sampler.tick()
    assert snap.gpus[0].energy_joules == pytest.approx(2281.545)
    assert stub.count("nvmlDeviceGetTotalEnergyConsumption", 0) == 1

    clock.now += 5.0
    wait_for(lambda: sampler.tick().gpus[0].energy_joules == pytest.approx(3000.0),
             "second slow read")
    assert stub.count("nvmlDeviceGetTotalEnergyConsumption", 0) == 2

    # a slow call that hangs (PCIe throughput takes 20 ms on a good day) never holds a tick
    stub.gpus[0].hang("nvmlDeviceGetPcieThroughput")
    clock.now += 10.0
    sampler.tick()
    wait_for(stub.gpus[0].blocked.is_set, "slow read stuck")
    stub.gpus[0].util = (12, 3)
    clock.now += 10.0
    snap = sampler.tick()
    assert stub.gpus[0].blocked.is_set()
    assert snap.gpus[0].util == 0.12  # fresh fast fields
    assert snap.gpus[0].energy_joules == pytest.approx(3000.0)  # newest slow values carried
    assert snap.health.errors_total["gpu0_slow_stalled"] == 1
    assert "gpu0_stalled" not in snap.health.errors_total


def _slow_round(sampler: Sampler, stub: NvmlStub, clock: SimClock, pcie_kb: int) -> Any:
    """Moves the clock to the next slow round (every 10 s) and waits until its fields are
    in: every GPU's PCIe transmit rate set to ``pcie_kb`` KiB/s shows in a tick."""
    for g in stub.gpus:
        g.pcie_tx_kb = pcie_kb
    clock.now += 10.0

    def arrived() -> Any:
        snap = sampler.tick()
        return all(g.pcie_tx_bytes_per_second == pcie_kb * 1024 for g in snap.gpus) and snap

    return wait_for(arrived, f"slow round with {pcie_kb} KiB/s")


def test_the_energy_counter_is_read_on_the_slow_rounds_nearest_its_own_interval(
        make_sampler) -> None:
    # ~4 ms of CPU a read on an H200, more than the rest of the slow tier: every 2nd round
    # here (energy_interval 20 s over a slow tier of 10 s), carried over in between
    clock = SimClock()
    stub = NvmlStub([StubGpu(0), StubGpu(1)])
    sampler, _store = make_sampler(stub, slow_interval=10.0, energy_interval=20.0, clock=clock)
    assert sampler.energy_every == 2
    gpu = stub.gpus[0]

    def slow_round(pcie_kb: int) -> Any:
        return _slow_round(sampler, stub, clock, pcie_kb)

    snap = slow_round(100)
    seen = [(snap.gpus[0].energy_joules, stub.count("nvmlDeviceGetTotalEnergyConsumption", 0))]
    for k in range(1, 5):
        gpu.energy_mj = 1_000_000 * k
        snap = slow_round(100 + k)
        assert snap.gpus[0].pcie_tx_bytes_per_second == (100 + k) * 1024  # every round
        seen.append((snap.gpus[0].energy_joules,
                     stub.count("nvmlDeviceGetTotalEnergyConsumption", 0)))
    # read on rounds 0, 2 and 4; the rounds between export the last value, never none
    assert seen == [(pytest.approx(2281.545), 1), (pytest.approx(2281.545), 1),
                    (pytest.approx(2000.0), 2), (pytest.approx(2000.0), 2),
                    (pytest.approx(4000.0), 3)]
    assert stub.count("nvmlDeviceGetTotalEnergyConsumption", 1) == 3


def test_an_energy_read_that_fails_is_asked_again_at_the_next_slow_round(make_sampler) -> None:
    clock = SimClock()
    stub = NvmlStub([StubGpu(0), StubGpu(1, not_supported={
        "nvmlDeviceGetTotalEnergyConsumption"})])
    sampler, _store = make_sampler(stub, slow_interval=10.0, energy_interval=30.0, clock=clock)
    assert sampler.energy_every == 3
    gpu = stub.gpus[0]
    energy = "nvmlDeviceGetTotalEnergyConsumption"

    def slow_round(pcie_kb: int) -> Any:
        return _slow_round(sampler, stub, clock, pcie_kb)

    gpu.failing.add(energy)  # the first round's read fails
    seen = [slow_round(1).gpus[0].energy_joules]
    gpu.failing.discard(energy)
    for k in range(2, 6):
        seen.append(slow_round(k).gpus[0].energy_joules)
    # no value while it failed; asked again at once, then every 3rd round from there
    assert seen == [None, pytest.approx(2281.545), pytest.approx(2281.545),
                    pytest.approx(2281.545), pytest.approx(2281.545)]
    assert stub.count(energy, 0) == 3  # rounds 1 (failed), 2 and 5
    # a GPU without the counter: asked once, never again; its rounds go on
    assert stub.count(energy, 1) == 1
    assert sampler.tick().gpus[1].energy_joules is None


def test_the_energy_interval_is_at_least_one_slow_round(make_sampler) -> None:
    stub = NvmlStub([StubGpu(0)])
    for slow, energy, every in ((30.0, 60.0, 2), (30.0, 30.0, 1), (10.0, 25.0, 2),
                                (10.0, 26.0, 3), (60.0, 60.0, 1), (0.5, 60.0, 120)):
        sampler, _ = make_sampler(stub, slow_interval=slow, energy_interval=energy)
        assert sampler.energy_every == every, (slow, energy)
    sampler, _ = make_sampler(stub, slow_interval=60.0, energy_interval=1.0)
    assert sampler.energy_every == 1  # never less than once a round
    with pytest.raises(ValueError, match="energy_interval must be positive"):
        Sampler(Store(), nvml_module=stub, energy_interval=0.0)


def _vanished_pid() -> int:
    pid = max(psutil.pids()) + 7919
    while psutil.pid_exists(pid):
        pid += 1
    return pid


def test_processes_get_name_and_user_and_a_vanished_pid_costs_only_itself(make_sampler) -> None:
    me = psutil.Process()
    gone = _vanished_pid()
    stub = NvmlStub([StubGpu(0, processes=[(me.pid, 2 * GiB), (gone, GiB)],
                             graphics_processes=[(me.pid, 2 * GiB)])])
    host = FakeHost()
    sampler, _store = make_sampler(stub, host=host)
    for _ in range(2):
        snap = sampler.tick()
    procs = {p.pid: p for p in snap.gpus[0].processes}
    assert set(procs) == {me.pid, gone}
    assert procs[me.pid].mem_used_bytes == 2 * GiB  # compute + graphics context: counted once
    assert procs[me.pid].name == me.name()
    assert procs[me.pid].user == me.username()
    assert procs[gone].mem_used_bytes == GiB
    assert procs[gone].name is None and procs[gone].user is None
    assert host.pids[-1] == {me.pid, gone}
    assert snap.health.errors_total == {}


def test_versioned_fallbacks_and_a_missing_function_is_logged_once(make_sampler, caplog) -> None:
    caplog.set_level(logging.INFO, logger="gpuwatch.collect.nvml")
    stub = NvmlStub([StubGpu(0), StubGpu(1)],
                    missing=("nvmlDeviceGetCurrentClocksEventReasons",
                             "nvmlDeviceGetMemoryInfo_v2"))
    sampler, _store = make_sampler(stub)
    for _ in range(3):
        snap = sampler.tick()
    for g in snap.gpus:
        assert g.clock_event_reasons == 0x4  # from the older "throttle reasons" name
        assert g.mem_used_bytes == 20 * GiB + 512 * 2**20  # v1: reserved counts as used
    said = [r for r in caplog.records
            if "nvmlDeviceGetCurrentClocksEventReasons" in r.getMessage()]
    assert len(said) == 1
    assert stub.count("nvmlDeviceGetCurrentClocksEventReasons", 0) == 1
    assert snap.health.errors_total == {}


def test_a_failing_host_source_costs_only_the_host(make_sampler) -> None:
    class BrokenHost:
        def sample(self, t: float, gpu_pids: Collection[int],
                   mains: Collection[int] = ()) -> HostSample:
            raise RuntimeError("psutil exploded")

    sampler, store = make_sampler(NvmlStub([StubGpu(0)]), host=BrokenHost())
    snap = sampler.tick()
    assert snap.host is None and snap.gpus[0].util == 0.75
    assert store.latest().health.errors_total == {"host": 1}
    assert store.latest().health.last_success_time is None


def test_a_host_source_failing_every_tick_logs_one_traceback(make_sampler, caplog) -> None:
    class BrokenHost:
        fail = True

        def sample(self, t: float, gpu_pids: Collection[int],
                   mains: Collection[int] = ()) -> HostSample | None:
            if self.fail:
                raise RuntimeError("psutil exploded")
            return None

    host = BrokenHost()
    sampler, store = make_sampler(NvmlStub([StubGpu(0)]), host=host)
    with caplog.at_level(logging.INFO, logger="gpuwatch.collect.sampler"):
        for _ in range(5):
            sampler.tick()
        host.fail = False
        sampler.tick()
    failed = [r for r in caplog.records if "host sample failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None
    assert store.latest().health.errors_total == {"host": 5}
    assert any("host sampling recovered" in r.getMessage() for r in caplog.records)


def test_default_host_layer_is_used_when_none_given() -> None:
    sampler = Sampler(Store(), nvml_module=NvmlStub(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    try:
        snap = sampler.tick()
        assert snap.host is not None and snap.host.mem_total_bytes
    finally:
        sampler.stop()


@pytest.mark.parametrize("alarm", [True, False], ids=["alarm", "no-timerfd"])
def test_the_loop_looks_only_at_ticks_the_reader_did_not_publish(make_sampler, monkeypatch,
                                                                 alarm) -> None:
    """The reader publishes each tick itself; the loop thread wakes at a tick only to
    publish one that is late. With the alarm it sleeps through the reader's ticks; without
    a timerfd it looks at every one."""
    if not alarm:
        monkeypatch.setattr(sampler_mod, "make_alarm", lambda: None)
    elif not _has_timerfd():
        pytest.skip("no timerfd on this system")
    stub = NvmlStub([StubGpu(0), StubGpu(1)])
    sampler, store = make_sampler(stub, interval=0.1)
    looks: list[int] = []
    tick_slot = sampler._tick_slot

    def counted(slot: int) -> None:
        looks.append(slot)
        tick_slot(slot)

    sampler._tick_slot = counted  # the loop calls it through the instance
    sampler.start()
    wait_for(lambda: store.latest() is not None
             and store.latest().health.ticks_total >= 20, "twenty ticks", timeout=30)
    sampler.stop()
    ticks = store.latest().health.ticks_total
    assert sampler._by_reader >= 15  # the reader published (nearly) all of them
    if alarm:
        # slot 0 before the reader keeps the grid, then only a tick the reader was late
        # for (a busy test machine): far fewer than the ticks
        assert len(looks) < ticks / 2, (len(looks), ticks)
    else:
        assert len(looks) >= ticks - 2, (len(looks), ticks)
    assert sampler.skipped_slots < ticks / 4  # counted where slots are published


def test_start_ticks_in_background_and_stop_ends_every_thread(make_sampler) -> None:
    stub = NvmlStub([StubGpu(0), StubGpu(1)])
    sampler, store = make_sampler(stub, interval=0.1)
    sampler.start()
    wait_for(lambda: store.latest().health.ticks_total >= 3, "three ticks")
    sampler.stop()
    ours = [t for t in threading.enumerate() if t.name.startswith(("gpuwatch-gpu",
                                                                     "gpuwatch-xid",
                                                                     "gpuwatch-sampler"))]
    assert ours == []
    assert stub.shutdowns == 1
    ticks = store.latest().health.ticks_total
    time.sleep(0.3)
    assert store.latest().health.ticks_total == ticks


@pytest.mark.parametrize("interval", [0.05, 61.0])
def test_interval_out_of_range_is_refused(interval: float) -> None:
    with pytest.raises(ValueError, match="interval"):
        Sampler(Store(), interval=interval, nvml_module=NvmlStub(), host=FakeHost())


def test_snapshot_is_what_the_store_serves(make_sampler) -> None:
    sampler, store = make_sampler(NvmlStub([StubGpu(0)]))
    seen: list[Any] = []
    store.subscribe(seen.append)
    snap = sampler.tick()
    assert isinstance(snap, Snapshot)
    assert store.latest().gpus == snap.gpus and store.latest().infos == sampler.infos
    assert [type(s).__name__ for s in seen] == ["GpuSample", "HostSample"]
