"""The daemon's end of the hook: a real Unix datagram socket, real datagrams, a real Store.

Nothing here imports torch (the daemon side must not): datagrams are built with the same
protocol module the hook uses, or written by hand when they are meant to be bad.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for

from gpuwatch.errors import UserError
from gpuwatch.job import protocol
from gpuwatch.job.receiver import HookReceiver, probe
from gpuwatch.samples import GpuInfo, JobStats, Snapshot, StepsSample
from gpuwatch.store import Store

REPO = Path(__file__).resolve().parents[1]



@pytest.fixture
def sock_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # AF_UNIX paths are short (107 bytes): pytest's tmp_path can be too long
    d = Path(os.path.join("/tmp", f"gw-{os.getpid()}-{time.monotonic_ns()}"))
    d.mkdir()
    yield d
    for p in d.glob("**/*"):
        if not p.is_dir():
            p.unlink()
    for p in sorted(d.glob("**/*"), reverse=True):
        p.rmdir()
    d.rmdir()


@pytest.fixture
def live(sock_dir: Path) -> Iterator[tuple[Store, HookReceiver]]:
    store = Store()
    rec = HookReceiver(store, str(sock_dir / "run" / "hook.sock"), vanish_after=0.5)
    rec.start()
    yield store, rec
    rec.stop()


def send(path: str, data: bytes) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        s.sendto(data, path)
    finally:
        s.close()


def report(**fields: object) -> dict:
    header = {"kind": "report", "pid": os.getpid(), "seq": 0, "t": time.time(),
              "steps_total": 0, "skipped_total": 0}
    header.update(fields)
    return header


def _counted(store: Store) -> int:
    # Health is filled in at publish(); read the store's counters the way a tick would
    store.publish(Snapshot(t=time.time()))
    h = store.latest().health
    return h.hook_messages_total + sum(h.hook_messages_dropped_total.values())


def _has_group(name: str) -> bool:
    import grp

    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def test_socket_is_created_group_writable_and_removed(sock_dir: Path) -> None:
    path = sock_dir / "made" / "here" / "hook.sock"
    rec = HookReceiver(Store(), str(path))
    rec.start()
    try:
        st = os.stat(path)
        assert stat.S_ISSOCK(st.st_mode)
        # group-writable only in the group gpuwatch (tests/test_security_hook.py)
        assert stat.S_IMODE(st.st_mode) == (0o660 if _has_group("gpuwatch") else 0o600)
        assert probe(str(path))
    finally:
        rec.stop()
    assert not path.exists()
    assert not probe(str(path))


def test_stale_socket_is_replaced_but_live_one_and_files_are_not(sock_dir: Path) -> None:
    path = str(sock_dir / "hook.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(path)
    dead.close()  # the file stays: a receiver that died
    rec = HookReceiver(Store(), path)
    rec.start()
    try:
        with pytest.raises(UserError, match="another receiver"):
            HookReceiver(Store(), path).start()
    finally:
        rec.stop()
    regular = sock_dir / "not-a-socket"
    regular.write_text("keep me")
    with pytest.raises(UserError, match="not a socket"):
        HookReceiver(Store(), str(regular)).start()
    assert regular.read_text() == "keep me"


def test_a_report_becomes_job_stats_steps_and_config(live: tuple[Store, HookReceiver]) -> None:
    store, rec = live
    steps = [protocol.StepRecord(step=i, t=1000.0 + i, step_seconds=0.1, data_wait_seconds=0.025,
                                 batch_size=32, skipped=(i == 2)) for i in range(4)]
    window = {"steps": 4, "skipped": 1, "timed": 4, "step_seconds": 0.4,
              "data_wait_seconds": 0.1, "samples": 128, "sample_seconds": 0.4}
    send(rec.socket_path, protocol.encode(report(
        rank=1, local_rank=1, world_size=2, gpu=3, steps_total=4, skipped_total=1, window=window,
        loss_scale=1024.0, mem_allocated_bytes=10, mem_reserved_bytes=20,
        max_mem_allocated_bytes=15, config={"num_workers": 4, "autocast_dtype": "bfloat16"}),
        steps))
    job: JobStats = wait_for(lambda: store.latest().jobs and store.latest().jobs[0], "a job")
    assert (job.pid, job.rank, job.gpu) == (os.getpid(), 1, 3)
    assert (job.steps_total, job.skipped_steps_total) == (4, 1)
    assert job.step_seconds == pytest.approx(0.1)
    assert job.data_wait_ratio == pytest.approx(0.25)
    assert job.samples_per_second == pytest.approx(320.0)
    assert job.loss_scale == 1024.0
    assert (job.mem_allocated_bytes, job.mem_reserved_bytes, job.max_mem_allocated_bytes) == \
        (10, 20, 15)
    assert job.alive and job.exit_reason is None
    got = store.step_history()
    assert [s.step for s in got] == [0, 1, 2, 3]
    assert [s.skipped for s in got] == [False, False, True, False]
    assert {(s.pid, s.rank, s.gpu, s.batch_size) for s in got} == {(os.getpid(), 1, 3, 32)}
    # the scale and memory are read once per report: they sit on its last step
    assert got[-1].loss_scale == 1024.0 and got[0].loss_scale is None
    [config] = store.configs()
    assert config.values == {"num_workers": 4, "autocast_dtype": "bfloat16"}
    assert (config.pid, config.rank) == (os.getpid(), 1)


def test_kernel_pid_wins_over_the_claimed_one(live: tuple[Store, HookReceiver]) -> None:
    store, rec = live
    send(rec.socket_path, protocol.encode(report(pid=999_999, steps_total=1)))
    job = wait_for(lambda: store.latest().jobs and store.latest().jobs[0], "a job")
    assert job.pid == os.getpid()


def test_heartbeat_keeps_the_last_rates_and_exit_marks_dead(
        live: tuple[Store, HookReceiver]) -> None:
    store, rec = live
    window = {"steps": 2, "timed": 2, "step_seconds": 1.0, "data_wait_seconds": 0.5}
    send(rec.socket_path, protocol.encode(report(seq=0, steps_total=2, window=window)))
    send(rec.socket_path, protocol.encode(report(seq=1, steps_total=2)))
    send(rec.socket_path, protocol.encode(report(kind="exit", seq=2, steps_total=2,
                                                 exit_reason="oom")))
    job = wait_for(lambda: store.latest().jobs and not store.latest().jobs[0].alive
                   and store.latest().jobs[0], "the exit report")
    assert job.step_seconds == pytest.approx(0.5)
    assert job.data_wait_ratio == pytest.approx(0.5)
    assert job.exit_reason == "oom"


BAD = {
    "not json": b"\x00\xffnot json",
    "a list": b"[1, 2, 3]",
    "no version": json.dumps({"kind": "report", "pid": 1, "t": 1.0}).encode(),
    "bad kind": json.dumps({"v": 1, "kind": "hello", "pid": 1, "t": 1.0}).encode(),
    "negative pid": json.dumps({"v": 1, "kind": "report", "pid": -4, "t": 1.0}).encode(),
    "steps of unequal length": json.dumps({"v": 1, "kind": "report", "pid": 1, "t": 1.0,
                                           "steps": {"step": [1, 2], "t": [1.0]}}).encode(),
    "NaN": b'{"v": 1, "kind": "report", "pid": 1, "t": NaN}',
    "string counter": json.dumps({"v": 1, "kind": "report", "pid": 1, "t": 1.0,
                                  "steps_total": "7"}).encode(),
}


def test_bad_datagrams_are_dropped_and_counted_by_reason(
        live: tuple[Store, HookReceiver]) -> None:
    store, rec = live
    for data in BAD.values():
        send(rec.socket_path, data)
    send(rec.socket_path, json.dumps({"v": 2, "kind": "report", "pid": 1, "t": 1.0}).encode())
    send(rec.socket_path, b"{" + b" " * 70_000 + b"}")  # over the 60 KB bound
    send(rec.socket_path, protocol.encode(report(steps_total=5)))  # still works after all that
    wait_for(lambda: _counted(store) >= len(BAD) + 3, "every datagram")
    health = store.latest().health
    assert health.hook_messages_dropped_total == {"malformed": len(BAD), "version": 1,
                                                  "oversized": 1}
    assert health.hook_messages_total == 1
    assert [j.steps_total for j in store.latest().jobs] == [5]


def test_silent_job_whose_process_is_gone_is_vanished(
        live: tuple[Store, HookReceiver]) -> None:
    store, rec = live
    code = ("import socket, sys, time; from gpuwatch.job import protocol; "
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); "
            "s.sendto(protocol.encode({'kind': 'report', 'pid': 1, 'seq': 0, 't': time.time(), "
            "'steps_total': 3}), sys.argv[1]); print('sent', flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code, rec.socket_path], cwd=REPO,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "sent"
        wait_for(lambda: any(j.pid == child.pid for j in store.latest().jobs), "the child's job")
        # alive while the process exists, however long it is silent
        rec.flush()
        assert [j.alive for j in store.latest().jobs if j.pid == child.pid] == [True]
    finally:
        child.kill()
        child.wait()
    job = wait_for(lambda: next((j for j in store.latest().jobs
                                 if j.pid == child.pid and not j.alive), None), "vanished")
    assert job.exit_reason == "vanished"
    assert job.steps_total == 3


def test_gpu_index_comes_from_the_uuid_when_the_daemon_knows_it(
        live: tuple[Store, HookReceiver]) -> None:
    store, rec = live
    store.publish(Snapshot(t=time.time(), infos=(GpuInfo(gpu=0, uuid="GPU-aaaa"),
                                                 GpuInfo(gpu=1, uuid="GPU-BBBB"))))
    # CUDA_VISIBLE_DEVICES=1 makes the job's cuda:0 the host's GPU 1
    send(rec.socket_path, protocol.encode(report(gpu=None, uuid="GPU-bbbb", steps_total=1)))
    job = wait_for(lambda: store.latest().jobs and store.latest().jobs[0], "a job")
    assert job.gpu == 1


def test_encode_keeps_the_newest_steps_that_fit_and_counts_the_rest() -> None:
    steps = [protocol.StepRecord(step=i, t=1.7e9 + i / 1000, step_seconds=0.001234567,
                                 data_wait_seconds=0.0001234, batch_size=64, skipped=False)
             for i in range(5000)]
    data = protocol.encode(report(steps_total=5000), steps)
    assert len(data) <= protocol.MAX_DATAGRAM_BYTES
    r = protocol.decode(data)
    assert 0 < len(r.steps) <= protocol.MAX_STEPS
    assert r.steps_omitted == 5000 - len(r.steps)
    assert r.steps[-1].step == 4999 and r.steps[0].step == 5000 - len(r.steps)
    small = protocol.encode(report(steps_total=5000), steps, max_bytes=4000)
    assert len(small) <= 4000 and protocol.decode(small).steps[-1].step == 4999


def test_steps_a_datagram_had_no_room_for_keep_their_place_in_time(
        live: tuple[Store, HookReceiver]) -> None:
    # a fast job's first report: 5000 steps of 1 ms back to back, more than a datagram
    # lists; the oldest go as sums, and the history must still begin where the job did
    store, rec = live
    t0 = time.time() - 6.0
    steps = [protocol.StepRecord(step=i, t=t0 + (i + 1) * 0.001, step_seconds=0.001,
                                 data_wait_seconds=0.0005) for i in range(5000)]
    window = {"steps": 5000, "skipped": 0, "timed": 5000, "step_seconds": 5.0,
              "data_wait_seconds": 2.5, "samples": 0, "sample_seconds": 0.0}
    data = protocol.encode(report(steps_total=5000, window=window), steps)
    assert protocol.decode(data).steps_omitted > 0
    send(rec.socket_path, data)
    wait_for(lambda: store.latest().jobs, "a job")
    store.flush_steps()
    history = store.step_history()
    summed = [s for s in history if isinstance(s, StepsSample)]
    assert summed and len(history) < 5000
    assert sum(getattr(s, "steps", 1) for s in history) == 5000
    begins = [s.begin_t if isinstance(s, StepsSample) else s.t - s.step_seconds
              for s in history]
    assert min(begins) == pytest.approx(t0, abs=0.01)  # the datagram rounds its times
    assert max(s.t for s in history) == pytest.approx(t0 + 5.0, abs=0.01)
    for s in summed:  # each line's span holds its steps' time, no less
        assert s.t - s.begin_t >= s.step_seconds - 0.01


def test_decode_reads_what_encode_writes_and_ignores_unknown_fields() -> None:
    data = protocol.encode(report(rank=0, loss_scale=float("inf"), config={"x": object()},
                                  future_field={"a": 1}),
                           [protocol.StepRecord(step=0, t=5.0, step_seconds=None)])
    r = protocol.decode(data)
    assert r.rank == 0
    assert r.loss_scale is None  # not representable in JSON: "not measured"
    assert isinstance(r.config["x"], str)
    assert r.steps == (protocol.StepRecord(step=0, t=5.0),)


def test_out_of_range_numbers_cost_only_their_datagram(
        live: tuple[Store, HookReceiver]) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from gpuwatch.serve.exporter import GpuwatchCollector

    store, rec = live
    me, now = os.getpid(), time.time()
    bad = [
        # a huge integer where a float is expected: math.isfinite() raises on it
        b'{"v":1,"kind":"report","pid":%d,"t":1%s}' % (me, b"0" * 400),
        # 1e999 parses as inf (JSON has no inf): a config value the recorder can't write
        b'{"v":1,"kind":"report","pid":%d,"t":%f,"config":{"lr":1e999}}' % (me, now),
        # integers no exporter float can hold
        json.dumps(report(seq=1, mem_allocated_bytes=10**400)).encode(),
        json.dumps(report(seq=1, steps={"step": [10**30], "t": [now]})).encode(),
    ]
    for data in bad:
        send(rec.socket_path, data)
    send(rec.socket_path, protocol.encode(report(seq=2, steps_total=5)))
    wait_for(lambda: _counted(store) >= len(bad) + 1, "every datagram")
    health = store.latest().health
    assert health.hook_messages_dropped_total == {"malformed": len(bad)}
    assert health.hook_messages_total == 1
    assert [j.steps_total for j in store.latest().jobs] == [5]
    assert store.configs() == []
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuwatchCollector(store.latest))
    text = generate_latest(registry).decode()
    assert "gpuwatch_train_steps_total" in text
    assert 'gpuwatch_errors_total{source="export_train"} 0.0' in text


def test_a_rate_over_a_denormal_duration_is_not_infinite(
        live: tuple[Store, HookReceiver]) -> None:
    store, rec = live
    window = {"steps": 1, "timed": 1, "step_seconds": 0.1, "samples": 10,
              "sample_seconds": 5e-324}
    send(rec.socket_path, protocol.encode(report(steps_total=1, window=window)))
    job = wait_for(lambda: store.latest().jobs and store.latest().jobs[0], "a job")
    assert job.samples_per_second is None


def test_configs_stay_bounded_and_go_with_their_job(sock_dir: Path) -> None:
    store = Store()
    rec = HookReceiver(store, str(sock_dir / "hook.sock"), forget_after=0.2)
    rec.start()
    try:
        # one process claiming ever new ranks keeps one configuration, not one per rank
        for seq in range(1, 51):
            send(rec.socket_path, protocol.encode(report(seq=seq, rank=seq, config={"n": seq})))
        wait_for(lambda: _counted(store) >= 50, "every datagram")
        assert [(c.rank, c.values) for c in store.configs()] == [(50, {"n": 50})]
        # a dead job is forgotten, and so is what it reported about its configuration
        send(rec.socket_path, protocol.encode(report(kind="exit", seq=51, rank=50)))
        wait_for(lambda: not store.latest().jobs and _counted(store) >= 51, "the job forgotten")
        assert store.configs() == []
    finally:
        rec.stop()


def test_a_step_stamped_far_ahead_keeps_the_step_history(
        live: tuple[Store, HookReceiver]) -> None:
    # the store trims history by the newest time it saw: one step stamped a year ahead
    # must not make it throw away every step before it
    store, rec = live
    now = time.time()

    def steps(*stamps: tuple[int, float]) -> list[protocol.StepRecord]:
        return [protocol.StepRecord(step=i, t=t, step_seconds=0.1) for i, t in stamps]

    send(rec.socket_path, protocol.encode(report(seq=1, steps_total=2),
                                          steps((0, now - 1.0), (1, now - 0.5))))
    wait_for(lambda: len(store.step_history()) == 2, "the first two steps")
    send(rec.socket_path, protocol.encode(report(seq=2, steps_total=3),
                                          steps((2, now + 365 * 86400))))
    wait_for(lambda: len(store.step_history()) == 3, "the third step")
    history = store.step_history()
    assert [s.step for s in history] == [0, 1, 2]
    assert history[-1].t <= time.time() + 10  # taken as now, not as next year
