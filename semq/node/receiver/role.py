"""The receiver's role: documents for us, from their DATA to their acks.

A DATA for us is checked (signature, seal, expiry, creation time), its LK0
looked up in the dedup table, and, the first time, put in the inbox; its
acks (ACK to the platform for a stored copy, ACK2 with a receipt to the
origin) leave after the commit (SPEC B.1, B.4). A pending-ack row waits for
their confirmations, REACK and REACK2, and asks for them when they are
late (B.2). The SQL is the owners': ``Inbox`` (inbox, dedup),
``PendingAcks`` (the pending-ack table), ``ChannelsIn`` (ordered
channels), ``Users``, ``LargeIn`` (large documents under way).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Final

from semq.identity.crypto import (
    CryptoError,
    UnknownCertificate,
    make_refusal,
    open_documents,
    raw_frame_aad,
    split_app_key,
)
from semq.umxt_protocol import (
    LK0,
    AckEntry,
    AckFlag,
    AppKey,
    Data,
    Endpoint,
    Frame,
    Kind,
    Nack,
    NodeType,
    RawFrame,
    RemoteProtocolError,
    ResultCode,
)

from ..batch import Batch, NodeContext
from ..engine import AckStatus, receive_decision
from ..envelope import NO_ENVELOPE, Envelope, EnvelopeError, split_envelope
from ..large.incoming import LargeIn
from ..limits import DEFAULT_MAX_DOCUMENT
from ..users import Users
from . import channels
from .channels import ChannelsIn
from .inbox import GAP_MARK, Inbox, LK0Key
from .pending_ack import PendingAckRow, PendingAcks

__all__ = ["DEDUP_RETENTION_MS", "GAP_MARK", "Receiver"]

DEDUP_RETENTION_MS: Final = 30 * 24 * 3600 * 1000  # docs/exactly-once.md
_AS_INIT: Final = int(AckStatus.AS_INIT)
_AS_ACK: Final = int(AckStatus.AS_ACK)
_new: Final = tuple.__new__  # a named row without the Python frame of its __new__ (one per document)
# receive_decision per (duplicate, has_lk1, ack2, reliable): pure, computed once.
_DECISIONS: dict[tuple[bool, bool, bool, bool], Any] = {}


class Receiver:
    """Documents arriving for us, and the confirmations of our acks."""

    def __init__(self, ctx: NodeContext, inbox: Inbox, pending: PendingAcks, users: Users) -> None:
        self.ctx = ctx
        self.inbox = inbox
        self.pending = pending
        self.users = users
        self._unknown_key_at: dict[Endpoint, int] = {}  # origin -> when a document of it waited for its key
        self.channels = ChannelsIn(ctx)
        self._users: frozenset[str] | None = None  # this node's users, read when a document names one
        self.large = LargeIn(ctx, self, DEFAULT_MAX_DOCUMENT)  # large documents under way (semq.node.large.incoming)

    # ------------------------------------------------------------ a batch

    def open_batch(self, b: Batch, frames: Sequence[RawFrame]) -> None:
        """Open and verify the batch's DATA for us at once (security on;
        open_documents checks each batch signature's documents together)
        into ``b.opened``: by ``id(raw)``, the decoded frame and its
        VerifiedDocument or the CryptoError that refuses it. A DATA whose
        origin's certificate is not known, or that does not decode
        (``data`` says why), is not there."""
        sec = self.ctx.sec
        if sec is None:
            return
        me = self.ctx.me
        found: list[tuple[RawFrame, Frame]] = []
        items = []
        for raw in frames:
            if raw.kind is not Kind.DATA or raw.target != me:
                continue
            try:
                frame = raw.frame()
            except RemoteProtocolError:
                continue
            certs = b.certs.get(frame.origin)
            if certs is None:
                certs = b.certs[frame.origin] = sec.certs(frame.origin)
            if not certs:
                continue
            body = frame.body
            assert isinstance(body, Data)
            found.append((raw, frame))
            items.append((body.app_data, body.session_key, raw_frame_aad(raw), certs))
        got = open_documents(items, keys=sec.opener, cache=sec.cache)
        b.opened = {id(raw): (frame, g) for (raw, frame), g in zip(found, got, strict=True)}

    def begin(self, b: Batch, frames: Sequence[RawFrame]) -> None:
        """One look-up of the dedup table for the batch's DATA (MEASUREMENTS:
        per-row statements cost ~15 us each)."""
        self.channels.begin()
        self._users = None
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
            for rid in self.inbox.known(g, rids):
                b.known.add((*g, rid))

    def data(self, b: Batch, raw: RawFrame) -> None:
        """A DATA for us: opened with the batch (security), then received or refused."""
        opened = b.opened.pop(id(raw), None)
        frame = raw.frame() if opened is None else opened[0]
        body = frame.body
        assert isinstance(body, Data)
        if self.ctx.sec is None:
            self._open_envelope(b, frame, body, body.app_data, None, "", body.app_key)
            return
        out = b.out
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
        if isinstance(got, UnknownCertificate) and self._first_unknown_key(frame.origin, b.ts):
            # Signed by a key of the origin we do not have yet (it rolled
            # over, and the platform's push has not reached us): ask for its
            # certificates and handle it again when they come. Only once a
            # minute per origin: if the key is still unknown after that, it
            # is refused.
            out.deferred.append(raw)
            out.missing.add(frame.origin)
            return
        if isinstance(got, CryptoError):
            # Never delivered; the origin sees it (its row fails with the code).
            self.refuse(b, frame, body, getattr(got, "code", ResultCode.BAD_SIGNATURE), str(got))
            return
        self._open_envelope(b, frame, body, doc, got.digest, got.signer.org, app_key)

    def _open_envelope(self, b: Batch, frame: Frame, d: Data, doc: bytes, digest: bytes | None, signer: str,
                       app_key: AppKey) -> None:
        """The envelope of a document that has one (users, ordered channel:
        semq.node.envelope), checked, then the document received."""
        if not d.envelope:
            self._receive(b, frame, d, doc, digest, signer, app_key, NO_ENVELOPE)
            return
        try:
            env, doc = split_envelope(doc)
        except EnvelopeError as e:
            self.refuse(b, frame, d, ResultCode.INVALID_FIELD, str(e))
            return
        if env.channel and self.ctx.unit != 1 and d.lk0.endpoint != self.ctx.me:
            # The platform delivers ordered documents (flag Ordered) to unit 1,
            # which keeps the channels; one reaching another unit (an earlier
            # platform spread it by LK0) would wait for ever for ones held in
            # another store. Refused (signed): its origin announces the gap,
            # which goes to unit 1, and the channel goes on.
            self.refuse(b, frame, d, ResultCode.INVALID_FIELD,
                         f"ordered channel {env.channel}: unit {self.ctx.unit} of organization"
                         f" {self.ctx.me.node_id} does not keep channels (unit 1 does)")
            return
        # A gap notice names the failed document's user, but carries nothing
        # for it: only the channel's place. It is never refused for its
        # user (one refused for an unknown user, like the document it
        # stands for, would hold the organization's channel for ever).
        if env.to_user and not env.skipped and env.to_user not in self._user_names():
            self.refuse(b, frame, d, ResultCode.UNKNOWN_TARGET,
                         f"{env.to_user} is not a user of organization {self.ctx.me.node_id}")
            return
        if env.channel and not env.skipped:
            lk0 = d.lk0
            o = lk0.endpoint
            if ((int(o.node_type), o.node_id, lk0.semq_id, lk0.semq_db_id, lk0.record_id) not in b.known
                    and self.channels.would_hold(o.node_id, env)
                    and (n := self.channels.held_from(o.node_id)) >= channels.MAX_HELD_PER_ORIGIN):
                self.refuse(b, frame, d, ResultCode.OVER_WINDOW,
                             f"{n} documents of {o.node_id} are held waiting for earlier ones of their channels"
                             f" (limit {channels.MAX_HELD_PER_ORIGIN}); send it again later")
                return
        self._receive(b, frame, d, doc, digest, signer, app_key, env)

    def _user_names(self) -> frozenset[str]:
        """This node's users (read once per batch that names one)."""
        if self._users is None:
            self._users = self.users.names()
        return self._users

    def _first_unknown_key(self, origin: Endpoint, ts: int) -> bool:
        """Whether a document of ``origin`` signed by a key we do not know
        may wait for its certificates (once a minute per origin)."""
        last = self._unknown_key_at.get(origin)
        if last is not None and ts - last < 60_000:
            return False
        self._unknown_key_at[origin] = ts
        return True

    def refuse(self, b: Batch, frame: Frame, d: Data, code: ResultCode, detail: str) -> None:
        """A document that does not reach the inbox (it does not open or
        verify, it expired, it is stale): no dedup row, no ACK2, no receipt.
        A stored copy is settled at the platform (ACK: it has left its
        store; redelivering it would be refused again), and the origin gets
        a NACK with the code, signed with security (``make_refusal``: the
        relay can neither forge nor hide it). A later copy that does
        verify, in time, is still delivered."""
        lk0, lk1 = d.lk0, d.lk1
        b.events.append({"ts": b.ts, "role": "receiver", "event": "refused", "lk0": str(lk0),
                         "source": frame.origin.node_id, "target": self.ctx.me.node_id,
                         "code": int(code), "detail": detail[:200]})
        b.out.errors.append((code, f"document {lk0} refused: {detail}"))
        if not frame.reliable:
            return  # best effort: never acked, never answered
        if lk1 is not None:
            b.acks[(Kind.ACK, frame.source)].append(AckEntry(
                self.ctx.unit, 1, 0, lk1.semq_id, lk1.semq_db_id, lk1.record_id, int(AckFlag.PLATFORM), 0))
        sec = self.ctx.sec
        proof = b"" if sec is None else make_refusal(lk0, code, sec.identity.keys.signing_key)
        b.out.add(Frame(kind=Kind.NACK, source=self.ctx.me, target=frame.origin,
                        body=Nack(lk0=lk0, code=code, message=detail[:1000], proof=proof)))

    def _receive(self, b: Batch, frame: Frame, d: Data, body: bytes, digest: bytes | None, signer: str,
                 ak: AppKey, env: Envelope, size: int | None = None) -> None:
        """A document that opened and verified: into the inbox the first
        time, acknowledged as it asked. ``size``: a large document whose
        content is whole (semq.node.large.incoming), delivered with an empty body."""
        ts, out, events = b.ts, b.out, b.events
        lk0, lk1 = d.lk0, d.lk1
        key = (int(lk0.endpoint.node_type), lk0.endpoint.node_id, lk0.semq_id, lk0.semq_db_id, lk0.record_id)
        duplicate = key in b.known
        if d.large and size is None and not duplicate:
            # A manifest: its chunks follow; delivered once they are whole.
            self.large.manifest(b, frame, d, body, digest, signer, ak, env)
            return
        if duplicate and env.channel and self._gap_marked(b, key):
            # Its place in the channel went to a gap notice: the application
            # was told it failed. It is not delivered, and gets no receipt
            # (a receipt says "in my inbox").
            self.refuse(b, frame, d, ResultCode.GAP_ANNOUNCED, f"the document's place in channel {env.channel}"
                         " was announced failed by its origin before it arrived")
            return
        if not duplicate:
            # A copy already in the inbox is acked again whatever its age;
            # a new one must still be in time, and young enough that a
            # replay could not outlive its dedup row (signed times, with
            # security: docs/exactly-once.md).
            if d.expires_ms is not None and d.expires_ms <= ts:
                self.refuse(b, frame, d, ResultCode.EXPIRED, f"the document expired at {d.expires_ms}, before"
                             f" it reached the inbox at {ts}")
                return
            created = d.created_ms
            if created and not b.window[0] <= created <= b.window[1]:
                self.refuse(b, frame, d, ResultCode.STALE, f"created at {created}, outside this receiver's"
                             f" window of {DEDUP_RETENTION_MS // 86_400_000} days (clock skew"
                             f" {self.ctx.skew_ms // 1000} s): a replay cannot be told apart")
                return
            b.known.add(key)
            b.new_dedup.append((*key, ts, digest))
        # A copy that came straight from its origin (a direct link: the hop
        # is the origin) is answered with ACK2 whatever it asked: on a
        # direct link the end-to-end acknowledgement is also the transport's.
        direct = frame.source.node_type is not NodeType.PLATFORM
        ack2, reliable = frame.ack2 or direct, frame.reliable
        dkey = (duplicate, lk1 is not None, ack2, reliable)
        dec = _DECISIONS.get(dkey)
        if dec is None:
            dec = _DECISIONS[dkey] = receive_decision(duplicate=duplicate, has_lk1=lk1 is not None, ack2=ack2,
                                                      reliable=reliable)
        lk0_text, source, me = str(lk0), lk0.endpoint.node_id, self.ctx.me.node_id
        full = {
            "ts": ts, "role": "receiver", "lk0": lk0_text, "source": source, "target": me,
            "event": "received", "domain": ak.domain, "data_type": ak.data_type,
            "subtype": ak.subtype, "key": ak.key, "save_fwd": int(frame.save_fwd),
            "ack2": frame.ack2, "reliable": reliable, "priority": frame.priority,
            "size": len(d.app_data) if size is None else size, "created_ms": d.created_ms,
            "path": ("local" if lk0.endpoint == self.ctx.me else "direct") if direct else "relay",
        }
        if lk1 is not None:
            full["lk1"] = f"{lk1.semq_id}/{lk1.semq_db_id}/{lk1.record_id}"
        if env is not NO_ENVELOPE:
            for name in ("from_user", "to_user", "channel"):
                if getattr(env, name):
                    full[name] = getattr(env, name)
        events.append(full)
        if duplicate:
            events.append({"ts": ts, "role": "receiver", "lk0": lk0_text, "source": source, "target": me,
                           "event": "duplicate"})
        if dec.deliver:
            row = (*key, ak.domain, ak.data_type, ak.subtype, ak.key, int(frame.save_fwd), frame.priority,
                   d.created_ms, ts, int(d.encrypt), body, signer, env.from_user, env.to_user, env.channel)
            if not env.channel:
                b.new_inbox.append(row)
                out.delivered += 1
                events.append({"ts": ts, "role": "receiver", "lk0": lk0_text, "source": source, "target": me,
                               "event": "inbox"})
            else:
                self._ordered(b, lk0, env, row)
        inbound_id = 0
        # Answered on a direct link, the ACK2 gets no REACK2: an ACK2 lost
        # with the link brings the document again (its origin sends what a
        # broken link left unanswered), and this duplicate is answered
        # again. No pending-ack row waits for a confirmation that never
        # comes. (A direct copy that waited for its origin's certificate is
        # answered through the platform, and confirmed there.)
        if dec.keep_row and b.direct is None:
            # Deferred, not written: the confirmations (REACK2, and
            # REACK for a stored copy) usually come within a fraction of a
            # second and end the row, so its INSERT and DELETE (~8% of a
            # receiver's time, py-spy) are not made. Nothing we sent
            # depends on it: the document is in the inbox and the dedup
            # table before the ACK/ACK2 leave, and those answer the
            # inquiries of an origin or platform that missed an ack. Lost
            # in a crash, only our own asking about confirmations is lost
            # (semq.node.receiver.pending_ack).
            inbound_id = self.pending.next_id(b)
            self.pending.defer(key, _new(PendingAckRow, (
                inbound_id, *key, lk1.semq_id if lk1 else 0, lk1.semq_db_id if lk1 else 0,
                lk1.record_id if lk1 else 0, int(frame.source.node_type), frame.source.node_id,
                _AS_INIT if dec.send_ack else _AS_ACK, _AS_INIT if dec.send_ack2 else _AS_ACK, ts, ts)))
        elif duplicate and (dec.send_ack or dec.send_ack2):
            inbound_id = self.pending.deferred_keys.get(key, 0)
            if not inbound_id:
                self.flush(b)
                inbound_id = self.pending.id_of(key)
        if dec.send_ack and lk1 is not None:
            b.acks[(Kind.ACK, frame.source)].append(AckEntry(
                self.ctx.unit, 1, inbound_id, lk1.semq_id, lk1.semq_db_id, lk1.record_id, int(AckFlag.PLATFORM), 0))
        if dec.send_ack2:
            b.acks[(Kind.ACK2, lk0.endpoint)].append(AckEntry(
                self.ctx.unit, 1, inbound_id, lk0.semq_id, lk0.semq_db_id, lk0.record_id, int(AckFlag.DELIVERY), 0))
            if digest is not None:
                b.digests[lk0.endpoint].append((lk0, digest))
            events.append({"ts": ts, "role": "receiver", "lk0": lk0_text, "source": source, "target": me,
                           "event": "ack2_sent"})

    def _gap_marked(self, b: Batch, key: LK0Key) -> bool:
        """Whether a gap notice took this ordered document's place (its
        dedup row carries GAP_MARK instead of a digest)."""
        for *k, _ts, digest in b.new_dedup:
            if digest == GAP_MARK and tuple(k) == key:
                return True
        return self.inbox.gap_marked(key)

    def _ordered(self, b: Batch, lk0: LK0, env: Envelope, row: tuple[Any, ...]) -> None:
        """A new document of an ordered channel: to the inbox with the held
        ones it releases, or held (semq.node.receiver.channels). A gap notice for a
        document that did arrive is dropped (it was handed over in its
        place); one for a document that did not takes its place, and a
        late copy of that document is then a duplicate."""
        ts, origin = b.ts, lk0.endpoint
        pos = lk0.record_id
        if env.skipped:
            gone = (int(origin.node_type), origin.node_id, lk0.semq_id, lk0.semq_db_id, env.skipped)
            if gone in b.known or self.inbox.has(gone):
                b.events.append({"ts": ts, "role": "receiver", "lk0": str(lk0), "source": origin.node_id,
                                 "target": self.ctx.me.node_id, "event": "gap_dropped", "channel": env.channel})
                return
            b.known.add(gone)
            b.new_dedup.append((*gone, ts, GAP_MARK))
            pos = env.skipped
        rows = self.channels.place(origin.node_id, env, pos, row)
        me = self.ctx.me.node_id
        if not rows:
            b.events.append({"ts": ts, "role": "receiver", "lk0": str(lk0), "source": origin.node_id,
                             "target": me, "event": "held", "channel": env.channel, "prev": env.prev})
        for r in rows:
            b.new_inbox.append(r)
            b.out.delivered += 1
            _, oid, sid, did, rid, *_ = r
            b.events.append({"ts": ts, "role": "receiver", "lk0": f"{oid}/{sid}/{did}/{rid}", "source": oid,
                             "target": me, "event": "inbox", "channel": env.channel})

    def reserve_ids(self, b: Batch) -> None:
        """The pending-ack ids given out in this batch are never given out again."""
        self.pending.reserve_ids(b)

    def flush(self, b: Batch) -> None:
        """Write the batch's new dedup and inbox rows (one executemany each)
        and the channels it moved."""
        self.inbox.write(b.new_dedup, b.new_inbox)
        self.channels.flush(b.ts)

    # ------------------------------------------------------------ large documents (semq.node.large.incoming.Delivery)

    def deliver_large(self, b: Batch, frame: Frame, d: Data, digest: bytes | None, signer: str, ak: AppKey,
                      env: Envelope, size: int, key: LK0Key, path: str) -> None:
        """A large document whose content is whole: received as a one-frame
        document is (with an empty body), its inbox row naming its file."""
        self._receive(b, frame, d, b"", digest, signer, ak, env, size=size)
        self.flush(b)
        self.inbox.name_file(key, path, size)

    def delivered(self, key: LK0Key) -> bool:
        return self.inbox.has(key)

    # ------------------------------------------------------------ confirmations

    def queue_confirmations(self, b: Batch, kind: Kind, entries: Sequence[AckEntry], peer: Endpoint,
                            from_platform: bool) -> None:
        """REACK (from the platform only) and REACK2 (from the document's
        origin only: checked against each row), applied together before a
        frame of another kind (``flush_confirmations``)."""
        if kind is Kind.REACK:
            if from_platform:
                b.reacks.extend([e.dest_ref_id for e in entries if e.dest_ref_id])
        else:
            b.reack2s.extend([(e.dest_ref_id, peer.node_id) for e in entries if e.dest_ref_id])

    def flush_confirmations(self, b: Batch) -> None:
        if b.reacks or b.reack2s:
            p_ids, s_acks = b.reacks, b.reack2s
            b.reacks, b.reack2s = [], []
            self.pending.confirm(p_ids, s_acks, b.ts, b.events)

    def close(self) -> None:
        self.inbox.close()

    def received_digest(self, lk: LK0) -> tuple[bool, bytes | None]:
        """Whether the document ``lk`` reached our inbox, and the digest it
        was signed with (for a receipt: semq.node.receiver.inbox)."""
        return self.inbox.received_digest(
            (int(lk.endpoint.node_type), lk.endpoint.node_id, lk.semq_id, lk.semq_db_id, lk.record_id))

    # ------------------------------------------------------------ inquiries

    def due_inquiries(self, ts: int, limit: int, sweep: int) -> tuple[dict[Endpoint, list[LK0]],
                                                                       dict[Endpoint, list[LK0]]]:
        """SPEC B.2: pending-ack rows whose confirmation is late ask the
        platform (P_ACK) and the origin (S_ACK), with their inquiry time
        set. At most ``sweep`` rows per round, in id order from where the
        last round stopped, so a huge table is asked about over several
        rounds (a row waits at most size/sweep rounds more)."""
        inb = self.pending.due(ts, limit, sweep)
        to_p: dict[Endpoint, list[LK0]] = defaultdict(list)
        to_o: dict[Endpoint, list[LK0]] = defaultdict(list)
        for r in inb:
            if r.p_ack == _AS_INIT and r.lk1_record_id:
                pe = Endpoint(node_type=NodeType(r.platform_type), node_id=r.platform_id)
                to_p[pe].append(LK0(endpoint=pe, semq_id=r.lk1_semq_id, semq_db_id=r.lk1_semq_db_id,
                                    record_id=r.lk1_record_id))
            if r.s_ack == _AS_INIT:
                oe = Endpoint(node_type=NodeType(r.origin_type), node_id=r.origin_id)
                to_o[oe].append(LK0(endpoint=oe, semq_id=r.semq_id, semq_db_id=r.semq_db_id,
                                    record_id=r.record_id))
        return to_p, to_o
