"""The daemons' own rules, over memory streams with a fake clock
(tests/_memwire.py): flow control in both directions, priority order,
sending again after a cut, inquiry timing, the storage quota's pause,
expiry, and reconnecting after silence. Each test runs a few hundred fake
seconds at most in well under a real second; every wait is bounded in fake
time. End-to-end tests with real ``semq`` processes keep proving the same
features as users run them (tests/daemons/test_flow_control.py, test_priority.py,
test_e2e_flow.py, test_dead_letters.py, test_trust_e2e.py)."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
import trio
import trio.testing

from semq.node.core import NewDocument, NodeCore
from semq.node.daemon import QUOTA_PAUSE
from semq.umxt_protocol import (
    LK0,
    LK1,
    AckBatch,
    Data,
    Endpoint,
    Error,
    Frame,
    Hello,
    Inquiry,
    Kind,
    Nack,
    ResultCode,
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
    fake_now_ms,
    inline_threads,
    node_core,
    platform,
    platform_core,
    rows,
    wait_for,
)

P = Endpoint.platform()


@pytest.fixture
def clock(autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> trio.testing.MockClock:
    """The fake clock, made the only clock: store calls run on the event
    loop (InlineGate), so it may jump the moment every task waits; the
    cores' clocks follow it (couple_clocks); the reconnect jitter is seeded.
    A run is then the same every time, however loaded the machine."""
    import semq.node.daemon.node

    autojump_clock.autojump_threshold = 0
    couple_clocks(monkeypatch, autojump_clock)
    monkeypatch.setattr(semq.node.daemon.node, "random", random.Random(0))
    return autojump_clock


def docs(n: int, to: str = B, tag: str = "doc") -> list[NewDocument]:
    return [NewDocument(target=to, app_data=f"{tag} {i}".encode()) for i in range(n)]


def inbox(core: NodeCore) -> list[bytes]:
    return [d for (d,) in rows(core, "SELECT app_data FROM inbox ORDER BY id")]


def no_duplicates(core: NodeCore) -> bool:
    return count(core, "SELECT count(*) FROM (SELECT 1 FROM inbox GROUP BY origin_id, record_id"
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
        tmp_path: Path, clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture) -> None:
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
    assert "the platform sent 4 stored copies beyond our window of 8" in caplog.text
    b.close()


# -- priority (seed 001) -----------------------------------------------------


def _mixed(a: NodeCore, n: int, seed: str) -> list[tuple[int, int]]:
    """n documents to B of random priorities 0-9 in one transaction:
    (record id, priority) in acceptance order."""
    rng = random.Random(seed)
    prios = [rng.randint(0, 9) for _ in range(n)]
    ids = accept(a, [NewDocument(target=B, app_data=f"{seed} {i}".encode(), priority=p)
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
    got = [s.record_id for s in wire.frames(B, Kind.DATA, direction="received")]
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
        order = [s.record_id for s in wire.frames(A, Kind.DATA)]
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
        assert 0 < got < 150  # (copies read but not yet stored when the link broke are not)
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
    received = [s.record_id for s in wire.frames(B, Kind.DATA, direction="received")]
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
    again = sorted(s.record_id for s in fake.frames(Kind.DATA)[5:])
    assert again == ids[2:]
    a.close()


# -- inquiry timing ------------------------------------------------------------


async def test_an_unconfirmed_document_is_asked_about_at_doubling_intervals(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """A's document waits at the platform for offline B (SS_ACK, no ACK2):
    A's daemon asks about it one inquiry interval (2 s here) after its last
    change, then at a doubling interval up to its cap (64 intervals), as
    the fake clock runs; once B comes, it is delivered and settles."""
    pcore = platform_core(tmp_path, inquiry_interval=2)
    a, b = node_core(tmp_path, A, inquiry_interval=2), node_core(tmp_path, B, inquiry_interval=2)
    [rid] = accept(a, docs(1))
    quiet = dict(poll_interval=600.0, watch_max=5.0)  # few idle looks: the inquiries are what runs
    async with trio.open_nursery() as nursery:
        wire = Wire(platform(pcore), nursery)
        await wire.start(a, **quiet)
        await wait_for(lambda: rows(a, "SELECT state FROM outbox") == [(3,)], "A at SS_ACK")
        acked = trio.current_time()
        await wait_for(lambda: len(wire.frames(A, Kind.INQUIRY)) >= 9, "9 inquiries", 1000, every=5)
        await wire.start(b, **quiet)
        await wait_for(lambda: count(b, "SELECT count(*) FROM inbox") == 1
                       and count(a, "SELECT count(*) FROM outbox") == 0, "delivered and settled", 300, every=1)
        nursery.cancel_scope.cancel()
    asked = wire.frames(A, Kind.INQUIRY)[:9]
    assert all(isinstance(body := s.frame.body, Inquiry) and [lk.record_id for lk in body.items] == [rid]
               for s in asked)
    times = [acked] + [s.at for s in asked]
    gaps = [t1 - t0 for t0, t1 in itertools.pairwise(times)]
    step = 2 / 3  # the inquirer looks every interval/3 (at most 1 s)
    for gap, due in zip(gaps, [2, 4, 8, 16, 32, 64, 128, 128, 128], strict=True):
        assert due - 0.1 <= gap <= due + step + 0.1, (gaps, due)
    for c in (a, b, pcore):
        c.close()


# -- the storage quota ---------------------------------------------------------


async def test_a_target_refused_for_the_quota_is_paused_with_doubling_pauses(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """The platform stores at most ~4 KiB of A's documents: A's documents to
    offline B beyond that are refused QUOTA_EXCEEDED and wait at A (SS_INIT,
    the code kept). A pauses B only — 2 s, then doubling while the refusals
    go on — and its documents to online C still go at once. Once B is back,
    everything reaches B once."""
    pcore = platform_core(tmp_path, orgs=(A, B, C), quota_bytes=4500)
    a, b, c = node_core(tmp_path, A), node_core(tmp_path, B), node_core(tmp_path, C)
    to_b = accept(a, [NewDocument(target=B, app_data=bytes([i]) * 1000) for i in range(10)])
    async with trio.open_nursery() as nursery:
        wire = Wire(platform(pcore), nursery)
        await wire.start(c)
        await wire.start(a)
        await wait_for(lambda: count(a, "SELECT count(*) FROM outbox WHERE code=?",
                                     int(ResultCode.QUOTA_EXCEEDED)) == 6, "6 refused for the quota")
        assert count(pcore, "SELECT count(*) FROM stored WHERE kind=1") == 4
        assert count(a, "SELECT count(*) FROM outbox WHERE code=? AND state=0", int(ResultCode.QUOTA_EXCEEDED)) == 6
        t0 = trio.current_time()
        accept(a, docs(3, to=C))
        await wait_for(lambda: count(c, "SELECT count(*) FROM inbox") == 3, "C's documents", 1)
        assert trio.current_time() - t0 < QUOTA_PAUSE  # C is not paused
        await trio.sleep(20)  # refused again and again meanwhile
        await wire.start(b)
        await wait_for(lambda: count(b, "SELECT count(*) FROM inbox") == 10, "all 10 at B", 120)
        nursery.cancel_scope.cancel()
    # A's tries to B on the wire: the first at once, then after pauses of
    # 2 s, doubling (the last try, B online, succeeds).
    tries = sorted({round(s.at, 3) for s in wire.frames(A, Kind.DATA) if s.raw.target.node_id == B})
    pauses = [t1 - t0 for t0, t1 in itertools.pairwise(tries)]
    assert len(pauses) >= 4, tries
    for i, p in enumerate(pauses[:4]):
        assert QUOTA_PAUSE * 2 ** i <= p <= QUOTA_PAUSE * 2 ** i + 1.1, pauses
    assert sorted(r for (r,) in rows(b, "SELECT record_id FROM inbox")) == to_b and no_duplicates(b)
    for core in (a, b, c, pcore):
        core.close()


# -- expiry and refusals: dead letters the daemons make -------------------------


async def test_a_document_expired_while_waiting_at_its_origin_is_never_sent(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """The platform unreachable: a document expiring in 0.3 s waits at A and
    expires. When the platform is back it never goes on the wire; it fails
    with EXPIRED (a dead letter) and the unexpired one arrives."""
    now = fake_now_ms
    pcore, a, b = platform_core(tmp_path), node_core(tmp_path, A), node_core(tmp_path, B)
    stale, kept = accept(a, [NewDocument(target=B, app_data=b"stale", expires_ms=now() + 300),
                             NewDocument(target=B, app_data=b"kept", expires_ms=now() + 600_000)])
    async with trio.open_nursery() as nursery:
        wire = Wire(platform(pcore), nursery)
        wire.up = False
        await wire.start(a)
        await wire.start(b)
        await trio.sleep(1)
        wire.up = True
        await wait_for(lambda: inbox(b) == [b"kept"], "the unexpired document")
        await wait_for(lambda: rows(a, "SELECT state, code FROM outbox WHERE id=?", stale) == [(9, 303)],
                       "the expired row failed with EXPIRED", 60)
        nursery.cancel_scope.cancel()
    assert [s.record_id for s in wire.frames(A, Kind.DATA)] == [kept]
    for c in (a, b, pcore):
        c.close()


async def test_a_document_expired_while_stored_at_the_platform_is_never_delivered(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """Stored at the platform for offline B, a document expires there: B,
    once connected, never receives it (not on its link either), a later
    document still arrives, and A learns by its inquiry that the document
    was not delivered and fails it as EXPIRED."""
    now = fake_now_ms
    pcore, a, b = platform_core(tmp_path), node_core(tmp_path, A), node_core(tmp_path, B)
    async with trio.open_nursery() as nursery:
        wire = Wire(platform(pcore), nursery)
        await wire.start(a)
        [stale] = accept(a, [NewDocument(target=B, app_data=b"stale", expires_ms=now() + 4000)])
        await wait_for(lambda: count(pcore, "SELECT count(*) FROM stored WHERE kind=1") == 1, "stored at P")
        await trio.sleep(5)
        await wire.start(b)
        accept(a, [NewDocument(target=B, app_data=b"sentinel")])
        await wait_for(lambda: inbox(b) == [b"sentinel"], "the later document")
        await wait_for(lambda: rows(a, "SELECT state, code FROM outbox WHERE id=?", stale) == [(9, 303)],
                       "A learned it was not delivered and failed it as expired", 120, every=0.5)
        nursery.cancel_scope.cancel()
    assert b"stale" not in inbox(b)
    assert all(s.record_id != stale
               for s in wire.frames(B, Kind.DATA, direction="received"))
    for c in (a, b, pcore):
        c.close()


async def test_a_document_to_an_unknown_organization_fails_with_its_reason(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """The platform refuses a document to an organization it does not know
    (NACK UNKNOWN_TARGET): A fails it (a dead letter, code 300) at once,
    and its documents to known organizations go on."""
    pcore, a, b = platform_core(tmp_path), node_core(tmp_path, A), node_core(tmp_path, B)
    lost, fine = accept(a, [NewDocument(target="99999", app_data=b"x"), NewDocument(target=B, app_data=b"y")])
    async with trio.open_nursery() as nursery:
        wire = Wire(platform(pcore), nursery)
        await wire.start(a)
        await wire.start(b)
        await wait_for(lambda: rows(a, "SELECT state, code FROM outbox WHERE id=?", lost) == [(9, 300)],
                       "UNKNOWN_TARGET", 10)
        await wait_for(lambda: inbox(b) == [b"y"], "the document to B", 10)
        nursery.cancel_scope.cancel()
    [nack] = [s.frame.body for s in wire.frames(A, Kind.NACK, direction="received")]
    assert isinstance(nack, Nack) and (nack.lk0.record_id, nack.code) == (lost, ResultCode.UNKNOWN_TARGET)
    assert fine != lost
    for c in (a, b, pcore):
        c.close()


# -- silence ---------------------------------------------------------------------


async def test_a_node_reconnects_after_the_platform_falls_silent(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """A platform that says WELCOME and then nothing: the node pings it
    every 10 s and, 45 s without traffic, drops the session and connects
    again (a half-open TCP connection ends the same way)."""
    a = node_core(tmp_path, A)
    fake = FakePlatform()
    da = fake.node(a)
    async with trio.open_nursery() as nursery:
        await nursery.start(da.run)
        await fake.read_until(lambda: bool(fake.frames(Kind.HELLO)))
        await fake.send(Frame(kind=Kind.WELCOME, source=P, target=Endpoint.org(A), body=Welcome()))
        t0 = trio.current_time()
        with pytest.raises(AssertionError, match="closed"):
            await fake.read_until(lambda: False, timeout=120)  # until the node closes the link
        dropped = trio.current_time() - t0
        await wait_for(lambda: fake.connects == 2, "a new connection", 10)
        nursery.cancel_scope.cancel()
    pings = [s.at - t0 for s in fake.frames(Kind.PING)]
    assert [round(p) for p in pings] == [10, 20, 30, 40]
    assert 45 <= dropped <= 50 + 0.1  # at the first look after 45 s of silence
    assert da.sessions == 1
    a.close()


async def test_the_platform_drops_a_node_that_falls_silent(tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """A node that says HELLO and then nothing is told ERROR IDLE_TIMEOUT
    after the platform's idle timeout (60 s) and counts as offline again:
    documents to it are stored."""
    pcore, a = platform_core(tmp_path), node_core(tmp_path, A)
    async with trio.open_nursery() as nursery:
        wire = Wire(platform(pcore), nursery)
        silent = Peer()
        nursery.start_soon(wire.platform._handle, silent.pair())
        me = Endpoint.org(B)
        await silent.send(Frame(kind=Kind.HELLO, source=me, target=P, body=Hello()))
        await silent.read_until(lambda: bool(silent.frames(Kind.WELCOME)))
        t0 = trio.current_time()
        assert me in wire.platform.sessions
        await silent.read_until(lambda: bool(silent.frames(Kind.ERROR)), timeout=120)
        assert 60 <= trio.current_time() - t0 <= 61
        await wait_for(lambda: me not in wire.platform.sessions, "B offline", 5)
        await wire.start(a)
        accept(a, docs(1))
        await wait_for(lambda: count(pcore, "SELECT count(*) FROM stored WHERE kind=1") == 1, "stored for B", 10)
        nursery.cancel_scope.cancel()
    err = silent.frames(Kind.ERROR)[0].frame.body
    assert isinstance(err, Error) and err.code is ResultCode.IDLE_TIMEOUT
    for c in (a, pcore):
        c.close()


# -- waiting for a certificate (security on: mutual TLS over the memory streams) --


async def test_a_document_waits_for_its_targets_certificate_and_goes_once_it_is_enrolled(
        tmp_path: Path, clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Security on. C is known to the platform but not enrolled: A's sealed
    document to C waits at A (SS_INIT, UNKNOWN_CERTIFICATE) while A asks
    again less and less often; its document to B is sealed and stored
    meanwhile. C is enrolled while the platform runs: the platform sees it
    within its CA check (2 s) and pushes C's certificate to A, which seals
    the document to it at once, without waiting for its own next ask; C,
    once connected, opens it."""
    from semq.identity.security import (
        NodeSecurity,
        PlatformSecurity,
        enroll,
        import_certificate,
        init_node_keys,
        init_platform_pki,
    )

    inline_threads(monkeypatch)
    pdir = tmp_path / "P"
    init_platform_pki(pdir, "platform", [])
    csr = {org: init_node_keys(tmp_path / org, org) for org in (A, B, C)}
    for org in (A, B):
        _, cert = enroll(pdir, csr[org], org, tmp_path / org / "issued.pem")
        import_certificate(tmp_path / org, cert, pdir / "ca" / "ca.pem")
    pcore = platform_core(tmp_path, orgs=(A, B, C), auto_register=False)
    sec_a = NodeSecurity(tmp_path / A)
    a = node_core(tmp_path, A, security=sec_a)
    to_c, to_b = accept(a, [NewDocument(target=C, app_data=b"for C", encrypt=True),
                            NewDocument(target=B, app_data=b"for B", encrypt=True)])
    async with trio.open_nursery() as nursery:
        wire = Wire(platform(pcore, security=PlatformSecurity(pdir)), nursery, tap=False)
        da = await wire.start(a, ssl_context=sec_a.ssl_context(), cert_retry=5.0)
        await wait_for(lambda: rows(a, "SELECT state FROM outbox WHERE id=?", to_b) == [(3,)], "B's stored")
        await wait_for(lambda: rows(a, "SELECT state, code FROM outbox WHERE id=?", to_c)
                       == [(0, int(ResultCode.UNKNOWN_CERTIFICATE))], "C's waiting", 10)
        await trio.sleep(30)
        assert rows(a, "SELECT state FROM outbox WHERE id=?", to_c) == [(0,)]  # still waiting, not failed
        assert da.certs.waiting == {Endpoint.org(C): ResultCode.UNKNOWN_CERTIFICATE}
        assert 20 <= da.certs.retry[Endpoint.org(C)] <= 40  # asked after 5, 10, 20 s ...
        _, cert = enroll(pdir, csr[C], C, tmp_path / C / "issued.pem")
        t0 = trio.current_time()
        await wait_for(lambda: rows(a, "SELECT state, code FROM outbox WHERE id=?", to_c) == [(3, 0)],
                       "C's document sealed and stored", 20)
        assert trio.current_time() - t0 <= 2 + 0.5  # the CA check's push, not A's next ask
        import_certificate(tmp_path / C, cert, pdir / "ca" / "ca.pem")
        sec_c = NodeSecurity(tmp_path / C)
        c = node_core(tmp_path, C, security=sec_c)
        await wire.start(c, ssl_context=sec_c.ssl_context())
        await wait_for(lambda: inbox(c) == [b"for C"], "C opened it", 30)
        nursery.cancel_scope.cancel()
    for core in (a, c, pcore):
        core.close()


# -- direct links: the platform as directory ----------------------------------


async def test_the_platform_answers_lookups_and_records_at_most_one_announcement_a_second(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """Over a session: B announces where it listens (observe: the platform
    adds the host it sees, none over a memory stream) and asks where A
    listens; a flood of announcements is recorded once a second, not once
    per frame (each is a write to the store)."""
    from semq.umxt_protocol import PeerAnnounce, PeerInfo, PeerLookup

    pcore = platform_core(tmp_path)
    pcore.register([A, B])
    p = platform(pcore)
    p.gate = InlineGate()
    me = Endpoint.org(B)
    announce = Frame(kind=Kind.PEER_ANNOUNCE, source=me, target=P,
                     body=PeerAnnounce(ttl_s=60, addresses=("127.0.0.1:7500",)))
    async with trio.open_nursery() as nursery:
        fake = Peer()
        nursery.start_soon(p._handle, fake.pair())
        await fake.send(Frame(kind=Kind.HELLO, source=me, target=P, body=Hello()))
        await fake.read_until(lambda: bool(fake.frames(Kind.WELCOME)))
        await fake.send(b"".join(encode_frame(announce) for _ in range(50)))
        await fake.send(Frame(kind=Kind.PEER_LOOKUP, source=me, target=P, body=PeerLookup(endpoint=me)))
        await fake.send(Frame(kind=Kind.PEER_LOOKUP, source=me, target=P, body=PeerLookup(endpoint=Endpoint.org(A))))
        await fake.read_until(lambda: len(fake.frames(Kind.PEER_INFO)) == 2)
        await trio.sleep(1.5)
        await fake.send(encode_frame(announce))
        await wait_for(lambda: p.stats.get("announce_ignored") == 49 and count(
            pcore, "SELECT count(*) FROM peers") == 1, "the flood ignored, the renewal recorded")
        nursery.cancel_scope.cancel()
    own, other = (s.frame.body for s in fake.frames(Kind.PEER_INFO))
    assert isinstance(own, PeerInfo) and own.code is ResultCode.OK and own.addresses == ("127.0.0.1:7500",)
    assert isinstance(other, PeerInfo) and other.code is ResultCode.NO_DIRECT_ADDRESS and other.addresses == ()
    announced = pcore.conn.execute("SELECT announced_ms FROM peers").fetchone()[0]
    assert announced > 0
    pcore.close()


async def test_a_node_of_several_units_has_a_session_per_unit_within_the_limit(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """Two units of B say hello: two sessions (B and its route B:2); a third
    organization saying it runs more units than the platform allows is
    refused with the limit, and one saying a unit above its count cannot
    even encode it."""
    from semq.umxt_protocol.units import route_of

    pcore = platform_core(tmp_path)
    pcore.register([A])
    pcore.register([B], units=2)
    p = platform(pcore)
    p.s.max_units_per_org = 4
    p.gate = InlineGate()
    b = Endpoint.org(B)
    async with trio.open_nursery() as nursery:
        u1, u2, greedy = Peer(), Peer(), Peer()
        for peer in (u1, u2, greedy):
            nursery.start_soon(p._handle, peer.pair())
        await u1.send(Frame(kind=Kind.HELLO, source=b, target=P, body=Hello(semq_id=1, units=2)))
        await u2.send(Frame(kind=Kind.HELLO, source=b, target=P, body=Hello(semq_id=2, units=2)))
        await greedy.send(Frame(kind=Kind.HELLO, source=Endpoint.org(A), target=P, body=Hello(units=5)))
        for peer in (u1, u2):
            await peer.read_until(lambda peer=peer: bool(peer.frames(Kind.WELCOME)))
        await greedy.read_until(lambda: bool(greedy.frames(Kind.ERROR)))
        assert set(p.sessions) == {b, route_of(b, 2)}
        assert pcore.units == {b: 2}
        nursery.cancel_scope.cancel()
    err = greedy.frames(Kind.ERROR)[0].frame.body
    assert isinstance(err, Error) and err.code is ResultCode.INVALID_FIELD and "units 5 exceeds the 4" in err.message
    assert u2.frames(Kind.WELCOME)[0].frame.target == b  # the unit is addressed as its organization
    with pytest.raises(Exception, match="semq_id 3 is over the node's 2 unit"):
        Hello(semq_id=3, units=2)
    pcore.close()


async def test_a_hello_cannot_raise_its_organizations_allowance(tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """The units an organization runs, and so the connections it may hold,
    are the operator's grant: a HELLO claiming more units than granted is
    refused with the grant and the command that raises it, and a connection
    past the allowance of the grant is refused whatever the HELLOs say."""
    pcore = platform_core(tmp_path)
    pcore.register([A], units=2)
    p = platform(pcore)
    p.s.max_connections_per_org = 1  # allowance: 1, one more for the second unit granted
    p.gate = InlineGate()
    a = Endpoint.org(A)
    async with trio.open_nursery() as nursery:
        greedy = Peer()
        nursery.start_soon(p._handle, greedy.pair())
        await greedy.send(Frame(kind=Kind.HELLO, source=a, target=P, body=Hello(semq_id=1, units=8)))
        await greedy.read_until(lambda: bool(greedy.frames(Kind.ERROR)))
        err = greedy.frames(Kind.ERROR)[0].frame.body
        assert isinstance(err, Error) and err.code is ResultCode.INVALID_FIELD
        assert "units 8 exceeds the 2 unit(s) organization 10008 is granted here" in err.message
        assert "semq platform register 10008 --units 8" in err.message
        u1, u2, third = Peer(), Peer(), Peer()
        for unit, peer in ((1, u1), (2, u2)):
            nursery.start_soon(p._handle, peer.pair())
            await peer.send(Frame(kind=Kind.HELLO, source=a, target=P, body=Hello(semq_id=unit, units=2)))
            await peer.read_until(lambda peer=peer: bool(peer.frames(Kind.WELCOME)))
        nursery.start_soon(p._handle, third.pair())
        await third.send(Frame(kind=Kind.HELLO, source=a, target=P, body=Hello(semq_id=1, units=2)))
        await third.read_until(lambda: bool(third.frames(Kind.ERROR)))
        err = third.frames(Kind.ERROR)[0].frame.body
        assert isinstance(err, Error) and err.code is ResultCode.TOO_MANY_CONNECTIONS
        assert "10008 already holds 2 connections, the most it may (2)" in err.message
        assert p.admission.by_identity == {A: 2}
        nursery.cancel_scope.cancel()
    assert p.admission.open == 0  # every connection left, whatever happened
    pcore.close()
