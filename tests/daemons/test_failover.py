"""A node given several platform addresses (identical platform instances on
one shared store) fails over between them: the order it dials them, the
backoff after a whole round, where it starts again after a steady session,
and that documents keep flowing across a failover.

Over memory streams with a fake clock (tests/_memwire.py): every address
that is "up" leads to the one platform daemon of the wire, the others refuse.
One test does the same with real sockets on 127.0.0.1, as users run it."""

from __future__ import annotations

import itertools
import logging
import random
import ssl
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from semq.node.core import NewDocument, NodeCore
from semq.node.daemon import INITIAL_DELAY, NodeDaemon, NodeSettings
from semq.platform.core import PlatformCore
from semq.platform.daemon import PlatformDaemon, PlatformSettings
from semq.settings.config import Address
from tests._memwire import (
    A,
    B,
    InlineGate,
    Wire,
    accept,
    count,
    couple_clocks,
    node_core,
    platform,
    platform_core,
    wait_for,
)
from tests._procs import free_port

X, Y, Z = Address("10.0.0.1", 7410), Address("10.0.0.2", 7410), Address("::1", 7411)


@pytest.fixture
def clock(autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> trio.testing.MockClock:
    """The fake clock, the only clock (see tests/daemons/test_daemon_logic.py);
    the reconnect jitter seeded."""
    import semq.node.daemon.node

    autojump_clock.autojump_threshold = 0
    couple_clocks(monkeypatch, autojump_clock)
    monkeypatch.setattr(semq.node.daemon.node, "random", random.Random(0))
    return autojump_clock


class Instances:
    """The platform addresses one node may dial over ``wire``: those in
    ``up`` lead to the wire's platform, the others refuse. ``dials``: every
    attempt, (fake time, address)."""

    def __init__(self, wire: Wire, node_id: str, up: set[Address]) -> None:
        self.wire = wire
        self.node_id = node_id
        self.up = up
        self.dials: list[tuple[float, Address]] = []

    async def connect(self, address: Address) -> trio.abc.Stream:
        self.dials.append((trio.current_time(), address))
        if address not in self.up:
            raise OSError(f"connection to {address} refused")
        stream: trio.abc.Stream = await self.wire.connector(self.node_id)(address)
        return stream

    def node(self, core: NodeCore, addresses: list[Address], **settings: Any) -> NodeDaemon:
        d = NodeDaemon(core, NodeSettings(addresses=addresses, connect=self.connect, **settings))
        d.gate = InlineGate()
        return d

    def since(self, t: float) -> list[Address]:
        return [a for at, a in self.dials if at >= t]


async def test_addresses_are_dialled_in_turn_and_each_round_backs_off(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """Three addresses, none answering: the node dials X, Y, Z one after
    the other without waiting, then waits (INITIAL_DELAY, jittered by
    0.5..1.5, doubling each round up to backoff_max) and starts the next
    round at X. Once Y answers, the node is connected there."""
    pcore, a = platform_core(tmp_path), node_core(tmp_path, A)
    async with trio.open_nursery() as nursery:
        wire = Wire(platform(pcore), nursery)
        inst = Instances(wire, A, up=set())
        da = inst.node(a, [X, Y, Z], backoff_max=2.0)
        await nursery.start(da.run)
        await trio.sleep(20)
        assert not da.connected and da.address is None
        rounds = [inst.dials[i:i + 3] for i in range(0, len(inst.dials) - 2, 3)]
        assert len(rounds) >= 8
        for r in rounds:
            assert [a for _, a in r] == [X, Y, Z]
            assert r[0][0] == r[1][0] == r[2][0]  # no wait within a round
        gaps = [b[0][0] - a[-1][0] for a, b in itertools.pairwise(rounds)]
        for n, gap in enumerate(gaps):
            nominal = min(2.0, INITIAL_DELAY * 2 ** n)
            assert 0.5 * nominal <= gap <= 1.5 * nominal, (n, gaps)
        inst.up.add(Y)
        await wait_for(lambda: da.connected, "connected", 10)
        nursery.cancel_scope.cancel()
    assert da.address == Y and [d for _, d in inst.dials[-2:]] == [X, Y]
    a.close()
    pcore.close()


async def test_after_a_steady_session_the_node_dials_that_address_first_then_fails_over(
        tmp_path: Path, clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture) -> None:
    """Connected to Y for a while, Y goes away: the node dials Y again after
    the short initial delay (a restarted instance is back at once), finds it
    refused and moves on to Z, then X, without waiting; connected to X.
    Every failover is logged with both addresses. Documents A sends before,
    during and after the failover all reach B once."""
    caplog.set_level(logging.INFO, "semq.node")
    pcore, a, b = platform_core(tmp_path), node_core(tmp_path, A), node_core(tmp_path, B)
    accept(a, [NewDocument(target=B, app_data=b"before %d" % i) for i in range(20)])
    async with trio.open_nursery() as nursery:
        wire = Wire(platform(pcore), nursery)
        await wire.start(b)
        inst = Instances(wire, A, up={Y})
        da = inst.node(a, [X, Y, Z], backoff_max=2.0)
        await nursery.start(da.run)
        await wait_for(lambda: count(b, "SELECT count(*) FROM inbox") == 20, "the first 20 at B")
        assert da.address == Y and [d for _, d in inst.dials] == [X, Y]
        await trio.sleep(30)  # longer than steady_after
        accept(a, [NewDocument(target=B, app_data=b"during %d" % i) for i in range(20)])
        inst.up = {X}
        t = trio.current_time()
        await wire.cut(A)
        await wait_for(lambda: da.connected, "connected again", 10)
        accept(a, [NewDocument(target=B, app_data=b"after %d" % i) for i in range(20)])
        await wait_for(lambda: count(b, "SELECT count(*) FROM inbox") == 60, "all 60 at B")
        nursery.cancel_scope.cancel()
    assert da.address == X and da.sessions == 2
    assert inst.since(t) == [Y, Z, X]
    first, then = (at for at, _ in inst.dials[-3:-1])
    assert 0.5 * INITIAL_DELAY <= first - t <= 1.5 * INITIAL_DELAY and then == first
    assert count(b, "SELECT count(*) FROM inbox") == 60
    assert count(b, "SELECT count(*) FROM (SELECT 1 FROM inbox GROUP BY record_id HAVING count(*) > 1)") == 0
    text = caplog.text
    assert "connected to platform:platform at 10.0.0.2:7410" in text
    assert "platform 10.0.0.2:7410 gone: " in text and "; reconnecting" in text
    assert "platform 10.0.0.2:7410 unreachable: connection to 10.0.0.2:7410 refused; trying [::1]:7411" in text
    assert "platform [::1]:7411 unreachable: connection to [::1]:7411 refused; trying 10.0.0.1:7410" in text
    assert "connected to platform:platform at 10.0.0.1:7410" in text
    for c in (a, b, pcore):
        c.close()


async def test_a_session_that_ends_early_counts_as_a_failed_attempt(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """An instance that says WELCOME and drops the session at once is not
    dialled again first: the node moves on to the next address, as for one
    that refuses."""
    pcore, a = platform_core(tmp_path), node_core(tmp_path, A)
    async with trio.open_nursery() as nursery:
        wire = Wire(platform(pcore), nursery)
        inst = Instances(wire, A, up={X, Y})
        da = inst.node(a, [X, Y], steady_after=5.0)
        await nursery.start(da.run)
        await wait_for(lambda: da.connected, "connected", 10)
        assert da.address == X
        await trio.sleep(1)  # shorter than steady_after
        await wire.cut(A)
        await wait_for(lambda: da.sessions == 2 and da.connected, "connected again", 10)
        nursery.cancel_scope.cancel()
    assert [d for _, d in inst.dials] == [X, Y] and da.address == Y
    a.close()
    pcore.close()


async def test_a_reload_changes_the_addresses_from_the_next_attempt(
        tmp_path: Path, clock: trio.testing.MockClock) -> None:
    """New addresses (a reload of semq.toml) are used from the next attempt
    on; one no longer listed is not dialled again."""
    pcore, a = platform_core(tmp_path), node_core(tmp_path, A)
    async with trio.open_nursery() as nursery:
        wire = Wire(platform(pcore), nursery)
        inst = Instances(wire, A, up={Z})
        da = inst.node(a, [X, Y], backoff_max=1.0)
        await nursery.start(da.run)
        await trio.sleep(5)
        assert not da.connected
        t = trio.current_time()
        da.s.addresses = [Z]
        await wait_for(lambda: da.connected, "connected", 10)
        nursery.cancel_scope.cancel()
    assert da.address == Z and da.s.host == "::1" and set(inst.since(t + 0.001)) <= {Z}
    a.close()
    pcore.close()


# -- real sockets --------------------------------------------------------------


async def test_failover_over_real_sockets(tmp_path: Path) -> None:
    """On 127.0.0.1 (real time, plain TCP): the first address refuses, the
    second is a platform daemon: the node connects to the second. That
    platform stops and one starts on the first address: the node reconnects
    there. Every wait is bounded."""
    first, second = free_port(), free_port()
    cores = [PlatformCore(tmp_path / f"p{i}.sqlite", create=True, synchronous="OFF") for i in (1, 2)]
    for c in cores:
        c.register([A])
    a = node_core(tmp_path, A)
    da = NodeDaemon(a, NodeSettings(addresses=[Address("127.0.0.1", first), Address("127.0.0.1", second)],
                                    backoff_max=0.5))
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            await nursery.start(da.run)
            p2 = trio.CancelScope()
            nursery.start_soon(_serve, PlatformDaemon(cores[1], PlatformSettings(port=second)), p2)
            while not da.connected:
                await trio.sleep(0.01)
            assert da.address == Address("127.0.0.1", second)
            p2.cancel()
            p1 = PlatformDaemon(cores[0], PlatformSettings(port=first))
            await nursery.start(p1.run)
            while da.address != Address("127.0.0.1", first) or not da.connected:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert da.sessions == 2
    a.close()
    for c in cores:
        c.close()


async def _serve(daemon: PlatformDaemon, scope: trio.CancelScope) -> None:
    with scope:
        await daemon.run()


async def test_tls_checks_the_certificate_against_the_address_dialled(
        tmp_path: Path, clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each platform instance's certificate names its own address: the
    TLS handshake is told the host actually dialled, not the first one."""
    names: list[str | None] = []

    class RefusingTLS:
        """trio.SSLStream as far as the node uses it, refusing every handshake."""

        def __init__(self, stream: trio.abc.Stream, _ctx: ssl.SSLContext, *, server_hostname: str | None) -> None:
            names.append(server_hostname)

        async def do_handshake(self) -> None:
            raise trio.BrokenResourceError("certificate verify failed")

    monkeypatch.setattr(trio, "SSLStream", RefusingTLS)
    pcore, a = platform_core(tmp_path), node_core(tmp_path, A)
    async with trio.open_nursery() as nursery:
        wire = Wire(platform(pcore), nursery, tap=False)
        inst = Instances(wire, A, up={X, Y, Z})
        da = inst.node(a, [X, Y, Z], ssl_context=ssl.create_default_context())
        await nursery.start(da.run)
        await wait_for(lambda: len(names) >= 4, "four handshakes", 10)
        nursery.cancel_scope.cancel()
    assert names[:4] == ["10.0.0.1", "10.0.0.2", "::1", "10.0.0.1"] and not da.sessions
    a.close()
    pcore.close()
