"""Chunks of large documents the platform keeps for an absent receiver,
kept by reference (semq.platform.chunks): appended to a file and synced
before the rows naming them commit (a failed sync keeps nothing and tells
the origin nothing), delivered from the file when the receiver comes, the
file gone with its last row; counted in the origin's quota; a file lost or
damaged costs its chunks (the receiver asks the origin again), nothing
else; the housekeeping removes files no row names; a backup carries them
and a restore puts them back."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from semq.ops.metrics import platform_snapshot
from semq.platform import chunks as chunk_files
from semq.platform.core import PlatformCore
from semq.umxt_protocol import LK0, Chunk, ChunkAck, Endpoint, Frame, Kind, ResultCode
from tests._frames import decoded, raws

A, B = "10008", "56001"
a, b = Endpoint.org(A), Endpoint.org(B)
OFFLINE: dict[Endpoint, int] = {}
DOC = LK0(endpoint=a, record_id=7)


def _chunk(i: int, size: int = 1000) -> Frame:
    return Frame(kind=Kind.CHUNK, source=a, target=b,
                 body=Chunk(lk0=DOC, index=i, flags=0, payload=bytes([i % 251]) * size))


@pytest.fixture
def core(tmp_path: Path) -> Any:
    c = PlatformCore(tmp_path / "platform.sqlite", create=True, synchronous="OFF")
    c.register([A, B])
    yield c
    c.close()


def _files(core: PlatformCore) -> list[Path]:
    d = core.path.parent / "chunks"  # type: ignore[union-attr]
    return sorted(d.glob("*.chunks")) if d.is_dir() else []


def _kept(out_sends: list[bytes]) -> list[int]:
    """The ``through`` of the platform's CHUNK_ACKs ("kept up to")."""
    return [f.frame().body.through for f in decoded(out_sends)  # type: ignore[union-attr]
            if f.kind is Kind.CHUNK_ACK]


def test_chunks_for_an_absent_receiver_are_kept_in_a_file_and_delivered_from_it(core: PlatformCore) -> None:
    out = core.handle(a, raws(*(_chunk(i) for i in range(3))), OFFLINE)
    assert _kept(out.sends[a]) == [1, 2, 3]
    rows = core.conn.execute("SELECT kind, length(frame), ref, ref_offset, ref_length, record_id FROM stored"
                             " ORDER BY id").fetchall()
    assert [r[0] for r in rows] == [int(Kind.CHUNK)] * 3
    assert all(r[1] == 0 for r in rows), "the rows hold no frame: the file does"
    (f,) = _files(core)
    assert {r[2] for r in rows} == {f.name} and f.name.startswith(f"{A}_")
    assert [r[3] for r in rows] == [0, rows[0][4], rows[0][4] + rows[1][4]]
    assert f.stat().st_size == sum(r[4] for r in rows) and rows[0][5] == 7
    assert oct(f.stat().st_mode & 0o777) == "0o600"
    assert core.counts()["chunks_kept"] == {"chunks": 3, "bytes": f.stat().st_size}
    msgs = platform_snapshot(core, 3600)["messages"]
    assert msgs[("chunks", "kept")] == 3 and msgs[("relayed", "waiting")] == 0

    frames, n_data = core.claim_stored(b, 10)
    got = decoded(frames)
    assert n_data == 0 and [g.kind for g in got] == [Kind.CHUNK] * 3
    assert [g.frame().body.index for g in got] == [0, 1, 2]  # type: ignore[union-attr]
    assert got[0].frame().body.payload == bytes([0]) * 1000  # type: ignore[union-attr]
    assert got[0].source == core.me, "relayed: the platform is the hop's source"
    assert got[0].origin == a
    assert _files(core) == [], "the file goes with its last row"
    assert core.conn.execute("SELECT count(*) FROM stored").fetchone() == (0,)

    # More chunks of the same document later: a new file, from offset 0.
    core.handle(a, raws(_chunk(3)), OFFLINE)
    assert core.conn.execute("SELECT ref_offset FROM stored").fetchall() == [(0,)]
    assert [g.frame().body.index for g in decoded(core.claim_stored(b, 10)[0])] == [3]  # type: ignore[union-attr]


def test_a_sync_that_fails_keeps_nothing_and_tells_the_origin_nothing(
        core: PlatformCore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Durable before acknowledged: the file is synced before the rows
    commit, and the origin hears "kept" only after the commit."""
    assert core.chunks is not None

    def fail() -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(core.chunks, "sync", fail)
    with pytest.raises(OSError):
        core.handle(a, raws(_chunk(0)), OFFLINE)
    assert core.conn.execute("SELECT count(*) FROM stored").fetchone() == (0,)
    monkeypatch.undo()
    out = core.handle(a, raws(_chunk(0)), OFFLINE)  # sent again: kept this time
    assert _kept(out.sends[a]) == [1]
    assert len(decoded(core.claim_stored(b, 10)[0])) == 1


def test_kept_chunks_count_in_the_origins_quota(tmp_path: Path) -> None:
    """An enrolled organization cannot fill the platform's disk with chunks
    for a receiver that never comes: past its quota they are not kept, and
    not acknowledged (its origin sends them again when the receiver asks)."""
    core = PlatformCore(tmp_path / "platform.sqlite", create=True, synchronous="OFF", quota_bytes=5000,
                        events_dir=tmp_path / "events")
    try:
        core.register([A, B])
        out = core.handle(a, raws(*(_chunk(i) for i in range(8))), OFFLINE)
        assert _kept(out.sends[a]) == [1, 2, 3, 4]
        assert core.conn.execute("SELECT count(*) FROM stored").fetchone() == (4,)
    finally:
        core.close()
    events = [json.loads(line) for f in sorted((tmp_path / "events").glob("*.jsonl"))
              for line in f.read_text().splitlines()]
    refused = [e for e in events if e["event"] == "refused"]
    assert [e["code"] for e in refused] == [int(ResultCode.QUOTA_EXCEEDED)] * 4
    assert "chunk 4 not kept: over the quota" in refused[0]["detail"]


def test_a_lost_or_damaged_file_costs_its_chunks_and_nothing_else(core: PlatformCore) -> None:
    other = LK0(endpoint=a, record_id=8)
    core.handle(a, raws(*(_chunk(i) for i in range(2)),
                        Frame(kind=Kind.CHUNK, source=a, target=b,
                              body=Chunk(lk0=other, index=0, flags=0, payload=b"x" * 500))), OFFLINE)
    f7, f8 = sorted(_files(core), key=lambda p: "_8_" in p.name)
    assert "_7_" in f7.name and "_8_" in f8.name
    f7.unlink()
    with open(f8, "r+b") as fh:  # a bit flipped on the disk
        fh.seek(40)
        byte = fh.read(1)
        fh.seek(40)
        fh.write(bytes([byte[0] ^ 0x01]))
    frames, _ = core.claim_stored(b, 10)
    assert frames == []
    assert core.conn.execute("SELECT count(*) FROM stored").fetchone() == (0,)
    # The store goes on: a document and a chunk after it are kept and delivered.
    core.handle(a, raws(_chunk(5)), OFFLINE)
    assert [g.kind for g in decoded(core.claim_stored(b, 10)[0])] == [Kind.CHUNK]


def test_the_housekeeping_removes_files_no_row_names(core: PlatformCore) -> None:
    core.handle(a, raws(_chunk(0)), OFFLINE)
    (kept,) = _files(core)
    orphan = kept.with_name(f"{A}_0_0_99_0123456789abcdef.chunks")
    orphan.write_bytes(b"left by a crash between the write and the commit")
    other = kept.with_name("notes.txt")
    other.write_text("not ours")
    young = core.housekeeping()
    assert orphan.exists(), "young: a batch may be about to commit it"
    old = os.stat(orphan).st_mtime - 2 * chunk_files.ORPHAN_AGE_S
    os.utime(orphan, (old, old))
    os.utime(kept, (old, old))
    assert core.housekeeping() == young + 1
    assert not orphan.exists() and kept.exists() and other.exists()


def test_a_backup_carries_the_kept_chunks_and_a_restore_delivers_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from semq.ops.backup import backup, restore
    from tests.cli.test_cli import run

    d = tmp_path / "platform"
    assert run(capsys, "platform", "init", "--dir", str(d), "--no-security")[0] == 0
    core = PlatformCore(d / "platform.sqlite")
    try:
        core.register([A, B])
        core.handle(a, raws(*(_chunk(i) for i in range(3))), OFFLINE)
    finally:
        core.close()
    archive = tmp_path / "p.tar.gz"
    info = backup(d, archive)
    names = [n for n in info.files if n.startswith("chunks/")]
    assert len(names) == 1
    with tarfile.open(archive) as tar:
        assert names[0] in tar.getnames()

    again = tmp_path / "restored"
    restore(archive, again)
    core = PlatformCore(again / "platform.sqlite")
    try:
        got = decoded(core.claim_stored(b, 10)[0])
        assert [g.frame().body.index for g in got] == [0, 1, 2]  # type: ignore[union-attr]
    finally:
        core.close()


def test_chunk_acks_name_the_document_and_codes_stay_ok(core: PlatformCore) -> None:
    out = core.handle(a, raws(_chunk(0)), OFFLINE)
    (ack,) = [f.frame().body for f in decoded(out.sends[a]) if f.kind is Kind.CHUNK_ACK]
    assert isinstance(ack, ChunkAck) and ack.lk0 == DOC and ack.code is ResultCode.OK


def test_an_organization_cannot_spend_the_platforms_files_on_tiny_documents(
        core: PlatformCore, monkeypatch: pytest.MonkeyPatch) -> None:
    """One file per kept document: past MAX_KEPT_FILES documents of one
    organization, the chunks of a new one are not kept (those of documents
    already kept still are), and another organization is not affected."""
    import semq.platform.routing as routing

    monkeypatch.setattr(routing, "MAX_KEPT_FILES", 3)
    c2 = Endpoint.org("56002")
    core.register(["56002"])

    def chunk_of(origin: Endpoint, record_id: int, index: int = 0) -> Frame:
        return Frame(kind=Kind.CHUNK, source=origin, target=b,
                     body=Chunk(lk0=LK0(endpoint=origin, record_id=record_id), index=index, flags=0, payload=b"x"))

    out = core.handle(a, raws(*(chunk_of(a, r) for r in range(1, 6))), OFFLINE)
    assert _kept(out.sends[a]) == [1, 1, 1]
    assert len(_files(core)) == 3
    out = core.handle(a, raws(chunk_of(a, 1, 1)), OFFLINE)  # more of a document kept already
    assert _kept(out.sends[a]) == [2]
    out = core.handle(c2, raws(chunk_of(c2, 1)), OFFLINE)
    assert _kept(out.sends[c2]) == [1]
