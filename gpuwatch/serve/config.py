"""The daemon's configuration: a YAML file, then command-line flags over it.

Every problem in a file is reported at once, each with its line number, so a user fixes
the whole file in one go (docs/configuration.md describes the keys).
"""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import yaml

from gpuwatch.errors import FileFormatError, UserError, file_error
from gpuwatch.serve.privacy import Privacy

DEFAULT_LISTEN = "127.0.0.1:9442"
# AF_UNIX paths are limited to 108 bytes including the terminating NUL on Linux
_MAX_SOCKET_PATH = 107

# the command-line flag that sets each key, for messages about a bad value
FLAGS = {"listen_address": "--web.listen-address", "rules_dirs": "--rules-dir",
         "record": "--record", "interval": "--interval"}

MIN_INTERVAL, MAX_INTERVAL = 0.1, 60.0
MAX_SLOW_INTERVAL = 3600.0
MIN_HISTORY, MAX_HISTORY = 10.0, 7 * 86400.0


@dataclass(frozen=True)
class Config:
    listen_address: str = DEFAULT_LISTEN  # HOST:PORT, ':PORT' for all interfaces
    interval: float = 1.0  # seconds between cheap NVML/host reads
    slow_interval: float = 30.0  # seconds between slow NVML reads (PCIe, ECC, energy)
    # seconds between reads of the energy counter (~4 ms of CPU a GPU), on the slow rounds
    energy_interval: float = 60.0
    # how much history the store keeps for the advisor, which takes each sample within
    # seconds (it judges every 5 s, 2 s behind) into windows of its own: more costs memory
    history_seconds: float = 120.0
    rules_dirs: tuple[str, ...] = ()  # extra rule directories, after the built-in rules
    hook_socket: str | None = None  # the torch hook's datagram socket; None: chosen at start
    record: str | None = None  # also record what is sampled to this trace file
    # TLS and basic auth for the HTTP server, exporter-toolkit format (docs/security.md)
    web_config_file: str | None = None
    # what /metrics and /api/snapshot may say about processes (names, users)
    privacy: Privacy = Privacy()


def parse_listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` → (host, port). ``:PORT`` gives host ``""`` (all interfaces),
    ``[::1]:PORT`` an IPv6 address; port 0 asks the kernel for a free port."""
    expected = "expected HOST:PORT, e.g. 127.0.0.1:9442, :9442 (all interfaces) or [::1]:9442"
    if not isinstance(text, str) or ":" not in text:
        raise UserError(f"bad listen address {text!r}: {expected}")
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1:end + 2] != ":":
            raise UserError(f"bad listen address {text!r}: {expected}")
        host, port_text = text[1:end], text[end + 2:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise UserError(f"bad listen address {text!r}: {host!r} inside [] is not an "
                            "IPv6 address") from None
    else:
        host, _, port_text = text.rpartition(":")
        if ":" in host:
            raise UserError(f"bad listen address {text!r}: write an IPv6 address in brackets, "
                            "e.g. [::1]:9442")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise UserError(f"bad listen address {text!r}: port {port_text!r} is not a number "
                        "from 0 to 65535")
    if any(c.isspace() for c in host):
        raise UserError(f"bad listen address {text!r}: {expected}")
    return host, int(port_text)


# -- validation: one checker per key, each returning an error message or None ----------

def _number(lo: float, hi: float, what: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        # bool is an int in Python, but `interval: yes` is surely a mistake
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"expected {what} as a number, got {_show(value)}"
        # a huge YAML integer is no float: compare it as it is (isnan would overflow)
        if (isinstance(value, float) and math.isnan(value)) or not lo <= value <= hi:
            shown = f"{value:g}" if isinstance(value, float) or abs(value) < 10**15 else "a huge number"
            return f"must be between {lo:g} and {hi:g} {what}, got {shown}"
        return None
    return check


def _listen(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"expected HOST:PORT as a string, got {_show(value)}"
    try:
        parse_listen_address(value)
    except UserError as err:
        return str(err)
    return None


def _optional_path(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        return f"expected a path, got {_show(value)}"
    return None


def _socket_path(value: Any) -> str | None:
    problem = _optional_path(value)
    if problem is None and value is not None and len(value.encode()) > _MAX_SOCKET_PATH:
        return f"socket path is {len(value.encode())} bytes long; Unix sockets allow " \
               f"at most {_MAX_SOCKET_PATH}"
    return problem


def _path_list(value: Any) -> str | None:
    if not isinstance(value, list):
        return f"expected a list of directories, got {_show(value)}"
    bad = [v for v in value if not isinstance(v, str) or not v]
    if bad:
        return f"expected a list of directories, got {_show(bad[0])} in it"
    return None


def _privacy(value: Any) -> str | None:
    known = [f.name for f in fields(Privacy)]
    if not isinstance(value, dict):
        return f"expected a mapping of {', '.join(known)} (true/false), got {_show(value)}"
    for key, flag in value.items():
        if key not in known:
            return f"unknown key {key!r} (known: {', '.join(known)})"
        if not isinstance(flag, bool):
            return f"{key}: expected true or false, got {_show(flag)}"
    return None


_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "listen_address": _listen,
    "interval": _number(MIN_INTERVAL, MAX_INTERVAL, "seconds"),
    "slow_interval": _number(MIN_INTERVAL, MAX_SLOW_INTERVAL, "seconds"),
    "energy_interval": _number(MIN_INTERVAL, MAX_SLOW_INTERVAL, "seconds"),
    "history_seconds": _number(MIN_HISTORY, MAX_HISTORY, "seconds"),
    "rules_dirs": _path_list,
    "hook_socket": _socket_path,
    "record": _optional_path,
    "web_config_file": _optional_path,
    "privacy": _privacy,
}
assert set(_CHECKS) == {f.name for f in fields(Config)}


def _missing_dirs(dirs: Any) -> list[str]:
    """A problem per rule directory that is not there: said with the configuration's
    other problems, not later when the advisor starts."""
    return [f"{d} does not exist or is not a directory" for d in dirs
            if isinstance(d, str) and d and not os.path.isdir(d)]


def _show(value: Any) -> str:
    kind = {bool: "a boolean", list: "a list", dict: "a mapping", str: "a string",
            type(None): "nothing (null)"}.get(type(value))
    return f"{kind} {value!r}" if kind and value is not None else (kind or repr(value))


def _cross_problems(values: dict[str, Any], final: bool = True) -> list[tuple[str, str]]:
    """Problems between the keys given (``values``), as (key to blame, message).

    ``final``: the values are the last word (the flags applied), so a slow tier left out
    is the default one, settled against the interval; a file read alone (not final) may
    still have its interval changed by a flag, so an energy interval is checked there only
    against a slow tier the file sets itself."""
    problems = []
    interval = values.get("interval", Config.interval)
    number = (int, float)
    if not isinstance(interval, number):
        return []
    slow = values.get("slow_interval")
    # the default slow tier follows a long interval (see _settle)
    if slow is None:
        slow = max(Config.slow_interval, interval) if final else None
    elif isinstance(slow, number) and slow < interval:
        msg = f"slow_interval ({slow:g} s) must not be shorter than interval ({interval:g} s)"
        problems.append(("slow_interval", msg))
    energy = values.get("energy_interval")
    if isinstance(energy, number) and isinstance(slow, number) and energy < slow:
        msg = (f"energy_interval ({energy:g} s) must not be shorter than slow_interval "
               f"({slow:g} s): the energy counter is read on the slow tier's rounds")
        problems.append(("energy_interval", msg))
    return problems


def load_config(path: str) -> Config:
    """Read and validate a YAML configuration file; all problems in one FileFormatError."""
    return _load(path)[0]


def _load(path: str) -> tuple[Config, dict[str, int]]:
    """The file's Config, and the keys it set itself with their lines."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise file_error("read", "configuration file", path, err) from err
    except UnicodeDecodeError as err:
        raise FileFormatError(path, [(None, f"not UTF-8 text ({err.reason})")]) from err
    try:
        # the reader refuses control characters at once, so this too is inside the try
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as err:
        raise FileFormatError(path, [(None, f"not valid YAML: {err}")]) from err
    try:
        # compose keeps the source marks (line numbers); each entry is then constructed
        # alone, so a key given twice is checked twice and reported where it is
        node = loader.get_single_node()
        if node is None:
            return Config(), {}
        if not isinstance(node, yaml.MappingNode):
            whole = loader.construct_document(node)
            msg = f"expected a mapping of settings (key: value), got {_show(whole)}"
            raise FileFormatError(path, [(node.start_mark.line + 1, msg)])
        entries = [(loader.construct_object(k, deep=True), loader.construct_object(v, deep=True),
                    k.start_mark.line + 1) for k, v in node.value]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(err, "problem", None) or str(err)
        raise FileFormatError(path, [(line, f"not valid YAML: {problem}")]) from err
    except RecursionError:
        raise FileFormatError(path, [(None, "nested too deeply to read")]) from None
    finally:
        loader.dispose()
    lines: dict[str, int] = {}
    problems: list[tuple[int | None, str]] = []
    values: dict[str, Any] = {}
    for key, value, line in entries:
        if not isinstance(key, str):  # a list or a mapping as a key is not even hashable
            problems.append((line, f"keys must be setting names, got {_show(key)}"))
            continue
        if key in lines:
            problems.append((line, f"{key}: given twice (first on line {lines[key]})"))
            continue
        if isinstance(key, str):
            lines[key] = line
        if key not in _CHECKS:
            near = difflib.get_close_matches(str(key), list(_CHECKS), n=1)
            hint = f" (did you mean {near[0]}?)" if near else \
                f" (known keys: {', '.join(_CHECKS)})"
            problems.append((line, f"unknown key {key!r}{hint}"))
            continue
        problem = _CHECKS[key](value)
        if problem:
            problems.append((line, f"{key}: {problem}"))
        else:
            values[key] = value
    for key, msg in _cross_problems(values, final=False):
        problems.append((lines.get(key), msg))
    for missing in _missing_dirs(values.get("rules_dirs", ())):
        problems.append((lines.get("rules_dirs"), f"rules_dirs: {missing}"))
    if problems:
        problems.sort(key=lambda p: (p[0] is None, p[0] or 0))
        raise FileFormatError(path, problems)
    if "rules_dirs" in values:
        values["rules_dirs"] = tuple(values["rules_dirs"])
    if "privacy" in values:
        values["privacy"] = Privacy(**values["privacy"])
    for key in ("interval", "slow_interval", "energy_interval", "history_seconds"):
        if key in values:
            values[key] = float(values[key])
    return _settle(Config(**values), frozenset(values)), {k: lines[k] for k in values}


def _settle(config: Config, given: frozenset[str]) -> Config:
    """The slow tier's default never runs more often than the tick itself, nor the energy
    counter's more often than the slow tier (it is read on the slow tier's rounds)."""
    if "slow_interval" not in given and config.slow_interval < config.interval:
        config = replace(config, slow_interval=config.interval)
    if "energy_interval" not in given and config.energy_interval < config.slow_interval:
        config = replace(config, energy_interval=config.slow_interval)
    return config


def config_from_args(args: argparse.Namespace) -> Config:
    """The configuration file (``--config.file``), then the flags given over it."""
    path = getattr(args, "config_file", None)
    config, in_file = _load(path) if path else (Config(), {})
    overrides: dict[str, Any] = {}
    for key, attr in (("listen_address", "listen_address"), ("interval", "interval"),
                      ("record", "record"), ("hook_socket", "hook_socket"),
                      ("slow_interval", "slow_interval"),
                      ("web_config_file", "web_config_file")):
        value = getattr(args, attr, None)
        if value is not None:
            overrides[key] = value
    extra_rules = getattr(args, "rules_dir", None)
    if extra_rules:
        overrides["rules_dirs"] = config.rules_dirs + tuple(extra_rules)
    problems = []
    for key, value in overrides.items():
        check = _CHECKS[key](list(value) if key == "rules_dirs" else value)
        if check:
            problems.append(f"{FLAGS.get(key, '--' + key.replace('_', '-'))}: {check}")
    problems += [f"--rules-dir: {m}" for m in _missing_dirs(extra_rules or ())]
    given = frozenset(in_file) | frozenset(overrides)
    # only the keys given are checked against each other: a slow tier the file did not
    # set follows the interval the flags chose, the energy counter the slow tier
    merged = {f.name: getattr(config, f.name) for f in fields(Config)
              if f.name in given} | overrides
    for key, msg in _cross_problems(merged):
        # a key the file set is blamed at its line, as the file's own problems are
        problems.append(f"{path}:{in_file[key]}: {msg}" if key in in_file
                        and key not in overrides else msg)
    if problems:
        raise UserError("; ".join(problems))
    for key in ("interval", "slow_interval"):
        if key in overrides:
            overrides[key] = float(overrides[key])
    for key in ("slow_interval", "energy_interval"):
        if key not in given:  # the default again, settled against the final intervals
            overrides[key] = getattr(Config, key)
    return _settle(replace(config, **overrides), given)
