"""The daemons' own rules, over memory streams with a fake clock
(tests/_memwire.py): flow control in both directions, priority order,
sending again after a cut, inquiry timing, the storage quota's pause,
expiry, and reconnecting after silence. Each test runs a few hundred fake
seconds at most in well under a real second; every wait is bounded in fake
time. End-to-end tests with real ``semq`` processes keep proving the same
features as users run them (tests/test_flow_control.py, test_priority.py,
test_e2e_flow.py, test_dead_letters.py, test_trust_e2e.py)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio
import trio.testing

from semq.node.core import NewDocument
from semq.node.daemon import QUOTA_PAUSE
from semq.umxt_protocol import (
    LK0,
    LK1,
    AckBatch,
    Data,
    Endpoint,
    Frame,
    Hello,
    Inquiry,
    Kind,
    Nack,
    ResultCode,
    SaveFwd,
    Welcome,
    encode_frame,
)
from tests._memwire import (
    A,
    B,
    C,
    FakePlatform,
    InlineGate,
    Peer,
    Wire,
    accept,
    count,
    couple_clocks,
    node_core,
    platform,
    platform_core,
    rows,
    wait_for,
)

P = Endpoint.platform()


@pytest.fixture
def clock(autojump_clock: trio.testing.MockClock) -> trio.testing.MockClock:
    """Store calls run on the event loop (InlineGate), so the clock may jump
    the moment every task waits."""
    autojump_clock.autojump_threshold = 0
    return autojump_clock


def docs(n: int, to: str = B, tag: str = "doc", **kw: object) -> list[NewDocument]:
    return [NewDocument(target=to, app_data=f"{tag} {i}".encode(), **kw) for i in range(n)]  # type: ignore[arg-type]


def inbox(core: object) -> list[bytes]:
    return [d for (d,) in rows(core, "SELECT app_data FROM inbox ORDER BY id")]  # type: ignore[arg-type]


def no_duplicates(core: object) -> bool:
    return count(core, "SELECT count(*) FROM (SELECT 1 FROM inbox GROUP BY origin_id, record_id"  # type: ignore[arg-type]
                       " HAVING count(*) > 1)") == 0


# -- flow control (seed 004) -------------------------------------------------


async def test_platform_refuses_data_over_its_window_and_stores_nothing_of_it(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """A sender that writes 20 DATA frames at once against a window of 8
    gets WELCOME(window=8) and OVER_WINDOW for the 12 beyond it; only the 8
    within it are stored (and remembered as seen) for offline B."""
    pcore = platform_core(tmp_path)
    p = platform(pcore, window=8)
    p.gate = InlineGate()
    me = Endpoint.org(A)
    frames = [encode_frame(Frame(kind=Kind.HELLO, source=me, target=P, body=Hello()))]
    frames += [encode_frame(Frame(kind=Kind.DATA, source=me, target=Endpoint.org(B),
                                  body=Data(lk0=LK0(endpoint=me, record_id=i), app_data=b"x")))
               for i in range(1, 21)]
    async with trio.open_nursery() as nursery:
        fake = Peer()  # the test is node A
        nursery.start_soon(p._handle, fake.pair())
        await fake.send(b"".join(frames))
        await fake.read_until(lambda: len(fake.frames(Kind.NACK)) >= 12)
        await wait_for(lambda: count(pcore, "SELECT count(*) FROM stored WHERE kind=1") == 8, "8 stored")
        nursery.cancel_scope.cancel()
    welcome = fake.frames(Kind.WELCOME)[0].frame.body
    assert isinstance(welcome, Welcome) and welcome.window == 8
    nacks = [s.frame.body for s in fake.frames(Kind.NACK)]
    assert all(isinstance(n, Nack) and n.code is ResultCode.OVER_WINDOW for n in nacks)
    assert sorted(n.lk0.record_id for n in nacks if isinstance(n, Nack)) == list(range(9, 21))
    assert count(pcore, "SELECT count(*) FROM seen") == 8
    assert p.stats["over_window"] == 12
    pcore.close()


async def test_node_keeps_within_the_platforms_window_and_delivers_everything(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """The platform grants a window of 8: A never has more than 8 DATA
    frames unacknowledged (counted on the wire), nothing is refused, and
    all 200 documents arrive once."""
    pcore, a, b = platform_core(tmp_path), node_core(tmp_path, A), node_core(tmp_path, B)
    accept(a, docs(200))
    async with trio.open_nursery() as nursery:
        wire = Wire(platform(pcore, window=8), nursery)
        await wire.start(b)
        da = await wire.start(a)
        await wait_for(lambda: count(b, "SELECT count(*) FROM inbox") == 200, "200 documents at B")
        nursery.cancel_scope.cancel()
    assert da.granted == 8 and wire.platform.stats.get("over_window", 0) == 0
    # Replay A's link: DATA out, the platform's acks (ACK_FWD / ACK_SAVE) in.
    in_flight = peak = 0
    for way, s in wire.link(A):
        if way == "sent" and s.raw.kind is Kind.DATA:
            in_flight += 1
        elif way == "received" and isinstance(body := s.frame.body, AckBatch) \
                and body.ack_kind in (Kind.ACK_FWD, Kind.ACK_SAVE):
            in_flight -= len(body.entries)
        peak = max(peak, in_flight)
    assert len(wire.frames(A, Kind.DATA)) == 200 and 0 < peak <= 8
    assert no_duplicates(b)
    for c in (a, b, pcore):
        c.close()


def _copy(i: int, stored: bool = True) -> bytes:
    """A's document i as the platform delivers it to B: a stored copy (with
    an LK1) or forwarded (none)."""
    me, a = Endpoint.org(B), Endpoint.org(A)
    return encode_frame(Frame(kind=Kind.DATA, source=P, target=me, origin=a, ack2=False,
                              body=Data(lk0=LK0(endpoint=a, record_id=i),
                                        lk1=LK1(record_id=100 + i) if stored else None,
                                        app_data=f"doc {i}".encode())))


def _welcome(window: int = 4096) -> Frame:
    return Frame(kind=Kind.WELCOME, source=P, target=Endpoint.org(B), body=Welcome(window=window))


def _acked(fake: FakePlatform) -> set[int]:
    return {e.dest_ref_id for s in fake.frames(Kind.ACK_BATCH)
            if isinstance(body := s.frame.body, AckBatch) for e in body.entries}


def _nacked(fake: FakePlatform) -> list[Nack]:
    return [b for s in fake.frames(Kind.NACK) if isinstance(b := s.frame.body, Nack)]


async def test_node_refuses_stored_copies_over_its_window_and_takes_them_later(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """A platform that sends node B (window 8) 20 stored copies at once gets
    OVER_WINDOW for the 12 beyond the window; B stores and ACKs (by LK1)
    only the 8, takes the others when they come again within the window,
    and a duplicate is taken once."""
    b = node_core(tmp_path, B)
    fake = FakePlatform()
    d = fake.node(b, window=8)
    async with trio.open_nursery() as nursery:
        await nursery.start(d.run)
        await fake.read_until(lambda: bool(fake.frames(Kind.HELLO)))
        hello = fake.frames(Kind.HELLO)[0].frame.body
        assert isinstance(hello, Hello) and hello.window == 8
        await fake.send(_welcome(), b"".join(_copy(i) for i in range(1, 21)))
        await fake.read_until(lambda: len(_nacked(fake)) >= 12 and len(_acked(fake)) >= 8)
        assert {n.code for n in _nacked(fake)} == {ResultCode.OVER_WINDOW}
        assert sorted(n.lk0.record_id for n in _nacked(fake)) == list(range(9, 21))
        assert all(s.raw.target == P for s in fake.frames(Kind.NACK))
        assert _acked(fake) == {100 + i for i in range(1, 9)}  # ACKs name our LK1
        assert count(b, "SELECT count(*) FROM inbox") == 8
        await fake.send(b"".join(_copy(i) for i in range(9, 17)))
        await fake.read_until(lambda: len(_acked(fake)) >= 16)
        await fake.send(b"".join(_copy(i) for i in range(17, 21)) + _copy(1))  # and a duplicate
        await fake.read_until(lambda: len(_acked(fake)) >= 20)
        await wait_for(lambda: count(b, "SELECT count(*) FROM inbox") == 20, "all 20 in the inbox", 10)
        nursery.cancel_scope.cancel()
    assert len(_nacked(fake)) == 12 and d.stats["over_window"] == 12
    assert no_duplicates(b)
    b.close()


async def test_node_window_counts_stored_copies_not_forwarded_documents(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """B's window (8) bounds stored copies only: 30 forwarded documents in
    one read are all taken; in a read of 24 forwarded and 12 copies, only the
    4 copies after the 8th are refused."""
    b = node_core(tmp_path, B)
    fake = FakePlatform()
    d = fake.node(b, window=8)
    async with trio.open_nursery() as nursery:
        await nursery.start(d.run)
        await fake.read_until(lambda: bool(fake.frames(Kind.HELLO)))
        await fake.send(_welcome(), b"".join(_copy(i, stored=False) for i in range(1, 31)))
        await wait_for(lambda: count(b, "SELECT count(*) FROM inbox") == 30, "30 forwarded documents", 10)
        assert _nacked(fake) == []
        await fake.send(b"".join(_copy(i, stored=i % 3 == 0) for i in range(31, 67)))
        await fake.read_until(lambda: len(_nacked(fake)) >= 4)
        await wait_for(lambda: count(b, "SELECT count(*) FROM inbox") == 30 + 24 + 8, "forwarded and 8 copies", 10)
        nursery.cancel_scope.cancel()
    assert {n.code for n in _nacked(fake)} == {ResultCode.OVER_WINDOW}
    assert sorted(n.lk0.record_id for n in _nacked(fake)) == [57, 60, 63, 66]  # the copies after the 8th
    b.close()


# -- priority (seed 001) -----------------------------------------------------


def _mixed(a: object, n: int, seed: str) -> list[tuple[int, int]]:
    """n documents to B of random priorities 0-9 in one transaction:
    (record id, priority) in acceptance order."""
    rng = random.Random(seed)
    prios = [rng.randint(0, 9) for _ in range(n)]
    ids = accept(a, [NewDocument(target=B, app_data=f"{seed} {i}".encode(), priority=p)  # type: ignore[arg-type]
                     for i, p in enumerate(prios)])
    return list(zip(ids, prios, strict=True))


def _in_priority_order(sent: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return sorted(sent, key=lambda rp: (-rp[1], rp[0]))


async def test_stored_queue_delivers_higher_priority_first_then_acceptance_order(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """B offline: two batches are stored one after the other; when B
    connects, the second batch's high-priority documents overtake the
    first's low-priority ones, and equal priorities keep acceptance order."""
    pcore, a, b = platform_core(tmp_path), node_core(tmp_path, A), node_core(tmp_path, B)
    async with trio.open_nursery() as nursery:
        wire = Wire(platform(pcore), nursery)
        await wire.start(a)
        first = _mixed(a, 30, "first")
        await wait_for(lambda: count(pcore, "SELECT count(*) FROM stored WHERE kind=1") == 30, "batch 1 stored")
        second = _mixed(a, 30, "second")
        await wait_for(lambda: count(pcore, "SELECT count(*) FROM stored WHERE kind=1") == 60, "batch 2 stored")
        await wire.start(b)
        await wait_for(lambda: count(b, "SELECT count(*) FROM inbox") == 60, "all 60 at B")
        nursery.cancel_scope.cancel()
    assert {p for _, p in first} & {p for _, p in second}, "the seeds give shared priorities"
    assert rows(b, "SELECT record_id, priority FROM inbox ORDER BY id") == _in_priority_order(first + second)
    # The order on B's link is the platform's delivery order.
    got = [s.frame.body.lk0.record_id for s in wire.frames(B, Kind.DATA, direction="received")]  # type: ignore[union-attr]
    assert got == [r for r, _ in _in_priority_order(first + second)]
    for c in (a, b, pcore):
        c.close()


async def test_origin_sends_highest_priority_first_once_the_platform_is_reachable(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """The platform unreachable: documents wait SS_INIT at A. Once it is
    reachable, A writes them highest priority first (seen on A's link and
    in the platform's stored order), and B receives them in that order."""
    pcore, a, b = platform_core(tmp_path), node_core(tmp_path, A), node_core(tmp_path, B)
    async with trio.open_nursery() as nursery:
        wire = Wire(platform(pcore), nursery)
        wire.up = False
        await wire.start(a)
        sent = _mixed(a, 20, "low-first") + _mixed(a, 20, "then-high")
        await trio.sleep(30)
        assert rows(a, "SELECT DISTINCT state FROM outbox") == [(0,)]
        assert wire.connects.get(A, 0) == 0
        wire.up = True
        await wait_for(lambda: count(pcore, "SELECT count(*) FROM stored WHERE kind=1") == 40, "40 stored")
        order = [s.frame.body.lk0.record_id for s in wire.frames(A, Kind.DATA)]  # type: ignore[union-attr]
        assert order == [r for r, _ in _in_priority_order(sent)]
        assert rows(pcore, "SELECT record_id, priority FROM stored WHERE kind=1 ORDER BY id") == \
            _in_priority_order(sent)
        await wire.start(b)
        await wait_for(lambda: count(b, "SELECT count(*) FROM inbox") == 40, "all 40 at B")
        nursery.cancel_scope.cancel()
    assert rows(b, "SELECT record_id, priority FROM inbox ORDER BY id") == _in_priority_order(sent)
    for c in (a, b, pcore):
        c.close()


# -- a cut link ----------------------------------------------------------------


async def test_cutting_one_nodes_link_mid_delivery_loses_and_duplicates_nothing(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """B drains a backlog of 150 stored copies 16 at a time; its link (only
    its) is cut after its 40th copy and it stays away 20 s. A keeps its one
    session and goes on sending (stored for B meanwhile); once B is back,
    the copies delivered but unacknowledged before the cut come again, and B
    ends with every document once."""
    pcore, a, b = platform_core(tmp_path), node_core(tmp_path, A), node_core(tmp_path, B)
    accept(a, docs(150))
    async with trio.open_nursery() as nursery:
        wire = Wire(platform(pcore), nursery)
        da = await wire.start(a)
        await wait_for(lambda: count(pcore, "SELECT count(*) FROM stored WHERE kind=1") == 150, "150 stored")
        cut = wire.cut_when(B, lambda: len(wire.frames(B, Kind.DATA, direction="received")) >= 40, stay_down=True)
        db = await wire.start(b, window=16)
        await cut.wait()
        got = count(b, "SELECT count(*) FROM inbox")
        assert 40 <= got < 150
        accept(a, docs(10, tag="during the cut"))
        await trio.sleep(20)
        assert not db.connected and da.connected
        assert count(b, "SELECT count(*) FROM inbox") == got
        # What B stored but could not ack before the cut (at most its window) is still stored too.
        assert 160 - got <= count(pcore, "SELECT count(*) FROM stored WHERE kind=1") <= 160 - got + 16
        wire.down.discard(B)
        await wait_for(lambda: count(b, "SELECT count(*) FROM inbox") == 160, "all 160 at B")
        await wait_for(lambda: count(pcore, "SELECT count(*) FROM stored") == 0
                       and count(a, "SELECT count(*) FROM outbox") == 0, "cleanup")
        nursery.cancel_scope.cancel()
    assert wire.connects[A] == 1 and da.sessions == 1  # A's link was never touched
    assert wire.connects[B] == 2 and db.sessions == 2
    received = [s.frame.body.lk0.record_id for s in wire.frames(B, Kind.DATA, direction="received")]  # type: ignore[union-attr]
    assert len(received) > 160  # some came twice over the wire ...
    assert no_duplicates(b)  # ... and are in the inbox once
    for c in (a, b, pcore):
        c.close()


async def test_sent_rows_ask_at_once_after_a_cut_and_go_again_if_not_received(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """A writes 5 DATA frames and the link is cut before any ack: they stay
    SS_SENT. On the next session A asks the platform about them at once
    (not an inquiry interval later: 15 s here) and sends again the ones the
    platform did not receive."""
    a = node_core(tmp_path, A)
    ids = accept(a, docs(5))
    fake = FakePlatform()
    me = Endpoint.org(A)
    da = fake.node(a)
    async with trio.open_nursery() as nursery:
        await nursery.start(da.run)
        await fake.read_until(lambda: bool(fake.frames(Kind.HELLO)))
        await fake.send(Frame(kind=Kind.WELCOME, source=P, target=me, body=Welcome()))
        await fake.read_until(lambda: len(fake.frames(Kind.DATA)) == 5)
        await fake.cut()
        await wait_for(lambda: fake.connects == 2 and fake.end is not None, "A connects again", 10)
        t0 = trio.current_time()
        await fake.read_until(lambda: len(fake.frames(Kind.HELLO)) == 2)
        await fake.send(Frame(kind=Kind.WELCOME, source=P, target=me, body=Welcome()))
        await fake.read_until(lambda: bool(fake.frames(Kind.INQUIRY)))
        assert rows(a, "SELECT DISTINCT state FROM outbox") == [(1,)]  # SS_SENT, none went again unasked
        assert len(fake.frames(Kind.DATA)) == 5
        asked = fake.frames(Kind.INQUIRY)[0]
        assert asked.at - t0 < 2.0  # at once, not after the 15 s interval
        body = asked.frame.body
        assert isinstance(body, Inquiry) and sorted(lk.record_id for lk in body.items) == ids
        from semq.umxt_protocol import InquiryAnswer, InquiryResp, InquiryResult, InquiryTopic

        answers = tuple(InquiryAnswer(lk, InquiryResult.RECEIVED if lk.record_id in ids[:2]
                                      else InquiryResult.NOT_RECEIVED) for lk in body.items)
        await fake.send(Frame(kind=Kind.INQUIRY_RESP, source=P, target=me, origin=P,
                              body=InquiryResp(topic=InquiryTopic.RECEIVED, answers=answers)))
        await fake.read_until(lambda: len(fake.frames(Kind.DATA)) == 5 + 3)
        nursery.cancel_scope.cancel()
    again = sorted(s.frame.body.lk0.record_id for s in fake.frames(Kind.DATA)[5:])  # type: ignore[union-attr]
    assert again == ids[2:]
    a.close()
