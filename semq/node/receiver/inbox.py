"""The inbox, the duplicate suppression and ``semq receive``'s tries, and
their one owner, ``Inbox``.

They are one state machine: a document is received once (its LK0 in
``dedup``, with the digest its receipt signs: docs/exactly-once.md), put in
``inbox``, read by applications, tried by ``semq receive`` (``receive_tries``,
whose row goes in the transaction that acknowledges the document, so that
"acknowledged" and "no tries left over" are one commit) and acknowledged
(``consumed_ms``), then purged a day later; its dedup row stays 30 days.

Nothing here is deferred: a document is in the inbox and the dedup table
before its acks leave. A unit other than the first also looks in unit 1's
dedup table (``received_digest``): ordered documents go there whatever unit
their LK0 picks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, TypeVar

from semq.store.db import ReadOnlyStore, rows_by_id
from semq.umxt_protocol import NodeType

from ..batch import NodeContext
from ..rows import columns

__all__ = ["GAP_MARK", "INBOX_COLUMNS", "Inbox", "InboxValues", "LK0Key", "received_by_origin"]

R = TypeVar("R", bound=tuple[Any, ...])
#: (origin_type, origin_id, semq_id, semq_db_id, record_id): a document's LK0 as the tables key it.
LK0Key = tuple[int, str, int, int, int]
#: An inbox row's values, in the order of ``INBOX_COLUMNS``.
InboxValues = tuple[Any, ...]
INBOX_COLUMNS: Final = ("origin_type, origin_id, semq_id, semq_db_id, record_id, domain, data_type, subtype, key,"
                        " save_fwd, priority, created_ms, received_ms, encrypt, app_data, signer, from_user,"
                        " to_user, channel")
# The dedup "digest" of an ordered document whose place a gap notice took
# (a real digest is 32 bytes): a copy arriving later is refused, not acked.
GAP_MARK: Final = b"gap"
_INBOX_INSERT: Final = f"INSERT INTO inbox ({INBOX_COLUMNS}) VALUES ({','.join('?' * 19)})"
_DEDUP_INSERT: Final = ("INSERT OR IGNORE INTO dedup (origin_type, origin_id, semq_id, semq_db_id, record_id,"
                        " received_ms, digest) VALUES (?,?,?,?,?,?,?)")
_BY_LK0: Final = "origin_type=? AND origin_id=? AND semq_id=? AND semq_db_id=? AND record_id=?"
_DIGEST: Final = f"SELECT digest FROM dedup WHERE {_BY_LK0}"
# The highest unacknowledged row (of one user's documents): what a
# wait_inbox compares with (semq.ops.waiters). Down the (consumed_ms, id) and
# (to_user, id) indexes from their end.
_TOP: Final = "SELECT id FROM inbox WHERE consumed_ms IS NULL ORDER BY id DESC LIMIT 1"
_TOP_OF_USER: Final = ("SELECT id FROM inbox WHERE to_user = ? AND to_user != '' AND consumed_ms IS NULL"
                       " ORDER BY id DESC LIMIT 1")
# A reply of request / reply (semq.node.features.rpc), literal domain and
# subtype: the partial index inbox_rpc_reply applies.
_RPC: Final = "domain='semq.rpc'"


class Inbox:
    """Documents received: once, read, tried, acknowledged."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self._first_unit: ReadOnlyStore | None = None  # unit 1's store, for a unit K > 1: opened when first asked

    def close(self) -> None:
        if self._first_unit is not None:
            self._first_unit.close()

    # ------------------------------------------------------------ receiving (a batch's transaction)

    def known(self, origin: tuple[int, str, int, int], record_ids: Sequence[int]) -> list[int]:
        """Which of ``record_ids`` of one origin's store (origin_type,
        origin_id, semq_id, semq_db_id) we received already: one look-up
        per origin for a batch (per-row statements cost ~15 us each)."""
        return [rid for (rid,) in rows_by_id(self.ctx.conn, "SELECT record_id FROM dedup", record_ids,
                                             key="record_id", where="origin_type=? AND origin_id=? AND semq_id=?"
                                             " AND semq_db_id=?", params=origin)]

    def has(self, key: LK0Key) -> bool:
        """Whether the document ``key`` was received (its dedup row)."""
        return self.ctx.conn.execute(f"SELECT 1 FROM dedup WHERE {_BY_LK0}", key).fetchone() is not None

    def gap_marked(self, key: LK0Key) -> bool:
        """Whether a gap notice took this ordered document's place."""
        return self.ctx.conn.execute(f"SELECT 1 FROM dedup WHERE {_BY_LK0} AND digest=?",
                                     (*key, GAP_MARK)).fetchone() is not None

    def write(self, dedup: list[tuple[Any, ...]], inbox: list[InboxValues]) -> None:
        """A batch's new dedup and inbox rows (one executemany each); the
        lists are emptied."""
        conn = self.ctx.conn
        if dedup:
            conn.executemany(_DEDUP_INSERT, dedup)
            dedup.clear()
        if inbox:
            conn.executemany(_INBOX_INSERT, inbox)
            inbox.clear()

    def name_file(self, key: LK0Key, path: str, size: int) -> None:
        """The inbox row of a large document names its content's file (semq.node.large)."""
        self.ctx.conn.execute(f"UPDATE inbox SET path=?, size=? WHERE {_BY_LK0}", (path, size, *key))

    def received_digest(self, key: LK0Key) -> tuple[bool, bytes | None]:
        """Whether the document ``key`` reached our inbox (its dedup row),
        and the digest it was signed with (for a receipt). A unit other
        than the first also looks in unit 1's store: the platform delivers
        the documents of ordered channels there, whatever unit their LK0
        picks (the one the origin's inquiry reaches)."""
        row = self.ctx.conn.execute(_DIGEST, key).fetchone()
        if row is None and self.ctx.first_unit_store is not None:
            if self._first_unit is None:
                self._first_unit = ReadOnlyStore(self.ctx.first_unit_store)
            row = self._first_unit.one(_DIGEST, key)  # (unreadable now: not here, as far as we can tell)
        if row is None:
            return False, None
        (digest,) = row
        if digest == GAP_MARK:  # a gap notice took its place: it never reached the inbox
            return False, None
        return True, digest

    def clean(self, dedup_before: int, read_before: int) -> tuple[int, list[str]]:
        """Dedup rows received before ``dedup_before``, acknowledged inbox
        rows acknowledged before ``read_before``: rows removed, and the files
        of the large documents among them."""
        conn = self.ctx.conn
        n = conn.execute("DELETE FROM dedup WHERE received_ms < ?", (dedup_before,)).rowcount
        gone = [p for (p,) in conn.execute("SELECT path FROM inbox WHERE path IS NOT NULL AND consumed_ms IS NOT NULL"
                                           " AND consumed_ms < ?", (read_before,))]
        n += conn.execute("DELETE FROM inbox WHERE consumed_ms IS NOT NULL AND consumed_ms < ?",
                          (read_before,)).rowcount
        return int(n), gone

    # ------------------------------------------------------------ applications (read-only unless said)

    def count(self, *, unread: bool = False, user: str | None = None) -> int:
        """Documents in the inbox (``unread``: not acknowledged; ``user``:
        that user's), as ``rows`` selects them."""
        q = ("SELECT count(*) FROM inbox WHERE 1=1" + (" AND consumed_ms IS NULL" if unread else "")
             + (" AND to_user = ? AND to_user != ''" if user else ""))
        return int(self.ctx.conn.execute(q, (user,) if user else ()).fetchone()[0])

    def dedup_count(self) -> int:
        return int(self.ctx.conn.execute("SELECT count(*) FROM dedup").fetchone()[0])

    def rows(self, row: type[R], *, after_id: int = 0, unread: bool = True, user: str | None = None,
             limit: int = 1000) -> list[R]:
        """Inbox rows as ``row`` (a named row of columns) above ``after_id``
        in id order (``unread``: not acknowledged; ``user``: that user's)."""
        q = (f"SELECT {columns(row)} FROM inbox WHERE id > ?" + (" AND consumed_ms IS NULL" if unread else "")
             + (" AND to_user = ? AND to_user != ''" if user else "") + " ORDER BY id LIMIT ?")
        args = (after_id, user, limit) if user else (after_id, limit)
        return [row._make(r) for r in self.ctx.conn.execute(q, args)]  # type: ignore[attr-defined]

    def get(self, row: type[R], row_id: int) -> R | None:
        got = self.ctx.conn.execute(f"SELECT {columns(row)} FROM inbox WHERE id=?", (row_id,)).fetchone()
        return None if got is None else row._make(got)  # type: ignore[attr-defined]

    def find(self, row: type[R], origin_id: str, semq_id: int, semq_db_id: int, record_id: int) -> R | None:
        """The first inbox row of the document with that LK0."""
        got = self.ctx.conn.execute(
            f"SELECT {columns(row)} FROM inbox WHERE origin_id=? AND semq_id=? AND semq_db_id=? AND record_id=?"
            " ORDER BY id LIMIT 1", (origin_id, semq_id, semq_db_id, record_id)).fetchone()
        return None if got is None else row._make(got)  # type: ignore[attr-defined]

    def top(self, user: str | None = None) -> int:
        """The highest row id of an unacknowledged document (``user``: of
        that user's documents), 0 when there is none."""
        row = (self.ctx.conn.execute(_TOP_OF_USER, (user,)) if user else self.ctx.conn.execute(_TOP)).fetchone()
        return int(row[0]) if row else 0

    def acknowledge(self, rows: Sequence[int], ts: int, user: str | None = None) -> int:
        """Acknowledge these rows at ``ts`` (``user``: only that user's), in
        the caller's transaction; returns how many were unacknowledged."""
        only = " AND to_user=?" if user is not None else ""
        cur = self.ctx.conn.executemany(f"UPDATE inbox SET consumed_ms=? WHERE id=? AND consumed_ms IS NULL{only}",
                                        [(ts, i, user) if user is not None else (ts, i) for i in rows])
        return int(cur.rowcount)

    def unread(self, row_id: int) -> bool:
        return self.ctx.conn.execute("SELECT 1 FROM inbox WHERE id=? AND consumed_ms IS NULL",
                                     (row_id,)).fetchone() is not None

    def knows(self, org_type: int, org: str, newest: int) -> bool:
        """Whether we received from ``org``: in the dedup table (the last 30
        days; indexed), or in the ``newest`` inbox rows (not indexed)."""
        q = self.ctx.conn.execute
        return (q("SELECT 1 FROM dedup WHERE origin_type=? AND origin_id=? LIMIT 1", (org_type, org)).fetchone()
                is not None
                or q("SELECT 1 FROM (SELECT origin_id AS o FROM inbox ORDER BY id DESC LIMIT ?) WHERE o=? LIMIT 1",
                     (newest, org)).fetchone() is not None)

    # ------------------------------------------------------------ request / reply (semq.node.features.rpc)

    def reply_to(self, key: str, origin_type: int, origin_id: str) -> int | None:
        """The first reply document with ``key`` from that organization."""
        got = self.ctx.conn.execute(
            f"SELECT id FROM inbox WHERE {_RPC} AND subtype='reply' AND key=? AND origin_type=? AND origin_id=?"
            " ORDER BY id LIMIT 1", (key, origin_type, origin_id)).fetchone()
        return None if got is None else int(got[0])

    def rpc_ids(self, subtype: str, *, unread: bool, after_id: int = 0, limit: int | None = None) -> list[int]:
        """The request or reply documents (``subtype``), in id order."""
        q = (f"SELECT id FROM inbox WHERE {_RPC} AND subtype=? AND id > ?" + (" AND consumed_ms IS NULL" if unread else "")
             + " ORDER BY id" + (" LIMIT ?" if limit is not None else ""))
        args = (subtype, after_id, *((limit,) if limit is not None else ()))
        return [int(i) for (i,) in self.ctx.conn.execute(q, args)]

    # ------------------------------------------------------------ semq receive's tries (semq.node.features.receiving)

    def tries(self, row: type[R], *, clean: bool = False) -> list[R]:
        """Every row of tries (``clean``: first drop those of documents
        acknowledged elsewhere, in the caller's transaction)."""
        if clean:
            self.ctx.conn.execute("DELETE FROM receive_tries WHERE inbox_id NOT IN"
                                  " (SELECT id FROM inbox WHERE consumed_ms IS NULL)")
        return [row._make(r) for r in self.ctx.conn.execute(  # type: ignore[attr-defined]
            f"SELECT {columns(row)} FROM receive_tries")]

    def tries_of(self, row: type[R], row_id: int) -> R | None:
        got = self.ctx.conn.execute(f"SELECT {columns(row)} FROM receive_tries WHERE inbox_id=?", (row_id,)).fetchone()
        return None if got is None else row._make(got)  # type: ignore[attr-defined]

    def taken(self, row_id: int, ts: int) -> bool:
        """The command took the document: acknowledged and its tries
        forgotten, in the caller's transaction. False when it was
        acknowledged already."""
        n = self.ctx.conn.execute("UPDATE inbox SET consumed_ms=? WHERE id=? AND consumed_ms IS NULL",
                                  (ts, row_id)).rowcount
        self.ctx.conn.execute("DELETE FROM receive_tries WHERE inbox_id=?", (row_id,))
        return bool(n)

    def failed_try(self, row_id: int, ts: int, *, code: int | None, stderr_tail: str, next_ms: int,
                   park: bool) -> None:
        """One more failed try of the document, in the caller's transaction."""
        self.ctx.conn.execute(
            "INSERT INTO receive_tries (inbox_id, tries, last_code, stderr_tail, first_ms, last_ms, next_ms,"
            " parked_ms) VALUES (?, 1, ?, ?, ?, ?, ?, ?) ON CONFLICT (inbox_id) DO UPDATE SET"
            " tries = tries + 1, last_code = excluded.last_code, stderr_tail = excluded.stderr_tail,"
            " last_ms = excluded.last_ms, next_ms = excluded.next_ms, parked_ms = excluded.parked_ms",
            (row_id, code, stderr_tail, ts, ts, next_ms, ts if park else None))

    def retry(self, row_id: int, ts: int) -> None:
        """Its tries start again from 0, due at ``ts`` (in the caller's transaction)."""
        self.ctx.conn.execute("UPDATE receive_tries SET tries=0, parked_ms=NULL, next_ms=? WHERE inbox_id=?",
                              (ts, row_id))


def received_by_origin(conn: Any) -> dict[str, tuple[int, int | None]]:
    """Every organization that sent us documents still remembered (the
    dedup table's rows, 30 days; the inbox's): how many of its documents
    no application acknowledged yet, and the earliest arrival of those
    (None: none waits). Read-only: ``conn`` may be a read-only connection
    of its own (``semq partners`` reads it off the store thread)."""
    out: dict[str, tuple[int, int | None]] = {}
    # The distinct origins by seeks along the dedup table's key, one per
    # origin, not a scan of 30 days of rows.
    for otype in (int(NodeType.ORGANIZATION), int(NodeType.USER)):
        last = ""
        while (row := conn.execute("SELECT min(origin_id) FROM dedup WHERE origin_type=? AND origin_id > ?",
                                   (otype, last)).fetchone()) and row[0] is not None:
            last = str(row[0])
            out[last] = (0, None)
    # The unread ones, through the (consumed_ms, id) index.
    for o, n, first in conn.execute(
            "SELECT origin_id, count(*), min(received_ms) FROM inbox WHERE consumed_ms IS NULL GROUP BY origin_id"):
        out[str(o)] = (int(n), None if first is None else int(first))
    return out
