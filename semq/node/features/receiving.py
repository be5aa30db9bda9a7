"""What ``semq receive`` keeps in the store: the tries of the documents its
command failed for, and the documents it parked (the receiving side's dead
letters). One row per inbox document of this store (``receive_tries``,
schema ``_v11_receive``); the row goes in the transaction that
acknowledges the document, so "acknowledged" and "no tries left over" are
one commit. Rows survive a restart of ``semq receive``: a document's tries
go on counting where they were."""

from __future__ import annotations

import sqlite3
import time
from typing import Final, NamedTuple

from ..api import InboxItem, NodeClient

__all__ = ["STDERR_TAIL", "TryRow", "acknowledge", "failed", "parked", "retry", "tries"]

STDERR_TAIL: Final = 2000  # characters of a failed run's stderr kept (its end)


class TryRow(NamedTuple):
    """A document's tries (``inbox_id``: the node's id, semq.node.api.UNIT_IDS)."""

    inbox_id: int
    tries: int
    last_code: int | None  # exit status of the last run; negative: killed by that signal
    stderr_tail: str
    first_ms: int
    last_ms: int
    next_ms: int  # when the next try is due
    parked_ms: int | None  # set once parked: not tried again until ``retry``


_COLS: Final = "inbox_id, tries, last_code, stderr_tail, first_ms, last_ms, next_ms, parked_ms"


def _node_id(node: NodeClient, unit: int, row: int) -> int:
    return node._item_id(unit, row)


def tries(node: NodeClient, *, clean: bool = False) -> dict[int, TryRow]:
    """Every unit's rows, by the node's inbox id; ``clean``: first drop the
    rows of documents acknowledged elsewhere (``semq inbox ack``)."""
    out = {}
    for core in node.cores:
        conn = core.conn
        if clean:
            with core.db.atomic("IMMEDIATE"):
                conn.execute("DELETE FROM receive_tries WHERE inbox_id NOT IN"
                             " (SELECT id FROM inbox WHERE consumed_ms IS NULL)")
        for r in map(TryRow._make, conn.execute(f"SELECT {_COLS} FROM receive_tries")):
            nid = _node_id(node, core.unit, r.inbox_id)
            out[nid] = r._replace(inbox_id=nid)
    return out


def _where(node: NodeClient, item_id: int) -> tuple[sqlite3.Connection, object, int]:
    core, row = node._unit_core(item_id)
    return core.conn, core.db, row


def acknowledge(node: NodeClient, item: InboxItem) -> bool:
    """The command took ``item``: acknowledged and its tries forgotten, in
    one transaction. False when it was acknowledged already."""
    conn, db, row = _where(node, item.id)
    ts = int(time.time() * 1000)
    with db.atomic("IMMEDIATE"):  # type: ignore[attr-defined]
        n = conn.execute("UPDATE inbox SET consumed_ms=? WHERE id=? AND consumed_ms IS NULL", (ts, row)).rowcount
        conn.execute("DELETE FROM receive_tries WHERE inbox_id=?", (row,))
    return bool(n)


def failed(node: NodeClient, item: InboxItem, *, code: int | None, stderr_tail: str, next_ms: int,
           park: bool) -> TryRow:
    """One more failed try of ``item`` (committed): its exit status, the
    end of its stderr, when the next is due; ``park``: no more tries."""
    conn, db, row = _where(node, item.id)
    ts = int(time.time() * 1000)
    tail = stderr_tail[-STDERR_TAIL:]
    with db.atomic("IMMEDIATE"):  # type: ignore[attr-defined]
        conn.execute(
            "INSERT INTO receive_tries (inbox_id, tries, last_code, stderr_tail, first_ms, last_ms, next_ms,"
            " parked_ms) VALUES (?, 1, ?, ?, ?, ?, ?, ?) ON CONFLICT (inbox_id) DO UPDATE SET"
            " tries = tries + 1, last_code = excluded.last_code, stderr_tail = excluded.stderr_tail,"
            " last_ms = excluded.last_ms, next_ms = excluded.next_ms, parked_ms = excluded.parked_ms",
            (row, code, tail, ts, ts, next_ms, ts if park else None))
        got = conn.execute(f"SELECT {_COLS} FROM receive_tries WHERE inbox_id=?", (row,)).fetchone()
    return TryRow._make(got)._replace(inbox_id=item.id)


def parked(node: NodeClient) -> list[tuple[TryRow, InboxItem]]:
    """The parked documents, oldest first, with their inbox documents."""
    out = []
    for nid, t in tries(node, clean=True).items():
        if t.parked_ms is None:
            continue
        try:
            out.append((t, node.get(nid)))
        except KeyError:
            continue
    out.sort(key=lambda p: (p[0].parked_ms or 0, p[0].inbox_id))
    return out


def retry(node: NodeClient, item_id: int) -> TryRow:
    """Un-park a document: its tries start again from 0 and it is due now
    (a running ``semq receive`` takes it at its next wake, within
    semq.session.inbox_wait.MAX_WAIT seconds; else the next one started). Raises
    KeyError naming what is wrong."""
    try:
        conn, db, row = _where(node, item_id)
    except KeyError:
        raise KeyError(f"document {item_id} is not in the inbox") from None
    ts = int(time.time() * 1000)
    with db.atomic("IMMEDIATE"):  # type: ignore[attr-defined]
        got = conn.execute(f"SELECT {_COLS} FROM receive_tries WHERE inbox_id=?", (row,)).fetchone()
        if got is None or TryRow._make(got).parked_ms is None:
            unread = conn.execute("SELECT 1 FROM inbox WHERE id=? AND consumed_ms IS NULL", (row,)).fetchone()
            raise KeyError(f"document {item_id} is not parked" if unread
                           else f"document {item_id} is not in the inbox")
        conn.execute("UPDATE receive_tries SET tries=0, parked_ms=NULL, next_ms=? WHERE inbox_id=?", (ts, row))
    return TryRow._make(got)._replace(inbox_id=item_id, tries=0, parked_ms=None, next_ms=ts)
