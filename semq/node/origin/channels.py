"""Ordered channels, the origin's side (SPEC "Ordered channels"; the chain
rules are in semq.node.envelope; the receiver's side is
semq.node.receiver.channels), and the one owner of ``channel_out``.

Each ordered document names the one before it in its (target, channel):
``ChannelsOut`` keeps the record id handed out last per channel, written
in the transaction that accepts the documents it numbers.

An ordered document that fails (refused, dropped, expired) is announced by
a gap notice in its place (``gap_notices``), so the receiver's channel
moves on and its application is told; the failed row is marked announced
in the same transaction (semq.node.origin.outbox). A purged dead letter is
announced the same way first.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from semq.umxt_protocol import AppKey

from ..batch import NodeContext
from ..envelope import GAP_DOMAIN, GAP_TYPE
from .documents import NewDocument
from .outbox import Outbox

__all__ = ["ChannelsOut", "gap_notices"]


class ChannelsOut:
    """The last record id of each of our ordered channels (``channel_out``)."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    def last(self, target: str, channel: str) -> int:
        """The record id of the document accepted last in (``target``,
        ``channel``): what the next one follows (0: none yet)."""
        row = self.ctx.conn.execute("SELECT last_id FROM channel_out WHERE target_id=? AND channel=?",
                                    (target, channel)).fetchone()
        return int(row[0]) if row else 0

    def advance(self, last: Mapping[tuple[str, str], int]) -> None:
        """The channels' new last record ids, in the accepting transaction."""
        self.ctx.conn.executemany("INSERT OR REPLACE INTO channel_out (target_id, channel, last_id) VALUES (?,?,?)",
                                  [(*k, v) for k, v in last.items()])


class _Failed(NamedTuple):
    """What a gap notice says of the failed ordered document it stands for."""

    id: int
    target_id: str
    channel: str
    prev_id: int
    code: int
    from_user: str
    to_user: str
    priority: int


def gap_notices(outbox: Outbox, me: str, unit: int, *, encrypt: bool,
                ids: Iterable[int] | None = None, limit: int = 1000) -> tuple[list[NewDocument], list[int]]:
    """The gap notices for failed ordered documents not announced yet
    (``ids``: only those, e.g. dead letters about to be purged): the
    NewDocuments to accept, and the failed rows to mark announced — in
    the same transaction."""
    rows = outbox.gaps(_Failed, None if ids is None else list(ids), limit)
    docs = []
    for r in rows:
        lk0 = f"{me}/{unit}/1/{r.id}"
        docs.append(NewDocument(
            target=r.target_id, app_data=json.dumps({"lk0": lk0, "code": int(r.code)}).encode(),
            app_key=AppKey(domain=GAP_DOMAIN, data_type=GAP_TYPE, subtype=r.channel, key=lk0),
            priority=r.priority, encrypt=encrypt, from_user=r.from_user, to_user=r.to_user, channel=r.channel,
            skipped=r.id, gap_prev=r.prev_id))
    return docs, [r.id for r in rows]
