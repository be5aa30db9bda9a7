"""Configuration: one TOML file per data directory (``semq.toml``).

The directory is ``--dir``, else ``$SEMQ_DIR``, else ``./semq-data``.

Every key is declared once, on its ``Config`` field, with a ``Rule``: its
TOML type, the values allowed (in words, for the error and the docs) and the
check. ``load_config`` enforces the rules, and the command-line overrides go
through the same ones (``check_option``), so a wrong value stops a command
at start with one line naming the key, the value and what is allowed,
instead of a daemon that starts and dies later with a traceback.
docs/operations.md lists the keys from ``SETTINGS`` (a test compares them).

The data directory and the private files in it (stores with their -wal and
-shm, keys, event logs) are owner-only; ``check_private_paths`` is what a
daemon runs at start (the keys have their own check in semq.identity.crypto).
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
import stat
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Final, NamedTuple

import tomli_w

from semq.settings.bounds import (
    CONFIG_MAX_BYTES,
    DIRECT_HANDSHAKES,
    DIRECT_MAX_LINKS,
    DIRECT_MAX_LINKS_PER_ORG,
    FD_RESERVE,
    PLATFORM_BUFFER_MIB_PER_ORG,
    PLATFORM_HANDSHAKES,
    PLATFORM_MAX_CONNECTIONS,
    USER_MAX_CONNECTIONS,
)
from semq.umxt_protocol.units import MAX_UNITS

__all__ = [
    "CONFIG_NAME",
    "ORG_ID_ALLOWED",
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "SETTINGS",
    "Address",
    "Config",
    "ConfigError",
    "Rule",
    "UnsafePermissions",
    "check_option",
    "check_org",
    "check_private_paths",
    "data_dir",
    "load_config",
    "org_id_problem",
    "parse_hostport",
    "parse_platform_addresses",
    "private_paths",
    "read_config_text",
    "settings_reference",
    "settings_table",
    "write_config",
]

CONFIG_NAME: Final = "semq.toml"
PRIVATE_DIR_MODE: Final = 0o700  # the data directory and the directories in it
PRIVATE_FILE_MODE: Final = 0o600  # stores (and their -wal/-shm), keys, event logs
DEFAULT_PORT: Final = 7410


class ConfigError(Exception):
    """A configuration (or a command-line override of it) the user must fix:
    one line naming the key, the value and what is allowed (exit status 2)."""


class UnsafePermissions(ConfigError):
    """The data directory or a private file in it is open to group/others."""


# ---------------------------------------------------------------- value rules


def parse_hostport(text: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """``HOST:PORT`` / ``[::1]:PORT`` / ``HOST`` -> (host, port). Raises
    ValueError naming the address and what is wrong with it."""
    host, p = _split_hostport(text, default_port)
    if not 0 <= p <= 65535:
        raise ValueError(f"address {text.strip()!r}: port {p} is outside 0..65535")
    return host, p


def _split_hostport(text: str, default_port: int) -> tuple[str, int]:
    """``parse_hostport`` without the port's range check."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.lstrip(":")
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, ""
    if not host:
        raise ValueError(f"address {text!r} has no host")
    try:
        p = int(port) if port else default_port
    except ValueError:
        raise ValueError(f"address {text!r}: port {port!r} is not a number") from None
    return host, p


_HOST_RE: Final = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")
# Organization ids in this network are numbers, as the seed's 10008 and
# 56001: digits only, no leading zero (010008 would be another organization
# than 10008 on the wire while reading as the same number), at most the
# protocol's 64 characters of a node id.
_ORG_RE: Final = re.compile(r"[1-9][0-9]{0,63}")
ORG_ID_ALLOWED: Final = "an organization id: a number of 1 to 64 digits without a leading zero, e.g. 10008"
# A platform's endpoint id: the protocol's node id (semq.umxt_protocol.Endpoint).
_ENDPOINT_RE: Final = re.compile(r"[A-Za-z0-9._:@-]{1,64}")


def org_id_problem(text: object) -> str | None:
    """Why ``text`` is not an organization id (None when it is one)."""
    if not isinstance(text, str):
        return "is not a string"
    if not _ORG_RE.fullmatch(text):
        return "is not an organization id"
    return None


def _address_problem(text: str, min_port: int) -> str | None:
    try:
        host, port = _split_hostport(text, DEFAULT_PORT)
    except ValueError as e:
        return f"is not an address ({str(e).removeprefix(f'address {text.strip()!r}').lstrip(': ')})"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOST_RE.fullmatch(host) or len(host) > 253:
            return f"is not an address (host {host!r} is not a host name or an IP address)"
    if not min_port <= port <= 65535:
        return f"is not an address (port {port} is outside {min_port}..65535)"
    return None


class Address(NamedTuple):
    """One platform address as dialled: ``str()`` writes it back as
    ``HOST:PORT`` (``[::1]:PORT`` for an IPv6 address)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _addresses_problem(text: str, min_port: int) -> str | None:
    """Why ``text`` is not one address or a comma-separated list of them
    (None when it is). A list names its first bad entry."""
    entries = text.split(",")
    if len(entries) == 1:
        return _address_problem(text, min_port)
    seen: set[tuple[str, int]] = set()
    for n, entry in enumerate(entries, 1):
        entry = entry.strip()
        if not entry:
            return f"has an empty entry (number {n})"
        why = _address_problem(entry, min_port)
        if why is not None:
            return f"has {entry!r}, which {why}"
        address = parse_hostport(entry)
        if address in seen:
            return f"has {entry!r} twice"
        seen.add(address)
    return None


def parse_platform_addresses(text: str) -> list[Address]:
    """The ``platform`` key (or ``--platform``): ``HOST:PORT``, or several
    separated by commas (``p1:7410,p2:7410``), in the order a node tries
    them. Raises ValueError naming the value and its first bad entry."""
    why = _addresses_problem(text, 1)
    if why is not None:
        raise ValueError(f"platform {json.dumps(text, ensure_ascii=False)} {why}")
    return [Address(*parse_hostport(entry)) for entry in text.split(",")]


@dataclass(frozen=True)
class Rule:
    """What one ``semq.toml`` key may hold. ``kind`` is its TOML type
    (string, integer, number, boolean); ``allowed`` says in words what is
    allowed (the errors and docs/operations.md print it); ``check`` returns
    None for a good value of the right type, else the reason (``is out of
    range``, ``is not an organization id``...)."""

    kind: str
    allowed: str
    check: Callable[[Any], str | None] = lambda _v: None
    doc: str = ""
    #: What a reload (SIGHUP, ``semq admin reload``) does with a changed
    #: value, per role: ``(("node", "at once"), ...)``; a role not named
    #: reads the key at start only. semq.ops.reload applies exactly these.
    reload: tuple[tuple[str, str], ...] = ()

    def reload_when(self, role: str) -> str | None:
        """When a reload applies a changed value for ``role`` (None: only a
        restart does)."""
        return next((when for r, when in self.reload if r == role), None)

    def reload_words(self) -> str:
        """The reload behaviour in words, for the reference and the docs."""
        if not self.reload:
            return "no: restart"
        return "; ".join(f"{role}: {when}" for role, when in self.reload)

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not allowed (None when it is)."""
        if self.kind == "boolean":
            ok = isinstance(value, bool)
        elif self.kind == "integer":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif self.kind == "number":
            ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        else:
            ok = isinstance(value, str)
        if not ok:
            return f"is not {'an' if self.kind[0] in 'aeiou' else 'a'} {self.kind}"
        return self.check(value)

    def parse(self, text: str) -> Any:
        """A command-line value of this key's type (ConfigError-free: a
        value that does not parse is returned as the text, which ``problem``
        then refuses with the type's words)."""
        try:
            if self.kind == "integer":
                return int(text)
            if self.kind == "number":
                return float(text)
        except ValueError:
            return text
        return text


def _between(lo: float, hi: float) -> Callable[[Any], str | None]:
    return lambda v: None if lo <= v <= hi else "is out of range"


def _one_of(*values: str) -> Callable[[Any], str | None]:
    return lambda v: None if v.upper() in values else "is not allowed"


def _setting(default: Any, rule: Rule) -> Any:
    return field(default=default, metadata={"rule": rule})


def _reloads(**when: str) -> tuple[tuple[str, str], ...]:
    """``Rule.reload`` from ``node="at once", platform="..."``."""
    return tuple(when.items())


_ADDRESS_WORDS: Final = "HOST:PORT with PORT {lo}..65535{zero}, e.g. 127.0.0.1:7410 or [::1]:7410"


@dataclass
class Config:
    """A data directory's ``semq.toml``. Each field's ``Rule`` (its metadata)
    is the one definition of what the key may hold."""

    role: str = field(metadata={"rule": Rule("string", '"node" or "platform"',
                                             lambda v: None if v in ("node", "platform") else "is not allowed",
                                             "what the directory holds; set by init")})
    directory: Path = field(metadata={"rule": None})  # not in the file: where it was read
    org: str = _setting("", Rule(
        "string", ORG_ID_ALLOWED, lambda v: None if v == "" else org_id_problem(v),
        'node: its organization id (a platform has "")'))
    platform: str = _setting(f"127.0.0.1:{DEFAULT_PORT}", Rule(
        "string", _ADDRESS_WORDS.format(lo=1, zero="") + ", or several separated by commas",
        lambda v: _addresses_problem(v, 1),
        "node: the platform's address; several (p1:7410,p2:7410): tried in turn, the next when one fails",
        reload=_reloads(node="from the next connection")))
    platform_id: str = _setting("platform", Rule(
        "string", "1 to 64 characters of A-Z a-z 0-9 . _ : @ -",
        lambda v: None if _ENDPOINT_RE.fullmatch(v) else "is not an endpoint id",
        "platform: its endpoint id"))
    listen: str = _setting(f"127.0.0.1:{DEFAULT_PORT}", Rule(
        "string", _ADDRESS_WORDS.format(lo=0, zero=" (0: any free port)"), lambda v: _address_problem(v, 0),
        "platform: the address it listens on"))
    store: str = _setting("", Rule(
        "string", 'empty (the SQLite file platform.sqlite here) or postgresql://USER@HOST:PORT/DB',
        lambda v: None if v == "" or v.startswith(("postgresql://", "postgres://")) else "is not a postgresql:// URL",
        "platform: its store; several instances sharing one PostgreSQL store form one platform; set by init"))
    inquiry_interval: float = _setting(15.0, Rule(
        "number", "a number of seconds 0.01..86400", _between(0.01, 86400),
        "seconds before an unconfirmed document is asked about (the protocol's default: 15)",
        reload=_reloads(node="at once", platform="at once")))
    synchronous: str = _setting("FULL", Rule(
        "string", 'one of "OFF", "NORMAL", "FULL", "EXTRA" (any case)', _one_of("OFF", "NORMAL", "FULL", "EXTRA"),
        "SQLite synchronous mode of the store: FULL makes every commit durable before its ack"))
    units: int = _setting(1, Rule(
        "integer", f"an integer 1..{MAX_UNITS}", _between(1, MAX_UNITS),
        "node: unit processes that share its load, each with its own store (docs/operations.md"
        ' "Several units per node"); set by init'))
    window: int = _setting(4096, Rule(
        "integer", "an integer 1..1000000", _between(1, 1_000_000),
        "documents in flight without the platform's ack (node) / granted to a node (platform)",
        reload=_reloads(node="at once, the running session too", platform="for new sessions")))
    queue_mib: int = _setting(16, Rule(
        "integer", "an integer 1..65536", _between(1, 65536),
        "platform: MiB queued in memory for one slow node before its documents are stored instead",
        reload=_reloads(platform="at once")))
    auto_register: bool = _setting(True, Rule(
        "boolean", "true or false", doc="platform without security: accept nodes it does not know yet",
        reload=_reloads(platform="at once (without security)")))
    quota_mib: int = _setting(4096, Rule(
        "integer", "an integer 0..1048576 (0: no limit)", _between(0, 1 << 20),
        "platform: MiB of documents one organization may have stored here at once; past it QUOTA_EXCEEDED",
        reload=_reloads(platform="at once")))
    max_connections_per_org: int = _setting(4, Rule(
        "integer", "an integer 1..1024", _between(1, 1024),
        "platform: connections one organization may hold at once; one more per unit it is granted beyond"
        " the first (semq platform register ORG --units N)",
        reload=_reloads(platform="for new connections")))
    max_units_per_org: int = _setting(8, Rule(
        "integer", f"an integer 1..{MAX_UNITS}", _between(1, MAX_UNITS),
        "platform: the most units any organization's node may run (each holds a connection), whatever it"
        " is granted; a node saying more is refused",
        reload=_reloads(platform="for new connections")))
    max_connections: int = _setting(PLATFORM_MAX_CONNECTIONS, Rule(
        "integer", "an integer 1..1000000", _between(1, 1_000_000),
        "platform: connections held at once, all organizations and strangers together; beyond it (or"
        " within fd_reserve of the descriptor limit) a new connection is closed at once"))
    max_handshakes: int = _setting(PLATFORM_HANDSHAKES, Rule(
        "integer", "an integer 1..100000", _between(1, 100_000),
        "platform: connections at once still in their TLS handshake or before their HELLO (strangers"
        " saying nothing cannot hold the relay's descriptors)"))
    max_buffer_mib_per_org: int = _setting(PLATFORM_BUFFER_MIB_PER_ORG, Rule(
        "integer", "an integer 64..65536", _between(64, 65536),
        "platform, and a node's direct-link listener: MiB of frames one organization's connections may"
        " buffer together; a connection that would pass it waits (its sender is pushed back) until the"
        " others' frames are handled"))
    fd_reserve: int = _setting(FD_RESERVE, Rule(
        "integer", "an integer 16..100000", _between(16, 100_000),
        "file descriptors a daemon keeps for its own use (its platform session, store, logs): its listeners"
        " stop accepting before the process's descriptor limit comes this close"))
    user_socket: str = _setting("user.sock", Rule(
        "string", 'a path (relative: in the data directory), or "" for none',
        lambda v: None if "\x00" not in v else "is not a path",
        "node: the Unix socket where users' applications send and read their own documents with their"
        " token (semq user add); put it where they can reach it, e.g. /run/semq/ORG.sock"))
    user_socket_max_connections: int = _setting(USER_MAX_CONNECTIONS, Rule(
        "integer", "an integer 1..4096", _between(1, 4096),
        "node: connections the user socket serves at once (one user holds at most 8, an account that has not"
        " authenticated yet at most 8); one more gets an error line naming the limit and is closed"))
    max_document_mib: int = _setting(4096, Rule(
        "integer", "an integer 1..1048576", _between(1, 1 << 20),
        "node: MiB of the largest document sent or received; larger files are refused at send, larger"
        " incoming manifests with TOO_LARGE. Files over large_from_mib travel in chunks (docs/large-documents.md)",
        reload=_reloads(node="at once")))
    large_from_mib: int = _setting(4, Rule(
        "integer", "an integer 1..60", _between(1, 60),
        "node: files sent with semq send larger than this many MiB travel as a large document (manifest"
        " and chunks, never whole in memory); smaller ones in one frame",
        reload=_reloads(node="at once")))
    history_days: int = _setting(90, Rule(
        "integer", "an integer 0..3650 (0: no history)", _between(0, 3650),
        "days the delivery history (semq track, the web console) keeps a document; read at start"))
    clock_skew: float = _setting(600.0, Rule(
        "number", "a number of seconds 0..86400", _between(0, 86400),
        "node: how far the organizations' clocks may disagree; documents created further ahead, or older"
        " than the 30-day duplicate suppression minus this, are refused STALE",
        reload=_reloads(node="at once")))
    direct_listen: str = _setting("", Rule(
        "string", "empty (no listening) or " + _ADDRESS_WORDS.format(lo=0, zero=" (0: any free port)"),
        lambda v: None if v == "" else _address_problem(v, 0),
        "node: where it accepts direct links from other nodes (needs security); empty: it does not"))
    direct_announce: str = _setting("", Rule(
        "string", "empty or HOST:PORT addresses separated by commas",
        lambda v: None if v == "" else _addresses_problem(v, 1),
        "node: the addresses other nodes reach its listener at; empty: the listening address, and the"
        " address the platform sees when listening on all interfaces"))
    direct: str = _setting("prefer", Rule(
        "string", '"prefer", "never" or "only"', lambda v: None if v in ("prefer", "never", "only") else "is not allowed",
        "node: documents to an organization that listens go over a direct link when one works (prefer),"
        " never, or only (else they wait)"))
    direct_from: str = _setting("", Rule(
        "string", "empty (every organization) or organization ids separated by commas",
        lambda v: None if v == "" else next((f"names {x.strip()!r}, which {p}" for x in v.split(",")
                                             if (p := org_id_problem(x.strip()))), None),
        "node: the organizations that may look up its addresses and connect directly; empty: all"))
    direct_retry: float = _setting(10.0, Rule(
        "number", "a number of seconds 0.1..120", _between(0.1, 120),
        "node: seconds before a direct link that could not be made is tried again, doubling up to 120;"
        " meanwhile the documents go through the platform (or wait: direct = \"only\")"))
    direct_max_links: int = _setting(DIRECT_MAX_LINKS, Rule(
        "integer", "an integer 1..100000", _between(1, 100_000),
        "node: direct links from other nodes held at once; beyond it (or within fd_reserve of the"
        " descriptor limit) a new one is refused"))
    direct_max_links_per_org: int = _setting(DIRECT_MAX_LINKS_PER_ORG, Rule(
        "integer", "an integer 1..1024", _between(1, 1024),
        "node: direct links one organization may hold to this node at once"))
    direct_handshakes: int = _setting(DIRECT_HANDSHAKES, Rule(
        "integer", "an integer 1..10000", _between(1, 10_000),
        "node: direct links at once still in their TLS handshake or before their HELLO"))
    edge_listen: str = _setting("", Rule(
        "string", "empty (no listening) or " + _ADDRESS_WORDS.format(lo=0, zero=" (0: any free port)"),
        lambda v: None if v == "" else _address_problem(v, 0),
        "node: where AS2 / AS4 partners POST their messages (docs/interop.md); empty: it does not listen;"
        " read at start"))
    edge_tls: bool = _setting(False, Rule(
        "boolean", "true or false",
        doc="node: the edge listener speaks HTTPS with the edge certificate (semq partner cert); false: plain"
            " HTTP, as AS2 commonly runs behind a TLS proxy; read at start"))
    security: bool = _setting(True, Rule(
        "boolean", "true or false",
        doc="mutual TLS, end-to-end encryption and signatures (docs/security.md); set by init"))

    # Not in the file: which of the node's units this process is (semq.umxt_protocol.units).
    unit: int = field(default=1, metadata={"rule": None})

    def for_unit(self, unit: int) -> Config:
        """This configuration as unit ``unit`` of the node sees it."""
        if not 1 <= unit <= self.units:
            raise ConfigError(f"unit {unit} is not one of this node's units 1..{self.units}")
        return replace(self, unit=unit)

    @property
    def unit_dir(self) -> Path:
        """Where this unit keeps its store, status and admin socket: the data
        directory for unit 1, ``unit-K`` in it for unit K."""
        return self.directory if self.unit == 1 else self.directory / f"unit-{self.unit}"

    @property
    def unit_dirs(self) -> list[Path]:
        """Every unit's directory, unit 1 first."""
        return [self.for_unit(k).unit_dir for k in range(1, self.units + 1)]

    @property
    def store_path(self) -> Path:
        return self.unit_dir / ("platform.sqlite" if self.role == "platform" else "node.sqlite")

    @property
    def platform_store(self) -> Path | str:
        """The platform's store: its PostgreSQL URL, or the SQLite file."""
        return self.store or self.store_path

    @property
    def events_dir(self) -> Path:
        return self.directory / "events"

    @property
    def status_path(self) -> Path:
        return self.unit_dir / "status.json"

    def check(self, source: str = CONFIG_NAME) -> Config:
        """Every key against its rule, and the rules between keys (a node
        needs an organization id). Raises ConfigError naming ``source``, the
        first bad key, its value and what is allowed. Returns self."""
        for name, rule in SETTINGS.items():
            _refuse(rule, getattr(self, name), f"{source}: {name} =")
        if self.role == "node" and not self.org:
            raise ConfigError(f'{source}: org = "" is not allowed for a node; allowed: {ORG_ID_ALLOWED}')
        return self


SETTINGS: Final[dict[str, Rule]] = {f.name: f.metadata["rule"] for f in fields(Config)
                                    if f.metadata.get("rule") is not None}


def _toml(value: Any) -> str:
    """A value as it is written in TOML (for the errors)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value, ensure_ascii=False, default=str)


def _refuse(rule: Rule, value: Any, label: str) -> None:
    why = rule.problem(value)
    if why is not None:
        raise ConfigError(f"{label} {_toml(value)} {why}; allowed: {rule.allowed}")


def settings_table() -> str:
    """The keys of ``semq.toml`` as a Markdown table, from the rules
    (docs/operations.md holds this output; a test compares them)."""
    rows = ["| key | type | allowed | default | reloaded by SIGHUP | what |", "|---|---|---|---|---|---|"]
    for name, rule, default in _settings():
        shown = "(required)" if default is MISSING else f"`{_toml(default)}`"
        rows.append(f"| `{name}` | {rule.kind} | {rule.allowed} | {shown} | {rule.reload_words()} | {rule.doc} |")
    return "\n".join(rows) + "\n"


def settings_reference() -> str:
    """The keys of ``semq.toml`` for a terminal (``semq config reference``):
    from the same rules as ``settings_table``."""
    out = [f"{CONFIG_NAME}: one per data directory, written by 'semq node init' / 'semq platform init'.",
           "Every key, its type, default, the values allowed and whether a reload (SIGHUP,"
           " 'semq admin reload') applies a change:", ""]
    for name, rule, default in _settings():
        shown = "required" if default is MISSING else f"default {_toml(default)}"
        out += [f"{name} ({rule.kind}, {shown})", f"    {rule.doc}", f"    allowed: {rule.allowed}",
                f"    reloaded by SIGHUP: {rule.reload_words()}", ""]
    return "\n".join(out)


def _settings() -> Iterator[tuple[str, Rule, Any]]:
    """(key, rule, default) of every key, in the file's order."""
    for f in fields(Config):
        rule = f.metadata.get("rule")
        if rule is not None:
            yield f.name, rule, f.default


def check_org(text: str, option: str) -> str:
    """An organization id given on the command line (``--org``, ``--to``).
    Returns it; raises ConfigError naming ``option``, the value and what an
    organization id is."""
    why = org_id_problem(text)
    if why is not None:
        raise ConfigError(f"{option} {json.dumps(text, ensure_ascii=False)} {why}; allowed: {ORG_ID_ALLOWED}")
    return text


def check_option(name: str, text: str, option: str) -> Any:
    """A command-line override of the key ``name`` (``--inquiry-interval
    -1``): parsed to the key's type and checked by the key's rule. Returns
    the value; raises ConfigError naming ``option``, the value and what is
    allowed."""
    rule = SETTINGS[name]
    value = rule.parse(text)
    why = rule.problem(value)
    if why is not None:
        shown = json.dumps(text, ensure_ascii=False) if rule.kind == "string" else text
        raise ConfigError(f"{option} {shown} {why}; allowed: {rule.allowed}")
    return value


def data_dir(explicit: str | None) -> Path:
    return Path(explicit or os.environ.get("SEMQ_DIR") or "semq-data").resolve()


def read_config_text(path: Path, what: str = "configuration") -> str:
    """The text of a configuration file, read only when it is a regular
    file of at most ``CONFIG_MAX_BYTES``: a larger one (or a device, a
    FIFO) is refused unread with one ConfigError line naming its size and
    the limit. Reads at most the limit and one byte more, so a file that
    grows while it is read is refused too. UnicodeDecodeError for text
    that is not UTF-8; OSError as the file system says."""
    limit = f"{CONFIG_MAX_BYTES >> 20} MiB" if CONFIG_MAX_BYTES % (1 << 20) == 0 else f"{CONFIG_MAX_BYTES} bytes"
    with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK)) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{what} {path} is not a regular file; not read")
        if st.st_size > CONFIG_MAX_BYTES:
            raise ConfigError(f"{what} {path} of {st.st_size} bytes exceeds the {limit} limit of a configuration"
                              " file; not read")
        data = f.read(CONFIG_MAX_BYTES + 1)
    if len(data) > CONFIG_MAX_BYTES:
        raise ConfigError(f"{what} {path} grew past the {limit} limit of a configuration file while it was read")
    return data.decode("utf-8")


def load_config(directory: Path) -> Config:
    """Read ``directory/semq.toml``. Raises ConfigError (one line): no file,
    not TOML, an unknown key, or a value its rule does not allow."""
    path = directory / CONFIG_NAME
    if not path.exists():
        raise ConfigError(f"no configuration at {path}; run 'semq node init' or 'semq platform init' (or set SEMQ_DIR)")
    try:
        raw: dict[str, Any] = tomllib.loads(read_config_text(path, "configuration"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"configuration {path} is not valid TOML: {e}") from e
    unknown = set(raw) - set(SETTINGS)
    if unknown:
        raise ConfigError(f"configuration {path} has unknown keys: {', '.join(sorted(unknown))}"
                          f" (known: {', '.join(SETTINGS)})")
    if "role" not in raw:
        raise ConfigError(f'{path}: role is missing; allowed: {SETTINGS["role"].allowed}')
    for name, value in raw.items():
        _refuse(SETTINGS[name], value, f"{path}: {name} =")
    if isinstance(raw.get("inquiry_interval"), int):
        raw["inquiry_interval"] = float(raw["inquiry_interval"])
    return Config(directory=directory, **raw).check(str(path))


def write_config(cfg: Config) -> Path:
    """Write ``cfg`` (checked first: nothing is written for a bad value) into
    its directory, which is created owner-only."""
    cfg.check()
    cfg.directory.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    os.chmod(cfg.directory, PRIVATE_DIR_MODE)
    data = {k: v for k, v in asdict(cfg).items() if k not in ("directory", "unit")}
    path = cfg.directory / CONFIG_NAME
    path.write_text(tomli_w.dumps(data), "utf-8")
    return path


# ---------------------------------------------------------------- permissions


def private_paths(cfg: Config) -> Iterator[tuple[Path, int]]:
    """The data directory and the private files in it that exist, each with
    the mode it must not exceed: the store with its -wal and -shm, and the
    delivery event logs. (Keys are checked by semq.identity.crypto when loaded.)"""
    yield cfg.directory, PRIVATE_DIR_MODE
    if cfg.unit_dir != cfg.directory:
        yield cfg.unit_dir, PRIVATE_DIR_MODE
    for sfx in ("", "-wal", "-shm"):
        p = Path(f"{cfg.store_path}{sfx}")
        if p.exists():
            yield p, PRIVATE_FILE_MODE
    if cfg.events_dir.is_dir():
        for p in sorted(cfg.events_dir.glob("*.jsonl")):
            yield p, PRIVATE_FILE_MODE


def check_private_paths(cfg: Config) -> None:
    """Refuse a data directory or a private file (see ``private_paths``) that
    group or others may access: a node's store holds its documents in
    plaintext, the event logs who exchanged what with whom. Raises
    UnsafePermissions, one line naming the first such path, its mode and
    the chmod that fixes every one found. No-op on Windows, where POSIX modes
    do not apply."""
    if os.name == "nt":  # pragma: no cover
        return
    bad: list[tuple[Path, int, int]] = []
    for p, allowed in private_paths(cfg):
        try:
            mode = stat.S_IMODE(p.stat().st_mode)
        except FileNotFoundError:  # a -shm removed as we looked
            continue
        if mode & 0o077:
            bad.append((p, mode, allowed))
    if not bad:
        return
    p, mode, _ = bad[0]
    what = "data directory" if p == cfg.directory else "file"
    cmds = [f"chmod {PRIVATE_DIR_MODE:o} {q}" for q, _, a in bad if a == PRIVATE_DIR_MODE]
    files = [str(q) for q, _, a in bad if a == PRIVATE_FILE_MODE and q.parent != cfg.events_dir]
    logs = [q for q, _, a in bad if q.parent == cfg.events_dir]
    files += [str(cfg.events_dir / "*.jsonl")] if len(logs) > 1 else [str(q) for q in logs]
    if files:
        cmds.append(f"chmod {PRIVATE_FILE_MODE:o} {' '.join(files)}")
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    raise UnsafePermissions(f"{what} {p} is accessible by group/others (mode {mode:04o}){more};"
                            f" run {' && '.join(cmds)}")
