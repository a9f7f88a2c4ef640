"""The rule condition language: a tokenizer, a parser to an AST, and closures to evaluate it.

A rule file must never be able to run code, so nothing here calls ``eval``/``exec`` or
looks anything up by a name the rule wrote: every name is checked against the signal
vocabulary or the function whitelist when the file is loaded, attribute access,
indexing and names starting with ``_`` are rejected by the tokenizer, and evaluation only
walks the parsed tree (compiled to closures for speed).

Values are numbers, booleans, strings or ``None`` ("not measured"). ``None`` spreads
through arithmetic and comparisons, and ``and``/``or``/``not`` use three-valued (Kleene)
logic, so a condition over a signal a source cannot measure is "unknown", never true by
accident: ``unknown and false`` is false, ``unknown or true`` is true, otherwise unknown.

Windowed functions take a signal name and a window with a unit: ``mean(util, 30s)``.
``min``/``max`` with a signal and a duration are windowed; with anything else they are the
plain minimum/maximum of their arguments.
"""

from __future__ import annotations

import difflib
import math
import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "SCALAR_FUNCTIONS",
    "WINDOW_FUNCTIONS",
    "Context",
    "ExprError",
    "Node",
    "compile_condition",
    "compile_expr",
    "condition_parts",
    "parse",
    "parse_duration",
]


# a rule file is input: bound what one condition may cost to parse, compile and evaluate
MAX_TEXT = 4000  # characters
MAX_DEPTH = 64  # levels of the parsed tree


class ExprError(ValueError):
    """A condition that does not parse or names something it may not; ``column`` is 0-based."""

    def __init__(self, message: str, column: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.column = column


class Context(Protocol):
    """What evaluation asks of a data source, at one evaluation time."""

    def window(self, fn: str, name: str, seconds: float) -> Any: ...

    def last(self, name: str) -> Any: ...

    def knob(self, name: str, old: Any, new: Any) -> Any: ...


# windowed statistics over a signal: name -> (needs a window, what it is)
WINDOW_FUNCTIONS: dict[str, str] = {
    "mean": "mean over the window (weighted: step signals by steps, ratios by time)",
    "avg": "same as mean",
    "min": "smallest value in the window (with a signal and a duration)",
    "max": "largest value in the window (with a signal and a duration)",
    "median": "50th percentile", "p50": "50th percentile", "p90": "90th percentile",
    "p95": "95th percentile", "p99": "99th percentile",
    "stddev": "standard deviation of the values in the window",
    "first": "oldest value in the window", "last": "newest value (window optional)",
    "count": "how many time buckets in the window have a value",
    "delta": "increase of a counter over the window (resets counted from zero)",
    "increase": "same as delta",
    "rate": "delta per second",
}

SCALAR_FUNCTIONS: dict[str, str] = {
    "abs": "absolute value", "sqrt": "square root", "log2": "base-2 logarithm",
    "floor": "round down", "ceil": "round up", "round": "round(x) or round(x, digits)",
    "min": "smallest argument", "max": "largest argument",
    "clamp": "clamp(x, lo, hi)", "pow2floor": "largest power of two <= x (x >= 1)",
    "divisor": ("divisor(n, limit): the largest divisor of the whole number n that is <= "
                "limit (1 when none but 1; unknown for n < 1, n > 1e12 or limit < 1)"),
    "coalesce": "first argument that is known", "known": "true when the argument is known",
    "ifelse": "ifelse(cond, a, b): a when cond is true, b when false, unknown when unknown",
    "knob": ('knob("name", old, new): the change of a setting in the words of the framework '
             "that drives the job, with the torch form beside it (docs/rules.md)"),
    "listing": ('listing(a, b, ...): the known ones of its texts as a list in words, "a, b '
                'and c"; unknown when none is known'),
}

_KEYWORDS = {"and", "or", "not", "true", "false", "null"}
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)\s*$")


def parse_duration(value: Any) -> float:
    """``"30s"``, ``"5m"``, ``"1h"``, ``"250ms"`` or a number of seconds → seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0 or math.isnan(value) or math.isinf(value):
            raise ValueError(f"a duration must be a finite number >= 0, got {value!r}")
        return float(value)
    if isinstance(value, str):
        m = _DURATION_RE.match(value)
        if m:
            return float(m.group(1)) * _UNITS[m.group(2)]
    raise ValueError(f"expected a duration like 30s, 5m or 1h, got {value!r}")


# -- tokens -------------------------------------------------------------------------
_TOKEN_RE = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)(?P<unit>ms|s|m|h|d)?(?![A-Za-z0-9_])
  | (?P<str>"[^"\\\n]*"|'[^'\\\n]*')
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op><=|>=|==|!=|<|>|\+|-|\*|/|\(|\)|,)
""", re.VERBOSE)

_FORBIDDEN = {
    ".": "attribute access ('.') is not allowed in a condition",
    "[": "indexing ('[') is not allowed in a condition",
    "]": "indexing (']') is not allowed in a condition",
    "=": "'=' is not a comparison: write '=='",
    "{": "'{' is not allowed in a condition", "}": "'}' is not allowed in a condition",
    "@": "'@' is not allowed in a condition", ";": "';' is not allowed in a condition",
    "`": "'`' is not allowed in a condition", "\\": "'\\' is not allowed in a condition",
}


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str  # num, dur, str, name, op, kw, end
    text: str
    col: int
    value: Any = None


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    pos = 0
    while pos < len(text):
        if text.startswith("**", pos):
            raise ExprError("'**' is not supported: write x * x", pos)
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            ch = text[pos]
            if text.startswith("!", pos):
                raise ExprError("'!' is not an operator: write 'not'", pos)
            if ch in "&|":
                raise ExprError(f"{ch!r} is not an operator: write 'and' / 'or'", pos)
            raise ExprError(_FORBIDDEN.get(ch, f"unexpected character {ch!r}"), pos)
        if m.lastgroup == "ws":
            pos = m.end()
            continue
        col = m.start()
        if m.group("num") is not None:
            number = float(m.group("num"))
            unit = m.group("unit")
            if unit:
                toks.append(_Tok("dur", m.group(0), col, number * _UNITS[unit]))
            else:
                toks.append(_Tok("num", m.group(0), col, number))
        elif m.group("str") is not None:
            toks.append(_Tok("str", m.group(0), col, m.group("str")[1:-1]))
        elif m.group("name") is not None:
            name = m.group("name")
            if name.startswith("_"):
                raise ExprError(f"names starting with '_' are not allowed ({name!r})", col)
            if name in _KEYWORDS:
                toks.append(_Tok("kw", name, col))
            elif name in ("True", "False", "None", "lambda", "import"):
                raise ExprError(f"{name!r} is not part of the condition language "
                                "(use true, false, null)", col)
            else:
                toks.append(_Tok("name", name, col))
        else:
            toks.append(_Tok("op", m.group("op"), col))
        pos = m.end()
    toks.append(_Tok("end", "", len(text)))
    return toks


# -- AST ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Node:
    """One node of a parsed condition. ``op`` is what it is; ``args`` its children."""

    op: str  # const, dur, name, call, win, neg, not, and, or, + - * /, < <= > >= == !=
    args: tuple[Any, ...]
    col: int = 0

    def walk(self) -> Iterable[Node]:
        yield self
        for a in self.args:
            if isinstance(a, Node):
                yield from a.walk()


class _Parser:
    def __init__(self, text: str, names: Iterable[str] | None) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0
        self.names = set(names) if names is not None else None

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def take(self) -> _Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def expect(self, text: str) -> _Tok:
        tok = self.peek()
        if tok.text != text or tok.kind not in ("op", "kw"):
            found = "the end" if tok.kind == "end" else repr(tok.text)
            raise ExprError(f"expected {text!r}, found {found}", tok.col)
        return self.take()

    def parse(self) -> Node:
        if self.peek().kind == "end":
            raise ExprError("empty condition", 0)
        node = self.or_()
        tok = self.peek()
        if tok.kind != "end":
            raise ExprError(f"unexpected {tok.text!r} after a complete expression", tok.col)
        return node

    def or_(self) -> Node:
        node = self.and_()
        while self.peek().kind == "kw" and self.peek().text == "or":
            col = self.take().col
            node = Node("or", (node, self.and_()), col)
        return node

    def and_(self) -> Node:
        node = self.not_()
        while self.peek().kind == "kw" and self.peek().text == "and":
            col = self.take().col
            node = Node("and", (node, self.not_()), col)
        return node

    def not_(self) -> Node:
        tok = self.peek()
        if tok.kind == "kw" and tok.text == "not":
            self.take()
            return Node("not", (self.not_(),), tok.col)
        return self.cmp()

    def cmp(self) -> Node:
        node = self.add()
        tok = self.peek()
        if tok.kind == "op" and tok.text in ("<", "<=", ">", ">=", "==", "!="):
            self.take()
            node = Node(tok.text, (node, self.add()), tok.col)
            nxt = self.peek()
            if nxt.kind == "op" and nxt.text in ("<", "<=", ">", ">=", "==", "!="):
                raise ExprError("comparisons do not chain: write 'a < b and b < c'", nxt.col)
        return node

    def add(self) -> Node:
        node = self.mul()
        while self.peek().kind == "op" and self.peek().text in ("+", "-"):
            tok = self.take()
            node = Node(tok.text, (node, self.mul()), tok.col)
        return node

    def mul(self) -> Node:
        node = self.unary()
        while self.peek().kind == "op" and self.peek().text in ("*", "/"):
            tok = self.take()
            node = Node(tok.text, (node, self.unary()), tok.col)
        return node

    def unary(self) -> Node:
        tok = self.peek()
        if tok.kind == "op" and tok.text == "-":
            self.take()
            return Node("neg", (self.unary(),), tok.col)
        return self.atom()

    def atom(self) -> Node:
        tok = self.take()
        if tok.kind == "num":
            return Node("const", (tok.value,), tok.col)
        if tok.kind == "dur":
            return Node("dur", (tok.value,), tok.col)
        if tok.kind == "str":
            return Node("const", (tok.value,), tok.col)
        if tok.kind == "kw" and tok.text in ("true", "false", "null"):
            return Node("const", ({"true": True, "false": False, "null": None}[tok.text],),
                        tok.col)
        if tok.kind == "op" and tok.text == "(":
            node = self.or_()
            self.expect(")")
            return node
        if tok.kind == "name":
            if self.peek().kind == "op" and self.peek().text == "(":
                return self.call(tok)
            self.check_name(tok.text, tok.col)
            return Node("name", (tok.text,), tok.col)
        found = "the end of the condition" if tok.kind == "end" else repr(tok.text)
        raise ExprError(f"expected a value, found {found}", tok.col)

    def check_name(self, name: str, col: int) -> None:
        if self.names is None or name in self.names:
            return
        near = difflib.get_close_matches(name, sorted(self.names), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ExprError(f"unknown signal {name!r}{hint}", col)

    def call(self, fname: _Tok) -> Node:
        name = fname.text
        self.expect("(")
        args: list[Node] = []
        if not (self.peek().kind == "op" and self.peek().text == ")"):
            # a windowed function's first argument is a signal name, not a value
            args.append(self.or_())
            while self.peek().kind == "op" and self.peek().text == ",":
                self.take()
                args.append(self.or_())
        self.expect(")")
        is_window = name in WINDOW_FUNCTIONS and (
            name not in ("min", "max")
            or (len(args) == 2 and args[0].op == "name" and args[1].op == "dur"))
        if is_window:
            return self.window_call(name, args, fname.col)
        if name not in SCALAR_FUNCTIONS:
            allowed = ", ".join(sorted(set(WINDOW_FUNCTIONS) | set(SCALAR_FUNCTIONS)))
            raise ExprError(f"function {name!r} is not allowed (allowed: {allowed})", fname.col)
        arity = {"abs": (1, 1), "sqrt": (1, 1), "log2": (1, 1), "floor": (1, 1),
                 "ceil": (1, 1), "round": (1, 2), "clamp": (3, 3), "pow2floor": (1, 1),
                 "divisor": (2, 2),
                 "known": (1, 1), "ifelse": (3, 3), "min": (1, 99), "max": (1, 99),
                 "coalesce": (1, 99), "knob": (3, 3), "listing": (1, 99)}[name]
        if not arity[0] <= len(args) <= arity[1]:
            want = str(arity[0]) if arity[0] == arity[1] else f"{arity[0]} or more"
            raise ExprError(f"{name}() takes {want} argument(s), got {len(args)}", fname.col)
        for a in args:
            if a.op == "dur" and name not in ("min", "max"):
                raise ExprError(f"{name}() does not take a window", a.col)
        if name == "knob":
            from gpuwatch.advisor.knobs import KNOBS

            first = args[0]
            if first.op != "const" or first.args[0] not in KNOBS:
                raise ExprError(f"knob() takes the name of a setting first, one of "
                                f"{', '.join(sorted(KNOBS))}", first.col)
        return Node("call", (name, *args), fname.col)

    def window_call(self, name: str, args: list[Node], col: int) -> Node:
        if name == "last" and len(args) == 1:
            args = [args[0], Node("dur", (0.0,), col)]
        if len(args) != 2:
            raise ExprError(f"{name}() takes a signal and a window, e.g. {name}(util, 30s)", col)
        sig, win = args
        if sig.op != "name":
            raise ExprError(f"the first argument of {name}() must be a signal name", sig.col)
        if win.op != "dur":
            if win.op == "const" and isinstance(win.args[0], (int, float)):
                raise ExprError(f"the window of {name}() needs a unit, e.g. "
                                f"{name}({sig.args[0]}, 30s)", win.col)
            raise ExprError(f"the second argument of {name}() must be a window like 30s",
                            win.col)
        return Node("win", (name, sig.args[0], win.args[0]), col)


def parse(text: str, names: Iterable[str] | None = None) -> Node:
    """Parse a condition; ``names`` (if given) are the signal names it may use."""
    if not isinstance(text, str):
        raise ExprError(f"expected an expression as text, got {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise ExprError(f"the condition is {len(text)} characters long; at most {MAX_TEXT}")
    try:
        node = _Parser(text, names).parse()
    except RecursionError:
        raise ExprError(f"the condition is nested too deeply (at most {MAX_DEPTH} levels)"
                        ) from None
    # compiling and evaluating recurse over the tree: bound its depth (counted without
    # recursion, so a long chain like 1+1+...+1 cannot fail here either)
    stack = [(node, 1)]
    while stack:
        n, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ExprError(f"the condition is nested too deeply (at most {MAX_DEPTH} levels "
                            "of operators, calls and parentheses)", n.col)
        stack.extend((a, depth + 1) for a in n.args if isinstance(a, Node))
    return node


def signals_of(node: Node) -> set[str]:
    """Every signal a parsed condition reads."""
    out: set[str] = set()
    for n in node.walk():
        if n.op == "name":
            out.add(n.args[0])
        elif n.op == "win":
            out.add(n.args[1])
    return out


def reads_of(node: Node) -> Iterable[tuple[str, float]]:
    """Every value a parsed condition reads, as ``(name, seconds)``: a window's length, or
    0.0 for a newest value (a bare name, ``last(name)``). Names may be the rule's own."""
    for n in node.walk():
        if n.op == "name":
            yield n.args[0], 0.0
        elif n.op == "win":
            yield n.args[1], float(n.args[2])


def max_window(node: Node) -> float:
    """The longest window a parsed condition looks back over (seconds)."""
    return max((n.args[2] for n in node.walk() if n.op == "win"), default=0.0)


# -- evaluation ---------------------------------------------------------------------------
Compiled = Callable[[Any], Any]
# what a value a condition reads compiles to: ``(fn, name, seconds)`` -> a function of the
# context. ``("last", name, 0.0)`` is a bare name (``util``, ``last(util)``). The default
# asks the context (``ctx.window``, ``ctx.last``); an evaluator with its own store of
# values (the engine's per-bucket slots) passes its own and skips that hop.
LeafFactory = Callable[[str, str, float], Compiled]


def ask_context(fn: str, name: str, seconds: float) -> Compiled:
    """The default :data:`LeafFactory`: read through the :class:`Context` methods."""
    if fn == "last" and seconds == 0.0:
        return lambda ctx: ctx.last(name)
    return lambda ctx: ctx.window(fn, name, seconds)


def _truth(v: Any) -> bool | None:
    if v is None:
        return None
    if isinstance(v, str):
        return bool(v)
    return bool(v)


def _num(v: Any) -> float | None:
    if v is None or isinstance(v, str):
        return None
    return float(v)


def compile_expr(node: Node, leaf: LeafFactory = ask_context) -> Compiled:
    """Turn a parsed condition into a function of a :class:`Context` (``leaf``: how a
    signal's value is read, see :data:`LeafFactory`)."""
    op = node.op
    a = node.args
    if op in ("const", "dur"):
        value = a[0]
        return lambda ctx: value
    if op == "name":
        return leaf("last", a[0], 0.0)
    if op == "win":
        return leaf(*a)
    if op == "neg":
        f = compile_expr(a[0], leaf)

        def neg(ctx: Any) -> Any:
            return negate_value(f(ctx))
        return neg
    if op == "not":
        f = compile_expr(a[0], leaf)

        def not_(ctx: Any) -> Any:
            return not_value(f(ctx))
        return not_
    if op == "and":
        # a chain of ``and`` as one closure (``a and b and c`` parses as nested pairs): the
        # same operands evaluated in the same order, without a call per pair
        parts = [compile_expr(x, leaf) for x in _chain(node)]

        def and_(ctx: Any) -> Any:
            unknown = False
            for part in parts:
                v = part(ctx)
                if v is None:
                    unknown = True
                elif not v:
                    return False
            return None if unknown else True
        return and_
    if op == "or":
        parts = [compile_expr(x, leaf) for x in _chain(node)]

        def or_(ctx: Any) -> Any:
            unknown = False
            for part in parts:
                v = part(ctx)
                if v is None:
                    unknown = True
                elif v:
                    return True
            return None if unknown else False
        return or_
    if op in ("+", "-", "*", "/"):
        left, right = compile_expr(a[0], leaf), compile_expr(a[1], leaf)
        return _arith(op, left, right)
    if op in ("<", "<=", ">", ">=", "==", "!="):
        left = compile_expr(a[0], leaf)
        const = _number(a[1])
        if const is not None:  # the usual ``signal >= 0.5``: a cheaper closure
            return _compare_number(op, left, const)
        return _compare(op, left, compile_expr(a[1], leaf))
    if op == "call":
        return _call(a[0], [compile_expr(x, leaf) for x in a[1:]])
    raise ExprError(f"internal: unknown node {op!r}", node.col)


def _number(node: Node) -> float | None:
    """A comparison's right side when it is a plain number (a constant or a duration)."""
    if node.op in ("const", "dur") and type(node.args[0]) in (int, float):
        return node.args[0]
    return None


def _chain(node: Node) -> list[Node]:
    """The operands of a run of the same logical operator, left to right."""
    out: list[Node] = []
    for arg in node.args:
        if isinstance(arg, Node) and arg.op == node.op:
            out.extend(_chain(arg))
        else:
            out.append(arg)
    return out


def compile_condition(node: Node, leaf: LeafFactory = ask_context
                      ) -> Callable[[Any], bool]:
    """``compile_expr(node)(ctx) is True`` as a predicate, for a rule's ``when``/``unless``.

    Only "true" matters to a condition, so a conjunction stops at its first operand that
    is not true (false or unknown): a rule gated on a setting the recording never gives
    (``last(fused_optimizer) == 0 and ...``) costs one look-up, and one whose first window
    is out of range costs that window. Evaluation has no effects, so skipping the rest
    cannot change any result.
    """
    if node.op in ("and", "or") or _is_number_test(node):
        return _truthy(node, leaf)
    f = compile_expr(node, leaf)
    return lambda ctx: f(ctx) is True


def condition_parts(node: Node, leaf: LeafFactory = ask_context
                    ) -> list[Callable[[Any], bool]]:
    """``compile_condition(node, leaf)`` as the list of its conjuncts' predicates: the
    condition holds when every one does, asked in order until one does not. An evaluator
    that runs the list itself saves a call per condition."""
    if node.op == "and":
        return [_truthy(x, leaf) for x in _chain(node)]
    return [compile_condition(node, leaf)]


def _is_number_test(node: Node) -> bool:
    return node.op in _ORDER and _number(node.args[1]) is not None


def _truthy(node: Node, leaf: LeafFactory) -> Callable[[Any], bool]:
    """Whether a value counts as true in ``and``/``or``: known and truthy."""
    if _is_number_test(node):
        # ``signal >= 0.5`` as one closure answering True or False: the comparison and
        # its truth test fused (what most conditions are made of)
        return _test_number(node.op, compile_expr(node.args[0], leaf), _number(node.args[1]))
    if node.op == "and":
        parts = [_truthy(x, leaf) for x in _chain(node)]

        def all_true(ctx: Any) -> bool:
            for part in parts:
                if not part(ctx):
                    return False
            return True
        return all_true
    if node.op == "or":
        parts = [_truthy(x, leaf) for x in _chain(node)]

        def any_true(ctx: Any) -> bool:
            for part in parts:
                if part(ctx):
                    return True
            return False
        return any_true
    if node.op == "call" and node.args[0] == "coalesce":
        # the first known value's truth, without building the value first
        fs = [compile_expr(x, leaf) for x in node.args[1:]]

        def first_known(ctx: Any) -> bool:
            for f in fs:
                v = f(ctx)
                if v is not None:
                    return bool(v)
            return False
        return first_known
    f = compile_expr(node, leaf)
    return lambda ctx: bool(f(ctx))  # bool(None) is False: unknown is not true


def _arith(op: str, left: Compiled, right: Compiled) -> Compiled:
    of = arith_values(op)

    def arith(ctx: Any) -> Any:
        return of(left(ctx), right(ctx))
    return arith


def _plus(a: Any, b: Any) -> Any:
    x, y = _num(a), _num(b)
    return None if x is None or y is None else x + y


def _minus(a: Any, b: Any) -> Any:
    x, y = _num(a), _num(b)
    return None if x is None or y is None else x - y


def _times(a: Any, b: Any) -> Any:
    x, y = _num(a), _num(b)
    return None if x is None or y is None else x * y


def _over(a: Any, b: Any) -> Any:
    x, y = _num(a), _num(b)
    return None if x is None or y is None or y == 0 else x / y


def arith_values(op: str) -> Callable[[Any, Any], Any]:
    """Arithmetic of two values: unknown where either is not a number; x / 0 unknown."""
    return {"+": _plus, "-": _minus, "*": _times, "/": _over}[op]


def negate_value(v: Any) -> Any:
    """``-v``: unknown where ``v`` is not a number."""
    x = _num(v)
    return None if x is None else -x


def not_value(v: Any) -> Any:
    """``not v``: unknown stays unknown."""
    return None if v is None else not v


def min_values(*args: Any) -> Any:
    """The smallest argument: unknown where any is not a number."""
    vals = [_num(v) for v in args]
    return None if any(v is None for v in vals) else min(vals)


def max_values(*args: Any) -> Any:
    """The largest argument: unknown where any is not a number."""
    vals = [_num(v) for v in args]
    return None if any(v is None for v in vals) else max(vals)


def _compare(op: str, left: Compiled, right: Compiled) -> Compiled:
    of = compare_values(op)

    def compare(ctx: Any) -> Any:
        return of(left(ctx), right(ctx))
    return compare


def compare_values(op: str) -> Callable[[Any, Any], Any]:
    """A comparison of two values: unknown where either is, text only equal or unequal
    to anything but text."""
    def compare(x: Any, y: Any) -> Any:
        if x is None or y is None:
            return None
        if isinstance(x, str) or isinstance(y, str):
            if op == "==":
                return x == y
            if op == "!=":
                return x != y
            if not (isinstance(x, str) and isinstance(y, str)):
                return None
        if op == "<":
            return x < y
        if op == "<=":
            return x <= y
        if op == ">":
            return x > y
        if op == ">=":
            return x >= y
        if op == "==":
            return x == y
        return x != y
    return compare


_ORDER = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
          "==": operator.eq, "!=": operator.ne}


def _compare_number(op: str, left: Compiled, y: float) -> Compiled:
    """``_compare`` with a number on the right (same results)."""
    cmp = _ORDER[op]
    text_result = {"==": False, "!=": True}.get(op)  # text never equals a number

    def compare(ctx: Any) -> Any:
        x = left(ctx)
        if x is None:
            return None
        if isinstance(x, str):
            return text_result
        return cmp(x, y)
    return compare


def _test_number(op: str, left: Compiled, y: float) -> Callable[[Any], bool]:
    """``bool(_compare_number(op, left, y)(ctx))``: unknown is not true, text only ever
    differs from a number."""
    cmp = _ORDER[op]
    text_result = op == "!="

    def test(ctx: Any) -> bool:
        x = left(ctx)
        if x is None:
            return False
        if type(x) is float:  # the usual value: no further test
            return cmp(x, y)
        if isinstance(x, str):
            return text_result
        return bool(cmp(x, y))
    return test


def _pow2floor(x: float) -> float | None:
    if not x >= 1 or x == math.inf:  # NaN, below 1, infinite: no power of two
        return None
    return float(2 ** math.floor(math.log2(x)))


def _call(name: str, fs: list[Compiled]) -> Compiled:
    if name == "knob":
        fname, fold, fnew = fs

        def knob(ctx: Any) -> Any:
            ask = getattr(ctx, "knob", None)
            new = fnew(ctx)
            if ask is None or new is None:
                return None
            return ask(fname(ctx), fold(ctx), new)
        return knob
    if name == "coalesce":
        def coalesce(ctx: Any) -> Any:
            for f in fs:
                v = f(ctx)
                if v is not None:
                    return v
            return None
        return coalesce
    if name == "known":
        f0 = fs[0]
        return lambda ctx: f0(ctx) is not None
    if name == "listing":
        def listing(ctx: Any) -> Any:
            said = [v if isinstance(v, str) else str(v).lower() if isinstance(v, bool)
                    else f"{v:g}" for v in (f(ctx) for f in fs) if v is not None]
            if len(said) < 2:
                return said[0] if said else None
            return f"{', '.join(said[:-1])} and {said[-1]}"
        return listing
    if name == "ifelse":
        fc, fa, fb = fs

        def ifelse(ctx: Any) -> Any:
            c = _truth(fc(ctx))
            if c is None:
                return None
            return fa(ctx) if c else fb(ctx)
        return ifelse
    if name in ("min", "max"):
        pick = min_values if name == "min" else max_values

        def minmax(ctx: Any) -> Any:
            return pick(*(f(ctx) for f in fs))
        return minmax
    if name == "clamp":
        fx, flo, fhi = fs

        def clamp(ctx: Any) -> Any:
            x, lo, hi = _num(fx(ctx)), _num(flo(ctx)), _num(fhi(ctx))
            if x is None or lo is None or hi is None:
                return None
            return min(max(x, lo), hi)
        return clamp
    if name == "divisor":
        fn_, flim = fs

        def divisor(ctx: Any) -> Any:
            n, lim = _num(fn_(ctx)), _num(flim(ctx))
            if n is None or lim is None or math.isnan(lim) or not math.isfinite(n) \
                    or n < 1 or n > 1e12 or lim < 1:
                return None
            n_int = round(n)
            best = 1
            for d in range(1, math.isqrt(n_int) + 1):  # the divisors come in pairs
                if n_int % d == 0:
                    for c in (d, n_int // d):
                        if best < c <= lim:
                            best = c
            return float(best)
        return divisor
    if name == "round":
        fx = fs[0]
        fd = fs[1] if len(fs) > 1 else (lambda ctx: 0)

        def round_(ctx: Any) -> Any:
            x, d = _num(fx(ctx)), _num(fd(ctx))
            if x is None or d is None or not math.isfinite(d):
                return None
            return float(round(x, int(d)))
        return round_
    unary: dict[str, Callable[[float], float | None]] = {
        "abs": abs,
        "sqrt": lambda x: math.sqrt(x) if x >= 0 else None,
        "log2": lambda x: math.log2(x) if x > 0 else None,
        "floor": lambda x: float(math.floor(x)) if math.isfinite(x) else None,
        "ceil": lambda x: float(math.ceil(x)) if math.isfinite(x) else None,
        "pow2floor": _pow2floor,
    }
    fn = unary[name]
    f0 = fs[0]

    def apply(ctx: Any) -> Any:
        x = _num(f0(ctx))
        return None if x is None else fn(x)
    return apply


def evaluate(text: str, ctx: Any, names: Iterable[str] | None = None) -> Any:
    """Parse and evaluate once (tests, tools); rules compile once and evaluate many times."""
    return compile_expr(parse(text, names))(ctx)
