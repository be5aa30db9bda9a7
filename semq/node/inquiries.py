"""Inquiries: asking what became of a document, and answering (SPEC A.5,
B.2, B.3; seed 003 "809" frames).

A node asks the platform and the target about its documents whose acks are
late, and the platform and the origins about the confirmations its
pending-ack rows wait for; it answers "did you receive" from its dedup table
(to the document's origin with an ACK2 and a receipt, since with security a
plain "received" proves nothing) and "what is the state of your record"
from its pending-send table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from semq.identity.crypto import make_batch_receipt
from semq.umxt_protocol import (
    LK0,
    AckBatch,
    AckEntry,
    AckFlag,
    Endpoint,
    Frame,
    Inquiry,
    InquiryAnswer,
    InquiryFlag,
    InquiryResp,
    InquiryResult,
    InquiryTopic,
    Kind,
    NodeType,
)

from .batch import RECEIPT_BATCH, Batch, Events, NodeContext, Output
from .engine import OriginEvent
from .origin.role import Origin
from .receiver.role import Receiver

__all__ = ["INBOUND_SWEEP", "INQUIRY_BATCH", "RECEIPT_BATCH", "Inquiries"]

INQUIRY_BATCH: Final = 1000
# Pending-ack rows one inquiry round looks at (by id, resuming where the last
# round stopped): the round runs every second inside a write transaction, and
# reading the whole table cost 270 ms per round at 1,000,000 rows (an origin
# offline for long while its stored documents drained). An index on the due
# time would cost every received document an index entry and its removal.
INBOUND_SWEEP: Final = 20_000
_DELIVERY: Final = int(AckFlag.DELIVERY)
# The platform's answer about one of our documents stands for the ack that was lost.
_PLATFORM_SAYS: Final = {InquiryResult.FORWARDED: OriginEvent.ACK_FWD, InquiryResult.STORED: OriginEvent.ACK_SAVE,
                         InquiryResult.RECEIVED: OriginEvent.PLATFORM_HAS}
_HAS: Final = (InquiryResult.RECEIVED, InquiryResult.FORWARDED, InquiryResult.STORED)


def receipt_frames(me: Endpoint, peer: Endpoint, proven: Sequence[tuple[LK0, bytes]], signing_key: object,
                   out: Output, unit: int = 1) -> None:
    """ACK2 batches for documents of ``peer`` we (``unit``) received, each
    with one receipt over their (LK0, digest)s, one batch per unit of the
    origin that holds them (semq.umxt_protocol.units: the relay never splits a receipt)."""
    by_unit: dict[int, list[tuple[LK0, bytes]]] = {}
    for p in proven:
        by_unit.setdefault(p[0].semq_id, []).append(p)
    for docs in by_unit.values():
        for i in range(0, len(docs), RECEIPT_BATCH):
            part = docs[i:i + RECEIPT_BATCH]
            entries = tuple(AckEntry(unit, 1, 0, lk.semq_id, lk.semq_db_id, lk.record_id, _DELIVERY, 0)
                            for lk, _ in part)
            out.add(Frame(kind=Kind.ACK_BATCH, source=me, target=peer,
                          body=AckBatch(ack_kind=Kind.ACK2, entries=entries,
                                        receipt=make_batch_receipt(part, signing_key))))  # type: ignore[arg-type]


class Inquiries:
    """Asking and answering about documents, for both roles."""

    def __init__(self, ctx: NodeContext, origin: Origin, receiver: Receiver) -> None:
        self.ctx = ctx
        self.origin = origin
        self.receiver = receiver

    def answer(self, b: Batch, frame: Frame) -> None:
        """SPEC B.3 / A.5: answer "did you receive" from the dedup table, and
        "what is the state of your record" from the pending-send table."""
        q = frame.body
        assert isinstance(q, Inquiry)
        ctx = self.ctx
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
                has, digest = self.receiver.received_digest(lk)
                answers.append(InquiryAnswer(lk, InquiryResult.RECEIVED if has else InquiryResult.NOT_RECEIVED))
                if digest and not platform and ctx.sec is not None:
                    proven.append((lk, digest))
            if proven:
                # The origin confirms only by a receipt: "received" comes as
                # an ACK2 with one, from the digest kept with the dedup row.
                assert ctx.sec is not None
                receipt_frames(ctx.me, asker, proven, ctx.sec.identity.keys.signing_key, b.out, ctx.unit)
        else:
            mine = [lk for lk in q.items if lk.endpoint == ctx.me]
            if ctx.sec is None:
                res = dict(self.origin.apply([(lk.record_id, OriginEvent.TARGET_ASKS) for lk in mine],
                                             b.ts, b.out, b.events, None, peer=asker))
            else:
                # With security the target's word settles nothing (a relay
                # could speak in its name): only its receipt does, which
                # our own inquiry fetches. Answered, so it stops asking.
                res = self.origin.peek_answers([lk.record_id for lk in mine], asker)
            answers = [InquiryAnswer(lk, res.get(lk.record_id, InquiryResult.NO_RECORD)) for lk in q.items]
        b.out.add(Frame(kind=Kind.INQUIRY_RESP, source=ctx.me, target=asker,
                        body=InquiryResp(topic=q.topic, answers=tuple(answers))))

    def answers(self, b: Batch, frame: Frame) -> None:
        """The answers to our inquiries: about our documents (RECEIVED,
        through ORIGIN_TABLE) or about our pending-ack rows (STATE: each
        answer confirms)."""
        r = frame.body
        assert isinstance(r, InquiryResp)
        me = self.ctx.me
        from_platform = frame.origin.node_type is NodeType.PLATFORM
        if r.topic is InquiryTopic.RECEIVED:
            items = []
            for lk, result in r.answers:
                if lk.endpoint != me:
                    continue
                has = result in _HAS
                if from_platform:
                    ev = _PLATFORM_SAYS.get(result, OriginEvent.PLATFORM_LACKS)
                elif has and self.ctx.sec is not None:
                    continue  # proven by the ACK2 with a receipt that comes with it, or not at all
                elif result is InquiryResult.NO_RECORD:
                    continue  # not an answer about a document the target received or lacks
                else:
                    ev = OriginEvent.TARGET_HAS if has else OriginEvent.TARGET_LACKS
                items.append((lk.record_id, ev))
            # TARGET_HAS means B has it; SPEC A.5: answer REACK2 so B may clean up.
            self.origin.apply(items, b.ts, b.out, b.events, b.acks, peer=frame.origin)
        else:
            pending = self.receiver.pending
            ids = pending.answered([lk for lk, _ in r.answers], frame.origin, from_platform)
            if from_platform:
                pending.confirm(ids, (), b.ts, b.events)
            else:
                pending.confirm((), [(i, frame.origin.node_id) for i in ids], b.ts, b.events)

    def due(self, ts: int, out: Output, events: Events) -> None:
        """One round of our own inquiries, inside the caller's transaction."""
        ctx = self.ctx
        to_p, to_b = self.origin.due_inquiries(ts, INQUIRY_BATCH * 4, events)
        for target, lks in [(ctx.platform, to_p), *to_b.items()]:
            for i in range(0, len(lks), INQUIRY_BATCH):
                out.add(Frame(kind=Kind.INQUIRY, source=ctx.me, target=target,
                              body=Inquiry(topic=InquiryTopic.RECEIVED, items=tuple(lks[i:i + INQUIRY_BATCH]),
                                           flag=InquiryFlag.FROM_PEER)))
        to_pp, to_o = self.receiver.due_inquiries(ts, INQUIRY_BATCH * 4, INBOUND_SWEEP)
        for group in (to_pp, to_o):
            for target, lks in group.items():
                for i in range(0, len(lks), INQUIRY_BATCH):
                    out.add(Frame(kind=Kind.INQUIRY, source=ctx.me, target=target,
                                  body=Inquiry(topic=InquiryTopic.STATE, items=tuple(lks[i:i + INQUIRY_BATCH]))))
