"""Ordered channels, the origin's side (SPEC "Ordered channels"; the
receiver's side is semq.node.receiver.channels).

An ordered document that fails (refused, dropped, expired) is announced by
a gap notice in its place (``gap_notices``), so the receiver's channel
moves on and its application is told; the failed row is marked ``gap = 1``
in the same transaction. A purged dead letter is announced the same way
first.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import Any, Final

from semq.umxt_protocol import AppKey

from ..engine import SendState
from ..envelope import GAP_DOMAIN, GAP_TYPE

__all__ = ["gap_notices", "gaps_due"]

_FAILED: Final = int(SendState.SS_FAILED)


def gaps_due(conn: sqlite3.Connection) -> bool:
    """Whether a failed ordered document waits for its gap notice."""
    return conn.execute(f"SELECT 1 FROM outbox WHERE channel != '' AND gap = 0 AND state = {_FAILED}"
                        " LIMIT 1").fetchone() is not None


def gap_notices(conn: sqlite3.Connection, me: str, unit: int, *, encrypt: bool,
                ids: Iterable[int] | None = None, limit: int = 1000) -> tuple[list[Any], list[int]]:
    """The gap notices for failed ordered documents not announced yet
    (``ids``: only those, e.g. dead letters about to be purged): the
    NewDocuments to accept, and the failed rows to mark ``gap = 1`` — in
    the same transaction."""
    from .role import NewDocument

    cols = "id, target_id, channel, prev_id, code, from_user, to_user, priority"
    if ids is None:
        rows = conn.execute(f"SELECT {cols} FROM outbox WHERE channel != '' AND gap = 0 AND state = {_FAILED}"
                            " ORDER BY id LIMIT ?", (limit,)).fetchall()
    else:
        wanted = list(ids)
        rows = [r for i in wanted for r in conn.execute(
            f"SELECT {cols} FROM outbox WHERE id=? AND channel != '' AND gap = 0", (i,)).fetchall()]
    docs = []
    for rid, target, channel, prev, code, from_user, to_user, priority in rows:
        lk0 = f"{me}/{unit}/1/{rid}"
        docs.append(NewDocument(
            target=target, app_data=json.dumps({"lk0": lk0, "code": int(code)}).encode(),
            app_key=AppKey(domain=GAP_DOMAIN, data_type=GAP_TYPE, subtype=channel, key=lk0),
            priority=priority, encrypt=encrypt, from_user=from_user, to_user=to_user, channel=channel,
            skipped=rid, gap_prev=prev))
    return docs, [r[0] for r in rows]
