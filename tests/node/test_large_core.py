"""Large documents through two node cores (sans-IO: frames handed from one
core to the other as the platform would relay them): the manifest starts
a transfer, the receiver commits chunks before it says so, takes chunks
only in order and says where to go on from, delivers once with one ACK2,
refuses a content that does not match its manifest, and goes on after a
restart from what it committed."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from semq.node.core import NewDocument, NodeCore
from semq.node.daemon.large_sender import _Transfer
from semq.node.large.incoming import ALL_CHUNKS, RESUME
from semq.node.large.manifest import CHUNK_SIZE, Manifest, copy_in
from semq.node.large.outgoing import Outgoing
from semq.tracking.events import now_ms
from semq.umxt_protocol import (
    AckBatch,
    AckEntry,
    AckFlag,
    ChunkAck,
    Endpoint,
    ForwardFlag,
    Frame,
    FrameDecoder,
    Kind,
    Nack,
    RawFrame,
    ResultCode,
    encode_frame,
    relay_bytes,
)

A, B = "10008", "56001"
P = Endpoint.platform()


def _raws(data: list[bytes]) -> list[RawFrame]:
    dec = FrameDecoder()
    dec.receive_data(b"".join(data))
    return list(dec)


def _relay(data: list[bytes]) -> list[RawFrame]:
    """Frames as the platform hands them on (its source on the hop)."""
    return _raws([relay_bytes(r, P) for r in _raws(data)])


@pytest.fixture
def cores(tmp_path: Path) -> Any:
    (tmp_path / A).mkdir()
    (tmp_path / B).mkdir()
    a = NodeCore(tmp_path / A / "node.sqlite", A, create=True, synchronous="OFF")
    b = NodeCore(tmp_path / B / "node.sqlite", B, create=True, synchronous="OFF")
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _send(a: NodeCore, tmp_path: Path, content: bytes) -> tuple[Outgoing, list[bytes]]:
    """A large document accepted and claimed at ``a``: its Outgoing and its
    manifest's frames."""
    src = tmp_path / "content.bin"
    src.write_bytes(content)
    base = a.path.parent
    copy, size, sha = copy_in(src, base / "large" / "out")
    m = Manifest.new(size, sha, encrypt=False)
    a.accept([NewDocument(target=B, app_data=m.encode(), large_path=str(copy.relative_to(base)))])
    out = a.claim(10)
    assert len(out.data) == 1
    docs = a.large_out.pending()
    assert len(docs) == 1 and docs[0].manifest == m
    return docs[0], out.data


def _chunks(doc: Outgoing, indexes: list[int], me: Endpoint) -> list[bytes]:
    t = _Transfer(doc=doc)
    try:
        return [t.frame(me, i) for i in indexes]
    finally:
        t.close()


def _chunk_acks(data: list[bytes]) -> list[tuple[int, ResultCode]]:
    out = []
    for r in _raws(data):
        if r.kind is Kind.CHUNK_ACK:
            body = r.frame().body
            assert isinstance(body, ChunkAck)
            out.append((body.through, body.code))
    return out


def test_a_large_document_is_delivered_once_whole_with_one_ack2(cores: Any, tmp_path: Path) -> None:
    a, b = cores
    content = os.urandom(3 * CHUNK_SIZE) + b"tail" * 1000
    doc, manifest = _send(a, tmp_path, content)
    assert doc.manifest.chunks == 4

    out = b.handle(_relay(manifest))
    assert _chunk_acks(out.data) == [(0, ResultCode.OK)]  # "start from 0"
    assert b.conn.execute("SELECT count(*) FROM inbox").fetchone() == (0,)
    assert b.conn.execute("SELECT through FROM large_in").fetchall() == [(0,)]
    a.conn.execute("UPDATE outbox SET due_ms=1")  # (its inquiry due now)
    t0 = now_ms()
    got = a.handle(_relay(out.data))
    assert [(d.record_id, t, r, s) for d, t, r, s in got.chunk_acks] == [(doc.record_id, 0, False, False)]
    # The receiver at work: the manifest's inquiry (which would send it
    # again, one more attempt) waits an interval from its every answer.
    (due,) = a.conn.execute("SELECT due_ms FROM outbox").fetchone()
    assert due >= t0 + a.ctx.inquiry_ms

    out = b.handle(_relay(_chunks(doc, [0, 1, 2, 3], a.me)))
    assert out.errors == []
    assert _chunk_acks(out.data) == [(4, ResultCode.OK)]
    row = b.conn.execute("SELECT app_data, path, size FROM inbox").fetchall()
    assert len(row) == 1 and row[0][0] == b"" and row[0][2] == len(content)
    assert hashlib.sha256((b.path.parent / row[0][1]).read_bytes()).digest() == hashlib.sha256(content).digest()
    assert not Path(row[0][1]).is_absolute()  # (a restore into another directory keeps it)
    assert b.conn.execute("SELECT count(*) FROM large_in").fetchone() == (0,)
    acks2 = [r for r in _raws(out.data) if r.kind is Kind.ACK_BATCH]
    assert len(acks2) == 1

    # The ACK2 ends the row at the origin; the chunks a late copy brings
    # are answered "whole already".
    late_copy = _chunks(doc, [3], a.me)
    a.handle(_relay([r.raw for r in acks2]))
    assert a.conn.execute("SELECT count(*) FROM outbox WHERE state NOT IN (9)").fetchone() == (0,)
    assert not doc.path.exists(), "the origin's copy goes with the ACK2"
    assert a.conn.execute("SELECT count(*) FROM large_out").fetchone() == (0,)
    late = b.handle(_relay(late_copy))
    assert _chunk_acks(late.data) == [(ALL_CHUNKS, ResultCode.OK)]
    assert b.conn.execute("SELECT count(*) FROM inbox").fetchone() == (1,)

    # A manifest sent again after delivery is a duplicate: acknowledged, not a new transfer.
    again = b.handle(_relay(manifest))
    assert b.conn.execute("SELECT count(*) FROM large_in").fetchone() == (0,)
    assert b.conn.execute("SELECT count(*) FROM inbox").fetchone() == (1,)
    assert [r.kind for r in _raws(again.data)] == [Kind.ACK_BATCH]


def test_chunks_out_of_order_are_not_written_and_the_origin_is_told_where_to_go_on(
        cores: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import semq.node.large.incoming as large_in

    a, b = cores
    content = os.urandom(24 * CHUNK_SIZE + 5)
    doc, manifest = _send(a, tmp_path, content)
    b.handle(_relay(manifest))
    out = b.handle(_relay(_chunks(doc, [1, 2], a.me)))  # chunk 0 lost on the way
    assert _chunk_acks(out.data) == [(0, RESUME)]
    out = b.handle(_relay(_chunks(doc, [3], a.me)))  # (in flight behind it)
    assert _chunk_acks(out.data) == [], "the chunks in flight behind a gap are the same gap"
    # Long after, still: what the origin had in flight when it rewound (a
    # window: 16 chunks) may take long to drain on a slow link, and asking
    # again would rewind it again for nothing ...
    monkeypatch.setattr(large_in, "RESUME_AGAIN_MS", -1)
    window = large_in.WINDOW_BYTES // CHUNK_SIZE
    out = b.handle(_relay(_chunks(doc, list(range(4, 17)), a.me)))  # 2 + 13 = 15 past the gap
    assert _chunk_acks(out.data) == [] and window == 16
    out = b.handle(_relay(_chunks(doc, [1], a.me)))  # 16
    assert _chunk_acks(out.data) == []
    # ... but more than a window past it: the rewound copy was lost too.
    out = b.handle(_relay(_chunks(doc, [2], a.me)))  # 17
    assert _chunk_acks(out.data) == [(0, RESUME)]
    assert b.conn.execute("SELECT through FROM large_in").fetchall() == [(0,)]
    out = b.handle(_relay(_chunks(doc, list(range(25)), a.me)))
    assert _chunk_acks(out.data) == [(25, ResultCode.OK)]
    assert b.conn.execute("SELECT size FROM inbox").fetchall() == [(len(content),)]


def test_a_gap_near_the_end_is_asked_again_once_what_is_left_came_past_it(
        cores: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fewer chunks than a window are left after the gap: the origin cannot
    have had more than those in flight, so once more than those came past
    it, the rewound copy was lost too, and the receiver asks again (it does
    not wait for the origin's stall probe)."""
    import semq.node.large.incoming as large_in

    a, b = cores
    content = os.urandom(4 * CHUNK_SIZE + 5)  # chunks 0..4
    doc, manifest = _send(a, tmp_path, content)
    b.handle(_relay(manifest))
    monkeypatch.setattr(large_in, "RESUME_AGAIN_MS", -1)
    out = b.handle(_relay(_chunks(doc, [1, 2, 3, 4], a.me)))  # chunk 0 lost; the rest came
    assert _chunk_acks(out.data) == [(0, RESUME)]
    out = b.handle(_relay(_chunks(doc, [1], a.me)))  # 4 past it: what was left, no more
    assert _chunk_acks(out.data) == []
    out = b.handle(_relay(_chunks(doc, [2], a.me)))  # 5: from the rewind, whose chunk 0 was lost
    assert _chunk_acks(out.data) == [(0, RESUME)]
    out = b.handle(_relay(_chunks(doc, [0, 1, 2, 3, 4], a.me)))
    assert _chunk_acks(out.data) == [(5, ResultCode.OK)]
    assert b.conn.execute("SELECT size FROM inbox").fetchall() == [(len(content),)]


def test_content_that_does_not_match_its_manifest_is_refused_with_a_nack(cores: Any, tmp_path: Path) -> None:
    """Without a key (security off) a chunk altered on the way still opens;
    the whole digest catches it: the document is refused, its file goes."""
    a, b = cores
    doc, manifest = _send(a, tmp_path, os.urandom(CHUNK_SIZE + 10))
    b.handle(_relay(manifest))
    frames = _chunks(doc, [0, 1], a.me)
    raw = _raws([frames[1]])[0]
    body = raw.frame().body
    altered = encode_frame(dataclasses.replace(raw.frame(), body=dataclasses.replace(
        body, payload=bytes(b ^ 0xFF for b in body.payload))))  # type: ignore[union-attr]
    out = b.handle(_relay([frames[0], altered]))
    nacks = [r.frame().body for r in _raws(out.data) if r.kind is Kind.NACK]
    assert len(nacks) == 1 and isinstance(nacks[0], Nack) and nacks[0].code is ResultCode.DIGEST_MISMATCH
    assert b.conn.execute("SELECT count(*) FROM inbox").fetchone() == (0,)
    assert b.conn.execute("SELECT count(*) FROM large_in").fetchone() == (0,)
    assert not list((b.path.parent / "large" / "in").iterdir())
    a.handle(_relay(out.data))  # the origin fails it with the code
    assert a.conn.execute("SELECT code FROM outbox").fetchall() == [(int(ResultCode.DIGEST_MISMATCH),)]


def test_a_manifest_crossing_the_refusal_is_refused_again_not_started_again(
        cores: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The origin's manifest sent again (an inquiry) that crosses the NACK
    on the way gets the same refusal: no transfer its origin will never
    feed is left behind. Later (an operator requeues it), it starts again."""
    import semq.node.large.incoming as large_in

    a, b = cores
    doc, manifest = _send(a, tmp_path, os.urandom(CHUNK_SIZE + 10))
    b.handle(_relay(manifest))
    frames = _chunks(doc, [0], a.me)
    raw = _raws(frames)[0]
    body = raw.frame().body
    for _ in range(large_in.MAX_BAD_CHUNKS):
        altered = encode_frame(dataclasses.replace(raw.frame(), body=dataclasses.replace(
            body, flags=1)))  # "compressed", and it is not: it does not open  # type: ignore[union-attr]
        out = b.handle(_relay([altered]))
    codes = [r.frame().body.code for r in _raws(out.data) if r.kind is Kind.NACK]  # type: ignore[union-attr]
    assert codes == [ResultCode.BAD_CHUNK]
    assert b.conn.execute("SELECT count(*) FROM large_in").fetchone() == (0,)

    again = b.handle(_relay(manifest))
    nacks = [r.frame().body for r in _raws(again.data) if r.kind is Kind.NACK]
    assert [n.code for n in nacks] == [ResultCode.BAD_CHUNK]  # type: ignore[union-attr]
    assert b.conn.execute("SELECT count(*) FROM large_in").fetchone() == (0,)
    assert not list((b.path.parent / "large" / "in").iterdir())

    monkeypatch.setattr(large_in, "REFUSED_HOLD_MS", -1)
    later = b.handle(_relay(manifest))
    assert _chunk_acks(later.data) == [(0, ResultCode.OK)]
    assert b.conn.execute("SELECT count(*) FROM large_in").fetchone() == (1,)


def test_a_restarted_receiver_goes_on_from_what_it_committed(tmp_path: Path) -> None:
    (tmp_path / A).mkdir()
    (tmp_path / B).mkdir()
    a = NodeCore(tmp_path / A / "node.sqlite", A, create=True, synchronous="OFF")
    b = NodeCore(tmp_path / B / "node.sqlite", B, create=True, synchronous="OFF")
    try:
        content = os.urandom(6 * CHUNK_SIZE)
        doc, manifest = _send(a, tmp_path, content)
        b.handle(_relay(manifest))
        b.handle(_relay(_chunks(doc, [0, 1, 2, 3, 4], a.me)))  # a batch past ACK_EVERY: committed
        b.close()  # (a crash would lose no more: 0..4 were synced and committed)
        b = NodeCore(tmp_path / B / "node.sqlite", B, synchronous="OFF")
        assert b.receiver.large.resume_acks() and _chunk_acks(b.receiver.large.resume_acks()) == [(5, RESUME)]
        out = b.handle(_relay(_chunks(doc, [5], a.me)))
        assert _chunk_acks(out.data) == [(6, ResultCode.OK)]
        path = b.conn.execute("SELECT path FROM inbox").fetchone()[0]
        assert (b.path.parent / path).read_bytes() == content
    finally:
        a.close()
        b.close()


def test_a_manifest_over_the_receivers_limit_is_refused(cores: Any, tmp_path: Path) -> None:
    a, b = cores
    b.receiver.large.max_size = CHUNK_SIZE
    _, manifest = _send(a, tmp_path, os.urandom(CHUNK_SIZE + 1))
    out = b.handle(_relay(manifest))
    nacks = [r.frame().body for r in _raws(out.data) if r.kind is Kind.NACK]
    assert len(nacks) == 1 and nacks[0].code is ResultCode.TOO_LARGE  # type: ignore[union-attr]
    assert "exceeds this node's limit of 1048576 bytes" in nacks[0].message  # type: ignore[union-attr]
    assert b.conn.execute("SELECT count(*) FROM large_in").fetchone() == (0,)


def test_chunk_acks_from_an_organization_other_than_the_target_are_ignored(cores: Any, tmp_path: Path) -> None:
    a, _ = cores
    doc, _ = _send(a, tmp_path, os.urandom(CHUNK_SIZE + 1))
    c = NodeCore(tmp_path / "C.sqlite", "77001", create=True, synchronous="OFF")
    try:
        from semq.umxt_protocol import Frame, encode_frame
        forged = encode_frame(Frame(kind=Kind.CHUNK_ACK, source=c.me, target=a.me,
                                    body=ChunkAck(lk0=doc.lk0, through=ALL_CHUNKS)))
        assert a.handle(_relay([forged])).chunk_acks == []
    finally:
        c.close()


def test_a_full_disk_at_the_receiver_is_the_stores_error_and_loses_nothing(
        cores: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk that cannot be written (disk full) fails the batch as the
    store's error (the daemon keeps everything and tries again later, as
    for a full SQLite store), not as the network's; nothing of the batch is
    acknowledged, and the transfer goes on once there is room."""
    import errno

    import semq.node.large.incoming as large_in
    from semq.store.db import STORE_ERRORS

    a, b = cores
    content = os.urandom(2 * CHUNK_SIZE + 3)
    doc, manifest = _send(a, tmp_path, content)
    b.handle(_relay(manifest))

    def full(fd: int, data: Any, pos: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(large_in.os, "pwrite", full)
    with pytest.raises(STORE_ERRORS) as e:
        b.handle(_relay(_chunks(doc, [0, 1], a.me)))
    assert "No space left on device (disk full); nothing of this batch was acknowledged" in str(e.value)
    assert "\n" not in str(e.value) and str(b.path.parent / "large" / "in") in str(e.value)
    assert b.conn.execute("SELECT through FROM large_in").fetchall() == [(0,)]
    monkeypatch.undo()
    out = b.handle(_relay(_chunks(doc, [0, 1, 2], a.me)))
    assert _chunk_acks(out.data) == [(3, ResultCode.OK)]
    path = b.conn.execute("SELECT path FROM inbox").fetchone()[0]
    assert (b.path.parent / path).read_bytes() == content


def test_a_relay_that_forges_the_receivers_done_cannot_end_the_transfer(
        cores: Any, tmp_path: Path, node_clock: Any) -> None:
    """CHUNK_ACKs are not signed: a dishonest relay can forge the receiver's
    "whole already" and the origin stops sending chunks. It cannot make the
    document count as delivered (that takes the ACK2 with its receipt):
    an inquiry interval later the origin asks the receiver, sends the
    manifest again, hears the receiver's real progress and goes on."""
    a, b = cores
    content = os.urandom(2 * CHUNK_SIZE + 7)
    doc, manifest = _send(a, tmp_path, content)
    me, them = Endpoint.org(A), Endpoint.org(B)
    a.handle(_raws([encode_frame(Frame(kind=Kind.ACK_BATCH, source=P, target=me, origin=P, body=AckBatch(
        ack_kind=Kind.ACK_FWD, entries=(AckEntry(1, 1, 0, 1, 1, doc.record_id, int(AckFlag.PLATFORM),
                                                 int(ForwardFlag.FORWARDED)),))))]))
    b.handle(_relay(manifest))

    forged = encode_frame(Frame(kind=Kind.CHUNK_ACK, source=them, target=me,
                                body=ChunkAck(lk0=doc.lk0, through=ALL_CHUNKS)))
    got = a.handle(_relay([forged]))
    assert [t for _, t, _, _ in got.chunk_acks] == [ALL_CHUNKS]  # the sender stops: the relay's doing
    assert a.conn.execute("SELECT count(*) FROM outbox").fetchone() == (1,), "not delivered: no ACK2"

    node_clock.t += a.ctx.inquiry_ms + 1
    asked = a.inquiries().data
    assert [r.kind for r in _raws(asked)] == [Kind.INQUIRY]
    answer = b.handle(_relay(asked)).data
    a.handle(_relay(answer))
    again = a.claim(10).data
    assert len(again) == 1, "the manifest goes again"
    progress = b.handle(_relay(again))
    assert _chunk_acks(progress.data) == [(0, ResultCode.OK)]
    got = a.handle(_relay(progress.data))
    assert [(d.record_id, t) for d, t, _, _ in got.chunk_acks] == [(doc.record_id, 0)]  # the sender goes on
    out = b.handle(_relay(_chunks(doc, [0, 1, 2], a.me)))
    assert _chunk_acks(out.data) == [(3, ResultCode.OK)]
    path = b.conn.execute("SELECT path FROM inbox").fetchone()[0]
    assert (b.path.parent / path).read_bytes() == content


def _bomb_chunk(doc: Outgoing, me: Endpoint, index: int, payload: bytes) -> bytes:
    """Chunk ``index`` of ``doc`` with ``payload`` as its (compressed) content:
    a partner's own chunk, genuine to the receiver (security off here; with
    a key it would be sealed under the manifest's, which the partner has)."""
    from semq.umxt_protocol import CHUNK_COMPRESSED

    raw = _raws([_chunks(doc, [index], me)[0]])[0]
    body = raw.frame().body
    return encode_frame(dataclasses.replace(raw.frame(), body=dataclasses.replace(
        body, flags=CHUNK_COMPRESSED, payload=payload)))  # type: ignore[type-var]


@pytest.mark.parametrize("bomb", ["declares 64 GiB", "declares 300 MiB", "declares nothing"])
def test_a_zstd_bomb_is_a_bad_chunk_inflated_no_further_than_its_size(cores: Any, tmp_path: Path,
                                                                       bomb: str) -> None:
    """python-zstandard allocates what a zstd frame declares, whatever
    ``max_output_size`` says: a 17-byte chunk declaring 64 GiB ended the
    receiver with MemoryError (again after every restart, as the platform
    kept the chunk). Now a frame declaring more than the chunk's size is
    refused unread and one declaring nothing inflates to the size at most:
    a bad chunk, the origin asked to send it again, the receiver's peak
    memory not moved by the bomb."""
    import resource
    import struct

    import zstandard

    a, b = cores
    content = os.urandom(2 * CHUNK_SIZE)
    doc, manifest = _send(a, tmp_path, content)
    b.handle(_relay(manifest))
    if bomb == "declares 64 GiB":  # the frame header alone, then a last empty raw block
        payload = struct.pack("<IB", 0xFD2FB528, 0xE0) + struct.pack("<Q", 64 << 30) + b"\x01\x00\x00"
    elif bomb == "declares 300 MiB":
        payload = zstandard.ZstdCompressor(level=1).compress(bytes(300 << 20))
    else:
        payload = zstandard.ZstdCompressor(level=1, write_content_size=False).compress(bytes(300 << 20))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = b.handle(_relay([_bomb_chunk(doc, a.me, 0, payload)]))
    grew_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
    assert grew_mib < 64, f"the receiver's peak grew by {grew_mib:.0f} MiB"
    assert [code for code, _ in out.errors] == [ResultCode.BAD_CHUNK]
    assert _chunk_acks(out.data) == [(0, ResultCode.UNEXPECTED_FRAME)]  # RESUME: send it again from 0
    # The genuine chunks still complete the document.
    out = b.handle(_relay(_chunks(doc, [0, 1], a.me)))
    assert out.errors == [] and b.conn.execute("SELECT size FROM inbox").fetchall() == [(len(content),)]


def test_a_frame_that_cannot_be_handled_is_refused_alone_and_the_rest_of_its_batch_goes_on(
        cores: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No frame's bytes can end the daemon: a document whose handling raises
    what it should not (here MemoryError, as a decompression bomb did) is
    refused with a NACK (INTERNAL_ERROR) and its stored copy settled at the
    platform, while the documents before and after it in the same batch are
    delivered."""
    from semq.node.receiver.role import Receiver

    a, b = cores
    a.accept([NewDocument(target=B, app_data=f"doc {i}".encode()) for i in range(5)])
    frames = a.claim(10).data
    real = Receiver._receive

    def poisoned(self: Receiver, bt: Any, frame: Any, d: Any, body: bytes, *args: Any, **kw: Any) -> None:
        if body == b"doc 2":
            raise MemoryError("a bomb")
        real(self, bt, frame, d, body, *args, **kw)

    monkeypatch.setattr(Receiver, "_receive", poisoned)
    out = b.handle(_relay(frames))
    assert sorted(r[0] for r in b.conn.execute("SELECT app_data FROM inbox")) == [
        b"doc 0", b"doc 1", b"doc 3", b"doc 4"]
    nacks = [r.frame().body for r in _raws(out.data) if r.kind is Kind.NACK]
    assert len(nacks) == 1 and isinstance(nacks[0], Nack) and nacks[0].code is ResultCode.INTERNAL_ERROR
    assert "MemoryError: a bomb" in nacks[0].message
    assert [code for code, _ in out.errors] == [ResultCode.INTERNAL_ERROR]
    a.handle(_relay(out.data))  # the origin fails that one with the code; the others wait for their ACK2
    assert a.conn.execute("SELECT count(*) FROM outbox WHERE code=?",
                          (int(ResultCode.INTERNAL_ERROR),)).fetchone() == (1,)
