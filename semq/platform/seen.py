"""What the platform did with each document it accepted: the owner of the
``seen`` table.

Per LK0, ``route()``'s decision (semq.platform.engine): forwarded, stored
(with the copy's LK1), or dropped. It answers an origin's "did you receive
LK0 x?" (SPEC A.5) after the stored copy itself is gone, and tells a
document sent again whose first copy was forwarded (its origin lost the
ACK_FWD) from one never seen. Kept SEEN_RETENTION_MS, whatever became of
the copy.

Not part of the stored copies' state machine: ``STORED_TABLE`` never
moves a row here, forwarded and dropped documents never had a copy, and a
row outlives its copy by the retention. The one answer that needs both
tables is ``StoredCopies.fate`` (semq.platform.copies), which also writes
the ``STORED`` rows with the LK1 it gives.

Held in memory: the batch's rows, written in one statement (``flush``) by
the batch's end or before any read of this table; a key twice in a batch
ends as its last row, as one upsert after another would leave it."""

from __future__ import annotations

from enum import IntEnum
from typing import Any, Final

from semq.store.db import Dialect
from semq.store.pg import declare_key

from .views import SeenRow

__all__ = ["SEEN_RETENTION_MS", "SeenAction", "SeenDocuments", "SeenKey"]

SEEN_RETENTION_MS: Final = 30 * 24 * 3600 * 1000

SeenKey = tuple[int, str, int, int, int]
"""An LK0 as the table's key: (origin_type, origin_id, semq_id, semq_db_id, record_id)."""


class SeenAction(IntEnum):
    """What the platform did with a document (the ``action`` column)."""

    FORWARDED = 1  # handed to its target's connection (here, or one hop to another instance)
    STORED = 2  # a copy was stored (``lk1``): it waits, or its target acked it
    DROPPED = 3  # dropped or refused: its origin got a NACK


# Every column in the table's order, with its SQL type (the PostgreSQL
# dialect writes a batch as arrays of these); the first five are the key.
_COLUMNS: Final = (("origin_type", "integer"), ("origin_id", "text"), ("semq_id", "integer"),
                   ("semq_db_id", "integer"), ("record_id", "bigint"), ("action", "integer"),
                   ("lk1", "bigint"), ("seen_ms", "bigint"))
_KEY: Final = 5
# (For semq.store.pg.translate_sql: the SQLite dialect's upsert names no key.)
declare_key("seen", [c for c, _t in _COLUMNS[:_KEY]], [c for c, _t in _COLUMNS[_KEY:]])
_BY_KEY: Final = "origin_type=? AND origin_id=? AND semq_id=? AND semq_db_id=? AND record_id=?"


class SeenDocuments:
    """The ``seen`` table, on the store's connection and inside the caller's
    transaction (the platform's store thread)."""

    def __init__(self, conn: Any, dialect: Dialect) -> None:
        self.conn = conn
        self.dialect = dialect
        # The batch's rows: (*SeenKey, action, lk1, seen_ms). The list is
        # never rebound, so ``add`` (its append) is bound once: the router
        # adds a row per reliable document.
        self._rows: list[tuple[Any, ...]] = []
        self.add = self._rows.append

    def begin(self) -> None:
        """A new batch: rows of one that did not commit are gone."""
        self._rows.clear()

    def flush(self) -> None:
        """The batch's rows, written in one statement."""
        if self._rows:
            self.dialect.upsert_many(self.conn, "seen", _COLUMNS, _KEY, self._rows)
            self._rows.clear()

    def action(self, key: SeenKey) -> tuple[int, int] | None:
        """(action, lk1) of the document ``key``, this batch's rows included."""
        self.flush()
        row = self.conn.execute(f"SELECT action, lk1 FROM seen WHERE {_BY_KEY}", key).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    def forwarded_before(self, key: SeenKey) -> bool:
        """Whether the document ``key`` was forwarded by this platform before."""
        got = self.action(key)
        return got is not None and got[0] == SeenAction.FORWARDED

    def find(self, origin_id: str, semq_id: int, semq_db_id: int, record_id: int) -> SeenRow | None:
        """The console's look-up of an LK0 (an origin named by its id)."""
        self.flush()
        row = self.conn.execute("SELECT action, lk1, seen_ms FROM seen WHERE origin_id=? AND semq_id=? AND"
                                " semq_db_id=? AND record_id=?", (origin_id, semq_id, semq_db_id, record_id)
                                ).fetchone()
        return None if row is None else SeenRow(int(row[0]), int(row[1]), int(row[2]))

    def count(self) -> int:
        (n,) = self.conn.execute("SELECT count(*) FROM seen").fetchone()
        return int(n)

    def expire(self, before_ms: int) -> int:
        """Rows seen before ``before_ms``, removed. How many."""
        return int(self.conn.execute("DELETE FROM seen WHERE seen_ms < ?", (before_ms,)).rowcount)
