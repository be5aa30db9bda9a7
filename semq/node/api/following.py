"""Following the inbox: each unacknowledged document once, then each new
one as it arrives, woken by the running daemon when it commits documents
(docs/operations.md, "Live receive"): the part of ``NodeClient`` that waits.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semq.session.inbox_wait import ADMIN_SOCKET_NAME, MAX_WAIT, DaemonAway, await_any, wait_any
from semq.settings.config import Config

from .items import UNIT_IDS, Cursor, InboxItem, InboxRow

if TYPE_CHECKING:
    from ..core import NodeCore

__all__ = ["Following"]

log = logging.getLogger("semq.node.api")


class Following:
    """``NodeClient``'s following of its units' inboxes (a mixin: the
    client's stores and its items)."""

    config: Config
    cores: list[NodeCore]

    def _item(self, r: InboxRow, unit: int = 1) -> InboxItem:
        raise NotImplementedError

    def cursor(self, after_id: int = 0) -> Cursor:
        """A follower's position from an inbox id: per unit, the row its
        next document must be above (for one unit, ``(after_id,)``)."""
        if len(self.cores) == 1:
            return (max(0, after_id),)
        return tuple(max(0, (after_id - k) // UNIT_IDS) for k in range(1, len(self.cores) + 1))

    def inbox_after(self, cursor: Cursor, *, user: str | None = None, limit: int = 1000) -> list[InboxItem]:
        """Unacknowledged documents above ``cursor`` (every unit's, each
        unit's in id order, at most ``limit`` from each)."""
        per_unit = []
        for k, core in enumerate(self.cores, 1):
            per_unit.append([self._item(r, k) for r in core.inbox.rows(InboxRow, after_id=cursor[k - 1], user=user,
                                                                       limit=limit)])
        if len(per_unit) == 1:
            return per_unit[0]
        # The units' documents by arrival, each unit's in its own id order (an
        # ordered channel's documents keep theirs even when held ones came later).
        return list(heapq.merge(*per_unit, key=lambda it: it.received_ms))

    def advance(self, cursor: Cursor, item: InboxItem) -> Cursor:
        """``cursor`` moved past ``item``."""
        row = item.id if len(self.cores) == 1 else item.id // UNIT_IDS
        if row <= cursor[item.unit - 1]:
            return cursor
        return (*cursor[:item.unit - 1], row, *cursor[item.unit:])

    def inbox_tops(self, user: str | None = None) -> list[int]:
        """Per unit, the highest row of an unacknowledged document (``user``:
        of that user's), 0 when there is none: what a wait compares with."""
        return [core.inbox.top(user) for core in self.cores]

    def _wait_requests(self, cursor: Cursor, user: str | None) -> list[tuple[Path, dict[str, Any]]]:
        cfg = self.config
        return [(cfg.for_unit(k).unit_dir / ADMIN_SOCKET_NAME,
                 {"after_id": cursor[k - 1], **({"user": user} if user else {})})
                for k in range(1, len(self.cores) + 1)]

    def wait(self, cursor: Cursor, *, user: str | None = None, timeout: float = MAX_WAIT,
             also: Sequence[int] = ()) -> bool:
        """Block until the inbox holds an unacknowledged document above
        ``cursor`` (True) or ``timeout`` passes (False, at most MAX_WAIT s),
        woken by the running daemon (every unit's: its admin socket) when
        it commits one: no polling. ``also``: descriptors that end the wait
        too (False) when one is readable. Raises semq.session.inbox_wait.DaemonAway when
        a unit's daemon does not answer, WaitRefused with its error line."""
        got = wait_any(self._wait_requests(cursor, user), timeout, also=also)
        return any(r.get("ready") for r in got.values())

    async def await_(self, cursor: Cursor, *, user: str | None = None, timeout: float = MAX_WAIT) -> bool:
        """``wait`` for trio."""
        got = await await_any(self._wait_requests(cursor, user), timeout)
        return any(r.get("ready") for r in got.values())

    def follow(self, after_id: int = 0, user: str | None = None,
               timeout: float | None = None) -> Iterator[InboxItem]:
        """Yield each unacknowledged document with an id above ``after_id``,
        then each new one as it arrives, once, until ``timeout`` seconds
        pass without one (None: for ever); ``user``: only that user's.

        The running daemon wakes it when a commit puts documents into the
        inbox (``wait``): the store is read once per wake, never in a
        loop. While no daemon answers it tries again every second (said
        once in the log, at WARNING). Documents stay unacknowledged
        (``acknowledge``): a new follower from 0 is given them again."""
        cursor = self.cursor(after_id)
        away = False
        last = time.monotonic()
        while True:
            items = self.inbox_after(cursor, user=user)
            for item in items:
                cursor = self.advance(cursor, item)
                yield item
            now = time.monotonic()
            if items:
                last = now
            span = MAX_WAIT if timeout is None else min(MAX_WAIT, timeout - (now - last))
            if span <= 0:
                return
            try:
                self.wait(cursor, user=user, timeout=span)
            except DaemonAway as e:
                if not away:
                    log.warning("%s: waiting for the node daemon, trying again every second", e)
                    away = True
                time.sleep(min(1.0, span))
                continue
            if away:
                log.warning("the node daemon answers again")
                away = False

    async def afollow(self, after_id: int = 0, user: str | None = None,
                      timeout: float | None = None) -> AsyncIterator[InboxItem]:
        """``follow`` for trio: ``async for item in node.afollow(): ...``.
        The store is read on a worker thread (one at a time)."""
        import trio

        limiter = trio.CapacityLimiter(1)
        cursor = self.cursor(after_id)
        away = False
        last = trio.current_time()
        while True:
            items = await trio.to_thread.run_sync(partial(self.inbox_after, cursor, user=user), limiter=limiter)
            for item in items:
                cursor = self.advance(cursor, item)
                yield item
            now = trio.current_time()
            if items:
                last = now
            span = MAX_WAIT if timeout is None else min(MAX_WAIT, timeout - (now - last))
            if span <= 0:
                return
            try:
                await self.await_(cursor, user=user, timeout=span)
            except DaemonAway as e:
                if not away:
                    log.warning("%s: waiting for the node daemon, trying again every second", e)
                    away = True
                await trio.sleep(min(1.0, span))
                continue
            if away:
                log.warning("the node daemon answers again")
                away = False
