"""Large documents: a manifest and its chunks under one LK0 (docs/large-documents.md).

A document larger than one frame should carry travels as a **manifest** — a
DATA frame with FLAG_LARGE whose AppData (signed and, with encryption,
sealed like any document's) is::

    u64 size · u32 chunk_size · u32 chunks · 32 bytes SHA-256 of the content
    · u8 compression (0 none, 1 zstd allowed) · u8 key_len · key (0 or 32 bytes)

— and ``chunks`` CHUNK frames. Each chunk is the content's bytes
``[i * chunk_size, (i + 1) * chunk_size)``, zstd-compressed when that saves
at least an eighth, and, with a key, sealed with AES-256-GCM under that key
(a random 12-byte nonce before the ciphertext). The associated data binds
the LK0, the index, the chunk count and the manifest's digest: a chunk
moved to another index or another document, or altered, does not open. The
key travels only inside the sealed manifest, so the relay can read no
chunk; the signature over the manifest covers the whole content through
its SHA-256, and the receipt over the manifest proves the whole.

This module is pure apart from the file helpers at the end (the origin's
copy of a document into its data directory, and hashing a file's prefix).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import zstandard
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from semq.identity.crypto import ensure_private_directory
from semq.settings.bounds import CHUNK_MAX_OUTPUT
from semq.umxt_protocol import CHUNK_COMPRESSED, LK0, ResultCode

__all__ = [
    "CHUNK_SIZE",
    "COMPRESS_NONE",
    "COMPRESS_ZSTD",
    "IO_BLOCK",
    "ChunkError",
    "ChunkOpener",
    "ChunkSealer",
    "Manifest",
    "copy_in",
    "hash_prefix",
    "move_in",
]

CHUNK_SIZE: Final = 1 << 20  # bytes of content per chunk (the last one may be shorter)
MIN_CHUNK: Final = 1 << 12
MAX_CHUNK: Final = CHUNK_MAX_OUTPUT  # a chunk's content, whatever it inflates from
COMPRESS_NONE: Final = 0
COMPRESS_ZSTD: Final = 1
KEY_SIZE: Final = 32
NONCE_SIZE: Final = 12
IO_BLOCK: Final = 1 << 20  # bytes per read and write when copying or hashing a file
_HEAD: Final = struct.Struct(">QII32sBB")
_AAD: Final = struct.Struct(">II")
_AAD_LABEL: Final = b"semq chunk v1\x00"
# zstd level 1: about 500 MB/s per core; higher levels cost CPU on every hop's
# sender for a few percent of size.
_ZSTD_LEVEL: Final = 1
# After this many chunks in a row that compression did not shrink by an
# eighth, the sealer stops trying (an archive, a PDF, an image) and tries
# again every _RETRY_EVERY chunks in case the content changes.
_GIVE_UP_AFTER: Final = 4
_RETRY_EVERY: Final = 64


class ChunkError(Exception):
    """A manifest or chunk that does not check: ``code`` for the peer."""

    def __init__(self, message: str, code: ResultCode = ResultCode.BAD_CHUNK) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Manifest:
    """What a large document's manifest says (its AppData)."""

    size: int
    chunk_size: int
    chunks: int
    sha256: bytes
    compression: int = COMPRESS_ZSTD
    key: bytes = b""
    digest: bytes = field(init=False, repr=False, compare=False)  # SHA-256 of the encoded manifest

    def __post_init__(self) -> None:
        if not 1 <= self.size < 1 << 63:
            raise ChunkError(f"manifest size {self.size} is outside 1..2^63-1 bytes", ResultCode.INVALID_FIELD)
        if not MIN_CHUNK <= self.chunk_size <= MAX_CHUNK:
            raise ChunkError(f"manifest chunk size {self.chunk_size} is outside {MIN_CHUNK}..{MAX_CHUNK} bytes",
                             ResultCode.INVALID_FIELD)
        want = -(-self.size // self.chunk_size)
        if self.chunks != want or want > 0xFFFF_FFFF:
            raise ChunkError(f"manifest names {self.chunks} chunks where {self.size} bytes in chunks of"
                             f" {self.chunk_size} make {want}", ResultCode.INVALID_FIELD)
        if len(self.sha256) != 32:
            raise ChunkError(f"manifest digest of {len(self.sha256)} bytes (32 expected)", ResultCode.INVALID_FIELD)
        if self.compression not in (COMPRESS_NONE, COMPRESS_ZSTD):
            raise ChunkError(f"manifest compression {self.compression} is unknown (0 none, 1 zstd)",
                             ResultCode.INVALID_FIELD)
        if len(self.key) not in (0, KEY_SIZE):
            raise ChunkError(f"manifest key of {len(self.key)} bytes (0 or {KEY_SIZE})", ResultCode.INVALID_FIELD)
        object.__setattr__(self, "digest", hashlib.sha256(self.encode()).digest())

    @classmethod
    def new(cls, size: int, sha256: bytes, *, encrypt: bool, chunk_size: int = CHUNK_SIZE) -> Manifest:
        """The manifest of new content, with a fresh random key when ``encrypt``."""
        return cls(size=size, chunk_size=chunk_size, chunks=-(-size // chunk_size), sha256=sha256,
                   key=secrets.token_bytes(KEY_SIZE) if encrypt else b"")

    def encode(self) -> bytes:
        return _HEAD.pack(self.size, self.chunk_size, self.chunks, self.sha256, self.compression,
                          len(self.key)) + self.key

    @classmethod
    def decode(cls, buf: bytes) -> Manifest:
        if len(buf) < _HEAD.size:
            raise ChunkError(f"manifest of {len(buf)} bytes is shorter than {_HEAD.size}", ResultCode.MALFORMED_FRAME)
        size, chunk_size, chunks, sha, compression, key_len = _HEAD.unpack_from(buf)
        if len(buf) != _HEAD.size + key_len:
            raise ChunkError(f"manifest of {len(buf)} bytes where its key length makes {_HEAD.size + key_len}",
                             ResultCode.MALFORMED_FRAME)
        return cls(size=size, chunk_size=chunk_size, chunks=chunks, sha256=sha, compression=compression,
                   key=bytes(buf[_HEAD.size:]))

    def chunk_len(self, index: int) -> int:
        """Bytes of content in chunk ``index``."""
        return min(self.chunk_size, self.size - index * self.chunk_size)


def _aad(lk0: LK0, m: Manifest, index: int) -> bytes:
    return b"".join((_AAD_LABEL, str(lk0).encode("ascii"), b"\x00", _AAD.pack(index, m.chunks), m.digest))


class ChunkSealer:
    """The origin's side of one document's chunks: ``seal(index, content)``
    gives the CHUNK flags and payload."""

    def __init__(self, lk0: LK0, manifest: Manifest) -> None:
        self.lk0 = lk0
        self.m = manifest
        self._aead = AESGCM(manifest.key) if manifest.key else None
        self._zstd = zstandard.ZstdCompressor(level=_ZSTD_LEVEL) if manifest.compression == COMPRESS_ZSTD else None
        self._misses = 0

    def seal(self, index: int, content: bytes) -> tuple[int, bytes]:
        flags = 0
        payload = content
        z = self._zstd
        if z is not None and (self._misses < _GIVE_UP_AFTER or index % _RETRY_EVERY == 0):
            packed = z.compress(content)
            if len(packed) <= len(content) - len(content) // 8:
                flags, payload = CHUNK_COMPRESSED, packed
                self._misses = 0
            else:
                self._misses += 1
        if self._aead is not None:
            nonce = secrets.token_bytes(NONCE_SIZE)  # (random: a chunk sent again is sealed anew)
            payload = nonce + self._aead.encrypt(nonce, payload, _aad(self.lk0, self.m, index))
        return flags, payload


class ChunkOpener:
    """The receiver's side: ``open(index, flags, payload)`` gives the
    chunk's content or raises ChunkError (BAD_CHUNK)."""

    def __init__(self, lk0: LK0, manifest: Manifest) -> None:
        self.lk0 = lk0
        self.m = manifest
        self._aead = AESGCM(manifest.key) if manifest.key else None
        self._zstd = zstandard.ZstdDecompressor()

    def open(self, index: int, flags: int, payload: bytes) -> bytes:
        m = self.m
        if not 0 <= index < m.chunks:
            raise ChunkError(f"chunk {index} of a document of {m.chunks} chunks")
        if self._aead is not None:
            if len(payload) < NONCE_SIZE + 16:
                raise ChunkError(f"chunk {index}: sealed payload of {len(payload)} bytes is too short")
            try:
                view = memoryview(payload)  # (no copy of the megabyte behind the nonce)
                payload = self._aead.decrypt(view[:NONCE_SIZE], view[NONCE_SIZE:], _aad(self.lk0, m, index))
            except InvalidTag:
                raise ChunkError(f"chunk {index} does not open: altered, moved from another index or"
                                 " from another document") from None
        want = m.chunk_len(index)
        if flags & CHUNK_COMPRESSED:
            if m.compression != COMPRESS_ZSTD:
                raise ChunkError(f"chunk {index} is compressed but the manifest allows no compression")
            payload = self._inflate(index, payload, want)
        if len(payload) != want:
            raise ChunkError(f"chunk {index} holds {len(payload)} bytes where the manifest makes {want}")
        return payload


    def _inflate(self, index: int, payload: bytes, want: int) -> bytes:
        """The chunk's content, never more than ``want`` bytes of memory
        (semq.settings.bounds.CHUNK_MAX_OUTPUT). python-zstandard's ``decompress``
        ignores ``max_output_size`` when the zstd frame declares its
        content size and allocates what it declares: a 17-byte frame
        declaring 64 GiB raised MemoryError and ended the daemon. So the
        declared size is read from the frame's header first, and a frame
        that declares more (or less) than the manifest's chunk is refused
        unread; one that declares nothing is inflated with ``want`` as the
        output cap, which then holds. Any failure is a bad chunk."""
        try:
            declared = zstandard.get_frame_parameters(payload).content_size
        except zstandard.ZstdError as e:
            raise ChunkError(f"chunk {index} is not a zstd frame: {e}") from None
        if declared != zstandard.CONTENTSIZE_UNKNOWN and declared != want:
            raise ChunkError(f"chunk {index} declares {declared} bytes of content where the manifest makes {want}"
                             f" (at most {CHUNK_MAX_OUTPUT} bytes inflated per chunk)")
        try:
            return self._zstd.decompress(payload, max_output_size=want)
        except (zstandard.ZstdError, MemoryError, ValueError) as e:
            raise ChunkError(f"chunk {index} does not decompress to at most {want} bytes: {e}") from None


# ---------------------------------------------------------------- files


def copy_in(src: Path, dest_dir: Path, progress: Callable[[int], None] | None = None) -> tuple[Path, int, bytes]:
    """Copy ``src`` into ``dest_dir`` (created 0700) as a new ``*.doc`` file
    (0600): written to a ``.part``, fsynced, renamed, the directory fsynced.
    Returns (path, size, SHA-256). ``progress(n)`` after each block of n
    bytes. Memory: one block, whatever the size."""
    ensure_private_directory(dest_dir)  # (every level made 0700: mkdir's parents would be 0755)
    name = secrets.token_hex(16)
    part = dest_dir / f"{name}.part"
    final = dest_dir / f"{name}.doc"
    h = hashlib.sha256()
    size = 0
    try:
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with open(src, "rb", buffering=0) as f:
                while True:
                    block = f.read(IO_BLOCK)
                    if not block:
                        break
                    h.update(block)
                    view = memoryview(block)
                    while view:
                        view = view[os.write(fd, view):]
                    size += len(block)
                    if progress is not None:
                        progress(len(block))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(part, final)
        sync_dir(dest_dir)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return final, size, h.digest()


def move_in(src: Path, dest_dir: Path) -> Path:
    """Take the file ``src`` (the caller gives it up: a user's upload staged
    by the node, semq.ops.uploads) into ``dest_dir`` (created 0700) as a new
    ``*.doc`` file without copying it: fsynced, renamed, both directories
    fsynced. Raises OSError (EXDEV when they are on different file systems:
    then ``copy_in`` it); ``src`` is left where it was on any error."""
    dest_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    final = dest_dir / f"{secrets.token_hex(16)}.doc"
    fd = os.open(src, os.O_RDONLY)
    try:
        os.fchmod(fd, 0o600)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(src, final)
    sync_dir(dest_dir)
    sync_dir(src.parent)
    return final


def sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def hash_prefix(fd: int, length: int) -> hashlib._Hash:
    """A SHA-256 object fed the first ``length`` bytes of the open file ``fd``."""
    h = hashlib.sha256()
    pos = 0
    while pos < length:
        block = os.pread(fd, min(IO_BLOCK, length - pos), pos)
        if not block:
            raise ChunkError(f"the file ends at {pos} bytes, before {length}", ResultCode.STORE_ERROR)
        h.update(block)
        pos += len(block)
    return h
