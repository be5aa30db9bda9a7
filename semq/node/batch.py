"""What the node core's roles share: the store and identity (``NodeContext``),
one batch's working state (``Batch``) and what a batch produced (``Output``).

The roles (semq.node.origin, semq.node.receiver, inquiries, housekeeping)
and the owners of the tables hold no per-batch state of their own: a batch's dedup look-ups, rows to
insert, acks to send and confirmations found travel in its ``Batch``, made
by the facade (semq.node.core) for one transaction and dropped after it.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from peewee import SqliteDatabase

from semq.identity.crypto import make_batch_receipt
from semq.identity.security import NodeSecurity
from semq.tracking.events import EventLog, now_ms
from semq.umxt_protocol import (
    LK0,
    AckBatch,
    AckEntry,
    Endpoint,
    Frame,
    Kind,
    RawFrame,
    ResultCode,
    encode_frame,
)

__all__ = ["RECEIPT_BATCH", "Batch", "Events", "NodeContext", "Output"]

Events = list[dict[str, Any]]
RECEIPT_BATCH: Final = 10_000  # documents one batch receipt signs (entries of one ACK_BATCH)


def _by_unit(entries: list[AckEntry], digests: list[Any]) -> list[tuple[list[AckEntry], list[Any]]]:
    """Acks for one peer, one list per unit of the peer whose record they
    name (``dest_semq_id``, semq.umxt_protocol.units): the relay gives each unit its own,
    and a batch receipt signs one list whole. ``digests`` (aligned with
    ``entries``, or not given) go with their entries."""
    if not entries:
        return []
    first = entries[0].dest_semq_id
    if all(e.dest_semq_id == first for e in entries):  # one unit: the common case, nothing copied
        return [(entries, digests)]
    aligned = len(digests) == len(entries)
    groups: dict[int, tuple[list[AckEntry], list[Any]]] = {}
    for i, e in enumerate(entries):
        g = groups.setdefault(e.dest_semq_id, ([], []))
        g[0].append(e)
        if aligned:
            g[1].append(digests[i])
    return list(groups.values())


@dataclass
class Output:
    """What a batch produced: bytes to send (after the commit, which has
    happened when the method returns) and counters for the caller."""

    data: list[bytes] = field(default_factory=list)
    delivered: int = 0  # new inbox documents
    missing: set[Endpoint] = field(default_factory=set)  # certificates to ask the platform for
    over_window: int = 0  # documents the platform refused with OVER_WINDOW
    deferred: list[RawFrame] = field(default_factory=list)  # DATA waiting for its origin's certificate
    settled: int = 0  # outbox rows that got their platform ack / NACK (window credit)
    settled_ids: list[int] = field(default_factory=list)  # ... their record ids
    sent_ids: list[int] = field(default_factory=list)  # reliable rows a claim sent (their answers are awaited)
    targets: set[str] = field(default_factory=set)  # organizations a claim sent to
    early: int = 0  # DATA frames that left through the claim's port before the commit
    local: list[bytes] = field(default_factory=list)  # DATA a claim made for users of this node itself
    # Security: ACK2 entries whose receipt was missing or did not verify, and
    # refusals (NACK from a target) whose signature did not: each left its
    # row open (the origin asks the target again).
    bad_receipts: int = 0
    bad_refusals: int = 0
    # Targets whose documents the platform would not store now: our quota
    # there is used up (QUOTA_EXCEEDED); the rows went back to SS_INIT.
    over_quota: set[str] = field(default_factory=set)
    errors: list[tuple[ResultCode, str]] = field(default_factory=list)
    # CHUNK_ACKs for our large documents: (semq.node.large.outgoing.Outgoing,
    # through, resume, stored at the platform), for the daemon's LargeSender.
    chunk_acks: list[tuple[Any, int, bool, bool]] = field(default_factory=list)

    def add(self, frame: Frame) -> None:
        self.data.append(encode_frame(frame))


@dataclass
class NodeContext:
    """The store and identity every role of the node core works with.
    ``inquiry_ms``, ``skew_ms``, ``platform`` and ``log`` change at run
    time (a reload, the platform's WELCOME, a transaction's log kept until its commit)."""

    path: Path
    db: SqliteDatabase
    conn: sqlite3.Connection
    me: Endpoint
    platform: Endpoint
    sec: NodeSecurity | None
    log: EventLog | None
    inquiry_ms: int
    skew_ms: int
    unit: int = 1  # this process's unit of the node (semq_id of its LK0s; semq.umxt_protocol.units)
    units: int = 1  # the node's units (semq.umxt_protocol.units)
    # Unit 1's store, for a unit K > 1 of the node: unit 1 keeps the ordered
    # channels, so it may hold a document whose LK0 picks this unit
    # (semq.node.receiver.inbox looks there too). None: this is unit 1.
    first_unit_store: Path | None = None

    def lk0(self, record_id: int) -> LK0:
        """The LK0 of one of this store's records."""
        return LK0(endpoint=self.me, semq_id=self.unit, record_id=record_id)

    def lk0_text(self, record_id: int) -> str:
        return f"{self.me.node_id}/{self.unit}/1/{record_id}"

    @staticmethod
    def now() -> int:
        """The node's clock, in ms (tests move it: ``semq.node.batch.now_ms``)."""
        return now_ms()

    def emit(self, records: Events) -> None:
        if self.log and records:
            self.log.write(records)


@dataclass
class Batch:
    """One batch of frames from the platform, handled in one transaction."""

    ts: int
    out: Output = field(default_factory=Output)
    events: Events = field(default_factory=list)
    # Acks to send after the commit, per (kind, peer): ACK to the platform,
    # ACK2 to origins, REACK2 to receivers.
    acks: defaultdict[tuple[Kind, Endpoint], list[AckEntry]] = field(default_factory=lambda: defaultdict(list))
    # Per origin, (LK0, digest) of the documents our ACK2s confirm: the
    # batch receipt signs them.
    digests: defaultdict[Endpoint, list[tuple[Any, bytes]]] = field(default_factory=lambda: defaultdict(list))
    certs: dict[Endpoint, Any] = field(default_factory=dict)  # one directory look-up per origin per batch
    # Confirmations of pending-ack rows found in this batch: REACK ids (from
    # the platform), REACK2 (id, the sender's org: checked against the
    # row's origin). Applied together before a frame of another kind.
    reacks: list[int] = field(default_factory=list)
    reack2s: list[tuple[int, str]] = field(default_factory=list)
    # The creation times a new document may have: not in the future, not
    # older than the duplicate suppression remembers.
    window: tuple[int, int] = (0, 0)
    # DATA for us opened and verified together (security on), by id(raw).
    opened: dict[int, tuple[Frame, Any]] = field(default_factory=dict)
    # The receiver's dedup look-up of the batch's DATA, and its rows to insert.
    known: set[tuple[Any, ...]] = field(default_factory=set)
    new_dedup: list[tuple[Any, ...]] = field(default_factory=list)
    new_inbox: list[tuple[Any, ...]] = field(default_factory=list)
    next_inbound: int = 0  # the next pending-ack id to give out (0: not read yet)
    # The frames came over a direct link from this organization (None: from
    # the platform): the receiver answers every reliable document with ACK2,
    # keeps no pending-ack row for it, and our ACK2s from it get no REACK2.
    direct: Endpoint | None = None

    def ack_frames(self, me: Endpoint, sec: NodeSecurity | None) -> None:
        """The batch's acks into ``out``, one ACK_BATCH per (kind, peer, unit
        of the peer) and up to RECEIPT_BATCH entries; ACK2s with one receipt
        over their documents' digests (docs/security.md)."""
        for (kind, target), all_entries in self.acks.items():
            all_digests = self.digests.get(target, []) if kind is Kind.ACK2 else []
            for entries, digests in _by_unit(all_entries, all_digests):
                for i in range(0, len(entries), RECEIPT_BATCH):
                    receipt = b""
                    if sec is not None and len(digests) == len(entries):
                        receipt = make_batch_receipt(digests[i:i + RECEIPT_BATCH], sec.identity.keys.signing_key)
                    self.out.add(Frame(kind=Kind.ACK_BATCH, source=me, target=target,
                                       body=AckBatch(ack_kind=kind, entries=tuple(entries[i:i + RECEIPT_BATCH]),
                                                     receipt=receipt)))
