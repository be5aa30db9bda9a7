"""Console sessions and the login throttle, in memory (a restart logs
everyone out, which is what an operator expects of a restarted daemon).

A session is a random 256-bit token in a cookie (HttpOnly, Secure,
SameSite=Strict) that expires ``SESSION_IDLE`` after its last use and
``SESSION_MAX`` after the login at the latest. Each session has its own CSRF
token, put into every form and compared in constant time on every POST.

Failed logins (``LoginThrottle``): an attempt is counted *before* its
password is checked, and a success forgives it; each failure waits
``FAIL_DELAY`` before it is answered. Once ``CONSOLE_MAX_FAILURES``
attempts of one account name within ``FAIL_WINDOW`` have failed or are
being checked (``CONSOLE_MAX_FAILURES_ADDRESS`` from one client address:
colleagues behind one proxy share it), further ones are answered 429
unchecked, and the failures lock that name or address for ``LOCKOUT``.
Counting first is what makes parallel guesses count: were failures counted
after the check, forty guesses sent at once would all pass the check for a
lockout before the first was answered.

Logins in flight (``LoginSlots``): at most ``CONSOLE_LOGINS_IN_FLIGHT`` per
account name and per client address are checked at once; another waits
for its turn, at most ``CONSOLE_LOGIN_WAIT_S``, then is answered 429. We
wait rather than refuse at once because the second login of an address is
most often a colleague behind the same proxy, or a double click, and a
check takes a fraction of a second; a guesser gains nothing by waiting (its
guesses are checked one by one, each answered after ``FAIL_DELAY``, and the
lockout stops them), and the wait is bounded, so a queue of guesses cannot
hold requests open.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Final

import trio

from semq.settings.bounds import (
    CONSOLE_LOGIN_WAIT_S,
    CONSOLE_LOGINS_IN_FLIGHT,
    CONSOLE_MAX_FAILURES,
    CONSOLE_MAX_FAILURES_ADDRESS,
)

__all__ = [
    "FAIL_DELAY",
    "FAIL_WINDOW",
    "LOCKOUT",
    "SESSION_IDLE",
    "SESSION_MAX",
    "LoginAttempt",
    "LoginBusy",
    "LoginSlots",
    "LoginThrottle",
    "Session",
    "Sessions",
    "same",
]

SESSION_IDLE: Final = 30 * 60.0  # s without a request before a session ends
SESSION_MAX: Final = 12 * 3600.0  # s after the login a session ends whatever happens
MAX_SESSIONS: Final = 1000  # at once; the oldest goes first
FAIL_DELAY: Final = 1.0  # s a failed login waits before its answer
FAIL_WINDOW: Final = 300.0  # s in which CONSOLE_MAX_FAILURES(_ADDRESS) attempts lock (semq.settings.bounds says 5 minutes)
LOCKOUT: Final = 300.0  # s a locked name or address gets no login (semq.settings.bounds says 5 minutes)


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


@dataclass(frozen=True, slots=True)
class LoginAttempt:
    """One login counted by ``LoginThrottle.begin``: its keys and when."""

    keys: tuple[str, ...]
    at: float


@dataclass
class LoginThrottle:
    """Counts logins per key (``"user:NAME"``, ``"ip:ADDRESS"``) and locks
    a key that fails too often. Pure (the clock is given): the web handler
    calls ``locked``, then ``begin`` before it checks the password, then
    ``failed`` or ``succeeded``; with no await between ``locked`` and
    ``begin``, no two logins can both slip under a limit."""

    clock: Callable[[], float] = time.monotonic
    max_failures: int = CONSOLE_MAX_FAILURES  # for keys "user:NAME"
    max_failures_address: int = CONSOLE_MAX_FAILURES_ADDRESS  # for keys "ip:ADDRESS"
    window: float = FAIL_WINDOW
    lockout: float = LOCKOUT
    _fails: dict[str, deque[float]] = field(default_factory=dict)  # attempts counted (failed or being checked)
    _locked: dict[str, float] = field(default_factory=dict)  # key -> the time its lockout ends

    def _limit(self, key: str) -> int:
        return self.max_failures_address if key.startswith("ip:") else self.max_failures

    def _counted(self, key: str, now: float) -> deque[float] | None:
        q = self._fails.get(key)
        while q and now - q[0] > self.window:
            q.popleft()
        return q

    def locked(self, *keys: str) -> float:
        """Seconds until a login is allowed again for these keys (0 = now):
        a key is locked after its failures, and also while its attempts
        counted in the window (some still being checked) reach its limit."""
        now = self.clock()
        wait = 0.0
        for k in keys:
            until = self._locked.get(k)
            if until is not None:
                if until <= now:
                    del self._locked[k]
                else:
                    wait = max(wait, until - now)
            q = self._counted(k, now)
            if q and len(q) >= self._limit(k):
                wait = max(wait, q[0] + self.window - now)
        return wait

    def begin(self, *keys: str) -> LoginAttempt:
        """Count a login for ``keys`` before its password is checked (the
        caller asked ``locked`` first). It stays counted as a failure unless
        ``succeeded`` forgives it."""
        now = self.clock()
        for k in keys:
            self._fails.setdefault(k, deque()).append(now)
        if len(self._fails) > 10_000:  # (bounded: forget the quiet ones)
            for k in [k for k in self._fails if not self._counted(k, now)]:
                del self._fails[k]
        return LoginAttempt(keys=tuple(keys), at=now)

    def failed(self, attempt: LoginAttempt) -> None:
        """The password was wrong: a key whose counted attempts reach its
        limit is locked for ``lockout`` from now."""
        now = self.clock()
        for k in attempt.keys:
            q = self._counted(k, now)
            if q and len(q) >= self._limit(k):
                self._locked[k] = now + self.lockout
                q.clear()

    def succeeded(self, attempt: LoginAttempt) -> None:
        """The password was right: the attempt is forgiven, and the account
        name's earlier failures too (whoever knows the password has ended
        the guessing). An address keeps its other failures: an account of
        one's own must not wipe the count of guesses at others' names."""
        for k in attempt.keys:
            q = self._fails.get(k)
            if q is None:
                continue
            if k.startswith("user:"):
                q.clear()
            else:
                try:
                    q.remove(attempt.at)
                except ValueError:  # (cleared by a lockout meanwhile)
                    pass
            if not q:
                del self._fails[k]


class LoginBusy(Exception):
    """A login waited ``wait`` seconds for another of the same key to be
    checked, in vain (the handler answers 429 without checking it)."""

    def __init__(self, key: str, wait: float) -> None:
        super().__init__(f"another login of {key} was still being checked after {wait:g} s")
        self.key = key
        self.wait = wait


@dataclass
class _Slot:
    sem: trio.Semaphore
    users: int = 0  # tasks holding or waiting: the slot is dropped at 0


@dataclass
class LoginSlots:
    """At most ``per_key`` logins in flight per key; the others wait their
    turn (first come, first served) at most ``wait`` seconds in all.

    ``hold(*keys)`` takes a slot of every key, in sorted order so two
    logins never hold one each of the other's (every login takes one
    ``ip:`` and one ``user:`` key), and raises ``LoginBusy`` when they are
    not all free within ``wait``. Idle keys are forgotten, so the table
    holds only logins in flight or waiting."""

    per_key: int = CONSOLE_LOGINS_IN_FLIGHT
    wait: float = CONSOLE_LOGIN_WAIT_S
    _slots: dict[str, _Slot] = field(default_factory=dict)

    def in_flight(self, key: str) -> int:
        """Logins holding or waiting for ``key`` (0 for an idle key)."""
        s = self._slots.get(key)
        return s.users if s else 0

    @asynccontextmanager
    async def hold(self, *keys: str) -> AsyncIterator[None]:
        order = sorted(set(keys))
        for k in order:
            s = self._slots.get(k)
            if s is None:
                s = self._slots[k] = _Slot(trio.Semaphore(self.per_key))
            s.users += 1
        try:
            async with AsyncExitStack() as stack:
                got = 0
                with trio.move_on_after(self.wait):
                    for k in order:
                        await self._slots[k].sem.acquire()
                        stack.callback(self._slots[k].sem.release)
                        got += 1
                if got < len(order):
                    raise LoginBusy(order[got], self.wait)
                yield
        finally:
            for k in order:
                s = self._slots[k]
                s.users -= 1
                if s.users == 0:
                    del self._slots[k]
