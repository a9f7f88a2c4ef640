"""Which job a GPU belongs to when one process holds several GPUs: the frame ties a GPU to
the job of its main process where that process's hook reports for another GPU (its steps,
or, for a process that never steps, its phases: inference from a model that
``device_map="auto"`` spread over the GPUs). Fed line by line to the frame itself."""

from __future__ import annotations

from typing import Any

from gpuwatch.advisor.frame import Frame


def gpu(t: float, g: int, procs: list[tuple[int, float]]) -> dict[str, Any]:
    return {"t": t, "kind": "gpu", "gpu": g, "util": 0.5, "mem_used_bytes": 1e9,
            "mem_total_bytes": 8e10,
            "processes": [{"pid": p, "mem_used_bytes": m} for p, m in procs]}


def phase(t: float, pid: int, name: str = "inference") -> dict[str, Any]:
    return {"t": t, "kind": "phase", "phase": name, "seconds": {name: 1.0 + t}, "pid": pid}


def step(t: float, pid: int, g: int) -> dict[str, Any]:
    return {"t": t, "kind": "step", "step": int(t), "step_seconds": 0.1, "batch_size": 8,
            "pid": pid, "gpu": g}


def via(f: Frame) -> dict[int, int | None]:
    return {g: (s.job_via.gpu if s.job_via is not None else None)
            for g, s in f.subjects.items() if g is not None}


def test_an_inference_process_ties_the_gpus_it_holds():
    """pid 100 generates on GPUs 0-2 (the most memory on each), its hook's lines going to
    GPU 0: GPUs 1 and 2 are its job's."""
    f = Frame(1.0, ["util"], 60)
    for t in range(1, 8):
        for g in range(3):
            f.feed(gpu(t, g, [(100, 2e9)]))
        f.feed(phase(t + .6, 100))
    assert via(f) == {0: None, 1: 0, 2: 0}


def test_a_gpu_another_process_steps_on_is_not_taken():
    """A trainer (pid 200) steps on GPU 0 while an inference process (pid 100) holds GPU 0
    and GPU 1: GPU 1 is not tied to GPU 0's job, which is the trainer's."""
    f = Frame(1.0, ["util"], 60)
    for t in range(1, 8):
        f.feed(gpu(t, 0, [(200, 20e9), (100, 2e9)]))
        f.feed(gpu(t, 1, [(100, 2e9)]))
        f.feed(step(t + .5, 200, 0))
        f.feed(phase(t + .6, 100))
    assert via(f)[1] is None and f.job_of_pid.get(100) is not f.subjects[0]


def test_a_pid_used_again_moves_with_its_new_process():
    """pid 100 generated on GPUs 0-1 and ended; a later process with the same pid holds GPUs
    2-3: GPU 3 is tied to GPU 2, not to the finished job on GPU 0. And a process whose first
    line came before its GPUs were seen (so it fell on the only GPU then known) moves to
    its own GPU once it is seen there."""
    f = Frame(1.0, ["util"], 60)
    for t in range(1, 5):
        f.feed(gpu(t, 0, [(100, 2e9)]))
        f.feed(gpu(t, 1, [(100, 1e9)]))
        f.feed(gpu(t, 2, []))
        f.feed(gpu(t, 3, []))
        f.feed(phase(t + .6, 100))
    for t in range(10, 16):
        f.feed(gpu(t, 0, []))
        f.feed(gpu(t, 1, []))
        f.feed(gpu(t, 2, [(100, 5e9)]))
        f.feed(gpu(t, 3, [(100, 5e9)]))
        f.feed(phase(t + .6, 100))
    assert via(f)[3] == 2 and f.job_of_pid[100] is f.subjects[2]
    g = Frame(1.0, ["util"], 60)
    g.feed(gpu(1, 0, [(300, 1e9)]))
    g.feed(phase(1.2, 100))  # no GPU holds pid 100 yet: the only GPU known takes it
    for t in range(2, 8):
        g.feed(gpu(t, 0, [(300, 1e9)]))
        g.feed(gpu(t, 1, [(100, 2e9)]))
        g.feed(gpu(t, 2, [(100, 2e9)]))
        g.feed(phase(t + .6, 100))
    assert via(g) == {0: None, 1: None, 2: 1}
