"""Soak: the daemon for a long while under churn; its memory and series count must stay flat.

    python3 benchmarks/soak.py --minutes 30 --out soak.jsonl      # run, a line every ~10 s
    python3 benchmarks/soak.py --plot soak.jsonl --png docs/img/soak.png   # curve + table

What runs, all on this machine (no GPU needed):

- the real daemon (Store, Sampler, exporter, HTTP server, hook receiver, advisor, recorder)
  in this process, ticking every ``--interval`` (0.1 s) over ``--gpus`` stubbed GPUs
  (tests/nvml_stub.py) and the real host through psutil;
- GPU processes churning: real short-lived ``sleep`` processes come and go on the stubbed
  GPUs (a few stay listed for a moment after they died: gone between listing and reading),
  so per-process series appear and must disappear;
- hook jobs coming and going: real processes that send the hook's datagrams to the
  daemon's socket for 5-40 s, half ending with an exit report and half just dying, and one
  that reports 2 000 steps a second for the whole run, all of it recorded (``--record``).

Every ``--every`` seconds a JSON line goes to ``--out``: the daemon's RSS, threads and open
files, the number of series on /metrics (and of per-process and training series), the
store's window sizes, the recording's size, ticks and errors. The daemon's memory is this
process's (the drivers here are a few threads; the job senders and sleepers are other
processes). The store keeps ``history_seconds`` of windows (120 s by default; older soaks
ran with 900 s, their ``meta`` line says which), and the advisor's windows fill for their
longest window (ten minutes: the error counters'), so memory grows for the first minutes and
must be flat after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

# the job side: a process that reports like the torch hook does, through gpuwatch.job.protocol
SENDER = r"""
import os, random, socket, sys, time
from gpuwatch.job import protocol
path, rate, seconds, ending, rank = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
pid, seq, step, t0 = os.getpid(), 0, 0, time.time()
period = 0.1 if rate >= 100 else 1.0
while seconds <= 0 or time.time() - t0 < seconds:
    time.sleep(period)
    now = time.time()
    n = max(1, int(rate * period))
    dt = period / n
    steps = [protocol.StepRecord(step=step + i, t=now - (n - 1 - i) * dt, step_seconds=dt,
                                 data_wait_seconds=dt * 0.1, batch_size=32) for i in range(n)]
    step += n
    seq += 1
    header = {"kind": "report", "pid": pid, "seq": seq, "t": now, "rank": rank,
              "world_size": 4, "gpu": rank % 4, "steps_total": step,
              "window": {"steps": n, "timed": n, "step_seconds": period,
                         "data_wait_seconds": period * 0.1, "samples": 32 * n,
                         "sample_seconds": period},
              "loss_scale": 65536.0, "mem_allocated_bytes": 2**30,
              "config": {"num_workers": 4, "batch_size": 32} if seq == 1 else None}
    try:
        s.sendto(protocol.encode(header, steps), path)
    except OSError:
        pass
if ending == "exit":
    seq += 1
    s.sendto(protocol.encode({"kind": "exit", "pid": pid, "seq": seq, "t": time.time(),
                              "rank": rank, "steps_total": step, "exit_reason": "exited"}), path)
os._exit(0)
"""


class Churn:
    """GPU processes and hook jobs coming and going, on threads of their own."""

    def __init__(self, stub: Any, socket_path: str, rng: random.Random,
                 fast_rate: float) -> None:
        self.stub = stub
        self.socket_path = socket_path
        self.rng = rng
        self.fast_rate = fast_rate
        self.stop = threading.Event()
        self.sleepers: list[tuple[int, subprocess.Popen]] = []  # (gpu, process)
        self.jobs: list[subprocess.Popen] = []
        self.started_sleepers = 0
        self.started_jobs = 0
        self.env = {**os.environ, "PYTHONPATH": str(REPO)}

    def sender(self, rate: float, seconds: float, ending: str, rank: int) -> subprocess.Popen:
        self.started_jobs += 1
        return subprocess.Popen([sys.executable, "-c", SENDER, self.socket_path, str(rate),
                                 str(seconds), ending, str(rank)], env=self.env,
                                stdin=subprocess.DEVNULL)

    def run_gpu_processes(self) -> None:
        rng = self.rng
        while not self.stop.wait(1.0):
            listed: dict[int, list[tuple[int, int]]] = {g: [] for g in range(len(self.stub.gpus))}
            keep = []
            for gpu, proc in self.sleepers:
                if proc.poll() is None or rng.random() < 0.3:  # a dead one listed a moment
                    keep.append((gpu, proc))
                    listed[gpu].append((proc.pid, rng.randrange(1, 40) * 2**28))
            self.sleepers = [(g, p) for g, p in keep if p.poll() is None]
            for gpu in listed:
                if len(listed[gpu]) < 6 and rng.random() < 0.5:
                    proc = subprocess.Popen(["sleep", str(rng.uniform(2, 20))])
                    self.started_sleepers += 1
                    self.sleepers.append((gpu, proc))
                    listed[gpu].append((proc.pid, 2**30))
            for gpu, procs in listed.items():
                self.stub.gpus[gpu].processes = procs
                self.stub.gpus[gpu].process_util = [(pid, rng.randrange(0, 100))
                                                    for pid, _ in procs]

    def run_jobs(self) -> None:
        rng = self.rng
        fast = self.sender(self.fast_rate, 0, "none", 0)
        while not self.stop.wait(rng.uniform(2, 6)):
            self.jobs = [j for j in self.jobs if j.poll() is None]
            if len(self.jobs) < 6:
                ending = rng.choice(["exit", "vanish"])
                job = self.sender(rng.choice([10.0, 50.0, 200.0]), rng.uniform(5, 40), ending,
                                  rng.randrange(1, 4))
                self.jobs.append(job)
        for p in [fast, *self.jobs]:
            p.kill()
            p.wait()

    def close(self) -> None:
        self.stop.set()
        for _gpu, p in self.sleepers:
            p.kill()
            p.wait()


def count_series(url: str) -> dict[str, int]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    return {"series": len(lines),
            "process_series": sum(ln.startswith("gpuwatch_process_") for ln in lines),
            "train_series": sum(ln.startswith("gpuwatch_train_") for ln in lines),
            "job_series": sum(ln.startswith("gpuwatch_job_") for ln in lines)}


def soak(args: argparse.Namespace) -> None:
    import psutil
    from nvml_stub import NvmlStub, StubGpu

    from gpuwatch import logs
    from gpuwatch.daemon import Daemon
    from gpuwatch.serve.config import Config

    logs.setup("warning")
    workdir = Path(tempfile.mkdtemp(prefix="gpuwatch-soak-"))
    record = args.record or str(workdir / "soak.jsonl")
    stub = NvmlStub([StubGpu(i) for i in range(args.gpus)])
    config = Config(listen_address="127.0.0.1:0", interval=args.interval, slow_interval=5.0,
                    hook_socket=str(workdir / "hook.sock"), record=record)
    daemon = Daemon(config, sampler_kwargs={"nvml_module": stub})
    daemon.start()
    me = psutil.Process()
    churn = Churn(stub, str(daemon.hook_socket), random.Random(args.seed), args.steps_per_second)
    threads = [threading.Thread(target=churn.run_gpu_processes, daemon=True),
               threading.Thread(target=churn.run_jobs, daemon=True)]
    for t in threads:
        t.start()
    start = time.monotonic()
    end = start + args.minutes * 60
    meta = {"kind": "meta", "interval": args.interval, "gpus": args.gpus,
            "steps_per_second": args.steps_per_second, "minutes": args.minutes,
            "history_seconds": config.history_seconds,
            "cpus": os.cpu_count(), "python": sys.version.split()[0], "record": record,
            "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    with open(args.out, "w") as out:
        out.write(json.dumps(meta) + "\n")
        out.flush()
        while True:
            now = time.monotonic()
            store = daemon.store
            latest = store.latest()
            with store._lock:  # window sizes: what must stay bounded
                windows = {"gpu_window": sum(len(r) for r in store._gpu.values()),
                           "host_window": len(store._host), "step_window": len(store._steps),
                           "store_jobs": len(store._jobs), "store_configs": len(store._configs)}
            row = {"t": round(now - start, 1), "rss_bytes": me.memory_info().rss,
                   "threads": me.num_threads(), "fds": me.num_fds(),
                   **count_series(daemon.url), **windows,
                   "receiver_jobs": len(daemon.receiver.jobs()),
                   "recording_bytes": os.path.getsize(record) if os.path.exists(record) else 0,
                   "recorder_backlog": daemon.recorder._queue.qsize(),
                   "recorder_dropped": daemon.recorder.dropped_samples,
                   "ticks": latest.health.ticks_total,
                   "errors": sum(latest.health.errors_total.values()),
                   "hook_messages": latest.health.hook_messages_total,
                   "hook_dropped": sum(latest.health.hook_messages_dropped_total.values()),
                   "skipped_slots": daemon.source.skipped_slots,
                   "sleepers_started": churn.started_sleepers,
                   "jobs_started": churn.started_jobs}
            out.write(json.dumps(row) + "\n")
            out.flush()
            if now >= end:
                break
            time.sleep(min(args.every, max(0.0, end - now)))
    churn.close()
    for t in threads:
        t.join(10)
    daemon.stop()
    if not args.record:
        os.unlink(record)
    print(f"soak done: {args.out}")


def plot(args: argparse.Namespace) -> None:
    """The curve as a PNG and a markdown table (every ``--table-every`` minutes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in open(args.plot)]
    meta, rows = rows[0], rows[1:]
    minutes = [r["t"] / 60 for r in rows]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    ax1.plot(minutes, [r["rss_bytes"] / 2**20 for r in rows], label="daemon RSS (MiB)")
    ax1.set_ylabel("MiB")
    ax1.set_ylim(bottom=0)
    ax1.legend(loc="lower right")
    ax1.set_title(f"soak: interval {meta['interval']} s, {meta['gpus']} stub GPUs, "
                  f"{meta['steps_per_second']:g} steps/s recorded")
    ax2.plot(minutes, [r["series"] for r in rows], label="series on /metrics")
    ax2.plot(minutes, [r["process_series"] + r["train_series"] + r["job_series"]
                       for r in rows], label="per-process, job and train series")
    ax2.set_ylabel("series")
    ax2.set_xlabel("minutes")
    # where the bounds start to hold: dead jobs forgotten, windows full
    for ax in (ax1, ax2):
        for minute, what in ((10, "dead jobs forgotten (600 s)"),
                             (meta.get("history_seconds", 900) / 60, "windows full")):
            if minutes and minute < minutes[-1]:
                ax.axvline(minute, color="grey", linestyle=":", linewidth=1)
                if ax is ax2:
                    ax.annotate(what, (minute, 0), xytext=(3, 3), textcoords="offset points",
                                fontsize=7, color="grey", rotation=90, va="bottom")
    ax2.set_ylim(bottom=0)
    ax2.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(args.png, dpi=80)
    print(f"wrote {args.png}")
    print("| minute | RSS MiB | threads | fds | series | process / job / train series | "
          "GPU window | step window | jobs known | recording MB | ticks | errors |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    next_t = 0.0
    for r in rows:
        if r["t"] + 1e-6 < next_t and r is not rows[-1]:
            continue
        next_t = r["t"] + args.table_every * 60
        print(f"| {r['t'] / 60:.1f} | {r['rss_bytes'] / 2**20:.1f} | {r['threads']} | "
              f"{r['fds']} | {r['series']} | {r['process_series']} / {r['job_series']} / "
              f"{r['train_series']} | {r['gpu_window']} | {r['step_window']} | "
              f"{r['receiver_jobs']} | {r['recording_bytes'] / 1e6:.0f} | {r['ticks']} | "
              f"{r['errors']} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--interval", type=float, default=0.1)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--steps-per-second", type=float, default=2000.0)
    p.add_argument("--every", type=float, default=10.0, help="seconds between measurements")
    p.add_argument("--record", help="keep the recording here (else a temp file, removed)")
    p.add_argument("--seed", type=int, default=8)
    p.add_argument("--out", default="soak.jsonl")
    p.add_argument("--plot", help="a soak's output: draw it instead of running")
    p.add_argument("--png", default="soak.png")
    p.add_argument("--table-every", type=float, default=5.0, help="minutes between table rows")
    args = p.parse_args()
    if args.plot:
        plot(args)
    else:
        soak(args)


if __name__ == "__main__":
    main()
