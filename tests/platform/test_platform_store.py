"""The platform's store path (SPEC P.2): DATA for an offline target is
stored in one look-up and one insert per batch, not one SELECT and one
INSERT per document, and still gives each copy one LK1 — the same one to a
resend whose ACK_SAVE was lost and to a copy repeated in the batch."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from semq.platform.core import PlatformCore
from semq.umxt_protocol import (
    LK0,
    AckBatch,
    AckEntry,
    AckFlag,
    Data,
    Endpoint,
    Frame,
    FrameDecoder,
    Inquiry,
    InquiryTopic,
    Kind,
    RawFrame,
    encode_frame,
)
from tests._frames import raws
from tests.protocol.test_protocol_strategies import PROTOCOL_SETTINGS, frames_of

A, B, C = "10008", "56001", "56002"
# Snapshots of the targets' room (semq.platform.core.Room): none online, or
# a target with room for anything these tests send.
OFFLINE: dict[Endpoint, int] = {}
ONLINE = 1 << 30


_raw = raws


def _data(src: Endpoint, dst: Endpoint, record_id: int) -> Frame:
    return Frame(kind=Kind.DATA, source=src, target=dst,
                 body=Data(lk0=LK0(endpoint=src, record_id=record_id), app_data=b"doc %d" % record_id))


def _saved(out_data: list[bytes]) -> list[tuple[int, int]]:
    """(LK0 record id, LK1 id) of every ACK_SAVE entry, in order."""
    d = FrameDecoder()
    d.receive_data(b"".join(out_data))
    pairs = []
    while (raw := d.next_frame()) is not None:
        body = raw.frame().body
        if isinstance(body, AckBatch) and body.ack_kind is Kind.ACK_SAVE:
            pairs += [(e.dest_ref_id, e.src_ref_id) for e in body.entries]  # LK0 record, LK1
    return pairs


def test_a_batch_of_stored_documents_gets_one_lk1_each_in_two_statements(tmp_path: Path) -> None:
    core = PlatformCore(tmp_path / "p.sqlite", create=True, synchronous="OFF")
    try:
        core.register([A, B, C])
        a, b, c = Endpoint.org(A), Endpoint.org(B), Endpoint.org(C)
        sql: list[str] = []
        core.conn.set_trace_callback(sql.append)
        # B and C offline. An inquiry A relays to B is stored between the
        # documents (its row id comes from SQLite, theirs from the batch);
        # document 1 is repeated in the batch.
        inquiry = Frame(kind=Kind.INQUIRY, source=a, target=b,
                        body=Inquiry(topic=InquiryTopic.RECEIVED, items=(LK0(endpoint=a, record_id=99),)))
        frames = [_data(a, b, 1), _data(a, c, 2), inquiry, *(_data(a, b, r) for r in range(3, 51)), _data(a, b, 1)]
        out = core.handle(a, _raw(*frames), OFFLINE)
        core.conn.set_trace_callback(None)
        assert out.errors == []
        saved = _saved(out.sends[a])
        assert [r for r, _ in saved] == [1, 2, *range(3, 51), 1]
        lk1 = dict(saved)
        assert saved[-1] == (1, lk1[1])  # the repeat names the same copy
        assert len(set(lk1.values())) == 50
        rows = core.conn.execute("SELECT id, kind, record_id, target_id, frame FROM stored ORDER BY id").fetchall()
        data_rows = {r[2]: (r[0], r[3], bytes(r[4])) for r in rows if r[1] == int(Kind.DATA)}
        assert len(rows) == 51 and len(data_rows) == 50
        for f in frames:
            if f.kind is Kind.DATA:
                assert data_rows[f.body.lk0.record_id] == (lk1[f.body.lk0.record_id], f.target.node_id,
                                                           encode_frame(f))
        assert out.stored_for == {b, c}
        # Per batch: one look-up of earlier copies, one insert of the new ones.
        per_doc = [s for s in sql if " stored" in s]
        assert sum(s.startswith("WITH k(") for s in per_doc) == 1, per_doc
        assert sum(s.startswith("INSERT INTO stored (id,") for s in per_doc) == 50  # one executemany
        assert len(per_doc) <= 50 + 3, per_doc

        # A resend of documents 2 and 7 (their ACK_SAVE lost) and a new one.
        out = core.handle(a, _raw(_data(a, c, 2), _data(a, b, 7), _data(a, b, 51)), OFFLINE)
        again = _saved(out.sends[a])
        assert again[:2] == [(2, lk1[2]), (7, lk1[7])]
        assert again[2][1] > max(r[0] for r in rows)  # never an id used before
        assert core.conn.execute("SELECT count(*) FROM stored").fetchone() == (52,)

        # A copy already handed to its target (state SENT) is not reused: a
        # resend then is a new copy, as before (the receiver drops the repeat).
        _, n = core.claim_stored(c, 10)
        assert n == 1
        out = core.handle(a, _raw(_data(a, c, 2)), OFFLINE)
        (copy,) = _saved(out.sends[a])
        assert copy[0] == 2 and copy[1] != lk1[2]
    finally:
        core.close()


# ------------------------------------------- a delivered copy's SS_SENT held in memory


def _clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    import semq.platform.core as core_mod

    t = [1_000_000]
    monkeypatch.setattr(core_mod, "now_ms", lambda: t[0])
    return t


def _acks(b: Endpoint, lk1_ids: list[int]) -> list[RawFrame]:
    entries = tuple(AckEntry(1, 1, 500 + i, 1, 1, i, int(AckFlag.PLATFORM), 0) for i in lk1_ids)
    return _raw(Frame(kind=Kind.ACK_BATCH, source=b, target=Endpoint.platform(),
                      body=AckBatch(ack_kind=Kind.ACK, entries=entries)))


def _stored(core: PlatformCore) -> list[tuple[int, int, int, int | None]]:
    return core.conn.execute("SELECT id, state, attempts, last_sent_ms FROM stored ORDER BY id").fetchall()


def test_a_delivered_copy_acked_soon_is_never_written_sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The target's ACK deletes a delivered copy within a fraction of a
    second: its SS_SENT waits in memory and is not written. The next claim
    skips the copies in flight; one still unacked after HOLD_MS is written
    as the claim wrote it before (SS_SENT, attempt, time); the metrics and
    the window credit count held copies as delivered."""
    from semq.ops.metrics import platform_snapshot

    t = _clock(monkeypatch)
    core = PlatformCore(tmp_path / "p.sqlite", create=True, synchronous="OFF")
    try:
        core.register([A, B])
        a, b = Endpoint.org(A), Endpoint.org(B)
        core.handle(a, _raw(*(_data(a, b, i) for i in range(1, 5))), OFFLINE)  # stored: ids 1-4
        assert core.claim_stored(b, 3)[1] == 3 and core.held_count() == 3
        assert [r[1:3] for r in _stored(core)] == [(0, 0)] * 4  # SS_INIT on disk
        msgs = platform_snapshot(core, 3600)["messages"]
        assert (msgs[("stored", "SS_INIT")], msgs[("stored", "SS_SENT")]) == (1, 3)
        assert core.claim_stored(b, 10)[1] == 1  # only id 4: the held ones are skipped
        assert core.claim_stored(b, 10)[1] == 0
        t[0] += 200
        out = core.handle(b, _acks(b, [1, 2]), {b: ONLINE})
        assert out.credit[b] == 2  # window credit as for SS_SENT
        assert [r[0] for r in _stored(core)] == [3, 4] and core.held_count() == 2
        t[0] += 1000
        core.handle(b, [], {b: ONLINE})
        assert _stored(core) == [(3, 1, 1, 1_000_000), (4, 1, 1, 1_000_000)] and not core.held()
        out = core.handle(b, _acks(b, [3, 4]), {b: ONLINE})
        assert out.credit[b] == 2 and _stored(core) == []
    finally:
        core.close()


def test_held_copies_go_again_after_a_reconnect_or_a_failed_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reconnect writes the held deliveries (their attempts count) and puts
    them back to SS_INIT; a transaction that does not commit drops what is
    held, as a crash would: the copies are SS_INIT on disk and go again."""
    import sqlite3

    _clock(monkeypatch)
    core = PlatformCore(tmp_path / "p.sqlite", create=True, synchronous="OFF")
    try:
        core.register([A, B, C])
        a, b, c = Endpoint.org(A), Endpoint.org(B), Endpoint.org(C)
        core.handle(a, _raw(_data(a, b, 1), _data(a, b, 2), _data(a, c, 3)), OFFLINE)
        assert core.claim_stored(b, 10)[1] == 2 and core.claim_stored(c, 10)[1] == 1
        assert core.connected(b)  # B's copies go again; C's stays delivered (written)
        assert [r[:3] for r in _stored(core)] == [(1, 0, 1), (2, 0, 1), (3, 1, 1)] and not core.held()
        assert core.claim_stored(b, 10)[1] == 2 and core.claim_stored(c, 10)[1] == 0
        assert core.copies._held[1].attempts == 2  # the second attempt

        def fail(*_a: object) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        monkeypatch.setattr(core.seen, "flush", fail)  # (the batch's last write: semq.platform.seen)
        with pytest.raises(sqlite3.OperationalError):
            core.handle(a, _raw(_data(a, b, 9)), OFFLINE)
        monkeypatch.delattr(core.seen, "flush")
        assert not core.held()
        assert core.claim_stored(b, 10)[1] == 2 and core.claim_stored(c, 10)[1] == 0
    finally:
        core.close()
    # close() wrote what was held.
    core = PlatformCore(tmp_path / "p.sqlite")
    try:
        assert [r[:3] for r in _stored(core)] == [(1, 1, 2), (2, 1, 2), (3, 1, 1)]
    finally:
        core.close()


def test_a_copy_the_target_lacks_is_delivered_again_past_the_held_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Claims read each target's send order after its held copies; a copy
    that becomes SS_INIT below that point (the target's inquiry answer says
    it lacks it, or an OVER_WINDOW refusal) is read again at once."""
    from semq.platform.engine import StoredEvent

    t = _clock(monkeypatch)
    core = PlatformCore(tmp_path / "p.sqlite", create=True, synchronous="OFF")
    try:
        core.register([A, B, C])
        a, b, c = Endpoint.org(A), Endpoint.org(B), Endpoint.org(C)
        core.handle(a, _raw(*(_data(a, b, i) for i in range(1, 4)), _data(a, c, 4)), OFFLINE)
        copies = core.copies
        assert core.claim_stored(b, 10)[1] == 3 and copies._order.after == {(b, 0): 3}
        assert core.claim_stored(c, 10)[1] == 1 and copies._order.after == {(b, 0): 3, (c, 0): 4}
        with core._tx():
            assert copies.settle([2], StoredEvent.TARGET_LACKS, b, t[0], []) == 1
        assert copies._order.after == {} and 2 not in copies._held
        assert core.claim_stored(b, 10)[1] == 1 and copies._held[2].attempts == 2
    finally:
        core.close()


def test_an_inquiry_round_writes_held_copies_and_asks_about_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An inquiry round writes what is held longer than half the interval, so
    a delivered copy still unacked is asked about, not missed."""
    t = _clock(monkeypatch)
    core = PlatformCore(tmp_path / "p.sqlite", create=True, synchronous="OFF", inquiry_interval=0.2)
    try:
        core.register([A, B])
        a, b = Endpoint.org(A), Endpoint.org(B)
        core.handle(a, _raw(_data(a, b, 1)), OFFLINE)
        assert core.claim_stored(b, 10)[1] == 1 and core.held()
        t[0] += 250
        sends = core.inquiries({b: ONLINE})
        assert not core.held() and _stored(core)[0][1] == 1 and len(sends[b]) == 1
    finally:
        core.close()


def test_acks_of_held_copies_are_settled_from_memory_as_from_the_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A target's ack of a copy whose delivery is held takes the copy's LK0
    and target from what the claim kept, without reading the row: the
    credit, the rows left and the events are what the same acks give copies
    read from disk (the same deliveries written first); an ack from another
    organization settles nothing of the target's, either way."""
    import json

    t = _clock(monkeypatch)
    seen = {}
    for way in ("memory", "disk"):
        t[0] = 1_000_000
        (tmp_path / way).mkdir()
        core = PlatformCore(tmp_path / way / "p.sqlite", create=True, synchronous="OFF",
                            events_dir=tmp_path / way / "events")
        try:
            core.register([A, B, C])
            a, b, c = Endpoint.org(A), Endpoint.org(B), Endpoint.org(C)
            core.handle(a, _raw(*(_data(a, b, i) for i in range(1, 5))), OFFLINE)  # ids 1-4 for B
            core.handle(a, _raw(*(_data(a, c, i) for i in range(5, 7))), OFFLINE)  # ids 5-6 for C
            assert core.claim_stored(b, 3)[1] == 3 and core.claim_stored(c, 10)[1] == 2
            if way == "disk":
                with core._tx():
                    core.write_held()
            assert core.held_count() == (5 if way == "memory" else 0)
            sql: list[str] = []
            core.conn.set_trace_callback(sql.append)
            t[0] += 200
            credit = [core.handle(c, _acks(c, [1, 5]), {b: ONLINE, c: ONLINE}).credit.get(c, 0),  # 1 is B's
                      core.handle(b, _acks(b, [1, 2, 2, 4]), {b: ONLINE, c: ONLINE}).credit.get(b, 0)]  # 4: not delivered (yet it has it)
            core.conn.set_trace_callback(None)
            reads = [s.split(" WHERE ")[1] for s in sql if s.startswith("SELECT id, state, origin_id")]
            if way == "memory":
                assert reads == ["id BETWEEN 4 AND 4 AND +kind=1 AND +target_type=1 AND +target_id='56001'"]
            else:
                assert len(reads) == 2
            with core._tx():
                core.write_held()
            events = [{k: v for k, v in e.items() if k != "ts"}
                      for f in sorted((tmp_path / way / "events").glob("*.jsonl"))
                      for e in map(json.loads, f.read_text().splitlines())]
            seen[way] = (credit, _stored(core), events)
        finally:
            core.close()
    assert seen["memory"] == seen["disk"]
    credit, rows, events = seen["memory"]
    assert credit == [1, 2] and [r[:2] for r in rows] == [(3, 1), (6, 1)]
    assert [e["lk0"] for e in events if e["event"] == "cleaned"] == [f"{A}/1/1/{i}" for i in (5, 1, 2, 4)]


@PROTOCOL_SETTINGS
@given(frame=frames_of(Kind.DATA), cut=st.integers(min_value=0, max_value=300))
def test_the_received_events_app_key_is_read_from_the_bytes_as_the_frame_has_it(frame: Frame, cut: int) -> None:
    """The platform logs a DATA's AppKey from its bytes without parsing the
    body (``RawFrame.app_key_parts``): the parsed frame's four parts; for a frame cut
    short inside them, nothing (never bytes from past the body's end)."""
    assert isinstance(frame.body, Data)
    [raw] = _raw(frame)
    ak = frame.body.app_key
    assert raw.app_key_parts() == (ak.domain, ak.data_type, ak.subtype, ak.key)
    parts = sum(1 + len(s.encode()) for s in (ak.domain, ak.data_type, ak.subtype, ak.key))
    short = RawFrame.__new__(RawFrame)
    short.raw, short._body_start = raw.raw[:raw._body_start + 40 + min(cut, parts - 1)], raw._body_start
    assert short.app_key_parts() is None
    # The `received` event carries the four parts, and none for the cut frame.
    from semq.platform.batch import received

    ev = received(raw, "x", "a", "b", 1, 2)
    if frame.body.key_sealed:  # the AppKey is inside the sealed document: the relay logs none
        assert not {"domain", "data_type", "subtype", "key"} & ev.keys()
        return
    assert [ev[k] for k in ("domain", "data_type", "subtype", "key")] == [ak.domain, ak.data_type, ak.subtype, ak.key]
    short.save_fwd, short.priority, short.flags = raw.save_fwd, raw.priority, raw.flags
    cut_ev = received(short, "x", "a", "b", 1, 2)
    assert not {"domain", "data_type", "subtype", "key"} & cut_ev.keys()
    assert {k: v for k, v in ev.items() if k not in ("domain", "data_type", "subtype", "key", "size")} == \
        {k: v for k, v in cut_ev.items() if k != "size"}


def test_a_commit_that_fails_after_the_platform_forwarded_loses_nothing(tmp_path: Path) -> None:
    """docs/design.md, "Batching and group commit": the platform hands
    documents for online targets to their queues just before its commit. If
    that commit fails, the origin hears no ACK_FWD; its inquiry finds
    nothing at the platform and it sends the document again, and the
    target's duplicate suppression keeps it to one delivery."""
    import sqlite3

    from semq.node.core import NewDocument, NodeCore

    a_ep, b_ep = Endpoint.org(A), Endpoint.org(B)
    a = NodeCore(tmp_path / "a.sqlite", A, create=True, synchronous="OFF")
    b = NodeCore(tmp_path / "b.sqlite", B, create=True, synchronous="OFF")
    p = PlatformCore(tmp_path / "p.sqlite", create=True, synchronous="OFF")
    try:
        p.register([A, B])
        a.accept([NewDocument(target=B, app_data=b"<order/>")])
        first = a.claim(10).data
        forwarded: list[bytes] = []

        class PortThenFail:
            def put(self, frames: Mapping[Endpoint, list[bytes]]) -> None:
                forwarded.extend(frames[b_ep])
                raise sqlite3.OperationalError("disk I/O error")  # as a failed COMMIT would

        with pytest.raises(sqlite3.OperationalError):
            p.handle(a_ep, _from_bytes(first), {b_ep: 1 << 20}, port=PortThenFail())
        assert len(forwarded) == 1 and p.conn.execute("SELECT count(*) FROM seen").fetchone() == (0,)
        assert b.handle(_from_bytes(forwarded)).delivered == 1  # the copy that left reached B

        # A heard nothing (the ACK_FWD waited for the commit): on its next
        # session it asks the platform, which has no record of the document.
        a.reconnected()
        asked = p.handle(a_ep, _from_bytes(a.inquiries().data), {a_ep: ONLINE, b_ep: ONLINE})
        a.handle(_from_bytes(asked.sends[a_ep]))
        assert a.conn.execute("SELECT state FROM outbox").fetchall() == [(0,)]  # SS_INIT: sent again
        again = p.handle(a_ep, _from_bytes(a.claim(10).data), {a_ep: ONLINE, b_ep: ONLINE})
        a.handle(_from_bytes(again.sends[a_ep]))  # ACK_FWD
        out_b = b.handle(_from_bytes(again.sends[b_ep]))
        assert out_b.delivered == 0  # a duplicate: acked again, not delivered twice
        relayed = p.handle(b_ep, _from_bytes(out_b.data), {a_ep: ONLINE, b_ep: ONLINE})
        a.handle(_from_bytes(relayed.sends[a_ep]))  # B's ACK2
        assert a.conn.execute("SELECT count(*) FROM outbox").fetchone() == (0,)  # confirmed, cleaned up
        assert b.conn.execute("SELECT app_data FROM inbox").fetchall() == [(b"<order/>",)]
    finally:
        for core in (a, b, p):
            core.close()


def _from_bytes(data: list[bytes]) -> list[RawFrame]:
    d = FrameDecoder()
    d.receive_data(b"".join(data))
    return list(d)


def test_a_best_effort_document_is_sent_once_and_never_stored_acked_or_retried(tmp_path: Path) -> None:
    """Reliable=0 (docs/reliability.md, "The guarantees"): the origin's row
    is gone once the document is sent, nobody asks about it; the platform
    discards it for an offline target (no copy, no answer) and forwards it
    to an online one; the receiver delivers it and acks nothing."""
    import time

    from semq.node.core import NewDocument, NodeCore
    from semq.umxt_protocol import SaveFwd

    a_ep, b_ep = Endpoint.org(A), Endpoint.org(B)
    a = NodeCore(tmp_path / "a.sqlite", A, create=True, synchronous="OFF", inquiry_interval=0.01)
    b = NodeCore(tmp_path / "b.sqlite", B, create=True, synchronous="OFF")
    p = PlatformCore(tmp_path / "p.sqlite", create=True, synchronous="OFF")
    try:
        p.register([A, B])

        def best_effort(body: bytes) -> list[RawFrame]:
            a.accept([NewDocument(target=B, app_data=body, reliable=False, save_fwd=SaveFwd.DISCARD, ack2=False)])
            frames = a.claim(10).data
            assert len(frames) == 1 and a.conn.execute("SELECT count(*) FROM outbox").fetchone() == (0,)
            return _from_bytes(frames)

        out = p.handle(a_ep, best_effort(b"while B is offline"), OFFLINE)
        assert not out.sends and p.conn.execute("SELECT count(*) FROM stored").fetchone() == (0,)
        out = p.handle(a_ep, best_effort(b"while B is online"), {b_ep: ONLINE})
        assert list(out.sends) == [b_ep]  # forwarded; nothing back to A
        got = b.handle(_from_bytes(out.sends[b_ep]))
        assert got.delivered == 1 and got.data == []  # no ACK, no ACK2
        assert b.conn.execute("SELECT app_data FROM inbox").fetchall() == [(b"while B is online",)]
        assert b.conn.execute("SELECT count(*) FROM inbound").fetchone() == (0,)
        time.sleep(0.05)  # many inquiry intervals
        assert a.claim(10).data == [] and a.inquiries().data == []  # never retried, never asked about
    finally:
        for core in (a, b, p):
            core.close()
