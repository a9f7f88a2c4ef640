"""Bad input, fuzzed: hook datagrams, rule conditions and files, configuration files and
recordings. Each is refused with a clear message or read for what it is; nothing else is
affected and nothing grows without bound.

Property-based (hypothesis) with a fixed, derandomized profile: the same cases every run,
so CI is repeatable and each test stays within a few seconds.
"""

from __future__ import annotations

import json
import math
import os
import random
import socket
import subprocess
import sys
import textwrap

import pytest
from conftest import RECORDINGS, REPO, parse_metrics, read_recording, wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from gpuwatch.advisor import expr
from gpuwatch.advisor.rules import load_rules
from gpuwatch.errors import FileFormatError, UserError
from gpuwatch.job import protocol
from gpuwatch.job.receiver import HookReceiver
from gpuwatch.serve.config import load_config
from gpuwatch.serve.exporter import GpuwatchCollector
from gpuwatch.store import Store
from gpuwatch.trace.format import read_trace


def fuzz(n: int) -> settings:
    return settings(max_examples=n, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


# -- hook datagrams -------------------------------------------------------------------------

# values that break naive code: huge, negative, non-finite, denormal, wrong types, long text
HOSTILE_NUMBERS = [0, -1, 1, 7, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -2**70, 10**400,
                   1.5, -0.0, 1e308, -1e308, 5e-324, 1e-320, float("nan"), float("inf"),
                   float("-inf"), 1.7e9, 4.2e9, True, False]
HOSTILE = HOSTILE_NUMBERS + [None, "", "x", "1", "NaN", "x" * 5000, "\u0000\ud800", [], {},
                             [1, [2, [3]]], {"a": {"b": 1}}, [None] * 50, {"k": "v" * 600}]
FIELDS = ["kind", "pid", "seq", "t", "rank", "local_rank", "world_size", "gpu", "uuid",
          "steps_total", "skipped_total", "window", "steps", "steps_omitted", "loss_scale",
          "mem_allocated_bytes", "config", "exit_reason", "error", "sender_dropped",
          "hook_errors", "unknown_field"]


@st.composite
def datagrams(draw: st.DrawFn) -> bytes:
    """Mostly almost-valid reports with hostile values; some raw junk, some cut short."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=200))
    value = st.sampled_from(HOSTILE)
    number = st.sampled_from(HOSTILE_NUMBERS)
    msg: dict = {"v": draw(st.sampled_from([1, 1, 1, 2, "1", None])),
                 "kind": draw(st.sampled_from(["report", "exit", "REPORT", 3])),
                 "pid": draw(st.one_of(st.integers(1, 2**22), number)),
                 "t": draw(st.one_of(st.just(1.7e9), number))}
    for key in draw(st.lists(st.sampled_from(FIELDS), max_size=6, unique=True)):
        if key == "steps":
            n = draw(st.integers(0, 5))
            msg[key] = {k: [draw(number) for _ in range(n)]
                        for k in draw(st.lists(st.sampled_from(protocol.STEP_FIELDS),
                                               unique=True))}
        elif key == "window":
            msg[key] = {k: draw(number) for k in draw(st.lists(
                st.sampled_from(protocol.WINDOW_FIELDS), unique=True))}
        elif key == "config":
            msg[key] = {str(i): draw(value) for i in range(draw(st.integers(0, 100)))}
        else:
            msg[key] = draw(value)
    text = json.dumps(msg, allow_nan=True)  # NaN / Infinity as Python writes them
    if draw(st.integers(0, 4)) == 0 and len(text) > 2:
        text = text[:draw(st.integers(1, len(text) - 1))]  # cut short
    return text.encode(errors="surrogatepass")


def _finite_report(r: protocol.Report) -> None:
    for name in ("seq", "steps_total", "skipped_total", "steps_omitted", "hook_errors"):
        v = getattr(r, name)
        assert isinstance(v, int) and abs(v) <= protocol.MAX_INT, (name, v)
    for v in (r.t, r.loss_scale, *[getattr(r.window, f) for f in protocol.WINDOW_FIELDS]):
        assert v is None or math.isfinite(v)
    for s in r.steps:
        for v in (s.t, s.step_seconds, s.data_wait_seconds):
            assert v is None or math.isfinite(v)


def _decoded_or_refused(data: bytes) -> None:
    try:
        report = protocol.decode(data)
    except protocol.ProtocolError as err:
        assert err.reason in protocol.DROP_REASONS and str(err)
        return
    _finite_report(report)


@fuzz(1000)
@given(datagrams())
def test_decode_takes_a_report_or_refuses_with_a_reason_never_anything_else(data) -> None:
    _decoded_or_refused(data)


# what a step column may hold: the hook's own values (floats, small ints, booleans, null)
# beside the hostile ones, so that most columns are plain and some are not; JSON has no
# NaN, and an infinity only as a number too large (1e999, which parses as inf)
INF = "<inf>"
STEP_VALUES = [None, None, 0.0, 0.25, 1.7e9, 3, 64, True, False, INF, "1"] + [
    x for x in HOSTILE_NUMBERS if not isinstance(x, float) or math.isfinite(x)]


@st.composite
def step_columns(draw: st.DrawFn) -> bytes:
    n = draw(st.integers(1, 6))
    cols: dict = {}
    for key in protocol.STEP_FIELDS:
        how = draw(st.integers(0, 5))
        if how == 0 and key not in ("step", "t"):
            continue  # the column left out
        if how == 2:  # the types the hook writes, any value (negative, huge)
            kind = st.integers() if key in ("step", "batch_size", "micro_batches") else \
                st.booleans() if key in ("skipped", "first_batch") else \
                st.floats(allow_nan=False, allow_infinity=False)
            cols[key] = [draw(st.one_of(st.none(), kind) if key not in ("step", "t")
                              else kind) for _ in range(n)]
        elif how <= 1:  # as the hook writes it
            good = {"step": st.integers(0, 2**40), "t": st.floats(0, 4e9),
                    "batch_size": st.one_of(st.none(), st.integers(0, 4096)),
                    "micro_batches": st.one_of(st.none(), st.integers(0, 64)),
                    "skipped": st.one_of(st.none(), st.booleans()),
                    "first_batch": st.one_of(st.none(), st.booleans()),
                    "loss": st.one_of(st.none(), st.floats(-1e300, 1e300))}.get(
                        key, st.one_of(st.none(), st.floats(0, 1e6)))
            cols[key] = [draw(good) for _ in range(n)]
        else:
            cols[key] = [draw(st.sampled_from(STEP_VALUES)) for _ in range(n)]
    msg = {"v": 1, "kind": "report", "pid": 7, "t": 1.7e9, "steps": cols}
    return json.dumps(msg, allow_nan=False).replace(f'"{INF}"', "1e999").encode()


@fuzz(600)
@given(step_columns())
def test_steps_checked_a_column_at_a_time_are_what_value_by_value_checks_give(data) -> None:
    """decode() takes the hook's plain columns a column at a time; whatever it accepts so,
    the value-by-value checks (which name the first bad value) accept as the same records,
    and what it refuses they refuse with the same message."""
    value = json.loads(data)["steps"]
    n = len(value["step"])
    cols = {k: value.get(k) or [None] * n for k in protocol.STEP_FIELDS}
    try:
        reference: tuple | str = protocol._checked_steps(cols, n)
    except protocol.ProtocolError as err:
        reference = str(err)
    try:
        got: tuple | str = protocol.decode(data).steps
    except protocol.ProtocolError as err:
        got = str(err)
    assert got == reference
    if isinstance(got, tuple):  # the same values and the same types (1 is not 1.0)
        assert [list(map(type, r)) for r in got] == [list(map(type, r)) for r in reference]


def test_decode_survives_twenty_thousand_byte_mutations_of_a_real_report() -> None:
    """Cheap cases in bulk: a report as the hook writes it, mutated byte by byte."""
    steps = [protocol.StepRecord(step=i, t=1.7e9 + i, step_seconds=0.01, batch_size=32)
             for i in range(20)]
    good = protocol.encode({"kind": "report", "pid": 42, "seq": 3, "t": 1.7e9, "rank": 1,
                            "window": {"steps": 20, "timed": 20, "step_seconds": 0.2},
                            "config": {"num_workers": 4}}, steps)
    rng = random.Random(8)
    for _ in range(20_000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data))
            how = rng.randrange(4)
            if how == 0:
                data[at] = rng.randrange(256)
            elif how == 1:
                data.insert(at, rng.choice(b'0123456789-.eE"{}[],:'))
            elif how == 2:
                del data[at]
            else:
                data = data[:at]
                break
        _decoded_or_refused(bytes(data))


def test_fuzzed_datagrams_through_the_socket_cost_only_themselves(tmp_path) -> None:
    store = Store()
    receiver = HookReceiver(store, str(tmp_path / "hook.sock"))
    receiver.start()
    sent = []
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            @fuzz(300)
            @given(datagrams())
            def send(data: bytes) -> None:
                s.sendto(data, receiver.socket_path)
                sent.append(data)

            send()
            # and one sender claiming endless pids, ranks and GPUs
            for i in range(2000):
                s.sendto(protocol.encode({"kind": "report", "pid": 10_000 + i, "seq": i + 1,
                                          "t": 1.7e9, "rank": i, "gpu": i,
                                          "config": {"k": i}}), receiver.socket_path)
            total = len(sent) + 2000

            def counted() -> bool:
                h = store.latest().health
                return h.hook_messages_total + sum(h.hook_messages_dropped_total.values()) \
                    >= total

            wait_for(counted, "every datagram counted", 60)
        health = store.latest().health
        assert set(health.hook_messages_dropped_total) <= set(protocol.DROP_REASONS)
        # the kernel's pid wins: one sender is one job, whatever it claims
        assert {j.pid for j in store.latest().jobs} <= {os.getpid()}
        assert len(store.configs()) <= 1
        registry = CollectorRegistry(auto_describe=False)
        registry.register(GpuwatchCollector(store.latest))
        m = parse_metrics(generate_latest(registry).decode())
        train = [k for k in m if k[0].startswith("gpuwatch_train_")]
        assert len(train) <= 10  # one job's series
        errors = {dict(k[1])["source"]: v for k, v in m.items()
                  if k[0] == "gpuwatch_errors_total"}
        assert not any(errors.values()), errors
    finally:
        receiver.stop()


SENDER = ("import socket, sys, os; from gpuwatch.job import protocol; "
          "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); "
          "s.sendto(protocol.encode({'kind': 'report', 'pid': os.getpid(), 'seq': 1, "
          "'t': 1.7e9}), sys.argv[1])")


def test_new_processes_past_the_cap_are_dropped_and_counted(tmp_path) -> None:
    store = Store()
    receiver = HookReceiver(store, str(tmp_path / "hook.sock"), max_jobs=3)
    receiver.start()
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        for _ in range(5):
            subprocess.run([sys.executable, "-c", SENDER, receiver.socket_path], env=env,
                           check=True, timeout=60)
        wait_for(lambda: store.latest().health.hook_messages_dropped_total.get(
            protocol.TOO_MANY_JOBS) == 2, "two processes over the cap dropped")
        assert len(store.latest().jobs) == 3
        assert store.latest().health.hook_messages_total == 3
    finally:
        receiver.stop()


# -- rule conditions --------------------------------------------------------------------------

TOKENS = ["(", ")", "1", "9", "0", "1e308", "-", "+", "*", "/", "**", "<", "==", "and", "or",
          "not", "util", "mean(util, 30s)", "p99(step_seconds, 1m)", "max(1, 2)", "round(",
          ",", '"x"', "'y'", ".", "__class__", "[0]", "lambda", "import", "os", "true", "null",
          "clamp(util, 0, 1)", "coalesce(null, 1)", "@", ";", "{", "$x"]
NAMES = {"util", "step_seconds", "mem_used_bytes"}


class Ctx:
    def window(self, fn: str, name: str, seconds: float) -> float:
        return 1e308

    def last(self, name: str) -> float:
        return -1e308


@fuzz(1000)
@given(st.lists(st.sampled_from(TOKENS), min_size=1, max_size=60))
def test_conditions_parse_or_are_refused_and_evaluate_to_plain_values(tokens) -> None:
    text = " ".join(tokens)
    try:
        node = expr.parse(text, NAMES)
    except expr.ExprError as err:
        assert err.message and 0 <= err.column <= len(text)
        return
    value = expr.compile_expr(node)(Ctx())
    # no objects, no big integers, no strings longer than the condition itself
    assert value is None or isinstance(value, (bool, float, int, str))
    assert not isinstance(value, int) or isinstance(value, bool) or abs(value) < 2**53
    assert not isinstance(value, str) or len(value) <= len(text)


@pytest.mark.parametrize("text", ids=range(10), argvalues=[
    "9**9**9", "(((((" * 200 + "1" + ")))))" * 200, "not " * 3000 + "true",
    "- " * 3000 + "1", "1" + " + 1" * 5000, '"a" * 1e300', "util.__class__",
    "__import__('os')", "mean(util, 1e300s)", "x" * 10_000])
def test_hostile_conditions_are_refused_or_cost_nothing(text) -> None:
    try:
        value = expr.compile_expr(expr.parse(text, NAMES))(Ctx())
    except expr.ExprError as err:
        assert err.message
        return
    assert value is None or isinstance(value, (bool, float))


# -- rule files -------------------------------------------------------------------------------

RULE = """\
  - id: {id}
    title: t
    severity: info
    when: mean(util, 30s) < 0.5
    message: m
    action: a
"""


def test_rule_loading_says_every_problem_at_once_with_file_and_line(tmp_path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "a.yaml").write_text("rules:\n" + RULE.format(id="dup") + RULE.format(id="dup")
                                 + RULE.format(id="gpu-idle")
                                 + RULE.format(id="quiet") + "    suppressed_by: [nope]\n")
    (mine / "b.yaml").write_text("rules:\n" + RULE.format(id="dup"))
    missing = tmp_path / "not-there"
    with pytest.raises(FileFormatError) as err:
        load_rules([str(missing), str(mine)])
    msg = str(err.value)
    a, b = mine / "a.yaml", mine / "b.yaml"
    assert f"{a}:8: duplicate rule id 'dup' (first in {a}:2)" in msg
    assert f"{a}:14: rule id 'gpu-idle' is taken by a built-in rule" in msg
    assert f"{a}:20: rule 'quiet': suppressed_by names unknown rule 'nope'" in msg
    assert f"{b}:2: duplicate rule id 'dup' (first in {a}:2)" in msg
    assert f"{missing}: rule directory does not exist" in msg


def test_a_missing_rules_dir_in_the_config_file_is_said_with_its_line(tmp_path) -> None:
    cfg = tmp_path / "gpuwatch.yaml"
    cfg.write_text(f"interval: 0.01\nrules_dirs: [{tmp_path / 'nope'}]\n")
    with pytest.raises(FileFormatError) as err:
        load_config(str(cfg))
    msg = str(err.value)
    assert f"{cfg}:1: interval" in msg
    assert f"{cfg}:2: rules_dirs: {tmp_path / 'nope'} does not exist" in msg


LAUGHS = textwrap.dedent("""\
    a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
    b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
    c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
    d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
    e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
    f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
    g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
    rules: [*g,*g,*g,*g,*g,*g,*g,*g,*g]
    """)


@pytest.mark.parametrize("text,needle", ids=["laughs", "deep", "tag", "attribute"], argvalues=[
    (LAUGHS, "aliases"),
    ("rules: " + "[" * 5000 + "]" * 5000, "nested too deeply"),
    ("rules:\n  - !!python/object/apply:os.system ['true']\n", "tag"),
    ("rules:\n  - id: x\n    when: (1).__class__\n", "attribute access"),
])
def test_hostile_rule_files_are_refused_without_running_anything(text, needle) -> None:
    with pytest.raises(FileFormatError) as err:
        load_rules(builtin=False, files=[("x.yaml", text)])
    assert needle in str(err.value)


YAML_BITS = st.sampled_from([
    "interval: 1\n", "interval: -1\n", "interval: 1e999\n", "interval: .nan\n",
    "interval: 99999999999999999999999999\n", "listen_address: ':99999'\n",
    "listen_address: [1]\n", "rules_dirs: x\n", "rules_dirs: [/]\n", "hook_socket: ''\n",
    "record: {a: 1}\n", "slow_interval: 0.05\n", "history_seconds: 1e12\n", "nope: 1\n",
    "- 1\n", "{", "!!python/object:os.system x\n", "&a [*a]\n", "\t\n", "interval: 1\n",
    "\x00", "a: &a [1]\nb: *a\n", "key: 'unterminated\n", "? [1]\n: 2\n"])


@fuzz(500)
@given(st.lists(YAML_BITS, max_size=6), st.binary(max_size=20))
def test_config_files_load_or_are_refused_with_a_clear_message(tmp_path, bits, junk) -> None:
    cfg = tmp_path / "fuzz.yaml"
    cfg.write_bytes("".join(bits).encode() + (junk if len(bits) % 3 == 0 else b""))
    try:
        load_config(str(cfg))
    except FileFormatError as err:
        assert str(err).startswith(str(cfg))
    except UserError as err:
        assert str(cfg) in str(err)


def test_config_billion_laughs_is_refused_fast(tmp_path) -> None:
    cfg = tmp_path / "laughs.yaml"
    cfg.write_text(LAUGHS)
    with pytest.raises(FileFormatError, match="unknown key 'a'"):
        load_config(str(cfg))


# -- recordings ----------------------------------------------------------------------------

RECORDING = read_recording(RECORDINGS[0]).encode()[:60_000].rsplit(b"\n", 1)[0] + b"\n"


@fuzz(300)
@given(st.integers(0, len(RECORDING)), st.integers(0, 255), st.sampled_from(
    ["truncate", "flip", "insert"]))
def test_corrupt_recordings_replay_what_is_readable_or_say_where_they_broke(
        tmp_path, at, byte, how) -> None:
    data = bytearray(RECORDING)
    if how == "truncate":
        data = data[:at]
    elif how == "flip" and at < len(data):
        data[at] = byte
    else:
        data[at:at] = bytes([byte])
    path = tmp_path / "bad.jsonl"
    path.write_bytes(bytes(data))
    try:
        trace = read_trace(str(path))
    except FileFormatError as err:
        assert str(err).startswith(str(path)), str(err)
        return
    for line, msg in trace.warnings:
        assert msg and (line is None or line >= 1)


def test_a_cut_recording_replays_up_to_the_cut_and_says_so(tmp_path) -> None:
    path = tmp_path / "cut.jsonl"
    path.write_bytes(RECORDING[:len(RECORDING) // 2])
    lines = path.read_bytes().count(b"\n")
    proc = subprocess.run([sys.executable, "-m", "gpuwatch", "advise", "--replay", str(path),
                           "--format", "json"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"{path}:{lines + 1}: the last line is cut short" in proc.stderr
    json.loads(proc.stdout)


def test_a_corrupt_line_in_a_recording_is_named_with_its_line(tmp_path) -> None:
    lines = RECORDING.split(b"\n")
    lines[5] = b'{"kind": "gpu", "t": "yesterday"}'
    path = tmp_path / "corrupt.jsonl"
    path.write_bytes(b"\n".join(lines))
    proc = subprocess.run([sys.executable, "-m", "gpuwatch", "advise", "--replay", str(path)],
                          cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert proc.returncode == 2
    assert f"{path}:6:" in proc.stderr and "Traceback" not in proc.stderr
