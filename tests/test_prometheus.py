"""The exporter against the real Prometheus tools: promtool's linter and a live server."""

from __future__ import annotations

import importlib.util
import subprocess

import pytest
from conftest import PROMTOOL, RECORDINGS, http_get
from prometheus_client import CollectorRegistry, generate_latest
from test_exporter import Advice, full_snapshot

from gpuwatch.serve.exporter import GpuwatchCollector

HAVE_REPLAY = importlib.util.find_spec("gpuwatch.trace.replay") is not None
needs_replay = pytest.mark.skipif(not HAVE_REPLAY, reason="gpuwatch.trace.replay not there yet")
needs_promtool = pytest.mark.skipif(PROMTOOL is None,
                                    reason="promtool is not installed (apt-get install prometheus)")


def promtool_check(text: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60, check=False)


def _lint(text: str) -> None:
    result = promtool_check(text)
    assert result.returncode == 0, result.stdout + result.stderr
    # promtool prints its lint findings (and exits 0 for some): there must be none
    assert result.stdout.strip() == "" and result.stderr.strip() == "", \
        result.stdout + result.stderr


@needs_promtool
def test_promtool_finds_nothing_in_a_live_daemons_output(gpuwatch_daemon):
    d = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0", "--interval", "0.2")
    d.wait_for_metric("gpuwatch_host_cpu_utilization_ratio")
    status, _, text = http_get(d.url + "/metrics")
    assert status == 200 and "gpuwatch_host_memory_total_bytes" in text
    _lint(text)
    assert d.stop() == 0


@needs_promtool
@needs_replay
def test_promtool_finds_nothing_in_a_replays_output(gpuwatch_daemon):
    recording = next(p for p in RECORDINGS if p.name == "tuned.jsonl")
    d = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0", "--replay", str(recording))
    d.wait_for_metric("gpuwatch_gpu_sm_active_ratio")
    status, _, text = http_get(d.url + "/metrics")
    assert status == 200 and "gpuwatch_gpu_clock_event_reason{" in text
    _lint(text)
    assert d.stop() == 0


@needs_promtool
def test_promtool_finds_nothing_in_every_family():
    # every family at once, including those no GPU-less machine can produce
    registry = CollectorRegistry()
    registry.register(GpuwatchCollector(full_snapshot, extra=(Advice(),)))
    text = generate_latest(registry).decode()
    assert "gpuwatch_train_steps_total{" in text and "gpuwatch_process_gpu_" in text
    _lint(text)


@needs_promtool
def test_promtool_would_catch_a_bad_name():
    # the check above is only worth something if promtool flags what it should
    result = promtool_check("# HELP gpu_util_percent x\n# TYPE gpu_util_percent counter\n"
                            "gpu_util_percent 5\n")
    assert result.stdout.strip() or result.stderr.strip() or result.returncode != 0


@pytest.mark.slow
def test_prometheus_scrapes_a_live_daemon(gpuwatch_daemon, prometheus):
    d = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0", "--interval", "0.2")
    target = d.url.removeprefix("http://")
    prom = prometheus([target])
    up = prom.wait_for('up{job="gpuwatch"} == 1')
    assert up[0]["metric"]["instance"] == target
    result = prom.wait_for("gpuwatch_host_memory_total_bytes")
    assert float(result[0]["value"][1]) > 0
    assert prom.wait_for("gpuwatch_up")[0]["value"][1] == "1"
    # scrapes are healthy: Prometheus saw no errors parsing our output
    targets = prom.api("targets")["activeTargets"]
    assert targets[0]["lastError"] == "", targets
    assert d.stop() == 0


@pytest.mark.slow
@needs_replay
def test_prometheus_stores_the_gpu_series_of_a_replay(gpuwatch_daemon, prometheus):
    recording = next(p for p in RECORDINGS if p.name == "tuned.jsonl")
    d = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0", "--replay", str(recording))
    prom = prometheus([d.url.removeprefix("http://")])
    util = prom.wait_for("gpuwatch_gpu_utilization_ratio")
    assert util[0]["metric"]["gpu"] == "0"
    assert 0 <= float(util[0]["value"][1]) <= 1
    for expr in ("gpuwatch_gpu_sm_active_ratio", "gpuwatch_gpu_memory_total_bytes",
                 'gpuwatch_gpu_clock_event_reason{reason="gpu_idle"}',
                 'gpuwatch_gpu_info{name="NVIDIA H200"}'):
        assert prom.wait_for(expr), expr
    assert d.stop() == 0
