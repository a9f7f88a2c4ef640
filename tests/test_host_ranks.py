"""Per-GPU process trees without the hook: real process trees on this machine (a launcher
with two ranks, each with its own DataLoader-like workers) and a stubbed NVML that lists
the ranks on GPUs 0 and 1, through the real Sampler and host layer into a recording and
`gpuwatch advise`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for
from nvml_stub import NvmlStub, StubGpu
from test_advise_support import advise_json, load, run_cli, transform, without_steps, write

from gpuwatch.collect.host import HostSampler
from gpuwatch.collect.sampler import Sampler, gpu_processes
from gpuwatch.samples import GpuProcess, GpuSample
from gpuwatch.store import Store
from gpuwatch.trace.format import make_meta
from gpuwatch.trace.record import Recorder

GiB = 2**30
# spins (busy) or sleeps (idle) until its parent is gone: nothing outlives the test
LOOP = ("import os, sys, time\nppid = os.getppid()\nbusy = sys.argv[1] == 'busy'\n"
        "while os.getppid() == ppid:\n    if not busy:\n        time.sleep(0.05)\n")
# a rank: starts its workers, says "rank_pid worker_pid ...", then its own loop
RANK = ("import subprocess, sys\nloop, main, work, n = sys.argv[1:5]\n"
        "kids = [subprocess.Popen([sys.executable, '-c', loop, work]) for _ in range(int(n))]\n"
        "import os\nprint(os.getpid(), *[k.pid for k in kids], flush=True)\n"
        "exec(loop.replace('sys.argv[1]', repr(main)))\n")
# the launcher (torchrun, accelerate, mp.spawn): starts the ranks, passes on their lines;
# each rank gets the environment torchrun gives its ranks (RANK, WORLD_SIZE, rendezvous)
LAUNCHER = ("import os, subprocess, sys\nloop, rank, specs = sys.argv[1], sys.argv[2], sys.argv[3:]\n"
            "env = lambda i: dict(os.environ, RANK=str(i), LOCAL_RANK=str(i),\n"
            "                     WORLD_SIZE=str(len(specs)), MASTER_ADDR='127.0.0.1',\n"
            "                     MASTER_PORT='29555', TORCHELASTIC_RUN_ID=str(os.getpid()))\n"
            "ranks = [subprocess.Popen([sys.executable, '-c', rank, loop, *s.split(',')],\n"
            "                          stdout=subprocess.PIPE, text=True, env=env(i))\n"
            "         for i, s in enumerate(specs)]\n"
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


def recording(stub: NvmlStub, path: Path) -> tuple[Sampler, Recorder]:
    """The real Sampler (``stub`` for NVML, the real host layer) with a Recorder writing
    what it samples to ``path``, started."""
    store = Store()
    sampler = Sampler(store, nvml_module=stub, host=HostSampler())
    recorder = Recorder(store, str(path), make_meta(infos=sampler.infos, host_cpus=2,
                                                    sample_hz=4), reorder_seconds=0.0)
    recorder.start()
    return sampler, recorder


def tick_until_measured(sampler: Sampler, tree: Tree) -> dict[int, object]:
    """The jobs by pid, their CPU measured over a whole second once every process of the
    tree is running (a worker's own start-up would read as busy)."""

    def ready() -> bool:
        time.sleep(0.3)
        jobs = {j.pid: j for j in sampler.tick().host.jobs}
        return all(r in jobs and jobs[r].processes == 3 and jobs[r].cpu_cores > 0.02
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
    # (on a shared machine a spinning process gets what the scheduler gives it: compare,
    # don't expect whole cores; a sleeping loop uses next to nothing)
    assert r1.workers_cpu_cores > 2 * r1.main_cpu_cores and r1.main_cpu_cores < 0.05, r1
    assert r0.main_cpu_cores > 2 * r0.workers_cpu_cores and r0.workers_cpu_cores < 0.05, r0
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


def test_a_recording_of_the_ranks_keeps_each_gpus_tree(ddp_tree: Tree, tmp_path: Path) -> None:
    """Sampler (stubbed NVML, real host layer) -> Recorder -> file -> `gpuwatch advise`:
    the host lines carry one tree per rank with its GPU, and the advisor's per-GPU view
    (the `jobs` breakdown without the hook) reads each rank's own CPU."""
    stub = stub_for(ddp_tree, launcher_context=True)
    rec = tmp_path / "ddp.jsonl"
    sampler, recorder = recording(stub, rec)
    try:
        tick_until_measured(sampler, ddp_tree)
        for _ in range(12):  # 3 s more at 4 Hz
            time.sleep(0.25)
            sampler.tick()
    finally:
        recorder.stop()
        for g in stub.gpus:
            g.release()
        sampler.stop()
    lines = [json.loads(x) for x in rec.read_text().splitlines()]
    trees = [j for d in lines if d["kind"] == "host" for j in d.get("jobs", ())]
    by_pid = {j["pid"]: j for j in trees}
    assert by_pid[ddp_tree.ranks[0]]["gpus"] == [0] and by_pid[ddp_tree.ranks[1]]["gpus"] == [1]
    assert by_pid[ddp_tree.launcher]["processes"] == 1
    # each rank's tree says which rank of which launch it is (its environment); the
    # launcher, no rank itself, says nothing
    r0, r1 = by_pid[ddp_tree.ranks[0]], by_pid[ddp_tree.ranks[1]]
    assert (r0["rank"], r1["rank"]) == (0, 1) and r0["world_size"] == r1["world_size"] == 2
    assert r0["dist_job"] == r1["dist_job"] and len(r0["dist_job"]) == 12
    assert not {"rank", "world_size", "dist_job"} & by_pid[ddp_tree.launcher].keys()
    proc = run_cli("advise", "--replay", str(rec), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [g["gpu"] for g in report["gpus"]] == [0, 1]
    # each GPU's breakdown reads its own rank's main process: rank 0's spins (the GPU's
    # idle time is host-bound), rank 1's sleeps (none of it is); one host-wide average
    # would give both GPUs the same host share
    jobs = {j["gpu"]: j for j in report["jobs"]}
    assert jobs[0]["time_share"]["host"] > jobs[1]["time_share"]["host"] + 0.01, jobs


def ddp_variant(tmp_path: Path, with_gpus: bool = True) -> Path:
    """A real single-GPU recording (2 DataLoader workers pegged, the GPU starved; the hook's
    lines dropped) made into a 2-GPU DDP job without the hook: GPU 1 is the starved rank
    (pid 2000, its own 2 workers pegged), GPU 0 a busy rank (pid 1000, main process pegged,
    its workers idle). ``with_gpus`` False: trees as older recordings wrote them, mapped to
    their GPU by the pid the gpu lines list."""
    def split(d: dict) -> object:
        if d["kind"] == "gpu":
            starved = dict(d, gpu=1, processes=[dict(p, pid=2000) for p in d["processes"]])
            working = d.get("util", 0) > 0.05
            busy = dict(d, gpu=0, util=0.95 if working else d.get("util"),
                        processes=[dict(p, pid=1000) for p in d["processes"]])
            if d.get("sm_active") is not None:
                busy["sm_active"] = 0.9 if working else 0.0
            return [busy, starved]
        if d["kind"] == "host" and d.get("jobs"):
            (j,) = d["jobs"]
            r0 = dict(j, pid=1000, main_cpu_cores=1.0, workers_cpu_cores=0.1, cpu_cores=1.1)
            r1 = dict(j, pid=2000)
            if with_gpus:
                r0["gpus"], r1["gpus"] = [0], [1]
            jobs = [r0, r1]
            d = dict(d, jobs=jobs, job_processes=6,
                     job_cpu_cores=round(r0["cpu_cores"] + r1["cpu_cores"], 3),
                     job_main_cpu_cores=round(r0["main_cpu_cores"] + r1["main_cpu_cores"], 3),
                     job_workers_cpu_cores=round(
                         r0["workers_cpu_cores"] + r1["workers_cpu_cores"], 3))
        return d
    return write(tmp_path / "ddp.jsonl", transform(without_steps(load("h200_input_bound_w2")),
                                                   split))


@pytest.mark.parametrize("with_gpus", [True, False])
def test_per_rank_evidence_names_the_starved_ranks_own_workers(tmp_path: Path,
                                                               with_gpus: bool) -> None:
    report = advise_json(ddp_variant(tmp_path, with_gpus))
    (slow,) = [a for a in report["advice"] if a["id"] == "add-dataloader-workers"]
    assert slow["gpu"] == 1
    # rank 1's own figures, not the host's average over both ranks
    assert slow["evidence"]["workers_busy_ratio"] >= 0.8
    assert slow["evidence"]["main_busy_ratio"] < 0.5
    assert slow["evidence"]["job_workers"] == pytest.approx(2)
    on0 = [a for a in report["advice"] if a["gpu"] == 0]
    assert all(a["id"] != "add-dataloader-workers" for a in on0)
    assert all(a["evidence"].get("main_busy_ratio", 1.0) > 0.9 for a in on0)
    jobs = {j["gpu"]: j for j in report["jobs"]}
    assert jobs[1]["bottleneck"] == "data" and jobs[0]["bottleneck"] != "data"
    assert jobs[1]["time_share"]["data"] > 0.5 > jobs[0]["time_share"]["data"]


# Lightning's DDP launcher: the script's own process is rank 0 (it holds GPU 0) and starts
# ranks 1..N-1 with LOCAL_RANK, NODE_RANK, WORLD_SIZE and the rendezvous in their
# environment, no RANK; its own environment, read as it started, has none of them
LIGHTNING = ("import os, subprocess, sys\nloop, n = sys.argv[1], int(sys.argv[2])\n"
             "env = lambda i: dict(os.environ, LOCAL_RANK=str(i), NODE_RANK='0',\n"
             "                     WORLD_SIZE=str(n), MASTER_ADDR='127.0.0.1',\n"
             "                     MASTER_PORT='29556')\n"
             "kids = [subprocess.Popen([sys.executable, '-c', loop, 'idle'], env=env(i))\n"
             "        for i in range(1, n)]\n"
             "print(*[k.pid for k in kids], flush=True)\n"
             "exec(loop.replace('sys.argv[1]', repr('idle')))\n")


def test_lightnings_rank_zero_and_the_ranks_it_started_are_one_launch() -> None:
    proc = subprocess.Popen([sys.executable, "-c", LIGHTNING, LOOP, "3"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        kids = [int(x) for x in proc.stdout.readline().split()]
        # a child started with env= has its parent's environment until it has exec'd (on
        # a loaded machine, a while after its pid is known): wait for its own
        deadline = time.time() + 20
        while time.time() < deadline and not all(
                b"LOCAL_RANK=" in Path(f"/proc/{k}/environ").read_bytes() for k in kids):
            time.sleep(0.05)
        on = {proc.pid: (0,), kids[0]: (1,), kids[1]: (2,)}
        host = HostSampler()
        jobs = {j.pid: j for j in host.sample(time.time(), on, mains=on).jobs}
        assert sorted(jobs) == sorted(on)
        assert {p: (j.rank, j.world_size) for p, j in jobs.items()} == {
            proc.pid: (0, 3), kids[0]: (1, 3), kids[1]: (2, 3)}
        assert len({j.dist_job for j in jobs.values()}) == 1
        assert jobs[proc.pid].dist_job is not None
        # each rank's tree is its own: rank 0's holds neither of the others
        assert all(j.processes == 1 for j in jobs.values())
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_local_rank_is_the_rank_on_the_first_node_only() -> None:
    """Without RANK (Lightning's launcher), LOCAL_RANK is the rank where NODE_RANK is 0;
    on another node it is not (the ranks per node are not in the environment). A
    launcher whose children are ranks 0..N-1 gets none: test_each_gpu_has_its_own_rank..."""
    from gpuwatch.collect.host import parse_dist
    env = b"\0".join([b"LOCAL_RANK=2", b"NODE_RANK=0", b"WORLD_SIZE=4", b"MASTER_PORT=1"])
    assert parse_dist(env)[:2] == (2, 4)
    # another node's local rank is not its rank: without RANK it is not read
    other = env.replace(b"NODE_RANK=0", b"NODE_RANK=1")
    assert parse_dist(other) == (None, None, None)


def test_debugging_switches_in_a_jobs_environment_are_recorded_by_name(tmp_path: Path
                                                                       ) -> None:
    """Two jobs on two GPUs, one started with CUDA_LAUNCH_BLOCKING=1,
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 and TORCH_DISTRIBUTED_DEBUG=detail (c10d reads it in
    any case), the other with the same variables set to what leaves them off: the real
    host layer reads each root's /proc/PID/environ once, and the recording's trees name
    the first one's switches and nothing of the second's (an empty list: read, none on);
    no variable's value is written."""
    on = dict(os.environ, CUDA_LAUNCH_BLOCKING="1", PYTORCH_NO_CUDA_MEMORY_CACHING=" 1",
              TORCH_DISTRIBUTED_DEBUG="detail", SECRET_TOKEN="hunter2")
    off = dict(os.environ, CUDA_LAUNCH_BLOCKING="0", PYTORCH_NO_CUDA_MEMORY_CACHING="0",
               TORCH_DISTRIBUTED_DEBUG="INFO")
    kids = [subprocess.Popen([sys.executable, "-c", LOOP, "idle"], env=env)
            for env in (on, off)]
    stub = NvmlStub([StubGpu(0, processes=[(kids[0].pid, 20 * GiB)]),
                     StubGpu(1, processes=[(kids[1].pid, 20 * GiB)])])
    rec = tmp_path / "debug-env.jsonl"
    sampler, recorder = recording(stub, rec)
    try:
        def both_seen() -> bool:
            time.sleep(0.25)
            return {k.pid for k in kids} <= {j.pid for j in sampler.tick().host.jobs}
        wait_for(both_seen, "both jobs seen", timeout=30)
        sampler.tick()
    finally:
        recorder.stop()
        sampler.stop()
        for k in kids:
            k.kill()
            k.wait()
    text = rec.read_text()
    trees = {j["pid"]: j for d in map(json.loads, text.splitlines()) if d["kind"] == "host"
             for j in d.get("jobs", ())}
    assert trees[kids[0].pid]["debug_env"] == ["CUDA_LAUNCH_BLOCKING",
                                               "PYTORCH_NO_CUDA_MEMORY_CACHING",
                                               "TORCH_DISTRIBUTED_DEBUG"]
    assert trees[kids[1].pid]["debug_env"] == []
    assert "hunter2" not in text and "detail" not in text and "INFO" not in text


def test_a_debugging_switch_is_read_as_the_library_reading_it_parses_it() -> None:
    """CUDA's and torch's allocator's switches are on at "1" only (torch reads its flag as
    0 or 1); c10d's level at DETAIL in any case, not at INFO or OFF; an environment that
    cannot be read says nothing (None), one with none on says so (an empty tuple)."""
    from gpuwatch.collect.host import parse_debug, read_debug

    def env(**kw: str) -> bytes:
        return b"\0".join(f"{k}={v}".encode() for k, v in kw.items()) + b"\0"

    assert parse_debug(env(CUDA_LAUNCH_BLOCKING="1")) == ("CUDA_LAUNCH_BLOCKING",)
    for off in ("0", "", "true", "yes"):
        assert parse_debug(env(CUDA_LAUNCH_BLOCKING=off,
                               PYTORCH_NO_CUDA_MEMORY_CACHING=off)) == (), off
    assert parse_debug(env(TORCH_DISTRIBUTED_DEBUG="Detail")) == ("TORCH_DISTRIBUTED_DEBUG",)
    assert parse_debug(env(TORCH_DISTRIBUTED_DEBUG="INFO", XCUDA_LAUNCH_BLOCKING="1")) == ()
    # a name inside another variable's value is no switch
    assert parse_debug(env(NOTE="CUDA_LAUNCH_BLOCKING=1")) == ()
    assert read_debug(os.getpid()) is not None
    assert read_debug(2**22 + 12345) is None  # no such process
