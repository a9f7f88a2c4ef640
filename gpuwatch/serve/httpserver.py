"""The daemon's HTTP surface: /metrics, /api/advice, /api/snapshot, /healthz and an index.

A threaded stdlib server. /metrics renders a registry whose collectors read the store's
latest snapshot, so a scrape never waits on NVML; a slow client holds only its own thread.
"""

from __future__ import annotations

import dataclasses
import errno
import gzip
import html
import http.client
import json
import logging
import math
import selectors
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from gpuwatch import __version__, threads
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
from gpuwatch.serve.config import parse_listen_address
from gpuwatch.serve.webconfig import WebConfig, WebConfigFile

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


def _tuple_or_none(v: Any) -> tuple[Any, ...] | None:
    return None if v is None else tuple(v)


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
        jobs = tuple(JobTree(**{**_known(JobTree, j), "gpus": tuple(j.get("gpus") or ()),
                                "debug_env": _tuple_or_none(j.get("debug_env"))})
                     for j in d.get("jobs") or ())
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


@dataclass(frozen=True)
class Limits:
    """What one client may hold: time per phase of a request, connections, header bytes.

    A slow client (slowloris: one header byte every few seconds) is cut off at the
    deadline of the phase it is in, however it trickles; when ``max_connections`` are
    open, a new client takes the place of the oldest one that is not being answered.
    """

    max_connections: int = 64
    # from a connection's start (or its TLS handshake) to the end of its first request's
    # headers, and from a request's first byte to the end of its headers
    header_timeout: float = 10.0
    idle_timeout: float = 60.0  # a keep-alive connection waiting for its next request
    write_timeout: float = 30.0  # answering one request, the writing included
    max_header_bytes: int = 16 * 1024  # request line and headers together

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_header_bytes < 256:
            raise ValueError(f"unusable HTTP limits: {self}")


class _Conn:
    """One open connection as the server's janitor sees it."""

    __slots__ = ("sock", "state", "deadline", "since", "requests", "killed", "moved")

    def __init__(self, sock: socket.socket, deadline: float,
                 moved: Callable[[], None] = lambda: None) -> None:
        self.sock = sock  # replaced by its TLS socket once wrapped
        self.state = "idle"  # idle | handshake | head | answer
        self.deadline = deadline
        self.since = time.monotonic()
        self.requests = 0
        self.killed = False
        self.moved = moved  # tells the janitor of a deadline brought forward

    def enter(self, state: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        sooner = deadline < self.deadline
        self.state, self.deadline = state, deadline
        if sooner:  # the janitor may be asleep until the later one
            self.moved()

    def kill(self) -> None:
        """Cut the connection under its thread, which then sees EOF and leaves."""
        self.killed = True
        self.deadline = math.inf  # cut once: the janitor does not wait on it again
        try:
            # socket.socket's own shutdown: SSLSocket.shutdown would drop its TLS state
            # under the thread still using it
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)
        except OSError:
            pass


class _HeadTooLarge(http.client.LineTooLong):
    """The request line and headers passed Limits.max_header_bytes (answered 431)."""


class _HeadReader:
    """The request's byte stream, with a budget for the request line and headers.

    http.server reads those by ``readline``; a request is never read further (only GET and
    HEAD are served), so the budget caps everything one request can make us buffer.
    """

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.budget = 0

    def readline(self, limit: int = -1) -> bytes:
        if self.budget < 0:
            raise _HeadTooLarge("request headers")
        want = self.budget + 1 if limit < 0 else min(limit, self.budget + 1)
        line = self.raw.readline(want)
        self.budget -= len(line)
        if self.budget < 0:
            raise _HeadTooLarge("request headers")
        return line

    def peek(self, n: int = 1) -> bytes:
        return self.raw.peek(n)

    def close(self) -> None:
        self.raw.close()


_NO_ROOM = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
            b"Content-Length: 24\r\nConnection: close\r\n\r\ntoo many connections now\n")


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a hung client must not keep the daemon from exiting
    allow_reuse_address = True
    # socketserver's default listen backlog is 5: 64 scrapers connecting at once overflowed
    # it and waited on SYN retries (p99 5.9 s in benchmarks/bench_http.py; 151 ms with 128)
    request_queue_size = 128
    app: HttpServer

    def __init__(self, address: tuple[str, int], handler: type[_Handler],
                 limits: Limits) -> None:
        self.limits = limits
        self.conns: dict[int, _Conn] = {}
        self.conn_threads: set[threading.Thread] = set()
        self.conns_lock = threading.Lock()
        # the janitor sleeps on this until the next deadline (or, with no connection open,
        # until one comes): an idle daemon's server wakes for nothing
        self.deadlines = threading.Condition(self.conns_lock)
        self.stopping = False
        self.refused = 0  # connections turned away because every slot was being answered
        # serve_forever blocks until a connection comes or shutdown() writes here (the
        # stdlib's loop wakes every poll_interval to look for a shutdown request)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self._quit = False
        self._served = threading.Event()
        self._served.set()
        super().__init__(address, handler)

    def serve_forever(self, poll_interval: float | None = None) -> None:
        """Accept connections until shutdown(): socketserver's loop, woken by shutdown()
        itself instead of a timer (``poll_interval`` is not used)."""
        self._served.clear()
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self, selectors.EVENT_READ)
                selector.register(self._wake_r, selectors.EVENT_READ)
                while not self._quit:
                    ready = selector.select()
                    if self._quit:
                        break
                    for key, _ in ready:
                        if key.fileobj is self:
                            self._handle_request_noblock()
                        else:
                            self._drain_wake()
                    self.service_actions()
        finally:
            self._drain_wake()  # a later serve_forever starts without a stale wake-up
            self._quit = False
            self._served.set()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(64, socket.MSG_DONTWAIT):
                pass
        except OSError:  # empty (EAGAIN), or closed
            pass

    def shutdown(self) -> None:
        """Stop serve_forever and wait until it has returned (from another thread)."""
        self._quit = True
        try:
            self._wake_w.send(b"x")
        except OSError:  # a full buffer already holds a wake-up
            pass
        self._served.wait()

    def server_close(self) -> None:
        super().server_close()
        self._wake_r.close()
        self._wake_w.close()

    def next_deadline(self, stop: threading.Event) -> None:
        """Sleep until the soonest connection deadline, a new connection or a deadline
        brought forward (the janitor's wait), or ``stop`` (woken by wake_janitor)."""
        with self.deadlines:
            if stop.is_set():
                return
            soonest = min((c.deadline for c in self.conns.values()), default=math.inf)
            wait = soonest - time.monotonic()
            if wait > 0:
                self.deadlines.wait(None if wait == math.inf else wait)

    def wake_janitor(self) -> None:
        with self.deadlines:
            self.deadlines.notify_all()

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

    # -- connections ----------------------------------------------------------------------
    def process_request(self, request: Any, client_address: Any) -> None:
        conn = _Conn(request, time.monotonic() + self.limits.header_timeout, self.wake_janitor)
        with self.conns_lock:
            if self.stopping:
                self.shutdown_request(request)
                return
            if len(self.conns) >= self.limits.max_connections:
                waiting = [c for c in self.conns.values() if c.state != "answer"]
                if not waiting:
                    self.refused += 1
                    _refuse(request)
                    self.shutdown_request(request)
                    return
                # the oldest connection not being answered makes room: an attacker's idle
                # or trickling connections can't keep a scrape out
                oldest = min(waiting, key=lambda c: c.since)
                del self.conns[id(oldest)]
                oldest.kill()
            self.conns[id(conn)] = conn
            self.deadlines.notify_all()
            thread = threads.Thread(target=self._serve_conn, args=(conn, client_address),
                                    name="gpuwatch-http-conn", daemon=True)
            # a thread stays in the set until it has ended, not until its connection has:
            # a stop joins it after its socket is closed, so none outlives the stop
            self.conn_threads = {t for t in self.conn_threads if t.is_alive()}
            self.conn_threads.add(thread)
        thread.start()

    def _serve_conn(self, conn: _Conn, client_address: Any) -> None:
        try:
            self.RequestHandlerClass(conn, client_address, self)
        except Exception:
            self.handle_error(conn.sock, client_address)
        finally:
            with self.conns_lock:
                self.conns.pop(id(conn), None)
            self.shutdown_request(conn.sock)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback per failed connection; a client that resets,
        # times out or fails its TLS handshake is not the daemon's problem
        err = sys.exc_info()[1]
        if isinstance(err, OSError):
            log.debug("connection from %s ended: %s", client_address[0], err)
        else:
            log.error("error serving %s: %r", client_address[0], err, exc_info=True)

    def sweep(self) -> None:
        """Cut connections past their phase's deadline (the janitor thread, or a test)."""
        now = time.monotonic()
        with self.conns_lock:
            late = [c for c in self.conns.values() if c.deadline <= now]
        for conn in late:
            log.debug("closing a connection %s for %.0f s", conn.state, now - conn.since)
            conn.kill()

    def begin_stop(self) -> None:
        """No new connections; connections waiting for a request see EOF at once."""
        with self.conns_lock:
            self.stopping = True
            conns = list(self.conns.values())
        for conn in conns:
            try:
                # reading side only: an answer being written still goes out whole
                socket.socket.shutdown(conn.sock, socket.SHUT_RD)
            except OSError:
                pass

    def wait_conns(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.conns_lock:
            serving = list(self.conn_threads)
        for thread in serving:
            if thread.ident is not None:  # started (the accept loop has ended before this)
                thread.join(max(0.0, deadline - time.monotonic()))
        with self.conns_lock:
            left = list(self.conns.values())
        for conn in left:  # still writing to a reader that does not read: cut it
            conn.kill()


def _refuse(sock: socket.socket) -> None:
    try:
        sock.setblocking(False)
        sock.send(_NO_ROOM)
    except OSError:
        pass


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = f"gpuwatch/{__version__}"
    protocol_version = "HTTP/1.1"
    # an unparsable request line still gets a status line (HTTP/0.9 answers have none)
    default_request_version = "HTTP/1.0"
    # each blocking socket call gives up after this long; the janitor's deadlines (Limits)
    # bound whole phases, however a client trickles
    timeout = 30

    # -- connection and request framing ------------------------------------------------
    def setup(self) -> None:
        self.conn: _Conn = self.request  # _Server._serve_conn hands us its _Conn
        self.request = self.conn.sock
        self._response_started = False
        # the web config as of this connection's start: a rotated certificate or a changed
        # password applies from the next connection on
        web = self.server.app.web
        self.web: WebConfig | None = web.current() if web is not None else None
        if self.web is not None and self.web.tls is not None:
            self._handshake(self.web)
        super().setup()
        self.rfile = _HeadReader(self.rfile)  # type: ignore[assignment]

    def _handshake(self, web: WebConfig) -> None:
        """TLS on this thread (a slow handshake holds no one else), under the header deadline."""
        assert web.tls is not None
        self.conn.state = "handshake"
        raw = self.request
        raw.settimeout(self.timeout)
        tls = web.tls.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
        self.conn.sock = self.request = tls
        tls.do_handshake()
        if not web.san_allowed(tls.getpeercert()):
            raise ssl.SSLError("the client certificate names none of client_allowed_sans")

    def handle_one_request(self) -> None:
        server, conn = self.server, self.conn
        limits = server.limits
        self._response_started = False
        # the first request has the header deadline from the connection's start
        if conn.requests:
            conn.enter("idle", limits.idle_timeout)
        try:
            if not self.rfile.peek(1) or conn.killed or server.stopping:
                self.close_connection = True
                return
            if conn.requests:
                conn.enter("head", limits.header_timeout)
            else:
                conn.state = "head"
            self.rfile.budget = limits.max_header_bytes
            try:
                self.raw_requestline = self.rfile.readline(65537)
            except _HeadTooLarge:
                self.requestline = self.request_version = self.command = ""
                self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
                return
            if not self.raw_requestline or conn.killed:
                self.close_connection = True
                return
            if not self.parse_request():  # the stdlib answered 400, 431 or 505
                self.close_connection = True
                return
            if conn.killed:
                self.close_connection = True
                return
            conn.requests += 1
            conn.enter("answer", limits.write_timeout)
            if self.headers.get("Content-Length", "0") not in ("", "0") or \
                    "Transfer-Encoding" in self.headers:
                self.close_connection = True  # a body we won't read can't stay in the stream
            if self.command not in ("GET", "HEAD"):
                self._send_json(405, {"error": f"method {self.command} not allowed"},
                                {"Allow": "GET, HEAD"})
                self.close_connection = True
                return
            if self.web is not None and \
                    self.web.check_basic_auth(self.headers.get("Authorization")) is None:
                self._send_json(401, {"error": "unauthorized"},
                                {"WWW-Authenticate": 'Basic realm="gpuwatch", charset="UTF-8"'})
                return
            self.do_GET()
            self.wfile.flush()
        except OSError as err:  # reset, broken pipe, a timeout: this connection is done
            log.debug("connection from %s ended: %s", self.client_address[0], err)
            self.close_connection = True
        finally:
            if server.stopping:
                self.close_connection = True

    def send_response_only(self, code: int, message: str | None = None) -> None:
        self._response_started = True
        super().send_response_only(code, message)

    # -- the pages ---------------------------------------------------------------------------
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
        except OSError as err:  # the client went away or stopped reading; nothing to answer
            log.debug("answering %s to %s: %s", path, self.client_address[0], err)
            self.close_connection = True
        except Exception as err:  # one bad request must not kill the server
            if self._response_started:
                # part of an answer is out: a 500 now would read as the rest of it
                log.error("error answering %s after the headers were sent; connection "
                          "closed: %r", path, err)
                self.close_connection = True
                return
            log.exception("error answering %s", path)
            self._send_json(500, {"error": f"internal error: {err!r}"})

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

    def _send_json(self, status: int, data: Any,
                   headers: Mapping[str, str] | None = None) -> None:
        body = json.dumps(_plain(data), allow_nan=False, default=str).encode()
        self._send(status, body, "application/json", headers)

    def _send(self, status: int, body: bytes, content_type: str,
              headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.web is not None:
            for k, v in self.web.headers.items():
                self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
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
                 description: str = "", limits: Limits | None = None,
                 web: WebConfigFile | None = None) -> None:
        self.listen_address = listen_address
        self.registry = registry
        self.snapshot = snapshot
        self.advice = advice
        self.health: HealthCheck = health or (lambda: (True, "ok"))
        self.description = description
        self.limits = limits or Limits()
        self.web = web  # TLS and basic auth (--web.config.file); None: plain HTTP
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._janitor: threading.Thread | None = None
        self._stop = threading.Event()

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
        scheme = "https" if self.web is not None and self.web.current().tls else "http"
        return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"

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
                server = server_cls((bind_host, port), _Handler, self.limits)
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
        server = self._server
        assert server is not None
        self._stop.clear()
        self._thread = threads.Thread(target=server.serve_forever,
                                      name="gpuwatch-http", daemon=True)
        self._thread.start()
        self._janitor = threads.Thread(target=self._sweep, args=(server,),
                                       name="gpuwatch-http-janitor", daemon=True)
        self._janitor.start()

    def _sweep(self, server: _Server) -> None:
        while not self._stop.is_set():
            server.next_deadline(self._stop)
            server.sweep()

    def stop(self) -> None:
        """Stop accepting, end idle keep-alive connections, let answers in flight finish."""
        server, self._server = self._server, None
        if server is None:
            return
        server.begin_stop()
        if self._thread is not None:
            server.shutdown()
            self._thread.join(timeout=5)
        server.server_close()
        server.wait_conns(timeout=2.0)
        self._stop.set()
        server.wake_janitor()
        if self._janitor is not None:
            self._janitor.join(timeout=2)
