"""The pending-send table (seed tb_0031) and its one owner, ``Outbox``.

Every statement on ``outbox`` is here, and so are the writes the origin
defers (docs/design.md, "States held in memory for up to a second"): a
claimed row's SS_SENT (``sent``: SS_INIT on disk, the claims skip it) and
its SS_ACK_FWD (``fwd``: SS_SENT on disk), written by ``write_deferred``
when NodeCore says, SS_SENT first. It answers with the real state: a step
reads a deferred row from memory, a count moves it to the state it is in,
``by_ids`` says its state, and a query that filters on what a deferred
write changes (``rows``, ``open_counts``, ``depth``) writes it first
(``settle``). ``apply`` is ``ORIGIN_TABLE`` (semq.node.engine) applied to
the rows, in the order the hot path needs; the role (semq.node.origin.role)
says what happened.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, NamedTuple, TypeVar

from semq.store.db import SendOrder, delete_by_id, next_row_id, rows_by_id
from semq.store.db import (
    split_held as split_deferred,  # (the store layer's names, shared with the platform)
)
from semq.store.db import take_held as take_deferred
from semq.umxt_protocol import (
    AckEntry,
    AckFlag,
    Endpoint,
    InquiryResult,
    Kind,
    NodeType,
    ResultCode,
    SaveFwd,
)

from ..batch import Events, NodeContext, Output
from ..engine import ORIGIN_TABLE, OperatorAction, OriginEvent, SendState, origin_step, sql_in
from ..rows import MAX_INQUIRY_BACKOFF_MS, columns, first_inquiry

__all__ = ["LIVE_IDS", "ClaimRow", "DeferredFwd", "DeferredSent", "Outbox", "OutboxFilter", "PendingSendRow"]

R = TypeVar("R", bound=tuple[Any, ...])
S = SendState
_SS_INIT: Final = int(S.SS_INIT)
_SS_SENT: Final = int(S.SS_SENT)
_SS_ACK_FWD: Final = int(S.SS_ACK_FWD)
_SS_ACK: Final = int(S.SS_ACK)
_SS_ACK2: Final = int(S.SS_ACK2)
_SS_FAILED: Final = int(S.SS_FAILED)
# The transitions written from memory, and by the claim, as the table decides them.
_SENT_TO: Final = int(ORIGIN_TABLE[(S.SS_INIT, OriginEvent.SENT)][0])
_FWD_TO: Final = int(ORIGIN_TABLE[(S.SS_SENT, OriginEvent.ACK_FWD)][0])
_DIRECT_ONCE_TO: Final = int(ORIGIN_TABLE[(S.SS_INIT, OriginEvent.SENT_DIRECT_ONCE)][0])
_EXPIRED_TO: Final = int(ORIGIN_TABLE[(S.SS_INIT, OriginEvent.EXPIRED)][0])
_GIVEN_UP_TO: Final = int(ORIGIN_TABLE[(S.SS_INIT, OriginEvent.CANNOT_SEND)][0])
assert ORIGIN_TABLE[(S.SS_INIT, OriginEvent.SENT_DIRECT)] == ORIGIN_TABLE[(S.SS_INIT, OriginEvent.SENT)]
# What else an operator's action resets on a row it moves: a requeued (failed)
# row starts afresh under the same LK0; a resent one starts a new inquiry
# schedule; a dead letter carries why (semq.node.origin.operator).
_RESETS: Final = {
    OperatorAction.REQUEUE: ", code=0, attempts=0, inquiries=0, sent_ms=NULL, last_inquiry_ms=NULL",
    OperatorAction.RESEND: ", inquiries=0, last_inquiry_ms=NULL",
    OperatorAction.DEAD_LETTER: ", code=:code",
}
_INSERT_COLUMNS: Final = ("target_type, target_id, state, save_fwd, ack2, reliable, priority, domain, data_type,"
                          " subtype, key, created_ms, expires_ms, encrypt, session_key, app_data, state_ms, clear_key,"
                          " envelope, from_user, to_user, channel, prev_id, gap, large")
_INSERT: Final = f"INSERT INTO outbox ({_INSERT_COLUMNS}) VALUES ({','.join('?' * 25)})"
# The failed documents of ordered channels whose gap notice is not queued:
# the text of the partial index outbox_gap (semq.node.store), so it applies.
_GAPS: Final = f"channel != '' AND gap = 0 AND state = {_SS_FAILED}"
_SEND_STATES: Final = {int(s): s for s in SendState}
# The event-log name of each origin event (PLATFORM_HAS: the platform had it,
# its ack was lost; LINK_LOST_ONCE: taken as forwarded: logged as the ack_fwd
# they stand for).
_E = OriginEvent
_EVENT_NAMES: Final = {ev: "ack2" for ev in OriginEvent} | {
    _E.ACK_FWD: "ack_fwd", _E.ACK_SAVE: "ack_save", _E.NACK: "nack", _E.CANNOT_SEND: "nack", _E.EXPIRED: "expired",
    _E.PLATFORM_LACKS: "resend", _E.TARGET_LACKS: "resend", _E.TARGET_LACKS_STORED: "resend", _E.LINK_LOST: "resend",
    _E.SENT: "sent", _E.SENT_DIRECT: "sent", _E.SENT_DIRECT_ONCE: "sent",
    _E.PLATFORM_HAS: "ack_fwd", _E.LINK_LOST_ONCE: "ack_fwd"}
# origin_step per (state, event, save_fwd, ack2) of a row: pure, so computed
# once per combination (a dict look-up instead of lru_cache's keyword key).
_STEPS: dict[tuple[int, OriginEvent, int, int], Any] = {}
_ANSWER_ACKED: Final = InquiryResult.ALREADY_ACKED
_ANSWER_MARKED: Final = InquiryResult.MARKED_ACKED
_DELIVERY: Final = int(AckFlag.DELIVERY)


class PendingSendRow(NamedTuple):
    """A pending-send row as failures, inquiries and the event log read it."""

    id: int
    target_type: int
    target_id: str
    state: int
    attempts: int


class ClaimRow(NamedTuple):
    """A pending-send row as a claim reads it: what the DATA frame carries,
    and the document (with security the claim seals and signs it)."""

    id: int
    target_type: int
    target_id: str
    state: int
    save_fwd: int
    ack2: int
    reliable: int
    priority: int
    domain: str
    data_type: str
    subtype: str
    key: str
    created_ms: int
    expires_ms: int | None
    attempts: int
    size: int
    encrypt: int
    session_key: bytes
    app_data: bytes
    clear_key: int
    envelope: bytes | None  # what starts AppData on the wire (semq.node.envelope); None: nothing
    channel: str  # its ordered channel ("": unordered): DATA flag Ordered
    large: int  # AppData is a large document's manifest (semq.node.large): DATA flag Large


class _StepRow(NamedTuple):
    """What an origin step needs of a pending-send row."""

    id: int
    target_id: str
    state: int
    save_fwd: int
    ack2: int
    attempts: int


class DeferredSent(NamedTuple):
    """A claimed row whose SS_SENT is not written yet (SS_INIT on disk):
    what an origin step needs of it, so the acks of a claimed row do not
    read it again, and with security the digest it was signed with (None
    once written to ``receipts``)."""

    claimed_ms: int
    attempts: int  # with this send
    target_id: str
    save_fwd: int
    ack2: int
    digest: bytes | None

    def written(self) -> DeferredSent:
        """The same, its digest written to ``receipts`` (nothing left to write)."""
        return tuple.__new__(DeferredSent, (*self[:5], None))


class DeferredFwd(NamedTuple):
    """A row whose ACK_FWD came and whose SS_ACK_FWD is not written yet."""

    at_ms: int
    code: int


@dataclass(frozen=True, kw_only=True)
class OutboxFilter:
    """Which pending-send rows a query reads: every condition given holds."""

    ids: Collection[int] = ()
    states: Collection[int] = ()
    not_states: Collection[int] = ()
    target: str | None = None
    target_type: int | None = None
    save_fwd: int | None = None
    reliable: bool = False  # reliable rows only
    created_before: int | None = None
    after_id: int = 0
    from_user: str | None = None
    min_attempts: int | None = None

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        for cond, sql, values in (
            (self.after_id, "id > ?", [self.after_id]),
            (self.ids, f"id IN ({','.join('?' * len(self.ids))})", list(self.ids)),
            (self.reliable, "reliable=1", []),
            (self.states, f"state IN ({sql_in(self.states)})", []),
            (self.not_states, f"state NOT IN ({sql_in(self.not_states)})", []),
            (self.target_type is not None, "target_type=?", [self.target_type]),
            (self.target is not None, "target_id=?", [self.target]),
            (self.save_fwd is not None, "save_fwd=?", [self.save_fwd]),
            (self.created_before is not None, "created_ms < ?", [self.created_before]),
            (self.from_user is not None, "from_user = ?", [self.from_user]),
            (self.min_attempts is not None, "attempts >= ?", [self.min_attempts]),
        ):
            if cond:
                clauses.append(sql)
                params += values
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


EVERY: Final = OutboxFilter()
_new: Final = tuple.__new__  # a named row without the Python frame of its __new__ (the hot path)
_make_claim: Final = partial(_new, ClaimRow)
_make_step_row: Final = partial(_new, _StepRow)
_CLAIM_COLS: Final = columns(ClaimRow)
_STEP_COLS: Final = columns(_StepRow)
#: Every row's id, as a subquery: for the cleanups of the owners of receipts
#: and large documents, which keep what a row still needs.
LIVE_IDS: Final = "SELECT id FROM outbox"
_PENDING_COLS: Final = columns(PendingSendRow)


class Outbox:
    """The pending-send rows and what the origin defers of them. Not
    thread-safe: the core's caller (one store thread)."""

    def __init__(self, ctx: NodeContext, write_digests: Callable[[Sequence[tuple[int, str, bytes]]], None]) -> None:
        self.ctx = ctx
        # The digests our documents were signed with go to their owner
        # (semq.node.origin.receipts) with the row's state that needs them.
        self._write_digests = write_digests
        #: The deferred SS_SENT by record id, oldest first. A claim stores
        #: each row it sends here (semq.node.origin.role: one dict store per
        #: document, the hot path's cost of it); every other use is this owner's.
        self.sent: dict[int, DeferredSent] = {}
        self.fwd: dict[int, DeferredFwd] = {}  # the deferred SS_ACK_FWD, oldest first
        # Where the claims read the send order from: after the deferred rows.
        # Forgotten whenever a row may have become SS_INIT below that point
        # (a resend, the operator, another process: every inquiry round).
        self.order = SendOrder("outbox")

    # ------------------------------------------------------------ deferred writes

    def __bool__(self) -> bool:
        return bool(self.sent or self.fwd)

    def write_deferred(self, before_ms: int | None = None) -> None:
        """Write the deferred states (all, or those deferred at or before
        ``before_ms``) inside the caller's transaction: SS_SENT of rows
        still SS_INIT on disk as the claim would have written it (its digest
        with it), then SS_ACK_FWD of rows SS_SENT on disk (a row's ACK_FWD
        is never deferred longer than its SS_SENT). All of them: the send
        order is read again."""
        if before_ms is None:
            self.order.forget()  # the operator's commands, close, reconnect, dead letters
        conn = self.ctx.conn
        sent = take_deferred(self.sent, before_ms, 0) if self.sent else []
        if sent:
            ms = self.ctx.inquiry_ms
            conn.executemany(
                f"UPDATE outbox SET state={_SENT_TO}, attempts=?, sent_ms=?, state_ms=?, last_inquiry_ms=?,"
                f" due_ms=? WHERE id=? AND state={_SS_INIT}",
                [(h.attempts, h.claimed_ms, h.claimed_ms, h.claimed_ms, first_inquiry(h.claimed_ms, h.attempts, ms),
                  rid) for rid, h in sent])
            self._write_digests([(rid, h.target_id, h.digest) for rid, h in sent if h.digest is not None])
        fwd = take_deferred(self.fwd, before_ms, 0) if self.fwd else []
        if fwd:  # (a row in any other state was written since)
            conn.executemany(
                f"UPDATE outbox SET state={_FWD_TO}, state_ms=?, code=?, inquiries=0, last_inquiry_ms=?,"
                f" due_ms=?+min(?, ?*(1 << min(max(attempts-1, 0), 6))) WHERE id=? AND state={_SS_SENT}",
                [(f.at_ms, f.code, f.at_ms, f.at_ms, MAX_INQUIRY_BACKOFF_MS, self.ctx.inquiry_ms, rid)
                 for rid, f in fwd])

    def drop_deferred(self) -> None:
        self.sent.clear()
        self.order.forget()
        self.fwd.clear()

    def settle(self) -> None:
        """Write every deferred state now, before a query that filters on
        the columns they change: in the caller's transaction if one is open,
        else in one of its own. (Written here, a state lost to a failed
        write is lost as in a crash; the inquiries recover it.)"""
        if not (self.sent or self.fwd):
            return
        if self.ctx.conn.in_transaction:
            self.write_deferred()
        else:
            with self.ctx.db.atomic("IMMEDIATE"):
                self.write_deferred()

    def first_inquiry(self, ts: int, attempts: int) -> int:
        return first_inquiry(ts, attempts, self.ctx.inquiry_ms)

    def deferred_digests(self, ids: Sequence[int]) -> tuple[dict[int, bytes], list[int]]:
        """The digests of ``ids`` deferred with their SS_SENT (not in
        ``receipts`` yet), and the ids that have none here."""
        hits, rest = split_deferred(ids, self.sent)
        out: dict[int, bytes] = {}
        for rid, h in hits:
            if h.digest is not None:
                out[rid] = h.digest
            else:
                rest.append(rid)
        return out, rest

    def digests_written(self, ids: Iterable[int]) -> None:
        """The digests of these rows went to ``receipts`` (with a receipt):
        nothing left to write when their SS_SENT is."""
        sent = self.sent
        for rid in ids:
            h = sent.get(rid)
            if h is not None and h.digest is not None:
                sent[rid] = h.written()

    # ------------------------------------------------------------ accepting and claiming

    def next_id(self) -> int:
        """The record id the next accepted document gets (under our write lock)."""
        return next_row_id(self.ctx.conn, "outbox")

    def insert(self, rows: Sequence[Sequence[Any]]) -> list[int]:
        """New SS_INIT rows (values in ``_INSERT_COLUMNS`` order); their
        record ids, in order (AUTOINCREMENT under our write lock: the ids of
        one statement are consecutive, ending at the last one)."""
        conn = self.ctx.conn
        conn.executemany(_INSERT, rows)
        if not rows:
            return []
        last = int(conn.execute("SELECT last_insert_rowid()").fetchone()[0])
        return list(range(last - len(rows) + 1, last + 1))

    def claim_rows(self, limit: int, skip: Sequence[str], only: str | None) -> tuple[list[ClaimRow], Any]:
        """SS_INIT rows in send order (priority first, then acceptance), the
        deferred ones left out; ``skip``: not to those targets; ``only``: to
        that one (a direct link; large documents go through the platform
        session). Returns the rows and what ``claimed`` needs to move the
        send order on."""
        conn, sent = self.ctx.conn, self.sent
        if only is not None:
            where, params = f"state={_SS_INIT} AND target_id=? AND large=0", [only]
        elif skip:
            where, params = f"state={_SS_INIT} AND target_id NOT IN ({','.join('?' * len(skip))})", list(skip)
        else:
            where, params = f"state={_SS_INIT}", []
        if only is not None:
            # One target's rows through the covering index; the deferred ones
            # (SS_INIT on disk) are not claimed again.
            ids = [i for (i,) in conn.execute(f"SELECT id FROM outbox WHERE {where} ORDER BY priority DESC, id LIMIT ?",
                                              (only, limit + len(sent))) if i not in sent][:limit]
            found = {r.id: r for r in map(_make_claim, rows_by_id(conn, f"SELECT {_CLAIM_COLS} FROM outbox", ids))}
            rows = [found[i] for i in ids if i in found]
            levels = SendOrder.levels(rows, ClaimRow._fields.index("priority"))
        elif sent:
            ids, levels = self.order.ids(conn, where, params, limit, sent)
            found = {r.id: r for r in map(_make_claim, rows_by_id(conn, f"SELECT {_CLAIM_COLS} FROM outbox", ids))}
            rows = [found[i] for i in ids]
        else:
            self.order.forget()
            rows = list(map(_make_claim, conn.execute(
                f"SELECT {_CLAIM_COLS} FROM outbox WHERE {where} ORDER BY priority DESC, id LIMIT ?", (*params, limit))))
            levels = SendOrder.levels(rows, ClaimRow._fields.index("priority"))
        return rows, levels

    def claimed(self, levels: Any, *, gone: list[int], expired: list[tuple[int, int]],
                forwarded: list[tuple[int, int, int, int, int, int]], digests: list[tuple[int, str, bytes]],
                order: bool) -> None:
        """After a claim deferred the SS_SENT of the rows it sent: best-effort
        rows deleted (sent, nothing to wait for), expired ones failed
        (state_ms: their 7 days count from now), SaveFwd 1 rows handed to
        their target's link written forwarded with their digests, and
        (``order``: no target was skipped) the send order moved on."""
        conn = self.ctx.conn
        delete_by_id(conn, "outbox", gone)
        if forwarded:
            conn.executemany(f"UPDATE outbox SET state={_DIRECT_ONCE_TO}, attempts=?, sent_ms=?, state_ms=?, code=0,"
                             f" inquiries=0, last_inquiry_ms=?, due_ms=? WHERE id=? AND state={_SS_INIT}", forwarded)
            self._write_digests(digests)
        conn.executemany(f"UPDATE outbox SET state={_EXPIRED_TO}, code={int(ResultCode.EXPIRED)}, state_ms=?"
                         f" WHERE id=? AND state={_SS_INIT}", expired)
        if order:  # (rows of skipped targets were not read: they would be jumped)
            self.order.advance(levels, self.sent, {*gone, *(rid for _, rid in expired)})

    # ------------------------------------------------------------ the state machine

    def apply(
        self, items: Sequence[tuple[Any, ...]], ts: int, out: Output, events: Events,
        acks: dict[tuple[Kind, Endpoint], list[AckEntry]] | None, *, peer: Endpoint | None = None,
        code: int = 0, detail: str = "",
    ) -> list[tuple[int, InquiryResult]]:
        """Apply origin events (record id, event[, the AckEntry that brought
        it]) to rows through ORIGIN_TABLE; returns (id, previous-state
        answer) for STATE inquiries. The hot path of an origin (every
        ACK_FWD, ACK_SAVE and ACK2 of every document): one look-up of the
        rows, a cached table step and two dicts for the event log per row."""
        ctx = self.ctx
        answers: list[tuple[int, InquiryResult]] = []
        ids = [it[0] for it in items]
        fwd, sent = self.fwd, self.sent
        # A claimed row whose SS_SENT is deferred is SS_INIT on disk and its
        # other columns never change: from memory (an ACK_FWD and an ACK2
        # per document; reading them was ~1.1 us a row, scripts/bench
        # pipeline). The rest are read.
        # Per row: (target, state, SaveFwd, Ack2, attempts), all a step needs.
        rows: dict[int, tuple[str, int, int, int, int]] = {}
        if sent:
            hits, ids = split_deferred(ids, sent)
            for rid, h in hits:
                rows[rid] = (h.target_id, _SS_INIT, h.save_fwd, h.ack2, h.attempts - 1)
        if ids:
            for r in map(_make_step_row, rows_by_id(ctx.conn, f"SELECT {_STEP_COLS} FROM outbox", ids)):
                rows[r.id] = (r.target_id, r.state, r.save_fwd, r.ack2, r.attempts)
        updates: list[tuple[int, int, int, int]] = []
        deletes: list[int] = []
        sent_updates = []  # rows whose deferred SS_SENT is written with their new state
        digests: list[tuple[int, str, bytes]] = []  # ... and their digests not written yet
        # Only the document's own target may confirm, refuse or ask about it:
        # an ACK2 from a third organization is ignored (answered NO_RECORD).
        only = peer.node_id if peer is not None and peer.node_type is not NodeType.PLATFORM else None
        reack2: list[AckEntry] | None = None
        me = ctx.me.node_id
        steps = _STEPS
        first = self.first_inquiry
        for it in items:
            rid, event = it[0], it[1]
            got = rows.get(rid)
            if got is None:
                answers.append((rid, InquiryResult.NO_RECORD))
                continue
            target_id, state_no, save_fwd, ack2, attempts = got
            if only is not None and only != target_id:
                answers.append((rid, InquiryResult.NO_RECORD))
                continue
            sent_at = sent.get(rid) if sent else None
            if sent_at is not None:
                attempts = sent_at.attempts
                if state_no == _SS_INIT:
                    state_no = _SS_SENT  # claimed; SS_INIT on disk
            fwd_at = fwd.pop(rid, None) if fwd else None
            if fwd_at is not None and state_no == _SS_SENT:
                state_no = _SS_ACK_FWD  # its ACK_FWD came; the row on disk says SS_SENT
            key = (state_no, event, save_fwd, ack2)
            o = steps.get(key)
            if o is None:
                o = steps[key] = origin_step(_SEND_STATES[state_no], event, save_fwd=save_fwd, ack2=bool(ack2))
            answers.append((rid, _ANSWER_ACKED if state_no == _SS_ACK2 else _ANSWER_MARKED))
            if o.reack2 and peer is not None and len(it) > 2 and acks is not None:
                e: AckEntry = it[2]
                if reack2 is None:
                    reack2 = acks[(Kind.REACK2, peer)]
                reack2.append(AckEntry(ctx.unit, 1, rid, e.src_semq_id, e.src_semq_db_id, e.src_ref_id, _DELIVERY, 0))
            if not o.changed:
                if fwd_at is not None:
                    fwd[rid] = fwd_at
                continue
            new_state = o.state
            if new_state is SendState.SS_INIT:
                self.order.forget()  # to be sent again: the claims must read it
            rows[rid] = (target_id, int(new_state), save_fwd, ack2, attempts)
            lk0 = f"{me}/{ctx.unit}/1/{rid}"
            if new_state is SendState.SS_FAILED:
                row_code, row_detail = code, detail
                if o.event is OriginEvent.TARGET_LACKS_ONCE:
                    # SaveFwd 1 forwarded, lost on the way: dropped, and said so.
                    row_code = int(ResultCode.TARGET_OFFLINE_DROPPED)
                    row_detail = "forwarded but not received by the target"
                events.append({"ts": ts, "role": "origin", "event": "nack", "lk0": lk0, "source": me,
                               "target": target_id, "attempt": attempts, "code": row_code, "detail": row_detail})
            else:
                row_code = code
                events.append({"ts": ts, "role": "origin", "event": _EVENT_NAMES[o.event], "lk0": lk0,
                               "source": me, "target": target_id, "attempt": attempts})
            if state_no == _SS_SENT:
                out.settled += 1  # no longer in flight: window credit
                out.settled_ids.append(rid)
            if o.clean:
                deletes.append(rid)
                if sent_at is not None:
                    del sent[rid]
                    if sent_at.digest is not None:
                        digests.append((rid, sent_at.target_id, sent_at.digest))
                events.append({"ts": ts, "role": "origin", "event": "cleaned", "lk0": lk0, "source": me,
                               "target": target_id, "attempt": attempts})
            elif new_state is SendState.SS_ACK_FWD and state_no == _SS_SENT:
                # Deferred, not written: the ACK2 that follows within a
                # fraction of a second deletes the row, and the UPDATE of a
                # row with its 1 KiB document was ~13% of an origin's time
                # (py-spy, scripts/bench e2e). Nothing we send depends on it:
                # lost in a crash, the row is SS_SENT, asks the platform and
                # hears "forwarded" again.
                fwd[rid] = _new(DeferredFwd, (ts, row_code))
            elif sent_at is not None:
                # Its deferred SS_SENT goes with the new state: one UPDATE.
                del sent[rid]
                if sent_at.digest is not None:
                    digests.append((rid, sent_at.target_id, sent_at.digest))
                sent_updates.append((int(new_state), ts, row_code, ts, first(ts, attempts),
                                     attempts, sent_at.claimed_ms, rid))
            else:
                updates.append((int(new_state), ts, row_code, rid))
        # SPEC A.3: a new state sets the inquiry time to now and starts a new
        # inquiry schedule (no backoff carried over from the previous state).
        # The first inquiry waits one interval, doubled per resend so far
        # (attempts - 1): a target busy with a backlog is not asked again
        # about a resent copy before it could have read it (retransmission
        # backoff; otherwise each "not received" feeds another resend).
        conn = ctx.conn
        conn.executemany("UPDATE outbox SET state=?, state_ms=?, code=?, inquiries=0, last_inquiry_ms=?,"
                         " due_ms=?+min(?, ?*(1 << min(max(attempts-1, 0), 6))) WHERE id=?",
                         [(st, t, c, t, t, MAX_INQUIRY_BACKOFF_MS, ctx.inquiry_ms, rid)
                          for st, t, c, rid in updates])
        if sent_updates:
            conn.executemany("UPDATE outbox SET state=?, state_ms=?, code=?, inquiries=0, last_inquiry_ms=?,"
                             " due_ms=?, attempts=?, sent_ms=? WHERE id=?", sent_updates)
        delete_by_id(conn, "outbox", deletes)
        if digests:
            self._write_digests(digests)
        return answers

    def due(self, ts: int, limit: int) -> list[PendingSendRow]:
        """SPEC A.5: the reliable rows whose inquiry is due (SS_SENT and
        SS_ACK_FWD, and SS_ACK when it must be delivered or an Ack2 is
        asked), with their inquiry time set and the next one backed off.
        Through the partial index outbox_due (its condition, ``state
        BETWEEN 1 AND 3``, SS_SENT to SS_ACK): only the rows due now."""
        conn = self.ctx.conn
        rows = [PendingSendRow._make(r) for r in conn.execute(
            f"SELECT {_PENDING_COLS} FROM outbox INDEXED BY outbox_due WHERE reliable=1"
            f" AND state BETWEEN {_SS_SENT} AND {_SS_ACK} AND due_ms <= ?"
            f" AND (state IN ({_SS_SENT}, {_SS_ACK_FWD}) OR save_fwd={int(SaveFwd.MUST_DELIVER)} OR ack2=1)"
            f" ORDER BY due_ms LIMIT ?", (ts, limit))]
        conn.executemany(
            "UPDATE outbox SET last_inquiry_ms=?, due_ms=?+min(?, ?*(1 << min(inquiries+1, 6))),"
            " inquiries=inquiries+1 WHERE id=?",
            [(ts, ts, MAX_INQUIRY_BACKOFF_MS, self.ctx.inquiry_ms, r.id) for r in rows])
        return rows

    def ask_at_once(self) -> None:
        """After a new session: SS_SENT rows ask the platform at once."""
        self.ctx.conn.execute(f"UPDATE outbox SET last_inquiry_ms=0, due_ms=0, inquiries=0 WHERE state={_SS_SENT}")

    def give_up(self, target: Endpoint, code: int, ts: int, save_fwd: int | None) -> list[PendingSendRow]:
        """Every not-yet-sent row to ``target`` (those of ``save_fwd``)
        SS_FAILED with ``code`` (CANNOT_SEND); rows in flight are not "not
        yet sent" (their deferred SS_SENT is written first). Returns them."""
        self.settle()
        rows = self.rows(PendingSendRow, OutboxFilter(states=(_SS_INIT,), target_type=int(target.node_type),
                                                      target=target.node_id, save_fwd=save_fwd))
        self.ctx.conn.executemany(f"UPDATE outbox SET state={_GIVEN_UP_TO}, state_ms=?, code=? WHERE id=?"
                                  f" AND state={_SS_INIT}", [(ts, code, r.id) for r in rows])
        return rows

    def mark_waiting(self, target: Endpoint, code: int, waiting: Collection[int]) -> int:
        """Why the not-yet-sent rows to ``target`` wait (``code``, one of
        ``waiting``; 0: they no longer do). No state changes; rows in flight
        are SS_INIT on disk too, and their next state replaces the code."""
        codes = sorted({0, *map(int, waiting)})
        return int(self.ctx.conn.execute(
            f"UPDATE outbox SET code=? WHERE state={_SS_INIT} AND target_type=? AND target_id=?"
            f" AND code IN ({','.join('?' * len(codes))}) AND code<>?",
            (code, int(target.node_type), target.node_id, *codes, code)).rowcount)

    def postpone_inquiry(self, rid: int, until_ms: int) -> None:
        """Row ``rid`` asks no sooner than ``until_ms``, its backoff reset
        (its receiver is at work on it: semq.node.large.outgoing)."""
        self.ctx.conn.execute("UPDATE outbox SET due_ms=max(coalesce(due_ms, 0), ?), inquiries=0 WHERE id=?",
                              (until_ms, rid))

    def operate(self, action: OperatorAction, deletes: Sequence[tuple[int, int]],
                moves: Sequence[dict[str, object]], *, expiry: bool) -> None:
        """Write an operator's action (OPERATOR_TABLE decided it: semq.node.
        origin.operator): rows (id, state as read) deleted, rows moved
        (``id``, ``old``, ``new``, ``ts``, ``code``, with ``expiry`` also
        ``expires``), each only if still in the state it was read in."""
        conn = self.ctx.conn
        conn.executemany("DELETE FROM outbox WHERE id=? AND state=?", deletes)
        if moves:
            conn.executemany(f"UPDATE outbox SET state=:new, state_ms=:ts{_RESETS.get(action, '')}"
                             f"{', expires_ms=:expires' if expiry else ''} WHERE id=:id AND state=:old", moves)
            if any(m["new"] == _SS_INIT for m in moves):
                self.order.forget()  # to be sent again: the claims must read it

    # ------------------------------------------------------------ gap notices (semq.node.origin.channels)

    def gaps_due(self) -> bool:
        """Whether a failed ordered document waits for its gap notice."""
        return self.ctx.conn.execute(f"SELECT 1 FROM outbox WHERE {_GAPS} LIMIT 1").fetchone() is not None

    def gaps(self, row: type[R], ids: Iterable[int] | None, limit: int) -> list[R]:
        """Failed ordered documents not announced yet (``ids``: of those,
        in any state), oldest first."""
        conn = self.ctx.conn
        if ids is None:
            return [row._make(r) for r in conn.execute(  # type: ignore[attr-defined]
                f"SELECT {columns(row)} FROM outbox WHERE {_GAPS} ORDER BY id LIMIT ?", (limit,))]
        return [row._make(r) for i in ids for r in conn.execute(  # type: ignore[attr-defined]
            f"SELECT {columns(row)} FROM outbox WHERE id=? AND channel != '' AND gap = 0", (i,))]

    def mark_announced(self, ids: Sequence[int]) -> None:
        self.ctx.conn.executemany("UPDATE outbox SET gap=1 WHERE id=?", [(i,) for i in ids])

    def announced(self) -> set[int]:
        """Failed ordered documents whose gap notice went: their channel
        moved on, they cannot go again under their LK0."""
        return {i for (i,) in self.ctx.conn.execute(f"SELECT id FROM outbox WHERE state={_SS_FAILED} AND gap=1")}

    # ------------------------------------------------------------ queries (read-only)

    def rows(self, row: type[R], where: OutboxFilter = EVERY, *, limit: int | None = None,
             order: str = "id") -> list[R]:
        """The rows ``where`` selects as ``row`` (a named row whose fields
        are columns: semq.node.rows.columns), in ``order`` ("id", or
        "created" for acceptance time), at most ``limit``. The deferred
        states are written first (``settle``): what is read is real."""
        self.settle()
        sql, params = where.where()
        by = "created_ms, id" if order == "created" else "id"
        tail = " LIMIT ?" if limit is not None else ""
        return [row._make(r) for r in self.ctx.conn.execute(  # type: ignore[attr-defined]
            f"SELECT {columns(row)} FROM outbox{sql} ORDER BY {by}{tail}",
            (*params, *((limit,) if limit is not None else ())))]

    def by_ids(self, row: type[R], ids: Sequence[int]) -> dict[int, R]:
        """The rows ``ids`` as ``row`` (its first field ``id``), by id; a
        ``state`` field says the real state (a deferred SS_SENT or
        SS_ACK_FWD from memory, nothing written)."""
        make: Callable[[Sequence[Any]], Any] = row._make  # type: ignore[attr-defined]
        found: dict[int, Any] = {r[0]: make(r) for r in rows_by_id(
            self.ctx.conn, f"SELECT {columns(row)} FROM outbox", ids)}
        if "state" in row._fields and (self.sent or self.fwd):  # type: ignore[attr-defined]
            for rid, r in found.items():
                real = _SS_ACK_FWD if rid in self.fwd else _SS_SENT if rid in self.sent else None
                if real is not None:
                    found[rid] = r._replace(state=real)
        return found

    def count(self, where: OutboxFilter = EVERY) -> int:
        """Rows ``where`` selects, as they are on disk (for the states the
        deferred writes never leave: a deferred row is open either way)."""
        sql, params = where.where()
        return int(self.ctx.conn.execute(f"SELECT count(*) FROM outbox{sql}", params).fetchone()[0])

    def oldest(self, where: OutboxFilter = EVERY) -> int | None:
        """The earliest acceptance time of the rows ``where`` selects (as ``count``)."""
        sql, params = where.where()
        got = self.ctx.conn.execute(f"SELECT min(created_ms) FROM outbox{sql}", params).fetchone()[0]
        return None if got is None else int(got)

    def state_counts(self) -> dict[int, int]:
        """Rows per state, the deferred states counted where they are (a
        deferred SS_SENT is SS_INIT on disk, a deferred SS_ACK_FWD SS_SENT)."""
        states = {int(s): int(n) for s, n in self.ctx.conn.execute("SELECT state, count(*) FROM outbox GROUP BY state")}
        for deferred, below, above in ((self.sent, _SS_INIT, _SS_SENT), (self.fwd, _SS_SENT, _SS_ACK_FWD)):
            if deferred:
                moved = min(len(deferred), states.get(below, 0))
                states[below] = states.get(below, 0) - moved
                states[above] = states.get(above, 0) + moved
        return states

    def pending_count(self) -> int:
        """Rows not yet sent (SS_INIT, the deferred ones were sent)."""
        return self.count(OutboxFilter(states=(_SS_INIT,))) - len(self.sent)

    def open_counts(self, where: OutboxFilter) -> list[tuple[int, int, int]]:
        """(state, code, rows) of the rows ``where`` selects (deferred states written first)."""
        self.settle()
        sql, params = where.where()
        return [(int(s), int(c), int(n)) for s, c, n in self.ctx.conn.execute(
            f"SELECT state, code, count(*) FROM outbox{sql} GROUP BY state, code", params)]

    def depth(self) -> list[tuple[str, int, int, int]]:
        """(target, state, rows, earliest acceptance) per target and state
        (deferred states written first)."""
        self.settle()
        return [(str(t), int(s), int(n), int(o)) for t, s, n, o in self.ctx.conn.execute(
            "SELECT target_id, state, count(*), min(created_ms) FROM outbox GROUP BY target_id, state"
            " ORDER BY target_id, state")]

    def pending_targets(self, limit: int) -> set[str]:
        """Organizations with rows SS_INIT on disk (those in flight too)."""
        return {r[0] for r in self.ctx.conn.execute(
            f"SELECT DISTINCT target_id FROM outbox WHERE state={_SS_INIT} LIMIT ?", (limit,))}

    def target_of(self, rid: int) -> str | None:
        """The organization row ``rid`` is for (None: no such row)."""
        h = self.sent.get(rid)
        if h is not None:
            return h.target_id
        row = self.ctx.conn.execute("SELECT target_id FROM outbox WHERE id=?", (rid,)).fetchone()
        return None if row is None else str(row[0])

    def recently_for(self, org: str, newest: int) -> bool:
        """Whether one of the ``newest`` rows is for ``org`` (no index on the target alone)."""
        return self.ctx.conn.execute("SELECT 1 FROM (SELECT target_id AS o FROM outbox ORDER BY id DESC LIMIT ?)"
                                     " WHERE o=? LIMIT 1", (newest, org)).fetchone() is not None

    def clean_failed(self, before_ms: int) -> int:
        """Failed rows whose state is older than ``before_ms``, deleted
        (a failed ordered document stays until its gap notice is queued)."""
        return int(self.ctx.conn.execute(f"DELETE FROM outbox WHERE state={_SS_FAILED} AND state_ms < ?"
                                         " AND NOT (channel != '' AND gap = 0)", (before_ms,)).rowcount)
