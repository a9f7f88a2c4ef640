#!/usr/bin/env python3
"""Many ranks reporting to one daemon: what the hook's datagrams cost it, and whether any
is lost.

Run from the repository root (no GPU needed):

    python3 benchmarks/bench_receiver.py                        # 64 ranks, 50 steps/s each
    python3 benchmarks/bench_receiver.py --ranks 128 --steps-per-second 200 --seconds 30

Starts the real daemon (``gpuwatch run`` with tests/scripts/stub_daemon.py standing in 8
stub GPUs for the driver, ``--interval 1``, its hook socket in a temporary directory) and
watches its CPU (psutil, % of one core) for ``--seconds`` with nothing reporting. Then
``--ranks`` sender processes report to its socket exactly as the torch hook does
(gpuwatch/job/hook/core.py): a real Unix datagram socket, non-blocking ``sendto``, one
``gpuwatch.job.protocol`` report every 0.5 s carrying that half second's steps (window
sums, per-step columns, cumulative counters, the configuration in the first), all ranks
in step as data-parallel ranks are. The daemon's CPU is watched again over the same time,
and what was sent is compared with what the daemon counted (``/metrics``:
``gpuwatch_hook_messages_total`` and ``gpuwatch_hook_messages_dropped_total``) and with
what the senders could not send (the socket's queue full: ``busy``).

A Unix datagram socket queues at most ``net.unix.max_dgram_qlen`` datagrams (Linux's
default is 10; systemd sets 512 in its sysctl.d defaults): ranks in step send their
reports at the same moment, so a short queue overflows before the receiver wakes. Each
``--qlen`` runs the whole measurement (daemon and senders) in a network namespace of its
own with that limit (root and util-linux's ``unshare``; no ``ip`` or ``sysctl`` needed;
the host's setting is left alone); ``--spread``
gives each rank its own phase in the report interval instead, and ``--hook`` has the ranks
send as the torch hook does (gpuwatch/job/sender.py: a random start of its own, a full
queue tried again after a few milliseconds).

The CPU per datagram is the daemon's CPU above idle over the datagrams it accepted per
second (``gpuwatch_hook_messages_total``), not over the nominal rate.

Prints a Markdown table; ``--out FILE`` writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuwatch.job import protocol  # noqa: E402 - after the path
from gpuwatch.job import sender as hook_sender  # noqa: E402
from gpuwatch.job.sender import REPORT_INTERVAL  # noqa: E402

GPUS = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(url: str) -> dict[str, float]:
    """The hook counters of the daemon's /metrics: accepted, and dropped by reason."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        body = resp.read().decode()
    out: dict[str, float] = {}
    for line in body.splitlines():
        m = re.match(r'^(gpuwatch_hook_messages(?:_dropped)?_total)(\{[^}]*\})? (\S+)$', line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def sender(rank: int, ranks: int, path: str, start: float, seconds: float,
           steps_per_second: int, out: Any, phase: float = 0.0, hook: bool = False) -> None:
    """One rank: a report every REPORT_INTERVAL with the steps of that interval, ``phase``
    seconds into it; with ``hook``, sent as the hook sends (gpuwatch.job.sender: its own
    random phase, a full queue tried again)."""
    if hook:
        phase = hook_sender.report_offset()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setblocking(False)
    per_report = max(1, round(steps_per_second * REPORT_INTERVAL))
    step_seconds = 1.0 / steps_per_second
    pid, seq, steps_total = os.getpid(), 0, 0
    sent = busy = 0
    config = {"world_size": ranks, "batch_size": 64, "num_workers": 4, "pin_memory": True,
              "persistent_workers": True, "fused_optimizer": True}
    k = 1
    while True:
        due = start + k * REPORT_INTERVAL + phase
        if due > start + seconds:
            break
        delay = due - time.time()
        if delay > 0:
            time.sleep(delay)
        now = time.time()
        records = [protocol.StepRecord(
            step=steps_total + i, t=now - (per_report - 1 - i) * step_seconds,
            step_seconds=step_seconds, data_wait_seconds=step_seconds * 0.05, batch_size=64,
            skipped=False, loss=2.5 if i == per_report - 1 else None)
            for i in range(per_report)]
        steps_total += per_report
        header = {
            "kind": "report", "pid": pid, "seq": seq, "t": now, "rank": rank,
            "local_rank": rank % GPUS, "world_size": ranks, "gpu": rank % GPUS,
            "steps_total": steps_total, "skipped_total": 0,
            "window": {"steps": per_report, "skipped": 0, "timed": per_report,
                       "step_seconds": per_report * step_seconds,
                       "data_wait_seconds": per_report * step_seconds * 0.05,
                       "samples": per_report * 64, "sample_seconds": per_report * step_seconds,
                       "iterators": 0, "first_batch_wait_seconds": 0.0},
            "loss_scale": None, "mem_allocated_bytes": 2 * 2**30,
            "mem_reserved_bytes": 3 * 2**30, "max_mem_allocated_bytes": 5 * 2**30,
            "config": config if seq == 0 else None, "exit_reason": None, "error": None,
            "sender_dropped": {"busy": busy} if busy else {}, "hook_errors": 0}
        data = protocol.encode(header, records)
        if hook:
            if hook_sender.send(sock, data, path) is None:
                sent += 1
            else:
                busy += 1
        else:
            try:
                sock.sendto(data, path)
                sent += 1
            except BlockingIOError:
                busy += 1
        seq += 1
        k += 1
    out.put((rank, sent, busy, steps_total))


def daemon_cpu(pid: int, seconds: float) -> float:
    import psutil

    p = psutil.Process(pid)
    c0, t0 = p.cpu_times(), time.monotonic()
    time.sleep(seconds)
    c1, t1 = p.cpu_times(), time.monotonic()
    return 100.0 * ((c1.user - c0.user) + (c1.system - c0.system)) / (t1 - t0)


MODES = ("in step", "spread", "hook")


def run(ranks: int, steps_per_second: int, seconds: float, mode: str = "in step"
        ) -> dict[str, Any]:
    """One measurement. ``mode``: the ranks report ``in step`` (a plain ``sendto`` at the
    same moment), ``spread`` (each at its own even share of the interval), or ``hook``
    (as the hook sends: gpuwatch.job.sender's random start and retries)."""
    with tempfile.TemporaryDirectory() as tmp:
        sock_path = os.path.join(tmp, "hook.sock")
        cfg = Path(tmp) / "gpuwatch.yaml"
        cfg.write_text(f"hook_socket: {sock_path}\n")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = dict(os.environ, STUB_GPUS=str(GPUS),
                   PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        daemon = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "scripts" / "stub_daemon.py"),
             "--config.file", str(cfg), "--interval", "1",
             "--web.listen-address", f"127.0.0.1:{port}", "--quiet"],
            env=env, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if daemon.poll() is not None:
                    raise SystemExit(daemon.stderr.read().decode(errors="replace")[-600:])
                try:
                    metrics(url)
                    if os.path.exists(sock_path):
                        break
                except OSError:
                    pass
                time.sleep(0.2)
            time.sleep(2.0)  # past start-up
            idle = daemon_cpu(daemon.pid, seconds)
            before = metrics(url)
            ctx = mp.get_context("fork")
            results = ctx.Queue()
            start = time.time() + 1.0
            procs = [ctx.Process(target=sender, args=(
                r, ranks, sock_path, start, seconds, steps_per_second, results,
                REPORT_INTERVAL * r / ranks if mode == "spread" else 0.0, mode == "hook"))
                for r in range(ranks)]
            for p in procs:
                p.start()
            time.sleep(max(0.0, start - time.time()) + 0.25)
            busy_cpu = daemon_cpu(daemon.pid, seconds - 0.5)
            got = [results.get(timeout=seconds + 60) for _ in procs]
            for p in procs:
                p.join(10)
            time.sleep(1.5)  # the receiver's queue drained
            after = metrics(url)
        finally:
            daemon.terminate()
            try:
                daemon.wait(10)
            except subprocess.TimeoutExpired:
                daemon.kill()
    sent = sum(g[1] for g in got)
    busy = sum(g[2] for g in got)
    accepted = after.get("gpuwatch_hook_messages_total", 0) - before.get(
        "gpuwatch_hook_messages_total", 0)
    # what the daemon's CPU paid for: the datagrams it accepted (not the nominal rate, which
    # also counts those a full queue turned away and those dropped), per second of sending
    accepted_per_second = accepted / seconds
    dropped = {k: v - before.get(k, 0) for k, v in after.items()
               if k.startswith("gpuwatch_hook_messages_dropped_total") and v - before.get(k, 0)}
    return {"ranks": ranks, "steps_per_second": steps_per_second, "seconds": seconds,
            "max_dgram_qlen": _qlen(), "phases": mode,
            "datagrams_per_second": ranks / REPORT_INTERVAL,
            "accepted_per_second": accepted_per_second,
            "steps_sent": sum(g[3] for g in got), "sent": sent, "accepted": accepted,
            "sender_busy": busy, "receiver_dropped": dropped,
            "daemon_cpu_idle_percent": idle, "daemon_cpu_with_ranks_percent": busy_cpu,
            "cpu_per_datagram_us": (busy_cpu - idle) / 100.0 / accepted_per_second * 1e6
            if accepted_per_second > 0 else None}


def _qlen() -> int | None:
    try:
        return int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())
    except (OSError, ValueError):
        return None


def run_with_qlen(qlen: int, args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """``run`` in a network namespace of its own whose Unix datagram queues hold ``qlen``:
    this script again under ``unshare --net``, which then sets the namespace up itself
    (``in_namespace``), so nothing beyond util-linux's ``unshare`` is needed."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--json", "--ranks", str(args.ranks),
           "--steps-per-second", str(args.steps_per_second), "--seconds", str(args.seconds),
           "--mode", mode, "--in-namespace-qlen", str(qlen)]
    try:
        proc = subprocess.run(["unshare", "--net", *cmd], capture_output=True, text=True,
                              check=False)
    except FileNotFoundError:
        return {"max_dgram_qlen": qlen,
                "error": "unshare (util-linux) is not installed: a network namespace of its "
                         "own is how the queue length is set without touching the host's"}
    if proc.returncode != 0:
        return {"max_dgram_qlen": qlen, "error": (proc.stderr or proc.stdout)[-300:].strip()}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def in_namespace(qlen: int) -> None:
    """Inside a fresh network namespace: bring its loopback up (the daemon serves /metrics
    on 127.0.0.1) and set its ``net.unix.max_dgram_qlen``, with an ioctl and a write to
    /proc/sys (which shows the namespace of the process that opens it): no ``ip``, no
    ``sysctl`` needed. Exits with what failed and why."""
    import fcntl
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            request = struct.pack("16sh", b"lo", 0)
            flags = struct.unpack("16sh", fcntl.ioctl(s, siocgifflags, request))[1]
            fcntl.ioctl(s, siocsifflags, struct.pack("16sh", b"lo", flags | iff_up))
    except OSError as err:
        raise SystemExit(f"cannot bring the namespace's loopback up: {err}") from err
    try:
        Path("/proc/sys/net/unix/max_dgram_qlen").write_text(f"{qlen}\n")
    except OSError as err:
        raise SystemExit(f"cannot set net.unix.max_dgram_qlen={qlen} in the namespace: "
                         f"{err}") from err
    if _qlen() != qlen:
        raise SystemExit(f"net.unix.max_dgram_qlen reads {_qlen()} after setting {qlen}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=64, help="sender processes")
    ap.add_argument("--steps-per-second", type=int, default=50, help="each rank's step rate")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long they report")
    ap.add_argument("--qlen", type=int, action="append", default=None,
                    help="also measure with this net.unix.max_dgram_qlen, in a network "
                    "namespace of its own (repeatable; default 512 where the host's differs)")
    ap.add_argument("--spread", action="store_true",
                    help="also measure with the ranks' reports spread over the interval")
    ap.add_argument("--hook", action="store_true",
                    help="also measure with the ranks sending as the hook does (its own "
                    "random start, a full queue tried again: gpuwatch/job/sender.py)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=MODES, default="in step", help=argparse.SUPPRESS)
    ap.add_argument("--in-namespace-qlen", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", metavar="FILE", help="write the numbers as JSON here")
    args = ap.parse_args(argv)
    if args.json:  # one row, as JSON (run_with_qlen's child)
        if args.in_namespace_qlen is not None:
            in_namespace(args.in_namespace_qlen)
        print(json.dumps(run(args.ranks, args.steps_per_second, args.seconds, args.mode)))
        return 0
    rows = [run(args.ranks, args.steps_per_second, args.seconds)]
    if args.spread:
        rows.append(run(args.ranks, args.steps_per_second, args.seconds, "spread"))
    if args.hook:
        rows.append(run(args.ranks, args.steps_per_second, args.seconds, "hook"))
    qlens = args.qlen if args.qlen is not None else (
        [512] if _qlen() not in (None, 512) else [])
    for qlen in qlens:
        if os.geteuid() != 0:
            rows.append({"max_dgram_qlen": qlen, "error": "needs root (a network namespace)"})
            continue
        rows.append(run_with_qlen(qlen, args, "in step"))
        if args.hook:
            rows.append(run_with_qlen(qlen, args, "hook"))
    print(f"## bench_receiver: {platform.node()}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; the real daemon "
          f"(stub GPUs, --interval 1)\n")
    print("| ranks | steps/s each | reports | max_dgram_qlen | datagrams/s | sent | accepted | "
          "accepted/s | dropped (sender busy / receiver) | daemon CPU idle | with the ranks | "
          "CPU per accepted datagram |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {args.ranks} | {args.steps_per_second} | - | {r['max_dgram_qlen']} | "
                  f"not measured: {r['error']} ||||||||")
            continue
        dropped = sum(r["receiver_dropped"].values())
        per = r["cpu_per_datagram_us"]
        print(f"| {r['ranks']} | {r['steps_per_second']} | {r['phases']} | "
              f"{r['max_dgram_qlen']} | {r['datagrams_per_second']:.0f} | {r['sent']} | "
              f"{r['accepted']:.0f} | {r['accepted_per_second']:.1f} | "
              f"{r['sender_busy']} / {dropped:.0f} | "
              f"{r['daemon_cpu_idle_percent']:.2f} % | "
              f"{r['daemon_cpu_with_ranks_percent']:.2f} % | "
              f"{'-' if per is None else f'{per:.0f} µs'} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
