"""The SEMQ state machines of a node, sans-IO (SPEC "States", "The flow").

Two roles live in a node: the **origin** (pending-send table, seed tb_0031)
and the **receiver** (pending-ack table, seed tb_0030). Each is one table of
``(state, event) -> outcome``; pairs not in a table leave the row unchanged
(a late or duplicate frame must never move a row backwards). The daemons
apply an outcome to the store and send what it says only after the commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum, IntEnum
from functools import lru_cache
from typing import Final, Generic, TypeVar

from semq.umxt_protocol import SaveFwd

__all__ = [
    "BY_SAVE_FWD",
    "EDGE_TABLE",
    "OPERATOR",
    "OPERATOR_TABLE",
    "ORIGIN_TABLE",
    "PENDING_ACK_TABLE",
    "TX",
    "TX_TABLE",
    "AckEvent",
    "AckStatus",
    "ActionTable",
    "EdgeEvent",
    "EdgeState",
    "OperatorAction",
    "OriginEvent",
    "OriginOutcome",
    "ReceiveDecision",
    "SendState",
    "TransitionRefused",
    "TxAction",
    "TxState",
    "edge_step",
    "operator_result",
    "operator_states",
    "operator_step",
    "origin_may_clean",
    "origin_step",
    "pending_ack_step",
    "receive_decision",
    "receiver_may_clean",
    "sql_in",
    "tx_result",
    "tx_states",
    "tx_step",
]


class SendState(IntEnum):
    """Pending-send row states (SPEC "States"); SS_FAILED is ours: the
    platform neither forwarded nor stored it (NACK), kept for the user."""

    # A hot dict key: int's C-level hash (Enum's is hash(name), in Python),
    # which also agrees with IntEnum's int equality.
    __hash__ = int.__hash__

    SS_INIT = 0  # not sent (or to be resent)
    SS_SENT = 1  # written to the platform, no ack yet
    SS_ACK_FWD = 2  # platform forwarded at once; confirmation is between A and B
    SS_ACK = 3  # platform stored it (ACK_SAVE), or the receiver acked the platform
    SS_ACK2 = 4  # end-to-end confirmed
    SS_FAILED = 9  # NACK: dropped (SaveFwd 1, target offline) or refused


class AckStatus(IntEnum):
    """Pending-ack statuses P_ACK_STATUS / S_ACK_STATUS (SPEC "States")."""

    AS_INIT = 0  # confirmation outstanding
    AS_ACK = 1  # confirmed (or never needed)


class OriginEvent(Enum):
    """What happens to one of our documents. Some outcomes depend on the
    document's guarantee (its SaveFwd): those events come in one variant
    per guarantee, and ``BY_SAVE_FWD`` names the variant a row's SaveFwd
    makes of the event its caller saw, so that every transition is a row
    of ``ORIGIN_TABLE``."""

    __hash__ = object.__hash__  # a hot dict key: identity hash in C (Enum's is hash(name), in Python)

    SENT = "sent"  # DATA written towards the platform
    SENT_DIRECT = "sent_direct"  # DATA handed to the target's own direct link (SaveFwd 2, 3: it may go again through the platform)
    SENT_DIRECT_ONCE = "sent_direct_once"  # ... a SaveFwd 1 document: the hand-over is what the relay's forward is, never sent through the platform after it
    ACK_FWD = "ack_fwd"  # platform forwarded it
    ACK_SAVE = "ack_save"  # platform stored it
    NACK = "nack"  # platform dropped / refused it
    ACK2 = "ack2"  # receiver confirmed delivery end to end
    PLATFORM_HAS = "platform_has"  # inquiry to P: RECEIVED (its ack was lost)
    PLATFORM_LACKS = "platform_lacks"  # inquiry to P: NOT_RECEIVED
    TARGET_HAS = "target_has"  # inquiry to B: RECEIVED
    TARGET_LACKS = "target_lacks"  # inquiry to B: NOT_RECEIVED, of a SaveFwd 3 document (must be delivered: sent again)
    TARGET_LACKS_STORED = "target_lacks_stored"  # ... of a SaveFwd 2 document (a stored copy is the platform's to deliver; a forwarded one nobody else holds)
    TARGET_LACKS_ONCE = "target_lacks_once"  # ... of a SaveFwd 1 document (at most once: not sent again, reported dropped, 301)
    TARGET_ASKS = "target_asks"  # B asks about our record: it has the message
    LINK_LOST = "link_lost"  # the direct link it was handed to broke before its answer came (SaveFwd 2, 3: sent again)
    LINK_LOST_ONCE = "link_lost_once"  # ... a SaveFwd 1 document (the target may hold it, its ACK2 lost with the link: asked, not sent again)
    EXPIRED = "expired"  # its expiry passed before it could be sent (SPEC A.2)
    CANNOT_SEND = "cannot_send"  # no way to the target (unknown to the platform, no certificate): given up


S = SendState
E = OriginEvent

#: (state, event) -> (next state, send REACK2). Anything else: unchanged.
ORIGIN_TABLE: Final[dict[tuple[SendState, OriginEvent], tuple[SendState, bool]]] = {
    (S.SS_INIT, E.SENT): (S.SS_SENT, False),
    (S.SS_INIT, E.SENT_DIRECT): (S.SS_SENT, False),
    # SaveFwd 1 on a direct link: handed to the target's link is what the
    # relay's forward is, and written so at once (never held): after a
    # crash the row must not be sent again through a platform that never
    # saw it and would drop it for a target offline there (reported
    # dropped, though delivered). Its inquiry asks the target.
    (S.SS_INIT, E.SENT_DIRECT_ONCE): (S.SS_ACK_FWD, False),
    # A resent row may still collect the answers to its earlier attempt.
    (S.SS_INIT, E.ACK2): (S.SS_ACK2, True),
    (S.SS_INIT, E.TARGET_HAS): (S.SS_ACK2, True),
    (S.SS_INIT, E.TARGET_ASKS): (S.SS_ACK2, False),
    (S.SS_INIT, E.EXPIRED): (S.SS_FAILED, False),
    (S.SS_INIT, E.CANNOT_SEND): (S.SS_FAILED, False),
    (S.SS_SENT, E.SENT): (S.SS_SENT, False),
    (S.SS_SENT, E.ACK_FWD): (S.SS_ACK_FWD, False),
    (S.SS_SENT, E.ACK_SAVE): (S.SS_ACK, False),
    (S.SS_SENT, E.NACK): (S.SS_FAILED, False),
    (S.SS_SENT, E.ACK2): (S.SS_ACK2, True),
    # P has it but did not say how (its ACK_FWD/ACK_SAVE was lost): assume
    # forwarded, the case where the origin must still confirm with B.
    (S.SS_SENT, E.PLATFORM_HAS): (S.SS_ACK_FWD, False),
    (S.SS_SENT, E.PLATFORM_LACKS): (S.SS_INIT, False),
    (S.SS_SENT, E.TARGET_HAS): (S.SS_ACK2, True),
    (S.SS_SENT, E.TARGET_ASKS): (S.SS_ACK2, False),
    # A direct link broke before the answer came: sent again, on whichever
    # path is up (the receiver suppresses a copy it already has) — except
    # SaveFwd 1, which is as if forwarded: the target may hold it already,
    # and a copy sent again through the platform while the target is
    # offline would be dropped there and reported dropped (301) though
    # delivered (scripts/chaos --seed 5 --docs 1000 --minutes 1 --orgs 4
    # --direct some). Its inquiry to the target settles it. A row answered
    # meanwhile (any other state) is left as it is.
    (S.SS_SENT, E.LINK_LOST): (S.SS_INIT, False),
    (S.SS_SENT, E.LINK_LOST_ONCE): (S.SS_ACK_FWD, False),
    (S.SS_ACK_FWD, E.ACK2): (S.SS_ACK2, True),
    (S.SS_ACK_FWD, E.TARGET_HAS): (S.SS_ACK2, True),
    # A forwarded row the target says it lacks: the platform kept no copy,
    # so SaveFwd 3 and 2 are sent again; SaveFwd 1 (at most once) ends
    # failed, reported dropped (code 301: docs/reliability.md, "when not
    # delivered, reported dropped").
    (S.SS_ACK_FWD, E.TARGET_LACKS): (S.SS_INIT, False),
    (S.SS_ACK_FWD, E.TARGET_LACKS_STORED): (S.SS_INIT, False),
    (S.SS_ACK_FWD, E.TARGET_LACKS_ONCE): (S.SS_FAILED, False),
    (S.SS_ACK_FWD, E.TARGET_ASKS): (S.SS_ACK2, False),
    (S.SS_ACK, E.ACK2): (S.SS_ACK2, True),
    # Stored rows ask the platform, which owns delivery (not the target,
    # which would say "not received" for every copy still queued and start
    # a resend storm after a long outage). Once the platform says its copy
    # went out and was ACKed (or a later resend was forwarded), the
    # end-to-end answer is the target's: ask it, as for a forwarded row.
    (S.SS_ACK, E.PLATFORM_HAS): (S.SS_ACK_FWD, False),
    (S.SS_ACK, E.ACK_FWD): (S.SS_ACK_FWD, False),
    (S.SS_ACK, E.PLATFORM_LACKS): (S.SS_INIT, False),
    (S.SS_ACK, E.TARGET_HAS): (S.SS_ACK2, True),
    # A stored row the target lacks: only a SaveFwd 3 one is sent again (the
    # origin keeps it until confirmed); a stored SaveFwd 2 copy is the
    # platform's to deliver (no row for TARGET_LACKS_STORED: unchanged).
    (S.SS_ACK, E.TARGET_LACKS): (S.SS_INIT, False),
    (S.SS_ACK, E.TARGET_ASKS): (S.SS_ACK2, False),
    # The target refused the document (bad signature, cannot decrypt): NACK
    # from B arrives after the platform's ack.
    (S.SS_INIT, E.NACK): (S.SS_FAILED, False),
    (S.SS_ACK_FWD, E.NACK): (S.SS_FAILED, False),
    (S.SS_ACK, E.NACK): (S.SS_FAILED, False),
    # B did not get our REACK2 and sent ACK2 again: answer again.
    (S.SS_ACK2, E.ACK2): (S.SS_ACK2, True),
}


_ONCE: Final = int(SaveFwd.DISCARD)
_STORED: Final = int(SaveFwd.STORE)

#: (event, a row's SaveFwd) -> the event it is for that row, where the
#: guarantee decides the outcome (absent: the event itself).
BY_SAVE_FWD: Final[dict[tuple[OriginEvent, int], OriginEvent]] = {
    (E.SENT_DIRECT, _ONCE): E.SENT_DIRECT_ONCE,
    (E.TARGET_LACKS, _ONCE): E.TARGET_LACKS_ONCE,
    (E.TARGET_LACKS, _STORED): E.TARGET_LACKS_STORED,
    (E.LINK_LOST, _ONCE): E.LINK_LOST_ONCE,
}


@dataclass(frozen=True, slots=True)
class OriginOutcome:
    state: SendState  # the row's new state
    changed: bool  # state differs from before
    reack2: bool  # send REACK2 to the receiver (after the commit)
    clean: bool  # the row may be deleted now (SPEC "Cleanup")
    event: OriginEvent  # the event as the row's guarantee made it (BY_SAVE_FWD)


def origin_may_clean(state: SendState, save_fwd: int, ack2: bool) -> bool:
    """SPEC A.6: a row may go once (SS_ACK and no Ack2 asked) or SS_ACK2.
    A forwarded (SS_ACK_FWD) row has only been handed to the connection to B,
    which may break: the platform kept no copy, so the origin confirms with B
    before it lets go — for SaveFwd 2|3 to resend, for SaveFwd 1 to report it
    dropped (docs/reliability.md: "when not delivered, reported dropped")."""
    if state in (S.SS_ACK2, S.SS_FAILED):
        return state is S.SS_ACK2
    if state is S.SS_ACK:
        return not ack2
    return False


@lru_cache(maxsize=1024)  # pure and small-domain: the hot path pays a dict look-up
def origin_step(state: SendState, event: OriginEvent, *, save_fwd: int, ack2: bool) -> OriginOutcome:
    """Apply one event to a pending-send row: the event as the row's
    SaveFwd makes it (``BY_SAVE_FWD``), then its row of ``ORIGIN_TABLE``;
    a pair not in the table leaves the row unchanged."""
    event = BY_SAVE_FWD.get((event, save_fwd), event)
    nxt, reack2 = ORIGIN_TABLE.get((state, event), (state, False))
    return OriginOutcome(
        state=nxt,
        changed=nxt is not state,
        reack2=reack2,
        clean=origin_may_clean(nxt, save_fwd, ack2),
        event=event,
    )


@dataclass(frozen=True, slots=True)
class ReceiveDecision:
    deliver: bool  # hand to the inbox (first time only)
    send_ack: bool  # ACK to the platform (it came with LK1)
    send_ack2: bool  # ACK2 to the origin (Ack2 asked)
    keep_row: bool  # a pending-ack row is needed (some confirmation outstanding)


@lru_cache(maxsize=64)
def receive_decision(*, duplicate: bool, has_lk1: bool, ack2: bool, reliable: bool) -> ReceiveDecision:
    """SPEC B.1 and B.4: a DATA arrival. A duplicate is never delivered again
    but is acked again (the earlier ack may have been lost: that is why it
    came again). Best effort (Reliable=0) is never acked."""
    if not reliable:
        return ReceiveDecision(deliver=not duplicate, send_ack=False, send_ack2=False, keep_row=False)
    return ReceiveDecision(
        deliver=not duplicate,
        send_ack=has_lk1,
        send_ack2=ack2,
        keep_row=(has_lk1 or ack2) and not duplicate,
    )


def receiver_may_clean(p_ack: AckStatus, s_ack: AckStatus) -> bool:
    """SPEC B.2: delete the row once every confirmation it needs is AS_ACK
    (a confirmation not needed is stored as AS_ACK from the start)."""
    return p_ack is AckStatus.AS_ACK and s_ack is AckStatus.AS_ACK


class AckEvent(Enum):
    """What confirms a pending-ack row (SPEC B.2): the platform's REACK (or
    its answer to our STATE inquiry) for a stored copy's ACK, the origin's
    REACK2 (or its answer) for our ACK2."""

    __hash__ = object.__hash__

    PLATFORM_CONFIRMS = "platform_confirms"  # P_ACK_STATUS -> AS_ACK
    ORIGIN_CONFIRMS = "origin_confirms"  # S_ACK_STATUS -> AS_ACK


A = AckStatus

#: ((P_ACK_STATUS, S_ACK_STATUS), event) -> the pair after it. Every pair is
#: here: a confirmation is idempotent (a second REACK changes nothing).
PENDING_ACK_TABLE: Final[dict[tuple[tuple[AckStatus, AckStatus], AckEvent], tuple[AckStatus, AckStatus]]] = {
    **{((p, s), AckEvent.PLATFORM_CONFIRMS): (A.AS_ACK, s) for p in AckStatus for s in AckStatus},
    **{((p, s), AckEvent.ORIGIN_CONFIRMS): (p, A.AS_ACK) for p in AckStatus for s in AckStatus},
}


def pending_ack_step(p_ack: AckStatus, s_ack: AckStatus, event: AckEvent) -> tuple[AckStatus, AckStatus]:
    """The confirmations of a pending-ack row after ``event``; the row goes
    once ``receiver_may_clean`` says so."""
    return PENDING_ACK_TABLE[((p_ack, s_ack), event)]


# ---------------------------------------------------------------- actions outside the protocol
#
# The tables above are the protocol's: frames move the rows. Rows also move
# because a person or a feature of the node says so: the admin console's
# requeue / resend / purge (docs/operations.md), the dead letters' requeue and
# purge and their two rules (attempt limit, unknown target; SPEC "What the
# other seeds add", 001: cleanup of messages that can never be processed),
# and the transactional half messages (seed 002). Those transitions are
# decided here too, each by one table, and the modules that apply them build
# their SQL from it (the states an action applies to, the state it leaves).


class OperatorAction(Enum):
    """What a person or a node feature does to a pending-send row (or to one
    of the platform's stored copies); the value is how an error names it."""

    __hash__ = object.__hash__  # a dict key, as OriginEvent

    REQUEUE = "requeue"  # a failed row (a dead letter) goes again, same LK0: admin requeue, `semq dead requeue`
    RESEND = "resend"  # an unconfirmed row goes again now (receivers suppress duplicates, SPEC B.4)
    PURGE = "purge"  # the admin console deletes the row, whatever its state
    DEAD_LETTER = "dead letter"  # an unsent row will never go: attempt limit (304), unknown target (300)
    PURGE_DEAD = "dead-letter purge"  # `semq dead purge`: deletes dead letters only


_A = OperatorAction

#: (state, action) -> next state, None: the row is deleted. Anything else is
#: refused (the row is left as it is and the caller says so).
OPERATOR_TABLE: Final[dict[tuple[SendState, OperatorAction], SendState | None]] = {
    # Attempts, code and inquiries are reset too: a fresh start under the same LK0.
    (S.SS_FAILED, _A.REQUEUE): S.SS_INIT,
    # Only rows handed on and not confirmed end to end: an SS_INIT row goes
    # anyway, an SS_ACK2 row is delivered, an SS_FAILED one is a requeue.
    (S.SS_SENT, _A.RESEND): S.SS_INIT,
    (S.SS_ACK_FWD, _A.RESEND): S.SS_INIT,
    (S.SS_ACK, _A.RESEND): S.SS_INIT,
    # A document already handed on may still arrive; an unsent one never.
    (S.SS_INIT, _A.PURGE): None,
    (S.SS_SENT, _A.PURGE): None,
    (S.SS_ACK_FWD, _A.PURGE): None,
    (S.SS_ACK, _A.PURGE): None,
    (S.SS_ACK2, _A.PURGE): None,
    (S.SS_FAILED, _A.PURGE): None,
    # Only rows waiting to be sent: a row in flight keeps its window credit
    # and its answer (semq.node.features.dead.sweep, fail_target).
    (S.SS_INIT, _A.DEAD_LETTER): S.SS_FAILED,
    (S.SS_FAILED, _A.PURGE_DEAD): None,
}

_St = TypeVar("_St", bound=IntEnum)
_Act = TypeVar("_Act", bound=Enum)


class TransitionRefused(ValueError):
    """An action asked of a row whose state does not allow it; the message
    names the action, the row and its state (STYLE 3)."""

    def __init__(self, action: str, what: str, ident: int | None, state: str) -> None:
        self.action, self.ident, self.state = action, ident, state
        row = f"{what} {ident}" if ident is not None else f"a {what}"
        super().__init__(f"{action} of {row} which is in state {state}")


class ActionTable(Generic[_St, _Act]):
    """One table of ``(state, action) -> next state`` (None: the row is
    deleted), and what is asked of it: the step for one row, the states an
    action applies to (for ``WHERE state IN (...)``), the one state it
    leaves rows in (for ``SET state=...`` over a set of rows)."""

    def __init__(self, table: Mapping[tuple[_St, _Act], _St | None], what: str) -> None:
        self.table, self.what = table, what

    def step(self, state: _St, action: _Act, ident: int | None = None) -> _St | None:
        """Raises TransitionRefused for a state the action does not apply
        to: ``requeue of record 42 which is in state SS_ACK2``."""
        try:
            return self.table[(state, action)]
        except KeyError:
            raise TransitionRefused(str(action.value), self.what, ident, _name(state)) from None

    def states(self, action: _Act) -> tuple[_St, ...]:
        return tuple(sorted((s for (s, a) in self.table if a is action), key=int))

    def result(self, action: _Act) -> _St | None:
        """Raises ValueError for an action that leaves rows in more than one state."""
        results = {v for (_s, a), v in self.table.items() if a is action}
        if len(results) != 1:
            raise ValueError(f"{action.value} leaves rows in {len(results)} different states: name the row's state")
        return next(iter(results))


OPERATOR: Final = ActionTable(OPERATOR_TABLE, "record")


def operator_step(state: SendState, action: OperatorAction, *, record: int | None = None) -> SendState | None:
    """The next state of a pending-send row after ``action`` (None: delete it)."""
    return OPERATOR.step(state, action, record)


def operator_states(action: OperatorAction) -> tuple[SendState, ...]:
    """The pending-send states ``action`` applies to, in state order."""
    return OPERATOR.states(action)


def operator_result(action: OperatorAction) -> SendState | None:
    """The one state ``action`` leaves a pending-send row in (None: deleted)."""
    return OPERATOR.result(action)


def _name(state: int) -> str:
    return state.name if isinstance(state, Enum) else str(state)


# -- transactional half messages (seed 002; semq.node.features.txn)


class TxState(IntEnum):
    """States of a half message (docs/seed-capabilities.md); semq.node.features.txn
    re-exports it."""

    HALF = 0  # stored, not sent; waiting for commit / rollback / check-back
    COMMITTED = 1  # in the pending-send table (``lk0``); final
    ROLLED_BACK = 2  # will never be sent; final
    NEEDS_ATTENTION = 3  # check-backs exhausted or commit impossible: a person decides


class TxAction(Enum):
    """What moves a half message; the value is how an error names it."""

    __hash__ = object.__hash__

    COMMIT = "commit"  # the producer, a person or a check-back: into the pending-send table (as SS_INIT)
    ROLLBACK = "rollback"  # the producer, a person or a check-back: never sent
    FLAG = "flag"  # check-backs exhausted, or the commit refused: a person decides
    PURGE = "purge"  # housekeeping: a decided row, kept a week, is deleted (the document lives on in the outbox)


_T = TxState
_TA = TxAction

#: (state, action) -> next state, None: deleted. COMMITTED and ROLLED_BACK
#: are final and exclude each other; anything else is refused (semq.node.features.txn
#: answers a repeated commit / rollback with the earlier result: idempotent).
TX_TABLE: Final[dict[tuple[TxState, TxAction], TxState | None]] = {
    (_T.HALF, _TA.COMMIT): _T.COMMITTED,
    (_T.NEEDS_ATTENTION, _TA.COMMIT): _T.COMMITTED,
    (_T.HALF, _TA.ROLLBACK): _T.ROLLED_BACK,
    (_T.NEEDS_ATTENTION, _TA.ROLLBACK): _T.ROLLED_BACK,
    # A person's message is not flagged again (it already waits for one).
    (_T.HALF, _TA.FLAG): _T.NEEDS_ATTENTION,
    (_T.COMMITTED, _TA.PURGE): None,
    (_T.ROLLED_BACK, _TA.PURGE): None,
}


TX: Final = ActionTable(TX_TABLE, "transaction")


def tx_step(state: TxState, action: TxAction, *, tx_id: int | None = None) -> TxState | None:
    """The next state of a half message after ``action`` (None: delete it):
    ``commit of transaction 7 which is in state ROLLED_BACK``."""
    return TX.step(state, action, tx_id)


def tx_states(action: TxAction) -> tuple[TxState, ...]:
    """The half-message states ``action`` applies to, in state order."""
    return TX.states(action)


def tx_result(action: TxAction) -> TxState | None:
    """The one state ``action`` leaves a half message in (None: deleted)."""
    return TX.result(action)


def sql_in(states: Iterable[int]) -> str:
    """``0,3`` for ``state IN (...)``: the IntEnums' values written into the
    SQL text (what a partial index's condition is matched against), never
    typed by hand."""
    return ",".join(str(int(s)) for s in states)


# ---------------------------------------------------------------- the edge (AS2, AS4)


class EdgeState(IntEnum):
    """A document to an AS2 / AS4 partner (semq.edge.store)."""

    __hash__ = int.__hash__

    QUEUED = 0  # to send (again: with the same message id), at its next_ms
    SENDING = 1  # claimed by the edge sender: POSTed, its receipt awaited
    CONFIRMED = 4  # a receipt that verifies and names our digest: kept as the proof
    FAILED = 9  # the partner refused it (a negative MDN, an ebMS error), or the tries ran out: a dead letter


class EdgeEvent(Enum):
    __hash__ = object.__hash__

    CLAIMED = "claimed"  # the sender took it
    RECEIPT = "receipt"  # a verified positive receipt with our digest
    REFUSED = "refused"  # a verified negative receipt
    NO_RECEIPT = "no_receipt"  # no answer, an HTTP error, a receipt that does not verify: sent again later
    GAVE_UP = "gave_up"  # no receipt and no tries left
    RESTARTED = "restarted"  # the daemon started: what a stopped one left SENDING is sent again
    RESEND = "resend"  # the operator sends a failed one again (semq resend)


_ES = EdgeState
_EE = EdgeEvent

#: (state, event) -> next state. Anything else: unchanged.
EDGE_TABLE: Final[dict[tuple[EdgeState, EdgeEvent], EdgeState]] = {
    (_ES.QUEUED, _EE.CLAIMED): _ES.SENDING,
    (_ES.SENDING, _EE.RECEIPT): _ES.CONFIRMED,
    (_ES.SENDING, _EE.REFUSED): _ES.FAILED,
    (_ES.SENDING, _EE.NO_RECEIPT): _ES.QUEUED,
    (_ES.SENDING, _EE.GAVE_UP): _ES.FAILED,
    (_ES.SENDING, _EE.RESTARTED): _ES.QUEUED,
    (_ES.FAILED, _EE.RESEND): _ES.QUEUED,
}


def edge_step(state: EdgeState, event: EdgeEvent) -> EdgeState | None:
    """The next state of an edge document, None when the pair is not in the table."""
    return EDGE_TABLE.get((state, event))
