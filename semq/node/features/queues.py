"""Named local durable queues in the node's store (seed 004's persistent
queue interface: create, destroy, enqueue, dequeue, recover), so an
application can use SEMQ as its local durable queue too.

    from semq.node.features.queues import LocalQueues
    with LocalQueues("/srv/semq/acme") as q:
        q.create("invoices", exist_ok=True)
        q.enqueue("invoices", b"...")
        item = q.dequeue("invoices", lease=30)     # in flight, invisible to others
        if item:
            handle(item.data)
            q.ack("invoices", item.id)             # done: gone for good

Rules:

- every call is one SQLite transaction, committed (synchronous=FULL by
  default) before it returns: an enqueued item survives a power cut;
- FIFO by enqueue order; an item whose lease ran out is visible again and,
  being older, comes first;
- ``dequeue`` leases the item: invisible to every other ``dequeue`` until
  acked, released, its lease ends, or ``recover``;
- ``recover(name)`` returns **every** in-flight item to the queue at once —
  for an application restarting after a crash, which knows no consumer of
  its own is still at work (do not call it while other consumers run);
- delivery is at least once: a consumer that dies after its work but
  before ``ack`` sees the item again. ``item.delivery`` counts dequeues; pass
  it to ``ack`` to refuse a late ack for a lease that expired and was
  given to someone else.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from semq.tracking.events import now_ms

from ..rows import columns
from ._access import core_of, write_tx

if TYPE_CHECKING:
    from ..api import NodeClient
    from ..core import NodeCore

__all__ = ["MAX_ITEM_BYTES", "LocalQueues", "QueueError", "QueueItem", "QueueStats"]

NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
MAX_ITEM_BYTES: Final = 64 * 1024 * 1024  # the frame limit: an item can always be sent on as a document
DEFAULT_LEASE: Final = 30.0  # s

class QueueItemRow(NamedTuple):
    """An item of a local queue (``queue_items``, seed 004)."""

    id: int
    data: bytes
    enqueued_ms: int
    deliveries: int
    lease_until_ms: int | None


# The rows read by name (semq.node.rows.columns); the SELECT lists are made
# from their fields.
_ITEM_COLS: Final = columns(QueueItemRow)


class _QueueCounts(NamedTuple):
    """One queue's counts as ``stats`` reads them (``QueueStats``'s fields)."""

    name: str
    created_ms: int
    ready: int
    in_flight: int
    expired_leases: int
    oldest_ms: int | None
    max_delivery: int


# Each count is an expression named by its field (the two ``?`` are the time
# the leases are judged at); a renamed field is a KeyError here.
_STATS_EXPRS: Final = {
    "name": "q.name",
    "created_ms": "q.created_ms",
    "ready": "count(i.id) FILTER (WHERE i.lease_until_ms IS NULL)",
    "in_flight": "count(i.id) FILTER (WHERE i.lease_until_ms > ?)",
    "expired_leases": "count(i.id) FILTER (WHERE i.lease_until_ms <= ?)",
    "oldest_ms": "min(i.enqueued_ms)",
    "max_delivery": "coalesce(max(i.deliveries), 0)",
}
_STATS_COLS: Final = ", ".join(f"{_STATS_EXPRS[f]} AS {f}" for f in _QueueCounts._fields)


class QueueError(ValueError):
    """A user's mistake: no such queue, bad name, not in flight... CLI exit 2."""


@dataclass(frozen=True)
class QueueItem:
    queue: str
    id: int
    data: bytes
    enqueued_ms: int
    delivery: int  # 1 on the first dequeue; more means it was dequeued before and not acked
    lease_until_ms: int | None


@dataclass(frozen=True)
class QueueStats:
    name: str
    created_ms: int
    ready: int
    in_flight: int
    expired_leases: int  # in flight on paper, visible again
    oldest_ms: int | None
    max_delivery: int


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise QueueError(f"queue name {name!r} is not 1-128 characters of letters, digits and . _ : / -"
                         " starting with a letter or digit")
    return name


def _lease_ms(lease: float) -> int:
    if not (isinstance(lease, int | float) and math.isfinite(lease) and lease > 0):
        raise QueueError(f"lease {lease!r} is not a positive number of seconds")
    return max(1, int(lease * 1000))


class LocalQueues:
    """Queues of one node. ``node``: a NodeClient, a NodeCore, or the node's
    data directory (then a connection of its own, closed by ``close``).
    One caller at a time per instance; any number of processes."""

    def __init__(self, node: NodeClient | NodeCore | str | os.PathLike[str]) -> None:
        self._own: Any = None
        if isinstance(node, str | os.PathLike):
            from ..api import NodeClient

            node = self._own = NodeClient(Path(node))
        self.core = core_of(node)

    def __enter__(self) -> LocalQueues:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._own is not None:
            self._own.close()
            self._own = None

    def _exists(self, conn: Any, name: str) -> None:
        if conn.execute("SELECT 1 FROM queues WHERE name=?", (_check_name(name),)).fetchone() is None:
            raise QueueError(f"no queue {name!r} (create it first: semq queue create {name})")

    # ------------------------------------------------------------ queues

    def create(self, name: str, *, exist_ok: bool = False) -> bool:
        """Create a queue. True if created; False if it existed and
        ``exist_ok``; QueueError if it existed otherwise."""
        _check_name(name)
        with write_tx(self.core) as conn:
            n = conn.execute("INSERT OR IGNORE INTO queues (name, created_ms) VALUES (?,?)",
                             (name, now_ms())).rowcount
        if not n and not exist_ok:
            raise QueueError(f"queue {name!r} already exists")
        return bool(n)

    def destroy(self, name: str, *, force: bool = False) -> int:
        """Delete a queue. One that still holds items needs ``force`` (they
        are deleted with it). Returns the number of items deleted."""
        with write_tx(self.core) as conn:
            self._exists(conn, name)
            n = int(conn.execute("SELECT count(*) FROM queue_items WHERE queue=?", (name,)).fetchone()[0])
            if n and not force:
                raise QueueError(f"queue {name!r} still holds {n} item(s); destroy it with force"
                                 " (--force) to delete them too")
            conn.execute("DELETE FROM queue_items WHERE queue=?", (name,))
            conn.execute("DELETE FROM queues WHERE name=?", (name,))
        return n

    def names(self) -> list[str]:
        return [n for (n,) in self.core.conn.execute("SELECT name FROM queues ORDER BY name")]

    # ------------------------------------------------------------ items

    def enqueue(self, name: str, data: bytes) -> int:
        """Append one item; durable when this returns. Returns its id."""
        return self.enqueue_many(name, [data])[0]

    def enqueue_many(self, name: str, items: Iterable[bytes]) -> list[int]:
        """Append several items in one transaction (all or none)."""
        blobs = [bytes(d) for d in items]
        for b in blobs:
            if len(b) > MAX_ITEM_BYTES:
                raise QueueError(f"item of {len(b)} bytes exceeds the {MAX_ITEM_BYTES // (1024 * 1024)} MiB limit")
        ts = now_ms()
        ids = []
        with write_tx(self.core) as conn:
            self._exists(conn, name)
            for b in blobs:
                cur = conn.execute("INSERT INTO queue_items (queue, data, enqueued_ms) VALUES (?,?,?)", (name, b, ts))
                ids.append(int(cur.lastrowid or 0))
        return ids

    def dequeue(self, name: str, *, lease: float = DEFAULT_LEASE, now_ms_: int | None = None) -> QueueItem | None:
        """Take the oldest visible item and lease it for ``lease`` seconds
        (committed before it is returned). None if there is none."""
        ms = _lease_ms(lease)
        ts = now_ms() if now_ms_ is None else now_ms_
        with write_tx(self.core) as conn:
            self._exists(conn, name)
            row = conn.execute(
                "SELECT id FROM queue_items WHERE queue=? AND (lease_until_ms IS NULL OR lease_until_ms <= ?)"
                " ORDER BY id LIMIT 1", (name, ts)).fetchone()
            if row is None:
                return None
            (item_id,) = row
            conn.execute("UPDATE queue_items SET lease_until_ms=?, deliveries=deliveries+1 WHERE id=?",
                         (ts + ms, item_id))
            return self._item(conn, name, item_id)

    def _item(self, conn: Any, name: str, item_id: int) -> QueueItem:
        got = conn.execute(f"SELECT {_ITEM_COLS} FROM queue_items WHERE queue=? AND id=?", (name, item_id)).fetchone()
        if got is None:
            raise QueueError(f"no item {item_id} in queue {name!r} (acknowledged already?)")
        r = QueueItemRow._make(got)
        return QueueItem(queue=name, id=r.id, data=r.data, enqueued_ms=r.enqueued_ms, delivery=r.deliveries,
                         lease_until_ms=r.lease_until_ms)

    def ack(self, name: str, item_id: int, *, delivery: int | None = None) -> None:
        """Done with a dequeued item: delete it. QueueError if it is not in
        flight (never dequeued, released, recovered, already acked) or, with
        ``delivery``, if it was dequeued again since (a late ack)."""
        with write_tx(self.core) as conn:
            self._exists(conn, name)
            it = self._item(conn, name, int(item_id))
            if it.lease_until_ms is None:
                raise QueueError(f"item {item_id} of queue {name!r} is not in flight (dequeue it first)")
            if delivery is not None and it.delivery != delivery:
                raise QueueError(f"item {item_id} of queue {name!r} was dequeued again since delivery {delivery}"
                                 f" (now {it.delivery}): its lease had ended")
            conn.execute("DELETE FROM queue_items WHERE id=?", (it.id,))

    def release(self, name: str, item_id: int) -> None:
        """Give a dequeued item back at once (not done with it)."""
        with write_tx(self.core) as conn:
            self._exists(conn, name)
            it = self._item(conn, name, int(item_id))
            if it.lease_until_ms is None:
                raise QueueError(f"item {item_id} of queue {name!r} is not in flight")
            conn.execute("UPDATE queue_items SET lease_until_ms=NULL WHERE id=?", (it.id,))

    def recover(self, name: str | None = None) -> int:
        """After a crash: every in-flight item of ``name`` (None: of every
        queue) is visible again, at once. Returns how many."""
        with write_tx(self.core) as conn:
            if name is None:
                return int(conn.execute("UPDATE queue_items SET lease_until_ms=NULL"
                                        " WHERE lease_until_ms IS NOT NULL").rowcount)
            self._exists(conn, name)
            return int(conn.execute("UPDATE queue_items SET lease_until_ms=NULL WHERE queue=?"
                                    " AND lease_until_ms IS NOT NULL", (name,)).rowcount)

    def peek(self, name: str, *, limit: int = 100) -> list[QueueItem]:
        """Items in order, without leasing them."""
        self._exists(self.core.conn, name)
        rows = self.core.conn.execute("SELECT id FROM queue_items WHERE queue=? ORDER BY id LIMIT ?", (name, limit))
        return [self._item(self.core.conn, name, i) for (i,) in rows.fetchall()]

    def stats(self, name: str | None = None, *, now_ms_: int | None = None) -> list[QueueStats]:
        """Counts per queue (one queue, or all by name)."""
        ts = now_ms() if now_ms_ is None else now_ms_
        if name is not None:
            self._exists(self.core.conn, name)
        rows = self.core.conn.execute(
            f"SELECT {_STATS_COLS} FROM queues q LEFT JOIN queue_items i ON i.queue = q.name"
            + (" WHERE q.name=?" if name is not None else "")
            + " GROUP BY q.name ORDER BY q.name",
            (ts, ts, *((name,) if name is not None else ())),
        )
        return [QueueStats(**r._asdict()) for r in map(_QueueCounts._make, rows)]

