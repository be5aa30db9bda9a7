"""Chunks of large documents the platform keeps for an absent receiver,
kept by reference (docs/large-documents.md).

A CHUNK frame stored for a target that is away is appended to one file per
document and route in ``chunks/`` beside the SQLite store; its ``stored``
row names the file, the offset and the length, and holds no frame. The
files are synced before the batch that wrote them commits (the commit is
what lets the platform tell the origin "kept"), written once (SQLite would
write a BLOB twice: its WAL, then the database), and read back when the
target comes. A file goes when its last row is delivered, or in the
housekeeping when no row names it.

On a PostgreSQL store, which several instances share, chunks stay rows of
the shared store: a file on one instance's disk is invisible to the others.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from semq.identity.crypto import ensure_private_directory
from semq.umxt_protocol import LK0, Endpoint, FrameDecoder, Kind, RawFrame

__all__ = ["CHUNK_DIR", "MAX_KEPT_FILES", "ChunkFiles", "chunk_file_name"]

log = logging.getLogger(__name__)

CHUNK_DIR: Final = "chunks"  # beside the store (backups carry it)
CHUNK_FILE: Final = re.compile(r"[A-Za-z0-9._-]+\.chunks")
_OPEN_FILES: Final = 32  # files kept open for appending; others reopen
# A file no row names is removed by the housekeeping once it is this old (a
# batch appending to it may not have committed yet).
ORPHAN_AGE_S: Final = 600.0
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9.-]")
# Documents of one organization with chunks kept here at once (a file
# each): past it, its chunks for absent receivers are not kept (as past its
# quota), so that tiny "documents" cannot use up the platform's inodes.
MAX_KEPT_FILES: Final = 4096


def chunk_file_name(lk0: LK0, target: Endpoint) -> str:
    """The file of a document's chunks kept for one route: readable to an
    operator (the LK0) and unique (a digest of the LK0 and the route, which
    may hold characters a file name should not)."""
    e = lk0.endpoint
    key = f"{int(e.node_type)}/{e.node_id}/{lk0.semq_id}/{lk0.semq_db_id}/{lk0.record_id}>{int(target.node_type)}/{target.node_id}"
    tag = hashlib.blake2b(key.encode(), digest_size=8).hexdigest()
    return f"{_UNSAFE.sub('_', e.node_id)}_{lk0.semq_id}_{lk0.semq_db_id}_{lk0.record_id}_{tag}.chunks"


class ChunkFiles:
    """The platform's kept chunks on disk (one store thread uses it)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._fds: OrderedDict[str, int] = OrderedDict()  # name -> fd open for appending
        self._sizes: dict[str, int] = {}
        self._dirty: set[str] = set()
        self._new = False

    def has(self, name: str) -> bool:
        """Whether the file ``name`` exists (open here, or on disk)."""
        return name in self._fds or (self.dir / name).exists()

    def append(self, name: str, data: bytes) -> int:
        """Append ``data`` (one frame) to ``name``; its offset. Durable
        only after sync()."""
        fd = self._fds.get(name)
        if fd is None:
            if not self._new and not self.dir.is_dir():
                ensure_private_directory(self.dir)  # (0700 whatever the umask, parents too)
            existed = (self.dir / name).exists()
            fd = os.open(self.dir / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._new |= not existed
            self._fds[name] = fd
            self._sizes[name] = os.fstat(fd).st_size
            while len(self._fds) > _OPEN_FILES:
                old, old_fd = self._fds.popitem(last=False)
                if old in self._dirty:
                    os.fdatasync(old_fd)
                    self._dirty.discard(old)
                os.close(old_fd)
                self._sizes.pop(old, None)
        else:
            self._fds.move_to_end(name)
        offset = self._sizes[name]
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        self._sizes[name] = offset + len(data)
        self._dirty.add(name)
        return offset

    def sync(self) -> None:
        """Everything appended since the last sync on disk, and the new
        files' names with it: before the commit of the rows naming them."""
        for name in self._dirty:
            os.fdatasync(self._fds[name])
        self._dirty.clear()
        if self._new:
            fd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._new = False

    def read(self, name: str, offset: int, length: int) -> RawFrame | None:
        """The kept CHUNK frame, checked (its CRC), or None with a log line
        when the file is gone or does not hold it (a restore that lost it,
        a disk's error): its receiver asks its origin for it again."""
        if not CHUNK_FILE.fullmatch(name):
            log.error("a stored row names %r, which is not a chunk file: not delivered", name)
            return None
        try:
            fd = os.open(self.dir / name, os.O_RDONLY)
        except FileNotFoundError:
            log.error("kept chunk file %s is missing: its chunk is not delivered (the receiver asks again)",
                      self.dir / name)
            return None
        try:
            data = os.pread(fd, length, offset)
        finally:
            os.close(fd)
        dec = FrameDecoder()
        try:
            dec.receive_data(data)
            raws = list(dec)
        except Exception as e:  # a damaged frame: its CRC or its header
            log.error("kept chunk in %s at %d does not decode (%s): not delivered", self.dir / name, offset, e)
            return None
        if len(data) != length or len(raws) != 1 or raws[0].kind is not Kind.CHUNK:
            log.error("kept chunk in %s at %d is incomplete: not delivered", self.dir / name, offset)
            return None
        return raws[0]

    def drop(self, names: Iterable[str]) -> None:
        """Files no row names any more: removed (after the commit that
        deleted their last rows)."""
        for name in names:
            fd = self._fds.pop(name, None)
            if fd is not None:
                os.close(fd)
            self._sizes.pop(name, None)
            self._dirty.discard(name)
            (self.dir / name).unlink(missing_ok=True)

    def sweep(self, referenced: set[str], older_than_s: float = ORPHAN_AGE_S) -> int:
        """Files no row names and older than ``older_than_s`` (a purge, an
        expiry, a crash between a write and its commit): removed. How many."""
        if not self.dir.is_dir():
            return 0
        cutoff = time.time() - older_than_s
        gone = [p.name for p in self.dir.iterdir()
                if CHUNK_FILE.fullmatch(p.name) and p.name not in referenced and p.stat().st_mtime < cutoff]
        self.drop(gone)
        return len(gone)

    def usage(self) -> tuple[int, int]:
        """(files, bytes) on disk."""
        if not self.dir.is_dir():
            return 0, 0
        sizes = [p.stat().st_size for p in self.dir.iterdir() if CHUNK_FILE.fullmatch(p.name)]
        return len(sizes), sum(sizes)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._sizes.clear()
        self._dirty.clear()
