"""Guessing a console password in parallel, against the console a daemon
serves (``serve_console``: Hypercorn over HTTPS, the Starlette app, scrypt
in a thread), run in-process so the throttle's clock can be moved past the
lockout: forty simultaneous wrong passwords for one account get at most
``CONSOLE_MAX_FAILURES`` password checks, the rest 429, and the right
password is refused until the lockout has passed."""

from __future__ import annotations

import re
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio

import semq.web.app as app_mod
from semq.settings.bounds import CONSOLE_MAX_FAILURES, CONSOLE_MAX_HEADER
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


@asynccontextmanager
async def _served(tmp_path: Path) -> AsyncIterator[tuple[int, ssl.SSLContext]]:
    """A node's console on 127.0.0.1 (no accounts): its port and a context trusting it."""
    d = tmp_path / "10001"
    d.mkdir(mode=0o700)
    tls = console_tls("node", d, "127.0.0.1")
    backend = ConsoleBackend(role="node", ident="10001", directory=d, handlers={}, unit_dirs=[d])
    console = Console(backend=backend, users=UserStore(d), audit=AuditLog(d))
    ctx = ssl.create_default_context(cafile=str(d / "console" / "console.pem"))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_console, console, tls, "127.0.0.1", 0)
        try:
            yield port, ctx
        finally:
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("size", [8 * 1024, 32 * 1024])
async def test_request_head_over_the_bound_is_refused(tmp_path: Path, size: int) -> None:
    """A request head larger than CONSOLE_MAX_HEADER (16 KiB) gets 431; a
    smaller one is served."""
    with trio.fail_after(60):
        async with _served(tmp_path) as (port, ctx), \
                httpx.AsyncClient(base_url=f"https://127.0.0.1:{port}", verify=ctx) as c:
            r = await c.get("/login", headers={"x-padding": "p" * size})
            assert r.status_code == (200 if size < CONSOLE_MAX_HEADER else 431)


async def test_console_speaks_http_1_1_only(tmp_path: Path) -> None:
    """A client offering HTTP/2 first gets HTTP/1.1 (one parser, one set of bounds)."""
    with trio.fail_after(60):
        async with _served(tmp_path) as (port, ctx):
            ctx.set_alpn_protocols(["h2", "http/1.1"])
            stream = await trio.open_ssl_over_tcp_stream("127.0.0.1", port, ssl_context=ctx)
            try:
                await stream.do_handshake()
                assert stream.selected_alpn_protocol() == "http/1.1"
            finally:
                await stream.aclose()


async def test_a_form_sent_slowly_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A form whose body does not arrive within CONSOLE_FORM_S (here 0.5 s)
    is answered 400, naming the bound."""
    monkeypatch.setattr(app_mod, "CONSOLE_FORM_S", 0.5)
    with trio.fail_after(60):
        async with _served(tmp_path) as (port, ctx):
            stream = await trio.open_ssl_over_tcp_stream("127.0.0.1", port, ssl_context=ctx)
            try:
                await stream.send_all(b"POST /login HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                                      b"content-type: application/x-www-form-urlencoded\r\n"
                                      b"content-length: 1000\r\n\r\nuser=carol&pass")
                answer = b""
                while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"bytes)"):
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        break
                    answer += chunk
            finally:
                await stream.aclose()
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"the form took longer than 0.5 s to arrive (15 bytes)" in answer
