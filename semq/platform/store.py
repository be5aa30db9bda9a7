"""The platform's schema, the owner of its tables as a whole: stored copies
(their ids form LK1), the record of every message it accepted (to answer
inquiries), the known organizations, and on PostgreSQL what several
instances share; the migrations of both stores; and the store copied whole
from SQLite into PostgreSQL (``copy_table`` and its checks, for
semq.platform.migrate). Rows by meaning are each table's owner's
(docs/architecture.md, "The platform's tables and their owners")."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from peewee import (
    BigIntegerField,
    BlobField,
    CompositeKey,
    IntegerField,
    Model,
    SqliteDatabase,
    TextField,
)
from playhouse.sqlite_ext import AutoIncrementField

from semq.store.db import StoreError, create_tables, next_row_id, open_store
from semq.store.pg import CONNECT_TIMEOUT_S, PgDatabase, is_pg_url, redact
from semq.umxt_protocol import Kind

from .engine import StoredEvent, StoredState, stored_step

__all__ = [
    "COPIED_TABLES",
    "MODELS",
    "PG_MIGRATIONS",
    "PG_TABLES",
    "SENT_COPIES",
    "Node",
    "Seen",
    "Stored",
    "carry_stored_ids",
    "copy_table",
    "has_refs",
    "lock_pg_tables",
    "open_platform_store",
    "store_checks",
]

# Stored copies delivered whose ACK is outstanding: the state a delivery
# leaves a waiting copy in (STORED_TABLE). The partial index ``stored_sent``
# and the inquiry round that reads through it (``INDEXED BY``) share this
# text: SQLite uses a partial index only for a query whose WHERE implies the
# index's, and literals (not parameters) are what it can compare.
SENT_COPIES: Final = (f"kind={int(Kind.DATA)}"
                      f" AND state={int(stored_step(StoredState.SS_INIT, StoredEvent.DELIVERED))}")


class Stored(Model):
    """The platform's pending-send table. DATA rows are stored copies for an
    offline target (``id`` = LK1 record id); other kinds are relayed acks and
    inquiries (SaveFwd=3) kept until their target connects."""

    id = AutoIncrementField()
    target_type = IntegerField()
    target_id = TextField()
    kind = IntegerField()
    origin_type = IntegerField()
    origin_id = TextField()
    semq_id = IntegerField(default=0)
    semq_db_id = IntegerField(default=0)
    record_id = BigIntegerField(default=0)  # LK0 record id on DATA rows
    state = IntegerField(default=int(StoredState.SS_INIT))  # StoredState
    priority = IntegerField(default=0)
    expires_ms = BigIntegerField(null=True)
    stored_ms = BigIntegerField()
    attempts = IntegerField(default=0)
    last_sent_ms = BigIntegerField(null=True)
    inquiries = IntegerField(default=0)
    frame = BlobField()
    # (Since schema 6, also ``ref``, ``ref_offset``, ``ref_length``: _REFS.)

    class Meta:
        table_name = "stored"
        indexes = (
            (("target_type", "target_id", "state", "priority", "id"), False),
            (("origin_type", "origin_id", "semq_id", "semq_db_id", "record_id"), False),
        )


class Seen(Model):
    """Every DATA the platform accepted, by LK0, with what it did (1
    forwarded, 2 stored, 3 dropped): answers "did you receive LK0 x?"
    (SPEC A.5) after the stored copy itself is gone. Pruned after the
    retention."""

    origin_type = IntegerField()
    origin_id = TextField()
    semq_id = IntegerField()
    semq_db_id = IntegerField()
    record_id = BigIntegerField()
    action = IntegerField()
    lk1 = BigIntegerField(default=0)
    seen_ms = BigIntegerField(index=True)

    class Meta:
        table_name = "seen"
        primary_key = CompositeKey("origin_type", "origin_id", "semq_id", "semq_db_id", "record_id")
        without_rowid = True


class Node(Model):
    """Organizations the platform knows (registered or enrolled)."""

    node_type = IntegerField()
    node_id = TextField()
    registered_ms = BigIntegerField()
    last_seen_ms = BigIntegerField(null=True)
    revoked = IntegerField(default=0)

    class Meta:
        table_name = "nodes"
        primary_key = CompositeKey("node_type", "node_id")


MODELS = [Stored, Seen, Node]


def _v1(db: SqliteDatabase) -> None:
    create_tables(db, MODELS)


def _v2(db: SqliteDatabase) -> None:
    """Delivery order is ``priority DESC, id``: an index in that order lets
    claim_stored read the next batch instead of sorting every stored row (with
    its blob) per claim — 116 ms vs 0.26 ms per claim at 20k stored."""
    db.execute_sql("DROP INDEX IF EXISTS stored_target_type_target_id_state_priority_id")
    db.execute_sql("CREATE INDEX stored_delivery ON stored (target_type, target_id, state, priority DESC, id)")


def _v3(db: SqliteDatabase) -> None:
    """Copies delivered but not yet ACKed (SS_SENT: at most a window per
    node), indexed: the inquiry loop reads those instead of scanning every
    stored row (with its blob) per tick — a 1 GB table at a million stored."""
    db.execute_sql(f"CREATE INDEX IF NOT EXISTS stored_sent ON stored (last_sent_ms) WHERE {SENT_COPIES}")


_PEERS: Final = (
    "CREATE TABLE IF NOT EXISTS peers (node_id TEXT PRIMARY KEY, addresses TEXT NOT NULL, allowed TEXT NOT NULL,"
    " fingerprint TEXT NOT NULL, expires_ms BIGINT NOT NULL, announced_ms BIGINT NOT NULL)")


def _v4(db: SqliteDatabase) -> None:
    """Where organizations listen for direct links (semq.platform.peers)."""
    db.execute_sql(_PEERS)


_UNITS: Final = "ALTER TABLE nodes ADD COLUMN units INTEGER NOT NULL DEFAULT 1"


def _v5(db: SqliteDatabase) -> None:
    """How many units each organization runs (semq.umxt_protocol.units): the platform
    spreads its deliveries over them by LK0, also while they are offline."""
    db.execute_sql(_UNITS)


# A large document's chunk kept for an absent receiver is kept by reference
# (semq.platform.chunks): its row names the file, the offset and the length
# of the frame, and its ``frame`` is empty. The partial index finds the
# rows of a file (is it still needed?) without reading the others.
_REFS: Final = (
    "ALTER TABLE stored ADD COLUMN ref TEXT",
    "ALTER TABLE stored ADD COLUMN ref_offset BIGINT",
    "ALTER TABLE stored ADD COLUMN ref_length BIGINT",
    "CREATE INDEX stored_ref ON stored (ref) WHERE ref IS NOT NULL",
)


def _v6(db: SqliteDatabase) -> None:
    """Chunks of large documents kept in files, by reference."""
    for stmt in _REFS:
        db.execute_sql(stmt)


# How many units each organization is granted by the operator (enrollment or
# ``semq platform register --units``): its HELLO may not claim more, and its
# connection allowance follows the grant, never the HELLO. Organizations
# that ran several units before keep what they ran.
_GRANTS: Final = (
    "ALTER TABLE nodes ADD COLUMN units_granted INTEGER NOT NULL DEFAULT 1",
    "UPDATE nodes SET units_granted = units WHERE units > 1",
)


def _v7(db: SqliteDatabase) -> None:
    """The units granted to each organization."""
    for stmt in _GRANTS:
        db.execute_sql(stmt)


MIGRATIONS = [_v1, _v2, _v3, _v4, _v5, _v6, _v7]


# The same tables on PostgreSQL (shared by every instance of one platform),
# plus what only several instances need: ``instances`` (each running
# instance and its heartbeat) and ``presence`` (which instance holds which
# organization's connection, with an epoch from one sequence: a newer
# connection elsewhere fences the older instance's claims and its removal
# of the row). Frames are sealed or compressed already: stored EXTERNAL
# (out of line, not compressed again).
_PG_V1: Final = (
    """CREATE TABLE stored (
        id BIGSERIAL PRIMARY KEY, target_type INTEGER NOT NULL, target_id TEXT NOT NULL,
        kind INTEGER NOT NULL, origin_type INTEGER NOT NULL, origin_id TEXT NOT NULL,
        semq_id INTEGER NOT NULL DEFAULT 0, semq_db_id INTEGER NOT NULL DEFAULT 0,
        record_id BIGINT NOT NULL DEFAULT 0, state INTEGER NOT NULL DEFAULT 0,
        priority INTEGER NOT NULL DEFAULT 0, expires_ms BIGINT, stored_ms BIGINT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0, last_sent_ms BIGINT, inquiries INTEGER NOT NULL DEFAULT 0,
        frame BYTEA NOT NULL)""",
    "ALTER TABLE stored ALTER COLUMN frame SET STORAGE EXTERNAL",
    # A queue: rows inserted and deleted within seconds. Vacuum and
    # statistics follow it closely (the defaults wait for 20% / 10% of the
    # table to change).
    "ALTER TABLE stored SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.01,"
    " autovacuum_vacuum_cost_delay = 0)",
    "CREATE INDEX stored_delivery ON stored (target_type, target_id, state, priority DESC, id)",
    "CREATE INDEX stored_origin ON stored (origin_type, origin_id, semq_id, semq_db_id, record_id)",
    f"CREATE INDEX stored_sent ON stored (last_sent_ms) WHERE {SENT_COPIES}",
    """CREATE TABLE seen (
        origin_type INTEGER NOT NULL, origin_id TEXT NOT NULL, semq_id INTEGER NOT NULL,
        semq_db_id INTEGER NOT NULL, record_id BIGINT NOT NULL, action INTEGER NOT NULL,
        lk1 BIGINT NOT NULL DEFAULT 0, seen_ms BIGINT NOT NULL,
        PRIMARY KEY (origin_type, origin_id, semq_id, semq_db_id, record_id))""",
    "CREATE INDEX seen_seen_ms ON seen (seen_ms)",
    """CREATE TABLE nodes (
        node_type INTEGER NOT NULL, node_id TEXT NOT NULL, registered_ms BIGINT NOT NULL,
        last_seen_ms BIGINT, revoked INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (node_type, node_id))""",
    """CREATE TABLE instances (
        id TEXT PRIMARY KEY, address TEXT NOT NULL, pid INTEGER NOT NULL, started_ms BIGINT NOT NULL,
        heartbeat_ms BIGINT NOT NULL)""",
    """CREATE TABLE presence (
        node_type INTEGER NOT NULL, node_id TEXT NOT NULL, instance TEXT NOT NULL, epoch BIGINT NOT NULL,
        since_ms BIGINT NOT NULL, PRIMARY KEY (node_type, node_id))""",
    "CREATE INDEX presence_instance ON presence (instance)",
    "CREATE SEQUENCE presence_epoch",
    # The CA's public state, shared by the instances (semq.platform.cluster.share_ca):
    # issued/<serial>.pem certificates and crl.pem (with its CRL number).
    """CREATE TABLE ca_files (
        name TEXT PRIMARY KEY, data BYTEA NOT NULL, crl_number BIGINT NOT NULL DEFAULT 0)""",
)
PG_MIGRATIONS: Final = [_PG_V1, (_PEERS,), (_UNITS,), _REFS, _GRANTS]


def open_platform_store(store: Path | str, *, create: bool = False, synchronous: str = "FULL",
                        check: bool = False) -> SqliteDatabase | PgDatabase:
    """The platform's store: an SQLite file (the default), or a PostgreSQL
    database named by a ``postgresql://`` URL that several instances share."""
    if is_pg_url(store):
        return open_pg_store(str(store), create=create)
    return open_store(Path(store), MIGRATIONS, create=create, synchronous=synchronous, kind="platform store",
                      check=check)


def open_pg_store(url: str, *, create: bool = False) -> PgDatabase:
    """Connect to the platform's PostgreSQL database and bring its schema to
    the current version (``create``: make the tables in an empty database).
    Raises StoreError with one line: the server cannot be reached, the
    database holds no platform store (run ``semq platform init``), or a newer
    schema than this software."""
    db = PgDatabase(None)
    db.init(url, connect_timeout=CONNECT_TIMEOUT_S)
    where = redact(url)
    try:
        db.connect()
    except Exception as e:
        raise StoreError(f"platform store {where} cannot be reached: {' '.join(str(e).split())}") from e
    try:
        with db.atomic():
            # One instance at a time migrates (the others wait here).
            db.execute_sql("SELECT pg_advisory_xact_lock(7410)")
            db.execute_sql("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            row = db.execute_sql("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version == 0 and not create:
                raise StoreError(f"no platform store in {where}; run 'semq platform init --store {where}' first")
            if version > len(PG_MIGRATIONS):
                raise StoreError(f"platform store {where} has schema version {version},"
                                 f" newer than this software's {len(PG_MIGRATIONS)}")
            for v in range(version, len(PG_MIGRATIONS)):
                for stmt in PG_MIGRATIONS[v]:
                    db.execute_sql(stmt)
                db.execute_sql("INSERT INTO meta (key, value) VALUES ('schema_version', %s)"
                               " ON CONFLICT (key) DO UPDATE SET value=EXCLUDED.value", (str(v + 1),))
    except StoreError:
        db.close()
        raise
    except Exception as e:
        db.close()
        raise StoreError(f"platform store {where} cannot be opened: {' '.join(str(e).split())}") from e
    return db


# ---------------------------------------------------------------- the store copied whole

# The tables that hold the platform's state, in the order they are copied.
# (``meta`` is the schema version, which each store has its own of; the
# PostgreSQL-only tables start empty.)
COPIED_TABLES: Final = ("nodes", "seen", "stored")
# Every table of a platform store on PostgreSQL: a target with a row in any
# of them is in use by (or was used by) some platform.
PG_TABLES: Final = ("stored", "seen", "nodes", "instances", "presence", "ca_files")
_COLUMNS: Final = {m._meta.table_name: tuple(f.column_name for f in m._meta.sorted_fields) for m in MODELS}
# (count, and for ``stored`` sum(id), sum(length(frame))), the same SQL for
# both (a kept chunk's length is its file's part, ``ref_length``, in SQLite,
# and its frame's in PostgreSQL).
_CHECKS: Final = {
    "stored": "SELECT count(*), coalesce(sum(id), 0), coalesce(sum(coalesce(ref_length, length(frame))), 0)"
              " FROM stored",
    "seen": "SELECT count(*) FROM seen",
    "nodes": "SELECT count(*) FROM nodes",
}


def store_checks(execute: Callable[[str], Any], refs: bool = True) -> dict[str, tuple[int, ...]]:
    """Per copied table, what a copy must keep: its rows (and for
    ``stored`` the sum of the ids and of the frames' lengths). ``refs``:
    the store has the kept chunks' columns (schema 6 and later; before,
    every frame is in its row)."""
    return {t: tuple(int(v) for v in execute(sql if refs else sql.replace("coalesce(ref_length, length(frame))",
                                                                          "length(frame)")).fetchone())
            for t, sql in _CHECKS.items()}


def has_refs(src: sqlite3.Connection) -> bool:
    """Whether an SQLite store's stored rows may keep their frames in files (schema 6 and later)."""
    return any(col[1] == "ref" for col in src.execute("PRAGMA table_info(stored)"))


def lock_pg_tables(pg: Any) -> dict[str, int]:
    """Inside ``pg``'s transaction: every table of the PostgreSQL store
    locked against writers (two copies into one database wait for each
    other here; a platform instance already on it cannot write meanwhile),
    and the rows each holds."""
    pg.execute("LOCK TABLE " + ", ".join(PG_TABLES) + " IN SHARE ROW EXCLUSIVE MODE")
    return {t: int(pg.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in PG_TABLES}


def copy_table(src: sqlite3.Connection, pg: Any, table: str, read_ref: Callable[[str, int, int], bytes] | None,
               progress: Callable[[int], None] | None, every: int) -> int:
    """The rows of ``table`` from the SQLite store into PostgreSQL with
    COPY (one statement, streamed: memory stays flat whatever the frames'
    sizes). ``read_ref``: a kept chunk's frame from its file (name,
    offset, length; it raises when it cannot), None when the SQLite store
    has no such rows. ``progress`` gets the rows copied every ``every``
    rows and at the end. Returns the rows copied."""
    cols = ", ".join(_COLUMNS[table])
    n = 0
    refs = read_ref is not None and table == "stored"
    frame_at = _COLUMNS[table].index("frame") if refs else -1
    with pg.cursor() as cur, cur.copy(f"COPY {table} ({cols}) FROM STDIN") as copy:
        for row in src.execute(f"SELECT {cols}{', ref, ref_offset, ref_length' if refs else ''} FROM {table}"):
            if refs:
                assert read_ref is not None
                *row, ref, offset, length = row
                if ref is not None:
                    row[frame_at] = read_ref(ref, offset, length)
            copy.write_row(row)
            n += 1
            if progress is not None and n % every == 0:
                progress(n)
    if progress is not None and n % every:
        progress(n)
    return n


def carry_stored_ids(src: sqlite3.Connection, pg: Any) -> int:
    """The id (LK1) the next stored copy gets on PostgreSQL, set there:
    above every id the SQLite store ever gave (AUTOINCREMENT: also those of
    copies deleted since; an id is an LK1 a node may still hold), and never
    below the sequence's own."""
    next_id = next_row_id(src, "stored")
    last, called = pg.execute("SELECT last_value, is_called FROM stored_id_seq").fetchone()
    next_id = max(next_id, int(last) + 1 if called else int(last))
    pg.execute("SELECT setval('stored_id_seq', %s, false)", (next_id,))
    return next_id
