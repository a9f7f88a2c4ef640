#!/usr/bin/env python3
"""What the fleet report costs: `gpuwatch advise --prometheus` over N hosts.

Run from the repository root (no GPU needed; needs Debian's prometheus and promtool):

    python3 benchmarks/bench_fleet.py --hosts 1,4,16 --gpus 4 --window 300
    python3 benchmarks/bench_fleet.py --hosts 32 --gpus 8 --window 3600 --scrape 5

For each fleet size it backfills a fresh Prometheus TSDB (promtool tsdb
create-blocks-from openmetrics) with N hosts of G GPUs, one sample per ``--scrape``
seconds (1 by default; 5 is what grafana/provisioning assumes) over the window: every
series the fleet report reads (GPU gauges from tests/data/input_bound.jsonl and
small_batch.jsonl, alternating per host and cycled, the host's CPU and memory, one hook
job per GPU with its rank), starts Prometheus on it and times `gpuwatch advise
--prometheus URL --window W --format json` in a fresh process: wall time, CPU time of the
advise process and its peak RSS, beside the number of series and the advice it gave.
Each host is queried and judged on its own, so the RSS should stay flat as N grows and
the time grow about linearly. The backfill's own time (writing the OpenMetrics file,
promtool) and Prometheus' RSS after answering are reported beside.

Prints a Markdown table; ``--out FILE`` writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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


def openmetrics(path: Path, hosts: int, gpus: int, window: int, end: int,
                scrape: int = 1) -> tuple[int, int]:
    """Write the fleet's series to ``path``, streamed (an hour of 32 hosts of 8 GPUs is
    millions of samples): each family's series one after another, each in time order.
    Returns (series, samples)."""
    recs = [(per_second(n, "gpu"), per_second(n, "host"), per_second(n, "step"))
            for n in ("input_bound", "small_batch")]
    times = [(i, end - window + i) for i in range(0, window, scrape)]
    series = samples = 0
    with open(path, "w", encoding="utf-8") as f:

        def family(name: str, rows: Any) -> None:
            nonlocal series, samples
            f.write(f"# TYPE {name} gauge\n")
            for labels, points in rows:
                series += 1
                lines = [f"{name}{{{labels}}} {v} {t}\n" for t, v in points]
                samples += len(lines)
                f.writelines(lines)

        def inst(h: int) -> str:
            return f'instance="gpu-{h + 1}:9442",job="gpuwatch"'

        def host_rows(value: Any) -> Any:
            for h in range(hosts):
                h_lines = recs[h % 2][1]
                yield inst(h), [(t, value(h_lines[i % len(h_lines)])) for i, t in times]

        family("gpuwatch_host_cpu_utilization_ratio", host_rows(
            lambda hl: sum(hl["cpu_util_per_core"]) / len(hl["cpu_util_per_core"])))
        family("gpuwatch_host_load1", host_rows(lambda hl: hl["load1"]))
        family("gpuwatch_host_memory_used_bytes", host_rows(lambda hl: hl["mem_used_bytes"]))

        def gpu_rows(field: str | None) -> Any:
            for h in range(hosts):
                g_lines = recs[h % 2][0]
                for g in range(gpus):
                    pts = [(t, 1 if field is None else g_lines[i % len(g_lines)].get(field))
                           for i, t in times]
                    pts = [(t, v) for t, v in pts if v is not None]
                    if pts:
                        yield f'{inst(h)},gpu="{g}",uuid="GPU-{h}-{g}"', pts

        for field, name in GPU.items():
            family(name, gpu_rows(field))
        family("gpuwatch_gpu_up", gpu_rows(None))

        def job_rows(value: Any) -> Any:
            for h in range(hosts):
                s_lines = recs[h % 2][2]
                for g in range(gpus):
                    job = f'{inst(h)},pid="{1000 + g}",rank="{h * gpus + g}",gpu="{g}"'
                    yield job, [(t, value(s_lines[i % len(s_lines)], i)) for i, t in times]

        family("gpuwatch_train_steps_total", job_rows(lambda sl, i: i + 1))
        family("gpuwatch_train_step_seconds",
               job_rows(lambda sl, i: sl.get("step_seconds") or 0.1))
        family("gpuwatch_train_data_wait_ratio", job_rows(
            lambda sl, i: (sl.get("data_wait_seconds") or 0.0) / (sl.get("step_seconds") or 1.0)))
        f.write("# EOF\n")
    return series, samples


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(hosts: int, gpus: int, window: int, scrape: int = 1) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        end = int(time.time()) - 30
        t0 = time.perf_counter()
        n_series, n_samples = openmetrics(root / "in.om", hosts, gpus, window + 30, end,
                                          scrape)
        om_bytes = (root / "in.om").stat().st_size
        t1 = time.perf_counter()
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics",
                        str(root / "in.om"), str(root / "tsdb")], check=True,
                       capture_output=True)
        backfill = {"write_s": round(t1 - t0, 1), "promtool_s": round(time.perf_counter() - t1, 1),
                    "openmetrics_mib": round(om_bytes / 2**20, 1)}
        (root / "in.om").unlink()
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
                [sys.executable, "-c", _ADVISE, "advise", "--prometheus", url, "--window",
                 str(window), "--format", "json"], capture_output=True, text=True, env=env,
                cwd=ROOT, check=False)
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            prom_rss = _rss_mib(prom.pid)
        finally:
            prom.terminate()
            prom.wait(10)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr)
        report = json.loads(proc.stdout)
        return {"hosts": hosts, "gpus": hosts * gpus, "series": n_series,
                "samples": n_samples, "scrape_s": scrape, "window_s": window,
                "backfill": backfill, "prometheus_rss_mib": prom_rss,
                "wall_s": round(wall, 2),
                "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime
                               - before.ru_stime, 2),
                "max_rss_mib": _peak_rss_mib(proc.stderr),
                "hosts_reported": len(report["hosts"]), "advice": len(report["advice"])}


# `python3 -m gpuwatch ARGS`, saying its own peak RSS on stderr as it exits (the children's
# ru_maxrss would be promtool's, the largest child so far)
_ADVISE = """
import atexit, resource, runpy, sys
atexit.register(lambda: print("PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                              file=sys.stderr))
sys.argv = ["gpuwatch", *sys.argv[1:]]
runpy.run_module("gpuwatch", run_name="__main__")
"""


def _peak_rss_mib(stderr: str) -> float | None:
    for line in stderr.splitlines():
        if line.startswith("PEAK_RSS_KB "):
            return round(int(line.split()[1]) / 1024, 1)
    return None


def _rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="1,4,16", help="fleet sizes, comma-separated")
    ap.add_argument("--gpus", type=int, default=4, help="GPUs per host")
    ap.add_argument("--window", type=int, default=300, help="seconds of data and --window")
    ap.add_argument("--scrape", type=int, default=1,
                    help="seconds between samples (Prometheus' scrape interval)")
    ap.add_argument("--out", default=None, help="also write the rows as JSON here")
    args = ap.parse_args()
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        raise SystemExit("needs prometheus and promtool (apt-get install prometheus)")
    rows = [measure(int(n), args.gpus, args.window, args.scrape)
            for n in sorted(int(x) for x in args.hosts.split(","))]
    print(f"## bench_fleet: {platform.node()}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    print("| hosts | GPUs | series | samples (every) | window | advise wall | CPU (advise) | "
          "peak RSS (advise) | Prometheus RSS | advice | backfill: file, write, promtool |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        b = r["backfill"]
        print(f"| {r['hosts']} | {r['gpus']} | {r['series']} | {r['samples']:,} "
              f"({r['scrape_s']} s) | {r['window_s']} s | {r['wall_s']} s | {r['cpu_s']} s | "
              f"{r['max_rss_mib']} MiB | {r['prometheus_rss_mib']} MiB | {r['advice']} | "
              f"{b['openmetrics_mib']} MiB, {b['write_s']} s, {b['promtool_s']} s |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
