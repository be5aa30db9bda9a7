"""Folders: how ``semq watch`` turns files into documents and documents into
files, for systems that exchange business documents through directories
(an ERP next to a B2B gateway).

**Outbox folder.** A file is taken when its writer is done with it
(semq.node.features.folder_watch says how that is told): on Linux, when
its writer closed it after writing or it was renamed in (inotify), and no
process the watcher can see still holds it open for writing; a file no
event spoke of (there at start, written over a network file system, or
everywhere without inotify) once unchanged for the settle time. Dotfiles
and names ending in ``.tmp`` / ``.part`` are never taken. Each file
becomes one document, whole; the file then moves to ``sent/`` (its name
kept, ``NAME.1.EXT`` ... on a clash). A file that cannot be sent moves to
``failed/`` beside ``NAME.reason.txt``, one line naming the value and the
limit.

Exactly once across crashes: the file's name and SHA-256 are written to
the node store (``watch_files``, schema ``_v12_watch``) *in the transaction
that accepts its document* (``NodeClient.send_many(also=...)``). Then the
file is moved and both directories are synced, and only then is the row
marked moved. A crash between the commit and the move leaves the file in
the folder and its row unmoved: the next scan finds the same name and
digest and moves it without sending it again. A crash after the move but
before the mark leaves a row whose file is no longer in the folder (or is
another file under that name): the scan marks it moved. A file dropped
again later with the same name is a new file and is sent again.

**Inbox folder.** Each document that arrives for the organization (not for
one of its users) is written to ``DIR/NAME`` atomically — ``DIR/.NAME.tmp``,
fsync, rename, fsync of the directory — and acknowledged in the store
(``NodeClient.acknowledge``) only once the file is durable. ``NAME`` is
made from the document's LK0 and its AppKey key (``KEY__10008-1-1-42.bin``),
so a crash between the rename and the acknowledgement writes the same file
again under the same name: never two files for one document. The key comes
from another organization and is sanitized (``safe_name_part``): a name
never starts with ``.`` or ``-``, so no program it is given to takes it for
an option; ``semq watch`` prints each file's absolute path. It follows the
inbox with the node's cursor (``NodeClient.cursor`` / ``inbox_after``) and
waits for the running daemon's wake (``InboxFolder.wait``), never on a
timer.

Synchronous, like ``semq send``: the watcher is one more client of the
node's store (the daemon runs beside it and sends what it accepts).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple

from semq.umxt_protocol import LK0, AppKey, LocalProtocolError

from ..api import InboxItem, NodeClient
from ..core import NodeCore
from ..limits import MAX_DOCUMENT_SIZE, DocumentTooLarge
from ._access import write_tx
from .folder_watch import (
    DEFAULT_SETTLE,
    SKIPPED_SUFFIXES,
    FolderEvents,
    FolderGone,
    Readiness,
    ignored_name,
    open_events,
    open_for_writing,
)

__all__ = [
    "FAILED_DIR",
    "INBOX_KEY_MAX",
    "SENT_DIR",
    "SKIPPED_SUFFIXES",
    "WATCH_BATCH",
    "WATCH_RETENTION_MS",
    "FolderOptions",
    "InboxFolder",
    "OutboxFolder",
    "Outcome",
    "inbox_file_name",
    "safe_name_part",
    "shown",
    "write_durably",
]

SENT_DIR: Final = "sent"
FAILED_DIR: Final = "failed"
WATCH_BATCH: Final = 100  # files accepted per transaction
WATCH_BATCH_BYTES: Final = 64 << 20  # ... and at most this many bytes of them
# Rows of files moved to sent/ are kept this long (what was sent when, as
# which LK0), then dropped when a watcher starts.
WATCH_RETENTION_MS: Final = 30 * 24 * 3600 * 1000
INBOX_KEY_MAX: Final = 100  # characters of the AppKey key kept in an inbox file's name
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]")
_DOTS: Final = re.compile(r"\.{2,}")
_EXT: Final = re.compile(r"[A-Za-z0-9]{1,16}")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")


class Outcome(NamedTuple):
    """What happened to one file: ``kind`` is ``sent`` (``detail``: the
    LK0), ``recovered`` (accepted before a restart, moved now, not sent
    again; ``detail``: its LK0), ``failed`` (``detail``: why) or
    ``received`` (an inbox file written; ``detail``: its path)."""

    kind: str
    name: str
    detail: str

    def line(self) -> str:
        """The line ``semq watch`` prints (a name's undecodable bytes and
        control characters escaped: one file, one line)."""
        name = shown(self.name)
        if self.kind == "sent":
            return f"sent: {name} -> {self.detail}"
        if self.kind == "recovered":
            return f"sent: {name} -> {self.detail} (accepted before a restart; not sent again)"
        if self.kind == "failed":
            return f"failed: {name}: {shown(self.detail)}"
        return f"received: {shown(self.detail)}"


def shown(name: str) -> str:
    """A file name as text for one line of output: bytes that are not
    UTF-8 as ``\\xNN``, control characters as ``\\xNN`` too."""
    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", text)


@dataclass(frozen=True, kw_only=True, slots=True)
class FolderOptions:
    """The document options every file of an outbox folder is sent with
    (``NodeClient.send``'s keywords); ``key_from_name``: the AppKey key is
    the file's name without its extension instead of ``key``."""

    to: str
    data_type: str = ""
    domain: str = ""
    subtype: str = ""
    key: str = ""
    key_from_name: bool = False
    save_fwd: int = 3
    ack2: bool = True
    priority: int = 0
    expires_in: float | None = None
    ordered: str | None = None

    def document(self, name: str, data: bytes) -> dict[str, Any]:
        """The ``send_many`` entry of file ``name``; LocalProtocolError for an
        AppKey over its limits (a key taken from the name is checked here)."""
        key = Path(name).stem if self.key_from_name else self.key
        app_key = AppKey(domain=self.domain, data_type=self.data_type, subtype=self.subtype, key=key)
        return dict(to=self.to, data=data, data_type=app_key.data_type, domain=app_key.domain,
                    subtype=app_key.subtype, key=app_key.key, save_fwd=self.save_fwd, ack2=self.ack2,
                    priority=self.priority, expires_in=self.expires_in, ordered=self.ordered)


class _Pending(NamedTuple):
    """A ``watch_files`` row whose file is not in sent/ yet."""

    id: int
    name: bytes
    sha256: bytes
    lk0: str


class _Ready(NamedTuple):
    """A complete file read, about to be sent."""

    name: str
    data: bytes
    sha256: bytes
    doc: dict[str, Any]


def _read_regular(path: Path) -> tuple[bytes, tuple[int, int]] | None:
    """The whole content of ``path`` and its (size, mtime_ns) once read;
    None when it is not a regular file. Opened without following a link and
    without blocking: a name swapped for a FIFO or a link meanwhile is not
    read (a FIFO would block the watcher for ever)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:  # a symbolic link now
            return None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        while block := os.read(fd, 1 << 20):
            chunks.append(block)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    # Written to while it was read: a signature no look found (it waits again).
    return data, (st.st_size if len(data) == st.st_size else -1, st.st_mtime_ns)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _free_name(directory: Path, name: str) -> str:
    """``name``, or ``STEM.N.EXT`` with the smallest N free in ``directory``."""
    if not os.path.lexists(directory / name):
        return name
    p = Path(name)
    stem, ext = (p.stem, p.suffix) if p.stem else (name, "")
    n = 1
    while os.path.lexists(directory / f"{stem}.{n}{ext}"):
        n += 1
    return f"{stem}.{n}{ext}"


def write_durably(directory: Path, name: str, data: bytes | Path, *, sync_dir: bool = True) -> Path:
    """Write ``directory/name`` atomically: ``.NAME.tmp`` written and
    fsynced, renamed over ``name`` (a file already there is replaced), and
    the directory fsynced (``sync_dir=False``: the caller syncs it once for
    several files). Readers never see a partial file under ``name``.
    ``data`` may be a file (a large document's), copied by blocks."""
    tmp = directory / f".{name}.tmp"
    final = directory / name
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if isinstance(data, Path):
            with open(data, "rb") as src:
                while block := src.read(1 << 20):
                    view = memoryview(block)
                    while view:
                        view = view[os.write(fd, view):]
        else:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    if sync_dir:
        _fsync_dir(directory)
    return final


class OutboxFolder:
    """An outbox folder of one node. ``scan()`` when ``fileno()`` is
    readable (its events) and once per interval: files ready since the last
    scan are sent (``batch`` per transaction) and moved. ``events``: watch
    the folder with inotify where it can be had (``events_off`` then says
    why not, else ""); ``settle``: seconds a file no event spoke of stays
    unchanged before it is taken. Not thread-safe; one watcher per folder
    (``semq watch`` locks it). ``close()`` ends the events."""

    def __init__(self, node: NodeClient, path: Path, options: FolderOptions, *, batch: int = WATCH_BATCH,
                 settle: float = DEFAULT_SETTLE, events: bool = True, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self.path = Path(path).resolve()
        self.options = options
        self.batch = max(1, batch)
        self.clock = clock
        self.monotonic = monotonic
        self.sent_dir = self.path / SENT_DIR
        self.failed_dir = self.path / FAILED_DIR
        self._folder = os.fsencode(str(self.path))
        self.readiness = Readiness(settle)
        for d in (self.sent_dir, self.failed_dir):
            d.mkdir(exist_ok=True)
        self.events: FolderEvents | None = None
        self.events_off = "not asked for"
        self._gone = False  # the folder went away while watched: watched again once back
        if events:  # before the first scan: no write between the two is missed
            self.events, self.events_off = open_events(self.path)
        self._forget_old()

    def fileno(self) -> int | None:
        """The descriptor readable when the folder's events wait (None without)."""
        return None if self.events is None else self.events.fileno()

    def absorb(self) -> bool:
        """Take in the events waiting (without a look at the folder):
        whether any says more than a file gone — the scan's own moves to
        sent/ and failed/ say only that, and need no look."""
        return self.events is not None and self._read_events() > 0

    def _read_events(self) -> int:
        assert self.events is not None
        try:
            return self.events.read(self.readiness)
        except FolderGone as e:
            self.events.close()
            self.events, self.events_off, self._gone = None, str(e), True
            self.readiness.lost_events()
            raise

    def close(self) -> None:
        if self.events is not None:
            self.events.close()
            self.events = None

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    # ------------------------------------------------------------ the store's record

    def _forget_old(self) -> None:
        cut = self._now_ms() - WATCH_RETENTION_MS
        for core in self.node.cores:
            with write_tx(core) as conn:
                conn.execute("DELETE FROM watch_files WHERE moved_ms IS NOT NULL AND moved_ms < ?", (cut,))

    def pending(self) -> dict[bytes, tuple[NodeCore, _Pending]]:
        """Rows of this folder whose file was not marked moved, by name (with
        the unit's core that holds each)."""
        out: dict[bytes, tuple[NodeCore, _Pending]] = {}
        for core in self.node.cores:
            for p in map(_Pending._make, core.conn.execute(
                    "SELECT id, name, sha256, lk0 FROM watch_files WHERE folder=? AND moved_ms IS NULL",
                    (self._folder,))):
                out[bytes(p.name)] = (core, p)
        return out

    def _mark_moved(self, rows: Iterable[tuple[NodeCore, int]]) -> None:
        ts = self._now_ms()
        by_core: dict[int, tuple[NodeCore, list[int]]] = {}
        for core, row_id in rows:
            by_core.setdefault(id(core), (core, []))[1].append(row_id)
        for core, ids in by_core.values():
            with write_tx(core) as conn:
                conn.executemany("UPDATE watch_files SET moved_ms=? WHERE id=?", [(ts, i) for i in ids])

    # ------------------------------------------------------------ a scan

    def _candidates(self) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        with os.scandir(self.path) as it:
            for entry in it:
                name = entry.name
                if ignored_name(name):
                    continue
                try:
                    if not entry.is_file(follow_symlinks=False):
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError:  # gone meanwhile
                    continue
                found[name] = (st.st_size, st.st_mtime_ns)
        return found

    def scan(self, stop: Callable[[], bool] = lambda: False,
             report: Callable[[Outcome], None] | None = None) -> list[Outcome]:
        """One look at the folder: files ready since the last look are
        sent and moved, in order of modification time then name; returns
        what happened to each (and hands each to ``report`` as its batch is
        done). ``stop`` is asked between batches. Raises StoreError (store
        locked, disk full) with the batch in progress not accepted and its
        files left where they are; OSError when the folder went away."""
        if self.events is None and self._gone and self.path.is_dir():
            # The folder is back after it was deleted or moved away: watched
            # again (what was written meanwhile goes by the settle time).
            for d in (self.sent_dir, self.failed_dir):
                d.mkdir(exist_ok=True)
            self.events, self.events_off = open_events(self.path)
            self._gone = self.events is None
        try:
            found = self._candidates()
        except OSError:
            if self.events is not None:
                self._read_events()  # (the folder gone: said by its events too, the watch ended)
            raise
        if self.events is not None:  # after the listing: every write it saw has its event queued
            self._read_events()
        ready = set(self.readiness.look(found, wall=self.clock(), mono=self.monotonic()))
        ready -= open_for_writing(self.path, ready)  # a writer still holds it: its close decides
        pending = self.pending()
        # A file accepted before a restart was whole then: it is taken at
        # once (its digest decides).
        complete = sorted((n for n in found if n in ready or self._accepted_before(n, pending)),
                          key=lambda n: (found[n][1], n))
        present = {os.fsencode(n) for n in found}
        # Rows whose file left the folder: it was moved before its row said so.
        self._mark_moved((core, p.id) for name, (core, p) in pending.items() if name not in present)
        out: list[Outcome] = []
        i = 0
        while i < len(complete) and not stop():
            group: list[str] = []
            size = 0
            while i < len(complete) and len(group) < self.batch and size < WATCH_BATCH_BYTES:
                group.append(complete[i])
                size += found[complete[i]][0]
                i += 1
            done = self._take(group, found, pending)
            if report is not None:
                for o in done:
                    report(o)
            out += done
        return out

    def _accepted_before(self, name: str, pending: dict[bytes, tuple[NodeCore, _Pending]]) -> bool:
        """Whether ``name`` is the file a row not moved yet records (same digest)."""
        found = pending.get(os.fsencode(name))
        if found is None:
            return False
        _, row = found
        try:
            got = _read_regular(self.path / name)
        except OSError:
            return False
        return got is not None and hashlib.sha256(got[0]).digest() == bytes(row.sha256)

    def _take(self, names: list[str], found: dict[str, tuple[int, int]],
              pending: dict[bytes, tuple[NodeCore, _Pending]]) -> list[Outcome]:
        out: list[Outcome] = []
        ready: list[_Ready] = []
        recovered: list[tuple[str, NodeCore, _Pending]] = []
        stale: list[tuple[NodeCore, int]] = []
        for name in names:
            size, _ = found[name]
            if size > MAX_DOCUMENT_SIZE:
                out.append(self._fail(name, str(DocumentTooLarge(size, MAX_DOCUMENT_SIZE))))
                continue
            path = self.path / name
            try:
                got = _read_regular(path)
            except FileNotFoundError:
                continue  # taken away meanwhile
            except OSError as e:
                out.append(self._fail(name, f"cannot read it: {e.strerror or e}"))
                continue
            if got is None:
                continue  # no longer a regular file (replaced meanwhile): the next look decides
            data, sig = got
            if sig != found[name]:
                continue  # written to since it was found ready: it waits again
            digest = hashlib.sha256(data).digest()
            taken = pending.get(os.fsencode(name))
            if taken is not None:
                core, row = taken
                if bytes(row.sha256) == digest:
                    recovered.append((name, core, row))
                    continue
                stale.append((core, row.id))  # another file under that name: the row's file was moved
            try:
                doc = self.options.document(name, data)
            except LocalProtocolError as e:
                out.append(self._fail(name, str(e)))
                continue
            ready.append(_Ready(name, data, digest, doc))
        if recovered:
            self._move_sent([(name, core, row.id) for name, core, row in recovered])
            out += [Outcome("recovered", name, row.lk0) for name, _, row in recovered]
        if stale:
            self._mark_moved(stale)
        if ready:
            out += self._send(ready)
        return out

    def _send(self, ready: list[_Ready]) -> list[Outcome]:
        """Accept ``ready`` in one transaction with their rows; a document
        refused takes its batch down with it, so then each is tried alone
        (the refused one fails, the others go)."""
        try:
            lk0s, rows = self._accept(ready)
        except LocalProtocolError as e:
            if len(ready) == 1:
                return [self._fail(ready[0].name, str(e))]
            out: list[Outcome] = []
            for one in ready:
                out += self._send([one])
            return out
        self._move_sent([(f.name, core, row_id) for f, (core, row_id) in zip(ready, rows, strict=True)])
        return [Outcome("sent", f.name, str(lk0)) for f, lk0 in zip(ready, lk0s, strict=True)]

    def _accept(self, ready: list[_Ready]) -> tuple[list[LK0], list[tuple[NodeCore, int]]]:
        """The documents and their ``watch_files`` rows in one transaction:
        their LK0s, and (core, row id) of each row."""
        ts = self._now_ms()
        folder = self._folder
        rows: list[tuple[NodeCore, int]] = []

        def record(core: NodeCore, lk0s: list[LK0]) -> None:
            for f, lk0 in zip(ready, lk0s, strict=True):
                cur = core.conn.execute(
                    "INSERT INTO watch_files (folder, name, sha256, size, lk0, accepted_ms) VALUES (?,?,?,?,?,?)",
                    (folder, os.fsencode(f.name), f.sha256, len(f.data), str(lk0), ts))
                rows.append((core, int(cur.lastrowid or 0)))

        lk0s = self.node.send_many([f.doc for f in ready], also=record)
        return lk0s, rows

    def _move_sent(self, files: list[tuple[str, NodeCore, int]]) -> None:
        """Move files to sent/, sync both directories, then mark their rows
        (core, row id) moved."""
        for name, _, _ in files:
            os.rename(self.path / name, self.sent_dir / _free_name(self.sent_dir, name))
            self.readiness.taken(name)
        if files:
            # Durable before the rows say so: a move lost in a power cut would
            # otherwise leave a file in the folder whose row says "moved".
            _fsync_dir(self.sent_dir)
            _fsync_dir(self.path)
            self._mark_moved((core, row_id) for _, core, row_id in files)

    def _fail(self, name: str, reason: str) -> Outcome:
        """Move a file that cannot be sent to failed/, its reason beside it
        (written first: a crash before the move fails the file again, and
        its reason replaces the one left behind)."""
        dest = _free_name(self.failed_dir, name)
        line = " ".join(reason.splitlines()) + "\n"
        write_durably(self.failed_dir, f"{dest}.reason.txt", line.encode("utf-8", "backslashreplace"), sync_dir=False)
        os.rename(self.path / name, self.failed_dir / dest)
        _fsync_dir(self.failed_dir)
        self.readiness.taken(name)
        return Outcome("failed", name, reason)


# ---------------------------------------------------------------- the inbox folder


def safe_name_part(text: str, limit: int = INBOX_KEY_MAX) -> str:
    """``text`` (an AppKey key from another organization) made safe as part
    of a file name: only ``A-Z a-z 0-9 . _ -`` kept (anything else — ``/``,
    control characters, spaces, non-ASCII — becomes ``_``), no run of dots
    (``..`` -> ``_``), no leading dot, no leading ``-`` (it becomes ``_``),
    at most ``limit`` characters.

    The leading ``-``: the inbox folder's files are handed to other
    programs (``for f in *.bin; do import $f; done``, ``xargs``, ``rm *``),
    and a name such as ``-rf__...`` or ``--help__...`` would be read as
    their options. A partner chooses the key; it must not choose options."""
    safe = _DOTS.sub("_", _UNSAFE.sub("_", text)).lstrip(".")
    if safe.startswith("-"):
        safe = "_" + safe[1:]
    return safe[:limit]


def inbox_file_name(item: InboxItem, ext: str = "bin") -> str:
    """The file an inbox document is written to: ``KEY__ORIGIN-UNIT-DB-RECORD.EXT``
    (``ORIGIN-...`` alone without a key). The same document always gets the
    same name: its LK0 is in it."""
    lk0 = safe_name_part(str(item.lk0).replace("/", "-"), 200)
    key = safe_name_part(item.app_key.key)
    return f"{key}__{lk0}.{ext}" if key else f"{lk0}.{ext}"


class InboxFolder:
    """Writes the organization's arriving documents to a folder, then
    acknowledges them: ``drain()``, then ``wait()`` for the daemon's wake,
    then ``drain()`` again."""

    def __init__(self, node: NodeClient, path: Path, *, ext: str = "bin") -> None:
        if not _EXT.fullmatch(ext):
            raise ValueError(f"inbox file extension {ext!r} is not 1 to 16 letters or digits")
        self.node = node
        self.path = Path(path).resolve()
        self.ext = ext
        # Per unit, the last inbox row looked at (documents for users are
        # skipped, not acknowledged): semq.node.api.following's cursor.
        self._cursor = node.cursor(0)

    def wait(self, timeout: float, also: Sequence[int] = ()) -> bool:
        """Block until the running daemon says a document arrived above
        what ``drain`` looked at (True), ``timeout`` passed (False), or one
        of the descriptors ``also`` is readable (False): woken by the
        daemon's commit, no polling (NodeClient.wait). Raises
        semq.session.inbox_wait.DaemonAway when no daemon answers,
        WaitRefused with its error line."""
        start = time.monotonic()
        if self.node.wait(self._cursor, timeout=timeout, also=also):
            return True
        if also and time.monotonic() - start < timeout:
            # Woken by the caller's own events, maybe before the daemon's
            # answer was read: the store says (a writer of many files must
            # not keep the inbox from being read).
            return self.waiting()
        return False

    def waiting(self) -> bool:
        """Whether the inbox holds a document above what ``drain`` looked
        at (one indexed look-up per unit)."""
        return any(top > at for top, at in zip(self.node.inbox_tops(), self._cursor, strict=True))

    def drain(self, limit: int = 1000, stop: Callable[[], bool] = lambda: False,
              report: Callable[[Outcome], None] | None = None) -> list[Outcome]:
        """Write every unread document for the organization to the folder,
        sync it, acknowledge them, ``limit`` per round (``report`` gets each
        file's outcome once its round is acknowledged). A crash before the
        acknowledgement rewrites the same files under the same names."""
        out: list[Outcome] = []
        while not stop():
            items = self.node.inbox_after(self._cursor, limit=limit)
            if not items:
                break
            for item in items:
                self._cursor = self.node.advance(self._cursor, item)
            written: list[InboxItem] = []
            done: list[Outcome] = []
            for item in items:
                if item.to_user:
                    continue  # a user's document: its application reads it
                path = write_durably(self.path, inbox_file_name(item, self.ext),
                                     item.app_data if item.path is None else item.path, sync_dir=False)
                written.append(item)
                done.append(Outcome("received", path.name, str(path)))
            if written:
                _fsync_dir(self.path)  # every rename durable before any acknowledgement
                self.node.acknowledge([item.id for item in written])
            if report is not None:
                for o in done:
                    report(o)
            out += done
            if len(items) < limit:
                break
        return out
