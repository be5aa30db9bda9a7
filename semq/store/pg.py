"""The platform's store on PostgreSQL: several ``semq platform run``
instances share one database and form one platform (docs/operations.md,
"Several platform instances on PostgreSQL").

The platform core speaks SQL to a DB-API connection with SQLite's ``?``
parameters; ``PgConn`` gives it the same ``execute`` / ``executemany`` over
psycopg, rewriting each statement once (cached) into PostgreSQL's dialect:
``%s`` parameters, ``INSERT OR IGNORE`` as ``ON CONFLICT DO NOTHING``, no
``INDEXED BY``. So the routing, claiming and acking code is one code for
both stores, and what differs (ids from a sequence, row locks, presence)
is said where it differs.

Durability: every transaction commits with ``synchronous_commit=on`` (set
per connection, whatever the server's default): an ACK_SAVE leaves only
after the WAL record of its stored copy is on the primary's disk (and on a
synchronous standby when the server is configured so)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from peewee import InterfaceError, OperationalError, PostgresqlDatabase

__all__ = ["PG_SCHEMES", "PgConn", "PgDatabase", "is_pg_url", "pg_array", "redact", "translate_sql"]

PG_SCHEMES: Final = ("postgresql://", "postgres://")
CONNECT_TIMEOUT_S: Final = 5


def is_pg_url(store: object) -> bool:
    return isinstance(store, str) and store.startswith(PG_SCHEMES)


def pg_array(values: Sequence[Any]) -> str:
    """A PostgreSQL array literal of integers or of strings, to pass as one
    text parameter cast to its array type (``?::bigint[]``): joined in C,
    where psycopg dumps a Python list element by element in Python (a tenth
    of an instance's time on the batch's ``seen`` rows, py-spy)."""
    if values and isinstance(values[0], str):
        joined = '","'.join(values)
        if joined.count('"') == 2 * (len(values) - 1) and "\\" not in joined:
            return '{"' + joined + '"}'
        escaped = (v.replace("\\", "\\\\").replace('"', '\\"') for v in values)
        return '{"' + '","'.join(escaped) + '"}'
    return "{" + ",".join(map(str, map(int, values))) + "}"


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))


class PgDatabase(PostgresqlDatabase):
    """peewee's PostgreSQL database on psycopg 3. ``begin`` ignores the
    SQLite lock types the cores name (``atomic("IMMEDIATE")``): PostgreSQL's
    READ COMMITTED and row locks (``FOR UPDATE SKIP LOCKED`` on claims) do
    what BEGIN IMMEDIATE does for the one SQLite writer."""

    def begin(self, isolation_level: Any = None) -> None:
        # A connection the server ended (a restart, a failover of the
        # server) is replaced here, between transactions: the daemons wait
        # out an outage (their calls fail with a store error meanwhile) and
        # resume without a restart of their own.
        if not self.is_closed() and not self.in_transaction() and not self.is_connection_usable():
            self.close()
        super().begin(None)

    def _connect(self) -> Any:
        conn = super()._connect()  # type: ignore[misc]
        conn.execute("SET synchronous_commit = on")
        return conn


_PARAM = re.compile(r"\?")
_INDEXED_BY = re.compile(r"\s+INDEXED BY \w+", re.IGNORECASE)
_OR_IGNORE = re.compile(r"^\s*INSERT OR IGNORE INTO", re.IGNORECASE)
# Primary keys of the tables SQLite upserts without naming them (INSERT OR
# REPLACE, ON CONFLICT DO UPDATE), and the columns INSERT OR REPLACE replaces.
_KEYS: Final = {
    "seen": "origin_type, origin_id, semq_id, semq_db_id, record_id",
    "nodes": "node_type, node_id",
    "peers": "node_id",
}
_REPLACE: Final = {"seen": ("action", "lk1", "seen_ms"),
                   "peers": ("addresses", "allowed", "fingerprint", "expires_ms", "announced_ms")}
_OR_REPLACE = re.compile(r"^\s*INSERT OR REPLACE INTO (\w+)", re.IGNORECASE)
_UPSERT = re.compile(r"^\s*INSERT INTO (\w+)(.*) ON CONFLICT DO UPDATE", re.IGNORECASE | re.DOTALL)
# SQLite's "no index on this column" (a unary + before a column name):
# PostgreSQL's planner needs no such hint, and has no + for text.
_UNARY_PLUS = re.compile(r"(?<![\w)\s])\+(?=[a-z_])|(?<=[\s(=])\+(?=[a-z_])")


def translate_sql(sql: str) -> str:
    """One statement in SQLite's dialect as PostgreSQL takes it."""
    out = _INDEXED_BY.sub("", sql).replace("%", "%%").replace(" CROSS JOIN ", " JOIN ")
    out = _UNARY_PLUS.sub("", out)
    out = _PARAM.sub("%s", out)
    m = _UPSERT.match(out)
    if m and m.group(1) in _KEYS:
        out = out.replace(" ON CONFLICT DO UPDATE", f" ON CONFLICT ({_KEYS[m.group(1)]}) DO UPDATE", 1)
    if _OR_IGNORE.match(out):
        out = _OR_IGNORE.sub("INSERT INTO", out) + " ON CONFLICT DO NOTHING"
    m = _OR_REPLACE.match(out)
    if m:
        table = m.group(1)
        if table not in _REPLACE:
            raise ValueError(f"INSERT OR REPLACE INTO {table}: no conflict target known for PostgreSQL")
        cols = _REPLACE[table]
        out = (_OR_REPLACE.sub(f"INSERT INTO {table}", out) + f" ON CONFLICT ({_KEYS[table]}) DO UPDATE SET "
               + ", ".join(f"{c}=EXCLUDED.{c}" for c in cols))
    return out


class PgConn:
    """What the platform core uses of a DB-API connection (``execute``,
    ``executemany``, cursors with ``fetchone``/``fetchall``/``rowcount``),
    over the peewee database's current psycopg connection: after a lost
    connection (a PostgreSQL restart) the next statement opens a new one,
    so the daemons wait out a restart and resume."""

    def __init__(self, db: PgDatabase) -> None:
        self.db = db
        self._sql: dict[str, str] = {}

    def _conn(self) -> Any:
        if self.db.is_closed() or not self.db.is_connection_usable():
            if not self.db.in_transaction():
                self.db.close()
                self.db.connect()
        return self.db.connection()

    def _tr(self, sql: str) -> str:
        t = self._sql.get(sql)
        if t is None:
            t = self._sql[sql] = translate_sql(sql)
        return t

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        try:
            return self._conn().execute(self._tr(sql), params or None)
        except Exception as e:
            raise _peewee_error(e) from e

    def executemany(self, sql: str, seq: Iterable[Sequence[Any]]) -> Any:
        rows = list(seq)
        cur = self._conn().cursor()
        if rows:
            try:
                cur.executemany(self._tr(sql), rows)
            except Exception as e:
                raise _peewee_error(e) from e
        return cur


def _peewee_error(e: Exception) -> Exception:
    """psycopg's errors as peewee's (the cores catch those: semq.store.db.STORE_ERRORS)."""
    import psycopg

    if isinstance(e, psycopg.OperationalError):
        return OperationalError(str(e))
    if isinstance(e, psycopg.Error):
        return InterfaceError(str(e)) if isinstance(e, psycopg.InterfaceError) else OperationalError(str(e))
    return e
