"""Rule files: loading, validation and the Rule records the engine evaluates.

A rule file is YAML, read with PyYAML's safe loader (no tags, no objects: data only), and
checked in full before anything runs: every unknown signal, bad expression, bad value,
missing field and duplicate id of every file is reported in one message, each with its
file and line (docs/rules.md shows the schema and what the errors look like).
"""

from __future__ import annotations

import difflib
import importlib.resources
import math
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuwatch.advisor import expr
from gpuwatch.advisor.facts import cc_number
from gpuwatch.advisor.vocabulary import VOCABULARY
from gpuwatch.errors import FileFormatError, UserError, file_error

SEVERITIES = ("info", "warning", "critical")
SCOPES = ("gpu", "host")
# what the job must be doing for a rule to be judged (docs/rules.md, "Phases"): a rule of
# another phase keeps its state meanwhile, neither starting nor ending
PHASES = ("any", "train", "eval", "inference", "startup")
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
_LOCAL_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

_RULE_KEYS = {
    "id": "unique name, lower-case-with-dashes",
    "title": "one line: what is wrong",
    "severity": "info | warning | critical",
    "scope": "gpu (default: judged per GPU) | host",
    "phase": "what the job must be doing for the rule to be judged: any (default) | train | "
             "eval | inference | startup",
    "train_share": "with phase train: how much of the last 15 s must be training for the rule "
                   "to be judged, 0-1 (default 0.6); 0: at any bucket the job trains (settings)",
    "whole_run": "true: its evidence is the run's so far (seconds and counts since the first "
                 "step), read once more at the job's last step when its steps stop "
                 "(default false)",
    "arch": "compute capabilities it applies to: {min: '8.0', max: '9.0'}",
    "when": "the condition (an expression)",
    "for": "how long the condition must hold before the advice is given (default 0s)",
    "keep": "how long it must be false before the advice ends (default 30s)",
    "unless": "conditions that suppress it (an expression or a list)",
    "suppressed_by": "ids of rules that take precedence on the same GPU",
    "values": "named expressions computed when it holds (usable later and in the text)",
    "evidence": "signal name -> expression, quoted in the report",
    "confidence": "0-1: a number or an expression",
    "gain": "expected speed-up (throughput multiple): a number or an expression",
    "gain_text": "what the gain means, in words (template)",
    "message": "what is wrong, quoting the evidence (template)",
    "action": "the change to make (template, or a list of {text, arch, when})",
    "without_hook": "what the torch hook would add, shown when it is absent (template)",
    "references": "where the reasoning comes from (list of strings)",
    "description": "free text for the docs",
}
_REQUIRED = ("id", "title", "severity", "when", "message", "action")
_ACTION_KEYS = {"text", "arch", "when"}
_PERCENT_RE = re.compile(r"(\d)%")
_TEMPLATE_RE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_SPEC_RE = re.compile(r"^(?:[<>=^]?[+\- ]?\d*,?(?:\.\d+)?[eEfFgGd%]?|bytes|int|duration)$")
_TEMPLATE_BUILTINS = {"gpu", "compute_capability", "gpu_name", "held_seconds", "held_minutes",
                      "expected_gain"}


class RuleFileError(FileFormatError):
    """Problems in one or more rule files, all in one message (``files`` has every file's)."""

    def __init__(self, files: list[tuple[str, list[tuple[int | None, str]]]]) -> None:
        path, problems = files[0]
        super().__init__(path, problems)
        self.files = files
        parts = [str(FileFormatError(p, probs)) for p, probs in files]
        self.args = ("\n".join(parts),)

    def __str__(self) -> str:
        return self.args[0]


# -- templates -------------------------------------------------------------------------
@dataclass(frozen=True)
class Template:
    """Text with ``{name}`` / ``{name:.0%}`` placeholders: no attribute access, no calls.

    Text between ``[[`` and ``]]`` is said only where every value in it is known, so a
    message never prints a number it does not have ("the GPU is busy ? of the time" on a
    job with no GPU)."""

    parts: tuple[tuple[str, str | None, str], ...]  # (literal, name, spec)
    source: str
    groups: tuple[int, ...] = ()  # per part: 0, or the optional fragment it belongs to

    def names(self) -> set[str]:
        return {n for _, n, _ in self.parts if n}

    def render(self, values: dict[str, Any]) -> str:
        groups = self.groups or (0,) * len(self.parts)
        unknown = {g for (_, name, _), g in zip(self.parts, groups, strict=True)
                   if g and name and values.get(name) is None}
        out: list[str] = []
        for (lit, name, spec), g in zip(self.parts, groups, strict=True):
            if g in unknown:
                continue
            out.append(lit)
            if name:
                out.append(format_value(values.get(name), spec, name))
        return "".join(out)


def format_value(v: Any, spec: str = "", name: str = "") -> str:
    """One placeholder's value as text. A percent (``{util:.0%}``, any ``%`` spec) is
    written as the report writes evidence, :func:`human_percent` (``20 %``, ``7.9 %``):
    the spec's digits are not used, so every message and the evidence beside it agree."""
    if v is None:
        return "?"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, str):
        return v
    if spec.endswith("%"):
        try:
            return human_percent(float(v), fine_top="mem" in name)
        except (TypeError, ValueError):
            return str(v)
    if spec == "bytes":
        return human_bytes(v)
    if spec == "duration":
        return human_duration(v)
    if spec == "int" or (spec.endswith("d") and spec):
        try:
            return format(round(v), "d" if spec == "int" else spec)
        except (ValueError, OverflowError):
            return str(v)
    if not spec:
        if float(v).is_integer() and abs(v) < 1e15:
            return str(int(v))
        return f"{v:.3g}"
    try:
        out = format(v, spec)
    except (ValueError, TypeError):
        return str(v)
    if "e+" in out and abs(v) < 1e15:
        return f"{v:.0f}"  # a person reads 16384, not 1.64e+04
    return out


def human_percent(v: float, fine_top: bool = False) -> str:
    """A ratio as a person reads it: whole percent with a space (``20 %``), but a tenth
    below 10 % (``7.9 %``, ``0.4 %``: not ``0 %``) and, with ``fine_top`` (how full memory
    is), from 90 % up (``97.5 %`` vs ``99.9 %`` full is the point). docs/report.md."""
    if not math.isfinite(v):
        return f"{v} %"
    p = v * 100.0
    top = 90 if fine_top else math.inf
    # judged as written to a tenth: 9.996 % is "10 %", never "10.0 %"
    tenth = round(abs(p), 1)
    if abs(p - round(p)) < 1e-9 or tenth >= 100 or 10 <= tenth < top:
        return f"{p:.0f} %"
    return f"{p:.1f} %"


def human_duration(v: float) -> str:
    """Seconds as a person reads them: 8.3 ms, 97.5 ms, 1.5 s, 12 s, 2.5 min, 1.2 h."""
    a = abs(v)
    if a == 0:
        return "0 s"
    if a < 1e-3:
        return f"{v * 1e6:.0f} µs"
    if a < 1:
        ms = v * 1e3
        return f"{ms:.1f} ms" if abs(ms) < 100 else f"{ms:.0f} ms"
    if a < 60:
        return f"{v:.1f} s" if a < 10 else f"{v:.0f} s"
    if a < 3600:
        return f"{v / 60:.1f} min"
    return f"{v / 3600:.1f} h"


def human_bytes(v: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= size:
            return f"{v / size:.1f} {unit}"
    return f"{v:.0f} B"


def spaced_percents(text: str) -> str:
    """A number written with its percent sign ("80%") takes the space the report puts
    before every unit ("80 %"): rule text written either way reads one way."""
    return _PERCENT_RE.sub(r"\1 %", text)


def parse_template(text: str) -> Template:
    if not isinstance(text, str):
        raise TypeError(f"expected text, got {type(text).__name__}")
    parts: list[tuple[str, str | None, str]] = []
    groups: list[int] = []
    pieces = re.split(r"(\[\[|\]\])", text)
    group, n_groups = 0, 0
    for piece in pieces:
        if piece == "[[":
            if group:
                raise ValueError("an optional fragment [[...]] cannot hold another")
            n_groups += 1
            group = n_groups
            continue
        if piece == "]]":
            if not group:
                raise ValueError("']]' closes no optional fragment")
            group = 0
            continue
        got = _parse_segment(piece)
        parts += got
        groups += [group] * len(got)
    if group:
        raise ValueError("an optional fragment '[[' is never closed with ']]'")
    return Template(tuple(parts), text, tuple(groups))


def _parse_segment(text: str) -> list[tuple[str, str | None, str]]:
    parts: list[tuple[str, str | None, str]] = []
    lit: list[str] = []
    pos = 0
    for m in _TEMPLATE_RE.finditer(text):
        lit.append(text[pos:m.start()])
        pos = m.end()
        tok = m.group(0)
        if tok == "{{":
            lit.append("{")
        elif tok == "}}":
            lit.append("}")
        elif m.group(1) is None:
            raise ValueError(f"unmatched {tok!r} in text (write {tok}{tok} for a literal brace)")
        else:
            inner = m.group(1)
            name, _, spec = inner.partition(":")
            name = name.strip()
            if not _LOCAL_RE.match(name):
                raise ValueError(f"{{{inner}}}: a placeholder is a plain name like {{util}} "
                                 "or {util:.0%} (no attribute access, indexing or calls)")
            if spec and not _SPEC_RE.match(spec):
                raise ValueError(f"{{{inner}}}: bad format {spec!r} (e.g. .2f, .0%, d, bytes)")
            parts.append(("".join(lit), name, spec))
            lit = []
    lit.append(text[pos:])
    parts.append(("".join(lit), None, ""))
    # a number written with its percent sign in the text itself ("80%") takes the space
    # the rendered ones have ("80 %"); so does a sign right after a placeholder
    spaced = []
    for i, (literal, name, spec) in enumerate(parts):
        literal = spaced_percents(literal)
        if i and literal.startswith("%") and parts[i - 1][1]:
            literal = " " + literal
        spaced.append((literal, name, spec))
    return spaced


# -- rules -------------------------------------------------------------------------------
Compiled = Callable[[Any], Any]


@dataclass
class Action:
    text: Template
    arch_min: float | None = None
    arch_max: float | None = None
    when: Compiled | None = None


@dataclass
class Rule:
    id: str
    title: str
    severity: str
    when: Compiled
    when_text: str
    message: Template
    actions: list[Action]
    file: str = ""
    line: int = 0
    scope: str = "gpu"
    phase: str = "any"
    # with phase train: the share of the window that must be training (None: the default)
    train_share: float | None = None
    # its evidence is the run's so far: read once more at the job's last step (engine)
    whole_run: bool = False
    arch_min: float | None = None
    arch_max: float | None = None
    for_s: float = 0.0
    keep_s: float = 30.0
    unless: list[tuple[str, Compiled]] = field(default_factory=list)
    suppressed_by: tuple[str, ...] = ()
    values: list[tuple[str, Compiled]] = field(default_factory=list)
    evidence: list[tuple[str, Compiled]] = field(default_factory=list)
    confidence: Compiled | None = None
    gain: Compiled | None = None
    gain_text: Template | None = None
    without_hook: Template | None = None
    references: tuple[str, ...] = ()
    description: str = ""
    signals: set[str] = field(default_factory=set)
    max_window: float = 0.0
    # the longest look back at each signal the rule reads (seconds; 0.0: its newest value),
    # its templates' names included; None (a Rule built by hand): not known
    reads: dict[str, float] | None = None
    template_names: set[str] = field(default_factory=set)
    # ``when(ctx) is True`` and each ``unless(ctx) is True`` as predicates that stop early
    # (expr.compile_condition): what the engine asks at every bucket
    holds: Callable[[Any], bool] | None = None
    unless_holds: tuple[Callable[[Any], bool], ...] = ()
    # the parsed ``when`` and ``unless``: an engine compiles them again with its own way
    # of reading values (expr.LeafFactory)
    when_node: expr.Node | None = None
    unless_nodes: tuple[expr.Node, ...] = ()

    def applies_to(self, cc: float | None) -> bool:
        """Architecture gate; an unknown compute capability passes (the text says so)."""
        if cc is None:
            return True
        if self.arch_min is not None and cc < self.arch_min - 1e-9:
            return False
        return not (self.arch_max is not None and cc > self.arch_max + 1e-09)


@dataclass
class RuleSet:
    rules: list[Rule]  # suppressors before the rules they suppress
    sources: list[str]

    def by_id(self) -> dict[str, Rule]:
        return {r.id: r for r in self.rules}

    def signals(self) -> set[str]:
        out: set[str] = set()
        for r in self.rules:
            out |= r.signals
        return out

    def max_window(self) -> float:
        return max((r.max_window + r.for_s for r in self.rules), default=60.0)


# -- YAML with line numbers ----------------------------------------------------------------
class _Map(dict):
    line: int = 0
    key_lines: dict[Any, int]
    value_lines: dict[Any, int]


class _List(list):
    line: int = 0
    item_lines: list[int]


def _value_line(node: yaml.Node) -> int:
    line = node.start_mark.line + 1
    # a block scalar's text starts on the line after its '|' or '>'
    if isinstance(node, yaml.ScalarNode) and node.style in ("|", ">"):
        line += 1
    return line


_PLAIN_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map",
                                                   "seq", "timestamp")}


def _construct(loader: yaml.SafeLoader, node: yaml.Node,
               problems: list[tuple[int | None, str]], seen: set[int] | None = None) -> Any:
    seen = set() if seen is None else seen
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        # an alias is the same node met again: nine aliases of nine aliases of ... make a
        # few lines of YAML into billions of items ("billion laughs"); rules need none
        if id(node) in seen:
            problems.append((node.start_mark.line + 1, "YAML aliases (*name) of lists or "
                             "mappings are not allowed in a rule file"))
            return None
        seen.add(id(node))
    if node.tag not in _PLAIN_TAGS:
        # data only: a tag asking for an object is refused, never constructed
        problems.append((node.start_mark.line + 1, (f"YAML tag {node.tag!r} is not allowed "
                         "in a rule file")))
        return None
    if isinstance(node, yaml.MappingNode):
        d = _Map()
        d.line = node.start_mark.line + 1
        d.key_lines, d.value_lines = {}, {}
        for k, v in node.value:
            key = loader.construct_object(k, deep=True) if isinstance(k, yaml.ScalarNode) \
                else None
            kline = k.start_mark.line + 1
            if not isinstance(key, str):
                problems.append((kline, f"keys must be text, got {key!r}"))
                continue
            if key in d:
                problems.append((kline, f"{key}: given twice (first on line {d.key_lines[key]})"))
                continue
            d[key] = _construct(loader, v, problems, seen)
            d.key_lines[key] = kline
            d.value_lines[key] = _value_line(v)
        return d
    if isinstance(node, yaml.SequenceNode):
        lst = _List()
        lst.line = node.start_mark.line + 1
        lst.item_lines = []
        for item in node.value:
            lst.append(_construct(loader, item, problems, seen))
            lst.item_lines.append(_value_line(item))
        return lst
    return loader.construct_object(node, deep=True)


# libyaml's parser, where PyYAML was built with it: reading the built-in rules with the
# pure-Python one takes a fifth of a second, as long as judging an hour of 8 GPUs
_FAST_LOADER = getattr(yaml, "CSafeLoader", None)


def _read_yaml(path: str, text: str) -> tuple[Any, list[tuple[int | None, str]]]:
    if _FAST_LOADER is not None and not yaml.reader.Reader.NON_PRINTABLE.search(text):
        # the same nodes (values, styles, lines); a file either parser refuses is read
        # again by the pure-Python one, so every problem is told in its words
        problems: list[tuple[int | None, str]] = []
        loader = _FAST_LOADER(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None, problems
            return _construct(loader, node, problems), problems
        except (yaml.YAMLError, RecursionError):
            pass
        finally:
            loader.dispose()
    return _read_yaml_slowly(text)


def _read_yaml_slowly(text: str) -> tuple[Any, list[tuple[int | None, str]]]:
    problems: list[tuple[int | None, str]] = []
    try:
        # the reader refuses control characters at once, so this too is inside the try
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as err:
        return None, [(None, f"not valid YAML: {err}")]
    try:
        node = loader.get_single_node()
        if node is None:
            return None, problems
        return _construct(loader, node, problems), problems
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(err, "problem", None) or str(err)
        return None, [(line, f"not valid YAML: {problem}")]
    except RecursionError:
        return None, [(None, "nested too deeply to read")]
    finally:
        loader.dispose()


# -- validation ----------------------------------------------------------------------------
class _FileChecker:
    def __init__(self, path: str) -> None:
        self.path = path
        self.problems: list[tuple[int | None, str]] = []

    def bad(self, line: int | None, msg: str) -> None:
        self.problems.append((line, msg))

    def expression(self, text: Any, line: int, where: str, names: Iterable[str],
                   scope: str) -> tuple[expr.Node, Compiled] | None:
        if isinstance(text, bool) or not isinstance(text, (str, int, float)):
            self.bad(line, f"{where}: expected an expression, got {_show(text)}")
            return None
        src = str(text)
        try:
            node = expr.parse(src, names)
        except expr.ExprError as err:
            self.bad(line + src.count("\n", 0, err.column), f"{where}: {err.message} "
                     f"(column {err.column + 1} of {src.strip()!r})")
            return None
        if scope == "host":
            gpu_only = sorted(n for n in expr.signals_of(node)
                              if n in VOCABULARY and VOCABULARY[n].table == "gpu")
            if gpu_only:
                self.bad(line, f"{where}: a host rule cannot read per-GPU signals "
                         f"({', '.join(gpu_only)}); use scope: gpu")
                return None
        return node, expr.compile_expr(node)

    def template(self, text: Any, line: int, where: str, names: set[str]) -> Template | None:
        try:
            tpl = parse_template(text)
        except (ValueError, TypeError) as err:
            self.bad(line, f"{where}: {err}")
            return None
        unknown = sorted(tpl.names() - names - _TEMPLATE_BUILTINS)
        if unknown:
            near = difflib.get_close_matches(unknown[0], sorted(names), n=1)
            hint = f" (did you mean {near[0]}?)" if near else \
                " (a placeholder names an entry of values: or evidence:)"
            self.bad(line, f"{where}: unknown placeholder {{{unknown[0]}}}{hint}")
            return None
        return tpl

    def arch(self, value: Any, line: int, where: str) -> tuple[float | None, float | None]:
        if not isinstance(value, dict):
            self.bad(line, f"{where}: expected a mapping like {{min: '8.0'}}, got {_show(value)}")
            return None, None
        out: list[float | None] = []
        for key in ("min", "max"):
            v = value.get(key)
            if v is None:
                out.append(None)
                continue
            try:
                num = cc_number(v) if isinstance(v, (str, int, float)) and \
                    not isinstance(v, bool) else None
            except ValueError:
                num = None
            if num is None or not 1.0 <= num <= 20.0:
                self.bad(line, f"{where}: {key}: expected a compute capability like '8.0', "
                         f"got {_show(v)}")
                num = None
            out.append(num)
        extra = sorted(set(value) - {"min", "max"})
        if extra:
            self.bad(line, f"{where}: unknown key {extra[0]!r} (expected min and/or max)")
        if out[0] is not None and out[1] is not None and out[0] > out[1]:
            self.bad(line, f"{where}: min {out[0]} is above max {out[1]}")
        return out[0], out[1]

    def duration(self, value: Any, line: int, where: str, default: float) -> float:
        try:
            return expr.parse_duration(value)
        except ValueError as err:
            self.bad(line, f"{where}: {err}")
            return default

    def rule(self, raw: Any, line: int, index: int) -> Rule | None:
        if not isinstance(raw, _Map):
            self.bad(line, f"rule {index + 1}: expected a mapping with id, title, severity, "
                     f"when, message and action, got {_show(raw)}")
            return None
        ok_before = len(self.problems)
        kl, vl = raw.key_lines, raw.value_lines
        rid = raw.get("id")
        label = f"rule {rid!r}" if isinstance(rid, str) else f"rule {index + 1}"
        for key in raw:
            if key not in _RULE_KEYS:
                near = difflib.get_close_matches(key, list(_RULE_KEYS), n=1)
                hint = f" (did you mean {near[0]}?)" if near else \
                    f" (known keys: {', '.join(_RULE_KEYS)})"
                self.bad(kl[key], f"{label}: unknown key {key!r}{hint}")
        for key in _REQUIRED:
            if key not in raw or raw[key] in (None, ""):
                self.bad(raw.line, f"{label}: missing {key} ({_RULE_KEYS[key]})")
        if isinstance(rid, str) or rid is None:
            if rid is not None and not _ID_RE.match(rid):
                self.bad(vl["id"], f"{label}: id must be lower-case letters, digits and dashes")
        else:
            self.bad(vl["id"], f"rule {index + 1}: id must be text, got {_show(rid)}")
        title = raw.get("title")
        if title is not None and not isinstance(title, str):
            self.bad(vl["title"], f"{label}: title must be text, got {_show(title)}")
        sev = raw.get("severity")
        if sev is not None and sev not in SEVERITIES:
            self.bad(vl["severity"], f"{label}: severity must be one of "
                     f"{', '.join(SEVERITIES)}, got {_show(sev)}")
        scope = raw.get("scope", "gpu")
        if scope not in SCOPES:
            self.bad(vl.get("scope", raw.line), f"{label}: scope must be gpu or host, "
                     f"got {_show(scope)}")
            scope = "gpu"
        phase = raw.get("phase", "any")
        if phase not in PHASES:
            self.bad(vl.get("phase", raw.line), f"{label}: phase must be one of "
                     f"{', '.join(PHASES)}, got {_show(phase)}")
            phase = "any"
        train_share = None
        if "train_share" in raw:
            got = raw["train_share"]
            where = vl.get("train_share", raw.line)
            if phase != "train":
                self.bad(where, f"{label}: train_share is read with phase: train only, "
                         f"the rule's phase is {phase}")
            elif isinstance(got, bool) or not isinstance(got, (int, float)) \
                    or not 0 <= got <= 1:
                self.bad(where, f"{label}: train_share must be a number from 0 to 1, "
                         f"got {_show(got)}")
            else:
                train_share = float(got)
        whole_run = raw.get("whole_run", False)
        if not isinstance(whole_run, bool):
            self.bad(vl.get("whole_run", raw.line), f"{label}: whole_run must be true or "
                     f"false, got {_show(whole_run)}")
            whole_run = False
        arch_min = arch_max = None
        if "arch" in raw:
            arch_min, arch_max = self.arch(raw["arch"], vl["arch"], f"{label}: arch")
        for_s = self.duration(raw.get("for", 0), vl.get("for", raw.line), f"{label}: for", 0.0)
        keep_s = self.duration(raw.get("keep", "30s"), vl.get("keep", raw.line),
                               f"{label}: keep", 30.0)
        vocab = set(VOCABULARY)
        nodes: list[expr.Node] = []
        when = None
        if raw.get("when") not in (None, ""):
            when = self.expression(raw["when"], vl["when"], f"{label}: when", vocab, scope)
            if when:
                nodes.append(when[0])
        unless: list[tuple[str, Compiled]] = []
        unless_holds: list[Callable[[Any], bool]] = []
        unless_nodes: list[expr.Node] = []
        if "unless" in raw:
            items = raw["unless"]
            lines = items.item_lines if isinstance(items, _List) else [vl["unless"]]
            if not isinstance(items, list):
                items = [items]
            for i, item in enumerate(items):
                got = self.expression(item, lines[i], f"{label}: unless", vocab, scope)
                if got:
                    nodes.append(got[0])
                    unless.append((str(item), got[1]))
                    unless_holds.append(expr.compile_condition(got[0]))
                    unless_nodes.append(got[0])
        sup = raw.get("suppressed_by", [])
        if isinstance(sup, str):
            sup = [sup]
        if not isinstance(sup, list) or not all(isinstance(s, str) for s in sup):
            self.bad(vl.get("suppressed_by"), f"{label}: suppressed_by must be a list of rule "
                     "ids")
            sup = []
        local: set[str] = set()
        values: list[tuple[str, Compiled]] = []
        evidence: list[tuple[str, Compiled]] = []
        for section, out in (("values", values), ("evidence", evidence)):
            if section not in raw:
                continue
            block = raw[section]
            if not isinstance(block, _Map):
                self.bad(vl[section], f"{label}: {section} must be a mapping of name: "
                         f"expression, got {_show(block)}")
                continue
            for name, text in block.items():
                where = f"{label}: {section}: {name}"
                if not _LOCAL_RE.match(name):
                    self.bad(block.key_lines[name], f"{where}: a name is lower-case letters, "
                             "digits and '_', starting with a letter")
                    continue
                if section == "values" and name in VOCABULARY:
                    self.bad(block.key_lines[name], f"{where}: {name!r} is a signal; "
                             "pick another name")
                    continue
                got = self.expression(text, block.value_lines[name], where, vocab | local, scope)
                if got:
                    nodes.append(got[0])
                    out.append((name, got[1]))
                if section == "values":
                    local.add(name)
            if section == "evidence":
                local |= set(block)
        names_all = vocab | local

        def number_or_expr(key: str, lo: float, hi: float) -> Compiled | None:
            if key not in raw:
                return None
            v = raw[key]
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                if math.isnan(v) or not lo <= v <= hi:
                    self.bad(vl[key], f"{label}: {key} must be between {lo:g} and {hi:g}, "
                             f"got {v}")
                    return None
                return lambda ctx, v=float(v): v
            got = self.expression(v, vl[key], f"{label}: {key}", names_all, scope)
            if got:
                nodes.append(got[0])
                return got[1]
            return None

        confidence = number_or_expr("confidence", 0.0, 1.0)
        gain = number_or_expr("gain", 1.0, 1000.0)
        tnames = local | set(VOCABULARY)
        message = None
        if isinstance(raw.get("message"), str) and raw["message"]:
            message = self.template(raw["message"], vl["message"], f"{label}: message", tnames)
        elif raw.get("message") not in (None, ""):
            self.bad(vl["message"], f"{label}: message must be text")
        gain_text = None
        if "gain_text" in raw:
            gain_text = self.template(raw["gain_text"], vl["gain_text"], f"{label}: gain_text",
                                      tnames)
        actions: list[Action] = []
        act = raw.get("action")
        if isinstance(act, str) and act:
            tpl = self.template(act, vl["action"], f"{label}: action", tnames)
            if tpl:
                actions.append(Action(tpl))
        elif isinstance(act, _List):
            for i, item in enumerate(act):
                where = f"{label}: action {i + 1}"
                iline = act.item_lines[i]
                if not isinstance(item, _Map) or "text" not in item:
                    self.bad(iline, f"{where}: expected {{text: ..., arch: ..., when: ...}}")
                    continue
                for key in item:
                    if key not in _ACTION_KEYS:
                        self.bad(item.key_lines[key], f"{where}: unknown key {key!r} "
                                 "(expected text, arch, when)")
                tpl = self.template(item["text"], item.value_lines["text"], f"{where}: text",
                                    tnames)
                amin = amax = None
                if "arch" in item:
                    amin, amax = self.arch(item["arch"], item.value_lines["arch"],
                                           f"{where}: arch")
                cond = None
                if "when" in item:
                    got = self.expression(item["when"], item.value_lines["when"],
                                          f"{where}: when", names_all, scope)
                    if got:
                        nodes.append(got[0])
                        cond = got[1]
                if tpl:
                    actions.append(Action(tpl, amin, amax, cond))
        elif act not in (None, ""):
            self.bad(vl["action"], f"{label}: action must be text or a list of "
                     f"{{text, arch, when}}, got {_show(act)}")
        without_hook = None
        if isinstance(raw.get("without_hook"), str) and raw["without_hook"]:
            without_hook = self.template(raw["without_hook"],
                                         vl["without_hook"], f"{label}: without_hook", tnames)
        elif raw.get("without_hook") not in (None, ""):
            self.bad(vl["without_hook"], f"{label}: without_hook must be text")
        refs = raw.get("references", [])
        if isinstance(refs, str):
            refs = [refs]
        if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
            self.bad(vl.get("references"), f"{label}: references must be a list of text")
            refs = []
        if len(self.problems) > ok_before or when is None or message is None or not actions:
            return None
        signals: set[str] = set()
        window = 0.0
        reads: dict[str, float] = {}
        for n in nodes:
            signals |= {s for s in expr.signals_of(n) if s in VOCABULARY}
            window = max(window, expr.max_window(n))
            for name, seconds in expr.reads_of(n):
                if name in VOCABULARY:
                    reads[name] = max(reads.get(name, 0.0), seconds)
        tpl_names = message.names() | (gain_text.names() if gain_text else set()) \
            | (without_hook.names() if without_hook else set())
        for a in actions:
            tpl_names |= a.text.names()
        signals |= {n for n in tpl_names if n in VOCABULARY}
        for name in tpl_names:
            if name in VOCABULARY:
                reads.setdefault(name, 0.0)
        return Rule(
            template_names=tpl_names, id=rid, title=spaced_percents(title), severity=sev,
            when=when[1],
            when_text=str(raw["when"]),
            message=message, actions=actions, file=self.path, line=raw.line, scope=scope,
            phase=phase, train_share=train_share, whole_run=whole_run,
            arch_min=arch_min, arch_max=arch_max, for_s=for_s, keep_s=keep_s, unless=unless,
            suppressed_by=tuple(sup), values=values, evidence=evidence, confidence=confidence,
            gain=gain, gain_text=gain_text,
            without_hook=without_hook,
            references=tuple(refs),
            description=str(raw.get("description", "")), signals=signals, max_window=window,
            reads=reads,
            holds=expr.compile_condition(when[0]), unless_holds=tuple(unless_holds),
            when_node=when[0], unless_nodes=tuple(unless_nodes))


def _show(value: Any) -> str:
    kind = {bool: "a boolean", list: "a list", _List: "a list", dict: "a mapping",
            _Map: "a mapping", str: "text", type(None): "nothing (null)", int: "a number",
            float: "a number"}.get(type(value))
    if kind in ("a list", "a mapping"):
        return kind
    return f"{kind} {value!r}" if kind and value is not None else (kind or repr(value))


def parse_rule_file(path: str, text: str) -> tuple[list[Rule], list[tuple[int | None, str]],
                                                    list[tuple[Rule, int]]]:
    """One file's rules and problems (``id_lines``: each rule with its id's line)."""
    checker = _FileChecker(path)
    data, yaml_problems = _read_yaml(path, text)
    checker.problems.extend(yaml_problems)
    if data is None:
        if not yaml_problems:
            checker.bad(None, "empty rule file (expected a list of rules, or rules: [...])")
        return [], checker.problems, []
    items = data
    if isinstance(data, _Map):
        extra = sorted(set(data) - {"rules", "version"})
        for key in extra:
            checker.bad(data.key_lines[key], f"unknown top-level key {key!r} (expected rules)")
        items = data.get("rules")
    if not isinstance(items, _List):
        checker.bad(getattr(data, "line", 1), "expected a list of rules (or a mapping with "
                    "rules: [...])")
        return [], checker.problems, []
    rules: list[Rule] = []
    id_lines: list[tuple[Rule, int]] = []
    for i, raw in enumerate(items):
        rule = checker.rule(raw, items.item_lines[i], i)
        if rule is not None:
            rules.append(rule)
            id_lines.append((rule, raw.value_lines.get("id", raw.line)))
    return rules, checker.problems, id_lines


def builtin_rule_files() -> list[tuple[str, str]]:
    """(name, text) of the built-in rule files, from the source tree or the installed package."""
    out: list[tuple[str, str]] = []
    # a checkout's own rules/ first: the package was imported from it, and an editable install
    # of another checkout would otherwise lend this code that checkout's rules
    src = Path(__file__).resolve().parent.parent.parent
    if (src / "pyproject.toml").is_file() and (src / "rules").is_dir():
        for p in sorted((src / "rules").glob("*.y*ml")):
            out.append((f"rules/{p.name}", p.read_text(encoding="utf-8")))
        if out:
            return out
    try:
        root = importlib.resources.files("gpuwatch.rules")
        entries = [(e.name, e) for e in root.iterdir() if e.name.endswith((".yaml", ".yml"))]
        for name, entry in sorted(entries):
            out.append((f"rules/{name}", entry.read_text(encoding="utf-8")))
    except ModuleNotFoundError:
        pass
    return out


def _dir_files(directory: str) -> list[tuple[str, str]]:
    if not os.path.isdir(directory):
        raise UserError(f"rule directory {directory} does not exist or is not a directory")
    out = []
    for name in sorted(os.listdir(directory)):
        if name.endswith((".yaml", ".yml")):
            path = os.path.join(directory, name)
            try:
                with open(path, encoding="utf-8") as f:
                    out.append((path, f.read()))
            except OSError as err:
                raise file_error("read", "rule file", path, err) from err
            except UnicodeDecodeError as err:
                raise FileFormatError(path, [(None, f"not UTF-8 text ({err.reason})")]) from err
    return out


def load_rules(dirs: Sequence[str] = (), *, builtin: bool = True,
               files: Sequence[tuple[str, str]] = ()) -> RuleSet:
    """The built-in rules, then every *.yaml in ``dirs`` (in order), then ``files``.

    Raises :class:`RuleFileError` naming every problem of every file.
    """
    sources: list[tuple[str, str]] = []
    failures: dict[str, list[tuple[int | None, str]]] = {}
    builtin_paths: set[str] = set()
    if builtin:
        sources += builtin_rule_files()
        builtin_paths = {p for p, _ in sources}
    for d in dirs:
        if not os.path.isdir(d):  # said with every other problem, not alone
            failures[d] = [(None, "rule directory does not exist or is not a directory")]
            continue
        sources += _dir_files(d)
    sources += list(files)
    all_rules: list[Rule] = []
    first_seen: dict[str, tuple[str, int]] = {}
    declared: set[str] = set()  # ids of rules with problems too: no second complaint
    for path, text in sources:
        _, problems, id_lines = parse_rule_file(path, text)
        declared |= _declared_ids(text)
        for rule, line in id_lines:
            if rule.id in first_seen:
                fpath, fline = first_seen[rule.id]
                if fpath in builtin_paths and path not in builtin_paths:
                    problems.append((line, (f"rule id {rule.id!r} is taken by a built-in rule "
                                     f"({fpath}:{fline}); give yours another id")))
                else:
                    problems.append((line, (f"duplicate rule id {rule.id!r} (first in "
                                     f"{fpath}:{fline})")))
                continue
            first_seen[rule.id] = (path, line)
            all_rules.append(rule)
        if problems:
            failures.setdefault(path, []).extend(problems)
    known = {r.id for r in all_rules}
    for rule in all_rules:
        for sid in rule.suppressed_by:
            if sid not in known and sid not in declared:
                near = difflib.get_close_matches(sid, sorted(known), n=1)
                hint = f" (did you mean {near[0]}?)" if near else ""
                failures.setdefault(rule.file, []).append(
                    (rule.line, (f"rule {rule.id!r}: suppressed_by names unknown rule {sid!r}"
                     f"{hint}")))
    ordered, cycle = _order(all_rules)
    if cycle:
        failures.setdefault(cycle[0].file, []).append(
            (cycle[0].line, "suppressed_by goes round in a circle: "
             + " -> ".join(r.id for r in cycle)))
    if failures:
        raise RuleFileError([(p, sorted(probs, key=lambda x: (x[0] is None, x[0] or 0)))
                             for p, probs in failures.items()])
    return RuleSet(ordered, [p for p, _ in sources])


def _declared_ids(text: str) -> set[str]:
    return set(re.findall(r"^\s*-?\s*id:\s*['\"]?([a-z0-9-]+)", text, re.MULTILINE))


def _order(rules: list[Rule]) -> tuple[list[Rule], list[Rule] | None]:
    """Suppressors before the rules they suppress (a rule reads their state this tick)."""
    by_id = {r.id: r for r in rules}
    state: dict[str, int] = {}
    out: list[Rule] = []
    stack: list[Rule] = []

    def visit(r: Rule) -> list[Rule] | None:
        st = state.get(r.id, 0)
        if st == 2:
            return None
        if st == 1:
            i = next(i for i, x in enumerate(stack) if x.id == r.id)
            return stack[i:] + [r]
        state[r.id] = 1
        stack.append(r)
        for sid in r.suppressed_by:
            dep = by_id.get(sid)
            if dep is not None:
                cyc = visit(dep)
                if cyc:
                    return cyc
        stack.pop()
        state[r.id] = 2
        out.append(r)
        return None

    for r in rules:
        cyc = visit(r)
        if cyc:
            return rules, cyc
    return out, None
