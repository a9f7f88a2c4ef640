"""Debian's headless chromium for the tests: render a page, read back its DOM, what it wrote
to the console and every request it made.

The browser itself asks the network for updates and the time even with background
networking off; every request goes to a proxy on a closed loopback port and no host name
resolves, so nothing leaves the machine. What the page asked for is told apart from the
browser's own requests by their initiator (the page's is its file:// origin, the
browser's "not an origin").
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9",
         "--no-pings", "--disable-domain-reliability", "--hide-scrollbars"]
_CONSOLE = re.compile(r":CONSOLE[:(]\d+\)?\]? (.*)")


@dataclass
class Rendered:
    dom: str
    console: list[str]  # every console message (errors, warnings, logs)
    page_requests: list[str]  # URLs the page itself asked for (not file: or data:)


def available() -> bool:
    return Path(CHROMIUM).exists()


def _args(tmp: Path) -> list[str]:
    profile = tmp / "profile"
    if profile.exists():
        shutil.rmtree(profile)
    return [CHROMIUM, *FLAGS, f"--user-data-dir={profile}"]


def render(page: Path, tmp: Path) -> Rendered:
    """Load ``page`` and return its DOM after scripts ran, its console and its requests."""
    netlog = tmp / "netlog.json"
    proc = subprocess.run(
        [*_args(tmp), "--enable-logging=stderr", "--v=0", f"--log-net-log={netlog}",
         "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [m.group(1) for m in map(_CONSOLE.search, proc.stderr.splitlines()) if m]
    return Rendered(dom=proc.stdout, console=console, page_requests=page_requests(netlog))


def page_requests(netlog: Path) -> list[str]:
    data = json.loads(netlog.read_text())
    types = {v: k for k, v in data["constants"]["logEventTypes"].items()}
    urls = []
    for event in data["events"]:
        if types.get(event["type"]) != "URL_REQUEST_START_JOB":
            continue
        params = event.get("params", {})
        url = params.get("url")
        if url is None:  # the job's end (its net_error), not a request
            continue
        if params.get("initiator") == "not an origin" or url.startswith(("file:", "data:")):
            continue
        urls.append(url)
    return urls


def screenshot(page: Path, out: Path, tmp: Path, width: int = 1100, height: int = 3000) -> None:
    proc = subprocess.run(
        [*_args(tmp), f"--window-size={width},{height}", f"--screenshot={out}",
         page.resolve().as_uri()], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0 and out.exists(), proc.stderr[-2000:]
