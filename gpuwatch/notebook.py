"""gpuwatch in a Jupyter notebook: ``%load_ext gpuwatch`` then ``%gpuwatch``, or
``import gpuwatch.notebook; gpuwatch.notebook.watch()``.

What starts:

- **The daemon beside the kernel**, a child process (``python -m gpuwatch.notebook``) that
  samples the GPUs and the host, receives the hook's reports on a socket of its own,
  judges them live and records everything to a trace file, serving it all on a free port
  of 127.0.0.1. Beside, not in: the kernel's training never shares a CPU thread's
  interpreter lock with the sampler, and torch is never imported there. It exits when the
  kernel does, however the kernel ends (it watches its parent).
- **The torch hook in the kernel** (``gpuwatch.torch.attach``), reporting there.
- **A live view** in the cell's output, redrawn every 2 s while cells run: GPU util, SM
  active and memory, step time, data wait, samples/s, the step-time breakdown and the
  phases, and the advice as it starts and ends. An ipywidgets ``HTML`` where ipywidgets is
  installed, else an updating HTML display: both work in Jupyter, JupyterLab, VS Code and
  Colab. The view polls the daemon's HTTP API from a thread of its own; a view that fails
  shows why and leaves the cell alone.

``%gpuwatch report`` shows the report of the kernel's run so far (the recording judged
whole, as ``gpuwatch advise --replay``: the HTML report, inline). ``%gpuwatch stop`` (or
the kernel's end) stops all of it: the hook is detached, the daemon ends, its directory
(socket, recording) is removed. Nothing is left behind.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import html
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from typing import Any

READY_FILE = "ready.json"
LOG_FILE = "daemon.log"
TRACE_FILE = "run.jsonl"
SOCKET_FILE = "hook.sock"
START_TIMEOUT = 30.0  # seconds the daemon may take to start (a loaded machine, NVML init)
STOP_TIMEOUT = 10.0
REFRESH_SECONDS = 2.0
HTTP_TIMEOUT = 1.5
_SPARK_POINTS = 60

_session: Session | None = None
_lock = threading.Lock()


class NotebookError(RuntimeError):
    """The watch could not start (the daemon's own words are in the message)."""


# -- the daemon beside the kernel -----------------------------------------------------------
def _private_dir() -> str:
    from gpuwatch.launcher import private_socket_dir

    d = private_socket_dir()
    if d is None:
        raise NotebookError("no directory for the hook's socket (the temp directories' paths "
                            "are too long for a Unix socket, or not writable)")
    return d


def _package_root() -> str:
    """The directory holding this ``gpuwatch`` package: the daemon runs the same code."""
    import gpuwatch

    return os.path.dirname(os.path.dirname(os.path.abspath(gpuwatch.__file__)))


class Session:
    """One watch: the daemon beside the kernel, the hook in it, the live views."""

    def __init__(self, interval: float = 1.0, refresh: float = REFRESH_SECONDS,
                 record: str | None = None) -> None:
        self.interval = interval
        self.refresh = refresh
        self.dir = _private_dir()
        self.socket = os.path.join(self.dir, SOCKET_FILE)
        self.keep_record = record is not None
        self.trace = os.path.abspath(record) if record else os.path.join(self.dir, TRACE_FILE)
        self.proc: subprocess.Popen[bytes] | None = None
        self.url: str | None = None
        self.hooked = False  # we attached the hook (and detach it at the end)
        self.hook_note: str | None = None
        self.started = time.time()
        self.views: list[LiveView] = []
        self.stopped = False

    def start(self) -> None:
        env = dict(os.environ)
        root = _package_root()
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"]
                                    if env.get("PYTHONPATH") else "")
        # the kernel's own socket variable must not send the daemon's hook elsewhere
        env.pop("GPUWATCH_SOCKET", None)
        cmd = [sys.executable, "-m", "gpuwatch.notebook", "--dir", self.dir,
               "--interval", f"{self.interval:g}", "--parent", str(os.getpid()),
               "--record", self.trace]
        log = open(os.path.join(self.dir, LOG_FILE), "wb")  # noqa: SIM115 - the child's
        try:
            self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, cwd=self.dir,
                                         start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + START_TIMEOUT
        ready = os.path.join(self.dir, READY_FILE)
        while time.monotonic() < deadline:
            if os.path.exists(ready):
                with open(ready, encoding="utf-8") as f:
                    info = json.load(f)
                self.url = info["url"]
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if self.url is None:
            why = self._log_tail()
            self._end_process()
            self._remove_dir()
            raise NotebookError(f"the gpuwatch daemon did not start: {why or 'no output'}")
        self._attach_hook()

    def _log_tail(self) -> str:
        try:
            with open(os.path.join(self.dir, LOG_FILE), encoding="utf-8",
                      errors="replace") as f:
                return f.read()[-2000:].strip()
        except OSError:
            return ""

    def _attach_hook(self) -> None:
        import importlib.util

        if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
            self.hook_note = ("torch is not installed in this kernel: GPU and host metrics "
                              "only, no step time")
            return
        import gpuwatch.torch as hook

        if hook.is_attached():
            self.hook_note = ("the torch hook was already attached in this kernel; its "
                              "reports go where it was attached")
            return
        if hook.attach(self.socket):
            self.hooked = True
        else:
            from gpuwatch.job.hook import attach_problem

            self.hook_note = f"the torch hook could not attach ({attach_problem()})"

    # -- reading the daemon ---------------------------------------------------------------
    def get(self, path: str) -> Any:
        assert self.url is not None
        with urllib.request.urlopen(self.url + path, timeout=HTTP_TIMEOUT) as resp:
            return json.loads(resp.read().decode("utf-8"))

    def report(self) -> tuple[dict[str, Any], Any]:
        """The kernel's run so far: the recording judged whole, and its timeline."""
        from gpuwatch.advisor.rules import load_rules
        from gpuwatch.advisor.timeline import judge_recording

        if self.hooked:
            self._flush_hook()
        return judge_recording(self.trace, load_rules(()), shown="this notebook's run so far")

    def _flush_hook(self) -> None:
        """The hook's pending steps, sent now (they would go within half a second)."""
        from gpuwatch.job.hook import core

        h = core._hook
        if h is not None:
            with contextlib.suppress(Exception):
                h.report()

    # -- the end ------------------------------------------------------------------------
    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        for view in self.views:
            view.stop()
        if self.hooked:
            import gpuwatch.torch as hook

            self._flush_hook()
            hook.detach()
            self.hooked = False
        self._end_process()
        for view in self.views:
            view.final(self)
        self._remove_dir()

    def _end_process(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)  # the daemon writes out its recording and exits
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _remove_dir(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def pids(self) -> list[int]:
        return [self.proc.pid] if self.proc is not None else []


# -- the live view ----------------------------------------------------------------------------
_LIVE_STYLE = """
.gw-live{font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2329;
 border:1px solid #d8dee4;border-radius:6px;padding:8px 12px;max-width:900px}
.gw-live table{border-collapse:collapse;margin:4px 0}.gw-live td,.gw-live th{padding:1px 10px
 1px 0;text-align:left}.gw-live th{color:#57606a;font-weight:600}.gw-live .muted{color:#57606a}
.gw-live .adv{margin:2px 0}.gw-live .sev{display:inline-block;border-radius:8px;color:#fff;
 padding:0 6px;font-size:11px;text-transform:uppercase}
.gw-live .bar{display:flex;height:14px;width:420px;border-radius:3px;overflow:hidden}
"""
_SEV = {"critical": "#b02a37", "warning": "#c77c02", "info": "#1f6feb"}
_BAR = (("data", "data wait", "#e8a33d"), ("sync", "waiting on peers", "#9467bd"),
        ("gpu", "GPU work", "#2ca02c"), ("host", "host", "#1f77b4"),
        ("other", "other", "#b0b0b0"))


def _pct(v: Any) -> str:
    return "?" if v is None else f"{100 * v:.0f} %"


def _ms(v: Any) -> str:
    if v is None:
        return "?"
    return f"{v * 1000:.1f} ms" if v < 10 else f"{v:.1f} s"


def _gib(v: Any) -> str:
    return "?" if v is None else f"{v / 2**30:.1f} GiB"


def _spark(values: deque[float]) -> str:
    if len(values) < 2:
        return ""
    pts = " ".join(f"{i * 100 / (_SPARK_POINTS - 1):.1f},{20 - 19 * max(0.0, min(1.0, v)):.1f}"
                   for i, v in enumerate(values))
    return (f'<svg width="100" height="20" viewBox="0 0 100 20" '
            f'xmlns="http://www.w3.org/2000/svg"><polyline points="{pts}" fill="none" '
            f'stroke="#2ca02c" stroke-width="1.5"/></svg>')


class LiveView:
    """One view in a cell's output, redrawn every ``refresh`` seconds from a thread."""

    def __init__(self, session: Session, widgets: bool | None = None) -> None:
        self.session = session
        self.refresh = session.refresh
        self.util: dict[int, deque[float]] = {}
        self.advice_seen: dict[tuple[str, Any], dict[str, Any]] = {}
        self.ended: list[dict[str, Any]] = []
        self.error: str | None = None
        self.draws = 0
        self.last_body = ""  # the newest view, kept under the word that the watch stopped
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._widget: Any = None
        self._handle: Any = None
        if widgets is None:
            widgets = _has_widgets()
        self.widgets = widgets

    def show(self) -> None:
        from IPython.display import HTML, display

        text = self.render()
        if self.widgets:
            import ipywidgets

            self._widget = ipywidgets.HTML(value=text)
            display(self._widget)
        else:
            self._handle = display(HTML(text), display_id=True)
        self._thread = threading.Thread(target=self._run, name="gpuwatch-notebook-view",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.refresh):
            self.draw()

    def draw(self) -> None:
        try:
            text = self.render()
        except Exception as err:  # noqa: BLE001 - the view says so; the cell goes on
            text = self._frame(f"<p>The view failed: {html.escape(repr(err))}</p>")
        self._put(text)

    def _put(self, text: str) -> None:
        try:
            if self._widget is not None:
                self._widget.value = text
            elif self._handle is not None:
                from IPython.display import HTML

                self._handle.update(HTML(text))
            self.draws += 1
        except Exception:  # noqa: BLE001 - a closed frontend: nothing to draw on
            pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def final(self, session: Session) -> None:
        elapsed = time.time() - session.started
        self._put(self._frame(self.last_body + f"<p class=\"stopped\"><b>Stopped</b> after "
                              f"{elapsed:.0f} s: the daemon and the hook are gone. "
                              "<code>%gpuwatch</code> starts a new watch.</p>"))

    def _frame(self, inner: str) -> str:
        return (f'<style>{_LIVE_STYLE}</style><div class="gw-live" data-draws="{self.draws}">'
                f"{inner}</div>")

    def render(self) -> str:
        s = self.session
        try:
            snap = s.get("/api/snapshot")
            rep = s.get("/api/advice")
            self.error = None
        except Exception as err:  # noqa: BLE001 - said in the view
            self.error = f"the daemon does not answer ({err})"
            return self._frame(f"<p><b>gpuwatch</b>: {html.escape(self.error)}</p>")
        self.last_body = self._body(snap, rep)
        return self._frame(self.last_body)

    def _body(self, snap: dict[str, Any], rep: dict[str, Any]) -> str:
        s = self.session
        now = time.strftime("%H:%M:%S")
        parts = [f"<div><b>gpuwatch</b> <span class=\"muted\">· this kernel (pid "
                 f"{os.getpid()}) · updated {now} · every {self.refresh:g} s</span></div>"]
        gpus = [g for g in snap.get("gpus", [])]
        if gpus:
            rows = []
            for g in gpus:
                spark = self.util.setdefault(g["gpu"], deque(maxlen=_SPARK_POINTS))
                if g.get("util") is not None:
                    spark.append(float(g["util"]))
                name = next((i.get("name") for i in snap.get("infos", [])
                             if i.get("gpu") == g["gpu"]), None) or ""
                if g.get("lost"):
                    rows.append(f"<tr><td>GPU {g['gpu']}</td><td colspan=5>lost</td></tr>")
                    continue
                power = (f"{g['power_watts']:.0f} W" if g.get("power_watts") is not None
                         else "?")
                rows.append(
                    f"<tr><td>GPU {g['gpu']} <span class=\"muted\">{html.escape(name)}</span>"
                    f"</td><td>util {_pct(g.get('util'))}</td>"
                    f"<td>SM active {_pct(g.get('sm_active'))}</td>"
                    f"<td>memory {_gib(g.get('mem_used_bytes'))} / "
                    f"{_gib(g.get('mem_total_bytes'))}</td><td>{power}</td>"
                    f"<td>{_spark(spark)}</td></tr>")
            parts.append("<table>" + "".join(rows) + "</table>")
        else:
            reason = (rep.get("judged") or {}).get("reason") or "NVML found no GPU"
            parts.append(f"<p class=\"no-gpu\">No GPU found: {html.escape(reason)}. Host "
                         "metrics and the hook's step data only.</p>")
        host = snap.get("host") or {}
        if host:
            cpu = host.get("cpu_util")
            parts.append(f"<div class=\"muted\">host CPU {_pct(cpu)} · memory "
                         f"{_gib(host.get('mem_used_bytes'))} / "
                         f"{_gib(host.get('mem_total_bytes'))}</div>")
        parts.append(self._training(snap, rep))
        if s.hook_note:
            parts.append(f"<p class=\"muted\">{html.escape(s.hook_note)}</p>")
        parts.append(self._advice_html(rep=rep))
        return "".join(parts)

    def _training(self, snap: dict[str, Any], rep: dict[str, Any]) -> str:
        jobs = [j for j in snap.get("jobs", []) if j.get("pid") == os.getpid()] \
            or list(snap.get("jobs", []))
        if not jobs:
            return ("<p class=\"training\">Training: waiting for the first step (the hook "
                    "counts an iteration at each optimizer step).</p>")
        out = []
        for j in jobs:
            bits = [f"{j.get('steps_total', 0)} steps", f"step {_ms(j.get('step_seconds'))}",
                    f"data wait {_pct(j.get('data_wait_ratio'))}"]
            if j.get("samples_per_second") is not None:
                bits.append(f"{j['samples_per_second']:.0f} samples/s")
            if j.get("loss_scale") is not None:
                bits.append(f"loss scale {j['loss_scale']:g}")
            who = f"rank {j['rank']}" if j.get("rank") is not None else f"pid {j['pid']}"
            out.append(f"<div class=\"training\">Training ({who}): {' · '.join(bits)}</div>")
        for j in rep.get("jobs", []):
            shares = j.get("time_share") or {}
            if shares:
                cells = "".join(
                    f'<span style="width:{100 * shares.get(c, 0):.1f}%;background:{col}" '
                    f'title="{name} {_pct(shares.get(c))}"></span>' for c, name, col in _BAR)
                words = ", ".join(f"{name} {_pct(shares[c])}" for c, name, _ in _BAR
                                  if shares.get(c, 0) >= 0.005)
                where = "CPU" if j.get("gpu") is None else f"GPU {j['gpu']}"
                out.append(f"<div class=\"breakdown\">Time ({where}, last 30 s): "
                           f"{words}<div class=\"bar\">{cells}</div></div>")
            phases = j.get("phases")
            if phases:
                out.append("<div class=\"phases\">Phases: " + ", ".join(
                    f"{html.escape(str(p))} {float(v):.{0 if v >= 10 else 1}f} s" for p, v in phases.items()
                    if isinstance(v, (int, float))) + "</div>")
        return "".join(out)

    def _advice_html(self, rep: dict[str, Any] | None = None, final: bool = False) -> str:
        now = time.time()
        if rep is not None:
            active = {(a["id"], a.get("gpu")): a for a in rep.get("advice", [])
                      if a.get("active", True)}
            for key, a in active.items():
                if key not in self.advice_seen:
                    self.advice_seen[key] = dict(a, seen=now)
            for key in [k for k in self.advice_seen if k not in active]:
                a = self.advice_seen.pop(key)
                self.ended.append(dict(a, ended_seen=now))
        items = []
        for a in self.advice_seen.values():
            where = "host" if a.get("gpu") is None else f"GPU {a['gpu']}"
            col = _SEV.get(a.get("severity"), "#444")
            items.append(f"<div class=\"adv\"><span class=\"sev\" style=\"background:{col}\">"
                         f"{html.escape(a.get('severity', ''))}</span> "
                         f"<code>{html.escape(a['id'])}</code> on {where} since "
                         f"{time.strftime('%H:%M:%S', time.localtime(a['seen']))}: "
                         f"{html.escape(a.get('title', ''))}<br><span class=\"muted\">"
                         f"{html.escape(a.get('action', ''))}</span></div>")
        for a in self.ended[-5:]:
            items.append(f"<div class=\"adv muted\"><code>{html.escape(a['id'])}</code> ended "
                         f"{time.strftime('%H:%M:%S', time.localtime(a['ended_seen']))}</div>")
        if not items:
            return "" if final else "<div class=\"muted\">Advice: none so far.</div>"
        return "<div class=\"advice\"><b>Advice</b>" + "".join(items) + "</div>"


def _has_widgets() -> bool:
    try:
        import ipywidgets  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure: the plain display
        return False
    return True


# -- the public functions ---------------------------------------------------------------------
def watch(interval: float = 1.0, refresh: float = REFRESH_SECONDS, record: str | None = None,
          widgets: bool | None = None, view: bool = True) -> Session:
    """Start watching this kernel (once; a second call shows another view of the same
    watch). ``interval``: seconds between samples; ``refresh``: between redraws of the
    view; ``record``: keep the recording at this path (else it goes with the watch);
    ``widgets``: use ipywidgets (default: where installed)."""
    global _session
    with _lock:
        if _session is None or _session.stopped:
            session = Session(interval=interval, refresh=refresh, record=record)
            session.start()
            _session = session
            atexit.register(_at_exit)
        session = _session
    if view:
        show(widgets=widgets)
    return session


def show(widgets: bool | None = None) -> LiveView:
    """Another live view of the running watch, in this cell's output."""
    session = _current()
    live = LiveView(session, widgets=widgets)
    session.views.append(live)
    live.show()
    return live


def report(fmt: str = "html", save: str | None = None) -> Any:
    """The report of the kernel's run so far, inline (``fmt`` html, text, markdown or
    json); ``save`` writes the self-contained HTML page there as well."""
    from IPython.display import HTML, Markdown, display

    from gpuwatch.advisor import html as html_mod
    from gpuwatch.advisor import report as report_mod

    session = _current()
    rep, timeline = session.report()
    if save:
        with open(save, "w", encoding="utf-8") as f:
            f.write(html_mod.render(rep, timeline))
    if fmt == "html":
        display(HTML(html_mod.render(rep, timeline, fragment=True)))
    elif fmt == "markdown":
        display(Markdown(report_mod.render_markdown(rep)))
    elif fmt == "json":
        print(json.dumps(rep, indent=2))
    else:
        print(report_mod.render_text(rep), end="")
    return rep


def stop() -> None:
    """Stop the watch: detach the hook, end the daemon, remove its socket and files."""
    global _session
    with _lock:
        session, _session = _session, None
    if session is not None:
        session.stop()


def status() -> dict[str, Any] | None:
    s = _session
    if s is None or s.stopped:
        return None
    return {"url": s.url, "socket": s.socket, "recording": s.trace, "dir": s.dir,
            "daemon_pid": s.proc.pid if s.proc else None, "hook": s.hooked,
            "note": s.hook_note}


def _current() -> Session:
    s = _session
    if s is None or s.stopped:
        raise NotebookError("gpuwatch is not watching this kernel: run %gpuwatch (or "
                            "gpuwatch.notebook.watch()) first")
    return s


def _at_exit() -> None:
    with contextlib.suppress(Exception):
        stop()


# -- the magic ---------------------------------------------------------------------------
USAGE = """%gpuwatch [--interval S] [--record FILE] [--no-widgets]   start, with a live view
%gpuwatch view                      another live view, in this cell
%gpuwatch report [text|markdown|json] [--save FILE]   the run so far (HTML by default)
%gpuwatch status                    where the daemon, socket and recording are
%gpuwatch stop                      stop: detach the hook, end the daemon, remove its files"""


def magic(line: str) -> Any:
    """The ``%gpuwatch`` line magic."""
    words = shlex.split(line)
    cmd = words[0] if words and not words[0].startswith("-") else "start"
    rest = words[1:] if words and not words[0].startswith("-") else words
    try:
        if cmd == "start":
            p = argparse.ArgumentParser(prog="%gpuwatch", add_help=False)
            p.add_argument("--interval", type=float, default=1.0)
            p.add_argument("--refresh", type=float, default=REFRESH_SECONDS)
            p.add_argument("--record", default=None)
            p.add_argument("--no-widgets", action="store_true")
            a = p.parse_args(rest)
            watch(interval=a.interval, refresh=a.refresh, record=a.record,
                  widgets=False if a.no_widgets else None)
        elif cmd == "view":
            show()
        elif cmd == "report":
            p = argparse.ArgumentParser(prog="%gpuwatch report", add_help=False)
            p.add_argument("fmt", nargs="?", default="html",
                           choices=["html", "text", "markdown", "json"])
            p.add_argument("--save", default=None)
            a = p.parse_args(rest)
            report(a.fmt, save=a.save)
        elif cmd == "stop":
            stop()
            print("gpuwatch: stopped")
        elif cmd == "status":
            print(json.dumps(status(), indent=2))
        else:
            print(USAGE)
    except SystemExit:  # argparse on a bad word: the usage, not a dead kernel
        print(USAGE)
    except NotebookError as err:
        print(f"gpuwatch: {err}", file=sys.stderr)
    return None


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gpuwatch`` (or ``gpuwatch.notebook``): the ``%gpuwatch`` magic."""
    ipython.register_magic_function(magic, "line", "gpuwatch")


def unload_ipython_extension(ipython: Any) -> None:
    stop()


# -- the daemon's side (python -m gpuwatch.notebook) ---------------------------------------
def serve(argv: list[str] | None = None) -> int:
    """The daemon beside a kernel: serves on a free port of 127.0.0.1, writes where in
    ``--dir``/ready.json, and ends on SIGTERM or when its parent (the kernel) is gone."""
    p = argparse.ArgumentParser(prog="python -m gpuwatch.notebook")
    p.add_argument("--dir", required=True)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--record", required=True)
    a = p.parse_args(argv)
    from gpuwatch import logs
    from gpuwatch.daemon import Daemon
    from gpuwatch.serve.config import Config

    logs.setup("warning")
    config = Config(listen_address="127.0.0.1:0", interval=a.interval,
                    hook_socket=os.path.join(a.dir, SOCKET_FILE), record=a.record)
    daemon = Daemon(config)
    daemon.scenario = "notebook"
    daemon.start()
    tmp = os.path.join(a.dir, READY_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"url": daemon.url, "hook_socket": daemon.hook_socket,
                   "record": a.record, "pid": os.getpid()}, f)
    os.replace(tmp, os.path.join(a.dir, READY_FILE))
    orphaned = threading.Event()

    def watch_parent() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != a.parent:
                orphaned.set()
                os.kill(os.getpid(), signal.SIGTERM)  # serve_forever's handler stops us
                return

    threading.Thread(target=watch_parent, name="gpuwatch-parent", daemon=True).start()
    daemon.serve_forever()
    if orphaned.is_set():  # nobody is left to tidy up after us
        shutil.rmtree(a.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve())
