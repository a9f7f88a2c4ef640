"""Shared fixtures: a gpuwatch daemon as a subprocess, a real Prometheus server, GPU skips.

``gpuwatch_daemon(*args)`` starts ``python3 -m gpuwatch run ARGS`` and returns once it
says where it serves; ``prometheus(targets)`` starts /usr/bin/prometheus scraping them.
Both are stopped at the end of the test.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"


# -- the recordings in tests/data: plain (NAME.jsonl) or gzip'd (NAME.jsonl.gz, as the
# framework recordings are kept: a twelfth of the bytes), each known by its NAME ----------

def recording_name(path: Path) -> str:
    """``fw_hf_ddp`` for tests/data/fw_hf_ddp.jsonl and for fw_hf_ddp.jsonl.gz."""
    return Path(path).name.removesuffix(".gz").removesuffix(".jsonl")


def recording(name: str) -> Path:
    """The file of recording ``name`` in tests/data, plain or gzip'd."""
    plain = DATA / f"{name}.jsonl"
    return plain if plain.exists() else DATA / f"{name}.jsonl.gz"


def open_recording(path: Path) -> Any:
    """A recording's text, opened for reading (gzip'd or not)."""
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def read_recording(path: Path) -> str:
    with open_recording(path) as f:
        return f.read()


RECORDINGS = sorted([*DATA.glob("*.jsonl"), *DATA.glob("*.jsonl.gz")], key=recording_name)
_twice = sorted(n for n, k in Counter(map(recording_name, RECORDINGS)).items() if k > 1)
assert not _twice, f"tests/data holds these recordings both plain and gzip'd: {_twice}"
# those with GPU lines (all but a CPU-only job's: fw_hf_eval_first_cpu)
GPU_RECORDINGS = [p for p in RECORDINGS
                  if re.search(r'"kind": ?"gpu"', read_recording(p))]
SERVING = re.compile(r"serving (https?://\S+)/metrics")


# -- GPU availability ----------------------------------------------------------------

def _nvml_gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - any failure means: no usable GPU here
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001
        return 0
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001, S110
            pass


NVML_GPUS = _nvml_gpu_count()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if NVML_GPUS:
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU (NVML found none here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# -- helpers -------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str, str]:
    """(status, content type, body) of a GET, also for error statuses."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read().decode()


def wait_for(check: Callable[[], Any], what: str, timeout: float = 60.0,
             proc: subprocess.Popen | None = None, interval: float = 0.05) -> Any:
    """Poll ``check`` until it returns something truthy; fail with ``what`` if it never does.

    A readiness wait, not a timing assertion: the timeout only keeps a broken build from
    hanging the suite."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} while waiting for {what}")
        try:
            result = check()
        except (OSError, ValueError, KeyError) as err:
            last_error, result = err, None
        if result:
            return result
        time.sleep(interval)
    raise AssertionError(f"gave up waiting for {what}" +
                         (f" (last error: {last_error!r})" if last_error else ""))


def parse_metrics(text: str) -> dict[tuple[str, frozenset], float]:
    """Exposition text → {(sample name, frozenset(labels)): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def names_of(samples: dict[tuple[str, frozenset], float]) -> set[str]:
    return {name for name, _ in samples}


def daemon_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    # each daemon gets its own runtime dir, so hook sockets never collide between tests
    runtime = tmp_path / "runtime"
    runtime.mkdir(exist_ok=True, mode=0o700)
    env["XDG_RUNTIME_DIR"] = str(runtime)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any GPUWATCH_* variable, the checkout first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


# -- a daemon as a subprocess --------------------------------------------------------

@dataclass
class DaemonProcess:
    proc: subprocess.Popen
    url: str = ""
    lines: list[str] = field(default_factory=list)

    def stderr(self) -> str:
        return "".join(self.lines)

    def metrics(self) -> dict[tuple[str, frozenset], float]:
        status, _, body = http_get(self.url + "/metrics")
        assert status == 200, body
        return parse_metrics(body)

    def wait_for_metric(self, name: str, timeout: float = 30.0) -> dict:
        return wait_for(lambda: (m := self.metrics()) and name in names_of(m) and m,
                        f"{name} at {self.url}/metrics", timeout, self.proc)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"gpuwatch did not exit on {signal.Signals(sig).name}; "
                                 f"stderr:\n{self.stderr()}") from None


def run_gpuwatch(args: list[str], tmp_path: Path, timeout: float = 60.0
                 ) -> subprocess.CompletedProcess:
    """Run ``python3 -m gpuwatch ARGS`` to completion (for commands that should exit)."""
    return subprocess.run([sys.executable, "-m", "gpuwatch", *args], cwd=REPO,
                          env=daemon_env(tmp_path), capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture
def gpuwatch_daemon(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Factory: start ``gpuwatch run ARGS``, return once it prints the URL it serves."""
    started: list[DaemonProcess] = []

    def start(*args: str, timeout: float = 60.0, env: dict[str, str] | None = None
              ) -> DaemonProcess:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatch", "run", *args], cwd=REPO,
            env={**daemon_env(tmp_path), **(env or {})}, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        daemon = DaemonProcess(proc)
        started.append(daemon)

        def pump() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                daemon.lines.append(line)

        threading.Thread(target=pump, daemon=True).start()

        def serving() -> str | None:
            m = SERVING.search(daemon.stderr())
            return m.group(1) if m else None

        daemon.url = wait_for(serving, "the 'serving' line on stderr", timeout, proc)
        return daemon

    yield start
    for daemon in started:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait()


# -- a real Prometheus server --------------------------------------------------------

PROMETHEUS = shutil.which("prometheus") or (
    "/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None)
PROMTOOL = shutil.which("promtool") or (
    "/usr/bin/promtool" if os.path.exists("/usr/bin/promtool") else None)


@dataclass
class PrometheusServer:
    url: str
    proc: subprocess.Popen
    log_path: Path

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        status, _, body = http_get(f"{self.url}/api/v1/{path}?{query}")
        data = json.loads(body)
        if status != 200 or data.get("status") != "success":
            raise AssertionError(f"Prometheus {path} {params}: {status} {body}")
        return data["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query: the result vector."""
        return self.api("query", query=expr)["result"]

    def wait_for(self, expr: str, timeout: float = 60.0) -> list[dict]:
        """Poll until ``expr`` returns a non-empty vector."""
        return wait_for(lambda: self.query(expr), f"Prometheus to return {expr}", timeout,
                        self.proc)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def prometheus(tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Callable[..., PrometheusServer]]:
    """Factory: ``prometheus(["127.0.0.1:PORT", ...], scrape_interval="500ms")`` starts a
    real Prometheus (storage in a temp dir, a free port) scraping those targets, with
    ``rule_files`` loaded if given; it waits until Prometheus is ready, and kills it at the
    end of the test."""
    if PROMETHEUS is None:
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    started: list[subprocess.Popen] = []

    def start(targets: list[str], scrape_interval: str = "500ms", job: str = "gpuwatch",
              extra_args: tuple[str, ...] = (), rule_files: tuple[str | Path, ...] = (),
              target_labels: dict[str, dict[str, str]] | None = None,
              scrape: dict[str, Any] | None = None) -> PrometheusServer:
        """``rule_files`` are loaded (absolute paths); ``target_labels`` gives a target its
        own labels, e.g. ``{"127.0.0.1:9442": {"instance": "gpu-1:9442"}}``; ``scrape``
        adds to the job (scheme, tls_config, basic_auth, ...)."""
        root = tmp_path_factory.mktemp("prometheus")
        config = root / "prometheus.yml"
        labels = target_labels or {}
        static = [{"targets": [t], **({"labels": labels[t]} if t in labels else {})}
                  for t in targets]
        # scrape_timeout may not exceed the interval; 400ms fits the 500ms default
        config.write_text(json.dumps({
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval,
                       "scrape_timeout": "400ms" if scrape_interval == "500ms" else
                       scrape_interval},
            "scrape_configs": [{"job_name": job, "static_configs": static, **(scrape or {})}],
            **({"rule_files": [str(Path(f).resolve()) for f in rule_files]} if rule_files else {}),
        }))
        port = free_port()
        log_path = root / "prometheus.log"
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={root / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", *extra_args],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, cwd=root)
        started.append(proc)
        server = PrometheusServer(f"http://127.0.0.1:{port}", proc, log_path)
        wait_for(lambda: http_get(server.url + "/-/ready", timeout=2)[0] == 200,
                 "Prometheus to be ready", 60, proc)
        return server

    yield start
    for proc in started:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
