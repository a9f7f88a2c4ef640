"""The daemon's HTTP surface: /metrics, /api/advice, /api/snapshot, /healthz and an index.

A threaded stdlib server. /metrics renders a registry whose collectors read the store's
latest snapshot, so a scrape never waits on NVML; a slow client holds only its own thread.
"""

from __future__ import annotations

import dataclasses
import errno
import gzip
import html
import json
import logging
import math
import socket
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from gpuwatch import __version__
from gpuwatch.config import parse_listen_address
from gpuwatch.errors import UserError
from gpuwatch.samples import (
    GpuInfo,
    GpuProcess,
    GpuSample,
    Health,
    HostSample,
    JobStats,
    JobTree,
    Snapshot,
)

log = logging.getLogger(__name__)

AdviceSource = Callable[[], Mapping[str, Any]]
HealthCheck = Callable[[], tuple[bool, str]]


# -- snapshot <-> JSON ---------------------------------------------------------------

def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):  # NaN and inf are not JSON
        return None
    return value


def snapshot_to_dict(snapshot: Snapshot) -> dict[str, Any]:
    """The snapshot as plain JSON-able data, field names as in samples.py (the trace's)."""
    return _plain(snapshot)


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    # ignore fields a newer daemon may add
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def snapshot_from_dict(data: Mapping[str, Any]) -> Snapshot:
    """Inverse of :func:`snapshot_to_dict` (for clients of /api/snapshot)."""
    def info(d: Mapping[str, Any]) -> GpuInfo:
        d = _known(GpuInfo, d)
        cc = d.get("compute_capability")
        return GpuInfo(**{**d, "compute_capability": tuple(cc) if cc else None})

    def gpu(d: Mapping[str, Any]) -> GpuSample:
        d = _known(GpuSample, d)
        procs = tuple(GpuProcess(**_known(GpuProcess, p)) for p in d.get("processes") or ())
        xid = {int(k): int(v) for k, v in (d.get("xid_total") or {}).items()}
        return GpuSample(**{**d, "processes": procs, "xid_total": xid})

    def host(d: Mapping[str, Any]) -> HostSample:
        d = _known(HostSample, d)
        jobs = tuple(JobTree(**_known(JobTree, j)) for j in d.get("jobs") or ())
        return HostSample(**{**d, "cpu_util_per_core": tuple(d.get("cpu_util_per_core") or ()),
                             "jobs": jobs})

    health = _known(Health, data.get("health") or {})
    return Snapshot(
        t=float(data.get("t", 0.0)),
        gpus=tuple(gpu(g) for g in data.get("gpus") or ()),
        infos=tuple(info(i) for i in data.get("infos") or ()),
        host=host(data["host"]) if data.get("host") else None,
        jobs=tuple(JobStats(**_known(JobStats, j)) for j in data.get("jobs") or ()),
        health=Health(**health),
        nvml_available=bool(data.get("nvml_available", True)),
    )


# -- the server -----------------------------------------------------------------------

_INDEX = """<!doctype html>
<html><head><meta charset="utf-8"><title>gpuwatch</title></head>
<body><h1>gpuwatch {version}</h1>
<p>{what}</p>
<ul>
<li><a href="/metrics">/metrics</a>: Prometheus exposition</li>
<li><a href="/api/advice">/api/advice</a>: the advisor's report (JSON)</li>
<li><a href="/api/snapshot">/api/snapshot</a>: the latest sample of every GPU and the host (JSON)</li>
<li><a href="/healthz">/healthz</a>: liveness</li>
</ul></body></html>
"""


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a hung client must not keep the daemon from exiting
    allow_reuse_address = True
    app: HttpServer

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves our own FQDN, which can stall for seconds on
        # hosts with slow DNS; the name is never used, so bind without it
        if self.address_family == socket.AF_INET6:
            # ':PORT' binds '::' and should serve IPv4 too
            try:
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            except OSError:
                pass
        self.socket.bind(self.server_address)
        self.server_address = self.socket.getsockname()
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = f"gpuwatch/{__version__}"
    protocol_version = "HTTP/1.1"
    # an idle keep-alive connection gives its thread back after this long
    timeout = 120

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        app = self.server.app
        try:
            if path == "/metrics":
                self._metrics(app)
            elif path == "/api/advice":
                self._advice(app)
            elif path == "/api/snapshot":
                self._send_json(200, snapshot_to_dict(app.snapshot()))
            elif path == "/healthz":
                ok, message = app.health()
                self._send(200 if ok else 503, (message + "\n").encode(),
                           "text/plain; charset=utf-8")
            elif path in ("/", "/index.html"):
                body = _INDEX.format(version=html.escape(__version__),
                                     what=html.escape(app.description))
                self._send(200, body.encode(), "text/html; charset=utf-8")
            else:
                self._send_json(404, {"error": f"no such page: {path}"})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away; nothing to answer
        except Exception as err:  # one bad request must not kill the server
            log.exception("error answering %s", path)
            try:
                self._send_json(500, {"error": f"internal error: {err!r}"})
            except OSError:
                pass

    def _metrics(self, app: HttpServer) -> None:
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        body = encoder(app.registry)
        headers = {}
        if gzip_accepted(self.headers.get("Accept-Encoding", "")):
            body = gzip.compress(body, compresslevel=5)
            headers["Content-Encoding"] = "gzip"
        self._send(200, body, content_type, headers)

    def _advice(self, app: HttpServer) -> None:
        if app.advice is None:
            self._send_json(503, {"error": "the advisor is not running in this daemon"})
            return
        try:
            report = app.advice()
        except Exception as err:  # report the failure, stay up
            log.exception("the advisor failed to report")
            self._send_json(503, {"error": f"the advisor failed: {err!r}"})
            return
        self._send_json(200, dict(report))

    def _send_json(self, status: int, data: Any) -> None:
        body = json.dumps(_plain(data), allow_nan=False, default=str).encode()
        self._send(status, body, "application/json")

    def _send(self, status: int, body: bytes, content_type: str,
              headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        # one stderr line per scrape would drown the daemon's own log
        log.debug("%s %s", self.address_string(), format % args)


class HttpServer:
    """Serves one registry and the JSON APIs on ``listen_address`` from a background thread.

    ``advice`` returns the advisor's report (None: /api/advice answers 503); ``snapshot``
    returns the latest Snapshot; ``health`` says whether the daemon is healthy, and why not.
    """

    def __init__(self, listen_address: str, *, registry: CollectorRegistry,
                 snapshot: Callable[[], Snapshot] = lambda: Snapshot(t=0.0),
                 advice: AdviceSource | None = None,
                 health: HealthCheck | None = None,
                 description: str = "") -> None:
        self.listen_address = listen_address
        self.registry = registry
        self.snapshot = snapshot
        self.advice = advice
        self.health: HealthCheck = health or (lambda: (True, "ok"))
        self.description = description
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The URL a client on this host can reach (a wildcard bind answers on loopback)."""
        if self._server is None:
            raise RuntimeError("the server is not started")
        host, port = self._server.server_address[:2]
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1" if self._server.address_family == socket.AF_INET6 and \
                self._v6only() else "127.0.0.1"
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the server is not started")
        return int(self._server.server_address[1])

    def _v6only(self) -> bool:
        assert self._server is not None
        try:
            return bool(self._server.socket.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY))
        except OSError:
            return True

    def bind(self) -> None:
        """Bind the listening socket (errors are UserErrors naming the address)."""
        host, port = parse_listen_address(self.listen_address)
        candidates: list[tuple[socket.AddressFamily, str]]
        if host == "":
            candidates = [(socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")]
            if not socket.has_ipv6:
                candidates = candidates[1:]
        else:
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                           flags=socket.AI_PASSIVE)
            except socket.gaierror as err:
                raise UserError(f"cannot listen on {self.listen_address}: unknown host "
                                f"{host!r} ({err.strerror})") from err
            candidates = [(family, addr[0]) for family, _, _, _, addr in infos
                          if family in (socket.AF_INET, socket.AF_INET6)][:1]
        last: OSError | None = None
        for family, bind_host in candidates:
            server_cls = type("_BoundServer", (_Server,), {"address_family": family})
            try:
                server = server_cls((bind_host, port), _Handler)
            except OSError as err:
                last = err
                # a wildcard bind falls back to IPv4 only where IPv6 is missing, not when
                # the port is taken
                if err.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL) and host == "":
                    continue
                break
            server.app = self
            self._server = server
            return
        reason = (last.strerror or str(last)) if last else "no usable address"
        hint = " (is another gpuwatch or exporter running there?)" \
            if last is not None and last.errno == errno.EADDRINUSE else ""
        raise UserError(f"cannot listen on {self.listen_address}: {reason}{hint}") from last

    def start(self) -> None:
        if self._server is None:
            self.bind()
        assert self._server is not None
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.2},
                                        name="gpuwatch-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        if self._thread is not None:
            server.shutdown()
            self._thread.join(timeout=5)
        server.server_close()

