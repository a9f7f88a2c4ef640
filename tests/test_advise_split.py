"""A long recording of several GPUs judged by several processes gives the report one
process gives (gpuwatch/advisor/split.py), recording by recording; the default asks for
the split only where it pays, and a child that fails costs nothing but time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import RECORDINGS, open_recording, read_recording, recording, recording_name

from gpuwatch.advisor import frame as frame_mod
from gpuwatch.advisor import sources, split
from gpuwatch.advisor.engine import Engine
from gpuwatch.advisor.rules import load_rules

ROOT = Path(__file__).resolve().parent.parent


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop(split.ENV, None)
    env.update(extra)
    return env


def _advise(path: Path, *flags: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwatch", *flags, "advise", "--replay",
                           str(path), "--format", "json"], capture_output=True, text=True,
                          env=_env(**env), timeout=600)


def _report(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    rep.pop("generated_at")
    return rep


def test_every_recording_is_judged_the_same_split_over_processes(tmp_path: Path) -> None:
    """Every recording in tests/data, with and without the hook's lines, split over 2
    processes and over one per GPU and one more: the same report and the same
    activations (rule, GPU, start, end, time held, evidence, words) as one process, and
    the children were forked (a fresh process: one thread)."""
    proc = subprocess.run([sys.executable, str(ROOT / "tests/scripts/split_judge.py"),
                           str(tmp_path), *map(str, RECORDINGS)], capture_output=True,
                          text=True, env=_env(), timeout=1200)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    # each recording twice (with and without the hook), at 2 workers and, with more than
    # one GPU, at one per GPU and one more
    assert len({r["recording"] for r in rows}) == 2 * len(RECORDINGS)
    assert {r["recording"] for r in rows if r["gpus"] >= 2 and r["workers"] > 2}
    for r in rows:
        assert r["forked"] == r["workers"] - 1, r
        assert r["same_report"] and r["same_activations"], r
    assert sum(r["activations"] for r in rows if r["gpus"] >= 2) > 50


HOOK_KINDS = ("step", "steps", "config", "phase", "hook_problem", "job_end")


def _gpus_of(path: Path) -> set[int]:
    gpus = set()
    with open_recording(path) as f:
        for line in f:
            if '"gpu"' in line and '"kind":"gpu"' in line.replace(" ", ""):
                d = json.loads(line)
                if type(d.get("gpu")) is int:
                    gpus.add(d["gpu"])
    return gpus


def _frame_state(frame: frame_mod.Frame, idx: int, full: Any = ()) -> str:
    """What a frame holds that a rule or the report could read of any subject at bucket
    ``idx``, but each GPU's own rings beyond those the frame reads for the others
    (_GPU_READS; all of them for the GPUs in ``full``): every table's newest bucket and
    prefix sums (its rings only grow, so comparing them at each bucket compares their
    whole history); facts, settings, the job's clock, spans, processes, phases and
    ranks of each subject; the frame's own maps of processes, ends and problems; and the
    step-time attribution over the last 10 buckets (the HTML report's timeline reads
    it so)."""
    def table(t: frame_mod.Table, only: Any = None) -> list[Any]:
        return sorted((name, r.base + len(r.vals), r.vals[-1] if r.vals else None,
                       r.psum[-1], r.pw[-1]) for name, r in t.rings.items()
                      if only is None or name in only)
    out: list[Any] = [
        table(frame.host_tables), sorted(frame.facts.items()), sorted(frame.pid_gpu.items()),
        frame.last_oom_idx, sorted((p, s.gpu) for p, s in frame.job_of_pid.items()),
        sorted(frame.hook_gpu.items()), sorted(frame.ended_pids.items(), key=str),
        frame.job_ends, frame.problems, frame.jobs(idx + 1, 10)]
    for gpu, s in sorted(frame.subjects.items(), key=lambda kv: -1 if kv[0] is None
                         else kv[0]):
        out.append([
            gpu, table(s.gpu_table, None if gpu in full else frame_mod._GPU_READS),
            table(s.job), table(s.cpu), table(s.phase_table), sorted(s.facts.items()),
            sorted(s.config.items()), s.first, s.first_busy, s.first_util, s.job_warm,
            s.job_last, s.job_t1, s.span_t0, s.main_pid, sorted(s.proc_pids), s.job_pid,
            s.job_rank, s.dist, s.hook_seen, s.hook_off, s.steps_seen, s.micro_sum,
            s.micro_n, s.nontrain_t0, s.nontrain_t1,
            s.job_via.gpu if s.job_via is not None else None, sorted(s.span.s.items()),
            s.span_at_last_step, s.phase, sorted(s.phase_seconds.items()),
            sorted(s.phase_info.items(), key=str)])
    return repr(out)


def _cross_reads(path: Path) -> Path:
    """Two GPUs whose frame reads each other's rings where no recording in tests/data
    does: a job the hook reports on GPU 0 whose GPU line comes every other second (its
    reserved share reads the newest memory total kept), and a process NVML never listed
    that dies of CUDA out-of-memory naming no GPU, while GPU 1's memory is full (the
    death is pinned on it)."""
    t0 = 1_800_000_000.0
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"kind": "meta", "format": "gpuwatch-trace/1",
                            "gpu_name": "NVIDIA H100 80GB HBM3", "compute_capability": [9, 0],
                            "host_cpus": 16, "sample_hz": 1}) + "\n")
        for s in range(60):
            for g in range(2):
                if g == 0 and s % 2:
                    continue
                used = (79 if g == 1 and s >= 30 else 30) * 2**30
                f.write(json.dumps({
                    "t": t0 + s, "kind": "gpu", "gpu": g, "util": 0.9, "sm_active": 0.7,
                    "mem_used_bytes": used, "mem_total_bytes": 80 * 2**30,
                    "processes": [{"pid": 100, "mem_used_bytes": 29 * 2**30}] if g == 0
                    else []}) + "\n")
            f.write(json.dumps({
                "t": t0 + s + 0.5, "kind": "step", "pid": 100, "gpu": 0, "step": s,
                "step_seconds": 0.9, "data_wait_seconds": 0.01, "batch_size": 8,
                "mem_allocated_bytes": 10 * 2**30, "max_mem_allocated_bytes": 20 * 2**30,
                "mem_reserved_bytes": (24 + s % 3) * 2**30}) + "\n")
        f.write(json.dumps({"t": t0 + 59.5, "kind": "job_end", "pid": 555,
                            "exit_reason": "oom",
                            "error": "OutOfMemoryError: CUDA out of memory."}) + "\n")
    return path


def _states(rules: Any, rec: Path, judged: Any, light: bool) -> tuple[list[str], Any]:
    """The frame's state after each bucket, judging ``judged`` (the others bucketed
    lightly, or, without ``light``, in full as one process buckets them)."""
    engine = Engine(rules, res=1.0)
    if light:
        engine.judge_only(judged)
    else:
        engine.judges = judged
    full = [g for g in _gpus_of(rec) if judged(g)]
    seen: list[str] = []
    evaluate = engine.frame.on_bucket

    def both(idx: int) -> None:
        evaluate(idx)
        seen.append(_frame_state(engine.frame, idx, full))
    engine.frame.on_bucket = both
    sources._feed_recording(engine, str(rec))
    return seen, engine.frame


def test_a_gpu_judged_in_another_process_keeps_what_the_others_read(tmp_path: Path) -> None:
    """A process judging a share of the GPUs buckets the others lightly
    (Frame.judge_only): their rings keep only what the frame reads of every GPU for the
    others (the ranks' utilization the attribution shares out, the memory an
    out-of-memory death is pinned on, a shared job's batch room). Fed every recording of
    several GPUs in tests/data, with and without the hook's lines, a frame that buckets
    every GPU lightly, and one that buckets all but the first lightly, hold at every
    bucket what one that buckets them all in full holds (the first GPU's every ring
    included), but for the light GPUs' own other rings, which they do not keep."""
    rules = load_rules([])
    paths = [p for p in RECORDINGS if len(_gpus_of(p)) >= 2]
    assert len(paths) >= 20
    light_rings = full_rings = 0
    recs = [_cross_reads(tmp_path / "cross_reads.jsonl")]
    for path in paths:
        bare = tmp_path / f"{recording_name(path)}.nohook.jsonl"
        with open_recording(path) as f, open(bare, "w", encoding="utf-8") as out:
            out.writelines(x for x in f if json.loads(x).get("kind") not in HOOK_KINDS)
        recs += [path, bare]
    for rec in recs:
        first = min(_gpus_of(rec))
        for judged in (lambda gpu: gpu is None, lambda gpu, first=first: gpu in (None, first)):
            full, frame = _states(rules, rec, judged, light=False)
            full_rings += sum(len(s.gpu_table.rings) for g, s in frame.subjects.items()
                              if g is not None and not judged(g))
            light, frame = _states(rules, rec, judged, light=True)
            for g, s in frame.subjects.items():
                if g is not None and not judged(g):
                    assert s.light
                    assert set(s.gpu_table.rings) <= set(frame_mod._GPU_READS), rec
                    light_rings += len(s.gpu_table.rings)
                elif g is not None:
                    assert not s.light
            assert len(full) > 10, rec
            assert len(full) == len(light), rec
            for idx, (a, b) in enumerate(zip(full, light, strict=True)):
                assert a == b, f"{rec.name}: the frames part at bucket {idx}"
    # lightly: a handful of rings a GPU instead of a few dozen
    assert light_rings * 4 < full_rings


def test_the_light_buckets_are_set_before_any_sample() -> None:
    engine = Engine(load_rules([]), res=1.0)
    engine.frame.set_gpu_info(0, name="NVIDIA H100")
    engine.frame.set_gpu_info(1, name="NVIDIA H100")
    engine.judge_only(lambda gpu: gpu == 1)
    assert [s.light for g, s in sorted(engine.frame.subjects.items(), key=str)
            if g is not None] == [True, False]
    engine.feed({"kind": "gpu", "t": 100.0, "gpu": 0, "util": 0.5})
    with pytest.raises(RuntimeError, match="before|after samples"):
        engine.judge_only(lambda gpu: gpu == 0)


def _long_recording(path: Path, gpus: int = 2, seconds: int = 5000) -> Path:
    """A plain recording over MIN_BYTES: ``gpus`` GPUs, one tick a second; GPU g works
    in bursts of its own, so the rules have something to say on each."""
    meta = {"kind": "meta", "format": "gpuwatch-trace/1", "gpu_name": "NVIDIA H100 80GB HBM3",
            "compute_capability": [9, 0], "host_cpus": 16, "sample_hz": 1}
    t0 = 1_800_000_000.0
    with open(path, "w") as f:
        f.write(json.dumps(meta) + "\n")
        for s in range(seconds):
            t = t0 + s
            for g in range(gpus):
                busy = ((s // (300 + 60 * g)) % 2) == 1
                util = (0.35 if busy else 0.02) + 0.01 * (s % 7)
                f.write(json.dumps({
                    "t": t, "kind": "gpu", "gpu": g, "util": util, "mem_util": util / 2,
                    "mem_used_bytes": (20 + g) * 2**30, "mem_total_bytes": 80 * 2**30,
                    "power_watts": 120.0 + 400 * util, "power_limit_watts": 700.0,
                    "temp_celsius": 40 + 20 * util, "sm_clock_mhz": 1980,
                    "clock_event_reasons": 1 if not busy else 0,
                    "processes": [{"pid": 1000 + g, "mem_used_bytes": (19 + g) * 2**30}]},
                    separators=(",", ":")) + "\n")
            f.write(json.dumps({
                "t": t, "kind": "host", "cpu_util_per_core": [0.9, 0.1] + [0.0] * 14,
                "load1": 1.0, "mem_used_bytes": 40 * 2**30, "mem_total_bytes": 512 * 2**30,
                "job_cpu_cores": 1.0, "job_processes": gpus, "job_rss_bytes": 9 * 2**30},
                separators=(",", ":")) + "\n")
    assert path.stat().st_size >= split.MIN_BYTES
    return path


def test_the_cli_splits_a_long_recording_of_several_gpus_by_default(tmp_path: Path) -> None:
    rec = _long_recording(tmp_path / "long.jsonl")
    one = _advise(rec, **{split.ENV: "1"})
    auto = _advise(rec, "--log.level", "debug")
    want = min(3, split.usable_cpus())  # 2 GPUs and the host's process
    said = f"judged by {want} processes"
    if want > 1:
        assert said in auto.stderr
    else:  # a machine of one CPU: nothing to gain
        assert "judged by" not in auto.stderr
    assert "judged by" not in one.stderr
    rep = _report(one)
    assert rep["advice"], "the recording should draw advice, or the comparison says little"
    assert _report(auto) == rep


def test_a_child_that_fails_is_judged_again_by_the_parent(tmp_path: Path) -> None:
    """A child that raises (or dies) leaves its GPUs to the parent: the same report, and
    a warning that says so."""
    rec = recording("fw_lightning_ddp4")
    script = (
        "import os, sys\n"
        "from gpuwatch.advisor import sources\n"
        "parent = os.getpid()\n"
        "feed = sources._feed_recording\n"
        "def failing(engine, path, observe=None, limit=None):\n"
        "    if os.getpid() != parent:\n"
        "        raise MemoryError('a child out of memory')\n"
        "    return feed(engine, path, observe, limit)\n"
        "sources._feed_recording = failing\n"
        "from gpuwatch import cli\n"
        "sys.exit(cli.main(sys.argv[1:]))\n")
    failed = subprocess.run([sys.executable, "-c", script, "advise", "--replay", str(rec),
                             "--format", "json"], capture_output=True, text=True,
                            env=_env(**{split.ENV: "3"}), timeout=600)
    assert "the process judging part of the recording's GPUs failed (MemoryError: a child " \
        "out of memory); judged again in this one" in failed.stderr
    assert failed.stderr.count("judged again") == 2  # both children
    assert _report(failed) == _report(_advise(rec, **{split.ENV: "1"}))
    # the file's warnings (here: none) are not said again by the second pass


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_a_bad_worker_count_is_refused_with_its_name(value: str) -> None:
    proc = _advise(recording("idle"), **{split.ENV: value})
    assert proc.returncode == 2
    assert f"{split.ENV}={value!r}: expected a whole number of processes, 1 or more" \
        in proc.stderr


def test_what_is_judged_in_one_process(tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The policy, in a process taken to be one that may fork (this one may hold torch's
    threads by now: the next test holds the real check)."""
    monkeypatch.delenv(split.ENV, raising=False)
    monkeypatch.setattr(split, "can_fork", lambda: True)
    # a short recording, plain and gzip'd: a child would pay the reading and bucketing
    # again for little
    ddp = tmp_path / "ddp4.jsonl"
    ddp.write_text(read_recording(recording("fw_lightning_ddp4")))
    assert split.peek_gpus(str(ddp)) == [0, 1, 2, 3]
    assert ddp.stat().st_size < split.MIN_BYTES
    assert split.plan(str(ddp))[0] == 1
    gz = recording("fw_lightning_ddp4")
    assert gz.name.endswith(".gz") and gz.stat().st_size < split.MIN_BYTES // 8
    assert split.plan(str(gz))[0] == 1
    # one GPU: nothing to share
    one = _long_recording(tmp_path / "one.jsonl", gpus=1, seconds=9000)
    assert split.plan(str(one))[0] == 1
    # not a file (standard input, a pipe): each child would have to read it again
    assert split.plan("-")[0] == 1
    # asked for, on any recording, as long as this process may fork
    monkeypatch.setenv(split.ENV, "3")
    assert split.plan(str(ddp)) == (3, [0, 1, 2, 3], ddp.stat().st_size)
    # never more than one per GPU and the host's, whatever is asked
    monkeypatch.setenv(split.ENV, "64")
    assert split.plan(str(ddp)).workers == 5
    # a process that may not fork judges in one, whatever is asked
    monkeypatch.setattr(split, "can_fork", lambda: False)
    assert split.plan(str(ddp)) == (1, [], None)


def test_a_process_with_threads_never_forks() -> None:
    """A fresh interpreter may fork; once it has a second thread (the daemon, a
    notebook's kernel), it may not."""
    code = ("import threading\n"
            "from gpuwatch.advisor import split\n"
            "alone = split.can_fork()\n"
            "stop = threading.Event()\n"
            "t = threading.Thread(target=stop.wait)\n"
            "t.start()\n"
            "busy = split.can_fork()\n"
            "stop.set()\n"
            "t.join()\n"
            "print(alone, busy)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False"]


def test_the_gpus_are_dealt_to_the_least_loaded_process() -> None:
    """The parent's share starts at half a GPU's worth (the host and the tally), two and
    a half with an HTML report's charts."""
    judges = split.shares(2, [0, 1, 2, 3, 4, 5, 6, 7])
    assert [g for g in range(8) if judges[0](g)] == [1, 3, 5, 7]
    assert [g for g in range(8) if judges[1](g)] == [0, 2, 4, 6]
    assert judges[0](None) and not judges[1](None)
    judges = split.shares(2, [0, 1, 2, 3, 4, 5, 6, 7], charts=True)
    assert [g for g in range(8) if judges[0](g)] == [3, 5, 7]
    assert [g for g in range(8) if judges[1](g)] == [0, 1, 2, 4, 6]
    judges = split.shares(4, [0, 1, 2, 3, 4, 5, 6, 7])
    assert [[g for g in range(8) if j(g)] for j in judges] == [[3, 7], [2, 6], [1, 5], [0, 4]]
    # one process per GPU and the parent: each child one GPU, the parent the host
    judges = split.shares(5, [4, 5, 6, 7])
    assert [[g for g in (4, 5, 6, 7) if j(g)] for j in judges] == [[], [7], [6], [5], [4]]
    # a GPU first seen after the start goes by its index
    assert judges[(9 + 1) % 5](9)


def test_the_gpus_of_a_compressed_recording_are_seen(tmp_path: Path) -> None:
    import gzip
    text = read_recording(recording("fw_hf_ddp"))
    plain, gz = tmp_path / "r.jsonl", tmp_path / "r.jsonl.gz"
    plain.write_text(text)
    gz.write_bytes(gzip.compress(text.encode()))
    assert split.peek_gpus(str(gz)) == split.peek_gpus(str(plain)) == [0, 1, 2, 3]


@pytest.mark.parametrize("name", ["fw_lightning_ddp4", "gpu_ddp_slow_rank"])
def test_the_html_report_is_the_same_split(name: str) -> None:
    """The HTML report's charts and advice marks come from the judging too (its timeline
    reads each bucket in the parent and every activation once they are merged)."""
    import re

    def html(workers: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "gpuwatch", "advise", "--replay",
                               str(recording(name)), "--format", "html"],
                              capture_output=True, text=True, timeout=600,
                              env=_env(**{split.ENV: workers}))
        assert proc.returncode == 0, proc.stderr
        # each report has ids of its own (two reports on one page do not clash)
        return re.sub(r"gw[0-9a-f]{6}", "gwID", proc.stdout)

    one = html("1")
    assert "started at +" in one  # the charts' advice marks
    assert html("3") == one


def _script(body: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The CLI run by a script that first changes something in this process."""
    script = ("import os, sys\n" + body
              + "from gpuwatch import cli\nsys.exit(cli.main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                          text=True, env=_env(**env), timeout=600)


def test_a_fork_that_fails_leaves_its_gpus_to_the_parent() -> None:
    """The second fork fails (a process limit, memory): the GPUs it was to judge are
    judged by the parent, with a warning; the same report."""
    rec = recording("fw_lightning_ddp4")
    got = _script("real = os.fork\ncalls = []\n"
                  "def fork():\n"
                  "    calls.append(1)\n"
                  "    if len(calls) == 2:\n"
                  "        raise BlockingIOError(11, 'Resource temporarily unavailable')\n"
                  "    return real()\n"
                  "os.fork = fork\n",
                  "advise", "--replay", str(rec), "--format", "json", **{split.ENV: "3"})
    assert "could not start a process to judge part of the recording ([Errno 11] " \
        "Resource temporarily unavailable): this one judges its GPUs" in got.stderr
    assert _report(got) == _report(_advise(rec, **{split.ENV: "1"}))


def _running(marker: str) -> list[int]:
    """Processes whose command line holds ``marker``."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if marker.encode() in (d / "cmdline").read_bytes():
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def _wait_until(what, seconds: float = 20.0) -> bool:
    import time
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if what():
            return True
        time.sleep(0.05)
    return False


def test_a_bad_line_late_in_the_file_stops_every_process(tmp_path: Path) -> None:
    """The same error and exit code as one process, and no child left running."""
    rec = tmp_path / "bad.jsonl"
    rec.write_text(read_recording(recording("fw_lightning_ddp4")) + "{not json\n")
    one = _advise(rec, **{split.ENV: "1"})
    many = _advise(rec, **{split.ENV: "3"})
    assert one.returncode == many.returncode == 2
    assert f"{rec}:" in one.stderr and "not json" not in one.stdout
    assert many.stderr == one.stderr
    assert _wait_until(lambda: not _running(str(rec)), 5.0)


def test_the_children_end_with_their_parent(tmp_path: Path) -> None:
    """The parent killed while it judges (SIGTERM, as `timeout` or systemd send it): no
    child keeps judging on its own."""
    import signal
    rec = _long_recording(tmp_path / "killed.jsonl", gpus=2, seconds=9000)
    proc = subprocess.Popen([sys.executable, "-m", "gpuwatch", "advise", "--replay", str(rec),
                             "--format", "json"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=_env(**{split.ENV: "3"}))
    try:
        assert _wait_until(lambda: len(_running(str(rec))) == 3), _running(str(rec))
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    # at once: each child had seconds of judging left
    assert _wait_until(lambda: not _running(str(rec)), 1.0), _running(str(rec))


def test_a_recording_still_being_written_is_judged_to_where_it_was(tmp_path: Path) -> None:
    """Lines appended after the judging began are read by no process (else each would
    stop at its own end of file): the report of the file as it was."""
    rec = tmp_path / "growing.jsonl"
    text = read_recording(recording("fw_lightning_ddp4"))
    rec.write_text(text)
    want = _report(_advise(rec, **{split.ENV: "1"}))
    last = [json.loads(line) for line in text.splitlines() if '"kind":"gpu"' in
            line.replace(" ", "")][-4:]
    more = tmp_path / "more.jsonl"
    more.write_text("".join(json.dumps(dict(d, t=d["t"] + 1 + i // 4, util=1.0)) + "\n"
                            for i, d in enumerate(last * 300)))
    got = _script("from gpuwatch.advisor import split\n"
                  "plan = split.plan\n"
                  "def growing(path):\n"
                  "    got = plan(path)\n"
                  "    with open(path, 'a') as f:\n"
                  f"        f.write(open({str(more)!r}).read())\n"
                  "    return got\n"
                  "split.plan = growing\n",
                  "advise", "--replay", str(rec), "--format", "json", **{split.ENV: "3"})
    assert rec.stat().st_size > len(text)  # it grew while judged
    assert _report(got) == want


def test_rule_errors_are_said_as_one_process_says_them(tmp_path: Path) -> None:
    """Two rules that raise on every GPU with words of their own (the GPU's util): the
    report's notes name each rule's first failure, in the order one process meets them,
    with the errors of all processes counted together."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "mine.yaml").write_text(
        "rules:\n"
        "  - id: broken-evidence\n    title: evidence that raises\n    severity: info\n"
        "    when: mean(util, 5s) >= 0.05\n    evidence:\n"
        "      boom: pow2floor(mean(util, 5s) + 12345)\n"
        "    message: busy {boom}\n    action: none\n"
        "  - id: broken-condition\n    title: a condition that raises\n    severity: info\n"
        "    when: pow2floor(mean(util, 5s) + 12345) > 0\n"
        "    message: never said\n    action: none\n")
    patch = ("from gpuwatch.advisor import expr\n"
             "real = expr._pow2floor\n"
             "def pow2floor(x):\n"
             "    if x >= 12345:\n"
             "        raise ZeroDivisionError(f'boom at {x:.6f}')\n"
             "    return real(x)\n"
             "expr._pow2floor = pow2floor\n")
    args = ("advise", "--replay", str(recording("fw_lightning_ddp4")), "--format", "json",
            "--rules-dir", str(rules))
    one = _report(_script(patch, *args, **{split.ENV: "1"}))
    many = _report(_script(patch, *args, **{split.ENV: "5"}))
    failed = [n for n in one["notes"] if n.startswith("Rule broken-")]
    assert len(failed) == 2 and "boom at 12345." in failed[0]
    assert many == one
