"""Replaying recordings into a real Store, faster than real time."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import pytest
from conftest import RECORDINGS, REPO, read_recording, wait_for

from gpuwatch.errors import FileFormatError, UserError
from gpuwatch.samples import ConfigSample, GpuInfo, GpuSample, HostSample, StepSample, StepsSample
from gpuwatch.store import Store
from gpuwatch.trace.format import TraceWriter, make_meta
from gpuwatch.trace.replay import Replayer

SPEED = 40.0  # a 37 s recording plays in about a second


def recording(name: str) -> str:
    return str(next(p for p in RECORDINGS if p.name == name))


def raw_lines(path: str) -> list[dict]:
    return [json.loads(line) for line in read_recording(Path(path)).splitlines()[1:]]


def play_once(path: str, speed: float = SPEED) -> tuple[Store, Replayer]:
    store = Store(history_seconds=3600)
    replayer = Replayer(store, path, loop=False, speed=speed)
    replayer.start()
    assert replayer.wait(timeout=60), "the replay never reached its end"
    replayer.stop()
    return store, replayer


@pytest.mark.parametrize("path", [str(p) for p in RECORDINGS], ids=lambda p: Path(p).name)
def test_every_recording_replays_whole(path: str) -> None:
    raw = raw_lines(path)
    meta = json.loads(read_recording(Path(path)).split("\n", 1)[0])
    started = time.time()
    store, replayer = play_once(path)
    gpu_lines = [d for d in raw if d["kind"] == "gpu"]
    step_lines = [d for d in raw if d["kind"] == "step"]
    gpus = sorted({d["gpu"] for d in gpu_lines})
    # every tick became one snapshot per GPU, with the recorded values, at shifted times
    for g in gpus:
        mine = [d for d in gpu_lines if d["gpu"] == g]
        history = store.gpu_history(g)
        assert len(history) == len(mine)
        assert [h.util for h in history] == [d.get("util") for d in mine]
        assert [h.sm_active for h in history] == [d.get("sm_active") for d in mine]
        assert history[-1].t - history[0].t == pytest.approx(
            (mine[-1]["t"] - mine[0]["t"]) / SPEED, abs=0.01)
        assert started <= history[0].t < history[-1].t
    # a tick per GPU sampling moment (a CPU-only job's recording: per host sample)
    ticked = gpu_lines or [d for d in raw if d["kind"] == "host"]
    assert replayer.ticks_total == len({d["t"] for d in ticked})
    assert len(store.host_history()) == sum(d["kind"] == "host" for d in raw)
    span = raw[-1]["t"] - raw[0]["t"]
    newest = store.gpu_history(gpus[0])[-1] if gpus else store.host_history()[-1]
    assert newest.t <= started + span / SPEED + 5  # stamped now-ish
    snap = store.latest()
    assert [i.gpu for i in snap.infos] == gpus
    for info in snap.infos:
        assert (info.name, list(info.compute_capability), info.driver_version) == (
            meta["gpu_name"], meta["compute_capability"], meta["driver_version"])
        first_total = next(d["mem_total_bytes"] for d in gpu_lines
                           if d["gpu"] == info.gpu and "mem_total_bytes" in d)
        assert info.mem_total_bytes == first_total and info.gpm_supported
    assert snap.health.ticks_total == len({d["t"] for d in ticked})
    # played faster than recorded, a job's steps may come summed (`steps`): none is lost
    # a recording's own `steps` lines (a job over 20 steps a second) count as many steps
    summed = [d for d in raw if d["kind"] == "steps"]
    recorded = len(step_lines) + sum(d["steps"] for d in summed)
    steps = store.step_history()
    assert sum(s.steps if isinstance(s, StepsSample) else 1 for s in steps) == recorded
    if not recorded:
        assert snap.jobs == ()
        return
    by_pid: dict[int | None, list[tuple[int, int]]] = {}  # (steps, skipped) per line
    for d in step_lines:
        by_pid.setdefault(d.get("pid"), []).append((1, int(bool(d.get("skipped")))))
    for d in summed:
        by_pid.setdefault(d.get("pid"), []).append((d["steps"], d.get("skipped") or 0))
    assert len(snap.jobs) == len(by_pid)
    for job in snap.jobs:
        mine = by_pid.get(job.pid) or by_pid[None]
        assert job.steps_total == sum(n for n, _ in mine)
        assert job.skipped_steps_total == sum(k for _, k in mine)
        assert not job.alive  # the recording ended, and its job with it
    if None in by_pid:
        # steps without a pid (the design card's recordings): the one process seen on the
        # GPU is the job, and it carries the last step's memory and scale
        (job,) = snap.jobs
        assert job.gpu == 0
        pids = {p["pid"] for d in gpu_lines for p in d.get("processes", ())}
        assert [job.pid] == sorted(pids)
        assert job.mem_allocated_bytes == step_lines[-1]["mem_allocated_bytes"]
        assert job.loss_scale == step_lines[-1]["loss_scale"]


def test_tuned_recording_looks_busy_and_healthy() -> None:
    store, _ = play_once(recording("tuned.jsonl"))
    history = store.gpu_history(0)
    assert max(g.util for g in history) >= 0.99
    assert max(g.sm_active for g in history) == pytest.approx(0.9, abs=0.07)
    (job,) = store.latest().jobs
    assert job.data_wait_ratio is not None and job.data_wait_ratio < 0.05
    assert job.step_seconds == pytest.approx(0.039, rel=0.2)
    assert job.samples_per_second == pytest.approx(64 / job.step_seconds, rel=0.05)


def test_input_bound_recording_waits_for_data() -> None:
    store, _ = play_once(recording("input_bound.jsonl"))
    (job,) = store.latest().jobs
    assert job.data_wait_ratio is not None and job.data_wait_ratio > 0.7
    assert max(g.util for g in store.gpu_history(0)) < 0.6


def test_loop_keeps_time_and_counters_rising() -> None:
    path = recording("fp32.jsonl")
    n_steps = sum(d["kind"] == "step" for d in raw_lines(path))
    store = Store(history_seconds=3600, step_lines_per_second=1e9)  # every step line kept
    replayer = Replayer(store, path, loop=True, speed=80)
    replayer.start()
    try:
        wait_for(lambda: replayer.passes >= 2, "two passes over the recording", timeout=60)
    finally:
        replayer.stop()
    ts = [g.t for g in store.gpu_history(0)]
    assert len(ts) > 2 * sum(d["kind"] == "gpu" for d in raw_lines(path)) - 1
    assert all(b > a for a, b in pairwise(ts)), "time went backwards at a restart"
    steps = [s.step for s in store.step_history()]
    assert steps[: n_steps * 2] == list(range(n_steps * 2))  # numbering continues
    (job,) = store.latest().jobs
    assert job.steps_total >= 2 * n_steps
    assert job.alive


def write_trace(path: Path, samples: list, **meta_kw: object) -> str:
    infos = meta_kw.pop("infos", [])
    meta = make_meta(infos=infos, host_cpus=4, sample_hz=10, **meta_kw)  # type: ignore[arg-type]
    with TraceWriter(str(path), meta) as w:
        for s in samples:
            w.write(s)
    return str(path)


def test_lines_of_one_tick_make_one_snapshot(tmp_path: Path) -> None:
    infos = [GpuInfo(gpu=0, uuid="GPU-a", name="A"), GpuInfo(gpu=1, uuid="GPU-b", name="B")]
    samples = []
    for k in range(5):
        t = 100.0 + k * 0.1
        # a writer whose lines of one tick differ by a few ms (less than half a period)
        samples += [GpuSample(t=t, gpu=0, util=0.1 * k, mem_total_bytes=80),
                    GpuSample(t=t + 0.004, gpu=1, util=0.2, mem_total_bytes=40),
                    HostSample(t=t + 0.008, load1=float(k))]
    samples.append(ConfigSample(t=100.45, pid=42, rank=0, values={"num_workers": 0}))
    samples.append(StepSample(t=100.46, step=7, step_seconds=0.2, data_wait_seconds=0.1,
                              batch_size=8, pid=42, rank=0, gpu=1, skipped=True,
                              loss_scale=1024.0))
    path = write_trace(tmp_path / "two.jsonl", samples, infos=infos)
    store, replayer = play_once(path, speed=10)
    assert replayer.ticks_total == 5
    assert [(g.gpu, g.util) for g in store.latest().gpus] == [(0, 0.4), (1, 0.2)]
    assert store.latest().host is not None and store.latest().host.load1 == 4.0
    assert [(i.gpu, i.uuid, i.name, i.mem_total_bytes) for i in replayer.infos] == [
        (0, "GPU-a", "A", 80), (1, "GPU-b", "B", 40)]
    (config,) = store.configs()
    assert (config.pid, config.rank, config.values) == (42, 0, {"num_workers": 0})
    (job,) = store.latest().jobs
    assert (job.pid, job.rank, job.gpu, job.steps_total, job.skipped_steps_total) == (
        42, 0, 1, 1, 1)
    assert job.data_wait_ratio == pytest.approx(0.5)
    assert job.samples_per_second == pytest.approx(40.0)
    assert job.loss_scale == 1024.0


def test_bad_recording_fails_at_construction(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    text = read_recording(RECORDINGS[0])
    bad.write_text(text.replace('"load1":', '"load1":"x","old_load1":', 1))
    with pytest.raises(FileFormatError, match=r"bad.jsonl:3: field 'load1' must be a number"):
        Replayer(Store(), str(bad))
    with pytest.raises(UserError, match="speed"):
        Replayer(Store(), str(RECORDINGS[0]), speed=0)


def test_replay_needs_no_nvml_and_no_socket() -> None:
    # in a fresh interpreter: replaying never loads NVML and never creates a socket
    code = (
        "import socket, sys\n"
        "class NoSocket(socket.socket):\n"
        "    def __init__(self, *a, **k):\n"
        "        raise AssertionError('replay opened a socket')\n"
        "socket.socket = NoSocket\n"
        "from gpuwatch.store import Store\n"
        "from gpuwatch.trace.replay import Replayer\n"
        "store = Store()\n"
        f"r = Replayer(store, {recording('idle.jsonl')!r}, loop=False, speed=100)\n"
        "r.start(); assert r.wait(60); r.stop()\n"
        "assert store.latest().gpus, 'nothing was replayed'\n"
        "assert 'pynvml' not in sys.modules, 'replay loaded NVML'\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_each_new_pass_is_announced_where_it_begins() -> None:
    """on_loop hears the time each pass starts at: everything published before the call
    is older than it, the next pass's samples are not (the live advisor's loop points)."""
    path = recording("small_batch.jsonl")
    store = Store(history_seconds=3600)
    published: list[float] = []
    store.subscribe(lambda s: published.append(s.t))
    loops: list[tuple[float, int]] = []
    replayer = Replayer(store, path, loop=True, speed=80)
    replayer.on_loop = lambda t: loops.append((t, len(published)))
    replayer.start()
    try:
        wait_for(lambda: len(loops) >= 3, "three loop points", timeout=60)
    finally:
        replayer.stop()
    for t, seen in loops[:2]:  # each with a whole pass published after it
        assert seen and max(published[:seen]) < t <= min(published[seen:])


def test_a_file_growing_during_the_replay_keeps_time_and_pace(tmp_path: Path) -> None:
    """A recording still being written (`gpuwatch record` beside `run --replay`)."""
    path = tmp_path / "growing.jsonl"
    period = 0.1  # sample_hz 10
    meta = make_meta(infos=[], host_cpus=4, sample_hz=10)
    writer = TraceWriter(str(path), meta)
    t0 = 1000.0
    for k in range(10):
        writer.write(HostSample(t=t0 + k * period, load1=float(k)))
    writer.flush()
    store = Store(history_seconds=3600)
    arrivals: list[tuple[float, float]] = []  # (wall time published, sample t)
    store.subscribe(lambda s: arrivals.append((time.monotonic(), s.t))
                    if isinstance(s, HostSample) else None)
    speed = 4.0  # a pass over the first second takes 0.25 s
    replayer = Replayer(store, str(path), loop=True, speed=speed)
    replayer.start()
    try:
        for k in range(10, 40):  # the writer keeps going, a line per recorded period
            time.sleep(period / speed)
            writer.write(HostSample(t=t0 + k * period, load1=float(k)))
            writer.flush()
        wait_for(lambda: replayer.passes >= 4, "four passes over the growing file")
    finally:
        replayer.stop()
        writer.close()
    ts = [t for _, t in arrivals]
    assert all(b > a for a, b in pairwise(ts)), "time went back at a pass"
    # paced: consecutive samples one period (scaled) apart in time stamps; never in a burst
    # of many at once (a late start of a pass would publish all that is due together)
    gaps = [b - a for a, b in pairwise(ts)]
    assert max(gaps) < 2.5 * period / speed, gaps
    walls = [w for w, _ in arrivals]
    bursts = [i for i in range(len(walls) - 5) if walls[i + 5] - walls[i] < 0.5 * period / speed]
    assert not bursts, "samples came in a burst"
    # lines appended during the replay were played too
    assert replayer.last_t is not None and replayer.last_t > t0 + 2.0
