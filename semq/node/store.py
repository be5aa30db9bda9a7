"""The node's SQLite schema (peewee models for schema and migrations; the hot
paths in semq.node.core run prepared SQL on the same connection, because
building SQL through the ORM costs ~95 us per query here — MEASUREMENTS)."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Final

from peewee import (
    BigIntegerField,
    BlobField,
    BooleanField,
    CompositeKey,
    IntegerField,
    Model,
    SqliteDatabase,
    TextField,
)
from playhouse.sqlite_ext import AutoIncrementField

from semq.store.db import STORE_ERRORS, create_tables, next_row_id, open_store, translate

from .engine import SendState

__all__ = [
    "ID_RATE",
    "INCARNATION_REASONS",
    "MIGRATIONS",
    "MODELS",
    "SEED_MODELS",
    "Dedup",
    "Inbound",
    "Inbox",
    "Outbox",
    "QueueItem",
    "QueueName",
    "Receipt",
    "RpcAnswer",
    "RpcRequest",
    "TxHalf",
    "begin_incarnation",
    "id_floor",
    "incarnation",
    "open_node_store",
]


class Outbox(Model):
    """Pending-send table (seed tb_0031). ``id`` is LK0's record id; it is
    AUTOINCREMENT so an id is never reused after a row is cleaned up (the
    receivers' duplicate suppression keys on it)."""

    id = AutoIncrementField()
    target_type = IntegerField()
    target_id = TextField()
    state = IntegerField(default=0)  # SendState
    save_fwd = IntegerField()
    ack2 = BooleanField()
    reliable = BooleanField(default=True)
    priority = IntegerField(default=0)
    domain = TextField(default="")
    data_type = TextField(default="")
    subtype = TextField(default="")
    key = TextField(default="")
    created_ms = BigIntegerField()
    expires_ms = BigIntegerField(null=True)
    encrypt = BooleanField(default=False)
    session_key = BlobField(default=b"")
    app_data = BlobField()
    attempts = IntegerField(default=0)
    inquiries = IntegerField(default=0)
    sent_ms = BigIntegerField(null=True)
    state_ms = BigIntegerField()
    last_inquiry_ms = BigIntegerField(null=True)
    due_ms = BigIntegerField(null=True)  # next inquiry (schema v5)
    code = IntegerField(default=0)  # ResultCode of a NACK
    receipt = BlobField(null=True)  # signed ACK2 receipt (security)

    class Meta:
        table_name = "outbox"
        indexes = ((("state", "priority", "id"), False),)


class Inbound(Model):
    """Pending-ack table (seed tb_0030): a received message whose platform
    ack (P_ACK_STATUS) or sender ack (S_ACK_STATUS) is outstanding."""

    id = AutoIncrementField()
    origin_type = IntegerField()
    origin_id = TextField()
    semq_id = IntegerField()
    semq_db_id = IntegerField()
    record_id = BigIntegerField()
    lk1_semq_id = IntegerField(default=0)
    lk1_semq_db_id = IntegerField(default=0)
    lk1_record_id = BigIntegerField(default=0)
    platform_type = IntegerField(default=2)
    platform_id = TextField(default="")
    p_ack = IntegerField()  # AckStatus
    s_ack = IntegerField()  # AckStatus
    received_ms = BigIntegerField()
    last_inquiry_ms = BigIntegerField()
    inquiries = IntegerField(default=0)

    class Meta:
        table_name = "inbound"
        indexes = (
            (("origin_type", "origin_id", "semq_id", "semq_db_id", "record_id"), True),
            (("p_ack", "s_ack"), False),  # dropped again by v7: no query reads it
        )


class Inbox(Model):
    """Documents delivered to the local applications, once each."""

    id = AutoIncrementField()
    origin_type = IntegerField()
    origin_id = TextField()
    semq_id = IntegerField()
    semq_db_id = IntegerField()
    record_id = BigIntegerField()
    domain = TextField(default="")
    data_type = TextField(default="")
    subtype = TextField(default="")
    key = TextField(default="")
    save_fwd = IntegerField()
    priority = IntegerField(default=0)
    created_ms = BigIntegerField()
    received_ms = BigIntegerField()
    encrypt = BooleanField(default=False)
    session_key = BlobField(default=b"")
    app_data = BlobField()
    consumed_ms = BigIntegerField(null=True)  # the application acknowledged it

    class Meta:
        table_name = "inbox"
        indexes = ((("consumed_ms", "id"), False),)


class Dedup(Model):
    """Exactly-once: every LK0 ever delivered, kept for the retention
    (docs/exactly-once.md)."""

    origin_type = IntegerField()
    origin_id = TextField()
    semq_id = IntegerField()
    semq_db_id = IntegerField()
    record_id = BigIntegerField()
    received_ms = BigIntegerField(index=True)

    class Meta:
        table_name = "dedup"
        primary_key = CompositeKey("origin_type", "origin_id", "semq_id", "semq_db_id", "record_id")
        without_rowid = True


class Receipt(Model):
    """Signed delivery receipts (ACK2 with the receiver's signature over the
    document's digest), kept after the pending-send row is cleaned up: the
    origin's proof of delivery (docs/security.md; like an AS2 MDN)."""

    record_id = BigIntegerField(primary_key=True)  # LK0 record id at this origin
    target_id = TextField()
    digest = BlobField()
    receipt = BlobField()  # a per-document proof (verify_receipt checks it alone)
    verified = IntegerField(default=0)
    received_ms = BigIntegerField()

    class Meta:
        table_name = "receipts"


MODELS = [Outbox, Inbound, Inbox, Dedup]  # schema version 1


def _v1(db: SqliteDatabase) -> None:
    create_tables(db, MODELS)


def _v2(db: SqliteDatabase) -> None:
    """Security: the digest each sent document was signed with (to verify
    its receipt), whether an inbox document came signed, the receipts."""
    db.execute_sql("ALTER TABLE outbox ADD COLUMN digest BLOB")
    db.execute_sql("ALTER TABLE inbox ADD COLUMN signer TEXT NOT NULL DEFAULT ''")
    create_tables(db, [Receipt])


class TxHalf(Model):
    """Transactional "half" messages (seed 002): kept here and never sent
    until the producer commits — then copied into the outbox in the same
    SQLite transaction that marks them COMMITTED — or rolls back
    (semq.node.features.txn, docs/seed-capabilities.md)."""

    id = AutoIncrementField()
    state = IntegerField(default=0)  # semq.node.features.txn.TxState
    target_id = TextField()
    save_fwd = IntegerField(default=3)
    ack2 = BooleanField(default=True)
    reliable = BooleanField(default=True)
    priority = IntegerField(default=0)
    domain = TextField(default="")
    data_type = TextField(default="")
    subtype = TextField(default="")
    key = TextField(default="")
    expires_ms = BigIntegerField(null=True)
    encrypt = BooleanField(default=False)  # already combined with the node's security setting
    app_data = BlobField()
    created_ms = BigIntegerField()
    state_ms = BigIntegerField()
    checks = IntegerField(default=0)  # check-backs asked so far
    next_check_ms = BigIntegerField(null=True)  # when to ask the application next (HALF only)
    outbox_id = BigIntegerField(null=True)  # LK0 record id once committed
    decided_by = TextField(default="")  # api, cli, checkback, person
    note = TextField(default="")  # last check-back answer / reason

    class Meta:
        table_name = "tx_half"
        indexes = ((("state", "next_check_ms"), False),)


class RpcRequest(Model):
    """Requests this node sent (seed 000 inquiry / update patterns), so that
    their replies are matched to them once, also when they come late."""

    record_id = BigIntegerField(primary_key=True)  # the request's LK0 record id here
    target_id = TextField()
    data_type = TextField(default="")
    sent_ms = BigIntegerField()
    timeout_ms = BigIntegerField(null=True)  # how long the sender meant to wait (informative)
    reply_inbox_id = BigIntegerField(null=True, unique=True)  # the one reply matched to it
    replied_ms = BigIntegerField(null=True)
    taken_ms = BigIntegerField(null=True)  # the application took the reply

    class Meta:
        table_name = "rpc_requests"


class RpcAnswer(Model):
    """Requests this node answered: one reply per request, recorded in the
    transaction that queued the reply."""

    request_inbox_id = BigIntegerField(primary_key=True)
    reply_record_id = BigIntegerField()  # the reply's LK0 record id here
    replied_ms = BigIntegerField()

    class Meta:
        table_name = "rpc_answers"


class QueueName(Model):
    """Named local durable queues (seed 004 persistent queue interface)."""

    name = TextField(primary_key=True)
    created_ms = BigIntegerField()

    class Meta:
        table_name = "queues"


class QueueItem(Model):
    """An item of a local queue; in flight while ``lease_until_ms`` is set
    and in the future (semq.node.features.queues)."""

    id = AutoIncrementField()
    queue = TextField()
    data = BlobField()
    enqueued_ms = BigIntegerField()
    lease_until_ms = BigIntegerField(null=True)  # NULL: ready
    deliveries = IntegerField(default=0)  # times dequeued (the lease token)

    class Meta:
        table_name = "queue_items"
        indexes = ((("queue", "lease_until_ms", "id"), False),)


SEED_MODELS = [TxHalf, RpcRequest, RpcAnswer, QueueName, QueueItem]  # schema version 3


def _v3(db: SqliteDatabase) -> None:
    """The other seeds' capabilities (docs/seed-capabilities.md): half messages, request/reply
    correlation, local queues. New tables only; v1/v2 tables unchanged."""
    create_tables(db, SEED_MODELS)
    # Replies are looked up by their correlation key while a requester waits;
    # a partial index costs nothing on the inbox's hot path for other documents.
    db.execute_sql(
        "CREATE INDEX inbox_rpc_reply ON inbox (key, id) WHERE domain='semq.rpc' AND subtype='reply'"
    )


def _v4(db: SqliteDatabase) -> None:
    """Send order is ``priority DESC, id``: an index in that order lets
    claim() read the next batch instead of sorting the whole backlog (with
    its blobs) per claim — 116 ms vs 0.26 ms per 512-row claim at 20k rows."""
    db.execute_sql("DROP INDEX IF EXISTS outbox_state_priority_id")
    db.execute_sql("CREATE INDEX outbox_send_order ON outbox (state, priority DESC, id)")


def _v5(db: SqliteDatabase) -> None:
    """When each outbox row's next inquiry is due, indexed: the inquiry loop reads
    the rows that are due instead of scanning the whole backlog (with its
    blobs) every tick — a 1 GB table per second at a million pending."""
    cols = {r[1] for r in db.execute_sql("PRAGMA table_info(outbox)").fetchall()}
    if "due_ms" not in cols:
        db.execute_sql("ALTER TABLE outbox ADD COLUMN due_ms INTEGER")
    db.execute_sql("UPDATE outbox SET due_ms=coalesce(last_inquiry_ms, 0) WHERE state IN (1, 2, 3)")
    db.execute_sql("CREATE INDEX IF NOT EXISTS outbox_due ON outbox (due_ms)"
                   " WHERE reliable=1 AND state IN (1, 2, 3)")
    # The platform's answers about our pending ACKs name the copy by LK1:
    # without this, one full scan of the pending-ack table per answer (half
    # of a receiver's time while it drained a 40k backlog).
    db.execute_sql("CREATE INDEX IF NOT EXISTS inbound_lk1 ON inbound (lk1_record_id) WHERE lk1_record_id != 0")


def _v6(db: SqliteDatabase) -> None:
    """A batch receipt is kept once, in ``receipt_batches`` (the signed root and
    the batch's LK0s in order); each document's receipt row points at it
    (``batch_id``, ``batch_index``) and its self-standing proof is derived
    when asked for (``NodeCore.receipt_proof``) instead of writing ~470 bytes
    per document at every ACK2. Rows written before keep their proof in
    ``receipt``."""
    cols = {r[1] for r in db.execute_sql("PRAGMA table_info(receipts)").fetchall()}
    if "batch_id" not in cols:
        db.execute_sql("ALTER TABLE receipts ADD COLUMN batch_id INTEGER")
        db.execute_sql("ALTER TABLE receipts ADD COLUMN batch_index INTEGER")
    db.execute_sql(
        "CREATE TABLE IF NOT EXISTS receipt_batches (id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " receiver TEXT NOT NULL, receipt BLOB NOT NULL, lk0s BLOB NOT NULL, received_ms INTEGER NOT NULL)")


def _v7(db: SqliteDatabase) -> None:
    """The due-inquiry index of v5 with its condition written ``state BETWEEN 1
    AND 3`` instead of ``state IN (1, 2, 3)``: the same rows, but SQLite
    evaluates an IN list of constants through a temporary table, and it
    evaluates a partial index's condition for the old and the new row of
    every UPDATE — 16 of the 35 us of SQL an origin spent per document
    (claim, ACK_FWD, ACK2; measured on the project's machine)."""
    db.execute_sql("DROP INDEX IF EXISTS outbox_due")
    db.execute_sql("CREATE INDEX outbox_due ON outbox (due_ms) WHERE reliable=1 AND state BETWEEN 1 AND 3")
    # The pending-ack table's (p_ack, s_ack) index (declared by v1's model) is
    # read by no query — the inquiry scan's OR cannot use it — yet every
    # REACK moves a row in it: 2.2 us per drained document at a receiver.
    db.execute_sql("DROP INDEX IF EXISTS inbound_p_ack_s_ack")


def _v8(db: SqliteDatabase) -> None:
    """Trust. ``outbox.clear_key``: the application asked for its AppKey in
    clear (by default it travels sealed inside the document). ``dedup.digest``:
    the digest of each document received with security, kept for the
    retention, so that the origin's inquiry is answered with a signed
    receipt (the origin confirms only by one), not an unsigned "received".
    ``refusals``: the signed refusals targets sent us (a document that did
    not reach their inbox), kept as long as receipts."""
    cols = {r[1] for r in db.execute_sql("PRAGMA table_info(outbox)").fetchall()}
    if "clear_key" not in cols:
        db.execute_sql("ALTER TABLE outbox ADD COLUMN clear_key INTEGER NOT NULL DEFAULT 0")
    cols = {r[1] for r in db.execute_sql("PRAGMA table_info(dedup)").fetchall()}
    if "digest" not in cols:
        db.execute_sql("ALTER TABLE dedup ADD COLUMN digest BLOB")
    db.execute_sql(
        "CREATE TABLE IF NOT EXISTS refusals (record_id INTEGER PRIMARY KEY, target_id TEXT NOT NULL,"
        " code INTEGER NOT NULL, proof BLOB NOT NULL, received_ms INTEGER NOT NULL)")


def _v9(db: SqliteDatabase) -> None:
    """The send order's index carries the target too: a claim skips the
    targets it must not send to now (waiting for a certificate, over the
    platform's quota) from the index, without reading each of their rows —
    100,000 rows waiting ahead of 20,000 others: 36 -> 8 ms per 1,024-row
    claim, measured on this project's machine."""
    db.execute_sql("DROP INDEX IF EXISTS outbox_send_order")
    db.execute_sql("CREATE INDEX outbox_send_order ON outbox (state, priority DESC, id, target_id)")


def _v10(db: SqliteDatabase) -> None:
    """Users and ordered channels (semq.node.envelope, semq.node.receiver.channels).
    ``outbox.envelope``: the bytes that start the document's AppData on the
    wire (NULL: none), with the users, channel and place it names kept in
    columns for reading; ``outbox.gap``: 1 once a failed ordered document's
    gap notice is queued. ``inbox`` gets the users and the channel.
    ``channel_out``: per target and channel, the last record id accepted
    (the next one names it). ``channel_in``: per origin and channel, the
    place last handed to the application and how many documents are held.
    ``channel_held``: documents that came before the one they follow (inbox
    columns, plus their place). ``users``: the node's users, with the
    SHA-256 of their token."""
    for table, cols in (
        ("outbox", ("envelope BLOB", "from_user TEXT NOT NULL DEFAULT ''", "to_user TEXT NOT NULL DEFAULT ''",
                    "channel TEXT NOT NULL DEFAULT ''", "prev_id INTEGER NOT NULL DEFAULT 0",
                    "gap INTEGER NOT NULL DEFAULT 0")),
        ("inbox", ("from_user TEXT NOT NULL DEFAULT ''", "to_user TEXT NOT NULL DEFAULT ''",
                   "channel TEXT NOT NULL DEFAULT ''")),
    ):
        have = {r[1] for r in db.execute_sql(f"PRAGMA table_info({table})").fetchall()}
        for col in cols:
            if col.split()[0] not in have:
                db.execute_sql(f"ALTER TABLE {table} ADD COLUMN {col}")
    # A user's unread documents, without reading the others' (partial: the
    # organization's own documents, to_user '', never enter it).
    db.execute_sql("CREATE INDEX IF NOT EXISTS inbox_user ON inbox (to_user, id) WHERE to_user != ''")
    # Failed ordered documents whose gap notice is not queued yet.
    db.execute_sql(f"CREATE INDEX IF NOT EXISTS outbox_gap ON outbox (id) WHERE channel != '' AND gap = 0"
                   f" AND state = {int(SendState.SS_FAILED)}")
    db.execute_sql("CREATE TABLE IF NOT EXISTS channel_out (target_id TEXT NOT NULL, channel TEXT NOT NULL,"
                   " last_id INTEGER NOT NULL, PRIMARY KEY (target_id, channel)) WITHOUT ROWID")
    db.execute_sql("CREATE TABLE IF NOT EXISTS channel_in (origin_id TEXT NOT NULL, channel TEXT NOT NULL,"
                   " last_pos INTEGER NOT NULL, held INTEGER NOT NULL DEFAULT 0, moved_ms INTEGER NOT NULL,"
                   " PRIMARY KEY (origin_id, channel)) WITHOUT ROWID")
    db.execute_sql(
        "CREATE TABLE IF NOT EXISTS channel_held (id INTEGER PRIMARY KEY AUTOINCREMENT, prev INTEGER NOT NULL,"
        " pos INTEGER NOT NULL, origin_type INTEGER NOT NULL, origin_id TEXT NOT NULL, semq_id INTEGER NOT NULL,"
        " semq_db_id INTEGER NOT NULL, record_id INTEGER NOT NULL, domain TEXT NOT NULL, data_type TEXT NOT NULL,"
        " subtype TEXT NOT NULL, key TEXT NOT NULL, save_fwd INTEGER NOT NULL, priority INTEGER NOT NULL,"
        " created_ms INTEGER NOT NULL, received_ms INTEGER NOT NULL, encrypt INTEGER NOT NULL,"
        " app_data BLOB NOT NULL, signer TEXT NOT NULL, from_user TEXT NOT NULL, to_user TEXT NOT NULL,"
        " channel TEXT NOT NULL)")
    db.execute_sql("CREATE INDEX IF NOT EXISTS channel_held_prev ON channel_held (origin_id, channel, prev)")
    db.execute_sql("CREATE TABLE IF NOT EXISTS users (name TEXT PRIMARY KEY, token_sha256 TEXT NOT NULL,"
                   " os_user TEXT NOT NULL DEFAULT '', created_ms INTEGER NOT NULL)")


def _v11_receive(db: SqliteDatabase) -> None:
    """``semq receive`` (semq.node.features.receiving): per inbox document its
    command failed for, the tries so far, the last exit status and the end
    of its stderr, when the next try is due, and once it has failed too
    often, when it was parked (a dead letter of the receiving side). The
    row goes when the document is acknowledged."""
    db.execute_sql(
        "CREATE TABLE IF NOT EXISTS receive_tries (inbox_id INTEGER PRIMARY KEY, tries INTEGER NOT NULL,"
        " last_code INTEGER, stderr_tail TEXT NOT NULL DEFAULT '', first_ms INTEGER NOT NULL,"
        " last_ms INTEGER NOT NULL, next_ms INTEGER NOT NULL, parked_ms INTEGER)")


def _v12_watch(db: SqliteDatabase) -> None:
    """Folders (``semq watch``, semq.node.features.folders). ``watch_files``: each
    file taken from an outbox folder, written in the transaction that
    accepts its document — the folder and the file's name (bytes, as the file
    system gives it), its SHA-256, size and the document's LK0 — and
    ``moved_ms`` once the file is in ``sent/``. A file in the folder whose
    name and digest match a row not moved yet was accepted before a crash:
    it is moved, never sent again. At most one such row per (folder, name)."""
    db.execute_sql(
        "CREATE TABLE IF NOT EXISTS watch_files (id INTEGER PRIMARY KEY AUTOINCREMENT, folder BLOB NOT NULL,"
        " name BLOB NOT NULL, sha256 BLOB NOT NULL, size INTEGER NOT NULL, lk0 TEXT NOT NULL,"
        " accepted_ms INTEGER NOT NULL, moved_ms INTEGER)")
    db.execute_sql("CREATE UNIQUE INDEX IF NOT EXISTS watch_files_pending ON watch_files (folder, name)"
                   " WHERE moved_ms IS NULL")


def _v13_large(db: SqliteDatabase) -> None:
    """Large documents (semq.node.large): ``outbox.large`` marks a manifest
    row; ``large_out`` holds, per such row, the content's file in the data
    directory and the manifest (with its key); ``large_in`` a document being
    received: where its chunks are written, what of its manifest the
    delivery needs, and ``through`` (chunks below it are written and
    synced); ``inbox.path`` and ``inbox.size`` a delivered large document's
    file (its ``app_data`` is empty)."""
    db.execute_sql("ALTER TABLE outbox ADD COLUMN large INTEGER NOT NULL DEFAULT 0")
    db.execute_sql(
        "CREATE TABLE IF NOT EXISTS large_out (id INTEGER PRIMARY KEY, path TEXT NOT NULL,"
        " manifest BLOB NOT NULL, size INTEGER NOT NULL, created_ms INTEGER NOT NULL)")
    db.execute_sql(
        "CREATE TABLE IF NOT EXISTS large_in (id INTEGER PRIMARY KEY AUTOINCREMENT, origin_type INTEGER NOT NULL,"
        " origin_id TEXT NOT NULL, semq_id INTEGER NOT NULL, semq_db_id INTEGER NOT NULL,"
        " record_id INTEGER NOT NULL, path TEXT NOT NULL, manifest BLOB NOT NULL, frame BLOB NOT NULL,"
        " digest BLOB, signer TEXT NOT NULL, domain TEXT NOT NULL, data_type TEXT NOT NULL,"
        " subtype TEXT NOT NULL, key TEXT NOT NULL, envelope BLOB, through INTEGER NOT NULL DEFAULT 0,"
        " bad INTEGER NOT NULL DEFAULT 0, started_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL,"
        " UNIQUE (origin_type, origin_id, semq_id, semq_db_id, record_id))")
    db.execute_sql("ALTER TABLE inbox ADD COLUMN path TEXT")
    db.execute_sql("ALTER TABLE inbox ADD COLUMN size INTEGER")


def _v14_edge(db: SqliteDatabase) -> None:
    """The edge (semq.edge.store): partners that speak AS2 or AS4
    (``edge_partners``, keyed by protocol and their id), our documents to
    them (``edge_out``: the state through ``EDGE_TABLE``, the message id
    every resend reuses, the receipt kept as proof), and their messages to
    us (``edge_in``: once per (partner, message id), with the receipt
    answered, answered again to a resend)."""
    db.execute_sql(
        "CREATE TABLE IF NOT EXISTS edge_partners (protocol TEXT NOT NULL, id TEXT NOT NULL, url TEXT NOT NULL,"
        " cert BLOB NOT NULL, our_id TEXT NOT NULL, options TEXT NOT NULL, added_ms INTEGER NOT NULL,"
        " PRIMARY KEY (protocol, id))")
    db.execute_sql(
        "CREATE TABLE IF NOT EXISTS edge_out (id INTEGER PRIMARY KEY AUTOINCREMENT, protocol TEXT NOT NULL,"
        " partner TEXT NOT NULL, state INTEGER NOT NULL, doc_key TEXT NOT NULL, content BLOB NOT NULL, content_type TEXT NOT NULL,"
        " message_id TEXT, digest TEXT, tries INTEGER NOT NULL DEFAULT 0, next_ms INTEGER NOT NULL,"
        " created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL, reason TEXT, proof BLOB)")
    db.execute_sql("CREATE INDEX IF NOT EXISTS edge_out_due ON edge_out (state, next_ms)")
    db.execute_sql(
        "CREATE TABLE IF NOT EXISTS edge_in (id INTEGER PRIMARY KEY AUTOINCREMENT, protocol TEXT NOT NULL,"
        " partner TEXT NOT NULL, message_id TEXT NOT NULL, received_ms INTEGER NOT NULL, digest TEXT NOT NULL,"
        " status INTEGER NOT NULL, headers TEXT NOT NULL, receipt BLOB NOT NULL,"
        " UNIQUE (protocol, partner, message_id))")


def _v15_edge_sent(db: SqliteDatabase) -> None:
    """The message an edge document was first sent as (``sent_headers`` as
    JSON, ``sent_body``), kept until it is confirmed or refused: every resend,
    also after a restart, posts those very bytes, so a partner that answers a
    duplicate with its first receipt confirms it (an AS4 receipt names the
    digests of the first message's signature)."""
    db.execute_sql("ALTER TABLE edge_out ADD COLUMN sent_headers TEXT")
    db.execute_sql("ALTER TABLE edge_out ADD COLUMN sent_body BLOB")


MIGRATIONS = [_v1, _v2, _v3, _v4, _v5, _v6, _v7, _v8, _v9, _v10, _v11_receive, _v12_watch, _v13_large, _v14_edge,
              _v15_edge_sent]


# A store incarnation's record ids start at its creation time in microsecond
# units: ``now_ms * 1000`` (docs/exactly-once.md, "Why a record id is never
# reused"). An incarnation made later numbers above anything an earlier one
# of the same organization could have reached, unless that one averaged more
# than ID_RATE documents per second over its whole life.
ID_RATE: Final = 1_000_000  # record ids per second of a store's life the floor allows
INCARNATION_TABLES: Final = ("outbox", "inbound")  # LK0 record ids; pending-ack ids that acks name
INCARNATION_REASONS: Final = ("init", "restore")


def id_floor(now_ms: int) -> int:
    """The record-id floor of a store incarnation begun at ``now_ms``."""
    return now_ms * (ID_RATE // 1000)


def begin_incarnation(conn: sqlite3.Connection, reason: str, now_ms: int | None = None) -> int:
    """Start a new incarnation of the node store on ``conn`` (a connection
    in autocommit mode; this runs its own transaction): the AUTOINCREMENT
    sequences of ``outbox`` (LK0 record ids) and ``inbound`` (the pending-ack
    ids that ACK/ACK2 name) go to ``max(current, id_floor(now_ms))``, and
    the incarnation (time, reason, floor) is recorded in ``meta``
    (``incarnation``, and appended to the list ``incarnations``).

    ``reason`` is "init" (``semq node init``: a new store, perhaps for an
    organization that had one before) or "restore" (``semq restore``: a
    copy that may be older than ids already sent). Either way receivers
    remember the LK0s the previous incarnation sent (their dedup table), and
    a reused id would be suppressed as a duplicate: a document lost.
    Returns the floor."""
    if reason not in INCARNATION_REASONS:
        raise ValueError(f"incarnation reason {reason!r} is not one of {', '.join(INCARNATION_REASONS)}")
    ts = int(time.time() * 1000) if now_ms is None else now_ms
    floor = id_floor(ts)
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table in INCARNATION_TABLES:
            cur = next_row_id(conn, table) - 1
            seq = max(cur, floor)
            if not conn.execute("UPDATE sqlite_sequence SET seq=? WHERE name=?", (seq, table)).rowcount:
                conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table, seq))
        row = conn.execute("SELECT value FROM meta WHERE key='incarnations'").fetchone()
        history = json.loads(row[0]) if row else []
        this = {"reason": reason, "time_ms": ts, "floor": floor}
        history.append(this)
        conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                         [("incarnation", json.dumps(this)), ("incarnations", json.dumps(history))])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return floor


def incarnation(conn: sqlite3.Connection) -> dict[str, Any] | None:
    """The store's current incarnation (reason, time_ms, floor), or None for
    a store made before incarnations were recorded."""
    row = conn.execute("SELECT value FROM meta WHERE key='incarnation'").fetchone()
    return json.loads(row[0]) if row else None


def open_node_store(path: Path, *, create: bool = False, synchronous: str = "FULL",
                    check: bool = False, incarnation: str | None = None) -> SqliteDatabase:
    """Open (``create``: make) a node store. ``incarnation`` ("init", for
    ``semq node init``) begins an incarnation: record ids from now on start
    at the store's creation time (begin_incarnation)."""
    db = open_store(path, MIGRATIONS, create=create, synchronous=synchronous, kind="node store", check=check)
    if incarnation is not None:
        try:
            begin_incarnation(db.connection(), incarnation)
        except STORE_ERRORS as e:
            db.close()
            raise translate(e, path, "node store") from e
    return db
