"""The origin's role: our documents, from accepted to confirmed.

Accepts documents (SPEC A.1), claims them in send order and encodes their
DATA (A.2; signed and sealed with security), and says what comes back —
the platform's ACK_FWD / ACK_SAVE / NACK, the receiver's ACK2 and refusals,
inquiry answers (A.3-A.6) — to the pending-send table's owner, which
applies it through ``ORIGIN_TABLE`` (semq.node.origin.outbox). The SQL is
the owners': ``Outbox``, ``ChannelsOut``, ``Receipts``, ``LargeOut``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from contextlib import nullcontext
from typing import Any, Final

from semq.identity.crypto import (
    document_aad_template,
    document_salts,
    enclose_app_key,
    protect_documents,
)
from semq.session.ports import FramePort
from semq.store.db import StoreError
from semq.umxt_protocol import (
    LK0,
    AckEntry,
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
from ..engine import OriginEvent, SendState
from ..envelope import MAX_ENVELOPE, Envelope, encode_envelope
from ..large.manifest import Manifest
from ..large.outgoing import LargeOut
from ..limits import MAX_DOCUMENT_SIZE, DocumentTooLarge
from .channels import ChannelsOut, gap_notices
from .documents import NewDocument, document_flags
from .outbox import ClaimRow, DeferredSent, Outbox, PendingSendRow
from .receipts import Receipts

__all__ = ["NewDocument", "Origin", "document_flags"]

_NO_KEY_PARTS: Final = ("", "", "", "")
S = SendState
_SS_INIT: Final = int(S.SS_INIT)
_SS_SENT: Final = int(S.SS_SENT)
_SS_ACK: Final = int(S.SS_ACK)
_SS_ACK2: Final = int(S.SS_ACK2)
_DISCARD: Final = int(SaveFwd.DISCARD)  # SaveFwd 1: forwarded or dropped, never stored
_new: Final = tuple.__new__  # a named row without the Python frame of its __new__ (one per document)
_ANSWER_ACKED: Final = InquiryResult.ALREADY_ACKED
_ANSWER_MARKED: Final = InquiryResult.MARKED_ACKED

# (session key, sealed document, AppKey sealed inside, digest) of a claimed row.
_Sealed = tuple[bytes, bytes, bool, bytes | None]


def _user_fields(d: NewDocument) -> dict[str, Any]:
    """The event fields of a document's users and channel (only those set)."""
    if not (d.from_user or d.to_user or d.channel):
        return {}
    return {k: v for k, v in (("from_user", d.from_user), ("to_user", d.to_user), ("channel", d.channel)) if v}


class Origin:
    """The origin's rules, over the owners of its tables."""

    def __init__(self, ctx: NodeContext, outbox: Outbox, receipts: Receipts, channels: ChannelsOut,
                 large: LargeOut) -> None:
        self.ctx = ctx
        self.outbox = outbox
        self.receipts = receipts
        self.channels = channels
        self.large = large

    def event(self, row: PendingSendRow | ClaimRow, event: str, ts: int, **extra: Any) -> dict[str, Any]:
        # The message's attributes were logged with "queued"; later events
        # name it and say what happened (docs/events.md).
        return {"ts": ts, "role": "origin", "event": event, "lk0": self.ctx.lk0_text(row.id),
                "source": self.ctx.me.node_id, "target": row.target_id, "attempt": row.attempts, **extra}

    # ------------------------------------------------------------ accepting

    def accept(self, docs: Iterable[NewDocument], tx: Callable[[], Any]) -> list[LK0]:
        """Write documents to the pending-send table (SS_INIT) in ``tx`` (the
        facade's: it translates the store's errors). Durable when this
        returns. Raises StoreError (disk full, read-only) with nothing
        accepted, or LocalProtocolError for an invalid document
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
        outbox = self.outbox
        with tx():
            envelopes: list[bytes | None] = [None] * len(rows)
            prevs = [0] * len(rows)
            first = 0
            if enveloped:
                # The ids this INSERT gives (AUTOINCREMENT, consecutive
                # under our write lock; checked below): an ordered
                # document names the one before it in its channel.
                first = outbox.next_id()
                last: dict[tuple[str, str], int] = {}
                for i, (d, t, _) in enumerate(rows):
                    if not (d.from_user or d.to_user or d.channel):
                        continue
                    prev = d.gap_prev
                    if d.channel and not d.skipped:
                        k = (t.node_id, d.channel)
                        prev = last.get(k, -1)
                        if prev < 0:
                            prev = self.channels.last(*k)
                        last[k] = first + i
                    prevs[i] = prev
                    envelopes[i] = encode_envelope(Envelope(
                        from_user=d.from_user, to_user=d.to_user, channel=d.channel, prev=prev,
                        skipped=d.skipped))
                self.channels.advance(last)
            ids = outbox.insert(
                [(int(t.node_type), t.node_id, _SS_INIT, int(d.save_fwd), int(d.ack2), int(d.reliable),
                  d.priority, d.app_key.domain, d.app_key.data_type, d.app_key.subtype, d.app_key.key,
                  created, d.expires_ms, int(d.encrypt), d.session_key, d.app_data, ts, int(d.clear_app_key),
                  env, d.from_user, d.to_user, d.channel, prev, 2 if d.skipped else 0, int(bool(d.large_path)))
                 for (d, t, created), env, prev in zip(rows, envelopes, prevs, strict=True)])
            if enveloped and ids and ids[0] != first:
                raise StoreError(f"record ids {ids[0]}.. were given where {first}.. were expected")
            larges = [(i, d.large_path, d.app_data, Manifest.decode(d.app_data).size, ts)
                      for i, (d, _, _) in zip(ids, rows, strict=True) if d.large_path]
            if larges:
                self.large.accepted(larges)
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
        transaction (semq.node.origin.channels). Returns how many."""
        if ids is None and not self.outbox.gaps_due():
            return 0  # (a read through the partial index: no write lock for nothing)
        with tx():
            docs, failed = gap_notices(self.outbox, self.ctx.me.node_id, self.ctx.unit,
                                       encrypt=self.ctx.sec is not None, ids=ids)
            if not docs:
                return 0
            self.accept(docs, nullcontext)
            self.outbox.mark_announced(failed)
        return len(docs)

    # ------------------------------------------------------------ sending

    def claim(self, limit: int, skip_targets: frozenset[str], port: FramePort | None, out: Output,
              events: Events, ts: int, *, only: str | None = None, path: str = "relay") -> None:
        """SPEC A.2, inside the caller's transaction: see NodeCore.claim."""
        ctx = self.ctx
        outbox = self.outbox
        skip = sorted(skip_targets) if only is None else []
        rows, levels = outbox.claim_rows(limit, skip, only)
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
        deferred = outbox.sent  # (the claim's entry into the outbox's deferred SS_SENT: a dict store)
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
                # forwarded at once, never deferred (ORIGIN_TABLE says why).
                forwarded.append((attempt, ts, ts, ts, outbox.first_inquiry(ts, attempt), rid))
                if digest is not None:
                    fwd_digests.append((rid, target_id, digest))
            elif r.reliable:
                # SS_SENT deferred, not written: the ACK2 that follows
                # within a fraction of a second deletes the row, and the
                # UPDATE of a row with its 1 KiB document cost ~6 us of an
                # origin's ~30 per document, its WAL pages more at the
                # fsync. Nothing we send depends on it: lost in a crash, the
                # row is SS_INIT and goes again (the platform and the
                # receiver suppress the duplicate). Written after DEFER_MS
                # (semq.node.origin.outbox); every step reads it from memory
                # meanwhile, and the claims skip it. The digest a document
                # was signed with stays with it (the receipt that names it
                # usually comes with the ACK2, and the row is written once,
                # with it); a best-effort document gets no receipt.
                deferred[rid] = _new(DeferredSent, (ts, attempt, target_id, r.save_fwd, r.ack2, digest))
                out.sent_ids.append(rid)
            else:
                gone.append(rid)
        outbox.claimed(levels, gone=gone, expired=expired, forwarded=forwarded, digests=fwd_digests,
                       order=not skip and only is None)
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
        inside the caller's transaction."""
        ts = self.ctx.now()
        rows = self.outbox.give_up(target, int(code), ts, None if save_fwd is None else int(save_fwd))
        return [self.event(r, "nack", ts, code=int(code), detail=detail) for r in rows]

    def wait_target(self, target: Endpoint, code: ResultCode | int, waiting: Collection[int]) -> int:
        """See NodeCore.wait_target (no state changes: only why a row waits)."""
        return self.outbox.mark_waiting(target, int(code), waiting)

    # ------------------------------------------------------------ answers

    def apply(
        self, items: Sequence[tuple[Any, ...]], ts: int, out: Output, events: Events,
        acks: dict[tuple[Kind, Endpoint], list[AckEntry]] | None, *, peer: Endpoint | None = None,
        code: int = 0, detail: str = "",
    ) -> list[tuple[int, InquiryResult]]:
        """Origin events (record id, event[, the AckEntry that brought it]),
        applied by the pending-send table's owner (``Outbox.apply``)."""
        return self.outbox.apply(items, ts, out, events, acks, peer=peer, code=code, detail=detail)

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
            target = self.outbox.target_of(rid)
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
        targets = {rid: (r.target_id, r.state) for rid, r in self.outbox.by_ids(PendingSendRow, list(ids)).items()}
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
        rows = self.outbox.due(ts, limit)
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
        return to_p, to_b

    def ask_at_once(self) -> None:
        """After a new session: SS_SENT rows ask the platform at once rather
        than after the interval (their answers may have been lost)."""
        self.outbox.ask_at_once()
