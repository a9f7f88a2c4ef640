"""``/metrics`` under concurrent scrapes: throughput, latency percentiles, errors.

    python3 benchmarks/bench_http.py [--seconds 10] [--concurrency 16 64] [--client wrk|python]

Two daemons, each a process of its own (so the load client never shares its interpreter):

- **replay**: ``gpuwatch run --replay tests/data/h200_tuned_b128.jsonl`` (a recorded H200
  training run: GPU, host and training series);
- **stub-8**: the real daemon sampling 8 stubbed GPUs (tests/nvml_stub.py), each with four
  processes, every 0.1 s, so scrapes race the ticks.

Each is hammered at each concurrency with ``wrk`` (keep-alive connections, ``--latency``)
when it is installed, else with the Python client here (one keep-alive connection per
worker thread; slower, so its figures are the client's limit as much as the daemon's).
Every response must be a 200 with a complete exposition; the table counts anything else as
an error, and the daemon's log lines during the run (a traceback per reset connection was
once the norm). Prints a Markdown table; ``--out FILE`` also writes JSON.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SERVING = re.compile(r"serving (http://\S+)/metrics")


def serve_stub(gpus: int) -> None:
    """This process becomes the stub-NVML daemon (``--serve-stub N``)."""
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "tests"))
    from nvml_stub import NvmlStub, StubGpu

    from gpuwatch import logs
    from gpuwatch.daemon import Daemon
    from gpuwatch.serve.config import Config

    logs.setup("info")
    me = os.getpid()
    stub = NvmlStub([StubGpu(i, processes=[(me, 2**30), (1, 2**29), (me + 10_000 + i, 2**28),
                                           (me + 20_000 + i, 2**27)],
                             process_util=[(me, 50)]) for i in range(gpus)])
    config = Config(listen_address="127.0.0.1:0", interval=0.1, slow_interval=1.0,
                    hook_socket=os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                             f"gpuwatch-bench-{me}.sock"))
    daemon = Daemon(config, sampler_kwargs={"nvml_module": stub})
    daemon.start()
    print(f"gpuwatch: serving {daemon.url}/metrics (stub, {gpus} GPUs)", file=sys.stderr,
          flush=True)
    daemon.serve_forever()


class Server:
    def __init__(self, name: str, argv: list[str]) -> None:
        self.name = name
        self.lines: list[str] = []
        self.proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        threading.Thread(target=self._pump, daemon=True).start()
        deadline = time.monotonic() + 60
        self.url = ""
        while not self.url:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"{name} did not start:\n{''.join(self.lines)}")
            m = SERVING.search("".join(self.lines))
            self.url = m.group(1) if m else ""
            time.sleep(0.1)
        time.sleep(1.0)  # a few ticks in: full expositions

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_wrk(url: str, connections: int, seconds: float) -> dict[str, Any]:
    threads = max(1, min(connections, os.cpu_count() or 1))
    out = subprocess.run(["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s",
                          "--timeout", "10s", "--latency", url + "/metrics"],
                         capture_output=True, text=True, check=True).stdout

    def ms(text: str) -> float:
        value, unit = re.match(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
        return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]

    pct = {p: ms(v) for p, v in re.findall(r"^\s+(50|75|90|99)%\s+(\S+)", out, re.MULTILINE)}
    errors = 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        errors += sum(int(g) for g in m.groups())
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        errors += int(m.group(1))
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    return {"requests": requests, "rps": rate, "p50_ms": pct.get("50"),
            "p90_ms": pct.get("90"), "p99_ms": pct.get("99"), "errors": errors}


def run_python(url: str, connections: int, seconds: float) -> dict[str, Any]:
    host_port = url.removeprefix("http://")
    host, port = host_port.rsplit(":", 1)
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def worker() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        mine: list[float] = []
        bad = 0
        while time.monotonic() < end:
            start = time.perf_counter()
            try:
                conn.request("GET", "/metrics")
                resp = conn.getresponse()
                body = resp.read()
                if resp.status != 200 or b"gpuwatch_up 1.0" not in body:
                    bad += 1
            except (OSError, http.client.HTTPException):
                bad += 1
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=10)
                continue
            mine.append((time.perf_counter() - start) * 1e3)
        conn.close()
        with lock:
            latencies.extend(mine)
            errors[0] += bad

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [float("nan")] * 99
    return {"requests": len(latencies), "rps": len(latencies) / elapsed, "p50_ms": q[49],
            "p90_ms": q[89], "p99_ms": q[98], "errors": errors[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    p.add_argument("--client", choices=["wrk", "python"],
                   default="wrk" if shutil.which("wrk") else "python")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--replay", default=str(REPO / "tests" / "data" / "h200_tuned_b128.jsonl"))
    p.add_argument("--out", help="also write the results as JSON here")
    p.add_argument("--serve-stub", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_stub:
        serve_stub(args.serve_stub)
        return
    run = run_wrk if args.client == "wrk" else run_python
    servers = [
        ("replay", [sys.executable, "-m", "gpuwatch", "run", "--replay", args.replay,
                    "--web.listen-address", "127.0.0.1:0"]),
        (f"stub-{args.gpus}", [sys.executable, str(Path(__file__).resolve()), "--serve-stub",
                               str(args.gpus)]),
    ]
    results = []
    for name, argv in servers:
        server = Server(name, argv)
        try:
            conn = http.client.HTTPConnection(server.url.removeprefix("http://"), timeout=10)
            conn.request("GET", "/metrics")
            body = conn.getresponse().read()
            series = sum(1 for ln in body.decode().splitlines() if ln and ln[0] != "#")
            for c in args.concurrency:
                before = len(server.lines)
                r = run(server.url, c, args.seconds)
                r.update(daemon=name, concurrency=c, series=series, bytes=len(body),
                         log_lines=len(server.lines) - before, client=args.client)
                results.append(r)
                print(f"{name} c={c}: {r['rps']:.0f} req/s p99 {r['p99_ms']:.1f} ms "
                      f"errors {r['errors']}", file=sys.stderr)
        finally:
            server.stop()
    print(f"\nclient: {args.client}, {args.seconds:g} s per row, {os.cpu_count()} CPUs\n")
    print("| daemon | series | body KB | concurrent | req/s | p50 ms | p90 ms | p99 ms | "
          "errors | daemon log lines |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['daemon']} | {r['series']} | {r['bytes'] / 1024:.0f} | {r['concurrency']} "
              f"| {r['rps']:.0f} | {r['p50_ms']:.1f} | {r['p90_ms']:.1f} | {r['p99_ms']:.1f} "
              f"| {r['errors']} | {r['log_lines']} |")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
