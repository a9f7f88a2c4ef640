"""The command line's edges, as a user meets them: help texts, bad flags (each named with
what it expected, exit 2, the usage of the command it was given to), a command that does
not exist, and one wording for a missing file whichever command meets it."""

from __future__ import annotations

import argparse
import re
import stat
import tempfile

import pytest
from conftest import REPO, read_recording, recording, run_gpuwatch

from gpuwatch.cli import EXAMPLES, build_parser


def _usage_of(stderr: str) -> str:
    m = re.match(r"usage: (gpuwatch(?: \w+)?) ", stderr)
    assert m, stderr
    return m.group(1)


# -- unknown flags: the subcommand's own usage ------------------------------------------

@pytest.mark.parametrize(("args", "usage"), [
    (["run", "--bogus"], "gpuwatch run"),
    (["run", "--bogus", "--", "true"], "gpuwatch run"),
    (["record", "x.jsonl", "--bogus"], "gpuwatch record"),
    (["advise", "--bogus"], "gpuwatch advise"),
    (["--bogus"], "gpuwatch"),
])
def test_an_unknown_flag_shows_the_usage_of_its_command(tmp_path, args, usage):
    result = run_gpuwatch(args, tmp_path)
    assert result.returncode == 2, result.stderr
    assert _usage_of(result.stderr) == usage
    assert result.stderr.rstrip().endswith(f"{usage}: error: unrecognized arguments: --bogus")


def test_after_the_double_dash_flags_belong_to_the_job(tmp_path):
    result = run_gpuwatch(["run", "--quiet", "--web.listen-address", "127.0.0.1:0", "--",
                           "echo", "--bogus"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "--bogus\n"


# -- bad values: the flag, what it expected, what it got ---------------------------------

@pytest.mark.parametrize(("args", "expected"), [
    (["record", "x.jsonl", "--duration", "abc"],
     "argument --duration: expected seconds as a number, got 'abc'"),
    (["record", "x.jsonl", "--duration", "0"], "argument --duration: expected seconds above 0, got 0"),
    (["record", "x.jsonl", "--interval", "abc"],
     "argument --interval: expected seconds as a number, got 'abc'"),
    (["record", "x.jsonl", "--interval", "inf"],
     "argument --interval: expected a finite number of seconds, got 'inf'"),
    (["advise", "--prometheus", "http://127.0.0.1:1", "--window", "abc"],
     "argument --window: expected seconds as a number, got 'abc'"),
    (["advise", "--prometheus", "http://127.0.0.1:1", "--window", "-5"],
     "argument --window: expected seconds above 0, got -5"),
    (["advise", "--format", "yaml"], "argument --format: invalid choice: 'yaml'"),
    (["advise", "--prometheus", "prom:9090"],
     "--prometheus: bad URL 'prom:9090': expected http://HOST:PORT"),
    (["advise", "--url", "localhost:9442"],
     "--url: bad URL 'localhost:9442': expected http://HOST:PORT"),
    (["advise", "--config.file", "gpuwatch.yaml"],
     "--config.file does not apply to a running daemon (http://"),
    (["advise", "--url", "http://127.0.0.1:1", "--config.file", "gpuwatch.yaml"],
     "--config.file does not apply to --url"),
])
def test_a_bad_value_names_the_flag_and_what_it_expected(tmp_path, args, expected):
    result = run_gpuwatch(args, tmp_path)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


# -- a command that can't be started ------------------------------------------------------

def test_a_missing_command_is_said_before_anything_starts(tmp_path):
    result = run_gpuwatch(["run", "--web.listen-address", "127.0.0.1:0", "--",
                           "no-such-command-gpuwatch-test", "--flag"], tmp_path)
    assert result.returncode == 127
    # nothing was watched, served or started: one line, the reason
    assert result.stderr == "gpuwatch: command not found: no-such-command-gpuwatch-test\n"


def test_a_command_that_is_not_executable_exits_126(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("echo hi\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    result = run_gpuwatch(["run", "--", str(script)], tmp_path)
    assert result.returncode == 126
    assert result.stderr == f"gpuwatch: cannot run {script}: Permission denied\n"
    result = run_gpuwatch(["run", "--", str(tmp_path)], tmp_path)
    assert result.returncode == 126
    assert result.stderr == f"gpuwatch: cannot run {tmp_path}: Is a directory\n"


# -- a missing file: one wording ----------------------------------------------------------

@pytest.mark.parametrize(("args", "expected"), [
    (["advise", "--replay", "{missing}"], "cannot read trace {missing}: No such file or directory"),
    (["run", "--replay", "{missing}"], "cannot read trace {missing}: No such file or directory"),
    (["run", "--config.file", "{missing}"],
     "cannot read configuration file {missing}: No such file or directory"),
    (["advise", "--demo", "--config.file", "{missing}"],
     "cannot read configuration file {missing}: No such file or directory"),
    (["run", "--web.config.file", "{missing}"],
     "cannot read web configuration file {missing}: No such file or directory"),
    (["record", "{missing}/out.jsonl", "--duration", "1"],
     "cannot write trace {missing}/out.jsonl: No such file or directory"),
    (["run", "--demo", "--record", "{missing}/out.jsonl"],
     "cannot write trace {missing}/out.jsonl: No such file or directory"),
    (["run", "--replay", "{dir}"], "cannot read trace {dir}: Is a directory"),
    (["advise", "--replay", "{dir}"], "cannot read trace {dir}: Is a directory"),
])
def test_a_missing_file_is_worded_alike_by_every_command(tmp_path, args, expected):
    missing = str(tmp_path / "missing")
    fill = {"missing": missing, "dir": str(tmp_path)}
    result = run_gpuwatch([a.format(**fill) for a in args], tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[-1] == "gpuwatch: error: " + expected.format(**fill)


# -- help ----------------------------------------------------------------------------------

def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    top = build_parser()
    out = [("gpuwatch", top)]
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            out += [(f"gpuwatch {name}", p) for name, p in action.choices.items()]
    return out


def test_every_flag_has_a_description_in_help(tmp_path):
    for prog, parser in _parsers():
        args = prog.split()[1:]
        shown = run_gpuwatch([*args, "--help"], tmp_path)
        assert shown.returncode == 0, shown.stderr
        text = " ".join(shown.stdout.split())
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help and action.help != argparse.SUPPRESS, \
                f"{prog} {'/'.join(action.option_strings) or action.dest} has no description"
            # what argparse prints, wrapped: compare with spaces collapsed
            assert " ".join(action.help.split()) in text, (prog, action.help)


def test_top_level_help_ends_with_the_readme_usage_block(tmp_path):
    shown = run_gpuwatch(["--help"], tmp_path)
    assert shown.returncode == 0
    assert "examples:\n" + EXAMPLES in shown.stdout
    readme = (REPO / "README.md").read_text()
    m = re.search(r"## Usage\n\n((?:    .*\n)+)", readme)
    assert m, "README.md has no indented usage block under '## Usage'"
    assert m.group(1) == EXAMPLES, "README's usage block and `gpuwatch --help` differ"


# -- a recording piped in (--replay -) ------------------------------------------------------

def _advise_stdin(tmp_path, data: bytes, *extra: str, env: dict | None = None):
    import subprocess
    import sys

    from conftest import daemon_env
    copies = tmp_path / "tmp"  # where the copy of stdin goes (TMPDIR): this test's alone
    copies.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "gpuwatch", "advise", "--replay", "-", *extra],
                          cwd=REPO, env={**daemon_env(tmp_path), "TMPDIR": str(copies),
                                         **(env or {})},
                          input=data, capture_output=True, timeout=120, check=False)


def _judged(report: dict) -> list:
    return [(a["id"], a["gpu"], a["message"], a["since"], a["last_seen"]) for a in report["advice"]]


@pytest.mark.parametrize("gz", [False, True])
def test_replay_dash_reads_the_recording_from_stdin_as_a_file_would_be(tmp_path, gz):
    import gzip
    import json

    path = recording("fw_generate_device_map_bare")
    data = read_recording(path).encode()
    fed = gzip.compress(data) if gz else data
    want = json.loads(run_gpuwatch(["advise", "--replay", str(path), "--format", "json"],
                                   tmp_path).stdout)
    assert want["advice"], "the recording must give advice for the comparison to mean anything"
    # in one process, and split over several (the replay reads its file more than once)
    for workers in ("1", "3"):
        got = _advise_stdin(tmp_path, fed, "--format", "json",
                            env={"GPUWATCH_REPLAY_WORKERS": workers})
        assert got.returncode == 0, got.stderr
        rep = json.loads(got.stdout)
        assert rep["source"]["path"] == "<stdin>"
        assert rep["source"]["duration_seconds"] == want["source"]["duration_seconds"]
        assert _judged(rep) == _judged(want)
    text = _advise_stdin(tmp_path, fed)
    assert text.returncode == 0, text.stderr
    assert text.stdout.decode().startswith("gpuwatch advice: recording <stdin>, 76 s")
    # no copy is left behind in the temporary directory
    assert not list((tmp_path / "tmp").iterdir())


@pytest.mark.parametrize(("data", "expected"), [
    (b"", "gpuwatch: error: --replay -: standard input was empty: expected a "
          "gpuwatch-trace/1 recording (gpuwatch run --record FILE makes one)"),
    (b"garbage\n", "gpuwatch: error: <stdin>:1: not JSON (Expecting value: line 1 column 1 "
                   "(char 0)); the first line of a trace must be its meta line"),
])
def test_replay_dash_names_stdin_in_its_errors(tmp_path, data, expected):
    got = _advise_stdin(tmp_path, data)
    assert got.returncode == 2
    assert got.stderr.decode().splitlines()[-1] == expected
    assert not list((tmp_path / "tmp").iterdir())


def test_replay_dash_names_stdin_in_its_warnings(tmp_path):
    """A recording cut short mid-line is judged (its last line skipped, with a warning):
    the warning names the input, not the temporary copy the replay read."""
    data = read_recording(recording("fw_dp_loop")).encode()[:-40]
    got = _advise_stdin(tmp_path, data)
    assert got.returncode == 0, got.stderr
    err = got.stderr.decode()
    assert re.search(r"WARNING gpuwatch\.trace\.format: <stdin>:\d+: the last line is cut "
                     r"short", err), err
    assert "gpuwatch-stdin-" not in err and str(tmp_path) not in err
    assert not list((tmp_path / "tmp").iterdir())


def test_replay_dash_takes_a_text_stream_too(tmp_path, monkeypatch, capsys):
    """Where standard input is a text stream with no binary buffer under it (a notebook
    kernel's, a test's), the recording is still read, as its bytes in UTF-8."""
    import io
    import json

    from gpuwatch.cli import main

    text = read_recording(recording("fw_dp_loop"))
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    assert main(["advise", "--replay", "-", "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["source"]["path"] == "<stdin>"
    assert "use-ddp-not-dataparallel" in {a["id"] for a in rep["advice"]}
    assert not list(tmp_path.glob("gpuwatch-stdin-*"))
