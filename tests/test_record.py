"""`gpuwatch record` as a real process, and the Recorder on a real Store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import pytest
from conftest import NVML_GPUS, RECORDINGS, REPO, daemon_env, run_gpuwatch, wait_for

from gpuwatch.samples import GpuSample, HostSample, Snapshot, StepSample
from gpuwatch.store import Store
from gpuwatch.trace.format import read_trace
from gpuwatch.trace.record import Recorder
from gpuwatch.trace.replay import Replayer


def check_host_trace(path: Path, min_host_lines: int) -> list:
    text = path.read_text()
    assert text.endswith("\n"), "the last line is incomplete"
    trace = read_trace(str(path))
    assert trace.warnings == []
    hosts = [s for s in trace.samples if isinstance(s, HostSample)]
    assert len(hosts) >= min_host_lines
    assert all(s.mem_total_bytes and s.load1 is not None for s in hosts)
    assert all(b.t >= a.t for a, b in pairwise(trace.samples))
    gpus = [s for s in trace.samples if isinstance(s, GpuSample)]
    if NVML_GPUS:
        assert gpus and "gpu_name" in trace.meta
    else:
        # no GPU here: host lines only, and a meta line that claims no GPU
        assert gpus == [] and "gpu_name" not in trace.meta
    return trace.samples


def test_record_for_a_duration(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    result = run_gpuwatch(["record", str(out), "--interval", "0.1", "--duration", "2",
                           "--scenario", "a test"], tmp_path)
    assert result.returncode == 0, result.stderr
    samples = check_host_trace(out, min_host_lines=10)
    meta = read_trace(str(out)).meta
    assert (meta["scenario"], meta["host_cpus"], meta["sample_hz"]) == ("a test", os.cpu_count(), 10)
    # consecutive ticks are one interval apart
    ticks = [s.t for s in samples if isinstance(s, HostSample)]
    gaps = sorted(b - a for a, b in pairwise(ticks))
    assert gaps[len(gaps) // 2] == pytest.approx(0.1, abs=0.03)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_record_stops_cleanly_on_a_signal(sig: int, tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "gpuwatch", "record", str(out),
                             "--interval", "0.1"], cwd=REPO, env=daemon_env(tmp_path),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: out.exists() and len(out.read_text().splitlines()) >= 5,
                 "the first lines of the recording", timeout=60, proc=proc)
        before = len(out.read_text().splitlines())
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    samples = check_host_trace(out, min_host_lines=4)
    # what was held back for time ordering was written out at the end, not lost
    assert len(samples) + 1 > before


def test_record_to_stdout(tmp_path: Path) -> None:
    result = run_gpuwatch(["record", "-", "--interval", "0.1", "--duration", "1"], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines[0]["kind"] == "meta" and lines[0]["format"] == "gpuwatch-trace/1"
    assert sum(d["kind"] == "host" for d in lines) >= 3


def test_record_into_head_ends_quietly(tmp_path: Path) -> None:
    cmd = (f"'{sys.executable}' -m gpuwatch record - --interval 0.1 | head -c 3000 >/dev/null;"
           " echo status=${PIPESTATUS[0]}")
    result = subprocess.run(["bash", "-c", cmd], cwd=REPO, env=daemon_env(tmp_path),
                            capture_output=True, text=True, timeout=60, check=False)
    # killed by SIGPIPE like `yes | head`: no ERROR, no traceback, no complaint at exit
    assert "status=141" in result.stdout, result.stderr
    assert "ERROR" not in result.stderr and "Traceback" not in result.stderr
    assert "BrokenPipe" not in result.stderr and "Exception ignored" not in result.stderr


def test_a_meta_line_that_cannot_be_written_leaves_no_open_file(tmp_path: Path) -> None:
    from gpuwatch.trace.format import TraceWriter

    path = tmp_path / "t.jsonl"

    def open_on_it() -> list[str]:
        fds = Path("/proc/self/fd")
        return [fd.name for fd in fds.iterdir()
                if os.path.realpath(fd) == str(path)]

    with pytest.raises(ValueError):
        TraceWriter(str(path), {"kind": "meta", "format": "gpuwatch-trace/1",
                                "sample_hz": float("nan")})
    assert open_on_it() == []


def test_record_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    result = run_gpuwatch(["record", str(tmp_path / "no" / "such" / "dir.jsonl"),
                           "--duration", "1"], tmp_path)
    assert result.returncode == 2
    assert "cannot write trace" in result.stderr and "No such file or directory" in result.stderr
    result = run_gpuwatch(["record", str(tmp_path / "x.jsonl"), "--duration", "0"], tmp_path)
    assert result.returncode == 2
    assert "argument --duration: expected seconds above 0, got 0" in result.stderr


def test_recorder_puts_late_samples_in_time_order(tmp_path: Path) -> None:
    store = Store()
    out = tmp_path / "order.jsonl"
    recorder = Recorder(store, str(out), {"host_cpus": 2, "sample_hz": 10},
                        reorder_seconds=0.5)
    recorder.start()
    for k in range(10):
        t = 100.0 + 0.1 * k
        store.publish(Snapshot(t=t, host=HostSample(t=t, load1=float(k))))
        if k == 5:
            # a step that ended before this tick, delivered after it (the hook's datagram)
            store.add_steps([StepSample(t=100.42, step=1)])
    store.add_steps([StepSample(t=100.05, step=2)])  # far too late to be put in its place
    recorder.stop()
    trace = read_trace(str(out))
    assert trace.meta["format"] == "gpuwatch-trace/1" and trace.meta["kind"] == "meta"
    got = [(type(s).__name__, round(s.t, 2), getattr(s, "step", None)) for s in trace.samples]
    ticks = [("HostSample", round(100.0 + 0.1 * k, 2), None) for k in range(10)]
    # the late step is kept, at the time of the line written before it; the other one
    # sits between the ticks at 100.4 and 100.5, where it belongs
    assert got == [*ticks[:5], ("StepSample", 100.4, 2), ("StepSample", 100.42, 1), *ticks[5:]]
    assert recorder.late_samples == 1
    assert recorder.samples_written == 12


def test_recording_a_replay_gives_back_the_recording(tmp_path: Path) -> None:
    source = next(p for p in RECORDINGS if p.name == "near_oom.jsonl")
    original = read_trace(str(source))
    # played 40x faster than recorded: keep every step line (no thinning) to compare them
    store = Store(history_seconds=3600, step_lines_per_second=1e9)
    replayer = Replayer(store, str(source), loop=False, speed=40)
    out = tmp_path / "again.jsonl.gz"
    recorder = Recorder(store, str(out), original.meta)
    recorder.start()
    replayer.start()
    assert replayer.wait(60)
    replayer.stop()
    recorder.stop()
    again = read_trace(str(out))
    assert again.meta["scenario"] == "near_oom"

    def values(samples: list, cls: type, field: str) -> list:
        return [getattr(s, field) for s in samples if isinstance(s, cls)]

    for cls, field in ((GpuSample, "mem_used_bytes"), (GpuSample, "util"),
                       (HostSample, "job_cpu_cores"), (StepSample, "step_seconds"),
                       (StepSample, "step")):
        assert values(again.samples, cls, field) == values(original.samples, cls, field)


def test_record_keeps_the_first_tick(tmp_path: Path) -> None:
    # the first tick comes at once; the next only a second later, after the end
    out = tmp_path / "short.jsonl"
    result = run_gpuwatch(["record", str(out), "--interval", "1", "--duration", "0.5"],
                          tmp_path)
    assert result.returncode == 0, result.stderr
    check_host_trace(out, min_host_lines=1)


def test_recorder_skips_a_sample_it_cannot_write(tmp_path: Path) -> None:
    from gpuwatch.samples import ConfigSample

    store = Store()
    out = tmp_path / "bad.jsonl"
    recorder = Recorder(store, str(out), {"sample_hz": 10}, reorder_seconds=0.0)
    recorder.start()
    store.set_config(ConfigSample(t=100.0, pid=1, rank=0, values={"lr": float("inf")}))
    for k in range(1, 4):
        store.publish(Snapshot(t=100.0 + k, host=HostSample(t=100.0 + k, load1=1.0)))
    recorder.stop()
    trace = read_trace(str(out))
    assert [s.t for s in trace.samples] == [101.0, 102.0, 103.0]
    assert recorder.bad_samples == 1 and recorder.failed is None


def test_a_sample_from_the_far_future_holds_nothing_back(tmp_path: Path) -> None:
    from gpuwatch.trace.record import MAX_HELD

    store = Store(max_records=10)
    out = tmp_path / "future.jsonl"
    recorder = Recorder(store, str(out), {"sample_hz": 10})
    recorder.start()
    try:
        store.add_steps([StepSample(t=1e12, step=1)])  # a hook's clock gone wrong
        for k in range(MAX_HELD + 100):
            store.publish(Snapshot(t=100.0 + k, host=HostSample(t=100.0 + k)))
        # the buffer stays bounded: lines are written while recording, not only at stop
        wait_for(lambda: len(out.read_text().splitlines()) > 50, "lines written")
    finally:
        recorder.stop()
    trace = read_trace(str(out))
    assert len(trace.samples) == MAX_HELD + 101
    assert isinstance(trace.samples[-1], StepSample)


def test_record_to_a_full_disk_exits_2(tmp_path: Path) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    result = run_gpuwatch(["record", "/dev/full", "--duration", "1"], tmp_path)
    assert result.returncode == 2, result.stderr
    assert "cannot write trace /dev/full" in result.stderr and "Traceback" not in result.stderr


def test_run_record_that_fails_midway_exits_2(tmp_path: Path) -> None:
    import resource

    def small_files() -> None:  # writes past 4 KB fail with EFBIG (Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    out = tmp_path / "run.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "gpuwatch", "run", "--interval", "0.1",
                             "--web.listen-address", "127.0.0.1:0", "--record", str(out)],
                            cwd=REPO, env=daemon_env(tmp_path), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=small_files)
    try:
        wait_for(lambda: out.exists() and out.stat().st_size >= 3000, "the file to fill",
                 proc=proc)
        time.sleep(1.5)  # the recorder hits the limit
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, stderr
    assert "cannot write" in stderr
