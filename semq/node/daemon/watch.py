"""Watching the store for other processes' commits: one read-only SQLite
connection of the daemon's own, whose ``PRAGMA data_version`` changes
whenever another connection commits (an application's ``semq send``, the
daemon's store thread). A few microseconds per look, on the event loop;
the claims stay on the store thread.

One per daemon, shared by every sender that waits for documents: the
platform session's, the claims for this node's own users while the
platform is away, and each direct link's.

Why they watch instead of polling: a document an application commits is
claimed within ``watch_interval`` (2 ms) of a burst of activity, not
within ``poll_interval`` (50 ms). Each sender used to be woken only by
pokes; a link whose documents all went direct waited for the 50 ms poll
(scripts/bench e2e --direct at half load, docs/benchmarks.md: queued ->
sent p90 48 ms direct, against 16 ms through the platform)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Protocol

import trio

__all__ = ["StoreWatch", "WatchSettings"]

log = logging.getLogger("semq.node")


class WatchSettings(Protocol):
    """The settings a watch reads (live: semq.node.daemon.settings.NodeSettings)."""

    watch_interval: float  # s between looks right after activity; 0 = not watching
    watch_max: float  # ... stretched by half at each look that finds nothing, up to this
    poll_interval: float  # what the senders fall back to (for the log)


class StoreWatch:
    """The daemon's read-only look at its store (module docstring)."""

    def __init__(self, path: str | Path, settings: WatchSettings) -> None:
        self._path = path
        self.s = settings
        self._conn: sqlite3.Connection | None = None
        self._off = False  # the store cannot be opened read-only: not watching
        # The platform path's pace (``wait(keep_pace=True)``): stretched while
        # nothing changes and kept from one wait to the next, so an idle node
        # looks watch_max apart (20 times a second), not every 2 ms again.
        self.every = settings.watch_interval

    def version(self) -> int | None:
        """The store's data_version now; None when not watching
        (``watch_interval`` 0, or the store cannot be opened read-only:
        said once in the log). A look that fails drops the connection: the
        next opens it again."""
        if self._off or self.s.watch_interval <= 0:
            return None
        conn = self._conn
        if conn is None:
            try:
                uri = Path(self._path).resolve().as_uri() + "?mode=ro"  # percent-encoded
                conn = self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=0)
            except sqlite3.Error as e:
                log.warning("cannot watch the store for new documents (%s): the senders look every %g s", e,
                            self.s.poll_interval)
                self._off = True
                return None
        try:
            return int(conn.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.Error:
            self.close()
            return None

    async def wait(self, wake: trio.Event, seen: int | None, *, keep_pace: bool = False) -> bool:
        """Until ``wake`` is set, or the store's data_version is no longer
        ``seen`` (then True). Looked at every ``watch_interval``, stretched
        by half at each look that finds nothing, up to ``watch_max``: a
        burst of sends is seen within milliseconds. The caller bounds the
        wait (``poll_interval``). ``seen`` None (not watching, or a look
        that failed): only ``wake`` ends it. ``keep_pace``: the stretch
        carries over to the next wait until something happens (``every``)."""
        if seen is None:
            await wake.wait()
            return False
        every = self.every if keep_pace else self.s.watch_interval
        changed = False
        while not wake.is_set():
            with trio.move_on_after(every):
                await wake.wait()
                break
            now = self.version()
            if now is None:
                await wake.wait()
                break
            if now != seen:
                changed = True
                break
            every = min(self.s.watch_max, every * 1.5)
            if keep_pace:
                self.every = every
        if keep_pace:
            self.every = self.s.watch_interval
        return changed

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
