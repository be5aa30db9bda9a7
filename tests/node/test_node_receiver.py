"""The receiver's pending-ack rows (SPEC B.2): each confirmation is logged
when it arrives, and a row is deleted, not updated, once it has all it needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from semq.node.core import NodeCore
from tests.conftest import NodeClock


def test_reack_then_reack2_logs_both_and_cleans_once(tmp_path: Path) -> None:
    b = NodeCore(tmp_path / "node.sqlite", "56001", create=True, synchronous="OFF", events_dir=tmp_path / "events")
    try:
        cols = ("id, origin_type, origin_id, semq_id, semq_db_id, record_id, lk1_semq_id, lk1_semq_db_id,"
                " lk1_record_id, platform_type, platform_id, p_ack, s_ack, received_ms, last_inquiry_ms")
        with b.db.atomic():
            # 1: a stored copy awaiting REACK and REACK2; 2: forwarded, awaiting REACK2 only.
            b.conn.execute(f"INSERT INTO inbound ({cols}) VALUES (1, 1, '10008', 1, 1, 7, 1, 1, 70, 0, '', 0, 0, 1, 1)")
            b.conn.execute(f"INSERT INTO inbound ({cols}) VALUES (2, 1, '10008', 1, 1, 8, 0, 0, 0, 0, '', 1, 0, 1, 1)")
            b.pending_acks.confirm([1], (), 5, events := list[dict[str, Any]]())  # REACK for the stored copy
        assert [e["event"] for e in events] == ["reack"]
        assert b.conn.execute("SELECT id, p_ack, s_ack FROM inbound ORDER BY id").fetchall() == [(1, 1, 0), (2, 1, 0)]
        with b.db.atomic():
            b.pending_acks.confirm((), [(1, "10008"), (2, "10008")], 6, events := list[dict[str, Any]]())  # REACK2 for both
        assert [(e["event"], e["lk0"]) for e in events] == [
            ("reack2", "10008/1/1/7"), ("cleaned", "10008/1/1/7"), ("reack2", "10008/1/1/8"), ("cleaned", "10008/1/1/8")]
        assert b.conn.execute("SELECT count(*) FROM inbound").fetchone() == (0,)
        with b.db.atomic():
            b.pending_acks.confirm((), [(1, "10008")], 7, events := list[dict[str, Any]]())  # a repeated REACK2: nothing left to confirm
        assert events == []
    finally:
        b.close()


def test_reack_and_reack2_in_one_batch_clean_in_one_go(tmp_path: Path) -> None:
    """A drained copy's REACK (platform) and REACK2 (origin) often arrive in
    the same read: both are applied together, the row goes in one DELETE,
    each confirmation is still logged; one alone only marks the row."""
    import json

    from semq.umxt_protocol import (
        AckBatch,
        AckEntry,
        AckFlag,
        Endpoint,
        Frame,
        FrameDecoder,
        Kind,
        encode_frame,
    )

    b = NodeCore(tmp_path / "node.sqlite", "56001", create=True, synchronous="OFF", events_dir=tmp_path / "events")
    try:
        cols = ("id, origin_type, origin_id, semq_id, semq_db_id, record_id, lk1_semq_id, lk1_semq_db_id,"
                " lk1_record_id, platform_type, platform_id, p_ack, s_ack, received_ms, last_inquiry_ms")
        with b.db.atomic():
            for rid in (1, 2):  # two stored copies awaiting REACK and REACK2
                b.conn.execute(f"INSERT INTO inbound ({cols}) VALUES ({rid}, 1, '10008', 1, 1, {rid + 6}, 1, 1,"
                               f" {rid + 69}, 2, 'platform', 0, 0, 1, 1)")
        statements: list[str] = []
        b.conn.set_trace_callback(statements.append)

        def batch(kind: Kind, source: Endpoint, ids: list[int]) -> Any:
            entries = tuple(AckEntry(1, 1, 0, 1, 1, i, int(AckFlag.PLATFORM if kind is Kind.REACK
                                                          else AckFlag.DELIVERY), 0) for i in ids)
            dec = FrameDecoder()
            dec.receive_data(encode_frame(Frame(kind=Kind.ACK_BATCH, source=Endpoint.platform(), origin=source,
                                                target=Endpoint.org("56001"),
                                                body=AckBatch(ack_kind=kind, entries=entries))))
            return dec.next_frame()

        out = b.handle([batch(Kind.REACK, Endpoint.platform(), [1, 2]), batch(Kind.REACK2, Endpoint.org("10008"), [1])])
        assert out.errors == []
        # Row 1 had both: deleted, never updated; row 2 only its REACK: marked.
        assert b.conn.execute("SELECT id, p_ack, s_ack FROM inbound").fetchall() == [(2, 1, 0)]
        writes = [s for s in statements if s.startswith(("UPDATE inbound", "DELETE FROM inbound"))]
        assert writes == ["UPDATE inbound SET p_ack=1, s_ack=0 WHERE id=2", "DELETE FROM inbound WHERE id=1"]
        b.handle([batch(Kind.REACK2, Endpoint.org("10008"), [2])])
        assert b.conn.execute("SELECT count(*) FROM inbound").fetchone() == (0,)
        logged = [json.loads(line) for f in sorted((tmp_path / "events").glob("*.jsonl")) for line in f.open()]
        assert [(e["event"], e["lk0"]) for e in logged] == [
            ("reack", "10008/1/1/7"), ("reack2", "10008/1/1/7"), ("cleaned", "10008/1/1/7"),
            ("reack", "10008/1/1/8"), ("reack2", "10008/1/1/8"), ("cleaned", "10008/1/1/8")]
    finally:
        b.close()


def test_inquiry_rounds_read_the_pending_ack_table_in_bounded_windows(
        tmp_path: Path, monkeypatch: Any) -> None:
    """The inquiry round (every second, in a write transaction) read the whole
    pending-ack table: 270 ms per round at 1,000,000 rows. It now reads at
    most INBOUND_SWEEP rows by id, resuming where the last round stopped, and
    still asks about every due row, each once per sweep; fewer due rows than
    the window are asked about in one round as before."""
    from semq.node import inquiries as node_core
    from semq.umxt_protocol import FrameDecoder, Inquiry, InquiryTopic

    monkeypatch.setattr(node_core, "INBOUND_SWEEP", 3)
    b = NodeCore(tmp_path / "node.sqlite", "56001", create=True, synchronous="OFF")
    try:
        cols = ("id, origin_type, origin_id, semq_id, semq_db_id, record_id, lk1_semq_id, lk1_semq_db_id,"
                " lk1_record_id, platform_type, platform_id, p_ack, s_ack, received_ms, last_inquiry_ms")
        with b.db.atomic():
            for rid in range(1, 9):  # forwarded copies awaiting REACK2 from their origin; 5 not due yet
                last = 10**15 if rid == 5 else 1
                b.conn.execute(f"INSERT INTO inbound ({cols}) VALUES ({rid}, 1, '10008', 1, 1, {rid + 100},"
                               f" 0, 0, 0, 0, '', 1, 0, 1, {last})")

        def asked() -> list[int]:
            sql: list[str] = []
            b.conn.set_trace_callback(sql.append)
            out = b.inquiries()
            b.conn.set_trace_callback(None)
            for s in sql:  # every statement on the table reads by its primary key
                if " FROM inbound" in s:
                    plan = b.conn.execute("EXPLAIN QUERY PLAN " + s).fetchall()
                    assert all("SCAN inbound" not in str(row[3]) for row in plan), (s, plan)
            records = []
            dec = FrameDecoder()
            dec.receive_data(b"".join(out.data))
            while (raw := dec.next_frame()) is not None:
                body = raw.frame().body
                if isinstance(body, Inquiry) and body.topic is InquiryTopic.STATE:
                    records += [lk.record_id for lk in body.items]
            return records

        assert asked() == [101, 102, 103]
        assert asked() == [104, 106]  # 5 is not due
        assert asked() == [107, 108]  # the end of the table: the next round starts over
        with b.db.atomic():
            b.conn.execute("UPDATE inbound SET last_inquiry_ms=1, inquiries=0")
        assert asked() == [101, 102, 103]
        monkeypatch.setattr(node_core, "INBOUND_SWEEP", 100)
        with b.db.atomic():
            b.conn.execute("UPDATE inbound SET last_inquiry_ms=1, inquiries=0")
        assert asked() == [104, 105, 106, 107, 108]  # resumes after 3, to the end
        with b.db.atomic():
            b.conn.execute("UPDATE inbound SET last_inquiry_ms=1, inquiries=0")
        assert asked() == [101, 102, 103, 104, 105, 106, 107, 108]
    finally:
        b.close()


# ------------------------------------------- pending-ack rows held in memory

B_ORG = "56001"


def _frames(*frames: Any) -> list[Any]:
    """The frames as a receiver decodes them from the wire."""
    from semq.umxt_protocol import encode_frame

    return _frames_from_bytes(b"".join(encode_frame(f) for f in frames))


def _doc(record_id: int, lk1: int | None = None) -> Any:
    """A DATA from 10008 through the platform: with an LK1 it is a stored copy (ACK to P too)."""
    from semq.umxt_protocol import LK0, LK1, Data, Endpoint, Frame, Kind

    a = Endpoint.org("10008")
    return Frame(kind=Kind.DATA, source=Endpoint.platform(), origin=a, target=Endpoint.org(B_ORG), ack2=True,
                 body=Data(lk0=LK0(endpoint=a, record_id=record_id), lk1=LK1(record_id=lk1) if lk1 else None,
                           app_data=b"doc %d" % record_id))


def _confirm(kind: Any, ids: list[int]) -> Any:
    from semq.umxt_protocol import AckBatch, AckEntry, AckFlag, Endpoint, Frame, Kind

    source = Endpoint.platform() if kind is Kind.REACK else Endpoint.org("10008")
    flag = AckFlag.PLATFORM if kind is Kind.REACK else AckFlag.DELIVERY
    return Frame(kind=Kind.ACK_BATCH, source=Endpoint.platform(), origin=source, target=Endpoint.org(B_ORG),
                 body=AckBatch(ack_kind=kind, entries=tuple(AckEntry(1, 1, i, 1, 1, i, int(flag), 0) for i in ids)))


def _sent_ids(out: Any) -> dict[str, list[int]]:
    """Our ack entries' own ids (the pending-ack row each names), by ack kind."""
    from semq.umxt_protocol import AckBatch

    got: dict[str, list[int]] = {}
    for raw in _frames_from_bytes(b"".join(out.data)):
        body = raw.frame().body
        if isinstance(body, AckBatch):
            got.setdefault(body.ack_kind.name, []).extend(e.src_ref_id for e in body.entries)
    return got


def _frames_from_bytes(data: bytes) -> list[Any]:
    from semq.umxt_protocol import FrameDecoder

    dec = FrameDecoder()
    dec.receive_data(data)
    return list(dec)



def _rows(b: NodeCore) -> list[tuple[int, int, int]]:
    return b.conn.execute("SELECT id, p_ack, s_ack FROM inbound ORDER BY id").fetchall()


def test_confirmations_soon_after_end_a_pending_ack_row_never_written(tmp_path: Path, node_clock: NodeClock) -> None:
    import json

    from semq.umxt_protocol import Kind

    b = NodeCore(tmp_path / "node.sqlite", B_ORG, create=True, synchronous="OFF", events_dir=tmp_path / "events")
    try:
        statements: list[str] = []
        b.conn.set_trace_callback(statements.append)
        out = b.handle(_frames(_doc(7, lk1=70), _doc(8)))
        assert out.delivered == 2 and _rows(b) == []  # in the inbox; the pending-ack rows are held
        assert b.counts()["pending_ack"] == 2
        from semq.ops.metrics import node_snapshot

        assert node_snapshot(b, 3600)["messages"][("inbound", "pending_ack")] == 2
        ids = sorted(b.pending_acks.deferred)
        node_clock.t += 100
        b.handle(_frames(_confirm(Kind.REACK, ids[:1]), _confirm(Kind.REACK2, ids)))
        assert b.pending_acks.deferred == {} and b.pending_acks.deferred_keys == {} and _rows(b) == []
        assert not [s for s in statements if s.startswith(("INSERT OR IGNORE INTO inbound", "UPDATE inbound",
                                                            "DELETE FROM inbound"))]
        assert any(s.startswith("DELETE FROM outbox") or "INTO inbox" in s for s in statements)  # the trace works
        events = [json.loads(line)["event"] for f in sorted((tmp_path / "events").rglob("*.jsonl"))
                  for line in f.read_text().splitlines()]
        assert events.count("reack") == 1 and events.count("reack2") == 2 and events.count("cleaned") == 2
        # The ids stay reserved: the next row gets a new one.
        b.handle(_frames(_doc(9)))
        assert min(b.pending_acks.deferred) > max(ids)
        assert b.conn.execute("SELECT seq FROM sqlite_sequence WHERE name='inbound'").fetchone()[0] >= max(ids)
    finally:
        b.close()


def test_a_held_row_is_written_after_the_hold_with_what_it_got(tmp_path: Path, node_clock: NodeClock) -> None:
    from semq.node.core import DEFER_MS as HOLD_MS
    from semq.umxt_protocol import Kind

    b = NodeCore(tmp_path / "node.sqlite", B_ORG, create=True, synchronous="OFF")
    try:
        b.handle(_frames(_doc(7, lk1=70)))
        (rid,) = b.pending_acks.deferred
        b.handle(_frames(_confirm(Kind.REACK, [rid])))  # the platform's confirmation only
        # A repeated copy (its ack was lost) is acked again naming the same row.
        out = b.handle(_frames(_doc(7, lk1=70)))
        assert out.delivered == 0 and set(b.pending_acks.deferred) == {rid}
        assert _sent_ids(out) == {"ACK2": [rid], "ACK": [rid]}
        node_clock.t += HOLD_MS
        b.handle([])
        assert _rows(b) == [(rid, 1, 0)] and b.pending_acks.deferred == {}
        b.handle(_frames(_confirm(Kind.REACK2, [rid])))
        assert _rows(b) == []
    finally:
        b.close()


def test_held_rows_are_written_for_inquiries_answers_and_close(tmp_path: Path, node_clock: NodeClock) -> None:
    b = NodeCore(tmp_path / "node.sqlite", B_ORG, create=True, synchronous="OFF", inquiry_interval=0.2)
    try:
        b.handle(_frames(_doc(1)))
        node_clock.t += 150
        b.handle(_frames(_doc(2)))
        # An inquiry round writes what is older than half the interval, so
        # its sweep of the pending-ack table can ask about it.
        b.inquiries()
        assert [r[0] for r in _rows(b)] == [1] and set(b.pending_acks.deferred) == {2}
        node_clock.t += 300
        out = b.inquiries()
        assert [r[0] for r in _rows(b)] == [1, 2]
        asked = [raw.frame().body for raw in _frames_from_bytes(b"".join(out.data))]
        assert sorted(lk.record_id for q in asked for lk in q.items) == [1, 2]
        b.handle(_frames(_doc(3)))
    finally:
        b.close()  # writes the last one
    c = NodeCore(tmp_path / "node.sqlite", B_ORG)
    try:
        assert [r[0] for r in _rows(c)] == [1, 2, 3]
    finally:
        c.close()


def test_held_rows_lost_in_a_crash_leave_the_documents_and_their_ids_reserved(
        tmp_path: Path, node_clock: NodeClock) -> None:
    """Nothing we sent depended on them: the documents are in the inbox and
    the dedup table (which answers "did you receive"); a late confirmation
    naming a lost row's id finds no other row under it."""
    from semq.umxt_protocol import LK0, Endpoint, Frame, Inquiry, InquiryTopic, Kind

    b = NodeCore(tmp_path / "node.sqlite", B_ORG, create=True, synchronous="OFF")
    b.handle(_frames(_doc(1), _doc(2)))
    lost = sorted(b.pending_acks.deferred)
    b.pending_acks.deferred.clear()  # as a kill -9 would
    b.pending_acks.deferred_keys.clear()
    b.close()
    b = NodeCore(tmp_path / "node.sqlite", B_ORG, synchronous="OFF")
    try:
        assert b.conn.execute("SELECT count(*) FROM inbox").fetchone() == (2,)
        b.handle(_frames(_doc(3)))
        assert min(b.pending_acks.deferred) > max(lost)
        b.handle(_frames(_confirm(Kind.REACK2, lost)))  # late: confirms nothing else
        assert len(b.pending_acks.deferred) == 1
        a = Endpoint.org("10008")
        q = Frame(kind=Kind.INQUIRY, source=Endpoint.platform(), origin=a, target=Endpoint.org(B_ORG),
                  body=Inquiry(topic=InquiryTopic.RECEIVED, items=tuple(LK0(endpoint=a, record_id=i) for i in (1, 2))))
        out = b.handle(_frames(q))
        (resp,) = [raw.frame().body for raw in _frames_from_bytes(b"".join(out.data))
                   if raw.kind is Kind.INQUIRY_RESP]
        assert [res.name for _lk, res in resp.answers] == ["RECEIVED", "RECEIVED"]
    finally:
        b.close()


def test_a_transaction_that_does_not_commit_drops_the_held_writes(tmp_path: Path, node_clock: NodeClock) -> None:
    """Rows received in a rolled-back batch were never received: their held
    pending-ack rows go too (with every other held write, as in a crash),
    and the document is received again when it comes again."""
    import sqlite3

    import pytest

    b = NodeCore(tmp_path / "node.sqlite", B_ORG, create=True, synchronous="OFF")
    try:
        b.handle(_frames(_doc(1)))
        assert len(b.pending_acks.deferred) == 1

        def fail(*_a: Any) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        b.receiver.flush_confirmations = fail  # type: ignore[method-assign]
        with pytest.raises(sqlite3.OperationalError):
            b.handle(_frames(_doc(2)))
        del b.receiver.flush_confirmations
        assert b.pending_acks.deferred == {} and b.pending_acks.deferred_keys == {}
        assert b.conn.execute("SELECT count(*) FROM inbox").fetchone() == (1,)  # document 2 rolled back
        out = b.handle(_frames(_doc(2)))
        assert out.delivered == 1 and len(b.pending_acks.deferred) == 1
    finally:
        b.close()
