"""The delivery event log (docs/events.md, schema v1): fields, events, validation.

Pure Python: importing this module never imports pyspark. :func:`spark_schema`
builds the Spark ``StructType`` on demand, inside the call.

The reports read the log with an explicit schema (one pass less than schema
inference, see docs/analytics.md) built from :data:`FIELDS`, so a field the daemons add
later is ignored rather than breaking the report; a field that changes type
reads as null and is counted as malformed by :func:`validate_event`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Final

__all__ = [
    "EVENTS_BY_ROLE",
    "FIELDS",
    "NODE_EVENTS",
    "PATHS",
    "ROLES",
    "SCHEMA_VERSION",
    "EventProblem",
    "format_ms",
    "iter_events",
    "parse_duration",
    "parse_time",
    "spark_schema",
    "validate_event",
    "validate_file",
]

SCHEMA_VERSION: Final = 1

# (name, python type, spark type name) in the order of docs/events.md.
FIELDS: Final[tuple[tuple[str, type, str], ...]] = (
    ("v", int, "int"),
    ("ts", int, "long"),
    ("logger", str, "string"),
    ("role", str, "string"),
    ("event", str, "string"),
    ("lk0", str, "string"),
    ("source", str, "string"),
    ("target", str, "string"),
    ("domain", str, "string"),
    ("data_type", str, "string"),
    ("subtype", str, "string"),
    ("key", str, "string"),
    ("save_fwd", int, "int"),
    ("ack2", bool, "boolean"),
    ("reliable", bool, "boolean"),
    ("priority", int, "int"),
    ("size", int, "long"),
    ("attempt", int, "int"),
    ("created_ms", int, "long"),
    ("lk1", str, "string"),
    ("code", int, "int"),
    ("node", str, "string"),
    ("detail", str, "string"),
    ("path", str, "string"),
)

FIELD_NAMES: Final = tuple(name for name, _, _ in FIELDS)

ROLES: Final = ("origin", "platform", "receiver")

EVENTS_BY_ROLE: Final[dict[str, frozenset[str]]] = {
    "origin": frozenset(
        {"queued", "sent", "ack_fwd", "ack_save", "nack", "inquiry", "resend", "ack2",
         "cleaned", "expired", "dead", "bad_receipt", "bad_refusal", "large_sent"}
    ),
    "platform": frozenset(
        {"received", "forwarded", "stored", "dropped", "refused", "delivered", "acked",
         "inquiry", "cleaned", "node_online", "node_offline"}
    ),
    "receiver": frozenset(
        {"received", "duplicate", "inbox", "ack2_sent", "reack", "reack2", "cleaned",
         "refused", "expired", "held", "gap_dropped", "large_started", "bad_chunk", "large_complete"}
    ),
}

# Connection events of the platform: they carry `node` and no `lk0`.
NODE_EVENTS: Final = frozenset({"node_online", "node_offline"})

# The links a document travels (`path` on the origin's `sent`, the receiver's
# `received` and the origin's `ack2`): a direct node-to-node link or the
# platform relay. A line without `path` was written before direct links: relay.
PATHS: Final = ("direct", "relay", "local")  # local: between users of one node (reported as direct)

_LOGGER_RE: Final = re.compile(r"^(org|platform):[^\s]+$")
_LK0_RE: Final = re.compile(r"^[^/\s]+/\d+/\d+/\d+$")


@dataclass(frozen=True, slots=True)
class EventProblem:
    """One thing wrong with one log line: where, and what."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def validate_event(obj: Any) -> list[str]:
    """Return what is wrong with one decoded log line (empty when it is valid).

    Checks what the reports rely on: the field types, that `event` belongs to
    `role`, that message events carry `lk0` and node events carry `node`.
    Unknown fields are allowed (forward compatibility).
    """
    if not isinstance(obj, dict):
        return [f"not a JSON object but {type(obj).__name__}"]
    problems: list[str] = []
    for name, typ, _ in FIELDS:
        if name not in obj or obj[name] is None:
            continue
        value = obj[name]
        # bool is an int in Python; a JSON true where a number belongs is wrong.
        ok = isinstance(value, typ) and (typ is bool or not isinstance(value, bool))
        if not ok:
            problems.append(f"{name}={value!r} is not {typ.__name__}")
    for name in ("v", "ts", "logger", "role", "event"):
        if obj.get(name) is None:
            problems.append(f"missing {name}")
    if problems:
        return problems
    if obj["v"] != SCHEMA_VERSION:
        problems.append(f"schema version {obj['v']}, this reader knows {SCHEMA_VERSION}")
    role, event = obj["role"], obj["event"]
    if role not in EVENTS_BY_ROLE:
        problems.append(f"role {role!r} is not one of {', '.join(ROLES)}")
    elif event not in EVENTS_BY_ROLE[role]:
        problems.append(f"event {event!r} is not a {role} event")
    if not _LOGGER_RE.match(obj["logger"]):
        problems.append(f"logger {obj['logger']!r} is not org:<id> or platform:<id>")
    if event in NODE_EVENTS:
        if not obj.get("node"):
            problems.append(f"{event} without node")
    elif not obj.get("lk0"):
        problems.append(f"{event} without lk0")
    elif not _LK0_RE.match(obj["lk0"]):
        problems.append(f"lk0 {obj['lk0']!r} is not NODE/SEMQ/DB/RECORD")
    if obj.get("save_fwd") is not None and obj["save_fwd"] not in (1, 2, 3):
        problems.append(f"save_fwd={obj['save_fwd']} is not 1, 2 or 3")
    if obj.get("path") is not None and obj["path"] not in PATHS:
        problems.append(f"path={obj['path']!r} is not {', '.join(PATHS[:-1])} or {PATHS[-1]}")
    return problems


def iter_events(path: str | Path) -> Iterator[dict[str, Any]]:
    """Yield the decoded lines of one JSON-lines log, skipping blank lines.

    Raises ``ValueError`` naming the file and line for a line that is not JSON.
    """
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from exc


def validate_file(path: str | Path) -> list[EventProblem]:
    """Validate every line of a JSON-lines log; return the problems found."""
    problems: list[EventProblem] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.append(EventProblem(number, f"not JSON ({exc.msg})"))
                continue
            problems.extend(EventProblem(number, m) for m in validate_event(obj))
    return problems


def spark_schema() -> Any:
    """The log schema as a pyspark ``StructType`` (imports pyspark here, not at import)."""
    from pyspark.sql import types as T

    spark_types = {
        "int": T.IntegerType(),
        "long": T.LongType(),
        "string": T.StringType(),
        "boolean": T.BooleanType(),
    }
    return T.StructType([T.StructField(n, spark_types[s], True) for n, _, s in FIELDS])


_DURATION_RE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d|w)?\s*$")
_UNIT_MS: Final = {
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 7 * 86_400_000,
}


def parse_duration(text: str) -> int:
    """`90s`, `15m`, `1h`, `2d`, `500ms` → milliseconds. A bare number is seconds.

    Raises ``ValueError`` with the text when it is not a duration.
    """
    m = _DURATION_RE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a duration (examples: 90s, 15m, 1h, 2d)")
    return int(float(m.group(1)) * _UNIT_MS[m.group(2) or "s"])


def parse_time(text: str) -> int:
    """An ISO 8601 date or date-time, or epoch milliseconds → epoch milliseconds.

    A time without a zone is UTC, because the logs' dates are UTC dates.
    Raises ``ValueError`` naming the text when it is none of these.
    """
    stripped = text.strip()
    if re.fullmatch(r"\d{11,}", stripped):
        return int(stripped)
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", stripped):
            d = date.fromisoformat(stripped)
            parsed = datetime(d.year, d.month, d.day, tzinfo=UTC)
        else:
            parsed = datetime.fromisoformat(stripped.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time (examples: 2026-11-22, 2026-11-22T08:00, "
            "2026-11-22T08:00:00+01:00, epoch ms)"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


def format_ms(ms: int | None) -> str:
    """Epoch milliseconds as `YYYY-MM-DD HH:MM:SS` UTC (empty for None)."""
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
