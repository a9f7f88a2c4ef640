"""Synthetic recordings of the failure classes of issue #9, built from their ground truth.

Each builder writes a `gpuwatch-trace/1` file the way `gpuwatch run --record` would: GPU
and host lines at ``hz`` per second from process start, the hook's step lines (one per
iteration, ``t`` = its end) and its config line, after a start-up with the GPU idle. The
step times are the script's own clock, so each builder also returns what the attribution
must find (``truth``), against which the tests allow a stated tolerance.

Until the lead's real recordings of the same classes land in tests/data (gpu_*.jsonl),
these stand in for them; the numbers follow issue #9's account of each real run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

T0 = 1_796_000_000.0
H100 = 85_520_809_984
HOST_CPUS = 16
MIB = 2**20


@dataclass
class Run:
    """What a builder made: the lines, and what the attribution must find per GPU."""

    lines: list[dict[str, Any]]
    first_step: float  # Unix seconds: the first step began
    truth: dict[int, dict[str, float]] = field(default_factory=dict)

    def write(self, path: Path) -> Path:
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(d) + "\n" for d in self.lines)
        return path

    def without_hook(self) -> Run:
        lines = [d for d in self.lines if d["kind"] not in ("step", "config")]
        return Run(lines, self.first_step, {})


def meta(gpus: int = 1) -> dict[str, Any]:
    return {"kind": "meta", "format": "gpuwatch-trace/1", "scenario": "synthetic",
            "gpu_name": "NVIDIA H100 80GB HBM3", "compute_capability": [9, 0],
            "host_cpus": HOST_CPUS, "sample_hz": 2,
            "gpus": [{"gpu": g, "name": "NVIDIA H100 80GB HBM3", "compute_capability": [9, 0],
                      "mem_total_bytes": H100} for g in range(gpus)]}


GpuFn = Callable[[float, int], dict[str, Any]]  # (seconds since the first step, gpu) -> fields


def build(*, steps: dict[int, list[dict[str, Any]]], gpu: GpuFn,
          host: Callable[[float], dict[str, Any]], configs: dict[int, dict[str, Any]] | None = None,
          pids: dict[int, int] | None = None, startup: float = 8.0, hz: float = 2.0,
          mem_used: Callable[[float, int], float] | None = None) -> Run:
    """``steps[gpu]``: step lines relative to the first step's start (``t`` = its end)."""
    ngpu = len(steps)
    pids = pids or {g: 4000 + g for g in range(ngpu)}
    start = T0 + startup  # the first step begins
    end = start + max(s["t"] for ss in steps.values() for s in ss) + 1.0
    lines: list[dict[str, Any]] = [meta(ngpu)]
    n = 0
    while True:
        t = T0 + n / hz
        if t > end:
            break
        rel = t - start
        for g in range(ngpu):
            fields = gpu(rel, g) if rel >= 0 else {"util": 0.0, "sm_active": 0.0,
                                                    "tensor_active": 0.0, "fp32_active": 0.0,
                                                    "dram_active": 0.0}
            used = mem_used(rel, g) if mem_used is not None and rel >= 0 else 4e9
            lines.append({"t": t, "kind": "gpu", "gpu": g, "mem_used_bytes": int(used),
                          "mem_total_bytes": H100, "power_watts": 300.0,
                          "power_limit_watts": 700.0, "sm_clock_mhz": 1980.0,
                          "clock_event_reasons": 0,
                          "processes": [{"pid": pids[g], "mem_used_bytes": int(used)}]
                          if t - T0 >= 2 else [], **fields})
        h = host(rel) if rel >= 0 else {"job_cpu_cores": 1.0 * ngpu, "job_main_cpu_cores":
                                        1.0 * ngpu, "job_workers_cpu_cores": 0.0,
                                        "job_processes": ngpu}
        h = dict(h)
        busy = min(0.95, (h.get("job_cpu_cores") or 0) / HOST_CPUS + 0.02)
        lines.append({"t": t, "kind": "host", "cpu_util": busy,
                      "cpu_util_per_core": [busy] * HOST_CPUS, "load1": busy * HOST_CPUS,
                      "mem_used_bytes": 20e9, "mem_total_bytes": 128e9,
                      "job_rss_bytes": 4e9, **h})
        n += 1
    for g, ss in steps.items():
        for s in ss:
            lines.append({"kind": "step", "pid": pids[g], "gpu": g, **s, "t": start + s["t"]})
        cfg = (configs or {}).get(g)
        if cfg is not None:
            lines.append({"kind": "config", "t": start - 0.5, "pid": pids[g], **cfg})
    body = sorted(lines[1:], key=lambda d: d["t"])
    return Run([lines[0], *body], start)


def steady_steps(seconds: float, step: float, wait: Callable[[int], float] | float = 0.0,
                 **extra: Any) -> list[dict[str, Any]]:
    """Back-to-back steps of ``step`` seconds for ``seconds``; ``wait(i)`` data wait."""
    out, t, i = [], 0.0, 0
    while t + step <= seconds:
        w = wait(i) if callable(wait) else wait
        t += step
        out.append({"step": i, "step_seconds": step, "data_wait_seconds": w,
                    "batch_size": 64, "mem_allocated_bytes": 2_000_000_000,
                    "mem_reserved_bytes": 3_000_000_000,
                    "max_mem_allocated_bytes": 2_500_000_000, "loss_scale": None, "t": t,
                    **{k: (v(i) if callable(v) else v) for k, v in extra.items()}})
        i += 1
    return out


def const(**fields: float) -> GpuFn:
    return lambda rel, g: dict(fields)


# -- the failure classes -------------------------------------------------------------------
def starved_cnn(seconds: float = 40.0) -> Run:
    """Three DataLoader workers pegged by augmentation, 88 % of step time waiting for data
    in bursts (a dozen fast steps from the prefetch queue, then one long wait), GPU 4 %."""
    step_fast, burst = 0.02, 13
    long_wait = 1.6

    def seq() -> Iterable[dict[str, Any]]:
        t, i = 0.0, 0
        while t < seconds:
            w = long_wait if i % burst == burst - 1 else 0.001
            ss = step_fast + w
            t += ss
            yield {"step": i, "step_seconds": ss, "data_wait_seconds": w, "batch_size": 128,
                   "mem_allocated_bytes": 3_000_000_000, "mem_reserved_bytes": 4_000_000_000,
                   "max_mem_allocated_bytes": 3_500_000_000, "loss_scale": None, "t": t}
            i += 1
    steps = list(seq())
    wall = steps[-1]["t"]
    data = sum(s["data_wait_seconds"] for s in steps) / wall
    run = build(steps={0: steps},
                gpu=const(util=0.04, sm_active=0.03, tensor_active=0.01, fp32_active=0.005,
                          dram_active=0.02),
                host=lambda rel: {"job_cpu_cores": 3.1, "job_main_cpu_cores": 0.1,
                                  "job_workers_cpu_cores": 3.0, "job_processes": 4},
                configs={0: {"num_workers": 3, "persistent_workers": True, "pin_memory": True,
                             "uses_dataloader": True, "uses_conv": True, "channels_last": False,
                             "autocast_dtype": "bfloat16", "batch_size": 128}})
    run.truth = {0: {"data": data}}
    return run


def gan(seconds: float = 40.0) -> Run:
    """Two optimizers per iteration, 16-iteration epochs with persistent_workers=False (the
    workers start again every epoch: the first batch waits 0.9 s), a print with .item()
    every iteration: GPU 8 %, SM 5 %, the main process at 1.3 cores."""
    it, epoch, first_wait = 0.13, 16, 0.9
    steps = steady_steps(seconds, it, wait=lambda i: first_wait if i % epoch == 0 else 0.004,
                         first_batch=lambda i: i % epoch == 0)
    for s in steps:  # the first batch's wait is part of that iteration's time
        s["step_seconds"] = it + s["data_wait_seconds"]
    t = 0.0
    for s in steps:
        t += s["step_seconds"]
        s["t"] = t
    wall = steps[-1]["t"]
    data = sum(s["data_wait_seconds"] for s in steps) / wall
    run = build(steps={0: steps},
                gpu=const(util=0.08, sm_active=0.05, tensor_active=0.02, fp32_active=0.01,
                          dram_active=0.03),
                host=lambda rel: {"job_cpu_cores": 1.5, "job_main_cpu_cores": 1.3,
                                  "job_workers_cpu_cores": 0.2, "job_processes": 3},
                configs={0: {"num_workers": 2, "persistent_workers": False, "pin_memory": True,
                             "uses_dataloader": True, "uses_conv": True, "channels_last": False,
                             "batch_size": 64, "autocast_dtype": None}})
    run.truth = {0: {"data": data}}
    return run


def ddp(seconds: float = 40.0, slow: bool = True) -> Run:
    """Two ranks of one torchrun job, one per GPU, meeting in every all-reduce: rank 1's
    input pipeline waits 60 % of each step (``slow``), so rank 0 waits for it in NCCL
    (util 88 %, SM 42 %: spinning, not working). The balanced twin: both wait 2 %."""
    step = 0.25 if slow else 0.1
    waits = {0: 0.005, 1: 0.6 * step if slow else 0.002}
    steps = {r: steady_steps(seconds, step, wait=waits[r], rank=r) for r in (0, 1)}

    def gpu(rel: float, g: int) -> dict[str, Any]:
        if not slow:
            return {"util": 0.97, "sm_active": 0.85, "tensor_active": 0.3, "fp32_active": 0.02,
                    "dram_active": 0.4}
        if g == 0:
            return {"util": 0.88, "sm_active": 0.42, "tensor_active": 0.1,
                    "fp32_active": 0.01, "dram_active": 0.15}
        return {"util": 0.38, "sm_active": 0.34, "tensor_active": 0.12, "fp32_active": 0.01,
                "dram_active": 0.15}
    # each rank's own tree, as the host layer splits a launcher's job per GPU: rank 1's
    # single worker pegged while its main process mostly waits (the script's --slow-rank)
    trees = [{"pid": 4000, "gpus": [0], "main_cpu_cores": 1.0, "workers_cpu_cores": 0.4,
              "cpu_cores": 1.4, "processes": 5},
             {"pid": 4001, "gpus": [1], "main_cpu_cores": 0.35 if slow else 1.0,
              "workers_cpu_cores": 1.0 if slow else 0.4, "cpu_cores": 1.35 if slow else 1.4,
              "processes": 2 if slow else 5}]
    run = build(steps=steps, gpu=gpu,
                host=lambda rel: {"job_cpu_cores": sum(t["cpu_cores"] for t in trees),
                                  "job_main_cpu_cores": sum(t["main_cpu_cores"] for t in trees),
                                  "job_workers_cpu_cores": sum(t["workers_cpu_cores"]
                                                               for t in trees),
                                  "job_processes": sum(t["processes"] for t in trees),
                                  "jobs": trees},
                configs={r: {"rank": r, "world_size": 2, "num_workers": 4,
                             "persistent_workers": True, "pin_memory": True,
                             "uses_dataloader": True, "autocast_dtype": "bfloat16",
                             "batch_size": 64} for r in (0, 1)})
    if slow:
        run.truth = {0: {"sync": 0.6 - 0.02, "data": 0.02},
                     1: {"data": 0.6, "sync": 0.0}}
    return run


def resnet_fp32(seconds: float = 40.0, config: bool = True) -> Run:
    """ResNet-50 in fp32 (cuDNN's default TF32 convolutions): util 84 %, SM 71 %, tensor
    7.5 %, FP32 pipe 1.3 %, DRAM 49 %; the hook reports autocast off and convolutions."""
    steps = steady_steps(seconds, 0.3, wait=0.01)
    cfg = {"num_workers": 8, "persistent_workers": True, "pin_memory": True,
           "uses_dataloader": True, "uses_conv": True, "channels_last": False,
           "autocast_dtype": None, "tf32": False, "cudnn_benchmark": True,
           "fused_optimizer": True, "batch_size": 64}
    return build(steps={0: steps},
                 gpu=const(util=0.84, sm_active=0.71, tensor_active=0.075, fp32_active=0.013,
                           dram_active=0.49),
                 host=lambda rel: {"job_cpu_cores": 6.0, "job_main_cpu_cores": 1.0,
                                   "job_workers_cpu_cores": 5.0, "job_processes": 9},
                 configs={0: cfg} if config else None)


def manual_lstm(seconds: float = 40.0) -> Run:
    """An LSTM at batch 20 updating its parameters by hand, no DataLoader, no torch.optim:
    the hook counts steps from backward(); util 40 %, SM 7 %, memory 1 %, one core pegged
    launching kernels."""
    steps = steady_steps(seconds, 0.012, batch_size=20)
    for s in steps:
        s.pop("data_wait_seconds")  # no DataLoader: nothing to time
        s["mem_allocated_bytes"] = 300_000_000
        s["max_mem_allocated_bytes"] = 420_000_000
        s["mem_reserved_bytes"] = 600_000_000
    return build(steps={0: steps},
                 gpu=const(util=0.40, sm_active=0.07, tensor_active=0.01, fp32_active=0.03,
                           dram_active=0.02),
                 host=lambda rel: {"job_cpu_cores": 1.0, "job_main_cpu_cores": 1.0,
                                   "job_workers_cpu_cores": 0.0, "job_processes": 1},
                 mem_used=lambda rel, g: 0.01 * H100,
                 configs={0: {"uses_dataloader": False, "uses_conv": False,
                              "step_source": "backward", "autocast_dtype": None}})


def leak_to_oom(seconds: float = 60.0) -> Run:
    """A loop that keeps 48 MB of GPU tensors alive per step (outputs collected for
    metrics): allocated and device memory climb a straight line from 10 % to 99.5 % of the
    card in 60 s at a constant batch."""
    total = H100
    start_b, end_b = 0.10 * total, 0.995 * total
    step = (end_b - start_b) / 48e6
    dt = seconds / step
    steps = steady_steps(seconds, dt)
    for i, s in enumerate(steps):
        alloc = start_b + 48e6 * i
        s["mem_allocated_bytes"] = int(alloc)
        s["max_mem_allocated_bytes"] = int(alloc + 2e9)
        s["mem_reserved_bytes"] = int(alloc + 2.5e9)
    return build(steps={0: steps},
                 gpu=const(util=0.95, sm_active=0.8, tensor_active=0.3, fp32_active=0.02,
                           dram_active=0.4),
                 host=lambda rel: {"job_cpu_cores": 2.0, "job_main_cpu_cores": 1.0,
                                   "job_workers_cpu_cores": 1.0, "job_processes": 5},
                 mem_used=lambda rel, g: min(0.995 * total,
                                             start_b + 2.5e9 + (end_b - start_b) * rel / seconds),
                 configs={0: {"num_workers": 4, "persistent_workers": True, "pin_memory": True,
                              "uses_dataloader": True, "autocast_dtype": "bfloat16",
                              "batch_size": 64}})


def job_seconds(run: Run, gpu: int = 0) -> float:
    steps = [d for d in run.lines if d["kind"] == "step" and d.get("gpu", 0) == gpu]
    return steps[-1]["t"] - (steps[0]["t"] - steps[0]["step_seconds"])


MIB_BYTES = MIB


# -- the framework classes (issue "Advice that is right on the stacks people train with") --
def phase_lines(schedule: list[tuple[str, float]], *, start: float, pid: int, gpu: int | None = 0,
                every: float = 0.5, **extra: Any) -> list[dict[str, Any]]:
    """The hook's `phase` lines for ``schedule`` (phase, seconds) from ``start`` (Unix
    seconds): one every ``every`` seconds, each with the seconds by phase so far."""
    out: list[dict[str, Any]] = []
    spans, t = [], start
    for phase, seconds in schedule:
        spans.append((phase, t, t + seconds))
        t += seconds
    end, now = t, start + every
    while now <= end + 1e-9:
        seconds: dict[str, float] = {}
        current = spans[-1][0]
        for phase, a, b in spans:
            if a < now:
                seconds[phase] = round(seconds.get(phase, 0.0) + min(b, now) - a, 3)
            if a < now <= b:
                current = phase
        line = {"t": now, "kind": "phase", "pid": pid, "phase": current, "seconds": seconds,
                **{k: (v(now - start) if callable(v) else v) for k, v in extra.items()}}
        if gpu is not None:
            line["gpu"] = gpu
        out.append(line)
        now += every
    return out


def with_lines(run: Run, extra: list[dict[str, Any]]) -> Run:
    body = sorted(run.lines[1:] + extra, key=lambda d: d["t"])
    return Run([run.lines[0], *body], run.first_step, run.truth)


def host_bound_bert(seconds: float = 40.0, util: float = 0.60, sm_active: float = 0.47,
                    full: bool = False) -> Run:
    """BERT-base in fp32 at batch 8 (issue: util 60 %, SM 47 %, 4 % of memory, 54 % of each
    step in the host): 90 ms steps with no data wait, the main process pegged; ``util`` and
    ``sm_active`` set the GPU's readings; ``full``: the allocator holds 96 % of the GPU's
    memory (a model that leaves no room for a larger batch), NVML reads 97 % used."""
    held = (int(0.90 * H100), int(0.95 * H100), int(0.96 * H100)) if full else (
        1_400_000_000, 1_900_000_000, 2_400_000_000)
    steps = steady_steps(seconds, 0.09, wait=0.001, batch_size=8,
                         mem_allocated_bytes=held[0], max_mem_allocated_bytes=held[1],
                         mem_reserved_bytes=held[2])
    return build(steps={0: steps},
                 gpu=const(util=util, sm_active=sm_active, tensor_active=0.02, fp32_active=0.12,
                           dram_active=0.2),
                 host=lambda rel: {"job_cpu_cores": 1.05, "job_main_cpu_cores": 1.0,
                                   "job_workers_cpu_cores": 0.05, "job_processes": 2},
                 mem_used=lambda rel, g: (0.97 if full else 0.04) * H100,
                 configs={0: {"num_workers": 1, "persistent_workers": False,
                              "pin_memory": True, "uses_dataloader": True, "batch_size": 8,
                              "autocast_dtype": None, "tf32": True, "framework": "transformers",
                              "fw_batch_size": 8, "fw_grad_accum": 1, "fw_precision": "fp32"}})


def grad_accum(seconds: float = 40.0, framework: str = "accelerate", micro: int = 16) -> Run:
    """Micro-batches of 4, ``micro`` (16) per optimizer step (Accelerate's accumulate()):
    each step fetches 4 x ``micro`` samples in that many backward passes; the GPU busy
    30 %, memory 8 % used."""
    steps = steady_steps(seconds, 0.4, wait=0.004, batch_size=4 * micro, micro_batches=micro,
                         mem_allocated_bytes=2_000_000_000,
                         max_mem_allocated_bytes=2_400_000_000,
                         mem_reserved_bytes=3_000_000_000)
    return build(steps={0: steps},
                 gpu=const(util=0.45, sm_active=0.3, tensor_active=0.1, fp32_active=0.01,
                           dram_active=0.1),
                 host=lambda rel: {"job_cpu_cores": 1.1, "job_main_cpu_cores": 1.0,
                                   "job_workers_cpu_cores": 0.1, "job_processes": 3},
                 mem_used=lambda rel, g: 0.08 * H100,
                 configs={0: {"num_workers": 2, "persistent_workers": True, "pin_memory": True,
                              "uses_dataloader": True, "batch_size": 4,
                              "autocast_dtype": "bfloat16", "framework": framework,
                              "fw_grad_accum": micro, "fw_precision": "bf16"}})


def eval_heavy(seconds: float = 60.0, train: float = 2.0, evaluate: float = 8.0,
               config: dict[str, Any] | None = None) -> Run:
    """The Trainer evaluating every few steps at per_device_eval_batch_size=8: ``train``
    seconds of steps, then ``evaluate`` seconds of evaluation (the GPU at 20 %), over and
    over. The hook leaves the evaluation out of the step times and says so in its phases."""
    steps, t, i, phases = [], 0.0, 0, [("startup", 0.0)]
    cycle = train + evaluate
    while t + cycle <= seconds:
        n = round(train / 0.1)
        for _ in range(n):
            t += 0.1
            steps.append({"step": i, "step_seconds": 0.1, "data_wait_seconds": 0.002,
                          "batch_size": 32, "micro_batches": 1,
                          "mem_allocated_bytes": 3_000_000_000,
                          "max_mem_allocated_bytes": 5_000_000_000,
                          "mem_reserved_bytes": 6_000_000_000, "t": t})
            i += 1
        phases += [("train", train), ("eval", evaluate)]
        t += evaluate

    def gpu(rel: float, g: int) -> dict[str, Any]:
        evaluating = rel % cycle >= train
        return ({"util": 0.2, "sm_active": 0.1, "tensor_active": 0.03, "fp32_active": 0.01,
                 "dram_active": 0.05} if evaluating else
                {"util": 0.95, "sm_active": 0.8, "tensor_active": 0.4, "fp32_active": 0.01,
                 "dram_active": 0.3})
    run = build(steps={0: steps}, gpu=gpu,
                host=lambda rel: {"job_cpu_cores": 1.2, "job_main_cpu_cores": 1.0,
                                  "job_workers_cpu_cores": 0.2, "job_processes": 3},
                mem_used=lambda rel, g: 0.12 * H100,
                configs={0: {"num_workers": 2, "persistent_workers": True, "pin_memory": True,
                             "uses_dataloader": True, "batch_size": 32,
                             "autocast_dtype": "bfloat16", "framework": "transformers",
                             "fw_eval_batch_size": 8, "fw_eval_every": 20,
                             "fw_batch_size": 32, "fw_grad_accum": 1, **(config or {})}})
    first = run.first_step
    extra = phase_lines(phases[1:], start=first, pid=4000, eval_batch_size=8)
    run = with_lines(run, extra)
    run.truth = {0: {"eval": evaluate / cycle}}
    return run


def startup_prefetch(startup: float = 30.0, seconds: float = 30.0, hook: bool = True) -> Run:
    """A Lightning DDP rank before its first step: persistent workers prefetch (8 workers
    pegged) for ``startup`` seconds with the GPU idle, then it trains, healthy."""
    steps = steady_steps(seconds, 0.05, wait=0.001, batch_size=64)

    def host(rel: float) -> dict[str, Any]:
        return {"job_cpu_cores": 8.5, "job_main_cpu_cores": 0.5, "job_workers_cpu_cores": 8.0,
                "job_processes": 9}
    run = build(steps={0: steps},
                gpu=const(util=0.97, sm_active=0.85, tensor_active=0.4, fp32_active=0.01,
                          dram_active=0.3),
                host=host, startup=startup, mem_used=lambda rel, g: 0.3 * H100,
                configs={0: {"num_workers": 8, "persistent_workers": True, "pin_memory": True,
                             "uses_dataloader": True, "batch_size": 64,
                             "autocast_dtype": "bfloat16", "framework": "lightning"}})
    # start-up: the workers pegged from the first second, not only from the first step
    for d in run.lines:
        if d["kind"] == "host":
            d.update(host(0.0))
    if not hook:
        return run.without_hook()
    extra = phase_lines([("startup", startup - 2.0), ("train", seconds + 2.0)], start=T0 + 2.0,
                        pid=4000)
    return with_lines(run, extra)


def compiling(compile_seconds: float = 50.0, seconds: float = 30.0) -> Run:
    """torch.compile compiling for ``compile_seconds`` before the first step (GPU idle)."""
    steps = steady_steps(seconds, 0.05, wait=0.001, batch_size=64)
    run = build(steps={0: steps},
                gpu=const(util=0.97, sm_active=0.85, tensor_active=0.4, fp32_active=0.01,
                          dram_active=0.3),
                host=lambda rel: {"job_cpu_cores": 1.5, "job_main_cpu_cores": 1.0,
                                  "job_workers_cpu_cores": 0.5, "job_processes": 3},
                startup=compile_seconds + 6.0, mem_used=lambda rel, g: 0.3 * H100,
                configs={0: {"num_workers": 2, "persistent_workers": True, "pin_memory": True,
                             "uses_dataloader": True, "batch_size": 64,
                             "autocast_dtype": "bfloat16"}})
    extra = phase_lines([("startup", 4.0), ("compile", compile_seconds),
                         ("startup", 2.0), ("train", seconds)], start=T0, pid=4000,
                        compiles=lambda rel: 1 if rel >= 4.0 else 0)
    return with_lines(run, extra)


def inference(seconds: float = 40.0) -> Run:
    """A process that only runs model.generate at batch 1 under no_grad: no backward, no
    optimizer, no step; the GPU busy 20 % (launch-bound decoding)."""
    run = build(steps={0: [{"step": 0, "t": seconds, "step_seconds": None}]},
                gpu=const(util=0.2, sm_active=0.08, tensor_active=0.01, fp32_active=0.01,
                          dram_active=0.05),
                host=lambda rel: {"job_cpu_cores": 1.0, "job_main_cpu_cores": 1.0,
                                  "job_workers_cpu_cores": 0.0, "job_processes": 1},
                mem_used=lambda rel, g: 0.02 * H100,
                configs={0: {"uses_dataloader": False, "autocast_dtype": None}})
    lines = [d for d in run.lines if d["kind"] != "step"]  # it never steps
    extra = phase_lines([("startup", 6.0), ("inference", seconds + 2.0)], start=T0,
                        pid=4000, inference_batch_size=1,
                        inference_batches=lambda rel: max(0, int((rel - 6.0) * 4)),
                        generate_calls=lambda rel: max(0, int((rel - 6.0) * 4)))
    return with_lines(Run(lines, run.first_step), extra)
