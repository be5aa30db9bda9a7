"""The platform's SEMQ rules, sans-IO (SPEC "The flow", P.1-P.4): where a
DATA goes (``route``), how a stored copy moves (``STORED_TABLE``), and what
the operator's actions do to one (``STORED_OPERATOR_TABLE``, over the
actions the node's engine defines: this module imports it, never the other
way)."""

from __future__ import annotations

from enum import Enum, IntEnum
from functools import lru_cache
from typing import Final

from semq.node.engine import ActionTable, OperatorAction  # the same layer: the engines, one way
from semq.umxt_protocol import InquiryResult, ResultCode

__all__ = [
    "STORED_OPERATOR",
    "STORED_OPERATOR_TABLE",
    "STORED_TABLE",
    "Route",
    "StoredEvent",
    "StoredState",
    "route",
    "state_answer",
    "stored_operator_states",
    "stored_operator_step",
    "stored_step",
]


class Route(Enum):
    FORWARD = "forward"  # target online: send at once, answer ACK_FWD
    STORE = "store"  # target offline, SaveFwd >= 2: keep, answer ACK_SAVE
    DROP = "drop"  # target offline, SaveFwd 1: discard, answer NACK 301
    DISCARD = "discard"  # best effort to an offline target: nothing at all
    REFUSE = "refuse"  # unknown target or expired: NACK with the code


@lru_cache(maxsize=256)  # pure, small domain
def route(*, known: bool, online: bool, save_fwd: int, reliable: bool, expired: bool) -> tuple[Route, ResultCode]:
    """Where a DATA frame goes (P.1). A target with a full outgoing queue
    counts as offline (flow control: stored, never buffered in memory)."""
    if not known:
        return Route.REFUSE, ResultCode.UNKNOWN_TARGET
    if expired:
        return (Route.REFUSE if reliable else Route.DISCARD), ResultCode.EXPIRED
    if online:
        return Route.FORWARD, ResultCode.OK
    if not reliable:
        return Route.DISCARD, ResultCode.TARGET_OFFLINE_DROPPED
    if save_fwd <= 1:
        return Route.DROP, ResultCode.TARGET_OFFLINE_DROPPED
    return Route.STORE, ResultCode.OK


class StoredState(IntEnum):
    """States of the platform's stored copies (ids form LK1)."""

    SS_INIT = 0  # stored, not delivered
    SS_SENT = 1  # delivered to the target, its ACK outstanding
    SS_ACK = 3  # the target acked it: may be deleted (SPEC P.2)


class StoredEvent(Enum):
    __hash__ = object.__hash__  # a hot dict key: identity hash in C (Enum's is hash(name), in Python)

    DELIVERED = "delivered"  # written to the target
    ACK = "ack"  # the target's ACK
    TARGET_HAS = "target_has"  # inquiry answer RECEIVED
    TARGET_LACKS = "target_lacks"  # inquiry answer NOT_RECEIVED: deliver again
    TARGET_ASKS = "target_asks"  # the target asks about this record: it has it
    RECONNECTED = "reconnected"  # the target reconnected: in-flight copies go again


P = StoredState
_E = StoredEvent

STORED_TABLE: Final[dict[tuple[StoredState, StoredEvent], StoredState]] = {
    (P.SS_INIT, _E.DELIVERED): P.SS_SENT,
    (P.SS_INIT, _E.ACK): P.SS_ACK,
    (P.SS_INIT, _E.TARGET_HAS): P.SS_ACK,
    (P.SS_INIT, _E.TARGET_ASKS): P.SS_ACK,
    (P.SS_SENT, _E.DELIVERED): P.SS_SENT,
    (P.SS_SENT, _E.ACK): P.SS_ACK,
    (P.SS_SENT, _E.TARGET_HAS): P.SS_ACK,
    (P.SS_SENT, _E.TARGET_LACKS): P.SS_INIT,
    (P.SS_SENT, _E.TARGET_ASKS): P.SS_ACK,
    (P.SS_SENT, _E.RECONNECTED): P.SS_INIT,
}


def stored_step(state: StoredState, event: StoredEvent) -> StoredState:
    """Next state of a stored copy; unknown pairs leave it unchanged.
    SS_ACK rows are deleted at once (SPEC P.2: safe even if the ReAck is lost)."""
    return STORED_TABLE.get((state, event), state)


def state_answer(state: StoredState | None) -> InquiryResult:
    """SPEC B.2: the answer to a receiver asking about a stored copy."""
    if state is None:
        return InquiryResult.NO_RECORD
    if state is P.SS_ACK:
        return InquiryResult.ALREADY_ACKED
    return InquiryResult.MARKED_ACKED


# ---------------------------------------------------------------- the operator's actions

_A = OperatorAction

#: The platform's stored copies (SPEC P.2, P.3): requeue and resend are one
#: (it has no failed state): a copy delivered and not acked goes again; purge
#: deletes any copy (the origin of a SaveFwd 3 document still asks for it).
STORED_OPERATOR_TABLE: Final[dict[tuple[StoredState, OperatorAction], StoredState | None]] = {
    (P.SS_SENT, _A.REQUEUE): P.SS_INIT,
    (P.SS_ACK, _A.REQUEUE): P.SS_INIT,
    (P.SS_SENT, _A.RESEND): P.SS_INIT,
    (P.SS_ACK, _A.RESEND): P.SS_INIT,
    (P.SS_INIT, _A.PURGE): None,
    (P.SS_SENT, _A.PURGE): None,
    (P.SS_ACK, _A.PURGE): None,
}
STORED_OPERATOR: Final = ActionTable(STORED_OPERATOR_TABLE, "stored copy")


def stored_operator_step(state: StoredState, action: OperatorAction, *,
                         record: int | None = None) -> StoredState | None:
    """The next state of a stored copy after ``action`` (None: delete it).
    Raises TransitionRefused (semq.node.engine) for a state the action does
    not apply to."""
    return STORED_OPERATOR.step(state, action, record)


def stored_operator_states(action: OperatorAction) -> tuple[StoredState, ...]:
    """The stored-copy states ``action`` applies to, in state order."""
    return STORED_OPERATOR.states(action)
