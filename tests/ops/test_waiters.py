"""Waiting for documents: semq.ops.waiters (the daemon's side, over a fake
clock) and the ``wait_inbox`` request over a real admin socket against a
real node store (semq.session.inbox_wait is the client)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from semq.node.core import NodeCore
from semq.node.receiver.inbox import _TOP, _TOP_OF_USER
from semq.ops.admin import DrainControl, admin_request, serve_admin
from semq.ops.handlers import node_handlers
from semq.ops.waiters import ADMIN_WAITS, InboxWaiters, WaitLimitReached
from semq.session.inbox_wait import MAX_WAIT, WaitRefused, await_any, wait_any
from tests.ops.test_ops_handlers import NodeStandIn

A, B = "10008", "56001"


class Store:
    """A check that reads a counter, and counts how often it is asked."""

    def __init__(self) -> None:
        self.top = 0
        self.checks = 0

    async def check(self, after: int = 0) -> tuple[bool, int]:
        self.checks += 1
        return self.top > after, self.top


async def test_a_wait_is_answered_at_the_arrival_and_checks_only_then(autojump_clock: trio.testing.MockClock) -> None:
    w = InboxWaiters()
    s = Store()
    answers: list[tuple[float, dict[str, Any]]] = []

    async def waiter() -> None:
        got = await w.wait(s.check, timeout=20)
        answers.append((trio.current_time(), got))

    async with trio.open_nursery() as n:
        n.start_soon(waiter)
        await trio.sleep(10)  # ten quiet seconds: one check, at the start
        assert s.checks == 1 and w.statistics().waiting == 1
        w.arrived()  # a commit, but not above after_id yet (another user's, say): checked again, waits on
        await trio.sleep(1)
        assert s.checks == 2 and not answers
        s.top = 5
        w.arrived()
    [(at, answer)] = answers
    assert answer == {"ready": True, "top": 5} and at == pytest.approx(11)
    assert s.checks == 3 and w.statistics().answered == 1 and w.statistics().waiting == 0


async def test_a_wait_times_out_and_is_capped(autojump_clock: trio.testing.MockClock) -> None:
    w = InboxWaiters()
    s = Store()
    t0 = trio.current_time()
    assert await w.wait(s.check, timeout=3) == {"ready": False, "top": 0}
    assert trio.current_time() - t0 == pytest.approx(3) and s.checks == 1
    t0 = trio.current_time()
    assert (await w.wait(s.check, timeout=10_000))["ready"] is False
    assert trio.current_time() - t0 == pytest.approx(MAX_WAIT)
    assert w.statistics().timed_out == 2


async def test_an_arrival_during_the_check_is_not_missed(autojump_clock: trio.testing.MockClock) -> None:
    w = InboxWaiters()
    s = Store()

    async def slow_check() -> tuple[bool, int]:
        ready, top = await s.check()
        if s.checks == 1:  # the document commits while the first check reads the store
            s.top = 1
            w.arrived()
        return ready, top

    t0 = trio.current_time()
    assert await w.wait(slow_check, timeout=20) == {"ready": True, "top": 1}
    assert trio.current_time() - t0 < 1


async def test_waits_are_bounded_per_socket_and_per_user(autojump_clock: trio.testing.MockClock) -> None:
    w = InboxWaiters({"admin": 2, "user": 3}, each=2)
    s = Store()
    async with trio.open_nursery() as n:
        for _ in range(2):
            n.start_soon(lambda: w.wait(s.check, timeout=5))
        n.start_soon(lambda: w.wait(s.check, timeout=5, pool="user", who="alice"))
        n.start_soon(lambda: w.wait(s.check, timeout=5, pool="user", who="alice"))
        await trio.sleep(1)
        with pytest.raises(WaitLimitReached, match="2 waits are open on this admin socket, its limit of 2"):
            await w.wait(s.check, timeout=5)
        with pytest.raises(WaitLimitReached, match="2 waits of user alice are open, the limit of 2 per user"):
            await w.wait(s.check, timeout=5, pool="user", who="alice")
        assert (await w.wait(s.check, timeout=1, pool="user", who="bob"))["ready"] is False  # bob has his own
    assert w.statistics().refused == 2 and w.statistics().waiting == 0
    assert (await w.wait(s.check, timeout=1))["ready"] is False  # the slots came back


# ---------------------------------------------------------------- over the admin socket


def _inbox_row(core: NodeCore, record: int, to_user: str = "") -> None:
    with core.db.atomic("IMMEDIATE"):
        core.conn.execute(
            "INSERT INTO inbox (origin_type, origin_id, semq_id, semq_db_id, record_id, save_fwd, created_ms,"
            " received_ms, app_data, to_user) VALUES (1, ?, 1, 1, ?, 3, ?, ?, x'6869', ?)",
            (A, record, int(time.time() * 1000), int(time.time() * 1000), to_user))


async def test_wait_inbox_over_the_admin_socket(tmp_path: Path) -> None:
    core = NodeCore(tmp_path / "node.sqlite", B, create=True)
    d = NodeStandIn()
    waiters = InboxWaiters()
    h = node_handlers(d, core, reload=lambda: None, drain=DrainControl(), waiters=waiters)
    sock = tmp_path / "admin.sock"
    try:
        async with trio.open_nursery() as n:
            await n.start(serve_admin, sock, h)
            # Nothing there: answered at its timeout.
            t0 = time.monotonic()
            got = await await_any([(sock, {"after_id": 0})], 0.3)
            assert got == {0: {"ready": False, "top": 0}} and 0.25 < time.monotonic() - t0 < 2

            async def commit_later() -> None:
                await trio.sleep(0.3)
                _inbox_row(core, 1, to_user="alice")
                waiters.arrived()  # what the daemon does after its commit

            n.start_soon(commit_later)
            t0 = time.monotonic()
            got = await await_any([(sock, {"after_id": 0, "timeout": 10})], 10)
            assert got[0] == {"ready": True, "top": 1} and time.monotonic() - t0 < 2
            # A document there already: at once. One of another user: not for bob.
            assert (await await_any([(sock, {"after_id": 0})], 5))[0]["ready"] is True
            assert (await await_any([(sock, {"after_id": 0, "user": "bob"})], 0.2))[0]["ready"] is False
            assert (await await_any([(sock, {"after_id": 1})], 0.2))[0]["ready"] is False
            # Acknowledged: no longer waited for.
            core.conn.execute("UPDATE inbox SET consumed_ms=1")
            assert core.inbox.top() == 0
            assert (await await_any([(sock, {"after_id": 0})], 0.2))[0]["ready"] is False
            with pytest.raises(WaitRefused, match="timeout 'x' is not a number"):
                await await_any([(sock, {"after_id": 0, "timeout": "x"})], 1)

            # The synchronous client, from a thread, too.
            got = await trio.to_thread.run_sync(lambda: wait_any([(sock, {"after_id": 0})], 0.2))
            assert got == {0: {"ready": False, "top": 0}}

            # A client that opens more waits than the pool holds is told,
            # and waits it abandons (connection closed) give their slot back.
            async def hold(scope: trio.CancelScope) -> None:
                with scope:
                    await await_any([(sock, {"after_id": 99})], 20)

            scopes = [trio.CancelScope() for _ in range(ADMIN_WAITS)]
            for sc in scopes:
                n.start_soon(hold, sc)
            await wait_for(lambda: waiters.statistics().waiting == ADMIN_WAITS)
            with pytest.raises(WaitRefused, match=f"its limit of {ADMIN_WAITS}"):
                await await_any([(sock, {"after_id": 0})], 1)
            # Commands still get in: the waits hold half the connections at most.
            pong = await trio.to_thread.run_sync(lambda: admin_request(sock, "ping"))
            assert pong["ok"] and pong["result"]["role"] == "node"
            for sc in scopes:
                sc.cancel()
            await wait_for(lambda: waiters.statistics().waiting == 0)
            waits = (await h["status"]({}))["waits"]
            assert waits["waiting"] == 0 and waits["refused"] == 1 and waits["answered"] >= 2
            assert (await await_any([(sock, {"after_id": 0})], 0.1))[0]["ready"] is False
            n.cancel_scope.cancel()
    finally:
        core.close()


async def wait_for(pred: Any, timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.01)


def test_inbox_top_reads_the_index_not_the_table(tmp_path: Path) -> None:
    core = NodeCore(tmp_path / "node.sqlite", B, create=True)
    try:
        for q, args in ((_TOP, ()), (_TOP_OF_USER, ("alice",))):
            plan = " ".join(str(r[-1]) for r in core.conn.execute("EXPLAIN QUERY PLAN " + q, args))
            assert "USING" in plan and "INDEX" in plan, plan
    finally:
        core.close()


async def test_wait_inbox_on_the_user_socket_is_for_that_user_only(tmp_path: Path) -> None:
    import json

    from semq.cli import main as semq_main
    from semq.node.api import NodeClient
    from semq.ops.admin import AdminCommandError, _dispatch
    from semq.ops.usersock import UserGate, _Store, user_handlers
    from semq.settings.config import load_config

    d = tmp_path / "B"
    assert semq_main(["node", "init", "--dir", str(d), "--org", B, "--no-security"]) == 0
    with NodeClient(d) as c:
        alice = c.add_user("alice")
        c.add_user("bob")
    w = InboxWaiters()
    store = _Store(load_config(d))
    h = user_handlers(load_config(d), w, store=store)
    gate = UserGate(store)

    async def call(**args: Any) -> dict[str, Any]:
        # As on the socket: the first line proves the connection's user, then it is answered.
        session = await gate.admit("wait_inbox", dict(args), None)
        try:
            line, _ = await _dispatch(json.dumps({"cmd": "wait_inbox", "args": args}).encode(), h, session=session)
        finally:
            session.close()
        return dict(json.loads(line))

    assert (await call(user="alice", token=alice, timeout=0.2)) == {"ok": True,
                                                                    "result": {"ready": False, "top": [0]}}
    with pytest.raises(AdminCommandError, match="user alice and this token do not match"):
        await call(user="alice", token="not-hers", timeout=0.2)
    answers: list[dict[str, Any]] = []
    with NodeClient(d) as c:
        async with trio.open_nursery() as n:
            async def wait() -> None:
                answers.append(await call(user="alice", token=alice, after=[0], timeout=10))

            n.start_soon(wait)
            await trio.sleep(0.3)
            _inbox_row(c.core, 1, to_user="bob")  # bob's: alice waits on
            w.arrived()
            await trio.sleep(0.3)
            assert not answers
            _inbox_row(c.core, 2, to_user="alice")
            t0 = time.monotonic()
            w.arrived()
            await wait_for(lambda: answers)
            assert time.monotonic() - t0 < 1
    assert answers == [{"ok": True, "result": {"ready": True, "top": [2]}}]
    got = await call(user="alice", token=alice, after=[2], timeout=0.1)
    assert got["result"]["ready"] is False
    got = await call(user="alice", token=alice, after=[1, 2], timeout=0.1)
    assert "after [1, 2] is not a list of 1 row ids" in got["error"]
