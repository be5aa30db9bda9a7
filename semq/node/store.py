"""The node's SQLite schema (peewee models for schema and migrations; the hot
paths in semq.node.core run prepared SQL on the same connection, because
building SQL through the ORM costs ~95 us per query here — MEASUREMENTS)."""

from __future__ import annotations

from pathlib import Path

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

from semq._db import create_tables, open_store

__all__ = ["MIGRATIONS", "MODELS", "Dedup", "Inbound", "Inbox", "Outbox", "Receipt", "open_node_store"]


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
            (("p_ack", "s_ack"), False),
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
    origin's proof of delivery (security issue; like an AS2 MDN)."""

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


MIGRATIONS = [_v1, _v2]


def open_node_store(path: Path, *, create: bool = False, synchronous: str = "FULL") -> SqliteDatabase:
    return open_store(path, MIGRATIONS, create=create, synchronous=synchronous, kind="node store")
