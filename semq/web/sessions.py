"""Console sessions and the login throttle, in memory (a restart logs
everyone out, which is what an operator expects of a restarted daemon).

A session is a random 256-bit token in a cookie (HttpOnly, Secure,
SameSite=Strict) that expires ``SESSION_IDLE`` after its last use and
``SESSION_MAX`` after the login at the latest. Each session has its own CSRF
token, put into every form and compared in constant time on every POST.

Failed logins: each one waits ``FAIL_DELAY`` before it is answered, and
after ``MAX_FAILURES`` failures within ``FAIL_WINDOW`` for one account name
(``MAX_FAILURES_ADDRESS`` from one client address: colleagues behind one
proxy share it), that name or address gets no login for ``LOCKOUT``
(answered 429 without checking the password).
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "FAIL_DELAY",
    "FAIL_WINDOW",
    "LOCKOUT",
    "MAX_FAILURES",
    "MAX_FAILURES_ADDRESS",
    "SESSION_IDLE",
    "SESSION_MAX",
    "LoginThrottle",
    "Session",
    "Sessions",
    "same",
]

SESSION_IDLE: Final = 30 * 60.0  # s without a request before a session ends
SESSION_MAX: Final = 12 * 3600.0  # s after the login a session ends whatever happens
MAX_SESSIONS: Final = 1000  # at once; the oldest goes first
FAIL_DELAY: Final = 1.0  # s a failed login waits before its answer
MAX_FAILURES: Final = 5  # failed logins of one account name within FAIL_WINDOW before a lockout
MAX_FAILURES_ADDRESS: Final = 20  # failed logins from one client address within FAIL_WINDOW
FAIL_WINDOW: Final = 300.0  # s
LOCKOUT: Final = 300.0  # s


def same(a: str, b: str) -> bool:
    """Constant-time string comparison."""
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


@dataclass(slots=True)
class Session:
    token: str
    user: str
    role: str
    csrf: str
    created: float
    last: float


@dataclass
class Sessions:
    clock: Callable[[], float] = time.monotonic
    idle: float = SESSION_IDLE
    max_age: float = SESSION_MAX
    _by_token: dict[str, Session] = field(default_factory=dict)

    def create(self, user: str, role: str) -> Session:
        now = self.clock()
        if len(self._by_token) >= MAX_SESSIONS:
            oldest = min(self._by_token.values(), key=lambda s: s.last)
            del self._by_token[oldest.token]
        s = Session(token=secrets.token_urlsafe(32), user=user, role=role, csrf=secrets.token_urlsafe(32),
                    created=now, last=now)
        self._by_token[s.token] = s
        return s

    def get(self, token: str | None) -> Session | None:
        """The live session of ``token`` (its idle time restarts), else None.
        The dict lookup hashes the token; only a token that is in the dict
        matches, and its compare is the dict's own."""
        if not token:
            return None
        s = self._by_token.get(token)
        if s is None:
            return None
        now = self.clock()
        if now - s.last > self.idle or now - s.created > self.max_age:
            del self._by_token[token]
            return None
        s.last = now
        return s

    def end(self, token: str | None) -> None:
        if token:
            self._by_token.pop(token, None)

    def end_user(self, user: str) -> None:
        for t in [t for t, s in self._by_token.items() if s.user == user]:
            del self._by_token[t]

    def __len__(self) -> int:
        return len(self._by_token)


@dataclass
class LoginThrottle:
    clock: Callable[[], float] = time.monotonic
    max_failures: int = MAX_FAILURES  # for keys "user:NAME"
    max_failures_address: int = MAX_FAILURES_ADDRESS  # for keys "ip:ADDRESS"
    window: float = FAIL_WINDOW
    lockout: float = LOCKOUT
    _fails: dict[str, deque[float]] = field(default_factory=dict)
    _locked: dict[str, float] = field(default_factory=dict)

    def locked(self, *keys: str) -> float:
        """Seconds until a login is allowed again for these keys (0 = now)."""
        now = self.clock()
        wait = 0.0
        for k in keys:
            until = self._locked.get(k)
            if until is not None:
                if until <= now:
                    del self._locked[k]
                else:
                    wait = max(wait, until - now)
        return wait

    def failed(self, *keys: str) -> None:
        now = self.clock()
        for k in keys:
            q = self._fails.setdefault(k, deque())
            q.append(now)
            while q and now - q[0] > self.window:
                q.popleft()
            if len(q) >= (self.max_failures_address if k.startswith("ip:") else self.max_failures):
                self._locked[k] = now + self.lockout
                q.clear()
        if len(self._fails) > 10_000:  # (bounded: forget the quiet ones)
            for k in [k for k, q in self._fails.items() if not q or now - q[-1] > self.window]:
                del self._fails[k]

    def succeeded(self, *keys: str) -> None:
        for k in keys:
            self._fails.pop(k, None)
