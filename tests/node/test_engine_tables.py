"""Every (state, event) pair of the three SEMQ tables (SPEC "States")."""

from __future__ import annotations

import itertools

import pytest

from semq.node.engine import (
    BY_SAVE_FWD,
    ORIGIN_TABLE,
    AckStatus,
    OriginEvent,
    SendState,
    origin_may_clean,
    origin_step,
    receive_decision,
    receiver_may_clean,
)
from semq.platform.engine import Route, StoredEvent, StoredState, route, state_answer, stored_step
from semq.umxt_protocol import InquiryResult, ResultCode

S = SendState
ORDER = {S.SS_INIT: 0, S.SS_SENT: 1, S.SS_ACK_FWD: 2, S.SS_ACK: 2, S.SS_ACK2: 4, S.SS_FAILED: 4}


# The SaveFwd an event variant is for (BY_SAVE_FWD): a refined event given
# with another SaveFwd is taken as its own row, for that guarantee.
_IMPLIED = {refined: save_fwd for (_base, save_fwd), refined in BY_SAVE_FWD.items()}
_LACKS = (OriginEvent.PLATFORM_LACKS, OriginEvent.TARGET_LACKS, OriginEvent.TARGET_LACKS_STORED,
          OriginEvent.LINK_LOST)


@pytest.mark.parametrize(
    ("state", "event", "save_fwd", "ack2"),
    list(itertools.product(SendState, OriginEvent, (1, 2, 3), (False, True))),
)
def test_origin_every_pair(state: SendState, event: OriginEvent, save_fwd: int, ack2: bool) -> None:
    o = origin_step(state, event, save_fwd=save_fwd, ack2=ack2)
    guarantee = _IMPLIED.get(o.event, save_fwd)
    # The step is its row of the table, for the event as the row's SaveFwd makes it.
    assert o.event is BY_SAVE_FWD.get((event, save_fwd), event)
    assert o.state is ORIGIN_TABLE.get((state, o.event), (state, False))[0]
    # SaveFwd 1 forwarded and not received: reported dropped, never resent.
    if state is S.SS_ACK_FWD and o.event is OriginEvent.TARGET_LACKS_ONCE:
        assert o.state is S.SS_FAILED
    # Terminal states never move; SS_ACK2 only ever re-answers REACK2.
    if state in (S.SS_ACK2, S.SS_FAILED):
        assert o.state is state
    # Only "not received" answers and a lost link move a row back, and only
    # to SS_INIT (resend).
    if ORDER[o.state] < ORDER[state]:
        assert o.state is S.SS_INIT
        assert o.event in _LACKS
        if o.event in (OriginEvent.TARGET_LACKS, OriginEvent.TARGET_LACKS_STORED):
            # "must be delivered" resends; so does a forwarded SaveFwd 2 (no copy at P)
            assert guarantee == 3 or (state is S.SS_ACK_FWD and guarantee == 2)
        if o.event is OriginEvent.LINK_LOST:
            assert state is S.SS_SENT and guarantee >= 2
    # A SaveFwd 1 document handed to its target's link (claimed, or its link
    # lost) counts as forwarded: never sent through the platform again.
    if o.event in (OriginEvent.SENT_DIRECT_ONCE, OriginEvent.LINK_LOST_ONCE) and o.changed:
        assert o.state is S.SS_ACK_FWD
    # REACK2 answers the ACK2s (every one: the earlier REACK2 may be lost) and
    # a target's "received" answer that confirms the row.
    if o.reack2:
        assert o.state is S.SS_ACK2 and event in (OriginEvent.ACK2, OriginEvent.TARGET_HAS)
    if event is OriginEvent.ACK2 and state is not S.SS_FAILED:
        assert o.reack2 and o.state is S.SS_ACK2
    assert o.clean == origin_may_clean(o.state, save_fwd, ack2)
    assert o.changed == (o.state is not state)


def test_every_event_variant_is_reached_from_its_event() -> None:
    """Each SaveFwd variant of an event is what a row of that SaveFwd makes
    of it, and every row of the table is reached by an event some caller
    sends (the variants only through BY_SAVE_FWD)."""
    for (base, save_fwd), refined in BY_SAVE_FWD.items():
        assert base not in _IMPLIED and origin_step(S.SS_INIT, base, save_fwd=save_fwd, ack2=True).event is refined
    for state, event in ORIGIN_TABLE:
        bases = [(b, sf) for (b, sf), r in BY_SAVE_FWD.items() if r is event] or [(event, 3)]
        assert any(origin_step(state, b, save_fwd=sf, ack2=True).event is event for b, sf in bases)


def test_origin_spec_flow() -> None:
    # SPEC A.2-A.4: sent -> ACK_FWD -> ACK2 -> REACK2 -> clean.
    o = origin_step(S.SS_INIT, OriginEvent.SENT, save_fwd=3, ack2=True)
    assert o.state is S.SS_SENT and not o.clean
    o = origin_step(o.state, OriginEvent.ACK_FWD, save_fwd=3, ack2=True)
    assert o.state is S.SS_ACK_FWD and not o.clean
    o = origin_step(o.state, OriginEvent.ACK2, save_fwd=3, ack2=True)
    assert o.state is S.SS_ACK2 and o.reack2 and o.clean
    # ACK_SAVE without Ack2 asked: SS_ACK may go at once (SPEC A.6).
    o = origin_step(S.SS_SENT, OriginEvent.ACK_SAVE, save_fwd=2, ack2=False)
    assert o.state is S.SS_ACK and o.clean
    # The platform lost it: resend.
    assert origin_step(S.SS_SENT, OriginEvent.PLATFORM_LACKS, save_fwd=3, ack2=True).state is S.SS_INIT
    assert set(ORIGIN_TABLE) <= set(itertools.product(SendState, OriginEvent))


@pytest.mark.parametrize(("save_fwd", "ack2"), list(itertools.product((1, 2, 3), (False, True))))
def test_origin_cleanup_waits_for_the_confirmation_it_needs(save_fwd: int, ack2: bool) -> None:
    """SPEC A.6 (docs/design.md, "Cleanup"): a row goes at SS_ACK2, at
    SS_ACK when no Ack2 was asked (the platform stored it and owns delivery),
    and never while it is only forwarded (SS_ACK_FWD: the platform kept no
    copy, so the target must confirm it, whatever the SaveFwd) or not yet
    answered. Failed rows are kept for the user (housekeeping removes them)."""
    clean = {s for s in SendState if origin_may_clean(s, save_fwd, ack2)}
    assert clean == ({S.SS_ACK2} if ack2 else {S.SS_ACK2, S.SS_ACK})


@pytest.mark.parametrize(
    ("duplicate", "has_lk1", "ack2", "reliable"), list(itertools.product((False, True), repeat=4))
)
def test_receive_every_case(duplicate: bool, has_lk1: bool, ack2: bool, reliable: bool) -> None:
    d = receive_decision(duplicate=duplicate, has_lk1=has_lk1, ack2=ack2, reliable=reliable)
    assert d.deliver == (not duplicate)  # SPEC B.4: once
    if not reliable:
        assert not (d.send_ack or d.send_ack2 or d.keep_row)  # best effort: never acked
    else:
        assert d.send_ack == has_lk1 and d.send_ack2 == ack2  # duplicates are acked again
        assert d.keep_row == ((has_lk1 or ack2) and not duplicate)


@pytest.mark.parametrize(("p", "s"), list(itertools.product(AckStatus, AckStatus)))
def test_receiver_cleanup(p: AckStatus, s: AckStatus) -> None:
    assert receiver_may_clean(p, s) == (p is AckStatus.AS_ACK and s is AckStatus.AS_ACK)


@pytest.mark.parametrize(("state", "event"), list(itertools.product(StoredState, StoredEvent)))
def test_stored_every_pair(state: StoredState, event: StoredEvent) -> None:
    nxt = stored_step(state, event)
    if state is StoredState.SS_ACK:
        assert nxt is state
    if event in (StoredEvent.ACK, StoredEvent.TARGET_HAS, StoredEvent.TARGET_ASKS):
        assert nxt is StoredState.SS_ACK
    if nxt is StoredState.SS_INIT and state is not StoredState.SS_INIT:
        assert event in (StoredEvent.TARGET_LACKS, StoredEvent.RECONNECTED)


@pytest.mark.parametrize(
    ("known", "online", "save_fwd", "reliable", "expired"),
    list(itertools.product((False, True), (False, True), (1, 2, 3), (False, True), (False, True))),
)
def test_route_every_case(known: bool, online: bool, save_fwd: int, reliable: bool, expired: bool) -> None:
    where, code = route(known=known, online=online, save_fwd=save_fwd, reliable=reliable, expired=expired)
    if not known:
        assert (where, code) == (Route.REFUSE, ResultCode.UNKNOWN_TARGET)
    elif expired:
        assert code is ResultCode.EXPIRED and where is not Route.FORWARD
    elif online:
        assert where is Route.FORWARD
    elif not reliable:
        assert where is Route.DISCARD
    else:
        assert where is (Route.DROP if save_fwd == 1 else Route.STORE)


def test_state_answers() -> None:
    assert state_answer(None) is InquiryResult.NO_RECORD
    assert state_answer(StoredState.SS_ACK) is InquiryResult.ALREADY_ACKED
    assert state_answer(StoredState.SS_SENT) is InquiryResult.MARKED_ACKED
