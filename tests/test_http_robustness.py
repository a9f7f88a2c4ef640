"""The HTTP server against clients that misbehave: resets, slow readers and writers,
oversized headers, unknown paths and methods, keep-alive across a stop.

Each test uses real sockets against an in-process server and checks that the server keeps
answering everyone else afterwards.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for
from prometheus_client import CollectorRegistry, Gauge

from gpuwatch.serve.httpserver import HttpServer, Limits

LOGGER = "gpuwatch.serve.httpserver"


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Gauge("demo_value", "a value", registry=registry).set(1)
    return registry


@pytest.fixture
def serve() -> Iterator:
    started: list[HttpServer] = []

    def start(**kw) -> HttpServer:
        server = HttpServer("127.0.0.1:0", registry=_registry(), **kw)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _get(server: HttpServer, path: str = "/metrics") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _raw(server: HttpServer, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` on a fresh connection; everything the server says until it closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def _reset(sock: socket.socket) -> None:
    # linger 0: close() sends RST instead of FIN
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _closed_by_peer(sock: socket.socket, within: float) -> bool:
    """True when the server closes ``sock`` within ``within`` seconds (EOF or reset)."""
    sock.settimeout(within)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _http_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "gpuwatch-http-conn")


# -- resets ---------------------------------------------------------------------------

def test_clients_that_reset_leave_no_traceback(serve, caplog, capfd):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    server = serve(advice=lambda: {"big": "x" * 4_000_000})
    resets = 20
    for _ in range(resets):
        # reset while the server reads the headers
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.005)
        _reset(s)
        # reset while it writes a large answer
        s = socket.create_connection(("127.0.0.1", server.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"GET /api/advice HTTP/1.1\r\nHost: x\r\n\r\n")
        s.recv(100)
        _reset(s)
    assert _get(server)[0] == 200
    wait_for(lambda: _http_threads() == 0, "the reset connections' threads to end", 10)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err, err
    ours = [r for r in caplog.records if r.name == LOGGER]
    assert all(r.levelno <= logging.DEBUG for r in ours), [r.getMessage() for r in ours]
    assert all(r.exc_info is None for r in ours)
    # at most one line per reset connection
    assert len([r for r in ours if "ended" in r.getMessage()]) <= 2 * resets


def test_a_reader_that_stalls_mid_answer_gets_no_500_appended(serve, caplog, capfd):
    """A write that times out after the headers went out closes the connection: the client
    sees a short body and EOF, never a 500 glued to it, and the log has no traceback."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    server = serve(advice=lambda: {"big": "x" * 20_000_000},
                   limits=Limits(write_timeout=1.0))
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", server.port))
    s.sendall(b"GET /api/advice HTTP/1.1\r\nHost: x\r\n\r\n")
    # not reading: the server's write blocks, then its deadline passes
    time.sleep(2.5)
    assert _get(server, "/healthz")[0] == 200  # everyone else is served meanwhile
    s.settimeout(10)
    received = bytearray()
    while True:
        try:
            chunk = s.recv(1 << 20)
        except ConnectionResetError:
            break
        if not chunk:
            break
        received += chunk
    s.close()
    head, _, body = bytes(received).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    length = int([h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0]
                 .split(b":")[1])
    assert len(body) < length  # cut short ...
    assert b"HTTP/1.1 500" not in body and b"internal error" not in body  # ... and nothing added
    assert "Traceback" not in capfd.readouterr().err
    assert not [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


# -- keep-alive and stop -----------------------------------------------------------------

def test_keep_alive_connection_is_not_served_after_stop(serve):
    server = serve()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("GET", "/healthz")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Connection") != "close"
    resp.read()
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 3  # the idle keep-alive does not hold the stop
    with pytest.raises((http.client.HTTPException, OSError)):
        conn.request("GET", "/healthz")
        conn.getresponse().read()
    conn.close()
    assert _http_threads() == 0


def test_an_answer_in_flight_at_stop_is_finished(serve):
    gate = threading.Event()

    def slow_advice() -> dict:
        gate.wait(5)
        return {"done": True}

    server = serve(advice=slow_advice)
    result: dict = {}

    def fetch() -> None:
        result["answer"] = _get(server, "/api/advice")

    t = threading.Thread(target=fetch)
    t.start()
    time.sleep(0.3)  # the request is being answered
    stopper = threading.Thread(target=server.stop)
    stopper.start()
    time.sleep(0.2)
    gate.set()
    t.join(10)
    stopper.join(10)
    status, body = result["answer"]
    assert status == 200 and json.loads(body) == {"done": True}


# -- slow and idle clients --------------------------------------------------------------

def _trickled_until_cut(s: socket.socket, seconds: float) -> bool:
    """Send one header byte every 0.2 s (each read succeeds, the head never ends) until
    the server cuts the connection (True) or ``seconds`` pass (False); closes ``s``."""
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            try:
                s.sendall(b"X")
            except OSError:
                return True
            if _closed_by_peer(s, 0.2):
                return True
        return False
    finally:
        s.close()


def test_a_trickling_client_is_cut_off_at_the_header_deadline(serve):
    server = serve(limits=Limits(header_timeout=1.0))
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"GET /metrics HTTP/1.1\r\n")
    assert _trickled_until_cut(s, 6), "a slowloris connection was kept open past the header deadline"
    assert _get(server)[0] == 200


def test_an_idle_keep_alive_connection_is_closed(serve):
    server = serve(limits=Limits(idle_timeout=1.0))
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    assert _closed_by_peer(s, 5.0)
    s.close()


def test_a_kept_alive_connection_that_trickles_its_next_request_is_cut_at_its_header_deadline(
        serve):
    """The janitor sleeps until the soonest deadline it knows of. A keep-alive connection
    waits under the idle deadline (a minute here); once its next request begins, the
    header deadline (1 s) is sooner, and the janitor must be told of it: it is cut then,
    not when the idle minute would have ended."""
    server = serve(limits=Limits(header_timeout=1.0, idle_timeout=60.0))
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    time.sleep(0.3)  # idle between requests: the janitor asleep until the idle deadline
    s.sendall(b"GET /metrics HTTP/1.1\r\n")
    assert _trickled_until_cut(s, 10), "the trickling second request outlived its header deadline"
    assert _get(server)[0] == 200


def _switches(tid: int) -> int:
    """How many times thread ``tid`` of this process has gone to sleep (Linux)."""
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


def test_an_idle_server_wakes_for_nothing(serve):
    """Between scrapes the accept loop and the janitor sleep until a connection comes
    (they used to poll, every 0.2 s and 0.25 s): over 2 s of nothing neither thread goes
    back to sleep even once (each wake-up ends in one voluntary context switch), and a
    request is still served after."""
    if not Path("/proc/self/task").is_dir():
        pytest.skip("needs Linux's /proc")
    server = serve()
    assert _get(server)[0] == 200
    time.sleep(0.5)  # the connection's thread has ended; the janitor waits with no deadline
    ours = {t.name: t.native_id for t in threading.enumerate()
            if t.name in ("gpuwatch-http", "gpuwatch-http-janitor")}
    assert len(ours) == 2, ours
    before = {name: _switches(tid) for name, tid in ours.items()}
    time.sleep(2.0)
    woke = {name: _switches(tid) - before[name] for name, tid in ours.items()}
    assert woke == {"gpuwatch-http": 0, "gpuwatch-http-janitor": 0}
    assert _get(server)[0] == 200


def test_many_slow_connections_do_not_keep_a_scrape_out(serve):
    limits = Limits(max_connections=8, header_timeout=30.0)
    server = serve(limits=limits)
    held = []
    for _ in range(40):  # never finish their headers
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        held.append(s)
    try:
        started = time.monotonic()
        status, body = _get(server)
        assert status == 200 and b"demo_value 1.0" in body
        assert time.monotonic() - started < 5
        # threads and connections stay bounded: the oldest trickling ones made room (an
        # evicted connection's thread ends just after its socket is shut: allow a moment)
        deadline = time.monotonic() + 5
        while _http_threads() > limits.max_connections + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _http_threads() <= limits.max_connections + 1
    finally:
        for s in held:
            s.close()


# -- bad requests ----------------------------------------------------------------------------

def test_oversized_headers_are_refused_with_431(serve):
    server = serve()
    # 40 headers of 1 KB: each line and the count are within the stdlib's limits
    many = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 1000) for i in range(40))
    answer = _raw(server, b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 431"), answer[:100]
    answer = _raw(server, b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 414"), answer[:100]
    assert _get(server)[0] == 200


def test_unknown_paths_are_404_and_methods_405(serve):
    server = serve()
    assert _get(server, "/nope")[0] == 404
    head = _raw(server, b"HEAD /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404")
    for method in (b"POST", b"DELETE", b"PUT", b"BREW", b"OPTIONS"):
        answer = _raw(server, method + b" /metrics HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Length: 5\r\n\r\nhello")
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 405"), answer[:100]
        assert b"Allow: GET, HEAD" in head
        assert "not allowed" in json.loads(body)["error"]
    garbage = _raw(server, b"\x16\x03\x01\x02\x00garbage\r\n\r\n")
    assert garbage.startswith(b"HTTP/1.1 400") or garbage == b""
    assert _get(server)[0] == 200
