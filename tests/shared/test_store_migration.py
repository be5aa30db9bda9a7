"""Schema versions: a store created by the previous version is upgraded at
open, after an automatic backup, and keeps every message."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from semq.node.core import NewDocument, NodeCore
from semq.node.store import MIGRATIONS, open_node_store
from semq.store.db import PAGE_SIZE, StoreError, open_store


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
        # semq receive's tries (_v11_receive): there, empty.
        assert core.conn.execute("SELECT count(*) FROM receive_tries").fetchone()[0] == 0
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


def test_new_stores_take_the_page_size_and_old_ones_keep_theirs(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    new = tmp_path / "new.sqlite"
    open_node_store(new, create=True).close()
    core = NodeCore(new, "10008")
    try:
        assert core.conn.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE == 16384
        assert core.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        core.close()
    # A store made with SQLite's default pages (every store before the change)
    # opens, keeps them, and works: WAL mode cannot change the size.
    old = tmp_path / "old.sqlite"
    with monkeypatch.context() as m:
        m.setattr("semq.store.db.PAGE_SIZE", 4096)
        open_node_store(old, create=True).close()
    core = NodeCore(old, "10008")
    try:
        assert core.conn.execute("PRAGMA page_size").fetchone()[0] == 4096
        (lk0,) = core.accept([NewDocument(target="56001", app_data=b"x" * 1024)])
        row = core.conn.execute("SELECT app_data FROM outbox WHERE id=?", (lk0.record_id,)).fetchone()
        assert row == (b"x" * 1024,)
    finally:
        core.close()
