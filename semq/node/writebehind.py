"""The node store's rows by name, and the writes held back in memory.

Two things live here, and nowhere else:

- **Named rows.** Every row the node core reads from its store is a
  ``NamedTuple`` whose fields name the columns, and the SELECT list is made
  from those fields (``columns``): a moved or renamed column fails loudly
  (SQLite: "no such column"), never silently as a shifted index would.
- **The write-behind** (docs/design.md, "States held in memory for up
  to a second"): three writes wait in memory for up to ``HOLD_MS`` for the
  frame that usually makes them moot within a fraction of a second — a
  claimed row's SS_SENT, its SS_ACK_FWD (for its ACK2), and a new pending-ack
  row (for REACK2 and REACK). Nothing sent depends on them: lost in a crash,
  the row is SS_INIT (sent again: the receiver's duplicate suppression) or
  SS_SENT (the platform is asked and says "forwarded"), and a received
  document is in the inbox and dedup table before its acks leave. Every
  reader of these states goes through ``WriteBehind`` (what it holds, or
  ``write`` first).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any, Final, NamedTuple

from semq.store.db import HOLD_MS, SendOrder, take_held

from .engine import ORIGIN_TABLE, OriginEvent, SendState

__all__ = [
    "HOLD_MS",
    "MAX_INQUIRY_BACKOFF_MS",
    "ClaimRow",
    "ConfirmRow",
    "DeadLetterRow",
    "HalfMessageRow",
    "HeldFwd",
    "HeldSent",
    "InboundAdminRow",
    "InboxRow",
    "MessageRow",
    "OriginRow",
    "OutboxAdminRow",
    "PendingAckRow",
    "PendingSendRow",
    "QueueItemRow",
    "RpcRequestRow",
    "WriteBehind",
    "columns",
]

MAX_INQUIRY_BACKOFF_MS: Final = 15 * 60 * 1000  # long-offline targets: ask at most every 15 min


class PendingSendRow(NamedTuple):
    """A pending-send row as failures, inquiries and the event log read it."""

    id: int
    target_type: int
    target_id: str
    state: int
    attempts: int


class ClaimRow(NamedTuple):
    """A pending-send row as a claim reads it: what the DATA frame carries,
    and the document (with security the claim seals and signs it)."""

    id: int
    target_type: int
    target_id: str
    state: int
    save_fwd: int
    ack2: int
    reliable: int
    priority: int
    domain: str
    data_type: str
    subtype: str
    key: str
    created_ms: int
    expires_ms: int | None
    attempts: int
    size: int
    encrypt: int
    session_key: bytes
    app_data: bytes
    clear_key: int
    envelope: bytes | None  # what starts AppData on the wire (semq.node.envelope); None: nothing
    channel: str  # its ordered channel ("": unordered): DATA flag Ordered
    large: int  # AppData is a large document's manifest (semq.node.large): DATA flag Large


class OriginRow(NamedTuple):
    """What an origin step needs of a pending-send row."""

    id: int
    target_id: str
    state: int
    save_fwd: int
    ack2: int
    attempts: int


class PendingAckRow(NamedTuple):
    """A pending-ack row (seed tb_0030) as it is inserted."""

    id: int
    origin_type: int
    origin_id: str
    semq_id: int
    semq_db_id: int
    record_id: int
    lk1_semq_id: int
    lk1_semq_db_id: int
    lk1_record_id: int
    platform_type: int
    platform_id: str
    p_ack: int
    s_ack: int
    received_ms: int
    last_inquiry_ms: int

    @property
    def lk0_key(self) -> tuple[int, str, int, int, int]:
        """(origin_type, origin_id, semq_id, semq_db_id, record_id): its LK0."""
        return self[_LK0_KEY]  # type: ignore[return-value]


# PendingAckRow's LK0 fields, in their order (a slice is what the hot path
# can afford: one per received document).
_LK0_KEY: Final = slice(PendingAckRow._fields.index("origin_type"), PendingAckRow._fields.index("record_id") + 1)
_CONFIRMED_AT: Final = slice(PendingAckRow._fields.index("p_ack"), PendingAckRow._fields.index("s_ack") + 1)


class ConfirmRow(NamedTuple):
    """What a confirmation (REACK, REACK2, a STATE answer) needs of a pending-ack row."""

    id: int
    origin_id: str
    semq_id: int
    semq_db_id: int
    record_id: int
    p_ack: int
    s_ack: int


class HeldSent(NamedTuple):
    """A claimed row whose SS_SENT is not written yet (SS_INIT on disk):
    what an origin step needs of it, so the acks of a claimed row do not
    read it again, and with security the digest it was signed with (None
    once written to ``receipts``)."""

    claimed_ms: int
    attempts: int  # with this send
    target_id: str
    save_fwd: int
    ack2: int
    digest: bytes | None

    def written(self) -> HeldSent:
        """The same, its digest written to ``receipts`` (nothing left to write)."""
        return tuple.__new__(HeldSent, (*self[:5], None))


class HeldFwd(NamedTuple):
    """A row whose ACK_FWD came and whose SS_ACK_FWD is not written yet."""

    at_ms: int
    code: int


# Fields read by an expression, not a column of their name: a pending row's
# ``size`` is its AppData's; an inbox row's ``large_size`` is the column
# ``size`` (a large document's, whose AppData is empty).
_COMPUTED: Final = {"size": "length(app_data)", "large_size": "size"}


def columns(row: type[tuple[Any, ...]]) -> str:
    """The SELECT list of a named row type."""
    return ", ".join(_COMPUTED.get(f, f) for f in row._fields)  # type: ignore[attr-defined]


S = SendState
# The transitions written from memory, as the origin table decides them.
_SENT_FROM: Final = int(S.SS_INIT)
_SENT_TO: Final = int(ORIGIN_TABLE[(S.SS_INIT, OriginEvent.SENT)][0])
_FWD_FROM: Final = int(S.SS_SENT)
_FWD_TO: Final = int(ORIGIN_TABLE[(S.SS_SENT, OriginEvent.ACK_FWD)][0])
_INBOUND_INSERT: Final = (
    f"INSERT OR IGNORE INTO inbound ({', '.join(PendingAckRow._fields)})"
    f" VALUES ({','.join('?' * len(PendingAckRow._fields))})")
_RECEIVED_AT: Final = PendingAckRow._fields.index("received_ms")
_CLAIMED_AT: Final = HeldSent._fields.index("claimed_ms")
_FWD_AT: Final = HeldFwd._fields.index("at_ms")


def write_digests(conn: sqlite3.Connection, rows: Iterable[tuple[int, str, bytes]]) -> None:
    """The digests (record id, target, digest) our documents were signed
    with, kept apart from the pending-send rows: a receipt may come after an
    inquiry answer has cleaned the row. A copy's digest is its first's
    (deterministic salts), so an existing row stays."""
    conn.executemany(
        "INSERT OR IGNORE INTO receipts (record_id, target_id, digest, receipt, verified, received_ms)"
        " VALUES (?, ?, ?, x'', 0, 0)", rows)


class WriteBehind:
    """The node's writes held in memory, oldest first, and the send order
    the claims read after them. Not thread-safe: the core's caller."""

    def __init__(self, conn: sqlite3.Connection, inquiry_ms: int) -> None:
        self.conn = conn
        self.inquiry_ms = inquiry_ms
        self.sent: dict[int, HeldSent] = {}
        # Where the claims read the send order from: after the held rows.
        # Forgotten whenever a row may have become SS_INIT below that point
        # (a resend, the operator, another process: every inquiry round).
        self.order = SendOrder("outbox")
        self.fwd: dict[int, HeldFwd] = {}
        self.inbound: dict[int, PendingAckRow] = {}
        self.inbound_keys: dict[tuple[int, str, int, int, int], int] = {}

    def __bool__(self) -> bool:
        return bool(self.sent or self.fwd or self.inbound)

    def first_inquiry(self, ts: int, attempts: int) -> int:
        """When a row in a new state (at ``ts``, after ``attempts`` sends)
        asks first: one interval later, doubled per resend (SPEC A.3; the
        SQL of the origin's updates computes the same from the row's
        attempts)."""
        return ts + min(MAX_INQUIRY_BACKOFF_MS, self.inquiry_ms * (1 << min(max(attempts - 1, 0), 6)))

    def write(self, before_ms: int | None = None) -> None:
        """Write what is held (all of it, or what was held at or before
        ``before_ms``), inside the caller's transaction: SS_SENT states of
        rows still SS_INIT on disk, then SS_ACK_FWD states of rows SS_SENT on
        disk (a row's ACK_FWD is never held longer than its SS_SENT), and
        pending-ack rows with the confirmations they have got so far."""
        if before_ms is None:
            self.order.forget()  # the operator's commands, close, reconnect, dead letters
        sent = take_held(self.sent, before_ms, _CLAIMED_AT) if self.sent else []
        if sent:  # as the claim would have written it
            self.conn.executemany(
                f"UPDATE outbox SET state={_SENT_TO}, attempts=?, sent_ms=?, state_ms=?, last_inquiry_ms=?,"
                f" due_ms=? WHERE id=? AND state={_SENT_FROM}",
                [(h.attempts, h.claimed_ms, h.claimed_ms, h.claimed_ms, self.first_inquiry(h.claimed_ms, h.attempts),
                  rid) for rid, h in sent])
            write_digests(self.conn, [(rid, h.target_id, h.digest) for rid, h in sent if h.digest is not None])
        items = take_held(self.fwd, before_ms, _FWD_AT) if self.fwd else []
        if items:
            # The row is still SS_SENT on disk; any other state was written since.
            self.conn.executemany(
                f"UPDATE outbox SET state={_FWD_TO}, state_ms=?, code=?, inquiries=0, last_inquiry_ms=?,"
                f" due_ms=?+min(?, ?*(1 << min(max(attempts-1, 0), 6))) WHERE id=? AND state={_FWD_FROM}",
                [(f.at_ms, f.code, f.at_ms, f.at_ms, MAX_INQUIRY_BACKOFF_MS, self.inquiry_ms, rid)
                 for rid, f in items])
        rows = [row for _, row in take_held(self.inbound, before_ms, _RECEIVED_AT)] if self.inbound else []
        if rows:  # (a batch that finds nothing old enough costs no statement)
            keys = self.inbound_keys
            for row in rows:
                keys.pop(row.lk0_key, None)
            self.conn.executemany(_INBOUND_INSERT, rows)

    def drop(self) -> None:
        """A transaction that did not commit may have changed what is held
        (rows received in it, states written from memory): all dropped, as
        a crash would drop it."""
        self.sent.clear()
        self.order.forget()
        self.fwd.clear()
        self.inbound.clear()
        self.inbound_keys.clear()

    def hold_inbound(self, key: tuple[int, str, int, int, int], row: PendingAckRow) -> None:
        """Hold a new pending-ack row; ``key`` is its LK0 (``row.lk0_key``)."""
        self.inbound[row.id] = row
        self.inbound_keys[key] = row.id

    def forget_inbound(self, rid: int) -> None:
        row = self.inbound.pop(rid)
        self.inbound_keys.pop(row.lk0_key, None)

    def confirm_held(self, rid: int, p_ack: int, s_ack: int) -> None:
        row = self.inbound[rid]
        self.inbound[rid] = tuple.__new__(PendingAckRow, (*row[:_CONFIRMED_AT.start], p_ack, s_ack,
                                                          *row[_CONFIRMED_AT.stop:]))

    def state_counts(self, on_disk: dict[str, int]) -> dict[str, int]:
        """Pending-send rows per state name with the held states counted
        where they are: a held SS_SENT is SS_INIT on disk, a held SS_ACK_FWD
        SS_SENT."""
        states = dict(on_disk)
        for held, below, above in ((self.sent, "SS_INIT", "SS_SENT"), (self.fwd, "SS_SENT", "SS_ACK_FWD")):
            if held:
                moved = min(len(held), states.get(below, 0))
                states[below] = states.get(below, 0) - moved
                states[above] = states.get(above, 0) + moved
        return states

    def unconfirmed(self) -> int:
        """Pending-ack rows held in memory."""
        return len(self.inbound)

    def pending_sends(self, on_disk_init: int) -> int:
        """Rows not yet sent: SS_INIT on disk less those held sent."""
        return on_disk_init - len(self.sent)



# ---------------------------------------------------------------- the rows the API, the features and ops read
# (the same rule: the fields name the columns, the SELECT list is made from them)


class InboxRow(NamedTuple):
    """An inbox row as an application reads it (``NodeClient.inbox``)."""

    id: int
    origin_type: int
    origin_id: str
    semq_id: int
    semq_db_id: int
    record_id: int
    domain: str
    data_type: str
    subtype: str
    key: str
    save_fwd: int
    priority: int
    created_ms: int
    received_ms: int
    encrypt: int
    app_data: bytes
    consumed_ms: int | None
    from_user: str
    to_user: str
    channel: str
    path: str | None  # a large document's file (semq.node.large); its app_data is empty
    large_size: int | None  # ... and its size (the column ``size``)


class MessageRow(NamedTuple):
    """A pending-send row as ``NodeClient.messages`` lists it, with who
    refused it (a target's signed refusal; None otherwise)."""

    id: int
    target_id: str
    state: int
    domain: str
    data_type: str
    subtype: str
    key: str
    save_fwd: int
    ack2: int
    priority: int
    created_ms: int
    attempts: int
    inquiries: int
    code: int
    size: int
    refused_by: str | None
    from_user: str
    to_user: str
    channel: str
    large: int  # a large document: ``size`` is its manifest's; its content's is in large_out


class DeadLetterRow(NamedTuple):
    """A pending-send row as the dead letters read it (``state_ms`` is when
    it failed)."""

    id: int
    target_id: str
    code: int
    domain: str
    data_type: str
    subtype: str
    key: str
    save_fwd: int
    priority: int
    attempts: int
    created_ms: int
    state_ms: int
    expires_ms: int | None
    size: int
    state: int


class OutboxAdminRow(NamedTuple):
    """A pending-send row as the admin console shows it (no contents)."""

    id: int
    target_type: int
    target_id: str
    state: int
    save_fwd: int
    ack2: int
    reliable: int
    priority: int
    domain: str
    data_type: str
    subtype: str
    key: str
    created_ms: int
    expires_ms: int | None
    attempts: int
    inquiries: int
    sent_ms: int | None
    state_ms: int | None
    last_inquiry_ms: int | None
    code: int
    encrypt: int
    size: int


class InboundAdminRow(NamedTuple):
    """A pending-ack row (seed tb_0030) as the admin console shows it."""

    id: int
    origin_id: str
    semq_id: int
    semq_db_id: int
    record_id: int
    lk1_record_id: int
    platform_id: str
    p_ack: int
    s_ack: int
    received_ms: int
    last_inquiry_ms: int
    inquiries: int


class HalfMessageRow(NamedTuple):
    """A half message (``tx_half``, seed 002) as the transactions read it."""

    id: int
    state: int
    target_id: str
    domain: str
    data_type: str
    subtype: str
    key: str
    save_fwd: int
    ack2: int
    reliable: int
    priority: int
    expires_ms: int | None
    encrypt: int
    app_data: bytes
    created_ms: int
    state_ms: int
    checks: int
    next_check_ms: int | None
    outbox_id: int | None  # the pending-send row once committed
    decided_by: str
    note: str


class RpcRequestRow(NamedTuple):
    """A request this node sent (``rpc_requests``) and its reply, if matched."""

    record_id: int
    target_id: str
    data_type: str
    sent_ms: int
    timeout_ms: int
    reply_inbox_id: int | None
    replied_ms: int | None
    taken_ms: int | None


class QueueItemRow(NamedTuple):
    """An item of a local queue (``queue_items``, seed 004)."""

    id: int
    data: bytes
    enqueued_ms: int
    deliveries: int
    lease_until_ms: int | None

