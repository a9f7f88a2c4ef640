"""A rule's condition compiled to one Python function (gpuwatch/advisor/condsrc.py) answers
what the closures of gpuwatch/advisor/expr.py answer, for every value a slot can hold.

The engine judges with the compiled function; the closures are the language's meaning
(tests/test_expr.py) and what the reference engine of tests/test_advise_incremental.py
judges whole recordings with.
"""

from __future__ import annotations

import io
import json
import keyword
import math
import random
import re
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from conftest import recording

from gpuwatch import cli
from gpuwatch.advisor import condsrc, expr
from gpuwatch.advisor import engine as engine_mod
from gpuwatch.advisor.rules import load_rules

_MISSING = object()


class SlotCtx:
    """What the engine's context offers a condition: ``vals`` by slot, computed on first
    read by the slot's reader (a value held back until then)."""

    def __init__(self, values: list[Any], computed: list[bool]) -> None:
        self.hidden = values
        self.vals = [v if done else _MISSING for v, done in zip(values, computed, strict=True)]
        self.computes = 0


class Slots:
    """A slot per distinct value read, and its reader, as the engine hands them out."""

    def __init__(self) -> None:
        self.index: dict[tuple[str, str, float], int] = {}
        self.readers: list[Any] = []

    def slot_of(self, fn: str, name: str, seconds: float) -> tuple[int, Any]:
        key = (fn, name, seconds)
        i = self.index.get(key)
        if i is None:
            i = self.index[key] = len(self.readers)

            def read(ctx: SlotCtx, i: int = i) -> Any:
                v = ctx.vals[i]
                if v is _MISSING:
                    ctx.computes += 1
                    v = ctx.vals[i] = ctx.hidden[i]
                return v
            self.readers.append(read)
        return i, self.readers[i]

    def leaf(self, fn: str, name: str, seconds: float) -> Any:
        return self.slot_of(fn, name, seconds)[1]


def closure_holds(when: expr.Node, unless: tuple[expr.Node, ...], leaf: Any) -> Any:
    """The engine's test before condsrc: the conjuncts in order, then the unless clauses."""
    parts = expr.condition_parts(when, leaf)
    nots = [expr.compile_condition(u, leaf) for u in unless]

    def holds(ctx: Any) -> bool:
        return all(p(ctx) for p in parts) and not any(u(ctx) for u in nots)
    return holds


# what a slot may hold: unknown, text, booleans, whole and real numbers, the odd floats
_POOL: list[Any] = [None, None, "fsdp", "", "accelerate", True, False, 0, 1, 3, -2, 0.0, -0.0,
                    1.0, 0.5, 0.05, 0.98, 2.5, 1e12, -1.5, math.nan, math.inf, -math.inf]


def _value(rng: random.Random) -> Any:
    if rng.random() < 0.5:
        return rng.choice(_POOL)
    return rng.uniform(-0.5, 1.5) * rng.choice([1.0, 10.0, 1e9])


def _assignments(rng: random.Random, n: int, count: int) -> list[list[Any]]:
    return [[_value(rng) for _ in range(n)] for _ in range(count)]


def _check(when: expr.Node, unless: tuple[expr.Node, ...], rng: random.Random,
           count: int) -> int:
    """Both forms on ``count`` random slot assignments; how many held."""
    slots = Slots()
    compiled = condsrc.compile_rule(when, unless, slots.slot_of, slots.leaf, _MISSING)
    assert compiled is not None
    plain = closure_holds(when, unless, slots.leaf)
    held = 0
    for values in _assignments(rng, len(slots.readers), count):
        computed = [rng.random() < 0.5 for _ in values]
        a, b = SlotCtx(values, computed), SlotCtx(values, computed)
        got, want = compiled(a), plain(b)
        assert type(got) is bool
        assert got == want, (values, computed)
        held += want
    return held


@pytest.mark.parametrize("rule", load_rules().rules, ids=lambda r: r.id)
def test_every_builtin_rule_compiles_and_answers_as_its_closures(rule):
    assert rule.when_node is not None
    rng = random.Random(rule.id)
    _check(rule.when_node, rule.unless_nodes, rng, 400)
    # and with the first conjunct made true often, so the rest are asked too
    slots = Slots()
    compiled = condsrc.compile_rule(rule.when_node, rule.unless_nodes, slots.slot_of,
                                    slots.leaf, _MISSING)
    plain = closure_holds(rule.when_node, rule.unless_nodes, slots.leaf)
    for values in _assignments(rng, len(slots.readers), 400):
        for i in range(len(values)):
            if rng.random() < 0.6:
                values[i] = rng.choice([0.0, 0.5, 1.0, 2.0, 3e9, None])
        computed = [False] * len(values)
        assert compiled(SlotCtx(values, computed)) == plain(SlotCtx(values, computed))


CONDITIONS = [
    "util >= 0.5",
    "util == 1",
    "util != 1",
    "util",
    "not util",
    "-util < 0",
    "util + mem_util > 1 and util - mem_util < 0.5",
    "util * 2 >= mem_util / 2",
    "util / mem_util > 1",
    "util < mem_util",
    "util == mem_util or util != mem_util",
    "coalesce(util, mem_util)",
    "coalesce(util, mem_util) >= 0.5",
    "coalesce(util >= 0.5, mem_util < 0.1, false)",
    "coalesce(util, true) and coalesce(mem_util, false)",
    "known(util) and not known(mem_util)",
    "min(util, mem_util, 0.5) > 0.1",
    "max(util, 0.5) > min(mem_util, 15s)",
    "ifelse(util >= 0.5, mem_util, power_ratio) > 0.2",
    "ifelse(util, true, null)",
    "(util > 0.5 or mem_util > 0.5) and not (power_ratio > 0.5)",
    "util > 0.5 or mem_util",
    "mean(util, 15s) >= 0.5 and p50(mem_util, 15s) < 0.25 and last(power_ratio) > 0",
    "abs(util - 1) < 0.1 and round(mem_util, 1) == 0.5",
    "clamp(util, 0, 1) >= 0.5",
    "last(util) == 'fsdp' or last(util) != 'x'",
    "util == 'fsdp'",
    "'a' < util",
    "util >= 1s",
    "util and mem_util and power_ratio",
    "util or mem_util or power_ratio",
    "not (util and mem_util)",
    "pow2floor(util) >= 2 and divisor(util, mem_util) >= 1",
    "known(listing(ifelse(util > 0.5, 'a', null), ifelse(mem_util > 0.5, 'b', null)))",
    "listing(ifelse(util > 0.5, 'a', null), 'b') == 'a and b'",
]


@pytest.mark.parametrize("text", CONDITIONS)
def test_each_form_answers_as_its_closure(text):
    rng = random.Random(text)
    node = expr.parse(text)
    held = _check(node, (), rng, 600)
    unless = (expr.parse("power_ratio >= 0.9"), expr.parse("coalesce(mem_util, false)"))
    _check(node, unless, rng, 300)
    assert 0 <= held <= 600


def test_values_are_computed_once_and_only_as_far_as_the_condition_reads():
    slots = Slots()
    node = expr.parse("mean(util, 15s) >= 0.5 and mean(util, 15s) < 0.9 and mem_util > 0")
    compiled = condsrc.compile_rule(node, (), slots.slot_of, slots.leaf, _MISSING)
    ctx = SlotCtx([0.7, 0.1], [False, False])
    assert compiled(ctx) is True
    assert ctx.computes == 2  # the window read twice, computed once
    ctx = SlotCtx([0.2, 0.1], [False, False])
    assert compiled(ctx) is False
    assert ctx.computes == 1  # the first conjunct failed: mem_util never computed
    assert ctx.vals[1] is _MISSING


_MADE = re.compile(r"^(vals|ctx|holds|_x\d+|[KRF]\d+|_M|_neg|_not|_add|_sub|_mul|_div|_min|_max"
                   r"|_float|_str|_isinstance|_type|_bool|_cmp\d)$")


@pytest.mark.parametrize("rule", load_rules().rules, ids=lambda r: r.id)
def test_no_rule_text_reaches_the_source(rule):
    """The source's names are made by condsrc and its only literals are slot numbers:
    a rule's signals, strings and numbers stay in the namespace."""
    slots = Slots()
    fn = condsrc.compile_rule(rule.when_node, rule.unless_nodes, slots.slot_of, slots.leaf,
                              _MISSING)
    source = fn.source
    words = set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", source))
    for w in words:
        assert keyword.iskeyword(w) or _MADE.match(w), (w, source)
    assert "'" not in source and '"' not in source
    for number in re.findall(r"(?<![A-Za-z_0-9])\d+(?:\.\d+)?", source):
        assert number.isdigit()  # slot numbers only (vals[12])


def test_text_that_looks_like_code_stays_data():
    slots = Slots()
    node = expr.parse("last(util) == \"__import__('os').system('false')\" or util == 'x'")
    fn = condsrc.compile_rule(node, (), slots.slot_of, slots.leaf, _MISSING)
    assert "__import__" not in fn.source and "system" not in fn.source
    assert fn(SlotCtx(["__import__('os').system('false')"], [True])) is True
    assert fn(SlotCtx(["y"], [True])) is False


def _deep(levels: int) -> expr.Node:
    node = expr.Node("name", ("util",))
    for _ in range(levels):
        node = expr.Node(">=", (expr.Node("neg", (node,)), expr.Node("const", (0.5,))))
    return node


def test_what_python_cannot_compile_keeps_its_closures():
    # deeper than a rule file may nest (expr.MAX_DEPTH) and than Python's parser takes
    slots = Slots()
    assert condsrc.compile_rule(_deep(400), (), slots.slot_of, slots.leaf, _MISSING) is None
    # the deepest a rule file may write compiles
    node = expr.parse("not " * (expr.MAX_DEPTH - 2) + "(util >= 0.5)")
    assert condsrc.compile_rule(node, (), slots.slot_of, slots.leaf, _MISSING) is not None


def _report(path: Path) -> dict[str, Any]:
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["advise", "--replay", str(path), "--format", "json"]) == 0
    rep = json.loads(out.getvalue())
    rep.pop("generated_at", None)
    return rep


@pytest.mark.parametrize("name", ["gpu_starved_cnn", "fw_accel_clm_ddp"])
def test_the_engine_judges_the_same_with_the_closures(name, monkeypatch):
    """An engine whose rules could not be compiled (condsrc gave up on each) judges with
    the closures, and says the same."""
    path = recording(name)
    compiled = _report(path)
    monkeypatch.setattr(engine_mod, "compile_rule", lambda *a, **k: None)
    eng = engine_mod.Engine(load_rules())
    assert all(not hasattr(f, "source") for f in eng._compiled.values())
    assert _report(path) == compiled
    assert compiled["advice"], "a recording with advice, so the comparison means something"


def test_engines_of_the_same_rules_compile_their_source_once():
    rules = load_rules()
    a, b = engine_mod.Engine(rules), engine_mod.Engine(rules)
    for rid, fa in a._compiled.items():
        fb = b._compiled[rid]
        assert fa is not fb  # each reads its own engine's slots
        assert fa.__code__ is fb.__code__
