"""The platform's pending-send table: the owner of ``stored``.

Its rows are stored copies of DATA for a target that was offline (``id`` is
the copy's LK1 record id), relayed acks and inquiries kept until their
target connects (SaveFwd 3, SPEC P.4), and chunks of large documents kept
for an absent receiver (on SQLite by reference: semq.platform.chunks).

A copy changes state only as ``STORED_TABLE`` says (semq.platform.engine),
and the operator's actions only as ``STORED_OPERATOR_TABLE`` says; the SQL
names states and kinds through their IntEnums. The states its UPDATEs
write and require (delivered, reconnected) are computed from the table
at import (``_DELIVERED``, ``_ON_RECONNECT``).

Held in memory, in the order they are written (docs/design.md, "States
held in memory for up to a second"):

1. the batch's new copies (``queue``), written by ``flush`` (one look-up
   of earlier copies, one INSERT, their ids given there so the ACK_SAVE
   can name them), each with its ``seen`` row (semq.platform.seen): so
   ``flush`` comes before the ``seen`` rows are written;
2. the ``SS_SENT`` of delivered copies (``HeldDelivery``: SS_INIT on disk),
   written by ``write_held`` when a second old, by an inquiry round, a
   reconnect, the operator's commands and a clean stop; and where each
   target's claims read its send order from (``SendOrder``).

Every answer merges what is held: a read of the table writes the batch's
new copies first, and a delivered copy reads as ``SS_SENT``."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Final, NamedTuple

from semq.node.engine import OperatorAction, TransitionRefused
from semq.store.db import (
    HOLD_MS,
    SKIP_LOCKED,
    STORE_ERRORS,
    Dialect,
    SendOrder,
    delete_by_id,
    rows_by_id,
    split_held,
    take_held,
)
from semq.umxt_protocol import (
    FLAG_ORDERED,
    LK0,
    AckEntry,
    AckFlag,
    Endpoint,
    ForwardFlag,
    InquiryResult,
    Kind,
    NodeType,
    RawFrame,
    ResultCode,
    frame_save_fwd,
    lk1_from_wire,
    relay_bytes,
    relay_frame_bytes,
)
from semq.umxt_protocol.units import UNIT_SEP

from .batch import Events, PlatformBatch, event
from .chunks import ChunkFiles
from .engine import STORED_TABLE, StoredEvent, StoredState, stored_operator_step, stored_step
from .seen import SeenAction, SeenDocuments, SeenKey
from .store import SENT_COPIES
from .views import StoredAdminRow, StoredDepth, StoredSelection, StoredTotals, select_list

__all__ = ["MAX_INQUIRY_BACKOFF_MS", "ClaimedRow", "DueCopy", "HeldDelivery", "NewCopy", "StoredCopies"]

MAX_INQUIRY_BACKOFF_MS: Final = 15 * 60 * 1000
_DUE_MAX: Final = 4000  # copies one inquiry round reads
_ANALYZE_ROWS: Final = 5000  # copies stored before the statistics are refreshed
_ANALYZE_S: Final = 10.0

_STORED_STATES: Final = {int(s): s for s in StoredState}
_DATA: Final = int(Kind.DATA)
_CHUNK: Final = int(Kind.CHUNK)
_SS_INIT: Final = int(StoredState.SS_INIT)  # a new copy's state, and a waiting one's
_STORED: Final = int(SeenAction.STORED)
_FORWARDED: Final = int(SeenAction.FORWARDED)
_PLATFORM_FLAG: Final = int(AckFlag.PLATFORM)
_STORED_FLAG: Final = int(ForwardFlag.STORED)

# The state changes written by SQL, decided by STORED_TABLE once, here.
# DELIVERED: a waiting copy handed to its target (claim holds the change in
# memory, write_held writes it).
_UNDELIVERED: Final = StoredState.SS_INIT
_DELIVERED: Final = stored_step(_UNDELIVERED, StoredEvent.DELIVERED)
# RECONNECTED: (from, to) of every state the target's new session moves.
_ON_RECONNECT: Final = tuple((int(s), int(n)) for (s, e), n in STORED_TABLE.items()
                             if e is StoredEvent.RECONNECTED and n is not s)

_WRITE_DELIVERED: Final = (f"UPDATE stored SET state={int(_DELIVERED)}, attempts=?, last_sent_ms=?"
                           f" WHERE id=? AND state={int(_UNDELIVERED)}")
_WAITING: Final = f"kind={_DATA} AND state={_SS_INIT}"  # stored documents not delivered
_FLAGS_AT: Final = 4  # a frame's flags byte (docs/protocol.md "Header")
_SIZE: Final = "coalesce(ref_length, length(frame))"  # a stored frame's size (a kept chunk's is in its file)
_CLAIM_WHERE: Final = f"target_type=? AND target_id=? AND state={_SS_INIT}"  # a target's frames waiting
_LK0_COLUMNS: Final = (("origin_type", "integer"), ("origin_id", "text"), ("semq_id", "integer"),
                       ("semq_db_id", "integer"), ("record_id", "bigint"))
_BY_LK0: Final = "origin_type=? AND origin_id=? AND semq_id=? AND semq_db_id=? AND record_id=?"


class NewCopy(NamedTuple):
    """A DATA routed to STORE, waiting for ``flush``."""

    raw: RawFrame
    sender: Endpoint | None  # None: handed over by another instance (its origin has its ACK_FWD)
    target: Endpoint  # the route of the target's unit that holds it (semq.umxt_protocol.units)
    lk0: LK0
    key: SeenKey
    expires: int | None
    ts: int


class HeldDelivery(NamedTuple):
    """A delivered copy whose DELIVERED is held in memory (SS_INIT on disk):
    when, the attempts with this one, and what ``settle`` needs of its row,
    so the target's ack does not read it again."""

    sent_ms: int
    attempts: int
    target_type: int
    target_id: str
    origin_id: str
    semq_id: int
    semq_db_id: int
    record_id: int


class ClaimedRow(NamedTuple):
    """A row a claim reads to deliver."""

    id: int
    kind: int
    frame: bytes
    expires_ms: int | None
    attempts: int
    origin_id: str
    semq_id: int
    semq_db_id: int
    record_id: int
    priority: int
    ref: str | None  # a kept chunk's file (semq.platform.chunks); frame is empty
    ref_offset: int | None
    ref_length: int | None


class DueCopy(NamedTuple):
    """A delivered copy an inquiry round asks its target about."""

    id: int
    target_type: int
    target_id: str
    origin_type: int
    origin_id: str
    semq_id: int
    semq_db_id: int
    record_id: int


_ON: Final = (object(),)


def _where(sel: StoredSelection) -> tuple[str, list[Any]]:
    """The WHERE clause of a console's selection (empty: everything), and its
    parameters: each clause whose values are given (``_ON``: a clause with none)."""
    clauses: list[str] = []
    params: list[Any] = []
    for clause, values in (
            (f"id IN ({','.join('?' * len(sel.ids))})", sel.ids),
            ("id > ?", () if sel.after is None else (sel.after,)),
            (f"kind={_DATA}", _ON if sel.kind == "data" else ()),
            (f"kind!={_DATA}", _ON if sel.kind == "relayed" else ()),
            (f"state IN ({','.join('?' * len(sel.states))})", sel.states),
            ("target_id=?", (sel.target,) if sel.target else ()),
            ("origin_id=?", (sel.origin,) if sel.origin else ()),
            (f"origin_id=? AND semq_id=? AND semq_db_id=? AND record_id=? AND kind={_DATA}", sel.document or ()),
            ("stored_ms < ?", () if sel.stored_before_ms is None else (sel.stored_before_ms,))):
        if values:
            clauses.append(clause)
            params.extend(v for v in values if v is not _ON[0])
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


_HELD_SENT_MS: Final = HeldDelivery._fields.index("sent_ms")
_CLAIM_SELECT: Final = f"SELECT {', '.join(ClaimedRow._fields)} FROM stored"
_CLAIMED_PRIORITY: Final = ClaimedRow._fields.index("priority")
_DUE_SELECT: Final = f"SELECT {', '.join(DueCopy._fields)} FROM stored INDEXED BY stored_sent"
_ADMIN_COLS: Final = select_list(StoredAdminRow, {"size": _SIZE})
_DEPTH_COLS: Final = select_list(StoredDepth, {"is_data": f"kind={_DATA}", "rows": "count(*)",
                                                 "oldest_ms": "min(stored_ms)"})
# Named rows made without the Python frame of their __new__ or _make (one of
# each per delivered copy); _CLAIM_SELECT reads exactly ClaimedRow's fields.
_new: Final = tuple.__new__
_make_claimed: Final = partial(_new, ClaimedRow)


class StoredCopies:
    """The ``stored`` table, on the store's connection and inside the
    caller's transaction (the platform's store thread; one caller at a
    time). ``chunks``: where kept chunks' files are (SQLite), None when
    their frames are rows (PostgreSQL)."""

    def __init__(self, conn: Any, dialect: Dialect, me: Endpoint, seen: SeenDocuments,
                 chunks: ChunkFiles | None) -> None:
        self.conn = conn
        self.dialect = dialect
        self.me = me
        self.seen = seen
        self.chunks = chunks
        self._held: dict[int, HeldDelivery] = {}  # by id, oldest first
        self._order = SendOrder("stored")
        # The batch's new copies; never rebound, so ``queue`` (its append)
        # is bound once: the router queues a copy per document stored.
        self._new: list[NewCopy] = []
        self.queue: Callable[[NewCopy], None] = self._new.append
        self._batch: PlatformBatch | None = None
        self._stored_since_analyze = 0
        self._analyzed_at = 0.0

    # ------------------------------------------------------------ what is held

    def begin(self, b: PlatformBatch) -> None:
        """A new batch: its new copies are written, acked and logged in ``b``."""
        self._new.clear()
        self._batch = b

    def held(self) -> bool:
        """Whether a delivery's SS_SENT is held (``write_held`` would write)."""
        return bool(self._held)

    def held_count(self) -> int:
        """Delivered copies whose SS_SENT is held (SS_INIT on disk)."""
        return len(self._held)

    def write_held(self, before_ms: int | None = None) -> None:
        """The SS_SENT of delivered copies still SS_INIT on disk (all, or
        those delivered at or before ``before_ms``), as ``claim`` wrote it
        before the hold."""
        if before_ms is None:
            self._order.forget()
        items = take_held(self._held, before_ms, _HELD_SENT_MS)
        if items:
            self.conn.executemany(_WRITE_DELIVERED, [(h.attempts, h.sent_ms, rid) for rid, h in items])

    def drop_held(self) -> None:
        """A transaction that did not commit: the copies held go again, and
        the batch's new copies were never written."""
        self._held.clear()
        self._order.forget()
        self._new.clear()

    def forget_target(self, ep: Endpoint) -> None:
        """``ep`` disconnected from this instance (clustered): its copies
        delivered from here whose SS_SENT is held are SS_INIT on disk, and
        go again wherever it reconnects."""
        tt = int(ep.node_type)
        for rid in [r for r, h in self._held.items() if h.target_type == tt and h.target_id == ep.node_id]:
            del self._held[rid]
        self._order.forget()

    # ------------------------------------------------------------ storing

    def flush(self, *, last: bool = False) -> None:
        """Write the batch's new copies (``last``: the batch ends here): one look-up of earlier copies still
        waiting (a resend whose ACK_SAVE was lost gets the same LK1, as does
        a copy repeated in the batch) and one executemany of the new rows,
        whose ids are given here (the one writer, inside its transaction) so
        the ACK_SAVE can name them. Per document, a SELECT and an INSERT
        cost ~15 us of the platform's ~42. Each gets its ``seen`` row, its
        ACK_SAVE (reliable, from a connection of ours) and its event."""
        stores = self._new
        b = self._batch
        if last:
            self._batch = None
        if not stores or b is None:
            return
        held = self._held
        found: dict[tuple[Any, ...], int] = {}
        for rows in self.dialect.rows_by_keys(
                self.conn, "id, origin_type, origin_id, semq_id, semq_db_id, record_id, target_type, target_id",
                "stored", _LK0_COLUMNS, [st.key for st in stores], _WAITING):
            for rid, *copy_key in rows:
                if rid not in held:  # delivered (SS_SENT held in memory): a new copy, as for SS_SENT
                    found.setdefault(tuple(copy_key), int(rid))
        new_ids: list[int] = []
        new_rows: list[tuple[Any, ...]] = []
        out, events, acks, seen_add = b.out, b.events, b.acks, self.seen.add
        for st in stores:
            raw, target, key = st.raw, st.target, st.key
            copy_key = (*key, int(target.node_type), target.node_id)
            lk1_id = found.get(copy_key, 0)
            if not lk1_id:
                if not new_ids:
                    new_ids = self.dialect.new_ids(self.conn, "stored", len(stores))
                lk1_id = found[copy_key] = new_ids.pop()
                new_rows.append((lk1_id, int(target.node_type), target.node_id, *key, raw.priority, st.expires,
                                 st.ts, raw.raw))
            seen_add((*key, _STORED, lk1_id, st.ts))
            lk0 = st.lk0
            if raw.reliable and st.sender is not None:  # (best effort, or handed over: stored, not acked)
                acks[(Kind.ACK_SAVE, st.sender)].append(AckEntry(
                    1, 1, lk1_id, lk0.semq_id, lk0.semq_db_id, lk0.record_id, _PLATFORM_FLAG, _STORED_FLAG))
            out.stored_for.add(target)
            events.append(event(raw, lk0, st.ts, "stored", lk1=f"1/1/{lk1_id}"))
        stores.clear()
        if new_rows:
            self._stored_since_analyze += len(new_rows)
            self.conn.executemany(
                "INSERT INTO stored (id, target_type, target_id, kind, origin_type, origin_id, semq_id,"
                " semq_db_id, record_id, state, priority, expires_ms, stored_ms, frame)"
                f" VALUES (?,?,?,{_DATA},?,?,?,?,?,{_SS_INIT},?,?,?,?)", new_rows)

    def keep_relayed(self, raw: RawFrame, ts: int, target: Endpoint) -> None:
        """An ack or inquiry kept for its target (SPEC P.4; ``target``: the
        route of the target's unit it is for)."""
        self.conn.execute(
            "INSERT INTO stored (target_type, target_id, kind, origin_type, origin_id, state, priority,"
            f" stored_ms, frame) VALUES (?,?,?,?,?,{_SS_INIT},?,?,?)",
            (int(target.node_type), target.node_id, int(raw.kind), int(raw.origin.node_type),
             raw.origin.node_id, raw.priority, ts, raw.raw),
        )

    def keep_chunk(self, raw: RawFrame, ts: int, target: Endpoint, lk0: LK0, name: str, offset: int) -> None:
        """A chunk kept in the file ``name`` at ``offset`` (semq.platform.chunks), by reference."""
        o = raw.origin
        self.conn.execute(
            "INSERT INTO stored (target_type, target_id, kind, origin_type, origin_id, semq_id, semq_db_id,"
            " record_id, state, priority, stored_ms, frame, ref, ref_offset, ref_length)"
            f" VALUES (?,?,?,?,?,?,?,?,{_SS_INIT},?,?,?,?,?,?)",
            (int(target.node_type), target.node_id, _CHUNK, int(o.node_type), o.node_id,
             lk0.semq_id, lk0.semq_db_id, lk0.record_id, raw.priority, ts, b"", name, offset, len(raw.raw)))

    def bytes_of(self, origin_type: int, origin_id: str) -> int:
        """Bytes of ``origin_id``'s documents and chunks stored here, the
        batch's new copies included (what its quota counts)."""
        (stored,) = self.conn.execute(
            f"SELECT coalesce(sum({_SIZE}), 0) FROM stored WHERE origin_type=?"
            f" AND origin_id=? AND kind IN ({_DATA}, {_CHUNK})", (origin_type, origin_id)).fetchone()
        return int(stored) + sum(len(st.raw.raw) for st in self._new
                                 if st.key[0] == origin_type and st.key[1] == origin_id)

    def kept_files(self, origin: Endpoint) -> int:
        """How many documents of ``origin`` have chunks kept in files here."""
        return int(self.conn.execute("SELECT count(DISTINCT ref) FROM stored WHERE origin_type=? AND origin_id=?"
                                     " AND ref IS NOT NULL", (int(origin.node_type), origin.node_id)).fetchone()[0])

    # ------------------------------------------------------------ delivery

    def claim(self, target: Endpoint, limit: int, max_bytes: int,
              ts: int) -> tuple[list[bytes], int, Events, list[str]]:
        """SPEC P.2: up to ``limit`` stored frames for ``target`` (priority
        first, then acceptance order), no more than ``max_bytes`` of them
        (but at least one), with LK1 set, delivered (SS_SENT held in
        memory). Relayed frames and expired copies are deleted as they go
        (their ends ask again if they are lost). Returns (frames, DATA
        count, events, kept chunks' files no row names any more: to drop
        after the commit)."""
        events: Events = []
        out: list[bytes] = []
        n_data = 0
        held = self._held
        target_type = int(target.node_type)
        where, params = _CLAIM_WHERE, (target_type, target.node_id)
        if held:
            self.write_held(ts - HOLD_MS)  # (may empty it)
        # The ids in send order with their frames' sizes first (length()
        # reads no blob), then only the frames within the byte bound.
        if held:
            ids, levels = self._order.ids(self.conn, where, params, limit, held, scope=target)
            sizes = dict(rows_by_id(self.conn, f"SELECT id, {_SIZE} FROM stored", ids))
        else:
            self._order.forget()
            order = self.conn.execute(
                f"SELECT id, {_SIZE} FROM stored WHERE {where} ORDER BY priority DESC, id LIMIT ?",
                (*params, limit)).fetchall()
            ids, sizes = [i for i, _ in order], dict(order)
            levels = []
        total, n = 0, 0
        while n < len(ids) and (n == 0 or total + sizes[ids[n]] <= max_bytes):
            total += sizes[ids[n]]
            n += 1
        ids = ids[:n]
        found = {r.id: r for r in map(_make_claimed, rows_by_id(self.conn, _CLAIM_SELECT, ids,
                                                                 suffix=SKIP_LOCKED))}
        rows = [found[i] for i in ids if i in found]
        if not held:
            levels = SendOrder.levels(rows, _CLAIMED_PRIORITY)
        if not rows:
            return out, 0, events, []
        # The blobs were decoded and checked when they came in: spliced
        # as they are (header rewritten, LK1 set, CRC recomputed).
        gone: list[int] = []
        refs: set[str] = set()
        me = self.me
        for rid, kind, blob, expires, attempts, oid, s, d, r, _prio, ref, ref_offset, ref_length in rows:
            if kind != _DATA:
                gone.append(rid)
                if ref is None:
                    out.append(relay_frame_bytes(blob, me))
                elif self.chunks is not None and ref_offset is not None and ref_length is not None:
                    refs.add(ref)
                    kept = self.chunks.read(ref, ref_offset, ref_length)
                    if kept is not None:  # (else its receiver asks its origin for it again)
                        out.append(relay_bytes(kept, me))
                continue
            lk0 = f"{oid}/{s}/{d}/{r}"
            if expires is not None and expires <= ts:
                gone.append(rid)
                events.append({"ts": ts, "event": "expired", "lk0": lk0, "source": oid,
                               "target": target.node_id, "code": int(ResultCode.EXPIRED)})
                continue
            out.append(relay_frame_bytes(blob, me, lk1_from_wire(1, 1, rid)))
            # SS_SENT held in memory, not written: the target's ACK deletes
            # the copy a fraction of a second later, and the UPDATE of a row
            # with its 1 KiB frame was the largest part of a delivery
            # (py-spy: 11% of the platform draining). Nothing we sent depends
            # on it: lost in a crash, the copy is SS_INIT and goes again (the
            # target deduplicates). Written after HOLD_MS (write_held: by a
            # batch, claims, inquiries, a reconnect, the operator and close).
            held[rid] = _new(HeldDelivery, (ts, attempts + 1, target_type, target.node_id, oid, s, d, r))
            n_data += 1
            events.append({"ts": ts, "event": "delivered", "lk0": lk0, "source": oid,
                           "target": target.node_id, "lk1": f"1/1/{rid}", "attempt": attempts + 1,
                           "save_fwd": frame_save_fwd(blob), "size": len(blob)})
        delete_by_id(self.conn, "stored", gone)
        self._order.advance(levels, held, set(gone), scope=target)
        unused = [f for f in refs if self.conn.execute("SELECT 1 FROM stored WHERE ref=? LIMIT 1",
                                                       (f,)).fetchone() is None]
        return out, n_data, events, unused

    def settle(self, ids: Sequence[int], ev: StoredEvent, sender: Endpoint, ts: int, events: Events) -> int:
        """Apply ``ev`` to stored DATA rows of ``sender``; SS_ACK rows are
        deleted (SPEC P.2). Returns how many in-flight rows were settled."""
        self.flush()
        settled = 0
        held = self._held
        # A delivered copy whose SS_SENT is held is SS_INIT on disk, and
        # the rest of what is needed never changes: from memory, if it is
        # the sender's (a stored DATA row, like the SELECT's). The rest are
        # read by row id: the unary + keeps SQLite off the delivery index on
        # target (a walk over every stored copy of the target).
        # id -> (state, origin_id, semq_id, semq_db_id, record_id)
        found: dict[int, tuple[int, str, int, int, int]] = {}
        ids_read: Sequence[int] = ids
        if held:
            hits, ids_read = split_held(ids, held)
            tt, tid = int(sender.node_type), sender.node_id
            for rid, h in hits:
                if h.target_type == tt and h.target_id == tid:
                    found[rid] = (_SS_INIT, h.origin_id, h.semq_id, h.semq_db_id, h.record_id)
        if ids_read:
            found.update({rid: (state, oid, s, d, r) for rid, state, oid, s, d, r in rows_by_id(
                self.conn, "SELECT id, state, origin_id, semq_id, semq_db_id, record_id FROM stored", ids_read,
                where=f"+kind={_DATA} AND +target_type=? AND +target_id=?",
                params=(int(sender.node_type), sender.node_id))})
        deletes: list[int] = []
        updates: list[tuple[int, int]] = []
        sent_updates: list[tuple[int, int, int, int]] = []
        for rid in ids:
            row = found.pop(rid, None)  # an id twice in one batch: applied once
            if row is None:
                continue
            state_no, oid, s, d, r = row
            sent_at = held.pop(rid, None) if held else None
            state = _STORED_STATES[state_no]
            if sent_at is not None and state is _UNDELIVERED:
                state = _DELIVERED  # its DELIVERED held in memory, not written
            nxt = stored_step(state, ev)
            if nxt is state:
                if sent_at is not None:
                    held[rid] = sent_at
                continue
            if nxt is StoredState.SS_INIT:
                self._order.forget()  # to be delivered again: the claims must read it
            lk0, lk1, src, tgt = f"{oid}/{s}/{d}/{r}", f"1/1/{rid}", oid, sender.node_id
            if nxt is StoredState.SS_ACK:
                deletes.append(rid)
                # (Literals: merging a shared dict into each costs twice as much.)
                events.append({"ts": ts, "event": "acked", "lk0": lk0, "source": src, "target": tgt, "lk1": lk1})
                events.append({"ts": ts, "event": "cleaned", "lk0": lk0, "source": src, "target": tgt, "lk1": lk1})
                settled += state is StoredState.SS_SENT
            else:
                if sent_at is not None:  # its held delivery is written with the new state
                    sent_updates.append((int(nxt), sent_at.attempts, sent_at.sent_ms, rid))
                else:
                    updates.append((int(nxt), rid))
                settled += state is StoredState.SS_SENT and nxt is StoredState.SS_INIT
        delete_by_id(self.conn, "stored", deletes)
        self.conn.executemany("UPDATE stored SET state=? WHERE id=?", updates)
        self.conn.executemany("UPDATE stored SET state=?, attempts=?, last_sent_ms=? WHERE id=?", sent_updates)
        return settled

    def reconnected(self, ep: Endpoint) -> None:
        """``ep`` (a unit's route) has a new session: its copies in flight
        go again (SPEC P.2; it deduplicates)."""
        for was, now in _ON_RECONNECT:  # (no chains in the table: one UPDATE each)
            self.conn.execute("UPDATE stored SET state=? WHERE target_type=? AND target_id=? AND state=?",
                              (now, int(ep.node_type), ep.node_id, was))

    def undelivered_of(self, org: Endpoint) -> list[tuple[int, LK0, str, bool]]:
        """(id, LK0, target id, ordered) of the documents waiting for
        ``org`` or any of its units, the delivered ones (held) left out."""
        out = []
        for rid, ot, oid, sid, did, rec, tid, frame in self.conn.execute(
                f"SELECT id, origin_type, origin_id, semq_id, semq_db_id, record_id, target_id, frame FROM stored"
                f" WHERE target_type=? AND (target_id=? OR target_id LIKE ?) AND {_WAITING}",
                (int(org.node_type), org.node_id, org.node_id + UNIT_SEP + "%")).fetchall():
            if rid in self._held:
                continue  # (delivered: its SS_SENT is held in memory)
            lk0 = LK0(endpoint=Endpoint(node_type=ot, node_id=oid), semq_id=sid, semq_db_id=did, record_id=rec)
            out.append((rid, lk0, tid, len(frame) > _FLAGS_AT and bool(frame[_FLAGS_AT] & FLAG_ORDERED)))
        return out

    def retarget(self, moves: Sequence[tuple[str, int]]) -> None:
        """Waiting documents given to another route ((target id, id) each)."""
        if moves:
            self.conn.executemany(f"UPDATE stored SET target_id=? WHERE id=? AND {_WAITING}", moves)
            self._order.forget()

    # ------------------------------------------------------------ inquiries

    def fate(self, key: SeenKey) -> InquiryResult:
        """What became of the document ``key`` here, as its origin's inquiry
        learns it: FORWARDED (handed to its target's connection), STORED (a
        copy waits here), RECEIVED (stored, delivered, and its target acked
        it: only the target has it now), else NOT_RECEIVED."""
        self.flush()
        action, lk1 = self.seen.action(key) or (None, 0)
        if action == _FORWARDED:
            return InquiryResult.FORWARDED
        if action == _STORED:
            held = self.conn.execute(f"SELECT 1 FROM stored WHERE id=? AND kind={_DATA}", (lk1,)).fetchone()
            return InquiryResult.STORED if held else InquiryResult.RECEIVED
        return InquiryResult.NOT_RECEIVED

    def state_of(self, lk1: int, target: Endpoint) -> StoredState | None:
        """The state of ``target``'s copy ``lk1`` (None: none here), a
        delivery held in memory as SS_SENT."""
        self.flush()
        state = next((_STORED_STATES[n] for (n,) in self.conn.execute(
            f"SELECT state FROM stored WHERE id=? AND kind={_DATA} AND target_type=? AND target_id=?",
            (lk1, int(target.node_type), target.node_id))), None)
        return _DELIVERED if state is _UNDELIVERED and lk1 in self._held else state

    def ids_of(self, lk0: LK0, target: Endpoint) -> list[int]:
        """The ids of ``target``'s copies of the document ``lk0``."""
        self.flush()
        return [int(rid) for (rid,) in self.conn.execute(
            f"SELECT id FROM stored WHERE {_BY_LK0} AND kind={_DATA} AND target_type=? AND target_id=?",
            (int(lk0.endpoint.node_type), lk0.endpoint.node_id, lk0.semq_id, lk0.semq_db_id, lk0.record_id,
             int(target.node_type), target.node_id)).fetchall()]

    def due(self, ts: int, interval_ms: int, among: tuple[str, tuple[Any, ...]] | None = None) -> list[DueCopy]:
        """Delivered copies whose target is asked at ``ts`` (one interval
        after the delivery, doubling per unanswered inquiry, at most
        MAX_INQUIRY_BACKOFF_MS), at most _DUE_MAX; ``among``: only for the
        targets this subquery selects (its SQL and parameters). The
        deliveries held are written first (past half the interval: none
        is missed), and read through the partial index ``stored_sent``."""
        self.write_held(ts - min(HOLD_MS, interval_ms // 2))
        self._order.forget()  # copies another process put back to SS_INIT
        mine, mine_params = "", ()
        if among is not None:
            mine, mine_params = f" AND (target_type, target_id) IN ({among[0]})", among[1]
        return [DueCopy._make(r) for r in self.conn.execute(
            f"{_DUE_SELECT} WHERE {SENT_COPIES} AND last_sent_ms + min(?, ? * (1 << min(inquiries, 6))) <= ?"
            f"{mine} LIMIT {_DUE_MAX}", (MAX_INQUIRY_BACKOFF_MS, interval_ms, ts, *mine_params)).fetchall()]

    def asked(self, ids: Sequence[int], ts: int) -> None:
        """The targets of copies ``ids`` were asked about them at ``ts``."""
        self.conn.executemany("UPDATE stored SET last_sent_ms=?, inquiries=inquiries+1 WHERE id=?",
                              [(ts, rid) for rid in ids])

    def waiting_among(self, among: tuple[str, tuple[Any, ...]]) -> list[Endpoint]:
        """Of the targets the subquery ``among`` selects (``node_type,
        node_id``), those with frames waiting here."""
        return [Endpoint(node_type=NodeType(t), node_id=i) for t, i in self.conn.execute(
            f"SELECT t.node_type, t.node_id FROM ({among[0]}) t WHERE EXISTS"
            " (SELECT 1 FROM stored s WHERE s.target_type=t.node_type AND s.target_id=t.node_id"
            f" AND s.state={_SS_INIT})", among[1]).fetchall()]

    # ------------------------------------------------------------ the operator

    def operator_apply(self, action: OperatorAction, rows: Sequence[tuple[int, int]]) -> list[int]:
        """The operator's requeue / resend / purge of stored copies (``rows``:
        (id, state as read in the caller's transaction, with what is held
        written)), as STORED_OPERATOR_TABLE says; a copy in a state the
        action does not apply to is left as it is. Returns the ids it
        applied to."""
        deletes, moves, done = [], [], []
        for rid, state_no in rows:
            try:
                nxt = stored_operator_step(StoredState(state_no), action, record=rid)
            except (ValueError, TransitionRefused):  # ValueError: a state this version does not know
                continue
            done.append(rid)
            if nxt is None:
                deletes.append((rid, state_no))
            else:
                moves.append((int(nxt), rid, state_no))
        self.conn.executemany("DELETE FROM stored WHERE id=? AND state=?", deletes)
        self.conn.executemany("UPDATE stored SET state=?, inquiries=0 WHERE id=? AND state=?", moves)
        if moves:
            self._order.forget()  # copies to be delivered again: the claims must read them
        return done

    def select(self, sel: StoredSelection, limit: int, *, oldest_first: bool = False) -> list[StoredAdminRow]:
        """The rows ``sel`` selects, by id (``oldest_first``: by the time
        stored), at most ``limit``; their states as written (the console
        writes what is held first)."""
        where, params = _where(sel)
        order = "stored_ms, id" if oldest_first else "id"
        return [StoredAdminRow._make(r) for r in self.conn.execute(
            f"SELECT {_ADMIN_COLS} FROM stored{where} ORDER BY {order} LIMIT ?", (*params, limit))]

    def older(self, before_ms: int) -> tuple[int, int]:
        """How many (DATA, relayed) rows were stored before ``before_ms``."""
        (data,) = self.conn.execute(f"SELECT count(*) FROM stored WHERE kind={_DATA} AND stored_ms < ?",
                                    (before_ms,)).fetchone()
        (relayed,) = self.conn.execute(f"SELECT count(*) FROM stored WHERE kind!={_DATA} AND stored_ms < ?",
                                       (before_ms,)).fetchone()
        return int(data), int(relayed)

    def depths(self) -> list[StoredDepth]:
        """Rows per target, kind (DATA or not) and state."""
        return [StoredDepth._make(r) for r in self.conn.execute(
            f"SELECT {_DEPTH_COLS} FROM stored GROUP BY target_id, kind={_DATA}, state"
            f" ORDER BY target_id, kind={_DATA} DESC, state")]

    def oldest_ms(self) -> int | None:
        """When the oldest stored document was stored (None: none)."""
        (oldest,) = self.conn.execute(f"SELECT min(stored_ms) FROM stored WHERE kind={_DATA}").fetchone()
        return None if oldest is None else int(oldest)

    def totals(self) -> StoredTotals:
        """What the status counts (semq.platform.core.PlatformCore.counts)."""
        c = self.conn
        (relayed,) = c.execute(f"SELECT count(*) FROM stored WHERE kind NOT IN ({_DATA}, {_CHUNK})").fetchone()
        per_target = {f"{tid}": (int(n), int(oldest)) for tid, n, oldest in c.execute(
            f"SELECT target_id, count(*), min(stored_ms) FROM stored WHERE kind={_DATA} GROUP BY target_id")}
        (chunks, chunk_bytes) = c.execute(
            f"SELECT count(*), coalesce(sum({_SIZE}), 0) FROM stored WHERE kind={_CHUNK}").fetchone()
        return StoredTotals(per_target, int(relayed), int(chunks), int(chunk_bytes))

    def state_counts(self) -> tuple[dict[int, int], int, int]:
        """(DATA copies per state, relayed frames waiting, kept chunks), the
        deliveries held in memory counted as SS_SENT, without writing them
        (the gauges, semq.ops.metrics)."""
        copies: dict[int, int] = defaultdict(int)
        relayed = chunks = 0
        for kind, s, n in self.conn.execute("SELECT kind, state, count(*) FROM stored GROUP BY kind, state"):
            if kind == _DATA:
                copies[int(s)] += int(n)
            elif kind == _CHUNK:
                chunks += int(n)
            else:
                relayed += int(n)
        moved = min(len(self._held), copies.get(_SS_INIT, 0))
        if moved:
            copies[_SS_INIT] -= moved
            copies[int(_DELIVERED)] += moved
        return dict(copies), relayed, chunks

    # ------------------------------------------------------------ housekeeping

    def refs(self) -> set[str]:
        """The kept chunks' files some row names."""
        return {f for (f,) in self.conn.execute("SELECT DISTINCT ref FROM stored WHERE ref IS NOT NULL")}

    def refresh_statistics(self) -> None:
        """PostgreSQL plans by the table's statistics, which autovacuum
        refreshes at most once a minute: a backlog that grows by thousands
        of copies a second is planned as a tiny table meanwhile (scans for
        look-ups that should use an index). ANALYZE when this instance
        stored _ANALYZE_ROWS copies since the last one (a sample of at most
        30,000 rows: tens of ms), at most every _ANALYZE_S."""
        now = time.monotonic()
        if self._stored_since_analyze >= _ANALYZE_ROWS and now - self._analyzed_at >= _ANALYZE_S:
            self._stored_since_analyze = 0
            self._analyzed_at = now
            try:
                self.conn.execute("ANALYZE stored")
            except STORE_ERRORS:
                pass  # next time
