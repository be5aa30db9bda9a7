"""Large documents, the pure part (semq.node.large): the manifest's layout
and rules, chunk sealing, and what a chunk that was altered, moved or taken
from another document does (it does not open)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semq.node.large.manifest import (
    CHUNK_SIZE,
    COMPRESS_NONE,
    ChunkError,
    ChunkOpener,
    ChunkSealer,
    Manifest,
    copy_in,
    hash_prefix,
)
from semq.umxt_protocol import CHUNK_COMPRESSED, LK0, Endpoint, ResultCode

A = LK0(endpoint=Endpoint.org("A"), semq_id=1, record_id=7)
B = LK0(endpoint=Endpoint.org("A"), semq_id=1, record_id=8)


def _manifest(content: bytes, *, encrypt: bool = True, chunk_size: int = 1 << 12) -> Manifest:
    return Manifest.new(len(content), hashlib.sha256(content).digest(), encrypt=encrypt, chunk_size=chunk_size)


def _chunks(m: Manifest, content: bytes) -> list[bytes]:
    return [content[i * m.chunk_size:(i + 1) * m.chunk_size] for i in range(m.chunks)]


@given(size=st.integers(1, 1 << 40), chunk_kib=st.sampled_from([4, 64, 1024, 16384]),
       encrypt=st.booleans())
def test_manifest_round_trip(size: int, chunk_kib: int, encrypt: bool) -> None:
    m = Manifest.new(size, bytes(32), encrypt=encrypt, chunk_size=chunk_kib << 10)
    back = Manifest.decode(m.encode())
    assert back == m and back.digest == m.digest
    assert m.chunk_len(0) == min(size, m.chunk_size)
    assert (m.chunks - 1) * m.chunk_size + m.chunk_len(m.chunks - 1) == size
    assert 0 < m.chunk_len(m.chunks - 1) <= m.chunk_size


@pytest.mark.parametrize(("change", "words"), [
    (lambda b: b[:-1], "key length"),
    (lambda b: b[:10], "shorter than"),
    (lambda b: b[:8] + (99).to_bytes(4, "big") + b[12:], "chunk size 99"),
    (lambda b: b[:12] + (5).to_bytes(4, "big") + b[16:], "names 5 chunks"),
    (lambda b: b[:48] + b"\x07" + b[49:], "compression 7"),
])
def test_a_bad_manifest_is_refused_naming_the_value(change: object, words: str) -> None:
    good = Manifest.new(3 << 20, bytes(32), encrypt=True).encode()
    with pytest.raises(ChunkError, match=words):
        Manifest.decode(change(good))  # type: ignore[operator]


@pytest.mark.parametrize("encrypt", [True, False])
def test_chunks_open_to_the_content(encrypt: bool) -> None:
    content = os.urandom(5000) + b"a" * 9000  # one chunk that compresses, some that do not
    m = _manifest(content, encrypt=encrypt)
    seal, opener = ChunkSealer(A, m), ChunkOpener(A, m)
    sealed = [seal.seal(i, c) for i, c in enumerate(_chunks(m, content))]
    assert any(f & CHUNK_COMPRESSED for f, _ in sealed) and not all(f & CHUNK_COMPRESSED for f, _ in sealed)
    assert b"".join(opener.open(i, f, p) for i, (f, p) in enumerate(sealed)) == content
    if encrypt:
        assert all(b"a" * 64 not in p for _, p in sealed)  # the relay reads nothing


def test_an_altered_moved_or_foreign_chunk_does_not_open() -> None:
    content = os.urandom(3 * 4096)
    m = _manifest(content)
    other = _manifest(os.urandom(3 * 4096))
    seal = ChunkSealer(A, m)
    sealed = [seal.seal(i, c) for i, c in enumerate(_chunks(m, content))]
    opener = ChunkOpener(A, m)
    flags, payload = sealed[1]
    altered = payload[:40] + bytes([payload[40] ^ 1]) + payload[41:]
    with pytest.raises(ChunkError, match="does not open") as e:
        opener.open(1, flags, altered)
    assert e.value.code is ResultCode.BAD_CHUNK
    with pytest.raises(ChunkError, match="does not open"):
        opener.open(2, flags, payload)  # moved to another index
    with pytest.raises(ChunkError, match="does not open"):
        ChunkOpener(B, m).open(1, flags, payload)  # spliced into another document (same key even)
    with pytest.raises(ChunkError, match="does not open"):
        ChunkOpener(A, other).open(1, flags, payload)
    with pytest.raises(ChunkError, match="chunk 3 of a document of 3"):
        opener.open(3, flags, payload)  # past the end


def test_without_a_key_a_chunk_of_the_wrong_length_is_refused() -> None:
    content = b"x" * 10_000
    m = _manifest(content, encrypt=False)
    with pytest.raises(ChunkError, match="holds 4095 bytes where the manifest makes 4096"):
        ChunkOpener(A, m).open(0, 0, content[:4095])
    with pytest.raises(ChunkError, match="holds 100 bytes where the manifest makes 1808"):
        ChunkOpener(A, m).open(2, 0, content[:100])


def test_a_compression_bomb_stops_at_the_chunk_size() -> None:
    import zstandard

    m = _manifest(b"z" * 4096, encrypt=False)
    bomb = zstandard.ZstdCompressor().compress(b"\x00" * (64 << 20))
    with pytest.raises(ChunkError):
        ChunkOpener(A, m).open(0, CHUNK_COMPRESSED, bomb)
    plain = Manifest(size=4096, chunk_size=4096, chunks=1, sha256=bytes(32), compression=COMPRESS_NONE)
    with pytest.raises(ChunkError, match="allows no compression"):
        ChunkOpener(A, plain).open(0, CHUNK_COMPRESSED, zstandard.ZstdCompressor().compress(b"z" * 4096))


@settings(max_examples=20)
@given(content=st.binary(min_size=1, max_size=20_000))
def test_any_content_round_trips(content: bytes) -> None:
    m = _manifest(content)
    seal, opener = ChunkSealer(A, m), ChunkOpener(A, m)
    got = b"".join(opener.open(i, *seal.seal(i, c)) for i, c in enumerate(_chunks(m, content)))
    assert got == content


def test_copy_in_writes_a_private_synced_copy_and_its_digest(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    data = os.urandom(3 * CHUNK_SIZE + 17)
    src.write_bytes(data)
    seen: list[int] = []
    path, size, sha = copy_in(src, tmp_path / "large" / "out", seen.append)
    assert path.read_bytes() == data and size == len(data) == sum(seen)
    assert sha == hashlib.sha256(data).digest()
    assert path.stat().st_mode & 0o777 == 0o600 and path.suffix == ".doc"
    assert not list(path.parent.glob("*.part"))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert hash_prefix(fd, CHUNK_SIZE).digest() == hashlib.sha256(data[:CHUNK_SIZE]).digest()
        with pytest.raises(ChunkError, match="ends at"):
            hash_prefix(fd, len(data) + 1)
    finally:
        os.close(fd)


def test_copy_in_leaves_nothing_when_the_source_fails(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        copy_in(tmp_path / "missing", tmp_path / "out")
    assert not list((tmp_path / "out").iterdir())


def test_the_large_flag_is_bound_by_the_documents_signature() -> None:
    """A relay that clears FLAG_LARGE (to have the manifest delivered as a
    document of its own) or sets it changes the AAD the manifest was signed
    and sealed over: the receiver refuses it."""
    from semq.identity.crypto import BOUND_FLAGS, raw_frame_aad
    from semq.umxt_protocol import FLAG_LARGE, FrameDecoder, encode_data, rewrite_header

    def decoded(b: bytes) -> list[object]:
        dec = FrameDecoder()
        dec.receive_data(b)
        return list(dec)

    assert BOUND_FLAGS & FLAG_LARGE
    frame = encode_data(source=Endpoint.org("A"), target=Endpoint.org("B"), record_id=7,
                        app_data=Manifest.new(5, bytes(32), encrypt=False).encode(), large=True)
    (raw,) = decoded(frame)
    (stripped,) = decoded(rewrite_header(frame, flags=raw.flags & ~FLAG_LARGE))  # type: ignore[attr-defined]
    assert raw.flags & FLAG_LARGE and not stripped.flags & FLAG_LARGE  # type: ignore[attr-defined]
    assert raw_frame_aad(raw) != raw_frame_aad(stripped)  # type: ignore[arg-type]
