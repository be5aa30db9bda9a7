"""The console's views of the platform's store and its actions on the stored
copies (``semq admin``: semq.ops.handlers.platform), as the owners answer
them.

Each view answers with the copies' real state: the deliveries whose
``SS_SENT`` is held in memory are written first (in a transaction of their
own, when there are any: docs/design.md, "States held in memory"), so a
selection by state finds them where the platform knows they are. An action
selects and applies in one transaction, only as ``STORED_OPERATOR_TABLE``
says (semq.platform.engine)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Final

from semq.node.engine import OperatorAction
from semq.umxt_protocol import NodeType

from .copies import StoredCopies
from .engine import STORED_OPERATOR_TABLE, StoredState
from .nodes import Nodes
from .seen import SeenDocuments
from .views import OrgRow, SeenRow, StoredAdminRow, StoredSelection, StoredStatus

__all__ = ["Operator"]


# The copies of one document shown at most: one per route it was stored
# for, and one more per resend while a copy was delivered.
_COPIES_MAX: Final = 10_000
_ORG: Final = int(NodeType.ORGANIZATION)


def _applies(state: int, action: OperatorAction) -> bool:
    try:
        return (StoredState(state), action) in STORED_OPERATOR_TABLE
    except ValueError:  # a state this version does not know
        return False


class Operator:
    """The console's views and actions, on the store thread.
    ``write_held_now`` writes what is held (its own transaction); ``tx``
    is the facade's transaction (semq.platform.core)."""

    def __init__(self, copies: StoredCopies, seen: SeenDocuments, nodes: Nodes,
                 write_held_now: Callable[[], None], tx: Callable[[], AbstractContextManager[None]]) -> None:
        self.copies = copies
        self.seen = seen
        self.nodes = nodes
        self._write_held_now = write_held_now
        self._tx = tx

    def status(self) -> StoredStatus:
        """Rows per target, kind and state; the organizations; the oldest document."""
        self._write_held_now()
        return StoredStatus(self.copies.depths(), self.nodes.rows(), self.copies.oldest_ms())

    def organizations(self, limit: int) -> tuple[list[OrgRow], dict[str, tuple[int, int]], dict[str, int]]:
        """The organizations (at most ``limit``, by id), the DATA copies
        stored per target route (how many, the oldest), and the bytes each
        organization's documents take here (what its quota counts)."""
        self._write_held_now()
        orgs = self.nodes.listing(limit)
        used = {o.node_id: self.copies.bytes_of(_ORG, o.node_id) for o in orgs}
        return orgs, self.copies.totals().per_target, used

    def rows(self, sel: StoredSelection, limit: int, *, oldest_first: bool = False) -> list[StoredAdminRow]:
        """The rows ``sel`` selects (semq.platform.copies.StoredCopies.select)."""
        self._write_held_now()
        return self.copies.select(sel, limit, oldest_first=oldest_first)

    def show(self, rid: int | None, lk0: tuple[str, int, int, int] | None) -> tuple[list[StoredAdminRow],
                                                                                  SeenRow | None]:
        """The row ``rid``, or the copies of the document ``lk0`` (origin
        id, semq id, db id, record id), and what became of the document."""
        self._write_held_now()
        if rid is not None:
            rows = self.copies.select(StoredSelection(ids=(rid,)), 1)
        else:
            rows = self.copies.select(StoredSelection(document=lk0), _COPIES_MAX)
        key = lk0 if lk0 is not None else (rows[0].lk0_key if rows else None)
        return rows, None if key is None else self.seen.find(*key)

    def stuck(self, before_ms: int, limit: int) -> tuple[list[StoredAdminRow], int, int]:
        """The rows stored before ``before_ms``, oldest first (at most
        ``limit``), and how many there are: (rows, DATA, relayed)."""
        self._write_held_now()
        rows = self.copies.select(StoredSelection(stored_before_ms=before_ms), limit, oldest_first=True)
        return (rows, *self.copies.older(before_ms))

    def apply(self, action: OperatorAction, sel: StoredSelection, *, limit: int,
              dry: bool) -> tuple[list[StoredAdminRow], bool, list[StoredAdminRow]]:
        """``action`` on the rows ``sel`` selects, at most ``limit`` of them
        in one transaction: (the rows selected, whether there were more,
        those whose state it applies to — changed, unless ``dry``)."""
        with self._tx():
            self.copies.write_held()  # the states the operator selects by are on disk
            rows = self.copies.select(sel, limit + 1)
            more, rows = len(rows) > limit, rows[:limit]
            ok = [r for r in rows if _applies(r.state, action)]
            if not dry:
                self.copies.operator_apply(action, [(r.id, r.state) for r in ok])
        return rows, more, ok
