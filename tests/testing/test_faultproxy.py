"""Tests of the seeded TCP fault proxy (semq.testing.faultproxy).

Byte-exact behaviour (pass-through, cut offsets, close) is checked over real
sockets on 127.0.0.1 with dynamic ports, because that is how the chaos run uses
the proxy. Timing (delays, stalls, refuse periods) is checked over memory
streams with ``autojump_clock``: a fake clock only jumps when every task is
blocked on trio itself, which real sockets would break, and it makes a
10-second refusal take no time.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from semq.testing import (
    Direction,
    FaultPlan,
    FaultProxy,
    RefuseMode,
    open_fault_proxy,
    serve_fault_proxy,
)
from semq.testing.faultproxy import main

LOCALHOST = "127.0.0.1"
PAYLOAD = random.Random(1).randbytes(300_000)  # several chunks, not a multiple of 64 KiB


# --- helpers ---------------------------------------------------------------


@dataclass
class Upstream:
    """A TCP upstream on a dynamic port that records what each connection sent
    and optionally answers with ``reply`` then closes its side."""

    reply: bytes = b""
    echo: bool = False
    port: int = 0
    received: list[bytearray] = field(default_factory=list)
    finished: list[trio.Event] = field(default_factory=list)

    async def handler(self, stream: trio.SocketStream) -> None:
        buf = bytearray()
        done = trio.Event()
        self.received.append(buf)
        self.finished.append(done)
        try:
            async with stream:
                if self.reply:
                    await stream.send_all(self.reply)
                    await stream.send_eof()
                while True:
                    data = await stream.receive_some(65536)
                    if not data:
                        break
                    buf += data
                    if self.echo:
                        await stream.send_all(data)
                if self.echo:
                    await stream.send_eof()
        except trio.BrokenResourceError:
            pass
        finally:
            done.set()


@asynccontextmanager
async def running_upstream(up: Upstream) -> AsyncIterator[Upstream]:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, up.handler, 0, host=LOCALHOST))
        up.port = listeners[0].socket.getsockname()[1]
        yield up
        nursery.cancel_scope.cancel()


async def read_all(stream: trio.abc.Stream) -> bytes:
    """Read until EOF or reset; a cut may arrive as either."""
    out = bytearray()
    try:
        while True:
            data = await stream.receive_some(65536)
            if not data:
                break
            out += data
    except trio.BrokenResourceError:
        pass
    return bytes(out)


async def send_all_tolerant(stream: trio.abc.HalfCloseableStream, data: bytes) -> None:
    """Send and half-close, ignoring a cut that lands while we send."""
    try:
        await stream.send_all(data)
        await stream.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


def memory_connector(
    upstream_ends: list[trio.StapledStream[trio.abc.SendStream, trio.abc.ReceiveStream]],
) -> Callable[[], Awaitable[trio.abc.Stream]]:
    """An upstream connector over memory streams: each call makes a pair, keeps
    the far end in ``upstream_ends`` and gives the proxy the near end."""

    async def connect() -> trio.abc.Stream:
        near, far = trio.testing.memory_stream_pair()
        upstream_ends.append(far)
        return near

    return connect


# --- plan ------------------------------------------------------------------


def test_plan_is_deterministic_per_seed() -> None:
    kw = dict(cut_probability=0.5, cut_offset=(10, 100_000), refuse_probability=0.5)
    a = [FaultPlan(seed=5, **kw).connection_faults(i) for i in range(50)]  # type: ignore[arg-type]
    b = [FaultPlan(seed=5, **kw).connection_faults(i) for i in range(50)]  # type: ignore[arg-type]
    c = [FaultPlan(seed=6, **kw).connection_faults(i) for i in range(50)]  # type: ignore[arg-type]
    assert a == b
    assert a != c
    assert 10 < sum(f.cut_offset is not None for f in a) < 40
    assert {f.cut_direction for f in a} == {None, Direction.UP, Direction.DOWN}


@given(seed=st.integers(), index=st.integers(min_value=0, max_value=10**6))
def test_planned_offsets_stay_in_range(seed: int, index: int) -> None:
    plan = FaultPlan(seed=seed, cut_probability=1.0, cut_offset=(7, 9), refuse_seconds=(2.0, 3.0))
    f = plan.connection_faults(index)
    assert f.cut_offset is not None and 7 <= f.cut_offset <= 9
    assert f.refuse_seconds == 0.0  # refuse_probability is 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"delay": (0.2, 0.1)},
        {"delay": (-1.0, 1.0)},
        {"cut_probability": 1.5},
        {"cut_offset": (10, 5)},
        {"cut_probability": 0.1, "cut_directions": ()},
        {"fragment": -1},
        {"max_connections": 0},
        {"stall_seconds": (0.0, float("inf"))},
    ],
)
def test_plan_rejects_bad_knobs(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        FaultPlan(**kwargs)  # type: ignore[arg-type]


# --- real sockets ----------------------------------------------------------


async def test_pass_through_forwards_bytes_unchanged_both_ways() -> None:
    # Every fault switched on, but pass-through: nothing may change.
    plan = FaultPlan(seed=3, cut_probability=1.0, cut_offset=(0, 10), fragment=7, pass_through=True)
    async with (
        running_upstream(Upstream(echo=True)) as up,
        open_fault_proxy(LOCALHOST, 0, LOCALHOST, up.port, plan=plan) as proxy,
    ):
        assert proxy.port
        client = await trio.open_tcp_stream(LOCALHOST, proxy.port)
        async with client, trio.open_nursery() as nursery:
            nursery.start_soon(send_all_tolerant, client, PAYLOAD)
            echoed = await read_all(client)
        await up.finished[0].wait()
        assert bytes(up.received[0]) == PAYLOAD
        assert echoed == PAYLOAD
        stats = proxy.statistics()
        assert (stats.connections, stats.cuts) == (1, 0)
        assert stats.bytes_up == stats.bytes_down == len(PAYLOAD)


async def test_fragmented_forwarding_keeps_bytes() -> None:
    plan = FaultPlan(seed=11, fragment=1000)
    async with (
        running_upstream(Upstream()) as up,
        open_fault_proxy(LOCALHOST, 0, LOCALHOST, up.port, plan=plan) as proxy,
    ):
        assert proxy.port
        client = await trio.open_tcp_stream(LOCALHOST, proxy.port)
        async with client:
            await client.send_all(PAYLOAD)
            await client.send_eof()
            await read_all(client)
        await up.finished[0].wait()
        assert bytes(up.received[0]) == PAYLOAD


@pytest.mark.parametrize("direction", [Direction.UP, Direction.DOWN])
async def test_cut_lands_on_the_planned_offset(direction: Direction) -> None:
    plan = FaultPlan(
        seed=5, cut_probability=1.0, cut_offset=(1, len(PAYLOAD) - 1), cut_directions=(direction,)
    )
    observed = []
    for _ in range(2):  # same seed, fresh proxy: same offsets
        up = Upstream(reply=PAYLOAD if direction is Direction.DOWN else b"")
        async with (
            running_upstream(up),
            open_fault_proxy(LOCALHOST, 0, LOCALHOST, up.port, plan=plan) as proxy,
        ):
            assert proxy.port
            per_run = []
            for _conn in range(3):
                client = await trio.open_tcp_stream(LOCALHOST, proxy.port)
                async with client, trio.open_nursery() as nursery:
                    if direction is Direction.UP:
                        nursery.start_soon(send_all_tolerant, client, PAYLOAD)
                    got_down = await read_all(client)
                await up.finished[-1].wait()
                per_run.append(len(up.received[-1]) if direction is Direction.UP else len(got_down))
                if direction is Direction.DOWN:
                    assert got_down == PAYLOAD[: len(got_down)]  # a prefix, unchanged
                else:
                    assert bytes(up.received[-1]) == PAYLOAD[: len(up.received[-1])]
            assert proxy.statistics().cuts == 3
        observed.append(per_run)
    expected = [plan.connection_faults(i).cut_offset for i in range(3)]
    assert observed == [expected, expected]
    assert len(set(expected)) == 3  # really random offsets, mid-stream


async def test_cut_all_and_close_end_every_connection() -> None:
    plan = FaultPlan(seed=1)
    async with running_upstream(Upstream()) as up, trio.open_nursery() as nursery:
        proxy = FaultProxy(plan)
        port = await nursery.start(proxy.serve, LOCALHOST, 0, LOCALHOST, up.port)
        assert port == proxy.port
        a = await trio.open_tcp_stream(LOCALHOST, port)
        b = await trio.open_tcp_stream(LOCALHOST, port)
        await a.send_all(b"x")
        await b.send_all(b"y")
        while proxy.statistics().bytes_up < 2:  # bounded by the test timeout
            await trio.sleep(0.01)
        assert proxy.cut_all() == 2
        assert await read_all(a) == b""
        assert await read_all(b) == b""
        # After close(), the listener is gone as well.
        c = await trio.open_tcp_stream(LOCALHOST, port)
        await proxy.aclose()
        assert await read_all(c) == b""
        with pytest.raises(OSError):
            await trio.open_tcp_stream(LOCALHOST, port)
        stats = proxy.statistics()
        assert (stats.cuts, stats.active) == (2, 0)
        await a.aclose()
        await b.aclose()
        await c.aclose()


async def test_cut_with_reset_reaches_client_as_reset_or_eof() -> None:
    plan = FaultPlan(seed=2)
    async with (
        running_upstream(Upstream()) as up,
        open_fault_proxy(LOCALHOST, 0, LOCALHOST, up.port, plan=plan) as proxy,
    ):
        assert proxy.port
        client = await trio.open_tcp_stream(LOCALHOST, proxy.port)
        async with client:
            await client.send_all(b"hello")
            while proxy.statistics().bytes_up < 5:
                await trio.sleep(0.01)
            assert proxy.cut_all(reset=True) == 1
            with pytest.raises(trio.BrokenResourceError):
                await client.receive_some(10)


async def test_serve_fault_proxy_reports_port_and_upstream_failure() -> None:
    # Nothing listens upstream: the client is closed, and that is counted.
    dead = trio.socket.socket()
    await dead.bind((LOCALHOST, 0))
    dead_port = dead.getsockname()[1]
    dead.close()
    proxy = FaultProxy(FaultPlan())
    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            partial(serve_fault_proxy, LOCALHOST, 0, LOCALHOST, dead_port, plan=FaultPlan())
        )
        port2 = await nursery.start(proxy.serve, LOCALHOST, 0, LOCALHOST, dead_port)
        assert port > 0 and port2 > 0 and port != port2
        for p in (port, port2):
            client = await trio.open_tcp_stream(LOCALHOST, p)
            async with client:
                assert await read_all(client) == b""
        nursery.cancel_scope.cancel()
    stats = proxy.statistics()
    assert (stats.accepted, stats.upstream_failures, stats.connections) == (1, 1, 0)


# --- memory streams + fake clock -------------------------------------------


async def test_constant_delay_is_observed_per_chunk(autojump_clock: trio.abc.Clock) -> None:
    proxy = FaultProxy(FaultPlan(seed=1, delay=(0.5, 0.5)))
    ends: list = []
    client, proxy_side = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(proxy.handle_connection, proxy_side, memory_connector(ends))
        start = trio.current_time()
        for i in range(3):  # one chunk at a time: the next is sent once this arrived
            await client.send_all(b"chunk%d" % i)
            await trio.testing.wait_all_tasks_blocked()
            assert await ends[0].receive_some(100) == b"chunk%d" % i
            assert trio.current_time() - start == pytest.approx(0.5 * (i + 1))
        await client.send_eof()
        await ends[0].aclose()
    assert proxy.statistics().delays == 3


async def test_random_delays_follow_the_seed(autojump_clock: trio.abc.Clock) -> None:
    plan = FaultPlan(seed=9, delay=(0.1, 2.0))
    rng = plan.chunk_rng(0, Direction.UP)
    expected = []
    for _ in range(4):  # per chunk: delay, stall roll, stall length
        expected.append(rng.uniform(*plan.delay))
        rng.random()
        rng.uniform(*plan.stall_seconds)
    proxy = FaultProxy(plan)
    ends: list = []
    client, proxy_side = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(proxy.handle_connection, proxy_side, memory_connector(ends))
        for i in range(4):
            t0 = trio.current_time()
            await client.send_all(b"x")
            await trio.testing.wait_all_tasks_blocked()
            assert await ends[0].receive_some(10) == b"x"
            assert trio.current_time() - t0 == pytest.approx(expected[i])
        nursery.cancel_scope.cancel()


async def test_planned_stall_and_stall_for(autojump_clock: trio.abc.Clock) -> None:
    proxy = FaultProxy(FaultPlan(seed=4, stall_probability=1.0, stall_seconds=(3.0, 3.0)))
    ends: list = []
    client, proxy_side = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(proxy.handle_connection, proxy_side, memory_connector(ends))
        t0 = trio.current_time()
        await client.send_all(b"a")
        await trio.testing.wait_all_tasks_blocked()
        assert await ends[0].receive_some(10) == b"a"
        assert trio.current_time() - t0 == pytest.approx(3.0)
        # Explicit stall: also in pass-through, both directions.
        proxy.set_pass_through(True)
        proxy.stall_for(30.0)
        t0 = trio.current_time()
        await ends[0].send_all(b"b")
        assert await client.receive_some(10) == b"b"
        assert trio.current_time() - t0 == pytest.approx(30.0)
        nursery.cancel_scope.cancel()
    assert proxy.statistics().stalls == 1


@pytest.mark.parametrize("mode", [RefuseMode.CLOSE, RefuseMode.HOLD])
async def test_refuse_for_refuses_then_recovers(
    autojump_clock: trio.abc.Clock, mode: RefuseMode
) -> None:
    proxy = FaultProxy(FaultPlan(seed=1))
    ends: list = []
    connect = memory_connector(ends)
    proxy.refuse_for(10.0, mode=mode)
    async with trio.open_nursery() as nursery:
        client, proxy_side = trio.testing.memory_stream_pair()
        t0 = trio.current_time()
        nursery.start_soon(proxy.handle_connection, proxy_side, connect)
        assert await client.receive_some(10) == b""  # closed without an upstream
        waited = trio.current_time() - t0
        assert waited == pytest.approx(10.0 if mode is RefuseMode.HOLD else 0.0)
        assert ends == []
        await trio.sleep(10.0 - waited + 0.001)
        client, proxy_side = trio.testing.memory_stream_pair()
        nursery.start_soon(proxy.handle_connection, proxy_side, connect)
        await client.send_all(b"after")
        assert await ends[0].receive_some(10) == b"after"
        nursery.cancel_scope.cancel()
    stats = proxy.statistics()
    assert (stats.accepted, stats.refusals, stats.connections) == (2, 1, 1)


async def test_planned_cut_starts_a_refuse_period(autojump_clock: trio.abc.Clock) -> None:
    plan = FaultPlan(
        seed=8,
        cut_probability=1.0,
        cut_offset=(3, 3),
        cut_directions=(Direction.UP,),
        refuse_probability=1.0,
        refuse_seconds=(5.0, 5.0),
    )
    proxy = FaultProxy(plan)
    ends: list = []
    connect = memory_connector(ends)
    async with trio.open_nursery() as nursery:
        client, proxy_side = trio.testing.memory_stream_pair()
        nursery.start_soon(proxy.handle_connection, proxy_side, connect)
        await client.send_all(b"abcdef")
        assert await read_all(ends[0]) == b"abc"  # cut after exactly 3 bytes, mid-"frame"
        assert await read_all(client) == b""
        for expect_refused in (True, False):  # refused during the period, then back
            client, proxy_side = trio.testing.memory_stream_pair()
            nursery.start_soon(proxy.handle_connection, proxy_side, connect)
            await trio.testing.wait_all_tasks_blocked()
            assert len(ends) == (1 if expect_refused else 2)
            await trio.sleep(5.0)
        nursery.cancel_scope.cancel()
    stats = proxy.statistics()
    assert (stats.cuts, stats.refusals, stats.connections) == (1, 1, 2)


async def test_set_pass_through_turns_planned_faults_off(autojump_clock: trio.abc.Clock) -> None:
    plan = FaultPlan(seed=2, delay=(1.0, 1.0), cut_probability=1.0, cut_offset=(0, 0))
    proxy = FaultProxy(plan)
    proxy.set_pass_through(True)
    ends: list = []
    client, proxy_side = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(proxy.handle_connection, proxy_side, memory_connector(ends))
        t0 = trio.current_time()
        await client.send_all(b"data")
        assert await ends[0].receive_some(10) == b"data"
        assert trio.current_time() == t0  # no delay, no cut at offset 0
        proxy.set_pass_through(False)
        await client.send_all(b"more")
        assert await read_all(ends[0]) == b""  # now the planned cut at 0 applies
    assert proxy.statistics().cuts == 1


async def test_max_connections_refuses_the_extra_one(autojump_clock: trio.abc.Clock) -> None:
    proxy = FaultProxy(FaultPlan(max_connections=1))
    ends: list = []
    connect = memory_connector(ends)
    async with trio.open_nursery() as nursery:
        _first, p1 = trio.testing.memory_stream_pair()
        second, p2 = trio.testing.memory_stream_pair()
        nursery.start_soon(proxy.handle_connection, p1, connect)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(proxy.handle_connection, p2, connect)
        assert await second.receive_some(10) == b""
        assert proxy.statistics().active == 1
        nursery.cancel_scope.cancel()
    assert proxy.statistics().refusals == 1


# --- command line ----------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--listen", "127.0.0.1", "--upstream", "127.0.0.1:1"],
        ["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:99999"],
        ["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1", "--delay", "2:1"],
        ["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1", "--cut-offset", "a:b"],
    ],
)
def test_cli_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


async def test_cli_process_prints_port_forwards_and_stops_on_sigterm() -> None:
    async with running_upstream(Upstream(echo=True)) as up:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", "semq.testing.faultproxy"]
        cmd += ["--listen", f"{LOCALHOST}:0", "--upstream", f"{LOCALHOST}:{up.port}"]
        cmd += ["--seed", "5", "--delay", "0:0.001"]
        async with trio.open_nursery() as nursery:
            proc: trio.Process = await nursery.start(
                lambda task_status: trio.run_process(
                    cmd,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=env,
                    check=False,
                    task_status=task_status,
                )
            )
            assert proc.stdout is not None and proc.stderr is not None
            with trio.fail_after(10):
                line = b""
                while not line.endswith(b"\n"):
                    line += await proc.stdout.receive_some(100)
            port = int(line)
            client = await trio.open_tcp_stream(LOCALHOST, port)
            async with client:
                await client.send_all(b"ping")
                await client.send_eof()
                assert await read_all(client) == b"ping"
            # SIGUSR1 cuts every open connection.
            held = await trio.open_tcp_stream(LOCALHOST, port)
            async with held:
                await held.send_all(b"echo")
                got = b""
                while len(got) < 4:  # loopback may split even 4 bytes, in principle
                    got += await held.receive_some(10)
                assert got == b"echo"
                proc.send_signal(signal.SIGUSR1)
                with trio.fail_after(10):
                    assert await read_all(held) == b""
            proc.send_signal(signal.SIGTERM)
            with trio.fail_after(10):
                err = await read_all(proc.stderr)
                assert await proc.wait() == 0
        assert b'"bytes_up": 8' in err and b'"cuts": 1' in err
