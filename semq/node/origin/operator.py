"""The operator's and the node features' transitions of pending-send rows,
applied to the store: the admin console's requeue / resend / purge
(docs/operations.md) and the dead letters' requeue, purge and rules
(semq.node.features.dead). What each action may do to which state is decided by
``OPERATOR_TABLE`` (semq.node.engine); the pending-send table's owner
(semq.node.origin.outbox) writes it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final

from ..engine import OperatorAction, SendState, TransitionRefused, operator_step
from .outbox import Outbox

__all__ = ["Operator"]

_STATES: Final = {int(s): s for s in SendState}


class Operator:
    """The operator's and the node features' transitions of pending-send rows."""

    def __init__(self, outbox: Outbox, announce_gaps: Callable[[list[int]], int] | None = None) -> None:
        self.outbox = outbox
        # Queues the gap notices of ordered documents about to be deleted
        # (semq.node.origin.channels), in the caller's transaction.
        self.announce_gaps = announce_gaps

    def apply(self, action: OperatorAction, rows: Sequence[tuple[int, int]], ts: int, *, code: int = 0,
              expires: Mapping[int, int | None] | None = None) -> list[int]:
        """Apply ``action`` to ``rows`` ((id, state as read in the caller's
        transaction)) where OPERATOR_TABLE allows it; returns the ids it
        applied to (a row in a state the action does not apply to is left
        as it is). ``expires``: a requeued row's new expiry, per id. Inside
        the caller's transaction, on the states as read there (the owner's
        real states: semq.node.origin.outbox.Outbox.rows)."""
        deletes: list[tuple[int, int]] = []
        moves: list[dict[str, object]] = []
        done: list[int] = []
        announced: set[int] = set()
        if action is OperatorAction.REQUEUE and rows:
            # An ordered document whose receiver was told it failed (a gap
            # notice took its place) cannot go again under the same LK0: its
            # channel has moved on. It is left failed; send it anew.
            # (Few rows: failed ordered documents, kept FAILED_RETENTION_MS;
            # read through the send-order index's state.)
            announced = self.outbox.announced()
        for rid, state_no in rows:
            if rid in announced:
                continue
            state = _STATES.get(state_no)
            if state is None:
                continue  # a state this version does not know: left alone
            try:
                nxt = operator_step(state, action, record=rid)
            except TransitionRefused:
                continue
            done.append(rid)
            if nxt is None:
                deletes.append((rid, state_no))
            else:
                move: dict[str, object] = {"id": rid, "old": state_no, "new": int(nxt), "ts": ts, "code": code}
                if expires is not None:
                    move["expires"] = expires.get(rid)
                moves.append(move)
        if deletes and self.announce_gaps is not None:
            self.announce_gaps([rid for rid, _ in deletes])
        self.outbox.operate(action, deletes, moves, expiry=expires is not None)
        return done
