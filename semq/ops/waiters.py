"""Clients waiting for documents: the daemon's side of ``wait_inbox``
(the client's side, and the request, are in semq.session.inbox_wait).

A node daemon tells ``InboxWaiters.arrived()`` (through the port
semq.session.ports.InboxSignal) each time a commit put documents into its inbox —
after the commit, so a client woken then finds them in the store. A wait
checks the store once when it starts and once after each arrival (one
indexed look-up: the highest unacknowledged row), never on a timer; it is
answered as soon as the check says ready, or at its timeout (at most
``MAX_WAIT``), or ends when its client closes the connection.

Waits are bounded: each socket has a pool, half its connections, so
commands still get in (``ADMIN_WAITS`` on the admin socket; ``USER_WAITS``
on the user socket — half of ``user_socket_max_connections`` when that is
set — and ``USER_WAITS_EACH``, half a user's connections, per user). One
more is refused at once with an error naming the limit; nothing else is
held for it."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import trio

from semq.session.inbox_wait import MAX_WAIT
from semq.settings.bounds import (
    ADMIN_MAX_CLIENTS,
    USER_MAX_CONNECTIONS,
    USER_MAX_CONNECTIONS_PER_USER,
)

from .admin import AdminCommandError

__all__ = ["ADMIN_WAITS", "MAX_WAIT", "USER_WAITS", "USER_WAITS_EACH", "InboxWaiters", "WaitLimitReached",
           "WaitStatistics", "wait_timeout"]

log = logging.getLogger("semq.ops.waiters")

ADMIN_WAITS: Final = ADMIN_MAX_CLIENTS // 2  # waits open at once on one admin socket (the rest: commands)
# A wait holds a connection: at most half the user socket's, and half of
# one user's, so that user's commands (and the others') still get in.
USER_WAITS: Final = USER_MAX_CONNECTIONS // 2  # waits open at once on the user socket
USER_WAITS_EACH: Final = USER_MAX_CONNECTIONS_PER_USER // 2  # ... of one user

#: A wait's check: (ready, what to answer as ``top``), read from the store.
Check = Callable[[], Awaitable[tuple[bool, Any]]]


class WaitLimitReached(AdminCommandError):
    """Too many waits are open: refused at once (one line naming the limit)."""


@dataclass(frozen=True, kw_only=True)
class WaitStatistics:
    waiting: int  # waits open now
    arrivals: int  # commits that put documents into the inbox, since start
    answered: int  # waits answered ready
    timed_out: int  # waits answered not ready at their timeout
    refused: int  # waits refused over a limit


def wait_timeout(value: Any) -> float:
    """A request's ``timeout``: seconds, 0..MAX_WAIT (longer is capped)."""
    if value is None:
        return MAX_WAIT
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AdminCommandError(f"timeout {value!r} is not a number of seconds")
    if value != value or value < 0:
        raise AdminCommandError(f"timeout {value!r} is outside 0..{MAX_WAIT:g} s")
    return min(float(value), MAX_WAIT)


class InboxWaiters:
    """The waits of one daemon, woken by ``arrived()`` (semq.session.ports.InboxSignal)."""

    def __init__(self, limits: dict[str, int] | None = None, *, each: int = USER_WAITS_EACH) -> None:
        self.limits = dict(limits or {"admin": ADMIN_WAITS, "user": USER_WAITS})
        self.each = each
        self._changed = trio.Event()
        self._open: dict[str, int] = {}
        self._open_by: dict[tuple[str, str], int] = {}
        self.arrivals = self.answered = self.timed_out = self.refused = 0

    def arrived(self) -> None:
        """A commit put documents into the inbox: every wait checks again.
        Called on the trio thread; never blocks."""
        self.arrivals += 1
        self._changed.set()
        self._changed = trio.Event()

    def statistics(self) -> WaitStatistics:
        return WaitStatistics(waiting=sum(self._open.values()), arrivals=self.arrivals, answered=self.answered,
                              timed_out=self.timed_out, refused=self.refused)

    def _take(self, pool: str, who: str) -> None:
        limit = self.limits.get(pool, 0)
        held = self._open.get(pool, 0)
        if held >= limit:
            self.refused += 1
            raise WaitLimitReached(f"{held} waits are open on this {pool} socket, its limit of {limit};"
                                   " close one (or wait with one connection per follower)")
        if who:
            mine = self._open_by.get((pool, who), 0)
            if mine >= self.each:
                self.refused += 1
                raise WaitLimitReached(f"{mine} waits of user {who} are open, the limit of {self.each} per user")
            self._open_by[(pool, who)] = mine + 1
        self._open[pool] = held + 1

    def _give(self, pool: str, who: str) -> None:
        self._open[pool] -= 1
        if who:
            self._open_by[(pool, who)] -= 1
            if not self._open_by[(pool, who)]:
                del self._open_by[(pool, who)]

    async def wait(self, check: Check, *, timeout: float, pool: str = "admin", who: str = "") -> dict[str, Any]:
        """Until ``check()`` says ready (checked now and after each arrival)
        or ``timeout`` passes: ``{"ready": bool, "top": ...}``. Raises
        WaitLimitReached when the pool (or ``who``'s share) is full."""
        self._take(pool, who)
        top: Any = None
        try:
            with trio.move_on_after(min(timeout, MAX_WAIT)):
                while True:
                    changed = self._changed  # before the check: an arrival during it is not missed
                    ready, top = await check()
                    if ready:
                        self.answered += 1
                        return {"ready": True, "top": top}
                    await changed.wait()
            self.timed_out += 1
            return {"ready": False, "top": top}
        finally:
            self._give(pool, who)
