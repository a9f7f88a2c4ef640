"""Per-GPU process trees without the hook: real process trees on this machine (a launcher
with two ranks, each with its own DataLoader-like workers) and a stubbed NVML that lists
the ranks on GPUs 0 and 1, through the real Sampler and host layer into a recording and
`gpuwatch advise`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from conftest import wait_for
from nvml_stub import NvmlStub, StubGpu

from gpuwatch.host import HostSampler
from gpuwatch.sampler import Sampler, gpu_processes
from gpuwatch.samples import GpuProcess, GpuSample
from gpuwatch.store import Store

GiB = 2**30
# spins (busy) or sleeps (idle) until its parent is gone: nothing outlives the test
LOOP = ("import os, sys, time\nppid = os.getppid()\nbusy = sys.argv[1] == 'busy'\n"
        "while os.getppid() == ppid:\n    if not busy:\n        time.sleep(0.05)\n")
# a rank: starts its workers, says "rank_pid worker_pid ...", then its own loop
RANK = ("import subprocess, sys\nloop, main, work, n = sys.argv[1:5]\n"
        "kids = [subprocess.Popen([sys.executable, '-c', loop, work]) for _ in range(int(n))]\n"
        "import os\nprint(os.getpid(), *[k.pid for k in kids], flush=True)\n"
        "exec(loop.replace('sys.argv[1]', repr(main)))\n")
# the launcher (torchrun, accelerate, mp.spawn): starts the ranks, passes on their lines
LAUNCHER = ("import subprocess, sys\nloop, rank, specs = sys.argv[1], sys.argv[2], sys.argv[3:]\n"
            "ranks = [subprocess.Popen([sys.executable, '-c', rank, loop, *s.split(',')],\n"
            "                          stdout=subprocess.PIPE, text=True) for s in specs]\n"
            "for r in ranks:\n    print(r.stdout.readline().strip(), flush=True)\n"
            "import time\nwhile True:\n    time.sleep(0.2)\n")


class Tree:
    def __init__(self, proc: subprocess.Popen, ranks: list[list[int]]) -> None:
        self.proc = proc
        self.ranks = [r[0] for r in ranks]
        self.workers = [r[1:] for r in ranks]

    @property
    def launcher(self) -> int:
        return self.proc.pid


@pytest.fixture
def ddp_tree() -> Iterator[Tree]:
    """Rank 0: its main process busy, its 2 workers idle. Rank 1: its main process waits,
    its 2 workers are pegged (the slow input pipeline of issue #9)."""
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, LOOP, RANK, "busy,idle,2",
                             "idle,busy,2"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    ranks = [[int(x) for x in proc.stdout.readline().split()] for _ in range(2)]
    tree = Tree(proc, ranks)
    yield tree
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def stub_for(tree: Tree, launcher_context: bool) -> NvmlStub:
    """NVML lists rank 0 on GPU 0 and rank 1 on GPU 1, each holding 20 GiB; with
    ``launcher_context`` the launcher holds a 300 MiB CUDA context on GPU 0 too (mp.spawn
    from a parent that touched CUDA, a launcher that queried the device)."""
    gpu0 = [(tree.ranks[0], 20 * GiB)]
    if launcher_context:
        gpu0.append((tree.launcher, 300 * 2**20))
    return NvmlStub([StubGpu(0, processes=gpu0), StubGpu(1, processes=[(tree.ranks[1], 20 * GiB)])])


def tick_until_measured(sampler: Sampler, tree: Tree) -> dict[int, object]:
    """The jobs by pid, their CPU measured over a whole second once every process of the
    tree is running (a worker's own start-up would read as busy)."""

    def ready() -> bool:
        time.sleep(0.3)
        jobs = {j.pid: j for j in sampler.tick().host.jobs}
        return all(r in jobs and jobs[r].processes == 3 and jobs[r].cpu_cores > 0.05
                   for r in tree.ranks)

    wait_for(ready, "both ranks and their workers seen", timeout=30)
    time.sleep(1.0)
    return {j.pid: j for j in sampler.tick().host.jobs}


@pytest.mark.parametrize("launcher_context", [False, True])
def test_each_gpu_has_its_own_rank_and_workers(ddp_tree: Tree, launcher_context: bool) -> None:
    stub = stub_for(ddp_tree, launcher_context)
    sampler = Sampler(Store(), nvml_module=stub, host=HostSampler())
    try:
        jobs = tick_until_measured(sampler, ddp_tree)
    finally:
        for g in stub.gpus:
            g.release()
        sampler.stop()
    r0, r1 = (jobs[p] for p in ddp_tree.ranks)
    assert r0.gpus == (0,) and r1.gpus == (1,)
    assert r0.processes == 3 and r1.processes == 3  # each rank with its own 2 workers
    # rank 1's own workers are pegged while its main process waits; rank 0 the reverse
    # (the machine may be shared: spinning processes get what the scheduler gives them)
    assert r1.workers_cpu_cores > r1.main_cpu_cores + 0.1, r1
    assert r0.main_cpu_cores > r0.workers_cpu_cores + 0.1 and r0.workers_cpu_cores < 0.2, r0
    if launcher_context:
        launcher = jobs[ddp_tree.launcher]
        assert launcher.processes == 1 and launcher.gpus == (0,)  # a job of its own
    else:
        assert set(jobs) == set(ddp_tree.ranks)


def test_without_the_gpus_mains_the_launcher_swallows_its_ranks(ddp_tree: Tree) -> None:
    """The old accounting, still what a caller gets that passes bare pids: a GPU process
    nested in another's tree is that tree's worker, so the launcher with a CUDA context
    became the "main process" of both ranks and all their workers (issue #9, case 5)."""
    host = HostSampler()
    pids = [ddp_tree.launcher, *ddp_tree.ranks]
    host.sample(time.time(), pids)
    time.sleep(0.3)
    (job,) = host.sample(time.time(), pids).jobs
    assert job.pid == ddp_tree.launcher and job.processes == 7


def test_a_gpus_main_process_holds_the_most_of_its_memory() -> None:
    gpus = [GpuSample(t=0.0, gpu=0, processes=(GpuProcess(pid=10, mem_used_bytes=300),
                                               GpuProcess(pid=11, mem_used_bytes=20 * GiB))),
            GpuSample(t=0.0, gpu=1, processes=(GpuProcess(pid=12, mem_used_bytes=None),)),
            GpuSample(t=0.0, gpu=2, processes=())]
    on_gpus, mains = gpu_processes(gpus)
    assert on_gpus == {10: [0], 11: [0], 12: [1]} and mains == [11, 12]
