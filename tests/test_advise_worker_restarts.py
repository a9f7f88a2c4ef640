"""DataLoader workers started anew at every epoch, seen without the hook.

A real torch DataLoader (tests/scripts/epochs_loader.py: 2 workers, epochs of ~0.5 s) runs
beside the real daemon (tests/scripts/stub_daemon.py: NVML stubbed, the job listed on GPU
0, the host and its process trees read for real) recording at its default 1 s tick, and a
real Prometheus scrapes that daemon. The daemon's live advisor judges it as it runs, the
recording is judged by `gpuwatch advise --replay`, the scraped series by `gpuwatch advise
--prometheus`. With persistent_workers=False the pool
is started again every epoch and `enable-persistent-workers` says so from the process tree
alone, both ways; with persistent_workers=True, the same job otherwise, nothing is said of
it. Both jobs run at once (the rule's window is a minute of the job)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, SERVING, DaemonProcess, daemon_env, http_get, wait_for
from test_advise_support import advise_json, run_cli

pytest.importorskip("torch")

EPOCHS = REPO / "tests" / "scripts" / "epochs_loader.py"
SECONDS = 80  # the rule's 60 s window, held 5 s, after the GPU's first line
RULE = "enable-persistent-workers"


@dataclass
class Pair:
    """A job and the daemon beside it, recording."""

    job: subprocess.Popen
    daemon: DaemonProcess
    recording: Path

    def url(self) -> str:
        if not self.daemon.url:
            self.daemon.url = wait_for(
                lambda: (m := SERVING.search(self.daemon.stderr())) and m.group(1),
                "the daemon's serving line", 60, self.daemon.proc)
        return self.daemon.url

    def stop(self) -> None:
        try:
            self.daemon.stop(timeout=30)
        finally:
            try:
                os.killpg(self.job.pid, signal.SIGKILL)  # the job and its workers
            except ProcessLookupError:
                pass
            self.job.wait()


def start_pair(tmp_path: Path, persistent: bool) -> Pair:
    name = "persistent" if persistent else "restarting"
    job = subprocess.Popen([sys.executable, str(EPOCHS), "--workers", "2",
                            "--epoch-seconds", "0.5"] + (["--persistent"] if persistent else []),
                           stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert job.stdout is not None and job.stdout.readline().strip() == "ready"
    (tmp_path / name).mkdir()
    env = daemon_env(tmp_path / name)
    # the job on stub GPU 0, its SMs 40 % active: a GPU that works, not saturated
    env.update(STUB_GPU_PIDS=str(job.pid), STUB_GPUS="1", STUB_SM_ACTIVE="40")
    rec = tmp_path / f"{name}.jsonl"
    proc = subprocess.Popen([sys.executable, str(REPO / "tests/scripts/stub_daemon.py"),
                             "--web.listen-address", "127.0.0.1:0", "--record", str(rec)],
                            cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    daemon = DaemonProcess(proc)
    threading.Thread(target=lambda: daemon.lines.extend(proc.stderr or ()), daemon=True).start()
    return Pair(job, daemon, rec)


def test_restarted_workers_are_told_without_the_hook_and_kept_ones_are_not(
        tmp_path: Path, prometheus) -> None:
    pairs = {p: start_pair(tmp_path, p) for p in (False, True)}
    try:
        url = pairs[False].url()
        prom = prometheus([re.sub(r"^https?://", "", url)], scrape_interval="1s")
        time.sleep(SECONDS)
        prom.wait_for("gpuwatch_job_loader_workers_started_total > 0")
        # the daemon's own advisor, live
        status, _, body = http_get(url + "/api/advice")
        assert status == 200, body
        live = {(a["id"], a["gpu"]) for a in json.loads(body)["advice"]}
        assert (RULE, 0) in live, live
        kept_live = json.loads(http_get(pairs[True].url() + "/api/advice")[2])["advice"]
        assert RULE not in {a["id"] for a in kept_live}
    finally:
        for pair in pairs.values():
            pair.stop()
    restarting, kept = (advise_json(pairs[p].recording) for p in (False, True))
    hosts = [json.loads(x) for x in pairs[False].recording.read_text().splitlines()
             if json.loads(x)["kind"] == "host"]
    started = sum(j.get("loader_workers_started", 0) for h in hosts for j in h.get("jobs", []))
    print(f"{len(hosts)} host lines, {started} workers started in the restarting job's tree")
    (a,) = [a for a in restarting["advice"] if a["id"] == RULE]
    assert a["gpu"] == 0 and a["confidence"] == 0.6 and a["expected_gain"] is None
    ev = a["evidence"]
    print(a["message"])
    # ~2 epochs a second, 2 workers each: some 240 starts a minute, fewer counted where a
    # pool is started and gone between two ticks
    assert ev["job_workers"] >= 1
    assert ev["loader_workers_started_per_minute"] >= 8 * ev["job_workers"]
    assert "first_batch_wait_ratio" not in ev
    assert "times a minute the main process's pool of DataLoader workers is started anew" \
        in a["message"]
    assert "not measured without the torch hook" in a["message"]
    assert "dataloader_persistent_workers=True" in a["action"]
    # a pool started anew can be a DataLoader built anew too, which no setting keeps: both
    # are named, as the process tree cannot tell them apart
    assert "as does a DataLoader built anew" in a["message"]
    assert "no setting keeps the workers of a loader that is replaced" in a["action"]
    assert a["hook_would_add"] and "first batch" in a["hook_would_add"]
    # without the hook the restarts' waits read as the attribution's "other" slice; the
    # catch-all that would say so gives way to the advice that names them
    assert "gpu-underused" not in {x["id"] for x in restarting["advice"]}
    assert RULE not in {x["id"] for x in kept["advice"]}
    # the same from the series Prometheus scraped (its counter's rate, per instance)
    proc = run_cli("advise", "--prometheus", prom.url, "--window", "120", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    fleet = json.loads(proc.stdout)
    told = [(a["id"], a.get("gpu"), a.get("instance")) for a in fleet["advice"]]
    print(told)
    assert any(rid == RULE and gpu == 0 for rid, gpu, _ in told), told
