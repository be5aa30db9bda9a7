"""How the commands show values to a person: text that came from another
organization (an AppKey, a user name, a reason) with its control
characters escaped, so it cannot move the cursor or rewrite a terminal
line; epoch milliseconds as local date and time; counts checked against
their range with one line naming the value and the range. ``--json``
output keeps the raw values; states and steps are shown in plain words
with their code in parentheses (``PLAIN``: ``stored at the platform
(SS_ACK)``), where ``--json`` keeps the code alone."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any, Final

__all__ = ["MAX_LIMIT", "PLAIN", "CountError", "age", "check_count", "counts_shown", "is_time_key", "plain", "shown", "when"]

MAX_LIMIT: Final = 10_000  # rows one list command shows (and one admin list/stuck answer holds)


#: What the codes of states and steps mean, in the words a person reads
#: (``plain``). One table for every command that shows them: ``node``, a
#: node's documents on their way out (semq.node.engine.SendState); ``ack``,
#: its received ones' acknowledgements (AckStatus); ``platform``, the
#: platform's stored copies (semq.platform.engine.StoredState); ``step``,
#: the steps of the delivery history (semq.analytics.events.EVENTS_BY_ROLE).
PLAIN: Final[dict[str, dict[str, str]]] = {
    "node": {
        "SS_INIT": "waiting to be sent",
        "SS_SENT": "sent, not acknowledged yet",
        "SS_ACK_FWD": "forwarded to the target by the platform",
        "SS_ACK": "stored at the platform",
        "SS_ACK2": "confirmed by the receiver",
        "SS_FAILED": "failed",
    },
    "ack": {"AS_INIT": "not acknowledged yet", "AS_ACK": "acknowledged"},
    "platform": {
        "SS_INIT": "stored, not delivered yet",
        "SS_SENT": "delivered, its acknowledgement outstanding",
        "SS_ACK": "acknowledged by the target",
    },
    "step": {
        # the origin's
        "queued": "accepted", "sent": "sent", "ack_fwd": "forwarded by the platform",
        "ack_save": "stored at the platform", "nack": "refused", "inquiry": "asked about",
        "resend": "to be sent again", "ack2": "confirmed by the receiver", "cleaned": "cleaned up",
        "expired": "expired", "dead": "given up (a dead letter)", "bad_receipt": "receipt did not verify",
        "bad_refusal": "refusal did not verify", "large_sent": "large document sent",
        # the platform's
        "received": "received", "forwarded": "forwarded", "stored": "stored", "dropped": "dropped",
        "refused": "refused", "delivered": "delivered", "acked": "acknowledged by the target",
        "node_online": "came online", "node_offline": "went offline",
        # the receiver's
        "duplicate": "a duplicate, dropped", "inbox": "in the inbox", "ack2_sent": "confirmation sent",
        "reack": "acknowledged again", "reack2": "confirmation sent again",
        "held": "held for an earlier one (ordered channel)", "gap_dropped": "announced as a gap (ordered channel)",
        "large_started": "large document begun", "bad_chunk": "a bad chunk", "large_complete": "large document whole",
    },
}


def counts_shown(counts: dict[str, int], kind: str = "node") -> str:
    """``{"SS_INIT": 3}`` as ``3 waiting to be sent (SS_INIT)``, comma-separated;
    ``empty`` for none."""
    return ", ".join(f"{n} {plain(code, kind)}" for code, n in counts.items()) or "empty"


def plain(code: str | None, kind: str = "node") -> str:
    """``code`` (a state or a step of ``kind``: PLAIN) for a person:
    ``stored at the platform (SS_ACK)``; a code the table does not know,
    as it is."""
    if not code:
        return "-"
    words = PLAIN[kind].get(code)
    return f"{words} ({code})" if words else shown(code)


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
