"""BEGIN IMMEDIATE waits for another process's writer by polling, not through
SQLite's busy handler (whose sleeps grow 1, 2, 5, 10 ms ...)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from semq.node.store import open_node_store
from semq.store.db import StoreError, translate


def _hold_write_lock(path: Path, seconds: float, locked: threading.Event) -> None:
    c = sqlite3.connect(path, isolation_level=None)
    try:
        c.execute("BEGIN IMMEDIATE")
        locked.set()
        time.sleep(seconds)
        c.execute("COMMIT")
    finally:
        c.close()


def test_begin_immediate_gets_the_lock_soon_after_it_is_freed(tmp_path: Path) -> None:
    path = tmp_path / "node.sqlite"
    db = open_node_store(path, create=True)
    try:
        waits = []
        for _ in range(5):
            locked = threading.Event()
            t = threading.Thread(target=_hold_write_lock, args=(path, 0.004, locked))
            t.start()
            assert locked.wait(5)
            t0 = time.perf_counter()
            with db.atomic("IMMEDIATE"):
                waits.append(time.perf_counter() - t0)
                db.execute_sql("SELECT 1")
            t.join(5)
        # The holder frees the lock after 4 ms; SQLite's busy handler would
        # look again only at 8 ms (1 + 2 + 5). Generous bound for a loaded
        # machine: the median wait is under the busy handler's 8 ms.
        assert sorted(waits)[2] < 0.008, waits
        # The connection keeps its busy timeout for every other statement.
        assert db.execute_sql("PRAGMA busy_timeout").fetchone()[0] == 5000
    finally:
        db.close()


def test_begin_immediate_still_gives_up_after_the_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import semq.store.db as _db

    monkeypatch.setattr(_db, "BUSY_TIMEOUT_S", 0.2)
    path = tmp_path / "node.sqlite"
    db = open_node_store(path, create=True)
    try:
        locked = threading.Event()
        t = threading.Thread(target=_hold_write_lock, args=(path, 1.0, locked))
        t.start()
        assert locked.wait(5)
        t0 = time.perf_counter()
        with pytest.raises(_db.OperationalError) as e:
            with db.atomic("IMMEDIATE"):
                pass
        assert 0.2 <= time.perf_counter() - t0 < 0.9
        err = translate(e.value, path, "node store")
        assert isinstance(err, StoreError) and "is locked by another process" in str(err)
        assert "for more than 0.2 s" in str(err)  # the limit it waited
        t.join(5)
        with db.atomic("IMMEDIATE"):  # and works again once the lock is free
            pass
    finally:
        db.close()
