"""``--web.config.file``: TLS, client certificates and basic auth for the HTTP server, in
the Prometheus exporter-toolkit format (the file node_exporter and friends read)::

    tls_server_config:
      cert_file: /etc/gpuwatch/tls.crt
      key_file: /etc/gpuwatch/tls.key
      client_auth_type: RequireAndVerifyClientCert   # or VerifyClientCertIfGiven, NoClientCert
      client_ca_file: /etc/gpuwatch/clients-ca.crt
      client_allowed_sans: [prometheus.example.org]
      min_version: TLS12                             # TLS10 ... TLS13
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2y$10$...                         # htpasswd -nBC 10 "" | tr -d ':\\n'

Every problem in the file is reported at start with its line. :class:`WebConfigFile`
re-reads the file, and the certificate, key and CA files it names, when any of them
changed (checked per new connection, a few stat calls), so certificates rotate without a
restart; a rotation that fails keeps the last good setup and logs why once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import logging
import os
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpuwatch.errors import FileFormatError, UserError, file_error

log = logging.getLogger(__name__)

_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# exporter-toolkit accepts these, but they take a certificate without verifying it, which
# Python's ssl module does not do: refuse them rather than verify more than was asked
_CLIENT_AUTH_UNVERIFIED = ("RequestClientCert", "RequireAnyClientCert")
_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file",
             "client_allowed_sans", "min_version", "max_version",
             "prefer_server_cipher_suites"}
_TLS_UNSUPPORTED = {
    "cipher_suites": "Python's ssl module picks the TLS 1.3 suites itself; set min_version",
    "curve_preferences": "not supported by gpuwatch (Python's ssl module)",
    "cert": "give the certificate as cert_file",
    "key": "give the key as key_file",
    "client_ca": "give the CA as client_ca_file",
}
_BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")
# bcrypt checks of wrong passwords cost ~50 ms of CPU each at cost 10: at most this many
# at once, so a password-guessing client can't take every core
_BCRYPT_CONCURRENCY = 2
_dummy_hash: list[bytes] = []  # checked for unknown users, so they take as long as known ones


@dataclass
class WebConfig:
    """One loaded version of the file."""

    path: str
    tls: ssl.SSLContext | None = None
    client_allowed_sans: tuple[str, ...] = ()
    users: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    files: tuple[str, ...] = ()  # what a change to means a reload
    _ok: set[tuple[str, bytes]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check_basic_auth(self, header: str | None) -> str | None:
        """The user an ``Authorization`` header proves, or None (wrong, missing, bad)."""
        if not self.users:
            return ""  # no basic auth configured: everyone is in
        if not header or not header[:6].lower() == "basic ":
            return None
        try:
            user, sep, password = base64.b64decode(header[6:].strip(), validate=True) \
                .decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        if not sep:
            return None
        # successes are remembered (by a digest, never the password) so scrapes stay cheap
        key = (user, hashlib.sha256(password.encode()).digest())
        with self._lock:
            if key in self._ok:
                return user
        hashed = self.users.get(user)
        ok = _bcrypt_check(password.encode(), hashed if hashed is not None else _dummy())
        if ok and hashed is not None:
            with self._lock:
                if len(self._ok) > 1024:  # a bound, not an expected size
                    self._ok.clear()
                self._ok.add(key)
            return user
        return None

    def san_allowed(self, cert: dict[str, Any] | None) -> bool:
        """Whether a verified client certificate names one of client_allowed_sans."""
        if not self.client_allowed_sans:
            return True
        if not cert:
            return False
        names = {str(value) for kind, value in cert.get("subjectAltName", ())
                 if kind in ("DNS", "IP Address", "email", "URI")}
        return any(san in names for san in self.client_allowed_sans)


_bcrypt_slots = threading.BoundedSemaphore(_BCRYPT_CONCURRENCY)


def _bcrypt_check(password: bytes, hashed: bytes) -> bool:
    import bcrypt

    with _bcrypt_slots:
        try:
            return bool(bcrypt.checkpw(password, hashed))
        except ValueError:  # a hash bcrypt can't read: never a match
            return False


def _dummy() -> bytes:
    if not _dummy_hash:
        import bcrypt

        _dummy_hash.append(bcrypt.hashpw(os.urandom(16).hex().encode(), bcrypt.gensalt(10)))
    return _dummy_hash[0]


# -- loading ------------------------------------------------------------------------------

def _compose(path: str) -> yaml.Node | None:
    """The file's YAML node tree (nodes keep their lines)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise file_error("read", "web configuration file", path, err) from err
    except UnicodeDecodeError as err:
        raise FileFormatError(path, [(None, f"not UTF-8 text ({err.reason})")]) from err
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err)
        raise FileFormatError(path, [(mark.line + 1 if mark else None,
                                      f"not valid YAML: {problem}")]) from err
    finally:
        loader.dispose()
    return node


def _lines(node: yaml.MappingNode) -> list[tuple[Any, yaml.Node, int]]:
    return [(k.value if isinstance(k, yaml.ScalarNode) else None, v, k.start_mark.line + 1)
            for k, v in node.value]


def load_web_config(path: str) -> WebConfig:
    """Read and check the file; every problem at once in a FileFormatError."""
    node = _compose(path)
    problems: list[tuple[int | None, str]] = []
    config = WebConfig(path=path)
    files = [path]
    if node is None:
        return config
    if not isinstance(node, yaml.MappingNode):
        raise FileFormatError(path, [(node.start_mark.line + 1,
                                      "expected a mapping with tls_server_config, "
                                      "http_server_config and/or basic_auth_users")])
    base = os.path.dirname(os.path.abspath(path))
    seen: dict[str, int] = {}
    tls_node: tuple[yaml.Node, int] | None = None
    for key, value, line in _lines(node):
        if key in seen:
            problems.append((line, f"{key}: given twice (first on line {seen[key]})"))
            continue
        seen[str(key)] = line
        if key == "tls_server_config":
            tls_node = (value, line)
        elif key == "basic_auth_users":
            problems += _users(value, line, config)
        elif key == "http_server_config":
            problems += _http(value, line, config)
        else:
            problems.append((line, f"unknown key {key!r} (known: tls_server_config, "
                                   "http_server_config, basic_auth_users)"))
    if tls_node is not None:
        problems += _tls(tls_node[0], tls_node[1], config, base, files)
    if problems:
        problems.sort(key=lambda p: (p[0] is None, p[0] or 0))
        raise FileFormatError(path, problems)
    if config.users:
        try:
            import bcrypt  # noqa: F401
        except ImportError as err:
            raise UserError(f"{path}: basic_auth_users needs the bcrypt package "
                            "(pip install 'gpuwatch[web]')") from err
    config.files = tuple(files)
    return config


def _users(node: yaml.Node, line: int, config: WebConfig) -> list[tuple[int | None, str]]:
    if isinstance(node, yaml.ScalarNode) and node.value in ("", "~", "null"):
        return []
    if not isinstance(node, yaml.MappingNode):
        return [(line, "basic_auth_users: expected a mapping of user: bcrypt hash")]
    problems: list[tuple[int | None, str]] = []
    for user, value, at in _lines(node):
        if not isinstance(user, str) or not user or ":" in user:
            problems.append((at, f"basic_auth_users: {user!r} is not a user name"))
            continue
        hashed = value.value if isinstance(value, yaml.ScalarNode) else None
        if not isinstance(hashed, str) or not hashed.startswith(_BCRYPT_PREFIXES) \
                or len(hashed) != 60:
            problems.append((at, f"basic_auth_users: {user}: expected a bcrypt hash "
                                 "($2y$..., as `htpasswd -nBC 10 \"\" | tr -d ':\\n'` "
                                 "prints it), not a password"))
            continue
        if user in config.users:
            problems.append((at, f"basic_auth_users: {user} given twice"))
            continue
        # $2y$ (htpasswd's) is the same algorithm as $2b$, which bcrypt checks
        config.users[user] = ("$2b$" + hashed[4:]).encode() if hashed.startswith("$2y$") \
            else hashed.encode()
    return problems


def _http(node: yaml.Node, line: int, config: WebConfig) -> list[tuple[int | None, str]]:
    if not isinstance(node, yaml.MappingNode):
        return [(line, "http_server_config: expected a mapping")]
    problems: list[tuple[int | None, str]] = []
    for key, value, at in _lines(node):
        if key == "http2":
            if isinstance(value, yaml.ScalarNode) and value.value.lower() in ("true", "yes",
                                                                             "on"):
                problems.append((at, "http_server_config: http2: gpuwatch serves HTTP/1.1 "
                                     "only; set false or leave it out"))
        elif key == "headers":
            if not isinstance(value, yaml.MappingNode):
                problems.append((at, "http_server_config: headers: expected a mapping"))
                continue
            for name, v, hat in _lines(value):
                text = v.value if isinstance(v, yaml.ScalarNode) else None
                if not isinstance(name, str) or not name or any(c in name for c in ":\r\n ") \
                        or not isinstance(text, str) or "\r" in text or "\n" in text:
                    problems.append((hat, f"http_server_config: headers: {name!r} is not a "
                                          "header name with a one-line value"))
                    continue
                config.headers[name] = text
        else:
            problems.append((at, f"http_server_config: unknown key {key!r} "
                                 "(known: headers, http2)"))
    return problems


def _tls(node: yaml.Node, line: int, config: WebConfig, base: str,
         files: list[str]) -> list[tuple[int | None, str]]:
    if not isinstance(node, yaml.MappingNode):
        return [(line, "tls_server_config: expected a mapping")]
    problems: list[tuple[int | None, str]] = []
    values: dict[str, Any] = {}
    at: dict[str, int] = {}
    for key, value, kline in _lines(node):
        if key in _TLS_UNSUPPORTED:
            problems.append((kline, f"tls_server_config: {key}: {_TLS_UNSUPPORTED[key]}"))
            continue
        if key not in _TLS_KEYS:
            problems.append((kline, f"tls_server_config: unknown key {key!r} (known: "
                                    f"{', '.join(sorted(_TLS_KEYS))})"))
            continue
        at[key] = kline
        if key == "client_allowed_sans":
            if not isinstance(value, yaml.SequenceNode) or not all(
                    isinstance(v, yaml.ScalarNode) and v.value for v in value.value):
                problems.append((kline, "tls_server_config: client_allowed_sans: expected a "
                                        "list of names"))
                continue
            values[key] = tuple(v.value for v in value.value)
            continue
        if not isinstance(value, yaml.ScalarNode):
            problems.append((kline, f"tls_server_config: {key}: expected a single value"))
            continue
        values[key] = value.value
    if problems:
        return problems

    def where(key: str) -> int:
        return at.get(key, line)

    def file(key: str) -> str | None:
        name = values.get(key)
        if not name:
            return None
        full = name if os.path.isabs(name) else os.path.join(base, name)
        files.append(full)
        return full

    cert, key = file("cert_file"), file("key_file")
    if not cert or not key:
        return [(line, "tls_server_config: cert_file and key_file are both needed")]
    auth = values.get("client_auth_type", "NoClientCert")
    if auth in _CLIENT_AUTH_UNVERIFIED:
        return [(where("client_auth_type"), f"tls_server_config: client_auth_type: {auth} "
                 "(a client certificate taken unverified) is not supported; use "
                 "VerifyClientCertIfGiven or RequireAndVerifyClientCert with client_ca_file")]
    if auth not in _CLIENT_AUTH:
        return [(where("client_auth_type"), f"tls_server_config: client_auth_type: {auth!r} "
                 f"is not one of {', '.join(_CLIENT_AUTH)}")]
    ca = file("client_ca_file")
    if _CLIENT_AUTH[auth] != ssl.CERT_NONE and not ca:
        return [(where("client_auth_type"), f"tls_server_config: client_auth_type {auth} "
                 "needs client_ca_file")]
    if values.get("client_allowed_sans") and _CLIENT_AUTH[auth] == ssl.CERT_NONE:
        return [(where("client_allowed_sans"), "tls_server_config: client_allowed_sans needs "
                 "a client_auth_type that verifies client certificates")]
    versions = {}
    for k in ("min_version", "max_version"):
        if k in values:
            if values[k] not in _VERSIONS:
                return [(where(k), f"tls_server_config: {k}: {values[k]!r} is not one of "
                         f"{', '.join(_VERSIONS)}")]
            versions[k] = _VERSIONS[values[k]]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = versions.get("min_version", ssl.TLSVersion.TLSv1_2)
    if "max_version" in versions:
        if versions["max_version"] < ctx.minimum_version:
            return [(where("max_version"), "tls_server_config: max_version is below "
                     "min_version")]
        ctx.maximum_version = versions["max_version"]
    if str(values.get("prefer_server_cipher_suites", "true")).lower() in ("true", "yes"):
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        return [(where("cert_file"), f"tls_server_config: cannot use cert_file {cert} with "
                 f"key_file {key}: {_reason(err)}")]
    ctx.verify_mode = _CLIENT_AUTH[auth]
    if ca:
        try:
            ctx.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as err:
            return [(where("client_ca_file"), f"tls_server_config: cannot use client_ca_file "
                     f"{ca}: {_reason(err)}")]
    config.tls = ctx
    config.client_allowed_sans = tuple(_norm_san(s) for s in values.get("client_allowed_sans", ()))
    return []


def _norm_san(text: str) -> str:
    try:  # getpeercert() writes IP addresses in their canonical form
        return str(ipaddress.ip_address(text))
    except ValueError:
        return text


def _reason(err: Exception) -> str:
    if isinstance(err, ssl.SSLError):
        return err.reason or str(err)
    return getattr(err, "strerror", None) or str(err)


# -- reloading ----------------------------------------------------------------------------

def _stamp(paths: tuple[str, ...]) -> tuple[Any, ...]:
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


class WebConfigFile:
    """The file as loaded now; ``current()`` reloads it when it or a file it names changed."""

    def __init__(self, path: str, loader: Callable[[str], WebConfig] = load_web_config) -> None:
        self.path = path
        self._loader = loader
        self._config = loader(path)  # at start, a bad file is an error
        self._stamp = _stamp(self._config.files)
        self._lock = threading.Lock()
        self._failed_stamp: tuple[Any, ...] | None = None
        self.reloads = 0

    def current(self) -> WebConfig:
        config = self._config
        stamp = _stamp(config.files)
        if stamp == self._stamp or stamp == self._failed_stamp:
            return config
        with self._lock:
            if self._config is not config:  # another connection reloaded meanwhile
                return self._config
            try:
                fresh = self._loader(self.path)
            except UserError as err:
                # keep serving with the last good setup; say why once per change
                self._failed_stamp = stamp
                log.error("web configuration not reloaded, keeping the previous one: %s", err)
                return config
            self._config, self._stamp, self._failed_stamp = fresh, _stamp(fresh.files), None
            self.reloads += 1
            log.info("web configuration reloaded from %s", self.path)
            return fresh
