"""The node's synchronous core: store + engine, one transaction per batch.

Every public method runs in one SQLite transaction and returns the frames
(encoded bytes) that may leave only after it returned, i.e. after COMMIT —
SPEC: "every state change is committed before the acknowledgement that
depends on it leaves the process". The trio daemon calls these on one
worker thread per store (semq.node.daemon).
"""

from __future__ import annotations

import os
import sqlite3
import struct
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from peewee import SqliteDatabase

from semq._db import (
    HOLD_MS,
    STORE_ERRORS,
    HeldWrites,
    SendOrder,
    StoreError,
    delete_by_id,
    next_row_id,
    rows_by_id,
    split_held,
    take_held,
    translate,
)
from semq.crypto import (
    CryptoError,
    UnknownCertificate,
    ack_entry_lk0,
    document_aad_fields,
    document_aad_template,
    document_digest,
    document_salt,
    document_salts,
    enclose_app_key,
    make_batch_receipt,
    make_refusal,
    open_documents,
    protect_documents,
    raw_frame_aad,
    receipt_proofs,
    split_app_key,
    verify_batch_receipt,
    verify_refusal,
)
from semq.events import EventLog, now_ms
from semq.security import NodeSecurity
from semq.umxt_protocol import (
    FLAG_ACK2,
    FLAG_ENCRYPT,
    FLAG_KEY_SEALED,
    FLAG_RELIABLE,
    LK0,
    LK1,
    Ack,
    AckBatch,
    AckEntry,
    AckFlag,
    AppKey,
    Data,
    Endpoint,
    ForwardFlag,
    Frame,
    Inquiry,
    InquiryAnswer,
    InquiryFlag,
    InquiryResp,
    InquiryResult,
    InquiryTopic,
    Kind,
    Nack,
    NodeType,
    RawFrame,
    RemoteProtocolError,
    ResultCode,
    SaveFwd,
    encode_data,
    encode_frame,
)

from .engine import (
    AckStatus,
    OriginEvent,
    SendState,
    origin_step,
    receive_decision,
    receiver_may_clean,
)
from .limits import MAX_DOCUMENT_SIZE, DocumentTooLarge
from .store import open_node_store

__all__ = ["NewDocument", "NodeCore", "Output"]

MAX_INQUIRY_BACKOFF_MS: Final = 15 * 60 * 1000  # long-offline targets: ask at most every 15 min
INQUIRY_BATCH: Final = 1000
# Pending-ack rows one inquiry round looks at (by id, resuming where the last
# round stopped): the round runs every second inside a write transaction, and
# reading the whole table cost 270 ms per round at 1,000,000 rows (an origin
# offline for long while its stored documents drained). An index on the due
# time would cost every received document an index entry and its removal.
INBOUND_SWEEP: Final = 20_000
DEDUP_RETENTION_MS: Final = 30 * 24 * 3600 * 1000  # docs/exactly-once.md
# How far a sender's clock may be off ours. A document is refused (STALE)
# when its signed creation time lies more than this in the future, or
# further in the past than DEDUP_RETENTION_MS minus this: its dedup row
# could be gone, and a copy replayed then would be delivered twice
# (docs/exactly-once.md). Configurable (``clock_skew`` in semq.toml).
DEFAULT_CLOCK_SKEW_MS: Final = 10 * 60 * 1000
FAILED_RETENTION_MS: Final = 7 * 24 * 3600 * 1000
RECEIPT_RETENTION_MS: Final = 400 * 24 * 3600 * 1000  # proofs of delivery: over a year
_LK0_REF: Final = struct.Struct(">HHQ")  # semq_id, semq_db_id, record_id of a batch receipt's entry


_NO_KEY: Final = AppKey()
_NO_KEY_PARTS: Final = ("", "", "", "")


def document_flags(reliable: bool, ack2: bool, encrypt: bool, key_sealed: bool) -> int:
    """The DATA header flags a document is sent with (its AAD binds them)."""
    return ((FLAG_RELIABLE if reliable else 0) | (FLAG_ACK2 if ack2 else 0)
            | (FLAG_ENCRYPT if encrypt else 0) | (FLAG_KEY_SEALED if key_sealed else 0))


@dataclass(frozen=True, kw_only=True)
class NewDocument:
    """What an application hands over (SPEC A.1)."""

    target: str
    app_data: bytes
    app_key: AppKey = _NO_KEY
    save_fwd: SaveFwd = SaveFwd.MUST_DELIVER
    ack2: bool = True
    reliable: bool = True
    priority: int = 0
    expires_ms: int | None = None
    encrypt: bool = False
    session_key: bytes = b""
    created_ms: int | None = None
    # The AppKey travels sealed inside the document (the relay routes
    # without it) unless the application asks for it in clear; without
    # encryption it is in clear anyway.
    clear_app_key: bool = False


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
    early: int = 0  # DATA frames handed to ``claim(early=...)`` before the commit
    # Security: ACK2 entries whose receipt was missing or did not verify, and
    # refusals (NACK from a target) whose signature did not: each left its
    # row open (the origin asks the target again).
    bad_receipts: int = 0
    bad_refusals: int = 0
    # Targets whose documents the platform would not store now: our quota
    # there is used up (QUOTA_EXCEEDED); the rows went back to SS_INIT.
    over_quota: set[str] = field(default_factory=set)
    errors: list[tuple[ResultCode, str]] = field(default_factory=list)

    def add(self, frame: Frame) -> None:
        self.data.append(encode_frame(frame))


_OUT_COLS: Final = (
    "id, target_type, target_id, state, save_fwd, ack2, reliable, priority, domain, data_type,"
    " subtype, key, created_ms, expires_ms, attempts, length(app_data)"
)
# What a claim reads of a row: _OUT_COLS, then [16] encrypt, [17] session_key,
# [18] app_data, [19] clear_key. With security, _protect replaces [17] and
# [18] by the sealed document and [19] by whether its AppKey is sealed inside,
# and appends [20] the digest it was signed with.
_CLAIM_COLS: Final = f"{_OUT_COLS}, encrypt, session_key, app_data, clear_key"


_EVENT_NAME: Final = {OriginEvent.ACK_FWD: "ack_fwd", OriginEvent.ACK_SAVE: "ack_save",
                      OriginEvent.NACK: "nack", OriginEvent.PLATFORM_LACKS: "resend",
                      OriginEvent.TARGET_LACKS: "resend"}
_SEND_STATES: Final = {int(s): s for s in SendState}
# The event-log name of each origin event (PLATFORM_HAS: the platform had it,
# its ack was lost: logged as the ack_fwd it stands for; NACK: see below).
_EVENT_NAMES: Final = {ev: _EVENT_NAME.get(ev, "ack2") for ev in OriginEvent} | {
    OriginEvent.PLATFORM_HAS: "ack_fwd"}
# origin_step per (state, event, save_fwd, ack2) of a row: pure, so computed
# once per combination (a dict look-up instead of lru_cache's keyword key).
_STEPS: dict[tuple[int, OriginEvent, int, int], Any] = {}
_SS_INIT: Final = int(SendState.SS_INIT)
_SS_SENT: Final = int(SendState.SS_SENT)
_SS_ACK_FWD: Final = int(SendState.SS_ACK_FWD)
# Three writes wait in memory for up to HOLD_MS (semq._db) for the frame that
# usually makes them moot within a fraction of a second: a claimed row's
# SS_SENT (NodeCore.claim says why) and its SS_ACK_FWD (for its ACK2;
# NodeCore._origin_apply), and a new pending-ack row (for REACK2 and REACK;
# NodeCore._receive). Then NodeCore.write_held writes them.
_INBOUND_INSERT: Final = (
    "INSERT OR IGNORE INTO inbound (id, origin_type, origin_id, semq_id, semq_db_id, record_id,"
    " lk1_semq_id, lk1_semq_db_id, lk1_record_id, platform_type, platform_id, p_ack, s_ack,"
    " received_ms, last_inquiry_ms) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)")
_SS_ACK2: Final = int(SendState.SS_ACK2)
_ANSWER_ACKED: Final = InquiryResult.ALREADY_ACKED
_ANSWER_MARKED: Final = InquiryResult.MARKED_ACKED
_DELIVERY: Final = int(AckFlag.DELIVERY)
# receive_decision per (duplicate, has_lk1, ack2, reliable): pure, computed once.
_DECISIONS: dict[tuple[bool, bool, bool, bool], Any] = {}
# receiver_may_clean over the stored (p_ack, s_ack) integers.
_MAY_CLEAN: Final = {(int(p), int(q)): receiver_may_clean(p, q) for p in AckStatus for q in AckStatus}


class NodeCore(HeldWrites):
    """One organization's store and SEMQ rules. Not thread-safe: one caller
    at a time (the daemon's store gate)."""

    def __init__(
        self,
        store_path: Path,
        org: str,
        *,
        events_dir: Path | None = None,
        create: bool = False,
        synchronous: str = "FULL",
        inquiry_interval: float = 15.0,
        platform: Endpoint | None = None,
        security: NodeSecurity | None = None,
        check: bool = False,
        clock_skew: float = DEFAULT_CLOCK_SKEW_MS / 1000,
    ) -> None:
        self.path = Path(store_path)
        self.skew_ms = int(clock_skew * 1000)
        # With security, DATA is signed (and sealed unless the sender asked
        # --no-encrypt) when it is sent, and verified before the inbox.
        self.sec = security
        self.me = Endpoint.org(org)
        self.platform = platform or Endpoint.platform()
        self.db: SqliteDatabase = open_node_store(self.path, create=create, synchronous=synchronous, check=check)
        self.conn: sqlite3.Connection = self.db.connection()
        self.inquiry_ms = int(inquiry_interval * 1000)
        self._inbound_sweep = 0  # the pending-ack id after which the next inquiry round reads
        self.log = EventLog(events_dir, f"org:{org}", "origin") if events_dir else None
        # Claimed rows whose SS_SENT is not written yet (SS_INIT on disk):
        # id -> (time of the claim, attempts with this one, the row's
        # target_id, save_fwd, ack2: what _origin_apply needs of a row, so
        # the acks of a claimed row do not read it again; and with security
        # the digest it was signed with, or None once it is written),
        # oldest first. A digest is written (``receipts``) with the receipt
        # that names it, or when its SS_SENT leaves memory any other way.
        self._held_sent: dict[int, tuple[int, int, str, int, int, bytes | None]] = {}
        # Where the claims read the send order from: after the held rows.
        # Forgotten whenever a row may have become SS_INIT below that point (a
        # resend, the operator, another process: every inquiry round).
        self._order = SendOrder("outbox")
        # Rows whose ACK_FWD came and whose SS_ACK_FWD is not written yet:
        # id -> (time of the ACK_FWD, code), oldest first (_origin_apply).
        self._held_fwd: dict[int, tuple[int, int]] = {}
        # Pending-ack rows not written yet: id -> the row as _INBOUND_INSERT
        # takes it (received_ms at [13], oldest first), and LK0 key -> id.
        self._held_in: dict[int, tuple[Any, ...]] = {}
        self._held_in_keys: dict[tuple[Any, ...], int] = {}
        self._inbound_floor = 0  # no pending-ack id below this is given out again
        self._salt_key: bytes | None = None  # (security) read by the first claim: _document_salt_key
        self._unknown_key_at: dict[Endpoint, int] = {}  # origin -> when a document of it waited for its key

    def _document_salt_key(self) -> bytes:
        """The key the salts of our signed documents are made with
        (crypto.document_salt): every copy of a document gets the same salt,
        so the same digest, whichever copy the receiver's receipt is about.
        Made once and kept in the store's ``meta`` table, in a transaction
        of its own: a resend after a restart, or after the signing key
        rolled over, still has its first copy's digest."""
        if self._salt_key is None:
            with self.db.atomic():
                self.conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('document_salt_key', ?)",
                                  (os.urandom(32).hex(),))
                row = self.conn.execute("SELECT value FROM meta WHERE key='document_salt_key'").fetchone()
            self._salt_key = bytes.fromhex(row[0])
        return self._salt_key

    def close(self) -> None:
        try:
            self.write_held_now()
        except STORE_ERRORS:
            # Lost as in a crash: the rows stay SS_INIT (sent again; the
            # receiver's duplicate suppression) or SS_SENT (the platform is
            # asked and says "forwarded"); the pending-ack rows' documents are in
            # the inbox and dedup, which answer the inquiries of their
            # origin and platform.
            pass
        if self.log:
            self.log.close()
        self.db.close()

    def write_held(self, before_ms: int | None = None) -> None:
        """Write what is held in memory (all of it, or what was held at or
        before ``before_ms``), inside the caller's transaction: SS_SENT states
        of rows still SS_INIT on disk, then SS_ACK_FWD states of rows SS_SENT
        on disk (a row's ACK_FWD is never held longer than its SS_SENT), and
        pending-ack rows with the confirmations they have got so far."""
        if before_ms is None:
            self.reread_send_order()  # the operator's commands, close, reconnect, dead letters
        sent = take_held(self._held_sent, before_ms, 0) if self._held_sent else []
        if sent:  # as claim() wrote it before the hold
            self.conn.executemany(
                "UPDATE outbox SET state=1, attempts=?, sent_ms=?, state_ms=?, last_inquiry_ms=?, due_ms=?"
                " WHERE id=? AND state=0",
                [(a, t, t, t, self._first_inquiry(t, a), rid) for rid, (t, a, *_) in sent])
            self._write_digests([(rid, h[2], h[5]) for rid, h in sent if h[5] is not None])
        items = take_held(self._held_fwd, before_ms, 0) if self._held_fwd else []
        if items:
            # The row is still SS_SENT on disk; any other state was written since.
            self.conn.executemany(
                f"UPDATE outbox SET state={_SS_ACK_FWD}, state_ms=?, code=?, inquiries=0, last_inquiry_ms=?,"
                " due_ms=?+min(?, ?*(1 << min(max(attempts-1, 0), 6))) WHERE id=? AND state=1",
                [(t, c, t, t, MAX_INQUIRY_BACKOFF_MS, self.inquiry_ms, rid) for rid, (t, c) in items])
        rows = [row for _, row in take_held(self._held_in, before_ms, 13)] if self._held_in else []
        if rows:  # (a batch that finds nothing old enough costs no statement)
            keys = self._held_in_keys
            for row in rows:
                keys.pop(row[1:6], None)
            self.conn.executemany(_INBOUND_INSERT, rows)

    # ------------------------------------------------------------ helpers

    def _write_digests(self, rows: Sequence[tuple[int, str, bytes]]) -> None:
        """The digests (record id, target, digest) our documents were signed
        with, kept apart from the pending-send rows: a receipt may come
        after an inquiry answer has cleaned the row. A copy's digest is
        its first's (deterministic salts), so an existing row stays."""
        self.conn.executemany(
            "INSERT OR IGNORE INTO receipts (record_id, target_id, digest, receipt, verified, received_ms)"
            " VALUES (?, ?, ?, x'', 0, 0)", rows)

    def _first_inquiry(self, ts: int, attempts: int) -> int:
        """When a row in a new state (at ``ts``, after ``attempts`` sends)
        asks first: one interval later, doubled per resend (SPEC A.3; the
        SQL of _origin_apply computes the same from the row's attempts)."""
        return ts + min(MAX_INQUIRY_BACKOFF_MS, self.inquiry_ms * (1 << min(max(attempts - 1, 0), 6)))

    def _drop_held(self) -> None:
        # A transaction that did not commit may have changed the held writes
        # (rows received in it, states written from memory): all dropped.
        self._held_sent.clear()
        self._order.forget()
        self._held_fwd.clear()
        self._held_in.clear()
        self._held_in_keys.clear()

    def _emit(self, records: list[dict[str, Any]]) -> None:
        if self.log and records:
            self.log.write(records)

    def _origin_event(self, row: Sequence[Any], event: str, ts: int, **extra: Any) -> dict[str, Any]:
        # The message's attributes were logged with "queued"; later events
        # name it and say what happened (docs/events.md).
        return {"ts": ts, "role": "origin", "event": event, "lk0": f"{self.me.node_id}/1/1/{row[0]}",
                "source": self.me.node_id, "target": row[2], "attempt": row[14], **extra}

    # ------------------------------------------------------------ API side

    def accept(self, docs: Iterable[NewDocument]) -> list[LK0]:
        """Write documents to the pending-send table (SS_INIT). Durable when
        this returns. Raises StoreError (disk full, read-only) with nothing
        accepted, or LocalProtocolError for an invalid document (its
        subclass DocumentTooLarge for one no frame can carry: it could never
        be sent; semq.node.limits)."""
        ts = now_ms()
        rows = []
        for d in docs:
            if len(d.app_data) > MAX_DOCUMENT_SIZE:
                raise DocumentTooLarge(len(d.app_data))
            target = Endpoint.org(d.target)  # validates the id
            # Validate every field by building the DATA value once.
            # (``encrypt`` asks for sealing at send time; the plaintext stays
            # in our own store until then.)
            Data(lk0=LK0(endpoint=self.me, record_id=1), app_data=d.app_data, app_key=d.app_key,
                 created_ms=d.created_ms or ts, expires_ms=d.expires_ms)
            Frame(kind=Kind.DATA, source=self.me, target=target, reliable=d.reliable,
                  save_fwd=d.save_fwd, ack2=d.ack2, priority=d.priority,
                  body=Data(lk0=LK0(endpoint=self.me, record_id=1)))
            rows.append((
                int(target.node_type), target.node_id, int(SendState.SS_INIT), int(d.save_fwd),
                int(d.ack2), int(d.reliable), d.priority, d.app_key.domain, d.app_key.data_type,
                d.app_key.subtype, d.app_key.key, d.created_ms or ts, d.expires_ms, int(d.encrypt),
                d.session_key, d.app_data, ts, int(d.clear_app_key),
            ))
        ids: list[int] = []
        try:
            with self._tx():
                self.conn.executemany(
                    "INSERT INTO outbox (target_type, target_id, state, save_fwd, ack2, reliable,"
                    " priority, domain, data_type, subtype, key, created_ms, expires_ms, encrypt,"
                    " session_key, app_data, state_ms, clear_key) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    rows,
                )
                if rows:
                    # AUTOINCREMENT under our write lock: the ids of one
                    # statement are consecutive, ending at the last one.
                    last = int(self.conn.execute("SELECT last_insert_rowid()").fetchone()[0])
                    ids = list(range(last - len(rows) + 1, last + 1))
        except STORE_ERRORS as e:
            raise translate(e, self.path, "node store") from e
        self._emit([
            {"ts": ts, "role": "origin", "event": "queued", "lk0": f"{self.me.node_id}/1/1/{i}",
             "source": self.me.node_id, "target": r[1], "domain": r[7], "data_type": r[8],
             "subtype": r[9], "key": r[10], "save_fwd": r[3], "ack2": bool(r[4]),
             "reliable": bool(r[5]), "priority": r[6], "size": len(r[15]), "attempt": 0,
             "created_ms": r[11]}
            for i, r in zip(ids, rows, strict=True)
        ])
        return [LK0(endpoint=self.me, record_id=i) for i in ids]

    # ------------------------------------------------------------ sending

    def claim(self, limit: int, skip_targets: frozenset[str] = frozenset(),
              early: Callable[[list[bytes]], None] | None = None) -> Output:
        """SPEC A.2: take up to ``limit`` SS_INIT rows (priority first, then
        acceptance order), mark them SS_SENT (held in memory first, see
        write_held), commit, and return their DATA frames. Expired rows fail
        with EXPIRED instead; best-effort rows are deleted as they go (never
        retried). With security, the batch is signed under one signature
        (each document still verifies alone) and sealed to the target's
        certificates; rows whose target certificate is not known yet stay
        SS_INIT and their target is in ``out.missing`` (``skip_targets``:
        targets already asked for).

        ``early``, when given, gets the DATA frames just before the commit
        instead of ``out.data`` (``out.early`` counts them), so they travel
        while the commit waits for the disk: a document promises nothing (no
        ack of ours depends on it). If the commit fails, the rows stay SS_INIT
        and go again; the receiver's duplicate suppression keeps the
        application's view exactly once, and acks of the first copy find the
        row SS_INIT (ACK2 confirms it; ACK_FWD / ACK_SAVE leave it to be sent
        again: ORIGIN_TABLE)."""
        out = Output()
        ts = now_ms()
        events: list[dict[str, Any]] = []
        held = self._held_sent
        if self.sec is not None:
            self._document_salt_key()
        with self._tx():
            if held:
                self.write_held(ts - HOLD_MS)  # (may empty it)
            skip = sorted(skip_targets)
            where = f"state=0 AND target_id NOT IN ({','.join('?' * len(skip))})" if skip else "state=0"
            if held:
                ids, levels = self._order.ids(self.conn, where, skip, limit, held)
                found = {r[0]: r for r in rows_by_id(
                    self.conn, f"SELECT {_CLAIM_COLS} FROM outbox", ids)}
                rows = [found[i] for i in ids]
            else:
                self._order.forget()
                rows = self.conn.execute(
                    f"SELECT {_CLAIM_COLS} FROM outbox WHERE {where}"
                    " ORDER BY priority DESC, id LIMIT ?",
                    (*skip, limit),
                ).fetchall()
                levels = SendOrder.levels(rows, 7)
            if not rows:
                return out
            rows = self._protect(rows, out)
            targets: dict[str, Endpoint] = {}
            gone: list[int] = []  # best-effort ids: sent, nothing to wait for
            expired: list[tuple[int, ...]] = []
            me, me_id = self.me, self.me.node_id
            data = out.data
            secure = self.sec is not None
            for r in rows:
                if r[13] is not None and r[13] <= ts:
                    expired.append((r[0],))
                    events.append(self._origin_event(r, "expired", ts, code=int(ResultCode.EXPIRED)))
                    continue
                # Validated when accepted: encode straight from the row.
                target = targets.get(r[2])
                if target is None:
                    target = targets[r[2]] = Endpoint(node_type=r[1], node_id=r[2])
                sealed = secure and r[19]  # (without security: the clear_key column, unused)
                data.append(encode_data(
                    source=me, target=target, record_id=r[0],
                    app_key=_NO_KEY_PARTS if sealed else (r[8], r[9], r[10], r[11]),
                    created_ms=r[12], expires_ms=r[13], save_fwd=r[4], ack2=bool(r[5]),
                    reliable=bool(r[6]), priority=r[7], session_key=r[17], app_data=r[18], key_sealed=sealed,
                ))
                events.append({"ts": ts, "role": "origin", "event": "sent", "lk0": f"{me_id}/1/1/{r[0]}",
                               "source": me_id, "target": r[2], "attempt": r[14] + 1})
                if r[6]:
                    # SS_SENT held in memory, not written: the ACK2 that
                    # follows within a fraction of a second deletes the row,
                    # and the UPDATE of a row with its 1 KiB document cost ~6
                    # us of an origin's ~30 per document, its WAL pages more
                    # at the fsync. Nothing we send depends on it: lost in a
                    # crash, the row is SS_INIT and goes again (the platform
                    # and the receiver suppress the duplicate). Written after
                    # HOLD_MS (write_held); every step reads it from memory
                    # meanwhile, and the claims skip it.
                    held[r[0]] = (ts, r[14] + 1, r[2], r[4], r[5], r[20] if secure else None)
                else:
                    gone.append(r[0])
            # The digest a document was signed with stays with its held
            # SS_SENT (the receipt that names it usually comes with the
            # ACK2, and the row is written once, with it: _keep_receipts);
            # a best-effort document gets no receipt. Lost in a crash with
            # the held SS_SENT, the row is SS_INIT and signed again with
            # the same digest, and a receipt that comes first finds the
            # digest from the row (_digests_of). outbox.digest (schema v2)
            # is no longer written: nothing reads it.
            delete_by_id(self.conn, "outbox", gone)
            # (state_ms: the failed row's 7 days count from now.)
            self.conn.executemany(
                f"UPDATE outbox SET state={int(SendState.SS_FAILED)}, code={int(ResultCode.EXPIRED)}, state_ms=?"
                " WHERE id=?",
                [(ts, rid) for (rid,) in expired],
            )
            if not skip:  # (rows of skipped targets were not read: they would be jumped)
                self._order.advance(levels, held, {*gone, *(e[0] for e in expired)})
            if early is not None and out.data:
                out.early = len(out.data)
                early(out.data)
                out.data = []
        self._emit(events)
        return out

    def reread_send_order(self) -> None:
        """Rows may have become SS_INIT other than by being accepted (a
        resend, a requeued dead letter): the next claim reads the whole
        send order again, not only after the held rows."""
        self._order.forget()

    def _protect(self, rows: list[Any], out: Output) -> list[Any]:
        """Sign and seal a claimed batch (security on). Rows come back with
        (session_key, app_data) replaced, [19] saying whether the AppKey is
        sealed inside, and the digest appended; rows whose target
        certificate is unknown are left out (they stay SS_INIT)."""
        if self.sec is None:
            return rows
        ts = now_ms()
        me = self.me
        keep, items = [], []
        # One Endpoint and one directory look-up per target per batch; the
        # AAD from the row's fields (validated when the document was
        # accepted), all but its LK0 ids built once per target and AppKey.
        targets: dict[tuple[int, str], Endpoint] = {}
        batch_certs: dict[tuple[int, str], Any] = {}
        # per target, AppKey, SaveFwd, flags, priority
        aads: dict[tuple[Any, ...], Callable[[int, int, int, int, int | None], bytes]] = {}
        for r in rows:
            if r[13] is not None and r[13] <= ts:
                keep.append(r)  # expires in claim(); nothing to protect
                continue
            tk = (r[1], r[2])
            target = targets.get(tk)
            if target is None:
                target = targets[tk] = Endpoint(node_type=r[1], node_id=r[2])
            certs = None
            if r[16]:
                certs = batch_certs.get(tk)
                if certs is None:
                    certs = batch_certs[tk] = self.sec.certs(target)
                if not certs:
                    out.missing.add(target)
                    continue
            sealed = bool(r[16]) and not r[19]
            flags = document_flags(bool(r[6]), bool(r[5]), bool(r[16]), sealed)
            ak = (tk, r[8], r[9], r[10], r[11], r[4], flags, r[7])
            aad_of = aads.get(ak)
            if aad_of is None:
                aad_of = aads[ak] = (
                    document_aad_template(me, me, target, "", "", "", "", r[4], flags, r[7]) if sealed
                    else document_aad_template(me, me, target, r[8], r[9], r[10], r[11], r[4], flags, r[7]))
            aad = aad_of(1, 1, r[0], r[12], r[13])
            keep.append(r)
            items.append((aad, enclose_app_key(r[8], r[9], r[10], r[11], r[18]) if sealed else r[18], certs))
        if not items:
            return keep
        key = self._document_salt_key()
        docs = iter(protect_documents(items, signing_key=self.sec.identity.keys.signing_key, sealer=self.sec.sealer,
                                      salts=document_salts(key, [aad for aad, _, _ in items])))
        result = []
        for r in keep:
            if r[13] is not None and r[13] <= ts:
                result.append(r)
                continue
            app_data, session_key, digest = next(docs)
            result.append((*r[:17], session_key, app_data, bool(session_key) and not r[19], digest))
        return result

    def fail_target(self, target: Endpoint, code: ResultCode, detail: str, *,
                    save_fwd: int | None = None) -> int:
        """Fail every not-yet-sent document to ``target`` (SS_INIT ->
        SS_FAILED with ``code``), or only those with ``save_fwd``. Returns
        how many."""
        ts = now_ms()
        with self._tx():
            self.write_held()  # rows in flight are not "not yet sent"
            only = "" if save_fwd is None else f" AND save_fwd={int(save_fwd)}"
            rows = self.conn.execute(
                f"SELECT {_OUT_COLS} FROM outbox WHERE state=0 AND target_type=? AND target_id=?{only}",
                (int(target.node_type), target.node_id)).fetchall()
            self.conn.executemany(
                "UPDATE outbox SET state=?, state_ms=?, code=? WHERE id=?",
                [(int(SendState.SS_FAILED), ts, int(code), r[0]) for r in rows])
        self._emit([self._origin_event(r, "nack", ts, code=int(code), detail=detail) for r in rows])
        return len(rows)

    def wait_target(self, target: Endpoint, code: ResultCode | int, waiting: Collection[int]) -> int:
        """The not-yet-sent documents to ``target`` wait for a certificate:
        they stay SS_INIT and carry ``code`` (one of ``waiting``), why they
        wait, for ``semq messages`` and ``semq admin stuck``; ``code`` 0 (a
        certificate came) clears it. Rows held in flight are SS_INIT on disk
        too: the code goes with them and their next state replaces it.
        Returns how many rows changed."""
        codes = sorted({0, *map(int, waiting)})
        with self._tx():
            cur = self.conn.execute(
                f"UPDATE outbox SET code=? WHERE state=0 AND target_type=? AND target_id=?"
                f" AND code IN ({','.join('?' * len(codes))}) AND code<>?",
                (int(code), int(target.node_type), target.node_id, *codes, int(code)))
        return cur.rowcount

    def pending_count(self) -> int:
        row = self.conn.execute("SELECT count(*) FROM outbox WHERE state=0").fetchone()
        return int(row[0]) - len(self._held_sent)  # held rows were sent

    # ------------------------------------------------------------ receiving

    def handle(self, frames: Sequence[RawFrame]) -> Output:
        """Apply a batch of frames from the platform in one transaction; the
        answers (acks, REACK2, inquiry answers) are in the Output."""
        out = Output()
        ts = now_ms()
        events: list[dict[str, Any]] = []
        acks: dict[tuple[Kind, Endpoint], list[AckEntry]] = defaultdict(list)
        self._digests: dict[Endpoint, list[tuple[LK0, bytes]]] = defaultdict(list)
        self._batch_certs: dict[Endpoint, Any] = {}  # one directory look-up per origin per batch
        # Confirmations of pending-ack rows found in this batch: REACK ids
        # (from the platform), REACK2 (id, the sender's org: checked against
        # the row's origin).
        self._queued_acks: tuple[list[int], list[tuple[int, str]]] = ([], [])
        # The creation times a new document may have (_receive): not in the
        # future, not older than the duplicate suppression remembers.
        self._window = (ts - DEDUP_RETENTION_MS + self.skew_ms, ts + self.skew_ms)
        self._opened = self._open_batch(frames)
        with self._tx():
            self.write_held(ts - HOLD_MS)
            self._begin_receive(frames)
            for raw in frames:
                try:
                    if raw.kind is not Kind.DATA:
                        self._flush_receive()  # later frames may refer to rows just received
                    if raw.kind is not Kind.ACK_BATCH:
                        self._flush_inbound_acks(ts, events)  # ... or to rows confirmations delete
                    self._handle_one(raw, ts, out, events, acks)
                except RemoteProtocolError as e:
                    out.errors.append((e.code, str(e)))
            self._flush_receive()
            self._flush_inbound_acks(ts, events)
            if self._next_inbound:
                self._reserve_inbound_ids()
            for (kind, target), entries in acks.items():
                digests = self._digests.get(target, []) if kind is Kind.ACK2 else []
                for i in range(0, len(entries), 10_000):
                    receipt = b""
                    if self.sec is not None and len(digests) == len(entries):
                        # One signature over the whole batch: the receiver's
                        # proof of delivery for each document (docs/security.md).
                        receipt = make_batch_receipt(digests[i:i + 10_000], self.sec.identity.keys.signing_key)
                    out.add(Frame(kind=Kind.ACK_BATCH, source=self.me, target=target,
                                  body=AckBatch(ack_kind=kind, entries=tuple(entries[i:i + 10_000]),
                                                receipt=receipt)))
        self._emit(events)
        return out

    def _open_batch(self, frames: Sequence[RawFrame]) -> dict[int, tuple[Frame, Any]]:
        """Open and verify the batch's DATA for us at once (security on;
        open_documents checks each batch signature's documents together):
        by ``id(raw)``, the decoded frame and its VerifiedDocument or the
        CryptoError that refuses it. A DATA whose origin's certificate is
        not known, or that does not decode (``_handle_one`` says why), is
        not here."""
        if self.sec is None:
            return {}
        found: list[tuple[RawFrame, Frame]] = []
        items = []
        for raw in frames:
            if raw.kind is not Kind.DATA or raw.target != self.me:
                continue
            try:
                frame = raw.frame()
            except RemoteProtocolError:
                continue
            certs = self._batch_certs.get(frame.origin)
            if certs is None:
                certs = self._batch_certs[frame.origin] = self.sec.certs(frame.origin)
            if not certs:
                continue
            body = frame.body
            assert isinstance(body, Data)
            found.append((raw, frame))
            items.append((body.app_data, body.session_key, raw_frame_aad(raw), certs))
        got = open_documents(items, keys=self.sec.opener, cache=self.sec.cache)
        return {id(raw): (frame, g) for (raw, frame), g in zip(found, got, strict=True)}

    def _handle_one(
        self, raw: RawFrame, ts: int, out: Output, events: list[dict[str, Any]],
        acks: dict[tuple[Kind, Endpoint], list[AckEntry]],
    ) -> None:
        kind = raw.kind
        if raw.target != self.me:
            raise RemoteProtocolError(f"{kind.name} for {raw.target} reached {self.me}", ResultCode.UNEXPECTED_FRAME)
        opened = self._opened.pop(id(raw), None)
        frame = raw.frame() if opened is None else opened[0]
        body = frame.body
        if isinstance(body, Data):
            if self.sec is None:
                self._receive(frame, body, ts, out, events, acks, body.app_data, None, "", body.app_key)
                return
            if opened is None:  # (not opened with the batch: its origin's certificate is missing)
                out.deferred.append(raw)
                out.missing.add(frame.origin)
                return
            got = opened[1]
            app_key = body.app_key
            if not isinstance(got, CryptoError):
                doc = got.body
                if body.key_sealed:  # the AppKey travels inside the document
                    try:
                        app_key, doc = split_app_key(doc)
                    except CryptoError as e:
                        got = e
            if isinstance(got, UnknownCertificate) and self._first_unknown_key(frame.origin, ts):
                # Signed by a key of the origin we do not hold yet (it rolled
                # over, and the platform's push has not reached us): ask for
                # its certificates and handle it again when they come. Only
                # once a minute per origin: if the key is still unknown after
                # that, it is refused.
                out.deferred.append(raw)
                out.missing.add(frame.origin)
                return
            if isinstance(got, CryptoError):
                # Never delivered; the origin sees it (its row fails with the code).
                self._refuse(frame, body, getattr(got, "code", ResultCode.BAD_SIGNATURE), str(got), ts, out,
                             events, acks)
                return
            self._receive(frame, body, ts, out, events, acks, doc, got.digest, got.signer.org, app_key)
        elif isinstance(body, AckBatch):
            self._acks(body.ack_kind, body.entries, frame.origin, ts, out, events, acks, receipt=body.receipt)
        elif isinstance(body, Ack):
            self._acks(kind, (body.entry,), frame.origin, ts, out, events, acks, receipt=body.receipt)
        elif isinstance(body, Nack) and body.code is ResultCode.OVER_WINDOW:
            # Flow control: not taken; send again later, and slower.
            out.over_window += 1
            self._origin_apply([(body.lk0.record_id, OriginEvent.PLATFORM_LACKS)], ts, out, events, acks,
                               peer=frame.origin)
        elif (isinstance(body, Nack) and body.code is ResultCode.QUOTA_EXCEEDED
              and frame.origin.node_type is NodeType.PLATFORM):
            # Our storage quota at the platform is used up: not taken; we keep
            # it (SS_INIT, its code says why) and the daemon sends to that
            # target again after a pause.
            rid = body.lk0.record_id
            h = self._held_sent.get(rid)
            row = (h[2],) if h is not None else self.conn.execute(
                "SELECT target_id FROM outbox WHERE id=?", (rid,)).fetchone()
            if row is not None:
                out.over_quota.add(row[0])
            self._origin_apply([(rid, OriginEvent.PLATFORM_LACKS)], ts, out, events, acks, peer=frame.origin,
                               code=int(ResultCode.QUOTA_EXCEEDED), detail=body.message)
        elif isinstance(body, Nack):
            peer = frame.origin
            if body.lk0.endpoint != self.me:
                raise RemoteProtocolError(f"NACK from {peer} names {body.lk0}, not one of our documents",
                                          ResultCode.UNEXPECTED_FRAME)
            if peer.node_type is not NodeType.PLATFORM and self.sec is not None:
                # A target's refusal counts only signed by the target: the
                # relay could otherwise make us give up a document it dropped.
                if not self._refusal_verifies(peer, body, ts, out, events):
                    return
                answers = self._origin_apply([(body.lk0.record_id, OriginEvent.NACK)], ts, out, events, acks,
                                             peer=peer, code=int(body.code), detail=body.message)
                if answers and answers[0][1] is not InquiryResult.NO_RECORD:
                    self.conn.execute("INSERT OR REPLACE INTO refusals (record_id, target_id, code, proof,"
                                      " received_ms) VALUES (?,?,?,?,?)",
                                      (body.lk0.record_id, peer.node_id, int(body.code), body.proof, ts))
                return
            self._origin_apply([(body.lk0.record_id, OriginEvent.NACK)], ts, out, events, acks,
                               peer=peer, code=int(body.code), detail=body.message)
        elif isinstance(body, Inquiry):
            self._answer(frame, body, ts, out, events)
        elif isinstance(body, InquiryResp):
            self._answers(frame, body, ts, out, events)

    # A batch of DATA is received with one look-up of the dedup table and one
    # executemany per table (MEASUREMENTS: per-row statements cost ~15 us each).
    # Row ids of the pending-ack table are assigned here, inside the IMMEDIATE
    # transaction (we are the only writer), so acks can name them before the
    # rows are written.

    def _begin_receive(self, frames: Sequence[RawFrame]) -> None:
        self._known: set[tuple[Any, ...]] = set()
        self._pending: dict[str, list[tuple[Any, ...]]] = {"dedup": [], "inbox": []}
        self._next_inbound = 0
        groups: dict[tuple[int, str, int, int], list[int]] = defaultdict(list)
        for raw in frames:
            if raw.kind is Kind.DATA:
                try:
                    semq_id, db_id, rid = raw.data_ids()
                except RemoteProtocolError:
                    continue  # reported when the frame itself is handled
                origin = raw.origin  # LK0's endpoint (checked when the frame is decoded)
                groups[(int(origin.node_type), origin.node_id, semq_id, db_id)].append(rid)
        for g, rids in groups.items():
            for (rid,) in rows_by_id(self.conn, "SELECT record_id FROM dedup", rids, key="record_id",
                                     where="origin_type=? AND origin_id=? AND semq_id=? AND semq_db_id=?",
                                     params=g):
                self._known.add((*g, rid))

    def _inbound_id(self) -> int:
        if not self._next_inbound:
            self._next_inbound = max(next_row_id(self.conn, "inbound"), self._inbound_floor)
        rid = self._next_inbound
        self._next_inbound += 1
        self._inbound_floor = self._next_inbound
        return rid

    def _reserve_inbound_ids(self) -> None:
        """The ids given out in this batch are never given out again, even
        after a crash that loses the held rows (a late confirmation naming
        one must not confirm another row): AUTOINCREMENT's sequence,
        updated in the batch's transaction."""
        hi = self._inbound_floor - 1
        if hi <= 0:
            return
        if not self.conn.execute("UPDATE sqlite_sequence SET seq=? WHERE name='inbound' AND seq<?",
                                 (hi, hi)).rowcount:
            self.conn.execute("INSERT INTO sqlite_sequence (name, seq) SELECT 'inbound', ?"
                              " WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name='inbound')", (hi,))

    def _flush_receive(self) -> None:
        p = self._pending
        if p["dedup"]:
            self.conn.executemany(
                "INSERT OR IGNORE INTO dedup (origin_type, origin_id, semq_id, semq_db_id, record_id,"
                " received_ms, digest) VALUES (?,?,?,?,?,?,?)", p["dedup"])
        if p["inbox"]:
            self.conn.executemany(
                "INSERT INTO inbox (origin_type, origin_id, semq_id, semq_db_id, record_id, domain,"
                " data_type, subtype, key, save_fwd, priority, created_ms, received_ms, encrypt,"
                " app_data, signer) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", p["inbox"])
        for v in p.values():
            v.clear()

    def _first_unknown_key(self, origin: Endpoint, ts: int) -> bool:
        """Whether a document of ``origin`` signed by a key we do not know
        may wait for its certificates (once a minute per origin)."""
        last = self._unknown_key_at.get(origin)
        if last is not None and ts - last < 60_000:
            return False
        self._unknown_key_at[origin] = ts
        return True

    def _refuse(
        self, frame: Frame, d: Data, code: ResultCode, detail: str, ts: int, out: Output,
        events: list[dict[str, Any]], acks: dict[tuple[Kind, Endpoint], list[AckEntry]],
    ) -> None:
        """A document that does not reach the inbox (it does not open or
        verify, it expired, it is stale): no dedup row, no ACK2, no receipt.
        A stored copy is settled at the platform (ACK: it has left its
        store; redelivering it would be refused again), and the origin gets
        a NACK with the code, signed with security (``make_refusal``: the
        relay can neither forge nor hide it). A later copy that does
        verify, in time, is still delivered."""
        lk0, lk1 = d.lk0, d.lk1
        events.append({"ts": ts, "role": "receiver", "event": "refused", "lk0": str(lk0),
                       "source": frame.origin.node_id, "target": self.me.node_id,
                       "code": int(code), "detail": detail[:200]})
        out.errors.append((code, f"document {lk0} refused: {detail}"))
        if not frame.reliable:
            return  # best effort: never acked, never answered
        if lk1 is not None:
            acks[(Kind.ACK, frame.source)].append(AckEntry(
                1, 1, 0, lk1.semq_id, lk1.semq_db_id, lk1.record_id, int(AckFlag.PLATFORM), 0))
        proof = b"" if self.sec is None else make_refusal(lk0, code, self.sec.identity.keys.signing_key)
        out.add(Frame(kind=Kind.NACK, source=self.me, target=frame.origin,
                      body=Nack(lk0=lk0, code=code, message=detail[:1000], proof=proof)))

    def _receive(
        self, frame: Frame, d: Data, ts: int, out: Output, events: list[dict[str, Any]],
        acks: dict[tuple[Kind, Endpoint], list[AckEntry]], body: bytes, digest: bytes | None,
        signer: str, ak: AppKey,
    ) -> None:
        lk0, lk1 = d.lk0, d.lk1
        key = (int(lk0.endpoint.node_type), lk0.endpoint.node_id, lk0.semq_id, lk0.semq_db_id, lk0.record_id)
        duplicate = key in self._known
        if not duplicate:
            # A copy already in the inbox is acked again whatever its age;
            # a new one must still be in time, and young enough that a
            # replay could not outlive its dedup row (signed times, with
            # security: docs/exactly-once.md).
            if d.expires_ms is not None and d.expires_ms <= ts:
                self._refuse(frame, d, ResultCode.EXPIRED, f"the document expired at {d.expires_ms}, before it"
                             f" reached the inbox at {ts}", ts, out, events, acks)
                return
            created = d.created_ms
            if created and not self._window[0] <= created <= self._window[1]:
                self._refuse(frame, d, ResultCode.STALE, f"created at {created}, outside this receiver's window"
                             f" of {DEDUP_RETENTION_MS // 86_400_000} days (clock skew"
                             f" {self.skew_ms // 1000} s): a replay cannot be told apart", ts, out, events, acks)
                return
            self._known.add(key)
            self._pending["dedup"].append((*key, ts, digest))
        ack2, reliable = frame.ack2, frame.reliable
        dkey = (duplicate, lk1 is not None, ack2, reliable)
        dec = _DECISIONS.get(dkey)
        if dec is None:
            dec = _DECISIONS[dkey] = receive_decision(duplicate=duplicate, has_lk1=lk1 is not None, ack2=ack2,
                                                      reliable=reliable)
        lk0_text, source, me = str(lk0), lk0.endpoint.node_id, self.me.node_id
        full = {
            "ts": ts, "role": "receiver", "lk0": lk0_text, "source": source, "target": me,
            "event": "received", "domain": ak.domain, "data_type": ak.data_type,
            "subtype": ak.subtype, "key": ak.key, "save_fwd": int(frame.save_fwd),
            "ack2": ack2, "reliable": reliable, "priority": frame.priority,
            "size": len(d.app_data), "created_ms": d.created_ms,
        }
        if lk1 is not None:
            full["lk1"] = f"{lk1.semq_id}/{lk1.semq_db_id}/{lk1.record_id}"
        events.append(full)
        if duplicate:
            events.append({"ts": ts, "role": "receiver", "lk0": lk0_text, "source": source, "target": me,
                           "event": "duplicate"})
        if dec.deliver:
            self._pending["inbox"].append(
                (*key, ak.domain, ak.data_type, ak.subtype, ak.key,
                 int(frame.save_fwd), frame.priority, d.created_ms, ts, int(d.encrypt), body, signer))
            out.delivered += 1
            events.append({"ts": ts, "role": "receiver", "lk0": lk0_text, "source": source, "target": me,
                           "event": "inbox"})
        inbound_id = 0
        if dec.keep_row:
            # Held in memory, not written: the confirmations (REACK2, and
            # REACK for a stored copy) usually come within a fraction of a
            # second and end the row, so its INSERT and DELETE (~8% of a
            # receiver's time, py-spy) are not made. Nothing we sent
            # depends on it: the document is in the inbox and the dedup
            # table before the ACK/ACK2 leave, and those answer the
            # inquiries of an origin or platform that missed an ack. Lost
            # in a crash, only our own asking about confirmations is lost.
            # Written after HOLD_MS (write_held: by handle, inquiries,
            # close, and before answers are matched to rows).
            inbound_id = self._inbound_id()
            self._held_in[inbound_id] = (
                inbound_id, *key, lk1.semq_id if lk1 else 0, lk1.semq_db_id if lk1 else 0,
                lk1.record_id if lk1 else 0, int(frame.source.node_type), frame.source.node_id,
                int(AckStatus.AS_INIT if dec.send_ack else AckStatus.AS_ACK),
                int(AckStatus.AS_INIT if dec.send_ack2 else AckStatus.AS_ACK), ts, ts)
            self._held_in_keys[key] = inbound_id
        elif duplicate and (dec.send_ack or dec.send_ack2):
            inbound_id = self._held_in_keys.get(key, 0)
            if not inbound_id:
                self._flush_receive()
                row = self.conn.execute(
                    "SELECT id FROM inbound WHERE origin_type=? AND origin_id=? AND semq_id=? AND"
                    " semq_db_id=? AND record_id=?", key,
                ).fetchone()
                inbound_id = int(row[0]) if row else 0
        if dec.send_ack and lk1 is not None:
            acks[(Kind.ACK, frame.source)].append(AckEntry(
                1, 1, inbound_id, lk1.semq_id, lk1.semq_db_id, lk1.record_id, int(AckFlag.PLATFORM), 0))
        if dec.send_ack2:
            acks[(Kind.ACK2, lk0.endpoint)].append(AckEntry(
                1, 1, inbound_id, lk0.semq_id, lk0.semq_db_id, lk0.record_id, int(AckFlag.DELIVERY), 0))
            if digest is not None:
                self._digests[lk0.endpoint].append((lk0, digest))
            events.append({"ts": ts, "role": "receiver", "lk0": lk0_text, "source": source, "target": me,
                           "event": "ack2_sent"})

    def _refusal_verifies(self, target: Endpoint, nack: Nack, ts: int, out: Output,
                          events: list[dict[str, Any]]) -> bool:
        """Whether a target's NACK carries its signed refusal of the document
        with that code (security on). One that does not changes nothing:
        logged, counted, the row stays open and is asked about again."""
        assert self.sec is not None
        certs = self.sec.certs(target)
        try:
            if not certs:
                raise CryptoError(f"no certificate of {target} to check it with yet")
            verify_refusal(nack.proof, lk0=nack.lk0, code=nack.code, receiver_certs=certs)
            return True
        except CryptoError as e:
            if not certs:
                out.missing.add(target)
            out.bad_refusals += 1
            events.append({"ts": ts, "role": "origin", "event": "bad_refusal", "lk0": str(nack.lk0),
                           "source": self.me.node_id, "target": target.node_id, "code": int(nack.code),
                           "detail": str(e)[:200]})
            out.errors.append((ResultCode.BAD_SIGNATURE, f"refusal of {nack.lk0} from {target} ignored: {e}"))
            return False

    def _acks(
        self, kind: Kind, entries: Sequence[AckEntry], origin: Endpoint, ts: int, out: Output,
        events: list[dict[str, Any]], acks: dict[tuple[Kind, Endpoint], list[AckEntry]],
        receipt: bytes = b"",
    ) -> None:
        if kind is Kind.ACK2 and self.sec is not None:
            # With security a delivery is confirmed only by the receiver's
            # signed receipt for exactly these documents and digests
            # (SPEC "What a receipt proves"): entries it does not cover
            # change nothing; their rows ask the target again.
            proven = self._keep_receipts(entries, origin, receipt, ts, out) if receipt else set()
            if len(proven) < len(entries):
                bad = [e for e in entries if e.dest_ref_id not in proven]
                out.bad_receipts += len(bad)
                events.extend({"ts": ts, "role": "origin", "event": "bad_receipt",
                               "lk0": f"{self.me.node_id}/{e.dest_semq_id}/{e.dest_semq_db_id}/{e.dest_ref_id}",
                               "source": self.me.node_id, "target": origin.node_id,
                               "code": int(ResultCode.BAD_RECEIPT)} for e in bad[:100])
                out.errors.append((ResultCode.BAD_RECEIPT,
                                   f"ACK2 from {origin} for {len(bad)} document(s) without a receipt that"
                                   " verifies: left open"))
                entries = [e for e in entries if e.dest_ref_id in proven]
                if not entries:
                    return
        if kind in (Kind.ACK_FWD, Kind.ACK_SAVE, Kind.ACK2):
            ev = {Kind.ACK_FWD: OriginEvent.ACK_FWD, Kind.ACK_SAVE: OriginEvent.ACK_SAVE,
                  Kind.ACK2: OriginEvent.ACK2}[kind]
            self._origin_apply([(e.dest_ref_id, ev, e) for e in entries], ts, out, events, acks,
                               peer=origin)
        elif kind is Kind.REACK:
            if origin.node_type is NodeType.PLATFORM:  # the platform's hop: from the platform only
                self._queued_acks[0].extend([e.dest_ref_id for e in entries if e.dest_ref_id])
        elif kind is Kind.REACK2:
            # From the document's origin only (checked against each row).
            peer = origin.node_id
            self._queued_acks[1].extend([(e.dest_ref_id, peer) for e in entries if e.dest_ref_id])
        # ACK from a node is for the platform only; a node ignores it.

    def _keep_receipts(self, entries: Sequence[AckEntry], receiver: Endpoint, receipt: bytes, ts: int,
                       out: Output) -> set[int]:
        """Verify a batch receipt against the digests we signed and keep it
        once for the batch; each document's self-standing proof is derived
        from it on request (``receipt_proof``, ``semq messages --receipt``).
        Returns the record ids it proves delivered: all of the batch's, or
        none. A receipt that does not verify (but is one for these
        documents) is kept marked unverified, and proves nothing."""
        assert self.sec is not None
        ids = [e.dest_ref_id for e in entries]
        if any(e.dest_semq_id != 1 or e.dest_semq_db_id != 1 for e in entries):
            return set()  # not records of this store
        digests = self._digests_of(ids)
        if len(digests) != len(set(ids)):
            return set()  # not documents we signed (or past the receipts' retention)
        manifest = [(ack_entry_lk0(e, self.me), digests[e.dest_ref_id]) for e in entries]
        verified = 0
        certs = self.sec.certs(receiver)
        if not certs:
            out.missing.add(receiver)  # asked for; the target's next answer verifies
        try:
            verify_batch_receipt(receipt, entries=manifest, receiver_certs=certs)
            verified = 1
        except CryptoError:
            try:  # kept unverified only if it is at least a receipt for these documents
                receipt_proofs(receipt, manifest)
            except (CryptoError, ValueError):
                return set()
        # Once per batch: the signed root and the LK0s in order; each
        # document's row points at it (its proof is derived when asked for).
        cur = self.conn.execute(
            "INSERT INTO receipt_batches (receiver, receipt, lk0s, received_ms) VALUES (?,?,?,?)",
            (receiver.node_id, receipt,
             b"".join([_LK0_REF.pack(lk.semq_id, lk.semq_db_id, lk.record_id) for lk, _ in manifest]), ts))
        batch_id = int(cur.lastrowid or 0)
        # One write per document: a new row for a digest held in memory, the
        # row's receipt columns for one written before (its digest kept).
        self.conn.executemany(
            "INSERT INTO receipts (record_id, target_id, digest, receipt, verified, received_ms, batch_id,"
            " batch_index) VALUES (?, ?, ?, x'', ?, ?, ?, ?) ON CONFLICT (record_id) DO UPDATE SET"
            " target_id=excluded.target_id, receipt=x'', verified=excluded.verified,"
            " received_ms=excluded.received_ms, batch_id=excluded.batch_id, batch_index=excluded.batch_index"
            " WHERE receipts.verified <= excluded.verified",  # (an unverified receipt never replaces a proof)
            [(lk.record_id, receiver.node_id, d, verified, ts, batch_id, i) for i, (lk, d) in enumerate(manifest)],
        )
        held = self._held_sent
        for rid in ids:  # written: nothing left to write when the SS_SENT leaves memory
            h = held.get(rid)
            if h is not None and h[5] is not None:
                held[rid] = (*h[:5], None)
        return set(ids) if verified else set()

    def _digests_of(self, ids: Sequence[int]) -> dict[int, bytes]:
        """The digests our documents ``ids`` were signed with: held with
        their SS_SENT, else from ``receipts``, else (a crash lost the held
        digest of a row still pending) made again from the row: its salt
        is deterministic, so it is the digest the document was signed with."""
        hits, rest = split_held(ids, self._held_sent)
        out: dict[int, bytes] = {}
        for rid, h in hits:
            if h[5] is not None:
                out[rid] = h[5]
            else:
                rest.append(rid)
        if rest:
            out.update(rows_by_id(self.conn, "SELECT record_id, digest FROM receipts", rest, key="record_id"))
        missing = [rid for rid in rest if rid not in out]
        if missing:
            # The store's salt key as it is (never made here: without one,
            # no document of ours was signed with a deterministic salt).
            salt_key = self._salt_key
            if salt_key is None:
                row = self.conn.execute("SELECT value FROM meta WHERE key='document_salt_key'").fetchone()
                salt_key = bytes.fromhex(row[0]) if row else None
            if salt_key is not None:
                for row in rows_by_id(
                        self.conn, "SELECT id, target_type, target_id, save_fwd, ack2, reliable, priority, domain,"
                                   " data_type, subtype, key, created_ms, expires_ms, encrypt, clear_key, app_data"
                                   " FROM outbox", missing):
                    aad, body = self._signed_form(*row)
                    out[row[0]] = document_digest(aad, body, document_salt(salt_key, aad))
        return out

    def _signed_form(self, rid: int, target_type: int, target_id: str, save_fwd: int, ack2: int, reliable: int,
                     priority: int, domain: str, data_type: str, subtype: str, key: str, created_ms: int,
                     expires_ms: int | None, encrypt: int, clear_key: int, body: bytes) -> tuple[bytes, bytes]:
        """(AAD, signed body) of one of our documents, from its pending-send
        row, as ``_protect`` made them when it was sent (with security, an
        ``encrypt`` row is sent sealed, its AppKey inside unless
        ``clear_key``): with the salt, its digest."""
        sealed = bool(encrypt) and not clear_key
        flags = document_flags(bool(reliable), bool(ack2), bool(encrypt), sealed)
        target = Endpoint(node_type=NodeType(target_type), node_id=target_id)
        if sealed:
            aad = document_aad_fields(self.me, 1, 1, rid, self.me, target, "", "", "", "", save_fwd, flags, priority,
                                      created_ms, expires_ms)
            return aad, enclose_app_key(domain, data_type, subtype, key, body)
        return document_aad_fields(self.me, 1, 1, rid, self.me, target, domain, data_type, subtype, key, save_fwd,
                                   flags, priority, created_ms, expires_ms), body

    def receipt_proof(self, record_id: int) -> tuple[str, bytes, bytes, int] | None:
        """(receiver, digest, self-standing receipt, received_ms) of one of our
        documents, or None when no receipt is held. A receipt of a batch is
        turned into the document's own proof (form 3) here."""
        row = self.conn.execute(
            "SELECT target_id, digest, receipt, received_ms, batch_id, batch_index FROM receipts"
            " WHERE record_id=? AND (receipt != x'' OR batch_id IS NOT NULL)", (record_id,)).fetchone()
        if row is None:
            return None
        target, digest, receipt, received_ms, batch_id, index = row
        if receipt:
            return target, digest, receipt, received_ms
        b = self.conn.execute("SELECT receipt, lk0s FROM receipt_batches WHERE id=?", (batch_id,)).fetchone()
        if b is None:
            return None
        refs = [_LK0_REF.unpack_from(b[1], i) for i in range(0, len(b[1]), _LK0_REF.size)]
        ids = [r[2] for r in refs]
        digests: dict[int, bytes] = dict(rows_by_id(self.conn, "SELECT record_id, digest FROM receipts", ids,
                                                    key="record_id"))
        if len(digests) != len(set(ids)):
            return None  # a document of the batch is past retention: the proof cannot be rebuilt
        entries = [(LK0(endpoint=self.me, semq_id=s, semq_db_id=d, record_id=r), digests[r]) for s, d, r in refs]
        return target, digest, receipt_proofs(b[0], entries)[index], received_ms

    def _origin_apply(
        self, items: Sequence[tuple[Any, ...]], ts: int, out: Output, events: list[dict[str, Any]],
        acks: dict[tuple[Kind, Endpoint], list[AckEntry]], *, peer: Endpoint | None = None,
        code: int = 0, detail: str = "",
    ) -> list[tuple[int, InquiryResult]]:
        """Apply origin events to rows by id; returns (id, previous-state
        answer) for STATE inquiries. The hot path of an origin (every
        ACK_FWD, ACK_SAVE and ACK2 of every document): one look-up of the
        rows, a cached table step and two dicts for the event log per row."""
        answers: list[tuple[int, InquiryResult]] = []
        ids = [it[0] for it in items]
        held, held_sent = self._held_fwd, self._held_sent
        # (id, target_id, state, save_fwd, ack2, attempts): all a step needs.
        # A claimed row whose SS_SENT is held is SS_INIT on disk and its
        # other columns never change: from memory (an ACK_FWD and an ACK2
        # per document; reading them was ~1.1 us a row, scripts/bench
        # pipeline). The rest are read.
        rows: dict[int, Any] = {}
        if held_sent:
            hits, ids = split_held(ids, held_sent)
            for rid, h in hits:
                rows[rid] = (rid, h[2], _SS_INIT, h[3], h[4], h[1] - 1)
        if ids:
            rows.update((r[0], r) for r in rows_by_id(
                self.conn, "SELECT id, target_id, state, save_fwd, ack2, attempts FROM outbox", ids))
        updates: list[tuple[int, int, int, int]] = []
        deletes: list[int] = []
        sent_updates = []  # rows whose held SS_SENT is written with their new state
        digests: list[tuple[int, str, bytes]] = []  # ... and their digests not written yet
        # Only the document's own target may confirm, refuse or ask about it:
        # an ACK2 from a third organization is ignored (answered NO_RECORD).
        only = peer.node_id if peer is not None and peer.node_type is not NodeType.PLATFORM else None
        reack2: list[AckEntry] | None = None
        me = self.me.node_id
        steps = _STEPS
        for it in items:
            rid, event = it[0], it[1]
            r = rows.get(rid)
            if r is None or (only is not None and only != r[1]):
                answers.append((rid, InquiryResult.NO_RECORD))
                continue
            state_no, attempts = r[2], r[5]
            sent_at = held_sent.get(rid) if held_sent else None
            if sent_at is not None:
                attempts = sent_at[1]
                if state_no == _SS_INIT:
                    state_no = _SS_SENT  # claimed; SS_INIT on disk
            held_at = held.pop(rid, None) if held else None
            if held_at is not None and state_no == _SS_SENT:
                state_no = _SS_ACK_FWD  # its ACK_FWD came; the row on disk says SS_SENT
            key = (state_no, event, r[3], r[4])
            o = steps.get(key)
            if o is None:
                o = steps[key] = origin_step(_SEND_STATES[state_no], event, save_fwd=r[3], ack2=bool(r[4]))
            answers.append((rid, _ANSWER_ACKED if state_no == _SS_ACK2 else _ANSWER_MARKED))
            if o.reack2 and peer is not None and len(it) > 2:
                e: AckEntry = it[2]
                if reack2 is None:
                    reack2 = acks[(Kind.REACK2, peer)]
                reack2.append(AckEntry(1, 1, rid, e.src_semq_id, e.src_semq_db_id, e.src_ref_id, _DELIVERY, 0))
            if not o.changed:
                if held_at is not None:
                    held[rid] = held_at
                continue
            new_state = o.state
            if new_state is SendState.SS_INIT:
                self.reread_send_order()  # to be sent again: the claims must read it
            rows[rid] = (*r[:2], int(new_state), r[3], r[4], attempts)
            lk0 = f"{me}/1/1/{rid}"
            if new_state is SendState.SS_FAILED:
                row_code, row_detail = code, detail
                if event is OriginEvent.TARGET_LACKS:
                    # SaveFwd 1 forwarded, lost on the way: dropped, and said so.
                    row_code = int(ResultCode.TARGET_OFFLINE_DROPPED)
                    row_detail = "forwarded but not received by the target"
                events.append({"ts": ts, "role": "origin", "event": "nack", "lk0": lk0, "source": me,
                               "target": r[1], "attempt": attempts, "code": row_code, "detail": row_detail})
            else:
                row_code = code
                events.append({"ts": ts, "role": "origin", "event": _EVENT_NAMES[event], "lk0": lk0,
                               "source": me, "target": r[1], "attempt": attempts})
            if state_no == _SS_SENT:
                out.settled += 1  # no longer in flight: window credit
            if o.clean:
                deletes.append(rid)
                if sent_at is not None:
                    del held_sent[rid]
                    if sent_at[5] is not None:
                        digests.append((rid, sent_at[2], sent_at[5]))
                events.append({"ts": ts, "role": "origin", "event": "cleaned", "lk0": lk0, "source": me,
                               "target": r[1], "attempt": attempts})
            elif new_state is SendState.SS_ACK_FWD and state_no == _SS_SENT:
                # Held in memory, not written: the ACK2 that follows within
                # a fraction of a second deletes the row, and the UPDATE of
                # a row with its 1 KiB document was ~13% of an origin's time
                # (py-spy, scripts/bench e2e). Nothing we send depends on
                # it: lost in a crash, the row is SS_SENT, asks the platform
                # and hears "forwarded" again. Written after HOLD_MS
                # (write_held: by handle, inquiries, reconnected,
                # close and the operator's commands); every step here
                # reads it from memory meanwhile.
                held[rid] = (ts, row_code)
            elif sent_at is not None:
                # Its held SS_SENT goes with the new state: one UPDATE.
                del held_sent[rid]
                if sent_at[5] is not None:
                    digests.append((rid, sent_at[2], sent_at[5]))
                sent_updates.append((int(new_state), ts, row_code, ts, self._first_inquiry(ts, attempts),
                                     attempts, sent_at[0], rid))
            else:
                updates.append((int(new_state), ts, row_code, rid))
        # SPEC A.3: a new state sets the inquiry time to now and starts a new
        # inquiry schedule (no backoff carried over from the previous state).
        # The first inquiry waits one interval, doubled per resend so far
        # (attempts - 1): a target busy with a backlog is not asked again
        # about a resent copy before it could have read it (retransmission
        # backoff; otherwise each "not received" feeds another resend).
        self.conn.executemany("UPDATE outbox SET state=?, state_ms=?, code=?, inquiries=0, last_inquiry_ms=?,"
                              " due_ms=?+min(?, ?*(1 << min(max(attempts-1, 0), 6))) WHERE id=?",
                              [(st, t, c, t, t, MAX_INQUIRY_BACKOFF_MS, self.inquiry_ms, rid)
                               for st, t, c, rid in updates])
        if sent_updates:
            self.conn.executemany("UPDATE outbox SET state=?, state_ms=?, code=?, inquiries=0, last_inquiry_ms=?,"
                                  " due_ms=?, attempts=?, sent_ms=? WHERE id=?", sent_updates)
        delete_by_id(self.conn, "outbox", deletes)
        if digests:
            self._write_digests(digests)
        return answers

    def _inbound_ack(self, col: str, ids: Sequence[int], peer: str, ts: int, events: list[dict[str, Any]]) -> None:
        """Mark a confirmation (REACK: ``p_ack``, REACK2: ``s_ack`` from the
        origin ``peer``) on pending-ack rows now (``_inbound_acks`` with one
        kind)."""
        if col == "p_ack":
            self._inbound_acks(ids, (), ts, events)
        else:
            self._inbound_acks((), [(i, peer) for i in ids], ts, events)

    def _inbound_acks(self, p_ids: Sequence[int], s_acks: Sequence[tuple[int, str]], ts: int,
                      events: list[dict[str, Any]]) -> None:
        """Apply the confirmations of a batch to pending-ack rows: REACK sets
        ``p_ack`` (``p_ids``: the platform's), REACK2 ``s_ack`` (``s_acks``:
        (id, sender org); only the row's origin confirms it, anything else
        changes nothing); a row with every confirmation it needs is deleted
        instead of updated (SPEC B.2). Each confirmation is logged, the
        clean-up too. Both kinds at once: a drained copy's REACK (from the
        platform) and REACK2 (from the origin) often arrive in the same read,
        and the row then goes in one DELETE instead of an UPDATE and a
        DELETE."""
        if not p_ids and not s_acks:
            return
        got_p, got_s = set(p_ids), dict(s_acks)
        ids = list(dict.fromkeys([*p_ids, *got_s]))
        acked = int(AckStatus.AS_ACK)
        me = self.me.node_id
        done, marked = [], []
        held = self._held_in
        rows: list[Any] = []
        if held:  # rows still in memory: confirmed there, never written if complete
            hits, ids = split_held(ids, held)
            rows += [(rid, h[2], h[3], h[4], h[5], h[11], h[12]) for rid, h in hits]
        if ids:
            rows += rows_by_id(
                self.conn, "SELECT id, origin_id, semq_id, semq_db_id, record_id, p_ack, s_ack FROM inbound", ids)
        for rid, origin, sid, did, rec, p_ack, s_ack in rows:
            lk0 = f"{origin}/{sid}/{did}/{rec}"
            by_p, by_s = rid in got_p, got_s.get(rid) == origin
            if not (by_p or by_s):
                continue  # a REACK2 from someone else than the document's origin
            if by_p:
                p_ack = acked
                events.append({"ts": ts, "role": "receiver", "event": "reack", "lk0": lk0,
                               "source": origin, "target": me})
            if by_s:
                s_ack = acked
                events.append({"ts": ts, "role": "receiver", "event": "reack2", "lk0": lk0,
                               "source": origin, "target": me})
            h = held.get(rid) if held else None
            if _MAY_CLEAN[(p_ack, s_ack)]:
                if h is None:
                    done.append((rid,))
                else:
                    del held[rid]
                    self._held_in_keys.pop(h[1:6], None)
                events.append({"ts": ts, "role": "receiver", "event": "cleaned", "lk0": lk0,
                               "source": origin, "target": me})
            elif h is None:
                marked.append((p_ack, s_ack, rid))
            else:
                held[rid] = (*h[:11], p_ack, s_ack, *h[13:])
        self.conn.executemany("UPDATE inbound SET p_ack=?, s_ack=? WHERE id=?", marked)
        self.conn.executemany("DELETE FROM inbound WHERE id=?", done)

    def _flush_inbound_acks(self, ts: int, events: list[dict[str, Any]]) -> None:
        """Confirmations found while handling a batch (``_acks``): applied
        together, before any frame of another kind, and at the end of the
        batch."""
        p_ids, s_ids = self._queued_acks
        if p_ids or s_ids:
            self._queued_acks = ([], [])
            self._inbound_acks(p_ids, s_ids, ts, events)

    # ------------------------------------------------------------ inquiries

    def _answer(self, frame: Frame, q: Inquiry, ts: int, out: Output, events: list[dict[str, Any]]) -> None:
        """SPEC B.3 / A.5: answer "did you receive" from the dedup table, and
        "what is the state of your record" from the pending-send table."""
        answers: list[InquiryAnswer] = []
        asker = frame.origin
        if q.topic is InquiryTopic.RECEIVED:
            # Only the document's origin (and the platform, about the copies
            # it delivered) learns whether it arrived: metadata stays
            # between the two parties. Anyone else hears NO_RECORD.
            platform = asker.node_type is NodeType.PLATFORM
            proven: list[tuple[LK0, bytes]] = []
            for lk in q.items:
                if not platform and lk.endpoint != asker:
                    answers.append(InquiryAnswer(lk, InquiryResult.NO_RECORD))
                    continue
                row = self.conn.execute(
                    "SELECT digest FROM dedup WHERE origin_type=? AND origin_id=? AND semq_id=? AND"
                    " semq_db_id=? AND record_id=?",
                    (int(lk.endpoint.node_type), lk.endpoint.node_id, lk.semq_id, lk.semq_db_id, lk.record_id),
                ).fetchone()
                answers.append(InquiryAnswer(lk, InquiryResult.RECEIVED if row else InquiryResult.NOT_RECEIVED))
                if row and row[0] and not platform and self.sec is not None:
                    proven.append((lk, row[0]))
            if proven:
                # The origin confirms only by a receipt: "received" comes as
                # an ACK2 with one, from the digest kept with the dedup row.
                assert self.sec is not None
                key = self.sec.identity.keys.signing_key
                for i in range(0, len(proven), 10_000):
                    part = proven[i:i + 10_000]
                    entries = tuple(AckEntry(1, 1, 0, lk.semq_id, lk.semq_db_id, lk.record_id, _DELIVERY, 0)
                                    for lk, _ in part)
                    out.add(Frame(kind=Kind.ACK_BATCH, source=self.me, target=asker,
                                  body=AckBatch(ack_kind=Kind.ACK2, entries=entries,
                                                receipt=make_batch_receipt(part, key))))
        else:
            mine = [lk for lk in q.items if lk.endpoint == self.me]
            if self.sec is None:
                res = dict(self._origin_apply([(lk.record_id, OriginEvent.TARGET_ASKS) for lk in mine],
                                              ts, out, events, defaultdict(list), peer=asker))
            else:
                # With security the target's word settles nothing (a relay
                # could speak in its name): only its receipt does, which
                # our own inquiry fetches. Answered, so it stops asking.
                res = self._peek_answers([lk.record_id for lk in mine], asker)
            answers = [InquiryAnswer(lk, res.get(lk.record_id, InquiryResult.NO_RECORD)) for lk in q.items]
        out.add(Frame(kind=Kind.INQUIRY_RESP, source=self.me, target=asker,
                      body=InquiryResp(topic=q.topic, answers=tuple(answers))))

    def _peek_answers(self, ids: Sequence[int], peer: Endpoint) -> dict[int, InquiryResult]:
        """What a STATE inquiry about our records ``ids`` from their target
        ``peer`` is answered, without changing them: ALREADY_ACKED for a
        confirmed row, MARKED_ACKED ("noted") for an open one, NO_RECORD for
        one that is gone or not the asker's."""
        hits, rest = split_held(list(ids), self._held_sent)
        targets = {rid: (h[2], _SS_INIT) for rid, h in hits}
        if rest:
            targets.update((r[0], (r[1], r[2])) for r in rows_by_id(
                self.conn, "SELECT id, target_id, state FROM outbox", rest))
        out = {}
        for rid, (target, state) in targets.items():
            if target == peer.node_id:
                out[rid] = _ANSWER_ACKED if state == _SS_ACK2 else _ANSWER_MARKED
        return out

    def _answers(self, frame: Frame, r: InquiryResp, ts: int, out: Output, events: list[dict[str, Any]]) -> None:
        from_platform = frame.origin.node_type is NodeType.PLATFORM
        if r.topic is InquiryTopic.RECEIVED:
            items = []
            for lk, result in r.answers:
                if lk.endpoint != self.me:
                    continue
                has = result in (InquiryResult.RECEIVED, InquiryResult.FORWARDED, InquiryResult.STORED)
                if from_platform:
                    # The platform's answer stands for the ack that was lost.
                    ev = {InquiryResult.FORWARDED: OriginEvent.ACK_FWD, InquiryResult.STORED: OriginEvent.ACK_SAVE,
                          InquiryResult.RECEIVED: OriginEvent.PLATFORM_HAS}.get(result, OriginEvent.PLATFORM_LACKS)
                elif has and self.sec is not None:
                    continue  # proven by the ACK2 with a receipt that comes with it, or not at all
                elif result is InquiryResult.NO_RECORD:
                    continue  # not an answer about a document the target received or lacks
                else:
                    ev = OriginEvent.TARGET_HAS if has else OriginEvent.TARGET_LACKS
                items.append((lk.record_id, ev))
            acks: dict[tuple[Kind, Endpoint], list[AckEntry]] = defaultdict(list)
            self._origin_apply(items, ts, out, events, acks, peer=frame.origin)
            # TARGET_HAS means B has it; SPEC A.5: answer REACK2 so B may clean up.
        else:
            col = "p_ack" if from_platform else "s_ack"
            self.write_held()  # the look-ups below read the pending-ack table
            ids = []
            for lk, _result in r.answers:
                # Every STATE answer (marked, already acked, no record) confirms (SPEC B.2).
                if from_platform:
                    row = self.conn.execute(
                        "SELECT id FROM inbound INDEXED BY inbound_lk1 WHERE lk1_record_id=? AND lk1_record_id != 0"
                        " AND lk1_semq_id=? AND lk1_semq_db_id=? AND platform_id=?",
                        (lk.record_id, lk.semq_id, lk.semq_db_id, frame.origin.node_id),
                    ).fetchone()
                elif lk.endpoint != frame.origin:
                    continue  # only a document's origin answers for it
                else:
                    row = self.conn.execute(
                        "SELECT id FROM inbound WHERE origin_type=? AND origin_id=? AND semq_id=? AND"
                        " semq_db_id=? AND record_id=?",
                        (int(lk.endpoint.node_type), lk.endpoint.node_id, lk.semq_id, lk.semq_db_id, lk.record_id),
                    ).fetchone()
                if row:
                    ids.append(int(row[0]))
            self._inbound_ack(col, ids, frame.origin.node_id, ts, events)

    def inquiries(self, *, platform_online: bool = True) -> Output:
        """SPEC A.5 and B.2: the inquiries that are due now, as frames, with
        their inquiry time set. Rows ask again after the interval, doubling
        per unanswered inquiry up to 15 minutes (long-offline targets)."""
        out = Output()
        if not platform_online:
            return out
        ts = now_ms()
        events: list[dict[str, Any]] = []
        with self._tx():
            # A held row must not look SS_SENT to an inquiry due now, nor a
            # held pending-ack row be missed by one.
            self.write_held(ts - min(HOLD_MS, self.inquiry_ms // 2))
            self.reread_send_order()  # rows another process put back to SS_INIT
            due = (
                "last_inquiry_ms + min(?, ? * (1 << min(inquiries, 6))) <= ?"
            )
            args = (MAX_INQUIRY_BACKOFF_MS, self.inquiry_ms, ts)
            # SS_SENT asks P, and so does SS_ACK (stored: P owns delivery;
            # see ORIGIN_TABLE); SS_ACK_FWD (every SaveFwd) asks B.
            # Through the partial index outbox_due: only the rows due now.
            rows = self.conn.execute(
                f"SELECT {_OUT_COLS} FROM outbox INDEXED BY outbox_due WHERE reliable=1 AND state BETWEEN 1 AND 3"
                f" AND due_ms <= ? AND (state IN (1, 2) OR save_fwd=3 OR ack2=1) ORDER BY due_ms LIMIT ?",
                (ts, INQUIRY_BATCH * 4),
            ).fetchall()
            to_p: list[LK0] = []
            to_b: dict[Endpoint, list[LK0]] = defaultdict(list)
            for r in rows:
                lk = LK0(endpoint=self.me, record_id=r[0])
                if r[3] in (SendState.SS_SENT, SendState.SS_ACK):
                    to_p.append(lk)
                    events.append(self._origin_event(r, "inquiry", ts, detail="platform"))
                else:
                    to_b[Endpoint(node_type=r[1], node_id=r[2])].append(lk)
                    events.append(self._origin_event(r, "inquiry", ts, detail="target"))
            self.conn.executemany(
                "UPDATE outbox SET last_inquiry_ms=?, due_ms=?+min(?, ?*(1 << min(inquiries+1, 6))),"
                " inquiries=inquiries+1 WHERE id=?",
                [(ts, ts, MAX_INQUIRY_BACKOFF_MS, self.inquiry_ms, r[0]) for r in rows],
            )
            for target, lks in [(self.platform, to_p), *to_b.items()]:
                for i in range(0, len(lks), INQUIRY_BATCH):
                    out.add(Frame(kind=Kind.INQUIRY, source=self.me, target=target,
                                  body=Inquiry(topic=InquiryTopic.RECEIVED, items=tuple(lks[i:i + INQUIRY_BATCH]),
                                               flag=InquiryFlag.FROM_PEER)))
            # Pending-ack rows: ask the platform (P_ACK) and the origin (S_ACK).
            # At most INBOUND_SWEEP rows per round, in id order from where the
            # last round stopped, so a huge table is asked about over several
            # rounds (a row waits at most size/INBOUND_SWEEP rounds more).
            start = self._inbound_sweep
            edge = self.conn.execute("SELECT id FROM inbound WHERE id > ? ORDER BY id LIMIT 1 OFFSET ?",
                                     (start, INBOUND_SWEEP - 1)).fetchone()
            end = int(edge[0]) if edge else 1 << 62
            inb = self.conn.execute(
                f"SELECT id, origin_type, origin_id, semq_id, semq_db_id, record_id, lk1_semq_id,"
                f" lk1_semq_db_id, lk1_record_id, platform_type, platform_id, p_ack, s_ack FROM inbound"
                f" WHERE id > ? AND id <= ? AND (p_ack=0 OR s_ack=0) AND {due} ORDER BY id LIMIT ?",
                (start, end, *args, INQUIRY_BATCH * 4),
            ).fetchall()
            # Resume after the last row read: the rest of this window when the
            # LIMIT cut it, the next window, or from the start after the end.
            if len(inb) == INQUIRY_BATCH * 4:
                self._inbound_sweep = int(inb[-1][0])
            else:
                self._inbound_sweep = end if edge else 0
            to_pp: dict[Endpoint, list[LK0]] = defaultdict(list)
            to_o: dict[Endpoint, list[LK0]] = defaultdict(list)
            for r in inb:
                if r[11] == 0 and r[8]:
                    pe = Endpoint(node_type=r[9], node_id=r[10])
                    to_pp[pe].append(LK0(endpoint=pe, semq_id=r[6], semq_db_id=r[7], record_id=r[8]))
                if r[12] == 0:
                    oe = Endpoint(node_type=r[1], node_id=r[2])
                    to_o[oe].append(LK0(endpoint=oe, semq_id=r[3], semq_db_id=r[4], record_id=r[5]))
            self.conn.executemany(
                "UPDATE inbound SET last_inquiry_ms=?, inquiries=inquiries+1 WHERE id=?",
                [(ts, r[0]) for r in inb],
            )
            for group in (to_pp, to_o):
                for target, lks in group.items():
                    for i in range(0, len(lks), INQUIRY_BATCH):
                        out.add(Frame(kind=Kind.INQUIRY, source=self.me, target=target,
                                      body=Inquiry(topic=InquiryTopic.STATE, items=tuple(lks[i:i + INQUIRY_BATCH]))))
        self._emit(events)
        return out

    def reconnected(self) -> None:
        """After a new session: SS_SENT rows ask the platform at once rather
        than after the interval (their answers may have been lost)."""
        with self._tx():
            self.write_held()
            self.conn.execute("UPDATE outbox SET last_inquiry_ms=0, due_ms=0, inquiries=0 WHERE state=1")

    def housekeeping(self) -> int:
        """Bounded tables: dedup rows past the retention, failed rows past
        theirs, consumed inbox rows after a day. Returns rows removed."""
        ts = now_ms()
        n = 0
        with self._tx():
            n += self.conn.execute("DELETE FROM dedup WHERE received_ms < ?", (ts - DEDUP_RETENTION_MS,)).rowcount
            n += self.conn.execute(
                "DELETE FROM outbox WHERE state=? AND state_ms < ?", (int(SendState.SS_FAILED), ts - FAILED_RETENTION_MS)
            ).rowcount
            n += self.conn.execute(
                "DELETE FROM inbox WHERE consumed_ms IS NOT NULL AND consumed_ms < ?", (ts - 24 * 3600 * 1000,)
            ).rowcount
            n += self.conn.execute(
                "DELETE FROM receipts WHERE received_ms < ? AND (received_ms > 0 OR record_id NOT IN"
                " (SELECT id FROM outbox))", (ts - RECEIPT_RETENTION_MS,)
            ).rowcount
            # A batch's rows share its received_ms: they go together.
            self.conn.execute("DELETE FROM receipt_batches WHERE received_ms < ?", (ts - RECEIPT_RETENTION_MS,))
        return n

    # ------------------------------------------------------------ status

    def held(self) -> bool:
        """Whether anything is held in memory (write_held would write)."""
        return bool(self._held_sent or self._held_fwd or self._held_in)

    def state_counts(self) -> dict[str, int]:
        """Pending-send rows per state name (an unknown state by its
        number), held SS_SENT and SS_ACK_FWD states counted where they are."""
        states: dict[str, int] = {}
        for s, n in self.conn.execute("SELECT state, count(*) FROM outbox GROUP BY state"):
            states[_SEND_STATES[s].name if s in _SEND_STATES else str(s)] = n
        if self._held_sent:  # SS_INIT on disk, SS_SENT in memory
            moved = min(len(self._held_sent), states.get("SS_INIT", 0))
            states["SS_INIT"] = states.get("SS_INIT", 0) - moved
            states["SS_SENT"] = states.get("SS_SENT", 0) + moved
        if self._held_fwd:  # SS_SENT on disk, SS_ACK_FWD in memory
            moved = min(len(self._held_fwd), states.get("SS_SENT", 0))
            states["SS_SENT"] = states.get("SS_SENT", 0) - moved
            states["SS_ACK_FWD"] = states.get("SS_ACK_FWD", 0) + moved
        return states

    def pending_ack_count(self) -> int:
        """Pending-ack rows, those held in memory included."""
        return int(self.conn.execute("SELECT count(*) FROM inbound").fetchone()[0]) + len(self._held_in)

    def counts(self) -> dict[str, Any]:
        c = self.conn
        states = self.state_counts()
        oldest = c.execute("SELECT min(created_ms) FROM outbox WHERE state NOT IN (4, 9)").fetchone()[0]
        return {
            "outbox": states,
            "pending_ack": self.pending_ack_count(),
            "inbox_unread": c.execute("SELECT count(*) FROM inbox WHERE consumed_ms IS NULL").fetchone()[0],
            "inbox_total": c.execute("SELECT count(*) FROM inbox").fetchone()[0],
            "dedup": c.execute("SELECT count(*) FROM dedup").fetchone()[0],
            "oldest_unconfirmed_ms": oldest,
        }


_ = (LK1, ForwardFlag, StoreError)
