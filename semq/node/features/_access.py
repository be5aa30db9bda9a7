"""What the seed capabilities (transactions, request/reply, dead letters,
local queues) share: how they reach a node's store and how they write to it.

They run next to NodeCore on the same SQLite file, with their own
connection (an application process, the CLI, or a task of the node daemon)
or on a NodeCore they are given. Every write is one ``BEGIN IMMEDIATE``
transaction; events for the delivery log are kept back until it committed
(docs/events.md: the log never claims more than the store holds).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


@contextmanager
def write_tx(core: NodeCore) -> Iterator[sqlite3.Connection]:
    """One write transaction on the node store (``NodeCore.transaction``:
    BEGIN IMMEDIATE, records logged inside it reach the delivery log after
    the commit, the store's errors translated: StoreError with nothing
    written). Yields the connection for the feature's own tables; the
    node's tables are its owners' (``core.outbox``, ``core.inbox``, ...),
    whose methods join the transaction, as ``accept`` does."""
    with core.transaction():
        yield core.conn


def log_events(core: NodeCore, records: list[dict[str, Any]]) -> None:
    """Log records (inside ``write_tx``: kept until the commit)."""
    if core.log is not None and records:
        core.log.write(records)
