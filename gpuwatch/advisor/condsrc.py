"""A rule's whole condition as one Python function, for the engine's every bucket.

:mod:`gpuwatch.advisor.expr` compiles a condition to a tree of closures: one call per
operator and per value read. The engine asks ~30 conditions per GPU at every bucket, and
those calls are most of what a condition costs. Here the parsed tree of a rule's ``when``
(its conjuncts) and ``unless`` clauses becomes the source of one function, in which a
value read from a slot is a list index, a comparison with a number is an operator, and
``and``/``or`` are Python's; what is rarer (``ifelse``, ``knob``, ``clamp``...) stays the
closure :func:`expr.compile_expr` makes of it, called from the function.

It answers exactly what the closures answer (``condition_parts`` and
``compile_condition``: a conjunct counts when it is true; unknown is not true), for every
value a slot can hold (None, text, booleans, numbers, NaN).
tests/test_advise_condsrc.py holds the two to each other on every built-in rule.

No rule text reaches the compiled source: its only names are the ones made here
(``vals``, ``ctx``, ``_x3``, ``K0``, ``R12``, ``F1``, the helpers below), its only
literals are slot numbers, and a rule's constants are handed over in the function's
namespace, never written out. A condition whose source Python cannot compile (nested
deeper than its parser takes) keeps its closures.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from gpuwatch.advisor.expr import (
    Node,
    _chain,
    _number,
    arith_values,
    compare_values,
    compile_expr,
    max_values,
    min_values,
    negate_value,
    not_value,
)

# the comparisons (written as they are: the parser allows no other operator text)
_OPS = ("<", "<=", ">", ">=", "==", "!=")

Reader = Callable[[Any], Any]
# (fn, name, seconds) -> the slot that holds it at each bucket, and its reader (which
# computes it once a bucket, keeping it in ``ctx.vals``)
SlotOf = Callable[[str, str, float], tuple[int, Reader]]


_HELPERS: dict[str, Any] = {
    "_neg": negate_value, "_not": not_value,
    "_add": arith_values("+"), "_sub": arith_values("-"),
    "_mul": arith_values("*"), "_div": arith_values("/"),
    "_min": min_values, "_max": max_values,
    "_float": float, "_str": str, "_isinstance": isinstance, "_type": type, "_bool": bool,
    **{f"_cmp{i}": compare_values(op) for i, op in enumerate(_OPS)},
}
_CMP_NAME = {op: f"_cmp{i}" for i, op in enumerate(_OPS)}
_ARITH = {"+": "_add", "-": "_sub", "*": "_mul", "/": "_div"}


class _Source:
    """The source of one condition function, and the namespace it runs in."""

    def __init__(self, slot_of: SlotOf, leaf: Callable[[str, str, float], Reader],
                 missing: Any) -> None:
        self.slot_of = slot_of
        self.leaf = leaf
        self.ns: dict[str, Any] = dict(_HELPERS)
        self.ns["_M"] = missing  # a slot not computed yet this bucket
        self.temps = 0
        self.names: dict[int, str] = {}  # id(object) -> its name in the namespace

    def _name(self, prefix: str, obj: Any) -> str:
        key = id(obj)
        got = self.names.get(key)
        if got is None:
            got = self.names[key] = f"{prefix}{len(self.names)}"
            self.ns[got] = obj
        return got

    def _temp(self) -> str:
        self.temps += 1
        return f"_x{self.temps}"

    # -- values: what expr.compile_expr's closure returns -------------------------------
    def value(self, node: Node) -> str:
        op, a = node.op, node.args
        if op in ("const", "dur"):
            return self._name("K", a[0]) if not isinstance(a[0], (bool, type(None))) \
                else {True: "True", False: "False", None: "None"}[a[0]]
        if op == "name":
            return self.read("last", a[0], 0.0)
        if op == "win":
            return self.read(*a)
        if op == "neg":
            return f"_neg({self.value(a[0])})"
        if op == "not":
            return f"_not({self.value(a[0])})"
        if op in _ARITH:
            return f"{_ARITH[op]}({self.value(a[0])}, {self.value(a[1])})"
        if op in _OPS:
            y = _number(a[1])
            if y is not None:
                # expr._compare_number: unknown stays unknown, text never equals a number
                x = self._temp()
                text = "False" if op == "==" else "True" if op == "!=" else "None"
                return (f"(None if ({x} := {self.value(a[0])}) is None else {text} "
                        f"if _isinstance({x}, _str) else {x} {op} "
                        f"{self._name('K', y)})")
            return f"{_CMP_NAME[op]}({self.value(a[0])}, {self.value(a[1])})"
        if op == "call":
            name, args = a[0], a[1:]
            if name == "coalesce":
                out = "None"
                for arg in reversed(args):
                    x = self._temp()
                    out = f"({x} if ({x} := {self.value(arg)}) is not None else {out})"
                return out
            if name == "known":
                return f"({self.value(args[0])} is not None)"
            if name in ("min", "max"):
                return f"_{name}({', '.join(self.value(x) for x in args)})"
        # and/or (three-valued, stopping early), ifelse, knob and the rest: the closure
        return f"{self._name('F', compile_expr(node, self.leaf))}(ctx)"

    def read(self, fn: str, name: str, seconds: float) -> str:
        """A slot's value: kept this bucket, else computed by its reader."""
        i, reader = self.slot_of(fn, name, seconds)
        x = self._temp()
        return f"({x} if ({x} := vals[{int(i)}]) is not _M else {self._name('R', reader)}(ctx))"

    # -- truth: expr._truthy (known and true) ----------------------------------------------
    def truth(self, node: Node) -> str:
        op, a = node.op, node.args
        y = _number(a[1]) if op in _OPS else None
        if y is not None:
            # expr._test_number: unknown is not true, text only ever differs from a number
            x = self._temp()
            k = self._name("K", y)
            return (f"(False if ({x} := {self.value(a[0])}) is None else ({x} {op} {k}) "
                    f"if _type({x}) is _float else {op == '!='} if _isinstance({x}, _str) "
                    f"else _bool({x} {op} {k}))")
        if op in ("and", "or"):
            return "(" + f" {op} ".join(self.truth(x) for x in _chain(node)) + ")"
        if op == "call" and a[0] == "coalesce":
            out = "False"
            for arg in reversed(a[1:]):
                x = self._temp()
                out = f"(_bool({x}) if ({x} := {self.value(arg)}) is not None else {out})"
            return out
        return f"_bool({self.value(node)})"

    def condition(self, node: Node) -> str:
        """expr.compile_condition: a whole ``unless`` clause (or a ``when`` that is no
        conjunction)."""
        if node.op in ("and", "or") or (node.op in _OPS and _number(node.args[1]) is not None):
            return self.truth(node)
        return f"({self.value(node)} is True)"


@functools.lru_cache(maxsize=512)
def _compiled(code: str, where: str) -> Any:
    """Python's compilation of a condition's source, once per process: every engine made
    of the same rules (the live advisor's segments, each report) makes the same source,
    and compiling it costs more than the rest of an engine's making."""
    return compile(code, where, "exec")


def compile_rule(when: Node, unless: Sequence[Node], slot_of: SlotOf,
                 leaf: Callable[[str, str, float], Reader], missing: Any,
                 where: str = "<rule>") -> Callable[[Any], bool] | None:
    """``when`` holds (each conjunct true, in order, stopping at the first that is not)
    and no ``unless`` clause does, as one function of the engine's context; None where
    Python cannot compile its source (the caller keeps the closures). ``missing`` is the
    value of a slot not yet computed this bucket; ``leaf`` makes the closures of what
    stays a closure."""
    src = _Source(slot_of, leaf, missing)
    try:
        parts = [src.truth(x) for x in _chain(when)] if when.op == "and" \
            else [src.condition(when)]
        test = " and ".join(parts)
        if unless:
            test = f"({test}) and not ({' or '.join(src.condition(u) for u in unless)})"
        code = f"def holds(ctx):\n    vals = ctx.vals\n    return {test}\n"
        exec(_compiled(code, where), src.ns)  # noqa: S102 (no rule text: see above)
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        return None
    fn = src.ns["holds"]
    fn.source = code  # type: ignore[attr-defined]
    return fn
