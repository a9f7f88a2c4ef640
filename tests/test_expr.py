"""The condition language: parsing, three-valued evaluation, and what it refuses."""

from __future__ import annotations

import pytest

from gpuwatch.advisor.expr import ExprError, compile_expr, parse, parse_duration


class Ctx:
    """A data source stub: windowed statistics and last values from fixed tables."""

    def __init__(self, last: dict | None = None, windows: dict | None = None) -> None:
        self.lasts = last or {}
        self.windows = windows or {}
        self.asked: list[tuple[str, str, float]] = []

    def window(self, fn: str, name: str, seconds: float):
        self.asked.append((fn, name, seconds))
        return self.windows.get((fn, name, seconds))

    def last(self, name: str):
        return self.lasts.get(name)


NAMES = {"util", "sm_active", "mem_used_ratio", "batch_size", "autocast_dtype"}


def ev(text: str, ctx: Ctx | None = None):
    return compile_expr(parse(text, NAMES))(ctx or Ctx())


@pytest.mark.parametrize("text,value", [
    ("1 + 2 * 3", 7.0), ("(1 + 2) * 3", 9.0), ("-2 - -3", 1.0), ("10 / 4", 2.5),
    ("1 / 0", None), ("2 < 3 and 3 <= 3", True), ("not 1 > 2", True),
    ("min(3, 1, 2)", 1.0), ("max(1, 5)", 5.0), ("clamp(12, 0, 10)", 10.0),
    ("pow2floor(12.5)", 8.0), ("floor(2.7) + ceil(2.1)", 5.0), ("sqrt(16)", 4.0),
    ("divisor(16, 5.3)", 4.0), ("divisor(12, 7)", 6.0), ("divisor(7, 5)", 1.0),
    ("divisor(3, 40)", 3.0), ("divisor(0, 4)", None), ("divisor(6, 0.5)", None),
    ("divisor(2000000, 3000000)", 2000000.0), ("divisor(999999999989, 1000000)", 1.0),
    ("divisor(12, 1 / 0)", None),
    ("sqrt(-1)", None), ("round(2.567, 1)", 2.6), ('"bf16" == "bf16"', True),
    ("ifelse(1 > 2, 10, 20)", 20.0), ("coalesce(null, null, 3)", 3.0), ("known(null)", False),
    ("30s", 30.0), ("5m", 300.0), ("250ms", 0.25), ("1.5h", 5400.0),
    ('listing("a", "b", "c")', "a, b and c"), ('listing(null, "b", null, "d")', "b and d"),
    ('listing(null, "b")', "b"), ("listing(null, null)", None),
    ('listing("batch", 4, 1 > 2)', "batch, 4 and false"),
])
def test_arithmetic_logic_and_functions(text, value):
    assert ev(text) == value


def test_functions_of_infinite_or_nan_values_say_unknown_and_never_raise():
    # a rule reading a ratio of two windows can meet 1/0-like values: an error raised
    # here would stop every rule's evaluation of that bucket
    inf = Ctx(last={"util": float("inf"), "sm_active": float("nan")})
    assert ev("pow2floor(util)", inf) is None
    assert ev("pow2floor(sm_active)", inf) is None
    assert ev("round(2.5, util)", inf) is None
    assert ev("round(2.5, sm_active)", inf) is None
    assert ev("floor(util)", inf) is None and ev("ceil(sm_active)", inf) is None
    assert ev("round(util, 1)", inf) == float("inf")


def test_windowed_functions_read_the_source_with_their_window_in_seconds():
    ctx = Ctx(windows={("mean", "util", 60.0): 0.3, ("p95", "sm_active", 30.0): 0.9,
                       ("max", "util", 120.0): 0.8})
    assert ev("mean(util, 1m) < 0.5 and p95(sm_active, 30s) > 0.8", ctx) is True
    assert ev("max(util, 2m)", ctx) == 0.8  # a signal and a duration: windowed
    assert ("max", "util", 120.0) in ctx.asked


def test_bare_signal_is_its_last_value():
    assert ev("batch_size * 2", Ctx(last={"batch_size": 32})) == 64.0
    assert ev("last(batch_size)", Ctx(last={"batch_size": 32})) == 32


def test_unknown_spreads_with_three_valued_logic():
    ctx = Ctx(last={"util": 0.2})  # sm_active not measured
    assert ev("sm_active < 0.5", ctx) is None
    assert ev("sm_active < 0.5 and util > 0.5", ctx) is False  # unknown and false
    assert ev("sm_active < 0.5 or util < 0.5", ctx) is True  # unknown or true
    assert ev("sm_active < 0.5 and util < 0.5", ctx) is None
    assert ev("not sm_active < 0.5", ctx) is None
    assert ev("sm_active + 1", ctx) is None
    assert ev("coalesce(sm_active < 0.5, util < 0.5)", ctx) is True


def test_and_or_short_circuit():
    ctx = Ctx(last={"util": 0.9})
    assert ev("util < 0.5 and mean(sm_active, 30s) < 0.4", ctx) is False
    assert ctx.asked == []  # the window was never computed


@pytest.mark.parametrize("text,needle", [
    ("util.__class__", "attribute access"),
    ("__import__('os')", "names starting with '_'"),
    ("util[0]", "indexing"),
    ("open('x')", "function 'open' is not allowed"),
    ("eval('1')", "function 'eval' is not allowed"),
    ("getattr(util, 'x')", "not allowed"),
    ("lambda: 1", "not part of the condition language"),
    ("util = 1", "'=' is not a comparison"),
    ("1 < util < 2", "do not chain"),
    ("mean(util, 30)", "needs a unit"),
    ("mean(0.5, 30s)", "must be a signal name"),
    ("mean(util)", "takes a signal and a window"),
    ("utl > 0.5", "unknown signal 'utl' (did you mean util?)"),
    ("util >", "expected a value"),
    ("(util > 1", "expected ')'"),
    ("util ** 2", "'**' is not supported"),
    ("util && 1", "write 'and'"),
    ("", "empty condition"),
    ("sqrt(1, 2)", "takes 1 argument"),
    ("listing()", "takes 1 or more argument"),
])
def test_rejected_at_parse_time(text, needle):
    with pytest.raises(ExprError) as err:
        parse(text, NAMES)
    assert needle in err.value.message


def test_error_column_points_at_the_problem():
    with pytest.raises(ExprError) as err:
        parse("util > 0.5 and foo > 1", NAMES)
    assert err.value.column == len("util > 0.5 and ")


@pytest.mark.parametrize("value,seconds", [("30s", 30.0), ("5m", 300.0), (12, 12.0),
                                           ("1h", 3600.0), ("0.5s", 0.5)])
def test_durations(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["30", "soon", -1, True, "5 minutes"])
def test_bad_durations(value):
    with pytest.raises(ValueError):
        parse_duration(value)
