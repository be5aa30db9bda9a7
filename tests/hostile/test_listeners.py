"""Hostile peers at the listeners, against real processes on 127.0.0.1: an
enrolled organization with bad intent and a stranger try to take a node's
direct-link listener or the platform's away from everyone else, and each
is held to the bounds declared in semq.settings.bounds while the other
organizations' documents keep flowing. Every wait is bounded."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
import trio

from semq.testing import hostile
from semq.testing.hostile import Identity, process_usage
from tests._procs import Cluster, read_status, set_config, wait_until
from tests.e2e.test_e2e_flow import send

pytestmark = pytest.mark.e2e

A, B, M, C = "10008", "56001", "66001", "30001"  # A sends to B; M means harm; C is who B accepts
MIB = 1 << 20


def _listening(directory: Path) -> int:
    """The port of a node's direct-link listener (from its status)."""
    addr = wait_until(lambda: (read_status(directory).get("direct") or {}).get("listening"), 20,
                      "the node's direct-link listener")
    return int(str(addr).rpartition(":")[2])


def _still_delivers(c: Cluster, n: int, timeout: float = 40) -> None:
    """A's documents reach B through the platform while the attack goes on."""
    before = len(c.inbox(B))
    sent = send(c, A, B, n, key_prefix=f"D{before}-")
    wait_until(lambda: len(c.inbox(B)) - before >= n, timeout, f"{n} more documents in B's inbox")
    got = c.inbox(B)
    assert all(got[k] == v for k, v in sent.items())


def _cluster_with_listener(c: Cluster, *, direct_from: str = "", **caps: int) -> None:
    c.add_org(A)
    c.add_org(B, direct=("--listen", "127.0.0.1:0", *(("--direct-from", direct_from) if direct_from else ())))
    c.add_org(M)
    if caps:
        set_config(c.root / B, **caps)
    c.start_platform()
    c.start_node(A)
    c.start_node(B)


def test_one_partner_holds_no_more_direct_links_than_its_allowance(cluster: Cluster) -> None:
    """An enrolled organization opens 120 links to B's listener and leaves
    them idle after HELLO: it is welcomed on ``direct_max_links_per_org``
    (4) of them and refused on the rest; B's descriptors stay bounded, and
    A's documents through the platform are delivered meanwhile (before the
    bounds, every link was welcomed and held: 2,000 links cost B 2,017
    descriptors and its own platform connection)."""
    _cluster_with_listener(cluster)
    port = _listening(cluster.root / B)
    _still_delivers(cluster, 5)
    pid = cluster.procs[B].p.pid
    before = process_usage(pid)
    who = Identity.of(cluster.root / M)
    result: list[hostile.Flood] = []

    async def attack() -> None:
        result.append(await hostile.idle_links("127.0.0.1", port, who, B, 120, hold=8.0))

    async def meanwhile() -> None:
        await trio.sleep(3)
        usage.append(process_usage(pid))
        await trio.to_thread.run_sync(lambda: _still_delivers(cluster, 10))

    async def both() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(attack)
            nursery.start_soon(meanwhile)

    usage: list[hostile.Usage] = []
    trio.run(both)
    flood = result[0]
    assert flood.welcomed <= 4, flood.line()
    assert flood.closed >= 100, flood.line()
    assert usage[0].fds - before.fds < 40, f"B's descriptors went from {before.fds} to {usage[0].fds}"
    assert cluster.procs[B].p.poll() is None


def test_a_partner_the_listener_does_not_accept_gets_no_frame_read(cluster: Cluster) -> None:
    """B accepts direct links from C only. M, enrolled but not accepted,
    opens 8 links and sends each a first frame declaring 60 MiB: each is
    refused right after the TLS handshake with DIRECT_NOT_ALLOWED, before a
    frame is read, and B's memory does not grow by the frames (before, B
    read the 64 MiB frame first: +483 MiB for 8 links). A stranger whose
    first frame declares as much before HELLO gets no more than 64 KiB read."""
    cluster.add_org(C)
    _cluster_with_listener(cluster, direct_from=C)
    port = _listening(cluster.root / B)
    _still_delivers(cluster, 5)
    pid = cluster.procs[B].p.pid
    before = process_usage(pid)

    async def attack() -> tuple[hostile.Flood, hostile.Flood]:
        m = await hostile.big_first_frames("127.0.0.1", port, Identity.of(cluster.root / M), B, 8, 60 * MIB,
                                           seconds=15)
        # C is accepted: its first frame before HELLO may be 64 KiB at most.
        c = await hostile.big_first_frames("127.0.0.1", port, Identity.of(cluster.root / C), B, 4, 60 * MIB,
                                           seconds=15)
        return m, c

    m, c = trio.run(attack)
    after = process_usage(pid)
    assert m.closed == 8 and m.bytes_read < 8 * 4 * MIB, m.line()
    assert c.closed == 4 and c.bytes_read < 4 * 4 * MIB, c.line()
    grew = (after.peak - before.peak) / MIB
    assert grew < 40, f"B's peak memory grew by {grew:.0f} MiB"
    _still_delivers(cluster, 5)


def test_a_flood_of_links_leaves_the_node_descriptors_to_reach_its_platform(cluster: Cluster) -> None:
    """B's descriptor limit is lowered on the running process to what it
    holds plus 100, and a partner floods B's listener with 400 TLS links
    that say nothing. The listener stops taking them ``fd_reserve`` (64)
    short of the limit, so when the platform restarts meanwhile B
    reconnects to it and receives A's documents (before, the flood used
    B's descriptors up and B could not reach its platform for minutes)."""
    _cluster_with_listener(cluster, direct_max_links=100_000, direct_handshakes=10_000)
    port = _listening(cluster.root / B)
    _still_delivers(cluster, 5)
    pid = cluster.procs[B].p.pid
    hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (process_usage(pid).fds + 100, hard))
    who = Identity.of(cluster.root / M)
    peak: list[int] = []

    async def attack() -> hostile.Flood:
        return await hostile.silent_connections("127.0.0.1", port, 400, hold=9.0, tls=who.direct_tls)

    async def meanwhile() -> None:
        await trio.sleep(3)
        peak.append(process_usage(pid).fds)
        cluster.kill("P")
        cluster.start_platform()

    async def both() -> hostile.Flood:
        out: list[hostile.Flood] = []
        async with trio.open_nursery() as nursery:
            async def run_attack() -> None:
                out.append(await attack())
            nursery.start_soon(run_attack)
            nursery.start_soon(meanwhile)
        return out[0]

    flood = trio.run(both)
    assert flood.closed >= 300, flood.line()
    limit = resource.prlimit(pid, resource.RLIMIT_NOFILE)[0]
    assert peak[0] <= limit - 64 + 2, f"B held {peak[0]} descriptors of its {limit}"
    wait_until(lambda: read_status(cluster.root / B).get("connected"), 30, "B connected to the restarted platform")
    _still_delivers(cluster, 10)


def test_strangers_saying_nothing_cannot_hold_the_platforms_descriptors(cluster: Cluster) -> None:
    """300 connections that complete TCP and say nothing: the platform
    takes ``max_handshakes`` (32 here) at a time and closes the rest at
    once, its descriptors stay bounded, and a node connecting meanwhile is
    in within its hello time and a retry."""
    cluster.add_org(A)
    cluster.add_org(B)
    set_config(cluster.root / "P", max_handshakes=32)
    cluster.start_platform()
    cluster.start_node(A)
    pid = cluster.procs["P"].p.pid
    before = process_usage(pid)
    fds: list[int] = []

    async def attack() -> hostile.Flood:
        out: list[hostile.Flood] = []

        async def run_attack() -> None:
            out.append(await hostile.silent_connections("127.0.0.1", cluster.port, 300, hold=6.0))

        async def meanwhile() -> None:
            await trio.sleep(2)
            fds.append(process_usage(pid).fds)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_attack)
            nursery.start_soon(meanwhile)
        return out[0]

    flood = trio.run(attack)
    assert flood.held <= 32 and flood.closed >= 260, flood.line()
    assert fds[0] - before.fds < 50, f"the platform's descriptors went from {before.fds} to {fds[0]}"
    cluster.start_node(B)
    _still_delivers(cluster, 5)


def test_one_organizations_sessions_share_one_byte_budget_at_the_platform(cluster: Cluster) -> None:
    """M claims 8 units in HELLO (it is granted 1): refused. Then it opens
    16 sessions, one unit each, and streams a 60 MiB frame in every one it
    is let in on: the platform lets it hold 4 connections
    (``max_connections_per_org``), and their frames share its 96 MiB
    budget, so the relay's peak memory grows by about one frame, not
    sixteen (before: 612 MiB) — and A's documents keep flowing."""
    cluster.add_org(A)
    cluster.add_org(B)
    cluster.add_org(M)
    cluster.start_platform()
    cluster.start_node(A)
    cluster.start_node(B)
    _still_delivers(cluster, 5)
    pid = cluster.procs["P"].p.pid
    before = process_usage(pid)
    who = Identity.of(cluster.root / M)

    async def attack() -> tuple[hostile.Flood, hostile.Flood]:
        greedy = await hostile.big_frames_in_sessions("127.0.0.1", cluster.port, who, "platform", B, 2, 60 * MIB,
                                                      seconds=10, units=8)
        many = await hostile.big_frames_in_sessions("127.0.0.1", cluster.port, who, "platform", B, 16, 60 * MIB,
                                                    seconds=20)
        return greedy, many

    greedy, many = trio.run(attack)
    after = process_usage(pid)
    assert greedy.welcomed == 0, greedy.line()
    # (Sessions of one unit replace each other, so more than 4 may be
    # welcomed one after the other; at most 4 connections are held at once:
    # tests/daemons/test_daemon_logic.py::test_a_hello_cannot_raise_its_organizations_allowance.)
    assert many.held <= 4, many.line()
    grew = (after.peak - before.peak) / MIB
    assert grew < 200, f"the platform's peak memory grew by {grew:.0f} MiB ({many.line()})"
    _still_delivers(cluster, 5)
