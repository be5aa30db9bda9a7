"""The node console's Outbox page: the documents this node sends, from
every unit's pending-send table (the admin ``list`` command, as ``semq
admin list``), filtered by state, target, age and an LK0, record id or
AppKey key; and the documents confirmed lately, from the delivery history.

The actions are the console's own (``/action/{name}``: a dry run on a
confirmation page first, then the admin ``resend`` / ``requeue`` /
``purge`` commands, audited), offered per row only where the state allows
them (semq.node.engine.OPERATOR_TABLE). A confirmed document has arrived:
it is offered no action, and the page says how to send a new copy.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from semq.identity.security import waiting_reason
from semq.node.engine import OPERATOR_TABLE, OperatorAction, SendState
from semq.ops.admin import AdminCommandError, AdminError
from semq.umxt_protocol import ResultCode

from .backend import ActionError, ConsoleBackend, now_ms, parse_lk0
from .sessions import Session

__all__ = ["STATE_WORDS", "ConsoleHost", "age_text", "allowed", "outbox_routes", "parse_age", "state_words"]

class ConsoleHost(Protocol):
    """What a page module needs of the console's handlers (semq.web.app):
    the backend, the templates' environment, rendering, the session check."""

    backend: ConsoleBackend
    env: Any  # jinja2.Environment

    def render(self, request: Request, name: str, status: int = 200, session: Session | None = None,
               **ctx: Any) -> Response: ...

    def page(self, fn: Callable[[Request, Session], Awaitable[Response]]
             ) -> Callable[[Request], Awaitable[Response]]: ...


LIMIT: Final = 200  # pending rows per unit on one page
CONFIRMED_LIMIT: Final = 50  # confirmed documents shown
CONFIRMED: Final = "confirmed"  # the state filter's value for the history's confirmed documents (ack2)

#: The pending-send states in plain words, the code after them.
STATE_WORDS: Final = {
    "SS_INIT": "not sent yet",
    "SS_SENT": "sent, the platform's ack missing",
    "SS_ACK_FWD": "forwarded to the partner, not confirmed yet",
    "SS_ACK": "stored at the platform",
    "SS_ACK2": "confirmed",
    "SS_FAILED": "failed",
}
_MAX_ID: Final = 2**63 - 1  # a record id (SQLite's INTEGER): a larger one names no row
_AGE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?\s*$")
_UNIT_S: Final = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_ACTIONS: Final = {"resend": OperatorAction.RESEND, "requeue": OperatorAction.REQUEUE,
                   "purge": OperatorAction.PURGE}


def state_words(state: str) -> str:
    """``stored at the platform (SS_ACK)``."""
    words = STATE_WORDS.get(state)
    return f"{words} ({state})" if words else state


def parse_age(text: str) -> float | None:
    """An age as the operator types it (``90``, ``90s``, ``10m``, ``2h``,
    ``1d``) in seconds; None when empty. ActionError otherwise."""
    if not text.strip():
        return None
    m = _AGE.match(text.lower())
    if not m:
        raise ActionError(f"age {text.strip()!r} is not a number of seconds, or a number with s, m, h or d")
    return float(m.group(1)) * _UNIT_S[m.group(2) or "s"]


def allowed(state: str) -> list[str]:
    """The actions a pending-send row in ``state`` takes (OPERATOR_TABLE).
    None for a confirmed one (SS_ACK2): it has arrived, and the console
    offers no action on it (the table lets the store's cleanup purge it)."""
    try:
        s = SendState[state]
    except KeyError:
        return []
    if s is SendState.SS_ACK2:
        return []
    return [name for name, a in _ACTIONS.items() if (s, a) in OPERATOR_TABLE]


def reason(state: str, target: str, code: int) -> str:
    """Why a row waits or failed, from its result code: ``waiting for a
    certificate of 56001: ...``, ``refused: UNKNOWN_TARGET (300)``."""
    if state == "SS_INIT":
        return waiting_reason(target, code)
    if state == "SS_FAILED" and code:
        try:
            return f"{ResultCode(code).name} ({code})"
        except ValueError:
            return f"result code {code}"
    return ""


def _state(text: str) -> str:
    """A state as typed: ``SS_SENT``, ``sent``, ``ack2`` or ``confirmed``."""
    t = text.strip()
    if t.lower() in (CONFIRMED, "ack2", "ss_ack2"):
        return CONFIRMED
    if not t:
        return ""
    up = t.upper()
    for name in (up, f"SS_{up}"):
        if name in STATE_WORDS:
            return name
    return t  # (refused by check, as typed)


#: The actions offered on a document's page, by the origin's state in the
#: delivery history (its events, docs/events.md): what the pending-send
#: state it stands for takes. The dry run still decides from the row itself.
_BY_HISTORY: Final = {
    "queued": ["purge"], "resend": ["purge"],
    "sent": ["resend", "purge"], "ack_fwd": ["resend", "purge"], "ack_save": ["resend", "purge"],
    "bad_receipt": ["resend", "purge"],
    "nack": ["requeue", "purge"], "expired": ["requeue", "purge"], "dead": ["requeue", "purge"],
    "ack2": [],
}


def origin_actions(history_state: str) -> list[str]:
    """What a document of this node in ``history_state`` is offered (every
    action for a state this version does not know: the dry run says)."""
    return list(_BY_HISTORY.get(history_state, ["resend", "requeue", "purge"]))


@dataclass(frozen=True)
class OutboxQuery:
    """The page's filters, as the form sent them."""

    state: str = ""
    target: str = ""
    age: str = ""
    text: str = ""

    @classmethod
    def of(cls, request: Request) -> OutboxQuery:
        q = request.query_params
        return cls(state=_state(q.get("state", "")), target=q.get("target", "").strip()[:64],
                   age=q.get("age", "").strip()[:16], text=q.get("text", "").strip()[:200])

    def check(self) -> float | None:
        """The age in seconds; ActionError on a state or target that cannot be."""
        if self.state and self.state != CONFIRMED and self.state not in STATE_WORDS:
            words = [s for s in STATE_WORDS if s != "SS_ACK2"]
            raise ActionError(f"state {self.state!r} is not one of {', '.join([*words, CONFIRMED])}")
        if self.target and not self.target.isdigit():
            raise ActionError(f"target {self.target!r} is not an organization's number")
        return parse_age(self.age)


class OutboxPages:
    """The Outbox page over the console's handlers (rendering, sessions,
    the backend)."""

    def __init__(self, h: ConsoleHost) -> None:
        self.h = h
        self.backend = h.backend

    async def _ids_by_unit(self, text: str) -> dict[int, list[int]] | None:
        """The pending-send rows ``text`` names, per unit: an LK0 of this
        node, a record id (on every unit), or an AppKey key or its start
        (found in the delivery history). None: no text given."""
        if not text:
            return None
        b = self.backend
        if text.count("/") == 3:
            org, unit, _db, rid = parse_lk0(text)
            if org != b.ident:
                raise ActionError(f"LK0 {text} is a document of {org}: this node's outbox holds {b.ident}'s")
            return {unit: [rid]} if 1 <= unit <= b.units and 0 < rid <= _MAX_ID else {}
        if text.isdigit():
            return {k: [int(text)] for k in range(1, b.units + 1)} if 0 < int(text) <= _MAX_ID else {}
        found = await b.search(text=text, role="origin", limit=LIMIT)
        out: dict[int, list[int]] = {}
        for r in found:
            org, unit, _db, rid = parse_lk0(r["lk0"])
            if org == b.ident and r.get("state") != "ack2":
                out.setdefault(unit, []).append(rid)
        return out

    async def pending(self, q: OutboxQuery, older: float | None) -> tuple[list[dict[str, Any]], bool, list[str]]:
        """The pending-send rows of every unit (oldest first), whether a
        unit had more than LIMIT, and the units that did not answer."""
        base: dict[str, Any] = {"table": "outbox", "limit": LIMIT}
        if q.state:
            base["state"] = q.state
        if q.target:
            base["target"] = q.target
        if older is not None:
            base["older_than"] = older
        ids = await self._ids_by_unit(q.text)
        units = range(1, self.backend.units + 1) if ids is None else sorted(ids)
        rows: list[dict[str, Any]] = []
        more = False
        errors: list[str] = []
        for k in units:
            args = base if ids is None else {**base, "ids": ids[k]}
            try:
                got = await self.backend.call_unit(k, "list", args)
            except (AdminError, AdminCommandError, OSError) as e:  # (that unit does not answer)
                errors.append(f"unit {k}: {e}")
                continue
            more = more or len(got.get("rows") or []) >= LIMIT
            for r in got.get("rows") or []:
                if r["state"] == "SS_ACK2":
                    continue  # (confirmed, its row not yet cleaned up: listed with the confirmed ones)
                r["unit"] = k
                r["words"] = state_words(r["state"])
                r["reason"] = reason(r["state"], r["target"], r["code"])
                r["allowed"] = allowed(r["state"])
                rows.append(r)
        rows.sort(key=lambda r: (r["created_ms"], r["lk0"]))
        return rows, more, errors

    async def confirmed(self, q: OutboxQuery, older: float | None) -> list[dict[str, Any]]:
        """This node's documents confirmed by their receivers (ack2), newest first."""
        if q.text.isdigit():
            return []
        text = q.text or None
        rows = await self.backend.search(text=text, role="origin", state="ack2", counterpart=q.target or None,
                                         until_ms=None if older is None else now_ms() - int(older * 1000),
                                         limit=CONFIRMED_LIMIT)
        return [r for r in rows if r.get("source") in (None, self.backend.ident)]

    async def page(self, request: Request, s: Session) -> Response:
        if self.backend.role != "node":
            return self.h.render(request, "error.html", 404, s, message="The outbox is a node's page.")
        q = OutboxQuery.of(request)
        older = q.check()
        rows: list[dict[str, Any]] = []
        more, errors = False, list[str]()
        if q.state != CONFIRMED:
            rows, more, errors = await self.pending(q, older)
        confirmed = await self.confirmed(q, older) if q.state in ("", CONFIRMED) else []
        return self.h.render(request, "outbox.html", session=s, q=q, rows=rows, more=more, errors=errors,
                             confirmed=confirmed, states=STATE_WORDS, limit=LIMIT, now=now_ms(),
                             confirmed_limit=CONFIRMED_LIMIT, older=older)


def age_text(ms: Any, now: int) -> str:
    """How long ago ``ms`` was: ``45 s``, ``12 min``, ``3.5 h``, ``2.0 d``."""
    if not ms:
        return ""
    s = max(0.0, (now - int(ms)) / 1000)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h" if s < 172800 else f"{s / 86400:.1f} d"


def outbox_routes(h: ConsoleHost) -> list[Route]:
    h.env.filters["age"] = age_text
    h.env.globals["origin_actions"] = origin_actions
    pages = OutboxPages(h)
    return [Route("/outbox", h.page(pages.page))]
