"""The node's synchronous core: store + engine, one transaction per batch.

``NodeCore`` is the facade over the node's roles — ``Origin``
(semq.node.origin), ``Receiver`` (semq.node.receiver), ``Inquiries``,
``Housekeeping`` and the ``Operator``'s actions — and over the owners of
its tables (docs/architecture.md, "The node: who owns which table"), which
share one store (``NodeContext``). The facade owns the transaction, writes
the owners' deferred writes together, and dispatches each frame through a
table by kind.

Every public method runs in one SQLite transaction and returns the frames
(encoded bytes) that may leave only after it returned, i.e. after COMMIT —
SPEC: "every state change is committed before the acknowledgement that
depends on it leaves the process". The trio daemon calls these on one
worker thread per store (semq.node.daemon). A store error is translated at
one point for every caller outside the daemon (``transaction``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import Any, Final, TypeVar

from peewee import SqliteDatabase

from semq.identity.security import NodeSecurity
from semq.session.ports import FramePort
from semq.store.db import STORE_ERRORS, translate
from semq.tracking.events import EventLog
from semq.umxt_protocol import (
    LK0,
    Ack,
    AckBatch,
    AckEntry,
    Chunk,
    Data,
    Endpoint,
    Kind,
    NodeType,
    RawFrame,
    RemoteProtocolError,
    ResultCode,
)

from .batch import Batch, NodeContext, Output
from .engine import OPERATOR, OperatorAction, OriginEvent, SendState, TransitionRefused
from .housekeeping import FAILED_RETENTION_MS, Housekeeping
from .inquiries import Inquiries
from .large.outgoing import LargeOut
from .origin.channels import ChannelsOut
from .origin.documents import NewDocument, document_flags
from .origin.operator import Operator
from .origin.outbox import Outbox, OutboxFilter
from .origin.receipts import RECEIPT_RETENTION_MS, Receipts, write_digests
from .origin.role import Origin
from .receiver.inbox import Inbox
from .receiver.pending_ack import PendingAcks
from .receiver.role import DEDUP_RETENTION_MS, Receiver
from .rows import DEFER_MS, MAX_INQUIRY_BACKOFF_MS, Deferred
from .store import open_node_store
from .users import Users

__all__ = [
    "DEDUP_RETENTION_MS",
    "DEFAULT_CLOCK_SKEW_MS",
    "DEFER_MS",
    "FAILED_RETENTION_MS",
    "MAX_INQUIRY_BACKOFF_MS",
    "RECEIPT_RETENTION_MS",
    "NewDocument",
    "NodeCore",
    "Output",
    "document_flags",
]

log = logging.getLogger("semq.node")
R = TypeVar("R", bound=tuple[Any, ...])

# How far a sender's clock may be off ours. A document is refused (STALE)
# when its signed creation time lies more than this in the future, or
# further in the past than DEDUP_RETENTION_MS minus this: its dedup row
# could be gone, and a copy replayed then would be delivered twice
# (docs/exactly-once.md). Configurable (``clock_skew`` in semq.toml).
DEFAULT_CLOCK_SKEW_MS: Final = 10 * 60 * 1000
_ACK_EVENTS: Final = {Kind.ACK_FWD: OriginEvent.ACK_FWD, Kind.ACK_SAVE: OriginEvent.ACK_SAVE,
                      Kind.ACK2: OriginEvent.ACK2}


def _merged(a: Output, b: Output) -> Output:
    """Two batches' outputs as one (a batch applied in halves: NodeCore.handle)."""
    for f in fields(Output):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, int):
            setattr(a, f.name, x + y)
        elif isinstance(x, set):
            x |= y
        else:
            x.extend(y)
    return a


class _LogAfterCommit(EventLog):
    """The records logged inside a ``transaction`` not committed yet: they
    reach the real log after the COMMIT (docs/events.md: the log never
    claims more than the store holds)."""

    def __init__(self) -> None:
        super().__init__(Path("."), "", "")
        self.records: list[dict[str, Any]] = []

    def write(self, records: list[dict[str, Any]]) -> None:
        self.records.extend(records)

    def close(self) -> None:
        pass


class NodeCore:
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
        unit: int = 1,
    ) -> None:
        path = Path(store_path)
        db: SqliteDatabase = open_node_store(path, create=create, synchronous=synchronous, check=check)
        conn = db.connection()
        inquiry_ms = int(inquiry_interval * 1000)
        # With security, DATA is signed (and sealed unless the sender asked
        # --no-encrypt) when it is sent, and verified before the inbox.
        self.ctx = ctx = NodeContext(
            path=path, db=db, conn=conn, me=Endpoint.org(org), platform=platform or Endpoint.platform(),
            sec=security, log=EventLog(events_dir, f"org:{org}", "origin", unit=unit) if events_dir else None,
            inquiry_ms=inquiry_ms, skew_ms=int(clock_skew * 1000), unit=unit)
        self.unit = unit  # which of the node's units this store is (semq.umxt_protocol.units)
        self.path, self.db, self.conn, self.me, self.sec = path, db, conn, ctx.me, security
        # The owners of the node's tables (docs/architecture.md).
        self.outbox = Outbox(ctx, partial(write_digests, conn))
        self.receipts = Receipts(ctx, self.outbox)
        self.large_out = LargeOut(ctx, self.outbox)
        self.inbox = Inbox(ctx)
        self.pending_acks = PendingAcks(ctx)
        self.users = Users(ctx)
        # The roles.
        self.origin = Origin(ctx, self.outbox, self.receipts, ChannelsOut(ctx), self.large_out)
        self.receiver = Receiver(ctx, self.inbox, self.pending_acks, self.users)
        self.large_in = self.receiver.large
        self.inquiry = Inquiries(ctx, self.origin, self.receiver)
        self.house = Housekeeping(ctx, self.outbox, self.receipts, self.large_out, self.inbox, self.pending_acks,
                                  self.receiver)
        # The operator's and the features' transitions (semq.node.features.dead, semq.ops);
        # an ordered document deleted by them is announced to its receiver first.
        self.operator = Operator(self.outbox, lambda ids: self.origin.announce_gaps(nullcontext, ids))
        # The owners that defer writes, in the order they are written.
        self._deferred: tuple[Deferred, ...] = (self.outbox, self.pending_acks)
        # How each frame kind is handled within a batch (frames for another
        # endpoint are refused before this; kinds not here are ignored).
        self._dispatch: dict[Kind, Callable[[Batch, RawFrame], None]] = {
            Kind.DATA: self.receiver.data,
            Kind.ACK_BATCH: self._ack_batch,
            Kind.ACK: self._ack, Kind.ACK2: self._ack, Kind.ACK_FWD: self._ack, Kind.ACK_SAVE: self._ack,
            Kind.REACK: self._ack, Kind.REACK2: self._ack,
            Kind.NACK: self._nack,
            Kind.INQUIRY: self._inquiry,
            Kind.INQUIRY_RESP: self._inquiry_resp,
            Kind.CHUNK: self.receiver.large.chunk,
            Kind.CHUNK_ACK: self.large_out.chunk_ack,
        }

    # What changes at run time (a reload, the platform's WELCOME, the API).

    @property
    def inquiry_ms(self) -> int:
        return self.ctx.inquiry_ms

    @inquiry_ms.setter
    def inquiry_ms(self, value: int) -> None:
        self.ctx.inquiry_ms = value

    @property
    def skew_ms(self) -> int:
        return self.ctx.skew_ms

    @skew_ms.setter
    def skew_ms(self, value: int) -> None:
        self.ctx.skew_ms = value

    @property
    def platform(self) -> Endpoint:
        return self.ctx.platform

    @platform.setter
    def platform(self, value: Endpoint) -> None:
        self.ctx.platform = value

    @property
    def log(self) -> EventLog | None:
        return self.ctx.log

    @log.setter
    def log(self, value: EventLog | None) -> None:
        self.ctx.log = value

    # ------------------------------------------------------------ transactions and deferred writes

    @contextmanager
    def _tx(self) -> Iterator[None]:
        """One IMMEDIATE transaction (the write lock taken at BEGIN, so the
        busy timeout applies: a deferred read-then-write transaction fails at
        once with "database is locked" when another process wrote in
        between). If it does not commit, the deferred writes are dropped, as
        a crash would drop them: they may have changed in the transaction,
        the store is the truth, and what it lacks the inquiries recover
        (docs/design.md). Store errors raise as they are (the daemon keeps
        everything and tries again)."""
        try:
            with self.db.atomic("IMMEDIATE"):
                yield
        except BaseException:
            for d in self._deferred:
                d.drop_deferred()
            raise

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One write transaction for callers outside the daemon's batches
        (``accept``, an application's ``NodeClient``, the node's features).
        Methods called inside it join it (a savepoint): their rows commit or
        vanish together. Records logged inside it (``log``) reach the
        delivery log only after the commit. The one point where the store's
        errors are translated: raises StoreError (disk full, read-only,
        locked) with nothing written. (What the owners defer stays: a
        feature's refusal, raised inside, is no reason to drop it.)"""
        real = self.ctx.log
        pending = _LogAfterCommit()
        self.ctx.log = pending if real is not None else None
        try:
            with self.db.atomic("IMMEDIATE"):
                yield
        except STORE_ERRORS as e:
            raise translate(e, self.path, "node store") from e
        finally:
            self.ctx.log = real
        if real is not None and pending.records:
            real.write(pending.records)

    def deferred(self) -> bool:
        """Whether any owner defers a write (write_deferred would write)."""
        return any(self._deferred)

    def write_deferred(self, before_ms: int | None = None) -> None:
        """Write what the owners defer (all of it, or what was deferred at
        or before ``before_ms``), inside the caller's transaction: the
        outbox's states (SS_SENT, then SS_ACK_FWD), then new pending-ack rows."""
        for d in self._deferred:
            d.write_deferred(before_ms)

    def write_deferred_now(self) -> None:
        """Everything deferred, written in a transaction of its own (a clean stop)."""
        if self.deferred():
            with self._tx():
                self.write_deferred()

    def reread_send_order(self) -> None:
        """Rows may have become SS_INIT in another process (a requeued dead
        letter): the next claim reads the whole send order again, not only
        after the rows in flight."""
        self.outbox.order.forget()

    def close(self) -> None:
        try:
            self.write_deferred_now()
        except STORE_ERRORS:
            # Lost as in a crash (docs/design.md says what that costs).
            pass
        if self.ctx.log:
            self.ctx.log.close()
        self.receiver.close()
        self.db.close()

    # ------------------------------------------------------------ the origin

    def accept(self, docs: Iterable[NewDocument]) -> list[LK0]:
        """Write documents to the pending-send table (SS_INIT). Durable when
        this returns. Raises StoreError (disk full, read-only) with nothing
        accepted, or LocalProtocolError for an invalid document (its
        subclass DocumentTooLarge for one no frame can carry: it could never
        be sent; semq.node.limits)."""
        return self.origin.accept(docs, self.transaction)

    def claim(self, limit: int, skip_targets: frozenset[str] = frozenset(), port: FramePort | None = None, *,
              only: str | None = None, write_deferred: bool = True, write_held: bool | None = None) -> Output:
        """SPEC A.2: take up to ``limit`` SS_INIT rows (priority first, then
        acceptance order), mark them SS_SENT (deferred in memory first:
        semq.node.origin.outbox), commit, and return their DATA frames. Expired
        rows fail with EXPIRED instead; best-effort rows are deleted as they
        go (never retried). With security, the batch is signed under one
        signature (each document still verifies alone) and sealed to the
        target's certificates; rows whose target certificate is not known
        yet stay SS_INIT and their target is in ``out.missing``
        (``skip_targets``: targets already asked for).

        ``port``, when given, gets the DATA frames just before the commit
        instead of ``out.data`` (``out.early`` counts them), so they travel
        while the commit waits for the disk: a document promises nothing (no
        ack of ours depends on it). If the commit fails, the rows stay SS_INIT
        and go again; the receiver's duplicate suppression keeps the
        application's view exactly once, and acks of the first copy find the
        row SS_INIT (ACK2 confirms it; ACK_FWD / ACK_SAVE leave it to be sent
        again: ORIGIN_TABLE).

        ``only``: the documents to that one organization, for a direct link
        to it (their events say ``path: direct``). ``write_deferred=False``:
        leave the deferred states unwritten (a claim of the documents for
        this node's own users while the platform is away); ``write_held`` is
        its old name, until semq/node/daemon.py says ``write_deferred``."""
        if write_held is not None:
            write_deferred = write_held
        out = Output()
        ts = self.ctx.now()
        events: list[dict[str, Any]] = []
        if self.sec is not None:
            self.receipts.salt_key()
        with self._tx():
            if self.outbox.sent and write_deferred:
                self.write_deferred(ts - DEFER_MS)  # (may empty it)
            self.origin.claim(limit, skip_targets, port, out, events, ts, only=only,
                              path="relay" if only is None else "direct")
        self.ctx.emit(events)
        return out

    def announce_gaps(self, ids: Collection[int] | None = None) -> int:
        """Queue gap notices for failed ordered documents (semq.node.receiver.channels)."""
        return self.origin.announce_gaps(self._tx, ids)

    def waiting_channels(self) -> list[Any]:
        """The ordered channels that hold documents back (ChannelWait)."""
        return self.receiver.channels.waiting()

    def pending_targets(self, limit: int = 1000) -> set[str]:
        """Organizations with documents waiting to be sent (SS_INIT)."""
        return self.outbox.pending_targets(limit)

    def send_again(self, ids: Collection[int]) -> int:
        """Documents sent on a direct link that broke before their answer
        came (``LINK_LOST``): those still SS_SENT go back to SS_INIT and are
        sent again, on whichever path is up — except SaveFwd 1, taken as
        forwarded and asked about (ORIGIN_TABLE says why). Rows answered
        meanwhile are left as they are. Returns how many were taken off the
        link."""
        if not ids:
            return 0
        ts = self.ctx.now()
        out = Output()
        events: list[dict[str, Any]] = []
        with self._tx():
            self.origin.apply([(rid, OriginEvent.LINK_LOST) for rid in ids], ts, out, events, None)
        self.ctx.emit(events)
        return out.settled

    def fail_target(self, target: Endpoint, code: ResultCode, detail: str, *,
                    save_fwd: int | None = None) -> int:
        """Fail every not-yet-sent document to ``target`` (SS_INIT ->
        SS_FAILED with ``code``: CANNOT_SEND), or only those with
        ``save_fwd``. Returns how many."""
        with self._tx():
            events = self.origin.fail_target(target, code, detail, save_fwd)
        self.ctx.emit(events)
        return len(events)

    def wait_target(self, target: Endpoint, code: ResultCode | int, waiting: Collection[int]) -> int:
        """The not-yet-sent documents to ``target`` wait for a certificate:
        they stay SS_INIT and carry ``code`` (one of ``waiting``), why they
        wait, for ``semq messages`` and ``semq admin stuck``; ``code`` 0 (a
        certificate came) clears it. Rows in flight are SS_INIT on disk
        too: the code goes with them and their next state replaces it.
        Returns how many rows changed."""
        with self._tx():
            return self.origin.wait_target(target, code, waiting)

    def pending_count(self) -> int:
        """Documents not sent yet."""
        return self.outbox.pending_count()

    def receipt_proof(self, record_id: int) -> tuple[str, bytes, bytes, int] | None:
        """(receiver, digest, self-standing receipt, received_ms) of one of our
        documents, or None when no receipt is kept."""
        return self.receipts.proof(record_id)

    # ------------------------------------------------------------ a batch of frames

    def handle(self, frames: Sequence[RawFrame], *, direct: Endpoint | None = None) -> Output:
        """Apply a batch of frames from the platform (or, ``direct``, from
        that organization over a direct link) in one transaction; the
        answers (acks, REACK2, inquiry answers) are in the Output.

        No frame's bytes can end the daemon: a batch that fails other than
        by the store (a bug, MemoryError, a library that raises what it
        should not on hostile input) is rolled back and applied again in
        halves, down to the one frame that fails alone, which is refused
        (``_quarantine``); every other frame of the batch is applied as if
        nothing happened. Store errors still raise (the daemon keeps
        everything and tries again later)."""
        try:
            return self._handle(frames, direct)
        except STORE_ERRORS:
            raise
        except Exception as e:
            if len(frames) == 1:
                return self._quarantine(frames[0], e)
            mid = len(frames) // 2
            first = self.handle(frames[:mid], direct=direct)
            return _merged(first, self.handle(frames[mid:], direct=direct))

    def _quarantine(self, raw: RawFrame, exc: Exception) -> Output:
        """A frame that fails alone: logged with its traceback, and refused
        in a transaction of its own. A document (a DATA, or the large
        document a CHUNK belongs to) gets a signed NACK with INTERNAL_ERROR,
        so its origin fails it instead of sending it again for ever (its
        stored copy is settled at the platform); anything else is dropped
        (its sender asks again). If even that fails, the frame is dropped;
        the daemon goes on."""
        detail = f"{raw.kind.name} from {raw.origin} could not be handled: {type(exc).__name__}: {exc}"[:500]
        log.error("%s; refused", detail, exc_info=exc)
        ts = self.ctx.now()
        b = Batch(ts=ts, window=(ts, ts), direct=None)
        try:
            with self._tx(), self.receiver.large.batch():
                if raw.kind is Kind.DATA and raw.target == self.me:
                    frame = raw.frame()
                    d = frame.body
                    assert isinstance(d, Data)
                    self.receiver.refuse(b, frame, d, ResultCode.INTERNAL_ERROR, detail)
                elif raw.kind is Kind.CHUNK and raw.target == self.me:
                    c = raw.frame().body
                    assert isinstance(c, Chunk)
                    self.receiver.large.refuse_transfer(b, c.lk0, ResultCode.INTERNAL_ERROR, detail)
                b.ack_frames(self.me, self.sec)
        except STORE_ERRORS:
            raise
        except Exception:
            log.exception("refusing the %s from %s failed too; dropped", raw.kind.name, raw.origin)
            return Output(errors=[(ResultCode.INTERNAL_ERROR, detail)])
        self.ctx.emit(b.events)
        if not b.out.errors:  # (a refusal says so itself)
            b.out.errors.append((ResultCode.INTERNAL_ERROR, detail))
        return b.out

    def _handle(self, frames: Sequence[RawFrame], direct: Endpoint | None) -> Output:
        ts = self.ctx.now()
        b = Batch(ts=ts, window=(ts - DEDUP_RETENTION_MS + self.ctx.skew_ms, ts + self.ctx.skew_ms), direct=direct)
        receiver, dispatch, me = self.receiver, self._dispatch, self.me
        receiver.open_batch(b, frames)
        with self._tx(), receiver.large.batch():
            self.write_deferred(ts - DEFER_MS)
            receiver.begin(b, frames)
            for raw in frames:
                kind = raw.kind
                try:
                    if kind is not Kind.DATA:
                        receiver.flush(b)  # later frames may refer to rows just received
                    if kind is not Kind.ACK_BATCH:
                        receiver.flush_confirmations(b)  # ... or to rows confirmations delete
                    if raw.target != me:
                        raise RemoteProtocolError(f"{kind.name} for {raw.target} reached {me}",
                                                  ResultCode.UNEXPECTED_FRAME)
                    handler = dispatch.get(kind)
                    if handler is not None:
                        handler(b, raw)
                except RemoteProtocolError as e:
                    b.out.errors.append((e.code, str(e)))
            receiver.flush(b)
            receiver.large.finish(b)
            receiver.flush(b)
            receiver.flush_confirmations(b)
            receiver.reserve_ids(b)
            b.ack_frames(self.me, self.sec)
        self.ctx.emit(b.events)
        return b.out

    def _ack_batch(self, b: Batch, raw: RawFrame) -> None:
        frame = raw.frame()
        body = frame.body
        assert isinstance(body, AckBatch)
        # An ACK2 straight from the target (a direct link) is not confirmed
        # with REACK2: see Receiver._receive.
        self._acks(b, body.ack_kind, body.entries, frame.origin, body.receipt, reack2=b.direct is None)

    def _ack(self, b: Batch, raw: RawFrame) -> None:
        frame = raw.frame()
        body = frame.body
        if isinstance(body, Ack):
            self._acks(b, raw.kind, (body.entry,), frame.origin, body.receipt)

    def _acks(self, b: Batch, kind: Kind, entries: Sequence[AckEntry], peer: Endpoint, receipt: bytes, *,
              reack2: bool = True) -> None:
        """Acks of our documents go to the origin role (an ACK2 only with a
        receipt that proves it, with security); confirmations of our acks
        to the receiver role. ACK from a node is for the platform only."""
        if kind is Kind.ACK2 and self.sec is not None:
            # With security a delivery is confirmed only by the receiver's
            # signed receipt (SPEC "What a receipt proves").
            entries = self.receipts.proven(b, entries, peer, receipt)
            if not entries:
                return
        ev = _ACK_EVENTS.get(kind)
        if ev is not None:
            self.origin.apply([(e.dest_ref_id, ev, e) for e in entries], b.ts, b.out, b.events,
                              b.acks if reack2 else None, peer=peer)
            if kind is Kind.ACK_SAVE:  # (a large document's chunks go to the platform too)
                self.large_out.stored_manifests(b, [e.dest_ref_id for e in entries])
            elif kind is Kind.ACK2:  # (a large document's copy is no longer needed)
                self.large_out.confirmed([e.dest_ref_id for e in entries])
        elif kind in (Kind.REACK, Kind.REACK2):
            self.receiver.queue_confirmations(b, kind, entries, peer, peer.node_type is NodeType.PLATFORM)

    def _nack(self, b: Batch, raw: RawFrame) -> None:
        frame = raw.frame()
        self.origin.nack(frame.body, frame.origin, b.ts, b.out, b.events, b.acks)

    def _inquiry(self, b: Batch, raw: RawFrame) -> None:
        self.inquiry.answer(b, raw.frame())

    def _inquiry_resp(self, b: Batch, raw: RawFrame) -> None:
        self.inquiry.answers(b, raw.frame())

    # ------------------------------------------------------------ our inquiries

    def inquiries(self, *, platform_online: bool = True) -> Output:
        """SPEC A.5 and B.2: the inquiries that are due now, as frames, with
        their inquiry time set. Rows ask again after the interval, doubling
        per unanswered inquiry up to 15 minutes (long-offline targets)."""
        out = Output()
        if not platform_online:
            return out
        ts = self.ctx.now()
        events: list[dict[str, Any]] = []
        with self._tx():
            # A deferred row must not look SS_SENT to an inquiry due now, nor a
            # deferred pending-ack row be missed by one.
            self.write_deferred(ts - min(DEFER_MS, self.ctx.inquiry_ms // 2))
            self.reread_send_order()  # rows another process put back to SS_INIT
            self.inquiry.due(ts, out, events)
        self.ctx.emit(events)
        return out

    def reconnected(self) -> None:
        """After a new session: SS_SENT rows ask the platform at once rather
        than after the interval (their answers may have been lost)."""
        with self._tx():
            self.write_deferred()
            self.origin.ask_at_once()

    # ------------------------------------------------------------ housekeeping and status

    def housekeeping(self) -> int:
        """Bounded tables (SPEC "Cleanup"). Returns rows removed."""
        with self._tx():
            return self.house.clean()

    def state_counts(self) -> dict[str, int]:
        """Pending-send rows per state name, the deferred states counted where they are."""
        return self.house.state_counts()

    def pending_ack_count(self) -> int:
        """Pending-ack rows, the deferred ones included."""
        return self.pending_acks.count()

    def counts(self) -> dict[str, Any]:
        """What ``semq status`` shows of the store."""
        return self.house.counts()

    # ------------------------------------------------------------ the operator, the applications

    def operate(self, action: OperatorAction, where: OutboxFilter, row: type[R], *, limit: int,
                dry_run: bool = False) -> tuple[list[R], bool, list[int]]:
        """The admin console's requeue / resend / purge: in one transaction,
        the rows ``where`` selects as ``row`` (a named row with ``id`` and
        ``state``; at most ``limit``, and whether there were more), and the
        ids of those whose state ``action`` applies to (OPERATOR_TABLE),
        applied unless ``dry_run``. The states are the ones read there."""
        ts = self.ctx.now()
        with self._tx():
            rows = self.outbox.rows(row, where, limit=limit + 1)
            more, rows = len(rows) > limit, rows[:limit]
            ok: list[tuple[int, int]] = []
            for r in rows:
                rid, state = r.id, r.state  # type: ignore[attr-defined]
                try:
                    OPERATOR.step(SendState(state), action, rid)
                except (ValueError, TransitionRefused):
                    continue  # (a state this version does not know: left alone)
                ok.append((rid, state))
            if not dry_run:
                self.operator.apply(action, ok, ts)
        return rows, more, [rid for rid, _ in ok]

    def acknowledge(self, rows: Sequence[int], ts: int, user: str | None = None) -> int:
        """An application processed these inbox documents (``user``: only
        that user's): acknowledged at ``ts`` in one transaction. Returns how many."""
        with self.transaction():
            return self.inbox.acknowledge(rows, ts, user)
