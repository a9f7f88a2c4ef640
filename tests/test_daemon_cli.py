"""`gpuwatch run` as a user runs it: flags, config files, HTTP, signals, replays."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest
from conftest import (
    GPU_RECORDINGS,
    NVML_GPUS,
    RECORDINGS,
    http_get,
    names_of,
    parse_metrics,
    read_recording,
    recording_name,
    run_gpuwatch,
)
from prometheus_client import CollectorRegistry

from gpuwatch.errors import FileFormatError, UserError
from gpuwatch.samples import GpuInfo, GpuProcess, GpuSample, HostSample, JobTree, Snapshot
from gpuwatch.serve.config import Config, config_from_args, load_config, parse_listen_address
from gpuwatch.serve.httpserver import HttpServer, snapshot_from_dict, snapshot_to_dict

HAVE_REPLAY = importlib.util.find_spec("gpuwatch.trace.replay") is not None
needs_replay = pytest.mark.skipif(not HAVE_REPLAY, reason="gpuwatch.trace.replay not there yet")

GPU_SERIES = ("gpuwatch_gpu_utilization_ratio", "gpuwatch_gpu_sm_active_ratio",
              "gpuwatch_gpu_memory_used_bytes", "gpuwatch_gpu_power_watts",
              "gpuwatch_gpu_clock_event_reason", "gpuwatch_gpu_info")


# -- live sampling -------------------------------------------------------------------

def test_run_serves_host_metrics_and_the_apis(gpuwatch_daemon):
    d = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0", "--interval", "0.2")
    assert d.url.startswith("http://127.0.0.1:") and not d.url.endswith(":0")
    # CPU use needs two readings, so it comes a tick after the rest
    m = d.wait_for_metric("gpuwatch_host_cpu_utilization_ratio")
    assert m[("gpuwatch_up", frozenset())] == 1
    assert m[("gpuwatch_host_memory_total_bytes", frozenset())] > 0
    assert 0 <= m[("gpuwatch_host_cpu_utilization_ratio", frozenset())] <= 1
    assert "gpuwatch_host_cpu_core_utilization_ratio" in names_of(m)
    assert m[("gpuwatch_nvml_up", frozenset())] == (1 if NVML_GPUS else 0)

    status, ctype, body = http_get(d.url + "/api/snapshot")
    assert status == 200 and ctype == "application/json"
    snap = snapshot_from_dict(json.loads(body))
    assert snap.host is not None and snap.host.mem_total_bytes > 0
    assert snap.nvml_available == bool(NVML_GPUS)

    status, _, body = http_get(d.url + "/healthz")
    assert status == 200 and body.startswith("ok")
    status, ctype, body = http_get(d.url + "/")
    assert status == 200 and "text/html" in ctype and 'href="/metrics"' in body
    status, ctype, body = http_get(d.url + "/nope")
    assert status == 404 and "error" in json.loads(body)
    status, _, body = http_get(d.url + "/api/advice")
    # 200 with the advisor's report once it is built, a JSON 503 until then
    assert status in (200, 503)
    assert isinstance(json.loads(body), dict)

    assert d.stop() == 0
    assert "Traceback" not in d.stderr()


@pytest.mark.skipif(NVML_GPUS > 0, reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_once_and_keeps_serving(gpuwatch_daemon):
    d = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0", "--interval", "0.1")
    first = d.wait_for_metric("gpuwatch_ticks_total")[("gpuwatch_ticks_total", frozenset())]
    d.wait_for_metric("gpuwatch_host_load1")

    def ticked_more():
        ticks = d.metrics()[("gpuwatch_ticks_total", frozenset())]
        return ticks >= first + 5

    from conftest import wait_for
    wait_for(ticked_more, "five more ticks", proc=d.proc)
    assert not any(name.startswith("gpuwatch_gpu_") for name in names_of(d.metrics()))
    assert d.stop() == 0
    said = [line for line in d.lines if "no NVIDIA GPU" in line or "found no GPU" in line]
    assert len(said) == 1, d.stderr()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_shut_down_cleanly(gpuwatch_daemon, sig):
    d = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0")
    port = int(d.url.rsplit(":", 1)[1])
    assert d.stop(sig) == 0
    assert "Traceback" not in d.stderr()
    # the port is free again
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_config_file_is_used_and_flags_override_it(gpuwatch_daemon, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        cfg = tmp_path / "gpuwatch.yaml"
        cfg.write_text(f'listen_address: "127.0.0.1:{taken}"\ninterval: 0.2\n')
        # the file's address is taken: only the flag's makes this start
        d = gpuwatch_daemon("--config.file", str(cfg), "--web.listen-address", "127.0.0.1:0")
        d.wait_for_metric("gpuwatch_host_load1")
        assert d.stop() == 0


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 here")
def test_ipv6_listen_address(gpuwatch_daemon):
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    d = gpuwatch_daemon("--web.listen-address", "[::1]:0")
    assert d.url.startswith("http://[::1]:")
    assert http_get(d.url + "/healthz")[0] == 200
    assert d.stop() == 0


# -- bad input: exit 2 with a message that says what is wrong ------------------------

@pytest.mark.parametrize(("args", "expected"), [
    (["--interval", "0.05"], ["--interval", "0.1", "60", "0.05"]),
    (["--interval", "fast"], ["--interval", "'fast'"]),
    (["--web.listen-address", "nonsense"], ["'nonsense'", "HOST:PORT"]),
    (["--web.listen-address", "127.0.0.1:70000"], ["70000", "0 to 65535"]),
    (["--web.listen-address", "::1:9442"], ["[::1]:9442"]),
    (["--web.listen-address", "no-such-host.invalid:0"], ["cannot listen on",
                                                          "no-such-host.invalid"]),
    (["--config.file", "/nonexistent/gpuwatch.yaml"], ["/nonexistent/gpuwatch.yaml"]),
    (["--replay", "/nonexistent/trace.jsonl"], ["/nonexistent/trace.jsonl"]),
    (["--demo", "--replay", "x.jsonl"], ["--demo", "--replay"]),
    # a flag is honoured or refused, never dropped
    (["--demo", "--", "true"], ["--demo", "cannot watch a command"]),
    (["--replay", "x.jsonl", "--", "true"], ["--replay", "cannot watch a command"]),
    # named as the user wrote it, after the subcommand's own --log.level
    (["--log.level", "debug", "--web.listen-address", "nonsense", "--", "true"],
     ["--web.listen-address: bad listen address 'nonsense'"]),
])
def test_bad_flags_exit_2_with_a_clear_message(tmp_path, args, expected):
    result = run_gpuwatch(["run", *args], tmp_path)
    assert result.returncode == 2, result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_port_in_use_names_the_address(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_gpuwatch(["run", "--web.listen-address", f"127.0.0.1:{port}"], tmp_path)
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "in use" in result.stderr


def test_bad_config_file_reports_every_problem_with_its_line(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(
        "# gpuwatch settings\n"
        "interval: 0.01\n"
        "listen_adress: ':9442'\n"
        "rules_dirs: /etc/gpuwatch/rules\n"
        "history_seconds: 900\n"
        "slow_interval: yes\n"
    )
    result = run_gpuwatch(["run", "--config.file", str(cfg)], tmp_path)
    assert result.returncode == 2
    err = result.stderr
    assert f"{cfg}:2: interval: must be between 0.1 and 60 seconds, got 0.01" in err
    assert f"{cfg}:3: unknown key 'listen_adress' (did you mean listen_address?)" in err
    assert f"{cfg}:4: rules_dirs: expected a list of directories" in err
    assert f"{cfg}:6: slow_interval: expected seconds as a number" in err
    assert f"{cfg}:5" not in err


def test_a_huge_integer_in_the_config_is_a_clear_error(tmp_path):
    cfg = tmp_path / "huge.yaml"
    cfg.write_text("interval: " + "9" * 400 + "\n")
    result = run_gpuwatch(["run", "--config.file", str(cfg)], tmp_path)
    assert result.returncode == 2
    assert f"{cfg}:1: interval: must be between 0.1 and 60 seconds" in result.stderr
    assert "Traceback" not in result.stderr


def test_unparsable_config_file_points_at_the_line(tmp_path):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("interval: 1\nrules_dirs: [a, b\nrecord: x\n")
    result = run_gpuwatch(["run", "--config.file", str(cfg)], tmp_path)
    assert result.returncode == 2
    assert f"{cfg}:3: not valid YAML" in result.stderr


# -- replays -------------------------------------------------------------------------

@needs_replay
@pytest.mark.slow
@pytest.mark.parametrize("recording", GPU_RECORDINGS,
                         ids=[recording_name(p) for p in GPU_RECORDINGS])
def test_replay_serves_the_gpu_series(gpuwatch_daemon, recording):
    d = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0", "--replay", str(recording))
    m = d.wait_for_metric("gpuwatch_gpu_sm_active_ratio")
    for name in GPU_SERIES:
        assert name in names_of(m), name
    labels = frozenset({"gpu": "0", "uuid": _uuid(m)}.items())
    assert 0 <= m[("gpuwatch_gpu_utilization_ratio", labels)] <= 1
    lines = [json.loads(x) for x in read_recording(recording).splitlines()[:50]]
    meta = lines[0]
    first = next(d for d in lines if d["kind"] == "gpu" and d["gpu"] == 0)
    assert m[("gpuwatch_gpu_memory_total_bytes", labels)] == first["mem_total_bytes"]
    info = [k for k in m if k[0] == "gpuwatch_gpu_info"]
    assert dict(info[0][1])["name"] == meta["gpu_name"]
    assert d.stop() == 0


def _uuid(samples: dict) -> str:
    for name, labels in samples:
        if name == "gpuwatch_gpu_up":
            return dict(labels)["uuid"]
    raise AssertionError("no gpuwatch_gpu_up")


@needs_replay
@pytest.mark.slow
def test_two_replays_side_by_side(gpuwatch_daemon):
    by_name = {recording_name(p): p for p in RECORDINGS}
    a = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0", "--replay",
                        str(by_name["tuned"]))
    b = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0", "--replay",
                        str(by_name["idle"]))
    assert a.url != b.url
    ma = a.wait_for_metric("gpuwatch_gpu_utilization_ratio")
    mb = b.wait_for_metric("gpuwatch_gpu_utilization_ratio")
    assert "gpuwatch_gpu_utilization_ratio" in names_of(ma) and names_of(mb)
    assert a.stop() == 0 and b.stop() == 0


@needs_replay
def test_demo_needs_no_gpu(gpuwatch_daemon):
    d = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0", "--demo")
    assert "replaying the bundled demo recording" in d.stderr()
    d.wait_for_metric("gpuwatch_gpu_utilization_ratio")
    assert d.stop() == 0


# -- the pieces behind the CLI -------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:9442", ("127.0.0.1", 9442)),
    (":9442", ("", 9442)),
    ("localhost:0", ("localhost", 0)),
    ("[::1]:9442", ("::1", 9442)),
    ("[::]:80", ("::", 80)),
])
def test_parse_listen_address(text, expected):
    assert parse_listen_address(text) == expected


@pytest.mark.parametrize("text", ["9442", "host:", "host:-1", "[::1]9442", "[nope]:1", "a b:1"])
def test_parse_listen_address_rejects(text):
    with pytest.raises(UserError, match="expected|port|IPv6|bracket"):
        parse_listen_address(text)


def test_config_from_args_flags_win_over_the_file(tmp_path):
    cfg = tmp_path / "c.yaml"
    rules = tmp_path / "a"
    rules.mkdir()
    cfg.write_text(f"interval: 2\nslow_interval: 20\nrules_dirs: [{rules}]\n"
                   "record: /tmp/x.jsonl\nhook_socket: /tmp/h.sock\nhistory_seconds: 60\n")
    assert load_config(str(cfg)) == Config(interval=2.0, slow_interval=20.0,
                                           rules_dirs=(str(rules),),
                                           record="/tmp/x.jsonl", hook_socket="/tmp/h.sock",
                                           history_seconds=60.0)
    args = Namespace(config_file=str(cfg), interval=0.5, listen_address=":9000", record=None)
    config = config_from_args(args)
    assert config.interval == 0.5 and config.listen_address == ":9000"
    assert config.record == "/tmp/x.jsonl" and config.slow_interval == 20.0
    with pytest.raises(UserError, match="slow_interval"):
        config_from_args(Namespace(config_file=str(cfg), interval=30.0))


def test_empty_config_file_means_defaults(tmp_path):
    cfg = tmp_path / "empty.yaml"
    cfg.write_text("# nothing set\n")
    assert load_config(str(cfg)) == Config()


def test_config_duplicate_keys_and_a_list_at_the_top(tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text("interval: 1\ninterval: 0\n")
    with pytest.raises(FileFormatError) as err:
        load_config(str(dup))
    assert err.value.problems == [(2, "interval: given twice (first on line 1)")]
    top = tmp_path / "top.yaml"
    top.write_text("- interval: 1\n")
    with pytest.raises(FileFormatError, match=r"top.yaml:1: expected a mapping"):
        load_config(str(top))


def test_snapshot_json_round_trips():
    snap = Snapshot(
        t=5.0,
        gpus=(GpuSample(t=5.0, gpu=0, uuid="GPU-x", util=0.5, xid_total={13: 1},
                        processes=(GpuProcess(pid=1, mem_used_bytes=2, name="p"),)),),
        infos=(GpuInfo(gpu=0, uuid="GPU-x", compute_capability=(9, 0)),),
        host=HostSample(t=5.0, cpu_util_per_core=(0.5,), jobs=(JobTree(pid=1),)),
    )
    data = json.loads(json.dumps(snapshot_to_dict(snap)))
    assert snapshot_from_dict(data) == snap


def _serve(advice):
    server = HttpServer("127.0.0.1:0", registry=CollectorRegistry(), advice=advice)
    server.start()
    return server


def test_api_advice_503_without_an_advisor_and_200_with_one():
    server = _serve(None)
    try:
        status, ctype, body = http_get(server.url + "/api/advice")
        assert status == 503 and ctype == "application/json"
        assert "advisor" in json.loads(body)["error"]
    finally:
        server.stop()
    server = _serve(lambda: {"advice": [{"rule": "small_batch"}]})
    try:
        status, _, body = http_get(server.url + "/api/advice")
        assert status == 200 and json.loads(body) == {"advice": [{"rule": "small_batch"}]}
    finally:
        server.stop()


def test_api_advice_reports_a_failing_advisor_as_503():
    def broken():
        raise RuntimeError("rules exploded")

    server = _serve(broken)
    try:
        status, _, body = http_get(server.url + "/api/advice")
        assert status == 503 and "rules exploded" in json.loads(body)["error"]
        # and the server keeps serving
        assert http_get(server.url + "/metrics")[0] == 200
    finally:
        server.stop()


def test_json_apis_serve_non_finite_numbers_as_null():
    from gpuwatch.samples import JobStats

    snap = Snapshot(t=5.0, jobs=(JobStats(pid=1, samples_per_second=float("inf")),),
                    host=HostSample(t=5.0, load1=float("-inf")))
    server = HttpServer("127.0.0.1:0", registry=CollectorRegistry(), snapshot=lambda: snap,
                        advice=lambda: {"advice": [{"value": float("nan")},
                                                   {"value": float("inf")}]})
    server.start()
    try:
        status, _, body = http_get(server.url + "/api/snapshot")
        assert status == 200, body
        data = json.loads(body)
        assert data["jobs"][0]["samples_per_second"] is None and data["host"]["load1"] is None
        status, _, body = http_get(server.url + "/api/advice")
        assert status == 200, body
        assert json.loads(body) == {"advice": [{"value": None}, {"value": None}]}
    finally:
        server.stop()


def test_metrics_gzip_when_asked():
    import gzip
    import urllib.request

    server = HttpServer("127.0.0.1:0", registry=CollectorRegistry())
    server.start()
    try:
        req = urllib.request.Request(server.url + "/metrics",
                                     headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.headers["Content-Encoding"] == "gzip"
            text = gzip.decompress(resp.read()).decode()
        assert isinstance(parse_metrics(text), dict)
    finally:
        server.stop()


def test_cli_help_lists_run_flags(tmp_path):
    result = run_gpuwatch(["run", "--help"], tmp_path)
    assert result.returncode == 0
    for flag in ("--web.listen-address", "--config.file", "--interval", "--replay", "--demo"):
        assert flag in result.stdout


def test_module_runs_without_torch_imported(tmp_path):
    # the daemon must never import torch: check what `gpuwatch run`'s modules pull in
    code = ("import sys, gpuwatch.daemon, gpuwatch.serve.exporter, gpuwatch.serve.httpserver; "
            "print('torch' in sys.modules)")
    out = subprocess.run([__import__("sys").executable, "-c", code], capture_output=True,
                         text=True, check=True, cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "False"


# -- the hook socket -----------------------------------------------------------------

HAVE_RECEIVER = importlib.util.find_spec("gpuwatch.job.receiver") is not None
needs_receiver = pytest.mark.skipif(not HAVE_RECEIVER, reason="gpuwatch.job.receiver not there yet")
HOOK = re.compile(r"serving http.*; hook socket (\S+)")


@needs_receiver
def test_hook_datagrams_become_training_series(gpuwatch_daemon, tmp_path):
    from gpuwatch.job import protocol

    d = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0", "--interval", "0.2")
    path = HOOK.search(d.stderr()).group(1)
    # without a configured socket, a private one under $XDG_RUNTIME_DIR
    assert path == str(tmp_path / "runtime" / "gpuwatch" / "hook.sock")
    assert stat.S_ISSOCK(os.stat(path).st_mode)
    pid = os.getpid()
    report = protocol.encode({
        "kind": "report", "pid": pid, "seq": 1, "t": time.time(), "rank": 0, "gpu": 0,
        "steps_total": 40, "skipped_total": 2,
        "window": {"steps": 40, "skipped": 2, "timed": 40, "step_seconds": 4.0,
                   "data_wait_seconds": 0.4, "samples": 2560, "sample_seconds": 4.0},
        "loss_scale": 32768.0,
    })
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(report, path)
        s.sendto(b"this is not json", path)
    labels = frozenset({"pid": str(pid), "rank": "0", "gpu": "0"}.items())

    def steps():
        m = d.metrics()
        dropped = m.get(("gpuwatch_hook_messages_dropped_total",
                         frozenset({"reason": "malformed"}.items())))
        return m if ("gpuwatch_train_steps_total", labels) in m and dropped else None

    from conftest import wait_for
    m = wait_for(steps, "the hook's report in /metrics", proc=d.proc)
    assert m[("gpuwatch_train_steps_total", labels)] == 40
    assert m[("gpuwatch_train_skipped_steps_total", labels)] == 2
    assert m[("gpuwatch_train_up", labels)] == 1
    assert m[("gpuwatch_hook_messages_total", frozenset())] >= 1
    assert d.stop() == 0
    assert not os.path.exists(path)  # cleaned up on the way out


@needs_receiver
def test_a_second_daemon_takes_its_own_hook_socket(gpuwatch_daemon, tmp_path):
    a = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0")
    b = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0")
    path_a = HOOK.search(a.stderr()).group(1)
    path_b = HOOK.search(b.stderr()).group(1)
    assert path_a != path_b
    assert path_b == str(tmp_path / "runtime" / "gpuwatch" / f"hook-{b.proc.pid}.sock")
    assert a.stop() == 0 and b.stop() == 0


@needs_receiver
def test_configured_hook_socket_in_use_is_an_error(gpuwatch_daemon, tmp_path):
    a = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0")
    path = HOOK.search(a.stderr()).group(1)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"hook_socket: {path}\nlisten_address: 127.0.0.1:0\n")
    result = run_gpuwatch(["run", "--config.file", str(cfg)], tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"cannot open the hook socket {path}" in result.stderr
    assert a.stop() == 0


@needs_replay
def test_replay_opens_no_hook_socket(gpuwatch_daemon, tmp_path):
    d = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0", "--demo")
    assert "hook socket" not in d.stderr()
    assert not (tmp_path / "runtime" / "gpuwatch").exists()
    assert d.stop() == 0


HAVE_RECORDER = importlib.util.find_spec("gpuwatch.trace.record") is not None


@pytest.mark.skipif(not HAVE_RECORDER, reason="gpuwatch.trace.record not there yet")
def test_run_record_writes_a_trace_while_serving(gpuwatch_daemon, tmp_path):
    out = tmp_path / "run.jsonl"
    d = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0", "--interval", "0.2",
                        "--record", str(out))
    d.wait_for_metric("gpuwatch_host_cpu_utilization_ratio")
    from conftest import wait_for
    wait_for(lambda: out.exists() and out.read_text().count('"kind":"host"') +
             out.read_text().count('"kind": "host"') >= 2, "two host lines in the recording",
             proc=d.proc)
    assert d.stop() == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["kind"] == "meta" and lines[0]["format"] == "gpuwatch-trace/1"
    assert lines[0]["sample_hz"] == 5
    hosts = [line for line in lines if line["kind"] == "host"]
    assert hosts and all(h["mem_total_bytes"] > 0 for h in hosts)
    times = [line["t"] for line in lines[1:]]
    assert times == sorted(times)


@needs_replay
def test_replay_of_a_broken_recording_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind":"meta","format":"gpuwatch-trace/1"}\n'
                   '{"t":1,"kind":"gpu","gpu":0,"util":7}\n')
    result = run_gpuwatch(["run", "--replay", str(bad), "--web.listen-address", "127.0.0.1:0"],
                          tmp_path)
    assert result.returncode == 2
    assert f"{bad}:2:" in result.stderr and "util" in result.stderr


def test_log_level_is_accepted_after_the_subcommand(tmp_path):
    result = run_gpuwatch(["run", "--log.level", "debug", "--quiet",
                           "--web.listen-address", "127.0.0.1:0", "--", "true"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert " DEBUG " in result.stderr
    # given before the subcommand, a subcommand's default does not undo it
    result = run_gpuwatch(["--log.level", "error", "run", "--web.listen-address",
                           "127.0.0.1:0", "--", "true"], tmp_path)
    assert result.returncode == 0 and " WARNING " not in result.stderr, result.stderr


def test_run_says_where_it_serves_without_a_terminal(tmp_path):
    result = run_gpuwatch(["run", "--web.listen-address", "127.0.0.1:0", "--", "true"], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if "metrics at" in ln]
    assert len(lines) == 1 and re.search(r"http://127\.0\.0\.1:\d+/metrics", lines[0])


def test_an_inherited_socket_with_a_listen_address_still_serves(tmp_path):
    from gpuwatch.job.receiver import HookReceiver
    from gpuwatch.store import Store

    outer = HookReceiver(Store(), str(tmp_path / "outer.sock"))
    outer.start()
    try:
        env_line = f"GPUWATCH_SOCKET={outer.socket_path}"
        result = subprocess.run(
            ["env", env_line, sys_executable(), "-m", "gpuwatch", "run",
             "--web.listen-address", "127.0.0.1:0", "--", sys_executable(), "-c",
             "import os; print(os.environ['GPUWATCH_SOCKET'])"],
            cwd=Path(__file__).resolve().parents[1], env=clean(tmp_path),
            capture_output=True, text=True, timeout=120, check=False)
    finally:
        outer.stop()
    assert result.returncode == 0, result.stderr
    assert re.search(r"metrics at http://127\.0\.0\.1:\d+/metrics; reporting to "
                     + re.escape(outer.socket_path), result.stderr), result.stderr
    # the job reports to both: the outer receiver and this launcher's own
    sockets = result.stdout.strip().split(os.pathsep)
    assert sockets[0] == outer.socket_path and len(sockets) == 2


def sys_executable() -> str:
    import sys

    return sys.executable


def clean(tmp_path: Path) -> dict[str, str]:
    from conftest import daemon_env

    return {k: v for k, v in daemon_env(tmp_path).items() if not k.startswith("GPUWATCH")}


def test_the_slow_tier_follows_the_flags_interval_unless_the_file_set_it(tmp_path):
    cfg = tmp_path / "gpuwatch.yaml"
    cfg.write_text("interval: 60\n")
    config = config_from_args(Namespace(config_file=str(cfg), interval=1.0))
    assert (config.interval, config.slow_interval) == (1.0, Config.slow_interval)
    assert config_from_args(Namespace(config_file=str(cfg))).slow_interval == 60.0
    cfg.write_text("interval: 60\nslow_interval: 120\n")
    config = config_from_args(Namespace(config_file=str(cfg), interval=1.0))
    assert (config.interval, config.slow_interval) == (1.0, 120.0)


def test_the_energy_interval_follows_the_slow_tier_unless_set(tmp_path):
    cfg = tmp_path / "gpuwatch.yaml"
    cfg.write_text("slow_interval: 120\n")
    assert load_config(str(cfg)).energy_interval == 120.0  # at least one slow round
    assert config_from_args(Namespace(config_file=str(cfg))).energy_interval == 120.0
    assert Config().energy_interval == 60.0
    assert config_from_args(Namespace(config_file=None)).energy_interval == 60.0
    cfg.write_text("interval: 60\n")  # the slow tier follows the interval, energy it
    config = config_from_args(Namespace(config_file=str(cfg)))
    assert (config.slow_interval, config.energy_interval) == (60.0, 60.0)
    config = config_from_args(Namespace(config_file=str(cfg), interval=1.0))
    assert (config.slow_interval, config.energy_interval) == (30.0, 60.0)
    cfg.write_text("slow_interval: 10\nenergy_interval: 15\n")
    config = config_from_args(Namespace(config_file=str(cfg)))
    assert (config.slow_interval, config.energy_interval) == (10.0, 15.0)
    # the file's own interval would make the slow tier 60 s, the flag's makes it 30 s
    cfg.write_text("interval: 60\nenergy_interval: 45\n")
    config = config_from_args(Namespace(config_file=str(cfg), interval=1.0))
    assert (config.slow_interval, config.energy_interval) == (30.0, 45.0)
    with pytest.raises(UserError, match=r"energy_interval \(45 s\) must not be shorter "
                                        r"than slow_interval \(60 s\)"):
        config_from_args(Namespace(config_file=str(cfg)))
    # a slow tier from the flags' interval may not outrun an energy interval the file set
    cfg.write_text("energy_interval: 30\n")
    with pytest.raises(UserError, match=r"energy_interval \(30 s\) must not be shorter "
                                        r"than slow_interval \(45 s\)"):
        config_from_args(Namespace(config_file=str(cfg), interval=45.0))


def test_an_energy_interval_shorter_than_the_slow_tier_is_refused_at_its_line(tmp_path):
    cfg = tmp_path / "gpuwatch.yaml"
    cfg.write_text("slow_interval: 30\n# the counter\nenergy_interval: 10\n")
    result = run_gpuwatch(["run", "--config.file", str(cfg)], tmp_path)
    assert result.returncode == 2
    assert (f"{cfg}:3: energy_interval (10 s) must not be shorter than slow_interval (30 s): "
            "the energy counter is read on the slow tier's rounds") in result.stderr
    cfg.write_text("energy_interval: 5\n")  # against the default slow tier
    result = run_gpuwatch(["run", "--config.file", str(cfg)], tmp_path)
    assert result.returncode == 2
    assert f"{cfg}:1: energy_interval (5 s) must not be shorter than slow_interval (30 s)" \
        in result.stderr
    cfg.write_text("energy_interval: nope\n")
    result = run_gpuwatch(["run", "--config.file", str(cfg)], tmp_path)
    assert result.returncode == 2
    assert f"{cfg}:1: energy_interval: expected seconds as a number" in result.stderr


def test_a_stop_sent_the_moment_it_serves_is_a_clean_stop(tmp_path):
    """The daemon says it serves only once SIGTERM stops it cleanly: a service manager or a
    test that stops it on that line gets exit status 0, not death by the signal (the
    handler was installed a moment after the line, and a loaded machine hit the gap)."""
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-m", "gpuwatch", "run", "--demo",
                                 "--web.listen-address", "127.0.0.1:0"],
                                stderr=subprocess.PIPE, text=True, env=env)
        assert proc.stderr is not None
        for line in proc.stderr:
            if "gpuwatch: serving" in line:
                proc.send_signal(signal.SIGTERM)
                break
        proc.stderr.close()
        assert proc.wait(timeout=60) == 0
