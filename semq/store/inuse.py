"""Whether a data directory's SQLite store is in use by another process,
as far as the store itself tells: what backup, restore, compact and the
platform's migration to PostgreSQL check before they touch a store (the
running daemon's admin socket is the operations layer's to ask:
semq.ops.backup.store_in_use asks it first, then this).

The store's own lock tells: every connection to a WAL store holds a
shared lock on its WAL index while it is open, which the kernel drops when
the process dies, so a killed daemon never blocks and a hung one is still
seen. A daemon's fresh ``status.json`` tells too (written every second
while it runs)."""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Final

__all__ = ["STORE_NAMES", "store_in_use", "wal_index_lock"]

STORE_NAMES: Final = {"node": "node.sqlite", "platform": "platform.sqlite"}  # a data directory's store, by role
_WAL_INDEX_DMS: Final = 128  # SQLite unix VFS: the "dead man switch" lock byte of the -shm file
_STATUS_FRESH_MS: Final = 5000


@contextmanager
def wal_index_lock(store: Path) -> Iterator[bool]:
    """Try SQLite's own WAL-index lock: every connection to a WAL store
    holds a shared lock on the -shm file's DMS byte while it is open, and a
    connection cannot open while someone holds it exclusively. Yields False
    if another process has the store open; while it yields True, no process
    can open the store. (POSIX locks are per process: do not call this in
    a process that has the store open itself.)"""
    shm = Path(f"{store}-shm")
    try:
        fd = os.open(shm, os.O_RDWR)
    except FileNotFoundError:
        yield True  # nobody has it open in WAL mode
        return
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _WAL_INDEX_DMS, os.SEEK_SET)
        except OSError:
            yield False
            return
        try:
            yield True
        finally:
            with suppress(OSError):
                fcntl.lockf(fd, fcntl.LOCK_UN, 1, _WAL_INDEX_DMS, os.SEEK_SET)
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def store_in_use(directory: Path) -> str | None:
    """Why the store in ``directory`` must not be touched now, or None: a
    process holding it open (SQLite's WAL-index lock); a fresh status.json
    of a live process."""
    directory = Path(directory)
    for name in STORE_NAMES.values():
        store = directory / name
        if store.exists():
            with wal_index_lock(store) as free:
                if not free:
                    return f"{store} is open in another process (a running daemon or application)"
    try:
        st = json.loads((directory / "status.json").read_text("utf-8"))
        pid, t = int(st.get("pid", 0)), int(st.get("time_ms", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    if pid and pid != os.getpid() and time.time() * 1000 - t < _STATUS_FRESH_MS and _pid_alive(pid):
        return f"a daemon (pid {pid}) reported its status {(time.time() * 1000 - t) / 1000:.1f} s ago"
    return None
