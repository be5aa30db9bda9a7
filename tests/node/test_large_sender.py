"""The origin's chunk sender (semq.node.daemon.large_sender.LargeSender) over a trio
memory stream: a probe per document at the start of a session, then at most
a window of each in flight, documents in turn (priority first), a RESUME
rewinds, the platform's "kept" acknowledgements give credit, and silence
becomes a probe after the stall time (fake clock)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from semq.node.core import NewDocument, NodeCore
from semq.node.daemon.large_sender import STALL_S, LargeSender
from semq.node.large.manifest import Manifest
from semq.node.large.outgoing import Outgoing
from semq.session.transport import FrameStream
from semq.store.gate import StoreGate
from semq.umxt_protocol import Chunk, Kind

CHUNK = 4096
WINDOW = 3 * CHUNK


@pytest.fixture
def core(tmp_path: Path) -> Any:
    c = NodeCore(tmp_path / "node.sqlite", "10008", create=True, synchronous="OFF")
    try:
        yield c
    finally:
        c.close()


def _doc(core: NodeCore, tmp_path: Path, name: str, chunks: int, priority: int = 0) -> None:
    content = os.urandom(chunks * CHUNK)
    d = tmp_path / "large" / "out"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.doc").write_bytes(content)
    m = Manifest.new(len(content), hashlib.sha256(content).digest(), encrypt=False, chunk_size=CHUNK)
    core.accept([NewDocument(target="56001", app_data=m.encode(), priority=priority,
                             large_path=f"large/out/{name}.doc")])


def _docs(core: NodeCore) -> list[Outgoing]:
    core.claim(10)  # the manifests sent: their transfers are under way
    return sorted(core.large_out.pending(), key=lambda d: d.record_id)


def _session(core: NodeCore) -> tuple[LargeSender, FrameStream, FrameStream]:
    """A sender, the end of its session it writes to, and the peer's end
    (a trio memory stream pair)."""
    left, right = trio.testing.memory_stream_pair()
    return LargeSender(core, StoreGate(), window_bytes=WINDOW), FrameStream(left), FrameStream(right)


async def _read(fs: FrameStream, n: int, timeout: float = 5) -> list[tuple[int, int]]:
    """The next ``n`` chunks sent: (record id, index)."""
    got: list[tuple[int, int]] = []
    with trio.fail_after(timeout):
        while len(got) < n:
            for raw in await fs.receive_batch():
                assert raw.kind is Kind.CHUNK
                c = raw.frame().body
                assert isinstance(c, Chunk)
                got.append((c.lk0.record_id, c.index))
    return got


async def _nothing_more(fs: FrameStream) -> None:
    with trio.move_on_after(0.3):
        extra = await fs.receive_batch()
        raise AssertionError(f"sent past the window: {extra}")


async def test_probe_then_window_then_turns(core: NodeCore, tmp_path: Path) -> None:
    _doc(core, tmp_path, "a", 10)
    _doc(core, tmp_path, "b", 10)
    a, b = _docs(core)
    sender, out, peer = _session(core)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender.run, out)
        # A new session: each document's next chunk alone, as a probe.
        assert sorted(await _read(peer, 2)) == [(a.record_id, 0), (b.record_id, 0)]
        await _nothing_more(peer)
        # The receiver has none: the rest of a window (3 chunks, the probe
        # counted) of each, in turn.
        sender.acked([(a, 0, False, False), (b, 0, False, False)])
        got = await _read(peer, 4)
        assert sorted(got) == sorted([(a.record_id, i) for i in (1, 2)] + [(b.record_id, i) for i in (1, 2)])
        assert [r for r, _ in got] in ([a.record_id, b.record_id] * 2, [b.record_id, a.record_id] * 2)
        await _nothing_more(peer)
        # 2 of a committed: 2 more of a; a RESUME at 1 for b: b from 1 again.
        sender.acked([(a, 2, False, False)])
        assert await _read(peer, 2) == [(a.record_id, 3), (a.record_id, 4)]
        sender.acked([(b, 1, True, False)])
        assert await _read(peer, 3) == [(b.record_id, 1), (b.record_id, 2), (b.record_id, 3)]
        assert sender.stats["chunks_resent"] == 2
        # The platform keeps a's chunks 2..4 (its receiver is away): credit.
        sender.acked([(a, 3, False, True), (a, 4, False, True), (a, 5, False, True)])
        assert await _read(peer, 3) == [(a.record_id, 5), (a.record_id, 6), (a.record_id, 7)]
        # The whole of a at the receiver: a is done, its file closed.
        sender.acked([(a, 10, False, False)])
        await _nothing_more(peer)
        assert list(sender.transfers) == [b.record_id]
        nursery.cancel_scope.cancel()


async def test_higher_priority_goes_first(core: NodeCore, tmp_path: Path) -> None:
    _doc(core, tmp_path, "low", 10, priority=0)
    _doc(core, tmp_path, "high", 10, priority=7)
    low, high = _docs(core)
    sender, out, peer = _session(core)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender.run, out)
        await _read(peer, 2)
        sender.acked([(low, 0, False, False), (high, 0, False, False)])
        got = await _read(peer, 4)
        assert got == [(high.record_id, 1), (high.record_id, 2), (low.record_id, 1), (low.record_id, 2)]
        nursery.cancel_scope.cancel()


@pytest.fixture
def clock() -> trio.testing.MockClock:
    """A fake clock that jumps once the loop has been idle for 50 ms of real
    time: the store thread's calls finish before it jumps (pytest-trio runs
    the test with the Clock a fixture gives)."""
    return trio.testing.MockClock(autojump_threshold=0.05)


async def test_silence_becomes_a_probe(core: NodeCore, tmp_path: Path, clock: trio.testing.MockClock) -> None:
    _doc(core, tmp_path, "a", 10)
    (a,) = _docs(core)
    sender, out, peer = _session(core)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender.run, out)
        await _read(peer, 1, 60)
        sender.acked([(a, 0, False, False)])
        assert await _read(peer, 2, 60) == [(a.record_id, 1), (a.record_id, 2)]
        t0 = trio.current_time()
        assert await _read(peer, 1, 60) == [(a.record_id, 0)]  # no answer: the first chunk it lacks, alone
        assert trio.current_time() - t0 >= STALL_S - 0.01
        t1 = trio.current_time()
        assert await _read(peer, 1, 60) == [(a.record_id, 0)]  # still none: asked again, later
        assert trio.current_time() - t1 >= 2 * STALL_S - 0.01
        nursery.cancel_scope.cancel()
