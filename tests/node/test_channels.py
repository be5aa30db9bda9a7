"""Users and ordered channels in the node core (semq.node.envelope,
semq.node.receiver.channels): two cores wired by hand, frames delivered in any order."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semq.node.core import NewDocument, NodeCore
from semq.node.envelope import (
    MAX_ENVELOPE,
    Envelope,
    EnvelopeError,
    encode_envelope,
    parse_address,
    split_envelope,
)
from semq.node.receiver.channels import waiting_channels
from semq.node.users import UserError, add_user, authenticate, user_for_os_account, user_for_token
from semq.umxt_protocol import AppKey, Kind, ResultCode
from tests._frames import decoded, raws

A, B = "10008", "56001"


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[NodeCore, NodeCore]]:
    a = NodeCore(tmp_path / "a.sqlite", A, create=True, synchronous="OFF", events_dir=tmp_path / "ea")
    b = NodeCore(tmp_path / "b.sqlite", B, create=True, synchronous="OFF", events_dir=tmp_path / "eb")
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _doc(key: str, channel: str = "ORDERS", **kw: object) -> NewDocument:
    return NewDocument(target=B, app_data=key.encode(), app_key=AppKey(data_type="ORDER", key=key),
                       channel=channel, **kw)  # type: ignore[arg-type]


def _inbox(b: NodeCore) -> list[tuple[str, str, str]]:
    return [(k, ch, dt) for k, ch, dt in b.conn.execute("SELECT key, channel, data_type FROM inbox ORDER BY id")]


def _data_frames(core: NodeCore) -> list[bytes]:
    out = core.claim(100)
    return out.data


# ---------------------------------------------------------------- the envelope


@given(st.builds(Envelope, from_user=st.sampled_from(["", "alice", "b.o-b_1"]),
                 to_user=st.sampled_from(["", "carol", "x" * 64]),
                 channel=st.sampled_from(["ORDERS", "a:b@c.d-e_" + "z" * 118]),
                 prev=st.integers(0, 2**64 - 1), skipped=st.integers(0, 2**64 - 1))
       | st.builds(Envelope, from_user=st.sampled_from(["", "alice"]), to_user=st.sampled_from(["", "carol"])),
       st.binary(max_size=64))
@settings(max_examples=200)
def test_an_envelope_round_trips_and_fits_its_limit(env: Envelope, doc: bytes) -> None:
    raw = encode_envelope(env)
    assert len(raw) <= MAX_ENVELOPE
    assert split_envelope(raw + doc) == (env, doc)


@given(st.binary(max_size=40))
def test_any_bytes_either_split_or_raise_envelope_error(data: bytes) -> None:
    try:
        split_envelope(data)
    except EnvelopeError:
        pass


@pytest.mark.parametrize(("text", "expected"), [
    ("56001", ("56001", "")), ("56001/alice", ("56001", "alice")), ("alice", (A, "alice")),
])
def test_addresses_name_an_organization_a_user_of_one_or_a_colleague(text: str, expected: tuple[str, str]) -> None:
    assert parse_address(text, A) == expected


@pytest.mark.parametrize("bad", ["56001/", "56001/Alice", "56001/9lives", "56001/a b", "56001/" + "a" * 65])
def test_bad_user_names_are_refused_with_the_rule(bad: str) -> None:
    with pytest.raises(EnvelopeError, match="user name"):
        parse_address(bad, A)


# ---------------------------------------------------------------- users


def test_a_token_proves_its_user_and_no_other(pair: tuple[NodeCore, NodeCore]) -> None:
    _, b = pair
    alice = add_user([b.users], "alice")
    bob = add_user([b.users], "bob", os_user="bob")
    assert authenticate(b.users, "alice", alice) == "alice"
    for name, token in (("alice", bob), ("bob", alice), ("mallory", alice), ("alice", "")):
        with pytest.raises(UserError, match="do not match"):
            authenticate(b.users, name, token)
    assert user_for_os_account(b.users, "bob") == "bob"
    assert user_for_os_account(b.users, "root") is None
    assert b.conn.execute("SELECT count(*) FROM users WHERE token_sha256 IN (?, ?)", (alice, bob)).fetchone() == (0,)
    with pytest.raises(UserError, match="exists already"):
        add_user([b.users], "alice")


def test_a_bearer_token_names_its_user_and_a_shared_or_wrong_one_none(pair: tuple[NodeCore, NodeCore]) -> None:
    _, b = pair
    alice = add_user([b.users], "alice")
    assert user_for_token(b.users, alice) == "alice"
    for bad in ("", "semq_wrong", alice + "x"):
        with pytest.raises(UserError, match="not the token of a user"):
            user_for_token(b.users, bad)
    # Two users given one token (by an operator's mistake): it names neither.
    add_user([b.users], "bob", token="semq_shared")
    add_user([b.users], "carol", token="semq_shared")
    with pytest.raises(UserError):
        user_for_token(b.users, "semq_shared")


def test_a_document_for_a_user_reaches_that_user_and_one_for_an_unknown_user_is_refused(
        pair: tuple[NodeCore, NodeCore]) -> None:
    a, b = pair
    add_user([b.users], "alice")
    add_user([a.users], "carol")
    a.accept([NewDocument(target=B, app_data=b"x", app_key=AppKey(key="K1"), from_user="carol", to_user="alice"),
              NewDocument(target=B, app_data=b"y", app_key=AppKey(key="K2"), to_user="zed")])
    out = b.handle(decoded(_data_frames(a)))
    assert b.conn.execute("SELECT key, from_user, to_user, app_data FROM inbox").fetchall() == [
        ("K1", "carol", "alice", b"x")]
    assert [c for c, _ in out.errors] and "zed is not a user of organization 56001" in out.errors[0][1]
    nacks = [r for r in decoded(out.data) if r.kind is Kind.NACK]
    assert len(nacks) == 1


# ---------------------------------------------------------------- ordered channels


def test_documents_of_a_channel_reach_the_inbox_in_send_order_whatever_order_they_arrive(
        pair: tuple[NodeCore, NodeCore]) -> None:
    a, b = pair
    a.accept([_doc(f"S{i}") for i in range(1, 21)])
    a.accept([_doc("U1", channel="")])  # unordered: not held
    frames = decoded(_data_frames(a))
    random.Random(7).shuffle(frames)
    for i in range(0, len(frames), 3):  # several batches, each out of order
        b.handle(frames[i:i + 3])
    keys = [k for k, ch, _ in _inbox(b) if ch == "ORDERS"]
    assert keys == [f"S{i}" for i in range(1, 21)]
    assert waiting_channels(b.conn) == []
    assert b.conn.execute("SELECT count(*) FROM channel_held").fetchone() == (0,)


def test_a_gap_holds_later_documents_visibly_until_the_missing_one_comes(pair: tuple[NodeCore, NodeCore]) -> None:
    a, b = pair
    ids = [lk.record_id for lk in a.accept([_doc(f"S{i}") for i in range(1, 5)])]
    frames = decoded(_data_frames(a))
    b.handle([frames[0], frames[2], frames[3]])  # S2 is late
    assert [k for k, _, _ in _inbox(b)] == ["S1"]
    (wait,) = waiting_channels(b.conn)
    assert (wait.origin, wait.channel, wait.held, wait.waits_for) == (A, "ORDERS", 2, ids[1])
    assert wait.describe() == f"channel ORDERS from {A} waits for LK0 {A}/1/1/{ids[1]} (2 documents held)"
    out = b.handle([frames[2]])  # a duplicate of a held one: acked again, not delivered twice
    assert out.delivered == 0
    b.handle([frames[1]])
    assert [k for k, _, _ in _inbox(b)] == ["S1", "S2", "S3", "S4"]
    assert waiting_channels(b.conn) == []


def test_a_failed_document_is_announced_and_the_channel_moves_on(pair: tuple[NodeCore, NodeCore]) -> None:
    a, b = pair
    a.accept([_doc("S1")])
    first = decoded(_data_frames(a))
    failed = a.accept([_doc("S2", expires_ms=1)])[0]  # expires at its claim: SS_FAILED
    assert _data_frames(a) == []
    a.accept([_doc("S3")])
    third = decoded(_data_frames(a))
    b.handle(third + first)
    assert [k for k, _, _ in _inbox(b)] == ["S1"]  # S3 waits for S2
    assert a.announce_gaps() == 1
    assert a.announce_gaps() == 0  # once
    notice = decoded(_data_frames(a))
    b.handle(notice)
    got = b.conn.execute("SELECT key, data_type, domain, subtype, app_data FROM inbox ORDER BY id").fetchall()
    assert [(k, t) for k, t, _, _, _ in got] == [("S1", "ORDER"), (str(failed), "GAP"), ("S3", "ORDER")]
    _, _, domain, subtype, body = got[1]
    assert (domain, subtype) == ("semq.channel", "ORDERS")
    assert json.loads(body)["code"] > 0
    assert waiting_channels(b.conn) == []
    # The failed document turning up after all (requeued by hand behind the
    # origin's back, or a late copy) is refused, and gets no receipt: the
    # application was told it failed.
    with a.db.atomic():
        a.conn.execute("UPDATE outbox SET state=0, expires_ms=NULL WHERE id=?", (failed.record_id,))
    a.reread_send_order()
    late = decoded(_data_frames(a))
    assert len(late) == 1
    out = b.handle(late)
    assert [c for c, _ in out.errors] == [ResultCode.GAP_ANNOUNCED]
    assert [r.kind for r in decoded(out.data)] == [Kind.NACK]
    assert len(_inbox(b)) == 3
    assert b.receiver.received_digest(failed) == (False, None)


def test_a_gap_notice_for_a_document_that_did_arrive_changes_nothing(pair: tuple[NodeCore, NodeCore]) -> None:
    a, b = pair
    ids = [lk.record_id for lk in a.accept([_doc("S1"), _doc("S2")])]
    b.handle(decoded(_data_frames(a)))
    # S2 fails at the origin after all (say its ACK2 never came and an
    # operator gave up on it): the notice must not hold the channel.
    with a.db.atomic():
        a.conn.execute("UPDATE outbox SET state=9, code=1 WHERE id=?", (ids[1],))
    assert a.announce_gaps() == 1
    b.handle(decoded(_data_frames(a)))
    a.accept([_doc("S3")])
    b.handle(decoded(_data_frames(a)))
    assert [k for k, _, _ in _inbox(b)] == ["S1", "S2", "S3"]
    assert waiting_channels(b.conn) == []


def test_channels_are_independent_per_origin_and_name(pair: tuple[NodeCore, NodeCore]) -> None:
    a, b = pair
    a.accept([_doc("X1", channel="X"), _doc("Y1", channel="Y"), _doc("X2", channel="X"), _doc("Y2", channel="Y")])
    frames = decoded(_data_frames(a))
    b.handle([frames[3], frames[2]])  # Y2 waits for Y1, X2 for X1
    assert sorted(w.channel for w in waiting_channels(b.conn)) == ["X", "Y"]
    b.handle([frames[1]])
    assert [k for k, _, _ in _inbox(b)] == ["Y1", "Y2"]
    b.handle([frames[0]])
    assert [k for k, _, _ in _inbox(b)] == ["Y1", "Y2", "X1", "X2"]


def test_a_purged_ordered_document_is_announced_and_an_announced_one_is_not_requeued(
        pair: tuple[NodeCore, NodeCore]) -> None:
    from semq.node.engine import OperatorAction

    a, b = pair
    ids = [lk.record_id for lk in a.accept([_doc("S1"), _doc("S2"), _doc("S3")])]
    frames = decoded(_data_frames(a))
    b.handle([frames[0], frames[2]])
    a.write_deferred()  # (S2 is SS_SENT, held in memory until written)
    with a.db.atomic():  # the operator purges S2, unconfirmed (admin purge: any state)
        (state,) = a.conn.execute("SELECT state FROM outbox WHERE id=?", (ids[1],)).fetchone()
        assert a.operator.apply(OperatorAction.PURGE, [(ids[1], state)], 1) == [ids[1]]
    b.handle(decoded(_data_frames(a)))  # the gap notice
    assert [k for k, _, _ in _inbox(b)] == ["S1", f"{A}/1/1/{ids[1]}", "S3"]
    # An announced failed document stays failed when requeued.
    a.accept([_doc("S4", expires_ms=1)])
    assert _data_frames(a) == []
    (failed,) = [i for (i,) in a.conn.execute("SELECT id FROM outbox WHERE state=9")]
    assert a.announce_gaps() == 1
    with a.db.atomic():
        assert a.operator.apply(OperatorAction.REQUEUE, [(failed, 9)], 1) == []


def test_the_envelope_flag_is_bound_by_the_documents_signature() -> None:
    """A relay that clears or sets FLAG_ENVELOPE changes the AAD the
    document was signed over: the receiver refuses it (BAD_SIGNATURE)."""
    from semq.identity.crypto import BOUND_FLAGS, raw_frame_aad
    from semq.umxt_protocol import FLAG_ENVELOPE, Endpoint, encode_data, rewrite_header

    assert BOUND_FLAGS & FLAG_ENVELOPE
    frame = encode_data(source=Endpoint.org(A), target=Endpoint.org(B), record_id=7, app_data=b"x",
                        envelope=True)
    (raw,) = decoded(frame)
    (stripped,) = decoded(rewrite_header(frame, flags=raw.flags & ~FLAG_ENVELOPE))
    assert raw.flags & FLAG_ENVELOPE and not stripped.flags & FLAG_ENVELOPE
    assert raw_frame_aad(raw) != raw_frame_aad(stripped)


def test_a_unit_other_than_the_first_refuses_an_ordered_document_with_the_reason(
        pair: tuple[NodeCore, NodeCore]) -> None:
    """The platform delivers ordered documents to unit 1 (flag Ordered); one
    that reaches another unit is refused, signed, so that its origin
    announces the gap and the channel goes on at unit 1."""
    from semq.umxt_protocol import FLAG_ORDERED

    a, b = pair
    b.ctx.unit, b.ctx.units = 2, 2
    a.accept([_doc("S1"), _doc("U1", channel="")])
    frames = decoded(_data_frames(a))
    assert [bool(r.flags & FLAG_ORDERED) for r in frames] == [True, False]
    out = b.handle(frames)
    assert [k for k, _, _ in _inbox(b)] == ["U1"]
    assert out.errors and "unit 2 of organization 56001 does not keep channels (unit 1 does)" in out.errors[0][1]
    assert [r.kind for r in decoded(out.data) if r.kind is Kind.NACK] == [Kind.NACK]


def test_a_document_refused_for_an_unknown_user_does_not_hold_its_channel_forever(
        pair: tuple[NodeCore, NodeCore]) -> None:
    """A channel is the organization's (origin, channel), whoever each
    document is for. S1, for a user B does not have, is refused (its origin
    row fails) while S2, for alice, is held behind it. S1's gap notice names
    the same user: it must not be refused for it too, or the channel waits
    for S1 for ever (S2 acknowledged, never handed over)."""
    a, b = pair
    add_user([b.users], "alice")
    a.accept([_doc("S1", to_user="zed"), _doc("S2", to_user="alice")])
    out = b.handle(decoded(_data_frames(a)))
    assert [code for code, _ in out.errors] == [300]  # UNKNOWN_TARGET: zed
    a.handle(decoded(out.data))  # the NACK: S1 fails at A
    assert a.announce_gaps() == 1
    out = b.handle(decoded(_data_frames(a)))  # S1's gap notice
    assert out.errors == []
    assert [(k, t) for k, _, t in _inbox(b)] == [(f"{A}/1/1/1", "GAP"), ("S2", "ORDER")]
    assert waiting_channels(b.conn) == []


def test_another_unit_answers_an_inquiry_about_an_ordered_document_unit_1_holds(tmp_path: Path,
                                                                                  pair: tuple[NodeCore, NodeCore]) -> None:
    """The origin's inquiry about a document reaches the unit its LK0 picks;
    an ordered one is with unit 1. That unit looks in unit 1's store too: it
    answers "received", not "not received" (which would make a SaveFwd 1
    document look dropped, and others go again)."""
    from semq.umxt_protocol import (
        LK0,
        Endpoint,
        Frame,
        Inquiry,
        InquiryResp,
        InquiryResult,
        InquiryTopic,
    )

    a, b = pair  # b: unit 1
    b2 = NodeCore(tmp_path / "b2.sqlite", B, create=True, synchronous="OFF", unit=2)
    try:
        b2.ctx.unit, b2.ctx.units = 2, 2
        (lk,) = a.accept([_doc("S1")])
        b.handle(decoded(_data_frames(a)))
        ask = raws(Frame(kind=Kind.INQUIRY, source=Endpoint.org(A), target=Endpoint.org(B),
                         body=Inquiry(topic=InquiryTopic.RECEIVED, items=(lk,))))
        never = LK0(endpoint=Endpoint.org(A), record_id=lk.record_id + 1000)

        def answer() -> list[InquiryResult]:
            out = b2.handle(ask + raws(Frame(kind=Kind.INQUIRY, source=Endpoint.org(A), target=Endpoint.org(B),
                                             body=Inquiry(topic=InquiryTopic.RECEIVED, items=(never,)))))
            got = [r.frame().body for r in decoded(out.data) if r.kind is Kind.INQUIRY_RESP]
            return [a.result for resp in got if isinstance(resp, InquiryResp) for a in resp.answers]

        assert answer() == [InquiryResult.NOT_RECEIVED, InquiryResult.NOT_RECEIVED]  # unit 1's store not known
        b2.ctx.first_unit_store = tmp_path / "b.sqlite"
        assert answer() == [InquiryResult.RECEIVED, InquiryResult.NOT_RECEIVED]
    finally:
        b2.close()


def test_an_origin_cannot_fill_the_receivers_store_with_held_documents(
        pair: tuple[NodeCore, NodeCore], monkeypatch: pytest.MonkeyPatch) -> None:
    """An enrolled organization whose ordered documents name predecessors
    that never come: past MAX_HELD_PER_ORIGIN held, the next that would be
    held is refused OVER_WINDOW (not stored, no receipt; its origin sends it
    again later); one that follows in order still goes in, and so does the
    refused one once the gap closed."""
    from semq.node.receiver import channels

    monkeypatch.setattr(channels, "MAX_HELD_PER_ORIGIN", 3)
    a, b = pair
    a.accept([_doc(f"S{i}", channel="X" if i < 4 else "Y") for i in range(1, 8)])  # X: S1..S3, Y: S4..S7
    f = decoded(_data_frames(a))
    out = b.handle([f[1], f[2], f[5], f[6]])  # X: S2, S3 held; Y: S6 held; S7 over the limit
    assert [c for c, _ in out.errors] == [ResultCode.OVER_WINDOW]
    assert "3 documents of 10008 are held" in out.errors[0][1] and "(limit 3)" in out.errors[0][1]
    assert b.conn.execute("SELECT count(*) FROM channel_held").fetchone() == (3,)
    b.handle([f[3], f[0]])  # Y: S4 (in order) goes in; X: S1 releases S2, S3
    assert [k for k, _, _ in _inbox(b)] == ["S4", "S1", "S2", "S3"]
    b.handle([f[4], f[6]])  # S5 releases S6; S7, sent again, follows
    assert [k for k, _, _ in _inbox(b)] == ["S4", "S1", "S2", "S3", "S5", "S6", "S7"]
    assert waiting_channels(b.conn) == []
