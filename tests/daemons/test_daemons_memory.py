"""The trio daemons over in-memory streams with a fake clock: the whole flow
(store while offline, deliver on connect, ACK2, cleanup, reconnect after a
cut) without sockets; backoff and intervals take no real time. The harness
is tests/_memwire.py; the daemons' finer rules over it are in
tests/daemons/test_daemon_logic.py. Store calls run on the event loop
(``InlineGate``), so the fake clock may jump at once; the worker threads of
production run in the end-to-end tests with real processes."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import trio
import trio.testing

from semq.node.core import NewDocument, NodeCore
from semq.platform.daemon import PlatformDaemon, PlatformSettings
from semq.umxt_protocol import AppKey, SaveFwd
from tests._memwire import Wire, accept, cores, count, wait_for


def _inbox_has(core: NodeCore, n: int) -> bool:
    return count(core, "SELECT count(*) FROM inbox") == n


async def test_flow_over_memory_streams(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    autojump_clock.autojump_threshold = 0  # store calls run on the event loop (InlineGate)
    pcore, a, b = cores(tmp_path)
    platform = PlatformDaemon(pcore, PlatformSettings())
    async with trio.open_nursery() as nursery:
        wire = Wire(platform, nursery)
        da = wire.node(a)
        db = wire.node(b)
        accept(a, [NewDocument(target="56001", app_data=f"order {i}".encode(), save_fwd=SaveFwd.MUST_DELIVER,
                              app_key=AppKey(domain="trade", data_type="ORDER", key=f"S{i:04d}"))
                  for i in range(25)])
        await nursery.start(da.run)
        # B is offline: everything is stored at the platform, A waits for ACK2 at SS_ACK.
        await wait_for(lambda: count(pcore, "SELECT count(*) FROM stored WHERE kind=1") == 25, "stored")
        await wait_for(lambda: count(a, "SELECT count(*) FROM outbox WHERE state=3") == 25, "A at SS_ACK")
        await nursery.start(db.run)
        await wait_for(lambda: count(b, "SELECT count(*) FROM inbox") == 25, "B's inbox")
        await wait_for(lambda: count(a, "SELECT count(*) FROM outbox") == 0
                       and count(b, "SELECT count(*) FROM inbound") == 0
                       and count(pcore, "SELECT count(*) FROM stored") == 0, "cleanup")
        # Cut every connection and keep the platform unreachable for a minute
        # (fake time): documents wait at A, then go once the nodes reconnect.
        wire.up = False
        await wire.cut()
        accept(a, [NewDocument(target="56001", app_data=b"late", save_fwd=SaveFwd.STORE)])
        await trio.sleep(60)
        # Not delivered, still held at A (SS_INIT, or SS_SENT if A claimed it
        # before it noticed the cut: then it asks the platform after reconnecting).
        assert count(a, "SELECT count(*) FROM outbox WHERE state IN (0, 1)") == 1
        assert count(b, "SELECT count(*) FROM inbox") == 25
        wire.up = True
        await wait_for(lambda: count(b, "SELECT count(*) FROM inbox") == 26, "delivery after reconnect")
        await wait_for(lambda: count(a, "SELECT count(*) FROM outbox") == 0, "A cleaned up")
        assert da.sessions >= 2 and db.sessions >= 2
        nursery.cancel_scope.cancel()
    assert count(b, "SELECT count(*) FROM (SELECT 1 FROM inbox GROUP BY origin_id, record_id"
                    " HAVING count(*) > 1)") == 0
    for c in (a, b, pcore):
        c.close()


async def test_a_document_written_by_another_process_leaves_at_once(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    """An application writes into the store of an idle node (another
    connection): the daemon sees the store's data_version change and claims
    it within its watch interval, not its poll interval (30 s here)."""
    autojump_clock.autojump_threshold = 0  # store calls run on the event loop (InlineGate)
    pcore, a, b = cores(tmp_path)
    platform = PlatformDaemon(pcore, PlatformSettings())
    async with trio.open_nursery() as nursery:
        wire = Wire(platform, nursery)
        da = wire.node(a, poll_interval=30.0)
        db = wire.node(b, poll_interval=30.0)
        await nursery.start(da.run)
        await nursery.start(db.run)
        await trio.sleep(2)  # idle: the watch interval has stretched to its cap
        for i in range(3):
            t0 = trio.current_time()
            accept(a, [NewDocument(target="56001", app_data=b"doc %d" % i)])
            await wait_for(partial(_inbox_has, b, i + 1), "delivery", timeout=60)
            assert trio.current_time() - t0 < 1.0  # fake seconds; the poll interval is 30
            await trio.sleep(1)
        nursery.cancel_scope.cancel()
    for c in (a, b, pcore):
        c.close()


async def test_draining_daemons_take_no_new_work(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    """``semq admin drain`` (docs/operations.md): a draining platform refuses
    new sessions (ERROR SHUTTING_DOWN) and delivers no more stored copies; a
    draining node claims no new documents. Nothing is lost: what waits is
    sent once the daemons run again undrained."""
    from semq.ops.admin import DrainControl

    autojump_clock.autojump_threshold = 0  # store calls run on the event loop (InlineGate)
    pcore, a, b = cores(tmp_path)
    platform = PlatformDaemon(pcore, PlatformSettings())
    async with trio.open_nursery() as nursery:
        wire = Wire(platform, nursery)
        da = wire.node(a)
        db = wire.node(b)
        accept(a, [NewDocument(target="56001", app_data=b"order %d" % i) for i in range(5)])
        await nursery.start(da.run)
        await wait_for(lambda: count(pcore, "SELECT count(*) FROM stored WHERE kind=1") == 5, "stored for B")
        platform.drain = DrainControl()
        platform.drain.request("test")
        da.drain = DrainControl()
        da.drain.request("test")
        await trio.sleep(1)  # (a claim already under way when the drain came finishes first)
        accept(a, [NewDocument(target="56001", app_data=b"after the drain")])
        await nursery.start(db.run)
        await trio.sleep(10)  # B tries again and again meanwhile (backoff 0.1 s doubling)
        assert db.sessions == 0 and not db.connected  # refused: the platform is draining
        assert count(b, "SELECT count(*) FROM inbox") == 0
        assert count(pcore, "SELECT count(*) FROM stored WHERE kind=1 AND state=0") == 5
        assert count(a, "SELECT count(*) FROM outbox WHERE state=0") == 1  # not claimed
        nursery.cancel_scope.cancel()
    # Started again (a drain ends in a stop): every document arrives, once.
    platform = PlatformDaemon(pcore, PlatformSettings())
    async with trio.open_nursery() as nursery:
        wire = Wire(platform, nursery)
        for core in (a, b):
            await nursery.start(wire.node(core).run)
        await wait_for(lambda: count(b, "SELECT count(*) FROM inbox") == 6, "every document at B")
        nursery.cancel_scope.cancel()
    assert count(b, "SELECT count(DISTINCT record_id) FROM inbox") == 6
    for c in (a, b, pcore):
        c.close()
