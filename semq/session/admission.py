"""Who may hold a connection on a listener (semq.settings.bounds).

A listener admits a connection in two steps. ``enter`` when it is accepted:
it counts as *handshaking* (TLS, then HELLO) until it has proved who it is,
and is refused at once when the listener already holds its total, or its
budget of handshaking connections, or when the process's descriptors come
within the reserve of their limit (the node's own platform session, its
store and its logs must never starve for a partner's idle links).
``admit(identity)`` once the peer is known: refused when that identity
already holds its allowance. ``leave`` when it closes, whatever happened.

Pure bookkeeping on the event loop (no awaits), shared by the platform's
listener and the direct-link listener; ``raise_descriptor_limit`` is what a
daemon calls once at start.
"""

from __future__ import annotations

import logging
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["Admission", "open_descriptors", "raise_descriptor_limit"]

log = logging.getLogger("semq.session.admission")

_FD_DIR: Final = "/proc/self/fd"
_LOG_EVERY: Final = 100  # refusals of one kind logged once per this many (a flood must not flood the log)


def raise_descriptor_limit(want: int = 65536) -> int:
    """Raise this process's soft limit of open descriptors towards its hard
    limit (at most ``want``), as servers do at start; returns the soft
    limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(hard, want)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("cannot raise the descriptor limit from %d to %d: %s", soft, target, e)
    return int(soft)


def open_descriptors() -> int | None:
    """Descriptors this process has open (None where the system does not say)."""
    try:
        return len(os.listdir(_FD_DIR))
    except OSError:
        return None


@dataclass
class Admission:
    """The connections of one listener: ``total`` at most, ``handshakes`` of
    them not yet authenticated, ``per_identity(identity)`` of one identity,
    and none while fewer than ``reserve`` descriptors are left."""

    what: str  # "platform", "direct-link listener": how the log names it
    total: int
    handshakes: int
    per_identity: Callable[[str], int]
    reserve: int
    descriptors: Callable[[], int | None] = open_descriptors
    # The process's descriptor limit: read when a connection comes (an
    # operator may lower it on the running process: prlimit), None to read.
    limit: int | None = None
    handshaking: int = 0
    admitted: int = 0
    by_identity: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)

    @property
    def open(self) -> int:
        """Connections held: handshaking and admitted."""
        return self.handshaking + self.admitted

    def enter(self) -> str | None:
        """A connection just accepted: None when it may go on to its
        handshake (it then counts as handshaking; call ``leave(None)`` or
        ``admit``), else why not (one line; it is closed unanswered)."""
        why = None
        if self.open >= self.total:
            why = f"{self.open} connections held, the most this {self.what} takes ({self.total})"
            kind = "total"
        elif self.handshaking >= self.handshakes:
            why = (f"{self.handshaking} connections still in their handshake, the most this {self.what}"
                   f" takes at once ({self.handshakes})")
            kind = "handshakes"
        else:
            n = self.descriptors()
            limit = self.descriptor_limit()
            if n is not None and n + self.reserve >= limit:
                why = (f"{n} descriptors open of this process's {limit}: the last {self.reserve} are kept"
                       " for its own use")
                kind = "descriptors"
        if why is not None:
            self._refused(kind, why)
            return why
        self.handshaking += 1
        return None

    def admit(self, identity: str) -> str | None:
        """The handshaking connection proved it is ``identity``: None when
        admitted (it now counts for the identity: ``leave(identity)``), else
        why not (it still counts as handshaking: ``leave(None)``)."""
        have = self.by_identity.get(identity, 0)
        allowed = self.per_identity(identity)
        if have >= allowed:
            why = f"{identity} already holds {have} connections, the most it may ({allowed})"
            self._refused("per identity", why)
            return why
        self.handshaking -= 1
        self.admitted += 1
        self.by_identity[identity] = have + 1
        return None

    def leave(self, identity: str | None) -> None:
        """A connection closed: admitted as ``identity``, or (None) not."""
        if identity is None:
            self.handshaking -= 1
            return
        self.admitted -= 1
        n = self.by_identity.get(identity, 0) - 1
        if n > 0:
            self.by_identity[identity] = n
        else:
            self.by_identity.pop(identity, None)

    def descriptor_limit(self) -> int:
        if self.limit is not None:
            return self.limit
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return 1 << 30 if soft == resource.RLIM_INFINITY else int(soft)

    def _refused(self, kind: str, why: str) -> None:
        n = self.refused.get(kind, 0) + 1
        self.refused[kind] = n
        if n % _LOG_EVERY == 1:
            log.warning("%s: connection refused: %s (%d refused so far for this reason)", self.what, why, n)

    def snapshot(self) -> dict[str, Any]:
        """For status: what is held against what is allowed."""
        return {"open": self.open, "total": self.total, "handshaking": self.handshaking,
                "handshakes": self.handshakes, "identities": len(self.by_identity),
                "descriptor_limit": self.descriptor_limit(), "descriptor_reserve": self.reserve,
                "refused": dict(self.refused)}
