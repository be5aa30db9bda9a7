"""The origin role of a node: the pending-send table (seed tb_0031).

Accepts documents (SPEC A.1), claims them in send order and encodes their
DATA (A.2; signed and sealed with security), and applies what comes back —
the platform's ACK_FWD / ACK_SAVE / NACK, the receiver's ACK2 and refusals,
inquiry answers (A.3-A.6) — through ``ORIGIN_TABLE`` (semq.node.engine).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from semq.identity.crypto import (
    document_aad_template,
    document_salts,
    enclose_app_key,
    protect_documents,
)
from semq.session.ports import FramePort
from semq.store.db import (
    STORE_ERRORS,
    SendOrder,
    StoreError,
    delete_by_id,
    next_row_id,
    rows_by_id,
    split_held,
    translate,
)
from semq.umxt_protocol import (
    LK0,
    AckEntry,
    AckFlag,
    AppKey,
    Data,
    Endpoint,
    Frame,
    InquiryResult,
    Kind,
    NodeType,
    RemoteProtocolError,
    ResultCode,
    SaveFwd,
    encode_data,
)

from ..batch import Events, NodeContext, Output
from ..engine import ORIGIN_TABLE, OriginEvent, SendState, origin_step
from ..envelope import MAX_ENVELOPE, Envelope, encode_envelope
from ..large.manifest import Manifest
from ..limits import MAX_DOCUMENT_SIZE, DocumentTooLarge
from ..writebehind import (
    MAX_INQUIRY_BACKOFF_MS,
    ClaimRow,
    HeldFwd,
    HeldSent,
    OriginRow,
    PendingSendRow,
    columns,
)
from .receipts import Receipts, document_flags

__all__ = ["NewDocument", "Origin", "document_flags"]

_NO_KEY: Final = AppKey()
_NO_KEY_PARTS: Final = ("", "", "", "")
S = SendState
_SS_INIT: Final = int(S.SS_INIT)
_SS_SENT: Final = int(S.SS_SENT)
_SS_ACK_FWD: Final = int(S.SS_ACK_FWD)
_DISCARD: Final = int(SaveFwd.DISCARD)  # SaveFwd 1: forwarded or dropped, never stored
_SS_ACK: Final = int(S.SS_ACK)
_SS_ACK2: Final = int(S.SS_ACK2)
# The states the table gives an expired and a given-up row, and a SaveFwd 1
# row handed to its target's direct link; a row sent otherwise is SS_SENT
# either way (held in memory: semq.node.writebehind).
_EXPIRED_TO: Final = int(ORIGIN_TABLE[(S.SS_INIT, OriginEvent.EXPIRED)][0])
_DIRECT_ONCE_TO: Final = int(ORIGIN_TABLE[(S.SS_INIT, OriginEvent.SENT_DIRECT_ONCE)][0])
assert ORIGIN_TABLE[(S.SS_INIT, OriginEvent.SENT_DIRECT)] == ORIGIN_TABLE[(S.SS_INIT, OriginEvent.SENT)]
_GIVEN_UP_TO: Final = int(ORIGIN_TABLE[(S.SS_INIT, OriginEvent.CANNOT_SEND)][0])
_OUT_COLS: Final = columns(PendingSendRow)
_CLAIM_COLS: Final = columns(ClaimRow)
_STEP_COLS: Final = columns(OriginRow)
# Named rows made without the Python frame of their __new__ or _make (the
# hot path makes several per document): the SELECT lists come from the same
# fields (``columns``), so a row read has exactly them, in their order.
_new: Final = tuple.__new__
_make_claim = partial(_new, ClaimRow)
_make_step_row = partial(_new, OriginRow)

# (session key, sealed document, AppKey sealed inside, digest) of a claimed row.
_Sealed = tuple[bytes, bytes, bool, bytes | None]
_EVENT_NAME: Final = {OriginEvent.ACK_FWD: "ack_fwd", OriginEvent.ACK_SAVE: "ack_save",
                      OriginEvent.NACK: "nack", OriginEvent.PLATFORM_LACKS: "resend",
                      OriginEvent.TARGET_LACKS: "resend", OriginEvent.TARGET_LACKS_STORED: "resend",
                      OriginEvent.LINK_LOST: "resend", OriginEvent.EXPIRED: "expired",
                      OriginEvent.CANNOT_SEND: "nack", OriginEvent.SENT: "sent", OriginEvent.SENT_DIRECT: "sent",
                      OriginEvent.SENT_DIRECT_ONCE: "sent"}
_SEND_STATES: Final = {int(s): s for s in SendState}
# The event-log name of each origin event (PLATFORM_HAS: the platform had it,
# its ack was lost; LINK_LOST_ONCE: taken as forwarded: logged as the ack_fwd
# they stand for).
_EVENT_NAMES: Final = {ev: _EVENT_NAME.get(ev, "ack2") for ev in OriginEvent} | {
    OriginEvent.PLATFORM_HAS: "ack_fwd", OriginEvent.LINK_LOST_ONCE: "ack_fwd"}
# origin_step per (state, event, save_fwd, ack2) of a row: pure, so computed
# once per combination (a dict look-up instead of lru_cache's keyword key).
_STEPS: dict[tuple[int, OriginEvent, int, int], Any] = {}
_ANSWER_ACKED: Final = InquiryResult.ALREADY_ACKED
_ANSWER_MARKED: Final = InquiryResult.MARKED_ACKED
_DELIVERY: Final = int(AckFlag.DELIVERY)


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
    # Users inside the two organizations ("": the organization itself) and
    # the ordered channel ("": unordered); semq.node.envelope.
    from_user: str = ""
    to_user: str = ""
    channel: str = ""
    # A gap notice: the record id of the failed ordered document whose place
    # it takes (and that document's ``prev``); made by semq.node.receiver.channels.
    skipped: int = 0
    gap_prev: int = 0
    # A large document (semq.node.large): ``app_data`` is its manifest and
    # this the path of its content, relative to the store's directory.
    large_path: str = ""


def _user_fields(d: NewDocument) -> dict[str, Any]:
    """The event fields of a document's users and channel (only those set)."""
    if not (d.from_user or d.to_user or d.channel):
        return {}
    return {k: v for k, v in (("from_user", d.from_user), ("to_user", d.to_user), ("channel", d.channel)) if v}


class Origin:
    """The pending-send table and the origin's rules."""

    def __init__(self, ctx: NodeContext, receipts: Receipts) -> None:
        self.ctx = ctx
        self.receipts = receipts

    def event(self, row: PendingSendRow | ClaimRow, event: str, ts: int, **extra: Any) -> dict[str, Any]:
        # The message's attributes were logged with "queued"; later events
        # name it and say what happened (docs/events.md).
        return {"ts": ts, "role": "origin", "event": event, "lk0": self.ctx.lk0_text(row.id),
                "source": self.ctx.me.node_id, "target": row.target_id, "attempt": row.attempts, **extra}

    # ------------------------------------------------------------ accepting

    def accept(self, docs: Iterable[NewDocument], tx: Callable[[], Any]) -> list[LK0]:
        """Write documents to the pending-send table (SS_INIT) in ``tx``.
        Durable when this returns. Raises StoreError (disk full, read-only)
        with nothing accepted, or LocalProtocolError for an invalid document
        (its subclass DocumentTooLarge for one no frame can carry: it could
        never be sent; semq.node.limits)."""
        ctx = self.ctx
        me = ctx.me
        ts = self.ctx.now()
        rows = []
        enveloped = False
        for d in docs:
            if len(d.app_data) > MAX_DOCUMENT_SIZE - MAX_ENVELOPE:
                # (An envelope takes up to MAX_ENVELOPE bytes of the frame.)
                limit = MAX_DOCUMENT_SIZE - MAX_ENVELOPE if d.from_user or d.to_user or d.channel else MAX_DOCUMENT_SIZE
                if len(d.app_data) > limit:
                    raise DocumentTooLarge(len(d.app_data), limit)
            target = Endpoint.org(d.target)  # validates the id
            # Validate every field by building the DATA value once.
            # (``encrypt`` asks for sealing at send time; the plaintext stays
            # in our own store until then.)
            Data(lk0=ctx.lk0(1), app_data=d.app_data, app_key=d.app_key,
                 created_ms=d.created_ms or ts, expires_ms=d.expires_ms)
            Frame(kind=Kind.DATA, source=me, target=target, reliable=d.reliable,
                  save_fwd=d.save_fwd, ack2=d.ack2, priority=d.priority,
                  body=Data(lk0=ctx.lk0(1)))
            if d.from_user or d.to_user or d.channel:
                Envelope(from_user=d.from_user, to_user=d.to_user, channel=d.channel)  # validates them
                enveloped = True
            rows.append((d, target, d.created_ms or ts))
        ids: list[int] = []
        try:
            with tx():
                conn = ctx.conn
                envelopes: list[bytes | None] = [None] * len(rows)
                prevs = [0] * len(rows)
                if enveloped:
                    # The ids this INSERT gives (AUTOINCREMENT, consecutive
                    # under our write lock; checked below): an ordered
                    # document names the one before it in its channel.
                    first = next_row_id(conn, "outbox")
                    last: dict[tuple[str, str], int] = {}
                    for i, (d, t, _) in enumerate(rows):
                        if not (d.from_user or d.to_user or d.channel):
                            continue
                        prev = d.gap_prev
                        if d.channel and not d.skipped:
                            k = (t.node_id, d.channel)
                            prev = last.get(k, -1)
                            if prev < 0:
                                row = conn.execute("SELECT last_id FROM channel_out WHERE target_id=? AND channel=?",
                                                   k).fetchone()
                                prev = int(row[0]) if row else 0
                            last[k] = first + i
                        prevs[i] = prev
                        envelopes[i] = encode_envelope(Envelope(
                            from_user=d.from_user, to_user=d.to_user, channel=d.channel, prev=prev,
                            skipped=d.skipped))
                    conn.executemany("INSERT OR REPLACE INTO channel_out (target_id, channel, last_id) VALUES (?,?,?)",
                                     [(*k, v) for k, v in last.items()])
                conn.executemany(
                    "INSERT INTO outbox (target_type, target_id, state, save_fwd, ack2, reliable,"
                    " priority, domain, data_type, subtype, key, created_ms, expires_ms, encrypt,"
                    " session_key, app_data, state_ms, clear_key, envelope, from_user, to_user, channel, prev_id, gap,"
                    " large) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    [(int(t.node_type), t.node_id, _SS_INIT, int(d.save_fwd), int(d.ack2), int(d.reliable),
                      d.priority, d.app_key.domain, d.app_key.data_type, d.app_key.subtype, d.app_key.key,
                      created, d.expires_ms, int(d.encrypt), d.session_key, d.app_data, ts, int(d.clear_app_key),
                      env, d.from_user, d.to_user, d.channel, prev, 2 if d.skipped else 0, int(bool(d.large_path)))
                     for (d, t, created), env, prev in zip(rows, envelopes, prevs, strict=True)],
                )
                if rows:
                    # AUTOINCREMENT under our write lock: the ids of one
                    # statement are consecutive, ending at the last one.
                    last_id = int(conn.execute("SELECT last_insert_rowid()").fetchone()[0])
                    ids = list(range(last_id - len(rows) + 1, last_id + 1))
                    if enveloped and ids[0] != first:
                        raise StoreError(f"record ids {ids[0]}.. were given where {first}.. were expected")
                    larges = [(i, d.large_path, d.app_data, Manifest.decode(d.app_data).size, ts)
                              for i, (d, _, _) in zip(ids, rows, strict=True) if d.large_path]
                    if larges:
                        conn.executemany("INSERT INTO large_out (id, path, manifest, size, created_ms)"
                                         " VALUES (?,?,?,?,?)", larges)
        except STORE_ERRORS as e:
            raise translate(e, ctx.path, "node store") from e
        ctx.emit([
            {"ts": ts, "role": "origin", "event": "queued", "lk0": ctx.lk0_text(i),
             "source": me.node_id, "target": t.node_id, "domain": d.app_key.domain,
             "data_type": d.app_key.data_type, "subtype": d.app_key.subtype, "key": d.app_key.key,
             "save_fwd": int(d.save_fwd), "ack2": bool(d.ack2), "reliable": bool(d.reliable),
             "priority": d.priority, "size": Manifest.decode(d.app_data).size if d.large_path else len(d.app_data),
             "attempt": 0, "created_ms": created, **_user_fields(d), **({"large": True} if d.large_path else {})}
            for i, (d, t, created) in zip(ids, rows, strict=True)
        ])
        return [ctx.lk0(i) for i in ids]

    def announce_gaps(self, tx: Callable[[], Any], ids: Collection[int] | None = None) -> int:
        """Queue a gap notice for each failed ordered document not announced
        yet (``ids``: of those only), marking it announced, in one
        transaction (semq.node.receiver.channels). Returns how many."""
        from .channels import gap_notices, gaps_due

        if ids is None and not gaps_due(self.ctx.conn):
            return 0  # (a read through the partial index: no write lock for nothing)
        with tx():
            docs, failed = gap_notices(self.ctx.conn, self.ctx.me.node_id, self.ctx.unit,
                                       encrypt=self.ctx.sec is not None, ids=ids)
            if not docs:
                return 0
            self.accept(docs, nullcontext)
            self.ctx.conn.executemany("UPDATE outbox SET gap=1 WHERE id=?", [(i,) for i in failed])
        return len(docs)

    # ------------------------------------------------------------ sending

    def claim(self, limit: int, skip_targets: frozenset[str], port: FramePort | None, out: Output,
              events: Events, ts: int, *, only: str | None = None, path: str = "relay") -> None:
        """SPEC A.2, inside the caller's transaction: see NodeCore.claim."""
        ctx = self.ctx
        conn = ctx.conn
        held = ctx.held.sent
        order = ctx.held.order
        skip = sorted(skip_targets)
        if only is not None:  # one target's documents (a direct link to it)
            # (Large documents go through the platform session, which sends
            # their chunks: semq.node.large.outgoing.)
            where, skip = f"state={_SS_INIT} AND target_id=? AND large=0", [only]
        elif skip:
            where = f"state={_SS_INIT} AND target_id NOT IN ({','.join('?' * len(skip))})"
        else:
            where = f"state={_SS_INIT}"
        if only is not None:
            # The send order of one target's rows, through the covering
            # index; rows held in flight (SS_INIT on disk) are not claimed again.
            ids = [i for (i,) in conn.execute(f"SELECT id FROM outbox WHERE {where} ORDER BY priority DESC, id"
                                              f" LIMIT ?", (only, limit + len(held)))
                   if i not in held][:limit]
            found = {r.id: r for r in map(_make_claim, rows_by_id(conn, f"SELECT {_CLAIM_COLS} FROM outbox", ids))}
            rows = [found[i] for i in ids if i in found]
            levels = SendOrder.levels(rows, ClaimRow._fields.index("priority"))
        elif held:
            ids, levels = order.ids(conn, where, skip, limit, held)
            found = {r.id: r for r in map(_make_claim, rows_by_id(conn, f"SELECT {_CLAIM_COLS} FROM outbox", ids))}
            rows = [found[i] for i in ids]
        else:
            order.forget()
            rows = list(map(_make_claim, conn.execute(
                f"SELECT {_CLAIM_COLS} FROM outbox WHERE {where} ORDER BY priority DESC, id LIMIT ?",
                (*skip, limit))))
            levels = SendOrder.levels(rows, ClaimRow._fields.index("priority"))
        if not rows:
            return
        rows, sealed_docs = self._protect(rows, out)
        targets: dict[str, Endpoint] = {}
        gone: list[int] = []  # best-effort ids: sent, nothing to wait for
        forwarded: list[tuple[int, int, int, int, int, int]] = []  # SaveFwd 1 on a direct link: SS_ACK_FWD now
        fwd_digests: list[tuple[int, str, bytes]] = []
        expired: list[tuple[int, int]] = []
        me, me_id, unit = ctx.me, ctx.me.node_id, ctx.unit
        data = out.data
        secure = ctx.sec is not None
        for r in rows:
            rid, expires, target_id, attempt = r.id, r.expires_ms, r.target_id, r.attempts + 1
            if expires is not None and expires <= ts:
                expired.append((ts, rid))
                events.append(self.event(r, "expired", ts, code=int(ResultCode.EXPIRED)))
                continue
            # Validated when accepted: encode straight from the row.
            target = targets.get(target_id)
            if target is None:
                target = targets[target_id] = Endpoint(node_type=NodeType(r.target_type), node_id=target_id)
            if secure:
                session_key, app_data, sealed, digest = sealed_docs[rid]
            else:
                session_key, app_data, sealed, digest = r.session_key, r.app_data, False, None
                if r.envelope is not None:
                    app_data = r.envelope + app_data
            local = target_id == me_id  # to a user of this node: never leaves it
            (out.local if local else data).append(encode_data(
                source=me, target=target, record_id=rid,
                app_key=_NO_KEY_PARTS if sealed else (r.domain, r.data_type, r.subtype, r.key),
                created_ms=r.created_ms, expires_ms=expires, save_fwd=r.save_fwd, ack2=bool(r.ack2),
                reliable=bool(r.reliable), priority=r.priority, session_key=session_key, app_data=app_data,
                key_sealed=sealed, semq_id=unit, envelope=r.envelope is not None, ordered=bool(r.channel),
                large=bool(r.large),
            ))
            events.append({"ts": ts, "role": "origin", "event": "sent", "lk0": f"{me_id}/{unit}/1/{rid}",
                           "source": me_id, "target": target_id, "attempt": attempt,
                           "path": "local" if local else path})
            if not local:
                out.targets.add(target_id)
            if r.reliable and only is not None and r.save_fwd == _DISCARD:
                # SaveFwd 1 on a direct link (SENT_DIRECT_ONCE): written as
                # forwarded at once, never held (ORIGIN_TABLE says why).
                forwarded.append((attempt, ts, ts, ts, ctx.held.first_inquiry(ts, attempt), rid))
                if digest is not None:
                    fwd_digests.append((rid, target_id, digest))
            elif r.reliable:
                # SS_SENT held in memory, not written: the ACK2 that follows
                # within a fraction of a second deletes the row, and the
                # UPDATE of a row with its 1 KiB document cost ~6 us of an
                # origin's ~30 per document, its WAL pages more at the
                # fsync. Nothing we send depends on it: lost in a crash, the
                # row is SS_INIT and goes again (the platform and the
                # receiver suppress the duplicate). Written after HOLD_MS
                # (semq.node.writebehind); every step reads it from memory
                # meanwhile, and the claims skip it. The digest a document
                # was signed with stays with it (the receipt that names it
                # usually comes with the ACK2, and the row is written once,
                # with it); a best-effort document gets no receipt.
                held[rid] = _new(HeldSent, (ts, attempt, target_id, r.save_fwd, r.ack2, digest))
                out.sent_ids.append(rid)
            else:
                gone.append(rid)
        delete_by_id(conn, "outbox", gone)
        if forwarded:
            conn.executemany(f"UPDATE outbox SET state={_DIRECT_ONCE_TO}, attempts=?, sent_ms=?, state_ms=?, code=0,"
                             f" inquiries=0, last_inquiry_ms=?, due_ms=? WHERE id=? AND state={_SS_INIT}", forwarded)
            self.receipts.write_digests(fwd_digests)
        # (state_ms: the failed row's 7 days count from now.)
        conn.executemany(f"UPDATE outbox SET state={_EXPIRED_TO}, code={int(ResultCode.EXPIRED)}, state_ms=?"
                         f" WHERE id=? AND state={_SS_INIT}", expired)
        if not skip:  # (rows of skipped targets were not read: they would be jumped)
            order.advance(levels, held, {*gone, *(rid for _, rid in expired)})
        if port is not None and out.data:
            # DATA leaves before the commit: a document promises nothing (no
            # ack of ours depends on it). If the commit fails, the rows stay
            # SS_INIT and go again (the receiver's duplicate suppression).
            out.early = len(out.data)
            port.put(out.data)
            out.data = []

    def _protect(self, rows: list[ClaimRow], out: Output) -> tuple[list[ClaimRow], dict[int, _Sealed]]:
        """Sign and seal a claimed batch (security on): the rows to send
        (those whose target certificate is unknown are left out: they stay
        SS_INIT) and, by record id, each one's sealed document, whether its
        AppKey is sealed inside, and the digest it was signed with."""
        sec = self.ctx.sec
        if sec is None:
            return rows, {}
        ts = self.ctx.now()
        me = self.ctx.me
        keep, items = [], []
        # One Endpoint and one directory look-up per target per batch; the
        # AAD from the row's fields (validated when the document was
        # accepted), all but its LK0 ids built once per target and AppKey.
        targets: dict[tuple[int, str], Endpoint] = {}
        batch_certs: dict[tuple[int, str], Any] = {}
        # per target, AppKey, SaveFwd, flags, priority
        aads: dict[tuple[Any, ...], Callable[[int, int, int, int, int | None], bytes]] = {}
        for r in rows:
            if r.expires_ms is not None and r.expires_ms <= ts:
                keep.append(r)  # expires in the claim; nothing to protect
                continue
            tk = (r.target_type, r.target_id)
            target = targets.get(tk)
            if target is None:
                target = targets[tk] = Endpoint(node_type=NodeType(r.target_type), node_id=r.target_id)
            certs = None
            if r.encrypt:
                certs = batch_certs.get(tk)
                if certs is None:
                    certs = batch_certs[tk] = sec.certs(target)
                if not certs:
                    out.missing.add(target)
                    continue
            sealed = bool(r.encrypt) and not r.clear_key
            env = r.envelope
            flags = document_flags(bool(r.reliable), bool(r.ack2), bool(r.encrypt), sealed, env is not None,
                                   bool(r.channel), bool(r.large))
            doc = r.app_data if env is None else env + r.app_data
            ak = (tk, r.domain, r.data_type, r.subtype, r.key, r.save_fwd, flags, r.priority)
            aad_of = aads.get(ak)
            if aad_of is None:
                aad_of = aads[ak] = (
                    document_aad_template(me, me, target, "", "", "", "", r.save_fwd, flags, r.priority) if sealed
                    else document_aad_template(me, me, target, r.domain, r.data_type, r.subtype, r.key,
                                               r.save_fwd, flags, r.priority))
            aad = aad_of(self.ctx.unit, 1, r.id, r.created_ms, r.expires_ms)
            keep.append(r)
            items.append((aad, enclose_app_key(r.domain, r.data_type, r.subtype, r.key, doc) if sealed
                          else doc, certs))
        if not items:
            return keep, {}
        key = self.receipts.salt_key()
        docs = iter(protect_documents(items, signing_key=sec.identity.keys.signing_key, sealer=sec.sealer,
                                      salts=document_salts(key, [aad for aad, _, _ in items])))
        protected: dict[int, _Sealed] = {}
        for r in keep:
            if r.expires_ms is None or r.expires_ms > ts:
                app_data, session_key, digest = next(docs)
                protected[r.id] = (session_key, app_data, bool(session_key) and not r.clear_key, digest)
        return keep, protected

    def fail_target(self, target: Endpoint, code: ResultCode, detail: str, save_fwd: int | None) -> Events:
        """Give up every not-yet-sent document to ``target`` (CANNOT_SEND),
        inside the caller's transaction, with the held writes written."""
        ts = self.ctx.now()
        only = "" if save_fwd is None else f" AND save_fwd={int(save_fwd)}"
        rows = [PendingSendRow._make(r) for r in self.ctx.conn.execute(
            f"SELECT {_OUT_COLS} FROM outbox WHERE state={_SS_INIT} AND target_type=? AND target_id=?{only}",
            (int(target.node_type), target.node_id))]
        self.ctx.conn.executemany(
            f"UPDATE outbox SET state={_GIVEN_UP_TO}, state_ms=?, code=? WHERE id=? AND state={_SS_INIT}",
            [(ts, int(code), r.id) for r in rows])
        return [self.event(r, "nack", ts, code=int(code), detail=detail) for r in rows]

    def wait_target(self, target: Endpoint, code: ResultCode | int, waiting: Collection[int]) -> int:
        """See NodeCore.wait_target (no state changes: only why a row waits)."""
        codes = sorted({0, *map(int, waiting)})
        cur = self.ctx.conn.execute(
            f"UPDATE outbox SET code=? WHERE state={_SS_INIT} AND target_type=? AND target_id=?"
            f" AND code IN ({','.join('?' * len(codes))}) AND code<>?",
            (int(code), int(target.node_type), target.node_id, *codes, int(code)))
        return cur.rowcount

    def pending_count(self) -> int:
        row = self.ctx.conn.execute(f"SELECT count(*) FROM outbox WHERE state={_SS_INIT}").fetchone()
        return self.ctx.held.pending_sends(int(row[0]))  # held rows were sent

    # ------------------------------------------------------------ answers

    def apply(
        self, items: Sequence[tuple[Any, ...]], ts: int, out: Output, events: Events,
        acks: dict[tuple[Kind, Endpoint], list[AckEntry]] | None, *, peer: Endpoint | None = None,
        code: int = 0, detail: str = "",
    ) -> list[tuple[int, InquiryResult]]:
        """Apply origin events (record id, event[, the AckEntry that brought
        it]) to rows; returns (id, previous-state answer) for STATE
        inquiries. The hot path of an origin (every ACK_FWD, ACK_SAVE and
        ACK2 of every document): one look-up of the rows, a cached table
        step and two dicts for the event log per row."""
        ctx = self.ctx
        conn = ctx.conn
        wb = ctx.held
        answers: list[tuple[int, InquiryResult]] = []
        ids = [it[0] for it in items]
        held, held_sent = wb.fwd, wb.sent
        # A claimed row whose SS_SENT is held is SS_INIT on disk and its
        # other columns never change: from memory (an ACK_FWD and an ACK2
        # per document; reading them was ~1.1 us a row, scripts/bench
        # pipeline). The rest are read.
        # Per row: (target, state, SaveFwd, Ack2, attempts), all a step needs.
        rows: dict[int, tuple[str, int, int, int, int]] = {}
        if held_sent:
            hits, ids = split_held(ids, held_sent)
            for rid, h in hits:
                rows[rid] = (h.target_id, _SS_INIT, h.save_fwd, h.ack2, h.attempts - 1)
        if ids:
            for r in map(_make_step_row, rows_by_id(conn, f"SELECT {_STEP_COLS} FROM outbox", ids)):
                rows[r.id] = (r.target_id, r.state, r.save_fwd, r.ack2, r.attempts)
        updates: list[tuple[int, int, int, int]] = []
        deletes: list[int] = []
        sent_updates = []  # rows whose held SS_SENT is written with their new state
        digests: list[tuple[int, str, bytes]] = []  # ... and their digests not written yet
        # Only the document's own target may confirm, refuse or ask about it:
        # an ACK2 from a third organization is ignored (answered NO_RECORD).
        only = peer.node_id if peer is not None and peer.node_type is not NodeType.PLATFORM else None
        reack2: list[AckEntry] | None = None
        me = ctx.me.node_id
        steps = _STEPS
        first_inquiry = wb.first_inquiry
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
            sent_at = held_sent.get(rid) if held_sent else None
            if sent_at is not None:
                attempts = sent_at.attempts
                if state_no == _SS_INIT:
                    state_no = _SS_SENT  # claimed; SS_INIT on disk
            held_at = held.pop(rid, None) if held else None
            if held_at is not None and state_no == _SS_SENT:
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
                if held_at is not None:
                    held[rid] = held_at
                continue
            new_state = o.state
            if new_state is SendState.SS_INIT:
                wb.order.forget()  # to be sent again: the claims must read it
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
                    del held_sent[rid]
                    if sent_at.digest is not None:
                        digests.append((rid, sent_at.target_id, sent_at.digest))
                events.append({"ts": ts, "role": "origin", "event": "cleaned", "lk0": lk0, "source": me,
                               "target": target_id, "attempt": attempts})
            elif new_state is SendState.SS_ACK_FWD and state_no == _SS_SENT:
                # Held in memory, not written: the ACK2 that follows within
                # a fraction of a second deletes the row, and the UPDATE of
                # a row with its 1 KiB document was ~13% of an origin's time
                # (py-spy, scripts/bench e2e). Nothing we send depends on
                # it: lost in a crash, the row is SS_SENT, asks the platform
                # and hears "forwarded" again (semq.node.writebehind).
                held[rid] = _new(HeldFwd, (ts, row_code))
            elif sent_at is not None:
                # Its held SS_SENT goes with the new state: one UPDATE.
                del held_sent[rid]
                if sent_at.digest is not None:
                    digests.append((rid, sent_at.target_id, sent_at.digest))
                sent_updates.append((int(new_state), ts, row_code, ts, first_inquiry(ts, attempts),
                                     attempts, sent_at.claimed_ms, rid))
            else:
                updates.append((int(new_state), ts, row_code, rid))
        # SPEC A.3: a new state sets the inquiry time to now and starts a new
        # inquiry schedule (no backoff carried over from the previous state).
        # The first inquiry waits one interval, doubled per resend so far
        # (attempts - 1): a target busy with a backlog is not asked again
        # about a resent copy before it could have read it (retransmission
        # backoff; otherwise each "not received" feeds another resend).
        conn.executemany("UPDATE outbox SET state=?, state_ms=?, code=?, inquiries=0, last_inquiry_ms=?,"
                         " due_ms=?+min(?, ?*(1 << min(max(attempts-1, 0), 6))) WHERE id=?",
                         [(st, t, c, t, t, MAX_INQUIRY_BACKOFF_MS, ctx.inquiry_ms, rid)
                          for st, t, c, rid in updates])
        if sent_updates:
            conn.executemany("UPDATE outbox SET state=?, state_ms=?, code=?, inquiries=0, last_inquiry_ms=?,"
                             " due_ms=?, attempts=?, sent_ms=? WHERE id=?", sent_updates)
        delete_by_id(conn, "outbox", deletes)
        if digests:
            self.receipts.write_digests(digests)
        return answers

    def nack(self, body: Any, peer: Endpoint, ts: int, out: Output, events: Events,
             acks: dict[tuple[Kind, Endpoint], list[AckEntry]]) -> None:
        """A NACK: the platform's flow control (OVER_WINDOW: sent again
        later, slower), its storage quota (QUOTA_EXCEEDED: kept, the target
        paused), or a refusal (the platform's, or the target's — with
        security only signed by the target)."""
        rid = body.lk0.record_id
        if body.code is ResultCode.OVER_WINDOW:
            out.over_window += 1
            self.apply([(rid, OriginEvent.PLATFORM_LACKS)], ts, out, events, acks, peer=peer)
            return
        if body.code is ResultCode.QUOTA_EXCEEDED and peer.node_type is NodeType.PLATFORM:
            # Our storage quota at the platform is used up: not taken; we keep
            # it (SS_INIT, its code says why) and the daemon sends to that
            # target again after a pause.
            h = self.ctx.held.sent.get(rid)
            target = h.target_id if h is not None else None
            if target is None:
                row = self.ctx.conn.execute("SELECT target_id FROM outbox WHERE id=?", (rid,)).fetchone()
                target = row[0] if row is not None else None
            if target is not None:
                out.over_quota.add(target)
            self.apply([(rid, OriginEvent.PLATFORM_LACKS)], ts, out, events, acks, peer=peer,
                       code=int(ResultCode.QUOTA_EXCEEDED), detail=body.message)
            return
        if body.lk0.endpoint != self.ctx.me:
            raise RemoteProtocolError(f"NACK from {peer} names {body.lk0}, not one of our documents",
                                      ResultCode.UNEXPECTED_FRAME)
        if peer.node_type is not NodeType.PLATFORM and self.ctx.sec is not None:
            # A target's refusal counts only signed by the target: the relay
            # could otherwise make us give up a document it dropped.
            if not self.receipts.refusal_verifies(peer, body, ts, out, events):
                return
            answers = self.apply([(rid, OriginEvent.NACK)], ts, out, events, acks, peer=peer,
                                 code=int(body.code), detail=body.message)
            if answers and answers[0][1] is not InquiryResult.NO_RECORD:
                self.receipts.keep_refusal(rid, peer, body, ts)
            return
        self.apply([(rid, OriginEvent.NACK)], ts, out, events, acks, peer=peer, code=int(body.code),
                   detail=body.message)

    def peek_answers(self, ids: Sequence[int], peer: Endpoint) -> dict[int, InquiryResult]:
        """What a STATE inquiry about our records ``ids`` from their target
        ``peer`` is answered, without changing them: ALREADY_ACKED for a
        confirmed row, MARKED_ACKED ("noted") for an open one, NO_RECORD for
        one that is gone or not the asker's."""
        hits, rest = split_held(list(ids), self.ctx.held.sent)
        targets = {rid: (h.target_id, _SS_INIT) for rid, h in hits}
        if rest:
            targets.update((r.id, (r.target_id, r.state)) for r in map(
                _make_step_row, rows_by_id(self.ctx.conn, f"SELECT {_STEP_COLS} FROM outbox", rest)))
        out = {}
        for rid, (target, state) in targets.items():
            if target == peer.node_id:
                out[rid] = _ANSWER_ACKED if state == _SS_ACK2 else _ANSWER_MARKED
        return out

    # ------------------------------------------------------------ inquiries

    def due_inquiries(self, ts: int, limit: int, events: Events) -> tuple[list[LK0], dict[Endpoint, list[LK0]]]:
        """SPEC A.5: the rows whose inquiry is due, with their inquiry time
        set: (to the platform, per target). SS_SENT asks P, and so does
        SS_ACK (stored: P owns delivery; see ORIGIN_TABLE); SS_ACK_FWD
        (every SaveFwd) asks B."""
        ctx = self.ctx
        # Through the partial index outbox_due (its condition is
        # ``state BETWEEN 1 AND 3``, SS_SENT to SS_ACK): only the rows due now.
        rows = [PendingSendRow._make(r) for r in ctx.conn.execute(
            f"SELECT {_OUT_COLS} FROM outbox INDEXED BY outbox_due WHERE reliable=1"
            f" AND state BETWEEN {_SS_SENT} AND {_SS_ACK} AND due_ms <= ?"
            f" AND (state IN ({_SS_SENT}, {_SS_ACK_FWD}) OR save_fwd={int(SaveFwd.MUST_DELIVER)} OR ack2=1)"
            f" ORDER BY due_ms LIMIT ?", (ts, limit))]
        to_p: list[LK0] = []
        to_b: dict[Endpoint, list[LK0]] = {}
        for r in rows:
            lk = ctx.lk0(r.id)
            if r.state in (_SS_SENT, _SS_ACK):
                to_p.append(lk)
                events.append(self.event(r, "inquiry", ts, detail="platform"))
            else:
                to_b.setdefault(Endpoint(node_type=NodeType(r.target_type), node_id=r.target_id), []).append(lk)
                events.append(self.event(r, "inquiry", ts, detail="target"))
        ctx.conn.executemany(
            "UPDATE outbox SET last_inquiry_ms=?, due_ms=?+min(?, ?*(1 << min(inquiries+1, 6))),"
            " inquiries=inquiries+1 WHERE id=?",
            [(ts, ts, MAX_INQUIRY_BACKOFF_MS, ctx.inquiry_ms, r.id) for r in rows],
        )
        return to_p, to_b

    def ask_at_once(self) -> None:
        """After a new session: SS_SENT rows ask the platform at once rather
        than after the interval (their answers may have been lost)."""
        self.ctx.conn.execute(f"UPDATE outbox SET last_inquiry_ms=0, due_ms=0, inquiries=0 WHERE state={_SS_SENT}")

