"""Guessing a console password in parallel, against the console a daemon
serves (``serve_console``: Hypercorn over HTTPS, the Starlette app, scrypt
in a thread), run in-process so the throttle's clock can be moved past the
lockout: forty simultaneous wrong passwords for one account get at most
``CONSOLE_MAX_FAILURES`` password checks, the rest 429, and the right
password is refused until the lockout has passed."""

from __future__ import annotations

import re
import ssl
from pathlib import Path

import httpx
import trio

from semq.bounds import CONSOLE_MAX_FAILURES
from semq.web.app import COOKIE, Console
from semq.web.audit import AuditLog
from semq.web.backend import ConsoleBackend
from semq.web.certs import console_tls
from semq.web.server import serve_console
from semq.web.sessions import LOCKOUT, LoginThrottle
from semq.web.users import Account, UserStore

GUESSES = 40
PASSWORD = "carol-right-password"
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


class CountingUsers(UserStore):
    """The real account store, counting the passwords it checks."""

    checked = 0

    def verify(self, name: str, password: str) -> Account | None:
        type(self).checked += 1
        return super().verify(name, password)


async def _form(c: httpx.AsyncClient) -> str:
    page = await c.get("/login")
    assert page.status_code == 200
    m = _CSRF.search(page.text)
    assert m, "no CSRF token in the login page"
    return m.group(1)


async def test_parallel_guesses_are_checked_at_most_max_failures_times(tmp_path: Path) -> None:
    d = tmp_path / "10001"
    d.mkdir(mode=0o700)
    users = CountingUsers(d)
    users.add("carol", "operator", PASSWORD)
    CountingUsers.checked = 0
    now = [1000.0]
    tls = console_tls("node", d, "127.0.0.1")
    backend = ConsoleBackend(role="node", ident="10001", directory=d, handlers={}, unit_dirs=[d])
    console = Console(backend=backend, users=users, audit=AuditLog(d), fail_delay=0.2,
                      throttle=LoginThrottle(clock=lambda: now[0]))
    ctx = ssl.create_default_context(cafile=str(d / "console" / "console.pem"))

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_console, console, tls, "127.0.0.1", 0)
            url = f"https://127.0.0.1:{port}"
            clients = [httpx.AsyncClient(base_url=url, verify=ctx, timeout=60.0) for _ in range(GUESSES)]
            try:
                # Each guesser has its login form (and its connection) first,
                # then all of them post at the same moment.
                tokens = [await _form(c) for c in clients]
                go = trio.Event()
                statuses: list[int] = []

                async def guess(c: httpx.AsyncClient, token: str, i: int) -> None:
                    await go.wait()
                    r = await c.post("/login", data={"csrf": token, "user": "carol",
                                                     "password": f"wrong-guess-{i:04d}", "next": "/"})
                    statuses.append(r.status_code)

                async with trio.open_nursery() as guessers:
                    for i, (c, token) in enumerate(zip(clients, tokens, strict=True)):
                        guessers.start_soon(guess, c, token, i)
                    await trio.sleep(0.2)
                    go.set()
                assert len(statuses) == GUESSES
                assert CountingUsers.checked <= CONSOLE_MAX_FAILURES, statuses
                assert statuses.count(401) == CountingUsers.checked
                assert statuses.count(429) == GUESSES - CountingUsers.checked

                # The right password: refused unchecked while the name is locked...
                c = clients[0]
                r = await c.post("/login", data={"csrf": await _form(c), "user": "carol", "password": PASSWORD})
                assert r.status_code == 429 and "Too many failed logins" in r.text
                assert COOKIE not in r.headers.get("set-cookie", "")
                now[0] += LOCKOUT - 1
                r = await c.post("/login", data={"csrf": await _form(c), "user": "carol", "password": PASSWORD})
                assert r.status_code == 429
                assert CountingUsers.checked <= CONSOLE_MAX_FAILURES
                # ...and accepted once the lockout has passed.
                now[0] += 2
                r = await c.post("/login", data={"csrf": await _form(c), "user": "carol", "password": PASSWORD})
                assert r.status_code == 303, r.text
                assert COOKIE in r.headers.get("set-cookie", "")
            finally:
                for c in clients:
                    await c.aclose()
                nursery.cancel_scope.cancel()
