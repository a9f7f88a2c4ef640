#!/usr/bin/env python3
"""What the fleet report costs: `gpuwatch advise --prometheus` over N hosts.

Run from the repository root (no GPU needed; needs Debian's prometheus and promtool):

    python3 benchmarks/bench_fleet.py --hosts 1,4,16 --gpus 4 --window 300

For each fleet size it backfills a fresh Prometheus TSDB (promtool tsdb
create-blocks-from openmetrics) with N hosts of G GPUs at 1 Hz over the window: every
series the fleet report reads (GPU gauges from tests/data/input_bound.jsonl and
small_batch.jsonl, alternating per host and cycled, the host's CPU and memory, one hook
job per GPU with its rank), starts Prometheus on it and times `gpuwatch advise
--prometheus URL --window W --format json` in a fresh process: wall time, CPU time of the
advise process and its peak RSS, beside the number of series and the advice it gave.
Each host is queried and judged on its own, so the RSS should stay flat as N grows and
the time grow about linearly.

Prints a Markdown table; ``--out FILE`` writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
GPU = {"util": "gpuwatch_gpu_utilization_ratio", "mem_used_bytes": "gpuwatch_gpu_memory_used_bytes",
       "mem_total_bytes": "gpuwatch_gpu_memory_total_bytes",
       "power_watts": "gpuwatch_gpu_power_watts", "temp_celsius": "gpuwatch_gpu_temperature_celsius",
       "sm_active": "gpuwatch_gpu_sm_active_ratio",
       "tensor_active": "gpuwatch_gpu_tensor_active_ratio"}


def per_second(name: str, kind: str) -> list[dict[str, Any]]:
    """One line of ``kind`` per second of a recording."""
    out, last = [], None
    with open(DATA / f"{name}.jsonl", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            if d.get("kind") == kind and int(d["t"]) != last:
                last = int(d["t"])
                out.append(d)
    return out


def openmetrics(path: Path, hosts: int, gpus: int, window: int, end: int) -> int:
    """Write the fleet's series to ``path``; returns how many series."""
    recs = [(per_second(n, "gpu"), per_second(n, "host"), per_second(n, "step"))
            for n in ("input_bound", "small_batch")]
    fams: dict[str, list[str]] = {}
    series = set()

    def add(name: str, labels: str, value: float, t: int) -> None:
        fams.setdefault(name, []).append(f"{name}{{{labels}}} {value} {t}")
        series.add((name, labels))

    for h in range(hosts):
        g_lines, h_lines, s_lines = recs[h % 2]
        inst = f'instance="gpu-{h + 1}:9442",job="gpuwatch"'
        steps = 0
        for i in range(window):
            t = end - window + i
            hl = h_lines[i % len(h_lines)]
            cores = hl["cpu_util_per_core"]
            add("gpuwatch_host_cpu_utilization_ratio", inst, sum(cores) / len(cores), t)
            add("gpuwatch_host_load1", inst, hl["load1"], t)
            add("gpuwatch_host_memory_used_bytes", inst, hl["mem_used_bytes"], t)
            gl = g_lines[i % len(g_lines)]
            sl = s_lines[i % len(s_lines)]
            steps += 1
            for g in range(gpus):
                lab = f'{inst},gpu="{g}",uuid="GPU-{h}-{g}"'
                for field, name in GPU.items():
                    if gl.get(field) is not None:
                        add(name, lab, gl[field], t)
                add("gpuwatch_gpu_up", lab, 1, t)
                job = f'{inst},pid="{1000 + g}",rank="{h * gpus + g}",gpu="{g}"'
                add("gpuwatch_train_steps_total", job, steps, t)
                add("gpuwatch_train_step_seconds", job, sl.get("step_seconds") or 0.1, t)
                wait = (sl.get("data_wait_seconds") or 0.0) / (sl.get("step_seconds") or 1.0)
                add("gpuwatch_train_data_wait_ratio", job, wait, t)
    with open(path, "w", encoding="utf-8") as f:
        for name, lines in fams.items():
            f.write(f"# TYPE {name} gauge\n")
            # a series' samples together and in time order
            lines.sort(key=lambda s: (s.rsplit("} ", 1)[0], int(s.rsplit(" ", 1)[1])))
            f.write("\n".join(lines) + "\n")
        f.write("# EOF\n")
    return len(series)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(hosts: int, gpus: int, window: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        end = int(time.time()) - 30
        n_series = openmetrics(root / "in.om", hosts, gpus, window + 30, end)
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics",
                        str(root / "in.om"), str(root / "tsdb")], check=True,
                       capture_output=True)
        (root / "prometheus.yml").write_text("global:\n  scrape_interval: 15s\n")
        port = free_port()
        prom = subprocess.Popen(
            ["prometheus", f"--config.file={root / 'prometheus.yml'}",
             f"--storage.tsdb.path={root / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
             "--storage.tsdb.retention.time=30d"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                try:
                    with urllib.request.urlopen(url + "/-/ready", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(0.1)
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "gpuwatch", "advise", "--prometheus", url, "--window",
                 str(window), "--format", "json"], capture_output=True, text=True, env=env,
                cwd=ROOT, check=False)
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
        finally:
            prom.terminate()
            prom.wait(10)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr)
        report = json.loads(proc.stdout)
        return {"hosts": hosts, "gpus": hosts * gpus, "series": n_series, "window_s": window,
                "wall_s": round(wall, 2),
                "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime
                               - before.ru_stime, 2),
                # ru_maxrss of children is the largest child so far: sizes run ascending
                "max_rss_mib": round(after.ru_maxrss / 1024, 1),
                "hosts_reported": len(report["hosts"]), "advice": len(report["advice"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="1,4,16", help="fleet sizes, comma-separated")
    ap.add_argument("--gpus", type=int, default=4, help="GPUs per host")
    ap.add_argument("--window", type=int, default=300, help="seconds of data and --window")
    ap.add_argument("--out", default=None, help="also write the rows as JSON here")
    args = ap.parse_args()
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        raise SystemExit("needs prometheus and promtool (apt-get install prometheus)")
    rows = [measure(int(n), args.gpus, args.window)
            for n in sorted(int(x) for x in args.hosts.split(","))]
    print("| hosts | GPUs | series | window | wall | CPU (advise) | peak RSS | advice |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['hosts']} | {r['gpus']} | {r['series']} | {r['window_s']} s | "
              f"{r['wall_s']} s | {r['cpu_s']} s | {r['max_rss_mib']} MiB | {r['advice']} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
