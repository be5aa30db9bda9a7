"""Inquiries back off (docs/design.md, "Inquiries and their backoff"):
a row nobody confirms is asked about one interval after its last change,
then at a doubling interval, never less often than every 15 minutes, so a
long-offline target is asked rarely; an SS_SENT row asks at once on a new
session. The same holds for the receiver's pending-ack rows and for the
platform's delivered, unacked copies (of online targets only).

Each step checks that nothing is asked a millisecond before the row is due
and that it is asked when it is due, so the schedule below is the one the
cores follow, not one read back from a column."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from semq.node.core import NewDocument, NodeCore
from semq.platform.core import PlatformCore
from semq.umxt_protocol import (
    LK0,
    AckBatch,
    AckEntry,
    AckFlag,
    Data,
    Endpoint,
    ForwardFlag,
    Frame,
    FrameDecoder,
    Inquiry,
    Kind,
)
from tests._frames import raws
from tests.conftest import NodeClock
from tests.node.test_node_receiver import _doc
from tests.node.test_node_receiver import _frames as _received

A, B = "10008", "56001"
P = Endpoint.platform()
S = 1000
# The default interval (15 s), doubled per unanswered inquiry, at most 15 minutes.
SCHEDULE = [15 * S, 30 * S, 60 * S, 120 * S, 240 * S, 480 * S, 900 * S, 900 * S, 900 * S]


_raw = raws  # (one frame, as the list a batch is)


def _asked(data: list[bytes]) -> list[tuple[str, list[int]]]:
    """(target, record ids asked about) of every INQUIRY frame in ``data``."""
    dec = FrameDecoder()
    dec.receive_data(b"".join(data))
    out = []
    for raw in dec:
        body = raw.frame().body
        if isinstance(body, Inquiry):
            out.append((raw.target.node_id, sorted(i.record_id for i in body.items)))
    return sorted(out)


def _gaps(set_clock: Callable[[int], None], start: int, due: Callable[[], int],
          ask: Callable[[], list[tuple[str, list[int]]]], want: list[tuple[str, list[int]]]) -> list[int]:
    """Walk the schedule: before each due time nothing is asked, at it ``want``
    is. Returns the gaps between one inquiry (or ``start``) and the next."""
    gaps, last = [], start
    for _ in SCHEDULE:
        t = due()
        set_clock(t - 1)
        assert ask() == [], f"asked {t - 1 - last} ms after the last inquiry, before it was due"
        set_clock(t)
        assert ask() == want
        gaps.append(t - last)
        last = t
    return gaps


def test_origin_rows_back_off_to_15_minutes_and_sent_rows_ask_at_once_on_a_new_session(
        tmp_path: Path, node_clock: NodeClock) -> None:
    a = NodeCore(tmp_path / "node.sqlite", A, create=True, platform=P)  # inquiry interval 15 s
    try:
        stored, sent = (lk.record_id for lk in a.accept([NewDocument(target=B, app_data=b"order %d" % i)
                                                          for i in range(2)]))
        assert len(a.claim(10).data) == 2
        t0 = node_clock.t
        # The platform stored the first (SS_ACK: it asks the platform, which
        # owns delivery); the second's answer never came (SS_SENT).
        a.handle(_raw(Frame(kind=Kind.ACK_BATCH, source=P, target=Endpoint.org(A), origin=P, body=AckBatch(
            ack_kind=Kind.ACK_SAVE,
            entries=(AckEntry(1, 1, 1, 1, 1, stored, int(AckFlag.PLATFORM), int(ForwardFlag.STORED)),)))))

        def due() -> int:
            return int(a.conn.execute("SELECT min(due_ms) FROM outbox").fetchone()[0])

        def ask() -> list[tuple[str, list[int]]]:
            return _asked(a.inquiries().data)

        def set_clock(t: int) -> None:
            node_clock.t = t

        assert _gaps(set_clock, t0, due, ask, [("platform", sorted([stored, sent]))]) == SCHEDULE
        assert a.conn.execute("SELECT id, state FROM outbox ORDER BY id").fetchall() == [(stored, 3), (sent, 1)]
        # A new session: the SS_SENT row's answer may have died with the old
        # connection, so it asks at once; the stored row keeps its schedule.
        a.reconnected()
        assert ask() == [("platform", [sent])]
    finally:
        a.close()


def test_pending_ack_rows_back_off_to_15_minutes(tmp_path: Path, node_clock: NodeClock) -> None:
    b = NodeCore(tmp_path / "node.sqlite", B, create=True, platform=P)
    try:
        t0 = node_clock.t
        out = b.handle(_received(_doc(7, lk1=70)))  # a stored copy: REACK and REACK2 outstanding
        assert out.delivered == 1

        def due() -> int:
            if b.deferred():  # (held in memory until an inquiry round writes it)
                return t0 + SCHEDULE[0]
            last, n = b.conn.execute("SELECT last_inquiry_ms, inquiries FROM inbound").fetchone()
            return int(last + min(900 * S, 15 * S * (1 << min(n, 6))))

        def ask() -> list[tuple[str, list[int]]]:
            return _asked(b.inquiries().data)

        def set_clock(t: int) -> None:
            node_clock.t = t

        # Asked of the platform (its LK1) and of the origin (the LK0) together.
        assert _gaps(set_clock, t0, due, ask, [("10008", [7]), ("platform", [70])]) == SCHEDULE
    finally:
        b.close()


def test_the_platform_asks_online_targets_about_unacked_copies_backing_off_to_15_minutes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import semq.platform.core as core_mod

    clock = [1_000_000]
    monkeypatch.setattr(core_mod, "now_ms", lambda: clock[0])
    p = PlatformCore(tmp_path / "platform.sqlite", create=True, synchronous="OFF")  # inquiry interval 15 s
    try:
        p.register([A, B])
        a, b = Endpoint.org(A), Endpoint.org(B)
        p.handle(a, _raw(Frame(kind=Kind.DATA, source=a, target=b, body=Data(lk0=LK0(endpoint=a, record_id=5),
                                                                            app_data=b"order"))), {})
        _, n = p.claim_stored(b, 10)  # delivered to B, never acked
        assert n == 1
        t0 = clock[0]
        online = True

        def due() -> int:
            if p.held():
                return t0 + SCHEDULE[0]
            last, k = p.conn.execute("SELECT last_sent_ms, inquiries FROM stored").fetchone()
            return int(last + min(900 * S, 15 * S * (1 << min(k, 6))))

        def ask() -> list[tuple[str, list[int]]]:
            return _asked([f for fs in p.inquiries({b: 1 << 40} if online else {}).values() for f in fs])

        def set_clock(t: int) -> None:
            clock[0] = t

        assert _gaps(set_clock, t0, due, ask, [(B, [5])]) == SCHEDULE
        # A target that is offline is not asked (it is asked once it is back).
        online = False
        set_clock(due())
        assert ask() == []
        online = True
        assert ask() == [(B, [5])]
    finally:
        p.close()
