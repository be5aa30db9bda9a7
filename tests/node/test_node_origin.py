"""The origin's claim (SPEC A.2) with ``early``: DATA leaves before the
commit, and a commit that fails after the frames left loses nothing."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from semq.node.core import NewDocument, NodeCore
from semq.umxt_protocol import (
    AckBatch,
    AckEntry,
    AckFlag,
    Endpoint,
    ForwardFlag,
    Frame,
    Kind,
    RawFrame,
)
from tests._frames import raw
from tests.conftest import NodeClock

A, B = "10008", "56001"
P = Endpoint.platform()


_raw = raw


def _acks(kind: Kind, source: Endpoint, ids: list[int]) -> RawFrame:
    flag = {Kind.ACK_FWD: int(ForwardFlag.FORWARDED), Kind.ACK_SAVE: int(ForwardFlag.STORED)}.get(kind, 0)
    ack_flag = AckFlag.PLATFORM if kind in (Kind.ACK_FWD, Kind.ACK_SAVE) else AckFlag.DELIVERY
    entries = tuple(AckEntry(1, 1, 100 + i, 1, 1, i, int(ack_flag), flag) for i in ids)
    return _raw(Frame(kind=Kind.ACK_BATCH, source=source, target=Endpoint.org(A), origin=source,
                      body=AckBatch(ack_kind=kind, entries=entries)))


def _write(a: NodeCore) -> None:
    """What is held in memory, written now (as HOLD_MS later would)."""
    with a._tx():
        a.write_deferred()


def _states(path: Path) -> list[tuple[int, int, int]]:
    c = sqlite3.connect(path)
    try:
        return c.execute("SELECT id, state, attempts FROM outbox ORDER BY id").fetchall()
    finally:
        c.close()


class _Port:
    """A FramePort (semq.session.ports) that hands the claim's frames to a test function."""

    def __init__(self, put: Callable[[list[bytes]], None]) -> None:
        self.put = put


def test_early_frames_leave_before_the_commit(tmp_path: Path) -> None:
    store = tmp_path / "node.sqlite"
    a = NodeCore(store, A, create=True, synchronous="FULL", platform=P)
    try:
        a.accept([NewDocument(target=B, app_data=b"doc %d" % i) for i in range(3)])
        seen: list[tuple[int, list[tuple[int, int, int]]]] = []

        def early(frames: list[bytes]) -> None:
            # Another connection still sees the rows as they were: not committed yet.
            seen.append((len(frames), _states(store)))

        out = a.claim(10, port=_Port(early))
        assert seen == [(3, [(1, 0, 0), (2, 0, 0), (3, 0, 0)])]
        assert (out.data, out.early) == ([], 3)
        # SS_SENT is held in memory (SS_INIT on disk) until HOLD_MS or a
        # reason to write it; the next claim skips the held rows.
        assert _states(store) == [(1, 0, 0), (2, 0, 0), (3, 0, 0)]
        assert a.counts()["outbox"] == {"SS_INIT": 0, "SS_SENT": 3}
        assert a.claim(10, port=_Port(early)).early == 0  # nothing left: not called
        assert len(seen) == 1
        _write(a)
        assert _states(store) == [(1, 1, 1), (2, 1, 1), (3, 1, 1)]
    finally:
        a.close()


def test_a_commit_that_fails_after_the_frames_left_loses_nothing(tmp_path: Path) -> None:
    store = tmp_path / "node.sqlite"
    a = NodeCore(store, A, create=True, synchronous="FULL", platform=P)
    try:
        a.accept([NewDocument(target=B, app_data=b"doc %d" % i) for i in range(2)])
        sent: list[bytes] = []

        def early_then_fail(frames: list[bytes]) -> None:
            sent.extend(frames)
            raise sqlite3.OperationalError("disk I/O error")  # as a failed COMMIT would

        with pytest.raises(sqlite3.OperationalError):
            a.claim(10, port=_Port(early_then_fail))
        assert len(sent) == 2
        assert _states(store) == [(1, 0, 0), (2, 0, 0)]  # SS_INIT, as if never claimed
        # The platform's ACK_FWD for the copies that left finds the rows SS_INIT:
        # unchanged (ORIGIN_TABLE), so they go again ...
        a.handle([_acks(Kind.ACK_FWD, P, [1, 2])])
        assert _states(store) == [(1, 0, 0), (2, 0, 0)]
        again = a.claim(10)
        assert len(again.data) == 2 and set(a.outbox.sent) == {1, 2}
        _write(a)
        assert _states(store) == [(1, 1, 1), (2, 1, 1)]
        # ... the receiver's ACK2 (of either copy, same LK0) confirms them.
        out = a.handle([_acks(Kind.ACK2, Endpoint.org(B), [1, 2])])
        assert _states(store) == []  # SS_ACK2: confirmed end to end and cleaned up
        assert len(out.data) == 1  # one ACK_BATCH of REACK2 back to the receiver
    finally:
        a.close()


def test_no_partial_index_uses_an_in_list(tmp_path: Path) -> None:
    """SQLite evaluates a partial index's condition for the old and the new row
    of every UPDATE, and an IN list of constants through a temporary table:
    ``state IN (1, 2, 3)`` in outbox_due cost an origin 16 us per document
    (node schema v7 writes it ``BETWEEN``). Guard every store's indexes."""
    from semq.node.store import open_node_store
    from semq.platform.store import open_platform_store

    for db in (open_node_store(tmp_path / "n.sqlite", create=True), open_platform_store(tmp_path / "p.sqlite", create=True)):
        try:
            sqls = [r[0] for r in db.execute_sql("SELECT sql FROM sqlite_master WHERE type='index' AND sql IS NOT NULL")]
            assert sqls
            for sql in sqls:
                where = sql.upper().partition(" WHERE ")[2]
                assert " IN (" not in where and " IN(" not in where, sql
        finally:
            db.close()
    a = NodeCore(tmp_path / "n.sqlite", A)
    try:
        plan = a.conn.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM outbox INDEXED BY outbox_due WHERE reliable=1 AND state BETWEEN 1 AND 3"
            " AND due_ms <= 5 ORDER BY due_ms").fetchall()
        assert any("outbox_due" in str(r) for r in plan)
    finally:
        a.close()


# ------------------------------------------------------- ACK_FWD held in memory


def _full(path: Path) -> list[tuple[int, int, int, int]]:
    c = sqlite3.connect(path)
    try:
        return c.execute("SELECT id, state, state_ms, due_ms FROM outbox ORDER BY id").fetchall()
    finally:
        c.close()



def _claimed(tmp_path: Path, n: int, **kw: object) -> tuple[NodeCore, Path]:
    store = tmp_path / "node.sqlite"
    a = NodeCore(store, A, create=True, platform=P, **kw)  # type: ignore[arg-type]
    a.accept([NewDocument(target=B, app_data=b"doc %d" % i) for i in range(n)])
    assert len(a.claim(10).data) == n
    return a, store


def test_an_ack2_soon_after_the_ack_fwd_deletes_a_row_never_written_forwarded(
        tmp_path: Path, node_clock: NodeClock) -> None:
    a, store = _claimed(tmp_path, 3)
    try:
        out = a.handle([_acks(Kind.ACK_FWD, P, [1, 2, 3])])
        assert out.settled == 3  # window credit at the platform's ack, as before
        assert [r[1] for r in _full(store)] == [0, 0, 0]  # still SS_INIT on disk (SS_SENT held too)
        # ... and counted where it is, by status and the metrics.
        from semq.ops.metrics import node_snapshot

        assert a.counts()["outbox"] == {"SS_INIT": 0, "SS_SENT": 0, "SS_ACK_FWD": 3}
        assert a.deferred() and len(a.outbox.fwd) == 3 and len(a.outbox.sent) == 3 and not a.pending_acks.deferred
        msgs = node_snapshot(a, 3600)["messages"]
        assert (msgs[("outbox", "SS_INIT")], msgs[("outbox", "SS_SENT")], msgs[("outbox", "SS_ACK_FWD")]) == (0, 0, 3)
        node_clock.t += 200
        out = a.handle([_acks(Kind.ACK2, Endpoint.org(B), [1, 2])])
        assert out.settled == 0  # no second credit: the held state counts
        assert len(out.data) == 1  # REACK2 for both
        assert [r[:2] for r in _full(store)] == [(3, 0)]
        assert a.outbox.fwd == {3: (1_000_000, 0)} and a.outbox.sent == {3: (1_000_000, 1, B, 3, 1, None)}
        # Past HOLD_MS the next batch writes the held states, SS_SENT first,
        # with the time of the ACK_FWD and the inquiry schedule it would have had.
        node_clock.t += 1000
        a.handle([])
        (rid, state, state_ms, due_ms), = _full(store)
        assert (rid, state, state_ms) == (3, 2, 1_000_000) and due_ms == 1_000_000 + a.inquiry_ms
        assert _states(store) == [(3, 2, 1)]
        assert a.outbox.fwd == {} and a.outbox.sent == {}
        out = a.handle([_acks(Kind.ACK2, Endpoint.org(B), [3])])
        assert _full(store) == [] and out.settled == 0
    finally:
        a.close()


def test_every_step_sees_the_held_state(tmp_path: Path, node_clock: NodeClock) -> None:
    """A duplicate ACK_FWD changes nothing; the target's "not received" (a
    step from SS_ACK_FWD only) sends the row again; a NACK fails it; and an
    ACK_FWD and ACK2 in one batch never write the forwarded state."""
    from semq.node.core import Output
    from semq.node.engine import OriginEvent, SendState

    a, store = _claimed(tmp_path, 4)
    try:
        a.handle([_acks(Kind.ACK_FWD, P, [1, 2, 3])])
        a.handle([_acks(Kind.ACK_FWD, P, [1])])  # duplicate: unchanged, still held
        assert set(a.outbox.fwd) == {1, 2, 3}
        with a._tx():
            a.origin.apply([(2, OriginEvent.TARGET_LACKS)], 1_000_000, Output(), [], {})
            a.origin.apply([(3, OriginEvent.NACK)], 1_000_000, Output(), [], {}, code=7, detail="refused")
        assert set(a.outbox.fwd) == {1} and set(a.outbox.sent) == {1, 4}
        # Rows 2 and 3 got their new state written with the held send (attempt 1).
        assert _states(store) == [(1, 0, 0), (2, int(SendState.SS_INIT), 1), (3, int(SendState.SS_FAILED), 1),
                                  (4, 0, 0)]
        a.handle([_acks(Kind.ACK_FWD, P, [4]), _acks(Kind.ACK2, Endpoint.org(B), [4])])
        assert 4 not in a.outbox.fwd and 4 not in a.outbox.sent and [r[0] for r in _full(store)] == [1, 2, 3]
        # Row 2, SS_INIT again and not held, is claimed again; row 1 (held) is not.
        out = a.claim(10)
        assert len(out.data) == 1 and a.outbox.sent[2][1] == 2
    finally:
        a.close()


def test_held_states_are_written_by_inquiries_reconnect_and_close(
        tmp_path: Path, node_clock: NodeClock) -> None:
    a, store = _claimed(tmp_path, 3, inquiry_interval=0.2)
    try:
        a.handle([_acks(Kind.ACK_FWD, P, [1])])
        node_clock.t += 150
        a.handle([_acks(Kind.ACK_FWD, P, [2])])
        # An inquiry round writes what is older than half the interval (here
        # 100 ms), so a row it finds due is asked about as forwarded (to B).
        a.inquiries()
        assert [r[1] for r in _full(store)] == [2, 1, 1] and set(a.outbox.fwd) == {2}
        a.reconnected()  # a new session: everything held is written
        assert [r[1] for r in _full(store)] == [2, 2, 1] and a.outbox.fwd == {}
        a.handle([_acks(Kind.ACK_FWD, P, [3])])
    finally:
        a.close()  # writes the last one
    assert [r[1] for r in _full(store)] == [2, 2, 2]


def test_a_held_state_lost_in_a_crash_is_asked_for_again(tmp_path: Path, node_clock: NodeClock) -> None:
    """Nothing we sent depended on it: after a crash the row is SS_SENT, asks
    the platform, and its answer FORWARDED makes it SS_ACK_FWD."""
    from semq.umxt_protocol import (
        LK0,
        InquiryAnswer,
        InquiryFlag,
        InquiryResp,
        InquiryResult,
        InquiryTopic,
    )

    a, store = _claimed(tmp_path, 1)
    a.handle([_acks(Kind.ACK_FWD, P, [1])])
    a.outbox.fwd.clear()  # as a kill -9 would
    a.close()
    a = NodeCore(store, A, platform=P)
    try:
        assert [r[1] for r in _full(store)] == [1]
        resp = Frame(kind=Kind.INQUIRY_RESP, source=P, target=Endpoint.org(A), origin=P,
                     body=InquiryResp(topic=InquiryTopic.RECEIVED, flag=InquiryFlag.FROM_PLATFORM,
                                      answers=(InquiryAnswer(LK0(endpoint=Endpoint.org(A), record_id=1),
                                                             InquiryResult.FORWARDED),)))
        a.handle([_raw(resp)])
        a.reconnected()
        assert [r[1] for r in _full(store)] == [2]
    finally:
        a.close()


# ------------------------------------------------------- SS_SENT held in memory


def _sent_cols(path: Path) -> list[tuple[int, ...]]:
    c = sqlite3.connect(path)
    try:
        return c.execute("SELECT id, state, attempts, sent_ms, state_ms, last_inquiry_ms, due_ms FROM outbox"
                         " ORDER BY id").fetchall()
    finally:
        c.close()


def test_a_claimed_row_is_written_sent_as_the_claim_wrote_it(tmp_path: Path, node_clock: NodeClock) -> None:
    """Past HOLD_MS, a claimed row not yet acked gets what the claim's UPDATE
    gave it before the hold: SS_SENT, the attempt, the send time and the
    first inquiry one interval later (doubled per earlier attempt)."""
    from semq.node.engine import OriginEvent

    a, store = _claimed(tmp_path, 2)
    try:
        t0 = node_clock.t
        assert [r[1:3] for r in _sent_cols(store)] == [(0, 0), (0, 0)]
        node_clock.t += 500
        a.handle([])  # younger than HOLD_MS: nothing written
        assert [r[1:3] for r in _sent_cols(store)] == [(0, 0), (0, 0)]
        node_clock.t += 500
        a.handle([])
        assert _sent_cols(store) == [(i, 1, 1, t0, t0, t0, t0 + a.inquiry_ms) for i in (1, 2)]
        assert a.outbox.sent == {}
        # The platform lacks row 1: SS_INIT, sent again (attempt 2, held),
        # and written with the doubled first inquiry.
        from semq.node.core import Output

        with a._tx():
            a.origin.apply([(1, OriginEvent.PLATFORM_LACKS)], node_clock.t, Output(), [], {})
        t1 = node_clock.t
        assert len(a.claim(10).data) == 1 and {k: v[:2] for k, v in a.outbox.sent.items()} == {1: (t1, 2)}
        node_clock.t += 1000
        a.handle([])
        assert _sent_cols(store)[0] == (1, 1, 2, t1, t1, t1, t1 + 2 * a.inquiry_ms)
    finally:
        a.close()


def test_claims_keep_the_send_order_around_held_rows(tmp_path: Path, node_clock: NodeClock) -> None:
    """Held rows are skipped, not reordered: a later document of higher
    priority goes first; the rest follow in acceptance order; the limit
    counts rows sent, not rows skipped."""
    store = tmp_path / "node.sqlite"
    a = NodeCore(store, A, create=True, platform=P)
    try:
        a.accept([NewDocument(target=B, app_data=b"doc %d" % i) for i in range(5)])  # ids 1-5
        assert len(a.claim(2).data) == 2 and set(a.outbox.sent) == {1, 2}
        a.accept([NewDocument(target=B, app_data=b"urgent", priority=5)])  # id 6
        a.accept([NewDocument(target=B, app_data=b"doc 6")])  # id 7
        assert len(a.claim(2).data) == 2 and list(a.outbox.sent) == [1, 2, 6, 3]
        assert len(a.claim(10).data) == 3 and list(a.outbox.sent) == [1, 2, 6, 3, 4, 5, 7]
        assert a.claim(10).data == [] and a.pending_count() == 0
    finally:
        a.close()


def test_an_ack_save_writes_the_held_send_with_the_new_state(tmp_path: Path, node_clock: NodeClock) -> None:
    """The target is offline: ACK_SAVE comes instead of ACK_FWD, and the row's
    held SS_SENT goes with SS_ACK in one UPDATE (attempt and send time kept)."""
    a, store = _claimed(tmp_path, 2)
    try:
        t0 = node_clock.t
        node_clock.t += 100
        a.handle([_acks(Kind.ACK_SAVE, P, [1, 2])])
        assert a.outbox.sent == {}
        assert [r[:5] for r in _sent_cols(store)] == [(i, 3, 1, t0, t0 + 100) for i in (1, 2)]
    finally:
        a.close()


def test_fail_target_and_the_attempt_limit_leave_rows_in_flight_alone(
        tmp_path: Path, node_clock: NodeClock) -> None:
    """Rows whose SS_SENT is held are SS_INIT on disk, yet in flight: making
    the unsent documents of a target dead letters, or applying the attempt
    limit, writes the held states first and so leaves them alone."""
    from semq.node.engine import SendState
    from semq.node.features import dead
    from semq.umxt_protocol import ResultCode

    a, store = _claimed(tmp_path, 2)
    try:
        a.accept([NewDocument(target=B, app_data=b"not sent")])  # id 3
        assert a.fail_target(Endpoint.org(B), ResultCode.UNKNOWN_TARGET, "gone") == 1
        assert [r[1] for r in _sent_cols(store)] == [1, 1, int(SendState.SS_FAILED)]
        # Row 1 is sent again (SS_INIT with 1 attempt on disk, then claimed
        # and held): in flight, not a dead letter at a limit of 1 attempt.
        from semq.node.core import Output
        from semq.node.engine import OriginEvent

        with a._tx():
            a.origin.apply([(1, OriginEvent.PLATFORM_LACKS)], node_clock.t, Output(), [], {})
        assert len(a.claim(10).data) == 1 and a.outbox.sent[1][1] == 2
        assert _sent_cols(store)[0][1:3] == (0, 1)
        assert dead.sweep(a, max_attempts=1) == 0
        assert [r[1:3] for r in _sent_cols(store)] == [(1, 2), (1, 1), (int(SendState.SS_FAILED), 0)]
    finally:
        a.close()


def test_a_held_send_lost_in_a_crash_sends_the_row_again(tmp_path: Path, node_clock: NodeClock) -> None:
    """Killed before the held SS_SENT was written: the row is SS_INIT, is
    claimed again after the restart, and the ACK2 of either copy confirms it
    (the receiver's duplicate suppression keeps the delivery single)."""
    a, store = _claimed(tmp_path, 1)
    a.outbox.sent.clear()  # as a kill -9 would
    a.close()
    a = NodeCore(store, A, platform=P)
    try:
        assert [r[1:3] for r in _sent_cols(store)] == [(0, 0)]
        assert len(a.claim(10).data) == 1
        out = a.handle([_acks(Kind.ACK2, Endpoint.org(B), [1])])
        assert _sent_cols(store) == [] and len(out.data) == 1
    finally:
        a.close()


def test_claims_read_past_held_rows_and_miss_no_row_put_back(tmp_path: Path, node_clock: NodeClock) -> None:
    """The claims read the send order after the held rows (``SendOrder``),
    yet a row that becomes SS_INIT below that point is claimed: put back by a
    resend at once, by another process (a requeue) after the next inquiry
    round, and a row left out for want of a certificate stops the point."""
    from semq.node.core import Output
    from semq.node.engine import OriginEvent

    a, store = _claimed(tmp_path, 4)
    try:
        assert a.outbox.order.after == {(None, 0): 4}
        a.accept([NewDocument(target=B, app_data=b"doc 4")])  # id 5
        assert len(a.claim(10).data) == 1 and a.outbox.order.after == {(None, 0): 5}
        # Another process puts row 2 back (held here: SS_INIT on disk already,
        # so take one written and failed instead).
        _write(a)
        c = sqlite3.connect(store)
        c.execute("UPDATE outbox SET state=5 WHERE id=2")
        c.commit()
        a.accept([NewDocument(target=B, app_data=b"doc 5")])  # id 6
        assert len(a.claim(10).data) == 1 and a.outbox.order.after == {(None, 0): 6}
        c.execute("UPDATE outbox SET state=0 WHERE id=2")  # requeued by another process
        c.commit()
        c.close()
        a.accept([NewDocument(target=B, app_data=b"doc 6")])  # id 7
        assert len(a.claim(10).data) == 1 and 2 not in a.outbox.sent  # not seen yet ...
        a.inquiries()
        assert len(a.claim(10).data) == 1 and 2 in a.outbox.sent  # ... after the next round
        # A resend puts a held row back: the next claim takes it at once.
        with a._tx():
            a.origin.apply([(7, OriginEvent.PLATFORM_LACKS)], node_clock.t, Output(), [], {})
        assert a.outbox.order.after == {} and len(a.claim(10).data) == 1 and a.outbox.sent[7][1] == 2
    finally:
        a.close()


def test_a_row_left_out_of_a_claim_is_claimed_later(tmp_path: Path, node_clock: NodeClock,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """With security, a row whose target certificate is unknown stays SS_INIT
    (the origin's _protect leaves it out): the point the claims read from stops
    before it, so it goes once the certificate is there."""
    store = tmp_path / "node.sqlite"
    a = NodeCore(store, A, create=True, platform=P)
    try:
        a.accept([NewDocument(target=B, app_data=b"doc %d" % i) for i in range(4)])
        from semq.node.origin.role import Origin

        real = Origin._protect
        monkeypatch.setattr(Origin, "_protect", lambda self, rows, out: ([r for r in rows if r.id != 2], {}))
        assert len(a.claim(10).data) == 3 and set(a.outbox.sent) == {1, 3, 4}
        assert a.outbox.order.after == {(None, 0): 1}
        a.accept([NewDocument(target=B, app_data=b"doc 4")])  # id 5
        assert len(a.claim(10).data) == 1 and a.outbox.order.after == {(None, 0): 1}
        monkeypatch.setattr(Origin, "_protect", real)
        assert len(a.claim(10).data) == 1 and 2 in a.outbox.sent and a.outbox.order.after == {(None, 0): 5}
    finally:
        a.close()


def test_acks_of_claimed_rows_are_applied_from_memory_as_from_the_rows(
        tmp_path: Path, node_clock: NodeClock) -> None:
    """The acks of a row whose SS_SENT is held take its target, SaveFwd and
    Ack2 from what the claim kept, without reading the row: every answer,
    state, credit and event is what the same acks give rows read from disk
    (the same claims with their states written first)."""
    from semq.umxt_protocol import SaveFwd

    C = "56002"
    docs = [NewDocument(target=t, app_data=b"doc %d" % i, save_fwd=sf, ack2=ack2)
            for i, (t, sf, ack2) in enumerate([(B, SaveFwd.MUST_DELIVER, True), (B, SaveFwd.STORE, True),
                                                (C, SaveFwd.MUST_DELIVER, True), (B, SaveFwd.MUST_DELIVER, False),
                                                (C, SaveFwd.STORE, False), (B, SaveFwd.MUST_DELIVER, True)])]
    acks = [
        [_acks(Kind.ACK_FWD, P, [1, 2, 3, 4])],
        [_acks(Kind.ACK_SAVE, P, [5, 6])],
        [_acks(Kind.ACK2, Endpoint.org(C), [1, 3])],  # row 1 is B's: not C's to confirm
        [_acks(Kind.ACK2, Endpoint.org(B), [1, 4, 6])],  # row 2 stays forwarded, unconfirmed
    ]
    seen = {}
    for way in ("memory", "disk"):
        store = tmp_path / way / "node.sqlite"
        store.parent.mkdir()
        node_clock.t = 1_000_000
        a = NodeCore(store, A, create=True, platform=P, events_dir=tmp_path / way / "events")
        try:
            a.accept(docs)
            assert len(a.claim(10).data) == 6
            if way == "disk":
                _write(a)
            assert len(a.outbox.sent) == (6 if way == "memory" else 0)
            statements: list[str] = []
            a.conn.set_trace_callback(statements.append)
            results = []
            for batch in acks:
                out = a.handle(batch)
                results.append((out.settled, sorted(out.data)))
            a.conn.set_trace_callback(None)
            reads = [s for s in statements if s.startswith("SELECT id, target_id, state")]
            if way == "memory":  # only row 6, written SS_ACK_SAVE by its ACK_SAVE, is read (for its ACK2)
                assert [s.split(" WHERE ")[1] for s in reads] == ["id BETWEEN 6 AND 6"]
            else:
                assert len(reads) == len(acks)
            _write(a)
            rows = a.conn.execute("SELECT id, state, code, attempts FROM outbox ORDER BY id").fetchall()
            events = [{k: v for k, v in e.items() if k != "ts"}
                      for f in sorted((tmp_path / way / "events").glob("*.jsonl"))
                      for e in map(__import__("json").loads, f.read_text().splitlines())]
            seen[way] = (results, rows, [e for e in events if e["event"] != "queued"])
        finally:
            a.close()
    assert seen["memory"] == seen["disk"]
    results, rows, events = seen["memory"]
    assert [r[:2] for r in rows] == [(2, 2)]  # SS_ACK_FWD; the rest confirmed and cleaned
    assert [e["lk0"] for e in events if e["event"] == "cleaned"] == [f"{A}/1/1/{i}" for i in (5, 3, 1, 4, 6)]
    assert {e["event"] for e in events} >= {"ack_fwd", "ack_save", "ack2", "cleaned"}


def test_events_are_logged_only_after_their_commit(tmp_path: Path) -> None:
    """docs/events.md: a line is appended after the state change it tells of
    is committed, so the log never shows what the store does not have. A
    claim whose commit fails logs no ``sent``; one that commits logs them
    after the commit, not while it is pending."""
    import json

    store = tmp_path / "node.sqlite"
    a = NodeCore(store, A, create=True, platform=P, events_dir=tmp_path / "events")

    def logged() -> list[str]:
        return [json.loads(line)["event"] for f in sorted((tmp_path / "events").glob("*.jsonl"))
                for line in f.read_text().splitlines()]

    try:
        a.accept([NewDocument(target=B, app_data=b"doc %d" % i) for i in range(2)])
        assert logged() == ["queued", "queued"]

        def early_then_fail(frames: list[bytes]) -> None:
            raise sqlite3.OperationalError("disk I/O error")  # as a failed COMMIT would

        with pytest.raises(sqlite3.OperationalError):
            a.claim(10, port=_Port(early_then_fail))
        assert logged() == ["queued", "queued"]  # nothing of a claim that did not commit
        during: list[list[str]] = []
        a.claim(10, port=_Port(lambda frames: during.append(logged())))
        assert during == [["queued", "queued"]]  # the commit was still pending
        assert logged() == ["queued", "queued", "sent", "sent"]
    finally:
        a.close()
