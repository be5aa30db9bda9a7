"""The pending-ack table (seed tb_0030, ``inbound``) and its one owner,
``PendingAcks``.

A document we received waits here for the confirmations of our acks
(P_ACK_STATUS: the platform's REACK of a stored copy's ACK; S_ACK_STATUS:
the origin's REACK2 of our ACK2), moved by ``PENDING_ACK_TABLE``
(semq.node.engine), and asks for them when they are late (SPEC B.2).

A new row is deferred (docs/design.md, "States held in memory for up to a
second"): REACK2 (and REACK) usually come within the second and end it, so
its INSERT and DELETE are not made. Its id is handed out at once (the
ACK/ACK2 name it) and reserved in ``sqlite_sequence`` inside the batch's
transaction, so a late confirmation can never name another row, even after
a crash. The owner answers with the real state: confirmations of a
deferred row are applied in memory, the counts count it, and the queries
that match rows by their columns (answers to our inquiries, the admin
console's) write the deferred rows first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, NamedTuple, TypeVar

from semq.store.db import next_row_id, rows_by_id
from semq.store.db import (
    split_held as split_deferred,  # (the store layer's names, shared with the platform)
)
from semq.store.db import take_held as take_deferred
from semq.umxt_protocol import LK0, Endpoint

from ..batch import Batch, NodeContext
from ..engine import AckEvent, AckStatus, pending_ack_step, receiver_may_clean
from ..rows import MAX_INQUIRY_BACKOFF_MS, columns

__all__ = ["PendingAckRow", "PendingAcks"]

R = TypeVar("R", bound=tuple[Any, ...])
_AS_INIT: Final = int(AckStatus.AS_INIT)


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
# can afford: one per received document), and its confirmations'.
_LK0_KEY: Final = slice(PendingAckRow._fields.index("origin_type"), PendingAckRow._fields.index("record_id") + 1)
_CONFIRMED_AT: Final = slice(PendingAckRow._fields.index("p_ack"), PendingAckRow._fields.index("s_ack") + 1)
_RECEIVED_AT: Final = PendingAckRow._fields.index("received_ms")
_INSERT: Final = (f"INSERT OR IGNORE INTO inbound ({', '.join(PendingAckRow._fields)})"
                  f" VALUES ({','.join('?' * len(PendingAckRow._fields))})")
_BY_LK0: Final = ("SELECT id FROM inbound WHERE origin_type=? AND origin_id=? AND semq_id=? AND semq_db_id=?"
                  " AND record_id=?")


class _ConfirmRow(NamedTuple):
    """What a confirmation (REACK, REACK2, a STATE answer) needs of a pending-ack row."""

    id: int
    origin_id: str
    semq_id: int
    semq_db_id: int
    record_id: int
    p_ack: int
    s_ack: int


_CONFIRM_COLS: Final = columns(_ConfirmRow)
_PENDING_COLS: Final = columns(PendingAckRow)
# Per stored (p_ack, s_ack) and who confirmed (platform, origin): the pair
# after it and whether the row may go (PENDING_ACK_TABLE, receiver_may_clean).
_CONFIRMED: Final[dict[tuple[int, int, bool, bool], tuple[int, int, bool]]] = {}
for _p in AckStatus:
    for _s in AckStatus:
        for _by_p in (False, True):
            for _by_s in (False, True):
                _pair = (_p, _s)
                if _by_p:
                    _pair = pending_ack_step(*_pair, AckEvent.PLATFORM_CONFIRMS)
                if _by_s:
                    _pair = pending_ack_step(*_pair, AckEvent.ORIGIN_CONFIRMS)
                _CONFIRMED[(int(_p), int(_s), _by_p, _by_s)] = (int(_pair[0]), int(_pair[1]),
                                                               receiver_may_clean(*_pair))


class PendingAcks:
    """The pending-ack rows and the new ones deferred in memory. Not
    thread-safe: the core's caller (one store thread)."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.deferred: dict[int, PendingAckRow] = {}  # by id, oldest first
        self.deferred_keys: dict[tuple[int, str, int, int, int], int] = {}  # LK0 -> id
        self._floor = 0  # no id below this is given out again
        self._sweep = 0  # the id after which the next inquiry round reads

    # ------------------------------------------------------------ deferred rows

    def __bool__(self) -> bool:
        return bool(self.deferred)

    def write_deferred(self, before_ms: int | None = None) -> None:
        """Insert the deferred rows (all, or those received at or before
        ``before_ms``) with the confirmations they have got so far, inside
        the caller's transaction. (A batch that finds nothing old enough
        costs no statement.)"""
        if not self.deferred:
            return
        rows = [row for _, row in take_deferred(self.deferred, before_ms, _RECEIVED_AT)]
        if rows:
            keys = self.deferred_keys
            for row in rows:
                keys.pop(row.lk0_key, None)
            self.ctx.conn.executemany(_INSERT, rows)

    def drop_deferred(self) -> None:
        self.deferred.clear()
        self.deferred_keys.clear()

    def settle(self) -> None:
        """Insert every deferred row now, before a query that matches rows
        by their columns: in the caller's transaction if one is open, else
        in one of its own."""
        if not self.deferred:
            return
        if self.ctx.conn.in_transaction:
            self.write_deferred()
        else:
            with self.ctx.db.atomic("IMMEDIATE"):
                self.write_deferred()

    def defer(self, key: tuple[int, str, int, int, int], row: PendingAckRow) -> None:
        """A new row, not written yet (its id from ``next_id``); ``key`` is
        its LK0 (``row.lk0_key``, which the caller has at hand)."""
        self.deferred[row.id] = row
        self.deferred_keys[key] = row.id

    # ------------------------------------------------------------ ids

    # Row ids are assigned here, inside the IMMEDIATE transaction (we are the
    # only writer), so acks can name them before the rows are written.

    def next_id(self, b: Batch) -> int:
        if not b.next_inbound:
            b.next_inbound = max(next_row_id(self.ctx.conn, "inbound"), self._floor)
        rid = b.next_inbound
        b.next_inbound += 1
        self._floor = b.next_inbound
        return rid

    def reserve_ids(self, b: Batch) -> None:
        """The ids given out in this batch are never given out again, even
        after a crash that loses the deferred rows (a late confirmation
        naming one must not confirm another row): AUTOINCREMENT's sequence,
        updated in the batch's transaction."""
        if not b.next_inbound:
            return
        hi = self._floor - 1
        if hi <= 0:
            return
        conn = self.ctx.conn
        if not conn.execute("UPDATE sqlite_sequence SET seq=? WHERE name='inbound' AND seq<?", (hi, hi)).rowcount:
            conn.execute("INSERT INTO sqlite_sequence (name, seq) SELECT 'inbound', ?"
                         " WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name='inbound')", (hi,))

    def id_of(self, key: tuple[int, str, int, int, int]) -> int:
        """The row of the document with LK0 ``key`` (0: none)."""
        rid = self.deferred_keys.get(key, 0)
        if rid:
            return rid
        row = self.ctx.conn.execute(_BY_LK0, key).fetchone()
        return int(row[0]) if row else 0

    # ------------------------------------------------------------ confirmations

    def confirm(self, p_ids: Sequence[int], s_acks: Sequence[tuple[int, str]], ts: int,
                events: list[dict[str, Any]]) -> None:
        """Apply confirmations: the platform's (``p_ids``) and the origins'
        (``s_acks``: (id, sender org); only the row's origin confirms it,
        anything else changes nothing), through PENDING_ACK_TABLE; a row with
        every confirmation it needs is deleted instead of updated (SPEC B.2),
        a deferred one is never written. Each confirmation is logged, the
        clean-up too. Both kinds at once: a drained copy's REACK (from the
        platform) and REACK2 (from the origin) often arrive in the same
        read, and the row then goes in one DELETE instead of an UPDATE and a
        DELETE."""
        if not p_ids and not s_acks:
            return
        got_p, got_s = set(p_ids), dict(s_acks)
        ids = list(dict.fromkeys([*p_ids, *got_s]))
        me = self.ctx.me.node_id
        done, marked = [], []
        waiting = self.deferred
        # A deferred PendingAckRow has every field of a _ConfirmRow, by the same names.
        rows: list[_ConfirmRow | PendingAckRow] = []
        if waiting:  # rows still in memory: confirmed there, never written if complete
            hits, ids = split_deferred(ids, waiting)
            rows += [h for _, h in hits]
        if ids:
            rows += map(_ConfirmRow._make, rows_by_id(self.ctx.conn, f"SELECT {_CONFIRM_COLS} FROM inbound", ids))
        for r in rows:
            rid, origin = r.id, r.origin_id
            lk0 = f"{origin}/{r.semq_id}/{r.semq_db_id}/{r.record_id}"
            by_p, by_s = rid in got_p, got_s.get(rid) == origin
            if not (by_p or by_s):
                continue  # a REACK2 from someone else than the document's origin
            if by_p:
                events.append({"ts": ts, "role": "receiver", "event": "reack", "lk0": lk0,
                               "source": origin, "target": me})
            if by_s:
                events.append({"ts": ts, "role": "receiver", "event": "reack2", "lk0": lk0,
                               "source": origin, "target": me})
            p_ack, s_ack, clean = _CONFIRMED[(r.p_ack, r.s_ack, by_p, by_s)]
            deferred = waiting.get(rid) if waiting else None
            if clean:
                if deferred is not None:
                    del waiting[rid]
                    self.deferred_keys.pop(deferred.lk0_key, None)
                else:
                    done.append((rid,))
                events.append({"ts": ts, "role": "receiver", "event": "cleaned", "lk0": lk0,
                               "source": origin, "target": me})
            elif deferred is not None:
                waiting[rid] = tuple.__new__(PendingAckRow, (*deferred[:_CONFIRMED_AT.start], p_ack, s_ack,
                                                          *deferred[_CONFIRMED_AT.stop:]))
            else:
                marked.append((p_ack, s_ack, rid))
        self.ctx.conn.executemany("UPDATE inbound SET p_ack=?, s_ack=? WHERE id=?", marked)
        self.ctx.conn.executemany("DELETE FROM inbound WHERE id=?", done)

    def answered(self, answers: Sequence[LK0], peer: Endpoint, from_platform: bool) -> list[int]:
        """The rows a STATE answer from ``peer`` is about (every answer —
        marked, already acked, no record — confirms: SPEC B.2): by the LK1
        for the platform's, by the LK0 for the document's origin's (only a
        document's origin answers for it). The deferred rows are written
        first: an answer is matched to rows by their columns."""
        self.settle()
        conn = self.ctx.conn
        ids = []
        for lk in answers:
            if from_platform:
                row = conn.execute(
                    "SELECT id FROM inbound INDEXED BY inbound_lk1 WHERE lk1_record_id=? AND lk1_record_id != 0"
                    " AND lk1_semq_id=? AND lk1_semq_db_id=? AND platform_id=?",
                    (lk.record_id, lk.semq_id, lk.semq_db_id, peer.node_id),
                ).fetchone()
            elif lk.endpoint != peer:
                continue
            else:
                row = conn.execute(_BY_LK0, (int(lk.endpoint.node_type), lk.endpoint.node_id, lk.semq_id,
                                             lk.semq_db_id, lk.record_id)).fetchone()
            if row:
                ids.append(int(row[0]))
        return ids

    def due(self, ts: int, limit: int, sweep: int) -> list[PendingAckRow]:
        """SPEC B.2: the written rows whose confirmation is late, with their
        inquiry time set (a deferred row is not a second old). At most
        ``sweep`` rows per round, in id order from where the last round
        stopped, so a huge table is asked about over several rounds (a row
        waits at most size/sweep rounds more): the table has no due-time
        index (it would cost every received document an index entry)."""
        conn = self.ctx.conn
        start = self._sweep
        edge = conn.execute("SELECT id FROM inbound WHERE id > ? ORDER BY id LIMIT 1 OFFSET ?",
                            (start, sweep - 1)).fetchone()
        end = int(edge[0]) if edge else 1 << 62
        rows = [PendingAckRow._make(r) for r in conn.execute(
            f"SELECT {_PENDING_COLS} FROM inbound"
            f" WHERE id > ? AND id <= ? AND (p_ack={_AS_INIT} OR s_ack={_AS_INIT})"
            f" AND last_inquiry_ms + min(?, ? * (1 << min(inquiries, 6))) <= ? ORDER BY id LIMIT ?",
            (start, end, MAX_INQUIRY_BACKOFF_MS, self.ctx.inquiry_ms, ts, limit))]
        # Resume after the last row read: the rest of this window when the
        # LIMIT cut it, the next window, or from the start after the end.
        if len(rows) == limit:
            self._sweep = rows[-1].id
        else:
            self._sweep = end if edge else 0
        conn.executemany("UPDATE inbound SET last_inquiry_ms=?, inquiries=inquiries+1 WHERE id=?",
                         [(ts, r.id) for r in rows])
        return rows

    # ------------------------------------------------------------ queries (read-only)

    def count(self, received_before: int | None = None) -> int:
        """Rows (received before ``received_before``), the deferred ones included."""
        if received_before is None:
            return int(self.ctx.conn.execute("SELECT count(*) FROM inbound").fetchone()[0]) + len(self.deferred)
        n = int(self.ctx.conn.execute("SELECT count(*) FROM inbound WHERE received_ms < ?",
                                      (received_before,)).fetchone()[0])
        return n + sum(1 for r in self.deferred.values() if r.received_ms < received_before)

    def rows(self, row: type[R], *, after_id: int = 0, received_before: int | None = None,
             origin: str | None = None, limit: int, order: str = "id") -> list[R]:
        """Rows as ``row`` (a named row of columns), in ``order`` ("id", or
        "received"), at most ``limit``; the deferred ones written first."""
        self.settle()
        clauses, params = ["id > ?"], [after_id]
        if received_before is not None:
            clauses.append("received_ms < ?")
            params.append(received_before)
        if origin is not None:
            clauses.append("origin_id=?")
            params.append(origin)  # type: ignore[arg-type]
        by = "received_ms" if order == "received" else "id"
        return [row._make(r) for r in self.ctx.conn.execute(  # type: ignore[attr-defined]
            f"SELECT {columns(row)} FROM inbound WHERE {' AND '.join(clauses)} ORDER BY {by} LIMIT ?",
            (*params, limit))]
