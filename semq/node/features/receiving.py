"""What ``semq receive`` keeps in the store: the tries of the documents its
command failed for, and the documents it parked (the receiving side's dead
letters). One row per inbox document of this store (``receive_tries``,
schema ``_v11_receive``); the row goes in the transaction that
acknowledges the document, so "acknowledged" and "no tries left over" are
one commit. Rows survive a restart of ``semq receive``: a document's tries
go on counting where they were. The rows are the inbox's owner's
(semq.node.receiver.inbox): tries and acknowledgement are one state
machine."""

from __future__ import annotations

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


def _node_id(node: NodeClient, unit: int, row: int) -> int:
    return node._item_id(unit, row)


def tries(node: NodeClient, *, clean: bool = False) -> dict[int, TryRow]:
    """Every unit's rows, by the node's inbox id; ``clean``: first drop the
    rows of documents acknowledged elsewhere (``semq inbox ack``)."""
    out = {}
    for core in node.cores:
        if clean:
            with core.transaction():
                rows = core.inbox.tries(TryRow, clean=True)
        else:
            rows = core.inbox.tries(TryRow)
        for r in rows:
            nid = _node_id(node, core.unit, r.inbox_id)
            out[nid] = r._replace(inbox_id=nid)
    return out


def acknowledge(node: NodeClient, item: InboxItem) -> bool:
    """The command took ``item``: acknowledged and its tries forgotten, in
    one transaction. False when it was acknowledged already."""
    core, row = node._unit_core(item.id)
    with core.transaction():
        return core.inbox.taken(row, int(time.time() * 1000))


def failed(node: NodeClient, item: InboxItem, *, code: int | None, stderr_tail: str, next_ms: int,
           park: bool) -> TryRow:
    """One more failed try of ``item`` (committed): its exit status, the
    end of its stderr, when the next is due; ``park``: no more tries."""
    core, row = node._unit_core(item.id)
    ts = int(time.time() * 1000)
    with core.transaction():
        core.inbox.failed_try(row, ts, code=code, stderr_tail=stderr_tail[-STDERR_TAIL:], next_ms=next_ms, park=park)
        got = core.inbox.tries_of(TryRow, row)
    assert got is not None
    return got._replace(inbox_id=item.id)


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
        core, row = node._unit_core(item_id)
    except KeyError:
        raise KeyError(f"document {item_id} is not in the inbox") from None
    ts = int(time.time() * 1000)
    with core.transaction():
        got = core.inbox.tries_of(TryRow, row)
        if got is None or got.parked_ms is None:
            raise KeyError(f"document {item_id} is not parked" if core.inbox.unread(row)
                           else f"document {item_id} is not in the inbox")
        core.inbox.retry(row, ts)
    return got._replace(inbox_id=item_id, tries=0, parked_ms=None, next_ms=ts)
