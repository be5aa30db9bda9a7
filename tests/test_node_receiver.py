"""The receiver's pending-ack rows (SPEC B.2): each confirmation is logged
when it arrives, and a row is deleted, not updated, once it has all it needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from semq.node.core import NodeCore


def test_reack_then_reack2_logs_both_and_cleans_once(tmp_path: Path) -> None:
    b = NodeCore(tmp_path / "node.sqlite", "56001", create=True, synchronous="OFF", events_dir=tmp_path / "events")
    try:
        cols = ("id, origin_type, origin_id, semq_id, semq_db_id, record_id, lk1_semq_id, lk1_semq_db_id,"
                " lk1_record_id, platform_type, platform_id, p_ack, s_ack, received_ms, last_inquiry_ms")
        with b.db.atomic():
            # 1: a stored copy awaiting REACK and REACK2; 2: forwarded, awaiting REACK2 only.
            b.conn.execute(f"INSERT INTO inbound ({cols}) VALUES (1, 1, '10008', 1, 1, 7, 1, 1, 70, 0, '', 0, 0, 1, 1)")
            b.conn.execute(f"INSERT INTO inbound ({cols}) VALUES (2, 1, '10008', 1, 1, 8, 0, 0, 0, 0, '', 1, 0, 1, 1)")
            b._inbound_ack("p_ack", [1], 5, events := list[dict[str, Any]]())  # REACK for the stored copy
        assert [e["event"] for e in events] == ["reack"]
        assert b.conn.execute("SELECT id, p_ack, s_ack FROM inbound ORDER BY id").fetchall() == [(1, 1, 0), (2, 1, 0)]
        with b.db.atomic():
            b._inbound_ack("s_ack", [1, 2], 6, events := list[dict[str, Any]]())  # REACK2 for both
        assert [(e["event"], e["lk0"]) for e in events] == [
            ("reack2", "10008/1/1/7"), ("cleaned", "10008/1/1/7"), ("reack2", "10008/1/1/8"), ("cleaned", "10008/1/1/8")]
        assert b.conn.execute("SELECT count(*) FROM inbound").fetchone() == (0,)
        with b.db.atomic():
            b._inbound_ack("s_ack", [1], 7, events := list[dict[str, Any]]())  # a repeated REACK2: nothing left to confirm
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
    from semq.node import core as node_core
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
