"""`gpuwatch advise --replay` against recordings that are damaged, odd or handed over in
odd ways: each gets a report or a clear error (file, line, what was expected) with exit
status 2, never a traceback or a hang."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO, daemon_env, recording, run_gpuwatch

IDLE = recording("idle")
DDP = recording("fw_hf_ddp")  # gzip'd, two GPUs, the hook's lines


def _lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _set(line: str, key: str, raw: str) -> str:
    """``line`` (one JSON object) with ``key`` set to the JSON text ``raw``."""
    d = json.loads(line)
    d[key] = "@@"
    return json.dumps(d, separators=(",", ":")).replace('"@@"', raw)


def _nth(lines: list[str], kind: str, n: int = 3) -> int:
    return [i for i, x in enumerate(lines) if json.loads(x).get("kind") == kind][n]


def _advise(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return run_gpuwatch(["advise", *args], tmp_path, timeout=120)


def _refused(proc: subprocess.CompletedProcess, *words: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w in proc.stderr, proc.stderr
    return proc.stderr


def test_a_gzip_cut_short_gets_its_html_report(tmp_path: Path) -> None:
    """A recording still being written (gzip, no hook: no phase line) cut mid-stream: the
    HTML report's charts read the file again, and their reader stopped at the cut too."""
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(IDLE.read_bytes())[:4000])
    proc = _advise(tmp_path, "--replay", str(cut), "--format", "html")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "<html" in proc.stdout.lower() and "ends early" in proc.stderr


@pytest.mark.parametrize("workers", ["1", ""])
def test_a_damaged_gzip_is_said_to_be_damaged(tmp_path: Path, workers: str) -> None:
    """A .gz copied as text (each newline made CRLF): zlib's own error is no OSError, and
    was a traceback in one process or several."""
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(DDP.read_bytes().replace(b"\n", b"\r\n"))
    proc = subprocess.run([sys.executable, "-m", "gpuwatch", "advise", "--replay", str(bad)],
                          cwd=REPO, env={**daemon_env(tmp_path),
                                         "GPUWATCH_REPLAY_WORKERS": workers},
                          capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode == 0:  # damaged after its meta line: read up to the damage
        assert "is damaged" in proc.stderr
    else:
        _refused(proc, str(bad), "is damaged")


def test_a_gzip_damaged_at_its_start_says_why_there_is_no_meta_line(tmp_path: Path) -> None:
    data = bytearray(DDP.read_bytes())
    data[2] = 9  # gzip's compression method: only 8 (deflate) exists
    method = tmp_path / "method.jsonl.gz"
    method.write_bytes(bytes(data))
    _refused(_advise(tmp_path, "--replay", str(method)), "no meta line",
             "not a readable gzip file")
    head = tmp_path / "head.jsonl.gz"
    head.write_bytes(DDP.read_bytes()[:100])
    err = _refused(_advise(tmp_path, "--replay", str(head)), "no meta line", "ends early")
    assert "empty file" not in err


@pytest.mark.parametrize(("kind", "key"), [
    ("gpu", "mem_used_bytes"), ("gpu", "t"), ("step", "batch_size"), ("step", "loss"),
    ("meta", "host_cpus")])
def test_a_whole_number_past_the_largest_float_is_refused_where_it_is(
        tmp_path: Path, kind: str, key: str) -> None:
    lines = _lines(IDLE if kind != "step" else recording("gpu_ddp1_dist_detail"))
    i = 0 if kind == "meta" else _nth(lines, kind)
    lines[i] = _set(lines[i], key, "1" + "0" * 400)
    path = _write(tmp_path / "big.jsonl", lines)
    _refused(_advise(tmp_path, "--replay", str(path)), f"{path}:{i + 1}:", f"'{key}'")


def test_a_setting_past_the_largest_float_is_no_setting(tmp_path: Path) -> None:
    """Settings are free-form (the hook sends what it reads): one too large to be a
    number is left unknown, the rest of the report stands."""
    lines = _lines(recording("gpu_ddp1_dist_detail"))
    lines = [_set(x, "num_workers", "1" + "0" * 400) if '"kind":"config"' in x else x
             for x in lines]
    proc = _advise(tmp_path, "--replay", str(_write(tmp_path / "cfg.jsonl", lines)),
                   "--format", "json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["gpus"]


def test_json_nested_too_deeply_is_a_line_that_is_not_json(tmp_path: Path) -> None:
    lines = _lines(IDLE)
    i = _nth(lines, "gpu")
    lines[i] = _set(lines[i], "x", "[" * 2000 + "]" * 2000)  # an unknown field
    path = _write(tmp_path / "deep.jsonl", lines)
    _refused(_advise(tmp_path, "--replay", str(path)), f"{path}:{i + 1}: not JSON",
             "nested too deeply")


def test_nul_bytes_are_said_as_such_not_as_a_codec(tmp_path: Path) -> None:
    """json.loads of bytes with NULs guesses UTF-16 or UTF-32 and names that codec."""
    lines = _lines(IDLE)
    lines[120] = "\0\0\0" + lines[120]
    path = _write(tmp_path / "nul.jsonl", lines)
    err = _refused(_advise(tmp_path, "--replay", str(path)), f"{path}:121: not JSON",
                   "NUL bytes")
    assert "utf-32" not in err and "utf-16" not in err
    utf16 = tmp_path / "utf16.jsonl"
    utf16.write_bytes(IDLE.read_text(encoding="utf-8").encode("utf-16"))
    err = _refused(_advise(tmp_path, "--replay", str(utf16)), f"{utf16}:1:", "NUL bytes")
    assert "utf-16-le" not in err


@pytest.mark.parametrize("fmt", ["text", "markdown", "html"])
def test_odd_values_where_text_is_expected_still_make_a_report(tmp_path: Path,
                                                               fmt: str) -> None:
    """A meta line's ``gpus`` that is no list, a framework that is no name, a GPU's name
    holding a lone surrogate (a JSON escape no encoding can write): a report all the same."""
    lines = _lines(recording("gpu_ddp1_dist_detail"))
    lines[0] = _set(lines[0], "gpus", "5")
    lines[0] = _set(lines[0], "gpu_name", '"NVIDIA \\ud800"')
    lines = [_set(x, "framework", '{"name": "hf"}') if '"kind":"config"' in x else x
             for x in lines]
    proc = _advise(tmp_path, "--replay", str(_write(tmp_path / "odd.jsonl", lines)),
                   "--format", fmt)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stdout


def test_an_empty_replay_name_is_refused(tmp_path: Path) -> None:
    """``--replay "$FILE"`` with FILE unset: not read as no --replay at all (which asks
    the daemon, and with one running printed its advice)."""
    _refused(_advise(tmp_path, "--replay", ""), "--replay", "empty")


def test_a_recording_given_as_a_pipes_name_is_read_once(tmp_path: Path) -> None:
    """``--replay <(zcat run.jsonl.gz)``, ``--replay /dev/stdin``, a FIFO: read once
    into a copy, as ``--replay -`` is; it was read from its middle (the first read took
    its start) and a FIFO hung."""
    want = _advise(tmp_path, "--replay", str(DDP), "--format", "json")
    assert want.returncode == 0

    def advice(out: str) -> list[tuple[str, int]]:
        return [(a["id"], a["gpu"]) for a in json.loads(out)["advice"]]

    stdin = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "advise", "--replay", "/dev/stdin", "--format",
         "json"], cwd=REPO, env=daemon_env(tmp_path), input=gzip.decompress(DDP.read_bytes()),
        capture_output=True, timeout=120, check=False)
    assert stdin.returncode == 0, stdin.stderr[-2000:]
    assert advice(stdin.stdout.decode()) == advice(want.stdout)
    fifo = tmp_path / "rec.fifo"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as f:
            f.write(DDP.read_bytes())  # gzip through a pipe: read as a file is
    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    proc = _advise(tmp_path, "--replay", str(fifo), "--format", "json")
    writer.join(10)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert advice(proc.stdout) == advice(want.stdout)
    assert json.loads(proc.stdout)["source"]["path"] == str(fifo) or \
        str(fifo) in proc.stdout
