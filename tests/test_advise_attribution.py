"""Step-time attribution: the five shares always sum to 1, follow the recordings' own
timing, and reach every surface: the advice JSON's ``jobs``, the text report's breakdown
line, ``gpuwatch_train_time_share_ratio`` (checked by promtool) and the status line."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from test_advise_live import play, registry_for
from test_advise_support import DATA, advise_json, one_gpu_second, recording, run_cli

from gpuwatch.advisor import LiveAdvisor
from gpuwatch.advisor.attribution import (
    SHARE_CATEGORIES,
    JobWindow,
    attribute_group,
    claim_shares,
)
from gpuwatch.job.statusline import bottleneck_text, format_status
from gpuwatch.store import Store

ratio = st.one_of(st.none(), st.floats(0, 1.2))


@settings(max_examples=300, deadline=None)
@given(wall=st.floats(0.5, 60), step_frac=st.floats(0, 1.5), data_frac=st.floats(0, 1.5),
       busy=st.floats(0, 1.2), util=ratio, main=ratio, workers_busy=ratio,
       workers=st.one_of(st.none(), st.floats(0, 8)), hook=st.booleans(),
       sync=st.floats(0, 1))
def test_shares_always_sum_to_one(wall, step_frac, data_frac, busy, util, main, workers_busy,
                                  workers, hook, sync):
    w = JobWindow(wall=wall, hook=hook, steps=10, step_total=wall * step_frac,
                  data_total=wall * step_frac * data_frac, busy=busy, util=util, main=main,
                  workers_busy=workers_busy, workers=workers)
    shares = claim_shares(w, sync)
    assert set(shares) == set(SHARE_CATEGORIES)
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-9)
    assert all(0.0 <= v <= 1.0 + 1e-12 for v in shares.values())


def test_priority_claims():
    # 60 % of a fully stepped second waits for data; the GPU is busy 50 % of the time but
    # only 40 % is left after the data wait; the main process is idle
    w = JobWindow(wall=1.0, hook=True, steps=5, step_total=1.0, data_total=0.6, busy=0.5,
                  util=0.6, main=0.0)
    s = claim_shares(w)
    assert s == pytest.approx({"data": 0.6, "sync": 0.0, "gpu": 0.4, "host": 0.0, "other": 0.0})
    # steps cover half the window (an evaluation pause): the rest is "other"
    w = JobWindow(wall=2.0, hook=True, steps=5, step_total=1.0, data_total=0.0, busy=0.2,
                  util=0.3, main=1.0)
    s = claim_shares(w)
    assert s["gpu"] == pytest.approx(0.2) and s["host"] == pytest.approx(0.3)
    assert s["other"] == pytest.approx(0.5)
    # no GPU measured: nothing to attribute
    assert claim_shares(JobWindow(wall=1.0, hook=True, busy=None)) is None


def test_the_rank_that_waits_reports_sync_not_gpu():
    fast = JobWindow(wall=10, hook=True, steps=40, step_total=10, data_total=0.2, busy=0.42,
                     util=0.88, main=1.0)
    slow = JobWindow(wall=10, hook=True, steps=40, step_total=10, data_total=6.0, busy=0.34,
                     util=0.38, main=0.3)
    got = attribute_group({0: (fast, 0), 1: (slow, 1)})
    assert got[0].shares["sync"] == pytest.approx(0.62 - 0.12)
    assert got[0].shares["gpu"] <= 0.42 and got[1].shares["sync"] == 0
    assert got[1].slowest_rank == 1 and got[0].peer_straggler and not got[1].peer_straggler
    assert got[1].score == pytest.approx(0.5) and got[0].score == pytest.approx(1.0)
    assert got[1].straggler_gain == pytest.approx(2.0)
    # one rank alone never waits on a peer
    (alone,) = attribute_group({0: (fast, 0)}).values()
    assert alone.shares["sync"] == 0 and alone.ranks == 1


@pytest.mark.parametrize("name,category,share", [
    ("input_bound", "data", 0.86),  # README: 87 % of each step waits for data
    ("h200_input_bound_w2", "data", 0.72),
    ("small_batch", "host", 0.86),
    ("tuned", "gpu", 0.87),
])
def test_recordings_break_down_as_their_own_timing_says(name, category, share):
    report = advise_json(recording(name))
    (j,) = report["jobs"]
    assert j["gpu"] == 0 and j["source"] == "hook" and j["steps"] > 100
    assert j["bottleneck"] == category
    assert j["time_share"][category] == pytest.approx(share, abs=0.05)
    assert sum(j["time_share"].values()) == pytest.approx(1.0, abs=1e-3)


def test_text_report_has_a_breakdown_line():
    proc = run_cli("advise", "--replay", str(DATA / "input_bound.jsonl"))
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if " time: " in ln]
    (j,) = advise_json(DATA / "input_bound.jsonl")["jobs"]
    data = 100 * j["time_share"]["data"]
    assert 80 <= data <= 90  # README: 87 % of each step waits for data
    assert line.startswith(f"GPU 0 (pid {j['pid']}) training time: data wait {data:.0f} %")
    assert line.index("data wait") < line.index("GPU work")  # the largest slice first


def test_live_time_shares_are_exported():
    store = Store()
    advisor = LiveAdvisor(store, None)
    play(store, advisor, "input_bound")
    reg = registry_for(advisor)
    got = {}
    for fam in reg.collect():
        if fam.name == "gpuwatch_train_time_share_ratio":
            for s in fam.samples:
                got[s.labels["category"]] = s.value
                assert s.labels["gpu"] == "0" and s.labels["pid"]
    assert set(got) == set(SHARE_CATEGORIES)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-3)
    assert got["data"] == pytest.approx(0.86, abs=0.06)
    report = advisor.report_json()
    assert report["jobs"][0]["time_share"]["data"] == pytest.approx(got["data"], abs=1e-3)
    if shutil.which("promtool"):
        proc = subprocess.run(["promtool", "check", "metrics"], input=generate_latest(reg),
                              capture_output=True, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_status_line_names_the_top_bottleneck():
    report = advise_json(DATA / "input_bound.jsonl")
    text = bottleneck_text(report)
    data = 100 * report["jobs"][0]["time_share"]["data"]
    assert text == f"data wait {data:.0f}%"
    from gpuwatch.samples import Snapshot

    line = format_status(Snapshot(t=0.0), [], None, None, text)
    assert f"time: data wait {data:.0f}%" in line
    ranks = {"jobs": [{"rank": 0, "time_share": {"data": 0.02, "sync": 0.5, "gpu": 0.48}},
                      {"rank": 1, "time_share": {"data": 0.6, "sync": 0.0, "gpu": 0.4}}]}
    assert bottleneck_text(ranks) == "data wait 60% on rank 1"


def test_a_line_that_stands_for_many_steps_weighs_as_many():
    """Prometheus-derived step lines carry ``_count`` steps each (advise --prometheus):
    the attribution sums their time as that many steps."""
    from gpuwatch.advisor.engine import Engine
    from gpuwatch.advisor.rules import load_rules

    e = Engine(load_rules(builtin=False, files=[]))
    t0 = 1_800_000_000.0
    for i in range(40):
        t = t0 + i
        e.feed({"kind": "gpu", "t": t, "gpu": 0, "util": 0.5, "sm_active": 0.4,
                "processes": [{"pid": 7}]})
        if i >= 5:  # ten steps of 0.1 s a second, half of each waiting for data
            e.feed({"kind": "step", "t": t + 0.5, "pid": 7, "gpu": 0, "_count": 10,
                    "step_seconds": 0.1, "data_wait_seconds": 0.05})
    e.finish()
    (j,) = e.jobs()
    # 35 lines of 10, every one counted (the attribution's shares leave the first
    # line's second out as start-up; the step count does not)
    assert j["steps"] == 350 and j["step_seconds"] == pytest.approx(0.1)
    assert j["time_share"]["data"] == pytest.approx(0.5, abs=0.03)
    assert j["time_share"]["gpu"] == pytest.approx(0.4, abs=0.03)


def test_the_whole_run_is_the_hooks_own_from_its_first_step():
    """Before the hook's first step the process already looked busy on its GPU (imports,
    CUDA init); the whole run's split starts with the steps, and its clock is theirs: a
    summary line read in the first step's second is start-up, left out with its time."""
    from gpuwatch.advisor.engine import Engine
    from gpuwatch.advisor.rules import load_rules

    e = Engine(load_rules(builtin=False, files=[]))
    t0 = 1_800_000_000.0
    for i in range(10):  # ten seconds of NVML alone: the process on the GPU, no steps yet
        e.feed({"kind": "gpu", "t": t0 + i, "gpu": 0, "util": 0.9, "sm_active": 0.9,
                "processes": [{"pid": 7}]})
    # the first step ends at t0 + 10.2; the rest of that second comes as one summary line
    e.feed({"kind": "step", "t": t0 + 10.2, "pid": 7, "gpu": 0, "step": 1,
            "step_seconds": 3.0, "data_wait_seconds": 0.0})
    e.feed({"kind": "steps", "t": t0 + 10.999, "begin_t": t0 + 10.2, "pid": 7, "gpu": 0,
            "steps": 8, "timed": 8, "step_seconds": 0.799, "data_wait_seconds": 0.7})
    for i in range(11, 31):  # then 20 s of 10 steps a second, 30 % of each waiting
        e.feed({"kind": "gpu", "t": t0 + i, "gpu": 0, "util": 0.6, "sm_active": 0.5,
                "processes": [{"pid": 7}]})
        e.feed({"kind": "steps", "t": t0 + i + 0.999, "begin_t": t0 + i, "pid": 7, "gpu": 0,
                "steps": 10, "timed": 10, "step_seconds": 0.999, "data_wait_seconds": 0.3})
    e.finish()
    (j,) = e.jobs()
    assert j["steps"] == 1 + 8 + 200
    assert j["seconds"] == pytest.approx(20.0, abs=0.05)
    assert j["time_share"]["data"] == pytest.approx(0.3, abs=0.01)
    # SM active over the steps' own seconds (0.5), not the busy start-up's (0.9)
    assert j["time_share"]["gpu"] == pytest.approx(0.5, abs=0.01)


def test_without_the_hook_a_launch_groups_its_ranks_while_it_lasts():
    """Host lines' trees carry each rank's launch (host.py): GPUs of one launch are one job
    even where the launcher's own tree (a CUDA context, no RANK) sits on GPU 0 too; once
    the trees say no launch (the job ended, another took the GPUs) each GPU stands alone."""
    from gpuwatch.advisor.engine import Engine
    from gpuwatch.advisor.rules import load_rules

    e = Engine(load_rules(builtin=False, files=[]))
    e.jobs_window = 15.0  # the live daemon's view: the last 15 s
    t0 = 1_800_000_000.0

    def second(i: int, ranked: bool) -> None:
        t = t0 + i
        # GPU 0 spins in NCCL for its peer; GPU 1 waits on its pegged workers
        e.feed({"kind": "gpu", "t": t, "gpu": 0, "util": 0.9, "sm_active": 0.2,
                "processes": [{"pid": 100}, {"pid": 10}]})
        e.feed({"kind": "gpu", "t": t, "gpu": 1, "util": 0.15, "sm_active": 0.1,
                "processes": [{"pid": 200}]})
        launch = {"dist_job": "abcdefabcdef", "world_size": 2} if ranked else {}
        e.feed({"kind": "host", "t": t + 0.1, "jobs": [
            {"pid": 10, "main_cpu_cores": 0.0, "workers_cpu_cores": 0.0, "gpus": [0]},
            {"pid": 100, "main_cpu_cores": 1.0, "workers_cpu_cores": 0.0, "gpus": [0],
             **({"rank": 0} if ranked else {}), **launch},
            {"pid": 200, "main_cpu_cores": 0.1, "workers_cpu_cores": 2.0, "processes": 3,
             "gpus": [1], **({"rank": 1} if ranked else {}), **launch}]})

    for i in range(30):
        second(i, ranked=True)
    e.advance_to(t0 + 30)
    jobs = {j["gpu"]: j for j in e.jobs()}
    assert (jobs[0]["rank"], jobs[1]["rank"]) == (0, 1) and jobs[0]["ranks"] == 2
    assert jobs[0]["time_share"]["sync"] >= 0.5 and jobs[0]["bottleneck"] == "sync"
    assert jobs[1]["time_share"]["data"] >= 0.5
    for i in range(30, 60):
        second(i, ranked=False)
    e.advance_to(t0 + 60)
    jobs = {j["gpu"]: j for j in e.jobs()}
    assert "ranks" not in jobs[0] and jobs[0]["time_share"]["sync"] == 0.0


# -- the attribution as it was written before (dicts, frozen dataclasses), to hold the
# faster one to the same numbers ----------------------------------------------------------
def _claim_before(w: JobWindow, sync: float = 0.0) -> dict[str, float] | None:
    if w.wall <= 0 or w.busy is None:
        return None
    busy = min(1.0, max(0.0, w.busy))
    if w.hook:
        in_step = min(1.0, w.step_total / w.wall)
        data = min(in_step, (w.data_total or 0.0) / w.wall)
        sync = min(max(0.0, sync), in_step - data)
        gpu = min(busy, 1.0 - data - sync)
        room = max(0.0, in_step - data - sync - gpu)
        host = min(room, w.main) if w.main is not None else room
    else:
        sync = min(1.0, max(0.0, sync))
        gpu = min(busy, 1.0 - sync)
        rest = 1.0 - gpu - sync
        if w.workers_pegged:
            data, host = rest, 0.0
        else:
            data = 0.0
            host = min(rest, w.main) if w.main is not None else 0.0
    shares = {"data": data, "sync": sync, "gpu": gpu, "host": host}
    shares = {k: max(0.0, v) for k, v in shares.items()}
    total = sum(shares.values())
    if total > 1.0:
        shares = {k: v / total for k, v in shares.items()}
        total = 1.0
    shares["other"] = 1.0 - total
    return shares


def _group_before(windows: dict) -> dict:
    needs = {k: w.need() for k, (w, _) in windows.items()}
    multi = len(windows) >= 2
    top = max(needs.values(), default=0.0)
    syncs = {k: (top - n if multi else 0.0) for k, n in needs.items()}
    own = {k: max(1e-6, 1.0 - s) for k, s in syncs.items()}
    best = min(own.values(), default=1.0)
    slowest = max(own, key=lambda k: own[k]) if multi else None
    slow_rank = windows[slowest][1] if slowest is not None else None
    shares_of = {k: _claim_before(w, syncs[k]) for k, (w, _) in windows.items()}
    others = sorted(v for k, v in own.items() if k != slowest)
    gain = 1.0
    if others and slowest is not None:
        mid = len(others) // 2
        pace = others[mid] if len(others) % 2 else (others[mid - 1] + others[mid]) / 2
        sh = shares_of[slowest]
        if sh is not None and max(sh["data"], sh["host"]) >= sh["gpu"]:
            pace = max(pace, own[slowest] * (1.0 - max(sh["data"], sh["host"])))
        gain = own[slowest] / pace
    slow_score = best / own[slowest] if slowest is not None else 1.0
    out = {}
    for k, (w, rank) in windows.items():
        shares = shares_of[k]
        if shares is None:
            continue
        out[k] = dict(shares=shares, window=w, rank=rank, ranks=len(windows),
                      score=best / own[k], slowest_rank=slow_rank,
                      peer_straggler=(multi and k != slowest and slow_score < 0.75),
                      straggler_gain=max(1.0, gain) if multi else 1.0)
    return out


window_st = st.builds(
    JobWindow, wall=st.floats(0.001, 60), hook=st.booleans(), steps=st.floats(0, 100),
    step_total=st.floats(0, 80), data_total=st.one_of(st.none(), st.floats(0, 80)),
    busy=ratio, util=ratio, main=ratio, workers_busy=ratio,
    workers=st.one_of(st.none(), st.floats(0, 8)),
    away=st.just(0.0))  # no phase away from training: the form before knew none


@settings(max_examples=400, deadline=None)
@given(windows=st.lists(window_st, min_size=1, max_size=5),
       ranks=st.lists(st.one_of(st.none(), st.integers(0, 7)), min_size=5, max_size=5))
def test_the_attribution_gives_the_numbers_it_gave_before(windows, ranks):
    """A job of one process takes a short way (no ranking), the shares are summed
    without dicts: the same shares, scores and gains as before, float for float."""
    group = {g: (w, ranks[g]) for g, w in enumerate(windows)}
    attrs = attribute_group(group)
    got = {k: a._asdict() for k, a in attrs.items()}
    job_busy = {k: d.pop("job_busy") for k, d in got.items()}  # new since: checked below
    over = {k: d.pop("over_peers") for k, d in got.items()}  # new since: checked below
    for d in got.values():  # new since: no window here is away from training
        assert (d.pop("away_wait"), d.pop("away_rank")) == (0.0, None)
    assert got == _group_before(group)
    # every rank reads the same job-wide busy: the highest of the ranks' own
    own = [b for a in attrs.values() if (b := a.value("busy_in_steps")) is not None]
    for k, a in attrs.items():
        if a.ranks > 1:
            assert job_busy[k] == (max(own) if own else None)
    # what the slowest rank does more of than the others: its slices over its own time
    # less the others' median; the other ranks (and a job of one process) have none
    slow = [k for k, a in attrs.items() if a.ranks > 1 and a.rank == a.slowest_rank]
    for k, a in attrs.items():
        if not over[k]:
            continue
        assert k in slow and set(over[k]) == {"data", "host", "gpu"}
        own_k = 1.0 - a.shares["sync"]
        for c in ("data", "host", "gpu"):
            assert over[k][c] <= a.shares[c] / max(own_k, 1e-6) + 1e-9
        assert a.value("job_busy_in_steps") == (job_busy[k] if a.ranks > 1
                                                else a.value("busy_in_steps"))
    for w in windows:
        assert claim_shares(w, 0.3) == _claim_before(w, 0.3)


def test_a_rank_waits_while_a_peer_is_away_from_training():
    """Rank 0 spends 10 s of a 40 s stretch saving (its wall is the 30 s of training);
    rank 1 trains all 40 s, and for those 10 s it sits in its next step's all-reduce. That
    wait is rank 1's sync share, even where NVML cannot tell it (its need reads as rank
    0's); rank 0, away to save, is no straggler of the training steps."""
    saver = JobWindow(wall=30.0, hook=True, steps=300, step_total=30.0, data_total=0.0,
                      busy=0.2, util=0.5, main=1.0, away=10.0)
    waiter = JobWindow(wall=40.0, hook=True, steps=300, step_total=40.0, data_total=0.0,
                       busy=0.15, util=0.5, main=1.0)
    got = attribute_group({0: (saver, 0), 1: (waiter, 1)})
    assert got[1].shares["sync"] == pytest.approx(10.0 / 40.0)
    assert got[0].shares["sync"] == 0.0
    assert got[1].value("peer_away_share") == pytest.approx(0.25)
    assert got[1].value("away_rank") == 0.0 and got[0].value("away_rank") is None
    assert sum(got[1].shares.values()) == pytest.approx(1.0)
    assert not got[0].peer_straggler and not got[1].peer_straggler
    assert got[0].score == got[1].score == 1.0
    # phases' own jitter (a few hundredths of a second each) is no wait
    got = attribute_group({0: (saver._replace(away=0.5), 0), 1: (waiter._replace(away=0.1), 1)})
    assert got[1].shares["sync"] == 0.0
    # the larger of the two readings: a pipeline wait NVML saw is not counted twice
    slow = waiter._replace(util=0.9)  # NCCL spinning while it waits: needs little
    got = attribute_group({0: (saver, 0), 1: (slow, 1)})
    assert got[1].shares["sync"] == pytest.approx(max(0.5 - 0.1, 10.0 / 40.0))


def test_without_the_hook_a_rank_saving_with_its_gpu_idle_is_away_not_a_straggler():
    """No hook, 40 s: rank 0's GPU idles 16 s of them while its main process writes (a
    save seen from outside: ``away``, which its wall holds without the hook's phases) and
    reads 70 % util in the other 24 s, as rank 1 does all 40 s (its NCCL kernels spinning
    through the save). Rank 1 waits for the save: that wait is claimed and named as a
    peer's time away, and neither rank is the steps' straggler, where reading rank 0's
    save as its steps' need made it rank 1's slower peer. Where the writes were never
    read, no one knows."""
    saver = JobWindow(wall=40.0, hook=False, busy=0.15, util=0.6 * 0.7, main=1.0,
                      away=16.0, writes_read=True)
    waiter = JobWindow(wall=40.0, hook=False, busy=0.15, util=0.7, main=1.0,
                       writes_read=True)
    got = attribute_group({0: (saver, 0), 1: (waiter, 1)})
    # the save's 40 % (the larger reading; NVML's needs differ by 28 %)
    assert got[1].shares["sync"] == pytest.approx(0.4)
    assert got[1].value("peer_away_share") == pytest.approx(0.4)
    assert got[1].value("away_rank") == 0.0 and got[0].value("peer_away_share") == 0.0
    assert sum(got[1].shares.values()) == pytest.approx(1.0)
    # the standing from the training seconds: both need 30 % there
    assert got[0].score == pytest.approx(1.0) and got[1].score == pytest.approx(1.0)
    assert not got[1].peer_straggler and not got[0].peer_straggler
    # the same two with the save unseen: rank 0 is the slower peer rank 1 waits for
    plain = attribute_group({0: (saver._replace(away=0.0), 0), 1: (waiter, 1)})
    assert plain[1].peer_straggler and plain[0].score == pytest.approx(0.72)
    assert plain[1].value("peer_away_share") == 0.0
    # nothing read of the writes (a rule set that asks for none): the wait is unknown
    unread = attribute_group({0: (saver._replace(away=0.0, writes_read=False), 0),
                              1: (waiter._replace(writes_read=False), 1)})
    assert unread[1].value("peer_away_share") is None


def _saves_on_rank_zero(path, seconds: int = 180):
    """Two ranks of one launch (their environment's digest), no hook: from the 10th second
    on, rank 0 spends 6 s of every 10 writing 600 MB/s with its GPU idle (util 3 %),
    while rank 1's NCCL kernels spin (util 95 %, SMs 2 % active); both train alike the
    other 4 s (util 90 %, SMs 60 %). Memory is 94 % used (no room for a larger batch)."""
    import json

    t0, gib = 1_800_000_000.0, 2**30
    with open(path, "w", encoding="utf-8") as f:
        def w(d):
            f.write(json.dumps(d) + "\n")
        w({"kind": "meta", "format": "gpuwatch-trace/1", "gpu_name": "NVIDIA H100 80GB HBM3",
           "compute_capability": [9, 0], "host_cpus": 32, "sample_hz": 1})
        for s in range(seconds):
            saving = s >= 10 and s % 10 < 6
            for g in range(2):
                util, sm = ((0.03, 0.01) if g == 0 else (0.95, 0.02)) if saving else (0.9, 0.6)
                w({"t": t0 + s, "kind": "gpu", "gpu": g, "util": util, "sm_active": sm,
                   "sm_occupancy": sm / 2, "mem_util": 0.2, "mem_used_bytes": 75 * gib,
                   "mem_total_bytes": 80 * gib,
                   "processes": [{"pid": 100 + g, "mem_used_bytes": 74 * gib}]})
            jobs = [{"pid": 100 + g, "name": "python", "user": "root", "cpu_cores": 1.05,
                     "main_cpu_cores": 1.0, "workers_cpu_cores": 0.05, "processes": 3,
                     "rss_bytes": 4 * gib, "loader_workers": 2, "loader_cpu_cores": 0.05,
                     "main_write_bytes_per_second": 600e6 if g == 0 and saving else 0.0,
                     "gpus": [g], "rank": g, "world_size": 2, "dist_job": "5a7e0c1d2b3f"}
                    for g in range(2)]
            w({"t": t0 + s + 0.5, "kind": "host", "cpu_util": 0.07, "load1": 2.0,
               "mem_used_bytes": 20 * gib, "mem_total_bytes": 500 * gib, "job_cpu_cores": 2.1,
               "job_processes": 6, "job_main_cpu_cores": 2.0, "job_workers_cpu_cores": 0.1,
               "job_loader_workers": 4, "job_loader_cpu_cores": 0.1,
               "job_write_bytes_per_second": 600e6 if saving else 0.0, "jobs": jobs})
    return path


def test_without_the_hook_the_wait_for_a_peers_saves_is_named_and_counted(tmp_path):
    """Rank 1 waits for rank 0's saves (its GPU idle while it writes, seen from outside):
    the run's time line counts that wait as rank 1's wait on a peer and rank 0's saves as
    its `other` (not the host's per-step time), rank 0 is told about its saves, and rank
    1 is told it waits while rank 0 writes, with the saves' remedies, not the hook's
    phases' words (evaluating, compiling) nor a slow rank's pipeline."""
    rep = advise_json(_saves_on_rank_zero(tmp_path / "saves.jsonl"))
    shares = {j["gpu"]: j["time_share"] for j in rep["jobs"]}
    assert {j["source"] for j in rep["jobs"]} == {"nvml"}
    assert shares[0]["other"] == pytest.approx(0.57, abs=0.05)  # 6 s of 10, from the 10th
    assert shares[0]["host"] < 0.25
    assert shares[1]["sync"] == pytest.approx(0.57, abs=0.05)
    assert [a["gpu"] for a in rep["advice"] if a["id"] == "slow-checkpointing"] == [0]
    (told,) = [a for a in rep["advice"] if a["id"] == "gpu-underused"]
    assert told["gpu"] == 1 and told["evidence"]["peer_away_share"] >= 0.4
    assert "while rank 0 wrote to storage with its GPU idle" in told["action"]
    assert "save less often" in told["action"]
    assert "hook's phases" not in told["action"] and "evaluat" not in told["action"]
    assert not [a for a in rep["advice"] if a["id"] == "straggler-rank"]


def test_ranks_that_wait_on_rank_zeros_saves_say_so():
    """The Trainer under torchrun on 4 H100s saving every 50 steps: rank 0 writes (26 % of
    its time since the first step), ranks 1-3 call _save_checkpoint too (a few ms: they
    write nothing) and then wait in their next step's all-reduce. Their short checkpoint
    phase lies between two `phase` lines that both say train; it once coloured the
    seconds up to the next line as checkpoint, so their wait read as their own host time
    (host 82 %, waiting on peers 2-4 %). Now each waits on its peer for as long as rank 0
    saved."""
    rep = advise_json(recording("fw_hf_save_ddp"))
    jobs = {j["gpu"]: j for j in rep["jobs"]}
    saved = jobs[0]["phases"]["checkpoint"] / (jobs[0]["phases"]["checkpoint"]
                                               + jobs[0]["phases"]["train"])
    assert jobs[0]["time_share"]["sync"] == 0.0
    for g in (1, 2, 3):
        print(g, jobs[g]["time_share"], f"rank 0 saved {saved:.0%}")
        assert jobs[g]["phases"].get("checkpoint", 0.0) < 0.1
        assert jobs[g]["time_share"]["sync"] == pytest.approx(saved, abs=0.04)
    assert [a["gpu"] for a in rep["advice"] if a["id"] == "slow-checkpointing"] == [0]
    assert not [a for a in rep["advice"] if a["id"] == "straggler-rank"]
    # the batch, host-bound steps on each rank, is told on rank 0; the ranks that waited for
    # its saves are not told the catch-all for that wait (their NCCL kernels spin through
    # it: rank 0 reads as the slower of the steps, and its advice is theirs)
    batch = [a for a in rep["advice"] if a["id"] == "raise-batch-size"]
    assert 0 in {a["gpu"] for a in batch}
    assert len({a["action"].split(" on every rank")[0] for a in batch}) == 1
    assert "per_device_train_batch_size=32 → 64) (in torch: DataLoader(batch_size=64)) on " \
        "every rank" in batch[0]["action"]
    assert not [a for a in rep["advice"] if a["id"] == "gpu-underused"]


def _steady(e, t0: float, seconds: range, util: float, steps: bool) -> None:
    for i in seconds:
        one_gpu_second(e, t0 + i, util, util * 0.95, 8, steps)


def test_the_time_after_a_jobs_last_step_is_not_time_between_steps():
    """A loop that ends (a `break` out of a DataLoader whose persistent workers then take
    40 s to join, a final upload) leaves its process on the GPU with no step: that stretch
    is not known to lie between steps, so the windows end at the last step and no
    'time outside training steps' is read from it; once a step comes again, the gap lies
    between steps and counts."""
    from gpuwatch.advisor.engine import Engine
    from gpuwatch.advisor.rules import load_rules

    t0 = 1_800_000_000.0
    e = Engine(load_rules())
    _steady(e, t0, range(0, 40), 0.95, True)  # 40 s of GPU-bound steps
    _steady(e, t0, range(40, 80), 0.0, False)  # 40 s on the GPU, no step, nothing running
    subj = e.frame.subjects[0]
    end = e.frame.idx
    w = e.frame.job_window(subj, end, 15)
    assert w is None  # the whole window lies after the last step
    w = e.frame.job_window(subj, end - 30, 15)  # reaching back over the last steps
    assert w.steps > 0 and w.wall <= 6.0 and w.step_total == pytest.approx(w.wall, abs=1.0)
    e.feed({"kind": "job_end", "t": t0 + 80.5, "pid": 7, "gpu": 0, "exit_reason": "exited"})
    e.finish()
    assert "gpu-underused" not in {f.rule.id for f in e.findings}
    (j,) = e.jobs()
    assert j["time_share"]["gpu"] >= 0.9  # the run's own split: its steps' time

    # the same pause, and then the steps go on: the pause lay between steps
    e = Engine(load_rules())
    _steady(e, t0, range(0, 40), 0.95, True)
    _steady(e, t0, range(40, 80), 0.0, False)
    _steady(e, t0, range(80, 84), 0.95, True)
    subj = e.frame.subjects[0]
    w = e.frame.job_window(subj, e.frame.idx, 15)
    assert w.wall >= 14.0 and w.step_total < 0.5 * w.wall  # the gap is in the window
