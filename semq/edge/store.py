"""The edge's tables and their one owner, ``EdgeStore`` (docs/interop.md).

``edge_partners``: the AS2 / AS4 partners an operator added (``semq partner
add``). ``edge_out``: our documents to them, each moved only through
``EDGE_TABLE`` (semq.node.engine): queued, claimed by the edge sender,
confirmed by a verified receipt (kept as ``proof``) or failed with the
partner's reason; a resend reuses the document's ``doc_key`` and so its
message id. ``edge_in``: their messages to us, one row per (protocol,
partner, message id), written in the transaction that puts the document in
the inbox, with the receipt answered: a resent message gets these same
bytes back and is never delivered twice.

Addresses: a partner is ``PROTOCOL:ID`` (``as2:ACME``). Organization ids are
digits and user names have no colon (semq.node.envelope), so an edge address
can never be read as either."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from semq.edge.protocol import EdgePartner, Inbound, Outgoing
from semq.node.core import NodeCore
from semq.node.engine import EdgeEvent, EdgeState, edge_step
from semq.umxt_protocol import NodeType

__all__ = ["EDGE_MAX_DOCUMENT", "EDGE_PROTOCOLS", "EdgeDoc", "EdgeError", "EdgeStore", "PartnerFacts", "parse_edge_address"]

EDGE_PROTOCOLS: Final = ("as2", "as4")
#: an AS2 name (RFC 4130 6.2: printable ASCII, 1..128) or an AS4 party id, as we accept them
_ID_RE: Final = re.compile(r"[!-~](?:[ -~]{0,126}[!-~])?")
MAX_TRIES: Final = 12
#: the largest document for an edge partner (its message, signed and encrypted, stays under the
#: edge listener's body bound EDGE_MAX_BODY, which SEMQ nodes as partners apply)
EDGE_MAX_DOCUMENT: Final = 16 << 20
BACKOFF_S: Final = (5, 15, 60, 300, 900, 1800, 3600)


class EdgeError(ValueError):
    """A partner or edge document refused (one line naming the value)."""


def parse_edge_address(text: str) -> tuple[str, str] | None:
    """``(protocol, id)`` of an edge address ``as2:ID`` / ``as4:ID``; None
    for anything else (an organization, a user)."""
    proto, colon, ident = text.partition(":")
    if not colon or proto.lower() not in EDGE_PROTOCOLS:
        return None
    if not _ID_RE.fullmatch(ident):
        raise EdgeError(f"partner id {ident!r} is not 1..128 printable ASCII characters (no leading or trailing space)")
    return proto.lower(), ident


@dataclass(frozen=True)
class EdgeDoc:
    id: int
    protocol: str
    partner: str
    state: EdgeState
    doc_key: str
    content_type: str
    message_id: str | None
    digest: str | None
    tries: int
    next_ms: int
    created_ms: int
    updated_ms: int
    reason: str | None
    size: int

    @property
    def address(self) -> str:
        return f"{self.protocol}:{self.partner}"


@dataclass(frozen=True)
class PartnerFacts:
    partner: EdgePartner
    added_ms: int
    last_ms: int | None  # the last exchange (a document sent or confirmed, or one received)
    backlog: int  # documents not yet confirmed nor failed
    confirmed: int
    failed: int
    received: int


class _DocRow(NamedTuple):
    id: int
    protocol: str
    partner: str
    state: int
    doc_key: str
    content_type: str
    message_id: str | None
    digest: str | None
    tries: int
    next_ms: int
    created_ms: int
    updated_ms: int
    reason: str | None
    size: int


class _SentRow(NamedTuple):
    message_id: str | None
    digest: str | None
    sent_headers: str | None
    sent_body: bytes | None


class _PartnerRow(NamedTuple):
    protocol: str
    id: str
    url: str
    cert: bytes
    our_id: str
    options: str
    added_ms: int


class _AnswerRow(NamedTuple):
    status: int
    headers: str
    receipt: bytes


_DOC_COLS: Final = ", ".join("length(content) AS size" if f == "size" else f for f in _DocRow._fields)
_PARTNER_COLS: Final = ", ".join(_PartnerRow._fields)
_SENT_COLS: Final = ", ".join(_SentRow._fields)


#: the delivery-log event of each transition (the names SEMQ's own hops use)
_EVENTS: Final = {EdgeEvent.CLAIMED: "sent", EdgeEvent.RECEIPT: "ack2", EdgeEvent.REFUSED: "nack",
                  EdgeEvent.NO_RECEIPT: "no_receipt", EdgeEvent.GAVE_UP: "dead_letter",
                  EdgeEvent.RESTARTED: "resend", EdgeEvent.RESEND: "resend"}


def _doc(raw: tuple[Any, ...]) -> EdgeDoc:
    r = _DocRow(*raw)
    return EdgeDoc(**{**r._asdict(), "state": EdgeState(r.state)})


class EdgeStore:
    """The owner of ``edge_partners``, ``edge_out`` and ``edge_in``."""

    def __init__(self, core: NodeCore) -> None:
        self.core = core

    @property
    def _conn(self) -> Any:
        return self.core.ctx.conn

    def _tx(self) -> Any:
        return self.core.transaction()

    # ------------------------------------------------------------ partners

    def add_partner(self, p: EdgePartner, now_ms: int) -> None:
        if p.protocol not in EDGE_PROTOCOLS:
            raise EdgeError(f"protocol {p.protocol!r} is not one of {', '.join(EDGE_PROTOCOLS)}")
        parse_edge_address(f"{p.protocol}:{p.id}")
        with self._tx():
            if self.partner(p.protocol, p.id) is not None:
                raise EdgeError(f"partner {p.protocol}:{p.id} exists already (semq partner remove first)")
            self._conn.execute(
                "INSERT INTO edge_partners (protocol, id, url, cert, our_id, options, added_ms) VALUES (?,?,?,?,?,?,?)",
                (p.protocol, p.id, p.url, p.their_cert_pem, p.our_id, json.dumps(dict(p.options), sort_keys=True),
                 now_ms))

    def remove_partner(self, protocol: str, ident: str) -> bool:
        """Remove a partner; refused while documents to it wait (they would have nowhere to go)."""
        with self._tx():
            waiting = self._conn.execute(
                "SELECT count(*) FROM edge_out WHERE protocol=? AND partner=? AND state IN (?,?)",
                (protocol, ident, EdgeState.QUEUED, EdgeState.SENDING)).fetchone()[0]
            if waiting:
                raise EdgeError(f"partner {protocol}:{ident} still has {waiting} document(s) waiting to be sent")
            return bool(self._conn.execute("DELETE FROM edge_partners WHERE protocol=? AND id=?",
                                           (protocol, ident)).rowcount)

    def partner(self, protocol: str, ident: str) -> EdgePartner | None:
        row = self._conn.execute(f"SELECT {_PARTNER_COLS} FROM edge_partners WHERE protocol=? AND id=?",
                                 (protocol, ident)).fetchone()
        return None if row is None else _partner(row)

    def partners(self) -> list[EdgePartner]:
        return [_partner(r) for r in self._conn.execute(
            f"SELECT {_PARTNER_COLS} FROM edge_partners ORDER BY protocol, id")]

    def facts(self) -> list[PartnerFacts]:
        """Each partner with its last exchange and its documents' counts (semq partners)."""
        out = []
        for raw in self._conn.execute(f"SELECT {_PARTNER_COLS} FROM edge_partners ORDER BY protocol, id").fetchall():
            p, added_ms = _partner(raw), _PartnerRow(*raw).added_ms
            counts = dict(self._conn.execute(
                "SELECT state, count(*) FROM edge_out WHERE protocol=? AND partner=? GROUP BY state",
                (p.protocol, p.id)).fetchall())
            last_out = self._conn.execute("SELECT max(updated_ms) FROM edge_out WHERE protocol=? AND partner=?"
                                          " AND tries > 0", (p.protocol, p.id)).fetchone()[0]
            last_in, received = self._conn.execute(
                "SELECT max(received_ms), count(*) FROM edge_in WHERE protocol=? AND partner=?",
                (p.protocol, p.id)).fetchone()
            lasts = [x for x in (last_out, last_in) if x is not None]
            out.append(PartnerFacts(
                p, added_ms, max(lasts) if lasts else None,
                counts.get(EdgeState.QUEUED, 0) + counts.get(EdgeState.SENDING, 0),
                counts.get(EdgeState.CONFIRMED, 0), counts.get(EdgeState.FAILED, 0), received))
        return out

    # ------------------------------------------------------------ our documents to partners

    def accept(self, address: str, content: bytes, content_type: str, now_ms: int) -> EdgeDoc:
        """A document for an edge partner, committed QUEUED (durable when this returns)."""
        parsed = parse_edge_address(address)
        if parsed is None:
            raise EdgeError(f"{address!r} is not an edge partner's address (as2:ID, as4:ID)")
        protocol, ident = parsed
        if not re.fullmatch(r"[\w.+-]+/[\w.+-]+", content_type):
            raise EdgeError(f"content type {content_type!r} is not TYPE/SUBTYPE")
        with self._tx():
            if self.partner(protocol, ident) is None:
                raise EdgeError(f"{address} is no partner of this node (semq partner add --{protocol} {ident})")
            cur = self._conn.execute(
                "INSERT INTO edge_out (protocol, partner, state, doc_key, content, content_type, next_ms, created_ms,"
                " updated_ms) VALUES (?,?,?,?,?,?,?,?,?)",
                (protocol, ident, EdgeState.QUEUED, "", content, content_type, now_ms, now_ms, now_ms))
            row_id = cur.lastrowid
            # stable for the document's life, unique over the store's incarnations (the time)
            key = f"{self.core.ctx.me.node_id}-{now_ms}-{row_id}"
            self._conn.execute("UPDATE edge_out SET doc_key=? WHERE id=?", (key, row_id))
            doc = self.get(row_id)
            assert doc is not None
            # (its key is the AppKey key the history indexes: semq track KEY finds it)
            self._event(doc, "queued", now_ms, size=len(content), data_type=content_type, key=doc.doc_key)
        return doc

    def get(self, row_id: int) -> EdgeDoc | None:
        row = self._conn.execute(f"SELECT {_DOC_COLS} FROM edge_out WHERE id=?", (row_id,)).fetchone()
        return None if row is None else _doc(row)

    def find(self, doc_key: str) -> EdgeDoc | None:
        row = self._conn.execute(f"SELECT {_DOC_COLS} FROM edge_out WHERE doc_key=?", (doc_key,)).fetchone()
        return None if row is None else _doc(row)

    def docs(self, limit: int = 100) -> list[EdgeDoc]:
        return [_doc(r) for r in self._conn.execute(
            f"SELECT {_DOC_COLS} FROM edge_out ORDER BY id DESC LIMIT ?", (limit,))]

    def content(self, row_id: int) -> bytes:
        return bytes(self._conn.execute("SELECT content FROM edge_out WHERE id=?", (row_id,)).fetchone()[0])

    def proof(self, row_id: int) -> bytes | None:
        row = self._conn.execute("SELECT proof FROM edge_out WHERE id=?", (row_id,)).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    def _move(self, row_id: int, event: EdgeEvent, now_ms: int, **sets: Any) -> EdgeDoc | None:
        doc = self.get(row_id)
        if doc is None:
            return None
        nxt = edge_step(doc.state, event)
        if nxt is None:
            return None
        cols = {"state": int(nxt), "updated_ms": now_ms, **sets}
        self._conn.execute(f"UPDATE edge_out SET {', '.join(f'{c}=?' for c in cols)} WHERE id=? AND state=?",
                           (*cols.values(), row_id, doc.state))
        moved = self.get(row_id)
        if moved is not None:
            self._event(moved, _EVENTS[event], now_ms, attempt=moved.tries or None, detail=sets.get("reason"))
        return moved

    def _event(self, doc: EdgeDoc, event: str, ts: int, **more: Any) -> None:
        """A delivery-log record of an edge hop (docs/events.md): keyed by the
        document's key, its path the protocol; written after the commit."""
        log = self.core.ctx.log
        if log is not None:
            log.write([{"ts": ts, "role": "origin", "event": event, "lk0": doc.doc_key, "source": self.core.ctx.me.node_id,
                        "target": doc.address, "path": doc.protocol, **{k: v for k, v in more.items() if v is not None}}])

    def restart(self, now_ms: int) -> int:
        """What a stopped daemon left SENDING is queued again (RESTARTED)."""
        with self._tx():
            ids = [r[0] for r in self._conn.execute("SELECT id FROM edge_out WHERE state=?", (EdgeState.SENDING,))]
            for i in ids:
                self._move(i, EdgeEvent.RESTARTED, now_ms, next_ms=now_ms)
        return len(ids)

    def claim(self, now_ms: int, limit: int = 8) -> list[EdgeDoc]:
        """Due documents, moved SENDING (CLAIMED), their tries counted."""
        with self._tx():
            ids = [r[0] for r in self._conn.execute(
                "SELECT id FROM edge_out WHERE state=? AND next_ms<=? ORDER BY next_ms, id LIMIT ?",
                (EdgeState.QUEUED, now_ms, limit))]
            out = []
            for i in ids:
                doc = self.get(i)
                if doc is not None and (moved := self._move(i, EdgeEvent.CLAIMED, now_ms, tries=doc.tries + 1)):
                    out.append(moved)
        return out

    def next_due(self) -> int | None:
        row = self._conn.execute("SELECT min(next_ms) FROM edge_out WHERE state=?", (EdgeState.QUEUED,)).fetchone()
        return row[0]

    def built(self, row_id: int, out: Outgoing) -> None:
        """The message the document is sent as, committed before it is
        posted: every resend posts these bytes again (``sent``)."""
        with self._tx():
            self._conn.execute("UPDATE edge_out SET message_id=?, digest=?, sent_headers=?, sent_body=? WHERE id=?",
                               (out.message_id, out.digest, json.dumps(dict(out.headers)), out.body, row_id))

    def sent(self, row_id: int) -> Outgoing | None:
        """The message this document was sent as before (None: not built yet)."""
        got = self._conn.execute(f"SELECT {_SENT_COLS} FROM edge_out WHERE id=?", (row_id,)).fetchone()
        row = None if got is None else _SentRow(*got)
        if row is None or row.message_id is None or row.sent_body is None:
            return None
        return Outgoing(row.message_id, json.loads(row.sent_headers or "{}"), bytes(row.sent_body), row.digest or "")

    def confirmed(self, row_id: int, proof: bytes, now_ms: int) -> EdgeDoc | None:
        with self._tx():
            return self._move(row_id, EdgeEvent.RECEIPT, now_ms, proof=proof, reason=None, sent_body=None)

    def refused(self, row_id: int, reason: str, proof: bytes, now_ms: int) -> EdgeDoc | None:
        with self._tx():
            return self._move(row_id, EdgeEvent.REFUSED, now_ms, proof=proof, reason=reason, sent_body=None)

    def no_receipt(self, row_id: int, reason: str, now_ms: int, max_tries: int = MAX_TRIES) -> EdgeDoc | None:
        """Sent again later (backoff), or failed when its tries ran out."""
        with self._tx():
            doc = self.get(row_id)
            if doc is None:
                return None
            if doc.tries >= max_tries:
                return self._move(row_id, EdgeEvent.GAVE_UP, now_ms,
                                  reason=f"no receipt after {doc.tries} tries: {reason}")
            wait = BACKOFF_S[min(doc.tries - 1, len(BACKOFF_S) - 1)] * 1000
            return self._move(row_id, EdgeEvent.NO_RECEIPT, now_ms, reason=reason, next_ms=now_ms + wait)

    def resend(self, row_id: int, now_ms: int) -> EdgeDoc | None:
        """A failed document queued again, with the same message id (RESEND)."""
        with self._tx():
            return self._move(row_id, EdgeEvent.RESEND, now_ms, next_ms=now_ms, tries=0)

    # ------------------------------------------------------------ their messages to us

    def answered(self, protocol: str, partner: str, message_id: str) -> tuple[int, dict[str, str], bytes] | None:
        """The receipt answered to this message when it first came, if it came."""
        raw = self._conn.execute(f"SELECT {', '.join(_AnswerRow._fields)} FROM edge_in WHERE protocol=?"
                                 " AND partner=? AND message_id=?", (protocol, partner, message_id)).fetchone()
        if raw is None:
            return None
        a = _AnswerRow(*raw)
        return a.status, json.loads(a.headers), bytes(a.receipt)

    def deliver(self, protocol: str, got: Inbound, answer: tuple[int, Mapping[str, str], bytes],
                now_ms: int) -> tuple[bool, tuple[int, dict[str, str], bytes]]:
        """Into the inbox once, with the receipt to answer, in one
        transaction: (delivered now, the receipt to answer). A message
        already received is not delivered again; its first receipt is
        answered."""
        status, headers, body = answer
        with self._tx():
            before = self.answered(protocol, got.partner_id, got.message_id)
            if before is not None:
                return False, before
            cur = self._conn.execute(
                "INSERT INTO edge_in (protocol, partner, message_id, received_ms, digest, status, headers, receipt)"
                " VALUES (?,?,?,?,?,?,?,?)",
                (protocol, got.partner_id, got.message_id, now_ms, got.digest, status,
                 json.dumps(dict(headers), sort_keys=True), body))
            origin = f"{protocol}:{got.partner_id}"
            # (as an LK0: the partner's address as the origin, unit 1 and store 1, the edge_in row's id)
            key = (NodeType.ORGANIZATION, origin, 1, 1, cur.lastrowid)
            inbox_row = (*key, f"edge.{protocol}", got.content_type[:64], "", (got.filename or "")[:255], 3, 0, now_ms,
                         now_ms, 0, got.content, origin, "", "", "")
            self.core.inbox.write([(*key, now_ms, None)], [inbox_row])
            log = self.core.ctx.log
            if log is not None:
                log.write([{"ts": now_ms, "role": "receiver", "event": "delivered", "lk0": got.message_id,
                            "source": origin, "target": self.core.ctx.me.node_id, "path": protocol,
                            "size": len(got.content), "data_type": got.content_type[:64],
                            "key": got.message_id}])
        return True, (status, dict(headers), body)

    def received(self, limit: int = 100) -> Iterator[tuple[str, str, str, int]]:
        yield from self._conn.execute("SELECT protocol, partner, message_id, received_ms FROM edge_in"
                                      " ORDER BY id DESC LIMIT ?", (limit,))


def _partner(raw: tuple[Any, ...]) -> EdgePartner:
    p = _PartnerRow(*raw)
    return EdgePartner(id=p.id, protocol=p.protocol, url=p.url, their_cert_pem=bytes(p.cert), our_id=p.our_id,
                       options=json.loads(p.options))


def now_ms() -> int:
    return int(time.time() * 1000)
