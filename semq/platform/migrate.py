"""Move a stopped platform's SQLite store into PostgreSQL (``semq platform
migrate --to URL``; docs/operations.md, "Moving a platform to PostgreSQL").

What is guaranteed: the PostgreSQL database holds the rows of ``stored``
(with their ids: a stored copy's id is its LK1, which nodes hold), ``seen``
and ``nodes`` exactly as the SQLite store held them at one committed
transaction, or nothing of them. The copy is one PostgreSQL transaction;
before it commits, the row counts of the three tables (and, for ``stored``,
the sum of the ids and of the frames' lengths) are compared with the
SQLite store's, and a difference rolls everything back. Only after the
commit does the directory's ``semq.toml`` name the database. The SQLite
store is read through a read-only connection and left as it was (the
empty ``-wal``/``-shm`` files that reading it creates are removed again).

Rows go in with PostgreSQL's COPY (psycopg's ``cursor.copy``, one row at a
time into its buffer): one statement per table, streamed, so memory stays
flat whatever the size of the frames, and several times faster than
``executemany`` of INSERTs.

Chunks of large documents that the SQLite platform keeps in files
(semq.platform.chunks) go into PostgreSQL as rows holding their frames,
which every instance can read; a file that is missing or does not hold its
chunk stops the migration with its name, nothing written.

Whether the platform still runs is what the store tells (semq.store.inuse:
a process holding it open, a fresh status.json), the check ``semq
backup``/``restore`` make after asking the admin socket; ``in_use`` may
ask more (the command asks the admin socket too)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from semq.settings.config import Config, write_config
from semq.store.db import StoreError, _drop_new_journals, open_read_only
from semq.store.inuse import store_in_use, wal_index_lock
from semq.store.pg import PgConn, is_pg_url, redact

from .cafiles import count_ca_files, share_ca
from .chunks import CHUNK_DIR, ChunkFiles
from .store import (
    COPIED_TABLES,
    MIGRATIONS,
    carry_stored_ids,
    copy_table,
    has_refs,
    lock_pg_tables,
    open_pg_store,
    store_checks,
)

__all__ = ["COPIED_TABLES", "PROGRESS_ROWS", "MigrateError", "MigrateInfo", "MigrateRefused", "migrate_to_pg"]

PROGRESS_ROWS: Final = 50_000  # a progress report every this many rows of a table

Progress = Callable[[str, int, int], None]  # (table, rows copied, rows in the table)


class MigrateError(StoreError):
    """The store could not be moved (a copy that failed or differs, a
    server lost midway): nothing committed, the directory unchanged. One
    line for the user (exit status 1)."""


class MigrateRefused(MigrateError):
    """Refused before anything was written: the platform runs, the target
    database holds a platform's rows, the directory already names a
    PostgreSQL store. The user's call (exit status 2)."""


@dataclass
class MigrateInfo:
    """What was moved: rows per table, the CA files in the store, the
    database (password redacted), the SQLite store kept, the seconds taken."""

    url: str
    sqlite: Path
    rows: dict[str, int]
    next_id: int  # the id (LK1) the next stored copy gets
    ca_files: int = 0
    seconds: float = 0.0
    config: Path = field(default_factory=Path)


def _describe(check: tuple[int, ...]) -> str:
    return ", ".join(f"{k} {v}" for k, v in zip(("rows", "sum of ids", "frame bytes"), check, strict=False))


def migrate_to_pg(cfg: Config, url: str, *, progress: Progress | None = None,
                  progress_rows: int = PROGRESS_ROWS,
                  in_use: Callable[[Path], str | None] = store_in_use) -> MigrateInfo:
    """Copy the stopped platform of ``cfg`` from its SQLite store into the
    PostgreSQL database ``url`` (its schema made there if absent), check
    it, commit, then write ``store = url`` into the directory's semq.toml.
    ``progress`` is called every ``progress_rows`` rows of a table and at
    its end; ``in_use`` says why the platform's directory is in use, or
    None (by default what its store tells: semq.store.inuse).

    Raises MigrateRefused (nothing written anywhere) for a directory whose
    configuration names a PostgreSQL store already, a platform that runs,
    a target holding a platform's rows; MigrateError for a copy that fails
    or differs (rolled back; the directory unchanged); StoreError for a
    server that cannot be reached or a store that cannot be read."""
    t0 = time.monotonic()
    where = redact(url)
    if not is_pg_url(url):
        raise MigrateRefused(f"{where} is not a postgresql:// URL")
    if cfg.role != "platform":
        raise MigrateRefused(f"{cfg.directory} holds a {cfg.role}, not a platform")
    if cfg.store:
        raise MigrateRefused(f"{cfg.directory} already keeps its store in PostgreSQL ({redact(cfg.store)});"
                             " nothing to migrate")
    sqlite_path = cfg.store_path
    if not sqlite_path.is_file():
        raise MigrateRefused(f"no platform store at {sqlite_path}")
    why = in_use(cfg.directory)
    if why:
        raise MigrateRefused(f"refusing to migrate {sqlite_path}: {why}; stop the platform first"
                             " ('semq admin drain --wait' or 'systemctl stop ...')")

    journals = [sqlite_path.with_name(sqlite_path.name + sfx) for sfx in ("-wal", "-shm")]
    had = [j.exists() for j in journals]
    db = open_pg_store(url, create=True)  # StoreError (one line) for a server it cannot reach
    src: sqlite3.Connection | None = None
    pg: Any = db.connection()
    try:
        pg.autocommit = False
        src = _open_read_only(sqlite_path)
        # One read transaction: the counts and the rows are the store as of one commit.
        src.execute("BEGIN")
        refs = has_refs(src)
        expect = store_checks(src.execute, refs)
        held = lock_pg_tables(pg)
        if any(held.values()):
            raise MigrateRefused(
                f"{where} already holds a platform store with rows ("
                + ", ".join(f"{t} {n}" for t, n in held.items() if n)
                + "); migrate into an empty database (or one made by 'semq platform init --store' and never run)")

        read_ref = _kept_chunks(ChunkFiles(sqlite_path.parent / CHUNK_DIR)) if refs else None
        rows = {t: copy_table(src, pg, t, read_ref, _reporter(progress, t, expect[t][0]), progress_rows)
                for t in COPIED_TABLES}
        next_id = carry_stored_ids(src, pg)

        ca_files = 0
        ca_dir = cfg.directory / "ca"
        if cfg.security and ca_dir.is_dir():
            share_ca(PgConn(db), ca_dir)
            ca_files = count_ca_files(PgConn(db))

        got = store_checks(lambda sql: pg.execute(sql))
        for t in expect:  # (stored, seen, nodes: the first that differs is named)
            if got[t] != expect[t]:
                raise MigrateError(f"table {t} differs after the copy (SQLite: {_describe(expect[t])};"
                                   f" PostgreSQL: {_describe(got[t])}); rolled back, nothing changed")
        src.rollback()
        src.close()
        src = None
        # Commit and name the database in the configuration while no process
        # can open the SQLite store: a platform started since the check above
        # is refused here, and none can start on the old store until the
        # configuration names the new one.
        with wal_index_lock(sqlite_path) as free:
            if not free:
                raise MigrateRefused(f"refusing to migrate {sqlite_path}: it was opened by another process"
                                     " meanwhile; stop the platform first")
            pg.commit()
            try:
                config = write_config(replace(cfg, store=url))
            except OSError as e:
                raise MigrateError(f"the store was copied into {where}, but {cfg.directory}/semq.toml could not"
                                   f" be written ({e}); set store = \"{where}\" in it by hand") from e
            _drop_new_journals(journals, had)
    except BaseException:
        _rollback(pg)
        if src is not None:
            src.close()
            with wal_index_lock(sqlite_path) as free:
                if free:  # (not under a process that opened the store meanwhile)
                    _drop_new_journals(journals, had)
        raise
    finally:
        db.close()
    return MigrateInfo(url=where, sqlite=sqlite_path, rows=rows, next_id=next_id, ca_files=ca_files,
                       seconds=time.monotonic() - t0, config=config)


def _rollback(pg: Any) -> None:
    try:
        pg.rollback()
    except Exception:  # a lost connection rolled back already
        pass


def _open_read_only(path: Path) -> sqlite3.Connection:
    """The SQLite store, read-only (never checkpointed or migrated by us),
    with its schema version checked (the columns copied are those of every
    version up to this software's)."""
    conn, version = open_read_only(path, "platform store")
    if not 0 < version <= len(MIGRATIONS):
        conn.close()
        raise StoreError(f"platform store {path} has schema version {version}; this software reads"
                         f" 1..{len(MIGRATIONS)}")
    return conn


def _reporter(progress: Progress | None, table: str, total: int) -> Callable[[int], None] | None:
    """``progress`` for one table."""
    if progress is None:
        return None
    return lambda n: progress(table, n, total)


def _kept_chunks(chunks: ChunkFiles) -> Callable[[str, int, int], bytes]:
    """A kept chunk's frame from its file (semq.platform.chunks); MigrateError
    naming the file when it is missing or does not hold the chunk."""
    def read(ref: str, offset: int, length: int) -> bytes:
        kept = chunks.read(ref, offset, length)
        if kept is None:
            raise MigrateError(f"the kept chunk in {chunks.dir / ref} at offset {offset} is missing or"
                               " damaged; rolled back, nothing changed (purge its row with"
                               " 'semq admin purge', or put the file back)")
        return kept.raw
    return read
