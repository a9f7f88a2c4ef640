"""Per-GPU process trees on real GPUs (run on the lent machine with two GPUs; skipped
elsewhere): a launcher that holds a CUDA context itself (as `mp.spawn` from a parent that
touched CUDA does) starts one rank per GPU, each with its own two workers; rank 1's
workers spin, rank 0's sleep. `gpuwatch record` beside it, then the recording's host lines
and `gpuwatch advise` must show one tree per rank on its own GPU, the launcher apart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="needs two CUDA GPUs")]

REPO = Path(__file__).resolve().parents[1]
WORKER = ("import os, sys, time\nppid = os.getppid()\nbusy = sys.argv[1] == 'busy'\n"
          "while os.getppid() == ppid:\n    if not busy:\n        time.sleep(0.05)\n")
RANK = (
    "import os, subprocess, sys, time, torch\n"
    "rank, work, worker = int(sys.argv[1]), sys.argv[2], sys.argv[3]\n"
    "torch.cuda.set_device(rank)\n"
    "x = torch.ones(1 << 28, device='cuda')  # 1 GiB: this rank owns its GPU\n"
    "kids = [subprocess.Popen([sys.executable, '-c', worker, work]) for _ in range(2)]\n"
    "print(os.getpid(), *[k.pid for k in kids], flush=True)\n"
    "ppid = os.getppid()\n"
    "while os.getppid() == ppid:\n"
    "    (x[: 1 << 20] * 2).sum().item()\n"
    "    time.sleep(0.01)\n")
LAUNCHER = (
    "import subprocess, sys, time, torch\n"
    "torch.zeros(1, device='cuda:0')  # the launcher's own CUDA context on GPU 0\n"
    "rank, worker = sys.argv[1], sys.argv[2]\n"
    "ranks = [subprocess.Popen([sys.executable, '-c', rank, str(r), w, worker],\n"
    "                          stdout=subprocess.PIPE, text=True)\n"
    "         for r, w in ((0, 'idle'), (1, 'busy'))]\n"
    "for r in ranks:\n    print(r.stdout.readline().strip(), flush=True)\n"
    "while True:\n    time.sleep(0.2)\n")


def test_each_rank_is_its_own_tree_on_its_own_gpu(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH")}
    env["PYTHONPATH"] = str(REPO)
    rec = tmp_path / "ranks.jsonl"
    job = subprocess.Popen([sys.executable, "-c", LAUNCHER, RANK, WORKER],
                           stdout=subprocess.PIPE, text=True, start_new_session=True, env=env)
    try:
        assert job.stdout is not None
        ranks = [[int(x) for x in job.stdout.readline().split()] for _ in range(2)]
        record = subprocess.run([sys.executable, "-m", "gpuwatch", "record", str(rec),
                                 "--duration", "12"], env=env, cwd=REPO, capture_output=True,
                                text=True, timeout=120, check=False)
        assert record.returncode == 0, record.stderr
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    lines = [json.loads(x) for x in rec.read_text().splitlines() if x.strip()]
    trees = [d["jobs"] for d in lines if d.get("kind") == "host" and d.get("jobs")]
    assert trees, "no job trees recorded"
    last = {j["pid"]: j for j in trees[-1]}
    print(json.dumps(trees[-1], indent=1))
    r0, r1 = (last[r[0]] for r in ranks)
    assert r0["gpus"] == [0] and r1["gpus"] == [1]
    assert r0["processes"] == 3 and r1["processes"] == 3
    # the launcher holds only a small context on GPU 0 (rank 0 holds most of its memory):
    # it roots no tree that swallows the ranks; where listed, it is a tree of its own
    # (on the 2x H100 it was not listed at all)
    assert job.pid not in last or last[job.pid]["processes"] == 1
    # rank 1's own workers spin, rank 0's sleep: measured per tree, over the last ticks
    w1 = sum(t["workers_cpu_cores"] for d in trees[-5:] for t in d if t["pid"] == r1["pid"])
    w0 = sum(t["workers_cpu_cores"] for d in trees[-5:] for t in d if t["pid"] == r0["pid"])
    assert w1 > 5 * max(w0, 0.01), (w0, w1)
    proc = subprocess.run([sys.executable, "-m", "gpuwatch", "advise", "--replay", str(rec),
                           "--format", "json"], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    print(json.dumps(report["jobs"], indent=1))
    # every GPU of the host is reported (the ranks use the first two of them)
    assert sorted(g["gpu"] for g in report["gpus"]) == list(range(torch.cuda.device_count()))
