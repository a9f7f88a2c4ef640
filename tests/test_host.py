"""The host layer against real processes: a busy "training job" with busy "DataLoader workers"."""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import wait_for

from gpuwatch.collect.host import HostSampler
from gpuwatch.samples import HostSample

# a worker spins until its parent is gone, so nothing outlives the test even on a crash
WORKER = "import os\nppid = os.getppid()\nwhile os.getppid() == ppid:\n    pass\n"
# the job starts N workers, says their pids, then spins itself (it holds no GPU: the test
# hands its pid to the sampler as if NVML had seen it on one)
JOB = (
    "import subprocess, sys\n"
    "kids = [subprocess.Popen([sys.executable, '-c', sys.argv[2]]) for _ in range(int(sys.argv[1]))]\n"
    "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
    "while True:\n"
    "    pass\n"
)


@dataclass
class Job:
    proc: subprocess.Popen
    workers: list[int]

    @property
    def pid(self) -> int:
        return self.proc.pid


@pytest.fixture
def start_job() -> Iterator[Callable[[int], Job]]:
    jobs: list[Job] = []

    def start(workers: int = 2) -> Job:
        proc = subprocess.Popen([sys.executable, "-c", JOB, str(workers), WORKER],
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        job = Job(proc, pids)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        try:
            os.killpg(job.proc.pid, signal.SIGKILL)  # the job's own session: it and its workers
        except ProcessLookupError:
            pass
        job.proc.wait()


def sample_until(host: HostSampler, pids: list[int], ok: Callable[[HostSample], bool],
                 what: str) -> HostSample:
    """Sample every 0.2 s until ``ok`` holds (CPU deltas need time between two readings)."""
    found: list[HostSample] = []

    def check() -> bool:
        time.sleep(0.1)
        s = host.sample(time.time(), pids)
        found.append(s)
        return ok(s)

    wait_for(check, what, timeout=30)
    return found[-1]


def test_host_wide_fields() -> None:
    host = HostSampler()
    first = host.sample(time.time(), [])
    time.sleep(0.2)
    s = host.sample(time.time(), [])
    assert len(s.cpu_util_per_core) == psutil.cpu_count()
    assert all(0.0 <= c <= 1.0 for c in s.cpu_util_per_core)
    assert s.cpu_util is not None and 0.0 <= s.cpu_util <= 1.0
    assert s.load1 is not None and s.load5 is not None and s.load15 is not None
    assert s.mem_total_bytes == psutil.virtual_memory().total
    assert s.mem_used_bytes is not None and 0 < s.mem_used_bytes <= s.mem_total_bytes
    assert s.swap_total_bytes is not None and s.swap_used_bytes is not None
    # no GPU process: the job fields are not measured, not zero
    for s_ in (first, s):
        assert s_.jobs == ()
        assert s_.job_cpu_cores is None and s_.job_processes is None and s_.job_rss_bytes is None


def test_job_tree_counts_workers_and_their_cpu(start_job: Callable[[int], Job]) -> None:
    job = start_job(2)
    host = HostSampler()
    first = host.sample(time.time(), [job.pid])
    # first sight: the tree is known, but a CPU rate needs two readings
    assert first.job_processes == 3
    assert first.job_cpu_cores == 0.0
    s = sample_until(host, [job.pid],
                     lambda s: bool(s.job_workers_cpu_cores and s.job_main_cpu_cores),
                     "the workers and the main process to show CPU use")
    (tree,) = s.jobs
    assert tree.pid == job.pid
    assert tree.processes == 3
    assert tree.name == psutil.Process(job.pid).name()
    assert tree.user == getpass.getuser()
    assert tree.workers_cpu_cores > 0 and tree.main_cpu_cores > 0
    assert tree.cpu_cores == pytest.approx(tree.main_cpu_cores + tree.workers_cpu_cores, abs=0.01)
    # three spinning processes on this host can't use more cores than it has
    assert tree.cpu_cores <= psutil.cpu_count() + 0.2
    assert tree.rss_bytes >= sum(psutil.Process(p).memory_info().rss
                                 for p in (job.pid, *job.workers)) * 0.5
    assert (s.job_cpu_cores, s.job_processes, s.job_rss_bytes) == (
        tree.cpu_cores, tree.processes, tree.rss_bytes)
    assert s.job_main_cpu_cores == tree.main_cpu_cores
    assert s.job_workers_cpu_cores == tree.workers_cpu_cores


def test_gpu_process_inside_another_gpu_process_tree_is_one_job(
        start_job: Callable[[int], Job]) -> None:
    job = start_job(2)
    host = HostSampler()
    # both the job and one of its workers hold GPU memory: still one job, counted once
    s = host.sample(time.time(), [job.workers[0], job.pid])
    assert [t.pid for t in s.jobs] == [job.pid]
    assert s.job_processes == 3


def test_independent_gpu_processes_are_separate_jobs(start_job: Callable[[int], Job]) -> None:
    a, b = start_job(1), start_job(2)
    host = HostSampler()
    s = host.sample(time.time(), [a.pid, b.pid])
    assert {t.pid: t.processes for t in s.jobs} == {a.pid: 2, b.pid: 3}
    assert s.job_processes == 5


def test_vanishing_processes_cost_only_themselves(start_job: Callable[[int], Job]) -> None:
    job = start_job(2)
    host = HostSampler()
    assert host.sample(time.time(), [job.pid]).job_processes == 3
    os.kill(job.workers[0], signal.SIGKILL)
    # the worker is gone (or a zombie until its parent reaps it: either way not counted
    # as a busy process for long); the sampler keeps going and the job keeps its tree
    s = sample_until(host, [job.pid], lambda s: s.job_processes == 2,
                     "the killed worker to leave the tree")
    assert [t.pid for t in s.jobs] == [job.pid]

    # a GPU pid that no longer exists anywhere: no job, no error
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    s = host.sample(time.time(), [gone.pid, job.pid])
    assert [t.pid for t in s.jobs] == [job.pid]
    s = host.sample(time.time(), [gone.pid])
    assert s.jobs == () and s.job_cpu_cores is None

    # the whole job dies between two ticks
    os.killpg(job.pid, signal.SIGKILL)
    job.proc.wait()
    s = host.sample(time.time(), [job.pid])
    assert s.jobs == () and s.job_processes is None
    assert s.mem_total_bytes is not None  # the host part is unharmed


def test_process_identity() -> None:
    host = HostSampler()
    me = psutil.Process()
    assert host.process_identity(os.getpid()) == (me.name(), getpass.getuser())
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert host.process_identity(gone.pid) == (None, None)


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"),
                    reason="this kernel has no /proc/PID/task/TID/children")
def test_children_files_and_process_table_scan_agree(start_job: Callable[[int], Job]) -> None:
    job = start_job(3)
    fast, scan = HostSampler(), HostSampler()
    scan._proc_children = False  # force the fallback every other kernel uses
    assert fast.sample(time.time(), [job.pid]).job_processes == 4
    assert scan.sample(time.time(), [job.pid]).job_processes == 4


# a job that starts a sleeping child when told: "m" from its main thread, "t" from a
# thread of its own (which, like torch's pools, never forked before); it says each pid
FORKING_JOB = (
    "import queue, subprocess, sys, threading\n"
    "child = [sys.executable, '-c', sys.argv[1]]\n"
    "asks = queue.Queue()\n"
    "def other():\n"
    "    while True:\n"
    "        asks.get()\n"
    "        print(subprocess.Popen(child).pid, flush=True)\n"
    "threading.Thread(target=other, daemon=True).start()\n"
    "for line in sys.stdin:\n"
    "    if line.strip() == 't':\n"
    "        asks.put(1)\n"
    "    else:\n"
    "        print(subprocess.Popen(child).pid, flush=True)\n"
)


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"),
                    reason="this kernel has no /proc/PID/task/TID/children")
def test_a_child_of_a_thread_that_never_forked_is_found_at_the_next_full_read(
        monkeypatch: Any) -> None:
    """Each tick reads the children of the main thread and of threads seen with children;
    every thread's, when a process is first seen and every THREAD_RESCAN_S."""
    from gpuwatch.collect import host as host_mod

    proc = subprocess.Popen([sys.executable, "-c", FORKING_JOB, HELPER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None

    def ask(what: str) -> int:
        proc.stdin.write(what + "\n")
        proc.stdin.flush()
        pid = int(proc.stdout.readline())
        wait_for(lambda: psutil.pid_exists(pid), "the child")
        return pid

    try:
        now = [1000.0]
        host = HostSampler()
        host._clock = lambda: now[0]
        assert host.sample(time.time(), [proc.pid]).job_processes == 1  # every thread read
        ask("m")  # the main thread: read at every tick
        assert host.sample(time.time(), [proc.pid]).job_processes == 2
        ask("t")  # a thread that never forked: not read again until the full read is due
        assert host.thread_rescan_s == host_mod.THREAD_RESCAN_S
        now[0] += host_mod.THREAD_RESCAN_S - 1
        assert host.sample(time.time(), [proc.pid]).job_processes == 2
        now[0] += 1
        assert host.sample(time.time(), [proc.pid]).job_processes == 3
        ask("t")  # that thread is known to fork now: read at every tick
        assert host.sample(time.time(), [proc.pid]).job_processes == 4
        # a fresh sampler reads every thread at first sight
        assert HostSampler().sample(time.time(), [proc.pid]).job_processes == 4
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"),
                    reason="this kernel has no /proc/PID/task/TID/children")
@pytest.mark.parametrize("read_stat", [True, False])
def test_a_worker_found_late_still_counts_as_started(read_stat: bool) -> None:
    """A DataLoader worker forked by a thread that never forked before (a loader iterated
    off the main thread) is found at the next full read of its parent's threads, ticks
    after its birth: born since the full read before, it counts as a worker started, once;
    one that was alive at that read does not. On the /proc/PID/stat path and psutil's."""
    from gpuwatch.collect import host as host_mod

    # a child that names itself as torch names a DataLoader worker, then waits for its
    # parent to end
    named_worker = ("import ctypes\n"
                    "ctypes.CDLL(None).prctl(15, b'pt_data_worker', 0, 0, 0)\n" + HELPER)
    proc = subprocess.Popen([sys.executable, "-c", FORKING_JOB, named_worker],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None

    def ask(what: str) -> int:
        proc.stdin.write(what + "\n")
        proc.stdin.flush()
        pid = int(proc.stdout.readline())
        wait_for(lambda: psutil.Process(pid).name() == host_mod.LOADER_WORKER_NAME,
                 "the child to name itself")
        return pid

    try:
        now = [1000.0]
        host = HostSampler()
        host.read_stat = read_stat
        host._clock = lambda: now[0]

        def tick(step: float) -> tuple[int, int, int]:
            now[0] += step
            (tree,) = host.sample(time.time(), [proc.pid]).jobs
            return tree.processes, tree.loader_workers, tree.loader_workers_started

        assert tick(0) == (1, 0, 0)  # first sight: every thread read
        late = ask("t")  # its thread is not read again until the next full read
        assert tick(1) == (1, 0, 0)
        time.sleep(0.2)  # its birth well before the tick before the full read
        assert tick(1) == (1, 0, 0)
        # found ticks after its birth (born before the tick before: by that alone, old),
        # and born since the full read before: started
        assert tick(host_mod.THREAD_RESCAN_S) == (2, 1, 1)
        assert tick(1) == (2, 1, 0)  # counted once
        # one found by a full read but alive at the full read before (here: forgotten by
        # the sampler meanwhile) is not new
        del host._procs[late]
        assert tick(host_mod.THREAD_RESCAN_S) == (2, 1, 0)
        ask("m")  # the main thread's: seen at the next tick, as ever
        assert tick(1) == (3, 2, 1)
        assert tick(host_mod.THREAD_RESCAN_S) == (3, 2, 0)  # a full read: nothing new
        # a fresh sampler: both were alive at its first read, neither started under it
        fresh = HostSampler()
        fresh.read_stat = read_stat
        (tree,) = fresh.sample(time.time(), [proc.pid]).jobs
        assert (tree.processes, tree.loader_workers_started) == (3, 0)
        assert tree.loader_workers_started_total == 0
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_process_line_of_procfs_is_read_whatever_its_name(tmp_path: Any,
                                                            monkeypatch: Any) -> None:
    """/proc/PID/stat as the kernel writes it: comm may hold spaces and parentheses."""
    from gpuwatch.collect.host import read_pid_stat

    monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path))
    (tmp_path / "42").mkdir()
    tail = " ".join(["R", "1", "42", "42", "0", "-1", "4194560", "100", "0", "0", "0",
                     "150", "25", "0", "0", "20", "0", "9", "0", "7777", "123456789",
                     "3000"] + ["0"] * 28)
    (tmp_path / "42" / "stat").write_bytes(b"42 (a) (b c)) " + tail.encode() + b"\n")
    assert read_pid_stat(42) == (b"a) (b c)", b"R", 175, 7777, 3000)
    (tmp_path / "42" / "stat").write_bytes(b"42 (cut")  # a truncated line
    assert read_pid_stat(42) is None
    assert read_pid_stat(43) is None  # no such process


def test_the_trees_read_through_psutil_where_procfs_stat_is_not_read(
        start_job: Callable[[int], Job], monkeypatch: Any) -> None:
    """Off Linux (no clock ticks or page size known) the walk reads each process through
    psutil, as before /proc/PID/stat was read straight; both give the same tree."""
    from gpuwatch.collect import host as host_mod

    job = start_job(2)
    fast = HostSampler()
    monkeypatch.setattr(host_mod, "_PAGE_BYTES", 0)  # what a sampler off Linux sees
    slow = HostSampler()
    monkeypatch.undo()
    assert fast.read_stat and not slow.read_stat
    ok = lambda s: bool(s.job_workers_cpu_cores and s.job_main_cpu_cores)  # noqa: E731
    a = sample_until(fast, [job.pid], ok, "the stat path to show CPU")
    b = sample_until(slow, [job.pid], ok, "psutil's path to show CPU")
    assert all(t.start is not None for t in fast._procs.values())
    assert all(t.start is None for t in slow._procs.values())
    assert a.job_processes == b.job_processes == 3
    assert a.job_rss_bytes == pytest.approx(b.job_rss_bytes, rel=0.2)
    # three spinning processes on this host's cores: each path sees them busy
    for s in (a, b):
        assert 0.2 <= s.job_cpu_cores <= psutil.cpu_count() + 0.2


def test_a_ranks_launch_is_read_from_its_environment() -> None:
    """RANK, WORLD_SIZE and the rendezvous as torchrun sets them, read from the real
    /proc/PID/environ of a child; only a digest of the rendezvous is kept."""
    from gpuwatch.collect.host import parse_dist, read_dist

    base = dict(os.environ, RANK="1", WORLD_SIZE="2", MASTER_ADDR="10.0.0.7",
                MASTER_PORT="29500", TORCHELASTIC_RUN_ID="run-a")
    kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
            for env in (base, dict(base, RANK="0"), dict(base, TORCHELASTIC_RUN_ID="run-b"),
                        {k: v for k, v in base.items() if k != "RANK"})]
    try:
        one, zero, other, norank = (read_dist(k.pid) for k in kids)
    finally:
        for k in kids:
            k.kill()
            k.wait()
    assert one[:2] == (1, 2) and zero[:2] == (0, 2)
    assert one[2] == zero[2] and one[2] != other[2]  # the ranks of one launch, not another's
    assert "10.0.0.7" not in one[2] and "run-a" not in one[2]
    assert norank == (None, None, None)
    assert read_dist(2**22 + 12345) == (None, None, None)  # no such process
    # what a launcher would never write
    for bad in (b"RANK=2\0WORLD_SIZE=2\0", b"RANK=-1\0WORLD_SIZE=2\0", b"RANK=0\0WORLD_SIZE=0\0",
                b"RANK=0\0WORLD_SIZE=99999999999\0"):
        assert parse_dist(bad) == (None, None, None), bad
    assert parse_dist(b"RANK=0\0WORLD_SIZE=4\0") == (0, 4, None)  # no rendezvous: no group


def test_a_worker_born_between_ticks_is_counted_at_first_sight() -> None:
    """A DataLoader worker restarted every epoch (persistent_workers=False) may live a
    tick or two: what it used before it was first seen counts in that tick, not 0."""
    # the job starts one worker that spins 0.4 s of CPU and then sleeps, once told to
    job = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys\nsys.stdin.readline()\n"
         "w = subprocess.Popen([sys.executable, '-c', 'import time\\nend = time.process_time() + 0.4\\n"
         "while time.process_time() < end: pass\\ntime.sleep(30)'])\n"
         "print(w.pid, flush=True)\nw.wait()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        host = HostSampler()
        host.sample(time.time(), [job.pid])
        time.sleep(0.2)
        host.sample(time.time(), [job.pid])  # the job alone, its CPU known from here on
        assert job.stdin is not None and job.stdout is not None
        job.stdin.write("go\n")
        job.stdin.flush()
        worker = int(job.stdout.readline())
        wait_for(lambda: psutil.Process(worker).cpu_times().user
                 + psutil.Process(worker).cpu_times().system >= 0.4, "the worker's spin",
                 timeout=20)
        used = sum(psutil.Process(worker).cpu_times()[:2])
        t = time.time()
        (tree,) = host.sample(t, [job.pid]).jobs
        assert tree.processes == 2
        interval = host._now - host._prev_t
        # all the worker used, over the tick's interval (it was born inside it)
        assert tree.workers_cpu_cores == pytest.approx(used / interval, rel=0.25)
        assert tree.workers_cpu_cores > 0.05
    finally:
        job.kill()
        job.wait()
        for p in psutil.process_iter():
            try:
                if p.ppid() == job.pid:
                    p.kill()
            except psutil.Error:
                pass


# a training job with a real torch DataLoader (2 workers that spin in __getitem__) and
# an idle helper child beside them (a framework's helper process, a compile worker)
HELPER = "import os, time\nppid = os.getppid()\nwhile os.getppid() == ppid:\n    time.sleep(0.2)\n"
LOADER_JOB = (
    "import subprocess, sys, time\n"
    "import torch\n"
    "helper = subprocess.Popen([sys.executable, '-c', sys.argv[1]])\n"
    "print(helper.pid, flush=True)\n"
    "class Spin(torch.utils.data.Dataset):\n"
    "    def __len__(self):\n"
    "        return 10**9\n"
    "    def __getitem__(self, i):\n"
    "        until = time.monotonic() + 0.05\n"
    "        while time.monotonic() < until:\n"
    "            pass\n"
    "        return i\n"
    "for _ in torch.utils.data.DataLoader(Spin(), batch_size=4, num_workers=2):\n"
    "    pass\n"
)


def test_the_children_torch_names_as_its_dataloader_workers_are_told_apart() -> None:
    pytest.importorskip("torch")
    proc = subprocess.Popen([sys.executable, "-c", LOADER_JOB, HELPER], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        helper = int(proc.stdout.readline())
        host = HostSampler()
        s = sample_until(host, [proc.pid],
                         lambda s: bool(s.jobs and s.jobs[0].loader_workers == 2
                                        and (s.jobs[0].loader_cpu_cores or 0) > 0.3),
                         "the DataLoader's two workers to be named and busy")
        (tree,) = s.jobs
        # the main process, the helper and the two workers; only the workers are loaders
        assert tree.processes == 4
        assert psutil.Process(helper).name() != "pt_data_worker"
        assert tree.loader_cpu_cores <= tree.workers_cpu_cores + 0.01
        assert (s.job_loader_workers, s.job_loader_cpu_cores) == (2, tree.loader_cpu_cores)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_tree_without_named_workers_reports_none() -> None:
    host = HostSampler()
    s = host.sample(time.time(), [os.getpid()])
    (tree,) = s.jobs
    assert tree.loader_workers == 0 and tree.loader_cpu_cores == 0.0


WRITER_JOB = (
    "import os, sys, time\n"
    "path = sys.argv[1]\n"
    "block = os.urandom(1 << 20)\n"
    "print('ready', flush=True)\n"
    "while True:\n"
    "    with open(path, 'wb') as f:  # a 16 MiB checkpoint, over and over\n"
    "        for _ in range(16):\n"
    "            f.write(block)\n"
    "    time.sleep(0.05)\n"
)


def test_a_main_process_writing_files_is_measured() -> None:
    """A job's main process writing a file again and again (a checkpoint written from the
    loop): its bytes to storage per second since the last tick (/proc/PID/io
    write_bytes, counted as its pages are dirtied), in its tree and summed on the host
    line; none on the tree's first tick (no earlier reading to take a rate from). The
    file goes beside the tests, on the checkout's disk: a tmpfs /tmp counts no write."""
    where = Path(tempfile.mkdtemp(prefix="write-test-", dir=Path(__file__).parent))
    proc = subprocess.Popen([sys.executable, "-c", WRITER_JOB, str(where / "ckpt.bin")],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        host = HostSampler()
        (first,) = host.sample(time.time(), [proc.pid]).jobs
        assert first.main_write_bytes_per_second is None
        s = sample_until(host, [proc.pid],
                         lambda s: (s.jobs[0].main_write_bytes_per_second or 0) > 16 << 20,
                         "the writer's bytes to storage")
        (tree,) = s.jobs
        print(f"{tree.main_write_bytes_per_second / 2**20:.0f} MiB/s")
        assert s.job_write_bytes_per_second == tree.main_write_bytes_per_second
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        shutil.rmtree(where, ignore_errors=True)


EPOCHS = Path(__file__).resolve().parent / "scripts" / "epochs_loader.py"


def _count_started(extra: list[str], seconds: float,
                   until: Callable[[list[tuple[int, int]]], bool] | None = None,
                   limit: float = 45.0) -> tuple[int, list[tuple[int, int]]]:
    """(DataLoader workers counted as started, each tick's (processes, named workers) in
    the tree) over ``seconds`` of ticks every 0.25 s beside tests/scripts/epochs_loader.py;
    with ``until``, on past ``seconds`` until it holds of the ticks seen (a loaded machine
    is slow to start the workers), for ``limit`` seconds at most."""
    pytest.importorskip("torch")
    proc = subprocess.Popen([sys.executable, str(EPOCHS), "--workers", "2", *extra],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        host = HostSampler()
        started, seen = 0, []
        t0 = time.monotonic()
        while True:
            elapsed = time.monotonic() - t0
            if elapsed >= seconds and (until is None or until(seen) or elapsed >= limit):
                break
            s = host.sample(time.time(), [proc.pid])
            (tree,) = s.jobs
            assert s.job_loader_workers_started == tree.loader_workers_started
            started += tree.loader_workers_started
            seen.append((tree.processes, tree.loader_workers))
            time.sleep(0.25)
        print(f"{extra}: {started} workers started; (processes, named workers): {seen}")
        return started, seen
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_started_anew_every_epoch_are_counted(persistent: bool) -> None:
    """A real torch DataLoader with 2 workers and epochs of ~0.3 s: with
    persistent_workers=False every epoch starts its pool again, and each tick counts the
    named workers born since the tick before (the pool's first start too, where the
    sampler saw the tree before it); with persistent_workers=True its 2 workers, started
    once, are all it ever counts."""
    started, _ = _count_started(["--epoch-seconds", "0.3"]
                                + (["--persistent"] if persistent else []), 4.0)
    if persistent:
        assert started <= 2
    else:
        # ~12 epochs in 4 s, each starting 2 workers: a tick misses the pools born and
        # gone between two ticks, so ask for well under what ran
        assert started >= 8


def test_spawned_workers_count_once_named() -> None:
    """Spawned workers carry the interpreter's name until theirs has imported torch (a
    second or more; far longer on a loaded machine): first seen unnamed, each is counted
    at the tick that sees it named, and only once (over 2 s of ticks that see both)."""
    started, seen = _count_started(["--persistent", "--start-method", "spawn"], 8.0,
                                   until=lambda seen: sum(n == 2 for _, n in seen) >= 8)
    named = [i for i, (_, n) in enumerate(seen) if n == 2]
    assert named and any(p > 1 + n for p, n in seen[:named[0]]), seen  # unnamed at first
    assert started == 2


def test_children_that_are_no_loader_workers_never_count() -> None:
    """A loop that shells out every 0.2 s (`sleep`, as a script polling `nvidia-smi`)
    beside persistent workers: the tree sees those children come and go, and counts no
    start beyond the pool's own."""
    started, seen = _count_started(["--persistent", "--subprocess-every", "0.2"], 4.0)
    assert max(p for p, _ in seen) > 3  # the children were in the tree
    assert started <= 2


def test_named_workers_alive_before_the_first_tick_are_not_counted_as_started() -> None:
    """A pool already running when the sampler starts was not started while it watched."""
    pytest.importorskip("torch")
    proc = subprocess.Popen([sys.executable, str(EPOCHS), "--workers", "2", "--persistent"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        wait_for(lambda: len(psutil.Process(proc.pid).children()) == 2, "the pool", 30)
        host = HostSampler()
        firsts = [host.sample(time.time(), [proc.pid]) for _ in range(3) if not time.sleep(0.1)]
        assert [s.jobs[0].loader_workers for s in firsts] == [2, 2, 2]
        assert [s.jobs[0].loader_workers_started for s in firsts] == [0, 0, 0]
        assert firsts[-1].jobs[0].loader_workers_started_total == 0
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# -- the host-wide fields read straight from procfs --------------------------------------
def test_procfs_reads_agree_with_psutil_on_this_machine() -> None:
    from gpuwatch.collect.host import _busy_and_total, read_meminfo, read_proc_stat_cpus
    ours = read_proc_stat_cpus()
    theirs = [_busy_and_total(c) for c in psutil.cpu_times(percpu=True)]
    assert ours is not None and len(ours) == len(theirs) == psutil.cpu_count()
    for (b1, t1), (b2, t2) in zip(ours, theirs, strict=True):
        # the clock runs between the two reads: a few ticks at most
        assert abs(b1 - b2) < 1.0 and abs(t1 - t2) < 1.0 and 0 <= b1 <= t1
    mem = read_meminfo()
    vm, swap = psutil.virtual_memory(), psutil.swap_memory()
    assert mem is not None
    assert mem[0] == vm.total and mem[2] == swap.total
    assert abs(mem[1] - vm.available) < 256 * 2**20  # available moves between reads


STAT = """cpu  {all}
cpu0 100 0 50 800 50 0 0 0 20 0
cpu1 {c1}
cpu2 10 0 0 90 0 0 0 0 0 0
intr 12345 1 2 3
ctxt 999
"""
MEMINFO = """MemTotal:       16000000 kB
MemFree:         1000000 kB
MemAvailable:    9000000 kB
Buffers:          100000 kB
SwapTotal:       2000000 kB
SwapFree:        1500000 kB
"""


def fake_proc(tmp_path: Any, c1: str, meminfo: str = MEMINFO) -> None:
    (tmp_path / "stat").write_text(STAT.format(all="1 2 3 4 5 6 7 8 9 10", c1=c1))
    (tmp_path / "meminfo").write_text(meminfo)


def test_host_fields_from_a_procfs_with_known_numbers(tmp_path: Any, monkeypatch: Any) -> None:
    from gpuwatch.collect import host as host_mod
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path))
    ticks = host_mod._CLOCK_TICKS
    fake_proc(tmp_path, "300 0 100 500 100 0 0 0 0 0")
    def flat(pairs: Any) -> list[float]:
        return [x for pair in pairs for x in pair]
    got = flat(host_mod.read_proc_stat_cpus())
    assert got == pytest.approx([(1000 - 850) / ticks, 1000 / ticks, 400 / ticks,
                                 1000 / ticks, 10 / ticks, 100 / ticks], rel=1e-12)
    # as psutil reads the same file
    assert got == pytest.approx(flat(host_mod._busy_and_total(c)
                                     for c in psutil.cpu_times(percpu=True)), rel=1e-12)
    # an older kernel's eight fields (no guest time), and a line after the cores' that
    # only looks like one
    (tmp_path / "stat").write_text("cpu  1 2 3 4 5 6 7 8\ncpu0 10 0 0 90 0 0 0 0\n"
                                   "intr 1 2\ncpu9 is not a core\n")
    assert flat(host_mod.read_proc_stat_cpus()) == pytest.approx([10 / ticks, 100 / ticks])
    fake_proc(tmp_path, "300 0 100 500 100 0 0 0 0 0")
    host = HostSampler()
    # a second later: core 0 busy 100 of 200 ticks, core 1 200 of 200 (guest time is in
    # user already and not counted twice), core 2 idle; iowait counts as idle
    (tmp_path / "stat").write_text(STAT.format(all="1", c1="500 0 100 500 100 0 0 0 0 0")
                                   .replace("cpu0 100 0 50 800 50 0 0 0 20 0",
                                            "cpu0 150 0 100 900 50 0 0 0 70 0")
                                   .replace("cpu2 10 0 0 90 0 0 0 0 0 0",
                                            "cpu2 10 0 0 290 0 0 0 0 0 0"))
    s = host.sample(time.time(), [])
    assert s.cpu_util_per_core == (0.5, 1.0, 0.0)
    assert s.cpu_util == round(300 / 600, 4)
    assert s.mem_total_bytes == 16_000_000 * 1024
    assert s.mem_used_bytes == (16_000_000 - 9_000_000) * 1024
    assert s.swap_total_bytes == 2_000_000 * 1024
    assert s.swap_used_bytes == 500_000 * 1024


def test_a_procfs_without_memavailable_or_stat_falls_back_to_psutil(
        tmp_path: Any, monkeypatch: Any) -> None:
    from gpuwatch.collect import host as host_mod
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path))
    # a kernel before 3.14: no MemAvailable; psutil estimates it from the other lines
    old = MEMINFO.replace("MemAvailable:    9000000 kB\n", "") + (
        "Cached:          2000000 kB\nActive:          3000000 kB\n"
        "Inactive:        2000000 kB\nShmem:             10000 kB\n"
        "SReclaimable:     50000 kB\n")
    fake_proc(tmp_path, "300 0 100 500 100 0 0 0 0 0", old)
    (tmp_path / "vmstat").write_text("pswpin 0\npswpout 0\n")  # psutil's swap reads it
    assert host_mod.read_meminfo() is None
    s = HostSampler().sample(time.time(), [])
    assert s.mem_total_bytes == 16_000_000 * 1024  # psutil's reading of the same file
    assert s.mem_used_bytes is not None and 0 < s.mem_used_bytes < s.mem_total_bytes
    assert s.swap_used_bytes == 500_000 * 1024
    # no /proc/stat at all: psutil is asked, fails, and the CPU is not measured
    (tmp_path / "stat").unlink()
    assert host_mod.read_proc_stat_cpus() is None
    s = HostSampler().sample(time.time(), [])
    assert s.cpu_util is None and s.cpu_util_per_core == ()
