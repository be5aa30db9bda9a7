"""A node's partners and the "why" of its documents, for every surface
that shows them: ``semq partners``, the console's partners page and
document page, the HTTP API (they all call the admin requests built here,
``partners`` and ``why``).

A partner ("counterpart") is an organization this node exchanges
documents with, known from any of:

- ``outbox``: it has documents of ours in the outbox, in any state (also
  failed ones, until they are cleaned);
- ``inbox``: it sent us documents still remembered (the inbox's rows, or
  the duplicate-suppression table's: 30 days), or its ordered channels
  hold documents back here;
- ``pins``: a certificate of it is pinned here (we sealed to it or
  verified it once);
- ``direct``: a direct link to or from it, or one tried.

Whether it is online comes from the platform only (PRESENCE_QUERY,
semq.node.daemon.presence), asked when the request comes (at most once
every 2 s) and answered from what the platform said last otherwise; the
node never guesses it from its own documents.

``partners`` answers (JSON)::

    {"partners": [{"org": str, "online": bool | None, "since_ms": int | None,
                   "last_seen_ms": int | None, "told_ms": int | None,
                   "backlog_out": int, "backlog_in": int,
                   "oldest_waiting_ms": int | None, "cert_expires_ms": int | None,
                   "link": str, "link_detail": str | None, "known_from": [str]}],
     "asked_ms": int, "connected": bool, "more": int}

``org`` is the organization id as text (ids may be more than digits);
``connected`` whether the node has a platform session now; ``more`` the
partners beyond MAX_PARTNERS not listed;
``oldest_waiting_ms`` the acceptance time (epoch ms) of its oldest
document not yet confirmed; ``told_ms`` when the platform said what
``online`` says; ``link`` one of none, off, up, connecting, down,
refused, not offered."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final, NamedTuple

import trio

from semq.node.engine import SendState
from semq.node.origin.outbox import OutboxFilter
from semq.node.receiver.inbox import received_by_origin
from semq.store.db import open_read_only
from semq.tracking.events import now_ms
from semq.umxt_protocol import LK0, LocalProtocolError, PresenceState

from .admin import AdminCommandError, Handler
from .why import DaemonView, Doc, Presence, why

__all__ = ["LINK_STATES", "MAX_PARTNERS", "ask_partners", "ask_why", "daemon_view", "link_state", "merge_partners",
           "partner_handlers", "presence_of"]

MAX_PARTNERS: Final = 1000  # partners one answer lists (those with documents waiting first)
LINK_STATES: Final = ("none", "off", "up", "connecting", "down", "refused", "not offered")
#: Not yet confirmed end to end: what "waiting to reach it" counts.
_OPEN: Final = frozenset(int(s) for s in (SendState.SS_INIT, SendState.SS_SENT, SendState.SS_ACK_FWD,
                                          SendState.SS_ACK))


def link_state(direct: dict[str, Any] | None, org: str) -> tuple[str, str | None]:
    """The direct link's state with ``org`` and why, from the daemon's
    direct-links snapshot (semq.node.daemon.direct.DirectLinks.snapshot)."""
    if not direct or direct.get("policy") == "never":
        return "off", None
    links = [link for link in direct.get("links") or [] if link.get("peer") == org]
    if any(link.get("state") == "up" for link in links):
        return "up", None
    waiting = (direct.get("waiting") or {}).get(org)
    if waiting is not None:
        text = str(waiting.get("why") or "")
        if "does not accept" in text:
            return "refused", text
        if "does not listen" in text:
            return "not offered", text
        return "down", text
    if any(link.get("state") == "connecting" for link in links):
        return "connecting", None
    if links:
        return "down", str(links[0].get("error") or "") or None
    return "none", None


def presence_of(daemon: Any, org: str) -> Presence:
    """What the platform last said of ``org`` (semq.ops.why.Presence)."""
    book = getattr(daemon, "presence", None)
    seen = book.of(org) if book is not None else None
    if seen is None or seen.state is PresenceState.UNKNOWN:
        return Presence(told_ms=None if seen is None else seen.told_ms)
    return Presence(online=seen.state is PresenceState.ONLINE, since_ms=seen.since_ms, told_ms=seen.told_ms)


def daemon_view(daemon: Any) -> DaemonView:
    """What the daemon knows that bears on a document (semq.ops.why)."""
    now = _now()
    quota = getattr(daemon, "over_quota", None) or {}
    return DaemonView(running=True, connected=bool(daemon.connected),
                      disconnected_ms=getattr(daemon, "disconnected_ms", None), in_flight=int(daemon.in_flight),
                      window=int(getattr(daemon, "window", 0) or 0),
                      over_quota=frozenset(t for t, (until, _) in quota.items() if until > now))


def _now() -> float:
    try:
        return trio.current_time()
    except RuntimeError:  # (outside trio)
        return 0.0


def _expiry(sec: Any, org: str) -> int | None:
    """When the newest certificate held for ``org`` expires (epoch ms): a
    usable one's, else the one kept on disk (certs/ORG.pem: it may have
    expired, which is worth seeing); None when none is held."""
    if sec is None:
        return None
    certs = sec.certs(org)
    if certs:
        latest: dt.datetime = max(c.not_after for c in certs)
        return int(latest.timestamp() * 1000)
    from cryptography import x509

    try:
        kept = x509.load_pem_x509_certificates((Path(sec.ndir) / "certs" / f"{org}.pem").read_bytes())
    except (OSError, ValueError):
        return None
    return int(max(c.not_valid_after_utc for c in kept).timestamp() * 1000) if kept else None


def _received(path: Path) -> dict[str, tuple[int, int | None]]:
    """In a worker thread, on a read-only connection of its own: who sent us
    documents, and how many of each no application has read (a scan of the
    unread ones: kept off the store thread, which the documents need)."""
    conn, _version = open_read_only(path, "node store")
    try:
        return received_by_origin(conn)
    finally:
        conn.close()


def _gather(core: Any, extra: Iterable[str], received: dict[str, tuple[int, int | None]]) -> dict[str, dict[str, Any]]:
    """On the store thread: every partner with its backlogs and certificate."""
    me = core.me.node_id
    out: dict[str, dict[str, Any]] = {}

    def entry(org: str, source: str) -> dict[str, Any]:
        e = out.get(org)
        if e is None:
            e = out[org] = {"org": org, "backlog_out": 0, "backlog_in": 0, "oldest_waiting_ms": None,
                            "known_from": []}
        if source not in e["known_from"]:
            e["known_from"].append(source)
        return e

    for target, state, n, oldest in core.outbox.depth():
        e = entry(target, "outbox")
        if state in _OPEN:
            e["backlog_out"] += n
            if e["oldest_waiting_ms"] is None or oldest < e["oldest_waiting_ms"]:
                e["oldest_waiting_ms"] = oldest
    for origin, (unread, _first) in received.items():
        entry(origin, "inbox")["backlog_in"] += unread
    for origin, held in core.receiver.channels.held_by_origin().items():
        entry(origin, "inbox")["backlog_in"] += held
    sec = core.sec
    if sec is not None:
        for org in sec.pins.orgs():
            entry(org, "pins")
    for org in extra:
        entry(org, "direct")
    out.pop(me, None)  # documents to our own users are not a partner's
    for org, e in out.items():
        e["cert_expires_ms"] = _expiry(sec, org)
    return out


def _edge_partners(core: Any) -> list[dict[str, Any]]:
    """The AS2 / AS4 partners (semq.edge.store), as rows of the same table:
    their protocol and URL where the platform's presence and the link go, the
    last exchange as "last seen"."""
    from semq.edge.store import EdgeStore

    return [{"org": f"{f.partner.protocol}:{f.partner.id}", "online": None, "since_ms": None,
             "last_seen_ms": f.last_ms, "told_ms": None, "backlog_out": f.backlog, "backlog_in": 0,
             "oldest_waiting_ms": None, "cert_expires_ms": _pem_expiry(f.partner.their_cert_pem),
             "link": f.partner.protocol, "link_detail": f.partner.url, "known_from": ["edge"],
             "protocol": f.partner.protocol, "url": f.partner.url, "confirmed": f.confirmed, "failed": f.failed,
             "received": f.received} for f in EdgeStore(core).facts()]


def _pem_expiry(pem: bytes) -> int | None:
    from cryptography import x509

    try:
        return int(x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp() * 1000)
    except ValueError:
        return None


def partner_handlers(daemon: Any, core: Any) -> dict[str, Handler]:
    """The admin requests ``partners`` and ``why`` of a running node
    (module docstring; ``daemon`` a semq.node.daemon.NodeDaemon)."""

    async def partners(args: dict[str, Any]) -> dict[str, Any]:
        direct = daemon.links.snapshot()
        linked = {str(link.get("peer")) for link in direct.get("links") or []} | set(direct.get("waiting") or {})
        received = await trio.to_thread.run_sync(_received, Path(core.path))
        found = await daemon.gate.run(_gather, core, linked, received)
        # Ask the platform about the ones with documents waiting first.
        order = sorted(found.values(), key=lambda e: (-(e["backlog_out"] + e["backlog_in"]), e["org"]))
        await daemon.presence.ask([e["org"] for e in order], daemon.ask_presence)
        rows = []
        for e in order[:MAX_PARTNERS]:
            seen = daemon.presence.of(e["org"])
            known = seen is not None and seen.state is not PresenceState.UNKNOWN
            link, detail = link_state(direct, e["org"])
            rows.append({
                "org": e["org"],
                "online": (seen.state is PresenceState.ONLINE) if known and seen is not None else None,
                "since_ms": seen.since_ms if known and seen is not None else None,
                "last_seen_ms": seen.last_seen_ms if known and seen is not None else None,
                "told_ms": seen.told_ms if seen is not None else None,
                "backlog_out": e["backlog_out"], "backlog_in": e["backlog_in"],
                "oldest_waiting_ms": e["oldest_waiting_ms"], "cert_expires_ms": e["cert_expires_ms"],
                "link": link, "link_detail": detail, "known_from": e["known_from"],
            })
        rows += await daemon.gate.run(_edge_partners, core)
        return {"partners": rows, "asked_ms": now_ms(), "connected": bool(daemon.connected),
                "more": max(0, len(order) - MAX_PARTNERS)}

    async def why_(args: dict[str, Any]) -> dict[str, Any]:
        """Where the document ``lk0`` is and why it waits: one of ours (its
        pending-send row), or one received here that an ordered channel
        holds. ``{"lk0", "found": bool, "why": ... | None}``."""
        text = str(args.get("lk0") or "")
        try:
            lk0 = LK0.parse(text)
        except (ValueError, LocalProtocolError) as e:
            raise AdminCommandError(f"LK0 {text!r} is not NODE/SEMQ_ID/DB_ID/RECORD_ID: {e}") from None
        ours = lk0.endpoint.node_id == core.me.node_id
        found = await daemon.gate.run(_find, core, lk0, ours)
        if found is None:
            return {"lk0": text, "found": False, "why": None}
        doc: Doc = found
        partner = Presence()
        if ours:
            if doc.state in ("SS_ACK", "SS_ACK_FWD"):
                await daemon.presence.ask([doc.target], daemon.ask_presence, timeout=1.0)
            partner = presence_of(daemon, doc.target)
        return {"lk0": text, "found": True, "why": why(doc, partner, daemon_view(daemon))}

    return {"partners": partners, "why": why_}


def _find(core: Any, lk0: LK0, ours: bool) -> Doc | None:
    """On the store thread: the document ``lk0`` as semq.ops.why.Doc, or None."""
    if ours:
        if lk0.semq_id != core.unit:
            return None
        rows = core.outbox.rows(_WhyRow, OutboxFilter(ids=(lk0.record_id,)))
        if not rows:
            return None
        r = rows[0]
        return Doc(id=r.id, target=r.target_id, state=_state_name(r.state), code=r.code, state_ms=r.state_ms,
                   sent_ms=r.sent_ms, created_ms=r.created_ms, attempts=r.attempts)
    origin = lk0.endpoint.node_id
    channel = core.receiver.channels.held_channel(origin, lk0.semq_id, lk0.semq_db_id, lk0.record_id)
    if channel is None:
        return None
    wait = next((w for w in core.waiting_channels() if w.origin == origin and w.channel == channel), None)
    return Doc(held={"origin": origin, "channel": channel, "waits_for": wait.lk0 if wait else "an earlier document",
                     "since_ms": wait.since_ms if wait else None})


def _state_name(v: int) -> str:
    try:
        return SendState(v).name
    except ValueError:
        return str(v)


class _WhyRow(NamedTuple):
    """The pending-send columns the "why" reads (a named row: semq.node.rows.columns)."""

    id: int
    target_id: str
    state: int
    code: int
    state_ms: int | None
    sent_ms: int | None
    created_ms: int
    attempts: int


# ---------------------------------------------------------------- clients (the command, the console, the API)


def merge_partners(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """Several units' ``partners`` answers as one node's: backlogs added
    up, the oldest document the earliest, what the platform said the
    newest told, a link up if any unit's is."""
    if len(answers) == 1:
        return answers[0]
    rank = {s: i for i, s in enumerate(("up", "connecting", "down", "refused", "not offered", "none", "off"))}
    by_org: dict[str, dict[str, Any]] = {}
    for a in answers:
        for p in a.get("partners") or []:
            m = by_org.get(p["org"])
            if m is None:
                by_org[p["org"]] = dict(p, known_from=list(p.get("known_from") or []))
                continue
            m["backlog_out"] += p["backlog_out"]
            m["backlog_in"] += p["backlog_in"]
            olds = [x for x in (m["oldest_waiting_ms"], p["oldest_waiting_ms"]) if x is not None]
            m["oldest_waiting_ms"] = min(olds) if olds else None
            if (p.get("told_ms") or 0) > (m.get("told_ms") or 0):
                for k in ("online", "since_ms", "last_seen_ms", "told_ms"):
                    m[k] = p.get(k)
            if rank.get(p["link"], 99) < rank.get(m["link"], 99):
                m["link"], m["link_detail"] = p["link"], p.get("link_detail")
            exp = [x for x in (m["cert_expires_ms"], p["cert_expires_ms"]) if x is not None]
            m["cert_expires_ms"] = max(exp) if exp else None
            m["known_from"] = sorted(set(m["known_from"]) | set(p.get("known_from") or []))
    rows = sorted(by_org.values(), key=lambda e: (-(e["backlog_out"] + e["backlog_in"]), e["org"]))
    return {"partners": rows, "asked_ms": max(a["asked_ms"] for a in answers),
            "connected": any(a.get("connected") for a in answers), "more": sum(a.get("more", 0) for a in answers)}


def ask_partners(cfg: Any, timeout: float = 10.0) -> dict[str, Any]:
    """The running node's ``partners`` (every unit's, merged). Raises
    semq.ops.admin.AdminError when a daemon does not answer."""
    from .admin import admin_call, admin_socket_path

    dirs = cfg.unit_dirs
    return merge_partners([admin_call(admin_socket_path(d), "partners", {}, timeout=timeout) for d in dirs])


def ask_why(cfg: Any, lk0: str, timeout: float = 5.0, *, ours: bool = True) -> dict[str, Any]:
    """Where the document ``lk0`` is and why it waits, from the running
    node (``{"found": bool, "why": ...}``: its unit's answer, or the first
    that has it). Without a running daemon, one of ``ours`` is found and
    waits for the stopped daemon (``daemon_stopped``); one received here is
    not found."""
    from .admin import AdminError, admin_call, admin_socket_path

    dirs = cfg.unit_dirs
    answered = False
    for d in dirs:
        try:
            got: dict[str, Any] = admin_call(admin_socket_path(d), "why", {"lk0": lk0}, timeout=timeout)
        except AdminError:
            continue
        answered = True
        if got.get("found"):
            return got
    if answered or not ours:
        return {"lk0": lk0, "found": False, "why": None}
    return {"lk0": lk0, "found": True, "why": why(Doc(state="open"), None, DaemonView(running=False))}
