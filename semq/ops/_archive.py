"""A backup archive (semq.ops.backup): its format (the manifest, the names a
backup may hold), the store snapshots it carries, and reading one into a
staging directory, checked before a byte of it is extracted (the walk is
semq.ops._tarscan's). Raises BackupError, one line for the user."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import sqlite3
import tarfile
import time
from pathlib import Path, PurePosixPath
from typing import Any, Final

from semq.identity.crypto import ensure_private_directory
from semq.settings.bounds import BACKUP_MAX_MEMBER_RATIO, BACKUP_MAX_META
from semq.store.db import SQLITE_MAGIC
from semq.store.inuse import STORE_NAMES

from ._tarscan import ArchiveError, ArchiveTooLarge, Scan, bounded_stream, scan

__all__ = ["BACKUP_FORMAT", "KEY_DIRS", "LARGE_FILE", "MANIFEST_NAME", "PUBLIC_DIRS", "STORE_NAMES", "UNIT_STORE",
           "BackupError", "file_sha256", "is_sqlite", "private_file", "read_archive", "role_of_store",
           "schema_version", "snapshot_store", "table_counts", "write_archive"]

BACKUP_FORMAT: Final = 1
MANIFEST_NAME: Final = "semq-backup.json"
PUBLIC_DIRS: Final = ("", "certs", "ca", "ca/issued", "tls")
KEY_DIRS: Final = ("keys", "ca", "tls")
UNIT_STORE: Final = re.compile(r"unit-([2-9]|[1-9][0-9])/node\.sqlite")  # the store of a node's unit K > 1
# Large documents' contents (semq.node.large) and the chunks a platform keeps (semq.platform.chunks).
LARGE_FILE: Final = re.compile(r"(unit-([2-9]|[1-9][0-9])/)?large/(in|out)/[A-Za-z0-9._:@-]+\.doc"
                                r"|chunks/[A-Za-z0-9._-]+\.chunks")


class BackupError(Exception):
    """A backup or restore that cannot be done, as one line for the user."""


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def is_sqlite(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(16) == SQLITE_MAGIC
    except OSError:
        return False


def table_counts(conn: sqlite3.Connection) -> dict[str, int]:
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'"
                                        " AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    return {n: int(conn.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0]) for n in names}


def schema_version(conn: sqlite3.Connection) -> int:
    try:
        row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0]) if row else 0


def role_of_store(conn: sqlite3.Connection) -> str:
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "outbox" in names:
        return "node"
    if "stored" in names:
        return "platform"
    raise BackupError("the database is not a SEMQ node or platform store")


def snapshot_store(src: Path, dest: Path) -> dict[str, Any]:
    """Copy the live store ``src`` to ``dest`` (a new file) as of one
    committed transaction: SQLite online backup in a single step over a new
    connection (the daemon's writes go on meanwhile), then checked with
    ``PRAGMA quick_check``. Returns {tables, schema_version, sha256, role}.
    Raises BackupError."""
    src, dest = Path(src), Path(dest)
    if not src.is_file():
        raise BackupError(f"no store at {src}")
    if not is_sqlite(src):
        raise BackupError(f"{src} is not an SQLite database (corrupt?); not backed up")
    try:
        s = sqlite3.connect(f"file:{src}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error as e:
        raise BackupError(f"cannot open {src}: {e}") from e
    try:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        d = sqlite3.connect(str(dest))
        try:
            s.backup(d)  # pages=-1: every page in one step, under one read transaction
            d.execute("PRAGMA journal_mode=DELETE")  # a self-contained file (no -wal beside it)
            check = d.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise BackupError(f"the snapshot of {src} fails its check: {check}")
            info = {"tables": table_counts(d), "schema_version": schema_version(d), "role": role_of_store(d)}
        finally:
            d.close()
    except sqlite3.Error as e:
        raise BackupError(f"backup of {src} failed: {e}") from e
    finally:
        s.close()
    info["sha256"] = file_sha256(dest)
    return info


def private_file(path: Path) -> io.BufferedWriter:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    return os.fdopen(fd, "wb")


def write_archive(path: Path, compress: bool, manifest: dict[str, Any], members: list[tuple[str, Path]]) -> list[str]:
    """Write a new tar archive at ``path`` (0600; gzip-compressed with
    ``compress``): ``manifest`` as MANIFEST_NAME, then each member (its name
    in the archive, the file), 0600 and owned by no one. A large document's
    file (LARGE_FILE) gone meanwhile is left out: its document was confirmed.
    Returns the names left out."""
    mode = "w:gz" if compress else "w"
    gone: list[str] = []
    with private_file(path) as f, tarfile.open(fileobj=f, mode=mode) as tar:  # type: ignore[call-overload]
        data = json.dumps(manifest, indent=2).encode()
        ti = tarfile.TarInfo(MANIFEST_NAME)
        ti.size, ti.mode, ti.mtime = len(data), 0o600, int(time.time())
        tar.addfile(ti, io.BytesIO(data))
        for rel, src in members:
            try:
                fh = src.open("rb")
            except FileNotFoundError:
                if LARGE_FILE.fullmatch(rel):
                    gone.append(rel)  # its document was confirmed meanwhile
                    continue
                raise
            with fh:
                ti = tar.gettarinfo(arcname=rel, fileobj=fh)
                ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = 0o600, 0, 0, "", ""
                tar.addfile(ti, fh)
    return gone


def _member_ok(name: str) -> str:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not p.parts or "\\" in name:
        raise BackupError(f"archive member {name!r} has an unsafe path; not a semq backup")
    rel = p.as_posix()
    parent = p.parent.as_posix() if str(p.parent) != "." else ""
    if rel in (MANIFEST_NAME, "semq.toml", *STORE_NAMES.values()) or UNIT_STORE.fullmatch(rel):
        return rel
    if p.suffix == ".pem" and parent in {*PUBLIC_DIRS, *KEY_DIRS}:
        return rel
    if LARGE_FILE.fullmatch(rel):
        return rel
    raise BackupError(f"unexpected archive member {name!r}; not a semq backup")


def read_archive(archive: Path, stage: Path, free: int) -> tuple[dict[str, Any], list[str]]:
    """Extract a backup into ``stage`` (regular files only, known names
    only), where ``free`` bytes are free. Returns (manifest, files).

    Nothing is written before the whole archive has been walked (semq.ops.
    _tarscan): the bytes its members declare must stay within
    ``BACKUP_MAX_MEMBER_RATIO`` times the archive's size and within the
    space free where it is extracted, and its inflated stream within the
    same ratio; otherwise BackupError, one line naming the value and the
    limit, and nothing is written."""
    size = archive.stat().st_size
    if is_sqlite(archive):
        return _read_store_file(archive, stage, free, size)
    cap = BACKUP_MAX_MEMBER_RATIO * max(size, 1)
    walked = _walk(archive, stage, free, size, cap)
    manifest, files = _extract(archive, stage, cap, walked)
    if not isinstance(manifest, dict):
        raise BackupError(f"{archive} has no {MANIFEST_NAME}; not a semq backup")
    if manifest.get("format") != BACKUP_FORMAT:
        raise BackupError(f"{archive} is backup format {manifest.get('format')!r}; this software reads"
                          f" {BACKUP_FORMAT}")
    if manifest.get("role") not in STORE_NAMES or manifest.get("store") not in files:
        raise BackupError(f"{archive}: the manifest names no store it contains")
    return manifest, files


def _read_store_file(archive: Path, stage: Path, free: int, size: int) -> tuple[dict[str, Any], list[str]]:
    """A backup that is a store snapshot alone (``*.sqlite``), copied into
    ``stage`` under its role's name, with the manifest it would have had."""
    if size > free:
        raise BackupError(f"{archive}: its {size} bytes exceed the {free} bytes free in {stage.parent};"
                          " not restored")
    conn = sqlite3.connect(f"file:{archive}?mode=ro", uri=True)
    try:
        role = role_of_store(conn)
    except sqlite3.Error as e:
        raise BackupError(f"{archive}: {e}") from e
    finally:
        conn.close()
    name = STORE_NAMES[role]
    shutil.copyfile(archive, stage / name)
    return {"format": BACKUP_FORMAT, "role": role, "store": name, "sha256": file_sha256(stage / name)}, [name]


def _walk(archive: Path, stage: Path, free: int, size: int, cap: int) -> Scan:
    """The archive walked whole, every member's header checked against
    ``cap`` and the ``free`` bytes before its data is read past."""

    def inflated(n: int) -> str:
        return (f"{archive} inflates to more than {n - 1} bytes, over {BACKUP_MAX_MEMBER_RATIO} times its"
                f" {size} bytes ({cap}); not restored")

    def check(total: int) -> None:  # at each member's header, before its data is read past
        if total > cap:
            raise BackupError(f"{archive}: its members would write {total} bytes or more, over"
                              f" {BACKUP_MAX_MEMBER_RATIO} times its {size} bytes ({cap}); not restored")
        if total > free:
            raise BackupError(f"{archive}: its members would write {total} bytes or more, over the {free} bytes"
                              f" free in {stage.parent}; not restored")

    try:
        with bounded_stream(archive, cap, inflated) as stream:
            return scan(stream, max_meta=BACKUP_MAX_META, check=check)
    except ArchiveTooLarge as e:
        raise BackupError(str(e)) from e
    except ArchiveError as e:
        raise BackupError(f"{archive} is not a semq backup (tar or .sqlite): {e}") from e
    except OSError as e:
        raise BackupError(f"{archive} cannot be read: {e}") from e


def _extract(archive: Path, stage: Path, cap: int, walked: Scan) -> tuple[Any, list[str]]:
    """The archive's members written into ``stage`` (the manifest read, not
    written): from a stream bounded by what the walk saw (plus tarfile's
    read-ahead of one record), so an archive changed since cannot write
    more than was checked. Returns (the manifest or None, files)."""
    seen = min(cap, walked.stream_bytes + tarfile.RECORDSIZE)

    def changed(n: int) -> str:
        return (f"{archive} changed while it was restored (it inflates past the {walked.stream_bytes} bytes it"
                " had when it was checked); not restored")

    files: list[str] = []
    manifest: Any = None
    written = 0
    try:
        with bounded_stream(archive, seen, changed) as stream, \
                tarfile.open(fileobj=stream, mode="r|") as tar:
            for m in tar:
                rel = _member_ok(m.name)
                if m.isdir():
                    continue
                if not m.isfile():
                    raise BackupError(f"archive member {m.name!r} is not a regular file; not a semq backup")
                written += m.size
                if written > walked.file_bytes:
                    raise BackupError(f"{archive} changed while it was restored ({written} bytes of members,"
                                      f" {walked.file_bytes} when it was checked); not restored")
                src = tar.extractfile(m)
                assert src is not None
                if rel == MANIFEST_NAME:
                    try:
                        manifest = json.loads(src.read(1 << 20))
                    except ValueError as e:
                        raise BackupError(f"{archive}: the manifest is not JSON: {e}") from e
                    continue
                dest = stage / rel
                ensure_private_directory(dest.parent)
                with private_file(dest) as f:
                    shutil.copyfileobj(src, f)
                files.append(rel)
    except ArchiveTooLarge as e:
        raise BackupError(str(e)) from e
    except ArchiveError as e:
        raise BackupError(f"{archive} is not a semq backup (tar or .sqlite): {e}") from e
    except tarfile.TarError as e:
        raise BackupError(f"{archive} is not a semq backup (tar or .sqlite): {e}") from e
    return manifest, files
