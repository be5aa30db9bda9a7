"""A backup archive's headers, read before a byte of it is extracted.

``semq restore`` takes a tar archive (gzip-, bzip2- or xz-compressed, or
not) that may come from anywhere. Before it writes anything it walks the
archive once (``scan``): each member's 512-byte header, whose size field
says how many bytes the member will write, is checked against the limits
*before* its data is read past, so a member that declares a terabyte is
refused at its header, and a gzip bomb is refused once the sizes declared
so far exceed what the archive may write (``BACKUP_MAX_MEMBER_RATIO``
times its own size, and the free space), not after it has been inflated.

The walk follows tarfile's reading of the format (ustar and GNU base-256
sizes, a pax ``x`` header's ``size`` for the next member), so the sizes it
checks are the ones tarfile then extracts; what a semq backup never holds
and that would let a member write more than its header says is refused:
sparse members and pax ``GNU.sparse.*`` records (their real size is
elsewhere), global pax headers (tarfile applies their ``size`` to every
later member without reading past it). A pax or GNU long-name header is
read into memory whole by tarfile: at most ``BACKUP_MAX_META`` bytes.

The decompressed stream itself is bounded too (``bounded_stream``): the
headers, padding and end blocks of an archive of many small members are
bytes a decompressor produces that no size field declares.

Pure of SEMQ: it raises ``ArchiveError`` (one line naming the value and
the limit), which semq.ops.backup turns into a BackupError.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final, cast

__all__ = ["ArchiveError", "ArchiveTooLarge", "Scan", "bounded_stream", "scan"]

BLOCK: Final = 512
_ZERO: Final = bytes(BLOCK)
_SKIP: Final = 1 << 20  # bytes read at a time while a member's data is passed over
_NO_DATA: Final = (b"1", b"2", b"3", b"4", b"5", b"6")  # links, devices, directories, FIFOs: no data follows
_META: Final = {b"x": "pax", b"X": "pax", b"L": "GNU long-name", b"K": "GNU long-link"}
_RECORD: Final = re.compile(rb"(\d+) ")


class ArchiveError(Exception):
    """The archive is refused: not a tar archive, or not one semq writes."""


class ArchiveTooLarge(ArchiveError):
    """The decompressed stream went past its cap (the message is the caller's)."""


@dataclass(frozen=True)
class Scan:
    """What an archive holds: its members, the bytes they write, and the
    bytes of the decompressed stream up to its end blocks."""

    members: int
    file_bytes: int
    stream_bytes: int


class _Bounded(io.RawIOBase):
    """``raw`` (a decompressing reader), refused past ``cap`` bytes out."""

    def __init__(self, raw: io.BufferedIOBase, cap: int, refuse: Callable[[int], str]) -> None:
        super().__init__()
        self.raw = raw
        self.cap = cap
        self.refuse = refuse
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        try:
            data = self.raw.read(len(b))
        except (OSError, EOFError, lzma.LZMAError) as e:  # (gzip's BadGzipFile is an OSError)
            raise ArchiveError(f"its compressed stream is damaged: {e}") from e
        n = len(data)
        self.count += n
        if self.count > self.cap:
            raise ArchiveTooLarge(self.refuse(self.count))
        b[:n] = data
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


def bounded_stream(path: Path, cap: int, refuse: Callable[[int], str]) -> BinaryIO:
    """``path`` decompressed (gzip, bzip2 or xz, by its first bytes; else
    as it is), raising ArchiveTooLarge with ``refuse(n)`` once more than
    ``cap`` bytes came out of it, ArchiveError when it cannot be
    decompressed."""
    with open(path, "rb") as f:
        magic = f.read(6)
    raw: io.BufferedIOBase
    if magic[:2] == b"\x1f\x8b":
        raw = gzip.open(path, "rb")
    elif magic[:3] == b"BZh":
        raw = bz2.open(path, "rb")
    elif magic == b"\xfd7zXZ\x00":
        raw = lzma.open(path, "rb")
    else:
        raw = open(path, "rb")  # (closed with the reader)
    # Unbuffered on purpose: the count is what the reader took, so a walk
    # that refuses at a header has inflated no more than up to it.
    return cast(BinaryIO, _Bounded(raw, cap, refuse))


def _read(stream: BinaryIO, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = stream.read(n - len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def _number(field: bytes, at: int) -> int:
    """A header's numeric field: octal text, or GNU base-256 (first byte 0x80)."""
    if field[0] == 0x80:
        return int.from_bytes(field[1:], "big")
    if field[0] & 0x80:
        raise ArchiveError(f"the header at byte {at} has a negative size; not a tar archive")
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text or b"0", 8)
    except ValueError:
        raise ArchiveError(f"the header at byte {at} has no number where its size belongs; not a tar"
                           " archive") from None


def _checked(header: bytes, at: int) -> None:
    """tarfile's test that a block is a header: its checksum (the sum of its
    bytes with the checksum field as spaces, unsigned or signed)."""
    try:
        want = _number(header[148:156], at)
    except ArchiveError:
        raise ArchiveError(f"the block at byte {at} is not a tar header (no checksum); not a tar archive") from None
    blank = header[:148] + b" " * 8 + header[156:]
    if want not in (sum(blank), sum(b - 256 if b > 127 else b for b in blank)):
        raise ArchiveError(f"the block at byte {at} is not a tar header (bad checksum); not a tar archive")


def _pax_size(data: bytes, at: int) -> int | None:
    """The ``size`` record of a pax header (None without one)."""
    size = None
    pos = 0
    while pos < len(data) and data[pos:] != b"\0" * (len(data) - pos):
        m = _RECORD.match(data, pos)
        length = int(m.group(1)) if m else 0
        if not m or length <= len(m.group(0)) or pos + length > len(data):
            raise ArchiveError(f"the pax header at byte {at} is malformed; not a semq backup")
        key, _, value = data[m.end():pos + length - 1].partition(b"=")
        if key.startswith(b"GNU.sparse."):
            raise ArchiveError(f"the pax header at byte {at} describes a sparse file; not a semq backup")
        if key == b"size":
            try:
                size = int(value)
            except ValueError:
                raise ArchiveError(f"the pax header at byte {at} has size={value!r}; not a tar archive") from None
            if size < 0:
                raise ArchiveError(f"the pax header at byte {at} has size={size}; not a tar archive")
        pos += length
    return size


def _block(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


def scan(stream: BinaryIO, *, max_meta: int, check: Callable[[int], None]) -> Scan:
    """Walk the tar ``stream`` to its end blocks, passing over every
    member's data unread. ``check(total)`` is called at each member's
    header with the bytes the members so far (this one included) would
    write, before its data is passed over: it raises to refuse. Raises
    ArchiveError for a pax or long-name header over ``max_meta`` bytes, a
    member type a semq backup never holds, and anything that is not a tar
    archive (no header, a bad checksum, a truncated stream)."""
    at = 0
    members = 0
    total = 0
    pending: int | None = None  # the size a pax header gives the next member
    while True:
        header = _read(stream, BLOCK)
        if len(header) < BLOCK:
            raise ArchiveError("it ends before its end blocks (truncated)" if at else "it is empty")
        if header == _ZERO:
            return Scan(members=members, file_bytes=total, stream_bytes=at + BLOCK)
        _checked(header, at)
        kind = header[156:157]
        size = _number(header[124:136], at)
        at += BLOCK
        if kind in _META:
            if size > max_meta:
                raise ArchiveError(f"a {_META[kind]} header of {size} bytes (at byte {at - BLOCK}) exceeds the"
                                   f" {max_meta}-byte limit; not a semq backup")
            data = _read(stream, _block(size))
            if len(data) < _block(size):
                raise ArchiveError("it ends inside a header (truncated)")
            if kind in (b"x", b"X"):
                pending = _pax_size(data[:size], at - BLOCK)
            at += len(data)
            continue
        if kind == b"g":
            raise ArchiveError(f"it has a global pax header (at byte {at - BLOCK}); not a semq backup")
        if kind == b"S":
            raise ArchiveError(f"it has a sparse member (at byte {at - BLOCK}); not a semq backup")
        if pending is not None:
            size, pending = pending, None
        members += 1
        if kind in _NO_DATA:
            continue
        total += size  # (a regular file, or a type tarfile reads as one)
        check(total)
        left = _block(size)
        while left:
            n = len(stream.read(min(left, _SKIP)))
            if not n:
                raise ArchiveError(f"it ends inside a member's data (truncated at byte {at})")
            left -= n
            at += n
