"""What every owner of a node table shares (docs/architecture.md, "The
node: who owns which table"): rows read by name, and the contract of the
writes an owner defers.

- **Rows by name.** Every row read from the store is a ``NamedTuple``
  whose fields name the columns, and the SELECT list is made from those
  fields (``columns``): a moved or renamed column fails loudly (SQLite: "no
  such column"), never silently as a shifted index would. A table's owner
  keeps the rows its state machine reads; a reader asking an owner's
  query API may bring a row type of its own (the owner builds the SELECT).
- **Deferred writes** (the write-behind: docs/design.md, "States held in
  memory for up to a second"). A write that promises nothing to anyone
  and that the next frame usually makes moot waits in memory for up to
  ``DEFER_MS``: the origin's SS_SENT and SS_ACK_FWD (semq.node.origin.outbox),
  a new pending-ack row (semq.node.receiver.pending_ack). The owner that
  defers a write keeps it, answers with it (its queries merge what it
  defers: nobody writes it "first" to ask), and writes it when
  ``NodeCore`` says (``Deferred``): the next batch, an inquiry round, a new
  session, a clean stop. Lost in a crash, nothing sent depends on it.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

from semq.store.db import HOLD_MS

__all__ = ["DEFER_MS", "MAX_INQUIRY_BACKOFF_MS", "Deferred", "columns", "first_inquiry"]

#: How long a deferred write waits at most before the next batch writes it
#: (the store layer's name for it is HOLD_MS, shared with the platform).
DEFER_MS: Final = HOLD_MS
MAX_INQUIRY_BACKOFF_MS: Final = 15 * 60 * 1000  # long-offline targets: ask at most every 15 min

# Fields read by an expression, not a column of their name: a pending row's
# ``size`` is its AppData's; an inbox row's ``large_size`` is the column
# ``size`` (a large document's, whose AppData is empty).
_COMPUTED: Final = {"size": "length(app_data)", "large_size": "size"}


def columns(row: type[tuple[Any, ...]]) -> str:
    """The SELECT list of a named row type."""
    return ", ".join(_COMPUTED.get(f, f) for f in row._fields)  # type: ignore[attr-defined]


def first_inquiry(ts: int, attempts: int, inquiry_ms: int) -> int:
    """When a row in a new state (at ``ts``, after ``attempts`` sends)
    asks first: one interval later, doubled per resend (SPEC A.3; the SQL
    of the outbox's updates computes the same from the row's attempts)."""
    return ts + min(MAX_INQUIRY_BACKOFF_MS, inquiry_ms * (1 << min(max(attempts - 1, 0), 6)))


class Deferred(Protocol):
    """An owner that defers writes (NodeCore writes them all together, in
    the owners' order, inside its transaction)."""

    def __bool__(self) -> bool:
        """Whether anything is deferred."""
        ...

    def write_deferred(self, before_ms: int | None = None) -> None:
        """Write what is deferred (all of it, or what was deferred at or
        before ``before_ms``), inside the caller's transaction."""
        ...

    def drop_deferred(self) -> None:
        """The transaction did not commit: what is deferred may have
        changed in it; dropped, as a crash would drop it."""
        ...
