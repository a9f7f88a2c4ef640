"""--web.config.file: TLS, client certificates and basic auth, with real TLS clients
(Python's ssl, curl), certificates made by openssl, hashes made by htpasswd, and a real
Prometheus scraping over TLS with basic auth."""

from __future__ import annotations

import base64
import logging
import os
import shutil
import socket
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO, clean_env, run_gpuwatch, wait_for
from prometheus_client import CollectorRegistry, Gauge

from gpuwatch.errors import FileFormatError, UserError
from gpuwatch.serve.httpserver import HttpServer
from gpuwatch.serve.webconfig import WebConfigFile, load_web_config

OPENSSL = shutil.which("openssl")
HTPASSWD = shutil.which("htpasswd")
CURL = shutil.which("curl")
pytestmark = pytest.mark.skipif(OPENSSL is None, reason="openssl is not installed")


# -- test certificates ------------------------------------------------------------------

def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _key(cwd: Path, name: str) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", f"{name}.key", cwd=cwd)


def _ca(cwd: Path, name: str) -> None:
    _key(cwd, name)
    _openssl("req", "-x509", "-new", "-key", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
             "-subj", f"/CN={name}", cwd=cwd)


def _cert(cwd: Path, name: str, ca: str, san: str, usage: str) -> None:
    _key(cwd, name)
    _openssl("req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
             cwd=cwd)
    ext = cwd / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", str(ext),
             cwd=cwd)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    _ca(d, "ca")
    _ca(d, "other-ca")
    _cert(d, "server", "ca", "DNS:localhost,IP:127.0.0.1", "serverAuth")
    _cert(d, "server2", "ca", "DNS:localhost,IP:127.0.0.1", "serverAuth")
    _cert(d, "client", "ca", "DNS:prometheus.test", "clientAuth")
    _cert(d, "client-other-name", "ca", "DNS:someone.test", "clientAuth")
    _cert(d, "stranger", "other-ca", "DNS:prometheus.test", "clientAuth")
    return d


def _bcrypt_hash(password: str) -> str:
    if HTPASSWD:  # what the docs tell users to run
        out = subprocess.run([HTPASSWD, "-nbBC", "10", "", password], check=True,
                             capture_output=True, text=True, timeout=60).stdout
        return out.strip().lstrip(":")
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(10)).decode()


def _client_ctx(pki: Path, cert: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        ctx.load_cert_chain(str(pki / f"{cert}.crt"), str(pki / f"{cert}.key"))
    return ctx


def _get(url: str, ctx: ssl.SSLContext | None = None, auth: tuple[str, str] | None = None
         ) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url)
    if auth:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def _server(web: str | Path) -> HttpServer:
    registry = CollectorRegistry()
    Gauge("demo_value", "a value", registry=registry).set(1)
    server = HttpServer("127.0.0.1:0", registry=registry, web=WebConfigFile(str(web)))
    server.start()
    return server


def _peer_serial(port: int, pki: Path) -> int:
    ctx = _client_ctx(pki)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
    out = subprocess.run([OPENSSL, "x509", "-inform", "DER", "-noout", "-serial"], input=der,
                         capture_output=True, check=True, timeout=30).stdout.decode()
    return int(out.strip().split("=")[1], 16)


def _serial(path: Path) -> int:
    out = subprocess.run([OPENSSL, "x509", "-in", str(path), "-noout", "-serial"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return int(out.strip().split("=")[1], 16)


# -- TLS -----------------------------------------------------------------------------------

def test_daemon_serves_https_and_plain_http_clients_fail_alone(pki, tmp_path, gpuwatch_daemon):
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {pki / 'server.crt'}\n"
                   f"  key_file: {pki / 'server.key'}\n")
    d = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0", "--web.config.file", str(web))
    assert d.url.startswith("https://127.0.0.1:")
    status, _, body = _get(d.url + "/metrics", _client_ctx(pki))
    assert status == 200 and b"gpuwatch_up 1.0" in body
    # a plain-HTTP client gets no answer, and costs nothing else
    with socket.create_connection(("127.0.0.1", int(d.url.rsplit(":", 1)[1])), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            assert not s.recv(100).startswith(b"HTTP/1.1 200")
        except ConnectionResetError:
            pass
    # a client that does not trust our CA refuses us
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(d.url + "/metrics", context=ssl.create_default_context(),
                               timeout=10)
    assert _get(d.url + "/healthz", _client_ctx(pki))[0] == 200
    assert d.stop() == 0
    assert "Traceback" not in d.stderr()


def test_client_certificates_required_and_verified(pki, tmp_path):
    web = tmp_path / "web.yml"
    web.write_text(f"""tls_server_config:
  cert_file: {pki / 'server.crt'}
  key_file: {pki / 'server.key'}
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: {pki / 'ca.crt'}
  client_allowed_sans: [prometheus.test]
  min_version: TLS12
""")
    server = _server(web)
    try:
        url = server.url + "/metrics"
        assert url.startswith("https://")
        assert _get(url, _client_ctx(pki, "client"))[0] == 200
        for who in (None, "stranger", "client-other-name"):  # none, untrusted CA, wrong SAN
            with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
                _get(url, _client_ctx(pki, who))
        if CURL:  # a second TLS client, as a user would try it
            ok = subprocess.run([CURL, "-sS", "--cacert", str(pki / "ca.crt"), "--cert",
                                 str(pki / "client.crt"), "--key", str(pki / "client.key"), url],
                                capture_output=True, text=True, timeout=30)
            assert ok.returncode == 0 and "demo_value 1.0" in ok.stdout, ok.stderr
            refused = subprocess.run([CURL, "-sS", "--cacert", str(pki / "ca.crt"), url],
                                     capture_output=True, text=True, timeout=30)
            assert refused.returncode != 0
        assert _get(url, _client_ctx(pki, "client"))[0] == 200  # still serving
    finally:
        server.stop()


def test_tls_min_version_is_enforced(pki, tmp_path):
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {pki / 'server.crt'}\n"
                   f"  key_file: {pki / 'server.key'}\n  min_version: TLS13\n")
    server = _server(web)
    try:
        old = _client_ctx(pki)
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises((urllib.error.URLError, ssl.SSLError)):
            _get(server.url + "/healthz", old)
        assert _get(server.url + "/healthz", _client_ctx(pki))[0] == 200
    finally:
        server.stop()


def test_certificates_rotate_without_a_restart(pki, tmp_path, caplog):
    live = tmp_path / "live"
    live.mkdir()
    for ext in ("crt", "key"):
        shutil.copy(pki / f"server.{ext}", live / f"tls.{ext}")
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {live / 'tls.crt'}\n"
                   f"  key_file: {live / 'tls.key'}\n")
    server = _server(web)
    try:
        assert _peer_serial(server.port, pki) == _serial(pki / "server.crt")
        # rotate as cert managers do: write new files, rename them over the old ones
        for ext in ("crt", "key"):
            shutil.copy(pki / f"server2.{ext}", live / f"new.{ext}")
            os.replace(live / f"new.{ext}", live / f"tls.{ext}")
        assert _peer_serial(server.port, pki) == _serial(pki / "server2.crt")
        # a broken rotation (a key that doesn't match) keeps the last good certificate
        caplog.set_level(logging.ERROR)
        shutil.copy(pki / "client.key", live / "new.key")
        os.replace(live / "new.key", live / "tls.key")
        for _ in range(3):
            assert _peer_serial(server.port, pki) == _serial(pki / "server2.crt")
        errors = [r for r in caplog.records if "not reloaded" in r.getMessage()]
        assert len(errors) == 1 and "tls.crt" in errors[0].getMessage()
    finally:
        server.stop()


# -- basic auth --------------------------------------------------------------------------

def test_basic_auth_with_htpasswd_hashes(pki, tmp_path, monkeypatch):
    import bcrypt

    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: {_bcrypt_hash('s3cret pass')}\n"
                   f"  other: {_bcrypt_hash('other')}\n"
                   "http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    calls = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda pw, h: calls.append(1) or real(pw, h))
    server = _server(web)
    try:
        url = server.url + "/metrics"
        assert url.startswith("http://")
        for auth in (None, ("prometheus", "wrong"), ("nobody", "s3cret pass"),
                     ("other", "s3cret pass")):
            status, headers, body = _get(url, auth=auth)
            assert status == 401 and b"demo_value" not in body
            assert headers["WWW-Authenticate"].startswith('Basic realm="gpuwatch"')
        # a header that is not base64, or has no colon
        req = urllib.request.Request(url, headers={"Authorization": "Basic !!!"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)
        assert err.value.code == 401
        before = len(calls)
        for _ in range(5):
            status, headers, body = _get(url, auth=("prometheus", "s3cret pass"))
            assert status == 200 and b"demo_value 1.0" in body
            assert headers["X-Frame-Options"] == "deny"
        # successful checks are remembered: one bcrypt check for five scrapes
        assert len(calls) - before == 1
        assert _get(server.url + "/healthz")[0] == 401  # every page is behind the password
    finally:
        server.stop()


def test_prometheus_scrapes_over_tls_with_basic_auth(pki, tmp_path, gpuwatch_daemon,
                                                     prometheus):
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {pki / 'server.crt'}\n"
                   f"  key_file: {pki / 'server.key'}\n"
                   f"basic_auth_users:\n  prom: {_bcrypt_hash('scrape-me')}\n")
    d = gpuwatch_daemon("--web.listen-address", "127.0.0.1:0", "--web.config.file", str(web),
                        "--interval", "0.5")
    target = d.url.removeprefix("https://")
    prom = prometheus([target], scrape={
        "scheme": "https",
        "tls_config": {"ca_file": str(pki / "ca.crt"), "server_name": "localhost"},
        "basic_auth": {"username": "prom", "password": "scrape-me"},
    })
    up = prom.wait_for('up{job="gpuwatch"} == 1')
    assert up[0]["metric"]["instance"] == target
    assert prom.wait_for("gpuwatch_ticks_total > 0")
    # the same scrape with a wrong password is refused: Prometheus sees the target down
    bad = prometheus([target], job="wrong", scrape={
        "scheme": "https",
        "tls_config": {"ca_file": str(pki / "ca.crt"), "server_name": "localhost"},
        "basic_auth": {"username": "prom", "password": "guess"},
    })
    down = bad.wait_for('up{job="wrong"} == 0')
    assert down
    targets = bad.api("targets")["activeTargets"]
    assert "401" in targets[0]["lastError"]
    assert "Traceback" not in d.stderr()


# -- bad files -------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "line", "expected"), [
    ("tls_server_config:\n  cert_file: a\n  key_file: b\nbogus: 1\n", 4, "unknown key 'bogus'"),
    ("tls_server_config:\n  cert_file: a\n  key_file: b\n  certfile: c\n", 4,
     "unknown key 'certfile'"),
    ("basic_auth_users:\n  alice: hunter2\n", 2, "expected a bcrypt hash"),
    ("tls_server_config:\n  cert_file: {d}/server.crt\n  key_file: {d}/server.key\n"
     "  client_auth_type: RequestClientCert\n", 4, "not supported"),
    ("tls_server_config:\n  cert_file: {d}/server.crt\n  key_file: {d}/server.key\n"
     "  client_auth_type: RequireAndVerifyClientCert\n", 4, "needs client_ca_file"),
    ("tls_server_config:\n  cert_file: {d}/missing.crt\n  key_file: {d}/server.key\n", 2,
     "cannot use cert_file"),
    ("tls_server_config:\n  cert_file: {d}/server.crt\n  key_file: {d}/client.key\n", 2,
     "cannot use cert_file"),
    ("tls_server_config:\n  cert_file: {d}/server.crt\n  key_file: {d}/server.key\n"
     "  min_version: TLS9\n", 4, "not one of TLS10"),
    ("http_server_config:\n  http2: true\n", 2, "HTTP/1.1 only"),
    ("tls_server_config:\n  cert_file: x\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n", 3,
     "cipher_suites"),
    ("- a list\n", 1, "expected a mapping"),
    ("tls_server_config: [\n", 2, "not valid YAML"),
])
def test_bad_web_config_is_refused_at_start_with_its_line(pki, tmp_path, text, line, expected):
    web = tmp_path / "web.yml"
    web.write_text(text.replace("{d}", str(pki)))
    with pytest.raises(UserError) as err:
        load_web_config(str(web))
    assert f"{web}:{line}:" in str(err.value) and expected in str(err.value), str(err.value)
    assert isinstance(err.value, FileFormatError)
    # the daemon refuses to start on it: exit 2, the message, no traceback
    proc = run_gpuwatch(["run", "--web.listen-address", "127.0.0.1:0", "--web.config.file",
                         str(web)], tmp_path)
    assert proc.returncode == 2 and f"{web}:{line}:" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_every_problem_at_once(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  a: plain\n  b: also-plain\nextra: 1\n")
    with pytest.raises(FileFormatError) as err:
        load_web_config(str(web))
    assert [line for line, _ in err.value.problems] == [2, 3, 4]


def test_basic_auth_without_bcrypt_is_a_clear_error(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  a: $2y$10$" + "a" * 53 + "\n")
    code = ("import sys; sys.modules['bcrypt'] = None; from gpuwatch.cli import main; "
            f"sys.exit(main(['run', '--web.listen-address', '127.0.0.1:0', "
            f"'--web.config.file', {str(web)!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=clean_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "needs the bcrypt package" in proc.stderr and "gpuwatch[web]" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_empty_web_config_serves_plain_http(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text("# nothing configured\n")
    server = _server(web)
    try:
        assert server.url.startswith("http://")
        wait_for(lambda: _get(server.url + "/metrics")[0] == 200, "a plain answer", 10)
    finally:
        server.stop()


def test_the_example_in_docs_security_md_loads(pki, tmp_path):
    doc = (REPO / "docs" / "security.md").read_text()
    example = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    for name, ours in (("tls.crt", "server.crt"), ("tls.key", "server.key"),
                       ("scrapers-ca.crt", "ca.crt")):
        example = example.replace(f"/etc/gpuwatch/{name}", str(pki / ours))
    web = tmp_path / "web.yml"
    web.write_text(example)
    config = load_web_config(str(web))
    assert config.tls is not None and config.client_allowed_sans == ("prometheus.example.org",)
    assert config.check_basic_auth("Basic " + base64.b64encode(b"prometheus:example").decode())
