"""Render the pictures in docs/ with Debian's headless chromium (tests/browser.py's flags:
nothing leaves the machine): ``python3 docs/make_screenshots.py`` from the checkout.

- report.png: ``gpuwatch advise --demo --format html`` (the bundled recording)
- report-ddp.png: the two-rank straggler recording (tests/data/gpu_ddp_slow_rank.jsonl)
- report-phases.png: tests/data/input_bound.jsonl with synthetic `phase` lines (start-up,
  train, eval, train, checkpoint: tests/test_html_report.py's), to show the shading
- compare.png: ``gpuwatch compare`` of the starved run against the tuned one, as HTML
- notebook.png: a notebook executed headless (nbclient, ipykernel): ``%gpuwatch``, a CPU
  training cell, ``%gpuwatch report``, shown as the notebook's cells and outputs

Then ``pngquant --quality 80-95 --speed 1 --force --ext .png docs/*.png`` (Debian's
pngquant): the pictures as chromium writes them are about twice the size, and the
checkout, which travels whole to the lent GPU machines, must stay under their 64 MiB.
"""

from __future__ import annotations

import html
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import browser  # noqa: E402 - tests/ on the path first


def gpuwatch(*args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "gpuwatch", *args], capture_output=True,
                          text=True, env=env, check=True).stdout


def trim(png: Path) -> None:
    """Cut the blank rows under the page."""
    from PIL import Image, ImageChops

    img = Image.open(png).convert("RGB")
    bg = Image.new("RGB", img.size, (255, 255, 255))
    box = ImageChops.difference(img, bg).getbbox()
    if box:
        img.crop((0, 0, img.width, min(img.height, box[3] + 16))).save(png)


def shot(page_html: str, name: str, tmp: Path, height: int) -> None:
    page = tmp / f"{name}.html"
    page.write_text(page_html)
    out = DOCS / f"{name}.png"
    browser.screenshot(page, out, tmp, width=1100, height=height)
    trim(out)
    print(f"wrote {out}")


def notebook_page(tmp: Path) -> str:
    import nbclient
    import nbformat
    from test_notebook import TRAIN

    os.environ["PYTHONPATH"] = str(REPO)
    cells = ["%load_ext gpuwatch\n%gpuwatch --no-widgets", TRAIN, "import time\ntime.sleep(3)",
             "%gpuwatch report", "%gpuwatch stop"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp)}}).execute()
    parts = []
    for i, cell in enumerate(nb.cells, 1):
        if i == 3:
            continue  # the pause that lets the view catch up
        parts.append(f'<div class="in"><span>In [{i}]:</span><pre>{html.escape(cell.source)}'
                     "</pre></div>")
        for o in cell.outputs:
            if o.output_type == "stream":
                parts.append(f'<pre class="out">{html.escape(o.text)}</pre>')
            elif "text/html" in o.get("data", {}):
                parts.append(f'<div class="out">{o["data"]["text/html"]}</div>')
    style = ("body{font:13px system-ui,sans-serif;max-width:1040px;margin:12px auto}"
             ".in{display:flex;gap:8px;margin-top:10px}.in span{color:#303f9f;width:60px}"
             ".in pre{flex:1;background:#f5f5f5;border:1px solid #e0e0e0;padding:6px;margin:0;"
             "font-size:11px;max-height:150px;overflow:hidden}.out{margin-left:68px}"
             "pre.out{font-size:12px}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><style>{style}</style></head>"
            f"<body>{''.join(parts)}</body></html>")


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        shot(gpuwatch("advise", "--demo", "--format", "html"), "report", tmp, 3400)
        shot(gpuwatch("advise", "--replay", "tests/data/gpu_ddp_slow_rank.jsonl",
                      "--format", "html"), "report-ddp", tmp, 6000)
        from test_html_report import _with_phases

        phased = tmp / "phased.jsonl"
        _with_phases(REPO / "tests" / "data" / "input_bound.jsonl", phased)
        shot(gpuwatch("advise", "--replay", str(phased), "--format", "html"), "report-phases",
             tmp, 3400)
        shot(gpuwatch("compare", "tests/data/input_bound.jsonl", "tests/data/tuned.jsonl",
                      "--format", "html"), "compare", tmp, 1200)
        shot(notebook_page(tmp), "notebook", tmp, 3000)


if __name__ == "__main__":
    main()
