"""Schema versions: a store created by the previous version is upgraded at
open, after an automatic backup, and keeps every message."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from semq._db import StoreError, open_store
from semq.node.core import NewDocument, NodeCore
from semq.node.store import MIGRATIONS, open_node_store


def test_v1_node_store_upgrades_and_keeps_its_messages(tmp_path: Path) -> None:
    path = tmp_path / "node.sqlite"
    db = open_store(path, MIGRATIONS[:1], create=True)  # what version 1 of semq created
    db.execute_sql(
        "INSERT INTO outbox (target_type, target_id, save_fwd, ack2, created_ms, app_data, state_ms)"
        " VALUES (1, '56001', 3, 1, 1, x'6869', 1)")
    db.close()
    core = NodeCore(path, "10008")
    try:
        version = core.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
        assert version == str(len(MIGRATIONS))
        assert core.conn.execute("SELECT target_id, app_data, digest FROM outbox").fetchall() == [("56001", b"hi", None)]
        assert core.conn.execute("SELECT count(*) FROM receipts").fetchone()[0] == 0
        core.accept([NewDocument(target="56001", app_data=b"new")])
    finally:
        core.close()
    backup = tmp_path / "node.sqlite.bak-v1"
    assert backup.exists()
    with sqlite3.connect(backup) as c:
        assert c.execute("SELECT count(*) FROM outbox").fetchone()[0] == 1


def test_newer_schema_and_corrupt_files_are_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "node.sqlite"
    open_node_store(path, create=True).close()
    with sqlite3.connect(path) as c:
        c.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    with pytest.raises(StoreError, match=f"schema version 99, newer than this software's {len(MIGRATIONS)}"):
        open_node_store(path)
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database at all" * 100)
    before = bad.read_bytes()
    with pytest.raises(StoreError, match="not an SQLite database"):
        open_node_store(bad)
    assert bad.read_bytes() == before


def test_v1_platform_store_upgrades_to_the_delivery_index(tmp_path: Path) -> None:
    from semq.platform.core import PlatformCore
    from semq.platform.store import MIGRATIONS as P_MIGRATIONS

    path = tmp_path / "platform.sqlite"
    db = open_store(path, P_MIGRATIONS[:1], create=True)
    db.execute_sql(
        "INSERT INTO stored (target_type, target_id, kind, origin_type, origin_id, state, stored_ms, frame)"
        " VALUES (1, '56001', 1, 1, '10008', 0, 1, x'00')")
    db.close()
    core = PlatformCore(path)
    try:
        assert core.conn.execute("SELECT count(*) FROM stored").fetchone()[0] == 1
        plan = core.conn.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM stored WHERE target_type=1 AND target_id='56001' AND state=0"
            " ORDER BY priority DESC, id LIMIT 10").fetchall()
        assert "stored_delivery" in str(plan) and "TEMP B-TREE" not in str(plan)
    finally:
        core.close()
    assert (tmp_path / "platform.sqlite.bak-v1").exists()
