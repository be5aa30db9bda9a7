"""What the seed capabilities (transactions, request/reply, dead letters,
local queues) share: how they reach a node's store and how they write to it.

They run next to NodeCore on the same SQLite file, with their own
connection (an application process, the CLI, or a task of the node daemon)
or on a NodeCore they are given. Every write is one ``BEGIN IMMEDIATE``
transaction; events for the delivery log are held back until it committed
(docs/events.md: the log never claims more than the store holds).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from peewee import DatabaseError

from semq.store.db import translate
from semq.tracking.events import EventLog

from ..core import NodeCore

if TYPE_CHECKING:
    from ..api import NodeClient

__all__ = ["core_of", "log_events", "node_dir", "write_tx"]


def core_of(node: NodeClient | NodeCore) -> NodeCore:
    """The NodeCore behind a NodeClient (or the core itself)."""
    if isinstance(node, NodeCore):
        return node
    core = getattr(node, "core", None)
    if not isinstance(core, NodeCore):
        raise TypeError(f"expected a NodeClient or NodeCore, got {type(node).__name__}")
    return core


def node_dir(node: NodeClient | NodeCore) -> Path:
    """The node's data directory (the store lives at DIR/node.sqlite)."""
    return core_of(node).path.parent


class _HeldEvents(EventLog):
    """Collects the records NodeCore (and we) log inside a transaction that
    is not committed yet; they are written to the real log after COMMIT."""

    def __init__(self) -> None:
        super().__init__(Path("."), "", "")
        self.records: list[dict[str, Any]] = []

    def write(self, records: list[dict[str, Any]]) -> None:
        self.records.extend(records)

    def close(self) -> None:
        pass


@contextmanager
def write_tx(core: NodeCore) -> Iterator[sqlite3.Connection]:
    """One write transaction on the node store (BEGIN IMMEDIATE, so the busy
    timeout applies when the daemon writes at the same time). NodeCore
    methods called inside it (``accept``) join it as a savepoint: their rows
    commit or vanish together with ours. Log records written through
    ``core.log`` inside it reach the delivery log only after the commit.

    Raises StoreError (disk full, read-only, locked) with nothing written."""
    real = core.log
    held = _HeldEvents()
    core.log = held if real is not None else None
    try:
        with core.db.atomic("IMMEDIATE"):
            core.reread_send_order()  # a requeued dead letter is SS_INIT again
            yield core.conn
    except (sqlite3.Error, DatabaseError) as e:
        raise translate(e, core.path, "node store") from e
    finally:
        core.log = real
    if real is not None and held.records:
        real.write(held.records)


def log_events(core: NodeCore, records: list[dict[str, Any]]) -> None:
    """Log records (inside ``write_tx``: held until the commit)."""
    if core.log is not None and records:
        core.log.write(records)
