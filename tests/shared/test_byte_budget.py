"""The bytes one organization's connections may buffer together
(semq.session.transport.ByteBudget): a frame's bytes are reserved when its header
arrives, a connection that would pass the budget waits before reading on,
and what a consumer took is free again."""

from __future__ import annotations

import trio
import trio.testing

from semq.session.transport import ByteBudget, FramePump, FrameStream
from semq.umxt_protocol import LK0, Chunk, Endpoint, Frame, Kind, encode_frame

ME = Endpoint.org("10008")


def _big(n: int) -> bytes:
    """A CHUNK frame of a little over ``n`` bytes from ME."""
    lk0 = LK0(endpoint=ME, semq_id=1, semq_db_id=1, record_id=1)
    return encode_frame(Frame(kind=Kind.CHUNK, source=ME, target=Endpoint.org("56001"),
                              body=Chunk(lk0=lk0, index=0, payload=bytes(n))))


async def test_a_budget_lets_one_frame_through_at_a_time_and_frees_what_was_taken() -> None:
    budget = ByteBudget(100)
    holders = [object(), object()]
    await budget.hold(holders[0], 80)
    assert budget.used == 80
    got = []

    async def second() -> None:
        await budget.hold(holders[1], 60)  # 80 + 60 > 100: waits
        got.append("second")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        assert got == [] and budget.waits == 1
        budget.shrink(holders[0], 30)  # 30 + 60 fits
        await trio.testing.wait_all_tasks_blocked()
        assert got == ["second"] and budget.used == 90
    budget.drop(holders[0])
    budget.drop(holders[1])
    assert budget.used == 0 and len(budget) == 0
    # One holder alone always proceeds (no frame up to the limit waits for ever).
    await budget.hold(holders[0], 100)
    assert budget.used == 100


async def test_connections_sharing_a_budget_read_no_further_than_it_allows() -> None:
    """Two connections of one organization each send frames; with a budget
    of one frame and a half, the second connection's reader stops before
    its frame while the first's are kept for the consumer, and goes on once
    they are taken."""
    frame = _big(1 << 20)  # (a read takes 256 KiB: the header comes long before the frame's end)
    size = len(frame)
    budget = ByteBudget(size + size // 2)
    (a_client, a_server), (b_client, b_server) = trio.testing.memory_stream_pair(), trio.testing.memory_stream_pair()
    fa, fb = FrameStream(a_server, budget=budget), FrameStream(b_server, budget=budget)
    pa, pb = FramePump(fa), FramePump(fb)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pa.run)
        nursery.start_soon(pb.run)
        await a_client.send_all(frame)
        await trio.testing.wait_all_tasks_blocked()
        assert budget.used >= size  # A's frame, kept for its consumer
        await b_client.send_all(frame)
        await trio.testing.wait_all_tasks_blocked()
        # B read the header (it fits in what it may hold), then waits: its
        # frame is not decoded while A's is kept.
        assert pb._buf == [] and budget.waits >= 1
        assert [f.kind for f in await pa.take()] == [Kind.CHUNK]
        await trio.testing.wait_all_tasks_blocked()
        assert [f.kind for f in await pb.take()] == [Kind.CHUNK]
        await trio.testing.wait_all_tasks_blocked()
        assert budget.used == 0
        nursery.cancel_scope.cancel()
