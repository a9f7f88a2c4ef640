"""A daemon that outlives the job it watched (a service, or one started beside the job and
stopped later): the idle seconds after the job ended are no training of it. The advice is
the recording's as made (which ends within seconds of the job), with and without the
hook; nothing starts after the job, and what held while it trained ends."""

from __future__ import annotations

import logging

import pytest
from test_advise_support import advise_json, load, outlived, recording, write

from gpuwatch.advisor import LiveAdvisor
from gpuwatch.advisor.rules import load_rules
from gpuwatch.samples import GpuSample, HostSample, Snapshot
from gpuwatch.store import Store

HOOK_KINDS = ("step", "steps", "config", "phase", "hook_problem", "job_end")
# (their windows read the job's last seconds beside the idle GPU it left: each was told
# something more when the daemon ran on for 90 s, before the jobs' phases' rules stopped
# at the job's end)
CASES = [
    ("fw_hf_large_bf16", True),       # gpu-underused, 7 s after the job's exit report
    ("fw_accelerate_ddp", True),      # add-dataloader-workers and gpu-underused on rank 3
    ("fw_hf_save_ddp", True),         # work-every-n-steps on ranks 1-3, a minute after
    ("fw_lightning_cnn_anomaly", True),  # raise-batch-size, 8 s after
    ("fw_hf_text_starved", False),    # gpu-underused, and the workers' advice held on
    ("fw_nanogpt_like", False),       # add-dataloader-workers, 11 s after the process left
    ("fw_hf_remote_cpu", False),      # raise-batch-size, 8 s after
    ("fw_hf_predict_ddp", False),     # raise-batch-size on all 4 ranks, 3 s after (a
    #                                   rule held mostly on the job's last seconds)
]


def by_gpu(report: dict) -> set[tuple[str, int | None]]:
    return {(a["id"], a["gpu"]) for a in report["advice"]}


def job_gone(lines: list[dict]) -> float:
    """When NVML last listed a process on any GPU of the recording."""
    return max(d["t"] for d in lines if d.get("kind") == "gpu" and d.get("processes"))


@pytest.mark.parametrize("name,hook", CASES)
def test_the_idle_after_the_job_tells_nothing_of_it(tmp_path, name, hook):
    lines = load(name)
    if not hook:
        lines = [d for d in lines if d.get("kind") not in HOOK_KINDS]
    as_made = advise_json(write(tmp_path / "as_made.jsonl", lines))
    longer = advise_json(write(tmp_path / "outlived.jsonl", outlived(lines, after=90)))
    assert by_gpu(longer) == by_gpu(as_made)
    gone = job_gone(lines)
    phase = {r.id: r.phase for r in load_rules().rules}
    for a in longer["advice"]:
        assert a["since"] <= gone + 3, (a["id"], a["gpu"], a["since"] - gone)
        # the job's phases' rules end (their keep is under the 90 s); a rule judged in any
        # phase holds as it is (slow-checkpointing keeps 10 min: saves may be minutes apart)
        assert not a["active"] or phase[a["id"]] == "any", (a["id"], a["gpu"])


def test_the_daemons_own_advisor_starts_nothing_after_the_job(caplog):
    """Live, the same: the Trainer's job on 4 H100s (fw_accelerate_ddp, the hook's exit
    reports at its end) published tick by tick as the daemon does, then a minute and a
    half of its GPUs idle with no process: no advice starts after the job (before, rank
    3 was told add-dataloader-workers and gpu-underused 7 s after it), and what held while
    it trained ends."""
    from test_advise_live import play  # the daemon's publishing, tick by tick

    store = Store()
    advisor = LiveAdvisor(store, None)
    gone = job_gone(load("fw_accelerate_ddp"))
    with caplog.at_level(logging.INFO, logger="gpuwatch.advisor.live"):
        play(store, advisor, "fw_accelerate_ddp", every=1)
        during = {r.getMessage() for r in caplog.records if "advice started" in r.getMessage()}
        assert during  # (the batch and the fused optimizer, on every rank)
        last = store.latest()
        for i in range(1, 91):
            t = last.t + i
            gpus = tuple(GpuSample(t=t, gpu=g.gpu, util=0.0, mem_used_bytes=600_000_000,
                                   mem_total_bytes=g.mem_total_bytes, processes=())
                         for g in last.gpus)
            store.publish(Snapshot(t=t, gpus=gpus, infos=last.infos,
                                   host=HostSample(t=t, cpu_util_per_core=(0.0,) * 16)))
            advisor.evaluate()
    after = {r.getMessage() for r in caplog.records
             if "advice started" in r.getMessage()} - during
    assert not after, after
    assert store.latest().t > gone + 60
    assert advisor.report_json()["advice"] == []


@pytest.mark.parametrize("name,resolution", [("fw_hf_service", 1.0),
                                             ("fw_hf_service_2s_bare", 2.0)])
def test_a_service_recording_tells_only_of_the_job(name, resolution):
    """Recorded as the service sees a job (1x H100, twenty-sixth session): the daemon up
    20 s before the Trainer's run and 60 s after it, the hook reporting to it; and the
    same run without the hook under a daemon at --interval 2. The batch is told while the
    job ran and ends with it (it held 12 s and 9 s into the idle after, before); the
    2-s recording is judged in 2-s buckets."""
    lines = load(name)
    report = advise_json(recording(name))
    assert report["source"]["resolution_seconds"] == resolution
    gone = job_gone(lines)
    first = min(d["t"] for d in lines if d.get("kind") == "gpu" and d.get("processes"))
    assert first - lines[1]["t"] >= 15 and report["source"]["end"] - gone >= 55
    (a,) = report["advice"]
    assert a["id"] == "raise-batch-size" and not a["active"]
    # (its last bucket: the one the process was last listed in, or the grace's after it)
    assert first < a["since"] and a["last_seen"] <= gone + 2 + 2 * resolution, \
        (a["since"], a["last_seen"], gone)
