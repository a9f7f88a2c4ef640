"""`gpuwatch advise --prometheus`: a real Prometheus server holding gpuwatch_* series
(backfilled with promtool from a recording, as if scraped), queried and judged per
instance and GPU with the same rules."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
from test_advise_support import SIX, load, run_cli

pytestmark = pytest.mark.skipif(not (shutil.which("prometheus") and shutil.which("promtool")),
                                reason="needs prometheus and promtool")

# trace field -> exported series (docs/metrics.md)
GPU = {"util": "gpuwatch_gpu_utilization_ratio", "mem_used_bytes": "gpuwatch_gpu_memory_used_bytes",
       "mem_total_bytes": "gpuwatch_gpu_memory_total_bytes",
       "power_watts": "gpuwatch_gpu_power_watts", "sm_active": "gpuwatch_gpu_sm_active_ratio",
       "tensor_active": "gpuwatch_gpu_tensor_active_ratio",
       "fp32_active": "gpuwatch_gpu_fp32_active_ratio"}
HOST = {"load1": "gpuwatch_host_load1"}


def after_the_run(lines: list[dict], seconds: int) -> list[dict]:
    """What the daemon keeps reporting once the job has exited: an idle GPU, no job."""
    last_gpu = next(d for d in reversed(lines) if d["kind"] == "gpu")
    last_host = next(d for d in reversed(lines) if d["kind"] == "host")
    tail = []
    for i in range(1, seconds):
        t = lines[-1]["t"] + i
        tail.append(dict(last_gpu, t=t, util=0.0, sm_active=0.0, tensor_active=0.0,
                         fp32_active=0.0, mem_used_bytes=600_000_000, processes=[]))
        tail.append(dict(last_host, t=t, cpu_util_per_core=[0.0] * 16, job_cpu_cores=0,
                         job_processes=0))
    return lines + tail


def openmetrics(lines: list[dict], end: float, instance: str, gpus: int = 1) -> str:
    """A recording as OpenMetrics samples, shifted to end at ``end`` and followed by ten
    idle minutes, thinned to 1 Hz."""
    shift = end - lines[-1]["t"]
    lines = after_the_run(lines, 600)
    series: dict[str, list[str]] = defaultdict(list)
    last_second: dict[str, int] = {}
    for d in lines[1:]:
        t = d["t"] + shift
        sec = int(t)
        if last_second.get(d["kind"]) == sec:
            continue
        last_second[d["kind"]] = sec
        if d["kind"] == "gpu":
            for g in range(gpus):
                lab = f'instance="{instance}",job="gpuwatch",gpu="{g}",uuid=""'
                for field, name in GPU.items():
                    if d.get(field) is not None:
                        series[name].append(f"{name}{{{lab}}} {d[field]} {t:.3f}")
                for p in d["processes"]:
                    name = "gpuwatch_process_gpu_memory_used_bytes"
                    series[name].append(f'{name}{{{lab},pid="{p["pid"] + g}"}} '
                                        f'{p["mem_used_bytes"]} {t:.3f}')
                name = "gpuwatch_gpu_info"
                series[name].append(f'{name}{{{lab},name="NVIDIA H200",compute_capability="9.0"}}'
                                    f" 1 {t:.3f}")
        elif d["kind"] == "host":
            lab = f'instance="{instance}",job="gpuwatch"'
            cores = d["cpu_util_per_core"]
            name = "gpuwatch_host_cpu_utilization_ratio"
            series[name].append(f"{name}{{{lab}}} {sum(cores) / len(cores)} {t:.3f}")
            name = "gpuwatch_host_cpu_core_utilization_ratio"
            for i, c in enumerate(cores):
                series[name].append(f'{name}{{{lab},core="{i}"}} {c} {t:.3f}')
            for field, name in HOST.items():
                series[name].append(f"{name}{{{lab}}} {d[field]} {t:.3f}")
            jl = f'{lab},pid="1000",name="python3",user="u"'
            for field in ("job_cpu_cores", "job_processes"):
                name = f"gpuwatch_{field}"
                series[name].append(f"{name}{{{jl}}} {d[field]} {t:.3f}")
    out = []
    for name, samples in series.items():
        out.append(f"# TYPE {name} gauge")
        # one series' samples must be in time order and a family's samples together
        out.extend(sorted(samples, key=lambda s: (s.rsplit("{", 1)[0], s.split("} ")[0],
                                                  float(s.rsplit(" ", 1)[1]))))
    out.append("# EOF")
    return "\n".join(out) + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def prometheus(tmp_path: Path):
    """Start a Prometheus on a TSDB backfilled by the test; yields (load, url)."""
    procs = []
    data = tmp_path / "tsdb"

    def start(om_text: str) -> str:
        src = tmp_path / "in.om"
        src.write_text(om_text)
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(src),
                        str(data)], check=True, capture_output=True)
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 15s\n")
        port = free_port()
        procs.append(subprocess.Popen(
            ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={data}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=30d"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return url
            except OSError:
                time.sleep(0.1)
        raise AssertionError("prometheus did not become ready")

    yield start
    for p in procs:
        p.terminate()
        p.wait(timeout=10)


def test_fleet_advice_per_instance_and_gpu(prometheus):
    end = time.time() - 30
    text = (openmetrics(load("input_bound"), end, "node-a:9442")
            + openmetrics(load("fp32"), end, "node-b:9442", gpus=2)).replace("# EOF\n", "", 1)
    url = prometheus(text)
    proc = run_cli("advise", "--prometheus", url, "--window", "600", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    got = {(a["instance"], a["gpu"], a["id"]) for a in report["advice"] if a["id"] in SIX}
    assert got == {("node-a:9442", 0, "add-dataloader-workers"),
                   ("node-b:9442", 0, "enable-mixed-precision"),
                   ("node-b:9442", 1, "enable-mixed-precision")}
    assert {(g["instance"], g["gpu"]) for g in report["gpus"]} == {
        ("node-a:9442", 0), ("node-b:9442", 0), ("node-b:9442", 1)}
    assert report["source"]["kind"] == "prometheus"
    # the text report names the instance
    text_out = run_cli("advise", "--prometheus", url, "--window", "600")
    assert "node-b:9442 GPU 1" in text_out.stdout


def test_prometheus_without_gpuwatch_series(prometheus):
    url = prometheus(f"# TYPE other gauge\nother 1 {int(time.time() - 60)}\n# EOF\n")
    proc = run_cli("advise", "--prometheus", url, "--window", "300")
    assert proc.returncode == 2 and "no gpuwatch_* series" in proc.stderr


def test_prometheus_not_answering():
    proc = run_cli("advise", "--prometheus", "http://127.0.0.1:9", "--window", "60")
    assert proc.returncode == 2 and "nothing answers" in proc.stderr
