"""Several units of one organization at the platform (semq.umxt_protocol.units), driven
as the daemon drives PlatformCore: each unit's connection is its route; a
document goes to the unit its LK0 picks, online or stored for it; acks go
to the unit whose record they name; inquiries about documents of several
units are split per unit; a route is never a frame's target."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from semq.platform.core import PlatformCore
from semq.umxt_protocol import (
    LK0,
    AckBatch,
    AckEntry,
    AckFlag,
    Endpoint,
    Frame,
    FrameDecoder,
    Inquiry,
    InquiryTopic,
    Kind,
)
from semq.umxt_protocol.units import holder, route_of, route_org, route_unit, unit_for
from tests.platform.test_platform_store import _data, _raw

A, B = "10008", "56001"
EA, EB = Endpoint.org(A), Endpoint.org(B)
B2, B3 = route_of(EB, 2), route_of(EB, 3)
ROOM = 1 << 30


@pytest.fixture
def core(tmp_path: Path) -> Any:
    c = PlatformCore(tmp_path / "p.sqlite", create=True, synchronous="OFF")
    c.register([A, B])
    yield c
    c.close()


def _frames(data: list[bytes]) -> list[Frame]:
    d = FrameDecoder()
    d.receive_data(b"".join(data))
    return [r.frame() for r in d]


def test_holder_is_stable_and_spreads_evenly() -> None:
    lks = [LK0(endpoint=EA, semq_id=s, record_id=r) for s in (1, 2) for r in range(1_000, 4_000)]
    picks = Counter(holder(lk, 3) for lk in lks)
    assert set(picks) == {1, 2, 3}
    assert min(picks.values()) > 0.9 * len(lks) / 3  # each unit about a third
    assert [holder(lk, 3) for lk in lks[:50]] == [holder(lk, 3) for lk in lks[:50]]
    assert all(holder(lk, 1) == 1 for lk in lks[:10])
    # About its own record, the origin's unit is the LK0's; anyone else: the holder.
    lk = LK0(endpoint=EA, semq_id=2, record_id=7)
    assert unit_for(EA, lk, 3) == 2 and unit_for(EB, lk, 3) == holder(lk, 3)
    assert route_org(B2) == EB and route_unit(B2) == 2 and route_unit(EB) == 1 and route_of(EB, 1) is EB


def test_documents_go_to_the_unit_their_lk0_picks_online_or_stored(core: PlatformCore) -> None:
    assert core.connected(EA)
    assert core.connected(EB, 3) and core.connected(B2, 3)  # unit 3 offline
    assert core.units == {EB: 3}
    room = {EA: ROOM, EB: ROOM, B2: ROOM}
    frames = [_raw(_data(EA, EB, r))[0] for r in range(1, 301)]
    out = core.handle(EA, frames, room)
    want = Counter(route_of(EB, holder(LK0(endpoint=EA, record_id=r), 3)) for r in range(1, 301))
    assert {t: len(f) for t, f in out.sends.items() if t != EA} == {EB: want[EB], B2: want[B2]}
    stored = Counter(t for (t,) in core.conn.execute("SELECT target_id FROM stored WHERE kind=1"))
    assert stored == {B3.node_id: want[B3]}
    for f in _frames(out.sends[B2]):
        assert f.target == EB  # the frame names the organization, never the route
    # Unit 3 connects: its copies, and only those, are claimed for it.
    assert core.connected(B3, 3)
    frames3, _ = core.claim_stored(B3, 1000)
    assert len(frames3) == want[B3]
    assert core.claim_stored(EB, 1000)[0] == []


def test_acks_reach_the_unit_of_their_record_and_inquiries_are_split(core: PlatformCore) -> None:
    assert core.connected(EA) and core.connected(EB, 2) and core.connected(B2, 2)
    room = {EA: ROOM, EB: ROOM, B2: ROOM}
    # An ACK2 from A's unit 1 for records of B's unit 2 (REACK2 names the receiver's record).
    entries = tuple(AckEntry(1, 1, 10 + i, 2, 1, 500 + i, int(AckFlag.DELIVERY), 0) for i in range(5))
    reack = _raw(Frame(kind=Kind.ACK_BATCH, source=EA, target=EB, body=AckBatch(ack_kind=Kind.REACK2,
                                                                                entries=entries)))
    out = core.handle(EA, reack, room)
    assert set(out.sends) == {B2}
    # An inquiry from A about its documents held by both of B's units: one part each.
    lks = tuple(LK0(endpoint=EA, semq_id=2, record_id=r) for r in range(1, 41))
    inq = _raw(Frame(kind=Kind.INQUIRY, source=EA, target=EB,
                     body=Inquiry(items=lks, topic=InquiryTopic.RECEIVED)))
    out = core.handle(EA, inq, room)
    got = {t: [lk for f in _frames(d) for lk in f.body.items] for t, d in out.sends.items()}
    assert set(got) == {EB, B2}
    for t, items in got.items():
        assert all(route_of(EB, holder(lk, 2)) == t for lk in items)
    assert sorted(lk.record_id for items in got.values() for lk in items) == list(range(1, 41))
    # B's unit 2 asks A about A's records: A runs one unit, which gets it whole.
    ask = _raw(Frame(kind=Kind.INQUIRY, source=EB, target=EA,
                     body=Inquiry(items=lks[:3], topic=InquiryTopic.RECEIVED)))
    out = core.handle(B2, ask, room)
    assert set(out.sends) == {EA}


def test_a_units_route_is_no_target_and_the_unit_speaks_as_its_organization(core: PlatformCore) -> None:
    assert core.connected(EA) and core.connected(EB, 2) and core.connected(B2, 2)
    room = {EA: ROOM, EB: ROOM, B2: ROOM}
    out = core.handle(EA, _raw(_data(EA, B2, 1)), room)  # straight to a unit: unknown target
    nacks = [f.body for f in _frames(out.sends[EA]) if f.kind is Kind.NACK]
    assert [n.code.name for n in nacks] == ["UNKNOWN_TARGET"] and B2 not in out.sends
    lks = (LK0(endpoint=EA, record_id=1),)
    out = core.handle(EA, _raw(Frame(kind=Kind.INQUIRY, source=EA, target=B2, body=Inquiry(items=lks, topic=InquiryTopic.RECEIVED))), room)
    assert [c.name for c, _ in out.errors] == ["UNKNOWN_TARGET"]
    # Unit 2 of B sends as B (its route is no source either).
    out = core.handle(B2, _raw(_data(EB, EA, 5)), room)
    assert not out.errors and EA in out.sends
    acks = [f for f in _frames(out.sends[B2]) if isinstance(f.body, AckBatch)]
    assert acks and all(f.target == EB for f in acks)
    out = core.handle(B2, _raw(_data(B2, EA, 6)), room)
    assert [c.name for c, _ in out.errors] == ["SOURCE_MISMATCH"]


def test_documents_stored_before_the_first_hello_of_a_node_of_units_go_to_their_units(core: PlatformCore) -> None:
    """B's units have never connected: the platform takes B for one unit and
    stores its documents for it. B's first HELLO as a node of 3 units moves
    each waiting document to the unit its LK0 picks, so its copies and the
    inquiries about it meet in one unit."""
    assert core.connected(EA)
    out = core.handle(EA, [_raw(_data(EA, EB, r))[0] for r in range(1, 121)], {EA: ROOM})
    assert not out.errors
    assert core.conn.execute("SELECT count(*) FROM stored WHERE target_id=?", (B,)).fetchone()[0] == 120
    assert core.connected(EB, 3)
    rows = core.conn.execute("SELECT record_id, target_id FROM stored WHERE kind=1").fetchall()
    assert len(rows) == 120
    for rec, tid in rows:
        assert tid == route_of(EB, holder(LK0(endpoint=EA, record_id=rec), 3)).node_id
    assert {tid for _, tid in rows} == {B, B2.node_id, B3.node_id}
    assert core.conn.execute("SELECT units FROM nodes WHERE node_id=?", (B,)).fetchone()[0] == 3


def test_a_unit_asks_the_platform_about_its_own_documents(core: PlatformCore) -> None:
    """Unit 2 of A asks what became of its documents: the platform answers
    it as A's (the origin), not NO_RECORD."""
    from semq.umxt_protocol import Data, InquiryResp, InquiryResult

    a2 = route_of(EA, 2)
    assert core.connected(EA, 2) and core.connected(a2, 2) and core.connected(EB)
    lk = LK0(endpoint=EA, semq_id=2, record_id=9)
    data = Frame(kind=Kind.DATA, source=EA, target=EB, body=Data(lk0=lk, app_data=b"x"))
    core.handle(a2, _raw(data), {EB: ROOM, a2: ROOM})
    ask = _raw(Frame(kind=Kind.INQUIRY, source=EA, target=Endpoint.platform(),
                     body=Inquiry(items=(lk,), topic=InquiryTopic.RECEIVED)))
    out = core.handle(a2, ask, {EB: ROOM, a2: ROOM})
    [resp] = [f.body for f in _frames(out.sends[a2]) if isinstance(f.body, InquiryResp)]
    assert [a.result for a in resp.answers] == [InquiryResult.FORWARDED]


def _ordered(src: Endpoint, dst: Endpoint, record_id: int) -> Frame:
    from semq.umxt_protocol import Data

    return Frame(kind=Kind.DATA, source=src, target=dst,
                 body=Data(lk0=LK0(endpoint=src, record_id=record_id), app_data=b"env+doc", envelope=True,
                           ordered=True))


def test_documents_of_ordered_channels_go_to_unit_1_online_stored_and_rerouted(core: PlatformCore) -> None:
    """A document with flag Ordered goes to the first unit whatever its LK0
    picks — forwarded, stored for it, and kept there when the node's unit
    count changes — so one store keeps each channel (semq.node.origin.channels)."""
    assert core.connected(EA)
    # Stored before B's first HELLO as a node of 3 units: they stay with unit 1.
    out = core.handle(EA, [_raw(_ordered(EA, EB, r))[0] for r in range(1, 61)], {EA: ROOM})
    assert not out.errors
    assert core.connected(EB, 3) and core.connected(B2, 3)
    assert {tid for (tid,) in core.conn.execute("SELECT target_id FROM stored WHERE kind=1")} == {B}
    # Online: forwarded to unit 1, none to unit 2 although their LK0s pick it.
    out = core.handle(EA, [_raw(_ordered(EA, EB, r))[0] for r in range(100, 160)], {EA: ROOM, EB: ROOM, B2: ROOM})
    assert set(out.sends) - {EA} == {EB} and len(_frames(out.sends[EB])) == 60
    assert any(holder(LK0(endpoint=EA, record_id=r), 3) == 2 for r in range(100, 160))
    # Unit 1 offline: stored for unit 1.
    core.disconnected(EB)
    out = core.handle(EA, [_raw(_ordered(EA, EB, r))[0] for r in range(200, 230)], {EA: ROOM, B2: ROOM})
    assert set(out.sends) - {EA} == set()
    assert {tid for (tid,) in core.conn.execute("SELECT target_id FROM stored WHERE kind=1 AND record_id >= 200")} \
        == {B}


def test_an_answer_about_a_receivers_pending_ack_also_reaches_unit_1(core: PlatformCore) -> None:
    """A's answer to B's question about B's pending acks (topic STATE): each
    answer goes to the unit its LK0 picks and to unit 1, which keeps the
    ordered channels whatever unit their LK0 picks; RECEIVED answers (about
    B's own documents) go to their unit only."""
    from semq.umxt_protocol import InquiryAnswer, InquiryResp, InquiryResult

    assert core.connected(EA) and core.connected(EB, 2) and core.connected(B2, 2)
    room = {EA: ROOM, EB: ROOM, B2: ROOM}
    lks = tuple(LK0(endpoint=EA, record_id=r) for r in range(1, 41))
    resp = _raw(Frame(kind=Kind.INQUIRY_RESP, source=EA, target=EB, body=InquiryResp(
        topic=InquiryTopic.STATE, answers=tuple(InquiryAnswer(lk, InquiryResult.NO_RECORD) for lk in lks))))
    out = core.handle(EA, resp, room)
    got = {t: sorted(a.lk0.record_id for f in _frames(d) for a in f.body.answers) for t, d in out.sends.items()}
    assert got[EB] == list(range(1, 41))
    assert got[B2] == [lk.record_id for lk in lks if holder(lk, 2) == 2] != []
    mine = tuple(LK0(endpoint=EB, semq_id=2, record_id=r) for r in range(1, 11))
    resp = _raw(Frame(kind=Kind.INQUIRY_RESP, source=EA, target=EB, body=InquiryResp(
        topic=InquiryTopic.RECEIVED, answers=tuple(InquiryAnswer(lk, InquiryResult.RECEIVED) for lk in mine))))
    assert set(core.handle(EA, resp, room).sends) == {B2}
