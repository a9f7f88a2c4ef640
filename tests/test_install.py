"""The operator's path, from the docs' own text: the service's installed configuration
(systemd/gpuwatch.default's flags, systemd/gpuwatch.yaml) scraped by a real Prometheus
from another host's point of view with the README's scrape job and rule files, checked
with promtool as the README says; then the port closed with TLS and basic auth as
docs/security.md says (its openssl commands, its web.yml, its scrape job).

"Another host" is this machine's own non-loopback address: a daemon listening on
loopback only is refused there, as it would be from Prometheus's host.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import (
    PROMETHEUS,
    PROMTOOL,
    REPO,
    free_port,
    http_get,
    run_gpuwatch,
    wait_for,
)

README = (REPO / "README.md").read_text()
SECURITY = (REPO / "docs" / "security.md").read_text()


def outside_address() -> str | None:
    """An IPv4 address of this machine other than loopback (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.123", 9))  # TEST-NET-1: only picks the outgoing address
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


ADDRESS = outside_address()
needs_network = pytest.mark.skipif(ADDRESS is None, reason="no non-loopback IPv4 address")
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None,
                                      reason="prometheus/promtool are not installed")


def section(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def shipped_config(tmp_path: Path, port: int, **extra: Any) -> Path:
    """/etc/gpuwatch/gpuwatch.yaml as the README installs it, named by the unit's flags
    (systemd/gpuwatch.default), on ``port`` instead of 9442; ``extra`` uncomments keys."""
    args = re.search(r'^ARGS="(.*)"$', (REPO / "systemd" / "gpuwatch.default").read_text(), re.M)
    assert args and shlex.split(args.group(1)) == ["--config.file",
                                                   "/etc/gpuwatch/gpuwatch.yaml"]
    text = (REPO / "systemd" / "gpuwatch.yaml").read_text()
    assert re.search(r'^listen_address: ":9442"$', text, re.M), "the service's default changed"
    text = text.replace('":9442"', f'":{port}"')
    for key, value in extra.items():
        line = re.search(rf"^# {key}: .*$", text, re.M)
        assert line, f"{key} is not offered in systemd/gpuwatch.yaml"
        text = text.replace(line.group(0), f"{key}: {json.dumps(value)}")
    out = tmp_path / "gpuwatch.yaml"
    out.write_text(text)
    return out


def readme_scrape_config(targets: list[str], rule_dir: Path) -> dict:
    """The README's Prometheus configuration, its targets and rule paths put here."""
    block = section(README, "## Scrape it with Prometheus").split("```yaml\n", 1)[1]
    config = yaml.safe_load(block.split("```", 1)[0])
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "gpuwatch"  # what the alerts' up{job="gpuwatch"} reads
    job["static_configs"] = [{"targets": targets}]
    job["scrape_interval"] = "1s"  # the README's 5s, shortened for the test
    config["rule_files"] = [str(rule_dir / Path(f).name) for f in config["rule_files"]]
    return config


def readme_commands(heading: str) -> list[str]:
    """The indented command lines of a README section, comments off."""
    body = section(README, heading)
    return [re.sub(r"\s+#.*$", "", line.strip()) for line in body.splitlines()
            if line.startswith("    ") and line.strip()]


class Prometheus:
    def __init__(self, config: dict, root: Path) -> None:
        self.root = root
        self.config_path = root / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / "prometheus.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={self.config_path}",
                 f"--storage.tsdb.path={root / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=root)
        wait_for(lambda: http_get(self.url + "/-/ready", timeout=2)[0] == 200,
                 "Prometheus to be ready", 60, self.proc)

    def api(self, path: str, **params: str) -> Any:
        import urllib.parse

        status, _, body = http_get(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}")
        data = json.loads(body)
        assert status == 200 and data["status"] == "success", body
        return data["data"]

    def target(self, instance: str) -> dict | None:
        for t in self.api("targets")["activeTargets"]:
            if t["labels"]["instance"] == instance and t["health"] != "unknown":
                return t
        return None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120,
                          check=False)


@needs_network
@needs_prometheus
def test_the_installed_service_is_scraped_from_another_host(gpuwatch_daemon, tmp_path):
    port, loop_port = free_port(), free_port()
    d = gpuwatch_daemon("--config.file", str(shipped_config(tmp_path, port)))
    # the issue's own case: a loopback-only daemon, scraped at the host's address
    loopback = gpuwatch_daemon("--web.listen-address", f"127.0.0.1:{loop_port}")
    assert http_get(f"http://{ADDRESS}:{port}/healthz")[0] == 200  # the check step's curl

    # the README's rule-file steps: where they go, promtool check rules, check config
    rules = tmp_path / "etc-prometheus-gpuwatch"
    rules.mkdir()
    steps = readme_commands("## Scrape it with Prometheus")
    (install,) = [c for c in steps if c.startswith("install -d /etc/prometheus/gpuwatch")]
    assert "prometheus/alerts.yml prometheus/recording.yml" in install
    for name in ("alerts.yml", "recording.yml"):
        shutil.copy(REPO / "prometheus" / name, rules / name)
    (check_rules,) = [c for c in steps if c.startswith("promtool check rules")]
    args = [a.replace("/etc/prometheus/gpuwatch", str(rules)) for a in shlex.split(check_rules)]
    got = promtool(*args[1:])
    assert got.returncode == 0, got.stdout + got.stderr
    assert any(c.startswith("promtool check config /etc/prometheus/prometheus.yml") for c in steps)
    assert any(c.startswith("systemctl reload prometheus") for c in steps)

    config = readme_scrape_config([f"{ADDRESS}:{port}", f"{ADDRESS}:{loop_port}"], rules)
    root = tmp_path / "prometheus"
    root.mkdir()
    (root / "check.yml").write_text(yaml.safe_dump(config))
    got = promtool("check", "config", str(root / "check.yml"))
    assert got.returncode == 0, got.stdout + got.stderr

    prom = Prometheus(config, root)
    try:
        up = wait_for(lambda: (t := prom.target(f"{ADDRESS}:{port}")) and t["health"] == "up"
                      and t, "the service's port scraped from outside loopback", 60, prom.proc)
        assert up["labels"]["job"] == "gpuwatch"
        series = wait_for(lambda: prom.api("query", query="gpuwatch_ticks_total")["result"],
                          "gpuwatch_ticks_total in Prometheus", 60, prom.proc)
        assert series[0]["metric"]["instance"] == f"{ADDRESS}:{port}"
        groups = {g["name"] for g in prom.api("rules")["groups"]}
        assert any(g.startswith("gpuwatch") for g in groups), groups
        # the same scrape of a loopback-only daemon: connection refused, as issue 15 met it
        down = wait_for(lambda: (t := prom.target(f"{ADDRESS}:{loop_port}")) and t,
                        "the loopback daemon's scrape", 60, prom.proc)
        assert down["health"] == "down" and "connection refused" in down["lastError"]
    finally:
        prom.stop()
    assert d.stop() == 0 and loopback.stop() == 0


OPENSSL = shutil.which("openssl")


@needs_network
@needs_prometheus
@pytest.mark.skipif(OPENSSL is None, reason="openssl is not installed")
def test_closing_the_port_as_docs_security_md_says(gpuwatch_daemon, tmp_path):
    closing = section(SECURITY, "## Closing the port: TLS and basic auth")
    # its commands, run here: a CA, a host key and certificate for "gpu-host-1"
    pki = tmp_path / "pki"
    pki.mkdir()
    for line in closing.splitlines():
        if line.startswith("    openssl "):
            got = subprocess.run(["bash", "-c", line.strip()], cwd=pki, capture_output=True,
                                 text=True, timeout=120, check=False)
            assert got.returncode == 0, (line, got.stderr)
    assert {"ca.crt", "tls.key", "tls.crt"} <= {p.name for p in pki.iterdir()}
    chmod = next(ln for ln in closing.splitlines() if "chmod 0640 /etc/gpuwatch/tls.key" in ln)
    assert "chown root:gpuwatch /etc/gpuwatch/tls.key" in chmod

    # its web.yml, with this test's files and a hash of a password of ours
    web_yml, scrape_yml = [b.split("```", 1)[0] for b in closing.split("```yaml\n")[1:3]]
    import bcrypt

    password = "scrape-me"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(10)).decode()
    web = yaml.safe_load(web_yml.replace("/etc/gpuwatch/", f"{pki}/"))
    assert set(web["basic_auth_users"]) == {"prometheus"}
    web["basic_auth_users"]["prometheus"] = hashed
    web_path = tmp_path / "web.yml"
    web_path.write_text(yaml.safe_dump(web))

    port = free_port()
    d = gpuwatch_daemon("--config.file",
                        str(shipped_config(tmp_path, port, web_config_file=str(web_path))))
    assert d.url.startswith("https://")

    # its scrape job: https, the CA, the password from a file; gpu-host-1 is this address
    scrape = yaml.safe_load(scrape_yml)
    (job,) = scrape["scrape_configs"]
    password_file = tmp_path / "password"
    password_file.write_text(password)
    job["tls_config"]["ca_file"] = str(pki / "ca.crt")
    job["tls_config"]["server_name"] = "gpu-host-1"  # the name in the host's certificate
    job["basic_auth"]["password_file"] = str(password_file)
    job["static_configs"] = [{"targets": [f"{ADDRESS}:{port}"]}]
    job["scrape_interval"] = "1s"
    plain = {"job_name": "plain", "scrape_interval": "1s",
             "static_configs": [{"targets": [f"{ADDRESS}:{port}"]}]}
    wrong = {**job, "job_name": "wrong", "basic_auth": {"username": "prometheus",
                                                        "password": "guess"}}
    scrape["scrape_configs"] += [plain, wrong]
    root = tmp_path / "prometheus"
    root.mkdir()
    prom = Prometheus(scrape, root)
    try:
        def health(job_name: str) -> dict | None:
            for t in prom.api("targets")["activeTargets"]:
                if t["labels"]["job"] == job_name and t["health"] != "unknown":
                    return t
            return None

        ok = wait_for(lambda: health("gpuwatch"), "the TLS scrape", 60, prom.proc)
        assert ok["health"] == "up", ok["lastError"]
        for name, why in (("plain", ""), ("wrong", "401")):
            t = wait_for(lambda n=name: health(n), f"the {name} scrape", 60, prom.proc)
            assert t["health"] == "down" and why in t["lastError"], t["lastError"]
    finally:
        prom.stop()
    # the doc's check, as curl would: plain HTTP fails, HTTPS with the password answers
    with pytest.raises(OSError):
        http_get(f"http://{ADDRESS}:{port}/healthz", timeout=5)
    import base64
    import ssl
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.check_hostname = False  # the certificate names gpu-host-1, reached here by address
    auth = base64.b64encode(f"prometheus:{password}".encode()).decode()
    req = urllib.request.Request(f"https://{ADDRESS}:{port}/healthz",
                                 headers={"Authorization": f"Basic {auth}"})
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        assert resp.status == 200 and resp.read().startswith(b"ok")
    assert d.stop() == 0


def test_readme_install_steps_name_the_shipped_files():
    steps = readme_commands("## Install as a service")
    text = " ".join(steps)
    for name in re.findall(r"(?<![/\w])systemd/(\S+)", text):
        assert (REPO / "systemd" / name).is_file(), name
    assert "systemd/gpuwatch.yaml -t /etc/gpuwatch/" in text
    # the "check that it works" step
    assert any(s.startswith("systemctl status gpuwatch") for s in steps)
    assert any(s.startswith("curl -fsS http://localhost:9442/healthz") for s in steps)
    assert any("/metrics" in s and s.startswith("curl") for s in steps)
    # and the README says what listening everywhere exposes and how it is closed
    body = section(README, "## Install as a service")
    for words in ("every interface", "`/metrics`", "`/api/snapshot`", "TLS and basic auth",
                  "docs/security.md#closing-the-port-tls-and-basic-auth"):
        assert words in body, words


def test_the_healthz_answer_is_what_the_readme_shows(gpuwatch_daemon):
    d = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0", "--interval", "0.2")
    step = next(s for s in readme_commands("## Install as a service") if "/healthz" in s)
    shown = re.search(r"#\s*(.*)$", next(ln for ln in section(README, "## Install as a service")
                                          .splitlines() if step in ln)).group(1)
    want = re.escape(shown).replace(r"0\.4", r"\d+\.\d")
    got = wait_for(lambda: (r := http_get(d.url + "/healthz"))[0] == 200
                   and r[2].startswith("ok: last") and r[2], "a sample")
    assert re.fullmatch(want, got.strip()), (shown, got)
    assert d.stop() == 0


def test_run_gpuwatch_with_the_shipped_config_listens_everywhere(tmp_path):
    # the file as shipped is accepted by `gpuwatch run` (a bad key would exit 2)
    got = run_gpuwatch(["run", "--config.file", str(REPO / "systemd" / "gpuwatch.yaml"),
                        "--web.listen-address", "bogus"], tmp_path)
    assert got.returncode == 2 and "--web.listen-address" in got.stderr
    from gpuwatch.serve.config import load_config

    assert load_config(str(REPO / "systemd" / "gpuwatch.yaml")).listen_address == ":9442"
    # every option the file offers commented out is accepted once uncommented
    text = (REPO / "systemd" / "gpuwatch.yaml").read_text()
    web = tmp_path / "web.yml"
    web.write_text("{}\n")
    uncommented = re.sub(r"^# (\w+: .*?)(\s+#.*)?$", r"\1", text, flags=re.M)
    uncommented = uncommented.replace("/etc/gpuwatch/web.yml", str(web))
    path = tmp_path / "all.yaml"
    path.write_text(uncommented)
    config = load_config(str(path))
    assert config.web_config_file == str(web)
    assert not config.privacy.export_process_names and not config.privacy.export_users


def test_the_torch_pin_is_one_release_everywhere_and_the_note_is_honest():
    import torch

    pins = re.findall(r"torch==([\d.]+)", README) + re.findall(
        r"torch==([\d.]+)", (REPO / ".ci" / "run").read_text())
    assert len(pins) >= 4 and len(set(pins)) == 1, pins
    assert torch.__version__.split("+")[0] == pins[0]  # what this checkout was tested with
    note = " ".join(README.split("(`pip install torch==", 1)[1].split(")\n", 1)[0].split())
    # the pin picks the release, the index picks the build: never "keeps pip from pulling CUDA"
    assert "keeps pip from pulling a CUDA build" not in README
    assert "CUDA build" in note and "--index-url https://download.pytorch.org/whl/cpu" in note
