"""Where a document is and why it waits, in one line, with what the
operator can do: the "why" of ``semq track``, ``semq admin show`` and the
console's document page (docs/operations.md, "Why a document waits").

One pure function, ``why``, decides it from what is known of the
document (its row's state and code, or that an ordered channel holds it),
of its partner (what the platform last said: ``Presence``) and of the
daemon (``DaemonView``); the words and the action of each reason are one
table, ``REASONS``. Sans-IO: the admin handlers gather the inputs.

The answer (JSON, the ``why`` of show and track):
``{"where": str, "reason": str, "since_ms": int | None, "action": str,
"code": str}``; None when the document is confirmed (or delivered to an
application here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from semq.identity.security import WAITING_CODES
from semq.umxt_protocol import ResultCode

from .display import age, shown, when

__all__ = ["REASONS", "DaemonView", "Doc", "Presence", "Reason", "why", "why_line"]


class Reason(NamedTuple):
    where: str  # where the document is ({target}, {origin} filled in)
    reason: str  # why it waits ({...} filled in from the facts)
    action: str  # what the operator can do


#: Every reason a document waits, by name: where it is, why, and what to do.
#: The names are the ``code`` of the answer (and of docs/operations.md's runbook).
REASONS: Final[dict[str, Reason]] = {
    "daemon_stopped": Reason(
        "in this node's outbox", "the node's daemon is not running, so nothing is sent or asked",
        "start it: semq node run (or systemctl start semq-node-ORG)"),
    "platform_unreachable": Reason(
        "in this node's outbox, not sent (SS_INIT)", "the platform is unreachable{since}",
        "check the network and the platform's address (semq status); it goes by itself once the node reconnects"),
    "certificate_unknown": Reason(
        "in this node's outbox, not sent (SS_INIT)", "{detail}",
        "{cert_action}"),
    "over_quota": Reason(
        "in this node's outbox, not sent (SS_INIT)",
        "the platform's storage quota for our documents is used up (QUOTA_EXCEEDED)",
        "none here: it goes again by itself; the platform's operator can raise the quota, or {target}"
        " can come online and take what waits for it"),
    "window_full": Reason(
        "in this node's outbox, not sent (SS_INIT)", "the send window is full ({in_flight} in flight of {window})",
        "none: it leaves as the platform acknowledges the ones before it; if it stays, see semq admin"
        " status"),
    "queued": Reason(
        "in this node's outbox, not sent (SS_INIT)", "queued behind other documents",
        "none: it leaves within seconds; if not, see semq admin status"),
    "platform_ack_missing": Reason(
        "sent to the platform (SS_SENT)", "the platform's acknowledgement has not come{lost}",
        "none: the platform is asked at the next inquiry and it is sent again if it has not got it"),
    "partner_offline": Reason(
        "stored at the platform (SS_ACK)", "{target} is offline {offline_since}",
        "none here: the platform delivers it when {target} connects; {target}'s operator can start"
        " its node"),
    "partner_online_unconfirmed": Reason(
        "stored at the platform (SS_ACK)",
        "{target} is online since {online_since}, but has not confirmed it (ACK2) yet",
        "wait for the next inquiry; semq admin resend {id} sends it again (the receiver keeps one copy)"),
    "stored_presence_unknown": Reason(
        "stored at the platform (SS_ACK)", "waits for {target} (whether it is online is not known{asked})",
        "semq partners asks the platform; the platform delivers it when {target} connects"),
    "forwarded_unconfirmed": Reason(
        "forwarded to {target} (SS_ACK_FWD)", "{target}'s delivery confirmation (ACK2) has not come{partner}",
        "none: {target} is asked at the next inquiry; semq admin resend {id} sends it again"),
    "failed": Reason(
        "failed here (SS_FAILED)", "{detail}",
        "semq admin requeue {id} sends it again once the cause is gone; semq dead lists the dead letters"),
    "held_ordered": Reason(
        "received here, held back (ordered channel {channel})",
        "held behind its ordered predecessor {waits_for} of {origin}, which has not arrived",
        "none here: it is handed over when {waits_for} arrives; if that document failed at"
        " {origin}, {origin}'s operator sends it again or gives it up (its gap notice releases this one)"),
}

_CERT_ACTION: Final = {
    int(ResultCode.CERT_NOT_TRUSTED): "compare the fingerprints with {target}'s operator, then semq node trust"
                                      " {target} FINGERPRINT",
    int(ResultCode.CERT_REVOKED): "{target}'s operator enrolls a new certificate; the document goes then",
    int(ResultCode.AUTH_FAILED): "{target}'s operator renews its certificate; the document goes then",
}
_CERT_DEFAULT: Final = ("{target} has no certificate at the platform yet: its operator enrolls its node"
                        " (semq platform enroll); the document goes then by itself")


@dataclass(frozen=True, slots=True)
class Presence:
    """What the platform last said of the partner (None fields: not told)."""

    online: bool | None = None
    since_ms: int | None = None
    told_ms: int | None = None


@dataclass(frozen=True, slots=True)
class DaemonView:
    """What the daemon knows that bears on a document (running: False when
    the question is asked without a daemon)."""

    running: bool = True
    connected: bool = True
    disconnected_ms: int | None = None
    in_flight: int = 0
    window: int = 0
    over_quota: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Doc:
    """One of our documents (a pending-send row), or one received here
    that an ordered channel holds (``held`` set)."""

    id: int = 0
    target: str = ""
    state: str = ""  # SendState name
    code: int = 0
    state_ms: int | None = None
    sent_ms: int | None = None
    created_ms: int | None = None
    attempts: int = 0
    held: dict[str, Any] | None = field(default=None)  # origin, channel, waits_for, since_ms

    @classmethod
    def of_row(cls, row: dict[str, Any]) -> Doc:
        """From an admin show/list row (semq.ops.handlers.node)."""
        return cls(id=int(row["id"]), target=str(row["target"]), state=str(row["state"]),
                   code=int(row.get("code") or 0), state_ms=row.get("state_ms"), sent_ms=row.get("sent_ms"),
                   created_ms=row.get("created_ms"), attempts=int(row.get("attempts") or 0))


def _decide(doc: Doc, partner: Presence, daemon: DaemonView) -> tuple[str, int | None] | None:
    """The reason's name and since when, or None: nothing waits."""
    if doc.held is not None:
        return "held_ordered", doc.held.get("since_ms")
    s = doc.state
    if s in ("SS_ACK2", "") or s.isdigit():
        return None
    if s == "SS_FAILED":
        return "failed", doc.state_ms
    if not daemon.running:
        return "daemon_stopped", None
    if s == "SS_INIT":
        if doc.code in WAITING_CODES:
            return "certificate_unknown", doc.state_ms
        if not daemon.connected:
            return "platform_unreachable", daemon.disconnected_ms
        if doc.target in daemon.over_quota:
            return "over_quota", doc.state_ms
        if daemon.window and daemon.in_flight >= daemon.window:
            return "window_full", None
        return "queued", doc.created_ms
    if s == "SS_SENT":
        return "platform_ack_missing", doc.sent_ms
    if s == "SS_ACK":
        if partner.online is False:
            return "partner_offline", partner.since_ms
        if partner.online is True:
            return "partner_online_unconfirmed", doc.state_ms
        return "stored_presence_unknown", doc.state_ms
    if s == "SS_ACK_FWD":
        return "forwarded_unconfirmed", doc.state_ms
    return None


def _at(ms: int | None) -> str:
    return f"{when(ms)[:19]} ({age(ms)} ago)" if ms else "an unknown time"


def why(doc: Doc, partner: Presence | None = None, daemon: DaemonView | None = None) -> dict[str, Any] | None:
    """Where ``doc`` is, why it waits and what to do (module docstring);
    None when nothing waits."""
    partner = partner or Presence()
    daemon = daemon or DaemonView()
    decided = _decide(doc, partner, daemon)
    if decided is None:
        return None
    code, since = decided
    r = REASONS[code]
    held = doc.held or {}
    cert_code = doc.code if doc.code in WAITING_CODES else int(ResultCode.UNKNOWN_CERTIFICATE)
    try:
        code_name = ResultCode(doc.code).name if doc.code else ""
    except ValueError:
        code_name = str(doc.code)
    facts: dict[str, Any] = {
        "id": doc.id, "target": doc.target or "the target",
        "since": f" since {_at(since)}" if since else "",
        "lost": f" (sent {_at(doc.sent_ms)})" if doc.sent_ms else "",
        "offline_since": (f"since {_at(partner.since_ms)}" if partner.since_ms
                          else "(the platform has never seen it connected)")
        + (f", as the platform said {age(partner.told_ms)} ago" if partner.told_ms else ""),
        "online_since": _at(partner.since_ms),
        "asked": "" if partner.told_ms else ": the platform was not asked yet",
        "partner": (f"; {doc.target} is offline since {_at(partner.since_ms)}" if partner.online is False
                    else ""),
        "in_flight": daemon.in_flight, "window": daemon.window,
        "detail": (f"waiting for a certificate of {doc.target}: {code_name}"
                   f" ({WAITING_CODES[cert_code]})" if code == "certificate_unknown"
                   else f"gave up: {code_name or 'no code'}" + (f" after {doc.attempts} attempts"
                                                                  if doc.attempts > 1 else "")),
        "cert_action": _CERT_ACTION.get(cert_code, _CERT_DEFAULT).format(target=doc.target or "the target"),
        "channel": held.get("channel", ""), "waits_for": held.get("waits_for", ""),
        "origin": held.get("origin", ""),
    }

    def fill(text: str) -> str:
        # One pass: a value (a channel's name comes from another
        # organization) is inserted as text, never read as a template.
        return text.format(**facts)

    return {"where": fill(r.where), "reason": fill(r.reason), "since_ms": since, "action": fill(r.action),
            "code": code}


def why_line(w: dict[str, Any] | None) -> str:
    """The one line a person reads: ``where: reason — action``."""
    if w is None:
        return "why: nothing waits (confirmed, or delivered to the application)"
    return shown(f"why: {w['where']}: {w['reason']}. What to do: {w['action']}")
