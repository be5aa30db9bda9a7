"""Operational logs: levels, JSON lines or key=value, to stderr and
optionally a file — and never document contents or key material.

``configure_logging(level, fmt, file)`` installs handlers on the root
logger (replacing the ones it installed before, so it may be called again
on reload). Every handler carries a ``RedactFilter`` that rewrites each
record before it is formatted:

- arguments and extra attributes that are bytes (a payload, a key, a
  frame) become ``<N bytes>``;
- attributes whose name says payload or secret (``app_data``, ``payload``,
  ``body``, ``document``, ``frame``, ``session_key``, ``private_key``,
  ``password``, ``secret``, ``token``, ``key_material``) become
  ``[redacted]``;
- in the message (and in a formatted traceback): PEM blocks become
  ``[PEM redacted]``, ``b'...'`` literals of more than 16 characters
  ``[bytes redacted]``, and runs of 64+ base64 characters or 48+ hex digits
  ``[redacted]`` (keys, signatures, ciphertext).

Ordinary identifiers (LK0s, AppKeys, organization ids, result codes, sizes)
are untouched: operators need them. The delivery event log (docs/events.md)
is a separate file and never holds contents either.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Final, TextIO

__all__ = ["LOG_FORMATS", "JsonFormatter", "KeyValueFormatter", "RedactFilter", "configure_logging", "redact"]

LOG_FORMATS: Final = ("text", "json")

_PEM: Final = re.compile(r"-----BEGIN [A-Z0-9 ]+-----.*?(?:-----END [A-Z0-9 ]+-----|$)", re.S)
_BYTES_LIT: Final = re.compile(r"""b(?:'(?:[^'\\]|\\.){16,}'|"(?:[^"\\]|\\.){16,}")""")
_B64: Final = re.compile(r"(?<![A-Za-z0-9+/=_-])[A-Za-z0-9+/_-]{64,}={0,2}")
_HEX: Final = re.compile(r"(?<![0-9A-Fa-f])[0-9A-Fa-f]{48,}(?![0-9A-Fa-f])")
_SECRET_NAMES: Final = frozenset({
    "app_data", "payload", "body", "document", "frame", "data", "session_key", "private_key", "key_material",
    "password", "passphrase", "secret", "token", "raw",
})
#: LogRecord's own attributes (never touched, except msg/args).
_STD: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def _b64_repl(m: re.Match[str]) -> str:
    run = m.group(0)
    # Base64 mixes cases and digits; a long path or identifier rarely does.
    looks_random = (any(c.isupper() for c in run) and any(c.islower() for c in run)
                    and any(c.isdigit() for c in run) and run.count("/") * 10 < len(run))
    return "[redacted]" if looks_random else run


def redact(text: str) -> str:
    """``text`` with PEM blocks, long bytes literals, and long base64 / hex
    runs replaced (see the module docstring)."""
    if "-----BEGIN" in text:
        text = _PEM.sub("[PEM redacted]", text)
    if "b'" in text or 'b"' in text:
        text = _BYTES_LIT.sub("[bytes redacted]", text)
    if len(text) >= 48:
        text = _B64.sub(_b64_repl, text)
        text = _HEX.sub("[redacted]", text)
    return text


def _safe(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(value)} bytes>"
    return value


class RedactFilter(logging.Filter):
    """Rewrites records so no handler can write contents or key material."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_semq_redacted", False):
            return True
        args = record.args
        if isinstance(args, tuple):
            args = tuple(_safe(a) for a in args)
        elif isinstance(args, dict):
            args = {k: _safe(v) for k, v in args.items()}
        try:
            msg = str(record.msg) % args if args else str(_safe(record.msg))
        except (TypeError, ValueError, KeyError):
            msg = f"{_safe(record.msg)} {args!r}"
        record.msg = redact(msg)
        record.args = None
        for k, v in list(vars(record).items()):
            if k in _STD or k.startswith("_"):
                continue
            if k.lower() in _SECRET_NAMES:
                setattr(record, k, "[redacted]")
            elif isinstance(v, bytes | bytearray | memoryview):
                setattr(record, k, _safe(v))
            elif isinstance(v, str):
                setattr(record, k, redact(v))
        record._semq_redacted = True
        return True


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STD and not k.startswith("_")}


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, extra fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": _iso(record.created), "level": record.levelname, "logger": record.name,
                               "msg": record.getMessage()}
        for k, v in _extras(record).items():
            out[k] = v if isinstance(v, str | int | float | bool) or v is None else str(v)
        if record.exc_info:
            out["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


def _kv(v: Any) -> str:
    s = str(v)
    if s and not any(c in s for c in ' "=\n\t'):
        return s
    return json.dumps(s, ensure_ascii=False)


class KeyValueFormatter(logging.Formatter):
    """``ts=... level=INFO logger=semq.node msg="..." key=value``: one line
    (a traceback follows as ``exc="..."`` on the same line)."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [f"ts={_iso(record.created)}", f"level={record.levelname}", f"logger={record.name}",
                 f"msg={_kv(record.getMessage())}"]
        parts += [f"{k}={_kv(v)}" for k, v in _extras(record).items()]
        if record.exc_info:
            parts.append(f"exc={_kv(redact(self.formatException(record.exc_info)))}")
        return " ".join(parts)


def _open_private(path: Path) -> None:
    """Create the log file owner-only (it names organizations and LK0s)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.close(fd)


def configure_logging(level: int | str = "INFO", fmt: str = "text", file: Path | None = None, *,
                      stream: TextIO | None = None, exclusive: bool = False) -> list[logging.Handler]:
    """Log at ``level`` in ``fmt`` (``text`` = key=value, ``json`` = JSON
    lines) to ``stream`` (default stderr) and, with ``file``, to that file
    too (created 0600; reopened when logrotate moves it). Replaces the
    handlers an earlier call installed; root handlers installed by others
    (``logging.basicConfig``) get the redaction filter as well, or with
    ``exclusive`` are removed (a daemon's logs in one format only). Raises ValueError for an unknown
    level or format."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {', '.join(LOG_FORMATS)}")
    if isinstance(level, str):
        lv = logging.getLevelName(level.upper())
        if not isinstance(lv, int):
            raise ValueError(f"log level {level!r} is not DEBUG, INFO, WARNING, ERROR or CRITICAL")
        level = lv
    formatter: logging.Formatter = JsonFormatter() if fmt == "json" else KeyValueFormatter()
    handlers: list[logging.Handler] = [logging.StreamHandler(stream or sys.stderr)]
    if file is not None:
        _open_private(Path(file))
        handlers.append(logging.handlers.WatchedFileHandler(str(file), encoding="utf-8"))
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_semq_ops", False) or exclusive:
            root.removeHandler(h)
            h.close()
    for h in handlers:
        h.setFormatter(formatter)
        h.addFilter(RedactFilter())
        h._semq_ops = True  # type: ignore[attr-defined]
        root.addHandler(h)
    for h in root.handlers:  # handlers others installed redact too
        if not any(isinstance(f, RedactFilter) for f in h.filters):
            h.addFilter(RedactFilter())
    root.setLevel(level)
    return handlers
