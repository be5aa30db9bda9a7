"""Documents a user's application sends over the user socket in blocks
(semq.ops.usersock: ``upload_begin``, ``upload_block``, ``upload_send``).

A request line of the user socket carries at most one block
(``USER_BLOCK_BYTES``, 1 MiB) of a document: a larger one is staged here,
block after block, then handed whole to the large-document path
(``NodeClient.send_file(..., move=True)``: renamed into ``large/out/``, not
copied). What this module guarantees:

- **Private.** The staging directory (``uploads/`` in the node's data
  directory) is 0700, each staged file 0600; an upload's id is random, and
  an upload answers only to the user who began it (another user's id is
  "no upload", like one that does not exist).
- **In order, adding up.** Blocks come in order (a block's offset is what
  is staged so far, else it is refused naming both), never past the size
  declared at ``begin``; ``finish`` refuses an upload whose blocks do not
  add up to it, naming the offset of the next block, and one whose SHA-256
  is not the one the client computed (that one is removed: the bytes are
  wrong).
- **Bounded** (semq.settings.bounds): ``USER_UPLOADS_PER_USER`` uploads of one user
  at once; each at most the node's ``max_document_mib``; begun only when
  the file system keeps ``USER_UPLOAD_KEEP_FREE`` bytes free after every
  open upload is complete; an upload that gets no block for
  ``USER_UPLOAD_IDLE_S`` seconds is stale and removed with its file
  (``sweep``, run by the user socket every minute and at each ``begin``).
  Uploads do not survive a restart: ``reset`` empties the directory when
  the user socket starts.

Synchronous file work with an injected clock; the user socket calls it
from a worker thread. Thread-safe (one lock).
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from semq.settings.bounds import USER_UPLOAD_IDLE_S, USER_UPLOAD_KEEP_FREE, USER_UPLOADS_PER_USER

__all__ = ["UPLOADS_DIR", "Staged", "UploadRefused", "Uploads"]

log = logging.getLogger("semq.ops.uploads")

UPLOADS_DIR: Final = "uploads"  # in the node's data directory


class UploadRefused(ValueError):
    """The request cannot be done (one line for the user; a ValueError, so
    the socket answers it as the user's mistake)."""


@dataclass
class _Upload:
    id: str
    user: str
    size: int
    options: dict[str, Any]
    path: Path
    touched: float
    staged: int = 0
    sha: Any = field(default_factory=hashlib.sha256)


@dataclass(frozen=True, kw_only=True)
class Staged:
    """A whole upload, taken out of the table by ``finish``: its file (now
    the caller's to send or remove), size, SHA-256 and ``begin``'s options."""

    path: Path
    size: int
    sha256: bytes
    options: dict[str, Any]


class Uploads:
    """The staged uploads of one node's user socket."""

    def __init__(self, directory: Path, *, per_user: int = USER_UPLOADS_PER_USER,
                 idle_s: float = USER_UPLOAD_IDLE_S, keep_free: int = USER_UPLOAD_KEEP_FREE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = Path(directory)
        self.per_user = per_user
        self.idle_s = idle_s
        self.keep_free = keep_free
        self.clock = clock
        self._open: dict[str, _Upload] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ lifecycle

    def reset(self) -> int:
        """Create the directory (0700; an existing one is made 0700) and
        remove whatever a previous run left in it; the files removed."""
        with self._lock:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.directory, 0o700)
            self._open.clear()
            n = 0
            for p in self.directory.iterdir():
                if p.is_file() or p.is_symlink():
                    p.unlink(missing_ok=True)
                    n += 1
            return n

    def sweep(self) -> list[str]:
        """Remove the uploads that got no block for ``idle_s`` seconds (and
        their files); their ids."""
        with self._lock:
            return self._sweep()

    def _sweep(self) -> list[str]:
        now = self.clock()
        stale = [u for u in self._open.values() if now - u.touched >= self.idle_s]
        for u in stale:
            self._drop(u)
            log.info("upload %s of user %s removed: no block for %.0f s (%d of %d bytes staged)",
                     u.id, u.user, now - u.touched, u.staged, u.size)
        return [u.id for u in stale]

    def _drop(self, u: _Upload) -> None:
        self._open.pop(u.id, None)
        u.path.unlink(missing_ok=True)

    def statistics(self) -> dict[str, int]:
        with self._lock:
            return {"open": len(self._open), "staged_bytes": sum(u.staged for u in self._open.values()),
                    "declared_bytes": sum(u.size for u in self._open.values())}

    # ------------------------------------------------------------ requests

    def begin(self, user: str, size: int, *, max_size: int, options: Mapping[str, Any]) -> str:
        """A new upload of ``size`` bytes (0..``max_size``) for ``user``
        with ``options`` (kept for ``finish``); its id. Raises
        UploadRefused over a bound (naming the value and the limit)."""
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise UploadRefused(f"size {size!r} is not a number of bytes")
        if size > max_size:
            raise UploadRefused(f"document of {size} bytes exceeds this node's limit of {max_size} bytes"
                                f" ({max_size >> 20} MiB, max_document_mib)")
        with self._lock:
            self._sweep()
            mine = sum(1 for u in self._open.values() if u.user == user)
            if mine >= self.per_user:
                raise UploadRefused(f"{mine} uploads of user {user} are open, the limit of {self.per_user} per"
                                    " user: send or abort one (a stale one is removed after"
                                    f" {self.idle_s:g} s without a block)")
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.statvfs(self.directory)
            free = st.f_bavail * st.f_frsize
            owed = sum(u.size - u.staged for u in self._open.values())
            if size + owed + self.keep_free > free:
                raise UploadRefused(f"no room for a document of {size} bytes: {free} bytes are free on the node's"
                                    f" disk, {owed} promised to open uploads, {self.keep_free} kept free")
            uid = secrets.token_hex(16)
            path = self.directory / f"{uid}.part"
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            self._open[uid] = _Upload(uid, user, size, dict(options), path, self.clock())
            return uid

    def _mine(self, user: str, upload_id: Any) -> _Upload:
        u = self._open.get(upload_id) if isinstance(upload_id, str) else None
        if u is None or u.user != user:
            raise UploadRefused(f"no upload {upload_id!r} of user {user} (sent, aborted, removed after"
                                f" {self.idle_s:g} s without a block, or the node restarted): begin again")
        return u

    def status(self, user: str, upload_id: Any) -> dict[str, int]:
        """How much of the upload is staged (where a client resumes)."""
        with self._lock:
            u = self._mine(user, upload_id)
            return {"size": u.size, "staged": u.staged}

    def block(self, user: str, upload_id: Any, offset: Any, data: bytes) -> int:
        """Write ``data`` at ``offset``, which must be what is staged so
        far; the bytes staged now. Raises UploadRefused for a block out of
        order or past the declared size (the upload stays as it was)."""
        with self._lock:
            u = self._mine(user, upload_id)
            if not isinstance(offset, int) or isinstance(offset, bool) or offset != u.staged:
                raise UploadRefused(f"block at offset {offset!r} of upload {u.id}, which holds {u.staged} of its"
                                    f" {u.size} bytes: blocks come in order, the next at {u.staged}")
            if offset + len(data) > u.size:
                raise UploadRefused(f"block of {len(data)} bytes at offset {offset} goes past the {u.size} bytes"
                                    f" declared for upload {u.id}")
            fd = os.open(u.path, os.O_WRONLY)
            try:
                view = memoryview(data)
                at = offset
                while view:
                    n = os.pwrite(fd, view, at)
                    view, at = view[n:], at + n
            finally:
                os.close(fd)
            u.sha.update(data)
            u.staged += len(data)
            u.touched = self.clock()
            return u.staged

    def finish(self, user: str, upload_id: Any, sha256: Any = None) -> Staged:
        """The whole upload, taken out of the table (its file is the
        caller's now). Raises UploadRefused when its blocks do not add up
        to its size (it stays: send the rest), or when ``sha256`` (hex, the
        client's) is given and differs (it is removed)."""
        with self._lock:
            u = self._mine(user, upload_id)
            if u.staged != u.size:
                raise UploadRefused(f"upload {u.id} holds {u.staged} of its {u.size} bytes: its blocks do not add"
                                    f" up; send the next from offset {u.staged}")
            digest = u.sha.digest()
            if sha256 is not None and (not isinstance(sha256, str) or sha256.lower() != digest.hex()):
                self._drop(u)
                raise UploadRefused(f"upload {u.id}: its blocks' SHA-256 is {digest.hex()}, not {sha256!r}: removed;"
                                    " upload the document again")
            fd = os.open(u.path, os.O_RDONLY)
            try:
                os.fsync(fd)  # (durable before the store names it)
            finally:
                os.close(fd)
            del self._open[u.id]
            return Staged(path=u.path, size=u.size, sha256=digest, options=u.options)

    def abort(self, user: str, upload_id: Any) -> int:
        """Remove the upload and its file; the bytes it had staged."""
        with self._lock:
            u = self._mine(user, upload_id)
            self._drop(u)
            return u.staged
