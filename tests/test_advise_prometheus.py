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


def ranks_openmetrics(end: float, ranks: list[dict], seconds: int = 120) -> str:
    """Hook series of one job's ranks on several hosts, 1 Hz for ``seconds`` until ``end``:
    each rank dict gives instance, rank, pid, data wait and (optionally) its step-time
    shares by category."""
    fams: dict[str, list[str]] = defaultdict(list)
    for r in ranks:
        lab = (f'instance="{r["instance"]}",job="gpuwatch",pid="{r["pid"]}",rank="{r["rank"]}",'
               f'gpu="{r.get("gpu", 0)}"')
        for i in range(seconds):
            t = end - seconds + i
            fams["gpuwatch_train_steps_total"].append(
                f"gpuwatch_train_steps_total{{{lab}}} {2 * i} {t:.3f}")
            fams["gpuwatch_train_step_seconds"].append(
                f"gpuwatch_train_step_seconds{{{lab}}} 0.5 {t:.3f}")
            fams["gpuwatch_train_data_wait_ratio"].append(
                f"gpuwatch_train_data_wait_ratio{{{lab}}} {r['wait']} {t:.3f}")
            for cat, share in r.get("shares", {}).items():
                fams["gpuwatch_train_time_share_ratio"].append(
                    f'gpuwatch_train_time_share_ratio{{{lab},category="{cat}"}} {share} '
                    f"{t:.3f}")
    out = []
    for name, samples in fams.items():
        out.append(f"# TYPE {name} gauge")
        out.extend(samples)
    out.append("# EOF")
    return "\n".join(out) + "\n"


def test_ranks_of_one_job_compared_across_hosts(prometheus):
    """Ranks 0 and 2 on node-a wait half of each step for ranks 1 and 3 on node-b, which
    are starved for data: the fleet report scores every rank and names the slowest (rank 1
    on node-b) as the straggler."""
    end = time.time() - 30
    waiting = {"data": 0.02, "sync": 0.5, "gpu": 0.4, "host": 0.05, "other": 0.03}
    url = prometheus(ranks_openmetrics(end, [
        {"instance": "node-a:9442", "rank": 0, "pid": 100, "wait": 0.02, "shares": waiting},
        {"instance": "node-a:9442", "rank": 2, "pid": 102, "wait": 0.02, "shares": waiting,
         "gpu": 1},
        {"instance": "node-b:9442", "rank": 1, "pid": 200, "wait": 0.45,
         "shares": {"data": 0.45, "sync": 0.0, "gpu": 0.45, "host": 0.05, "other": 0.05}},
        {"instance": "node-b:9442", "rank": 3, "pid": 203, "wait": 0.45, "gpu": 1,
         "shares": {"data": 0.45, "sync": 0.0, "gpu": 0.45, "host": 0.05, "other": 0.05}},
    ]))
    proc = run_cli("advise", "--prometheus", url, "--window", "300", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    jobs = {(h["instance"], j["rank"], j["pid"], j["gpu"]) for h in report["hosts"]
            for j in h["jobs"]}
    assert jobs == {("node-a:9442", 0, 100, 0), ("node-a:9442", 2, 102, 1),
                    ("node-b:9442", 1, 200, 0), ("node-b:9442", 3, 203, 1)}
    block = report["ranks"]
    assert block["basis"] == "own_time"
    assert [(r["rank"], r["instance"], r["own_seconds"], r["rank_score"])
            for r in block["ranks"]] == [(0, "node-a:9442", 0.25, 1.0),
                                         (1, "node-b:9442", 0.5, 0.5),
                                         (2, "node-a:9442", 0.25, 1.0),
                                         (3, "node-b:9442", 0.5, 0.5)]
    s = block["straggler"]
    assert (s["instance"], s["rank"], s["pid"], s["rank_score"],
            s["speedup_at_median_pace"]) == ("node-b:9442", 1, 200, 0.5, 2.0)
    text = run_cli("advise", "--prometheus", url, "--window", "300").stdout
    assert "Straggler: rank 1 on node-b:9442 (GPU 0)" in text
    # narrowed to one host there is nothing to compare across hosts
    one = run_cli("advise", "--prometheus", url, "--window", "300", "--format", "json",
                  "--match", 'instance="node-a:9442"')
    assert json.loads(one.stdout)["ranks"] is None


def test_ranks_one_per_host_and_of_several_jobs(prometheus):
    """One rank per host: no daemon sees whom its rank waits for (sync 0 everywhere), so
    the ranks are compared by what they lose on their own; a third host's rank 0 belongs
    to another job and makes the comparison refuse until --match narrows it."""
    end = time.time() - 30
    busy = {"data": 0.02, "sync": 0.0, "gpu": 0.9, "host": 0.05, "other": 0.03}
    url = prometheus(ranks_openmetrics(end, [
        {"instance": "node-a:9442", "rank": 0, "pid": 100, "wait": 0.02, "shares": busy},
        {"instance": "node-b:9442", "rank": 1, "pid": 200, "wait": 0.40,
         "shares": {"data": 0.40, "sync": 0.0, "gpu": 0.4, "host": 0.15, "other": 0.05}},
        {"instance": "node-c:9442", "rank": 0, "pid": 300, "wait": 0.0, "shares": busy},
        # a job whose daemons export no breakdown: data wait only
        {"instance": "node-d:9442", "rank": 0, "pid": 400, "wait": 0.01},
        {"instance": "node-e:9442", "rank": 1, "pid": 500, "wait": 0.5},
        # a balanced twin of node-b
        {"instance": "node-f:9442", "rank": 1, "pid": 600, "wait": 0.02, "shares": busy},
    ]))

    def ranks(*match: str) -> dict:
        proc = run_cli("advise", "--prometheus", url, "--window", "300", "--format", "json",
                       *match)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["ranks"]

    block = ranks()
    assert block["straggler"] is None and "several jobs" in block["note"]
    block = ranks("--match", 'instance=~"node-(a|b):9442"')
    assert block["basis"] == "stall" and "data wait + host" in block["note"]
    s = block["straggler"]
    assert (s["instance"], s["rank"], s["stall_ratio"], s["others_stall_ratio"]) == (
        "node-b:9442", 1, 0.55, 0.07)
    block = ranks("--match", 'instance=~"node-(d|e):9442"')
    assert "data wait only" in block["note"]
    s = block["straggler"]
    assert (s["instance"], s["rank"], s["stall_ratio"]) == ("node-e:9442", 1, 0.5)
    # ranks that lose about the same: compared, no straggler
    block = ranks("--match", 'instance=~"node-(a|f):9442"')
    assert [r["rank"] for r in block["ranks"]] == [0, 1] and block["straggler"] is None
    text = run_cli("advise", "--prometheus", url, "--window", "300", "--match",
                   'instance=~"node-(a|b):9442"').stdout
    assert "Straggler: rank 1 on node-b:9442 (GPU 0): it loses 55 % of each step" in text


def test_fleet_lists_a_lost_gpu_and_renders_per_host(prometheus):
    """A GPU seen only as lost (gpuwatch_gpu_up 0, no other series) is still listed under
    its host; the Markdown report has a section per host."""
    end = time.time() - 30
    text = openmetrics(load("input_bound"), end, "node-a:9442")
    lost = [f'gpuwatch_gpu_up{{instance="node-a:9442",job="gpuwatch",gpu="{g}",uuid=""}} '
            f"{v} {end - 60 + i:.3f}" for g, v in ((0, 1), (1, 0)) for i in range(60)]
    text = text.replace("# EOF\n", "# TYPE gpuwatch_gpu_up gauge\n" + "\n".join(lost)
                        + "\n# EOF\n")
    url = prometheus(text)
    proc = run_cli("advise", "--prometheus", url, "--window", "600", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    (host,) = json.loads(proc.stdout)["hosts"]
    assert [(g["gpu"], g["up"]) for g in host["gpus"]] == [(0, True), (1, False)]
    out = run_cli("advise", "--prometheus", url, "--window", "600").stdout
    assert "== node-a:9442: 2 GPU(s), lost: GPU 1 ==" in out
    md = run_cli("advise", "--prometheus", url, "--window", "600", "--format", "markdown")
    assert md.returncode == 0, md.stderr
    assert md.stdout.startswith("# gpuwatch fleet advice: Prometheus ")
    assert "\n## node-a:9442: 2 GPU(s), lost: GPU 1\n" in md.stdout
    assert "add-dataloader-workers" in md.stdout
