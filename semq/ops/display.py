"""How the commands show values to a person: text that came from another
organization (an AppKey, a user name, a reason) with its control
characters escaped, so it cannot move the cursor or rewrite a terminal
line; epoch milliseconds as local date and time; counts checked against
their range with one line naming the value and the range. ``--json``
output keeps the raw values."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any, Final

__all__ = ["MAX_LIMIT", "CountError", "age", "check_count", "is_time_key", "shown", "when"]

MAX_LIMIT: Final = 10_000  # rows one list command shows (and one admin list/stuck answer holds)


class CountError(ValueError):
    """A count option out of its range (exit 2: the user's mistake)."""


def shown(value: Any) -> str:
    """``value`` as text safe on a terminal: control characters (and any
    other unprintable ones) escaped as ``\\x1b``, ``\\n``... Printable text,
    including non-ASCII letters, is unchanged."""
    s = "" if value is None else str(value)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)


def when(ms: int | float | None) -> str:
    """Epoch milliseconds as local date and time with milliseconds
    (``2026-12-05 11:20:03.412``); ``-`` for none."""
    if not ms:
        return "-"
    t = dt.datetime.fromtimestamp(ms / 1000)
    return t.strftime("%Y-%m-%d %H:%M:%S") + f".{int(ms) % 1000:03d}"


def age(ms: int | float | None, now: float | None = None) -> str:
    """How long ago (or ahead) epoch milliseconds are: ``42s``, ``17m``,
    ``3.5h``, ``2.0d``; ``in 5s`` for a time ahead."""
    if not ms:
        return "-"
    s = (time.time() if now is None else now) - ms / 1000
    ahead = s < 0
    s = abs(s)
    text = (f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h" if s < 172800
            else f"{s / 86400:.1f}d")
    return f"in {text}" if ahead else text


def is_time_key(key: str) -> bool:
    """A field holding epoch milliseconds (``created_ms``, ``since_ms``...)
    rather than a duration (``took_ms``, ``timeout_ms``...)."""
    return key.endswith("_ms") and not key.endswith(("took_ms", "timeout_ms", "interval_ms", "mean_ms", "wait_ms",
                                                     "lag_ms", "age_ms", "delay_ms"))


def check_count(value: int | float | None, option: str, lo: float = 1, hi: float = MAX_LIMIT) -> Any:
    """``value`` of ``option`` if it is within lo..hi (None passes: not
    given). Raises CountError naming the option, the value and the range."""
    if value is None or lo <= value <= hi:
        return value
    raise CountError(f"{option} {_number(value)} is outside {_number(lo)}..{_number(hi)}")


def _number(x: float) -> str:
    """42, 0.5, 31536000: as written, without an exponent or a needless .0."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))
