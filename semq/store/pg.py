"""The platform's store on PostgreSQL: several ``semq platform run``
instances share one database and form one platform (docs/operations.md,
"Several platform instances on PostgreSQL").

The platform's table owners speak SQL to a DB-API connection with
SQLite's ``?`` parameters; ``PgConn`` gives them the same ``execute`` /
``executemany`` over psycopg, rewriting each statement once (cached) into
PostgreSQL's dialect (``translate_sql``): ``%s`` parameters, ``INSERT OR
IGNORE`` as ``ON CONFLICT DO NOTHING``, upserts by the keys their owners
declare (``declare_key``), a scalar ``min(a, b)`` as ``LEAST``, no ``INDEXED
BY``, ``SKIP_LOCKED`` made the clause. What differs beyond a statement's
words — ids from a sequence, many rows in one statement of arrays — is
``PgDialect``'s (SQLite's: semq.store.db.Dialect). So the routing,
claiming and acking code is one code for both stores, and no owner asks
which store it is on (``store_connection``).

Durability: every transaction commits with ``synchronous_commit=on`` (set
per connection, whatever the server's default): an ACK_SAVE leaves only
after the WAL record of its stored copy is on the primary's disk (and on a
synchronous standby when the server is configured so)."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from peewee import InterfaceError, OperationalError, PostgresqlDatabase, SqliteDatabase

from .db import SKIP_LOCKED, Dialect, translate

__all__ = [
    "PG_SCHEMES",
    "PgConn",
    "PgDatabase",
    "PgDialect",
    "PgListener",
    "declare_key",
    "is_pg_url",
    "pg_array",
    "redact",
    "store_connection",
    "translate_sql",
]

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
# REPLACE, ON CONFLICT DO UPDATE), and the columns INSERT OR REPLACE
# replaces: declared by each table's owner when it is imported.
_KEYS: dict[str, str] = {}
_REPLACE: dict[str, tuple[str, ...]] = {}
_OR_REPLACE = re.compile(r"^\s*INSERT OR REPLACE INTO (\w+)", re.IGNORECASE)
_UPSERT = re.compile(r"^\s*INSERT INTO (\w+)(.*) ON CONFLICT DO UPDATE", re.IGNORECASE | re.DOTALL)
# SQLite's "no index on this column" (a unary + before a column name):
# PostgreSQL's planner needs no such hint, and has no + for text.
_UNARY_PLUS = re.compile(r"(?<![\w)\s])\+(?=[a-z_])|(?<=[\s(=])\+(?=[a-z_])")


_MIN = re.compile(r"\bmin\(")


def declare_key(table: str, key: Sequence[str], replaced: Sequence[str] = ()) -> None:
    """``table``'s primary key, and the columns its ``INSERT OR REPLACE``
    replaces: what ``translate_sql`` needs to write SQLite's upserts of it
    for PostgreSQL (which names the conflict's target). Called by the
    table's owner."""
    _KEYS[table] = ", ".join(key)
    if replaced:
        _REPLACE[table] = tuple(replaced)


def _least(sql: str) -> str:
    """SQLite's scalar ``min(a, b, ...)`` (two arguments or more) as
    PostgreSQL's ``LEAST``; the aggregate ``min(x)`` stays."""
    out, at = [], 0
    for m in _MIN.finditer(sql):
        depth, i, top_comma = 1, m.end(), False
        while i < len(sql) and depth:
            ch = sql[i]
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            elif ch == "," and depth == 1:
                top_comma = True
            elif ch == "'":
                i = sql.find("'", i + 1)
                if i < 0:
                    break
            i += 1
        if top_comma:
            out.append(sql[at:m.start()] + "LEAST(")
            at = m.end()
    return "".join(out) + sql[at:]


def translate_sql(sql: str) -> str:
    """One statement in SQLite's dialect as PostgreSQL takes it."""
    out = _INDEXED_BY.sub("", sql).replace("%", "%%").replace(" CROSS JOIN ", " JOIN ")
    out = out.replace(SKIP_LOCKED, " FOR UPDATE SKIP LOCKED")
    out = _least(_UNARY_PLUS.sub("", out))
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


class PgDialect(Dialect):
    """What differs between the stores beyond a statement's words, done
    PostgreSQL's way (semq.store.db.Dialect is SQLite's): every statement
    here is one per call, planned once (a multi-row VALUES of as many
    parameters was re-planned per batch and cost the instance and the
    server twice as much), its arrays one text parameter each (``pg_array``)."""

    def __init__(self) -> None:
        self._sql: dict[tuple[Any, ...], str] = {}

    def new_ids(self, conn: Any, table: str, n: int) -> list[int]:
        """From the table's sequence (shared by every instance; gaps are harmless)."""
        got = [int(i) for (i,) in conn.execute(
            f"SELECT nextval('{table}_id_seq') FROM generate_series(1, ?)", (n,)).fetchall()]
        return sorted(got, reverse=True)

    def upsert_many(self, conn: Any, table: str, columns: Sequence[tuple[str, str]], key: int,
                    rows: Sequence[tuple[Any, ...]]) -> None:
        """One statement over the columns as arrays (``unnest``): the server
        plans and runs it once per call, not once per row (the per-row
        upserts of a batch's ``seen`` rows were a fifth of an instance's time
        and most of the server's)."""
        if not rows:
            return
        sql = self._sql.get(("upsert", table))
        if sql is None:
            names = [c for c, _t in columns]
            sql = self._sql[("upsert", table)] = (
                f"INSERT INTO {table} SELECT * FROM unnest("
                + ", ".join(f"?::{t}[]" for _c, t in columns) + ")"
                f" ON CONFLICT ({', '.join(names[:key])}) DO UPDATE SET "
                + ", ".join(f"{c}=EXCLUDED.{c}" for c in names[key:]))
        # A key twice in one statement is an error here: the last row wins,
        # as one upsert after another left it.
        last = list({r[:key]: r for r in rows}.values())
        conn.execute(sql, [pg_array(col) for col in zip(*last, strict=True)])

    def rows_by_keys(self, conn: Any, select: str, table: str, on: Sequence[tuple[str, str]],
                     keys: Sequence[tuple[Any, ...]], where: str = "") -> Iterator[list[Any]]:
        """Per distinct prefix of the keys (all columns but the last), the
        last column's values as one array, which the planner reads through
        an index on the columns whatever its statistics say; the join from
        VALUES compared every candidate row with every key while a table's
        statistics were young (2.6 s per batch of 512 at 20,000 stored
        copies, scripts/bench pgplatform)."""
        sql = self._sql.get(("keys", select, table, tuple(on), where))
        if sql is None:
            head = " AND ".join(f"{c}=?" for c, _t in on[:-1])
            last, last_type = on[-1]
            sql = self._sql[("keys", select, table, tuple(on), where)] = (
                f"SELECT {select} FROM {table} WHERE {head} AND {last} = ANY(?::{last_type}[])"
                + (f" AND {where}" if where else ""))
        groups: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
        for k in keys:
            groups[k[:-1]].append(k[-1])
        for prefix, values in groups.items():
            yield conn.execute(sql, (*prefix, pg_array(values))).fetchall()


_SQLITE: Final = Dialect()


def store_connection(db: SqliteDatabase | PgDatabase) -> tuple[Any, Dialect]:
    """The connection a store's owners speak SQLite's dialect to (a
    ``PgConn`` on PostgreSQL) and the ``Dialect`` that does the rest."""
    if isinstance(db, PgDatabase):
        return PgConn(db), PgDialect()
    return db.connection(), _SQLITE


class PgListener:
    """A connection of its own (autocommit) that LISTENs on ``channel``:
    ``wait`` blocks until notifications arrive or ``timeout`` passes and
    returns their payloads. A lost connection is opened again by the next
    ``wait``. Raises StoreError (the driver's error chained; the connection
    closed)."""

    def __init__(self, url: str, channel: str) -> None:
        self.url = url
        self.channel = channel
        self._conn: Any = None

    def wait(self, timeout: float) -> list[str]:
        import psycopg

        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
                self._conn.execute(f"LISTEN {self.channel}")
            out: list[str] = []
            # Back with the first notification (the generator would otherwise
            # wait out the whole timeout), and whatever else has arrived by then.
            for timeout_s in (timeout, 0.0):
                for n in self._conn.notifies(timeout=timeout_s, stop_after=1 if timeout_s else 1000):
                    out.append(n.payload)
                if not out:
                    break
            return out
        except psycopg.Error as e:
            self.close()
            raise translate(e, redact(self.url), "platform store's wake-ups") from e

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None
