"""Opening a SEMQ SQLite store: pragmas, corruption and lock checks, schema
versions and migrations. Both the node and the platform stores use this.

One connection per store, shared by the threads that the daemons run store
work on; the daemons serialize access with one CapacityLimiter(1) per store
(SQLite has a single writer; STYLE 6).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Collection, Container, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, TypeVar

from peewee import SQL, DatabaseError, Model, OperationalError, SqliteDatabase

__all__ = [
    "HOLD_MS",
    "SKIP_LOCKED",
    "SQLITE_MAGIC",
    "STORE_ERRORS",
    "Dialect",
    "HeldWrites",
    "ReadOnlyStore",
    "SendOrder",
    "StoreError",
    "StoreFileError",
    "backup_store",
    "create_tables",
    "delete_by_id",
    "open_read_only",
    "open_store",
    "rows_by_id",
    "split_held",
    "take_held",
    "translate",
]

SQLITE_MAGIC: Final = b"SQLite format 3\x00"
SYNCHRONOUS_MODES: Final = ("OFF", "NORMAL", "FULL", "EXTRA")


class StoreError(Exception):
    """A store problem the user must see as one line (missing, corrupt,
    locked, full, read-only). The original driver error is chained."""


Migration = Callable[[SqliteDatabase], None]

BUSY_TIMEOUT_S: Final = 5.0  # how long a statement waits for another process's lock
# Page size of a new store (SQLite's default is 4,096). Documents are ~1 KiB
# rows appended in batches of hundreds: with 16 KiB pages a commit writes a
# quarter of the WAL frames (one pwrite each) and splits a quarter of the
# B-tree pages. scripts/bench e2e, alternated with 4,096: the daemons' CPU per
# document online 81/92/82 -> 79/75/74 us, 22.0/21.3/22.1k -> 23.5/24.3/24.5k
# documents/s (docs/benchmarks.md). A store keeps the size it was made with
# (WAL mode cannot change it): ``semq compact`` rewrites a stopped one.
PAGE_SIZE: Final = 16384
_BEGIN_POLL_S: Final = 0.0005


class _StoreDatabase(SqliteDatabase):
    """A store's database. ``BEGIN IMMEDIATE`` (every write transaction of
    the cores) waits for another process's write transaction — an
    application's ``semq send`` into a running node's store — by trying
    again every half millisecond, instead of through SQLite's busy handler,
    whose sleeps grow 1, 2, 5, 10 ms...: a lock freed after 4 ms (one fsync)
    was noticed only at 8. Other statements keep the busy handler."""

    def begin(self, lock_type: str | None = None) -> None:
        lock_type = lock_type or getattr(self, "_lock_type", None)
        if lock_type != "IMMEDIATE":
            super().begin(lock_type)
            return
        conn = self.connection()
        conn.execute("PRAGMA busy_timeout=0")  # the attempts below must not enter the busy handler
        try:
            deadline = 0.0
            while True:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as e:
                    if "locked" not in str(e) and "busy" not in str(e):
                        raise OperationalError(*e.args) from e
                    now = time.monotonic()
                    if not deadline:
                        deadline = now + BUSY_TIMEOUT_S
                    elif now >= deadline:
                        raise OperationalError(
                            f"{e} (another process held the store's write lock for more than"
                            f" {BUSY_TIMEOUT_S:g} s)") from e
                time.sleep(_BEGIN_POLL_S)
        finally:
            conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")


def next_row_id(conn: sqlite3.Connection, table: str) -> int:
    """The id SQLite would give the next row of an AUTOINCREMENT ``table``
    (never one used before, even if since deleted): for a writer that assigns
    a batch's ids itself, inside its write transaction, so that acks can name
    rows before the one executemany that inserts them."""
    row = conn.execute(
        f"SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name='{table}'), 0),"
        f" coalesce((SELECT max(id) FROM {table}), 0))").fetchone()
    return int(row[0]) + 1


_IN_CHUNK: Final = 500  # ids per IN list (SQLite's default limit on host parameters is 32,766)


def rows_by_id(conn: sqlite3.Connection, select: str, ids: Sequence[int], where: str = "",
               params: Sequence[object] = (), key: str = "id", suffix: str = "") -> list[Any]:
    """The rows of ``select`` (``SELECT key, cols FROM table``: the integer
    primary key ``key`` first) whose key is in ``ids``, plus ``AND where`` with ``params``
    (``suffix`` ends each statement: ``SKIP_LOCKED``).
    Acks name rows claimed together, so their ids are mostly one dense run:
    then one range scan of the table, filtered here, instead of an IN list,
    which SQLite sorts into a temporary b-tree before seeking each id (2.5 of
    the 4-5 us an origin spent per row looked up; scripts/bench pipeline).
    Sparse ids still go by IN lists. Rows in no particular order."""
    if not ids:
        return []
    lo, hi = min(ids), max(ids)
    extra = f" AND {where}" if where else ""
    if hi - lo < 2 * len(ids) + 64:
        wanted = set(ids)
        rows = conn.execute(f"{select} WHERE {key} BETWEEN ? AND ?{extra}{suffix}", (lo, hi, *params)).fetchall()
        if hi - lo + 1 == len(wanted):  # the range is exactly the ids asked for
            return rows
        return [r for r in rows if r[0] in wanted]
    out: list[Any] = []
    for i in range(0, len(ids), _IN_CHUNK):
        chunk = ids[i:i + _IN_CHUNK]
        out += conn.execute(f"{select} WHERE {key} IN ({','.join('?' * len(chunk))}){extra}{suffix}",
                            (*chunk, *params)).fetchall()
    return out


# Rows a claim reads are locked for its transaction, skipping those another
# claim holds: PostgreSQL's ``FOR UPDATE SKIP LOCKED`` (several platform
# instances claim from one store). On SQLite a comment: the one writer's
# IMMEDIATE transaction holds the whole store (semq.store.pg.translate_sql
# makes it the clause).
SKIP_LOCKED: Final = " /* FOR UPDATE SKIP LOCKED */"
_KEYS_PER_LOOKUP: Final = 1000  # composite keys per look-up (SQLite: host parameters, 5 per key)


class Dialect:
    """What differs between the stores beyond a statement's words (those
    ``semq.store.pg.translate_sql`` rewrites), SQLite's way; PostgreSQL's
    is ``semq.store.pg.PgDialect``. The table owners ask it, never which
    store they are on (``semq.store.pg.store_connection`` hands out the
    connection and its dialect together)."""

    def new_ids(self, conn: Any, table: str, n: int) -> list[int]:
        """``n`` ids for new rows of ``table`` (an AUTOINCREMENT ``id``),
        inside the caller's write transaction, highest first (taken with
        ``pop()``): the next ones of the table, never one used before (this
        connection is its one writer), so the rows can be named before the
        one ``executemany`` that inserts them."""
        first = next_row_id(conn, table)
        return list(range(first + n - 1, first - 1, -1))

    def upsert_many(self, conn: Any, table: str, columns: Sequence[tuple[str, str]], key: int,
                    rows: Sequence[tuple[Any, ...]]) -> None:
        """``rows`` written into ``table`` in one go, each replacing the row
        of its key; a key twice: the last row. ``columns`` are every column
        of the table in its order, as (name, SQL type); the first ``key`` of
        them are its primary key."""
        if rows:
            conn.executemany(f"INSERT OR REPLACE INTO {table} VALUES ({','.join('?' * len(columns))})", rows)

    def rows_by_keys(self, conn: Any, select: str, table: str, on: Sequence[tuple[str, str]],
                     keys: Sequence[tuple[Any, ...]], where: str = "") -> Iterator[list[Any]]:
        """Lists of the rows of ``SELECT select FROM table`` whose columns
        ``on`` ((name, SQL type) each) equal one of ``keys``, ``AND where``.
        SQLite: a join from the keys, a thousand at a time (row values
        ``IN (VALUES ...)`` would scan the table)."""
        aliases = [f"k{i}" for i in range(len(on))]
        join = " AND ".join(f"{c}=k.{a}" for (c, _t), a in zip(on, aliases, strict=True))
        one = "(" + ",".join("?" * len(on)) + ")"
        extra = f" WHERE {where}" if where else ""
        for i in range(0, len(keys), _KEYS_PER_LOOKUP):
            chunk = keys[i:i + _KEYS_PER_LOOKUP]
            yield conn.execute(
                f"WITH k({', '.join(aliases)}) AS (VALUES {','.join([one] * len(chunk))})"
                f" SELECT {select} FROM k CROSS JOIN {table} ON {join}{extra}",
                [v for k in chunk for v in k]).fetchall()


# How long a write that promises nothing waits in memory for the frame that
# usually makes it moot within a fraction of a second (docs/design.md,
# "States held in memory for up to a second"): the node's SS_SENT and
# SS_ACK_FWD and its new pending-ack rows, the platform's SS_SENT.
HOLD_MS: Final = 1000


def split_held(ids: Sequence[int], held: dict[int, Any]) -> tuple[list[tuple[int, Any]], list[int]]:
    """The entries ``held`` has for ``ids`` as (id, value), in order, and
    the ids it has none for: what a step takes from memory and what it
    reads from the store."""
    hits: list[tuple[int, Any]] = []
    misses: list[int] = []
    for rid in ids:
        h = held.get(rid)
        if h is None:
            misses.append(rid)
        else:
            hits.append((rid, h))
    return hits, misses


_Held = TypeVar("_Held", bound=tuple[Any, ...])


def take_held(held: dict[int, _Held], before_ms: int | None, at: int) -> list[tuple[int, _Held]]:
    """Remove and return the entries of ``held`` whose time (``value[at]``)
    is at or before ``before_ms`` (all when None). The dict is in the order
    the entries were held, oldest first, so the look stops at the first
    younger one."""
    if before_ms is None:
        items = list(held.items())
        held.clear()
        return items
    items = []
    for k, v in held.items():
        if v[at] > before_ms:
            break
        items.append((k, v))
    for k, _ in items:
        del held[k]
    return items


class HeldWrites:
    """What a core that holds writes in memory (the node's, the platform's)
    shares: its transactions, and writing everything held at once. The core
    says what it holds (``held``), writes it (``write_held``) and forgets
    it (``_drop_held``)."""

    db: Any  # SqliteDatabase, or the platform's PgDatabase

    def held(self) -> bool:
        raise NotImplementedError

    def write_held(self, before_ms: int | None = None) -> None:
        raise NotImplementedError

    def _drop_held(self) -> None:
        raise NotImplementedError

    @contextmanager
    def _tx(self) -> Iterator[None]:
        """One IMMEDIATE transaction (the write lock taken at BEGIN, so the
        busy timeout applies: a deferred read-then-write transaction fails at
        once with "database is locked" when another process wrote in
        between). If it does not commit, what is held in memory is dropped,
        as a crash would drop it: it may have changed in the transaction, the
        store is the truth, and what it lacks the inquiries recover
        (docs/design.md)."""
        try:
            with self.db.atomic("IMMEDIATE"):
                yield
        except BaseException:
            self._drop_held()
            raise

    def write_held_now(self) -> None:
        """Everything held, written in a transaction of its own (close, and
        the operator's commands: what they read is what the store knows)."""
        if self.held():
            with self._tx():
                self.write_held()


class SendOrder:
    """Claims in send order (priority first, then acceptance: an index on
    ``(..., state, priority DESC, id)``) that skip the rows held sent in
    memory, which are still SS_INIT on disk (the node's outbox, the
    platform's stored copies: docs/design.md, "States held in memory
    for up to a second"). Per scope (the node: its outbox; the platform: one
    target) and priority, ``after`` is an id up to which every SS_INIT row
    is held, so a claim reads the index from there instead of reading the
    ~5,000 rows in flight at full load again. ``forget`` whenever a row may
    have become SS_INIT below it."""

    def __init__(self, table: str) -> None:
        self.table = table
        self.after: dict[tuple[object, int], int] = {}

    def forget(self) -> None:
        self.after.clear()

    def ids(self, conn: sqlite3.Connection, where: str, params: Sequence[object], limit: int,
            held: Collection[int], scope: object = None) -> tuple[list[int], list[tuple[int, list[int]]]]:
        """The ids of the next ``limit`` rows (``where`` selects the SS_INIT
        rows of the scope) that are not ``held``, in send order, and per
        priority the ids read in order (for ``advance``)."""
        ids: list[int] = []
        levels: list[tuple[int, list[int]]] = []
        below = 1 << 31  # the next priority is below this one
        while len(ids) < limit:
            r = conn.execute(f"SELECT priority FROM {self.table} WHERE {where} AND priority < ?"
                             " ORDER BY priority DESC LIMIT 1", (*params, below)).fetchone()
            if r is None:
                break
            below = r[0]
            need = limit - len(ids)
            # Past ``after`` the rows are rarely held (a claim just took the
            # ones before it), so read a little more than needed and go on
            # reading, twice as much each time, only while held rows take
            # the places: reading ``need`` + every held id at once made
            # each claim fetch and filter ~4,000 ids it did not want.
            read: list[int] = []
            start, want = self.after.get((scope, below), 0), need + 64
            while True:
                chunk = [i for (i,) in conn.execute(
                    f"SELECT id FROM {self.table} WHERE {where} AND priority=? AND id>? ORDER BY id LIMIT ?",
                    (*params, below, start, want))]
                read += chunk
                fresh = [i for i in chunk if i not in held][:need]
                ids += fresh
                need -= len(fresh)
                if not need or len(chunk) < want:
                    break
                start, want = chunk[-1], 2 * want
            levels.append((below, read))
        return ids, levels

    @staticmethod
    def levels(rows: Sequence[Sequence[Any]], prio_at: int) -> list[tuple[int, list[int]]]:
        """``levels`` of rows read in send order (id first) by a plain query."""
        out: list[tuple[int, list[int]]] = []
        for r in rows:
            if not out or out[-1][0] != r[prio_at]:
                out.append((r[prio_at], []))
            out[-1][1].append(r[0])
        return out

    def advance(self, levels: list[tuple[int, list[int]]], held: Container[int], done: Container[int],
                scope: object = None) -> None:
        """After a claim: per priority, the last id read up to which every row
        is held now or ``done`` (gone from SS_INIT: expired, deleted); a row
        left out (its target's certificate not known yet) stops it."""
        for prio, read in levels:
            last = 0
            for i in read:
                if i not in held and i not in done:
                    break
                last = i
            if last:
                self.after[(scope, prio)] = last


def delete_by_id(conn: sqlite3.Connection, table: str, ids: Sequence[int]) -> None:
    """Delete the rows of ``table`` whose integer primary key ``id`` is in
    ``ids``. Acks confirm rows claimed together, so the ids are mostly one
    dense run: when they are exactly ``lo..hi``, one range DELETE instead of
    a statement per id (3.5 instead of 4.4 us per 1 KiB row)."""
    if not ids:
        return
    lo, hi = min(ids), max(ids)
    if hi - lo + 1 == len(ids) and len(set(ids)) == len(ids):
        conn.execute(f"DELETE FROM {table} WHERE id BETWEEN ? AND ?", (lo, hi))
    else:
        conn.executemany(f"DELETE FROM {table} WHERE id=?", [(i,) for i in ids])


def open_store(
    path: Path,
    migrations: Sequence[Migration],
    *,
    create: bool = False,
    synchronous: str = "FULL",
    kind: str = "store",
    check: bool = False,
) -> SqliteDatabase:
    """Open (or with ``create`` make) the store at ``path`` and bring its
    schema to ``len(migrations)``. Before migrating an existing store to a
    newer version a copy is written next to it (``.bak-v<old>``).

    Raises StoreError: missing file without ``create``, a file that is not
    SQLite (never overwritten), a locked or unreadable store, a schema newer
    than this software. ``check`` runs PRAGMA quick_check first (daemons at
    start: a store with corrupt pages is refused, not served)."""
    path = Path(path)
    synchronous = synchronous.upper()
    if synchronous not in SYNCHRONOUS_MODES:
        raise StoreError(f"synchronous mode {synchronous!r} is not one of {', '.join(SYNCHRONOUS_MODES)}")
    journals = [path.with_name(path.name + sfx) for sfx in ("-wal", "-shm")]
    had = [j.exists() for j in journals]
    if path.exists():
        # Never open()/close() the store file ourselves: closing any descriptor
        # of a file drops every POSIX lock this process holds on it, including
        # those of a live SQLite connection to the same store in this process
        # (another process may then delete the WAL under it). stat() and
        # SQLite's own read-only open are safe.
        size = path.stat().st_size
        if size == 0 and not create:
            # SQLite would silently make a new, empty store of it: a store
            # truncated to nothing must not look like "no messages".
            raise StoreError(f"{kind} {path} is empty (0 bytes: truncated?); refusing to use it")
        if size and not _is_sqlite(path):
            _drop_new_journals(journals, had)
            raise StoreError(f"{kind} {path} is not an SQLite database (corrupt?); refusing to touch it")
        if not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK):
            raise StoreError(f"{kind} {path} is read-only (the file or its directory is not writable;"
                             " SQLite needs both for its journal)")
    elif not create:
        raise StoreError(f"no {kind} at {path}; run 'semq ... init' first")
    else:
        _create_private(path)
    db = _StoreDatabase(
        None,
        check_same_thread=False,
        thread_safe=False,
        timeout=BUSY_TIMEOUT_S,
    )
    db.init(
        str(path),
        pragmas={
            "page_size": PAGE_SIZE,  # (before journal_mode: only a new, empty file takes it)
            "journal_mode": "wal",
            "synchronous": synchronous,
            "foreign_keys": 1,
            "busy_timeout": int(BUSY_TIMEOUT_S * 1000),
            "cache_size": -16000,
        },
    )
    try:
        db.connect()
        if check:
            bad = [r[0] for r in db.execute_sql("PRAGMA quick_check(5)").fetchall() if r[0] != "ok"]
            if bad:
                db.close()
                _drop_new_journals(journals, had)
                what = " ".join("; ".join(bad).split())[:300]  # one line
                raise StoreError(f"{kind} {path} is corrupt ({what}); refusing to use it"
                                 " (restore a backup: semq restore)")
        db.execute_sql("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        row = db.execute_sql("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        version = int(row[0]) if row else 0
        target = len(migrations)
        if version > target:
            raise StoreError(
                f"{kind} {path} has schema version {version}, newer than this software's {target}"
            )
        if version and version < target:
            backup_store(db, path.with_name(f"{path.name}.bak-v{version}"))
        for v in range(version, target):
            with db.atomic():
                migrations[v](db)
                db.execute_sql(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)", (str(v + 1),)
                )
    except StoreError:
        db.close()
        raise
    except (DatabaseError, OperationalError, sqlite3.DatabaseError) as e:
        db.close()
        _drop_new_journals(journals, had)
        raise StoreError(f"{kind} {path} cannot be opened: {e}") from e
    return db


def _create_private(path: Path) -> None:
    """Make a new, empty store file readable by its owner only (0600; its
    directory 0700 if made here): a node's store holds its documents in
    plaintext. SQLite gives the -wal and -shm files the mode of the store
    file, so they are owner-only too; the daemons refuse a store others can
    read (semq.settings.config.check_private_paths)."""
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, mode=0o700)
        os.chmod(path.parent, 0o700)  # mkdir's mode is filtered by the umask
    # O_EXCL with an explicit mode: never, even for an instant, readable by
    # others (the umask can only remove bits). Nothing has the new file open,
    # so closing this descriptor drops no SQLite lock (see open_store).
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600))


def _drop_new_journals(journals: list[Path], had: list[bool]) -> None:
    """Leave a refused store as we found it: remove the (empty) -wal/-shm
    files that looking at it created."""
    for j, existed in zip(journals, had, strict=True):
        if not existed and j.exists() and (j.name.endswith("-shm") or j.stat().st_size == 0):
            j.unlink()


def _is_sqlite(path: Path) -> bool:
    probe = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        probe.execute("PRAGMA schema_version").fetchone()
        return True
    except sqlite3.DatabaseError as e:
        return "not a database" not in str(e)  # other errors (locked, ...) are for the real open
    finally:
        probe.close()


def open_read_only(path: Path, kind: str = "store") -> tuple[sqlite3.Connection, int]:
    """A store opened read-only (never checkpointed or migrated here; in
    autocommit: the caller opens its own read transaction), and its schema
    version (0 if it has none). Raises StoreError, the driver's error
    chained, for a file SQLite cannot read as a store."""
    conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
    try:
        row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    except sqlite3.DatabaseError as e:
        conn.close()
        raise StoreError(f"{path} is not a {kind} ({e})") from e
    return conn, int(row[0]) if row else 0


def create_tables(db: SqliteDatabase, models: Sequence[type[Model]]) -> None:
    """Create the models' tables with SQL DEFAULTs for every constant
    default: the hot paths insert with prepared SQL, not through the ORM."""
    for model in models:
        for f in model._meta.sorted_fields:
            d = f.default
            if d is None or callable(d):
                continue
            lit = f"X'{bytes(d).hex()}'" if isinstance(d, bytes) else repr(int(d) if isinstance(d, bool) else d)
            f.constraints = [*(f.constraints or []), SQL(f"DEFAULT {lit}")]
    with db.bind_ctx(models):
        db.create_tables(models)


def backup_store(db: SqliteDatabase, dest: Path) -> Path:
    """A consistent copy of a live store (SQLite online backup API)."""
    dest = Path(dest)
    tmp = dest.with_name(dest.name + f".tmp{int(time.time() * 1000)}")
    _create_private(tmp)  # a copy of the store: its documents, owner-only like the store
    target = sqlite3.connect(str(tmp))
    try:
        db.connection().backup(target)
    finally:
        target.close()
    shutil.move(str(tmp), str(dest))
    return dest


class StoreFileError(sqlite3.OperationalError):
    """An I/O error on a file the store's rows name (a large document's
    content, semq.node.large.incoming): the store's own error, handled as one
    (disk full: the batch rolls back, nothing is acknowledged, the daemon
    says so and tries again later), not as a network failure."""


STORE_ERRORS: Final = (sqlite3.Error, DatabaseError, OperationalError)


class ReadOnlyStore:
    """Another store, read now and then (a node's unit reading unit 1's
    dedup table): connected read-only when first asked. A store that cannot
    be read now answers nothing, as if the row were absent: the reader's
    answer is "not here, as far as we can tell", never an error."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = None

    def one(self, sql: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        """The first row of ``sql``, or None (none, or the store unreadable)."""
        try:
            if self._conn is None:
                uri = self.path.resolve().as_uri() + "?mode=ro"
                self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=5)
            row = self._conn.execute(sql, params).fetchone()
        except STORE_ERRORS:
            return None
        return None if row is None else tuple(row)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def translate(e: BaseException, path: Path | str, kind: str = "store") -> StoreError:
    """One line for a driver error on a running store (disk full, read-only).
    Looks through the exception chain: when a COMMIT fails with SQLITE_FULL,
    SQLite rolls back by itself and peewee's ROLLBACK then fails with "cannot
    rollback - no transaction is active", hiding the real cause."""
    texts: list[str] = []
    cur: BaseException | None = e
    while cur is not None and len(texts) < 8:
        texts.append(str(cur))
        cur = cur.__cause__ or cur.__context__
    text = next((t for t in texts if "full" in t or "readonly" in t or "read-only" in t), texts[0])
    if "full" in text:
        return StoreError(f"{kind} {path}: disk full ({text}); nothing was accepted")
    if "readonly" in text or "read-only" in text:
        return StoreError(f"{kind} {path} is read-only ({text}); nothing was accepted")
    if "locked" in text:
        return StoreError(f"{kind} {path} is locked by another process ({text})")
    return StoreError(f"{kind} {path}: {text}")
