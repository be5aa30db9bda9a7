"""The SEMQ state machines of a node, sans-IO (SPEC "States", "The flow").

Two roles live in a node: the **origin** (pending-send table, seed tb_0031)
and the **receiver** (pending-ack table, seed tb_0030). Each is one table of
``(state, event) -> outcome``; pairs not in a table leave the row unchanged
(a late or duplicate frame must never move a row backwards). The daemons
apply an outcome to the store and send what it says only after the commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum
from functools import lru_cache
from typing import Final

__all__ = [
    "ORIGIN_TABLE",
    "PENDING_ACK_TABLE",
    "AckEvent",
    "AckStatus",
    "OriginEvent",
    "OriginOutcome",
    "ReceiveDecision",
    "SendState",
    "origin_may_clean",
    "origin_step",
    "pending_ack_step",
    "receive_decision",
    "receiver_may_clean",
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
    __hash__ = object.__hash__  # a hot dict key: identity hash in C (Enum's is hash(name), in Python)

    SENT = "sent"  # DATA written to the platform
    ACK_FWD = "ack_fwd"  # platform forwarded it
    ACK_SAVE = "ack_save"  # platform stored it
    NACK = "nack"  # platform dropped / refused it
    ACK2 = "ack2"  # receiver confirmed delivery end to end
    PLATFORM_HAS = "platform_has"  # inquiry to P: RECEIVED (its ack was lost)
    PLATFORM_LACKS = "platform_lacks"  # inquiry to P: NOT_RECEIVED
    TARGET_HAS = "target_has"  # inquiry to B: RECEIVED
    TARGET_LACKS = "target_lacks"  # inquiry to B: NOT_RECEIVED
    TARGET_ASKS = "target_asks"  # B asks about our record: it has the message
    EXPIRED = "expired"  # its expiry passed before it could be sent (SPEC A.2)
    CANNOT_SEND = "cannot_send"  # no way to the target (unknown to the platform, no certificate): given up


S = SendState
E = OriginEvent

#: (state, event) -> (next state, send REACK2). Anything else: unchanged.
ORIGIN_TABLE: Final[dict[tuple[SendState, OriginEvent], tuple[SendState, bool]]] = {
    (S.SS_INIT, E.SENT): (S.SS_SENT, False),
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
    (S.SS_ACK_FWD, E.ACK2): (S.SS_ACK2, True),
    (S.SS_ACK_FWD, E.TARGET_HAS): (S.SS_ACK2, True),
    (S.SS_ACK_FWD, E.TARGET_LACKS): (S.SS_INIT, False),
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


@dataclass(frozen=True, slots=True)
class OriginOutcome:
    state: SendState  # the row's new state
    changed: bool  # state differs from before
    reack2: bool  # send REACK2 to the receiver (after the commit)
    clean: bool  # the row may be deleted now (SPEC "Cleanup")


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
    """Apply one event to a pending-send row. A target's "not received"
    resends SaveFwd 3 rows (SPEC: must be delivered) and forwarded SaveFwd 2
    rows (nobody else holds a copy); a stored SaveFwd 2 row (SS_ACK) is the
    platform's to deliver; a forwarded SaveFwd 1 row is at most once: it is
    not resent but ends SS_FAILED, reported dropped (code 301)."""
    nxt, reack2 = ORIGIN_TABLE.get((state, event), (state, False))
    if event is E.TARGET_LACKS:
        if state is S.SS_ACK_FWD and save_fwd < 2:
            nxt = S.SS_FAILED
        elif save_fwd < (2 if state is S.SS_ACK_FWD else 3):
            nxt = state
    return OriginOutcome(
        state=nxt,
        changed=nxt is not state,
        reack2=reack2,
        clean=origin_may_clean(nxt, save_fwd, ack2),
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
