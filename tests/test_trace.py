"""The gpuwatch-trace/1 format: the recordings read, round-trip, and bad files say where."""

from __future__ import annotations

import gzip
import json
import math
import tracemalloc
from collections import Counter
from pathlib import Path

import pytest
from conftest import RECORDINGS, read_recording, run_gpuwatch

from gpuwatch.errors import FileFormatError
from gpuwatch.samples import (
    ConfigSample,
    GpuInfo,
    GpuProcess,
    GpuSample,
    HookProblem,
    HostSample,
    JobEnd,
    JobTree,
    PhaseSample,
    StepSample,
    StepsSample,
)
from gpuwatch.trace.format import (
    MAX_PROBLEMS,
    TraceWriter,
    iter_trace,
    line_to_sample,
    make_meta,
    read_trace,
    sample_to_line,
)

META = {"kind": "meta", "format": "gpuwatch-trace/1", "host_cpus": 2, "sample_hz": 10}
KIND = {GpuSample: "gpu", HostSample: "host", StepSample: "step", ConfigSample: "config",
        JobEnd: "job_end", StepsSample: "steps", PhaseSample: "phase",
        HookProblem: "hook_problem"}


def write_lines(path: Path, *lines: object, end: str = "\n") -> Path:
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines)
    path.write_text(text + end)
    return path


def problems_of(path: Path) -> list[str]:
    with pytest.raises(FileFormatError) as err:
        read_trace(str(path))
    message = str(err.value)
    # every problem names the file, and a line where there is one
    assert all(line.startswith(f"{path}:") for line in message.splitlines())
    return message.splitlines()


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name)
def test_every_recording_reads_cleanly(path: Path) -> None:
    trace = read_trace(str(path))
    assert trace.warnings == []
    assert trace.meta["format"] == "gpuwatch-trace/1"
    raw = [json.loads(line) for line in read_recording(path).splitlines()[1:]]
    assert Counter(KIND[type(s)] for s in trace.samples) == Counter(d["kind"] for d in raw)
    assert [s.t for s in trace.samples] == [d["t"] for d in raw]
    gpu = next((s for s in trace.samples if isinstance(s, GpuSample)), None)
    first = next((d for d in raw if d["kind"] == "gpu"), None)
    assert (gpu is None) == (first is None)  # a CPU-only job's recording has neither
    if gpu is not None:
        assert gpu.mem_total_bytes == first["mem_total_bytes"]
        assert gpu.util == first["util"]
    # the streaming reader sees the same thing
    meta, samples = iter_trace(str(path))
    assert meta == trace.meta
    assert list(samples) == trace.samples


def _comparable(samples: list) -> list:
    """The samples, a NaN loss (a diverged run's, which round-trips by name) made equal to
    itself: NaN compares unequal to every float, itself included."""
    import dataclasses
    import math

    return [dataclasses.replace(s, loss="nan")
            if isinstance(s, StepSample) and isinstance(s.loss, float) and math.isnan(s.loss)
            else s for s in samples]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name)
def test_recordings_round_trip(path: Path, suffix: str, tmp_path: Path) -> None:
    trace = read_trace(str(path))
    out = tmp_path / ("copy" + suffix)
    with TraceWriter(str(out), trace.meta) as writer:
        for s in trace.samples:
            writer.write(s)
    again = read_trace(str(out))
    assert again.meta == trace.meta
    assert _comparable(again.samples) == _comparable(trace.samples)
    if suffix.endswith(".gz"):
        assert out.read_bytes()[:2] == b"\x1f\x8b"
    else:
        # what was never measured stays out of the file: a step line whose loss_scale was
        # null (no fp16 loss scaling) is written without the field
        nulls = [s for s in trace.samples if isinstance(s, StepSample) and s.loss_scale is None]
        written = [json.loads(line) for line in out.read_text().splitlines()]
        steps = [d for d in written if d.get("kind") == "step"]
        assert sum("loss_scale" not in d for d in steps) == len(nulls)
        assert all(d["loss_scale"] is not None for d in steps if "loss_scale" in d)


def test_every_field_round_trips_and_none_is_left_out() -> None:
    samples = [
        GpuSample(t=1.5, gpu=1, uuid="GPU-1", util=0.5, mem_used_bytes=10, pstate=0,
                  energy_joules=123.5, ecc_corrected_total=2, remapped_rows_pending=False,
                  fp64_active=0.25, xid_total={79: 1, 13: 2}, lost=True,
                  processes=(GpuProcess(pid=7, mem_used_bytes=5, sm_util=0.5, name="python3",
                                        user="ana"), GpuProcess(pid=8))),
        HostSample(t=2.0, cpu_util_per_core=(0.5, 1.0), cpu_util=0.75, load1=1.0,
                   job_cpu_cores=1.6, job_processes=3, job_rss_bytes=99,
                   job_main_cpu_cores=1.0, job_workers_cpu_cores=0.6,
                   jobs=(JobTree(pid=7, name="python3", user="ana", cpu_cores=1.6,
                                 main_cpu_cores=1.0, workers_cpu_cores=0.6, processes=3,
                                 rss_bytes=99),)),
        StepSample(t=3.0, step=4, step_seconds=0.1, skipped=True, pid=7, rank=0, gpu=1,
                   loss_scale=65536.0),
        ConfigSample(t=4.0, pid=7, rank=0, values={"num_workers": 4, "pin_memory": True,
                                                   "autocast_dtype": "bfloat16"}),
    ]
    for s in samples:
        line = json.loads(json.dumps(sample_to_line(s)))
        assert line["kind"] == KIND[type(s)]
        assert line_to_sample(line) == s
    gpu_line = sample_to_line(GpuSample(t=1.0, gpu=0, util=0.5, dram_active=math.nan))
    # unmeasured fields (None, NaN) are left out, never written as 0
    assert gpu_line == {"t": 1.0, "kind": "gpu", "gpu": 0, "util": 0.5, "processes": []}
    assert sample_to_line(HostSample(t=1.0)) == {"t": 1.0, "kind": "host"}
    assert sample_to_line(samples[3]) == {"t": 4.0, "kind": "config", "pid": 7, "rank": 0,
                                          "num_workers": 4, "pin_memory": True,
                                          "autocast_dtype": "bfloat16"}


def test_make_meta(tmp_path: Path) -> None:
    infos = [GpuInfo(gpu=0, uuid="GPU-a", name="NVIDIA H200", driver_version="580.1",
                     compute_capability=(9, 0), mem_total_bytes=100),
             GpuInfo(gpu=1, uuid="GPU-b", name="NVIDIA A100", driver_version="580.1",
                     compute_capability=(8, 0))]
    meta = make_meta(infos=infos, host_cpus=16, sample_hz=10.0, scenario="two kinds")
    assert meta["format"] == "gpuwatch-trace/1" and meta["kind"] == "meta"
    assert (meta["gpu_name"], meta["compute_capability"], meta["driver_version"]) == (
        "NVIDIA H200", [9, 0], "580.1")
    assert (meta["host_cpus"], meta["sample_hz"], meta["scenario"]) == (16, 10, "two kinds")
    assert [(g["gpu"], g["uuid"], g["name"], g["compute_capability"]) for g in meta["gpus"]] == [
        (0, "GPU-a", "NVIDIA H200", [9, 0]), (1, "GPU-b", "NVIDIA A100", [8, 0])]
    # no GPU: a host-only trace, and still a valid one
    bare = make_meta(infos=[], host_cpus=2, sample_hz=2.5)
    assert "gpu_name" not in bare and "gpus" not in bare and "scenario" not in bare
    out = tmp_path / "host.jsonl"
    with TraceWriter(str(out), bare) as w:
        w.write(HostSample(t=1.0, load1=0.5))
    trace = read_trace(str(out))
    assert trace.meta == json.loads(json.dumps(bare))
    assert trace.samples == [HostSample(t=1.0, load1=0.5)]


def test_writer_lines_reach_the_file_before_close(tmp_path: Path) -> None:
    out = tmp_path / "live.jsonl"
    writer = TraceWriter(str(out), META)
    writer.write(HostSample(t=1.0, load1=0.5))
    # a recorder killed now loses nothing written so far
    assert len(out.read_text().splitlines()) == 2
    assert read_trace(str(out)).samples == [HostSample(t=1.0, load1=0.5)]
    writer.close()


def test_bad_json_wrong_type_and_time_backwards_listed_together(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "bad.jsonl", META,
        {"t": 1.0, "kind": "gpu", "gpu": 0, "util": "abc"},
        {"t": 2.0, "kind": "host", "load1": 1.0},
        "{not json",
        {"t": 1.5, "kind": "step", "step": 1},
        {"kind": "host"},
        {"t": 3.0, "kind": "host", "cpu_util_per_core": [0.5, 2]},
        {"t": 4.0, "kind": "gpu"},
        {"t": 5.0, "kind": "step", "step": 2},
    )
    assert problems_of(path) == [
        f"{path}:2: field 'util' must be a number 0-1, got 'abc'",
        (f"{path}:4: not JSON: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)"),
        f"{path}:5: time goes backwards: t=1.5 after t=2.0 on line 3",
        f"{path}:6: missing field 't'",
        f"{path}:7: field 'cpu_util_per_core[1]' must be a number 0-1, got 2",
        f"{path}:8: missing field 'gpu'",
    ]


def test_meta_problems(tmp_path: Path) -> None:
    missing = write_lines(tmp_path / "nometa.jsonl", {"t": 1.0, "kind": "host"})
    assert problems_of(missing) == [
        (f"{missing}:1: the first line must be the meta line "
        '{"kind":"meta","format":"gpuwatch-trace/1",...}, got kind \'host\'')]
    newer = write_lines(tmp_path / "v2.jsonl", {**META, "format": "gpuwatch-trace/2"})
    assert problems_of(newer) == [
        f"{newer}:1: this trace is gpuwatch-trace/2; this gpuwatch (0.1.0) reads gpuwatch-trace/1"]
    other = write_lines(tmp_path / "other.jsonl", {"kind": "meta", "format": "csv"})
    assert problems_of(other) == [
        f"{other}:1: meta field 'format' must be 'gpuwatch-trace/1', got 'csv'"]
    typed = write_lines(tmp_path / "typed.jsonl", {**META, "host_cpus": "16"})
    assert problems_of(typed) == [
        f"{typed}:1: meta: field 'host_cpus' must be a whole number >= 1, got '16'"]
    notjson = write_lines(tmp_path / "text.jsonl", "hello")
    assert problems_of(notjson)[0].startswith(f"{notjson}:1: not JSON")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert problems_of(empty) == [f"{empty}: empty file: no meta line"]


def test_truncated_last_line_is_tolerated(tmp_path: Path) -> None:
    source = RECORDINGS[0]
    text = read_recording(source)
    cut = tmp_path / "cut.jsonl"
    cut.write_text(text[: len(text) - 40])  # a recorder killed in the middle of a line
    whole = read_trace(str(source))
    trace = read_trace(str(cut))
    assert trace.samples == whole.samples[:-1]
    n = len(text.splitlines())
    assert trace.warnings == [(n, ("the last line is cut short (a recorder stopped mid-write?); "
                                  "skipped"))]
    # a bad line anywhere else is not a cut-short last line
    middle = write_lines(tmp_path / "middle.jsonl", META, '{"t": 1.0, "ki', {"t": 2.0,
                                                                            "kind": "host"})
    assert problems_of(middle)[0].startswith(f"{middle}:2: not JSON")


def test_truncated_gzip_is_read_up_to_its_end(tmp_path: Path) -> None:
    source = next(p for p in RECORDINGS if p.name == "tuned.jsonl")
    whole = read_trace(str(source))
    packed = gzip.compress(source.read_bytes())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(packed[: len(packed) // 2])
    trace = read_trace(str(cut))
    assert 0 < len(trace.samples) < len(whole.samples)
    assert trace.samples == whole.samples[: len(trace.samples)]
    assert any("ends early" in msg for _, msg in trace.warnings)


def test_unknown_kinds_and_fields_are_skipped(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "newer.jsonl", {**META, "future_meta": 1},
        {"t": 1.0, "kind": "gpu", "gpu": 0, "util": 0.5, "future_field": [1, 2]},
        {"t": 1.5, "kind": "nvlink", "gbps": 3},
        {"t": 1.6, "kind": "nvlink", "gbps": 4},
        {"t": 2.0, "kind": "host", "load1": 0.5},
    )
    trace = read_trace(str(path))
    assert trace.samples == [GpuSample(t=1.0, gpu=0, util=0.5), HostSample(t=2.0, load1=0.5)]
    assert trace.warnings == [(3, ("skipped lines of unknown kind 'nvlink' (2): "
                                  "written by a newer gpuwatch?"))]


def test_problems_are_capped(tmp_path: Path) -> None:
    lines = [{"t": float(i), "kind": "gpu", "gpu": 0, "util": 5} for i in range(100)]
    path = write_lines(tmp_path / "many.jsonl", META, *lines)
    problems = problems_of(path)
    assert len(problems) == MAX_PROBLEMS + 1
    assert problems[0] == f"{path}:2: field 'util' must be a number 0-1, got 5"
    assert problems[-1] == f"{path}: more problems after these 20; stopped reading there"


def test_streaming_yields_as_it_reads_and_stays_small(tmp_path: Path) -> None:
    path = tmp_path / "day.jsonl"
    line = json.loads(read_recording(RECORDINGS[0]).splitlines()[2])  # a full host line
    n = 20_000
    with path.open("w") as f:
        f.write(json.dumps(META) + "\n")
        for i in range(n):
            f.write(json.dumps({**line, "t": 1000.0 + i}) + "\n")
        f.write('{"t": 1.0, "kind": "host"}\n')  # time goes backwards at the very end
    tracemalloc.start()
    try:
        _meta, samples = iter_trace(str(path))
        count = 0
        with pytest.raises(FileFormatError, match=rf"day.jsonl:{n + 2}: time goes backwards"):
            for _ in samples:
                count += 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == n  # every good line was served before the bad one was reached
    assert peak < path.stat().st_size / 10  # never the whole file in memory


def test_cli_names_the_bad_line(tmp_path: Path) -> None:
    # through a real surface: `gpuwatch run --replay` refuses a bad file before serving
    bad = tmp_path / "bad.jsonl"
    lines = read_recording(RECORDINGS[0]).splitlines()
    at = [i for i, text in enumerate(lines) if '"kind":"gpu"' in text][1]
    lines[at] = json.dumps({**json.loads(lines[at]), "util": "abc"})
    bad.write_text("\n".join(lines) + "\n")
    result = run_gpuwatch(["run", "--replay", str(bad), "--web.listen-address", "127.0.0.1:0"],
                          tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"{bad}:{at + 1}: field 'util' must be a number 0-1, got 'abc'" in result.stderr


def test_odd_lines_read_as_json_loads_reads_them(tmp_path: Path) -> None:
    """The reader decodes the usual line itself (one C scan, no json.loads call); a line
    that is blank, starts with whitespace or a byte-order mark, ends in CRLF or spaces,
    is read as json.loads reads it, and what it refuses is told in json.loads' words."""
    good = json.dumps({"t": 1.0, "kind": "gpu", "gpu": 0, "util": 0.5})
    path = tmp_path / "odd.jsonl"
    body = [json.dumps(META), "", "   ", "  " + good, good + "\r", good + "   ",
            "\t" + good + " \t", "\ufeff" + good]
    path.write_bytes(("\n".join(body) + "\n").encode())
    utils = [s.util for s in read_trace(str(path)).samples]
    assert utils == [json.loads(x.encode())["util"] for x in body[3:]]  # a BOM too
    bad = tmp_path / "bad.jsonl"
    lines = [json.dumps(META).encode(), b"  " + good.encode(), good.encode() + b" x",
             b"\xff" + good.encode(), good.encode() + b"{}"]
    bad.write_bytes(b"\n".join(lines) + b"\n")
    got = problems_of(bad)
    want = []
    for n, raw in enumerate(lines[2:], 3):
        with pytest.raises(ValueError) as err:
            json.loads(raw)
        want.append(f"{bad}:{n}: not JSON: {err.value}")
    assert got == want
