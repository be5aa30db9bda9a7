"""What the platform last said of our partners: online or offline, since
when, last seen (PRESENCE_QUERY / PRESENCE, docs/protocol.md).

The node asks only when its operator does (``semq partners``, the
console's partners page, the "why" line of a waiting document): never on
the documents' path. It names the organizations it asks about, at most
MAX_PRESENCE_ITEMS in one query, and the platform answers one query per
session every 2 s; an answer asked for sooner is the one held."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final

import trio

from semq.tracking.events import now_ms
from semq.umxt_protocol import MAX_PRESENCE_ITEMS, Presence, PresenceState, RawFrame

__all__ = ["ASK_EVERY", "PartnerPresence", "Seen"]

ASK_EVERY: Final = 2.5  # s between two queries (the platform ignores more than one every 2 s: semq.platform.daemon.relay)
_KEEP: Final = 10_000  # organizations remembered (an answer names only what we asked)


@dataclass(frozen=True, slots=True)
class Seen:
    """What the platform said of one organization, and when it said it."""

    state: PresenceState
    since_ms: int | None
    last_seen_ms: int | None
    told_ms: int


class PartnerPresence:
    """The answers, by organization; ``ask`` sends a query and waits a
    little for its answer."""

    def __init__(self) -> None:
        self.seen: dict[str, Seen] = {}
        self._asked_at = -1e9  # trio time of the last query sent
        self._answered = trio.Event()
        self.stats = {"asked": 0, "answers": 0}

    async def answer(self, raw: RawFrame) -> None:
        """A PRESENCE frame from the platform (the session reader's handler)."""
        body = raw.frame().body
        assert isinstance(body, Presence)
        told = now_ms()
        if len(self.seen) > _KEEP:
            self.seen.clear()
        for e in body.entries:
            self.seen[e.org] = Seen(e.state, e.since_ms or None, e.last_seen_ms or None, told)
        self.stats["answers"] += 1
        self._answered.set()

    async def ask(self, orgs: Sequence[str], send: Callable[[Sequence[str]], Awaitable[bool]] | None,
                  timeout: float = 2.0) -> None:
        """Ask about ``orgs`` (the first MAX_PRESENCE_ITEMS, those never
        told first, then the longest ago) and wait up to ``timeout`` s for
        the answer. Nothing is sent without a platform session (``send``
        None, or it returns False) or within ASK_EVERY of the last query:
        what was told before stands."""
        if not orgs or send is None:
            return
        now = trio.current_time()
        if now - self._asked_at < ASK_EVERY:
            return
        order = sorted(orgs, key=lambda o: (self.seen[o].told_ms if o in self.seen else -1, o))
        self._answered = trio.Event()
        if not await send(order[:MAX_PRESENCE_ITEMS]):
            return
        self._asked_at = now
        self.stats["asked"] += 1
        with trio.move_on_after(timeout):
            await self._answered.wait()

    def of(self, org: str) -> Seen | None:
        return self.seen.get(org)
