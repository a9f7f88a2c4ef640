"""gpuwatch in a notebook: a real notebook executed headless (nbclient, a real ipykernel)
starts the watch, trains a small CPU model, and its cell outputs hold the live view and
the report; stopping (the magic, or the kernel's end) leaves no process and no socket.

This machine has no GPU: the view says so, and shows the hook's step time and data wait.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO = Path(__file__).resolve().parents[1]

TRAIN = """\
import time, torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):  # 0.3 ms of CPU per sample: the loop waits for data
    def __len__(self):
        return 100_000
    def __getitem__(self, i):
        t = time.perf_counter()
        while time.perf_counter() - t < 0.0003:
            pass
        return torch.randn(32), torch.randint(0, 4, ())

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
end = time.time() + 5
steps = 0
for x, y in DataLoader(Slow(), batch_size=32):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    steps += 1
    if time.time() > end:
        break
print("steps", steps)
"""

STATUS = """\
import json, os
import gpuwatch.notebook as gn
STATUS_JSON = json.dumps(dict(gn.status(), kernel=os.getpid()))
print(STATUS_JSON)
"""

AFTER = """\
import json, os, psutil
st = json.loads(STATUS_JSON)
kids = [" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)]
print(json.dumps({"children": kids, "socket": os.path.exists(st["socket"]),
                  "dir": os.path.exists(st["dir"])}))
"""


def run(cells: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.delenv("GPUWATCH_SOCKET", raising=False)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    nbformat.write(nb, tmp_path / "executed.ipynb")
    return nb


def outputs(cell: Any) -> list[dict[str, Any]]:
    errors = [o for o in cell.outputs if o.output_type == "error"]
    assert not errors, errors
    return cell.outputs


def text_of(cell: Any) -> str:
    return "".join(o.get("text", "") for o in outputs(cell) if o.output_type == "stream")


def html_of(cell: Any) -> str:
    return "".join(o.get("data", {}).get("text/html", "") for o in outputs(cell))


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(status: dict[str, Any]) -> None:
    """The daemon and its directory (socket, recording) are gone: a readiness wait for the
    kernel's own exit, not a timing assertion."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (gone(status["daemon_pid"])
                                               and not os.path.exists(status["dir"])):
        time.sleep(0.2)
    assert gone(status["daemon_pid"])
    assert not os.path.exists(status["socket"]) and not os.path.exists(status["dir"])
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if status["dir"] in " ".join(p.info["cmdline"] or ())]
    assert left == []


def check_live_view(view: str, kernel: int, steps: int) -> None:
    draws = int(re.search(r'data-draws="(\d+)"', view).group(1))
    assert draws >= 2  # redrawn while the training cell ran
    # a machine without a GPU (CI's) says so; one with GPUs has a row for each
    assert "No GPU found" in view or re.search(r"<td>GPU \d+ ", view)
    m = re.search(r"Training \(pid (\d+)\): (\d+) steps · step ([\d.]+) ms · data wait (\d+) %"
                  r" · (\d+) samples/s", view)
    assert m, view
    assert int(m.group(1)) == kernel
    assert 0 < int(m.group(2)) <= steps
    assert float(m.group(3)) > 0 and int(m.group(4)) > 0 and int(m.group(5)) > 0


@pytest.mark.slow
def test_watch_train_report_stop_in_a_real_notebook(tmp_path, monkeypatch):
    cells = ["%load_ext gpuwatch\n%gpuwatch --interval 0.5 --refresh 0.5 --no-widgets",
             TRAIN, "import time\ntime.sleep(2)", STATUS, "%gpuwatch report",
             "%gpuwatch stop",
             # what is left, seen from inside the kernel: its children, the socket, the dir
             AFTER]
    nb = run(cells, tmp_path, monkeypatch)
    steps = int(text_of(nb.cells[1]).split()[1])
    assert steps > 10  # training ran, unbroken
    status = json.loads(text_of(nb.cells[3]))
    assert status["hook"] is True and status["url"].startswith("http://127.0.0.1:")
    view = html_of(nb.cells[0])
    check_live_view(view, status["kernel"], steps)
    assert "Stopped" in view  # the stop said so in the view itself
    report = html_of(nb.cells[4])
    assert "gpuwatch report" in report and "<script" not in report
    assert f"Job (pid {status['kernel']}) over time" in report
    m = re.search(r"(\d+) steps; batch 32; (\d+) samples/s", report)
    assert m and 0 < int(m.group(1)) <= steps and int(m.group(2)) > 0
    if "No GPU found" in view:
        assert "No GPU: the recording holds no GPU lines" in report
    else:
        assert "GPU 0" in report and 'class="chart"' in report
    assert "gpuwatch: stopped" in text_of(nb.cells[5])
    left = json.loads(text_of(nb.cells[6]))
    assert left == {"children": [], "socket": False, "dir": False}
    wait_gone(status)


@pytest.mark.slow
def test_a_cell_run_again_without_its_grad_scaler_is_counted(tmp_path, monkeypatch):
    """The training cell run with a GradScaler (fp16's loss scaling), then again without
    one (bf16 or fp32: the advice taken, the cell run again in the same kernel): the
    report counts the second run's steps too. Before, the scaler stayed the iteration
    clock for the kernel's life and the second run counted none."""
    scaled = (TRAIN.replace("end = time.time() + 5", "end = time.time() + 3\n"
                            "scaler = torch.amp.GradScaler('cpu')")
              .replace("    loss.backward()\n    opt.step()\n",
                       "    scaler.scale(loss).backward()\n    scaler.step(opt)\n"
                       "    scaler.update()\n"))
    assert "scaler.update()" in scaled
    cells = ["%load_ext gpuwatch\n%gpuwatch --interval 0.5 --refresh 0.5 --no-widgets",
             scaled, TRAIN, "import time\ntime.sleep(2)", "%gpuwatch report", "%gpuwatch stop"]
    nb = run(cells, tmp_path, monkeypatch)
    first, second = (int(text_of(nb.cells[i]).split()[1]) for i in (1, 2))
    assert first > 10 and second > 10
    m = re.search(r"(\d+) steps; batch 32; (\d+) samples/s", html_of(nb.cells[4]))
    assert m, html_of(nb.cells[4])
    # the reports may lag the last steps by a report interval, not by a whole run
    assert first + second // 2 < int(m.group(1)) <= first + second
    assert "gpuwatch: stopped" in text_of(nb.cells[5])


@pytest.mark.slow
def test_widgets_view_and_the_kernel_end_stop_it(tmp_path, monkeypatch):
    pytest.importorskip("ipywidgets")
    cells = ["%load_ext gpuwatch\n%gpuwatch --interval 0.5 --refresh 0.5", TRAIN,
             "import time\ntime.sleep(2)", STATUS, "%gpuwatch report text"]
    nb = run(cells, tmp_path, monkeypatch)  # no stop: the kernel's end stops the watch
    steps = int(text_of(nb.cells[1]).split()[1])
    status = json.loads(text_of(nb.cells[3]))
    view_out = [o for o in outputs(nb.cells[0]) if o.output_type == "display_data"]
    model = view_out[0]["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    view = state[model]["state"]["value"]
    check_live_view(view, status["kernel"], steps)
    text = text_of(nb.cells[4])
    assert text.startswith("gpuwatch advice: recording this notebook's run so far")
    if "No GPU found" in view:
        # no GPU here: the kernel's torch loop is judged as a CPU-only job, the GPUs are not
        assert "CPU-only job" in text and "No GPU in this data" in text
    wait_gone(status)


def test_magic_without_a_watch_says_so(tmp_path, monkeypatch):
    nb = run(["%load_ext gpuwatch\n%gpuwatch report", "%gpuwatch nonsense"], tmp_path,
             monkeypatch)
    err = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert "gpuwatch is not watching this kernel: run %gpuwatch" in err
    assert "%gpuwatch stop" in text_of(nb.cells[1])  # the usage


def test_the_daemon_ends_with_a_kernel_that_is_killed(tmp_path):
    """A kernel killed outright (no atexit): the daemon sees its parent gone, stops and
    removes its directory."""
    import signal
    import subprocess
    import sys

    code = ("import sys, time\nimport gpuwatch.notebook as n\n"
            "s = n.Session(interval=0.5)\ns.start()\n"
            "print(s.dir, s.proc.pid, flush=True)\ntime.sleep(120)\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("GPUWATCH_SOCKET", None)
    kernel = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              text=True)
    try:
        line = kernel.stdout.readline().split()
        assert len(line) == 2, line
        status = {"dir": line[0], "daemon_pid": int(line[1]),
                  "socket": os.path.join(line[0], "hook.sock")}
        assert os.path.exists(status["socket"])
        kernel.send_signal(signal.SIGKILL)
        kernel.wait()
        wait_gone(status)
    finally:
        if kernel.poll() is None:
            kernel.kill()
