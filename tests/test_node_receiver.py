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
