"""A partner with bad intent, against real processes on 127.0.0.1: an
enrolled organization sends its counterpart a genuine large document
(signed and sealed by its node as any) whose chunks it makes itself — zstd
bombs sealed under the manifest's key, so genuine to the receiver. The
receiver refuses them as bad chunks, inflating none past its size, and
stays up for everyone else. Every wait is bounded."""

from __future__ import annotations

import json
import struct

import pytest
import trio
import zstandard

from semq.testing import hostile
from semq.testing.hostile import Identity, process_usage
from semq.umxt_protocol import ChunkAck, Kind
from tests._procs import Cluster, wait_until
from tests.hostile.test_listeners import _still_delivers

pytestmark = pytest.mark.e2e

A, B, M = "10008", "56001", "66001"
MIB = 1 << 20


def _bad_chunks(c: Cluster) -> list[dict[str, object]]:
    out = []
    for p in sorted((c.root / B / "events").glob("*.jsonl")):
        for line in p.read_text().splitlines():
            e = json.loads(line)
            if e.get("event") == "bad_chunk":
                out.append(e)
    return out


def test_a_partners_zstd_bombs_cost_the_receiver_a_bad_chunk_each_not_its_life(cluster: Cluster) -> None:
    """Three bombs: a 19-byte chunk declaring 64 GiB (it ended the receiver
    with MemoryError, and again at every restart, as the platform kept it),
    one declaring 300 MiB, one declaring nothing that inflates to 300 MiB.
    Each is a bad chunk (the origin is asked to send it again from where
    the receiver is), the receiver's peak memory does not move by them, it
    never exits, and A's documents keep arriving."""
    for o in (A, B, M):
        cluster.add_org(o)
    cluster.start_platform()
    for o in (A, B, M):
        cluster.start_node(o)
    _still_delivers(cluster, 3)
    # M sends B a document first, so that M's node holds B's certificate
    # (and B M's); then M's operator stops it and speaks for it.
    from tests.e2e.test_e2e_flow import send

    send(cluster, M, B, 1)
    wait_until(lambda: any(k.startswith(M) for k in cluster.inbox(B)), 30, "M's first document at B")
    cluster.kill(M)
    forged = hostile.forge_large(cluster.root / M, B)
    pid = cluster.procs[B].p.pid
    before = process_usage(pid)
    bombs = [
        struct.pack("<IB", 0xFD2FB528, 0xE0) + struct.pack("<Q", 64 << 30) + b"\x01\x00\x00",
        zstandard.ZstdCompressor(level=1).compress(bytes(300 * MIB)),
        zstandard.ZstdCompressor(level=1, write_content_size=False).compress(bytes(300 * MIB)),
    ]

    async def attack() -> list[int]:
        fs, _ = await hostile.open_session("127.0.0.1", cluster.port, Identity.of(cluster.root / M), "platform")
        answers: list[int] = []

        async def read() -> None:
            while True:
                for raw in await fs.receive_batch():
                    if raw.kind is Kind.CHUNK_ACK:
                        body = raw.frame().body
                        assert isinstance(body, ChunkAck)
                        answers.append(int(body.code))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await fs.send(b"".join(forged.manifest_frames))
            with trio.fail_after(30):
                while not answers:  # B started the transfer: "send from 0"
                    await trio.sleep(0.05)
            for bomb in bombs:
                await fs.send(forged.chunk(0, bomb))
                await trio.sleep(1)
            with trio.move_on_after(20):
                while len(answers) < 1 + len(bombs):
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        await fs.aclose()
        return answers

    answers = trio.run(attack)
    assert cluster.procs[B].p.poll() is None, "the receiver exited:\n" + (cluster.root / f"{B}.log").read_text()[-3000:]
    wait_until(lambda: len(_bad_chunks(cluster)) >= len(bombs), 20, "a bad chunk per bomb in B's events")
    assert len(answers) >= 1 + len(bombs), answers  # each answered: go on from 0 (RESUME)
    after = process_usage(pid)
    grew = (after.peak - before.peak) / MIB
    assert grew < 80, f"the receiver's peak memory grew by {grew:.0f} MiB"
    _still_delivers(cluster, 5)
