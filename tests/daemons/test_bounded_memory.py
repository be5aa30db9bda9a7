"""What bounds the relay's memory, on its parts: the reader's pump stops
reading at its byte bound, a delivery claim reads no more than its byte
bound of stored frames, the quota counts an organization's stored bytes.
With real processes: tests/e2e/test_trust_e2e.py (frames before HELLO,
connections per organization, the quota) and scripts/bench load frames."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from semq.platform.core import PlatformCore, PlatformOutput
from semq.session.transport import FramePump, FrameStream
from semq.umxt_protocol import (
    LK0,
    Data,
    Endpoint,
    Frame,
    FrameDecoder,
    Kind,
    Nack,
    RawFrame,
    ResultCode,
    encode_frame,
)

A, B = Endpoint.org("10008"), Endpoint.org("56001")


def _data(i: int, size: int) -> bytes:
    return encode_frame(Frame(kind=Kind.DATA, source=A, target=B,
                              body=Data(lk0=LK0(endpoint=A, record_id=i), app_data=bytes(size))))


def _raw(chunks: list[bytes]) -> list[RawFrame]:
    dec = FrameDecoder()
    dec.receive_data(b"".join(chunks))
    return dec.frames()


async def test_the_pump_stops_reading_at_its_byte_bound() -> None:
    left, right = trio.testing.memory_stream_pair()
    pump = FramePump(FrameStream(right), max_bytes=300_000)
    frame = _data(1, 100_000)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump.run)
        for _ in range(10):
            await left.send_all(frame)  # (memory streams buffer what is sent)
        await trio.testing.wait_all_tasks_blocked()
        held = sum(len(f.raw) for f in pump._buf)
        assert 300_000 <= held < 300_000 + 2 * len(frame)  # stopped: the rest waits in the stream
        got = await pump.take()
        await trio.testing.wait_all_tasks_blocked()
        assert len(got) == 3 and pump._buf  # room again: it read on
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("held_first", [False, True])
def test_a_delivery_claim_reads_no_more_than_its_byte_bound(tmp_path: Path, held_first: bool) -> None:
    core = PlatformCore(tmp_path / "p.sqlite", create=True, synchronous="OFF")
    try:
        core.register([A.node_id, B.node_id])
        core.handle(A, _raw([_data(i, 100_000) for i in range(1, 11)]), {})
        if held_first:  # a claim with copies in flight reads the send order past them
            frames, _ = core.claim_stored(B, 1)
            assert len(frames) == 1
        frames, n = core.claim_stored(B, 512, max_bytes=250_000)
        assert n == len(frames) == 2  # 100 kB each: two fit, the third would not
        frames, _ = core.claim_stored(B, 512, max_bytes=1)
        assert len(frames) == 1  # at least one, whatever its size
    finally:
        core.close()


def test_the_quota_counts_an_organizations_stored_bytes(tmp_path: Path) -> None:
    core = PlatformCore(tmp_path / "p.sqlite", create=True, synchronous="OFF", quota_bytes=350_000)
    try:
        core.register([A.node_id, B.node_id])
        out = core.handle(A, _raw([_data(i, 100_000) for i in range(1, 6)]), {}, PlatformOutput())
        nacks = [f.frame().body for f in _raw(out.sends[A]) if f.kind is Kind.NACK]
        assert [n.code for n in nacks if isinstance(n, Nack)] == [ResultCode.QUOTA_EXCEEDED] * 2
        assert core.conn.execute("SELECT count(*) FROM stored").fetchone() == (3,)
    finally:
        core.close()
