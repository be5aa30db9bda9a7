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
from semq.store.db import StoreError, _drop_new_journals, next_row_id, open_read_only
from semq.store.inuse import store_in_use, wal_index_lock
from semq.store.pg import PgConn, is_pg_url, redact

from .cafiles import count_ca_files, share_ca
from .chunks import CHUNK_DIR, ChunkFiles
from .store import MIGRATIONS, MODELS, open_pg_store

__all__ = ["COPIED_TABLES", "PROGRESS_ROWS", "MigrateError", "MigrateInfo", "MigrateRefused", "migrate_to_pg"]

# The tables that hold the platform's state, in the order they are copied.
# (``meta`` is the schema version, which each store has its own of; the
# PostgreSQL-only tables start empty.)
COPIED_TABLES: Final = ("nodes", "seen", "stored")
# Every table of a platform store on PostgreSQL: a target with a row in any
# of them is in use by (or was used by) some platform.
_PG_TABLES: Final = ("stored", "seen", "nodes", "instances", "presence", "ca_files")
PROGRESS_ROWS: Final = 50_000  # a progress report every this many rows of a table
_COLUMNS: Final = {m._meta.table_name: tuple(f.column_name for f in m._meta.sorted_fields) for m in MODELS}

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


# (count, and for ``stored`` sum(id), sum(length(frame))), the same SQL for
# both (a kept chunk's length is its file's part, ``ref_length``, in SQLite,
# and its frame's in PostgreSQL).
_CHECKS: Final = {
    "stored": "SELECT count(*), coalesce(sum(id), 0), coalesce(sum(coalesce(ref_length, length(frame))), 0)"
              " FROM stored",
    "seen": "SELECT count(*) FROM seen",
    "nodes": "SELECT count(*) FROM nodes",
}


def _checks(execute: Callable[[str], Any], refs: bool = True) -> dict[str, tuple[int, ...]]:
    """The checks' values (``refs``: the store has the kept chunks' columns,
    schema 6 and later; before, every frame is in its row)."""
    return {t: tuple(int(v) for v in execute(sql if refs else sql.replace("coalesce(ref_length, length(frame))",
                                                                          "length(frame)")).fetchone())
            for t, sql in _CHECKS.items()}


def _has_refs(src: sqlite3.Connection) -> bool:
    return any(col[1] == "ref" for col in src.execute("PRAGMA table_info(stored)"))


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
        expect = _checks(src.execute, _has_refs(src))
        # Two migrations into one database wait for each other here; a
        # platform instance already on it cannot write meanwhile.
        pg.execute("LOCK TABLE " + ", ".join(_PG_TABLES) + " IN SHARE ROW EXCLUSIVE MODE")
        held = {t: int(pg.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in _PG_TABLES}
        if any(held.values()):
            raise MigrateRefused(
                f"{where} already holds a platform store with rows ("
                + ", ".join(f"{t} {n}" for t, n in held.items() if n)
                + "); migrate into an empty database (or one made by 'semq platform init --store' and never run)")

        chunks = ChunkFiles(sqlite_path.parent / CHUNK_DIR) if _has_refs(src) else None
        rows = {t: _copy(src, pg, t, expect[t][0], progress, progress_rows, chunks) for t in COPIED_TABLES}
        # The next stored copy's id: above every id the SQLite store ever
        # gave (AUTOINCREMENT: also those of copies deleted since; an id is
        # an LK1 a node may still hold), and never below the sequence's own.
        next_id = next_row_id(src, "stored")
        last, called = pg.execute("SELECT last_value, is_called FROM stored_id_seq").fetchone()
        next_id = max(next_id, int(last) + 1 if called else int(last))
        pg.execute("SELECT setval('stored_id_seq', %s, false)", (next_id,))

        ca_files = 0
        ca_dir = cfg.directory / "ca"
        if cfg.security and ca_dir.is_dir():
            share_ca(PgConn(db), ca_dir)
            ca_files = count_ca_files(PgConn(db))

        got = _checks(lambda sql: pg.execute(sql))
        for t in _CHECKS:
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


def _copy(src: sqlite3.Connection, pg: Any, table: str, total: int, progress: Progress | None,
          every: int, chunks: ChunkFiles | None = None) -> int:
    cols = ", ".join(_COLUMNS[table])
    n = 0
    refs = chunks is not None and table == "stored"
    frame_at = _COLUMNS[table].index("frame") if refs else -1
    with pg.cursor() as cur, cur.copy(f"COPY {table} ({cols}) FROM STDIN") as copy:
        for row in src.execute(f"SELECT {cols}{', ref, ref_offset, ref_length' if refs else ''} FROM {table}"):
            if refs:
                *row, ref, offset, length = row
                if ref is not None:
                    assert chunks is not None
                    kept = chunks.read(ref, offset, length)
                    if kept is None:
                        raise MigrateError(f"the kept chunk in {chunks.dir / ref} at offset {offset} is missing or"
                                           " damaged; rolled back, nothing changed (purge its row with"
                                           " 'semq admin purge', or put the file back)")
                    row[frame_at] = kept.raw
            copy.write_row(row)
            n += 1
            if progress is not None and n % every == 0:
                progress(table, n, total)
    if progress is not None and n % every:
        progress(table, n, total)
    return n
